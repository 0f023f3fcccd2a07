//! The allocators start a scan for a free bit at the group's used front
//! (every bit below it in use) rather than at the goal. What they pick must
//! not change: freed inodes and blocks below the front are found again,
//! first fit, while the front is warm, and after a remount.

mod core_common;

use std::path::Path;
use std::process::Command;

use core_common::*;
use ordo_fs::{Fs, ProtocolKind, ROOT_INO};

/// `debugfs -R REQUEST` on the image, its standard output.
fn debugfs(img: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(img)
        .output()
        .expect("run debugfs");
    assert!(out.status.success(), "debugfs {request} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The physical blocks of file `name` in the root directory.
fn blocks(img: &Path, name: &str) -> Vec<u64> {
    debugfs(img, &format!("blocks /{name}"))
        .split_whitespace()
        .map(|w| w.parse().expect("a block number"))
        .collect()
}

fn make(fs: &Fs, name: &str, bytes: usize) -> u32 {
    create_file(fs, name, &vec![0x5a; bytes])
}

#[test]
fn freed_inodes_and_blocks_below_a_warm_front_are_taken_first() {
    if !have("mkfs.ext4") || !have("debugfs") {
        // CI installs them (scripts/deps.sh): there a missing one fails.
        assert!(
            std::env::var("CI").is_err(),
            "CI: mkfs.ext4 or debugfs is missing"
        );
        eprintln!("skipped: mkfs.ext4 or debugfs missing");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 64, 4096, "^has_journal");

    // 300 files of two blocks each, one after another in the root's group.
    let fs = mount(&img, ProtocolKind::named("async"));
    let inos: Vec<u32> = (0..300)
        .map(|i| make(&fs, &format!("f{i:03}"), 8192))
        .collect();
    fs.unmount().expect("unmount");
    let freed = ["f050", "f051", "f200"];
    let mut freed_blocks: Vec<u64> = freed.iter().flat_map(|n| blocks(&img, n)).collect();
    freed_blocks.sort_unstable();
    assert_eq!(freed_blocks.len(), 6);
    let last_block = blocks(&img, "f299")[1];

    // Warm the fronts past everything in use, then free in the middle.
    let fs = mount(&img, ProtocolKind::named("async"));
    let warm = make(&fs, "warm", 4096);
    assert_eq!(warm, inos[299] + 1, "the next inode after the last in use");
    for n in freed {
        fs.unlink(ROOT_INO, n.as_bytes()).expect("unlink");
    }
    // One block each: the freed blocks in order, then the first past
    // `warm`'s; the freed inodes in order, then the first past `warm`.
    let new: Vec<u32> = (0..8).map(|i| make(&fs, &format!("g{i}"), 4096)).collect();
    fs.unmount().expect("unmount");
    assert_fsck_clean(&img);

    let mut want_inos = vec![inos[50], inos[51], inos[200]];
    want_inos.extend([warm + 1, warm + 2, warm + 3, warm + 4, warm + 5]);
    assert_eq!(new, want_inos);
    let warm_block = blocks(&img, "warm")[0];
    assert!(warm_block > last_block);
    let got: Vec<u64> = (0..8).map(|i| blocks(&img, &format!("g{i}"))[0]).collect();
    let mut want = freed_blocks.clone();
    want.extend([warm_block + 1, warm_block + 2]);
    assert_eq!(got, want);
}
