//! An in-memory device.
//!
//! The medium of tests, of the crash explorer and of in-process benchmarks.
//! Blocks are kept sparse (a block never written, or last written with
//! zeros, costs nothing), each as an `Arc<[u8]>` so that a copy of the whole
//! device ([`MemDevice::snapshot`]) shares block images instead of copying
//! them: the explorer takes one snapshot per recorded workload.
//!
//! There is no volatile cache here: a write is on the "medium" when `write`
//! returns. `durable()` still follows the flush / FUA rule of the trait, so a
//! protocol sees the same notifications as on a real disk; to lose
//! unflushed writes, wrap the device in a
//! [`WriteCacheDevice`](crate::WriteCacheDevice).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::counting::Bookkeeping;
use crate::{
    check_block_size, check_request, BlockClass, BlockDevice, Counters, DevError, Ticket,
    WriteFlags,
};

/// An in-memory block device.
pub struct MemDevice {
    block_size: u32,
    block_count: u64,
    /// Block number -> image; absent means all zeros.
    blocks: RwLock<HashMap<u64, Arc<[u8]>>>,
    book: Bookkeeping,
}

impl std::fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDevice")
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("populated_blocks", &self.read_map().len())
            .finish()
    }
}

/// True if every byte is zero (word by word: a byte loop that may stop
/// early is not vectorized).
pub fn is_zero(data: &[u8]) -> bool {
    // SAFETY: every bit pattern is a valid u64, and `align_to` only yields
    // correctly aligned words inside `data`.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    // OR-reduced 256 bytes at a time (the compiler vectorizes a fold with
    // no early exit), stopping at the first chunk that is not zero.
    head.iter().all(|&b| b == 0)
        && words
            .chunks(32)
            .all(|c| c.iter().fold(0, |acc, &w| acc | w) == 0)
        && tail.iter().all(|&b| b == 0)
}

impl MemDevice {
    /// A zero-filled device of `block_count` blocks of `block_size` bytes.
    pub fn new(block_size: u32, block_count: u64) -> Result<MemDevice, DevError> {
        check_block_size(block_size)?;
        if block_count.checked_mul(block_size as u64).is_none() {
            return Err(DevError::Geometry(format!(
                "{block_count} blocks of {block_size} bytes overflow a 64-bit size"
            )));
        }
        Ok(MemDevice {
            block_size,
            block_count,
            blocks: RwLock::new(HashMap::new()),
            book: Bookkeeping::new(),
        })
    }

    /// A device holding a copy of `image` (whose length must be a multiple of
    /// `block_size`). All-zero blocks are not stored.
    pub fn from_image(block_size: u32, image: &[u8]) -> Result<MemDevice, DevError> {
        check_block_size(block_size)?;
        let bs = block_size as usize;
        if !image.len().is_multiple_of(bs) {
            return Err(DevError::Geometry(format!(
                "image of {} bytes is not a multiple of the block size {block_size}",
                image.len()
            )));
        }
        let dev = MemDevice::new(block_size, (image.len() / bs) as u64)?;
        {
            let mut map = dev.write_map();
            for (i, chunk) in image.chunks_exact(bs).enumerate() {
                if !is_zero(chunk) {
                    map.insert(i as u64, Arc::from(chunk));
                }
            }
        }
        Ok(dev)
    }

    /// A device holding a copy of everything on `src` (read with class
    /// `Other`, in chunks). Used to load an image file into memory.
    pub fn load(src: &dyn BlockDevice) -> io::Result<MemDevice> {
        let bs = src.block_size();
        let dev = MemDevice::new(bs, src.block_count())?;
        const CHUNK_BLOCKS: u64 = 256;
        let mut buf = vec![0u8; CHUNK_BLOCKS as usize * bs as usize];
        let mut block = 0;
        let total = src.block_count();
        let mut map = dev.write_map();
        while block < total {
            let n = CHUNK_BLOCKS.min(total - block);
            let buf = &mut buf[..n as usize * bs as usize];
            src.read(block, buf, BlockClass::Other)?;
            for (i, chunk) in buf.chunks_exact(bs as usize).enumerate() {
                if !is_zero(chunk) {
                    map.insert(block + i as u64, Arc::from(chunk));
                }
            }
            block += n;
        }
        drop(map);
        Ok(dev)
    }

    /// The whole device as one byte vector.
    pub fn to_image(&self) -> Vec<u8> {
        let bs = self.block_size as usize;
        let len = usize::try_from(self.block_count * bs as u64).expect("image fits in memory");
        let mut out = vec![0u8; len];
        for (&b, data) in self.read_map().iter() {
            let off = b as usize * bs;
            out[off..off + bs].copy_from_slice(data);
        }
        out
    }

    /// A new device with the same contents (block images shared, not
    /// copied), fresh counters and tickets.
    pub fn snapshot(&self) -> MemDevice {
        MemDevice {
            block_size: self.block_size,
            block_count: self.block_count,
            blocks: RwLock::new(self.read_map().clone()),
            book: Bookkeeping::new(),
        }
    }

    /// The stored image of one block, or `None` if it is all zeros (or past
    /// the end). Not counted.
    pub fn block(&self, block: u64) -> Option<Arc<[u8]>> {
        self.read_map().get(&block).cloned()
    }

    /// Sets one block's image without counting or ticketing it: for building
    /// a state (the crash explorer applies recorded writes this way).
    pub fn put_block(&self, block: u64, data: Arc<[u8]>) {
        assert!(block < self.block_count, "block {block} past the end");
        assert_eq!(data.len(), self.block_size as usize, "block image size");
        let mut map = self.write_map();
        if is_zero(&data) {
            map.remove(&block);
        } else {
            map.insert(block, data);
        }
    }

    /// One write request of `parts` (each whole blocks, or the request
    /// is refused) from `block` on, one stored image per block.
    fn write_parts(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        check_request(self.block_size, self.block_count, block, len)?;
        let bs = self.block_size as usize;
        self.book.write(flags, len as u64, |_| {
            let mut map = self.write_map();
            let chunks = parts.iter().flat_map(|p| p.chunks_exact(bs));
            for (i, chunk) in chunks.enumerate() {
                let b = block + i as u64;
                if is_zero(chunk) {
                    map.remove(&b);
                } else {
                    map.insert(b, Arc::from(chunk));
                }
            }
            Ok(())
        })
    }

    /// Block numbers that hold non-zero data, ascending.
    pub fn populated_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.read_map().keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn read_map(&self) -> RwLockReadGuard<'_, HashMap<u64, Arc<[u8]>>> {
        // Map updates are single inserts/removes: a panic cannot leave it
        // half-updated, so a poisoned lock is still usable.
        self.blocks.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_map(&self) -> RwLockWriteGuard<'_, HashMap<u64, Arc<[u8]>>> {
        self.blocks.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl BlockDevice for MemDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        check_request(self.block_size, self.block_count, block, buf.len())?;
        let bs = self.block_size as usize;
        {
            let map = self.read_map();
            for (i, chunk) in buf.chunks_exact_mut(bs).enumerate() {
                match map.get(&(block + i as u64)) {
                    Some(data) => chunk.copy_from_slice(data),
                    None => chunk.fill(0),
                }
            }
        }
        self.book.record_read(class, buf.len() as u64);
        Ok(())
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        self.write_parts(block, &[data], flags)
    }

    fn write_vectored(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        let bs = self.block_size as usize;
        if parts.iter().any(|p| p.len() % bs != 0) {
            return crate::write_joined(self, block, parts, flags);
        }
        // Whole blocks in every part: stored from the parts as they are,
        // with no joined copy in between.
        self.write_parts(block, parts, flags)
    }

    fn flush(&self) -> io::Result<()> {
        self.book.flush(|| Ok(()))
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

    #[test]
    fn a_vectored_write_is_the_joined_write() {
        let a = MemDevice::new(1024, 16).unwrap();
        let b = MemDevice::new(1024, 16).unwrap();
        let x: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
        let zeros = vec![0u8; 1024];
        let y = vec![7u8; 1024];
        let f = WriteFlags::new(BlockClass::Data);
        a.write(5, &[1u8; 1024], f).unwrap();
        b.write(5, &[1u8; 1024], f).unwrap();
        a.write_vectored(3, &[&x, &zeros, &y], f).unwrap();
        b.write(3, &[x.as_slice(), &zeros, &y].concat(), f).unwrap();
        assert_eq!(a.to_image(), b.to_image());
        assert_eq!(a.populated_blocks(), vec![3, 4, 6]);
        assert_eq!(a.counters(), b.counters());
        // Past the end: refused, nothing written.
        assert!(a.write_vectored(14, &[&x, &y], f).is_err());
        assert_eq!(a.populated_blocks(), vec![3, 4, 6]);
    }

    #[test]
    fn read_back_and_zero_fill() {
        let d = MemDevice::new(1024, 16).unwrap();
        let mut buf = vec![0xffu8; 2048];
        d.read(3, &mut buf, BlockClass::Data).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        let data: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
        d.write(3, &data, WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.read(3, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf, data);
        let mut one = vec![0u8; 1024];
        d.read(4, &mut one, BlockClass::Data).unwrap();
        assert_eq!(one, data[1024..]);
        assert_eq!(d.populated_blocks(), vec![3, 4]);
    }

    #[test]
    fn bad_requests_are_errors() {
        let d = MemDevice::new(1024, 4).unwrap();
        let mut buf = vec![0u8; 1024];
        let e = d.read(4, &mut buf, BlockClass::Data).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = d.read(u64::MAX, &mut buf, BlockClass::Data).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = d.read(0, &mut buf[..100], BlockClass::Data).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = d
            .write(3, &[1u8; 2048], WriteFlags::new(BlockClass::Data))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            d.counters().total().writes,
            0,
            "failed requests are not counted"
        );
        assert!(MemDevice::new(1000, 4).is_err());
        assert!(MemDevice::from_image(1024, &[0u8; 1500]).is_err());
    }

    #[test]
    fn image_round_trip_and_sparse_zeros() {
        let mut img = vec![0u8; 8 * 1024];
        img[5 * 1024 + 7] = 9;
        img[0] = 1;
        let d = MemDevice::from_image(1024, &img).unwrap();
        assert_eq!(d.block_count(), 8);
        assert_eq!(d.populated_blocks(), vec![0, 5]);
        assert_eq!(d.to_image(), img);
        d.write(5, &[0u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert_eq!(d.populated_blocks(), vec![0]);
        let loaded = MemDevice::load(&d).unwrap();
        assert_eq!(loaded.to_image(), d.to_image());
    }

    #[test]
    fn snapshot_is_independent() {
        let d = MemDevice::new(1024, 4).unwrap();
        d.write(1, &[7u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        let s = d.snapshot();
        d.write(1, &[8u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert_eq!(s.block(1).unwrap()[0], 7);
        assert_eq!(d.block(1).unwrap()[0], 8);
        assert_eq!(s.counters().total().writes, 0);
    }

    #[test]
    fn counters_and_durability() {
        let d = MemDevice::new(1024, 16).unwrap();
        let t1 = d
            .write(0, &[1u8; 4096], WriteFlags::new(BlockClass::InodeTable))
            .unwrap();
        assert_eq!(d.durable(), 0, "a plain write is not durable");
        d.flush().unwrap();
        assert_eq!(d.durable(), t1);
        let t2 = d
            .write(8, &[2u8; 1024], WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        assert_eq!(d.durable(), t2, "FUA after a flush is durable at once");
        let t3 = d
            .write(9, &[3u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        let _t4 = d
            .write(10, &[3u8; 1024], WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        assert_eq!(d.durable(), t2, "FUA does not cover an earlier plain write");
        d.flush().unwrap();
        assert!(d.durable() > t3);
        let mut buf = vec![0u8; 1024];
        d.read(0, &mut buf, BlockClass::InodeTable).unwrap();
        let c = d.counters();
        let it = c.class(BlockClass::InodeTable);
        assert_eq!(
            (it.writes, it.write_bytes, it.reads, it.read_bytes),
            (1, 4096, 1, 1024)
        );
        assert_eq!(c.class(BlockClass::Journal).fua_writes, 2);
        assert_eq!(c.flushes, 2);
    }
}
