//! ext4 extent trees of any depth: lookup, insert, remove, convert, shift,
//! check.
//!
//! A file's block map is a B+tree whose root is the inode's 60-byte
//! `i_block` (4 entries) and whose other nodes are whole blocks (84 entries
//! at 1 KiB, 340 at 4 KiB). Leaves hold extents, index nodes hold
//! `(first logical block, child block)` pairs, and every index key equals the
//! first key of its child. The algorithms here work on that tree through an
//! [`ExtentStore`], which the core implements on an inode and its buffer
//! cache and the tests implement on a map of blocks.
//!
//! # Shape of every change
//!
//! An operation first makes room, then edits one leaf:
//!
//! * **Make room** (structural, mappings unchanged). When the leaf cannot
//!   take the edit, the lowest full node whose parent has room is split:
//!   its upper entries are copied into a new block, the parent gains an index
//!   entry for it, and only then is the node truncated. When the chain of
//!   full nodes reaches the root, the root's entries move into a new block
//!   and the root becomes a single index entry pointing at it (the tree
//!   grows by one level). Then the path is walked again from the root.
//!   Appends split lopsided (the new node starts with the last entry), so a
//!   file written in order fills its leaves.
//! * **Edit**: replace a few consecutive entries of one leaf (an insert,
//!   possibly merged with its neighbours; the cut of one extent; the
//!   conversion of part of an unwritten extent). A leaf whose first key
//!   changed updates its parent's key, recursively; a non-root node left
//!   empty loses its parent's pointer and is freed; a root index left empty
//!   becomes an empty leaf again. After a removal, a root with one child
//!   small enough to fit is collapsed into the root.
//!
//! The one exception is a shift (COLLAPSE_RANGE, INSERT_RANGE:
//! [`shift_range`]), which changes every entry after an offset: it builds
//! the shifted tree in fresh blocks and switches the root to it in one
//! write, so that it is atomic without a journal.
//!
//! Writes follow Ganger and Patt's rules: a new node is written whole before
//! a pointer to it is set, and a node's old entries are truncated only after
//! the new pointer is set; a block is freed only after the pointer to it is
//! cleared.
//!
//! # What each update means
//!
//! Each node write is reported as at most two updates, one for the changed
//! bytes of the header (entry count, depth) and one for the changed entries,
//! both with the same kind, so a byte range never covers bytes it did not
//! change:
//!
//! * `Extent { len > 0, op: Set }`: a mapping was set (inserted, merged into
//!   a neighbour, or converted from unwritten to written), in the leaf that
//!   now holds it. `op: Clear`: a mapping was removed, in the leaf that held
//!   it (even when that leaf is freed right after).
//! * `Extent { len == 0, .. }`: an index entry `lblk -> pblk` (the child
//!   block) was set (added or re-keyed) or cleared. The root write that
//!   grows the tree is a `Set`; the root write that absorbs its only child
//!   is a `Clear` of the pointer to that child.
//! * `ExtentBlockInit` (reported by the store from `init_tree_block`): a new
//!   node written whole.
//! * `Other`: a node truncated after a split copied its upper entries to a
//!   new node whose index entry is already set. No mapping changes.
//! * `ExtentTree`: the root switched to a tree built by [`shift_range`],
//!   naming its fresh blocks and data and dropping the old tree's blocks
//!   and the collapsed data (see `UpdateKind::ExtentTree`).
//! * `Checksum`: the tail checksum of a tree block, after any of the above.
//!
//! Corrupt trees are reported as [`FsError::Corrupt`] naming the block and
//! field, never a panic; descent is bounded by the depth limit (5) and every
//! child's depth must be its parent's minus one, so a cycle cannot loop.

use std::collections::HashSet;
use std::ops::Range;

use smallvec::SmallVec;

use ordo_format::extent::{
    block_max_entries, max_len, tail_offset, ExtentEntries, ExtentHeader, ExtentIndex, ExtentLeaf,
    ExtentNode, EXTENT_DEPTH_MAX, EXTENT_ENTRY_SIZE, EXTENT_HEADER_SIZE, EXTENT_PBLK_LIMIT,
    EXTENT_ROOT_MAX_ENTRIES, EXTENT_TAIL_SIZE,
};

use crate::error::{FsError, Result};
use crate::update::{Ino, MapOp, UpdateKind};

/// One past the last logical block a file can map (ext4 logical block
/// numbers are 32-bit).
pub const LBLK_END: u64 = 1 << 32;

/// Size of the extent-tree root inside the inode (`i_block`).
pub const ROOT_SIZE_BYTES: usize = 60;

/// Smallest `eh_max` accepted in a tree block: splitting needs at least
/// this many entries per node (ext4 itself writes 84 or more).
pub const BLOCK_MAX_ENTRIES_MIN: u16 = 4;

/// Structural steps one edit may need before it fits: a split per level
/// plus a growth, with slack for a split that leaves the edit's side full.
const RESTRUCTURE_ROUNDS_MAX: usize = 4 * (EXTENT_DEPTH_MAX as usize + 2);

/// What the tree algorithms need from the file-system core: the inode's
/// `i_block`, and the tree blocks below it. The store turns each call into
/// an update on the current operation handle.
pub trait ExtentStore {
    /// File-system block size in bytes.
    fn block_size(&self) -> u32;
    /// Number of blocks of the file system (`s_blocks_count`): tree and data
    /// pointers at or beyond it are corrupt.
    fn blocks_count(&self) -> u64;
    /// The inode whose tree this is (for update meanings).
    fn ino(&self) -> Ino;
    /// The current `i_block` (the root node).
    fn root(&self) -> [u8; ROOT_SIZE_BYTES];
    /// Replace `bytes.len()` bytes of `i_block` at `offset`; `kind` says what
    /// the change means. The store refreshes the inode's checksum.
    fn set_root(&mut self, offset: u32, bytes: &[u8], kind: UpdateKind) -> Result<()>;
    /// The current image of tree block `pblk` (raw; the tree code validates
    /// it, including its checksum through [`ExtentStore::csum_tree_block`]).
    fn read_tree_block(&mut self, pblk: u64) -> Result<Vec<u8>>;
    /// Allocate a block for a new tree node near `goal`; the store counts it
    /// in the inode's `i_blocks`.
    fn alloc_tree_block(&mut self, goal: u64) -> Result<u64>;
    /// Write the whole image of a freshly allocated tree block (reported as
    /// [`UpdateKind::ExtentBlockInit`]). The image already carries its tail
    /// checksum.
    fn init_tree_block(&mut self, pblk: u64, image: &[u8]) -> Result<()>;
    /// Replace `bytes.len()` bytes of tree block `pblk` at `offset`.
    fn modify_tree_block(
        &mut self,
        pblk: u64,
        offset: u32,
        bytes: &[u8],
        kind: UpdateKind,
    ) -> Result<()>;
    /// Release a tree block no longer referenced (and uncount it from
    /// `i_blocks`).
    fn free_tree_block(&mut self, pblk: u64) -> Result<()>;
    /// Fill the extent tail checksum of `image` (a whole tree block). A file
    /// system without `metadata_csum` leaves the image unchanged.
    fn csum_tree_block(&self, image: &mut [u8]);
}

/// A run of logical blocks mapped to consecutive physical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First logical block.
    pub lblk: u32,
    /// First physical block.
    pub pblk: u64,
    /// Number of blocks.
    pub len: u32,
    /// Allocated but not written (reads as zeros).
    pub unwritten: bool,
}

impl Mapping {
    /// One past the last logical block.
    pub fn end(&self) -> u64 {
        u64::from(self.lblk) + u64::from(self.len)
    }
    /// True when `lblk` falls inside this mapping.
    pub fn contains(&self, lblk: u32) -> bool {
        self.lblk <= lblk && u64::from(lblk) < self.end()
    }
    /// The physical block of `lblk`, if inside.
    pub fn pblk_of(&self, lblk: u32) -> Option<u64> {
        self.contains(lblk)
            .then(|| self.pblk + u64::from(lblk - self.lblk))
    }
}

/// What [`check`] found in a valid tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeSummary {
    /// Depth of the tree (0: the root holds the extents).
    pub depth: u16,
    /// Every tree block (index and leaf blocks, not the root), in tree order.
    pub tree_blocks: Vec<u64>,
    /// Non-root leaves without entries (valid ext4, never left by ordo).
    pub empty_leaves: u64,
    /// Number of extents.
    pub extent_count: u64,
    /// Number of mapped logical blocks (written and unwritten).
    pub mapped_blocks: u64,
}

/// The `i_block` of an empty extent tree (depth 0, no entries).
pub fn empty_root() -> [u8; ROOT_SIZE_BYTES] {
    ExtentNode::empty_leaf(EXTENT_ROOT_MAX_ENTRIES).encode_root()
}

/// The extent containing `lblk`, or else the first one after it (what
/// `SEEK_DATA` needs); `None` past the last extent.
pub fn lookup<S: ExtentStore>(store: &mut S, lblk: u32) -> Result<Option<Mapping>> {
    let mut path = descend(store, lblk)?;
    loop {
        let leaf = &path.last().expect("path has a leaf").node;
        if let Some(e) = leaf.ents.iter().find(|e| e.end() > u64::from(lblk)) {
            return Ok(Some(e.mapping()));
        }
        if !next_leaf(store, &mut path)? {
            return Ok(None);
        }
    }
}

/// The mappings of the logical blocks in `range`, clipped to it, in order.
pub fn extents<S: ExtentStore>(store: &mut S, range: Range<u64>) -> Result<Vec<Mapping>> {
    let end = range.end.min(LBLK_END);
    let mut out = Vec::new();
    if range.start >= end {
        return Ok(out);
    }
    let start = range.start as u32;
    let mut path = descend(store, start)?;
    loop {
        let leaf = &path.last().expect("path has a leaf").node;
        for e in &leaf.ents {
            if u64::from(e.lblk) >= end {
                return Ok(out);
            }
            if e.end() <= range.start {
                continue;
            }
            let a = u64::from(e.lblk).max(range.start);
            let b = e.end().min(end);
            out.push(Mapping {
                lblk: a as u32,
                pblk: e.pblk + (a - u64::from(e.lblk)),
                len: (b - a) as u32,
                unwritten: e.unwritten,
            });
        }
        if !next_leaf(store, &mut path)? {
            return Ok(out);
        }
    }
}

/// Map `len` logical blocks from `lblk` to physical blocks from `pblk`. The
/// range must be unmapped (else `FsError::Invalid`, nothing changed). The
/// new extent merges with its left and right neighbours in the same leaf
/// when they are contiguous on both sides and equally written; runs longer
/// than an extent can hold become several. On an error (a tree block could
/// not be allocated, a corrupt node) nothing of the run stays mapped.
pub fn insert<S: ExtentStore>(
    store: &mut S,
    lblk: u32,
    pblk: u64,
    len: u32,
    unwritten: bool,
) -> Result<()> {
    let end = u64::from(lblk) + u64::from(len);
    if len == 0 || end > LBLK_END {
        return Err(FsError::Invalid(format!(
            "extent insert of {len} blocks at logical block {lblk}"
        )));
    }
    let pblk_limit = store.blocks_count().min(EXTENT_PBLK_LIMIT);
    if pblk == 0 || pblk + u64::from(len) > pblk_limit {
        return Err(FsError::Invalid(format!(
            "extent insert of physical blocks {pblk}+{len} outside the file system"
        )));
    }
    if let Some(m) = lookup(store, lblk)? {
        if u64::from(m.lblk) < end {
            return Err(FsError::Invalid(format!(
                "extent insert at {lblk}+{len} over mapped blocks {}+{} of inode {}",
                m.lblk,
                m.len,
                store.ino()
            )));
        }
    }
    let chunk_max = max_len(unwritten);
    let mut done: u32 = 0;
    while done < len {
        let n = (len - done).min(chunk_max);
        let chunk = Ent {
            lblk: lblk + done,
            len: n,
            pblk: pblk + u64::from(done),
            unwritten,
        };
        if let Err(e) = insert_one(store, chunk) {
            // All or nothing, so the caller may free the whole run: unmap
            // the chunks already in. Each is a whole extent (a full-length
            // chunk merges with nothing), so removing them splits nothing
            // and allocates nothing.
            if done > 0 {
                remove_range(store, lblk, u64::from(done))?;
            }
            return Err(e);
        }
        done += n;
    }
    Ok(())
}

/// Unmap `len` logical blocks from `lblk` (holes inside are fine); returns
/// the physical runs released, as `(pblk, len)` in logical order. Extents
/// crossing the edges are cut. Tree blocks left empty are freed and a root
/// with one small child absorbs it. Only a hole punched inside a single
/// extent needs a new entry (and so perhaps a new block); that is the whole
/// operation, so a failure to allocate leaves the tree unchanged.
pub fn remove_range<S: ExtentStore>(store: &mut S, lblk: u32, len: u64) -> Result<Vec<(u64, u32)>> {
    let freed = remove_range_keeping_depth(store, lblk, len)?;
    collapse(store)?;
    Ok(freed)
}

/// [`remove_range`] without the root absorbing a small child afterwards:
/// the fast-commit replay, which must place tree nodes where the kernel's
/// replay does, removes an ADD_RANGE's old mapping this way and ends with
/// [`collapse_root`] after the insert, the kernel's merge-up.
pub fn remove_range_keeping_depth<S: ExtentStore>(
    store: &mut S,
    lblk: u32,
    len: u64,
) -> Result<Vec<(u64, u32)>> {
    let start = u64::from(lblk);
    let end = start.saturating_add(len).min(LBLK_END);
    let mut freed = Vec::new();
    let mut cur_end = end;
    let mut rounds = 0usize;
    // Backwards, one extent per step: a truncation then removes the last
    // entries of a leaf, which moves no other entry.
    while cur_end > start {
        let mut path = descend(store, (cur_end - 1) as u32)?;
        let leaf = &path.last().expect("path has a leaf").node;
        let i = leaf.ents.partition_point(|e| u64::from(e.lblk) < cur_end);
        if i == 0 {
            break;
        }
        let e = leaf.ents[i - 1];
        if e.end() <= start {
            break;
        }
        let a = u64::from(e.lblk).max(start);
        let b = e.end().min(cur_end);
        let mut repl = Vec::with_capacity(2);
        if u64::from(e.lblk) < a {
            repl.push(e.slice(u64::from(e.lblk), a));
        }
        if b < e.end() {
            repl.push(e.slice(b, e.end()));
        }
        let cut = e.slice(a, b);
        let kind = mapping_kind(store.ino(), &cut, MapOp::Clear);
        if run_edit(store, &mut path, i - 1, i, repl, kind)? {
            freed.push((cut.pblk, cut.len));
            cur_end = a;
            rounds = 0;
        } else {
            rounds += 1;
            check_rounds(store, rounds)?;
        }
    }
    freed.reverse();
    Ok(freed)
}

/// A root with one child whose entries fit in it absorbs the child (the
/// kernel's `ext4_ext_try_to_merge_up`, which its insert runs).
pub fn collapse_root<S: ExtentStore>(store: &mut S) -> Result<()> {
    collapse(store)
}

/// Mark the unwritten blocks in `lblk..lblk + len` written, splitting an
/// unwritten extent into up to three and merging the written part with a
/// written neighbour. Written blocks and holes in the range are left alone.
/// Extents are converted in order, each in one step: on an error (no block
/// for a split) the ones before stay converted.
pub fn mark_written<S: ExtentStore>(store: &mut S, lblk: u32, len: u64) -> Result<()> {
    let end = u64::from(lblk).saturating_add(len).min(LBLK_END);
    let mut cur = u64::from(lblk);
    let mut rounds = 0usize;
    while cur < end {
        let mut path = descend(store, cur as u32)?;
        // The first extent ending after `cur`, possibly in a later leaf.
        let i = loop {
            let leaf = &path.last().expect("path has a leaf").node;
            if let Some(i) = leaf.ents.iter().position(|e| e.end() > cur) {
                break Some(i);
            }
            if !next_leaf(store, &mut path)? {
                break None;
            }
        };
        let Some(i) = i else { break };
        let ents = &path.last().expect("path has a leaf").node.ents;
        let e = ents[i];
        if u64::from(e.lblk) >= end {
            break;
        }
        if !e.unwritten {
            cur = e.end();
            continue;
        }
        let a = u64::from(e.lblk).max(cur);
        let b = e.end().min(end);
        let mut mid = e.slice(a, b);
        mid.unwritten = false;
        let kind = mapping_kind(store.ino(), &mid, MapOp::Set);
        let (mut lo, mut hi) = (i, i + 1);
        let mut repl = Vec::with_capacity(3);
        if u64::from(e.lblk) < a {
            repl.push(e.slice(u64::from(e.lblk), a));
        } else if i > 0 && mergeable(&ents[i - 1], &mid) {
            lo = i - 1;
            mid = Ent {
                len: ents[i - 1].len + mid.len,
                ..ents[i - 1]
            };
        }
        let right = (b < e.end()).then(|| e.slice(b, e.end()));
        if right.is_none() && i + 1 < ents.len() && mergeable(&mid, &ents[i + 1]) {
            hi = i + 2;
            mid.len += ents[i + 1].len;
        }
        repl.push(mid);
        repl.extend(right);
        if run_edit(store, &mut path, lo, hi, repl, kind)? {
            cur = b;
            rounds = 0;
        } else {
            rounds += 1;
            check_rounds(store, rounds)?;
        }
    }
    Ok(())
}

/// Which way [`shift_range`] moves extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    /// Towards logical block 0 (COLLAPSE_RANGE).
    Left,
    /// Away from logical block 0 (INSERT_RANGE).
    Right,
}

/// COLLAPSE_RANGE (`Shift::Left`: logical blocks `at .. at + by` leave the
/// file and everything after them moves down by `by`) or INSERT_RANGE
/// (`Shift::Right`: everything from `at` moves up by `by`, the extent
/// crossing `at` split there), as **one write of the root**: the shifted
/// tree is built in fresh blocks and the root switched to it
/// ([`UpdateKind::ExtentTree`]), then the old tree's blocks are freed. A
/// crash thus shows the old tree or the new one, never one half shifted:
/// ext4 shifts in place inside one journal transaction, which a protocol
/// without a journal cannot make atomic (two leaves written in place are
/// two writes). Moved extents merge with their new neighbours when they
/// become contiguous, as ext4's shift merges them.
///
/// Returns the data runs `(pblk, len)` the collapsed range mapped, which
/// nothing maps any more: the caller frees them. An error (a shift past
/// the last logical block is `FsError::Invalid`; no room for the new tree
/// is ENOSPC; a corrupt node) leaves the tree as it was, apart from tree
/// blocks allocated and initialized for the new tree, which the caller's
/// handle rollback releases.
pub fn shift_range<S: ExtentStore>(
    store: &mut S,
    at: u32,
    by: u32,
    dir: Shift,
) -> Result<Vec<(u64, u32)>> {
    let ino = store.ino();
    let (at, by) = (u64::from(at), u64::from(by));
    let old = extents(store, 0..LBLK_END)?;
    let mut ents: Vec<Ent> = Vec::with_capacity(old.len() + 1);
    let mut freed: Vec<(u64, u32)> = Vec::new();
    let push = |ents: &mut Vec<Ent>, e: Ent| match ents.last_mut() {
        Some(p) if mergeable(p, &e) => p.len += e.len,
        _ => ents.push(e),
    };
    for m in &old {
        let e = Ent {
            lblk: m.lblk,
            len: m.len,
            pblk: m.pblk,
            unwritten: m.unwritten,
        };
        let (lo, hi) = (u64::from(e.lblk), e.end());
        match dir {
            Shift::Left => {
                let cut_end = at + by;
                if cut_end > LBLK_END {
                    return Err(FsError::Invalid(format!(
                        "collapse of inode {ino} from {at} by {by} past the last logical block"
                    )));
                }
                if lo < at {
                    push(&mut ents, e.slice(lo, hi.min(at)));
                }
                if lo.max(at) < hi.min(cut_end) {
                    let gone = e.slice(lo.max(at), hi.min(cut_end));
                    freed.push((gone.pblk, gone.len));
                }
                if hi > cut_end {
                    let kept = e.slice(lo.max(cut_end), hi);
                    let moved = Ent {
                        lblk: kept.lblk - by as u32,
                        ..kept
                    };
                    push(&mut ents, moved);
                }
            }
            Shift::Right => {
                if lo < at {
                    push(&mut ents, e.slice(lo, hi.min(at)));
                }
                if hi > at {
                    if hi + by > LBLK_END {
                        return Err(FsError::Invalid(format!(
                            "insert into inode {ino} at {at} by {by}: extent {lo}+{} would pass \
                             the last logical block",
                            e.len
                        )));
                    }
                    let kept = e.slice(lo.max(at), hi);
                    let moved = Ent {
                        lblk: kept.lblk + by as u32,
                        ..kept
                    };
                    push(&mut ents, moved);
                }
            }
        }
    }
    let dropped: Vec<(u64, u64)> = freed.iter().map(|&(p, n)| (p, p + u64::from(n))).collect();
    rebuild(store, &ents, dropped)?;
    Ok(freed)
}

/// Replace the whole tree by one holding `ents` (sorted, disjoint, valid
/// extents): the levels below the root are built bottom up in fresh
/// blocks, each node full but the last of its level, then one write of
/// the root names them, then the old tree's blocks are freed. `dropped`
/// are the data runs the old tree mapped and the new one does not.
fn rebuild<S: ExtentStore>(store: &mut S, ents: &[Ent], dropped: Vec<(u64, u64)>) -> Result<()> {
    debug_assert!(ents.windows(2).all(|w| w[0].end() <= u64::from(w[1].lblk)));
    // The whole old tree is read and validated before anything changes.
    let old = check(store)?;
    let mut root = read_root(store)?;
    let cap = usize::from(block_max_entries(store.block_size()));
    let root_cap = usize::from(root.max);
    let mut named: Vec<(u64, u64)> = ents
        .iter()
        .map(|e| (e.pblk, e.pblk + u64::from(e.len)))
        .collect();
    let mut goal = old
        .tree_blocks
        .first()
        .copied()
        .or(ents.first().map(|e| e.pblk))
        .unwrap_or(0);
    let mut level: Vec<Ent> = ents.to_vec();
    let mut depth = 0u16;
    while level.len() > root_cap {
        if depth >= EXTENT_DEPTH_MAX {
            return Err(FsError::Errno(libc::EFBIG));
        }
        let mut up = Vec::with_capacity(level.len().div_ceil(cap));
        for chunk in level.chunks(cap) {
            let p = init_block(store, goal, chunk, depth)?;
            named.push((p, p + 1));
            up.push(Ent::index(chunk[0].lblk, p));
            goal = p + 1;
        }
        level = up;
        depth += 1;
    }
    root.ents = level;
    root.depth = depth;
    let mut image = root.image.clone();
    encode_over(&root, &mut image);
    let mut dropped = dropped;
    dropped.extend(old.tree_blocks.iter().map(|&b| (b, b + 1)));
    let kind = UpdateKind::ExtentTree {
        ino: store.ino(),
        named,
        dropped,
    };
    store.set_root(0, &image, kind)?;
    for b in old.tree_blocks {
        store.free_tree_block(b)?;
    }
    Ok(())
}

/// One past the last mapped logical block (0 for an empty tree).
pub fn last_extent_end<S: ExtentStore>(store: &mut S) -> Result<u64> {
    let path = descend(store, u32::MAX)?;
    Ok(path
        .last()
        .expect("path has a leaf")
        .node
        .ents
        .last()
        .map_or(0, Ent::end))
}

/// Validate the whole tree: every node decodes and carries a valid tail
/// checksum; depths step down by one; index keys increase and equal the
/// first key of their child; extents are sorted, do not overlap, stay inside
/// their parent's key range and point inside the file system; no tree block
/// is referenced twice. Used by tests and by fsck.
pub fn check<S: ExtentStore>(store: &mut S) -> Result<TreeSummary> {
    let root = read_root(store)?;
    let mut walk = Walk {
        summary: TreeSummary {
            depth: root.depth,
            ..TreeSummary::default()
        },
        seen: HashSet::new(),
        prev_end: 0,
    };
    if root.depth > 0 && root.ents.is_empty() {
        return Err(corrupt_root(
            store,
            "eh_entries",
            format!("index root (depth {}) with no entries", root.depth),
        ));
    }
    walk.node(store, &root, 0, LBLK_END)?;
    Ok(walk.summary)
}

/// An entry of either kind: an extent (`len > 0`) or an index entry
/// (`len == 0`, `pblk` the child block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ent {
    lblk: u32,
    len: u32,
    pblk: u64,
    unwritten: bool,
}

impl Ent {
    fn index(lblk: u32, child: u64) -> Self {
        Ent {
            lblk,
            len: 0,
            pblk: child,
            unwritten: false,
        }
    }
    fn end(&self) -> u64 {
        u64::from(self.lblk) + u64::from(self.len)
    }
    fn mapping(&self) -> Mapping {
        Mapping {
            lblk: self.lblk,
            pblk: self.pblk,
            len: self.len,
            unwritten: self.unwritten,
        }
    }
    /// The part of this extent covering logical blocks `a..b` (inside it).
    fn slice(&self, a: u64, b: u64) -> Ent {
        debug_assert!(u64::from(self.lblk) <= a && a < b && b <= self.end());
        Ent {
            lblk: a as u32,
            len: (b - a) as u32,
            pblk: self.pblk + (a - u64::from(self.lblk)),
            unwritten: self.unwritten,
        }
    }
}

/// `a` directly followed by `b`, logically and physically, equally written,
/// and short enough together for one extent.
fn mergeable(a: &Ent, b: &Ent) -> bool {
    a.end() == u64::from(b.lblk)
        && a.pblk + u64::from(a.len) == b.pblk
        && a.unwritten == b.unwritten
        && a.len + b.len <= max_len(a.unwritten)
}

fn mapping_kind(ino: Ino, e: &Ent, op: MapOp) -> UpdateKind {
    UpdateKind::Extent {
        ino,
        lblk: e.lblk,
        pblk: e.pblk,
        len: e.len,
        op,
    }
}

fn index_kind(ino: Ino, lblk: u32, child: u64, op: MapOp) -> UpdateKind {
    UpdateKind::Extent {
        ino,
        lblk,
        pblk: child,
        len: 0,
        op,
    }
}

/// Where a node lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Root,
    Block(u64),
}

/// A node as read, with its current image (60 bytes for the root).
#[derive(Clone, Debug)]
struct Node {
    loc: Loc,
    depth: u16,
    max: u16,
    generation: u32,
    ents: Vec<Ent>,
    image: Image,
}

/// A node's image: the root's 60 bytes inline, a tree block's on the heap
/// (taken over from the block read, not copied).
type Image = SmallVec<[u8; 64]>;

impl Node {
    fn pblk(&self) -> u64 {
        match self.loc {
            Loc::Root => 0,
            Loc::Block(p) => p,
        }
    }
}

/// One level of a root-to-leaf path: the node and, above the leaf, the
/// entry the path descends through.
#[derive(Clone, Debug)]
struct Level {
    node: Node,
    idx: usize,
}

/// Most trees are one or two levels deep: a path of up to three levels
/// needs no allocation.
type Path = SmallVec<[Level; 3]>;

fn corrupt_root<S: ExtentStore>(store: &S, field: &str, detail: impl Into<String>) -> FsError {
    FsError::corrupt(
        0,
        format!("inode {} i_block extent root {field}", store.ino()),
        detail,
    )
}

fn corrupt_block<S: ExtentStore>(
    store: &S,
    pblk: u64,
    field: &str,
    detail: impl Into<String>,
) -> FsError {
    FsError::corrupt(
        pblk,
        format!("inode {} extent block {field}", store.ino()),
        detail,
    )
}

fn corrupt_at<S: ExtentStore>(
    store: &S,
    loc: Loc,
    field: &str,
    detail: impl Into<String>,
) -> FsError {
    match loc {
        Loc::Root => corrupt_root(store, field, detail),
        Loc::Block(p) => corrupt_block(store, p, field, detail),
    }
}

fn check_rounds<S: ExtentStore>(store: &S, rounds: usize) -> Result<()> {
    if rounds > RESTRUCTURE_ROUNDS_MAX {
        return Err(corrupt_root(
            store,
            "eh_max",
            format!("no room for an edit after {rounds} splits"),
        ));
    }
    Ok(())
}

fn node_from(loc: Loc, n: ExtentNode, image: Image) -> Node {
    let ents = match n.entries {
        ExtentEntries::Leaf(v) => v
            .into_iter()
            .map(|e| Ent {
                lblk: e.lblk,
                len: e.len,
                pblk: e.pblk,
                unwritten: e.unwritten,
            })
            .collect(),
        ExtentEntries::Index(v) => v.into_iter().map(|e| Ent::index(e.lblk, e.child)).collect(),
    };
    Node {
        loc,
        depth: n.header.depth,
        max: n.header.max,
        generation: n.header.generation,
        ents,
        image,
    }
}

fn read_root<S: ExtentStore>(store: &S) -> Result<Node> {
    let image = store.root();
    let n = ExtentNode::decode_root(&image).map_err(|e| corrupt_root(store, e.field, e.detail))?;
    Ok(node_from(Loc::Root, n, Image::from_slice(&image)))
}

/// Read and validate the child `pblk` that `parent` points to at `depth`.
fn read_child<S: ExtentStore>(store: &mut S, parent: Loc, pblk: u64, depth: u16) -> Result<Node> {
    if pblk == 0 || pblk >= store.blocks_count() {
        return Err(corrupt_at(
            store,
            parent,
            "ei_leaf",
            format!(
                "child block {pblk} outside the file system ({} blocks)",
                store.blocks_count()
            ),
        ));
    }
    let image = store.read_tree_block(pblk)?;
    let bs = store.block_size() as usize;
    if image.len() != bs {
        return Err(corrupt_block(
            store,
            pblk,
            "image",
            format!("{} bytes, block size {bs}", image.len()),
        ));
    }
    let n = ExtentNode::decode_block(&image)
        .map_err(|e| corrupt_block(store, pblk, e.field, e.detail))?;
    let mut want = image.clone();
    store.csum_tree_block(&mut want);
    let off = tail_offset(n.header.max);
    let tail = off..off + EXTENT_TAIL_SIZE;
    if want[tail.clone()] != image[tail.clone()] {
        return Err(corrupt_block(
            store,
            pblk,
            "et_checksum",
            format!(
                "{:02x?}, computed {:02x?}",
                &image[tail.clone()],
                &want[tail]
            ),
        ));
    }
    if n.header.depth != depth {
        return Err(corrupt_block(
            store,
            pblk,
            "eh_depth",
            format!("{}, expected {depth} below its parent", n.header.depth),
        ));
    }
    if n.header.max < BLOCK_MAX_ENTRIES_MIN {
        return Err(corrupt_block(
            store,
            pblk,
            "eh_max",
            format!("{} below {BLOCK_MAX_ENTRIES_MIN}", n.header.max),
        ));
    }
    Ok(node_from(Loc::Block(pblk), n, Image::from_vec(image)))
}

/// The path from the root to the leaf whose key range holds `key`: at every
/// index node, the last entry whose key is `<= key` (or the first).
fn descend<S: ExtentStore>(store: &mut S, key: u32) -> Result<Path> {
    let root = read_root(store)?;
    let mut path: Path = smallvec::smallvec![Level { node: root, idx: 0 }];
    loop {
        let lv = path.last_mut().expect("path is never empty");
        if lv.node.depth == 0 {
            return Ok(path);
        }
        if lv.node.ents.is_empty() {
            return Err(corrupt_at(
                store,
                lv.node.loc,
                "eh_entries",
                format!("index node (depth {}) with no entries", lv.node.depth),
            ));
        }
        let idx = lv.node.ents.partition_point(|e| e.lblk <= key).max(1) - 1;
        lv.idx = idx;
        let (loc, child, depth) = (lv.node.loc, lv.node.ents[idx].pblk, lv.node.depth - 1);
        let node = read_child(store, loc, child, depth)?;
        path.push(Level { node, idx: 0 });
    }
}

/// Move `path` to the next leaf to the right; false at the last leaf.
fn next_leaf<S: ExtentStore>(store: &mut S, path: &mut Path) -> Result<bool> {
    let mut l = path.len() - 1;
    loop {
        if l == 0 {
            return Ok(false);
        }
        l -= 1;
        if path[l].idx + 1 < path[l].node.ents.len() {
            path[l].idx += 1;
            break;
        }
    }
    path.truncate(l + 1);
    loop {
        let lv = path.last().expect("path is never empty");
        if lv.node.depth == 0 {
            return Ok(true);
        }
        let (loc, child, depth) = (lv.node.loc, lv.node.ents[lv.idx].pblk, lv.node.depth - 1);
        let node = read_child(store, loc, child, depth)?;
        if node.depth > 0 && node.ents.is_empty() {
            return Err(corrupt_block(
                store,
                child,
                "eh_entries",
                format!("index node (depth {}) with no entries", node.depth),
            ));
        }
        path.push(Level { node, idx: 0 });
    }
}

/// Encode `node` (with `ents` and `depth`) over its current image: header
/// and valid entries; stale slots beyond the entry count are left as they
/// are, as ext4 leaves them.
fn encode_over(node: &Node, image: &mut [u8]) {
    assert!(node.ents.len() <= node.max as usize, "extent node overfull");
    assert!(tail_offset(node.max) <= image.len(), "extent node max");
    ExtentHeader {
        entries: node.ents.len() as u16,
        max: node.max,
        depth: node.depth,
        generation: node.generation,
    }
    .encode_into(image);
    for (i, e) in node.ents.iter().enumerate() {
        let off = EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
        let slot = &mut image[off..off + EXTENT_ENTRY_SIZE];
        if node.depth == 0 {
            ExtentLeaf {
                lblk: e.lblk,
                len: e.len,
                unwritten: e.unwritten,
                pblk: e.pblk,
            }
            .encode_into(slot);
        } else {
            ExtentIndex {
                lblk: e.lblk,
                child: e.pblk,
            }
            .encode_into(slot);
        }
    }
}

/// The smallest range covering the bytes that differ in `a[r]` and `b[r]`.
fn diff_range(a: &[u8], b: &[u8], r: Range<usize>) -> Option<Range<usize>> {
    let first = (r.start..r.end).find(|&i| a[i] != b[i])?;
    let last = (r.start..r.end).rev().find(|&i| a[i] != b[i])?;
    Some(first..last + 1)
}

/// Give `node` new entries and depth and write what changed through the
/// store, then refresh a tree block's tail checksum.
fn write_node<S: ExtentStore>(
    store: &mut S,
    node: &mut Node,
    ents: Vec<Ent>,
    depth: u16,
    kind: UpdateKind,
) -> Result<()> {
    node.ents = ents;
    node.depth = depth;
    let mut image = node.image.clone();
    encode_over(node, &mut image);
    let entries_end = tail_offset(node.max);
    for r in [0..EXTENT_HEADER_SIZE, EXTENT_HEADER_SIZE..entries_end] {
        let Some(r) = diff_range(&node.image, &image, r) else {
            continue;
        };
        match node.loc {
            Loc::Root => store.set_root(r.start as u32, &image[r], kind.clone())?,
            Loc::Block(p) => store.modify_tree_block(p, r.start as u32, &image[r], kind.clone())?,
        }
    }
    if let Loc::Block(p) = node.loc {
        let mut summed = image.clone();
        store.csum_tree_block(&mut summed);
        let tail = entries_end..entries_end + EXTENT_TAIL_SIZE;
        if summed[tail.clone()] != image[tail.clone()] {
            store.modify_tree_block(p, tail.start as u32, &summed[tail], UpdateKind::Checksum)?;
        }
        image = summed;
    }
    node.image = image;
    Ok(())
}

/// Build, checksum and write a new tree block holding `ents` at `depth`.
fn init_block<S: ExtentStore>(store: &mut S, goal: u64, ents: &[Ent], depth: u16) -> Result<u64> {
    let bs = store.block_size();
    let max = block_max_entries(bs);
    if max < BLOCK_MAX_ENTRIES_MIN {
        return Err(FsError::Invalid(format!(
            "extent tree blocks of {bs} bytes hold {max} entries"
        )));
    }
    assert!(ents.len() <= max as usize, "new extent node overfull");
    let pblk = store.alloc_tree_block(goal)?;
    if pblk == 0 || pblk >= store.blocks_count().min(EXTENT_PBLK_LIMIT) {
        return Err(FsError::Invalid(format!(
            "tree block {pblk} allocated outside the file system"
        )));
    }
    let mut node = Node {
        loc: Loc::Block(pblk),
        depth,
        max,
        generation: 0,
        ents: ents.to_vec(),
        image: Image::new(),
    };
    let mut image = ExtentNode::empty_leaf(max).encode_block(bs);
    encode_over(&node, &mut image);
    store.csum_tree_block(&mut image);
    store.init_tree_block(pblk, &image)?;
    node.image = Image::from_vec(image);
    Ok(pblk)
}

/// Replace entries `lo..hi` of the node at `level` by `repl` (which must
/// fit), then keep the tree's invariants above it: re-key the parent when
/// the first key changed, unlink and free a non-root node left empty, turn
/// an empty index root back into an empty leaf.
fn apply_edit<S: ExtentStore>(
    store: &mut S,
    path: &mut Path,
    level: usize,
    lo: usize,
    hi: usize,
    repl: Vec<Ent>,
    kind: UpdateKind,
) -> Result<()> {
    let node = &mut path[level].node;
    let old_first = node.ents.first().map(|e| e.lblk);
    let mut ents = node.ents.clone();
    ents.splice(lo..hi, repl);
    let depth = if level == 0 && ents.is_empty() {
        0
    } else {
        node.depth
    };
    write_node(store, node, ents, depth, kind)?;
    if level == 0 {
        return Ok(());
    }
    let child = node.pblk();
    let new_first = node.ents.first().map(|e| e.lblk);
    let pidx = path[level - 1].idx;
    match new_first {
        None => {
            let key = path[level - 1].node.ents[pidx].lblk;
            let kind = index_kind(store.ino(), key, child, MapOp::Clear);
            apply_edit(store, path, level - 1, pidx, pidx + 1, Vec::new(), kind)?;
            store.free_tree_block(child)?;
            path.truncate(level);
        }
        Some(key) if Some(key) != old_first => {
            let kind = index_kind(store.ino(), key, child, MapOp::Set);
            let repl = vec![Ent::index(key, child)];
            apply_edit(store, path, level - 1, pidx, pidx + 1, repl, kind)?;
        }
        Some(_) => {}
    }
    Ok(())
}

/// Replace entries `lo..hi` of the leaf at the end of `path` by `repl` if
/// they fit (true); otherwise make room with one structural step and return
/// false: the caller walks the tree again and recomputes its edit.
fn run_edit<S: ExtentStore>(
    store: &mut S,
    path: &mut Path,
    lo: usize,
    hi: usize,
    repl: Vec<Ent>,
    kind: UpdateKind,
) -> Result<bool> {
    let leaf_level = path.len() - 1;
    let leaf = &path[leaf_level].node;
    let new_len = leaf.ents.len() - (hi - lo) + repl.len();
    if new_len <= leaf.max as usize {
        apply_edit(store, path, leaf_level, lo, hi, repl, kind)?;
        return Ok(true);
    }
    make_room(store, path, lo)?;
    Ok(false)
}

/// One structural step towards room in the leaf of `path`, whose edit is at
/// entry `pos`: split the highest full node of the full chain above the
/// leaf, or grow the tree when that chain reaches the root.
fn make_room<S: ExtentStore>(store: &mut S, path: &mut Path, pos: usize) -> Result<()> {
    let mut l = path.len() - 1;
    while l > 0 && path[l - 1].node.ents.len() >= path[l - 1].node.max as usize {
        l -= 1;
    }
    if l == 0 {
        return grow(store, path);
    }
    let pos = if l == path.len() - 1 {
        pos
    } else {
        path[l].idx
    };
    split(store, path, l, pos)
}

/// Move the root's entries into a new block and make the root a single
/// index entry pointing at it.
fn grow<S: ExtentStore>(store: &mut S, path: &mut Path) -> Result<()> {
    let root = &path[0].node;
    if root.depth >= EXTENT_DEPTH_MAX {
        return Err(FsError::Errno(libc::EFBIG));
    }
    let Some(first) = root.ents.first().copied() else {
        return Err(corrupt_root(store, "eh_max", "no room in an empty root"));
    };
    let (ents, depth) = (root.ents.clone(), root.depth);
    let child = init_block(store, first.pblk, &ents, depth)?;
    let kind = index_kind(store.ino(), first.lblk, child, MapOp::Set);
    let root = &mut path[0].node;
    write_node(
        store,
        root,
        vec![Ent::index(first.lblk, child)],
        depth + 1,
        kind,
    )
}

/// Split the node at `level` (whose parent has room), the pending edit being
/// at entry `pos`: a new right sibling takes the entries from the split
/// point, its index entry goes into the parent, then the node is truncated.
fn split<S: ExtentStore>(store: &mut S, path: &mut Path, level: usize, pos: usize) -> Result<()> {
    let node = &path[level].node;
    let n = node.ents.len();
    if n < 2 {
        return Err(corrupt_at(
            store,
            node.loc,
            "eh_max",
            format!("cannot split a node of {n} entries"),
        ));
    }
    // Appends (and edits of the last entry) move only the last entry, so
    // nodes filled in order stay full; anything else splits in the middle.
    let s = if pos + 1 >= n { n - 1 } else { n / 2 };
    let right: Vec<Ent> = node.ents[s..].to_vec();
    let left: Vec<Ent> = node.ents[..s].to_vec();
    let depth = node.depth;
    let goal = node.pblk();
    let sibling = init_block(store, goal, &right, depth)?;
    let pidx = path[level - 1].idx;
    let key = right[0].lblk;
    let kind = index_kind(store.ino(), key, sibling, MapOp::Set);
    apply_edit(
        store,
        path,
        level - 1,
        pidx + 1,
        pidx + 1,
        vec![Ent::index(key, sibling)],
        kind,
    )?;
    write_node(store, &mut path[level].node, left, depth, UpdateKind::Other)
}

/// While the root is an index with one child that fits in the root, move
/// the child's entries into the root and free the child.
fn collapse<S: ExtentStore>(store: &mut S) -> Result<()> {
    for _ in 0..EXTENT_DEPTH_MAX {
        let mut root = read_root(store)?;
        if root.depth == 0 || root.ents.len() != 1 {
            return Ok(());
        }
        let only = root.ents[0];
        let child = read_child(store, Loc::Root, only.pblk, root.depth - 1)?;
        if child.ents.len() > root.max as usize {
            return Ok(());
        }
        let kind = index_kind(store.ino(), only.lblk, only.pblk, MapOp::Clear);
        write_node(store, &mut root, child.ents, child.depth, kind)?;
        store.free_tree_block(only.pblk)?;
    }
    Ok(())
}

fn insert_one<S: ExtentStore>(store: &mut S, new: Ent) -> Result<()> {
    let kind = mapping_kind(store.ino(), &new, MapOp::Set);
    for _ in 0..=RESTRUCTURE_ROUNDS_MAX {
        let mut path = descend(store, new.lblk)?;
        let leaf = &path.last().expect("path has a leaf").node;
        let ents = &leaf.ents;
        let i = ents.partition_point(|e| e.lblk <= new.lblk);
        if (i > 0 && ents[i - 1].end() > u64::from(new.lblk))
            || (i < ents.len() && u64::from(ents[i].lblk) < new.end())
        {
            return Err(corrupt_at(
                store,
                leaf.loc,
                "ee_block",
                format!(
                    "extent {}+{} overlaps an extent the lookup did not find",
                    new.lblk, new.len
                ),
            ));
        }
        let left = i > 0 && mergeable(&ents[i - 1], &new);
        let right = i < ents.len() && mergeable(&new, &ents[i]);
        let (lo, hi, merged) = if left
            && right
            && mergeable(
                &ents[i - 1],
                &Ent {
                    len: new.len + ents[i].len,
                    ..new
                },
            ) {
            let l = ents[i - 1];
            (
                i - 1,
                i + 1,
                Ent {
                    len: l.len + new.len + ents[i].len,
                    ..l
                },
            )
        } else if left {
            let l = ents[i - 1];
            (
                i - 1,
                i,
                Ent {
                    len: l.len + new.len,
                    ..l
                },
            )
        } else if right {
            (
                i,
                i + 1,
                Ent {
                    len: new.len + ents[i].len,
                    ..new
                },
            )
        } else {
            (i, i, new)
        };
        if run_edit(store, &mut path, lo, hi, vec![merged], kind.clone())? {
            return Ok(());
        }
    }
    check_rounds(store, RESTRUCTURE_ROUNDS_MAX + 1)
}

/// State of [`check`]'s walk.
struct Walk {
    summary: TreeSummary,
    seen: HashSet<u64>,
    /// End of the last extent seen, in tree order.
    prev_end: u64,
}

impl Walk {
    /// Check `node`, whose keys must lie in `lo..hi`, and everything below.
    fn node<S: ExtentStore>(&mut self, store: &mut S, node: &Node, lo: u64, hi: u64) -> Result<()> {
        if node.depth == 0 {
            let limit = store.blocks_count().min(EXTENT_PBLK_LIMIT);
            for (i, e) in node.ents.iter().enumerate() {
                if u64::from(e.lblk) < lo.max(self.prev_end) || e.end() > hi {
                    return Err(corrupt_at(
                        store,
                        node.loc,
                        "ee_block",
                        format!(
                            "entry {i} ({}+{}) outside its key range {}..{hi} or overlapping \
                             the extent before (ending at {})",
                            e.lblk, e.len, lo, self.prev_end
                        ),
                    ));
                }
                if e.pblk == 0 || e.pblk + u64::from(e.len) > limit {
                    return Err(corrupt_at(
                        store,
                        node.loc,
                        "ee_start",
                        format!(
                            "entry {i} maps physical blocks {}+{} outside the file system \
                             ({limit} blocks)",
                            e.pblk, e.len
                        ),
                    ));
                }
                self.prev_end = e.end();
                self.summary.extent_count += 1;
                self.summary.mapped_blocks += u64::from(e.len);
            }
            return Ok(());
        }
        if node.ents.is_empty() {
            return Err(corrupt_at(
                store,
                node.loc,
                "eh_entries",
                format!("index node (depth {}) with no entries", node.depth),
            ));
        }
        for (i, e) in node.ents.iter().enumerate() {
            let key = u64::from(e.lblk);
            let next = node.ents.get(i + 1).map_or(hi, |n| u64::from(n.lblk));
            if key < lo || key >= hi {
                return Err(corrupt_at(
                    store,
                    node.loc,
                    "ei_block",
                    format!("entry {i} key {key} outside its key range {lo}..{hi}"),
                ));
            }
            if !self.seen.insert(e.pblk) {
                return Err(corrupt_at(
                    store,
                    node.loc,
                    "ei_leaf",
                    format!("entry {i} points at block {} already in the tree", e.pblk),
                ));
            }
            let child = read_child(store, node.loc, e.pblk, node.depth - 1)?;
            self.summary.tree_blocks.push(e.pblk);
            match child.ents.first() {
                Some(f) if f.lblk != e.lblk => {
                    return Err(corrupt_at(
                        store,
                        node.loc,
                        "ei_block",
                        format!(
                            "entry {i} key {} but its child {} starts at {}",
                            e.lblk, e.pblk, f.lblk
                        ),
                    ));
                }
                Some(_) => {}
                None if child.depth > 0 => {
                    return Err(corrupt_block(
                        store,
                        e.pblk,
                        "eh_entries",
                        format!("index node (depth {}) with no entries", child.depth),
                    ));
                }
                None => self.summary.empty_leaves += 1,
            }
            self.node(store, &child, key, next)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    use ordo_format::extent::set_tail;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Tree blocks are handed out from here up; data blocks in the tests
    /// live far above, so a mix-up shows.
    const TREE_BLOCK_FIRST: u64 = 16;
    const DATA_BLOCK_FIRST: u64 = 1 << 24;

    /// An in-memory inode: the root, the live tree blocks, and a log of
    /// every update.
    struct MemStore {
        block_size: u32,
        blocks_count: u64,
        root: [u8; ROOT_SIZE_BYTES],
        blocks: HashMap<u64, Vec<u8>>,
        next_block: u64,
        free_blocks: Vec<u64>,
        allocated: u64,
        freed: u64,
        fs_seed: u32,
        updates: Vec<UpdateKind>,
        /// Set by `alloc_tree_block`, cleared by `init_tree_block`.
        uninit: HashSet<u64>,
        /// Allocation fails with ENOSPC once `allocated` reaches this.
        alloc_limit: u64,
    }

    impl MemStore {
        fn new(block_size: u32) -> Self {
            MemStore {
                block_size,
                blocks_count: 1 << 40,
                root: empty_root(),
                blocks: HashMap::new(),
                next_block: TREE_BLOCK_FIRST,
                free_blocks: Vec::new(),
                allocated: 0,
                freed: 0,
                fs_seed: 0x5eed_cafe,
                updates: Vec::new(),
                uninit: HashSet::new(),
                alloc_limit: u64::MAX,
            }
        }
        fn live(&self, pblk: u64) {
            assert!(
                self.blocks.contains_key(&pblk) && !self.uninit.contains(&pblk),
                "tree block {pblk} used while not live"
            );
        }
    }

    impl ExtentStore for MemStore {
        fn block_size(&self) -> u32 {
            self.block_size
        }
        fn blocks_count(&self) -> u64 {
            self.blocks_count
        }
        fn ino(&self) -> Ino {
            12
        }
        fn root(&self) -> [u8; ROOT_SIZE_BYTES] {
            self.root
        }
        fn set_root(&mut self, offset: u32, bytes: &[u8], kind: UpdateKind) -> Result<()> {
            let o = offset as usize;
            self.root[o..o + bytes.len()].copy_from_slice(bytes);
            self.updates.push(kind);
            Ok(())
        }
        fn read_tree_block(&mut self, pblk: u64) -> Result<Vec<u8>> {
            match self.blocks.get(&pblk) {
                Some(b) if !self.uninit.contains(&pblk) => Ok(b.clone()),
                _ => Err(FsError::corrupt(pblk, "test block", "not a tree block")),
            }
        }
        fn alloc_tree_block(&mut self, _goal: u64) -> Result<u64> {
            if self.allocated >= self.alloc_limit {
                return Err(FsError::Errno(libc::ENOSPC));
            }
            let p = self.free_blocks.pop().unwrap_or_else(|| {
                self.next_block += 1;
                self.next_block - 1
            });
            assert!(p < DATA_BLOCK_FIRST);
            self.blocks.insert(p, vec![0; self.block_size as usize]);
            self.uninit.insert(p);
            self.allocated += 1;
            Ok(p)
        }
        fn init_tree_block(&mut self, pblk: u64, image: &[u8]) -> Result<()> {
            assert!(self.uninit.remove(&pblk), "init of block {pblk} not fresh");
            assert_eq!(image.len(), self.block_size as usize);
            self.blocks.insert(pblk, image.to_vec());
            self.updates.push(UpdateKind::ExtentBlockInit { ino: 12 });
            Ok(())
        }
        fn modify_tree_block(
            &mut self,
            pblk: u64,
            offset: u32,
            bytes: &[u8],
            kind: UpdateKind,
        ) -> Result<()> {
            self.live(pblk);
            let b = self.blocks.get_mut(&pblk).unwrap();
            let o = offset as usize;
            b[o..o + bytes.len()].copy_from_slice(bytes);
            self.updates.push(kind);
            Ok(())
        }
        fn free_tree_block(&mut self, pblk: u64) -> Result<()> {
            self.live(pblk);
            self.blocks.remove(&pblk);
            self.free_blocks.push(pblk);
            self.freed += 1;
            Ok(())
        }
        fn csum_tree_block(&self, image: &mut [u8]) {
            let _ = set_tail(self.fs_seed, 12, 0, image);
        }
    }

    /// The reference: logical block -> (physical block, unwritten).
    type Model = BTreeMap<u32, (u64, bool)>;

    /// The model as maximal runs (contiguous in both spaces, same state),
    /// cut at `cut` blocks so it compares with a tree's extents.
    fn model_blocks(m: &Model) -> Vec<(u32, u64, bool)> {
        m.iter().map(|(&l, &(p, u))| (l, p, u)).collect()
    }

    fn tree_blocks_of(s: &mut MemStore) -> Vec<(u32, u64, bool)> {
        let mut v = Vec::new();
        for m in extents(s, 0..LBLK_END).unwrap() {
            for i in 0..m.len {
                v.push((m.lblk + i, m.pblk + u64::from(i), m.unwritten));
            }
        }
        v
    }

    /// The tree is valid, holds exactly the model, owns exactly the live
    /// tree blocks, and no two neighbours in a leaf could have merged.
    fn verify(s: &mut MemStore, model: &Model) -> TreeSummary {
        let sum = check(s).unwrap_or_else(|e| panic!("check failed: {e}"));
        assert_eq!(sum.empty_leaves, 0);
        assert_eq!(tree_blocks_of(s), model_blocks(model));
        assert_eq!(sum.mapped_blocks, model.len() as u64);
        let mut live: Vec<u64> = s.blocks.keys().copied().collect();
        let mut tree = sum.tree_blocks.clone();
        live.sort_unstable();
        tree.sort_unstable();
        assert_eq!(
            live, tree,
            "allocated tree blocks versus blocks in the tree"
        );
        assert_eq!(s.allocated - s.freed, tree.len() as u64);
        sum
    }

    /// `(logical block, physical block)` pairs.
    type BlockPairs = Vec<(u32, u64)>;

    /// Mapping updates (`len > 0`) of the last operation, as per-block sets;
    /// a node write's header and entries updates count once.
    fn mapping_updates(s: &mut MemStore) -> (BlockPairs, BlockPairs) {
        let mut set = Vec::new();
        let mut clear = Vec::new();
        let mut prev: Option<UpdateKind> = None;
        for k in s.updates.drain(..) {
            if prev.as_ref() == Some(&k) {
                continue;
            }
            if let UpdateKind::Extent {
                ino,
                lblk,
                pblk,
                len,
                op,
            } = k
            {
                assert_eq!(ino, 12);
                let add = |v: &mut BlockPairs, at: u32| {
                    for i in 0..len {
                        v.push((at + i, pblk + u64::from(i)));
                    }
                };
                match op {
                    MapOp::Set => add(&mut set, lblk),
                    MapOp::Clear => add(&mut clear, lblk),
                }
            }
            prev = Some(k);
        }
        set.sort_unstable();
        clear.sort_unstable();
        (set, clear)
    }

    #[test]
    fn empty_tree() {
        let mut s = MemStore::new(1024);
        assert_eq!(lookup(&mut s, 0).unwrap(), None);
        assert!(extents(&mut s, 0..LBLK_END).unwrap().is_empty());
        assert!(remove_range(&mut s, 0, LBLK_END).unwrap().is_empty());
        mark_written(&mut s, 0, 100).unwrap();
        let sum = check(&mut s).unwrap();
        assert_eq!(sum, TreeSummary::default());
        assert!(s.updates.is_empty(), "no-ops must not write");
    }

    #[test]
    fn lookup_finds_containing_then_next() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 10, 5000, 5, false).unwrap();
        insert(&mut s, 100, 9000, 1, true).unwrap();
        let m = lookup(&mut s, 12).unwrap().unwrap();
        assert_eq!((m.lblk, m.pblk, m.len, m.unwritten), (10, 5000, 5, false));
        assert_eq!(m.pblk_of(12), Some(5002));
        assert_eq!(lookup(&mut s, 0).unwrap().unwrap().lblk, 10);
        let m = lookup(&mut s, 15).unwrap().unwrap();
        assert_eq!((m.lblk, m.unwritten), (100, true));
        assert_eq!(lookup(&mut s, 101).unwrap(), None);
        assert_eq!(
            extents(&mut s, 12..101).unwrap(),
            vec![
                Mapping {
                    lblk: 12,
                    pblk: 5002,
                    len: 3,
                    unwritten: false
                },
                Mapping {
                    lblk: 100,
                    pblk: 9000,
                    len: 1,
                    unwritten: true
                },
            ]
        );
    }

    #[test]
    fn inserts_merge_with_both_neighbours() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 0, 1000, 4, false).unwrap();
        insert(&mut s, 8, 1008, 4, false).unwrap();
        assert_eq!(check(&mut s).unwrap().extent_count, 2);
        insert(&mut s, 4, 1004, 4, false).unwrap();
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].lblk, v[0].pblk, v[0].len), (0, 1000, 12));
        // Reverse order merges to the right.
        insert(&mut s, 30, 2030, 1, false).unwrap();
        insert(&mut s, 29, 2029, 1, false).unwrap();
        insert(&mut s, 28, 2028, 1, false).unwrap();
        assert_eq!(check(&mut s).unwrap().extent_count, 2);
        // Unwritten does not merge with written.
        insert(&mut s, 12, 1012, 1, true).unwrap();
        assert_eq!(check(&mut s).unwrap().extent_count, 3);
        // Physically apart does not merge.
        insert(&mut s, 13, 7777, 1, true).unwrap();
        assert_eq!(check(&mut s).unwrap().extent_count, 4);
    }

    #[test]
    fn long_runs_split_at_the_extent_length_limit() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 0, DATA_BLOCK_FIRST, 40_000, false).unwrap();
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(
            v.iter().map(|m| m.len).collect::<Vec<_>>(),
            vec![32768, 7232]
        );
        insert(&mut s, 50_000, DATA_BLOCK_FIRST + 50_000, 32768, true).unwrap();
        let v = extents(&mut s, 50_000..LBLK_END).unwrap();
        assert_eq!(v.iter().map(|m| m.len).collect::<Vec<_>>(), vec![32767, 1]);
        // Converting the whole unwritten run merges it into one written extent.
        mark_written(&mut s, 50_000, 32768).unwrap();
        let v = extents(&mut s, 50_000..LBLK_END).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].len, v[0].unwritten), (32768, false));
        // The very last logical block can be mapped; one past it cannot.
        insert(&mut s, u32::MAX, DATA_BLOCK_FIRST + (1 << 20), 1, false).unwrap();
        assert!(matches!(
            insert(&mut s, u32::MAX - 1, DATA_BLOCK_FIRST, 2, false),
            Err(FsError::Invalid(_))
        ));
        check(&mut s).unwrap();
    }

    #[test]
    fn insert_over_mapped_blocks_is_refused() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 10, 5000, 10, false).unwrap();
        for (l, n) in [(5, 6), (19, 1), (12, 2), (0, 100)] {
            assert!(matches!(
                insert(&mut s, l, 9000, n, false),
                Err(FsError::Invalid(_))
            ));
        }
        assert!(matches!(
            insert(&mut s, 0, 0, 1, false),
            Err(FsError::Invalid(_))
        ));
        assert!(matches!(
            insert(&mut s, 0, (1 << 40) - 1, 2, false),
            Err(FsError::Invalid(_))
        ));
        assert_eq!(check(&mut s).unwrap().extent_count, 1);
    }

    #[test]
    fn remove_cuts_edges_and_reports_what_it_freed() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 0, 1000, 10, false).unwrap();
        insert(&mut s, 20, 3000, 10, true).unwrap();
        let freed = remove_range(&mut s, 5, 20).unwrap();
        assert_eq!(freed, vec![(1005, 5), (3000, 5)]);
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(
            v.iter()
                .map(|m| (m.lblk, m.pblk, m.len))
                .collect::<Vec<_>>(),
            vec![(0, 1000, 5), (25, 3005, 5)]
        );
        // A hole punched in the middle leaves two extents.
        let freed = remove_range(&mut s, 1, 2).unwrap();
        assert_eq!(freed, vec![(1001, 2)]);
        assert_eq!(check(&mut s).unwrap().extent_count, 3);
        // Truncate everything.
        remove_range(&mut s, 0, LBLK_END).unwrap();
        assert_eq!(check(&mut s).unwrap(), TreeSummary::default());
    }

    #[test]
    fn mark_written_splits_in_three_and_merges() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 0, 1000, 10, false).unwrap();
        insert(&mut s, 10, 1010, 10, true).unwrap();
        mark_written(&mut s, 14, 2).unwrap();
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(
            v.iter()
                .map(|m| (m.lblk, m.len, m.unwritten))
                .collect::<Vec<_>>(),
            vec![(0, 10, false), (10, 4, true), (14, 2, false), (16, 4, true)]
        );
        // The head of the unwritten run joins the written extent before it.
        mark_written(&mut s, 10, 4).unwrap();
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(
            v.iter()
                .map(|m| (m.lblk, m.len, m.unwritten))
                .collect::<Vec<_>>(),
            vec![(0, 16, false), (16, 4, true)]
        );
        mark_written(&mut s, 0, 100).unwrap();
        let v = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].len, v[0].unwritten), (20, false));
    }

    #[test]
    fn ordered_appends_fill_leaves() {
        let mut s = MemStore::new(1024);
        let mut model = Model::new();
        for i in 0..1000u32 {
            let p = DATA_BLOCK_FIRST + u64::from(i) * 2;
            insert(&mut s, i, p, 1, false).unwrap();
            model.insert(i, (p, false));
        }
        let sum = verify(&mut s, &model);
        assert_eq!(sum.depth, 2);
        // 1000 extents in leaves of 83 or 84: 13 leaves and one index block.
        assert!(
            sum.tree_blocks.len() <= 14,
            "{} blocks",
            sum.tree_blocks.len()
        );
        // Removing everything frees every tree block.
        let freed = remove_range(&mut s, 0, LBLK_END).unwrap();
        assert_eq!(freed.len(), 1000);
        let sum = verify(&mut s, &Model::new());
        assert_eq!(sum.depth, 0);
        assert_eq!(s.allocated, s.freed);
    }

    #[test]
    fn depth_limit_is_efbig_and_leaves_the_tree_intact() {
        // 64-byte nodes hold 4 entries: depth 5 holds at most 4 * 4^5.
        let mut s = MemStore::new(64);
        let mut model = Model::new();
        let mut n = 0u32;
        let err = loop {
            let p = DATA_BLOCK_FIRST + u64::from(n) * 2;
            match insert(&mut s, n * 2, p, 1, false) {
                Ok(()) => {
                    model.insert(n * 2, (p, false));
                    n += 1;
                }
                Err(e) => break e,
            }
            assert!(n <= 4 * 4u32.pow(5), "tree deeper than ext4 allows");
        };
        assert_eq!(err.errno(), libc::EFBIG);
        let sum = verify(&mut s, &model);
        assert_eq!(sum.depth, EXTENT_DEPTH_MAX);
        // Removing every other extent leaves the tree valid and shrinking.
        for i in (0..n).step_by(2) {
            remove_range(&mut s, i * 2, 1).unwrap();
            model.remove(&(i * 2));
        }
        verify(&mut s, &model);
        remove_range(&mut s, 0, LBLK_END).unwrap();
        let sum = verify(&mut s, &Model::new());
        assert_eq!(sum.depth, 0);
    }

    /// One random operation against the tree and the model; checks the
    /// mapping updates it reported against the model's change.
    fn random_op(rng: &mut ChaCha8Rng, s: &mut MemStore, model: &mut Model, span: u32) {
        let lblk = rng.gen_range(0..span);
        let len = if rng.gen_bool(0.8) {
            rng.gen_range(1..4u32)
        } else {
            rng.gen_range(1..64u32)
        };
        s.updates.clear();
        if rng.gen_range(0..12) == 0 {
            return random_shift(rng, s, model, span);
        }
        match rng.gen_range(0..10) {
            0..=5 => {
                // Insert into the hole at lblk (trimmed to it), physically
                // after the left neighbour half of the time so merges happen.
                if model.contains_key(&lblk) {
                    return;
                }
                let hole_end = model.range(lblk..).next().map_or(span, |(&l, _)| l);
                let len = len.min(hole_end - lblk);
                let unwritten = rng.gen_bool(0.3);
                let pblk = match model.range(..lblk).next_back() {
                    Some((&l, &(p, _))) if rng.gen_bool(0.5) => p + u64::from(lblk - l),
                    _ => DATA_BLOCK_FIRST + rng.gen_range(0..1u64 << 30),
                };
                insert(s, lblk, pblk, len, unwritten).unwrap();
                let mut want = Vec::new();
                for i in 0..len {
                    model.insert(lblk + i, (pblk + u64::from(i), unwritten));
                    want.push((lblk + i, pblk + u64::from(i)));
                }
                let (set, clear) = mapping_updates(s);
                assert_eq!(set, want, "insert {lblk}+{len} reported sets");
                assert!(clear.is_empty());
            }
            6..=8 => {
                let freed = remove_range(s, lblk, u64::from(len)).unwrap();
                let mut want = Vec::new();
                let gone: Vec<u32> = model.range(lblk..lblk + len).map(|(&l, _)| l).collect();
                for l in gone {
                    let (p, _) = model.remove(&l).unwrap();
                    want.push((l, p));
                }
                let mut got: Vec<u64> = freed
                    .iter()
                    .flat_map(|&(p, n)| (0..u64::from(n)).map(move |i| p + i))
                    .collect();
                got.sort_unstable();
                let mut want_p: Vec<u64> = want.iter().map(|&(_, p)| p).collect();
                want_p.sort_unstable();
                assert_eq!(got, want_p, "remove {lblk}+{len} freed");
                let (set, clear) = mapping_updates(s);
                assert_eq!(clear, want, "remove {lblk}+{len} reported clears");
                assert!(set.is_empty());
            }
            _ => {
                mark_written(s, lblk, u64::from(len)).unwrap();
                let mut want = Vec::new();
                for (&l, v) in model.range_mut(lblk..lblk + len) {
                    if v.1 {
                        v.1 = false;
                        want.push((l, v.0));
                    }
                }
                let (set, clear) = mapping_updates(s);
                assert_eq!(set, want, "mark_written {lblk}+{len} reported sets");
                assert!(clear.is_empty());
            }
        }
    }

    /// COLLAPSE_RANGE or INSERT_RANGE at a random block, against the
    /// model: one switch of the root names a tree built in fresh blocks,
    /// and the old tree's blocks and the collapsed data are dropped.
    fn random_shift(rng: &mut ChaCha8Rng, s: &mut MemStore, model: &mut Model, span: u32) {
        let at = rng.gen_range(0..span);
        let by = if rng.gen_bool(0.7) {
            rng.gen_range(1..4u32)
        } else {
            rng.gen_range(1..200u32)
        };
        let last = model.keys().next_back().map_or(0, |&l| l + 1);
        let old_tree: Vec<u64> = check(s).unwrap().tree_blocks;
        let mut want_freed: Vec<u64> = Vec::new();
        if last + by > 2 * span || rng.gen_bool(0.5) {
            let freed = shift_range(s, at, by, Shift::Left).unwrap();
            let mut got: Vec<u64> = freed
                .iter()
                .flat_map(|&(p, n)| (0..u64::from(n)).map(move |i| p + i))
                .collect();
            got.sort_unstable();
            for l in at..at + by {
                if let Some((p, _)) = model.remove(&l) {
                    want_freed.push(p);
                }
            }
            want_freed.sort_unstable();
            assert_eq!(got, want_freed, "collapse {at}+{by} freed");
            let rest: Vec<(u32, (u64, bool))> = model.split_off(&(at + by)).into_iter().collect();
            for (l, v) in rest {
                model.insert(l - by, v);
            }
        } else {
            assert!(shift_range(s, at, by, Shift::Right).unwrap().is_empty());
            let rest: Vec<(u32, (u64, bool))> = model.split_off(&at).into_iter().collect();
            for (l, v) in rest {
                model.insert(l + by, v);
            }
        }
        let new_tree: Vec<u64> = check(s).unwrap().tree_blocks;
        let updates: Vec<UpdateKind> = s.updates.drain(..).collect();
        let inits = updates
            .iter()
            .filter(|k| matches!(k, UpdateKind::ExtentBlockInit { .. }))
            .count();
        assert_eq!(inits, new_tree.len(), "one init per new tree block");
        let switches: Vec<&UpdateKind> = updates
            .iter()
            .filter(|k| matches!(k, UpdateKind::ExtentTree { .. }))
            .collect();
        assert_eq!(switches.len(), 1, "one switch: {updates:?}");
        assert_eq!(updates.len(), inits + 1, "nothing else: {updates:?}");
        let UpdateKind::ExtentTree {
            ino,
            named,
            dropped,
        } = switches[0]
        else {
            unreachable!()
        };
        assert_eq!(*ino, 12);
        let blocks = |runs: &[(u64, u64)]| -> Vec<u64> {
            let mut v: Vec<u64> = runs.iter().flat_map(|&(a, b)| a..b).collect();
            v.sort_unstable();
            v
        };
        let mut want_named: Vec<u64> = model.values().map(|&(p, _)| p).collect();
        want_named.extend(&new_tree);
        want_named.sort_unstable();
        assert_eq!(
            blocks(named),
            want_named,
            "named: the new tree and its data"
        );
        let mut want_dropped = want_freed;
        want_dropped.extend(&old_tree);
        want_dropped.sort_unstable();
        assert_eq!(
            blocks(dropped),
            want_dropped,
            "dropped: old tree, collapsed data"
        );
    }

    #[test]
    fn shifts_refuse_overflow_and_merge() {
        let mut s = MemStore::new(1024);
        insert(&mut s, 10, DATA_BLOCK_FIRST, 5, false).unwrap();
        insert(&mut s, 30, DATA_BLOCK_FIRST + 5, 3, false).unwrap();
        let before = s.root;
        // Past the last logical block, either way: nothing changes.
        assert!(matches!(
            shift_range(&mut s, 20, u32::MAX - 20, Shift::Right),
            Err(FsError::Invalid(_))
        ));
        assert!(matches!(
            shift_range(&mut s, u32::MAX - 5, 10, Shift::Left),
            Err(FsError::Invalid(_))
        ));
        assert_eq!(s.root, before);
        // A collapse that makes two extents contiguous merges them.
        shift_range(&mut s, 15, 15, Shift::Left).unwrap();
        let m = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].lblk, m[0].len), (10, 8));
        // An insert splits the extent it crosses.
        assert!(shift_range(&mut s, 12, 0, Shift::Right).unwrap().is_empty());
        shift_range(&mut s, 12, 4, Shift::Right).unwrap();
        let m = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(
            (m[1].lblk, m[1].pblk, m[1].len),
            (16, DATA_BLOCK_FIRST + 2, 6)
        );
        // Back: the pieces merge again.
        assert!(shift_range(&mut s, 12, 4, Shift::Left).unwrap().is_empty());
        let m = extents(&mut s, 0..LBLK_END).unwrap();
        assert_eq!(m.len(), 1, "{m:?}");
        check(&mut s).unwrap();
    }

    #[test]
    fn a_shift_without_room_for_the_new_tree_keeps_the_old_one() {
        let (mut s, model) = deep_store();
        let root = s.root;
        s.alloc_limit = s.allocated + 1;
        let err = shift_range(&mut s, 5, 1, Shift::Left).unwrap_err();
        assert!(matches!(err, FsError::Errno(libc::ENOSPC)), "{err}");
        assert_eq!(s.root, root, "the root still names the old tree");
        assert_eq!(tree_blocks_of(&mut s), model_blocks(&model));
        check(&mut s).unwrap();
    }

    fn random_sequence(seed: u64, block_size: u32, ops: usize, span: u32) -> u16 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut s = MemStore::new(block_size);
        let mut model = Model::new();
        let mut depth_max = 0;
        for op in 0..ops {
            random_op(&mut rng, &mut s, &mut model, span);
            let sum = verify(&mut s, &model);
            depth_max = depth_max.max(sum.depth);
            if op % 97 == 0 {
                let l = rng.gen_range(0..span);
                let want = model.range(l..).next().map(|(&ml, &(p, _))| (ml.max(l), p));
                let got = lookup(&mut s, l).unwrap().map(|m| {
                    let at = m.lblk.max(l);
                    (at, m.pblk + u64::from(at - m.lblk))
                });
                assert_eq!(got, want, "seed {seed} op {op} lookup {l}");
            }
        }
        remove_range(&mut s, 0, LBLK_END).unwrap();
        let sum = verify(&mut s, &Model::new());
        assert_eq!(sum.depth, 0);
        assert_eq!(s.allocated, s.freed, "seed {seed}: tree blocks leaked");
        depth_max
    }

    #[test]
    fn random_sequences_match_the_model_in_tiny_nodes() {
        // 4 entries per node: splits, growth to depth 4 and 5, collapse.
        // ORDO_EXTENT_SEEDS=n runs n seeds instead of 4 (a longer soak).
        let seeds: u64 = std::env::var("ORDO_EXTENT_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(4);
        let mut deepest = 0;
        for seed in 0..seeds {
            eprintln!("extent random sequence seed {seed}");
            deepest = deepest.max(random_sequence(seed, 64, 3_000, 1500));
            deepest = deepest.max(random_sequence(seed + (1 << 32), 128, 1_000, 3000));
        }
        assert!(deepest >= 4, "reached depth {deepest}");
    }

    #[test]
    fn random_sequences_match_the_model_in_small_nodes() {
        let depth = random_sequence(100, 128, 6_000, 6000);
        assert!(depth >= 2, "reached depth {depth}");
    }

    #[test]
    fn random_sequence_matches_the_model_in_1k_blocks() {
        let depth = random_sequence(7, 1024, 12_000, 40_000);
        assert!(depth >= 2, "reached depth {depth}");
    }

    #[test]
    fn many_tiny_extents_reach_depth_3_in_1k_blocks() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut s = MemStore::new(1024);
        let mut model = Model::new();
        let n: u32 = 30_000;
        let mut order: Vec<u32> = (0..n).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for (k, &i) in order.iter().enumerate() {
            let p = DATA_BLOCK_FIRST + u64::from(i) * 3;
            insert(&mut s, i * 2, p, 1, i % 5 == 0).unwrap();
            model.insert(i * 2, (p, i % 5 == 0));
            if k % 5000 == 4999 {
                verify(&mut s, &model);
            }
        }
        let sum = verify(&mut s, &model);
        assert_eq!(sum.depth, 3);
        for (k, &i) in order.iter().enumerate() {
            if k % 2 == 0 {
                remove_range(&mut s, i * 2, 1).unwrap();
                model.remove(&(i * 2));
            }
            if k % 5000 == 4999 {
                verify(&mut s, &model);
            }
        }
        remove_range(&mut s, 0, LBLK_END).unwrap();
        verify(&mut s, &Model::new());
        assert_eq!(s.allocated, s.freed);
    }

    #[test]
    fn updates_carry_their_meaning() {
        let mut s = MemStore::new(64);
        for i in 0..5u32 {
            insert(&mut s, i * 2, DATA_BLOCK_FIRST + u64::from(i) * 2, 1, false).unwrap();
        }
        // The fifth insert grew the root: a new block, then an index set in
        // the root, then the mapping itself.
        let init = s
            .updates
            .iter()
            .position(|k| matches!(k, UpdateKind::ExtentBlockInit { .. }))
            .unwrap();
        let index_set = s
            .updates
            .iter()
            .position(|k| {
                matches!(
                    k,
                    UpdateKind::Extent {
                        len: 0,
                        op: MapOp::Set,
                        ..
                    }
                )
            })
            .unwrap();
        let mapping_set = s
            .updates
            .iter()
            .position(|k| {
                matches!(
                    k,
                    UpdateKind::Extent {
                        lblk: 8,
                        len: 1,
                        op: MapOp::Set,
                        ..
                    }
                )
            })
            .unwrap();
        assert!(init < index_set && index_set < mapping_set);
        assert!(s.updates.contains(&UpdateKind::Checksum));
        // Removing everything clears the index pointers before freeing.
        s.updates.clear();
        remove_range(&mut s, 0, LBLK_END).unwrap();
        assert!(s.updates.iter().any(|k| matches!(
            k,
            UpdateKind::Extent {
                len: 0,
                op: MapOp::Clear,
                ..
            }
        )));
        assert_eq!(s.allocated, s.freed);
    }

    /// Build a depth-2 tree of 1 KiB blocks to corrupt.
    fn deep_store() -> (MemStore, Model) {
        let mut s = MemStore::new(1024);
        let mut model = Model::new();
        for i in 0..600u32 {
            let p = DATA_BLOCK_FIRST + u64::from(i) * 2;
            insert(&mut s, i * 2, p, 1, false).unwrap();
            model.insert(i * 2, (p, false));
        }
        assert_eq!(verify(&mut s, &model).depth, 2);
        (s, model)
    }

    /// Every operation on the store, none may panic.
    fn exercise(s: &mut MemStore) -> Vec<Result<()>> {
        vec![
            check(s).map(|_| ()),
            lookup(s, 333).map(|_| ()),
            extents(s, 0..LBLK_END).map(|_| ()),
            insert(s, 5001, DATA_BLOCK_FIRST - 10, 3, false),
            mark_written(s, 0, 2000),
            remove_range(s, 100, 50).map(|_| ()),
            check(s).map(|_| ()),
        ]
    }

    #[test]
    fn corrupt_trees_are_errors_not_panics() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (clean, _) = deep_store();
        let tree: Vec<u64> = check(&mut MemStore {
            ..clone_store(&clean)
        })
        .unwrap()
        .tree_blocks;
        let mut detected = 0;
        for round in 0..600 {
            let mut s = clone_store(&clean);
            let resum = round % 2 == 0;
            let target = rng.gen_range(0..=tree.len());
            let flips = rng.gen_range(1..4);
            for _ in 0..flips {
                if target == tree.len() {
                    let o = rng.gen_range(0..ROOT_SIZE_BYTES);
                    s.root[o] ^= 1 << rng.gen_range(0..8);
                } else {
                    let b = s.blocks.get_mut(&tree[target]).unwrap();
                    let o = rng.gen_range(0..tail_offset(84));
                    b[o] ^= 1 << rng.gen_range(0..8);
                }
            }
            if resum && target < tree.len() {
                // Valid checksum over bad content: the structure checks
                // must catch it.
                let mut b = s.blocks[&tree[target]].clone();
                s.csum_tree_block(&mut b);
                s.blocks.insert(tree[target], b);
            }
            let first = check(&mut s);
            if let Err(e) = &first {
                assert!(matches!(e, FsError::Corrupt { .. }), "{e}");
                detected += 1;
            }
            for r in exercise(&mut s) {
                if let Err(e) = r {
                    assert!(
                        matches!(e, FsError::Corrupt { .. } | FsError::Invalid(_)),
                        "{e}"
                    );
                }
            }
        }
        assert!(detected > 300, "only {detected} corruptions detected");
    }

    #[test]
    fn named_corruptions_are_reported_with_block_and_field() {
        let (clean, _) = deep_store();
        let tree = check(&mut clone_store(&clean)).unwrap().tree_blocks;
        let leaf = tree[2];
        let field_of = |f: &dyn Fn(&mut MemStore)| -> (u64, String) {
            let mut s = clone_store(&clean);
            f(&mut s);
            match check(&mut s) {
                Err(FsError::Corrupt { block, field, .. }) => (block, field),
                other => panic!("expected corruption, got {other:?}"),
            }
        };
        let resum = |s: &mut MemStore, p: u64| {
            let mut b = s.blocks[&p].clone();
            s.csum_tree_block(&mut b);
            s.blocks.insert(p, b);
        };
        // Bad checksum.
        let (b, f) = field_of(&|s| s.blocks.get_mut(&leaf).unwrap()[20] ^= 1);
        assert_eq!(b, leaf);
        assert!(f.contains("et_checksum"), "{f}");
        // Bad magic.
        let (b, f) = field_of(&|s| {
            s.blocks.get_mut(&leaf).unwrap()[0] = 0;
            resum(s, leaf);
        });
        assert_eq!(b, leaf);
        assert!(f.contains("eh_magic"), "{f}");
        // Wrong depth in a child.
        let (b, f) = field_of(&|s| {
            s.blocks.get_mut(&leaf).unwrap()[6] = 1;
            resum(s, leaf);
        });
        assert_eq!(b, leaf);
        assert!(f.contains("eh_depth") || f.contains("ei_leaf"), "{f}");
        // First extent of a leaf moved below its index key.
        let (b, f) = field_of(&|s| {
            let blk = s.blocks.get_mut(&leaf).unwrap();
            let k = u32::from_le_bytes(blk[12..16].try_into().unwrap());
            blk[12..16].copy_from_slice(&(k - 1).to_le_bytes());
            resum(s, leaf);
        });
        assert_eq!(b, tree[0]);
        assert!(f.contains("ei_block"), "{f}");
        // A child pointer outside the file system.
        let top = tree[0];
        let (b, f) = field_of(&|s| s.blocks_count = top);
        assert_eq!(b, 0);
        assert!(f.contains("i_block") && f.contains("ei_leaf"), "{f}");
        // The root's magic.
        let (_, f) = field_of(&|s| s.root[1] = 0);
        assert!(
            f.contains("inode 12 i_block") && f.contains("eh_magic"),
            "{f}"
        );
        // An extent pointing past the end of the file system.
        let (b, f) = field_of(&|s| s.blocks_count = DATA_BLOCK_FIRST + 10);
        assert_eq!(b, tree[1], "the first leaf");
        assert!(f.contains("ee_start"), "{f}");
        // Two index entries naming the same child.
        let (_, f) = field_of(&|s| {
            let idx = tree[0];
            let blk = s.blocks.get_mut(&idx).unwrap();
            let first: [u8; 6] = blk[16..22].try_into().unwrap();
            blk[28..34].copy_from_slice(&first);
            resum(s, idx);
        });
        assert!(f.contains("ei_leaf") || f.contains("ei_block"), "{f}");
    }

    fn clone_store(s: &MemStore) -> MemStore {
        MemStore {
            block_size: s.block_size,
            blocks_count: s.blocks_count,
            root: s.root,
            blocks: s.blocks.clone(),
            next_block: s.next_block,
            free_blocks: s.free_blocks.clone(),
            allocated: s.allocated,
            freed: s.freed,
            fs_seed: s.fs_seed,
            updates: Vec::new(),
            uninit: s.uninit.clone(),
            alloc_limit: s.alloc_limit,
        }
    }

    /// Every operation, with tree-block allocation failing at each possible
    /// point: an insert or a removal either happens whole or not at all,
    /// and the tree stays valid with no tree block leaked.
    #[test]
    fn enospc_at_any_allocation_leaves_a_valid_tree() {
        let mut base = MemStore::new(64);
        let mut model = Model::new();
        for i in 0..40u32 {
            let p = DATA_BLOCK_FIRST + u64::from(i) * 100;
            insert(&mut base, i * 100, p, 50, i % 3 == 0).unwrap();
            for k in 0..50 {
                model.insert(i * 100 + k, (p + u64::from(k), i % 3 == 0));
            }
        }
        // Fill the leaf holding 1200 so that the edits below need a split.
        for (l, p) in [
            (1250u32, DATA_BLOCK_FIRST + 7_000_000),
            (1280, DATA_BLOCK_FIRST + 8_000_000),
        ] {
            if base_leaf_len(&mut base, 1200) < 4 {
                insert(&mut base, l, p, 5, false).unwrap();
                for k in 0..5 {
                    model.insert(l + k, (p + u64::from(k), false));
                }
            }
        }
        assert_eq!(base_leaf_len(&mut base, 1200), 4);
        verify(&mut base, &model);
        let mut failures = [0; 4];
        for (op, failed) in failures.iter_mut().enumerate() {
            for extra in 0..8 {
                let mut s = clone_store(&base);
                s.alloc_limit = s.allocated + extra;
                let mut m = model.clone();
                let r = match op {
                    // A run of several chunks into a full region.
                    0 => {
                        let p = DATA_BLOCK_FIRST + (1 << 22);
                        let r = insert(&mut s, 1_000_000, p, 70_000, false);
                        if r.is_ok() {
                            for k in 0..70_000 {
                                m.insert(1_000_000 + k, (p + u64::from(k), false));
                            }
                        }
                        r
                    }
                    // A hole punched inside one extent needs an entry more.
                    1 => {
                        let r = remove_range(&mut s, 1210, 5).map(|_| ());
                        if r.is_ok() {
                            m.retain(|&l, _| !(1210..1215).contains(&l));
                        }
                        r
                    }
                    // One block in an extent's middle into the tree's gaps.
                    2 => {
                        let p = DATA_BLOCK_FIRST + (1 << 23);
                        let r = insert(&mut s, 1260, p, 1, false);
                        if r.is_ok() {
                            m.insert(1260, (p, false));
                        }
                        r
                    }
                    // Converting the middle of an unwritten extent.
                    _ => {
                        let r = mark_written(&mut s, 1210, 3);
                        if r.is_ok() {
                            for (_, v) in m.range_mut(1210..1213) {
                                v.1 = false;
                            }
                        }
                        r
                    }
                };
                if let Err(e) = r {
                    assert_eq!(e.errno(), libc::ENOSPC, "op {op} extra {extra}: {e}");
                    *failed += 1;
                }
                verify(&mut s, &m);
            }
        }
        assert!(
            failures.iter().all(|&f| f > 0),
            "allocation failures per operation: {failures:?}"
        );
    }

    /// Entries in the leaf that `lblk` descends to.
    fn base_leaf_len(s: &mut MemStore, lblk: u32) -> usize {
        descend(s, lblk).unwrap().last().unwrap().node.ents.len()
    }
}
