//! `mode=streams`: ccfs streams (Pillai et al., "Application Crash
//! Consistency and Performance with CCFS", FAST '17 / ACM TOS 2017) on
//! ext4's JBD2 journal.
//!
//! Every operation belongs to its caller's stream
//! ([`HandleInfo::stream`]). Within a stream, changes commit in program
//! order; across streams nothing is ordered, so an fsync in one stream
//! never waits for another stream's data. The log stays plain JBD2: the
//! kernel and e2fsck replay it.
//!
//! # One running transaction per stream
//!
//! Each stream has its own running transaction: the metadata blocks it
//! changed, the file data it wrote, the blocks it freed. `fsync` commits
//! the caller's stream (and every stream holding uncommitted changes of
//! the file; concurrent fsyncs of one stream share a commit, JBD2's group
//! commit per stream), `streamsync` the caller's, `sync` and the commit interval
//! every stream. Commits go through one log, one after another, each a
//! complete JBD2 transaction (descriptor, copies, revoke, flush, commit
//! block FUA).
//!
//! # Hybrid granularity
//!
//! Two streams may change one block (two inodes of one inode-table block,
//! two bits of one bitmap). The protocol keeps, for every block with
//! uncommitted changes, its **last committed image** `X0` (captured from
//! the update's old bytes at the first change since the block was last
//! fully committed) and who changed what:
//!
//! - *bytes*: each changed byte's stream;
//! - *bits*: each changed bitmap bit's stream (allocation bitmaps);
//! - *deltas* (delta journaling): a summary counter's change per stream
//!   (free blocks and inodes of a group and of the superblock, used
//!   directories, a directory's link count); the unused-inode mark
//!   (`bg_itable_unused`) takes the smallest value written, a bound every
//!   stream's allocations respect; a directory's times take the latest;
//! - checksum fields belong to nobody: they are recomputed.
//!
//! A commit of stream S logs, for every block S changed: `X0` with S's
//! bytes and bits from the cache and S's deltas added, its checksums
//! recomputed (bitmap checksums in the group descriptors from the
//! committed bitmaps), and that image becomes the new `X0`. A block only
//! S changed is logged as cached. Commits and checkpoints stay
//! block-granular, so the JBD2 format is unchanged.
//!
//! # Related operations merge streams
//!
//! A change that touches bytes (or a bit) another stream changed and has
//! not committed, the same inode (its data, size, map, attributes or link
//! count; a directory's entries, times and link count are shared), the
//! same name in the same directory, or the same file data block,
//! **merges** the two streams until their commit: they then commit
//! together, which keeps each one's order. That covers ccfs's
//! related operations (the same file, explicit attributes of one inode, the
//! same name, mkdir and the entries inside it: an entry goes into a block
//! the mkdir initialized) and more: an ext4 directory block is a chain of
//! `rec_len`s, so a stream inserting an entry after another stream's new
//! entry in one block would change that entry's bytes and merge (ccfs
//! changed the directory format instead; ordo keeps ext4's). So the core asks
//! before it splits an entry ([`Protocol::can_reuse_dir_space`]), and an
//! entry another stream made and has not committed is refused: the new
//! entry goes to other room or a new block, and the streams stay apart. A
//! block another stream initialized (a new directory's) is not refused:
//! an entry made in it is related to that stream's mkdir.
//!
//! # Order-less reuse
//!
//! What a stream frees is not reused by another stream until the freeing
//! transaction commits, so reuse never relates two streams:
//!
//! - an inode ([`Protocol::can_allocate_inode`]): another stream's create
//!   takes the next free inode instead;
//! - a directory slot, the bytes a removed entry held
//!   ([`Protocol::can_reuse_dir_space`]): another stream's new entry goes
//!   to other room in the directory, or to a new block;
//! - a block ([`Protocol::can_allocate`]): until the freeing commit is
//!   durable (JBD2's rule, which ccfs keeps).
//!
//! The stream that freed it (and any stream merged with it) reuses it at
//! once: its own order keeps the two apart. When space runs out, the
//! allocation commits and retries (`has_pending_frees`).
//!
//! # Order within a stream
//!
//! Selective data journaling: file data written to a block the stream
//! allocated and has not committed goes home before the commit (nothing
//! names it until the commit does); an overwrite of data a commit already
//! names is journaled, so it reaches home only by a checkpoint after its
//! commit.
//!
//! Order-preserving delayed allocation (variant `delalloc`, the default;
//! the core's `delalloc.rs`): a block written into a hole gets its place
//! only when a commit is about to be made, every stream's delayed blocks
//! at once, each reported as the stream's that wrote it, so it joins that
//! stream's running transaction. A commit of a stream's group thus carries
//! the allocations under every size it carries; allocations are delayed
//! until the next commit, never across one, and keep program order. A
//! commit this protocol makes on its own, when a group outgrows its bound
//! at a handle's end, is announced to the core first
//! ([`Protocol::commit_due`]). With `nodelalloc` blocks are allocated when
//! written. A handle never straddles two commits: directory operations
//! are atomic, and an append's size and data commit together.
//!
//! # What a crash leaves
//!
//! After JBD2 replay: for every stream, a prefix of its operations; across
//! streams any combination, except that an operation merged with an
//! earlier one of another stream is present only with it; every returned
//! fsync and streamsync holds; `e2fsck -fn` clean. The crash explorer
//! checks exactly that ([`Capabilities::stream_prefix_after_crash`]).
//!
//! # Test-only faults (`ORDO_FAULT`)
//!
//! - `streams_no_merge`: related changes never merge streams;
//! - `streams_whole_blocks`: a commit logs cached images, other streams'
//!   uncommitted bytes included (block-granular journaling);
//! - `streams_early_reuse`: a block, an inode or a directory slot freed by
//!   a stream is reusable by another before its freeing commit, and the
//!   reuse does not merge them;
//! - `streams_delalloc_late`: a commit at a handle's end is not announced
//!   ([`Protocol::commit_due`]), so it may carry a size without the delayed
//!   blocks under it.
//!
//! Each must make the crash explorer fail.

use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::jbd2::{self, JournalProtocol};
use super::{
    AfterCrash, Capabilities, DurabilityCalls, Io, PlanDone, Protocol, ProtocolEnv, ProtocolSpec,
    Recovered, WriteBackReason,
};
use crate::error::Result;
use crate::update::{
    BitmapKind, CounterKind, DataWrite, HandleInfo, Ino, InodeField, LinkOp, OpKind, Update,
    UpdateKind,
};

/// `mode=streams`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "streams",
    summary: "ccfs streams: a JBD2 transaction per stream, ordered within it, free across",
    // `delalloc` (the default): order-preserving delayed allocation;
    // `nodelalloc`: blocks are allocated when written.
    variants: &["delalloc", "nodelalloc"],
    mkfs_features: "has_journal",
    caps: Capabilities {
        group_commit: true,
        group_commit_per_stream: true,
        log_replay: true,
        kernel_replays: true,
        after_crash: AfterCrash::ConsistentAfterReplay,
        stream_prefix_after_crash: true,
        ..Capabilities::NONE
    },
    recover: jbd2::recover,
    build,
};

fn build(mut recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(StreamsProtocol::new(env, &mut recovered)?))
}

/// A fault injected on purpose (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    NoMerge,
    WholeBlocks,
    EarlyReuse,
    DelallocLate,
}

impl Fault {
    fn from_env() -> Option<Fault> {
        match std::env::var("ORDO_FAULT").ok().as_deref() {
            Some("streams_no_merge") => Some(Fault::NoMerge),
            Some("streams_whole_blocks") => Some(Fault::WholeBlocks),
            Some("streams_early_reuse") => Some(Fault::EarlyReuse),
            Some("streams_delalloc_late") => Some(Fault::DelallocLate),
            _ => None,
        }
    }
}

/// An image to log and the cache generation it equals (0: none).
type Image = (Arc<Vec<u8>>, u64);

/// Stream ids as stored in the per-byte and per-bit owner tables: the id
/// plus one, 0 for nobody (ids are below `stream::STREAMS_MAX`).
type Tag = u16;

fn tag_of(stream: u32) -> Tag {
    Tag::try_from(stream + 1).expect("stream ids are below STREAMS_MAX")
}

/// The tags of `tags` that are neither untagged nor `mine`, in order.
/// The room of a directory's last entry, which every create asks about,
/// is thousands of bytes, mostly the creating stream's own or untagged:
/// those are skipped a chunk at a time, with a test that has no branch
/// per byte.
fn others_tags(tags: &[Tag], mine: Tag) -> impl Iterator<Item = Tag> + '_ {
    tags.chunks(32)
        .filter(move |c| c.iter().fold(false, |a, &t| a | (t != 0 && t != mine)))
        .flat_map(move |c| c.iter().copied().filter(move |&t| t != 0 && t != mine))
}

fn stream_of(tag: Tag) -> u32 {
    debug_assert!(tag != 0);
    tag as u32 - 1
}

/// How a counter's change by one stream is applied to the committed value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fold {
    /// Add the stream's net change (free counts, used directories).
    Add(i64),
    /// The smallest value the stream wrote (the unused-inode mark).
    Min(u64),
    /// The cached value: a directory's times, which every stream that
    /// adds or removes an entry sets (the latest wins).
    Latest,
}

impl Fold {
    /// This fold followed by `next` of the same stream on the same field.
    fn then(self, next: Fold) -> Fold {
        match (self, next) {
            (Fold::Add(a), Fold::Add(b)) => Fold::Add(a.wrapping_add(b)),
            (Fold::Min(a), Fold::Min(b)) => Fold::Min(a.min(b)),
            (_, next) => next,
        }
    }
}

/// How an update claims the bytes it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// A checksum field: recomputed, nobody's.
    Nothing,
    /// The bits it flipped (an allocation bitmap).
    Bits,
    /// A field several streams change (delta journaling).
    Shared(Share),
    /// Every byte.
    Bytes,
}

/// How a shared field's changes combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    Add,
    Min,
    Latest,
}

/// A little-endian field's value (at most 8 bytes).
fn le_value(b: &[u8]) -> u64 {
    b.iter()
        .take(8)
        .enumerate()
        .fold(0, |v, (i, &x)| v | (x as u64) << (8 * i))
}

/// `new - old` for a field `width` bytes wide, as a signed change.
fn signed_change(old: u64, new: u64, width: usize) -> i64 {
    if width >= 8 {
        return new.wrapping_sub(old) as i64;
    }
    let bits = 8 * width as u32;
    let d = new.wrapping_sub(old) & ((1u64 << bits) - 1);
    // Sign-extend within the field's width.
    ((d << (64 - bits)) as i64) >> (64 - bits)
}

/// One stream's change of a counter field.
#[derive(Clone, Debug)]
struct Delta {
    start: u32,
    end: u32,
    stream: u32,
    fold: Fold,
}

/// A metadata block with uncommitted changes.
struct Tracked {
    /// The last committed image (`None` until the handle that first
    /// changed it ends: then it is rebuilt from the cache and the old
    /// bytes of that handle's updates).
    x0: Option<Vec<u8>>,
    /// Old bytes of the updates of the handle that started tracking, in
    /// order, to rebuild `x0` at its end.
    undo: Vec<(u32, Vec<u8>)>,
    /// Owner of each byte (empty until a byte is owned).
    bytes: Vec<Tag>,
    /// Owner of each changed bitmap bit.
    bits: HashMap<u32, Tag>,
    /// Counter changes.
    deltas: Vec<Delta>,
}

impl Tracked {
    fn new() -> Self {
        Tracked {
            x0: None,
            undo: Vec::new(),
            bytes: Vec::new(),
            bits: HashMap::default(),
            deltas: Vec::new(),
        }
    }

    /// Every stream with a record here.
    fn streams(&self) -> BTreeSet<u32> {
        let mut s: BTreeSet<u32> = self
            .bytes
            .iter()
            .filter(|&&t| t != 0)
            .map(|&t| stream_of(t))
            .collect();
        s.extend(self.bits.values().map(|&t| stream_of(t)));
        s.extend(self.deltas.iter().map(|d| d.stream));
        s
    }

    fn is_empty(&self) -> bool {
        self.bytes.iter().all(|&t| t == 0) && self.bits.is_empty() && self.deltas.is_empty()
    }

    /// Drop every record of the streams `members`.
    fn forget(&mut self, members: &BTreeSet<u32>) {
        for t in self.bytes.iter_mut() {
            if *t != 0 && members.contains(&stream_of(*t)) {
                *t = 0;
            }
        }
        self.bits.retain(|_, t| !members.contains(&stream_of(*t)));
        self.deltas.retain(|d| !members.contains(&d.stream));
    }
}

/// The running transaction of a set of merged streams.
#[derive(Default)]
struct Group {
    /// The streams in it (the group is keyed by the first).
    members: BTreeSet<u32>,
    /// Blocks to log: metadata it changed, data it overwrote.
    logged: BTreeSet<u64>,
    /// File-data blocks it allocated and wrote: home before its commit.
    data: BTreeSet<u64>,
    /// Blocks to revoke.
    revoked: BTreeSet<u64>,
    /// Blocks it freed.
    freed: BTreeSet<u64>,
}

impl Group {
    fn is_empty(&self) -> bool {
        self.logged.is_empty()
            && self.data.is_empty()
            && self.revoked.is_empty()
            && self.freed.is_empty()
    }

    fn absorb(&mut self, other: Group) {
        self.members.extend(other.members);
        self.logged.extend(other.logged);
        self.data.extend(other.data);
        self.revoked.extend(other.revoked);
        self.freed.extend(other.freed);
    }
}

#[derive(Default, Clone, Copy)]
struct Stats {
    commits: u64,
    merges: u64,
    superimposed_blocks: u64,
    cached_blocks: u64,
    journaled_data: u64,
    ordered_data: u64,
}

/// The `mode=streams` protocol.
pub struct StreamsProtocol {
    j: JournalProtocol,
    fault: Option<Fault>,
    /// Order-preserving delayed allocation (the `delalloc` variant).
    delalloc: bool,
    /// Union-find parent of each stream (index = stream id).
    parent: Vec<u32>,
    /// Running transactions by the root stream of their group.
    groups: BTreeMap<u32, Group>,
    /// Metadata blocks with uncommitted changes.
    tracked: HashMap<u64, Tracked>,
    /// Blocks first tracked by the current handle (their `x0` is built at
    /// its end).
    fresh_tracked: Vec<u64>,
    /// File-data blocks written and not committed, with their stream.
    data_owner: HashMap<u64, u32>,
    /// Directory entries changed and not committed: (directory, name).
    names: std::collections::HashMap<(Ino, Vec<u8>), u32>,
    /// Streams with uncommitted changes to each inode (what its fsync commits).
    inode_streams: HashMap<Ino, BTreeSet<u32>>,
    /// The stream that last changed each inode itself (its data, size,
    /// map, attributes, link count; not a directory's entries, times or
    /// link count, which streams share) and has not committed: a change
    /// of the same inode by another stream is related (ccfs's "same
    /// file", "same inode's attributes").
    inode_owner: HashMap<Ino, u32>,
    /// Blocks freed by a running transaction, with its stream.
    freed: HashMap<u64, u32>,
    /// Inodes freed by a running transaction, with its stream: no other
    /// stream allocates them until that transaction commits.
    freed_inodes: HashMap<Ino, u32>,
    /// Directory entries removed by a running transaction: per directory
    /// block, the bytes the entry held and the stream. No other stream
    /// writes a new entry over them until that transaction commits.
    freed_slots: HashMap<u64, Vec<(u32, u32, u32)>>,
    /// Directory blocks a running transaction initialized, with its
    /// stream: an entry made in one by another stream merges the two
    /// (ccfs's "mkdir and the entries inside it").
    new_dir_blocks: HashMap<u64, u32>,
    /// Inodes known to be directories (named as one by an entry update):
    /// their link count and times are shared counters.
    dirs: std::collections::HashSet<Ino>,
    block_size: usize,
    stats: Stats,
}

impl StreamsProtocol {
    fn new(env: &ProtocolEnv, recovered: &mut Recovered) -> Result<Self> {
        let mut j = JournalProtocol::new(env, recovered)?;
        j.sweep_off();
        Ok(StreamsProtocol {
            j,
            dirs: Default::default(),
            block_size: env.block_size as usize,
            fault: Fault::from_env(),
            delalloc: env.variant != "nodelalloc",
            parent: Vec::new(),
            groups: BTreeMap::new(),
            tracked: HashMap::default(),
            fresh_tracked: Vec::new(),
            data_owner: HashMap::default(),
            names: std::collections::HashMap::new(),
            inode_streams: HashMap::default(),
            inode_owner: HashMap::default(),
            freed: HashMap::default(),
            freed_inodes: HashMap::default(),
            freed_slots: HashMap::default(),
            new_dir_blocks: HashMap::default(),
            stats: Stats::default(),
        })
    }

    /// The root stream of `s`'s group.
    fn find(&mut self, s: u32) -> u32 {
        let i = s as usize;
        if i >= self.parent.len() {
            let n = self.parent.len() as u32;
            self.parent.extend(n..=s);
        }
        let mut r = s;
        while self.parent[r as usize] != r {
            r = self.parent[r as usize];
        }
        // Path compression.
        let mut c = s;
        while self.parent[c as usize] != r {
            let next = self.parent[c as usize];
            self.parent[c as usize] = r;
            c = next;
        }
        r
    }

    /// The root stream of `s`'s group, without path compression.
    fn root(&self, s: u32) -> u32 {
        let mut r = s;
        while let Some(&p) = self.parent.get(r as usize) {
            if p == r {
                break;
            }
            r = p;
        }
        r
    }

    /// The running transaction of `s`'s group, made on first use.
    fn group(&mut self, s: u32) -> &mut Group {
        let r = self.find(s);
        self.groups.entry(r).or_insert_with(|| Group {
            members: BTreeSet::from([r]),
            ..Default::default()
        })
    }

    /// Merge the groups of `a` and `b` (related changes): they commit
    /// together from now on. Returns the root.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb || self.fault == Some(Fault::NoMerge) {
            return ra;
        }
        let (root, other) = (ra.min(rb), ra.max(rb));
        self.parent[other as usize] = root;
        let g = self.groups.remove(&other).unwrap_or_else(|| Group {
            members: BTreeSet::from([other]),
            ..Default::default()
        });
        self.group(root).absorb(g);
        self.stats.merges += 1;
        root
    }

    /// Merge `s` with the owner of a record (`tag`), unless it is nobody
    /// or already in `s`'s group.
    fn relate(&mut self, s: u32, tag: Tag) {
        if tag != 0 {
            self.merge(s, stream_of(tag));
        }
    }

    fn note_inode(&mut self, ino: Ino, s: u32) {
        self.inode_streams.entry(ino).or_default().insert(s);
    }

    /// Stream `s` changed inode `ino` itself: merge with the stream that
    /// did before it, if that one has not committed.
    fn own_inode(&mut self, ino: Ino, s: u32) {
        if let Some(o) = self.inode_owner.insert(ino, s) {
            self.merge(s, o);
        }
    }

    /// How update `u` claims its bytes.
    fn claim(&self, u: &Update) -> Claim {
        match &u.kind {
            UpdateKind::Checksum => Claim::Nothing,
            UpdateKind::Bitmap { .. } if u.range.len() == 1 => Claim::Bits,
            UpdateKind::Counter {
                what: CounterKind::ItableUnused,
                ..
            } => Claim::Shared(Share::Min),
            UpdateKind::Counter { .. } => Claim::Shared(Share::Add),
            UpdateKind::Inode { ino, field } if self.dirs.contains(ino) => match field {
                InodeField::Links => Claim::Shared(Share::Add),
                InodeField::Times => Claim::Shared(Share::Latest),
                _ => Claim::Bytes,
            },
            _ => Claim::Bytes,
        }
    }

    /// Record update `u` of stream `s` on its block, and merge `s` with
    /// every stream whose uncommitted change it touches.
    fn record(&mut self, u: &Update, s: u32) {
        let claim = self.claim(u);
        if claim == Claim::Nothing {
            return;
        }
        let bs = self.block_size;
        let early_reuse = self.fault == Some(Fault::EarlyReuse);
        let block = u.block;
        let t = match self.tracked.entry(block) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.fresh_tracked.push(block);
                e.insert(Tracked::new())
            }
        };
        if t.x0.is_none() {
            t.undo.push((u.range.start, u.old.to_vec()));
        }
        let (start, end) = (u.range.start, u.range.end);
        let mut related: Vec<Tag> = Vec::new();
        if !t.bytes.is_empty() {
            related.extend_from_slice(&t.bytes[start as usize..end as usize]);
        }
        // A shared field some stream wrote whole (an inode it initialized
        // or freed) is that stream's bytes: merged with it, the change is
        // in the cached bytes, not a delta on the committed ones.
        let claim = match claim {
            Claim::Shared(_) if related.iter().any(|&o| o != 0) => Claim::Bytes,
            c => c,
        };
        match claim {
            Claim::Nothing => unreachable!(),
            Claim::Bits => {
                let diff = u.old[0] ^ u.new[0];
                for k in 0..8 {
                    if diff & (1 << k) != 0 {
                        let bit = start * 8 + k;
                        if let Some(&o) = t.bits.get(&bit) {
                            if !early_reuse {
                                related.push(o);
                            }
                        }
                        t.bits.insert(bit, tag_of(s));
                    }
                }
            }
            Claim::Shared(share) => {
                let (old, new) = (le_value(&u.old), le_value(&u.new));
                let fold = match share {
                    Share::Min => Fold::Min(new),
                    Share::Latest => Fold::Latest,
                    Share::Add => Fold::Add(signed_change(old, new, (end - start) as usize)),
                };
                let found = t
                    .deltas
                    .iter_mut()
                    .find(|d| d.stream == s && d.start == start && d.end == end);
                match found {
                    Some(d) => d.fold = d.fold.then(fold),
                    None => t.deltas.push(Delta {
                        start,
                        end,
                        stream: s,
                        fold,
                    }),
                }
            }
            Claim::Bytes => {
                if t.bytes.is_empty() {
                    t.bytes = vec![0; bs];
                }
                t.bytes[start as usize..end as usize].fill(tag_of(s));
                if !early_reuse {
                    related.extend(
                        t.bits
                            .iter()
                            .filter(|(&bit, _)| bit / 8 >= start && bit / 8 < end)
                            .map(|(_, &o)| o),
                    );
                }
                related.extend(
                    t.deltas
                        .iter()
                        .filter(|d| d.start < end && start < d.end)
                        .map(|d| tag_of(d.stream)),
                );
                // Their streams merge with this one below, and the cached
                // bytes now hold every change: no delta on top of them.
                t.deltas.retain(|d| d.end <= start || end <= d.start);
            }
        }
        related.sort_unstable();
        related.dedup();
        for tag in related {
            self.relate(s, tag);
        }
    }

    /// Claim bytes `[start, end)` of tracked `block` for stream `s`
    /// without changing them: bytes a change was computed from. Merges `s`
    /// with their owners.
    fn claim_read(&mut self, block: u64, start: u32, end: u32, s: u32) {
        let bs = self.block_size as u32;
        let Some(t) = self.tracked.get_mut(&block) else {
            return;
        };
        let (start, end) = (start.min(bs), end.min(bs));
        if start >= end {
            return;
        }
        if t.bytes.is_empty() {
            t.bytes = vec![0; bs as usize];
        }
        let mut related: Vec<Tag> = t.bytes[start as usize..end as usize].to_vec();
        t.bytes[start as usize..end as usize].fill(tag_of(s));
        related.sort_unstable();
        related.dedup();
        for tag in related {
            self.relate(s, tag);
        }
    }

    /// At the end of a handle: the committed image of every block it
    /// started tracking is the cached one with its updates undone.
    fn settle_fresh_tracked(&mut self, io: &Io) {
        for block in std::mem::take(&mut self.fresh_tracked) {
            let Some(t) = self.tracked.get_mut(&block) else {
                continue;
            };
            if t.x0.is_some() {
                continue;
            }
            let Some(img) = io.snapshot(block) else {
                // Allocated and given back inside the handle.
                self.tracked.remove(&block);
                continue;
            };
            let mut x0 = img.to_vec();
            for (start, old) in t.undo.drain(..).rev() {
                let s = start as usize;
                x0[s..s + old.len()].copy_from_slice(&old);
            }
            t.x0 = Some(x0);
        }
    }

    /// Commit the group of stream `s`.
    fn commit_group(&mut self, s: u32, io: &mut Io, durable: bool) -> Result<()> {
        let everything = self.groups.len() == 1;
        let root = self.find(s);
        let Some(g) = self.groups.remove(&root) else {
            return self.j.commit_staged(io, durable);
        };
        let members = g.members.clone();
        let mut images: Vec<(u64, Option<Image>)> = Vec::new();
        // Group-descriptor blocks last: they carry the bitmaps' checksums.
        let mut descs: BTreeSet<u64> = BTreeSet::new();
        let mut committed: HashMap<u64, Arc<Vec<u8>>> = HashMap::default();
        for &b in &g.logged {
            if let Some(d) = io.bitmap_desc_block(b) {
                descs.insert(d);
            }
        }
        for &b in &g.logged {
            if descs.contains(&b) {
                continue;
            }
            let image = self.image_for(b, &members, io, None);
            if let Some((img, _)) = &image {
                committed.insert(b, img.clone());
            }
            self.count_image(&image);
            images.push((b, image));
        }
        for &d in &descs {
            let bitmap = |b: u64| -> Option<Arc<Vec<u8>>> {
                if let Some(img) = committed.get(&b) {
                    return Some(img.clone());
                }
                match self.tracked.get(&b).and_then(|t| t.x0.as_ref()) {
                    Some(x0) => Some(Arc::new(x0.clone())),
                    None => io.snapshot(b),
                }
            };
            let image = self.image_for(d, &members, io, Some(&bitmap));
            self.count_image(&image);
            images.push((d, image));
        }
        // The records of the group are now committed.
        for (b, image) in &images {
            if let Some(t) = self.tracked.get_mut(b) {
                t.forget(&members);
                if t.is_empty() {
                    self.tracked.remove(b);
                } else if let Some((img, _)) = image {
                    t.x0 = Some(img.to_vec());
                }
            }
        }
        self.data_owner.retain(|_, o| !members.contains(o));
        self.names.retain(|_, o| !members.contains(o));
        self.inode_owner.retain(|_, o| !members.contains(o));
        self.inode_streams.retain(|_, set| {
            set.retain(|o| !members.contains(o));
            !set.is_empty()
        });
        self.freed.retain(|_, o| !members.contains(o));
        self.freed_inodes.retain(|_, o| !members.contains(o));
        self.freed_slots.retain(|_, v| {
            v.retain(|&(_, _, o)| !members.contains(&o));
            !v.is_empty()
        });
        self.new_dir_blocks.retain(|_, o| !members.contains(o));
        for &m in &members {
            self.parent[m as usize] = m;
        }
        self.stats.commits += 1;
        self.j.stage(images, g.data, g.revoked, g.freed, everything);
        self.j.commit_staged(io, durable)
    }

    /// The image the commit of `members` logs for block `b`: `None` for
    /// the cached one (no other stream has uncommitted changes in it),
    /// else `X0` with the group's changes superimposed and the checksums
    /// recomputed, with the cache generation it equals (0: none).
    fn image_for(
        &self,
        b: u64,
        members: &BTreeSet<u32>,
        io: &Io,
        bitmap: Option<&dyn Fn(u64) -> Option<Arc<Vec<u8>>>>,
    ) -> Option<Image> {
        let t = self.tracked.get(&b)?;
        let cache = io.snapshot(b)?;
        let foreign = |t: &Tracked| t.streams().iter().any(|s| !members.contains(s));
        // A group-descriptor block also carries the checksums of the
        // bitmaps it describes: another stream's bits in one of them make
        // the cached checksum wrong for the committed bitmap.
        // (Every record belongs to a running transaction: with none but
        // the committing one left, nothing is foreign.)
        let others = !self.groups.is_empty()
            && (foreign(t)
                || (bitmap.is_some()
                    && self
                        .tracked
                        .iter()
                        .any(|(&m, t)| io.bitmap_desc_block(m) == Some(b) && foreign(t))));
        debug_assert!(
            !self.groups.is_empty() || !foreign(t),
            "block {b}: a record of no running transaction"
        );
        if self.fault == Some(Fault::WholeBlocks) || !others {
            return Some((cache, io.generation(b)));
        }
        debug_assert!(t.x0.is_some(), "block {b}: no committed image at a commit");
        let x0 = t.x0.as_ref()?;
        let mut img = x0.clone();
        for (i, &tag) in t.bytes.iter().enumerate() {
            if tag != 0 && members.contains(&stream_of(tag)) {
                img[i] = cache[i];
            }
        }
        for (&bit, &tag) in &t.bits {
            if members.contains(&stream_of(tag)) {
                let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
                img[byte] = (img[byte] & !mask) | (cache[byte] & mask);
            }
        }
        for d in t.deltas.iter().filter(|d| members.contains(&d.stream)) {
            let (s, e) = (d.start as usize, d.end as usize);
            let v = le_value(&img[s..e]);
            let v = match d.fold {
                Fold::Add(x) => v.wrapping_add(x as u64),
                Fold::Min(m) => v.min(m),
                Fold::Latest => {
                    img[s..e].copy_from_slice(&cache[s..e]);
                    continue;
                }
            };
            for (i, x) in img[s..e].iter_mut().enumerate().take(8) {
                *x = (v >> (8 * i)) as u8;
            }
        }
        if let Some(bitmap) = bitmap {
            io.seal_bitmap_csums(b, &mut img, bitmap);
        }
        io.reseal(b, &mut img);
        let gen = if img[..] == cache[..] {
            io.generation(b)
        } else {
            0
        };
        Some((Arc::new(img), gen))
    }

    /// Count a logged block: superimposed (its image is not the cached
    /// one: generation 0) or as cached.
    fn count_image(&mut self, image: &Option<Image>) {
        match image {
            Some((_, 0)) => self.stats.superimposed_blocks += 1,
            _ => self.stats.cached_blocks += 1,
        }
    }

    /// Commit every stream (one transaction: the groups merge first).
    fn commit_all(&mut self, io: &mut Io, durable: bool) -> Result<()> {
        self.groups.retain(|_, g| !g.is_empty());
        let roots: Vec<u32> = self.groups.keys().copied().collect();
        let Some(&first) = roots.first() else {
            // Nothing runs: nothing freed waits for a commit.
            self.freed_inodes.clear();
            self.freed_slots.clear();
            self.new_dir_blocks.clear();
            return self.j.commit_staged(io, durable);
        };
        if self.fault == Some(Fault::NoMerge) {
            for r in roots {
                self.commit_group(r, io, durable)?;
            }
            return Ok(());
        }
        for &r in &roots[1..] {
            let (a, b) = (self.find(first), self.find(r));
            if a != b {
                let (root, other) = (a.min(b), a.max(b));
                self.parent[other as usize] = root;
                let g = self.groups.remove(&other).unwrap_or_default();
                self.group(root).absorb(g);
            }
        }
        self.commit_group(first, io, durable)
    }

    fn group_over_bound(&self, s: u32) -> bool {
        let r = self.root(s);
        let Some(g) = self.groups.get(&r) else {
            return false;
        };
        let (need, max) = self.j.txn_size(g.logged.len(), g.revoked.len());
        need >= max
    }
}

impl Protocol for StreamsProtocol {
    fn name(&self) -> &'static str {
        "streams"
    }

    fn on_update(&mut self, u: &Update, h: &HandleInfo) {
        let s = h.stream;
        if let UpdateKind::Bitmap {
            what: BitmapKind::Inode,
            index,
            set: false,
        } = u.kind
        {
            self.freed_inodes.insert(index as Ino, s);
        }
        match &u.kind {
            UpdateKind::Dirent { dir, .. } | UpdateKind::DirBlockInit { dir } => {
                self.dirs.insert(*dir);
            }
            UpdateKind::Inode {
                ino,
                field: InodeField::Whole,
            } => {
                // A new (or freed) inode: whatever it was is forgotten.
                self.dirs.remove(ino);
            }
            _ => {}
        }
        self.record(u, s);
        if let UpdateKind::Dirent {
            op: LinkOp::Remove, ..
        } = &u.kind
        {
            // The first entry of a block is removed by zeroing its inode
            // number; a retarget (rename over a name) reports a removal
            // that changes nothing.
            let mut freed = (u.old != u.new && u.new.iter().all(|&b| b == 0))
                .then_some((u.range.start, u.range.end));
            if u.range.len() == 2 && u.range.start >= 4 {
                // An entry removed by lengthening the one before it: the
                // new length was computed from the removed entry's, which
                // another stream may have written (an entry split off it).
                let prev = u.range.start - 4;
                let (old, new) = (le_value(&u.old) as u32, le_value(&u.new) as u32);
                if new > old {
                    self.claim_read(u.block, prev + old, prev + new, s);
                    freed = Some((prev + old, prev + new));
                }
            }
            // Order-less reuse: the removed entry's bytes stay this
            // stream's until it commits.
            if let Some((start, end)) = freed {
                self.freed_slots
                    .entry(u.block)
                    .or_default()
                    .push((start, end, s));
            }
        }
        match &u.kind {
            UpdateKind::Dirent { dir, name, .. } => {
                let key = (*dir, name.clone());
                if let Some(&o) = self.names.get(&key) {
                    self.merge(s, o);
                }
                self.names.insert(key, s);
                self.note_inode(*dir, s);
            }
            UpdateKind::Inode { ino, field } => {
                self.note_inode(*ino, s);
                // A directory's times and link count are shared, unless
                // set explicitly (chmod, setxattr: even to the value it
                // had, when only the change time moves).
                let explicit = matches!(h.op, OpKind::SetAttr | OpKind::SetXattr);
                let shared = !explicit
                    && matches!(field, InodeField::Links | InodeField::Times)
                    && self.dirs.contains(ino);
                if !shared && *field != InodeField::Checksum {
                    self.own_inode(*ino, s);
                }
            }
            UpdateKind::DirBlockInit { dir: ino } => {
                self.note_inode(*ino, s);
                self.new_dir_blocks.insert(u.block, s);
            }
            UpdateKind::Extent { ino, .. }
            | UpdateKind::ExtentTree { ino, .. }
            | UpdateKind::ExtentBlockInit { ino }
            | UpdateKind::Xattr { ino }
            | UpdateKind::XattrBlockInit { ino }
            | UpdateKind::XattrRef { ino, .. } => {
                self.note_inode(*ino, s);
                self.own_inode(*ino, s);
            }
            _ => {}
        }
        let g = self.group(s);
        g.logged.insert(u.block);
    }

    fn on_data_write(&mut self, w: &DataWrite, h: &HandleInfo) {
        let s = h.stream;
        if let Some(&o) = self.data_owner.get(&w.pblk) {
            self.merge(s, o);
        }
        self.data_owner.insert(w.pblk, s);
        self.note_inode(w.ino, s);
        self.own_inode(w.ino, s);
        let r = self.find(s);
        // A block written in place before a commit must be one no commit
        // names yet: allocated by this transaction (fresh), and not
        // journaled already.
        let fresh_here = {
            let g = self.group(r);
            g.data.contains(&w.pblk) || (w.fresh && !g.logged.contains(&w.pblk))
        };
        let g = self.group(r);
        if fresh_here {
            g.data.insert(w.pblk);
            self.stats.ordered_data += 1;
        } else {
            g.logged.insert(w.pblk);
            self.stats.journaled_data += 1;
        }
    }

    fn on_block_freed(&mut self, block: u64, h: &HandleInfo) {
        let s = h.stream;
        if let Some(&o) = self.data_owner.get(&block) {
            self.merge(s, o);
        }
        self.data_owner.remove(&block);
        let in_log = self.j.in_live_log(block);
        let g = self.group(s);
        let was_logged = g.logged.remove(&block);
        g.data.remove(&block);
        if was_logged || in_log {
            g.revoked.insert(block);
        }
        g.freed.insert(block);
        self.freed.insert(block, s);
        if let Some(t) = self.tracked.get(&block) {
            // A freed metadata block: whatever other streams changed in it
            // is related (their changes die with it).
            let owners = t.streams();
            for o in owners {
                self.merge(s, o);
            }
            self.tracked.remove(&block);
        }
    }

    fn on_block_unallocated(&mut self, block: u64, h: &HandleInfo) {
        let s = h.stream;
        let in_log = self.j.in_live_log(block);
        let g = self.group(s);
        g.logged.remove(&block);
        g.data.remove(&block);
        self.data_owner.remove(&block);
        self.tracked.remove(&block);
        if in_log {
            self.on_block_freed(block, h);
        }
    }

    fn has_pending_frees(&self) -> bool {
        !self.freed.is_empty()
            || !self.freed_inodes.is_empty()
            || !self.freed_slots.is_empty()
            || self.j.has_pending_frees()
    }

    fn on_handle_end(&mut self, h: &HandleInfo, io: &mut Io) -> Result<()> {
        self.settle_fresh_tracked(io);
        if self.group_over_bound(h.stream) {
            self.commit_group(h.stream, io, false)?;
        }
        Ok(())
    }

    fn fsync(&mut self, ino: Ino, datasync: bool, io: &mut Io) -> Result<()> {
        self.fsync_in(0, &[ino], datasync, io)
    }

    fn fsync_in(&mut self, stream: u32, inos: &[Ino], _datasync: bool, io: &mut Io) -> Result<()> {
        // The caller's stream, and every stream with uncommitted changes
        // of the files (the callers' of one group commit), in one commit.
        let mut others: Vec<u32> = inos
            .iter()
            .filter_map(|ino| self.inode_streams.get(ino))
            .flat_map(|set| set.iter().copied())
            .collect();
        others.sort_unstable();
        others.dedup();
        let mut root = self.find(stream);
        for o in others {
            if self.fault == Some(Fault::NoMerge) {
                self.commit_group(o, io, true)?;
            } else {
                root = self.merge(root, o);
            }
        }
        self.commit_group(root, io, true)
    }

    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.commit_all(io, true)
    }

    fn streamsync(&mut self, stream: u32, io: &mut Io) -> Result<()> {
        self.commit_group(stream, io, true)
    }

    fn native_durability_calls(&self) -> DurabilityCalls {
        DurabilityCalls::STREAMSYNC
    }

    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.commit_all(io, reason != WriteBackReason::Timer)?;
        self.j.write_back(reason, io)
    }

    fn delays_allocation(&self) -> bool {
        self.delalloc
    }

    fn commit_due(&self, h: &HandleInfo) -> bool {
        self.fault != Some(Fault::DelallocLate) && self.group_over_bound(h.stream)
    }

    fn held_back_blocks(&self) -> u64 {
        (self.freed.len() + self.j.held_back_blocks()) as u64
    }

    fn can_allocate(&self, block: u64) -> bool {
        if self.fault == Some(Fault::EarlyReuse) {
            return true;
        }
        !self.freed.contains_key(&block) && self.j.reusable(block)
    }

    fn can_allocate_inode(&self, ino: Ino, h: &HandleInfo) -> bool {
        if self.fault == Some(Fault::EarlyReuse) {
            return true;
        }
        match self.freed_inodes.get(&ino) {
            Some(&o) => self.root(o) == self.root(h.stream),
            None => true,
        }
    }

    fn can_reuse_dir_space(
        &self,
        block: u64,
        range: std::ops::Range<usize>,
        h: &HandleInfo,
    ) -> bool {
        if self.fault == Some(Fault::EarlyReuse) {
            return true;
        }
        let root = self.root(h.stream);
        let foreign = |o: u32| self.root(o) != root;
        if let Some(slots) = self.freed_slots.get(&block) {
            if slots.iter().any(|&(start, end, o)| {
                (start as usize) < range.end && range.start < end as usize && foreign(o)
            }) {
                return false;
            }
        }
        // An entry another stream made and has not committed: splitting
        // its room rewrites its `rec_len`, which would merge the streams.
        // Other room (or a new block) keeps them apart, unless the block
        // is one that stream initialized (a new directory's): an entry
        // made there is related to it anyway.
        if self.new_dir_blocks.get(&block).is_some_and(|&o| foreign(o)) {
            return true;
        }
        let Some(t) = self.tracked.get(&block) else {
            return true;
        };
        let end = range.end.min(t.bytes.len());
        let start = range.start.min(end);
        !others_tags(&t.bytes[start..end], tag_of(h.stream)).any(|tag| foreign(stream_of(tag)))
    }

    fn plan_done(&mut self, done: &PlanDone) {
        self.j.plan_done(done);
    }

    fn durable_notice(&mut self, durable: ordo_dev::Ticket) {
        self.j.durable_notice(durable);
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let s = self.stats;
        let mut v = vec![
            ("stream_commits".into(), s.commits),
            ("stream_merges".into(), s.merges),
            ("superimposed_blocks".into(), s.superimposed_blocks),
            ("cached_blocks".into(), s.cached_blocks),
            ("journaled_data_writes".into(), s.journaled_data),
            ("ordered_data_writes".into(), s.ordered_data),
            ("running_streams".into(), self.groups.len() as u64),
            ("tracked_blocks".into(), self.tracked.len() as u64),
        ];
        v.extend(self.j.stats());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SplitMix64;

    #[test]
    fn others_tags_are_the_tags_a_byte_walk_finds() {
        let mut rng = SplitMix64::new(7);
        for round in 0..500 {
            let len = (rng.next_u64() % 300) as usize;
            let mine = 1 + (rng.next_u64() % 4) as Tag;
            // Mostly untagged or the caller's own, a foreign tag now and
            // then, at any place in a chunk.
            let tags: Vec<Tag> = (0..len)
                .map(|_| match rng.next_u64() % 64 {
                    0 => 1 + (rng.next_u64() % 6) as Tag,
                    1..=30 => mine,
                    _ => 0,
                })
                .collect();
            let walked: Vec<Tag> = tags
                .iter()
                .copied()
                .filter(|&t| t != 0 && t != mine)
                .collect();
            let found: Vec<Tag> = others_tags(&tags, mine).collect();
            assert_eq!(found, walked, "round {round}: {tags:?}, mine {mine}");
        }
    }
}
