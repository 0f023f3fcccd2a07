//! Readers on demand (`fuser::ReaderGate`, `MountConfig::readers_on_demand`):
//! one worker reads while it runs; a wait the file system marks admits
//! another; a worker back from its wait stands by when another reads.
//! The last test mounts ordo: a worker waiting on the device inside the
//! core (`ordo_fs::waiting`) lets the other worker read and serve.

mod common;

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use fuser::{blocking_begin, blocking_end, ReaderGate};
use ordo_dev::{GateDevice, MemDevice};
use ordo_fs::{Fs, MountOptions, ProtocolKind};
use ordo_fuse::MountConfig;

/// Three workers, each "reading" for a moment after `before_read` and
/// sometimes waiting after it: never are two reading at once, and every
/// worker gets to read (a wait admits another).
#[test]
fn one_worker_reads_until_it_waits() {
    let gate = Arc::new(ReaderGate::default());
    let reading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for i in 0..3 {
        let (gate, reading, most) = (gate.clone(), reading.clone(), most.clone());
        threads.push(std::thread::spawn(move || {
            gate.join();
            let mut reads = 0;
            for round in 0..100 {
                gate.before_read();
                let now = reading.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(50));
                reading.fetch_sub(1, Ordering::SeqCst);
                reads += 1;
                if (round + i) % 3 == 0 {
                    blocking_begin();
                    std::thread::sleep(Duration::from_micros(300));
                    blocking_end();
                }
            }
            gate.leave();
            reads
        }));
    }
    for t in threads {
        assert_eq!(t.join().unwrap(), 100);
    }
    assert_eq!(most.load(Ordering::SeqCst), 1);
    assert_eq!(gate.admitted(), 0);
}

/// Without a wait a second worker is never admitted; a wait admits it;
/// nested sections count once; of two running workers the one that comes
/// to read next stands by; closing the gate lets every worker read.
#[test]
fn a_second_worker_reads_only_while_the_first_waits() {
    let gate = Arc::new(ReaderGate::default());
    gate.join();
    gate.before_read();
    assert_eq!(gate.running(), 1);
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let g2 = gate.clone();
    let second = std::thread::spawn(move || {
        g2.join();
        g2.before_read();
        tx.send(1).unwrap();
        // Reading again keeps it reading: it is the one running.
        g2.before_read();
        tx.send(2).unwrap();
        go_rx.recv().unwrap();
        // The first came back: this read stands by.
        g2.before_read();
        tx.send(3).unwrap();
    });
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    blocking_begin();
    blocking_begin();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    assert_eq!(gate.running(), 1, "the second runs, the first waits");
    assert_eq!(gate.admitted(), 2);
    blocking_end();
    assert_eq!(gate.running(), 1, "a nested end does not end the wait");
    blocking_end();
    assert_eq!(gate.running(), 2);
    go_tx.send(()).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    assert_eq!(gate.running(), 1);
    assert_eq!(gate.admitted(), 1);
    // The session ends: the gate opens for every worker.
    gate.close();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 3);
    second.join().unwrap();
}

/// A wait outside any worker (a thread of the file system's own) is
/// nothing to the gate.
#[test]
fn a_wait_off_the_workers_changes_nothing() {
    let gate = Arc::new(ReaderGate::default());
    gate.join();
    gate.before_read();
    let t = std::thread::spawn(|| {
        blocking_begin();
        blocking_end();
    });
    t.join().unwrap();
    assert_eq!(gate.running(), 1);
    assert_eq!(gate.admitted(), 1);
}

/// Wait for `f`; a guard against a hang, not a measurement. On giving up
/// the device's gate opens first, so that nothing stays blocked.
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

/// Two workers, readers on demand, fsyncs on the worker: while one
/// worker's fsync waits in the device's flush, the other reads and
/// serves a `stat`. Unmarked (the commit and its plan not waits), the stat
/// is never read until the flush ends, and the test fails (checked).
#[test]
fn a_worker_waiting_on_the_device_lets_another_read() {
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
        threads: 2,
        allow_other: false,
        fsync_threads: 0,
        attr_ttl: Duration::ZERO,
        readers_on_demand: true,
        ..MountConfig::for_mode(mode)
    };
    let session = ordo_fuse::mount(fs.clone(), dir.path(), &config)
        .unwrap()
        .spawn()
        .unwrap();
    let mut f = File::create(dir.path().join("f")).unwrap();
    f.write_all(&[7; 5000]).unwrap();
    std::fs::write(dir.path().join("g"), [8; 3000]).unwrap();

    dev.set_closed(true);
    let fsync = std::thread::spawn(move || f.sync_all());
    wait_until(&dev, "the fsync's commit to reach the gate", || {
        dev.blocked() == 1
    });
    // Attributes are not cached (attr_timeout 0): the stat is a request.
    let stat = {
        let p = dir.path().join("g");
        std::thread::spawn(move || std::fs::metadata(p).map(|m| m.len()))
    };
    wait_until(&dev, "a stat served beside the waiting fsync", || {
        stat.is_finished()
    });
    assert_eq!(stat.join().unwrap().unwrap(), 3000);
    assert_eq!(dev.blocked(), 1, "the fsync still waits");
    dev.set_closed(false);
    fsync.join().unwrap().unwrap();
    session.umount_and_join().unwrap();
}
