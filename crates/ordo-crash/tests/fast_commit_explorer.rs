//! The crash explorer on `mode=fast_commit` with selective flushing on:
//! no inconsistent state and no broken promise on seq-1, bounded seq-2
//! and random workloads; and the test-only fault that skips the flush of
//! a commit carrying file data (`ORDO_FAULT=fc_skip_data_flush`) is
//! caught. The fault is read when the protocol is built, so it lives in
//! its own test binary run (`fast_commit_fault_is_caught` sets it for the
//! whole process and runs last in this file's single test thread).

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams};
use ordo_fs::ProtocolKind;

fn params(workload: &str) -> ExploreParams {
    let mut p = ExploreParams::new(ProtocolKind::FastCommit, workload);
    p.e2fsck = E2fsckPolicy::Never;
    p.minimize_max = 2;
    p
}

fn run(workload: &str, max_states: Option<usize>) -> ordo_crash::report::Report {
    let mut p = params(workload);
    p.max_states = max_states;
    let r = explore(&p).unwrap();
    println!("{}", r.summary(5));
    r
}

#[test]
fn fast_commit_is_consistent_and_keeps_promises() {
    std::env::remove_var("ORDO_FAULT");
    for (w, max) in [("seq1", None), ("seq2", Some(3000)), ("random", Some(1500))] {
        let r = run(w, max);
        assert!(r.checked > 0, "{w}: no state checked");
        assert_eq!(r.inconsistent, 0, "{w}: {}", r.summary(5));
        assert!(r.failures.is_empty(), "{w}: {}", r.summary(5));
    }
    // The fault: commits with data skip their flush; some crash state must
    // then lose data an fsync promised.
    // A scenario whose second fsync is a fast commit carrying data (the
    // first fsync of a mount is always a full commit).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fc-data.scenario");
    std::fs::write(
        &path,
        "preset\n---\ncreat /A/one\nwrite /A/one 0 4096\nfsync /A/one\ncreat /A/two\nwrite /A/two 0 8192\nfsync /A/two\ncreat /C/three\nfsync /C/three\n",
    )
    .unwrap();
    let path = path.to_str().unwrap().to_string();
    let clean = run(&path, None);
    assert!(clean.failures.is_empty(), "{}", clean.summary(5));
    std::env::set_var("ORDO_FAULT", "fc_skip_data_flush");
    let r = run(&path, None);
    std::env::remove_var("ORDO_FAULT");
    assert!(
        !r.failures.is_empty(),
        "the skipped flush must be caught: {}",
        r.summary(5)
    );
}
