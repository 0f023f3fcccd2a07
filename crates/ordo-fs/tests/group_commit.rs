//! Group commit (`mode=journal`, `mode=fast_commit`, `mode=backpointers`,
//! and per stream `mode=streams`): fsyncs that arrive while another fsync's commit is
//! running wait for it and then share one commit, instead of each queuing
//! a commit of its own; and that one commit makes every waiter's changes
//! durable. Under streams only fsyncs of one stream share.
//!
//! Deterministic, not timed: the device's flush blocks until the test
//! opens a gate, and the test waits until the file system reports the
//! expected number of waiting fsyncs before opening it.

mod core_common;

use std::sync::Arc;

use core_common::create_file;
use ordo_dev::{GateDevice, MemDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

fn stat(fs: &Fs, name: &str) -> u64 {
    let (_, s) = fs.protocol_stats();
    s.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    // A guard against a hang, not a measurement: the condition is reached
    // by construction, within microseconds, when the code is right.
    let start = std::time::Instant::now();
    while !f() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "never happened: {what}"
        );
        std::thread::yield_now();
    }
}

/// A fresh image with `features` on a gate device, mounted with `mode`
/// (no background thread).
fn gate_mount(
    mode: ProtocolKind,
    features: &str,
) -> (Arc<GateDevice<MemDevice>>, MountOptions, Arc<Fs>) {
    let mem = MemDevice::new(4096, 8192).unwrap();
    mkfs(
        &mem,
        &MkfsOptions {
            block_size: 4096,
            features: parse_features(features, DEFAULT_FEATURES).unwrap(),
            journal_blocks: Some(1024),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let dev = Arc::new(GateDevice::new(mem));
    let opts = MountOptions {
        mode,
        background: false,
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::mount(dev.clone(), opts.clone()).unwrap());
    (dev, opts, fs)
}

fn check(mode: ProtocolKind, features: &str, commits_stat: &str) {
    const WAITERS: usize = 3;
    let (dev, opts, fs) = gate_mount(mode, features);
    fs.sync().unwrap();
    let file = |name: &str, fill: u8| create_file(&fs, name, &vec![fill; 6000]);
    let before = stat(&fs, commits_stat);
    // The first fsync's commit blocks in its flush.
    dev.set_closed(true);
    let first = file("lead", 1);
    let leader = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(first, false))
    };
    wait_until("the first commit to reach the gate", || dev.blocked() == 1);
    // Three more fsyncs arrive while it is blocked: each must wait.
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let ino = file(&format!("w{i}"), 10 + i as u8);
        let fs2 = fs.clone();
        waiters.push(std::thread::spawn(move || fs2.fsync(ino, false)));
    }
    wait_until("every later fsync to wait", || {
        fs.fsync_waiters() == WAITERS
    });
    assert_eq!(dev.blocked(), 1, "a waiter issued I/O of its own");
    dev.set_closed(false);
    leader.join().unwrap().unwrap();
    for w in waiters {
        w.join().unwrap().unwrap();
    }
    let commits = stat(&fs, commits_stat) - before;
    assert_eq!(
        commits,
        2,
        "{mode:?}: the three waiters must share one commit after the first ({:?})",
        fs.protocol_stats()
    );
    // Every waiter's changes are in that commit: a crash now (no unmount)
    // and a remount find all four files.
    let Ok(fs) = Arc::try_unwrap(fs) else {
        panic!("fs still shared")
    };
    drop(fs);
    let img = Arc::new(MemDevice::from_image(4096, &dev.inner().to_image()).unwrap());
    let fs = Fs::mount(img, opts).unwrap();
    for (name, fill) in [("lead", 1u8), ("w0", 10), ("w1", 11), ("w2", 12)] {
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(
            fs.read(a.ino, 0, 6000).unwrap(),
            vec![fill; 6000],
            "{mode:?}: {name}"
        );
    }
    fs.unmount().unwrap();
}

#[test]
fn journal_fsyncs_share_a_commit() {
    check(ProtocolKind::named("journal"), "has_journal", "commits");
}

#[test]
fn fast_commit_fsyncs_share_a_fast_commit() {
    check(
        ProtocolKind::named("fast_commit"),
        "has_journal,fast_commit",
        "fc_fast_commits",
    );
}

/// NoFS's fsync writes the named files' blocks and flushes once: the
/// leader names every waiter's file, so they share the flush.
#[test]
fn backpointers_fsyncs_share_a_flush() {
    check(
        ProtocolKind::named("backpointers"),
        "metadata_csum,extent,ext_attr",
        "write_backs",
    );
}

#[test]
fn streams_fsyncs_of_one_stream_share_a_commit() {
    check(ProtocolKind::named("streams"), "has_journal", "commits");
}

/// With `mode=streams` a commit covers its caller's stream only, so an
/// fsync from another stream never waits for it as a group-commit waiter:
/// it plans a commit of its own while the first one is blocked.
#[test]
fn streams_fsyncs_of_other_streams_plan_their_own_commit() {
    let (dev, _, fs) = gate_mount(ProtocolKind::named("streams"), "has_journal");
    let root = Creds::root();
    let a = fs
        .create(ROOT_INO, b"a", FileType::Regular, 0o644, 0, &root)
        .unwrap()
        .ino;
    let b = fs
        .create(ROOT_INO, b"b", FileType::Regular, 0o644, 0, &root)
        .unwrap()
        .ino;
    fs.sync().unwrap();
    let before = stat(&fs, "stream_commits");
    dev.set_closed(true);
    let in_stream = |name: &'static [u8], ino, fill: u8| {
        let fs = fs.clone();
        std::thread::spawn(move || {
            fs.setstream(name).unwrap();
            fs.write(ino, 0, &[fill; 5000]).unwrap();
            fs.fsync(ino, false)
        })
    };
    let first = in_stream(b"one", a, 1);
    wait_until("the first commit to reach the gate", || dev.blocked() == 1);
    let second = in_stream(b"two", b, 2);
    wait_until("the other stream to plan its own commit", || {
        stat(&fs, "stream_commits") == before + 2
    });
    assert_eq!(fs.fsync_waiters(), 0, "an fsync waited for another stream");
    dev.set_closed(false);
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
}
