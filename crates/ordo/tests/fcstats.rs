//! `ordo info` shows the fast-commit statistics of a live `ordo mount`,
//! of the last mount that ended, and of one whose process died; `ordo
//! mount` prints them when it ends.
//!
//! The figures are predicted from the fsyncs: the first fsync of a mount
//! is a full commit (nothing to build a fast commit on, reason
//! `no_live_log`), each later fsync of new changes a fast commit, and
//! `commit=600` keeps the timer out of the window.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// The number on the line of `ordo info` that starts with `name`.
fn figure(text: &str, name: &str) -> u64 {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no '{name}' line in:\n{text}"));
    line[name.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number on '{line}'"))
}

fn info(path: &Path) -> String {
    let out = ordo(&["info", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "ordo info {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ordo info PATH` once its figures show `fast` fast commits (the mount
/// refreshes them about once a second).
fn info_with_fast_commits(path: &Path, fast: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = info(path);
        if text.contains("fast commits") && figure(&text, "fast commits") == fast {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "ordo info never showed {fast} fast commits:\n{text}"
        );
        sleep(Duration::from_millis(200));
    }
}

/// Create, write and fsync `n` new files.
fn write_and_fsync(mp: &Path, prefix: &str, n: usize) {
    for i in 0..n {
        let mut f = fs::File::create(mp.join(format!("{prefix}{i}"))).unwrap();
        f.write_all(format!("file {i}\n").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
}

#[test]
fn info_shows_fast_commit_statistics_of_live_ended_and_crashed_mounts() {
    require_mount_privileges();
    let s = Scratch::new();
    // Each process of the test (ordo mount, ordo info) inherits this.
    std::env::set_var("ORDO_RUN_DIR", s.path("run"));
    let image = s.path("img");
    let out = ordo(&[
        "mkfs",
        image.to_str().unwrap(),
        "--size",
        "64M",
        "-O",
        "has_journal,fast_commit",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = info(&image);
    assert!(
        before.contains("Protocol statistics: none"),
        "a never-mounted image: {before}"
    );

    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "mode=fast_commit,commit=600");
    const FILES: usize = 5;
    write_and_fsync(&mp, "f", FILES);
    let fast = FILES as u64 - 1;
    let live = info_with_fast_commits(&mp, fast);
    assert!(
        live.contains("Filesystem features:"),
        "the mountpoint finds the image: {live}"
    );
    assert!(live.contains("live mount"), "{live}");
    assert!(live.contains("mode=fast_commit"), "{live}");
    assert_eq!(figure(&live, "full commits"), 1, "{live}");
    assert_eq!(figure(&live, "ineligible: no_live_log"), 1, "{live}");
    assert_eq!(figure(&live, "timer/other (no reason)"), 0, "{live}");
    assert!(figure(&live, "single-block commits") <= fast, "{live}");
    assert!(figure(&live, "jbd2 commits") >= 1, "{live}");
    // The image path finds the same figures.
    assert_eq!(
        figure(&info_with_fast_commits(&image, fast), "full commits"),
        1
    );

    let (status, err) = m.stop();
    assert!(status.success(), "ordo mount exited with {status}: {err}");
    assert!(
        err.contains("protocol statistics") && figure(&err, "fast commits") == fast,
        "ordo mount's last words: {err}"
    );
    let ended = info(&image);
    assert!(
        ended.contains("last mount") && ended.contains("ended"),
        "{ended}"
    );
    assert!(!ended.contains("live mount"), "{ended}");
    assert_eq!(figure(&ended, "fast commits"), fast, "{ended}");
    assert_eq!(figure(&ended, "full commits"), 1, "{ended}");
    assert_eq!(info(&mp), ended, "the mountpoint finds the ended mount");

    // A mount whose process is killed never ends: reported as crashed.
    let m = OrdoMount::start(&image, &mp, "mode=fast_commit,commit=600");
    write_and_fsync(&mp, "g", 2);
    info_with_fast_commits(&image, 1);
    let (status, _) = m.signal(libc::SIGKILL);
    assert!(!status.success());
    let _ = run("fusermount3", &["-u", "-z", mp.to_str().unwrap()]);
    let crashed = info(&image);
    assert!(crashed.contains("crashed"), "{crashed}");
    assert!(!crashed.contains("live mount"), "{crashed}");
    assert_eq!(figure(&crashed, "fast commits"), 1, "{crashed}");

    // A damaged stats file is a clear line, not a failure.
    let files: Vec<_> = fs::read_dir(s.path("run"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one stats file per image: {files:?}");
    fs::write(&files[0], "{\"format\": 1, \"pid\": ").unwrap();
    let damaged = info(&image);
    assert!(
        damaged.contains("Protocol statistics: unavailable"),
        "{damaged}"
    );
}
