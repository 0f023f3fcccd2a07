//! `ordo crash soak`: random workloads, seed after seed, until a target
//! number of crash states has been checked.
//!
//! Bugs that need a hundred thousand states to show are not found by the
//! few thousand a test checks. A soak runs the `mix` (or `random`) workload with seed
//! after seed (each seed: its sequences, every crash state of each) until
//! the states checked reach a target (default 1,000,000) for one protocol
//! and data mode. It is built for batch systems and long runs:
//!
//! - **shards**: `--shard I/N` takes the seeds `I, I+N, I+2N, ...` and a
//!   target of `ceil(target / N)`; N machines (or N jobs of one) cover the
//!   target together and no seed is checked twice;
//! - **resumable**: each seed's report is written to
//!   `DIR/seed-S.json` (atomically) as soon as it is done; a soak started
//!   again on the same directory counts the seeds already there and goes
//!   on with the next;
//! - **one summary**: `ordo crash soak --summary DIR...` merges every seed
//!   report found (any shard) into states, failures by class, the seeds
//!   that failed, and states per second.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::CrashError;
use crate::explore::{self, ExploreParams};
use crate::oracle::FailureClass;
use crate::report::Report;

/// Default target of states per protocol and data mode.
pub const SOAK_TARGET_DEFAULT: u64 = 1_000_000;
/// Default operations per random sequence in a soak (about 2,500 states
/// a seed).
pub const SOAK_RANDOM_OPS_DEFAULT: usize = 400;

/// What a soak runs: `template` is the exploration of one seed (its
/// workload is `random` or `mix`; its seed is replaced per seed).
#[derive(Clone, Debug)]
pub struct SoakParams {
    /// The exploration of one seed.
    pub template: ExploreParams,
    /// States to check over all shards.
    pub target: u64,
    /// `(i, n)`: this shard's seeds are `first_seed + i + k*n`.
    pub shard: (u64, u64),
    /// First seed.
    pub first_seed: u64,
    /// Where the seed reports go.
    pub dir: PathBuf,
    /// Print a line per seed.
    pub verbose: bool,
}

/// The merged figures of a soak.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakSummary {
    /// Protocol.
    pub mode: String,
    /// Data mode.
    pub data: String,
    /// The seeded workload (`random` or `mix`).
    pub workload: String,
    /// Options that change the states (`--random-ops`, ...).
    pub options: String,
    /// Seeds checked.
    pub seeds: u64,
    /// States checked.
    pub states: u64,
    /// States with an inconsistency.
    pub inconsistent: u64,
    /// States where a promise does not hold.
    pub broken_promises: u64,
    /// States with foreign data.
    pub foreign_data: u64,
    /// States with any failure.
    pub failing_states: u64,
    /// States per failure class.
    pub by_class: BTreeMap<String, u64>,
    /// States `e2fsck -fn` ran on.
    pub e2fsck_checked: u64,
    /// States the kernel / `e2fsck -fy` judge ran on.
    pub judged: u64,
    /// Documented behaviours of other tools seen (not failures).
    pub notes: BTreeMap<String, u64>,
    /// Seeds with a failing state, and how many states failed.
    pub failed_seeds: BTreeMap<u64, u64>,
    /// Check time summed over seeds, milliseconds.
    pub elapsed_ms: u64,
    /// States per second of check time.
    pub states_per_sec: f64,
}

impl SoakSummary {
    fn add(&mut self, seed: u64, r: &Report) {
        if self.seeds == 0 {
            self.mode = r.mode.clone();
            self.data = r.data.clone();
            self.workload = r.workload.clone();
            self.options = r.options.clone();
        }
        self.seeds += 1;
        self.states += r.checked;
        self.inconsistent += r.inconsistent;
        self.broken_promises += r.broken_promises;
        self.foreign_data += r.foreign_data;
        self.failing_states += r.failures_total;
        for (k, v) in &r.by_class {
            *self.by_class.entry(k.clone()).or_default() += v;
        }
        self.e2fsck_checked += r.e2fsck_checked;
        self.judged += r.judged;
        for (k, v) in &r.notes {
            *self.notes.entry(k.clone()).or_default() += v;
        }
        if r.failures_total > 0 {
            self.failed_seeds.insert(seed, r.failures_total);
        }
        self.elapsed_ms += r.elapsed_ms;
        self.states_per_sec = if self.elapsed_ms > 0 {
            self.states as f64 * 1000.0 / self.elapsed_ms as f64
        } else {
            0.0
        };
    }

    /// The human-readable summary.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ordo crash soak: mode={} data={} workload={} {}",
            self.mode, self.data, self.workload, self.options
        );
        let _ = writeln!(
            s,
            "  {} seeds, {} states checked, {:.0} states/s of check time ({:.1} h)",
            self.seeds,
            self.states,
            self.states_per_sec,
            self.elapsed_ms as f64 / 3.6e6
        );
        let row = |s: &mut String, name: &str, v: u64| {
            let _ = writeln!(s, "  {name:<24}{v:>12}");
        };
        row(&mut s, "failing states", self.failing_states);
        row(&mut s, "inconsistent", self.inconsistent);
        for c in FailureClass::ALL {
            let v = self.by_class.get(c.name()).copied().unwrap_or(0);
            if v > 0 {
                row(&mut s, &format!("  {}", c.name()), v);
            }
        }
        row(&mut s, "broken_promises", self.broken_promises);
        row(&mut s, "foreign_data", self.foreign_data);
        row(&mut s, "e2fsck -fn run on", self.e2fsck_checked);
        row(&mut s, "kernel + e2fsck -fy", self.judged);
        for (k, v) in &self.notes {
            row(&mut s, &format!("note {k}"), *v);
        }
        if self.failed_seeds.is_empty() {
            let _ = writeln!(s, "  no seed failed");
        } else {
            let list: Vec<String> = self
                .failed_seeds
                .iter()
                .map(|(seed, n)| format!("{seed} ({n})"))
                .collect();
            let _ = writeln!(s, "  failed seeds (failing states): {}", list.join(", "));
        }
        s
    }
}

fn seed_path(dir: &Path, seed: u64) -> PathBuf {
    dir.join(format!("seed-{seed}.json"))
}

/// The seed of a `seed-S.json` file name.
fn seed_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("seed-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Every seed report in `dir`, by seed.
pub fn seed_reports(dir: &Path) -> Result<BTreeMap<u64, Report>, CrashError> {
    let mut out = BTreeMap::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(CrashError::io(format!("reading {}", dir.display()), e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| CrashError::io(format!("reading {}", dir.display()), e))?;
        let path = entry.path();
        if let Some(seed) = seed_of(&path) {
            let r = Report::read_json(&path.to_string_lossy())?;
            out.insert(seed, r);
        }
    }
    Ok(out)
}

/// Merge the seed reports of several soak directories (shards of one
/// soak). Refuses reports of different protocols or options.
pub fn summarize(dirs: &[PathBuf]) -> Result<SoakSummary, CrashError> {
    let mut all: BTreeMap<u64, (PathBuf, Report)> = BTreeMap::new();
    for d in dirs {
        for (seed, r) in seed_reports(d)? {
            if let Some((other, _)) = all.get(&seed) {
                return Err(CrashError::Invalid(format!(
                    "seed {seed} is in both {} and {}",
                    other.display(),
                    d.display()
                )));
            }
            all.insert(seed, (d.clone(), r));
        }
    }
    let mut sum = SoakSummary::default();
    let mut first: Option<(String, String, String)> = None;
    for (seed, (dir, r)) in &all {
        let key = (
            r.mode.clone(),
            r.data.clone(),
            format!("{} {}", r.workload, r.options),
        );
        match &first {
            None => first = Some(key),
            Some(k) if *k != key => {
                return Err(CrashError::Invalid(format!(
                    "{}: seed {seed} is a run of mode={} data={} {}, not mode={} data={} {}",
                    dir.display(),
                    key.0,
                    key.1,
                    key.2,
                    k.0,
                    k.1,
                    k.2
                )))
            }
            Some(_) => {}
        }
        sum.add(*seed, r);
    }
    Ok(sum)
}

fn write_atomic(path: &Path, r: &Report) -> Result<(), CrashError> {
    let tmp = path.with_extension("json.tmp");
    r.write_json(&tmp.to_string_lossy())?;
    std::fs::rename(&tmp, path)
        .map_err(|e| CrashError::io(format!("renaming {}", tmp.display()), e))
}

/// Run (or resume) one shard of a soak. Returns the shard's summary.
pub fn soak(p: &SoakParams) -> Result<SoakSummary, CrashError> {
    let (i, n) = p.shard;
    if n == 0 || i >= n {
        return Err(CrashError::Invalid(format!("bad shard {i}/{n}")));
    }
    std::fs::create_dir_all(&p.dir)
        .map_err(|e| CrashError::io(format!("creating {}", p.dir.display()), e))?;
    let shard_target = p.target.div_ceil(n);
    let done = seed_reports(&p.dir)?;
    let mut sum = SoakSummary::default();
    let mut seed = p.first_seed + i;
    let mut tmpl = p.template.clone();
    if !["random", "mix", "htree"].contains(&tmpl.workload.as_str()) {
        return Err(CrashError::Invalid(format!(
            "a soak runs a seeded workload (random, mix or htree), not {}",
            tmpl.workload
        )));
    }
    tmpl.shard = None;
    tmpl.only_state = None;
    tmpl.max_states = None;
    tmpl.keep = None;
    while sum.states < shard_target {
        if crate::stop::requested() {
            return Err(CrashError::Interrupted);
        }
        let report = match done.get(&seed) {
            Some(r) => {
                let want = tmpl.state_options();
                if r.mode != tmpl.mode.to_string()
                    || r.data != explore::data_name(tmpl.data)
                    || r.workload != tmpl.workload
                    || r.options != want
                {
                    return Err(CrashError::Invalid(format!(
                        "{}: a run of mode={} {}, not mode={} {}",
                        seed_path(&p.dir, seed).display(),
                        r.mode,
                        r.options,
                        tmpl.mode,
                        want
                    )));
                }
                r.clone()
            }
            None => {
                let mut e = tmpl.clone();
                e.states.seed = seed;
                e.workload_params.seed = seed;
                let r = explore::explore(&e)?;
                write_atomic(&seed_path(&p.dir, seed), &r)?;
                r
            }
        };
        sum.add(seed, &report);
        if p.verbose {
            eprintln!(
                "soak {}{}: seed {seed}: {} states, {} failing{} ({} / {} states, {:.0} states/s)",
                tmpl.mode,
                if tmpl.data == ordo_fs::DataMode::Ordered {
                    String::new()
                } else {
                    format!(" data={}", explore::data_name(tmpl.data))
                },
                report.checked,
                report.failures_total,
                if done.contains_key(&seed) {
                    " (from an earlier run)"
                } else {
                    ""
                },
                sum.states,
                shard_target,
                sum.states_per_sec
            );
        }
        seed += n;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_file_names_round_trip() {
        let d = Path::new("/x");
        assert_eq!(seed_of(&seed_path(d, 1029)), Some(1029));
        assert_eq!(seed_of(Path::new("/x/seed-.json")), None);
        assert_eq!(seed_of(Path::new("/x/summary.json")), None);
        assert_eq!(seed_of(Path::new("/x/seed-3.json.tmp")), None);
    }

    #[test]
    fn summary_adds_up_and_lists_failed_seeds() {
        let mut a = Report::new("journal", "ordered", "random", 1, "--random-ops 400");
        a.checked = 100;
        a.elapsed_ms = 1000;
        let mut b = a.clone();
        b.checked = 50;
        b.failures_total = 3;
        b.inconsistent = 3;
        b.by_class.insert("recovery".into(), 3);
        let mut s = SoakSummary::default();
        s.add(1, &a);
        s.add(2, &b);
        assert_eq!(s.states, 150);
        assert_eq!(s.seeds, 2);
        assert_eq!(s.failed_seeds, BTreeMap::from([(2, 3)]));
        assert_eq!(s.by_class["recovery"], 3);
        assert!((s.states_per_sec - 75.0).abs() < 1e-9);
        assert!(s.text().contains("failed seeds (failing states): 2 (3)"));
    }
}
