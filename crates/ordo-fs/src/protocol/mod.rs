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
pub mod backpointers;
pub mod fast_commit;
pub mod jbd2;
pub mod optimistic;
pub(crate) mod ordering;
pub mod sched_chain;
pub mod sched_flag;
pub mod softdep;
pub mod streams;
pub mod sync_mode;

use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};

use crate::cache::BufferCache;
use crate::error::Result;
use crate::update::{BlockOwner, DataWrite, HandleInfo, Ino, Update};

/// Every protocol ordo ships: **the registry**. Adding a protocol is its
/// folder under `protocol/`, one line here, and its docs
/// (`docs/DESIGN.md`, "Adding a protocol"). Nothing outside this module
/// and option parsing names a protocol: the core, the crash explorer, the
/// benchmark harness and the CLI ask a [`ProtocolKind`] for its
/// [`Capabilities`] instead.
const REGISTRY: &[&ProtocolSpec] = &[
    &async_mode::SPEC,
    &sync_mode::SPEC,
    &jbd2::SPEC,
    &fast_commit::SPEC,
    &softdep::SPEC,
    &sched_flag::SPEC,
    &sched_chain::SPEC,
    &optimistic::SPEC,
    &streams::SPEC,
    &backpointers::SPEC,
];

/// What a crash leaves under a protocol, and how the crash explorer
/// recovers and judges a crash image of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AfterCrash {
    /// No promise: the image may need repairs fsck cannot call benign
    /// (the `async` baseline; the crash explorer is expected to fail it).
    NoPromise,
    /// Consistent up to a benign repair (bitmaps and counts recomputed,
    /// leaked inodes freed), which recovery is: no log to replay.
    ConsistentAfterRepair,
    /// Consistent, without any repair, once mount has replayed the log.
    ConsistentAfterReplay,
}

/// What the core, the crash explorer and the benchmark harness ask of a
/// protocol instead of matching on its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// Its commits make everything before them durable, or at least
    /// every file named to [`Protocol::fsync_in`], so concurrent fsyncs
    /// may share one (the core's group commit: the leader names every
    /// waiting caller's file).
    pub group_commit: bool,
    /// With `group_commit`: a commit covers everything of its caller's
    /// stream (and the files named), not everything, so only fsyncs of
    /// one stream share a commit; the leader's `fsync_in` names every
    /// waiting caller's file.
    pub group_commit_per_stream: bool,
    /// It keeps a log guarded by the superblock's `needs_recovery` flag:
    /// mount replays the log (and undoes a torn flip of the flag), a clean
    /// unmount leaves the "cleanly unmounted" bit to the log, and an image
    /// that needs recovery is refused by protocols without one.
    pub log_replay: bool,
    /// The kernel and e2fsck can replay its crash images themselves (the
    /// crash explorer's second judge applies).
    pub kernel_replays: bool,
    /// What "consistent after a crash" means for it.
    pub after_crash: AfterCrash,
    /// It accepts `data=` (JBD2's data modes).
    pub data_modes: bool,
    /// A mounted file system of it settles by one `sync` (a first full
    /// commit) that recordings start after, so that crash exploration sees
    /// its steady state rather than its start-up rules.
    pub settle_with_sync: bool,
    /// Under `data=writeback` a crash may expose a freed block's old
    /// contents inside a file (metadata committed before the data).
    pub stale_data_with_writeback: bool,
    /// Its ordering is enforced by the I/O scheduler (`ordo_dev::sched`):
    /// its plans carry ordering constraints (`order_after`, barriers) that
    /// only a scheduler may relax, and a mount without `sched=` runs them
    /// through one anyway (SPTF, which is C-LOOK without a positioning
    /// model).
    pub scheduler: bool,
    /// After recovery the tree *and every file's data* equal the model
    /// after some operation boundary (no operation half done, no data
    /// newer than the metadata around it): OptFS's in-order replay with
    /// selective data journaling. The crash explorer then checks the
    /// whole recovered tree against the model's snapshots, which is what
    /// makes `osync`'s ordering promise checkable.
    pub prefix_after_crash: bool,
    /// Order is kept per stream, not across streams (ccfs): after
    /// recovery the tree equals the model after some *prefix of each
    /// stream's* operations, applied in the order they ran, where an
    /// operation related to an earlier one of another stream (same file,
    /// same name in a directory, an entry inside a directory another
    /// stream made) is present only with it. The crash explorer checks
    /// the recovered tree against those models, and a returned fsync or
    /// streamsync as a lower bound on its stream's prefix.
    pub stream_prefix_after_crash: bool,
    /// The core keeps *backlinks* (NoFS): every inode names, in an
    /// in-inode extended attribute, the directories that link to it; a
    /// name resolves only to an inode that names its directory back; data
    /// reads from the device are checked against the protocol's owner
    /// records ([`Protocol::check_block_read`]); the protocol's owner table
    /// lives in a reserved inode the core sets up at mount
    /// ([`Protocol::owner_table_blocks`]); and after an unclean mount the
    /// core rebuilds allocation state with its scanners before anything is
    /// allocated, unless the protocol trusts it
    /// ([`Protocol::trusts_allocation_state`]).
    pub backlinks: bool,
    /// No ordering promise, but *data consistency* once the scanners have
    /// run (NoFS): after a crash, every name resolves to an inode that
    /// names its directory or fails, every read returns bytes written to
    /// that file or EIO, and after the scan nothing is allocated twice.
    /// The crash explorer mounts a crash image with no recovery, runs
    /// `Fs::scan_to_end` and checks that instead of tree equality.
    pub data_consistent_after_scan: bool,
    /// Journal-superblock INCOMPAT bits that mark a live log only this
    /// protocol's recovery can read (its own extensions of JBD2). An image
    /// whose journal carries one is recovered by this protocol, whatever
    /// it is mounted with ([`ProtocolKind::recovery_for_image`]).
    pub log_incompat: u32,
}

impl Capabilities {
    /// A protocol with no log and no promise: what a spec states the
    /// differences from (`..Capabilities::NONE`).
    pub const NONE: Capabilities = Capabilities {
        group_commit: false,
        group_commit_per_stream: false,
        log_replay: false,
        kernel_replays: false,
        after_crash: AfterCrash::NoPromise,
        data_modes: false,
        settle_with_sync: false,
        stale_data_with_writeback: false,
        scheduler: false,
        prefix_after_crash: false,
        stream_prefix_after_crash: false,
        backlinks: false,
        data_consistent_after_scan: false,
        log_incompat: 0,
    };
}

/// State one mount-time recovery hands, by value, to the protocol built
/// after it: a bag of typed parts, each put there by the recovery of the
/// protocol (or the protocol underneath it) that needs it, and taken by
/// type. A protocol built on top of another (fast commit over JBD2) takes
/// its own part and passes the rest down.
#[derive(Default)]
pub struct Recovered {
    /// What recovery found and did.
    pub report: RecoveryReport,
    parts: Vec<Box<dyn std::any::Any + Send>>,
}

impl Recovered {
    /// Nothing recovered (no log, or a read-only mount).
    pub fn none() -> Self {
        Recovered::default()
    }
    /// Recovered state with `report`.
    pub fn with_report(report: RecoveryReport) -> Self {
        Recovered {
            report,
            parts: Vec::new(),
        }
    }
    /// Add a part (one per type: a second part of a type replaces the first).
    pub fn put<T: std::any::Any + Send>(&mut self, part: T) {
        self.parts.retain(|p| !p.is::<T>());
        self.parts.push(Box::new(part));
    }
    /// Take the part of type `T`, if recovery left one.
    pub fn take<T: std::any::Any + Send>(&mut self) -> Option<T> {
        let i = self.parts.iter().position(|p| p.is::<T>())?;
        self.parts.swap_remove(i).downcast::<T>().ok().map(|b| *b)
    }
}

impl std::fmt::Debug for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovered")
            .field("report", &self.report)
            .field("parts", &self.parts.len())
            .finish()
    }
}

/// One protocol's whole life, as the registry knows it.
pub struct ProtocolSpec {
    /// The `-o mode=` name.
    pub name: &'static str,
    /// One line for `--help` and `ordo info`.
    pub summary: &'static str,
    /// Its variants, chosen by `-o mode=NAME:VARIANT` and handed to `build`
    /// in [`ProtocolEnv::variant`]; the first is the default (`-o
    /// mode=NAME`). Empty: it has none.
    pub variants: &'static [&'static str],
    /// Features (`mkfs -O` syntax) its images must have; `ordo mkfs`, the
    /// crash explorer and the benchmark harness format with them, and mount
    /// refuses an image without them.
    pub mkfs_features: &'static str,
    /// What it offers; see [`Capabilities`].
    pub caps: Capabilities,
    /// Mount-time recovery on the device before the core opens it (log
    /// replay, or nothing). Runs only for read-write mounts.
    pub recover: fn(&dyn BlockDevice, &ProtocolEnv) -> Result<Recovered>,
    /// The protocol instance for one mount, from what recovery handed over
    /// ([`Recovered::none`] for a read-only mount, which must never write).
    pub build: fn(Recovered, &ProtocolEnv) -> Result<Box<dyn Protocol>>,
}

/// A protocol, as named by `-o mode=`: a handle on its [`ProtocolSpec`]
/// and one of its variants (`-o mode=NAME:VARIANT`).
#[derive(Clone, Copy)]
pub struct ProtocolKind {
    spec: &'static ProtocolSpec,
    variant: u8,
}

impl ProtocolKind {
    /// Every protocol ordo ships, in registry order (each in its default
    /// variant).
    pub fn all() -> impl Iterator<Item = ProtocolKind> {
        REGISTRY.iter().map(|s| ProtocolKind::from_spec(s))
    }
    /// The shipped protocol named `name` (`NAME` or `NAME:VARIANT`).
    pub fn by_name(name: &str) -> Option<ProtocolKind> {
        let (base, variant) = match name.split_once(':') {
            Some((b, v)) => (b, Some(v)),
            None => (name, None),
        };
        let k = ProtocolKind::all().find(|k| k.name() == base)?;
        match variant {
            None => Some(k),
            Some(v) => k.with_variant(v),
        }
    }
    /// The shipped protocol named `name`; panics if there is none (for
    /// tests and constants: user input goes through `FromStr`).
    pub fn named(name: &str) -> ProtocolKind {
        match ProtocolKind::by_name(name) {
            Some(k) => k,
            None => panic!("no protocol named {name:?}"),
        }
    }
    /// A protocol that is not in the registry (a test's).
    pub const fn from_spec(spec: &'static ProtocolSpec) -> ProtocolKind {
        ProtocolKind { spec, variant: 0 }
    }
    /// The same protocol in its variant `v`, if it has one of that name.
    pub fn with_variant(self, v: &str) -> Option<ProtocolKind> {
        let i = self.spec.variants.iter().position(|&x| x == v)?;
        Some(ProtocolKind {
            spec: self.spec,
            variant: u8::try_from(i).ok()?,
        })
    }
    /// Every variant of this protocol (itself alone when it has none).
    pub fn variants(self) -> impl Iterator<Item = ProtocolKind> {
        let n = self.spec.variants.len().max(1);
        let spec = self.spec;
        (0..n).map(move |i| ProtocolKind {
            spec,
            variant: i as u8,
        })
    }
    /// The `-o mode=` name, without the variant.
    pub fn name(self) -> &'static str {
        self.spec.name
    }
    /// The variant's name (`""` for a protocol without variants).
    pub fn variant(self) -> &'static str {
        self.spec
            .variants
            .get(self.variant as usize)
            .copied()
            .unwrap_or("")
    }
    /// Its description.
    pub fn spec(self) -> &'static ProtocolSpec {
        self.spec
    }
    /// What it offers.
    pub fn caps(self) -> Capabilities {
        self.spec.caps
    }
    /// Its recovery (see [`ProtocolSpec::recover`]).
    pub fn recover(self, dev: &dyn BlockDevice, env: &ProtocolEnv) -> Result<Recovered> {
        (self.spec.recover)(dev, env)
    }
    /// Its instance for a mount (see [`ProtocolSpec::build`]).
    pub fn build(self, recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
        (self.spec.build)(recovered, env)
    }
    /// The features its images need, parsed.
    pub fn required_features(self) -> ordo_format::features::FeatureSet {
        let mut set = ordo_format::features::FeatureSet::EMPTY;
        for name in self.spec.mkfs_features.split(',').filter(|n| !n.is_empty()) {
            match ordo_format::features::feature_by_name(name) {
                Some(f) => set.set(f, true),
                None => panic!("protocol {}: unknown feature {name:?}", self.spec.name),
            }
        }
        set
    }
    /// [`ProtocolKind::recovery_for`], after a look at the image's
    /// journal superblock: a live log carrying a protocol's own
    /// [`Capabilities::log_incompat`] bits is recovered by that protocol
    /// (only its recovery can verify it; the others refuse it).
    pub fn recovery_for_image(
        self,
        s: &ordo_format::Superblock,
        dev: &dyn BlockDevice,
    ) -> ProtocolKind {
        if self.caps().log_replay {
            let incompat = jbd2::recovery::locate_journal(dev)
                .ok()
                .flatten()
                .and_then(|runs| {
                    let map = jbd2::recovery::JournalMap::new(runs);
                    jbd2::recovery::read_journal_super(dev, &map).ok()
                })
                .filter(|sb| sb.start != 0)
                .map_or(0, |sb| sb.feature_incompat);
            if let Some(k) = ProtocolKind::all()
                .find(|k| k.caps().log_incompat & incompat != 0 && k.caps().log_replay)
            {
                return k;
            }
        }
        self.recovery_for(s)
    }

    /// The recovery an image needs before `self` can run on it: that of the
    /// log-replaying protocol with the most required features the image has
    /// (an image with fast commits gets the fast-commit replay whether it
    /// is mounted `fast_commit` or `journal`, as the kernel replays them
    /// whatever the mount options: a JBD2 recovery alone would empty the log
    /// and discard fsynced fast commits). A protocol without a log runs its
    /// own (none).
    pub fn recovery_for(self, s: &ordo_format::Superblock) -> ProtocolKind {
        if !self.caps().log_replay {
            return self;
        }
        let has = |k: ProtocolKind| {
            let f = k.required_features();
            s.features.compat & f.compat == f.compat
                && s.features.incompat & f.incompat == f.incompat
                && s.features.ro_compat & f.ro_compat == f.ro_compat
        };
        let weight = |k: ProtocolKind| {
            let f = k.required_features();
            f.compat.count_ones() + f.incompat.count_ones() + f.ro_compat.count_ones()
        };
        ProtocolKind::all()
            .filter(|k| k.caps().log_replay && has(*k))
            .max_by_key(|k| weight(*k))
            .filter(|k| weight(*k) > weight(self))
            .unwrap_or(self)
    }
}

/// The registry's first protocol (`async`), as `-o mode=` defaults to.
impl Default for ProtocolKind {
    fn default() -> Self {
        ProtocolKind::from_spec(REGISTRY[0])
    }
}

impl PartialEq for ProtocolKind {
    fn eq(&self, other: &Self) -> bool {
        self.spec.name == other.spec.name && self.variant == other.variant
    }
}
impl Eq for ProtocolKind {}
impl std::hash::Hash for ProtocolKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.spec.name.hash(state);
        self.variant.hash(state)
    }
}
impl std::fmt::Debug for ProtocolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
/// `NAME`, or `NAME:VARIANT` for a variant other than the default.
impl std::fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.spec.name)?;
        if self.variant != 0 {
            write!(f, ":{}", self.variant())?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ProtocolKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if let Some((base, v)) = s.split_once(':') {
            if let Some(k) = ProtocolKind::all().find(|k| k.name() == base) {
                return k.with_variant(v).ok_or_else(|| {
                    if k.spec.variants.is_empty() {
                        format!("mode '{base}' has no variants (asked for '{v}')")
                    } else {
                        format!(
                            "unknown variant '{v}' of mode '{base}' (known: {})",
                            k.spec.variants.join(", ")
                        )
                    }
                });
            }
        }
        ProtocolKind::by_name(s).ok_or_else(|| {
            let names: Vec<_> = ProtocolKind::all().map(|k| k.name()).collect();
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

/// One write of a plan, named so that later writes can be ordered after
/// it: the number of the plan (plans are numbered as they are made, and
/// run in that order) and the write's place among the plan's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId {
    /// The plan's number.
    pub plan: u64,
    /// The write's index among the plan's writes (flushes and barriers
    /// not counted).
    pub index: u32,
}

/// The bytes of one write: images of whole blocks, laid end to end. A
/// run of cached blocks written home is the cache's own snapshots, not a
/// copy of them: the device gathers them (`pwritev`), so write-back holds
/// no second copy of what it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockImages(Vec<Arc<Vec<u8>>>);

impl BlockImages {
    /// The images, in order.
    pub fn parts(&self) -> &[Arc<Vec<u8>>] {
        &self.0
    }
    /// Total bytes.
    pub fn len(&self) -> usize {
        self.0.iter().map(|p| p.len()).sum()
    }
    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes in one buffer (shared when there is one part).
    pub fn joined(&self) -> Arc<Vec<u8>> {
        match self.0.as_slice() {
            [one] => one.clone(),
            parts => Arc::new(parts.iter().flat_map(|p| p.iter().copied()).collect()),
        }
    }
    /// Write them at `block` of `dev`, in one request.
    pub fn write_to(
        &self,
        dev: &dyn BlockDevice,
        block: u64,
        flags: WriteFlags,
    ) -> std::io::Result<ordo_dev::Ticket> {
        match self.0.as_slice() {
            [one] => dev.write(block, one, flags),
            parts => {
                let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
                dev.write_vectored(block, &slices, flags)
            }
        }
    }
    /// Each whole block's image, mutable (parts shared with the cache are
    /// copied first), with its offset in blocks from the first.
    fn blocks_mut(&mut self, block_size: usize) -> impl Iterator<Item = (u64, &mut [u8])> {
        self.0
            .iter_mut()
            .flat_map(move |p| Arc::make_mut(p).chunks_mut(block_size))
            .enumerate()
            .map(|(i, c)| (i as u64, c))
    }
}

impl From<Arc<Vec<u8>>> for BlockImages {
    fn from(one: Arc<Vec<u8>>) -> Self {
        BlockImages(vec![one])
    }
}

impl From<Vec<Arc<Vec<u8>>>> for BlockImages {
    fn from(parts: Vec<Arc<Vec<u8>>>) -> Self {
        BlockImages(parts)
    }
}

/// One step of an I/O plan.
#[derive(Clone, Debug)]
pub enum IoStep {
    /// Write `data` (whole blocks) at `block`.
    Write {
        block: u64,
        data: BlockImages,
        flags: WriteFlags,
        /// Earlier writes (of this plan or of earlier ones) this one must
        /// follow. The default executor issues every step in order, which
        /// honours them; a scheduler may reorder only what they allow.
        after: Vec<WriteId>,
    },
    /// Flush the device's volatile cache.
    Flush,
    /// Ordering without durability: every write before it is issued before
    /// any write after it (a scheduler's barrier; no cache flush).
    Barrier,
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
    /// The plan's number ([`WriteId::plan`]), given when it is made.
    pub serial: u64,
    /// The steps, in order.
    pub steps: Vec<IoStep>,
    /// Cached blocks whose snapshot is in this plan, with the cache generation
    /// snapshotted: the core marks each clean after the plan ran if it has not
    /// been modified since, and unpins it.
    pub pinned: Vec<(u64, u64)>,
    /// Protocol-defined tag passed back in [`Protocol::plan_done`] (e.g. the
    /// transaction id being committed).
    pub tag: u64,
    /// How many of `steps` are writes, counted up to step `counted`: the
    /// next write's index without a walk of the whole plan (a plan of a
    /// large write-back holds thousands of writes).
    writes: u32,
    counted: usize,
}

impl IoPlan {
    /// An empty plan numbered `serial`.
    pub fn numbered(serial: u64) -> Self {
        IoPlan {
            serial,
            ..IoPlan::default()
        }
    }
    /// True when the plan has nothing to do.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
    /// The writes of the plan, with their ids.
    pub fn writes(&self) -> impl Iterator<Item = (WriteId, &IoStep)> {
        let serial = self.serial;
        self.steps
            .iter()
            .filter(|s| matches!(s, IoStep::Write { .. }))
            .enumerate()
            .map(move |(i, s)| {
                (
                    WriteId {
                        plan: serial,
                        index: i as u32,
                    },
                    s,
                )
            })
    }
    /// The number of writes in the plan. Steps are only ever appended
    /// (steps set by hand, as tests do, on a plan nothing was counted in
    /// yet, are counted too), so only the steps since the last call are
    /// looked at.
    fn write_count(&mut self) -> u32 {
        if self.counted > self.steps.len() {
            self.writes = 0;
            self.counted = 0;
        }
        self.writes += self.steps[self.counted..]
            .iter()
            .filter(|s| matches!(s, IoStep::Write { .. }))
            .count() as u32;
        self.counted = self.steps.len();
        self.writes
    }
    fn push_write(&mut self, block: u64, data: BlockImages, flags: WriteFlags) -> WriteId {
        let id = WriteId {
            plan: self.serial,
            index: self.write_count(),
        };
        self.steps.push(IoStep::Write {
            block,
            data,
            flags,
            after: Vec::new(),
        });
        id
    }

    /// Give the protocol the last word on every block image the plan
    /// writes outside the log (home writes of cached blocks, and raw
    /// images of home blocks such as rolled-back or checkpointed copies):
    /// [`Protocol::prepare_block_write`], block by block. The one place
    /// images pass on their way to the device; the core calls it on every
    /// plan as it is queued. Log records (journal and fast-commit blocks)
    /// are the protocol's own writes and are not passed.
    pub fn prepare_images(&mut self, proto: &mut dyn Protocol, block_size: usize) {
        if !proto.prepares_block_writes() {
            return;
        }
        for step in &mut self.steps {
            let IoStep::Write {
                block, data, flags, ..
            } = step
            else {
                continue;
            };
            if matches!(flags.class, BlockClass::Journal | BlockClass::FastCommit) {
                continue;
            }
            for (i, chunk) in data.blocks_mut(block_size) {
                proto.prepare_block_write(*block + i, chunk);
            }
        }
    }
}

/// What the core tells a protocol after one of its plans ran: whether it
/// succeeded, the device's ticket of every write, and the device's durable
/// horizon afterwards (every write whose ticket is at or below it is
/// durable: after a flush, a FUA write or, on a write-cache model, a
/// destage). OptFS's durability notifications are built on it.
#[derive(Clone, Debug, Default)]
pub struct PlanDone {
    /// The plan's [`IoPlan::tag`].
    pub tag: u64,
    /// The plan's number.
    pub serial: u64,
    /// Every step ran without error.
    pub ok: bool,
    /// The writes issued, in order: id, first block, device ticket.
    pub writes: Vec<(WriteId, u64, ordo_dev::Ticket)>,
    /// The device's durable horizon when the plan finished.
    pub durable: ordo_dev::Ticket,
}

impl PlanDone {
    /// Whether write `id` of this plan is known durable.
    pub fn is_durable(&self, id: WriteId) -> bool {
        self.writes
            .iter()
            .any(|&(w, _, t)| w == id && t <= self.durable)
    }
}

/// Run a plan's steps on a device, in order (the default executor), and
/// report what the protocol is told after it. Every write's `after`
/// dependencies name earlier writes, so issuing in order honours them;
/// that is asserted here, as is a barrier's meaning.
pub fn execute_plan(plan: &IoPlan, dev: &dyn BlockDevice) -> (PlanDone, Result<()>) {
    let mut done = PlanDone {
        tag: plan.tag,
        serial: plan.serial,
        ok: true,
        writes: Vec::new(),
        durable: 0,
    };
    let mut r = Ok(());
    for (id, step) in plan.steps.iter().scan(0u32, |n, s| {
        let id = WriteId {
            plan: plan.serial,
            index: *n,
        };
        if matches!(s, IoStep::Write { .. }) {
            *n += 1;
        }
        Some((id, s))
    }) {
        let res = match step {
            IoStep::Write {
                block,
                data,
                flags,
                after,
            } => {
                for a in after {
                    assert!(
                        *a < id,
                        "plan {}: write {id:?} is ordered after {a:?}, which is not earlier",
                        plan.serial
                    );
                }
                data.write_to(dev, *block, *flags).map(|t| {
                    done.writes.push((id, *block, t));
                })
            }
            IoStep::Flush => dev.flush(),
            IoStep::Barrier => Ok(()),
        };
        if let Err(e) = res {
            r = Err(e.into());
            done.ok = false;
            break;
        }
    }
    done.durable = dev.durable();
    (done, r)
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

    /// For `image`, an image of group-descriptor block `block`: set the
    /// block- and inode-bitmap checksums its descriptors carry from the
    /// bitmap images `bitmap(b)` gives (`None`: that checksum is left as
    /// it is). Run it before [`Sealer::reseal`], which seals the
    /// descriptors over them. Default: nothing.
    fn seal_bitmap_csums(
        &self,
        block: u64,
        image: &mut [u8],
        bitmap: &dyn Fn(u64) -> Option<Arc<Vec<u8>>>,
    ) {
        let _ = (block, image, bitmap);
    }

    /// The group-descriptor block whose descriptor carries bitmap block
    /// `block`'s checksum, if `block` is a bitmap. Default: none.
    fn bitmap_desc_block(&self, block: u64) -> Option<u64> {
        let _ = block;
        None
    }
}

/// What a protocol sees of the core while it plans I/O: the buffer cache
/// (read-only, plus snapshot-and-pin) and the plan being built.
pub struct Io<'a> {
    cache: &'a mut BufferCache,
    plan: &'a mut IoPlan,
    sealer: Option<&'a dyn Sealer>,
    /// The newest generation of each block that a queued or running plan
    /// sends home ([`Io::dirty_blocks_not_in_flight`]).
    in_flight: Option<&'a rustc_hash::FxHashMap<u64, u64>>,
}

impl<'a> Io<'a> {
    /// Build an `Io` over a cache and a plan.
    pub fn new(cache: &'a mut BufferCache, plan: &'a mut IoPlan) -> Self {
        Io {
            cache,
            plan,
            sealer: None,
            in_flight: None,
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
            in_flight: None,
        }
    }
    /// Let [`Io::dirty_blocks_not_in_flight`] see what earlier plans send
    /// home: block -> the newest generation a queued or running plan
    /// writes.
    pub fn with_in_flight(mut self, in_flight: &'a rustc_hash::FxHashMap<u64, u64>) -> Self {
        self.in_flight = Some(in_flight);
        self
    }
    /// Recompute the checksums of `image`, an image of `block` other than
    /// the cached one (no-op when the core gave no sealer).
    pub fn reseal(&self, block: u64, image: &mut [u8]) {
        if let Some(s) = self.sealer {
            s.reseal(block, image);
        }
    }
    /// [`Sealer::seal_bitmap_csums`] of the core's sealer (no-op without one).
    pub fn seal_bitmap_csums(
        &self,
        block: u64,
        image: &mut [u8],
        bitmap: &dyn Fn(u64) -> Option<Arc<Vec<u8>>>,
    ) {
        if let Some(s) = self.sealer {
            s.seal_bitmap_csums(block, image, bitmap);
        }
    }
    /// [`Sealer::bitmap_desc_block`] of the core's sealer.
    pub fn bitmap_desc_block(&self, block: u64) -> Option<u64> {
        self.sealer.and_then(|s| s.bitmap_desc_block(block))
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.cache.block_size()
    }
    /// Every dirty cached block, ascending.
    pub fn dirty_blocks(&self) -> Vec<u64> {
        self.cache.dirty_blocks()
    }
    /// The dirty blocks, ascending, but those whose current image an
    /// earlier plan already sends home (queued or running: plans run in
    /// order, and the block is marked clean when that one has run). A
    /// write-back for memory pressure wants these: sending them again
    /// only copies them and writes them twice. Without the core's view of
    /// the plans in flight, every dirty block.
    pub fn dirty_blocks_not_in_flight(&self) -> Vec<u64> {
        let mut v = self.cache.dirty_blocks();
        if let Some(f) = self.in_flight {
            v.retain(|b| f.get(b) != Some(&self.cache.generation(*b)));
        }
        v
    }
    /// What a write-back that sends every dirty block home sends: all of
    /// them, or under memory pressure (`pressure`) those no earlier plan
    /// already sends ([`Io::dirty_blocks_not_in_flight`]).
    pub fn dirty_to_send(&self, pressure: bool) -> Vec<u64> {
        if pressure {
            self.dirty_blocks_not_in_flight()
        } else {
            self.dirty_blocks()
        }
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
        if let Some((data, class, gen)) = self.cache.peek(block) {
            self.cache.pin(block);
            self.plan.pinned.push((block, gen));
            self.plan
                .push_write(block, data.into(), WriteFlags { fua, class });
        }
    }
    /// Like [`Io::write_home`] for every cached block of `blocks` (sorted
    /// ascending), coalescing consecutive blocks of one class into one
    /// multi-block write (at most `max_run` blocks each).
    pub fn write_home_runs(&mut self, blocks: &[u64], fua: bool, max_run: usize) {
        let blocks: Vec<(u64, Option<Arc<Vec<u8>>>)> = blocks.iter().map(|&b| (b, None)).collect();
        self.write_runs(&blocks, fua, max_run);
    }
    /// [`Io::write_home_runs`] where some blocks go out as an image other
    /// than the cache's (`Some`: a rolled-back image): those are written
    /// as [`Io::write_raw`] writes them, neither pinned nor made clean, but
    /// in the same run as their neighbours, so that holding back part of
    /// a block does not split the request it sits in. `None` blocks are
    /// the cache's current images, pinned and made clean as
    /// [`Io::write_home`] does. Sorted ascending (a block out of order
    /// only starts a new run); blocks not cached are skipped.
    pub fn write_runs(
        &mut self,
        blocks: &[(u64, Option<Arc<Vec<u8>>>)],
        fua: bool,
        max_run: usize,
    ) {
        let bs = self.cache.block_size() as usize;
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i].0;
            // One lookup per block for its image, class and generation
            // (`BufferCache::peek`), one more to pin it.
            let Some((d0, class, g0)) = self.cache.peek(first) else {
                i += 1;
                continue;
            };
            // The run is the snapshots themselves, gathered by the device:
            // no copy, and no second image of each block held while the
            // plan waits to run.
            let mut images = Vec::new();
            let mut members = Vec::new();
            let mut take =
                |b: u64, cached: Arc<Vec<u8>>, gen: u64, own: &Option<Arc<Vec<u8>>>| match own {
                    Some(img) => {
                        assert_eq!(img.len(), bs, "block {b}: an image of {} bytes", img.len());
                        images.push(img.clone());
                    }
                    None => {
                        images.push(cached);
                        members.push((b, gen));
                    }
                };
            take(first, d0, g0, &blocks[i].1);
            let mut len = 1u64;
            let mut j = i + 1;
            while j < blocks.len() && (len as usize) < max_run.max(1) && blocks[j].0 == first + len
            {
                let Some((d, c, g)) = self.cache.peek(blocks[j].0) else {
                    break;
                };
                if c != class {
                    break;
                }
                take(blocks[j].0, d, g, &blocks[j].1);
                len += 1;
                j += 1;
            }
            for (b, gen) in members {
                self.cache.pin(b);
                self.plan.pinned.push((b, gen));
            }
            self.plan
                .push_write(first, images.into(), WriteFlags { fua, class });
            i = j;
        }
    }
    /// Append a write of raw data (whole blocks) at `block` (journal blocks,
    /// committed copies during checkpoint). Does not touch the cache's state.
    pub fn write_raw(&mut self, block: u64, data: Arc<Vec<u8>>, flags: WriteFlags) {
        assert!(!data.is_empty() && data.len().is_multiple_of(self.cache.block_size() as usize));
        self.plan.push_write(block, data.into(), flags);
    }
    /// [`Io::write_raw`] of a write that must follow the writes `after`
    /// (of this plan or earlier ones, as [`Io::order_after`] names them);
    /// returns its id.
    pub fn write_raw_after(
        &mut self,
        block: u64,
        data: Arc<Vec<u8>>,
        flags: WriteFlags,
        after: Vec<WriteId>,
    ) -> WriteId {
        assert!(!data.is_empty() && data.len().is_multiple_of(self.cache.block_size() as usize));
        let id = self.plan.push_write(block, data.into(), flags);
        assert!(
            after.iter().all(|a| *a < id),
            "{id:?} cannot be ordered after a later write ({after:?})"
        );
        if let Some(IoStep::Write { after: a, .. }) = self.plan.steps.last_mut() {
            *a = after;
        }
        id
    }
    /// Like [`Io::write_raw`] for a sequence of block images, in order,
    /// each joined to the write before it when it is the next block on disk
    /// and of the same class (at most [`MAX_RUN_BYTES`] per write);
    /// returns the writes appended. The images are gathered as they are
    /// ([`BlockImages`]), not copied: a checkpoint's committed copies, or
    /// a commit's logged images, are not held twice while the plan waits.
    pub fn write_raw_runs(
        &mut self,
        blocks: impl IntoIterator<Item = (u64, BlockClass, Arc<Vec<u8>>)>,
        fua: bool,
    ) -> u32 {
        /// A run being gathered.
        struct Run {
            at: u64,
            class: BlockClass,
            parts: Vec<Arc<Vec<u8>>>,
            bytes: usize,
        }
        fn emit(plan: &mut IoPlan, r: Run, fua: bool) {
            let flags = WriteFlags {
                fua,
                class: r.class,
            };
            plan.push_write(r.at, r.parts.into(), flags);
        }
        let bs = self.cache.block_size() as usize;
        let mut writes = 0;
        let mut run: Option<Run> = None;
        for (b, class, img) in blocks {
            assert!(!img.is_empty() && img.len().is_multiple_of(bs));
            match &mut run {
                Some(r)
                    if r.class == class
                        && r.at + (r.bytes / bs) as u64 == b
                        && r.bytes < MAX_RUN_BYTES =>
                {
                    r.bytes += img.len();
                    r.parts.push(img);
                }
                _ => {
                    if let Some(r) = run.take() {
                        emit(self.plan, r, fua);
                        writes += 1;
                    }
                    run = Some(Run {
                        at: b,
                        class,
                        bytes: img.len(),
                        parts: vec![img],
                    });
                }
            }
        }
        if let Some(r) = run {
            emit(self.plan, r, fua);
            writes += 1;
        }
        writes
    }
    /// Append a cache flush.
    pub fn flush(&mut self) {
        self.plan.steps.push(IoStep::Flush);
    }
    /// Append a barrier: writes after it are issued after every write
    /// before it (ordering only: nothing is made durable).
    pub fn barrier(&mut self) {
        self.plan.steps.push(IoStep::Barrier);
    }
    /// The id of the plan's last write so far, if any.
    pub fn last_write(&self) -> Option<WriteId> {
        self.plan.writes().last().map(|(id, _)| id)
    }
    /// Order write `later` (of this plan) after `earlier`, a write of this
    /// plan or of an earlier one. Panics when `earlier` is not earlier, or
    /// `later` is not a write of this plan: a protocol naming the future is
    /// a bug in the protocol.
    pub fn order_after(&mut self, later: WriteId, earlier: WriteId) {
        assert!(
            earlier < later,
            "{later:?} cannot be ordered after {earlier:?}"
        );
        assert_eq!(
            later.plan, self.plan.serial,
            "{later:?} is not in this plan"
        );
        let step = self
            .plan
            .steps
            .iter_mut()
            .filter(|s| matches!(s, IoStep::Write { .. }))
            .nth(later.index as usize);
        match step {
            Some(IoStep::Write { after, .. }) => after.push(earlier),
            _ => panic!("{later:?} is not a write of this plan"),
        }
    }
    /// Keep cached `block` pinned until this plan ran, then mark it clean
    /// if it is still at generation `gen` (a committed copy written home by
    /// a checkpoint, or an image written raw). Does nothing if the block is
    /// not dirty at that generation.
    pub fn pin_until_done(&mut self, block: u64, gen: u64) {
        if self.cache.generation(block) == gen && self.cache.is_dirty(block) {
            self.cache.pin(block);
            self.plan.pinned.push((block, gen));
        }
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
    /// Background-flush interval in milliseconds (`flush_interval=`).
    pub flush_interval_ms: u64,
    /// JBD2 data mode.
    pub data_mode: DataMode,
    /// Whether the image has `metadata_csum`.
    pub metadata_csum: bool,
    /// The mount's clock (commit-block times, the `dtime` a replay stamps).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// The variant mounted (`-o mode=NAME:VARIANT`; see
    /// [`ProtocolSpec::variants`]), `""` when the protocol has none.
    pub variant: &'static str,
}

/// A set of the durability calls beyond fsync/sync ([`Protocol::osync`],
/// [`Protocol::dsync`], [`Protocol::streamsync`]): the ones a protocol
/// implements natively. A call not in the set falls back to fsync (osync,
/// dsync) or sync (streamsync), a stronger guarantee than asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DurabilityCalls(u8);

impl DurabilityCalls {
    /// No call native: every one falls back.
    pub const NONE: DurabilityCalls = DurabilityCalls(0);
    /// `osync`: an ordering point that does not wait for durability.
    pub const OSYNC: DurabilityCalls = DurabilityCalls(1);
    /// `dsync`: durability of one file.
    pub const DSYNC: DurabilityCalls = DurabilityCalls(2);
    /// `streamsync`: durability of one stream.
    pub const STREAMSYNC: DurabilityCalls = DurabilityCalls(4);

    /// Both sets together.
    pub const fn union(self, other: DurabilityCalls) -> DurabilityCalls {
        DurabilityCalls(self.0 | other.0)
    }
    /// Whether every call of `other` is in the set.
    pub const fn contains(self, other: DurabilityCalls) -> bool {
        self.0 & other.0 == other.0
    }
    /// The calls of the set by name (`osync`, `dsync`, `streamsync`), in
    /// that order.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Self::OSYNC, "osync"),
            (Self::DSYNC, "dsync"),
            (Self::STREAMSYNC, "streamsync"),
        ]
        .into_iter()
        .filter(|(c, _)| self.contains(*c))
        .map(|(_, n)| n)
        .collect()
    }
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

    /// Whether the protocol still needs freed `block` written: it holds
    /// updates of the block that are not durable yet (soft updates: a
    /// directory emptied and removed, whose entries' removals other updates
    /// wait for). The core then keeps the block cached, dirty, with what
    /// its checksums are seeded by, instead of dropping it when the handle
    /// ends; the protocol writes it like any dirty block and refuses its
    /// reuse ([`Protocol::can_allocate`]) meanwhile. Default: no.
    fn keeps_freed_block(&self, block: u64) -> bool {
        let _ = block;
        false
    }

    /// Whether freed blocks are held back from reuse until a commit (or
    /// a plan in flight) is durable: an allocation that failed may succeed
    /// after [`Protocol::sync`].
    fn has_pending_frees(&self) -> bool {
        false
    }

    /// How many free blocks are held back from reuse now
    /// ([`Protocol::can_allocate`] refuses them): the core keeps what it
    /// has promised to delayed allocations within what can really be
    /// allocated. Default: none.
    fn held_back_blocks(&self) -> u64 {
        0
    }

    /// Whether the core delays the allocation of new file blocks until
    /// the next commit (ccfs's order-preserving delayed allocation,
    /// `delalloc.rs`): a block written into a hole gets its physical place
    /// only when a commit is about to be made (before every plan the core asks for, and
    /// [`Protocol::commit_due`] at a handle's end), so that every commit
    /// carries every allocation its transaction's sizes name, and appends
    /// of several files interleaved in time are laid out each in one run.
    /// Default: no (blocks are allocated when written).
    fn delays_allocation(&self) -> bool {
        false
    }

    /// With [`Protocol::delays_allocation`]: whether
    /// [`Protocol::on_handle_end`] of handle `h` is going to commit (a
    /// transaction outgrew its bound); the core then places every delayed
    /// block first. Default: no.
    fn commit_due(&self, h: &HandleInfo) -> bool {
        let _ = h;
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

    /// [`Protocol::fsync`] of files `inos` (never empty) called from
    /// stream `stream` (the caller's [`HandleInfo::stream`]): one caller's
    /// file, or with group commit every waiting caller's. A protocol that
    /// keeps streams apart commits the caller's stream with the files
    /// (ccfs's fsync commits its stream). Default: [`Protocol::fsync`] of
    /// the first, for the protocols whose commit covers everything.
    fn fsync_in(&mut self, stream: u32, inos: &[Ino], datasync: bool, io: &mut Io) -> Result<()> {
        let _ = stream;
        self.fsync(inos[0], datasync, io)
    }

    /// Make everything durable.
    fn sync(&mut self, io: &mut Io) -> Result<()>;

    /// An ordering point for `ino` (OptFS's `osync`): every change made
    /// before the call reaches the disk before any change made after it,
    /// without waiting for durability. Default: the nearest stronger
    /// guarantee every protocol has, [`Protocol::fsync`] of `ino`.
    fn osync(&mut self, ino: Ino, io: &mut Io) -> Result<()> {
        self.fsync(ino, false, io)
    }

    /// Make `ino` durable (OptFS's `dsync`). Default: [`Protocol::fsync`]
    /// of `ino`, which is exactly that.
    fn dsync(&mut self, ino: Ino, io: &mut Io) -> Result<()> {
        self.fsync(ino, false, io)
    }

    /// Make every change of stream `stream` durable (ccfs's
    /// `streamsync`; `stream` is a [`HandleInfo::stream`] value).
    /// Default: the nearest stronger guarantee every protocol has,
    /// [`Protocol::sync`] of everything.
    fn streamsync(&mut self, stream: u32, io: &mut Io) -> Result<()> {
        let _ = stream;
        self.sync(io)
    }

    /// Which of [`Protocol::osync`], [`Protocol::dsync`] and
    /// [`Protocol::streamsync`] the protocol implements itself rather than
    /// through the fsync/sync defaults (reported by `ordo info`, and used
    /// by the core to know when an osync may share an fsync's commit).
    fn native_durability_calls(&self) -> DurabilityCalls {
        DurabilityCalls::NONE
    }

    /// How often the protocol wants [`WriteBackReason::Timer`], when more
    /// often than the commit interval (a background flush that turns
    /// ordered work durable). Default: the commit interval.
    fn tick_interval_ms(&self) -> Option<u64> {
        None
    }

    /// Background work: periodic write-back, checkpointing, write-back under
    /// memory pressure, and the final write-back at unmount.
    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()>;

    /// The last word on a block image on its way to the device
    /// (rollback, stamping): called by the core, through
    /// [`IoPlan::prepare_images`], on every image a plan writes outside
    /// the log, when [`Protocol::prepares_block_writes`] says so. Default:
    /// unchanged.
    fn prepare_block_write(&mut self, block: u64, image: &mut [u8]) {
        let _ = (block, image);
    }

    /// Whether [`Protocol::prepare_block_write`] changes images (the core
    /// copies an image only for a protocol that does).
    fn prepares_block_writes(&self) -> bool {
        false
    }

    /// Whether a free block may be allocated now (reuse rules).
    fn can_allocate(&self, block: u64) -> bool {
        let _ = block;
        true
    }

    /// Whether free inode `ino` may be allocated now by handle `h` (reuse
    /// rules: streams hold an inode another stream freed until the freeing
    /// transaction commits). Default: yes.
    fn can_allocate_inode(&self, ino: Ino, h: &HandleInfo) -> bool {
        let _ = (ino, h);
        true
    }

    /// Whether handle `h` may write a new directory entry over bytes
    /// `range` of directory block `block` (reuse rules: streams hold the
    /// space of an entry another stream removed until that removal
    /// commits; the core then looks further, or adds a block). Default:
    /// yes.
    fn can_reuse_dir_space(
        &self,
        block: u64,
        range: std::ops::Range<usize>,
        h: &HandleInfo,
    ) -> bool {
        let _ = (block, range, h);
        true
    }

    /// A plan made by this protocol has been executed: whether it
    /// succeeded, each write's device ticket and the device's durable
    /// horizon afterwards.
    fn plan_done(&mut self, done: &PlanDone) {
        let _ = done;
    }

    /// A durability notification that came without a plan: the device's
    /// durable horizon now (every write whose ticket is at or below it is
    /// durable). The core sends one before every timer write-back, so
    /// that a write the device made durable on its own (a write cache
    /// destaged it) is known without asking for a flush.
    fn durable_notice(&mut self, durable: ordo_dev::Ticket) {
        let _ = durable;
    }

    /// With `caps.backlinks`: how many blocks the protocol's owner table
    /// needs on a file system of `block_count` blocks (0: none). The core
    /// keeps them as the data of the reserved inode 5 and hands them to
    /// [`Protocol::attach_owner_table`] at mount.
    fn owner_table_blocks(&self, block_count: u64) -> u64 {
        let _ = block_count;
        0
    }

    /// The owner table's physical blocks, in table order, at mount, with
    /// the superblock's stamp before this mount (`s_mnt_count`, `s_mtime`)
    /// and the one this mount writes. The protocol reads the table from
    /// `dev` and answers whether it can be trusted (written by ordo up to
    /// this image's last mount, every block intact); `false` makes the
    /// core rebuild every record ([`Protocol::record_owner`]) before the
    /// file system is used. It may write to `dev` (and flush) before the
    /// superblock with the new stamp goes out.
    fn attach_owner_table(
        &mut self,
        blocks: &[u64],
        before: (u32, u32),
        now: (u32, u32),
        dev: &dyn BlockDevice,
    ) -> Result<bool> {
        let _ = (blocks, before, now, dev);
        Ok(true)
    }

    /// A rebuild of the owner table: `pblk` holds `data` of `owner`
    /// (`None`: it is no file's block).
    fn record_owner(&mut self, pblk: u64, owner: Option<BlockOwner>, data: &[u8]) {
        let _ = (pblk, owner, data);
    }

    /// A file block moved within its file without being written
    /// (collapse or insert range): `pblk`, `owner`'s until now, is now its
    /// logical block `new_lblk`.
    fn on_data_moved(&mut self, owner: BlockOwner, pblk: u64, new_lblk: u32) {
        let _ = (owner, pblk, new_lblk);
    }

    /// Every block the owner table says `ino` (of `generation`) holds, as
    /// (logical, physical), in logical order: what the scanners rebuild a
    /// file's map from when its extent tree did not survive a crash.
    fn blocks_owned_by(&self, ino: Ino, generation: u32) -> Vec<(u32, u64)> {
        let _ = (ino, generation);
        Vec::new()
    }

    /// The owner the table names for `pblk` (`None`: none, or no table).
    fn block_owner(&self, pblk: u64) -> Option<BlockOwner> {
        let _ = pblk;
        None
    }

    /// File block `pblk`, read from the device as `owner`'s, holds `data`:
    /// `Err` (EIO) when the owner record disagrees.
    fn check_block_read(&mut self, owner: BlockOwner, pblk: u64, data: &[u8]) -> Result<()> {
        let _ = (owner, pblk, data);
        Ok(())
    }

    /// With `caps.backlinks`: whether the core checks the owner marks of
    /// the blocks that carry one (attribute blocks); `false` only in a
    /// deliberately broken variant, as `check_block_read` accepting all.
    fn checks_owner_marks(&self) -> bool {
        true
    }

    /// With `caps.backlinks`: whether the on-disk allocation state (bitmaps
    /// and counts) may be trusted after an unclean mount. `false` (NoFS)
    /// makes the core run its scanners before the first allocation.
    fn trusts_allocation_state(&self) -> bool {
        true
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
/// core opens it (journal replay, fast-commit replay, or nothing), and
/// return its report (the state it would hand to the protocol is dropped).
pub fn recover(
    kind: ProtocolKind,
    dev: &dyn BlockDevice,
    env: &ProtocolEnv,
) -> Result<RecoveryReport> {
    kind.recover(dev, env).map(|r| r.report)
}

/// The recovery of a protocol without a log: nothing.
pub fn recover_nothing(_dev: &dyn BlockDevice, _env: &ProtocolEnv) -> Result<Recovered> {
    Ok(Recovered::none())
}

#[cfg(test)]
mod io_tests {
    use super::*;

    #[test]
    fn a_pressure_write_back_skips_what_a_plan_in_flight_sends_at_its_current_image() {
        let mut cache = BufferCache::new(4096, 1 << 20);
        for b in 10..14 {
            cache.insert_new(b, BlockClass::Data, vec![b as u8; 4096]);
        }
        // 10 is in flight at its current image; 11 was in flight and has
        // changed since; 12 and 13 are in no plan.
        let mut in_flight = rustc_hash::FxHashMap::default();
        in_flight.insert(10, cache.generation(10));
        in_flight.insert(11, cache.generation(11));
        cache.modify(11, 0, &[0xee]);
        let mut plan = IoPlan::numbered(0);
        let io = Io::new(&mut cache, &mut plan).with_in_flight(&in_flight);
        assert_eq!(io.dirty_blocks_not_in_flight(), vec![11, 12, 13]);
        assert_eq!(io.dirty_blocks(), vec![10, 11, 12, 13]);
        // Without the core's view, every dirty block.
        let io = Io::new(&mut cache, &mut plan);
        assert_eq!(io.dirty_blocks_not_in_flight(), vec![10, 11, 12, 13]);
    }

    #[test]
    fn a_rolled_back_image_rides_in_its_neighbours_run_and_stays_dirty() {
        let mut cache = BufferCache::new(4096, 1 << 20);
        for b in 10..14 {
            cache.insert_new(b, BlockClass::InodeTable, vec![b as u8; 4096]);
        }
        cache.insert_new(14, BlockClass::Data, vec![14; 4096]);
        let mut plan = IoPlan::numbered(0);
        let mut io = Io::new(&mut cache, &mut plan);
        let rolled = Arc::new(vec![0xaa; 4096]);
        let blocks = vec![
            (10, None),
            (11, Some(rolled.clone())),
            (12, None),
            (13, None),
            (14, None),
        ];
        io.write_runs(&blocks, false, MAX_RUN_BLOCKS);
        // One request for the four inode-table blocks (the rolled-back
        // image in its place), another for the data block of another class.
        let writes: Vec<(u64, Vec<u8>)> = plan
            .steps
            .iter()
            .map(|s| match s {
                IoStep::Write { block, data, .. } => {
                    (*block, data.parts().iter().map(|p| p[0]).collect())
                }
                other => panic!("not a write: {other:?}"),
            })
            .collect();
        assert_eq!(writes, vec![(10, vec![10, 0xaa, 12, 13]), (14, vec![14])]);
        // The cache's images are pinned and made clean once the plan ran;
        // the rolled-back block is not: what it holds back is still to go.
        let pinned: Vec<u64> = plan.pinned.iter().map(|p| p.0).collect();
        assert_eq!(pinned, vec![10, 12, 13, 14]);
    }
}
