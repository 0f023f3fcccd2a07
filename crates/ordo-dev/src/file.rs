//! An image file or a raw block device.
//!
//! The same code serves a regular file and `/dev/loopN` (or a real disk), so
//! that ordo can be measured by the kernel's own `/sys/block/*/stat` next to
//! the kernel's ext4 on the same device.
//!
//! * Reads and writes are `pread` / `pwrite` at `block * block_size`,
//!   retried on short transfers and EINTR.
//! * `flush` is `fdatasync`: for a file, the host file system writes the
//!   data and issues a cache flush; for a block device, the kernel sends a
//!   PREFLUSH to the disk.
//! * A FUA write is `pwritev2(RWF_DSYNC)`, which the kernel turns into a
//!   FUA bio on devices that support it. Where the kernel answers EOPNOTSUPP
//!   (or ENOSYS), ordo falls back to `pwrite` + `fdatasync` for that device
//!   from then on: slower, never weaker.
//! * `O_DIRECT` is optional. The caller's buffers are copied through a
//!   4096-byte-aligned buffer when they are not aligned, so every caller can
//!   pass any slice.
//! * Exclusive open takes `flock(LOCK_EX | LOCK_NB)` on the image (a shared
//!   lock when read-only), so a second mount of the same image fails with
//!   "image is already in use" instead of two caches corrupting it. A block
//!   device is also opened `O_EXCL`, which the kernel refuses while the
//!   device is mounted.
//! * A failed `fdatasync` is sticky: Linux may already have marked the
//!   dirty pages clean (dropping the data), so a later flush that succeeds
//!   would prove nothing. After one, every write and flush fails with EIO
//!   and `durable()` never moves again; the file system must remount.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::counting::Bookkeeping;
use crate::{
    check_block_size, check_request, BlockClass, BlockDevice, Counters, DevError, Ticket,
    WriteFlags,
};

/// Alignment of O_DIRECT transfers: a multiple of every logical sector size
/// ordo meets (512 and 4096).
const DIRECT_ALIGN_BYTES: usize = 4096;

/// `_IOR(0x12, 114, size_t)`: the device size in bytes. Not exported by the
/// libc crate; the direction bits differ on a few architectures.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: u64 = 0x4008_1272;
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const BLKGETSIZE64: u64 = 0x8008_1272;

/// How to open a [`FileDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open read-only; writes fail with EROFS.
    pub read_only: bool,
    /// Bypass the host page cache (`O_DIRECT`).
    pub direct: bool,
    /// Lock the image against a second open: `flock` (exclusive, or shared
    /// when `read_only`), plus `O_EXCL` for a block device.
    pub exclusive: bool,
}

impl Default for OpenOptions {
    /// Read-write, buffered, exclusive: what mounting an image wants.
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            direct: false,
            exclusive: true,
        }
    }
}

impl OpenOptions {
    /// Read-write, buffered, exclusive.
    pub fn read_write() -> Self {
        Self::default()
    }
    /// Read-only, buffered, with a shared lock (refused while a writer holds
    /// the image).
    pub fn read_only() -> Self {
        OpenOptions {
            read_only: true,
            ..Self::default()
        }
    }
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> AlignedBuf {
        assert!(len > 0);
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN_BYTES)
            .expect("O_DIRECT buffer layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialized bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A read through an `O_DIRECT` descriptor into `buf`, through the
/// thread's aligned buffer when `buf` is not aligned.
fn read_direct(direct: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    if is_aligned(buf.as_ptr()) {
        return direct.read_exact_at(buf, offset);
    }
    // One aligned buffer per thread, kept: a fresh one per read would be a
    // fresh mapping of the heap, faulted in page by page.
    BULK_BUF.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|b| b.as_slice().len() < buf.len()) {
            *slot = Some(AlignedBuf::zeroed(buf.len()));
        }
        let tmp = &mut slot.as_mut().expect("just set").as_mut_slice()[..buf.len()];
        direct.read_exact_at(tmp, offset)?;
        buf.copy_from_slice(tmp);
        Ok(())
    })
}

fn is_aligned(ptr: *const u8) -> bool {
    (ptr as usize).is_multiple_of(DIRECT_ALIGN_BYTES)
}

/// An image file or a raw block device.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    block_size: u32,
    block_count: u64,
    read_only: bool,
    direct: bool,
    is_block_device: bool,
    /// Set once the kernel refused `RWF_DSYNC`: FUA is then pwrite + fdatasync.
    fua_fallback: AtomicBool,
    /// Set after a failed flush; see the module comment.
    flush_failed: AtomicBool,
    book: Bookkeeping,
    /// A second, read-only `O_DIRECT` descriptor of a buffered device, for
    /// large reads of file data ([`BULK_READ_MIN_BYTES`]): a sequential
    /// read of a file that no cache holds goes to the device once, not
    /// through the host's page cache of the image as well (on a loop
    /// device, 1.2 GB/s against 0.68 GB/s cold here). Coherent with the
    /// buffered writes: the kernel writes back dirty cached pages of the
    /// range before a direct read. `None` when the device is direct
    /// already or refuses `O_DIRECT` (tmpfs).
    bulk: Option<File>,
}

/// Reads of file data at least this large go through [`FileDevice`]'s
/// direct descriptor.
pub const BULK_READ_MIN_BYTES: usize = 128 << 10;

thread_local! {
    /// The aligned buffer of a thread's direct reads into unaligned memory.
    static BULK_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("read_only", &self.read_only)
            .field("direct", &self.direct)
            .field("is_block_device", &self.is_block_device)
            .finish()
    }
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> DevError {
    DevError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

impl FileDevice {
    /// Opens an existing image file or block device. The device has
    /// `size / block_size` blocks (a trailing partial block is ignored).
    pub fn open(
        path: impl AsRef<Path>,
        block_size: u32,
        opts: OpenOptions,
    ) -> Result<FileDevice, DevError> {
        Self::open_inner(path.as_ref(), block_size, opts, None)
    }

    /// Creates an image of `size_bytes` (a sparse file) and opens it
    /// read-write and exclusive. An existing regular file is extended to
    /// `size_bytes` but never shrunk (that is an error). For an existing
    /// block device the size comes from the device and `size_bytes` is
    /// ignored.
    pub fn create(
        path: impl AsRef<Path>,
        size_bytes: u64,
        block_size: u32,
    ) -> Result<FileDevice, DevError> {
        check_block_size(block_size)?;
        if size_bytes < block_size as u64 {
            return Err(DevError::Geometry(format!(
                "image size {size_bytes} bytes is smaller than one {block_size}-byte block"
            )));
        }
        Self::open_inner(
            path.as_ref(),
            block_size,
            OpenOptions::default(),
            Some(size_bytes),
        )
    }

    fn open_inner(
        path: &Path,
        block_size: u32,
        opts: OpenOptions,
        create_size: Option<u64>,
    ) -> Result<FileDevice, DevError> {
        check_block_size(block_size)?;
        let existing = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create_size.is_some() => None,
            Err(e) => return Err(io_err(path, "stat", e)),
        };
        let is_block_device = existing
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        let mut flags = libc::O_CLOEXEC;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        if opts.exclusive && is_block_device {
            // Without O_CREAT, O_EXCL on a block device means "fail with
            // EBUSY if it is mounted or opened exclusively by someone else".
            flags |= libc::O_EXCL;
        }
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .create(existing.is_none())
                .custom_flags(flags)
                .mode(0o644)
                .open(path)
        };
        // A block device just released (a loop device reused right after a
        // kernel unmount, or probed by udev as it is attached) can answer
        // EBUSY for an instant: retry briefly before calling it in use.
        let mut tries = 0;
        let file = loop {
            match open() {
                Err(e)
                    if is_block_device && e.raw_os_error() == Some(libc::EBUSY) && tries < 25 =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(40));
                }
                r => break r,
            }
        }
        .map_err(|e| {
            if is_block_device && e.raw_os_error() == Some(libc::EBUSY) {
                DevError::InUse {
                    path: path.to_path_buf(),
                }
            } else {
                io_err(path, "open", e)
            }
        })?;
        if opts.exclusive {
            let op = if opts.read_only {
                libc::LOCK_SH
            } else {
                libc::LOCK_EX
            } | libc::LOCK_NB;
            // A lock held only for an instant is not a second mount: a
            // process forking a child (mkfs, e2fsck, a shell) in another
            // thread shares our descriptors with it until the child execs
            // and closes them (they are close-on-exec). Wait that out, for
            // at most about a second, before calling the image in use.
            let mut busy_tries = 0u32;
            loop {
                // SAFETY: plain syscall on a descriptor we own.
                let r = unsafe { libc::flock(file.as_raw_fd(), op) };
                if r == 0 {
                    break;
                }
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock if busy_tries < 50 => {
                        busy_tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    io::ErrorKind::WouldBlock => {
                        return Err(DevError::InUse {
                            path: path.to_path_buf(),
                        })
                    }
                    _ => return Err(io_err(path, "flock", e)),
                }
            }
        }
        let size_bytes = if is_block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            let r =
                unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
            if r != 0 {
                return Err(io_err(path, "BLKGETSIZE64", io::Error::last_os_error()));
            }
            if opts.direct {
                let mut sector: libc::c_int = 0;
                // SAFETY: BLKSSZGET writes one int through the pointer.
                let r = unsafe {
                    libc::ioctl(
                        file.as_raw_fd(),
                        libc::BLKSSZGET as _,
                        &mut sector as *mut libc::c_int,
                    )
                };
                if r == 0 && sector > 0 && (block_size as i64) % (sector as i64) != 0 {
                    return Err(DevError::Geometry(format!(
                        "{}: block size {block_size} is not a multiple of the logical sector size {sector}, as O_DIRECT needs",
                        path.display()
                    )));
                }
            }
            size
        } else {
            let meta = file.metadata().map_err(|e| io_err(path, "fstat", e))?;
            if !meta.file_type().is_file() {
                return Err(DevError::Geometry(format!(
                    "{}: neither a regular file nor a block device",
                    path.display()
                )));
            }
            let len = meta.len();
            match create_size {
                Some(want) if want < len => {
                    return Err(DevError::WouldShrink {
                        path: path.to_path_buf(),
                        existing_bytes: len,
                        requested_bytes: want,
                    })
                }
                Some(want) if want > len => {
                    // Extending with set_len leaves a hole: the image is sparse.
                    file.set_len(want)
                        .map_err(|e| io_err(path, "ftruncate", e))?;
                    want
                }
                _ => len,
            }
        };
        let block_count = size_bytes / block_size as u64;
        if block_count == 0 {
            return Err(DevError::Geometry(format!(
                "{}: {size_bytes} bytes hold no {block_size}-byte block",
                path.display()
            )));
        }
        let bulk = if opts.direct || !(block_size as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
            None
        } else {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
                .open(path)
                .ok()
        };
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            block_size,
            block_count,
            read_only: opts.read_only,
            direct: opts.direct,
            is_block_device,
            fua_fallback: AtomicBool::new(false),
            flush_failed: AtomicBool::new(false),
            book: Bookkeeping::new(),
            bulk,
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True for a raw block device (size from BLKGETSIZE64), false for a
    /// regular file.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// True if FUA writes are emulated with pwrite + fdatasync because the
    /// kernel refused `RWF_DSYNC`.
    pub fn fua_emulated(&self) -> bool {
        self.fua_fallback.load(Ordering::Relaxed)
    }

    /// True once a flush has failed (the device then refuses writes and
    /// flushes).
    pub fn has_failed(&self) -> bool {
        self.flush_failed.load(Ordering::SeqCst)
    }

    fn check_not_failed(&self) -> io::Result<()> {
        if self.has_failed() {
            return Err(io::Error::other(format!(
                "{}: an earlier flush failed; writes since then may be lost (remount required)",
                self.path.display()
            )));
        }
        Ok(())
    }

    fn offset(&self, block: u64) -> u64 {
        // check_request bounded block + len by block_count, and
        // block_count * block_size is the file size, so this cannot overflow.
        block * self.block_size as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct {
            read_direct(&self.file, buf, offset)
        } else {
            self.file.read_exact_at(buf, offset)
        }
    }

    fn write_at(&self, data: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let tmp;
        let data = if self.direct && !is_aligned(data.as_ptr()) {
            let mut b = AlignedBuf::zeroed(data.len());
            b.as_mut_slice().copy_from_slice(data);
            tmp = b;
            tmp.as_slice()
        } else {
            data
        };
        if !fua {
            return self.file.write_all_at(data, offset);
        }
        if !self.fua_fallback.load(Ordering::Relaxed) {
            match self.pwrite_dsync_all(data, offset) {
                Ok(()) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                    ) =>
                {
                    self.fua_fallback.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(data, offset)?;
        self.file.sync_data()
    }

    /// One write request of `len` bytes at `block`: checked (range,
    /// read-only, an earlier failed flush), counted and ticketed, with
    /// `put` doing the transfer at the byte offset it is given.
    fn submit_write(
        &self,
        block: u64,
        len: usize,
        flags: WriteFlags,
        put: impl FnOnce(u64) -> io::Result<()>,
    ) -> io::Result<Ticket> {
        check_request(self.block_size, self.block_count, block, len)?;
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check_not_failed()?;
        self.book
            .write(flags, len as u64, |_| put(self.offset(block)))
    }

    /// `pwritev2` of `parts`, laid end to end from `offset`, with
    /// `flags` (0, or `RWF_DSYNC`), until every byte is written: a short
    /// transfer resumes inside the part it stopped in. With `RWF_DSYNC`
    /// each partial transfer was itself written with DSYNC, so retrying
    /// the rest keeps the guarantee.
    fn pwritev_all(&self, parts: &[&[u8]], mut offset: u64, flags: libc::c_int) -> io::Result<()> {
        /// Parts per call: Linux's `UIO_MAXIOV`.
        const IOV_MAX: usize = 1024;
        let mut i = 0;
        let mut skip = 0usize;
        loop {
            // Past the parts (and the empty ones) already written.
            while i < parts.len() && skip == parts[i].len() {
                i += 1;
                skip = 0;
            }
            if i == parts.len() {
                return Ok(());
            }
            let iov: Vec<libc::iovec> = parts[i..]
                .iter()
                .take(IOV_MAX)
                .enumerate()
                .map(|(k, p)| {
                    let p = if k == 0 { &p[skip..] } else { p };
                    libc::iovec {
                        iov_base: p.as_ptr() as *mut libc::c_void,
                        iov_len: p.len(),
                    }
                })
                .collect();
            // SAFETY: every iovec describes a live slice of `parts`, which
            // outlives the call; the kernel only reads from them.
            let r = unsafe {
                libc::pwritev2(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    offset as libc::off_t,
                    flags,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwritev2 wrote nothing",
                ));
            }
            let mut n = r as usize;
            offset += n as u64;
            while n > 0 {
                let left = parts[i].len() - skip;
                if n >= left {
                    n -= left;
                    i += 1;
                    skip = 0;
                } else {
                    skip += n;
                    n = 0;
                }
            }
        }
    }

    /// `pwritev2(RWF_DSYNC)` of `data` until every byte is written.
    fn pwrite_dsync_all(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.pwritev_all(&[data], offset, libc::RWF_DSYNC)
    }
}

impl BlockDevice for FileDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        check_request(self.block_size, self.block_count, block, buf.len())?;
        let offset = self.offset(block);
        match &self.bulk {
            Some(direct) if class == BlockClass::Data && buf.len() >= BULK_READ_MIN_BYTES => {
                match read_direct(direct, buf, offset) {
                    // A file system that takes O_DIRECT opens but not these
                    // transfers: the buffered descriptor serves the read.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.read_at(buf, offset)?
                    }
                    r => r?,
                }
            }
            _ => self.read_at(buf, offset)?,
        }
        self.book.record_read(class, buf.len() as u64);
        Ok(())
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        self.submit_write(block, data.len(), flags, |offset| {
            self.write_at(data, offset, flags.fua)
        })
    }

    fn write_vectored(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        // O_DIRECT needs one aligned buffer, and FUA goes through
        // `pwritev2(RWF_DSYNC)` of one: both take the joined copy.
        if parts.len() < 2 || self.direct || flags.fua {
            return crate::write_joined(self, block, parts, flags);
        }
        let len = parts.iter().map(|p| p.len()).sum();
        self.submit_write(block, len, flags, |offset| {
            self.pwritev_all(parts, offset, 0)
        })
    }

    fn flush(&self) -> io::Result<()> {
        self.check_not_failed()?;
        self.book.flush(|| {
            self.file.sync_data().inspect_err(|_| {
                self.flush_failed.store(true, Ordering::SeqCst);
            })
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

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A gathered write is one request of the joined bytes, however many
    /// parts (past one `pwritev`'s limit too) and wherever they live.
    #[test]
    fn vectored_writes_are_one_request_of_the_joined_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::create(dir.path().join("img"), 64 << 20, 4096).unwrap();
        let parts: Vec<Vec<u8>> = (0..3).map(|k| pattern(4096 * (k + 1), k as u8)).collect();
        let mut refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        // An empty part is passed over.
        refs.insert(1, &[]);
        d.write_vectored(7, &refs, WriteFlags::new(BlockClass::Data))
            .unwrap();
        let mut buf = vec![0u8; 6 * 4096];
        d.read(7, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf, parts.concat());
        let c = d.counters();
        assert_eq!(c.class(BlockClass::Data).writes, 1);
        assert_eq!(c.class(BlockClass::Data).write_bytes, 6 * 4096);

        let many: Vec<Vec<u8>> = (0..1100).map(|k| pattern(4096, k as u8)).collect();
        let refs: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        d.write_vectored(100, &refs, WriteFlags::new(BlockClass::Journal))
            .unwrap();
        let mut buf = vec![0u8; 1100 * 4096];
        d.read(100, &mut buf, BlockClass::Journal).unwrap();
        assert_eq!(buf, many.concat());
        assert_eq!(d.counters().class(BlockClass::Journal).writes, 1);

        let e = d
            .write_vectored(
                d.block_count() - 1,
                &[&many[0], &many[1]],
                WriteFlags::new(BlockClass::Data),
            )
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn create_is_sparse_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 64 << 20, 4096).unwrap();
        assert_eq!(d.block_count(), (64 << 20) / 4096);
        assert!(!d.is_block_device());
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "a new image is sparse");
        let data = pattern(3 * 4096, 5);
        let t = d
            .write(100, &data, WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert_eq!(d.durable(), 0);
        d.flush().unwrap();
        assert_eq!(d.durable(), t);
        let mut buf = vec![0u8; 3 * 4096];
        d.read(100, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf, data);
        let c = d.counters();
        assert_eq!(c.class(BlockClass::Data).writes, 1);
        assert_eq!(c.class(BlockClass::Data).write_bytes, 3 * 4096);
        assert_eq!(c.flushes, 1);
        let e = d
            .read(d.block_count(), &mut buf[..4096], BlockClass::Data)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn fua_write_is_durable_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::create(dir.path().join("img"), 1 << 20, 1024).unwrap();
        let a = d
            .write(1, &pattern(1024, 1), WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.flush().unwrap();
        assert_eq!(d.durable(), a);
        let b = d
            .write(2, &pattern(1024, 2), WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        assert_eq!(d.durable(), b, "FUA write right after a flush is durable");
        let c = d.counters();
        assert_eq!(c.class(BlockClass::Journal).fua_writes, 1);
        let mut buf = vec![0u8; 1024];
        d.read(2, &mut buf, BlockClass::Journal).unwrap();
        assert_eq!(buf, pattern(1024, 2));
    }

    #[test]
    fn fua_fallback_writes_and_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::create(dir.path().join("img"), 1 << 20, 4096).unwrap();
        assert!(
            !d.fua_emulated(),
            "RWF_DSYNC is supported on the test file system"
        );
        // As if the kernel had refused RWF_DSYNC once.
        d.fua_fallback.store(true, Ordering::Relaxed);
        let t = d
            .write(7, &pattern(4096, 3), WriteFlags::fua(BlockClass::Journal))
            .unwrap();
        assert_eq!(d.durable(), t);
        let mut buf = vec![0u8; 4096];
        d.read(7, &mut buf, BlockClass::Journal).unwrap();
        assert_eq!(buf, pattern(4096, 3));
        assert_eq!(d.counters().class(BlockClass::Journal).fua_writes, 1);
    }

    #[test]
    fn failed_flush_is_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::create(dir.path().join("img"), 1 << 20, 4096).unwrap();
        let t = d
            .write(0, &pattern(4096, 1), WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.flush_failed.store(true, Ordering::SeqCst);
        assert!(d.flush().is_err());
        assert!(d
            .write(1, &pattern(4096, 2), WriteFlags::new(BlockClass::Data))
            .is_err());
        assert_eq!(d.durable(), 0, "nothing became durable after the failure");
        assert!(t > 0);
        let mut buf = vec![0u8; 4096];
        d.read(0, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(buf, pattern(4096, 1), "reads still work");
    }

    #[test]
    fn create_refuses_to_shrink_but_extends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        drop(FileDevice::create(&p, 1 << 20, 4096).unwrap());
        let e = FileDevice::create(&p, 1 << 19, 4096).unwrap_err();
        assert!(matches!(e, DevError::WouldShrink { .. }), "{e}");
        let d = FileDevice::create(&p, 2 << 20, 4096).unwrap();
        assert_eq!(d.block_count(), 512);
    }

    #[test]
    fn exclusive_lock_refuses_second_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 1 << 20, 4096).unwrap();
        let e = FileDevice::open(&p, 4096, OpenOptions::default()).unwrap_err();
        assert!(matches!(e, DevError::InUse { .. }));
        assert!(e.to_string().contains("already in use"), "{e}");
        let e = FileDevice::open(&p, 4096, OpenOptions::read_only()).unwrap_err();
        assert!(
            matches!(e, DevError::InUse { .. }),
            "a reader waits for the writer"
        );
        // A non-exclusive open (a debugging tool) is still possible.
        let peek = FileDevice::open(
            &p,
            4096,
            OpenOptions {
                read_only: true,
                direct: false,
                exclusive: false,
            },
        )
        .unwrap();
        assert_eq!(peek.block_count(), 256);
        drop(d);
        let r1 = FileDevice::open(&p, 4096, OpenOptions::read_only()).unwrap();
        let _r2 = FileDevice::open(&p, 4096, OpenOptions::read_only()).unwrap();
        let e = r1
            .write(0, &[0u8; 4096], WriteFlags::new(BlockClass::Data))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        let e = FileDevice::open(&p, 4096, OpenOptions::default()).unwrap_err();
        assert!(
            matches!(e, DevError::InUse { .. }),
            "a writer waits for readers"
        );
    }

    #[test]
    fn direct_io_with_unaligned_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        drop(FileDevice::create(&p, 1 << 20, 4096).unwrap());
        let opts = OpenOptions {
            direct: true,
            ..OpenOptions::default()
        };
        let d = match FileDevice::open(&p, 4096, opts) {
            Ok(d) => d,
            // tmpfs and some overlay file systems refuse O_DIRECT.
            Err(DevError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("O_DIRECT not supported on the temp directory; skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        // An unaligned slice: offset by one byte inside a larger vector.
        let mut backing = vec![0u8; 2 * 4096 + 1];
        backing[1..].copy_from_slice(&pattern(2 * 4096, 9));
        d.write(3, &backing[1..], WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.write(5, &backing[1..4097], WriteFlags::fua(BlockClass::Data))
            .unwrap();
        let mut out = vec![0u8; 3 * 4096 + 1];
        d.read(3, &mut out[1..], BlockClass::Data).unwrap();
        assert_eq!(out[1..2 * 4096 + 1], backing[1..]);
        assert_eq!(out[2 * 4096 + 1..], backing[1..4097]);
    }

    #[test]
    fn large_data_reads_see_buffered_writes_not_yet_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 8 << 20, 4096).unwrap();
        let direct_ok = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .is_ok();
        assert_eq!(
            d.bulk.is_some(),
            direct_ok,
            "a buffered device takes a direct descriptor where the file system allows one"
        );
        let n = BULK_READ_MIN_BYTES * 2;
        let blocks = (n / 4096) as u64;
        let old = pattern(n, 3);
        d.write(16, &old, WriteFlags::new(BlockClass::Data))
            .unwrap();
        d.flush().unwrap();
        // Rewritten in the host's page cache only: a direct read must
        // still return the new bytes (the kernel writes the range back
        // before it reads around the cache).
        let new = pattern(n, 77);
        d.write(16, &new, WriteFlags::new(BlockClass::Data))
            .unwrap();
        let mut aligned = AlignedBuf::zeroed(n);
        d.read(16, aligned.as_mut_slice(), BlockClass::Data)
            .unwrap();
        assert!(aligned.as_slice() == new.as_slice(), "aligned direct read");
        let mut unaligned = vec![0u8; n + 1];
        d.read(16, &mut unaligned[1..], BlockClass::Data).unwrap();
        assert!(unaligned[1..] == new[..], "unaligned direct read");
        // A small read and a metadata read take the buffered path and
        // agree.
        let mut small = vec![0u8; 4096];
        d.read(16 + blocks - 1, &mut small, BlockClass::ExtentTree)
            .unwrap();
        assert_eq!(small, new[n - 4096..]);
        assert_eq!(d.counters().total().read_bytes, (2 * n + 4096) as u64);
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        assert!(FileDevice::create(&p, 1 << 20, 1000).is_err());
        assert!(FileDevice::create(&p, 100, 4096).is_err());
        let e =
            FileDevice::open(dir.path().join("missing"), 4096, OpenOptions::default()).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let e = FileDevice::open(dir.path(), 4096, OpenOptions::read_only()).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
}
