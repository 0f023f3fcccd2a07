//! `ordo mount IMAGE MOUNTPOINT [-o OPTIONS]`.
//!
//! Order matters here: every option and both paths are checked before the
//! image is opened, the image is locked before it is read, and the process
//! stays in the foreground so that the end of the FUSE session (whatever
//! caused it: `fusermount3 -u`, Ctrl-C, SIGTERM) is followed by
//! `Fs::unmount`, which leaves the image durable and clean.
//!
//! While mounted, the protocol's statistics are published for `ordo info`
//! (see `stats.rs`); when the mount ends they are printed to stderr and,
//! for `ordo bench`, added to the counters line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use ordo_dev::{BlockDevice, DevError, FileDevice, OpenOptions};
use ordo_fs::Fs;
use ordo_fuse::MountConfig;

use crate::options::{known_options, parse_mount_options, protocol_list, ParsedMount};
use crate::stats::{format_counts, Publisher};
use crate::superblock::SuperblockView;

/// mount(8)'s exit code for a usage error.
pub const EXIT_USAGE: u8 = 1;
/// mount(8)'s exit code for a failed mount.
pub const EXIT_MOUNT_FAILED: u8 = 32;

#[derive(Args, Debug)]
#[command(after_help = format!(
    "Options (-o, comma-separated): {}\n\nProtocols (mode=; without it, as the kernel's ext4 \
mounts the image: fast_commit on an image with that feature, journal (data=ordered) on one \
with a journal, async otherwise):\n{}",
    known_options(),
    protocol_list()
))]
pub struct MountArgs {
    /// The image file or block device.
    pub image: PathBuf,
    /// An existing, empty directory.
    pub mountpoint: PathBuf,
    /// Mount options, e.g. -o mode=sync,commit=5 (may be repeated).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Stay in the foreground until unmounted (by default the mount
    /// detaches once it is live, after reporting any failure).
    #[arg(short = 'f', long)]
    pub foreground: bool,
}

/// Why a mount did not happen.
enum Refusal {
    Usage(String),
    Failed(String),
}

/// The checks that need no image: the paths exist and the mountpoint is
/// an empty directory.
fn check_paths(image: &Path, mountpoint: &Path) -> Result<(), String> {
    match std::fs::metadata(image) {
        Ok(m) if m.is_dir() => {
            return Err(format!("{}: is a directory, not an image", image.display()))
        }
        Ok(_) => {}
        Err(e) => return Err(format!("{}: {e}", image.display())),
    }
    match std::fs::metadata(mountpoint) {
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "mountpoint {}: not a directory",
                mountpoint.display()
            ))
        }
        Ok(_) => {}
        Err(e) => return Err(format!("mountpoint {}: {e}", mountpoint.display())),
    }
    let mut entries = std::fs::read_dir(mountpoint)
        .map_err(|e| format!("mountpoint {}: {e}", mountpoint.display()))?;
    if entries.next().is_some() {
        return Err(format!(
            "mountpoint {}: directory is not empty",
            mountpoint.display()
        ));
    }
    Ok(())
}

fn open_image(
    image: &Path,
    parsed: &ParsedMount,
) -> Result<(Arc<Fs>, Arc<dyn BlockDevice>), String> {
    let sb = SuperblockView::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let mut opts = if parsed.fs.read_only {
        OpenOptions::read_only()
    } else {
        OpenOptions::read_write()
    };
    // Buffered even on a block device: with O_DIRECT, a RWF_DSYNC write to
    // a device without native FUA (a loop device) costs a second flush
    // from the sync after the write, and the kernel then counts flushes
    // ordo never asked for. Buffered, bytes and flushes agree with
    // `/sys/block/*/stat` (see docs/BENCH.md).
    opts.direct = false;
    let dev = FileDevice::open(image, sb.block_size, opts).map_err(|e| match e {
        DevError::InUse { .. } => format!("{e} (is it mounted already?)"),
        e => e.to_string(),
    })?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let fs = Fs::mount(dev.clone(), parsed.fs.clone())
        .map_err(|e| format!("{}: cannot mount: {e}", image.display()))?;
    Ok((Arc::new(fs), dev))
}

fn mount(a: &MountArgs, detached: &mut Option<crate::daemon::Detached>) -> Result<(), Refusal> {
    let mut parsed = parse_mount_options(&a.options).map_err(Refusal::Usage)?;
    check_paths(&a.image, &a.mountpoint).map_err(Refusal::Failed)?;
    let sb = SuperblockView::read(&a.image)
        .map_err(|e| Refusal::Failed(format!("{}: {e}", a.image.display())))?;
    parsed
        .resolve_mode(sb.feature_compat)
        .map_err(Refusal::Usage)?;
    // One malloc arena for the whole process (glibc's M_ARENA_MAX), set
    // before any thread exists. With an arena per worker thread, block
    // images allocated as the cache fills grew each worker's heap a page
    // at a time, one mprotect(2) per page (about four per created file);
    // the main arena grows by brk(2) with 128 KiB of padding. Allocation
    // in the core happens under its one lock anyway, so the workers lose
    // nothing by sharing the arena (DESIGN.md, "The FUSE path").
    // SAFETY: mallopt only sets a tunable of the C allocator; nothing has
    // allocated from another thread yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    // Detach before any thread exists (the mount's commit thread, FUSE's
    // workers): the parent waits until the mount is live or has failed.
    if !a.foreground {
        *detached = Some(crate::daemon::Detached::fork().map_err(Refusal::Failed)?);
    }
    // After the fork: the pool's refiller is a thread.
    if !crate::start_image_pool(parsed.fs.cache_bytes) {
        eprintln!("ordo mount: the block-image pool did not start (no address space or no thread for it); block images come from the system allocator");
    }
    let (fs, dev) = open_image(&a.image, &parsed).map_err(Refusal::Failed)?;
    // Before the FUSE mount, so that the file exists once the mount shows.
    let publisher = Publisher::start(&a.image, &a.mountpoint, &fs);
    let config = MountConfig {
        threads: parsed.threads(),
        direct_io_on_create: parsed.direct_create,
        open_requests: parsed.open_requests,
        io_uring: parsed.io_uring,
        readers_on_demand: parsed.readers_on_demand,
        fsync_threads: parsed.fsync_threads(),
        allow_other: true,
        read_only: parsed.fs.read_only,
        attr_ttl: parsed.attr_ttl,
        // The source as mount(8) shows it for a block-device file system.
        fsname: std::fs::canonicalize(&a.image)
            .unwrap_or_else(|_| a.image.clone())
            .display()
            .to_string(),
    };
    let session = match ordo_fuse::mount(fs.clone(), &a.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            // The image was opened: close it cleanly before giving up.
            let msg = format!("{}: FUSE mount failed: {e}", a.mountpoint.display());
            let stats = fs.protocol_stats().1;
            let unmounted = finish(fs);
            publisher.end(stats, unmounted.is_ok());
            return Err(Refusal::Failed(match unmounted {
                Ok(()) => msg,
                Err(u) => format!("{msg}; {u}"),
            }));
        }
    };
    let mut session = session;
    if let Err(e) = ordo_fuse::set_readahead(&a.mountpoint, parsed.readahead_kib) {
        eprintln!(
            "ordo mount: cannot set the readahead window to {} KiB ({e}); the kernel's stays",
            parsed.readahead_kib
        );
    }
    unmount_on_signals(&mut session, &a.mountpoint, "ordo mount");
    if parsed.io_uring && !session.io_uring() {
        eprintln!("ordo mount: {}", ordo_fuse::IO_URING_NOT_OFFERED);
    }
    let transport = session.transport_stats();
    eprintln!(
        "ordo: {} mounted on {} (mode={}{}, {} threads{}); unmount with: umount {}",
        a.image.display(),
        a.mountpoint.display(),
        parsed.fs.mode.name(),
        if parsed.fs.read_only { ",ro" } else { "" },
        parsed.threads(),
        if session.io_uring() { ", io_uring" } else { "" },
        a.mountpoint.display()
    );
    if let Some(d) = detached.as_mut() {
        // Live: let the parent exit 0 and stop writing to its terminal.
        d.live();
    }
    let refresher = publisher.refresh_in_background(fs.clone());
    let served = session.run();
    // The thread lets go of the file system before it is unmounted. The
    // figures are those of the session: the unmount's own commit is not in
    // them, as `ordo bench` reads the kernel's before its umount.
    let publisher = refresher.stop();
    let (mode, stats) = fs.protocol_stats();
    let unmounted = finish(fs);
    if let Some(p) = publisher {
        p.end(stats.clone(), unmounted.is_ok());
    }
    eprint!(
        "ordo: protocol statistics of the mount of {} (mode={mode}):\n{}",
        a.image.display(),
        format_counts(&mode, &stats.iter().cloned().collect())
    );
    report_counters(&*dev, &mode, &stats);
    if let Some(p) = crate::image_pool_stats() {
        eprintln!("ordo: {}", crate::stats::image_pool_line(&p).trim_start());
    }
    if parsed.io_uring {
        eprintln!(
            "ordo: {} requests served through io_uring (by {} of its per-CPU queues)",
            transport
                .ring_requests
                .load(std::sync::atomic::Ordering::Relaxed),
            transport
                .ring_queues
                .load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    if let Err(e) = &served {
        eprintln!("ordo mount: FUSE session ended with an error: {e}");
    }
    unmounted.map_err(Refusal::Failed)?;
    served.map_err(|e| Refusal::Failed(e.to_string()))
}

/// With `ORDO_COUNTERS_OUT=FILE` in the environment (set by `ordo bench`),
/// append the device's counters for the whole mount, unmount included, to
/// FILE as one JSON line: the benchmark sets them beside the kernel's
/// counters of the same device. The line also holds the protocol's
/// statistics under `"protocol"` (`{"mode": ..., "stats": {...}}`, see
/// `ordo_bench::commits`); readers of the older line ignore it.
fn report_counters(dev: &dyn BlockDevice, mode: &str, stats: &[(String, u64)]) {
    let Some(path) = std::env::var_os("ORDO_COUNTERS_OUT") else {
        return;
    };
    let line = serde_json::to_value(dev.counters()).and_then(|mut v| {
        let protocol = ordo_bench::commits::ProtocolStats::from_pair(mode, stats);
        if let serde_json::Value::Object(m) = &mut v {
            m.insert(
                ordo_bench::commits::COUNTERS_LINE_KEY.to_string(),
                serde_json::to_value(protocol)?,
            );
        }
        serde_json::to_string(&v)
    });
    let written = line.map_err(std::io::Error::other).and_then(|line| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        writeln!(f, "{line}")
    });
    if let Err(e) = written {
        eprintln!(
            "ordo mount: cannot write counters to {}: {e}",
            std::path::Path::new(&path).display()
        );
    }
}

/// Make SIGINT and SIGTERM unmount `session`'s mount, so that its
/// `run` returns and the server finishes as after `umount`. A busy mount
/// is retried, then detached ([`ordo_fuse::unmount`]); what happened goes
/// to stderr as `program: ...`.
pub(crate) fn unmount_on_signals<FS: fuser::Filesystem>(
    session: &mut fuser::Session<FS>,
    mountpoint: &Path,
    program: &'static str,
) {
    let mut unmounter = ordo_fuse::unmount::SignalUnmounter::new(session, mountpoint);
    if let Err(e) = ctrlc::set_handler(move || unmounter.unmount_and_report(program)) {
        eprintln!("{program}: cannot handle Ctrl-C/SIGTERM: {e}");
    }
}

/// Unmount the file system once every FUSE worker has let go of it.
fn finish(fs: Arc<Fs>) -> Result<(), String> {
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs
            .unmount()
            .map_err(|e| format!("unmount failed, image may need fsck: {e}")),
        Err(_) => Err("file system still in use after the FUSE session ended".to_string()),
    }
}

/// Run `ordo mount`; returns the exit code.
pub fn run(a: &MountArgs) -> u8 {
    let mut detached = None;
    let code = match mount(a, &mut detached) {
        Ok(()) => 0,
        Err(Refusal::Usage(m)) => {
            eprintln!("ordo mount: {m}");
            EXIT_USAGE
        }
        Err(Refusal::Failed(m)) => {
            eprintln!("ordo mount: {m}");
            EXIT_MOUNT_FAILED
        }
    };
    // A detached child that failed before the mount was live: its parent,
    // still waiting, exits with the code (the message went to the same
    // terminal).
    if let Some(d) = detached {
        d.finish(code);
    }
    code
}
