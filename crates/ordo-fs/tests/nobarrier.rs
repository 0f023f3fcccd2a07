//! `-o nobarrier` (`MountOptions::barrier = false`): no flush and no FUA
//! reach the device, on every protocol that issues them, and the file
//! system still reads back what it wrote; with barriers (the default) the
//! same fsyncs flush.

use std::sync::Arc;

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

/// A fresh image with a journal (every protocol mounts it).
fn image() -> Arc<MemDevice> {
    let mem = MemDevice::new(4096, 8192).unwrap();
    mkfs(
        &mem,
        &MkfsOptions {
            block_size: 4096,
            features: parse_features("has_journal,fast_commit", DEFAULT_FEATURES).unwrap(),
            journal_blocks: Some(1024),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    Arc::new(mem)
}

/// Creates, writes and fsyncs a few files under `mode`; returns the
/// flushes and FUA writes the device saw, after the files read back.
fn flushes_and_fua(mode: &str, barrier: bool) -> (u64, u64) {
    let dev = image();
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            mode: ProtocolKind::named(mode),
            barrier,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let before = dev.counters();
    let mut files = Vec::new();
    for i in 0..4u8 {
        let a = fs
            .create(
                ROOT_INO,
                format!("f{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &Creds::root(),
            )
            .unwrap();
        fs.write(a.ino, 0, &vec![i + 1; 6000]).unwrap();
        fs.fsync(a.ino, false).unwrap();
        files.push(a.ino);
    }
    fs.sync().unwrap();
    let c = dev.counters().since(&before);
    for (i, ino) in files.iter().enumerate() {
        assert_eq!(
            fs.read(*ino, 0, 6000).unwrap(),
            vec![i as u8 + 1; 6000],
            "{mode}"
        );
    }
    fs.unmount().unwrap();
    // The image is clean and reads back after a remount.
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            mode: ProtocolKind::named(mode),
            ..MountOptions::default()
        },
    )
    .unwrap();
    for (i, ino) in files.iter().enumerate() {
        assert_eq!(fs.read(*ino, 0, 6000).unwrap(), vec![i as u8 + 1; 6000]);
    }
    fs.unmount().unwrap();
    (c.flushes, c.total().fua_writes)
}

#[test]
fn nobarrier_sends_no_flush_and_no_fua() {
    for mode in [
        "sync",
        "journal",
        "fast_commit",
        "optimistic",
        "softdep",
        "backpointers",
        "streams",
    ] {
        let (flushes, fua) = flushes_and_fua(mode, true);
        assert!(
            flushes + fua > 0,
            "{mode}: with barriers an fsync flushes ({flushes} flushes, {fua} FUA)"
        );
        let (flushes, fua) = flushes_and_fua(mode, false);
        assert_eq!((flushes, fua), (0, 0), "{mode} with nobarrier");
    }
}
