//! `mode=fast_commit`: ext4 fast commits (Shirwadkar et al., ATC '24) on
//! top of JBD2, in the kernel's on-disk format.
//!
//! # What is logged
//!
//! Between two full (JBD2) commits the protocol keeps, from the update
//! interface, the *logical* changes: the directory-entry changes in the
//! order they happened (`UpdateKind::Dirent`: an entry added by a create
//! is a CREAT, any other addition a LINK, a removal an UNLINK), the inodes
//! whose fields changed (`UpdateKind::Inode`), and per inode the net effect
//! of the mappings set and cleared (`UpdateKind::Extent` with a length):
//! what each touched logical block maps now, logged as the kernel's
//! `ext4_fc_write_inode_data` logs it, ADD_RANGEs of the mapped runs and
//! DEL_RANGEs of the holes, never the history (e2fsck's replay of a
//! history that deletes an inode's only extent and then maps it again
//! corrupts the inode). Directories are not logged block by block: replay
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
//! directory (its ".." changes) and cross-rename, mkdir and rmdir (see
//! below), fallocate (unwritten extents are not reported), data=journal,
//! symlinks and device nodes (their `i_block` content, which the kernel's
//! INODE replay does not copy), an inode with an attribute block (the
//! kernel's replay recounts its `i_blocks` without it), an update of a
//! special inode, a record
//! too large for a block, a full fast-commit area (a commit that would need the area's
//! last block, which ordo never uses: see `docs/FORMAT.md`), a journal that is not live yet (the
//! kernel's rule: fast commits only after a full commit), and changes made
//! outside a system call. A full commit also happens every commit interval
//! (the timer), and empties the area: the next fast commit starts with a
//! HEAD naming the new running transaction.
//!
//! # What e2fsck and the kernel need beyond the format
//!
//! The kernel and e2fsck 1.47.0 replay the same log differently, and each
//! has gaps that the format alone does not close; ordo writes so that ordo,
//! `e2fsck -fy` and a kernel mount replay a crashed image to the same tree,
//! `e2fsck -fn` clean (`tests/fast_commit_protocol.rs`; the kernel's own
//! logs in `tests/fast_commit_kernel.rs`):
//!
//! - e2fsck replays the fast commits with state it read *before* it
//!   replayed the JBD2 log: the superblock (its replay writes back only
//!   the 16-bit words it changed, with a checksum over its own stale copy,
//!   so a superblock the log changed fails its checksum at e2fsck's
//!   re-open), the group descriptors (written back whole; a group the log
//!   started using still looks `INODE_UNINIT`) and the inode-table block
//!   of the journal inode (libext2fs's one-block inode buffer, through
//!   which it also writes inodes back, reverting what the JBD2 replay put
//!   in that block). So the first fast commit on top of a full commit
//!   that logged any of these blocks first writes their committed copies
//!   home, with the bitmaps (whose checksums the descriptors carry), FUA
//!   (`JournalProtocol::write_pre_replay_home`, counted as
//!   `fc_pre_replay_home_writes`). The copies are committed and still in
//!   the log, so this early checkpoint is always safe; FUA keeps a
//!   one-block commit flush-free.
//! - mkdir and rmdir are full commits. The kernel logs a new directory as
//!   INODE + CREAT and builds its "." / ".." block at replay; e2fsck has
//!   no such step (it clears the empty directory and loses what was
//!   created in it), and the kernel's own replay leaves the link counts,
//!   `i_blocks` and the group's directory count wrong. A removed directory
//!   fares no better. Their kernel-format logs cannot be replayed right by
//!   either, so ordo does not write them.
//! - A file's last link removed: e2fsck replays the UNLINK by removing
//!   the entry only and then reconnects the inode to lost+found, with the
//!   kernel's logs as with ordo's; the kernel and ordo free it. This one is
//!   left as the kernel has it (a full commit per delete would cost every
//!   delete-and-fsync workload for a difference that loses nothing).
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
//! data home, the log blocks but the last, a flush, the last block FUA
//! (for the first commit of the area, the HEAD's block goes last instead:
//! the kernel's scan fails the recovery on a HEAD whose commit is cut off
//! before any TAIL, see the commit code).
//! The crash explorer checks that this is enough; the test-only fault
//! `ORDO_FAULT=fc_skip_data_flush` drops the flush of commits that do
//! carry data, so that the explorer can be seen to catch it.
//!
//! # Replay
//!
//! See [`crate::fc_replay`].

pub mod replay;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ordo_dev::{BlockClass, WriteFlags};
use ordo_format::fc::{Dentry, LogWriter, Tag};

use super::jbd2::JournalProtocol;
use super::{
    AfterCrash, Capabilities, DataMode, Io, PlanDone, Protocol, ProtocolEnv, ProtocolSpec,
    Recovered, WriteBackReason,
};
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

/// `mode=fast_commit`: ext4 fast commit on top of JBD2.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "fast_commit",
    summary: "ext4 fast commit: logical fsync records between JBD2 commits",
    variants: &[],
    mkfs_features: "has_journal,fast_commit",
    caps: Capabilities {
        group_commit: true,
        group_commit_per_stream: false,
        log_replay: true,
        kernel_replays: true,
        after_crash: AfterCrash::ConsistentAfterReplay,
        data_modes: true,
        settle_with_sync: true,
        stale_data_with_writeback: true,
        scheduler: false,
        prefix_after_crash: false,
        stream_prefix_after_crash: false,
        backlinks: false,
        data_consistent_after_scan: false,
        log_incompat: 0,
    },
    recover: replay::recover,
    build,
};

fn build(mut recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(FastCommitProtocol::new(env, &mut recovered)?))
}

/// Why a commit was a full one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// No full commit yet on a live log (the first fsync of a mount).
    NoLiveLog,
    /// Rename of a directory.
    RenameDir,
    /// mkdir or rmdir: a directory created or removed. Neither e2fsck
    /// (1.47.0) nor the kernel replays one from the log consistently, the
    /// kernel's own logs no more than ordo's (see the module header).
    DirCreateRemove,
    /// RENAME_EXCHANGE, or a rename over an existing entry.
    CrossRename,
    /// fallocate (unwritten extents).
    Fallocate,
    /// fallocate COLLAPSE_RANGE or INSERT_RANGE (extents shifted), as the
    /// kernel's EXT4_FC_REASON_FALLOC_RANGE.
    FallocRange,
    /// data=journal.
    JournalData,
    /// An update the log has no tag for.
    Unsupported,
    /// A record too large for a block.
    TooLarge,
    /// The fast-commit area is full (ordo never uses its last block).
    AreaFull,
    /// No geometry from recovery (read-only or unrecovered mount).
    NoGeometry,
    /// A symlink or device node: its `i_block` holds the target or device
    /// number, which the kernel's replay of an INODE record does not copy.
    SpecialInode,
    /// A directory's `EXT4_INDEX_FL` cleared (ordo's core drops an htree
    /// before its first change and rewrites the index blocks as linear
    /// ones): the log has no tag for directory blocks, so a fast commit
    /// would leave replay an unindexed inode over dx blocks.
    HtreeConversion,
    /// A directory grew a block. The log has no tag for directory blocks:
    /// each replay re-adds the entries and places them itself, and they do
    /// not agree. The kernel's replay allocates a block where ordo's fits
    /// the entries in place, and e2fsck's `ext2fs_link` does not grow a
    /// full directory at all and drops the entries (found by the crash
    /// explorer's kernel/e2fsck judge on the `mix` workload). A full commit
    /// journals the new block instead.
    DirGrow,
    /// An extended attribute or ACL changed: the log has no tag for
    /// attributes (the kernel's `EXT4_FC_REASON_XATTR`).
    Xattr,
    /// An inode to log has an attribute block: the kernel's replay would
    /// recount its `i_blocks` without it (see the commit code).
    AttrBlock,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::NoLiveLog => "no_live_log",
            Reason::RenameDir => "rename_dir",
            Reason::DirCreateRemove => "mkdir_rmdir",
            Reason::CrossRename => "cross_rename",
            Reason::Fallocate => "fallocate",
            Reason::FallocRange => "falloc_range",
            Reason::JournalData => "journal_data",
            Reason::Unsupported => "unsupported_update",
            Reason::TooLarge => "record_too_large",
            Reason::AreaFull => "area_full",
            Reason::NoGeometry => "no_geometry",
            Reason::SpecialInode => "symlink_or_device",
            Reason::HtreeConversion => "htree_conversion",
            Reason::DirGrow => "dir_grow",
            Reason::Xattr => "xattr",
            Reason::AttrBlock => "attr_block",
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
    pre_replay_writes: u64,
    stale_head_clears: u64,
}

/// Logical changes since the last full commit not yet in a fast commit.
#[derive(Default)]
struct Pending {
    dentries: Vec<Tag>,
    /// Inodes changed, in first-change order.
    inodes: Vec<Ino>,
    inode_set: BTreeSet<Ino>,
    /// Per inode, what its touched logical blocks map now.
    ranges: BTreeMap<Ino, NetRanges>,
    /// Data blocks to write home before the tail.
    data: BTreeSet<u64>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.dentries.is_empty() && self.inodes.is_empty() && self.data.is_empty()
    }
}

/// The longest initialized extent an ADD_RANGE can carry (`ee_len`).
const ADD_RANGE_MAX_BLOCKS: u64 = 32768;

/// The net effect of one inode's mapping changes since its last commit:
/// for each logical block touched, the physical block it maps now, or a
/// hole. The log carries this state, not the history of changes, as the
/// kernel's `ext4_fc_write_inode_data` does (it walks the current mapping
/// of the touched range): the ADD_RANGEs of the mapped runs, then the
/// DEL_RANGEs of the holes. The two sets are disjoint, so any order
/// replays the same; adds first keeps e2fsck 1.47.0 away from a bug of its
/// extent list (a DEL_RANGE that removes an inode's only extent leaves a
/// zero-length entry that a following range tag of the same inode turns
/// into an extent of about 2^32 blocks).
#[derive(Default, Clone, Debug)]
struct NetRanges {
    /// Disjoint runs: first logical block -> (end, exclusive; physical
    /// block of the first, or `None` for a hole).
    runs: BTreeMap<u64, (u64, Option<u64>)>,
}

impl NetRanges {
    /// Logical blocks `lblk .. lblk + len` now map to `pblk ..` (or to
    /// nothing).
    fn set(&mut self, lblk: u64, len: u64, pblk: Option<u64>) {
        if len == 0 {
            return;
        }
        let end = lblk + len;
        let mut hits: Vec<u64> = Vec::new();
        if let Some((&s, &(e, _))) = self.runs.range(..lblk).next_back() {
            if e > lblk {
                hits.push(s);
            }
        }
        hits.extend(self.runs.range(lblk..end).map(|(&s, _)| s));
        for s in hits {
            let (e, p) = self.runs.remove(&s).expect("a run found above");
            if s < lblk {
                self.runs.insert(s, (lblk, p));
            }
            if e > end {
                self.runs.insert(end, (e, p.map(|p| p + (end - s))));
            }
        }
        self.runs.insert(lblk, (end, pblk));
        debug_assert!(self
            .runs
            .iter()
            .zip(self.runs.iter().skip(1))
            .all(|((_, (e, _)), (s2, _))| e <= s2));
    }

    /// The tags that bring a replayed inode to this state: adds, then
    /// deletes, adjacent runs merged.
    fn tags(&self, ino: Ino) -> Vec<Tag> {
        let mut merged: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for (&s, &(e, p)) in &self.runs {
            if let Some((ms, me, mp)) = merged.last_mut() {
                let continues = *me == s
                    && match (*mp, p) {
                        (None, None) => true,
                        (Some(a), Some(b)) => a + (s - *ms) == b,
                        _ => false,
                    };
                if continues {
                    *me = e;
                    continue;
                }
            }
            merged.push((s, e, p));
        }
        let mut adds = Vec::new();
        let mut dels = Vec::new();
        for (s, e, p) in merged {
            let mut at = s;
            while at < e {
                match p {
                    Some(p) => {
                        let n = (e - at).min(ADD_RANGE_MAX_BLOCKS);
                        adds.push(Tag::AddRange {
                            ino,
                            lblk: at as u32,
                            pblk: p + (at - s),
                            len: n as u32,
                            unwritten: false,
                        });
                        at += n;
                    }
                    None => {
                        let n = (e - at).min(u32::MAX as u64);
                        dels.push(Tag::DelRange {
                            ino,
                            lblk: at as u32,
                            len: n as u32,
                        });
                        at += n;
                    }
                }
            }
        }
        adds.extend(dels);
        adds
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
    /// The tid of the HEAD in the area's first block, until a full commit
    /// of that transaction makes it stale and it is cleared.
    area_head: Option<u32>,
    /// Fast-commit plans made and not yet run.
    in_flight: u64,
    reasons: BTreeMap<Reason, u64>,
    stats: Stats,
}

impl FastCommitProtocol {
    /// Build the protocol for a mount (after [`replay::recover`]
    /// on the same thread).
    pub fn new(env: &ProtocolEnv, recovered: &mut Recovered) -> Result<Self> {
        let geo = recovered.take::<Handoff>().filter(|h| h.uuid == env.uuid);
        let journal = JournalProtocol::new_fast_commit(env, recovered)?;
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
            area_head: None,
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
        self.after_full_commit(io);
        Ok(())
    }

    fn after_full_commit(&mut self, io: &mut Io) {
        self.stats.full_commits += 1;
        self.pending = Pending::default();
        self.ineligible = None;
        self.area_used = 0;
        self.clear_stale_head(io);
    }

    /// Once the transaction whose fast commits the area holds is closed by
    /// a full commit, its HEAD is stale. The kernel's scan stops at it,
    /// but e2fsck (1.47) takes it for a corrupt journal and abandons the
    /// whole replay (docs/FORMAT.md, "e2fsck and a stale fast-commit
    /// HEAD"). So, in the same plan, after the commit block (FUA: durable
    /// first), the area's first block is zeroed, also FUA. Never earlier:
    /// without the full commit on disk, those fast commits are the only
    /// copy of what was fsynced.
    fn clear_stale_head(&mut self, io: &mut Io) {
        let Some(t) = self.area_head else {
            return;
        };
        if self.journal.running_tid() == t {
            // The transaction is still running: its fast commits are live.
            return;
        }
        let (map, jsb) = self.journal.geometry();
        if let Some(p) = replay::fc_area(jsb).and_then(|(first, _)| map.phys(first)) {
            let bs = io.block_size() as usize;
            io.write_raw(
                p,
                Arc::new(vec![0u8; bs]),
                WriteFlags::fua(BlockClass::FastCommit),
            );
            self.stats.fua_writes += 1;
            self.stats.stale_head_clears += 1;
        }
        self.area_head = None;
    }

    /// The raw inode to log: the whole slot, its in-inode attribute area
    /// included. The kernel logs only the first 128 bytes plus
    /// `i_extra_isize`, and its replay copies what the record holds over
    /// the slot on disk: a new inode in the slot of a freed one would get
    /// back the freed inode's attributes (found by the crash explorer's
    /// promise oracle). Every replay (the kernel's, e2fsck's, ordo's)
    /// copies the record's length, so the longer record is read the same
    /// way.
    fn raw_inode(&self, io: &Io, ino: Ino, isz: usize) -> Option<Vec<u8>> {
        let &(block, off) = self.slots.get(&ino)?;
        let img = io.snapshot(block)?;
        Some(img[off..off + isz].to_vec())
    }

    /// `f` of `ino`'s cached inode image (from its mode on), if cached.
    fn with_inode<T>(&self, io: &Io, ino: Ino, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let &(block, off) = self.slots.get(&ino)?;
        io.snapshot(block).map(|img| f(&img[off..]))
    }

    fn file_type(&self, io: &Io, ino: Ino) -> Option<u16> {
        self.with_inode(io, ino, |raw| {
            u16::from_le_bytes([raw[0], raw[1]]) & 0o170000
        })
    }

    /// Whether `ino` is a directory, from its cached inode.
    fn is_dir(&self, io: &Io, ino: Ino) -> bool {
        self.file_type(io, ino) == Some(0o040000)
    }

    /// Whether `ino` is a symbolic link, from its cached inode.
    fn is_symlink(&self, io: &Io, ino: Ino) -> bool {
        self.file_type(io, ino) == Some(0o120000)
    }

    /// Whether `ino` has an attribute block (`i_file_acl`), from its
    /// cached inode.
    fn has_attr_block(&self, io: &Io, ino: Ino) -> bool {
        self.with_inode(io, ino, |raw| crate::layout::ino::file_acl(raw) != 0)
            .unwrap_or(false)
    }

    /// Whether `ino` has no links left (deleted, or open but unlinked).
    /// The kernel never logs such an inode (eviction takes it off the
    /// fast-commit list), and its replay of an INODE record without links
    /// fails (`ext4_iget` refuses it): the UNLINK that dropped the last
    /// link is what replay needs.
    fn is_deleted(&self, io: &Io, ino: Ino) -> bool {
        self.with_inode(io, ino, |raw| {
            u16::from_le_bytes([raw[0x1A], raw[0x1B]]) == 0
        })
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
        // e2fsck (1.47) never replays a LINK or CREAT of a symlink: its
        // `ext4_fc_handle_link_and_create` returns on the symlink type
        // instead of linking, so a hard link or a rename of a symlink in a
        // fast commit would lose the new name in e2fsck's recovery (and a
        // rename the symlink itself). A full commit instead.
        if self
            .pending
            .dentries
            .iter()
            .any(|t| matches!(t, Tag::Link(de) | Tag::Creat(de) if self.is_symlink(io, de.ino)))
        {
            return self.full_commit(io, Some(Reason::SpecialInode));
        }
        // The kernel's INODE replay recounts `i_blocks` from the extent
        // tree alone (`ext4_ext_replay_set_iblocks`): an inode with an
        // attribute block comes out of it one block short, and a slow
        // symlink with one is then taken for a fast symlink, which
        // `ext4_iget` refuses, so the replay never marks its blocks in use
        // (`mix` seed 3156). The kernel's own logs have the same gap; ordo
        // logs such an inode with a full commit instead.
        let logged =
            self.pending
                .inodes
                .iter()
                .copied()
                .chain(self.pending.dentries.iter().filter_map(|t| match t {
                    Tag::Creat(de) => Some(de.ino),
                    _ => None,
                }));
        if logged
            .filter(|&ino| !self.is_dir(io, ino) && !self.is_deleted(io, ino))
            .any(|ino| self.has_attr_block(io, ino))
        {
            return self.full_commit(io, Some(Reason::AttrBlock));
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
        // Inodes created and deleted since the last commit: every name
        // they had after their CREAT was made and removed in that time, so
        // no tag of theirs goes to the log. e2fsck fails the whole replay
        // on an UNLINK of a name the directory does not hold
        // (`ext4_fc_handle_unlink`, "No free space in the directory"; `mix`
        // seed 3142).
        let mut gone: BTreeSet<Ino> = BTreeSet::new();
        for d in &dentries {
            if let Tag::Link(de) | Tag::Unlink(de) = d {
                if gone.contains(&de.ino) {
                    continue;
                }
            }
            if let Tag::Creat(de) = d {
                if self.is_deleted(io, de.ino) {
                    // Created and deleted since the last commit.
                    self.pending.ranges.remove(&de.ino);
                    gone.insert(de.ino);
                    continue;
                }
                if let Some(raw) = self.raw_inode(io, de.ino, geo.inode_size) {
                    ok &= w.add(&Tag::Inode { ino: de.ino, raw }).is_ok();
                }
                let ranges = self.pending.ranges.remove(&de.ino).unwrap_or_default();
                if !self.is_dir(io, de.ino) {
                    for t in ranges.tags(de.ino) {
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
            let ranges = self.pending.ranges.remove(&ino).unwrap_or_default();
            for t in ranges.tags(ino) {
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
        let Some((first, n)) = replay::fc_area(jsb) else {
            return self.full_commit(io, Some(Reason::AreaFull));
        };
        let need = w.blocks_when_closed() as u32;
        // Never the area's last block: when every block of the area holds
        // a valid fast commit, the kernel's and e2fsck's scan
        // (`fc_do_one_pass`) reads one block past the end of the journal
        // and fails the whole recovery (docs/FORMAT.md, "Fast commit").
        // A commit that would need it is a full commit instead.
        if self.area_used + need > n.saturating_sub(1) {
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
        // e2fsck replays fast commits against the superblock, descriptors
        // and journal inode-table block it read before its JBD2 replay:
        // their committed copies go home first (FUA, no flush).
        self.stats.pre_replay_writes += self.journal.write_pre_replay_home(io) as u64;
        // Data the log points to goes home first.
        let data: Vec<u64> = std::mem::take(&mut self.pending.data)
            .into_iter()
            .filter(|&b| io.is_dirty(b))
            .collect();
        let wrote_data = !data.is_empty();
        self.stats.data_blocks += data.len() as u64;
        io.write_home_runs(&data, false, super::MAX_RUN_BLOCKS);
        let unflushed_before = self.data_mode == DataMode::Writeback;
        let single = blocks.len() == 1;
        // Every block but one, one request per physically contiguous run
        // of the area; after the flush, that one, FUA. It is the tail's,
        // except for the first commit of the area when it takes several
        // blocks: then it is the HEAD's. The kernel's scan fails the whole
        // recovery (ECANCELED) when the area starts with a HEAD of the
        // expected tid whose records end, before any TAIL, in a block that
        // does not go on (a zero tag); with the HEAD written last the area
        // starts with a HEAD only once the commit is whole (`mix` seed 1390
        // recorded through FUSE). A later commit's first block without its
        // tail only ends the log: the commits before it count.
        let mut blocks = blocks;
        let head_last = self.area_used == 0 && !single;
        let (last, last_at, body_at) = if head_last {
            (blocks.remove(0), phys[0], &phys[1..])
        } else {
            let tail = blocks.pop().expect("a commit has a tail block");
            (tail, phys[blocks.len()], &phys[..])
        };
        let body = blocks
            .into_iter()
            .zip(body_at)
            .map(|(img, &p)| (p, BlockClass::FastCommit, Arc::new(img)));
        io.write_raw_runs(body, false);
        let skip = self.fault == Some(Fault::SkipDataFlush) && wrote_data;
        // Selective flushing: a lone block with nothing volatile under it
        // needs no flush; its FUA makes it durable.
        let needs_flush = !single || wrote_data || unflushed_before;
        if needs_flush && !skip {
            io.flush();
            self.stats.flushes += 1;
        }
        io.write_raw(
            last_at,
            Arc::new(last),
            WriteFlags::fua(BlockClass::FastCommit),
        );
        self.stats.fua_writes += 1;
        self.stats.fc_blocks += need as u64;
        if single {
            self.stats.single_block += 1;
        }
        self.stats.fast_commits += 1;
        if self.area_used == 0 {
            self.area_head = Some(tid);
        }
        self.area_used += need;
        self.area_tid = tid;
        self.pending = Pending::default();
        self.in_flight += 1;
        io.set_tag(FC_TAG);
        Ok(())
    }
}

/// Whether an `i_flags` update (its old and new bytes) clears
/// `EXT4_INDEX_FL`.
fn clears_index_flag(old: &[u8], new: &[u8]) -> bool {
    let index = ordo_format::inode::flags::INDEX;
    match (old.get(..4), new.get(..4)) {
        (Some(o), Some(n)) => {
            let o = u32::from_le_bytes(o.try_into().expect("4 bytes"));
            let n = u32::from_le_bytes(n.try_into().expect("4 bytes"));
            o & index != 0 && n & index == 0
        }
        _ => false,
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
                if *ino < first_ino && *ino != ordo_format::inode::ROOT_INO {
                    self.mark_ineligible(Reason::Unsupported);
                }
                match h.op {
                    OpKind::Internal => self.mark_ineligible(Reason::Unsupported),
                    OpKind::Mkdir | OpKind::Rmdir => self.mark_ineligible(Reason::DirCreateRemove),
                    OpKind::Fallocate => self.mark_ineligible(Reason::Fallocate),
                    OpKind::CollapseRange | OpKind::InsertRange => {
                        self.mark_ineligible(Reason::FallocRange)
                    }
                    OpKind::Symlink | OpKind::Mknod => self.mark_ineligible(Reason::SpecialInode),
                    _ => {}
                }
                if *field == InodeField::Flags && clears_index_flag(&u.old, &u.new) {
                    self.mark_ineligible(Reason::HtreeConversion);
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
                let ranges = self.pending.ranges.entry(*ino).or_default();
                match op {
                    MapOp::Set => ranges.set(*lblk as u64, *len as u64, Some(*pblk)),
                    MapOp::Clear => ranges.set(*lblk as u64, *len as u64, None),
                }
                self.track_inode(*ino);
            }
            // COLLAPSE_RANGE / INSERT_RANGE: the kernel marks the
            // transaction ineligible (FALLOC_RANGE), so a full commit
            // carries it.
            UpdateKind::ExtentTree { ino, .. } => {
                self.mark_ineligible(Reason::FallocRange);
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
            UpdateKind::DirBlockInit { .. } => self.mark_ineligible(Reason::DirGrow),
            UpdateKind::Xattr { .. }
            | UpdateKind::XattrBlockInit { .. }
            | UpdateKind::XattrRef { .. }
            | UpdateKind::XattrRefcount { .. } => self.mark_ineligible(Reason::Xattr),
            UpdateKind::ExtentBlockInit { .. }
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

    fn on_block_unallocated(&mut self, block: u64, h: &HandleInfo) {
        self.journal.on_block_unallocated(block, h);
        self.pending.data.remove(&block);
    }

    fn on_rollback(&mut self, _h: &HandleInfo) {
        // The log would carry the undone changes as history (a creation
        // and its removal, a range mapped then cleared): commit the blocks.
        self.mark_ineligible(Reason::Unsupported);
    }

    fn has_pending_frees(&self) -> bool {
        self.journal.has_pending_frees()
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
            self.after_full_commit(io);
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
        self.after_full_commit(io);
        Ok(())
    }

    fn prepare_block_write(&mut self, block: u64, image: &mut [u8]) {
        self.journal.prepare_block_write(block, image);
    }

    fn can_allocate(&self, block: u64) -> bool {
        self.journal.can_allocate(block)
    }

    fn plan_done(&mut self, done: &PlanDone) {
        let (tag, ok) = (done.tag, done.ok);
        if tag == FC_TAG {
            self.in_flight = self.in_flight.saturating_sub(1);
            if !ok {
                self.mark_ineligible(Reason::Unsupported);
            }
            return;
        }
        self.journal.plan_done(done);
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
            ("fc_pre_replay_home_writes".into(), s.pre_replay_writes),
            ("fc_stale_head_clears".into(), s.stale_head_clears),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn add(lblk: u32, pblk: u64, len: u32) -> Tag {
        Tag::AddRange {
            ino: 12,
            lblk,
            pblk,
            len,
            unwritten: false,
        }
    }

    fn del(lblk: u32, len: u32) -> Tag {
        Tag::DelRange { ino: 12, lblk, len }
    }

    #[test]
    fn net_ranges_log_the_state_not_the_history() {
        let mut r = NetRanges::default();
        // Mapped, unmapped, mapped again elsewhere: only the last counts.
        r.set(0, 1, Some(100));
        r.set(0, 1, None);
        r.set(0, 3, Some(200));
        assert_eq!(r.tags(12), vec![add(0, 200, 3)]);
        // Truncate to one block: the tail becomes a hole, logged after.
        r.set(1, 2, None);
        assert_eq!(r.tags(12), vec![add(0, 200, 1), del(1, 2)]);
        // Appending contiguously merges with the run before.
        r.set(1, 1, Some(201));
        assert_eq!(r.tags(12), vec![add(0, 200, 2), del(2, 1)]);
        // A write in the middle of a run splits it.
        r.set(1, 1, Some(500));
        assert_eq!(r.tags(12), vec![add(0, 200, 1), add(1, 500, 1), del(2, 1)]);
    }

    #[test]
    fn net_ranges_split_long_runs_and_keep_huge_holes() {
        let mut r = NetRanges::default();
        r.set(0, 40000, Some(1000));
        r.set(40000, u32::MAX as u64 - 40000, None);
        assert_eq!(
            r.tags(12),
            vec![
                add(0, 1000, 32768),
                add(32768, 1000 + 32768, 40000 - 32768),
                del(40000, u32::MAX - 40000),
            ]
        );
        // Two updates of the same mapping (a node's header and entries)
        // are one range.
        let mut r = NetRanges::default();
        r.set(5, 2, Some(9));
        r.set(5, 2, Some(9));
        assert_eq!(r.tags(12), vec![add(5, 9, 2)]);
    }
}
