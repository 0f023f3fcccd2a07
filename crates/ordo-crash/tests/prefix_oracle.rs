//! The prefix oracle ([`PrefixOfOperations`]) and OptFS's osync / dsync in
//! workloads: the oracle fails on protocols that do not keep a prefix of
//! the operations (while every other check passes there), it passes where
//! the recovered tree is always one of the model's, and osync / dsync
//! record (on the library and through FUSE) with the promises they make.

use std::sync::OnceLock;

use ordo_crash::explore::{explore, record_workload, E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_crash::oracle::{
    self, hooks_for, CheckParams, FailureClass, InvariantHook, PrefixOfOperations,
};
use ordo_crash::record::Promised;
use ordo_crash::states::all_states;
use ordo_crash::workload::{self, Op};
use ordo_fs::protocol::{Capabilities, ProtocolSpec};
use ordo_fs::{DataMode, ProtocolKind};
use rayon::prelude::*;

const HOOK: &str = "prefix-of-operations";

fn params(mode: ProtocolKind, data: DataMode, workload: &str) -> ExploreParams {
    let mut p = ExploreParams::new(mode, workload);
    p.data = data;
    p.e2fsck = E2fsckPolicy::Never;
    p.judge = JudgePolicy::Never;
    p.minimize_max = 2;
    p
}

fn scenario(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.scenario");
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap().to_string();
    (dir, p)
}

/// `journal` as a protocol that declares a prefix after a crash (run with
/// data=journal, where its one journal replays whole operations in order),
/// standing in for one that does: the explorer then adds the prefix hook
/// and OptFS's calls to the workloads on its own.
fn journal_declaring_a_prefix() -> ProtocolKind {
    static SPEC: OnceLock<ProtocolSpec> = OnceLock::new();
    let j = ProtocolKind::named("journal").spec();
    ProtocolKind::from_spec(SPEC.get_or_init(|| ProtocolSpec {
        name: "journal-prefix",
        summary: "journal, declaring a prefix after a crash (a test's)",
        variants: j.variants,
        mkfs_features: j.mkfs_features,
        caps: Capabilities {
            prefix_after_crash: true,
            ..j.caps
        },
        recover: j.recover,
        build: j.build,
    }))
}

/// What checking every state of `p`'s workload with the prefix hook forced
/// on found.
struct Found {
    states: usize,
    /// The hook's findings, with their state.
    hook: Vec<String>,
    /// States failing some other check (the hook does not run on those).
    other: usize,
}

fn check_with_prefix_hook(p: &ExploreParams) -> Found {
    let (_, recs) = record_workload(p, None).unwrap();
    let hooks: Vec<Box<dyn InvariantHook>> = vec![Box::new(PrefixOfOperations)];
    let check = CheckParams {
        mode: p.mode,
        data: p.data,
        e2fsck: false,
        judge: false,
    };
    let jobs: Vec<_> = recs
        .iter()
        .flat_map(|r| {
            all_states(&r.events, r.index, &p.states)
                .into_iter()
                .map(move |s| (r, s))
        })
        .collect();
    let results: Vec<_> = jobs
        .par_iter()
        .map(|(r, s)| oracle::check_state(r, s, &check, &hooks).0)
        .collect();
    let mut found = Found {
        states: jobs.len(),
        hook: Vec::new(),
        other: 0,
    };
    for ((r, s), f) in jobs.iter().zip(&results) {
        if f.iter().any(|x| x.class != FailureClass::Hook) {
            found.other += 1;
        }
        found.hook.extend(
            f.iter()
                .filter(|x| x.class == FailureClass::Hook)
                .map(|x| format!("{} point {}: {}", r.sequence.name, s.point, x.detail)),
        );
    }
    found
}

/// journal with data=ordered writes a file's data in place before the
/// commit that orders it after earlier operations: states whose every
/// promise holds and whose data is all the workload's are still no
/// operation's tree, and the prefix hook says so, naming the path.
#[test]
fn the_prefix_hook_fails_where_operations_are_not_kept_in_order() {
    let mode = ProtocolKind::named("journal");
    assert!(!mode.caps().prefix_after_crash);
    assert!(hooks_for(mode).iter().all(|h| h.name() != HOOK));

    let (_dir, path) = scenario(
        "preset\n---\nrename /A/bar /C/bar\nzero /foo 0 8192\nwrite /foo 8192 4096\nfsync /foo\n",
    );
    let found = check_with_prefix_hook(&params(mode, DataMode::Ordered, &path));
    for h in found.hook.iter().take(3) {
        println!("{h}");
    }
    assert!(
        !found.hook.is_empty(),
        "no state of {} flagged",
        found.states
    );
    assert!(found.hook.iter().all(|h| h.contains(HOOK)));
    assert!(found.hook.iter().any(|h| h.contains("/foo")));

    // Over seq-1 too, for journal (data=ordered) and async.
    for mode in ["journal", "async"] {
        let p = params(ProtocolKind::named(mode), DataMode::Ordered, "seq1");
        let found = check_with_prefix_hook(&p);
        println!(
            "{mode}: {} states, {} flagged by the hook, {} failing other checks",
            found.states,
            found.hook.len(),
            found.other
        );
        assert!(!found.hook.is_empty(), "{mode}: nothing flagged");
    }
}

/// journal with data=journal replays whole transactions of whole
/// operations in order: every state of seq-1, with OptFS's calls added,
/// is the model's tree after some operation, as the hook checks. (`sync`
/// is not: an unaligned append's new size reaches the disk before its
/// bytes, so it is not checked here.)
#[test]
fn the_prefix_hook_passes_where_every_state_is_a_prefix() {
    let mut p = params(ProtocolKind::named("journal"), DataMode::Journal, "seq1");
    p.workload_params.durability_calls = true;
    let found = check_with_prefix_hook(&p);
    println!("{} states", found.states);
    assert!(found.states > 1000, "only {} states", found.states);
    assert_eq!(found.other, 0);
    assert!(found.hook.is_empty(), "{}", found.hook.join("\n"));
}

/// A protocol whose capabilities declare a prefix gets the hook and
/// OptFS's calls in its workloads without asking; its states pass.
#[test]
fn a_prefix_protocol_gets_the_hook_and_the_calls() {
    let mode = journal_declaring_a_prefix();
    assert!(hooks_for(mode).iter().any(|h| h.name() == HOOK));
    let p = params(mode, DataMode::Journal, "seq1");
    let (wl, _) = record_workload(&p, Some(0)).unwrap();
    assert!(wl.sequences.len() > workload::seq1().len());
    assert!(wl
        .sequences
        .iter()
        .any(|s| s.ops.iter().any(|o| matches!(o, Op::Osync(_)))));
    // Every other protocol's seq-1 is what it was.
    let (wl, _) = record_workload(
        &params(ProtocolKind::named("journal"), DataMode::Journal, "seq1"),
        Some(0),
    )
    .unwrap();
    assert_eq!(wl.sequences, workload::seq1());

    let r = explore(&p).unwrap();
    println!("{}", r.summary(3));
    assert!(r.checked > 1000);
    assert_eq!(r.failures_total, 0, "{}", r.summary(3));
}

/// osync and dsync record on a protocol without them natively (both fall
/// back to fsync there): dsync makes fsync's promise, osync none; through
/// the library and through FUSE, the states are clean.
#[test]
fn osync_and_dsync_record_with_their_promises() {
    let (_dir, path) = scenario(
        "preset\n---\ncreat /A/new\nwrite /A/new 0 10000\nosync /A/new\nrename /A/new /C/new\n\
         osync /C\nappend /C/new 3000\ndsync /C/new\nmkdir /B/d\ndsync /B\n",
    );
    let fuse_ok = std::path::Path::new("/dev/fuse").exists()
        && std::process::Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok();
    for fuse in [false, true] {
        if fuse && !fuse_ok {
            eprintln!("FUSE skipped: no /dev/fuse or fusermount3");
            continue;
        }
        let mut p = params(ProtocolKind::named("journal"), DataMode::Ordered, &path);
        p.fuse = fuse;
        let (_, recs) = record_workload(&p, None).unwrap();
        let rec = &recs[0];
        let labels: Vec<&str> = rec.promises.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels.len(), 3, "{labels:?}");
        assert!(labels[1].starts_with("dsync /C/new (op 7)"), "{labels:?}");
        assert!(labels[2].starts_with("dsync /B (op 9)"), "{labels:?}");
        assert!(matches!(
            rec.promises[1].what,
            Promised::File {
                datasync: false,
                ..
            }
        ));
        assert!(matches!(rec.promises[2].what, Promised::Dir { .. }));
        let r = explore(&p).unwrap();
        println!("fuse {fuse}: {}", r.summary(3));
        assert!(r.checked > 0);
        assert_eq!(r.failures_total, 0, "{}", r.summary(3));
    }
}
