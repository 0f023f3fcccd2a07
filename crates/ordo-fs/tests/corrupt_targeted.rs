//! Targeted corruptions with a precise expectation each, beyond the
//! "an error, not a panic" rule of `corrupt_walk.rs`: the error must be the
//! one ext4 gives and name the structure that is damaged.
//!
//! - an inode whose checksum is wrong fails to load, also once a neighbour
//!   in the same inode-table block has been changed (the block is dirty,
//!   so its bytes no longer are the disk's);
//! - a damaged htree root or a bad `dx_tail` checksum is reported as the
//!   htree root, not as the directory's extent block;
//! - `..` entries that form a cycle make rename's ancestor walk fail
//!   (EUCLEAN naming the `..` entry) instead of looping or succeeding;
//! - a block or inode bitmap that fails its checksum fails the allocation
//!   that reads it.

mod fsck_common;

use std::path::Path;
use std::sync::Arc;

use fsck_common::*;
use ordo_dev::BlockDevice;
use ordo_fs::{Fs, FsError, Ino, MountOptions, RenameFlags, SetAttr, TimeSet, Timespec, ROOT_INO};

fn mount(img: &Path, read_only: bool) -> Fs {
    let bs = block_size(img) as u32;
    let dev: Arc<dyn BlockDevice> = Arc::new(open_bs(img, !read_only, bs));
    let opts = MountOptions {
        read_only,
        ..MountOptions::default()
    };
    Fs::mount(dev, opts).expect("mount")
}

/// Physical block of logical block `lblk` of `path`, from debugfs `bmap`.
fn logical_block(img: &Path, path: &str, lblk: u64) -> u64 {
    let out = debugfs_ro(img, &format!("bmap {path} {lblk}"));
    out.trim().parse().expect("bmap prints a block number")
}

fn walk_path(fs: &Fs, path: &str) -> Ino {
    fs.lookup_path(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .ino
}

/// `r` must be a corruption error (EUCLEAN) whose text has every one of `words`.
fn assert_corrupt<T: std::fmt::Debug>(what: &str, r: Result<T, FsError>, words: &[&str]) {
    let e = match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}) on a corrupted image"),
        Err(e) => e,
    };
    assert_eq!(e.errno(), libc::EUCLEAN, "{what}: {e}");
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "{what}: {text:?} does not name {w:?}");
    }
}

fn base(dir: &Path, name: &str, features: &str) -> std::path::PathBuf {
    make_base(dir, name, |img| {
        must(&format!(
            "mkfs.ext4 -q -F -b 1024 -O {features} {} 8M",
            img.display()
        ));
    })
}

fn copy(base: &Path, name: &str) -> std::path::PathBuf {
    let img = base.with_file_name(name);
    std::fs::copy(base, &img).unwrap();
    img
}

#[test]
fn bad_inode_checksum_fails_even_in_a_dirty_block() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let base = base(dir.path(), "csum", "^has_journal,^resize_inode");
    let img = copy(&base, "ino.img");
    let ino = inode_of(&img, "/a/f1") as Ino;
    let (b, off) = inode_pos(&img, "/a/f1");
    let bs = block_size(&img);
    xor_byte(&img, b * bs + off + 0x08, 0x40);
    let want = format!("inode {ino} checksum");

    let fs = mount(&img, true);
    let a = walk_path(&fs, "/a");
    assert_corrupt("read-only lookup", fs.lookup(a, b"f1"), &[&want, "block"]);
    fs.unmount().unwrap();

    // Read-write: change a neighbour sharing the inode-table block first.
    let fs = mount(&img, false);
    let per_block = (bs / 256) as Ino;
    let first = (ino - 1) / per_block * per_block + 1;
    let neighbour = (first..first + per_block)
        .filter(|&n| n != ino)
        .find(|&n| fs.getattr(n).is_ok())
        .expect("an in-use neighbour in the same inode-table block");
    let set = SetAttr {
        atime: Some(TimeSet::At(Timespec {
            sec: 12345,
            nsec: 0,
        })),
        ..SetAttr::default()
    };
    fs.setattr(neighbour, &set).unwrap();
    assert_corrupt(
        "lookup after a neighbour changed",
        fs.lookup(a, b"f1"),
        &[&want],
    );
    assert_corrupt(
        "getattr after a neighbour changed",
        fs.getattr(ino),
        &[&want],
    );
    fs.unmount().unwrap();
}

#[test]
fn damaged_htree_root_is_named_as_such() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    for (name, features) in [
        ("csum", "^has_journal,^resize_inode"),
        ("nocsum", "^has_journal,^resize_inode,^metadata_csum"),
    ] {
        let base = base(dir.path(), name, features);
        let bs = block_size(&base);

        // indirect_levels 7: more than any ext4 allows.
        let img = copy(&base, "levels.img");
        let root = logical_block(&img, "/d", 0);
        patch(&img, root * bs + 0x1E, &[7]);
        let fs = mount(&img, true);
        let d = walk_path(&fs, "/d");
        assert_corrupt(
            &format!("{name}: levels huge"),
            fs.lookup(d, b"entry_with_a_fairly_long_name_7"),
            &["htree root", "indirect_levels", &format!("block {root}")],
        );
        fs.unmount().unwrap();

        // count 0: an index without entries.
        let img = copy(&base, "count.img");
        patch(&img, root * bs + 0x22, &[0, 0]);
        let fs = mount(&img, true);
        let d = walk_path(&fs, "/d");
        assert_corrupt(
            &format!("{name}: count zero"),
            fs.readdir(d, 0, 16),
            &["htree root", "dx count"],
        );
        fs.unmount().unwrap();
    }

    // A flipped hash: only the dx_tail checksum can tell.
    let base = dir.path().join("csum.img");
    let img = copy(&base, "hash.img");
    let root = logical_block(&img, "/d", 0);
    xor_byte(&img, root * block_size(&img) + 0x28, 0x01);
    let fs = mount(&img, true);
    let d = walk_path(&fs, "/d");
    assert_corrupt(
        "csum: hash flipped",
        fs.lookup(d, b"entry_with_a_fairly_long_name_7"),
        &["htree root", "dt_checksum"],
    );
    fs.unmount().unwrap();
}

#[test]
fn dotdot_cycles_make_rename_fail_not_loop() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let base = base(
        dir.path(),
        "nocsum",
        "^has_journal,^resize_inode,^metadata_csum",
    );
    let bs = block_size(&base);
    // The inode field of `..` is at byte 12 of a directory's first block.
    let set_dotdot = |img: &Path, path: &str, target: &str| {
        let b = logical_block(img, path, 0);
        let ino = inode_of(img, target) as u32;
        patch(img, b * bs + 12, &ino.to_le_bytes());
    };
    for (label, cycle) in [
        ("`..` names itself", vec![("/a/b", "/a/b")]),
        ("`..` two-cycle", vec![("/a/b", "/a"), ("/a", "/a/b")]),
    ] {
        let img = copy(&base, "cycle.img");
        for (path, target) in cycle {
            set_dotdot(&img, path, target);
        }
        let fs = mount(&img, false);
        let b = walk_path(&fs, "/a/b");
        // Moving /c under /a/b walks up from /a/b, looking for /c.
        assert_corrupt(
            label,
            fs.rename(ROOT_INO, b"c", b, b"c", RenameFlags::default()),
            &["\"..\"", "loops"],
        );
        assert!(fs.lookup(ROOT_INO, b"c").is_ok(), "{label}: /c moved");
        fs.unmount().unwrap();
    }
}

#[test]
fn bad_bitmap_checksum_fails_the_allocation() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let base = base(dir.path(), "csum", "^has_journal,^resize_inode");
    let bs = block_size(&base);
    // One group (8 MiB of 1 KiB blocks): every allocation reads its bitmaps.
    let bitmap_of = |img: &Path, field: &str| -> u64 {
        let out = sh(&format!("dumpe2fs {} 2>/dev/null", img.display())).1;
        let at = out.find(field).expect("dumpe2fs names the bitmap") + field.len();
        out[at..]
            .trim_start_matches([' ', ':'])
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    for (label, field, words) in [
        ("block", "Block bitmap at ", "block bitmap checksum"),
        ("inode", "Inode bitmap at ", "inode bitmap checksum"),
    ] {
        let img = copy(&base, "bitmap.img");
        let b = bitmap_of(&img, field);
        // Flip a bit of a used entry near the start: covered by the checksum.
        xor_byte(&img, b * bs, 0x01);
        let fs = mount(&img, false);
        let created = fs.create(
            ROOT_INO,
            b"new",
            ordo_fs::FileType::Regular,
            0o644,
            0,
            &ordo_fs::Creds::root(),
        );
        let r = created.and_then(|a| fs.write(a.ino, 0, &[1u8; 4096]));
        assert_corrupt(label, r, &[words, &format!("block {b}")]);
        drop(fs);
    }
}
