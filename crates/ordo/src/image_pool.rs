//! Block images in memory that is already faulted in.
//!
//! A mount's block cache grows one block image (a 4 KiB `Vec<u8>`) at a
//! time as it fills, and the first write to each new page of the heap is a
//! page fault: the kernel allocates a page, zeroes it and maps it, in the
//! thread that touched it. That thread is the FUSE worker serving the
//! write, under the core's lock, while the machine's other CPU idles. A
//! profile of a mount creating 10,000 files of 16 KiB put a ninth of the
//! serving thread's samples in those faults (DESIGN.md, "The FUSE path").
//!
//! [`ImagePool`] is the `ordo` binary's global allocator. Every allocation
//! of exactly [`SLOT`] bytes (a block image of a 4 KiB-block file system)
//! whose alignment a page satisfies is served from a free list of page
//! slots in one reserved region of address space, and everything else goes
//! to the system allocator unchanged. A refiller thread
//! ([`ImagePool::start`]) keeps the list stocked: when fewer than
//! [`Levels::low`] slots are free, it faults in the next slots of the
//! region (writing each slot's link to the next is the first touch) and
//! adds them, so the fault and the zeroing happen on a thread that is not
//! serving a request. A freed slot goes back on the list, still resident;
//! when more than [`Levels::high`] are free (the cache shrank), the
//! refiller gives the surplus back to the kernel (`MADV_DONTNEED`) and
//! keeps their addresses to fault in again before anything else. So the
//! memory held beyond what is allocated stays below `high` slots.
//!
//! Before `start`, with the region not reserved (a strict overcommit
//! policy refuses it), once it is used up, or when the list is empty
//! because the refiller fell behind, an allocation goes to the system
//! allocator: the pool only ever moves a fault to another thread, it never
//! makes an allocation fail. The region is never unmapped, so a slot
//! freed after the refiller stopped is still valid to keep.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The one size of allocation served from the pool: a 4 KiB block image.
pub const SLOT: usize = 4096;

/// Address space reserved for slots (`MAP_NORESERVE`: nothing is committed
/// until a slot is faulted in): far beyond any cache bound, so that
/// running out is not a case that matters, only one that is handled.
pub const REGION_BYTES: usize = 64 << 30;

/// Slots faulted in per refill step, between two splices into the list.
const STEP_SLOTS: usize = 256;

/// The free-list levels, in slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    /// Below this many free slots an allocation wakes the refiller.
    pub low: usize,
    /// A refill stops at this many free slots.
    pub target: usize,
    /// Above this many free slots the refiller returns the surplus, down
    /// to `target`.
    pub high: usize,
}

impl Levels {
    /// The levels for a mount whose block cache holds `cache_bytes`: a
    /// sixteenth of the cache kept ready, between 1 and 8 MiB (8 MiB lasts
    /// a mount filling its cache at 160 MB/s some 50 ms, time for many
    /// refills), the refiller woken at half of it, and what is free beyond
    /// four times it returned.
    pub fn for_cache(cache_bytes: u64) -> Levels {
        let target = ((cache_bytes / 16) as usize / SLOT).clamp(256, 2048);
        Levels {
            low: target / 2,
            target,
            high: target * 4,
        }
    }
}

/// The free list: an intrusive stack through the first word of each free
/// slot (a free slot is resident, so reading its link faults nothing).
struct FreeList {
    head: usize,
    count: usize,
}

/// The pool's counts, published with a mount's statistics (`ordo info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Slots on the free list now.
    pub free: usize,
    /// Allocations served from the list.
    pub served: usize,
    /// Slot-sized allocations sent to the system allocator because the
    /// list was empty (or the pool not started).
    pub missed: usize,
    /// Slots the refiller faulted in (fresh or returned earlier).
    pub faulted: usize,
    /// Slots returned to the kernel.
    pub returned: usize,
}

/// The allocator (see the module's documentation).
pub struct ImagePool {
    /// `Levels`, set by `start` (atomics: the allocator is a static).
    low: AtomicUsize,
    target: AtomicUsize,
    high: AtomicUsize,
    /// The reserved region, `[base, end)`; `base` is 0 until reserved.
    base: AtomicUsize,
    end: AtomicUsize,
    free: Mutex<FreeList>,
    /// The refiller was asked to look and has not yet.
    kicked: AtomicBool,
    wake: (Mutex<()>, Condvar),
    stop: AtomicBool,
    served: AtomicUsize,
    missed: AtomicUsize,
    faulted: AtomicUsize,
    returned: AtomicUsize,
}

/// The refiller's own state: where fresh slots come from.
#[derive(Debug, Default)]
pub struct Refill {
    /// The next never-used offset in the region.
    bump: usize,
    /// Slots returned to the kernel, to fault in again before fresh ones.
    spare: Vec<usize>,
}

impl ImagePool {
    pub const fn new() -> ImagePool {
        ImagePool {
            low: AtomicUsize::new(0),
            target: AtomicUsize::new(0),
            high: AtomicUsize::new(0),
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            free: Mutex::new(FreeList { head: 0, count: 0 }),
            kicked: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            stop: AtomicBool::new(false),
            served: AtomicUsize::new(0),
            missed: AtomicUsize::new(0),
            faulted: AtomicUsize::new(0),
            returned: AtomicUsize::new(0),
        }
    }

    fn levels(&self) -> Levels {
        Levels {
            low: self.low.load(Ordering::Relaxed),
            target: self.target.load(Ordering::Relaxed),
            high: self.high.load(Ordering::Relaxed),
        }
    }

    fn list(&self) -> MutexGuard<'_, FreeList> {
        // Nothing panics while holding it; a poisoned list is still whole.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserve `bytes` of address space for slots, to be kept at
    /// `levels`. False when the kernel refuses (the pool then serves
    /// nothing); true also when reserved before (the levels are not
    /// changed then).
    pub fn reserve(&self, bytes: usize, levels: Levels) -> bool {
        assert!(
            levels.low <= levels.target && levels.target < levels.high,
            "image pool levels out of order: {levels:?}"
        );
        if self.base.load(Ordering::Acquire) != 0 {
            return true;
        }
        self.low.store(levels.low, Ordering::Relaxed);
        self.target.store(levels.target, Ordering::Relaxed);
        self.high.store(levels.high, Ordering::Relaxed);
        let bytes = bytes / SLOT * SLOT;
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        let base = p as usize;
        self.end.store(base + bytes, Ordering::Release);
        self.base.store(base, Ordering::Release);
        true
    }

    /// Reserve the region and start the refiller thread. Call once, after
    /// any fork (a thread does not survive one). Returns whether the pool
    /// is serving.
    pub fn start(&'static self, levels: Levels) -> bool {
        if !self.reserve(REGION_BYTES, levels) {
            return false;
        }
        let mut state = Refill::default();
        // The first stock before the first request needs it.
        self.refill(&mut state);
        std::thread::Builder::new()
            .name("ordo-image-pool".into())
            .spawn(move || self.run(state))
            .is_ok()
    }

    /// The refiller thread's loop.
    fn run(&self, mut state: Refill) {
        while !self.stop.load(Ordering::Acquire) {
            {
                // An idle mount's refiller sleeps until an allocation or a
                // free finds the list past a level (`kick` notifies under
                // this lock, so a kick between the check and the wait is
                // not lost).
                let mut guard = self.wake.0.lock().unwrap_or_else(|e| e.into_inner());
                while !self.kicked.load(Ordering::Acquire) {
                    guard = self.wake.1.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
            }
            self.kicked.store(false, Ordering::Release);
            self.refill(&mut state);
            self.trim(&mut state);
        }
    }

    /// Ask the refiller to look at the list (at most one wake-up between
    /// two of its looks).
    fn kick(&self) {
        if !self.kicked.swap(true, Ordering::AcqRel) {
            let _g = self.wake.0.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.1.notify_one();
        }
    }

    fn in_region(&self, p: usize) -> bool {
        let base = self.base.load(Ordering::Acquire);
        base != 0 && p >= base && p < self.end.load(Ordering::Acquire)
    }

    fn serves(layout: Layout) -> bool {
        layout.size() == SLOT && layout.align() <= SLOT
    }

    /// A slot off the list, if there is one.
    fn pop(&self) -> Option<*mut u8> {
        if self.base.load(Ordering::Relaxed) == 0 {
            // Not started (a process that mounts nothing): the system's.
            return None;
        }
        let (p, left) = {
            let mut l = self.list();
            if l.head == 0 {
                (0, 0)
            } else {
                let p = l.head;
                // SAFETY: a listed slot is resident, ours, and holds the
                // address of the next one in its first word.
                l.head = unsafe { *(p as *const usize) };
                l.count -= 1;
                (p, l.count)
            }
        };
        if left < self.low.load(Ordering::Relaxed) {
            self.kick();
        }
        if p == 0 {
            self.missed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        Some(p as *mut u8)
    }

    /// Put a slot back on the list.
    fn push(&self, p: usize) {
        debug_assert!(
            self.in_region(p) && (p - self.base.load(Ordering::Relaxed)).is_multiple_of(SLOT)
        );
        let count = {
            let mut l = self.list();
            // SAFETY: the slot is ours again and resident (it was handed
            // out resident and only the kernel's DONTNEED, done to listed
            // slots only, takes pages away).
            unsafe { *(p as *mut usize) = l.head };
            l.head = p;
            l.count += 1;
            l.count
        };
        if count > self.high.load(Ordering::Relaxed) {
            self.kick();
        }
    }

    /// Fault in slots and list them until `target` are free, spares first.
    /// Returns the slots added.
    pub fn refill(&self, state: &mut Refill) -> usize {
        let base = self.base.load(Ordering::Acquire);
        if base == 0 {
            return 0;
        }
        let size = self.end.load(Ordering::Acquire) - base;
        let mut added = 0;
        loop {
            let want = self.levels().target.saturating_sub(self.list().count);
            if want == 0 {
                break;
            }
            // Link a chain of up to a step's slots outside the lock: the
            // writes of the links are the faults.
            let n = want.min(STEP_SLOTS);
            let (mut first, mut last, mut got) = (0usize, 0usize, 0usize);
            while got < n {
                let p = match state.spare.pop() {
                    Some(p) => p,
                    None if state.bump + SLOT <= size => {
                        state.bump += SLOT;
                        base + state.bump - SLOT
                    }
                    None => break,
                };
                // SAFETY: `p` is a slot of the region nobody else holds
                // (fresh, or returned and kept only here).
                unsafe { *(p as *mut usize) = first };
                if first == 0 {
                    last = p;
                }
                first = p;
                got += 1;
            }
            if got == 0 {
                break;
            }
            {
                let mut l = self.list();
                // SAFETY: `last` is the chain's tail, resident and ours.
                unsafe { *(last as *mut usize) = l.head };
                l.head = first;
                l.count += got;
            }
            self.faulted.fetch_add(got, Ordering::Relaxed);
            added += got;
        }
        added
    }

    /// Return the free slots beyond `high` to the kernel, down to
    /// `target`, keeping their addresses. Returns the slots returned.
    pub fn trim(&self, state: &mut Refill) -> usize {
        let levels = self.levels();
        let surplus = self.list().count.saturating_sub(levels.target);
        if surplus <= levels.high - levels.target {
            return 0;
        }
        // Room for every address first: nothing may allocate while the list
        // is locked (a slot-sized allocation would lock it again).
        let mut taken = Vec::with_capacity(surplus);
        {
            let mut l = self.list();
            while l.count > levels.target && taken.len() < taken.capacity() {
                let p = l.head;
                // SAFETY: as in `pop`.
                l.head = unsafe { *(p as *const usize) };
                l.count -= 1;
                taken.push(p);
            }
        }
        for &p in &taken {
            // SAFETY: the slot is off the list and held by no one: giving
            // its page back loses nothing; the mapping stays.
            unsafe {
                libc::madvise(p as *mut libc::c_void, SLOT, libc::MADV_DONTNEED);
            }
        }
        self.returned.fetch_add(taken.len(), Ordering::Relaxed);
        let n = taken.len();
        state.spare.extend(taken);
        n
    }

    /// Whether the region is reserved (the pool serves).
    pub fn started(&self) -> bool {
        self.base.load(Ordering::Acquire) != 0
    }

    /// Stop the refiller after its current step (tests).
    #[cfg(test)]
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.kick();
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            free: self.list().count,
            served: self.served.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            faulted: self.faulted.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
        }
    }
}

// SAFETY: every pointer handed out is either the system allocator's, for
// the layout asked, or a slot of SLOT bytes at a SLOT-aligned address of
// the reserved region, which stays mapped read-write for the life of the
// process and is handed to one owner at a time (it is on the free list
// or owned, never both). `dealloc` tells the two apart by address.
unsafe impl GlobalAlloc for ImagePool {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::serves(layout) {
            if let Some(p) = self.pop() {
                return p;
            }
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::serves(layout) {
            if let Some(p) = self.pop() {
                // SAFETY: the slot is SLOT bytes, ours, and resident.
                unsafe { std::ptr::write_bytes(p, 0, SLOT) };
                return p;
            }
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.in_region(ptr as usize) {
            self.push(ptr as usize);
        } else {
            // SAFETY: not a slot, so the system allocator's, for `layout`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let from_pool = self.in_region(ptr as usize);
        // SAFETY: the caller guarantees `new_size` with `layout.align()`
        // is a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !from_pool && !Self::serves(new_layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if from_pool && new_size == SLOT {
            return ptr;
        }
        // SAFETY: a fresh allocation for a valid layout; the old one is
        // live for `layout.size()` bytes and freed once copied.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whether the page at `p` is resident (mincore).
    fn resident(p: *mut u8) -> bool {
        let mut v = 0u8;
        // SAFETY: `p` is page-aligned and mapped; `v` holds one page's flag.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, SLOT, &mut v) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v & 1 == 1
    }

    const SMALL: Levels = Levels {
        low: 4,
        target: 8,
        high: 16,
    };
    const BLOCK: Layout = match Layout::from_size_align(SLOT, 1) {
        Ok(l) => l,
        Err(_) => panic!(),
    };

    fn pool(slots: usize) -> (&'static ImagePool, Refill) {
        let p: &'static ImagePool = Box::leak(Box::new(ImagePool::new()));
        assert!(p.reserve(slots * SLOT, SMALL));
        (p, Refill::default())
    }

    #[test]
    fn a_block_image_comes_resident_from_the_region_and_goes_back() {
        let (p, mut st) = pool(64);
        assert_eq!(p.refill(&mut st), 8);
        let a = unsafe { p.alloc(BLOCK) };
        assert!(p.in_region(a as usize), "not a slot: {a:?}");
        assert_eq!(a as usize % SLOT, 0);
        assert!(resident(a), "a served slot must be faulted in already");
        unsafe { a.write_bytes(7, SLOT) };
        assert_eq!(p.stats().free, 7);
        unsafe { p.dealloc(a, BLOCK) };
        assert_eq!(p.stats().free, 8);
        // The last freed slot is the next served.
        let b = unsafe { p.alloc(BLOCK) };
        assert_eq!(a, b);
        unsafe { p.dealloc(b, BLOCK) };
        // Other sizes are the system's.
        let other = Layout::from_size_align(SLOT + 1, 8).unwrap();
        let c = unsafe { p.alloc(other) };
        assert!(!p.in_region(c as usize));
        unsafe { p.dealloc(c, other) };
        assert_eq!(p.stats().free, 8);
    }

    #[test]
    fn zeroed_slots_are_zero_and_slots_are_distinct() {
        let (p, mut st) = pool(64);
        p.refill(&mut st);
        let mut held = Vec::new();
        for _ in 0..8 {
            let a = unsafe { p.alloc(BLOCK) };
            unsafe { a.write_bytes(0xaa, SLOT) };
            held.push(a);
        }
        for a in held.drain(..) {
            unsafe { p.dealloc(a, BLOCK) };
        }
        for _ in 0..8 {
            let a = unsafe { p.alloc_zeroed(BLOCK) };
            let s = unsafe { std::slice::from_raw_parts(a, SLOT) };
            assert!(s.iter().all(|&b| b == 0), "alloc_zeroed left old bytes");
            held.push(a);
        }
        let mut sorted: Vec<usize> = held.iter().map(|&a| a as usize).collect();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "a slot handed out twice");
        for a in held {
            unsafe { p.dealloc(a, BLOCK) };
        }
    }

    #[test]
    fn an_empty_list_falls_back_to_the_system_and_a_used_up_region_too() {
        let (p, mut st) = pool(10);
        // Not refilled: the system serves, and it is counted.
        let a = unsafe { p.alloc(BLOCK) };
        assert!(!a.is_null() && !p.in_region(a as usize));
        assert_eq!(p.stats().missed, 1);
        unsafe { p.dealloc(a, BLOCK) };
        assert_eq!(p.refill(&mut st), 8);
        let mut held: Vec<*mut u8> = (0..8).map(|_| unsafe { p.alloc(BLOCK) }).collect();
        assert!(held.iter().all(|&a| p.in_region(a as usize)));
        // Two slots are left in the region, then it is used up.
        assert_eq!(p.refill(&mut st), 2);
        assert_eq!(p.refill(&mut st), 0);
        held.extend((0..3).map(|_| unsafe { p.alloc(BLOCK) }));
        assert!(
            !p.in_region(held[10] as usize),
            "an 11th slot in a 10-slot region"
        );
        for a in held {
            unsafe { p.dealloc(a, BLOCK) };
        }
        assert_eq!(p.stats().free, 10);
    }

    #[test]
    fn a_surplus_goes_back_to_the_kernel_and_is_faulted_in_again_first() {
        let (p, mut st) = pool(64);
        // 24 slots out, then all back: 24 free, above `high` (16).
        let mut held = Vec::new();
        while held.len() < 24 {
            p.refill(&mut st);
            held.push(unsafe { p.alloc(BLOCK) });
        }
        for &a in &held {
            unsafe { p.dealloc(a, BLOCK) };
        }
        let free = p.stats().free;
        assert!(free > SMALL.high, "{free}");
        assert_eq!(p.trim(&mut st), free - SMALL.target);
        assert_eq!(p.stats().free, SMALL.target);
        let gone: Vec<usize> = st.spare.clone();
        assert!(
            gone.iter().all(|&a| !resident(a as *mut u8)),
            "returned slots still resident"
        );
        // Below `low` again: the refill takes the returned slots first and
        // they come back resident.
        let bump = st.bump;
        let mut out: Vec<*mut u8> = (0..6).map(|_| unsafe { p.alloc(BLOCK) }).collect();
        p.refill(&mut st);
        assert_eq!(st.bump, bump, "fresh slots used while returned ones waited");
        assert!(gone.iter().any(|a| !st.spare.contains(a)));
        out.extend((0..8).map(|_| unsafe { p.alloc(BLOCK) }));
        assert!(out.iter().all(|&a| resident(a)));
        for a in out {
            unsafe { p.dealloc(a, BLOCK) };
        }
    }

    #[test]
    fn the_refiller_restocks_below_low_without_being_asked_twice() {
        let p: &'static ImagePool = Box::leak(Box::new(ImagePool::new()));
        assert!(p.reserve(1024 * SLOT, SMALL));
        let mut st = Refill::default();
        p.refill(&mut st);
        let h = std::thread::spawn(move || p.run(st));
        let held: Vec<*mut u8> = (0..6).map(|_| unsafe { p.alloc(BLOCK) }).collect();
        // Two left, below `low`: the refiller was kicked and fills to 8.
        let mut waited = 0;
        while p.stats().free < SMALL.target {
            std::thread::sleep(Duration::from_millis(1));
            waited += 1;
            assert!(
                waited < 10_000,
                "the refiller never restocked: {:?}",
                p.stats()
            );
        }
        for a in held {
            unsafe { p.dealloc(a, BLOCK) };
        }
        p.stop();
        h.join().unwrap();
    }

    #[test]
    fn levels_follow_the_cache_within_their_bounds() {
        let l = Levels::for_cache(256 << 20);
        assert_eq!((l.low, l.target, l.high), (1024, 2048, 8192));
        let l = Levels::for_cache(32 << 20);
        assert_eq!((l.low, l.target, l.high), (256, 512, 2048));
        let l = Levels::for_cache(1 << 20);
        assert_eq!((l.low, l.target, l.high), (128, 256, 1024));
    }

    #[test]
    fn realloc_moves_between_the_pool_and_the_system() {
        let (p, mut st) = pool(64);
        p.refill(&mut st);
        let small = Layout::from_size_align(100, 8).unwrap();
        unsafe {
            let a = p.alloc(small);
            a.write_bytes(3, 100);
            // Grown to a block: into the pool, bytes kept.
            let b = p.realloc(a, small, SLOT);
            assert!(p.in_region(b as usize));
            assert!(std::slice::from_raw_parts(b, 100).iter().all(|&x| x == 3));
            let blk = Layout::from_size_align(SLOT, 8).unwrap();
            assert_eq!(p.realloc(b, blk, SLOT), b);
            // Grown beyond: out of the pool, the slot back on the list.
            let free = p.stats().free;
            let c = p.realloc(b, blk, 2 * SLOT);
            assert!(!p.in_region(c as usize));
            assert_eq!(p.stats().free, free + 1);
            assert!(std::slice::from_raw_parts(c, 100).iter().all(|&x| x == 3));
            p.dealloc(c, Layout::from_size_align(2 * SLOT, 8).unwrap());
        }
    }
}
