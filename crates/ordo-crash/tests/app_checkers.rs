//! The application workloads and checkers of `apps/ordo_app.py`, run
//! natively (no file system under test, no crash): a clean run is accepted
//! as its last update, an earlier state is accepted exactly when no durable
//! update is missing from it, and each corruption the checkers exist to
//! catch is rejected. Needs `/usr/bin/python3` with plyvel and `git`.

use std::fs;
use std::path::Path;

use ordo_crash::app::script::{check, run_workload, App, Control, Verdict};
use tempfile::TempDir;

const STEPS: u32 = 6;
const N: i64 = STEPS as i64;

/// Copy the directory tree `src` to `dst` (which must not exist).
fn copy_tree(src: &Path, dst: &Path) {
    fs::create_dir(dst).unwrap();
    for entry in fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&entry.path(), &to);
        } else if ty.is_file() {
            fs::copy(entry.path(), &to).unwrap();
        } else {
            panic!("unexpected file type at {}", entry.path().display());
        }
    }
}

/// A finished run: the application directory, the control lines it
/// printed, and the copy taken when it printed `mark snap_at` (if asked).
struct Run {
    _tmp: TempDir,
    dir: std::path::PathBuf,
    events: Vec<Control>,
    snapshot: Option<std::path::PathBuf>,
}

fn run(app: App, snap_at: Option<i64>) -> Run {
    let tmp = tempfile::Builder::new()
        .prefix("ordo-app-test-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().join("app");
    fs::create_dir(&dir).unwrap();
    let snap = tmp.path().join("snapshot");
    let mut events = Vec::new();
    let mut snapshot = None;
    run_workload(app, &dir, STEPS, &mut |c: &Control| {
        // The application is blocked until this returns: a copy taken
        // now is a legitimate crash image.
        if let (Control::Mark(k), Some(at)) = (c, snap_at) {
            if *k == at {
                copy_tree(&dir, &snap);
                snapshot = Some(snap.clone());
            }
        }
        events.push(c.clone());
    })
    .unwrap_or_else(|e| panic!("{app}: {e}"));
    Run {
        _tmp: tmp,
        dir,
        events,
        snapshot,
    }
}

/// A fresh copy of `src` (each check may modify its directory).
fn copy_of(src: &Path, tmp: &TempDir, name: &str) -> std::path::PathBuf {
    let dst = tmp.path().join(name);
    copy_tree(src, &dst);
    dst
}

fn verdict(app: App, dir: &Path, durable: i64, started: i64) -> Verdict {
    check(app, dir, durable, started, STEPS).unwrap_or_else(|e| panic!("{app}: {e}"))
}

fn assert_consistent(app: App, dir: &Path, durable: i64, started: i64, want: i64) {
    match verdict(app, dir, durable, started) {
        Verdict::Consistent { j } => assert_eq!(j, want, "{app} K={durable} S={started}"),
        Verdict::Inconsistent(r) => {
            panic!("{app} K={durable} S={started}: expected j={want}, got inconsistent: {r}")
        }
    }
}

fn assert_inconsistent(app: App, dir: &Path, durable: i64, started: i64) -> String {
    match verdict(app, dir, durable, started) {
        Verdict::Inconsistent(r) => {
            println!("{app} K={durable} S={started}: rejected: {r}");
            assert!(!r.is_empty() && !r.contains('\n'), "{app}: reason {r:?}");
            r
        }
        v => panic!("{app} K={durable} S={started}: expected inconsistent, got {v:?}"),
    }
}

/// Run `app` cleanly, check the control sequence, accept the final state,
/// and return the run for the corruption to work on.
fn clean_run(app: App) -> (Run, TempDir) {
    let r = run(app, None);
    // op 0, mark 0, op 1, mark 1, ..., op N, mark N, done.
    let mut events = r.events.iter();
    for k in 0..=N {
        match events.next() {
            Some(Control::Op { k: got, label }) if *got == k => {
                assert!(!label.is_empty(), "{app}: op {k} has no label");
            }
            other => panic!("{app}: expected op {k}, got {other:?} in {:?}", r.events),
        }
        assert_eq!(
            events.next(),
            Some(&Control::Mark(k)),
            "{app}: {:?}",
            r.events
        );
    }
    assert_eq!(events.next(), Some(&Control::Done), "{app}: {:?}", r.events);
    assert_eq!(events.next(), None, "{app}: {:?}", r.events);

    let scratch = TempDir::new().unwrap();
    let copy = copy_of(&r.dir, &scratch, "clean");
    assert_consistent(app, &copy, N, N, N);
    (r, scratch)
}

fn truncate_half(path: &Path) {
    let len = fs::metadata(path).unwrap().len();
    assert!(len > 4096, "{} has only {len} bytes", path.display());
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

#[test]
fn app_names_parse() {
    for a in App::ALL {
        assert_eq!(a.name().parse::<App>(), Ok(a));
        assert_eq!(a.to_string(), a.name());
    }
    let err = "sqlite".parse::<App>().unwrap_err();
    assert!(
        err.contains("sqlite-rollback") && err.contains("editor"),
        "{err}"
    );
}

#[test]
fn sqlite_rollback_truncated_database_is_rejected() {
    let app = App::SqliteRollback;
    let (r, scratch) = clean_run(app);
    let bad = copy_of(&r.dir, &scratch, "bad");
    truncate_half(&bad.join("test.db"));
    assert_inconsistent(app, &bad, N, N);
}

#[test]
fn sqlite_wal_truncated_database_is_rejected() {
    let app = App::SqliteWal;
    let (r, scratch) = clean_run(app);
    let bad = copy_of(&r.dir, &scratch, "bad");
    truncate_half(&bad.join("test.db"));
    let _ = fs::remove_file(bad.join("test.db-wal"));
    let _ = fs::remove_file(bad.join("test.db-shm"));
    assert_inconsistent(app, &bad, N, N);

    // The same on a copy taken while the connection is open (the WAL
    // still holds the last transactions): with the database truncated and
    // the WAL gone, nothing can restore the lost pages.
    let r = run(app, Some(N));
    let snap = r.snapshot.clone().expect("no copy at the last mark");
    assert!(snap.join("test.db-wal").exists(), "no WAL while open");
    assert_consistent(app, &copy_of(&snap, &scratch, "open"), N, N, N);
    let bad = copy_of(&snap, &scratch, "open-bad");
    truncate_half(&bad.join("test.db"));
    fs::remove_file(bad.join("test.db-wal")).unwrap();
    let _ = fs::remove_file(bad.join("test.db-shm"));
    assert_inconsistent(app, &bad, N, N);
}

fn git_head(dir: &Path) -> String {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .env("GIT_DIR", dir.join(".git"))
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn git_ref_to_missing_object_is_rejected() {
    let app = App::Git;
    let (r, scratch) = clean_run(app);

    // The HEAD commit's (loose) object is gone.
    let bad = copy_of(&r.dir, &scratch, "bad");
    let head = git_head(&bad);
    let obj = bad.join(".git/objects").join(&head[..2]).join(&head[2..]);
    assert!(obj.is_file(), "HEAD {head} is not a loose object");
    fs::remove_file(&obj).unwrap();
    assert_inconsistent(app, &bad, N, N);

    // The branch points to an object that never existed.
    let bad2 = copy_of(&r.dir, &scratch, "bad2");
    fs::write(
        bad2.join(".git/refs/heads/main"),
        "1234567890abcdef1234567890abcdef12345678\n",
    )
    .unwrap();
    assert_inconsistent(app, &bad2, N, N);

    // A stale index.lock blocks the next commit.
    let bad3 = copy_of(&r.dir, &scratch, "bad3");
    fs::write(bad3.join(".git/index.lock"), b"").unwrap();
    let why = assert_inconsistent(app, &bad3, N, N);
    assert!(why.contains("lock"), "{why}");
}

/// Offset of the newest record of a LevelDB log file (32 KiB blocks of
/// records with a 7-byte header: crc32c, length u16le, type).
fn newest_log_record(log: &[u8]) -> (usize, usize) {
    const BLOCK: usize = 32768;
    let mut pos = 0;
    let mut newest = None;
    while pos + 7 <= log.len() {
        let left = BLOCK - pos % BLOCK;
        if left < 7 {
            pos += left;
            continue;
        }
        let len = u16::from_le_bytes([log[pos + 4], log[pos + 5]]) as usize;
        let ty = log[pos + 6];
        if ty == 0 && len == 0 {
            break;
        }
        newest = Some((pos, len));
        pos += 7 + len;
    }
    newest.expect("log has no record")
}

#[test]
fn leveldb_torn_log_record_is_rejected() {
    let app = App::Leveldb;
    let (r, scratch) = clean_run(app);
    let bad = copy_of(&r.dir, &scratch, "bad");
    let mut logs: Vec<_> = fs::read_dir(bad.join("db"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let log = logs.pop().expect("no .log file");
    let mut bytes = fs::read(&log).unwrap();
    let (start, len) = newest_log_record(&bytes);
    assert!(len > 16, "newest record is only {len} bytes");
    let mid = start + 7 + len / 2;
    for b in &mut bytes[mid - 4..mid + 4] {
        *b ^= 0x5a;
    }
    fs::write(&log, &bytes).unwrap();
    // Either the paranoid open fails, or the record is dropped and the
    // durable last update is missing: both must be rejected.
    assert_inconsistent(app, &bad, N, N);
}

#[test]
fn editor_empty_file_is_rejected() {
    let app = App::Editor;
    let (r, scratch) = clean_run(app);
    let bad = copy_of(&r.dir, &scratch, "bad");
    fs::write(bad.join("doc.txt"), b"").unwrap();
    let why = assert_inconsistent(app, &bad, N, N);
    assert!(why.contains("empty"), "{why}");

    // A torn file (version N with the tail of another) is rejected too.
    let torn = copy_of(&r.dir, &scratch, "torn");
    let mut data = fs::read(torn.join("doc.txt")).unwrap();
    let half = data.len() / 2;
    data.truncate(half.max(1));
    fs::write(torn.join("doc.txt"), &data).unwrap();
    if half > 0 {
        assert_inconsistent(app, &torn, N, N);
    }
}

#[test]
fn earlier_state_accepted_unless_a_durable_update_is_lost() {
    for app in App::ALL {
        let r = run(app, Some(2));
        let snap = r.snapshot.clone().expect("no copy at mark 2");
        let scratch = TempDir::new().unwrap();
        assert_consistent(app, &copy_of(&snap, &scratch, "a"), 1, 3, 2);
        assert_consistent(app, &copy_of(&snap, &scratch, "b"), 2, 2, 2);
        assert_inconsistent(app, &copy_of(&snap, &scratch, "c"), 3, 3);
    }
}

#[test]
fn nothing_yet_is_accepted_only_before_setup_is_durable() {
    for app in App::ALL {
        let scratch = TempDir::new().unwrap();
        let empty = scratch.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert_consistent(app, &empty, -1, -1, -1);
        assert_consistent(app, &empty, -1, 0, -1);
        assert_inconsistent(app, &empty, 0, 0);
    }
}

#[test]
fn script_failures_are_errors() {
    let scratch = TempDir::new().unwrap();
    fs::write(scratch.path().join("stray"), b"x").unwrap();
    let mut seen = Vec::new();
    let err = run_workload(App::Editor, scratch.path(), 1, &mut |c: &Control| {
        seen.push(c.clone())
    })
    .expect_err("a non-empty directory must be refused");
    assert!(err.to_string().contains("not empty"), "{err}");
    assert!(seen.is_empty(), "{seen:?}");
    // durable > steps: the checker refuses to run, which is no verdict.
    let err = check(App::Editor, scratch.path(), 3, 3, 1).expect_err("bad range");
    assert!(err.to_string().contains("editor"), "{err}");
}
