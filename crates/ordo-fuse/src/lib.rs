//! The FUSE adapter: serves an [`ordo_fs::Fs`] to the kernel through
//! `fuser`.
//!
//! Why it is thin: every decision about the file system (names, permissions
//! of new inodes, allocation, durability) belongs to the core, so that the
//! library API, the crash explorer and the mount behave the same. This layer
//! only translates: FUSE node ids to ext4 inode numbers, `fuser` argument
//! types to the core's, and the core's errors to errno values.
//!
//! Permission checks are the kernel's: the mount always carries
//! `default_permissions`, so the VFS applies owner/group/other bits and
//! sticky directories, and turns the clearing of suid/sgid on write and
//! chown into mode changes, before a request reaches ordo, as it does for
//! the kernel's ext4. What the VFS leaves to a file system is done here or
//! in the core: ownership of new inodes and setgid-directory inheritance
//! (the caller's uid and gid travel with every create), dropping S_ISGID
//! when a caller outside the file's group changes its mode, and the time
//! and privilege rules of truncation and `fallocate`.
//!
//! Node ids: FUSE reserves node id 1 for the root, ext4 numbers its root 2.
//! Node id 1 maps to inode 2 and every other number maps to itself (ext4
//! inode 1, the bad-blocks inode, never appears in a directory, so nothing
//! collides). `stat` still shows 2 for the root, as ext4 does.
//!
//! Concurrency: the session runs several worker threads, each with its own
//! clone of the `/dev/fuse` descriptor, and every handler calls the core
//! directly (`Fs` is `Send + Sync` and runs device I/O outside its lock), so
//! a slow `fsync` by one process does not stall reads by another. With
//! readers on demand (the default, [`MountConfig::readers_on_demand`]) one
//! worker reads while it runs and another while it waits on the device or
//! on another thread.
//!
//! ordo's own calls (osync, dsync and streams) arrive as ioctls on any
//! file or directory of the mount ([`ioctl`]); the stream of a request is
//! its process's, kept by [`callers`], and each request that may change
//! something runs in it.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::callers::PidStreams;
use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, Session, SessionACL, TimeOrNow, WriteFlags,
};
use ordo_fs::{
    Attr, Creds, FallocFlags, FileType, Fs, FsError, Ino, RenameFlags, SeekWhence, SetAttr,
    TimeSet, Timespec, ROOT_INO,
};

pub mod callers;
pub mod floor;
pub mod ioctl;
mod sync_pool;
pub mod unmount;
pub mod uring_switch;

use crate::sync_pool::SyncPool;

/// What a mount asked to use io_uring says when the kernel did not offer it.
pub const IO_URING_NOT_OFFERED: &str = "io_uring: the kernel does not offer FUSE over io_uring \
(Linux 6.14 or later with CONFIG_FUSE_IO_URING, and as root: echo Y > \
/sys/module/fuse/parameters/enable_uring); serving /dev/fuse";

/// The longest name ext4 stores in a directory entry, in bytes.
pub const NAME_MAX_BYTES: usize = 255;

/// How many directory entries one `readdir` request asks the core for; the
/// reply buffer (usually one page) is filled from them and the rest are
/// asked for again from the next cookie.
const READDIR_BATCH_ENTRIES: usize = 256;

/// How a mount is served.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Worker threads serving requests (at least 1; by default
    /// [`default_threads`], one per CPU, 2 to 4).
    pub threads: usize,
    /// Let users other than the mounting one use the mount (`allow_other`).
    pub allow_other: bool,
    /// Mount read-only in the kernel too (the core refuses writes anyway).
    pub read_only: bool,
    /// How long the kernel may cache attributes and names.
    pub attr_ttl: Duration,
    /// The source shown in `/proc/mounts` (usually the image path).
    pub fsname: String,
    /// Serve the handle a create returns with direct I/O (when the kernel
    /// lets such files be mmapped, `FUSE_DIRECT_IO_ALLOW_MMAP`): a write
    /// through it then skips the kernel's `file_remove_privs`, which costs a
    /// GETXATTR round trip per write, and the kernel asks the file system
    /// to clear set-user-ID instead (`FUSE_WRITE_KILL_SUIDGID`).
    pub direct_io_on_create: bool,
    /// Ask ordo to open and close regular files (OPEN and RELEASE
    /// requests, the default). Off, the kernel opens and closes them
    /// without a request (FUSE's `no_open`): re-reading a cached file costs
    /// no request at all. An unlinked inode then stays alive for as long
    /// as the kernel knows it (until its FORGET), not only while it is
    /// open, so the adapter counts the kernel's references
    /// ([`OrdoFuse`]); see docs/DESIGN.md, "The FUSE path".
    pub open_requests: bool,
    /// Serve requests through FUSE over io_uring when the kernel offers it
    /// (`-o io_uring`; `enable_uring` of the fuse module on, Linux 6.14 and
    /// later): one queue per CPU, each served by a thread of its own,
    /// beside the `/dev/fuse` workers, which still serve FORGET and what
    /// the kernel sends before the queues are registered. Whether the
    /// kernel took it: [`fuser::Session::io_uring`]. See docs/DESIGN.md,
    /// "The FUSE path".
    pub io_uring: bool,
    /// The most threads serving FSYNC and FSYNCDIR apart from the
    /// request workers (`-o fsync_threads=N`); 0 (the default here; see
    /// [`MountConfig::for_mode`]) serves them on the worker that read
    /// them, which then waits for the device with them ([`sync_pool`]).
    pub fsync_threads: usize,
    /// Readers on demand (`-o readers=demand`, the default; `readers=all`
    /// turns it off): with several workers, one reads and serves requests
    /// while it runs, and another reads only while every reading worker
    /// waits on the device or on another thread (the core says when:
    /// [`ordo_fs::waiting`]). Otherwise every worker reads `/dev/fuse`, and
    /// one caller's consecutive requests are served by the workers in turn.
    /// See docs/DESIGN.md, "The FUSE path".
    pub readers_on_demand: bool,
}

/// The bound of [`MountConfig::fsync_threads`] for the protocols with a
/// shared commit ([`default_fsync_threads`]): more fsyncs than this
/// waiting at once queue for a thread.
pub const FSYNC_THREADS_DEFAULT: usize = 64;

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            // The machine's count, as ordo's own mounts have it: the FUSE
            // floor takes its workers from here and must be served as
            // ordo is.
            threads: default_threads(),
            allow_other: true,
            read_only: false,
            attr_ttl: Duration::from_secs(1),
            fsname: "ordo".to_string(),
            direct_io_on_create: true,
            open_requests: true,
            io_uring: false,
            fsync_threads: 0,
            readers_on_demand: true,
        }
    }
}

impl MountConfig {
    /// The `fuser` configuration of this mount: `default_permissions`,
    /// fsname and subtype "ordo", the worker threads with cloned
    /// descriptors.
    pub fn fuser_config(&self) -> Config {
        self.fuser_config_as(ORDO_SUBTYPE)
    }

    /// The same configuration with another subtype (the mount shows as
    /// `fuse.SUBTYPE`); everything else, options and threads, is ordo's.
    pub fn fuser_config_as(&self, subtype: &str) -> Config {
        let mut options = vec![
            MountOption::FSName(self.fsname.clone()),
            // As a kernel option, not `MountOption::Subtype` (which fuser
            // hands to fusermount only): mounted directly by root, the
            // mount then shows as `fuse.ordo`, as mount(8) and fstab name it.
            MountOption::CUSTOM(format!("subtype={subtype}")),
            MountOption::DefaultPermissions,
            MountOption::Dev,
            MountOption::Suid,
            MountOption::Exec,
        ];
        options.push(if self.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        });
        let mut config = Config::default();
        config.mount_options = options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads.max(1));
        config.clone_fd = true;
        config.io_uring = self.io_uring;
        config.readers_on_demand = self.readers_on_demand;
        config
    }
}

/// Mount `fs` on `mountpoint`. The returned session serves requests once
/// [`Session::run`] is called (it returns when the file system is
/// unmounted); `fs` itself is not unmounted by the session: the caller
/// keeps its own `Arc` and calls [`Fs::unmount`] afterwards.
pub fn mount(
    fs: Arc<Fs>,
    mountpoint: &Path,
    config: &MountConfig,
) -> io::Result<Session<OrdoFuse>> {
    let mut adapter = OrdoFuse::new(fs, config.attr_ttl);
    adapter.want_direct_create = config.direct_io_on_create;
    adapter.kernel_opens = !config.open_requests;
    adapter.forget_workers = config.threads > 1;
    adapter.syncs = (config.fsync_threads > 0).then(|| SyncPool::new(config.fsync_threads));
    session(adapter, mountpoint, config, ORDO_SUBTYPE)
}

/// The worker threads a mount serves with unless told (`threads=`): one
/// per CPU the process may use, at least 2 and at most
/// [`WORKER_THREADS_MAX_DEFAULT`]. At least two, so that a FORGET finds a
/// worker while another waits for one ([`ForgetGate`]). Workers beyond
/// the CPUs only take turns at the core's lock and cost every request its
/// wake-up: on two CPUs, 2 workers create files 14-25 % faster than 4, and
/// serve varmail 11-19 % faster under the protocols that fsync on the
/// worker (docs/DESIGN.md, "The FUSE path"). The protocols whose fsyncs
/// share a commit do not need a worker per waiting fsync any more: theirs
/// wait on the fsync threads ([`default_fsync_threads`]).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, WORKER_THREADS_MAX_DEFAULT)
}

/// The most workers [`default_threads`] gives a mount, however many CPUs:
/// more fsyncs at once on the worker, under a protocol without a shared
/// commit, write the same blocks more often (8 workers cost `async` a
/// quarter of its varmail throughput).
pub const WORKER_THREADS_MAX_DEFAULT: usize = 4;

/// The fsync threads a mount of `mode` has unless told (`fsync_threads=`):
/// [`FSYNC_THREADS_DEFAULT`] for a protocol whose concurrent fsyncs share
/// a commit (`Capabilities::group_commit`), so that every fsync waiting
/// when a commit starts is in it, however few the workers; none for the
/// others, whose fsyncs stay on the worker that read them: each of those
/// writes what the file needs by itself, and sixteen at once (varmail)
/// wrote the same blocks over and over, 0.6x the throughput.
pub fn default_fsync_threads(mode: ordo_fs::ProtocolKind) -> usize {
    if mode.caps().group_commit {
        FSYNC_THREADS_DEFAULT
    } else {
        0
    }
}

impl MountConfig {
    /// The defaults for a mount of `mode`: [`MountConfig::default`] with
    /// the protocol's fsync threads.
    pub fn for_mode(mode: ordo_fs::ProtocolKind) -> Self {
        MountConfig {
            fsync_threads: default_fsync_threads(mode),
            ..MountConfig::default()
        }
    }
}

/// The subtype of ordo's mounts (`fuse.ordo` in `/proc/mounts`).
pub const ORDO_SUBTYPE: &str = "ordo";

/// Mount any `fuser::Filesystem` as ordo's mounts are: the options,
/// worker threads and cloned descriptors of `config` (see
/// [`MountConfig::fuser_config_as`]). A file system served this way should
/// also ask for [`request_capabilities`] in its `init`, so that the kernel
/// sends it the requests it sends ordo ([`floor::FloorFs`] does).
pub fn session<FS: fuser::Filesystem>(
    fs: FS,
    mountpoint: &Path,
    config: &MountConfig,
    subtype: &str,
) -> io::Result<Session<FS>> {
    if config.readers_on_demand {
        // The core's waits are where another worker must read. The hooks
        // act only on a worker of a session with readers on demand.
        ordo_fs::waiting::set_hooks(fuser::blocking_begin, fuser::blocking_end);
    }
    Session::new(fs, mountpoint, &config.fuser_config_as(subtype))
}

/// The optional capabilities an ordo session asks the kernel for at
/// `init`. Atomic O_TRUNC brings `open(O_TRUNC)` to the file system whole
/// (see `OrdoFuse::truncate_on_open`); readdirplus saves a lookup per
/// entry for `ls -l` and `find`; parallel dirops lets lookups and readdirs
/// in one directory run at once (the core has its own locking). Each is
/// optional: a kernel that lacks one is served without it, and the results
/// are the same.
///
/// Returns whether the kernel lets files opened with direct I/O be mmapped
/// (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6): only then may a create's
/// handle be served with direct I/O without breaking mmap.
///
/// A server that answers OPEN with ENOSYS (`kernel_opens`) must not ask
/// for atomic O_TRUNC: the kernel would then leave the truncation to an
/// OPEN it no longer sends, and drop it. Without it, `open(O_TRUNC)`
/// arrives as a SETATTR of size 0 with mtime set to now.
pub fn request_capabilities(config: &mut KernelConfig, kernel_opens: bool) -> bool {
    if !kernel_opens {
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
    }
    for flag in [
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
        InitFlags::FUSE_PARALLEL_DIROPS,
        // POSIX ACLs: the kernel checks permissions with the access ACL
        // it reads through getxattr, and sends the mode of a create
        // unmasked with the umask beside it, so that the core can let a
        // directory's default ACL decide (see `creds_umask`).
        InitFlags::FUSE_POSIX_ACL,
        InitFlags::FUSE_DONT_MASK,
    ] {
        let _ = config.add_capabilities(flag);
    }
    config
        .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        .is_ok()
}

/// A `fuser::Filesystem` over a shared [`Fs`].
pub struct OrdoFuse {
    fs: Arc<Fs>,
    ttl: Duration,
    /// The stream of each process using the mount (SETSTREAM).
    streams: PidStreams,
    /// The mount asked for direct I/O on create ([`MountConfig`]).
    want_direct_create: bool,
    /// ... and the kernel allows it (set at `init`).
    direct_create: bool,
    /// The kernel opens regular files without asking
    /// ([`MountConfig::open_requests`] off). Every reference the kernel
    /// holds on an inode (each positive LOOKUP, CREATE, MKNOD, MKDIR,
    /// SYMLINK, LINK and READDIRPLUS entry it is sent, less what FORGET
    /// gives back) is then one open handle in the core, so that an
    /// unlinked inode lives until the kernel forgets it, as it lives until
    /// its last close on the kernel's ext4.
    kernel_opens: bool,
    /// FORGETs being served ([`ForgetGate`]), for an allocation that runs
    /// short of space beside one.
    forgets: ForgetGate,
    /// Another worker can serve a FORGET while one waits for it (more
    /// than one worker thread).
    forget_workers: bool,
    /// The threads fsyncs are handed to (`None`: served by the worker).
    syncs: Option<SyncPool>,
}

/// The FORGETs being served, and how many have ended.
///
/// With the kernel opening files (`kernel_opens`), the space of a file
/// whose last name went comes back when the kernel forgets it, and the
/// FORGET does not come first: on Linux 6.18 the program's next request
/// after an unlink (a STATFS, a WRITE) is often read before it, even by a
/// single worker. An allocation that fails for space (ENOSPC, which
/// leaves nothing behind) while a FORGET runs, or ended since it began,
/// or while an unlinked inode is held (the orphan list is not empty),
/// waits for a FORGET to end and none to be in flight, up to
/// [`FORGET_WAIT`], and runs again if one ended (up to three times), so a
/// delete makes room for the next write at once, as on the kernel's ext4.
/// (ext4 itself retries an allocation that failed for space after forcing
/// a commit that may free blocks.) Another worker must serve the FORGET meanwhile,
/// so a mount with one worker does not wait. A file held open by a
/// process keeps its space, and an ENOSPC beside it costs that wait.
#[derive(Default)]
struct ForgetGate {
    /// (FORGETs in flight, FORGETs ended).
    state: std::sync::Mutex<(u64, u64)>,
    changed: std::sync::Condvar,
}

/// How long an allocation short of space waits for a FORGET to end.
const FORGET_WAIT: Duration = Duration::from_millis(250);

impl ForgetGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self) {
        self.lock().0 += 1;
    }

    fn end(&self) {
        let mut s = self.lock();
        debug_assert!(s.0 > 0, "a FORGET ended that never began");
        s.0 = s.0.saturating_sub(1);
        s.1 += 1;
        self.changed.notify_all();
    }

    /// FORGETs ended so far.
    fn ended(&self) -> u64 {
        self.lock().1
    }

    /// Whether a FORGET is in flight, or one ended since `before`.
    fn busy_since(&self, before: u64) -> bool {
        let s = self.lock();
        s.0 > 0 || s.1 > before
    }

    /// Waits, up to `limit`, until a FORGET has ended since `before` and
    /// none is in flight; whether one ended.
    fn wait_after(&self, before: u64, limit: Duration) -> bool {
        // The FORGET is another request: with readers on demand, another
        // worker must read it while this one waits.
        fuser::blocking_begin();
        let ended = self.wait_after_inner(before, limit);
        fuser::blocking_end();
        ended
    }

    fn wait_after_inner(&self, before: u64, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut s = self.lock();
        loop {
            if s.1 > before && s.0 == 0 {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return s.1 > before;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl std::fmt::Debug for OrdoFuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrdoFuse").field("ttl", &self.ttl).finish()
    }
}

/// FUSE node id -> ext4 inode number.
pub fn ino_from_fuse(node: INodeNo) -> Ino {
    if node.0 == INodeNo::ROOT.0 {
        ROOT_INO
    } else {
        node.0 as Ino
    }
}

/// ext4 inode number -> FUSE node id.
pub fn ino_to_fuse(ino: Ino) -> INodeNo {
    if ino == ROOT_INO {
        INodeNo::ROOT
    } else {
        INodeNo(u64::from(ino))
    }
}

/// The core's time -> `SystemTime` (ext4 times may precede 1970).
pub fn system_time(t: Timespec) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec as u64) + nsec
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nsec
    }
}

/// `SystemTime` -> the core's time.
pub fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Timespec {
                    sec: -(d.as_secs() as i64),
                    nsec: 0,
                }
            } else {
                Timespec {
                    sec: -(d.as_secs() as i64) - 1,
                    nsec: 1_000_000_000 - d.subsec_nanos(),
                }
            }
        }
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timespec(t)),
    }
}

/// The core's file type -> FUSE's.
pub fn fuse_kind(kind: FileType) -> fuser::FileType {
    match kind {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
    }
}

/// The core's attributes -> FUSE's, with `node` as the inode number the
/// kernel sees.
pub fn fuse_attr(attr: &Attr, node: INodeNo) -> FileAttr {
    FileAttr {
        ino: node,
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.crtime),
        kind: fuse_kind(attr.kind),
        perm: attr.perm & 0o7777,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// The attributes of a negative lookup reply: node 0 means "no such name".
fn negative_entry_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The errno of a core error; corruption and device failures are also
/// reported on standard error, because the application only sees a number.
pub fn errno_of(e: &FsError) -> Errno {
    match e {
        FsError::Corrupt { .. } | FsError::Io(_) => eprintln!("ordo: {e}"),
        _ => {}
    }
    Errno::from_i32(e.errno())
}

/// `rename(2)` flags -> the core's; `None` for flags ordo does not serve.
pub fn rename_flags(flags: fuser::RenameFlags) -> Option<RenameFlags> {
    let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
    if !(flags - known).is_empty() {
        return None;
    }
    let out = RenameFlags {
        noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
        exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
    };
    Some(out)
}

/// `fallocate(2)` mode -> the core's flags, or the errno Linux gives for the
/// mode (`vfs_fallocate` since 6.11): the modes (punch, zero, collapse,
/// insert, unshare) exclude each other, punching a hole requires KEEP_SIZE,
/// collapsing and inserting refuse it, all with EOPNOTSUPP; unshare is not
/// served. (The kernel's FUSE module itself passes on only KEEP_SIZE,
/// PUNCH_HOLE and ZERO_RANGE, so collapse and insert reach ordo through the
/// library API, not through a mount.)
pub fn falloc_flags(mode: i32) -> Result<FallocFlags, Errno> {
    let modes = libc::FALLOC_FL_PUNCH_HOLE
        | libc::FALLOC_FL_ZERO_RANGE
        | libc::FALLOC_FL_COLLAPSE_RANGE
        | libc::FALLOC_FL_INSERT_RANGE;
    if mode & !(modes | libc::FALLOC_FL_KEEP_SIZE) != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    if (mode & modes).count_ones() > 1 {
        return Err(Errno::EOPNOTSUPP);
    }
    let flags = FallocFlags {
        keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
        punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
        zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        collapse_range: mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0,
        insert_range: mode & libc::FALLOC_FL_INSERT_RANGE != 0,
    };
    if flags.punch_hole && !flags.keep_size {
        return Err(Errno::EOPNOTSUPP);
    }
    if (flags.collapse_range || flags.insert_range) && flags.keep_size {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(flags)
}

/// `lseek(2)` whence for data/hole search; the kernel serves SEEK_SET,
/// SEEK_CUR and SEEK_END itself.
pub fn seek_whence(whence: i32) -> Result<SeekWhence, Errno> {
    match whence {
        libc::SEEK_DATA => Ok(SeekWhence::Data),
        libc::SEEK_HOLE => Ok(SeekWhence::Hole),
        _ => Err(Errno::EINVAL),
    }
}

/// Set the kernel's readahead window of a FUSE mount (its backing device
/// info, `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`). FUSE starts every
/// mount at 128 KiB; a larger window lets a sequential read arrive in
/// requests as large as the session allows (`max_pages`), so ordo reads
/// whole extents in one device request. Needs root; the caller reports a
/// failure and the mount goes on with the kernel's window.
pub fn set_readahead(mountpoint: &Path, kib: u32) -> io::Result<()> {
    let dev = mounted_device(mountpoint)?;
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        kib.to_string(),
    )
}

/// The device (`MAJOR:MINOR`) of the mount in effect on `mountpoint` (the
/// last one on the path), from /proc/self/mountinfo; NotFound if nothing
/// is mounted there. Not from a stat of the mount point: that would be a
/// request to this very mount, which may not be serving yet, or any more.
pub(crate) fn mounted_device(mountpoint: &Path) -> io::Result<String> {
    let want = std::fs::canonicalize(mountpoint)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    // Fields: id parent MAJOR:MINOR root mountpoint ...
    info.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (unescape_mountinfo(point) == want.as_os_str().as_encoded_bytes()).then_some(dev)
        })
        .next_back()
        .map(str::to_string)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not in /proc/self/mountinfo", want.display()),
            )
        })
}

/// A path as /proc/self/mountinfo writes it (space, tab, newline and
/// backslash as octal escapes), back to bytes.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// How an open regular file is served: the kernel's page cache is kept
/// across opens (see `OrdoFuse::open`). The floor replies the same way, so
/// that it pays for the same requests.
pub const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;

/// The core's rule, re-exported for the adapter's own callers.
pub use ordo_fs::kill_suid_sgid;

/// The permission bits `perm` of the file `attr` becomes when a caller
/// other than root truncates or chowns it: ext4's rule
/// ([`kill_suid_sgid`]), with the caller's supplementary groups read only
/// when the file has a bit to lose. `None` when nothing changes.
fn perm_after_kill(
    uid: u32,
    gid: u32,
    groups: impl FnOnce() -> Vec<u32>,
    attr: &Attr,
    perm: u16,
) -> Option<u16> {
    if uid == 0 || attr.kind != FileType::Regular || perm & 0o6000 == 0 {
        return None;
    }
    let in_group = gid == attr.gid || groups().contains(&attr.gid);
    let killed = kill_suid_sgid(perm, in_group);
    (killed != perm).then_some(killed)
}

/// The supplementary groups of process `pid`, from `/proc/PID/status`
/// (FUSE requests carry only the uid and primary gid).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn creds(req: &Request) -> Creds {
    Creds {
        uid: req.uid(),
        gid: req.gid(),
        groups: Vec::new(),
        umask: 0,
    }
}

/// The caller of a create, with its umask: the core applies it unless the
/// directory's default ACL decides the new inode's bits (the mount asks
/// the kernel for `FUSE_DONT_MASK` so that the mode arrives unmasked).
fn creds_umask(req: &Request, umask: u32) -> Creds {
    Creds {
        umask: (umask & 0o777) as u16,
        ..creds(req)
    }
}

/// Answer a getxattr or listxattr: the size asked for with `size` 0,
/// ERANGE when the buffer is too small, the bytes otherwise.
fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if (size as usize) < v.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(v);
    }
}

/// A name the core may be given, or ENAMETOOLONG as ext4 answers.
fn name_bytes(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX_BYTES {
        Err(Errno::ENAMETOOLONG)
    } else {
        Ok(b)
    }
}

/// Permission bits of a new inode before the umask, which the core
/// applies (or the directory's default ACL replaces).
fn new_perm(mode: u32) -> u16 {
    (mode & 0o7777) as u16
}

impl OrdoFuse {
    /// An adapter over `fs` whose attributes and names the kernel may cache
    /// for `ttl`.
    pub fn new(fs: Arc<Fs>, ttl: Duration) -> Self {
        OrdoFuse {
            fs,
            ttl,
            streams: PidStreams::default(),
            want_direct_create: false,
            direct_create: false,
            kernel_opens: false,
            forgets: ForgetGate::default(),
            forget_workers: false,
            syncs: None,
        }
    }

    /// `op`, run again (up to three times) if it failed for space while a
    /// FORGET was about to free space beside it (see [`ForgetGate`]). A
    /// failure for space changes nothing, so running it again is safe.
    fn allocating<T>(&self, op: impl Fn() -> ordo_fs::Result<T>) -> ordo_fs::Result<T> {
        if !self.kernel_opens {
            return op();
        }
        let mut before = self.forgets.ended();
        let mut r = op();
        // As ext4 retries an allocation after a commit that may free
        // blocks, up to three times.
        for _ in 0..3 {
            if !matches!(r, Err(FsError::Errno(libc::ENOSPC))) || !self.forget_workers {
                break;
            }
            // Space may be on its way: an unlinked inode is held, or a
            // FORGET ran since the op began. In that order: a FORGET that
            // empties the orphan list after the first look has begun
            // before the second.
            let held = self.fs.has_orphans().unwrap_or(false);
            if !(held || self.forgets.busy_since(before))
                || !self.forgets.wait_after(before, FORGET_WAIT)
            {
                break;
            }
            before = self.forgets.ended();
            r = op();
        }
        r
    }

    /// FSYNC and FSYNCDIR: handed to the fsync threads when the mount has
    /// them, so that the worker goes back to reading requests while the
    /// device works; the thread that serves it takes the caller's stream
    /// first, as a worker does ([`OrdoFuse::enter`]).
    fn fsync_in_pool(&self, req: &Request, ino: INodeNo, datasync: bool, reply: ReplyEmpty) {
        let ino = ino_from_fuse(ino);
        let Some(pool) = &self.syncs else {
            self.enter(req);
            Self::empty(reply, self.fs.fsync(ino, datasync));
            return;
        };
        let stream = self.streams.stream_of(req.pid());
        let fs = self.fs.clone();
        pool.submit(Box::new(move || {
            let set = fs.set_thread_stream(stream);
            debug_assert!(set.is_ok(), "stream {stream:?} unknown to the fs");
            Self::empty(reply, fs.fsync(ino, datasync));
        }));
    }

    /// Run the request's operations in the stream of the process that
    /// made it: the worker thread takes that stream (see `callers`).
    fn enter(&self, req: &Request) {
        let stream = self.streams.stream_of(req.pid());
        // Only a stream the file system handed out is ever recorded.
        let set = self.fs.set_thread_stream(stream);
        debug_assert!(set.is_ok(), "stream {stream:?} unknown to the fs");
    }

    /// One ordo ioctl (see [`ioctl`]); the bytes to reply with.
    fn do_ioctl(
        &self,
        req: &Request,
        ino: Ino,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let fs_err = |e: FsError| errno_of(&e);
        let name_in = || {
            if in_data.len() != ioctl::NAME_BUF_BYTES {
                return Err(Errno::EINVAL);
            }
            Ok(ioctl::name_of_buffer(in_data))
        };
        match cmd {
            ioctl::ORDO_IOC_OSYNC => self.fs.osync(ino).map_err(fs_err)?,
            ioctl::ORDO_IOC_DSYNC => self.fs.dsync(ino).map_err(fs_err)?,
            ioctl::ORDO_IOC_SYNC => self.fs.sync().map_err(fs_err)?,
            ioctl::ORDO_IOC_SETSTREAM => {
                let id = self.fs.stream_id(name_in()?).map_err(fs_err)?;
                self.streams.set(req.pid(), id).map_err(Errno::from_i32)?;
            }
            ioctl::ORDO_IOC_GETSTREAM => {
                let id = self.streams.stream_of(req.pid());
                let name = self.fs.stream_name(id).unwrap_or_default();
                let mut out = ioctl::name_buffer(&name).map_err(Errno::from_i32)?.to_vec();
                if (out_size as usize) < out.len() {
                    return Err(Errno::from_i32(libc::ERANGE));
                }
                out.truncate(out_size as usize);
                return Ok(out);
            }
            ioctl::ORDO_IOC_STREAMSYNC => {
                let name = name_in()?;
                let id = if name.is_empty() {
                    self.streams.stream_of(req.pid())
                } else {
                    self.fs.find_stream(name).ok_or(Errno::EINVAL)?
                };
                self.fs.streamsync(id).map_err(fs_err)?;
            }
            ioctl::ORDO_IOC_SETSTREAMFLAGS => {
                let (name, flags) =
                    ioctl::stream_flags_of_buffer(in_data).map_err(Errno::from_i32)?;
                // An unknown flag changes nothing: not even the stream.
                if flags & !ordo_fs::stream::STREAM_FLAGS != 0 {
                    return Err(Errno::EINVAL);
                }
                let id = if name.is_empty() {
                    self.streams.stream_of(req.pid())
                } else {
                    let id = self.fs.stream_id(name).map_err(fs_err)?;
                    self.streams.set(req.pid(), id).map_err(Errno::from_i32)?;
                    id
                };
                self.fs.set_stream_flags(id, flags).map_err(fs_err)?;
            }
            ioctl::ORDO_IOC_GETSTREAMFLAGS => {
                let id = self.streams.stream_of(req.pid());
                let name = self.fs.stream_name(id).unwrap_or_default();
                let mut out = ioctl::stream_flags_buffer(&name, self.fs.stream_flags(id))
                    .map_err(Errno::from_i32)?
                    .to_vec();
                if (out_size as usize) < out.len() {
                    return Err(Errno::from_i32(libc::ERANGE));
                }
                out.truncate(out_size as usize);
                return Ok(out);
            }
            _ => return Err(Errno::from_i32(libc::ENOTTY)),
        }
        Ok(Vec::new())
    }

    /// The file system served.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// One more kernel reference on `ino` (see `kernel_opens`), taken
    /// before the reply that gives it to the kernel.
    fn hold(&self, ino: Ino) -> ordo_fs::Result<()> {
        if self.kernel_opens {
            self.fs.open(ino)?;
        }
        Ok(())
    }

    fn entry(&self, reply: ReplyEntry, result: ordo_fs::Result<Attr>) {
        match result.and_then(|attr| self.hold(attr.ino).map(|()| attr)) {
            Ok(attr) => reply.entry(
                &self.ttl,
                &fuse_attr(&attr, ino_to_fuse(attr.ino)),
                Generation(u64::from(attr.generation)),
            ),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    /// Attribute replies name the inode by its ext4 number (2 for the
    /// root), which is what `stat` shows.
    fn attr(&self, reply: ReplyAttr, result: ordo_fs::Result<Attr>) {
        match result {
            Ok(attr) => reply.attr(&self.ttl, &fuse_attr(&attr, INodeNo(u64::from(attr.ino)))),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn empty(reply: ReplyEmpty, result: ordo_fs::Result<()>) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    /// `open(O_TRUNC)` of an existing file. With `FUSE_ATOMIC_O_TRUNC` the
    /// truncation arrives here and not as a separate `setattr`, which is
    /// what lets ordo do what ext4 does for it and not for `truncate(2)`:
    /// mtime and ctime change even when the file was already empty, and a
    /// caller other than root loses the file's set-user-ID bit (and
    /// set-group-ID with group execute), as `handle_truncate` asks.
    fn truncate_on_open(&self, ino: Ino, caller: &Creds) -> ordo_fs::Result<()> {
        let attr = self.fs.getattr(ino)?;
        if attr.kind != FileType::Regular {
            return Ok(());
        }
        let mut set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        set.perm = perm_after_kill(
            caller.uid,
            caller.gid,
            || caller.groups.clone(),
            &attr,
            attr.perm,
        );
        self.fs.setattr(ino, &set)?;
        Ok(())
    }

    /// `create` found the name taken (another request created it between
    /// the kernel's lookup and this call): open the existing file, as
    /// `open(O_CREAT)` without `O_EXCL` does.
    fn open_existing(
        &self,
        parent: Ino,
        name: &[u8],
        flags: i32,
        caller: &Creds,
    ) -> ordo_fs::Result<Attr> {
        let mut attr = self.fs.lookup(parent, name)?;
        if attr.kind == FileType::Directory {
            return Err(FsError::Errno(libc::EISDIR));
        }
        if flags & libc::O_TRUNC != 0 {
            self.truncate_on_open(attr.ino, caller)?;
            attr = self.fs.getattr(attr.ino)?;
        }
        if !self.kernel_opens {
            self.fs.open(attr.ino)?;
        }
        Ok(attr)
    }
}

macro_rules! name_or_reply {
    ($name:expr, $reply:expr) => {
        match name_bytes($name) {
            Ok(n) => n,
            Err(e) => return $reply.error(e),
        }
    };
}

impl fuser::Filesystem for OrdoFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.direct_create =
            request_capabilities(config, self.kernel_opens) && self.want_direct_create;
        Ok(())
    }

    fn destroy(&mut self) {
        // Every fsync handed over replies before the core's handles go.
        if let Some(pool) = &self.syncs {
            pool.drain();
        }
        // The kernel's side is gone: no open file and no reference it held
        // outlives it. Free what only they kept alive, so that a clean
        // unmount leaves no orphan behind.
        if let Err(e) = self.fs.release_all() {
            eprintln!("ordo: releasing the handles of the ended session: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_or_reply!(name, reply);
        match self.fs.lookup(ino_from_fuse(parent), name) {
            // A negative entry (node 0) the kernel caches for the TTL, as it
            // caches a positive one: `open(O_CREAT)` of a new name then goes
            // straight to CREATE instead of a LOOKUP round trip first. Every
            // change to the namespace passes through this kernel mount, which
            // drops the cached negative entry when it creates the name.
            Err(FsError::Errno(libc::ENOENT)) => {
                reply.entry(&self.ttl, &negative_entry_attr(), Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // With OPEN served, the core keeps no per-name lookup state: an
        // unlinked inode lives as long as it has open handles
        // (`Fs::open`/`Fs::release`). With the kernel opening files, its
        // references are those handles (`kernel_opens`).
        if self.kernel_opens && ino != INodeNo::ROOT {
            self.forgets.begin();
            let r = self.fs.release_n(ino_from_fuse(ino), nlookup);
            self.forgets.end();
            debug_assert!(r.is_ok(), "forget of {ino:?} x{nlookup}: {r:?}");
            if let Err(e) = r {
                eprintln!("ordo: forget of inode {} x{nlookup}: {e}", ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(reply, self.fs.getattr(ino_from_fuse(ino)));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.enter(req);
        let mut set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            // A size change stamps mtime and ctime in the core, as ext4 does.
            mtime: mtime.map(time_set),
            ctime: ctime.map(timespec),
        };
        let ino = ino_from_fuse(ino);
        let chown = set.uid.is_some() || set.gid.is_some();
        if (set.size.is_some() || chown) && req.uid() != 0 {
            // A truncation or chown by a caller without CAP_FSETID
            // (truncate(2), and open(O_TRUNC) when the kernel opens files
            // itself): the kernel's FUSE clears set-user-ID, and
            // set-group-ID only with group execute, because it cannot tell
            // group membership; ext4 also clears set-group-ID for a caller
            // outside the file's group (as it is before a chown).
            if let Ok(a) = self.fs.getattr(ino) {
                let base = set.perm.unwrap_or(a.perm);
                let groups = || groups_of(req.pid());
                if let Some(perm) = perm_after_kill(req.uid(), req.gid(), groups, &a, base) {
                    set.perm = Some(perm);
                }
            }
        }
        let result = if set.perm.is_some() {
            // A mode change drops S_ISGID when the caller is not in the
            // file's group: ext4 does it in setattr_copy, which FUSE leaves
            // to the file system, and group membership needs the groups.
            let mut who = creds(req);
            who.groups = groups_of(req.pid());
            self.fs.setattr_as(ino, &set, &who)
        } else {
            self.fs.setattr(ino, &set)
        };
        self.attr(reply, result);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino_from_fuse(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        let kind = match FileType::from_mode((mode & libc::S_IFMT) as u16) {
            // mknod(2) with type 0 makes a regular file.
            None if mode & libc::S_IFMT == 0 => FileType::Regular,
            Some(FileType::Directory) | Some(FileType::Symlink) | None => {
                return reply.error(Errno::EINVAL)
            }
            Some(k) => k,
        };
        let result = self.allocating(|| {
            self.fs.create(
                ino_from_fuse(parent),
                name,
                kind,
                new_perm(mode),
                rdev,
                &creds_umask(req, umask),
            )
        });
        self.entry(reply, result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        let result = self.allocating(|| {
            self.fs.mkdir(
                ino_from_fuse(parent),
                name,
                new_perm(mode),
                &creds_umask(req, umask),
            )
        });
        self.entry(reply, result);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        Self::empty(reply, self.fs.unlink(ino_from_fuse(parent), name));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        Self::empty(reply, self.fs.rmdir(ino_from_fuse(parent), name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.enter(req);
        let name = name_or_reply!(link_name, reply);
        let result = self.allocating(|| {
            self.fs.symlink(
                ino_from_fuse(parent),
                name,
                target.as_os_str().as_bytes(),
                &creds(req),
            )
        });
        self.entry(reply, result);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        let newname = name_or_reply!(newname, reply);
        let Some(flags) = rename_flags(flags) else {
            return reply.error(Errno::EINVAL);
        };
        let result = self.allocating(|| {
            self.fs.rename_as(
                ino_from_fuse(parent),
                name,
                ino_from_fuse(newparent),
                newname,
                flags,
                &creds(req),
            )
        });
        Self::empty(reply, result);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.enter(req);
        let newname = name_or_reply!(newname, reply);
        let result = self.allocating(|| {
            self.fs.link_as(
                ino_from_fuse(ino),
                ino_from_fuse(newparent),
                newname,
                &creds(req),
            )
        });
        self.entry(reply, result);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.kernel_opens {
            // The kernel opens regular files itself from now on (and sends
            // no RELEASE for them); the lookup it holds keeps the inode.
            return reply.error(Errno::ENOSYS);
        }
        self.enter(req);
        let ino = ino_from_fuse(ino);
        if flags.0 & libc::O_TRUNC != 0 {
            let mut who = creds(req);
            who.groups = groups_of(req.pid());
            if let Err(e) = self.truncate_on_open(ino, &who) {
                return reply.error(errno_of(&e));
            }
        }
        match self.fs.open(ino) {
            // Keep the kernel's page cache across opens: every change to a
            // file's bytes passes through this mount (the image is locked
            // while it is mounted), and the kernel keeps its cache coherent
            // with writes, truncations and direct writes made through it,
            // so a re-read is served from memory as on the kernel's ext4.
            Ok(()) => reply.opened(FileHandle(0), FILE_OPEN_FLAGS),
            Err(e) => reply.error(errno_of(&e)),
        }
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
        // Read into the buffer the transport lends: through io_uring that
        // is the request's own payload buffer, which the kernel copies
        // from, so the data is not copied again on its way.
        let ino = ino_from_fuse(ino);
        reply.data_with(size as usize, |buf| {
            self.fs
                .read_into(ino, offset, buf)
                .map_err(|e| errno_of(&e))
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.enter(req);
        let ino = ino_from_fuse(ino);
        // On a direct-I/O handle the kernel does not clear set-user-ID
        // itself: it flags a write by a caller without CAP_FSETID, and the
        // core clears the bits in the write's own handle. Only a file that
        // has such a bit needs the caller's groups (for set-group-ID).
        //
        // Through the page cache the kernel clears set-user-ID, and
        // set-group-ID with group execute, with a SETATTR before the write;
        // set-group-ID without group execute it leaves (it cannot tell
        // group membership), where ext4 clears it for a caller outside the
        // file's group (`setattr_should_drop_sgid`): the core does that.
        let kill = if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.fs.getattr(ino).is_ok_and(|a| a.perm & 0o6000 != 0)
        } else {
            req.uid() != 0
                && self
                    .fs
                    .getattr(ino)
                    .is_ok_and(|a| a.perm & 0o2010 == 0o2000 && a.kind == FileType::Regular)
        };
        let r = self.allocating(|| {
            if kill {
                let mut who = creds(req);
                who.groups = groups_of(req.pid());
                self.fs.write_killing_suid_as(ino, offset, data, &who)
            } else {
                self.fs.write_as(ino, offset, data, &creds(req))
            }
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno_of(&e)),
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
        // No stream lookup: FLUSH comes from close(2), also from inside
        // execve closing close-on-exec files with the exec lock held, and
        // reading that process's /proc entry to find its stream would wait
        // for the same lock (a deadlock). A flush changes nothing anyway.
        // close(2) on ext4 promises nothing about durability; neither does
        // ordo. ENOSYS tells the kernel so once: it stops sending FLUSH on
        // every close (ordo has no POSIX locks of its own for a flush to
        // release: the kernel keeps those).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.kernel_opens {
            // Only a created file's handle reaches here, and it was not
            // counted (see `create`).
            return reply.ok();
        }
        self.enter(req);
        Self::empty(reply, self.fs.release(ino_from_fuse(ino)));
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_in_pool(req, ino, datasync, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // An open directory handle keeps a removed directory's inode alive
        // until `releasedir`, as an open file does.
        match self.fs.open(ino_from_fuse(ino)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno_of(&e)),
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
        let entries = match self
            .fs
            .readdir(ino_from_fuse(ino), offset, READDIR_BATCH_ENTRIES)
        {
            Ok(e) => e,
            Err(e) => return reply.error(errno_of(&e)),
        };
        for ent in entries {
            // d_ino shows ext4's numbers (2 for the root), as `stat` does.
            let full = reply.add(
                INodeNo(u64::from(ent.ino)),
                ent.next_offset,
                fuse_kind(ent.kind),
                OsStr::from_bytes(&ent.name),
            );
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self
            .fs
            .readdir(ino_from_fuse(ino), offset, READDIR_BATCH_ENTRIES)
        {
            Ok(e) => e,
            Err(e) => return reply.error(errno_of(&e)),
        };
        // An entry that fails after others were added ends the reply there:
        // the kernel asks again from its offset and gets the error then, and
        // the references taken for the entries already added are the
        // kernel's (an error reply would give it none of them).
        let mut added = false;
        for ent in entries {
            let attr = match self.fs.getattr(ent.ino) {
                Ok(a) => a,
                // Removed since the entries were read: leave it out.
                Err(FsError::Errno(libc::ENOENT)) => continue,
                Err(_) if added => break,
                Err(e) => return reply.error(errno_of(&e)),
            };
            // The kernel takes a reference on every entry it is given but
            // `.` and `..` (fuse_direntplus_link); one that does not fit is
            // not given.
            let counted = self.kernel_opens && ent.name != b"." && ent.name != b"..";
            if counted {
                match self.fs.open(ent.ino) {
                    Ok(()) => {}
                    Err(FsError::Errno(libc::ENOENT)) => continue,
                    Err(_) if added => break,
                    Err(e) => return reply.error(errno_of(&e)),
                }
            }
            added = true;
            let full = reply.add(
                ino_to_fuse(ent.ino),
                ent.next_offset,
                OsStr::from_bytes(&ent.name),
                &self.ttl,
                &fuse_attr(&attr, ino_to_fuse(ent.ino)),
                Generation(u64::from(attr.generation)),
            );
            if full {
                if counted {
                    let _ = self.fs.release(ent.ino);
                }
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.fs.release(ino_from_fuse(ino)));
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_in_pool(req, ino, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.enter(req);
        let mut who = creds(req);
        who.groups = groups_of(req.pid());
        Self::empty(
            reply,
            self.allocating(|| {
                self.fs.setxattr(
                    ino_from_fuse(ino),
                    name.as_bytes(),
                    value,
                    flags as u32,
                    &who,
                )
            }),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.getxattr(ino_from_fuse(ino), name.as_bytes()) {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // `trusted.` names are listed to a privileged caller only, as ext4
        // lists them.
        match self.fs.listxattr(ino_from_fuse(ino), req.uid() == 0) {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.enter(req);
        let mut who = creds(req);
        who.groups = groups_of(req.pid());
        Self::empty(
            reply,
            self.fs
                .removexattr(ino_from_fuse(ino), name.as_bytes(), &who),
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mut who = creds(req);
        who.groups = groups_of(req.pid());
        Self::empty(
            reply,
            self.fs.access(ino_from_fuse(ino), mask.bits() as u32, &who),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.enter(req);
        let name = name_or_reply!(name, reply);
        let parent = ino_from_fuse(parent);
        let created = self.allocating(|| {
            self.fs.create(
                parent,
                name,
                FileType::Regular,
                new_perm(mode),
                0,
                &creds_umask(req, umask),
            )
        });
        // With the kernel opening files, the kernel's reference taken below
        // keeps the file alive for as long as the handle (the kernel may
        // send no RELEASE for it), so the handle itself is not counted.
        let open = |ino| {
            if self.kernel_opens {
                Ok(())
            } else {
                self.fs.open(ino)
            }
        };
        let result = match created {
            Ok(attr) => open(attr.ino).map(|()| (attr, self.direct_create)),
            Err(FsError::Errno(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                let mut who = creds(req);
                who.groups = groups_of(req.pid());
                self.open_existing(parent, name, flags, &who)
                    .map(|a| (a, false))
            }
            Err(e) => Err(e),
        };
        // The reply is an entry too: the kernel's reference, beside the
        // open handle (released by RELEASE).
        let result = result.and_then(|(attr, direct)| match self.hold(attr.ino) {
            Ok(()) => Ok((attr, direct)),
            Err(e) => {
                if !self.kernel_opens {
                    let _ = self.fs.release(attr.ino);
                }
                Err(e)
            }
        });
        match result {
            // A new file's handle is served with direct I/O (see
            // `MountConfig::direct_io_on_create`); an existing file opened
            // through O_CREAT keeps the page cache, as any open does.
            Ok((attr, direct)) => reply.created(
                &self.ttl,
                &fuse_attr(&attr, ino_to_fuse(attr.ino)),
                Generation(u64::from(attr.generation)),
                FileHandle(0),
                if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                },
            ),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.enter(req);
        let flags = match falloc_flags(mode) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let ino = ino_from_fuse(ino);
        let result = self.allocating(|| {
            self.fs
                .fallocate_as(ino, offset, length, flags, &creds(req))
        });
        Self::empty(reply, result);
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        self.enter(req);
        match self.do_ioctl(req, ino_from_fuse(ino), cmd, in_data, out_size) {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let whence = match seek_whence(whence) {
            Ok(w) => w,
            Err(e) => return reply.error(e),
        };
        if offset < 0 {
            return reply.error(Errno::ENXIO);
        }
        match self.fs.seek(ino_from_fuse(ino), offset as u64, whence) {
            Ok(pos) => reply.offset(pos as i64),
            Err(e) => reply.error(errno_of(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_both_ways_and_others_are_identity() {
        assert_eq!(ino_from_fuse(INodeNo::ROOT), ROOT_INO);
        assert_eq!(ino_to_fuse(ROOT_INO), INodeNo::ROOT);
        for ino in [11u32, 12, 4096, u32::MAX] {
            assert_eq!(ino_from_fuse(ino_to_fuse(ino)), ino);
        }
    }

    #[test]
    fn times_round_trip_including_before_1970() {
        for (sec, nsec) in [
            (0i64, 0u32),
            (1_700_000_000, 123_456_789),
            (-1, 500_000_000),
            (-2_147_483_648, 0),
            (17_179_869_183, 999_999_999),
        ] {
            let t = Timespec { sec, nsec };
            assert_eq!(timespec(system_time(t)), t, "{sec}.{nsec}");
        }
    }

    #[test]
    fn fallocate_modes_follow_linux() {
        assert_eq!(falloc_flags(0), Ok(FallocFlags::default()));
        let keep = falloc_flags(libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert!(keep.keep_size && !keep.punch_hole);
        let punch = falloc_flags(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert!(punch.keep_size && punch.punch_hole);
        assert_eq!(
            falloc_flags(libc::FALLOC_FL_PUNCH_HOLE),
            Err(Errno::EOPNOTSUPP)
        );
        assert!(falloc_flags(libc::FALLOC_FL_ZERO_RANGE).unwrap().zero_range);
        assert_eq!(
            falloc_flags(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
            ),
            Err(Errno::EOPNOTSUPP)
        );
        assert!(
            falloc_flags(libc::FALLOC_FL_COLLAPSE_RANGE)
                .unwrap()
                .collapse_range
        );
        assert!(
            falloc_flags(libc::FALLOC_FL_INSERT_RANGE)
                .unwrap()
                .insert_range
        );
        for bad in [
            libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE,
            libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_ZERO_RANGE,
            libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_UNSHARE_RANGE,
        ] {
            assert_eq!(falloc_flags(bad), Err(Errno::EOPNOTSUPP), "mode {bad:#x}");
        }
    }

    #[test]
    fn rename_flags_refuse_whiteout() {
        let f = rename_flags(fuser::RenameFlags::RENAME_NOREPLACE).unwrap();
        assert!(f.noreplace && !f.exchange);
        let f = rename_flags(fuser::RenameFlags::RENAME_EXCHANGE).unwrap();
        assert!(f.exchange && !f.noreplace);
        assert_eq!(
            rename_flags(fuser::RenameFlags::empty()),
            Some(RenameFlags::default())
        );
        assert_eq!(rename_flags(fuser::RenameFlags::RENAME_WHITEOUT), None);
    }

    #[test]
    fn seek_whence_serves_data_and_hole_only() {
        assert_eq!(seek_whence(libc::SEEK_DATA), Ok(SeekWhence::Data));
        assert_eq!(seek_whence(libc::SEEK_HOLE), Ok(SeekWhence::Hole));
        assert_eq!(seek_whence(libc::SEEK_SET), Err(Errno::EINVAL));
    }

    #[test]
    fn names_longer_than_ext4_allows_are_refused() {
        let ok = "a".repeat(NAME_MAX_BYTES);
        let long = "a".repeat(NAME_MAX_BYTES + 1);
        assert!(name_bytes(OsStr::new(&ok)).is_ok());
        assert_eq!(name_bytes(OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), b"/mnt/a b".to_vec());
        assert_eq!(unescape_mountinfo("/x\\134y"), b"/x\\y".to_vec());
        assert_eq!(unescape_mountinfo("/plain"), b"/plain".to_vec());
        assert_eq!(unescape_mountinfo("/end\\04"), b"/end\\04".to_vec());
    }

    #[test]
    fn unprivileged_writes_kill_suid_and_executable_sgid() {
        assert_eq!(kill_suid_sgid(0o6755, true), 0o0755);
        assert_eq!(kill_suid_sgid(0o6745, true), 0o2745);
        assert_eq!(kill_suid_sgid(0o6745, false), 0o0745);
        assert_eq!(kill_suid_sgid(0o4700, true), 0o0700);
        assert_eq!(kill_suid_sgid(0o1777, false), 0o1777);
    }

    #[test]
    fn new_inode_permissions_drop_type_bits_and_keep_the_umask_apart() {
        assert_eq!(new_perm(0o100666), 0o666);
        assert_eq!(new_perm(0o42777), 0o2777);
        assert_eq!(new_perm(0o1777), 0o1777);
    }

    #[test]
    fn attributes_carry_every_field() {
        let attr = Attr {
            ino: 12,
            kind: FileType::Symlink,
            perm: 0o777,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 7,
            blocks: 0,
            atime: Timespec { sec: 1, nsec: 2 },
            mtime: Timespec { sec: 3, nsec: 4 },
            ctime: Timespec { sec: 5, nsec: 6 },
            crtime: Timespec { sec: 7, nsec: 8 },
            rdev: 0,
            blksize: 4096,
            generation: 9,
            flags: 0x80000,
        };
        let f = fuse_attr(&attr, ino_to_fuse(attr.ino));
        assert_eq!(f.ino, INodeNo(12));
        assert_eq!(f.kind, fuser::FileType::Symlink);
        assert_eq!((f.perm, f.nlink, f.uid, f.gid), (0o777, 1, 1000, 100));
        assert_eq!((f.size, f.blocks, f.blksize), (7, 0, 4096));
        assert_eq!(timespec(f.mtime), attr.mtime);
        assert_eq!(timespec(f.ctime), attr.ctime);
    }
}
