//! `mode=optimistic`: optimistic crash consistency (OptFS, Chidambaram et
//! al., SOSP '13) on ext4's JBD2 journal.
//!
//! OptFS separates ordering from durability. A JBD2 commit pays a flush so
//! that its commit block cannot reach the disk before the transaction it
//! seals; here the commit goes out *with* its transaction and checksums
//! decide, at recovery, whether it all arrived:
//!
//! ```text
//!  fresh file data            -> home   (checksummed: a data tag each)
//!  descriptor | copies | revoke -> log  (v3 tag checksums)
//!  commit block               -> log    (commit checksum over the block and
//!                                        its data-tag table; no FUA)
//!  dsync / fsync / sync only: FLUSH     (the one flush of a durable call)
//! ```
//!
//! # Mechanisms
//!
//! - **Flush-free commit**: [`CommitRules::barrier_commit`] off; the
//!   commit block carries a data tag (home block, CRC32C) for every fresh
//!   data block the transaction writes in place (`ordo_format::jbd2`,
//!   [`jbd2::encode_commit_with_data_tags`]; layout in `docs/FORMAT.md`).
//! - **Selective data journaling**: a write to a block that already held
//!   data (an overwrite, or a fresh block past the table's capacity) is
//!   journaled like metadata, so its new contents reach home only by a
//!   checkpoint; a fresh block is only checksummed. A transaction closes at
//!   the end of the handle that fills its data-tag table.
//! - **Durability notifications**: a commit is durable once the device's
//!   durable horizon ([`crate::protocol::PlanDone::durable`]) covers the
//!   last write of its plan: after a flush, a FUA write, or a write-cache
//!   model's destage. A destage between plans (a disk writing its cache
//!   back on its own) arrives as [`Protocol::durable_notice`] before each
//!   tick, so the tick flushes only for what the disk has not made durable
//!   itself. Nothing is ever assumed durable after a delay.
//! - **Background flush**: a timer tick every `flush_interval=` (default
//!   1 s) flushes once if any commit is not known durable, off every
//!   caller's path: `osync`ed work becomes durable within one interval.
//!   Every `commit=` interval the tick also commits the running
//!   transaction.
//! - **Delayed checkpoint**: [`CommitRules::checkpoint_after_durable`]: a
//!   checkpoint flushes first unless every commit is known durable, so no
//!   metadata goes home before its transaction and all earlier ones are
//!   durable; the log tail moves (FUA) only after the checkpoint's own
//!   flush, in order.
//! - **Reuse after notification**: [`CommitRules::reuse_after_durable`]: a
//!   block freed by a transaction is not reallocated until that
//!   transaction is durable (its new owner's data is written in place, so
//!   it must not reach the disk while a crash could bring the old owner
//!   back). When space runs out the core syncs (commit and flush) and
//!   retries. Inodes are reused at once: an inode is only ever written
//!   through the journal, so replay order alone keeps its owners apart.
//! - **osync / dsync**: `osync` commits without a flush (ordering, and
//!   durability within a tick); `dsync`, `fsync` and `sync` commit and
//!   flush once. `-o fsync=osync` makes a plain fsync an osync.
//! - **In-order recovery** in two passes: [`recovery`].
//!
//! # The journal feature
//!
//! While transactions with data tags may be live, the journal superblock
//! carries [`jbd2::FEATURE_INCOMPAT_ORDO_DATA_TAGS`]: the kernel and
//! e2fsck, which would replay a commit whose data never arrived, refuse the
//! journal instead; ordo's JBD2 recovery refuses it too and names this
//! mode. A clean unmount and this mode's recovery clear it.
//!
//! # Test-only faults (`ORDO_FAULT`)
//!
//! - `optimistic_no_data_tags`: commit blocks without data tags;
//! - `optimistic_early_checkpoint`: checkpoint after every commit, without
//!   waiting for durability;
//! - `optimistic_early_reuse`: freed blocks reusable once the commit's
//!   plan ran, durable or not;
//! - `optimistic_replay_past_bad` (recovery): replay on past a failing
//!   transaction.
//!
//! Each must make the crash explorer fail.

pub mod recovery;

use std::collections::BTreeSet;

use ordo_format::jbd2::{self, DataTag};

use super::jbd2::{CommitRules, JournalProtocol};
use super::{
    AfterCrash, Capabilities, DataMode, DurabilityCalls, Io, PlanDone, Protocol, ProtocolEnv,
    ProtocolSpec, Recovered, WriteBackReason,
};
use crate::error::Result;
use crate::update::{DataWrite, HandleInfo, Ino, Update};

/// `mode=optimistic`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "optimistic",
    summary: "OptFS: commits ordered by checksums, not flushes; osync and dsync",
    variants: &[],
    mkfs_features: "has_journal",
    caps: Capabilities {
        group_commit: true,
        log_replay: true,
        after_crash: AfterCrash::ConsistentAfterReplay,
        prefix_after_crash: true,
        log_incompat: jbd2::FEATURE_INCOMPAT_ORDO_DATA_TAGS,
        ..Capabilities::NONE
    },
    recover: recovery::recover,
    build,
};

fn build(mut recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(Optimistic::new(env, &mut recovered)?))
}

/// A fault injected on purpose (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    NoDataTags,
    EarlyCheckpoint,
    EarlyReuse,
}

impl Fault {
    fn from_env() -> Option<Fault> {
        match std::env::var("ORDO_FAULT").ok().as_deref() {
            Some("optimistic_no_data_tags") => Some(Fault::NoDataTags),
            Some("optimistic_early_checkpoint") => Some(Fault::EarlyCheckpoint),
            Some("optimistic_early_reuse") => Some(Fault::EarlyReuse),
            _ => None,
        }
    }
}

/// Counters for `ordo info` and benchmarks.
#[derive(Default, Clone, Copy)]
struct Stats {
    osyncs: u64,
    dsyncs: u64,
    data_tags: u64,
    journaled_data: u64,
    background_flushes: u64,
    durable_flushes: u64,
}

/// The `mode=optimistic` protocol: a [`JournalProtocol`] under OptFS's
/// commit rules, which decides what is journaled and what is tagged.
pub struct Optimistic {
    j: JournalProtocol,
    /// Fresh data blocks of the running transaction: written in place
    /// with its commit, each with a data tag.
    fresh: BTreeSet<u64>,
    /// Blocks tagged by committed transactions that may still be in the
    /// live log (since checkpoint number `tagged_epoch`, which empties
    /// it): freeing one revokes it, so that recovery knows a later owner's
    /// data in it is no mismatch of the old tag.
    tagged: BTreeSet<u64>,
    tagged_epoch: u64,
    /// Data tags one commit block holds.
    capacity: usize,
    fault: Option<Fault>,
    stats: Stats,
    /// Timer ticks (one per flush interval) per commit interval, and the
    /// ticks since the last timer commit.
    ticks_per_commit: u64,
    ticks: u64,
    flush_interval_ms: u64,
}

impl Optimistic {
    /// Build the protocol for a mount (after [`recovery::recover`]).
    pub fn new(env: &ProtocolEnv, recovered: &mut Recovered) -> Result<Self> {
        let fault = Fault::from_env();
        let rules = CommitRules {
            barrier_commit: false,
            live_incompat: jbd2::FEATURE_INCOMPAT_ORDO_DATA_TAGS,
            journal_checksums: true,
            checkpoint_after_durable: fault != Some(Fault::EarlyCheckpoint),
            reuse_after_durable: fault != Some(Fault::EarlyReuse),
        };
        let mut env = env.clone();
        // Fresh data goes home with its commit (data=ordered's place in
        // the plan); overwrites are journaled by this protocol's choice.
        env.data_mode = DataMode::Ordered;
        let j = JournalProtocol::with_rules(&env, recovered, rules)?;
        let capacity = j.format().data_tags_per_commit();
        assert!(capacity > 0, "a commit block holds at least one data tag");
        Ok(Optimistic {
            j,
            fresh: BTreeSet::new(),
            tagged: BTreeSet::new(),
            tagged_epoch: 0,
            capacity,
            fault,
            stats: Stats::default(),
            ticks_per_commit: (env.commit_interval_ms / env.flush_interval_ms.max(1)).max(1),
            ticks: 0,
            flush_interval_ms: env.flush_interval_ms.max(1),
        })
    }

    /// Commit the running transaction without a flush.
    fn commit(&mut self, io: &mut Io) -> Result<()> {
        let tags: Vec<DataTag> = if self.fault == Some(Fault::NoDataTags) {
            Vec::new()
        } else {
            let fmt = *self.j.format();
            // The blocks the commit writes home, checksummed from the
            // images it snapshots now (under the same lock hold).
            self.j
                .running_data()
                .into_iter()
                .filter(|&b| io.is_dirty(b))
                .filter_map(|b| {
                    io.snapshot(b).map(|img| DataTag {
                        block: b,
                        checksum: fmt.data_checksum(&img),
                    })
                })
                .collect()
        };
        debug_assert!(tags.len() <= self.capacity);
        self.stats.data_tags += tags.len() as u64;
        self.j.commit_with(io, false, &tags)?;
        self.forget_released_tags();
        self.tagged.extend(tags.iter().map(|t| t.block));
        self.fresh.clear();
        if self.fault == Some(Fault::EarlyCheckpoint) {
            self.j.checkpoint(io);
        }
        Ok(())
    }

    /// Tags of transactions a checkpoint released are out of the log.
    fn forget_released_tags(&mut self) {
        if self.j.checkpoints() != self.tagged_epoch {
            self.tagged_epoch = self.j.checkpoints();
            self.tagged.clear();
        }
    }

    /// Commit, then make everything durable with one flush (none when
    /// every commit is already known durable).
    fn commit_durable(&mut self, io: &mut Io) -> Result<()> {
        self.commit(io)?;
        if !self.j.all_durable() {
            self.j.plan_flush(io);
            self.stats.durable_flushes += 1;
        }
        Ok(())
    }
}

impl Protocol for Optimistic {
    fn name(&self) -> &'static str {
        "optimistic"
    }

    fn on_update(&mut self, u: &Update, h: &HandleInfo) {
        self.j.on_update(u, h);
    }

    fn on_data_write(&mut self, w: &DataWrite, h: &HandleInfo) {
        if self.fresh.contains(&w.pblk) {
            return;
        }
        if w.fresh && self.fresh.len() < self.capacity {
            self.fresh.insert(w.pblk);
            self.j.on_data_write(w, h);
        } else {
            // An overwrite of data (or a fresh block past the table):
            // journaled, home only by a checkpoint after it is durable.
            self.j.log_block(w.pblk);
            self.stats.journaled_data += 1;
        }
    }

    fn on_block_freed(&mut self, block: u64, h: &HandleInfo) {
        self.fresh.remove(&block);
        self.forget_released_tags();
        if self.tagged.remove(&block) {
            self.j.revoke(block);
        }
        self.j.on_block_freed(block, h);
    }

    fn on_block_unallocated(&mut self, block: u64, h: &HandleInfo) {
        self.fresh.remove(&block);
        self.j.on_block_unallocated(block, h);
    }

    fn has_pending_frees(&self) -> bool {
        self.j.has_pending_frees()
    }

    fn on_handle_end(&mut self, _h: &HandleInfo, io: &mut Io) -> Result<()> {
        if self.fresh.len() >= self.capacity || self.j.over_size_bound() {
            self.commit(io)?;
        }
        Ok(())
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.stats.dsyncs += 1;
        self.commit_durable(io)
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.commit_durable(io)
    }

    fn osync(&mut self, _ino: Ino, io: &mut Io) -> Result<()> {
        self.stats.osyncs += 1;
        self.commit(io)
    }

    fn dsync(&mut self, _ino: Ino, io: &mut Io) -> Result<()> {
        self.stats.dsyncs += 1;
        self.commit_durable(io)
    }

    fn native_durability_calls(&self) -> DurabilityCalls {
        DurabilityCalls::OSYNC.union(DurabilityCalls::DSYNC)
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        match reason {
            WriteBackReason::Timer => {
                // A tick per flush interval; the running transaction
                // commits once per commit interval.
                self.ticks += 1;
                if self.ticks >= self.ticks_per_commit {
                    self.ticks = 0;
                    self.commit(io)?;
                }
                if self.j.log_half_full() {
                    // Flushes first when something is not known durable.
                    self.j.checkpoint(io);
                } else if !self.j.all_durable() {
                    self.j.plan_flush(io);
                    self.stats.background_flushes += 1;
                }
                Ok(())
            }
            WriteBackReason::Pressure => {
                self.commit(io)?;
                self.j.checkpoint(io);
                Ok(())
            }
            WriteBackReason::Unmount => {
                self.commit(io)?;
                self.j.unmount(io)
            }
        }
    }

    fn can_allocate(&self, block: u64) -> bool {
        self.j.can_allocate(block)
    }

    fn tick_interval_ms(&self) -> Option<u64> {
        Some(self.flush_interval_ms)
    }

    fn plan_done(&mut self, done: &PlanDone) {
        self.j.plan_done(done);
    }

    fn durable_notice(&mut self, durable: ordo_dev::Ticket) {
        self.j.durable_notice(durable);
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let s = self.stats;
        let mut v = self.j.stats();
        v.extend([
            ("osyncs".into(), s.osyncs),
            ("dsyncs".into(), s.dsyncs),
            ("data_tags".into(), s.data_tags),
            ("journaled_data_blocks".into(), s.journaled_data),
            ("background_flushes".into(), s.background_flushes),
            ("durable_call_flushes".into(), s.durable_flushes),
        ]);
        v
    }
}
