//! The short soak CI runs: the `mix` workload over seed after seed until
//! about 15,000 crash states per protocol and data mode, each clean, with
//! the kernel / e2fsck judge on the journaled ones; the same soak finds
//! failures on `async` (it can fail); and a soak resumes from its seed
//! reports. The 1,000,000-state soaks are `ordo crash soak` runs whose
//! figures are in docs/CRASH.md.

mod fuse_common;

use std::path::PathBuf;

use ordo_crash::explore::{E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_crash::soak::{soak, summarize, SoakParams, SoakSummary};
use ordo_crash::workload::WorkloadParams;
use ordo_fs::{DataMode, ProtocolKind};

const CI_TARGET: u64 = 15_000;

fn params(mode: ProtocolKind, data: DataMode, target: u64, dir: PathBuf) -> SoakParams {
    let mut t = ExploreParams::new(mode, "mix");
    t.data = data;
    t.workload_params = WorkloadParams {
        random_ops: 400,
        ..WorkloadParams::default()
    };
    t.e2fsck = E2fsckPolicy::Sample(200);
    t.judge = JudgePolicy::Sample(100);
    t.minimize_max = 2;
    SoakParams {
        template: t,
        target,
        shard: (0, 1),
        first_seed: 0,
        dir,
        verbose: true,
    }
}

fn run(mode: ProtocolKind, data: DataMode, target: u64) -> SoakSummary {
    let dir = tempfile::tempdir().unwrap();
    let s = soak(&params(mode, data, target, dir.path().to_path_buf())).unwrap();
    println!("{}", s.text());
    s
}

fn assert_clean(s: &SoakSummary) {
    assert!(s.states >= CI_TARGET, "{}", s.text());
    assert_eq!(s.failing_states, 0, "{}", s.text());
    assert!(s.failed_seeds.is_empty(), "{}", s.text());
}

#[test]
fn sync_soak_is_clean() {
    assert_clean(&run(
        ProtocolKind::named("sync"),
        DataMode::Ordered,
        CI_TARGET,
    ));
}

#[test]
fn journal_soaks_are_clean_in_every_data_mode() {
    for data in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
        let s = run(ProtocolKind::named("journal"), data, CI_TARGET);
        assert_clean(&s);
        assert!(s.judged > 0, "{}", s.text());
    }
}

#[test]
fn fast_commit_soak_is_clean() {
    let s = run(
        ProtocolKind::named("fast_commit"),
        DataMode::Ordered,
        CI_TARGET,
    );
    assert_clean(&s);
    assert!(s.judged > 0, "{}", s.text());
}

/// The `htree` workload: a base image made by the kernel, whose `/D` is
/// indexed, under every operation of `mix`; 4,000 states per log protocol
/// with the judge, and the same soak fails on `async`.
#[test]
fn htree_soaks_on_kernel_made_images() {
    for mode in ["journal", "fast_commit", "sync"] {
        let dir = tempfile::tempdir().unwrap();
        let mut p = params(
            ProtocolKind::named(mode),
            DataMode::Ordered,
            4_000,
            dir.path().to_path_buf(),
        );
        p.template.workload = "htree".into();
        p.template.workload_params.random_ops = 200;
        let s = soak(&p).unwrap();
        println!("{}", s.text());
        assert!(s.states >= 4_000, "{}", s.text());
        assert_eq!(s.failing_states, 0, "{}", s.text());
        if ProtocolKind::named(mode).caps().kernel_replays {
            assert!(s.judged > 0, "{}", s.text());
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = params(
        ProtocolKind::named("async"),
        DataMode::Ordered,
        1_000,
        dir.path().to_path_buf(),
    );
    p.template.workload = "htree".into();
    p.template.workload_params.random_ops = 200;
    let s = soak(&p).unwrap();
    assert!(s.failing_states > 0, "{}", s.text());
}

#[test]
fn the_soak_fails_on_async() {
    let s = run(ProtocolKind::named("async"), DataMode::Ordered, 2_000);
    assert!(s.failing_states > 0, "{}", s.text());
    assert!(!s.failed_seeds.is_empty());
    assert!(s.inconsistent > 0);
}

/// A soak recorded through a FUSE mount (`ordo crash soak --fuse`): the
/// kernel's requests, not the library's calls, reach the protocol; the
/// `mix` workload's collapses and inserts become punches and zeroed ranges
/// (FUSE refuses them). `journal` is clean with and without the kernel
/// opening files itself, `sync` with it (every unlink through the orphan
/// list) and `softdep` without; `async` fails the same way. Skipped where FUSE is
/// not available.
#[test]
fn fuse_soaks_record_through_the_kernel() {
    if !fuse_common::fuse_available() {
        return;
    }
    // A soak checks whole seeds: one `mix` seed of 400 operations under
    // `softdep` is about 95,000 states through FUSE (its write rounds put
    // many blocks in flight at once), so those legs run 100 operations.
    let fuse_soak = |mode: &str, no_open: bool, target: u64, random_ops: usize| {
        let dir = tempfile::tempdir().unwrap();
        let mut p = params(
            ProtocolKind::named(mode),
            DataMode::Ordered,
            target,
            dir.path().to_path_buf(),
        );
        p.template.fuse = true;
        p.template.fuse_no_open = no_open;
        p.template.workload_params.random_ops = random_ops;
        let s = soak(&p).unwrap();
        println!("{}", s.text());
        assert!(s.options.contains("--fuse"), "{}", s.options);
        s
    };
    for (mode, no_open, target, ops) in [
        ("journal", false, 5_000, 400),
        ("journal", true, 5_000, 400),
        ("sync", true, 2_000, 400),
        ("softdep", false, 2_000, 100),
    ] {
        let s = fuse_soak(mode, no_open, target, ops);
        assert!(s.states >= target, "{}", s.text());
        assert_eq!(s.failing_states, 0, "{}", s.text());
        if mode == "journal" {
            assert!(s.judged > 0, "{}", s.text());
        }
    }
    let s = fuse_soak("async", false, 2_000, 100);
    assert!(s.failing_states > 0, "{}", s.text());
    assert!(s.inconsistent > 0, "{}", s.text());
}

#[test]
fn a_soak_resumes_from_its_seed_reports_and_shards_merge() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = params(
        ProtocolKind::named("sync"),
        DataMode::Ordered,
        1_500,
        dir.path().join("a"),
    );
    p.template.workload_params.random_ops = 60;
    let first = soak(&p).unwrap();
    let files = std::fs::read_dir(&p.dir).unwrap().count() as u64;
    assert_eq!(files, first.seeds);
    // Again on the same directory: every seed comes from its report.
    let again = soak(&p).unwrap();
    assert_eq!(again.states, first.states);
    assert_eq!(again.seeds, first.seeds);
    assert_eq!(std::fs::read_dir(&p.dir).unwrap().count() as u64, files);
    // Two shards cover disjoint seeds and merge.
    let mut shards = Vec::new();
    for i in 0..2 {
        let mut q = params(
            ProtocolKind::named("sync"),
            DataMode::Ordered,
            1_500,
            dir.path().join(format!("s{i}")),
        );
        q.template.workload_params.random_ops = 60;
        q.shard = (i, 2);
        soak(&q).unwrap();
        shards.push(q.dir);
    }
    let merged = summarize(&shards).unwrap();
    assert!(merged.states >= 1_500, "{}", merged.text());
    // A seed in two directories is refused.
    assert!(summarize(&[p.dir.clone(), p.dir.clone()]).is_err());
}
