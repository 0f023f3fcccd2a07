//! Helpers shared by the fsck corpus and the corrupt-walk tests: shell
//! commands, kernel-populated base images, and byte-level corruption.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ordo_dev::{FileDevice, OpenOptions};

/// errnos reading a damaged image may give (a walk, a read, a lookup).
pub const READ_ERRNOS: [i32; 11] = [
    libc::EUCLEAN,
    libc::EIO,
    libc::EINVAL,
    libc::ENOENT,
    libc::ENOTDIR,
    libc::EISDIR,
    libc::EFBIG,
    libc::ELOOP,
    libc::ENAMETOOLONG,
    libc::EOVERFLOW,
    libc::EOPNOTSUPP,
];

pub fn sh(cmd: &str) -> (i32, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("bash runs");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), s)
}

pub fn must(cmd: &str) -> String {
    let (rc, out) = sh(cmd);
    assert_eq!(rc, 0, "command failed: {cmd}\n{out}");
    out
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Populate a mounted file system with one of everything ordo reads.
pub fn populate(mnt: &Path) {
    let m = mnt.display();
    must(&format!(
        r#"set -e; cd {m}
mkdir -p a/b c d
echo hello > a/f1
head -c 300000 /dev/zero | tr '\0' 'q' > a/b/big
ln a/f1 c/hl
ln -s ../a/f1 c/sl
ln -s {long} c/longsl
mkfifo c/fifo
mknod c/dev c 1 3
touch empty
for i in $(seq 1 300); do touch d/entry_with_a_fairly_long_name_$i; done
head -c 524288 /dev/zero | tr '\0' 'z' > frag
# Block-mapped (non-extent) files cannot fallocate: tolerate that.
for i in $(seq 0 2 127); do fallocate -p -o $((i * 4096)) -l 4096 frag || true; done
fallocate -l 65536 c/prealloc || true
touch c/keepsize
fallocate -n -l 65536 c/keepsize || true
truncate -s 10M c/sparse
echo x | dd of=c/sparse bs=1k seek=5000 conv=notrunc status=none
"#,
        long = "l".repeat(100)
    ));
}

/// Unmounts on drop, so that a failed step does not leave a mount behind.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let (rc, out) = sh(&format!("umount {}", self.0.display()));
        if rc != 0 && !std::thread::panicking() {
            panic!("umount {} failed: {out}", self.0.display());
        }
    }
}

/// A kernel-populated image: `mkfs` makes it, the kernel fills it.
pub fn make_base(dir: &Path, name: &str, mkfs: impl FnOnce(&Path)) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    mkfs(&img);
    let mnt = dir.join(format!("{name}.mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    must(&format!(
        "mount -o loop {} {}",
        img.display(),
        mnt.display()
    ));
    let guard = Unmount(mnt.clone());
    populate(&mnt);
    drop(guard);
    img
}

pub fn e2fsck_clean(img: &Path) -> (bool, i32, String) {
    let (rc, out) = sh(&format!("e2fsck -fn {} 2>&1", img.display()));
    (rc == 0, rc, out)
}

pub fn open(img: &Path, writable: bool) -> FileDevice {
    open_bs(img, writable, 1024)
}

pub fn open_bs(img: &Path, writable: bool, block_size: u32) -> FileDevice {
    FileDevice::open(
        img,
        block_size,
        OpenOptions {
            read_only: !writable,
            direct: false,
            exclusive: false,
        },
    )
    .expect("open image")
}

pub fn debugfs(img: &Path, req: &str) -> String {
    sh(&format!("debugfs -w -R '{req}' {} 2>&1", img.display())).1
}

pub fn debugfs_ro(img: &Path, req: &str) -> String {
    sh(&format!("debugfs -R '{req}' {} 2>/dev/null", img.display())).1
}

pub fn inode_of(img: &Path, path: &str) -> u64 {
    let out = debugfs_ro(img, &format!("stat {path}"));
    let i = out.find("Inode: ").expect("stat prints Inode:") + 7;
    out[i..].split_whitespace().next().unwrap().parse().unwrap()
}

/// Block and byte offset of an inode, from debugfs `imap`.
pub fn inode_pos(img: &Path, path: &str) -> (u64, u64) {
    let out = debugfs_ro(img, &format!("imap {path}"));
    let b = out.find("located at block ").expect("imap output") + 17;
    let rest = &out[b..];
    let blk: u64 = rest.split(',').next().unwrap().trim().parse().unwrap();
    let o = rest.find("offset 0x").unwrap() + 9;
    let off = u64::from_str_radix(rest[o..].split_whitespace().next().unwrap(), 16).unwrap();
    (blk, off)
}

pub fn blocks_of(img: &Path, path: &str) -> Vec<u64> {
    debugfs_ro(img, &format!("blocks {path}"))
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

pub fn block_size(img: &Path) -> u64 {
    let out = sh(&format!("dumpe2fs -h {} 2>/dev/null", img.display())).1;
    let l = out.lines().find(|l| l.starts_with("Block size:")).unwrap();
    l.split_whitespace().last().unwrap().parse().unwrap()
}

/// First extent-tree block (ETB) of a file, from debugfs `stat`.
pub fn extent_tree_block(img: &Path, path: &str) -> Option<u64> {
    let out = debugfs_ro(img, &format!("stat {path}"));
    let i = out.find("(ETB0):")? + 7;
    out[i..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

pub fn patch(img: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

pub fn read_at(img: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

pub fn xor_byte(img: &Path, offset: u64, mask: u8) {
    let b = read_at(img, offset, 1)[0];
    patch(img, offset, &[b ^ mask]);
}

pub fn digest(img: &Path) -> Vec<u8> {
    std::fs::read(img).unwrap()
}

/// Metadata blocks worth flipping: superblock, GDT, bitmaps, inode-table
/// blocks holding used inodes, directory blocks, extent-tree blocks.
pub fn metadata_blocks(img: &Path) -> Vec<u64> {
    let bs = block_size(img);
    let mut v = vec![
        if bs == 1024 { 1 } else { 0 },
        if bs == 1024 { 2 } else { 1 },
    ];
    let dump = sh(&format!("dumpe2fs {} 2>/dev/null", img.display())).1;
    for l in dump.lines() {
        let l = l.trim();
        for key in ["Block bitmap at ", "Inode bitmap at "] {
            if let Some(r) = l.strip_prefix(key) {
                if let Some(n) = r.split_whitespace().next().and_then(|s| s.parse().ok()) {
                    v.push(n);
                }
            }
        }
        if let Some(r) = l.strip_prefix("Inode table at ") {
            if let Some(n) = r.split('-').next().and_then(|s| s.parse::<u64>().ok()) {
                // The first blocks hold the reserved and the first user inodes.
                v.extend(n..n + 4);
            }
        }
    }
    for p in ["/", "/a", "/c", "/d", "/a/b", "/lost+found"] {
        v.extend(blocks_of(img, p));
    }
    if let Some(b) = extent_tree_block(img, "/frag") {
        v.push(b);
    }
    v.sort();
    v.dedup();
    v
}

/// How far a walk of a possibly damaged tree may go, so that a cycle or a
/// huge file cannot make it endless.
pub struct WalkBounds {
    /// Entries seen (`.` and `..` not counted) before the walk stops.
    pub entries_max: usize,
    /// Directories below the start.
    pub depth_max: usize,
    /// Bytes read of each file.
    pub read_bytes_max: u64,
    /// Bytes per read request.
    pub read_chunk: u32,
}

/// What a walk reports: each name it resolved, each byte it read and each
/// error it met (`what` names the call). Counting entries is the walk's.
pub trait WalkVisitor {
    fn entry(&mut self, _parent: ordo_fs::Ino, _name: &[u8], _attr: &ordo_fs::Attr) {}
    fn read(&mut self, _bytes: usize) {}
    fn error(&mut self, what: &str, e: &ordo_fs::FsError);
}

/// Walk the tree under `dir` as a reader would (readdir in batches of 64,
/// lookup of each name, read of each file, readlink of each symlink,
/// getattr of the rest) within `bounds`. A readdir cookie that does not
/// advance fails the test: it would make any reader loop.
pub fn walk_tree(
    fs: &ordo_fs::Fs,
    label: &str,
    dir: ordo_fs::Ino,
    bounds: &WalkBounds,
    v: &mut impl WalkVisitor,
) -> usize {
    let mut seen = 0;
    walk_dir(fs, label, dir, 0, bounds, &mut seen, v);
    seen
}

fn walk_dir(
    fs: &ordo_fs::Fs,
    label: &str,
    dir: ordo_fs::Ino,
    depth: usize,
    bounds: &WalkBounds,
    seen: &mut usize,
    v: &mut impl WalkVisitor,
) {
    use ordo_fs::FileType;
    if depth > bounds.depth_max {
        return;
    }
    let mut offset = 0;
    while *seen < bounds.entries_max {
        let batch = match fs.readdir(dir, offset, 64) {
            Ok(b) if b.is_empty() => return,
            Ok(b) => b,
            Err(e) => return v.error(&format!("readdir({dir})"), &e),
        };
        for ent in batch {
            assert!(
                ent.next_offset != offset,
                "{label}: readdir({dir}) cookie did not advance"
            );
            offset = ent.next_offset;
            if ent.name == b"." || ent.name == b".." {
                continue;
            }
            *seen += 1;
            let attr = match fs.lookup(dir, &ent.name) {
                Ok(a) => a,
                Err(e) => {
                    v.error("lookup", &e);
                    continue;
                }
            };
            v.entry(dir, &ent.name, &attr);
            match attr.kind {
                FileType::Directory => walk_dir(fs, label, attr.ino, depth + 1, bounds, seen, v),
                FileType::Regular => {
                    let mut pos = 0;
                    while pos < attr.size.min(bounds.read_bytes_max) {
                        match fs.read(attr.ino, pos, bounds.read_chunk) {
                            Ok(d) if d.is_empty() => break,
                            Ok(d) => {
                                v.read(d.len());
                                pos += d.len() as u64;
                            }
                            Err(e) => {
                                v.error("read", &e);
                                break;
                            }
                        }
                    }
                }
                FileType::Symlink => {
                    if let Err(e) = fs.readlink(attr.ino) {
                        v.error("readlink", &e);
                    }
                }
                _ => {
                    if let Err(e) = fs.getattr(attr.ino) {
                        v.error("getattr", &e);
                    }
                }
            }
            if *seen >= bounds.entries_max {
                return;
            }
        }
    }
}
