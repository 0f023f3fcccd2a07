//! The stream-prefix oracle ([`StreamPrefix`], ccfs's
//! `Capabilities::stream_prefix_after_crash`): the candidates it judges a
//! recovered tree against (per-stream prefixes, closed under relations,
//! bounded below by the returned promises), on hand-built sequences; and
//! end to end, with test-only protocols that declare the capability:
//! `journal` (data=journal), which orders everything in one journal, so
//! that every state is a prefix of each stream, passes on multi-stream
//! workloads; `async`, which orders nothing, fails it.

use std::sync::OnceLock;

use ordo_crash::explore::{explore, record_workload, E2fsckPolicy, ExploreParams, JudgePolicy};
use ordo_crash::model::{Listing, Tree};
use ordo_crash::oracle::{self, hooks_for, CheckParams, FailureClass, InvariantHook, StreamPrefix};
use ordo_crash::record::Promised;
use ordo_crash::states::all_states;
use ordo_crash::streams::{Candidates, Verdict, BOX_MAX};
use ordo_crash::workload::{self, parse_op, preset, Op, WorkloadParams};
use ordo_fs::protocol::{Capabilities, ProtocolSpec};
use ordo_fs::{DataMode, ProtocolKind};
use rayon::prelude::*;

const HOOK: &str = "stream-prefix";

/// `base` (a shipped protocol) declaring a prefix of each stream after a
/// crash: the explorer then adds the stream-prefix hook and streams to
/// the workloads on its own.
fn declaring_stream_prefix(base: &str) -> ProtocolKind {
    static JOURNAL: OnceLock<ProtocolSpec> = OnceLock::new();
    static ASYNC: OnceLock<ProtocolSpec> = OnceLock::new();
    let (cell, name, summary) = match base {
        "journal" => (
            &JOURNAL,
            "journal-streams",
            "journal, declaring a prefix of each stream after a crash (a test's)",
        ),
        "async" => (
            &ASYNC,
            "async-streams",
            "async, declaring a prefix of each stream after a crash (a test's)",
        ),
        other => panic!("no test protocol over {other}"),
    };
    let b = ProtocolKind::named(base).spec();
    ProtocolKind::from_spec(cell.get_or_init(|| ProtocolSpec {
        name,
        summary,
        variants: b.variants,
        mkfs_features: b.mkfs_features,
        caps: Capabilities {
            stream_prefix_after_crash: true,
            ..b.caps
        },
        recover: b.recover,
        build: b.build,
    }))
}

fn params(mode: ProtocolKind, data: DataMode, workload: &str) -> ExploreParams {
    let mut p = ExploreParams::new(mode, workload);
    p.data = data;
    p.e2fsck = E2fsckPolicy::Never;
    p.judge = JudgePolicy::Never;
    p.minimize_max = 2;
    p
}

fn ops(text: &str) -> Vec<Op> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| parse_op(l).unwrap())
        .collect()
}

/// The preset tree, as a setup leaves it.
fn base() -> (Tree, u32) {
    let mut t = Tree::new();
    let setup = preset();
    for (i, op) in setup.iter().enumerate() {
        t.apply(op, i as u32 + 1).unwrap();
    }
    (t, setup.len() as u32)
}

fn candidates(text: &str) -> Candidates {
    let (t, n) = base();
    Candidates::from_ops(t, n, &ops(text)).unwrap()
}

fn listing(c: &Candidates, t: &[u32]) -> Listing {
    c.listing(t).unwrap()
}

fn judge(c: &Candidates, recovered: &Listing, promises: &[usize], j: usize) -> Verdict {
    c.check_state(recovered, promises, j)
}

// Ops:           stream   tree op of its stream
//  1 setstream s1
//  2 write /A/foo         s1 #1
//  3 setstream s2
//  4 write /A/foo 4096    s2 #1   related to 2 (same file)
//  5 creat /C/x           s2 #2
//  6 setstream s1
//  7 mkdir /B/d           s1 #2
//  8 setstream s2
//  9 creat /B/d/f         s2 #3   related to 7 (under the new directory)
// 10 fsync /C/x           (s2)
// 11 setstream s1
// 12 streamsync           (s1)
// 13 append /A/bar        s1 #3
const SEQ: &str = "setstream s1\nwrite /A/foo 0 4096\nsetstream s2\nwrite /A/foo 4096 4096\n\
                   creat /C/x\nsetstream s1\nmkdir /B/d\nsetstream s2\ncreat /B/d/f\nfsync /C/x\n\
                   setstream s1\nstreamsync\nappend /A/bar 100\n";

#[test]
fn relations_are_the_same_node_the_same_entry_or_what_an_earlier_op_made() {
    let c = candidates(SEQ);
    let a = c.analysis();
    assert_eq!(a.names(), ["default", "s1", "s2"]);
    assert_eq!(a.stream_ops(0), [] as [usize; 0]);
    assert_eq!(a.stream_ops(1), [2, 7, 13]);
    assert_eq!(a.stream_ops(2), [4, 5, 9]);
    assert!(a.related(2, 4), "one file written by two streams");
    assert!(
        a.related(7, 9),
        "a file created in a directory another stream made"
    );
    assert!(!a.related(2, 5) && !a.related(4, 7) && !a.related(5, 13));
    assert!(
        !a.related(4, 2),
        "only an earlier operation is related to a later one"
    );
    assert!(!a.related(9, 10), "an fsync changes no tree");

    // Renames change entries, not the node they move: an entry made in a
    // directory another stream renamed is not related (ccfs relates a
    // directory's *creation* to the entries inside it), an attribute set
    // on the moved node neither; a file renamed over another relates to
    // both names.
    let r = candidates(
        "setstream s1\nrename /C /B/C2\nsetstream s2\ncreat /B/C2/in\ncreat /C3\n\
         setstream s1\nrename /A/bar /A/foo\nsetstream s2\ncreat /A/bar\nsetacl /B/C2 1000\n",
    );
    let a = r.analysis();
    assert!(
        !a.related(2, 4),
        "an entry in a directory another stream moved"
    );
    assert!(!a.related(2, 5));
    assert!(
        !a.related(2, 10),
        "an attribute of a node another stream moved"
    );
    assert!(
        a.related(7, 9),
        "the old name of a renamed file, made again"
    );

    // Hard links relate through either name.
    let l = candidates(
        "setstream s1\nlink /A/foo /C/l\nsetstream s2\nwrite /C/l 0 100\nwrite /A/foo 0 100\n",
    );
    assert!(l.analysis().related(2, 4) && l.analysis().related(2, 5));
}

#[test]
fn closure_rejects_a_later_op_without_the_related_earlier_one() {
    let c = candidates(SEQ);
    let a = c.analysis();
    // s2's write of /A/foo without s1's: not closed.
    assert!(!a.is_closed(&[0, 0, 1]));
    assert!(a.is_closed(&[0, 1, 1]));
    assert!(a.is_closed(&[0, 1, 0]), "the earlier one alone is fine");
    // s2's create in /B/d without s1's mkdir.
    assert!(!a.is_closed(&[0, 1, 3]));
    assert!(a.is_closed(&[0, 2, 3]));
    assert_eq!(a.close(&[0, 0, 3]), vec![0, 2, 3]);
    assert!(a.is_closed(a.prefix(13)));

    // The tree of s2's write alone is one the model can make, but it is
    // no valid candidate's: a crash state leaving it is rejected.
    let dropped = listing(&c, &[0, 0, 1]);
    for (lo, hi) in [
        (vec![0, 0, 0], a.prefix(13).clone()),
        (vec![0, 0, 0], vec![0, 3, 3]),
    ] {
        match c.check(&dropped, &lo, &hi, |_, _| None) {
            Verdict::Mismatch(m) => {
                assert!(m.contains("/A/foo"), "{m}");
                assert!(m.contains("s1 0..=") && m.contains("s2 0..=3"), "{m}");
            }
            v => panic!("{v:?}"),
        }
    }
    // With the related earlier write it is a candidate; so is s1's mkdir
    // as well, without s2's create of /C/x, which is not the model's tree
    // after any operation.
    assert_eq!(
        judge(&c, &listing(&c, &[0, 1, 1]), &[], 13),
        Verdict::Match(vec![0, 1, 1])
    );
    let kept = listing(&c, &[0, 2, 1]);
    assert!((0..=13).all(|k| !c.snapshot_listing(k).same(&kept)));
    assert_eq!(judge(&c, &kept, &[], 13), Verdict::Match(vec![0, 2, 1]));
    // Not while op 7 is not yet issued; the op in flight may be in or out.
    assert!(matches!(judge(&c, &kept, &[], 6), Verdict::Mismatch(_)));
    assert_eq!(judge(&c, &kept, &[], 7), Verdict::Match(vec![0, 2, 1]));
    assert_eq!(
        judge(&c, c.snapshot_listing(2), &[], 4),
        Verdict::Match(vec![0, 1, 0])
    );
    // Every snapshot is a candidate from the operation that made it on.
    for k in 0..=13 {
        assert!(
            matches!(judge(&c, c.snapshot_listing(k), &[], k), Verdict::Match(_)),
            "snapshot {k}"
        );
    }
}

#[test]
fn returned_promises_are_lower_bounds() {
    let c = candidates(SEQ);
    let a = c.analysis();
    // fsync /C/x by s2: s2's operations before it, closed (s2's write of
    // /A/foo needs s1's, its create in /B/d the mkdir).
    assert_eq!(a.required_by(10), vec![0, 0, 3]);
    assert_eq!(a.lower_bound(&[10]), vec![0, 2, 3]);
    // streamsync of s1: s1's operations before it, nothing of s2's.
    assert_eq!(a.required_by(12), vec![0, 2, 0]);
    assert_eq!(a.lower_bound(&[12]), vec![0, 2, 0]);
    // Operations that promise nothing, and the base, require nothing.
    assert_eq!(a.lower_bound(&[0, 1, 2]), vec![0, 0, 0]);

    // s1's write alone: a candidate until the fsync returned.
    let early = listing(&c, &[0, 1, 0]);
    assert_eq!(judge(&c, &early, &[], 12), Verdict::Match(vec![0, 1, 0]));
    match judge(&c, &early, &[10], 12) {
        Verdict::Mismatch(m) => assert!(m.contains("s1 2, s2 3"), "{m}"),
        v => panic!("{v:?}"),
    }
    // After both promises, s1's append may be lost, nothing else.
    let c_all = listing(&c, &[0, 2, 3]);
    assert_eq!(
        judge(&c, &c_all, &[10, 12], 13),
        Verdict::Match(vec![0, 2, 3])
    );
    assert!(matches!(
        judge(&c, &listing(&c, &[0, 2, 2]), &[10, 12], 13),
        Verdict::Mismatch(_)
    ));

    // An fsync covers what other streams did to its path before it: the
    // data of another stream's write, an entry another stream added to an
    // fsynced directory; not what they did elsewhere.
    let f = candidates(
        "setstream s1\nwrite /A/foo 0 4096\ncreat /C/y\nwrite /foo 0 10\nsetstream s2\n\
         fsync /A/foo\nfsync /C\nsync\n",
    );
    let a = f.analysis();
    assert_eq!(a.required_by(6), vec![0, 1, 0]);
    assert_eq!(a.required_by(7), vec![0, 2, 0]);
    assert_eq!(a.required_by(8), vec![0, 3, 0]);
    // fdatasync and dsync as fsync.
    let d = candidates("write /foo 0 10\nsetstream s1\nfdatasync /foo\ndsync /A\n");
    assert_eq!(d.analysis().required_by(3), vec![1, 0]);
    assert_eq!(d.analysis().required_by(4), vec![0, 0]);
}

/// ccfs+: an fsync or fdatasync in a stream with IGNORE_FSYNC on bounds
/// nothing (it only ordered); one after the flag is off again, another
/// stream's, a streamsync and a dsync still do.
#[test]
fn fsyncs_under_ignore_fsync_bound_nothing() {
    let c = candidates(
        "setstream s1\nignorefsync on\nwrite /A/foo 0 4096\nfsync /A/foo\nfdatasync /A/foo\n\
         setstream s2\ncreat /C/x\nfsync /C/x\nsetstream s1\nstreamsync\nignorefsync off\n\
         append /A/foo 10\nfsync /A/foo\ndsync /A/foo\n",
    );
    let a = c.analysis();
    // Ops 4 and 5: s1's fsync and fdatasync under the flag.
    assert_eq!(a.required_by(4), vec![0, 0, 0]);
    assert_eq!(a.required_by(5), vec![0, 0, 0]);
    // s2 never set it: its fsync holds.
    assert_eq!(a.required_by(8), vec![0, 0, 1]);
    // s1's streamsync holds under the flag; its fsync after the flag is
    // off again holds too, as does a dsync.
    assert_eq!(a.required_by(10), vec![0, 1, 0]);
    assert_eq!(a.required_by(13), vec![0, 2, 0]);
    assert_eq!(a.required_by(14), vec![0, 2, 0]);
    // The write may be lost although an fsync of it returned.
    let lost = listing(&c, &[0, 0, 1]);
    assert_eq!(
        judge(&c, &lost, &[4, 5, 8], 9),
        Verdict::Match(vec![0, 0, 1])
    );
    assert!(matches!(judge(&c, &lost, &[10], 11), Verdict::Mismatch(_)));
    // The scenario form reads back.
    assert_eq!(parse_op("ignorefsync on").unwrap(), Op::IgnoreFsync(true));
    assert_eq!(Op::IgnoreFsync(false).to_string(), "ignorefsync off");
    assert!(parse_op("ignorefsync maybe").is_err());
}

#[test]
fn many_unrelated_operations_are_too_many_to_judge() {
    // Three streams of 30 writes each to files of their own, no promise:
    // 31^3 candidate tuples.
    let mut text = String::new();
    for k in 0..30 {
        for (s, file) in [("s1", "/A/foo"), ("s2", "/A/bar"), ("s3", "/foo")] {
            text += &format!("setstream {s}\nwrite {file} {} 10\n", k * 10);
        }
    }
    let c = candidates(&text);
    let hi = c.analysis().prefix(180).clone();
    assert_eq!(hi, vec![0, 30, 30, 30]);
    let odd = listing(&c, &[0, 30, 0, 1]);
    assert!(31u64.pow(3) > BOX_MAX);
    assert_eq!(judge(&c, &odd, &[], 180), Verdict::TooMany(31u64.pow(3)));
    // A sync in the middle bounds it.
    let mut with_sync = ops(&text);
    with_sync.insert(150, Op::Sync);
    let (t, n) = base();
    let c = Candidates::from_ops(t, n, &with_sync).unwrap();
    assert!(matches!(
        c.check_state(&odd, &[151], 181),
        Verdict::Mismatch(_)
    ));
    let tail = c.listing(&[0, 30, 26, 30]).unwrap();
    assert_eq!(
        c.check_state(&tail, &[151], 181),
        Verdict::Match(vec![0, 30, 26, 30])
    );
}

/// What checking every state of `p`'s workload with the stream hook
/// forced on found.
struct Found {
    states: usize,
    hook: Vec<String>,
    other: usize,
}

fn check_with_stream_hook(p: &ExploreParams) -> Found {
    let (_, recs) = record_workload(p, None).unwrap();
    let hooks: Vec<Box<dyn InvariantHook>> = vec![Box::new(StreamPrefix)];
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

fn streams_used(seq: &workload::Sequence) -> usize {
    let mut names = std::collections::HashSet::from(["default".to_string()]);
    for op in &seq.ops {
        if let Op::SetStream(n) = op {
            names.insert(n.clone());
        }
    }
    names.len()
}

/// journal with data=journal commits whole operations in order in one
/// journal, so every state is a prefix of the whole sequence, hence of
/// each stream: with the capability declared it gets the hook and streams
/// in its workloads, and passes (random workloads of 2 or 3 streams, the
/// stream scenarios, seq-2 pairs in two streams).
#[test]
fn journal_declaring_stream_prefixes_passes() {
    let mode = declaring_stream_prefix("journal");
    assert!(hooks_for(mode).iter().any(|h| h.name() == HOOK));
    assert!(hooks_for(ProtocolKind::named("journal"))
        .iter()
        .all(|h| h.name() != HOOK));

    for workload in ["random", "mix"] {
        let mut p = params(mode, DataMode::Journal, workload);
        p.workload_params = WorkloadParams {
            random_ops: 60,
            random_sequences: 6,
            ..WorkloadParams::default()
        };
        let (wl, recs) = record_workload(&p, None).unwrap();
        assert!(wl.sequences.iter().all(|s| streams_used(s) >= 2));
        assert!(wl.sequences.iter().any(|s| streams_used(s) == 3));
        assert!(wl.sequences.iter().any(|s| s.ops.contains(&Op::Streamsync)));
        // Streamsyncs after other streams' changes promise their stream.
        assert!(recs
            .iter()
            .flat_map(|r| &r.promises)
            .any(|p| matches!(p.what, Promised::Stream { .. })));
        let r = explore(&p).unwrap();
        println!("{workload}: {}", r.summary(3));
        assert!(r.checked > 200, "{}", r.summary(3));
        assert_eq!(r.failures_total, 0, "{}", r.summary(3));
    }

    let r = explore(&params(mode, DataMode::Journal, "streams")).unwrap();
    println!("streams: {}", r.summary(3));
    assert!(r.sequences >= 6 && r.checked > 50);
    assert_eq!(r.failures_total, 0, "{}", r.summary(3));

    let mut p = params(mode, DataMode::Journal, "seq2");
    p.workload_params.seq2_max = 120;
    let (wl, _) = record_workload(&p, Some(0)).unwrap();
    assert_eq!(wl.sequences.len(), 120);
    assert_eq!(
        wl.sequences
            .iter()
            .filter(|s| s.name.ends_with("@s1,s2"))
            .count(),
        60
    );
    let r = explore(&p).unwrap();
    println!("seq2: {}", r.summary(3));
    assert_eq!(r.failures_total, 0, "{}", r.summary(3));
}

/// async orders nothing: the stream-prefix hook finds states that are no
/// per-stream prefix, naming the closest candidates, on the stream
/// scenarios and on seq-2 pairs in two streams.
#[test]
fn async_declaring_stream_prefixes_fails_the_hook() {
    let mode = declaring_stream_prefix("async");
    assert!(hooks_for(mode).iter().any(|h| h.name() == HOOK));
    for workload in ["streams", "seq2"] {
        let mut p = params(mode, DataMode::Ordered, workload);
        p.workload_params.seq2_max = 80;
        let found = check_with_stream_hook(&p);
        println!(
            "{workload}: {} states, {} flagged by the hook, {} failing other checks",
            found.states,
            found.hook.len(),
            found.other
        );
        for h in found.hook.iter().take(3) {
            println!("  {h}");
        }
        assert!(!found.hook.is_empty(), "{workload}: nothing flagged");
        assert!(found.hook.iter().all(|h| h.contains("closest [")));
    }
    // States the hook accepts that are no prefix of the whole sequence:
    // the trees of candidates that keep a later stream's operations
    // without an earlier one's, built from the model, equal what async
    // left on disk.
    let p = params(mode, DataMode::Ordered, "streams");
    let (_, recs) = record_workload(&p, None).unwrap();
    let hooks = hooks_for(mode);
    let check = CheckParams {
        mode,
        data: DataMode::Ordered,
        e2fsck: false,
        judge: false,
    };
    let mut reordered = Vec::new();
    for r in &recs {
        let cands = r.stream_candidates();
        for s in all_states(&r.events, r.index, &p.states) {
            let (f, image) = oracle::check_state(r, &s, &check, &hooks);
            if !f.is_empty() {
                continue;
            }
            let fs = ordo_crash::backend::mount(image, mode, DataMode::Ordered, true).unwrap();
            let l = oracle::tree_listing(&fs).unwrap();
            let j = s.op_in_flight(&r.events);
            let a = cands.analysis();
            match cands.check(&l, &vec![0; a.names().len()], a.prefix(j), |_, _| None) {
                Verdict::Match(t) if (0..=j).all(|k| a.prefix(k) != &t) => {
                    reordered.push((r.sequence.name.clone(), a.included(&t), a.describe(&t)))
                }
                Verdict::Match(_) => {}
                v => panic!("{}: passed the hook, yet {v:?}", r.sequence.name),
            }
        }
    }
    println!(
        "{} states kept a per-stream prefix that is no global one",
        reordered.len()
    );
    for (name, _, t) in reordered.iter().take(5) {
        println!("  {name} {t}");
    }
    // Among them s2's new file with its data, without s1's earlier new
    // file: the model gives the later file the node (and so the bytes)
    // it had in the whole run.
    assert!(
        reordered
            .iter()
            .any(|(name, ops, _)| name == "streams/independent"
                && ops.contains(&5)
                && ops.contains(&6)
                && !ops.contains(&2)),
        "{reordered:?}"
    );
    // Through explore, with the hook added on its own.
    let r = explore(&params(mode, DataMode::Ordered, "streams")).unwrap();
    println!("{}", r.summary(2));
    assert!(
        r.by_class.get("hook").copied().unwrap_or(0) > 0,
        "{}",
        r.summary(2)
    );
}

/// A workload that moves to a stream can not be recorded through FUSE
/// (streams there are the requesting process's): it is refused, not
/// recorded in one stream.
#[test]
fn fuse_refuses_streams() {
    let mut p = params(ProtocolKind::named("journal"), DataMode::Ordered, "streams");
    p.fuse = true;
    let e = record_workload(&p, Some(0)).err().expect("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("by process") && msg.contains("setstream s1"),
        "{msg}"
    );
}

/// Streams on a protocol without them: setstream and streamsync run
/// (streamsync is a sync there), streamsync's promise is recorded (the
/// whole tree when only its stream changed anything), and every state is
/// clean.
#[test]
fn streams_record_on_a_protocol_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.scenario");
    std::fs::write(
        &path,
        "preset\n---\nsetstream s1\ncreat /A/x\nstreamsync\nsetstream s2\nwrite /A/x 0 5000\n\
         setstream s1\nappend /A/foo 100\nstreamsync\nsetstream default\nsync\n",
    )
    .unwrap();
    let p = params(
        ProtocolKind::named("journal"),
        DataMode::Ordered,
        path.to_str().unwrap(),
    );
    let (_, recs) = record_workload(&p, None).unwrap();
    let pr = &recs[0].promises;
    assert_eq!(pr.len(), 4, "{pr:?}");
    assert_eq!(pr[1].what, Promised::All);
    assert!(pr[1].label.contains("stream s1"), "{}", pr[1].label);
    assert_eq!(
        pr[2].what,
        Promised::Stream {
            stream: "s1".into()
        }
    );
    assert_eq!(pr[3].what, Promised::All);
    let r = explore(&p).unwrap();
    assert!(r.checked > 0);
    assert_eq!(r.failures_total, 0, "{}", r.summary(3));
}

/// An operation reaches nodes, not paths: an entry made by one stream in
/// a directory another stream renamed is in a candidate without the
/// rename, at the directory's old path; a write through a renamed name
/// likewise. A file made inside a directory another stream made is never
/// in without the mkdir (the model has no node to put it in).
#[test]
fn operations_apply_to_nodes_without_the_renames_before_them() {
    let c = candidates(
        "setstream s1\nrename /C /B/C2\nrename /A/foo /A/moved\nsetstream s2\n\
         creat /B/C2/in\nwrite /A/moved 0 100\n",
    );
    let a = c.analysis();
    assert_eq!(a.names(), ["default", "s1", "s2"]);
    assert!(a.is_closed(&[0, 0, 2]), "unrelated to the renames");
    let t = c.tree(&[0, 0, 2]).unwrap();
    assert!(t.resolve("/C/in").is_some(), "made in /C, not renamed yet");
    assert!(t.resolve("/B/C2").is_none());
    let bytes = |t: &Tree| {
        let foo = t.resolve("/A/foo").expect("foo, not renamed yet");
        t.node(foo).and_then(|n| n.content()).unwrap().clone()
    };
    let before = c.tree(&[0, 0, 1]).unwrap();
    assert_ne!(
        bytes(&t),
        bytes(&before),
        "the write reached the node by its old name"
    );

    let m = candidates("setstream s1\nmkdir /B/new\nsetstream s2\ncreat /B/new/f\n");
    let a = m.analysis();
    assert!(a.related(2, 4));
    assert!(!a.is_closed(&[0, 0, 1]));
    assert!(m.tree(&[0, 0, 1]).is_err(), "no directory to make it in");
}
