//! The explorer's report: the summary table, the JSON file, and merging the
//! JSON of several shards.
//!
//! The JSON's top-level fields are stable: `checked`, `consistent`,
//! `inconsistent`, `broken_promises`, `foreign_data`, `hook_failures`,
//! `seed`, `by_class`, `failures` (each with the command that rebuilds the
//! state), plus what was run (`mode`, `data`, `workload`, `options`,
//! `shard`) and how fast (`elapsed_ms`, `states_per_sec`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::error::CrashError;
use crate::oracle::FailureClass;

/// A write a failure needs, after minimization.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteDesc {
    /// Event index in the sequence's log.
    pub event: usize,
    /// First block.
    pub block: u64,
    /// Blocks written.
    pub blocks: u64,
    /// Block class ("dir", "itable", ...).
    pub class: String,
    /// Written with FUA.
    pub fua: bool,
    /// Workload operation that issued it.
    pub op: usize,
}

/// One failing state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// State id `sequence.point.index`.
    pub state: String,
    /// Sequence name.
    pub sequence: String,
    /// The sequence's operations in scenario form (recorded part).
    pub ops: Vec<String>,
    /// Operation in flight at the crash (1-based; 0 = mount).
    pub op_in_flight: usize,
    /// Writes on disk in this state.
    pub writes_applied: usize,
    /// Whether the newest write is torn.
    pub torn: bool,
    /// Failure classes found.
    pub classes: Vec<String>,
    /// One line per finding.
    pub details: Vec<String>,
    /// After minimization: the writes of the last flush epoch the failure
    /// still needs (others were dropped and it still failed). `None` when
    /// not minimized.
    pub needed_writes: Option<Vec<WriteDesc>>,
    /// The command that rebuilds exactly this state and keeps its image.
    pub reproduce: String,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Protocol.
    pub mode: String,
    /// Data mode.
    pub data: String,
    /// Workload name or scenario path.
    pub workload: String,
    /// Seed of every random choice.
    pub seed: u64,
    /// Options that change which states exist (part of the reproduce
    /// command), e.g. `--torn`.
    pub options: String,
    /// `I/N` for one shard, `merged K/N` after a merge, absent for a full
    /// run.
    pub shard: Option<String>,
    /// Sequences recorded.
    pub sequences: u64,
    /// States the run generated (before sharding and `--states`).
    pub states_total: u64,
    /// States checked.
    pub checked: u64,
    /// States with no inconsistency (recovery, mount, e2fsck, panic).
    pub consistent: u64,
    /// States with an inconsistency.
    pub inconsistent: u64,
    /// States where a promise does not hold.
    pub broken_promises: u64,
    /// States with foreign or stale data.
    pub foreign_data: u64,
    /// States where a protocol hook failed.
    pub hook_failures: u64,
    /// States with no finding at all.
    pub passed: u64,
    /// States `e2fsck -fn` ran on.
    pub e2fsck_checked: u64,
    /// States also recovered by the kernel and by `e2fsck -fy` and
    /// compared with ordo's recovery (`crate::judge`).
    #[serde(default)]
    pub judged: u64,
    /// Documented behaviours of other tools seen, per name (not failures):
    /// `e2fsck_stale_fc_head`, `e2fsck_multiply_claimed`,
    /// `e2fsck_torn_commit`, `judge_torn_superblock` (docs/CRASH.md).
    #[serde(default)]
    pub notes: BTreeMap<String, u64>,
    /// States per failure class.
    pub by_class: BTreeMap<String, u64>,
    /// The same counts per sequence of the workload (by its name; the
    /// `nofs-table3` rows of docs/RESULTS.md are made from them).
    #[serde(default)]
    pub by_sequence: BTreeMap<String, SequenceTally>,
    /// Wall-clock time of the checks in milliseconds (summed over merged
    /// shards).
    pub elapsed_ms: u64,
    /// States checked per second (whole run, all jobs).
    pub states_per_sec: f64,
    /// Worker threads.
    pub jobs: u64,
    /// Failing states (all of them, up to `failures_listed_max`).
    pub failures: Vec<FailureRecord>,
    /// Failing states in total (the list may be shorter).
    pub failures_total: u64,
}

/// What the states of one sequence found.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SequenceTally {
    /// States checked.
    pub checked: u64,
    /// States with at least one failure.
    pub failing: u64,
    /// States per failure class.
    pub by_class: BTreeMap<String, u64>,
    /// States per note.
    pub notes: BTreeMap<String, u64>,
}

impl SequenceTally {
    /// Count one state of the sequence.
    pub fn count(&mut self, classes: &[FailureClass], notes: &[&str]) {
        self.checked += 1;
        let mut distinct = classes.to_vec();
        distinct.sort();
        distinct.dedup();
        if !distinct.is_empty() {
            self.failing += 1;
        }
        for c in &distinct {
            *self.by_class.entry(c.name().to_string()).or_default() += 1;
        }
        for n in notes {
            *self.notes.entry((*n).to_string()).or_default() += 1;
        }
    }

    /// Add another tally of the same sequence (a merge of shards).
    pub fn add(&mut self, o: &SequenceTally) {
        self.checked += o.checked;
        self.failing += o.failing;
        for (k, v) in &o.by_class {
            *self.by_class.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.notes {
            *self.notes.entry(k.clone()).or_default() += v;
        }
    }
}

/// Failures kept in the JSON list; the counts are always complete.
pub const FAILURES_LISTED_MAX: usize = 2000;

impl Report {
    /// An empty report of a run.
    pub fn new(mode: &str, data: &str, workload: &str, seed: u64, options: &str) -> Self {
        Report {
            mode: mode.into(),
            data: data.into(),
            workload: workload.into(),
            seed,
            options: options.into(),
            shard: None,
            sequences: 0,
            states_total: 0,
            checked: 0,
            consistent: 0,
            inconsistent: 0,
            broken_promises: 0,
            foreign_data: 0,
            hook_failures: 0,
            passed: 0,
            e2fsck_checked: 0,
            judged: 0,
            notes: BTreeMap::new(),
            by_class: FailureClass::ALL
                .iter()
                .map(|c| (c.name().to_string(), 0))
                .collect(),
            by_sequence: BTreeMap::new(),
            elapsed_ms: 0,
            states_per_sec: 0.0,
            jobs: 0,
            failures: Vec::new(),
            failures_total: 0,
        }
    }

    /// Count one checked state with its failure classes.
    pub fn count(&mut self, classes: &[FailureClass], e2fsck: bool) {
        self.checked += 1;
        if e2fsck {
            self.e2fsck_checked += 1;
        }
        let mut distinct = classes.to_vec();
        distinct.sort();
        distinct.dedup();
        for c in &distinct {
            *self.by_class.entry(c.name().to_string()).or_default() += 1;
        }
        if distinct.iter().any(|c| c.is_inconsistency()) {
            self.inconsistent += 1;
        } else {
            self.consistent += 1;
        }
        if distinct.contains(&FailureClass::BrokenPromise) {
            self.broken_promises += 1;
        }
        if distinct.contains(&FailureClass::ForeignData) {
            self.foreign_data += 1;
        }
        if distinct.contains(&FailureClass::Hook) {
            self.hook_failures += 1;
        }
        if distinct.is_empty() {
            self.passed += 1;
        } else {
            self.failures_total += 1;
        }
    }

    /// Human-readable summary table, then the first failures with their
    /// reproduce commands.
    pub fn summary(&self, failures_shown: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ordo crash: mode={} data={} workload={} seed={}{}{}",
            self.mode,
            self.data,
            self.workload,
            self.seed,
            if self.options.is_empty() { "" } else { " " },
            self.options
        );
        if let Some(sh) = &self.shard {
            let _ = writeln!(s, "  shard {sh}");
        }
        let _ = writeln!(
            s,
            "  {} sequences, {} states generated, {} checked in {:.1} s ({:.0} states/s on {} jobs)",
            self.sequences,
            self.states_total,
            self.checked,
            self.elapsed_ms as f64 / 1000.0,
            self.states_per_sec,
            self.jobs
        );
        let row = |s: &mut String, name: &str, v: u64| {
            let _ = writeln!(s, "  {name:<22}{v:>10}");
        };
        row(&mut s, "checked", self.checked);
        row(&mut s, "passed", self.passed);
        row(&mut s, "consistent", self.consistent);
        row(&mut s, "inconsistent", self.inconsistent);
        for c in FailureClass::ALL.iter().filter(|c| c.is_inconsistency()) {
            row(
                &mut s,
                &format!("  {}", c.name()),
                self.by_class.get(c.name()).copied().unwrap_or(0),
            );
        }
        row(&mut s, "broken_promises", self.broken_promises);
        row(&mut s, "foreign_data", self.foreign_data);
        row(&mut s, "hook_failures", self.hook_failures);
        row(&mut s, "e2fsck -fn run on", self.e2fsck_checked);
        if self.judged > 0 {
            row(&mut s, "kernel + e2fsck -fy", self.judged);
        }
        for (k, v) in &self.notes {
            row(&mut s, &format!("  note {k}"), *v);
        }
        for f in self.failures.iter().take(failures_shown) {
            let _ = writeln!(
                s,
                "\nFAIL {} [{}] {} (crash during op {})",
                f.state,
                f.classes.join(","),
                f.sequence,
                f.op_in_flight
            );
            for d in f.details.iter().take(4) {
                let _ = writeln!(s, "  {d}");
            }
            if let Some(w) = f.needed_writes.as_ref().filter(|w| !w.is_empty()) {
                let _ = writeln!(
                    s,
                    "  needs {} unflushed write(s): {}",
                    w.len(),
                    w.iter()
                        .map(|w| format!("#{} block {} ({})", w.event, w.block, w.class))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let _ = writeln!(s, "  reproduce: {}", f.reproduce);
        }
        if self.failures_total as usize > failures_shown.min(self.failures.len()) {
            let _ = writeln!(
                s,
                "\n... {} failing states in total (see --json)",
                self.failures_total
            );
        }
        s
    }

    /// Write the JSON report.
    pub fn write_json(&self, path: &str) -> Result<(), CrashError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })?;
        std::fs::write(path, text + "\n").map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })
    }

    /// Read a JSON report.
    pub fn read_json(path: &str) -> Result<Report, CrashError> {
        let text = std::fs::read_to_string(path).map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| CrashError::Report {
            path: path.into(),
            detail: e.to_string(),
        })
    }
}

/// Combine the reports of the shards of one run. They must agree on what
/// was run; counts add up, failures are concatenated in state order.
pub fn merge(reports: &[(String, Report)]) -> Result<Report, CrashError> {
    let Some((first_path, first)) = reports.first() else {
        return Err(CrashError::Invalid(
            "merge needs at least one report".into(),
        ));
    };
    let mut out = Report::new(
        &first.mode,
        &first.data,
        &first.workload,
        first.seed,
        &first.options,
    );
    out.sequences = first.sequences;
    out.states_total = first.states_total;
    let mut shards = Vec::new();
    for (path, r) in reports {
        let same = (
            &r.mode,
            &r.data,
            &r.workload,
            r.seed,
            &r.options,
            r.states_total,
        ) == (
            &first.mode,
            &first.data,
            &first.workload,
            first.seed,
            &first.options,
            first.states_total,
        );
        if !same {
            return Err(CrashError::Report {
                path: path.clone(),
                detail: format!(
                    "is a different run than {first_path} (mode, data, workload, seed, options \
                     and state count must match)"
                ),
            });
        }
        if let Some(s) = &r.shard {
            if shards.contains(s) {
                return Err(CrashError::Report {
                    path: path.clone(),
                    detail: format!("shard {s} is given twice"),
                });
            }
            shards.push(s.clone());
        }
        out.checked += r.checked;
        out.consistent += r.consistent;
        out.inconsistent += r.inconsistent;
        out.broken_promises += r.broken_promises;
        out.foreign_data += r.foreign_data;
        out.hook_failures += r.hook_failures;
        out.passed += r.passed;
        out.e2fsck_checked += r.e2fsck_checked;
        out.judged += r.judged;
        for (k, v) in &r.notes {
            *out.notes.entry(k.clone()).or_default() += v;
        }
        out.elapsed_ms += r.elapsed_ms;
        out.jobs = out.jobs.max(r.jobs);
        out.failures_total += r.failures_total;
        for (k, v) in &r.by_class {
            *out.by_class.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &r.by_sequence {
            out.by_sequence.entry(k.clone()).or_default().add(v);
        }
        out.failures.extend(r.failures.iter().cloned());
    }
    out.failures.sort_by_key(|f| state_sort_key(&f.state));
    out.failures.truncate(FAILURES_LISTED_MAX);
    let total_shards = shards
        .first()
        .and_then(|s| s.split('/').nth(1))
        .unwrap_or("?")
        .to_string();
    out.shard = Some(format!("merged {}/{total_shards}", reports.len()));
    out.states_per_sec = if out.elapsed_ms > 0 {
        out.checked as f64 * 1000.0 / out.elapsed_ms as f64
    } else {
        0.0
    };
    Ok(out)
}

fn state_sort_key(id: &str) -> Vec<u64> {
    id.split('.')
        .map(|p| p.parse().unwrap_or(u64::MAX))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(i: u32, fail: bool) -> Report {
        let mut r = Report::new("sync", "ordered", "seq1", 5, "");
        r.shard = Some(format!("{i}/2"));
        r.states_total = 10;
        r.elapsed_ms = 100;
        r.count(&[], false);
        if fail {
            r.count(&[FailureClass::Recovery, FailureClass::BrokenPromise], true);
            r.failures.push(FailureRecord {
                state: format!("{i}.3.1"),
                sequence: "s".into(),
                ops: vec![],
                op_in_flight: 1,
                writes_applied: 2,
                torn: false,
                classes: vec!["recovery".into()],
                details: vec!["x".into()],
                needed_writes: None,
                reproduce: "ordo crash ...".into(),
            });
        }
        r
    }

    #[test]
    fn counts_classes_once_per_state() {
        let mut r = Report::new("async", "ordered", "seq1", 0, "");
        r.count(&[FailureClass::Recovery, FailureClass::Recovery], false);
        r.count(&[FailureClass::BrokenPromise], true);
        r.count(&[], false);
        assert_eq!(r.checked, 3);
        assert_eq!(r.inconsistent, 1);
        assert_eq!(r.consistent, 2);
        assert_eq!(r.broken_promises, 1);
        assert_eq!(r.passed, 1);
        assert_eq!(r.by_class["recovery"], 1);
        assert_eq!(r.e2fsck_checked, 1);
        assert!(r.summary(5).contains("inconsistent"));
    }

    #[test]
    fn sequence_tallies_count_states_and_merge() {
        let mut t = SequenceTally::default();
        t.count(&[FailureClass::Recovery, FailureClass::Recovery], &["n"]);
        t.count(&[], &["n", "m"]);
        assert_eq!((t.checked, t.failing), (2, 1));
        assert_eq!(t.by_class["recovery"], 1);
        assert_eq!((t.notes["n"], t.notes["m"]), (2, 1));
        let mut a = shard(0, true);
        let mut b = shard(1, false);
        a.by_sequence.insert("s".into(), t.clone());
        b.by_sequence.insert("s".into(), t);
        let m = merge(&[("a".into(), a), ("b".into(), b)]).unwrap();
        assert_eq!(
            (m.by_sequence["s"].checked, m.by_sequence["s"].failing),
            (4, 2)
        );
        assert_eq!(m.by_sequence["s"].notes["n"], 4);
    }

    #[test]
    fn merge_adds_up_and_refuses_mismatches() {
        let a = shard(0, true);
        let b = shard(1, false);
        let m = merge(&[("a".into(), a.clone()), ("b".into(), b.clone())]).unwrap();
        assert_eq!(m.checked, 3);
        assert_eq!(m.inconsistent, 1);
        assert_eq!(m.failures.len(), 1);
        assert_eq!(m.shard.as_deref(), Some("merged 2/2"));
        assert!(merge(&[("a".into(), a.clone()), ("a2".into(), a.clone())]).is_err());
        let mut c = shard(1, false);
        c.seed = 6;
        assert!(merge(&[("a".into(), a), ("c".into(), c)]).is_err());
    }

    #[test]
    fn json_round_trip() {
        let r = shard(0, true);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        r.write_json(p.to_str().unwrap()).unwrap();
        let back = Report::read_json(p.to_str().unwrap()).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        for k in [
            "checked",
            "inconsistent",
            "broken_promises",
            "seed",
            "failures",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }
}
