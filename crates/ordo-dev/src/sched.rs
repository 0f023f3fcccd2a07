//! The I/O scheduler: a queue of outstanding requests between the file
//! system and the device, and the disk scheduler that chooses which of them
//! the device serves next.
//!
//! This is the device driver of Ganger & Patt's "Metadata update
//! performance in file systems" (OSDI '94) §2-3: requests are queued with
//! their ordering constraints, the scheduler chooses only among the
//! *eligible* ones, sequential requests are concatenated into one disk
//! request, and the driver's response time (queue time + disk service time)
//! is what the paper's figures report.
//!
//! * **Requests.** A write carries its data and may name earlier requests
//!   it must follow ([`Scheduler::submit_write`]'s `after`); a read
//!   ([`Scheduler::submit_read`]) goes through the same queue; a flush
//!   ([`Scheduler::flush`]) is issued to the device. A request is
//!   *eligible* when every request it names has completed and every request
//!   before the last barrier or flush it was submitted after has completed.
//! * **Barriers.** [`Scheduler::barrier`] makes every request submitted after
//!   it wait for every request submitted before it; a flush is ordered like
//!   a barrier on both sides.
//! * **Implicit order.** Requests on overlapping blocks keep their
//!   submission order (a write after an earlier write or read of the same
//!   block, as any driver must), so the device ends with the last image
//!   submitted. A read of blocks that queued writes hold is served from
//!   their data: entirely, without a device request, when they cover it
//!   all; otherwise the rest comes from the device.
//! * **Policies** ([`Policy`]): `Fifo` (submission order), `CLook` (ascending
//!   block from the head's position, wrapping to the lowest), `Sptf`
//!   (shortest positioning time first, by the HDD model's seek and rotation
//!   cost, a run of consecutive requests entered at its start; C-LOOK on
//!   devices without positioning). Ties go to the earlier request.
//! * **Concatenation.** Once a request is chosen, eligible requests of the
//!   same direction (and, for writes, the same FUA flag) that start where
//!   it ends join it, up to [`SchedConfig::max_merge_bytes`]: one device
//!   request, one ticket for all of them.
//!
//! **Time.** On a timing model ([`crate::TimedDevice`], found through
//! [`BlockDevice::timing`]) the scheduler runs in virtual time, one request
//! at a time (the 1994 disk had no command queueing): every request queued
//! when [`Scheduler::run`] starts arrives at the model's clock then; it
//! waits while the disk serves the ones chosen before it; its response time
//! is that wait plus its own service time (the model's clock before and
//! after the disk request). Same requests, same model: same figures.
//!
//! **Real devices.** Without a model the scheduler issues in rounds: the
//! eligible set, in the policy's order and concatenated, is issued
//! concurrently (up to [`SchedConfig::max_in_flight`] requests at once,
//! from scoped threads, each a `pwrite`/`pread` on a file device), and the
//! next round starts when the round completed. Times are wall-clock then.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::{BlockClass, BlockDevice, Ticket, Timing, WriteFlags, BLOCK_CLASS_COUNT};

/// How the disk scheduler chooses among eligible requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Submission order.
    Fifo,
    /// Circular LOOK: the lowest block at or above the head's position,
    /// else the lowest block.
    CLook,
    /// Shortest positioning time first under an HDD model (seek plus
    /// rotation from the head); C-LOOK on devices without positioning.
    Sptf,
    /// A seeded random choice among the eligible requests, issued one at a
    /// time: every order the constraints allow can come out, and the same
    /// seed gives the same order. The crash explorer records with it, so
    /// that its crash states cover the scheduler's freedom, not one
    /// policy's choices.
    Random(u64),
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 3] = [Policy::Fifo, Policy::CLook, Policy::Sptf];

    /// The `sched=` name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::CLook => "clook",
            Policy::Sptf => "sptf",
            Policy::Random(_) => "random",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Random(seed) => write!(f, "random:{seed}"),
            p => f.write_str(p.name()),
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "random" {
            return Ok(Policy::Random(0));
        }
        if let Some(seed) = s.strip_prefix("random:") {
            return seed
                .parse()
                .map(Policy::Random)
                .map_err(|_| format!("bad seed in I/O scheduler '{s}' (random:N)"));
        }
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown I/O scheduler '{s}' (known: fifo, clook, sptf, random[:SEED])")
            })
    }
}

/// How a scheduler is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// The disk scheduling policy.
    pub policy: Policy,
    /// Largest device request concatenation makes, in bytes (a request
    /// larger than this on its own is issued as it is).
    pub max_merge_bytes: usize,
    /// Most device requests in flight at once on a real device (1: one at
    /// a time, in the chosen order). A timing model always serves one at
    /// a time.
    pub max_in_flight: usize,
}

impl SchedConfig {
    /// `policy` with 1 MiB concatenation and 8 requests in flight.
    pub fn new(policy: Policy) -> Self {
        SchedConfig {
            policy,
            max_merge_bytes: 1 << 20,
            max_in_flight: 8,
        }
    }
}

/// A request's number, handed out in submission order.
pub type ReqId = u64;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqKind {
    /// A read.
    Read,
    /// A write.
    Write,
    /// A cache flush.
    Flush,
}

/// One request the scheduler completed, in the order the device served
/// them (within one round on a real device: the order they were issued).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request.
    pub id: ReqId,
    /// What it was.
    pub kind: ReqKind,
    /// Its first block (0 for a flush).
    pub block: u64,
    /// Its length in blocks (0 for a flush).
    pub blocks: u64,
    /// The device's ticket (writes only; requests concatenated into one
    /// device request share it).
    pub ticket: Option<Ticket>,
    /// The number of the device request that carried it: equal for
    /// requests concatenated together.
    pub dispatch: u64,
    /// Time it waited in the queue, nanoseconds.
    pub queue_ns: u64,
    /// Service time of its device request, nanoseconds.
    pub service_ns: u64,
}

impl Completion {
    /// Driver response time: queue plus service.
    pub fn response_ns(&self) -> u64 {
        self.queue_ns + self.service_ns
    }
}

/// Counts and time sums of one class of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReqTimes {
    /// Requests completed.
    pub requests: u64,
    /// Sum of queue times, nanoseconds.
    pub queue_ns: u64,
    /// Sum of service times, nanoseconds.
    pub service_ns: u64,
}

impl ReqTimes {
    fn add(&mut self, c: &Completion) {
        self.requests += 1;
        self.queue_ns += c.queue_ns;
        self.service_ns += c.service_ns;
    }
    fn plus(mut self, o: &ReqTimes) -> ReqTimes {
        self.requests += o.requests;
        self.queue_ns += o.queue_ns;
        self.service_ns += o.service_ns;
        self
    }
    /// Sum of response times (queue + service), nanoseconds.
    pub fn response_ns(&self) -> u64 {
        self.queue_ns + self.service_ns
    }
    /// Average driver response time, nanoseconds (0 without requests).
    pub fn avg_response_ns(&self) -> u64 {
        self.response_ns().checked_div(self.requests).unwrap_or(0)
    }
}

/// What a scheduler has done: per-class request counts and time sums (the
/// paper's average driver response time), and the device requests they
/// became after concatenation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SchedStats {
    /// Reads, by [`BlockClass`] (`as usize`).
    pub reads: [ReqTimes; BLOCK_CLASS_COUNT],
    /// Writes, by [`BlockClass`].
    pub writes: [ReqTimes; BLOCK_CLASS_COUNT],
    /// Flushes.
    pub flushes: ReqTimes,
    /// Read and write requests the device received (after concatenation).
    pub disk_requests: u64,
    /// Requests that joined another's device request.
    pub merged: u64,
    /// Reads served entirely from queued writes (no device request).
    pub reads_from_queue: u64,
    /// Times are virtual (a timing model), not wall-clock.
    pub virtual_time: bool,
}

impl SchedStats {
    /// Every read.
    pub fn all_reads(&self) -> ReqTimes {
        self.reads
            .iter()
            .fold(ReqTimes::default(), |a, r| a.plus(r))
    }
    /// Every write.
    pub fn all_writes(&self) -> ReqTimes {
        self.writes
            .iter()
            .fold(ReqTimes::default(), |a, r| a.plus(r))
    }
    /// Every request (reads, writes, flushes).
    pub fn all(&self) -> ReqTimes {
        self.all_reads()
            .plus(&self.all_writes())
            .plus(&self.flushes)
    }
}

enum Op {
    Read {
        class: BlockClass,
        /// Bytes of queued writes at submission: (offset in the read,
        /// data), applied in order over what the device returns.
        overlay: Vec<(usize, Vec<u8>)>,
    },
    Write {
        data: Arc<Vec<u8>>,
        flags: WriteFlags,
    },
    Flush,
}

struct Pending {
    op: Op,
    block: u64,
    blocks: u64,
    after: Vec<ReqId>,
    epoch: u64,
    arrival_ns: Option<u64>,
}

impl Pending {
    fn kind(&self) -> ReqKind {
        match self.op {
            Op::Read { .. } => ReqKind::Read,
            Op::Write { .. } => ReqKind::Write,
            Op::Flush => ReqKind::Flush,
        }
    }
    fn overlaps(&self, block: u64, blocks: u64) -> bool {
        !matches!(self.op, Op::Flush)
            && self.block < block + blocks
            && block < self.block + self.blocks
    }
    /// Whether `o` may join a device request of `self`'s.
    fn joins(&self, o: &Pending) -> bool {
        match (&self.op, &o.op) {
            (Op::Read { .. }, Op::Read { .. }) => true,
            (Op::Write { flags: a, .. }, Op::Write { flags: b, .. }) => a.fua == b.fua,
            _ => false,
        }
    }
}

/// One device request: the requests concatenated into it, in block order.
struct Group {
    ids: Vec<ReqId>,
}

/// What one device request returned.
enum Served {
    Write(Ticket),
    Read(Vec<u8>),
    Flush,
}

/// The queue of outstanding requests and the disk scheduler; see the
/// module documentation.
pub struct Scheduler {
    config: SchedConfig,
    block_size: u32,
    pending: BTreeMap<ReqId, Pending>,
    next_id: ReqId,
    epoch: u64,
    /// Block after the last device request (C-LOOK's head when the device
    /// does not say where its head is).
    head: u64,
    dispatches: u64,
    stats: SchedStats,
    reads_done: HashMap<ReqId, Vec<u8>>,
    started: Instant,
    /// `Policy::Random`'s generator state (SplitMix64).
    rng: std::sync::atomic::AtomicU64,
}

impl Scheduler {
    /// An empty queue for a device of `block_size`-byte blocks.
    pub fn new(config: SchedConfig, block_size: u32) -> Self {
        Scheduler {
            config,
            block_size,
            pending: BTreeMap::new(),
            next_id: 0,
            epoch: 0,
            head: 0,
            dispatches: 0,
            stats: SchedStats::default(),
            reads_done: HashMap::new(),
            started: Instant::now(),
            rng: std::sync::atomic::AtomicU64::new(match config.policy {
                Policy::Random(seed) => seed,
                _ => 0,
            }),
        }
    }

    /// The next draw of `Policy::Random`'s generator (SplitMix64).
    fn next_random(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let x = self.rng.load(Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.rng.store(x, Relaxed);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The configuration.
    pub fn config(&self) -> SchedConfig {
        self.config
    }

    /// Requests queued and not completed.
    pub fn queued(&self) -> usize {
        self.pending.len()
    }

    /// What the scheduler has done so far.
    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Clear the statistics.
    pub fn reset_stats(&mut self) {
        self.stats = SchedStats::default();
    }

    fn take_id(&mut self) -> ReqId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Queue a write of `data` (whole blocks) at `block`, to be issued after
    /// every request of `after` (earlier requests; completed ones are
    /// ignored) and after every earlier request on an overlapping block.
    /// Panics when `after` names a request not submitted yet.
    pub fn submit_write(
        &mut self,
        block: u64,
        data: Arc<Vec<u8>>,
        flags: WriteFlags,
        after: &[ReqId],
    ) -> ReqId {
        let bs = self.block_size as usize;
        assert!(
            !data.is_empty() && data.len().is_multiple_of(bs),
            "a write of {} bytes is not whole blocks",
            data.len()
        );
        let blocks = (data.len() / bs) as u64;
        let id = self.take_id();
        let mut deps: Vec<ReqId> = after
            .iter()
            .map(|&a| {
                assert!(
                    a < id,
                    "request {id} cannot follow request {a}, which is later"
                );
                a
            })
            .filter(|a| self.pending.contains_key(a))
            .collect();
        deps.extend(
            self.pending
                .iter()
                .filter(|(_, p)| p.overlaps(block, blocks))
                .map(|(&i, _)| i),
        );
        deps.sort_unstable();
        deps.dedup();
        self.pending.insert(
            id,
            Pending {
                op: Op::Write { data, flags },
                block,
                blocks,
                after: deps,
                epoch: self.epoch,
                arrival_ns: None,
            },
        );
        id
    }

    /// Queue a read of `blocks` blocks at `block`; its data is taken with
    /// [`Scheduler::take_read`] once it completed. Reads are ordered by no
    /// barrier (they bypass held writes, the paper's `-NR`): blocks that
    /// queued writes hold are served from their data, entirely so (no
    /// device request, completed at once) when they cover the whole read.
    pub fn submit_read(&mut self, block: u64, blocks: u64, class: BlockClass) -> ReqId {
        assert!(blocks > 0, "a read of no blocks");
        let bs = self.block_size as usize;
        let id = self.take_id();
        let mut overlay = Vec::new();
        let mut covered = vec![false; blocks as usize];
        for p in self.pending.values() {
            let Op::Write { data, .. } = &p.op else {
                continue;
            };
            if !p.overlaps(block, blocks) {
                continue;
            }
            let from = p.block.max(block);
            let to = (p.block + p.blocks).min(block + blocks);
            let src = (from - p.block) as usize * bs;
            let len = (to - from) as usize * bs;
            overlay.push(((from - block) as usize * bs, data[src..src + len].to_vec()));
            for c in &mut covered[(from - block) as usize..(to - block) as usize] {
                *c = true;
            }
        }
        if covered.iter().all(|c| *c) {
            let mut buf = vec![0u8; blocks as usize * bs];
            for (off, d) in overlay {
                buf[off..off + d.len()].copy_from_slice(&d);
            }
            self.reads_done.insert(id, buf);
            self.stats.reads_from_queue += 1;
            self.stats.reads[class as usize].requests += 1;
            return id;
        }
        self.pending.insert(
            id,
            Pending {
                op: Op::Read { class, overlay },
                block,
                blocks,
                after: Vec::new(),
                // Reads wait for no barrier: held writes are bypassed, and
                // whatever of them the read covers is in its overlay.
                epoch: u64::MAX,
                arrival_ns: None,
            },
        );
        id
    }

    /// The data of a completed read (once).
    pub fn take_read(&mut self, id: ReqId) -> Option<Vec<u8>> {
        self.reads_done.remove(&id)
    }

    /// Every request submitted after this waits for every request
    /// submitted before it (ordering only: nothing is flushed).
    pub fn barrier(&mut self) {
        self.epoch += 1;
    }

    /// Queue a cache flush, ordered like a barrier on both sides.
    pub fn flush(&mut self) -> ReqId {
        self.epoch += 1;
        let id = self.take_id();
        self.pending.insert(
            id,
            Pending {
                op: Op::Flush,
                block: 0,
                blocks: 0,
                after: Vec::new(),
                epoch: self.epoch,
                arrival_ns: None,
            },
        );
        self.epoch += 1;
        id
    }

    /// The eligible requests: no pending dependency, and in the oldest
    /// barrier epoch still pending (reads are in no epoch).
    fn eligible(&self) -> Vec<ReqId> {
        let min_epoch = self
            .pending
            .values()
            .map(|p| p.epoch)
            .find(|&e| e != u64::MAX)
            .unwrap_or(u64::MAX);
        self.pending
            .iter()
            .filter(|(_, p)| p.epoch == min_epoch || p.epoch == u64::MAX)
            .filter(|(_, p)| p.after.iter().all(|a| !self.pending.contains_key(a)))
            .map(|(&id, _)| id)
            .collect()
    }

    /// C-LOOK's sort key of a request from `head`.
    fn clook_key(&self, head: u64, id: ReqId) -> (bool, u64, ReqId) {
        let b = self.pending[&id].block;
        (b < head, b, id)
    }

    /// `ids` in the order the policy prefers them from the head's current
    /// position (the first is the one it serves next).
    fn order(&self, ids: &mut [ReqId], timing: Option<&dyn Timing>) {
        let head = timing.and_then(|t| t.head_block()).unwrap_or(self.head);
        match self.config.policy {
            Policy::Fifo => ids.sort_unstable(),
            Policy::Random(_) => {
                // Fisher-Yates over the eligible set, in id order first so
                // that only the seed decides.
                ids.sort_unstable();
                for i in (1..ids.len()).rev() {
                    let j = (self.next_random() % (i as u64 + 1)) as usize;
                    ids.swap(i, j);
                }
            }
            Policy::CLook => ids.sort_by_key(|&id| self.clook_key(head, id)),
            Policy::Sptf => {
                let cost = |id: ReqId| {
                    let p = &self.pending[&id];
                    match p.op {
                        Op::Flush => Some(0.0),
                        _ => timing.and_then(|t| t.positioning_ns(p.block)),
                    }
                };
                if ids.iter().any(|&id| cost(id).is_none()) {
                    ids.sort_by_key(|&id| self.clook_key(head, id));
                } else {
                    // A request that continues another eligible one of the
                    // same direction is reached from it at no positioning
                    // cost (concatenated, or as the next block): its run is
                    // chosen by where the run starts, never entered
                    // backwards from its middle.
                    let ends: HashMap<u64, ReqId> = ids
                        .iter()
                        .map(|&id| (self.pending[&id].block + self.pending[&id].blocks, id))
                        .collect();
                    let continues = |id: ReqId| {
                        let p = &self.pending[&id];
                        ends.get(&p.block)
                            .is_some_and(|&q| q != id && self.pending[&q].joins(p))
                    };
                    ids.sort_by(|&a, &b| {
                        continues(a)
                            .cmp(&continues(b))
                            .then(cost(a).unwrap_or(0.0).total_cmp(&cost(b).unwrap_or(0.0)))
                            .then(self.clook_key(head, a).cmp(&self.clook_key(head, b)))
                    });
                }
            }
        }
    }

    /// A device request starting with `first`, concatenated with the
    /// requests of `pool` (eligible, not yet taken) that continue it;
    /// taken ones are removed from `pool`.
    fn concatenate(&self, first: ReqId, pool: &mut Vec<ReqId>) -> Group {
        let head = &self.pending[&first];
        let mut ids = vec![first];
        if matches!(head.op, Op::Flush) {
            return Group { ids };
        }
        let bs = self.block_size as u64;
        let mut end = head.block + head.blocks;
        let mut bytes = head.blocks * bs;
        loop {
            let next = pool
                .iter()
                .enumerate()
                .filter(|(_, id)| {
                    let p = &self.pending[id];
                    p.block == end
                        && head.joins(p)
                        && bytes + p.blocks * bs <= self.config.max_merge_bytes as u64
                })
                .min_by_key(|(_, id)| **id)
                .map(|(i, _)| i);
            let Some(i) = next else { break };
            let id = pool.remove(i);
            let p = &self.pending[&id];
            end += p.blocks;
            bytes += p.blocks * bs;
            ids.push(id);
        }
        Group { ids }
    }

    /// Serve one device request (no bookkeeping).
    fn serve(&self, g: &Group, dev: &dyn BlockDevice) -> io::Result<Served> {
        let first = &self.pending[&g.ids[0]];
        let bs = self.block_size as usize;
        let total: u64 = g.ids.iter().map(|id| self.pending[id].blocks).sum();
        match &first.op {
            Op::Flush => dev.flush().map(|()| Served::Flush),
            Op::Write { data, flags } => {
                if g.ids.len() == 1 {
                    return dev.write(first.block, data, *flags).map(Served::Write);
                }
                let mut buf = Vec::with_capacity(total as usize * bs);
                for id in &g.ids {
                    if let Op::Write { data, .. } = &self.pending[id].op {
                        buf.extend_from_slice(data);
                    }
                }
                dev.write(first.block, &buf, *flags).map(Served::Write)
            }
            Op::Read { class, .. } => {
                let mut buf = vec![0u8; total as usize * bs];
                dev.read(first.block, &mut buf, *class)?;
                Ok(Served::Read(buf))
            }
        }
    }

    /// Bookkeeping of a served device request: completions, read data,
    /// statistics; the requests leave the queue.
    fn complete(
        &mut self,
        g: Group,
        served: Served,
        start_ns: u64,
        end_ns: u64,
        out: &mut Vec<Completion>,
    ) {
        let dispatch = self.dispatches;
        self.dispatches += 1;
        let bs = self.block_size as usize;
        let mut offset = 0usize;
        if !matches!(served, Served::Flush) {
            self.stats.disk_requests += 1;
            self.stats.merged += g.ids.len() as u64 - 1;
        }
        for id in g.ids {
            let p = self.pending.remove(&id).expect("a queued request");
            let arrival = p.arrival_ns.unwrap_or(start_ns);
            let c = Completion {
                id,
                kind: p.kind(),
                block: p.block,
                blocks: p.blocks,
                ticket: match served {
                    Served::Write(t) => Some(t),
                    _ => None,
                },
                dispatch,
                queue_ns: start_ns.saturating_sub(arrival),
                service_ns: end_ns.saturating_sub(start_ns),
            };
            match (&p.op, &served) {
                (Op::Read { class, overlay }, Served::Read(buf)) => {
                    let len = p.blocks as usize * bs;
                    let mut data = buf[offset..offset + len].to_vec();
                    for (off, d) in overlay {
                        data[*off..off + d.len()].copy_from_slice(d);
                    }
                    offset += len;
                    self.reads_done.insert(id, data);
                    self.stats.reads[*class as usize].add(&c);
                }
                (Op::Write { flags, .. }, _) => self.stats.writes[flags.class as usize].add(&c),
                _ => self.stats.flushes.add(&c),
            }
            if p.blocks > 0 {
                self.head = p.block + p.blocks;
            }
            out.push(c);
        }
    }

    fn wall_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Serve every queued request on `dev`, in the policy's order among
    /// the eligible ones, until the queue is empty. Returns the completions
    /// in the order the device served them, and the first error (after
    /// which the requests still queued are dropped: the caller failed).
    pub fn run(&mut self, dev: &dyn BlockDevice) -> (Vec<Completion>, io::Result<()>) {
        let timing = dev.timing();
        let now = |s: &Scheduler| match timing {
            Some(t) => t.now_ns(),
            None => s.wall_ns(),
        };
        self.stats.virtual_time = timing.is_some();
        let arrival = now(self);
        for p in self.pending.values_mut() {
            p.arrival_ns.get_or_insert(arrival);
        }
        let mut out = Vec::new();
        let concurrent = timing.is_none()
            && self.config.max_in_flight > 1
            && !matches!(self.config.policy, Policy::Random(_));
        while !self.pending.is_empty() {
            let mut pool = self.eligible();
            assert!(
                !pool.is_empty(),
                "I/O scheduler: requests queued but none eligible (a dependency cycle)"
            );
            self.order(&mut pool, timing);
            if !concurrent {
                // One device request at a time: the policy's choice from
                // where the previous one left the head.
                let first = pool.remove(0);
                let g = self.concatenate(first, &mut pool);
                let start = now(self);
                match self.serve(&g, dev) {
                    Ok(s) => {
                        let end = now(self);
                        self.complete(g, s, start, end, &mut out);
                    }
                    Err(e) => {
                        self.pending.clear();
                        return (out, Err(e));
                    }
                }
                continue;
            }
            // A round: the eligible set, concatenated, in flight together.
            let mut groups = Vec::new();
            while !pool.is_empty() {
                let first = pool.remove(0);
                groups.push(self.concatenate(first, &mut pool));
            }
            let mut chunks: Vec<Vec<Group>> = Vec::new();
            for g in groups {
                match chunks.last_mut() {
                    Some(c) if c.len() < self.config.max_in_flight => c.push(g),
                    _ => chunks.push(vec![g]),
                }
            }
            for chunk in chunks {
                let start = now(self);
                let this = &*self;
                let results: Vec<(io::Result<Served>, u64)> = if chunk.len() == 1 {
                    let r = this.serve(&chunk[0], dev);
                    vec![(r, now(this))]
                } else {
                    std::thread::scope(|s| {
                        let handles: Vec<_> = chunk
                            .iter()
                            .map(|g| {
                                s.spawn(move || {
                                    let r = this.serve(g, dev);
                                    (r, this.wall_ns())
                                })
                            })
                            .collect();
                        handles
                            .into_iter()
                            .map(|h| h.join().expect("an I/O thread panicked"))
                            .collect()
                    })
                };
                let mut err = None;
                for (g, (r, end)) in chunk.into_iter().zip(results) {
                    match r {
                        Ok(s) => self.complete(g, s, start, end, &mut out),
                        Err(e) => {
                            err.get_or_insert(e);
                        }
                    }
                }
                if let Some(e) = err {
                    self.pending.clear();
                    return (out, Err(e));
                }
            }
        }
        (out, Ok(()))
    }
}

#[cfg(test)]
mod tests;
