//! ordo replays fast-commit logs the Linux kernel wrote, to the tree
//! `e2fsck -fy` replays them to.
//!
//! Each case formats an image with `mkfs.ext4 -O fast_commit`, mounts it
//! with a long commit interval, forces one full commit (the kernel only
//! fast-commits on top of one), runs a workload of fsyncs, and copies the
//! loop device while it is still mounted: the copy holds fast commits on
//! top of a live JBD2 log. One copy is replayed by ordo, one by
//! `e2fsck -fy`; ordo's must be `e2fsck -fn` clean, and both must hold the
//! same tree (names, types, permissions, link counts, sizes, contents),
//! read back through read-only kernel mounts. Skipped unless running as
//! root with loop devices.
//!
//! Where e2fsck 1.47.0 cannot replay what the kernel writes, the test
//! says so by asserting e2fsck's failure (so it fails the day e2fsck is
//! fixed) and compares the kernel's replay with ordo's instead:
//! - a fast commit on top of a full commit that made a directory
//!   (e2fsck uses the inode-table block and the group descriptors it read
//!   before its JBD2 replay: `mkdir_in_the_last_full_commit`); the
//!   e2fsck comparisons here make their directories before the mount;
//! - a fast-committed mkdir (e2fsck does not build the new directory's
//!   block; the kernel's own replay is not consistent either);
//! - a file's last link removed (e2fsck reconnects the inode to
//!   lost+found, which the tree comparisons leave out).

mod fast_commit_common;

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use fast_commit_common::*;

/// Capture, check the log has fast commits, replay both ways, compare.
fn interop_case(name: &str, block_size: u32, dirs: &[&str], work: impl FnOnce(&Path)) {
    if !can_loop_mount() {
        eprintln!("skipped: needs root, loop devices, mkfs.ext4 and e2fsck");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join(format!("{name}.img"));
    let cap = dir.path().join(format!("{name}.cap"));
    mkfs_fc(&img, "64M", block_size);
    premake_dirs(&img, dirs);
    capture_fast_commits(&img, &cap, work);
    let st = fc_state(&cap);
    assert!(
        st.scan.commits > 0,
        "{name}: the capture holds no fast commit: {:?}",
        st.scan.end
    );
    let by_ordo = dir.path().join("ordo.img");
    let by_e2fsck = dir.path().join("e2fsck.img");
    std::fs::copy(&cap, &by_ordo).unwrap();
    std::fs::copy(&cap, &by_e2fsck).unwrap();
    let report = ordo_recover(&by_ordo);
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.contains("fast commit: replayed")),
        "{name}: {:?}",
        report.lines
    );
    assert_fsck_clean(&by_ordo);
    // Replaying again changes nothing (the log is gone, the image clean).
    let before = std::fs::read(&by_ordo).unwrap();
    ordo_recover(&by_ordo);
    assert!(
        before == std::fs::read(&by_ordo).unwrap(),
        "{name}: second recovery wrote"
    );
    let code = e2fsck_fy(&by_e2fsck);
    assert!(code == 0 || code == 1, "{name}: e2fsck -fy exit {code}");
    assert_same_tree(&tree_of(&by_ordo), &tree_of(&by_e2fsck));
}

#[test]
fn creates_appends_links_unlinks_and_truncates_like_e2fsck() {
    interop_case("mixed", 4096, &["d0"], |m| {
        write_fsync(&m.join("a.txt"), b"hello fast commit\n");
        write_fsync(
            &m.join("d0/b.bin"),
            &(0..16384u32).map(|i| i as u8).collect::<Vec<_>>(),
        );
        write_fsync(&m.join("c.txt"), &[b'c'; 5000]);
        edit_fsync(&m.join("a.txt"), |f| {
            f.seek(SeekFrom::End(0)).unwrap();
            f.write_all(&b"appended\n".repeat(500)).unwrap();
        });
        std::fs::hard_link(m.join("c.txt"), m.join("d0/c-link")).unwrap();
        fsync_path(&m.join("d0/c-link"));
        std::fs::remove_file(m.join("c.txt")).unwrap();
        edit_fsync(&m.join("d0/b.bin"), |f| f.set_len(4096).unwrap());
        write_fsync(&m.join("e.txt"), b"last one\n");
    });
}

#[test]
fn many_files_in_one_commit_like_e2fsck() {
    // Twenty files created, then one fsync: a multi-block commit (the
    // fsync commits every pending change, not only the fsynced file's).
    interop_case("many", 4096, &[], |m| {
        for i in 0..20 {
            let p = m.join(format!("f{i:02}"));
            std::fs::write(&p, format!("file {i}\n").repeat(i + 1)).unwrap();
        }
        fsync_path(&m.join("f00"));
    });
}

#[test]
fn unlinks_an_fsynced_file_and_overwrites_like_e2fsck() {
    interop_case("unlink", 1024, &[], |m| {
        write_fsync(&m.join("gone"), &[7u8; 3000]);
        write_fsync(&m.join("kept"), &[1u8; 3000]);
        std::fs::remove_file(m.join("gone")).unwrap();
        edit_fsync(&m.join("kept"), |f| {
            f.seek(SeekFrom::Start(100)).unwrap();
            f.write_all(&[2u8; 2000]).unwrap();
        });
    });
}

/// Capture a kernel workload on a fresh `-O fast_commit` image of
/// `block_size`; `None` without loop devices.
fn capture(dir: &Path, block_size: u32, work: impl Fn(&Path)) -> Option<std::path::PathBuf> {
    if !can_loop_mount() {
        eprintln!("skipped: needs root and loop devices");
        return None;
    }
    let img = dir.join("k.img");
    let cap = dir.join("k.cap");
    // The copy of the live mount is retried when the kernel itself cannot
    // replay it (a write of its own was in flight while it was taken):
    // what is compared is the replay of a log the kernel accepts.
    for attempt in 1..=3 {
        mkfs_fc(&img, "64M", block_size);
        capture_fast_commits(&img, &cap, &work);
        if kernel_can_replay(&cap) {
            break;
        }
        eprintln!("attempt {attempt}: the kernel refuses the copy's log; capturing again");
    }
    assert!(fc_state(&cap).scan.commits > 0, "no fast commit captured");
    Some(cap)
}

/// Copies of `cap` replayed by ordo, the kernel and `e2fsck -fy`; returns
/// (ordo's, the kernel's, e2fsck's image, e2fsck's output).
fn replay_three(dir: &Path, cap: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    let by_ordo = dir.join("ordo.img");
    let by_kernel = dir.join("kernel.img");
    let by_e2fsck = dir.join("e2fsck.img");
    for p in [&by_ordo, &by_kernel, &by_e2fsck] {
        std::fs::copy(cap, p).unwrap();
    }
    ordo_recover(&by_ordo);
    assert_fsck_clean(&by_ordo);
    kernel_replay(&by_kernel);
    let (_, out) = e2fsck_fy_output(&by_e2fsck);
    (by_ordo, by_kernel, by_e2fsck, out)
}

/// A directory made by the full commit the fast commits build on, and
/// files created in it by fast commits. The kernel and ordo replay the
/// kernel's log to the same tree; e2fsck 1.47.0 does not: at 4 KiB it
/// reads the new directory's inode through the inode-table block it
/// cached before its JBD2 replay ("Ext2 inode is not a directory ... in
/// ext4_fc_handle_link_and_create"), at 1 KiB through the group
/// descriptors it read then (the directory's group still
/// `INODE_UNINIT`, which its check then repairs); at 4 KiB the directory
/// and what was created in it are lost. ordo's own logs avoid
/// both (its first fast commit on top of a full commit writes those
/// blocks home first: `fast_commit_protocol.rs`). The e2fsck half of this
/// test fails the day e2fsck replays the kernel's log right.
#[test]
fn mkdir_in_the_last_full_commit() {
    for bs in [4096, 1024] {
        let dir = tempfile::tempdir().unwrap();
        let Some(cap) = capture(dir.path(), bs, |m| {
            std::fs::create_dir(m.join("d1")).unwrap();
            fsync_path(m); // a directory fsync: a full commit
            write_fsync(&m.join("d1/x"), b"in d1\n");
            write_fsync(&m.join("y"), &[3u8; 9000]);
        }) else {
            return;
        };
        assert!(fc_state(&cap).scan.commits >= 2);
        let (by_ordo, by_kernel, by_e2fsck, out) = replay_three(dir.path(), &cap);
        let t = full_tree_of(&by_ordo);
        assert_eq!(t["d1/x"].content, b"in d1\n");
        assert_eq!(t["y"].content, vec![3u8; 9000]);
        assert_eq!(t["d1"].nlink, 2);
        assert_fsck_clean(&by_kernel);
        assert_same_tree(&t, &full_tree_of(&by_kernel));
        // e2fsck: at 4 KiB its replay stops at the stale inode and the
        // directory is lost; at 1 KiB its replay goes through, and its
        // check then finds the directory's group marked uninitialized.
        let symptom = if bs == 4096 {
            "Ext2 inode is not a directory"
        } else {
            "_INODE_UNINIT is set"
        };
        assert!(
            out.contains(symptom),
            "{bs}: e2fsck now replays a file in a directory of the last full commit:\n{out}"
        );
        if bs == 4096 {
            let e = full_tree_of(&by_e2fsck);
            assert!(!e.contains_key("d1/x"), "{:?}", e.keys());
        }
    }
}

/// A fast-committed mkdir, as the kernel logs it (INODE and CREAT of the
/// directory, no blocks: its replay makes the "." and ".." block). e2fsck
/// 1.47.0 has no such step: its replay fails at the first entry it adds
/// to the directory ("No free space in the directory"), and it clears
/// the empty directory. The kernel's own replay keeps the tree but leaves
/// the parent's and the directory's link counts, the directory's
/// `i_blocks` and the group's directory count for e2fsck to fix. ordo
/// replays it to the same names and contents as the kernel, consistent;
/// and, since neither replays it right, ordo makes mkdir and rmdir full
/// commits (`fc_ineligible_mkdir_rmdir`). This test fails the day either
/// replays the kernel's log right.
#[test]
fn a_fast_committed_mkdir_is_replayed_right_by_ordo_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cap) = capture(dir.path(), 4096, |m| {
        std::fs::create_dir(m.join("d")).unwrap();
        write_fsync(&m.join("d/x"), b"in d\n");
    }) else {
        return;
    };
    let st = fc_state(&cap);
    assert!(
        st.scan
            .tags
            .iter()
            .any(|t| matches!(t, ordo_format::fc::Tag::Creat(d) if d.name == b"d")),
        "the mkdir is not in the fast commit: {:?}",
        st.scan.tags
    );
    let (by_ordo, by_kernel, by_e2fsck, out) = replay_three(dir.path(), &cap);
    assert!(out.contains("No free space in the directory"), "{out}");
    assert!(!full_tree_of(&by_e2fsck).contains_key("d/x"), "{out}");
    let (code, report) = e2fsck_fn(&by_kernel);
    assert_ne!(code, 0, "the kernel's replay of its mkdir is now clean");
    assert!(report.contains("Directories count wrong"), "{report}");
    let o = full_tree_of(&by_ordo);
    let k = full_tree_of(&by_kernel);
    let names = |t: &std::collections::BTreeMap<String, Obj>| {
        t.iter()
            .map(|(p, v)| (p.clone(), v.kind, v.content.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&o), names(&k));
    assert_eq!(o["d"].nlink, 2);
    assert_eq!(o["d/x"].content, b"in d\n");
}

/// A file's last link removed by a fast commit. The kernel and ordo free
/// the inode; e2fsck 1.47.0 only removes the entry, and then reconnects
/// the still-linked inode to lost+found. Tree comparisons with e2fsck
/// therefore look at `lost+found` separately (as the three-way test in
/// `fast_commit_protocol.rs` does). This test fails the day e2fsck frees
/// it.
#[test]
fn an_unlinked_file_is_freed_by_ordo_and_the_kernel_and_reconnected_by_e2fsck() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cap) = capture(dir.path(), 4096, |m| {
        write_fsync(&m.join("gone"), &[7u8; 3000]);
        write_fsync(&m.join("kept"), &[1u8; 3000]);
        std::fs::remove_file(m.join("gone")).unwrap();
        fsync_path(&m.join("kept"));
    }) else {
        return;
    };
    let (by_ordo, by_kernel, by_e2fsck, out) = replay_three(dir.path(), &cap);
    assert_fsck_clean(&by_kernel);
    let o = full_tree_of(&by_ordo);
    assert!(!o.contains_key("gone"));
    assert!(!o.keys().any(|k| k.starts_with("lost+found/")), "{o:?}");
    assert_same_tree(&o, &full_tree_of(&by_kernel));
    let e = full_tree_of(&by_e2fsck);
    let lf: Vec<_> = e
        .iter()
        .filter(|(k, _)| k.starts_with("lost+found/"))
        .collect();
    assert_eq!(lf.len(), 1, "{:?}\n{out}", e.keys());
    assert_eq!(lf[0].1.content, vec![7u8; 3000]);
    assert_same_tree(&tree_of(&by_ordo), &tree_of(&by_e2fsck));
}
