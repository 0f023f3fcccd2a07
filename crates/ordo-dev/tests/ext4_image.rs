//! A real ext4 image (made by mkfs.ext4) survives the trip file -> memory ->
//! overlay -> materialized file bit for bit, and e2fsck agrees it is clean:
//! the path the crash explorer takes for every state.
//!
//! Needs e2fsprogs; where `mkfs.ext4` is missing the test says so and passes.

use std::process::Command;
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, FileDevice, MemDevice, OpenOptions, OverlayDevice};

#[test]
fn mkfs_image_round_trips_through_memory_and_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ext4.img");
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .arg(&img)
        .arg("32M")
        .status();
    match made {
        Ok(s) if s.success() => {}
        other => {
            eprintln!("mkfs.ext4 unavailable ({other:?}); test skipped");
            return;
        }
    }
    let original = std::fs::read(&img).unwrap();
    let file = FileDevice::open(&img, 4096, OpenOptions::read_only()).unwrap();
    let mem = Arc::new(MemDevice::load(&file).unwrap());
    assert_eq!(mem.to_image(), original);
    assert!(file.counters().class(BlockClass::Other).reads > 0);
    drop(file);

    let state = OverlayDevice::over_mem(mem.clone());
    let out = dir.path().join("state.img");
    state.materialize_to_file(&out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), original);
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );

    // Corrupt the primary superblock magic in the overlay only: e2fsck must
    // notice, and the shared base must not change.
    let mut sb = vec![0u8; 4096];
    state.read(0, &mut sb, BlockClass::Super).unwrap();
    sb[1024 + 0x38] ^= 0xff;
    state.put(0, &sb).unwrap();
    state.materialize_to_file(&out).unwrap();
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        !fsck.status.success(),
        "a corrupted superblock is not clean"
    );
    assert_eq!(mem.to_image(), original);
}
