//! The crash explorer on `mode=backpointers` (NoFS): with no recovery
//! pass, the scanners, then the NoFS property on every state (names
//! resolve or are refused, every block read is that file's data or EIO,
//! promises hold, nothing is allocated twice once the disk is filled, a
//! clean unmount leaves a clean image; `docs/CRASH.md`, section 4c) on
//! seq-1 and Table 3's dropped writes (e2fsck on every state), seq-2 and
//! random; the three deliberately broken variants are caught. The faults
//! are read when the protocol is built, so the test that sets them holds
//! [`ENV`] while it runs, as does the one that needs them unset. And the
//! property can fail: `async`, which promises nothing after a crash, does
//! not pass it.

mod protocol_common;

use std::sync::Mutex;

use ordo_crash::explore::{record_workload, E2fsckPolicy};
use ordo_crash::oracle::{CheckParams, FailureClass};
use ordo_crash::report::Report;
use ordo_crash::states;
use ordo_fs::{DataMode, ProtocolKind};
use protocol_common::{assert_clean, params};

/// `ORDO_FAULT` is process-wide: held by the tests that build
/// `mode=backpointers`.
static ENV: Mutex<()> = Mutex::new(());

fn run(workload: &str, max_states: Option<usize>, e2fsck: E2fsckPolicy) -> Report {
    let mut p = params("backpointers", workload, max_states, e2fsck);
    p.workload_params.random_sequences = 8;
    protocol_common::run(workload, &p)
}

#[test]
fn nofs_keeps_data_consistent() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("ORDO_FAULT");
    let mut total = 0;
    // Filling the disk (step 5) is most of a state's cost: on every state
    // of seq-1 and Table 3, on one in four of seq-2 and random.
    for (w, max, e2fsck, min, fill) in [
        ("seq1", None, E2fsckPolicy::Every, 500, "1"),
        ("nofs-table3", None, E2fsckPolicy::Every, 500, "1"),
        ("seq2", Some(4_000), E2fsckPolicy::Sample(50), 4_000, "4"),
        ("random", Some(4_000), E2fsckPolicy::Sample(50), 4_000, "4"),
    ] {
        std::env::set_var("ORDO_NOFS_FILL_EVERY", fill);
        let r = run(w, max, e2fsck);
        std::env::remove_var("ORDO_NOFS_FILL_EVERY");
        assert_clean(w, &r);
        assert!(r.checked >= min, "{w}: only {} states checked", r.checked);
        total += r.checked;
    }
    // Tree nodes going home before their pointers put fewer writes in
    // flight at once, so seq-1 and Table 3 have fewer states than before.
    assert!(total >= 9_500, "only {total} states checked");
}

/// Four block groups (`--blocks-per-group 1024`): a directory made after
/// the last sync goes to a group whose descriptor on disk still says
/// `INODE_UNINIT`, and a file fsynced under it must survive the scan
/// (the scanner once skipped such a group, and the name walk then
/// dropped the directory with the fsynced file under it: five states of
/// the scenario broke their promise). Random operations on the same
/// image too, from an empty base, so that top-level directories spread.
#[test]
fn nofs_on_four_groups() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("ORDO_FAULT");
    for (w, max, min, fill) in [
        ("tests/scenarios/nofs-fresh-group.scenario", None, 200, "1"),
        ("random", Some(1_500), 1_500, "4"),
    ] {
        std::env::set_var("ORDO_NOFS_FILL_EVERY", fill);
        let mut p = params("backpointers", w, max, E2fsckPolicy::Sample(10));
        p.workload_params.random_sequences = 4;
        p.image.blocks_per_group = Some(1024);
        let r = protocol_common::run(w, &p);
        std::env::remove_var("ORDO_NOFS_FILL_EVERY");
        assert_clean(w, &r);
        assert!(r.checked >= min, "{w}: only {} states checked", r.checked);
    }
}

/// Eight cases the random soak found, as scenarios: an unlink and a create
/// of one name whose entries land in different directory blocks (a crash
/// can leave both: the scanners keep one); an attribute block freed by one
/// file and taken by the next whose pointer reaches the disk before its
/// new contents (the owner mark tells the earlier file's attributes apart;
/// without the check the explorer sees them); a durable file renamed into
/// a new directory, of which only the file's backlink reached the disk
/// (relinked where it was named, or into lost+found, not reclaimed); two
/// files whose extent trees both grew a level, of which only the inodes
/// reached the disk (both maps rebuilt from the owner records; one's new
/// tree block is not the other's data); a collapse and an insert range
/// in flight whose inode reached the disk and not its new tree (the map
/// is rebuilt from records that must all be the old tree's: fault
/// `nofs_moves_unheld` breaks that, `the_broken_variants_are_caught`); a
/// tree that grows a level again into the block of its own older node,
/// whose checksum (same inode, same generation) holds: the new node goes
/// home before the inode's pointer to it, or a crash brings the old map
/// back (fault `nofs_tree_unordered`), also when the pointer goes home
/// with the fsync of another file whose inode shares the block; an insert
/// and a collapse range whose new map reached the disk and not the moved
/// records, moving a block every version agrees on: it must read through
/// either map (fault `nofs_moves_exact`).
#[test]
fn the_soaks_cases_pass_and_the_stale_attribute_block_is_caught() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("ORDO_FAULT");
    std::env::set_var("ORDO_NOFS_FILL_EVERY", "1");
    // The shifts' scenarios are one operation: few states, every one of
    // them checked.
    for (w, min) in [
        ("tests/scenarios/nofs-dup-name.scenario", 30),
        ("tests/scenarios/nofs-stale-xattr.scenario", 20),
        ("tests/scenarios/nofs-rename-lost-dir.scenario", 30),
        ("tests/scenarios/nofs-two-lost-trees.scenario", 30),
        ("tests/scenarios/nofs-collapse-lost-tree.scenario", 8),
        ("tests/scenarios/nofs-insert-lost-tree.scenario", 8),
        ("tests/scenarios/nofs-tree-regrow.scenario", 10),
        ("tests/scenarios/nofs-tree-regrow-neighbour.scenario", 10),
        ("tests/scenarios/nofs-shift-moving.scenario", 30),
        ("tests/scenarios/nofs-collapse-moving.scenario", 30),
        ("tests/scenarios/nofs-xattr-reuse.scenario", 15),
        ("tests/scenarios/nofs-attr-then-data.scenario", 15),
        ("tests/scenarios/nofs-zero-write.scenario", 30),
    ] {
        let r = run(w, None, E2fsckPolicy::Every);
        assert_clean(w, &r);
        assert!(r.checked >= min, "{w}: only {} states checked", r.checked);
    }
    // A new attribute block now goes home before its inode, which alone
    // keeps the earlier file's block from showing in this scenario: the
    // missing owner check is shown with the old order beside it.
    std::env::set_var("ORDO_FAULT", "nofs_no_owner_check,nofs_tree_unordered");
    let r = run(
        "tests/scenarios/nofs-stale-xattr.scenario",
        None,
        E2fsckPolicy::Never,
    );
    std::env::remove_var("ORDO_FAULT");
    std::env::remove_var("ORDO_NOFS_FILL_EVERY");
    assert!(
        r.by_class.get("broken_promise").copied().unwrap_or(0) > 0,
        "without the owner check the earlier file's attributes must show:\n{}",
        r.summary(5)
    );
}

/// The seeds of `mix --random-ops 400` whose soaks found NoFS bugs:
/// seed 0's two files whose trees both grew a level and were both lost
/// (one file's rebuilt tree must not take the other's data block), seed
/// 5's file whose tree was lost while the unlink that freed its blocks was
/// in flight (the table on disk gives it no block: its size goes to 0, not
/// to zeros it never held), and seed 15's orphans linked back into a full
/// directory (its new block must not be a live directory's whose bit the
/// bitmap on disk did not have yet). A state is named by the writes of the
/// code that found it, and every change to what the protocol writes moved
/// these (the last, tree nodes going home before their pointers, removed
/// the states of a lost tree altogether), so the seeds are sampled whole
/// instead; the classes have library tests of their own
/// (`backpointers_protocol.rs`), and seed 15 alone is 96,970 states, all
/// of them passing (docs/CRASH.md, section 9).
#[test]
fn the_soaks_seeds_pass() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("ORDO_FAULT");
    std::env::set_var("ORDO_NOFS_FILL_EVERY", "32");
    for seed in [0, 5, 15] {
        let mut p = params("backpointers", "mix", Some(1_500), E2fsckPolicy::Sample(50));
        p.states.seed = seed;
        p.workload_params.seed = seed;
        p.workload_params.random_ops = 400;
        let r = protocol_common::run(&format!("mix seed {seed}"), &p);
        assert_eq!(r.checked, 1_500, "mix seed {seed}: {}", r.summary(5));
        assert_clean(&format!("mix seed {seed}"), &r);
    }
    std::env::remove_var("ORDO_NOFS_FILL_EVERY");
}

/// No generation in the owner records: a reused inode number's stale
/// block is taken for the new file's. No owner check: a pointer whose
/// block never reached the disk shows what the block held. Unvalidated
/// allocation: the bitmaps on disk are trusted after a crash, and a block
/// or inode in use is handed out again. Each workload in turn until one
/// fails.
#[test]
fn the_broken_variants_are_caught() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    // A block is reused only once its free is durable, so a pointer left
    // by a crash meets another file's bytes only after a sync: random
    // workloads have them.
    for (fault, workloads) in [
        ("nofs_no_generation", &["nofs-table3", "random"][..]),
        ("nofs_no_owner_check", &["random", "nofs-table3"]),
        ("nofs_unvalidated_alloc", &["nofs-table3", "seq1"]),
        (
            // The tree's order alone now keeps a crash from losing the
            // new tree under the inode, the state this fault broke: it is
            // shown with the old order beside it.
            "nofs_moves_unheld,nofs_tree_unordered",
            &[
                "tests/scenarios/nofs-collapse-lost-tree.scenario",
                "tests/scenarios/nofs-insert-lost-tree.scenario",
            ],
        ),
        (
            "nofs_tree_unordered",
            &[
                "tests/scenarios/nofs-tree-regrow.scenario",
                "tests/scenarios/nofs-tree-regrow-neighbour.scenario",
            ],
        ),
        (
            // An attribute block taken again by the file that freed it
            // carries the same owner mark before and after: the inode that
            // names it again must not reach the disk ahead of its new
            // contents (found by the one-group soak, seed 9005).
            "nofs_tree_unordered",
            &["tests/scenarios/nofs-xattr-reuse.scenario"],
        ),
        (
            // A shift's held records as the old tree's exact ones: a crash
            // that keeps the new map and not the moved records fails the
            // check of a block every version of the file agrees on.
            "nofs_moves_exact",
            &[
                "tests/scenarios/nofs-shift-moving.scenario",
                "tests/scenarios/nofs-collapse-moving.scenario",
            ],
        ),
    ] {
        std::env::set_var("ORDO_FAULT", fault);
        // A thousand states of a workload are enough: the weakest catch,
        // `nofs_no_owner_check` on `random`, failed 161 of 3,000.
        let caught = workloads
            .iter()
            .find(|w| run(w, Some(1_000), E2fsckPolicy::Never).failures_total > 0);
        std::env::remove_var("ORDO_FAULT");
        assert!(
            caught.is_some(),
            "{fault}: the broken variant must fail some state of {workloads:?}"
        );
        println!("{fault}: caught on {}", caught.unwrap());
    }
}

/// The property can fail: on `async` crash states (no ordering, no
/// scanners, no owner records) the NoFS check finds blocks or inodes
/// allocated twice once the disk is filled, and images a clean unmount
/// leaves unclean.
#[test]
fn async_does_not_pass_the_nofs_property() {
    let mut p = params("async", "seq1", None, E2fsckPolicy::Never);
    p.states.max_states_per_point = 16;
    let (_, recs) = record_workload(&p, None).unwrap();
    let check = CheckParams {
        mode: ProtocolKind::named("async"),
        data: DataMode::Ordered,
        e2fsck: false,
        judge: false,
    };
    let (mut checked, mut failed, mut twice) = (0, 0, 0);
    let mut classes = std::collections::BTreeMap::<&str, usize>::new();
    for rec in &recs {
        // Every 7th state: enough to meet the failures, quickly.
        for spec in states::all_states(&rec.events, rec.index, &p.states)
            .into_iter()
            .step_by(7)
        {
            let (f, _, _) = ordo_crash::nofs::check_state(rec, &spec, &check);
            checked += 1;
            if !f.is_empty() {
                failed += 1;
            }
            if f.iter().any(|x| x.detail.starts_with("nofs-allocation")) {
                twice += 1;
            }
            for x in &f {
                *classes.entry(x.class.name()).or_default() += 1;
            }
        }
    }
    println!(
        "async under the NoFS property: {failed} of {checked} states fail \
         ({twice} with something allocated twice): {classes:?}"
    );
    assert!(checked > 100, "only {checked} states checked");
    assert!(twice > 0, "async never allocates twice: {classes:?}");
    assert!(
        classes.contains_key(FailureClass::Recovery.name()),
        "async always leaves a clean image: {classes:?}"
    );
}
