//! Pass 1, blocks: what an inode maps (the extent and block-map half of
//! e2fsck's `pass1.c`, and the duplicate-block detection that e2fsck
//! defers to `pass1b.c`).
//!
//! Walks an inode's extent tree (header magic, depth, entry counts, key
//! ordering and overlap, ranges, tree-block checksums, uninitialized
//! extents) or its block map (direct, single, double and triple indirect
//! blocks), and claims every block the inode uses: a block out of range,
//! inside file-system metadata, or claimed twice is a conflict. The xattr
//! block is claimed by `pass1_xattr.rs`, which checks it. Builds the [`Mapping`] that pass 1
//! compares i_size and i_blocks with, and each directory's block list for
//! pass 2.
//!
//! Repairs: one shape only, an index key *lower* than its child's first
//! key but above the previous entry's range, in the inode's root, not
//! first in its node, or first with its parent's key (recorded as
//! [`StaleIndexKey`]s, the keys above that equal it too; the benign repair
//! raises them). A key above its child's first key hides mappings and
//! stays unsafe, as does everything else found here.

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use crate::error::FsError;

impl<'a> Checker<'a> {
    /// Claim `len` blocks from `start` for `ino`: each must be in range,
    /// not metadata, and not claimed before.
    pub(super) fn claim(
        &mut self,
        ino: u32,
        start: u64,
        len: u64,
        what: &str,
        info: &mut InodeInfo,
    ) {
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

    pub(super) fn walk_extents(
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
            spine: Vec::new(),
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
                    // Raising the first key of a non-root node raises the
                    // keys above it that equal it too (COLLAPSE_RANGE and
                    // INSERT_RANGE move the first extents of a deep tree,
                    // each level a write of its own); a first key below
                    // its parent's is not this shape and stays unsafe.
                    let chain = i == 0 && node_block.is_some() && lblk == lo;
                    if f > lblk && f < next_lblk && (node_block.is_none() || i > 0 || chain) {
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
                        if chain {
                            for &(nb, entry) in &w.spine {
                                self.stale_index_keys.push(StaleIndexKey {
                                    ino,
                                    node_block: nb,
                                    entry,
                                    key: f as u32,
                                });
                            }
                        }
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
                let saved = w.spine.clone();
                if !(i == 0 && node_block.is_some() && lblk == lo) {
                    w.spine.clear();
                }
                w.spine.push((node_block, i));
                let r = self.extent_node(
                    w,
                    m,
                    info,
                    &data,
                    Some(child),
                    Some(depth - 1),
                    lblk,
                    next_lblk,
                    Some(depth - 1),
                );
                w.spine = saved;
                r?;
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
    pub(super) fn walk_block_map(
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
}

/// What an inode maps.
#[derive(Default, Debug)]
pub(crate) struct Mapping {
    /// Blocks counted for i_blocks (data and tree blocks).
    pub(super) blocks: u64,
    pub(super) data_blocks: u64,
    pub(super) last_lblk: Option<u64>,
    pub(super) last_init_lblk: Option<u64>,
    pub(super) first_pblk: Option<u64>,
}

struct Walk {
    ino: u32,
    iblock: u64,
    is_dir: bool,
    seed: u32,
    prev_end: u64,
    nodes_left: u64,
    /// The index entries above the node being walked whose keys must move
    /// with its first key: the entry naming it, and, while that is the
    /// first entry of a non-root node with its parent's key, the entries
    /// above it (`(node block, entry)`, `None` for the root).
    spine: Vec<(Option<u64>, usize)>,
}
