//! The release order of one handle's updates: the `sync` protocol's
//! algorithm (its header comment), stated once and shared with the
//! scheduler-enforced protocols built on it (`sched-flag`, `sched-chain`).
//!
//! [`release`] takes the handle's updates (and, for protocols whose writes
//! are still queued when the next handle ends, the earlier updates not yet
//! durable with the write that carries each) and returns the sequence of
//! block writes that keeps the three rules when each is made durable before
//! the next one starts: intermediate images (the block before the handle
//! plus the updates released so far) where an update in another block must
//! wait for some but not all of a block's updates, then the final images.
//! Every write says which earlier writes carry the predecessors of what it
//! carries (`after`), which is what scheduler chains need; `sync` issues
//! the list in order, each write FUA, which honours it a fortiori.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use rustc_hash::FxHashSet as HashSet;

use super::super::ordering::build_graph;
use super::super::Io;
use super::is_ordered;
use crate::update::{Update, UpdateKind};

/// A write that carries an update: one of this handle's (an index into the
/// returned list) or one queued before it (the caller's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Carrier {
    /// A write queued by an earlier handle.
    Prior(u64),
    /// The n-th write of this handle's list.
    Now(usize),
}

/// One write of the release order.
pub(crate) struct Released {
    /// The block written.
    pub block: u64,
    /// An intermediate image (resealed), or `None` for the block's cached
    /// image as it is at the end of the handle.
    pub image: Option<Vec<u8>>,
    /// The writes carrying predecessors of the updates this one carries.
    pub after: Vec<Carrier>,
    /// Indexes (into the handle's updates) of the updates it carries first.
    pub carries: Vec<usize>,
}

/// What [`release`] returns.
pub(crate) struct Release {
    /// The writes, in an order that keeps the rules when each is durable
    /// before the next is issued.
    pub writes: Vec<Released>,
    /// Dependency cycles broken by releasing the oldest update anyway.
    pub cycles: u64,
    /// Intermediate images among the writes.
    pub intermediate: u64,
}

/// The release order of `ups` (one handle's updates, in program order),
/// after `prior` (earlier updates, carried by queued writes that are not
/// durable yet). `everything`: mount and unmount bookkeeping, every update
/// written whether or not it carries pointer meaning.
pub(crate) fn release(
    prior: &[(&Update, u64)],
    ups: &[Update],
    everything: bool,
    io: &Io,
) -> Release {
    let np = prior.len();
    let all: Vec<&Update> = prior.iter().map(|(u, _)| *u).chain(ups.iter()).collect();
    let tree_blocks: HashSet<u64> = all
        .iter()
        .map(|u| u.block)
        .filter(|&b| io.class_of(b) == ordo_dev::BlockClass::ExtentTree)
        .collect();
    let g = build_graph(&all, &tree_blocks);
    let n = all.len();
    let ordered: Vec<bool> = all
        .iter()
        .map(|u| everything || is_ordered(u, &tree_blocks))
        .collect();
    // This handle's updates, by block.
    let mut by_block: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, u) in all.iter().enumerate().skip(np) {
        by_block.entry(u.block).or_default().push(i);
    }
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut missing: Vec<usize> = vec![0; n];
    let mut released = vec![false; n];
    let mut carrier: Vec<Option<Carrier>> = vec![None; n];
    for (i, (_, id)) in prior.iter().enumerate() {
        released[i] = true;
        carrier[i] = Some(Carrier::Prior(*id));
    }
    for (i, p) in g.preds.iter().enumerate().skip(np) {
        for &j in p {
            if !released[j] {
                missing[i] += 1;
                succs[j].push(i);
            }
        }
    }
    // The carriers of each update's predecessors in other blocks.
    let mut deps: Vec<Vec<Carrier>> = vec![Vec::new(); n];
    let mut out = Release {
        writes: Vec::new(),
        cycles: 0,
        intermediate: 0,
    };
    let mut heap: BinaryHeap<Reverse<usize>> =
        (np..n).filter(|&i| missing[i] == 0).map(Reverse).collect();
    let mut done = np;
    let mut next_forced = np;
    while done < n {
        let i = match heap.pop() {
            Some(Reverse(i)) => i,
            None => {
                // A cycle: release the oldest pending update anyway.
                while released[next_forced] {
                    next_forced += 1;
                }
                out.cycles += 1;
                next_forced
            }
        };
        if released[i] {
            continue;
        }
        // Every predecessor in another block must be carried first.
        let cross: Vec<usize> = g.preds[i]
            .iter()
            .copied()
            .filter(|&j| ordered[j] && ordered[i] && released[j] && all[j].block != all[i].block)
            .collect();
        let mut to_write: Vec<u64> = cross
            .iter()
            .filter(|&&j| carrier[j].is_none())
            .map(|&j| all[j].block)
            .collect();
        to_write.sort_unstable();
        to_write.dedup();
        for b in to_write {
            let members = &by_block[&b];
            let whole = members
                .iter()
                .all(|&k| released[k] || matches!(all[k].kind, UpdateKind::Checksum));
            let image = if whole {
                None
            } else if let Some(cur) = io.snapshot(b) {
                // The block as it was before this handle, plus the
                // released updates.
                let mut img = cur.to_vec();
                for &k in members.iter().rev() {
                    let r = &all[k].range;
                    img[r.start as usize..r.end as usize].copy_from_slice(&all[k].old);
                }
                for &k in members {
                    if released[k] && !matches!(all[k].kind, UpdateKind::Checksum) {
                        let r = &all[k].range;
                        img[r.start as usize..r.end as usize].copy_from_slice(&all[k].new);
                    }
                }
                io.reseal(b, &mut img);
                out.intermediate += 1;
                Some(img)
            } else {
                continue;
            };
            let carries: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&k| released[k] && carrier[k].is_none())
                .collect();
            push_write(&mut out, b, image, &carries, &deps, &mut carrier, np);
        }
        for &j in &cross {
            if let Some(c) = carrier[j] {
                deps[i].push(c);
            }
        }
        released[i] = true;
        done += 1;
        for &s in &succs[i] {
            missing[s] = missing[s].saturating_sub(1);
            if missing[s] == 0 && !released[s] {
                heap.push(Reverse(s));
            }
        }
    }
    // What is left: final images, in the order their first update was made.
    let mut rest: Vec<(usize, u64)> = by_block
        .iter()
        .filter(|(_, m)| m.iter().any(|&k| ordered[k] && carrier[k].is_none()))
        .map(|(&b, m)| (m[0], b))
        .collect();
    rest.sort_unstable();
    for (_, b) in rest {
        if !io.is_dirty(b) {
            continue;
        }
        let carries: Vec<usize> = by_block[&b]
            .iter()
            .copied()
            .filter(|&k| carrier[k].is_none())
            .collect();
        push_write(&mut out, b, None, &carries, &deps, &mut carrier, np);
    }
    out
}

/// Append the write of block `b` that first carries the updates `carries`
/// (indexes into the combined list, `np` of them prior), after the writes
/// carrying their predecessors.
fn push_write(
    out: &mut Release,
    b: u64,
    image: Option<Vec<u8>>,
    carries: &[usize],
    deps: &[Vec<Carrier>],
    carrier: &mut [Option<Carrier>],
    np: usize,
) {
    let w = out.writes.len();
    let mut after: Vec<Carrier> = carries.iter().flat_map(|&k| deps[k].clone()).collect();
    after.sort_unstable();
    after.dedup();
    for &k in carries {
        carrier[k] = Some(Carrier::Now(w));
    }
    out.writes.push(Released {
        block: b,
        image,
        after,
        carries: carries.iter().map(|&k| k - np).collect(),
    });
}
