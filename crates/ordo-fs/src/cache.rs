//! The buffer cache: block images, dirty state, generations, pins, and a
//! memory bound with clean-block eviction.
//!
//! Every block the core reads or changes lives here as an `Arc<Vec<u8>>`
//! image. A plan snapshot is a clone of that `Arc`, so taking one is cheap,
//! and the next modification copies the image (`Arc::make_mut`) instead of
//! changing bytes a plan is about to write. Each entry carries:
//!
//! - a *dirty* flag: the cached image differs from what was last handed to
//!   the device. Only a protocol ever writes a dirty block (through a plan);
//! - a *generation*, bumped on every modification, so that a block that was
//!   modified while its snapshot was being written stays dirty;
//! - a *pin count*: pinned blocks are in a plan that has not run yet and are
//!   never evicted (evicting one would let a later read fetch the old image
//!   from the device before the plan wrote the new one).
//!
//! The memory bound counts cached block images (`len * block_size`). Clean,
//! unpinned blocks are evicted in least-recently-used order; when that is not
//! enough, the core asks the protocol to write back
//! (`WriteBackReason::Pressure`) and evicts again once the plan ran.
//!
//! Every operation reads and changes a dozen cached blocks, so an access
//! costs one hash lookup and no more: the entry keeps the tick of its last
//! access, and only an eviction, which the core asks for with an eighth of
//! the bound to spare (`Core::relieve_pressure`), orders the candidates by
//! tick. The map is hashed with `rustc-hash` (block numbers are
//! integers; SipHash's protection against chosen keys buys nothing here and
//! cost a tenth of the core's time). The dirty blocks are a hash set
//! too, ordered only when a write-back asks for them
//! ([`BufferCache::dirty_blocks`]): a burst of creates dirties tens of
//! thousands of blocks between two write-backs, and an ordered set cost
//! each of them a tree insert and a tree removal.

use std::collections::hash_map::Entry as Slot;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::update::UpdateBytes;
use ordo_dev::BlockClass;

struct Entry {
    data: Arc<Vec<u8>>,
    class: BlockClass,
    dirty: bool,
    generation: u64,
    pins: u32,
    /// Tick of the last access: eviction takes the smallest first.
    tick: u64,
}

/// Counters of the cache, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes of block images cached now.
    pub cached_bytes: u64,
    /// The largest `cached_bytes` ever observed at the end of an operation.
    pub peak_cached_bytes: u64,
    /// The configured bound.
    pub bound_bytes: u64,
    /// Dirty blocks now.
    pub dirty_blocks: u64,
    /// Blocks read from the device into the cache.
    pub misses: u64,
    /// Lookups served from the cache.
    pub hits: u64,
    /// Clean blocks evicted.
    pub evictions: u64,
    /// Changes that copied a block's image first, because another
    /// reference to the old image was alive: a plan's or a commit's
    /// snapshot (the copy keeps what it writes stable), or a caller that
    /// held the image while it changed the block (a waste).
    pub copies: u64,
}

/// Cached block images.
pub struct BufferCache {
    block_size: u32,
    bound_bytes: u64,
    map: FxHashMap<u64, Entry>,
    dirty: FxHashSet<u64>,
    next_tick: u64,
    next_generation: u64,
    stats: CacheStats,
}

impl BufferCache {
    /// An empty cache of blocks of `block_size` bytes holding at most about
    /// `bound_bytes` of images.
    pub fn new(block_size: u32, bound_bytes: u64) -> Self {
        assert!(block_size.is_power_of_two() && block_size >= 512);
        BufferCache {
            block_size,
            bound_bytes: bound_bytes.max(block_size as u64 * 64),
            map: FxHashMap::default(),
            dirty: FxHashSet::default(),
            next_tick: 1,
            next_generation: 1,
            stats: CacheStats::default(),
        }
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Every dirty cached block, ascending.
    pub fn dirty_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.dirty.iter().copied().collect();
        v.sort_unstable();
        v
    }
    /// Number of dirty blocks.
    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }
    /// Whether `block` is cached and dirty.
    pub fn is_dirty(&self, block: u64) -> bool {
        // The entry's flag, one hash lookup; the dirty set holds the same
        // blocks (it is kept for write-back).
        let dirty = self.map.get(&block).is_some_and(|e| e.dirty);
        debug_assert_eq!(dirty, self.dirty.contains(&block));
        dirty
    }
    /// Whether `block` is cached.
    pub fn contains(&self, block: u64) -> bool {
        self.map.contains_key(&block)
    }
    /// The class of a cached block (Other if not cached).
    pub fn class_of(&self, block: u64) -> BlockClass {
        self.map
            .get(&block)
            .map(|e| e.class)
            .unwrap_or(BlockClass::Other)
    }
    /// The current image of a cached block (cheap: shares the buffer).
    pub fn snapshot(&self, block: u64) -> Option<Arc<Vec<u8>>> {
        self.map.get(&block).map(|e| e.data.clone())
    }
    /// A cached block's image (shared), class and generation, in one
    /// lookup: what a write-back reads of each block it sends.
    pub fn peek(&self, block: u64) -> Option<(Arc<Vec<u8>>, BlockClass, u64)> {
        self.map
            .get(&block)
            .map(|e| (e.data.clone(), e.class, e.generation))
    }
    /// The modification generation of a cached block (0 if not cached).
    pub fn generation(&self, block: u64) -> u64 {
        self.map.get(&block).map(|e| e.generation).unwrap_or(0)
    }
    /// Pin a cached block (it is in a plan that has not run yet).
    pub fn pin(&mut self, block: u64) {
        if let Some(e) = self.map.get_mut(&block) {
            e.pins += 1;
        }
    }
    /// Undo one [`BufferCache::pin`].
    pub fn unpin(&mut self, block: u64) {
        if let Some(e) = self.map.get_mut(&block) {
            debug_assert!(e.pins > 0, "unpin of unpinned block {block}");
            e.pins = e.pins.saturating_sub(1);
        }
    }
    /// A plan that pinned `block` at generation `gen` has run: unpin it
    /// and, when the write succeeded (`written`), mark it clean unless it
    /// changed since ([`BufferCache::unpin`] and
    /// [`BufferCache::mark_clean_if`] in one lookup). Nothing to do for a
    /// block no longer cached. Panics if `gen` is newer than the cached
    /// image (a core invariant).
    pub fn finish_write(&mut self, block: u64, gen: u64, written: bool) {
        let Some(e) = self.map.get_mut(&block) else {
            return;
        };
        assert!(
            gen <= e.generation,
            "block {block}: a pinned generation {gen} is newer than the cache's"
        );
        debug_assert!(e.pins > 0, "unpin of unpinned block {block}");
        e.pins = e.pins.saturating_sub(1);
        if written && e.generation == gen && e.dirty {
            e.dirty = false;
            self.dirty.remove(&block);
        }
    }
    /// Mark a cached block clean if its generation is still `gen`.
    pub fn mark_clean_if(&mut self, block: u64, gen: u64) {
        if let Some(e) = self.map.get_mut(&block) {
            if e.generation == gen && e.dirty {
                e.dirty = false;
                self.dirty.remove(&block);
            }
        }
    }

    fn next_tick(&mut self) -> u64 {
        let tick = self.next_tick;
        self.next_tick += 1;
        tick
    }

    /// The entry of a cached block, counting a hit and refreshing its LRU
    /// position; `None` when not cached.
    fn hit(&mut self, block: u64) -> Option<&Entry> {
        let tick = self.next_tick();
        let e = self.map.get_mut(&block)?;
        self.stats.hits += 1;
        e.tick = tick;
        Some(e)
    }

    /// The image of a cached block, counting a hit and refreshing its LRU
    /// position; `None` when not cached.
    pub fn get(&mut self, block: u64) -> Option<&[u8]> {
        self.hit(block).map(|e| e.data.as_slice())
    }

    /// Like [`BufferCache::get`], sharing the image (cheap: an `Arc`).
    pub fn get_shared(&mut self, block: u64) -> Option<Arc<Vec<u8>>> {
        self.hit(block).map(|e| e.data.clone())
    }

    /// Insert a clean image read from the device (a cache miss).
    pub fn insert_clean(&mut self, block: u64, class: BlockClass, data: Vec<u8>) {
        assert_eq!(data.len(), self.block_size as usize);
        self.stats.misses += 1;
        self.insert(block, class, data, false);
    }

    /// Insert (or replace) an image that has no valid contents on the device
    /// yet (a freshly allocated block); it starts dirty.
    pub fn insert_new(&mut self, block: u64, class: BlockClass, data: Vec<u8>) {
        assert_eq!(data.len(), self.block_size as usize);
        self.insert(block, class, data, true);
    }

    fn insert(&mut self, block: u64, class: BlockClass, data: Vec<u8>, dirty: bool) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let tick = self.next_tick();
        let mut entry = Entry {
            data: Arc::new(data),
            class,
            dirty,
            generation,
            pins: 0,
            tick,
        };
        // One lookup: a replaced image keeps its pins.
        match self.map.entry(block) {
            Slot::Occupied(mut o) => {
                entry.pins = o.get().pins;
                o.insert(entry);
            }
            Slot::Vacant(v) => {
                v.insert(entry);
            }
        }
        if dirty {
            self.dirty.insert(block);
        } else {
            self.dirty.remove(&block);
        }
    }

    /// Change `bytes` of a cached block at `offset`; returns the old bytes.
    /// Bumps the generation and marks the block dirty, unless the bytes
    /// were already there: then nothing changed, `None` says so, and a
    /// protocol that was told of nothing finds nothing to write. Panics if
    /// the block is not cached or the range is out of the block (core
    /// invariants).
    pub fn modify(&mut self, block: u64, offset: usize, bytes: &[u8]) -> Option<UpdateBytes> {
        let mut old = UpdateBytes::new();
        self.change(block, offset, bytes, Some(&mut old))
            .then_some(old)
    }

    /// [`BufferCache::modify`] without the bytes it replaced (file data:
    /// nothing keeps them).
    pub fn write(&mut self, block: u64, offset: usize, bytes: &[u8]) {
        self.change(block, offset, bytes, None);
    }

    /// Whether the bytes changed.
    fn change(
        &mut self,
        block: u64,
        offset: usize,
        bytes: &[u8],
        old: Option<&mut UpdateBytes>,
    ) -> bool {
        let tick = self.next_tick();
        let e = self
            .map
            .get_mut(&block)
            .unwrap_or_else(|| panic!("modify of uncached block {block}"));
        assert!(offset + bytes.len() <= e.data.len());
        if e.data[offset..offset + bytes.len()] == *bytes {
            return false;
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        if Arc::strong_count(&e.data) > 1 {
            self.stats.copies += 1;
        }
        let data = Arc::make_mut(&mut e.data);
        if let Some(old) = old {
            old.extend_from_slice(&data[offset..offset + bytes.len()]);
        }
        data[offset..offset + bytes.len()].copy_from_slice(bytes);
        e.generation = generation;
        e.tick = tick;
        if !e.dirty {
            e.dirty = true;
            self.dirty.insert(block);
        }
        true
    }

    /// Change the class of a cached block (a freed block reused for another
    /// purpose).
    pub fn set_class(&mut self, block: u64, class: BlockClass) {
        if let Some(e) = self.map.get_mut(&block) {
            e.class = class;
        }
    }

    /// Move the image cached at `from` to block `to` (a delayed block
    /// given its place, or taken back): dirty there, at a new generation;
    /// `from` is no longer cached. Panics if `from` is not cached.
    pub fn rename(&mut self, from: u64, to: u64) {
        let mut e = self
            .map
            .remove(&from)
            .unwrap_or_else(|| panic!("rename of uncached block {from}"));
        self.dirty.remove(&from);
        e.generation = self.next_generation;
        self.next_generation += 1;
        e.dirty = true;
        e.tick = self.next_tick();
        e.pins = self.map.remove(&to).map_or(0, |old| old.pins);
        self.map.insert(to, e);
        self.dirty.insert(to);
    }

    /// Drop a block (it was freed): its image, dirty or not, belongs to
    /// nobody. Plans that already hold a snapshot still write it.
    pub fn forget(&mut self, block: u64) {
        if self.map.remove(&block).is_some() {
            self.dirty.remove(&block);
        }
    }

    /// Bytes of cached images.
    pub fn cached_bytes(&self) -> u64 {
        self.map.len() as u64 * self.block_size as u64
    }

    /// The configured bound in bytes.
    pub fn bound_bytes(&self) -> u64 {
        self.bound_bytes
    }

    /// Whether the cache holds more than its bound.
    pub fn over_bound(&self) -> bool {
        self.cached_bytes() > self.bound_bytes
    }

    /// Evict clean, unpinned blocks in LRU order until the cache is at most
    /// `target_bytes`. Returns the number evicted.
    pub fn evict_to(&mut self, target_bytes: u64) -> usize {
        let bytes = self.cached_bytes();
        if bytes <= target_bytes {
            return 0;
        }
        let bs = self.block_size as u64;
        let want = bytes.saturating_sub(target_bytes).div_ceil(bs) as usize;
        let mut candidates: Vec<(u64, u64)> = self
            .map
            .iter()
            .filter(|(_, e)| !e.dirty && e.pins == 0)
            .map(|(&block, e)| (e.tick, block))
            .collect();
        if candidates.len() > want {
            // The `want` least recently used, in no particular order.
            candidates.select_nth_unstable(want);
            candidates.truncate(want);
        }
        for &(_, block) in &candidates {
            self.map.remove(&block);
        }
        let evicted = candidates.len();
        self.stats.evictions += evicted as u64;
        evicted
    }

    /// Record the current size as a candidate for the peak.
    pub fn note_peak(&mut self) {
        let now = self.cached_bytes();
        if now > self.stats.peak_cached_bytes {
            self.stats.peak_cached_bytes = now;
        }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            cached_bytes: self.cached_bytes(),
            bound_bytes: self.bound_bytes,
            dirty_blocks: self.dirty.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_marks_dirty_and_snapshot_is_stable() {
        let mut c = BufferCache::new(1024, 1 << 20);
        c.insert_clean(5, BlockClass::Directory, vec![0; 1024]);
        assert!(!c.is_dirty(5));
        let snap = c.snapshot(5).unwrap();
        let g0 = c.generation(5);
        let old = c.modify(5, 10, &[1, 2, 3]).expect("a change");
        assert_eq!(old.as_slice(), [0, 0, 0]);
        assert!(c.is_dirty(5));
        assert!(c.generation(5) > g0);
        assert_eq!(snap[10], 0, "a snapshot must not see later changes");
        assert_eq!(c.get(5).unwrap()[10..13], [1, 2, 3]);
    }

    #[test]
    fn write_changes_like_modify_and_keeps_no_old_bytes() {
        let mut c = BufferCache::new(1024, 1 << 20);
        c.insert_clean(7, BlockClass::Data, vec![4; 1024]);
        let g0 = c.generation(7);
        // The same bytes: nothing changes, nothing to write.
        c.write(7, 0, &[4; 1024]);
        assert!(!c.is_dirty(7));
        assert_eq!(c.generation(7), g0);
        // New bytes: dirty at a new generation, and an image shared with a
        // write in flight keeps its bytes.
        let snap = c.snapshot(7).unwrap();
        c.write(7, 100, &[5; 10]);
        assert!(c.is_dirty(7));
        assert!(c.generation(7) > g0);
        assert_eq!(snap[100], 4);
        assert_eq!(
            c.get(7).unwrap()[99..111],
            [4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 4]
        );
        // modify still returns what it replaced, and nothing when the
        // bytes were there already (no change, the generation stays).
        assert_eq!(c.modify(7, 100, &[6, 6]).unwrap().as_slice(), [5, 5]);
        let g1 = c.generation(7);
        assert_eq!(c.modify(7, 100, &[6, 6]), None);
        assert_eq!(c.generation(7), g1);
    }

    #[test]
    fn mark_clean_only_if_generation_unchanged() {
        let mut c = BufferCache::new(1024, 1 << 20);
        c.insert_new(1, BlockClass::Data, vec![0; 1024]);
        let g = c.generation(1);
        c.modify(1, 0, &[9]);
        c.mark_clean_if(1, g);
        assert!(c.is_dirty(1));
        c.mark_clean_if(1, c.generation(1));
        assert!(!c.is_dirty(1));
    }

    /// The end of a plan's write: unpinned whatever happened, clean only if
    /// it was written and the image is still the one written.
    #[test]
    fn finish_write_unpins_and_cleans_only_the_written_generation() {
        let mut c = BufferCache::new(1024, 64 * 1024);
        for b in 0..3u64 {
            c.insert_new(b, BlockClass::Data, vec![0; 1024]);
            c.pin(b);
        }
        let gens: Vec<u64> = (0..3).map(|b| c.generation(b)).collect();
        c.modify(1, 0, &[1]); // changed while its write was in flight
        c.finish_write(0, gens[0], true);
        c.finish_write(1, gens[1], true);
        c.finish_write(2, gens[2], false); // the write failed
        c.finish_write(99, 1, true); // not cached: nothing to do
        assert_eq!(c.dirty_blocks(), vec![1, 2]);
        for b in 0..64u64 {
            c.insert_clean(100 + b, BlockClass::Data, vec![0; 1024]);
        }
        c.mark_clean_if(1, c.generation(1));
        c.mark_clean_if(2, c.generation(2));
        c.evict_to(0);
        assert!(
            !c.contains(0) && !c.contains(1) && !c.contains(2),
            "a finished write left its block pinned"
        );
    }

    #[test]
    fn eviction_skips_dirty_and_pinned_blocks_in_lru_order() {
        let mut c = BufferCache::new(1024, 64 * 1024);
        for b in 0..100u64 {
            c.insert_clean(b, BlockClass::Data, vec![0; 1024]);
        }
        c.modify(0, 0, &[1]);
        c.pin(1);
        let _ = c.get(2); // most recently used now
        c.evict_to(64 * 1024);
        assert!(c.cached_bytes() <= 64 * 1024);
        assert!(c.contains(0), "dirty block evicted");
        assert!(c.contains(1), "pinned block evicted");
        assert!(
            c.contains(2),
            "recently used block evicted before older ones"
        );
        assert!(!c.contains(3));
    }

    /// The dirty set is unordered; the write-back's list of it is not. Blocks
    /// dirtied in a scattered order come out ascending, cleaning, forgetting
    /// and renaming take blocks out of it, and replacing a pinned image
    /// keeps its pins.
    #[test]
    fn dirty_blocks_come_out_ascending_and_follow_every_change() {
        let mut c = BufferCache::new(1024, 1 << 20);
        // A stride that visits 0..4096 out of order.
        let order: Vec<u64> = (0..4096u64).map(|i| (i * 2654435761) % 4096).collect();
        for &b in &order {
            c.insert_new(b + 10_000, BlockClass::Data, vec![0; 1024]);
        }
        let want: Vec<u64> = (10_000..14_096).collect();
        let got = c.dirty_blocks();
        assert!(
            got == want,
            "dirty blocks not ascending: {:?}...",
            &got[..8]
        );
        assert_eq!(c.dirty_count(), 4096);
        c.mark_clean_if(10_005, c.generation(10_005));
        c.forget(10_006);
        c.rename(10_007, 20_000);
        let dirty = c.dirty_blocks();
        assert!(dirty.windows(2).all(|w| w[0] < w[1]));
        assert!(!dirty.contains(&10_005) && !dirty.contains(&10_006) && !dirty.contains(&10_007));
        assert_eq!(dirty.last(), Some(&20_000));
        assert_eq!(c.dirty_count(), 4094);
        for b in [10_005, 10_006, 10_007, 20_000, 10_000] {
            assert_eq!(c.is_dirty(b), dirty.contains(&b), "block {b}");
        }
        // A clean re-read over a pinned dirty block: clean, still pinned.
        c.pin(10_010);
        c.insert_clean(10_010, BlockClass::Data, vec![1; 1024]);
        assert!(!c.is_dirty(10_010));
        assert!(!c.dirty_blocks().contains(&10_010));
        c.evict_to(0);
        assert!(c.contains(10_010), "a replaced image lost its pin");
    }
}
