//! The second judge: the kernel's and e2fsck's recovery of the same crash
//! images agree with ordo's on the protocols whose log the kernel replays.
//! (That the judge can fail is `judge_fault.rs`.) Needs root, loop devices
//! and e2fsprogs, as the rest of the suite.

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_crash::workload::WorkloadParams;
use ordo_fs::{DataMode, ProtocolKind};

fn judged_run(mode: ProtocolKind, data: DataMode, seed: u64) -> ordo_crash::Report {
    let mut p = ExploreParams::new(mode, "mix");
    p.data = data;
    p.states.seed = seed;
    p.workload_params = WorkloadParams {
        seed,
        random_ops: 120,
        random_sequences: 2,
        ..WorkloadParams::default()
    };
    p.e2fsck = E2fsckPolicy::Never;
    p.judge = JudgePolicy::Sample(7);
    p.minimize_max = 0;
    let r = explore(&p).unwrap();
    println!("{}", r.summary(5));
    r
}

fn assert_agree(r: &ordo_crash::Report) {
    assert!(r.judged >= 20, "only {} states judged", r.judged);
    assert_eq!(r.by_class["kernel_replay"], 0, "{}", r.summary(5));
    assert_eq!(r.by_class["e2fsck_replay"], 0, "{}", r.summary(5));
    assert_eq!(r.failures_total, 0, "{}", r.summary(5));
}

#[test]
fn the_kernel_and_e2fsck_recover_journal_images_as_ordo_does() {
    for data in [DataMode::Ordered, DataMode::Journal] {
        assert_agree(&judged_run(ProtocolKind::named("journal"), data, 11));
    }
}

#[test]
fn the_kernel_and_e2fsck_recover_fast_commit_images_as_ordo_does() {
    assert_agree(&judged_run(
        ProtocolKind::named("fast_commit"),
        DataMode::Ordered,
        12,
    ));
}

#[test]
fn the_judge_does_not_apply_where_the_kernel_has_no_log_to_replay() {
    let r = judged_run(ProtocolKind::named("sync"), DataMode::Ordered, 13);
    assert_eq!(r.judged, 0);
}
