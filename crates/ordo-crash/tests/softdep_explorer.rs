//! The crash explorer on `mode=softdep` (soft updates): no inconsistent
//! state, no broken promise and no foreign data on seq-1 (e2fsck on every
//! state), seq-2, random and mix, at least 30,000 states in all; and the
//! two deliberately broken variants are caught: rollback disabled
//! (`ORDO_FAULT=softdep_no_rollback`) and frees not deferred
//! (`ORDO_FAULT=softdep_eager_frees`). The fault is read when the protocol
//! is built, so everything runs in this file's one test, which sets and
//! clears it for the whole process.

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams};
use ordo_crash::report::Report;
use ordo_fs::ProtocolKind;

fn run(workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    let mut p = ExploreParams::new(ProtocolKind::named("softdep"), workload);
    p.e2fsck = e2fsck;
    p.minimize_max = 2;
    p.max_states = max_states;
    let r = explore(&p).unwrap();
    println!("{workload}: {}", r.summary(5));
    r
}

#[test]
fn softdep_is_consistent_and_the_broken_variants_are_caught() {
    std::env::remove_var("ORDO_FAULT");
    let mut total = 0;
    for (w, max, e2fsck) in [
        ("seq1", None, E2fsckPolicy::Every),
        ("seq2", Some(20_000), E2fsckPolicy::Sample(200)),
        ("random", Some(6_000), E2fsckPolicy::Sample(100)),
        ("mix", Some(6_000), E2fsckPolicy::Sample(100)),
    ] {
        let r = run(w, max, e2fsck);
        assert!(r.checked > 0, "{w}: no state checked");
        assert!(r.e2fsck_checked > 0, "{w}: e2fsck never ran");
        assert_eq!(r.inconsistent, 0, "{w}: {}", r.summary(5));
        assert_eq!(r.broken_promises, 0, "{w}: {}", r.summary(5));
        assert_eq!(r.foreign_data, 0, "{w}: {}", r.summary(5));
        assert!(r.failures.is_empty(), "{w}: {}", r.summary(5));
        total += r.checked;
    }
    assert!(total >= 30_000, "only {total} states checked");

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
