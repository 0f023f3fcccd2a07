//! ext4's time semantics for size changes, checked on the core itself: the
//! kernel stamps mtime and ctime on every `truncate()` (even to the current
//! size) and on every successful `fallocate` (even a hole punched past the
//! end of the file), inside the operation's own handle.

mod core_common;

use core_common::*;
use ordo_fs::{Creds, FallocFlags, FileType, ProtocolKind, SetAttr, TimeSet, Timespec, ROOT_INO};

/// A time far in the past, so that "stamped now" is unmistakable.
const OLD: Timespec = Timespec { sec: 1000, nsec: 0 };

fn age(fs: &ordo_fs::Fs, ino: ordo_fs::Ino) {
    let a = fs
        .setattr(
            ino,
            &SetAttr {
                mtime: Some(TimeSet::At(OLD)),
                ctime: Some(OLD),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((a.mtime, a.ctime), (OLD, OLD));
}

fn assert_stamped(fs: &ordo_fs::Fs, ino: ordo_fs::Ino, what: &str) {
    let a = fs.getattr(ino).unwrap();
    assert!(
        a.mtime.sec > OLD.sec,
        "{what}: mtime not set ({:?})",
        a.mtime
    );
    assert!(
        a.ctime.sec > OLD.sec,
        "{what}: ctime not set ({:?})",
        a.ctime
    );
}

#[test]
fn truncate_and_fallocate_stamp_mtime_and_ctime() {
    if !have("mkfs.ext4") {
        eprintln!("skipped: e2fsprogs not installed");
        return;
    }
    let (_dir, img) = scratch();
    mkfs(&img, 16, 4096, "^has_journal");
    let fs = mount(&img, ProtocolKind::named("async"));
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o644, 0, &Creds::root())
        .unwrap();
    fs.write(f.ino, 0, &[7u8; 10_000]).unwrap();

    age(&fs, f.ino);
    let set = SetAttr {
        size: Some(10_000),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(f.ino, &set).unwrap().size, 10_000);
    assert_stamped(&fs, f.ino, "truncate to the same size");

    age(&fs, f.ino);
    let punch = FallocFlags {
        punch_hole: true,
        zero_range: false,
        collapse_range: false,
        insert_range: false,
        keep_size: true,
    };
    fs.fallocate(f.ino, 1 << 20, 4096, punch).unwrap();
    assert_stamped(&fs, f.ino, "hole punched past EOF");

    age(&fs, f.ino);
    fs.fallocate(f.ino, 0, 4096, FallocFlags::default())
        .unwrap();
    assert_stamped(&fs, f.ino, "fallocate over allocated blocks");

    age(&fs, f.ino);
    let keep = FallocFlags {
        keep_size: true,
        punch_hole: false,
        zero_range: false,
        collapse_range: false,
        insert_range: false,
    };
    fs.fallocate(f.ino, 65536, 8192, keep).unwrap();
    assert_stamped(&fs, f.ino, "fallocate with KEEP_SIZE");
    assert_eq!(fs.getattr(f.ino).unwrap().size, 10_000);

    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}
