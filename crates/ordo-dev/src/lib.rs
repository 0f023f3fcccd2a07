//! ordo's block-device layer.
//!
//! The one rule every protocol in ordo is tested against: a write is
//! *acknowledged* when [`BlockDevice::write`] returns and *durable* only after a
//! later [`BlockDevice::flush`] returns, or at once when it was written with
//! FUA. Between the two it sits in a volatile cache, may reach the medium in
//! any order, and is lost in a crash.
//!
//! The device never knows what a block holds; the caller tags each I/O with a
//! [`BlockClass`] so that counters can say "2 writes per fsync, one of them to
//! the journal".
//!
//! Backends and wrappers, all behind the one trait so they stack:
//!
//! | type | role |
//! | --- | --- |
//! | [`FileDevice`] | an image file or `/dev/loopN`: `pread`/`pwrite`, `fdatasync`, `RWF_DSYNC`, optional `O_DIRECT`, `flock` |
//! | [`MemDevice`] | sparse in-memory medium; cheap snapshots |
//! | [`RecordingDevice`] | logs every write, flush and mark in device order (for the crash explorer) |
//! | [`WriteCacheDevice`] | a volatile write cache: unflushed writes can be lost, torn or kept by seed |
//! | [`OverlayDevice`] | copy-on-write view of a shared base: crash states without copies |
//! | [`TimedDevice`] | charges deterministic virtual time (HDD, SSD, cloud volume) |
//! | [`NoBarrierDevice`] | drops flushes and FUA, reports every write durable (`-o nobarrier`) |
//!
//! [`KernelMount`] and [`LoopDevice`] hand an image to the kernel's ext4
//! (interoperability checks, the crash explorer's kernel judge).
//!
//! Above them, the I/O scheduler ([`Scheduler`]) holds a queue of
//! outstanding requests with their ordering constraints and chooses which
//! eligible one reaches the device next (FIFO, C-LOOK, SPTF).
//!
//! Every backend that owns a medium counts its own requests
//! ([`AtomicCounters`]) and derives `durable()` from the same
//! [`TicketTracker`]; pure forwarders ([`RecordingDevice`], [`TimedDevice`])
//! report the inner device's counters and tickets.

use std::io;
use std::path::PathBuf;

pub mod cache_model;
pub mod counting;
pub mod file;
pub mod gate;
pub mod loopdev;
pub mod mem;
pub mod nobarrier;
pub mod overlay;
pub mod record;
pub mod sched;
pub mod size;
pub mod timing;

pub use cache_model::{CrashPolicy, WriteCacheDevice};
pub use counting::{AtomicCounters, Bookkeeping, TicketTracker};
pub use file::{FileDevice, OpenOptions};
pub use gate::GateDevice;
pub use loopdev::{KernelMount, LoopDevice};
pub use mem::{is_zero, MemDevice};
pub use nobarrier::NoBarrierDevice;
pub use overlay::OverlayDevice;
pub use record::{Event, EventKind, RecordingDevice};
pub use sched::{Policy, SchedConfig, SchedStats, Scheduler};
pub use size::parse_size_bytes;
pub use timing::{DiskModel, TimedDevice, Timing};

/// A monotonically increasing number handed out for every write; see
/// [`BlockDevice::durable`].
pub type Ticket = u64;

/// What a block is, as the file system tells the device. Used only for
/// counting; the device never interprets block contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[repr(u8)]
pub enum BlockClass {
    /// Primary or backup superblock.
    Super = 0,
    /// Group descriptors, block and inode bitmaps, reserved GDT blocks.
    GroupMeta = 1,
    /// Inode-table blocks.
    InodeTable = 2,
    /// Directory blocks.
    Directory = 3,
    /// Extent-tree index and leaf blocks.
    ExtentTree = 4,
    /// File data (and symlink target blocks).
    Data = 5,
    /// The JBD2 journal (descriptor, metadata copies, revoke, commit, superblock).
    Journal = 6,
    /// The fast-commit area at the end of the journal.
    FastCommit = 7,
    /// Anything else (xattr blocks, unknown).
    Other = 8,
}

/// Number of [`BlockClass`] variants.
pub const BLOCK_CLASS_COUNT: usize = 9;

impl BlockClass {
    /// Every class, in counter order.
    pub const ALL: [BlockClass; BLOCK_CLASS_COUNT] = [
        BlockClass::Super,
        BlockClass::GroupMeta,
        BlockClass::InodeTable,
        BlockClass::Directory,
        BlockClass::ExtentTree,
        BlockClass::Data,
        BlockClass::Journal,
        BlockClass::FastCommit,
        BlockClass::Other,
    ];

    /// Short lowercase name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            BlockClass::Super => "super",
            BlockClass::GroupMeta => "group",
            BlockClass::InodeTable => "itable",
            BlockClass::Directory => "dir",
            BlockClass::ExtentTree => "extent",
            BlockClass::Data => "data",
            BlockClass::Journal => "journal",
            BlockClass::FastCommit => "fc",
            BlockClass::Other => "other",
        }
    }
}

/// Flags of one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: durable when `write` returns, without a flush.
    pub fua: bool,
    /// What the block is, for counting.
    pub class: BlockClass,
}

impl WriteFlags {
    /// A plain (volatile until flushed) write of the given class.
    pub fn new(class: BlockClass) -> Self {
        WriteFlags { fua: false, class }
    }
    /// A FUA write of the given class.
    pub fn fua(class: BlockClass) -> Self {
        WriteFlags { fua: true, class }
    }
}

/// Counters of one block class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassCounters {
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Write requests (a multi-block write counts once, like one bio).
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Write requests that carried FUA (also counted in `writes`).
    pub fua_writes: u64,
}

/// Every counter of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Indexed by `BlockClass as usize`.
    pub by_class: [ClassCounters; BLOCK_CLASS_COUNT],
    /// Cache flushes (each `flush` call).
    pub flushes: u64,
}

impl Counters {
    /// The counters of one class.
    pub fn class(&self, class: BlockClass) -> &ClassCounters {
        &self.by_class[class as usize]
    }
    /// Sum over all classes.
    pub fn total(&self) -> ClassCounters {
        let mut t = ClassCounters::default();
        for c in &self.by_class {
            t.reads += c.reads;
            t.read_bytes += c.read_bytes;
            t.writes += c.writes;
            t.write_bytes += c.write_bytes;
            t.fua_writes += c.fua_writes;
        }
        t
    }
    /// `self - earlier`, counter by counter (saturating).
    pub fn since(&self, earlier: &Counters) -> Counters {
        let mut d = Counters::default();
        for i in 0..BLOCK_CLASS_COUNT {
            let (a, b) = (&self.by_class[i], &earlier.by_class[i]);
            d.by_class[i] = ClassCounters {
                reads: a.reads.saturating_sub(b.reads),
                read_bytes: a.read_bytes.saturating_sub(b.read_bytes),
                writes: a.writes.saturating_sub(b.writes),
                write_bytes: a.write_bytes.saturating_sub(b.write_bytes),
                fua_writes: a.fua_writes.saturating_sub(b.fua_writes),
            };
        }
        d.flushes = self.flushes.saturating_sub(earlier.flushes);
        d
    }
}

/// A block device as ordo sees it. Block-addressed with a block size fixed at
/// construction (the file system's block size). All methods take `&self`:
/// implementations are internally synchronized and may be shared across
/// threads.
pub trait BlockDevice: Send + Sync {
    /// Block size in bytes (1024, 2048 or 4096 for ext4 images).
    fn block_size(&self) -> u32;
    /// Number of blocks on the device.
    fn block_count(&self) -> u64;
    /// Read `buf.len() / block_size` consecutive blocks starting at `block`.
    /// `buf.len()` must be a non-zero multiple of the block size. Reading past
    /// the end is an error (`UnexpectedEof`).
    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()>;
    /// Write `data.len() / block_size` consecutive blocks starting at `block`.
    /// Returns when the write is acknowledged (durable only if `flags.fua`).
    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket>;
    /// One write of `parts` laid end to end (each whole blocks) at
    /// `block`: one request, counted and acknowledged as [`BlockDevice::write`]
    /// of their concatenation. The default joins them and writes that; a
    /// backend that can gather (`pwritev`) writes them where they are, so a
    /// run of cached block images goes out without a copy.
    fn write_vectored(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        write_joined(self, block, parts, flags)
    }
    /// Make every acknowledged write durable.
    fn flush(&self) -> io::Result<()>;
    /// Durability notification: every write whose ticket is `<=` the returned
    /// value is durable.
    fn durable(&self) -> Ticket;
    /// A snapshot of the counters.
    fn counters(&self) -> Counters;
    /// The timing model this device charges virtual time with, if it is
    /// one ([`TimedDevice`]): the I/O scheduler then simulates queueing in
    /// virtual time and asks it for positioning costs.
    fn timing(&self) -> Option<&dyn Timing> {
        None
    }
}

/// [`BlockDevice::write_vectored`] for a backend that cannot gather: one
/// [`BlockDevice::write`] of the parts joined (of the one part as it is).
pub fn write_joined<D: BlockDevice + ?Sized>(
    dev: &D,
    block: u64,
    parts: &[&[u8]],
    flags: WriteFlags,
) -> io::Result<Ticket> {
    match parts {
        [one] => dev.write(block, one, flags),
        _ => dev.write(block, &parts.concat(), flags),
    }
}

/// A pointer to a device is that device: every call goes through.
macro_rules! forward_block_device {
    ($($ptr:ident)::+) => {
        impl<T: BlockDevice + ?Sized> BlockDevice for $($ptr)::+<T> {
            fn block_size(&self) -> u32 {
                (**self).block_size()
            }
            fn block_count(&self) -> u64 {
                (**self).block_count()
            }
            fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
                (**self).read(block, buf, class)
            }
            fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
                (**self).write(block, data, flags)
            }
            fn write_vectored(
                &self,
                block: u64,
                parts: &[&[u8]],
                flags: WriteFlags,
            ) -> io::Result<Ticket> {
                (**self).write_vectored(block, parts, flags)
            }
            fn flush(&self) -> io::Result<()> {
                (**self).flush()
            }
            fn durable(&self) -> Ticket {
                (**self).durable()
            }
            fn counters(&self) -> Counters {
                (**self).counters()
            }
            fn timing(&self) -> Option<&dyn Timing> {
                (**self).timing()
            }
        }
    };
}

forward_block_device!(std::sync::Arc);
forward_block_device!(Box);

/// Errors of opening or creating a device. Once a device is open, its I/O
/// methods return plain [`io::Error`]s (what the kernel said), because every
/// caller above maps them to EIO anyway.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Another process (or another handle in this one) holds the image.
    #[error("{path}: image is already in use (locked by another process; unmount it first)")]
    InUse {
        /// The image or device path.
        path: PathBuf,
    },
    /// `create` was asked for a size smaller than the existing file.
    #[error("{path}: refusing to shrink existing image from {existing_bytes} to {requested_bytes} bytes")]
    WouldShrink {
        /// The image path.
        path: PathBuf,
        /// Current size of the file.
        existing_bytes: u64,
        /// Size that was asked for.
        requested_bytes: u64,
    },
    /// A size or block size that cannot describe a device.
    #[error("invalid device geometry: {0}")]
    Geometry(String),
    /// A command ordo runs for the kernel (`losetup`, `mount`, `umount`)
    /// failed.
    #[error("{path}: {op}: {detail}")]
    Command {
        /// The image, device or mount point.
        path: PathBuf,
        /// The command.
        op: &'static str,
        /// What it printed.
        detail: String,
    },
    /// A system call failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The image or device path.
        path: PathBuf,
        /// What was being done ("open", "flock", "BLKGETSIZE64", ...).
        op: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

impl From<DevError> for io::Error {
    fn from(e: DevError) -> io::Error {
        let kind = match &e {
            DevError::InUse { .. } => io::ErrorKind::WouldBlock,
            DevError::WouldShrink { .. } | DevError::Geometry(_) => io::ErrorKind::InvalidInput,
            DevError::Command { .. } => io::ErrorKind::Other,
            DevError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Checks that a block size is one ordo can use: a power of two from 512 to
/// 65536 bytes.
pub fn check_block_size(block_size: u32) -> Result<(), DevError> {
    if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(DevError::Geometry(format!(
            "block size {block_size} is not a power of two between 512 and 65536"
        )));
    }
    Ok(())
}

/// Validates one request against a device's geometry and returns the number
/// of blocks it covers. Every backend calls this first, so that a bad request
/// is an error (never a panic or a partial transfer).
pub fn check_request(
    block_size: u32,
    block_count: u64,
    block: u64,
    len_bytes: usize,
) -> io::Result<u64> {
    let bs = block_size as usize;
    if len_bytes == 0 || !len_bytes.is_multiple_of(bs) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("request of {len_bytes} bytes is not a non-zero multiple of the block size {block_size}"),
        ));
    }
    let blocks = (len_bytes / bs) as u64;
    match block.checked_add(blocks) {
        Some(end) if end <= block_count => Ok(blocks),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("blocks {block}..{block}+{blocks} are past the end of the device ({block_count} blocks)"),
        )),
    }
}
