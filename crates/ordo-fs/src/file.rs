//! File data: read, write, truncate, fallocate, hole punching and
//! SEEK_DATA / SEEK_HOLE, over the extent tree.
//!
//! Data blocks go through the buffer cache like metadata (class `Data`), but
//! they are not metadata updates: each block written is reported to the
//! protocol as a [`DataWrite`] saying whether the block was allocated by
//! this write (`fresh`: its old contents belong to nobody, so a protocol
//! must get it to disk before the pointer to it) or overwritten in place.
//! Unwritten extents (from fallocate) read as zeros and become written when
//! data lands in them; their blocks count as fresh, since what is on disk
//! there is not the file's.
//!
//! The largest file is ext4's for extent-mapped files: 2^32 - 1 blocks
//! (16 TiB - 4 KiB with 4 KiB blocks); beyond it writes fail with EFBIG.

use ordo_dev::BlockClass;

use crate::delalloc::Delayed;
use crate::dir::InodeTree;
use crate::error::{errno, Result};
use crate::extent::{self, ExtentStore, Mapping, LBLK_END, ROOT_SIZE_BYTES};
use crate::layout::{ext as exc, ino as io, put32};
use crate::state::{Core, Owner};
use crate::types::{FallocFlags, SeekWhence};
use crate::update::{BlockOwner, DataWrite, Ino, InodeField, UpdateKind};

/// A run of file blocks a read left to its caller ([`Core::file_read_deferred`]):
/// `blocks` blocks from device block `pblk`, holding the file's bytes from
/// `byte` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeferredRead {
    /// First device block.
    pub pblk: u64,
    /// Number of blocks.
    pub blocks: u64,
    /// File offset of the first block's first byte.
    pub byte: u64,
}

/// Most blocks one read of file data asks the device for (1 MiB of 4 KiB
/// blocks: FUSE's largest read request with 256 pages).
const READ_RUN_BLOCKS: u64 = 256;

impl ExtentStore for InodeTree<'_> {
    fn block_size(&self) -> u32 {
        self.core.bs
    }
    fn blocks_count(&self) -> u64 {
        self.core.sbi.blocks_count
    }
    fn ino(&self) -> Ino {
        self.ino
    }
    fn root(&self) -> [u8; ROOT_SIZE_BYTES] {
        let (block, off) = self.core.inode_loc(self.ino);
        let mut r = [0u8; ROOT_SIZE_BYTES];
        if let Some(img) = self.core.cache.snapshot(block) {
            r.copy_from_slice(&img[off + io::BLOCK..off + io::BLOCK + ROOT_SIZE_BYTES]);
        }
        r
    }
    fn set_root(&mut self, offset: u32, bytes: &[u8], kind: UpdateKind) -> Result<()> {
        let (block, off) = self.core.inode_loc(self.ino);
        self.core.ensure(block, BlockClass::InodeTable)?;
        self.core.touch_inode(self.ino);
        self.core
            .modify(block, off + io::BLOCK + offset as usize, bytes, kind);
        self.core.csum_inode(self.ino);
        Ok(())
    }
    fn read_tree_block(&mut self, pblk: u64) -> Result<Vec<u8>> {
        let img = self.core.read_block(pblk, BlockClass::ExtentTree)?;
        self.core.seal.owners.insert(
            pblk,
            Owner::Extent {
                ino: self.ino,
                generation: self.generation,
            },
        );
        Ok(img.to_vec())
    }
    fn alloc_tree_block(&mut self, goal: u64) -> Result<u64> {
        let (p, _) = self.core.alloc_blocks(goal, 1)?;
        self.core.add_iblocks(self.ino, 1)?;
        Ok(p)
    }
    fn init_tree_block(&mut self, pblk: u64, image: &[u8]) -> Result<()> {
        self.core.seal.owners.insert(
            pblk,
            Owner::Extent {
                ino: self.ino,
                generation: self.generation,
            },
        );
        self.core.init_block(
            pblk,
            BlockClass::ExtentTree,
            image,
            UpdateKind::ExtentBlockInit { ino: self.ino },
        );
        self.core.csum_extent_block(pblk);
        Ok(())
    }
    fn modify_tree_block(
        &mut self,
        pblk: u64,
        offset: u32,
        bytes: &[u8],
        kind: UpdateKind,
    ) -> Result<()> {
        self.core.ensure(pblk, BlockClass::ExtentTree)?;
        self.core.modify(pblk, offset as usize, bytes, kind);
        self.core.csum_extent_block(pblk);
        Ok(())
    }
    fn free_tree_block(&mut self, pblk: u64) -> Result<()> {
        self.core.free_blocks(pblk, 1)?;
        self.core.add_iblocks(self.ino, -1)?;
        Ok(())
    }
    fn csum_tree_block(&self, image: &mut [u8]) {
        if self.core.seal.csum {
            if let Some((at, c)) = self.core.seal.extent_csum(self.ino, self.generation, image) {
                put32(image, at, c);
            }
        }
    }
}

impl Core {
    /// The largest file size in bytes (ext4's `s_maxbytes` for extents).
    pub fn max_file_bytes(&self) -> u64 {
        let bits = self.bs.trailing_zeros();
        let mut res = ((1u64 << 32) - 1) << bits;
        if !self.sbi.has_huge_file() {
            let upper = (((1u64 << 32) - 1) >> (bits - 9)) << bits;
            res = res.min(upper);
        }
        res
    }

    /// Put data into a cached block and report it.
    #[allow(clippy::too_many_arguments)]
    fn put_data(
        &mut self,
        ino: Ino,
        generation: u32,
        lblk: u32,
        pblk: u64,
        at: usize,
        bytes: &[u8],
        fresh: bool,
    ) -> Result<()> {
        let bs = self.bs as usize;
        if fresh {
            let img = if at == 0 && bytes.len() == bs {
                // A whole block: no zeros to write first.
                bytes.to_vec()
            } else {
                let mut img = vec![0u8; bs];
                img[at..at + bytes.len()].copy_from_slice(bytes);
                img
            };
            self.cache.insert_new(pblk, BlockClass::Data, img);
        } else {
            if Delayed::is_delayed(pblk) {
                // Cached, dirty, until it gets its place.
                assert!(self.cache.contains(pblk), "delayed block {pblk} not cached");
            } else if !(at == 0 && bytes.len() == bs) {
                let was_cached = self.cache.contains(pblk);
                self.ensure(pblk, BlockClass::Data)?;
                if !was_cached && self.backlinks {
                    // The first partial overwrite of a block read from the
                    // device: the bytes kept around the new ones must be
                    // this file's, or the new record would bless them.
                    let img = self.cache.snapshot(pblk).expect("ensured");
                    let owner = BlockOwner {
                        ino,
                        generation,
                        lblk,
                    };
                    if let Err(e) = self.proto.check_block_read(owner, pblk, &img) {
                        self.cache.forget(pblk);
                        return Err(e);
                    }
                }
            } else if !self.cache.contains(pblk) {
                self.cache
                    .insert_new(pblk, BlockClass::Data, bytes.to_vec());
            }
            self.cache.write(pblk, at, bytes);
        }
        if Delayed::is_delayed(pblk) {
            // Reported when it gets its place (`delalloc.rs`).
            return Ok(());
        }
        self.proto.on_data_write(
            &DataWrite {
                ino,
                lblk,
                pblk,
                generation,
                fresh,
            },
            &self.handle,
        );
        Ok(())
    }

    /// Write `data` at byte `off` of regular file `ino`.
    pub fn file_write(&mut self, ino: Ino, off: u64, data: &[u8]) -> Result<u32> {
        let i = self.live_inode(ino)?;
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        if !i.is_reg() {
            return Err(errno(libc::EINVAL));
        }
        let max = self.max_file_bytes();
        if off >= max && !data.is_empty() {
            return Err(errno(libc::EFBIG));
        }
        let len = (data.len() as u64).min(max.saturating_sub(off)) as usize;
        if len == 0 {
            return Ok(0);
        }
        self.touch_inode(ino);
        let bs = self.bs as u64;
        let first = off / bs;
        let last = (off + len as u64 - 1) / bs;
        let mut maps = extent::extents(&mut self.tree(ino)?, first..last + 1)?;
        let mut written = 0usize;
        let mut goal = maps
            .iter()
            .rev()
            .find(|m| m.lblk as u64 <= first)
            .map(|m| m.pblk + (first - m.lblk as u64).min(m.len as u64))
            .unwrap_or_else(|| self.inode_goal(ino));
        if goal == self.inode_goal(ino) {
            if let Some(m) = extent::lookup(&mut self.tree(ino)?, first.saturating_sub(1) as u32)? {
                if (m.lblk as u64) < first {
                    goal = m.pblk + m.len as u64;
                }
            }
        }
        // Delayed blocks are mapped too (after the goal is chosen: their
        // numbers are no places).
        maps.extend(self.delayed.mappings(ino, first..last + 1));
        let mut l = first;
        let mut err = None;
        // Each run is all or nothing: a run that cannot get its blocks, or
        // the tree blocks to map them, is rolled back, and the write
        // returns what the runs before it wrote (a short write).
        while l <= last {
            let sp = self.savepoint();
            let m = maps
                .iter()
                .find(|m| (m.lblk as u64) <= l && l < m.lblk as u64 + m.len as u64)
                .copied();
            let (pblk, run, fresh, unwritten) = match m {
                Some(m) => {
                    let k = l - m.lblk as u64;
                    let run = (m.len as u64 - k).min(last + 1 - l);
                    (m.pblk + k, run, m.unwritten, m.unwritten)
                }
                None => {
                    let next = maps
                        .iter()
                        .filter(|m| m.lblk as u64 > l)
                        .map(|m| m.lblk as u64)
                        .min()
                        .unwrap_or(last + 1)
                        .min(last + 1);
                    let want = (next - l).min(exc::MAX_INIT_LEN as u64) as u32;
                    let delayed = match self.try_delay(ino, l, want) {
                        Ok(d) => d,
                        Err(e) => {
                            self.rollback_to(sp);
                            err = Some(e);
                            break;
                        }
                    };
                    if let Some(v) = delayed {
                        (v, want as u64, true, false)
                    } else {
                        match self.alloc_blocks(goal, want) {
                            Ok((p, n)) => {
                                if let Err(e) = self.unpoison(ino, l, l + u64::from(n)) {
                                    self.rollback_to(sp);
                                    err = Some(e);
                                    break;
                                }
                                let r = self
                                    .tree(ino)
                                    .and_then(|mut t| extent::insert(&mut t, l as u32, p, n, false))
                                    .and_then(|()| self.add_iblocks(ino, n as i64));
                                if let Err(e) = r {
                                    self.rollback_to(sp);
                                    err = Some(e);
                                    break;
                                }
                                (p, n as u64, true, false)
                            }
                            Err(e) => {
                                self.rollback_to(sp);
                                err = Some(e);
                                break;
                            }
                        }
                    }
                }
            };
            if !fresh && Delayed::is_delayed(pblk) {
                for k in 0..run {
                    self.rewrite_delayed(ino, (l + k) as u32);
                }
            }
            let mut run_written = written;
            for k in 0..run {
                let lb = l + k;
                let bstart = lb * bs;
                let from = off.max(bstart);
                let to = (off + len as u64).min(bstart + bs);
                let src = &data[(from - off) as usize..(to - off) as usize];
                self.put_data(
                    ino,
                    i.generation,
                    lb as u32,
                    pblk + k,
                    (from - bstart) as usize,
                    src,
                    fresh,
                )?;
                run_written = (to - off) as usize;
            }
            if unwritten {
                // Converting part of an unwritten extent may split it.
                let r = self
                    .tree(ino)
                    .and_then(|mut t| extent::mark_written(&mut t, l as u32, run));
                if let Err(e) = r {
                    self.rollback_to(sp);
                    err = Some(e);
                    break;
                }
            }
            written = run_written;
            if !Delayed::is_delayed(pblk) {
                goal = pblk + run;
            }
            l += run;
        }
        if written == 0 {
            return Err(err.unwrap_or_else(|| errno(libc::ENOSPC)));
        }
        if err.as_ref().is_some_and(|e| e.errno() == libc::ENOSPC) {
            self.short_for_space = true;
        }
        let end = off + written as u64;
        if end > i.size {
            self.set_size(ino, end);
        }
        self.touch_times(ino, true);
        Ok(written as u32)
    }

    /// Read up to `size` bytes at `off` of regular file `ino`.
    pub fn file_read(&mut self, ino: Ino, off: u64, size: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let n = self.file_read_inner(ino, off, size.into(), Self::grow(&mut out), None)?;
        debug_assert_eq!(n, out.len());
        Ok(out)
    }

    /// [`Core::file_read`] into `buf` (as many bytes as it holds), returning
    /// how many bytes of it the read filled: a caller that owns a buffer
    /// (FUSE over io_uring lends the request's own) saves a copy.
    pub fn file_read_into(&mut self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        let size = buf.len() as u64;
        self.file_read_inner(ino, off, size, Self::lend(buf), None)
    }

    /// [`Core::file_read`] with the device reads left to the caller: the
    /// bytes that come from the cache (and the zeros of holes) are in the
    /// returned buffer, and every uncached run of blocks is returned as a
    /// [`DeferredRead`] for the caller to read from the device without the
    /// core's lock (`Fs::read`). The caller must then check
    /// [`Core::frees`] against the value returned here: if a block was
    /// freed meanwhile, one of the runs may have been given to another
    /// file, and the read must be done again under the lock.
    pub fn file_read_deferred(
        &mut self,
        ino: Ino,
        off: u64,
        size: u32,
    ) -> Result<(Vec<u8>, Vec<DeferredRead>, u64)> {
        let mut runs = Vec::new();
        let mut out = Vec::new();
        self.file_read_inner(ino, off, size.into(), Self::grow(&mut out), Some(&mut runs))?;
        Ok((out, runs, self.frees()))
    }

    /// [`Core::file_read_deferred`] into `buf`, as [`Core::file_read_into`]:
    /// returns the bytes filled (counting those the runs will fill), the
    /// runs and [`Core::frees`].
    pub fn file_read_deferred_into(
        &mut self,
        ino: Ino,
        off: u64,
        buf: &mut [u8],
    ) -> Result<(usize, Vec<DeferredRead>, u64)> {
        let mut runs = Vec::new();
        let size = buf.len() as u64;
        let n = self.file_read_inner(ino, off, size, Self::lend(buf), Some(&mut runs))?;
        Ok((n, runs, self.frees()))
    }

    /// A read's output grown to the read's length: already zeros.
    fn grow<'b>(out: &'b mut Vec<u8>) -> impl FnOnce(usize) -> (&'b mut [u8], bool) {
        move |len| {
            // Allocated zeroed (calloc): a large read gets fresh zero pages.
            *out = vec![0u8; len];
            (&mut out[..], true)
        }
    }

    /// A read's output in a caller's buffer, whose bytes are not zeros.
    fn lend<'b>(buf: &'b mut [u8]) -> impl FnOnce(usize) -> (&'b mut [u8], bool) {
        move |len| (&mut buf[..len], false)
    }

    /// Read up to `size` bytes at `off` of `ino` into the buffer `out`
    /// gives for the read's length (and whether it is already zeros);
    /// returns that length.
    fn file_read_inner<'b>(
        &mut self,
        ino: Ino,
        off: u64,
        size: u64,
        out: impl FnOnce(usize) -> (&'b mut [u8], bool),
        mut defer: Option<&mut Vec<DeferredRead>>,
    ) -> Result<usize> {
        let i = self.live_inode(ino)?;
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        if !i.is_reg() && !i.is_symlink() {
            return Err(errno(libc::EINVAL));
        }
        if off >= i.size || size == 0 {
            return Ok(0);
        }
        let len = size.min(i.size - off) as usize;
        let bs = self.bs as u64;
        let first = off / bs;
        let last = (off + len as u64 - 1) / bs;
        let mut maps = extent::extents(&mut self.tree(ino)?, first..last + 1)?;
        maps.extend(self.delayed.mappings(ino, first..last + 1));
        // Under backlinks every block read from the device is checked
        // against its owner record, under the lock.
        let check = self.backlinks.then_some((ino, i.generation));
        if check.is_some() {
            defer = None;
            // A hole in the range may be a block the scanners took away
            // (poisoned): EIO, not zeros.
            let covered: u64 = maps
                .iter()
                .filter(|m| !m.unwritten)
                .map(|m| {
                    let a = u64::from(m.lblk).max(first);
                    let b = (u64::from(m.lblk) + u64::from(m.len)).min(last + 1);
                    b.saturating_sub(a)
                })
                .sum();
            if covered < last + 1 - first
                && self
                    .poisoned(ino)?
                    .iter()
                    .any(|&l| (first..=last).contains(&u64::from(l)))
            {
                return Err(errno(libc::EIO));
            }
        }
        let (out, zeroed) = out(len);
        assert_eq!(out.len(), len, "a read's buffer holds the read");
        if !zeroed {
            zero_holes(&maps, bs, off, out);
        }
        for m in maps.iter().filter(|m| !m.unwritten) {
            self.read_run(m, off, out, defer.as_deref_mut(), check)?;
        }
        Ok(len)
    }

    fn read_run(
        &mut self,
        m: &Mapping,
        off: u64,
        out: &mut [u8],
        defer: Option<&mut Vec<DeferredRead>>,
        check: Option<(Ino, u32)>,
    ) -> Result<()> {
        let mut defer = defer;
        let bs = self.bs as u64;
        let end = off + out.len() as u64;
        let mut k = 0u64;
        while k < m.len as u64 {
            let lb = m.lblk as u64 + k;
            let bstart = lb * bs;
            if bstart >= end {
                break;
            }
            let pblk = m.pblk + k;
            if pblk >= self.sbi.blocks_count && !Delayed::is_delayed(pblk) {
                return Err(crate::error::FsError::corrupt(
                    pblk,
                    "extent physical block",
                    "beyond the end of the file system",
                ));
            }
            if !self.cache.contains(pblk) {
                // Read the uncached stretch in one request, straight into
                // the reply. File data is not kept in the block cache: the
                // kernel's page cache holds what was read (a FUSE mount
                // keeps it across opens), and the block cache stays for
                // metadata, whose misses cost a device round trip each.
                let mut n = 1u64;
                while k + n < m.len as u64
                    && n < READ_RUN_BLOCKS
                    && (m.lblk as u64 + k + n) * bs < end
                    && !self.cache.contains(pblk + n)
                {
                    n += 1;
                }
                if let Some(d) = defer.as_deref_mut() {
                    d.push(DeferredRead {
                        pblk,
                        blocks: n,
                        byte: (m.lblk as u64 + k) * bs,
                    });
                    k += n;
                    continue;
                }
                let mut buf = vec![0u8; (n * bs) as usize];
                self.dev.read(pblk, &mut buf, BlockClass::Data)?;
                if let Some((ino, generation)) = check {
                    for j in 0..n {
                        let owner = BlockOwner {
                            ino,
                            generation,
                            lblk: (m.lblk as u64 + k + j) as u32,
                        };
                        let img = &buf[(j * bs) as usize..((j + 1) * bs) as usize];
                        self.proto.check_block_read(owner, pblk + j, img)?;
                    }
                }
                for j in 0..n {
                    Self::copy_out(
                        bs,
                        &buf[(j * bs) as usize..((j + 1) * bs) as usize],
                        (m.lblk as u64 + k + j) * bs,
                        off,
                        out,
                    );
                }
                k += n;
                continue;
            }
            let img = self.cache.get(pblk).expect("cached");
            Self::copy_out(bs, img, bstart, off, out);
            k += 1;
        }
        Ok(())
    }

    /// Copy the part of block image `img` (file bytes `bstart..bstart+bs`)
    /// that falls in `off..off+out.len()` into `out`.
    pub fn copy_out(bs: u64, img: &[u8], bstart: u64, off: u64, out: &mut [u8]) {
        let end = off + out.len() as u64;
        let from = off.max(bstart);
        let to = end.min(bstart + bs);
        if from >= to {
            return;
        }
        out[(from - off) as usize..(to - off) as usize]
            .copy_from_slice(&img[(from - bstart) as usize..(to - bstart) as usize]);
    }

    /// Zero bytes `from..to` of logical block `lblk` if it holds written data.
    fn zero_partial(&mut self, ino: Ino, lblk: u64, from: usize, to: usize) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        if let Some(m) = extent::lookup(&mut self.tree(ino)?, lblk as u32)? {
            if m.lblk as u64 <= lblk && lblk < m.lblk as u64 + m.len as u64 && !m.unwritten {
                let p = m.pblk + (lblk - m.lblk as u64);
                let zeros = vec![0u8; to - from];
                let generation = self.read_inode(ino)?.generation;
                match self.put_data(ino, generation, lblk as u32, p, from, &zeros, false) {
                    // A block whose owner record disagrees reads as EIO
                    // before and after: there is nothing of this file's
                    // to zero.
                    Err(e) if self.backlinks && e.errno() == libc::EIO => {}
                    r => r?,
                }
            }
        }
        Ok(())
    }

    /// Unmap and free logical blocks `lblk..lblk+len`.
    fn unmap(&mut self, ino: Ino, lblk: u64, len: u64) -> Result<()> {
        if len == 0 || lblk >= LBLK_END {
            return Ok(());
        }
        let freed = extent::remove_range(&mut self.tree(ino)?, lblk as u32, len)?;
        let mut total = 0i64;
        for (p, n) in freed {
            self.free_blocks(p, n as u64)?;
            total += n as i64;
        }
        if total > 0 {
            self.add_iblocks(ino, -total)?;
        }
        Ok(())
    }

    /// Change the size of regular file `ino` (truncate or extend).
    pub fn file_truncate(&mut self, ino: Ino, size: u64) -> Result<()> {
        let i = self.live_inode(ino)?;
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        if !i.is_reg() {
            return Err(errno(libc::EINVAL));
        }
        if size > self.max_file_bytes() {
            return Err(errno(libc::EFBIG));
        }
        self.touch_inode(ino);
        // The blocks to unmap or zero get their places first.
        self.settle_inode(ino)?;
        let bs = self.bs as u64;
        if size <= i.size {
            let keep = size.div_ceil(bs);
            self.unmap(ino, keep, LBLK_END - keep)?;
            if !size.is_multiple_of(bs) {
                self.zero_partial(ino, size / bs, (size % bs) as usize, bs as usize)?;
            }
        }
        if size != i.size {
            self.set_size(ino, size);
        }
        if size < i.size {
            self.unpoison(ino, size.div_ceil(bs), LBLK_END)?;
        }
        // truncate(2) and ftruncate(2) on ext4 set mtime and ctime even when
        // the size does not change.
        self.touch_times(ino, true);
        Ok(())
    }

    /// fallocate: allocate (as unwritten extents) or punch a hole.
    pub fn file_fallocate(
        &mut self,
        ino: Ino,
        off: u64,
        len: u64,
        flags: FallocFlags,
    ) -> Result<()> {
        let i = self.live_inode(ino)?;
        let shift = flags.collapse_range || flags.insert_range;
        if shift {
            // vfs_fallocate (Linux 6.11 and later): the modes exclude each
            // other and KEEP_SIZE (EOPNOTSUPP, before any other check but
            // the length's), and come before the file's type.
            if len == 0 {
                return Err(errno(libc::EINVAL));
            }
            let others = flags.keep_size || flags.punch_hole || flags.zero_range;
            if others || (flags.collapse_range && flags.insert_range) {
                return Err(errno(libc::EOPNOTSUPP));
            }
            use ordo_format::inode::flags as fl;
            if i.flags & (fl::APPEND | fl::IMMUTABLE) != 0 {
                return Err(errno(libc::EPERM));
            }
        }
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        if !i.is_reg() {
            return Err(errno(libc::ENODEV));
        }
        if len == 0 {
            return Err(errno(libc::EINVAL));
        }
        let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        let bs = self.bs as u64;
        // The blocks to map, unmap or move get their places first.
        self.settle_inode(ino)?;
        if shift {
            return self.file_shift_range(ino, &i, off, len, flags.collapse_range);
        }
        self.touch_inode(ino);
        if flags.punch_hole {
            if !flags.keep_size {
                return Err(errno(libc::EOPNOTSUPP));
            }
            if off >= i.size {
                // Nothing to punch, yet ext4 still stamps the times.
                self.touch_times(ino, true);
                return Ok(());
            }
            // As ext4: the hole stops at the page after i_size.
            let end = end.min((i.size / 4096 + 1) * 4096);
            let first_full = off.div_ceil(bs);
            let end_full = end / bs;
            if first_full > end_full {
                // Inside one block.
                self.zero_partial(
                    ino,
                    off / bs,
                    (off % bs) as usize,
                    (end - off / bs * bs) as usize,
                )?;
            } else {
                if !off.is_multiple_of(bs) {
                    self.zero_partial(ino, off / bs, (off % bs) as usize, bs as usize)?;
                }
                if end % bs != 0 {
                    self.zero_partial(ino, end / bs, 0, (end % bs) as usize)?;
                }
                self.unmap(ino, first_full, end_full - first_full)?;
            }
            self.touch_times(ino, true);
            return Ok(());
        }
        if end > self.max_file_bytes() {
            return Err(errno(libc::EFBIG));
        }
        if flags.zero_range {
            // As ext4: the partial blocks at the edges are zeroed in place
            // (written blocks only: holes and unwritten extents read as
            // zeros already); the whole blocks are unmapped and then allocated again below
            // as unwritten extents, so the range reads as zeros and stays
            // allocated. One handle: a crash or ENOSPC undoes all of it.
            let first_full = off.div_ceil(bs);
            let end_full = end / bs;
            let zero = |c: &mut Self, lblk: u64, from: u64, to: u64| -> Result<()> {
                c.zero_partial(ino, lblk, from as usize, to as usize)
            };
            if first_full > end_full {
                zero(self, off / bs, off % bs, end - off / bs * bs)?;
            } else {
                if !off.is_multiple_of(bs) {
                    zero(self, off / bs, off % bs, bs)?;
                }
                if end % bs != 0 {
                    zero(self, end / bs, 0, end % bs)?;
                }
                if end_full > first_full {
                    self.unmap(ino, first_full, end_full - first_full)?;
                }
            }
        }
        let first = off / bs;
        let last = (end - 1) / bs;
        let maps = extent::extents(&mut self.tree(ino)?, first..last + 1)?;
        let mut goal = self.inode_goal(ino);
        if let Some(m) = maps.first() {
            goal = m.pblk;
        }
        let mut l = first;
        while l <= last {
            if let Some(m) = maps
                .iter()
                .find(|m| (m.lblk as u64) <= l && l < m.lblk as u64 + m.len as u64)
            {
                goal = m.pblk + m.len as u64;
                l = m.lblk as u64 + m.len as u64;
                continue;
            }
            let next = maps
                .iter()
                .filter(|m| m.lblk as u64 > l)
                .map(|m| m.lblk as u64)
                .min()
                .unwrap_or(last + 1)
                .min(last + 1);
            let want = (next - l).min(exc::MAX_UNWRITTEN_LEN as u64) as u32;
            let (p, n) = self.alloc_blocks(goal, want)?;
            if let Err(e) = extent::insert(&mut self.tree(ino)?, l as u32, p, n, true) {
                let _ = self.free_blocks(p, n as u64);
                return Err(e);
            }
            self.add_iblocks(ino, n as i64)?;
            goal = p + n as u64;
            l += n as u64;
        }
        if !flags.keep_size && end > i.size {
            self.set_size(ino, end);
        }
        // ext4 sets mtime and ctime on every successful fallocate, in every
        // mode, even one that changes nothing.
        self.touch_times(ino, true);
        Ok(())
    }

    /// fallocate COLLAPSE_RANGE (`collapse`) or INSERT_RANGE, with the
    /// checks and in the order of Linux's `vfs_fallocate` and ext4's
    /// `ext4_collapse_range` / `ext4_insert_range`. One handle: the tree is
    /// rebuilt shifted and switched in one write of the inode's root (see
    /// [`extent::shift_range`]), the size changes by the length, and the
    /// blocks of a collapsed range are freed as a punch frees them.
    fn file_shift_range(
        &mut self,
        ino: Ino,
        i: &crate::inode::Inode,
        off: u64,
        len: u64,
        collapse: bool,
    ) -> Result<()> {
        let end = off + len;
        if end > self.max_file_bytes() {
            return Err(errno(libc::EFBIG));
        }
        if !i.uses_extents() {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let bs = self.bs as u64;
        if !off.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(errno(libc::EINVAL));
        }
        let (first, n) = (off / bs, len / bs);
        self.touch_inode(ino);
        // The written blocks that move: reported once the tree has moved
        // (owner records name the logical block).
        let moving: Vec<Mapping> = if self.backlinks {
            let from = if collapse { first + n } else { first };
            extent::extents(&mut self.tree(ino)?, from..LBLK_END)?
                .into_iter()
                .filter(|m| !m.unwritten && u64::from(m.lblk) >= from)
                .collect()
        } else {
            Vec::new()
        };
        let r = self.file_shift_inner(ino, i, first, n, len, collapse);
        if r.is_ok() {
            for m in moving {
                for k in 0..m.len {
                    let lblk = m.lblk + k;
                    let new_lblk = if collapse {
                        lblk - n as u32
                    } else {
                        lblk + n as u32
                    };
                    let owner = BlockOwner {
                        ino,
                        generation: i.generation,
                        lblk,
                    };
                    self.proto
                        .on_data_moved(owner, m.pblk + u64::from(k), new_lblk);
                }
            }
        }
        r
    }

    fn file_shift_inner(
        &mut self,
        ino: Ino,
        i: &crate::inode::Inode,
        first: u64,
        n: u64,
        len: u64,
        collapse: bool,
    ) -> Result<()> {
        let off = first * self.bs as u64;
        let end = off + len;
        if collapse {
            // Nothing to collapse past the end: that would be a truncate.
            if end >= i.size {
                return Err(errno(libc::EINVAL));
            }
            // One switch of the tree (extent::shift_range), then the size
            // (no mapped block ever lies past it), then the collapsed
            // range's blocks, which nothing maps any more.
            let freed = extent::shift_range(
                &mut self.tree(ino)?,
                first as u32,
                n as u32,
                extent::Shift::Left,
            )?;
            self.set_size(ino, i.size - len);
            let mut total = 0i64;
            for (p, k) in freed {
                self.free_blocks(p, k as u64)?;
                total += k as i64;
            }
            if total > 0 {
                self.add_iblocks(ino, -total)?;
            }
        } else {
            if len > self.max_file_bytes() - i.size {
                return Err(errno(libc::EFBIG));
            }
            if off >= i.size {
                return Err(errno(libc::EINVAL));
            }
            // Blocks preallocated past the end move too; they must stay
            // below the last logical block.
            let last = extent::last_extent_end(&mut self.tree(ino)?)?;
            if last + n > LBLK_END {
                return Err(errno(libc::EFBIG));
            }
            // As ext4: the size grows first, then everything from the
            // offset moves up, in one switch of the tree.
            self.set_size(ino, i.size + len);
            extent::shift_range(
                &mut self.tree(ino)?,
                first as u32,
                n as u32,
                extent::Shift::Right,
            )?;
        }
        self.touch_times(ino, true);
        Ok(())
    }

    /// Data blocks mapped by `ino` (written and unwritten).
    pub fn file_mapped_blocks(&mut self, ino: Ino) -> Result<u64> {
        let i = self.live_inode(ino)?;
        if !i.uses_extents() {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let maps = extent::extents(&mut self.tree(ino)?, 0..LBLK_END)?;
        let mapped: u64 = maps.iter().map(|m| u64::from(m.len)).sum();
        Ok(mapped + self.delayed.blocks_of(ino))
    }

    /// SEEK_DATA / SEEK_HOLE (unwritten extents count as holes).
    pub fn file_seek(&mut self, ino: Ino, off: u64, whence: SeekWhence) -> Result<u64> {
        let i = self.live_inode(ino)?;
        if off >= i.size {
            return Err(errno(libc::ENXIO));
        }
        let bs = self.bs as u64;
        let first = off / bs;
        let last = (i.size - 1) / bs;
        let mut maps = extent::extents(&mut self.tree(ino)?, first..last + 1)?;
        maps.extend(self.delayed.mappings(ino, first..last + 1));
        maps.retain(|m| !m.unwritten);
        maps.sort_by_key(|m| m.lblk);
        match whence {
            SeekWhence::Data => {
                for m in &maps {
                    let start = (m.lblk as u64 * bs).max(off);
                    if start < i.size && start < (m.lblk as u64 + m.len as u64) * bs {
                        return Ok(start);
                    }
                }
                Err(errno(libc::ENXIO))
            }
            SeekWhence::Hole => {
                let mut pos = off;
                loop {
                    let lb = pos / bs;
                    match maps
                        .iter()
                        .find(|m| (m.lblk as u64) <= lb && lb < m.lblk as u64 + m.len as u64)
                    {
                        Some(m) => pos = (m.lblk as u64 + m.len as u64) * bs,
                        None => return Ok(pos.min(i.size)),
                    }
                    if pos >= i.size {
                        return Ok(i.size);
                    }
                }
            }
        }
    }

    /// Free every block of inode `ino` (before releasing it).
    pub fn free_all_blocks(&mut self, ino: Ino) -> Result<()> {
        if self.undo_enabled() {
            // A free that may still be rolled back: the delayed blocks get
            // their places, to be freed (and taken back) as any.
            self.settle_inode(ino)?;
        } else {
            self.drop_delayed(ino);
        }
        let i = self.read_inode(ino)?;
        if i.uses_extents() {
            self.unmap(ino, 0, LBLK_END)?;
        }
        let _ = InodeField::Blocks;
        Ok(())
    }
}

/// Zero the bytes of `out` (file bytes `off..off + out.len()`) that no
/// written mapping of `maps` covers: holes and unwritten extents read as
/// zeros, and the mapped bytes are all filled by the read.
fn zero_holes(maps: &[Mapping], bs: u64, off: u64, out: &mut [u8]) {
    let end = off + out.len() as u64;
    let mut spans: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| !m.unwritten)
        .map(|m| {
            let a = (u64::from(m.lblk) * bs).max(off);
            let b = ((u64::from(m.lblk) + u64::from(m.len)) * bs).min(end);
            (a, b)
        })
        .filter(|(a, b)| a < b)
        .collect();
    spans.sort_unstable();
    let mut at = off;
    for (a, b) in spans {
        if a > at {
            out[(at - off) as usize..(a - off) as usize].fill(0);
        }
        at = at.max(b);
    }
    if at < end {
        out[(at - off) as usize..].fill(0);
    }
}
