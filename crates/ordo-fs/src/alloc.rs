//! Block and inode allocation over ext4's per-group bitmaps.
//!
//! Blocks are allocated goal-first: a file's next block is looked for right
//! after its previous one, so sequential writes come out contiguous, and a
//! run is extended as far as the caller wants. Directories are spread over
//! groups (a rotor over groups with more free inodes than average), files
//! go to their parent's group: a simple form of Orlov's policy.
//!
//! Every bit changed is one `Bitmap` update and every descriptor counter one
//! `Counter` update; the superblock's summary counters are refreshed when
//! the file system is synced (ext4 also keeps them lazily). A freed block is
//! reported to the protocol (`on_block_freed`) and dropped from the cache
//! when the handle ends (a rollback may take the free back first; the
//! handle does not allocate it again), and the protocol decides when it may
//! be reused (`can_allocate`).
//!
//! Groups whose bitmaps were never initialized (`BLOCK_UNINIT`,
//! `INODE_UNINIT`, left by mkfs) get their bitmap built on first use, as the
//! kernel's `ext4_init_block_bitmap` does.

use ordo_dev::BlockClass;

use crate::error::{errno, FsError, Result};
use crate::layout::{self, gd};
use crate::state::Core;
use crate::update::{BitmapKind, CounterKind, Ino, UpdateKind};

/// What the allocators learned of one group's bitmap: every bit below
/// `bits` is set (in use), for as long as the bitmap's cached image is at
/// `generation`. Each change to a cached block gives it a new generation,
/// and so does reading it again after eviction, so a front that may no
/// longer hold (a rollback put bytes back, the block left the cache) is
/// not used: nothing is known then, which is also true.
///
/// A scan for a free bit starts at the front instead of at its goal when
/// the goal lies below it: it passes over only bits it would have passed
/// over anyway, and picks what it picked before. Without it, every new
/// file's first block was looked for from its group's inode table on,
/// over every block already in use there: a walk that grew with the
/// group's files (the kernel's ext4 keeps `bb_first_free` per group for
/// the same reason).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UsedFront {
    generation: u64,
    bits: u32,
}

impl UsedFront {
    /// Bits known set from bit 0 on, in the image at `generation`.
    fn known(self, generation: u64) -> usize {
        if generation != 0 && self.generation == generation {
            self.bits as usize
        } else {
            0
        }
    }

    /// The front after bits `first..first + len` of an image whose front
    /// was `known` were set (`set`) or cleared, now at `generation`.
    fn after_change(known: usize, first: usize, len: usize, set: bool, generation: u64) -> Self {
        let bits = if !set {
            known.min(first)
        } else if first <= known {
            known.max(first + len)
        } else {
            known
        };
        UsedFront {
            generation,
            bits: bits as u32,
        }
    }
}

/// Whether bits `from..to` of `bitmap` are all set (stops at the first
/// clear one).
fn all_set(bitmap: &[u8], from: usize, to: usize) -> bool {
    let bit = |i: usize| bitmap[i / 8] & (1 << (i % 8)) != 0;
    let mut i = from;
    while i < to && !i.is_multiple_of(8) {
        if !bit(i) {
            return false;
        }
        i += 1;
    }
    while i + 8 <= to {
        if bitmap[i / 8] != 0xFF {
            return false;
        }
        i += 8;
    }
    (i..to).all(bit)
}

impl Core {
    pub fn group_count(&self) -> u32 {
        self.groups.len() as u32
    }

    pub fn group_of_block(&self, block: u64) -> u32 {
        self.sbi.group_of_block(block) as u32
    }

    /// Load group `g`'s block bitmap, building it if the group is
    /// `BLOCK_UNINIT`. Returns the bitmap block number.
    fn block_bitmap(&mut self, g: u32) -> Result<u64> {
        let loc = self.groups[g as usize];
        let flags = self.gd16(g, gd::FLAGS)?;
        if flags & gd::FLAG_BLOCK_UNINIT != 0 && !self.cache.contains(loc.block_bitmap) {
            let bs = self.bs as usize;
            let mut img = vec![0u8; bs];
            let first = self.sbi.group_first_block(g as u64);
            let n = self.sbi.blocks_in_group(g as u64) as u64;
            let mut mark = |b: u64| {
                if b >= first && b < first + n {
                    let i = (b - first) as usize;
                    img[i / 8] |= 1 << (i % 8);
                }
            };
            let over = self.sbi.super_overhead_blocks(g as u64);
            for b in first..first + over {
                mark(b);
            }
            let itb = self.sbi.inode_table_blocks() as u64;
            for h in &self.groups {
                mark(h.block_bitmap);
                mark(h.inode_bitmap);
                for b in h.inode_table..h.inode_table + itb {
                    mark(b);
                }
            }
            for i in n as usize..bs * 8 {
                img[i / 8] |= 1 << (i % 8);
            }
            self.init_block(
                loc.block_bitmap,
                BlockClass::GroupMeta,
                &img,
                UpdateKind::Other,
            );
            self.set_gd16(
                g,
                gd::FLAGS,
                flags & !gd::FLAG_BLOCK_UNINIT,
                UpdateKind::Other,
            );
            self.csum_block_bitmap(g);
        } else {
            let bits = self.sbi.clusters_per_group;
            let csum = (gd::BLOCK_BITMAP_CSUM_LO, gd::BLOCK_BITMAP_CSUM_HI);
            self.check_bitmap_csum(g, loc.block_bitmap, bits, csum)?;
        }
        Ok(loc.block_bitmap)
    }

    /// Read bitmap `block` of group `g` and, when it is what the disk holds
    /// (clean), check it against the descriptor's checksum (fields
    /// `csum_lo`, `csum_hi`). Bits past `bits_per_group` are not covered.
    fn check_bitmap_csum(
        &mut self,
        g: u32,
        block: u64,
        bits_per_group: u32,
        (csum_lo, csum_hi): (usize, usize),
    ) -> Result<()> {
        let img = self.read_block(block, BlockClass::GroupMeta)?;
        if !self.seal.csum || self.cache.is_dirty(block) || (self.backlinks && self.scan_needed) {
            // Backlinks before the scan: bitmap and descriptor were
            // written in no order; the scanners rebuild both.
            return Ok(());
        }
        let n = (bits_per_group as usize / 8).min(img.len());
        let mut want = layout::ext4_crc(self.seal.csum_seed, &img[..n]);
        drop(img);
        let stored = self.gd_count(g, csum_lo, csum_hi)?;
        if self.seal.desc_size < 64 {
            want &= 0xFFFF;
        }
        if stored != want {
            let what = if csum_lo == gd::BLOCK_BITMAP_CSUM_LO {
                "block bitmap"
            } else {
                "inode bitmap"
            };
            return Err(FsError::corrupt(
                block,
                format!("group {g} {what} checksum"),
                format!("descriptor holds {stored:#010x}, computed {want:#010x}"),
            ));
        }
        Ok(())
    }

    /// Load group `g`'s inode bitmap, building it if `INODE_UNINIT`.
    fn inode_bitmap(&mut self, g: u32) -> Result<u64> {
        let loc = self.groups[g as usize];
        let flags = self.gd16(g, gd::FLAGS)?;
        if flags & gd::FLAG_INODE_UNINIT != 0 && !self.cache.contains(loc.inode_bitmap) {
            let bs = self.bs as usize;
            let mut img = vec![0u8; bs];
            for i in self.sbi.inodes_per_group as usize..bs * 8 {
                img[i / 8] |= 1 << (i % 8);
            }
            self.init_block(
                loc.inode_bitmap,
                BlockClass::GroupMeta,
                &img,
                UpdateKind::Other,
            );
            // The flag says the whole inode table is unused: clearing it
            // moves the group's unused-inode mark, like bg_itable_unused.
            self.set_gd16(
                g,
                gd::FLAGS,
                flags & !gd::FLAG_INODE_UNINIT,
                UpdateKind::Counter {
                    what: CounterKind::ItableUnused,
                    group: Some(g),
                    delta: 0,
                },
            );
            self.csum_inode_bitmap(g);
        } else {
            let bits = self.sbi.inodes_per_group;
            let csum = (gd::INODE_BITMAP_CSUM_LO, gd::INODE_BITMAP_CSUM_HI);
            self.check_bitmap_csum(g, loc.inode_bitmap, bits, csum)?;
        }
        Ok(loc.inode_bitmap)
    }

    /// Free blocks of group `g` according to its descriptor.
    pub fn group_free_blocks(&mut self, g: u32) -> Result<u32> {
        self.gd_count(g, gd::FREE_BLOCKS_LO, gd::FREE_BLOCKS_HI)
    }

    /// Free inodes of group `g` according to its descriptor.
    pub fn group_free_inodes(&mut self, g: u32) -> Result<u32> {
        self.gd_count(g, gd::FREE_INODES_LO, gd::FREE_INODES_HI)
    }

    /// Add `delta` to counter `what` of group `g` (never below 0).
    pub fn add_group_counter(&mut self, g: u32, what: CounterKind, delta: i64) -> Result<()> {
        let (lo, hi) = match what {
            CounterKind::FreeBlocks => (gd::FREE_BLOCKS_LO, gd::FREE_BLOCKS_HI),
            CounterKind::FreeInodes => (gd::FREE_INODES_LO, gd::FREE_INODES_HI),
            CounterKind::UsedDirs => (gd::USED_DIRS_LO, gd::USED_DIRS_HI),
            CounterKind::ItableUnused => (gd::ITABLE_UNUSED_LO, gd::ITABLE_UNUSED_HI),
        };
        let old = self.gd_count(g, lo, hi)?;
        let v = (old as i64 + delta).clamp(0, u32::MAX as i64) as u32;
        let kind = UpdateKind::Counter {
            what,
            group: Some(g),
            delta,
        };
        // Only the halves that change: the high half of a group's counter
        // (above 65,535) almost never does, and a change that writes the
        // bytes already there is no change (`Core::modify`).
        if v as u16 != old as u16 {
            self.set_gd16(g, lo, v as u16, kind.clone());
        }
        if self.seal.desc_size >= 64 && v >> 16 != old >> 16 {
            self.set_gd16(g, hi, (v >> 16) as u16, kind);
        }
        Ok(())
    }

    /// Allocate up to `max` contiguous blocks, as near `goal` as possible.
    /// Returns `(first, len)` with `1 <= len <= max`, or ENOSPC.
    ///
    /// Unless the handle may use them (`use_reserve`: root, the reserved
    /// uid or gid, operations that free space), the last
    /// `s_r_blocks_count` free blocks are not handed out, as ext4's
    /// `ext4_has_free_clusters`.
    ///
    /// With [`Core::alloc_from_group_start`] the search starts at the
    /// first block of the goal's group instead of the goal.
    pub fn alloc_blocks(&mut self, goal: u64, max: u32) -> Result<(u64, u32)> {
        assert!(max > 0);
        let mut max = max;
        // Root's reserve (for callers without the right) and the blocks
        // promised to delayed allocations (for all but their settling).
        let hold = if self.use_reserve {
            0
        } else {
            self.sbi.r_blocks_count
        } + self.promised_blocks();
        if hold > 0 {
            let (free, _) = self.free_totals()?;
            let avail = free.saturating_sub(hold);
            if avail == 0 {
                return Err(errno(libc::ENOSPC));
            }
            max = max.min(avail.min(u32::MAX as u64) as u32);
        }
        let ngroups = self.group_count();
        let goal = if goal < self.sbi.first_data_block as u64 || goal >= self.sbi.blocks_count {
            self.sbi.first_data_block as u64
        } else {
            goal
        };
        let g0 = self.group_of_block(goal);
        let goal = if self.alloc_from_group_start {
            self.sbi.group_first_block(g0 as u64)
        } else {
            goal
        };
        for i in 0..=ngroups {
            let g = (g0 + i) % ngroups;
            if self.group_free_blocks(g)? == 0 {
                continue;
            }
            let start_idx = if i == 0 {
                self.sbi.block_index_in_group(goal) as usize
            } else {
                0
            };
            if let Some((first, len)) = self.find_free_run(g, start_idx, max)? {
                self.mark_blocks(first, len, true)?;
                return Ok((first, len));
            }
        }
        Err(errno(libc::ENOSPC))
    }

    /// Whether free block `b` may be allocated now: not freed by this
    /// handle (a rollback may take the free back) and not held back by the
    /// protocol's reuse rules.
    fn may_take(&self, b: u64) -> bool {
        !self.freed_by_handle(b) && self.proto.can_allocate(b)
    }

    /// Look for a free run in group `g` starting at or after bit `from`.
    fn find_free_run(&mut self, g: u32, from: usize, max: u32) -> Result<Option<(u64, u32)>> {
        let bb = self.block_bitmap(g)?;
        let img = self.read_block(bb, BlockClass::GroupMeta)?;
        let n = self.sbi.blocks_in_group(g as u64) as usize;
        let first_block = self.sbi.group_first_block(g as u64);
        let generation = self.cache.generation(bb);
        let mut known = self.block_fronts[g as usize].known(generation);
        if known < from && all_set(&img, known, from.min(n)) {
            // The goal is past what is known, and everything below it is
            // in use (a group's own metadata, before a new file's goal):
            // the front is at least there.
            known = from.min(n);
        }
        debug_assert!(
            all_set(&img, 0, known),
            "group {g}: block bitmap {bb} is not in use below its front {known}"
        );
        // Started at the front, the first clear bit the scan meets is the
        // new front (taken or not).
        let mut front = (from <= known).then_some(n);
        let mut found = None;
        let mut i = from.max(known);
        while i < n {
            // Skip what is all in use a 64-bit word, then a byte, at a time.
            if i.is_multiple_of(64) && i + 64 <= n {
                let word: [u8; 8] = img[i / 8..i / 8 + 8].try_into().expect("8 bytes");
                if u64::from_le_bytes(word) == u64::MAX {
                    i += 64;
                    continue;
                }
            }
            if i.is_multiple_of(8) && i + 8 <= n && img[i / 8] == 0xFF {
                i += 8;
                continue;
            }
            if img[i / 8] & (1 << (i % 8)) == 0 {
                if let Some(f) = front.as_mut() {
                    *f = (*f).min(i);
                }
                if self.may_take(first_block + i as u64) {
                    let mut len = 1usize;
                    while len < max as usize
                        && i + len < n
                        && img[(i + len) / 8] & (1 << ((i + len) % 8)) == 0
                        && self.may_take(first_block + (i + len) as u64)
                    {
                        len += 1;
                    }
                    found = Some((first_block + i as u64, len as u32));
                    break;
                }
            }
            i += 1;
        }
        if let Some(bits) = front {
            self.block_fronts[g as usize] = UsedFront {
                generation,
                bits: bits as u32,
            };
        }
        Ok(found)
    }

    /// Set (allocate) or clear (free) the bits of blocks `first..first+len`
    /// (all in one group), with the group's free count.
    fn mark_blocks(&mut self, first: u64, len: u32, set: bool) -> Result<()> {
        let g = self.group_of_block(first);
        debug_assert_eq!(g, self.group_of_block(first + len as u64 - 1));
        let bb = self.block_bitmap(g)?;
        let img = self.read_block(bb, BlockClass::GroupMeta)?;
        let base = self.sbi.block_index_in_group(first) as usize;
        let known = self.block_fronts[g as usize].known(self.cache.generation(bb));
        let mut bytes: smallvec::SmallVec<[(usize, u8); 8]> = smallvec::SmallVec::new();
        for k in 0..len as usize {
            let i = base + k;
            let cur = bytes
                .last()
                .filter(|(at, _)| *at == i / 8)
                .map(|&(_, v)| v)
                .unwrap_or(img[i / 8]);
            let bit = 1u8 << (i % 8);
            let was = cur & bit != 0;
            if was == set {
                return Err(crate::error::FsError::corrupt(
                    bb,
                    "block bitmap",
                    format!(
                        "block {} is already {}",
                        first + k as u64,
                        if set { "in use" } else { "free" }
                    ),
                ));
            }
            let v = if set { cur | bit } else { cur & !bit };
            match bytes.last_mut() {
                Some((at, val)) if *at == i / 8 => *val = v,
                _ => bytes.push((i / 8, v)),
            }
        }
        drop(img);
        // One update per bit, in the order of the blocks; each reads the
        // byte as the one before left it in the cache.
        for k in 0..len as usize {
            let i = base + k;
            let cur = self.cache.snapshot(bb).expect("cached")[i / 8];
            let bit = 1u8 << (i % 8);
            let v = if set { cur | bit } else { cur & !bit };
            self.modify(
                bb,
                i / 8,
                &[v],
                UpdateKind::Bitmap {
                    what: BitmapKind::Block,
                    index: first + k as u64,
                    set,
                },
            );
        }
        self.block_fronts[g as usize] =
            UsedFront::after_change(known, base, len as usize, set, self.cache.generation(bb));
        self.csum_block_bitmap(g);
        let delta = if set { -(len as i64) } else { len as i64 };
        self.add_group_counter(g, CounterKind::FreeBlocks, delta)?;
        Ok(())
    }

    /// Free blocks `first..first+len` (may span groups).
    pub fn free_blocks(&mut self, first: u64, len: u64) -> Result<()> {
        let mut b = first;
        let end = first + len;
        while b < end {
            let g = self.group_of_block(b);
            let gend =
                self.sbi.group_first_block(g as u64) + self.sbi.blocks_in_group(g as u64) as u64;
            let n = (end.min(gend) - b) as u32;
            self.mark_blocks(b, n, false)?;
            for x in b..b + n as u64 {
                self.note_block_freed(x);
            }
            b += n as u64;
        }
        Ok(())
    }

    /// Whether block `b` is in use in its group's bitmap.
    pub fn block_in_use(&mut self, b: u64) -> Result<bool> {
        let g = self.group_of_block(b);
        let bb = self.block_bitmap(g)?;
        let img = self.read_block(bb, BlockClass::GroupMeta)?;
        let i = self.sbi.block_index_in_group(b) as usize;
        Ok(img[i / 8] & (1 << (i % 8)) != 0)
    }

    /// Bring the bits of blocks `first..first+len` (may span groups) to
    /// `used`, changing only those that differ, with the groups' free
    /// counts. Unlike [`Core::free_blocks`], a block already in the
    /// wanted state is no error, and a cleared block is not reported as
    /// freed by the handle: this states where blocks are, for a caller
    /// that rebuilds allocation state (fast-commit replay).
    pub fn set_blocks_in_use(&mut self, first: u64, len: u64, used: bool) -> Result<()> {
        let end = first + len;
        let mut b = first;
        while b < end {
            if self.block_in_use(b)? == used {
                b += 1;
                continue;
            }
            let g = self.group_of_block(b);
            let gend =
                self.sbi.group_first_block(g as u64) + self.sbi.blocks_in_group(g as u64) as u64;
            let mut n = 1u64;
            while b + n < end.min(gend) && self.block_in_use(b + n)? != used {
                n += 1;
            }
            self.mark_blocks(b, n as u32, used)?;
            b += n;
        }
        Ok(())
    }

    /// Whether inode `ino` is in use in its group's bitmap.
    pub fn inode_in_use(&mut self, ino: Ino) -> Result<bool> {
        self.check_ino(ino)?;
        let ipg = self.sbi.inodes_per_group;
        let idx = ((ino - 1) % ipg) as usize;
        let ib = self.inode_bitmap((ino - 1) / ipg)?;
        let img = self.read_block(ib, BlockClass::GroupMeta)?;
        Ok(img[idx / 8] & (1 << (idx % 8)) != 0)
    }

    /// Bring inode `ino`'s bit to `used`, with the group's free count and,
    /// for an inode marked used past it, its unused-table mark (as
    /// [`Core::alloc_inode`]); nothing when the bit already says so.
    /// The caller keeps `bg_used_dirs_count` ([`Core::add_group_counter`]).
    pub fn set_inode_in_use(&mut self, ino: Ino, used: bool) -> Result<()> {
        self.check_ino(ino)?;
        let ipg = self.sbi.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = ((ino - 1) % ipg) as usize;
        let ib = self.inode_bitmap(g)?;
        let img = self.read_block(ib, BlockClass::GroupMeta)?;
        let cur = img[idx / 8];
        drop(img);
        if (cur & (1 << (idx % 8)) != 0) != used {
            let v = if used {
                cur | (1 << (idx % 8))
            } else {
                cur & !(1 << (idx % 8))
            };
            self.modify(
                ib,
                idx / 8,
                &[v],
                UpdateKind::Bitmap {
                    what: BitmapKind::Inode,
                    index: ino as u64,
                    set: used,
                },
            );
            self.csum_inode_bitmap(g);
            self.add_group_counter(g, CounterKind::FreeInodes, if used { -1 } else { 1 })?;
        }
        if used && self.sbi.has_group_csum() {
            let unused = self.gd_count(g, gd::ITABLE_UNUSED_LO, gd::ITABLE_UNUSED_HI)?;
            if idx as u32 >= ipg - unused {
                let new_unused = ipg - (idx as u32 + 1);
                self.add_group_counter(
                    g,
                    CounterKind::ItableUnused,
                    new_unused as i64 - unused as i64,
                )?;
            }
        }
        Ok(())
    }

    /// Allocate an inode for a child of `parent`.
    pub fn alloc_inode(&mut self, parent: Ino, is_dir: bool) -> Result<Ino> {
        let ngroups = self.group_count();
        let ipg = self.sbi.inodes_per_group;
        let pg = (parent - 1) / ipg;
        let start = if is_dir && ngroups > 1 {
            // Spread directories: the next group (rotor) with at least the
            // average number of free inodes.
            // The kept sum (exact, checked against the descriptors in debug
            // builds) rather than a walk of every group per mkdir.
            let total_free: u64 = match self.free_totals() {
                Ok((_, inodes)) => inodes,
                Err(_) => (0..ngroups)
                    .map(|g| self.group_free_inodes(g).unwrap_or(0) as u64)
                    .sum(),
            };
            let avg = total_free / ngroups as u64;
            let mut pick = pg;
            for i in 0..ngroups {
                let g = (self.dir_rotor + i) % ngroups;
                if self.group_free_inodes(g)? as u64 >= avg.max(1) && self.group_free_blocks(g)? > 0
                {
                    pick = g;
                    break;
                }
            }
            self.dir_rotor = (pick + 1) % ngroups;
            pick
        } else {
            pg
        };
        for i in 0..ngroups {
            let g = (start + i) % ngroups;
            if self.group_free_inodes(g)? == 0 {
                continue;
            }
            let ib = self.inode_bitmap(g)?;
            let img = self.read_block(ib, BlockClass::GroupMeta)?;
            let first_idx = if g == 0 {
                self.sbi.first_ino() as usize - 1
            } else {
                0
            };
            let generation = self.cache.generation(ib);
            let mut known = self.inode_fronts[g as usize].known(generation);
            if known < first_idx && all_set(&img, known, first_idx) {
                // Group 0's reserved inodes, always in use.
                known = first_idx;
            }
            debug_assert!(
                all_set(&img, 0, known),
                "group {g}: inode bitmap {ib} is not in use below its front {known}"
            );
            // As in `find_free_run`: from the front on, the first clear bit
            // met is the new front.
            let mut front = (first_idx <= known).then_some(ipg as usize);
            let mut found = None;
            let mut i = first_idx.max(known);
            while i < ipg as usize {
                if i % 64 == 0 && i + 64 <= ipg as usize && img[i / 8..i / 8 + 8] == [0xff; 8] {
                    // Sixty-four inodes in use: the used front of a group's
                    // bitmap is passed over eight bytes at a time.
                    i += 64;
                    continue;
                }
                if i % 8 == 0 && img[i / 8] == 0xff {
                    // A full byte: eight inodes in use.
                    i += 8;
                    continue;
                }
                if img[i / 8] & (1 << (i % 8)) == 0 {
                    if let Some(f) = front.as_mut() {
                        *f = (*f).min(i);
                    }
                    if self
                        .proto
                        .can_allocate_inode(g * ipg + i as u32 + 1, &self.handle)
                    {
                        found = Some(i);
                        break;
                    }
                }
                i += 1;
            }
            drop(img);
            let known = front.unwrap_or(known);
            let Some(idx) = found else {
                self.inode_fronts[g as usize] = UsedFront {
                    generation,
                    bits: known as u32,
                };
                continue;
            };
            let ino = g * ipg + idx as u32 + 1;
            let img = self.read_block(ib, BlockClass::GroupMeta)?;
            let v = img[idx / 8] | (1 << (idx % 8));
            drop(img);
            self.modify(
                ib,
                idx / 8,
                &[v],
                UpdateKind::Bitmap {
                    what: BitmapKind::Inode,
                    index: ino as u64,
                    set: true,
                },
            );
            self.inode_fronts[g as usize] =
                UsedFront::after_change(known, idx, 1, true, self.cache.generation(ib));
            self.csum_inode_bitmap(g);
            self.add_group_counter(g, CounterKind::FreeInodes, -1)?;
            if is_dir {
                self.add_group_counter(g, CounterKind::UsedDirs, 1)?;
            }
            if self.sbi.has_group_csum() {
                let unused = self.gd_count(g, gd::ITABLE_UNUSED_LO, gd::ITABLE_UNUSED_HI)?;
                let hwm = ipg - unused;
                if idx as u32 >= hwm {
                    let new_unused = ipg - (idx as u32 + 1);
                    self.add_group_counter(
                        g,
                        CounterKind::ItableUnused,
                        new_unused as i64 - unused as i64,
                    )?;
                }
            }
            return Ok(ino);
        }
        Err(errno(libc::ENOSPC))
    }

    /// Release inode `ino` in its bitmap and counters.
    pub fn free_inode_bit(&mut self, ino: Ino, was_dir: bool) -> Result<()> {
        let ipg = self.sbi.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = ((ino - 1) % ipg) as usize;
        let ib = self.inode_bitmap(g)?;
        let img = self.read_block(ib, BlockClass::GroupMeta)?;
        if img[idx / 8] & (1 << (idx % 8)) == 0 {
            return Err(crate::error::FsError::corrupt(
                ib,
                "inode bitmap",
                format!("inode {ino} is already free"),
            ));
        }
        let v = img[idx / 8] & !(1 << (idx % 8));
        drop(img);
        let known = self.inode_fronts[g as usize].known(self.cache.generation(ib));
        self.modify(
            ib,
            idx / 8,
            &[v],
            UpdateKind::Bitmap {
                what: BitmapKind::Inode,
                index: ino as u64,
                set: false,
            },
        );
        self.inode_fronts[g as usize] =
            UsedFront::after_change(known, idx, 1, false, self.cache.generation(ib));
        self.csum_inode_bitmap(g);
        self.add_group_counter(g, CounterKind::FreeInodes, 1)?;
        if was_dir {
            self.add_group_counter(g, CounterKind::UsedDirs, -1)?;
        }
        Ok(())
    }

    /// Sum of the groups' free blocks and free inodes: kept once summed
    /// (`Core::free_sums`), so that it costs nothing per allocation on a
    /// file system of thousands of groups.
    pub fn free_totals(&mut self) -> Result<(u64, u64)> {
        if let Some(sums) = self.free_sums {
            if cfg!(debug_assertions) {
                if let Ok(walked) = self.sum_free_counts() {
                    assert_eq!(
                        sums, walked,
                        "the kept free sums drifted from the group descriptors"
                    );
                }
            }
            return Ok(sums);
        }
        let sums = self.sum_free_counts()?;
        self.free_sums = Some(sums);
        Ok(sums)
    }

    /// [`Core::free_totals`] read from every descriptor.
    pub(crate) fn sum_free_counts(&mut self) -> Result<(u64, u64)> {
        let mut fb = 0u64;
        let mut fi = 0u64;
        for g in 0..self.group_count() {
            fb += self.group_free_blocks(g)? as u64;
            fi += self.group_free_inodes(g)? as u64;
        }
        Ok((fb, fi))
    }

    /// Bring the superblock's summary counters up to date (inside a handle).
    pub fn update_sb_counters(&mut self) -> Result<()> {
        let (fb, fi) = self.free_totals()?;
        let old_fb = self.sb32(crate::layout::sb::FREE_BLOCKS_LO)? as u64
            | (self.sb32(crate::layout::sb::FREE_BLOCKS_HI)? as u64) << 32;
        let old_fi = self.sb32(crate::layout::sb::FREE_INODES)? as u64;
        if old_fb != fb {
            let kind = UpdateKind::Counter {
                what: CounterKind::FreeBlocks,
                group: None,
                delta: fb as i64 - old_fb as i64,
            };
            self.set_sb(
                crate::layout::sb::FREE_BLOCKS_LO,
                &(fb as u32).to_le_bytes(),
                kind.clone(),
            )?;
            if self.sbi.has_64bit() {
                self.set_sb(
                    crate::layout::sb::FREE_BLOCKS_HI,
                    &((fb >> 32) as u32).to_le_bytes(),
                    kind,
                )?;
            }
        }
        if old_fi != fi {
            let kind = UpdateKind::Counter {
                what: CounterKind::FreeInodes,
                group: None,
                delta: fi as i64 - old_fi as i64,
            };
            self.set_sb(
                crate::layout::sb::FREE_INODES,
                &(fi as u32).to_le_bytes(),
                kind,
            )?;
        }
        Ok(())
    }
}
