//! The crash explorer on `mode=softdep` (soft updates): no inconsistent
//! state, no broken promise and no foreign data on seq-1 (e2fsck on every
//! state), seq-2, random and mix, at least 30,000 states in all, and on the
//! cases the soaks found (`tests/scenarios/softdep-*.scenario`); and the
//! two deliberately broken variants are caught: rollback disabled
//! (`ORDO_FAULT=softdep_no_rollback`) and frees not deferred
//! (`ORDO_FAULT=softdep_eager_frees`). The fault is read when the protocol
//! is built, so everything runs in this file's one test, which sets and
//! clears it for the whole process.

mod protocol_common;

use ordo_crash::explore::E2fsckPolicy;
use ordo_crash::report::Report;
use protocol_common::{assert_clean, params};

fn run(workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    protocol_common::run(workload, &params("softdep", workload, max_states, e2fsck))
}

#[test]
fn softdep_is_consistent_and_the_broken_variants_are_caught() {
    std::env::remove_var("ORDO_FAULT");
    let mut total = 0;
    for (w, max, e2fsck) in [
        ("seq1", None, E2fsckPolicy::Every),
        ("seq2", Some(24_000), E2fsckPolicy::Sample(200)),
        ("random", Some(6_000), E2fsckPolicy::Sample(100)),
        ("mix", Some(6_000), E2fsckPolicy::Sample(100)),
    ] {
        let r = run(w, max, e2fsck);
        assert_clean(w, &r);
        total += r.checked;
    }
    assert!(total >= 30_000, "only {total} states checked");
    // The soak's case (the scenario's header): every state, e2fsck on each.
    // About 220 states since a round's rolled-back images go out in its
    // runs (fewer writes in flight at each point); the binary before the
    // fix still leaves one of them inconsistent.
    let w = "tests/scenarios/softdep-emptied-node.scenario";
    let r = run(w, None, E2fsckPolicy::Every);
    assert_clean(w, &r);
    assert!(r.checked >= 200, "{w}: only {} states checked", r.checked);

    // Rollback off: pending pointers reach the disk before what they
    // point to. Frees not deferred: a bitmap bit, a link count or an
    // inode's clearing goes out while an entry still names it, and freed
    // blocks are reused at once.
    for fault in ["softdep_no_rollback", "softdep_eager_frees"] {
        std::env::set_var("ORDO_FAULT", fault);
        let r = run("seq1", None, E2fsckPolicy::Never);
        std::env::remove_var("ORDO_FAULT");
        assert!(
            r.inconsistent > 0,
            "{fault}: the broken variant must leave inconsistent states: {}",
            r.summary(3)
        );
    }
}
