//! The reverse direction of the mkfs tests: the Linux kernel writes a tree
//! (small and large files, a sparse file past 4 GiB, fast and slow symlinks,
//! device nodes, FIFOs, hard links, a hashed directory, extended attributes)
//! into an `mkfs.ext4` image, and ordo-format's decoders must read every
//! inode and directory exactly as `stat` saw them, with every checksum valid
//! and every inode re-encoding byte-identically.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use ordo_format::dir;
use ordo_format::inode::{self, Inode};

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `stat` says about one path while the kernel has it mounted.
#[derive(Debug)]
struct Seen {
    ino: u64,
    mode: u32,
    nlink: u64,
    size: u64,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    blocks_512: u64,
    rdev: u64,
    link_target: Option<Vec<u8>>,
}

fn populate(mnt: &Path) {
    use std::os::unix::ffi::OsStrExt;
    std::fs::write(mnt.join("small"), b"hello, ext4").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(mnt.join("big"), &big).unwrap();
    let f = std::fs::File::create(mnt.join("sparse")).unwrap();
    f.set_len(5 << 30).unwrap();
    drop(f);
    std::os::unix::fs::symlink("small", mnt.join("fast-link")).unwrap();
    let long = "x".repeat(59);
    std::os::unix::fs::symlink(&long, mnt.join("fast-link-59")).unwrap();
    let longer = format!("/{}", "long-target/".repeat(20));
    std::os::unix::fs::symlink(&longer, mnt.join("slow-link")).unwrap();
    run(Command::new("mknod")
        .arg(mnt.join("null"))
        .args(["c", "1", "3"]));
    run(Command::new("mknod")
        .arg(mnt.join("bigdev"))
        .args(["b", "259", "74565"]));
    run(Command::new("mkfifo").arg(mnt.join("fifo")));
    std::fs::hard_link(mnt.join("small"), mnt.join("small-link")).unwrap();
    std::fs::create_dir(mnt.join("many")).unwrap();
    for i in 0..600 {
        std::fs::write(mnt.join(format!("many/entry-with-a-long-name-{i:04}")), b"").unwrap();
    }
    std::fs::create_dir_all(mnt.join("a/b/c")).unwrap();
    std::fs::write(mnt.join("a/b/c/deep"), b"deep").unwrap();
    // An extended attribute small enough to live in the inode.
    let path = std::ffi::CString::new(mnt.join("small").as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new("user.ordo").unwrap();
    let value = b"in-inode value";
    // SAFETY: valid NUL-terminated strings and a live buffer.
    let rc = unsafe {
        libc_setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr failed");
    // Attributes too large for the inode live in a block; two files with
    // the same ones share it.
    let value = vec![b'v'; 700];
    for f in ["a/b/c/deep", "big"] {
        let path = std::ffi::CString::new(mnt.join(f).as_os_str().as_bytes()).unwrap();
        for (n, v) in [
            ("user.block-resident", &value[..]),
            ("user.zz", &value[..200]),
            ("user.in", &b"1"[..]),
        ] {
            let name = std::ffi::CString::new(n).unwrap();
            // SAFETY: as above.
            let rc = unsafe {
                libc_setxattr(path.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0)
            };
            assert_eq!(rc, 0, "setxattr {n} on {f} failed");
        }
    }
}

extern "C" {
    #[link_name = "setxattr"]
    fn libc_setxattr(
        path: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
        value: *const std::ffi::c_void,
        size: usize,
        flags: i32,
    ) -> i32;
}

fn stat_tree(mnt: &Path) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(mnt.join(&rel)).unwrap() {
            let e = e.unwrap();
            let p = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(mnt.join(&p)).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.insert(
                p.clone(),
                Seen {
                    ino: m.ino(),
                    mode: m.mode(),
                    nlink: m.nlink(),
                    size: m.size(),
                    uid: m.uid(),
                    gid: m.gid(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    blocks_512: m.blocks(),
                    rdev: m.rdev(),
                    link_target: m.is_symlink().then(|| {
                        use std::os::unix::ffi::OsStrExt;
                        std::fs::read_link(mnt.join(&p))
                            .unwrap()
                            .as_os_str()
                            .as_bytes()
                            .to_vec()
                    }),
                },
            );
        }
    }
    out
}

/// Every (path, inode, file type) reachable from the root, skipping "." and "..".
fn walk(img: &Image) -> BTreeMap<PathBuf, (u32, u8)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(PathBuf::new(), inode::ROOT_INO)];
    while let Some((rel, ino)) = stack.pop() {
        for (name, child, ft) in img.list_dir(ino) {
            if name == "." || name == ".." {
                continue;
            }
            let p = rel.join(&name);
            if ft == dir::ft::DIR {
                stack.push((p.clone(), child));
            }
            out.insert(p, (child, ft));
        }
    }
    out
}

fn glibc_major_minor(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major as u32, minor as u32)
}

#[test]
fn kernel_written_tree_decodes_as_stat_sees_it() {
    assert!(
        is_root(),
        "this test loop-mounts an image with the kernel and must run as root"
    );
    let t = mkfs("kernel", "256M", &["-b", "4096"]);
    // A loop device of its own, never mount(8)'s `-o loop` (ordo_dev's
    // loopdev module says why).
    let m = ordo_dev::KernelMount::mount_temp(&t.path, "").unwrap_or_else(|e| panic!("{e}"));
    let mnt = m.mountpoint().to_path_buf();
    let populated = std::panic::catch_unwind(|| {
        populate(&mnt);
        stat_tree(&mnt)
    });
    m.unmount().unwrap_or_else(|e| panic!("{e}"));
    let seen = populated.expect("populating the mounted image");
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&t.path)
        .output()
        .unwrap();
    assert_eq!(fsck.status.code(), Some(0), "kernel left the image unclean");

    assert!(seen.len() > 600, "stat saw {} paths", seen.len());
    let img = Image::load(&t.path);
    let tree = walk(&img);
    let names: Vec<_> = seen.keys().collect();
    assert_eq!(tree.keys().collect::<Vec<_>>(), names, "same tree");
    let bs = img.sb.block_size();
    for (path, s) in &seen {
        let (ino, ft) = tree[path];
        assert_eq!(u64::from(ino), s.ino, "{path:?} inode number");
        let i: Inode = img.inode(ino);
        assert_eq!(u32::from(i.mode), s.mode, "{path:?} mode");
        assert_eq!(dir::file_type_from_mode(i.mode), ft, "{path:?} dirent type");
        assert_eq!(u64::from(i.links_count), s.nlink, "{path:?} links");
        assert_eq!(i.size, s.size, "{path:?} size");
        assert_eq!((i.uid, i.gid), (s.uid, s.gid), "{path:?} owner");
        assert_eq!(
            (i.mtime.sec, i64::from(i.mtime.nsec)),
            s.mtime,
            "{path:?} mtime"
        );
        assert_eq!(i.blocks_512(bs), s.blocks_512, "{path:?} i_blocks");
        if i.is_device() {
            assert_eq!(i.device(), glibc_major_minor(s.rdev), "{path:?} rdev");
        }
        if let Some(target) = &s.link_target {
            let got = if i.is_fast_symlink(bs) {
                i.fast_symlink_target(bs).unwrap().to_vec()
            } else {
                img.read_file(&i)
            };
            assert_eq!(&got, target, "{path:?} symlink target");
            assert_eq!(i.is_fast_symlink(bs), target.len() < 60, "{path:?} fast?");
        }
    }
    let (many, _) = tree[Path::new("many")];
    assert!(
        img.inode(many).has_flag(inode::flags::INDEX),
        "the kernel indexes a 600-entry directory"
    );
    let (small, _) = tree[Path::new("small")];
    let raw = img.inode(small);
    let xattr_area = &raw.raw()[128 + usize::from(raw.extra_isize)..];
    assert_eq!(
        &xattr_area[..4],
        &0xEA02_0000u32.to_le_bytes(),
        "in-inode xattr magic"
    );
    assert_eq!(img.read_file(&img.inode(small)), b"hello, ext4");
    // ordo-format's attribute codec reads what the kernel wrote, and lays
    // out the same entries with the same hashes.
    use ordo_format::xattr;
    let attrs = xattr::decode_ibody(raw.raw(), raw.extra_isize).unwrap();
    assert_eq!(attrs.len(), 1);
    assert_eq!(
        (attrs[0].index, &attrs[0].name[..]),
        (xattr::index::USER, &b"ordo"[..])
    );
    assert_eq!(attrs[0].value, b"in-inode value");
    let mut ibody = raw.raw().to_vec();
    xattr::encode_ibody(&mut ibody, raw.extra_isize, &attrs);
    let start = 128 + usize::from(raw.extra_isize);
    let used = 4 + xattr::space_needed(&attrs) - attrs[0].value_len();
    assert_eq!(
        &ibody[start..start + used],
        &raw.raw()[start..start + used],
        "in-inode entries as the kernel lays them out"
    );
    let (deep, _) = tree[Path::new("a/b/c/deep")];
    let (big, _) = tree[Path::new("big")];
    let blk = img.inode(deep).file_acl;
    assert_ne!(blk, 0, "a 700-byte value goes to a block");
    assert_eq!(
        img.inode(big).file_acl,
        blk,
        "the kernel shares identical attribute blocks"
    );
    let on_disk = img.block(blk).to_vec();
    let b = xattr::decode_block(&on_disk).unwrap();
    assert_eq!(b.refcount, 2);
    let names: Vec<&[u8]> = b.attrs.iter().map(|a| &a.name[..]).collect();
    assert_eq!(
        names,
        [&b"zz"[..], &b"block-resident"[..]],
        "sorted by name length, then name"
    );
    let ours = xattr::encode_block(img.bs(), 2, &b.attrs);
    assert_eq!(&ours[..12], &on_disk[..12]);
    assert_eq!(
        xattr::decode_block(&ours).unwrap().hash,
        b.hash,
        "h_hash as the kernel computes it"
    );
    for (i, a) in b.attrs.iter().enumerate() {
        let at = xattr::BLOCK_HEADER + b.attrs[..i].iter().map(|x| x.entry_len()).sum::<usize>();
        assert_eq!(
            u32::from_le_bytes(on_disk[at + 12..at + 16].try_into().unwrap()),
            xattr::entry_hash(&a.name, &a.value)
        );
    }
}
