//! `ordo mount` serves its block images from the pool of slots faulted in
//! ahead (`image_pool`): the images of the data a mount caches come from
//! it, the files read back whole after a remount, and `ordo info` and the
//! mount's last words report the counts.

mod common;

use std::fs;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// The `ordo info` of `path`, once it shows a pool that served at least
/// `served` images (the mount refreshes its figures about once a second).
fn info_with_pool(path: &Path, served: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = ordo(&["info", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if pool_figures(&text).is_some_and(|(s, _)| s >= served) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "ordo info never showed {served} images served by the pool:\n{text}"
        );
        sleep(Duration::from_millis(200));
    }
}

/// Images served by the pool and by the system allocator, from the pool's
/// line of `text`.
fn pool_figures(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.contains("block-image pool:"))?;
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    Some((nums[0], nums[1]))
}

fn content(i: usize) -> Vec<u8> {
    (0..16384).map(|k| (i * 131 + k * 7 % 251) as u8).collect()
}

#[test]
fn a_mounts_data_blocks_come_from_the_pool_and_read_back_whole() {
    require_mount_privileges();
    let s = Scratch::new();
    std::env::set_var("ORDO_RUN_DIR", s.path("run"));
    let image = s.path("img");
    mkfs(&image, "128M");
    let mp = s.mkdir("mnt");
    const FILES: usize = 300;
    // 300 files of four 4 KiB blocks: 1,200 data blocks, beyond the 256
    // slots (1 MiB) a 16 MiB cache keeps ready, so the refiller must
    // restock while they are written.
    let m = OrdoMount::start(&image, &mp, "mode=journal,cache=16M,commit=600");
    for i in 0..FILES {
        fs::write(mp.join(format!("f{i}")), content(i)).unwrap();
    }
    let live = info_with_pool(&mp, (FILES * 4) as u64);
    let (served, missed) = pool_figures(&live).unwrap();
    // Only the images the refiller had no slot ready for go to the system
    // allocator: a few, not a share of the 1,200.
    assert!(
        missed * 10 < served,
        "the pool fell behind: {served} served, {missed} missed:\n{live}"
    );
    let (status, err) = m.stop();
    assert!(status.success(), "ordo mount exited with {status}: {err}");
    assert!(
        err.contains("block-image pool:"),
        "ordo mount's last words name the pool: {err}"
    );
    let ended =
        String::from_utf8_lossy(&ordo(&["info", image.to_str().unwrap()]).stdout).into_owned();
    assert!(
        pool_figures(&ended).is_some_and(|(s, _)| s >= served),
        "{ended}"
    );

    // Remounted, every byte is the one written (read from the device into
    // pool slots this time).
    let m = OrdoMount::start(&image, &mp, "mode=journal,cache=16M");
    for i in 0..FILES {
        let got = fs::read(mp.join(format!("f{i}"))).unwrap();
        assert!(got == content(i), "f{i} reads back changed");
    }
    m.stop_ok();
    assert_e2fsck_clean(&image);
}
