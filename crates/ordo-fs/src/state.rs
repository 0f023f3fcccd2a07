//! The state behind the file-system lock, and the one function every
//! metadata mutation goes through.
//!
//! [`Core::modify`] is the update interface as the core sees it: it applies
//! bytes to a cached block image, records the old and new bytes with their
//! meaning as an [`Update`], bumps the block's generation, marks it dirty and
//! hands the update to the protocol. Nothing else in the core changes a
//! metadata byte, so no protocol can miss a change.
//!
//! Checksums are not recomputed on every field change: a change only marks
//! its structure (inode, directory block, extent block, bitmap, group
//! descriptor, superblock) as needing a new checksum, and [`Core::seal`]
//! recomputes each one once, as an update of kind `Checksum`, when the
//! handle ends. A block image therefore only ever leaves the cache with
//! valid checksums. Protocols that write *older* images of a block (the sync
//! protocol's intermediate writes, soft updates' rollbacks) recompute them
//! through [`Sealer`], which knows what each block holds.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice};
use ordo_format::Superblock;

use crate::cache::BufferCache;
use crate::clock::Clock;
use crate::error::{errno, FsError, Result};
use crate::layout::{self, gd, le16, le32, put16, put32};
use crate::protocol::{Io, IoPlan, Protocol, Sealer, WriteBackReason};
use crate::random::SplitMix64;
use crate::types::Timespec;
use crate::update::{HandleInfo, Ino, OpKind, Update, UpdateBytes, UpdateKind};

/// Room kept free below the cache bound for what one operation handle may
/// add (a write handle covers at most 1 MiB of data plus its metadata).
pub(crate) const PRESSURE_HEADROOM_BYTES: u64 = 4 << 20;

/// A handle's touched inodes are found by walking its list up to this
/// many; past it, through a set beside the list ([`Core::touch_inode`]).
const HANDLE_INODES_SCANNED: usize = 16;

/// What a block holds, for checksum recomputation of block images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A directory leaf block of `ino` (seeded by its generation).
    Dir { ino: Ino, generation: u32 },
    /// An extent-tree block of `ino`.
    Extent { ino: Ino, generation: u32 },
    /// An extended-attribute block (seeded by its block number).
    Xattr,
}

/// Static locations of one block group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupLoc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
}

/// What [`Sealer`] needs, kept apart from the cache so that a protocol can
/// borrow both.
pub(crate) struct SealCtx {
    pub csum: bool,
    pub csum_seed: u32,
    pub block_size: u32,
    pub inode_size: u32,
    pub inodes_per_group: u32,
    pub desc_size: u32,
    pub groups: u32,
    pub gdt_first: u64,
    pub gdt_blocks: u64,
    pub sb_block: u64,
    pub sb_offset: usize,
    pub uuid: [u8; 16],
    pub group_crc16: bool,
    /// Inode-table start block -> group.
    pub itables: BTreeMap<u64, u32>,
    pub itable_blocks: u64,
    pub owners: HashMap<u64, Owner>,
    /// Bitmap block -> (group, whether it is the block bitmap).
    pub bitmaps: HashMap<u64, (u32, bool)>,
    /// Bits of a block bitmap that count (clusters per group).
    pub clusters_per_group: u32,
}

impl SealCtx {
    /// The per-inode checksum seed.
    pub fn ino_seed(&self, ino: Ino, generation: u32) -> u32 {
        ordo_format::csum::inode_csum_seed(self.csum_seed, ino, generation)
    }

    /// Check the stored checksum of in-use inode `ino` (raw bytes): `Err`
    /// carries (stored, computed), each as wide as the inode keeps it.
    pub fn verify_inode_csum(&self, ino: Ino, raw: &[u8]) -> std::result::Result<(), (u32, u32)> {
        let c = self.inode_csum(ino, raw);
        let mut stored = le16(raw, layout::ino::CHECKSUM_LO) as u32;
        let mut computed = c & 0xFFFF;
        if self.inode_size > 128 && le16(raw, layout::ino::EXTRA_ISIZE) >= 4 {
            stored |= (le16(raw, layout::ino::CHECKSUM_HI) as u32) << 16;
            computed = c;
        }
        if stored == computed {
            Ok(())
        } else {
            Err((stored, computed))
        }
    }

    /// The first inode kept in inode-table block `block`, if it is one.
    pub fn first_ino_of_itable_block(&self, block: u64) -> Option<Ino> {
        let (&start, &g) = self.itables.range(..=block).next_back()?;
        let index = block - start;
        if index >= self.itable_blocks {
            return None;
        }
        let per_block = self.block_size as u64 / self.inode_size as u64;
        Ino::try_from(g as u64 * self.inodes_per_group as u64 + index * per_block + 1).ok()
    }

    /// Recompute the checksum of the inode at `off` of an inode-table image.
    pub fn inode_csum(&self, ino: Ino, raw: &[u8]) -> u32 {
        let generation = le32(raw, layout::ino::GENERATION);
        let c = self.ino_seed(ino, generation);
        let isz = self.inode_size as usize;
        // One pass over a copy with the checksum fields zeroed (on the
        // stack for the usual inode sizes), rather than five around them.
        let mut stack = [0u8; 512];
        let mut heap = Vec::new();
        let copy: &mut [u8] = if isz <= stack.len() {
            &mut stack[..isz]
        } else {
            heap.resize(isz, 0);
            &mut heap
        };
        copy.copy_from_slice(&raw[..isz]);
        copy[layout::ino::CHECKSUM_LO..layout::ino::CHECKSUM_LO + 2].fill(0);
        if isz > 128 && le16(raw, layout::ino::EXTRA_ISIZE) >= 4 {
            copy[layout::ino::CHECKSUM_HI..layout::ino::CHECKSUM_HI + 2].fill(0);
        }
        layout::ext4_crc(c, copy)
    }

    /// Checksum of a directory leaf block (over everything but the tail).
    pub fn dir_csum(&self, ino: Ino, generation: u32, image: &[u8]) -> u32 {
        let n = image.len() - layout::dirent::TAIL_LEN;
        layout::ext4_crc(self.ino_seed(ino, generation), &image[..n])
    }

    /// The checksum a directory block's tail must hold, or `None` for a
    /// block without a tail (an htree node, which keeps its own).
    pub fn dir_tail_csum(&self, ino: Ino, generation: u32, image: &[u8]) -> Option<u32> {
        let t = image.len() - layout::dirent::TAIL_LEN;
        (le16(image, t + 4) == layout::dirent::TAIL_LEN as u16
            && image[t + 7] == layout::dirent::TAIL_FT)
            .then(|| self.dir_csum(ino, generation, image))
    }

    /// Checksum of an extent block: over the header and `eh_max` entries.
    pub fn extent_csum(&self, ino: Ino, generation: u32, image: &[u8]) -> Option<(usize, u32)> {
        let max = le16(image, 4) as usize;
        let end = 12 + 12 * max;
        if end + 4 > image.len() {
            return None;
        }
        Some((
            end,
            layout::ext4_crc(self.ino_seed(ino, generation), &image[..end]),
        ))
    }

    /// Group descriptor checksum of group `group` whose descriptor is `desc`.
    pub fn gd_csum(&self, group: u32, desc: &[u8]) -> u16 {
        let csum = if self.group_crc16 {
            ordo_format::superblock::GroupCsum::Crc16 { uuid: self.uuid }
        } else {
            ordo_format::superblock::GroupCsum::Crc32c {
                seed: self.csum_seed,
            }
        };
        ordo_format::group::group_desc_checksum(&desc[..self.desc_size as usize], group, csum)
    }

    fn itable_group(&self, block: u64) -> Option<(u32, u64)> {
        let (&start, &g) = self.itables.range(..=block).next_back()?;
        (block < start + self.itable_blocks).then_some((g, block - start))
    }
}

impl Sealer for SealCtx {
    fn bitmap_desc_block(&self, block: u64) -> Option<u64> {
        let &(g, _) = self.bitmaps.get(&block)?;
        let byte = g as u64 * self.desc_size as u64;
        Some(self.gdt_first + byte / self.block_size as u64)
    }

    fn seal_bitmap_csums(
        &self,
        block: u64,
        image: &mut [u8],
        bitmap: &dyn Fn(u64) -> Option<Arc<Vec<u8>>>,
    ) {
        if !self.csum || block < self.gdt_first || block >= self.gdt_first + self.gdt_blocks {
            return;
        }
        let ds = self.desc_size as usize;
        let per = self.block_size as usize / ds;
        let first = (block - self.gdt_first) as usize * per;
        for (&b, &(g, is_block)) in &self.bitmaps {
            let g = g as usize;
            if g < first || g >= first + per {
                continue;
            }
            let Some(img) = bitmap(b) else { continue };
            let n = if is_block {
                self.clusters_per_group / 8
            } else {
                self.inodes_per_group / 8
            } as usize;
            let c = layout::ext4_crc(self.csum_seed, &img[..n.min(img.len())]);
            let desc = &mut image[(g - first) * ds..(g - first + 1) * ds];
            let (lo, hi) = if is_block {
                (gd::BLOCK_BITMAP_CSUM_LO, gd::BLOCK_BITMAP_CSUM_HI)
            } else {
                (gd::INODE_BITMAP_CSUM_LO, gd::INODE_BITMAP_CSUM_HI)
            };
            put16(desc, lo, c as u16);
            if ds >= 64 {
                put16(desc, hi, (c >> 16) as u16);
            }
        }
    }

    fn reseal(&self, block: u64, image: &mut [u8]) {
        if block == self.sb_block {
            if self.csum {
                let sb = &mut image[self.sb_offset..self.sb_offset + 1024];
                let c = layout::ext4_crc(!0, &sb[..layout::sb::CHECKSUM]);
                put32(sb, layout::sb::CHECKSUM, c);
            }
            return;
        }
        if block >= self.gdt_first && block < self.gdt_first + self.gdt_blocks {
            if !(self.csum || self.group_crc16) {
                return;
            }
            let ds = self.desc_size as usize;
            let per = self.block_size as usize / ds;
            for i in 0..per {
                let g = (block - self.gdt_first) as usize * per + i;
                if g >= self.groups as usize {
                    break;
                }
                let c = self.gd_csum(g as u32, &image[i * ds..(i + 1) * ds]);
                put16(&mut image[i * ds..], gd::CHECKSUM, c);
            }
            return;
        }
        if !self.csum {
            return;
        }
        if let Some((g, rel)) = self.itable_group(block) {
            let isz = self.inode_size as usize;
            let per = self.block_size as usize / isz;
            for i in 0..per {
                let index = rel * per as u64 + i as u64;
                let ino = g as u64 * self.inodes_per_group as u64 + index + 1;
                let raw = &image[i * isz..(i + 1) * isz];
                if raw.iter().all(|&b| b == 0) {
                    continue;
                }
                let c = self.inode_csum(ino as Ino, raw);
                let raw = &mut image[i * isz..(i + 1) * isz];
                put16(raw, layout::ino::CHECKSUM_LO, c as u16);
                if isz > 128 && le16(raw, layout::ino::EXTRA_ISIZE) >= 4 {
                    put16(raw, layout::ino::CHECKSUM_HI, (c >> 16) as u16);
                }
            }
            return;
        }
        match self.owners.get(&block) {
            Some(Owner::Dir { ino, generation }) => {
                if let Some(c) = self.dir_tail_csum(*ino, *generation, image) {
                    let n = image.len();
                    put32(image, n - 4, c);
                }
            }
            Some(Owner::Extent { ino, generation }) => {
                if let Some((at, c)) = self.extent_csum(*ino, *generation, image) {
                    put32(image, at, c);
                }
            }
            Some(Owner::Xattr) => {
                let c = ordo_format::xattr::block_checksum(self.csum_seed, block, image);
                put32(image, ordo_format::xattr::BLOCK_CHECKSUM, c);
            }
            None => {}
        }
    }
}

/// Checksums to recompute at the end of the handle.
#[derive(Clone, Default)]
struct PendingCsum {
    inodes: FewSet<Ino>,
    dir_blocks: FewSet<u64>,
    extent_blocks: FewSet<u64>,
    block_bitmaps: FewSet<u32>,
    inode_bitmaps: FewSet<u32>,
    groups: FewSet<u32>,
    superblock: bool,
}

/// An ordered set of the keys one handle touches. An operation names one
/// to four inodes, blocks or groups of each kind, held in a sorted inline
/// vector, so that a handle allocates nothing for its checksums (a
/// `BTreeSet` allocated a node per kind and handle: ten allocations and
/// frees per created file); past [`FewSet::INLINE_MAX`] keys (a truncation
/// freeing across many groups) it becomes a `BTreeSet`, so that inserting
/// stays logarithmic. Either way the keys come out in order.
#[derive(Debug)]
enum FewSet<T: Ord + Copy> {
    Few(SmallVec<[T; 4]>),
    Many(BTreeSet<T>),
}

// A savepoint clones every set of the handle (three savepoints per created
// file): the keys are `Copy`, so the inline vector is copied whole, not
// pushed key by key as the derived clone (`Extend`) does.
impl<T: Ord + Copy> Clone for FewSet<T> {
    fn clone(&self) -> Self {
        match self {
            FewSet::Few(keys) => FewSet::Few(SmallVec::from_slice(keys)),
            FewSet::Many(set) => FewSet::Many(set.clone()),
        }
    }
}

impl<T: Ord + Copy> Default for FewSet<T> {
    fn default() -> Self {
        FewSet::Few(SmallVec::new())
    }
}

impl<T: Ord + Copy> FewSet<T> {
    /// The most keys kept in the sorted vector.
    const INLINE_MAX: usize = 32;

    fn insert(&mut self, v: T) {
        match self {
            FewSet::Few(keys) => {
                if let Err(at) = keys.binary_search(&v) {
                    if keys.len() < Self::INLINE_MAX {
                        keys.insert(at, v);
                    } else {
                        let mut set: BTreeSet<T> = keys.drain(..).collect();
                        set.insert(v);
                        *self = FewSet::Many(set);
                    }
                }
            }
            FewSet::Many(set) => {
                set.insert(v);
            }
        }
    }
}

/// The keys of a [`FewSet`], in order.
enum FewIter<T: Ord + Copy> {
    Few(smallvec::IntoIter<[T; 4]>),
    Many(std::collections::btree_set::IntoIter<T>),
}

impl<T: Ord + Copy> Iterator for FewIter<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        match self {
            FewIter::Few(it) => it.next(),
            FewIter::Many(it) => it.next(),
        }
    }
}

impl<T: Ord + Copy> IntoIterator for FewSet<T> {
    type Item = T;
    type IntoIter = FewIter<T>;
    fn into_iter(self) -> FewIter<T> {
        match self {
            FewSet::Few(keys) => FewIter::Few(keys.into_iter()),
            FewSet::Many(set) => FewIter::Many(set.into_iter()),
        }
    }
}

/// One entry of a handle's undo log.
enum Undo {
    /// `old` was at `offset` of `block` before an update of meaning `kind`.
    Bytes {
        block: u64,
        offset: usize,
        old: UpdateBytes,
        kind: UpdateKind,
    },
    /// `block` entered the cache as a fresh image (`init_block`): nothing
    /// cached before it was valid, so undoing drops it again.
    Init { block: u64 },
    /// Block `lblk` of `ino` was delayed (`delalloc.rs`).
    Delayed { ino: Ino, lblk: u32 },
    /// Delayed block `lblk` of `ino` was given its place `pblk`.
    Settled {
        ino: Ino,
        lblk: u32,
        delayed: crate::delalloc::DelayedBlock,
        pblk: u64,
    },
}

/// A point in the current handle to roll back to ([`Core::savepoint`],
/// [`Core::rollback_to`]).
pub(crate) struct Savepoint {
    undo: usize,
    freed: usize,
    pending: PendingCsum,
}

/// The meaning of the update that undoes an update of meaning `kind`.
fn inverse(kind: &UpdateKind) -> UpdateKind {
    use crate::update::{LinkOp, MapOp};
    match kind.clone() {
        UpdateKind::Extent {
            ino,
            lblk,
            pblk,
            len,
            op,
        } => UpdateKind::Extent {
            ino,
            lblk,
            pblk,
            len,
            op: if op == MapOp::Set {
                MapOp::Clear
            } else {
                MapOp::Set
            },
        },
        UpdateKind::ExtentTree {
            ino,
            named,
            dropped,
        } => UpdateKind::ExtentTree {
            ino,
            named: dropped,
            dropped: named,
        },
        UpdateKind::Dirent { dir, name, ino, op } => UpdateKind::Dirent {
            dir,
            name,
            ino,
            op: match op {
                LinkOp::Add => LinkOp::Remove,
                LinkOp::Remove => LinkOp::Add,
            },
        },
        UpdateKind::Bitmap { what, index, set } => UpdateKind::Bitmap {
            what,
            index,
            set: !set,
        },
        UpdateKind::Counter { what, group, delta } => UpdateKind::Counter {
            what,
            group,
            delta: -delta,
        },
        k => k,
    }
}

/// Per-directory in-memory name index (see `dir.rs`).
pub(crate) use crate::dir::DirIndex;

/// Everything behind the file-system lock.
pub(crate) struct Core {
    pub dev: Arc<dyn BlockDevice>,
    pub sbi: Superblock,
    pub bs: u32,
    pub groups: Vec<GroupLoc>,
    pub cache: BufferCache,
    pub proto: Box<dyn Protocol>,
    pub seal: SealCtx,
    pub read_only: bool,
    pub handle: HandleInfo,
    /// The inodes of `handle.inodes` once there are more than
    /// [`HANDLE_INODES_SCANNED`] (a write-back that places the delayed
    /// blocks of thousands of files in one handle): membership without a
    /// walk of the list.
    handle_inode_set: HashSet<Ino>,
    /// Free blocks and free inodes over every group, as the descriptors
    /// say ([`Core::free_totals`]): summed once, then moved by each change
    /// of a descriptor's bytes (`Core::modify`, a rollback), so that the
    /// space check of an allocation by a caller without root's right does
    /// not read every descriptor. `None` until first asked, and again
    /// whenever a descriptor block is read from the device.
    pub(crate) free_sums: Option<(u64, u64)>,
    pub in_handle: bool,
    next_handle_id: u64,
    pending: PendingCsum,
    /// Directory name indexes, built on first access.
    pub dirs: HashMap<Ino, DirIndex>,
    /// Names held by all of `dirs` (kept exact at every insert and drop).
    pub dir_names: usize,
    /// Most names `dirs` may hold between operations
    /// ([`Core::bound_dir_indexes`]); set from the cache bound at mount.
    pub dir_names_bound: usize,
    /// Counts uses of `dirs`, to find the least recently used.
    pub dir_uses: u64,
    /// Indexes dropped to stay within the bound.
    pub dir_index_evictions: u64,
    /// Open-handle counts (unlinked inodes live until the last release).
    pub open_counts: HashMap<Ino, u32>,
    /// Rotor for directory placement.
    pub dir_rotor: u32,
    /// Per group, the used front of its block bitmap and of its inode
    /// bitmap as the allocators last saw them ([`crate::alloc::UsedFront`]).
    pub(crate) block_fronts: Vec<crate::alloc::UsedFront>,
    pub(crate) inode_fronts: Vec<crate::alloc::UsedFront>,
    /// The random source inode generations are drawn from (seeded by
    /// `MountOptions::seed`).
    pub rng: SplitMix64,
    /// The mount's clock: every timestamp the core writes is read here.
    pub clock: Arc<dyn Clock>,
    /// Plans made while the lock was held, waiting to be executed.
    pub plans: Vec<IoPlan>,
    /// The number the next plan gets ([`IoPlan::serial`]).
    next_plan_serial: u64,
    /// The newest generation of each block a queued plan sends home, while
    /// such a plan is queued or running (the write-order invariant).
    home_generation: HashMap<u64, u64>,
    /// In-use inodes whose checksum was wrong when their inode-table block
    /// came from the device, with (stored, computed), until the core
    /// rewrites them: what `read_inode` judges an inode by, in a clean
    /// block or in one a neighbour's change dirtied (whose bytes can no
    /// longer be checked in place), so that the inode keeps failing as
    /// ext4's would.
    pub inode_csum_bad: BTreeMap<Ino, (u32, u32)>,
    /// The current handle's undo log (kept for the operations that can
    /// fail for space once they changed something; see [`Core::rollback_to`]).
    undo: Vec<Undo>,
    undo_on: bool,
    /// Blocks freed by the current handle, in order. They leave the cache
    /// and are reported to the protocol when the handle ends (a rollback
    /// may still take the free back), and are not allocated again by the
    /// same handle.
    freed_in_handle: Vec<u64>,
    /// See [`Core::frees`].
    frees: u64,
    freed_set: HashSet<u64>,
    /// Whether the current handle may allocate the blocks reserved for
    /// root (`s_r_blocks_count`).
    pub use_reserve: bool,
    /// The current handle's write was cut short by ENOSPC (it returns the
    /// bytes it wrote): with frees pending, the handle is rolled back and
    /// retried whole after a commit rather than committed half done.
    pub short_for_space: bool,
    /// Allocate blocks first-fit from the start of the goal's group
    /// rather than from the goal, as the kernel's fast-commit replay
    /// allocator does (fast-commit replay runs on a core with this set).
    pub alloc_from_group_start: bool,
    /// Attribute blocks this mount has read or written, by `h_hash`: the
    /// candidates for sharing (ext4's mbcache).
    pub xattr_shared: HashMap<u32, Vec<u64>>,
    /// The protocol asked for backlinks (`Capabilities::backlinks`): the
    /// core keeps them, checks names against them and checks data reads
    /// with the protocol's owner records (`backlinks.rs`).
    pub backlinks: bool,
    /// Backlinks: allocation state must be rebuilt by the scanners
    /// (`scan.rs`) before anything is allocated.
    pub scan_needed: bool,
    /// The metadata scanner's findings so far, when the background thread
    /// has run part of it (`scan.rs`, `Core::meta_scan_step`).
    pub(crate) meta_scan: Option<crate::scan::MetaScan>,
    /// The scanners move names without touching backlinks.
    pub backlinks_frozen: bool,
    /// What the backlink checks and the scanners found.
    pub nofs: crate::scan::NofsStats,
    /// Blocks written into holes and not allocated yet
    /// ([`crate::protocol::Protocol::delays_allocation`], `delalloc.rs`).
    pub(crate) delayed: crate::delalloc::Delayed,
    /// The protocol delays allocation.
    pub delalloc_on: bool,
    /// Delayed blocks are being given their places: the allocations may
    /// use the blocks promised to them.
    pub(crate) settling: bool,
}

impl Core {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        sbi: Superblock,
        groups: Vec<GroupLoc>,
        cache: BufferCache,
        proto: Box<dyn Protocol>,
        seal: SealCtx,
        read_only: bool,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Core {
        let bs = sbi.block_size();
        let delalloc_on = proto.delays_allocation();
        let fronts = vec![crate::alloc::UsedFront::default(); groups.len()];
        Core {
            dev,
            sbi,
            bs,
            groups,
            cache,
            proto,
            seal,
            read_only,
            handle: HandleInfo {
                id: 0,
                op: OpKind::Internal,
                stream: 0,
                inodes: Vec::new(),
            },
            handle_inode_set: HashSet::default(),
            free_sums: None,
            in_handle: false,
            next_handle_id: 1,
            pending: PendingCsum::default(),
            dirs: HashMap::default(),
            dir_names: 0,
            dir_names_bound: usize::MAX,
            dir_uses: 0,
            dir_index_evictions: 0,
            open_counts: HashMap::default(),
            dir_rotor: 0,
            block_fronts: fronts.clone(),
            inode_fronts: fronts,
            rng: SplitMix64::new(seed),
            clock,
            plans: Vec::new(),
            next_plan_serial: 0,
            home_generation: Default::default(),
            inode_csum_bad: BTreeMap::new(),
            undo: Vec::new(),
            undo_on: false,
            freed_in_handle: Vec::new(),
            frees: 0,
            freed_set: HashSet::default(),
            use_reserve: true,
            short_for_space: false,
            alloc_from_group_start: false,
            xattr_shared: HashMap::default(),
            backlinks: false,
            scan_needed: false,
            meta_scan: None,
            backlinks_frozen: false,
            nofs: Default::default(),
            delayed: Default::default(),
            delalloc_on,
            settling: false,
        }
    }

    // ----- blocks -----

    /// The cached image of `block`, reading it from the device on a miss.
    pub fn read_block(&mut self, block: u64, class: BlockClass) -> Result<Arc<Vec<u8>>> {
        if block >= self.sbi.blocks_count {
            return Err(FsError::corrupt(
                block,
                "block number",
                format!(
                    "beyond the end of the device ({} blocks)",
                    self.sbi.blocks_count
                ),
            ));
        }
        if let Some(image) = self.cache.get_shared(block) {
            return Ok(image);
        }
        let mut buf = vec![0u8; self.bs as usize];
        self.dev.read(block, &mut buf, class)?;
        if self.seal.csum {
            // Whatever class the caller asked for: an inode-table block's
            // inodes are checked here once, and `read_inode` relies on it.
            self.note_inode_csums(block, &buf);
        }
        if self.is_gd_block(block) {
            // What the device holds may not be what the sums were kept
            // from (a replay wrote it): sum again when next asked.
            self.free_sums = None;
        }
        self.cache.insert_clean(block, class, buf);
        Ok(self.cache.snapshot(block).expect("just cached"))
    }

    /// Record which in-use inodes of inode-table `block` (as read from the
    /// device) fail their checksum.
    fn note_inode_csums(&mut self, block: u64, image: &[u8]) {
        let Some(first) = self.seal.first_ino_of_itable_block(block) else {
            return;
        };
        let isz = self.seal.inode_size as usize;
        for (k, raw) in image.chunks_exact(isz).enumerate() {
            let ino = first.saturating_add(k as Ino);
            if ino > self.sbi.inodes_count {
                break;
            }
            let in_use = le16(raw, layout::ino::MODE) != 0;
            match self.seal.verify_inode_csum(ino, raw) {
                Err(bad) if in_use => {
                    self.inode_csum_bad.insert(ino, bad);
                }
                _ => {
                    self.inode_csum_bad.remove(&ino);
                }
            }
        }
    }

    /// Make sure `block` is cached (for a following [`Core::modify`]).
    pub fn ensure(&mut self, block: u64, class: BlockClass) -> Result<()> {
        self.read_block(block, class).map(|_| ())
    }

    /// The one function through which metadata changes: apply `bytes` at
    /// `offset` of cached `block`, and report the change as an update of
    /// meaning `kind` on the current handle. The block must be cached.
    pub fn modify(&mut self, block: u64, offset: usize, bytes: &[u8], kind: UpdateKind) {
        assert!(
            self.in_handle,
            "metadata change outside an operation handle"
        );
        assert!(!self.read_only, "metadata change on a read-only mount");
        let Some(old) = self.cache.modify(block, offset, bytes) else {
            return;
        };
        self.gd_bytes_changed(block, offset, &old);
        let u = Update {
            block,
            range: offset as u32..(offset + bytes.len()) as u32,
            old,
            new: UpdateBytes::from_slice(bytes),
            kind,
        };
        self.proto.on_update(&u, &self.handle);
        // The undo record takes the replaced bytes and the meaning from the
        // update once the protocol has seen it: no copy of either.
        if self.undo_on {
            self.undo.push(Undo::Bytes {
                block,
                offset,
                old: u.old,
                kind: u.kind,
            });
        }
    }

    /// Install a freshly allocated block's whole first image (nothing on
    /// disk is valid there), reported as one update of meaning `kind`.
    pub fn init_block(&mut self, block: u64, class: BlockClass, image: &[u8], kind: UpdateKind) {
        assert!(self.in_handle && !self.read_only);
        self.cache
            .insert_new(block, class, vec![0u8; self.bs as usize]);
        if self.undo_on {
            self.undo.push(Undo::Init { block });
        }
        if image.iter().any(|&b| b != 0) {
            self.modify(block, 0, image, kind);
        } else {
            // A zero image changes no cached byte, but the block is new:
            // its zeros must reach the disk, so the protocol hears of it.
            let u = Update {
                block,
                range: 0..image.len() as u32,
                old: UpdateBytes::from_slice(image),
                new: UpdateBytes::from_slice(image),
                kind,
            };
            self.proto.on_update(&u, &self.handle);
        }
    }

    // ----- undo -----

    /// The current point of the handle, to roll back to.
    pub fn savepoint(&self) -> Savepoint {
        Savepoint {
            undo: self.undo.len(),
            freed: self.freed_in_handle.len(),
            pending: self.pending.clone(),
        }
    }

    /// Undo every change the handle made since `sp`, newest first: each
    /// byte range gets its old bytes back (reported to the protocol as an
    /// update of the inverse meaning), frees are taken back, blocks
    /// allocated since are dropped from the cache and reported to the
    /// protocol as unallocated, directory indexes touched are rebuilt on
    /// next use. Afterwards the file system is, byte for byte, what it was
    /// at `sp`: an operation that fails for space half-way leaves nothing
    /// behind, no allocated-but-unreachable inode or block.
    ///
    /// A handle without an undo log (one that only releases space) is left
    /// as it is: its frees must still reach the protocol.
    pub fn rollback_to(&mut self, sp: Savepoint) {
        use crate::update::BitmapKind;
        if !self.undo_on {
            return;
        }
        let mut unallocated: Vec<u64> = Vec::new();
        let mut inodes: BTreeSet<Ino> = BTreeSet::new();
        let changed = self.undo.len() > sp.undo || self.freed_in_handle.len() > sp.freed;
        while self.undo.len() > sp.undo {
            let Some(u) = self.undo.pop() else { break };
            match u {
                Undo::Init { block } => {
                    self.cache.forget(block);
                }
                Undo::Delayed { ino, lblk } => self.undo_delayed(ino, lblk),
                Undo::Settled {
                    ino,
                    lblk,
                    delayed,
                    pblk,
                } => self.undo_settled(ino, lblk, delayed, pblk),
                Undo::Bytes {
                    block,
                    offset,
                    old,
                    kind,
                } => {
                    if !self.cache.contains(block) {
                        continue;
                    }
                    match &kind {
                        UpdateKind::Bitmap {
                            what: BitmapKind::Block,
                            index,
                            set: true,
                        } => unallocated.push(*index),
                        UpdateKind::Bitmap {
                            what: BitmapKind::Block,
                            index,
                            set: false,
                        } => unallocated.retain(|b| b != index),
                        UpdateKind::Inode { ino, .. }
                        | UpdateKind::Extent { ino, .. }
                        | UpdateKind::ExtentBlockInit { ino }
                        | UpdateKind::Dirent { dir: ino, .. }
                        | UpdateKind::DirBlockInit { dir: ino } => {
                            inodes.insert(*ino);
                        }
                        _ => {}
                    }
                    if let Some(cur) = self.cache.modify(block, offset, &old) {
                        self.gd_bytes_changed(block, offset, &cur);
                        let u = Update {
                            block,
                            range: offset as u32..(offset + old.len()) as u32,
                            old: cur,
                            new: old,
                            kind: inverse(&kind),
                        };
                        self.proto.on_update(&u, &self.handle);
                    }
                }
            }
        }
        for b in self.freed_in_handle.drain(sp.freed..) {
            self.freed_set.remove(&b);
        }
        self.pending = sp.pending;
        for b in unallocated {
            self.cache.forget(b);
            self.seal.owners.remove(&b);
            self.proto.on_block_unallocated(b, &self.handle);
        }
        for ino in inodes {
            self.drop_dir_index(ino);
        }
        if changed {
            self.proto.on_rollback(&self.handle);
        }
    }

    /// Whether the current handle keeps an undo log (it may roll back).
    pub(crate) fn undo_enabled(&self) -> bool {
        self.undo_on
    }

    /// Note a delayed block in the undo log.
    pub(crate) fn note_delayed(&mut self, ino: Ino, lblk: u32) {
        if self.undo_on {
            self.undo.push(Undo::Delayed { ino, lblk });
        }
    }

    /// Note a delayed block's settling in the undo log.
    pub(crate) fn note_settled(
        &mut self,
        ino: Ino,
        lblk: u32,
        delayed: crate::delalloc::DelayedBlock,
        pblk: u64,
    ) {
        if self.undo_on {
            self.undo.push(Undo::Settled {
                ino,
                lblk,
                delayed,
                pblk,
            });
        }
    }

    /// Note that the handle freed `block` (see `freed_in_handle`).
    pub fn note_block_freed(&mut self, block: u64) {
        self.freed_in_handle.push(block);
        self.freed_set.insert(block);
        self.frees += 1;
    }

    /// Blocks freed since mount (a counter that only grows): a read that
    /// left the core's lock to read the device is valid only if it did not
    /// move meanwhile ([`Core::file_read_deferred`]).
    pub fn frees(&self) -> u64 {
        self.frees
    }

    /// Whether the handle freed `block` (it may not take it again).
    pub fn freed_by_handle(&self, block: u64) -> bool {
        self.freed_set.contains(&block)
    }

    // ----- handles -----

    /// Open the operation handle of one public call, made in the caller's
    /// `stream`.
    pub fn begin(&mut self, op: OpKind, stream: u32) {
        assert!(!self.in_handle, "nested operation handle");
        self.handle = HandleInfo {
            id: self.next_handle_id,
            op,
            stream,
            inodes: Vec::new(),
        };
        self.handle_inode_set.clear();
        self.next_handle_id += 1;
        self.in_handle = true;
        // Operations that only release space cannot fail for it: no undo
        // log (an unlink of a large file would log every bitmap bit).
        self.undo_on = !matches!(
            op,
            OpKind::Unlink | OpKind::Rmdir | OpKind::Evict | OpKind::Internal
        );
        self.undo.clear();
        self.use_reserve = true;
        self.short_for_space = false;
    }

    /// Note that the handle touched `ino`.
    pub fn touch_inode(&mut self, ino: Ino) {
        let list = &mut self.handle.inodes;
        if list.len() <= HANDLE_INODES_SCANNED {
            if !list.contains(&ino) {
                list.push(ino);
                if list.len() > HANDLE_INODES_SCANNED {
                    self.handle_inode_set.extend(list.iter().copied());
                }
            }
        } else if self.handle_inode_set.insert(ino) {
            list.push(ino);
        }
        debug_assert_eq!(
            self.handle_inode_set.len(),
            if list.len() > HANDLE_INODES_SCANNED {
                list.len()
            } else {
                0
            },
            "the set of the handle's inodes drifted from its list"
        );
    }

    /// Close the handle: recompute checksums, let the protocol plan, and
    /// queue its plan.
    pub fn end(&mut self) -> Result<()> {
        assert!(self.in_handle);
        // A commit at this handle's end carries every allocation the
        // sizes in its transaction name: place the delayed blocks first
        // (before the handle's frees leave the cache and its checksums
        // are sealed).
        let settled = if !self.delayed.is_empty() && self.proto.commit_due(&self.handle) {
            self.settle_all()
        } else {
            Ok(())
        };
        if self.undo.capacity() > 1 << 12 {
            // A large handle (a rename over a big file) does not keep its
            // log's memory for the next one.
            self.undo = Vec::new();
        } else {
            self.undo.clear();
        }
        self.undo_on = false;
        self.freed_set.clear();
        for b in std::mem::take(&mut self.freed_in_handle) {
            if !self.proto.keeps_freed_block(b) {
                self.cache.forget(b);
                self.seal.owners.remove(&b);
            }
            self.proto.on_block_freed(b, &self.handle);
        }
        if !self.read_only {
            self.seal();
        }
        let mut plan = IoPlan::numbered(self.next_plan_serial);
        let r = {
            let Core {
                proto,
                cache,
                handle,
                seal,
                ..
            } = self;
            let mut io = Io::with_sealer(cache, &mut plan, seal);
            proto.on_handle_end(handle, &mut io)
        };
        self.in_handle = false;
        self.queue_plan(plan);
        settled.and(r)
    }

    /// Queue a plan the protocol made: every image it writes passes the
    /// protocol's `prepare_block_write` here (the one place), and the
    /// write path's invariants are checked.
    fn queue_plan(&mut self, mut plan: IoPlan) {
        if plan.is_empty() {
            return;
        }
        assert_eq!(
            plan.serial, self.next_plan_serial,
            "plans are queued in the order they are made"
        );
        self.next_plan_serial += 1;
        plan.prepare_images(self.proto.as_mut(), self.cache.block_size() as usize);
        let bs = self.cache.block_size() as usize;
        for step in &plan.steps {
            if let crate::protocol::IoStep::Write { block, data, .. } = step {
                // Whole blocks, inside the file system.
                assert!(
                    !data.is_empty() && data.len() % bs == 0,
                    "write of {} bytes at {block}",
                    data.len()
                );
                assert!(
                    *block + (data.len() / bs) as u64 <= self.sbi.blocks_count,
                    "write at {block} past the end of the file system ({} blocks)",
                    self.sbi.blocks_count
                );
            }
        }
        for &(block, gen) in &plan.pinned {
            // A plan never sends home an image older than one an earlier
            // plan sent: generations of a block reach its home in order.
            let last = self.home_generation.entry(block).or_insert(0);
            assert!(
                gen >= *last,
                "plan {} writes block {block} at generation {gen} after generation {last} was written",
                plan.serial
            );
            *last = gen;
        }
        self.plans.push(plan);
    }

    /// Ask the protocol for a plan outside any handle (fsync, sync,
    /// write-back).
    pub fn plan_with(
        &mut self,
        f: impl FnOnce(&mut dyn Protocol, &mut Io) -> Result<()>,
    ) -> Result<()> {
        assert!(!self.in_handle);
        if !self.delayed.is_empty() {
            // Whatever the protocol plans may commit: every delayed block
            // gets its place first, in a handle of its own.
            self.begin(OpKind::Internal, 0);
            let settled = self.settle_all();
            let ended = self.end();
            settled?;
            ended?;
        }
        let mut plan = IoPlan::numbered(self.next_plan_serial);
        let r = {
            let Core {
                proto,
                cache,
                seal,
                home_generation,
                ..
            } = self;
            let mut io = Io::with_sealer(cache, &mut plan, seal).with_in_flight(home_generation);
            f(proto.as_mut(), &mut io)
        };
        self.queue_plan(plan);
        r
    }

    /// After a plan ran: unpin, mark clean, tell the protocol.
    pub fn plan_finished(&mut self, plan: &IoPlan, done: &crate::protocol::PlanDone) {
        assert_eq!(done.serial, plan.serial);
        for &(block, gen) in &plan.pinned {
            if let std::collections::hash_map::Entry::Occupied(last) =
                self.home_generation.entry(block)
            {
                if *last.get() == gen {
                    last.remove();
                }
            }
            self.cache.finish_write(block, gen, done.ok);
        }
        self.proto.plan_done(done);
    }

    /// Enforce the memory bound: evict clean blocks; if that is not enough,
    /// ask the protocol to write back (the plan runs after the lock is
    /// released, and eviction happens again when it finished).
    pub fn relieve_pressure(&mut self) -> Result<()> {
        self.bound_dir_indexes();
        self.cache.note_peak();
        let bound = self.cache.bound_bytes();
        // Act before the bound is reached: one operation handle may add up
        // to `PRESSURE_HEADROOM_BYTES` before the next check.
        let high = bound - (bound / 4).min(PRESSURE_HEADROOM_BYTES);
        if self.cache.cached_bytes() <= high {
            return Ok(());
        }
        self.cache.evict_to(high - high / 8);
        if self.cache.cached_bytes() > high && self.cache.dirty_count() > 0 && !self.read_only {
            self.plan_with(|p, io| p.write_back(WriteBackReason::Pressure, io))?;
        }
        Ok(())
    }

    // ----- checksum bookkeeping -----

    pub fn csum_inode(&mut self, ino: Ino) {
        self.pending.inodes.insert(ino);
    }
    pub fn csum_dir_block(&mut self, block: u64) {
        self.pending.dir_blocks.insert(block);
    }
    pub fn csum_extent_block(&mut self, block: u64) {
        self.pending.extent_blocks.insert(block);
    }
    pub fn csum_block_bitmap(&mut self, group: u32) {
        self.pending.block_bitmaps.insert(group);
        self.pending.groups.insert(group);
    }
    pub fn csum_inode_bitmap(&mut self, group: u32) {
        self.pending.inode_bitmaps.insert(group);
        self.pending.groups.insert(group);
    }
    pub fn csum_superblock(&mut self) {
        self.pending.superblock = true;
    }

    /// Recompute every pending checksum, each as a `Checksum` update.
    pub fn seal(&mut self) {
        let p = std::mem::take(&mut self.pending);
        let csum = self.seal.csum;
        if csum {
            for ino in p.inodes {
                let (block, off) = self.inode_loc(ino);
                if self.ensure(block, BlockClass::InodeTable).is_err() {
                    continue;
                }
                let img = self.cache.snapshot(block).expect("cached");
                let isz = self.seal.inode_size as usize;
                let raw = &img[off..off + isz];
                let c = self.seal.inode_csum(ino, raw);
                let has_hi = isz > 128 && le16(raw, layout::ino::EXTRA_ISIZE) >= 4;
                // The core rewrote the inode: its checksum now holds.
                self.inode_csum_bad.remove(&ino);
                drop(img);
                self.modify(
                    block,
                    off + layout::ino::CHECKSUM_LO,
                    &(c as u16).to_le_bytes(),
                    UpdateKind::Checksum,
                );
                if has_hi {
                    self.modify(
                        block,
                        off + layout::ino::CHECKSUM_HI,
                        &((c >> 16) as u16).to_le_bytes(),
                        UpdateKind::Checksum,
                    );
                }
            }
            for block in p.dir_blocks.into_iter().chain(p.extent_blocks) {
                let Some(img) = self.cache.snapshot(block) else {
                    continue;
                };
                // The checksum is computed over the cached image in place
                // (no copy of the block) and written as one update of its
                // four bytes.
                let n = img.len();
                let patch = match self.seal.owners.get(&block) {
                    Some(&Owner::Dir { ino, generation }) => {
                        let v = match self.seal.dir_tail_csum(ino, generation, &img) {
                            Some(c) => c.to_le_bytes(),
                            // No tail (an htree node): its bytes stay.
                            None => img[n - 4..].try_into().expect("four bytes"),
                        };
                        Some((n - 4, v))
                    }
                    Some(&Owner::Extent { ino, generation }) => self
                        .seal
                        .extent_csum(ino, generation, &img)
                        .map(|(at, c)| (at, c.to_le_bytes())),
                    Some(Owner::Xattr) | None => None,
                };
                drop(img);
                if let Some((at, v)) = patch {
                    self.modify(block, at, &v, UpdateKind::Checksum);
                }
            }
            for g in p.block_bitmaps {
                let loc = self.groups[g as usize];
                if let Ok(img) = self.read_block(loc.block_bitmap, BlockClass::GroupMeta) {
                    let n = (self.sbi.clusters_per_group / 8) as usize;
                    let c = layout::ext4_crc(self.seal.csum_seed, &img[..n.min(img.len())]);
                    drop(img);
                    self.set_gd16(g, gd::BLOCK_BITMAP_CSUM_LO, c as u16, UpdateKind::Checksum);
                    if self.seal.desc_size >= 64 {
                        self.set_gd16(
                            g,
                            gd::BLOCK_BITMAP_CSUM_HI,
                            (c >> 16) as u16,
                            UpdateKind::Checksum,
                        );
                    }
                }
            }
            for g in p.inode_bitmaps {
                let loc = self.groups[g as usize];
                if let Ok(img) = self.read_block(loc.inode_bitmap, BlockClass::GroupMeta) {
                    let n = (self.sbi.inodes_per_group / 8) as usize;
                    let c = layout::ext4_crc(self.seal.csum_seed, &img[..n.min(img.len())]);
                    drop(img);
                    self.set_gd16(g, gd::INODE_BITMAP_CSUM_LO, c as u16, UpdateKind::Checksum);
                    if self.seal.desc_size >= 64 {
                        self.set_gd16(
                            g,
                            gd::INODE_BITMAP_CSUM_HI,
                            (c >> 16) as u16,
                            UpdateKind::Checksum,
                        );
                    }
                }
            }
        }
        if csum || self.seal.group_crc16 {
            for g in p.groups {
                let (block, off) = self.gd_loc(g);
                if let Ok(img) = self.read_block(block, BlockClass::GroupMeta) {
                    let ds = self.seal.desc_size as usize;
                    let c = self.seal.gd_csum(g, &img[off..off + ds]);
                    drop(img);
                    self.modify(
                        block,
                        off + gd::CHECKSUM,
                        &c.to_le_bytes(),
                        UpdateKind::Checksum,
                    );
                }
            }
        }
        if csum && p.superblock {
            let block = self.seal.sb_block;
            let off = self.seal.sb_offset;
            if let Ok(img) = self.read_block(block, BlockClass::Super) {
                let c = layout::ext4_crc(!0, &img[off..off + layout::sb::CHECKSUM]);
                drop(img);
                self.modify(
                    block,
                    off + layout::sb::CHECKSUM,
                    &c.to_le_bytes(),
                    UpdateKind::Checksum,
                );
            }
        }
    }

    // ----- superblock and group descriptors -----

    /// Read a superblock field (little-endian u32) from the cached image.
    pub fn sb32(&mut self, field: usize) -> Result<u32> {
        let img = self.read_block(self.seal.sb_block, BlockClass::Super)?;
        Ok(le32(&img, self.seal.sb_offset + field))
    }

    /// Change a superblock field.
    pub fn set_sb(&mut self, field: usize, bytes: &[u8], kind: UpdateKind) -> Result<()> {
        self.ensure(self.seal.sb_block, BlockClass::Super)?;
        let off = self.seal.sb_offset + field;
        self.modify(self.seal.sb_block, off, bytes, kind);
        self.csum_superblock();
        Ok(())
    }

    /// Block and byte offset of group `g`'s descriptor.
    pub fn gd_loc(&self, g: u32) -> (u64, usize) {
        let ds = self.seal.desc_size as u64;
        let byte = g as u64 * ds;
        (
            self.seal.gdt_first + byte / self.bs as u64,
            (byte % self.bs as u64) as usize,
        )
    }

    /// Whether `block` holds group descriptors.
    fn is_gd_block(&self, block: u64) -> bool {
        block >= self.seal.gdt_first && block < self.seal.gdt_first + self.seal.gdt_blocks
    }

    /// Free blocks and free inodes in one descriptor's bytes.
    fn gd_free_counts(&self, raw: &[u8]) -> (u64, u64) {
        let count = |lo: usize, hi: usize| {
            let mut v = u64::from(le16(raw, lo));
            if self.seal.desc_size >= 64 {
                v |= u64::from(le16(raw, hi)) << 16;
            }
            v
        };
        (
            count(gd::FREE_BLOCKS_LO, gd::FREE_BLOCKS_HI),
            count(gd::FREE_INODES_LO, gd::FREE_INODES_HI),
        )
    }

    /// The cached bytes `offset..offset + replaced.len()` of `block`
    /// changed from `replaced`: move the kept free sums by what the
    /// descriptors there now count less or more.
    fn gd_bytes_changed(&mut self, block: u64, offset: usize, replaced: &[u8]) {
        let Some((mut fb, mut fi)) = self.free_sums else {
            return;
        };
        if !self.is_gd_block(block) {
            return;
        }
        let ds = self.seal.desc_size as usize;
        let end = offset + replaced.len();
        // The free counts' halves: 0x0C..0x10, and 0x2C..0x30 in a 64-byte
        // descriptor. A change elsewhere (a checksum) moves nothing, and is
        // told apart before the image is looked at.
        let counts = |lo: usize, hi: usize| {
            (lo < gd::FREE_INODES_LO + 2 && gd::FREE_BLOCKS_LO < hi)
                || (ds >= 64 && lo < gd::FREE_INODES_HI + 2 && gd::FREE_BLOCKS_HI < hi)
        };
        let touches_counts = (offset / ds..end.div_ceil(ds)).any(|slot| {
            let at = slot * ds;
            counts(offset.max(at) - at, end.min(at + ds) - at)
        });
        if !touches_counts {
            return;
        }
        let Some(img) = self.cache.snapshot(block) else {
            self.free_sums = None;
            return;
        };
        let per = img.len() / ds;
        let first_group = (block - self.seal.gdt_first) as usize * per;
        let mut before: SmallVec<[u8; 64]> = SmallVec::new();
        for slot in offset / ds..end.div_ceil(ds).min(per) {
            if first_group + slot >= self.groups.len() {
                break;
            }
            let at = slot * ds;
            let (lo, hi) = (offset.max(at), end.min(at + ds));
            if !counts(lo - at, hi - at) {
                continue;
            }
            let now = &img[at..at + ds];
            // The descriptor as it was: the replaced bytes over it.
            before.clear();
            before.extend_from_slice(now);
            before[lo - at..hi - at].copy_from_slice(&replaced[lo - offset..hi - offset]);
            let (b0, i0) = self.gd_free_counts(&before);
            let (b1, i1) = self.gd_free_counts(now);
            match ((fb + b1).checked_sub(b0), (fi + i1).checked_sub(i0)) {
                (Some(b), Some(i)) => (fb, fi) = (b, i),
                // Sums that were not the descriptors' (cannot happen):
                // sum again when next asked.
                _ => {
                    debug_assert!(false, "free sums below a group's count");
                    self.free_sums = None;
                    return;
                }
            }
        }
        self.free_sums = Some((fb, fi));
    }

    /// The cached image of the descriptor block holding group `g`'s
    /// descriptor, and the descriptor's offset in it: its bytes without a
    /// copy.
    fn gd_image(&mut self, g: u32) -> Result<(Arc<Vec<u8>>, usize)> {
        let (block, off) = self.gd_loc(g);
        Ok((self.read_block(block, BlockClass::GroupMeta)?, off))
    }

    /// A 16-bit descriptor field.
    pub fn gd16(&mut self, g: u32, field: usize) -> Result<u16> {
        let (img, off) = self.gd_image(g)?;
        Ok(le16(&img[off..], field))
    }

    /// A 32-bit counter split over lo (16 bits) and hi (16 bits) fields.
    pub fn gd_count(&mut self, g: u32, lo: usize, hi: usize) -> Result<u32> {
        let (img, off) = self.gd_image(g)?;
        let raw = &img[off..off + self.seal.desc_size as usize];
        let mut v = le16(raw, lo) as u32;
        if self.seal.desc_size >= 64 {
            v |= (le16(raw, hi) as u32) << 16;
        }
        Ok(v)
    }

    /// Change a 16-bit descriptor field.
    pub fn set_gd16(&mut self, g: u32, field: usize, v: u16, kind: UpdateKind) {
        let (block, off) = self.gd_loc(g);
        if self.ensure(block, BlockClass::GroupMeta).is_err() {
            return;
        }
        self.modify(block, off + field, &v.to_le_bytes(), kind);
        self.pending.groups.insert(g);
    }

    // ----- inodes (location) -----

    /// Block and byte offset of inode `ino` in its inode table.
    pub fn inode_loc(&self, ino: Ino) -> (u64, usize) {
        let ipg = self.sbi.inodes_per_group;
        let g = ((ino - 1) / ipg) as usize;
        let index = ((ino - 1) % ipg) as u64;
        let byte = index * self.seal.inode_size as u64;
        (
            self.groups[g].inode_table + byte / self.bs as u64,
            (byte % self.bs as u64) as usize,
        )
    }

    /// Check that `ino` is a valid inode number.
    pub fn check_ino(&self, ino: Ino) -> Result<()> {
        if ino == 0 || ino > self.sbi.inodes_count {
            return Err(errno(libc::ENOENT));
        }
        Ok(())
    }

    /// A fresh inode generation number, from the mount's seeded source.
    pub fn next_generation(&mut self) -> u32 {
        self.rng.next_u32()
    }

    /// The current time, from the mount's clock.
    pub fn now(&self) -> Timespec {
        self.clock.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SplitMix64;

    /// A `FewSet` holds what a `BTreeSet` would and gives it back in the
    /// same order, below and past the inline bound, keys repeated.
    #[test]
    fn few_set_is_an_ordered_set() {
        let mut rng = SplitMix64::new(7);
        for n in [0usize, 1, 4, 5, 31, 32, 33, 200] {
            let mut few = FewSet::default();
            let mut all = BTreeSet::new();
            for _ in 0..n {
                let k = rng.next_u64() % (n as u64 / 2 + 1);
                few.insert(k);
                all.insert(k);
            }
            let inline = matches!(few, FewSet::Few(_));
            assert_eq!(
                inline,
                all.len() <= FewSet::<u64>::INLINE_MAX,
                "{n} inserts, {} keys",
                all.len()
            );
            let got: Vec<u64> = few.into_iter().collect();
            let want: Vec<u64> = all.into_iter().collect();
            assert_eq!(got, want, "{n} inserts");
        }
        // Distinct keys in a scattered order, each inserted once: the key
        // that moves the set out of line is kept too.
        for n in [32u64, 33, 100] {
            let mut few = FewSet::default();
            for k in 0..n {
                few.insert(k * 7919 % 1009);
            }
            let mut want: Vec<u64> = (0..n).map(|k| k * 7919 % 1009).collect();
            want.sort_unstable();
            assert_eq!(few.into_iter().collect::<Vec<_>>(), want, "{n} keys");
        }
    }
}
