//! `ordo fsck` against `e2fsck -fn` over a corpus of corrupted images.
//!
//! Base images come from `mkfs.ext4` and from ordo's own mkfs, populated by
//! the kernel through a loop mount (files, directories, fast and slow
//! symlinks, hard links, a FIFO, a device node, a sparse file, unwritten
//! extents, a fragmented file with an extent tree block, and a directory
//! large enough to be an htree). Each case copies a base image, corrupts it
//! (targeted, or seeded random byte flips in metadata blocks), and asserts
//! that both checkers agree on clean versus not clean. A separate set of
//! images carries extended attributes set by the kernel (in inodes, in
//! blocks of their own and shared, ACLs in both), damaged entry by entry
//! and at random with checksums kept valid. Where ordo calls
//! every problem benign, the benign repair must leave an image that
//! `e2fsck -fn` passes; where it finds something unsafe, the repair must
//! not write a byte.
//!
//! Knobs for longer runs: `ORDO_FSCK_SEED` (random seed),
//! `ORDO_FSCK_RANDOM` (random cases per base, default 12), `ORDO_FSCK_BASE`
//! (random cases on one base only), `ORDO_FSCK_RANDOM_ONLY` (skip the
//! targeted cases).
//!
//! Intentional disagreements: none are expected. Four things are reported
//! without being errors, exactly as `e2fsck -fn` does (it answers "no" or
//! warns, and exits 0): superblock free counts, a group descriptor
//! checksum alone, uninit flags on an image without group checksums, and a
//! journal that needs recovery (checked without replay).

mod fsck_common;
mod kernel_xattr;

use std::path::{Path, PathBuf};

use fsck_common::*;
use ordo_dev::FileDevice;
use ordo_fs::fsck::{check, FsckOptions, Severity};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Outcome {
    label: String,
    e2fsck_clean: bool,
    e2fsck_rc: i32,
    ordo_clean: bool,
    ordo_summary: String,
    e2fsck_out: String,
    /// Only benign problems, and the repair made e2fsck pass.
    repaired: bool,
}

/// Run both checkers on `img`; if ordo finds only benign problems, repair a
/// copy and require e2fsck to pass it; if it finds unsafe ones, require the
/// repair to leave the image untouched.
fn judge(label: &str, img: &Path) -> Outcome {
    let (e_clean, e_rc, e_out) = e2fsck_clean(img);
    let dev = open(img, false);
    let res = check(&dev, &FsckOptions::default());
    drop(dev);
    let mut repaired = false;
    let (ordo_clean, summary) = match &res {
        Ok(r) => (
            r.is_clean(),
            r.problems
                .iter()
                .take(6)
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("\n    "),
        ),
        Err(e) => (false, format!("operational error: {e}")),
    };
    if let Ok(r) = &res {
        let copy = img.with_extension("repair.img");
        std::fs::copy(img, &copy).unwrap();
        let before = digest(&copy);
        let dev = open(&copy, true);
        let rep = check(
            &dev,
            &FsckOptions {
                repair_benign: true,
                ..FsckOptions::default()
            },
        )
        .expect("second check runs");
        drop(dev);
        if r.journal_needs_recovery {
            assert!(
                rep.repairs.is_empty() && digest(&copy) == before,
                "{label}: the benign repair wrote to an image whose journal needs recovery"
            );
        } else if r.has_unsafe() {
            assert!(
                rep.repairs.is_empty() && digest(&copy) == before,
                "{label}: the benign repair wrote to an image with unsafe problems"
            );
            assert!(rep.unsafe_remains(), "{label}: unsafe problems vanished");
        } else if r.has_errors() {
            let (clean_after, _, out) = e2fsck_clean(&copy);
            assert!(
                clean_after,
                "{label}: after the benign repair e2fsck still complains:\n{out}\nordo found:\n    {summary}\nrepairs: {:?}",
                rep.repairs
            );
            assert!(
                !rep.errors_remain(),
                "{label}: ordo's re-check after repair still finds {:?}",
                rep.remaining
            );
            assert_eq!(rep.exit_code(), 1, "{label}: repaired image exit code");
            repaired = true;
        }
        std::fs::remove_file(&copy).ok();
    }
    Outcome {
        label: label.to_string(),
        e2fsck_clean: e_clean,
        e2fsck_rc: e_rc,
        ordo_clean,
        ordo_summary: summary,
        e2fsck_out: e_out,
        repaired,
    }
}

type Corruption = Box<dyn Fn(&Path)>;

/// The targeted corruptions, each a named function of an image.
fn targeted() -> Vec<(&'static str, Corruption)> {
    let mut v: Vec<(&'static str, Corruption)> = Vec::new();
    v.push(("clean", Box::new(|_| {})));
    v.push((
        "block bitmap bit cleared",
        Box::new(|img| {
            let b = blocks_of(img, "/a/b/big")[3];
            debugfs(img, &format!("freeb {b}"));
        }),
    ));
    v.push((
        "block bitmap bit set on a free block",
        Box::new(|img| {
            let bs = block_size(img);
            let last = std::fs::metadata(img).unwrap().len() / bs - 10;
            debugfs(img, &format!("setb {last}"));
        }),
    ));
    v.push((
        "inode bitmap bit cleared",
        Box::new(|img| {
            debugfs(img, "freei /empty");
        }),
    ));
    v.push((
        "group free blocks count, checksum recomputed",
        Box::new(|img| {
            debugfs(img, "set_bg 0 free_blocks_count 17");
            debugfs(img, "set_bg 0 checksum calc");
        }),
    ));
    v.push((
        "group free inodes count, checksum recomputed",
        Box::new(|img| {
            debugfs(img, "set_bg 0 free_inodes_count 3");
            debugfs(img, "set_bg 0 checksum calc");
        }),
    ));
    v.push((
        "group directories count, checksum recomputed",
        Box::new(|img| {
            debugfs(img, "set_bg 0 used_dirs_count 1");
            debugfs(img, "set_bg 0 checksum calc");
        }),
    ));
    v.push((
        "group descriptor checksum",
        Box::new(|img| {
            debugfs(img, "set_bg 0 free_blocks_count 17");
        }),
    ));
    v.push((
        "superblock free blocks count (not an error)",
        Box::new(|img| {
            debugfs(img, "ssv free_blocks_count 100");
        }),
    ));
    v.push((
        "superblock free inodes count (not an error)",
        Box::new(|img| {
            debugfs(img, "ssv free_inodes_count 100");
        }),
    ));
    v.push((
        "superblock state not clean (not an error)",
        Box::new(|img| {
            debugfs(img, "ssv state 0");
        }),
    ));
    v.push((
        "bad inode checksum",
        Box::new(|img| {
            let (b, off) = inode_pos(img, "/a/f1");
            let bs = block_size(img);
            xor_byte(img, b * bs + off + 0x08, 0x40); // i_atime
        }),
    ));
    v.push((
        "link count +1",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 links_count 3");
        }),
    ));
    v.push((
        "link count -1",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 links_count 1");
        }),
    ));
    v.push((
        "directory link count +1",
        Box::new(|img| {
            debugfs(img, "sif /a links_count 4");
        }),
    ));
    v.push((
        "directory link count -1",
        Box::new(|img| {
            debugfs(img, "sif /a links_count 2");
        }),
    ));
    v.push((
        "entry pointing to a free inode",
        Box::new(|img| {
            let ino = inode_of(img, "/c/sl");
            debugfs(img, &format!("clri <{ino}>"));
            debugfs(img, &format!("freei <{ino}>"));
        }),
    ));
    v.push((
        "leaked inode (entry removed, inode kept)",
        Box::new(|img| {
            debugfs(img, "unlink /empty");
        }),
    ));
    v.push((
        "leaked file with data blocks",
        Box::new(|img| {
            debugfs(img, "unlink /a/b/big");
        }),
    ));
    v.push((
        "leaked empty directory (parent link count too high)",
        Box::new(|img| {
            debugfs(img, "mkdir /a/e");
            debugfs(img, "unlink /a/e");
        }),
    ));
    v.push((
        "one of two hard links removed (count too high)",
        Box::new(|img| {
            debugfs(img, "unlink /c/hl");
        }),
    ));
    v.push((
        "extra hard link entry (count too low)",
        Box::new(|img| {
            debugfs(img, "link /a/f1 /c/hl2");
        }),
    ));
    v.push((
        "directory linked twice",
        Box::new(|img| {
            debugfs(img, "link /a/b /c/b2");
        }),
    ));
    v.push((
        "extent pointing outside the file system",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 block[5] 4000000000");
        }),
    ));
    v.push((
        "two files sharing a block",
        Box::new(|img| {
            let b = blocks_of(img, "/a/b/big")[0];
            let ino = inode_of(img, "/c/longsl");
            debugfs(img, &format!("sif <{ino}> block[5] {b}"));
        }),
    ));
    v.push((
        "extent pointing at the inode table",
        Box::new(|img| {
            let (b, _) = inode_pos(img, "/a/f1");
            debugfs(img, &format!("sif /a/f1 block[5] {b}"));
        }),
    ));
    v.push((
        "extent length zero",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 block[4] 0");
        }),
    ));
    v.push((
        "extent header magic in the inode",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 block[0] 0x12345678");
        }),
    ));
    v.push((
        "broken rec_len",
        Box::new(|img| {
            let b = blocks_of(img, "/c")[0];
            let bs = block_size(img);
            patch(img, b * bs + 12 + 4, &[13, 0]); // ".." rec_len
        }),
    ));
    v.push((
        "rec_len past the block end",
        Box::new(|img| {
            let b = blocks_of(img, "/a")[0];
            let bs = block_size(img);
            patch(img, b * bs + 4, &[0xF0, 0x7F]);
        }),
    ));
    v.push((
        "bad dir tail checksum",
        Box::new(|img| {
            let b = blocks_of(img, "/c")[0];
            let bs = block_size(img);
            xor_byte(img, b * bs + bs - 2, 0x10);
        }),
    ));
    v.push((
        "bad name byte in a directory",
        Box::new(|img| {
            let b = blocks_of(img, "/a")[0];
            let bs = block_size(img);
            // Third entry's first name byte becomes '/'.
            patch(img, b * bs + 24 + 8, b"/");
        }),
    ));
    v.push((
        "zeroed inode table block",
        Box::new(|img| {
            let (b, _) = inode_pos(img, "/a/f1");
            let bs = block_size(img);
            patch(img, b * bs, &vec![0u8; bs as usize]);
        }),
    ));
    v.push((
        "superblock magic",
        Box::new(|img| {
            patch(img, 1024 + 0x38, &[0, 0]);
        }),
    ));
    v.push((
        "superblock checksum",
        Box::new(|img| {
            xor_byte(img, 1024 + 0x3FC, 0xFF);
        }),
    ));
    v.push((
        "i_size of a directory",
        Box::new(|img| {
            debugfs(img, "sif /c size 7");
        }),
    ));
    v.push((
        "i_blocks of a file",
        Box::new(|img| {
            debugfs(img, "sif /a/b/big blocks 8");
        }),
    ));
    v.push((
        "file type bits invalid",
        Box::new(|img| {
            debugfs(img, "sif /empty mode 0170644");
        }),
    ));
    v.push((
        "file type mismatch with the entry",
        Box::new(|img| {
            debugfs(img, "sif /empty mode 0020644");
        }),
    ));
    v.push((
        "i_dtime on a live inode",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 dtime 12345");
        }),
    ));
    v.push((
        "deleted inode with zero dtime",
        Box::new(|img| {
            let ino = inode_of(img, "/empty");
            debugfs(img, "unlink /empty");
            debugfs(img, &format!("sif <{ino}> links_count 0"));
            debugfs(img, &format!("freei <{ino}>"));
        }),
    ));
    v.push((
        "fast symlink size",
        Box::new(|img| {
            debugfs(img, "sif /c/sl size 3");
        }),
    ));
    v.push((
        "extent tree block magic",
        Box::new(|img| {
            if let Some(b) = extent_tree_block(img, "/frag") {
                let bs = block_size(img);
                patch(img, b * bs, &[0, 0]);
            }
        }),
    ));
    v.push((
        "extent tree block checksum",
        Box::new(|img| {
            if let Some(b) = extent_tree_block(img, "/frag") {
                let bs = block_size(img);
                xor_byte(img, b * bs + 12 + 4, 0x01);
            }
        }),
    ));
    v.push((
        "orphan list head on a live inode (not an error)",
        Box::new(|img| {
            let ino = inode_of(img, "/a/f1");
            debugfs(img, &format!("ssv last_orphan {ino}"));
        }),
    ));
    v.push((
        "directory '..' wrong",
        Box::new(|img| {
            let b = blocks_of(img, "/a/b")[0];
            let bs = block_size(img);
            let root = 2u32.to_le_bytes();
            patch(img, b * bs + 12, &root);
        }),
    ));
    v.push((
        "htree index entry block out of range",
        Box::new(|img| {
            let b = blocks_of(img, "/d")[0];
            let bs = block_size(img);
            patch(img, b * bs + 0x20 + 4, &9999u32.to_le_bytes());
        }),
    ));
    v.push((
        "group 0 marked BLOCK_UNINIT while in use",
        Box::new(|img| {
            debugfs(img, "set_bg 0 flags 2");
            debugfs(img, "set_bg 0 checksum calc");
        }),
    ));
    v.push((
        "needs_recovery flag set (journal not replayed)",
        Box::new(|img| {
            debugfs(img, "feature needs_recovery");
        }),
    ));
    v.push((
        "root inode not a directory",
        Box::new(|img| {
            debugfs(img, "sif <2> mode 0100755");
        }),
    ));
    v
}

/// Fixed UUID and hash seed, so that a seed replays the same damage on the
/// same bytes (inode times still differ from run to run).
const FIXED_UUID: &str = "6f72646f-6673-636b-2d63-6f7270757321";

fn mkfs_ext4(opts: &'static str, size: &'static str) -> impl FnOnce(&Path) {
    move |img: &Path| {
        must(&format!(
            "mkfs.ext4 -q -F -U {FIXED_UUID} -E hash_seed={FIXED_UUID} {opts} {} {size}",
            img.display()
        ));
    }
}

fn mkfs_ordo(img: &Path) {
    use ordo_fs::mkfs::{mkfs, MkfsOptions};
    let dev = FileDevice::create(img, 32 << 20, 4096).expect("create image");
    mkfs(
        &dev,
        &MkfsOptions {
            size_bytes: 32 << 20,
            assume_zeroed: true,
            uuid: Some(*b"ordo-fsck-corpus"),
            hash_seed: Some(*b"ordo-fsck-hashes"),
            ..MkfsOptions::default()
        },
    )
    .expect("ordo mkfs");
}

#[test]
fn fsck_agrees_with_e2fsck_over_a_corrupted_corpus() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let bases: Vec<(&str, PathBuf)> = vec![
        (
            "ext4-1k",
            make_base(
                dir.path(),
                "ext4-1k",
                mkfs_ext4("-b 1024 -O ^has_journal,^resize_inode", "16M"),
            ),
        ),
        (
            "ext4-4k",
            make_base(
                dir.path(),
                "ext4-4k",
                mkfs_ext4("-b 4096 -O ^has_journal,^resize_inode", "64M"),
            ),
        ),
        (
            "ext4-4k-nocsum",
            make_base(
                dir.path(),
                "ext4-4k-nocsum",
                mkfs_ext4(
                    "-b 4096 -O ^has_journal,^resize_inode,^metadata_csum",
                    "32M",
                ),
            ),
        ),
        ("ordo-mkfs", make_base(dir.path(), "ordo-mkfs", mkfs_ordo)),
        // ext2/ext3-style block-mapped files (indirect blocks).
        (
            "ext2-style-1k",
            make_base(
                dir.path(),
                "ext2-style-1k",
                mkfs_ext4(
                    "-b 1024 -O ^extent,^has_journal,^resize_inode,^flex_bg,^64bit",
                    "16M",
                ),
            ),
        ),
        // Debian's default: journal, resize inode, everything else.
        (
            "ext4-default",
            make_base(dir.path(), "ext4-default", mkfs_ext4("", "32M")),
        ),
    ];
    let mut outcomes = Vec::new();
    // Clean bases first: both must call them clean.
    for (name, img) in &bases {
        let o = judge(&format!("{name}: clean base"), img);
        assert!(
            o.e2fsck_clean && o.ordo_clean,
            "{}: base image not clean (e2fsck rc {}, ordo: {})\n{}",
            o.label,
            o.e2fsck_rc,
            o.ordo_summary,
            o.e2fsck_out
        );
    }
    // Targeted corruptions on every base.
    for (name, base) in &bases {
        if std::env::var("ORDO_FSCK_RANDOM_ONLY").is_ok() {
            break;
        }
        for (label, corrupt) in targeted() {
            let img = dir.path().join("case.img");
            std::fs::copy(base, &img).unwrap();
            corrupt(&img);
            outcomes.push(judge(&format!("{name}: {label}"), &img));
        }
    }
    // Seeded random byte flips in metadata blocks.
    let seed: u64 = std::env::var("ORDO_FSCK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f5c6);
    println!("random corruption seed: {seed} (set ORDO_FSCK_SEED to replay)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let random_per_base: usize = std::env::var("ORDO_FSCK_RANDOM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let only_base = std::env::var("ORDO_FSCK_BASE").ok();
    for (name, base) in &bases {
        if only_base.as_deref().is_some_and(|b| b != *name) {
            continue;
        }
        let meta = metadata_blocks(base);
        let bs = block_size(base);
        for k in 0..random_per_base {
            let img = dir.path().join("case.img");
            std::fs::copy(base, &img).unwrap();
            let mut what = Vec::new();
            let flips = rng.gen_range(1..=3);
            for _ in 0..flips {
                let b = meta[rng.gen_range(0..meta.len())];
                let off = rng.gen_range(0..bs);
                let mask: u8 = rng.gen_range(1..=255);
                xor_byte(&img, b * bs + off, mask);
                what.push(format!("block {b} byte {off} ^{mask:#04x}"));
            }
            outcomes.push(judge(
                &format!("{name}: random #{k} ({})", what.join(", ")),
                &img,
            ));
        }
    }
    let mut disagreements = Vec::new();
    let mut not_clean = 0;
    for o in &outcomes {
        if !o.e2fsck_clean {
            not_clean += 1;
        }
        let mark = if o.e2fsck_clean == o.ordo_clean {
            "agree"
        } else {
            "DISAGREE"
        };
        println!(
            "{mark:8} e2fsck {} ordo {}  {}",
            if o.e2fsck_clean { "clean" } else { "errors" },
            if o.ordo_clean { "clean" } else { "errors" },
            o.label
        );
        if o.e2fsck_clean != o.ordo_clean {
            disagreements.push(format!(
                "{}: e2fsck rc {} / ordo {}\n  ordo: {}\n  e2fsck: {}",
                o.label,
                o.e2fsck_rc,
                if o.ordo_clean { "clean" } else { "errors" },
                o.ordo_summary,
                o.e2fsck_out
                    .lines()
                    .filter(|l| !l.starts_with("Pass ") && !l.starts_with("e2fsck 1"))
                    .take(12)
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
        }
    }
    let repaired = outcomes.iter().filter(|o| o.repaired).count();
    println!(
        "{} images, {} not clean for e2fsck, {} disagreements, {} benign-only images repaired \
         to e2fsck-clean",
        outcomes.len(),
        not_clean,
        disagreements.len(),
        repaired
    );
    if std::env::var("ORDO_FSCK_RANDOM_ONLY").is_err() {
        assert!(outcomes.len() >= 50, "corpus too small: {}", outcomes.len());
        assert!(
            repaired >= 30,
            "too few benign repairs exercised: {repaired}"
        );
        assert!(
            not_clean * 2 > outcomes.len(),
            "most corruptions should be detected: {not_clean} of {}",
            outcomes.len()
        );
    }
    assert!(
        disagreements.is_empty(),
        "ordo fsck and e2fsck -fn disagree on {} images:\n{}",
        disagreements.len(),
        disagreements.join("\n\n")
    );
}

/// A problem's message names the block and the field, and the severities
/// follow the benign / unsafe split.
#[test]
fn problems_name_block_and_field() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let img = make_base(
        dir.path(),
        "names",
        mkfs_ext4("-b 4096 -O ^has_journal,^resize_inode", "32M"),
    );
    debugfs(&img, "sif /a/f1 links_count 1");
    let b = blocks_of(&img, "/c")[0];
    xor_byte(&img, b * 4096 + 4096 - 2, 0x10);
    let dev = open(&img, false);
    let r = check(&dev, &FsckOptions::default()).unwrap();
    let link = r
        .problems
        .iter()
        .find(|p| p.message.contains("i_links_count"))
        .expect("link count problem reported");
    assert_eq!(link.severity, Severity::Unsafe);
    let tail = r
        .problems
        .iter()
        .find(|p| p.message.contains("det_checksum"))
        .expect("dir tail checksum reported");
    assert_eq!(tail.block, Some(b));
    assert!(tail.message.contains(&format!("block {b}")));
    assert_eq!(r.exit_code(), 4);
}

/// Images written by ordo's own core: after a clean unmount both checkers
/// call them clean; a snapshot taken while an unlinked file is still open
/// (orphan list, `sync` protocol) is found not clean by both, ordo calls it
/// benign, and the benign repair makes `e2fsck -fn` pass.
#[test]
fn ordo_written_images_agree() {
    use ordo_dev::{BlockDevice, MemDevice};
    use ordo_fs::mkfs::{mkfs, MkfsOptions};
    use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemDevice::new(4096, (32 << 20) / 4096).unwrap());
    mkfs(
        mem.as_ref(),
        &MkfsOptions {
            size_bytes: 32 << 20,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let fs = Fs::mount(
        dev,
        MountOptions {
            mode: ProtocolKind::named("sync"),
            ..MountOptions::default()
        },
    )
    .unwrap();
    let root = Creds::root();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, &root).unwrap();
    for i in 0..40 {
        let f = fs
            .create(
                a.ino,
                format!("f{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &root,
            )
            .unwrap();
        fs.write(f.ino, 0, &vec![i as u8; 5000 + i * 100]).unwrap();
    }
    fs.symlink(a.ino, b"sl", b"f1", &root).unwrap();
    let f1 = fs.lookup(a.ino, b"f1").unwrap();
    fs.link(f1.ino, ROOT_INO, b"hl").unwrap();
    fs.unlink(a.ino, b"f2").unwrap();
    // An unlinked file still open: on the orphan list.
    let held = fs.lookup(a.ino, b"f3").unwrap();
    fs.open(held.ino).unwrap();
    fs.unlink(a.ino, b"f3").unwrap();
    fs.sync().unwrap();
    let snapshot = dir.path().join("open-orphan.img");
    std::fs::write(&snapshot, mem.to_image()).unwrap();
    fs.release(held.ino).unwrap();
    fs.unmount().unwrap();
    let unmounted = dir.path().join("unmounted.img");
    std::fs::write(&unmounted, mem.to_image()).unwrap();

    let o = judge("ordo core: after unmount", &unmounted);
    assert!(
        o.e2fsck_clean && o.ordo_clean,
        "image written by ordo is not clean: e2fsck rc {}, ordo: {}\n{}",
        o.e2fsck_rc,
        o.ordo_summary,
        o.e2fsck_out
    );
    // `judge` also repairs a copy when everything found is benign, and
    // requires e2fsck to pass it afterwards.
    let o = judge("ordo core: open unlinked file", &snapshot);
    println!(
        "open unlinked file: e2fsck rc {}, ordo: {}",
        o.e2fsck_rc, o.ordo_summary
    );
    assert_eq!(
        o.e2fsck_clean, o.ordo_clean,
        "disagreement on the orphan snapshot: e2fsck rc {} / ordo: {}\n{}",
        o.e2fsck_rc, o.ordo_summary, o.e2fsck_out
    );
}

/// The resize inode (7) of images made with `resize_inode` (mke2fs's
/// default): clean as made, and each kind of damage e2fsck reports
/// ("Resize inode not valid", a wrong `i_blocks`, blocks without the
/// feature) is found by ordo as well, never reported clean.
#[test]
fn resize_inode_damage_is_found_as_e2fsck_finds_it() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    for (name, opts) in [
        ("resize-1k", "-b 1024 -O ^has_journal"),
        ("resize-4k", "-b 4096 -O ^has_journal"),
    ] {
        let base = make_base(dir.path(), name, mkfs_ext4(opts, "200M"));
        let dind = || -> u64 {
            let out = debugfs_ro(&base, "stat <7>");
            let at = out.find("(DIND):").expect("resize inode has a DIND block") + 7;
            out[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse()
                .unwrap()
        };
        let dind = dind();
        let bs = block_size(&base);
        let cases: Vec<(&str, Corruption)> = vec![
            ("clean", Box::new(|_: &Path| {})),
            (
                "a direct pointer set",
                Box::new(|img: &Path| {
                    debugfs(img, "sif <7> block[2] 1234");
                }),
            ),
            (
                "i_blocks wrong",
                Box::new(|img: &Path| {
                    debugfs(img, "sif <7> blocks 100");
                }),
            ),
            (
                "double-indirect block zeroed",
                Box::new(move |img: &Path| patch(img, dind * bs, &vec![0u8; bs as usize])),
            ),
            (
                "double-indirect pointer cleared",
                Box::new(|img: &Path| {
                    debugfs(img, "sif <7> block[DIND] 0");
                }),
            ),
            (
                "blocks kept without the feature",
                Box::new(|img: &Path| {
                    debugfs(img, "feature -resize_inode");
                    debugfs(img, "ssv reserved_gdt_blocks 0");
                }),
            ),
        ];
        for (label, corrupt) in cases {
            let img = dir.path().join(format!("{name}-case.img"));
            std::fs::copy(&base, &img).unwrap();
            corrupt(&img);
            let o = judge(&format!("{name}: {label}"), &img);
            assert_eq!(
                o.ordo_clean, o.e2fsck_clean,
                "{}: ordo clean={} e2fsck clean={} (rc {})\nordo: {}\ne2fsck: {}",
                o.label, o.ordo_clean, o.e2fsck_clean, o.e2fsck_rc, o.ordo_summary, o.e2fsck_out
            );
            if label == "clean" {
                assert!(o.ordo_clean, "{}: not clean: {}", o.label, o.ordo_summary);
            } else {
                assert!(!o.ordo_clean, "{}: damage not found", o.label);
            }
        }
    }
}

// ----- extended attributes -----

/// An access ACL with a named user (and so a mask), in the VFS's form.
fn named_user_acl() -> Vec<u8> {
    use ordo_format::xattr::{acl_tag, Acl, AclEntry};
    let e = |tag, perm, id| AclEntry { tag, perm, id };
    Acl {
        entries: vec![
            e(acl_tag::USER_OBJ, 7, u32::MAX),
            e(acl_tag::USER, 6, 1000),
            e(acl_tag::GROUP_OBJ, 5, u32::MAX),
            e(acl_tag::MASK, 7, u32::MAX),
            e(acl_tag::OTHER, 0, u32::MAX),
        ],
    }
    .to_xattr()
}

/// Files with attributes in the inode, in blocks of their own, in blocks
/// shared by several inodes, and ACLs in both places, set by the kernel.
fn populate_xattrs(mnt: &Path) {
    let x = mnt.join("x");
    std::fs::create_dir(&x).unwrap();
    let f = |name: &str| {
        let p = x.join(name);
        std::fs::write(&p, name.as_bytes()).unwrap();
        p
    };
    kernel_xattr::set(&f("inode"), "user.small", b"in-inode value");
    let big = vec![b'v'; 700];
    // Two files with the same attributes share one block (refcount 2):
    // "zz" and "block-resident" go to the block, "in" stays in the inode.
    for name in ["shared1", "shared2"] {
        let p = f(name);
        kernel_xattr::set(&p, "user.block-resident", &big);
        kernel_xattr::set(&p, "user.zz", &big[..200]);
        kernel_xattr::set(&p, "user.in", b"1");
    }
    let own = f("own");
    kernel_xattr::set(&own, "user.mine", &vec![b'o'; 900]);
    // An ACL small enough for the inode, and one pushed to the block by a
    // filler that takes the inode's room.
    let acl = named_user_acl();
    kernel_xattr::set(&f("acl"), "system.posix_acl_access", &acl);
    let aclblk = f("aclblk");
    kernel_xattr::set(&aclblk, "user.fill", &[b'f'; 56]);
    kernel_xattr::set(&aclblk, "system.posix_acl_access", &acl);
    let dacl = x.join("dacl");
    std::fs::create_dir(&dacl).unwrap();
    kernel_xattr::set(&dacl, "system.posix_acl_default", &acl);
    kernel_xattr::set(&dacl, "system.posix_acl_access", &acl);
    std::fs::write(dacl.join("inherits"), b"i").unwrap();
    // Many more: small ones in the inode, larger ones in blocks shared
    // by every third file, trusted and security names too.
    for i in 0..30 {
        let p = f(&format!("many{i:02}"));
        kernel_xattr::set(&p, &format!("user.k{i}"), format!("value {i}").as_bytes());
        kernel_xattr::set(&p, "trusted.t", b"trusted value");
        if i % 2 == 0 {
            kernel_xattr::set(&p, "security.s", &vec![b's'; 40 + i]);
        }
        kernel_xattr::set(&p, "user.shared", &vec![b'0' + (i % 3) as u8; 300]);
    }
}

/// The attribute block of `path` (debugfs `stat`'s "File ACL").
fn xattr_block_of(img: &Path, path: &str) -> u64 {
    let out = debugfs_ro(img, &format!("stat {path}"));
    let at = out.find("File ACL: ").expect("stat prints File ACL") + 10;
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn super_of(img: &Path) -> ordo_format::superblock::Superblock {
    ordo_format::superblock::Superblock::decode(&read_at(img, 1024, 1024)).unwrap()
}

/// Edit the on-disk inode of `path` (`edit` gets the whole inode and the
/// offset of its attribute area's magic word), keeping its checksum valid
/// when it was.
fn edit_inode_of(img: &Path, path: &str, edit: impl FnOnce(&mut [u8], usize)) {
    use ordo_format::inode::{set_inode_checksum, verify_inode_checksum};
    let sb = super_of(img);
    let ino = inode_of(img, path) as u32;
    let (blk, off) = inode_pos(img, path);
    let at = blk * block_size(img) + off;
    let mut raw = read_at(img, at, sb.inode_size() as usize);
    let sealed = verify_inode_checksum(&raw, sb.csum_seed(), ino).is_ok();
    let area = 128 + u16::from_le_bytes([raw[128], raw[129]]) as usize;
    assert_eq!(
        &raw[area..area + 4],
        &0xEA02_0000u32.to_le_bytes(),
        "{path} has in-inode attributes"
    );
    edit(&mut raw, area);
    if sealed {
        set_inode_checksum(&mut raw, sb.csum_seed(), ino);
    }
    patch(img, at, &raw);
}

/// Edit the attribute block of `path`, keeping its checksum valid when
/// it was.
fn edit_xattr_block_of(img: &Path, path: &str, edit: impl FnOnce(&mut Vec<u8>)) {
    use ordo_format::xattr::block_checksum;
    let seed = super_of(img).csum_seed();
    let b = xattr_block_of(img, path);
    let bs = block_size(img);
    let mut block = read_at(img, b * bs, bs as usize);
    let sealed =
        u32::from_le_bytes(block[16..20].try_into().unwrap()) == block_checksum(seed, b, &block);
    edit(&mut block);
    if sealed {
        let c = block_checksum(seed, b, &block);
        block[16..20].copy_from_slice(&c.to_le_bytes());
    }
    patch(img, b * bs, &block);
}

fn put16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

/// Offset of the entry of `name` (without prefix, index `idx`) in an
/// attribute area whose first entry is at `first`.
fn entry_at(buf: &[u8], first: usize, idx: u8, name: &[u8]) -> usize {
    let mut at = first;
    while get32(buf, at) != 0 {
        let len = buf[at] as usize;
        if buf[at + 1] == idx && &buf[at + 16..at + 16 + len] == name {
            return at;
        }
        at += (16 + len + 3) & !3;
    }
    panic!("no entry {name:?}");
}

/// Recompute a block entry's hash and the block's hash after its value
/// was changed in place.
fn rehash_block(block: &mut [u8]) {
    use ordo_format::xattr::{block_hash, entry_hash};
    let mut hashes = Vec::new();
    let mut at = 32;
    while get32(block, at) != 0 {
        let len = block[at] as usize;
        let offs = u16::from_le_bytes([block[at + 2], block[at + 3]]) as usize;
        let size = get32(block, at + 8) as usize;
        let name = block[at + 16..at + 16 + len].to_vec();
        let h = entry_hash(&name, &block[offs..offs + ((size + 3) & !3)]);
        put32(block, at + 12, h);
        hashes.push(h);
        at += (16 + len + 3) & !3;
    }
    put32(block, 12, block_hash(hashes));
}

/// Kernel-made images with attributes in inodes and in (shared) blocks:
/// clean for both checkers as made, and each kind of damage is found (or
/// passed) by ordo as `e2fsck -fn` finds (or passes) it. A refcount too
/// high is benign and the repair makes e2fsck pass; one too low is not.
#[test]
fn xattr_damage_is_found_as_e2fsck_finds_it() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    for (name, opts, size) in [
        ("xattr-4k", "-b 4096 -O ^has_journal,^resize_inode", "32M"),
        (
            "xattr-1k-nocsum",
            "-b 1024 -O ^has_journal,^resize_inode,^metadata_csum",
            "16M",
        ),
    ] {
        let base = dir.path().join(format!("{name}.img"));
        mkfs_ext4(opts, size)(&base);
        let mnt = dir.path().join(format!("{name}.mnt"));
        std::fs::create_dir_all(&mnt).unwrap();
        must(&format!(
            "mount -o loop {} {}",
            base.display(),
            mnt.display()
        ));
        let guard = Unmount(mnt.clone());
        populate(&mnt);
        populate_xattrs(&mnt);
        drop(guard);
        assert_ne!(
            xattr_block_of(&base, "/x/shared1"),
            0,
            "shared1 has an attribute block"
        );
        assert_eq!(
            xattr_block_of(&base, "/x/shared1"),
            xattr_block_of(&base, "/x/shared2"),
            "identical attributes share a block"
        );
        let bs = block_size(&base) as usize;
        // (label, damage, e2fsck and ordo should call it clean, ordo
        // should call it benign and repair it)
        type Case = (&'static str, Corruption, bool, bool);
        let cases: Vec<Case> = vec![
            ("clean", Box::new(|_: &Path| {}), true, false),
            (
                "in-inode value offset out of range",
                Box::new(|img: &Path| {
                    edit_inode_of(img, "/x/inode", |r, a| put16(r, a + 4 + 2, 0x400))
                }),
                false,
                false,
            ),
            (
                "in-inode value overlapping the entries",
                Box::new(|img: &Path| {
                    edit_inode_of(img, "/x/inode", |r, a| put16(r, a + 4 + 2, 0))
                }),
                false,
                false,
            ),
            (
                "in-inode bad e_hash",
                Box::new(|img: &Path| {
                    edit_inode_of(img, "/x/inode", |r, a| put32(r, a + 4 + 12, 0xdead_beef))
                }),
                false,
                false,
            ),
            (
                "in-inode e_value_inum set",
                Box::new(|img: &Path| {
                    edit_inode_of(img, "/x/inode", |r, a| put32(r, a + 4 + 4, 12))
                }),
                false,
                false,
            ),
            (
                "in-inode name past the inode",
                Box::new(|img: &Path| edit_inode_of(img, "/x/inode", |r, a| r[a + 4] = 200)),
                false,
                false,
            ),
            (
                "in-inode ACL undecodable",
                Box::new(|img: &Path| {
                    edit_inode_of(img, "/x/acl", |r, a| {
                        let e = entry_at(r, a + 4, 2, b"");
                        let offs = u16::from_le_bytes([r[e + 2], r[e + 3]]) as usize;
                        // The first ACL entry's tag: no such tag.
                        put16(r, a + 4 + offs + 4, 0x40);
                    })
                }),
                true,
                false,
            ),
            (
                "block bad e_hash",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/own", |b| {
                        let e = entry_at(b, 32, 1, b"mine");
                        b[e + 12] ^= 0x01;
                    })
                }),
                false,
                false,
            ),
            (
                "block values overlapping",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/shared1", |b| {
                        let z = entry_at(b, 32, 1, b"zz");
                        let r = entry_at(b, 32, 1, b"block-resident");
                        let offs = [b[r + 2], b[r + 3]];
                        b[z + 2..z + 4].copy_from_slice(&offs);
                        rehash_block(b);
                    })
                }),
                false,
                false,
            ),
            (
                "block value outside the block",
                Box::new(move |img: &Path| {
                    edit_xattr_block_of(img, "/x/own", |b| {
                        let e = entry_at(b, 32, 1, b"mine");
                        put16(b, e + 2, (bs - 8) as u16);
                    })
                }),
                false,
                false,
            ),
            (
                "block e_name_index 0",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/own", |b| {
                        let e = entry_at(b, 32, 1, b"mine");
                        b[e + 1] = 0;
                    })
                }),
                false,
                false,
            ),
            (
                "block bad h_hash",
                Box::new(|img: &Path| edit_xattr_block_of(img, "/x/own", |b| b[12] ^= 0x10)),
                true,
                false,
            ),
            (
                "block ACL undecodable",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/aclblk", |b| {
                        let e = entry_at(b, 32, 2, b"");
                        let offs = u16::from_le_bytes([b[e + 2], b[e + 3]]) as usize;
                        put32(b, offs, 7); // a_version
                        rehash_block(b);
                    })
                }),
                true,
                false,
            ),
            (
                "refcount too high",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/shared1", |b| {
                        let r = get32(b, 4);
                        put32(b, 4, r + 1);
                    })
                }),
                false,
                true,
            ),
            (
                "refcount too low",
                Box::new(|img: &Path| {
                    edit_xattr_block_of(img, "/x/shared1", |b| {
                        let r = get32(b, 4);
                        put32(b, 4, r - 1);
                    })
                }),
                false,
                false,
            ),
            (
                "xattr block leaked (pointer cleared)",
                Box::new(|img: &Path| {
                    debugfs(img, "sif /x/own file_acl 0");
                }),
                false,
                true,
            ),
            (
                "inode sharing a block leaked (entry removed)",
                Box::new(|img: &Path| {
                    debugfs(img, "unlink /x/shared2");
                }),
                false,
                true,
            ),
        ];
        for (label, corrupt, clean, benign) in cases {
            let img = dir.path().join(format!("{name}-case.img"));
            std::fs::copy(&base, &img).unwrap();
            corrupt(&img);
            let o = judge(&format!("{name}: {label}"), &img);
            println!(
                "{name}: {label}: e2fsck rc {}, ordo: {}",
                o.e2fsck_rc, o.ordo_summary
            );
            assert_eq!(
                o.ordo_clean, o.e2fsck_clean,
                "{}: ordo clean={} e2fsck clean={} (rc {})\nordo: {}\ne2fsck: {}",
                o.label, o.ordo_clean, o.e2fsck_clean, o.e2fsck_rc, o.ordo_summary, o.e2fsck_out
            );
            assert_eq!(o.ordo_clean, clean, "{}: {}", o.label, o.ordo_summary);
            // `judge` repaired a copy when all was benign and required
            // e2fsck to pass it.
            assert_eq!(o.repaired, benign, "{}: {}", o.label, o.ordo_summary);
        }
        // Seeded random byte changes inside attribute areas (checksums
        // kept valid, so that the entries' walk is what decides).
        let seed: u64 = std::env::var("ORDO_FSCK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x00ea_0200);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n: usize = std::env::var("ORDO_FSCK_RANDOM")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(24);
        let isz = super_of(&base).inode_size() as usize;
        // Each has attributes in its inode; some in a block as well.
        let files = ["/x/inode", "/x/shared1", "/x/acl", "/x/aclblk", "/x/many07"];
        let mut disagree = Vec::new();
        for k in 0..n {
            let img = dir.path().join(format!("{name}-random.img"));
            std::fs::copy(&base, &img).unwrap();
            let file = files[rng.gen_range(0..files.len())];
            let in_block = rng.gen_bool(0.5) && xattr_block_of(&img, file) != 0;
            let mask: u8 = rng.gen_range(1..=255);
            let what = if in_block {
                // Header fields after the magic and the entries, or the
                // values at the end.
                let at = if rng.gen_bool(0.6) {
                    rng.gen_range(4..128)
                } else {
                    rng.gen_range(bs - 1024..bs)
                };
                edit_xattr_block_of(&img, file, |b| b[at] ^= mask);
                format!("{file} block byte {at} ^{mask:#04x}")
            } else {
                let r: f64 = rng.gen();
                let mut desc = String::new();
                edit_inode_of(&img, file, |raw, a| {
                    let at = a + 4 + ((isz - a - 4) as f64 * r) as usize;
                    raw[at] ^= mask;
                    desc = format!("{file} inode byte {at} ^{mask:#04x}");
                });
                desc
            };
            let o = judge(&format!("{name}: random #{k} ({what})"), &img);
            println!(
                "{}: e2fsck rc {}, ordo clean {}: {}",
                o.label, o.e2fsck_rc, o.ordo_clean, o.ordo_summary
            );
            if o.ordo_clean != o.e2fsck_clean {
                disagree.push(format!(
                    "{}: ordo clean={} e2fsck rc {}\nordo: {}\ne2fsck: {}",
                    o.label, o.ordo_clean, o.e2fsck_rc, o.ordo_summary, o.e2fsck_out
                ));
            }
        }
        assert!(disagree.is_empty(), "{}", disagree.join("\n\n"));
    }
}

/// The protocols without a journal write the orphan list late and an
/// orphan's release in order, so a crash may keep the list's pointer to an
/// orphan already released, whose `i_dtime` is then a deletion time, not a
/// next inode. That end of the list is benign (the kernel stops there and
/// clears `s_last_orphan`; e2fsck drops the list), and the repair clears the
/// list. An illegal head in the superblock itself stays unsafe.
#[test]
fn an_orphan_list_reaching_a_released_inode_is_benign() {
    let dir = tempfile::tempdir().unwrap();
    let base = make_base(dir.path(), "orphan", mkfs_ext4("", "64M"));
    // A released inode (links 0, i_dtime a time) at the list's head.
    let img = dir.path().join("released.img");
    std::fs::copy(&base, &img).unwrap();
    debugfs(&img, "sif <1000> dtime 1700003600");
    debugfs(&img, "ssv last_orphan 1000");
    let dev = open(&img, true);
    let r = check(&dev, &FsckOptions::default()).expect("check runs");
    assert!(!r.has_unsafe(), "{:?}", r.problems);
    assert!(
        r.problems
            .iter()
            .any(|p| p.severity == Severity::Benign && p.message.contains("released inode 1000")),
        "{:?}",
        r.problems
    );
    let rep = check(
        &dev,
        &FsckOptions {
            repair_benign: true,
            ..FsckOptions::default()
        },
    )
    .expect("repair runs");
    drop(dev);
    assert!(!rep.errors_remain(), "{:?}", rep.remaining);
    assert_eq!(super_of(&img).last_orphan, 0, "the list was not cleared");
    let (clean, _, out) = e2fsck_clean(&img);
    assert!(clean, "{out}");
    // The same number as the superblock's head: unsafe, nothing written.
    let img = dir.path().join("illegal-head.img");
    std::fs::copy(&base, &img).unwrap();
    debugfs(&img, "ssv last_orphan 1700003600");
    let before = digest(&img);
    let dev = open(&img, true);
    let rep = check(
        &dev,
        &FsckOptions {
            repair_benign: true,
            ..FsckOptions::default()
        },
    )
    .expect("check runs");
    drop(dev);
    assert!(rep.has_unsafe(), "{:?}", rep.problems);
    assert_eq!(digest(&img), before, "the repair wrote to an unsafe image");
}
