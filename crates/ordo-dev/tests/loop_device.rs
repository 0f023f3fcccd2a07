//! `FileDevice` on a real block device: a loop device over a temp file.
//!
//! Needs root and `losetup`; where either is missing the test says so and
//! passes without checking anything (CI containers without loop devices).

use ordo_dev::{
    BlockClass, BlockDevice, DevError, FileDevice, LoopDevice, OpenOptions, WriteFlags,
};

fn attach(backing: &std::path::Path) -> Option<LoopDevice> {
    match LoopDevice::attach(backing, false) {
        Ok(lo) => Some(lo),
        Err(e) => {
            eprintln!("{e}; loop-device test skipped");
            None
        }
    }
}

#[test]
fn file_device_on_a_loop_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    let size_bytes: u64 = 16 << 20;
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(size_bytes)
        .unwrap();
    let Some(lo) = attach(&backing) else { return };

    let dev = FileDevice::open(lo.path(), 4096, OpenOptions::default()).unwrap();
    assert!(dev.is_block_device());
    assert_eq!(
        dev.block_count(),
        size_bytes / 4096,
        "size from BLKGETSIZE64"
    );

    let e = FileDevice::open(lo.path(), 4096, OpenOptions::default()).unwrap_err();
    assert!(matches!(e, DevError::InUse { .. }), "{e}");

    let data: Vec<u8> = (0..2 * 4096u32).map(|i| (i * 7 % 253) as u8).collect();
    let t1 = dev
        .write(10, &data, WriteFlags::new(BlockClass::Data))
        .unwrap();
    assert_eq!(dev.durable(), 0);
    dev.flush().unwrap();
    assert_eq!(dev.durable(), t1);
    let t2 = dev
        .write(20, &data[..4096], WriteFlags::fua(BlockClass::Journal))
        .unwrap();
    assert_eq!(dev.durable(), t2);

    let mut buf = vec![0u8; 2 * 4096];
    dev.read(10, &mut buf, BlockClass::Data).unwrap();
    assert_eq!(buf, data);
    let c = dev.counters();
    assert_eq!(c.class(BlockClass::Data).writes, 1);
    assert_eq!(c.class(BlockClass::Journal).fua_writes, 1);
    assert_eq!(c.flushes, 1);
    drop(dev);

    // The writes went through the loop device into the backing file.
    let img = std::fs::read(&backing).unwrap();
    assert_eq!(&img[10 * 4096..12 * 4096], &data[..]);
    assert_eq!(&img[20 * 4096..21 * 4096], &data[..4096]);

    // O_DIRECT on the block device, with buffers the device layer realigns.
    let direct = FileDevice::open(
        lo.path(),
        4096,
        OpenOptions {
            direct: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let mut odd = vec![0u8; 4096 + 3];
    direct.read(10, &mut odd[3..], BlockClass::Data).unwrap();
    assert_eq!(&odd[3..], &data[..4096]);
    direct
        .write(30, &odd[3..], WriteFlags::fua(BlockClass::Data))
        .unwrap();
    let mut back = vec![0u8; 4096];
    direct.read(30, &mut back, BlockClass::Data).unwrap();
    assert_eq!(back, data[..4096]);
}

/// `KernelMount::mount_temp`: the kernel mounts the image on a directory
/// of its own, which goes with the mount (unmounted explicitly or
/// dropped); a refused mount leaves neither a directory nor a device.
#[test]
fn kernel_mount_on_a_temporary_directory() {
    use ordo_dev::KernelMount;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ext4.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    // mkfs before the probe: a loop device just detached may still hold
    // the file for a moment, and mke2fs refuses a file in use.
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        mkfs.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&mkfs.stderr)
    );
    // A loop device is needed for what follows; without one, say so.
    let Some(probe) = attach(&img) else { return };
    drop(probe);

    let m = KernelMount::mount_temp(&img, "").unwrap();
    let mnt = m.mountpoint().to_path_buf();
    assert!(mnt.starts_with(std::env::temp_dir()), "{}", mnt.display());
    std::fs::write(mnt.join("f"), b"kept").unwrap();
    m.unmount().unwrap();
    assert!(!mnt.exists(), "{} outlived its unmount", mnt.display());

    let m = KernelMount::mount_temp(&img, "ro").unwrap();
    let mnt = m.mountpoint().to_path_buf();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"kept");
    drop(m);
    assert!(!mnt.exists(), "{} outlived its drop", mnt.display());

    // Not an ext4 image: a clear error naming the image.
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0x5a; 1 << 20]).unwrap();
    let e = KernelMount::mount_temp(&junk, "ro").unwrap_err();
    assert!(matches!(e, DevError::Command { .. }), "{e}");
    assert!(e.to_string().contains("junk.img"), "{e}");
}
