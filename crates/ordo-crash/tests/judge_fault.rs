//! The kernel judge catches a broken replay that ordo's own checks can
//! miss: with `ORDO_FAULT=replay_drop_last` ordo's JBD2 recovery forgets
//! the newest committed transaction, leaving an older but consistent file
//! system. The kernel, recovering the same crash images, replays it, and
//! the judge reports the difference. (Their own test binary: the fault is
//! set in the environment of the whole process.)

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_fs::ProtocolKind;

/// The fault lives in the process environment: its tests run one at a time.
static FAULT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_replay_that_drops_the_last_transaction_is_caught_by_the_kernel_judge() {
    let _one = FAULT.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("ORDO_FAULT", "replay_drop_last");
    let mut p = ExploreParams::new(ProtocolKind::named("journal"), "seq1");
    p.e2fsck = E2fsckPolicy::Never;
    p.judge = JudgePolicy::Sample(1);
    p.minimize_max = 0;
    let r = explore(&p).unwrap();
    std::env::remove_var("ORDO_FAULT");
    println!("{}", r.summary(3));
    assert!(r.judged > 0);
    assert!(
        r.by_class["kernel_replay"] > 0,
        "the kernel judge missed the broken replay: {}",
        r.summary(3)
    );
    assert!(r.by_class["e2fsck_replay"] > 0, "{}", r.summary(3));
    let f = r
        .failures
        .iter()
        .find(|f| f.classes.iter().any(|c| c == "kernel_replay"))
        .unwrap();
    assert!(
        f.details
            .iter()
            .any(|d| d.contains("ordo") || d.contains("theirs")),
        "{f:?}"
    );
}

/// The fast-commit form: a replay that skips the bitmap frees of what the
/// log unmapped (`ORDO_FAULT=fc_replay_skip_frees`) leaves blocks in use
/// that the kernel's replay of the same crash images frees.
#[test]
fn a_fast_commit_replay_that_skips_its_frees_is_caught_by_the_kernel_judge() {
    // The two tests of this binary set different faults: one at a time.
    let _one = FAULT.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("ORDO_FAULT", "fc_replay_skip_frees");
    let mut p = ExploreParams::new(ProtocolKind::named("fast_commit"), "seq1");
    p.e2fsck = E2fsckPolicy::Never;
    p.judge = JudgePolicy::Sample(1);
    p.minimize_max = 0;
    let r = explore(&p).unwrap();
    std::env::remove_var("ORDO_FAULT");
    println!("{}", r.summary(3));
    assert!(
        r.by_class["kernel_replay"] > 0,
        "the kernel judge missed the broken fast-commit replay: {}",
        r.summary(3)
    );
}
