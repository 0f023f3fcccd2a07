//! A read leaves the core's lock to read file data from the device
//! (`Fs::read`). If the file loses a block meanwhile and another file gets
//! it and writes it, the device holds a stranger's bytes: the read must
//! notice (a block was freed while it was out) and read again under the
//! lock, never return them.

use std::sync::Arc;

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, SetAttr, ROOT_INO};

const LEN: usize = 64 * 1024;

fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(4096, 8192).unwrap());
    let features = parse_features("", DEFAULT_FEATURES).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features,
        uuid: Some(*b"ordo-read-race!!"),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).unwrap();
    dev
}

fn opts() -> MountOptions {
    MountOptions {
        mode: ProtocolKind::named("async"),
        ..MountOptions::default()
    }
}

/// Device blocks whose every byte is `b`.
fn blocks_full_of(dev: &MemDevice, b: u8) -> Vec<u64> {
    (0..dev.block_count())
        .filter(|&n| dev.block(n).is_some_and(|d| d.iter().all(|&x| x == b)))
        .collect()
}

#[test]
fn a_read_racing_a_free_and_reuse_never_returns_the_new_owners_bytes() {
    race(false);
}

/// The same race through `Fs::read_into`, which fills a caller's buffer
/// (FUSE over io_uring lends the request's own) holding stale bytes.
#[test]
fn a_read_into_a_lent_buffer_racing_a_free_and_reuse_never_returns_them() {
    race(true);
}

fn race(lent: bool) {
    let dev = image();
    let c = Creds::root();
    {
        let fs = Fs::mount(dev.clone(), opts()).unwrap();
        let x = fs
            .create(ROOT_INO, b"x", FileType::Regular, 0o644, 0, &c)
            .unwrap();
        fs.write(x.ino, 0, &[0xaa; LEN]).unwrap();
        fs.unmount().unwrap();
    }
    let old = blocks_full_of(&dev, 0xaa);
    assert_eq!(old.len(), LEN / 4096, "x's blocks are on the device");

    // A fresh mount: nothing cached, so the read of x goes to the device
    // after the lock is released; meanwhile x is truncated and y takes
    // (some of) its blocks and writes them.
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let x = fs.lookup(ROOT_INO, b"x").unwrap().ino;
    let meanwhile = || {
        fs.setattr(
            x,
            &SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        )
        .unwrap();
        fs.sync().unwrap();
        let y = fs
            .create(ROOT_INO, b"y", FileType::Regular, 0o644, 0, &c)
            .unwrap();
        fs.write(y.ino, 0, &[0x55; LEN]).unwrap();
        fs.fsync(y.ino, false).unwrap();
    };
    let got = if lent {
        let mut buf = vec![0x11; LEN];
        let n = fs
            .read_into_unlocked_then(x, 0, &mut buf, meanwhile)
            .unwrap();
        buf.truncate(n);
        buf
    } else {
        fs.read_unlocked_then(x, 0, LEN as u32, meanwhile).unwrap()
    };
    let reused = old
        .iter()
        .filter(|&&b| dev.block(b).is_some_and(|d| d.iter().all(|&v| v == 0x55)))
        .count();
    assert!(
        reused > 0,
        "the race did not happen: y took none of x's blocks (the test proves nothing)"
    );
    assert!(
        !got.contains(&0x55),
        "the read returned bytes of another file ({reused} of x's blocks were reused)"
    );
    // x was emptied before the read looked again.
    assert!(got.is_empty() || got.iter().all(|&v| v == 0xaa));
    fs.unmount().unwrap();
}
