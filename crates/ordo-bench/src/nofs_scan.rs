//! `ordo bench nofs-scan`: NoFS's Figure 6(b) as far as ordo has it, the
//! cost of the scanners that rebuild allocation state after a crash, and
//! the mount after a crash beside `journal`'s mount with its replay.
//!
//! NoFS (FAST '12, §5.2.3) scans in the background at a configured rate
//! while the file system is in use; ordo's `mode=backpointers` runs its
//! scanners in one pass before the first operation that may allocate (or
//! at once, [`Fs::scan_to_end`]), so what is measured is that pass: Figure
//! 6(a) (write bandwidth while a scan runs), 6(c) (the sequential block
//! scanner's rate) and 6(d) (`ls -li` of unverified inodes) have no
//! counterpart.
//!
//! For each amount of data (1 MiB files, as the paper's, 100 per
//! directory) and each protocol, in process and without root:
//!
//! 1. a fresh sparse image file of `--size` (default 1 GiB) is made with
//!    the protocol's mkfs features, mounted, filled, `sync`ed, and the
//!    `Fs` dropped without an unmount: a crash with everything durable
//!    and the image marked in use (backpointers: the scanners must run;
//!    journal: committed transactions are left in the log);
//! 2. a sparse copy of it is mounted on the timing model (`--disk`,
//!    default the 7200-rpm HDD), cold: the mount's virtual time, then
//!    `scan_to_end`'s; the copy is unmounted cleanly and mounted again for
//!    the clean mount's time;
//! 3. the image itself is mounted from the file with the host's page
//!    cache dropped (root; otherwise the image's pages may be cached, and
//!    the report says so): the same two wall-clock times;
//! 4. the image is unmounted and checked (`ordo fsck`, read-only): the
//!    scan must leave a consistent file system.
//!
//! Deterministic in virtual time; the wall-clock columns depend on the
//! machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ordo_dev::{BlockDevice, DiskModel, FileDevice, OpenOptions, TimedDevice};
use ordo_fs::fsck::{self, FsckOptions};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Fs, MountOptions, ProtocolKind};
use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::sys;
use crate::vfs::{mkdir_all, LibVfs, Vfs};
use crate::workload::{pattern, Scale};

/// Block size of the images.
const BLOCK_SIZE: u32 = 4096;
/// Each file's size (the paper's: "all the data ... in units of 1 MB
/// files").
const FILE_BYTES: usize = 1 << 20;
/// Files per directory.
const FILES_PER_DIR: u64 = 100;
/// The goal of the issue: full validation of a 1 GiB image within this
/// much virtual time.
pub const GOAL_SECS: f64 = 10.0;
/// The image size the goal is stated for.
pub const GOAL_IMAGE_BYTES: u64 = 1 << 30;
/// Where the host's page cache is dropped.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

fn err(detail: impl Into<String>) -> BenchError {
    BenchError::Workload {
        workload: "nofs-scan".into(),
        detail: detail.into(),
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ScanSuite {
    /// Sizes of the data points.
    pub scale: Scale,
    /// Seed of the file contents.
    pub seed: u64,
    /// Image size.
    pub image_bytes: u64,
    /// The timing model.
    pub disk: DiskModel,
    /// The timing model's name, for the report.
    pub disk_name: String,
    /// Where images are made.
    pub workdir: PathBuf,
    /// Protocols, in order (default backpointers, journal).
    pub modes: Vec<ProtocolKind>,
    /// Drop the host's page cache before the wall-clock mount (needs
    /// root; the tests leave the machine's cache alone).
    pub drop_host_cache: bool,
}

/// The data points of `scale` on an image of `image_bytes`, MiB: empty,
/// and up to about seven eighths of the image (the paper's largest point
/// is 1 GB; a 1 GiB image holds 896 MiB of 1 MiB files with room to
/// spare).
pub fn data_points(scale: Scale, image_bytes: u64) -> Vec<u64> {
    let cap = (image_bytes >> 20) * 7 / 8;
    let pts: &[u64] = match scale {
        Scale::Smoke => &[0, 16],
        Scale::Small => &[0, 256],
        Scale::Medium => &[0, 256, 512],
        Scale::Paper => &[0, 256, 512, 768, 896],
    };
    let mut v: Vec<u64> = pts.iter().map(|&p| p.min(cap)).collect();
    v.dedup();
    v
}

/// One measurement: a protocol, an amount of data.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScanRun {
    /// The protocol.
    pub mode: String,
    /// Image size, MiB.
    pub image_mib: u64,
    /// Data on the image, MiB (1 MiB files).
    pub data_mib: u64,
    /// Files (and directories) written before the crash.
    pub files: u64,
    /// The mount after the crash on the model (journal: its replay), s.
    pub mount_s: f64,
    /// `scan_to_end` on the model (0 without scanners), s.
    pub scan_s: f64,
    /// Mount and scan: the time before the first operation can allocate.
    pub total_s: f64,
    /// A mount of the same image after a clean unmount, on the model, s.
    pub clean_mount_s: f64,
    /// Blocks read from the model by the crash mount and by the scan.
    pub mount_read_blocks: u64,
    /// Blocks the scan read.
    pub scan_read_blocks: u64,
    /// Blocks the scan wrote (bitmaps and counters rebuilt).
    pub scan_write_blocks: u64,
    /// The same mount, wall clock, image file, cold host cache, s.
    pub wall_mount_s: f64,
    /// The same scan, wall clock, s.
    pub wall_scan_s: f64,
    /// Whether the host cache was dropped before the wall-clock mount.
    pub wall_cold: bool,
    /// ordo fsck after the scan and a clean unmount: clean?
    pub fsck_clean: bool,
    /// The first problems fsck reported, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fsck_problems: Vec<String>,
    /// The protocol's statistics after the scan (`nofs_*` for
    /// backpointers).
    pub stats: Vec<(String, u64)>,
    /// Set when the run failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ScanRun {
    /// A protocol statistic by name.
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.stats.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

fn mount_opts(mode: ProtocolKind) -> MountOptions {
    MountOptions {
        mode,
        // No timer thread: the scanners and the write-back run when this
        // code says (and the model's clock has one user).
        background: false,
        ..MountOptions::default()
    }
}

fn open_dev(path: &Path) -> Result<Arc<FileDevice>> {
    FileDevice::open(path, BLOCK_SIZE, OpenOptions::default())
        .map(Arc::new)
        .map_err(|e| err(format!("open {}: {e}", path.display())))
}

/// Makes the image and leaves it crashed with `data_mib` of 1 MiB files.
fn crashed_image(
    path: &Path,
    bytes: u64,
    mode: ProtocolKind,
    data_mib: u64,
    seed: u64,
) -> Result<u64> {
    let f = std::fs::File::create(path).map_err(|e| BenchError::io("create", path, e))?;
    f.set_len(bytes)
        .map_err(|e| BenchError::io("truncate", path, e))?;
    drop(f);
    let dev = open_dev(path)?;
    let features = parse_features(mode.spec().mkfs_features, DEFAULT_FEATURES)
        .map_err(|e| err(format!("mkfs features of {mode}: {e}")))?;
    let opts = MkfsOptions {
        features,
        seed: Some(seed),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).map_err(|e| err(format!("mkfs: {e}")))?;
    let fs = Arc::new(
        Fs::mount(dev.clone() as Arc<dyn BlockDevice>, mount_opts(mode))
            .map_err(|e| err(format!("mount {mode}: {e}")))?,
    );
    let files = data_mib * (1 << 20) / FILE_BYTES as u64;
    {
        let vfs = LibVfs::new(fs.clone(), None);
        mkdir_all(&vfs, "data")?;
        let buf = pattern(FILE_BYTES, seed);
        for i in 0..files {
            let dir = format!("data/d{}", i / FILES_PER_DIR);
            if i % FILES_PER_DIR == 0 {
                vfs.mkdir(&dir)?;
            }
            let f = vfs.create(&format!("{dir}/f{i}"))?;
            f.write_at(0, &buf)?;
        }
    }
    fs.sync().map_err(|e| err(format!("sync: {e}")))?;
    // The crash: no unmount. Everything is durable; the image is marked
    // in use (and, under a journal, its log holds the committed work).
    drop(fs);
    dev.flush()
        .map_err(|e| err(format!("flush {}: {e}", path.display())))?;
    Ok(files)
}

/// Blocks read and written so far on `dev`.
fn io_blocks(dev: &FileDevice) -> (u64, u64) {
    let c = dev.counters();
    let r: u64 = c.by_class.iter().map(|k| k.read_bytes).sum();
    let w: u64 = c.by_class.iter().map(|k| k.write_bytes).sum();
    (r / BLOCK_SIZE as u64, w / BLOCK_SIZE as u64)
}

/// Runs one point. `fill` failures and the measurement's are the row's
/// error.
fn run_point(suite: &ScanSuite, dir: &Path, mode: ProtocolKind, data_mib: u64) -> Result<ScanRun> {
    let image = dir.join("image");
    let copy = dir.join("image.model");
    let mut run = ScanRun {
        mode: mode.name().to_string(),
        image_mib: suite.image_bytes >> 20,
        data_mib,
        ..ScanRun::default()
    };
    run.files = crashed_image(&image, suite.image_bytes, mode, data_mib, suite.seed)?;
    sys::run(
        Command::new("cp")
            .arg("--sparse=always")
            .arg(&image)
            .arg(&copy),
    )?;

    // On the model, cold (a fresh Fs has an empty cache).
    {
        let dev = open_dev(&copy)?;
        let timed =
            Arc::new(TimedDevice::new(dev.clone(), suite.disk).map_err(|e| err(e.to_string()))?);
        let t0 = timed.virtual_time_ns();
        let (r0, _) = io_blocks(&dev);
        let fs = Fs::mount(timed.clone() as Arc<dyn BlockDevice>, mount_opts(mode))
            .map_err(|e| err(format!("mount after the crash: {e}")))?;
        let t1 = timed.virtual_time_ns();
        let (r1, w1) = io_blocks(&dev);
        fs.scan_to_end()
            .map_err(|e| err(format!("scan_to_end: {e}")))?;
        let t2 = timed.virtual_time_ns();
        let (r2, w2) = io_blocks(&dev);
        run.mount_s = (t1 - t0) as f64 / 1e9;
        run.scan_s = (t2 - t1) as f64 / 1e9;
        run.total_s = run.mount_s + run.scan_s;
        run.mount_read_blocks = r1 - r0;
        run.scan_read_blocks = r2 - r1;
        run.scan_write_blocks = w2 - w1;
        run.stats = fs.protocol_stats().1;
        fs.unmount()
            .map_err(|e| err(format!("unmount after the scan: {e}")))?;
        let t3 = timed.virtual_time_ns();
        let fs = Fs::mount(timed.clone() as Arc<dyn BlockDevice>, mount_opts(mode))
            .map_err(|e| err(format!("mount after a clean unmount: {e}")))?;
        run.clean_mount_s = (timed.virtual_time_ns() - t3) as f64 / 1e9;
        fs.unmount()
            .map_err(|e| err(format!("clean unmount: {e}")))?;
    }
    let _ = std::fs::remove_file(&copy);

    // Wall clock on the image file.
    run.wall_cold = suite.drop_host_cache && std::fs::write(DROP_CACHES, "1").is_ok();
    {
        let dev = open_dev(&image)?;
        let t0 = Instant::now();
        let fs = Fs::mount(dev.clone() as Arc<dyn BlockDevice>, mount_opts(mode))
            .map_err(|e| err(format!("mount after the crash (wall clock): {e}")))?;
        let t1 = Instant::now();
        fs.scan_to_end()
            .map_err(|e| err(format!("scan_to_end (wall clock): {e}")))?;
        run.wall_mount_s = (t1 - t0).as_secs_f64();
        run.wall_scan_s = t1.elapsed().as_secs_f64();
        fs.unmount()
            .map_err(|e| err(format!("unmount after the scan (wall clock): {e}")))?;
        let report = fsck::check(dev.as_ref(), &FsckOptions::default())
            .map_err(|e| err(format!("fsck: {e}")))?;
        run.fsck_clean = report.is_clean();
        run.fsck_problems = report
            .problems
            .iter()
            .take(5)
            .map(|p| format!("{p:?}"))
            .collect();
    }
    Ok(run)
}

impl ScanSuite {
    /// Every point of every protocol; `on_run` sees each as it is done.
    pub fn run(&self, mut on_run: impl FnMut(&ScanRun)) -> Result<Vec<ScanRun>> {
        std::fs::create_dir_all(&self.workdir)
            .map_err(|e| BenchError::io("mkdir", &self.workdir, e))?;
        let mut out = Vec::new();
        for &data_mib in &data_points(self.scale, self.image_bytes) {
            for &mode in &self.modes {
                let dir = self.workdir.join(format!(
                    "{}-nofs-scan-{}-{data_mib}",
                    std::process::id(),
                    mode.name()
                ));
                std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("mkdir", &dir, e))?;
                let run = run_point(self, &dir, mode, data_mib).unwrap_or_else(|e| ScanRun {
                    mode: mode.name().to_string(),
                    image_mib: self.image_bytes >> 20,
                    data_mib,
                    error: Some(e.to_string()),
                    ..ScanRun::default()
                });
                let _ = std::fs::remove_dir_all(&dir);
                on_run(&run);
                out.push(run);
            }
        }
        Ok(out)
    }
}

fn secs(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// The report: the table, then the goal.
pub fn report(runs: &[ScanRun], suite: &ScanSuite) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "NoFS Figure 6(b): the scan after a crash, and the mount after a crash. Image {} MiB, \
data in 1 MiB files; virtual time on the {} model (cold), wall clock on the image file{}.",
        suite.image_bytes >> 20,
        suite.disk_name,
        if runs.iter().all(|r| r.wall_cold || r.error.is_some()) {
            " (host page cache dropped)"
        } else {
            " (host page cache NOT dropped)"
        }
    );
    let _ = writeln!(s);
    let head = format!(
        "{:<13} {:>8} {:>6} {:>10} {:>9} {:>10} {:>11} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6}",
        "protocol",
        "data MiB",
        "files",
        "mount s",
        "scan s",
        "total s",
        "clean mnt s",
        "scan rd MiB",
        "inodes scn",
        "wall mnt",
        "wall scan",
        "claimed",
        "fsck"
    );
    let _ = writeln!(s, "{head}");
    let _ = writeln!(s, "{}", "-".repeat(head.chars().count()));
    for r in runs {
        if let Some(e) = &r.error {
            let _ = writeln!(s, "{:<13} {:>8} FAILED: {e}", r.mode, r.data_mib);
            continue;
        }
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let _ = writeln!(
            s,
            "{:<13} {:>8} {:>6} {:>10} {:>9} {:>10} {:>11} {:>10.1} {:>10} {:>9} {:>9} {:>8} {:>6}",
            r.mode,
            r.data_mib,
            r.files,
            secs(r.mount_s),
            secs(r.scan_s),
            secs(r.total_s),
            secs(r.clean_mount_s),
            r.scan_read_blocks as f64 * BLOCK_SIZE as f64 / (1 << 20) as f64,
            opt(r.stat("nofs_inodes_scanned")),
            secs(r.wall_mount_s),
            secs(r.wall_scan_s),
            opt(r.stat("nofs_blocks_claimed")),
            if r.fsck_clean { "clean" } else { "ERRORS" }
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "mount s: Fs::mount of the crashed image (journal: with its replay); scan s: Fs::scan_to_end \
(the metadata scanner, the name walk, the data scanner; none under journal); total: both, the \
time before the first operation that allocates; clean mnt s: a mount after a clean unmount; \
scan rd MiB: what the scan read; inodes scn, claimed: nofs_inodes_scanned and \
nofs_blocks_claimed; wall: the same on the image file; fsck: ordo fsck after the scan and an \
unmount."
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Paper (Seagate Barracuda 160 GB, background scan without a break): about 90 s on an \
empty file system, about 140 s with 1 GB of data; mount time not given (NoFS has no recovery \
pass at mount)."
    );
    // The goal, on the largest point of backpointers.
    let bp: Vec<&ScanRun> = runs
        .iter()
        .filter(|r| r.mode == "backpointers" && r.error.is_none())
        .collect();
    if let Some(full) = bp.iter().max_by_key(|r| r.data_mib) {
        let _ = writeln!(s);
        let met = full.total_s < GOAL_SECS;
        let image = if suite.image_bytes == GOAL_IMAGE_BYTES {
            "the 1 GiB image".to_string()
        } else {
            format!(
                "a {} MiB image (the goal is stated for 1 GiB: run with --size 1G)",
                suite.image_bytes >> 20
            )
        };
        let _ = writeln!(
            s,
            "Goal: full validation of a 1 GiB image in under {GOAL_SECS:.0} s of virtual time. \
Measured on {image} holding {} MiB: mount {} s + scan {} s = {} s: {}.",
            full.data_mib,
            secs(full.mount_s),
            secs(full.scan_s),
            secs(full.total_s),
            if met { "MET" } else { "NOT MET" }
        );
        let mounts: Vec<f64> = bp.iter().map(|r| r.mount_s).collect();
        let (lo, hi) = mounts
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
        let _ = writeln!(
            s,
            "backpointers' mount after a crash: {} to {} s over the data points (no recovery pass; \
the scan is separate).",
            secs(lo),
            secs(hi)
        );
        let jn: Vec<&ScanRun> = runs
            .iter()
            .filter(|r| r.mode == "journal" && r.error.is_none())
            .collect();
        if !jn.is_empty() {
            let (lo, hi) = jn.iter().fold((f64::MAX, 0.0f64), |(lo, hi), r| {
                (lo.min(r.mount_s), hi.max(r.mount_s))
            });
            let _ = writeln!(
                s,
                "journal's mount after a crash (with its replay): {} to {} s.",
                secs(lo),
                secs(hi)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_points_fit_the_image() {
        assert_eq!(
            data_points(Scale::Paper, 1 << 30),
            vec![0, 256, 512, 768, 896]
        );
        assert_eq!(data_points(Scale::Small, 256 << 20), vec![0, 224]);
        assert_eq!(data_points(Scale::Smoke, 1 << 30), vec![0, 16]);
    }

    #[test]
    fn a_crashed_backpointers_image_is_scanned_and_left_clean() {
        let dir = tempfile::tempdir().unwrap();
        let suite = ScanSuite {
            scale: Scale::Smoke,
            seed: 1,
            image_bytes: 128 << 20,
            disk: DiskModel::hdd_7200(),
            disk_name: "hdd".into(),
            workdir: dir.path().to_path_buf(),
            modes: vec![
                ProtocolKind::named("backpointers"),
                ProtocolKind::named("journal"),
            ],
            drop_host_cache: false,
        };
        let runs = suite.run(|_| {}).unwrap();
        assert_eq!(runs.len(), 4);
        for r in &runs {
            assert!(r.error.is_none(), "{r:?}");
            assert!(r.fsck_clean, "{r:?}");
            assert!(r.mount_s > 0.0, "{r:?}");
        }
        let bp = runs
            .iter()
            .find(|r| r.mode == "backpointers" && r.data_mib == 16)
            .unwrap();
        assert_eq!(bp.files, 16);
        assert!(
            bp.scan_s > 0.0 && bp.stat("nofs_scans") == Some(1),
            "{bp:?}"
        );
        assert!(
            bp.stat("nofs_blocks_claimed").unwrap() >= 16 * 256,
            "{bp:?}"
        );
        let jn = runs
            .iter()
            .find(|r| r.mode == "journal" && r.data_mib == 16)
            .unwrap();
        assert_eq!(jn.scan_s, 0.0, "no scanners under journal");
        assert!(report(&runs, &suite).contains("Goal:"));
    }
}
