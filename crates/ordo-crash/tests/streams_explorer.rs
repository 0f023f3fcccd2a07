//! The crash explorer on `mode=streams` (ccfs): with two or three streams
//! interleaved in the workloads (`setstream`, `streamsync`) and the
//! stream-prefix check on every state, no inconsistent state, no broken
//! promise, no foreign data and no state off every stream's prefixes on
//! seq-1 (e2fsck on every state), seq-2 (each pair also split across two
//! streams), random, mix and the related-operation scenarios; and the
//! four deliberately broken variants are caught. The faults are read when
//! the protocol is built, so everything runs in this file's one test,
//! which sets and clears the variable for the whole process.

mod protocol_common;

use ordo_crash::explore::E2fsckPolicy;
use ordo_crash::report::Report;
use protocol_common::{assert_clean, params};

fn run(workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    let mut p = params("streams", workload, max_states, e2fsck);
    // More random sequences than the default four, of 150 operations.
    p.workload_params.random_sequences = 40;
    p.workload_params.random_ops = 150;
    protocol_common::run(workload, &p)
}

#[test]
fn streams_keep_each_prefix_and_the_broken_variants_are_caught() {
    std::env::remove_var("ORDO_FAULT");
    let mut total = 0;
    for (w, max, e2fsck) in [
        ("seq1", None, E2fsckPolicy::Every),
        ("streams", None, E2fsckPolicy::Every),
        ("seq2", Some(20_000), E2fsckPolicy::Sample(200)),
        ("random", Some(8_000), E2fsckPolicy::Sample(100)),
        ("mix", Some(8_000), E2fsckPolicy::Sample(100)),
    ] {
        let r = run(w, max, e2fsck);
        assert_clean(w, &r);
        total += r.checked;
    }
    assert!(total >= 30_000, "only {total} states checked");

    // Related changes never merged: a later operation commits without the
    // earlier one it depends on. Whole blocks: a stream's commit carries
    // another stream's uncommitted bytes. Early reuse: a block freed by an
    // uncommitted stream holds another file's data. Delalloc late: a
    // commit at a handle's end carries an append's size without its
    // delayed block.
    for (fault, workload) in [
        ("streams_no_merge", "streams"),
        ("streams_no_merge", "random"),
        ("streams_whole_blocks", "streams"),
        ("streams_whole_blocks", "random"),
        ("streams_early_reuse", "random"),
        ("streams_delalloc_late", "streams"),
    ] {
        std::env::set_var("ORDO_FAULT", fault);
        let r = run(workload, Some(8_000), E2fsckPolicy::Never);
        std::env::remove_var("ORDO_FAULT");
        assert!(
            r.failures_total > 0,
            "{fault} on {workload}: the broken variant must fail some state: {}",
            r.summary(3)
        );
    }
}
