//! ordo replays journals that other JBD2 implementations wrote, to the
//! image e2fsck's replay produces.
//!
//! - journals written by e2fsprogs' own JBD2 code (`debugfs -w`: `jo`,
//!   `jw`, `jc`), with revoke records, an escaped block and an uncommitted
//!   transaction;
//! - journals written by the kernel's JBD2: an image captured from a
//!   kernel loop mount after `sync` (committed, not yet checkpointed),
//!   with checksums v3 (`metadata_csum`), with the v1 CRC32 commit checksum
//!   (`journal_checksum` without `metadata_csum`) and with 1 KiB blocks;
//! - the same captures with the last commit block corrupted: both stop at
//!   the transaction before;
//! - garbage in the log never panics, and recovery is idempotent.
//!
//! Each case copies the image twice, replays one copy with e2fsck's
//! recovery (`e2fsck -E journal_only`) and the other with ordo, compares
//! every block except the primary and journal superblocks (e2fsck stamps
//! times and counts there), then checks that ordo's image is `e2fsck -fn`
//! clean (but for the superblock's free counts, which the kernel never
//! keeps exact on disk).

mod journal_common;

use journal_common::*;

use ordo_fs::recovery;

#[test]
fn replays_a_debugfs_written_journal_like_e2fsck() {
    if !have("debugfs") {
        eprintln!("skipped: no debugfs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    mkfs(&img, "64M", 4096, &[]);
    // T1 logs block 9000 with a copy that begins with the JBD2 magic (so
    // it is escaped); T2 logs 9001 and 9002 and revokes 9000; T3 is never
    // committed.
    let pat = dir.path().join("pat");
    let mut p = vec![0u8; 4096];
    p[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
    for (i, b) in p.iter_mut().enumerate().skip(4) {
        *b = (i * 7) as u8;
    }
    std::fs::write(&pat, &p).unwrap();
    let pat2 = dir.path().join("pat2");
    let p2: Vec<u8> = (0..8192).map(|i| (i * 13 + 1) as u8).collect();
    std::fs::write(&pat2, &p2).unwrap();
    let script = format!(
        "jo\njw -b 9000 {pat}\njc\njo\njw -b 9001,9002 -r 9000 {pat2}\njc\njo\njw -b 9003 -c {pat}\njc\njo\njw -b 9004 {pat2}\njc\n",
        pat = pat.display(),
        pat2 = pat2.display()
    );
    debugfs_script(&img, &script);

    let st = with_file_dev(&img, |dev| recovery::journal_state(dev).unwrap().unwrap());
    assert!(st.needs_replay(), "{st}");
    assert!(st.needs_recovery);

    let (ordo, e2) = recover_both(&img, dir.path());
    // 9000 was revoked by a later transaction: never replayed.
    assert!(read_block(&ordo, 9000, 4096).iter().all(|&b| b == 0));
    // 9001 and 9002 were replayed from T2.
    assert_eq!(read_block(&ordo, 9001, 4096), p2[..4096]);
    assert_eq!(read_block(&ordo, 9002, 4096), p2[4096..]);
    assert_same_as_e2fsck(&ordo, &e2);
    assert_fsck_clean(&ordo);
}

#[test]
fn replays_kernel_journal_csum_v3() {
    kernel_capture_case("64M", 4096, &[], "", Damage::None);
}

#[test]
fn replays_kernel_journal_csum_v1_crc32() {
    kernel_capture_case(
        "64M",
        4096,
        &["-O", "^metadata_csum"],
        "journal_checksum",
        Damage::None,
    );
}

#[test]
fn replays_kernel_journal_1k_blocks_no_checksums() {
    kernel_capture_case(
        "32M",
        1024,
        &["-O", "^metadata_csum,^64bit"],
        "",
        Damage::None,
    );
}

#[test]
fn stops_before_a_corrupted_commit_like_e2fsck() {
    kernel_capture_case("64M", 4096, &[], "", Damage::CommitHeader);
}

/// A crash tore the last commit block after its first sector: the kernel
/// replays its transaction (its partial commit-block check), and so does
/// ordo. (e2fsprogs 1.47.0 drops it, so only ordo's own fsck judges.)
#[test]
fn replays_a_commit_block_torn_after_its_header_like_the_kernel() {
    kernel_capture_case("64M", 4096, &[], "", Damage::CommitTornAfterHeader);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Damage {
    None,
    /// A byte of the last commit block's header flipped.
    CommitHeader,
    /// The last commit block's sectors after the first hold other bytes.
    CommitTornAfterHeader,
}

fn kernel_capture_case(size: &str, bs: u32, mkfs_opts: &[&str], mount_opts: &str, damage: Damage) {
    let Some(ctx) = LoopCtx::new() else {
        eprintln!("skipped: needs root, losetup and mount");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    mkfs(&img, size, bs, mkfs_opts);
    let captured = dir.path().join("captured.img");
    ctx.capture_after_sync(&img, &captured, mount_opts, |root| {
        // syncfs between phases: each commits a transaction of its own.
        let syncfs = || {
            let st = std::process::Command::new("sync")
                .arg("-f")
                .arg(root)
                .status();
            assert!(st.unwrap().success());
        };
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        syncfs();
        for i in 0..40 {
            std::fs::write(root.join(format!("a/f{i}")), vec![i as u8; 3000 + i * 100]).unwrap();
        }
        syncfs();
        std::fs::write(root.join("a/b/c/big"), vec![0xC0u8; 300_000]).unwrap();
        syncfs();
        for i in 0..10 {
            std::fs::remove_file(root.join(format!("a/f{i}"))).unwrap();
        }
        std::fs::rename(root.join("a/f20"), root.join("a/b/renamed")).unwrap();
        std::os::unix::fs::symlink("a/b/c/big", root.join("link")).unwrap();
        syncfs();
        // A directory of several blocks, logged and then freed: its blocks
        // get revoke records.
        std::fs::create_dir(root.join("d")).unwrap();
        for i in 0..300 {
            std::fs::write(root.join(format!("d/entry-with-a-long-name-{i:04}")), b"x").unwrap();
        }
        syncfs();
        std::fs::remove_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("after"), vec![7u8; 50_000]).unwrap();
    });
    if let Ok(keep) = std::env::var("ORDO_TEST_KEEP") {
        let _ = std::fs::copy(&captured, std::path::Path::new(&keep).join("captured.img"));
    }
    let st = with_file_dev(&captured, |dev| {
        recovery::journal_state(dev).unwrap().unwrap()
    });
    assert!(
        st.needs_replay() && st.live_transactions > 0,
        "the capture should hold committed transactions:\n{st}"
    );
    if mkfs_opts.is_empty() {
        assert!(st.features.contains(&"journal_checksum_v3"), "{st}");
    }
    if mount_opts.contains("journal_checksum") {
        assert!(st.features.contains(&"journal_checksum"), "{st}");
    }
    if damage != Damage::None {
        // Flip a byte of the last commit block's header: its transaction
        // is dropped. Tear it after the header: it is replayed.
        let scan = with_file_dev(&captured, |dev| {
            let map = recovery::JournalMap::new(recovery::locate_journal(dev).unwrap().unwrap());
            let s = recovery::scan(dev, &map).unwrap();
            let commit_lblk = if s.end_block == s.sb.first {
                s.sb.log_end() - 1
            } else {
                s.end_block - 1
            };
            (s.transactions.len(), map.phys(commit_lblk).unwrap())
        });
        let (n, commit_pblk) = scan;
        let mut blk = read_block(&captured, commit_pblk, bs);
        if damage == Damage::CommitHeader {
            blk[0x30] ^= 0x5A; // h_commit_sec
        } else {
            blk[512..].fill(0xA5);
        }
        write_block(&captured, commit_pblk, &blk);
        let st2 = with_file_dev(&captured, |dev| {
            recovery::journal_state(dev).unwrap().unwrap()
        });
        if damage == Damage::CommitHeader {
            assert_eq!(st2.live_transactions as usize, n - 1, "{st2}");
            assert!(
                st2.damage.as_deref().unwrap_or("").contains("commit"),
                "{st2}"
            );
        } else {
            assert_eq!(st2.live_transactions as usize, n, "{st2}");
            assert_eq!(st2.torn_commits, 1, "{st2}");
            assert!(st2.damage.is_none(), "{st2}");
        }
    }
    let (ordo, e2) = recover_both(&captured, dir.path());
    if damage != Damage::CommitTornAfterHeader {
        assert_same_as_e2fsck(&ordo, &e2);
    }
    assert_fsck_clean_but_super_counts(&ordo);
    // Idempotent: a second recovery changes nothing.
    let before = std::fs::read(&ordo).unwrap();
    let rep = with_file_dev_rw(&ordo, |dev| recovery::recover_device(dev, None).unwrap());
    assert_eq!(rep.replayed, 0, "{:?}", rep.lines);
    assert_eq!(before, std::fs::read(&ordo).unwrap());
}

#[test]
fn garbage_in_the_log_never_panics() {
    if !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("g.img");
    mkfs(&img, "16M", 1024, &[]);
    let runs = with_file_dev(&img, |dev| recovery::locate_journal(dev).unwrap().unwrap());
    let map = recovery::JournalMap::new(runs);
    // Mark the journal live at block 1 and fill the log with seeded noise
    // that sometimes carries the magic and plausible headers.
    let jsb_p = map.phys(0).unwrap();
    let mut jsb = read_block(&img, jsb_p, 1024);
    jsb[0x1C..0x20].copy_from_slice(&1u32.to_be_bytes());
    write_block(&img, jsb_p, &jsb);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..20u32 {
        for l in 1..64u32 {
            let mut b = vec![0u8; 1024];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            if !(x >> 20).is_multiple_of(3) {
                b[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
                b[4..8].copy_from_slice(&((x >> 32) as u32 % 6 + 1).to_be_bytes());
                b[8..12].copy_from_slice(&(1 + (l / 8)).to_be_bytes());
            }
            write_block(&img, map.phys(l).unwrap(), &b);
        }
        let copy = dir.path().join(format!("g{round}.img"));
        std::fs::copy(&img, &copy).unwrap();
        let r = with_file_dev_rw(&copy, |dev| recovery::recover_device(dev, None));
        // Either a report or a typed error, never a panic; and once
        // recovered, the journal is clean.
        if r.is_ok() {
            let st = with_file_dev(&copy, |dev| recovery::journal_state(dev).unwrap().unwrap());
            assert!(!st.needs_replay() && !st.needs_recovery, "{st}");
        }
    }
}

#[test]
fn clean_journal_has_nothing_to_replay() {
    if !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("c.img");
    mkfs(&img, "32M", 4096, &[]);
    let before = std::fs::read(&img).unwrap();
    let st = with_file_dev(&img, |dev| recovery::journal_state(dev).unwrap().unwrap());
    assert!(!st.needs_replay());
    assert_eq!(st.blocks, 1024);
    let rep = with_file_dev_rw(&img, |dev| recovery::recover_device(dev, None).unwrap());
    assert_eq!(rep.replayed, 0);
    assert_eq!(
        before,
        std::fs::read(&img).unwrap(),
        "a clean image is not written"
    );
}
