//! The journal protocol, driven directly (see `journal_common/harness.rs`):
//! fsync promises survive every crash the write-cache model produces,
//! transactions are atomic and log their blocks in block order, revoked
//! blocks are not replayed over new data, a full log forces checkpoints
//! and wraps, unmount leaves a clean image,
//! flushes per commit are what ordering needs, and an ordo journal left
//! unrecovered is replayed by e2fsck (and the kernel) to the image ordo's
//! own recovery gives.

mod journal_common;

use journal_common::harness::Harness;
use journal_common::*;

use ordo_dev::{BlockDevice, CrashPolicy};
use ordo_fs::protocol::DataMode;
use ordo_fs::recovery;

fn image(dir: &std::path::Path, size: &str, bs: u32) -> std::path::PathBuf {
    let img = dir.join("j.img");
    mkfs(&img, size, bs, &[]);
    img
}

/// A harness over a fresh 64 MiB / 4 KiB image in a directory of its own,
/// returned beside it to keep it alive; `None` without mkfs.ext4.
fn fresh(mode: DataMode) -> Option<(tempfile::TempDir, Harness)> {
    if !have("mkfs.ext4") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M", 4096);
    let h = Harness::new(&img, mode);
    Some((dir, h))
}

/// Free blocks of a fresh 64 MiB / 4 KiB image (the journal is near the
/// middle; 9000.. is free).
const FREE: u64 = 9000;

fn policies() -> Vec<CrashPolicy> {
    vec![
        CrashPolicy::lose_all(),
        CrashPolicy::keep_all(),
        CrashPolicy::default(),
        CrashPolicy {
            keep_probability: 0.5,
            torn_probability: 0.3,
            sector_bytes: 512,
        },
    ]
}

#[test]
fn fsync_promises_survive_every_crash_in_every_data_mode() {
    if !have("mkfs.ext4") {
        return;
    }
    for mode in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
        let (_dir, mut h) = fresh(mode).expect("mkfs.ext4 is there");
        for round in 0..6u8 {
            h.meta(&[FREE, FREE + 1 + round as u64], 0x10 + round);
            h.meta_with_magic(FREE + 20);
            h.data(FREE + 40 + round as u64, 0xA0 + round, true);
            h.data(FREE + 60, 0xB0 + round, false);
            h.fsync();
            // Unsynced changes after the promise.
            h.meta(&[FREE], 0x70 + round);
            h.data(FREE + 60, 0xC0 + round, false);
            for seed in 0..8 {
                for p in policies() {
                    let dev = h.crash_and_recover(seed, p);
                    h.check_promises(&dev, true).unwrap_or_else(|e| {
                        panic!("{mode:?} round {round} seed {seed} {p:?}: {e}")
                    });
                }
            }
        }
        assert!(h.stat("commits") >= 6);
        assert!(h.stat("copies_escaped") >= 1);
    }
}

#[test]
fn transactions_are_atomic() {
    let Some((_dir, mut h)) = fresh(DataMode::Journal) else {
        return;
    };
    let blocks: Vec<u64> = (FREE..FREE + 30).collect();
    let mut versions = vec![vec![0u8; 30]];
    for v in 1..=5u8 {
        // One handle changes all 30 blocks; each timer tick commits it.
        h.meta(&blocks, v);
        h.timer();
        versions.push(vec![v; 30]);
    }
    for seed in 0..32 {
        for p in policies() {
            let dev = h.crash_and_recover(seed, p);
            let seen: Vec<u8> = blocks
                .iter()
                .map(|&b| Harness::block_of(&dev, b)[7])
                .collect();
            assert!(
                versions.contains(&seen),
                "seed {seed} {p:?}: a mix of transactions: {seen:?}"
            );
        }
    }
}

#[test]
fn a_revoked_block_is_not_replayed_over_new_data() {
    let Some((dir, mut h)) = fresh(DataMode::Ordered) else {
        return;
    };
    let b = FREE + 5;
    h.meta(&[b], 0x33); // logged as metadata in T1
    h.fsync();
    h.free(b); // revoked in T2
    assert!(
        !h.proto.can_allocate(b),
        "not reusable before T2 is durable"
    );
    h.fsync();
    assert!(h.proto.can_allocate(b), "reusable once T2 is durable");
    h.data(b, 0x99, true); // reallocated as file data, written home in order
    h.fsync();
    assert!(h.stat("revoke_records") >= 1);
    assert_eq!(h.stat("checkpoints"), 0, "the old copy is still in the log");
    for seed in 0..8 {
        for p in policies() {
            let dev = h.crash_and_recover(seed, p);
            assert_eq!(Harness::block_of(&dev, b)[0], 0x99, "seed {seed} {p:?}");
        }
    }
    // e2fsck agrees.
    let crashed = h.crash(0, CrashPolicy::lose_all());
    let path = dir.path().join("revoke.img");
    std::fs::write(&path, crashed.to_image()).unwrap();
    let (ordo, e2) = recover_both(&path, dir.path());
    assert_eq!(read_block(&e2, b, 4096)[0], 0x99);
    assert_same_as_e2fsck(&ordo, &e2);
}

#[test]
fn a_full_log_forces_checkpoints_and_wraps() {
    if !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 16 MiB, 1 KiB blocks: a 1024-block journal.
    let img = dir.path().join("w.img");
    mkfs(&img, "16M", 1024, &[]);
    let mut h = Harness::new(&img, DataMode::Ordered);
    let base = 12000;
    for round in 0..40u64 {
        let blocks: Vec<u64> = (0..60).map(|i| base + (round * 7 + i) % 200).collect();
        h.meta(&blocks, round as u8 + 1);
        h.fsync();
        if round % 9 == 0 {
            for p in policies() {
                let dev = h.crash_and_recover(round, p);
                h.check_promises(&dev, false)
                    .unwrap_or_else(|e| panic!("round {round} {p:?}: {e}"));
            }
        }
    }
    assert!(h.stat("forced_checkpoints") >= 2, "{:?}", h.proto.stats());
    let dev = h.crash_and_recover(1, CrashPolicy::default());
    h.check_promises(&dev, false).unwrap();
}

#[test]
fn pressure_commits_and_checkpoints() {
    let Some((_dir, mut h)) = fresh(DataMode::Ordered) else {
        return;
    };
    h.meta(&[FREE, FREE + 1], 0x44);
    h.pressure();
    assert_eq!(h.stat("checkpoints"), 1);
    assert!(
        h.cache.dirty_blocks().is_empty(),
        "checkpointed blocks are clean"
    );
    // Home locations hold the data without any replay.
    let crashed = h.crash(0, CrashPolicy::lose_all());
    assert_eq!(Harness::block_of(&crashed, FREE)[0], 0x44);
}

#[test]
fn a_transaction_logs_its_blocks_in_block_order() {
    let Some((_dir, mut h)) = fresh(DataMode::Ordered) else {
        return;
    };
    // Changed out of order, one handle each, all in one transaction: the
    // running transaction keeps them unordered, the log holds them
    // ascending by home block (the same records in the same order on every
    // run, whatever the order of the changes).
    let changed = [
        FREE + 17,
        FREE + 3,
        FREE + 40,
        FREE + 1,
        FREE + 29,
        FREE + 8,
    ];
    for (i, &b) in changed.iter().enumerate() {
        h.meta(&[b], i as u8 + 1);
    }
    h.fsync();
    let runs = recovery::locate_journal(&*h.dev)
        .unwrap()
        .expect("the image has a journal");
    let scan = recovery::scan(&*h.dev, &recovery::JournalMap::new(runs)).unwrap();
    let t = scan.transactions.last().expect("a committed transaction");
    let homes: Vec<u64> = t.blocks.iter().map(|b| b.home).collect();
    for b in changed {
        assert!(homes.contains(&b), "{b} not logged: {homes:?}");
    }
    assert!(
        homes.windows(2).all(|w| w[0] < w[1]),
        "log order is not block order: {homes:?}"
    );
}

#[test]
fn one_flush_and_one_fua_per_commit() {
    let Some((_dir, mut h)) = fresh(DataMode::Ordered) else {
        return;
    };
    h.meta(&[FREE], 1);
    h.fsync(); // first commit also writes both superblocks
    let before = h.dev.counters();
    for i in 0..10u64 {
        h.data(FREE + 100 + i, 7, true);
        h.meta(&[FREE + 1, FREE + 2, FREE + 3], i as u8);
        h.fsync();
    }
    let d = h.dev.counters().since(&before);
    let t = d.total();
    assert_eq!(d.flushes, 10, "one flush per commit");
    assert_eq!(t.fua_writes, 10, "one FUA commit block per commit");
    // Per commit: the data block, then descriptor and copies in one write
    // (two where the log crosses a gap between the journal's extents), then
    // the commit block.
    let data = d.class(ordo_dev::BlockClass::Data);
    let journal = d.class(ordo_dev::BlockClass::Journal);
    assert_eq!((data.writes, data.write_bytes), (10, 10 * 4096), "{d:?}");
    let gaps = h.env.journal_runs.len() as u64 - 1;
    assert!(journal.writes >= 20 && journal.writes <= 20 + gaps, "{d:?}");
    assert_eq!(journal.write_bytes, 10 * 5 * 4096, "{d:?}");
    assert_eq!(
        t.writes,
        data.writes + journal.writes,
        "nothing else is written"
    );
}

#[test]
fn unmount_leaves_a_clean_image() {
    let Some((dir, mut h)) = fresh(DataMode::Journal) else {
        return;
    };
    h.meta(&[FREE, FREE + 1], 3);
    h.fsync();
    h.data(FREE + 2, 4, true);
    // Mounted: needs_recovery is on disk.
    let mid = h.crash(0, CrashPolicy::lose_all());
    let st = recovery::journal_state(&mid).unwrap().unwrap();
    assert!(st.needs_recovery && st.needs_replay(), "{st}");
    assert!(st.features.contains(&"journal_checksum_v3"), "{st}");
    h.unmount();
    let done = h.crash(0, CrashPolicy::lose_all());
    let st = recovery::journal_state(&done).unwrap().unwrap();
    assert!(!st.needs_recovery && !st.needs_replay(), "{st}");
    assert_eq!(Harness::block_of(&done, FREE + 2)[0], 4);
    let path = dir.path().join("clean.img");
    std::fs::write(&path, done.to_image()).unwrap();
    assert_fsck_clean(&path);
}

#[test]
fn ordo_journal_is_replayed_by_e2fsck_and_the_kernel_like_ordo() {
    if !have("mkfs.ext4") {
        return;
    }
    for bs in [4096u32, 1024] {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("o.img");
        mkfs(&img, "64M", bs, &[]);
        let free = if bs == 4096 { FREE } else { 40000 };
        let mut h = Harness::new(&img, DataMode::Journal);
        for r in 0..5u8 {
            h.meta(&[free + r as u64, free + 10], r + 1);
            h.meta_with_magic(free + 11);
            h.data(free + 20 + r as u64, 0xD0 + r, true);
            h.fsync();
        }
        h.free(free + 2);
        h.fsync();
        // Crash with everything since the last flush lost: the journal is
        // live and the home blocks were never written.
        let crashed = h.crash(0, CrashPolicy::lose_all());
        let path = dir.path().join("crashed.img");
        std::fs::write(&path, crashed.to_image()).unwrap();
        let (ordo, e2) = recover_both(&path, dir.path());
        assert_eq!(read_block(&ordo, free + 10, bs)[0], 5);
        assert_eq!(
            read_block(&ordo, free + 11, bs)[..4],
            0xC03B_3998u32.to_be_bytes()
        );
        assert_same_as_e2fsck(&ordo, &e2);
        assert_fsck_clean(&ordo);
        if let Some(ctx) = LoopCtx::new() {
            let kernel = dir.path().join("by-kernel.img");
            std::fs::copy(&path, &kernel).unwrap();
            ctx.mount_and_unmount(&kernel);
            for b in (free..free + 12).chain(free + 20..free + 25) {
                assert_eq!(
                    read_block(&kernel, b, bs),
                    read_block(&ordo, b, bs),
                    "block {b} after the kernel's replay"
                );
            }
            assert_fsck_clean(&kernel);
        }
        let _ = crashed.block_size();
    }
}

#[test]
fn a_transaction_commits_at_its_size_bound() {
    if !have("mkfs.ext4") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("s.img");
    mkfs(&img, "16M", 1024, &[]);
    let mut h = Harness::new(&img, DataMode::Ordered);
    // A quarter of the 1023-block log is 255 blocks: 20 handles of 20
    // blocks cross it once, with no fsync and no timer.
    for i in 0..20u64 {
        let blocks: Vec<u64> = (0..20).map(|k| 12000 + i * 20 + k).collect();
        h.meta(&blocks, 1);
    }
    assert_eq!(h.stat("commits"), 1, "{:?}", h.proto.stats());
    let dev = h.crash_and_recover(0, CrashPolicy::keep_all());
    let replayed = (12000..12400u64)
        .filter(|&b| Harness::block_of(&dev, b)[0] == 1)
        .count();
    assert!(
        replayed > 200 && replayed % 20 == 0,
        "whole handles: {replayed}"
    );
}
