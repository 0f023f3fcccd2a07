//! A device that says its write cache is write-through: the file system's
//! `-o nobarrier`.
//!
//! Linux drops a flush and clears FUA for a queue whose write cache is
//! declared write-through (`/sys/block/X/queue/write_cache`), and ext4's
//! `nobarrier` issues neither; a disk with a volatile cache then keeps
//! every write in it until it destages on its own. [`NoBarrierDevice`] is
//! that declaration: every flush returns at once without reaching the
//! device below, every FUA write goes down as a plain write, and every
//! acknowledged write is reported durable. It is what the file systems of
//! the papers ran on by default (ext3's `barrier=0`, ext2 which never
//! flushed), so their figures can be reproduced; it breaks every
//! durability promise on a disk with a volatile cache, which is why the
//! mount option says so.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{BlockClass, BlockDevice, Counters, Ticket, Timing, WriteFlags};

/// `inner` with its flushes dropped and its FUA writes made plain.
pub struct NoBarrierDevice<D: BlockDevice + ?Sized> {
    /// Flushes asked for and not passed down.
    dropped_flushes: AtomicU64,
    /// The newest ticket `inner` handed out: with no barrier, everything
    /// acknowledged counts as durable.
    last: AtomicU64,
    inner: D,
}

impl<D: BlockDevice> NoBarrierDevice<D> {
    /// Wrap `inner`.
    pub fn new(inner: D) -> Self {
        let last = inner.durable();
        NoBarrierDevice {
            dropped_flushes: AtomicU64::new(0),
            last: AtomicU64::new(last),
            inner,
        }
    }
}

impl<D: BlockDevice + ?Sized> NoBarrierDevice<D> {
    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// How many flushes were asked for and dropped.
    pub fn dropped_flushes(&self) -> u64 {
        self.dropped_flushes.load(Ordering::Relaxed)
    }

    fn acked(&self, t: Ticket) -> Ticket {
        self.last.fetch_max(t, Ordering::AcqRel);
        t
    }
}

fn plain(flags: WriteFlags) -> WriteFlags {
    WriteFlags {
        fua: false,
        ..flags
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for NoBarrierDevice<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        self.inner.read(block, buf, class)
    }
    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        self.inner
            .write(block, data, plain(flags))
            .map(|t| self.acked(t))
    }
    fn write_vectored(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        self.inner
            .write_vectored(block, parts, plain(flags))
            .map(|t| self.acked(t))
    }
    fn flush(&self) -> io::Result<()> {
        self.dropped_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn durable(&self) -> Ticket {
        self.last.load(Ordering::Acquire).max(self.inner.durable())
    }
    /// The counters of the device below: what reached it (no flush).
    fn counters(&self) -> Counters {
        self.inner.counters()
    }
    fn timing(&self) -> Option<&dyn Timing> {
        self.inner.timing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemDevice, WriteCacheDevice};

    #[test]
    fn flushes_do_not_reach_the_disk_and_fua_is_plain() {
        let disk = std::sync::Arc::new(WriteCacheDevice::new(MemDevice::new(4096, 64).unwrap()));
        let d = NoBarrierDevice::new(disk.clone());
        let block = vec![7u8; 4096];
        let t1 = d
            .write(3, &block, WriteFlags::new(BlockClass::Data))
            .unwrap();
        let t2 = d
            .write(4, &block, WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        d.flush().unwrap();
        assert!(t2 > t1);
        // Reported durable, as a write-through cache would be...
        assert_eq!(d.durable(), t2);
        assert_eq!(d.dropped_flushes(), 1);
        // ...but the disk below saw no flush and no FUA: both are volatile.
        let c = disk.counters();
        assert_eq!(c.flushes, 0);
        assert_eq!(c.total().writes, 2);
        assert_eq!(c.total().fua_writes, 0);
        assert!(disk.durable() < t1);
    }
}
