//! `ordo crash --app`: record a real application on a protocol, generate
//! every crash state of its write log, recover each, and let the
//! application's own checker judge what it finds.
//!
//! The recording runs the application's workload ([`script`]) in a
//! directory of a FUSE mount of ordo over the recording device (or of the
//! kernel's ext4 over a recording loop device, [`kernel`]). The workload
//! stops at each of its steps and at each durable point it was promised,
//! and the explorer puts an operation tag or a mark in the device's log
//! before the workload goes on, so the marks and the writes share one
//! sequence. Crash states are generated from that log exactly as for the
//! file-system workloads ([`crate::states`]); each is recovered as the
//! protocol says (log replay, or the repair a user runs: ordo's benign
//! repair, then `e2fsck -fy`), its application directory is copied out
//! through ordo's read path, and the checker decides with two numbers
//! from the log: the last update marked durable before the crash and the
//! update in flight.
//!
//! Two counts come out, as the literature reports them: consistent states
//! over states checked (BoB), and distinct vulnerabilities (ALICE): each
//! inconsistent state is attributed to the pair of writes whose
//! persistence order the crash broke — the earliest write it lost and the
//! newest write it kept — named by the application step and block class
//! that issued them, or, when the state is a prefix of the log, to the
//! step in flight (an atomicity failure).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::protocol::AfterCrash;
use ordo_fs::{DataMode, FileType, Fs, Ino, ProtocolKind, ROOT_INO};

use super::kernel::KernelExt4;
use super::script::{self, App, Control, Verdict};
use crate::backend::{self, ImageParams};
use crate::error::CrashError;
use crate::explore::data_name;
use crate::fuse::FuseMount;
use crate::log::{EventKind, LogEvent, Recorder};
use crate::states::{self, StateParams, StateSpec};

/// What the application runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// ordo in a protocol and data mode, through FUSE.
    Ordo {
        /// The protocol.
        mode: ProtocolKind,
        /// Its data mode.
        data: DataMode,
        /// Mounted with `-o fsync=osync` (`MODE+osync`): the application's
        /// fsync orders instead of making durable (OptFS's modified gedit
        /// and SQLite, Table 3).
        osync: bool,
    },
    /// The kernel's ext4 (data=ordered) on a recording loop device.
    Kernel {
        /// Mounted with `-o nobarrier` (`kernel+nobarrier`): no flush, no
        /// FUA ("ext4 without flushes", OptFS Table 3).
        nobarrier: bool,
    },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Kernel { nobarrier } => {
                write!(f, "kernel{}", if *nobarrier { "+nobarrier" } else { "" })
            }
            Target::Ordo { mode, data, osync } => {
                write!(f, "{mode}")?;
                if *data != DataMode::Ordered {
                    write!(f, "/{}", data_name(*data))?;
                }
                if *osync {
                    write!(f, "+osync")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Target {
    type Err = String;
    /// `kernel[+nobarrier]`, or `MODE[/DATA][+osync]`
    /// (`journal/writeback`, `optimistic+osync`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" | "kernel-ext4" => return Ok(Target::Kernel { nobarrier: false }),
            "kernel+nobarrier" => return Ok(Target::Kernel { nobarrier: true }),
            _ => {}
        }
        let (s, osync) = match s.strip_suffix("+osync") {
            Some(base) => (base, true),
            None => (s, false),
        };
        let (m, d) = match s.split_once('/') {
            Some((m, d)) => (m, Some(d)),
            None => (s, None),
        };
        let mode = m.parse::<ProtocolKind>().map_err(|e| e.to_string())?;
        let data = match d {
            None => DataMode::Ordered,
            Some(d) => d.parse::<DataMode>().map_err(|e| e.to_string())?,
        };
        Ok(Target::Ordo { mode, data, osync })
    }
}

impl Target {
    /// The columns of the application table: the kernel's ext4, then every
    /// protocol ordo ships in its default variant (the journal in each
    /// data mode; `MODE:VARIANT` names the others).
    pub fn all() -> Vec<Target> {
        let mut v = vec![Target::Kernel { nobarrier: false }];
        for mode in ProtocolKind::all() {
            if mode.caps().data_modes {
                for data in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
                    v.push(Target::Ordo {
                        mode,
                        data,
                        osync: false,
                    });
                }
            } else {
                v.push(Target::Ordo {
                    mode,
                    data: DataMode::Ordered,
                    osync: false,
                });
            }
        }
        v
    }

    /// Whether a durable point of the application is durable on this
    /// target: not when its fsync only orders (`+osync`) or the kernel
    /// was told to skip flushes (`+nobarrier`).
    pub fn keeps_durability(self) -> bool {
        match self {
            Target::Kernel { nobarrier } => !nobarrier,
            Target::Ordo { osync, .. } => !osync,
        }
    }
}

/// Everything an application exploration needs.
#[derive(Clone, Debug)]
pub struct AppParams {
    /// The application.
    pub app: App,
    /// What it runs on.
    pub target: Target,
    /// Updates the workload makes after its setup.
    pub steps: u32,
    /// State generation.
    pub states: StateParams,
    /// Check at most this many states (a seeded sample).
    pub max_states: Option<usize>,
    /// Worker threads (0 = one per core).
    pub jobs: usize,
    /// `(i, n)`: every n-th state from i.
    pub shard: Option<(usize, usize)>,
    /// Draw a progress bar.
    pub progress: bool,
    /// The base image's geometry (32 MiB of 4 KiB blocks, one group, by
    /// default).
    pub image: ImageParams,
    /// Check only this state (`0.POINT.INDEX`).
    pub only_state: Option<crate::explore::StateId>,
    /// With `only_state`: keep its crash image, recovered image and the
    /// application directory here.
    pub keep: Option<PathBuf>,
    /// How the recovered image is read.
    pub serve: Serve,
}

impl AppParams {
    /// Defaults for an application on a target.
    pub fn new(app: App, target: Target) -> AppParams {
        AppParams {
            app,
            target,
            steps: STEPS_DEFAULT,
            states: StateParams {
                max_states_per_point: 16,
                ..StateParams::default()
            },
            max_states: None,
            jobs: 0,
            shard: None,
            progress: false,
            image: ImageParams {
                size_mib: APP_SIZE_MIB_DEFAULT,
                ..ImageParams::default()
            },
            only_state: None,
            keep: None,
            serve: Serve::Ordo,
        }
    }

    /// The flags that change which states exist, as the command line
    /// spells them.
    pub fn state_options(&self) -> String {
        let mut o = vec![format!("--steps {}", self.steps)];
        o.push(format!(
            "--states-per-point {}",
            self.states.max_states_per_point
        ));
        if self.states.prefix_only {
            o.push("--prefix-only".into());
        }
        if self.states.torn {
            o.push("--torn".into());
        }
        o.push(format!("--size-mib {}", self.image.size_mib));
        if self.image.block_size != ImageParams::default().block_size {
            o.push(format!("--block-size {}", self.image.block_size));
        }
        if let Some(g) = self.image.blocks_per_group {
            o.push(format!("--blocks-per-group {g}"));
        }
        if self.serve == Serve::Kernel {
            o.push("--serve kernel".into());
        }
        o.join(" ")
    }

    /// The command that rebuilds state `id` and keeps what it found.
    pub fn reproduce_command(&self, id: crate::explore::StateId) -> String {
        format!(
            "ordo crash --app {} --mode {} --seed {} {} --state {id} --keep ./crash-{}-{id}",
            self.app,
            self.target,
            self.states.seed,
            self.state_options(),
            self.app
        )
    }
}

/// Updates per workload unless told otherwise.
pub const STEPS_DEFAULT: u32 = 4;

/// The application image's size unless told otherwise (MiB): room for
/// a database, a repository and their logs.
pub const APP_SIZE_MIB_DEFAULT: u64 = 32;

/// One step of the workload, as its control channel named it.
#[derive(Clone, Debug)]
pub struct StepInfo {
    /// The update number (0 = setup; -1 = before the workload).
    pub k: i64,
    /// What the step does.
    pub label: String,
}

/// A recorded application run.
pub struct AppRecording {
    /// The image before the workload (clean).
    pub base: Arc<MemDevice>,
    /// The write log, tagged with steps (`op` indexes `steps`).
    pub events: Vec<LogEvent>,
    /// `steps[0]` is "before the workload"; then one per `op` line.
    pub steps: Vec<StepInfo>,
    /// `marks[p]`: the update the p-th durable mark promised.
    pub marks: Vec<i64>,
}

impl AppRecording {
    /// `(durable, started)` at a crash point: the last update marked
    /// durable before it, and the update in flight.
    pub fn promised_at(&self, spec: &StateSpec) -> (i64, i64) {
        let mut durable = -1;
        for e in &self.events[..spec.point] {
            if let EventKind::Mark(p) = e.kind {
                durable = durable.max(self.marks[p]);
            }
        }
        let started = self.steps[spec.op_in_flight(&self.events)].k;
        (durable, started)
    }
}

const APP_DIR: &str = "app";

fn app_err(app: &str, detail: impl fmt::Display) -> CrashError {
    CrashError::App {
        app: app.to_string(),
        detail: detail.to_string(),
    }
}

/// A base image the kernel made (`mkfs.ext4`, deterministic UUID and
/// hash seed, inode tables initialised so no lazy-init thread writes
/// during the recording).
pub fn kernel_base(image: &ImageParams) -> Result<Arc<MemDevice>, CrashError> {
    let tmp = tempfile::Builder::new()
        .prefix("ordo-app-base-")
        .tempdir()
        .map_err(|e| CrashError::io("temporary directory", e))?;
    let img = tmp.path().join("base.img");
    let mut mkfs = std::process::Command::new("mkfs.ext4");
    mkfs.args(["-F", "-q", "-b", &image.block_size.to_string(), "-J", "size=4"])
        .args(["-U", "6f72646f-2d61-7070-2d6b-65726e656c21"])
        .args([
            "-E",
            "hash_seed=6f72646f-2d61-7070-2d68-617368736565,lazy_itable_init=0,lazy_journal_init=0,nodiscard",
        ]);
    if let Some(g) = image.blocks_per_group {
        mkfs.args(["-g", &g.to_string()]);
    }
    let out = mkfs
        .arg(&img)
        .arg(format!("{}M", image.size_mib))
        .output()
        .map_err(|e| CrashError::Mkfs(format!("mkfs.ext4: {e}")))?;
    if !out.status.success() {
        return Err(CrashError::Mkfs(format!(
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let bytes = std::fs::read(&img).map_err(|e| CrashError::io("reading the base image", e))?;
    MemDevice::from_image(image.block_size, &bytes)
        .map(Arc::new)
        .map_err(|e| CrashError::Mkfs(format!("loading the base image: {e}")))
}

/// Run the workload and record it.
pub fn record_app(p: &AppParams) -> Result<AppRecording, CrashError> {
    let name = p.app.name();
    let base = match p.target {
        Target::Kernel { .. } => kernel_base(&p.image)?,
        Target::Ordo { mode, .. } => backend::make_image(&p.image, mode)?,
    };
    let rec = Recorder::new(base.clone());
    let mut steps = vec![StepInfo {
        k: -1,
        label: "before the workload".into(),
    }];
    let mut marks = Vec::new();
    let mut on_control = |c: &Control| match c {
        Control::Op { k, label } => {
            steps.push(StepInfo {
                k: *k,
                label: label.clone(),
            });
            rec.set_op(steps.len() - 1);
        }
        Control::Mark(k) => {
            marks.push(*k);
            rec.mark(marks.len() - 1);
        }
        Control::Done => {}
    };
    let events = match p.target {
        Target::Ordo { mode, data, osync } => {
            let mut options = backend::mount_options(mode, data, false);
            if osync {
                options.fsync = ordo_fs::FsyncMeaning::Osync;
            }
            let dev: Arc<dyn BlockDevice> = rec.device();
            let fs = Arc::new(
                Fs::mount(dev, options).map_err(|e| app_err(name, format!("mount: {e}")))?,
            );
            let mnt =
                FuseMount::new(fs.clone()).map_err(|e| app_err(name, format!("FUSE: {e}")))?;
            let dir = mnt.path().join(APP_DIR);
            // A mounted ordo writes back on a timer; the recording has no
            // timer (it must be reproducible), so the periodic write-back
            // runs at the start of every step instead: an application that
            // never syncs (git) still reaches the disk, step by step.
            let mut write_back_failed = None;
            let mut with_write_back = |c: &Control| {
                if matches!(c, Control::Op { .. }) {
                    if let Err(e) = fs.write_back() {
                        write_back_failed.get_or_insert(e.to_string());
                    }
                }
                on_control(c);
            };
            let ran = std::fs::create_dir(&dir)
                .map_err(|e| app_err(name, format!("mkdir {APP_DIR}: {e}")))
                .and_then(|()| script::run_workload(p.app, &dir, p.steps, &mut with_write_back))
                .and_then(|()| match write_back_failed.take() {
                    Some(e) => Err(app_err(name, format!("periodic write-back: {e}"))),
                    None => Ok(()),
                });
            // The crash happens here; what the unmount writes is not in
            // the log.
            let events = rec.events();
            let unmounted = mnt.unmount();
            drop(fs);
            ran?;
            unmounted.map_err(|e| app_err(name, format!("FUSE unmount: {e}")))?;
            events
        }
        Target::Kernel { nobarrier } => {
            let k = KernelExt4::mount(rec.device(), if nobarrier { "nobarrier" } else { "" })?;
            let dir = k.path().join(APP_DIR);
            let ran = std::fs::create_dir(&dir)
                .map_err(|e| app_err(name, format!("mkdir {APP_DIR}: {e}")))
                .and_then(|()| script::run_workload(p.app, &dir, p.steps, &mut on_control));
            let events = rec.events();
            let unmounted = k.unmount();
            ran?;
            unmounted?;
            events
        }
    };
    Ok(AppRecording {
        base,
        events,
        steps,
        marks,
    })
}

/// Recover a crash image as a user of the target would: log replay, or
/// (for a protocol that promises nothing after a crash, or only after a
/// repair) ordo's benign repair and, if that refuses, `e2fsck -fy`.
/// Returns the recovered image and a note on how.
fn recover(
    target: Target,
    image: Arc<MemDevice>,
) -> Result<(Arc<MemDevice>, &'static str), String> {
    match target {
        Target::Kernel { .. } => crate::judge::kernel_recover(&image).map(|i| (i, "kernel mount")),
        Target::Ordo { mode, data, .. } => match crate::oracle::recover(mode, data, &image) {
            Ok(_) => Ok((image, "protocol recovery")),
            // NoFS's recovery is its scan: no repair may stand in for it.
            Err(e)
                if mode.caps().after_crash == AfterCrash::ConsistentAfterReplay
                    || mode.caps().data_consistent_after_scan =>
            {
                Err(e)
            }
            Err(_) => crate::judge::e2fsck_recover(&image).map(|(i, _)| (i, "e2fsck -fy")),
        },
    }
}

/// Bound on what is copied out of one file.
const FILE_BYTES_MAX: u64 = 1 << 28;

/// Copy `/app` of a recovered image into `out` through ordo's read path,
/// hashing what it copies (the key of the verdict cache).
fn extract(fs: &Fs, out: &Path) -> Result<u64, String> {
    let mut h = Fnv::default();
    let app = match fs.lookup(ROOT_INO, APP_DIR.as_bytes()) {
        Ok(a) => a,
        // No application directory: the checker sees an empty one.
        Err(_) => {
            std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
            return Ok(h.0);
        }
    };
    let mut stack: Vec<(PathBuf, Ino, String)> = vec![(out.to_path_buf(), app.ino, String::new())];
    let mut seen = HashSet::new();
    while let Some((dst, ino, rel)) = stack.pop() {
        if !seen.insert(ino) {
            return Err(format!("/{APP_DIR}{rel}: directory reachable twice"));
        }
        std::fs::create_dir_all(&dst).map_err(|e| format!("{}: {e}", dst.display()))?;
        let mut entries = crate::read::dir_entries(fs, ino, 1_000_000)
            .map_err(|e| format!("/{APP_DIR}{rel}: {e}"))?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in entries {
            let name = String::from_utf8_lossy(&e.name).to_string();
            let crel = format!("{rel}/{name}");
            let cdst = dst.join(&name);
            h.write(crel.as_bytes());
            match e.kind {
                FileType::Directory => {
                    h.write(b"/d");
                    stack.push((cdst, e.ino, crel));
                }
                FileType::Regular => {
                    let attr = fs
                        .getattr(e.ino)
                        .map_err(|err| format!("/{APP_DIR}{crel}: getattr: {err}"))?;
                    if attr.size > FILE_BYTES_MAX {
                        return Err(format!("/{APP_DIR}{crel}: size {} too large", attr.size));
                    }
                    let data = crate::read::whole_file(fs, e.ino, attr.size)
                        .map_err(|err| format!("/{APP_DIR}{crel}: {err}"))?;
                    h.write(b"/f");
                    h.write(&data);
                    std::fs::write(&cdst, &data)
                        .map_err(|err| format!("{}: {err}", cdst.display()))?;
                }
                FileType::Symlink => {
                    let target = fs
                        .readlink(e.ino)
                        .map_err(|err| format!("/{APP_DIR}{crel}: readlink: {err}"))?;
                    h.write(b"/l");
                    h.write(&target);
                    use std::os::unix::ffi::OsStrExt;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &cdst)
                        .map_err(|err| format!("{}: {err}", cdst.display()))?;
                }
                // Applications here make no devices, FIFOs or sockets; one
                // in the recovered tree is noted in the hash and skipped.
                _ => h.write(b"/o"),
            }
        }
    }
    Ok(h.0)
}

/// How a recovered image is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// Through ordo's read path (what the FUSE adapter calls), read-only.
    Ordo,
    /// Through the kernel: a read-only loop mount (`ro,noload`) of the
    /// recovered image, which must be plain ext4 by then.
    Kernel,
}

impl FromStr for Serve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ordo" => Ok(Serve::Ordo),
            "kernel" => Ok(Serve::Kernel),
            _ => Err(format!("'{s}': serve through ordo or kernel")),
        }
    }
}

/// A recovered image being read.
enum Server {
    Ordo(Fs),
    Kernel(KernelRo),
}

impl Server {
    fn extract(&self, out: &Path) -> Result<u64, String> {
        match self {
            Server::Ordo(fs) => extract(fs, out),
            Server::Kernel(k) => extract_host(&k.mount.mountpoint().join(APP_DIR), out),
        }
    }
}

/// A recovered image mounted read-only by the kernel, unmounted on drop.
struct KernelRo {
    // In drop order: unmounted (its loop device detached, its mount point
    // removed) before the image goes.
    mount: ordo_dev::KernelMount,
    _img: tempfile::NamedTempFile,
}

impl KernelRo {
    fn mount(image: &MemDevice) -> Result<KernelRo, String> {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let img = tempfile::Builder::new()
            .prefix("ordo-app-serve-")
            .suffix(".img")
            .tempfile_in(dir)
            .map_err(|e| format!("temporary image: {e}"))?;
        backend::write_image(image, img.path()).map_err(|e| format!("writing the image: {e}"))?;
        let mount = ordo_dev::KernelMount::mount_temp(img.path(), "ro,noload")
            .map_err(|e| e.to_string())?;
        Ok(KernelRo { mount, _img: img })
    }
}

/// Copy a host directory (the kernel's mount of `/app`) into `out`,
/// hashing as [`extract`] does, so both ways of reading agree on a state.
fn extract_host(src: &Path, out: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let mut h = Fnv::default();
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    if !src.exists() {
        return Ok(h.0);
    }
    let mut stack = vec![(src.to_path_buf(), out.to_path_buf(), String::new())];
    while let Some((from, to, rel)) = stack.pop() {
        std::fs::create_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
        let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(&from)
            .map_err(|e| format!("/{APP_DIR}{rel}: readdir: {e}"))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("/{APP_DIR}{rel}: readdir: {e}"))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().to_string();
            let crel = format!("{rel}/{name}");
            let cto = to.join(&name);
            h.write(crel.as_bytes());
            let ft = e
                .file_type()
                .map_err(|err| format!("/{APP_DIR}{crel}: {err}"))?;
            if ft.is_dir() {
                h.write(b"/d");
                stack.push((e.path(), cto, crel));
            } else if ft.is_file() {
                let data = std::fs::read(e.path())
                    .map_err(|err| format!("/{APP_DIR}{crel}: read: {err}"))?;
                h.write(b"/f");
                h.write(&data);
                std::fs::write(&cto, &data).map_err(|err| format!("{}: {err}", cto.display()))?;
            } else if ft.is_symlink() {
                let target = std::fs::read_link(e.path())
                    .map_err(|err| format!("/{APP_DIR}{crel}: readlink: {err}"))?;
                h.write(b"/l");
                h.write(target.as_os_str().as_bytes());
                std::os::unix::fs::symlink(&target, &cto)
                    .map_err(|err| format!("{}: {err}", cto.display()))?;
            } else {
                h.write(b"/o");
            }
        }
    }
    Ok(h.0)
}

/// FNV-1a, stable across runs.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        // Length-separated, so ("ab","c") and ("a","bc") differ.
        self.0 ^= bytes.len() as u64;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }
}

/// The verdict on one crash state.
#[derive(Clone, Debug)]
pub struct StateVerdict {
    /// Consistent, and the update the checker found (`j`).
    pub consistent: Option<i64>,
    /// Why not (checker or file-system failure).
    pub reason: String,
    /// How the image was recovered.
    pub recovered_by: &'static str,
}

/// Cache of checker verdicts by (application directory hash, durable,
/// started): crash states that recover to the same application files
/// need one checker run.
type VerdictCache = Mutex<HashMap<(u64, i64, i64), Result<Verdict, String>>>;

/// Check one state.
fn check_state(
    p: &AppParams,
    rec: &AppRecording,
    spec: &StateSpec,
    cache: &VerdictCache,
    keep: Option<&Path>,
) -> Result<StateVerdict, CrashError> {
    let state_image = build_image(rec, spec);
    let (durable, started) = rec.promised_at(spec);
    if let Some(k) = keep {
        std::fs::create_dir_all(k).map_err(|e| CrashError::io(k.display().to_string(), e))?;
        backend::write_image(&state_image, &k.join("crash.img"))
            .map_err(|e| CrashError::io("writing crash.img", e))?;
    }
    let fs_failure = |reason: String, by: &'static str| StateVerdict {
        consistent: None,
        reason: format!("file system: {reason}"),
        recovered_by: by,
    };
    let (image, by) = match recover(p.target, Arc::new(state_image.snapshot())) {
        Ok(r) => r,
        Err(e) => return Ok(fs_failure(format!("recovery failed: {e}"), "none")),
    };
    if let Some(k) = keep {
        backend::write_image(&image, &k.join("recovered.img"))
            .map_err(|e| CrashError::io("writing recovered.img", e))?;
    }
    let (mode, data) = match p.target {
        Target::Ordo { mode, data, .. } => (mode, data),
        Target::Kernel { .. } => (ProtocolKind::named("journal"), DataMode::Ordered),
    };
    let server = match p.serve {
        Serve::Ordo => {
            let dev: Arc<dyn BlockDevice> = image;
            match backend::mount(dev, mode, data, true) {
                Ok(fs) => Server::Ordo(fs),
                Err(e) => return Ok(fs_failure(format!("read-only mount: {e}"), by)),
            }
        }
        Serve::Kernel => match KernelRo::mount(&image) {
            Ok(k) => Server::Kernel(k),
            Err(e) => return Ok(fs_failure(format!("kernel read-only mount: {e}"), by)),
        },
    };
    let tmp = tempfile::Builder::new()
        .prefix("ordo-app-state-")
        .tempdir()
        .map_err(|e| CrashError::io("temporary directory", e))?;
    let dir = tmp.path().join(APP_DIR);
    let hash = match server.extract(&dir) {
        Ok(h) => h,
        Err(e) => {
            return Ok(fs_failure(
                format!("reading the application's files: {e}"),
                by,
            ))
        }
    };
    if let Some(k) = keep {
        // The checker may change its copy (roll a journal back, replay a
        // log, probe-commit): keep what recovery left, untouched.
        let kept = k.join(APP_DIR);
        if kept != dir {
            server
                .extract(&kept)
                .map_err(|e| app_err(p.app.name(), e))?;
        }
    }
    drop(server);
    let durable = promised_durable(p, durable);
    let key = (hash, durable, started);
    let cached = cache.lock().map(|c| c.get(&key).cloned()).unwrap_or(None);
    let verdict = match cached {
        Some(v) => v,
        None => {
            // The checker works on a copy of its own (it may roll back a
            // journal, replay a log, make a probe commit).
            let v = match script::check(p.app, &dir, durable, started, p.steps) {
                Ok(v) => Ok(v),
                Err(e) => Err(e.to_string()),
            };
            if let Ok(mut c) = cache.lock() {
                c.insert(key, v.clone());
            }
            v
        }
    };
    match verdict {
        Ok(Verdict::Consistent { j }) => Ok(StateVerdict {
            consistent: Some(j),
            reason: String::new(),
            recovered_by: by,
        }),
        Ok(Verdict::Inconsistent(reason)) => Ok(StateVerdict {
            consistent: None,
            reason,
            recovered_by: by,
        }),
        Err(e) => Err(app_err(p.app.name(), format!("checker: {e}"))),
    }
}

fn build_image(rec: &AppRecording, spec: &StateSpec) -> MemDevice {
    crate::oracle::image_of(&rec.base, &rec.events, spec)
}

/// The durable update the checker is told of: the last one marked, unless
/// the application does not sync its durable points (git) or the target
/// does not keep them (`+osync`, `+nobarrier`).
fn promised_durable(p: &AppParams, marked: i64) -> i64 {
    if p.app.syncs_its_durable_points() && p.target.keeps_durability() {
        marked
    } else {
        -1
    }
}

/// Which persistence order a crash state broke: the earliest write since
/// the last flush it lost and the newest write it kept after that one, by
/// step and block class; or, for a prefix of the log, the step in flight.
pub fn breach(rec: &AppRecording, spec: &StateSpec) -> String {
    let events = &rec.events[..spec.point];
    let last_flush = events
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::Flush))
        .map_or(0, |i| i + 1);
    let kept: HashSet<usize> = spec.writes.iter().copied().collect();
    let torn = spec.torn.as_ref().map(|t| t.event);
    let describe = |i: usize| -> String {
        let class = match &events[i].kind {
            EventKind::Write(w) => format!("{:?}", w.class).to_lowercase(),
            _ => String::new(),
        };
        format!("{} [{class}]", generic(&rec.steps[events[i].op].label))
    };
    let mut dropped = None;
    for (i, e) in events.iter().enumerate().skip(last_flush) {
        let EventKind::Write(w) = &e.kind else {
            continue;
        };
        if w.fua || kept.contains(&i) {
            continue;
        }
        dropped = Some(i);
        break;
    }
    if let Some(d) = dropped {
        if let Some(k) = (d + 1..events.len())
            .rev()
            .find(|i| kept.contains(i) || torn == Some(*i))
        {
            return format!("{} lost, {} kept", describe(d), describe(k));
        }
    }
    if let Some(t) = torn {
        return format!("{} torn", describe(t));
    }
    let step = &rec.steps[spec.op_in_flight(&rec.events)];
    format!("atomicity: a crash during {}", generic(&step.label))
}

/// A step label with its numbers taken out ("update 3: commit" and
/// "update 4: commit" are the same step of the protocol).
fn generic(label: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for c in label.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
}

/// One distinct vulnerability: the broken order, how many states showed
/// it, one of them and how to rebuild it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Vulnerability {
    /// The persistence order the crash broke.
    pub what: String,
    /// States that showed it.
    pub states: u64,
    /// One of them.
    pub example: String,
    /// What the checker (or the file system) said about it.
    pub reason: String,
    /// Rebuild it.
    pub reproduce: String,
}

/// The result of an application exploration (or of a merge of shards).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AppReport {
    /// The application.
    pub app: String,
    /// What it ran on.
    pub target: String,
    /// Seed of the state sample.
    pub seed: u64,
    /// Options that change the states (for reproduce commands).
    pub options: String,
    /// Shard, if one.
    pub shard: Option<String>,
    /// Events in the write log.
    pub events: u64,
    /// Writes and flushes in it.
    pub writes: u64,
    /// Flushes in it.
    pub flushes: u64,
    /// Durable points the application was promised.
    pub marks: u64,
    /// States that exist.
    pub states_total: u64,
    /// States checked.
    pub checked: u64,
    /// Consistent states.
    pub consistent: u64,
    /// Consistent states that hold an update before the one in flight
    /// (OptFS Table 3's "old state").
    #[serde(default)]
    pub old_state: u64,
    /// Consistent states that hold the update in flight, or the last one
    /// when none was ("new state").
    #[serde(default)]
    pub new_state: u64,
    /// States whose recovery or read-back failed (counted as inconsistent).
    pub fs_failures: u64,
    /// Checker runs (states recovering to the same files share one).
    pub checker_runs: u64,
    /// States recovered by `e2fsck -fy` after ordo's repair refused.
    pub repaired_by_e2fsck: u64,
    /// Distinct vulnerabilities, most frequent first.
    pub vulnerabilities: Vec<Vulnerability>,
    /// Wall time in milliseconds.
    pub elapsed_ms: u64,
}

impl AppReport {
    /// States that were not consistent.
    pub fn inconsistent(&self) -> u64 {
        self.checked - self.consistent
    }

    /// The human summary.
    pub fn summary(&self, shown: usize) -> String {
        let mut s = format!(
            "app {} on {}: {} of {} states consistent ({} old, {} new; {} inconsistent, {} of them file-system failures); {} distinct vulnerabilities\n",
            self.app,
            self.target,
            self.consistent,
            self.checked,
            self.old_state,
            self.new_state,
            self.inconsistent(),
            self.fs_failures,
            self.vulnerabilities.len()
        );
        s.push_str(&format!(
            "  log: {} writes, {} flushes, {} durable marks; {} states exist{}; {} checker runs; {} repaired by e2fsck -fy; {:.1} s\n",
            self.writes,
            self.flushes,
            self.marks,
            self.states_total,
            self.shard.as_ref().map(|s| format!(" (shard {s})")).unwrap_or_default(),
            self.checker_runs,
            self.repaired_by_e2fsck,
            self.elapsed_ms as f64 / 1000.0
        ));
        for v in self.vulnerabilities.iter().take(shown) {
            s.push_str(&format!(
                "  vulnerability ({} states): {}\n    e.g. state {}: {}\n    reproduce: {}\n",
                v.states, v.what, v.example, v.reason, v.reproduce
            ));
        }
        if self.vulnerabilities.len() > shown {
            s.push_str(&format!(
                "  ... and {} more\n",
                self.vulnerabilities.len() - shown
            ));
        }
        s
    }

    /// Write as JSON.
    pub fn write_json(&self, path: &str) -> Result<(), CrashError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })?;
        std::fs::write(path, text).map_err(|e| CrashError::io(format!("writing {path}"), e))
    }

    /// Read a JSON report.
    pub fn read_json(path: &str) -> Result<AppReport, CrashError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CrashError::io(format!("reading {path}"), e))?;
        serde_json::from_str(&text).map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })
    }
}

/// Combine the reports of the shards of one run.
pub fn merge(reports: &[AppReport]) -> Result<AppReport, CrashError> {
    let Some(first) = reports.first() else {
        return Err(CrashError::Invalid("nothing to merge".into()));
    };
    let mut m = first.clone();
    m.shard = None;
    m.vulnerabilities.clear();
    for f in [
        &mut m.checked,
        &mut m.consistent,
        &mut m.old_state,
        &mut m.new_state,
        &mut m.fs_failures,
        &mut m.checker_runs,
        &mut m.repaired_by_e2fsck,
        &mut m.elapsed_ms,
    ] {
        *f = 0;
    }
    let mut vulns: BTreeMap<String, Vulnerability> = BTreeMap::new();
    let mut shards = HashSet::new();
    for r in reports {
        if let Some(s) = &r.shard {
            if !shards.insert(s.clone()) {
                return Err(CrashError::Invalid(format!("shard {s} is given twice")));
            }
        }
        if (
            r.app.as_str(),
            r.target.as_str(),
            r.seed,
            r.options.as_str(),
            r.states_total,
        ) != (
            m.app.as_str(),
            m.target.as_str(),
            m.seed,
            m.options.as_str(),
            m.states_total,
        ) {
            return Err(CrashError::Invalid(format!(
                "reports of different runs: {} on {} (seed {}, {}) and {} on {} (seed {}, {})",
                m.app, m.target, m.seed, m.options, r.app, r.target, r.seed, r.options
            )));
        }
        m.checked += r.checked;
        m.consistent += r.consistent;
        m.old_state += r.old_state;
        m.new_state += r.new_state;
        m.fs_failures += r.fs_failures;
        m.checker_runs += r.checker_runs;
        m.repaired_by_e2fsck += r.repaired_by_e2fsck;
        m.elapsed_ms = m.elapsed_ms.max(r.elapsed_ms);
        for v in &r.vulnerabilities {
            vulns
                .entry(v.what.clone())
                .and_modify(|e| e.states += v.states)
                .or_insert_with(|| v.clone());
        }
    }
    m.vulnerabilities = sorted(vulns);
    Ok(m)
}

fn sorted(v: BTreeMap<String, Vulnerability>) -> Vec<Vulnerability> {
    let mut v: Vec<Vulnerability> = v.into_values().collect();
    v.sort_by(|a, b| b.states.cmp(&a.states).then(a.what.cmp(&b.what)));
    v
}

/// Run an application exploration.
pub fn explore_app(p: &AppParams) -> Result<AppReport, CrashError> {
    if let Some((i, n)) = p.shard {
        if n == 0 || i >= n {
            return Err(CrashError::Invalid(format!("bad shard {i}/{n}")));
        }
    }
    if p.keep.is_some() && p.only_state.is_none() {
        return Err(CrashError::Invalid("--keep needs --state".into()));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(p.jobs)
        .build()
        .map_err(|e| CrashError::Invalid(format!("thread pool: {e}")))?;
    pool.install(|| explore_in_pool(p))
}

fn explore_in_pool(p: &AppParams) -> Result<AppReport, CrashError> {
    let started_at = Instant::now();
    let rec = record_app(p)?;
    let count =
        |f: &dyn Fn(&EventKind) -> bool| rec.events.iter().filter(|e| f(&e.kind)).count() as u64;
    let mut report = AppReport {
        app: p.app.to_string(),
        target: p.target.to_string(),
        seed: p.states.seed,
        options: p.state_options(),
        shard: p.shard.map(|(i, n)| format!("{i}/{n}")),
        events: rec.events.len() as u64,
        writes: count(&|k| matches!(k, EventKind::Write(_))),
        flushes: count(&|k| matches!(k, EventKind::Flush)),
        marks: rec.marks.len() as u64,
        states_total: 0,
        checked: 0,
        consistent: 0,
        old_state: 0,
        new_state: 0,
        fs_failures: 0,
        checker_runs: 0,
        repaired_by_e2fsck: 0,
        vulnerabilities: Vec::new(),
        elapsed_ms: 0,
    };
    let mut all = match p.only_state {
        Some(id) => {
            let at = states::states_at(&rec.events, 0, id.point.min(rec.events.len()), &p.states);
            if id.sequence != 0 || id.point > rec.events.len() || id.index >= at.len() {
                return Err(CrashError::Invalid(format!(
                    "state {id} does not exist (the log has {} events; point {} has {} states; the sequence is 0)",
                    rec.events.len(),
                    id.point,
                    at.len()
                )));
            }
            vec![at[id.index].clone()]
        }
        None => states::all_states(&rec.events, 0, &p.states),
    };
    report.states_total = all.len() as u64;
    if let Some((i, n)) = p.shard {
        all = all
            .into_iter()
            .enumerate()
            .filter(|(g, _)| g % n == i)
            .map(|(_, s)| s)
            .collect();
    }
    if let Some(max) = p.max_states {
        if all.len() > max {
            let mut idx: Vec<usize> = (0..all.len()).collect();
            idx.shuffle(&mut ChaCha8Rng::seed_from_u64(p.states.seed ^ 0xa99));
            let mut keep: Vec<usize> = idx.into_iter().take(max).collect();
            keep.sort_unstable();
            all = keep.into_iter().map(|i| all[i].clone()).collect();
        }
    }
    let bar = if p.progress {
        let b = ProgressBar::new(all.len() as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} states ({per_sec}, eta {eta}) {msg}",
        ) {
            b.set_style(style);
        }
        b.set_message(format!("{} on {}", p.app, p.target));
        b
    } else {
        ProgressBar::hidden()
    };
    let cache: VerdictCache = Mutex::new(HashMap::new());
    let keep = p.keep.as_deref();
    let verdicts: Vec<Result<StateVerdict, CrashError>> = all
        .par_iter()
        .map(|spec| {
            if crate::stop::requested() {
                return Err(CrashError::Interrupted);
            }
            let v = check_state(p, &rec, spec, &cache, keep);
            bar.inc(1);
            v
        })
        .collect();
    bar.finish_and_clear();
    if crate::stop::requested() {
        return Err(CrashError::Interrupted);
    }
    let mut vulns: BTreeMap<String, Vulnerability> = BTreeMap::new();
    for (spec, v) in all.iter().zip(verdicts) {
        let v = v?;
        report.checked += 1;
        if v.recovered_by == "e2fsck -fy" {
            report.repaired_by_e2fsck += 1;
        }
        if let Some(j) = v.consistent {
            report.consistent += 1;
            if j < rec.promised_at(spec).1 {
                report.old_state += 1;
            } else {
                report.new_state += 1;
            }
            continue;
        }
        if v.reason.starts_with("file system:") {
            report.fs_failures += 1;
        }
        let id = crate::explore::StateId {
            sequence: 0,
            point: spec.point,
            index: spec.index,
        };
        let (marked, started) = rec.promised_at(spec);
        let durable = match promised_durable(p, marked) {
            -1 if marked >= 0 => format!("update {marked} marked, none promised durable"),
            d => format!("durable update {d}"),
        };
        vulns
            .entry(breach(&rec, spec))
            .and_modify(|e| e.states += 1)
            .or_insert_with(|| Vulnerability {
                what: breach(&rec, spec),
                states: 1,
                example: id.to_string(),
                reason: format!("{} ({durable}, in flight {started})", v.reason),
                reproduce: p.reproduce_command(id),
            });
    }
    report.checker_runs = cache.lock().map(|c| c.len() as u64).unwrap_or(0);
    report.vulnerabilities = sorted(vulns);
    report.elapsed_ms = started_at.elapsed().as_millis() as u64;
    Ok(report)
}

/// One cell of the application table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableCell {
    /// Row.
    pub app: String,
    /// Column.
    pub target: String,
    /// The run's report.
    pub report: AppReport,
}

/// The application table: consistent / checked and distinct
/// vulnerabilities per application and target, as markdown.
pub fn table(cells: &[TableCell]) -> String {
    let mut apps: Vec<&str> = Vec::new();
    let mut targets: Vec<&str> = Vec::new();
    for c in cells {
        if !apps.contains(&c.app.as_str()) {
            apps.push(&c.app);
        }
        if !targets.contains(&c.target.as_str()) {
            targets.push(&c.target);
        }
    }
    let mut s = String::from("| application |");
    for t in &targets {
        s.push_str(&format!(" {t} |"));
    }
    s.push_str("\n| --- |");
    for _ in &targets {
        s.push_str(" ---: |");
    }
    s.push('\n');
    for a in &apps {
        s.push_str(&format!("| {a} |"));
        for t in &targets {
            match cells.iter().find(|c| c.app == *a && c.target == *t) {
                Some(c) => s.push_str(&format!(
                    " {}/{} ({}) |",
                    c.report.consistent,
                    c.report.checked,
                    c.report.vulnerabilities.len()
                )),
                None => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s.push_str(
        "\nEach cell: crash states consistent / states checked (distinct vulnerabilities).\n",
    );
    s
}
