use super::*;

fn suite(only: &[&str], modes: &[&str]) -> Suite {
    Suite {
        scale: Scale::Smoke,
        seed: 11,
        only: only.iter().map(|s| s.to_string()).collect(),
        modes: modes.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn same_seed_same_figures() {
    let s = suite(&["table2", "fig5"], &["async", "softdep", "sched-chain"]);
    let a = s.run(|_| {}).unwrap();
    let b = s.run(|_| {}).unwrap();
    assert!(!a.is_empty());
    assert_eq!(a, b, "virtual time must not depend on the host");
}

#[test]
fn synchronous_writes_cost_what_delayed_ones_do_not() {
    let runs = suite(&["table2"], &["async", "sync"]).run(|_| {}).unwrap();
    let get = |name: &str| runs.iter().find(|r| r.scheme == name).unwrap();
    let (no_order, conv) = (get("No Order"), get("Conventional"));
    assert_eq!(no_order.files, conv.files);
    assert!(no_order.files > 0);
    // Conventional writes every removal's blocks, synchronously; No Order
    // leaves them to the syncer.
    assert!(
        conv.writes > 4 * no_order.writes.max(1),
        "{} vs {}",
        conv.writes,
        no_order.writes
    );
    assert!(
        conv.elapsed_s > 2.0 * no_order.elapsed_s,
        "{conv:?} vs {no_order:?}"
    );
    assert!(no_order.cpu_s > 0.0 && (no_order.cpu_s - conv.cpu_s).abs() < 1e-9);
    let text = report(&runs, &suite(&["table2"], &[]));
    assert!(text.contains("Table 2: 4-user remove"), "{text}");
    assert!(text.contains("Conventional"), "{text}");
}

#[test]
fn andrew_has_five_phases_and_compile_dominates() {
    let runs = suite(&["table3"], &["async"]).run(|_| {}).unwrap();
    let r = &runs[0];
    assert_eq!(r.phases_s.len(), 5);
    assert!(r.phases_s.iter().all(|p| *p > 0.0), "{:?}", r.phases_s);
    let total: f64 = r.phases_s.iter().sum();
    assert!((total - r.elapsed_s).abs() < 1e-6);
    assert!(r.phases_s[4] > r.phases_s[..4].iter().sum::<f64>());
}
