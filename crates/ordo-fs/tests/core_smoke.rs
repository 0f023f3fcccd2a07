//! End-to-end smoke tests of the core on images made by `mkfs.ext4`:
//! every basic operation, unmount, `e2fsck -fn` clean, remount, same tree.

mod core_common;

use core_common::*;
use ordo_fs::{Creds, FileType, ProtocolKind, RenameFlags, ROOT_INO};

fn basic_ops(block_size: u32, features: &str, mode: ProtocolKind) {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 64, block_size, features);
    let fs = mount(&img, mode);
    let c = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"dir", 0o755, &c).unwrap();
    let f = fs
        .create(d.ino, b"file", FileType::Regular, 0o644, 0, &c)
        .unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(fs.write(f.ino, 0, &data).unwrap(), data.len() as u32);
    assert_eq!(fs.read(f.ino, 0, 200_000).unwrap(), data);
    assert_eq!(fs.lookup(d.ino, b"file").unwrap().size, 100_000);
    fs.rename(d.ino, b"file", ROOT_INO, b"moved", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(d.ino, b"file").unwrap_err().errno(), libc::ENOENT);
    let g = fs
        .create(ROOT_INO, b"gone", FileType::Regular, 0o600, 0, &c)
        .unwrap();
    fs.write(g.ino, 5000, b"xyz").unwrap();
    fs.unlink(ROOT_INO, b"gone").unwrap();
    fs.symlink(ROOT_INO, b"ln", b"moved", &c).unwrap();
    let names: Vec<Vec<u8>> = fs
        .readdir(ROOT_INO, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    for n in [&b"."[..], b"..", b"dir", b"moved", b"ln", b"lost+found"] {
        assert!(names.contains(&n.to_vec()), "missing {:?}", n);
    }
    assert!(!names.contains(&b"gone".to_vec()));
    fs.rmdir(ROOT_INO, b"dir").unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&img);

    let fs = mount(&img, mode);
    let m = fs.lookup(ROOT_INO, b"moved").unwrap();
    assert_eq!(fs.read(m.ino, 0, 200_000).unwrap(), data);
    let l = fs.lookup(ROOT_INO, b"ln").unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), b"moved");
    assert_eq!(
        fs.lookup(ROOT_INO, b"dir").unwrap_err().errno(),
        libc::ENOENT
    );
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}

#[test]
fn basic_ops_4k_no_journal_async() {
    basic_ops(4096, "^has_journal", ProtocolKind::Async);
}

#[test]
fn basic_ops_4k_debian_defaults_sync() {
    basic_ops(4096, "", ProtocolKind::Sync);
}

#[test]
fn basic_ops_1k_debian_defaults_async() {
    basic_ops(1024, "", ProtocolKind::Async);
}

#[test]
fn basic_ops_1k_sync() {
    basic_ops(1024, "^has_journal", ProtocolKind::Sync);
}
