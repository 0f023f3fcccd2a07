//! Regression tests of ordo's fast-commit replay, each on a crash the
//! random workload found (issue 12), cut down to the operations that still
//! failed before the fix. Every crash state of each scenario is replayed
//! and checked by ordo's fsck and by `e2fsck -fn`; before the fixes a
//! few states of each were left with a wrong block bitmap.

use ordo_crash::explore::{explore, E2fsckPolicy, ExploreParams};
use ordo_fs::ProtocolKind;

fn explore_scenario(name: &str, text: &str) -> ordo_crash::report::Report {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.scenario"));
    std::fs::write(&path, text).unwrap();
    let mut p = ExploreParams::new(ProtocolKind::named("fast_commit"), path.to_str().unwrap());
    p.e2fsck = E2fsckPolicy::Every;
    p.minimize_max = 0;
    let r = explore(&p).unwrap();
    println!("{}", r.summary(5));
    r
}

fn assert_clean(name: &str, text: &str) {
    let r = explore_scenario(name, text);
    assert!(r.checked > 20, "{name}: only {} states checked", r.checked);
    assert_eq!(r.inconsistent, 0, "{name}: {}", r.summary(5));
    assert!(r.failures.is_empty(), "{name}: {}", r.summary(5));
}

/// `ordo crash --mode fast_commit --workload random --seed 1029
/// --random-ops 400`, sequence 0, cut down. A fast commit adds a fifth
/// extent to `/A/foo` (its inode's root holds four), so the replay gives
/// the file an extent-tree leaf; a later UNLINK of the log removes the
/// file's last name. The rebuild freed only the blocks the inode owned
/// before the replay, and the leaf was not one of them: a block marked in
/// use that no file uses ("free but marked", e2fsck's "Block bitmap
/// differences: -N"). In the full run the slot is then reused by a CREAT,
/// whose INODE record resets the extent root and drops the leaf the same
/// way.
const SEED_1029_DROPPED_TREE_LEAF: &str = r"mkdir /A
mkdir /B
mkdir /C
mkdir /B/sub
creat /A/foo
creat /A/bar
creat /B/sub/x
creat /foo
---
creat /B/f1
link /A/bar /C/f2
mkdir /A/d1
rmdir /A/d1
mkdir /A/d1
mkdir /B/d2
rename /A/foo /B/f2
rmdir /B/d2
rmdir /A/d1
symlink /B/sub/foo /B/sub/foo
mkdir /A/d1
sync
rename /B/sub/foo /B/sub/bar
rmdir /A/d1
creat /A/foo
rename /C/f2 /B/sub/bar
mkdir /B/d2
append /B/sub/bar 8256
fsync /A/foo
write /A/foo 0 8192
mkdir /A/d1
write /A/foo 16384 12288
punch /A/foo 20480 4096
link /A/foo /B/sub/foo
rmdir /A/d1
mkdir /A/d1
sync
unlink /B/sub/foo
write /A/foo 25010 5146
fdatasync /B/sub/bar
unlink /A/foo
fsync /B/f1
";

/// `ordo crash --mode fast_commit --workload random --seed 1194
/// --random-ops 400`, sequence 1, cut down. The last fast commit
/// truncates `/A/bar`, which frees its extent-tree leaf while the tags
/// run, then grows `/C/foo` past its root's four extents, and the replay
/// takes the block just freed for `/C/foo`'s new leaf. The rebuild went
/// inode by inode: `/C/foo`'s blocks were marked in use, then the blocks
/// `/A/bar` no longer maps were freed, the shared one among them: a block
/// in use that the bitmap calls free ("in use but free", the next
/// allocation would hand it out twice).
const SEED_1194_REUSED_TREE_LEAF: &str = r"mkdir /A
mkdir /B
mkdir /C
mkdir /B/sub
creat /A/foo
write /A/foo 0 8192
creat /A/bar
creat /B/sub/x
creat /foo
write /foo 0 16384
---
creat /B/sub/foo
rename /B/sub/foo /B/sub/f1
rename /A/bar /A/f2
symlink /C/foo /C/bar
creat /C/f1
unlink /A/foo
creat /B/sub/f2
mkdir /B/d0
rmdir /B/d0
fdatasync /B/sub/f2
creat /B/foo
unlink /C/f1
rename /C/bar /B/sub/f2
mkdir /B/d0
creat /C/f1
falloc /B/foo 16384 8192
link /B/sub/f1 /C/bar
mkdir /A/d2
rename /B/foo /B/f1
symlink /B/foo /B/sub/bar
falloc /B/f1 24576 8192 keep_size
rmdir /A/d2
mkdir /A/d2
rename /B/f1 /B/sub/f1
rename /B/sub/f1 /A/bar
unlink /B/sub/bar
rename /A/f2 /A/foo
append /A/bar 676
write /A/bar 8192 8192
write /C/f1 12288 8192
unlink /C/bar
creat /A/f2
link /A/f2 /B/sub/bar
rmdir /A/d2
sync
write /B/sub/bar 0 12288
rename /B/sub/bar /C/foo
unlink /C/f1
creat /B/sub/bar
sync
truncate /A/bar 1438
write /C/foo 16384 12288
fsync /B/sub/bar
";

#[test]
fn replay_frees_a_tree_leaf_it_allocated_then_dropped() {
    assert_clean("seed1029", SEED_1029_DROPPED_TREE_LEAF);
}

#[test]
fn replay_never_frees_a_block_another_inode_took() {
    assert_clean("seed1194", SEED_1194_REUSED_TREE_LEAF);
}
