//! The update interface: how the core tells a consistency protocol what it
//! changed.
//!
//! Every metadata mutation is an [`Update`]: the block, the byte range, the
//! bytes before and after, and what the change means ([`UpdateKind`]).
//! Every data write is a [`DataWrite`]. Both are issued on an operation
//! handle ([`HandleInfo`]), one per system call: the unit of atomicity, like
//! jbd2's `handle_t`. Block-level protocols (async, sync, JBD2) only look at
//! `block`; semantic protocols (fast commit, soft updates, streams,
//! backpointers, optimistic) read the meaning.

use std::ops::Range;

/// Inode number (ext4 numbering: root is 2).
pub type Ino = u32;

/// Which system call opened a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Create,
    Mknod,
    Mkdir,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    Write,
    Truncate,
    Fallocate,
    PunchHole,
    /// fallocate COLLAPSE_RANGE.
    CollapseRange,
    /// fallocate INSERT_RANGE.
    InsertRange,
    SetAttr,
    /// setxattr / removexattr (ACLs included).
    SetXattr,
    /// Final close of an unlinked file, or orphan cleanup at mount.
    Evict,
    /// Anything the core does on its own (mount-time bookkeeping, unmount).
    Internal,
}

/// An operation handle as the protocol sees it.
#[derive(Clone, Debug)]
pub struct HandleInfo {
    /// Unique, increasing id of the handle.
    pub id: u64,
    /// What the handle is doing.
    pub op: OpKind,
    /// The caller's stream (ccfs); 0 is the default stream.
    pub stream: u32,
    /// Inodes the operation touched, in the order the core touched them.
    pub inodes: Vec<Ino>,
}

/// Which inode field an [`UpdateKind::Inode`] update changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InodeField {
    /// The whole inode was initialized (allocation) or cleared (free).
    Whole,
    Mode,
    Owner,
    Size,
    Times,
    Links,
    Flags,
    /// `i_block` (inline extent root or fast-symlink target).
    Blocks,
    /// `i_blocks` (allocated sector count).
    BlockCount,
    Dtime,
    /// Orphan-list link (`i_dtime` reused as next orphan).
    OrphanLink,
    Generation,
    /// The inode checksum fields.
    Checksum,
    Other,
}

/// Whether a mapping or link was set or cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapOp {
    Set,
    Clear,
}

impl MapOp {
    /// True when the update sets a mapping.
    pub fn sets(self) -> bool {
        self == MapOp::Set
    }
    /// True when the update clears a mapping.
    pub fn clears(self) -> bool {
        self == MapOp::Clear
    }
}

/// Whether a directory entry was added or removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkOp {
    Add,
    Remove,
}

/// Which allocation bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BitmapKind {
    Block,
    Inode,
}

/// Which summary counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterKind {
    FreeBlocks,
    FreeInodes,
    UsedDirs,
    /// Unused-inode high-water mark of a group (`bg_itable_unused`, and
    /// the `INODE_UNINIT` flag that marks the whole table unused, reported
    /// with delta 0 when cleared). e2fsck treats inodes past the mark as
    /// uninitialized: an entry may only name an inode below it.
    ItableUnused,
}

/// What a metadata change means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    /// A field of inode `ino` (in an inode-table block).
    Inode { ino: Ino, field: InodeField },
    /// A mapping of `len` logical blocks of `ino` starting at `lblk` to
    /// physical blocks starting at `pblk` was set or cleared (in `i_block` or
    /// an extent block). Also used for extent-tree index entries, with
    /// `len == 0`.
    Extent {
        ino: Ino,
        lblk: u32,
        pblk: u64,
        len: u32,
        op: MapOp,
    },
    /// `ino`'s whole extent tree was replaced in one write of its root
    /// (`i_block`): COLLAPSE_RANGE and INSERT_RANGE build the shifted tree
    /// in fresh blocks and switch the root to it, so that a crash shows the
    /// old tree or the new one. `named` are the physical runs `[start, end)`
    /// the new tree names (its fresh tree blocks, its data); `dropped` are
    /// the runs the old tree named that the new one does not (the old
    /// tree blocks, a collapsed range's data), freed after this update.
    ExtentTree {
        ino: Ino,
        named: Vec<(u64, u64)>,
        dropped: Vec<(u64, u64)>,
    },
    /// A new extent-tree block of `ino` was initialized (header, entries).
    ExtentBlockInit { ino: Ino },
    /// Directory entry `name` -> `ino` in directory `dir` added or removed.
    Dirent {
        dir: Ino,
        name: Vec<u8>,
        ino: Ino,
        op: LinkOp,
    },
    /// A new directory block of `dir` was initialized (empty entries, tail).
    DirBlockInit { dir: Ino },
    /// A bit of a bitmap set (allocated) or cleared (freed). `index` is the
    /// block number or the inode number.
    Bitmap {
        what: BitmapKind,
        index: u64,
        set: bool,
    },
    /// A summary counter in a group descriptor (`group = Some`) or in the
    /// superblock (`group = None`) changed by `delta`.
    Counter {
        what: CounterKind,
        group: Option<u32>,
        delta: i64,
    },
    /// The extended attributes of `ino` changed in this block: its in-inode
    /// attribute area, or an attribute block only it refers to.
    Xattr { ino: Ino },
    /// A new attribute block of `ino` was initialized (header, entries,
    /// values, reference count 1).
    XattrBlockInit { ino: Ino },
    /// `ino`'s attribute-block pointer (`i_file_acl`) changed from block
    /// `from` to block `to` (0: none). One update, so that a protocol that
    /// holds it back keeps the old pointer (never a moment with neither).
    XattrRef { ino: Ino, from: u64, to: u64 },
    /// The reference count of shared attribute block `block` changed by
    /// `delta`.
    XattrRefcount { block: u64, delta: i32 },
    /// A checksum field recomputed after other updates to the same structure.
    Checksum,
    /// Anything else (superblock fields, flags, orphan head, ...).
    Other,
}

impl UpdateKind {
    /// The blocks this update points at or stops pointing at, as
    /// `(inode, start, end, op)`: a mapping or an index entry (its run of
    /// `len` blocks from `pblk`, one block for an index entry), a tree
    /// switch (every run it names and drops), or an attribute-block pointer
    /// (which may stop pointing at one block and point at another in one
    /// update). What rule 1 (initialize before pointing) and rule 2
    /// (nullify before reuse) are about.
    pub fn pointers(&self) -> impl Iterator<Item = (Ino, u64, u64, MapOp)> + '_ {
        let one: [Option<(Ino, u64, u64, MapOp)>; 2] = match *self {
            UpdateKind::Extent {
                ino, pblk, len, op, ..
            } => [Some((ino, pblk, pblk + u64::from(len.max(1)), op)), None],
            UpdateKind::XattrRef { ino, from, to } => [
                (from != 0).then_some((ino, from, from + 1, MapOp::Clear)),
                (to != 0).then_some((ino, to, to + 1, MapOp::Set)),
            ],
            _ => [None, None],
        };
        let none: &[(u64, u64)] = &[];
        let (ino, named, dropped) = match self {
            UpdateKind::ExtentTree {
                ino,
                named,
                dropped,
            } => (*ino, named.as_slice(), dropped.as_slice()),
            _ => (0, none, none),
        };
        one.into_iter()
            .flatten()
            .chain(named.iter().map(move |&(s, e)| (ino, s, e, MapOp::Set)))
            .chain(dropped.iter().map(move |&(s, e)| (ino, s, e, MapOp::Clear)))
    }
}

/// The bytes of one side of an [`Update`]. Almost every metadata change
/// is a few bytes (a counter, a time, a bitmap byte, a link count), so up
/// to 16 are held in place and only a larger one (a directory entry, a
/// whole inode) allocates.
pub type UpdateBytes = smallvec::SmallVec<[u8; 16]>;

/// One metadata change.
#[derive(Clone, Debug)]
pub struct Update {
    /// File-system block holding the changed bytes.
    pub block: u64,
    /// Byte range within the block.
    pub range: Range<u32>,
    /// The bytes of `range` before the change.
    pub old: UpdateBytes,
    /// The bytes of `range` after the change.
    pub new: UpdateBytes,
    /// What the change means.
    pub kind: UpdateKind,
}

/// One file-data block written by a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataWrite {
    /// The file.
    pub ino: Ino,
    /// Logical block within the file.
    pub lblk: u32,
    /// Physical block on the device.
    pub pblk: u64,
    /// The inode's generation (`i_generation`), which with `ino` and
    /// `lblk` names the block's owner (backpointers' owner records).
    pub generation: u32,
    /// True when the block was allocated by this write (its old contents
    /// belong to nobody); false for an overwrite in place.
    pub fresh: bool,
}

/// The logical block of an inode's extended-attribute block in its owner
/// record (`mode=backpointers`): the attribute block proves its owner
/// through the record, as a file block does.
pub const XATTR_LBLK: u32 = u32::MAX - 1;

/// The logical block of a moving block's owner record
/// (`mode=backpointers`): a collapse or insert range is moving it, and the
/// file's tree on disk may be the one before the shift or the one after.
/// The record names the file (inode and generation) and the contents, at
/// whatever offset the tree gives; no file block has this number (ext4's
/// last is `u32::MAX - 1`, and that one is [`XATTR_LBLK`]).
pub const MOVING_LBLK: u32 = u32::MAX;

/// Who a file block belongs to: the inode, its generation (an inode number
/// reused by a later file has another) and the logical block. Owner
/// records (`mode=backpointers`) bind a physical block to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockOwner {
    /// The inode.
    pub ino: Ino,
    /// Its `i_generation`.
    pub generation: u32,
    /// The logical block in the file.
    pub lblk: u32,
}
