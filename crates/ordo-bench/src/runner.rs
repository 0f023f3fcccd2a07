//! Runs every case of every workload on every target, one fresh file
//! system each, and turns what it saw into rows.
//!
//! A target that fails (ordo's mount refusing, a program missing) gives a
//! row with an error and the run goes on with the next one: a table with
//! one failed cell says more than no table.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::commits::CommitFigures;
use crate::error::{BenchError, Result};
use crate::report::{combine_runs, counters_agree, OrdoFigures, Row};
use crate::stats::LatencySummary;
use crate::sys;
use crate::target::{Instance, TargetConfig, TargetKind, TargetSpec};
use crate::workload::{self, Case, Overrides, RunCtx, Scale, WorkloadName};

/// Everything one `ordo bench` invocation runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Workloads, in order.
    pub workloads: Vec<WorkloadName>,
    /// Targets, in order.
    pub targets: Vec<TargetSpec>,
    /// How targets are built.
    pub config: TargetConfig,
    /// `--scale`.
    pub scale: Scale,
    /// `--seed`.
    pub seed: u64,
    /// Workload overrides.
    pub overrides: Overrides,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
    /// Runs of each case on each target (`--repeat`, at least 1): the
    /// targets take turns going first, and each row is the median run.
    pub repeat: usize,
}

/// Runs the plan; `on_row` sees each row as it is made.
pub fn run_plan(plan: &Plan, mut on_row: impl FnMut(&Row)) -> Result<Vec<Row>> {
    if plan.targets.iter().any(|t| t.uses_loop(plan.config.device)) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(BenchError::Usage(
                "loop devices and mounts need root: run ordo bench as root".into(),
            ));
        }
    }
    std::fs::create_dir_all(&plan.config.workdir)
        .map_err(|e| BenchError::io("mkdir", &plan.config.workdir, e))?;
    if plan.repeat == 0 {
        return Err(BenchError::Usage(
            "a plan runs each case at least once (repeat 0)".into(),
        ));
    }
    // On for the whole run: a target's mount reads it at its INIT.
    let _uring = plan
        .targets
        .iter()
        .any(TargetSpec::uses_io_uring)
        .then(crate::sys::fuse_uring_on);
    let mut rows = Vec::new();
    for &w in &plan.workloads {
        let cases = workload::cases(w, plan.scale, &plan.overrides)?;
        for case in &cases {
            let mut runs: Vec<Vec<Row>> = vec![Vec::new(); plan.targets.len()];
            for pass in 0..plan.repeat {
                for i in turn_order(plan.targets.len(), pass) {
                    let t = &plan.targets[i];
                    let row = match run_one(plan, case.as_ref(), t) {
                        Ok(r) => r,
                        Err(e) => Row {
                            target: t.name.clone(),
                            workload: case.workload().to_string(),
                            case: case.label(),
                            params: case.params(),
                            scale: plan.scale.name().to_string(),
                            seed: plan.seed,
                            error: Some(error_text(t, &e)),
                            ..Row::default()
                        },
                    };
                    on_row(&row);
                    runs[i].push(row);
                }
            }
            rows.extend(runs.into_iter().map(combine_runs));
        }
    }
    Ok(rows)
}

/// The order the `n` targets run in on pass `pass` of a repeated plan:
/// each pass starts one target later, so that no target always runs first
/// (just after the case before it, with the host's memory and the disk's
/// state that left) or last.
pub fn turn_order(n: usize, pass: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + pass) % n)
}

/// The error of a failed row. The FUSE floor discards file data, so a
/// workload that reads back what it wrote (sqlite, git, fs_mark's own log)
/// fails on it with the program's complaint: the row says why.
fn error_text(t: &TargetSpec, e: &BenchError) -> String {
    if matches!(t.kind, TargetKind::FuseFloor { .. }) {
        format!("(fuse-floor discards file data, reads return zeros) {e}")
    } else {
        e.to_string()
    }
}

/// A progress bar fed from the workload's operation counter.
struct Progress {
    bar: ProgressBar,
    done: Arc<AtomicBool>,
    feeder: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(show: bool, len: u64, msg: String, counter: Arc<AtomicU64>) -> Progress {
        let bar = if show {
            ProgressBar::new(len)
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:40} [{bar:30}] {pos}/{len} ops {per_sec:>12} {elapsed}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(msg);
        let done = Arc::new(AtomicBool::new(false));
        let feeder = {
            let (bar, done) = (bar.clone(), done.clone());
            std::thread::spawn(move || {
                /// How often the bar is redrawn.
                const REFRESH: Duration = Duration::from_millis(100);
                while !done.load(Ordering::Relaxed) {
                    bar.set_position(counter.load(Ordering::Relaxed));
                    std::thread::sleep(REFRESH);
                }
            })
        };
        Progress {
            bar,
            done,
            feeder: Some(feeder),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(f) = self.feeder.take() {
            let _ = f.join();
        }
        self.bar.finish_and_clear();
    }
}

fn run_one(plan: &Plan, case: &dyn Case, spec: &TargetSpec) -> Result<Row> {
    let mut inst = Instance::create(spec, &plan.config)?;
    {
        let vfs = inst.vfs()?;
        if case.needs_host_path() && vfs.host_path().is_none() {
            return Err(BenchError::Unsupported {
                workload: case.workload().into(),
                target: spec.name.clone(),
                reason:
                    "it runs an external program, which needs a mounted file system (use ordo:MODE)"
                        .into(),
            });
        }
        case.setup(&*vfs, plan.seed)?;
    }
    inst.start_window()?;
    let vfs = inst.vfs()?;
    let counter = Arc::new(AtomicU64::new(0));
    let title = if case.label().is_empty() {
        format!("{} on {}", case.workload(), spec.name)
    } else {
        format!("{} {} on {}", case.workload(), case.label(), spec.name)
    };
    let ctx = RunCtx {
        seed: plan.seed,
        progress: counter.clone(),
    };
    let cpu0 = sys::self_and_children_cpu_us();
    let progress = Progress::start(plan.progress, case.expected_ops(), title, counter);
    let t0 = vfs.now_ns();
    let out = case.run(&*vfs, &ctx);
    let t1 = vfs.now_ns();
    drop(progress);
    let cpu_us = sys::self_and_children_cpu_us().saturating_sub(cpu0);
    let virtual_time = vfs.virtual_time();
    drop(vfs);
    let mut out = out?;
    // A failed unmount (a protocol that cannot write everything back)
    // keeps what the workload measured itself, beside the error: the
    // device figures need the window's end and are absent.
    let (m, unmount_error) = match inst.finish_window() {
        Ok(m) => (m, None),
        Err(e) => (crate::target::Measurement::default(), Some(e.to_string())),
    };
    drop(inst);

    let elapsed_ns = out.elapsed_ns.unwrap_or(t1.saturating_sub(t0)).max(1);
    let mut row = Row {
        target: spec.name.clone(),
        workload: case.workload().to_string(),
        case: case.label(),
        params: case.params(),
        scale: plan.scale.name().to_string(),
        seed: plan.seed,
        ops: out.ops,
        elapsed_s: elapsed_ns as f64 / 1e9,
        virtual_time,
        disk: if spec.is_ordo() && virtual_time {
            plan.config.disk.map(|d| d.to_string())
        } else {
            None
        },
        ops_per_sec: out.ops as f64 / (elapsed_ns as f64 / 1e9),
        extra: std::mem::take(&mut out.extra),
        ..Row::default()
    };
    row.set_latency(LatencySummary::from_ns(&mut out.fsync_ns));
    if let Some(e) = unmount_error {
        row.error = Some(format!(
            "{e} (at the unmount ending the window: the workload's own figures are kept, the device's are absent)"
        ));
        row.counters_source = "none".into();
        return Ok(row);
    }
    match (&m.blockstat, &m.ordo) {
        (Some(k), _) => row.set_device_figures(k.writes, k.write_bytes(), k.flushes, "kernel"),
        (None, Some(o)) => {
            let t = o.total();
            row.set_device_figures(t.writes, t.write_bytes, o.flushes, "ordo");
        }
        (None, None) => row.counters_source = "none".into(),
    }
    row.device = m.device.clone();
    row.device_counters = m.blockstat;
    if let Some(o) = &m.ordo {
        row.ordo = Some(OrdoFigures::new(o, row.ops));
        if let Some(k) = &m.blockstat {
            let (ok, note) = counters_agree(k, o);
            row.counters_agree = Some(ok);
            row.counters_note = Some(note);
        }
    } else if let Some(note) = &m.ordo_note {
        row.counters_note = Some(note.clone());
    }
    row.commits = m.commits.clone().map(|c| CommitFigures::new(c, row.fsyncs));
    row.commits_note = m.commits_note.clone();
    row.sched = m.sched.as_ref().map(crate::report::SchedFigures::new);
    let fs_cpu_us = m.fs_cpu_us.unwrap_or(0);
    row.cpu_ms = cpu_us as f64 / 1e3;
    row.fs_cpu_ms = m.fs_cpu_us.map(|c| c as f64 / 1e3);
    row.cpu_us_per_op = (cpu_us + fs_cpu_us) as f64 / row.ops.max(1) as f64;
    row.fs_peak_mib = m.fs_peak_kib.map(|k| k as f64 / 1024.0);
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::turn_order;

    #[test]
    fn each_pass_starts_with_the_next_target() {
        let order = |pass| turn_order(3, pass).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1, 2]);
        assert_eq!(order(1), [1, 2, 0]);
        assert_eq!(order(2), [2, 0, 1]);
        assert_eq!(order(3), [0, 1, 2]);
    }
}
