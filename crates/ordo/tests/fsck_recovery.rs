//! `ordo fsck` on an image whose journal needs recovery: with `-n` it
//! checks the file system as replayed in memory and leaves the image
//! byte-identical; with `-y` it replays for real first (exit 1, "errors
//! corrected", as e2fsck), after which the image is clean and needs no
//! recovery.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use ordo_dev::{CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

/// An image left by a crash after fsyncs in `mode`: its log is live.
fn crashed_image(features: &str, mode: ProtocolKind, files: usize) -> Vec<u8> {
    let mem = MemDevice::new(4096, 8192).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features: parse_features(features, DEFAULT_FEATURES).unwrap(),
        journal_blocks: Some(1024),
        ..MkfsOptions::default()
    };
    mkfs(&mem, &opts).unwrap();
    let dev = Arc::new(WriteCacheDevice::new(mem));
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            mode,
            background: false,
            ..MountOptions::default()
        },
    )
    .unwrap();
    fs.sync().unwrap();
    for i in 0..files {
        let a = fs
            .create(
                ROOT_INO,
                format!("file{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &Creds::root(),
            )
            .unwrap();
        fs.write(a.ino, 0, &vec![i as u8; 3000 + i * 1000]).unwrap();
        fs.fsync(a.ino, false).unwrap();
    }
    let img = dev.crash(3, CrashPolicy::lose_all()).unwrap().to_image();
    drop(fs);
    img
}

fn fsck(img: &Path, flag: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["fsck", flag])
        .arg(img)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn files_line(out: &str) -> String {
    out.lines()
        .find(|l| l.contains(" files, "))
        .unwrap_or_default()
        .to_string()
}

fn check(features: &str, mode: ProtocolKind) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("crashed.img");
    let raw = crashed_image(features, mode, 4);
    std::fs::write(&img, &raw).unwrap();
    let (code, out) = fsck(&img, "-n");
    assert_eq!(code, 0, "{features}: -n on a recoverable image\n{out}");
    assert!(
        out.contains("journal needs recovery: replayed in memory"),
        "{out}"
    );
    // The check saw the replayed tree: the four fsynced files.
    assert!(files_line(&out).contains(" 4 files"), "{out}");
    assert!(
        std::fs::read(&img).unwrap() == raw,
        "{features}: fsck -n changed the image"
    );
    let (code, out) = fsck(&img, "-y");
    assert_eq!(code, 1, "{features}: -y replays, exit 1\n{out}");
    assert!(files_line(&out).contains(" 4 files"), "{out}");
    let (code, out) = fsck(&img, "-n");
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("needs recovery"), "{out}");
    assert!(files_line(&out).contains(" 4 files"), "{out}");
}

#[test]
fn fsck_checks_a_live_journal_as_replayed() {
    check("has_journal", ProtocolKind::named("journal"));
}

#[test]
fn fsck_checks_a_fast_commit_log_as_replayed() {
    check(
        "has_journal,fast_commit",
        ProtocolKind::named("fast_commit"),
    );
}
