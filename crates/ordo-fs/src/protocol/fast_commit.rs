//! `mode=fast_commit`: ext4 fast commits (Shirwadkar et al., ATC '24) on
//! top of JBD2, in the kernel's on-disk format.
//!
//! # What is logged
//!
//! Between two full (JBD2) commits the protocol keeps, from the update
//! interface, the *logical* changes: the directory-entry changes in the
//! order they happened (`UpdateKind::Dirent`: an entry added by a create
//! is a CREAT, any other addition a LINK, a removal an UNLINK), the inodes
//! whose fields changed (`UpdateKind::Inode`), and per inode the mappings
//! set and cleared (`UpdateKind::Extent` with a length: ADD_RANGE and
//! DEL_RANGE, in order). Directories are not logged block by block: replay
//! re-adds and removes their entries. A fast commit writes, exactly as
//! `ext4_fc_perform_commit` does, a HEAD (first commit after a full one),
//! then for each dentry change its tags (a CREAT preceded by the new
//! inode's INODE and ranges), then every changed inode's ranges and INODE,
//! then a TAIL with the CRC. An fsync commits every pending change, not
//! only the fsynced file's (the paper's point against iJournaling).
//!
//! # When a fast commit is not possible (ineligible)
//!
//! Operations replay cannot express or cannot make idempotent fall back
//! to a full JBD2 commit of everything, counted by reason: rename of a
//! directory (its ".." changes) and cross-rename, fallocate (unwritten
//! extents are not reported), data=journal, symlinks and device nodes
//! (their `i_block` content, which the kernel's INODE replay does not
//! copy), an update of a special inode, a record too large for
//! a block, a full fast-commit area, a journal that is not live yet (the
//! kernel's rule: fast commits only after a full commit), and changes made
//! outside a system call. A full commit also happens every commit interval
//! (the timer), and empties the area: the next fast commit starts with a
//! HEAD naming the new running transaction.
//!
//! # Inline commit and staging
//!
//! The commit is planned in the caller's thread, under the file-system
//! lock: the log is built from the cached inode images *now*, so changes
//! that arrive while the plan runs belong to the next commit (the kernel
//! needs a staging queue for that; ordo gets it from planning under the
//! lock). An fsync that finds nothing pending while an earlier commit's
//! plan is still queued adds only a flush after it in plan order: it waits
//! for that commit instead of writing again.
//!
//! # Selective flushing
//!
//! The fast-commit blocks and the file data they point to must be durable
//! before the TAIL is. When a commit writes no file data (and no data
//! written earlier is still unflushed) and its log fits in one block, that
//! block is written FUA and **no flush** is issued: FUA makes it durable on
//! its own, and nothing it names depends on a volatile write. Otherwise:
//! data home, the log blocks but the last, a flush, the last block FUA.
//! The crash explorer checks that this is enough; the test-only fault
//! `ORDO_FAULT=fc_skip_data_flush` drops the flush of commits that do
//! carry data, so that the explorer can be seen to catch it.
//!
//! # Replay
//!
//! See [`crate::fc_replay`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ordo_dev::{BlockClass, WriteFlags};
use ordo_format::fc::{Dentry, LogWriter, Tag};

use super::journal::JournalProtocol;
use super::{DataMode, Io, Protocol, ProtocolEnv, WriteBackReason};
use crate::error::Result;
use crate::update::{
    DataWrite, HandleInfo, Ino, InodeField, LinkOp, MapOp, OpKind, Update, UpdateKind,
};

/// What mount-time recovery learned that the protocol needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Handoff {
    pub uuid: [u8; 16],
    pub inode_size: usize,
    pub first_ino: u32,
}

thread_local! {
    pub(crate) static HANDOFF: RefCell<Option<Handoff>> = const { RefCell::new(None) };
}

/// Why a commit was a full one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// No full commit yet on a live log (the first fsync of a mount).
    NoLiveLog,
    /// Rename of a directory.
    RenameDir,
    /// RENAME_EXCHANGE, or a rename over an existing entry.
    CrossRename,
    /// fallocate (unwritten extents).
    Fallocate,
    /// data=journal.
    JournalData,
    /// An update the log has no tag for.
    Unsupported,
    /// A record too large for a block.
    TooLarge,
    /// The fast-commit area is full.
    AreaFull,
    /// No geometry from recovery (read-only or unrecovered mount).
    NoGeometry,
    /// A symlink or device node: its `i_block` holds the target or device
    /// number, which the kernel's replay of an INODE record does not copy.
    SpecialInode,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::NoLiveLog => "no_live_log",
            Reason::RenameDir => "rename_dir",
            Reason::CrossRename => "cross_rename",
            Reason::Fallocate => "fallocate",
            Reason::JournalData => "journal_data",
            Reason::Unsupported => "unsupported_update",
            Reason::TooLarge => "record_too_large",
            Reason::AreaFull => "area_full",
            Reason::NoGeometry => "no_geometry",
            Reason::SpecialInode => "symlink_or_device",
        }
    }
}

/// A test-only fault: skip the flush of a commit that writes data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `ORDO_FAULT=fc_skip_data_flush`.
    SkipDataFlush,
}

#[derive(Default, Clone, Copy)]
struct Stats {
    fast_commits: u64,
    full_commits: u64,
    single_block: u64,
    fc_blocks: u64,
    flushes: u64,
    fua_writes: u64,
    data_blocks: u64,
    waits: u64,
}

/// Logical changes since the last full commit not yet in a fast commit.
#[derive(Default)]
struct Pending {
    dentries: Vec<Tag>,
    /// Inodes changed, in first-change order.
    inodes: Vec<Ino>,
    inode_set: BTreeSet<Ino>,
    /// Inode slot (block, byte offset) of every inode seen.
    ranges: BTreeMap<Ino, Vec<Tag>>,
    /// Data blocks to write home before the tail.
    data: BTreeSet<u64>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.dentries.is_empty() && self.inodes.is_empty() && self.data.is_empty()
    }
}

/// The `mode=fast_commit` protocol.
pub struct FastCommitProtocol {
    journal: JournalProtocol,
    geo: Option<Handoff>,
    data_mode: DataMode,
    fault: Option<Fault>,
    pending: Pending,
    /// Where each inode lives in the cache: (block, offset).
    slots: BTreeMap<Ino, (u64, usize)>,
    /// Inodes created (whole-inode initialized) by the current handle.
    created_in_handle: BTreeSet<Ino>,
    /// Entries a rename handle changed: ((dir, name), op, ino).
    renamed_in_handle: Vec<((Ino, Vec<u8>), LinkOp, Ino)>,
    /// Set by an ineligible operation: the next commit is a full one.
    ineligible: Option<Reason>,
    /// Area blocks used since the last full commit (0: next one has HEAD).
    area_used: u32,
    /// tid the area's HEAD names.
    area_tid: u32,
    /// Fast-commit plans made and not yet run.
    in_flight: u64,
    reasons: BTreeMap<Reason, u64>,
    stats: Stats,
}

impl FastCommitProtocol {
    /// Build the protocol for a mount (after [`crate::fc_replay::recover`]
    /// on the same thread).
    pub fn new(env: &ProtocolEnv) -> Result<Self> {
        let geo = HANDOFF
            .with(|h| h.borrow_mut().take())
            .filter(|h| h.uuid == env.uuid);
        let journal = JournalProtocol::new_fast_commit(env)?;
        let fault = match std::env::var("ORDO_FAULT").ok().as_deref() {
            Some("fc_skip_data_flush") => Some(Fault::SkipDataFlush),
            _ => None,
        };
        Ok(FastCommitProtocol {
            journal,
            geo,
            data_mode: env.data_mode,
            fault,
            pending: Pending::default(),
            slots: BTreeMap::new(),
            created_in_handle: BTreeSet::new(),
            renamed_in_handle: Vec::new(),
            ineligible: None,
            area_used: 0,
            area_tid: 0,
            in_flight: 0,
            reasons: BTreeMap::new(),
            stats: Stats::default(),
        })
    }

    fn mark_ineligible(&mut self, r: Reason) {
        if self.ineligible.is_none() {
            self.ineligible = Some(r);
        }
    }

    fn track_inode(&mut self, ino: Ino) {
        if self.pending.inode_set.insert(ino) {
            self.pending.inodes.push(ino);
        }
    }

    /// A full commit of everything, through the journal; the area restarts.
    fn full_commit(&mut self, io: &mut Io, reason: Option<Reason>) -> Result<()> {
        if let Some(r) = reason {
            *self.reasons.entry(r).or_insert(0) += 1;
        }
        self.journal.fsync(0, false, io)?;
        self.after_full_commit();
        Ok(())
    }

    fn after_full_commit(&mut self) {
        self.stats.full_commits += 1;
        self.pending = Pending::default();
        self.ineligible = None;
        self.area_used = 0;
    }

    /// The raw inode to log: the first 128 bytes plus `i_extra_isize`.
    fn raw_inode(&self, io: &Io, ino: Ino, isz: usize) -> Option<Vec<u8>> {
        let &(block, off) = self.slots.get(&ino)?;
        let img = io.snapshot(block)?;
        let slot = &img[off..off + isz];
        let extra = if isz > 128 {
            u16::from_le_bytes([slot[0x80], slot[0x81]]) as usize
        } else {
            0
        };
        Some(slot[..(128 + extra).min(isz)].to_vec())
    }

    /// Whether `ino` is a directory, from its cached inode.
    fn is_dir(&self, io: &Io, ino: Ino) -> bool {
        let Some(&(block, off)) = self.slots.get(&ino) else {
            return false;
        };
        io.snapshot(block)
            .map(|img| u16::from_le_bytes([img[off], img[off + 1]]) & 0o170000 == 0o040000)
            .unwrap_or(false)
    }

    /// Whether `ino` has no links left (deleted, or open but unlinked).
    /// The kernel never logs such an inode (eviction takes it off the
    /// fast-commit list), and its replay of an INODE record without links
    /// fails (`ext4_iget` refuses it): the UNLINK that dropped the last
    /// link is what replay needs.
    fn is_deleted(&self, io: &Io, ino: Ino) -> bool {
        let Some(&(block, off)) = self.slots.get(&ino) else {
            return false;
        };
        io.snapshot(block)
            .map(|img| u16::from_le_bytes([img[off + 0x1A], img[off + 0x1B]]) == 0)
            .unwrap_or(false)
    }

    /// Plan a fast commit of everything pending, or fall back.
    fn commit(&mut self, io: &mut Io) -> Result<()> {
        if self.pending.is_empty() && self.ineligible.is_none() {
            if self.in_flight > 0 {
                // A commit with these changes is queued: wait for it.
                io.flush();
                self.stats.flushes += 1;
                self.stats.waits += 1;
            }
            return Ok(());
        }
        let Some(geo) = self.geo else {
            return self.full_commit(io, Some(Reason::NoGeometry));
        };
        if let Some(r) = self.ineligible {
            return self.full_commit(io, Some(r));
        }
        if !self.journal.log_is_live() {
            return self.full_commit(io, Some(Reason::NoLiveLog));
        }
        let tid = self.journal.running_tid();
        if self.area_used > 0 && self.area_tid != tid {
            // A full commit happened through another path (timer, size).
            self.area_used = 0;
        }
        let bs = io.block_size() as usize;
        let mut w = LogWriter::new(bs);
        let mut ok = true;
        if self.area_used == 0 {
            ok &= w.add(&Tag::Head { features: 0, tid }).is_ok();
        }
        let dentries = std::mem::take(&mut self.pending.dentries);
        for d in &dentries {
            if let Tag::Creat(de) = d {
                if self.is_deleted(io, de.ino) {
                    // Created and deleted since the last commit.
                    self.pending.ranges.remove(&de.ino);
                    continue;
                }
                if let Some(raw) = self.raw_inode(io, de.ino, geo.inode_size) {
                    ok &= w.add(&Tag::Inode { ino: de.ino, raw }).is_ok();
                }
                let ranges = self.pending.ranges.remove(&de.ino).unwrap_or_default();
                if !self.is_dir(io, de.ino) {
                    for t in ranges {
                        ok &= w.add(&t).is_ok();
                    }
                }
            }
            ok &= w.add(d).is_ok();
        }
        for &ino in &self.pending.inodes {
            // Directories are not logged block by block (replay re-adds
            // their entries) nor as inodes, as in the kernel.
            if self.is_dir(io, ino) || self.is_deleted(io, ino) {
                continue;
            }
            for t in self.pending.ranges.remove(&ino).unwrap_or_default() {
                ok &= w.add(&t).is_ok();
            }
            if let Some(raw) = self.raw_inode(io, ino, geo.inode_size) {
                ok &= w.add(&Tag::Inode { ino, raw }).is_ok();
            }
        }
        if !ok {
            return self.full_commit(io, Some(Reason::TooLarge));
        }
        let (map, jsb) = self.journal.geometry();
        let Some((first, n)) = crate::fc_replay::fc_area(jsb) else {
            return self.full_commit(io, Some(Reason::AreaFull));
        };
        let need = w.blocks_when_closed() as u32;
        if self.area_used + need > n {
            return self.full_commit(io, Some(Reason::AreaFull));
        }
        let phys: Vec<u64> = (0..need)
            .map(|i| {
                map.phys(first + self.area_used + i)
                    .expect("area is mapped")
            })
            .collect();
        let blocks = w.finish(tid);
        debug_assert_eq!(blocks.len(), need as usize);
        // Data the log points to goes home first.
        let mut wrote_data = false;
        for &b in &std::mem::take(&mut self.pending.data) {
            if io.is_dirty(b) {
                io.write_home(b, false);
                wrote_data = true;
                self.stats.data_blocks += 1;
            }
        }
        let unflushed_before = self.data_mode == DataMode::Writeback;
        let single = blocks.len() == 1;
        let last = blocks.len() - 1;
        for (i, (img, p)) in blocks.into_iter().zip(&phys).enumerate() {
            if i == last {
                let skip = self.fault == Some(Fault::SkipDataFlush) && wrote_data;
                // Selective flushing: a lone block with nothing volatile
                // under it needs no flush; its FUA makes it durable.
                let needs_flush = !single || wrote_data || unflushed_before;
                if needs_flush && !skip {
                    io.flush();
                    self.stats.flushes += 1;
                }
                io.write_raw(*p, Arc::new(img), WriteFlags::fua(BlockClass::FastCommit));
                self.stats.fua_writes += 1;
            } else {
                io.write_raw(*p, Arc::new(img), WriteFlags::new(BlockClass::FastCommit));
            }
        }
        self.stats.fc_blocks += need as u64;
        if single {
            self.stats.single_block += 1;
        }
        self.stats.fast_commits += 1;
        self.area_used += need;
        self.area_tid = tid;
        self.pending = Pending::default();
        self.in_flight += 1;
        io.set_tag(FC_TAG);
        Ok(())
    }
}

/// Plan tag of fast commits (journal tags are tid + 1, far below).
const FC_TAG: u64 = 1 << 63;

impl Protocol for FastCommitProtocol {
    fn name(&self) -> &'static str {
        "fast_commit"
    }

    fn on_update(&mut self, u: &Update, h: &HandleInfo) {
        self.journal.on_update(u, h);
        let first_ino = self.geo.map(|g| g.first_ino).unwrap_or(11);
        match &u.kind {
            UpdateKind::Inode { ino, field } => {
                if let Some(g) = self.geo {
                    let slot = (u.range.start as usize / g.inode_size) * g.inode_size;
                    self.slots.insert(*ino, (u.block, slot));
                }
                if *field == InodeField::Whole && u.new.iter().any(|&b| b != 0) {
                    self.created_in_handle.insert(*ino);
                }
                if *ino < first_ino && *ino != crate::types::ROOT_INO {
                    self.mark_ineligible(Reason::Unsupported);
                }
                match h.op {
                    OpKind::Internal => self.mark_ineligible(Reason::Unsupported),
                    OpKind::Fallocate => self.mark_ineligible(Reason::Fallocate),
                    OpKind::Symlink | OpKind::Mknod => self.mark_ineligible(Reason::SpecialInode),
                    _ => {}
                }
                self.track_inode(*ino);
            }
            UpdateKind::Extent {
                ino,
                lblk,
                pblk,
                len,
                op,
            } => {
                if *len == 0 {
                    return;
                }
                if h.op == OpKind::Fallocate {
                    self.mark_ineligible(Reason::Fallocate);
                }
                let t = match op {
                    MapOp::Set => Tag::AddRange {
                        ino: *ino,
                        lblk: *lblk,
                        pblk: *pblk,
                        len: *len,
                        unwritten: false,
                    },
                    MapOp::Clear => Tag::DelRange {
                        ino: *ino,
                        lblk: *lblk,
                        len: *len,
                    },
                };
                // A node write reports its header and entries as two
                // updates of the same mapping: log it once.
                let list = self.pending.ranges.entry(*ino).or_default();
                if list.last() != Some(&t) {
                    list.push(t);
                }
                self.track_inode(*ino);
            }
            UpdateKind::Dirent { dir, name, ino, op } => {
                if name == b".." {
                    // Only a directory moving to another parent changes it.
                    self.mark_ineligible(Reason::RenameDir);
                    return;
                }
                if name == b"." {
                    return;
                }
                let de = Dentry {
                    parent: *dir,
                    ino: *ino,
                    name: name.clone(),
                };
                let t = match op {
                    LinkOp::Add if self.created_in_handle.contains(ino) => Tag::Creat(de),
                    LinkOp::Add => Tag::Link(de),
                    LinkOp::Remove => Tag::Unlink(de),
                };
                if h.op == OpKind::Rename {
                    let key = (*dir, name.clone());
                    if self
                        .renamed_in_handle
                        .iter()
                        .any(|(k, o, _)| *k == key && *o != *op)
                    {
                        // The same name removed and added: a rename over an
                        // existing entry or an exchange.
                        self.mark_ineligible(Reason::CrossRename);
                    }
                    self.renamed_in_handle.push((key, *op, *ino));
                }
                self.pending.dentries.push(t);
            }
            UpdateKind::ExtentBlockInit { .. }
            | UpdateKind::DirBlockInit { .. }
            | UpdateKind::Bitmap { .. }
            | UpdateKind::Counter { .. }
            | UpdateKind::Checksum
            | UpdateKind::Other => {}
        }
    }

    fn on_data_write(&mut self, w: &DataWrite, h: &HandleInfo) {
        self.journal.on_data_write(w, h);
        if self.data_mode == DataMode::Journal {
            self.mark_ineligible(Reason::JournalData);
        }
        self.pending.data.insert(w.pblk);
        self.track_inode(w.ino);
    }

    fn on_block_freed(&mut self, block: u64, h: &HandleInfo) {
        self.journal.on_block_freed(block, h);
        self.pending.data.remove(&block);
    }

    fn on_handle_end(&mut self, h: &HandleInfo, io: &mut Io) -> Result<()> {
        self.created_in_handle.clear();
        // A renamed directory: replay cannot move it (its "..", the link
        // counts of both parents).
        let renamed = std::mem::take(&mut self.renamed_in_handle);
        if renamed.iter().any(|(_, _, ino)| self.is_dir(io, *ino)) {
            self.mark_ineligible(Reason::RenameDir);
        }
        let before = self.journal.running_tid();
        self.journal.on_handle_end(h, io)?;
        if self.journal.running_tid() != before {
            self.after_full_commit();
        }
        Ok(())
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.commit(io)
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.full_commit(io, None)
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.journal.write_back(reason, io)?;
        self.after_full_commit();
        Ok(())
    }

    fn prepare_block_write(&mut self, block: u64, image: &mut [u8]) {
        self.journal.prepare_block_write(block, image);
    }

    fn can_allocate(&self, block: u64) -> bool {
        self.journal.can_allocate(block)
    }

    fn plan_done(&mut self, tag: u64, ok: bool) {
        if tag == FC_TAG {
            self.in_flight = self.in_flight.saturating_sub(1);
            if !ok {
                self.mark_ineligible(Reason::Unsupported);
            }
            return;
        }
        self.journal.plan_done(tag, ok);
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let s = self.stats;
        let mut v = vec![
            ("fc_fast_commits".into(), s.fast_commits),
            ("fc_full_commits".into(), s.full_commits),
            ("fc_single_block_commits".into(), s.single_block),
            ("fc_blocks_written".into(), s.fc_blocks),
            ("fc_flushes_planned".into(), s.flushes),
            ("fc_fua_writes_planned".into(), s.fua_writes),
            ("fc_data_blocks".into(), s.data_blocks),
            ("fc_waits".into(), s.waits),
            ("fc_area_used_blocks".into(), self.area_used as u64),
        ];
        for (r, n) in &self.reasons {
            v.push((format!("fc_ineligible_{}", r.name()), *n));
        }
        for (k, n) in self.journal.stats() {
            v.push((format!("jbd2_{k}"), n));
        }
        v
    }
}
