//! Pass 5: allocation bitmaps and free counts (e2fsck's `pass5.c`).
//!
//! Compares each group's block and inode bitmaps, as libext2fs reads them
//! (`BLOCK_UNINIT` and `INODE_UNINIT` groups emulated), with what passes 0
//! and 1 found in use; then the bitmaps' padding and checksums, the
//! group's free block, free inode and directory counts, and the
//! superblock's free counts.
//!
//! Repairs, all through the benign repair: bits marked but unused (a
//! benign leak), bits in use but free (a hazard: harmless only when the
//! repair runs before the next allocation, which could hand them out
//! twice), padding, bitmap checksums and group counts. A superblock count
//! difference is info, as in e2fsck, and is repaired too.

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use super::{ProblemClass, Severity};
use crate::error::FsError;

impl<'a> Checker<'a> {
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

    pub(super) fn pass5(&mut self) -> Result<(), FsError> {
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

fn bit(bytes: &[u8], i: u64) -> bool {
    bytes
        .get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
}
