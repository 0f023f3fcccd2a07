//! The reverse direction: the Linux kernel writes a tree (files, symlinks,
//! hard links, device nodes, a sparse file, a directory of 2000 entries
//! that the kernel indexes as an htree), ordo reads it identically, then
//! ordo changes it (the htree directory included) and `e2fsck -fn` finds
//! the result clean and the kernel reads ordo's changes back.

mod core_common;
mod kernel_xattr;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use core_common::*;
use ordo_fs::{Creds, FileType, Fs, Ino, ProtocolKind, RenameFlags, ROOT_INO};

fn content(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u32 * 31 + i) as u8).collect()
}

/// Build a tree with the kernel.
fn kernel_writes(img: &Path) {
    let m = kernel_mount(img, "rw");
    let root = m.mountpoint();
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/small"), b"hello").unwrap();
    std::fs::write(root.join("a/b/big"), content(1, 3 << 20)).unwrap();
    std::os::unix::fs::symlink("small", root.join("a/fast")).unwrap();
    std::os::unix::fs::symlink("x".repeat(300), root.join("a/slow")).unwrap();
    std::fs::hard_link(root.join("a/small"), root.join("a/b/c/hard")).unwrap();
    let f = std::fs::File::create(root.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(b"middle", 10 << 20).unwrap();
    f.set_len(40 << 20).unwrap();
    drop(f);
    std::fs::create_dir(root.join("big")).unwrap();
    for i in 0..2000 {
        std::fs::write(root.join(format!("big/entry-{i:05}")), format!("{i}")).unwrap();
    }
    let st = Command::new("mknod")
        .arg(root.join("dev"))
        .args(["c", "4", "64"])
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(st.success());
    // Extended attributes: one in the inode, one large enough to need a
    // block, and one block shared by two files (the kernel shares
    // identical attribute blocks).
    kernel_xattr::set(&root.join("a/small"), "user.small", b"tiny");
    for name in ["xbig", "xbig2", "xbig3"] {
        std::fs::write(root.join(name), name).unwrap();
        kernel_xattr::set(&root.join(name), "user.big", &[b'v'; 700]);
    }
    std::fs::set_permissions(
        root.join("a/small"),
        std::os::unix::fs::PermissionsExt::from_mode(0o4751),
    )
    .unwrap();
}

/// Everything under `path` as the kernel sees it: path -> (ino, mode,
/// nlink, size, contents or target).
fn kernel_view(root: &Path) -> BTreeMap<String, (u64, u32, u64, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(root.to_path_buf(), String::new())];
    while let Some((p, rel)) = todo.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let data = if md.is_file() {
            std::fs::read(&p).unwrap()
        } else if md.file_type().is_symlink() {
            std::fs::read_link(&p)
                .unwrap()
                .as_os_str()
                .as_encoded_bytes()
                .to_vec()
        } else {
            Vec::new()
        };
        let size = if md.is_dir() { 0 } else { md.size() };
        out.insert(rel.clone(), (md.ino(), md.mode(), md.nlink(), size, data));
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                todo.push((e.path(), format!("{rel}/{name}")));
            }
        }
    }
    out
}

fn readdir_all(fs: &Fs, dir: Ino) -> Vec<ordo_fs::DirEntry> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let page = fs.readdir(dir, cookie, 100).unwrap();
        if page.is_empty() {
            return out;
        }
        cookie = page.last().unwrap().next_offset;
        out.extend(page);
    }
}

fn ordo_view(fs: &Fs) -> BTreeMap<String, (u64, u32, u64, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((ino, rel)) = todo.pop() {
        let a = fs.getattr(ino).unwrap();
        let data = match a.kind {
            FileType::Regular => fs.read(ino, 0, a.size as u32).unwrap(),
            FileType::Symlink => fs.readlink(ino).unwrap(),
            _ => Vec::new(),
        };
        let size = if a.kind == FileType::Directory {
            0
        } else {
            a.size
        };
        let mode = a.kind.mode_bits() as u32 | a.perm as u32;
        out.insert(rel.clone(), (ino as u64, mode, a.nlink as u64, size, data));
        if a.kind == FileType::Directory {
            for e in readdir_all(fs, ino) {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                todo.push((e.ino, format!("{rel}/{}", String::from_utf8_lossy(&e.name))));
            }
        }
    }
    out
}

fn compare(
    a: &BTreeMap<String, (u64, u32, u64, u64, Vec<u8>)>,
    b: &BTreeMap<String, (u64, u32, u64, u64, Vec<u8>)>,
) {
    let ka: Vec<&String> = a.keys().collect();
    let kb: Vec<&String> = b.keys().collect();
    assert_eq!(ka, kb, "the trees have different names");
    for (k, va) in a {
        let vb = &b[k];
        assert_eq!(
            (va.0, va.1, va.2, va.3),
            (vb.0, vb.1, vb.2, vb.3),
            "ino/mode/nlink/size of {k}"
        );
        assert!(va.4 == vb.4, "contents of {k} differ");
    }
}

fn kernel_tree_then_ordo(block_size: u32, mode: ProtocolKind) {
    if !have("mkfs.ext4") || !have("e2fsck") || !can_mount() {
        eprintln!("skipped: needs e2fsprogs, root and loop devices");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 128, block_size, "");
    kernel_writes(&img);
    let want = {
        let m = kernel_mount(&img, "ro");
        kernel_view(m.mountpoint())
    };
    // The kernel indexed the big directory.
    let fs = mount(&img, mode);
    let big = fs.lookup(ROOT_INO, b"big").unwrap();
    assert_ne!(
        big.flags & 0x1000,
        0,
        "the kernel should have made an htree"
    );
    compare(&want, &ordo_view(&fs));
    assert_eq!(
        fs.lookup(big.ino, b"entry-01234").unwrap().size,
        4,
        "lookup in the htree directory"
    );
    let dev = fs.lookup(ROOT_INO, b"dev").unwrap();
    assert_eq!((dev.rdev >> 8) & 0xfff, 4);
    assert_eq!(dev.rdev & 0xff, 64);

    // ordo changes the tree, the htree directory included.
    let c = Creds::root();
    for i in 0..300 {
        fs.unlink(big.ino, format!("entry-{i:05}").as_bytes())
            .unwrap();
    }
    for i in 0..100 {
        let a = fs
            .create(
                big.ino,
                format!("new-{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &c,
            )
            .unwrap();
        fs.write(a.ino, 0, format!("n{i}").as_bytes()).unwrap();
    }
    assert_eq!(
        fs.getattr(big.ino).unwrap().flags & 0x1000,
        0,
        "index flag cleared"
    );
    let a = fs.lookup(ROOT_INO, b"a").unwrap();
    fs.rename(
        a.ino,
        b"small",
        big.ino,
        b"moved-small",
        RenameFlags::default(),
    )
    .unwrap();
    let sparse = fs.lookup(ROOT_INO, b"sparse").unwrap();
    fs.write(sparse.ino, 20 << 20, b"ordo was here").unwrap();
    let b = fs.lookup(a.ino, b"b").unwrap();
    let bigf = fs.lookup(b.ino, b"big").unwrap();
    fs.setattr(
        bigf.ino,
        &ordo_fs::SetAttr {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    fs.mkdir(big.ino, b"subdir", 0o700, &c).unwrap();
    // Release files holding attribute blocks (one shared block loses a
    // reference, then its last).
    fs.unlink(ROOT_INO, b"xbig").unwrap();
    fs.unlink(ROOT_INO, b"xbig2").unwrap();
    let x3 = fs.lookup(ROOT_INO, b"xbig3").unwrap();
    fs.write(x3.ino, 100, b"more").unwrap();
    let expect = ordo_view(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let got = {
        let m = kernel_mount(&img, "ro");
        kernel_view(m.mountpoint())
    };
    compare(&expect, &got);
    assert_eq!(got["/big/moved-small"].4, b"hello");
    {
        let m = kernel_mount(&img, "ro");
        assert_eq!(
            kernel_xattr::get(&m.mountpoint().join("big/moved-small"), "user.small"),
            b"tiny"
        );
        assert_eq!(
            kernel_xattr::get(&m.mountpoint().join("xbig3"), "user.big"),
            vec![b'v'; 700]
        );
    }
    assert_eq!(got["/big/new-42"].4, b"n42");
    assert!(!got.contains_key("/big/entry-00100"));
    assert!(got.contains_key("/big/entry-01999"));
}

#[test]
fn kernel_tree_4k_async() {
    kernel_tree_then_ordo(4096, ProtocolKind::named("async"));
}

#[test]
fn kernel_tree_1k_sync() {
    kernel_tree_then_ordo(1024, ProtocolKind::named("sync"));
}

#[test]
fn kernel_tree_4k_softdep() {
    kernel_tree_then_ordo(4096, ProtocolKind::named("softdep"));
}

#[test]
fn kernel_tree_4k_sched_flag() {
    kernel_tree_then_ordo(4096, ProtocolKind::named("sched-flag"));
}

#[test]
fn kernel_tree_4k_sched_chain() {
    kernel_tree_then_ordo(4096, ProtocolKind::named("sched-chain"));
}
