//! `softdep`: soft updates (Ganger and Patt, OSDI '94, §4; McKusick and
//! Ganger, USENIX '99) on ext4's structures.
//!
//! Metadata writes are delayed, as under `async` (No Order): a system call
//! changes cached blocks and returns, and a syncer writes dirty blocks
//! later, in any order. What keeps the image recoverable by the benign
//! repair after any crash is that the protocol tracks, for every metadata
//! *update* not yet durable (not for every block), which other updates must
//! be durable before it, and writes each block image with the updates whose
//! predecessors are not durable yet **rolled back**: the image that leaves
//! the cache holds only what may safely be on disk, while the cached block
//! keeps every update (it is rolled forward at once, since the rolled-back
//! copy is a separate image) and stays dirty until a later write carries
//! the rest.
//!
//! The dependencies
//! ----------------
//! They are Ganger and Patt's three rules, the same ones `sync` enforces
//! by writing synchronously: [`super::ordering::build_graph`] turns the
//! sequence of pending updates, across every handle since they were made,
//! into a graph with an edge `a -> b` whenever `a` must be durable before
//! `b` (initialized inode, directory block, extent block and set bitmap bit
//! before the pointer or entry naming them; an entry's removal before the
//! link count drops, the inode is cleared and its bitmap bit freed; an
//! extent's clearing before its blocks are freed; the new entry of a rename
//! before the old one goes; `i_size`/`i_blocks` raised before a mapping
//! and lowered after; unused-inode mark before the entry). Two edges are
//! added here because they span handles, which `sync` never needs: a
//! freshly allocated data block's contents before any mapping of it
//! (*allocation initialization*, always on), and the removal of an inode's
//! last entry before the inode is initialized again for a new file.
//!
//! FreeBSD keeps these as typed structures hung off buffers (`inodedep`,
//! `pagedep` with `diradd`/`dirrem`, `bmsafemap`, `allocdirect`,
//! `indirdep`, `freeblks`, `mkdir`): the graph over `Update`s is the same
//! information, rebuilt when blocks are written. An update whose bytes
//! overlap an earlier pending update of the same block depends on it
//! (program order), so rolling back always undoes a suffix of each byte's
//! history and restores bytes that were on disk or in an earlier image.
//!
//! Writing a block
//! ---------------
//! An update is *ready* once every predecessor is durable or is ready in
//! the same block (one block write is atomic). The image of a block is its
//! cached image with the pending updates that are not ready undone, in
//! reverse program order, and its checksums recomputed by the core's
//! [`Sealer`]: a pending directory entry is written as it was before (a
//! new entry as unused space, a removed one still there), a pending inode
//! initialization as the free slot, a mapping not yet backed by written
//! data as absent, a bitmap bit freed before the pointer to it is cleared
//! as still set. This is done when the write is issued (FreeBSD's
//! `softdep_disk_io_initiation`), which in ordo is when the plan is made:
//! a plan may carry several rounds (below), each with its own images.
//!
//! Deferred work
//! -------------
//! Frees and link-count decrements are updates with predecessors like any
//! other: the bitmap bit freeing a block stays set on disk until the
//! extent that named the block is cleared durably, an inode's clearing
//! and its bitmap bit wait for the removal of its last entry, a lowered
//! link count waits for the entry removed. A freed block is not allocated
//! again (`can_allocate`) until no pending update clears a pointer to it,
//! none of its own updates is pending, and its fresh contents (if any) are
//! no longer awaited; a freed block that still carries pending updates
//! (an emptied directory's block, whose entries' removals other updates
//! wait for) stays cached and is written like any dirty block
//! ([`Protocol::keeps_freed_block`]). An entry added and removed before any
//! write cancels out: both are undone or both are applied, and the block
//! image equals what is on disk.
//!
//! Rounds and durability
//! ---------------------
//! A *round* writes every dirty block that has something new to write
//! (plain dirty blocks, ready updates not written before), then flushes the
//! device's cache: after the flush the round's updates are durable, which
//! may make others ready. The syncer (`write_back(Timer)`) runs one round;
//! `sync`, `fsync`, memory pressure and unmount run rounds until nothing
//! is pending, all in one plan (the flush between rounds orders them).
//! Updates are known durable when the plan that carried them is done
//! (`plan_done`), which is when their dependents become ready outside the
//! plan. `fsync` of any file makes everything durable, which includes the
//! file's name chain (FreeBSD's `softdep_fsync`).
//!
//! A cycle among pending updates (a cross-directory `RENAME_EXCHANGE`, as
//! for `sync`) leaves a round with nothing to write while updates are
//! pending; its oldest held update is then released anyway, with every
//! update of its block it depends on (so that the image is one the block
//! had, never half of a node write), and the `cycles` statistic counts it.
//! Nothing else may make a cycle (`tests/softdep_cycles.rs`).
//!
//! Recovery: nothing to replay. After a crash the image needs only the
//! benign repair of `docs/DESIGN.md` (leaked blocks and inodes, link counts
//! too high, free counts, bitmap checksums).
//!
//! Faults for the crash explorer's own test: `ORDO_FAULT=softdep_no_rollback`
//! writes cached images whole (every update ready), and
//! `ORDO_FAULT=softdep_eager_frees` lets frees, link-count decrements and
//! inode clearing go out before the pointer is nullified and lets freed
//! blocks be reused at once. Both must be caught.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::ordering::{self, build_graph, u16_of};
use super::*;
use crate::update::{BitmapKind, InodeField, LinkOp, MapOp, UpdateKind};

/// `mode=softdep`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "softdep",
    summary: "soft updates: delayed writes, per-update dependencies, rollback (Ganger & Patt)",
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
    Ok(Box::new(SoftdepProtocol::new(env)))
}

/// A deliberately broken variant, for the crash explorer's tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// Write cached images whole: no rollback.
    NoRollback,
    /// Frees, link-count decrements and inode clearing are not deferred,
    /// and freed blocks are reusable at once.
    EagerFrees,
}

/// One update not yet known durable.
struct Pend {
    id: u64,
    /// The handle that made it.
    handle: u64,
    u: Update,
    /// Carried by an image already issued (in a plan not yet done): it is
    /// on its way to the disk and is never rolled back again.
    written: bool,
    /// Released to break a cycle.
    forced: bool,
}

/// The `softdep` protocol.
pub struct SoftdepProtocol {
    /// Pending updates, in program order.
    pending: Vec<Pend>,
    /// Pending updates per block.
    per_block: HashMap<u64, u32>,
    next_id: u64,
    /// Freshly allocated data blocks whose contents are not durable yet.
    fresh: BTreeSet<u64>,
    /// Freed blocks not reusable yet.
    freed: BTreeSet<u64>,
    /// What each plan in flight carries: update ids and fresh data blocks.
    inflight: BTreeMap<u64, (Vec<u64>, Vec<u64>)>,
    next_tag: u64,
    /// Blocks the last periodic write-back left dirty rather than write
    /// rolled back; the next one writes them whatever they hold.
    held_back: HashSet<u64>,
    fault: Fault,
    stats_rounds: u64,
    stats_writes: u64,
    stats_rolled_back: u64,
    stats_cycles: u64,
    stats_cancelled: u64,
}

impl SoftdepProtocol {
    /// A new instance for one mount.
    pub fn new(_env: &ProtocolEnv) -> Self {
        let fault = match std::env::var("ORDO_FAULT").ok().as_deref() {
            Some("softdep_no_rollback") => Fault::NoRollback,
            Some("softdep_eager_frees") => Fault::EagerFrees,
            _ => Fault::None,
        };
        SoftdepProtocol {
            pending: Vec::new(),
            per_block: HashMap::default(),
            next_id: 1,
            fresh: BTreeSet::new(),
            freed: BTreeSet::new(),
            inflight: BTreeMap::new(),
            next_tag: 1,
            held_back: HashSet::default(),
            fault,
            stats_rounds: 0,
            stats_writes: 0,
            stats_rolled_back: 0,
            stats_cycles: 0,
            stats_cancelled: 0,
        }
    }

    fn drop_pending(&mut self, keep: impl Fn(&Pend) -> bool) {
        let mut per_block = std::mem::take(&mut self.per_block);
        self.pending.retain(|p| {
            let k = keep(p);
            if !k {
                if let Some(c) = per_block.get_mut(&p.u.block) {
                    *c -= 1;
                    if *c == 0 {
                        per_block.remove(&p.u.block);
                    }
                }
            }
            k
        });
        self.per_block = per_block;
    }

    /// Whether an update is deferred work (a free, a link-count decrement,
    /// an inode's clearing): what `softdep_eager_frees` lets go early.
    fn is_deferred_work(u: &Update) -> bool {
        match &u.kind {
            UpdateKind::Bitmap { set: false, .. } => true,
            UpdateKind::XattrRefcount { delta, .. } => *delta < 0,
            UpdateKind::Inode {
                field: InodeField::Links,
                ..
            } => u16_of(&u.new) < u16_of(&u.old),
            UpdateKind::Inode {
                field: InodeField::Whole,
                ..
            } => u.new.iter().all(|&b| b == 0),
            UpdateKind::Inode {
                field: InodeField::Dtime,
                ..
            } => u.new.iter().any(|&b| b != 0),
            _ => false,
        }
    }

    /// Freed blocks that may be reused now: no pending update clears a
    /// pointer to them or lies in them, and their fresh contents are not
    /// awaited.
    fn release_freed(&mut self) {
        if self.freed.is_empty() {
            return;
        }
        let mut clears: Vec<(u64, u64)> = Vec::new();
        for p in &self.pending {
            for (_, start, end, op) in p.u.kind.pointers() {
                if op == MapOp::Clear {
                    clears.push((start, end));
                }
            }
        }
        let covered = |b: u64| clears.iter().any(|&(s, e)| s <= b && b < e);
        let keep: BTreeSet<u64> = self
            .freed
            .iter()
            .copied()
            .filter(|&b| self.fresh.contains(&b) || self.per_block.contains_key(&b) || covered(b))
            .collect();
        self.freed = keep;
    }

    /// Write rounds: one (`full == false`, the syncer) or until nothing is
    /// pending (`sync`, `fsync`, pressure, unmount). Every round that
    /// writes ends with a flush.
    fn write_rounds(&mut self, io: &mut Io, full: bool) {
        let tag = self.next_tag;
        self.next_tag += 1;
        io.set_tag(tag);
        let mut carried: Vec<u64> = Vec::new();
        let mut carried_fresh: Vec<u64> = Vec::new();
        // Durable once this plan's flushes ran (valid inside the plan only).
        let mut sim_durable: HashSet<u64> = HashSet::default();
        let mut sim_fresh: BTreeSet<u64> = self.fresh.clone();
        // Plain dirty blocks (no pending update) already written by this plan.
        let mut plain_done: HashSet<u64> = HashSet::default();
        if full {
            self.held_back.clear();
        }
        loop {
            let live: Vec<usize> = (0..self.pending.len())
                .filter(|&k| !sim_durable.contains(&self.pending[k].id))
                .collect();
            let ups: Vec<&Update> = live.iter().map(|&k| &self.pending[k].u).collect();
            let (ready, preds) = self.ready_set(io, &live, &ups, &sim_fresh);
            let blocks: Vec<u64> = ups.iter().map(|u| u.block).collect();

            let mut by_block: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
            for (i, u) in ups.iter().enumerate() {
                by_block.entry(u.block).or_default().push(i);
            }
            let mut wrote = false;
            let mut included: Vec<usize> = Vec::new();
            let dirty = io.dirty_blocks();
            let mut plain: Vec<u64> = Vec::new();
            let new_ready = |members: &Vec<usize>| {
                members
                    .iter()
                    .any(|&i| ready[i] && !self.pending[live[i]].written)
            };
            let mut whole: Vec<u64> = Vec::new();
            let mut rolled: Vec<(u64, Option<Arc<Vec<u8>>>)> = Vec::new();
            for b in dirty {
                match by_block.get(&b) {
                    None => {
                        if plain_done.insert(b) {
                            plain.push(b);
                        }
                    }
                    Some(members) => {
                        if !new_ready(members) {
                            continue;
                        }
                        let held: Vec<usize> =
                            members.iter().copied().filter(|&i| !ready[i]).collect();
                        // The periodic write-back leaves a block that needs a
                        // rollback for the next tick, once: this tick's
                        // writes usually make its held updates ready, and it
                        // then goes out whole, once, rather than rolled back
                        // now and again later (SVR4's syncer, too, writes a
                        // block on the pass after the one that found it
                        // dirty). Its age stays bounded by two ticks.
                        if !full && !held.is_empty() && self.held_back.insert(b) {
                            continue;
                        }
                        self.held_back.remove(&b);
                        if held.is_empty() {
                            // Written with the plain blocks below, in runs.
                            whole.push(b);
                        } else if let Some(cur) = io.snapshot(b) {
                            let mut img = cur.to_vec();
                            for &i in held.iter().rev() {
                                undo(&mut img, ups[i]);
                            }
                            io.reseal(b, &mut img);
                            // Written in the round's runs below, beside
                            // its neighbours, but neither pinned nor made
                            // clean: its held updates are still to go.
                            rolled.push((b, Some(Arc::new(img))));
                            self.stats_rolled_back += 1;
                        } else {
                            continue;
                        }
                        self.stats_writes += 1;
                        wrote = true;
                        included.extend(
                            members
                                .iter()
                                .copied()
                                .filter(|&i| ready[i] && !self.pending[live[i]].written),
                        );
                    }
                }
            }
            if !plain.is_empty() || !whole.is_empty() || !rolled.is_empty() {
                self.stats_writes += plain.len() as u64;
                // One pass in block order, adjacent blocks of a class in one
                // request, rolled-back images included: every write of a
                // round is independent of the others (they all wait for the
                // round's flush).
                let mut runs: Vec<(u64, Option<Arc<Vec<u8>>>)> =
                    plain.iter().chain(&whole).map(|&b| (b, None)).collect();
                runs.append(&mut rolled);
                runs.sort_unstable_by_key(|r| r.0);
                io.write_runs(&runs, false, super::MAX_RUN_BLOCKS);
                for &b in &plain {
                    if sim_fresh.remove(&b) {
                        carried_fresh.push(b);
                    }
                }
                wrote = true;
            }
            for &i in &included {
                let p = &mut self.pending[live[i]];
                p.written = true;
                carried.push(p.id);
            }
            if wrote {
                io.flush();
                self.stats_rounds += 1;
            }
            if !full {
                break;
            }
            // After this round's flush (and the earlier plans' writes, which
            // run first), everything written is durable, and so is every
            // fresh block no longer dirty.
            let mut any_left = false;
            for &k in &live {
                let p = &self.pending[k];
                if p.written {
                    sim_durable.insert(p.id);
                } else {
                    any_left = true;
                }
            }
            sim_fresh.retain(|&b| io.is_dirty(b) && !plain_done.contains(&b));
            if !any_left {
                break;
            }
            if !wrote {
                // Nothing could be written: a cycle. Release the oldest held
                // update, with every update of its block it needs (its
                // history before it, the other half of its node write): the
                // image is then one the block really had, not a mix.
                if let Some(first) = live.iter().position(|&k| {
                    let p = &self.pending[k];
                    !p.written && !p.forced
                }) {
                    let block = blocks[first];
                    let mut stack = vec![first];
                    let mut seen: HashSet<usize> = HashSet::default();
                    while let Some(x) = stack.pop() {
                        if seen.insert(x) {
                            stack.extend(
                                preds[x].iter().copied().filter(|&j| {
                                    blocks[j] == block && !self.pending[live[j]].written
                                }),
                            );
                        }
                    }
                    for x in seen {
                        self.pending[live[x]].forced = true;
                    }
                    self.stats_cycles += 1;
                } else {
                    break;
                }
            }
        }
        if full && io.plan().is_empty() && !self.inflight.is_empty() {
            // Earlier plans still carry updates: this one must not finish
            // before they are durable.
            io.flush();
        }
        if !carried.is_empty() || !carried_fresh.is_empty() {
            self.inflight.insert(tag, (carried, carried_fresh));
        }
    }

    /// Which live updates may be in the next image of their block, and the
    /// dependencies that decided it.
    fn ready_set(
        &self,
        io: &Io,
        live: &[usize],
        ups: &[&Update],
        sim_fresh: &BTreeSet<u64>,
    ) -> (Vec<bool>, Vec<Vec<usize>>) {
        let n = ups.len();
        let tree_blocks: HashSet<u64> = ups
            .iter()
            .map(|u| u.block)
            .filter(|&b| io.class_of(b) == BlockClass::ExtentTree)
            .collect();
        let mut g = build_graph(ups, &tree_blocks);
        // Bitmap bits are independent: two updates of one byte order each
        // other only when they change the same bit (an image undoes a held
        // bit alone, see `undo`).
        let mut last_bit: HashMap<(u64, u32, u8), usize> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            if let Some(mask) = bit_mask(u) {
                g.preds[i].retain(|&j| !(ups[j].block == u.block && bit_mask(ups[j]).is_some()));
                for bit in 0..8u8 {
                    if mask & (1 << bit) != 0 {
                        if let Some(j) = last_bit.insert((u.block, u.range.start, bit), i) {
                            g.preds[i].push(j);
                        }
                    }
                }
            }
        }
        // Across handles, an update waits only for what was done before it:
        // a later handle's update (a link count raised again, a block
        // allocated again) is no reason to hold an earlier one, and would
        // make a cycle. The edges added below that name a later update are
        // meant (a retarget's two halves, a replaced name, a directory's
        // inode and its first block).
        for (i, p) in g.preds.iter_mut().enumerate() {
            p.retain(|&j| j < i);
        }
        // Across handles: an inode is initialized again only after the
        // removal of its previous last entry is durable.
        let mut removes: HashMap<Ino, Vec<usize>> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            match &u.kind {
                // The names of one inode go in the order they were removed:
                // a directory renamed and then removed never loses its new
                // name while the old one is still on disk.
                UpdateKind::Dirent {
                    ino,
                    op: LinkOp::Remove,
                    name,
                    ..
                } if name.as_slice() != b".." => {
                    let v = removes.entry(*ino).or_default();
                    g.preds[i].extend(v.iter().copied());
                    v.push(i);
                }
                UpdateKind::Dirent {
                    ino,
                    op: LinkOp::Remove,
                    ..
                } => removes.entry(*ino).or_default().push(i),
                UpdateKind::Inode {
                    ino,
                    field: InodeField::Whole,
                } if u.new.iter().any(|&b| b != 0) => {
                    if let Some(v) = removes.get(ino) {
                        g.preds[i].extend(v.iter().copied());
                    }
                }
                // A removed inode's blocks are released (its mappings
                // cleared, its size and block count lowered) only once the
                // entry removed is durable: until then a directory keeps
                // `.` and `..` and a file its contents under the old name.
                UpdateKind::Extent {
                    ino,
                    op: MapOp::Clear,
                    ..
                } => {
                    if let Some(v) = removes.get(ino) {
                        g.preds[i].extend(v.iter().copied());
                    }
                }
                UpdateKind::Inode {
                    ino,
                    field: InodeField::Size | InodeField::BlockCount,
                } if ordering::le_of(&u.new) < ordering::le_of(&u.old) => {
                    if let Some(v) = removes.get(ino) {
                        g.preds[i].extend(v.iter().copied());
                    }
                }
                // An inode is stamped deleted only once no entry names it.
                UpdateKind::Inode {
                    ino,
                    field: InodeField::Dtime,
                } if u.new.iter().any(|&b| b != 0) => {
                    if let Some(v) = removes.get(ino) {
                        g.preds[i].extend(v.iter().copied());
                    }
                }
                UpdateKind::Bitmap {
                    what: BitmapKind::Inode,
                    index,
                    set: true,
                } => {
                    if let Some(v) = removes.get(&(*index as Ino)) {
                        g.preds[i].extend(v.iter().copied());
                    }
                }
                _ => {}
            }
        }
        // A directory's inode, its size and the mappings in its own block
        // go out together: a directory inode on disk is whole (`.` and `..`
        // in a mapped block, `i_size` covering it) or not there at all.
        // FreeBSD gets the same by rolling a new directory's inode back to
        // its last written block (`initiate_write_inodeblock`).
        let handle_of = |i: usize| self.pending[live[i]].handle;
        // Inodes initialized by each handle: a new symlink's (or any new
        // inode's) first mapping goes out with its initialization too.
        let born: HashSet<(Ino, u64)> = ups
            .iter()
            .enumerate()
            .filter_map(|(i, u)| match u.kind {
                UpdateKind::Inode {
                    ino,
                    field: InodeField::Whole,
                } if u.new.iter().any(|&b| b != 0) => Some((ino, handle_of(i))),
                _ => None,
            })
            .collect();
        let mut dir_sets: HashMap<(Ino, u64, u64), Vec<usize>> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            if let UpdateKind::Extent {
                ino,
                pblk,
                len,
                op: MapOp::Set,
                ..
            } = u.kind
            {
                if len > 0
                    && (io.class_of(pblk) == BlockClass::Directory
                        || born.contains(&(ino, handle_of(i))))
                {
                    dir_sets
                        .entry((ino, u.block, handle_of(i)))
                        .or_default()
                        .push(i);
                }
            }
        }
        if !dir_sets.is_empty() {
            for (i, u) in ups.iter().enumerate() {
                let ino = match u.kind {
                    UpdateKind::Inode {
                        ino,
                        field: InodeField::Size | InodeField::Whole,
                    } if u.new.iter().any(|&b| b != 0) => ino,
                    _ => continue,
                };
                if let Some(v) = dir_sets.get(&(ino, u.block, handle_of(i))) {
                    g.preds[i].extend(v.iter().copied());
                }
            }
        }
        // Structure: the updates of one directory or extent-tree block,
        // and those of one inode, form one history, each depending on the
        // one before. Rolling back is then always undoing a suffix of that
        // history, which yields an image the block (or the inode) really
        // had: a directory block's chain of `rec_len`s, a node's entry
        // count, an inode's type, flags and extent root never mix two
        // moments.
        let mut last_of: HashMap<(u64, Ino), usize> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            let class = io.class_of(u.block);
            let key = match u.kind {
                _ if matches!(class, BlockClass::Directory | BlockClass::ExtentTree) => {
                    (u.block, 0)
                }
                UpdateKind::Extent { ino, .. }
                | UpdateKind::ExtentBlockInit { ino }
                | UpdateKind::Xattr { ino }
                | UpdateKind::XattrBlockInit { ino }
                | UpdateKind::XattrRef { ino, .. }
                | UpdateKind::Inode { ino, .. } => (u.block, ino),
                UpdateKind::XattrRefcount { block, .. } => (block, 0),
                _ => continue,
            };
            if let Some(j) = last_of.insert(key, i) {
                g.preds[i].push(j);
            }
        }
        // `i_size` and `i_blocks` rise before a mapping is set and fall
        // after it is cleared, in the inode's own block too (the ordering
        // graph leaves same-block pairs to one synchronous write), whatever
        // order the handle made them in: a held mapping holds the size and
        // count that go with it.
        let mut moves: HashMap<Ino, Vec<(usize, bool)>> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            for field in [InodeField::Size, InodeField::BlockCount] {
                if let Some((ino, up)) = ordering::inode_field_moved(u, field) {
                    moves.entry(ino).or_default().push((i, up));
                }
            }
        }
        let mut clears_of: HashMap<Ino, Vec<usize>> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            if let UpdateKind::Extent { ino, len, op, .. } = u.kind {
                // The core may raise the size and count after it sets the
                // mapping, in the same handle: that raise counts too. A
                // moved mapping (COLLAPSE/INSERT_RANGE) is set and cleared.
                if op.sets() && len > 0 {
                    if let Some(v) = moves.get(&ino) {
                        g.preds[i].extend(
                            v.iter()
                                .filter(|&&(j, up)| up && (j < i || handle_of(j) == handle_of(i)))
                                .map(|&(j, _)| j),
                        );
                    }
                }
                if op.clears() {
                    clears_of.entry(ino).or_default().push(i);
                }
            }
        }
        for (ino, v) in &moves {
            if let Some(c) = clears_of.get(ino) {
                for &(i, up) in v {
                    if !up {
                        g.preds[i].extend(
                            c.iter()
                                .copied()
                                .filter(|&j| j < i || handle_of(j) == handle_of(i)),
                        );
                    }
                }
            }
        }
        // A new directory is filled only once its own entry is durable:
        // a crash leaves a directory that no entry names empty, a leak the
        // benign repair frees, never a subtree cut off from the root.
        let mut named: HashMap<Ino, Vec<usize>> = HashMap::default();
        for (i, u) in ups.iter().enumerate() {
            if let UpdateKind::Dirent {
                dir,
                name,
                ino,
                op: LinkOp::Add,
            } = &u.kind
            {
                let dots = name.as_slice() == b"." || name.as_slice() == b"..";
                if !dots {
                    if let Some(v) = named.get(dir) {
                        g.preds[i].extend(v.iter().copied());
                    }
                    // The names of one inode appear in the order they were
                    // made: a directory moved right after its creation gets
                    // its new name (and then its new `..`) only once its
                    // first name is durable, so no crash shows it under the
                    // new name with `..` still naming the old parent.
                    let v = named.entry(*ino).or_default();
                    g.preds[i].extend(v.iter().copied());
                    v.push(i);
                }
            }
        }
        // A name replaced in one operation (removed, then added again for
        // another inode) is never absent: the removal goes out with the new
        // entry.
        // Keyed by names users chose: SipHash, as the directory index.
        let mut adds_named: std::collections::HashMap<(Ino, &[u8]), Vec<usize>> =
            std::collections::HashMap::new();
        for (i, u) in ups.iter().enumerate() {
            if let UpdateKind::Dirent {
                dir,
                name,
                op: LinkOp::Add,
                ..
            } = &u.kind
            {
                adds_named
                    .entry((*dir, name.as_slice()))
                    .or_default()
                    .push(i);
            }
        }
        for (i, u) in ups.iter().enumerate() {
            if let UpdateKind::Dirent {
                dir,
                name,
                op: LinkOp::Remove,
                ..
            } = &u.kind
            {
                if let Some(v) = adds_named.get(&(*dir, name.as_slice())) {
                    g.preds[i].extend(
                        v.iter()
                            .copied()
                            .filter(|&j| j > i && handle_of(j) == handle_of(i)),
                    );
                    // A retarget (rename over an existing name) is an add
                    // and a removal on the same bytes, in one handle: one
                    // change. (An entry added by one handle and removed by a
                    // later one, which may touch the same bytes, is two.)
                    let same = |j: usize| {
                        handle_of(j) == handle_of(i)
                            && ups[j].block == u.block
                            && ups[j].range.start < u.range.end
                            && u.range.start < ups[j].range.end
                    };
                    let pair: Vec<usize> =
                        v.iter().copied().filter(|&j| j < i && same(j)).collect();
                    for j in pair {
                        g.preds[i].push(j);
                        g.preds[j].push(i);
                    }
                }
            }
        }
        // One node write is reported as two updates of the same kind (its
        // header, its entries): they go out together.
        for i in 1..n {
            let (a, b) = (ups[i - 1], ups[i]);
            if a.block == b.block
                && a.kind == b.kind
                && matches!(b.kind, UpdateKind::Extent { .. })
                && handle_of(i - 1) == handle_of(i)
            {
                g.preds[i].push(i - 1);
                g.preds[i - 1].push(i);
            }
        }
        unlinked_nodes(io, ups, &mut g.preds);
        let eager = self.fault == Fault::EagerFrees;
        // Permanently ready: already on its way, released, or (fault) no
        // rollback at all.
        let fixed: Vec<bool> = live
            .iter()
            .map(|&k| {
                let p = &self.pending[k];
                p.written || p.forced || self.fault == Fault::NoRollback
            })
            .collect();
        // Allocation initialization: a mapping waits for its fresh data.
        // Every predecessor in another block must be durable (it is pending,
        // so it is not).
        let mut ready: Vec<bool> = (0..n)
            .map(|i| {
                if fixed[i] || (eager && Self::is_deferred_work(ups[i])) {
                    return true;
                }
                let data_blocked = match &ups[i].kind {
                    UpdateKind::Extent { pblk, len, op, .. } if *len > 0 && op.sets() => sim_fresh
                        .range(*pblk..*pblk + u64::from(*len))
                        .next()
                        .is_some(),
                    // A tree switch names every data block of the file.
                    UpdateKind::ExtentTree { named, .. } => named
                        .iter()
                        .any(|&(s, e)| sim_fresh.range(s..e).next().is_some()),
                    _ => false,
                };
                !data_blocked && g.preds[i].iter().all(|&j| ups[j].block == ups[i].block)
            })
            .collect();
        // Predecessors in the same block must be in the same image: the
        // greatest set closed under that (updates of one block that depend
        // on each other go out together).
        loop {
            let mut changed = false;
            for i in 0..n {
                if !ready[i] || fixed[i] || (eager && Self::is_deferred_work(ups[i])) {
                    continue;
                }
                if g.preds[i].iter().any(|&j| !ready[j]) {
                    ready[i] = false;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        (ready, g.preds)
    }
}

impl Protocol for SoftdepProtocol {
    fn name(&self) -> &'static str {
        "softdep"
    }

    fn on_update(&mut self, u: &Update, h: &HandleInfo) {
        // Checksums are recomputed in every image written.
        if matches!(u.kind, UpdateKind::Checksum) || u.range.is_empty() {
            return;
        }
        // An entry removed before its addition was ever written cancels
        // it: neither needs to reach the disk (the cached block has both,
        // so its images carry their net effect, nothing), and nothing
        // waits for them any more.
        if let UpdateKind::Dirent {
            dir,
            name,
            ino,
            op: LinkOp::Remove,
        } = &u.kind
        {
            if self.fault == Fault::None {
                let add = self.pending.iter().rposition(|p| {
                    matches!(&p.u.kind, UpdateKind::Dirent { dir: d, name: n, op: LinkOp::Add, .. }
                        if d == dir && n == name)
                });
                if let Some(k) = add {
                    let p = &self.pending[k];
                    let same = matches!(&p.u.kind, UpdateKind::Dirent { ino: i, .. } if i == ino);
                    // Every update of the entry's bytes since the addition
                    // must be unwritten too (a retarget's halves).
                    // Nor may a removal of the inode's other name have
                    // come since (the addition was a rename's new name,
                    // and that removal waits for it).
                    let clean = same
                        && self.pending[k..].iter().all(|q| match &q.u.kind {
                            UpdateKind::Dirent {
                                op: LinkOp::Remove,
                                ino: i,
                                ..
                            } => q.u.block != p.u.block && i != ino,
                            _ => q.u.block != p.u.block || !q.written,
                        });
                    // And no other pending update of the block may touch
                    // the bytes either change: rolling one of those back
                    // would expose the entry's bytes again (an older
                    // `rec_len` reaching over the slot).
                    let overlaps = |a: &std::ops::Range<u32>, b: &std::ops::Range<u32>| {
                        a.start < b.end && b.start < a.end
                    };
                    let clean = clean
                        && self.pending.iter().enumerate().all(|(j, q)| {
                            j == k
                                || q.u.block != p.u.block
                                || !(overlaps(&q.u.range, &p.u.range)
                                    || overlaps(&q.u.range, &u.range))
                        });
                    // A directory moved since keeps its old name until its
                    // `..` is retargeted, and a new directory filled since
                    // keeps the name its entries wait for (a new directory
                    // is filled only once its own entry is durable, below):
                    // not cancelled.
                    let clean = clean
                        && !self.pending.iter().any(|q| {
                            matches!(&q.u.kind, UpdateKind::Dirent { dir: d, name: n, op, .. }
                                if d == ino
                                    && (n.as_slice() == b".."
                                        || (*op == LinkOp::Add && n.as_slice() != b".")))
                        });
                    if clean {
                        let id = p.id;
                        self.drop_pending(|q| q.id != id);
                        self.stats_cancelled += 2;
                        return;
                    }
                }
            }
        }
        *self.per_block.entry(u.block).or_insert(0) += 1;
        self.pending.push(Pend {
            id: self.next_id,
            handle: h.id,
            u: u.clone(),
            written: false,
            forced: false,
        });
        self.next_id += 1;
    }

    fn on_data_write(&mut self, w: &DataWrite, _h: &HandleInfo) {
        if w.fresh {
            self.fresh.insert(w.pblk);
        }
    }

    fn on_block_freed(&mut self, block: u64, _h: &HandleInfo) {
        self.freed.insert(block);
    }

    fn keeps_freed_block(&self, block: u64) -> bool {
        self.fresh.contains(&block) || self.per_block.contains_key(&block)
    }

    fn on_block_unallocated(&mut self, block: u64, _h: &HandleInfo) {
        // Allocated and given back by one handle: nothing on disk names it.
        self.fresh.remove(&block);
        let before = self.pending.len();
        self.drop_pending(|p| p.u.block != block);
        self.stats_cancelled += (before - self.pending.len()) as u64;
    }

    fn can_allocate(&self, block: u64) -> bool {
        self.fault == Fault::EagerFrees || !self.freed.contains(&block)
    }

    fn has_pending_frees(&self) -> bool {
        !self.freed.is_empty()
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.write_rounds(io, true);
        Ok(())
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.write_rounds(io, true);
        Ok(())
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.write_rounds(io, reason != WriteBackReason::Timer);
        Ok(())
    }

    fn plan_done(&mut self, done: &PlanDone) {
        if !done.ok {
            return;
        }
        // Plans run in order, and each ends with a flush: everything up to
        // this tag is durable.
        let tags: Vec<u64> = self.inflight.range(..=done.tag).map(|(&t, _)| t).collect();
        let mut ids: HashSet<u64> = HashSet::default();
        for t in tags {
            if let Some((v, f)) = self.inflight.remove(&t) {
                ids.extend(v);
                for b in f {
                    self.fresh.remove(&b);
                }
            }
        }
        if !ids.is_empty() {
            self.drop_pending(|p| !ids.contains(&p.id));
        }
        self.release_freed();
    }

    fn stats(&self) -> Vec<(String, u64)> {
        vec![
            ("rounds".into(), self.stats_rounds),
            ("block_writes".into(), self.stats_writes),
            ("rolled_back_images".into(), self.stats_rolled_back),
            ("cycles".into(), self.stats_cycles),
            ("cancelled_updates".into(), self.stats_cancelled),
            ("pending_updates".into(), self.pending.len() as u64),
        ]
    }
}

/// Whether `u` initializes an extent-tree block with entries: its image is
/// a valid node, which may be written (and named) before a later emptying
/// and unlinking of the node is durable. Only the updates after it can
/// leave the node empty. Holding the initialization back too would make a
/// cycle when the node was made and emptied before either was written:
/// the entry naming it waits for its initialization, which would wait for
/// the clearing of that same entry, which follows the entry's setting.
fn holds_entries(u: &Update) -> bool {
    matches!(u.kind, UpdateKind::ExtentBlockInit { .. })
        && u.range.start == 0
        && u.new.len() >= 4
        && u16::from_le_bytes([u.new[2], u.new[3]]) > 0
}

/// Extent-tree nodes whose index entry is being cleared (FreeBSD's
/// `indirdep` freed with its `freeblks`).
///
/// * A node *emptied* and unlinked (its last entry removed, then the
///   parent's entry naming it): an empty non-root node is not a valid
///   tree, so its own updates (but its initialization, see
///   [`holds_entries`]) wait for the parent's entry to be cleared
///   durably, and whatever waited for them (the frees of the blocks it
///   mapped, a lowered `i_size` or `i_blocks`, a key raised in the parent)
///   waits for that clearing instead, which removes the whole node from the
///   tree at once. The node's block is not reused before its image is
///   written (`can_allocate`), which is harmless once nothing names it.
/// * A node *absorbed* into the root (the tree collapses: the root takes
///   the node's entries and drops its index entry): the root's image
///   carries the node's current entries, so it waits for every pending
///   update of the node, as any pointer waits for what it names.
fn unlinked_nodes(io: &Io, ups: &[&Update], preds: &mut [Vec<usize>]) {
    // The clearing of a node's index entry is one or two updates (the
    // parent's header and its entries, see `crate::extent`).
    let mut unlinked: HashMap<u64, Vec<usize>> = HashMap::default();
    for (i, u) in ups.iter().enumerate() {
        if let UpdateKind::Extent {
            len: 0,
            op: MapOp::Clear,
            pblk,
            ..
        } = u.kind
        {
            unlinked.entry(pblk).or_default().push(i);
        }
    }
    if unlinked.is_empty() {
        return;
    }
    let mut in_block: HashMap<u64, Vec<usize>> = HashMap::default();
    for (i, u) in ups.iter().enumerate() {
        if unlinked.contains_key(&u.block) {
            in_block.entry(u.block).or_default().push(i);
        }
    }
    let mut emptied: HashMap<u64, Vec<usize>> = HashMap::default();
    for (&node, cs) in &unlinked {
        let Some(members) = in_block.get(&node) else {
            continue;
        };
        let empty = io
            .snapshot(node)
            .is_some_and(|img| img.len() >= 4 && u16::from_le_bytes([img[2], img[3]]) == 0);
        if empty {
            emptied.insert(node, cs.clone());
            for &i in members {
                if holds_entries(ups[i]) {
                    continue;
                }
                preds[i].extend(cs.iter().copied().filter(|&c| c != i));
            }
        } else {
            for &c in cs {
                preds[c].extend(members.iter().copied().filter(|&i| i != c));
            }
        }
    }
    if emptied.is_empty() {
        return;
    }
    // The clearings that make an update of an emptied node moot (through
    // every emptied ancestor, bounded by the tree's depth).
    let moot = |j: usize| -> Vec<usize> {
        let mut out = vec![j];
        for _ in 0..=ordo_format::extent::EXTENT_DEPTH_MAX {
            let mut next = Vec::new();
            let mut changed = false;
            for &x in &out {
                match emptied.get(&ups[x].block) {
                    Some(cs) if !cs.contains(&x) && !holds_entries(ups[x]) => {
                        next.extend(cs.iter().copied());
                        changed = true;
                    }
                    _ => next.push(x),
                }
            }
            next.sort_unstable();
            next.dedup();
            out = next;
            if !changed {
                break;
            }
        }
        out
    };
    for (i, p) in preds.iter_mut().enumerate() {
        if !p.iter().any(|&j| emptied.contains_key(&ups[j].block)) {
            continue;
        }
        let mut q: Vec<usize> = Vec::with_capacity(p.len());
        for &j in p.iter() {
            if ups[j].block == ups[i].block {
                q.push(j);
            } else {
                q.extend(moot(j));
            }
        }
        q.retain(|&j| j != i);
        q.sort_unstable();
        q.dedup();
        *p = q;
    }
}

/// The bits a one-byte bitmap update changed, if it is one.
fn bit_mask(u: &Update) -> Option<u8> {
    match u.kind {
        UpdateKind::Bitmap { .. } if u.range.len() == 1 && u.old.len() == 1 && u.new.len() == 1 => {
            Some(u.old[0] ^ u.new[0])
        }
        _ => None,
    }
}

/// Undo `u` in `img`: its old bytes back, or for a bitmap update only the
/// bits it changed (the byte's other bits may belong to updates that are
/// not held).
fn undo(img: &mut [u8], u: &Update) {
    let r = u.range.start as usize..u.range.end as usize;
    match bit_mask(u) {
        Some(mask) => {
            let b = &mut img[r.start];
            *b = (*b & !mask) | (u.old[0] & mask);
        }
        None => img[r].copy_from_slice(&u.old),
    }
}
