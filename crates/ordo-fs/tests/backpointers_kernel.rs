//! `mode=backpointers` and the kernel's ext4 on one image: an image the
//! kernel wrote is mounted by ordo, which finds no owner table it can
//! trust, rebuilds every record and backlink from the tree, and reads
//! every file back exactly; the image ordo leaves is e2fsck-clean and the
//! kernel mounts it read-write; after the kernel changed files, ordo sees
//! the stale table (the superblock's mount stamp moved) and rebuilds it
//! again before trusting a record. Skipped unless running as root with
//! loop devices.

mod fast_commit_common;
mod kernel_xattr;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use fast_commit_common::*;
use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

fn contents(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u32 * 7 + u32::from(seed) * 13) as u8)
        .collect()
}

/// The value of the attribute the kernel sets.
const KERNEL_XATTR: [u8; 1500] = [0x5a; 1500];

fn mount_ordo(img: &Path) -> Fs {
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(img, 4096, OpenOptions::default()).unwrap());
    let opts = MountOptions {
        mode: ProtocolKind::named("backpointers"),
        ..MountOptions::default()
    };
    Fs::mount(dev, opts).unwrap()
}

/// Every regular file below the root as ordo reads it (`lost+found`
/// left out).
fn ordo_files(fs: &Fs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for (path, a) in ordo_walk(fs, false) {
        if a.kind == FileType::Regular {
            let data = fs.read(a.ino, 0, a.size as u32).unwrap();
            out.insert(path, data);
        }
    }
    out
}

fn assert_clean(img: &Path, what: &str) {
    let (code, out) = e2fsck_fn(img);
    assert_eq!(code, 0, "{what}: e2fsck -fn:\n{out}");
}

#[test]
fn kernel_images_get_their_owner_records_rebuilt_and_read_back_exactly() {
    if !can_loop_mount() {
        eprintln!("skipped: needs root, loop devices, mkfs.ext4 and e2fsck");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    run(Command::new("truncate").args(["-s", "64M"]).arg(&img));
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-O", "metadata_csum"])
        .arg(&img));
    let mut want = BTreeMap::new();
    {
        let m = kernel_mount(&img, "");
        let root = m.mountpoint();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        for (k, (name, len)) in [
            ("small", 100usize),
            ("a/one-block", 4096),
            ("a/b/big", 1 << 20),
            ("a/b/odd", 12_345),
        ]
        .into_iter()
        .enumerate()
        {
            let data = contents(k as u8, len);
            std::fs::write(root.join(name), &data).unwrap();
            want.insert(name.to_string(), data);
        }
        std::fs::hard_link(root.join("a/b/odd"), root.join("odd-link")).unwrap();
        want.insert("odd-link".into(), want["a/b/odd"].clone());
        // An attribute too large for the inode: the kernel's attribute
        // block, which carries no owner mark.
        kernel_xattr::set(&root.join("small"), "user.big", &KERNEL_XATTR);
    }
    // ordo: no table (or one it cannot trust) → records rebuilt.
    let fs = mount_ordo(&img);
    let small = fs.lookup_path("/small").unwrap().ino;
    assert_eq!(
        fs.getxattr(small, b"user.big").unwrap(),
        KERNEL_XATTR.to_vec(),
        "ordo reads the kernel's attribute block by its rebuilt record"
    );
    // ordo rewrites the block in place, with its owner mark.
    fs.setxattr(small, b"user.more", &[7u8; 600], 0, &Creds::root())
        .unwrap();
    assert!(
        stat(&fs, "nofs_records_rebuilt") >= (1 << 20) / 4096,
        "{:?}",
        fs.protocol_stats()
    );
    assert_eq!(ordo_files(&fs), want, "ordo reads the kernel's files");
    let odd = fs.lookup_path("/odd-link").unwrap();
    assert_eq!(odd.nlink, 2);
    let f = fs
        .create(
            ROOT_INO,
            b"from-ordo",
            FileType::Regular,
            0o644,
            0,
            &Creds::root(),
        )
        .unwrap();
    let mine = contents(9, 10_000);
    fs.write(f.ino, 0, &mine).unwrap();
    want.insert("from-ordo".into(), mine);
    assert_eq!(
        stat(&fs, "owner_mismatches") + stat(&fs, "crc_mismatches"),
        0
    );
    fs.unmount().unwrap();
    assert_clean(&img, "after ordo");

    // A second ordo mount trusts its own table: nothing rebuilt.
    let fs = mount_ordo(&img);
    assert_eq!(stat(&fs, "nofs_records_rebuilt"), 0);
    assert_eq!(ordo_files(&fs), want);
    fs.unmount().unwrap();

    // The kernel mounts it read-write and changes a file: ordo's records
    // of it are now stale, and the mount stamp says so.
    {
        let m = kernel_mount(&img, "");
        let root = m.mountpoint();
        for (name, data) in &want {
            assert_eq!(
                &std::fs::read(root.join(name)).unwrap(),
                data,
                "kernel reads {name}"
            );
        }
        assert_eq!(
            kernel_xattr::get(&root.join("small"), "user.big"),
            KERNEL_XATTR.to_vec()
        );
        assert_eq!(
            kernel_xattr::get(&root.join("small"), "user.more"),
            vec![7u8; 600]
        );
        let changed = contents(42, 3 * 4096 + 5);
        std::fs::write(root.join("a/one-block"), &changed).unwrap();
        want.insert("a/one-block".into(), changed);
    }
    let fs = mount_ordo(&img);
    assert!(
        stat(&fs, "nofs_records_rebuilt") > 0,
        "a stale table is rebuilt"
    );
    assert_eq!(ordo_files(&fs), want, "ordo reads the kernel's change");
    assert_eq!(
        stat(&fs, "owner_mismatches") + stat(&fs, "crc_mismatches"),
        0
    );
    fs.unmount().unwrap();
    assert_clean(&img, "after the second ordo mount");
}
