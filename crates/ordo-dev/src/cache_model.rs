//! A model of a disk's volatile write cache.
//!
//! Real disks acknowledge a write once it is in their cache and persist it
//! later, in any order; a power cut loses whatever had not reached the
//! medium. This wrapper makes that visible: an acknowledged write is kept in
//! a pending set and reaches the inner device (the "medium") only on
//! `flush`, or at once when written FUA. Reads see the newest acknowledged
//! data, as on a real disk.
//!
//! [`WriteCacheDevice::crash`] answers "what could the medium hold if power
//! were cut now?": every flushed or FUA write, plus a seeded subset of the
//! pending ones. For one block written several times while pending, the
//! medium holds the original or one of the pending versions (a disk never
//! writes an older cached version over a newer one). With `torn_probability`
//! a surviving version may be torn: each of its sectors independently holds
//! the new bytes or what was there before, at `sector_bytes` granularity
//! (512 on most disks: the unit a disk writes atomically).
//!
//! The same seed always gives the same image.
//!
//! A real cache is also bounded, and destages on its own: with
//! [`WriteCacheDevice::with_capacity`], once more than `capacity` versions
//! are pending, the oldest (by ticket) are written to the medium until half
//! remain, and [`durable`](BlockDevice::durable) moves past them without
//! any flush. That is the durability notification OptFS's protocol waits
//! for: a commit can become durable because the disk destaged it, and the
//! protocol then owes it no flush.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::counting::Bookkeeping;
use crate::mem::MemDevice;
use crate::{check_request, BlockClass, BlockDevice, Counters, Ticket, WriteFlags};

/// How a power cut treats pending writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrashPolicy {
    /// Chance that each pending version reached the medium (0.0 = lose every
    /// pending write, 1.0 = keep every one).
    pub keep_probability: f64,
    /// Chance that a surviving version is torn at sector granularity.
    pub torn_probability: f64,
    /// Atomic write unit of the modeled disk, in bytes (divides the block
    /// size).
    pub sector_bytes: u32,
}

impl Default for CrashPolicy {
    /// Each pending write survives with probability 1/2, never torn.
    fn default() -> Self {
        CrashPolicy {
            keep_probability: 0.5,
            torn_probability: 0.0,
            sector_bytes: 512,
        }
    }
}

impl CrashPolicy {
    /// Every pending write is lost.
    pub fn lose_all() -> Self {
        CrashPolicy {
            keep_probability: 0.0,
            ..Self::default()
        }
    }
    /// Every pending write survives (the best case).
    pub fn keep_all() -> Self {
        CrashPolicy {
            keep_probability: 1.0,
            ..Self::default()
        }
    }
}

/// One acknowledged, not yet persisted version of a block.
#[derive(Clone, Debug)]
struct Version {
    ticket: Ticket,
    class: BlockClass,
    data: Arc<[u8]>,
}

/// A volatile write cache in front of `D`.
pub struct WriteCacheDevice<D: BlockDevice> {
    inner: D,
    /// Block -> pending versions, oldest first.
    pending: Mutex<BTreeMap<u64, Vec<Version>>>,
    book: Bookkeeping,
    /// Most pending versions before the cache destages on its own
    /// (`None`: only a flush or a FUA write reaches the medium).
    capacity: Option<usize>,
    /// Versions destaged without a flush, for tests and reports.
    destaged: std::sync::atomic::AtomicU64,
}

impl<D: BlockDevice> WriteCacheDevice<D> {
    /// An empty cache in front of `inner`.
    pub fn new(inner: D) -> Self {
        WriteCacheDevice {
            inner,
            pending: Mutex::new(BTreeMap::new()),
            book: Bookkeeping::new(),
            capacity: None,
            destaged: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A cache that holds at most `capacity` pending versions (at least
    /// 2): a write that goes past it destages the oldest versions, in
    /// ticket order, to the medium until `capacity / 2` remain, and the
    /// durable horizon moves to just before the oldest still pending.
    pub fn with_capacity(inner: D, capacity: usize) -> Self {
        WriteCacheDevice {
            capacity: Some(capacity.max(2)),
            ..Self::new(inner)
        }
    }

    /// Versions written to the medium by the cache on its own (not by a
    /// flush or a FUA write).
    pub fn destaged_versions(&self) -> u64 {
        self.destaged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The disk writes its whole cache back on its own, in ticket order,
    /// as a disk does when it is idle: no flush command is counted, yet
    /// every write so far becomes durable ([`durable`](BlockDevice::durable)
    /// moves, which is all a file system can observe of it).
    pub fn destage_all(&self) -> io::Result<()> {
        let mut pending = self.lock();
        if self.destage(&mut pending, 0)?.is_some() {
            self.inner.flush()?;
        }
        // Writes take this lock before their ticket, so none is in flight.
        self.book.destaged(self.book.last_issued());
        Ok(())
    }

    /// Destages the oldest pending versions until at most `keep` remain.
    /// Returns the ticket below which every write is now on the medium
    /// (every pending version left is newer), or `None` if nothing moved.
    fn destage(
        &self,
        pending: &mut BTreeMap<u64, Vec<Version>>,
        keep: usize,
    ) -> io::Result<Option<Ticket>> {
        let total: usize = pending.values().map(Vec::len).sum();
        if total <= keep {
            return Ok(None);
        }
        let mut order: Vec<(Ticket, u64)> = pending
            .iter()
            .flat_map(|(&b, vs)| vs.iter().map(move |v| (v.ticket, b)))
            .collect();
        order.sort_unstable();
        for &(_, block) in &order[..total - keep] {
            // Versions of one block leave oldest first, so the one to
            // write is always at the front.
            let vs = pending.get_mut(&block).expect("a pending block");
            let v = vs.remove(0);
            if vs.is_empty() {
                pending.remove(&block);
            }
            self.inner.write(block, &v.data, WriteFlags::new(v.class))?;
            self.destaged
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Some(
            order
                .get(total - keep)
                .map_or(order[total - 1].0, |o| o.0 - 1),
        ))
    }

    /// The medium.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Vec<Version>>> {
        // Each critical section leaves the map consistent between
        // statements, so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of distinct blocks with pending writes.
    pub fn pending_blocks(&self) -> usize {
        self.lock().len()
    }

    /// Tickets of the pending writes of one block, oldest first.
    pub fn pending_tickets(&self, block: u64) -> Vec<Ticket> {
        self.lock()
            .get(&block)
            .map(|v| v.iter().map(|x| x.ticket).collect())
            .unwrap_or_default()
    }

    /// The blocks a power cut would leave changed on the medium, with their
    /// images, ascending (deterministic in `seed`).
    pub fn crash_writes(
        &self,
        seed: u64,
        policy: CrashPolicy,
    ) -> io::Result<Vec<(u64, Arc<[u8]>)>> {
        let bs = self.inner.block_size();
        let sector = policy.sector_bytes as usize;
        if sector == 0 || !(bs as usize).is_multiple_of(sector) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "sector size {} does not divide the block size {bs}",
                    policy.sector_bytes
                ),
            ));
        }
        let pending = self.lock();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::new();
        for (&block, versions) in pending.iter() {
            // Which versions reached the medium, in order; the last one that
            // did is what the medium holds.
            let kept: Vec<usize> = (0..versions.len())
                .filter(|_| rng.gen_bool(policy.keep_probability.clamp(0.0, 1.0)))
                .collect();
            let Some(&last) = kept.last() else { continue };
            let new = &versions[last].data;
            if policy.torn_probability > 0.0
                && rng.gen_bool(policy.torn_probability.clamp(0.0, 1.0))
            {
                // Torn: each sector holds the new bytes or what the medium
                // held before this version (the previous surviving version,
                // or the flushed contents).
                let mut torn: Vec<u8> = match kept.len().checked_sub(2) {
                    Some(prev) => versions[kept[prev]].data.to_vec(),
                    None => {
                        let mut old = vec![0u8; bs as usize];
                        self.inner.read(block, &mut old, BlockClass::Other)?;
                        old
                    }
                };
                for (s, chunk) in torn.chunks_exact_mut(sector).enumerate() {
                    if rng.gen_bool(0.5) {
                        chunk.copy_from_slice(&new[s * sector..(s + 1) * sector]);
                    }
                }
                out.push((block, Arc::from(torn)));
            } else {
                out.push((block, new.clone()));
            }
        }
        Ok(out)
    }

    /// What the medium could hold after a power cut now: the inner device's
    /// contents plus [`crash_writes`](Self::crash_writes). The live device is
    /// not changed.
    pub fn crash(&self, seed: u64, policy: CrashPolicy) -> io::Result<MemDevice> {
        let image = MemDevice::load(&self.inner)?;
        for (block, data) in self.crash_writes(seed, policy)? {
            image.put_block(block, data);
        }
        Ok(image)
    }

    /// Cuts power on the live device: the surviving pending writes are
    /// written to the medium, the rest are dropped, and the cache is empty.
    /// The inner device then holds the post-crash state, ready to be
    /// mounted again.
    pub fn power_cut(&self, seed: u64, policy: CrashPolicy) -> io::Result<()> {
        let survivors = self.crash_writes(seed, policy)?;
        let mut pending = self.lock();
        for (block, data) in survivors {
            let class = pending
                .get(&block)
                .and_then(|v| v.last())
                .map_or(BlockClass::Other, |v| v.class);
            self.inner.write(block, &data, WriteFlags::new(class))?;
        }
        pending.clear();
        self.inner.flush()
    }
}

impl<D: BlockDevice> BlockDevice for WriteCacheDevice<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        let bs = self.block_size() as usize;
        check_request(self.block_size(), self.block_count(), block, buf.len())?;
        let pending = self.lock();
        self.inner.read(block, buf, class)?;
        for (i, chunk) in buf.chunks_exact_mut(bs).enumerate() {
            if let Some(v) = pending.get(&(block + i as u64)).and_then(|v| v.last()) {
                chunk.copy_from_slice(&v.data);
            }
        }
        drop(pending);
        self.book.record_read(class, buf.len() as u64);
        Ok(())
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        let bs = self.block_size() as usize;
        check_request(self.block_size(), self.block_count(), block, data.len())?;
        let mut pending = self.lock();
        self.book.write(flags, data.len() as u64, |ticket| {
            if flags.fua {
                // Straight to the medium; older cached versions of these
                // blocks are superseded (a disk never writes them over the
                // new data).
                self.inner.write(block, data, flags)?;
                for i in 0..(data.len() / bs) as u64 {
                    pending.remove(&(block + i));
                }
            } else {
                for (i, chunk) in data.chunks_exact(bs).enumerate() {
                    pending.entry(block + i as u64).or_default().push(Version {
                        ticket,
                        class: flags.class,
                        data: Arc::from(chunk),
                    });
                }
                if let Some(cap) = self.capacity {
                    let total: usize = pending.values().map(Vec::len).sum();
                    if total > cap {
                        if let Some(upto) = self.destage(&mut pending, cap / 2)? {
                            // The medium is the inner device: what reached
                            // it is durable once the inner device says so.
                            self.inner.flush()?;
                            self.book.destaged(upto);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn flush(&self) -> io::Result<()> {
        let mut pending = self.lock();
        self.book.flush(|| {
            // Write back the newest version of each block, in block order
            // (the order does not matter: nothing is durable until the inner
            // flush).
            while let Some((block, versions)) = pending.pop_first() {
                let v = versions.last().expect("pending entries are never empty");
                if let Err(e) = self.inner.write(block, &v.data, WriteFlags::new(v.class)) {
                    pending.insert(block, versions);
                    return Err(e);
                }
            }
            self.inner.flush()
        })
    }

    fn durable(&self) -> Ticket {
        self.book.durable()
    }

    fn counters(&self) -> Counters {
        self.book.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> WriteCacheDevice<MemDevice> {
        WriteCacheDevice::new(MemDevice::new(1024, 64).unwrap())
    }

    fn byte_at(img: &MemDevice, block: u64) -> u8 {
        img.block(block).map_or(0, |d| d[0])
    }

    #[test]
    fn unflushed_write_is_lost_when_dropped() {
        let d = dev();
        d.write(5, &[7u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        let mut buf = vec![0u8; 1024];
        d.read(5, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf[0], 7, "reads see acknowledged data");
        assert!(d.inner().block(5).is_none(), "not on the medium yet");
        assert_eq!(byte_at(&d.crash(1, CrashPolicy::lose_all()).unwrap(), 5), 0);
        assert_eq!(byte_at(&d.crash(1, CrashPolicy::keep_all()).unwrap(), 5), 7);
        // With probability 1/2, some seed drops it and some seed keeps it.
        let outcomes: Vec<u8> = (0..32)
            .map(|s| byte_at(&d.crash(s, CrashPolicy::default()).unwrap(), 5))
            .collect();
        assert!(
            outcomes.contains(&0) && outcomes.contains(&7),
            "{outcomes:?}"
        );
        assert_eq!(d.durable(), 0);
    }

    #[test]
    fn a_full_cache_destages_its_oldest_writes_and_reports_them_durable() {
        let d = WriteCacheDevice::with_capacity(MemDevice::new(1024, 64).unwrap(), 4);
        let w = |b: u64, v: u8| {
            d.write(b, &[v; 1024], WriteFlags::new(BlockClass::Data))
                .unwrap()
        };
        let t1 = w(1, 1);
        w(2, 2);
        w(1, 3); // a second version of block 1, newer than block 2's
        w(3, 4);
        assert_eq!(d.durable(), 0, "four versions fit");
        assert_eq!(d.destaged_versions(), 0);
        let t5 = w(4, 5);
        // Five pending: the three oldest (tickets 1..3) reach the medium.
        assert_eq!(d.destaged_versions(), 3);
        assert_eq!(d.durable(), t1 + 2);
        assert!(d.durable() < t5);
        assert_eq!(d.pending_blocks(), 2, "blocks 3 and 4 are still pending");
        let img = d.crash(7, CrashPolicy::lose_all()).unwrap();
        assert_eq!(
            byte_at(&img, 1),
            3,
            "the newest destaged version of block 1"
        );
        assert_eq!(byte_at(&img, 2), 2);
        assert_eq!(byte_at(&img, 3), 0, "still pending: lost");
        assert_eq!(byte_at(&img, 4), 0);
        // An idle disk writes the rest back: durable, with no flush counted.
        d.destage_all().unwrap();
        assert_eq!(d.durable(), t5);
        assert_eq!(d.pending_blocks(), 0);
        assert_eq!(d.counters().flushes, 0);
        assert_eq!(byte_at(&d.crash(7, CrashPolicy::lose_all()).unwrap(), 4), 5);
        // Without a capacity nothing moves on its own.
        let u = dev();
        for b in 0..32 {
            u.write(b, &[1u8; 1024], WriteFlags::new(BlockClass::Data))
                .unwrap();
        }
        assert_eq!(u.durable(), 0);
        assert_eq!(u.destaged_versions(), 0);
    }

    #[test]
    fn fua_writes_always_survive() {
        let d = dev();
        d.write(1, &[1u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.write(2, &[2u8; 1024], WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        // A FUA write supersedes an older pending version of the same block.
        d.write(1, &[3u8; 1024], WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        for seed in 0..16 {
            let img = d.crash(seed, CrashPolicy::lose_all()).unwrap();
            assert_eq!(byte_at(&img, 2), 2);
            assert_eq!(byte_at(&img, 1), 3);
        }
        assert_eq!(d.pending_blocks(), 0);
    }

    #[test]
    fn flush_makes_everything_durable() {
        let d = dev();
        let mut last = 0;
        for b in 0..10u64 {
            last = d
                .write(
                    b,
                    &[b as u8 + 1; 1024],
                    WriteFlags::new(BlockClass::InodeTable),
                )
                .unwrap();
        }
        assert_eq!(d.pending_blocks(), 10);
        d.flush().unwrap();
        assert_eq!(d.durable(), last);
        assert_eq!(d.pending_blocks(), 0);
        let img = d.crash(3, CrashPolicy::lose_all()).unwrap();
        for b in 0..10u64 {
            assert_eq!(byte_at(&img, b), b as u8 + 1);
        }
        assert_eq!(d.counters().class(BlockClass::InodeTable).writes, 10);
        assert_eq!(d.inner().counters().flushes, 1);
    }

    #[test]
    fn crash_is_deterministic_and_never_rolls_back_past_the_medium() {
        let d = dev();
        d.write(0, &[1u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.flush().unwrap();
        for v in 2..6u8 {
            d.write(0, &[v; 1024], WriteFlags::new(BlockClass::Data))
                .unwrap();
            d.write(v as u64, &[v; 2048], WriteFlags::new(BlockClass::Data))
                .unwrap();
        }
        assert_eq!(d.pending_tickets(0).len(), 4);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let a = d.crash_writes(seed, CrashPolicy::default()).unwrap();
            let b = d.crash_writes(seed, CrashPolicy::default()).unwrap();
            assert_eq!(a, b, "same seed, same state");
            let img = d.crash(seed, CrashPolicy::default()).unwrap();
            let v = byte_at(&img, 0);
            assert!(
                (1..6).contains(&v),
                "block 0 holds a version that was written: {v}"
            );
            seen.insert(v);
        }
        assert!(seen.len() >= 3, "several outcomes over seeds: {seen:?}");
    }

    #[test]
    fn torn_writes_mix_sectors() {
        let d = dev();
        d.write(4, &[0xaa; 1024], WriteFlags::new(BlockClass::Directory))
            .unwrap();
        let policy = CrashPolicy {
            keep_probability: 1.0,
            torn_probability: 1.0,
            sector_bytes: 512,
        };
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..32 {
            let img = d.crash(seed, policy).unwrap();
            let blk = img.block(4).map(|b| b.to_vec()).unwrap_or(vec![0; 1024]);
            let (s0, s1) = (blk[0], blk[512]);
            assert!(blk[..512].iter().all(|&x| x == s0));
            assert!(blk[512..].iter().all(|&x| x == s1));
            kinds.insert((s0, s1));
        }
        assert!(
            kinds.contains(&(0xaa, 0)) || kinds.contains(&(0, 0xaa)),
            "{kinds:?}"
        );
        let bad = CrashPolicy {
            sector_bytes: 300,
            ..policy
        };
        assert!(d.crash(0, bad).is_err());
    }

    #[test]
    fn power_cut_leaves_the_crash_state_on_the_medium() {
        let d = dev();
        d.write(9, &[9u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        let want = d.crash(11, CrashPolicy::default()).unwrap();
        d.power_cut(11, CrashPolicy::default()).unwrap();
        assert_eq!(d.pending_blocks(), 0);
        assert_eq!(d.inner().to_image(), want.to_image());
    }
}
