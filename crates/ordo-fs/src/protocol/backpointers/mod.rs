//! `backpointers`: consistency without ordering (NoFS, Chidambaram et al.,
//! FAST '12).
//!
//! What it does
//! ------------
//! No write is ordered before another. Dirty blocks (metadata, data and
//! owner-table blocks alike) go home in ascending order on the commit
//! interval, under memory pressure and at unmount; `fsync`, `fdatasync` and
//! `sync` write every dirty block and then flush the cache once. What makes
//! a crash harmless is not order but *checks on access*:
//!
//! - **Owner records.** Every file block has a record in the owner table
//!   (docs/FORMAT.md, "Owner table"; kept as the data of reserved inode 5)
//!   naming `{inode, generation, logical block}` and the crc32c of the
//!   contents written. The record is computed from the very image that
//!   goes home, so a record and its block agree exactly when both writes
//!   reached the disk. A read from the device whose record names another
//!   owner, or whose contents do not match the checksum, fails with EIO
//!   ([`Protocol::check_block_read`]): a stale pointer never shows another
//!   file's bytes, and a pointer whose data never reached the disk never
//!   shows garbage. The generation is what tells a reused inode number's
//!   blocks from its predecessor's.
//! - **Directory and extent-tree blocks** prove their owner through
//!   `metadata_csum`, whose checksums are seeded with the inode number and
//!   generation: the core rejects a block that is not its inode's.
//! - **Backlinks** (the core's, `caps.backlinks`): every inode names its
//!   directories, and a name resolves only to an inode that names its
//!   directory back.
//! - **A tree's new nodes go home before the pointers to them.** Where
//!   an extent tree changed shape (it grew a level, a node split, a shift
//!   built a new tree), the new nodes are written behind a flush of their
//!   own before the rest, and a node a split truncated after the rest,
//!   behind another (`send_ordered`): a crash can then not keep a pointer
//!   and lose its node, whose block may hold an older node of the same
//!   file (the same inode and generation: its checksum holds) and bring
//!   an older map back, nor keep a truncated node and lose the pointer to
//!   the half it gave away. Only changes of shape pay these flushes. A
//!   newly placed attribute block goes first the same way: its owner mark
//!   cannot tell it from an older attribute block of the same file.
//! - **A shift's moved records wait for its tree.** A collapse or insert
//!   range moves the records of every block after its offset; they go home
//!   only once the new tree and inode are durable (`move_old`), so the
//!   records on disk are never ahead of the tree. Until then each goes home
//!   as a *moving* record (logical block [`MOVING_LBLK`]: this file, these
//!   contents, at whatever offset its tree gives), and before anything
//!   that may carry the new map: a crash between the new inode and the
//!   moved records then reads the moved blocks through whichever tree
//!   survived, where exact old records made every one of them fail its
//!   check. A read that meets a moving record makes it exact again. The
//!   fsync that ends a shift flushes three times.
//! - **Allocation state is not trusted after a crash**: the core's
//!   scanners rebuild it from what validates before anything is allocated
//!   ([`Protocol::trusts_allocation_state`]).
//!
//! Faults (`ORDO_FAULT`, a comma-separated list, read when the protocol is
//! built), for the crash explorer's proof that it catches a broken NoFS:
//! - `nofs_no_generation`: records are compared without the generation,
//!   and, as the paper's backpointers, neither cleared when a block is
//!   freed nor kept from reuse until the free is durable (either would
//!   hide the missing generation: a reused inode number then never meets
//!   its predecessor's block);
//! - `nofs_no_owner_check`: reads skip the owner check;
//! - `nofs_unvalidated_alloc`: the on-disk bitmaps are trusted after a
//!   crash (no scan before allocating);
//! - `nofs_moves_unheld`: the records a collapse or insert range moves go
//!   home with the next write-back, before the new tree is durable (a
//!   crash can lose the new tree and keep the inode only with
//!   `nofs_tree_unordered` beside it: the tree's order alone now keeps
//!   that state from existing, and the held records are a second line);
//! - `nofs_tree_unordered`: a tree's new and truncated nodes go home with
//!   everything else, in no order;
//! - `nofs_moves_exact`: a shift's held records go home as the old tree's
//!   exact records, not moving, and with no flush before the new map (a
//!   crash that keeps the new inode and not the moved records fails
//!   every moved block's check).

mod table;

pub use table::{data_crc, per_block, table_blocks};

use std::collections::{BTreeSet, HashMap};

use super::*;
use crate::error::{errno, FsError};
use crate::update::{InodeField, MOVING_LBLK};
use table::Record;

/// `mode=backpointers`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "backpointers",
    summary: "no ordering at all: owner records, backlinks and scanners (NoFS)",
    variants: &[],
    mkfs_features: "metadata_csum,extent,ext_attr",
    caps: Capabilities {
        // An fsync's commit covers the files it names; concurrent ones
        // name theirs and share one flush.
        group_commit: true,
        backlinks: true,
        data_consistent_after_scan: true,
        ..Capabilities::NONE
    },
    recover: recover_nothing,
    build,
};

fn build(_recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    if !env.metadata_csum {
        return Err(FsError::Invalid(
            "mode=backpointers needs metadata_csum (directory and extent blocks prove \
             their owner by it)"
                .into(),
        ));
    }
    Ok(Box::new(Backpointers::new(env)))
}

/// A fault injected on purpose (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    NoGeneration,
    NoOwnerCheck,
    UnvalidatedAlloc,
    MovesUnheld,
    TreeUnordered,
    MovesExact,
}

impl Fault {
    /// The faults `ORDO_FAULT` names (a comma-separated list; names of
    /// other protocols' faults are ignored).
    fn from_env() -> Vec<Fault> {
        let v = std::env::var("ORDO_FAULT").unwrap_or_default();
        v.split(',')
            .filter_map(|f| match f.trim() {
                "nofs_no_generation" => Some(Fault::NoGeneration),
                "nofs_no_owner_check" => Some(Fault::NoOwnerCheck),
                "nofs_unvalidated_alloc" => Some(Fault::UnvalidatedAlloc),
                "nofs_moves_unheld" => Some(Fault::MovesUnheld),
                "nofs_tree_unordered" => Some(Fault::TreeUnordered),
                "nofs_moves_exact" => Some(Fault::MovesExact),
                _ => None,
            })
            .collect()
    }
}

/// What waits for a flush: a frozen block on its way back to the free
/// pool, or a record moved by a shift on its way to the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The change that freed it is behind the flush: its record is
    /// cleared when that flush is done.
    Free,
    /// Its cleared record is behind the flush: it is reusable when that
    /// flush is done.
    Clear,
    /// The shift (collapse or insert range) that moved its record is
    /// behind the flush: the moved record may go home when that flush
    /// is done.
    Moved,
}

/// The frozen blocks, one bit per block of the file system: the allocator
/// asks about every free block it passes ([`Protocol::can_allocate`]),
/// and after a burst of deletes it passes thousands of frozen ones per
/// allocation, so the test is a bit, not a hash lookup (an eighth of a
/// byte per block, against the owner table's 20 bytes in memory).
struct Frozen {
    bits: Vec<u64>,
    count: usize,
}

impl Frozen {
    fn new(blocks: u64) -> Self {
        Frozen {
            bits: vec![0; blocks.div_ceil(64) as usize],
            count: 0,
        }
    }
    fn at(&self, b: u64) -> Option<(usize, u64)> {
        let w = (b / 64) as usize;
        (w < self.bits.len()).then_some((w, 1u64 << (b % 64)))
    }
    fn insert(&mut self, b: u64) {
        let Some((w, m)) = self.at(b) else { return };
        if self.bits[w] & m == 0 {
            self.bits[w] |= m;
            self.count += 1;
        }
    }
    fn remove(&mut self, b: &u64) {
        let Some((w, m)) = self.at(*b) else { return };
        if self.bits[w] & m != 0 {
            self.bits[w] &= !m;
            self.count -= 1;
        }
    }
    fn contains(&self, b: &u64) -> bool {
        self.at(*b).is_some_and(|(w, m)| self.bits[w] & m != 0)
    }
    fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The `backpointers` protocol.
pub struct Backpointers {
    bs: u32,
    block_count: u64,
    /// The faults injected (`ORDO_FAULT`, comma-separated).
    faults: Vec<Fault>,
    /// Physical blocks of the table (header first); empty until attached.
    table_at: Vec<u64>,
    /// The table's blocks, in memory for the mount.
    table: Vec<Vec<u8>>,
    /// Table blocks changed since they last went home.
    table_dirty: BTreeSet<usize>,
    /// File blocks written since their record was last computed.
    pending: HashMap<u64, BlockOwner>,
    /// Blocks whose record changed since the last flush this protocol
    /// planned (their new version may still be in flight).
    unflushed: std::collections::HashSet<u64>,
    /// Blocks changed for each inode since they last went home: its
    /// inode-table block, extent-tree and attribute blocks, data blocks,
    /// and for a directory its blocks. An fsync writes these alone.
    owned: HashMap<Ino, BTreeSet<u64>>,
    /// Inode-table blocks whose change for each inode is its times (or
    /// checksum) alone.
    own_times: HashMap<Ino, BTreeSet<u64>>,
    /// Records moved by a shift whose tree and inode are not durable yet:
    /// the record as the disk must keep it until they are. A shift moves
    /// the records of every block after its offset, across as many
    /// table blocks as those blocks span; were some of them to reach the
    /// disk before the tree (or without the others), a crash that lost
    /// the tree would leave the scan records of two positions to rebuild
    /// the map from, a block twice or not at all. Held back, the records
    /// on disk are the old tree's until the new tree is durable.
    move_old: HashMap<u64, Option<Record>>,
    /// Blocks of `move_old` whose moving record is not durable yet: it goes
    /// home, behind a flush, before anything else the next plan writes
    /// (the inode or tree with the shift's new map among it).
    moving_unflushed: BTreeSet<u64>,
    /// Moved blocks of each inode whose shift was not written yet.
    moves_unwritten: HashMap<Ino, Vec<u64>>,
    /// Moved blocks whose shift was written, with no flush planned since.
    moves_awaiting_flush: Vec<u64>,
    /// The directories whose entries naming each inode changed.
    entry_dirs: HashMap<Ino, BTreeSet<Ino>>,
    /// The inodes a directory's changed entries name.
    children: HashMap<Ino, BTreeSet<Ino>>,
    /// Freed blocks not to be reused yet: until the change that freed
    /// them is durable, a pointer to them may still be on disk, and a
    /// block with no owner record (a directory's, a tree's, an attribute
    /// block) could not tell its new owner's contents from the old.
    frozen: Frozen,
    /// Frozen blocks whose freeing change has not been written yet.
    awaiting_write: Vec<u64>,
    /// Frozen blocks whose freeing change was written, with no flush
    /// planned since.
    awaiting_flush: Vec<u64>,
    /// Frozen blocks staged behind the flush of the plan of that number:
    /// when it is done, their frees are durable and their records are
    /// cleared (phase [`Phase::Free`]), or their cleared records are
    /// durable and they are released ([`Phase::Clear`]).
    staged: Vec<(u64, Phase, Vec<u64>)>,
    /// Frozen blocks whose records were cleared in memory, the table
    /// blocks not yet written.
    clear_write: Vec<u64>,
    /// Frozen blocks whose cleared records were written, with no flush
    /// planned since.
    clear_flush: Vec<u64>,
    /// A table being rebuilt: its header, to go home after the first
    /// flush that makes every record durable.
    header_pending: Option<Vec<u8>>,
    /// Extent-tree nodes written whole since they last went home (a
    /// tree that grew a level, a split's new sibling, a shift's new
    /// tree): they go home behind their own flush before the node that
    /// points to them (`send_ordered`).
    fresh_nodes: BTreeSet<u64>,
    /// Blocks changed by an update of no mapping meaning (`Other`); those
    /// that are extent-tree nodes were truncated by a split after their
    /// parent gained the sibling's pointer, and go home after the parent.
    trimmed_nodes: BTreeSet<u64>,
    /// Attribute blocks placed since they last went home: each goes home
    /// before the inode that names it (`send_ordered`).
    fresh_attrs: BTreeSet<u64>,
    /// Flushes planned to order a tree's nodes.
    tree_flushes: u64,
    /// Flushes planned to put moving records before a shift's new map.
    moving_flushes: u64,
    /// Moving records a read made exact again (after a crash).
    moving_settled: u64,
    write_backs: u64,
    blocks_written: u64,
    records_written: u64,
    owner_mismatches: u64,
    crc_mismatches: u64,
}

impl Backpointers {
    fn new(env: &ProtocolEnv) -> Self {
        Backpointers {
            bs: env.block_size,
            block_count: env.block_count,
            faults: Fault::from_env(),
            table_at: Vec::new(),
            table: Vec::new(),
            table_dirty: BTreeSet::new(),
            pending: HashMap::new(),
            unflushed: Default::default(),
            frozen: Frozen::new(env.block_count),
            awaiting_write: Vec::new(),
            awaiting_flush: Vec::new(),
            staged: Vec::new(),
            clear_write: Vec::new(),
            clear_flush: Vec::new(),
            header_pending: None,
            fresh_nodes: BTreeSet::new(),
            trimmed_nodes: BTreeSet::new(),
            fresh_attrs: BTreeSet::new(),
            tree_flushes: 0,
            moving_flushes: 0,
            moving_settled: 0,
            owned: HashMap::new(),
            own_times: HashMap::new(),
            move_old: HashMap::new(),
            moving_unflushed: BTreeSet::new(),
            moves_unwritten: HashMap::new(),
            moves_awaiting_flush: Vec::new(),
            entry_dirs: HashMap::new(),
            children: HashMap::new(),
            write_backs: 0,
            blocks_written: 0,
            records_written: 0,
            owner_mismatches: 0,
            crc_mismatches: 0,
        }
    }

    fn faulty(&self, f: Fault) -> bool {
        self.faults.contains(&f)
    }

    fn slot_of(&self, pblk: u64) -> (usize, usize) {
        let per = per_block(self.bs);
        (1 + (pblk / per) as usize, (pblk % per) as usize)
    }

    fn record(&self, pblk: u64) -> Option<Record> {
        if self.table.is_empty() || pblk >= self.block_count {
            return None;
        }
        let (k, slot) = self.slot_of(pblk);
        table::get(&self.table[k], slot)
    }

    fn set_record(&mut self, pblk: u64, r: Option<Record>) {
        if self.table.is_empty() || pblk >= self.block_count {
            return;
        }
        let (k, slot) = self.slot_of(pblk);
        if table::get(&self.table[k], slot) == r {
            return;
        }
        table::put(&mut self.table[k], slot, r);
        self.table_dirty.insert(k);
    }

    /// The record of `pblk` now holding `img` of `owner`: it keeps the
    /// checksum of the version a flush made durable, for as long as the
    /// new one may still be in flight.
    fn settle(&mut self, pblk: u64, owner: BlockOwner, img: &[u8]) {
        let crc = data_crc(img);
        let prev = match self.record(pblk) {
            Some(old) if old.owner == owner && old.crc != crc => {
                if self.unflushed.contains(&pblk) {
                    old.prev
                } else {
                    old.crc
                }
            }
            Some(old) if old.owner == owner => old.prev,
            _ => 0,
        };
        self.set_record(pblk, Some(Record { owner, crc, prev }));
        self.unflushed.insert(pblk);
    }

    /// A flush is planned after every write planned so far: the versions
    /// recorded so far are durable once it completes.
    fn flush(&mut self, io: &mut Io) {
        io.flush();
        self.unflushed.clear();
        let serial = io.plan().serial;
        if !self.awaiting_flush.is_empty() {
            let blocks = std::mem::take(&mut self.awaiting_flush);
            self.staged.push((serial, Phase::Free, blocks));
        }
        if !self.clear_flush.is_empty() {
            let blocks = std::mem::take(&mut self.clear_flush);
            self.staged.push((serial, Phase::Clear, blocks));
        }
        if !self.moves_awaiting_flush.is_empty() {
            let blocks = std::mem::take(&mut self.moves_awaiting_flush);
            self.staged.push((serial, Phase::Moved, blocks));
        }
    }

    /// The shifts that moved the records of `blocks` are durable (or
    /// planned behind a flush that makes them so): the moved records may
    /// go home.
    fn release_moves(&mut self, blocks: Vec<u64>) {
        for b in blocks {
            self.moving_unflushed.remove(&b);
            if self.move_old.remove(&b).is_some() && !self.table.is_empty() {
                self.table_dirty.insert(self.slot_of(b).0);
            }
        }
    }

    /// The blocks staged in `phase` behind the flush of plan `serial`.
    fn take_staged(&mut self, serial: u64, phase: Phase) -> Vec<u64> {
        let mut out = Vec::new();
        self.staged.retain_mut(|(s, p, blocks)| {
            if *s == serial && *p == phase {
                out.append(blocks);
                false
            } else {
                true
            }
        });
        out
    }

    /// Staged work behind the flush of plan `serial`, which was just
    /// planned: frees have their records cleared and moves are released
    /// (the writes that follow in the same plan go after the flush).
    /// Whether any table block changed for it.
    fn settle_staged_now(&mut self, serial: u64) -> bool {
        let freed = self.take_staged(serial, Phase::Free);
        let moves = self.take_staged(serial, Phase::Moved);
        let any = !freed.is_empty() || !moves.is_empty();
        self.clear_freed(freed);
        self.release_moves(moves);
        any
    }

    /// The frees of `blocks` are durable (or planned behind a flush that
    /// makes them so): clear their records. A block with no record (a
    /// directory's or a tree's) is released at once; the others wait for
    /// the cleared record to be durable in turn.
    fn clear_freed(&mut self, blocks: Vec<u64>) {
        for b in blocks {
            // No pointer on disk maps it any more: a moved record held
            // back for it is moot, and must not outlive the clearing.
            self.move_old.remove(&b);
            self.moving_unflushed.remove(&b);
            if self.record(b).is_some() {
                self.set_record(b, None);
                self.clear_write.push(b);
            } else {
                self.frozen.remove(&b);
            }
        }
    }

    /// Compute the records of the file blocks written since, from the
    /// images about to go home.
    fn settle_records(&mut self, io: &Io) {
        let pending = std::mem::take(&mut self.pending);
        for (pblk, owner) in pending {
            // A block no longer cached was freed (and dropped) since.
            if let Some(img) = io.snapshot(pblk) {
                self.settle(pblk, owner, &img);
            }
        }
    }

    fn note(&mut self, ino: Ino, block: u64) {
        self.owned.entry(ino).or_default().insert(block);
    }

    /// The blocks an fsync of `ino` writes: the file's own, those of the
    /// directories whose entries naming it changed (and theirs, up to
    /// the root), and for a directory those of the inodes its changed
    /// entries name. Nothing of allocation state: bitmaps and counters
    /// are rebuilt by the scanners after a crash, so they go home with
    /// the write-backs only (the paper's lazily written hints).
    fn fsync_blocks(&mut self, ino: Ino, io: &Io) -> BTreeSet<u64> {
        let mut todo = vec![ino];
        let mut seen = std::collections::HashSet::new();
        if let Some(ch) = self.children.remove(&ino) {
            todo.extend(ch);
        }
        let mut blocks = BTreeSet::new();
        if let Some(b) = self.own_times.remove(&ino) {
            blocks.extend(b);
        }
        while let Some(i) = todo.pop() {
            if !seen.insert(i) {
                continue;
            }
            if let Some(b) = self.owned.remove(&i) {
                blocks.extend(b);
            }
            if let Some(d) = self.entry_dirs.remove(&i) {
                todo.extend(d);
            }
        }
        // A block some other plan sent home with its record still to
        // compute (none should be: see `send_ordered`) keeps its place, so
        // that its record goes home with this fsync.
        blocks.retain(|&b| io.is_dirty(b) || self.pending.contains_key(&b));
        blocks
    }

    /// Write `blocks` and the owner records of the file blocks among them,
    /// then flush once.
    fn write_some(&mut self, blocks: &BTreeSet<u64>, mut tables: BTreeSet<usize>, io: &mut Io) {
        for &b in blocks {
            if let Some(owner) = self.pending.remove(&b) {
                if let Some(img) = io.snapshot(b) {
                    self.settle(b, owner, &img);
                }
                if !self.table.is_empty() && b < self.block_count {
                    tables.insert(self.slot_of(b).0);
                }
            }
        }
        let list: Vec<u64> = blocks.iter().copied().filter(|&b| io.is_dirty(b)).collect();
        self.blocks_written += list.len() as u64;
        self.send_ordered(&list, io);
        self.write_tables(tables, io);
        self.flush(io);
        self.write_backs += 1;
    }

    /// Write those of the owner-table blocks `tables` that changed.
    fn write_tables(&mut self, tables: BTreeSet<usize>, io: &mut Io) {
        for k in tables {
            if self.table_dirty.remove(&k) {
                self.write_table_block(k, io);
            }
        }
    }

    /// Write every changed table block; the cleared records among them
    /// then wait for a flush.
    fn write_dirty_tables(&mut self, io: &mut Io) {
        for k in std::mem::take(&mut self.table_dirty) {
            self.write_table_block(k, io);
        }
        self.clear_flush.append(&mut self.clear_write);
    }

    fn write_table_block(&mut self, k: usize, io: &mut Io) {
        let mut img = self.table[k].clone();
        if k > 0 {
            table::seal_record_block(&mut img);
            self.table[k] = img.clone();
            // Moved records whose shift is not durable go home moving:
            // the file's, at any offset (see `move_old`).
            let per = per_block(self.bs);
            let first = (k as u64 - 1) * per;
            let mut held = false;
            let exact = self.faulty(Fault::MovesExact);
            for (&b, &old) in &self.move_old {
                if (first..first + per).contains(&b) {
                    let r = if exact { old } else { old.map(moving) };
                    table::put(&mut img, (b - first) as usize, r);
                    held = true;
                }
            }
            if held {
                table::seal_record_block(&mut img);
            }
        }
        io.write_raw(
            self.table_at[k],
            Arc::new(img),
            WriteFlags::new(BlockClass::Other),
        );
        self.records_written += 1;
    }

    /// Send `blocks` (sorted) home. Unordered, as NoFS writes, except
    /// where an extent tree changed shape: a node the tree gained goes
    /// home, behind a flush, before the node that points to it, and a node
    /// a split truncated goes home, behind another, after the parent that
    /// points to its new sibling (Ganger and Patt's rules, for the tree
    /// alone). Without them a crash could keep the new pointer and not
    /// the node (every block of the file after it then fails its check,
    /// or reads an older version of the same file's node, which its
    /// checksum cannot tell apart), or keep the truncated node and not the
    /// pointer (the moved half is then lost): data a sync had made
    /// durable would be gone. The file's own blocks stay unordered.
    fn send_ordered(&mut self, blocks: &[u64], io: &mut Io) {
        let is_node = |b: &u64| io.class_of(*b) == BlockClass::ExtentTree;
        // A pointer to a new node may be in any inode-table block or tree
        // node sent, and not only the file's own: an fsync of another file
        // writes every inode of its inode's block. So every new node not
        // yet home goes first, whoever's it is.
        let pointers = blocks.iter().any(|b| {
            matches!(
                io.class_of(*b),
                BlockClass::InodeTable | BlockClass::ExtentTree
            )
        });
        let fresh: Vec<u64> = if pointers {
            let mut v: Vec<u64> = self
                .fresh_nodes
                .iter()
                .copied()
                .filter(|b| io.is_dirty(*b) && is_node(b))
                .chain(
                    self.fresh_attrs
                        .iter()
                        .copied()
                        .filter(|b| io.is_dirty(*b) && io.class_of(*b) == BlockClass::Other),
                )
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        } else {
            Vec::new()
        };
        for b in &fresh {
            // Blocks with no owner record: a file block sent here would
            // reach the disk without the record that lets it be read.
            debug_assert!(
                !self.pending.contains_key(b),
                "block {b} goes home ahead of its pointers with its owner record unsettled"
            );
            self.fresh_nodes.remove(b);
            self.fresh_attrs.remove(b);
        }
        let trimmed: Vec<u64> = blocks
            .iter()
            .copied()
            .filter(|b| {
                self.trimmed_nodes.contains(b) && fresh.binary_search(b).is_err() && is_node(b)
            })
            .collect();
        for b in blocks {
            self.fresh_nodes.remove(b);
            self.fresh_attrs.remove(b);
            self.trimmed_nodes.remove(b);
        }
        if (fresh.is_empty() && trimmed.is_empty()) || self.faulty(Fault::TreeUnordered) {
            io.write_home_runs(blocks, false, super::MAX_RUN_BLOCKS);
            return;
        }
        let rest: Vec<u64> = blocks
            .iter()
            .copied()
            .filter(|b| fresh.binary_search(b).is_err() && trimmed.binary_search(b).is_err())
            .collect();
        // Plain flushes: what waits for this plan's flush (frees, moved
        // records) waits for the last one, after every phase.
        if !fresh.is_empty() {
            io.write_home_runs(&fresh, false, super::MAX_RUN_BLOCKS);
            io.flush();
            self.tree_flushes += 1;
        }
        io.write_home_runs(&rest, false, super::MAX_RUN_BLOCKS);
        if !trimmed.is_empty() {
            io.flush();
            self.tree_flushes += 1;
            io.write_home_runs(&trimmed, false, super::MAX_RUN_BLOCKS);
        }
    }

    /// Send every dirty block home (and the owner-table blocks), then
    /// flush if asked. Under memory pressure (`pressure`) the blocks an
    /// earlier plan already sends home at their current image are left to
    /// it: many threads meeting the bound at once would otherwise each
    /// copy and write the whole dirty set again.
    /// Before a plan writes anything that may carry a shift's new map:
    /// the moving records of the shifts since the last plan go home,
    /// behind a flush of their own.
    fn moving_first(&mut self, io: &mut Io) {
        if self.moving_unflushed.is_empty() || self.table.is_empty() {
            return;
        }
        let tables: BTreeSet<usize> = std::mem::take(&mut self.moving_unflushed)
            .into_iter()
            .map(|b| self.slot_of(b).0)
            .collect();
        for k in tables {
            self.table_dirty.remove(&k);
            self.write_table_block(k, io);
        }
        self.flush(io);
        self.moving_flushes += 1;
    }

    fn write_all(&mut self, io: &mut Io, flush: bool, pressure: bool) {
        self.moving_first(io);
        self.owned.clear();
        self.own_times.clear();
        self.entry_dirs.clear();
        self.children.clear();
        self.settle_records(io);
        self.awaiting_flush.append(&mut self.awaiting_write);
        for (_, mut blocks) in std::mem::take(&mut self.moves_unwritten) {
            self.moves_awaiting_flush.append(&mut blocks);
        }
        let dirty = io.dirty_to_send(pressure);
        self.blocks_written += dirty.len() as u64;
        self.send_ordered(&dirty, io);
        self.write_dirty_tables(io);
        if flush {
            self.flush(io);
            // The frees that flush makes durable have their records
            // cleared behind it, and durable behind a second flush: a
            // sync (and the commit an allocation short of space waits
            // for) leaves every freed block reusable. The records a
            // shift moved go home behind it too, and are durable when
            // the sync returns.
            let serial = io.plan().serial;
            if self.settle_staged_now(serial) && !self.table_dirty.is_empty() {
                self.write_dirty_tables(io);
                self.flush(io);
            }
            if let Some(h) = self.header_pending.take() {
                // The header of a rebuilt table follows its records.
                io.write_raw(
                    self.table_at[0],
                    Arc::new(h),
                    WriteFlags::new(BlockClass::Other),
                );
                self.flush(io);
            }
        }
        self.write_backs += 1;
    }

    fn owners_agree(&self, a: &BlockOwner, b: &BlockOwner) -> bool {
        a.ino == b.ino
            && a.lblk == b.lblk
            && (a.generation == b.generation || self.faulty(Fault::NoGeneration))
    }

    /// Whether record owner `r` is a moving record of `owner`'s file
    /// (any file block, not an attribute block).
    fn moving_of(&self, r: &BlockOwner, owner: &BlockOwner) -> bool {
        r.lblk == MOVING_LBLK
            && owner.lblk != crate::update::XATTR_LBLK
            && self.owners_agree(
                &BlockOwner {
                    lblk: owner.lblk,
                    ..*r
                },
                owner,
            )
    }
}

/// The moving form of `r`: its file and contents, at any offset.
fn moving(r: Record) -> Record {
    Record {
        owner: BlockOwner {
            lblk: MOVING_LBLK,
            ..r.owner
        },
        ..r
    }
}

impl Protocol for Backpointers {
    fn name(&self) -> &'static str {
        "backpointers"
    }
    fn on_update(&mut self, u: &Update, _h: &HandleInfo) {
        use crate::update::UpdateKind as K;
        match &u.kind {
            // Times and checksums alone do not make a name reachable: an
            // fsync writes them for the file itself only.
            K::Inode {
                ino,
                field: InodeField::Times | InodeField::Checksum,
            } => {
                self.own_times.entry(*ino).or_default().insert(u.block);
            }
            K::ExtentBlockInit { ino } => {
                self.note(*ino, u.block);
                self.fresh_nodes.insert(u.block);
            }
            K::Other => {
                self.trimmed_nodes.insert(u.block);
            }
            K::XattrBlockInit { ino } => {
                // A newly placed attribute block: its owner mark (inode,
                // generation) cannot tell it from an older attribute block
                // of the same file that its block may have held, so it goes
                // home before the inode that names it, as a tree's new node.
                self.note(*ino, u.block);
                self.fresh_attrs.insert(u.block);
            }
            K::Inode { ino, .. }
            | K::Extent { ino, .. }
            | K::ExtentTree { ino, .. }
            | K::Xattr { ino }
            | K::XattrRef { ino, .. } => self.note(*ino, u.block),
            K::DirBlockInit { dir } => self.note(*dir, u.block),
            K::Dirent { dir, ino, .. } => {
                self.note(*dir, u.block);
                if *ino != 0 && ino != dir {
                    self.entry_dirs.entry(*ino).or_default().insert(*dir);
                    self.children.entry(*dir).or_default().insert(*ino);
                }
            }
            _ => {}
        }
    }
    fn on_data_write(&mut self, w: &DataWrite, _h: &HandleInfo) {
        self.note(w.ino, w.pblk);
        if w.fresh {
            // A record left by an earlier owner (one a crash kept from
            // being cleared) must not lend its checksum as the version
            // before this one, even when it names the same file block.
            self.set_record(w.pblk, None);
        }
        self.pending.insert(
            w.pblk,
            BlockOwner {
                ino: w.ino,
                generation: w.generation,
                lblk: w.lblk,
            },
        );
    }
    fn on_block_freed(&mut self, block: u64, _h: &HandleInfo) {
        self.pending.remove(&block);
        self.fresh_nodes.remove(&block);
        self.fresh_attrs.remove(&block);
        self.trimmed_nodes.remove(&block);
        if self.faulty(Fault::NoGeneration) {
            // The paper's backpointers: neither cleared on free nor kept
            // from reuse, and here without the generation.
            return;
        }
        if self.faulty(Fault::UnvalidatedAlloc) {
            // Nothing waits: the record goes at once, the block is
            // reusable at once.
            self.set_record(block, None);
            return;
        }
        // A file block's record is cleared, for a truncate (or unlink)
        // made durable must not let a later owner of the same logical
        // block, whose data then did not reach the disk, read the old
        // bytes. But not before the free is durable: until then the
        // inode on disk may still map the block, with contents a sync
        // promised. So the block is frozen; once the change that freed
        // it is durable its record is cleared, and once that is durable
        // the block is reusable (`plan_done`, `clear_freed`).
        self.frozen.insert(block);
        self.awaiting_write.push(block);
    }
    fn can_allocate(&self, block: u64) -> bool {
        !self.frozen.contains(&block)
    }
    fn has_pending_frees(&self) -> bool {
        !self.frozen.is_empty()
    }
    fn plan_done(&mut self, done: &PlanDone) {
        if !done.ok {
            return;
        }
        let mut freed = Vec::new();
        let mut moves = Vec::new();
        let frozen = &mut self.frozen;
        self.staged.retain_mut(|(serial, phase, blocks)| {
            if *serial > done.serial {
                return true;
            }
            match phase {
                Phase::Free => freed.append(blocks),
                Phase::Clear => {
                    for b in blocks.iter() {
                        frozen.remove(b);
                    }
                }
                Phase::Moved => moves.append(blocks),
            }
            false
        });
        self.clear_freed(freed);
        self.release_moves(moves);
    }
    fn fsync(&mut self, ino: Ino, datasync: bool, io: &mut Io) -> Result<()> {
        self.fsync_in(0, &[ino], datasync, io)
    }
    /// The files of every caller of a group commit: their blocks go home
    /// together, behind one flush (concurrent fsyncs share it, as they
    /// share a JBD2 commit).
    fn fsync_in(&mut self, _stream: u32, inos: &[Ino], _datasync: bool, io: &mut Io) -> Result<()> {
        if self.header_pending.is_some() {
            // A table being rebuilt goes home whole first.
            self.write_all(io, true, false);
            return Ok(());
        }
        self.moving_first(io);
        let mut blocks = BTreeSet::new();
        let mut moves = Vec::new();
        for &ino in inos {
            blocks.extend(self.fsync_blocks(ino, io));
            moves.extend(self.moves_unwritten.remove(&ino).unwrap_or_default());
        }
        let mut tables = BTreeSet::new();
        if self.faulty(Fault::MovesUnheld) {
            // The moved records go home with the tree, in no order.
            tables.extend(moves.drain(..).map(|b| self.slot_of(b).0));
        }
        self.write_some(&blocks, tables, io);
        // Moves written earlier (by a write-back) are behind this flush
        // too: they go home now, or the fsync would return before them.
        moves.extend(self.take_staged(io.plan().serial, Phase::Moved));
        if !moves.is_empty() {
            // A file shifted since it last went home: its tree is durable
            // behind that flush, and the records the shift moved go home
            // after it, behind a second one (the one ordering point of
            // this protocol, for an operation NoFS did not have).
            let tables: BTreeSet<usize> = moves.iter().map(|&b| self.slot_of(b).0).collect();
            self.release_moves(moves);
            self.write_tables(tables, io);
            self.flush(io);
        }
        Ok(())
    }
    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.write_all(io, true, false);
        Ok(())
    }
    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.write_all(
            io,
            reason == WriteBackReason::Unmount,
            reason == WriteBackReason::Pressure,
        );
        Ok(())
    }

    fn owner_table_blocks(&self, block_count: u64) -> u64 {
        table_blocks(self.bs, block_count)
    }

    fn attach_owner_table(
        &mut self,
        blocks: &[u64],
        before: (u32, u32),
        now: (u32, u32),
        dev: &dyn BlockDevice,
    ) -> Result<bool> {
        let bs = self.bs as usize;
        let want = table_blocks(self.bs, self.block_count) as usize;
        assert!(blocks.len() >= want, "the core sized the owner table");
        self.table_at = blocks[..want].to_vec();
        self.table = Vec::with_capacity(want);
        let mut trusted = true;
        let mut buf = vec![0u8; bs];
        dev.read(self.table_at[0], &mut buf, BlockClass::Other)?;
        match table::Header::decode(&buf) {
            Ok(h) => {
                let same_geometry =
                    u64::from(h.per_block) == per_block(self.bs) && h.blocks == self.block_count;
                // The stamp of the mount that wrote the table is what the
                // superblock says now, or the superblock never got that
                // mount's stamp (the header goes first). Anything else: the
                // image was mounted elsewhere since.
                if !same_geometry || (h.stamp != before && h.before != before) {
                    trusted = false;
                }
            }
            Err(_) => trusted = false,
        }
        self.table.push(buf.clone());
        for k in 1..want {
            dev.read(self.table_at[k], &mut buf, BlockClass::Other)?;
            if table::check_record_block(&buf, k as u64 - 1).is_err() {
                trusted = false;
            }
            self.table.push(buf.clone());
        }
        if !trusted {
            for k in 1..want {
                self.table[k] = table::empty_record_block(bs, k as u64 - 1);
                self.table_dirty.insert(k);
            }
        }
        // The new stamp goes to disk, and is flushed, before the
        // superblock that carries it: a crash in between leaves a header
        // whose `before` is the superblock's stamp, which is still trusted.
        let header = table::Header {
            per_block: per_block(self.bs) as u32,
            blocks: self.block_count,
            stamp: now,
            before,
        };
        let img = header.encode(bs);
        if trusted {
            dev.write(self.table_at[0], &img, WriteFlags::new(BlockClass::Other))?;
            dev.flush()?;
        } else {
            // Until the rebuilt records are durable the old header (or
            // none) keeps the table untrusted.
            self.header_pending = Some(img.clone());
        }
        self.table[0] = img;
        Ok(trusted)
    }

    fn record_owner(&mut self, pblk: u64, owner: Option<BlockOwner>, data: &[u8]) {
        let r = owner.map(|owner| Record {
            owner,
            crc: data_crc(data),
            prev: 0,
        });
        self.set_record(pblk, r);
    }

    fn on_data_moved(&mut self, owner: BlockOwner, pblk: u64, new_lblk: u32) {
        if let Some(p) = self.pending.get_mut(&pblk) {
            // Written since its record was made: the record is made with
            // the new position when the block goes home.
            if p.ino == owner.ino {
                p.lblk = new_lblk;
            }
        }
        if let Some(mut r) = self.record(pblk) {
            if r.owner == owner {
                if !self.faulty(Fault::MovesUnheld) && !self.move_old.contains_key(&pblk) {
                    self.move_old.insert(pblk, Some(r));
                    if !self.faulty(Fault::MovesExact) {
                        self.moving_unflushed.insert(pblk);
                    }
                }
                self.moves_unwritten
                    .entry(owner.ino)
                    .or_default()
                    .push(pblk);
                r.owner.lblk = new_lblk;
                self.set_record(pblk, Some(r));
            }
        }
    }

    fn blocks_owned_by(&self, ino: Ino, generation: u32) -> Vec<(u32, u64)> {
        let per = per_block(self.bs);
        let mut out = Vec::new();
        for (k, blk) in self.table.iter().enumerate().skip(1) {
            for slot in 0..per as usize {
                if let Some(r) = table::get(blk, slot) {
                    // A moving record places no block: its tree does.
                    if r.owner.ino == ino
                        && r.owner.generation == generation
                        && r.owner.lblk != MOVING_LBLK
                    {
                        let pblk = (k as u64 - 1) * per + slot as u64;
                        if pblk < self.block_count {
                            out.push((r.owner.lblk, pblk));
                        }
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    fn block_owner(&self, pblk: u64) -> Option<BlockOwner> {
        self.record(pblk).map(|r| r.owner)
    }

    fn check_block_read(&mut self, owner: BlockOwner, pblk: u64, data: &[u8]) -> Result<()> {
        if self.faulty(Fault::NoOwnerCheck) || self.table.is_empty() {
            return Ok(());
        }
        match self.record(pblk) {
            Some(r) if self.owners_agree(&r.owner, &owner) || self.moving_of(&r.owner, &owner) => {
                let crc = data_crc(data);
                if crc == r.crc || (r.prev != 0 && crc == r.prev) {
                    if r.owner.lblk == MOVING_LBLK {
                        // A shift's moving record after a crash: the tree
                        // that survived places the block; the record says
                        // so again.
                        self.set_record(pblk, Some(Record { owner, ..r }));
                        self.moving_settled += 1;
                    }
                    Ok(())
                } else {
                    self.crc_mismatches += 1;
                    Err(errno(libc::EIO))
                }
            }
            _ => {
                self.owner_mismatches += 1;
                Err(errno(libc::EIO))
            }
        }
    }

    fn checks_owner_marks(&self) -> bool {
        !self.faulty(Fault::NoOwnerCheck)
    }

    fn trusts_allocation_state(&self) -> bool {
        self.faulty(Fault::UnvalidatedAlloc)
    }

    fn stats(&self) -> Vec<(String, u64)> {
        vec![
            ("write_backs".into(), self.write_backs),
            ("blocks_written".into(), self.blocks_written),
            ("owner_blocks_written".into(), self.records_written),
            ("owner_mismatches".into(), self.owner_mismatches),
            ("crc_mismatches".into(), self.crc_mismatches),
            ("tree_flushes".into(), self.tree_flushes),
            ("moving_flushes".into(), self.moving_flushes),
            ("moving_settled".into(), self.moving_settled),
        ]
    }
}
