//! The test-only fault `ORDO_FAULT=commit_no_flush` (the commit block
//! written without the flush before it) breaks fsync promises in crash
//! states the write-cache model produces, and without it none breaks:
//! proof that the checks on the journal protocol can fail. A test binary
//! of its own, because the fault is read from the environment when the
//! protocol is built.

mod journal_common;

use journal_common::harness::Harness;
use journal_common::*;

use ordo_dev::CrashPolicy;
use ordo_fs::protocol::DataMode;

fn broken_promises(fault: bool) -> usize {
    if fault {
        std::env::set_var("ORDO_FAULT", "commit_no_flush");
    } else {
        std::env::remove_var("ORDO_FAULT");
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("f.img");
    mkfs(&img, "64M", 4096, &[]);
    let mut h = Harness::new(&img, DataMode::Ordered);
    let mut broken = 0;
    for round in 0..4u8 {
        h.meta(&[9000, 9001 + round as u64], round + 1);
        h.data(9100 + round as u64, 0xE0 + round, true);
        h.fsync();
        for seed in 0..16 {
            for p in [CrashPolicy::lose_all(), CrashPolicy::default()] {
                let dev = h.crash_and_recover(seed, p);
                if h.check_promises(&dev, true).is_err() {
                    broken += 1;
                }
            }
        }
    }
    std::env::remove_var("ORDO_FAULT");
    broken
}

#[test]
fn commit_without_flush_is_caught() {
    if !have("mkfs.ext4") {
        return;
    }
    assert_eq!(
        broken_promises(false),
        0,
        "the correct protocol keeps every promise"
    );
    assert!(broken_promises(true) > 0, "the fault must break a promise");
}
