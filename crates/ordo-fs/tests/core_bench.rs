//! Library-mode figures of the core (not tests: ignored by default).
//!
//! `cargo test --release -p ordo-fs --test core_bench -- --ignored --nocapture`
//! prints, for `async` and `sync`: operations per second, peak cached
//! bytes, and device writes, bytes and flushes per operation for three
//! workloads: create 10,000 files of 4 KiB then unmount; write 1 GiB
//! sequentially; read it back.

mod core_common;

use std::sync::Arc;
use std::time::Instant;

use core_common::*;
use ordo_dev::{BlockDevice, Counters, FileDevice, OpenOptions};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

fn open(img: &std::path::Path, mode: ProtocolKind) -> (Fs, Arc<FileDevice>) {
    let dev = Arc::new(FileDevice::open(img, 4096, OpenOptions::read_write()).unwrap());
    let fs = Fs::mount(
        dev.clone() as Arc<dyn BlockDevice>,
        MountOptions {
            mode,
            ..Default::default()
        },
    )
    .unwrap();
    (fs, dev)
}

fn report(what: &str, mode: ProtocolKind, ops: u64, secs: f64, c: &Counters, peak: u64) {
    let t = c.total();
    println!(
        "{:<6} {:<28} {:>10.0} ops/s  peak cache {:>6} KiB  per op: {:>6.2} writes {:>9.0} bytes {:>6.3} flushes {:>6.2} FUA",
        mode.name(),
        what,
        ops as f64 / secs,
        peak >> 10,
        t.writes as f64 / ops as f64,
        t.write_bytes as f64 / ops as f64,
        c.flushes as f64 / ops as f64,
        t.fua_writes as f64 / ops as f64,
    );
}

#[test]
#[ignore]
fn bench_core() {
    for mode in [ProtocolKind::named("async"), ProtocolKind::named("sync")] {
        let (_dir, img) = scratch();
        mkfs(&img, 3 * 1024, 4096, "^has_journal");
        let c = Creds::root();
        // create 10,000 files of 4 KiB, then unmount
        let (fs, dev) = open(&img, mode);
        let c0 = dev.counters();
        let t = Instant::now();
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, &c).unwrap();
        let data = vec![0x61u8; 4096];
        for i in 0..10_000 {
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
            fs.write(f.ino, 0, &data).unwrap();
        }
        let peak = fs.cache_stats().peak_cached_bytes;
        fs.unmount().unwrap();
        let secs = t.elapsed().as_secs_f64();
        report(
            "create 10k x 4KiB + umount",
            mode,
            10_000,
            secs,
            &dev.counters().since(&c0),
            peak,
        );
        drop(dev);

        // write 1 GiB sequentially, then read it back
        let (fs, _dev) = open(&img, mode);
        let f = fs
            .create(ROOT_INO, b"big", FileType::Regular, 0o644, 0, &c)
            .unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let c0 = fs.counters();
        let t = Instant::now();
        for i in 0..1024u64 {
            fs.write(f.ino, i << 20, &chunk).unwrap();
        }
        fs.fsync(f.ino, false).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let c1 = fs.counters();
        report(
            "write 1 GiB (1 MiB writes)",
            mode,
            1024,
            secs,
            &c1.since(&c0),
            fs.cache_stats().peak_cached_bytes,
        );
        let t = Instant::now();
        for i in 0..1024u64 {
            let got = fs.read(f.ino, i << 20, 1 << 20).unwrap();
            assert_eq!(got.len(), 1 << 20);
        }
        let secs = t.elapsed().as_secs_f64();
        let c2 = fs.counters();
        report(
            "read 1 GiB (1 MiB reads)",
            mode,
            1024,
            secs,
            &c2.since(&c1),
            fs.cache_stats().peak_cached_bytes,
        );
        fs.unmount().unwrap();
    }
}
