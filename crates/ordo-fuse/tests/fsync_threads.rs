//! fsyncs through the mount wait on the fsync threads, not on the request
//! workers: with one worker, four fsyncs under `mode=journal` wait for a
//! commit together (and share the next one), and the worker serves a
//! `stat` meanwhile. Served on the worker (`fsync_threads=0`), the first
//! fsync held the only worker for its whole commit, and the others could
//! not even be read.
//!
//! Deterministic, not timed: the device's flush waits at a gate the test
//! opens once the file system reports the waiters it expects.

mod common;

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use ordo_dev::{GateDevice, MemDevice};
use ordo_fs::{Fs, MountOptions, ProtocolKind, ROOT_INO};
use ordo_fuse::MountConfig;

const FILES: usize = 4;
const FILE_BYTES: usize = 6000;

fn commits(fs: &Fs) -> u64 {
    let (_, s) = fs.protocol_stats();
    s.iter()
        .find(|(k, _)| k == "commits")
        .map_or(0, |(_, v)| *v)
}

/// Wait for `f`; a guard against a hang, not a measurement. On giving up
/// the gate opens first, so that nothing stays blocked behind the panic.
fn wait_until(dev: &GateDevice<MemDevice>, what: &str, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(60) {
            dev.set_closed(false);
            panic!("never happened: {what}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fsyncs_wait_for_a_commit_together_while_the_one_worker_serves() {
    let mem = common::journaled_image(8192);
    let dev = Arc::new(GateDevice::new(mem));
    let mode = ProtocolKind::named("journal");
    let opts = MountOptions {
        mode,
        background: false,
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::mount(dev.clone(), opts).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let config = MountConfig {
        threads: 1,
        allow_other: false,
        ..MountConfig::for_mode(mode)
    };
    assert!(
        config.fsync_threads > 0,
        "journal's default has fsync threads"
    );
    let session = ordo_fuse::mount(fs.clone(), dir.path(), &config)
        .unwrap()
        .spawn()
        .unwrap();

    let files: Vec<Arc<File>> = (0..FILES)
        .map(|i| {
            let mut f = File::create(dir.path().join(format!("f{i}"))).unwrap();
            f.write_all(&vec![i as u8 + 1; FILE_BYTES]).unwrap();
            Arc::new(f)
        })
        .collect();
    fs.sync().unwrap();
    files[0].write_all_at(&[10; FILE_BYTES], 0).unwrap();
    let before = commits(&fs);

    // The first fsync's commit waits in its flush.
    dev.set_closed(true);
    let first = {
        let f = files[0].clone();
        std::thread::spawn(move || f.sync_all())
    };
    wait_until(&dev, "the first commit to reach the gate", || {
        dev.blocked() == 1
    });
    // Three more files change and are fsynced while it waits: the worker
    // must serve their writes, and each fsync must wait for the next
    // commit. On threads of their own, so that a worker held by the first
    // fsync shows as a wait that never ends, not as a hung test.
    let later: Vec<_> = (1..FILES)
        .map(|i| {
            let f = files[i].clone();
            std::thread::spawn(move || {
                f.write_all_at(&vec![i as u8 + 10; FILE_BYTES], 0)?;
                f.sync_all()
            })
        })
        .collect();
    wait_until(&dev, "every later fsync to wait for a commit", || {
        fs.fsync_waiters() == FILES - 1
    });
    // The only worker is free: a stat is served while four fsyncs wait.
    let stat = {
        let p = dir.path().join("f3");
        std::thread::spawn(move || std::fs::metadata(p).map(|m| m.len()))
    };
    wait_until(&dev, "a stat beside the waiting fsyncs", || {
        stat.is_finished()
    });
    assert_eq!(stat.join().unwrap().unwrap(), FILE_BYTES as u64);
    assert_eq!(
        dev.blocked(),
        1,
        "a waiting fsync issued a flush of its own"
    );

    dev.set_closed(false);
    first.join().unwrap().unwrap();
    for s in later {
        s.join().unwrap().unwrap();
    }
    assert_eq!(
        commits(&fs) - before,
        2,
        "the three later fsyncs share one commit ({:?})",
        fs.protocol_stats()
    );
    drop(files);
    session.umount_and_join().unwrap();
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    // Everything the fsyncs promised is on the device: mount a copy of it
    // as a crash would leave it.
    drop(fs);
    let img = Arc::new(MemDevice::from_image(4096, &dev.inner().to_image()).unwrap());
    let fs = Fs::mount(
        img,
        MountOptions {
            mode,
            background: false,
            ..MountOptions::default()
        },
    )
    .unwrap();
    for i in 0..FILES {
        let a = fs.lookup(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(
            fs.read(a.ino, 0, FILE_BYTES as u32).unwrap(),
            vec![i as u8 + 10; FILE_BYTES],
            "f{i}"
        );
    }
}
