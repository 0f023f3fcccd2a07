//! Protocol statistics of a mount, published for `ordo info`.
//!
//! `ordo mount` serves the file system in its own process, so `ordo info`
//! cannot ask the protocol for its counters. The kernel publishes its
//! fast-commit counters in `/proc/fs/ext4/<dev>/fc_info`; ordo does the
//! same with a small JSON file per image under `/run/ordo/` (or
//! `$ORDO_RUN_DIR`), rewritten about once a second by a thread of the
//! mount process and a last time after the unmount, marked as ended.
//! Each write goes to a temporary file renamed over the old one, so a
//! reader sees either the previous figures or the new ones.
//!
//! The file is named after the canonical image path (which a mount of the
//! same image replaces) and records the mountpoint, so both find it. It
//! records the pid and the pid's start time: a file that never ended and
//! whose process is gone is a mount that crashed, never a live one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ordo_bench::commits::{ProtocolStats, TIMER_OR_OTHER};
use ordo_fs::Fs;
use serde::{Deserialize, Serialize};

use crate::image_pool::PoolStats;

/// Environment variable overriding the directory of the stats files.
pub const RUN_DIR_ENV: &str = "ORDO_RUN_DIR";
/// Where the stats files live by default.
const DEFAULT_RUN_DIR: &str = "/run/ordo";
/// How often a mount rewrites its stats file.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// The version of the file's layout.
const FORMAT_VERSION: u32 = 1;

/// The directory of the stats files.
pub fn run_dir() -> PathBuf {
    std::env::var_os(RUN_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

/// What a mount publishes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MountStats {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The `ordo mount` process.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field
    /// 22), so that a reused pid is not taken for the mount.
    pub pid_start_ticks: Option<u64>,
    /// The image, canonicalized.
    pub image: PathBuf,
    /// The mountpoint, canonicalized.
    pub mountpoint: PathBuf,
    /// The protocol (`fast_commit`, ...).
    pub mode: String,
    /// When the mount started, seconds since the epoch.
    pub started_unix: u64,
    /// When the figures were taken.
    pub updated_unix: u64,
    /// When the mount ended (set by the last write, after the unmount).
    pub ended_unix: Option<u64>,
    /// Whether the unmount left the image clean (with `ended_unix`).
    pub unmount_ok: Option<bool>,
    /// `Fs::protocol_stats()`.
    pub stats: BTreeMap<String, u64>,
    /// The durability calls the protocol implements natively
    /// (`Fs::native_durability_calls`); `None` in files of an ordo that
    /// did not record them.
    #[serde(default)]
    pub native_calls: Option<Vec<String>>,
    /// The block-image pool's counts (`image_pool`); `None` when the
    /// mount had no pool, or in files of an ordo without one.
    #[serde(default)]
    pub image_pool: Option<PoolStats>,
}

/// What became of the mount a stats file describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountState {
    /// The process is serving it now.
    Live,
    /// It was unmounted.
    Ended,
    /// The process died without ending it.
    Crashed,
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A process's start time in clock ticks since boot, `None` when it does
/// not exist.
fn pid_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted
    // from the last ')', which closes field 2; field 22 is 20 further.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// 64-bit FNV-1a: a file name that is the same in every build.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The stats file of the image at `image` (canonical) in `dir`.
pub fn stats_path(dir: &Path, image: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let base: String = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(32)
        .collect();
    dir.join(format!(
        "{base}-{:016x}.json",
        fnv1a(image.as_os_str().as_bytes())
    ))
}

impl MountStats {
    /// The state of the mount, judged now.
    pub fn state(&self) -> MountState {
        if self.ended_unix.is_some() {
            return MountState::Ended;
        }
        match (pid_start_ticks(self.pid), self.pid_start_ticks) {
            (Some(now), Some(then)) if now == then => MountState::Live,
            (Some(_), None) => MountState::Live,
            _ => MountState::Crashed,
        }
    }

    /// Writes the file atomically: a temporary file renamed over it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, text + "\n")?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// Reads a stats file.
    pub fn read(path: &Path) -> Result<MountStats, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let s: MountStats =
            serde_json::from_str(&text).map_err(|e| format!("not a stats file: {e}"))?;
        if s.format != FORMAT_VERSION {
            return Err(format!(
                "stats file format {} (this ordo reads {FORMAT_VERSION})",
                s.format
            ));
        }
        Ok(s)
    }
}

/// Remove the stats files of images that no longer exist (scratch images
/// of tests and benchmarks), unless their mount is still live: the figures
/// of a mount are kept for as long as there is an image to ask about.
pub fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        if let Ok(s) = MountStats::read(&path) {
            if !s.image.exists() && s.state() != MountState::Live {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// What a look-up found.
#[derive(Debug)]
pub enum Lookup {
    /// No mount recorded.
    Missing,
    /// A file that cannot be read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A mount's figures.
    Found(Box<MountStats>),
}

/// The stats of the last mount of `image` (canonical).
pub fn find_by_image(dir: &Path, image: &Path) -> Lookup {
    let path = stats_path(dir, image);
    if !path.exists() {
        return Lookup::Missing;
    }
    match MountStats::read(&path) {
        Ok(s) => Lookup::Found(Box::new(s)),
        Err(why) => Lookup::Unreadable { path, why },
    }
}

/// The stats of the mount on `mountpoint` (canonical): the live one, or
/// else the one that started last.
pub fn find_by_mountpoint(dir: &Path, mountpoint: &Path) -> Lookup {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Lookup::Missing;
    };
    let mut best: Option<MountStats> = None;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(s) = MountStats::read(&p) else {
            continue;
        };
        if s.mountpoint != mountpoint {
            continue;
        }
        let better = match &best {
            None => true,
            Some(b) => {
                let live = |m: &MountStats| m.state() == MountState::Live;
                (live(&s), s.started_unix) > (live(b), b.started_unix)
            }
        };
        if better {
            best = Some(s);
        }
    }
    best.map_or(Lookup::Missing, |s| Lookup::Found(Box::new(s)))
}

fn time(secs: u64) -> String {
    crate::time_string(u32::try_from(secs).unwrap_or(u32::MAX))
}

/// The readable table of a mount's statistics.
pub fn format_stats(s: &MountStats, state: MountState, now_unix: u64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let whose = format!(
        "mode={}, pid {}, {} on {}",
        s.mode,
        s.pid,
        s.image.display(),
        s.mountpoint.display()
    );
    let _ = match state {
        MountState::Live => writeln!(
            o,
            "Protocol statistics of the live mount ({whose}), mounted since {}, updated {} s ago:",
            time(s.started_unix),
            now_unix.saturating_sub(s.updated_unix)
        ),
        MountState::Ended => writeln!(
            o,
            "Protocol statistics of the last mount ({whose}), mounted {}, ended {}{}:",
            time(s.started_unix),
            time(s.ended_unix.unwrap_or(s.updated_unix)),
            if s.unmount_ok == Some(false) {
                " (the unmount failed: check the image)"
            } else {
                ""
            }
        ),
        MountState::Crashed => writeln!(
            o,
            "Protocol statistics of the last mount ({whose}), mounted {}: it never ended, \
the process died (crashed); figures as of {}:",
            time(s.started_unix),
            time(s.updated_unix)
        ),
    };
    if let Some(native) = &s.native_calls {
        let _ = writeln!(o, "  {}", durability_calls_line(native));
    }
    o.push_str(&format_counts(&s.mode, &s.stats));
    if let Some(p) = &s.image_pool {
        let _ = writeln!(o, "{}", image_pool_line(p));
    }
    o
}

/// The block-image pool's counts as one line of `ordo info`.
pub fn image_pool_line(p: &PoolStats) -> String {
    format!(
        "  block-image pool: {} images from slots faulted in ahead, {} from the system allocator \
(no slot ready), {} slots faulted in, {} returned to the kernel, {} free",
        p.served, p.missed, p.faulted, p.returned, p.free
    )
}

/// What osync, dsync and streamsync are on a mount whose protocol
/// implements `native` of them itself (docs/API.md).
pub fn durability_calls_line(native: &[String]) -> String {
    let is = |call: &str, fallback: &str| {
        if native.iter().any(|n| n == call) {
            format!("{call}=native")
        } else {
            format!("{call}={fallback}")
        }
    };
    format!(
        "durability calls: {}, {}, {}",
        is("osync", "fsync"),
        is("dsync", "fsync"),
        is("streamsync", "sync")
    )
}

/// The statistics as lines: fast-commit figures as a table, any other
/// protocol's counters one per line.
pub fn format_counts(mode: &str, stats: &BTreeMap<String, u64>) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let row = |o: &mut String, name: &str, value: String, note: String| {
        let _ = writeln!(o, "  {name:<32}{value:>10}{note}");
    };
    let pct = |a: u64, b: u64, of: &str| {
        if b == 0 {
            String::new()
        } else {
            format!("  ({:.1} % of {of})", 100.0 * a as f64 / b as f64)
        }
    };
    let p = ProtocolStats {
        mode: mode.to_string(),
        stats: stats.clone(),
    };
    let counts = p.commit_counts();
    // A protocol with fast commits reports their count; the others' commit
    // counts (JBD2's) are shown with the rest of their statistics.
    match counts.filter(|c| c.fc_blocks.is_some() || c.fast_commits > 0) {
        Some(c) => {
            let all = c.fast_commits + c.full_commits;
            row(
                &mut o,
                "fast commits",
                c.fast_commits.to_string(),
                pct(c.fast_commits, all, "all commits"),
            );
            row(
                &mut o,
                "full commits",
                c.full_commits.to_string(),
                String::new(),
            );
            for (reason, n) in &c.ineligible {
                let name = if reason == TIMER_OR_OTHER {
                    "timer/other (no reason)".to_string()
                } else {
                    format!("ineligible: {reason}")
                };
                row(&mut o, &format!("  {name}"), n.to_string(), String::new());
            }
            let single = c.single_block_commits.unwrap_or(0);
            row(
                &mut o,
                "single-block commits",
                single.to_string(),
                pct(single, c.fast_commits, "fast commits"),
            );
            let blocks = c.fc_blocks.unwrap_or(0);
            row(
                &mut o,
                "fc blocks per fast commit",
                if c.fast_commits == 0 {
                    "-".into()
                } else {
                    format!("{:.2}", blocks as f64 / c.fast_commits as f64)
                },
                format!("  ({blocks} blocks)"),
            );
            row(
                &mut o,
                "jbd2 commits",
                c.jbd2_commits.unwrap_or(0).to_string(),
                String::new(),
            );
        }
        None if stats.is_empty() => {
            let _ = writeln!(o, "  (mode={mode} keeps no statistics)");
        }
        None => {
            for (k, v) in stats {
                row(&mut o, k, v.to_string(), String::new());
            }
        }
    }
    o
}

/// A mount's stats file, kept up to date while it is mounted.
pub struct Publisher {
    path: PathBuf,
    record: MountStats,
    warned: bool,
}

impl Publisher {
    /// Starts publishing for a mount of `image` on `mountpoint`; writes
    /// the first figures now so that the file exists once the mount
    /// shows.
    pub fn start(image: &Path, mountpoint: &Path, fs: &Fs) -> Publisher {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let image = canon(image);
        let dir = run_dir();
        let now = now_unix();
        let (mode, stats) = fs.protocol_stats();
        let mut p = Publisher {
            path: stats_path(&dir, &image),
            record: MountStats {
                format: FORMAT_VERSION,
                pid: std::process::id(),
                pid_start_ticks: pid_start_ticks(std::process::id()),
                image,
                mountpoint: canon(mountpoint),
                mode,
                started_unix: now,
                updated_unix: now,
                ended_unix: None,
                unmount_ok: None,
                stats: stats.into_iter().collect(),
                native_calls: Some(
                    fs.native_durability_calls()
                        .names()
                        .into_iter()
                        .map(String::from)
                        .collect(),
                ),
                image_pool: crate::image_pool_stats(),
            },
            warned: false,
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!(
                "ordo mount: cannot publish statistics in {}: {e}",
                dir.display()
            );
            p.warned = true;
        }
        prune(&dir);
        p.write();
        p
    }

    fn write(&mut self) {
        if let Err(e) = self.record.write(&self.path) {
            if !self.warned {
                eprintln!(
                    "ordo mount: cannot write statistics to {}: {e}",
                    self.path.display()
                );
                self.warned = true;
            }
        }
    }

    /// New figures.
    pub fn update(&mut self, stats: Vec<(String, u64)>) {
        self.take_figures(stats, now_unix());
        self.write();
    }

    /// The protocol's figures and the block-image pool's, as of `now`.
    fn take_figures(&mut self, stats: Vec<(String, u64)>, now: u64) {
        self.record.stats = stats.into_iter().collect();
        self.record.image_pool = crate::image_pool_stats();
        self.record.updated_unix = now;
    }

    /// The last write, with the last figures: the mount has ended.
    pub fn end(mut self, stats: Vec<(String, u64)>, unmount_ok: bool) -> MountStats {
        let now = now_unix();
        self.take_figures(stats, now);
        self.record.ended_unix = Some(now);
        self.record.unmount_ok = Some(unmount_ok);
        self.write();
        self.record
    }

    /// Refreshes the file every [`REFRESH_INTERVAL`] from a thread until
    /// [`Refresher::stop`].
    pub fn refresh_in_background(self, fs: Arc<Fs>) -> Refresher {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("ordo-stats".into())
            .spawn(move || {
                let mut p = self;
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(REFRESH_INTERVAL)
                {
                    p.update(fs.protocol_stats().1);
                }
                p
            });
        match handle {
            Ok(h) => Refresher::Running { stop, handle: h },
            Err(e) => {
                eprintln!("ordo mount: no statistics thread: {e}");
                // The publisher went with the closure: no last write.
                Refresher::Idle(None)
            }
        }
    }
}

/// The thread refreshing a [`Publisher`].
pub enum Refresher {
    /// Refreshing.
    Running {
        /// Dropping or sending stops the thread.
        stop: mpsc::Sender<()>,
        /// The thread, which hands the publisher back.
        handle: JoinHandle<Publisher>,
    },
    /// No thread could be started.
    Idle(Option<Box<Publisher>>),
}

impl Refresher {
    /// Stops the thread (it lets go of the file system) and returns the
    /// publisher.
    pub fn stop(self) -> Option<Publisher> {
        match self {
            Refresher::Running { stop, handle } => {
                let _ = stop.send(());
                handle.join().ok()
            }
            Refresher::Idle(p) => p.map(|b| *b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, ticks: Option<u64>) -> MountStats {
        let stats = [
            ("fc_fast_commits", 97),
            ("fc_full_commits", 3),
            ("fc_single_block_commits", 80),
            ("fc_blocks_written", 110),
            ("fc_ineligible_no_live_log", 1),
            ("fc_ineligible_rename_dir", 1),
            ("jbd2_commits", 3),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        MountStats {
            format: FORMAT_VERSION,
            pid,
            pid_start_ticks: ticks,
            image: "/tmp/x/img".into(),
            mountpoint: "/tmp/x/mnt".into(),
            mode: "fast_commit".into(),
            started_unix: 1_795_361_721,
            updated_unix: 1_795_361_731,
            ended_unix: None,
            unmount_ok: None,
            stats,
            native_calls: None,
            image_pool: None,
        }
    }

    #[test]
    fn durability_calls_say_native_or_their_fallback() {
        assert_eq!(
            durability_calls_line(&[]),
            "durability calls: osync=fsync, dsync=fsync, streamsync=sync"
        );
        assert_eq!(
            durability_calls_line(&["osync".into(), "streamsync".into()]),
            "durability calls: osync=native, dsync=fsync, streamsync=native"
        );
        let mut s = sample(1, None);
        let t = format_stats(&s, MountState::Ended, 0);
        assert!(!t.contains("durability calls"), "unknown: not shown: {t}");
        s.native_calls = Some(Vec::new());
        let t = format_stats(&s, MountState::Ended, 0);
        assert!(t.contains("durability calls: osync=fsync"), "{t}");
    }

    #[test]
    fn the_image_pool_line_shows_when_the_mount_had_a_pool_and_survives_the_file() {
        let mut s = sample(1, None);
        let without = format_stats(&s, MountState::Live, s.updated_unix);
        assert!(!without.contains("block-image pool"), "{without}");
        s.image_pool = Some(PoolStats {
            free: 512,
            served: 40_000,
            missed: 3,
            faulted: 40_512,
            returned: 0,
        });
        let with = format_stats(&s, MountState::Live, s.updated_unix);
        let line = with
            .lines()
            .find(|l| l.contains("block-image pool"))
            .unwrap_or_else(|| panic!("no pool line in:\n{with}"));
        assert!(
            line.contains("40000 images from slots") && line.contains("3 from the system"),
            "{line}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        s.write(&path).unwrap();
        assert_eq!(MountStats::read(&path).unwrap().image_pool, s.image_pool);
    }

    #[test]
    fn fast_commit_table_has_every_figure() {
        let s = sample(1, None);
        let t = format_counts(&s.mode, &s.stats);
        let line = |name: &str| {
            t.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no '{name}' in:\n{t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            line("fast commits"),
            "fast commits 97 (97.0 % of all commits)"
        );
        assert_eq!(line("full commits"), "full commits 3");
        assert_eq!(line("ineligible: no_live_log"), "ineligible: no_live_log 1");
        assert_eq!(line("ineligible: rename_dir"), "ineligible: rename_dir 1");
        assert_eq!(line("timer/other"), "timer/other (no reason) 1");
        assert_eq!(
            line("single-block"),
            "single-block commits 80 (82.5 % of fast commits)"
        );
        assert_eq!(
            line("fc blocks per fast commit"),
            "fc blocks per fast commit 1.13 (110 blocks)"
        );
        assert_eq!(line("jbd2 commits"), "jbd2 commits 3");
        let other = format_counts("journal", &[("commits".to_string(), 4)].into());
        assert!(other.contains("commits") && other.contains('4'), "{other}");
        assert!(format_counts("async", &BTreeMap::new()).contains("no statistics"));
    }

    #[test]
    fn dead_and_reused_pids_are_crashed_not_live() {
        let me = std::process::id();
        let ticks = pid_start_ticks(me);
        assert!(ticks.is_some());
        assert_eq!(sample(me, ticks).state(), MountState::Live);
        // The same pid, started at another time: a reused pid.
        assert_eq!(
            sample(me, ticks.map(|t| t + 1)).state(),
            MountState::Crashed
        );
        // A pid above the kernel's limit never exists.
        let dead = sample(u32::MAX - 1, Some(5));
        assert_eq!(dead.state(), MountState::Crashed);
        let t = format_stats(&dead, dead.state(), dead.updated_unix);
        assert!(t.contains("crashed"), "{t}");
        let mut ended = dead;
        ended.ended_unix = Some(ended.updated_unix);
        assert_eq!(ended.state(), MountState::Ended);
        assert!(format_stats(&ended, MountState::Ended, 0).contains("ended 2026-11-22"));
    }

    #[test]
    fn files_of_removed_images_are_pruned_unless_live() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("kept.img");
        std::fs::write(&img, b"x").unwrap();
        let gone = dir.path().join("gone.img");
        let me = std::process::id();
        let mut kept = sample(me, pid_start_ticks(me));
        kept.image = img.clone();
        kept.ended_unix = Some(1);
        let mut dead = kept.clone();
        dead.image = gone.clone();
        let mut live = sample(me, pid_start_ticks(me));
        live.image = dir.path().join("gone-but-mounted.img");
        for s in [&kept, &dead, &live] {
            s.write(&stats_path(dir.path(), &s.image)).unwrap();
        }
        prune(dir.path());
        assert!(stats_path(dir.path(), &img).exists());
        assert!(!stats_path(dir.path(), &gone).exists());
        assert!(stats_path(dir.path(), &live.image).exists());
    }

    #[test]
    fn files_are_found_by_image_and_by_mountpoint() {
        let dir = tempfile::tempdir().unwrap();
        let s = sample(u32::MAX - 1, None);
        let path = stats_path(dir.path(), &s.image);
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("img-"));
        assert_ne!(path, stats_path(dir.path(), Path::new("/tmp/y/img")));
        assert!(matches!(
            find_by_image(dir.path(), &s.image),
            Lookup::Missing
        ));
        s.write(&path).unwrap();
        match find_by_image(dir.path(), &s.image) {
            Lookup::Found(f) => assert_eq!(*f, s),
            other => panic!("{other:?}"),
        }
        match find_by_mountpoint(dir.path(), &s.mountpoint) {
            Lookup::Found(f) => assert_eq!(f.image, s.image),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            find_by_mountpoint(dir.path(), Path::new("/elsewhere")),
            Lookup::Missing
        ));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, "{ half a file").unwrap();
        assert!(matches!(
            find_by_image(dir.path(), &s.image),
            Lookup::Unreadable { .. }
        ));
    }
}
