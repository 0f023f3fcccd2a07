//! The driver queue of scheduler-enforced ordering, shared by `sched-flag`
//! and `sched-chain`: the writes `sync` would make synchronously, made
//! asynchronous, each with the ordering information the scheduler needs.
//!
//! At the end of each handle the `sync` release order
//! ([`crate::protocol::sync_mode::release`]) is computed and its writes
//! join the queue as copies of the images (the paper's `-CB`: the cached
//! buffer is not write-locked while its write is queued). Nothing waits:
//! the system call returns. The queue is issued, in one plan through the
//! mount's I/O scheduler, when something asks for durability (`fsync`,
//! `sync`, unmount), at each syncer tick (`write_back(Timer)`), under
//! memory pressure, and when it outgrows [`MAX_QUEUE_BYTES`] (the process
//! then waits, as for a full driver queue). The ordering each write
//! carries becomes the plan's constraints:
//!
//! * **flag** (`sched-flag`): every write with ordering meaning (each write
//!   of the release order, and fresh data under allocation initialization)
//!   is *flagged*; the delayed writes (bitmaps, counters, times) are not.
//!   `Full`: a barrier before and after a flagged write. `Back`: a barrier
//!   after it (later requests pass neither it nor anything before it).
//!   `Part`: every later write names the last flagged one (which names the
//!   one before it), and nothing else. `Ignore`: no constraint at all.
//! * **chain** (`sched-chain`): every write names the queued writes that
//!   carry the predecessors of its updates, computed over every update not
//!   yet issued, across handles; a handle's metadata writes name its fresh
//!   data writes. Frees: `dep` makes a handle that reuses a block freed by
//!   a queued handle name every write of that handle (the paper's second
//!   approach, also making the new block's data depend on them); `barrier`
//!   makes the freeing handle's writes a barrier that every later write
//!   names (the first approach).
//!
//! **Durability.** Completion must mean durability for an ordering point,
//! so every write that carries ordering is FUA (free on a write-through
//! disk; on a volatile cache the device's FUA or the flush a device
//! without FUA substitutes, counted either way); `Ignore` issues plain
//! writes. `fsync` and `sync` end with a flush for the delayed writes.
//!
//! **Write locks** (`-CB` off, the variants without `-cb`): a handle that
//! modifies a block with a queued write first waits for the queue to be
//! issued, as a process waits for a write-locked buffer. The copy is still
//! what is written (ordo never writes a buffer in place), so the variants
//! differ in time, not in what reaches the disk.
//!
//! **Reads** go around the queue: a block with a queued write is dirty in
//! the cache and served from it, and a cache miss reads the device
//! directly. Every variant therefore behaves as the paper's `-NR`.
//!
//! **Reuse.** A freed block is not allocated again by the handle that
//! freed it. After that handle ended, its clearing is queued and flagged
//! (every later write follows it), or named by the reuser's writes
//! (`chain,dep`), or a barrier (`chain,barrier`); once the queue is issued
//! (plans run in order, each to its end) the clearing is durable before
//! any later plan's write.

use std::collections::{HashMap, HashSet};

use super::super::sync_mode::release::{self, Carrier};
use super::super::sync_mode::HandleLog;
use super::super::*;
use crate::update::{OpKind, UpdateKind};

/// The queue is issued when its images exceed this many bytes.
pub const MAX_QUEUE_BYTES: usize = 32 << 20;
/// Chains: the queue is issued when it carries this many updates (each
/// handle's dependencies are computed over the related ones).
pub const MAX_QUEUED_UPDATES: usize = 16_384;

/// The meaning of the ordering flag (Ganger & Patt §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// A barrier both ways.
    Full,
    /// Later requests pass neither the flagged one nor anything before it.
    Back,
    /// Later requests do not pass the flagged one.
    Part,
    /// No ordering (not safe: for comparison only).
    Ignore,
}

/// How chains protect a freed block (Ganger & Patt §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frees {
    /// The reusing handle's writes name the freeing handle's writes.
    Dep,
    /// The freeing handle's writes are a barrier to every later write.
    Barrier,
}

/// Which ordering information the queue carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// One flag per request.
    Flag(Flag),
    /// A list of earlier requests per request.
    Chain(Frees),
}

/// A protocol's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Flags or chains.
    pub scheme: Scheme,
    /// Copy blocks at issue (`-CB`) instead of write-locking them.
    pub copy_blocks: bool,
    /// Fault for the explorer's own test: the n-th flagged write loses its
    /// flag (and its FUA).
    pub drop_flag: Option<u64>,
}

struct Queued {
    block: u64,
    image: Arc<Vec<u8>>,
    class: BlockClass,
    /// The blocks of the image (a run of consecutive blocks) with the
    /// cache generation each is of; empty for an intermediate image.
    gens: Vec<(u64, u64)>,
    /// An ordering write (flagged; FUA).
    ordered: bool,
    /// Queue ids it must follow (chains).
    after: Vec<u64>,
}

/// `sched-flag` and `sched-chain`.
pub struct SchedProtocol {
    name: &'static str,
    cfg: Config,
    /// The current handle; blocks it freed are not allocated again by it.
    log: HandleLog,
    /// The queue, by id (ids grow; `first_id` is the oldest queued).
    queue: Vec<Queued>,
    first_id: u64,
    queue_bytes: usize,
    /// Per block: the id of its last queued write.
    last_of: HashMap<u64, u64>,
    /// Chains: queued updates with the write carrying each.
    prior: Vec<(Update, u64)>,
    /// Chains (`dep`): blocks freed by a queued handle, and its writes.
    freed_by: HashMap<u64, Arc<Vec<u64>>>,
    /// Chains (`barrier`): the writes every later write names.
    barrier: Vec<u64>,
    /// Chains: per inode, the queued writes of the last handle whose
    /// ordered updates concern it (`(handle, writes)`).
    by_inode: HashMap<Ino, (u64, Vec<u64>)>,
    flagged_seen: u64,
    stats: Stats,
}

#[derive(Default)]
struct Stats {
    handles: u64,
    queued: u64,
    flagged: u64,
    issues: u64,
    full_queue: u64,
    write_lock_waits: u64,
    max_queue: u64,
    cycles: u64,
    intermediate: u64,
}

impl SchedProtocol {
    /// A new instance named `name` (the mode).
    pub fn new(name: &'static str, cfg: Config) -> Self {
        SchedProtocol {
            name,
            cfg,
            log: HandleLog::default(),
            queue: Vec::new(),
            first_id: 0,
            queue_bytes: 0,
            last_of: HashMap::new(),
            prior: Vec::new(),
            freed_by: HashMap::new(),
            barrier: Vec::new(),
            by_inode: HashMap::new(),
            flagged_seen: 0,
            stats: Stats::default(),
        }
    }

    fn next_id(&self) -> u64 {
        self.first_id + self.queue.len() as u64
    }

    fn push(&mut self, q: Queued) -> u64 {
        let id = self.next_id();
        self.queue_bytes += q.image.len();
        for k in 0..q.gens.len().max(1) as u64 {
            self.last_of.insert(q.block + k, id);
        }
        self.queue.push(q);
        self.stats.queued += 1;
        self.stats.max_queue = self.stats.max_queue.max(self.queue.len() as u64);
        id
    }

    /// Issue the queue, then (with `delayed`) every other dirty block (the
    /// delayed writes), in one plan through the scheduler. Not `delayed`
    /// in the middle of a handle, whose changes are in the cache but not
    /// ordered yet.
    fn issue(&mut self, io: &mut Io, delayed: bool) {
        let queue = std::mem::take(&mut self.queue);
        let base = self.first_id;
        self.first_id += queue.len() as u64;
        self.queue_bytes = 0;
        self.prior.clear();
        self.freed_by.clear();
        self.barrier.clear();
        self.by_inode.clear();
        let mut ids: Vec<WriteId> = Vec::with_capacity(queue.len());
        let mut last_flagged: Option<WriteId> = None;
        let mut written_gen: HashMap<u64, u64> = HashMap::new();
        for q in queue {
            let mut ordered = q.ordered;
            if ordered && matches!(self.cfg.scheme, Scheme::Flag(_)) {
                if self.cfg.drop_flag == Some(self.flagged_seen) {
                    ordered = false;
                }
                self.flagged_seen += 1;
            }
            let fua = ordered && self.cfg.scheme != Scheme::Flag(Flag::Ignore);
            let flags = WriteFlags {
                fua,
                class: q.class,
            };
            let after: Vec<WriteId> = match self.cfg.scheme {
                Scheme::Chain(_) => q
                    .after
                    .iter()
                    .filter(|&&a| a >= base)
                    .map(|&a| ids[(a - base) as usize])
                    .collect(),
                Scheme::Flag(Flag::Part) => last_flagged.into_iter().collect(),
                Scheme::Flag(_) => Vec::new(),
            };
            if ordered && self.cfg.scheme == Scheme::Flag(Flag::Full) {
                io.barrier();
            }
            let id = io.write_raw_after(q.block, q.image, flags, after);
            if ordered {
                self.stats.flagged += 1;
                match self.cfg.scheme {
                    Scheme::Flag(Flag::Full) | Scheme::Flag(Flag::Back) => io.barrier(),
                    Scheme::Flag(Flag::Part) => last_flagged = Some(id),
                    _ => {}
                }
            }
            for &(b, gen) in &q.gens {
                written_gen.insert(b, gen);
                io.pin_until_done(b, gen);
            }
            ids.push(id);
        }
        // The delayed writes: dirty blocks whose current image is not
        // already queued.
        for b in io.dirty_blocks().into_iter().filter(|_| delayed) {
            let gen = io.generation(b);
            if written_gen.get(&b) == Some(&gen) {
                continue;
            }
            if let Some(img) = io.snapshot(b) {
                let flags = WriteFlags::new(io.class_of(b));
                io.write_raw_after(b, img, flags, last_flagged.into_iter().collect());
                io.pin_until_done(b, gen);
            }
        }
        self.last_of.clear();
        self.stats.issues += 1;
    }

    fn queue_handle(&mut self, h: &HandleInfo, io: &mut Io) {
        let (ups, fresh, freed) = self.log.take(io);
        self.stats.handles += 1;
        let chain = match self.cfg.scheme {
            Scheme::Chain(f) => Some(f),
            Scheme::Flag(_) => None,
        };
        // Reuse of a block a queued handle freed (chains, `dep`).
        let mut reuse_deps: Vec<u64> = Vec::new();
        if chain == Some(Frees::Dep) && !self.freed_by.is_empty() {
            let mut seen: HashSet<*const Vec<u64>> = HashSet::new();
            let touched = ups
                .iter()
                .flat_map(|u| {
                    std::iter::once(u.block).chain(u.kind.pointers().flat_map(|(_, s, e, _)| s..e))
                })
                .chain(fresh.iter().copied());
            for b in touched {
                if let Some(ws) = self.freed_by.get(&b) {
                    if seen.insert(Arc::as_ptr(ws)) {
                        reuse_deps.extend(ws.iter().copied());
                    }
                }
            }
        }
        let base_after: Vec<u64> = reuse_deps
            .into_iter()
            .chain(self.barrier.iter().copied())
            .collect();
        let first_new = self.next_id();
        // Fresh data first (allocation initialization), a write per run of
        // consecutive blocks.
        let mut data_ids = Vec::new();
        let mut i = 0;
        while i < fresh.len() {
            let first = fresh[i];
            let class = io.class_of(first);
            let mut image = Vec::new();
            let mut gens = Vec::new();
            while i < fresh.len()
                && fresh[i] == first + gens.len() as u64
                && gens.len() < super::super::MAX_RUN_BLOCKS
                && io.class_of(fresh[i]) == class
            {
                let Some(img) = io.snapshot(fresh[i]) else {
                    break;
                };
                image.extend_from_slice(&img);
                gens.push((fresh[i], io.generation(fresh[i])));
                i += 1;
            }
            if gens.is_empty() {
                i += 1;
                continue;
            }
            data_ids.push(self.push(Queued {
                block: first,
                image: Arc::new(image),
                class,
                gens,
                ordered: true,
                after: base_after.clone(),
            }));
        }
        // Metadata, in the release order of `sync`.
        let everything = h.op == OpKind::Internal;
        let prior = relevant_prior(&self.prior, &ups);
        let order = release::release(&prior, &ups, everything, io);
        drop(prior);
        self.stats.cycles += order.cycles;
        self.stats.intermediate += order.intermediate;
        // The queue id of each write of the release order (`None`: a block
        // no longer cached, freed by the handle, so nothing to write).
        let mut now_ids: Vec<Option<u64>> = Vec::with_capacity(order.writes.len());
        for w in order.writes {
            let (image, gens) = match w.image {
                Some(img) => (Arc::new(img), Vec::new()),
                None => match io.snapshot(w.block) {
                    Some(img) => (img, vec![(w.block, io.generation(w.block))]),
                    None => {
                        now_ids.push(None);
                        continue;
                    }
                },
            };
            // Chains: what the rules name, plus every write of the last
            // earlier handle that concerns an inode this one's updates
            // concern (the order `sync` gets from finishing each handle
            // before the next: a directory's name before entries inside
            // it, a name's removal before its inode number's reuse, ...).
            let related: Vec<u64> = if chain.is_some() {
                let handle = self.stats.handles;
                w.carries
                    .iter()
                    .flat_map(|&k| inodes_of(&ups[k].kind))
                    .filter_map(|x| self.by_inode.get(&x))
                    .filter(|(hd, _)| *hd != handle)
                    .flat_map(|(_, ws)| ws.iter().copied())
                    .collect()
            } else {
                Vec::new()
            };
            let mut after: Vec<u64> = w
                .after
                .iter()
                .filter_map(|c| match *c {
                    Carrier::Prior(id) => Some(id),
                    Carrier::Now(k) => now_ids[k],
                })
                .chain(data_ids.iter().copied())
                .chain(base_after.iter().copied())
                .chain(related)
                .collect();
            after.sort_unstable();
            after.dedup();
            let class = io.class_of(w.block);
            let id = self.push(Queued {
                block: w.block,
                image,
                class,
                gens,
                ordered: true,
                after,
            });
            now_ids.push(Some(id));
            if chain.is_some() {
                let handle = self.stats.handles;
                for k in w.carries {
                    for x in inodes_of(&ups[k].kind) {
                        let e = self.by_inode.entry(x).or_insert((handle, Vec::new()));
                        if e.0 != handle {
                            *e = (handle, Vec::new());
                        }
                        if e.1.last() != Some(&id) {
                            e.1.push(id);
                        }
                    }
                    self.prior.push((ups[k].clone(), id));
                }
            }
        }
        // Frees become reusable once this handle's writes are queued.
        let handle_writes: Vec<u64> = (first_new..self.next_id()).collect();
        match chain {
            Some(Frees::Dep) if !handle_writes.is_empty() => {
                let ws = Arc::new(handle_writes);
                for &b in &freed {
                    self.freed_by.insert(b, ws.clone());
                }
            }
            Some(Frees::Barrier) if !freed.is_empty() && !handle_writes.is_empty() => {
                self.barrier = handle_writes;
            }
            _ => {}
        }
        for b in freed {
            self.log.not_reusable.remove(&b);
        }
    }
}

/// The queued updates the rules could relate to `ups`: those of a block
/// `ups` change, of an inode they concern, pointing at or from a block they
/// change or point at, and unused-inode marks. The graph over them and
/// `ups` has every edge into `ups` the graph over all of them has (the
/// rules relate updates only through these), at a cost that does not grow
/// with the queue's unrelated part.
fn relevant_prior<'a>(prior: &'a [(Update, u64)], ups: &[Update]) -> Vec<(&'a Update, u64)> {
    use crate::update::CounterKind;
    if prior.is_empty() {
        return Vec::new();
    }
    let inodes: HashSet<Ino> = ups.iter().flat_map(|u| inodes_of(&u.kind)).collect();
    let blocks: HashSet<u64> = ups.iter().map(|u| u.block).collect();
    let ranges: Vec<(u64, u64)> = ups
        .iter()
        .flat_map(|u| u.kind.pointers().map(|(_, s, e, _)| (s, e)))
        .chain(blocks.iter().map(|&b| (b, b + 1)))
        .collect();
    let overlaps = |s: u64, e: u64| ranges.iter().any(|&(a, b)| a < e && s < b);
    prior
        .iter()
        .filter(|(u, _)| {
            blocks.contains(&u.block)
                || overlaps(u.block, u.block + 1)
                || inodes_of(&u.kind).any(|x| inodes.contains(&x))
                || matches!(
                    u.kind,
                    UpdateKind::Counter {
                        what: CounterKind::ItableUnused,
                        ..
                    }
                )
                || u.kind.pointers().any(|(_, s, e, _)| overlaps(s, e))
        })
        .map(|(u, c)| (u, *c))
        .collect()
}

/// The inodes an update concerns.
fn inodes_of(kind: &UpdateKind) -> impl Iterator<Item = Ino> {
    use crate::update::BitmapKind;
    let two = match *kind {
        UpdateKind::Inode { ino, .. }
        | UpdateKind::Extent { ino, .. }
        | UpdateKind::ExtentTree { ino, .. }
        | UpdateKind::ExtentBlockInit { ino }
        | UpdateKind::Xattr { ino }
        | UpdateKind::XattrBlockInit { ino }
        | UpdateKind::XattrRef { ino, .. } => [Some(ino), None],
        UpdateKind::Dirent { dir, ino, .. } => [Some(dir), Some(ino)],
        UpdateKind::DirBlockInit { dir } => [Some(dir), None],
        UpdateKind::Bitmap {
            what: BitmapKind::Inode,
            index,
            ..
        } => [Ino::try_from(index).ok(), None],
        _ => [None, None],
    };
    two.into_iter().flatten()
}

impl Protocol for SchedProtocol {
    fn name(&self) -> &'static str {
        self.name
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
        // Without block copies, a buffer with a queued write is locked
        // until the write is done: wait for the queue.
        if !self.cfg.copy_blocks
            && !self.queue.is_empty()
            && (self
                .log
                .updates
                .iter()
                .any(|u| self.last_of.contains_key(&u.block))
                || self.log.fresh.iter().any(|b| self.last_of.contains_key(b)))
        {
            self.stats.write_lock_waits += 1;
            self.issue(io, false);
        }
        self.queue_handle(h, io);
        if self.queue_bytes > MAX_QUEUE_BYTES || self.prior.len() > MAX_QUEUED_UPDATES {
            self.stats.full_queue += 1;
            self.issue(io, true);
        }
        Ok(())
    }

    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.issue(io, true);
        io.flush();
        Ok(())
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.issue(io, true);
        io.flush();
        Ok(())
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.issue(io, true);
        if reason == WriteBackReason::Unmount {
            io.flush();
        }
        Ok(())
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let s = &self.stats;
        vec![
            ("handles".into(), s.handles),
            ("queued_writes".into(), s.queued),
            ("ordered_writes".into(), s.flagged),
            ("queue_issues".into(), s.issues),
            ("full_queue_waits".into(), s.full_queue),
            ("write_lock_waits".into(), s.write_lock_waits),
            ("max_queue".into(), s.max_queue),
            ("intermediate_writes".into(), s.intermediate),
            ("cycles".into(), s.cycles),
        ]
    }
}
