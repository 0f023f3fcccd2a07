//! `mode=softdep` meets no dependency cycle on ordinary operations.
//!
//! A cycle among pending updates leaves a write-back round with nothing it
//! may write; the protocol then releases a held update anyway (counted as
//! `cycles` in its statistics), which gives up that update's ordering. Only
//! a cross-directory `RENAME_EXCHANGE` makes a true cycle; anything else that
//! counts one is a wrong edge. These patterns each made one:
//!
//! * a directory made and renamed to another directory before either was
//!   written: its name's addition and removal touch the same bytes (the
//!   neighbour's `rec_len`) and were taken for the two halves of one
//!   retarget, which must go out together, while the rename orders them;
//! * a file whose extent tree grew a node by delayed allocation and was
//!   then unlinked before any of it was written: the entry naming the node
//!   waited for the node's initialization, which waited for the clearing of
//!   that same entry. That one needs a particular allocation history; the
//!   crash explorer's test runs it as a scenario
//!   (`ordo-crash/tests/scenarios/softdep-emptied-node.scenario`).

mod core_common;

use core_common::*;
use ordo_fs::{Creds, FileType, Fs, ProtocolKind, RenameFlags, ROOT_INO};

fn cycles(fs: &Fs) -> u64 {
    let (name, stats) = fs.protocol_stats();
    assert_eq!(name, "softdep");
    stats
        .iter()
        .find(|(k, _)| k == "cycles")
        .map(|(_, v)| *v)
        .expect("softdep reports its cycles")
}

fn fresh() -> Option<(tempfile::TempDir, std::path::PathBuf, Fs)> {
    if !have("mkfs.ext4") || !have("e2fsck") {
        eprintln!("skipped: e2fsprogs not installed");
        return None;
    }
    let (dir, img) = scratch();
    mkfs(&img, 64, 4096, "");
    let fs = mount(&img, ProtocolKind::named("softdep"));
    Some((dir, img, fs))
}

#[test]
fn a_new_directory_renamed_across_directories_makes_no_cycle() {
    let Some((_dir, img, fs)) = fresh() else {
        return;
    };
    let c = Creds::root();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, &c).unwrap();
    let b = fs.mkdir(ROOT_INO, b"b", 0o755, &c).unwrap();
    fs.sync().unwrap();
    for round in 0..8u32 {
        let name = format!("d{round}");
        let d = fs.mkdir(a.ino, name.as_bytes(), 0o755, &c).unwrap();
        fs.rename(
            a.ino,
            name.as_bytes(),
            b.ino,
            name.as_bytes(),
            RenameFlags::default(),
        )
        .unwrap();
        let f = fs
            .create(d.ino, b"f", FileType::Regular, 0o644, 0, &c)
            .unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
    // And back and forth before a write.
    fs.mkdir(a.ino, b"x", 0o755, &c).unwrap();
    fs.rename(a.ino, b"x", b.ino, b"y", RenameFlags::default())
        .unwrap();
    fs.rename(b.ino, b"y", a.ino, b"x", RenameFlags::default())
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(cycles(&fs), 0, "{:?}", fs.protocol_stats());
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}
