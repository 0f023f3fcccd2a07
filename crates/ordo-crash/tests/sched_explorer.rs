//! The crash explorer on scheduler-enforced ordering: `sched-flag` (Part
//! with block copies, the paper's compared variant, and Full) and
//! `sched-chain` (dependencies on the freeing handle, and barriers): no
//! inconsistent state, no broken promise and no foreign data on seq-1
//! (e2fsck on every state), a bounded seq-2, random and mix. Recordings go
//! through the scheduler with a seeded random choice among eligible
//! requests, so the states cover orders the constraints allow beyond one
//! policy's. And the broken variants are caught: `Ignore` (no flag
//! honoured) and Part with one flag dropped (`ORDO_FAULT=sched_flag_drop:N`,
//! read when the protocol is built, so everything runs in this file's one
//! test, which sets and clears it for the whole process).

mod protocol_common;

use ordo_crash::explore::E2fsckPolicy;
use ordo_crash::report::Report;
use protocol_common::{assert_clean, params};

fn run(mode: &str, workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    let p = params(mode, workload, max_states, e2fsck);
    protocol_common::run(&format!("{mode} {workload}"), &p)
}

#[test]
fn scheduler_ordering_is_consistent_and_the_broken_variants_are_caught() {
    std::env::remove_var("ORDO_FAULT");
    for mode in [
        "sched-flag",
        "sched-flag:full-cb",
        "sched-chain",
        "sched-chain:barrier",
    ] {
        let mut total = 0;
        for (w, max, e2fsck) in [
            ("seq1", None, E2fsckPolicy::Every),
            ("seq2", Some(4_000), E2fsckPolicy::Sample(200)),
            ("random", Some(2_000), E2fsckPolicy::Sample(100)),
            ("mix", Some(3_000), E2fsckPolicy::Sample(100)),
        ] {
            let r = run(mode, w, max, e2fsck);
            assert_clean(&format!("{mode} {w}"), &r);
            total += r.checked;
        }
        assert!(total >= 5_000, "{mode}: only {total} states checked");
    }

    // No flag honoured: the scheduler reorders everything.
    let r = run("sched-flag:ignore-cb", "seq1", None, E2fsckPolicy::Never);
    assert!(
        r.inconsistent > 0,
        "Ignore must leave inconsistent states: {}",
        r.summary(3)
    );
    // One flag dropped: some mount of seq-1 loses an ordering point that
    // matters (the first flagged writes of a mount are its start-up
    // bookkeeping, so try a few).
    let caught = (0..6).any(|n| {
        std::env::set_var("ORDO_FAULT", format!("sched_flag_drop:{n}"));
        let r = run("sched-flag", "seq1", None, E2fsckPolicy::Never);
        std::env::remove_var("ORDO_FAULT");
        r.inconsistent > 0
    });
    assert!(caught, "dropping one flag must leave inconsistent states");
}
