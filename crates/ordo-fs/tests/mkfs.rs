//! `ordo mkfs` images checked by the reference tools: `e2fsck -fn` must find
//! nothing to fix for every size and feature set, and the Linux kernel must
//! mount the result read-write and leave it clean.

use std::path::{Path, PathBuf};
use std::process::Command;

use ordo_dev::FileDevice;
use ordo_format::Superblock;
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, MkfsReport, DEFAULT_FEATURES};

const MIB: u64 = 1024 * 1024;

fn image(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

fn make(path: &Path, size_bytes: u64, block_size: u32, features: &str) -> MkfsReport {
    let opts = MkfsOptions {
        size_bytes,
        block_size,
        features: parse_features(features, DEFAULT_FEATURES).unwrap(),
        label: "ordo-test".into(),
        ..MkfsOptions::default()
    };
    make_with(path, &opts)
}

fn make_with(path: &Path, opts: &MkfsOptions) -> MkfsReport {
    let dev = FileDevice::create(path, opts.size_bytes, opts.block_size).unwrap();
    mkfs(&dev, opts).unwrap_or_else(|e| panic!("mkfs {opts:?}: {e}"))
}

/// `e2fsck -fn` must exit 0 (clean, nothing changed).
fn assert_fsck_clean(path: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(path)
        .output()
        .expect("e2fsck must be installed (e2fsprogs)");
    assert_eq!(
        out.status.code(),
        Some(0),
        "e2fsck -fn {} is not clean:\n{}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Decode the primary superblock and check the report matches it.
fn check_superblock(path: &Path, r: &MkfsReport) -> Superblock {
    let bytes = std::fs::read(path).unwrap();
    let sb = Superblock::decode(&bytes[1024..2048]).unwrap();
    assert_eq!(sb.blocks_count, r.blocks_count);
    assert_eq!(sb.inodes_count, r.inodes_count);
    assert_eq!(sb.free_blocks_count, r.free_blocks);
    assert_eq!(sb.free_inodes_count, r.free_inodes);
    assert_eq!(sb.groups_count(), r.groups_count);
    assert_eq!(sb.label(), "ordo-test");
    assert!(sb.features.unsupported_for_write().is_empty());
    sb
}

fn check(name: &str, size_bytes: u64, block_size: u32, features: &str) -> Superblock {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, name);
    let r = make(&path, size_bytes, block_size, features);
    assert_fsck_clean(&path);
    check_superblock(&path, &r)
}

#[test]
fn eight_mib_1k_blocks() {
    let sb = check("8m-1k.img", 8 * MIB, 1024, "");
    assert_eq!(sb.first_data_block, 1);
    assert_eq!(sb.groups_count(), 1);
}

#[test]
fn eight_mib_4k_blocks() {
    let sb = check("8m-4k.img", 8 * MIB, 4096, "");
    assert_eq!(sb.first_data_block, 0);
}

#[test]
fn sixty_four_mib_default() {
    let sb = check("64m.img", 64 * MIB, 4096, "");
    assert!(sb.has_metadata_csum() && sb.has_64bit() && sb.has_flex_bg());
}

#[test]
fn sixty_four_mib_1k_blocks_many_groups() {
    let sb = check("64m-1k.img", 64 * MIB, 1024, "");
    assert_eq!(sb.groups_count(), 8);
}

#[test]
fn small_groups() {
    // mke2fs -g: 16 MiB of 4 KiB blocks in groups of 1024 and of 256
    // blocks (the crash explorer's multi-group images), with and without
    // flex_bg and a journal.
    for (bpg, features, groups) in [
        (1024u32, "", 4u64),
        (256, "", 16),
        (256, "has_journal", 16),
        (1024, "^flex_bg", 4),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = image(&dir, "groups.img");
        let opts = MkfsOptions {
            size_bytes: 16 * MIB,
            block_size: 4096,
            features: parse_features(features, DEFAULT_FEATURES).unwrap(),
            label: "ordo-test".into(),
            blocks_per_group: Some(bpg),
            journal_blocks: Some(1024),
            ..MkfsOptions::default()
        };
        let r = make_with(&path, &opts);
        assert_fsck_clean(&path);
        let sb = check_superblock(&path, &r);
        assert_eq!(sb.blocks_per_group, bpg);
        assert_eq!(sb.groups_count(), groups, "{bpg} {features}");
    }
}

#[test]
fn bad_blocks_per_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "bad.img");
    for bpg in [0u32, 100, 1020, 255, 32768 + 8, 65536] {
        let dev = FileDevice::create(&path, 16 * MIB, 4096).unwrap();
        let opts = MkfsOptions {
            size_bytes: 16 * MIB,
            blocks_per_group: Some(bpg),
            ..MkfsOptions::default()
        };
        let e = mkfs(&dev, &opts).expect_err("a bad group size");
        assert_eq!(e.errno(), libc::EINVAL, "{bpg}: {e}");
        assert!(e.to_string().contains("blocks per group"), "{e}");
    }
}

#[test]
fn one_gib_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "1g.img");
    let opts = MkfsOptions {
        size_bytes: 1024 * MIB,
        label: "ordo-test".into(),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    let r = make_with(&path, &opts);
    assert_fsck_clean(&path);
    check_superblock(&path, &r);
    assert_eq!(r.groups_count, 8);
    // Sparse: far less than the file size is allocated.
    let used_bytes = std::fs::metadata(&path).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    });
    assert!(used_bytes.unwrap() < 64 * MIB, "image is not sparse");
}

#[test]
fn short_last_group() {
    // 33280 blocks of 4 KiB: one full group and a 512-block last group.
    let sb = check("short.img", 130 * MIB, 4096, "");
    assert_eq!(sb.groups_count(), 2);
    assert_eq!(sb.blocks_in_group(1), 512);
}

#[test]
fn tiny_last_group_is_dropped() {
    // 8192 + 20 blocks of 1 KiB: a 20-block last group is not worth keeping.
    let sb = check("tiny-last.img", (8192 + 1 + 20) * 1024, 1024, "");
    assert_eq!(sb.groups_count(), 1);
    assert_eq!(sb.blocks_count, 8193);
}

#[test]
fn without_metadata_csum() {
    let sb = check("nocsum.img", 64 * MIB, 4096, "^metadata_csum");
    assert!(!sb.has_group_csum());
}

#[test]
fn uninit_bg_instead_of_metadata_csum() {
    let sb = check("crc16.img", 64 * MIB, 1024, "^metadata_csum,uninit_bg");
    assert!(sb.has_gdt_csum());
}

#[test]
fn without_64bit() {
    let sb = check("no64.img", 64 * MIB, 4096, "^64bit");
    assert_eq!(sb.desc_size(), 32);
}

#[test]
fn without_flex_bg() {
    check("noflex.img", 64 * MIB, 1024, "^flex_bg");
    check("noflex4k.img", 200 * MIB, 4096, "^flex_bg");
}

#[test]
fn ext2_style_block_maps() {
    check(
        "ext2.img",
        32 * MIB,
        1024,
        "^extent,^64bit,^flex_bg,^metadata_csum,^huge_file,^dir_nlink",
    );
}

#[test]
fn csum_seed_and_small_inodes() {
    check("seed.img", 16 * MIB, 4096, "metadata_csum_seed");
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "i128.img");
    let opts = MkfsOptions {
        size_bytes: 16 * MIB,
        inode_size: 128,
        label: "ordo-test".into(),
        ..MkfsOptions::default()
    };
    let r = make_with(&path, &opts);
    assert_fsck_clean(&path);
    assert_eq!(check_superblock(&path, &r).inode_size(), 128);
}

#[test]
fn with_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "journal.img");
    let r = make(&path, 64 * MIB, 4096, "has_journal");
    assert_eq!(r.journal_blocks, 1024);
    assert_fsck_clean(&path);
    let sb = check_superblock(&path, &r);
    assert_eq!(sb.journal_inum, 8);
}

#[test]
fn journal_with_extent_leaf() {
    // 140,000 blocks of 1 KiB: five extents, more than the inode holds, so
    // the journal inode gets a checksummed extent leaf block.
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "bigjournal.img");
    let opts = MkfsOptions {
        size_bytes: 300 * MIB,
        block_size: 1024,
        features: parse_features("has_journal", DEFAULT_FEATURES).unwrap(),
        journal_blocks: Some(140_000),
        label: "ordo-test".into(),
        ..MkfsOptions::default()
    };
    let r = make_with(&path, &opts);
    assert_eq!(r.journal_blocks, 140_000);
    assert_fsck_clean(&path);
    check_superblock(&path, &r);
}

#[test]
fn size_and_block_size_sweep() {
    // Odd sizes around group boundaries, every block size, with and without
    // flex_bg: all e2fsck-clean.
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for bs in [1024u32, 2048, 4096] {
        let bpg_bytes = 8 * u64::from(bs) * u64::from(bs);
        for size in [
            MIB,
            3 * MIB + 5 * u64::from(bs),
            bpg_bytes - u64::from(bs),
            bpg_bytes + 300 * u64::from(bs),
            5 * bpg_bytes / 2,
        ] {
            for features in ["", "^flex_bg", "^metadata_csum,uninit_bg,^64bit"] {
                let path = image(&dir, &format!("sweep-{n}.img"));
                n += 1;
                let r = make(&path, size, bs, features);
                assert_fsck_clean(&path);
                check_superblock(&path, &r);
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
}

#[test]
fn tiny_devices_fail_cleanly_or_are_clean() {
    // Each tiny size either is refused with an error or makes a clean file
    // system; never a panic, never a broken image.
    let dir = tempfile::tempdir().unwrap();
    let mut refused = 0;
    for blocks in [1u64, 2, 8, 20, 40, 64, 100] {
        let path = image(&dir, &format!("small-{blocks}.img"));
        let opts = MkfsOptions {
            size_bytes: blocks * 1024,
            block_size: 1024,
            ..MkfsOptions::default()
        };
        let dev = FileDevice::create(&path, opts.size_bytes, 1024).unwrap();
        match mkfs(&dev, &opts) {
            Ok(_) => assert_fsck_clean(&path),
            Err(_) => refused += 1,
        }
    }
    assert!(refused >= 3, "1, 2 and 8 blocks cannot hold a file system");
}

#[test]
fn mkfs_over_old_contents_is_clean() {
    // A device full of stale bytes (here: pseudo-random) must come out clean:
    // mkfs may not rely on zeros it did not write.
    let dir = tempfile::tempdir().unwrap();
    for (bs, features) in [(4096u32, "has_journal"), (1024, "^flex_bg")] {
        let path = image(&dir, &format!("dirty-{bs}.img"));
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let junk: Vec<u8> = (0..32 * MIB)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(&path, junk).unwrap();
        let r = make(&path, 32 * MIB, bs, features);
        assert_fsck_clean(&path);
        check_superblock(&path, &r);
    }
}

#[test]
fn unknown_and_unsupported_features_are_refused() {
    let e = parse_features("frobnicate", DEFAULT_FEATURES).unwrap_err();
    assert!(e.to_string().contains("frobnicate"));
    let dir = tempfile::tempdir().unwrap();
    let path = image(&dir, "refused.img");
    let opts = MkfsOptions {
        size_bytes: 8 * MIB,
        features: parse_features("inline_data", DEFAULT_FEATURES).unwrap(),
        ..MkfsOptions::default()
    };
    let dev = FileDevice::create(&path, opts.size_bytes, 4096).unwrap();
    let e = mkfs(&dev, &opts).unwrap_err();
    assert!(e.to_string().contains("inline_data"), "{e}");
}

#[test]
fn fixed_identity_gives_identical_images() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MkfsOptions {
        size_bytes: 16 * MIB,
        uuid: Some([7; 16]),
        hash_seed: Some([9; 16]),
        time_sec: Some(1_700_000_000),
        ..MkfsOptions::default()
    };
    let a = image(&dir, "a.img");
    let b = image(&dir, "b.img");
    make_with(&a, &opts);
    make_with(&b, &opts);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

/// Attach an image to a loop device, undone on drop.
struct Loop {
    dev: String,
    mnt: Option<PathBuf>,
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(m) = &self.mnt {
            let _ = Command::new("umount").arg(m).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn kernel_mounts_read_write_and_stays_clean() {
    assert!(
        is_root(),
        "this test loop-mounts images with the kernel and must run as root"
    );
    for (name, bs, features) in [
        ("k-default.img", 4096u32, ""),
        ("k-1k.img", 1024, ""),
        ("k-journal.img", 4096, "has_journal"),
        ("k-nocsum.img", 4096, "^metadata_csum,^64bit,^flex_bg"),
        ("k-groups.img", 4096, "groups"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = image(&dir, name);
        if features == "groups" {
            make_with(
                &path,
                &MkfsOptions {
                    size_bytes: 64 * MIB,
                    block_size: bs,
                    label: "ordo-test".into(),
                    blocks_per_group: Some(1024),
                    ..MkfsOptions::default()
                },
            );
        } else {
            make(&path, 64 * MIB, bs, features);
        }
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lo = Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            mnt: None,
        };
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let st = Command::new("mount")
            .args(["-t", "ext4", "-o", "rw", &lo.dev])
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{name}: kernel refused to mount: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        lo.mnt = Some(mnt.clone());
        assert!(mnt.join("lost+found").is_dir());
        std::fs::write(mnt.join("hello.txt"), vec![b'x'; 100_000]).unwrap();
        std::fs::create_dir(mnt.join("sub")).unwrap();
        std::fs::write(mnt.join("sub/inner"), b"inner").unwrap();
        let st = Command::new("umount").arg(&mnt).status().unwrap();
        assert!(st.success(), "{name}: umount failed");
        lo.mnt = None;
        drop(lo);
        assert_fsck_clean(&path);
    }
}
