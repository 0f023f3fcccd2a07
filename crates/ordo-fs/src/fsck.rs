//! `ordo fsck`: an independent checker of ext4 images for ordo's feature
//! subset, and the benign repair that is the crash recovery of the `sync`
//! and `async` protocols.
//!
//! Why a checker of our own when `e2fsck` exists: the crash explorer checks
//! thousands of crash states, and it needs (a) a verdict that does not fork
//! a process per state, (b) a classification that e2fsck does not give:
//! *benign* inconsistencies (derivable state: allocation bitmaps, free
//! counts, leaked inodes, link counts that are too high) that a crash of
//! `sync` may leave and that lose nothing reachable when repaired, versus
//! *unsafe* ones (everything else: an entry naming a free inode, a block
//! owned twice, a link count too low, a torn directory, a bad checksum),
//! and (c) a repair that fixes the benign ones only and refuses to touch an
//! image that has anything else wrong. Between the two, a block or inode
//! in use that its bitmap calls free is a *hazard*: the repair fixes it
//! like a benign one, but until then the next allocation can hand it out
//! twice, so it is harmless only when the repair runs before any
//! allocation (a leaked one, marked but unused, is benign). It decodes the image with its own
//! readers (`fsck/layout.rs`) rather than ordo-format's, so that a bug in
//! the writer's encoder cannot hide itself from the checker.
//!
//! The checks follow e2fsck's passes, one file each as in e2fsck's source
//! (`fsck/pass0.rs` to `fsck/pass5.rs`, `fsck/journal.rs`, driven by
//! `fsck/checker.rs`), and the test corpus (`tests/fsck_corpus.rs`)
//! asserts that this checker and `e2fsck -fn` agree on clean versus not
//! clean:
//!
//! - pass 0: superblock (magic, geometry, checksum, features) and group
//!   descriptors (checksums, locations, flags), metadata block ownership;
//! - pass 1: every inode e2fsck would scan (skipping `INODE_UNINIT` groups
//!   and the `bg_itable_unused` tail, as e2fsck does): checksum, mode,
//!   flags, extent trees (magic, depth, ordering, overlap, range, tree-block
//!   checksums, not pointing at metadata, no block claimed twice), i_blocks,
//!   i_size, symlinks, device inodes, and extended attributes as e2fsck's
//!   `check_ea_in_inode` and `check_ext_attr` see them: the in-inode area
//!   behind a valid `i_extra_isize` and the attribute block (magic,
//!   h_blocks, checksum), each walked entry by entry (every entry, name,
//!   value and the end marker inside the area and overlapping nothing
//!   else, value sizes, `e_value_inum` 0, `e_hash` the entry's hash, in
//!   the inode unless 0, a block entry's name index not 0), and the
//!   blocks' refcounts. A block's `h_hash` and the format of ACL values
//!   are reported as info only: e2fsck checks neither.
//!   Three shapes here are benign, because the two halves of each live in
//!   different blocks that an in-place file system writes one after the
//!   other (a file's block count and its extent tree; a block's refcount
//!   and the inodes naming it): i_blocks *higher* than the blocks the tree
//!   maps (counted before a mapping is set, or still counted after it was
//!   cleared: nothing mapped is lost, the repair lowers it), and an index
//!   key *lower* than its child's first key but above the previous entry's
//!   range, in the inode's root or not first in its node (a first key
//!   would have to be raised in its own parent too) (a child's leading mappings cleared before the key followed:
//!   lookups in the gap find a hole, the repair raises the key), and an
//!   xattr block's h_refcount *higher* than the inodes naming it (an
//!   in-place file system raises the count before it sets an inode's
//!   pointer and lowers it after clearing one: nothing that refers to the
//!   block is lost, the repair lowers the count and reseals the block's
//!   checksum). i_blocks or a refcount too low and a key above its child's
//!   first (hidden mappings) stay unsafe. An xattr block that nothing
//!   names any more is a leaked block (pass 5, benign), and when the
//!   repair releases a leaked inode its reference to a shared block is
//!   dropped (the block freed only when it was the last);
//! - pass 2: directory blocks (rec_len chain, names, file types, "." and
//!   "..", checksum tail, htree root/node structure and checksums), entries
//!   pointing at free or reserved inodes, directories linked twice. One
//!   shape of the last is benign: a directory with exactly two entries, one
//!   of them in the directory its ".." names. An in-place file system that
//!   keeps rule 3 (the new entry before the old one is removed, `..`
//!   following the new entry) leaves it after a crash inside a rename of a
//!   directory, as FFS does; the repair removes the entry in the parent
//!   ".." does not name (when both are in that parent, the one found
//!   second) and the link counts are counted without it;
//! - pass 3: connectivity of every directory to the root, ".." correctness;
//! - pass 4: link counts (with the dir_nlink rule), unreferenced inodes;
//! - pass 5: bitmaps against use (emulating `BLOCK_UNINIT`/`INODE_UNINIT`
//!   as libext2fs reads them), bitmap padding and checksums, group and
//!   superblock free counts (a superblock count difference is reported but,
//!   as in e2fsck, is not an error);
//! - the journal: a journal superblock with `s_start != 0` or the
//!   `needs_recovery` flag means "journal needs recovery". Like `e2fsck -n`
//!   the check then runs on the image as it is, without replaying, and
//!   reports the journal without counting it as an error; the benign repair
//!   refuses to run (replay comes first: `protocol::recover`).
//!
//! Known gaps (documented in the report and the corpus test): htree hash
//! values of leaf entries are not recomputed (the tree's own hash ordering
//! is checked), values of extended attributes kept in inodes of their own
//! (`ea_inode`, refused with the feature) are not followed, block-mapped
//! (non-extent) files are walked without checking indirect-block
//! ordering, and quota, bigalloc, inline data, encryption, casefold and
//! meta_bg images are refused as unsupported (exit code 8).

mod checker;
mod journal;
mod layout;
mod pass0;
mod pass1;
mod pass1_blocks;
mod pass1_xattr;
mod pass2;
mod pass3_4;
mod pass5;
mod repair;

use std::fmt;
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};

use crate::clock::Clock;
use crate::error::FsError;

/// Options of one check.
#[derive(Clone, Debug)]
pub struct FsckOptions {
    /// Repair the benign and hazard problems (bitmaps, free counts, leaked inodes,
    /// link counts, i_blocks and xattr block refcounts that are too high,
    /// extent index keys below their child's first key, orphan list, the
    /// stale second name of a directory moved by an interrupted rename)
    /// by writing through the
    /// device, but only when no unsafe problem was found: an image with
    /// anything unsafe is never written.
    pub repair_benign: bool,
    /// Stop recording problems after this many (the check still runs to
    /// the end; `FsckReport::truncated` says so).
    pub max_problems: usize,
    /// The clock the repair reads `i_dtime` from for the inodes it
    /// releases. `None`: the system clock.
    pub clock: Option<Arc<dyn Clock>>,
}

impl Default for FsckOptions {
    fn default() -> Self {
        FsckOptions {
            repair_benign: false,
            max_problems: 1000,
            clock: None,
        }
    }
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Reported, but not an error, as `e2fsck -n` treats it (superblock
    /// free counts, which the kernel keeps only approximately; a group
    /// descriptor checksum alone; a journal that needs recovery). The
    /// benign repair still fixes the first two.
    Info,
    /// Derivable state only; repairing it loses nothing that was reachable.
    Benign,
    /// Derivable state the benign repair fixes, but dangerous until it
    /// runs: a block or inode in use that its bitmap calls free, which the
    /// next allocation can hand out a second time. Harmless only when the
    /// repair runs before any allocation (as `async` and `sync` recovery
    /// does at mount); an error for a protocol whose recovery must leave
    /// a clean image.
    Hazard,
    /// Anything else: the image is inconsistent.
    Unsafe,
}

/// Which structure a problem is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemClass {
    /// Superblock fields or checksum.
    Superblock,
    /// Group descriptor fields, locations or checksum.
    GroupDescriptor,
    /// Block bitmap: blocks marked in use that nothing uses (leaked),
    /// padding or checksum.
    BlockBitmap,
    /// Blocks in use (by a file or by metadata) that the block bitmap
    /// calls free.
    BlockUsedButFree,
    /// Inode bitmap: inodes marked in use that are free (leaked) or
    /// checksum.
    InodeBitmap,
    /// Inodes in use that the inode bitmap calls free.
    InodeUsedButFree,
    /// Free block / inode / directory counts of a group.
    GroupCounts,
    /// Free counts of the superblock.
    SuperCounts,
    /// Inode fields (mode, flags, size, i_blocks, dtime) or checksum.
    Inode,
    /// Extent tree structure, ranges or checksums.
    ExtentTree,
    /// A block claimed twice, or claimed by a file and by metadata.
    BlockConflict,
    /// Extended-attribute block.
    Xattr,
    /// Directory block structure, entries, checksums, htree.
    Directory,
    /// Directory reachability and "..".
    Connectivity,
    /// Link counts against directory entries.
    LinkCount,
    /// An in-use inode no directory entry names.
    LeakedInode,
    /// The orphan list (unlinked inodes pending release).
    Orphan,
    /// The journal.
    Journal,
}

/// One inconsistency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub class: ProblemClass,
    /// The inode concerned, if any.
    pub ino: Option<u32>,
    /// The block holding the bad structure, if any.
    pub block: Option<u64>,
    /// What is wrong, naming the block and the field.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Info => "info",
            Severity::Benign => "benign",
            Severity::Hazard => "hazard",
            Severity::Unsafe => "UNSAFE",
        };
        write!(f, "[{sev}] {:?}: {}", self.class, self.message)
    }
}

/// Figures about the image, as e2fsck's summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsckStats {
    pub inodes_count: u64,
    pub inodes_used: u64,
    pub blocks_count: u64,
    pub blocks_used: u64,
    pub directories: u64,
    pub regular_files: u64,
    pub symlinks: u64,
}

/// The outcome of [`check`].
#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    /// Everything found, before any repair.
    pub problems: Vec<Problem>,
    /// More problems existed than `max_problems`.
    pub truncated: bool,
    /// What the benign repair changed (empty when nothing was written).
    pub repairs: Vec<String>,
    /// After a repair: the problems a fresh check still finds.
    pub remaining: Option<Vec<Problem>>,
    /// The journal has transactions to replay. The check ran on the image
    /// as it is (like `e2fsck -n`), and no repair was attempted: replay
    /// comes first.
    pub journal_needs_recovery: bool,
    pub stats: FsckStats,
}

impl FsckReport {
    /// Whether any problem that counts as an error was found (before repair).
    pub fn has_errors(&self) -> bool {
        self.truncated || self.problems.iter().any(|p| p.severity > Severity::Info)
    }
    /// Whether the image was clean (no errors) before any repair.
    pub fn is_clean(&self) -> bool {
        !self.has_errors()
    }
    /// Whether an unsafe problem was found.
    pub fn has_unsafe(&self) -> bool {
        self.problems.iter().any(|p| p.severity == Severity::Unsafe)
    }
    /// Whether errors remain now: after a repair, what the re-check found;
    /// otherwise everything found.
    pub fn errors_remain(&self) -> bool {
        match &self.remaining {
            Some(rem) => rem.iter().any(|p| p.severity > Severity::Info),
            None => self.has_errors(),
        }
    }
    /// Whether something unsafe remains (what the crash explorer asks).
    pub fn unsafe_remains(&self) -> bool {
        match &self.remaining {
            Some(rem) => rem.iter().any(|p| p.severity == Severity::Unsafe),
            None => self.has_unsafe(),
        }
    }
    /// e2fsck's exit code: 0 clean, 1 errors corrected, 4 errors left
    /// uncorrected (8, an operational error, is [`exit_code`] of an `Err`).
    pub fn exit_code(&self) -> i32 {
        if self.errors_remain() {
            4
        } else if self.has_errors() {
            1
        } else {
            0
        }
    }
    /// The problems of one severity.
    pub fn of_severity(&self, s: Severity) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.severity == s)
    }
}

/// e2fsck's exit code for the result of [`check`]: an error (the device
/// cannot be read, the image is not ext4 or uses a feature ordo does not
/// check) is an operational error, 8.
pub fn exit_code(result: &Result<FsckReport, FsError>) -> i32 {
    match result {
        Ok(r) => r.exit_code(),
        Err(_) => 8,
    }
}

/// Check the image on `dev`; with `opts.repair_benign`, repair the benign
/// problems when they are the only ones, then check again.
///
/// Returns `Err` only for operational errors: the device cannot be read, no
/// valid ext4 superblock exists (neither the primary nor a backup), or the
/// image uses a feature this checker does not cover. A primary superblock
/// that is bad while a backup is good is an unsafe problem in the report.
pub fn check(dev: &dyn BlockDevice, opts: &FsckOptions) -> Result<FsckReport, FsError> {
    let disk = Disk::new(dev);
    let mut first = checker::Checker::run(&disk, opts)?;
    let mut report = first.report_out();
    let may_repair = opts.repair_benign && !report.journal_needs_recovery;
    if may_repair && report.has_errors() && !report.has_unsafe() && !report.truncated {
        let repairs = repair::repair(&disk, &mut first, repair_time(opts))?;
        report.repairs = repairs;
        let again = checker::Checker::run(&disk, opts)?;
        report.remaining = Some(again.report_out().problems);
    } else if may_repair && !report.problems.is_empty() && !report.has_errors() {
        // Silent fixes e2fsck would make too (superblock free counts, a
        // stale orphan-list head): not errors, but the next mount and
        // `e2fsck -fn` should see them right.
        let repairs = repair::repair(&disk, &mut first, repair_time(opts))?;
        report.repairs = repairs;
    }
    Ok(report)
}

/// The `i_dtime` a repair stamps: one reading of the check's clock
/// (never 0, which means "in use").
fn repair_time(opts: &FsckOptions) -> u32 {
    let clock = opts.clock.clone().unwrap_or_else(crate::clock::system);
    clock.now().sec.clamp(1, u32::MAX as i64) as u32
}

/// Block access in file-system blocks over a device whose block size may
/// differ (the CLI opens an image before it knows the file-system block
/// size).
pub(crate) struct Disk<'a> {
    dev: &'a dyn BlockDevice,
    dev_bs: u64,
    /// File-system block size, set once the superblock is read.
    bs: std::cell::Cell<u64>,
}

impl<'a> Disk<'a> {
    fn new(dev: &'a dyn BlockDevice) -> Self {
        let dev_bs = dev.block_size() as u64;
        Disk {
            dev,
            dev_bs,
            bs: std::cell::Cell::new(dev_bs),
        }
    }

    pub(crate) fn set_block_size(&self, bs: u64) {
        self.bs.set(bs);
    }

    pub(crate) fn block_size(&self) -> u64 {
        self.bs.get()
    }

    /// Size of the device in bytes.
    pub(crate) fn size_bytes(&self) -> u64 {
        self.dev.block_count().saturating_mul(self.dev_bs)
    }

    /// Read `buf.len()` bytes at byte `offset`.
    pub(crate) fn read_bytes(
        &self,
        offset: u64,
        buf: &mut [u8],
        class: BlockClass,
    ) -> Result<(), FsError> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size_bytes())
            .ok_or_else(|| {
                FsError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at byte {offset} is past the end of the device",
                        buf.len()
                    ),
                ))
            })?;
        let first = offset / self.dev_bs;
        let last = end.div_ceil(self.dev_bs);
        let skip = (offset - first * self.dev_bs) as usize;
        if skip == 0 && (buf.len() as u64).is_multiple_of(self.dev_bs) {
            self.dev.read(first, buf, class)?;
            return Ok(());
        }
        let mut tmp = vec![0u8; ((last - first) * self.dev_bs) as usize];
        self.dev.read(first, &mut tmp, class)?;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        Ok(())
    }

    /// Read `count` file-system blocks starting at `block`.
    pub(crate) fn read_blocks(
        &self,
        block: u64,
        count: u64,
        class: BlockClass,
    ) -> Result<Vec<u8>, FsError> {
        let bs = self.block_size();
        let mut buf = vec![0u8; (count * bs) as usize];
        self.read_bytes(block * bs, &mut buf, class)?;
        Ok(buf)
    }

    pub(crate) fn read_block(&self, block: u64, class: BlockClass) -> Result<Vec<u8>, FsError> {
        self.read_blocks(block, 1, class)
    }

    /// Write `data` at byte `offset` (read-modify-write of partial device
    /// blocks).
    pub(crate) fn write_bytes(
        &self,
        offset: u64,
        data: &[u8],
        class: BlockClass,
    ) -> Result<(), FsError> {
        let end = offset + data.len() as u64;
        let first = offset / self.dev_bs;
        let last = end.div_ceil(self.dev_bs);
        let skip = (offset - first * self.dev_bs) as usize;
        if skip == 0 && (data.len() as u64).is_multiple_of(self.dev_bs) {
            self.dev.write(first, data, WriteFlags::new(class))?;
            return Ok(());
        }
        let mut tmp = vec![0u8; ((last - first) * self.dev_bs) as usize];
        self.dev.read(first, &mut tmp, class)?;
        tmp[skip..skip + data.len()].copy_from_slice(data);
        self.dev.write(first, &tmp, WriteFlags::new(class))?;
        Ok(())
    }

    pub(crate) fn write_block(
        &self,
        block: u64,
        data: &[u8],
        class: BlockClass,
    ) -> Result<(), FsError> {
        debug_assert_eq!(data.len() as u64, self.block_size());
        self.write_bytes(block * self.block_size(), data, class)
    }

    pub(crate) fn flush(&self) -> Result<(), FsError> {
        self.dev.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mkfs::{mkfs, MkfsOptions};
    use ordo_dev::MemDevice;

    fn fresh(block_size: u32, size_bytes: u64) -> MemDevice {
        let dev = MemDevice::new(block_size, size_bytes / block_size as u64).unwrap();
        mkfs(
            &dev,
            &MkfsOptions {
                size_bytes,
                block_size,
                ..MkfsOptions::default()
            },
        )
        .unwrap();
        dev
    }

    /// Byte offset of bit `bit` of group 0's block bitmap.
    fn block_bitmap_block(dev: &MemDevice) -> u64 {
        let bs = dev.block_size() as u64;
        let disk = Disk::new(dev);
        let gdt = if bs == 1024 { 2 } else { 1 };
        let mut gd = vec![0u8; 8];
        disk.read_bytes(gdt * bs, &mut gd, BlockClass::GroupMeta)
            .unwrap();
        u32::from_le_bytes([gd[0], gd[1], gd[2], gd[3]]) as u64
    }

    #[test]
    fn fresh_ordo_images_are_clean() {
        for (bs, size) in [(1024u32, 8u64 << 20), (4096, 64 << 20)] {
            let dev = fresh(bs, size);
            let r = check(&dev, &FsckOptions::default()).unwrap();
            assert!(r.is_clean(), "{bs}-byte blocks: {:?}", r.problems);
            assert_eq!(r.exit_code(), 0);
            assert_eq!(r.stats.directories, 2, "root and lost+found");
        }
    }

    #[test]
    fn fresh_ordo_image_with_a_journal_is_clean() {
        let features =
            crate::mkfs::parse_features("has_journal", crate::mkfs::DEFAULT_FEATURES).unwrap();
        let dev = MemDevice::new(4096, (64 << 20) / 4096).unwrap();
        mkfs(
            &dev,
            &MkfsOptions {
                size_bytes: 64 << 20,
                features,
                ..MkfsOptions::default()
            },
        )
        .unwrap();
        let r = check(&dev, &FsckOptions::default()).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        assert!(!r.journal_needs_recovery);
    }

    #[test]
    fn device_block_size_may_differ_from_the_file_system() {
        // A 4 KiB file system read through a 1 KiB device, and back.
        let dev = fresh(4096, 16 << 20);
        let image = dev.to_image();
        let small = MemDevice::from_image(1024, &image).unwrap();
        assert!(check(&small, &FsckOptions::default()).unwrap().is_clean());
        let dev = fresh(1024, 8 << 20);
        let big = MemDevice::from_image(4096, &dev.to_image()).unwrap();
        assert!(check(&big, &FsckOptions::default()).unwrap().is_clean());
    }

    /// Seeded random damage to the metadata blocks of small images: the
    /// checker (and the repair, when it runs) returns, never panics.
    #[test]
    fn random_damage_never_panics() {
        use rand::{Rng, SeedableRng};
        for (bs, size) in [(1024u32, 4u64 << 20), (4096, 16 << 20)] {
            let base = fresh(bs, size).to_image();
            let meta_blocks = if bs == 1024 { 300 } else { 80 };
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(bs as u64);
            for case in 0..300 {
                let mut img = base.clone();
                for _ in 0..rng.gen_range(1..=16) {
                    let at = rng.gen_range(0..meta_blocks * bs as usize);
                    img[at] ^= rng.gen_range(1..=255u8);
                }
                let dev = MemDevice::from_image(bs, &img).unwrap();
                let repair_benign = case % 2 == 0;
                let r = check(
                    &dev,
                    &FsckOptions {
                        repair_benign,
                        ..FsckOptions::default()
                    },
                );
                if let Ok(r) = &r {
                    if r.has_unsafe() {
                        assert!(
                            r.repairs.is_empty(),
                            "case {case}: repaired an unsafe image"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn not_ext4_is_an_operational_error() {
        let dev = MemDevice::new(4096, 256).unwrap();
        let r = check(&dev, &FsckOptions::default());
        assert!(r.is_err());
        assert_eq!(exit_code(&r), 8);
    }

    /// The bitmap block at byte `field` of group 0's descriptor (0: the
    /// block bitmap, 4: the inode bitmap).
    fn group0_bitmap_block(dev: &MemDevice, field: usize) -> u64 {
        let bs = dev.block_size() as u64;
        let disk = Disk::new(dev);
        let gdt = if bs == 1024 { 2 } else { 1 };
        let mut gd = vec![0u8; 8];
        disk.read_bytes(gdt * bs, &mut gd, BlockClass::GroupMeta)
            .unwrap();
        u32::from_le_bytes(gd[field..field + 4].try_into().unwrap()) as u64
    }

    /// Set or clear bit `i` of bitmap block `bm_block`.
    fn put_bit(dev: &MemDevice, bm_block: u64, i: usize, on: bool) {
        let disk = Disk::new(dev);
        disk.set_block_size(dev.block_size() as u64);
        let mut bm = disk.read_block(bm_block, BlockClass::GroupMeta).unwrap();
        if on {
            bm[i / 8] |= 1 << (i % 8);
        } else {
            bm[i / 8] &= !(1 << (i % 8));
        }
        disk.write_block(bm_block, &bm, BlockClass::GroupMeta)
            .unwrap();
    }

    /// `dev` has exactly one error, of `class` and `severity`, naming
    /// `bm_block`; the benign repair fixes it.
    fn one_bitmap_problem_repaired(
        dev: &MemDevice,
        bm_block: u64,
        class: ProblemClass,
        severity: Severity,
    ) {
        let r = check(dev, &FsckOptions::default()).unwrap();
        assert!(!r.is_clean());
        assert!(!r.has_unsafe(), "{:?}", r.problems);
        let errors: Vec<&Problem> = r
            .problems
            .iter()
            .filter(|p| p.severity > Severity::Info && p.class != ProblemClass::GroupCounts)
            .collect();
        assert_eq!(errors.len(), 1, "{:?}", r.problems);
        assert_eq!(
            (errors[0].class, errors[0].severity, errors[0].block),
            (class, severity, Some(bm_block)),
            "{}",
            errors[0]
        );
        assert_eq!(r.exit_code(), 4);
        let fixed = check(
            dev,
            &FsckOptions {
                repair_benign: true,
                ..FsckOptions::default()
            },
        )
        .unwrap();
        assert!(!fixed.repairs.is_empty());
        assert_eq!(fixed.remaining.as_deref(), Some(&[][..]));
        assert_eq!(fixed.exit_code(), 1);
        assert!(check(dev, &FsckOptions::default()).unwrap().is_clean());
    }

    #[test]
    fn a_block_in_use_but_free_is_a_hazard_and_repaired() {
        let dev = fresh(4096, 32 << 20);
        let bb = group0_bitmap_block(&dev, 0);
        // Block 0 (the superblock) is in use: clear its bit.
        put_bit(&dev, bb, 0, false);
        one_bitmap_problem_repaired(&dev, bb, ProblemClass::BlockUsedButFree, Severity::Hazard);
        let r = check(&dev, &FsckOptions::default()).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
    }

    #[test]
    fn a_leaked_block_is_benign_and_repaired() {
        let dev = fresh(4096, 32 << 20);
        let bb = group0_bitmap_block(&dev, 0);
        // Mark the last free block of the image (8192 blocks, one group).
        let disk = Disk::new(&dev);
        disk.set_block_size(4096);
        let bm = disk.read_block(bb, BlockClass::GroupMeta).unwrap();
        let free = (0..8192)
            .rev()
            .find(|&i| bm[i / 8] & (1 << (i % 8)) == 0)
            .unwrap();
        put_bit(&dev, bb, free, true);
        one_bitmap_problem_repaired(&dev, bb, ProblemClass::BlockBitmap, Severity::Benign);
    }

    #[test]
    fn an_inode_in_use_but_free_is_a_hazard_and_a_leaked_one_benign() {
        let dev = fresh(4096, 32 << 20);
        let ib = group0_bitmap_block(&dev, 4);
        // The root directory (inode 2, bit 1) is in use: clear its bit.
        put_bit(&dev, ib, 1, false);
        one_bitmap_problem_repaired(&dev, ib, ProblemClass::InodeUsedButFree, Severity::Hazard);
        // Inode 100 is free on a fresh image: mark it.
        put_bit(&dev, ib, 99, true);
        one_bitmap_problem_repaired(&dev, ib, ProblemClass::InodeBitmap, Severity::Benign);
    }

    /// Adds `delta_sectors` to the root inode's i_blocks, checksum kept valid.
    fn shift_root_iblocks(dev: &MemDevice, delta_sectors: i64) {
        use super::layout::{Inode, Super, INCOMPAT_64BIT, I_BLOCKS_LO};
        let disk = Disk::new(dev);
        disk.set_block_size(4096);
        let mut sb_raw = vec![0u8; 1024];
        disk.read_bytes(1024, &mut sb_raw, BlockClass::Super)
            .unwrap();
        let sb = Super::decode(&sb_raw);
        let mut gd = vec![0u8; 12];
        disk.read_bytes(4096, &mut gd, BlockClass::GroupMeta)
            .unwrap();
        let itable = u32::from_le_bytes([gd[8], gd[9], gd[10], gd[11]]) as u64;
        let mut it = disk.read_block(itable, BlockClass::InodeTable).unwrap();
        let mut inode = Inode::decode(&it[256..512], sb.has_incompat(INCOMPAT_64BIT));
        let old = u32::from_le_bytes(inode.raw[I_BLOCKS_LO..I_BLOCKS_LO + 4].try_into().unwrap());
        let new = (old as i64 + delta_sectors) as u32;
        inode.raw[I_BLOCKS_LO..I_BLOCKS_LO + 4].copy_from_slice(&new.to_le_bytes());
        inode.set_checksum(sb.csum_seed(), 2);
        it[256..512].copy_from_slice(&inode.raw);
        disk.write_block(itable, &it, BlockClass::InodeTable)
            .unwrap();
    }

    #[test]
    fn i_blocks_too_high_is_benign_and_lowered() {
        let dev = fresh(4096, 32 << 20);
        shift_root_iblocks(&dev, 8);
        let r = check(&dev, &FsckOptions::default()).unwrap();
        assert!(!r.has_unsafe(), "{:?}", r.problems);
        assert!(r
            .problems
            .iter()
            .any(|p| p.class == ProblemClass::Inode && p.ino == Some(2)));
        let fixed = check(
            &dev,
            &FsckOptions {
                repair_benign: true,
                ..FsckOptions::default()
            },
        )
        .unwrap();
        assert!(fixed.repairs.iter().any(|l| l.contains("i_blocks lowered")));
        assert!(check(&dev, &FsckOptions::default()).unwrap().is_clean());
    }

    #[test]
    fn i_blocks_too_low_is_unsafe() {
        let dev = fresh(4096, 32 << 20);
        shift_root_iblocks(&dev, -8);
        let r = check(&dev, &FsckOptions::default()).unwrap();
        assert!(r.has_unsafe(), "{:?}", r.problems);
        assert!(r.problems.iter().any(|p| p.severity == Severity::Unsafe
            && p.class == ProblemClass::Inode
            && p.ino == Some(2)));
    }

    #[test]
    fn unsafe_problems_block_the_repair() {
        let dev = fresh(4096, 32 << 20);
        let r0 = check(&dev, &FsckOptions::default()).unwrap();
        assert!(r0.is_clean());
        let disk = Disk::new(&dev);
        disk.set_block_size(4096);
        let bb = block_bitmap_block(&dev);
        let mut bm = disk.read_block(bb, BlockClass::GroupMeta).unwrap();
        bm[0] &= !1; // benign
        disk.write_block(bb, &bm, BlockClass::GroupMeta).unwrap();
        // And an unsafe one: the root inode's checksum no longer matches.
        let gd_itable = {
            let mut gd = vec![0u8; 12];
            disk.read_bytes(4096, &mut gd, BlockClass::GroupMeta)
                .unwrap();
            u32::from_le_bytes([gd[8], gd[9], gd[10], gd[11]]) as u64
        };
        let mut it = disk.read_block(gd_itable, BlockClass::InodeTable).unwrap();
        it[256 + 0x08] ^= 0x40; // inode 2's i_atime: checksum now wrong
        disk.write_block(gd_itable, &it, BlockClass::InodeTable)
            .unwrap();
        let before = dev.to_image();
        let r = check(
            &dev,
            &FsckOptions {
                repair_benign: true,
                ..FsckOptions::default()
            },
        )
        .unwrap();
        assert!(r.has_unsafe());
        assert!(r.unsafe_remains());
        assert!(r.repairs.is_empty());
        assert_eq!(r.exit_code(), 4);
        assert!(dev.to_image() == before, "repair wrote to an unsafe image");
    }
}
