//! The differential test: the same seeded sequences of system calls on the
//! kernel's ext4 (a loop mount of a fresh `mkfs.ext4` image) and on ordo
//! (an `ordo mount` of a fresh `ordo mkfs` image), comparing what each
//! call returns (value or errno) and, after every call, the state of every
//! path the sequence can touch: type, mode, link count, owner, size,
//! contents, symlink targets, directory entries and explicitly set times.
//!
//! Some calls run as an unprivileged user (a forked child that drops to
//! uid/gid 1000 or 65534) so that EACCES and EPERM, sticky and setgid
//! directories and the suid/sgid clearing rules are compared too; renames
//! and links between the two mounts give EXDEV.
//!
//! What is deliberately not compared is listed, with the reason, in the
//! README ("Divergences from the kernel's ext4"): `st_blocks` and `st_ino`
//! (allocation policy), and times the file system sets itself ("now" is
//! not the same instant on both sides; times set explicitly are compared
//! to the nanosecond).

mod common;

use std::ffi::CString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;

/// The test's xorshift generator: deterministic per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn long_name(c: char, len: usize) -> String {
    std::iter::repeat_n(c, len).collect()
}

/// Every path a sequence may name (relative to the test directory).
fn paths() -> Vec<String> {
    let mut v: Vec<String> = [
        "a",
        "b",
        "c",
        "d1",
        "d2",
        "d1/a",
        "d1/b",
        "d1/s",
        "d1/s/a",
        "d1/s/b",
        "d2/a",
        "d2/d3",
        "d2/d3/a",
        "a/x",
        "lnk",
        "d1/lnk",
        "loop1",
        "loop2",
        "d1/s/new",
        "d2/d3/new",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(long_name('m', 255));
    v.push(long_name('n', 256));
    v.push(format!("d1/{}", long_name('m', 255)));
    v
}

const SYMLINK_TARGETS: &[&str] = &[
    "a",
    "d1",
    "d1/s",
    "../a",
    "loop1",
    "loop2",
    "nonexistent",
    "d2/d3/a",
];
const MODES: &[u32] = &[
    0o644, 0o600, 0o755, 0o777, 0o700, 0o000, 0o1777, 0o2775, 0o4755, 0o6755, 0o2755, 0o666, 0o444,
];
const USERS: &[(u32, u32)] = &[(1000, 1000), (65534, 65534), (1000, 65534)];

#[derive(Clone, Debug)]
enum Time {
    Now,
    Omit,
    At(i64, i64),
}

/// A path argument: in the test directory of the side running the call,
/// or in the other side's (for EXDEV).
#[derive(Clone, Debug)]
struct P {
    rel: String,
    other: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Creat(P, u32),
    OpenExcl(P, u32),
    Open(P, i32),
    Mkdir(P, u32),
    Unlink(P),
    Rmdir(P),
    Rename(P, P, u32),
    Link(P, P),
    Symlink(String, P),
    Readlink(P),
    Truncate(P, i64),
    Chmod(P, u32),
    Chown(P, u32, u32),
    Utimens(P, Time, Time),
    Write(P, i64, usize, u8),
    /// open(O_CREAT | O_EXCL | O_RDWR, mode), a write of `len` bytes and a
    /// read back through the same descriptor: the handle a create returns
    /// (served with direct I/O by ordo), and the set-user-ID clearing of
    /// its writes.
    CreatWrite(P, u32, usize, u8),
    /// A new file of `len` bytes written through a shared mapping of the
    /// create's own descriptor, synced, and read back through it.
    CreatMmap(P, usize, u8),
    Read(P, i64, usize),
    Fallocate(P, i32, i64, i64),
    Seek(P, i64, i32),
    Stat(P),
    /// lsetxattr(path, name, value of `len` bytes from a seed, flags).
    SetXattr(P, &'static str, usize, u8, i32),
    /// lgetxattr with a buffer of this size (0: ask the size).
    GetXattr(P, &'static str, usize),
    ListXattr(P, usize),
    RemoveXattr(P, &'static str),
    /// An ACL (VFS form) as `system.posix_acl_access` or `_default`.
    SetAcl(P, bool, Vec<(u16, u16, u32)>),
}

/// Attribute names the sequences use: every namespace ext4 serves, one it
/// does not, and malformed ones.
const XATTR_NAMES: &[&str] = &[
    "user.a",
    "user.b",
    "user.longer-attribute-name",
    "trusted.t",
    "security.s",
    "system.posix_acl_access",
    "system.posix_acl_default",
    "system.other",
    "user.",
    "other.x",
];
/// Value sizes: empty, in-inode, shared-block sized, past the in-inode
/// room, near and past a block.
const XATTR_LENS: &[usize] = &[0, 1, 12, 60, 200, 700, 2000, 4000, 5000];

/// ACLs the sequences set: minimal (the mode says all of it), with named
/// entries, and invalid ones.
fn acl_choices() -> Vec<Vec<(u16, u16, u32)>> {
    const U: u32 = u32::MAX;
    vec![
        vec![(1, 6, U), (4, 4, U), (0x20, 4, U)],
        vec![
            (1, 7, U),
            (2, 6, 1000),
            (4, 5, U),
            (0x10, 7, U),
            (0x20, 0, U),
        ],
        vec![
            (1, 6, U),
            (2, 4, 65534),
            (4, 0, U),
            (8, 6, 1000),
            (0x10, 6, U),
            (0x20, 4, U),
        ],
        vec![(1, 7, U), (2, 7, 1000), (4, 5, U), (0x20, 5, U)],
        vec![(1, 6, U), (0x20, 4, U)],
    ]
}

fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// One step: a call, run by root or by an unprivileged (uid, gid).
#[derive(Clone, Debug)]
struct Step {
    op: Op,
    user: Option<(u32, u32)>,
}

fn gen_step(rng: &mut Rng, names: &[String]) -> Step {
    // Directories are made mostly under directory-like names and files
    // under the others, so that sequences build trees deep enough for
    // most calls to succeed (and still try every name now and then).
    const DIR_NAMES: &[&str] = &["d1", "d2", "d1/s", "d2/d3"];
    let p = |rng: &mut Rng| P {
        rel: rng.pick(names).clone(),
        other: false,
    };
    let dir_p = |rng: &mut Rng| {
        if rng.chance(75) {
            P {
                rel: rng.pick(DIR_NAMES).to_string(),
                other: false,
            }
        } else {
            p(rng)
        }
    };
    let file_p = |rng: &mut Rng| loop {
        let c = p(rng);
        if !DIR_NAMES.contains(&c.rel.as_str()) || rng.chance(10) {
            break c;
        }
    };
    let off = |rng: &mut Rng| -> i64 {
        match rng.below(4) {
            0 => 0,
            1 => rng.below(8192) as i64,
            2 => (rng.below(64) * 4096) as i64,
            _ => rng.below(1 << 20) as i64,
        }
    };
    let len = |rng: &mut Rng| -> usize {
        match rng.below(3) {
            0 => rng.below(100) as usize + 1,
            1 => rng.below(8192) as usize + 1,
            _ => rng.below(65536) as usize + 1,
        }
    };
    let time = |rng: &mut Rng| -> Time {
        match rng.below(5) {
            0 => Time::Now,
            1 => Time::Omit,
            _ => Time::At(
                788_918_400 + rng.below(400_000_000) as i64,
                rng.below(1_000_000_000) as i64,
            ),
        }
    };
    let op = match rng.below(28) {
        0 | 1 => Op::Creat(file_p(rng), *rng.pick(MODES)),
        2 => Op::OpenExcl(file_p(rng), *rng.pick(MODES)),
        3 => Op::Open(
            p(rng),
            *rng.pick(&[
                libc::O_RDONLY | libc::O_DIRECTORY,
                libc::O_WRONLY,
                libc::O_RDWR | libc::O_NOFOLLOW,
                libc::O_RDONLY,
                libc::O_WRONLY | libc::O_TRUNC,
                libc::O_RDONLY | libc::O_CREAT,
            ]),
        ),
        4 | 5 => Op::Mkdir(dir_p(rng), *rng.pick(MODES)),
        6 => Op::Unlink(p(rng)),
        7 => Op::Rmdir(p(rng)),
        8 | 9 => {
            let a = p(rng);
            let mut b = p(rng);
            if rng.chance(5) {
                b.other = true;
            }
            let flags = *rng.pick(&[
                0,
                0,
                libc::RENAME_NOREPLACE,
                libc::RENAME_EXCHANGE,
                libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE,
            ]);
            Op::Rename(a, b, flags)
        }
        10 => {
            let a = p(rng);
            let mut b = p(rng);
            if rng.chance(10) {
                b.other = true;
            }
            Op::Link(a, b)
        }
        11 => {
            let target = match rng.below(10) {
                0 => long_name('t', 59),
                1 => long_name('t', 60),
                2 => long_name('t', 61),
                3 => long_name('u', 1000),
                _ => rng.pick(SYMLINK_TARGETS).to_string(),
            };
            Op::Symlink(target, file_p(rng))
        }
        12 => Op::Readlink(p(rng)),
        13 => Op::Truncate(p(rng), if rng.chance(10) { -1 } else { off(rng) }),
        14 => Op::Chmod(p(rng), *rng.pick(MODES)),
        15 => {
            let (u, g) = *rng.pick(&[
                (0, 0),
                (1000, 1000),
                (65534, 65534),
                (1000, 65534),
                (0, 1000),
            ]);
            Op::Chown(p(rng), u, g)
        }
        16 => Op::Utimens(p(rng), time(rng), time(rng)),
        17 | 18 => Op::Write(file_p(rng), off(rng), len(rng), rng.below(256) as u8),
        19 => Op::Read(p(rng), off(rng), len(rng)),
        20 => {
            let mode = *rng.pick(&[
                0,
                libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_ZERO_RANGE,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                // Refused by vfs_fallocate on both sides. COLLAPSE_RANGE
                // and INSERT_RANGE alone never reach a FUSE file system
                // (see fallocate_ranges_match_the_kernels_ext4).
                libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            ]);
            Op::Fallocate(p(rng), mode, off(rng), len(rng) as i64)
        }
        22 | 23 => Op::SetXattr(
            p(rng),
            XATTR_NAMES[rng.below(XATTR_NAMES.len() as u64) as usize],
            *rng.pick(XATTR_LENS),
            rng.below(256) as u8,
            *rng.pick(&[0, 0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE, 3]),
        ),
        24 => Op::GetXattr(
            p(rng),
            XATTR_NAMES[rng.below(XATTR_NAMES.len() as u64) as usize],
            *rng.pick(&[0, 4, 65536]),
        ),
        25 => Op::ListXattr(p(rng), *rng.pick(&[0, 5, 65536])),
        26 => Op::RemoveXattr(
            p(rng),
            XATTR_NAMES[rng.below(XATTR_NAMES.len() as u64) as usize],
        ),
        27 => Op::SetAcl(p(rng), rng.chance(40), rng.pick(&acl_choices()).clone()),
        _ => {
            if rng.chance(50) {
                Op::Seek(
                    p(rng),
                    off(rng),
                    *rng.pick(&[libc::SEEK_DATA, libc::SEEK_HOLE]),
                )
            } else {
                Op::Stat(p(rng))
            }
        }
    };
    let user = if rng.chance(25) {
        Some(*rng.pick(USERS))
    } else {
        None
    };
    Step { op, user }
}

/// One side of the comparison: the test directory and the other side's.
struct Side {
    name: &'static str,
    dir: PathBuf,
    other_dir: PathBuf,
    /// Times at or after this are "set by the file system now".
    recent_sec: i64,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errname(e: i32) -> String {
    let n = match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ELOOP => "ELOOP",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EXDEV => "EXDEV",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EMLINK => "EMLINK",
        libc::EROFS => "EROFS",
        libc::EIO => "EIO",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Side {
    fn path(&self, p: &P) -> CString {
        let base = if p.other { &self.other_dir } else { &self.dir };
        CString::new(format!("{}/{}", base.display(), p.rel)).unwrap()
    }

    fn time_desc(&self, sec: i64, nsec: i64) -> String {
        if sec >= self.recent_sec {
            "now".to_string()
        } else {
            format!("{sec}.{nsec:09}")
        }
    }

    /// `lstat` fields that ext4 defines and ordo must reproduce.
    fn stat_desc(&self, path: &CString, with_atime: bool) -> String {
        // SAFETY: stat is plain data; lstat writes into it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: path is NUL-terminated; st is a valid out-pointer.
        let r = unsafe { libc::lstat(path.as_ptr(), &mut st) };
        if r != 0 {
            return format!("lstat {}", errname(errno()));
        }
        let kind = st.st_mode & libc::S_IFMT;
        let mut s = format!(
            "mode {:o} nlink {} uid {} gid {} size {} mtime {}",
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            st.st_size,
            self.time_desc(st.st_mtime, st.st_mtime_nsec)
        );
        if with_atime {
            let _ = write!(
                s,
                " atime {}",
                self.time_desc(st.st_atime, st.st_atime_nsec)
            );
        }
        let _ = write!(
            s,
            " ctime {}",
            self.time_desc(st.st_ctime, st.st_ctime_nsec)
        );
        if kind == libc::S_IFDIR {
            if let Ok(rd) = std::fs::read_dir(std::ffi::OsStr::new(path.to_str().unwrap())) {
                let mut names: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                let _ = write!(s, " entries [{}]", names.join(","));
            }
        } else if kind == libc::S_IFREG {
            match std::fs::read(path.to_str().unwrap()) {
                Ok(d) => {
                    let _ = write!(s, " data {:016x}", fnv(&d));
                }
                Err(e) => {
                    let _ = write!(s, " data {}", errname(e.raw_os_error().unwrap_or(0)));
                }
            }
        } else if kind == libc::S_IFLNK {
            if let Ok(t) = std::fs::read_link(path.to_str().unwrap()) {
                let _ = write!(s, " target {}", t.display());
            }
        }
        s
    }

    /// Run one call; the result is `ok ...` or the errno's name.
    fn call(&self, op: &Op) -> String {
        fn res(r: libc::c_long) -> Result<libc::c_long, String> {
            if r < 0 {
                Err(errname(errno()))
            } else {
                Ok(r)
            }
        }
        let open = |p: &P, flags: i32, mode: u32| -> Result<i32, String> {
            let c = self.path(p);
            // SAFETY: NUL-terminated path.
            let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
            res(fd as libc::c_long).map(|f| f as i32)
        };
        let close = |fd: i32| {
            // SAFETY: fd was opened above.
            unsafe { libc::close(fd) };
        };
        let r: Result<String, String> = (|| match op {
            Op::Creat(p, mode) => {
                let fd = open(p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, *mode)?;
                close(fd);
                Ok(String::new())
            }
            Op::OpenExcl(p, mode) => {
                let fd = open(p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, *mode)?;
                close(fd);
                Ok(String::new())
            }
            Op::Open(p, flags) => {
                let fd = open(p, *flags, 0o640)?;
                close(fd);
                Ok(String::new())
            }
            Op::Mkdir(p, mode) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::mkdir(self.path(p).as_ptr(), *mode) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Unlink(p) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::unlink(self.path(p).as_ptr()) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Rmdir(p) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::rmdir(self.path(p).as_ptr()) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Rename(a, b, flags) => {
                let (ca, cb) = (self.path(a), self.path(b));
                // SAFETY: renameat2 with NUL-terminated paths.
                res(unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        ca.as_ptr(),
                        libc::AT_FDCWD,
                        cb.as_ptr(),
                        *flags,
                    )
                })?;
                Ok(String::new())
            }
            Op::Link(a, b) => {
                let (ca, cb) = (self.path(a), self.path(b));
                // SAFETY: NUL-terminated paths.
                res(unsafe { libc::link(ca.as_ptr(), cb.as_ptr()) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Symlink(target, p) => {
                let t = CString::new(target.as_str()).unwrap();
                // SAFETY: NUL-terminated paths.
                res(unsafe { libc::symlink(t.as_ptr(), self.path(p).as_ptr()) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Readlink(p) => {
                let mut buf = vec![0u8; 8192];
                // SAFETY: buf has buf.len() bytes.
                let n = res(unsafe {
                    libc::readlink(self.path(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len())
                } as libc::c_long)?;
                Ok(format!("{}", String::from_utf8_lossy(&buf[..n as usize])))
            }
            Op::Truncate(p, len) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::truncate(self.path(p).as_ptr(), *len) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Chmod(p, mode) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::chmod(self.path(p).as_ptr(), *mode) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Chown(p, u, g) => {
                // SAFETY: NUL-terminated path.
                res(unsafe { libc::lchown(self.path(p).as_ptr(), *u, *g) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::Utimens(p, at, mt) => {
                let ts = |t: &Time| match t {
                    Time::Now => libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_NOW,
                    },
                    Time::Omit => libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    },
                    Time::At(s, n) => libc::timespec {
                        tv_sec: *s,
                        tv_nsec: *n,
                    },
                };
                let times = [ts(at), ts(mt)];
                // SAFETY: two valid timespecs, NUL-terminated path.
                res(unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        self.path(p).as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                } as libc::c_long)?;
                // Explicit times are compared to the nanosecond here, and
                // atime only when this call set it (see README: atime).
                Ok(self.stat_desc(&self.path(p), matches!(at, Time::At(..))))
            }
            Op::Write(p, off, len, seed) => {
                let fd = open(p, libc::O_WRONLY, 0)?;
                let data: Vec<u8> = (0..*len)
                    .map(|i| seed.wrapping_add((i % 253) as u8))
                    .collect();
                // SAFETY: data has len bytes; fd is open.
                let r = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), *off) };
                let r = res(r as libc::c_long);
                close(fd);
                Ok(format!("{}", r?))
            }
            Op::CreatWrite(p, mode, len, seed) => {
                let fd = open(p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, *mode)?;
                let data: Vec<u8> = (0..*len)
                    .map(|i| seed.wrapping_add((i % 251) as u8))
                    .collect();
                // SAFETY: data has len bytes; fd is open.
                let w = res(
                    unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0) }
                        as libc::c_long,
                );
                let mut back = vec![0u8; *len];
                // SAFETY: back has len bytes; fd is open.
                let r = res(
                    unsafe { libc::pread(fd, back.as_mut_ptr().cast(), back.len(), 0) }
                        as libc::c_long,
                );
                close(fd);
                let (w, r) = (w?, r?);
                Ok(format!("{w} {r} {:016x}", fnv(&back[..r as usize])))
            }
            Op::CreatMmap(p, len, seed) => {
                let fd = open(p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644)?;
                let out = (|| {
                    // SAFETY: fd is open.
                    res(unsafe { libc::ftruncate(fd, *len as i64) } as libc::c_long)?;
                    // SAFETY: a fresh shared mapping of len bytes of fd.
                    let m = unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            *len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED,
                            fd,
                            0,
                        )
                    };
                    if m == libc::MAP_FAILED {
                        return Err(errname(errno()));
                    }
                    // SAFETY: m maps len writable bytes until munmap.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(m.cast::<u8>(), *len) };
                    for (i, b) in bytes.iter_mut().enumerate() {
                        *b = seed.wrapping_add((i % 241) as u8);
                    }
                    // SAFETY: m and len as mapped.
                    let synced = unsafe { libc::msync(m, *len, libc::MS_SYNC) };
                    // SAFETY: m and len as mapped.
                    unsafe { libc::munmap(m, *len) };
                    res(synced as libc::c_long)?;
                    let mut back = vec![0u8; *len];
                    // SAFETY: back has len bytes; fd is open.
                    let r = res(
                        unsafe { libc::pread(fd, back.as_mut_ptr().cast(), *len, 0) }
                            as libc::c_long,
                    )?;
                    Ok(format!("{r} {:016x}", fnv(&back[..r as usize])))
                })();
                close(fd);
                out
            }
            Op::Read(p, off, len) => {
                let fd = open(p, libc::O_RDONLY, 0)?;
                let mut buf = vec![0u8; *len];
                // SAFETY: buf has len bytes; fd is open.
                let r = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), *off) };
                let r = res(r as libc::c_long);
                close(fd);
                let n = r? as usize;
                Ok(format!("{n} {:016x}", fnv(&buf[..n])))
            }
            Op::Fallocate(p, mode, off, len) => {
                let fd = open(p, libc::O_WRONLY, 0)?;
                // SAFETY: fd is open.
                let r = unsafe { libc::fallocate(fd, *mode, *off, *len) };
                let r = res(r as libc::c_long);
                close(fd);
                r?;
                Ok(String::new())
            }
            Op::Seek(p, off, whence) => {
                let fd = open(p, libc::O_RDONLY, 0)?;
                // SAFETY: stat is plain data; fd is open.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                unsafe { libc::fstat(fd, &mut st) };
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    // Directory offsets are ext4's htree cookies, which a
                    // FUSE directory does not have (see README).
                    close(fd);
                    return Ok("directory: not compared".to_string());
                }
                // Where the kernel's ext4 finds data and holes inside
                // unwritten (fallocated) extents depends on which pages its
                // cache holds, and this test's own reads fill it: write
                // back and drop the cache first, so that extents decide,
                // as they do for ordo.
                // SAFETY: fd is open.
                unsafe {
                    libc::fdatasync(fd);
                    libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
                }
                // SAFETY: fd is open.
                let r = unsafe { libc::lseek(fd, *off, *whence) };
                let r = res(r as libc::c_long);
                close(fd);
                Ok(format!("{}", r?))
            }
            Op::Stat(p) => Ok(self.stat_desc(&self.path(p), false)),
            Op::SetXattr(p, name, len, seed, flags) => {
                let c = self.path(p);
                let n = CString::new(*name).unwrap();
                let v: Vec<u8> = (0..*len).map(|i| seed.wrapping_add(i as u8)).collect();
                // SAFETY: NUL-terminated strings, a live buffer.
                res(unsafe {
                    libc::lsetxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), *flags)
                } as libc::c_long)?;
                Ok(String::new())
            }
            Op::GetXattr(p, name, size) => {
                let c = self.path(p);
                let n = CString::new(*name).unwrap();
                let mut buf = vec![0u8; *size];
                // SAFETY: NUL-terminated strings, a buffer of `size` bytes.
                let r = res(unsafe {
                    libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), *size)
                } as libc::c_long)?;
                if *size == 0 {
                    Ok(format!("{r}"))
                } else {
                    Ok(format!("{r} {:016x}", fnv(&buf[..r as usize])))
                }
            }
            Op::ListXattr(p, size) => {
                let c = self.path(p);
                let mut buf = vec![0u8; *size];
                // SAFETY: a NUL-terminated path, a buffer of `size` bytes.
                let r = res(
                    unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), *size) }
                        as libc::c_long,
                )?;
                if *size == 0 {
                    Ok(format!("{r}"))
                } else {
                    let mut names: Vec<&[u8]> = buf[..r as usize]
                        .split(|&b| b == 0)
                        .filter(|n| !n.is_empty())
                        .collect();
                    if xattr_order_free() {
                        names.sort_unstable();
                    }
                    Ok(names
                        .iter()
                        .map(|n| format!("{},", String::from_utf8_lossy(n)))
                        .collect())
                }
            }
            Op::RemoveXattr(p, name) => {
                let c = self.path(p);
                let n = CString::new(*name).unwrap();
                // SAFETY: NUL-terminated strings.
                res(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } as libc::c_long)?;
                Ok(String::new())
            }
            Op::SetAcl(p, default, entries) => {
                let c = self.path(p);
                let name = if *default {
                    "system.posix_acl_default"
                } else {
                    "system.posix_acl_access"
                };
                let n = CString::new(name).unwrap();
                let v = acl_bytes(entries);
                // SAFETY: NUL-terminated strings, a live buffer.
                res(unsafe {
                    libc::lsetxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0)
                } as libc::c_long)?;
                Ok(String::new())
            }
        })();
        match r {
            Ok(s) if s.is_empty() => "ok".to_string(),
            Ok(s) => format!("ok {s}"),
            Err(e) => e,
        }
    }

    /// Run one step, as root here or as the step's user in a forked child.
    fn run(&self, step: &Step) -> String {
        let Some((uid, gid)) = step.user else {
            return self.call(&step.op);
        };
        let mut fds = [0i32; 2];
        // SAFETY: fds is a two-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        // SAFETY: the child only makes system calls, formats a string and
        // exits with _exit; glibc's fork keeps malloc usable in the child.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: plain system calls in the child.
            unsafe {
                libc::close(fds[0]);
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(gid) == 0
                    && libc::setuid(uid) == 0;
                let out = if ok {
                    self.call(&step.op)
                } else {
                    "cannot drop privileges".to_string()
                };
                libc::write(fds[1], out.as_ptr().cast(), out.len());
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        // SAFETY: closing the read end; reaping our child.
        unsafe {
            libc::close(fds[0]);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The state of every path, one line each.
    fn snapshot(&self, names: &[String]) -> Vec<String> {
        names
            .iter()
            .map(|n| {
                let p = P {
                    rel: n.clone(),
                    other: false,
                };
                let c = self.path(&p);
                format!("{n}: {}{}", self.stat_desc(&c, false), xattr_desc(&c))
            })
            .collect()
    }
}

thread_local! {
    /// Per test thread: the tests of this binary run side by side, and one
    /// run's choice must not be another's.
    static XATTR_ORDER_FREE_CELL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread's run compares attribute names as sets, not in
/// the order listed: under `mode=backpointers` ordo's own (hidden)
/// backlink attribute takes room in the inode, so an attribute the kernel
/// keeps there may be in ordo's attribute block, which ext4 lists after
/// the inode's.
fn xattr_order_free() -> bool {
    XATTR_ORDER_FREE_CELL.with(|c| c.get())
}

fn set_xattr_order_free(free: bool) {
    XATTR_ORDER_FREE_CELL.with(|c| c.set(free));
}

/// Every attribute of a path (names in the order the file system lists
/// them, or sorted under [`xattr_order_free`], each value hashed), as root
/// sees them.
fn xattr_desc(path: &CString) -> String {
    let mut buf = vec![0u8; 65536];
    // SAFETY: a NUL-terminated path, a buffer of its length.
    let r = unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return format!(" xattrs {}", errname(errno()));
    }
    let mut out = String::from(" xattrs [");
    let mut names: Vec<&[u8]> = buf[..r as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .collect();
    if xattr_order_free() {
        names.sort_unstable();
    }
    for name in names {
        let n = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: NUL-terminated strings, a buffer of its length.
        let l =
            unsafe { libc::lgetxattr(path.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        let val = if l < 0 {
            errname(errno())
        } else {
            format!("{:016x}", fnv(&v[..l as usize]))
        };
        let _ = write!(out, "{}={val},", String::from_utf8_lossy(name));
    }
    out.push(']');
    out
}

fn short(s: &str) -> String {
    if s.len() > 120 {
        format!("{}...", &s[..120])
    } else {
        s.to_string()
    }
}

fn run_sequence(kernel: &Side, ordo: &Side, seed: u64, steps: usize, names: &[String]) {
    let mut rng = Rng::new(seed);
    let mut history: Vec<String> = Vec::new();
    let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..steps {
        let step = gen_step(&mut rng, names);
        let k = kernel.run(&step);
        let o = ordo.run(&step);
        let class = k.split(' ').next().unwrap_or("").to_string();
        *outcomes.entry(class).or_default() += 1;
        history.push(format!("#{i} {:?} -> {}", step, short(&k)));
        let context = || {
            let from = history.len().saturating_sub(25);
            history[from..].join("\n")
        };
        assert_eq!(
            k,
            o,
            "seed {seed} step {i}: {step:?}\n  {}: {k}\n  {}: {o}\nlast steps:\n{}",
            kernel.name,
            ordo.name,
            context()
        );
        let ks = kernel.snapshot(names);
        let os = ordo.snapshot(names);
        for (a, b) in ks.iter().zip(os.iter()) {
            assert_eq!(
                a,
                b,
                "seed {seed} after step {i}: {step:?}\n  {}: {a}\n  {}: {b}\nlast steps:\n{}",
                kernel.name,
                ordo.name,
                context()
            );
        }
    }
    eprintln!("differential: seed {seed}: outcomes {outcomes:?}");
}

fn now_sec() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Modes in the sequences are exact: no umask (both sides get the same).
fn no_umask() {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
}

fn prepare(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    // A world-writable, non-sticky top directory, so that unprivileged
    // steps can create (and the generated chmods can take rights away).
    sh(dir, "chmod 0777 .");
}

#[test]
fn syscall_sequences_match_the_kernels_ext4() {
    differential("", &[1, 2, 3, 4, 5, 6]);
}

/// The same comparison with the protocols that delay and reorder metadata
/// writes by their own rules (what a system call returns must not depend
/// on when its blocks reach the disk).
#[test]
fn syscall_sequences_match_the_kernels_ext4_under_softdep() {
    differential("mode=softdep", &[7, 8]);
}

#[test]
fn syscall_sequences_match_the_kernels_ext4_under_scheduler_ordering() {
    differential("mode=sched-flag", &[9]);
    differential("mode=sched-chain", &[10]);
}

/// OptFS: journaled overwrites, data tags, fsync as an osync (what a
/// call returns does not depend on when anything is durable).
#[test]
fn syscall_sequences_match_the_kernels_ext4_under_optimistic() {
    differential("mode=optimistic", &[11]);
    differential("mode=optimistic,fsync=osync", &[12]);
}

/// NoFS: no ordering at all, backlinks kept in an attribute ordo does
/// not show, every data read checked against its owner record.
/// With the kernel opening files itself (`open_requests=off`): files
/// unlinked while open, O_TRUNC opens and mmap go through the kernel's
/// references instead of OPEN and RELEASE.
#[test]
fn syscall_sequences_match_the_kernels_ext4_without_open_requests() {
    differential("open_requests=off", &[14, 15]);
}

/// The same with a 10 s attribute and entry lifetime: the kernel then
/// answers most stats and lookups from its own caches, which every change
/// made through the mount keeps coherent.
#[test]
fn syscall_sequences_match_the_kernels_ext4_with_a_long_attribute_lifetime() {
    differential("open_requests=off,attr_timeout=10", &[16, 17]);
}

/// Over FUSE's io_uring transport (`-o io_uring`): every request but
/// FORGET comes from a per-CPU ring, and what each call returns must not
/// depend on the transport. The kernel's `enable_uring` is on for the test
/// and set back after; [`stop_ordo`] checks that the ring served the
/// requests.
#[test]
fn syscall_sequences_and_error_cases_match_the_kernels_ext4_over_io_uring() {
    use ordo_fuse::uring_switch::{kernel_has_ring, RingSwitch, ENABLE_URING};
    if !kernel_has_ring() {
        eprintln!(
            "skipped: this kernel cannot serve FUSE over io_uring ({ENABLE_URING} missing or \
io_uring disabled)"
        );
        return;
    }
    let _uring = RingSwitch::set(true).unwrap();
    differential("io_uring", &[18, 19]);
    error_cases("io_uring");
    nearly_full("io_uring");
}

/// Unmount ordo and check it exited 0; with `io_uring` among the options,
/// also that requests were served through the ring (`ordo mount` reports
/// how many at its end).
fn stop_ordo(om: OrdoMount, options: &str) {
    let (status, err) = om.stop();
    assert!(status.success(), "ordo mount exited with {status}: {err}");
    if options
        .split(',')
        .any(|o| o == "io_uring" || o == "io_uring=on")
    {
        let served = err.lines().find_map(|l| {
            let (n, _) = l
                .strip_prefix("ordo: ")?
                .split_once(" requests served through io_uring")?;
            n.parse::<u64>().ok()
        });
        assert!(
            served.is_some_and(|n| n >= 100),
            "the ring served {served:?} requests: {err}"
        );
    }
}

#[test]
fn syscall_sequences_match_the_kernels_ext4_under_backpointers() {
    differential("mode=backpointers", &[13]);
}

/// Long sequences that once differed: a write (seed 27) and a chown (30)
/// by a caller outside the file's group left set-group-ID without group
/// execute, which ext4 clears.
#[test]
fn long_syscall_sequences_match_the_kernels_ext4() {
    differential_steps("", &[27, 30], 3000);
}

fn differential(options: &str, default_seeds: &[u64]) {
    differential_steps(options, default_seeds, 250);
}

fn differential_steps(options: &str, default_seeds: &[u64], default_steps: usize) {
    require_loop_devices();
    // The long sequences compare attribute names as a set: over thousands
    // of steps the order the kernel's ext4 lists them in depended on
    // timing (seed 21 beside other tests; seed 27 on a loaded machine,
    // `user.b, user.a` against ordo's `user.a, user.b` on a directory),
    // which the short sequences, compared in order, do not meet.
    let long = default_steps > 250;
    set_xattr_order_free(options.contains("backpointers") || long);
    no_umask();
    let s = Scratch::new();
    let kimg = s.path("kernel.img");
    let out = run("truncate", &["-s", "128M", kimg.to_str().unwrap()]);
    assert!(out.status.success());
    let out = run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-I",
            "256",
            kimg.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let oimg = s.path("ordo.img");
    mkfs(&oimg, "128M");
    let kmp = s.mkdir("k");
    let omp = s.mkdir("o");
    // A mount point must be traversable by the unprivileged users.
    sh(s.dir.path(), "chmod 0755 .");
    let km = KernelMount::start(&kimg, &kmp, "");
    let om = OrdoMount::start(&oimg, &omp, options);

    let names = paths();
    let seeds: Vec<u64> = match std::env::var("ORDO_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("ORDO_DIFF_SEED is a number")],
        Err(_) => default_seeds.to_vec(),
    };
    let steps: usize = std::env::var("ORDO_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_steps);
    for seed in seeds {
        eprintln!("differential: seed {seed}, {steps} steps");
        let kdir = kmp.join(format!("t{seed}"));
        let odir = omp.join(format!("t{seed}"));
        prepare(&kdir);
        prepare(&odir);
        let recent_sec = now_sec() - 2;
        let kernel = Side {
            name: "kernel ext4",
            dir: kdir.clone(),
            other_dir: odir.clone(),
            recent_sec,
        };
        let ordo = Side {
            name: "ordo",
            dir: odir.clone(),
            other_dir: kdir.clone(),
            recent_sec,
        };
        run_sequence(&kernel, &ordo, seed, steps, &names);
    }
    km.stop();
    stop_ordo(om, options);
    assert_e2fsck_clean(&oimg);
    assert_e2fsck_clean(&kimg);
}

/// Sequences written by hand for the cases a random sequence reaches
/// rarely: each error the kernel's ext4 gives, once.
#[test]
fn error_cases_match_the_kernels_ext4() {
    error_cases("");
}

/// The same cases with the kernel opening files without a request
/// (`open_requests=off`): `open(O_TRUNC)` then arrives as a SETATTR, and an
/// unlinked file lives until the kernel forgets it.
#[test]
fn error_cases_match_the_kernels_ext4_without_open_requests() {
    error_cases("open_requests=off");
}

fn error_cases(options: &str) {
    require_loop_devices();
    no_umask();
    let s = Scratch::new();
    let kimg = s.path("kernel.img");
    assert!(run("truncate", &["-s", "64M", kimg.to_str().unwrap()])
        .status
        .success());
    assert!(run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-I",
            "256",
            kimg.to_str().unwrap()
        ]
    )
    .status
    .success());
    let oimg = s.path("ordo.img");
    mkfs(&oimg, "64M");
    let kmp = s.mkdir("k");
    let omp = s.mkdir("o");
    sh(s.dir.path(), "chmod 0755 .");
    let km = KernelMount::start(&kimg, &kmp, "");
    let om = OrdoMount::start(&oimg, &omp, options);
    let kdir = kmp.join("t");
    let odir = omp.join("t");
    prepare(&kdir);
    prepare(&odir);
    let recent_sec = now_sec() - 2;
    let kernel = Side {
        name: "kernel ext4",
        dir: kdir.clone(),
        other_dir: odir.clone(),
        recent_sec,
    };
    let ordo = Side {
        name: "ordo",
        dir: odir.clone(),
        other_dir: kdir.clone(),
        recent_sec,
    };
    let p = |s: &str| P {
        rel: s.to_string(),
        other: false,
    };
    let other = |s: &str| P {
        rel: s.to_string(),
        other: true,
    };
    let root = |op: Op| Step { op, user: None };
    let user = |op: Op| Step {
        op,
        user: Some((1000, 1000)),
    };
    let nobody = |op: Op| Step {
        op,
        user: Some((65534, 65534)),
    };
    let long = long_name('n', 256);
    let script: Vec<(Step, &str)> = vec![
        (root(Op::Stat(p("missing"))), "ok lstat ENOENT"),
        (root(Op::Unlink(p("missing"))), "ENOENT"),
        (root(Op::Creat(p("missing/x"), 0o644)), "ENOENT"),
        (root(Op::Mkdir(p("d"), 0o755)), "ok"),
        (root(Op::Mkdir(p("d"), 0o755)), "EEXIST"),
        (root(Op::Creat(p("f"), 0o644)), "ok"),
        (root(Op::OpenExcl(p("f"), 0o644)), "EEXIST"),
        (root(Op::Creat(p("f/x"), 0o644)), "ENOTDIR"),
        (root(Op::Rmdir(p("f"))), "ENOTDIR"),
        (
            root(Op::Open(p("f"), libc::O_RDONLY | libc::O_DIRECTORY)),
            "ENOTDIR",
        ),
        (root(Op::Open(p("d"), libc::O_WRONLY)), "EISDIR"),
        (root(Op::Unlink(p("d"))), "EISDIR"),
        (root(Op::Rename(p("d"), p("f"), 0)), "ENOTDIR"),
        (root(Op::Rename(p("f"), p("d"), 0)), "EISDIR"),
        (root(Op::Creat(p("d/inner"), 0o644)), "ok"),
        (root(Op::Rmdir(p("d"))), "ENOTEMPTY"),
        (root(Op::Mkdir(p("d/sub"), 0o755)), "ok"),
        (root(Op::Rename(p("d"), p("d/sub/x"), 0)), "EINVAL"),
        (root(Op::Mkdir(p("e"), 0o755)), "ok"),
        (root(Op::Creat(p("e/x"), 0o644)), "ok"),
        (root(Op::Rename(p("e"), p("d"), 0)), "ENOTEMPTY"),
        (
            root(Op::Rename(p("f"), p("d/inner"), libc::RENAME_NOREPLACE)),
            "EEXIST",
        ),
        (
            root(Op::Rename(p("f"), p("nothere"), libc::RENAME_EXCHANGE)),
            "ENOENT",
        ),
        (
            root(Op::Rename(p("f"), p("d/inner"), libc::RENAME_EXCHANGE)),
            "ok",
        ),
        (
            root(Op::Rename(p("d"), p("e"), libc::RENAME_EXCHANGE)),
            "ok",
        ),
        (
            root(Op::Rename(p("f"), p("g"), libc::RENAME_NOREPLACE)),
            "ok",
        ),
        (root(Op::Creat(p(&long), 0o644)), "ENAMETOOLONG"),
        (root(Op::Mkdir(p(&long), 0o755)), "ENAMETOOLONG"),
        (root(Op::Creat(p(&long_name('m', 255)), 0o644)), "ok"),
        (root(Op::Symlink("loop2".into(), p("loop1"))), "ok"),
        (root(Op::Symlink("loop1".into(), p("loop2"))), "ok"),
        (root(Op::Open(p("loop1"), libc::O_RDONLY)), "ELOOP"),
        (
            root(Op::Open(p("loop1"), libc::O_RDONLY | libc::O_NOFOLLOW)),
            "ELOOP",
        ),
        (root(Op::Readlink(p("g"))), "EINVAL"),
        (root(Op::Link(p("e"), p("elink"))), "EPERM"),
        (root(Op::Link(p("g"), other("xdev"))), "EXDEV"),
        (root(Op::Rename(p("g"), other("xdev"), 0)), "EXDEV"),
        (root(Op::Truncate(p("g"), -1)), "EINVAL"),
        (root(Op::Write(p("g"), 0, 10000, 7)), "ok 10000"),
        (root(Op::Seek(p("g"), 20000, libc::SEEK_DATA)), "ENXIO"),
        (root(Op::Seek(p("g"), 0, libc::SEEK_HOLE)), "ok 10000"),
        (
            root(Op::Fallocate(p("g"), libc::FALLOC_FL_PUNCH_HOLE, 0, 4096)),
            "EOPNOTSUPP",
        ),
        (root(Op::Chmod(p("g"), 0o644)), "ok"),
        (user(Op::Write(p("g"), 0, 10, 1)), "EACCES"),
        (user(Op::Creat(p("d/new"), 0o644)), "EACCES"),
        (user(Op::Chmod(p("g"), 0o777)), "EPERM"),
        (user(Op::Chown(p("g"), 1000, 1000)), "EPERM"),
        (
            user(Op::Utimens(p("g"), Time::At(1_000_000_000, 5), Time::Omit)),
            "EPERM",
        ),
        (user(Op::Utimens(p("g"), Time::Now, Time::Now)), "EACCES"),
        (user(Op::Unlink(p("g"))), "ok"),
        (root(Op::Mkdir(p("sticky"), 0o1777)), "ok"),
        (root(Op::Creat(p("sticky/roots"), 0o666)), "ok"),
        (user(Op::Unlink(p("sticky/roots"))), "EPERM"),
        (user(Op::Creat(p("sticky/mine"), 0o644)), "ok"),
        (nobody(Op::Unlink(p("sticky/mine"))), "EPERM"),
        (
            nobody(Op::Rename(p("sticky/mine"), p("sticky/x"), 0)),
            "EPERM",
        ),
        (user(Op::Unlink(p("sticky/mine"))), "ok"),
        (root(Op::Mkdir(p("sgid"), 0o2777)), "ok"),
        (root(Op::Chown(p("sgid"), 0, 4242)), "ok"),
        (user(Op::Creat(p("sgid/f"), 0o2755)), "ok"),
        (user(Op::Mkdir(p("sgid/d"), 0o755)), "ok"),
        (root(Op::Stat(p("sgid/f"))), ""),
        (root(Op::Stat(p("sgid/d"))), ""),
        (root(Op::Creat(p("suid"), 0o644)), "ok"),
        (root(Op::Chmod(p("suid"), 0o6777)), "ok"),
        (user(Op::Write(p("suid"), 0, 5, 3)), "ok 5"),
        (root(Op::Stat(p("suid"))), ""),
        (root(Op::Chmod(p("suid"), 0o6755)), "ok"),
        (root(Op::Chown(p("suid"), 1000, 1000)), "ok"),
        (root(Op::Stat(p("suid"))), ""),
        (user(Op::Chown(p("suid"), 1000, 65534)), "EPERM"),
        (root(Op::Chmod(p("suid"), 0o2775)), "ok"),
        (user(Op::Chmod(p("suid"), 0o2775)), "ok"),
        (root(Op::Stat(p("suid"))), ""),
        (
            user(Op::Utimens(
                p("suid"),
                Time::At(1_000_000_000, 123_456_789),
                Time::At(999_999_999, 1),
            )),
            "",
        ),
        (user(Op::Truncate(p("suid"), 3)), "ok"),
        // The handle a create returns (direct I/O on ordo): a write by a
        // caller without CAP_FSETID drops set-user-ID, and set-group-ID
        // with group execute or outside the file's group; root keeps both.
        (
            user(Op::CreatWrite(p("sticky/cw1"), 0o6755, 100, 9)),
            "ok 100 100",
        ),
        (
            user(Op::CreatWrite(p("sticky/cw2"), 0o2745, 5000, 4)),
            "ok 5000 5000",
        ),
        (
            user(Op::CreatWrite(p("sgid/cw3"), 0o6745, 10, 2)),
            "ok 10 10",
        ),
        (
            root(Op::CreatWrite(p("cw4"), 0o6755, 70000, 1)),
            "ok 70000 70000",
        ),
        (user(Op::CreatWrite(p("sticky/cw5"), 0o644, 0, 1)), "ok 0 0"),
        (user(Op::Write(p("sticky/cw2"), 1, 3, 8)), "ok 3"),
        (user(Op::Truncate(p("sticky/cw1"), 1)), "ok"),
        // mmap of a created file, through its own descriptor.
        (user(Op::CreatMmap(p("sticky/mm"), 12288, 5)), "ok 12288"),
        (root(Op::CreatMmap(p("mm2"), 5000, 6)), "ok 5000"),
        (root(Op::Read(p("sticky/mm"), 4000, 300)), "ok"),
    ];
    let names: Vec<String> = [
        "d",
        "e",
        "f",
        "g",
        "d/inner",
        "d/sub",
        "e/x",
        "sticky",
        "sticky/roots",
        "sgid",
        "sgid/f",
        "sgid/d",
        "suid",
        "sticky/cw1",
        "sticky/cw2",
        "sgid/cw3",
        "cw4",
        "sticky/cw5",
        "sticky/mm",
        "mm2",
        "loop1",
        "loop2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (i, (step, want)) in script.iter().enumerate() {
        let k = kernel.run(step);
        let o = ordo.run(step);
        if !want.is_empty() {
            assert!(
                k.starts_with(want),
                "step {i} {step:?}: the kernel gave {k}, the script expects {want}: fix the script"
            );
        }
        assert_eq!(k, o, "step {i} {step:?}: kernel ext4 {k}, ordo {o}");
        for (a, b) in kernel
            .snapshot(&names)
            .iter()
            .zip(ordo.snapshot(&names).iter())
        {
            assert_eq!(a, b, "after step {i} {step:?}");
        }
    }
    km.stop();
    stop_ordo(om, options);
    assert_e2fsck_clean(&oimg);
}

/// What one step of [`nearly_full_matches_the_kernels_ext4`] returned:
/// "ok" or the errno's name, per system call of the step.
fn io_result(r: std::io::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => errname(e.raw_os_error().unwrap_or(0)),
    }
}

/// Write `path` in 1 MiB pieces until ENOSPC; returns its length. `dd`
/// writes it, not this process: a file this process had open could be
/// held open by a child another test forks meanwhile, and would then not
/// be freed when it is deleted.
fn fill_until_full(path: &Path) -> u64 {
    let out = run(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", path.display()),
            "bs=1M",
            "status=none",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("No space left on device"),
        "filling {}: {} {err}",
        path.display(),
        out.status
    );
    std::fs::metadata(path).unwrap().len()
}

/// The steps of the nearly-full comparison on the tree under `dir`, each
/// giving one result per system call.
fn nearly_full_steps(dir: &Path) -> Vec<(String, Vec<String>)> {
    use std::io::Write;
    let long = |c: char, i: usize| format!("{}{i:04}", c.to_string().repeat(240));
    let mut out = Vec::new();
    for i in 0..180 {
        let d = dir.join("d");
        let (what, results) = match i % 6 {
            0 => {
                let p = d.join(long('c', i));
                let created = std::fs::File::create(&p);
                let r1 =
                    io_result(created.as_ref().map(|_| ()).map_err(|e| {
                        std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0))
                    }));
                let r2 = match created {
                    Ok(mut f) => io_result(f.write_all(&[7u8; 8192])),
                    Err(_) => "-".into(),
                };
                ("create+write 8 KiB", vec![r1, r2])
            }
            1 => (
                "mkdir",
                vec![io_result(std::fs::create_dir(d.join(format!("m{i}"))))],
            ),
            2 => (
                "slow symlink",
                vec![io_result(std::os::unix::fs::symlink(
                    "t".repeat(300),
                    d.join(format!("s{i}")),
                ))],
            ),
            3 => (
                "link",
                vec![io_result(std::fs::hard_link(
                    dir.join("file"),
                    d.join(long('h', i)),
                ))],
            ),
            4 => (
                "rename",
                vec![io_result(std::fs::rename(
                    dir.join("src").join(format!("s{}", i / 6)),
                    d.join(long('r', i)),
                ))],
            ),
            _ => {
                let r = std::fs::OpenOptions::new()
                    .append(true)
                    .open(dir.join("file"))
                    .and_then(|mut f| f.write_all(&[9u8; 16384]));
                ("append 16 KiB", vec![io_result(r)])
            }
        };
        out.push((format!("step {i}: {what}"), results));
    }
    out
}

/// A nearly full file system, on the kernel's ext4 and on ordo: the same
/// steps (creates and writes, mkdir, slow symlinks, links and renames into
/// a directory whose blocks fill, appends) give the same results, except
/// where the two allocators run out at a different step (one says ENOSPC
/// where the other still succeeds: the kernel keeps 2% back for metadata,
/// and neither places blocks as the other does). Both must run out; every
/// failure must be ENOSPC; each side's tree must hold exactly what its own
/// answers say it made; deleting a file must make room for a write at once
/// on both; and both images must be `e2fsck -fn` clean.
#[test]
fn nearly_full_matches_the_kernels_ext4() {
    nearly_full("");
}

#[test]
fn nearly_full_matches_the_kernels_ext4_without_open_requests() {
    nearly_full("open_requests=off");
}

fn nearly_full(options: &str) {
    require_loop_devices();
    no_umask();
    let s = Scratch::new();
    let kimg = s.path("kernel.img");
    assert!(run("truncate", &["-s", "32M", kimg.to_str().unwrap()])
        .status
        .success());
    assert!(run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-I",
            "256",
            kimg.to_str().unwrap()
        ]
    )
    .status
    .success());
    let oimg = s.path("ordo.img");
    mkfs(&oimg, "32M");
    let kmp = s.mkdir("k");
    let omp = s.mkdir("o");
    sh(s.dir.path(), "chmod 0755 .");
    let km = KernelMount::start(&kimg, &kmp, "");
    let om = OrdoMount::start(&oimg, &omp, options);
    let mut runs = Vec::new();
    for mp in [&kmp, &omp] {
        let dir = mp.join("t");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::create_dir(dir.join("src")).unwrap();
        for i in 0..30 {
            std::fs::write(dir.join("src").join(format!("s{i}")), b"src").unwrap();
        }
        std::fs::write(dir.join("file"), [1u8; 4096]).unwrap();
        // Nearly full: everything but 256 KiB.
        let filler = dir.join("filler");
        let len = fill_until_full(&filler);
        let size = len.saturating_sub(256 * 1024).to_string();
        let out = run("truncate", &["-s", &size, filler.to_str().unwrap()]);
        assert!(out.status.success());
        runs.push(nearly_full_steps(&dir));
    }
    let (k, o) = (&runs[0], &runs[1]);
    let mut differ = 0;
    for ((what, kr), (_, or)) in k.iter().zip(o) {
        for (a, b) in kr.iter().zip(or) {
            for r in [a, b] {
                assert!(
                    r == "ok" || r == "-" || r.starts_with("ENOSPC"),
                    "{what}: kernel {kr:?}, ordo {or:?}: only ENOSPC may fail"
                );
            }
            if a != b {
                differ += 1;
            }
        }
    }
    let enospc = |rs: &[(String, Vec<String>)], kind: &str| {
        rs.iter()
            .any(|(w, r)| w.ends_with(kind) && r.iter().any(|x| x.starts_with("ENOSPC")))
    };
    for kind in [
        "create+write 8 KiB",
        "mkdir",
        "slow symlink",
        "append 16 KiB",
    ] {
        assert!(enospc(k, kind), "the kernel never ran out on {kind}");
        assert!(enospc(o, kind), "ordo never ran out on {kind}");
    }
    eprintln!(
        "nearly full: {} steps, {differ} results differ (one side ENOSPC, the other not)",
        k.len()
    );
    // Each side's tree is what its own answers say.
    for (mp, rs, side) in [(&kmp, k, "kernel"), (&omp, o, "ordo")] {
        let d = mp.join("t").join("d");
        let names: std::collections::BTreeSet<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut want = std::collections::BTreeSet::new();
        let long = |c: char, i: usize| format!("{}{i:04}", c.to_string().repeat(240));
        for (i, (_, r)) in rs.iter().enumerate() {
            if r[0] != "ok" {
                continue;
            }
            match i % 6 {
                0 => want.insert(long('c', i)),
                1 => want.insert(format!("m{i}")),
                2 => want.insert(format!("s{i}")),
                3 => want.insert(long('h', i)),
                4 => want.insert(long('r', i)),
                _ => false,
            };
        }
        assert_eq!(
            names, want,
            "{side}: the directory is not what the calls said"
        );
    }
    // Full on both; one deletion makes room at once.
    for mp in [&kmp, &omp] {
        let t = mp.join("t");
        fill_until_full(&t.join("filler2"));
        std::fs::remove_file(t.join("filler")).unwrap();
        let after = format!("of={}", t.join("after").display());
        let out = run("dd", &["if=/dev/zero", &after, "bs=1M", "count=1"]);
        assert!(
            out.status.success(),
            "{}: a write after a deletion: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    km.stop();
    stop_ordo(om, options);
    assert_e2fsck_clean(&oimg);
    assert_e2fsck_clean(&kimg);
}

/// One call of the fallocate-range comparison.
#[derive(Clone, Debug)]
enum RangeOp {
    Write(usize, u64, usize, u8),
    Truncate(usize, u64),
    Fallocate(usize, i32, u64, u64),
}

fn gen_range_op(rng: &mut Rng) -> RangeOp {
    let f = rng.below(3) as usize;
    let bs = 4096u64;
    let off = |rng: &mut Rng| {
        let b = rng.below(48) * bs;
        if rng.chance(15) {
            b + rng.below(bs)
        } else {
            b
        }
    };
    let len = |rng: &mut Rng| {
        let b = (1 + rng.below(12)) * bs;
        if rng.chance(10) {
            rng.below(3 * bs)
        } else {
            b
        }
    };
    match rng.below(10) {
        0..=2 => {
            let o = off(rng);
            let l = 1 + rng.below(6 * bs) as usize;
            RangeOp::Write(f, o, l, rng.below(255) as u8 + 1)
        }
        3 => RangeOp::Truncate(f, rng.below(60 * bs)),
        _ => {
            let mode = *rng.pick(&[
                libc::FALLOC_FL_COLLAPSE_RANGE,
                libc::FALLOC_FL_COLLAPSE_RANGE,
                libc::FALLOC_FL_INSERT_RANGE,
                libc::FALLOC_FL_INSERT_RANGE,
                libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_ZERO_RANGE,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            ]);
            RangeOp::Fallocate(f, mode, off(rng), len(rng))
        }
    }
}

/// fallocate COLLAPSE_RANGE and INSERT_RANGE, among writes, truncates and
/// the other fallocate modes, on three files: the kernel's ext4 (a loop
/// mount) against ordo's core. The kernel's FUSE module answers
/// EOPNOTSUPP to these two modes itself, without asking the file system
/// (Linux 6.18 passes on KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE only), so
/// ordo runs here through its library API, on an image `mkfs.ext4` made
/// with the same options as the kernel's. Compared after every call: the
/// result (errno), and each file's size, `st_blocks` and contents.
#[test]
fn fallocate_ranges_match_the_kernels_ext4() {
    use ordo_fs::{FileType, Fs, MountOptions, SetAttr, ROOT_INO};
    require_loop_devices();
    let s = Scratch::new();
    let make = |name: &str| {
        let img = s.path(name);
        let out = run("truncate", &["-s", "64M", img.to_str().unwrap()]);
        assert!(out.status.success());
        let out = run(
            "mkfs.ext4",
            &["-q", "-F", "-b", "4096", "-I", "256", img.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        img
    };
    let kimg = make("kernel.img");
    let oimg = make("ordo.img");
    let kmp = s.mkdir("k");
    let km = KernelMount::start(&kimg, &kmp, "");
    let dev = std::sync::Arc::new(
        ordo_dev::FileDevice::open(&oimg, 4096, ordo_dev::OpenOptions::read_write())
            .expect("open the image"),
    );
    let fs = Fs::mount(dev, MountOptions::default()).expect("mount the image");
    let c = ordo_fs::Creds::root();
    let seeds: Vec<u64> = match std::env::var("ORDO_DIFF_SEED") {
        Ok(v) => vec![v.parse().expect("ORDO_DIFF_SEED is a number")],
        Err(_) => vec![11, 12, 13],
    };
    let steps: usize = std::env::var("ORDO_DIFF_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let bs = 4096u64;
    for seed in seeds {
        eprintln!("fallocate ranges: seed {seed}, {steps} steps");
        let dir = kmp.join(format!("t{seed}"));
        std::fs::create_dir(&dir).unwrap();
        let odir = fs
            .mkdir(ROOT_INO, format!("t{seed}").as_bytes(), 0o755, &c)
            .unwrap()
            .ino;
        let kpaths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("f{i}"))).collect();
        let mut oinos = Vec::new();
        for (i, p) in kpaths.iter().enumerate() {
            std::fs::write(p, b"").unwrap();
            let a = fs
                .create(
                    odir,
                    format!("f{i}").as_bytes(),
                    FileType::Regular,
                    0o644,
                    0,
                    &c,
                )
                .unwrap();
            oinos.push(a.ino);
        }
        let mut rng = Rng::new(seed);
        let mut tree_diffs = 0u64;
        let (mut collapsed, mut inserted) = (0u64, 0u64);
        let mut tree_differs = [false; 3];
        let mut tree_started = std::collections::BTreeMap::new();
        for step in 0..steps {
            let op = gen_range_op(&mut rng);
            let (kr, or, f) = match &op {
                RangeOp::Write(f, off, len, seed) => {
                    let data: Vec<u8> = (0..*len)
                        .map(|i| seed.wrapping_add((i % 253) as u8))
                        .collect();
                    use std::os::unix::fs::FileExt;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&kpaths[*f])
                        .unwrap();
                    let kr = file
                        .write_all_at(&data, *off)
                        .map_err(|e| errname(e.raw_os_error().unwrap_or(0)));
                    let or = fs
                        .write(oinos[*f], *off, &data)
                        .map(|_| ())
                        .map_err(|e| errname(e.errno()));
                    (kr, or, *f)
                }
                RangeOp::Truncate(f, size) => {
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&kpaths[*f])
                        .unwrap();
                    let kr = file
                        .set_len(*size)
                        .map_err(|e| errname(e.raw_os_error().unwrap_or(0)));
                    let set = SetAttr {
                        size: Some(*size),
                        ..SetAttr::default()
                    };
                    let or = fs
                        .setattr(oinos[*f], &set)
                        .map(|_| ())
                        .map_err(|e| errname(e.errno()));
                    (kr, or, *f)
                }
                RangeOp::Fallocate(f, mode, off, len) => {
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&kpaths[*f])
                        .unwrap();
                    use std::os::fd::AsRawFd;
                    // SAFETY: the descriptor is open for the call.
                    let r = unsafe {
                        libc::fallocate(file.as_raw_fd(), *mode, *off as i64, *len as i64)
                    };
                    let kr = if r == 0 {
                        Ok(())
                    } else {
                        Err(errname(errno()))
                    };
                    let or = match ordo_fuse::falloc_flags(*mode) {
                        Err(e) => Err(errname(i32::from(e))),
                        Ok(flags) => fs
                            .fallocate(oinos[*f], *off, *len, flags)
                            .map_err(|e| errname(e.errno())),
                    };
                    (kr, or, *f)
                }
            };
            assert_eq!(kr, or, "seed {seed} step {step} {op:?}: result");
            if let (RangeOp::Fallocate(_, mode, ..), Ok(())) = (&op, &kr) {
                collapsed += u64::from(*mode == libc::FALLOC_FL_COLLAPSE_RANGE);
                inserted += u64::from(*mode == libc::FALLOC_FL_INSERT_RANGE);
            }
            // The kernel's block count once its delayed allocations are
            // made.
            let file = std::fs::File::open(&kpaths[f]).unwrap();
            file.sync_all().unwrap();
            let kmeta = file.metadata().unwrap();
            let kdata = std::fs::read(&kpaths[f]).unwrap();
            use std::os::unix::fs::MetadataExt;
            let oa = fs.getattr(oinos[f]).unwrap();
            let odata = fs.read(oinos[f], 0, (oa.size + bs) as u32).unwrap();
            // st_blocks is data plus extent-tree blocks. The data blocks
            // must match; the tree's may not: ordo folds a tree whose
            // extents fit in the inode back into it when extents are
            // removed, the kernel's ext4 keeps the leaf until the tree is
            // empty (a policy the README lists with allocation).
            let kmapped = fiemap_blocks(&file, bs);
            let omapped = fs.mapped_blocks(oinos[f]).unwrap();
            let sectors = bs / 512;
            assert_eq!(
                (kmeta.size(), kmapped),
                (oa.size, omapped),
                "seed {seed} step {step} {op:?}: size and data blocks (kernel, ordo)"
            );
            let ktree = kmeta.blocks() / sectors - kmapped;
            let otree = oa.blocks / sectors - omapped;
            assert!(
                kmeta.blocks().is_multiple_of(sectors)
                    && oa.blocks.is_multiple_of(sectors)
                    && ktree <= 1
                    && otree <= 1,
                "seed {seed} step {step} {op:?}: st_blocks {} (kernel), {} (ordo) for {kmapped} \
                 data blocks",
                kmeta.blocks(),
                oa.blocks
            );
            tree_diffs += u64::from(ktree != otree);
            if (ktree != otree) != tree_differs[f] {
                tree_differs[f] = ktree != otree;
                if ktree != otree {
                    let what = match &op {
                        RangeOp::Write(..) => "write".to_string(),
                        RangeOp::Truncate(..) => "truncate".to_string(),
                        RangeOp::Fallocate(_, mode, ..) => format!("fallocate {mode:#x}"),
                    };
                    *tree_started.entry(what).or_insert(0u64) += 1;
                }
            }
            assert!(
                kdata == odata,
                "seed {seed} step {step} {op:?}: contents differ (kernel {:016x}, ordo {:016x})",
                fnv(&kdata),
                fnv(&odata)
            );
        }
        eprintln!(
            "seed {seed}: {collapsed} collapses and {inserted} inserts done; extent-tree \
             blocks differed after {tree_diffs} of {steps} calls, starting at {tree_started:?}"
        );
        assert!(collapsed > 10 && inserted > 10, "too few shifts to compare");
    }
    fs.unmount().expect("unmount");
    km.stop();
    assert_e2fsck_clean(&oimg);
    assert_e2fsck_clean(&kimg);
}

/// Blocks FIEMAP reports mapped for `file` (written and unwritten).
fn fiemap_blocks(file: &std::fs::File, bs: u64) -> u64 {
    use std::os::fd::AsRawFd;
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const EXTENTS: usize = 1024;
    // struct fiemap (32 bytes) and its extents (56 bytes each), as u64s.
    let mut buf = vec![0u64; 4 + EXTENTS * 7];
    buf[1] = u64::MAX; // fm_length
    buf[3] = EXTENTS as u64; // fm_extent_count (low half), fm_reserved 0
                             // SAFETY: buf is large enough for the header and EXTENTS extents.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, buf.as_mut_ptr()) };
    assert_eq!(r, 0, "FIEMAP: {}", errname(errno()));
    let mapped = (buf[2] >> 32) as usize; // fm_mapped_extents
    assert!(mapped < EXTENTS, "more extents than FIEMAP was asked for");
    (0..mapped).map(|i| buf[4 + i * 7 + 2] / bs).sum()
}
