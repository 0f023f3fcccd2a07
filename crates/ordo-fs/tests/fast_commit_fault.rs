//! The test-only fault `ORDO_FAULT=fc_skip_data_flush` (a fast commit that
//! carries file data skips its flush) loses data an fsync promised when
//! power is cut: proof that the flush selective flushing keeps is needed,
//! and that the crash checks can see its absence. Its own test binary,
//! since the fault is read from the environment when the protocol is
//! built.

mod fast_commit_common;

use std::sync::Arc;

use fast_commit_common::*;
use ordo_dev::{CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

fn lost_after_crash(fault: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("f.img");
    mkfs_fc(&img, "64M", 4096);
    let mem = MemDevice::from_image(4096, &std::fs::read(&img).unwrap()).unwrap();
    let dev = Arc::new(WriteCacheDevice::new(mem));
    if fault {
        std::env::set_var("ORDO_FAULT", "fc_skip_data_flush");
    } else {
        std::env::remove_var("ORDO_FAULT");
    }
    let opts = MountOptions {
        mode: ProtocolKind::named("fast_commit"),
        ..MountOptions::default()
    };
    let fs = Fs::mount(dev.clone(), opts.clone()).unwrap();
    std::env::remove_var("ORDO_FAULT");
    let mk = |name: &[u8], data: &[u8]| {
        let a = fs
            .create(ROOT_INO, name, FileType::Regular, 0o644, 0, &Creds::root())
            .unwrap();
        fs.write(a.ino, 0, data).unwrap();
        fs.fsync(a.ino, false).unwrap();
    };
    mk(b"first", b"full commit\n");
    mk(b"second", &[0x5a; 8192]);
    let crashed = Arc::new(dev.crash(7, CrashPolicy::lose_all()).unwrap());
    drop(fs);
    let env = env_of(crashed.as_ref());
    ordo_fs::protocol::recover(ProtocolKind::named("fast_commit"), crashed.as_ref(), &env).unwrap();
    let fs = Fs::mount(
        crashed,
        MountOptions {
            read_only: true,
            ..opts
        },
    )
    .unwrap();
    let a = fs
        .lookup(ROOT_INO, b"second")
        .expect("the fast commit replayed");
    fs.read(a.ino, 0, 8192).unwrap() != vec![0x5a; 8192]
}

#[test]
fn skipping_the_data_flush_loses_promised_data() {
    if !have("mkfs.ext4") {
        eprintln!("skipped: no mkfs.ext4");
        return;
    }
    assert!(
        !lost_after_crash(false),
        "with the flush, the data survives"
    );
    assert!(lost_after_crash(true), "without it, the crash loses it");
}
