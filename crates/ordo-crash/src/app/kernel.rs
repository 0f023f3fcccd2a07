//! The kernel's ext4 on a recording device.
//!
//! To explore the crash states of the kernel's own ext4 the way it explores
//! ordo's, the explorer needs the block I/O the kernel issues: every write
//! and every cache flush, in the order the device saw them (the role of
//! dm-log-writes, which needs device-mapper). Here the device is a file:
//!
//! ```text
//! ext4 (kernel) ── /dev/loopN ── <fuse>/disk ── this process ── RecordingDevice
//! ```
//!
//! A one-file FUSE file system served from a thread of this process exposes
//! `disk`, as large as the device; its reads, writes and fsyncs are block
//! reads, writes and flushes of an [`ordo_dev::RecordingDevice`]. The loop
//! driver attaches it (with direct I/O when the kernel allows it) and the
//! kernel mounts ext4 on the loop device.
//!
//! Why the log is the kernel's block I/O, request for request:
//!
//! - The FUSE mount does not negotiate `FUSE_WRITEBACK_CACHE`, and `disk`
//!   is opened with `FOPEN_DIRECT_IO`: there is no page cache of `disk`
//!   between the loop driver and this process, and every write the loop
//!   driver submits is a FUSE `WRITE` that completes only after it is
//!   logged here. So when the kernel sees a bio complete, its write is in
//!   the log, ahead of any flush the kernel issues afterwards.
//! - The loop driver advertises a volatile write cache and no FUA
//!   (`queue/write_cache` "write back", `queue/fua` 0). The block layer
//!   then runs a `REQ_PREFLUSH` as a separate flush request before the
//!   write and emulates `REQ_FUA` by a flush request after it; the loop
//!   driver turns every flush request into `vfs_fsync` of its backing
//!   file, which FUSE sends here as `FSYNC`: one [`BlockDevice::flush`]
//!   each. So no recorded write is FUA, and a jbd2 commit block
//!   (`REQ_PREFLUSH | REQ_FUA`) shows up as flush, commit block, flush.
//!   That is a device ext4 must be correct on; the states the explorer
//!   derives are those of such a device (after a commit, everything written
//!   before it is durable too, where a FUA-capable device might still lose
//!   an earlier unflushed write).
//! - Loop direct I/O, when the kernel allows it on a FUSE file (Linux 6.18
//!   does), only spares the loop worker a copy. When `losetup
//!   --direct-io=on` is refused, the loop device runs buffered, which logs
//!   the same requests: the loop driver writes to `disk` with
//!   `vfs_iter_write`, which without a writeback cache (and with
//!   `FOPEN_DIRECT_IO` not even a write-through cache) is a synchronous FUSE
//!   `WRITE` per request, and its flushes are the same `vfs_fsync`.
//! - Discard and write-zeroes reach a loop device's backing file as
//!   `fallocate`; it is refused here (`ENOSYS`): the loop driver stops
//!   offering discard (a dropped discard is allowed: nothing relies on
//!   discarded contents) and the block layer carries out a write-zeroes as
//!   plain writes of zeros, which are logged.
//!
//! Measured on Linux 6.18 (direct I/O on, buffered, and with and without
//! `FOPEN_DIRECT_IO`, all alike): the `fsync` of a new 100 KiB file on the
//! default data=ordered mount is 4 writes and 2 flushes: the file's 25
//! blocks in one request, the journal superblock, the descriptor and
//! metadata blocks in one request, flush, commit block, flush; and the loop
//! device's own `stat` counts the same 4 write and 2 flush requests in that
//! window (`tests/kernel_record.rs` checks both).
//!
//! The kernel does not say what a block is: every write is tagged
//! [`KERNEL_WRITE_CLASS`].

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session, SessionACL, TimeOrNow,
};
use ordo_dev::{BlockClass, BlockDevice, MemDevice, RecordingDevice, WriteFlags};

use crate::error::CrashError;

/// The class every write of the kernel is recorded with: the kernel does
/// not say what a block holds.
pub const KERNEL_WRITE_CLASS: BlockClass = BlockClass::Other;

/// Name of the one file of the FUSE mount.
const DISK_NAME: &str = "disk";
/// FUSE node id of `disk` (1 is the root directory).
const DISK_INO: INodeNo = INodeNo(2);
/// How long the kernel may cache names and attributes: nothing ever changes.
const TTL: Duration = Duration::from_secs(3600);

fn app_err(detail: impl Into<String>) -> CrashError {
    CrashError::App {
        app: "kernel-ext4".into(),
        detail: detail.into(),
    }
}

/// The kernel's ext4 mounted on a loop device whose backing file is served
/// from `dev` through FUSE, so every block write and flush the kernel issues
/// is recorded.
pub struct KernelExt4 {
    /// Holds `fuse` and `mnt`; removed last.
    _dir: tempfile::TempDir,
    /// The FUSE mount point (its one file is `disk`).
    fuse: PathBuf,
    /// The ext4 mount point.
    mnt: PathBuf,
    /// `/dev/loopN`, while attached.
    loop_dev: Option<ordo_dev::LoopDevice>,
    /// Whether the loop device does direct I/O on `disk`.
    direct_io: bool,
    /// Whether ext4 is mounted on `mnt/`.
    ext4_mounted: bool,
    /// The FUSE session serving `disk`, while mounted.
    session: Option<fuser::BackgroundSession>,
}

impl KernelExt4 {
    /// Mount. `dev` holds an ext4 image (e.g. made by
    /// [`crate::backend::make_kernel_image`] or `mkfs.ext4` on a file then
    /// loaded with [`MemDevice::from_image`]). `options` = extra
    /// `mount -o` options (`""` for defaults: data=ordered).
    ///
    /// Needs root, `/dev/fuse`, `losetup` and `mount`. On an error nothing
    /// is left mounted or attached.
    pub fn mount(
        dev: Arc<RecordingDevice<MemDevice>>,
        options: &str,
    ) -> Result<KernelExt4, CrashError> {
        let dir = tempfile::Builder::new()
            .prefix("ordo-kernel-ext4-")
            .tempdir()
            .map_err(|e| CrashError::io("kernel-ext4 temporary directory", e))?;
        let mut k = KernelExt4 {
            fuse: dir.path().join("fuse"),
            mnt: dir.path().join("mnt"),
            _dir: dir,
            loop_dev: None,
            direct_io: false,
            ext4_mounted: false,
            session: None,
        };
        // On an error `k` is dropped, which undoes whatever was done.
        k.setup(dev, options)?;
        Ok(k)
    }

    fn setup(
        &mut self,
        dev: Arc<RecordingDevice<MemDevice>>,
        options: &str,
    ) -> Result<(), CrashError> {
        let (fuse, mnt) = (self.fuse.clone(), self.mnt.clone());
        for d in [&fuse, &mnt] {
            std::fs::create_dir(d)
                .map_err(|e| CrashError::io(format!("mkdir {}", d.display()), e))?;
        }

        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("ordo-kernel-disk".into()),
            MountOption::CUSTOM("subtype=ordo-disk".into()),
            MountOption::RW,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::NoExec,
        ];
        config.acl = SessionACL::Owner;
        // One thread: requests are served (and logged) one at a time, so a
        // read-modify-write of a partial block never races another write.
        config.n_threads = Some(1);
        let session = Session::new(DiskFs { dev }, &fuse, &config)
            .and_then(Session::spawn)
            .map_err(|e| app_err(format!("FUSE mount of the disk file: {e}")))?;
        self.session = Some(session);

        // Attach first, then ask for direct I/O on the attached device, so
        // that a refusal can never leave a second device behind.
        let disk = fuse.join(DISK_NAME);
        let dev = ordo_dev::LoopDevice::attach(&disk, false).map_err(|e| app_err(e.to_string()))?;
        let loop_dev = dev.path().to_str().unwrap_or_default().to_string();
        self.loop_dev = Some(dev);
        // Refused: buffered loop I/O is as faithful (see the module
        // documentation).
        let _ = run(Command::new("losetup").args(["--direct-io=on", &loop_dev]));
        self.direct_io = loop_direct_io(&loop_dev);

        let mut cmd = Command::new("mount");
        cmd.args(["-t", "ext4"]);
        if !options.is_empty() {
            cmd.args(["-o", options]);
        }
        run(cmd.arg(&loop_dev).arg(&mnt))
            .map_err(|e| app_err(format!("mount -t ext4 {loop_dev}: {e}")))?;
        self.ext4_mounted = true;
        Ok(())
    }

    /// The ext4 mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Whether the loop device does direct I/O on the FUSE file (false when
    /// the kernel refused it and the loop device runs buffered, which logs
    /// the same requests; see the module documentation).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// The loop device ext4 is mounted from.
    pub fn loop_device(&self) -> Option<&str> {
        self.loop_dev.as_ref().and_then(|d| d.path().to_str())
    }

    /// Unmount ext4 (retrying `EBUSY` for a while), detach the loop device,
    /// unmount FUSE and join its thread. Every step runs even when an
    /// earlier one failed; the first error is returned.
    ///
    /// When ext4 stays busy (a file on it is still open) it is detached
    /// lazily, the loop device set to clear itself and the FUSE mount
    /// detached, and the error says so: the serving thread then answers
    /// the kernel until the last file is closed and everything goes away.
    pub fn unmount(mut self) -> Result<(), CrashError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), CrashError> {
        let mut first: Option<CrashError> = None;
        let mut note = |r: Result<(), CrashError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        // ext4 first: it holds the loop device, which holds `disk` open,
        // which keeps the FUSE mount busy.
        if std::mem::take(&mut self.ext4_mounted) {
            let mnt = self.mnt.clone();
            note(
                settle_unmount(&mnt).map_err(|e| app_err(format!("umount {}: {e}", mnt.display()))),
            );
        }
        if let Some(dev) = self.loop_dev.take() {
            // Detaching a loop device that is still in use (ext4 lazily
            // unmounted) sets autoclear: it goes when ext4 lets it go.
            note(dev.detach().map_err(|e| app_err(e.to_string())));
        }
        if let Some(session) = self.session.take() {
            let fuse = self.fuse.clone();
            match settle_unmount(&fuse) {
                // The kernel dropped the connection: the serving thread
                // ends by itself.
                Ok(()) => note(
                    session
                        .join()
                        .map_err(|e| app_err(format!("FUSE session: {e}"))),
                ),
                Err(e) => {
                    // Still held: ext4 was busy and is only detached, so the
                    // loop device (set to autoclear) keeps `disk` open. The
                    // mount is detached too; the serving thread goes on
                    // answering until the kernel lets go, then ends.
                    // Joining it here could wait for ever, and aborting the
                    // connection would fail ext4's last writes.
                    drop(session);
                    note(Err(app_err(format!(
                        "umount {}: {e} (detached; served until the kernel releases it)",
                        fuse.display()
                    ))));
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for KernelExt4 {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Run a command; its stdout if it succeeded.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What `/sys/block/loopN/loop/dio` says.
fn loop_direct_io(dev: &str) -> bool {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// Unmount `path`, retrying `EBUSY` ([`ordo_dev::loopdev::unmount_retrying`]);
/// in the end detach it lazily (`MNT_DETACH`) and report the `EBUSY`.
fn settle_unmount(path: &Path) -> Result<(), ordo_dev::DevError> {
    ordo_dev::loopdev::unmount_retrying(path).inspect_err(|_| {
        let _ = ordo_dev::loopdev::unmount_lazy(path);
    })
}

/// The FUSE file system: a root directory holding `disk`.
struct DiskFs {
    dev: Arc<RecordingDevice<MemDevice>>,
}

impl DiskFs {
    fn bytes(&self) -> u64 {
        self.dev.block_count() * u64::from(self.dev.block_size())
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let t = UNIX_EPOCH;
        // SAFETY: plain getters without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (kind, perm, nlink, size) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o755, 2, 0),
            DISK_INO => (FileType::RegularFile, 0o600, 1, self.bytes()),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: self.dev.block_size(),
            flags: 0,
        })
    }

    /// Read `len` bytes at byte offset `off` (within the device).
    fn read_bytes(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let bs = u64::from(self.dev.block_size());
        let first = off / bs;
        let end = off + len as u64;
        let last = end.div_ceil(bs);
        let mut buf = vec![0u8; ((last - first) * bs) as usize];
        self.dev.read(first, &mut buf, KERNEL_WRITE_CLASS)?;
        let skip = (off - first * bs) as usize;
        buf.drain(..skip);
        buf.truncate(len);
        Ok(buf)
    }

    /// Write `data` at byte offset `off` as one device request: partial
    /// blocks at either end are read first and merged.
    fn write_bytes(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let bs = u64::from(self.dev.block_size());
        let first = off / bs;
        let end = off + data.len() as u64;
        let last = end.div_ceil(bs);
        let mut buf = vec![0u8; ((last - first) * bs) as usize];
        let head = (off - first * bs) as usize;
        let bs_us = bs as usize;
        if head != 0 {
            self.dev
                .read(first, &mut buf[..bs_us], KERNEL_WRITE_CLASS)?;
        }
        if !end.is_multiple_of(bs) && (last - 1 > first || head == 0) {
            let at = buf.len() - bs_us;
            self.dev
                .read(last - 1, &mut buf[at..], KERNEL_WRITE_CLASS)?;
        }
        buf[head..head + data.len()].copy_from_slice(data);
        self.dev
            .write(first, &buf, WriteFlags::new(KERNEL_WRITE_CLASS))?;
        Ok(())
    }
}

fn errno(e: &io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) if n > 0 => Errno::from_i32(n),
        _ => Errno::EIO,
    }
}

impl fuser::Filesystem for DiskFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> io::Result<()> {
        // Nothing beyond fuser's defaults (async reads, big writes, max
        // pages): in particular not FUSE_WRITEBACK_CACHE, which would let
        // the kernel acknowledge writes it has only cached.
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT || name.as_bytes() != DISK_NAME.as_bytes() {
            return reply.error(Errno::ENOENT);
        }
        match self.attr(DISK_INO) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The disk has a fixed size and owner; time stamps are ignored.
        let Some(a) = self.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        match size {
            Some(s) if s != a.size => reply.error(Errno::EPERM),
            _ => reply.attr(&TTL, &a),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        if flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EPERM);
        }
        // No page cache of `disk` in the kernel: every loop request reaches
        // `read`/`write` here.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        let end = (offset + u64::from(size)).min(self.bytes());
        if offset >= end {
            return reply.data(&[]);
        }
        match self.read_bytes(offset, (end - offset) as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        if data.is_empty() {
            return reply.written(0);
        }
        if offset.saturating_add(data.len() as u64) > self.bytes() {
            return reply.error(Errno::ENOSPC);
        }
        match self.write_bytes(offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) promises nothing; only fsync is a device flush.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The loop driver's REQ_OP_FLUSH arrives as vfs_fsync of `disk`.
        if ino != DISK_INO {
            return reply.ok();
        }
        match self.dev.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (DISK_INO, FileType::RegularFile, DISK_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.dev.block_size();
        reply.statfs(self.dev.block_count(), 0, 0, 2, 0, bs, 255, bs);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // Discard and write-zeroes of the loop device: refused, so that the
        // kernel zeroes by plain (recorded) writes.
        reply.error(Errno::ENOSYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_dev::EventKind as DevEvent;

    fn disk() -> DiskFs {
        let mem = Arc::new(MemDevice::new(1024, 8).unwrap());
        DiskFs {
            dev: Arc::new(RecordingDevice::from_base(mem)),
        }
    }

    fn writes(fs: &DiskFs) -> Vec<(u64, usize)> {
        fs.dev
            .log()
            .iter()
            .filter_map(|e| match &e.kind {
                DevEvent::Write { block, data, .. } => Some((*block, data.len())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn partial_blocks_are_read_modified_and_written_as_one_request() {
        let fs = disk();
        let mut want = vec![0u8; 8 * 1024];
        let mut put = |off: usize, data: &[u8]| {
            fs.write_bytes(off as u64, data).unwrap();
            want[off..off + data.len()].copy_from_slice(data);
        };
        put(0, &[1u8; 2048]); // aligned, two blocks
        put(100, &[2u8; 10]); // inside block 0
        put(1000, &[3u8; 3100]); // tail of 0, all of 1..=3, head of 4
        put(7168, &[4u8; 1024]); // the last block
        put(5120, &[5u8; 1500]); // head of 5, head of 6
        assert_eq!(
            writes(&fs),
            vec![(0, 2048), (0, 1024), (0, 5120), (7, 1024), (5, 2048)]
        );
        assert_eq!(fs.read_bytes(0, want.len()).unwrap(), want);
        assert_eq!(fs.read_bytes(1001, 7).unwrap(), want[1001..1008]);
        assert_eq!(fs.read_bytes(8191, 1).unwrap(), want[8191..]);
    }

    #[test]
    fn every_write_is_tagged_and_not_fua() {
        let fs = disk();
        fs.write_bytes(512, &[9u8; 512]).unwrap();
        for e in fs.dev.log() {
            if let DevEvent::Write { fua, class, .. } = e.kind {
                assert!(!fua);
                assert_eq!(class, KERNEL_WRITE_CLASS);
            }
        }
    }
}
