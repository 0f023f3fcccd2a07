//! The crash explorer on `mode=optimistic` (OptFS): with its osync, dsync
//! and write-back ticks in the workloads and the prefix check on every
//! state, no inconsistent state, no broken promise, no foreign data and no
//! state off the model's prefixes on seq-1 (e2fsck on every state), seq-2,
//! random, mix and the delayed-block scenarios of OptFS's Table 1 (append
//! and overwrite, with the data, the journal blocks and the commit each
//! delayed by the explorer's reorderings); and the four deliberately broken
//! variants are caught. The faults are read when the protocol is built, so
//! everything runs in this file's one test, which sets and clears the
//! variable for the whole process.

mod protocol_common;

use ordo_crash::explore::E2fsckPolicy;
use ordo_crash::report::Report;
use protocol_common::{assert_clean, params};

fn run(workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    let mut p = params("optimistic", workload, max_states, e2fsck);
    // More random sequences than the default four, of 100 operations.
    p.workload_params.random_sequences = 12;
    p.workload_params.random_ops = 100;
    protocol_common::run(workload, &p)
}

/// OptFS's Table 1 cases as scenarios (`crates/ordo-crash/scenarios`): an
/// append and an overwrite, each osynced then made durable, several
/// transactions in flight at once, and write-back ticks that checkpoint a
/// log half full of journaled overwrites.
const SCENARIOS: [&str; 3] = ["optfs-append", "optfs-overwrite", "optfs-checkpoint"];

#[test]
fn optimistic_is_consistent_and_the_broken_variants_are_caught() {
    std::env::remove_var("ORDO_FAULT");
    let scenarios: Vec<String> = SCENARIOS
        .iter()
        .map(|n| format!("{}/scenarios/{n}.scenario", env!("CARGO_MANIFEST_DIR")))
        .collect();
    let mut total = 0;
    let mut runs: Vec<(String, Option<usize>, E2fsckPolicy)> = vec![
        ("seq1".into(), None, E2fsckPolicy::Every),
        ("seq2".into(), Some(20_000), E2fsckPolicy::Sample(200)),
        ("random".into(), Some(6_000), E2fsckPolicy::Sample(100)),
        ("mix".into(), Some(6_000), E2fsckPolicy::Sample(100)),
    ];
    for s in &scenarios {
        runs.push((s.clone(), Some(4_000), E2fsckPolicy::Sample(20)));
    }
    for (w, max, e2fsck) in runs {
        let r = run(&w, max, e2fsck);
        assert_clean(&w, &r);
        total += r.checked;
    }
    assert!(total >= 30_000, "only {total} states checked");

    // Commit blocks without data tags: a commit replays over data that
    // never arrived. Checkpoint before durability: metadata home before its
    // transaction. Reuse before notification: a new owner's bytes under an
    // old owner. Replay past a bad transaction: later ones on top of a hole.
    for (fault, workload) in [
        ("optimistic_no_data_tags", "seq1"),
        ("optimistic_early_checkpoint", "seq1"),
        ("optimistic_early_reuse", "seq1"),
        ("optimistic_replay_past_bad", "seq1"),
        ("optimistic_early_reuse", scenarios[2].as_str()),
    ] {
        std::env::set_var("ORDO_FAULT", fault);
        let r = run(workload, None, E2fsckPolicy::Never);
        std::env::remove_var("ORDO_FAULT");
        assert!(
            r.failures_total > 0,
            "{fault}: the broken variant must fail some state: {}",
            r.summary(3)
        );
    }
}
