//! The kernel judge catches a broken replay that ordo's own checks can
//! miss: with `ORDO_FAULT=replay_drop_last` ordo's JBD2 recovery forgets
//! the newest committed transaction, leaving an older but consistent file
//! system. The kernel, recovering the same crash images, replays it, and
//! the judge reports the difference. (Its own test binary: the fault is
//! set in the environment of the whole process.)

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_fs::ProtocolKind;

#[test]
fn a_replay_that_drops_the_last_transaction_is_caught_by_the_kernel_judge() {
    std::env::set_var("ORDO_FAULT", "replay_drop_last");
    let mut p = ExploreParams::new(ProtocolKind::Journal, "seq1");
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
