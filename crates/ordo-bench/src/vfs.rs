//! The file-system interface the workloads are written against.
//!
//! A workload runs unchanged on a mounted directory (the kernel's ext4,
//! tmpfs, ordo through FUSE: [`PosixVfs`]) and in-process on the library
//! ([`LibVfs`], ordo's `Fs` over a device, optionally a timing model). The
//! interface is the small subset of POSIX the papers' workloads use; paths
//! are relative to the file system's root and use `/`.
//!
//! Each implementation also owns the benchmark's clock ([`Vfs::now_ns`]):
//! the host's monotonic clock, or the timing model's virtual clock, so that
//! a run on a modeled HDD reports the HDD's time and not this machine's.
//!
//! ccfs's streams (Pillai et al., FAST '17) are reached through the same
//! interface: [`Vfs::set_stream`] puts the caller in a stream (on the
//! library the calling thread; through FUSE this whole process, since the
//! mount keys streams by process), [`Vfs::streamsync`] makes one durable,
//! and [`Vfs::spawn_in_stream`] runs a concurrent writer in a stream of its
//! own (a thread on the library, a forked child process on a mount).
//! [`Vfs::device_write_bytes`] reads the device's write counter at any
//! moment, so a workload can say what one call wrote.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_dev::{BlockDevice, FileDevice, TimedDevice};
use ordo_fs::{Creds, FileType, Fs, Ino, SetAttr, ROOT_INO};

use crate::error::{BenchError, Result};

/// An open file.
pub trait VFile: Send + Sync {
    /// Writes all of `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at EOF).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// fsync(2): data and metadata durable.
    fn fsync(&self) -> Result<()>;
    /// Current size in bytes.
    fn size_bytes(&self) -> Result<u64>;
    /// Truncates (or extends) the file to `size` bytes (ftruncate(2)).
    fn set_len(&self, _size: u64) -> Result<()> {
        Err(BenchError::Usage(
            "this file system does not truncate open files".into(),
        ))
    }
}

/// A writer started by [`Vfs::spawn_in_stream`].
pub trait StreamTask: Send {
    /// Waits for the writer; its error if it failed.
    fn join(self: Box<Self>) -> Result<()>;
}

/// What [`Vfs::spawn_in_stream`] runs: the file system as the writer sees
/// it, in its stream.
pub type StreamWriter = Box<dyn FnOnce(&dyn Vfs) -> Result<()> + Send>;

/// A file system under test.
pub trait Vfs: Send + Sync {
    /// Creates (or truncates) a regular file and opens it read-write.
    fn create(&self, path: &str) -> Result<Box<dyn VFile>>;
    /// Opens an existing regular file read-write.
    fn open(&self, path: &str) -> Result<Box<dyn VFile>>;
    /// Creates a directory.
    fn mkdir(&self, path: &str) -> Result<()>;
    /// Removes a file.
    fn unlink(&self, path: &str) -> Result<()>;
    /// Opens a directory (`""` is the root) for [`VFile::fsync`] (the
    /// fsync(2) of a directory descriptor, which makes its entries
    /// durable); its reads and writes fail.
    fn open_dir(&self, path: &str) -> Result<Box<dyn VFile>> {
        Err(BenchError::Usage(format!(
            "open_dir {path}: this file system cannot open directories"
        )))
    }
    /// Removes an empty directory.
    fn rmdir(&self, path: &str) -> Result<()>;
    /// The size of a file (stat).
    fn size(&self, path: &str) -> Result<u64>;
    /// Names in a directory (without "." and ".."), each with "is a directory".
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>>;
    /// The directory on the host where this file system is mounted, if it is
    /// (external programs such as sqlite3 need one).
    fn host_path(&self) -> Option<&Path>;
    /// The benchmark clock, nanoseconds from an arbitrary origin.
    fn now_ns(&self) -> u64;
    /// False when the file system keeps sizes but not bytes (the FUSE
    /// floor, whose reads return zeros): a workload then checks what it
    /// reads by length alone.
    fn keeps_data(&self) -> bool {
        true
    }
    /// True if [`Vfs::now_ns`] is a timing model's virtual clock.
    fn virtual_time(&self) -> bool {
        false
    }
    /// Waits until [`Vfs::now_ns`] reads `t_ns`: sleeps on the host's
    /// clock; under a timing model the disk idles (virtual time jumps).
    fn sleep_until_ns(&self, t_ns: u64) {
        let now = self.now_ns();
        if t_ns > now {
            std::thread::sleep(Duration::from_nanos(t_ns - now));
        }
    }
    /// Puts the caller in stream `name` (made on first use) and gives the
    /// stream `flags` (`ordo_fs::stream::IGNORE_FSYNC` or 0), as `ordo run
    /// --stream NAME [--ignore-fsync]` does. The caller is the calling
    /// thread on the library and this whole process through FUSE. `false`,
    /// and nothing done, on a file system without streams (the kernel's).
    fn set_stream(&self, _name: &str, _flags: u32) -> Result<bool> {
        Ok(false)
    }
    /// True if the file system has ordo's streams (every ordo target; a
    /// mount answers the stream ioctls).
    fn has_streams(&self) -> bool {
        false
    }
    /// Makes stream `name` durable (ccfs's `streamsync`).
    fn streamsync(&self, name: &str) -> Result<()> {
        Err(BenchError::Usage(format!(
            "streamsync {name}: this file system has no streams"
        )))
    }
    /// Bytes written to the device so far: ordo's own counter in-process,
    /// the kernel's for a loop device; `None` when neither is known.
    fn device_write_bytes(&self) -> Option<u64> {
        None
    }
    /// Starts `f` concurrently with the caller, its changes in stream
    /// `name` with `flags` (see [`Vfs::set_stream`]): a thread on the
    /// library, a forked child process on a mount (streams belong to
    /// processes there). On a file system without streams `f` runs
    /// concurrently all the same.
    fn spawn_in_stream(
        &self,
        name: &str,
        _flags: u32,
        _f: StreamWriter,
    ) -> Result<Box<dyn StreamTask>> {
        Err(BenchError::Usage(format!(
            "a writer in stream {name}: this file system cannot run one"
        )))
    }
}

/// Creates `path` and every missing parent.
pub fn mkdir_all(vfs: &dyn Vfs, path: &str) -> Result<()> {
    let mut cur = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if !cur.is_empty() {
            cur.push('/');
        }
        cur.push_str(part);
        match vfs.mkdir(&cur) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes a tree, children first.
pub fn remove_all(vfs: &dyn Vfs, path: &str) -> Result<u64> {
    let mut removed = 0;
    for (name, is_dir) in vfs.list(path)? {
        let child = format!("{path}/{name}");
        if is_dir {
            removed += remove_all(vfs, &child)?;
        } else {
            vfs.unlink(&child)?;
            removed += 1;
        }
    }
    vfs.rmdir(path)?;
    Ok(removed)
}

/// True if the error is EEXIST.
pub fn is_exists(e: &BenchError) -> bool {
    errno_of(e) == Some(libc::EEXIST)
}

/// True if the error is ENOENT.
pub fn is_not_found(e: &BenchError) -> bool {
    errno_of(e) == Some(libc::ENOENT)
}

fn errno_of(e: &BenchError) -> Option<i32> {
    match e {
        BenchError::Io { source, .. } => source.raw_os_error(),
        BenchError::Fs { source, .. } => Some(source.errno()),
        _ => None,
    }
}

/// Reads a whole file in `io_bytes` requests; returns the bytes read.
pub fn read_whole(f: &dyn VFile, io_bytes: usize) -> Result<u64> {
    let mut buf = vec![0u8; io_bytes.max(1)];
    let mut off = 0u64;
    loop {
        let n = f.read_at(off, &mut buf)?;
        if n == 0 {
            return Ok(off);
        }
        off += n as u64;
    }
}

/// A benchmark clock: the host's monotonic clock, or a timing model's
/// virtual clock plus the time the modeled disk was left idle
/// ([`Vfs::sleep_until_ns`]).
#[derive(Clone)]
pub struct BenchClock {
    origin: Instant,
    timed: Option<Arc<TimedDevice<Arc<FileDevice>>>>,
    idle_ns: Arc<AtomicU64>,
}

impl BenchClock {
    /// The host's clock, or `timed`'s virtual clock if given.
    pub fn new(timed: Option<Arc<TimedDevice<Arc<FileDevice>>>>) -> Self {
        BenchClock {
            origin: Instant::now(),
            timed,
            idle_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Nanoseconds from an arbitrary origin.
    pub fn now_ns(&self) -> u64 {
        match &self.timed {
            Some(t) => t.virtual_time_ns() + self.idle_ns.load(Ordering::Relaxed),
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }

    /// True for a timing model's clock.
    pub fn is_virtual(&self) -> bool {
        self.timed.is_some()
    }

    /// Waits until the clock reads `t_ns` (in virtual time: the disk idles).
    pub fn sleep_until_ns(&self, t_ns: u64) {
        let now = self.now_ns();
        if t_ns <= now {
            return;
        }
        if self.timed.is_some() {
            self.idle_ns.fetch_add(t_ns - now, Ordering::Relaxed);
        } else {
            std::thread::sleep(Duration::from_nanos(t_ns - now));
        }
    }
}

/// A mounted directory on the host.
pub struct PosixVfs {
    root: PathBuf,
    clock: BenchClock,
    /// The device whose kernel counters [`Vfs::device_write_bytes`] reads.
    loopdev: Option<PathBuf>,
    /// ordo's own device, when this process serves the mount.
    ordo_dev: Option<Arc<FileDevice>>,
    /// The mount keeps sizes, not bytes ([`Vfs::keeps_data`]).
    discards_data: bool,
}

impl PosixVfs {
    /// The file system mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PosixVfs {
            root: root.into(),
            clock: BenchClock::new(None),
            loopdev: None,
            ordo_dev: None,
            discards_data: false,
        }
    }

    /// The same, for a mount whose reads return zeros (the FUSE floor).
    pub fn discarding_data(mut self) -> Self {
        self.discards_data = true;
        self
    }

    /// The same, with the device whose counters say what it wrote
    /// (`/dev/loopN`).
    pub fn with_loop_device(mut self, dev: Option<PathBuf>) -> Self {
        self.loopdev = dev;
        self
    }

    /// The same, served by this process (`ordo-lib:MODE,fuse`): ordo's own
    /// device counters and the timing model's clock, if any.
    pub fn served_here(mut self, dev: Arc<FileDevice>, clock: BenchClock) -> Self {
        self.ordo_dev = Some(dev);
        self.clock = clock;
        self
    }

    fn p(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    /// `ioctl(root, cmd, buf)` on the mount's root directory.
    fn root_ioctl(&self, cmd: u32, buf: &mut [u8]) -> std::io::Result<()> {
        let dir = File::open(&self.root)?;
        // SAFETY: `dir` is open; `buf` is as long as `cmd` encodes (the
        // callers pass ordo_fuse::ioctl's fixed-size buffers).
        let r = unsafe { libc::ioctl(dir.as_raw_fd(), cmd as libc::c_ulong, buf.as_mut_ptr()) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// True for the errors of an ioctl the file system does not know.
fn is_not_ordo(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::ENOSYS))
}

/// A name in an ioctl's buffer, or the usage error it cannot be.
fn ioctl_name_error(name: &str, errno: i32) -> BenchError {
    BenchError::Usage(format!(
        "stream name '{name}': {}",
        std::io::Error::from_raw_os_error(errno)
    ))
}

/// A child process forked to run a writer in its own stream.
struct ForkTask {
    pid: libc::pid_t,
    /// The read end of the pipe the child writes its error to.
    errors: Option<File>,
    name: String,
}

impl ForkTask {
    /// Forks; the child runs `f` and exits, 0 on success, 1 with the
    /// error's text on the pipe otherwise.
    fn start(name: &str, f: impl FnOnce() -> Result<()>) -> Result<ForkTask> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(BenchError::io(
                "pipe",
                "(writer)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: both descriptors were just made and are owned here.
        let (rd, wr) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        // SAFETY: the child only runs `f` (file I/O through std, which
        // allocates: glibc's malloc is fork-safe) and leaves with _exit,
        // running no destructor of the parent's state.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(BenchError::io(
                "fork",
                "(writer)",
                std::io::Error::last_os_error(),
            ));
        }
        if pid == 0 {
            drop(rd);
            // Everything else the parent had open goes: a forked child that
            // never execs would otherwise keep, for as long as it runs, the
            // descriptors (and so the locks, such as an exclusively opened
            // device's flock) of whatever else the parent was doing.
            let keep = wr.as_raw_fd() as libc::c_uint;
            // SAFETY: close_range only closes descriptors of this process;
            // none of the ones closed is used by the child afterwards.
            unsafe {
                if keep > 3 {
                    libc::syscall(
                        libc::SYS_close_range,
                        3 as libc::c_uint,
                        keep - 1,
                        0 as libc::c_uint,
                    );
                }
                libc::syscall(
                    libc::SYS_close_range,
                    keep + 1,
                    libc::c_uint::MAX,
                    0 as libc::c_uint,
                );
            }
            let code = match f() {
                Ok(()) => 0,
                Err(e) => {
                    let mut w = wr;
                    let msg = e.to_string();
                    let _ = w.write_all(&msg.as_bytes()[..msg.len().min(4096)]);
                    1
                }
            };
            // SAFETY: ends the child without unwinding into the parent's code.
            unsafe { libc::_exit(code) };
        }
        drop(wr);
        Ok(ForkTask {
            pid,
            errors: Some(rd),
            name: name.to_string(),
        })
    }

    fn wait(&mut self) -> std::io::Result<libc::c_int> {
        let mut status = 0;
        loop {
            // SAFETY: `pid` is this task's child, not yet reaped.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.pid = 0;
                return Ok(status);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl StreamTask for ForkTask {
    fn join(mut self: Box<Self>) -> Result<()> {
        let status = self
            .wait()
            .map_err(|e| BenchError::io("waitpid", "(writer)", e))?;
        let mut msg = String::new();
        if let Some(mut rd) = self.errors.take() {
            let _ = rd.read_to_string(&mut msg);
        }
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            return Ok(());
        }
        Err(BenchError::Workload {
            workload: format!("writer in stream {}", self.name),
            detail: if msg.is_empty() {
                format!("child process ended with status {status:#x}")
            } else {
                msg
            },
        })
    }
}

impl Drop for ForkTask {
    fn drop(&mut self) {
        if self.pid > 0 {
            // Never joined (the caller failed first): stop the writer.
            // SAFETY: `pid` is this task's child, not yet reaped.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.wait();
        }
    }
}

/// A writer thread of the library.
struct ThreadTask(std::thread::JoinHandle<Result<()>>);

impl StreamTask for ThreadTask {
    fn join(self: Box<Self>) -> Result<()> {
        self.0.join().unwrap_or_else(|_| {
            Err(BenchError::Workload {
                workload: "writer thread".into(),
                detail: "it panicked".into(),
            })
        })
    }
}

struct PosixFile {
    file: File,
    path: PathBuf,
}

impl VFile for PosixFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| BenchError::io("write", &self.path, e))
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BenchError::io("read", &self.path, e)),
            }
        }
    }
    fn fsync(&self) -> Result<()> {
        self.file
            .sync_all()
            .map_err(|e| BenchError::io("fsync", &self.path, e))
    }
    fn size_bytes(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| BenchError::io("fstat", &self.path, e))
    }
    fn set_len(&self, size: u64) -> Result<()> {
        self.file
            .set_len(size)
            .map_err(|e| BenchError::io("ftruncate", &self.path, e))
    }
}

impl Vfs for PosixVfs {
    fn create(&self, path: &str) -> Result<Box<dyn VFile>> {
        let p = self.p(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .map_err(|e| BenchError::io("create", &p, e))?;
        Ok(Box::new(PosixFile { file, path: p }))
    }
    fn open(&self, path: &str) -> Result<Box<dyn VFile>> {
        let p = self.p(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| BenchError::io("open", &p, e))?;
        Ok(Box::new(PosixFile { file, path: p }))
    }
    fn mkdir(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::create_dir(&p).map_err(|e| BenchError::io("mkdir", &p, e))
    }
    fn open_dir(&self, path: &str) -> Result<Box<dyn VFile>> {
        let p = self.p(path);
        // Read-only, as open(2) of a directory must be.
        let file = File::open(&p).map_err(|e| BenchError::io("open", &p, e))?;
        Ok(Box::new(PosixFile { file, path: p }))
    }
    fn unlink(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::remove_file(&p).map_err(|e| BenchError::io("unlink", &p, e))
    }
    fn rmdir(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::remove_dir(&p).map_err(|e| BenchError::io("rmdir", &p, e))
    }
    fn size(&self, path: &str) -> Result<u64> {
        let p = self.p(path);
        std::fs::metadata(&p)
            .map(|m| m.len())
            .map_err(|e| BenchError::io("stat", &p, e))
    }
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>> {
        let p = self.p(dir);
        let mut out = Vec::new();
        for ent in std::fs::read_dir(&p).map_err(|e| BenchError::io("readdir", &p, e))? {
            let ent = ent.map_err(|e| BenchError::io("readdir", &p, e))?;
            let is_dir = ent
                .file_type()
                .map_err(|e| BenchError::io("readdir", &p, e))?
                .is_dir();
            out.push((ent.file_name().to_string_lossy().into_owned(), is_dir));
        }
        out.sort();
        Ok(out)
    }
    fn host_path(&self) -> Option<&Path> {
        Some(&self.root)
    }
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
    fn keeps_data(&self) -> bool {
        !self.discards_data
    }
    fn virtual_time(&self) -> bool {
        self.clock.is_virtual()
    }
    fn sleep_until_ns(&self, t_ns: u64) {
        self.clock.sleep_until_ns(t_ns)
    }
    fn set_stream(&self, name: &str, flags: u32) -> Result<bool> {
        let mut buf = ordo_fuse::ioctl::stream_flags_buffer(name.as_bytes(), flags)
            .map_err(|e| ioctl_name_error(name, e))?;
        match self.root_ioctl(ordo_fuse::ioctl::ORDO_IOC_SETSTREAMFLAGS, &mut buf) {
            Ok(()) => Ok(true),
            Err(e) if is_not_ordo(&e) => Ok(false),
            Err(e) => Err(BenchError::io("setstream", &self.root, e)),
        }
    }
    fn has_streams(&self) -> bool {
        let mut buf = [0u8; ordo_fuse::ioctl::NAME_BUF_BYTES];
        self.root_ioctl(ordo_fuse::ioctl::ORDO_IOC_GETSTREAM, &mut buf)
            .is_ok()
    }
    fn streamsync(&self, name: &str) -> Result<()> {
        let mut buf = ordo_fuse::ioctl::name_buffer(name.as_bytes())
            .map_err(|e| ioctl_name_error(name, e))?;
        self.root_ioctl(ordo_fuse::ioctl::ORDO_IOC_STREAMSYNC, &mut buf)
            .map_err(|e| BenchError::io("streamsync", &self.root, e))
    }
    fn device_write_bytes(&self) -> Option<u64> {
        if let Some(d) = &self.ordo_dev {
            return Some(d.counters().by_class.iter().map(|c| c.write_bytes).sum());
        }
        let d = self.loopdev.as_ref()?;
        crate::sys::BlockStat::read(d).ok().map(|s| s.write_bytes())
    }
    fn spawn_in_stream(
        &self,
        name: &str,
        flags: u32,
        f: StreamWriter,
    ) -> Result<Box<dyn StreamTask>> {
        if self.clock.is_virtual() {
            return Err(BenchError::Usage(format!(
                "a concurrent writer in stream {name}: not in virtual time (the model has one clock)"
            )));
        }
        let task = ForkTask::start(name, || {
            // In the child: this process joins the stream, the parent
            // stays where it is.
            self.set_stream(name, flags)?;
            f(self)
        })?;
        Ok(Box::new(task))
    }
}

/// ordo's library, in this process.
pub struct LibVfs {
    fs: Arc<Fs>,
    clock: BenchClock,
    /// The device, for its write counter.
    dev: Option<Arc<FileDevice>>,
    /// In virtual time the library runs no timer thread: the commit
    /// interval's write-back is run here when idle time crosses a
    /// multiple of it (nanoseconds; 0: never).
    timer_ns: u64,
    /// The next multiple of `timer_ns` the timer fires at.
    next_tick_ns: AtomicU64,
}

impl LibVfs {
    /// `fs`, timed by the host clock, or by `clock`'s virtual time if given.
    pub fn new(fs: Arc<Fs>, clock: Option<Arc<TimedDevice<Arc<FileDevice>>>>) -> Self {
        LibVfs {
            fs,
            clock: BenchClock::new(clock),
            dev: None,
            timer_ns: 0,
            next_tick_ns: AtomicU64::new(0),
        }
    }

    /// The same, with the device whose counter
    /// [`Vfs::device_write_bytes`] reads.
    pub fn with_device(mut self, dev: Arc<FileDevice>) -> Self {
        self.dev = Some(dev);
        self
    }

    /// The same, with the commit timer run in idle virtual time every
    /// `interval_ms` (the library's timer thread is off in virtual time).
    pub fn with_virtual_timer(mut self, interval_ms: u64) -> Self {
        if self.clock.is_virtual() && interval_ms > 0 {
            self.timer_ns = interval_ms.saturating_mul(1_000_000);
            let now = self.clock.now_ns();
            self.next_tick_ns
                .store((now / self.timer_ns + 1) * self.timer_ns, Ordering::Relaxed);
        }
        self
    }

    /// A second handle on the same file system and clock (for a writer
    /// thread).
    fn twin(&self) -> LibVfs {
        LibVfs {
            fs: self.fs.clone(),
            clock: self.clock.clone(),
            dev: self.dev.clone(),
            timer_ns: 0,
            next_tick_ns: AtomicU64::new(0),
        }
    }

    fn fs_err(op: &'static str, path: &str, source: ordo_fs::FsError) -> BenchError {
        BenchError::Fs {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// The inode of `path` ("" is the root).
    fn resolve(&self, path: &str) -> Result<Ino> {
        if path.is_empty() {
            return Ok(ROOT_INO);
        }
        self.fs
            .lookup_path(&format!("/{path}"))
            .map(|a| a.ino)
            .map_err(|e| Self::fs_err("lookup", path, e))
    }

    /// The parent directory's inode and the last component of `path`.
    fn parent<'p>(&self, path: &'p str) -> Result<(Ino, &'p str)> {
        let (dir, name) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        Ok((self.resolve(dir)?, name))
    }

    fn open_ino(&self, ino: Ino, path: &str) -> Result<Box<dyn VFile>> {
        self.fs
            .open(ino)
            .map_err(|e| Self::fs_err("open", path, e))?;
        Ok(Box::new(LibFile(LibNode {
            fs: self.fs.clone(),
            ino,
            path: path.to_string(),
        })))
    }
}

/// An inode of the library open by path: what files and directories share.
struct LibNode {
    fs: Arc<Fs>,
    ino: Ino,
    path: String,
}

impl LibNode {
    fn err(&self, op: &'static str, e: ordo_fs::FsError) -> BenchError {
        LibVfs::fs_err(op, &self.path, e)
    }
    fn fsync(&self) -> Result<()> {
        self.fs
            .fsync(self.ino, false)
            .map_err(|e| self.err("fsync", e))
    }
    fn size_bytes(&self) -> Result<u64> {
        self.fs
            .getattr(self.ino)
            .map(|a| a.size)
            .map_err(|e| self.err("getattr", e))
    }
}

struct LibFile(LibNode);

impl Drop for LibFile {
    fn drop(&mut self) {
        // Close errors have no caller to go to; a failed release shows up
        // as a leaked inode in ordo's fsck, not as a wrong benchmark figure.
        let _ = self.0.fs.release(self.0.ino);
    }
}

impl VFile for LibFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let f = &self.0;
        let mut done = 0usize;
        while done < data.len() {
            let n =
                f.fs.write(f.ino, offset + done as u64, &data[done..])
                    .map_err(|e| f.err("write", e))?;
            if n == 0 {
                return Err(BenchError::io(
                    "write",
                    &f.path,
                    std::io::Error::new(std::io::ErrorKind::WriteZero, "wrote nothing"),
                ));
            }
            done += n as usize;
        }
        Ok(())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let f = &self.0;
        let want = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let got =
            f.fs.read(f.ino, offset, want)
                .map_err(|e| f.err("read", e))?;
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        Ok(n)
    }
    fn fsync(&self) -> Result<()> {
        self.0.fsync()
    }
    fn size_bytes(&self) -> Result<u64> {
        self.0.size_bytes()
    }
    fn set_len(&self, size: u64) -> Result<()> {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        let f = &self.0;
        f.fs.setattr(f.ino, &set)
            .map(|_| ())
            .map_err(|e| f.err("truncate", e))
    }
}

/// A directory of the library, open for fsync.
struct LibDir(LibNode);

impl LibDir {
    fn is_dir(&self, op: &'static str) -> BenchError {
        BenchError::io(
            op,
            &self.0.path,
            std::io::Error::from_raw_os_error(libc::EISDIR),
        )
    }
}

impl VFile for LibDir {
    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(self.is_dir("write"))
    }
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<usize> {
        Err(self.is_dir("read"))
    }
    fn fsync(&self) -> Result<()> {
        self.0.fsync()
    }
    fn size_bytes(&self) -> Result<u64> {
        self.0.size_bytes()
    }
}

impl Vfs for LibVfs {
    fn create(&self, path: &str) -> Result<Box<dyn VFile>> {
        let (parent, name) = self.parent(path)?;
        let ino = match self.fs.lookup(parent, name.as_bytes()) {
            Ok(a) => {
                let truncate = SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                };
                self.fs
                    .setattr(a.ino, &truncate)
                    .map_err(|e| Self::fs_err("truncate", path, e))?;
                a.ino
            }
            Err(e) if e.errno() == libc::ENOENT => {
                self.fs
                    .create(
                        parent,
                        name.as_bytes(),
                        FileType::Regular,
                        0o644,
                        0,
                        &Creds::root(),
                    )
                    .map_err(|e| Self::fs_err("create", path, e))?
                    .ino
            }
            Err(e) => return Err(Self::fs_err("lookup", path, e)),
        };
        self.open_ino(ino, path)
    }
    fn open(&self, path: &str) -> Result<Box<dyn VFile>> {
        let ino = self.resolve(path)?;
        self.open_ino(ino, path)
    }
    fn mkdir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .mkdir(parent, name.as_bytes(), 0o755, &Creds::root())
            .map(|_| ())
            .map_err(|e| Self::fs_err("mkdir", path, e))
    }
    fn unlink(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .unlink(parent, name.as_bytes())
            .map_err(|e| Self::fs_err("unlink", path, e))
    }
    fn open_dir(&self, path: &str) -> Result<Box<dyn VFile>> {
        let ino = self.resolve(path)?;
        Ok(Box::new(LibDir(LibNode {
            fs: self.fs.clone(),
            ino,
            path: path.to_string(),
        })))
    }
    fn rmdir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .rmdir(parent, name.as_bytes())
            .map_err(|e| Self::fs_err("rmdir", path, e))
    }
    fn size(&self, path: &str) -> Result<u64> {
        let ino = self.resolve(path)?;
        self.fs
            .getattr(ino)
            .map(|a| a.size)
            .map_err(|e| Self::fs_err("getattr", path, e))
    }
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>> {
        /// Entries asked for per readdir call.
        const BATCH_ENTRIES: usize = 256;
        let ino = self.resolve(dir)?;
        let mut out = Vec::new();
        let mut cookie = 0u64;
        loop {
            let batch = self
                .fs
                .readdir(ino, cookie, BATCH_ENTRIES)
                .map_err(|e| Self::fs_err("readdir", dir, e))?;
            let Some(last) = batch.last() else { break };
            cookie = last.next_offset;
            for e in batch {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                out.push((
                    String::from_utf8_lossy(&e.name).into_owned(),
                    e.kind == FileType::Directory,
                ));
            }
        }
        out.sort();
        Ok(out)
    }
    fn host_path(&self) -> Option<&Path> {
        None
    }
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
    fn virtual_time(&self) -> bool {
        self.clock.is_virtual()
    }
    fn sleep_until_ns(&self, t_ns: u64) {
        self.clock.sleep_until_ns(t_ns);
        if self.timer_ns == 0 {
            return;
        }
        // The commit timer, at every multiple of the interval the idle
        // time crossed (its write-back moves the clock on too).
        loop {
            let tick = self.next_tick_ns.load(Ordering::Relaxed);
            if self.clock.now_ns() < tick {
                break;
            }
            self.next_tick_ns
                .store(tick + self.timer_ns, Ordering::Relaxed);
            // A failed timer write-back has no caller; the next fsync or
            // the unmount reports the file system's state.
            let _ = self.fs.write_back();
        }
    }
    fn set_stream(&self, name: &str, flags: u32) -> Result<bool> {
        let id = self
            .fs
            .setstream(name.as_bytes())
            .map_err(|e| Self::fs_err("setstream", name, e))?;
        self.fs
            .set_stream_flags(id, flags)
            .map_err(|e| Self::fs_err("setstreamflags", name, e))?;
        Ok(true)
    }
    fn has_streams(&self) -> bool {
        true
    }
    fn streamsync(&self, name: &str) -> Result<()> {
        let id = self
            .fs
            .find_stream(name.as_bytes())
            .ok_or_else(|| BenchError::Usage(format!("streamsync: no stream named '{name}'")))?;
        self.fs
            .streamsync(id)
            .map_err(|e| Self::fs_err("streamsync", name, e))
    }
    fn device_write_bytes(&self) -> Option<u64> {
        self.dev
            .as_ref()
            .map(|d| d.counters().by_class.iter().map(|c| c.write_bytes).sum())
    }
    fn spawn_in_stream(
        &self,
        name: &str,
        flags: u32,
        f: StreamWriter,
    ) -> Result<Box<dyn StreamTask>> {
        if self.clock.is_virtual() {
            return Err(BenchError::Usage(format!(
                "a concurrent writer in stream {name}: not in virtual time (the model has one clock)"
            )));
        }
        let vfs = self.twin();
        let name = name.to_string();
        Ok(Box::new(ThreadTask(std::thread::spawn(move || {
            vfs.set_stream(&name, flags)?;
            f(&vfs)
        }))))
    }
}

/// A device as the in-process target holds it: the file device, and the
/// timing model wrapped around it when one was asked for.
pub fn lib_device(
    dev: Arc<FileDevice>,
    timed: Option<&Arc<TimedDevice<Arc<FileDevice>>>>,
) -> Arc<dyn BlockDevice> {
    match timed {
        Some(t) => t.clone(),
        None => dev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_vfs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        mkdir_all(&v, "a/b/c").unwrap();
        mkdir_all(&v, "a/b").unwrap();
        let f = v.create("a/b/c/f").unwrap();
        f.write_at(0, b"hello").unwrap();
        f.write_at(5, b" world").unwrap();
        f.fsync().unwrap();
        assert_eq!(f.size_bytes().unwrap(), 11);
        drop(f);
        assert_eq!(v.size("a/b/c/f").unwrap(), 11);
        let f = v.open("a/b/c/f").unwrap();
        assert_eq!(read_whole(&*f, 4).unwrap(), 11);
        assert_eq!(
            v.list("a/b").unwrap(),
            vec![("c".to_string(), true)],
            "list shows directories"
        );
        assert!(is_not_found(&v.open("nope").err().unwrap()));
        assert!(is_exists(&v.mkdir("a").unwrap_err()));
        assert_eq!(remove_all(&v, "a").unwrap(), 1);
        assert!(v.list("").unwrap().is_empty());
        let t0 = v.now_ns();
        assert!(v.now_ns() >= t0);
        assert!(!v.virtual_time());
    }
}
