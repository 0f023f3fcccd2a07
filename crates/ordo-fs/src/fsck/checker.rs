//! The checker's state and its driver, shared by every pass.
//!
//! [`Checker`] holds what the passes find and hand on to each other (as
//! e2fsck's `e2fsck_t` does): the blocks and inodes in use, what pass 1
//! kept about each inode, the links pass 2 counted, and what the benign
//! repair needs (the bitmaps as they should be, the link counts that
//! entries give, the leaked inodes), so that the repair never re-derives
//! anything on its own. [`Checker::run`] runs the passes in e2fsck's
//! order, read-only; each pass lives in its own file:
//!
//! - `pass0.rs`: superblock, group descriptors, metadata blocks;
//! - `pass1.rs`: the inode scan and each inode's fields, `pass1_blocks.rs`:
//!   its extent tree or block map, block ownership, xattr blocks;
//! - `pass2.rs`: directory contents;
//! - `pass3_4.rs`: connectivity and link counts;
//! - `pass5.rs`: bitmaps and free counts;
//! - `journal.rs`: the journal superblock.
//!
//! Everything found is recorded as a [`Problem`] through [`problem!`].

use std::collections::{BTreeMap, HashMap, HashSet};

use ordo_dev::BlockClass;

use super::layout::*;
use super::pass0::{check_features, find_backup_super, geometry, validate_super};
use super::{Disk, FsckOptions, FsckReport, FsckStats, Problem, ProblemClass, Severity};
use crate::error::FsError;

/// A plain bit vector.
#[derive(Clone, Debug)]
pub(crate) struct Bits {
    words: Vec<u64>,
    len: u64,
}

impl Bits {
    pub(crate) fn new(len: u64) -> Bits {
        Bits {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }
    pub(crate) fn get(&self, i: u64) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    /// Bits `start..start + n` (`n <= 64`) as the low bits of a word, bit
    /// `start` lowest; bits past the end read as clear.
    pub(crate) fn word_at(&self, start: u64, n: u32) -> u64 {
        debug_assert!(n <= 64);
        if n == 0 || start >= self.len {
            return 0;
        }
        let w = (start / 64) as usize;
        let s = start % 64;
        let mut v = self.words[w] >> s;
        if s > 0 {
            v |= self.words.get(w + 1).copied().unwrap_or(0) << (64 - s);
        }
        if n < 64 {
            v &= (1u64 << n) - 1;
        }
        v
    }
    /// Set bit `i`; returns whether it was already set.
    pub(crate) fn set(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let was = *w & (1 << (i % 64)) != 0;
        *w |= 1 << (i % 64);
        was
    }
    pub(crate) fn clear(&mut self, i: u64) {
        if i < self.len {
            self.words[(i / 64) as usize] &= !(1 << (i % 64));
        }
    }
}

/// What pass 1 keeps about an in-use inode.
#[derive(Clone, Debug)]
pub(crate) struct InodeInfo {
    pub(crate) mode: u16,
    pub(crate) links: u16,
    pub(crate) flags: u32,
    pub(crate) generation: u32,
    /// Directory blocks (logical, physical), in logical order.
    pub(crate) dir_blocks: Vec<(u64, u64)>,
    /// Physical blocks this inode claims (data, tree, xattr): freed when a
    /// leaked inode is released.
    pub(crate) claimed: Vec<(u64, u64)>,
    /// The attribute block this inode's references were counted for
    /// (the repair must not free a block other inodes still share).
    pub(crate) xattr_block: Option<u64>,
}

impl InodeInfo {
    pub(crate) fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
}

/// Where a directory entry naming a directory is.
#[derive(Clone, Debug)]
pub(crate) struct DirName {
    /// The directory holding the entry.
    pub(crate) dir: u32,
    /// Physical block of the entry and its byte offset in the block.
    pub(crate) pblk: u64,
    pub(crate) off: usize,
    pub(crate) name: String,
    /// The directory named.
    pub(crate) ino: u32,
}

/// An extent index entry whose key is lower than its child's first key.
#[derive(Clone, Debug)]
pub(crate) struct StaleIndexKey {
    pub(crate) ino: u32,
    /// The tree block holding the index entry (`None`: the inode's
    /// `i_block`).
    pub(crate) node_block: Option<u64>,
    /// The entry's position in its node.
    pub(crate) entry: usize,
    /// The child's first key, which the entry should carry.
    pub(crate) key: u32,
}

/// Everything one run of the checker found.
pub(crate) struct Checker<'a> {
    pub(crate) disk: &'a Disk<'a>,
    pub(crate) sb: Super,
    pub(crate) geo: Geometry,
    pub(crate) gds: Vec<GroupDesc>,
    /// Whether group `g`'s descriptor locations are usable.
    pub(crate) gd_ok: Vec<bool>,
    pub(crate) problems: Vec<Problem>,
    pub(crate) truncated: bool,
    pub(super) max_problems: usize,
    /// Blocks holding file-system metadata (superblocks, GDT, reserved
    /// GDT, bitmaps, inode tables).
    pub(crate) meta: Bits,
    /// Blocks in use: metadata plus every block claimed by an inode.
    pub(crate) used: Bits,
    /// Inodes in use (reserved inodes included).
    pub(crate) inode_used: Bits,
    /// Inodes pass 1 scanned (outside uninit groups and itable_unused).
    pub(crate) inode_scanned: Bits,
    pub(crate) inodes: BTreeMap<u32, InodeInfo>,
    /// Unused inodes whose mode is set but dtime is zero.
    pub(crate) zero_dtime: Vec<u32>,
    /// The orphan chain, in order.
    pub(crate) orphans: Vec<u32>,
    /// Links counted from directory entries (".", ".." included).
    pub(crate) counted: HashMap<u32, u32>,
    /// Parent of each directory, from the first entry naming it.
    pub(crate) parent: HashMap<u32, u32>,
    /// What each directory's ".." says.
    pub(crate) dotdot: HashMap<u32, u32>,
    /// Directories with entries other than "." and "..".
    pub(crate) nonempty_dirs: HashSet<u32>,
    /// Every entry naming each directory (other than "." and ".."), in the
    /// order pass 2 found them.
    pub(super) dir_names: HashMap<u32, Vec<DirName>>,
    /// Stale second names of directories moved by an interrupted rename,
    /// for the benign repair to remove.
    pub(crate) stale_names: Vec<DirName>,
    /// Blocks of unindexed directories still shaped as htree root or node
    /// blocks, for the benign repair to rewrite as linear blocks: (dir,
    /// logical block, physical block).
    pub(crate) leftover_dx: Vec<(u32, u64, u64)>,
    /// In-use inodes to release in the benign repair (no entry names them).
    pub(crate) leaked: Vec<u32>,
    /// Inodes whose i_blocks is higher than their blocks add up to, with
    /// the counted value in i_blocks' own unit, for the benign repair.
    pub(crate) high_iblocks: Vec<(u32, u64)>,
    /// Extent index keys lower than their child's first key, for the
    /// benign repair to raise.
    pub(crate) stale_index_keys: Vec<StaleIndexKey>,
    /// Xattr blocks: references counted, and the refcount on disk. A
    /// refcount above the count is benign: the benign repair lowers it.
    pub(super) xattr: HashMap<u64, (u32, u32)>,
    /// The on-disk bitmaps as libext2fs reads them (uninit groups
    /// emulated), for pass 5 and the repair.
    pub(crate) disk_block_bitmaps: Vec<Option<Vec<u8>>>,
    pub(crate) disk_inode_bitmaps: Vec<Option<Vec<u8>>>,
    /// The journal has transactions to replay (or the flag says so).
    pub(crate) journal_needs_recovery: bool,
}

/// Record a problem: `problem!(checker, Severity, ProblemClass, ino, block,
/// format...)`.
macro_rules! problem {
    ($c:expr, $sev:ident, $class:ident, $ino:expr, $block:expr, $($fmt:tt)*) => {
        $c.report(
            $crate::fsck::Severity::$sev,
            $crate::fsck::ProblemClass::$class,
            $ino,
            $block,
            format!($($fmt)*),
        )
    };
}
pub(crate) use problem;

/// Largest extent-tree depth ext4 allows.
pub(super) const EXT_MAX_DEPTH: u16 = 5;
/// ext4's per-inode link limit; a directory past it has i_links_count 1.
pub(super) const EXT4_LINK_MAX: u32 = 65000;

impl<'a> Checker<'a> {
    pub(crate) fn report(
        &mut self,
        severity: Severity,
        class: ProblemClass,
        ino: Option<u32>,
        block: Option<u64>,
        message: String,
    ) {
        if self.problems.len() >= self.max_problems {
            self.truncated = true;
            return;
        }
        self.problems.push(Problem {
            severity,
            class,
            ino,
            block,
            message,
        });
    }

    /// The report of this run.
    pub(crate) fn report_out(&self) -> FsckReport {
        let mut stats = FsckStats {
            inodes_count: self.geo.inodes_count as u64,
            blocks_count: self.geo.blocks_count,
            ..FsckStats::default()
        };
        for i in 1..=self.geo.inodes_count as u64 {
            if self.inode_used.get(i) {
                stats.inodes_used += 1;
            }
        }
        // As e2fsck counts it: everything not free (block 0 of a 1 KiB
        // file system, outside every group, counts as used).
        let mut free = 0;
        for b in self.geo.first_data_block..self.geo.blocks_count {
            if !self.used.get(b) {
                free += 1;
            }
        }
        stats.blocks_used = self.geo.blocks_count - free;
        for info in self.inodes.values() {
            match info.mode & S_IFMT {
                S_IFDIR => stats.directories += 1,
                S_IFREG => stats.regular_files += 1,
                S_IFLNK => stats.symlinks += 1,
                _ => {}
            }
        }
        FsckReport {
            problems: self.problems.clone(),
            truncated: self.truncated,
            repairs: Vec::new(),
            remaining: None,
            journal_needs_recovery: self.journal_needs_recovery,
            stats,
        }
    }

    /// Run every pass. `Err` only for operational errors.
    pub(crate) fn run(disk: &'a Disk<'a>, opts: &FsckOptions) -> Result<Checker<'a>, FsError> {
        let raw = read_super_bytes(disk, 1024)?;
        let sb = Super::decode(&raw);
        let mut early = Vec::new();
        if let Err(why) = validate_super(&sb, disk.size_bytes()) {
            // e2fsck falls back to a backup superblock: the image is not
            // clean, but it is still an ext4 image.
            if let Some(g) = find_backup_super(disk) {
                early.push(Problem {
                    severity: Severity::Unsafe,
                    class: ProblemClass::Superblock,
                    ino: None,
                    block: Some(if sb.log_block_size == 0 { 1 } else { 0 }),
                    message: format!(
                        "primary superblock (byte 1024): {why}; a valid backup exists in group 1 \
                         (block {g}); not checking further from a bad primary"
                    ),
                });
                return Ok(Checker::stub(disk, sb, early, opts));
            }
            return Err(FsError::corrupt(0, "superblock", why));
        }
        check_features(&sb)?;
        let geo = geometry(&sb);
        disk.set_block_size(geo.block_size);
        let mut c = Checker {
            disk,
            meta: Bits::new(geo.blocks_count),
            used: Bits::new(geo.blocks_count),
            inode_used: Bits::new(geo.inodes_count as u64 + 1),
            inode_scanned: Bits::new(geo.inodes_count as u64 + 1),
            sb,
            gds: Vec::new(),
            gd_ok: Vec::new(),
            problems: early,
            truncated: false,
            max_problems: opts.max_problems.max(1),
            inodes: BTreeMap::new(),
            zero_dtime: Vec::new(),
            orphans: Vec::new(),
            counted: HashMap::new(),
            parent: HashMap::new(),
            dotdot: HashMap::new(),
            nonempty_dirs: HashSet::new(),
            dir_names: HashMap::new(),
            stale_names: Vec::new(),
            leftover_dx: Vec::new(),
            leaked: Vec::new(),
            high_iblocks: Vec::new(),
            stale_index_keys: Vec::new(),
            xattr: HashMap::new(),
            disk_block_bitmaps: Vec::new(),
            disk_inode_bitmaps: Vec::new(),
            journal_needs_recovery: false,
            geo,
        };
        c.pass0()?;
        c.pass1()?;
        c.pass2()?;
        c.pass3();
        c.pass4();
        c.pass5()?;
        c.check_journal()?;
        Ok(c)
    }

    fn stub(disk: &'a Disk<'a>, sb: Super, problems: Vec<Problem>, opts: &FsckOptions) -> Self {
        let geo = Geometry {
            block_size: 1024,
            blocks_count: 0,
            first_data_block: 0,
            blocks_per_group: 1,
            inodes_per_group: 0,
            inodes_count: 0,
            groups: 0,
            inode_size: 128,
            desc_size: 32,
            itable_blocks: 0,
            gdt_blocks: 0,
            csum_seed: 0,
        };
        Checker {
            disk,
            sb,
            geo,
            gds: Vec::new(),
            gd_ok: Vec::new(),
            problems,
            truncated: false,
            max_problems: opts.max_problems,
            meta: Bits::new(0),
            used: Bits::new(0),
            inode_used: Bits::new(0),
            inode_scanned: Bits::new(0),
            inodes: BTreeMap::new(),
            zero_dtime: Vec::new(),
            orphans: Vec::new(),
            counted: HashMap::new(),
            parent: HashMap::new(),
            dotdot: HashMap::new(),
            nonempty_dirs: HashSet::new(),
            dir_names: HashMap::new(),
            stale_names: Vec::new(),
            leftover_dx: Vec::new(),
            leaked: Vec::new(),
            high_iblocks: Vec::new(),
            stale_index_keys: Vec::new(),
            xattr: HashMap::new(),
            disk_block_bitmaps: Vec::new(),
            disk_inode_bitmaps: Vec::new(),
            journal_needs_recovery: false,
        }
    }

    /// How many inodes of group `g` e2fsck scans.
    pub(crate) fn scan_limit(&self, g: u32) -> u32 {
        let gd = &self.gds[g as usize];
        let ipg = self.geo.inodes_per_group;
        if !self.sb.gdt_csum() {
            return ipg;
        }
        if gd.flags & BG_INODE_UNINIT != 0 {
            return 0;
        }
        ipg - gd.itable_unused.min(ipg)
    }

    /// Byte position of inode `ino` (block, offset in block).
    pub(crate) fn inode_location(&self, ino: u32) -> Option<(u64, usize)> {
        if ino == 0 || ino > self.geo.inodes_count {
            return None;
        }
        let g = (ino - 1) / self.geo.inodes_per_group;
        let idx = ((ino - 1) % self.geo.inodes_per_group) as u64;
        if !*self.gd_ok.get(g as usize)? {
            return None;
        }
        let byte = idx * self.geo.inode_size as u64;
        let blk = self.gds[g as usize].inode_table + byte / self.geo.block_size;
        Some((blk, (byte % self.geo.block_size) as usize))
    }

    pub(crate) fn read_inode(&self, ino: u32) -> Result<Option<Inode>, FsError> {
        let Some((blk, off)) = self.inode_location(ino) else {
            return Ok(None);
        };
        let block = self.disk.read_block(blk, BlockClass::InodeTable)?;
        let raw = &block[off..off + self.geo.inode_size as usize];
        Ok(Some(Inode::decode(
            raw,
            self.sb.has_incompat(INCOMPAT_64BIT),
        )))
    }
}
