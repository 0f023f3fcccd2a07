//! Ganger and Patt's three ordering rules as a graph over updates.
//!
//! Given a sequence of metadata updates in program order, [`build_graph`]
//! returns, for each update, the updates that must be durable before it
//! (the edges are listed and justified in the `sync` protocol's header:
//! initialization before pointer, nullification before reuse, new pointer
//! before the old one is reset, plus the ext4-specific ones for `i_blocks`,
//! `i_size`, extent-index keys and the unused-inode mark). Updates of one
//! block that overlap keep their program order.
//!
//! `sync` builds the graph over one handle's updates and writes them
//! synchronously in a topological order; `softdep` builds it over every
//! update not yet durable, across handles, and rolls back, in each image it
//! writes, the updates whose predecessors are not durable yet.

// Keys here are block, inode and byte numbers the file system chose, so
// the fast non-keyed hash is safe; `build_graph` hashes every byte an update
// covers, which SipHash made most of a soft-updates plan's time.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::update::{BitmapKind, CounterKind, Ino, InodeField, LinkOp, MapOp, Update, UpdateKind};

/// The little-endian value of a field's bytes (up to eight).
pub(crate) fn le_of(b: &[u8]) -> u64 {
    b.iter()
        .take(8)
        .rev()
        .fold(0u64, |acc, &x| (acc << 8) | x as u64)
}

/// Whether an update of `ino`'s `field` raised (`Some(true)`) or lowered
/// (`Some(false)`) its value.
pub(crate) fn inode_field_moved(u: &Update, field: InodeField) -> Option<(Ino, bool)> {
    match u.kind {
        UpdateKind::Inode { ino, field: f } if f == field => {
            let (old, new) = (le_of(&u.old), le_of(&u.new));
            (old != new).then_some((ino, new > old))
        }
        _ => None,
    }
}

pub(crate) fn u16_of(b: &[u8]) -> u16 {
    if b.len() >= 2 {
        u16::from_le_bytes([b[0], b[1]])
    } else {
        0
    }
}

/// The write-ordering graph of a sequence of updates.
pub(crate) struct Graph {
    /// Predecessors of each update.
    pub(crate) preds: Vec<Vec<usize>>,
}

pub(crate) fn build_graph<U: std::borrow::Borrow<Update>>(
    ups: &[U],
    tree_blocks: &HashSet<u64>,
) -> Graph {
    let ups: Vec<&Update> = ups.iter().map(|u| u.borrow()).collect();
    let n = ups.len();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    // Indexes of the "producers" by what they make valid.
    let mut block_ready: HashMap<u64, Vec<usize>> = HashMap::default(); // init or bitmap-set of a block
    let mut inode_ready: HashMap<u32, Vec<usize>> = HashMap::default(); // init, links up, bitmap-set
    let mut adds: HashMap<u32, Vec<usize>> = HashMap::default();
    // Raised link counts, by inode.
    let mut links_up: HashMap<u32, Vec<usize>> = HashMap::default();
    // Entries added inside each directory (a moved directory's new `..`).
    let mut adds_in: HashMap<u32, Vec<usize>> = HashMap::default();
    let mut removes: HashMap<u32, Vec<usize>> = HashMap::default();
    // Entries removed from each directory.
    let mut removes_in: HashMap<u32, Vec<usize>> = HashMap::default();
    let mut clears: Vec<(u64, u64, usize)> = Vec::new(); // extent clears: [start, end)
                                                         // Mappings set, by inode: [start, end) of physical blocks.
    let mut map_sets: HashMap<Ino, Vec<(u64, u64, usize)>> = HashMap::default();

    // Raised i_blocks and i_size, and cleared mappings, by inode.
    let mut count_up: HashMap<Ino, Vec<usize>> = HashMap::default();
    let mut size_up: HashMap<Ino, Vec<usize>> = HashMap::default();
    let mut map_clears: HashMap<Ino, Vec<usize>> = HashMap::default();
    // Index entries set (added or re-keyed), by (inode, child block), with
    // their keys; tree blocks initialized in this handle.
    let mut index_keys: HashMap<(Ino, u64), Vec<(usize, u32)>> = HashMap::default();
    let mut inited: HashSet<u64> = HashSet::default();
    // Mapping updates (not index entries) by (inode, tree block).
    let mut maps_in: HashMap<(Ino, u64), Vec<usize>> = HashMap::default();
    // Tree switches (COLLAPSE_RANGE, INSERT_RANGE), by inode.
    let mut switches: HashMap<Ino, Vec<usize>> = HashMap::default();
    for (i, u) in ups.iter().enumerate() {
        match u.kind {
            UpdateKind::Extent {
                ino,
                lblk,
                pblk,
                len: 0,
                op: MapOp::Set,
            } => index_keys.entry((ino, pblk)).or_default().push((i, lblk)),
            UpdateKind::Extent {
                ino, len, op, pblk, ..
            } if len > 0 => {
                maps_in.entry((ino, u.block)).or_default().push(i);
                if op.sets() {
                    map_sets
                        .entry(ino)
                        .or_default()
                        .push((pblk, pblk + u64::from(len), i));
                }
            }
            UpdateKind::ExtentBlockInit { .. } => {
                inited.insert(u.block);
            }
            UpdateKind::ExtentTree { ino, .. } => switches.entry(ino).or_default().push(i),
            _ => {}
        }
    }
    // Index entries whose key rose because their child's leading mappings
    // were cleared earlier in the handle.
    let mut raised_keys: HashSet<usize> = HashSet::default();
    for (&(ino, child), v) in &index_keys {
        if inited.contains(&child) {
            continue;
        }
        let Some(maps) = maps_in.get(&(ino, child)) else {
            continue;
        };
        // A key set again (across the handles `softdep` holds) rose only
        // if it is above the key set before it, and only because of what
        // changed in the child since then.
        for (n, &(x, key)) in v.iter().enumerate() {
            let prev = n.checked_sub(1).map(|m| v[m]);
            if prev.is_some_and(|(_, k)| key < k) {
                continue;
            }
            let since = prev.map_or(0, |(p, _)| p + 1);
            if maps.iter().any(|&j| {
                since <= j
                    && j < x
                    && matches!(ups[j].kind, UpdateKind::Extent {
                            lblk,
                            op: MapOp::Clear,
                            ..
                        } if lblk < key)
            }) {
                raised_keys.insert(x);
            }
        }
    }
    for (i, u) in ups.iter().enumerate() {
        if let Some((ino, true)) = inode_field_moved(u, InodeField::BlockCount) {
            count_up.entry(ino).or_default().push(i);
        }
        if let Some((ino, true)) = inode_field_moved(u, InodeField::Size) {
            size_up.entry(ino).or_default().push(i);
        }
        if let Some((ino, ..)) = u.kind.pointers().find(|p| p.3.clears()) {
            map_clears.entry(ino).or_default().push(i);
        }
        match &u.kind {
            UpdateKind::DirBlockInit { .. }
            | UpdateKind::ExtentBlockInit { .. }
            | UpdateKind::XattrBlockInit { .. } => block_ready.entry(u.block).or_default().push(i),
            // A shared attribute block counts a new user before it is
            // pointed at.
            UpdateKind::XattrRefcount { block, delta } if *delta > 0 => {
                block_ready.entry(*block).or_default().push(i)
            }
            // A new inode's inherited ACLs are part of its initialization.
            UpdateKind::Xattr { ino } => inode_ready.entry(*ino).or_default().push(i),
            UpdateKind::XattrRef { ino, from, to } => {
                if *to != 0 {
                    inode_ready.entry(*ino).or_default().push(i);
                }
                if *from != 0 {
                    clears.push((*from, *from + 1, i));
                }
            }
            UpdateKind::Bitmap {
                what: BitmapKind::Block,
                index,
                set: true,
            } => block_ready.entry(*index).or_default().push(i),
            UpdateKind::Bitmap {
                what: BitmapKind::Inode,
                index,
                set: true,
            } => inode_ready.entry(*index as u32).or_default().push(i),
            UpdateKind::Inode {
                ino,
                field: InodeField::Whole,
            } if u.new.iter().any(|&b| b != 0) => inode_ready.entry(*ino).or_default().push(i),
            UpdateKind::Inode {
                ino,
                field: InodeField::Links,
            } if u16_of(&u.new) > u16_of(&u.old) => {
                inode_ready.entry(*ino).or_default().push(i);
                links_up.entry(*ino).or_default().push(i);
            }
            UpdateKind::Dirent {
                dir,
                ino,
                op: LinkOp::Add,
                ..
            } => {
                adds.entry(*ino).or_default().push(i);
                adds_in.entry(*dir).or_default().push(i);
            }
            UpdateKind::Dirent {
                dir,
                ino,
                op: LinkOp::Remove,
                ..
            } => {
                removes.entry(*ino).or_default().push(i);
                removes_in.entry(*dir).or_default().push(i);
            }
            UpdateKind::Extent {
                pblk,
                len,
                op: MapOp::Clear,
                ..
            } => clears.push((*pblk, *pblk + (*len).max(1) as u64, i)),
            UpdateKind::ExtentTree { dropped, .. } => {
                clears.extend(dropped.iter().map(|&(s, e)| (s, e, i)))
            }
            _ => {}
        }
    }
    // Attribute updates of each inode, in program order (see below).
    let mut xattr_updates: HashMap<Ino, Vec<usize>> = HashMap::default();
    let mut index_sets: Vec<usize> = Vec::new();
    // The last change of each unused-inode mark (a descriptor field, by
    // block and offset). Each change of one mark names the one before it
    // (the same bytes, `last_writer`), so waiting for the last waits for
    // them all: an entry names one update per mark, not every change of
    // it since the last write (which made a burst of creates quadratic).
    let mut unused_marks: HashMap<(u64, u32), usize> = HashMap::default();
    let mut flag_changes: HashMap<u32, Vec<usize>> = HashMap::default();
    // Same-block overlap keeps program order: the last writer of each byte.
    let mut last_writer: HashMap<(u64, u32), usize> = HashMap::default();
    for (i, u) in ups.iter().enumerate() {
        let mut p: Vec<usize> = Vec::new();
        for pos in u.range.clone() {
            if let Some(&j) = last_writer.get(&(u.block, pos)) {
                if p.last() != Some(&j) {
                    p.push(j);
                }
            }
            last_writer.insert((u.block, pos), i);
        }
        // One attribute change that spans the inode's area and its block
        // reaches the disk in program order, across blocks: the core
        // writes the place that gains an attribute before the place that
        // loses it (xattr.rs), so a crash never loses it from both.
        if let UpdateKind::Xattr { ino }
        | UpdateKind::XattrBlockInit { ino }
        | UpdateKind::XattrRef { ino, .. } = u.kind
        {
            let v = xattr_updates.entry(ino).or_default();
            p.extend(v.iter().copied().filter(|&j| ups[j].block != u.block));
            v.push(i);
        }
        if matches!(u.kind, UpdateKind::Other) && tree_blocks.contains(&u.block) {
            // A node truncated after a split: its entries live on in the new
            // node only once the index entry naming that node is durable.
            p.extend(
                index_sets
                    .iter()
                    .copied()
                    .filter(|&j| ups[j].block != u.block),
            );
        }
        if let UpdateKind::Extent {
            len: 0,
            op: MapOp::Set,
            ..
        } = u.kind
        {
            index_sets.push(i);
        }
        if let UpdateKind::Inode {
            ino,
            field: InodeField::Flags,
        } = u.kind
        {
            flag_changes.entry(ino).or_default().push(i);
        }
        if let UpdateKind::Counter {
            what: CounterKind::ItableUnused,
            ..
        } = u.kind
        {
            unused_marks.insert((u.block, u.range.start), i);
        }
        if let UpdateKind::Dirent {
            op: LinkOp::Add, ..
        } = u.kind
        {
            // The inode named must be below its group's unused mark.
            p.extend(unused_marks.values().copied());
        }
        if let UpdateKind::DirBlockInit { dir } = u.kind {
            // A directory block rewritten after its index flag was cleared.
            if let Some(v) = flag_changes.get(&dir) {
                p.extend(v.iter().copied());
            }
        }
        // i_blocks is raised before a mapping (or the index entry of a new
        // tree block) counted in it is set, and lowered only after the
        // mapping is cleared: a crash between the two leaves i_blocks too
        // high, which the benign repair lowers. i_size likewise grows
        // before new mappings (a crash leaves a hole at the end) and
        // shrinks only after the mappings beyond it are cleared, so no
        // mapped block ever lies past i_size.
        //
        // A tree switch keeps these orders inside the inode's own block
        // too: it may wait for fresh tree blocks, and a size or count
        // changed beside it must not reach the disk without it.
        let other_block = |j: &usize| ups[*j].block != u.block;
        let switch_of = match u.kind {
            UpdateKind::ExtentTree { ino, .. } => Some(ino),
            _ => None,
        };
        if let Some((ino, ..)) = u.kind.pointers().find(|p| p.3.sets()) {
            // A mapping (or attribute block) set.
            if let Some(v) = count_up.get(&ino) {
                p.extend(
                    v.iter()
                        .copied()
                        .filter(|j| switch_of.is_some() || other_block(j)),
                );
            }
        }
        if let UpdateKind::Extent { ino, len, op, .. } = u.kind {
            if op.sets() && len > 0 {
                if let Some(v) = size_up.get(&ino) {
                    p.extend(v.iter().copied().filter(other_block));
                }
            }
        }
        if let Some(ino) = switch_of {
            if let Some(v) = size_up.get(&ino) {
                p.extend(v.iter().copied().filter(|&j| j < i));
            }
        }
        // An index key and its child's first key live in two blocks. The
        // key only ever runs *below* the child's first key, the shape the
        // benign repair raises (a lookup in the gap finds a hole, as it
        // would after the repair): a key is raised after the child's
        // leading mappings are cleared, and lowered before a mapping in
        // front of them is set.
        match u.kind {
            UpdateKind::Extent {
                ino,
                pblk,
                len: 0,
                op: MapOp::Set,
                ..
            } if raised_keys.contains(&i) => {
                if let Some(v) = maps_in.get(&(ino, pblk)) {
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
            }
            UpdateKind::Extent {
                ino,
                lblk,
                len,
                op: MapOp::Set,
                ..
            } if len > 0 && !inited.contains(&u.block) => {
                if let Some(v) = index_keys.get(&(ino, u.block)) {
                    p.extend(
                        v.iter()
                            .filter(|&&(j, k)| k == lblk && !raised_keys.contains(&j))
                            .map(|&(j, _)| j),
                    );
                }
            }
            _ => {}
        }
        for field in [InodeField::BlockCount, InodeField::Size] {
            if let Some((ino, false)) = inode_field_moved(u, field) {
                if let Some(v) = map_clears.get(&ino) {
                    p.extend(v.iter().copied().filter(|j| {
                        other_block(j)
                            && (field == InodeField::BlockCount
                                || matches!(ups[*j].kind, UpdateKind::Extent { len, .. } if len > 0))
                    }));
                }
                if let Some(v) = switches.get(&ino) {
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
            }
        }
        for (_, start, end, op) in u.kind.pointers() {
            if !op.sets() {
                continue;
            }
            let mut ready = |b: u64, v: &Vec<usize>| {
                debug_assert!(start <= b && b < end);
                p.extend(
                    v.iter()
                        .copied()
                        .filter(|&j| j < i || ups[j].block != u.block),
                );
            };
            // A tree switch names whole files: walk the smaller side.
            if end - start > block_ready.len() as u64 {
                for (&b, v) in &block_ready {
                    if start <= b && b < end {
                        ready(b, v);
                    }
                }
            } else {
                for b in start..end {
                    if let Some(v) = block_ready.get(&b) {
                        ready(b, v);
                    }
                }
            }
        }
        match &u.kind {
            // Another user's pointer to a shared attribute block is gone
            // before the block counts one user fewer.
            UpdateKind::XattrRefcount { block, delta } if *delta < 0 => {
                for &(s, e, j) in &clears {
                    if *block >= s && *block < e && j < i {
                        p.push(j);
                    }
                }
            }
            UpdateKind::Dirent {
                dir,
                name,
                ino,
                op: LinkOp::Add,
            } => {
                if let Some(v) = inode_ready.get(ino) {
                    p.extend(v.iter().copied());
                }
                // An entry in a block the directory grew by in this handle
                // exists only once the mapping of that block (and, before
                // it, the raised size) is durable: without this edge a
                // rename into a growing directory could remove the old
                // name while the new one sits in a block no inode maps.
                if let Some(v) = map_sets.get(dir) {
                    p.extend(
                        v.iter()
                            .filter(|&&(s, e, j)| {
                                s <= u.block && u.block < e && ups[j].block != u.block
                            })
                            .map(|&(_, _, j)| j),
                    );
                }
                // A moved directory's `..` names its new parent only once
                // the new parent's entry naming it is durable: until then
                // `..` keeps naming the parent that holds its only name.
                if name.as_slice() == b".." {
                    if let Some(v) = adds.get(dir) {
                        p.extend(v.iter().copied().filter(|&j| j < i));
                    }
                } else if let Some(v) = links_up.get(dir) {
                    // A directory's count is raised for a subdirectory
                    // created or moved into it before the entry naming that
                    // subdirectory is.
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
            }
            UpdateKind::Dirent {
                ino,
                op: LinkOp::Remove,
                ..
            } => {
                if let Some(v) = adds.get(ino) {
                    p.extend(v.iter().copied());
                }
                // A moved directory's `..` names its new parent before its
                // old entry goes.
                if let Some(v) = adds_in.get(ino) {
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
                // A directory's name goes only after the entries removed
                // from it before: an `rmdir` never reaches the disk while
                // an earlier removal inside the directory is held back,
                // which would leave a directory cut off from the root with
                // entries in it.
                if let Some(v) = removes_in.get(ino) {
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
            }
            UpdateKind::Inode {
                ino,
                field: InodeField::Links,
            } if u16_of(&u.new) < u16_of(&u.old) => {
                if let Some(v) = removes.get(ino) {
                    p.extend(v.iter().copied());
                }
                // A directory's count drops for a subdirectory removed or
                // moved away only after the entry inside it is gone.
                if let Some(v) = removes_in.get(ino) {
                    p.extend(v.iter().copied().filter(|&j| j < i));
                }
            }
            UpdateKind::Inode {
                ino,
                field: InodeField::Whole,
            } if u.new.iter().all(|&b| b == 0) => {
                if let Some(v) = removes.get(ino) {
                    p.extend(v.iter().copied());
                }
            }
            UpdateKind::Bitmap {
                what: BitmapKind::Inode,
                index,
                set: false,
            } => {
                if let Some(v) = removes.get(&(*index as u32)) {
                    p.extend(v.iter().copied());
                }
            }
            UpdateKind::Bitmap {
                what: BitmapKind::Block,
                index,
                set: false,
            } => {
                for &(s, e, j) in &clears {
                    if *index >= s && *index < e {
                        p.push(j);
                    }
                }
            }
            _ => {}
        }
        p.retain(|&j| j != i);
        p.sort_unstable();
        p.dedup();
        preds[i] = p;
    }
    Graph { preds }
}
