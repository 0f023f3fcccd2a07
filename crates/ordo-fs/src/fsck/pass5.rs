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

    /// Pass 5's check of one allocation bitmap of group `g`, the same for
    /// blocks and inodes once its bits are compared with use (`plus`: in
    /// use but free, a hazard, as the next allocation can hand them out
    /// twice; `minus`: marked but unused, a benign leak). Then its padding
    /// and, with `metadata_csum`, its checksum against the descriptor at
    /// `gd_block`: a bitmap the group's `*_UNINIT` flag emulates has
    /// neither on disk, and the checksum is only checked once the bits are
    /// right (the repair rewrites both together).
    fn check_bitmap(
        &mut self,
        g: u32,
        gd_block: u64,
        side: &BitmapSide<'_>,
        plus: &[u64],
        minus: &[u64],
    ) {
        let (kind, bm_block) = (side.kind, side.block);
        let what = kind.name();
        if !plus.is_empty() {
            self.report(
                Severity::Hazard,
                kind.used_but_free_class(),
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
                kind.bitmap_class(),
                None,
                Some(bm_block),
                format!(
                    "group {g} {what} bitmap (block {bm_block}): free but marked (leaked): {}",
                    describe_diffs(minus, '-')
                ),
            );
        }
        let bits_right = plus.is_empty() && minus.is_empty();
        let Some(bm) = side.disk.filter(|_| !side.uninit) else {
            return;
        };
        if (bits_right || !kind.padding_waits_for_bits()) && !(side.padding_ok)(bm) {
            self.report(
                Severity::Benign,
                kind.bitmap_class(),
                None,
                Some(bm_block),
                format!(
                    "group {g} {what} bitmap (block {bm_block}): padding past {} is not set",
                    kind.padding_end()
                ),
            );
        }
        if self.sb.metadata_csum() && bits_right {
            let big_desc = self.geo.desc_size >= 64;
            let n = side.csum_bytes;
            let want = bitmap_checksum(self.geo.csum_seed, &bm[..n.min(bm.len())], big_desc);
            if want != side.csum {
                self.report(
                    Severity::Benign,
                    kind.bitmap_class(),
                    None,
                    Some(gd_block),
                    format!(
                        "group {g} descriptor (block {gd_block}) bg_{what}_bitmap_csum is {:#x}, \
                         computed {want:#x}",
                        side.csum
                    ),
                );
            }
        }
    }

    pub(super) fn pass5(&mut self) -> Result<(), FsError> {
        let bpg = self.geo.blocks_per_group;
        let ipg = self.geo.inodes_per_group as u64;
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
            let (used_in_group, plus, minus) =
                diff_block_bitmap(count, disk_bm.as_deref(), &self.used, first);
            let free_blocks = count - used_in_group;
            total_free_blocks += free_blocks;
            let last_group = g == self.geo.groups - 1;
            let side = BitmapSide {
                kind: BitmapKind::Block,
                block: gd.block_bitmap,
                disk: disk_bm.as_deref(),
                uninit: self.sb.gdt_csum() && gd.flags & BG_BLOCK_UNINIT != 0,
                // Only the last group has bits past the end of the file
                // system.
                padding_ok: &|bm| !((count..bpg).any(|i| !bit(bm, i)) && last_group),
                csum_bytes: (self.sb.clusters_per_group / 8) as usize,
                csum: gd.block_bitmap_csum,
            };
            self.check_bitmap(g, gd_block, &side, &plus, &minus);
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
            let side = BitmapSide {
                kind: BitmapKind::Inode,
                block: gd.inode_bitmap,
                disk: disk_ib.as_deref(),
                uninit: uninit_i,
                padding_ok: &|ib| {
                    let pad_from = (ipg / 8) as usize;
                    ipg.is_multiple_of(8) && ib[pad_from..].iter().all(|&b| b == 0xFF)
                },
                csum_bytes: (ipg / 8) as usize,
                csum: gd.inode_bitmap_csum,
            };
            self.check_bitmap(g, gd_block, &side, &plus, &minus);
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

impl BitmapKind {
    /// The word messages use ("block bitmap", `bg_block_bitmap_csum`).
    fn name(self) -> &'static str {
        match self {
            BitmapKind::Block => "block",
            BitmapKind::Inode => "inode",
        }
    }

    /// The class of a bit in use that the bitmap calls free.
    fn used_but_free_class(self) -> ProblemClass {
        match self {
            BitmapKind::Block => ProblemClass::BlockUsedButFree,
            BitmapKind::Inode => ProblemClass::InodeUsedButFree,
        }
    }

    /// The class of everything else wrong with the bitmap: leaked bits,
    /// padding, checksum.
    fn bitmap_class(self) -> ProblemClass {
        match self {
            BitmapKind::Block => ProblemClass::BlockBitmap,
            BitmapKind::Inode => ProblemClass::InodeBitmap,
        }
    }

    /// Where the bits that must be set as padding begin.
    fn padding_end(self) -> &'static str {
        match self {
            BitmapKind::Block => "the end of the file system",
            BitmapKind::Inode => "the group's inodes",
        }
    }

    /// Whether padding is only checked once the bits are right. Block
    /// padding (the tail of the last group, past the end of the file
    /// system) is reported whatever the bits say; an inode bitmap's
    /// padding only once its bits match use, like its checksum.
    fn padding_waits_for_bits(self) -> bool {
        matches!(self, BitmapKind::Inode)
    }
}

/// One of a group's two allocation bitmaps, as [`Checker::check_bitmap`]
/// checks it: what differs between the block and the inode bitmap.
struct BitmapSide<'b> {
    kind: BitmapKind,
    /// The bitmap's block, from the group descriptor.
    block: u64,
    /// The bitmap as libext2fs reads it (`None`: it could not be read).
    disk: Option<&'b [u8]>,
    /// The group's `*_UNINIT` flag is set (with group checksums): the
    /// bitmap is emulated, with no padding or checksum on disk to check.
    uninit: bool,
    /// Whether the bitmap's padding bits are set as ext4 wants them.
    padding_ok: &'b dyn Fn(&[u8]) -> bool,
    /// How many bytes of the bitmap its checksum covers.
    csum_bytes: usize,
    /// The checksum the group descriptor holds.
    csum: u32,
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

/// [`diff_bitmap`] of a group's block bitmap against the walk's bits from
/// `first` on, 64 bits at a time: only a word that differs is looked at
/// bit by bit.
fn diff_block_bitmap(
    count: u64,
    disk: Option<&[u8]>,
    used: &Bits,
    first: u64,
) -> (u64, Vec<u64>, Vec<u64>) {
    let (mut in_use, mut missing, mut extra) = (0u64, Vec::new(), Vec::new());
    for base in (0..count).step_by(64) {
        let n = (count - base).min(64) as u32;
        let want = used.word_at(first + base, n);
        in_use += u64::from(want.count_ones());
        let Some(bm) = disk else { continue };
        // Bit `base` of the on-disk bitmap starts byte `base / 8`; bytes
        // past its end read as clear, as `bit` reads them.
        let mut have = 0u64;
        for k in 0..n.div_ceil(8) as usize {
            let byte = bm.get((base / 8) as usize + k).copied().unwrap_or(0);
            have |= u64::from(byte) << (8 * k);
        }
        if n < 64 {
            have &= (1u64 << n) - 1;
        }
        let mut diff = want ^ have;
        while diff != 0 {
            let k = diff.trailing_zeros();
            diff &= diff - 1;
            if want & (1 << k) != 0 {
                missing.push(first + base + u64::from(k));
            } else {
                extra.push(first + base + u64::from(k));
            }
        }
    }
    (in_use, missing, extra)
}

fn bit(bytes: &[u8], i: u64) -> bool {
    bytes
        .get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time block bitmap comparison finds what the
        /// bit-by-bit one finds: for any walk, any on-disk bitmap (shorter
        /// than the group, or unreadable), any group start and length.
        #[test]
        fn block_bitmap_words_match_bits(
            used_bits in proptest::collection::vec(any::<bool>(), 0..700),
            disk in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..90)),
            first in 0u64..130,
            count in 0u64..600,
        ) {
            let mut used = Bits::new(used_bits.len() as u64);
            for (i, &b) in used_bits.iter().enumerate() {
                if b {
                    used.set(i as u64);
                }
            }
            let words = diff_block_bitmap(count, disk.as_deref(), &used, first);
            let bits = diff_bitmap(count, disk.as_deref(), |i| used.get(first + i), |i| first + i);
            prop_assert_eq!(words, bits);
        }
    }
}
