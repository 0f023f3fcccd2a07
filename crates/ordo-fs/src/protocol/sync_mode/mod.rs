//! `sync`: synchronous, ordered metadata writes — Ganger and Patt's
//! "Conventional" scheme, the way FFS and ext2 with `-o sync` keep their
//! metadata safe without a journal.
//!
//! The three rules
//! ---------------
//! Ganger and Patt (OSDI '94, §1) name the three ordering rules that keep an
//! in-place file system recoverable by a *benign* repair (bitmaps and
//! counters recomputed, leaked inodes freed, link counts that are too high
//! lowered) after any crash:
//!
//! 1. never point to a structure before it has been initialized: a fresh
//!    data block, a new extent-tree block, a new directory block and an
//!    initialized inode reach the disk before the pointer or entry naming
//!    them;
//! 2. never reuse a resource before nullifying every previous pointer to it:
//!    a directory entry is removed on disk before its inode is cleared and
//!    freed, an extent is cleared on disk before its blocks are freed in the
//!    bitmap, and a freed block is not allocated again until that clearing
//!    is durable (`can_allocate` says no meanwhile);
//! 3. never reset the last pointer to a live resource before the new one is
//!    set: on rename the new entry is written before the old one is
//!    removed, a link count is raised on disk before a new entry counts in it
//!    and lowered only after an entry was removed.
//!
//! How the order is derived
//! ------------------------
//! The core does not tell this protocol *when* to write; it reports what
//! each change means (`UpdateKind`), and the order follows from that. When
//! a handle (one system call) ends, its updates become the nodes of a graph
//! with an edge `a -> b` whenever a rule says `a` must be durable before `b`:
//!
//! - fresh data of block `p`, `DirBlockInit`/`ExtentBlockInit` of `p`, and
//!   the bitmap bit allocating `p` -> every `Extent { op: Set }` covering `p`;
//! - `Inode { field: Whole }` initializing inode `x`, a raised `Links` of
//!   `x`, and the bitmap bit allocating `x` -> every `Dirent { op: Add }`
//!   naming `x`; a move of a group's unused-inode mark (`ItableUnused`,
//!   below which e2fsck considers inodes initialized at all) -> every
//!   `Dirent { op: Add }`;
//! - a raised `Links` of directory `d` -> every later `Dirent { op: Add }`
//!   inside `d` (the count covers a new subdirectory's `..` before its
//!   entry exists);
//! - `Dirent { op: Add }` of `x` -> `Dirent { op: Remove }` of `x` (rename);
//!   `Dirent { op: Add }` of `x` -> the retargeting of `x`'s own `..` (a
//!   moved directory's `..` names its new parent only once the new entry
//!   is durable); an entry added inside directory `x` (that new `..`) ->
//!   the removal of `x`'s old entry. So a crash in a cross-directory
//!   rename of a directory leaves it with one name or with two names, one
//!   of them in the parent `..` names: the benign repair removes the
//!   other (rule 3 makes the second name unavoidable, as in FFS);
//! - `Dirent { op: Remove }` of `x` -> a lowered `Links` of `x`, the
//!   clearing of inode `x`, and the bitmap bit freeing `x`; a removal
//!   inside directory `d` -> a later lowered `Links` of `d` (rmdir, a
//!   directory moved out) and a later removal of `d`'s own entry;
//! - `Extent { op: Clear }` covering `p` -> the bitmap bit freeing `p`;
//! - a raised `BlockCount` (`i_blocks`) of `x` -> every `Extent { op: Set }`
//!   of `x` (a mapping, or the index entry of a new tree block, is counted
//!   before it exists); `Extent { op: Clear }` of `x` -> a lowered
//!   `BlockCount` of `x`. A crash in between leaves `i_blocks` too high,
//!   which the benign repair lowers; never too low;
//! - a raised `Size` of `x` -> every mapping `Set` of `x`, and a mapping
//!   `Clear` of `x` -> a lowered `Size` of `x`: a crash leaves at most a hole
//!   at the end of the file, never a mapped block past `i_size`;
//! - a tree switch (`ExtentTree`, COLLAPSE_RANGE and INSERT_RANGE) is a
//!   pointer to every block it names and the clearing of every block it
//!   drops: fresh tree blocks, their bitmap bits, a raised `i_blocks` and
//!   a raised `i_size` -> the switch -> the freeing bitmap bits, a lowered
//!   `i_size` and `i_blocks`, also when these share the inode's block;
//! - an index key and its child's first key: when the child's leading
//!   mappings were cleared (the key rises), every mapping update of that
//!   child -> the index entry; when a mapping is inserted in front (the key
//!   falls), the index entry -> that mapping. Either way the key is only
//!   ever below the child's first key, a gap that reads as a hole and that
//!   the benign repair closes.
//!
//! Updates of one block that overlap keep their program order. The graph
//! is then released in program order (Kahn's algorithm, smallest update
//! first); releasing an update whose predecessor is not yet on disk first
//! writes the predecessor's block, synchronously (FUA), with exactly the
//! updates released so far. A block can thus be written more than once in
//! one handle, which is what FFS does too (the inode block of a new
//! directory's parent, for instance): the intermediate image is the block
//! before the handle plus the released updates, with its checksums
//! recomputed by the core's [`Sealer`]. When nothing is left, the remaining
//! blocks are written with their final cached image, also FUA, one after
//! another. Fresh data blocks go first, as plain writes followed by one
//! cache flush, so that they are durable before any metadata names them.
//!
//! A cycle among blocks (the two entries of a cross-directory
//! `RENAME_EXCHANGE`, which no sequence of two in-place writes can order
//! safely) is broken by releasing its oldest update anyway; the `cycles`
//! statistic counts these.
//!
//! Only updates with pointer meaning are written synchronously: inode
//! initialization and release, link counts, sizes, block maps and index
//! flags, directory entries, new directory and extent blocks. The rest are
//! FFS's *delayed writes*: allocation bitmaps and group counters (the benign
//! repair recomputes them; reuse is still held back by `can_allocate` until
//! the pointer clearing is durable), times, mode and owner, the orphan list
//! (losing it only leaks an inode). A block holding only such updates stays
//! dirty until the next write-back, `fsync`, `sync` or unmount. Data
//! overwritten in place is not ordered either (it was never a pointer).
//! Mount and unmount bookkeeping (`OpKind::Internal`) is written whole.
//!
//! Recovery: nothing to replay. After a crash the image needs only the
//! benign repair described in `docs/DESIGN.md`.

use std::collections::{BTreeMap, HashSet};

use super::*;
use crate::update::{CounterKind, InodeField, UpdateKind};

pub(crate) mod release;

/// What one handle reported, as `sync` and the protocols built on its
/// release order collect it, and the freed blocks not to allocate again
/// yet.
#[derive(Default)]
pub(crate) struct HandleLog {
    /// The current handle's metadata updates, in program order.
    pub updates: Vec<Update>,
    /// The current handle's freshly allocated data blocks.
    pub fresh: Vec<u64>,
    /// Blocks freed by the current handle.
    pub freed_now: Vec<u64>,
    /// Freed blocks not to be allocated again yet.
    pub not_reusable: HashSet<u64>,
}

impl HandleLog {
    pub fn on_update(&mut self, u: &Update) {
        self.updates.push(u.clone());
    }
    pub fn on_data_write(&mut self, w: &DataWrite) {
        if w.fresh {
            self.fresh.push(w.pblk);
        }
    }
    pub fn on_block_freed(&mut self, block: u64) {
        self.freed_now.push(block);
        self.not_reusable.insert(block);
    }
    pub fn can_allocate(&self, block: u64) -> bool {
        !self.not_reusable.contains(&block)
    }
    /// Allocated and given back by one handle: nothing on disk names it,
    /// and its data need not be written.
    pub fn on_block_unallocated(&mut self, block: u64) {
        self.fresh.retain(|&b| b != block);
    }
    pub fn has_pending_frees(&self) -> bool {
        !self.not_reusable.is_empty()
    }
    /// The handle's updates, its fresh blocks (ascending, still dirty) and
    /// the blocks it freed; the log is empty for the next handle.
    pub fn take(&mut self, io: &Io) -> (Vec<Update>, Vec<u64>, Vec<u64>) {
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.sort_unstable();
        fresh.dedup();
        fresh.retain(|&b| io.is_dirty(b));
        (
            std::mem::take(&mut self.updates),
            fresh,
            std::mem::take(&mut self.freed_now),
        )
    }
}

/// `mode=sync`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "sync",
    summary: "synchronous, ordered metadata writes (Ganger & Patt's Conventional)",
    variants: &[],
    mkfs_features: "",
    caps: Capabilities {
        after_crash: AfterCrash::ConsistentAfterRepair,
        ..Capabilities::NONE
    },
    recover: recover_nothing,
    build,
};

fn build(_recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(SyncProtocol::new(env)))
}

/// The `sync` protocol.
pub struct SyncProtocol {
    log: HandleLog,
    /// Freed blocks whose clearing is not durable yet, by plan tag.
    freed_pending: BTreeMap<u64, Vec<u64>>,
    next_tag: u64,
    stats_handles: u64,
    stats_fua: u64,
    stats_rewrites: u64,
    stats_cycles: u64,
}

impl SyncProtocol {
    /// A new instance for one mount.
    pub fn new(_env: &ProtocolEnv) -> Self {
        SyncProtocol {
            log: HandleLog::default(),
            freed_pending: BTreeMap::new(),
            next_tag: 1,
            stats_handles: 0,
            stats_fua: 0,
            stats_rewrites: 0,
            stats_cycles: 0,
        }
    }

    /// Send every dirty block home (the delayed writes), then flush if
    /// asked; under memory pressure (`pressure`) not those an earlier plan
    /// already sends.
    fn write_dirty(&mut self, io: &mut Io, flush: bool, pressure: bool) {
        let dirty = io.dirty_to_send(pressure);
        io.write_home_runs(&dirty, false, super::MAX_RUN_BLOCKS);
        if flush {
            io.flush();
        }
    }
}

/// Whether an update carries pointer meaning, so that its block must be
/// written synchronously, in order. Everything else (allocation bitmaps and
/// counters, which the benign repair recomputes; times, mode, owner; the
/// orphan list, whose loss only leaks an inode) is a delayed write, as in
/// FFS, written by the next write-back, fsync or sync.
pub(crate) fn is_ordered(u: &Update, tree_blocks: &rustc_hash::FxHashSet<u64>) -> bool {
    match &u.kind {
        UpdateKind::Inode { field, .. } => matches!(
            field,
            InodeField::Whole
                | InodeField::Links
                | InodeField::Size
                | InodeField::Blocks
                | InodeField::BlockCount
                | InodeField::Flags
                | InodeField::Dtime
        ),
        UpdateKind::Extent { .. }
        | UpdateKind::ExtentTree { .. }
        | UpdateKind::ExtentBlockInit { .. }
        | UpdateKind::Dirent { .. }
        | UpdateKind::DirBlockInit { .. }
        // Attribute blocks are pointed at and shared: initialized before
        // the pointer, counted before they are shared, freed after.
        | UpdateKind::XattrBlockInit { .. }
        | UpdateKind::XattrRef { .. }
        | UpdateKind::XattrRefcount { .. } => true,
        // An attribute's value is not a pointer; a new inode's inherited
        // ACLs are part of its initialization and go with it.
        UpdateKind::Xattr { .. } => true,
        UpdateKind::Other => tree_blocks.contains(&u.block),
        // The unused-inode mark decides whether e2fsck sees an inode as
        // initialized at all.
        UpdateKind::Counter {
            what: CounterKind::ItableUnused,
            ..
        } => true,
        UpdateKind::Bitmap { .. } | UpdateKind::Counter { .. } | UpdateKind::Checksum => false,
    }
}

impl Protocol for SyncProtocol {
    fn name(&self) -> &'static str {
        "sync"
    }

    fn on_update(&mut self, u: &Update, _h: &HandleInfo) {
        self.log.on_update(u);
    }

    fn on_data_write(&mut self, w: &DataWrite, _h: &HandleInfo) {
        self.log.on_data_write(w);
    }

    fn on_block_freed(&mut self, block: u64, _h: &HandleInfo) {
        self.log.on_block_freed(block);
    }

    fn can_allocate(&self, block: u64) -> bool {
        self.log.can_allocate(block)
    }

    fn on_block_unallocated(&mut self, block: u64, _h: &HandleInfo) {
        self.log.on_block_unallocated(block);
    }

    fn has_pending_frees(&self) -> bool {
        self.log.has_pending_frees()
    }

    fn on_handle_end(&mut self, h: &HandleInfo, io: &mut Io) -> Result<()> {
        let (ups, fresh, freed) = self.log.take(io);
        self.stats_handles += 1;
        let tag = self.next_tag;
        self.next_tag += 1;
        io.set_tag(tag);

        // Fresh data first: plain writes and one flush.
        let any_data = !fresh.is_empty();
        io.write_home_runs(&fresh, false, super::MAX_RUN_BLOCKS);
        if any_data {
            io.flush();
        }

        // Metadata, in an order that keeps the three rules: each write FUA,
        // one after another.
        let everything = h.op == crate::update::OpKind::Internal;
        let order = release::release(&[], &ups, everything, io);
        self.stats_cycles += order.cycles;
        self.stats_rewrites += order.intermediate;
        for w in order.writes {
            match w.image {
                None => io.write_home(w.block, true),
                Some(img) => {
                    let class = io.class_of(w.block);
                    io.write_raw(w.block, Arc::new(img), WriteFlags::fua(class));
                }
            }
            self.stats_fua += 1;
        }
        if !freed.is_empty() {
            if io.plan().is_empty() {
                for b in freed {
                    self.log.not_reusable.remove(&b);
                }
            } else {
                self.freed_pending.entry(tag).or_default().extend(freed);
            }
        }
        Ok(())
    }

    fn plan_done(&mut self, done: &PlanDone) {
        let (tag, ok) = (done.tag, done.ok);
        if !ok {
            return;
        }
        // Plans run in order: everything up to this tag is durable.
        let done: Vec<u64> = self.freed_pending.range(..=tag).map(|(&t, _)| t).collect();
        for t in done {
            if let Some(v) = self.freed_pending.remove(&t) {
                for b in v {
                    self.log.not_reusable.remove(&b);
                }
            }
        }
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.write_dirty(io, true, false);
        Ok(())
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.write_dirty(io, true, false);
        Ok(())
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.write_dirty(
            io,
            reason == WriteBackReason::Unmount,
            reason == WriteBackReason::Pressure,
        );
        Ok(())
    }

    fn stats(&self) -> Vec<(String, u64)> {
        vec![
            ("handles".into(), self.stats_handles),
            ("fua_writes".into(), self.stats_fua),
            ("intermediate_writes".into(), self.stats_rewrites),
            ("cycles".into(), self.stats_cycles),
        ]
    }
}
