//! The kernel's ext4 records through FUSE and a loop device: its writes and
//! flushes land in the recording device's log in an order from which the
//! explorer's crash states follow, and a state cut at the flush before an
//! fsync's promise holds the fsynced file once the kernel recovers it.
//! Needs root, `/dev/fuse`, loop devices and e2fsprogs, as the rest of the
//! suite.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use ordo_crash::app::kernel::{KernelExt4, KERNEL_WRITE_CLASS};
use ordo_crash::log::{apply_write, EventKind, LogEvent, Recorder};
use ordo_dev::MemDevice;

const FILE_BYTES: usize = 100 * 1024;

/// One mount at a time, so that a test's check for leftovers does not see
/// the other's mount.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A 32 MiB ext4 with a journal, made by mkfs.ext4 on a file.
fn base_image() -> Arc<MemDevice> {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("base.img");
    let out = Command::new("mkfs.ext4")
        .args(["-F", "-q", "-b", "4096"])
        .arg(&img)
        .arg("32M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&img).unwrap();
    Arc::new(MemDevice::from_image(4096, &bytes).unwrap())
}

/// Bytes no block of an ext4 image holds by chance.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9u32 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn write_file(dir: &Path, name: &str, data: &[u8], fsync: bool) {
    let mut f = std::fs::File::create(dir.join(name)).unwrap();
    f.write_all(data).unwrap();
    if fsync {
        f.sync_all().unwrap();
    }
}

fn summary(events: &[LogEvent]) -> (usize, usize, usize) {
    let (mut writes, mut fua, mut flushes) = (0, 0, 0);
    for e in events {
        match &e.kind {
            EventKind::Write(w) => {
                writes += 1;
                fua += usize::from(w.fua);
            }
            EventKind::Flush => flushes += 1,
            EventKind::Mark(_) => {}
        }
    }
    (writes, fua, flushes)
}

/// `W` for a write (`W*` when it carries FUA), `F` for a flush, per event.
fn shape(events: &[LogEvent]) -> String {
    events
        .iter()
        .map(|e| match &e.kind {
            EventKind::Write(w) if w.fua => "W*".to_string(),
            EventKind::Write(w) => format!("W{}", w.data.len() / 4096),
            EventKind::Flush => "F".to_string(),
            EventKind::Mark(m) => format!("M{m}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn sysfs(dev: &str, attr: &str) -> String {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/{attr}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("({e})"))
}

/// Completed write and flush requests of a block device, from its `stat`
/// (fields 5 and 16).
fn loop_io(dev: &str) -> (u64, u64) {
    let stat = sysfs(dev, "stat");
    let f: Vec<u64> = stat
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(f.len() >= 17, "no flush counter in {stat}");
    (f[4], f[15])
}

fn debugfs_cat(image: &Path, path: &str) -> Vec<u8> {
    let out = Command::new("debugfs")
        .args(["-R", &format!("cat {path}")])
        .arg(image)
        .output()
        .unwrap();
    assert!(out.status.success(), "debugfs: {:?}", out);
    out.stdout
}

#[test]
fn kernel_ext4_writes_and_flushes_are_recorded_and_replay_to_the_fsynced_file() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let base = base_image();
    let recorder = Recorder::new(base.clone());
    let k = KernelExt4::mount(recorder.device(), "").unwrap();
    let own_dir = k.path().parent().unwrap().to_path_buf();
    let loop_dev = k.loop_device().unwrap().to_string();
    println!(
        "{loop_dev}: direct I/O {} (sysfs dio {}), write_cache '{}', fua {}",
        k.direct_io(),
        sysfs(&loop_dev, "loop/dio"),
        sysfs(&loop_dev, "queue/write_cache"),
        sysfs(&loop_dev, "queue/fua"),
    );
    let mounted = summary(&recorder.events());
    println!("mount: {mounted:?} (writes, fua, flushes)");

    let data1 = pattern(1, FILE_BYTES);
    let data2 = pattern(2, FILE_BYTES);
    let before = recorder.events().len();
    {
        let mut f = std::fs::File::create(k.path().join("f1")).unwrap();
        f.write_all(&data1).unwrap();
        let written = recorder.events().len();
        let stat0 = loop_io(&loop_dev);
        f.sync_all().unwrap();
        let stat1 = loop_io(&loop_dev);
        let ev = recorder.events();
        let (writes, _, flushes) = summary(&ev[written..]);
        println!(
            "write of 100 KiB before fsync: {:?}; the fsync: {:?} (writes, fua, flushes): {}; \
             the loop device counted {} writes and {} flushes",
            summary(&ev[before..written]),
            summary(&ev[written..]),
            shape(&ev[written..]),
            stat1.0 - stat0.0,
            stat1.1 - stat0.1,
        );
        // Request for request: each write bio the loop device completed is
        // one logged write, each flush request (a PREFLUSH, or the flush
        // after a write that asked for FUA) one logged flush.
        assert_eq!(
            (writes as u64, flushes as u64),
            (stat1.0 - stat0.0, stat1.1 - stat0.1)
        );
        assert!(flushes >= 1 && writes >= 2, "{}", shape(&ev[written..]));
    }
    recorder.mark(1);
    write_file(k.path(), "f2", &data2, false);
    let unmounted = k.unmount();
    let events = recorder.events();
    unmounted.unwrap();

    // No loop device or mount is left behind.
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    let own = own_dir.to_string_lossy();
    assert!(!loops.contains(own.as_ref()), "leaked loop device: {loops}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(own.as_ref()), "leaked mount: {mounts}");
    assert!(!own_dir.exists(), "{own} was not removed");

    // The log: every write is the kernel's (no FUA: the loop device
    // emulates it by a flush), the data of f1 reaches the device, then a
    // flush, then the promise.
    let mark = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::Mark(1)))
        .expect("Mark(1) in the log");
    for e in &events {
        if let EventKind::Write(w) = &e.kind {
            assert_eq!(w.class, KERNEL_WRITE_CLASS);
            assert!(!w.fua, "the loop device does not pass FUA on");
        }
    }
    let first_chunk = &data1[..4096];
    let data_write = events[..mark]
        .iter()
        .position(|e| match &e.kind {
            EventKind::Write(w) => w.data.chunks_exact(4096).any(|c| c == first_chunk),
            _ => false,
        })
        .expect("a write of f1's data before the promise");
    let last_flush = events[..mark]
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::Flush))
        .expect("a flush before the promise");
    assert!(
        data_write < last_flush,
        "f1's data (event {data_write}) is not flushed before the promise (last flush {last_flush})"
    );
    let (writes, fua, flushes) = summary(&events);
    println!(
        "whole run: {writes} writes ({fua} FUA), {flushes} flushes; \
         f1's data at event {data_write}, last flush before the promise {last_flush}, promise {mark}"
    );
    // f2 was written after the promise, never before.
    let f2_chunk = &data2[..4096];
    assert!(!events[..mark].iter().any(|e| matches!(&e.kind,
        EventKind::Write(w) if w.data.chunks_exact(4096).any(|c| c == f2_chunk))));

    // The crash state with exactly what was durable when fsync returned:
    // the base and every write before that flush.
    let image = base.snapshot();
    for e in &events[..last_flush] {
        if let EventKind::Write(w) = &e.kind {
            apply_write(&image, w, None);
        }
    }
    let recovered = ordo_crash::judge::kernel_recover(&image).expect("kernel recovery");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("crash.img");
    ordo_crash::backend::write_image(&recovered, &img).unwrap();
    let got = debugfs_cat(&img, "/f1");
    assert_eq!(got.len(), data1.len(), "f1's size after recovery");
    assert!(got == data1, "f1's bytes after recovery differ");
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck -fn of the recovered crash state: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

#[test]
fn a_failed_mount_leaves_nothing_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // A zeroed device is no ext4: the mount fails after FUSE and the loop
    // device are up, and both must go.
    let base = Arc::new(MemDevice::new(4096, 2048).unwrap());
    let recorder = Recorder::new(base);
    let before = leftovers();
    let err = match KernelExt4::mount(recorder.device(), "") {
        Ok(_) => panic!("a zeroed device mounted as ext4"),
        Err(e) => e.to_string(),
    };
    println!("{err}");
    assert!(err.contains("kernel-ext4"), "{err}");
    let new: Vec<String> = leftovers()
        .into_iter()
        .filter(|l| !before.contains(l))
        .collect();
    assert!(new.is_empty(), "leaked: {new:?}");
}

/// Lines of `losetup -a` and `/proc/mounts` that name a mount of this
/// module.
fn leftovers() -> Vec<String> {
    let loops = Command::new("losetup").arg("-a").output().unwrap().stdout;
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    String::from_utf8_lossy(&loops)
        .lines()
        .chain(mounts.lines())
        .filter(|l| l.contains("ordo-kernel-ext4-") || l.contains("ordo-kernel-disk"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_busy_mount_goes_away_once_released() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let base = base_image();
    let recorder = Recorder::new(base);
    let before = leftovers();
    let k = KernelExt4::mount(recorder.device(), "").unwrap();
    let mut held = std::fs::File::create(k.path().join("held")).unwrap();
    held.write_all(b"still open").unwrap();
    let err = k.unmount().expect_err("unmount with a file open on ext4");
    println!("{err}");
    // Everything is detached: nothing is reachable by name any more ...
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains("ordo-kernel-ext4-"), "{mounts}");
    assert!(!fuse_threads().is_empty(), "the disk is still served");
    // ... and once the file is closed, the kernel lets go of ext4, the loop
    // device and the FUSE connection, and the serving thread ends.
    drop(held);
    let mut new = Vec::new();
    for _ in 0..100 {
        new = leftovers()
            .into_iter()
            .filter(|l| !before.contains(l))
            .collect();
        new.extend(fuse_threads());
        if new.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(new.is_empty(), "leaked: {new:?}");
}

/// Threads of this process that serve a FUSE session.
fn fuse_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("fuser"))
        .map(|c| format!("thread {c}"))
        .collect()
}
