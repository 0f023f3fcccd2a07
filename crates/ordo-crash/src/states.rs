//! Crash states: which writes of a log a crash can leave on disk.
//!
//! A *crash point* `c` means the first `c` events of the log were issued and
//! then power was lost. What is certainly on disk at `c`: every write issued
//! before the last flush that completed before `c`, and every FUA write
//! before `c`. Every other write since that flush was acknowledged but sat in
//! the volatile cache: any subset of them may have reached the medium, in
//! any order (applying a subset in log order gives each block the newest
//! chosen image, which covers reordering).
//!
//! Points are taken after every write and after every promise mark (the
//! disk is the same as just before the mark, but one more promise must
//! hold), plus point 0 (nothing written). At a write point only subsets that
//! contain the write just issued are generated: the others are exactly the
//! states of the previous point, already checked there with fewer
//! operations in flight (a stricter oracle).
//!
//! While `2^n <= max_states_per_point` all subsets of the `n` uncertain
//! writes are enumerated; beyond that a seeded sample is taken: all, none,
//! each single one dropped, each single one kept, then random subsets.
//! Torn writes (optional) persist a random non-empty proper subset of the
//! newest write's 512-byte sectors. Prefix-only mode takes, at each point,
//! just the writes issued before it. Everything is a function of the seed,
//! the sequence index and the point, so a state id `(sequence, point,
//! index)` always names the same state.

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::log::{EventKind, LogEvent, SECTOR_BYTES};

/// How states are generated.
#[derive(Clone, Copy, Debug)]
pub struct StateParams {
    /// Seed of every sample.
    pub seed: u64,
    /// Upper bound on the states generated at one crash point.
    pub max_states_per_point: usize,
    /// Only prefixes of the log (no reordering), for comparison.
    pub prefix_only: bool,
    /// Also generate states with the newest write torn at sector boundaries.
    pub torn: bool,
}

impl Default for StateParams {
    fn default() -> Self {
        StateParams {
            seed: 0,
            max_states_per_point: 256,
            prefix_only: false,
            torn: false,
        }
    }
}

/// A write persisted only in part.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TornWrite {
    /// Event index of the write.
    pub event: usize,
    /// One flag per 512-byte sector of the request: persisted or not.
    pub sectors: Vec<bool>,
}

/// One crash state of one recorded sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StateSpec {
    /// Number of events issued before the crash.
    pub point: usize,
    /// Index of the state among those of its point.
    pub index: usize,
    /// Event indices of the writes on disk, ascending (applied in order).
    pub writes: Vec<usize>,
    /// A write persisted in part (not listed in `writes`).
    pub torn: Option<TornWrite>,
}

impl StateSpec {
    /// The operation in flight at the crash: the tag of the last event
    /// issued (0 before any).
    pub fn op_in_flight(&self, events: &[LogEvent]) -> usize {
        if self.point == 0 {
            0
        } else {
            events[self.point - 1].op
        }
    }

    /// Promise indices logged before the crash, in order.
    pub fn promises(&self, events: &[LogEvent]) -> Vec<usize> {
        events[..self.point]
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Mark(p) => Some(p),
                _ => None,
            })
            .collect()
    }
}

fn is_write(e: &LogEvent) -> bool {
    matches!(e.kind, EventKind::Write(_))
}

/// The crash points of a log: 0, then after every write and every mark.
pub fn crash_points(events: &[LogEvent]) -> Vec<usize> {
    let mut out = vec![0];
    for (i, e) in events.iter().enumerate() {
        if matches!(e.kind, EventKind::Write(_) | EventKind::Mark(_)) {
            out.push(i + 1);
        }
    }
    out
}

/// Mixes the seed, the sequence index and the point into one RNG seed.
fn point_seed(seed: u64, sequence: usize, point: usize) -> u64 {
    let mut x = seed ^ 0x5851_f42d_4c95_7f2d;
    for v in [sequence as u64, point as u64] {
        x ^= v
            .wrapping_add(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(x << 6)
            .wrapping_add(x >> 2);
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 31;
    }
    x
}

/// All states at crash point `point` of `events`.
pub fn states_at(
    events: &[LogEvent],
    sequence: usize,
    point: usize,
    params: &StateParams,
) -> Vec<StateSpec> {
    assert!(point <= events.len());
    let mk = |index, writes, torn| StateSpec {
        point,
        index,
        writes,
        torn,
    };
    if point == 0 {
        return vec![mk(0, Vec::new(), None)];
    }
    if params.prefix_only {
        let writes = (0..point).filter(|&i| is_write(&events[i])).collect();
        return vec![mk(0, writes, None)];
    }
    let newest = point - 1;
    let newest_is_write = is_write(&events[newest]);
    let last_flush = events[..point]
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::Flush));
    let epoch_start = last_flush.map(|f| f + 1).unwrap_or(0);
    let mut durable: Vec<usize> = (0..epoch_start).filter(|&i| is_write(&events[i])).collect();
    let mut pending = Vec::new();
    for (i, e) in events.iter().enumerate().take(point).skip(epoch_start) {
        if newest_is_write && i == newest {
            continue;
        }
        if let EventKind::Write(w) = &e.kind {
            if w.fua {
                durable.push(i);
            } else {
                pending.push(i);
            }
        }
    }
    let forced: Vec<usize> = if newest_is_write {
        vec![newest]
    } else {
        Vec::new()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(point_seed(params.seed, sequence, point));
    let masks = subset_masks(pending.len(), params.max_states_per_point.max(1), &mut rng);
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for mask in masks {
        let mut writes = durable.clone();
        writes.extend(
            pending
                .iter()
                .zip(&mask)
                .filter(|(_, &m)| m)
                .map(|(&i, _)| i),
        );
        writes.extend(&forced);
        writes.sort_unstable();
        if seen.insert(signature(events, &writes)) {
            let index = out.len();
            out.push(mk(index, writes, None));
        }
    }
    if params.torn && newest_is_write {
        if let EventKind::Write(w) = &events[newest].kind {
            let sectors = w.data.len() / SECTOR_BYTES;
            if sectors >= 2 {
                for with_pending in [true, false] {
                    let mut mask: Vec<bool> = (0..sectors).map(|_| rng.gen_bool(0.5)).collect();
                    // A proper, non-empty subset.
                    mask[rng.gen_range(0..sectors)] = true;
                    let off = rng.gen_range(0..sectors);
                    if mask.iter().all(|&m| m) {
                        mask[off] = false;
                    }
                    let mut writes = durable.clone();
                    if with_pending {
                        writes.extend(&pending);
                    }
                    writes.sort_unstable();
                    let index = out.len();
                    out.push(mk(
                        index,
                        writes,
                        Some(TornWrite {
                            event: newest,
                            sectors: mask,
                        }),
                    ));
                }
            }
        }
    }
    out
}

/// Which image each request extent ends up with: for every (first block,
/// length) written, the last chosen write to it. Exact for requests that
/// repeat the same extent (the common case: a block rewritten), and
/// conservative otherwise (it never merges two different images).
fn signature(events: &[LogEvent], writes: &[usize]) -> Vec<((u64, usize), usize)> {
    let mut last = std::collections::BTreeMap::new();
    for &i in writes {
        if let EventKind::Write(w) = &events[i].kind {
            last.insert((w.block, w.data.len()), i);
        }
    }
    last.into_iter().collect()
}

/// Subsets of `n` items as masks: all of them while `2^n <= max`, else a
/// seeded sample of at most `max` distinct masks.
fn subset_masks(n: usize, max: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<bool>> {
    if n < usize::BITS as usize && (1usize << n) <= max {
        return (0..1usize << n)
            .map(|m| (0..n).map(|i| m >> i & 1 == 1).collect())
            .collect();
    }
    let mut out: Vec<Vec<bool>> = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |m: Vec<bool>, out: &mut Vec<Vec<bool>>| {
        if out.len() < max && seen.insert(m.clone()) {
            out.push(m);
        }
    };
    push(vec![true; n], &mut out);
    push(vec![false; n], &mut out);
    for i in 0..n {
        let mut m = vec![true; n];
        m[i] = false;
        push(m, &mut out);
    }
    for i in 0..n {
        let mut m = vec![false; n];
        m[i] = true;
        push(m, &mut out);
    }
    let mut attempts = 0;
    while out.len() < max && attempts < max * 8 {
        attempts += 1;
        let m = (0..n).map(|_| rng.gen_bool(0.5)).collect();
        push(m, &mut out);
    }
    out
}

/// Every state of one sequence's log, by point then index.
pub fn all_states(events: &[LogEvent], sequence: usize, params: &StateParams) -> Vec<StateSpec> {
    crash_points(events)
        .into_iter()
        .flat_map(|p| states_at(events, sequence, p, params))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::LoggedWrite;
    use ordo_dev::BlockClass;
    use std::sync::Arc;

    fn w(block: u64, fua: bool) -> LogEvent {
        LogEvent {
            kind: EventKind::Write(LoggedWrite::new(
                block,
                Arc::from(vec![block as u8; 1024]),
                fua,
                BlockClass::Data,
            )),
            op: 1,
        }
    }
    fn flush() -> LogEvent {
        LogEvent {
            kind: EventKind::Flush,
            op: 1,
        }
    }
    fn mark(p: usize) -> LogEvent {
        LogEvent {
            kind: EventKind::Mark(p),
            op: 2,
        }
    }

    #[test]
    fn flushed_and_fua_writes_are_always_on_disk() {
        // 0:w1 1:w2 2:flush 3:w3 4:w4(fua) 5:w5
        let ev = vec![
            w(1, false),
            w(2, false),
            flush(),
            w(3, false),
            w(4, true),
            w(5, false),
        ];
        let p = StateParams::default();
        let s = states_at(&ev, 0, 6, &p);
        // Pending: w3 (w4 is FUA, w5 forced): 2 states.
        assert_eq!(s.len(), 2);
        for st in &s {
            for must in [0, 1, 4, 5] {
                assert!(st.writes.contains(&must), "{st:?}");
            }
        }
        assert!(s.iter().any(|st| st.writes.contains(&3)));
        assert!(s.iter().any(|st| !st.writes.contains(&3)));
    }

    #[test]
    fn exhaustive_below_the_bound_and_newest_forced() {
        let ev: Vec<LogEvent> = (1..=5).map(|b| w(b, false)).collect();
        let p = StateParams::default();
        let s = states_at(&ev, 0, 5, &p);
        assert_eq!(s.len(), 16);
        assert!(s.iter().all(|st| st.writes.contains(&4)));
        let distinct: HashSet<_> = s.iter().map(|st| st.writes.clone()).collect();
        assert_eq!(distinct.len(), 16);
        // Points: 0 and after each write.
        assert_eq!(crash_points(&ev), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(all_states(&ev, 0, &p).len(), 1 + 1 + 2 + 4 + 8 + 16);
    }

    #[test]
    fn sampling_is_bounded_and_seeded() {
        let ev: Vec<LogEvent> = (1..=20).map(|b| w(b, false)).collect();
        let p = StateParams {
            max_states_per_point: 64,
            seed: 7,
            ..Default::default()
        };
        let a = states_at(&ev, 3, 20, &p);
        assert_eq!(a.len(), 64);
        assert_eq!(a, states_at(&ev, 3, 20, &p));
        let b = states_at(&ev, 3, 20, &StateParams { seed: 8, ..p });
        assert_ne!(a, b);
        // "all" and "none" are always there.
        assert!(a.iter().any(|s| s.writes.len() == 20));
        assert!(a.iter().any(|s| s.writes == vec![19]));
    }

    #[test]
    fn mark_points_check_promises_on_the_same_disk() {
        let ev = vec![w(1, false), flush(), mark(0), w(2, false)];
        let p = StateParams::default();
        assert_eq!(crash_points(&ev), vec![0, 1, 3, 4]);
        let s = states_at(&ev, 0, 3, &p);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].writes, vec![0]);
        assert_eq!(s[0].promises(&ev), vec![0]);
        assert_eq!(s[0].op_in_flight(&ev), 2);
    }

    #[test]
    fn prefix_only_and_torn() {
        let mut ev: Vec<LogEvent> = (1..=3).map(|b| w(b, false)).collect();
        let p = StateParams {
            prefix_only: true,
            ..Default::default()
        };
        assert_eq!(all_states(&ev, 0, &p).len(), 4);
        ev.push(w(9, false));
        let t = StateParams {
            torn: true,
            ..Default::default()
        };
        let s = states_at(&ev, 0, 4, &t);
        let torn: Vec<_> = s.iter().filter(|x| x.torn.is_some()).collect();
        assert_eq!(torn.len(), 2);
        for x in torn {
            let m = &x.torn.as_ref().unwrap().sectors;
            assert_eq!(m.len(), 2);
            assert!(m.iter().any(|&b| b) && !m.iter().all(|&b| b));
            assert!(!x.writes.contains(&3));
        }
    }

    #[test]
    fn duplicate_images_are_generated_once() {
        // Two pending writes of the same block then a third: subsets {a},{b}
        // differ, {a,b} == {b}.
        let ev = vec![w(1, false), w(1, false), w(2, false)];
        let s = states_at(&ev, 0, 3, &StateParams::default());
        assert_eq!(s.len(), 3);
    }
}
