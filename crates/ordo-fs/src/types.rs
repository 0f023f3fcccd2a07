//! Public types of the library API (`Fs`).

use std::sync::Arc;

use crate::clock::Clock;
use crate::protocol::{DataMode, ProtocolKind};
pub use crate::update::Ino;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 2;

pub use crate::clock::Timespec;

/// File type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileType {
    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u16 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::CharDevice => 0o020000,
            FileType::BlockDevice => 0o060000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
        }
    }
    /// The type encoded in `S_IFMT` bits of `mode`, if valid.
    pub fn from_mode(mode: u16) -> Option<Self> {
        Some(match mode & 0o170000 {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            0o020000 => FileType::CharDevice,
            0o060000 => FileType::BlockDevice,
            0o010000 => FileType::Fifo,
            0o140000 => FileType::Socket,
            _ => return None,
        })
    }
}

/// Attributes of an inode, as `stat` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileType,
    /// Permission bits including suid/sgid/sticky (`mode & 0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated space in 512-byte sectors.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    /// Device number for char/block devices (Linux `new_encode_dev` form).
    pub rdev: u32,
    /// Preferred I/O size (the block size).
    pub blksize: u32,
    pub generation: u32,
    /// ext4 inode flags (`i_flags`).
    pub flags: u32,
}

/// How to set a time in [`SetAttr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time (UTIME_NOW).
    Now,
    /// A given time.
    At(Timespec),
}

/// Attribute changes; `None` leaves a field alone (UTIME_OMIT for times).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (`& 0o7777`).
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend to this size.
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// Explicit ctime (otherwise ctime is set to now on any change).
    pub ctime: Option<Timespec>,
}

/// Permission bits after a write or truncation by a caller without
/// `CAP_FSETID`: set-user-ID goes; set-group-ID goes when group execute is
/// set, or when the caller is not in the file's group (`in_group`), as the
/// kernel's `setattr_should_drop_sgid` decides.
pub fn kill_suid_sgid(perm: u16, in_group: bool) -> u16 {
    let mut p = perm & !0o4000;
    if p & 0o2010 == 0o2010 || (p & 0o2000 != 0 && !in_group) {
        p &= !0o2000;
    }
    p
}

/// The caller's identity, for ownership of new inodes (setgid directories).
/// Permission checks are the VFS's job (FUSE `default_permissions`); the
/// library offers [`crate::Fs::access`] for library users.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// The caller's umask, applied to a new inode's permission bits unless
    /// its directory has a default ACL (then the ACL decides, as
    /// `posix_acl_create`). 0 for a caller that passes final bits.
    pub umask: u16,
}

impl Creds {
    /// root:root.
    pub fn root() -> Self {
        Creds::default()
    }
}

/// rename(2) flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: atomically swap source and target (both must exist).
    pub exchange: bool,
}

/// fallocate(2) modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocFlags {
    /// FALLOC_FL_KEEP_SIZE.
    pub keep_size: bool,
    /// FALLOC_FL_PUNCH_HOLE (requires keep_size, as in Linux).
    pub punch_hole: bool,
    /// FALLOC_FL_ZERO_RANGE: the range reads as zeros afterwards, its whole
    /// blocks allocated as unwritten extents (as ext4); the size grows to
    /// the range's end unless keep_size.
    pub zero_range: bool,
    /// FALLOC_FL_COLLAPSE_RANGE: the range (whole blocks, ending before
    /// the end of the file) is removed and what follows moves down; the
    /// size shrinks by its length. Alone (no other flag), as in Linux.
    pub collapse_range: bool,
    /// FALLOC_FL_INSERT_RANGE: a hole of the range's length (whole blocks,
    /// starting before the end of the file) is inserted at its offset and
    /// what follows moves up; the size grows by its length. Alone.
    pub insert_range: bool,
}

/// lseek(2) whence for data/hole searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekWhence {
    Data,
    Hole,
}

/// One directory entry returned by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileType,
    pub name: Vec<u8>,
    /// Opaque cookie: pass it back to `readdir` to continue after this entry.
    pub next_offset: u64,
}

/// statfs(2) figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks available to non-root (free minus reserved).
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// Mount options of the library and of `ordo mount -o`.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The consistency protocol.
    pub mode: ProtocolKind,
    /// JBD2 data mode (journal / fast_commit only).
    pub data: DataMode,
    /// Refuse every modification (EROFS); nothing is written, not even at
    /// unmount.
    pub read_only: bool,
    /// Commit / write-back interval in milliseconds (`commit=SECS`, default 5 s).
    pub commit_interval_ms: u64,
    /// Background-flush interval in milliseconds (`flush_interval=SECS`,
    /// default 1 s), for the protocols that learn durability from flushes
    /// ([`crate::protocol::Protocol::tick_interval_ms`]).
    pub flush_interval_ms: u64,
    /// Upper bound of the buffer cache in bytes (`cache=SIZE`, default 256 MiB).
    pub cache_bytes: u64,
    /// Run a background thread for the commit interval (off for the crash
    /// explorer and tests, which drive write-back explicitly).
    pub background: bool,
    /// The clock every timestamp of this mount is read from (inode times,
    /// superblock mount/write times, journal commit times, the `dtime` a
    /// recovery stamps). `None`: the system clock. Give a
    /// [`crate::clock::SimClock`] (with `seed`) for a reproducible run.
    pub clock: Option<Arc<dyn Clock>>,
    /// Seed of the mount's random source (inode generations). `None`: drawn
    /// from the operating system, so two mounts differ.
    pub seed: Option<u64>,
    /// The I/O scheduler plans run through (`sched=fifo|clook|sptf|random[:SEED]`).
    /// `None`, the default: each plan's steps are issued in order.
    pub sched: Option<ordo_dev::Policy>,
    /// What a plain fsync means (`fsync=dsync|osync`): `dsync`, the
    /// default, makes the file durable, as every program expects;
    /// `osync` makes it an ordering point only (OptFS's fast fsync, for
    /// programs that want ordering), on the protocols with a native
    /// osync.
    pub fsync: FsyncMeaning,
    /// The background metadata scanner's bound, in inodes examined per
    /// second (`scan_rate=N`, backlinks after an unclean mount); 0, the
    /// default, is no bound (it still releases the core's lock after
    /// every batch). An operation that may allocate does not wait for the
    /// rate: it finishes the scan at full speed.
    pub scan_rate: u64,
    /// Flushes and FUA reach the device (`barrier=1`, the default). With
    /// `nobarrier` (`barrier=0`, ext4's option of the same name) the mount
    /// runs on [`ordo_dev::NoBarrierDevice`]: no flush is issued, FUA
    /// writes go down plain, and every durability promise holds only on a
    /// disk without a volatile write cache (or one backed by a battery).
    /// For reproducing the papers, whose file systems ran so.
    pub barrier: bool,
}

/// What a plain fsync means on a mount (`-o fsync=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FsyncMeaning {
    /// Durability (fsync's meaning everywhere).
    #[default]
    Dsync,
    /// An ordering point without durability ([`crate::Fs::osync`]).
    Osync,
}

impl std::str::FromStr for FsyncMeaning {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "dsync" => Ok(FsyncMeaning::Dsync),
            "osync" => Ok(FsyncMeaning::Osync),
            _ => Err(format!("unknown fsync meaning '{s}' (known: dsync, osync)")),
        }
    }
}

impl MountOptions {
    /// The clock to use: the one given, or the system clock.
    pub fn clock_or_system(&self) -> Arc<dyn Clock> {
        self.clock.clone().unwrap_or_else(crate::clock::system)
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            mode: ProtocolKind::default(),
            data: DataMode::Ordered,
            read_only: false,
            commit_interval_ms: 5000,
            flush_interval_ms: 1000,
            cache_bytes: 256 << 20,
            background: false,
            clock: None,
            seed: None,
            sched: None,
            fsync: FsyncMeaning::Dsync,
            scan_rate: 0,
            barrier: true,
        }
    }
}
