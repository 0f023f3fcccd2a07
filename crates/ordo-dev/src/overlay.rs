//! A copy-on-write overlay over a shared, read-only base.
//!
//! The crash explorer checks thousands of states that differ from one base
//! image by a few dozen blocks. Copying the base for each would dominate the
//! run; an overlay costs only the blocks it changes. Reads fall through to
//! the base unless the block was written; writes (and blocks put by the
//! explorer) go to a private map. The base is never written: it is shared
//! by every state, possibly across threads.
//!
//! [`OverlayDevice::materialize_to_file`] writes the whole image out for
//! tools that need a file (e2fsck, the kernel), sparsely: runs of zero
//! blocks become holes, and over a [`MemDevice`] base only its populated
//! blocks are visited.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::counting::Bookkeeping;
use crate::mem::{is_zero, MemDevice};
use crate::{check_request, BlockClass, BlockDevice, Counters, Ticket, WriteFlags};

enum Base {
    /// Read block images directly, without going through (and counting on)
    /// the base's `read`.
    Mem(Arc<MemDevice>),
    Dyn(Arc<dyn BlockDevice>),
}

/// A copy-on-write view of a base device.
pub struct OverlayDevice {
    base: Base,
    block_size: u32,
    block_count: u64,
    /// Blocks written through the overlay: block -> image (zeros included,
    /// since they hide the base).
    blocks: RwLock<HashMap<u64, Arc<[u8]>>>,
    book: Bookkeeping,
}

impl std::fmt::Debug for OverlayDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverlayDevice")
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("written_blocks", &self.read_map().len())
            .finish()
    }
}

/// Longest run written with one `pwrite` when materializing.
const MATERIALIZE_RUN_BLOCKS_MAX: u64 = 256;

impl OverlayDevice {
    /// An overlay over any device.
    pub fn new(base: Arc<dyn BlockDevice>) -> Self {
        Self::with_base(base.block_size(), base.block_count(), Base::Dyn(base))
    }

    /// An overlay over a memory device: reads of unwritten blocks share the
    /// base's images, and materializing visits only populated blocks.
    pub fn over_mem(base: Arc<MemDevice>) -> Self {
        Self::with_base(base.block_size(), base.block_count(), Base::Mem(base))
    }

    fn with_base(block_size: u32, block_count: u64, base: Base) -> Self {
        OverlayDevice {
            base,
            block_size,
            block_count,
            blocks: RwLock::new(HashMap::new()),
            book: Bookkeeping::new(),
        }
    }

    fn read_map(&self) -> RwLockReadGuard<'_, HashMap<u64, Arc<[u8]>>> {
        // Single inserts only: a poisoned map is still consistent.
        self.blocks.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_map(&self) -> RwLockWriteGuard<'_, HashMap<u64, Arc<[u8]>>> {
        self.blocks.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets one block without counting it (for building a crash state).
    /// The image is shared, not copied.
    pub fn put_block(&self, block: u64, data: Arc<[u8]>) {
        assert!(block < self.block_count, "block {block} past the end");
        assert_eq!(data.len(), self.block_size as usize, "block image size");
        self.write_map().insert(block, data);
    }

    /// Sets `data.len() / block_size` blocks from `block` without counting.
    pub fn put(&self, block: u64, data: &[u8]) -> io::Result<()> {
        check_request(self.block_size, self.block_count, block, data.len())?;
        let mut map = self.write_map();
        for (i, chunk) in data.chunks_exact(self.block_size as usize).enumerate() {
            map.insert(block + i as u64, Arc::from(chunk));
        }
        Ok(())
    }

    /// Blocks written through the overlay, ascending.
    pub fn written_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.read_map().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Number of blocks written through the overlay.
    pub fn written_count(&self) -> usize {
        self.read_map().len()
    }

    /// Forgets every write: the overlay shows the base again.
    pub fn reset(&self) {
        self.write_map().clear();
    }

    /// Reads blocks from the base into `buf` (no overlay).
    fn read_base(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        match &self.base {
            Base::Mem(m) => {
                let bs = self.block_size as usize;
                for (i, chunk) in buf.chunks_exact_mut(bs).enumerate() {
                    match m.block(block + i as u64) {
                        Some(d) => chunk.copy_from_slice(&d),
                        None => chunk.fill(0),
                    }
                }
                Ok(())
            }
            Base::Dyn(d) => d.read(block, buf, BlockClass::Other),
        }
    }

    /// Reads without counting: the overlay's own blocks, the base elsewhere.
    fn read_uncounted(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let bs = self.block_size as usize;
        let n = buf.len() / bs;
        let map = self.read_map();
        let mut i = 0;
        while i < n {
            if let Some(d) = map.get(&(block + i as u64)) {
                buf[i * bs..(i + 1) * bs].copy_from_slice(d);
                i += 1;
                continue;
            }
            // A run of blocks the overlay does not hold: one base read.
            let start = i;
            while i < n && !map.contains_key(&(block + i as u64)) {
                i += 1;
            }
            self.read_base(block + start as u64, &mut buf[start * bs..i * bs])?;
        }
        Ok(())
    }

    /// The whole image as a memory device (base blocks shared where the base
    /// is a [`MemDevice`]).
    pub fn to_mem(&self) -> io::Result<MemDevice> {
        let out = match &self.base {
            Base::Mem(m) => m.snapshot(),
            Base::Dyn(d) => MemDevice::load(&**d)?,
        };
        for (&b, d) in self.read_map().iter() {
            out.put_block(b, d.clone());
        }
        Ok(out)
    }

    /// Writes the full image to `path` (created or truncated), sparse: zero
    /// blocks are left as holes.
    pub fn materialize_to_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let bs = self.block_size as u64;
        let file = std::fs::File::create(path.as_ref())?;
        file.set_len(self.block_count * bs)?;
        let mut run_buf = vec![0u8; (MATERIALIZE_RUN_BLOCKS_MAX * bs) as usize];
        match &self.base {
            Base::Mem(m) => {
                // Only blocks that may be non-zero, grouped in runs.
                let mut candidates = m.populated_blocks();
                candidates.extend(self.read_map().keys().copied());
                candidates.sort_unstable();
                candidates.dedup();
                let mut i = 0;
                while i < candidates.len() {
                    let start = candidates[i];
                    let mut end = start + 1;
                    i += 1;
                    while i < candidates.len()
                        && candidates[i] == end
                        && end - start < MATERIALIZE_RUN_BLOCKS_MAX
                    {
                        end += 1;
                        i += 1;
                    }
                    self.materialize_run(&file, start, end, &mut run_buf)?;
                }
            }
            Base::Dyn(_) => {
                let mut start = 0;
                while start < self.block_count {
                    let end = (start + MATERIALIZE_RUN_BLOCKS_MAX).min(self.block_count);
                    self.materialize_run(&file, start, end, &mut run_buf)?;
                    start = end;
                }
            }
        }
        Ok(())
    }

    /// Copies blocks `start..end` to `file`, skipping zero blocks.
    fn materialize_run(
        &self,
        file: &std::fs::File,
        start: u64,
        end: u64,
        run_buf: &mut [u8],
    ) -> io::Result<()> {
        let bs = self.block_size as u64;
        let n = end - start;
        let buf = &mut run_buf[..(n * bs) as usize];
        self.read_uncounted(start, buf)?;
        let blk = |k: u64| &buf[(k * bs) as usize..((k + 1) * bs) as usize];
        let mut j = 0u64;
        while j < n {
            if is_zero(blk(j)) {
                j += 1;
                continue;
            }
            let s = j;
            while j < n && !is_zero(blk(j)) {
                j += 1;
            }
            file.write_all_at(&buf[(s * bs) as usize..(j * bs) as usize], (start + s) * bs)?;
        }
        Ok(())
    }
}

impl BlockDevice for OverlayDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        check_request(self.block_size, self.block_count, block, buf.len())?;
        self.read_uncounted(block, buf)?;
        self.book.record_read(class, buf.len() as u64);
        Ok(())
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        check_request(self.block_size, self.block_count, block, data.len())?;
        self.book.write(flags, data.len() as u64, |_| {
            let mut map = self.write_map();
            for (i, chunk) in data.chunks_exact(self.block_size as usize).enumerate() {
                map.insert(block + i as u64, Arc::from(chunk));
            }
            Ok(())
        })
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

    fn base() -> Arc<MemDevice> {
        let m = MemDevice::new(1024, 64).unwrap();
        m.put_block(1, Arc::from(vec![1u8; 1024]));
        m.put_block(2, Arc::from(vec![2u8; 1024]));
        m.put_block(60, Arc::from(vec![60u8; 1024]));
        Arc::new(m)
    }

    #[test]
    fn reads_fall_through_and_writes_never_reach_base() {
        let b = base();
        let before = b.to_image();
        for o in [
            OverlayDevice::over_mem(b.clone()),
            OverlayDevice::new(b.clone() as Arc<dyn BlockDevice>),
        ] {
            let mut buf = vec![0u8; 3 * 1024];
            o.read(0, &mut buf, BlockClass::Data).unwrap();
            assert_eq!(&buf[1024..2048], &[1u8; 1024][..]);
            o.write(2, &[9u8; 2048], WriteFlags::new(BlockClass::Data))
                .unwrap();
            o.write(1, &[0u8; 1024], WriteFlags::new(BlockClass::Data))
                .unwrap();
            o.read(0, &mut buf, BlockClass::Data).unwrap();
            assert!(
                buf[..2048].iter().all(|&x| x == 0),
                "a zero write hides the base"
            );
            assert_eq!(&buf[2048..], &[9u8; 1024][..]);
            assert_eq!(o.written_blocks(), vec![1, 2, 3]);
            assert_eq!(o.counters().class(BlockClass::Data).writes, 2);
            assert_eq!(b.to_image(), before, "base untouched");
            o.reset();
            o.read(1, &mut buf[..1024], BlockClass::Data).unwrap();
            assert_eq!(&buf[..1024], &[1u8; 1024][..]);
        }
        assert_eq!(b.counters().total().writes, 0);
    }

    #[test]
    fn materialize_is_exact_and_sparse() {
        let b = base();
        let o = OverlayDevice::over_mem(b.clone());
        o.put_block(2, Arc::from(vec![0u8; 1024]));
        o.put(10, &[5u8; 3 * 1024]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.img");
        o.materialize_to_file(&p).unwrap();
        let img = std::fs::read(&p).unwrap();
        let mut want = b.to_image();
        want[2048..3072].fill(0);
        want[10 * 1024..13 * 1024].fill(5);
        assert_eq!(img, want);
        assert_eq!(o.to_mem().unwrap().to_image(), want);
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&p).unwrap();
        assert!(m.blocks() * 512 < 64 * 1024, "holes for zero blocks");
        // The same through a generic base.
        let g = OverlayDevice::new(b.clone() as Arc<dyn BlockDevice>);
        g.put(2, &[0u8; 1024]).unwrap();
        g.put(10, &[5u8; 3 * 1024]).unwrap();
        let p2 = dir.path().join("state2.img");
        g.materialize_to_file(&p2).unwrap();
        assert_eq!(std::fs::read(&p2).unwrap(), want);
    }
}
