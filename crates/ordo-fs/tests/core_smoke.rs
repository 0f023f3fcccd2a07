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
    basic_ops_on(&img, mode);
}

/// The operations of [`basic_ops`] on an image already made.
fn basic_ops_on(img: &std::path::Path, mode: ProtocolKind) {
    let fs = mount(img, mode);
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
    assert_fsck_clean(img);

    let fs = mount(img, mode);
    let m = fs.lookup(ROOT_INO, b"moved").unwrap();
    assert_eq!(fs.read(m.ino, 0, 200_000).unwrap(), data);
    let l = fs.lookup(ROOT_INO, b"ln").unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), b"moved");
    assert_eq!(
        fs.lookup(ROOT_INO, b"dir").unwrap_err().errno(),
        libc::ENOENT
    );
    fs.unmount().unwrap();
    assert_fsck_clean(img);
}

/// Inodes of 128 bytes (no checksum-high field, no extra time fields)
/// and of 1,024 (larger than the core's stack copy for checksums): what
/// the core writes, `e2fsck -fn` finds clean, and the core reads back with
/// every inode checksum verified.
#[test]
fn basic_ops_small_and_large_inodes() {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    for size in ["128", "1024"] {
        for mode in ["async", "journal"] {
            let (_dir, img) = scratch();
            mkfs_with(&img, 64, 4096, "", &["-I", size]);
            basic_ops_on(&img, ProtocolKind::named(mode));
        }
    }
}

#[test]
fn basic_ops_4k_no_journal_async() {
    basic_ops(4096, "^has_journal", ProtocolKind::named("async"));
}

#[test]
fn basic_ops_4k_debian_defaults_sync() {
    basic_ops(4096, "", ProtocolKind::named("sync"));
}

#[test]
fn basic_ops_1k_debian_defaults_async() {
    basic_ops(1024, "", ProtocolKind::named("async"));
}

#[test]
fn basic_ops_4k_debian_defaults_softdep() {
    basic_ops(4096, "", ProtocolKind::named("softdep"));
}

#[test]
fn basic_ops_4k_debian_defaults_sched_flag() {
    let variants: Vec<ProtocolKind> = ProtocolKind::named("sched-flag").variants().collect();
    assert_eq!(variants.len(), 8);
    for v in variants {
        basic_ops(4096, "", v);
    }
}

#[test]
fn basic_ops_4k_debian_defaults_sched_chain() {
    let variants: Vec<ProtocolKind> = ProtocolKind::named("sched-chain").variants().collect();
    assert_eq!(variants.len(), 4);
    for v in variants {
        basic_ops(4096, "", v);
    }
}

#[test]
fn basic_ops_1k_softdep() {
    basic_ops(1024, "^has_journal", ProtocolKind::named("softdep"));
}

#[test]
fn basic_ops_1k_sync() {
    basic_ops(1024, "^has_journal", ProtocolKind::named("sync"));
}

#[test]
fn paths_access_statfs_and_attributes() {
    if !have("mkfs.ext4") {
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 32, 4096, "^has_journal");
    let fs = mount(&img, ProtocolKind::named("async"));
    let root = Creds::root();
    let user = Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![50],
        umask: 0,
    };
    let a = fs.mkdir(ROOT_INO, b"a", 0o2775, &root).unwrap();
    fs.setattr(
        a.ino,
        &ordo_fs::SetAttr {
            gid: Some(50),
            ..Default::default()
        },
    )
    .unwrap();
    // setgid directory: group and S_ISGID inherited by a subdirectory.
    let b = fs.mkdir(a.ino, b"b", 0o755, &user).unwrap();
    assert_eq!(b.gid, 50);
    assert_eq!(b.perm & 0o2000, 0o2000);
    let f = fs
        .create(b.ino, b"f", FileType::Regular, 0o640, 0, &user)
        .unwrap();
    assert_eq!((f.uid, f.gid), (1000, 50));
    fs.symlink(ROOT_INO, b"l", b"a/b", &root).unwrap();
    assert_eq!(fs.lookup_path("/l/f").unwrap().ino, f.ino);
    assert_eq!(fs.lookup_path("/l").unwrap().kind, FileType::Symlink);
    assert_eq!(fs.lookup_path("/a/b/../b/f").unwrap().ino, f.ino);
    assert_eq!(
        fs.lookup_path("/a/b/f/x").unwrap_err().errno(),
        libc::ENOTDIR
    );
    // access: owner bits for the owner, group bits via supplementary groups.
    fs.access(f.ino, 4 | 2, &user).unwrap();
    let other = Creds {
        uid: 2000,
        gid: 2000,
        groups: vec![50],
        umask: 0,
    };
    fs.access(f.ino, 4, &other).unwrap();
    assert_eq!(
        fs.access(f.ino, 2, &other).unwrap_err().errno(),
        libc::EACCES
    );
    assert_eq!(
        fs.access(f.ino, 1, &root).unwrap_err().errno(),
        libc::EACCES
    );
    fs.access(f.ino, 4 | 2, &root).unwrap();
    // chmod by a caller outside the group drops S_ISGID; chown drops suid.
    let g = fs
        .setattr_as(
            f.ino,
            &ordo_fs::SetAttr {
                perm: Some(0o2755),
                ..Default::default()
            },
            &Creds {
                uid: 1000,
                gid: 1000,
                groups: vec![],
                umask: 0,
            },
        )
        .unwrap();
    assert_eq!(g.perm, 0o755);
    fs.setattr(
        f.ino,
        &ordo_fs::SetAttr {
            perm: Some(0o6755),
            ..Default::default()
        },
    )
    .unwrap();
    let g = fs
        .setattr(
            f.ino,
            &ordo_fs::SetAttr {
                uid: Some(7),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        g.perm, 0o755,
        "chown clears suid and (group-executable) sgid"
    );
    // Device numbers, both encodings.
    for (name, rdev) in [
        (&b"old"[..], (8u32 << 8) | 1),
        (b"new", (300 << 8) | 0x200005),
    ] {
        let d = fs
            .create(ROOT_INO, name, FileType::BlockDevice, 0o600, rdev, &root)
            .unwrap();
        assert_eq!(fs.getattr(d.ino).unwrap().rdev, rdev);
    }
    // statfs follows allocation.
    let s0 = fs.statfs().unwrap();
    fs.write(f.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    let s1 = fs.statfs().unwrap();
    assert_eq!(s0.blocks_free - s1.blocks_free, 256);
    assert_eq!(s0.files_free, s1.files_free);
    assert!(s1.blocks <= 32 * 256 && s1.blocks > 7000);
    // Punch and SEEK_HOLE / SEEK_DATA.
    fs.fallocate(
        f.ino,
        4096,
        8192,
        ordo_fs::FallocFlags {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
            collapse_range: false,
            insert_range: false,
        },
    )
    .unwrap();
    assert_eq!(fs.read(f.ino, 4096, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(fs.seek(f.ino, 0, ordo_fs::SeekWhence::Hole).unwrap(), 4096);
    assert_eq!(
        fs.seek(f.ino, 4096, ordo_fs::SeekWhence::Data).unwrap(),
        12288
    );
    assert_eq!(fs.statfs().unwrap().blocks_free, s1.blocks_free + 2);
    // Hard links to directories are refused, EMLINK-free otherwise.
    assert_eq!(
        fs.link(a.ino, ROOT_INO, b"x").unwrap_err().errno(),
        libc::EPERM
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"a", b.ino, b"loop", RenameFlags::default())
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}

/// A new name takes the first record in the directory with room for it, as
/// a walk of the blocks in order finds it: the place a removed name left in
/// the middle of a block, else the slack after the last name. The index's
/// record of each block's room lets a create skip the walk only where the
/// last entry is the one candidate; a wrong shortcut puts names elsewhere.
#[test]
fn names_take_the_first_record_with_room() {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 64, 4096, "");
    let fs = mount(&img, ProtocolKind::named("async"));
    let c = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &c).unwrap();
    // 300 names of 20 bytes (28-byte records): three blocks.
    let name = |k: usize| format!("name-{k:015}").into_bytes();
    for k in 0..300 {
        fs.create(d.ino, &name(k), FileType::Regular, 0o644, 0, &c)
            .unwrap();
    }
    let order = |fs: &ordo_fs::Fs| -> Vec<String> {
        fs.readdir(d.ino, 0, 1000)
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .filter(|n| n != "." && n != "..")
            .collect()
    };
    let text = |n: Vec<u8>| String::from_utf8(n).unwrap();
    let mut want = order(&fs);
    assert_eq!(want, (0..300).map(name).map(text).collect::<Vec<_>>());
    // Three names leave records in the middle of the full first and second
    // blocks (145 records each) and of the third, which has room at its end
    // too.
    for k in [50, 250, 295] {
        fs.unlink(d.ino, &name(k)).unwrap();
    }
    for (k, new) in [(50, b"x"), (250, b"y"), (295, b"z")] {
        let n = format!("{}{:019}", new[0] as char, 0).into_bytes();
        fs.create(d.ino, &n, FileType::Regular, 0o644, 0, &c)
            .unwrap();
        want[k] = text(n);
    }
    // No record in the middle has room left: the next names go after the
    // last one.
    for k in 300..310 {
        fs.create(d.ino, &name(k), FileType::Regular, 0o644, 0, &c)
            .unwrap();
        want.push(text(name(k)));
    }
    assert_eq!(order(&fs), want);
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let fs = mount(&img, ProtocolKind::named("async"));
    assert_eq!(order(&fs), want, "after a remount");
    fs.unmount().unwrap();
}

#[test]
fn basic_ops_2k_sync() {
    basic_ops(2048, "", ProtocolKind::named("sync"));
}

#[test]
fn threads_share_one_mount() {
    if !have("mkfs.ext4") || !have("e2fsck") {
        return;
    }
    for mode in [ProtocolKind::named("async"), ProtocolKind::named("sync")] {
        let (_dir, img) = scratch();
        mkfs(&img, 64, 4096, "^has_journal");
        let fs = std::sync::Arc::new(mount(&img, mode));
        let handles: Vec<_> = (0..4u8)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let c = Creds::root();
                    let d = fs
                        .mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o755, &c)
                        .unwrap();
                    for i in 0..50u32 {
                        let f = fs
                            .create(
                                d.ino,
                                format!("f{i}").as_bytes(),
                                FileType::Regular,
                                0o644,
                                0,
                                &c,
                            )
                            .unwrap();
                        fs.write(f.ino, 0, &vec![t; 5000 + i as usize]).unwrap();
                        if i % 10 == 0 {
                            fs.fsync(f.ino, false).unwrap();
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        for t in 0..4u8 {
            let d = fs.lookup(ROOT_INO, format!("t{t}").as_bytes()).unwrap();
            for i in 0..50u32 {
                let f = fs.lookup(d.ino, format!("f{i}").as_bytes()).unwrap();
                assert_eq!(
                    fs.read(f.ino, 0, 10_000).unwrap(),
                    vec![t; 5000 + i as usize]
                );
            }
        }
        let fs = std::sync::Arc::try_unwrap(fs).ok().unwrap();
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}

#[test]
fn background_write_back_cleans_the_cache() {
    if !have("mkfs.ext4") || !have("e2fsck") {
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 32, 4096, "^has_journal");
    let fs = ordo_fs::Fs::mount(
        device(&img),
        ordo_fs::MountOptions {
            background: true,
            commit_interval_ms: 20,
            ..Default::default()
        },
    )
    .unwrap();
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o644, 0, &Creds::root())
        .unwrap();
    fs.write(f.ino, 0, b"written by the timer").unwrap();
    assert!(fs.cache_stats().dirty_blocks > 0);
    // Wait (bounded) for the commit timer; no assertion on how long it took.
    let mut cleaned = false;
    for _ in 0..2000 {
        if fs.cache_stats().dirty_blocks == 0 {
            cleaned = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(cleaned, "the background write-back never ran");
    assert!(fs.counters().total().writes > 0);
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}

/// fallocate COLLAPSE_RANGE and INSERT_RANGE on a file of 400 extents (a
/// tree of depth 2 in 1 KiB blocks): the data moves, the sizes and block
/// counts follow, the errors are ext4's, and the image stays clean through
/// a remount.
fn collapse_and_insert(mode: ProtocolKind, features: &str) {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    use ordo_fs::FallocFlags;
    let (_dir, img) = scratch();
    mkfs(&img, 64, 1024, features);
    let fs = mount(&img, mode);
    let c = Creds::root();
    let bs = 1024usize;
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o644, 0, &c)
        .unwrap();
    // Every other block written: 400 extents.
    let mut model = vec![0u8; 799 * bs];
    for i in (0..800).step_by(2) {
        let data: Vec<u8> = (0..bs).map(|j| ((i * 7 + j) % 251) as u8 + 1).collect();
        fs.write(f.ino, (i * bs) as u64, &data).unwrap();
        model[i * bs..(i + 1) * bs].copy_from_slice(&data);
    }
    let collapse = FallocFlags {
        collapse_range: true,
        ..FallocFlags::default()
    };
    let insert = FallocFlags {
        insert_range: true,
        ..FallocFlags::default()
    };
    let check = |fs: &ordo_fs::Fs, model: &[u8], what: &str| {
        let a = fs.getattr(f.ino).unwrap();
        assert_eq!(a.size, model.len() as u64, "{what}: size");
        let got = fs.read(f.ino, 0, model.len() as u32 + 10).unwrap();
        assert!(got == model, "{what}: contents");
        let data_blocks = model
            .chunks(bs)
            .filter(|b| b.iter().any(|&x| x != 0))
            .count() as u64;
        // Sectors of data blocks plus the tree's blocks.
        assert!(a.blocks >= data_blocks * 2, "{what}: {} sectors", a.blocks);
        assert!(
            a.blocks <= data_blocks * 2 + 2 * 16,
            "{what}: {} sectors",
            a.blocks
        );
    };
    check(&fs, &model, "written");
    let errno = |r: ordo_fs::Result<()>| r.unwrap_err().errno();
    // ext4's errors.
    assert_eq!(
        errno(fs.fallocate(f.ino, 100, 1024, collapse)),
        libc::EINVAL
    );
    assert_eq!(errno(fs.fallocate(f.ino, 1024, 1000, insert)), libc::EINVAL);
    assert_eq!(errno(fs.fallocate(f.ino, 0, 0, insert)), libc::EINVAL);
    let size = model.len() as u64;
    assert_eq!(
        errno(fs.fallocate(f.ino, size - 1024, 1024, collapse)),
        libc::EINVAL
    );
    assert_eq!(errno(fs.fallocate(f.ino, size, 1024, insert)), libc::EINVAL);
    assert_eq!(
        errno(fs.fallocate(
            f.ino,
            0,
            1024,
            FallocFlags {
                keep_size: true,
                ..collapse
            }
        )),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(fs.fallocate(
            f.ino,
            0,
            1024,
            FallocFlags {
                insert_range: true,
                ..collapse
            }
        )),
        libc::EOPNOTSUPP
    );
    let max = fs.getattr(f.ino).unwrap().size;
    let big = (u64::from(u32::MAX) * 1024 - max) / 1024 * 1024 + 1024;
    assert_eq!(errno(fs.fallocate(f.ino, 0, big, insert)), libc::EFBIG);
    assert_eq!(errno(fs.fallocate(ROOT_INO, 0, 1024, insert)), libc::EISDIR);
    check(&fs, &model, "after the refusals");
    // Collapses and inserts at edges, in the middle, across many leaves.
    let steps: &[(bool, usize, usize)] = &[
        (true, 0, 1),
        (true, 1, 1),
        (true, 10, 3),
        (true, 100, 150),
        (false, 0, 2),
        (false, 5, 1),
        (false, 50, 300),
        (true, 40, 320),
        (false, 1, 7),
        (true, 3, 4),
        (false, 200, 1),
    ];
    for (i, &(is_collapse, off, len)) in steps.iter().enumerate() {
        let (o, l) = (off * bs, len * bs);
        let flags = if is_collapse { collapse } else { insert };
        fs.fallocate(f.ino, o as u64, l as u64, flags).unwrap();
        if is_collapse {
            model.drain(o..o + l);
        } else {
            model.splice(o..o, std::iter::repeat_n(0u8, l));
        }
        check(&fs, &model, &format!("step {i}"));
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let fs = mount(&img, mode);
    check(&fs, &model, "after a remount");
    // Down to the first and last blocks (the range must end before the
    // end of the file), then grown again.
    let n = model.len() - 2 * bs;
    fs.fallocate(f.ino, bs as u64, n as u64, collapse).unwrap();
    model.drain(bs..bs + n);
    check(&fs, &model, "collapsed to two blocks");
    fs.fallocate(f.ino, 0, 5 * bs as u64, insert).unwrap();
    model.splice(0..0, std::iter::repeat_n(0u8, 5 * bs));
    check(&fs, &model, "one block moved up");
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}

#[test]
fn collapse_and_insert_range_async() {
    collapse_and_insert(ProtocolKind::named("async"), "");
}

#[test]
fn collapse_and_insert_range_sync() {
    collapse_and_insert(ProtocolKind::named("sync"), "");
}

#[test]
fn collapse_and_insert_range_journal() {
    collapse_and_insert(ProtocolKind::named("journal"), "");
}

#[test]
fn collapse_and_insert_range_fast_commit() {
    collapse_and_insert(ProtocolKind::named("fast_commit"), "fast_commit");
}

#[test]
fn collapse_and_insert_range_softdep() {
    collapse_and_insert(ProtocolKind::named("softdep"), "");
}

#[test]
fn collapse_and_insert_range_sched() {
    collapse_and_insert(ProtocolKind::named("sched-flag"), "");
    collapse_and_insert(ProtocolKind::named("sched-chain"), "");
}

/// A change copies a cached block only while another reference to its old
/// image is alive (a plan's or a commit's snapshot). Creating and writing
/// files under `async`, with nothing being written back, must copy
/// (almost) nothing: a caller that holds an image while it changes the same
/// block, as setting a time stamp once did (four copies of the inode-table
/// block for every created file), shows up here.
#[test]
fn creating_files_copies_no_block_images() {
    if !have("mkfs.ext4") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 64, 4096, "");
    let fs = mount(&img, ProtocolKind::named("async"));
    let c = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &c).unwrap();
    let before = fs.cache_stats().copies;
    const FILES: u64 = 200;
    for i in 0..FILES {
        let f = fs
            .create(
                d.ino,
                format!("f{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &c,
            )
            .unwrap();
        fs.write(f.ino, 0, &[7u8; 6000]).unwrap();
        fs.write(f.ino, 6000, &[9u8; 100]).unwrap();
    }
    let copies = fs.cache_stats().copies - before;
    // A write-back that happened to run meanwhile may account for a few.
    assert!(
        copies < FILES / 10,
        "{copies} block copies while creating {FILES} files"
    );
    fs.unmount().unwrap();
}
