//! Does a slow `fsync` by one process stall reads by another?
//!
//! Mounts a fresh ordo image (in `/var/tmp`, on a real disk, so that a
//! flush costs what a flush costs) with one FUSE worker thread and then
//! with several, and in each measures the latency of small `O_DIRECT`
//! reads (which bypass the kernel's page cache, so each one reaches ordo)
//! and of `stat` calls (the attribute cache is off), first alone and then
//! while another thread creates, writes and `fsync`s files as fast as it
//! can. With one worker, every read queued behind an `fsync` waits for
//! it; with several, reads are served while the flush is in flight.
//!
//! A benchmark, not a test: it prints figures and asserts nothing.
//!
//! ```text
//! cargo run --release -p ordo-fuse --example concurrency [-- SECONDS_PER_PHASE [DIR]]
//! ```
//! Needs root and /dev/fuse.

use std::ffi::CString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_dev::{BlockDevice, FileDevice};
use ordo_fs::mkfs::{mkfs, MkfsOptions};
use ordo_fs::{Fs, MountOptions};
use ordo_fuse::MountConfig;

const IMAGE_BYTES: u64 = 256 << 20;
const BLOCK_BYTES: u32 = 4096;
const READ_FILE_BYTES: usize = 4 << 20;
const READ_BYTES: usize = 4096;
const WRITE_BYTES: usize = 16 << 10;

struct Latencies(Vec<Duration>);

impl Latencies {
    fn summary(&mut self) -> String {
        if self.0.is_empty() {
            return "no samples".to_string();
        }
        self.0.sort();
        let pick = |q: f64| self.0[((self.0.len() - 1) as f64 * q) as usize];
        format!(
            "{:>7} ops  p50 {:>9.1?}  p99 {:>9.1?}  max {:>9.1?}",
            self.0.len(),
            pick(0.5),
            pick(0.99),
            self.0[self.0.len() - 1]
        )
    }
}

/// A 4096-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

fn measure_reads(mnt: &Path, for_how_long: Duration) -> (Latencies, Latencies) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("read-me"))
        .expect("open read-me with O_DIRECT");
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&file);
    let buf = Aligned::new(READ_BYTES);
    let stat_path = CString::new(mnt.join("read-me").to_str().unwrap()).unwrap();
    let mut reads = Latencies(Vec::new());
    let mut stats = Latencies(Vec::new());
    let blocks = (READ_FILE_BYTES / READ_BYTES) as u64;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let end = Instant::now() + for_how_long;
    while Instant::now() < end {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % blocks) * READ_BYTES as u64;
        let t = Instant::now();
        // SAFETY: buf holds READ_BYTES bytes; fd is open.
        let n = unsafe { libc::pread(fd, buf.ptr.cast(), READ_BYTES, off as i64) };
        reads.0.push(t.elapsed());
        assert_eq!(n, READ_BYTES as isize, "O_DIRECT read");
        // SAFETY: zeroed stat, NUL-terminated path.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let t = Instant::now();
        // SAFETY: as above.
        let r = unsafe { libc::stat(stat_path.as_ptr(), &mut st) };
        stats.0.push(t.elapsed());
        assert_eq!(r, 0, "stat");
        std::thread::sleep(Duration::from_micros(200));
    }
    (reads, stats)
}

fn writer(mnt: PathBuf, stop: Arc<AtomicBool>, fsyncs: Arc<AtomicU64>) {
    let data = vec![0x5au8; WRITE_BYTES];
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        use std::io::Write;
        let path = mnt.join(format!("w{}", i % 64));
        let mut f = std::fs::File::create(&path).expect("create");
        f.write_all(&data).expect("write");
        f.sync_all().expect("fsync");
        fsyncs.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
}

fn run_phase(threads: usize, dir: &Path, secs: Duration) {
    let image = dir.join(format!("concurrency-{threads}.img"));
    let mnt = dir.join(format!("mnt-{threads}"));
    std::fs::create_dir_all(&mnt).unwrap();
    let _ = std::fs::remove_file(&image);
    let dev = FileDevice::create(&image, IMAGE_BYTES, BLOCK_BYTES).expect("create image");
    let opts = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(&dev, &opts).expect("mkfs");
    dev.flush().expect("flush");
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).expect("mount"));
    let config = MountConfig {
        threads,
        attr_ttl: Duration::ZERO,
        ..MountConfig::default()
    };
    let session = ordo_fuse::mount(fs.clone(), &mnt, &config).expect("FUSE mount");
    let bg = session.spawn().expect("spawn session");

    std::fs::write(mnt.join("read-me"), vec![7u8; READ_FILE_BYTES]).expect("write read-me");
    let (mut r0, mut s0) = measure_reads(&mnt, secs);
    let stop = Arc::new(AtomicBool::new(false));
    let fsyncs = Arc::new(AtomicU64::new(0));
    let w = {
        let (mnt, stop, fsyncs) = (mnt.clone(), stop.clone(), fsyncs.clone());
        std::thread::spawn(move || writer(mnt, stop, fsyncs))
    };
    std::thread::sleep(Duration::from_millis(100));
    let (mut r1, mut s1) = measure_reads(&mnt, secs);
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();

    println!("FUSE worker threads: {threads}");
    println!("  read 4 KiB, alone:               {}", r0.summary());
    println!("  read 4 KiB, with fsync writer:   {}", r1.summary());
    println!("  stat, alone:                     {}", s0.summary());
    println!("  stat, with fsync writer:         {}", s1.summary());
    println!(
        "  writer: {} create+write {} KiB+fsync in {:.1?}",
        fsyncs.load(Ordering::Relaxed),
        WRITE_BYTES >> 10,
        secs
    );

    bg.umount_and_join().expect("unmount");
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount().expect("Fs::unmount"),
        Err(_) => panic!("file system still referenced after the session ended"),
    }
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_dir(&mnt);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs = Duration::from_secs_f64(
        args.next()
            .map(|s| s.parse().expect("SECONDS_PER_PHASE is a number"))
            .unwrap_or(3.0),
    );
    let base = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".to_string()));
    let dir = base.join(format!("ordo-concurrency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create work directory");
    println!("ordo concurrency benchmark: images in {}", dir.display());
    for threads in [1, 4] {
        run_phase(threads, &dir, secs);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
