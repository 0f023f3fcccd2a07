//! An exploration: record every sequence of a workload, generate its crash
//! states, check them in parallel, minimize failures, report.
//!
//! The global order of states (sequence, point, index) is fixed by the
//! workload and the seed, so `--shard I/N` (every N-th state starting at
//! I) and `--states N` (a seeded sample of N) select the same states on any
//! machine, and a state id rebuilds one state without checking the others.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use ordo_dev::BlockDevice;
use ordo_fs::{DataMode, ProtocolKind};

use crate::backend::{self, ImageParams};
use crate::error::CrashError;
use crate::log::{EventKind, LogEvent};
use crate::oracle::{self, CheckParams, Failure, FailureClass};
use crate::record::{self, RecordParams, Recording, SetupCache};
use crate::report::{FailureRecord, Report, WriteDesc, FAILURES_LISTED_MAX};
use crate::states::{self, StateParams, StateSpec};
use crate::workload::{self, WorkloadParams};

/// Names one crash state: `sequence.point.index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateId {
    /// Sequence index in the workload.
    pub sequence: usize,
    /// Crash point (events issued).
    pub point: usize,
    /// Index among the point's states.
    pub index: usize,
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.sequence, self.point, self.index)
    }
}

impl FromStr for StateId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('.').collect();
        let num = |p: &str| {
            p.parse::<usize>()
                .map_err(|_| format!("bad state id '{s}'"))
        };
        match parts.as_slice() {
            [a, b, c] => Ok(StateId {
                sequence: num(a)?,
                point: num(b)?,
                index: num(c)?,
            }),
            _ => Err(format!(
                "bad state id '{s}' (expected SEQUENCE.POINT.INDEX, e.g. 3.17.2)"
            )),
        }
    }
}

/// When to run `e2fsck -fn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E2fsckPolicy {
    /// On every state.
    Every,
    /// Never.
    Never,
    /// On every k-th state of the global order (deterministic).
    Sample(usize),
}

/// When to run the second judge (`crate::judge`): the kernel's and
/// `e2fsck -fy`'s recovery of the crash image compared with ordo's. Only
/// for protocols whose log the kernel replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JudgePolicy {
    /// Never.
    Never,
    /// On every k-th state of the global order (deterministic).
    Sample(usize),
}

/// What checking one state found: its failures, whether `e2fsck -fn` ran,
/// and the oracle's notes.
type Outcome = (Vec<Failure>, bool, Vec<oracle::Note>);

/// The default sample of the second judge: every 50th state.
pub const JUDGE_SAMPLE_DEFAULT: usize = 50;

/// A deliberate fault injected into recorded logs, to show the explorer
/// catches a protocol that does not order what it depends on. Test-only.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFault {
    /// Move the write just before the n-th flush (0-based) after it.
    DelayWrite(usize),
    /// Remove every flush.
    DropFlushes,
    /// The n-th FUA write (0-based) loses FUA.
    UnFua(usize),
    /// The n-th and the next data write (0-based, class `data`, to another
    /// block) exchange their target blocks: misdirected writes, which must
    /// show up as foreign data.
    CrossData(usize),
}

impl FromStr for LogFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = s.split_once(':').unwrap_or((s, ""));
        let n = || arg.parse::<usize>().map_err(|_| format!("bad fault '{s}'"));
        match name {
            "delay-write" => Ok(LogFault::DelayWrite(n()?)),
            "drop-flushes" => Ok(LogFault::DropFlushes),
            "unfua" => Ok(LogFault::UnFua(n()?)),
            "cross-data" => Ok(LogFault::CrossData(n()?)),
            _ => Err(format!(
                "unknown fault '{s}' (delay-write:N, drop-flushes, unfua:N, cross-data:N)"
            )),
        }
    }
}

impl LogFault {
    /// Apply the fault to a log. Returns whether it found something to
    /// change.
    pub fn apply(self, events: &mut Vec<LogEvent>) -> bool {
        match self {
            LogFault::DelayWrite(n) => {
                let Some(f) = events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| matches!(e.kind, EventKind::Flush))
                    .map(|(i, _)| i)
                    .nth(n)
                else {
                    return false;
                };
                let Some(w) = events[..f]
                    .iter()
                    .rposition(|e| matches!(e.kind, EventKind::Write(_)))
                else {
                    return false;
                };
                let ev = events.remove(w);
                // After the flush (which moved one slot down).
                events.insert(f, ev);
                true
            }
            LogFault::DropFlushes => {
                let before = events.len();
                events.retain(|e| !matches!(e.kind, EventKind::Flush));
                events.len() != before
            }
            LogFault::CrossData(n) => {
                let data: Vec<usize> = events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| {
                        matches!(&e.kind, EventKind::Write(w) if w.class == ordo_dev::BlockClass::Data)
                    })
                    .map(|(i, _)| i)
                    .collect();
                let Some(&a) = data.get(n) else {
                    return false;
                };
                let block_of = |i: usize, ev: &[LogEvent]| match &ev[i].kind {
                    EventKind::Write(w) => (w.block, w.data.len()),
                    _ => unreachable!("filtered to writes"),
                };
                let (ba, la) = block_of(a, events);
                let Some(&b) = data[n + 1..]
                    .iter()
                    .find(|&&i| block_of(i, events).0 != ba && block_of(i, events).1 == la)
                else {
                    return false;
                };
                let (bb, _) = block_of(b, events);
                for (i, blk) in [(a, bb), (b, ba)] {
                    if let EventKind::Write(w) = &mut events[i].kind {
                        w.block = blk;
                    }
                }
                true
            }
            LogFault::UnFua(n) => {
                let Some(e) = events
                    .iter_mut()
                    .filter(|e| matches!(&e.kind, EventKind::Write(w) if w.fua))
                    .nth(n)
                else {
                    return false;
                };
                if let EventKind::Write(w) = &mut e.kind {
                    w.fua = false;
                }
                true
            }
        }
    }
}

/// Everything an exploration needs.
#[derive(Clone, Debug)]
pub struct ExploreParams {
    /// Protocol.
    pub mode: ProtocolKind,
    /// Data mode.
    pub data: DataMode,
    /// Workload name or scenario path.
    pub workload: String,
    /// Parameters of the built-in workloads (their seed is `states.seed`;
    /// `durability_calls` is turned on for a protocol whose capabilities
    /// promise a prefix of the operations after a crash, and `streams`
    /// for one that promises a prefix of each stream's).
    pub workload_params: WorkloadParams,
    /// State generation.
    pub states: StateParams,
    /// Check at most this many states (a seeded sample of them).
    pub max_states: Option<usize>,
    /// Worker threads (0 = one per core).
    pub jobs: usize,
    /// `(i, n)`: check only every n-th state starting at i.
    pub shard: Option<(usize, usize)>,
    /// When to run e2fsck.
    pub e2fsck: E2fsckPolicy,
    /// When to run the kernel and `e2fsck -fy` as a second judge.
    pub judge: JudgePolicy,
    /// Geometry of the image.
    pub image: ImageParams,
    /// Failing states to minimize (each costs a few checks per write).
    pub minimize_max: usize,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
    /// Rebuild and check only this state.
    pub only_state: Option<StateId>,
    /// Keep the images of `only_state` (or of every failure, up to 20) here.
    pub keep: Option<PathBuf>,
    /// Test-only fault injection.
    pub fault: Option<LogFault>,
    /// Record through a FUSE mount instead of the library API.
    pub fuse: bool,
    /// With `fuse`: the mount answers OPEN with ENOSYS, so the kernel
    /// opens files itself (`open_requests=off`).
    pub fuse_no_open: bool,
}

impl ExploreParams {
    /// Defaults for a protocol and workload.
    pub fn new(mode: ProtocolKind, workload: &str) -> Self {
        ExploreParams {
            mode,
            data: DataMode::Ordered,
            workload: workload.to_string(),
            workload_params: WorkloadParams::default(),
            states: StateParams::default(),
            max_states: None,
            jobs: 0,
            shard: None,
            e2fsck: E2fsckPolicy::Sample(100),
            judge: JudgePolicy::Sample(JUDGE_SAMPLE_DEFAULT),
            image: ImageParams::default(),
            minimize_max: 20,
            progress: false,
            only_state: None,
            keep: None,
            fault: None,
            fuse: false,
            fuse_no_open: false,
        }
    }

    /// The flags that change which states exist, as the command line spells
    /// them (part of every reproduce command).
    pub fn state_options(&self) -> String {
        let mut o = Vec::new();
        if self.states.prefix_only {
            o.push("--prefix-only".to_string());
        }
        if self.states.torn {
            o.push("--torn".to_string());
        }
        if self.states.max_states_per_point != StateParams::default().max_states_per_point {
            o.push(format!(
                "--states-per-point {}",
                self.states.max_states_per_point
            ));
        }
        let d = ImageParams::default();
        if self.image.size_mib != d.size_mib {
            o.push(format!("--size-mib {}", self.image.size_mib));
        }
        if self.image.block_size != d.block_size {
            o.push(format!("--block-size {}", self.image.block_size));
        }
        if let Some(g) = self.image.blocks_per_group {
            o.push(format!("--blocks-per-group {g}"));
        }
        let w = WorkloadParams::default();
        if matches!(self.workload.as_str(), "random" | "mix" | "enospc")
            && self.workload_params.random_ops != w.random_ops
        {
            o.push(format!("--random-ops {}", self.workload_params.random_ops));
        }
        if self.workload == "seq2" && self.workload_params.seq2_max != w.seq2_max {
            o.push(format!("--seq2-max {}", self.workload_params.seq2_max));
        }
        if self.fuse {
            o.push("--fuse".to_string());
        }
        if self.fuse_no_open {
            o.push("--fuse-no-open".to_string());
        }
        if let Some(f) = self.fault {
            o.push(format!("--fault {}", fault_name(f)));
        }
        o.join(" ")
    }

    /// The command that rebuilds state `id` and keeps its image.
    pub fn reproduce_command(&self, id: StateId) -> String {
        let data = if self.data == DataMode::Ordered {
            String::new()
        } else {
            format!(" --data {}", data_name(self.data))
        };
        let opts = self.state_options();
        format!(
            "ordo crash --mode {}{data} --workload {} --seed {}{}{} --state {id} --keep ./crash-{id}",
            self.mode,
            self.workload,
            self.states.seed,
            if opts.is_empty() { "" } else { " " },
            opts
        )
    }
}

fn fault_name(f: LogFault) -> String {
    match f {
        LogFault::DelayWrite(n) => format!("delay-write:{n}"),
        LogFault::DropFlushes => "drop-flushes".into(),
        LogFault::UnFua(n) => format!("unfua:{n}"),
        LogFault::CrossData(n) => format!("cross-data:{n}"),
    }
}

/// The `-o data=` name.
pub fn data_name(d: DataMode) -> &'static str {
    match d {
        DataMode::Ordered => "ordered",
        DataMode::Writeback => "writeback",
        DataMode::Journal => "journal",
    }
}

/// One state to check.
struct Job {
    rec: usize,
    spec: StateSpec,
    e2fsck: bool,
    judge: bool,
}

/// Record the sequences of a workload (all, or just `only`).
pub fn record_workload(
    p: &ExploreParams,
    only: Option<usize>,
) -> Result<(workload::Workload, Vec<Arc<Recording>>), CrashError> {
    let mut wparams = p.workload_params;
    wparams.seed = p.states.seed;
    // osync's ordering is checked only where the protocol promises a
    // prefix of the operations after a crash, so only there do the
    // workloads use OptFS's calls; everywhere else they stay as they were
    // (a caller may still ask for them).
    wparams.durability_calls |= p.mode.caps().prefix_after_crash;
    // Likewise streams, where the protocol keeps order per stream and the
    // stream-prefix hook checks it.
    wparams.streams |= p.mode.caps().stream_prefix_after_crash;
    // FUSE cannot collapse or insert a range.
    wparams.fuse |= p.fuse;
    let wl = workload::by_name(&p.workload, &wparams)?;
    if let Some(s) = only {
        if s >= wl.sequences.len() {
            return Err(CrashError::Invalid(format!(
                "workload {} has {} sequences, no sequence {s}",
                wl.name,
                wl.sequences.len()
            )));
        }
    }
    let empty = match &wl.kernel_dir {
        Some(dir) => backend::make_kernel_image(&p.image, p.mode, dir)?,
        None => backend::make_image(&p.image, p.mode)?,
    };
    let setups = SetupCache::default();
    let rparams = RecordParams {
        mode: p.mode,
        data: p.data,
        fuse: p.fuse,
        fuse_no_open: p.fuse_no_open,
    };
    let indices: Vec<usize> = match only {
        Some(s) => vec![s],
        None => (0..wl.sequences.len()).collect(),
    };
    let recs: Result<Vec<Arc<Recording>>, CrashError> = indices
        .par_iter()
        .map(|&i| {
            let mut r = record::record(&empty, &setups, i, &wl.sequences[i], &rparams)?;
            if let Some(f) = p.fault {
                f.apply(&mut r.events);
            }
            Ok(Arc::new(r))
        })
        .collect();
    Ok((wl, recs?))
}

fn thread_pool(jobs: usize) -> Result<rayon::ThreadPool, CrashError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| CrashError::Invalid(format!("thread pool: {e}")))
}

/// Run an exploration.
pub fn explore(p: &ExploreParams) -> Result<Report, CrashError> {
    if let Some((i, n)) = p.shard {
        if n == 0 || i >= n {
            return Err(CrashError::Invalid(format!("bad shard {i}/{n}")));
        }
    }
    let pool = thread_pool(p.jobs)?;
    pool.install(|| explore_in_pool(p, pool.current_num_threads()))
}

fn explore_in_pool(p: &ExploreParams, jobs: usize) -> Result<Report, CrashError> {
    let (wl, recs) = record_workload(p, p.only_state.map(|s| s.sequence))?;
    let mut report = Report::new(
        &p.mode.to_string(),
        data_name(p.data),
        &p.workload,
        p.states.seed,
        &p.state_options(),
    );
    report.sequences = wl.sequences.len() as u64;
    report.jobs = jobs as u64;
    report.shard = p.shard.map(|(i, n)| format!("{i}/{n}"));

    // The global list of states.
    let mut all: Vec<Job> = Vec::new();
    for (ri, rec) in recs.iter().enumerate() {
        let specs = match p.only_state {
            Some(id) => {
                let at = states::states_at(
                    &rec.events,
                    rec.index,
                    id.point.min(rec.events.len()),
                    &p.states,
                );
                if id.point > rec.events.len() || id.index >= at.len() {
                    return Err(CrashError::Invalid(format!(
                        "state {id} does not exist (sequence {} has {} events; point {} has {} states)",
                        id.sequence,
                        rec.events.len(),
                        id.point,
                        at.len()
                    )));
                }
                vec![at[id.index].clone()]
            }
            None => states::all_states(&rec.events, rec.index, &p.states),
        };
        all.extend(specs.into_iter().map(|spec| Job {
            rec: ri,
            spec,
            e2fsck: false,
            judge: false,
        }));
    }
    report.states_total = all.len() as u64;
    for (g, job) in all.iter_mut().enumerate() {
        job.e2fsck = match p.e2fsck {
            E2fsckPolicy::Every => true,
            E2fsckPolicy::Never => false,
            E2fsckPolicy::Sample(k) => k > 0 && g % k == 0,
        } || p.only_state.is_some();
        job.judge = crate::judge::applies_to(p.mode)
            && match p.judge {
                JudgePolicy::Never => false,
                JudgePolicy::Sample(k) => k > 0 && g % k == 0,
            };
    }
    let mut jobs_list: Vec<Job> = match p.shard {
        Some((i, n)) => all
            .into_iter()
            .enumerate()
            .filter(|(g, _)| g % n == i)
            .map(|(_, j)| j)
            .collect(),
        None => all,
    };
    if let Some(max) = p.max_states {
        if jobs_list.len() > max {
            let mut idx: Vec<usize> = (0..jobs_list.len()).collect();
            idx.shuffle(&mut ChaCha8Rng::seed_from_u64(p.states.seed ^ 0x5eed));
            let mut keep: Vec<usize> = idx.into_iter().take(max).collect();
            keep.sort_unstable();
            let mut it = keep.into_iter().peekable();
            jobs_list = jobs_list
                .into_iter()
                .enumerate()
                .filter(|(g, _)| {
                    if it.peek() == Some(g) {
                        it.next();
                        true
                    } else {
                        false
                    }
                })
                .map(|(_, j)| j)
                .collect();
        }
    }

    let hooks = oracle::hooks_for(p.mode);
    let bar = if p.progress {
        let b = ProgressBar::new(jobs_list.len() as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} states ({per_sec}, eta {eta})",
        ) {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let outcomes: Vec<Option<Outcome>> = jobs_list
        .par_iter()
        .map(|job| {
            if crate::stop::requested() {
                return None;
            }
            let rec = &recs[job.rec];
            let params = CheckParams {
                mode: p.mode,
                data: p.data,
                e2fsck: job.e2fsck,
                judge: job.judge,
            };
            let (failures, notes, _) = oracle::check_state_noted(rec, &job.spec, &params, &hooks);
            bar.inc(1);
            Some((failures, job.e2fsck, notes))
        })
        .collect();
    bar.finish_and_clear();
    let Some(outcomes) = outcomes.into_iter().collect::<Option<Vec<_>>>() else {
        return Err(CrashError::Interrupted);
    };
    let elapsed = started.elapsed();
    report.elapsed_ms = elapsed.as_millis() as u64;
    report.states_per_sec = if elapsed.as_secs_f64() > 0.0 {
        outcomes.len() as f64 / elapsed.as_secs_f64()
    } else {
        0.0
    };

    let mut failing = Vec::new();
    for (job, (failures, e2, notes)) in jobs_list.iter().zip(&outcomes) {
        let classes: Vec<FailureClass> = failures.iter().map(|f| f.class).collect();
        report.count(&classes, *e2);
        if job.judge {
            report.judged += 1;
        }
        for n in notes {
            *report.notes.entry(n.name().to_string()).or_default() += 1;
        }
        let names: Vec<&str> = notes.iter().map(|n| n.name()).collect();
        report
            .by_sequence
            .entry(recs[job.rec].sequence.name.clone())
            .or_default()
            .count(&classes, &names);
        if !failures.is_empty() {
            failing.push((job, failures));
        }
    }
    let listed: Vec<FailureRecord> = failing
        .par_iter()
        .take(FAILURES_LISTED_MAX)
        .enumerate()
        .map(|(k, (job, failures))| {
            let rec = &recs[job.rec];
            let needed = if k < p.minimize_max {
                Some(minimize(rec, &job.spec, failures, p, &hooks))
            } else {
                None
            };
            failure_record(p, rec, &job.spec, failures, needed)
        })
        .collect();
    report.failures = listed;

    if let Some(dir) = &p.keep {
        keep_images(p, &recs, &jobs_list, &outcomes, dir)?;
    }
    Ok(report)
}

fn failure_record(
    p: &ExploreParams,
    rec: &Recording,
    spec: &StateSpec,
    failures: &[Failure],
    needed: Option<Vec<WriteDesc>>,
) -> FailureRecord {
    let id = StateId {
        sequence: rec.index,
        point: spec.point,
        index: spec.index,
    };
    let mut classes: Vec<String> = failures
        .iter()
        .map(|f| f.class.name().to_string())
        .collect();
    classes.dedup();
    FailureRecord {
        state: id.to_string(),
        sequence: rec.sequence.name.clone(),
        ops: rec.sequence.ops.iter().map(|o| o.to_string()).collect(),
        op_in_flight: spec.op_in_flight(&rec.events),
        writes_applied: spec.writes.len(),
        torn: spec.torn.is_some(),
        classes,
        details: failures.iter().map(|f| f.detail.clone()).collect(),
        needed_writes: needed,
        reproduce: p.reproduce_command(id),
    }
}

fn describe_write(rec: &Recording, event: usize) -> Option<WriteDesc> {
    match &rec.events[event].kind {
        EventKind::Write(w) => Some(WriteDesc {
            event,
            block: w.block,
            blocks: (w.data.len() / rec.base.block_size() as usize) as u64,
            class: w.class.name().to_string(),
            fua: w.fua,
            op: rec.events[event].op,
        }),
        _ => None,
    }
}

/// Drop the unflushed writes of a failing state one at a time, keeping a
/// drop whenever the state still fails with one of the same classes. What
/// remains is what the failure needs. Bounded: at most 32 trial checks,
/// without e2fsck.
fn minimize(
    rec: &Recording,
    spec: &StateSpec,
    failures: &[Failure],
    p: &ExploreParams,
    hooks: &[Box<dyn oracle::InvariantHook>],
) -> Vec<WriteDesc> {
    const TRIALS_MAX: usize = 32;
    let classes: Vec<FailureClass> = failures.iter().map(|f| f.class).collect();
    let epoch_start = rec.events[..spec.point]
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::Flush))
        .map(|f| f + 1)
        .unwrap_or(0);
    let is_fua = |i: usize| matches!(&rec.events[i].kind, EventKind::Write(w) if w.fua);
    let mut current = spec.clone();
    let candidates: Vec<usize> = spec
        .writes
        .iter()
        .copied()
        .filter(|&i| i >= epoch_start && !is_fua(i))
        .collect();
    // The judge runs again only when the failure is its own.
    let params = CheckParams {
        mode: p.mode,
        data: p.data,
        e2fsck: false,
        judge: classes
            .iter()
            .any(|c| matches!(c, FailureClass::KernelReplay | FailureClass::E2fsckReplay)),
    };
    for &w in candidates.iter().rev().take(TRIALS_MAX) {
        let mut trial = current.clone();
        trial.writes.retain(|&x| x != w);
        let (f, _) = oracle::check_state(rec, &trial, &params, hooks);
        if f.iter().any(|x| classes.contains(&x.class)) {
            current = trial;
        }
    }
    current
        .writes
        .iter()
        .filter(|&&i| i >= epoch_start && !is_fua(i))
        .filter_map(|&i| describe_write(rec, i))
        .collect()
}

/// Write the crash image (before recovery), the recovered image, the
/// scenario and the findings of kept states into `dir`.
fn keep_images(
    p: &ExploreParams,
    recs: &[Arc<Recording>],
    jobs: &[Job],
    outcomes: &[(Vec<Failure>, bool, Vec<oracle::Note>)],
    dir: &std::path::Path,
) -> Result<(), CrashError> {
    const KEPT_MAX: usize = 20;
    std::fs::create_dir_all(dir)
        .map_err(|e| CrashError::io(format!("creating {}", dir.display()), e))?;
    let hooks = oracle::hooks_for(p.mode);
    let mut kept = 0;
    for (job, (failures, _, _)) in jobs.iter().zip(outcomes) {
        if p.only_state.is_none() && (failures.is_empty() || kept >= KEPT_MAX) {
            continue;
        }
        kept += 1;
        let rec = &recs[job.rec];
        let id = StateId {
            sequence: rec.index,
            point: job.spec.point,
            index: job.spec.index,
        };
        let crash = oracle::build_image(rec, &job.spec);
        let crash_path = dir.join(format!("state-{id}.crash.img"));
        backend::write_image(&crash, &crash_path)
            .map_err(|e| CrashError::io(format!("writing {}", crash_path.display()), e))?;
        let params = CheckParams {
            mode: p.mode,
            data: p.data,
            e2fsck: false,
            judge: false,
        };
        let (_, recovered) = oracle::check_state(rec, &job.spec, &params, &hooks);
        let rec_path = dir.join(format!("state-{id}.recovered.img"));
        backend::write_image(&recovered, &rec_path)
            .map_err(|e| CrashError::io(format!("writing {}", rec_path.display()), e))?;
        let mut text = format!(
            "# {} (state {id}, crash during op {})\n",
            rec.sequence.name,
            job.spec.op_in_flight(&rec.events)
        );
        for op in &rec.sequence.setup {
            text += &format!("{op}\n");
        }
        text += "---\n";
        for op in &rec.sequence.ops {
            text += &format!("{op}\n");
        }
        let scen = dir.join(format!("state-{id}.scenario"));
        std::fs::write(&scen, text)
            .map_err(|e| CrashError::io(format!("writing {}", scen.display()), e))?;
        let mut findings = String::new();
        for f in failures {
            findings += &format!("{}: {}\n", f.class.name(), f.detail);
        }
        if findings.is_empty() {
            findings = "no findings\n".into();
        }
        let fpath = dir.join(format!("state-{id}.findings"));
        std::fs::write(&fpath, findings)
            .map_err(|e| CrashError::io(format!("writing {}", fpath.display()), e))?;
        let wpath = dir.join(format!("state-{id}.writes"));
        std::fs::write(&wpath, write_log_text(&rec.events))
            .map_err(|e| CrashError::io(format!("writing {}", wpath.display()), e))?;
    }
    Ok(())
}

/// The recording's write log as text, one event a line: its index in
/// the log (what a state's "needs write #N" names), the operation that
/// issued it, and what it was (a write's first block, length and class,
/// a flush, or a promise made).
fn write_log_text(events: &[crate::log::LogEvent]) -> String {
    use crate::log::EventKind;
    let mut text = String::from("# event op what\n");
    for (i, e) in events.iter().enumerate() {
        let what = match &e.kind {
            EventKind::Write(w) => format!(
                "write {} ({} bytes) {:?}{}",
                w.block,
                w.data.len(),
                w.class,
                if w.fua { " fua" } else { "" }
            ),
            EventKind::Flush => "flush".to_string(),
            EventKind::Mark(p) => format!("promise {p}"),
        };
        text += &format!("{i} {} {what}\n", e.op);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::LoggedWrite;
    use ordo_dev::BlockClass;

    #[test]
    fn state_ids_round_trip() {
        let id: StateId = "3.17.2".parse().unwrap();
        assert_eq!(
            id,
            StateId {
                sequence: 3,
                point: 17,
                index: 2
            }
        );
        assert_eq!(id.to_string(), "3.17.2");
        assert!("3.17".parse::<StateId>().is_err());
    }

    #[test]
    fn faults_reorder_the_log() {
        let w = |b| LogEvent {
            kind: EventKind::Write(LoggedWrite::new(
                b,
                Arc::from(vec![0u8; 512]),
                b == 9,
                BlockClass::Data,
            )),
            op: 1,
        };
        let fl = || LogEvent {
            kind: EventKind::Flush,
            op: 1,
        };
        let mut ev = vec![w(1), w(2), fl(), w(3), w(9)];
        assert!(LogFault::DelayWrite(0).apply(&mut ev));
        let blocks: Vec<Option<u64>> = ev
            .iter()
            .map(|e| match &e.kind {
                EventKind::Write(w) => Some(w.block),
                _ => None,
            })
            .collect();
        assert_eq!(blocks, vec![Some(1), None, Some(2), Some(3), Some(9)]);
        assert!(!LogFault::DelayWrite(5).apply(&mut ev));
        assert!(LogFault::UnFua(0).apply(&mut ev));
        assert!(ev
            .iter()
            .all(|e| !matches!(&e.kind, EventKind::Write(w) if w.fua)));
        assert!(LogFault::DropFlushes.apply(&mut ev));
        assert_eq!(ev.len(), 4);
        assert_eq!(
            "delay-write:3".parse::<LogFault>(),
            Ok(LogFault::DelayWrite(3))
        );
    }

    #[test]
    fn reproduce_command_names_everything_that_shapes_states() {
        let mut p = ExploreParams::new(ProtocolKind::named("sync"), "seq2");
        p.states.seed = 9;
        p.states.torn = true;
        let c = p.reproduce_command(StateId {
            sequence: 1,
            point: 2,
            index: 3,
        });
        assert_eq!(
            c,
            "ordo crash --mode sync --workload seq2 --seed 9 --torn --state 1.2.3 --keep ./crash-1.2.3"
        );
    }
}
