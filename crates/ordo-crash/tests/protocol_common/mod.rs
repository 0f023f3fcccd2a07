//! What the per-protocol explorer tests share: one exploration of a
//! workload, printed, and the check that it found nothing.
#![allow(dead_code)]

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams};
use ordo_crash::report::Report;
use ordo_fs::ProtocolKind;

/// The parameters of one exploration of `workload` on `mode`: at most
/// `max_states` states, e2fsck as `e2fsck` says, two failures minimized.
pub fn params(
    mode: &str,
    workload: &str,
    max_states: Option<usize>,
    e2fsck: E2fsckPolicy,
) -> ExploreParams {
    let mut p = ExploreParams::new(ProtocolKind::named(mode), workload);
    p.e2fsck = e2fsck;
    p.minimize_max = 2;
    p.max_states = max_states;
    p
}

/// Explore, and print the summary under `label`.
pub fn run(label: &str, p: &ExploreParams) -> Report {
    let r = explore(p).unwrap();
    println!("{label}: {}", r.summary(5));
    r
}

/// Some state was checked, e2fsck ran, and nothing failed: no
/// inconsistent state, no broken promise, no foreign data, no other
/// failure.
pub fn assert_clean(label: &str, r: &Report) {
    assert!(r.checked > 0, "{label}: no state checked");
    assert!(r.e2fsck_checked > 0, "{label}: e2fsck never ran");
    assert_eq!(r.inconsistent, 0, "{label}: {}", r.summary(5));
    assert_eq!(r.broken_promises, 0, "{label}: {}", r.summary(5));
    assert_eq!(r.foreign_data, 0, "{label}: {}", r.summary(5));
    assert!(r.failures.is_empty(), "{label}: {}", r.summary(5));
}
