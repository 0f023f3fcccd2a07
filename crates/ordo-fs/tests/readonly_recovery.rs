//! A read-only mount of an image whose journal needs recovery serves the
//! recovered file system (journal and fast commits replayed in memory)
//! and never writes the image; a later read-write mount recovers it for
//! real, to the same tree. And the recovery a mount runs is the image's:
//! a `mode=journal` mount of an image a `fast_commit` mount left replays
//! its fast commits too.

mod core_common;

use std::sync::Arc;

use core_common::create_file;
use ordo_dev::{BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Fs, MountOptions, ProtocolKind, ROOT_INO};

fn image(features: &str) -> Vec<u8> {
    let mem = MemDevice::new(4096, 8192).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features: parse_features(features, DEFAULT_FEATURES).unwrap(),
        journal_blocks: Some(1024),
        ..MkfsOptions::default()
    };
    mkfs(&mem, &opts).unwrap();
    mem.to_image()
}

fn opts(mode: ProtocolKind, read_only: bool) -> MountOptions {
    MountOptions {
        mode,
        read_only,
        background: false,
        ..MountOptions::default()
    }
}

/// Mount `img` in `mode`, make `files` durable with fsyncs, and crash:
/// the image left behind (its journal live, `needs_recovery` set).
fn crashed(img: &[u8], mode: ProtocolKind, files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let dev = Arc::new(WriteCacheDevice::new(
        MemDevice::from_image(4096, img).unwrap(),
    ));
    let fs = Fs::mount(dev.clone(), opts(mode, false)).unwrap();
    // One full commit first, so that later fsyncs can be fast commits.
    fs.sync().unwrap();
    for (name, data) in files {
        let ino = create_file(&fs, name, data);
        fs.fsync(ino, false).unwrap();
    }
    let crashed = dev.crash(7, CrashPolicy::lose_all()).unwrap();
    drop(fs);
    crashed.to_image()
}

fn needs_recovery(img: &[u8]) -> bool {
    // s_feature_incompat at superblock offset 0x60, bit 0x4.
    let inc = u32::from_le_bytes(img[1024 + 0x60..1024 + 0x64].try_into().unwrap());
    inc & 0x4 != 0
}

fn read_all(fs: &Fs, name: &str) -> Vec<u8> {
    let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
    fs.read(a.ino, 0, a.size as u32).unwrap()
}

fn check(features: &str, mode: ProtocolKind) {
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("one", vec![0x5a; 5000]),
        ("two", (0..9000u32).map(|i| i as u8).collect()),
    ];
    let img = crashed(&image(features), mode, &files);
    assert!(
        needs_recovery(&img),
        "{features}: the crash left no live log"
    );
    let base = Arc::new(MemDevice::from_image(4096, &img).unwrap());
    // Read-only, in every mode: the recovered tree, the image untouched.
    for ro_mode in [
        ProtocolKind::named("async"),
        ProtocolKind::named("journal"),
        mode,
    ] {
        let fs = Fs::mount(base.clone(), opts(ro_mode, true)).unwrap();
        for (name, data) in &files {
            assert_eq!(&read_all(&fs, name), data, "{features}: ro {name}");
        }
        fs.unmount().unwrap();
        assert!(
            base.to_image() == img,
            "{features}: a read-only mount wrote the image"
        );
    }
    let c = base.counters();
    assert_eq!((c.total().writes, c.flushes), (0, 0), "{features}");
    // Read-write recovers for real, to the same tree.
    let fs = Fs::mount(base.clone(), opts(mode, false)).unwrap();
    for (name, data) in &files {
        assert_eq!(&read_all(&fs, name), data, "{features}: rw {name}");
    }
    fs.unmount().unwrap();
    assert!(!needs_recovery(&base.to_image()));
}

#[test]
fn read_only_mount_of_a_live_journal_serves_the_recovered_tree() {
    check("has_journal", ProtocolKind::named("journal"));
}

#[test]
fn read_only_mount_of_a_fast_commit_log_serves_the_replayed_tree() {
    check(
        "has_journal,fast_commit",
        ProtocolKind::named("fast_commit"),
    );
}

#[test]
fn a_journal_mount_replays_the_fast_commits_a_fast_commit_mount_left() {
    let files: Vec<(&str, Vec<u8>)> = vec![("one", vec![0x33; 7000])];
    let img = crashed(
        &image("has_journal,fast_commit"),
        ProtocolKind::named("fast_commit"),
        &files,
    );
    let dev = Arc::new(MemDevice::from_image(4096, &img).unwrap());
    let fs = Fs::mount(dev, opts(ProtocolKind::named("journal"), false)).unwrap();
    for (name, data) in &files {
        assert_eq!(
            &read_all(&fs, name),
            data,
            "mode=journal after fast commits"
        );
    }
    fs.unmount().unwrap();
}
