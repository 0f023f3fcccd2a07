//! Order-preserving delayed allocation (ccfs, Pillai et al., §4.3), for
//! the protocols that ask for it ([`crate::protocol::Protocol::delays_allocation`]).
//!
//! A write into a hole of a regular file does not allocate: its block is
//! cached under a *delayed number* (at or above [`DELAYED_BASE`], never a
//! block of the device) and remembered in [`Delayed`]. The file's size,
//! times and every other change of the write are made as usual, in the
//! caller's running transaction. Just before a commit, every delayed block
//! gets its physical place ([`Core::settle_all`]): the blocks of one file
//! that follow each other are allocated as one run, mapped by one extent,
//! and their cached images move to their homes. That settling is reported
//! to the protocol as updates of the stream that wrote each block, so it
//! joins that stream's running transaction; it always happens before a
//! commit is planned, so every commit that carries a size also carries the
//! allocations under it, and a stream's program order is kept:
//! allocations are delayed until the next commit, never across one.
//!
//! When settling happens:
//! - before every plan the core asks of the protocol ([`Core::plan_with`]:
//!   fsync, sync, streamsync, the commit timer, write-back under memory
//!   pressure, a commit for space, unmount);
//! - at the end of a handle whose end the protocol says will commit
//!   ([`crate::protocol::Protocol::commit_due`]);
//! - for one file, before anything else maps or unmaps its blocks
//!   (truncate, fallocate and its shifts, and the free of a file that may
//!   still be rolled back). The free of a file that cannot be rolled back
//!   (unlink, the last close) drops its delayed blocks instead: nothing
//!   was ever allocated for them.
//!
//! Reads, `SEEK_DATA`/`SEEK_HOLE` and `st_blocks` see delayed blocks as
//! mapped (their images are cached, dirty, and never evicted).
//!
//! Space is reserved when a block is delayed: delaying needs its blocks,
//! plus a margin for the extent-tree blocks its settling may add, free
//! beyond what is already promised, what the protocol holds back from
//! reuse ([`crate::protocol::Protocol::held_back_blocks`]) and, for callers without the
//! right, root's reserve. Every other allocation leaves the promised
//! blocks alone, so settling does not fail for space. When the space is
//! not there, the write allocates at once, as without delaying.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::extent::{self, Mapping};
use crate::state::Core;
use crate::update::{DataWrite, Ino};

/// Delayed blocks are cached under numbers from here on: far above any
/// device's last block (2^62 blocks of 1 KiB is 4 ZiB).
pub const DELAYED_BASE: u64 = 1 << 62;

/// Extent-tree blocks reserved for the settling of one file's delayed
/// blocks, plus one per `TREE_MARGIN_PER` delayed blocks: a run of
/// consecutive logical blocks needs one extent, and a leaf holds 340.
const TREE_MARGIN_FILE: u64 = 4;
const TREE_MARGIN_PER: u64 = 64;

/// The extent-tree blocks promised for a file with `blocks` delayed
/// blocks (none for a file without any).
fn tree_margin(blocks: u64) -> u64 {
    if blocks == 0 {
        0
    } else {
        TREE_MARGIN_FILE + blocks / TREE_MARGIN_PER
    }
}

/// One delayed block: its number in the cache and the stream that last
/// wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DelayedBlock {
    pub virt: u64,
    pub stream: u32,
}

/// Every delayed block, by file and logical block.
#[derive(Debug, Default)]
pub(crate) struct Delayed {
    files: BTreeMap<Ino, BTreeMap<u32, DelayedBlock>>,
    next: u64,
    blocks: u64,
    /// The sum over `files` of [`tree_margin`]: kept as files gain and
    /// lose blocks, so that a write's check for space does not walk every
    /// file with delayed blocks.
    margins: u64,
    /// Blocks placed by settling since mount, and the settlings that
    /// placed any.
    pub settled_blocks: u64,
    pub settles: u64,
}

impl Delayed {
    /// Whether no block is delayed.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
    /// Delayed blocks now.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Delayed blocks of `ino`.
    pub fn blocks_of(&self, ino: Ino) -> u64 {
        self.files.get(&ino).map_or(0, |m| m.len() as u64)
    }
    /// Free blocks promised to the delayed ones: the blocks themselves and
    /// a margin for the extent-tree blocks their settling may add.
    pub fn promised(&self) -> u64 {
        debug_assert_eq!(
            self.margins,
            self.files
                .values()
                .map(|m| tree_margin(m.len() as u64))
                .sum::<u64>(),
            "the kept sum of tree margins drifted from the files"
        );
        self.blocks + self.margins
    }
    /// The promise that delaying `n` more blocks of `ino` adds.
    fn promise_of(&self, ino: Ino, n: u64) -> u64 {
        let had = self.blocks_of(ino);
        n + tree_margin(had + n) - tree_margin(had)
    }
    /// Delayed blocks of `ino` in logical blocks `range`, as mappings of
    /// runs that are consecutive in both numberings.
    pub fn mappings(&self, ino: Ino, range: std::ops::Range<u64>) -> Vec<Mapping> {
        let Some(m) = self.files.get(&ino) else {
            return Vec::new();
        };
        let lo = range.start.min(u64::from(u32::MAX)) as u32;
        let hi = range.end.min(u64::from(u32::MAX)) as u32;
        let mut out: Vec<Mapping> = Vec::new();
        for (&l, d) in m.range(lo..hi) {
            if let Some(last) = out.last_mut() {
                if last.lblk + last.len == l && last.pblk + u64::from(last.len) == d.virt {
                    last.len += 1;
                    continue;
                }
            }
            out.push(Mapping {
                lblk: l,
                pblk: d.virt,
                len: 1,
                unwritten: false,
            });
        }
        out
    }
    fn insert(&mut self, ino: Ino, lblk: u32, d: DelayedBlock) {
        let m = self.files.entry(ino).or_default();
        let had = m.len() as u64;
        let prev = m.insert(lblk, d);
        assert!(prev.is_none(), "inode {ino} block {lblk} delayed twice");
        self.margins = self.margins - tree_margin(had) + tree_margin(had + 1);
        self.blocks += 1;
    }
    fn remove(&mut self, ino: Ino, lblk: u32) -> Option<DelayedBlock> {
        let m = self.files.get_mut(&ino)?;
        let d = m.remove(&lblk)?;
        let now = m.len() as u64;
        if m.is_empty() {
            self.files.remove(&ino);
        }
        self.margins = self.margins - tree_margin(now + 1) + tree_margin(now);
        self.blocks -= 1;
        Some(d)
    }
    fn take_file(&mut self, ino: Ino) -> Vec<(u32, DelayedBlock)> {
        let m = self.files.remove(&ino).unwrap_or_default();
        self.margins -= tree_margin(m.len() as u64);
        self.blocks -= m.len() as u64;
        m.into_iter().collect()
    }
    fn inodes(&self) -> Vec<Ino> {
        self.files.keys().copied().collect()
    }
    /// Whether `block` is a delayed number.
    pub fn is_delayed(block: u64) -> bool {
        block >= DELAYED_BASE
    }
}

impl Core {
    /// Whether the blocks of a write into a hole of `ino` are delayed.
    pub(crate) fn delays_allocation(&self) -> bool {
        self.delalloc_on && !self.read_only
    }

    /// Delay `n` blocks of `ino` from logical block `lblk` on (a hole),
    /// when the space for them can be promised: their first delayed
    /// number, or `None` (allocate them now).
    pub(crate) fn try_delay(&mut self, ino: Ino, lblk: u64, n: u32) -> Result<Option<u64>> {
        if !self.delays_allocation() || lblk + u64::from(n) > u64::from(u32::MAX) {
            return Ok(None);
        }
        let (free, _) = self.free_totals()?;
        let reserve = if self.use_reserve {
            0
        } else {
            self.sbi.r_blocks_count
        };
        let want = self.delayed.promise_of(ino, u64::from(n));
        if free.saturating_sub(reserve + self.spoken_for()) < want {
            return Ok(None);
        }
        let first = DELAYED_BASE + self.delayed.next;
        self.delayed.next += u64::from(n);
        let stream = self.handle.stream;
        for k in 0..n {
            let l = (lblk + u64::from(k)) as u32;
            self.delayed.insert(
                ino,
                l,
                DelayedBlock {
                    virt: first + u64::from(k),
                    stream,
                },
            );
            self.note_delayed(ino, l);
        }
        Ok(Some(first))
    }

    /// A delayed block was written again by the current handle: it is
    /// now the handle's stream's.
    pub(crate) fn rewrite_delayed(&mut self, ino: Ino, lblk: u32) {
        let stream = self.handle.stream;
        if let Some(m) = self.delayed.files.get_mut(&ino) {
            if let Some(d) = m.get_mut(&lblk) {
                d.stream = stream;
            }
        }
    }

    /// Free blocks that ordinary allocations must leave alone: those
    /// promised to delayed blocks (and, while any are, what the protocol
    /// holds back), unless the allocation is a settling.
    pub(crate) fn promised_blocks(&self) -> u64 {
        if self.settling || self.delayed.is_empty() {
            // Nothing promised: other protocols' (and a settling's) room
            // is as it was before delayed allocation.
            0
        } else {
            self.spoken_for()
        }
    }

    /// Free blocks already spoken for: promised to the delayed blocks, and
    /// held back by the protocol (frees it has not committed yet).
    fn spoken_for(&self) -> u64 {
        self.delayed.promised() + self.proto.held_back_blocks()
    }

    /// Give every delayed block its place (inside a handle).
    pub(crate) fn settle_all(&mut self) -> Result<()> {
        for ino in self.delayed.inodes() {
            self.settle_inode(ino)?;
        }
        Ok(())
    }

    /// Give the delayed blocks of `ino` their places (inside a handle):
    /// each run of consecutive logical blocks written by one stream is
    /// allocated, mapped and reported as that stream's. On an error the
    /// blocks not yet placed stay delayed.
    pub(crate) fn settle_inode(&mut self, ino: Ino) -> Result<()> {
        assert!(self.in_handle, "settling outside a handle");
        let blocks = self.delayed.take_file(ino);
        if blocks.is_empty() {
            return Ok(());
        }
        self.delayed.settles += 1;
        self.touch_inode(ino);
        let saved = self.handle.stream;
        // The places were promised when the blocks were delayed, root's
        // reserve included for a writer with the right: whoever's handle
        // places them may use it.
        let was_settling = std::mem::replace(&mut self.settling, true);
        let had_reserve = std::mem::replace(&mut self.use_reserve, true);
        let mut placed = 0usize;
        let r = self.place(ino, &blocks, &mut placed, saved);
        self.use_reserve = had_reserve;
        self.settling = was_settling;
        self.handle.stream = saved;
        for &(l, d) in &blocks[placed..] {
            self.delayed.insert(ino, l, d);
        }
        r
    }

    fn place(
        &mut self,
        ino: Ino,
        blocks: &[(u32, DelayedBlock)],
        placed: &mut usize,
        saved: u32,
    ) -> Result<()> {
        let generation = self.read_inode(ino)?.generation;
        while *placed < blocks.len() {
            let (l0, d0) = blocks[*placed];
            let mut run = 1usize;
            while *placed + run < blocks.len()
                && run < crate::layout::ext::MAX_INIT_LEN as usize
                && blocks[*placed + run].0 == l0 + run as u32
                && blocks[*placed + run].1.stream == d0.stream
            {
                run += 1;
            }
            // Each run's changes, their checksums included, are the
            // writing stream's: what is pending is sealed as the handle's
            // before, and the run's as the writer's after.
            self.handle.stream = saved;
            self.seal();
            self.handle.stream = d0.stream;
            let goal = match l0
                .checked_sub(1)
                .map(|prev| extent::lookup(&mut self.tree(ino)?, prev))
                .transpose()?
                .flatten()
            {
                Some(m) if m.lblk < l0 => m.pblk + u64::from(l0 - m.lblk),
                _ => self.inode_goal(ino),
            };
            let (p, n) = self.alloc_blocks(goal, run as u32)?;
            let r = self
                .tree(ino)
                .and_then(|mut t| extent::insert(&mut t, l0, p, n, false))
                .and_then(|()| self.add_iblocks(ino, i64::from(n)));
            if let Err(e) = r {
                // The run stays delayed; its blocks go back.
                let _ = self.free_blocks(p, u64::from(n));
                return Err(e);
            }
            for k in 0..n {
                let (l, d) = blocks[*placed + k as usize];
                let pblk = p + u64::from(k);
                self.cache.rename(d.virt, pblk);
                self.note_settled(ino, l, d, pblk);
                self.proto.on_data_write(
                    &DataWrite {
                        ino,
                        lblk: l,
                        pblk,
                        generation,
                        fresh: true,
                    },
                    &self.handle,
                );
            }
            *placed += n as usize;
            self.delayed.settled_blocks += u64::from(n);
            self.seal();
        }
        self.handle.stream = saved;
        Ok(())
    }

    /// Drop the delayed blocks of `ino` (a file being freed by a handle
    /// that cannot roll back): nothing was allocated for them.
    pub(crate) fn drop_delayed(&mut self, ino: Ino) {
        for (_, d) in self.delayed.take_file(ino) {
            self.cache.forget(d.virt);
        }
    }

    /// Undo of [`Core::try_delay`] (a rollback).
    pub(crate) fn undo_delayed(&mut self, ino: Ino, lblk: u32) {
        if let Some(d) = self.delayed.remove(ino, lblk) {
            self.cache.forget(d.virt);
        }
    }

    /// Undo of a settling (a rollback): the block is delayed again.
    pub(crate) fn undo_settled(&mut self, ino: Ino, lblk: u32, d: DelayedBlock, pblk: u64) {
        if self.cache.contains(pblk) {
            self.cache.rename(pblk, d.virt);
        }
        self.delayed.insert(ino, lblk, d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The promise walked the old way: every file's blocks and margin.
    fn promised_by_walk(d: &Delayed) -> u64 {
        d.files
            .values()
            .map(|m| m.len() as u64 + TREE_MARGIN_FILE + m.len() as u64 / TREE_MARGIN_PER)
            .sum()
    }

    #[test]
    fn the_kept_promise_follows_every_insert_remove_and_take() {
        let mut d = Delayed::default();
        let block = |virt| DelayedBlock { virt, stream: 0 };
        assert_eq!(d.promised(), 0);
        // Files crossing a margin step (64 blocks) both ways.
        for ino in 12..20u32 {
            for l in 0..(ino - 11) * 40 {
                assert_eq!(
                    d.promise_of(ino, 1),
                    {
                        let mut after = Delayed {
                            files: d.files.clone(),
                            ..Delayed::default()
                        };
                        after.files.entry(ino).or_default().insert(l, block(0));
                        promised_by_walk(&after) - promised_by_walk(&d)
                    },
                    "the promise of one more block of {ino}"
                );
                d.insert(ino, l, block(u64::from(l)));
                assert_eq!(d.promised(), promised_by_walk(&d));
            }
        }
        for l in (0..80).step_by(3) {
            assert!(d.remove(13, l).is_some());
            assert_eq!(d.promised(), promised_by_walk(&d));
        }
        assert!(d.remove(13, 0).is_none(), "removed twice");
        for l in 0..40 {
            d.remove(12, l);
        }
        assert_eq!(d.blocks_of(12), 0);
        assert_eq!(d.promised(), promised_by_walk(&d));
        let taken = d.take_file(19);
        assert_eq!(taken.len(), 320);
        assert_eq!(d.promised(), promised_by_walk(&d));
        for ino in d.inodes() {
            d.take_file(ino);
        }
        assert!(d.is_empty());
        assert_eq!((d.promised(), d.blocks(), d.margins), (0, 0, 0));
    }
}
