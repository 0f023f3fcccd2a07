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
    let mut p = ExploreParams::new(ProtocolKind::named("fast_commit"), workload);
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
    // Torn writes (the newest write cut at every 512-byte sector): the
    // superblock is written home outside the log (needs_recovery, the
    // early home write of committed copies), and a tear of it must be
    // repaired from the log, not refused at mount.
    let mut p = params("seq1");
    p.states.torn = true;
    let r = explore(&p).unwrap();
    println!("{}", r.summary(5));
    assert!(r.checked > 0);
    assert_eq!(r.inconsistent, 0, "torn: {}", r.summary(5));
    assert!(r.failures.is_empty(), "torn: {}", r.summary(5));
    // The fault: commits with data skip their flush; the built-in
    // workloads must then find crash states that lose data an fsync
    // promised (the recorded mount starts with a full commit, so seq-1's
    // fsyncs are fast commits).
    std::env::set_var("ORDO_FAULT", "fc_skip_data_flush");
    let caught: Vec<(String, usize)> = [("seq1", None), ("seq2", Some(3000))]
        .into_iter()
        .map(|(w, max)| (w.to_string(), run(w, max).failures.len()))
        .collect();
    std::env::remove_var("ORDO_FAULT");
    for (w, failures) in &caught {
        assert!(*failures > 0, "{w}: the skipped flush must be caught");
    }
}
