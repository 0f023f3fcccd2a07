//! Bad input: corrupt the superblock, group descriptors, inodes, extent
//! blocks and directory blocks of a small image (targeted and seeded
//! random), then mount it read-only with `ordo_fs::Fs`, walk the whole
//! tree and read every file.
//!
//! Each case runs on the test thread itself, without `catch_unwind`: a
//! panic anywhere in the core fails the test with the case's label printed
//! just before it. Every failure must be an error (EUCLEAN, EIO, EINVAL or
//! a plain errno a lookup can give), a corruption error must name its
//! block, the walk is bounded, the device must see no write at all, and
//! the image file must be byte-identical afterwards. `ordo fsck` runs over
//! every damaged image too, under the same rules.

mod fsck_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use fsck_common::*;
use ordo_dev::BlockDevice;
use ordo_fs::{Fs, FsError, MountOptions, ROOT_INO};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bounds of one walk, so that a corrupted image cannot make it endless.
const WALK_ENTRIES_MAX: usize = 5000;
const WALK_DEPTH_MAX: usize = 32;
const READ_BYTES_MAX: u64 = 1 << 20;
const READ_CHUNK_BYTES: u32 = 64 << 10;

/// errnos a walk over a corrupted image may return.
fn allowed_errno(e: i32) -> bool {
    READ_ERRNOS.contains(&e)
}

#[derive(Default)]
struct WalkStats {
    entries: usize,
    bytes_read: u64,
    errors: BTreeMap<i32, usize>,
    /// The first few error messages, for the failure report.
    messages: Vec<String>,
}

impl WalkStats {
    fn error(&mut self, label: &str, what: &str, e: &FsError) {
        let errno = e.errno();
        assert!(
            allowed_errno(errno),
            "{label}: {what} failed with unexpected errno {errno}: {e}"
        );
        if let FsError::Corrupt { field, .. } = e {
            assert!(
                !field.is_empty(),
                "{label}: corruption error without a field: {e}"
            );
            assert!(
                e.to_string().contains("block"),
                "{label}: corruption error does not name a block: {e}"
            );
        }
        *self.errors.entry(errno).or_insert(0) += 1;
        if self.messages.len() < 5 {
            self.messages.push(format!("{what}: {e}"));
        }
    }
}

/// The walk's findings, checked as they come.
struct Checked<'a> {
    label: &'a str,
    st: &'a mut WalkStats,
}

impl WalkVisitor for Checked<'_> {
    fn read(&mut self, bytes: usize) {
        self.st.bytes_read += bytes as u64;
    }
    fn error(&mut self, what: &str, e: &FsError) {
        self.st.error(self.label, what, e);
    }
}

const BOUNDS: WalkBounds = WalkBounds {
    entries_max: WALK_ENTRIES_MAX,
    depth_max: WALK_DEPTH_MAX,
    read_bytes_max: READ_BYTES_MAX,
    read_chunk: READ_CHUNK_BYTES,
};

/// Mount read-only, walk, read everything, unmount; assert no write.
fn run_case(label: &str, img: &Path, bs: u32) -> WalkStats {
    let before = digest(img);
    let dev: Arc<dyn BlockDevice> = Arc::new(open_bs(img, true, bs));
    let mut st = WalkStats::default();
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    match Fs::mount(dev.clone(), opts) {
        Ok(fs) => {
            st.entries = walk_tree(
                &fs,
                label,
                ROOT_INO,
                &BOUNDS,
                &mut Checked { label, st: &mut st },
            );
            if let Err(e) = fs.unmount() {
                st.error(label, "unmount", &e);
            }
        }
        Err(e) => st.error(label, "mount", &e),
    }
    // ordo fsck over the same damage: it must return (a report or an
    // operational error), never panic, and never write without a repair.
    let _ = ordo_fs::fsck::check(dev.as_ref(), &ordo_fs::fsck::FsckOptions::default());
    let writes = dev.counters().total().writes;
    assert_eq!(
        writes, 0,
        "{label}: a read-only mount (or fsck) wrote {writes} times"
    );
    drop(dev);
    assert!(
        digest(img) == before,
        "{label}: the image changed under a read-only mount"
    );
    st
}

type Corruption = Box<dyn Fn(&Path)>;

/// Physical block of logical block `lblk` of `path`, from debugfs `bmap`.
fn logical_block(img: &Path, path: &str, lblk: u64) -> u64 {
    let out = debugfs_ro(img, &format!("bmap {path} {lblk}"));
    let b: u64 = out.trim().parse().expect("bmap prints a block number");
    assert!(b != 0, "{path} has no block {lblk}");
    b
}

fn targeted() -> Vec<(&'static str, Corruption)> {
    let mut v: Vec<(&'static str, Corruption)> = Vec::new();
    v.push((
        "superblock magic",
        Box::new(|img| patch(img, 1024 + 0x38, &[0, 0])),
    ));
    v.push((
        "superblock block count huge",
        Box::new(|img| patch(img, 1024 + 0x4, &[0xFF, 0xFF, 0xFF, 0x7F])),
    ));
    v.push((
        "superblock inodes per group zero",
        Box::new(|img| patch(img, 1024 + 0x28, &[0, 0, 0, 0])),
    ));
    v.push((
        "superblock log block size huge",
        Box::new(|img| patch(img, 1024 + 0x18, &[30, 0, 0, 0])),
    ));
    v.push((
        "group descriptor inode table out of range",
        Box::new(|img| {
            let bs = block_size(img);
            let gdt = if bs == 1024 { 2 } else { 1 } * bs;
            patch(img, gdt + 8, &[0xFF, 0xFF, 0xFF, 0x0F]);
        }),
    ));
    v.push((
        "group descriptor bitmaps zero",
        Box::new(|img| {
            let bs = block_size(img);
            let gdt = if bs == 1024 { 2 } else { 1 } * bs;
            patch(img, gdt, &[0u8; 8]);
        }),
    ));
    v.push((
        "root inode zeroed",
        Box::new(|img| {
            let (b, off) = inode_pos(img, "/");
            let bs = block_size(img);
            patch(img, b * bs + off, &[0u8; 256]);
        }),
    ));
    v.push((
        "root inode mode regular",
        Box::new(|img| {
            debugfs(img, "sif <2> mode 0100644");
        }),
    ));
    v.push((
        "file extent outside the device",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 block[5] 4000000000");
        }),
    ));
    v.push((
        "file extent header entries past max",
        Box::new(|img| {
            debugfs(img, "sif /a/b/big block[1] 0x00040009");
        }),
    ));
    v.push((
        "file extent depth 5 with a bogus index",
        Box::new(|img| {
            debugfs(img, "sif /a/b/big block[1] 0x00040001");
            debugfs(img, "sif /a/b/big block[2] 5");
        }),
    ));
    v.push((
        "extent index pointing at itself",
        Box::new(|img| {
            if let Some(b) = extent_tree_block(img, "/frag") {
                let ino = inode_of(img, "/frag");
                let _ = ino;
                // Make the tree block an index node (depth 1) whose first
                // index points back at the block itself.
                let bs = block_size(img);
                patch(img, b * bs + 6, &[1, 0]);
                patch(img, b * bs + 12 + 4, &(b as u32).to_le_bytes());
            }
        }),
    ));
    v.push((
        "extent tree block zeroed",
        Box::new(|img| {
            if let Some(b) = extent_tree_block(img, "/frag") {
                let bs = block_size(img);
                patch(img, b * bs, &vec![0u8; bs as usize]);
            }
        }),
    ));
    v.push((
        "directory rec_len zero",
        Box::new(|img| {
            let b = blocks_of(img, "/c")[0];
            let bs = block_size(img);
            patch(img, b * bs + 12 + 4, &[0, 0]);
        }),
    ));
    v.push((
        "directory rec_len past the block",
        Box::new(|img| {
            let b = blocks_of(img, "/a")[0];
            let bs = block_size(img);
            patch(img, b * bs + 4, &[0xFC, 0x7F]);
        }),
    ));
    v.push((
        "directory name_len past rec_len",
        Box::new(|img| {
            let b = blocks_of(img, "/a")[0];
            let bs = block_size(img);
            patch(img, b * bs + 24 + 6, &[0xFF]);
        }),
    ));
    v.push((
        "directory entry inode huge",
        Box::new(|img| {
            let b = blocks_of(img, "/a")[0];
            let bs = block_size(img);
            patch(img, b * bs + 24, &[0xFF, 0xFF, 0xFF, 0x7F]);
        }),
    ));
    v.push((
        "directory entry names itself (loop)",
        Box::new(|img| {
            let ino = inode_of(img, "/a/b") as u32;
            let b = blocks_of(img, "/a/b")[0];
            let bs = block_size(img);
            // The first real entry of /a/b becomes a link to /a/b itself.
            patch(img, b * bs + 24, &ino.to_le_bytes());
            patch(img, b * bs + 24 + 7, &[2]);
        }),
    ));
    // The htree root is the directory's logical block 0 (`blocks` lists
    // the extent tree block first).
    v.push((
        "htree root count zero",
        Box::new(|img| {
            let b = logical_block(img, "/d", 0);
            let bs = block_size(img);
            patch(img, b * bs + 0x22, &[0, 0]);
        }),
    ));
    v.push((
        "htree root levels huge",
        Box::new(|img| {
            let b = logical_block(img, "/d", 0);
            let bs = block_size(img);
            patch(img, b * bs + 0x1E, &[7]);
        }),
    ));
    v.push((
        "htree root hash entry flipped",
        Box::new(|img| {
            let b = logical_block(img, "/d", 0);
            let bs = block_size(img);
            xor_byte(img, b * bs + 0x28, 0x01);
        }),
    ));
    v.push((
        "directory extent block entry start huge",
        Box::new(|img| {
            if let Some(b) = extent_tree_block(img, "/d") {
                let bs = block_size(img);
                patch(img, b * bs + 0x1E, &[7]);
            }
        }),
    ));
    v.push((
        "slow symlink size huge",
        Box::new(|img| {
            debugfs(img, "sif /c/longsl size 0x7fffffff");
        }),
    ));
    v.push((
        "file size huge",
        Box::new(|img| {
            debugfs(img, "sif /a/f1 size 0x7fffffffffff");
        }),
    ));
    v.push((
        "directory size zero",
        Box::new(|img| {
            debugfs(img, "sif /a size 0");
        }),
    ));
    v.push((
        "bad inode checksum",
        Box::new(|img| {
            let (b, off) = inode_pos(img, "/a/f1");
            let bs = block_size(img);
            xor_byte(img, b * bs + off + 0x08, 0x40);
        }),
    ));
    v.push((
        "bad directory checksum",
        Box::new(|img| {
            let b = blocks_of(img, "/c")[0];
            let bs = block_size(img);
            xor_byte(img, b * bs + bs - 2, 0x10);
        }),
    ));
    v
}

#[test]
fn corrupted_images_give_errors_not_panics_hangs_or_writes() {
    assert!(is_root(), "this test needs root (loop mounts); run as root");
    let dir = tempfile::tempdir().unwrap();
    let seed: u64 = std::env::var("ORDO_WALK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0bad_f00d);
    println!("random corruption seed: {seed} (set ORDO_WALK_SEED to replay)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut total_errors = 0usize;
    let mut cases = 0usize;
    // With checksums most damage is caught by a checksum; without them the
    // core's structural validation is all that stands between a corrupted
    // image and a panic.
    for (name, features) in [
        ("csum", "^has_journal,^resize_inode"),
        ("nocsum", "^has_journal,^resize_inode,^metadata_csum"),
    ] {
        let base = make_base(dir.path(), name, |img| {
            must(&format!(
                "mkfs.ext4 -q -F -b 1024 -O {features} {} 8M",
                img.display()
            ));
        });
        let bs = block_size(&base) as u32;
        // The clean image walks without a single error.
        let clean = dir.path().join("clean.img");
        std::fs::copy(&base, &clean).unwrap();
        let st = run_case(&format!("{name}: clean"), &clean, bs);
        assert!(
            st.errors.is_empty(),
            "{name}: clean image gave errors: {:?}: {:?}",
            st.errors,
            st.messages
        );
        assert!(st.entries > 300, "walk saw only {} entries", st.entries);
        assert!(
            st.bytes_read > 300_000,
            "walk read only {} bytes",
            st.bytes_read
        );

        for (label, corrupt) in targeted() {
            let img = dir.path().join("case.img");
            std::fs::copy(&base, &img).unwrap();
            corrupt(&img);
            let label = format!("{name}: {label}");
            println!("case: {label}");
            let st = run_case(&label, &img, bs);
            println!(
                "  entries {} bytes {} errors {:?} {:?}",
                st.entries, st.bytes_read, st.errors, st.messages
            );
            total_errors += st.errors.values().sum::<usize>();
            cases += 1;
        }
        let meta = metadata_blocks(&base);
        for k in 0..50 {
            let img = dir.path().join("case.img");
            std::fs::copy(&base, &img).unwrap();
            let mut what = Vec::new();
            for _ in 0..rng.gen_range(1..=4) {
                let b = meta[rng.gen_range(0..meta.len())];
                let off = rng.gen_range(0..bs as u64);
                let mask: u8 = rng.gen_range(1..=255);
                xor_byte(&img, b * bs as u64 + off, mask);
                what.push(format!("block {b} byte {off} ^{mask:#04x}"));
            }
            let label = format!("{name}: random #{k} ({})", what.join(", "));
            println!("case: {label}");
            let st = run_case(&label, &img, bs);
            println!(
                "  entries {} bytes {} errors {:?} {:?}",
                st.entries, st.bytes_read, st.errors, st.messages
            );
            total_errors += st.errors.values().sum::<usize>();
            cases += 1;
        }
    }
    println!("{cases} corrupted images walked, {total_errors} errors returned");
    assert!(
        total_errors > cases / 2,
        "corruptions were mostly not noticed"
    );
}
