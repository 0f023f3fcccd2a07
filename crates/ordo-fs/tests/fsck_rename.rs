//! The benign repair of a directory left with two names by a crash inside
//! a rename (rule 3 writes the new entry before the old one is removed).
//!
//! The states are made with `debugfs`, which links a directory a second
//! time without touching any link count, as a crash between the two entry
//! writes leaves it: one name in the directory its `..` names, one
//! elsewhere. ordo's fsck must call the state benign, remove the stale
//! name (whichever of the two pass 2 finds first), and leave an image
//! `e2fsck -fn` finds clean; a third name must stay unsafe and unrepaired.

mod fsck_common;

use std::path::Path;

use fsck_common::*;
use ordo_dev::FileDevice;
use ordo_fs::fsck::{check, FsckOptions, Severity};

fn mkfs_ordo(img: &Path) {
    use ordo_fs::mkfs::{mkfs, MkfsOptions};
    let dev = FileDevice::create(img, 16 << 20, 4096).expect("create image");
    mkfs(
        &dev,
        &MkfsOptions {
            size_bytes: 16 << 20,
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .expect("ordo mkfs");
}

/// An image with /A, /B, /C and the directories `dirs` made by debugfs,
/// then the links `links` (`from to`) added.
fn image(dir: &Path, name: &str, dirs: &[&str], links: &[(&str, &str)]) -> std::path::PathBuf {
    let img = dir.join(format!("{name}.img"));
    mkfs_ordo(&img);
    for d in ["/A", "/B", "/C"].iter().chain(dirs) {
        debugfs(&img, &format!("mkdir {d}"));
    }
    let (clean, _, out) = e2fsck_clean(&img);
    assert!(clean, "base image not clean:\n{out}");
    for (from, to) in links {
        debugfs(&img, &format!("ln {from} {to}"));
    }
    img
}

fn names_in(img: &Path, dir: &str) -> Vec<String> {
    debugfs_ro(img, &format!("ls -p {dir}"))
        .lines()
        .filter_map(|l| l.split('/').nth(5).map(str::to_string))
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .collect()
}

fn repair(img: &Path) -> ordo_fs::fsck::FsckReport {
    let dev = open_bs(img, true, 4096);
    check(
        &dev,
        &FsckOptions {
            repair_benign: true,
            ..FsckOptions::default()
        },
    )
    .expect("fsck runs")
}

#[test]
fn a_moved_directory_with_two_names_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    // /A/d keeps `..` = /A: its new name /B/d2 is the stale one (a crash
    // before `..` moved). /B/e keeps `..` = /B: its old name /A/e2 is
    // stale (a crash after `..` moved, before the old entry went). A has
    // the lower inode number, so pass 2 meets the stale name second for d
    // and first for e.
    let img = image(
        dir.path(),
        "two",
        &["/A/d", "/B/e"],
        &[("/A/d", "/B/d2"), ("/B/e", "/A/e2")],
    );
    let (clean, _, out) = e2fsck_clean(&img);
    assert!(!clean, "e2fsck must see the second names:\n{out}");
    let r = repair(&img);
    assert!(!r.has_unsafe(), "{:#?}", r.problems);
    let benign: Vec<String> = r
        .of_severity(Severity::Benign)
        .map(|p| p.message.clone())
        .collect();
    assert!(
        benign
            .iter()
            .any(|m| m.contains("'d2'") && m.contains("stale")),
        "{benign:#?}"
    );
    assert!(
        benign
            .iter()
            .any(|m| m.contains("'e2'") && m.contains("stale")),
        "{benign:#?}"
    );
    assert_eq!(r.repairs.iter().filter(|s| s.contains("stale")).count(), 2);
    assert!(!r.errors_remain(), "{:#?}", r.remaining);
    let mut a = names_in(&img, "/A");
    a.sort();
    let mut b = names_in(&img, "/B");
    b.sort();
    assert_eq!(a, vec!["d".to_string()]);
    assert_eq!(b, vec!["e".to_string()]);
    let (clean, _, out) = e2fsck_clean(&img);
    assert!(clean, "e2fsck after the repair:\n{out}");
    // A second repair has nothing left to do.
    let again = repair(&img);
    assert!(again.is_clean(), "{:#?}", again.problems);
}

#[test]
fn a_third_name_stays_unsafe() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(
        dir.path(),
        "three",
        &["/A/t"],
        &[("/A/t", "/B/t2"), ("/A/t", "/C/t3")],
    );
    let before = digest(&img);
    let r = repair(&img);
    assert!(r.has_unsafe(), "{:#?}", r.problems);
    assert!(r
        .problems
        .iter()
        .any(|p| p.severity == Severity::Unsafe && p.message.contains("linked twice")));
    assert!(r.repairs.is_empty());
    assert_eq!(digest(&img), before, "an unsafe image must not be written");
}
