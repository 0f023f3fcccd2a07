//! Targets: the file systems a workload runs on, each on a fresh device.
//!
//! | name | what |
//! | --- | --- |
//! | `ext4:ordered`, `ext4:fast_commit`, `ext4:journal`, `ext4:nobarrier` | the kernel's ext4 on `/dev/loopN` over a fresh image: `data=ordered`, `-O fast_commit`, `data=journal`, `data=ordered,nobarrier` |
//! | `tmpfs` | the memory-speed bound (no device) |
//! | `fuse-floor[,open_requests=off][,io_uring][,readers=all]` | the FUSE floor: `ordo fuse-floor`, a FUSE server that stores nothing, with ordo's session (no device); with `open_requests=off` it answers OPEN with ENOSYS, as ordo with that option; with `io_uring` it is served through FUSE over io_uring, as ordo with `-o io_uring`; with `readers=all` every worker reads requests, as ordo with `-o readers=all` |
//! | `ordo:MODE[,OPT=V...]` | ordo through FUSE: the `ordo` binary serving `/dev/loopN` (or an image file with `--device file`), `-o mode=MODE,OPT=V...` |
//! | `ordo-lib:MODE[,data=D][,sched=P][,nobarrier][,fuse]` | ordo in this process through the library, optionally on a timing model (`--disk`) and through the I/O scheduler (`sched=fifo|clook|sptf|random[:SEED]`), with `nobarrier` issuing no flush and no FUA (`-o nobarrier`); with `fuse`, this process also serves it through FUSE on the mount point, so that programs (sqlite3, git) run on the timing model |
//!
//! Every case gets a fresh image of the same size. The measurement window is
//! the same for every target with a device: setup runs in one mount; the
//! file system is unmounted, the kernel's counters for the device are read,
//! it is mounted again, the workload runs, it is unmounted, and the counters
//! are read again. So deferred write-back is charged to the workload that
//! caused it, nothing of the setup is, and every target pays one mount and
//! one unmount. ordo's own counters cover the same window: the device is
//! opened at that mount and its counters are read after that unmount.
//! tmpfs and the FUSE floor are not remounted (they would lose the setup's
//! files); the floor's CPU time and peak memory are measured from the start
//! of the window all the same.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_dev::{BlockDevice, DiskModel, FileDevice, OpenOptions, TimedDevice, BLOCK_CLASS_COUNT};
use ordo_format::le::{u16_at, u32_at};
use ordo_format::superblock::{off as sb_off, EXT4_MAGIC, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use ordo_fs::{DataMode, Fs, MountOptions, ProtocolKind};
use serde::{Deserialize, Serialize};

use crate::commits::{CommitCounts, KernelCommitStats, ProtocolStats};
use crate::error::{BenchError, Result};
use crate::sys::{self, BlockStat};
use crate::vfs::{lib_device, BenchClock, LibVfs, PosixVfs, Vfs};

/// How long a FUSE mount may take to appear.
const MOUNT_WAIT: Duration = Duration::from_secs(60);
/// How long `ordo mount` may take to exit after `fusermount3 -u` (it makes
/// everything durable first).
const UNMOUNT_WAIT: Duration = Duration::from_secs(600);
/// Environment variable naming the file `ordo mount` appends its device
/// counters to (one JSON line) when it unmounts.
pub const COUNTERS_ENV: &str = "ORDO_COUNTERS_OUT";

/// The kernel's ext4 modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext4Mode {
    /// `data=ordered` (the default).
    Ordered,
    /// `mkfs.ext4 -O fast_commit`, `data=ordered`.
    FastCommit,
    /// `data=journal`.
    Journal,
    /// `data=ordered,nobarrier`: no cache flushes.
    Nobarrier,
}

/// What a target is.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetKind {
    /// The kernel's ext4 on a loop device.
    Ext4(Ext4Mode),
    /// tmpfs.
    Tmpfs,
    /// The FUSE floor: `ordo fuse-floor`, a FUSE server with ordo's session
    /// (threads, mount options, capabilities, TTLs) that stores nothing,
    /// so that what any FUSE file system pays per request shows apart from
    /// what ordo does. `fuse-floor,open_requests=off` answers OPEN with
    /// ENOSYS as ordo does with that option, so that the kernel opens files
    /// itself for both.
    FuseFloor {
        /// OPEN and RELEASE are served (the default).
        open_requests: bool,
        /// Served through FUSE over io_uring (`fuse-floor,io_uring`), as
        /// ordo with `-o io_uring`.
        io_uring: bool,
        /// Every worker reads requests (`fuse-floor,readers=all`), as ordo
        /// with `-o readers=all`; by default one reads while it runs.
        readers_all: bool,
    },
    /// ordo through FUSE with these `-o` options (starting with `mode=`).
    Ordo {
        /// The `-o` list.
        options: String,
        /// The protocol.
        mode: ProtocolKind,
    },
    /// ordo in this process.
    OrdoLib {
        /// The protocol.
        mode: ProtocolKind,
        /// JBD2 data mode.
        data: DataMode,
        /// Commit interval in seconds (`commit=`); `None`: the library's
        /// default.
        commit_s: Option<u64>,
        /// The I/O scheduler (`sched=`); `None`: plans issued in order.
        sched: Option<ordo_dev::Policy>,
        /// What a plain fsync means (`fsync=dsync|osync`).
        fsync: ordo_fs::FsyncMeaning,
        /// Also served through FUSE by this process (`fuse`).
        fuse: bool,
        /// Flushes and FUA reach the device; `nobarrier` drops them
        /// ([`MountOptions::barrier`]), as the papers' file systems ran.
        barrier: bool,
    },
}

/// A target as named on the command line.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSpec {
    /// The name, as given.
    pub name: String,
    /// What it is.
    pub kind: TargetKind,
}

/// The names `--targets` accepts, for messages (the modes from the
/// protocol registry).
pub fn target_names() -> String {
    let modes: Vec<&str> = ProtocolKind::all().map(|k| k.name()).collect();
    format!(
        "ext4:ordered, ext4:fast_commit, ext4:journal, ext4:nobarrier, tmpfs, fuse-floor[,open_requests=off][,io_uring][,readers=all], \
ordo:MODE[,OPT=V...], ordo:all[,OPT=V...] (every MODE), ordo-lib:MODE[,data=D][,commit=S][,sched=fifo|clook|sptf|random[:SEED]][,fsync=dsync|osync][,nobarrier][,fuse] (MODE: {})",
        modes.join(", ")
    )
}

impl std::str::FromStr for TargetSpec {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<TargetSpec> {
        let bad = |why: String| {
            BenchError::Usage(format!("target '{s}': {why} (known: {})", target_names()))
        };
        let kind = match s.split_once(':') {
            None if s == "tmpfs" => TargetKind::Tmpfs,
            None if s.split(',').next() == Some("fuse-floor") => {
                let mut open_requests = true;
                let mut io_uring = false;
                let mut readers_all = false;
                for opt in s.split(',').skip(1) {
                    match opt {
                        "open_requests=off" => open_requests = false,
                        "io_uring" => io_uring = true,
                        "readers=all" => readers_all = true,
                        _ => return Err(bad(format!("unknown fuse-floor option '{opt}'"))),
                    }
                }
                TargetKind::FuseFloor {
                    open_requests,
                    io_uring,
                    readers_all,
                }
            }
            Some(("ext4", m)) => TargetKind::Ext4(match m {
                "ordered" => Ext4Mode::Ordered,
                "fast_commit" => Ext4Mode::FastCommit,
                "journal" => Ext4Mode::Journal,
                "nobarrier" => Ext4Mode::Nobarrier,
                _ => return Err(bad(format!("unknown ext4 mode '{m}'"))),
            }),
            Some(("ordo", rest)) => {
                let mode_name = rest.split(',').next().unwrap_or("");
                let mode = mode_name.parse::<ProtocolKind>().map_err(bad)?;
                TargetKind::Ordo {
                    options: format!("mode={rest}"),
                    mode,
                }
            }
            Some(("ordo-lib", rest)) => {
                let mut parts = rest.split(',');
                let mode = parts
                    .next()
                    .unwrap_or("")
                    .parse::<ProtocolKind>()
                    .map_err(bad)?;
                let mut data = DataMode::default();
                let mut commit_s = None;
                let mut sched = None;
                let mut fsync = ordo_fs::FsyncMeaning::default();
                let mut fuse = false;
                let mut barrier = true;
                for opt in parts {
                    if opt == "fuse" {
                        fuse = true;
                        continue;
                    }
                    if opt == "nobarrier" {
                        barrier = false;
                        continue;
                    }
                    match opt.split_once('=') {
                        Some(("data", d)) => data = d.parse::<DataMode>().map_err(bad)?,
                        Some(("commit", c)) => {
                            commit_s =
                                Some(c.parse::<u64>().ok().filter(|&c| c > 0).ok_or_else(|| {
                                    bad(format!("commit={c}: not a positive number of seconds"))
                                })?)
                        }
                        Some(("sched", p)) => {
                            sched = Some(p.parse::<ordo_dev::Policy>().map_err(bad)?)
                        }
                        Some(("fsync", f)) => fsync = f.parse().map_err(bad)?,
                        _ => {
                            return Err(bad(format!(
                                "unknown option '{opt}' (ordo-lib takes data=, commit=, sched=, fsync=, nobarrier and fuse)"
                            )))
                        }
                    }
                }
                TargetKind::OrdoLib {
                    mode,
                    data,
                    commit_s,
                    sched,
                    fsync,
                    fuse,
                    barrier,
                }
            }
            _ => return Err(bad("unknown target".into())),
        };
        Ok(TargetSpec {
            name: s.to_string(),
            kind,
        })
    }
}

impl TargetSpec {
    /// True if the target has a block device the kernel counts.
    pub fn uses_loop(&self, device: DeviceKind) -> bool {
        match self.kind {
            TargetKind::Ext4(_) => true,
            TargetKind::Tmpfs | TargetKind::FuseFloor { .. } => false,
            TargetKind::Ordo { .. } | TargetKind::OrdoLib { .. } => device == DeviceKind::Loop,
        }
    }

    /// True for a target served through FUSE over io_uring
    /// (`fuse-floor,io_uring`, `ordo:MODE,...,io_uring[=on]`).
    pub fn uses_io_uring(&self) -> bool {
        match &self.kind {
            TargetKind::FuseFloor { io_uring, .. } => *io_uring,
            TargetKind::Ordo { options, .. } => options
                .split(',')
                .any(|o| o == "io_uring" || o == "io_uring=on"),
            _ => false,
        }
    }

    /// True for ordo targets (not the FUSE floor, which has no image).
    pub fn is_ordo(&self) -> bool {
        matches!(
            self.kind,
            TargetKind::Ordo { .. } | TargetKind::OrdoLib { .. }
        )
    }
}

/// Where ordo's image lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// `/dev/loopN` over an image file: the kernel counts ordo's I/O.
    Loop,
    /// The image file itself: only ordo's own counters.
    File,
}

/// How a case's image file is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// Every byte written (zeros) and synced before `mkfs`, so the host's
    /// file system has allocated the whole file: a write to the image then
    /// changes no host metadata, and a flush of the loop device costs what
    /// it costs a disk that is all there, not a host journal commit for
    /// the blocks first written since the last flush.
    Written,
    /// A sparse file of `--size`: quick to make, but the first write to each
    /// host block allocates it, and the next flush commits that allocation
    /// in the host's journal.
    Sparse,
}

/// A timing model for in-process targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskName {
    /// 7200-rpm disk with a write cache (8.5 ms seek, 150 MB/s).
    Hdd,
    /// The HP C2447 of Ganger & Patt (OSDI '94): 5400 rpm, 10 ms seek,
    /// 3.5 MB/s, write cache off.
    HpC2447,
    /// SATA flash (30 µs write, 1 ms flush, 500 MB/s).
    Ssd,
    /// Provisioned cloud volume (3000 IOPS, 125 MB/s).
    Cloud,
}

impl DiskName {
    /// The model's parameters.
    pub fn model(self) -> DiskModel {
        match self {
            DiskName::Hdd => DiskModel::hdd_7200(),
            DiskName::HpC2447 => DiskModel::hp_c2447(),
            DiskName::Ssd => DiskModel::ssd_sata(),
            DiskName::Cloud => DiskModel::cloud_gp3(),
        }
    }
}

impl DiskName {
    /// The `--disk` name.
    pub fn name(self) -> &'static str {
        match self {
            DiskName::Hdd => "hdd",
            DiskName::HpC2447 => "hp-c2447",
            DiskName::Ssd => "ssd",
            DiskName::Cloud => "cloud",
        }
    }
}

/// A `--disk` argument: a model, and for the rotating ones whether their
/// write cache is on (`NAME[,wce=on|off]`: `hdd,wce=off` is the 7200-rpm
/// disk written through, `hp-c2447,wce=on` the 1994 disk with a cache it
/// did not use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSpec {
    /// The model.
    pub name: DiskName,
    /// `wce=`: the write cache on or off; `None`, the model's own setting.
    pub wce: Option<bool>,
    /// `rot=`: rotational position and command turnaround modeled
    /// (`DiskModel::Hdd`'s `rotation`); `None`, the model's own setting
    /// (off).
    pub rot: Option<bool>,
}

impl From<DiskName> for DiskSpec {
    fn from(name: DiskName) -> Self {
        DiskSpec {
            name,
            wce: None,
            rot: None,
        }
    }
}

impl DiskSpec {
    /// The model's parameters.
    pub fn model(self) -> DiskModel {
        let mut m = self.name.model();
        if let Some(on) = self.wce {
            m = m.with_write_cache(on).unwrap_or(m);
        }
        if let Some(on) = self.rot {
            m = m.with_rotation(on).unwrap_or(m);
        }
        m
    }
}

impl std::fmt::Display for DiskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name.name())?;
        match self.wce {
            Some(true) => f.write_str(",wce=on")?,
            Some(false) => f.write_str(",wce=off")?,
            None => {}
        }
        match self.rot {
            Some(true) => f.write_str(",rot=on"),
            Some(false) => f.write_str(",rot=off"),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for DiskSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut parts = s.split(',');
        let first = parts.next().unwrap_or_default();
        let name = <DiskName as clap::ValueEnum>::from_str(first, true)
            .map_err(|_| format!("unknown disk '{first}' (known: hdd, hp-c2447, ssd, cloud)"))?;
        let mut spec = DiskSpec::from(name);
        for opt in parts {
            let (rot, on) = match opt {
                "wce=on" => (false, true),
                "wce=off" => (false, false),
                "rot=on" => (true, true),
                "rot=off" => (true, false),
                _ => {
                    return Err(format!(
                        "unknown disk option '{opt}' (known: wce=on, wce=off, rot=on, rot=off)"
                    ))
                }
            };
            if name.model().with_write_cache(on).is_none() {
                return Err(format!(
                    "{opt}: only the rotating disks (hdd, hp-c2447) have a write cache and a platter"
                ));
            }
            if rot {
                spec.rot = Some(on);
            } else {
                spec.wce = Some(on);
            }
        }
        Ok(spec)
    }
}

/// How targets are built.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Where images and mount points are made.
    pub workdir: PathBuf,
    /// Size of every image.
    pub size_bytes: u64,
    /// Loop device or plain file, for ordo targets.
    pub device: DeviceKind,
    /// Written or sparse image files (the timing models' virtual time does
    /// not depend on it, so `ordo-lib` targets on a `disk` stay sparse).
    pub image: ImageKind,
    /// Timing model for `ordo-lib` targets.
    pub disk: Option<DiskSpec>,
    /// The `ordo` binary (found automatically when `None`).
    pub ordo_bin: Option<PathBuf>,
}

/// Counters of one block class, as ordo reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassFigures {
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// FUA writes (also in `writes`).
    pub fua_writes: u64,
}

/// ordo's device counters, as `ordo mount` writes them to
/// `$ORDO_COUNTERS_OUT` (the JSON form of `ordo_dev::Counters`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrdoCounters {
    /// Indexed by `BlockClass as usize`.
    pub by_class: Vec<ClassFigures>,
    /// Cache flushes.
    pub flushes: u64,
}

impl From<&ordo_dev::Counters> for OrdoCounters {
    fn from(c: &ordo_dev::Counters) -> Self {
        OrdoCounters {
            by_class: c
                .by_class
                .iter()
                .map(|k| ClassFigures {
                    reads: k.reads,
                    read_bytes: k.read_bytes,
                    writes: k.writes,
                    write_bytes: k.write_bytes,
                    fua_writes: k.fua_writes,
                })
                .collect(),
            flushes: c.flushes,
        }
    }
}

impl OrdoCounters {
    /// Sum over the classes.
    pub fn total(&self) -> ClassFigures {
        let mut t = ClassFigures::default();
        for c in &self.by_class {
            t.reads += c.reads;
            t.read_bytes += c.read_bytes;
            t.writes += c.writes;
            t.write_bytes += c.write_bytes;
            t.fua_writes += c.fua_writes;
        }
        t
    }

    /// Parses the last JSON line of a counters file.
    pub fn parse_last_line(text: &str) -> Option<OrdoCounters> {
        let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
        let c: OrdoCounters = serde_json::from_str(line).ok()?;
        (c.by_class.len() == BLOCK_CLASS_COUNT).then_some(c)
    }
}

/// What one measurement window saw, beyond the workload's own figures.
#[derive(Clone, Debug, Default)]
pub struct Measurement {
    /// The kernel's counters for the device over the window.
    pub blockstat: Option<BlockStat>,
    /// ordo's own counters over the window.
    pub ordo: Option<OrdoCounters>,
    /// Why ordo's counters are missing, when they are.
    pub ordo_note: Option<String>,
    /// CPU time of the ordo FUSE process over the window, µs.
    pub fs_cpu_us: Option<u64>,
    /// Peak resident memory of the process serving the file system, KiB.
    pub fs_peak_kib: Option<u64>,
    /// The device measured (`/dev/loop3`).
    pub device: Option<String>,
    /// Fast and full commits over the window (ordo's journaling modes and
    /// the kernel's ext4).
    pub commits: Option<CommitCounts>,
    /// Why the commit counts are missing, when they are for a target that
    /// commits.
    pub commits_note: Option<String>,
    /// The I/O scheduler's statistics over the window, before the unmount
    /// (`ordo-lib:MODE,sched=P`).
    pub sched: Option<ordo_dev::SchedStats>,
}

/// What is mounted now.
enum Mounted {
    No,
    Kernel,
    Fuse {
        child: Child,
        log: PathBuf,
        cpu_start_us: Option<u64>,
    },
    Lib {
        fs: Arc<Fs>,
        dev: Arc<FileDevice>,
        timed: Option<Arc<TimedDevice<Arc<FileDevice>>>>,
        /// The FUSE session serving `fs` on the mount point (`fuse`).
        fuse: Option<LibFuse>,
        /// The commit interval, for the timer run in idle virtual time.
        commit_ms: u64,
    },
}

/// A FUSE session of this process serving an in-process file system.
struct LibFuse {
    /// Given whether the mount point is unmounted already, finish the
    /// unmount and join the serving thread.
    finish: Box<dyn FnOnce(bool) -> std::io::Result<()>>,
}

impl LibFuse {
    fn start(fs: Arc<Fs>, mnt: &Path, mode: ProtocolKind) -> std::io::Result<LibFuse> {
        let config = ordo_fuse::MountConfig {
            fsname: "ordo-bench".to_string(),
            ..ordo_fuse::MountConfig::for_mode(mode)
        };
        let session = ordo_fuse::mount(fs, mnt, &config)?.spawn()?;
        Ok(LibFuse {
            finish: Box::new(move |done| {
                if done {
                    session.join()
                } else {
                    session.umount_and_join()
                }
            }),
        })
    }

    /// Unmounts `mnt` (retrying while busy: a program that just exited may
    /// hold it for a moment) and joins the serving thread.
    fn stop(self, mnt: &Path) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        /// Attempts while the mount is busy, 20 ms apart.
        const TRIES: u32 = 250;
        let mut done = false;
        for attempt in 0..TRIES {
            // SAFETY: `c` is a NUL-terminated path for the whole call.
            if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
                done = true;
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) || attempt + 1 == TRIES {
                (self.finish)(false)?;
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (self.finish)(done)
    }
}

/// One target, set up for one case.
pub struct Instance {
    spec: TargetSpec,
    cfg: TargetConfig,
    dir: PathBuf,
    image: PathBuf,
    mnt: PathBuf,
    loopdev: Option<ordo_dev::LoopDevice>,
    mounted: Mounted,
    window_start: Option<BlockStat>,
    /// The kernel's commit counts right after the measured mount.
    commits_start: Option<std::result::Result<KernelCommitStats, String>>,
}

/// Finds the `ordo` binary: `$ORDO_BIN`, next to the running executable
/// (or one level up, for test binaries in `target/*/deps`), then `$PATH`.
pub fn find_ordo_bin(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ORDO_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "ordo") {
            return Ok(exe);
        }
        if let Some(d) = exe.parent() {
            for cand in [d.join("ordo"), d.join("..").join("ordo")] {
                if cand.is_file() {
                    return Ok(cand);
                }
            }
        }
    }
    sys::which("ordo").ok_or_else(|| BenchError::Missing {
        program: "ordo".into(),
        hint: "build it (cargo build -p ordo) or set ORDO_BIN".into(),
    })
}

/// Reads the block size from an ext4 superblock (`s_log_block_size`).
fn ext4_block_size(dev: &Path) -> Result<u32> {
    let mut f = File::open(dev).map_err(|e| BenchError::io("open", dev, e))?;
    let mut head = [0u8; SUPERBLOCK_OFFSET as usize + SUPERBLOCK_SIZE];
    f.read_exact(&mut head)
        .map_err(|e| BenchError::io("read superblock", dev, e))?;
    let sb = &head[SUPERBLOCK_OFFSET as usize..];
    let magic = u16_at(sb, sb_off::MAGIC);
    if magic != EXT4_MAGIC {
        return Err(BenchError::target(
            dev.display().to_string(),
            format!("no ext4 superblock (magic {magic:#06x})"),
        ));
    }
    let log = u32_at(sb, sb_off::LOG_BLOCK_SIZE);
    if log > 6 {
        return Err(BenchError::target(
            dev.display().to_string(),
            format!("superblock s_log_block_size {log} is out of range"),
        ));
    }
    Ok(1024 << log)
}

/// The `ordo mkfs -O` features a protocol needs on disk (its registry
/// entry's: a journal for the JBD2 modes, the fast-commit area for fast
/// commit).
fn ordo_mkfs_features(kind: &TargetKind) -> Option<&'static str> {
    let mode = match kind {
        TargetKind::Ordo { mode, .. } | TargetKind::OrdoLib { mode, .. } => *mode,
        _ => return None,
    };
    Some(mode.spec().mkfs_features).filter(|f| !f.is_empty())
}

/// Writes `len` zero bytes over `f` from its start and syncs it, so that
/// the host's file system has allocated every block (and written it: an
/// fallocated, unwritten extent would still be converted, in the host's
/// journal, by the first write to it).
fn write_zeros(f: &File, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off) as usize;
        f.write_all_at(&zeros[..n], off)?;
        off += n as u64;
    }
    f.sync_all()
}

fn unique_dir(workdir: &Path, target: &str) -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let safe: String = target
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = workdir.join(format!("{}-{n}-{safe}", std::process::id()));
    std::fs::create_dir_all(dir.join("mnt")).map_err(|e| BenchError::io("mkdir", &dir, e))?;
    Ok(dir)
}

impl Instance {
    /// Makes a fresh device and file system for `spec` and mounts it.
    pub fn create(spec: &TargetSpec, cfg: &TargetConfig) -> Result<Instance> {
        let dir = unique_dir(&cfg.workdir, &spec.name)?;
        let mut inst = Instance {
            spec: spec.clone(),
            cfg: cfg.clone(),
            image: dir.join("image"),
            mnt: dir.join("mnt"),
            dir,
            loopdev: None,
            mounted: Mounted::No,
            window_start: None,
            commits_start: None,
        };
        inst.make_device()?;
        inst.mount()?;
        Ok(inst)
    }

    fn err(&self, detail: impl Into<String>) -> BenchError {
        BenchError::target(&self.spec.name, detail)
    }

    /// False for the targets without an image: tmpfs and the FUSE floor.
    /// They are not remounted for the measurement window either, since
    /// their files live only as long as the mount.
    fn has_device(&self) -> bool {
        !matches!(
            self.spec.kind,
            TargetKind::Tmpfs | TargetKind::FuseFloor { .. }
        )
    }

    /// What the FUSE server of this target is called in messages.
    fn server_name(&self) -> &'static str {
        match self.spec.kind {
            TargetKind::FuseFloor { .. } => "ordo fuse-floor",
            _ => "ordo mount",
        }
    }

    /// The device or image the file system lives on.
    fn device_path(&self) -> &Path {
        self.loopdev.as_ref().map_or(&self.image, |d| d.path())
    }

    fn make_device(&mut self) -> Result<()> {
        if !self.has_device() {
            return Ok(());
        }
        let f = File::create(&self.image).map_err(|e| BenchError::io("create", &self.image, e))?;
        f.set_len(self.cfg.size_bytes)
            .map_err(|e| BenchError::io("truncate", &self.image, e))?;
        let timed = self.cfg.disk.is_some() && matches!(self.spec.kind, TargetKind::OrdoLib { .. });
        if self.cfg.image == ImageKind::Written && !timed {
            write_zeros(&f, self.cfg.size_bytes)
                .map_err(|e| BenchError::io("write zeros to", &self.image, e))?;
        }
        drop(f);
        if let TargetKind::Ext4(mode) = self.spec.kind {
            // Inode tables and the journal are written now rather than by
            // the kernel's lazy-init thread during the measurement.
            let mut mkfs = Command::new("mkfs.ext4");
            mkfs.args(["-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"]);
            if mode == Ext4Mode::FastCommit {
                mkfs.args(["-O", "fast_commit"]);
            }
            sys::run(mkfs.arg(&self.image))?;
        }
        if self.spec.uses_loop(self.cfg.device) {
            let dev = ordo_dev::LoopDevice::attach(&self.image, false)
                .map_err(|e| self.err(e.to_string()))?;
            self.loopdev = Some(dev);
        }
        if self.spec.is_ordo() {
            let ordo = find_ordo_bin(self.cfg.ordo_bin.as_deref())?;
            let mut mkfs = Command::new(ordo);
            mkfs.arg("mkfs").arg(self.device_path());
            if self.loopdev.is_none() {
                mkfs.args(["--size", &self.cfg.size_bytes.to_string()]);
            }
            if let Some(features) = ordo_mkfs_features(&self.spec.kind) {
                mkfs.args(["-O", features]);
            }
            sys::run(&mut mkfs)?;
        }
        Ok(())
    }

    fn mount(&mut self) -> Result<()> {
        assert!(matches!(self.mounted, Mounted::No), "mount while mounted");
        match &self.spec.kind {
            TargetKind::Ext4(mode) => {
                let opts = match mode {
                    Ext4Mode::Ordered | Ext4Mode::FastCommit => "data=ordered",
                    Ext4Mode::Journal => "data=journal",
                    Ext4Mode::Nobarrier => "data=ordered,nobarrier",
                };
                sys::run(
                    Command::new("mount")
                        .args(["-t", "ext4", "-o", opts])
                        .arg(self.device_path())
                        .arg(&self.mnt),
                )?;
                self.mounted = Mounted::Kernel;
            }
            TargetKind::Tmpfs => {
                sys::run(
                    Command::new("mount")
                        .args(["-t", "tmpfs", "-o"])
                        .arg(format!("size={}", self.cfg.size_bytes))
                        .arg("tmpfs")
                        .arg(&self.mnt),
                )?;
                self.mounted = Mounted::Kernel;
            }
            TargetKind::Ordo { options, .. } => {
                let ordo = find_ordo_bin(self.cfg.ordo_bin.as_deref())?;
                let counters = self.dir.join("counters.json");
                let _ = std::fs::remove_file(&counters);
                let mut cmd = Command::new(ordo);
                cmd.arg("mount")
                    .arg("-f")
                    .arg(self.device_path())
                    .arg(&self.mnt)
                    .arg("-o")
                    .arg(options)
                    .env(COUNTERS_ENV, &counters);
                self.start_fuse(cmd)?;
            }
            TargetKind::FuseFloor {
                open_requests,
                io_uring,
                readers_all,
            } => {
                let ordo = find_ordo_bin(self.cfg.ordo_bin.as_deref())?;
                let mut cmd = Command::new(ordo);
                cmd.arg("fuse-floor").arg(&self.mnt);
                if !open_requests {
                    cmd.arg("--open-requests").arg("off");
                }
                if *io_uring {
                    cmd.arg("--io-uring");
                }
                if *readers_all {
                    cmd.arg("--readers").arg("all");
                }
                self.start_fuse(cmd)?;
            }
            TargetKind::OrdoLib {
                mode,
                data,
                commit_s,
                sched,
                fsync,
                fuse,
                barrier,
            } => {
                let path = self.device_path().to_path_buf();
                let bs = ext4_block_size(&path)?;
                let dev = Arc::new(
                    FileDevice::open(&path, bs, OpenOptions::default())
                        .map_err(|e| self.err(e.to_string()))?,
                );
                let timed = match self.cfg.disk {
                    Some(d) => Some(Arc::new(
                        TimedDevice::new(dev.clone(), d.model())
                            .map_err(|e| self.err(e.to_string()))?,
                    )),
                    None => None,
                };
                let defaults = MountOptions::default();
                let opts = MountOptions {
                    mode: *mode,
                    data: *data,
                    commit_interval_ms: commit_s
                        .map_or(defaults.commit_interval_ms, |s| s.saturating_mul(1000)),
                    // Virtual time must not depend on a timer thread.
                    background: timed.is_none(),
                    sched: *sched,
                    fsync: *fsync,
                    barrier: *barrier,
                    ..defaults
                };
                let commit_ms = opts.commit_interval_ms;
                let fs = Arc::new(
                    Fs::mount(lib_device(dev.clone(), timed.as_ref()), opts)
                        .map_err(|e| self.err(format!("mount: {e}")))?,
                );
                let fuse = if *fuse {
                    match LibFuse::start(fs.clone(), &self.mnt, *mode) {
                        Ok(f) => Some(f),
                        Err(e) => {
                            if let Ok(fs) = Arc::try_unwrap(fs) {
                                let _ = fs.unmount();
                            }
                            return Err(self.err(format!("FUSE mount: {e}")));
                        }
                    }
                } else {
                    None
                };
                self.mounted = Mounted::Lib {
                    fs,
                    dev,
                    timed,
                    fuse,
                    commit_ms,
                };
            }
        }
        Ok(())
    }

    /// Starts a FUSE server in the foreground (`ordo mount -f`, `ordo
    /// fuse-floor`), its standard error to a log, and waits for its mount.
    fn start_fuse(&mut self, mut cmd: Command) -> Result<()> {
        let log = self.dir.join("ordo-mount.log");
        let log_file = File::create(&log).map_err(|e| BenchError::io("create", &log, e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| self.err(format!("cannot start {}: {e}", self.server_name())))?;
        self.mounted = Mounted::Fuse {
            child,
            log,
            cpu_start_us: None,
        };
        self.wait_for_fuse()
    }

    fn log_tail(log: &Path) -> String {
        let s = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn wait_for_fuse(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            if sys::is_mount_point(&self.mnt) {
                return Ok(());
            }
            let Mounted::Fuse { child, log, .. } = &mut self.mounted else {
                unreachable!("waiting for a FUSE mount that was not started")
            };
            if let Ok(Some(status)) = child.try_wait() {
                let tail = Self::log_tail(log);
                self.mounted = Mounted::No;
                return Err(self.err(format!(
                    "{} exited ({status}) before mounting: {tail}",
                    self.server_name()
                )));
            }
            if start.elapsed() > MOUNT_WAIT {
                let tail = Self::log_tail(log);
                return Err(self.err(format!(
                    "{} did not mount within {} s: {tail}",
                    self.server_name(),
                    MOUNT_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The file system as workloads see it. Drop it before
    /// [`Instance::start_window`] / [`Instance::finish_window`].
    pub fn vfs(&self) -> Result<Arc<dyn Vfs>> {
        match &self.mounted {
            Mounted::No => Err(self.err("not mounted")),
            Mounted::Kernel | Mounted::Fuse { .. } => {
                let vfs = PosixVfs::new(&self.mnt)
                    .with_loop_device(self.loopdev.as_ref().map(|d| d.path().to_path_buf()));
                Ok(Arc::new(match self.spec.kind {
                    TargetKind::FuseFloor { .. } => vfs.discarding_data(),
                    _ => vfs,
                }))
            }
            Mounted::Lib {
                dev,
                timed,
                fuse: Some(_),
                ..
            } => Ok(Arc::new(
                PosixVfs::new(&self.mnt).served_here(dev.clone(), BenchClock::new(timed.clone())),
            )),
            Mounted::Lib {
                fs,
                dev,
                timed,
                commit_ms,
                ..
            } => Ok(Arc::new(
                LibVfs::new(fs.clone(), timed.clone())
                    .with_device(dev.clone())
                    .with_virtual_timer(*commit_ms),
            )),
        }
    }

    /// Unmounts; for ordo targets returns the counters of the session and
    /// notes on the serving process.
    fn unmount(&mut self) -> Result<Measurement> {
        let mut m = Measurement::default();
        match std::mem::replace(&mut self.mounted, Mounted::No) {
            Mounted::No => {}
            Mounted::Kernel => umount_retrying(&self.mnt)?,
            Mounted::Fuse {
                mut child,
                log,
                cpu_start_us,
            } => {
                let pid = child.id();
                if let (Some(a), Some(b)) = (cpu_start_us, sys::process_cpu_us(pid)) {
                    m.fs_cpu_us = Some(b.saturating_sub(a));
                }
                m.fs_peak_kib = sys::process_peak_kib(pid);
                let r = unmount_retrying("fusermount3", &["-u"], &self.mnt);
                if let Err(e) = r {
                    // Leave the child to Drop's cleanup.
                    self.mounted = Mounted::Fuse {
                        child,
                        log,
                        cpu_start_us: None,
                    };
                    return Err(e);
                }
                let server = self.server_name();
                let status = wait_child(&mut child, UNMOUNT_WAIT)
                    .map_err(|e| self.err(format!("waiting for {server} to exit: {e}")))?;
                if !status.success() {
                    return Err(self.err(format!(
                        "{server} exited with {status} at unmount: {}",
                        Self::log_tail(&log)
                    )));
                }
                if matches!(self.spec.kind, TargetKind::FuseFloor { .. }) {
                    // No device, so no counters, as for tmpfs.
                    return Ok(m);
                }
                let counters = self.dir.join("counters.json");
                match std::fs::read_to_string(&counters) {
                    Ok(text) => {
                        match OrdoCounters::parse_last_line(&text) {
                            Some(c) => m.ordo = Some(c),
                            None => {
                                m.ordo_note =
                                    Some(format!("{} is not a counters line", counters.display()))
                            }
                        }
                        match ProtocolStats::parse_last_line(&text) {
                            Some(p) => m.commits = p.commit_counts(),
                            None => {
                                m.commits_note = Some(
                                    "ordo mount reported no protocol statistics (an older ordo?)"
                                        .into(),
                                )
                            }
                        }
                    }
                    Err(_) => {
                        m.ordo_note = Some(format!(
                            "ordo mount wrote no counters (it does not support {COUNTERS_ENV})"
                        ))
                    }
                }
            }
            Mounted::Lib {
                fs,
                dev,
                timed,
                fuse,
                ..
            } => {
                if let Some(f) = fuse {
                    f.stop(&self.mnt)
                        .map_err(|e| self.err(format!("FUSE unmount: {e}")))?;
                }
                drop(timed);
                let fs = Arc::try_unwrap(fs)
                    .map_err(|_| self.err("the file system is still in use at unmount"))?;
                m.fs_peak_kib = sys::process_peak_kib(std::process::id());
                // Before the unmount's own commit, as for the other targets.
                let (mode, stats) = fs.protocol_stats();
                m.commits = ProtocolStats::from_pair(&mode, &stats).commit_counts();
                m.sched = fs.sched_stats();
                fs.unmount()
                    .map_err(|e| self.err(format!("unmount: {e}")))?;
                m.ordo = Some(OrdoCounters::from(&dev.counters()));
            }
        }
        Ok(m)
    }

    /// Ends the setup session and starts the measured one (see the module
    /// comment).
    pub fn start_window(&mut self) -> Result<()> {
        if !self.has_device() {
            // Not remounted: the FUSE floor's server is measured from now.
            if let Mounted::Fuse {
                child,
                cpu_start_us,
                ..
            } = &mut self.mounted
            {
                *cpu_start_us = sys::process_cpu_us(child.id());
                sys::reset_peak(child.id());
            }
            return Ok(());
        }
        self.unmount()?;
        self.window_start = match &self.loopdev {
            Some(d) => Some(BlockStat::read(d.path())?),
            None => None,
        };
        self.mount()?;
        match &mut self.mounted {
            Mounted::Fuse {
                child,
                cpu_start_us,
                ..
            } => *cpu_start_us = sys::process_cpu_us(child.id()),
            Mounted::Lib { .. } => sys::reset_own_peak(),
            _ => {}
        }
        self.commits_start = self.kernel_commit_stats();
        Ok(())
    }

    /// The kernel's commit counts of the mounted ext4, `None` for other
    /// targets.
    fn kernel_commit_stats(&self) -> Option<std::result::Result<KernelCommitStats, String>> {
        match (&self.spec.kind, &self.loopdev) {
            (TargetKind::Ext4(_), Some(d)) => Some(KernelCommitStats::read(d.path())),
            _ => None,
        }
    }

    /// Ends the measured session: unmounts and reads every counter.
    pub fn finish_window(&mut self) -> Result<Measurement> {
        // The kernel's counts are per mount and vanish with it: read them
        // before the unmount.
        let commits = match (self.commits_start.take(), self.kernel_commit_stats()) {
            (Some(Ok(start)), Some(Ok(end))) => Ok(Some(end.since(&start))),
            (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e),
            _ => Ok(None),
        };
        let mut m = self.unmount()?;
        match commits {
            Ok(Some(c)) => m.commits = Some(c),
            Ok(None) => {}
            Err(e) => m.commits_note = Some(e),
        }
        if let (Some(d), Some(start)) = (&self.loopdev, &self.window_start) {
            m.blockstat = Some(BlockStat::read(d.path())?.since(start));
            m.device = Some(d.path().display().to_string());
        }
        Ok(m)
    }
}

fn wait_child(child: &mut Child, limit: Duration) -> std::io::Result<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if start.elapsed() > limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("still running after {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `umount`, retried while the mount is busy.
fn umount_retrying(mnt: &Path) -> Result<()> {
    ordo_dev::loopdev::unmount_retrying(mnt).map_err(|e| BenchError::Command {
        command: format!("umount {}", mnt.display()),
        status: "busy or failed".into(),
        stderr: e.to_string(),
    })
}

/// Runs an unmount command, retried while the mount is busy: a program
/// that just exited, or a child another thread is forking, may hold it for
/// a moment.
fn unmount_retrying(program: &str, args: &[&str], mnt: &Path) -> Result<()> {
    /// Attempts before giving up.
    const UMOUNT_TRIES: u32 = 50;
    let mut last = None;
    for _ in 0..UMOUNT_TRIES {
        match sys::run(Command::new(program).args(args).arg(mnt)) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.expect("at least one attempt"))
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Best effort: a failed benchmark must not leave mounts and loop
        // devices behind.
        match std::mem::replace(&mut self.mounted, Mounted::No) {
            Mounted::No => {}
            Mounted::Kernel => {
                if umount_retrying(&self.mnt).is_err() {
                    let _ = sys::run(Command::new("umount").arg("-l").arg(&self.mnt));
                }
            }
            Mounted::Fuse { mut child, .. } => {
                let _ = sys::run(Command::new("fusermount3").arg("-u").arg(&self.mnt));
                if wait_child(&mut child, Duration::from_secs(30)).is_err() {
                    let _ = sys::run(Command::new("fusermount3").arg("-uz").arg(&self.mnt));
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Mounted::Lib { fs, fuse, .. } => {
                if let Some(f) = fuse {
                    let _ = f.stop(&self.mnt);
                }
                if let Ok(fs) = Arc::try_unwrap(fs) {
                    let _ = fs.unmount();
                }
            }
        }
        // Detached when dropped.
        drop(self.loopdev.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_image_has_every_block_allocated_and_zero() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        // Not a whole number of chunks: the tail is written too.
        let len = (3 << 20) + 4096 * 3;
        f.set_len(len).unwrap();
        assert_eq!(f.metadata().unwrap().blocks(), 0, "set_len alone is sparse");
        write_zeros(&f, len).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), len);
        assert!(
            m.blocks() * 512 >= len,
            "{} of {len} bytes allocated",
            m.blocks() * 512
        );
        let mut tail = vec![1u8; 4096];
        f.read_exact_at(&mut tail, len - 4096).unwrap();
        assert!(tail.iter().all(|&b| b == 0));
    }

    #[test]
    fn disks_parse_with_their_write_cache_switch() {
        let d: DiskSpec = "hp-c2447".parse().unwrap();
        assert_eq!(d.model(), DiskModel::hp_c2447());
        assert_eq!(d.to_string(), "hp-c2447");
        let d: DiskSpec = "hdd,wce=off".parse().unwrap();
        assert!(matches!(
            d.model(),
            DiskModel::Hdd {
                cache: false,
                rpm: 7200,
                ..
            }
        ));
        assert_eq!(d.to_string(), "hdd,wce=off");
        let d: DiskSpec = "hp-c2447,wce=on".parse().unwrap();
        assert!(matches!(
            d.model(),
            DiskModel::Hdd {
                cache: true,
                rpm: 5400,
                ..
            }
        ));
        assert_eq!(
            "hdd".parse::<DiskSpec>().unwrap().model(),
            DiskModel::hdd_7200()
        );
        assert!("ssd,wce=off"
            .parse::<DiskSpec>()
            .unwrap_err()
            .contains("rotating"));
        let d: DiskSpec = "hdd,rot=on".parse().unwrap();
        assert!(matches!(
            d.model(),
            DiskModel::Hdd {
                cache: true,
                rotation: true,
                ..
            }
        ));
        assert_eq!(d.to_string(), "hdd,rot=on");
        assert!("ssd,rot=on".parse::<DiskSpec>().is_err());
        assert!(matches!(
            "hdd".parse::<DiskSpec>().unwrap().model(),
            DiskModel::Hdd {
                rotation: false,
                ..
            }
        ));
        assert!("hdd,wce=maybe".parse::<DiskSpec>().is_err());
        assert!("floppy"
            .parse::<DiskSpec>()
            .unwrap_err()
            .contains("unknown disk"));
    }

    #[test]
    fn parses_every_target_name() {
        let t: TargetSpec = "ext4:fast_commit".parse().unwrap();
        assert_eq!(t.kind, TargetKind::Ext4(Ext4Mode::FastCommit));
        assert!(t.uses_loop(DeviceKind::File));
        let t: TargetSpec = "tmpfs".parse().unwrap();
        assert!(!t.uses_loop(DeviceKind::Loop));
        let t: TargetSpec = "fuse-floor".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::FuseFloor {
                open_requests: true,
                io_uring: false,
                readers_all: false,
            }
        );
        let t: TargetSpec = "fuse-floor,io_uring,open_requests=off".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::FuseFloor {
                open_requests: false,
                io_uring: true,
                readers_all: false,
            }
        );
        assert!(t.uses_io_uring());
        assert!("fuse-floor,io_uring=yes".parse::<TargetSpec>().is_err());
        assert!("ordo:journal,io_uring"
            .parse::<TargetSpec>()
            .unwrap()
            .uses_io_uring());
        assert!(!"ordo:journal,io_uring=off"
            .parse::<TargetSpec>()
            .unwrap()
            .uses_io_uring());
        assert!(!"fuse-floor".parse::<TargetSpec>().unwrap().uses_io_uring());
        let t: TargetSpec = "fuse-floor,open_requests=off".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::FuseFloor {
                open_requests: false,
                io_uring: false,
                readers_all: false,
            }
        );
        let t: TargetSpec = "fuse-floor,readers=all".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::FuseFloor {
                open_requests: true,
                io_uring: false,
                readers_all: true,
            }
        );
        assert!("fuse-floor,readers=some".parse::<TargetSpec>().is_err());
        assert!(!t.is_ordo() && !t.uses_loop(DeviceKind::Loop) && !t.uses_loop(DeviceKind::File));
        assert!(target_names().contains("fuse-floor"));
        let t: TargetSpec = "ordo:journal,data=journal".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::Ordo {
                options: "mode=journal,data=journal".into(),
                mode: ProtocolKind::named("journal")
            }
        );
        assert!(t.is_ordo() && t.uses_loop(DeviceKind::Loop) && !t.uses_loop(DeviceKind::File));
        let t: TargetSpec = "ordo-lib:sync".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::OrdoLib {
                mode: ProtocolKind::named("sync"),
                data: DataMode::Ordered,
                commit_s: None,
                sched: None,
                fsync: ordo_fs::FsyncMeaning::Dsync,
                fuse: false,
                barrier: true,
            }
        );
        let t: TargetSpec = "ordo-lib:streams,fuse".parse().unwrap();
        assert!(matches!(t.kind, TargetKind::OrdoLib { fuse: true, .. }));
        let t: TargetSpec = "ordo-lib:fast_commit,commit=600".parse().unwrap();
        assert_eq!(
            t.kind,
            TargetKind::OrdoLib {
                mode: ProtocolKind::named("fast_commit"),
                data: DataMode::Ordered,
                commit_s: Some(600),
                sched: None,
                fsync: ordo_fs::FsyncMeaning::Dsync,
                fuse: false,
                barrier: true,
            }
        );
        let t: TargetSpec = "ordo-lib:journal,nobarrier".parse().unwrap();
        assert!(matches!(t.kind, TargetKind::OrdoLib { barrier: false, .. }));
        let t: TargetSpec = "ordo-lib:sync,sched=sptf".parse().unwrap();
        assert!(matches!(
            t.kind,
            TargetKind::OrdoLib {
                sched: Some(ordo_dev::Policy::Sptf),
                ..
            }
        ));
        for bad in [
            "ext4:foo",
            "ordo:nope",
            "zfs",
            "ordo-lib:async,cache=1",
            "ordo-lib:async,commit=0",
            "ordo-lib:async,commit=x",
            "ordo-lib:async,sched=elevator",
            "ordo-lib:async,nobarrier=1",
            "fuse-floor:x",
            "",
        ] {
            let e = bad.parse::<TargetSpec>().unwrap_err();
            assert!(e.to_string().contains("known:"), "{bad}: {e}");
        }
    }

    #[test]
    fn counters_line_round_trips() {
        let mut c = ordo_dev::Counters::default();
        c.by_class[ordo_dev::BlockClass::Journal as usize].writes = 3;
        c.by_class[ordo_dev::BlockClass::Journal as usize].write_bytes = 12288;
        c.flushes = 2;
        let line = serde_json::to_string(&c).unwrap();
        let parsed = OrdoCounters::parse_last_line(&format!("junk\n{line}\n\n")).unwrap();
        assert_eq!(parsed, OrdoCounters::from(&c));
        assert_eq!(parsed.total().writes, 3);
        assert!(OrdoCounters::parse_last_line("{\"by_class\":[],\"flushes\":0}").is_none());
    }

    #[test]
    fn reads_the_block_size_of_an_ext4_image() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let mut sb = vec![0u8; 4096];
        sb[1024 + 56..1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
        sb[1024 + 24..1024 + 28].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&img, &sb).unwrap();
        assert_eq!(ext4_block_size(&img).unwrap(), 4096);
        sb[1024 + 56] = 0;
        std::fs::write(&img, &sb).unwrap();
        assert!(ext4_block_size(&img).is_err());
    }
}
