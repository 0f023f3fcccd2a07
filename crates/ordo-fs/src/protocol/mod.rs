//! The consistency-protocol trait and the I/O plans protocols produce.
//!
//! The core never writes a block to the device. It reports every change to
//! the protocol ([`Protocol::on_update`], [`Protocol::on_data_write`],
//! [`Protocol::on_handle_end`]) and asks the protocol to make things durable
//! ([`Protocol::fsync`], [`Protocol::sync`], [`Protocol::write_back`]). The
//! protocol answers by appending steps to an [`IoPlan`] through an [`Io`]:
//! writes of cached block images (snapshotted at the moment they are added
//! to the plan), writes of raw blocks (journal blocks), and flushes.
//!
//! The core executes a plan *after* releasing the file-system lock, in the
//! order plans were made (so a slow fsync does not stall other callers), and
//! then calls [`Protocol::plan_done`] under the lock.

pub mod async_mode;
pub mod fast_commit;
pub mod jbd2;
pub mod sync_mode;

use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};

use crate::cache::BufferCache;
use crate::error::Result;
use crate::update::{DataWrite, HandleInfo, Ino, Update};

/// Which protocol, as named by `-o mode=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtocolKind {
    /// Delayed write-back in any order (ext2, Ganger & Patt's "No Order").
    Async,
    /// Synchronous, ordered metadata writes (Ganger & Patt's "Conventional").
    Sync,
    /// JBD2 physical journaling.
    Journal,
    /// ext4 fast commit on top of JBD2.
    FastCommit,
}

impl ProtocolKind {
    /// The `-o mode=` name.
    pub fn name(self) -> &'static str {
        match self {
            ProtocolKind::Async => "async",
            ProtocolKind::Sync => "sync",
            ProtocolKind::Journal => "journal",
            ProtocolKind::FastCommit => "fast_commit",
        }
    }
    /// Every protocol ordo implements.
    pub const ALL: &'static [ProtocolKind] = &[
        ProtocolKind::Async,
        ProtocolKind::Sync,
        ProtocolKind::Journal,
        ProtocolKind::FastCommit,
    ];
}

impl std::str::FromStr for ProtocolKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        ProtocolKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ProtocolKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown mode '{s}' (known: {})", names.join(", "))
            })
    }
}

/// JBD2 data mode (`-o data=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DataMode {
    #[default]
    Ordered,
    Writeback,
    Journal,
}

impl std::str::FromStr for DataMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ordered" => Ok(DataMode::Ordered),
            "writeback" => Ok(DataMode::Writeback),
            "journal" => Ok(DataMode::Journal),
            _ => Err(format!(
                "unknown data mode '{s}' (known: ordered, writeback, journal)"
            )),
        }
    }
}

/// One step of an I/O plan.
#[derive(Clone, Debug)]
pub enum IoStep {
    /// Write `data` (whole blocks) at `block`.
    Write {
        block: u64,
        data: Arc<Vec<u8>>,
        flags: WriteFlags,
    },
    /// Flush the device's volatile cache.
    Flush,
}

/// Longest run of consecutive blocks a protocol writes with one request
/// (1 MiB at 4 KiB blocks): large enough that write-back streams, small
/// enough that one request does not hold a plan for long.
pub(crate) const MAX_RUN_BLOCKS: usize = 256;
/// The same bound for raw images ([`Io::write_raw_runs`]), in bytes.
pub(crate) const MAX_RUN_BYTES: usize = 1 << 20;

/// A sequence of device operations a protocol asked for, executed in order
/// by the core outside the file-system lock.
#[derive(Debug, Default)]
pub struct IoPlan {
    /// The steps, in order.
    pub steps: Vec<IoStep>,
    /// Cached blocks whose snapshot is in this plan, with the cache generation
    /// snapshotted: the core marks each clean after the plan ran if it has not
    /// been modified since, and unpins it.
    pub pinned: Vec<(u64, u64)>,
    /// Protocol-defined tag passed back in [`Protocol::plan_done`] (e.g. the
    /// transaction id being committed).
    pub tag: u64,
}

impl IoPlan {
    /// True when the plan has nothing to do.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// Why [`Protocol::write_back`] was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBackReason {
    /// The periodic timer (commit interval / syncer).
    Timer,
    /// The buffer cache is over its memory bound: write back enough dirty
    /// blocks that clean ones can be evicted.
    Pressure,
    /// Unmount: everything must become durable and the image clean.
    Unmount,
}

/// Recomputes the checksums inside a block image that is not the cached
/// one (an older image a protocol wants to write: the sync protocol's
/// intermediate writes, a rolled-back image). The core knows what each
/// block holds (inode table, directory or extent block of which inode, group
/// descriptors, superblock); the protocol does not need to.
pub trait Sealer {
    /// Fix every checksum of `image`, an image of `block`.
    fn reseal(&self, block: u64, image: &mut [u8]);
}

/// What a protocol sees of the core while it plans I/O: the buffer cache
/// (read-only, plus snapshot-and-pin) and the plan being built.
pub struct Io<'a> {
    pub(crate) cache: &'a mut BufferCache,
    pub(crate) plan: &'a mut IoPlan,
    pub(crate) sealer: Option<&'a dyn Sealer>,
}

impl<'a> Io<'a> {
    /// Build an `Io` over a cache and a plan.
    pub fn new(cache: &'a mut BufferCache, plan: &'a mut IoPlan) -> Self {
        Io {
            cache,
            plan,
            sealer: None,
        }
    }
    /// Build an `Io` that can also recompute checksums of block images.
    pub fn with_sealer(
        cache: &'a mut BufferCache,
        plan: &'a mut IoPlan,
        sealer: &'a dyn Sealer,
    ) -> Self {
        Io {
            cache,
            plan,
            sealer: Some(sealer),
        }
    }
    /// Recompute the checksums of `image`, an image of `block` other than
    /// the cached one (no-op when the core gave no sealer).
    pub fn reseal(&self, block: u64, image: &mut [u8]) {
        if let Some(s) = self.sealer {
            s.reseal(block, image);
        }
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.cache.block_size()
    }
    /// Every dirty cached block, ascending.
    pub fn dirty_blocks(&self) -> Vec<u64> {
        self.cache.dirty_blocks()
    }
    /// Whether a cached block is dirty.
    pub fn is_dirty(&self, block: u64) -> bool {
        self.cache.is_dirty(block)
    }
    /// The class of a cached block (Other if not cached).
    pub fn class_of(&self, block: u64) -> BlockClass {
        self.cache.class_of(block)
    }
    /// A copy of the current cached image of `block`, if cached.
    pub fn snapshot(&self, block: u64) -> Option<Arc<Vec<u8>>> {
        self.cache.snapshot(block)
    }
    /// The modification generation of a cached block (0 if not cached).
    pub fn generation(&self, block: u64) -> u64 {
        self.cache.generation(block)
    }
    /// Append a write of the current image of cached `block` to its home
    /// location. The image is snapshotted now; the block is pinned (not
    /// evicted) until the plan ran and is then marked clean unless modified
    /// in between. Does nothing if the block is not cached.
    pub fn write_home(&mut self, block: u64, fua: bool) {
        if let Some(data) = self.cache.snapshot(block) {
            let class = self.cache.class_of(block);
            let gen = self.cache.generation(block);
            self.cache.pin(block);
            self.plan.pinned.push((block, gen));
            self.plan.steps.push(IoStep::Write {
                block,
                data,
                flags: WriteFlags { fua, class },
            });
        }
    }
    /// Like [`Io::write_home`] for every cached block of `blocks` (sorted
    /// ascending), coalescing consecutive blocks of one class into one
    /// multi-block write (at most `max_run` blocks each).
    pub fn write_home_runs(&mut self, blocks: &[u64], fua: bool, max_run: usize) {
        let bs = self.cache.block_size() as usize;
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i];
            let Some(d0) = self.cache.snapshot(first) else {
                i += 1;
                continue;
            };
            let class = self.cache.class_of(first);
            let mut data = Vec::with_capacity(bs * 8);
            data.extend_from_slice(&d0);
            let mut members = vec![(first, self.cache.generation(first))];
            let mut j = i + 1;
            while j < blocks.len()
                && members.len() < max_run.max(1)
                && blocks[j] == first + members.len() as u64
                && self.cache.class_of(blocks[j]) == class
            {
                let Some(d) = self.cache.snapshot(blocks[j]) else {
                    break;
                };
                data.extend_from_slice(&d);
                members.push((blocks[j], self.cache.generation(blocks[j])));
                j += 1;
            }
            for &(b, gen) in &members {
                self.cache.pin(b);
                self.plan.pinned.push((b, gen));
            }
            self.plan.steps.push(IoStep::Write {
                block: first,
                data: Arc::new(data),
                flags: WriteFlags { fua, class },
            });
            i = j;
        }
    }
    /// Append a write of raw data (whole blocks) at `block` (journal blocks,
    /// committed copies during checkpoint). Does not touch the cache's state.
    pub fn write_raw(&mut self, block: u64, data: Arc<Vec<u8>>, flags: WriteFlags) {
        assert!(!data.is_empty() && data.len().is_multiple_of(self.cache.block_size() as usize));
        self.plan.steps.push(IoStep::Write { block, data, flags });
    }
    /// Like [`Io::write_raw`] for a sequence of block images, in order,
    /// each joined to the write before it when it is the next block on disk
    /// and of the same class (at most [`MAX_RUN_BYTES`] per write);
    /// returns the writes appended.
    pub fn write_raw_runs<D: AsRef<[u8]>>(
        &mut self,
        blocks: impl IntoIterator<Item = (u64, BlockClass, D)>,
        fua: bool,
    ) -> u32 {
        let bs = self.cache.block_size() as usize;
        let mut writes = 0;
        let mut run: Option<(u64, BlockClass, Vec<u8>)> = None;
        for (b, class, img) in blocks {
            match &mut run {
                Some((at, c, buf))
                    if *c == class
                        && *at + (buf.len() / bs) as u64 == b
                        && buf.len() < MAX_RUN_BYTES =>
                {
                    buf.extend_from_slice(img.as_ref());
                }
                _ => {
                    if let Some((at, c, buf)) = run.take() {
                        self.write_raw(at, Arc::new(buf), WriteFlags { fua, class: c });
                        writes += 1;
                    }
                    run = Some((b, class, img.as_ref().to_vec()));
                }
            }
        }
        if let Some((at, c, buf)) = run {
            self.write_raw(at, Arc::new(buf), WriteFlags { fua, class: c });
            writes += 1;
        }
        writes
    }
    /// Append a cache flush.
    pub fn flush(&mut self) {
        self.plan.steps.push(IoStep::Flush);
    }
    /// Mark a cached block clean now if its generation is still `gen` (used
    /// after a checkpoint wrote a committed copy home).
    pub fn mark_clean_if(&mut self, block: u64, gen: u64) {
        self.cache.mark_clean_if(block, gen);
    }
    /// Set the protocol tag of the plan.
    pub fn set_tag(&mut self, tag: u64) {
        self.plan.tag = tag;
    }
    /// The plan built so far.
    pub fn plan(&self) -> &IoPlan {
        self.plan
    }
}

/// What a protocol is told at mount.
#[derive(Clone, Debug)]
pub struct ProtocolEnv {
    /// File-system block size.
    pub block_size: u32,
    /// Blocks on the device.
    pub block_count: u64,
    /// Filesystem UUID (for JBD2 / fast-commit checksums).
    pub uuid: [u8; 16],
    /// The journal inode's blocks as (logical, physical, length) runs, when
    /// the image has a journal.
    pub journal_runs: Vec<(u32, u64, u32)>,
    /// Commit interval in milliseconds (`commit=`).
    pub commit_interval_ms: u64,
    /// JBD2 data mode.
    pub data_mode: DataMode,
    /// Whether the image has `metadata_csum`.
    pub metadata_csum: bool,
    /// The mount's clock (commit-block times, the `dtime` a replay stamps).
    pub clock: Arc<dyn crate::clock::Clock>,
}

/// A consistency protocol. One instance per mount. All methods are called
/// with the file-system lock held; they must not do device I/O themselves
/// except in [`Protocol::recover`], which runs before the core is up.
pub trait Protocol: Send {
    /// The `-o mode=` name.
    fn name(&self) -> &'static str;

    /// A metadata change was made in the cache on behalf of handle `h`.
    fn on_update(&mut self, u: &Update, h: &HandleInfo) {
        let _ = (u, h);
    }

    /// A data block was written into the cache on behalf of handle `h`.
    fn on_data_write(&mut self, w: &DataWrite, h: &HandleInfo) {
        let _ = (w, h);
    }

    /// A block (metadata or data) was freed by handle `h` (reported when
    /// the handle ends, before [`Protocol::on_handle_end`]: until then a
    /// rollback may take the free back). Protocols that must delay reuse
    /// (journal revoke, soft updates) record it here.
    fn on_block_freed(&mut self, block: u64, h: &HandleInfo) {
        let _ = (block, h);
    }

    /// A block allocated by handle `h` was given back by a rollback
    /// before the handle ended: nothing on disk ever named it. Default:
    /// treated as a free.
    fn on_block_unallocated(&mut self, block: u64, h: &HandleInfo) {
        self.on_block_freed(block, h);
    }

    /// Handle `h` rolled back changes it had reported (an operation that
    /// failed for space half-way): the undoing updates were reported as
    /// updates of the inverse meaning. Protocols that log meanings rather
    /// than blocks may prefer to commit the handle's blocks whole.
    fn on_rollback(&mut self, h: &HandleInfo) {
        let _ = h;
    }

    /// Whether freed blocks are held back from reuse until a commit (or
    /// a plan in flight) is durable: an allocation that failed may succeed
    /// after [`Protocol::sync`].
    fn has_pending_frees(&self) -> bool {
        false
    }

    /// Handle `h` ended (the system call is about to return). Synchronous
    /// protocols plan their writes here.
    fn on_handle_end(&mut self, h: &HandleInfo, io: &mut Io) -> Result<()> {
        let _ = (h, io);
        Ok(())
    }

    /// Make `ino` durable (data and, unless `datasync` allows skipping it,
    /// metadata), together with whatever the protocol's semantics tie to it.
    fn fsync(&mut self, ino: Ino, datasync: bool, io: &mut Io) -> Result<()>;

    /// Make everything durable.
    fn sync(&mut self, io: &mut Io) -> Result<()>;

    /// Background work: periodic write-back, checkpointing, write-back under
    /// memory pressure, and the final write-back at unmount.
    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()>;

    /// The last word on a block image about to be added to a plan
    /// (rollback, stamping). Default: unchanged.
    fn prepare_block_write(&mut self, block: u64, image: &mut [u8]) {
        let _ = (block, image);
    }

    /// Whether a free block may be allocated now (reuse rules).
    fn can_allocate(&self, block: u64) -> bool {
        let _ = block;
        true
    }

    /// A plan made by this protocol has been executed (successfully when
    /// `ok`).
    fn plan_done(&mut self, tag: u64, ok: bool) {
        let _ = (tag, ok);
    }

    /// Statistics for `ordo info` / benchmarks, as name/value pairs.
    fn stats(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Human-readable lines.
    pub lines: Vec<String>,
    /// Transactions (or log records) replayed.
    pub replayed: u64,
    /// Blocks written by recovery.
    pub blocks_written: u64,
}

/// Run the mount-time recovery of protocol `kind` on a device before the
/// core opens it (journal replay, fast-commit replay, or nothing).
pub fn recover(
    kind: ProtocolKind,
    dev: &dyn BlockDevice,
    env: &ProtocolEnv,
) -> Result<RecoveryReport> {
    let _ = (dev, env);
    match kind {
        ProtocolKind::Async | ProtocolKind::Sync => Ok(RecoveryReport::default()),
        ProtocolKind::Journal => jbd2::recover(dev, env),
        ProtocolKind::FastCommit => fast_commit::replay::recover(dev, env),
    }
}

/// Construct the protocol for a mount.
pub fn build(kind: ProtocolKind, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    match kind {
        ProtocolKind::Async => Ok(Box::new(async_mode::AsyncProtocol::new(env))),
        ProtocolKind::Sync => Ok(Box::new(sync_mode::SyncProtocol::new(env))),
        ProtocolKind::Journal => Ok(Box::new(jbd2::JournalProtocol::new(env)?)),
        ProtocolKind::FastCommit => Ok(Box::new(fast_commit::FastCommitProtocol::new(env)?)),
    }
}
