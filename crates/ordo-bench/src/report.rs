//! Rows of results, the table, and the JSON report.
//!
//! One row per (workload case, target). Device figures per operation come
//! from the kernel's counters of the target's loop device whenever there is
//! one, for every target alike; ordo's own counters (by block class) are
//! reported next to them and checked against them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::commits::CommitFigures;
use crate::error::{BenchError, Result};
use crate::stats::LatencySummary;
use crate::sys::BlockStat;
use crate::target::{ClassFigures, OrdoCounters};

/// What the I/O scheduler of an `ordo-lib:MODE,sched=P` target did over
/// the measured window (the unmount's write-back excluded): Ganger &
/// Patt's "disk requests" and "I/O response time".
#[derive(Clone, Debug, Serialize)]
pub struct SchedFigures {
    /// Requests the file system queued (reads, writes, flushes).
    pub requests: u64,
    /// Read and write requests the device received, after concatenation.
    pub disk_requests: u64,
    /// Average driver response time (queue + service), ms.
    pub avg_response_ms: f64,
    /// Average queue time, ms.
    pub avg_queue_ms: f64,
    /// Times are the timing model's virtual time.
    pub virtual_time: bool,
}

impl SchedFigures {
    /// From the scheduler's statistics.
    pub fn new(s: &ordo_dev::SchedStats) -> SchedFigures {
        let all = s.all();
        let per = |ns: u64| match all.requests {
            0 => 0.0,
            n => ns as f64 / n as f64 / 1e6,
        };
        SchedFigures {
            requests: all.requests,
            disk_requests: s.disk_requests,
            avg_response_ms: per(all.response_ns()),
            avg_queue_ms: per(all.queue_ns),
            virtual_time: s.virtual_time,
        }
    }
}

/// ordo's own figures for one row.
#[derive(Clone, Debug, Serialize)]
pub struct OrdoFigures {
    /// Write requests per operation.
    pub writes_per_op: f64,
    /// KiB written per operation.
    pub kib_per_op: f64,
    /// Cache flushes per operation.
    pub flushes_per_op: f64,
    /// FUA writes per operation.
    pub fua_writes_per_op: f64,
    /// Per block class: writes and KiB per operation (classes with no
    /// writes left out).
    pub by_class_per_op: BTreeMap<String, ClassPerOp>,
    /// The raw counters of the window.
    pub counters: OrdoCounters,
}

/// One block class's writes per operation.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ClassPerOp {
    /// Write requests per operation.
    pub writes: f64,
    /// KiB written per operation.
    pub kib: f64,
}

impl OrdoFigures {
    /// Per-operation figures of `c` over `ops` operations.
    pub fn new(c: &OrdoCounters, ops: u64) -> OrdoFigures {
        let per = |x: u64| x as f64 / ops.max(1) as f64;
        let t: ClassFigures = c.total();
        let mut by_class = BTreeMap::new();
        for (i, k) in c.by_class.iter().enumerate() {
            if k.writes == 0 {
                continue;
            }
            let name = ordo_dev::BlockClass::ALL
                .get(i)
                .map(|b| b.name())
                .unwrap_or("?");
            by_class.insert(
                name.to_string(),
                ClassPerOp {
                    writes: per(k.writes),
                    kib: per(k.write_bytes) / 1024.0,
                },
            );
        }
        OrdoFigures {
            writes_per_op: per(t.writes),
            kib_per_op: per(t.write_bytes) / 1024.0,
            flushes_per_op: per(c.flushes),
            fua_writes_per_op: per(t.fua_writes),
            by_class_per_op: by_class,
            counters: c.clone(),
        }
    }
}

/// Slack allowed between the kernel's and ordo's byte counts.
const AGREE_SLACK_BYTES: u64 = 256 << 10;
/// Slack allowed between the kernel's and ordo's flush counts.
const AGREE_SLACK_FLUSHES: u64 = 4;

/// Whether the kernel's counters of ordo's device agree with ordo's own,
/// and a note saying how.
///
/// ordo writes `/dev/loopN` through the kernel's page cache, so a block
/// written twice between two flushes may reach the device once: the kernel
/// may count *fewer* bytes than ordo wrote, never (beyond slack) more, and
/// at least half. Each ordo flush is one flush of the device, and so is
/// each FUA write (`RWF_DSYNC` on a block device ends in a flush); the
/// block layer may combine flushes that overlap.
pub fn counters_agree(kernel: &BlockStat, ordo: &OrdoCounters) -> (bool, String) {
    let t = ordo.total();
    let k_bytes = kernel.write_bytes();
    let o_bytes = t.write_bytes;
    let bytes_ok = k_bytes <= o_bytes + o_bytes / 50 + AGREE_SLACK_BYTES
        && k_bytes + AGREE_SLACK_BYTES >= o_bytes / 2;
    let o_flushes = ordo.flushes + t.fua_writes;
    let flushes_ok = kernel.flushes <= o_flushes + AGREE_SLACK_FLUSHES
        && kernel.flushes + AGREE_SLACK_FLUSHES >= o_flushes / 2;
    let note = format!(
        "kernel {} writes / {} KiB / {} flushes; ordo {} writes / {} KiB / {} flushes + {} FUA",
        kernel.writes,
        k_bytes / 1024,
        kernel.flushes,
        t.writes,
        o_bytes / 1024,
        ordo.flushes,
        t.fua_writes
    );
    (bytes_ok && flushes_ok, note)
}

/// One result row: a workload case on a target.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    /// Target name, as given.
    pub target: String,
    /// Workload name.
    pub workload: String,
    /// Case label within the workload ("n=1"), possibly empty.
    pub case: String,
    /// The workload's parameters.
    pub params: serde_json::Value,
    /// `--scale`.
    pub scale: String,
    /// `--seed`.
    pub seed: u64,
    /// Set when the case could not run on this target; every figure is
    /// then absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Operations done.
    pub ops: u64,
    /// Measured interval, seconds (virtual seconds under a timing model).
    pub elapsed_s: f64,
    /// True if times are a timing model's virtual time.
    pub virtual_time: bool,
    /// The timing model, if any.
    pub disk: Option<String>,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// fsyncs timed.
    pub fsyncs: u64,
    /// fsync latency, µs (absent when the workload timed none).
    pub fsync_us_mean: Option<f64>,
    /// Median fsync latency, µs.
    pub fsync_us_p50: Option<f64>,
    /// 99th-percentile fsync latency, µs.
    pub fsync_us_p99: Option<f64>,
    /// Largest fsync latency, µs.
    pub fsync_us_max: Option<f64>,
    /// Device write requests per operation.
    pub writes_per_op: Option<f64>,
    /// KiB written to the device per operation.
    pub kib_per_op: Option<f64>,
    /// Device cache flushes per operation.
    pub flushes_per_op: Option<f64>,
    /// Device writes per fsync (when the workload timed fsyncs).
    pub writes_per_fsync: Option<f64>,
    /// KiB per fsync.
    pub kib_per_fsync: Option<f64>,
    /// Flushes per fsync.
    pub flushes_per_fsync: Option<f64>,
    /// Where the per-operation device figures come from: "kernel"
    /// (`/sys/block/loopN/stat`), "ordo" (its own counters, with `--device
    /// file`), or "none" (tmpfs).
    pub counters_source: String,
    /// The device measured.
    pub device: Option<String>,
    /// The kernel's counters over the window.
    pub device_counters: Option<BlockStat>,
    /// ordo's own counters, for ordo targets.
    pub ordo: Option<OrdoFigures>,
    /// Whether the two agree (ordo targets on a loop device).
    pub counters_agree: Option<bool>,
    /// How they compare, or why ordo's counters are missing.
    pub counters_note: Option<String>,
    /// CPU time per operation, µs: the workload's threads, the programs it
    /// ran, and the ordo FUSE process.
    pub cpu_us_per_op: f64,
    /// CPU time of the workload (and its programs), ms.
    pub cpu_ms: f64,
    /// CPU time of the ordo FUSE process, ms.
    pub fs_cpu_ms: Option<f64>,
    /// Peak resident memory of the process serving ordo (the FUSE
    /// process, or this one in-process), MiB.
    pub fs_peak_mib: Option<f64>,
    /// Fast and full commits (ordo's journaling modes, the kernel's ext4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits: Option<CommitFigures>,
    /// Why the commit figures are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits_note: Option<String>,
    /// The I/O scheduler's figures (`ordo-lib:MODE,sched=P`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sched: Option<SchedFigures>,
    /// Workload-specific figures.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// With `--repeat N`: every run's figure; the row's own figures are the
    /// median run's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<RepeatFigures>,
}

/// The runs behind a row of a repeated plan (`--repeat N`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RepeatFigures {
    /// How many times the case ran on this target.
    pub runs: usize,
    /// Operations per second of each run, in the order they ran.
    pub ops_per_sec: Vec<f64>,
    /// Which run (0-based, in that order) the row's figures are from.
    pub median_run: usize,
    /// Slowest and fastest run.
    pub min: f64,
    /// See `min`.
    pub max: f64,
}

/// One row from the `runs` of a case on a target, in the order they ran:
/// the median run's row (by operations per second; of an even count, the
/// slower of the middle two, so that the row is a run that happened), with
/// every run's figure beside it. A run that failed fails the row: its
/// error, said with which run it was, since a case that fails now and
/// then is a finding, not noise to take a median over.
pub fn combine_runs(mut runs: Vec<Row>) -> Row {
    assert!(!runs.is_empty(), "a row needs at least one run");
    let n = runs.len();
    if n == 1 {
        return runs.pop().expect("one run");
    }
    if let Some(k) = runs.iter().position(|r| r.error.is_some()) {
        let mut row = runs.swap_remove(k);
        let e = row.error.take().unwrap_or_default();
        row.error = Some(format!("run {} of {n}: {e}", k + 1));
        return row;
    }
    let ops: Vec<f64> = runs.iter().map(|r| r.ops_per_sec).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| ops[a].total_cmp(&ops[b]));
    let median_run = order[(n - 1) / 2];
    let (min, max) = (ops[order[0]], ops[order[n - 1]]);
    let mut row = runs.swap_remove(median_run);
    row.repeat = Some(RepeatFigures {
        runs: n,
        ops_per_sec: ops,
        median_run,
        min,
        max,
    });
    row
}

impl Row {
    /// Fills the latency fields.
    pub fn set_latency(&mut self, lat: Option<LatencySummary>) {
        if let Some(l) = lat {
            self.fsyncs = l.count;
            self.fsync_us_mean = Some(l.mean_us);
            self.fsync_us_p50 = Some(l.p50_us);
            self.fsync_us_p99 = Some(l.p99_us);
            self.fsync_us_max = Some(l.max_us);
        }
    }

    /// Fills the per-operation device figures from writes, bytes, flushes.
    pub fn set_device_figures(&mut self, writes: u64, bytes: u64, flushes: u64, source: &str) {
        let per_op = |x: u64| x as f64 / self.ops.max(1) as f64;
        self.writes_per_op = Some(per_op(writes));
        self.kib_per_op = Some(per_op(bytes) / 1024.0);
        self.flushes_per_op = Some(per_op(flushes));
        if self.fsyncs > 0 {
            let per = |x: u64| x as f64 / self.fsyncs as f64;
            self.writes_per_fsync = Some(per(writes));
            self.kib_per_fsync = Some(per(bytes) / 1024.0);
            self.flushes_per_fsync = Some(per(flushes));
        }
        self.counters_source = source.to_string();
    }

    /// "workload case" for tables and charts.
    pub fn title(&self) -> String {
        if self.case.is_empty() {
            self.workload.clone()
        } else {
            format!("{} {}", self.workload, self.case)
        }
    }
}

fn num(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// The workloads whose rows show commit figures in the table: the
/// fast-commit micro-benchmark and filebench's (the JSON report has them
/// for every row).
const COMMIT_WORKLOADS: [&str; 5] = [
    "fcmicro",
    "varmail",
    "fileserver",
    "webserver",
    "createfiles",
];

fn shows_commits(r: &Row) -> bool {
    r.error.is_none() && r.commits.is_some() && COMMIT_WORKLOADS.contains(&r.workload.as_str())
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}"))
}

/// Longest error shown in the table (the JSON report has all of it).
const ERROR_CHARS_MAX: usize = 160;

/// The table: one line per row, then ordo's own counters by block class.
pub fn table(rows: &[Row]) -> String {
    let with_commits = rows.iter().any(shows_commits);
    let mut head = vec![
        "workload",
        "target",
        "ops/s",
        "fsync µs",
        "p50",
        "p99",
        "writes/op",
        "KiB/op",
        "flush/op",
        "CPU µs/op",
        "peak MiB",
        "agree",
    ];
    if with_commits {
        head.extend(["fc/fsync", "fast %", "1-blk %", "blk/fc"]);
    }
    let mut lines: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        if let Some(e) = &r.error {
            let first = e.lines().next().unwrap_or("");
            let short: String = first.chars().take(ERROR_CHARS_MAX).collect();
            lines.push(vec![
                r.title(),
                r.target.clone(),
                format!("FAILED: {short}"),
            ]);
            continue;
        }
        let agree = match r.counters_agree {
            Some(true) => "yes".to_string(),
            Some(false) => "NO".to_string(),
            None => "-".to_string(),
        };
        let mut line = vec![
            r.title(),
            r.target.clone(),
            num(Some(r.ops_per_sec)),
            num(r.fsync_us_mean),
            num(r.fsync_us_p50),
            num(r.fsync_us_p99),
            num(r.writes_per_op),
            num(r.kib_per_op),
            num(r.flushes_per_op),
            num(Some(r.cpu_us_per_op)),
            num(r.fs_peak_mib),
            agree,
        ];
        if with_commits {
            match r.commits.as_ref().filter(|_| shows_commits(r)) {
                Some(c) => line.extend([
                    num(c.fast_per_fsync),
                    pct(c.fast_share_pct),
                    pct(c.single_block_share_pct),
                    num(c.fc_blocks_per_fast),
                ]),
                None => line.extend(["-", "-", "-", "-"].map(String::from)),
            }
        }
        lines.push(line);
    }
    let cols = head.len();
    let mut width = vec![0usize; cols];
    for l in &lines {
        if l.len() == cols {
            for (w, c) in width.iter_mut().zip(l) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    for (n, l) in lines.iter().enumerate() {
        let mut s = String::new();
        for (i, c) in l.iter().enumerate() {
            if l.len() < cols && i == l.len() - 1 {
                s.push_str(c);
                break;
            }
            let pad = width[i].saturating_sub(c.chars().count());
            if i < 2 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
            s.push_str("  ");
        }
        let _ = writeln!(out, "{}", s.trim_end());
        if n == 0 {
            let total: usize = width.iter().sum::<usize>() + 2 * (cols - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    let ordo_rows: Vec<&Row> = rows.iter().filter(|r| r.ordo.is_some()).collect();
    if !ordo_rows.is_empty() {
        let _ = writeln!(
            out,
            "\nordo's own counters per operation (writes / KiB by block class):"
        );
        for r in ordo_rows {
            let o = r.ordo.as_ref().expect("filtered");
            let classes: Vec<String> = o
                .by_class_per_op
                .iter()
                .map(|(k, v)| format!("{k} {:.2}/{:.1}", v.writes, v.kib))
                .collect();
            let _ = writeln!(
                out,
                "  {} on {}: {:.2} writes, {:.1} KiB, {:.2} flushes, {:.2} FUA per op [{}]",
                r.title(),
                r.target,
                o.writes_per_op,
                o.kib_per_op,
                o.flushes_per_op,
                o.fua_writes_per_op,
                classes.join(", ")
            );
        }
    }
    let repeated: Vec<&Row> = rows.iter().filter(|r| r.repeat.is_some()).collect();
    if !repeated.is_empty() {
        let _ = writeln!(
            out,
            "\nevery run, ops/s in the order they ran (the row above is the median run; targets took turns going first):"
        );
        for r in repeated {
            let p = r.repeat.as_ref().expect("filtered");
            let each: Vec<String> = p.ops_per_sec.iter().map(|&x| num(Some(x))).collect();
            let _ = writeln!(
                out,
                "  {} on {}: {} (median run {}; spread {:.0}%)",
                r.title(),
                r.target,
                each.join(", "),
                p.median_run + 1,
                (p.max - p.min) / r.ops_per_sec.max(f64::MIN_POSITIVE) * 100.0
            );
        }
    }
    let sched_rows: Vec<&Row> = rows.iter().filter(|r| r.sched.is_some()).collect();
    if !sched_rows.is_empty() {
        let _ = writeln!(
            out,
            "\nI/O scheduler (driver response time = queue + service):"
        );
        for r in sched_rows {
            let s = r.sched.as_ref().expect("filtered");
            let _ = writeln!(
                out,
                "  {} on {}: {} requests, {} disk requests, {:.2} ms average response ({:.2} ms queued){}",
                r.title(),
                r.target,
                s.requests,
                s.disk_requests,
                s.avg_response_ms,
                s.avg_queue_ms,
                if s.virtual_time { ", virtual time" } else { "" }
            );
        }
    }
    let commit_rows: Vec<&Row> = rows.iter().filter(|r| shows_commits(r)).collect();
    if !commit_rows.is_empty() {
        let _ = writeln!(
            out,
            "\ncommits over the measured mount (fast / full, full commits by reason; 1-blk %: \
single-block fast commits, counted by ordo only; blk/fc: fast-commit blocks per fast commit):"
        );
        for r in commit_rows {
            let c = r.commits.as_ref().expect("filtered");
            let _ = writeln!(
                out,
                "  {} on {}: {} fsyncs, {} fast, {} full{} [{}]",
                r.title(),
                r.target,
                r.fsyncs,
                c.counts.fast_commits,
                c.counts.full_commits,
                c.counts
                    .single_block_commits
                    .map(|n| format!(", {n} single-block"))
                    .unwrap_or_default(),
                c.reasons()
            );
        }
    }
    for r in rows.iter().filter(|r| r.error.is_none()) {
        if let Some(n) = &r.commits_note {
            let _ = writeln!(out, "  note: {} on {}: commits: {n}", r.title(), r.target);
        }
    }
    let notes: Vec<&Row> = rows
        .iter()
        .filter(|r| r.counters_note.is_some() && r.counters_agree != Some(true))
        .collect();
    for r in notes {
        let _ = writeln!(
            out,
            "  note: {} on {}: {}",
            r.title(),
            r.target,
            r.counters_note.as_deref().unwrap_or("")
        );
    }
    out
}

/// The JSON report: `{"results": [...], "machine": {...}, "command": "..."}`.
#[derive(Serialize)]
pub struct Report<'a> {
    /// One row per (case, target).
    pub results: &'a [Row],
    /// Where it ran.
    pub machine: Machine,
    /// The command that reproduces it.
    pub command: String,
}

/// The machine a report was made on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Kernel release.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Memory, MiB.
    pub mem_mib: u64,
    /// UTC date and time of the run (RFC 3339).
    pub date_utc: String,
}

impl Machine {
    /// This machine, now.
    pub fn here() -> Machine {
        Machine {
            kernel: crate::sys::kernel_release(),
            cpu: crate::sys::cpu_model(),
            cpus: crate::sys::cpu_count(),
            mem_mib: crate::sys::mem_total_mib(),
            date_utc: utc_now(),
        }
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Writes the JSON report to `path`.
pub fn write_json(path: &Path, rows: &[Row], command: &str) -> Result<()> {
    let report = Report {
        results: rows,
        machine: Machine::here(),
        command: command.to_string(),
    };
    let text = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| BenchError::Output {
        path: path.to_path_buf(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(ops_per_sec: f64) -> Row {
        Row {
            target: "t".into(),
            workload: "w".into(),
            ops_per_sec,
            ..Row::default()
        }
    }

    #[test]
    fn a_repeated_row_is_its_median_run() {
        let row = combine_runs(vec![run_of(30.0), run_of(10.0), run_of(20.0)]);
        assert_eq!(row.ops_per_sec, 20.0);
        let rep = row.repeat.expect("repeat figures");
        assert_eq!(rep.ops_per_sec, vec![30.0, 10.0, 20.0]);
        assert_eq!((rep.median_run, rep.min, rep.max), (2, 10.0, 30.0));
        // Of an even count, the slower middle run: a run that happened.
        let row = combine_runs(vec![run_of(40.0), run_of(10.0), run_of(30.0), run_of(20.0)]);
        assert_eq!(row.ops_per_sec, 20.0);
        assert_eq!(row.repeat.unwrap().median_run, 3);
        // One run is no repeat.
        assert!(combine_runs(vec![run_of(5.0)]).repeat.is_none());
    }

    #[test]
    fn a_failed_run_fails_the_repeated_row() {
        let mut bad = run_of(0.0);
        bad.error = Some("mount refused".into());
        let row = combine_runs(vec![run_of(10.0), bad, run_of(12.0)]);
        assert_eq!(row.error.as_deref(), Some("run 2 of 3: mount refused"));
        assert!(row.repeat.is_none());
    }

    fn ordo_counters(bytes: u64, flushes: u64, fua: u64) -> OrdoCounters {
        let mut c = OrdoCounters {
            by_class: vec![ClassFigures::default(); ordo_dev::BLOCK_CLASS_COUNT],
            flushes,
        };
        c.by_class[6] = ClassFigures {
            writes: bytes / 4096,
            write_bytes: bytes,
            fua_writes: fua,
            ..ClassFigures::default()
        };
        c
    }

    #[test]
    fn agreement_allows_fewer_kernel_bytes_not_more() {
        let o = ordo_counters(100 << 20, 100, 0);
        let k = |bytes: u64, flushes| BlockStat {
            writes: 1,
            write_sectors: bytes / 512,
            flushes,
            ..BlockStat::default()
        };
        assert!(counters_agree(&k(100 << 20, 100), &o).0);
        assert!(counters_agree(&k(80 << 20, 98), &o).0, "coalesced");
        assert!(
            !counters_agree(&k(130 << 20, 100), &o).0,
            "more than written"
        );
        assert!(!counters_agree(&k(10 << 20, 100), &o).0, "far fewer");
        assert!(!counters_agree(&k(100 << 20, 300), &o).0, "extra flushes");
        let with_fua = ordo_counters(1 << 20, 10, 10);
        assert!(
            counters_agree(&k(1 << 20, 20), &with_fua).0,
            "FUA counts as a flush"
        );
    }

    #[test]
    fn per_op_figures_and_table() {
        let mut r = Row {
            target: "ordo:journal".into(),
            workload: "fcmicro".into(),
            case: "n=1".into(),
            ops: 10,
            ops_per_sec: 2110.0,
            ..Row::default()
        };
        r.set_latency(LatencySummary::from_ns(&mut [1000; 10]));
        r.set_device_figures(30, 10 * 36 * 1024, 20, "kernel");
        assert_eq!(r.writes_per_op, Some(3.0));
        assert_eq!(r.kib_per_op, Some(36.0));
        assert_eq!(r.flushes_per_fsync, Some(2.0));
        let o = ordo_counters(40960, 20, 0);
        r.ordo = Some(OrdoFigures::new(&o, 10));
        assert_eq!(
            r.ordo.as_ref().unwrap().by_class_per_op["journal"].writes,
            1.0
        );
        let failed = Row {
            target: "tmpfs".into(),
            workload: "git".into(),
            error: Some("boom".into()),
            ..Row::default()
        };
        let t = table(&[r, failed]);
        assert!(t.contains("fcmicro n=1") && t.contains("2110"), "{t}");
        assert!(t.contains("FAILED: boom"), "{t}");
        assert!(t.contains("journal 1.00/4.0"), "{t}");
    }

    #[test]
    fn commit_columns_for_fcmicro_and_filebench_rows() {
        use crate::commits::{CommitCounts, CommitFigures};
        let row = |workload: &str, target: &str, counts: CommitCounts| {
            let mut r = Row {
                target: target.into(),
                workload: workload.into(),
                case: if workload == "fcmicro" {
                    "n=1".into()
                } else {
                    String::new()
                },
                ops: 200,
                ops_per_sec: 1000.0,
                ..Row::default()
            };
            r.set_latency(LatencySummary::from_ns(&mut [1000; 100]));
            r.commits = Some(CommitFigures::new(counts, r.fsyncs));
            r
        };
        let ordo = CommitCounts {
            source: "ordo".into(),
            fast_commits: 99,
            full_commits: 1,
            ineligible: [("no_live_log".to_string(), 1)].into_iter().collect(),
            single_block_commits: Some(81),
            fc_blocks: Some(120),
            jbd2_commits: Some(1),
        };
        let kernel = CommitCounts {
            source: "kernel".into(),
            fast_commits: 50,
            full_commits: 50,
            fc_blocks: Some(100),
            jbd2_commits: Some(50),
            ..CommitCounts::default()
        };
        let t = table(&[
            row("fcmicro", "ordo:fast_commit", ordo.clone()),
            row("varmail", "ext4:fast_commit", kernel),
        ]);
        let head = t.lines().next().unwrap();
        for col in ["agree", "fc/fsync", "fast %", "1-blk %", "blk/fc"] {
            assert!(head.contains(col), "{col} missing: {t}");
        }
        let fc = t.lines().find(|l| l.starts_with("fcmicro n=1")).unwrap();
        // 99 fast of 100 fsyncs, 99 % of commits, 81/99 single-block, 120/99 blocks.
        let last4 = |l: &str| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w[w.len() - 4..].join(" ")
        };
        assert_eq!(last4(fc), "0.99 99.0 81.8 1.21", "{t}");
        let vm = t.lines().find(|l| l.starts_with("varmail")).unwrap();
        assert_eq!(last4(vm), "0.50 50.0 - 2.00", "{t}");
        assert!(
            t.contains("fcmicro n=1 on ordo:fast_commit: 100 fsyncs, 99 fast, 1 full, 81 single-block [no_live_log 1]"),
            "{t}"
        );
        // Other workloads keep the old columns only.
        let other = table(&[row("git", "ordo:fast_commit", ordo)]);
        assert!(!other.contains("fc/fsync"), "{other}");
        assert!(other.lines().next().unwrap().ends_with("agree"), "{other}");
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert!(utc_now().ends_with('Z'));
    }
}
