//! Model-based random test of the core.
//!
//! Thousands of random operations (create, mknod, mkdir, symlink, write at
//! random offsets, truncate, fallocate, punch, link, unlink, rmdir, rename
//! with and without NOREPLACE / EXCHANGE, setattr, open / unlink / release)
//! run through the library and against an in-memory model that predicts
//! every result, errno included. After every operation the objects it
//! touched are compared with the model (names, types, sizes, contents,
//! modes, owners, link counts); every few hundred operations and at the end
//! the whole tree is. Then the file system is unmounted, `e2fsck -fn` must
//! find it clean, it is mounted again and compared again, and finally the
//! Linux kernel mounts the image read-only and the whole tree and every
//! file's contents are compared through the kernel.
//!
//! The seed is printed; `ORDO_SEED=<n>` replays a run, `ORDO_MODEL_OPS=<n>`
//! changes its length.

mod core_common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use core_common::*;
use ordo_fs::{
    Creds, FallocFlags, FileType, Fs, Ino, ProtocolKind, RenameFlags, SetAttr, TimeSet, Timespec,
    ROOT_INO,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
enum Content {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, Ino>),
    Symlink(Vec<u8>),
    Special(FileType, u32),
}

#[derive(Clone, Debug)]
struct MInode {
    content: Content,
    perm: u16,
    uid: u32,
    gid: u32,
    /// Names of a non-directory (directories compute theirs).
    links: u32,
    open: u32,
}

impl MInode {
    fn kind(&self) -> FileType {
        match &self.content {
            Content::File(_) => FileType::Regular,
            Content::Dir(_) => FileType::Directory,
            Content::Symlink(_) => FileType::Symlink,
            Content::Special(k, _) => *k,
        }
    }
    fn is_dir(&self) -> bool {
        matches!(self.content, Content::Dir(_))
    }
}

struct Model {
    inodes: HashMap<Ino, MInode>,
    parent: HashMap<Ino, Ino>,
}

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"];

impl Model {
    fn load(fs: &Fs) -> Model {
        let mut m = Model {
            inodes: HashMap::new(),
            parent: HashMap::new(),
        };
        m.parent.insert(ROOT_INO, ROOT_INO);
        m.load_dir(fs, ROOT_INO);
        m
    }

    fn load_dir(&mut self, fs: &Fs, dir: Ino) {
        let a = fs.getattr(dir).unwrap();
        let mut entries = BTreeMap::new();
        for e in readdir_all(fs, dir) {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            entries.insert(e.name.clone(), e.ino);
            if e.kind == FileType::Directory {
                self.parent.insert(e.ino, dir);
                self.load_dir(fs, e.ino);
            } else {
                let ea = fs.getattr(e.ino).unwrap();
                let content = match e.kind {
                    FileType::Regular => Content::File(fs.read(e.ino, 0, ea.size as u32).unwrap()),
                    FileType::Symlink => Content::Symlink(fs.readlink(e.ino).unwrap()),
                    k => Content::Special(k, ea.rdev),
                };
                self.inodes.insert(
                    e.ino,
                    MInode {
                        content,
                        perm: ea.perm,
                        uid: ea.uid,
                        gid: ea.gid,
                        links: ea.nlink,
                        open: 0,
                    },
                );
            }
        }
        self.inodes.insert(
            dir,
            MInode {
                content: Content::Dir(entries),
                perm: a.perm,
                uid: a.uid,
                gid: a.gid,
                links: 0,
                open: 0,
            },
        );
    }

    fn entries(&self, dir: Ino) -> &BTreeMap<Vec<u8>, Ino> {
        match &self.inodes[&dir].content {
            Content::Dir(e) => e,
            _ => panic!("{dir} is not a directory"),
        }
    }
    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<Vec<u8>, Ino> {
        match &mut self.inodes.get_mut(&dir).unwrap().content {
            Content::Dir(e) => e,
            _ => panic!("{dir} is not a directory"),
        }
    }
    fn nlink(&self, ino: Ino) -> u32 {
        let i = &self.inodes[&ino];
        match &i.content {
            Content::Dir(e) => 2 + e.values().filter(|c| self.inodes[c].is_dir()).count() as u32,
            _ => i.links,
        }
    }
    fn dirs(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dir())
            .map(|(&k, _)| k)
            .collect();
        v.sort_unstable();
        v
    }
    fn files(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(_, i)| matches!(i.content, Content::File(_)))
            .map(|(&k, _)| k)
            .collect();
        v.sort_unstable();
        v
    }
    fn non_dirs(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(_, i)| !i.is_dir() && i.links > 0)
            .map(|(&k, _)| k)
            .collect();
        v.sort_unstable();
        v
    }
    fn is_ancestor(&self, a: Ino, mut d: Ino) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT_INO {
                return false;
            }
            d = self.parent[&d];
        }
    }
    /// Drop one name of `ino`; forget it when nothing holds it.
    fn unref(&mut self, ino: Ino) {
        let i = self.inodes.get_mut(&ino).unwrap();
        if i.is_dir() {
            i.links = 0;
            self.parent.remove(&ino);
            if i.open == 0 {
                self.inodes.remove(&ino);
            }
            return;
        }
        i.links -= 1;
        if i.links == 0 && i.open == 0 {
            self.inodes.remove(&ino);
        }
    }
}

fn readdir_all(fs: &Fs, dir: Ino) -> Vec<ordo_fs::DirEntry> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let page = fs.readdir(dir, cookie, 7).unwrap();
        if page.is_empty() {
            return out;
        }
        cookie = page.last().unwrap().next_offset;
        out.extend(page);
    }
}

fn errno_of<T>(r: &ordo_fs::Result<T>) -> Option<i32> {
    r.as_ref().err().map(|e| e.errno())
}

/// Compare one inode of the model with the file system.
fn check_inode(fs: &Fs, m: &Model, ino: Ino, ctx: &str) {
    let i = &m.inodes[&ino];
    let a = fs
        .getattr(ino)
        .unwrap_or_else(|e| panic!("{ctx}: getattr {ino}: {e}"));
    assert_eq!(a.kind, i.kind(), "{ctx}: kind of {ino}");
    assert_eq!(a.perm, i.perm, "{ctx}: perm of {ino}");
    assert_eq!((a.uid, a.gid), (i.uid, i.gid), "{ctx}: owner of {ino}");
    let want_links =
        if i.is_dir() && i.links == 0 && !m.parent.contains_key(&ino) && ino != ROOT_INO {
            0
        } else {
            m.nlink(ino)
        };
    assert_eq!(a.nlink, want_links, "{ctx}: nlink of {ino}");
    match &i.content {
        Content::File(d) => {
            assert_eq!(a.size, d.len() as u64, "{ctx}: size of {ino}");
            let got = fs.read(ino, 0, d.len() as u32 + 10).unwrap();
            if got != *d {
                let at = got.iter().zip(d.iter()).position(|(x, y)| x != y);
                panic!(
                    "{ctx}: contents of {ino} differ (first at {at:?}, len {} vs {})",
                    got.len(),
                    d.len()
                );
            }
        }
        Content::Symlink(t) => {
            assert_eq!(a.size, t.len() as u64, "{ctx}: symlink size of {ino}");
            assert_eq!(&fs.readlink(ino).unwrap(), t, "{ctx}: target of {ino}");
        }
        Content::Special(_, rdev) => assert_eq!(a.rdev, *rdev, "{ctx}: rdev of {ino}"),
        Content::Dir(e) => {
            if i.links == 0 && ino != ROOT_INO && !m.parent.contains_key(&ino) {
                return;
            }
            let got = readdir_all(fs, ino);
            let mut names = BTreeMap::new();
            for x in &got {
                assert!(
                    names.insert(x.name.clone(), x.ino).is_none(),
                    "{ctx}: duplicate name {:?} in {ino}",
                    String::from_utf8_lossy(&x.name)
                );
                if x.name != b"." && x.name != b".." {
                    assert_eq!(
                        x.kind,
                        m.inodes[&x.ino].kind(),
                        "{ctx}: readdir type of {:?}",
                        String::from_utf8_lossy(&x.name)
                    );
                }
            }
            assert_eq!(names.remove(&b"."[..]), Some(ino), "{ctx}: . of {ino}");
            assert_eq!(
                names.remove(&b".."[..]),
                Some(m.parent[&ino]),
                "{ctx}: .. of {ino}"
            );
            assert_eq!(&names, e, "{ctx}: entries of {ino}");
        }
    }
}

fn check_all(fs: &Fs, m: &Model, ctx: &str) {
    let mut inos: Vec<Ino> = m.inodes.keys().copied().collect();
    inos.sort_unstable();
    for ino in inos {
        check_inode(fs, m, ino, ctx);
    }
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, v: &[T]) -> T {
    v[rng.gen_range(0..v.len())]
}

fn rand_name(rng: &mut ChaCha8Rng) -> Vec<u8> {
    match rng.gen_range(0..100) {
        0 => b".".to_vec(),
        1 => b"..".to_vec(),
        2 => vec![b'x'; 256],
        3 => vec![b'y'; 255],
        _ => pick(rng, NAMES).as_bytes().to_vec(),
    }
}

fn rand_data(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let seed: u8 = rng.gen();
    (0..len)
        .map(|i| seed.wrapping_add((i * 7 + i / 251) as u8))
        .collect()
}

fn new_owner(m: &Model, parent: Ino, mode_perm: u16, is_dir: bool, c: &Creds) -> (u16, u32) {
    let p = &m.inodes[&parent];
    let mut perm = mode_perm;
    let gid = if p.perm & 0o2000 != 0 {
        if is_dir {
            perm |= 0o2000;
        }
        p.gid
    } else {
        c.gid
    };
    if !is_dir && perm & 0o2000 != 0 && c.uid != 0 && gid != c.gid && !c.groups.contains(&gid) {
        perm &= !0o2000;
    }
    (perm, gid)
}

/// Errors a new entry `name` in `dir` would get.
fn new_entry_err(m: &Model, dir: Ino, name: &[u8]) -> Option<i32> {
    if !m.inodes[&dir].is_dir() {
        return Some(libc::ENOTDIR);
    }
    if name == b"." || name == b".." {
        return Some(libc::EEXIST);
    }
    if name.len() > 255 {
        return Some(libc::ENAMETOOLONG);
    }
    if m.entries(dir).contains_key(name) {
        return Some(libc::EEXIST);
    }
    None
}

struct Runner {
    rng: ChaCha8Rng,
    m: Model,
    open_files: Vec<Ino>,
    uid_creds: Creds,
}

impl Runner {
    /// fallocate COLLAPSE_RANGE or INSERT_RANGE on file `f`, mostly with
    /// whole blocks; the model's errno rules are ext4's.
    fn shift_range(&mut self, fs: &Fs, f: Ino, n: usize) -> (String, Vec<Ino>) {
        let bs = u64::from(fs.block_size());
        let collapse = self.rng.gen_bool(0.5);
        let (mut off, mut len) = (
            self.rng.gen_range(0..50u64) * bs,
            self.rng.gen_range(0..20u64) * bs,
        );
        if self.rng.gen_range(0..10) == 0 {
            off += self.rng.gen_range(1..bs);
        }
        if self.rng.gen_range(0..10) == 0 {
            len += self.rng.gen_range(1..bs);
        }
        let flags = FallocFlags {
            collapse_range: collapse,
            insert_range: !collapse,
            ..FallocFlags::default()
        };
        let r = fs.fallocate(f, off, len, flags);
        let Content::File(d) = &mut self.m.inodes.get_mut(&f).unwrap().content else {
            unreachable!("a file");
        };
        let size = d.len() as u64;
        // Not whole blocks, a collapse reaching the end, an insert at or
        // past it: EINVAL.
        let refused = len == 0
            || !off.is_multiple_of(bs)
            || !len.is_multiple_of(bs)
            || (collapse && off + len >= size)
            || (!collapse && off >= size);
        let want = refused.then_some(libc::EINVAL);
        let name = if collapse { "collapse" } else { "insert" };
        assert_eq!(
            errno_of(&r),
            want,
            "op {n}: {name} {off}+{len} of a file of {size} bytes"
        );
        if want.is_some() {
            return (format!("{name} (refused)"), vec![]);
        }
        let (o, l) = (off as usize, len as usize);
        if collapse {
            d.drain(o..o + l);
        } else {
            d.splice(o..o, std::iter::repeat_n(0u8, l));
        }
        (name.into(), vec![f])
    }

    fn any_dir_or_file(&mut self) -> Ino {
        if self.rng.gen_range(0..20) == 0 {
            let nd = self.m.non_dirs();
            if !nd.is_empty() {
                return pick(&mut self.rng, &nd);
            }
        }
        let d = self.m.dirs();
        let d: Vec<Ino> = d
            .into_iter()
            .filter(|x| *x == ROOT_INO || self.m.parent.contains_key(x))
            .collect();
        pick(&mut self.rng, &d)
    }

    fn live_dir(&mut self) -> Ino {
        let d: Vec<Ino> = self
            .m
            .dirs()
            .into_iter()
            .filter(|x| *x == ROOT_INO || self.m.parent.contains_key(x))
            .collect();
        pick(&mut self.rng, &d)
    }

    /// One random operation; returns the inodes whose state to compare.
    fn step(&mut self, fs: &Fs, n: usize) -> (String, Vec<Ino>) {
        let op = self.rng.gen_range(0..100);
        let creds = if self.rng.gen_range(0..5) == 0 {
            self.uid_creds.clone()
        } else {
            Creds::root()
        };
        match op {
            0..=11 => {
                // create / mknod
                let p = self.any_dir_or_file();
                let name = rand_name(&mut self.rng);
                let kind = match self.rng.gen_range(0..10) {
                    0 => FileType::Fifo,
                    1 => FileType::Socket,
                    2 => FileType::CharDevice,
                    3 => FileType::BlockDevice,
                    _ => FileType::Regular,
                };
                let rdev = match self.rng.gen_range(0..2) {
                    0 => (8 << 8) | 3,
                    _ => (259 << 8) | 0x100005, // needs the new encoding
                };
                let rdev = if matches!(kind, FileType::CharDevice | FileType::BlockDevice) {
                    rdev
                } else {
                    0
                };
                let perm = self.rng.gen_range(0..0o10000u16);
                let r = fs.create(p, &name, kind, perm, rdev, &creds);
                let want = new_entry_err(&self.m, p, &name);
                assert_eq!(
                    errno_of(&r),
                    want,
                    "op {n}: create {p}/{:?}",
                    String::from_utf8_lossy(&name)
                );
                if let Ok(a) = r {
                    let (perm, gid) = new_owner(&self.m, p, perm, false, &creds);
                    let content = match kind {
                        FileType::Regular => Content::File(Vec::new()),
                        k => Content::Special(k, rdev),
                    };
                    self.m.inodes.insert(
                        a.ino,
                        MInode {
                            content,
                            perm,
                            uid: creds.uid,
                            gid,
                            links: 1,
                            open: 0,
                        },
                    );
                    self.m.entries_mut(p).insert(name, a.ino);
                    return (format!("create {kind:?}"), vec![p, a.ino]);
                }
                ("create (failed)".into(), vec![])
            }
            12..=19 => {
                let p = self.any_dir_or_file();
                let name = rand_name(&mut self.rng);
                let perm = self.rng.gen_range(0..0o10000u16);
                let r = fs.mkdir(p, &name, perm, &creds);
                let want = new_entry_err(&self.m, p, &name);
                assert_eq!(errno_of(&r), want, "op {n}: mkdir");
                if let Ok(a) = r {
                    let (perm, gid) = new_owner(&self.m, p, perm, true, &creds);
                    self.m.inodes.insert(
                        a.ino,
                        MInode {
                            content: Content::Dir(BTreeMap::new()),
                            perm,
                            uid: creds.uid,
                            gid,
                            links: 0,
                            open: 0,
                        },
                    );
                    self.m.parent.insert(a.ino, p);
                    self.m.entries_mut(p).insert(name, a.ino);
                    return ("mkdir".into(), vec![p, a.ino]);
                }
                ("mkdir (failed)".into(), vec![])
            }
            20..=24 => {
                let p = self.any_dir_or_file();
                let name = rand_name(&mut self.rng);
                let len = match self.rng.gen_range(0..20) {
                    0 => 0,
                    1 => 4096,
                    2..=9 => self.rng.gen_range(60..300),
                    _ => self.rng.gen_range(1..60),
                };
                let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                let r = fs.symlink(p, &name, &target, &creds);
                let want = new_entry_err(&self.m, p, &name).or(if target.is_empty() {
                    Some(libc::ENOENT)
                } else if target.len() + 1 > fs.block_size() as usize {
                    Some(libc::ENAMETOOLONG)
                } else {
                    None
                });
                assert_eq!(errno_of(&r), want, "op {n}: symlink len {len}");
                if let Ok(a) = r {
                    let (_, gid) = new_owner(&self.m, p, 0o777, false, &creds);
                    self.m.inodes.insert(
                        a.ino,
                        MInode {
                            content: Content::Symlink(target),
                            perm: 0o777,
                            uid: creds.uid,
                            gid,
                            links: 1,
                            open: 0,
                        },
                    );
                    self.m.entries_mut(p).insert(name, a.ino);
                    return ("symlink".into(), vec![p, a.ino]);
                }
                ("symlink (failed)".into(), vec![])
            }
            25..=39 => {
                let files = self.m.files();
                if files.is_empty() {
                    return ("write (none)".into(), vec![]);
                }
                let f = pick(&mut self.rng, &files);
                let off = match self.rng.gen_range(0..10) {
                    0 => self.rng.gen_range(0..3 << 20),
                    1 => match &self.m.inodes[&f].content {
                        Content::File(d) => d.len() as u64,
                        _ => 0,
                    },
                    _ => self.rng.gen_range(0..80_000),
                };
                let len = self.rng.gen_range(0..20_000);
                let data = rand_data(&mut self.rng, len);
                let r = fs.write(f, off, &data).unwrap();
                assert_eq!(r as usize, len, "op {n}: write count");
                if let Content::File(d) = &mut self.m.inodes.get_mut(&f).unwrap().content {
                    // A write of nothing changes nothing, even past the end.
                    let end = off as usize + len;
                    if len > 0 {
                        if d.len() < end {
                            d.resize(end, 0);
                        }
                        d[off as usize..end].copy_from_slice(&data);
                    }
                }
                ("write".into(), vec![f])
            }
            40..=44 => {
                let files = self.m.files();
                if files.is_empty() {
                    return ("truncate (none)".into(), vec![]);
                }
                let f = pick(&mut self.rng, &files);
                let size = self.rng.gen_range(0..150_000u64);
                fs.setattr(
                    f,
                    &SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    },
                )
                .unwrap();
                if let Content::File(d) = &mut self.m.inodes.get_mut(&f).unwrap().content {
                    d.resize(size as usize, 0);
                }
                ("truncate".into(), vec![f])
            }
            45..=49 => {
                let files = self.m.files();
                if files.is_empty() {
                    return ("fallocate (none)".into(), vec![]);
                }
                let f = pick(&mut self.rng, &files);
                if self.rng.gen_range(0..3) == 0 {
                    return self.shift_range(fs, f, n);
                }
                let off = self.rng.gen_range(0..200_000u64);
                let len = self.rng.gen_range(0..100_000u64);
                let punch = self.rng.gen_bool(0.5);
                let keep = punch || self.rng.gen_bool(0.5);
                let r = fs.fallocate(
                    f,
                    off,
                    len,
                    FallocFlags {
                        keep_size: keep,
                        punch_hole: punch,
                        zero_range: false,
                        collapse_range: false,
                        insert_range: false,
                    },
                );
                if len == 0 {
                    assert_eq!(errno_of(&r), Some(libc::EINVAL), "op {n}: fallocate len 0");
                    return ("fallocate 0".into(), vec![]);
                }
                r.unwrap();
                if let Content::File(d) = &mut self.m.inodes.get_mut(&f).unwrap().content {
                    if punch {
                        let end = ((off + len) as usize).min(d.len());
                        if (off as usize) < end {
                            d[off as usize..end].fill(0);
                        }
                    } else if !keep && (off + len) as usize > d.len() {
                        d.resize((off + len) as usize, 0);
                    }
                }
                (if punch { "punch" } else { "fallocate" }.into(), vec![f])
            }
            50..=55 => {
                let nd = self.m.non_dirs();
                if nd.is_empty() {
                    return ("link (none)".into(), vec![]);
                }
                let src = if self.rng.gen_range(0..15) == 0 {
                    self.live_dir()
                } else {
                    pick(&mut self.rng, &nd)
                };
                let p = self.any_dir_or_file();
                let name = rand_name(&mut self.rng);
                let r = fs.link(src, p, &name);
                let want = new_entry_err(&self.m, p, &name).or(if self.m.inodes[&src].is_dir() {
                    Some(libc::EPERM)
                } else {
                    None
                });
                assert_eq!(errno_of(&r), want, "op {n}: link");
                if r.is_ok() {
                    self.m.inodes.get_mut(&src).unwrap().links += 1;
                    self.m.entries_mut(p).insert(name, src);
                    return ("link".into(), vec![src, p]);
                }
                ("link (failed)".into(), vec![])
            }
            56..=65 => {
                let p = self.live_dir();
                let names: Vec<Vec<u8>> = self.m.entries(p).keys().cloned().collect();
                let name = if !names.is_empty() && self.rng.gen_bool(0.8) {
                    names[self.rng.gen_range(0..names.len())].clone()
                } else {
                    rand_name(&mut self.rng)
                };
                let r = fs.unlink(p, &name);
                let target = self.m.entries(p).get(&name).copied();
                let want = if name.len() > 255 {
                    Some(libc::ENAMETOOLONG)
                } else if name == b"." || name == b".." {
                    Some(libc::EISDIR)
                } else {
                    match target {
                        None => Some(libc::ENOENT),
                        Some(t) if self.m.inodes[&t].is_dir() => Some(libc::EISDIR),
                        Some(_) => None,
                    }
                };
                assert_eq!(
                    errno_of(&r),
                    want,
                    "op {n}: unlink {:?}",
                    String::from_utf8_lossy(&name)
                );
                if r.is_ok() {
                    let t = target.unwrap();
                    self.m.entries_mut(p).remove(&name);
                    self.m.unref(t);
                    let mut v = vec![p];
                    if self.m.inodes.contains_key(&t) {
                        v.push(t);
                    }
                    return ("unlink".into(), v);
                }
                ("unlink (failed)".into(), vec![])
            }
            66..=71 => {
                let p = self.live_dir();
                let names: Vec<Vec<u8>> = self.m.entries(p).keys().cloned().collect();
                let name = if !names.is_empty() && self.rng.gen_bool(0.8) {
                    names[self.rng.gen_range(0..names.len())].clone()
                } else {
                    rand_name(&mut self.rng)
                };
                let r = fs.rmdir(p, &name);
                let target = self.m.entries(p).get(&name).copied();
                let want = if name == b"." {
                    Some(libc::EINVAL)
                } else if name == b".." {
                    Some(libc::ENOTEMPTY)
                } else if name.len() > 255 {
                    Some(libc::ENAMETOOLONG)
                } else {
                    match target {
                        None => Some(libc::ENOENT),
                        Some(t) if !self.m.inodes[&t].is_dir() => Some(libc::ENOTDIR),
                        Some(t) if !self.m.entries(t).is_empty() => Some(libc::ENOTEMPTY),
                        Some(_) => None,
                    }
                };
                assert_eq!(
                    errno_of(&r),
                    want,
                    "op {n}: rmdir {:?}",
                    String::from_utf8_lossy(&name)
                );
                if r.is_ok() {
                    let t = target.unwrap();
                    self.m.entries_mut(p).remove(&name);
                    self.m.unref(t);
                    return ("rmdir".into(), vec![p]);
                }
                ("rmdir (failed)".into(), vec![])
            }
            72..=84 => self.rename(fs, n),
            85..=92 => {
                let all: Vec<Ino> = {
                    let mut v: Vec<Ino> = self
                        .m
                        .inodes
                        .iter()
                        .filter(|(&k, i)| {
                            i.links > 0 || k == ROOT_INO || self.m.parent.contains_key(&k)
                        })
                        .map(|(&k, _)| k)
                        .collect();
                    v.sort_unstable();
                    v
                };
                let ino = pick(&mut self.rng, &all);
                if self.m.inodes[&ino].kind() == FileType::Symlink {
                    return ("setattr (symlink skipped)".into(), vec![]);
                }
                let mut set = SetAttr::default();
                if self.rng.gen_bool(0.5) {
                    set.perm = Some(self.rng.gen_range(0..0o10000));
                }
                if self.rng.gen_bool(0.3) {
                    set.uid = Some(pick(&mut self.rng, &[0, 1000, 70000]));
                }
                if self.rng.gen_bool(0.3) {
                    set.gid = Some(pick(&mut self.rng, &[0, 1000, 70001]));
                }
                let t = Timespec {
                    sec: self.rng.gen_range(0..4_000_000_000i64),
                    nsec: self.rng.gen_range(0..1_000_000_000),
                };
                if self.rng.gen_bool(0.3) {
                    set.mtime = Some(TimeSet::At(t));
                }
                if self.rng.gen_bool(0.2) {
                    set.atime = Some(TimeSet::At(t));
                }
                let a = fs.setattr(ino, &set).unwrap();
                let mi = self.m.inodes.get_mut(&ino).unwrap();
                if let Some(p) = set.perm {
                    mi.perm = p;
                }
                if set.uid.is_some() || set.gid.is_some() {
                    mi.uid = set.uid.unwrap_or(mi.uid);
                    mi.gid = set.gid.unwrap_or(mi.gid);
                    if !mi.is_dir() {
                        mi.perm &= !0o4000;
                        if mi.perm & 0o010 != 0 {
                            mi.perm &= !0o2000;
                        }
                    }
                }
                if set.mtime.is_some() {
                    assert_eq!(a.mtime, t, "op {n}: mtime");
                }
                if set.atime.is_some() {
                    assert_eq!(a.atime, t, "op {n}: atime");
                }
                ("setattr".into(), vec![ino])
            }
            93..=96 => {
                // open a file, maybe unlink it while open, release later
                if !self.open_files.is_empty() && self.rng.gen_bool(0.5) {
                    let k = self.rng.gen_range(0..self.open_files.len());
                    let ino = self.open_files.swap_remove(k);
                    fs.release(ino).unwrap();
                    let mi = self.m.inodes.get_mut(&ino).unwrap();
                    mi.open -= 1;
                    if mi.open == 0
                        && mi.links == 0
                        && !(mi.is_dir() && self.m.parent.contains_key(&ino))
                    {
                        self.m.inodes.remove(&ino);
                        assert_eq!(
                            fs.getattr(ino).unwrap_err().errno(),
                            libc::ENOENT,
                            "op {n}: released orphan still there"
                        );
                        return ("release (freed)".into(), vec![]);
                    }
                    return ("release".into(), vec![ino]);
                }
                let files = self.m.files();
                if files.is_empty() {
                    return ("open (none)".into(), vec![]);
                }
                let f = pick(&mut self.rng, &files);
                fs.open(f).unwrap();
                self.m.inodes.get_mut(&f).unwrap().open += 1;
                self.open_files.push(f);
                ("open".into(), vec![f])
            }
            _ => {
                // read a random range
                let files = self.m.files();
                if files.is_empty() {
                    return ("read (none)".into(), vec![]);
                }
                let f = pick(&mut self.rng, &files);
                let off = self.rng.gen_range(0..100_000u64);
                let len = self.rng.gen_range(0..30_000u32);
                let got = fs.read(f, off, len).unwrap();
                // The same read into a buffer that holds stale bytes (as
                // a lent transport buffer does): holes and unwritten
                // extents must come back as zeros all the same.
                let mut lent = vec![0xee_u8; len as usize + 7];
                let filled = fs.read_into(f, off, &mut lent[..len as usize]).unwrap();
                assert_eq!(&lent[..filled], &got[..], "op {n}: read_into {f} at {off}");
                assert!(
                    lent[len as usize..].iter().all(|&b| b == 0xee),
                    "op {n}: read_into {f} wrote past its buffer"
                );
                if let Content::File(d) = &self.m.inodes[&f].content {
                    let s = (off as usize).min(d.len());
                    let e = (off as usize + len as usize).min(d.len());
                    assert_eq!(got, d[s..e].to_vec(), "op {n}: read {f} at {off}");
                }
                ("read".into(), vec![])
            }
        }
    }

    fn rename(&mut self, fs: &Fs, n: usize) -> (String, Vec<Ino>) {
        let p1 = self.live_dir();
        let p2 = self.live_dir();
        let names: Vec<Vec<u8>> = self.m.entries(p1).keys().cloned().collect();
        let n1 = if !names.is_empty() && self.rng.gen_bool(0.85) {
            names[self.rng.gen_range(0..names.len())].clone()
        } else {
            rand_name(&mut self.rng)
        };
        let n2 = rand_name(&mut self.rng);
        let flags = match self.rng.gen_range(0..6) {
            0 => RenameFlags {
                noreplace: true,
                exchange: false,
            },
            1 => RenameFlags {
                noreplace: false,
                exchange: true,
            },
            _ => RenameFlags::default(),
        };
        let r = fs.rename(p1, &n1, p2, &n2, flags);
        let s = self.m.entries(p1).get(&n1).copied();
        let t = self.m.entries(p2).get(&n2).copied();
        let dot = |x: &[u8]| x == b"." || x == b"..";
        let want = if n1.len() > 255 || n2.len() > 255 {
            Some(libc::ENAMETOOLONG)
        } else if dot(&n1) {
            Some(libc::EBUSY)
        } else if dot(&n2) {
            Some(if flags.noreplace {
                libc::EEXIST
            } else {
                libc::EBUSY
            })
        } else if s.is_none() {
            Some(libc::ENOENT)
        } else if flags.noreplace && t.is_some() {
            Some(libc::EEXIST)
        } else if flags.exchange && t.is_none() {
            Some(libc::ENOENT)
        } else {
            let s = s.unwrap();
            let sd = self.m.inodes[&s].is_dir();
            let td = t.map(|t| self.m.inodes[&t].is_dir()).unwrap_or(false);
            if sd && p1 != p2 && self.m.is_ancestor(s, p2) {
                Some(libc::EINVAL)
            } else if td && p1 != p2 && self.m.is_ancestor(t.unwrap(), p1) {
                Some(if flags.exchange {
                    libc::EINVAL
                } else {
                    libc::ENOTEMPTY
                })
            } else if t == Some(s) || flags.exchange {
                None
            } else if let Some(t) = t {
                if sd && !td {
                    Some(libc::ENOTDIR)
                } else if !sd && td {
                    Some(libc::EISDIR)
                } else if td && !self.m.entries(t).is_empty() {
                    Some(libc::ENOTEMPTY)
                } else {
                    None
                }
            } else {
                None
            }
        };
        assert_eq!(
            errno_of(&r),
            want,
            "op {n}: rename {p1}/{:?} -> {p2}/{:?} {flags:?}",
            String::from_utf8_lossy(&n1),
            String::from_utf8_lossy(&n2)
        );
        if r.is_err() {
            return ("rename (failed)".into(), vec![]);
        }
        let s = s.unwrap();
        if t == Some(s) {
            return ("rename (same inode)".into(), vec![p1, p2]);
        }
        let mut touched = vec![p1, p2, s];
        if flags.exchange {
            let t = t.unwrap();
            self.m.entries_mut(p1).insert(n1.clone(), t);
            self.m.entries_mut(p2).insert(n2.clone(), s);
            if self.m.inodes[&s].is_dir() {
                self.m.parent.insert(s, p2);
            }
            if self.m.inodes[&t].is_dir() {
                self.m.parent.insert(t, p1);
            }
            touched.push(t);
            return ("rename exchange".into(), touched);
        }
        self.m.entries_mut(p1).remove(&n1);
        self.m.entries_mut(p2).insert(n2.clone(), s);
        if self.m.inodes[&s].is_dir() {
            self.m.parent.insert(s, p2);
        }
        if let Some(t) = t {
            self.m.unref(t);
            if self.m.inodes.contains_key(&t) {
                touched.push(t);
            }
        }
        ("rename".into(), touched)
    }
}

/// Compare the model with the image as the Linux kernel reads it.
fn check_with_kernel(img: &Path, m: &Model) {
    let mnt = kernel_mount(img, "ro");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut seen_links: HashMap<Ino, u32> = HashMap::new();
        walk_kernel(mnt.mountpoint(), ROOT_INO, m, &mut seen_links);
    }));
    drop(mnt);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn walk_kernel(path: &Path, ino: Ino, m: &Model, seen: &mut HashMap<Ino, u32>) {
    let md = std::fs::symlink_metadata(path).unwrap();
    assert_eq!(md.ino(), ino as u64, "kernel: inode of {path:?}");
    let i = &m.inodes[&ino];
    assert_eq!(
        (md.mode() & 0o7777) as u16,
        i.perm,
        "kernel: mode of {path:?}"
    );
    assert_eq!(md.nlink(), m.nlink(ino) as u64, "kernel: nlink of {path:?}");
    assert_eq!(
        (md.uid(), md.gid()),
        (i.uid, i.gid),
        "kernel: owner of {path:?}"
    );
    match &i.content {
        Content::Dir(e) => {
            assert!(md.is_dir());
            let mut names = BTreeSet::new();
            for de in std::fs::read_dir(path).unwrap() {
                let de = de.unwrap();
                names.insert(de.file_name().as_encoded_bytes().to_vec());
            }
            let want: BTreeSet<Vec<u8>> = e.keys().cloned().collect();
            assert_eq!(names, want, "kernel: entries of {path:?}");
            for (name, &child) in e {
                let p = path.join(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(name));
                walk_kernel(&p, child, m, seen);
            }
        }
        Content::File(d) => {
            assert!(md.is_file(), "kernel: {path:?} not a file");
            if seen.insert(ino, 1).is_none() {
                let got = std::fs::read(path).unwrap();
                assert!(got == *d, "kernel: contents of {path:?} differ");
            }
        }
        Content::Symlink(t) => {
            assert!(md.file_type().is_symlink());
            let got = std::fs::read_link(path).unwrap();
            assert_eq!(
                got.as_os_str().as_encoded_bytes(),
                &t[..],
                "kernel: target of {path:?}"
            );
        }
        Content::Special(k, rdev) => {
            let ft = md.file_type();
            match k {
                FileType::Fifo => assert!(ft.is_fifo()),
                FileType::Socket => assert!(ft.is_socket()),
                FileType::CharDevice => assert!(ft.is_char_device()),
                FileType::BlockDevice => assert!(ft.is_block_device()),
                _ => unreachable!(),
            }
            if matches!(k, FileType::CharDevice | FileType::BlockDevice) {
                let (ma, mi) = (
                    ((rdev >> 8) & 0xfff),
                    ((rdev & 0xff) | ((rdev >> 12) & 0xfff00)),
                );
                let dev = md.rdev();
                assert_eq!(
                    (libc::major(dev), libc::minor(dev)),
                    (ma, mi),
                    "kernel: rdev of {path:?}"
                );
            }
        }
    }
}

trait SafeOsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr;
}
impl SafeOsStr for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b)
    }
}

fn run_model(mode: ProtocolKind, block_size: u32, features: &str, default_ops: usize) {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    let seed: u64 = std::env::var("ORDO_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    let ops: usize = std::env::var("ORDO_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_ops);
    eprintln!(
        "model test: mode={} bs={block_size} seed={seed} ops={ops} (ORDO_SEED={seed} replays)",
        mode.name()
    );
    let (_dir, img) = scratch();
    mkfs(&img, 64, block_size, features);
    let fs = mount(&img, mode);
    let mut r = Runner {
        rng: ChaCha8Rng::seed_from_u64(seed),
        m: Model::load(&fs),
        open_files: Vec::new(),
        uid_creds: Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![],
            umask: 0,
        },
    };
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for n in 0..ops {
        let (what, touched) = r.step(&fs, n);
        *tally.entry(what.clone()).or_default() += 1;
        let ctx = format!("seed {seed} op {n} ({what})");
        for ino in touched {
            if r.m.inodes.contains_key(&ino) {
                check_inode(&fs, &r.m, ino, &ctx);
            }
        }
        if n % 1000 == 999 {
            check_all(&fs, &r.m, &ctx);
            if n % 3000 == 2999 {
                fs.sync().unwrap();
            } else {
                fs.write_back().unwrap();
            }
        }
    }
    check_all(&fs, &r.m, &format!("seed {seed} end"));
    eprintln!("operations: {tally:?}");
    let ok_ops: usize = tally
        .iter()
        .filter(|(k, _)| !k.contains("failed") && !k.contains("none"))
        .map(|(_, v)| v)
        .sum();
    assert!(ok_ops * 2 > ops, "too few operations succeeded: {tally:?}");
    eprintln!("inodes in the model at the end: {}", r.m.inodes.len());
    for ino in r.open_files.drain(..) {
        fs.release(ino).unwrap();
        let mi = r.m.inodes.get_mut(&ino).unwrap();
        mi.open -= 1;
        if mi.open == 0 && mi.links == 0 && !r.m.parent.contains_key(&ino) {
            r.m.inodes.remove(&ino);
        }
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let fs = mount(&img, mode);
    check_all(&fs, &r.m, &format!("seed {seed} after remount"));
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    if can_mount() {
        check_with_kernel(&img, &r.m);
        eprintln!("kernel comparison: the tree matches");
    } else {
        eprintln!("kernel comparison skipped: needs root and loop devices");
    }
}

#[test]
fn model_async_4k() {
    run_model(ProtocolKind::named("async"), 4096, "^has_journal", 10_000);
}

#[test]
fn model_sync_4k_debian_defaults() {
    run_model(ProtocolKind::named("sync"), 4096, "", 10_000);
}

#[test]
fn model_async_1k() {
    run_model(ProtocolKind::named("async"), 1024, "", 4_000);
}

#[test]
fn model_softdep_4k_debian_defaults() {
    run_model(ProtocolKind::named("softdep"), 4096, "", 10_000);
}

#[test]
fn model_sched_flag_4k_debian_defaults() {
    run_model(ProtocolKind::named("sched-flag"), 4096, "", 4_000);
}

#[test]
fn model_sched_chain_4k_debian_defaults() {
    run_model(ProtocolKind::named("sched-chain"), 4096, "", 4_000);
}
