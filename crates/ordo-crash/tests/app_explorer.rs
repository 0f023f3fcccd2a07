//! Application crash checking end to end: real SQLite, git, LevelDB and an
//! editor's atomic save on a FUSE mount of ordo over the recording device,
//! every crash state (a bounded sample) recovered and judged by the
//! application's checker.
//!
//! Needs root, /dev/fuse, /usr/bin/python3 with plyvel, git and e2fsprogs
//! (`scripts/deps.sh` installs them). Outside CI a machine without FUSE
//! skips; in CI (`CI=true`) a missing piece fails.

mod fuse_common;

use ordo_crash::app::explore::{explore_app, merge, AppParams, AppReport, Target};
use ordo_crash::app::script::App;
use ordo_fs::{DataMode, ProtocolKind};

fn ordo(mode: &str, data: DataMode) -> Target {
    Target::Ordo {
        mode: ProtocolKind::named(mode),
        data,
        osync: false,
    }
}

fn run(app: App, target: Target, max_states: usize) -> AppReport {
    let mut p = AppParams::new(app, target);
    p.max_states = Some(max_states);
    p.jobs = 2;
    let r = explore_app(&p).unwrap_or_else(|e| panic!("{app} on {target}: {e}"));
    println!("{}", r.summary(5));
    assert_eq!(r.old_state + r.new_state, r.consistent);
    r
}

/// The checkers can fail end to end: on `async` (no ordering, no replay)
/// crash states exist in which an application finds less than it was
/// promised or a broken store, and each is reported as a distinct
/// vulnerability with a command that rebuilds it.
#[test]
fn async_breaks_applications() {
    if !fuse_common::fuse_available() {
        return;
    }
    let mut found = 0;
    for app in [App::Editor, App::SqliteRollback, App::Git] {
        let r = run(app, ordo("async", DataMode::Ordered), 200);
        assert!(r.checked > 0);
        assert!(r.writes > 0, "{app}: the workload reached the disk");
        assert!(r.marks as u32 > 1, "{app}: the workload marked its steps");
        if r.inconsistent() > 0 {
            assert!(!r.vulnerabilities.is_empty());
            let v = &r.vulnerabilities[0];
            assert!(v.reproduce.contains("--state "), "{}", v.reproduce);
            assert_eq!(
                r.vulnerabilities.iter().map(|v| v.states).sum::<u64>(),
                r.inconsistent()
            );
        }
        found += r.inconsistent();
    }
    assert!(found > 0, "async must lose an application's data somewhere");
}

/// The bounded CI run: on `journal` with data=journal, SQLite in both
/// journal modes and git are consistent in every state checked; a few
/// hundred states in all.
#[test]
fn journal_data_journal_keeps_sqlite_and_git_consistent() {
    if !fuse_common::fuse_available() {
        return;
    }
    let mut checked = 0;
    for app in [App::SqliteRollback, App::SqliteWal, App::Git] {
        let r = run(app, ordo("journal", DataMode::Journal), 150);
        assert!(r.writes > 0 && r.flushes > 0);
        assert!(r.checked > 10, "{app}: {} states", r.checked);
        assert_eq!(r.consistent, r.checked, "{}", r.summary(5));
        assert!(r.vulnerabilities.is_empty());
        checked += r.checked;
    }
    assert!(checked >= 100, "{checked} states");
}

/// Shards of one run merge into the run: the same states, the same
/// counts.
#[test]
fn shards_merge_into_the_whole() {
    if !fuse_common::fuse_available() {
        return;
    }
    let target = ordo("async", DataMode::Ordered);
    let mut whole = AppParams::new(App::Editor, target);
    whole.jobs = 2;
    let w = explore_app(&whole).unwrap();
    let mut parts = Vec::new();
    for i in 0..2 {
        let mut p = whole.clone();
        p.shard = Some((i, 2));
        parts.push(explore_app(&p).unwrap());
    }
    let m = merge(&parts).unwrap();
    assert_eq!(m.checked, w.checked);
    assert_eq!(m.consistent, w.consistent);
    assert_eq!(m.states_total, w.states_total);
    let names = |r: &AppReport| {
        let mut v: Vec<(String, u64)> = r
            .vulnerabilities
            .iter()
            .map(|v| (v.what.clone(), v.states))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m), names(&w));
}

/// The baseline: the kernel's ext4 (data=ordered) recorded through a loop
/// device over ordo's recording FUSE file, its crash states replayed by the
/// kernel. The editor's write-fsync-rename-fsync save is safe there.
#[test]
fn kernel_ext4_keeps_the_editor_consistent() {
    if !fuse_common::fuse_available() {
        return;
    }
    let r = run(App::Editor, Target::Kernel { nobarrier: false }, 100);
    assert!(r.writes > 0 && r.flushes > 0);
    assert!(r.checked > 10);
    assert_eq!(r.consistent, r.checked, "{}", r.summary(5));
}

/// OptFS Table 3, the OptFS column: with `fsync=osync` the editor's save
/// and SQLite's transactions are ordered, not durable, and every crash
/// state holds the old or the new version, never a mix.
#[test]
fn optimistic_osync_keeps_order() {
    if !fuse_common::fuse_available() {
        return;
    }
    let target: Target = "optimistic+osync".parse().unwrap();
    assert_eq!(target.to_string(), "optimistic+osync");
    assert!(!target.keeps_durability());
    for app in [App::Editor, App::SqliteRollback] {
        let r = run(app, target, 150);
        assert!(r.checked > 10);
        assert_eq!(r.consistent, r.checked, "{}", r.summary(5));
        assert!(
            r.old_state > 0,
            "osync delays durability: some crash finds the old version"
        );
    }
    // A mode without an osync of its own refuses the option at mount.
    let p = AppParams::new(App::Editor, "journal+osync".parse().unwrap());
    assert!(explore_app(&p).is_err());
}

/// Reading each recovered image through the kernel (a read-only loop
/// mount) finds the same application files as ordo's read path: the same
/// verdict on every state.
#[test]
fn kernel_and_ordo_read_the_same_recovered_files() {
    if !fuse_common::fuse_available() {
        return;
    }
    let mut p = AppParams::new(App::Editor, ordo("async", DataMode::Ordered));
    p.max_states = Some(120);
    p.jobs = 2;
    let by_ordo = explore_app(&p).unwrap();
    p.serve = ordo_crash::app::explore::Serve::Kernel;
    let by_kernel = explore_app(&p).unwrap();
    println!("{}{}", by_ordo.summary(3), by_kernel.summary(3));
    assert!(by_ordo.checked > 10);
    assert_eq!(by_kernel.fs_failures, 0, "{}", by_kernel.summary(5));
    assert_eq!(
        (by_ordo.checked, by_ordo.consistent, by_ordo.checker_runs),
        (
            by_kernel.checked,
            by_kernel.consistent,
            by_kernel.checker_runs
        )
    );
    assert_eq!(by_ordo.vulnerabilities, {
        let mut v = by_kernel.vulnerabilities.clone();
        for (a, b) in v.iter_mut().zip(&by_ordo.vulnerabilities) {
            a.reproduce = b.reproduce.clone();
        }
        v
    });
}
