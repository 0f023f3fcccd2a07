//! The checker proper: e2fsck's five passes over one image, read-only.
//!
//! Everything found is recorded as a [`Problem`]; the checker also keeps
//! what the benign repair needs (the bitmaps as they should be, the link
//! counts that entries give, the leaked inodes), so that the repair never
//! re-derives anything on its own.

use std::collections::{BTreeMap, HashMap, HashSet};

use ordo_dev::BlockClass;

use super::layout::*;
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

fn bit(bytes: &[u8], i: u64) -> bool {
    bytes
        .get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
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

/// Everything one run of the checker found.
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

pub(crate) struct Checker<'a> {
    pub(crate) disk: &'a Disk<'a>,
    pub(crate) sb: Super,
    pub(crate) geo: Geometry,
    pub(crate) gds: Vec<GroupDesc>,
    /// Whether group `g`'s descriptor locations are usable.
    pub(crate) gd_ok: Vec<bool>,
    pub(crate) problems: Vec<Problem>,
    pub(crate) truncated: bool,
    max_problems: usize,
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
    dir_names: HashMap<u32, Vec<DirName>>,
    /// Stale second names of directories moved by an interrupted rename,
    /// for the benign repair to remove.
    pub(crate) stale_names: Vec<DirName>,
    /// In-use inodes to release in the benign repair (no entry names them).
    pub(crate) leaked: Vec<u32>,
    /// Inodes whose i_blocks is higher than their blocks add up to, with
    /// the counted value in i_blocks' own unit, for the benign repair.
    pub(crate) high_iblocks: Vec<(u32, u64)>,
    /// Extent index keys lower than their child's first key, for the
    /// benign repair to raise.
    pub(crate) stale_index_keys: Vec<StaleIndexKey>,
    /// Xattr blocks: references counted, and the refcount on disk.
    xattr: HashMap<u64, (u32, u32)>,
    /// The on-disk bitmaps as libext2fs reads them (uninit groups
    /// emulated), for pass 5 and the repair.
    pub(crate) disk_block_bitmaps: Vec<Option<Vec<u8>>>,
    pub(crate) disk_inode_bitmaps: Vec<Option<Vec<u8>>>,
    /// The journal has transactions to replay (or the flag says so).
    pub(crate) journal_needs_recovery: bool,
}

macro_rules! problem {
    ($c:expr, $sev:ident, $class:ident, $ino:expr, $block:expr, $($fmt:tt)*) => {
        $c.report(Severity::$sev, ProblemClass::$class, $ino, $block, format!($($fmt)*))
    };
}

/// Largest extent-tree depth ext4 allows.
const EXT_MAX_DEPTH: u16 = 5;
/// ext4's per-inode link limit; a directory past it has i_links_count 1.
const EXT4_LINK_MAX: u32 = 65000;

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
            leaked: Vec::new(),
            high_iblocks: Vec::new(),
            stale_index_keys: Vec::new(),
            xattr: HashMap::new(),
            disk_block_bitmaps: Vec::new(),
            disk_inode_bitmaps: Vec::new(),
            journal_needs_recovery: false,
        }
    }

    // ---------------------------------------------------------------
    // pass 0: superblock checksum, group descriptors, metadata blocks
    // ---------------------------------------------------------------

    fn pass0(&mut self) -> Result<(), FsError> {
        let sb_block = if self.geo.block_size == 1024 { 1 } else { 0 };
        if self.sb.metadata_csum() {
            let want = Super::computed_checksum(&self.sb.raw);
            if want != self.sb.checksum {
                problem!(
                    self,
                    Unsafe,
                    Superblock,
                    None,
                    Some(sb_block),
                    "superblock (block {sb_block}) s_checksum is {:#010x}, computed {want:#010x}",
                    self.sb.checksum
                );
            }
        }
        // Group descriptors.
        let gdt_first = self.geo.first_data_block + 1;
        let gdt = self
            .disk
            .read_blocks(gdt_first, self.geo.gdt_blocks, BlockClass::GroupMeta)?;
        let ds = self.geo.desc_size as usize;
        let seed = self.geo.csum_seed;
        let groups = self.geo.groups;
        for g in 0..groups {
            let raw = &gdt[g as usize * ds..(g as usize + 1) * ds];
            let gd = GroupDesc::decode(raw);
            let gd_block = gdt_first + (g as u64 * ds as u64) / self.geo.block_size;
            if let Some(want) = GroupDesc::computed_checksum(&self.sb, seed, g, raw) {
                if want != gd.checksum {
                    // `e2fsck -n` reports this and exits 0 when nothing
                    // else is wrong; the kernel refuses to mount it, and
                    // the repair rewrites the checksum.
                    problem!(
                        self,
                        Info,
                        GroupDescriptor,
                        None,
                        Some(gd_block),
                        "group {g} descriptor (block {gd_block}) bg_checksum is {:#06x}, computed \
                         {want:#06x} (the kernel will not mount this until it is repaired)",
                        gd.checksum
                    );
                }
            }
            self.gds.push(gd);
            self.gd_ok.push(true);
        }
        // Metadata of every group.
        for g in 0..groups {
            let first = self.geo.group_first_block(g);
            if group_has_super(&self.sb, g) {
                let n = 1 + self.geo.gdt_blocks + self.sb.reserved_gdt_blocks as u64;
                for b in first..first + n {
                    if b < self.geo.blocks_count {
                        self.meta.set(b);
                    }
                }
            }
        }
        for g in 0..groups {
            self.check_group_desc(g);
        }
        for b in 0..self.geo.blocks_count {
            if self.meta.get(b) {
                self.used.set(b);
            }
        }
        Ok(())
    }

    fn check_group_desc(&mut self, g: u32) {
        let gd = self.gds[g as usize].clone();
        let gd_block = self.geo.first_data_block
            + 1
            + (g as u64 * self.geo.desc_size as u64) / self.geo.block_size;
        let flex = self.sb.has_incompat(INCOMPAT_FLEX_BG);
        let gfirst = self.geo.group_first_block(g);
        let glast = gfirst + self.geo.group_block_count(g);
        let (fdb, nblocks) = (self.geo.first_data_block, self.geo.blocks_count);
        let within = |b: u64, n: u64| {
            if flex {
                b >= fdb && b.saturating_add(n) <= nblocks
            } else {
                b >= gfirst && b.saturating_add(n) <= glast
            }
        };
        let items = [
            ("bg_block_bitmap", gd.block_bitmap, 1u64),
            ("bg_inode_bitmap", gd.inode_bitmap, 1),
            ("bg_inode_table", gd.inode_table, self.geo.itable_blocks),
        ];
        for (field, b, n) in items {
            if !within(b, n) {
                problem!(
                    self,
                    Unsafe,
                    GroupDescriptor,
                    None,
                    Some(gd_block),
                    "group {g} descriptor (block {gd_block}) {field} = {b} is outside {}",
                    if flex { "the file system" } else { "its group" }
                );
                self.gd_ok[g as usize] = false;
                continue;
            }
            let mut clash = None;
            for x in b..b + n {
                if self.meta.set(x) && clash.is_none() {
                    clash = Some(x);
                }
            }
            if let Some(x) = clash {
                problem!(
                    self,
                    Unsafe,
                    BlockConflict,
                    None,
                    Some(x),
                    "group {g} descriptor (block {gd_block}) {field} = {b}: block {x} is already \
                     used by other file-system metadata"
                );
            }
        }
        let csum = self.sb.gdt_csum();
        let ipg = self.geo.inodes_per_group;
        // Without group checksums libext2fs ignores these fields, and
        // e2fsck reports them without counting an error.
        if !csum && (gd.flags & (BG_BLOCK_UNINIT | BG_INODE_UNINIT) != 0 || gd.itable_unused != 0) {
            problem!(
                self,
                Info,
                GroupDescriptor,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) bg_flags {:#x} / bg_itable_unused {} set \
                 without group checksums",
                gd.flags,
                gd.itable_unused
            );
        }
        if g == self.geo.groups - 1 && gd.flags & BG_BLOCK_UNINIT != 0 {
            problem!(
                self,
                Info,
                GroupDescriptor,
                None,
                Some(gd_block),
                "last group {g} descriptor (block {gd_block}) has BLOCK_UNINIT set"
            );
        }
        if csum && (gd.itable_unused > ipg || gd.itable_unused > gd.free_inodes) {
            problem!(
                self,
                Unsafe,
                GroupDescriptor,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) bg_itable_unused {} exceeds free inodes \
                 {} or inodes per group {ipg}",
                gd.itable_unused,
                gd.free_inodes
            );
        }
        if gd.free_blocks as u64 > self.geo.blocks_per_group
            || gd.free_inodes > ipg
            || gd.used_dirs > ipg
        {
            problem!(
                self,
                Benign,
                GroupCounts,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) counts out of range: free blocks {}, \
                 free inodes {}, directories {}",
                gd.free_blocks,
                gd.free_inodes,
                gd.used_dirs
            );
        }
    }

    // ---------------------------------------------------------------
    // pass 1: inodes
    // ---------------------------------------------------------------

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

    fn collect_orphans(&mut self) -> Result<(), FsError> {
        let mut ino = self.sb.last_orphan;
        let mut seen = HashSet::new();
        while ino != 0 {
            if ino < self.sb.first_ino || ino > self.geo.inodes_count {
                problem!(
                    self,
                    Unsafe,
                    Orphan,
                    Some(ino),
                    None,
                    "orphan list (superblock s_last_orphan / i_dtime chain) names illegal inode {ino}"
                );
                break;
            }
            if !seen.insert(ino) {
                problem!(
                    self,
                    Unsafe,
                    Orphan,
                    Some(ino),
                    None,
                    "orphan list loops back to inode {ino}"
                );
                break;
            }
            let Some(inode) = self.read_inode(ino)? else {
                break;
            };
            self.orphans.push(ino);
            ino = inode.dtime;
        }
        Ok(())
    }

    fn pass1(&mut self) -> Result<(), FsError> {
        self.collect_orphans()?;
        let orphan_set: HashSet<u32> = self.orphans.iter().copied().collect();
        let isz = self.geo.inode_size as u64;
        let bs = self.geo.block_size;
        let ipg = self.geo.inodes_per_group;
        let is64 = self.sb.has_incompat(INCOMPAT_64BIT);
        // Reserved inodes are always in use.
        for ino in 1..self.sb.first_ino.min(self.geo.inodes_count + 1) {
            self.inode_used.set(ino as u64);
        }
        for g in 0..self.geo.groups {
            if !self.gd_ok[g as usize] {
                continue;
            }
            let n = self.scan_limit(g);
            if n == 0 {
                continue;
            }
            let nblocks = (n as u64 * isz).div_ceil(bs);
            let table = self.gds[g as usize].inode_table;
            // Read the table in bounded chunks.
            let chunk_blocks = 64u64;
            let mut blk = 0;
            while blk < nblocks {
                let cnt = chunk_blocks.min(nblocks - blk);
                let buf = self
                    .disk
                    .read_blocks(table + blk, cnt, BlockClass::InodeTable)?;
                let per_block = bs / isz;
                for i in 0..cnt * per_block {
                    let idx = blk * per_block + i;
                    if idx >= n as u64 {
                        break;
                    }
                    let ino = g * ipg + idx as u32 + 1;
                    let off = (i * isz) as usize;
                    let inode = Inode::decode(&buf[off..off + isz as usize], is64);
                    self.inode_scanned.set(ino as u64);
                    let itable_block = table + blk + i / per_block;
                    self.check_inode(ino, inode, itable_block, orphan_set.contains(&ino))?;
                }
                blk += cnt;
            }
        }
        // Xattr block reference counts.
        let mut xs: Vec<_> = self.xattr.iter().map(|(&b, &v)| (b, v)).collect();
        xs.sort();
        for (b, (counted, on_disk)) in xs {
            if counted != on_disk {
                problem!(
                    self,
                    Unsafe,
                    Xattr,
                    None,
                    Some(b),
                    "xattr block {b} h_refcount is {on_disk}, {counted} inodes refer to it"
                );
            }
        }
        Ok(())
    }

    fn check_inode(
        &mut self,
        ino: u32,
        inode: Inode,
        iblock: u64,
        on_orphan_list: bool,
    ) -> Result<(), FsError> {
        let seed = self.geo.csum_seed;
        if self.sb.metadata_csum() && !inode.checksum_ok(seed, ino) {
            let want = inode.computed_checksum(seed, ino);
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_checksum does not match (computed {want:#010x})"
            );
        }
        let reserved = ino < self.sb.first_ino;
        if reserved && ino != 2 {
            return self.check_reserved_inode(ino, &inode, iblock);
        }
        if inode.links == 0 {
            if on_orphan_list {
                problem!(
                    self,
                    Benign,
                    Orphan,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) is on the orphan list with i_links_count 0: \
                     pending release"
                );
            }
            if ino == 2 {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "root inode (block {iblock}) is not in use (i_links_count 0)"
                );
            } else if inode.dtime == 0 && inode.mode != 0 {
                problem!(
                    self,
                    Benign,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "deleted inode {ino} (block {iblock}) has i_mode {:#o} but zero i_dtime",
                    inode.mode
                );
                self.zero_dtime.push(ino);
            }
            return Ok(());
        }
        self.inode_used.set(ino as u64);
        if inode.dtime != 0 {
            if on_orphan_list {
                problem!(
                    self,
                    Benign,
                    Orphan,
                    Some(ino),
                    Some(iblock),
                    "in-use inode {ino} (block {iblock}) is on the orphan list (i_dtime {})",
                    inode.dtime
                );
            } else {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "in-use inode {ino} (block {iblock}) has i_dtime {} set",
                    inode.dtime
                );
            }
        } else if on_orphan_list {
            problem!(
                self,
                Info,
                Orphan,
                Some(ino),
                Some(iblock),
                "in-use inode {ino} (block {iblock}) is on the orphan list"
            );
        }
        self.check_inode_fields(ino, &inode, iblock);
        let mut info = InodeInfo {
            mode: inode.mode,
            links: inode.links,
            flags: inode.flags,
            generation: inode.generation,
            dir_blocks: Vec::new(),
            claimed: Vec::new(),
        };
        let ftype = inode.file_type();
        if ino == 2 && ftype != S_IFDIR {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "root inode (block {iblock}) i_mode {:#o} is not a directory",
                inode.mode
            );
        }
        let mut counted_blocks: u64 = 0;
        match ftype {
            S_IFREG | S_IFDIR | S_IFLNK => {
                let fast_symlink = ftype == S_IFLNK && inode.size > 0 && inode.size < 60;
                if fast_symlink {
                    self.check_fast_symlink(ino, &inode, iblock);
                } else if inode.flags & INODE_EXTENTS_FL != 0 {
                    let m = self.walk_extents(ino, &inode, iblock, &mut info)?;
                    counted_blocks += m.blocks;
                    self.check_sizes(ino, &inode, iblock, &m);
                    if ftype == S_IFLNK {
                        self.check_slow_symlink(ino, &inode, iblock, &m)?;
                    }
                } else if inode.flags & INODE_INLINE_DATA_FL != 0 {
                    problem!(
                        self,
                        Unsafe,
                        Inode,
                        Some(ino),
                        Some(iblock),
                        "inode {ino} (block {iblock}) i_flags has INLINE_DATA without the feature"
                    );
                } else {
                    let m = self.walk_block_map(ino, &inode, iblock, &mut info)?;
                    counted_blocks += m.blocks;
                    self.check_sizes(ino, &inode, iblock, &m);
                    if ftype == S_IFLNK {
                        self.check_slow_symlink(ino, &inode, iblock, &m)?;
                    }
                }
            }
            S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {
                self.check_special(ino, &inode, iblock);
            }
            _ => {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_mode {:#o} has an invalid file type",
                    inode.mode
                );
            }
        }
        if inode.file_acl != 0 {
            counted_blocks += self.check_xattr_block(ino, &inode, iblock, &mut info)?;
        }
        // i_blocks.
        let huge = self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE);
        let stored = inode.blocks_lo as u64
            | if huge {
                (inode.blocks_hi as u64) << 32
            } else {
                0
            };
        let want = if huge && inode.flags & INODE_HUGE_FILE_FL != 0 {
            counted_blocks
        } else {
            counted_blocks * (self.geo.block_size / 512)
        };
        if stored > want {
            // Too high: a block was counted before its mapping was set, or
            // is still counted after its mapping was cleared (the two are
            // separate in-place writes). Nothing mapped is lost; the
            // repair lowers the count, as FFS's fsck does.
            problem!(
                self,
                Benign,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks is {stored}, counted {want} (too high)"
            );
            self.high_iblocks.push((ino, want));
        } else if stored < want {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks is {stored}, counted {want} (too low)"
            );
        }
        if info.is_dir() && info.dir_blocks.is_empty() {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "directory inode {ino} (block {iblock}) has no blocks"
            );
        }
        self.inodes.insert(ino, info);
        Ok(())
    }

    fn check_inode_fields(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        let isz = self.geo.inode_size as u16;
        if isz > 128 {
            let max = isz - 128;
            let e = inode.extra_isize;
            if e != 0 && (e < 4 || e > max || e & 3 != 0) {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_extra_isize {e} is invalid"
                );
            }
        }
        if inode.faddr != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_faddr is {}, should be zero",
                inode.faddr
            );
        }
        if inode.is_dir() && inode.size_high != 0 && !self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "directory inode {ino} (block {iblock}) i_size_high is {}, should be zero",
                inode.size_high
            );
        }
        if !self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) && inode.blocks_hi != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks_hi is {}, should be zero",
                inode.blocks_hi
            );
        }
        if !self.sb.has_incompat(INCOMPAT_64BIT) && inode.file_acl_hi != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_file_acl_hi is {}, should be zero",
                inode.file_acl_hi
            );
        }
        if inode.flags & INODE_EXTENTS_FL != 0 && !self.sb.has_incompat(INCOMPAT_EXTENTS) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has EXTENTS without the extent feature"
            );
        }
        if inode.flags & INODE_INDEX_FL != 0
            && (!inode.is_dir() || !self.sb.has_compat(COMPAT_DIR_INDEX))
        {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has INDEX on a {} without dir_index",
                if inode.is_dir() {
                    "directory"
                } else {
                    "non-directory"
                }
            );
        }
        if inode.flags & INODE_HUGE_FILE_FL != 0 && !self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has HUGE_FILE without the feature"
            );
        }
        if inode.flags & INODE_EA_INODE_FL != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has EA_INODE without the feature"
            );
        }
    }

    fn check_reserved_inode(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
    ) -> Result<(), FsError> {
        let journal = self.sb.has_compat(COMPAT_HAS_JOURNAL) && ino == self.sb.journal_inum;
        let bad_mode = match ino {
            1 | 8 => false,
            5 => inode.is_dir(),
            7 => inode.mode != 0 && inode.file_type() != S_IFREG,
            _ => inode.mode != 0,
        };
        if bad_mode && !journal {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "reserved inode {ino} (block {iblock}) has bad i_mode {:#o}",
                inode.mode
            );
        }
        let mut info = InodeInfo {
            mode: inode.mode,
            links: inode.links,
            flags: inode.flags,
            generation: inode.generation,
            dir_blocks: Vec::new(),
            claimed: Vec::new(),
        };
        if ino == 7 && self.sb.has_compat(COMPAT_RESIZE_INODE) {
            // The resize inode maps the reserved GDT blocks (already
            // metadata) through one double-indirect block.
            let dind = le32(inode.i_block(), 13 * 4) as u64;
            if dind != 0 {
                self.claim(
                    ino,
                    dind,
                    1,
                    "resize inode double-indirect block",
                    &mut info,
                );
            }
            return Ok(());
        }
        if inode.mode != 0 && inode.flags & INODE_EXTENTS_FL != 0 {
            let m = self.walk_extents(ino, inode, iblock, &mut info)?;
            if journal && m.blocks == 0 {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    Some(ino),
                    Some(iblock),
                    "journal inode {ino} (block {iblock}) has no blocks"
                );
            }
        } else if journal {
            problem!(
                self,
                Unsafe,
                Journal,
                Some(ino),
                Some(iblock),
                "journal inode {ino} (block {iblock}) is not an extent-mapped file (i_mode {:#o})",
                inode.mode
            );
        }
        Ok(())
    }

    fn check_special(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        // As e2fsck: extent/index flags make a device inode bogus, and
        // immutable/append are not allowed on one (i_block past the device
        // number is only looked at by e2fsck together with those flags).
        if inode.flags & (INODE_EXTENTS_FL | INODE_INDEX_FL | INODE_IMMUTABLE_FL | INODE_APPEND_FL)
            != 0
        {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "special inode {ino} (block {iblock}) has bad i_flags {:#x}",
                inode.flags
            );
        }
        if inode.size != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "special inode {ino} (block {iblock}) i_size is {}, should be zero",
                inode.size
            );
        }
    }

    fn check_fast_symlink(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        let ib = inode.i_block();
        let len = ib.iter().position(|&b| b == 0).unwrap_or(60) as u64;
        if inode.flags & INODE_EXTENTS_FL != 0 || len >= 60 || len != inode.size {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "fast symlink inode {ino} (block {iblock}) i_size {} does not match its target \
                 length {len} in i_block (or EXTENTS is set)",
                inode.size
            );
        }
    }

    fn check_slow_symlink(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        m: &Mapping,
    ) -> Result<(), FsError> {
        let bs = self.geo.block_size;
        let bad = |c: &mut Self, why: String| {
            problem!(
                c,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "symlink inode {ino} (block {iblock}): {why}"
            );
        };
        if inode.size == 0 || inode.size >= bs {
            bad(self, format!("i_size {} is invalid", inode.size));
            return Ok(());
        }
        if m.data_blocks != 1 || m.first_pblk.is_none() || m.last_lblk != Some(0) {
            bad(
                self,
                format!("maps {} blocks, should map exactly block 0", m.data_blocks),
            );
            return Ok(());
        }
        let pblk = m.first_pblk.unwrap_or(0);
        if !self.geo.in_range(pblk) {
            return Ok(());
        }
        let data = self.disk.read_block(pblk, BlockClass::Data)?;
        let len = data.iter().position(|&b| b == 0).unwrap_or(data.len()) as u64;
        if len != inode.size {
            bad(
                self,
                format!(
                    "target in block {pblk} is {len} bytes long, i_size is {}",
                    inode.size
                ),
            );
        }
        Ok(())
    }

    fn check_sizes(&mut self, ino: u32, inode: &Inode, iblock: u64, m: &Mapping) {
        let bs = self.geo.block_size;
        if inode.is_dir() {
            let nblock = inode.size / bs;
            let last_plus = m.last_lblk.map_or(0, |l| l + 1);
            let bad = !inode.size.is_multiple_of(bs)
                || nblock > last_plus
                || (nblock < last_plus && last_plus - nblock > self.sb.prealloc_dir_blocks as u64);
            if bad {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "directory inode {ino} (block {iblock}) i_size {} does not match its {} \
                     mapped blocks",
                    inode.size,
                    last_plus
                );
            }
        } else {
            let size = inode.size;
            let bits = bs.trailing_zeros();
            if let Some(l) = m.last_init_lblk {
                if size < l * bs {
                    problem!(
                        self,
                        Unsafe,
                        Inode,
                        Some(ino),
                        Some(iblock),
                        "inode {ino} (block {iblock}) i_size {size} is smaller than its last \
                         written block {l} allows"
                    );
                    return;
                }
            }
            let max = if inode.flags & INODE_EXTENTS_FL != 0 {
                (1u64 << (32 + bits)) - 1
            } else {
                block_map_max_size(bs)
            };
            if size > max {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_size {size} exceeds the largest file size {max}"
                );
            }
        }
    }

    /// Claim `len` blocks from `start` for `ino`: each must be in range,
    /// not metadata, and not claimed before.
    fn claim(&mut self, ino: u32, start: u64, len: u64, what: &str, info: &mut InodeInfo) {
        let end = start.saturating_add(len);
        if start < self.geo.first_data_block || end > self.geo.blocks_count {
            problem!(
                self,
                Unsafe,
                ExtentTree,
                Some(ino),
                Some(start),
                "inode {ino} {what} blocks {start}..{end} are outside the file system"
            );
            return;
        }
        let mut meta_clash = None;
        let mut dup = None;
        let mut n_dup = 0u64;
        for b in start..end {
            if self.meta.get(b) {
                meta_clash.get_or_insert(b);
                n_dup += 1;
            } else if self.used.set(b) {
                dup.get_or_insert(b);
                n_dup += 1;
            }
        }
        info.claimed.push((start, len));
        if let Some(b) = meta_clash {
            problem!(
                self,
                Unsafe,
                BlockConflict,
                Some(ino),
                Some(b),
                "inode {ino} {what} claims block {b} (and {} more of {start}..{end}) that holds \
                 file-system metadata",
                n_dup - 1
            );
        } else if let Some(b) = dup {
            problem!(
                self,
                Unsafe,
                BlockConflict,
                Some(ino),
                Some(b),
                "inode {ino} {what} claims block {b} (and {} more of {start}..{end}) already \
                 claimed by another inode",
                n_dup - 1
            );
        }
    }

    fn walk_extents(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        info: &mut InodeInfo,
    ) -> Result<Mapping, FsError> {
        let mut m = Mapping::default();
        let root = inode.i_block().to_vec();
        let is_dir = inode.is_dir();
        let mut w = Walk {
            ino,
            iblock,
            is_dir,
            seed: Inode::csum_seed(self.geo.csum_seed, ino, inode.generation),
            prev_end: 0,
            nodes_left: self.geo.blocks_count + 1,
        };
        self.extent_node(&mut w, &mut m, info, &root, None, None, 0, u64::MAX, None)?;
        Ok(m)
    }

    #[allow(clippy::too_many_arguments)]
    fn extent_node(
        &mut self,
        w: &mut Walk,
        m: &mut Mapping,
        info: &mut InodeInfo,
        node: &[u8],
        node_block: Option<u64>,
        want_depth: Option<u16>,
        lo: u64,
        hi: u64,
        level_limit: Option<u16>,
    ) -> Result<(), FsError> {
        let ino = w.ino;
        let where_ = match node_block {
            Some(b) => format!("extent block {b}"),
            None => format!("i_block of inode {ino} (block {})", w.iblock),
        };
        let blk_for_problem = node_block.unwrap_or(w.iblock);
        let magic = le16(node, 0);
        let entries = le16(node, 2);
        let max = le16(node, 4);
        let depth = le16(node, 6);
        let cap = ((node.len() - 12) / 12) as u16;
        let mut bad = None;
        if magic != 0xF30A {
            bad = Some(format!("eh_magic is {magic:#06x}"));
        } else if max > cap || max < cap.saturating_sub(2) {
            bad = Some(format!(
                "eh_max {max} does not fit a {}-byte node",
                node.len()
            ));
        } else if entries > max {
            bad = Some(format!("eh_entries {entries} exceeds eh_max {max}"));
        } else if depth > EXT_MAX_DEPTH || level_limit.is_some_and(|l| depth > l) {
            bad = Some(format!("eh_depth {depth} is too deep"));
        } else if want_depth.is_some_and(|d| d != depth) {
            bad = Some(format!(
                "eh_depth {depth}, parent says {}",
                want_depth.unwrap_or(0)
            ));
        } else if node_block.is_some() && entries == 0 {
            bad = Some("a non-root node has no entries".to_string());
        }
        if let Some(why) = bad {
            problem!(
                self,
                Unsafe,
                ExtentTree,
                Some(ino),
                Some(blk_for_problem),
                "inode {ino} {where_}: extent header {why}"
            );
            return Ok(());
        }
        if let Some(b) = node_block {
            // Tree-block checksum in the tail after eh_max entries.
            if self.sb.metadata_csum() {
                let tail = 12 + 12 * max as usize;
                if tail + 4 <= node.len() {
                    let want = crc32c_raw(w.seed, &node[..tail]);
                    let have = le32(node, tail);
                    if want != have {
                        problem!(
                            self,
                            Unsafe,
                            ExtentTree,
                            Some(ino),
                            Some(b),
                            "inode {ino} extent block {b} tail checksum is {have:#010x}, \
                             computed {want:#010x}"
                        );
                    }
                }
            }
        }
        let mut prev_lblk: Option<u64> = None;
        for i in 0..entries as usize {
            let e = &node[12 + 12 * i..24 + 12 * i];
            let lblk = le32(e, 0) as u64;
            if depth > 0 {
                let child = le32(e, 4) as u64 | ((le16(e, 8) as u64) << 32);
                let next_lblk = if i + 1 < entries as usize {
                    le32(&node[24 + 12 * i..], 0) as u64
                } else {
                    hi
                };
                if lblk < lo || prev_lblk.is_some_and(|p| lblk <= p) || next_lblk <= lblk {
                    problem!(
                        self,
                        Unsafe,
                        ExtentTree,
                        Some(ino),
                        Some(blk_for_problem),
                        "inode {ino} {where_}: index {i} ei_block {lblk} is out of order"
                    );
                    return Ok(());
                }
                prev_lblk = Some(lblk);
                if child < self.geo.first_data_block || child >= self.geo.blocks_count {
                    problem!(
                        self,
                        Unsafe,
                        ExtentTree,
                        Some(ino),
                        Some(blk_for_problem),
                        "inode {ino} {where_}: index {i} ei_leaf {child} is outside the file system"
                    );
                    continue;
                }
                if w.nodes_left == 0 {
                    problem!(
                        self,
                        Unsafe,
                        ExtentTree,
                        Some(ino),
                        Some(blk_for_problem),
                        "inode {ino}: extent tree has more nodes than the file system has blocks"
                    );
                    return Ok(());
                }
                w.nodes_left -= 1;
                if self.meta.get(child) || self.used.get(child) {
                    // Reading it would treat foreign bytes as a node.
                    self.claim(ino, child, 1, "extent tree block", info);
                    m.blocks += 1;
                    continue;
                }
                self.claim(ino, child, 1, "extent tree block", info);
                m.blocks += 1;
                let data = self.disk.read_block(child, BlockClass::ExtentTree)?;
                if le16(&data, 0) == 0xF30A && le16(&data, 2) > 0 {
                    let f = le32(&data, 12) as u64;
                    // Raising the first key of a non-root node would
                    // leave its own parent's key behind: that deeper
                    // shape is not repaired, so it stays unsafe.
                    if f > lblk && f < next_lblk && (node_block.is_none() || i > 0) {
                        // The child's first mappings were cleared before
                        // the key was raised (or the key lowered before a
                        // mapping was inserted in front): lookups in
                        // [key, first) find a hole either way, and the
                        // repair raises the key to the child's first.
                        problem!(
                            self,
                            Benign,
                            ExtentTree,
                            Some(ino),
                            Some(child),
                            "inode {ino} {where_}: index {i} ei_block {lblk} is lower than its \
                             child's (block {child}) first key {f}"
                        );
                        self.stale_index_keys.push(StaleIndexKey {
                            ino,
                            node_block,
                            entry: i,
                            key: f as u32,
                        });
                    } else if f != lblk {
                        problem!(
                            self,
                            Unsafe,
                            ExtentTree,
                            Some(ino),
                            Some(child),
                            "inode {ino} {where_}: index {i} ei_block {lblk} but its child \
                             (block {child}) starts at {f}"
                        );
                    }
                }
                self.extent_node(
                    w,
                    m,
                    info,
                    &data,
                    Some(child),
                    Some(depth - 1),
                    lblk,
                    next_lblk,
                    Some(depth - 1),
                )?;
            } else {
                let raw_len = le16(e, 4) as u64;
                let (len, unwritten) = if raw_len > 32768 {
                    (raw_len - 32768, true)
                } else {
                    (raw_len, false)
                };
                let pblk = le32(e, 8) as u64 | ((le16(e, 6) as u64) << 32);
                let why = if len == 0 {
                    Some("ee_len is zero".to_string())
                } else if pblk == 0
                    || pblk < self.geo.first_data_block
                    || pblk >= self.geo.blocks_count
                {
                    Some(format!("ee_start {pblk} is outside the file system"))
                } else if pblk + len > self.geo.blocks_count {
                    Some(format!(
                        "ee_start {pblk} + ee_len {len} ends past the file system"
                    ))
                } else if lblk < w.prev_end || lblk < lo {
                    Some(format!(
                        "ee_block {lblk} overlaps or precedes the previous extent"
                    ))
                } else if lblk + len > hi {
                    Some(format!(
                        "ee_block {lblk} + ee_len {len} runs past the index range end {hi}"
                    ))
                } else if w.is_dir && unwritten {
                    Some("a directory extent is unwritten".to_string())
                } else if w.is_dir && lblk + len > (1u64 << (21 - self.sb.log_block_size.min(11))) {
                    Some("a directory is too big".to_string())
                } else {
                    None
                };
                if let Some(why) = why {
                    problem!(
                        self,
                        Unsafe,
                        ExtentTree,
                        Some(ino),
                        Some(blk_for_problem),
                        "inode {ino} {where_}: extent {i} (lblk {lblk}, pblk {pblk}, len {len}): {why}"
                    );
                    // Still count what e2fsck would count: nothing more
                    // from a bad extent.
                    continue;
                }
                w.prev_end = lblk + len;
                self.claim(ino, pblk, len, "data", info);
                m.blocks += len;
                m.data_blocks += len;
                if m.first_pblk.is_none() && lblk == 0 {
                    m.first_pblk = Some(pblk);
                }
                m.last_lblk = Some(lblk + len - 1);
                if !unwritten {
                    m.last_init_lblk = Some(lblk + len - 1);
                }
                if w.is_dir {
                    let expect = info.dir_blocks.last().map_or(0, |&(l, _)| l + 1);
                    if lblk != expect {
                        problem!(
                            self,
                            Unsafe,
                            Directory,
                            Some(ino),
                            Some(blk_for_problem),
                            "directory inode {ino} has a hole at logical blocks {expect}..{lblk}"
                        );
                    }
                    for k in 0..len {
                        info.dir_blocks.push((lblk + k, pblk + k));
                    }
                }
            }
        }
        Ok(())
    }

    /// Walk a block-mapped (ext2/ext3-style) inode: 12 direct pointers and
    /// single, double and triple indirect blocks.
    fn walk_block_map(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        info: &mut InodeInfo,
    ) -> Result<Mapping, FsError> {
        let mut m = Mapping::default();
        let per = self.geo.block_size / 4;
        let ib = inode.i_block().to_vec();
        let mut budget = self.geo.blocks_count + 1;
        for i in 0..12u64 {
            let b = le32(&ib, i as usize * 4) as u64;
            self.map_block(ino, iblock, &mut m, info, i, b);
        }
        let mut base = 12u64;
        for level in 1..=3u32 {
            let b = le32(&ib, (11 + level as usize) * 4) as u64;
            let span = per.pow(level);
            if b != 0 {
                self.walk_indirect(ino, iblock, &mut m, info, b, level, base, &mut budget)?;
            }
            base += span;
        }
        Ok(m)
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_indirect(
        &mut self,
        ino: u32,
        iblock: u64,
        m: &mut Mapping,
        info: &mut InodeInfo,
        b: u64,
        level: u32,
        base: u64,
        budget: &mut u64,
    ) -> Result<(), FsError> {
        if !self.geo.in_range(b) {
            problem!(
                self,
                Unsafe,
                ExtentTree,
                Some(ino),
                Some(iblock),
                "inode {ino} indirect block {b} is outside the file system"
            );
            return Ok(());
        }
        if *budget == 0 {
            return Ok(());
        }
        *budget -= 1;
        let clash = self.meta.get(b) || self.used.get(b);
        self.claim(ino, b, 1, "indirect block", info);
        m.blocks += 1;
        if clash {
            return Ok(());
        }
        let data = self.disk.read_block(b, BlockClass::ExtentTree)?;
        let per = self.geo.block_size / 4;
        let span = per.pow(level - 1);
        for i in 0..per {
            let child = le32(&data, i as usize * 4) as u64;
            if child == 0 {
                continue;
            }
            let lblk = base + i * span;
            if level == 1 {
                self.map_block(ino, iblock, m, info, lblk, child);
            } else {
                self.walk_indirect(ino, iblock, m, info, child, level - 1, lblk, budget)?;
            }
        }
        Ok(())
    }

    fn map_block(
        &mut self,
        ino: u32,
        iblock: u64,
        m: &mut Mapping,
        info: &mut InodeInfo,
        lblk: u64,
        b: u64,
    ) {
        if b == 0 {
            return;
        }
        if !self.geo.in_range(b) {
            problem!(
                self,
                Unsafe,
                ExtentTree,
                Some(ino),
                Some(iblock),
                "inode {ino} logical block {lblk} maps to {b}, outside the file system"
            );
            return;
        }
        self.claim(ino, b, 1, "data", info);
        m.blocks += 1;
        m.data_blocks += 1;
        if lblk == 0 {
            m.first_pblk = Some(b);
        }
        m.last_lblk = Some(m.last_lblk.map_or(lblk, |l| l.max(lblk)));
        m.last_init_lblk = m.last_lblk;
        if info.is_dir() {
            let expect = info.dir_blocks.last().map_or(0, |&(l, _)| l + 1);
            if lblk != expect {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(ino),
                    Some(iblock),
                    "directory inode {ino} has a hole at logical blocks {expect}..{lblk}"
                );
            }
            info.dir_blocks.push((lblk, b));
        }
    }

    fn check_xattr_block(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        info: &mut InodeInfo,
    ) -> Result<u64, FsError> {
        let b = inode.file_acl;
        if !self.sb.has_compat(COMPAT_EXT_ATTR) || !self.geo.in_range(b) {
            problem!(
                self,
                Unsafe,
                Xattr,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_file_acl {b} is invalid"
            );
            return Ok(0);
        }
        if let Some(e) = self.xattr.get_mut(&b) {
            e.0 += 1;
            return Ok(1);
        }
        let clash = self.meta.get(b) || self.used.get(b);
        self.claim(ino, b, 1, "xattr block", info);
        if clash {
            return Ok(1);
        }
        let data = self.disk.read_block(b, BlockClass::Other)?;
        let magic = le32(&data, 0);
        let refcount = le32(&data, 4);
        let nblocks = le32(&data, 8);
        if magic != 0xEA02_0000 || nblocks != 1 {
            problem!(
                self,
                Unsafe,
                Xattr,
                Some(ino),
                Some(b),
                "inode {ino} xattr block {b} h_magic {magic:#010x} / h_blocks {nblocks} is invalid"
            );
        } else if self.sb.metadata_csum() {
            let mut tmp = data.clone();
            put_le32(&mut tmp, 0x10, 0);
            let c = crc32c_raw(self.geo.csum_seed, &b.to_le_bytes());
            let want = crc32c_raw(c, &tmp);
            let have = le32(&data, 0x10);
            if want != have {
                problem!(
                    self,
                    Unsafe,
                    Xattr,
                    Some(ino),
                    Some(b),
                    "xattr block {b} h_checksum is {have:#010x}, computed {want:#010x}"
                );
            }
        }
        self.xattr.insert(b, (1, refcount));
        Ok(1)
    }

    // ---------------------------------------------------------------
    // pass 2: directories
    // ---------------------------------------------------------------

    fn pass2(&mut self) -> Result<(), FsError> {
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dir())
            .map(|(&n, _)| n)
            .collect();
        for dir in dirs {
            self.check_dir(dir)?;
        }
        self.check_double_names();
        Ok(())
    }

    /// Directories named by more than one entry. One case is benign: a
    /// directory with exactly two names, one of them in the directory its
    /// `..` names. That is what a crash inside a rename of a directory
    /// leaves under rule 3 (the new entry is written before the old one is
    /// removed, and `..` follows the new entry), as FFS's fsck knows it:
    /// the name in the parent `..` does not name is stale and the repair
    /// removes it; link counts are then counted without it. When both
    /// names are in the `..` parent (a rename within one directory whose
    /// two entries are in different blocks) either name is the rename's
    /// outcome or its origin: the one found second is removed. Anything
    /// else (three names, or `..` naming neither holder) is unsafe.
    fn check_double_names(&mut self) {
        let mut multi: Vec<(u32, Vec<DirName>)> = self
            .dir_names
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(&d, v)| (d, v.clone()))
            .collect();
        multi.sort_by_key(|(d, _)| *d);
        for (d, names) in multi {
            let dd = self.dotdot.get(&d).copied();
            let stale = match (names.len(), dd) {
                (2, Some(dd)) if names[0].dir == dd => Some(1),
                (2, Some(dd)) if names[1].dir == dd => Some(0),
                _ => None,
            };
            match stale {
                Some(k) => {
                    let keep = &names[1 - k];
                    let gone = names[k].clone();
                    problem!(
                        self,
                        Benign,
                        Connectivity,
                        Some(d),
                        Some(gone.pblk),
                        "directory inode {d} has two names, '{}' in {} (its '..') and '{}' in                          {} (stale, from an interrupted rename)",
                        keep.name,
                        keep.dir,
                        gone.name,
                        gone.dir
                    );
                    self.parent.insert(d, keep.dir);
                    if let Some(c) = self.counted.get_mut(&d) {
                        *c = c.saturating_sub(1);
                    }
                    self.stale_names.push(gone);
                }
                None => {
                    let first = names[0].dir;
                    for n in &names[1..] {
                        problem!(
                            self,
                            Unsafe,
                            Connectivity,
                            Some(d),
                            Some(n.pblk),
                            "directory inode {d} is linked twice: from {first} and as '{}' in {}",
                            n.name,
                            n.dir
                        );
                    }
                }
            }
        }
    }

    fn check_dir(&mut self, dir: u32) -> Result<(), FsError> {
        let info = self.inodes[&dir].clone();
        let bs = self.geo.block_size as usize;
        let dseed = Inode::csum_seed(self.geo.csum_seed, dir, info.generation);
        let htree = info.flags & INODE_INDEX_FL != 0 && self.sb.has_compat(COMPAT_DIR_INDEX);
        let mut dx_nodes: HashSet<u64> = HashSet::new();
        let mut dx_ranges: HashMap<u64, (u32, u32)> = HashMap::new();
        let mut dx_root = false;
        if htree {
            if let Some(&(0, root_pblk)) = info.dir_blocks.first() {
                if self.geo.in_range(root_pblk) {
                    let root = self.disk.read_block(root_pblk, BlockClass::Directory)?;
                    dx_root = self.check_htree(
                        dir,
                        &info,
                        &root,
                        root_pblk,
                        dseed,
                        &mut dx_nodes,
                        &mut dx_ranges,
                    )?;
                }
            }
        }
        let mut saw_dot = false;
        let mut saw_dotdot = false;
        let hash_version = match info.dir_blocks.first() {
            Some(&(0, p)) if dx_root && self.geo.in_range(p) => {
                let v = self.disk.read_block(p, BlockClass::Directory)?[0x1C];
                if v <= 2 && self.sb.flags & 0x2 != 0 {
                    v + 3
                } else {
                    v
                }
            }
            _ => 0,
        };
        for &(lblk, pblk) in &info.dir_blocks {
            if !self.geo.in_range(pblk) {
                continue;
            }
            if dx_nodes.contains(&lblk) {
                continue; // checked by check_htree
            }
            let data = self.disk.read_block(pblk, BlockClass::Directory)?;
            let is_root_block = lblk == 0 && dx_root;
            let end = if self.sb.metadata_csum() && !is_root_block {
                bs - 12
            } else {
                bs
            };
            if self.sb.metadata_csum() && !is_root_block {
                let t = &data[bs - 12..];
                let tail_ok = le32(t, 0) == 0 && le16(t, 4) == 12 && t[6] == 0 && t[7] == 0xDE;
                if !tail_ok {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk} (logical {lblk}) has no checksum tail"
                    );
                } else {
                    let want = crc32c_raw(dseed, &data[..bs - 12]);
                    let have = le32(t, 8);
                    if want != have {
                        problem!(
                            self,
                            Unsafe,
                            Directory,
                            Some(dir),
                            Some(pblk),
                            "directory inode {dir} block {pblk} (logical {lblk}) tail \
                             det_checksum is {have:#010x}, computed {want:#010x}"
                        );
                    }
                }
            }
            let hashes = self.check_dir_entries(
                dir,
                lblk,
                pblk,
                &data[..end],
                &mut saw_dot,
                &mut saw_dotdot,
                dx_root.then_some(hash_version),
            );
            if let (Some(&(lo, hi)), Some((min, max))) = (dx_ranges.get(&lblk), hashes) {
                if min < lo || max > hi {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk} (logical {lblk}): entry \
                         hashes {min:#x}..{max:#x} fall outside the index range {lo:#x}..{hi:#x}"
                    );
                }
            }
        }
        if !saw_dot || !saw_dotdot {
            let b = info.dir_blocks.first().map(|&(_, p)| p);
            problem!(
                self,
                Unsafe,
                Directory,
                Some(dir),
                b,
                "directory inode {dir} is missing its {} entry",
                if !saw_dot { "\".\"" } else { "\"..\"" }
            );
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn check_dir_entries(
        &mut self,
        dir: u32,
        lblk: u64,
        pblk: u64,
        data: &[u8],
        saw_dot: &mut bool,
        saw_dotdot: &mut bool,
        hash_version: Option<u8>,
    ) -> Option<(u32, u32)> {
        let bs = self.geo.block_size;
        let mut range: Option<(u32, u32)> = None;
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let mut off = 0usize;
        let mut index = 0usize;
        while off < data.len() {
            let ino = le32(data, off);
            let mut rec_len = le16(data, off + 4) as usize;
            if bs >= 65536 && (rec_len == 65535 || rec_len == 0) {
                rec_len = 65536;
            }
            let name_len = data.get(off + 6).copied().unwrap_or(0) as usize;
            let ftype = data.get(off + 7).copied().unwrap_or(0);
            if off + 8 > data.len()
                || rec_len < 12
                || !rec_len.is_multiple_of(4)
                || off + rec_len > data.len()
                || name_len + 8 > rec_len
            {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk} (logical {lblk}) offset {off}: rec_len \
                     {rec_len} / name_len {name_len} is corrupt"
                );
                return range;
            }
            let name = &data[off + 8..off + 8 + name_len];
            let shown = String::from_utf8_lossy(name).into_owned();
            let first_block = lblk == 0;
            if first_block && index == 0 {
                if name != b"." || ino != dir {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: first entry is '{shown}' -> {ino}, \
                         should be '.' -> {dir}"
                    );
                } else {
                    *saw_dot = true;
                }
            } else if first_block && index == 1 {
                if name != b".." || ino == 0 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: second entry is '{shown}', should \
                         be '..'"
                    );
                } else {
                    *saw_dotdot = true;
                    self.dotdot.insert(dir, ino);
                }
            } else if ino != 0 && (name == b"." || name == b"..") {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk} offset {off}: extra '{shown}' entry"
                );
            }
            let dot_entry = first_block && index < 2;
            let entry_off = off;
            index += 1;
            off += rec_len;
            if ino == 0 {
                continue;
            }
            if !dot_entry {
                if name_len == 0 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry -> {ino} has an empty name"
                    );
                    continue;
                }
                if name.iter().any(|&c| c == b'/' || c == 0) {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' has an illegal \
                         character in its name"
                    );
                }
            }
            if (ino != 2 && ino < self.sb.first_ino) || ino > self.geo.inodes_count {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' has bad inode number {ino}"
                );
                continue;
            }
            if !self.inode_scanned.get(ino as u64) {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' references inode {ino} \
                     in its group's uninitialized or unused inode area"
                );
                continue;
            }
            let Some(target) = self.inodes.get(&ino) else {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' names unused inode {ino}"
                );
                continue;
            };
            let tmode = target.mode;
            let tdir = target.is_dir();
            if filetype {
                let want = dirent_type(tmode);
                if ftype != want {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' file_type {ftype}, \
                         inode {ino} has type {want}"
                    );
                }
            } else if ftype != 0 {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' file_type {ftype} set \
                     without the filetype feature"
                );
            }
            if !dot_entry {
                self.nonempty_dirs.insert(dir);
                if ino == 2 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' links to the root \
                         directory"
                    );
                } else if tdir {
                    // A second name is judged once every `..` is known
                    // (check_double_names).
                    self.parent.entry(ino).or_insert(dir);
                    self.dir_names.entry(ino).or_default().push(DirName {
                        dir,
                        pblk,
                        off: entry_off,
                        name: shown.clone(),
                        ino,
                    });
                }
            }
            *self.counted.entry(ino).or_insert(0) += 1;
            if let (Some(v), false) = (hash_version, dot_entry) {
                let h = dx_hash(v, name, &self.sb.hash_seed);
                range = Some(match range {
                    Some((lo, hi)) => (lo.min(h), hi.max(h)),
                    None => (h, h),
                });
            }
        }
        range
    }

    /// Check an htree root and its nodes; returns whether block 0 is a
    /// valid dx root (so its ".." covers the rest of the block), and fills
    /// `nodes` with the logical blocks that are index nodes.
    #[allow(clippy::too_many_arguments)]
    fn check_htree(
        &mut self,
        dir: u32,
        info: &InodeInfo,
        root: &[u8],
        root_pblk: u64,
        dseed: u32,
        nodes: &mut HashSet<u64>,
        ranges: &mut HashMap<u64, (u32, u32)>,
    ) -> Result<bool, FsError> {
        let bs = self.geo.block_size as usize;
        let csum_size = if self.sb.metadata_csum() { 8 } else { 0 };
        let numblocks = info.dir_blocks.len() as u64;
        let hash_version = root[0x1C];
        let info_len = root[0x1D];
        let levels = root[0x1E];
        let max_levels = if self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            3
        } else {
            2
        };
        if le32(root, 0x18) != 0 || info_len != 8 || levels >= max_levels || hash_version > 5 {
            problem!(
                self,
                Unsafe,
                Directory,
                Some(dir),
                Some(root_pblk),
                "htree directory inode {dir} root block {root_pblk}: dx_root_info is invalid \
                 (hash {hash_version}, info_length {info_len}, levels {levels})"
            );
            return Ok(false);
        }
        let mut referenced: HashMap<u64, u32> = HashMap::new();
        // (logical block, count offset, depth)
        let mut queue = vec![(0u64, 0x20usize, 0u8, root.to_vec(), root_pblk)];
        let mut budget = numblocks + 1;
        while let Some((lblk, coff, depth, data, pblk)) = queue.pop() {
            let limit = le16(&data, coff) as usize;
            let count = le16(&data, coff + 2) as usize;
            let want_limit = (bs - coff - csum_size) / 8;
            if limit != want_limit || count > limit || count == 0 {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "htree directory inode {dir} block {pblk} (logical {lblk}): dx limit {limit} \
                     / count {count}, expected limit {want_limit}"
                );
                continue;
            }
            if csum_size != 0 {
                let toff = coff + limit * 8;
                let c = crc32c_raw(dseed, &data[..coff + count * 8]);
                let c = crc32c_raw(c, &data[toff..toff + 4]);
                let want = crc32c_raw(c, &[0; 4]);
                let have = le32(&data, toff + 4);
                if want != have {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk} (logical {lblk}): dx_tail \
                         checksum is {have:#010x}, computed {want:#010x}"
                    );
                }
            }
            let mut prev_hash = 0u32;
            for i in 0..count {
                let e = coff + i * 8;
                let hash = if i == 0 { 0 } else { le32(&data, e) & !1 };
                let child = le32(&data, e + 4) as u64;
                if i > 0 && hash < prev_hash {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk}: dx entry {i} hash is out of order"
                    );
                }
                prev_hash = hash;
                if child == 0 || child >= numblocks {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk}: dx entry {i} points to block \
                         {child}, outside the directory"
                    );
                    continue;
                }
                *referenced.entry(child).or_insert(0) += 1;
                if depth == levels {
                    let next = if i + 1 < count {
                        le32(&data, e + 8) & !1
                    } else {
                        0xFFFF_FFFE
                    };
                    ranges.insert(child, (hash, next));
                }
                if depth < levels && referenced[&child] == 1 {
                    nodes.insert(child);
                    if budget == 0 {
                        continue;
                    }
                    budget -= 1;
                    let cp = info.dir_blocks[child as usize].1;
                    if !self.geo.in_range(cp) {
                        continue;
                    }
                    let nd = self.disk.read_block(cp, BlockClass::Directory)?;
                    let span = match le16(&nd, 4) as usize {
                        0 | 65535 if bs >= 65536 => 65536,
                        n => n,
                    };
                    if le32(&nd, 0) != 0 || span != bs {
                        problem!(
                            self,
                            Unsafe,
                            Directory,
                            Some(dir),
                            Some(cp),
                            "htree directory inode {dir} block {cp} (logical {child}): dx node \
                             header is not an empty entry spanning the block"
                        );
                        continue;
                    }
                    queue.push((child, 8, depth + 1, nd, cp));
                }
            }
        }
        for lb in 1..numblocks {
            match referenced.get(&lb).copied().unwrap_or(0) {
                1 => {}
                0 => problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(info.dir_blocks[lb as usize].1),
                    "htree directory inode {dir} logical block {lb} is not referenced by the index"
                ),
                n => problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(info.dir_blocks[lb as usize].1),
                    "htree directory inode {dir} logical block {lb} is referenced {n} times"
                ),
            }
        }
        Ok(true)
    }

    // ---------------------------------------------------------------
    // pass 3: connectivity
    // ---------------------------------------------------------------

    fn pass3(&mut self) {
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dir())
            .map(|(&n, _)| n)
            .collect();
        if !self.inodes.get(&2).is_some_and(|i| i.is_dir()) {
            // Already reported in pass 1; nothing is reachable.
            return;
        }
        let limit = dirs.len() + 1;
        for &d in &dirs {
            if d == 2 {
                if let Some(&dd) = self.dotdot.get(&2) {
                    if dd != 2 {
                        problem!(
                            self,
                            Unsafe,
                            Connectivity,
                            Some(2),
                            None,
                            "root directory '..' is {dd}, should be 2"
                        );
                    }
                }
                continue;
            }
            // Walk up to the root.
            let mut cur = d;
            let mut steps = 0;
            let mut connected = false;
            while steps <= limit {
                match self.parent.get(&cur) {
                    Some(&2) => {
                        connected = true;
                        break;
                    }
                    Some(&p) => cur = p,
                    None => break,
                }
                steps += 1;
            }
            if !connected {
                let empty = !self.nonempty_dirs.contains(&d) && !self.parent.contains_key(&d);
                if empty {
                    // An empty directory no entry names: leaked by a crash
                    // between writing it and writing its entry.
                    problem!(
                        self,
                        Benign,
                        LeakedInode,
                        Some(d),
                        None,
                        "empty directory inode {d} is not referenced by any entry"
                    );
                    self.leaked.push(d);
                } else {
                    problem!(
                        self,
                        Unsafe,
                        Connectivity,
                        Some(d),
                        None,
                        "directory inode {d} is not connected to the root"
                    );
                }
                continue;
            }
            if let (Some(&p), Some(&dd)) = (self.parent.get(&d), self.dotdot.get(&d)) {
                if p != dd {
                    problem!(
                        self,
                        Unsafe,
                        Connectivity,
                        Some(d),
                        None,
                        "directory inode {d} '..' is {dd}, its parent is {p}"
                    );
                }
            }
        }
    }

    // ---------------------------------------------------------------
    // pass 4: link counts
    // ---------------------------------------------------------------

    fn pass4(&mut self) {
        let leaked_dirs: HashSet<u32> = self.leaked.iter().copied().collect();
        // Entries inside leaked (empty) directories do not count: their
        // ".." goes away with them.
        let mut counted = self.counted.clone();
        for &d in &leaked_dirs {
            if let Some(&dd) = self.dotdot.get(&d) {
                if let Some(c) = counted.get_mut(&dd) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let inos: Vec<u32> = self.inodes.keys().copied().collect();
        for ino in inos {
            if ino < self.sb.first_ino && ino != 2 {
                continue;
            }
            if leaked_dirs.contains(&ino) {
                continue;
            }
            let info = &self.inodes[&ino];
            let is_dir = info.is_dir();
            let links = info.links as u32;
            let raw_counted = self.counted.get(&ino).copied().unwrap_or(0);
            let mut c = counted.get(&ino).copied().unwrap_or(0);
            if raw_counted == 0 {
                if !is_dir {
                    problem!(
                        self,
                        Benign,
                        LeakedInode,
                        Some(ino),
                        None,
                        "inode {ino} (i_links_count {links}) is in use but no entry names it"
                    );
                    self.leaked.push(ino);
                }
                continue;
            }
            if is_dir && c > EXT4_LINK_MAX {
                c = 1;
            }
            if links != c {
                if links > c {
                    problem!(
                        self,
                        Benign,
                        LinkCount,
                        Some(ino),
                        None,
                        "inode {ino} i_links_count is {links}, counted {c} (too high)"
                    );
                } else {
                    problem!(
                        self,
                        Unsafe,
                        LinkCount,
                        Some(ino),
                        None,
                        "inode {ino} i_links_count is {links}, counted {c} (too low)"
                    );
                }
            }
        }
    }

    /// Link counts as the benign repair should set them.
    pub(crate) fn wanted_links(&self) -> BTreeMap<u32, u32> {
        let leaked: HashSet<u32> = self.leaked.iter().copied().collect();
        let mut counted = self.counted.clone();
        for &d in &self.leaked {
            if let Some(&dd) = self.dotdot.get(&d) {
                if let Some(c) = counted.get_mut(&dd) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let mut out = BTreeMap::new();
        for (&ino, info) in &self.inodes {
            if (ino < self.sb.first_ino && ino != 2) || leaked.contains(&ino) {
                continue;
            }
            let mut c = counted.get(&ino).copied().unwrap_or(0);
            if info.is_dir() && c > EXT4_LINK_MAX {
                c = 1;
            }
            if c > 0 && (info.links as u32) > c {
                out.insert(ino, c);
            }
        }
        out
    }

    // ---------------------------------------------------------------
    // pass 5: bitmaps and counts
    // ---------------------------------------------------------------

    /// The block bitmap of group `g` as libext2fs reads it: the on-disk
    /// block, or for a `BLOCK_UNINIT` group the group's own metadata.
    fn disk_block_bitmap(&mut self, g: u32) -> Result<Option<Vec<u8>>, FsError> {
        let gd = self.gds[g as usize].clone();
        let bs = self.geo.block_size as usize;
        if self.sb.gdt_csum() && gd.flags & BG_BLOCK_UNINIT != 0 {
            let mut bm = vec![0u8; bs];
            let first = self.geo.group_first_block(g);
            let mut mark = |b: u64| {
                if b >= first && b < first + self.geo.blocks_per_group {
                    let i = (b - first) as usize;
                    bm[i / 8] |= 1 << (i % 8);
                }
            };
            if group_has_super(&self.sb, g) {
                let n = 1 + self.geo.gdt_blocks + self.sb.reserved_gdt_blocks as u64;
                for b in first..first + n {
                    mark(b);
                }
            }
            // libext2fs marks the group's own bitmaps and table wherever
            // they are; those outside this group land in their own group's
            // bitmap, which is read from disk.
            for g2 in 0..self.geo.groups {
                if !self.gd_ok[g2 as usize] {
                    continue;
                }
                let d = &self.gds[g2 as usize];
                let own = g2 == g;
                let uninit2 = d.flags & BG_BLOCK_UNINIT != 0;
                if own || uninit2 {
                    mark(d.block_bitmap);
                    mark(d.inode_bitmap);
                    for b in d.inode_table..d.inode_table + self.geo.itable_blocks {
                        mark(b);
                    }
                }
            }
            // Padding past the end of the file system reads as set.
            let count = self.geo.group_block_count(g) as usize;
            for i in count..self.geo.blocks_per_group as usize {
                bm[i / 8] |= 1 << (i % 8);
            }
            return Ok(Some(bm));
        }
        if !self.gd_ok[g as usize] {
            return Ok(None);
        }
        Ok(Some(
            self.disk
                .read_block(gd.block_bitmap, BlockClass::GroupMeta)?,
        ))
    }

    /// Report how group `g`'s block or inode bitmap, at block
    /// `bm_block`, differs from use: `plus`, in use but free, is a hazard
    /// (the next allocation can hand them out twice); `minus`, marked but
    /// unused, is a benign leak.
    fn report_bitmap_diffs(
        &mut self,
        g: u32,
        kind: BitmapKind,
        bm_block: u64,
        plus: &[u64],
        minus: &[u64],
    ) {
        let (what, used_free, leak) = match kind {
            BitmapKind::Block => (
                "block",
                ProblemClass::BlockUsedButFree,
                ProblemClass::BlockBitmap,
            ),
            BitmapKind::Inode => (
                "inode",
                ProblemClass::InodeUsedButFree,
                ProblemClass::InodeBitmap,
            ),
        };
        if !plus.is_empty() {
            self.report(
                Severity::Hazard,
                used_free,
                None,
                Some(bm_block),
                format!(
                    "group {g} {what} bitmap (block {bm_block}): in use but free: {} (the next \
                     allocation may hand them out twice: harmless only if repaired before any)",
                    describe_diffs(plus, '+')
                ),
            );
        }
        if !minus.is_empty() {
            self.report(
                Severity::Benign,
                leak,
                None,
                Some(bm_block),
                format!(
                    "group {g} {what} bitmap (block {bm_block}): free but marked (leaked): {}",
                    describe_diffs(minus, '-')
                ),
            );
        }
    }

    fn pass5(&mut self) -> Result<(), FsError> {
        let bpg = self.geo.blocks_per_group;
        let ipg = self.geo.inodes_per_group as u64;
        let big_desc = self.geo.desc_size >= 64;
        let seed = self.geo.csum_seed;
        let mut total_free_blocks = 0u64;
        let mut total_free_inodes = 0u64;
        for g in 0..self.geo.groups {
            let gd = self.gds[g as usize].clone();
            let gd_block = self.geo.first_data_block
                + 1
                + (g as u64 * self.geo.desc_size as u64) / self.geo.block_size;
            let first = self.geo.group_first_block(g);
            let count = self.geo.group_block_count(g);
            // Blocks.
            let disk_bm = self.disk_block_bitmap(g)?;
            let used = &self.used;
            let (used_in_group, plus, minus) = diff_bitmap(
                count,
                disk_bm.as_deref(),
                |i| used.get(first + i),
                |i| first + i,
            );
            let free_blocks = count - used_in_group;
            total_free_blocks += free_blocks;
            self.report_bitmap_diffs(g, BitmapKind::Block, gd.block_bitmap, &plus, &minus);
            let uninit_b = self.sb.gdt_csum() && gd.flags & BG_BLOCK_UNINIT != 0;
            if let Some(bm) = &disk_bm {
                if !uninit_b {
                    let pad_missing = (count..bpg).any(|i| !bit(bm, i));
                    if pad_missing && g == self.geo.groups - 1 {
                        problem!(
                            self,
                            Benign,
                            BlockBitmap,
                            None,
                            Some(gd.block_bitmap),
                            "group {g} block bitmap (block {}): padding past the end of the file \
                             system is not set",
                            gd.block_bitmap
                        );
                    }
                    if self.sb.metadata_csum() && plus.is_empty() && minus.is_empty() {
                        let n = (self.sb.clusters_per_group / 8) as usize;
                        let want = bitmap_checksum(seed, &bm[..n.min(bm.len())], big_desc);
                        if want != gd.block_bitmap_csum {
                            problem!(
                                self,
                                Benign,
                                BlockBitmap,
                                None,
                                Some(gd_block),
                                "group {g} descriptor (block {gd_block}) bg_block_bitmap_csum is \
                                 {:#x}, computed {want:#x}",
                                gd.block_bitmap_csum
                            );
                        }
                    }
                }
            }
            self.disk_block_bitmaps.push(disk_bm);
            // Inodes.
            let uninit_i = self.sb.gdt_csum() && gd.flags & BG_INODE_UNINIT != 0;
            let disk_ib = if uninit_i {
                Some(vec![0u8; self.geo.block_size as usize])
            } else if self.gd_ok[g as usize] {
                Some(
                    self.disk
                        .read_block(gd.inode_bitmap, BlockClass::GroupMeta)?,
                )
            } else {
                None
            };
            let mut dirs = 0u64;
            let (inode_used, inodes) = (&self.inode_used, &self.inodes);
            let ino_of = |i: u64| g as u64 * ipg + i + 1;
            let (used_inodes, plus, minus) = diff_bitmap(
                ipg,
                disk_ib.as_deref(),
                |i| {
                    let ino = ino_of(i);
                    let want = inode_used.get(ino);
                    if want && inodes.get(&(ino as u32)).is_some_and(|x| x.is_dir()) {
                        dirs += 1;
                    }
                    want
                },
                ino_of,
            );
            let free_inodes = ipg - used_inodes;
            total_free_inodes += free_inodes;
            self.report_bitmap_diffs(g, BitmapKind::Inode, gd.inode_bitmap, &plus, &minus);
            // Padding and checksum are only checked once the bits are right.
            let bits_right = plus.is_empty() && minus.is_empty();
            if let Some(ib) = disk_ib.as_ref().filter(|_| bits_right) {
                let pad_from = (ipg / 8) as usize;
                let pad_ok = ipg.is_multiple_of(8) && ib[pad_from..].iter().all(|&b| b == 0xFF);
                if !uninit_i && !pad_ok {
                    problem!(
                        self,
                        Benign,
                        InodeBitmap,
                        None,
                        Some(gd.inode_bitmap),
                        "group {g} inode bitmap (block {}): padding past the group's inodes is \
                         not set",
                        gd.inode_bitmap
                    );
                }
                if self.sb.metadata_csum() && !uninit_i {
                    let n = (ipg / 8) as usize;
                    let want = bitmap_checksum(seed, &ib[..n.min(ib.len())], big_desc);
                    if want != gd.inode_bitmap_csum {
                        problem!(
                            self,
                            Benign,
                            InodeBitmap,
                            None,
                            Some(gd_block),
                            "group {g} descriptor (block {gd_block}) bg_inode_bitmap_csum is \
                             {:#x}, computed {want:#x}",
                            gd.inode_bitmap_csum
                        );
                    }
                }
            }
            self.disk_inode_bitmaps.push(disk_ib);
            // Group counts.
            if gd.free_blocks as u64 != free_blocks
                || gd.free_inodes as u64 != free_inodes
                || gd.used_dirs as u64 != dirs
            {
                problem!(
                    self,
                    Benign,
                    GroupCounts,
                    None,
                    Some(gd_block),
                    "group {g} descriptor (block {gd_block}) counts: free blocks {} (counted \
                     {free_blocks}), free inodes {} (counted {free_inodes}), directories {} \
                     (counted {dirs})",
                    gd.free_blocks,
                    gd.free_inodes,
                    gd.used_dirs
                );
            }
        }
        let sb_block = if self.geo.block_size == 1024 { 1 } else { 0 };
        if self.sb.free_blocks != total_free_blocks
            || self.sb.free_inodes as u64 != total_free_inodes
        {
            problem!(
                self,
                Info,
                SuperCounts,
                None,
                Some(sb_block),
                "superblock free counts: blocks {} (counted {total_free_blocks}), inodes {} \
                 (counted {total_free_inodes})",
                self.sb.free_blocks,
                self.sb.free_inodes
            );
        }
        Ok(())
    }

    // ---------------------------------------------------------------
    // the journal
    // ---------------------------------------------------------------

    fn check_journal(&mut self) -> Result<(), FsError> {
        let recover = self.sb.has_incompat(INCOMPAT_RECOVER);
        if !self.sb.has_compat(COMPAT_HAS_JOURNAL) {
            if recover {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    None,
                    None,
                    "superblock has needs_recovery set but no journal"
                );
            }
            return Ok(());
        }
        let jino = self.sb.journal_inum;
        let first = self.journal_first_block_from_inode(jino)?;
        let mut needs = recover;
        let mut recover_start = false;
        if let Some(b) = first {
            let data = self.disk.read_block(b, BlockClass::Journal)?;
            let magic = be32(&data, 0);
            let btype = be32(&data, 4);
            if magic != 0xC03B_3998 || !(btype == 3 || btype == 4) {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    Some(jino),
                    Some(b),
                    "journal superblock (block {b}) has bad magic {magic:#010x} / type {btype}"
                );
                return Ok(());
            }
            if be32(&data, 0x1C) != 0 {
                needs = true;
                recover_start = true;
            }
        }
        if needs {
            // As `e2fsck -n`: the check runs on the image as it is, without
            // replaying; the journal is reported, and the benign repair
            // refuses to run (replay must come first).
            self.journal_needs_recovery = true;
            problem!(
                self,
                Info,
                Journal,
                Some(jino),
                first,
                "journal needs recovery (needs_recovery flag {}, journal s_start {}); checked \
                 without replaying it",
                if recover { "set" } else { "clear" },
                if recover_start { "set" } else { "zero" }
            );
        }
        Ok(())
    }

    /// Physical block of logical block 0 of `ino`, from a depth-0 or deeper
    /// extent tree.
    fn journal_first_block_from_inode(&self, ino: u32) -> Result<Option<u64>, FsError> {
        let Some(inode) = self.read_inode(ino)? else {
            return Ok(None);
        };
        if inode.flags & INODE_EXTENTS_FL == 0 {
            let b = le32(inode.i_block(), 0) as u64;
            return Ok(self.geo.in_range(b).then_some(b));
        }
        let mut node = inode.i_block().to_vec();
        for _ in 0..=EXT_MAX_DEPTH {
            if le16(&node, 0) != 0xF30A || le16(&node, 2) == 0 {
                return Ok(None);
            }
            let depth = le16(&node, 6);
            let e = &node[12..24];
            if depth == 0 {
                if le32(e, 0) != 0 {
                    return Ok(None);
                }
                let p = le32(e, 8) as u64 | ((le16(e, 6) as u64) << 32);
                return Ok(self.geo.in_range(p).then_some(p));
            }
            let child = le32(e, 4) as u64 | ((le16(e, 8) as u64) << 32);
            if !self.geo.in_range(child) {
                return Ok(None);
            }
            node = self.disk.read_block(child, BlockClass::ExtentTree)?;
        }
        Ok(None)
    }
}

/// What an inode maps.
#[derive(Default, Debug)]
pub(crate) struct Mapping {
    /// Blocks counted for i_blocks (data and tree blocks).
    blocks: u64,
    data_blocks: u64,
    last_lblk: Option<u64>,
    last_init_lblk: Option<u64>,
    first_pblk: Option<u64>,
}

struct Walk {
    ino: u32,
    iblock: u64,
    is_dir: bool,
    seed: u32,
    prev_end: u64,
    nodes_left: u64,
}

fn dirent_type(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => 1,
        S_IFDIR => 2,
        S_IFCHR => 3,
        S_IFBLK => 4,
        S_IFIFO => 5,
        S_IFSOCK => 6,
        S_IFLNK => 7,
        _ => 0,
    }
}

fn block_map_max_size(bs: u64) -> u64 {
    // e2fsck's ext2_max_sizes: what 12 direct pointers and single, double
    // and triple indirect blocks can map.
    let per = bs / 4;
    (12 + per + per * per + per * per * per) * bs
}

/// Which allocation bitmap a difference is about.
#[derive(Clone, Copy)]
enum BitmapKind {
    Block,
    Inode,
}

/// Up to eight numbers with their sign (e2fsck's `+N` / `-N`), then how
/// many there are in all.
fn describe_diffs(v: &[u64], sign: char) -> String {
    let mut s: Vec<String> = v.iter().take(8).map(|x| format!("{sign}{x}")).collect();
    if v.len() > 8 {
        s.push(format!("... ({} in all)", v.len()));
    }
    s.join(" ")
}

/// Superblock sanity: everything the rest of the checker relies on.
fn validate_super(sb: &Super, device_bytes: u64) -> Result<(), String> {
    if sb.magic != EXT4_MAGIC {
        return Err(format!(
            "s_magic is {:#06x}, not {EXT4_MAGIC:#06x}",
            sb.magic
        ));
    }
    if sb.metadata_csum() {
        let want = Super::computed_checksum(&sb.raw);
        if want != sb.checksum {
            return Err(format!(
                "s_checksum is {:#010x}, computed {want:#010x}",
                sb.checksum
            ));
        }
    }
    if sb.log_block_size > 6 {
        return Err(format!(
            "s_log_block_size {} is too large",
            sb.log_block_size
        ));
    }
    let bs = 1024u64 << sb.log_block_size;
    if sb.blocks_count == 0 || sb.blocks_per_group == 0 || sb.inodes_per_group == 0 {
        return Err("s_blocks_count / s_blocks_per_group / s_inodes_per_group is zero".into());
    }
    if sb.blocks_per_group as u64 > 8 * bs || sb.inodes_per_group as u64 > 8 * bs {
        return Err(format!(
            "s_blocks_per_group {} / s_inodes_per_group {} exceed one bitmap block",
            sb.blocks_per_group, sb.inodes_per_group
        ));
    }
    if sb.clusters_per_group != sb.blocks_per_group {
        return Err(format!(
            "s_clusters_per_group {} differs from s_blocks_per_group {}",
            sb.clusters_per_group, sb.blocks_per_group
        ));
    }
    let want_first = if bs == 1024 { 1 } else { 0 };
    if sb.first_data_block != want_first {
        return Err(format!(
            "s_first_data_block is {}, should be {want_first}",
            sb.first_data_block
        ));
    }
    if sb.blocks_count <= sb.first_data_block as u64 {
        return Err(format!("s_blocks_count {} is too small", sb.blocks_count));
    }
    let groups =
        (sb.blocks_count - sb.first_data_block as u64).div_ceil(sb.blocks_per_group as u64);
    if groups * sb.inodes_per_group as u64 != sb.inodes_count as u64 {
        return Err(format!(
            "s_inodes_count {} is not {groups} groups of {} inodes",
            sb.inodes_count, sb.inodes_per_group
        ));
    }
    let isz = sb.inode_size as u64;
    if isz < 128 || !isz.is_power_of_two() || isz > bs {
        return Err(format!("s_inode_size {} is invalid", sb.inode_size));
    }
    if sb.rev_level > 0 && (sb.first_ino < 11 || sb.first_ino > sb.inodes_count) {
        return Err(format!("s_first_ino {} is invalid", sb.first_ino));
    }
    if sb.has_incompat(INCOMPAT_64BIT) {
        let d = sb.desc_size as u64;
        if !(64..=1024).contains(&d) || !d.is_power_of_two() {
            return Err(format!("s_desc_size {} is invalid", sb.desc_size));
        }
    }
    if sb.blocks_count.saturating_mul(bs) > device_bytes {
        return Err(format!(
            "s_blocks_count {} ({} bytes) is larger than the device ({device_bytes} bytes)",
            sb.blocks_count,
            sb.blocks_count.saturating_mul(bs)
        ));
    }
    Ok(())
}

/// Look for a valid backup superblock in group 1, for each block size.
fn find_backup_super(disk: &Disk<'_>) -> Option<u64> {
    for log in 0..=2u32 {
        let bs = 1024u64 << log;
        let blk = bs * 8 + if bs == 1024 { 1 } else { 0 };
        let off = blk * bs;
        let Ok(raw) = read_super_bytes(disk, off) else {
            continue;
        };
        let sb = Super::decode(&raw);
        if sb.log_block_size == log && validate_super(&sb, disk.size_bytes()).is_ok() {
            return Some(blk);
        }
    }
    None
}

/// Refuse images whose features this checker does not cover.
fn check_features(sb: &Super) -> Result<(), FsError> {
    let mut bad = Vec::new();
    let incompat = [
        (INCOMPAT_COMPRESSION, "compression"),
        (INCOMPAT_JOURNAL_DEV, "journal_dev"),
        (INCOMPAT_META_BG, "meta_bg"),
        (INCOMPAT_MMP, "mmp"),
        (INCOMPAT_EA_INODE, "ea_inode"),
        (INCOMPAT_DIRDATA, "dirdata"),
        (INCOMPAT_INLINE_DATA, "inline_data"),
        (INCOMPAT_ENCRYPT, "encrypt"),
        (INCOMPAT_CASEFOLD, "casefold"),
    ];
    for (f, name) in incompat {
        if sb.has_incompat(f) {
            bad.push(name);
        }
    }
    let known_incompat = INCOMPAT_FILETYPE
        | INCOMPAT_RECOVER
        | INCOMPAT_EXTENTS
        | INCOMPAT_64BIT
        | INCOMPAT_FLEX_BG
        | INCOMPAT_CSUM_SEED
        | INCOMPAT_LARGEDIR
        | incompat.iter().fold(0, |a, (f, _)| a | f);
    if sb.incompat & !known_incompat != 0 {
        bad.push("unknown incompat flags");
    }
    let ro = [
        (RO_COMPAT_BIGALLOC, "bigalloc"),
        (RO_COMPAT_QUOTA, "quota"),
        (RO_COMPAT_PROJECT, "project"),
        (RO_COMPAT_VERITY, "verity"),
    ];
    for (f, name) in ro {
        if sb.has_ro_compat(f) {
            bad.push(name);
        }
    }
    if sb.has_compat(COMPAT_ORPHAN_FILE) {
        bad.push("orphan_file");
    }
    if sb.has_compat(COMPAT_HAS_JOURNAL) && sb.journal_inum == 0 {
        bad.push("external journal");
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(FsError::Unsupported(format!(
            "fsck does not check images with: {}",
            bad.join(", ")
        )))
    }
}

fn geometry(sb: &Super) -> Geometry {
    let block_size = 1024u64 << sb.log_block_size;
    let groups =
        (sb.blocks_count - sb.first_data_block as u64).div_ceil(sb.blocks_per_group as u64) as u32;
    let desc_size = if sb.has_incompat(INCOMPAT_64BIT) {
        sb.desc_size as u32
    } else {
        32
    };
    Geometry {
        block_size,
        blocks_count: sb.blocks_count,
        first_data_block: sb.first_data_block as u64,
        blocks_per_group: sb.blocks_per_group as u64,
        inodes_per_group: sb.inodes_per_group,
        inodes_count: sb.inodes_count,
        groups,
        inode_size: sb.inode_size as u32,
        desc_size,
        itable_blocks: (sb.inodes_per_group as u64 * sb.inode_size as u64).div_ceil(block_size),
        gdt_blocks: (groups as u64 * desc_size as u64).div_ceil(block_size),
        csum_seed: sb.csum_seed(),
    }
}

/// Compare bits `0..count` of an on-disk bitmap (`None`: it could not be
/// read) with what the walk found in use (`in_use(i)`); returns how many
/// are in use and the ids (`id(i)`) whose bit is missing and whose bit is
/// set without use.
fn diff_bitmap(
    count: u64,
    disk: Option<&[u8]>,
    mut in_use: impl FnMut(u64) -> bool,
    id: impl Fn(u64) -> u64,
) -> (u64, Vec<u64>, Vec<u64>) {
    let (mut used, mut missing, mut extra) = (0u64, Vec::new(), Vec::new());
    for i in 0..count {
        let want = in_use(i);
        used += want as u64;
        if let Some(bm) = disk {
            match (want, bit(bm, i)) {
                (true, false) => missing.push(id(i)),
                (false, true) => extra.push(id(i)),
                _ => {}
            }
        }
    }
    (used, missing, extra)
}
