//! `mode=journal` through the whole file system (`Fs`), in each data mode:
//!
//! - a clean unmount leaves an image `e2fsck -fn` passes, with the journal
//!   empty and `needs_recovery` clear, that the kernel mounts with the same
//!   tree and contents;
//! - an image made by `ordo mkfs` and left with a live journal is
//!   replayed by `e2fsck` to the image ordo's recovery gives;
//! - an image left with a live journal by a crash injected through the
//!   device layer (a write cache that loses everything not flushed) is
//!   recovered by `e2fsck -fy` to the image ordo's recovery gives, by a
//!   kernel mount to the same tree and contents, and holds every file
//!   that was fsynced.

mod journal_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use journal_common::*;

use ordo_dev::{BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::protocol::DataMode;
use ordo_fs::{recovery, Creds, FileType, Fs, MountOptions, ProtocolKind, RenameFlags, ROOT_INO};

fn opts(data: DataMode) -> MountOptions {
    MountOptions {
        mode: ProtocolKind::named("journal"),
        data,
        ..MountOptions::default()
    }
}

fn load(img: &Path) -> MemDevice {
    MemDevice::from_image(image_block_size(img), &std::fs::read(img).unwrap()).unwrap()
}

/// What the tests expect to find: path -> file contents (None for a
/// directory).
type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn file(fs: &Fs, parent: u32, name: &str, data: &[u8]) -> u32 {
    let a = fs
        .create(
            parent,
            name.as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &Creds::root(),
        )
        .unwrap();
    fs.write(a.ino, 0, data).unwrap();
    a.ino
}

/// A small workload; returns the tree it leaves. Fsyncs as it goes.
fn workload(fs: &Fs, tag: u8) -> Tree {
    let mut t = Tree::new();
    let d = fs
        .mkdir(ROOT_INO, b"dir", 0o755, &Creds::root())
        .unwrap()
        .ino;
    t.insert("/dir".into(), None);
    for i in 0..12u8 {
        let data = vec![tag ^ i; 1000 + 700 * i as usize];
        let ino = file(fs, d, &format!("f{i}"), &data);
        if i % 3 == 0 {
            fs.fsync(ino, false).unwrap();
        }
        t.insert(format!("/dir/f{i}"), Some(data));
    }
    // A block that begins with the JBD2 magic (escaped when journaled as data).
    let mut magic = vec![0x11u8; 4096];
    magic[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
    let m = file(fs, ROOT_INO, "magic", &magic);
    t.insert("/magic".into(), Some(magic));
    fs.unlink(d, b"f4").unwrap();
    t.remove("/dir/f4");
    fs.rename(d, b"f5", ROOT_INO, b"moved", RenameFlags::default())
        .unwrap();
    let v = t.remove("/dir/f5").unwrap();
    t.insert("/moved".into(), v);
    let big = vec![tag; 200_000];
    let b = file(fs, d, "big", &big);
    t.insert("/dir/big".into(), Some(big));
    fs.fsync(b, false).unwrap();
    fs.fsync(m, true).unwrap();
    t
}

/// The tree of a mounted ordo file system.
fn ordo_tree(fs: &Fs) -> Tree {
    let mut t = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = stack.pop() {
        for e in fs.readdir(dir, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            if e.kind == FileType::Directory {
                t.insert(p.clone(), None);
                stack.push((e.ino, p));
            } else {
                let a = fs.getattr(e.ino).unwrap();
                t.insert(p, Some(fs.read(e.ino, 0, a.size as u32).unwrap()));
            }
        }
    }
    t
}

/// The tree of a directory of the host (a kernel mount).
fn host_tree(root: &Path) -> Tree {
    let mut t = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
            if rel == "/lost+found" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                t.insert(rel, None);
                stack.push(p);
            } else {
                t.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    t
}

/// Loop-mount `img` read-write with the kernel (which replays a live
/// journal), read its tree, unmount.
fn kernel_tree(ctx: &LoopCtx, img: &Path) -> Tree {
    let mut t = Tree::new();
    ctx.capture_after_sync(img, &img.with_extension("after-mount"), "", |root| {
        t = host_tree(root);
    });
    t
}

#[test]
fn clean_unmount_in_every_data_mode() {
    if !have("mkfs.ext4") {
        return;
    }
    for data in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("u.img");
        mkfs(&img, "64M", 4096, &[]);
        let dev = Arc::new(load(&img));
        let fs = Fs::mount(dev.clone(), opts(data)).unwrap();
        let want = workload(&fs, 0x40);
        assert_eq!(ordo_tree(&fs), want);
        let (name, stats) = fs.protocol_stats();
        assert_eq!(name, "journal");
        assert!(
            stats.iter().any(|(k, v)| k == "commits" && *v > 0),
            "{stats:?}"
        );
        fs.unmount().unwrap();
        let st = recovery::journal_state(&*dev).unwrap().unwrap();
        assert!(!st.needs_recovery && !st.needs_replay(), "{data:?}: {st}");
        let out = dir.path().join("out.img");
        std::fs::write(&out, dev.to_image()).unwrap();
        assert_fsck_clean(&out);
        // ordo mounts it again and finds the same tree.
        let fs = Fs::mount(Arc::new(load(&out)), opts(data)).unwrap();
        assert_eq!(ordo_tree(&fs), want, "{data:?}");
        fs.unmount().unwrap();
        if let Some(ctx) = LoopCtx::new() {
            assert_eq!(kernel_tree(&ctx, &out), want, "{data:?}: the kernel's view");
        }
    }
}

#[test]
fn crashed_image_is_recovered_alike_by_ordo_e2fsck_and_the_kernel() {
    if !have("mkfs.ext4") {
        return;
    }
    for data in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("c.img");
        mkfs(&img, "64M", 4096, &[]);
        let dev = Arc::new(WriteCacheDevice::new(load(&img)));
        let fs = Fs::mount(dev.clone(), opts(data)).unwrap();
        let want = workload(&fs, 0x90);
        // Changes after the last fsync, never made durable.
        let late = file(&fs, ROOT_INO, "late", b"not synced");
        let _ = late;
        for (k, policy) in [CrashPolicy::lose_all(), CrashPolicy::default()]
            .into_iter()
            .enumerate()
        {
            let crashed = dev.crash(k as u64, policy).unwrap();
            let st = recovery::journal_state(&crashed).unwrap().unwrap();
            assert!(
                st.needs_recovery,
                "{data:?}: a mounted journal is marked: {st}"
            );
            let path = dir.path().join(format!("crashed{k}.img"));
            std::fs::write(&path, crashed.to_image()).unwrap();

            let (by_ordo, by_e2) = recover_both(&path, dir.path());
            assert_fsck_clean(&by_ordo);
            assert_same_as_e2fsck(&by_ordo, &by_e2);

            // Mounted by ordo (which recovers on its own), every fsynced
            // file is there with its contents.
            let fs2 = Fs::mount(Arc::new(load(&path)), opts(data)).unwrap();
            let got = ordo_tree(&fs2);
            for (p, v) in &want {
                assert_eq!(got.get(p), Some(v), "{data:?} crash {k}: {p}");
            }
            fs2.unmount().unwrap();

            if let Some(ctx) = LoopCtx::new() {
                let by_kernel = dir.path().join(format!("kernel{k}.img"));
                std::fs::copy(&path, &by_kernel).unwrap();
                let kt = kernel_tree(&ctx, &by_kernel);
                let ot = kernel_tree(&ctx, &by_ordo);
                assert_eq!(kt, ot, "{data:?} crash {k}: kernel replay vs ordo replay");
                assert_fsck_clean(&by_kernel);
            }
        }
        drop(fs);
    }
}

#[test]
fn ordo_mkfs_image_journal_is_replayed_by_e2fsck_like_ordo() {
    use ordo_fs::mkfs::{mkfs as ordo_mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
    if !have("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = MemDevice::new(4096, 16384).unwrap();
    let mkfs_opts = MkfsOptions {
        block_size: 4096,
        features: parse_features("has_journal", DEFAULT_FEATURES).unwrap(),
        ..MkfsOptions::default()
    };
    ordo_mkfs(&mem, &mkfs_opts).unwrap();
    let dev = Arc::new(WriteCacheDevice::new(mem));
    let fs = Fs::mount(dev.clone(), opts(DataMode::Journal)).unwrap();
    let want = workload(&fs, 0x33);
    let crashed = dev.crash(3, CrashPolicy::lose_all()).unwrap();
    let path = dir.path().join("ordo-mkfs.img");
    std::fs::write(&path, crashed.to_image()).unwrap();
    let (by_ordo, by_e2) = recover_both(&path, dir.path());
    assert_fsck_clean(&by_ordo);
    assert_same_as_e2fsck(&by_ordo, &by_e2);
    let fs2 = Fs::mount(Arc::new(load(&by_e2)), opts(DataMode::Journal)).unwrap();
    assert_eq!(ordo_tree(&fs2), want, "e2fsck's replay, read by ordo");
    fs2.unmount().unwrap();
    drop(fs);
}

#[test]
fn info_reports_a_journal_that_needs_recovery() {
    if !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("i.img");
    mkfs(&img, "64M", 4096, &[]);
    let dev = Arc::new(WriteCacheDevice::new(load(&img)));
    let fs = Fs::mount(dev.clone(), opts(DataMode::Ordered)).unwrap();
    let ino = file(&fs, ROOT_INO, "x", b"hello");
    fs.fsync(ino, false).unwrap();
    let crashed = dev.crash(0, CrashPolicy::lose_all()).unwrap();
    let st = recovery::journal_state(&crashed).unwrap().unwrap();
    assert!(st.needs_recovery && st.needs_replay() && st.live_transactions >= 1);
    let text = st.to_string();
    assert!(text.contains("Needs recovery:           yes"), "{text}");
    assert!(text.contains("journal_checksum_v3"), "{text}");
    drop(fs);
    let _ = crashed.block_size();
}
