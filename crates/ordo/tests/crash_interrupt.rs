//! `ordo crash` stopped by SIGTERM in the middle of a soak: it finishes
//! the states it is checking, releases the kernel judge's loop devices,
//! mounts and temporary images, and exits 130 saying it was interrupted;
//! the seeds it finished stay, so the same command resumes.
//!
//! Alone in its test binary: the judge's images are recognised by the
//! descriptors the soak holds, and no other test of this binary makes any.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// The crash images the process `pid` has open (the judge's and
/// e2fsck's temporary copies).
fn open_images(pid: u32) -> BTreeSet<PathBuf> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ordo-judge-") || n.starts_with("ordo-crash-"))
        })
        .collect()
}

/// Backing files of every attached loop device.
fn loop_backing_files() -> Vec<String> {
    let mut out = Vec::new();
    for dev in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let f = dev.path().join("loop/backing_file");
        if let Ok(s) = std::fs::read_to_string(&f) {
            out.push(s.trim().to_string());
        }
    }
    out
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(1).is_some_and(|m| m.starts_with(&dir)))
        .map(String::from)
        .collect()
}

#[test]
fn sigterm_stops_a_soak_between_states_and_leaves_nothing_behind() {
    require_loop_devices();
    let s = Scratch::new();
    let tmp = s.mkdir("tmp");
    let soak_dir = s.path("soak");
    let mut child = Command::new(ordo_bin())
        .args([
            "crash",
            "soak",
            "--mode",
            "journal",
            "-j",
            "2",
            "--judge-every",
            "1",
            "--first-seed",
            "5",
            "--target",
            "1000000",
            "-q",
            "--dir",
        ])
        .arg(&soak_dir)
        // The judge's kernel mounts go to temporary directories here.
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ordo crash soak");
    let pid = child.id();
    // Wait until the kernel judge is at work: a crash image the soak holds
    // open is attached to a loop device.
    let start = Instant::now();
    let mut seen = BTreeSet::new();
    let attached = |seen: &BTreeSet<PathBuf>| {
        let backing = loop_backing_files();
        seen.iter()
            .any(|i| backing.iter().any(|b| b.starts_with(&*i.to_string_lossy())))
    };
    while !attached(&seen) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the soak never ran its judge"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the soak ended before it was interrupted"
        );
        seen.extend(open_images(pid));
        sleep(Duration::from_millis(20));
    }
    // SAFETY: kill has no memory preconditions; pid is our child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    // What it opens while it finishes the states in hand counts too.
    while child.try_wait().unwrap().is_none() {
        seen.extend(open_images(pid));
        sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    for image in &seen {
        assert!(!image.exists(), "{} left behind", image.display());
        let name = image.to_string_lossy().to_string();
        assert!(
            !loop_backing_files().iter().any(|b| b.starts_with(&name)),
            "a loop device still holds {name}"
        );
    }
    assert_eq!(
        mounts_under(&tmp),
        Vec::<String>::new(),
        "mounts left behind"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "temporary files left behind: {left:?}");
}
