//! `mode=journal`: JBD2 physical block journaling, in the real JBD2 format.
//!
//! # What is logged
//!
//! Whole block images. Every metadata block an operation handle changes
//! (`on_update`) joins the *running transaction*; with `data=journal` so
//! does every file-data block (`on_data_write`). Handles never straddle
//! transactions: a commit is only ever planned between handles (at handle
//! end, in `fsync`, `sync` or `write_back`), so every transaction holds
//! whole system calls, which is what makes a replayed image consistent.
//!
//! # When a transaction commits
//!
//! - `fsync` / `fdatasync` of *any* file, and `sync`: like ext4, a commit
//!   makes the whole running transaction durable;
//! - the commit interval (`write_back(Timer)`, `commit=`, default 5 s);
//! - the size bound: a transaction that reaches a quarter of the log
//!   commits at the end of the handle that filled it (the kernel's
//!   `j_max_transaction_buffers`);
//! - memory pressure and unmount (followed by a checkpoint).
//!
//! One transaction commits at a time while the next one runs: the commit
//! plan snapshots the block images (the running transaction that starts
//! right after may change the cached images again; the snapshots are what
//! the log and, later, the checkpoint write), and the core runs plans in
//! the order they were made.
//!
//! # The commit plan, and why each flush is there
//!
//! ```text
//!  [first commit of a mount: ext4 superblock with needs_recovery,
//!   journal superblock with s_start / s_sequence / features]
//!  data=ordered:   file data of the transaction -> home
//!  descriptor | copy | copy | ... | revoke        -> log (one write per contiguous run)
//!  FLUSH                  everything above is durable before ...
//!  commit block (FUA)     ... the commit block can be: a torn transaction
//!                         is one without a valid commit block
//!  data=writeback (timer commits only): file data -> home, unordered
//! ```
//!
//! That is one flush and one FUA write per commit, the least that orders
//! the commit block after its transaction. With `metadata_csum` the journal
//! carries checksums v3 (descriptor tails, per-copy tag checksums, revoke
//! tails, commit checksums); copies that begin with the JBD2 magic are
//! escaped.
//!
//! # Checkpoint
//!
//! A journaled block stays *dirty* in the cache (no `write_home`) until it
//! is checkpointed: writing it home earlier would expose uncommitted
//! changes after a crash. A checkpoint writes the **committed copy** (the
//! snapshot the log holds, not the cached image, which may already carry
//! the running transaction's changes) home with `write_raw`, flushes, and
//! only then advances the log tail in the journal superblock (FUA): the
//! log space is reused only once nothing in it is needed. The cached block
//! is marked clean when the plan ran if it was not changed since its
//! commit. Checkpoints happen when the log lacks room for the next commit
//! (a full journal forces a checkpoint instead of failing), when it is
//! half full at a timer tick, under memory pressure, and at unmount.
//!
//! One partial, early checkpoint exists, for `mode=fast_commit`
//! (`write_pre_replay_home`): the committed copies of the superblock, the
//! group descriptors, the bitmaps and the journal inode's inode-table
//! block, written home FUA (the tail does not move) before the first fast
//! commit on top of the commit that logged them, because e2fsck replays
//! fast commits against those blocks as it read them before its JBD2
//! replay (see `protocol::fast_commit`). Writing a committed copy home
//! while the log still holds it is what a checkpoint does anyway.
//!
//! # Revoke and reuse
//!
//! A block freed (`on_block_freed`) while a copy of it is in the live log
//! gets a revoke record in the running transaction, so that replay never
//! writes the stale copy over whatever the block holds next (a freed
//! metadata block reallocated as file data is the classic case). A block
//! freed by a transaction is not reallocated (`can_allocate`) until that
//! transaction's commit is durable, so no new owner's data can reach it
//! while a crash could still bring the old owner back.
//!
//! # needs_recovery
//!
//! As the kernel does, the ext4 `needs_recovery` flag is on while the file
//! system is mounted writable with a live log: the first commit of a mount
//! writes the superblock with the flag set before its commit block can be
//! durable, every logged or checkpointed copy of the superblock carries it,
//! and a clean unmount (everything checkpointed, `s_start = 0`) clears it
//! last. Without it the kernel would discard an ordo log at mount.
//!
//! # Recovery
//!
//! See [`crate::recovery`]: scan, revoke, replay, idempotent.
//!
//! # Test-only fault
//!
//! `ORDO_FAULT=commit_no_flush` in the environment when the protocol is
//! built drops the flush before the commit block, so that a commit block
//! can be durable before its transaction: the crash explorer must catch
//! it.

pub mod recovery;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rustc_hash::FxHashSet;

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};
use ordo_format::features::incompat;
use ordo_format::jbd2::{self, JournalFormat, JournalSuperblock};
use ordo_format::le::u32_at;
use ordo_format::superblock;

use super::{
    AfterCrash, Capabilities, DataMode, Io, PlanDone, Protocol, ProtocolEnv, ProtocolSpec,
    Recovered, WriteBackReason,
};
use crate::clock::Clock;
use crate::error::{FsError, Result};
use crate::update::{DataWrite, HandleInfo, Ino, Update};
use recovery::JournalMap;

/// The smallest journal (`JBD2_MIN_JOURNAL_BLOCKS`).
const MIN_JOURNAL_BLOCKS: u32 = 1024;

/// A fault injected on purpose, for proving that the crash explorer can
/// fail. Never set in normal use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Omit the flush between a transaction's blocks and its commit block.
    CommitNoFlush,
}

impl Fault {
    /// The fault named by `ORDO_FAULT`, if any.
    pub fn from_env() -> Option<Fault> {
        match std::env::var("ORDO_FAULT").ok().as_deref() {
            Some("commit_no_flush") => Some(Fault::CommitNoFlush),
            _ => None,
        }
    }
}

/// How a [`JournalProtocol`] orders a commit and what it waits for. JBD2's
/// rules ([`CommitRules::JBD2`]) put a flush before every commit block and
/// write it FUA, so a commit is durable when its plan has run. A journal
/// built on top may relax them (`mode=optimistic`): then the commit goes
/// out with its blocks, checksums make a torn transaction detectable, and
/// durability is learned from the device's durable horizon
/// ([`PlanDone::durable`]) instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CommitRules {
    /// Flush between a transaction's blocks and its commit block, and
    /// write the commit block FUA.
    pub barrier_commit: bool,
    /// Journal INCOMPAT bits set while the log is live (written with the
    /// first commit, cleared by a clean unmount or by recovery).
    pub live_incompat: u32,
    /// Journal checksums v3 even without `metadata_csum` (the kernel's
    /// `journal_checksum`): what detects a copy or descriptor that did not
    /// reach the disk when no flush orders them before the commit block.
    pub journal_checksums: bool,
    /// A checkpoint first flushes unless every commit is known durable:
    /// no committed copy goes home before its transaction, and every
    /// earlier one, is durable (OptFS's delayed checkpoint).
    pub checkpoint_after_durable: bool,
    /// Freed blocks become reusable only once the device's durable horizon
    /// covers the commit that freed them (OptFS's reuse after
    /// notification), rather than when its plan has run.
    pub reuse_after_durable: bool,
}

impl CommitRules {
    /// JBD2 as the kernel runs it.
    pub(crate) const JBD2: CommitRules = CommitRules {
        barrier_commit: true,
        live_incompat: 0,
        journal_checksums: false,
        checkpoint_after_durable: false,
        reuse_after_durable: false,
    };
}

/// What recovery learned about the journal, handed by value (in
/// [`Recovered`]) to the protocol built after it (the protocol itself
/// never reads the device).
#[derive(Clone)]
pub(crate) struct Handoff {
    uuid: [u8; 16],
    journal_runs: Vec<(u32, u64, u32)>,
    journal_sb: JournalSuperblock,
    /// The block holding the primary ext4 superblock, as on disk.
    super_block_image: Vec<u8>,
    /// [`recovery::e2fsck_pre_replay_blocks`] of the image.
    pre_replay_blocks: Vec<u64>,
}

/// `mode=journal`: JBD2 physical journaling.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "journal",
    summary: "JBD2 physical journaling (data=ordered, writeback or journal)",
    variants: &[],
    mkfs_features: "has_journal",
    caps: Capabilities {
        group_commit: true,
        log_replay: true,
        kernel_replays: true,
        after_crash: AfterCrash::ConsistentAfterReplay,
        data_modes: true,
        stale_data_with_writeback: true,
        ..Capabilities::NONE
    },
    recover,
    build,
};

fn build(mut recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(JournalProtocol::new(env, &mut recovered)?))
}

/// Mount-time recovery for `mode=journal`: replay the log, and hand the
/// journal superblock to [`JournalProtocol::new`].
pub fn recover(dev: &dyn BlockDevice, env: &ProtocolEnv) -> Result<Recovered> {
    recover_with(dev, env, None)
}

/// [`recover`] with a check of the scanned log before replay (see
/// [`recovery::recover_verified`]).
pub(crate) fn recover_with(
    dev: &dyn BlockDevice,
    env: &ProtocolEnv,
    verify: Option<recovery::VerifyScan>,
) -> Result<Recovered> {
    let runs = if env.journal_runs.is_empty() {
        None
    } else {
        Some(env.journal_runs.as_slice())
    };
    let (report, state) = recovery::recover_verified(dev, runs, verify)?;
    let Some((journal_sb, map)) = state else {
        return Err(FsError::Invalid(
            "mode=journal needs an image with a journal (has_journal)".into(),
        ));
    };
    let bs = dev.block_size();
    let mut super_block_image = vec![0u8; bs as usize];
    dev.read(
        recovery::super_block_nr(bs),
        &mut super_block_image,
        BlockClass::Super,
    )?;
    // Only fast commits need these. A journal found through the
    // superblock's backup of its extent root may have an inode the
    // descriptors cannot locate: then the superblock alone.
    let pre_replay_blocks = recovery::e2fsck_pre_replay_blocks(dev)
        .unwrap_or_else(|_| vec![recovery::super_block_nr(bs)]);
    let mut recovered = Recovered::with_report(report);
    recovered.put(Handoff {
        uuid: env.uuid,
        journal_runs: map.runs().to_vec(),
        journal_sb,
        super_block_image,
        pre_replay_blocks,
    });
    Ok(recovered)
}

/// The running transaction.
#[derive(Default)]
struct Running {
    tid: u32,
    /// Blocks to log (metadata; data too with data=journal). A hash set:
    /// every metadata change of every handle names its block here, most
    /// of them a block already named, and the commit sorts the set once.
    /// (A `BTreeSet` cost about 3,600 instructions per created file,
    /// three quarters of what `journal` spends over `async`.)
    logged: FxHashSet<u64>,
    /// File-data blocks to write home (ordered / writeback). A hash set
    /// too, for the same reason: every data block written is named here
    /// (a `BTreeSet` insert cost about 470 instructions a block); the
    /// commit orders them ([`JournalProtocol::running_data`] likewise).
    data: FxHashSet<u64>,
    /// Blocks to revoke.
    revoked: BTreeSet<u64>,
    /// Blocks freed by this transaction (not reusable until it is durable).
    freed: BTreeSet<u64>,
}

impl Running {
    fn is_empty(&self) -> bool {
        self.logged.is_empty()
            && self.data.is_empty()
            && self.revoked.is_empty()
            && self.freed.is_empty()
    }
}

/// A committed copy waiting for its checkpoint.
struct Committed {
    copy: Arc<Vec<u8>>,
    /// Cache generation of the block when the copy was taken.
    generation: u64,
    class: BlockClass,
}

/// Counters for `ordo info` and benchmarks.
#[derive(Default, Clone, Copy)]
struct Stats {
    commits: u64,
    log_blocks: u64,
    copies: u64,
    escaped: u64,
    revoke_records: u64,
    checkpoints: u64,
    checkpoint_blocks: u64,
    forced_checkpoints: u64,
    flushes: u64,
    fua_writes: u64,
    ordered_data_blocks: u64,
}

/// The `mode=journal` protocol.
pub struct JournalProtocol {
    data_mode: DataMode,
    fault: Option<Fault>,
    bs: u32,
    map: JournalMap,
    fmt: JournalFormat,
    /// The journal superblock as ordo last wrote it (or found it).
    sb: JournalSuperblock,
    /// Whether the on-disk journal superblock says what `sb` says.
    sb_on_disk: bool,
    /// The on-disk superblock block from recovery, to set needs_recovery
    /// at the first commit.
    super_image: Option<Vec<u8>>,
    /// needs_recovery is set on disk (or planned before any commit block).
    recover_flag_set: bool,
    super_block: u64,
    /// Log geometry: [first, last).
    first: u32,
    last: u32,
    /// Next log block to write.
    head: u32,
    /// Log blocks in use between the tail and the head.
    used: u32,
    /// Id of the oldest transaction in the live log (the tail's).
    tail_tid: u32,
    /// Largest transaction, in log blocks.
    max_txn_blocks: u32,
    running: Running,
    /// Blocks whose latest copy is in the live log, with that transaction.
    in_log: BTreeMap<u64, u32>,
    /// Latest committed copy of every block not yet checkpointed.
    committed: BTreeMap<u64, Committed>,
    /// Freed blocks not reusable until the freeing transaction is durable.
    freed_pending: BTreeMap<u64, u32>,
    /// The blocks e2fsck reads before its JBD2 replay and trusts during a
    /// fast-commit replay ([`recovery::e2fsck_pre_replay_blocks`]).
    pre_replay: BTreeSet<u64>,
    /// Those of them, and the bitmap blocks, whose latest committed copy
    /// is not home yet.
    pre_replay_behind: BTreeSet<u64>,
    /// Commit plans made but not yet run.
    in_flight: BTreeSet<u32>,
    /// A plan failed: the journal is aborted, as jbd2 does after an I/O error.
    aborted: bool,
    /// Built without recovery's hand-over: the on-disk journal state is
    /// unknown, so nothing may be committed.
    inert: bool,
    stats: Stats,
    /// The mount's clock: commit blocks carry the commit time.
    clock: Arc<dyn Clock>,
    rules: CommitRules,
    /// Commits whose plan has run but that are not known durable yet,
    /// with the last device ticket of their plan
    /// ([`CommitRules::reuse_after_durable`]).
    commit_tickets: BTreeMap<u32, ordo_dev::Ticket>,
    /// The device's durable horizon as last reported.
    horizon: ordo_dev::Ticket,
    /// Images to log in place of the cached ones at the next commit, with
    /// the cache generation each equals (0: none; the block then stays
    /// dirty after its checkpoint). `mode=streams` commits one stream's
    /// changes superimposed on a block's last committed image.
    image_override: BTreeMap<u64, (Arc<Vec<u8>>, u64)>,
    /// Dirty blocks no update reported join the committing transaction
    /// (off when several transactions run at once: another stream's).
    sweep: bool,
}

impl JournalProtocol {
    /// Build the protocol for a mount. A writable mount runs [`recover`]
    /// first: it hands over the journal superblock the protocol continues
    /// from (the protocol never reads the device). A protocol built without
    /// it (a read-only mount) refuses to commit.
    pub fn new(env: &ProtocolEnv, recovered: &mut Recovered) -> Result<Self> {
        Self::new_with(env, recovered, false, CommitRules::JBD2)
    }

    /// [`JournalProtocol::new`] under other commit rules (a protocol built
    /// on this journal, as `mode=optimistic` is).
    pub(crate) fn with_rules(
        env: &ProtocolEnv,
        recovered: &mut Recovered,
        rules: CommitRules,
    ) -> Result<Self> {
        Self::new_with(env, recovered, false, rules)
    }

    /// [`JournalProtocol::new`] for `mode=fast_commit`: as the kernel does
    /// at mount, set the journal's fast-commit feature, so that the log
    /// ends where the fast-commit area begins.
    pub(crate) fn new_fast_commit(env: &ProtocolEnv, recovered: &mut Recovered) -> Result<Self> {
        Self::new_with(env, recovered, true, CommitRules::JBD2)
    }

    fn new_with(
        env: &ProtocolEnv,
        recovered: &mut Recovered,
        fast_commit: bool,
        rules: CommitRules,
    ) -> Result<Self> {
        let handoff = recovered.take::<Handoff>().filter(|h| h.uuid == env.uuid);
        let fault = Fault::from_env();
        match handoff {
            Some(h) => {
                let mut env = env.clone();
                if env.journal_runs.is_empty() {
                    env.journal_runs = h.journal_runs;
                }
                let mut sb = h.journal_sb;
                if fast_commit {
                    sb.feature_incompat |= jbd2::FEATURE_INCOMPAT_FAST_COMMIT;
                }
                let mut p = Self::with_state(&env, sb, Some(h.super_block_image), fault, rules)?;
                p.pre_replay = h.pre_replay_blocks.into_iter().collect();
                Ok(p)
            }
            None => {
                // Read-only: nothing will be logged, so the journal's
                // geometry only has to be plausible.
                let mut env = env.clone();
                if env.journal_runs.is_empty() {
                    env.journal_runs = vec![(0, 0, MIN_JOURNAL_BLOCKS)];
                }
                let len = JournalMap::new(env.journal_runs.clone()).len_blocks;
                let sb = JournalSuperblock::new_internal(env.block_size, len, env.uuid);
                let mut p = Self::with_state(&env, sb, None, fault, rules)?;
                p.inert = true;
                Ok(p)
            }
        }
    }

    fn with_state(
        env: &ProtocolEnv,
        mut sb: JournalSuperblock,
        super_image: Option<Vec<u8>>,
        fault: Option<Fault>,
        rules: CommitRules,
    ) -> Result<Self> {
        let map = JournalMap::new(env.journal_runs.clone());
        if sb.start != 0 {
            return Err(FsError::Invalid(
                "mode=journal: the journal was not recovered".into(),
            ));
        }
        let bs = env.block_size;
        let super_block = recovery::super_block_nr(bs);
        let fs_64bit = super_image
            .as_ref()
            .map(|img| {
                let off = superblock::super_offset(bs) + superblock::off::FEATURE_INCOMPAT;
                u32_at(img, off) & incompat::INCOMPAT_64BIT != 0
            })
            .unwrap_or(false);
        // The features ordo writes with, as the kernel sets them at mount:
        // checksums v3 with metadata_csum, 64-bit tags with a 64-bit file
        // system, and revoke.
        let before = (sb.feature_compat, sb.feature_incompat, sb.checksum_type);
        sb.v2 = true;
        sb.feature_compat &= !jbd2::FEATURE_COMPAT_CHECKSUM;
        sb.feature_incompat &= !(jbd2::FEATURE_INCOMPAT_CSUM_V2
            | jbd2::FEATURE_INCOMPAT_CSUM_V3
            | jbd2::FEATURE_INCOMPAT_ASYNC_COMMIT
            | jbd2::FEATURE_INCOMPAT_ORDO_DATA_TAGS);
        sb.feature_incompat |= jbd2::FEATURE_INCOMPAT_REVOKE | rules.live_incompat;
        if env.metadata_csum || rules.journal_checksums {
            sb.feature_incompat |= jbd2::FEATURE_INCOMPAT_CSUM_V3;
            sb.checksum_type = jbd2::CHECKSUM_TYPE_CRC32C;
        } else {
            sb.checksum_type = 0;
        }
        if fs_64bit || env.block_count > u32::MAX as u64 {
            sb.feature_incompat |= jbd2::FEATURE_INCOMPAT_64BIT;
        }
        let sb_on_disk = before == (sb.feature_compat, sb.feature_incompat, sb.checksum_type);
        let first = sb.first;
        let last = sb.log_end();
        if last <= first + 8 || sb.maxlen > map.len_blocks {
            return Err(FsError::Invalid(format!(
                "journal log [{first}, {last}) of {} mapped blocks is too small",
                map.len_blocks
            )));
        }
        let fmt = sb.format();
        let recover_flag_set = super_image
            .as_ref()
            .map(|img| {
                let off = superblock::super_offset(bs) + superblock::off::FEATURE_INCOMPAT;
                u32_at(img, off) & incompat::RECOVER != 0
            })
            .unwrap_or(false);
        let tid = sb.sequence;
        Ok(JournalProtocol {
            clock: env.clock.clone(),
            data_mode: env.data_mode,
            fault,
            bs,
            fmt,
            first,
            last,
            head: first,
            used: 0,
            tail_tid: tid,
            max_txn_blocks: ((last - first) / 4).max(8),
            running: Running {
                tid,
                ..Default::default()
            },
            sb,
            sb_on_disk,
            super_image,
            recover_flag_set,
            super_block,
            map,
            in_log: BTreeMap::new(),
            committed: BTreeMap::new(),
            freed_pending: BTreeMap::new(),
            pre_replay: BTreeSet::new(),
            pre_replay_behind: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            aborted: false,
            inert: false,
            stats: Stats::default(),
            rules,
            commit_tickets: BTreeMap::new(),
            horizon: 0,
            image_override: BTreeMap::new(),
            sweep: true,
        })
    }

    /// The id of the running transaction (the one the next commit writes).
    pub(crate) fn running_tid(&self) -> u32 {
        self.running.tid
    }

    /// Whether the on-disk journal is live (`s_start != 0` as planned so
    /// far): what a fast commit on top of it needs, since recovery ignores
    /// a fast-commit area behind a clean journal.
    pub(crate) fn log_is_live(&self) -> bool {
        !self.inert && !self.aborted && self.stats.commits > 0 && self.sb.start != 0
    }

    /// Write home, FUA, the committed copies of the blocks e2fsck reads
    /// before its JBD2 replay ([`recovery::e2fsck_pre_replay_blocks`]), and
    /// of the bitmaps whose checksums the descriptors carry, that a commit
    /// logged since they were last written home; returns the writes
    /// planned. `mode=fast_commit` calls it before the first fast
    /// commit on top of such a commit. It is an early checkpoint of those
    /// few blocks and always safe: the copies are committed (plans run in
    /// order, and the commit block before this was written FUA), and the
    /// log still holds them. FUA, not a flush, so that a fast commit of one
    /// block still needs no flush.
    pub(crate) fn write_pre_replay_home(&mut self, io: &mut Io) -> u32 {
        let behind = std::mem::take(&mut self.pre_replay_behind);
        let copies = behind
            .into_iter()
            .filter_map(|b| self.committed.get(&b).map(|c| (b, c.class, c.copy.clone())));
        let writes = io.write_raw_runs(copies, true);
        self.stats.fua_writes += writes as u64;
        writes
    }

    /// The journal's block map and superblock (fast-commit area geometry).
    pub(crate) fn geometry(&self) -> (&JournalMap, &JournalSuperblock) {
        (&self.map, &self.sb)
    }

    fn log_len(&self) -> u32 {
        self.last - self.first
    }

    fn advance(&self, b: u32) -> u32 {
        jbd2::log_next(self.first, self.last, b)
    }

    /// Log blocks a transaction of `copies` copies and `revokes` revoke
    /// records takes.
    fn txn_blocks(&self, copies: usize, revokes: usize) -> u32 {
        jbd2::TransactionWriter::new(&self.fmt, 0).log_blocks(copies, revokes) as u32
    }

    fn check_alive(&self) -> Result<()> {
        if self.aborted {
            Err(FsError::Io(std::io::Error::other(
                "the journal was aborted after a failed write",
            )))
        } else {
            Ok(())
        }
    }

    fn flush(&mut self, io: &mut Io) {
        io.flush();
        self.stats.flushes += 1;
    }

    /// Plan a journal-superblock write (tail, sequence, features).
    fn write_journal_super(&mut self, io: &mut Io, fua: bool) {
        let p = self.map.phys(0).expect("journal block 0 is mapped");
        let data = Arc::new(self.sb.encode());
        let flags = if fua {
            self.stats.fua_writes += 1;
            WriteFlags::fua(BlockClass::Journal)
        } else {
            WriteFlags::new(BlockClass::Journal)
        };
        io.write_raw(p, data, flags);
        self.stats.log_blocks += 1;
        self.sb_on_disk = true;
    }

    /// Append log blocks (already encoded, in log order starting at
    /// `start`), one write per physically contiguous run.
    fn write_log(&mut self, io: &mut Io, start: u32, blocks: Vec<Arc<Vec<u8>>>) {
        let mut lb = start;
        let mut placed = Vec::with_capacity(blocks.len());
        for img in blocks {
            let p = self.map.phys(lb).expect("log block is mapped");
            placed.push((p, BlockClass::Journal, img));
            lb = self.advance(lb);
        }
        self.stats.log_blocks += placed.len() as u64;
        io.write_raw_runs(placed, false);
    }

    /// Write every committed copy home, flush, and move the tail to the
    /// head (the log is empty afterwards).
    pub(crate) fn checkpoint(&mut self, io: &mut Io) {
        if self.committed.is_empty() && self.used == 0 {
            return;
        }
        if self.rules.checkpoint_after_durable && !self.all_durable() {
            // No committed copy goes home before its transaction is durable.
            self.flush(io);
        }
        let committed = std::mem::take(&mut self.committed);
        for (&block, c) in &committed {
            debug_assert!(block != self.super_block || self.recover_flag_set);
            // Pinned so the core marks it clean once the copy is home.
            io.pin_until_done(block, c.generation);
        }
        self.stats.checkpoint_blocks += committed.len() as u64;
        // Home blocks ascending: neighbours of one class go in one write.
        io.write_raw_runs(
            committed.iter().map(|(&b, c)| (b, c.class, c.copy.clone())),
            false,
        );
        self.flush(io);
        self.in_log.clear();
        self.pre_replay_behind.clear();
        self.used = 0;
        self.tail_tid = self.running.tid;
        self.sb.start = self.head;
        self.sb.sequence = self.running.tid;
        self.write_journal_super(io, true);
        self.stats.checkpoints += 1;
    }

    /// The image to log for `block`: the cached one (the superblock with
    /// needs_recovery set); returns (copy, generation, class).
    fn take_copy(&mut self, io: &Io, block: u64) -> Option<(Arc<Vec<u8>>, u64, BlockClass)> {
        let (snap, gen) = match self.image_override.remove(&block) {
            Some(o) => o,
            None => (io.snapshot(block)?, io.generation(block)),
        };
        let class = io.class_of(block);
        if block == self.super_block {
            let mut img = (*snap).clone();
            recovery::set_recover_flag(&mut img, self.bs, true);
            return Some((Arc::new(img), gen, class));
        }
        Some((snap, gen, class))
    }

    /// Commit the running transaction (and checkpoint first when the log
    /// lacks room). `durable_data` writes writeback-mode data before the
    /// commit (fsync / sync) instead of after it.
    fn commit(&mut self, io: &mut Io, durable_data: bool) -> Result<()> {
        self.commit_with(io, durable_data, &[])
    }

    /// [`JournalProtocol::commit`] whose commit block carries `data_tags`
    /// (the fresh data blocks the transaction writes in place, checksummed
    /// as the plan writes them). Needs the relaxed rules.
    pub(crate) fn commit_with(
        &mut self,
        io: &mut Io,
        durable_data: bool,
        data_tags: &[jbd2::DataTag],
    ) -> Result<()> {
        debug_assert!(data_tags.is_empty() || !self.rules.barrier_commit);
        self.check_alive()?;
        if self.running.is_empty() {
            if durable_data && !self.in_flight.is_empty() {
                // An earlier commit is still queued: the caller's promise
                // needs it; a flush after it in plan order suffices.
                self.flush(io);
            }
            return Ok(());
        }
        if self.inert {
            return Err(FsError::Invalid(
                "mode=journal: protocol::recover must run before protocol::build on a writable mount"
                    .into(),
            ));
        }
        let tid = self.running.tid;
        if self.sweep {
            self.sweep_unreported(io);
        }
        // Blocks to log, with their committed copies taken now.
        let mut copies: Vec<(u64, Arc<Vec<u8>>, u64, BlockClass)> = Vec::new();
        let mut logged: Vec<u64> = std::mem::take(&mut self.running.logged)
            .into_iter()
            .collect();
        // The log holds a transaction's blocks in block order, as it did
        // when the set was ordered: the same records, the same bytes.
        logged.sort_unstable();
        let mut data: BTreeSet<u64> = std::mem::take(&mut self.running.data).into_iter().collect();
        for b in logged {
            if let Some((copy, gen, class)) = self.take_copy(io, b) {
                copies.push((b, copy, gen, class));
            }
        }
        let revoked: Vec<u64> = std::mem::take(&mut self.running.revoked)
            .into_iter()
            .collect();
        // A transaction larger than the whole log cannot be atomic; with
        // data=journal, move file data out of the log (ordered instead).
        let max = self.log_len() - 1;
        if self.txn_blocks(copies.len(), revoked.len()) > max {
            copies.retain(|c| {
                if c.3 == BlockClass::Data {
                    data.insert(c.0);
                    false
                } else {
                    true
                }
            });
            if self.txn_blocks(copies.len(), revoked.len()) > max {
                self.aborted = true;
                return Err(FsError::Errno(libc::ENOSPC));
            }
        }
        let need = self.txn_blocks(copies.len(), revoked.len());
        if self.used + need > self.log_len() - 1 {
            // A full journal forces a checkpoint instead of failing.
            self.stats.forced_checkpoints += 1;
            self.checkpoint(io);
        }
        // needs_recovery must be durable before any commit block is.
        if !self.recover_flag_set {
            match self.super_image.take() {
                Some(mut img) => {
                    recovery::set_recover_flag(&mut img, self.bs, true);
                    io.write_raw(
                        self.super_block,
                        Arc::new(img),
                        WriteFlags::new(BlockClass::Super),
                    );
                }
                None => {
                    if let Some((img, _, _)) = self.take_copy(io, self.super_block) {
                        if !io.is_dirty(self.super_block) {
                            io.write_raw(self.super_block, img, WriteFlags::new(BlockClass::Super));
                        }
                    }
                }
            }
            self.recover_flag_set = true;
        }
        if self.used == 0 && (self.sb.start != self.head || self.sb.sequence != tid) {
            // An empty log starts here: the tail moves to this transaction.
            self.sb.start = self.head;
            self.sb.sequence = tid;
            self.tail_tid = tid;
            self.sb_on_disk = false;
        }
        if !self.sb_on_disk {
            self.write_journal_super(io, false);
        }
        // Ordered data goes home before the commit block can be durable.
        let data_first = match self.data_mode {
            DataMode::Ordered | DataMode::Journal => true,
            DataMode::Writeback => durable_data,
        };
        if data_first {
            let dirty: Vec<u64> = data.iter().copied().filter(|&b| io.is_dirty(b)).collect();
            self.stats.ordered_data_blocks += dirty.len() as u64;
            io.write_home_runs(&dirty, false, super::MAX_RUN_BLOCKS);
        }
        // Descriptors and copies, then revoke blocks.
        let start = self.head;
        let writer = jbd2::TransactionWriter::new(&self.fmt, tid);
        let refs: Vec<(u64, &[u8])> = copies
            .iter()
            .map(|(b, copy, _, _)| (*b, copy.as_slice()))
            .collect();
        let mut log: Vec<Arc<Vec<u8>>> = Vec::with_capacity(need as usize);
        for block in writer.body(&refs, &revoked) {
            log.push(match block {
                jbd2::BodyBlock::Encoded(b) => Arc::new(b),
                jbd2::BodyBlock::Copy(i) => copies[i].1.clone(),
                jbd2::BodyBlock::Escaped(_, e) => {
                    self.stats.escaped += 1;
                    Arc::new(e)
                }
            });
        }
        drop(refs);
        self.stats.revoke_records += revoked.len() as u64;
        let body = log.len() as u32;
        self.write_log(io, start, log);
        let mut commit_at = start;
        for _ in 0..body {
            commit_at = self.advance(commit_at);
        }
        let now = self.clock.now();
        let p = self.map.phys(commit_at).expect("log block is mapped");
        if self.rules.barrier_commit {
            if self.fault != Some(Fault::CommitNoFlush) {
                self.flush(io);
            }
            let commit = writer.commit(now.sec.max(0) as u64, now.nsec);
            io.write_raw(p, Arc::new(commit), WriteFlags::fua(BlockClass::Journal));
            self.stats.fua_writes += 1;
        } else {
            // Ordered by checksums, not by a flush: the commit block goes
            // out with the transaction's blocks.
            let commit = jbd2::encode_commit_with_data_tags(
                &self.fmt,
                tid,
                now.sec.max(0) as u64,
                now.nsec,
                data_tags,
            )
            .map_err(|e| FsError::Invalid(format!("commit of transaction {tid}: {e}")))?;
            io.write_raw(p, Arc::new(commit), WriteFlags::new(BlockClass::Journal));
        }
        self.stats.log_blocks += 1;
        if !data_first {
            let dirty: Vec<u64> = data.iter().copied().filter(|&b| io.is_dirty(b)).collect();
            io.write_home_runs(&dirty, false, super::MAX_RUN_BLOCKS);
        }
        self.head = self.advance(commit_at);
        self.used += need;
        debug_assert_eq!(need, body + 1);
        // Bookkeeping: the copies await their checkpoint.
        for (b, copy, generation, class) in copies {
            // The bitmaps too: the descriptors carry their checksums, so a
            // descriptor block home without its bitmaps would not match
            // them for a tool that reads the image before any replay.
            if self.pre_replay.contains(&b) || class == BlockClass::GroupMeta {
                self.pre_replay_behind.insert(b);
            }
            self.in_log.insert(b, tid);
            self.committed.insert(
                b,
                Committed {
                    copy,
                    generation,
                    class,
                },
            );
            self.stats.copies += 1;
        }
        // Blocks this transaction freed: never checkpoint their old copies
        // (a later checkpoint runs after this commit is durable).
        for b in std::mem::take(&mut self.running.freed) {
            self.committed.remove(&b);
            self.freed_pending.insert(b, tid);
        }
        io.set_tag(tid as u64 + 1);
        self.in_flight.insert(tid);
        self.stats.commits += 1;
        self.running = Running {
            tid: tid.wrapping_add(1),
            ..Default::default()
        };
        Ok(())
    }

    /// Dirty blocks the running transaction does not know about: file
    /// data written without a report, metadata changed without an update.
    /// The core reports every change, so this finds nothing in a correct
    /// core; it keeps a missed report from becoming a lost write.
    fn sweep_unreported(&mut self, io: &Io) {
        for b in io.dirty_blocks() {
            if self.running.logged.contains(&b) || self.running.data.contains(&b) {
                continue;
            }
            let awaiting_checkpoint = self
                .committed
                .get(&b)
                .is_some_and(|c| c.generation == io.generation(b));
            if awaiting_checkpoint {
                continue;
            }
            // Unordered file data may go home with the commit only where a
            // flush orders it before the commit block; otherwise it is
            // journaled (it has no data tag).
            if io.class_of(b) == BlockClass::Data
                && self.data_mode != DataMode::Journal
                && self.rules.barrier_commit
            {
                self.running.data.insert(b);
            } else {
                self.running.logged.insert(b);
            }
        }
    }

    fn running_blocks(&self) -> u32 {
        self.txn_blocks(self.running.logged.len(), self.running.revoked.len())
    }

    /// Clean unmount: commit, checkpoint, mark the log empty, clear
    /// needs_recovery.
    pub(crate) fn unmount(&mut self, io: &mut Io) -> Result<()> {
        self.commit(io, true)?;
        if self.stats.commits == 0 {
            // Nothing was logged this mount: the image is as recovery left it.
            return Ok(());
        }
        self.checkpoint(io);
        self.sb.start = 0;
        self.sb.sequence = self.running.tid;
        self.sb.feature_incompat &= !self.rules.live_incompat;
        self.write_journal_super(io, true);
        if self.recover_flag_set {
            let img = io
                .snapshot(self.super_block)
                .map(|s| (*s).clone())
                .or_else(|| self.super_image.clone());
            if let Some(mut img) = img {
                recovery::set_recover_flag(&mut img, self.bs, false);
                let gen = io.generation(self.super_block);
                io.pin_until_done(self.super_block, gen);
                io.write_raw(
                    self.super_block,
                    Arc::new(img),
                    WriteFlags::fua(BlockClass::Super),
                );
                self.stats.fua_writes += 1;
            }
            self.recover_flag_set = false;
        }
        Ok(())
    }
}

impl JournalProtocol {
    /// Retire the commits the durable horizon covers, oldest first, and
    /// let the blocks they freed be reused.
    fn settle_durable(&mut self) {
        let mut through = None;
        while let Some((&tid, &ticket)) = self.commit_tickets.first_key_value() {
            if ticket > self.horizon {
                break;
            }
            self.commit_tickets.remove(&tid);
            through = Some(tid);
        }
        if let Some(tid) = through {
            self.freed_pending.retain(|_, t| jbd2::tid_gt(*t, tid));
        }
    }

    /// Every commit planned so far is known durable.
    pub(crate) fn all_durable(&self) -> bool {
        self.in_flight.is_empty() && self.commit_tickets.is_empty()
    }

    /// Journal `block` (a file-data block) in the running transaction.
    pub(crate) fn log_block(&mut self, block: u64) {
        self.running.data.remove(&block);
        self.running.logged.insert(block);
    }

    /// Hand the next commit a transaction built elsewhere (`mode=streams`:
    /// one stream's share of the changes): the blocks to log, each with
    /// its image and the cache generation it equals (0 when it is not
    /// the cached image), the file-data blocks to write home first, the
    /// blocks to revoke and those it frees. Unreported dirty blocks are
    /// swept in only when the transaction is `everything` not yet
    /// committed (otherwise they may be another transaction's).
    pub(crate) fn stage(
        &mut self,
        logged: impl IntoIterator<Item = (u64, Option<(Arc<Vec<u8>>, u64)>)>,
        data: impl IntoIterator<Item = u64>,
        revoked: impl IntoIterator<Item = u64>,
        freed: impl IntoIterator<Item = u64>,
        everything: bool,
    ) {
        debug_assert!(
            self.running.is_empty(),
            "a staged transaction replaces none"
        );
        self.sweep = everything;
        for (b, image) in logged {
            self.running.logged.insert(b);
            if let Some(image) = image {
                self.image_override.insert(b, image);
            }
        }
        self.running.data.extend(data);
        self.running.revoked.extend(revoked);
        self.running.freed.extend(freed);
    }

    /// Never sweep unreported dirty blocks into a commit (they may belong
    /// to another running transaction).
    pub(crate) fn sweep_off(&mut self) {
        self.sweep = false;
    }

    /// Commit what [`JournalProtocol::stage`] handed over; `durable`: the
    /// caller needs it durable (fsync, sync).
    pub(crate) fn commit_staged(&mut self, io: &mut Io, durable: bool) -> Result<()> {
        let r = self.commit(io, durable);
        self.image_override.clear();
        self.sweep = false;
        r
    }

    /// Whether a block freed earlier may be allocated again (its freeing
    /// commit is durable), as far as the journal knows.
    pub(crate) fn reusable(&self, block: u64) -> bool {
        !self.freed_pending.contains_key(&block)
    }

    /// Freed blocks not reusable yet ([`JournalProtocol::reusable`]).
    pub(crate) fn held_back_blocks(&self) -> usize {
        self.freed_pending.len()
    }

    /// Whether a copy of `block` is in the live log (a free of it needs a
    /// revoke record).
    pub(crate) fn in_live_log(&self, block: u64) -> bool {
        self.in_log.contains_key(&block)
    }

    /// Log blocks a transaction of `copies` copies and `revokes` revoke
    /// records takes, and the bound past which a transaction commits.
    pub(crate) fn txn_size(&self, copies: usize, revokes: usize) -> (u32, u32) {
        (self.txn_blocks(copies, revokes), self.max_txn_blocks)
    }

    /// Revoke `block` in the running transaction (a protocol's own reason:
    /// a freed block a live transaction tagged).
    pub(crate) fn revoke(&mut self, block: u64) {
        self.running.revoked.insert(block);
    }

    /// Checkpoints so far: each one empties the log.
    pub(crate) fn checkpoints(&self) -> u64 {
        self.stats.checkpoints
    }

    /// File-data blocks the running transaction writes in place, in block
    /// order.
    pub(crate) fn running_data(&self) -> Vec<u64> {
        let mut data: Vec<u64> = self.running.data.iter().copied().collect();
        data.sort_unstable();
        data
    }

    /// The running transaction reached the size bound (a quarter of the log).
    pub(crate) fn over_size_bound(&self) -> bool {
        self.running_blocks() >= self.max_txn_blocks
    }

    /// More than half of the log is in use (a timer tick checkpoints).
    pub(crate) fn log_half_full(&self) -> bool {
        self.used > self.log_len() / 2
    }

    /// The journal's format (checksums, data-tag capacity).
    pub(crate) fn format(&self) -> &JournalFormat {
        &self.fmt
    }

    /// Plan a cache flush (counted).
    pub(crate) fn plan_flush(&mut self, io: &mut Io) {
        self.flush(io);
    }
}

impl Protocol for JournalProtocol {
    fn name(&self) -> &'static str {
        "journal"
    }

    fn on_update(&mut self, u: &Update, _h: &HandleInfo) {
        self.running.logged.insert(u.block);
    }

    fn on_data_write(&mut self, w: &DataWrite, _h: &HandleInfo) {
        match self.data_mode {
            DataMode::Journal => {
                self.running.logged.insert(w.pblk);
            }
            DataMode::Ordered | DataMode::Writeback => {
                self.running.data.insert(w.pblk);
            }
        }
    }

    fn on_block_freed(&mut self, block: u64, _h: &HandleInfo) {
        let was_logged = self.running.logged.remove(&block);
        self.running.data.remove(&block);
        if was_logged || self.in_log.contains_key(&block) {
            self.running.revoked.insert(block);
        }
        self.running.freed.insert(block);
    }

    fn on_block_unallocated(&mut self, block: u64, h: &HandleInfo) {
        // Allocated and given back inside one handle: no commit ever named
        // it, so it may be reused at once, unless an older copy of it is in
        // the live log (then it needs its revoke, and waits like a free).
        self.running.logged.remove(&block);
        self.running.data.remove(&block);
        if self.in_log.contains_key(&block) {
            self.on_block_freed(block, h);
        }
    }

    fn has_pending_frees(&self) -> bool {
        !self.running.freed.is_empty() || !self.freed_pending.is_empty()
    }

    fn on_handle_end(&mut self, _h: &HandleInfo, io: &mut Io) -> Result<()> {
        if self.running_blocks() >= self.max_txn_blocks {
            self.commit(io, false)?;
        }
        Ok(())
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.commit(io, true)
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.commit(io, true)
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        match reason {
            WriteBackReason::Timer => {
                self.commit(io, false)?;
                if self.used > self.log_len() / 2 {
                    self.checkpoint(io);
                }
                Ok(())
            }
            WriteBackReason::Pressure => {
                self.commit(io, true)?;
                self.checkpoint(io);
                Ok(())
            }
            WriteBackReason::Unmount => self.unmount(io),
        }
    }

    fn can_allocate(&self, block: u64) -> bool {
        !self.running.freed.contains(&block) && !self.freed_pending.contains_key(&block)
    }

    fn plan_done(&mut self, done: &PlanDone) {
        let (tag, ok) = (done.tag, done.ok);
        if !ok {
            self.aborted = true;
            return;
        }
        if !self.rules.reuse_after_durable {
            if tag == 0 {
                return;
            }
            let tid = (tag - 1) as u32;
            self.in_flight.remove(&tid);
            // Every commit up to tid is durable (plans run in order).
            self.freed_pending.retain(|_, t| jbd2::tid_gt(*t, tid));
            return;
        }
        if tag != 0 {
            let tid = (tag - 1) as u32;
            self.in_flight.remove(&tid);
            let last = done.writes.iter().map(|w| w.2).max().unwrap_or(0);
            self.commit_tickets.insert(tid, last);
        }
        self.horizon = self.horizon.max(done.durable);
        self.settle_durable();
    }

    fn durable_notice(&mut self, durable: ordo_dev::Ticket) {
        if self.rules.reuse_after_durable && !self.aborted {
            self.horizon = self.horizon.max(durable);
            self.settle_durable();
        }
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let s = self.stats;
        vec![
            ("commits".into(), s.commits),
            ("log_blocks_written".into(), s.log_blocks),
            ("copies_logged".into(), s.copies),
            ("copies_escaped".into(), s.escaped),
            ("revoke_records".into(), s.revoke_records),
            ("checkpoints".into(), s.checkpoints),
            ("forced_checkpoints".into(), s.forced_checkpoints),
            ("checkpoint_blocks".into(), s.checkpoint_blocks),
            ("ordered_data_blocks".into(), s.ordered_data_blocks),
            ("flushes_planned".into(), s.flushes),
            ("fua_writes_planned".into(), s.fua_writes),
            ("log_used_blocks".into(), self.used as u64),
            ("log_blocks".into(), self.log_len() as u64),
            ("running_tid".into(), self.running.tid as u64),
        ]
    }
}
