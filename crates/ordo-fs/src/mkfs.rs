//! `mkfs`: lay out a fresh ext4 file system on a block device.
//!
//! Why ordo has its own mkfs instead of shelling out to `mke2fs`: the crash
//! explorer and the tests build thousands of small images and need them
//! deterministic (fixed UUID, hash seed and timestamps) and in memory; and
//! ordo's own protocols will later add format features of their own that
//! mke2fs does not know.
//!
//! The layout follows mke2fs closely enough that `e2fsck -fn` finds nothing
//! to say and the kernel mounts the result read-write:
//!
//! ```text
//!  group 0                          group 1 (backup)      group 2 ...
//!  +----+-----+---------+---------+-------+------+       +----+-----+----
//!  | sb | GDT | bitmaps | inode   | root, | free |  ...  | sb | GDT | free
//!  |    |     | (flex)  | tables  | l+f   |      |       |    |     |
//!  +----+-----+---------+---------+-------+------+       +----+-----+----
//! ```
//!
//! With `flex_bg` the bitmaps and inode tables of each flex group (16
//! groups) are packed together at the start of its first group, spilling
//! into the next groups when they do not fit. Without it each group holds its
//! own. Superblock and descriptor backups go where `sparse_super` puts them.
//! No resize inode is created (online growth is not an ordo feature), so
//! `s_reserved_gdt_blocks` is 0. Block bitmaps are always written fully
//! initialized (no `BLOCK_UNINIT`: a group that holds another group's
//! tables must not claim to be uninitialized, and computing which do is
//! not worth the risk); with group checksums, groups without inodes in use
//! are `INODE_UNINIT` with `bg_itable_unused` set, as mke2fs leaves them.
//!
//! The journal's blocks are placed here (near the middle of the file system,
//! in one run when there is room for it); its inode mapping, superblock backup and contents
//! (a clean JBD2 superblock and a zeroed log) come from
//! [`crate::mkfs_journal`], called through [`create_journal`].

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};
use ordo_format::bitmap;
use ordo_format::csum::inode_csum_seed;
use ordo_format::dir::{self, DirBlockLayout};
use ordo_format::features::{compat, feature_by_name, incompat, ro_compat, FeatureSet};
use ordo_format::group::{
    block_bitmap_checksum, inode_bitmap_checksum, GroupDesc, BG_INODE_UNINIT, BG_INODE_ZEROED,
};
use ordo_format::inode::{self, Inode, Timestamp, EXTRA_ISIZE_FULL};
use ordo_format::superblock::{self, Superblock};

use crate::clock::{Clock, SystemClock};
use crate::error::{FsError, Result};
use crate::mkfs_journal;
use crate::random::{entropy_seed, SplitMix64};

/// Features `ordo mkfs` sets by default: mke2fs's ext4 set without
/// `resize_inode` and, until the journal protocol lands, without
/// `has_journal`.
pub const DEFAULT_FEATURES: FeatureSet = FeatureSet {
    compat: compat::EXT_ATTR | compat::DIR_INDEX,
    incompat: incompat::FILETYPE | incompat::EXTENTS | incompat::INCOMPAT_64BIT | incompat::FLEX_BG,
    ro_compat: ro_compat::SPARSE_SUPER
        | ro_compat::LARGE_FILE
        | ro_compat::HUGE_FILE
        | ro_compat::DIR_NLINK
        | ro_compat::EXTRA_ISIZE
        | ro_compat::METADATA_CSUM,
};

/// Features `ordo mkfs` can create, per word.
const MKFS_COMPAT: u32 =
    compat::HAS_JOURNAL | compat::EXT_ATTR | compat::DIR_INDEX | compat::FAST_COMMIT;
const MKFS_INCOMPAT: u32 = incompat::FILETYPE
    | incompat::EXTENTS
    | incompat::INCOMPAT_64BIT
    | incompat::FLEX_BG
    | incompat::CSUM_SEED;
const MKFS_RO_COMPAT: u32 = ro_compat::SPARSE_SUPER
    | ro_compat::LARGE_FILE
    | ro_compat::HUGE_FILE
    | ro_compat::GDT_CSUM
    | ro_compat::DIR_NLINK
    | ro_compat::EXTRA_ISIZE
    | ro_compat::METADATA_CSUM;

/// mke2fs's `EXT2_JOURNAL_TO_FC_BLKS_RATIO`: the fast-commit area is 1/64
/// of the log.
const FC_BLOCKS_RATIO: u32 = 64;

/// Blocks written per device request when zeroing (inode tables, journal).
const ZERO_CHUNK_BLOCKS: u64 = 256;
/// Largest group mkfs makes (mke2fs's `EXT2_MAX_BLOCKS_PER_GROUP`).
const BLOCKS_PER_GROUP_MAX: u32 = 65528;
/// Size of lost+found, as mke2fs makes it (at least two blocks).
const LOST_FOUND_BYTES: u32 = 16 * 1024;
/// Blocks a last group needs beyond its own overhead to be kept (mke2fs's rule).
const LAST_GROUP_MIN_SPARE_BLOCKS: u64 = 50;

/// Options of [`mkfs`].
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// File-system size in bytes; 0 means the whole device. Rounded down to
    /// whole blocks (and may lose a too-small last group).
    pub size_bytes: u64,
    /// Block size in bytes: 1024, 2048 or 4096 (must match the device's).
    pub block_size: u32,
    /// Inode size in bytes: 128 or 256 (or a larger power of two).
    pub inode_size: u16,
    /// Bytes of file system per inode; ignored when `inodes_count` is set.
    pub inode_ratio: u32,
    /// Exact number of inodes wanted (rounded up to fill inode-table blocks).
    pub inodes_count: Option<u32>,
    /// Features to set.
    pub features: FeatureSet,
    /// Volume label (at most 16 bytes).
    pub label: String,
    /// File-system UUID; random when `None` (drawn from `seed`).
    pub uuid: Option<[u8; 16]>,
    /// Directory hash seed; random when `None` (drawn from `seed`).
    pub hash_seed: Option<[u8; 16]>,
    /// Seed of the random source a missing `uuid` and `hash_seed` are
    /// drawn from (in that order, see [`crate::random`]); `None`: from the
    /// operating system. With `time_sec`, enough for byte-identical
    /// images without choosing the UUID by hand.
    pub seed: Option<u64>,
    /// Creation time written everywhere, seconds since the epoch; now when
    /// `None`. Set it (with `uuid` and `hash_seed`) for byte-identical images.
    pub time_sec: Option<u64>,
    /// Percentage of blocks reserved for root (`s_r_blocks_count`), 0..=50.
    pub reserved_percent: u32,
    /// log2 of groups per flex group (with `flex_bg`).
    pub log_groups_per_flex: u8,
    /// Journal size in blocks with `has_journal`; mke2fs's default for the
    /// file-system size when `None`.
    pub journal_blocks: Option<u32>,
    /// The device already reads as zeros (a freshly created sparse image):
    /// skip writing zeroed inode tables. (The journal is always zeroed.)
    pub assume_zeroed: bool,
    /// Blocks per group (mke2fs `-g`): a multiple of 8 from 256 to 8 x the
    /// block size, which is the default. Smaller groups make a small
    /// image several groups (the crash explorer's multi-group images).
    pub blocks_per_group: Option<u32>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size_bytes: 0,
            block_size: 4096,
            inode_size: 256,
            inode_ratio: 16384,
            inodes_count: None,
            features: DEFAULT_FEATURES,
            label: String::new(),
            uuid: None,
            hash_seed: None,
            seed: None,
            time_sec: None,
            reserved_percent: 5,
            log_groups_per_flex: 4,
            journal_blocks: None,
            assume_zeroed: false,
            blocks_per_group: None,
        }
    }
}

/// What [`mkfs`] created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkfsReport {
    pub block_size: u32,
    pub blocks_count: u64,
    pub groups_count: u64,
    pub inodes_count: u32,
    pub inodes_per_group: u32,
    pub free_blocks: u64,
    pub free_inodes: u32,
    pub uuid: [u8; 16],
    pub features: FeatureSet,
    /// Journal size in blocks (0 without a journal).
    pub journal_blocks: u32,
}

/// Parse an `mke2fs -O` list ("a,^b,c") on top of `base`: a name sets the
/// feature, `^name` clears it, `none` clears everything. Unknown names are
/// rejected with a message naming them.
pub fn parse_features(spec: &str, base: FeatureSet) -> Result<FeatureSet> {
    let mut set = base;
    for item in spec
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        let (on, name) = match item.strip_prefix('^') {
            Some(rest) => (false, rest),
            None => (true, item),
        };
        if name.eq_ignore_ascii_case("none") {
            set = FeatureSet::EMPTY;
            continue;
        }
        let f = feature_by_name(name)
            .ok_or_else(|| FsError::Invalid(format!("unknown file-system feature '{name}'")))?;
        set.set(f, on);
    }
    Ok(set)
}

/// Features of `set` that `ordo mkfs` cannot create, by name.
fn unsupported_mkfs_features(set: &FeatureSet) -> Vec<String> {
    let bad = FeatureSet {
        compat: set.compat & !MKFS_COMPAT,
        incompat: set.incompat & !MKFS_INCOMPAT,
        ro_compat: set.ro_compat & !MKFS_RO_COMPAT,
    };
    bad.names()
}

/// Where a group's tables live.
#[derive(Clone, Copy, Debug)]
struct GroupTables {
    block_bitmap: u64,
    inode_bitmap: u64,
    inode_table: u64,
}

/// The whole-device allocation map mkfs builds before writing anything.
struct Planner {
    /// Bit per block, set when used.
    used: Vec<u8>,
    blocks_count: u64,
}

impl Planner {
    fn new(blocks_count: u64) -> Planner {
        Planner {
            used: vec![0u8; blocks_count.div_ceil(8) as usize],
            blocks_count,
        }
    }
    fn mark(&mut self, start: u64, n: u64) {
        for b in start..start + n {
            bitmap::set(&mut self.used, b as usize);
        }
    }
    fn is_used(&self, b: u64) -> bool {
        bitmap::test(&self.used, b as usize)
    }
    /// First run of `n` free blocks in `from..to`.
    fn find_run(&self, from: u64, to: u64, n: u64) -> Option<u64> {
        let to = to.min(self.blocks_count);
        let mut start = from;
        while start + n <= to {
            match (start..start + n).rev().find(|&b| self.is_used(b)) {
                None => return Some(start),
                Some(used) => start = used + 1,
            }
        }
        None
    }
    /// Allocate `n` blocks as maximal free runs, scanning from `hint` and
    /// wrapping around: (logical offset, start, length) in logical order.
    fn alloc_runs(&mut self, hint: u64, n: u64) -> Option<Vec<(u32, u64, u32)>> {
        let mut runs = Vec::new();
        let mut got = 0u64;
        let order = (hint..self.blocks_count).chain(0..hint);
        let mut cur: Option<(u64, u64)> = None;
        for b in order {
            if got == n {
                break;
            }
            let free = !self.is_used(b);
            match (&mut cur, free) {
                (Some((start, len)), true) if *start + *len == b && *len < u64::from(u32::MAX) => {
                    *len += 1;
                    got += 1;
                }
                (_, true) => {
                    if let Some(r) = cur.take() {
                        runs.push(r);
                    }
                    cur = Some((b, 1));
                    got += 1;
                }
                (_, false) => {
                    if let Some(r) = cur.take() {
                        runs.push(r);
                    }
                }
            }
        }
        if let Some(r) = cur {
            runs.push(r);
        }
        if got < n {
            return None;
        }
        let mut out = Vec::with_capacity(runs.len());
        let mut logical = 0u64;
        for (start, len) in runs {
            self.mark(start, len);
            out.push((logical as u32, start, len as u32));
            logical += len;
        }
        Some(out)
    }
    /// Allocate a run of `n` blocks in `from..to`, falling back to the whole
    /// device when `spill` is set.
    fn alloc(&mut self, from: u64, to: u64, n: u64, spill: bool) -> Option<u64> {
        let at = self.find_run(from, to, n).or_else(|| {
            if spill {
                self.find_run(0, self.blocks_count, n)
            } else {
                None
            }
        })?;
        self.mark(at, n);
        Some(at)
    }
}

fn invalid(msg: impl Into<String>) -> FsError {
    FsError::Invalid(msg.into())
}

fn now_sec() -> u64 {
    SystemClock.now().sec.max(0) as u64
}

/// A random (version 4) UUID drawn from `rng`.
fn random_uuid(rng: &mut SplitMix64) -> [u8; 16] {
    let mut u = [0u8; 16];
    rng.fill_bytes(&mut u);
    u[6] = 0x40 | (u[6] & 0x0F);
    u[8] = 0x80 | (u[8] & 0x3F);
    u
}

/// Fill an inode's `i_block` with an extent-tree root (depth 0) mapping
/// logical block 0.. onto the given physical runs (at most four).
fn set_extent_root(i_block: &mut [u8; inode::I_BLOCK_SIZE], runs: &[(u64, u32)]) {
    assert!(runs.len() <= 4, "at most four extents fit in the inode");
    i_block.fill(0);
    i_block[0..2].copy_from_slice(&0xF30Au16.to_le_bytes());
    i_block[2..4].copy_from_slice(&(runs.len() as u16).to_le_bytes());
    i_block[4..6].copy_from_slice(&4u16.to_le_bytes());
    let mut lblk = 0u32;
    for (k, &(start, len)) in runs.iter().enumerate() {
        assert!(
            len > 0 && len <= 32768,
            "initialized extent of {len} blocks"
        );
        let o = 12 + 12 * k;
        i_block[o..o + 4].copy_from_slice(&lblk.to_le_bytes());
        i_block[o + 4..o + 6].copy_from_slice(&(len as u16).to_le_bytes());
        i_block[o + 6..o + 8].copy_from_slice(&((start >> 32) as u16).to_le_bytes());
        i_block[o + 8..o + 12].copy_from_slice(&(start as u32).to_le_bytes());
        lblk += len;
    }
}

/// Point an inode at `n` contiguous blocks from `start`: an extent root
/// with `extent`, direct block pointers otherwise (at most 12 blocks).
fn map_blocks(ino: &mut Inode, start: u64, n: u32, extents: bool) {
    if extents {
        let mut runs = Vec::new();
        let mut left = n;
        let mut at = start;
        while left > 0 {
            let len = left.min(32768);
            runs.push((at, len));
            at += u64::from(len);
            left -= len;
        }
        set_extent_root(&mut ino.block, &runs);
        ino.flags |= inode::flags::EXTENTS;
    } else {
        assert!(n <= 12, "direct blocks only");
        ino.block = [0; inode::I_BLOCK_SIZE];
        for k in 0..n as usize {
            let b = (start + k as u64) as u32;
            ino.block[4 * k..4 * k + 4].copy_from_slice(&b.to_le_bytes());
        }
    }
}

/// Writes blocks through the device, counting bytes for `s_kbytes_written`.
struct Writer<'a> {
    dev: &'a dyn BlockDevice,
    bytes_written: u64,
    block_size: u64,
}

impl Writer<'_> {
    fn write(&mut self, block: u64, data: &[u8], class: BlockClass) -> Result<()> {
        debug_assert_eq!(data.len() as u64 % self.block_size, 0);
        self.dev.write(block, data, WriteFlags::new(class))?;
        self.bytes_written += data.len() as u64;
        Ok(())
    }
    fn zero(&mut self, start: u64, n: u64, class: BlockClass) -> Result<()> {
        let chunk = vec![0u8; (ZERO_CHUNK_BLOCKS * self.block_size) as usize];
        let mut at = start;
        while at < start + n {
            let k = (start + n - at).min(ZERO_CHUNK_BLOCKS);
            self.write(at, &chunk[..(k * self.block_size) as usize], class)?;
            at += k;
        }
        Ok(())
    }
}

/// Lay out a fresh file system on `dev`. Overwrites the device's metadata
/// areas; data blocks are left as they are (they are free).
pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<MkfsReport> {
    let bs = opts.block_size;
    if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(invalid(format!(
            "block size {bs}: must be a power of two in 1024..=65536"
        )));
    }
    if dev.block_size() != bs {
        return Err(invalid(format!(
            "device block size {} differs from file-system block size {bs}",
            dev.block_size()
        )));
    }
    let isz = opts.inode_size;
    if isz < 128 || !isz.is_power_of_two() || u32::from(isz) > bs {
        return Err(invalid(format!(
            "inode size {isz}: must be a power of two in 128..={bs}"
        )));
    }
    if opts.reserved_percent > 50 {
        return Err(invalid(format!(
            "reserved blocks {}%: at most 50",
            opts.reserved_percent
        )));
    }
    if opts.label.len() > 16 {
        return Err(invalid(format!(
            "label '{}' is longer than 16 bytes",
            opts.label
        )));
    }
    let mut features = opts.features;
    let bad = unsupported_mkfs_features(&features);
    if !bad.is_empty() {
        return Err(FsError::Unsupported(format!(
            "ordo mkfs cannot create: {}",
            bad.join(", ")
        )));
    }
    if features.has_ro_compat(ro_compat::METADATA_CSUM) {
        // metadata_csum supersedes uninit_bg, as in mke2fs.
        features.ro_compat &= !ro_compat::GDT_CSUM;
    } else if features.has_incompat(incompat::CSUM_SEED) {
        return Err(invalid("metadata_csum_seed needs metadata_csum"));
    }
    if isz == 128 {
        features.ro_compat &= !ro_compat::EXTRA_ISIZE;
    }
    let is64 = features.has_incompat(incompat::INCOMPAT_64BIT);
    let extents = features.has_incompat(incompat::EXTENTS);
    if is64 && !extents {
        return Err(invalid("64bit needs extent"));
    }

    // ----- geometry -----
    let dev_blocks = dev.block_count();
    let mut blocks = if opts.size_bytes == 0 {
        dev_blocks
    } else {
        opts.size_bytes / u64::from(bs)
    };
    if blocks > dev_blocks {
        return Err(invalid(format!(
            "file system of {blocks} blocks does not fit the device ({dev_blocks} blocks)"
        )));
    }
    if !is64 && blocks > u64::from(u32::MAX) {
        return Err(invalid(format!("{blocks} blocks need the 64bit feature")));
    }
    if blocks >= 1 << 48 {
        return Err(invalid(format!("{blocks} blocks: over 2^48")));
    }
    let first_data_block: u32 = if bs == 1024 { 1 } else { 0 };
    // One bitmap block per group, and group counts fit 16-bit descriptor
    // fields (mke2fs's EXT2_MAX_BLOCKS_PER_GROUP).
    let bpg_max = (8 * bs).min(BLOCKS_PER_GROUP_MAX);
    let bpg = match opts.blocks_per_group {
        None => bpg_max,
        Some(g) if g % 8 == 0 && (256..=bpg_max).contains(&g) => g,
        Some(g) => {
            return Err(invalid(format!(
                "blocks per group {g}: must be a multiple of 8 from 256 to {bpg_max}"
            )))
        }
    };
    let desc_size: u16 = if is64 { 64 } else { 32 };
    let ipb = bs / u32::from(isz);
    let time = opts.time_sec.unwrap_or_else(now_sec);
    let mut rng = SplitMix64::new(opts.seed.unwrap_or_else(entropy_seed));
    let uuid = opts.uuid.unwrap_or_else(|| random_uuid(&mut rng));

    let mut sb = Superblock::blank();
    sb.log_block_size = bs.trailing_zeros() - 10;
    sb.log_cluster_size = sb.log_block_size;
    sb.blocks_per_group = bpg;
    sb.clusters_per_group = bpg;
    sb.first_data_block = first_data_block;
    sb.inode_size = isz;
    sb.features = features;
    sb.desc_size_raw = if is64 { desc_size } else { 0 };
    sb.log_groups_per_flex = if features.has_incompat(incompat::FLEX_BG) {
        opts.log_groups_per_flex
    } else {
        0
    };

    // Groups and inodes per group, dropping a last group too small to be
    // worth its overhead (mke2fs's rule); a trimmed size changes both.
    let (groups, ipg) = loop {
        if blocks <= u64::from(first_data_block) {
            return Err(invalid("device too small for one block group"));
        }
        sb.blocks_count = blocks;
        let groups = (blocks - u64::from(first_data_block)).div_ceil(u64::from(bpg));
        let wanted_inodes = match opts.inodes_count {
            Some(n) => u64::from(n),
            None => blocks * u64::from(bs) / u64::from(opts.inode_ratio.max(1024)),
        };
        let mut ipg = wanted_inodes.div_ceil(groups).max(16);
        let round = u64::from(ipb.max(8));
        ipg = ipg.div_ceil(round) * round;
        // mke2fs's EXT2_MAX_INODES_PER_GROUP.
        let ipg_max = u64::from(8 * bs).min(65536 - round);
        ipg = ipg.min(ipg_max);
        if groups * ipg > u64::from(u32::MAX) {
            return Err(invalid(format!("{} inodes: over 2^32", groups * ipg)));
        }
        sb.inodes_per_group = ipg as u32;
        sb.inodes_count = (groups * ipg) as u32;
        let itb = u64::from(sb.inode_table_blocks());
        let last = groups - 1;
        let rem = (blocks - u64::from(first_data_block)) % u64::from(bpg);
        let overhead = 2
            + itb
            + if sb.has_super(last) {
                1 + sb.gdt_blocks()
            } else {
                0
            };
        if groups > 1 && rem != 0 && rem < overhead + LAST_GROUP_MIN_SPARE_BLOCKS {
            blocks -= rem;
            continue;
        }
        if groups == 1 && blocks - u64::from(first_data_block) < overhead + 16 {
            return Err(invalid(format!(
                "{blocks} blocks is too small for a file system"
            )));
        }
        break (groups, ipg as u32);
    };
    let itb = u64::from(sb.inode_table_blocks());
    let gdt_blocks = sb.gdt_blocks();

    // ----- plan every block -----
    let mut plan = Planner::new(blocks);
    plan.mark(0, u64::from(first_data_block) + 1); // boot block and primary superblock
    plan.mark(u64::from(first_data_block) + 1, gdt_blocks);
    for g in 1..groups {
        if sb.has_super(g) {
            plan.mark(sb.group_first_block(g), 1 + gdt_blocks);
        }
    }
    let mut tables = vec![
        GroupTables {
            block_bitmap: 0,
            inode_bitmap: 0,
            inode_table: 0,
        };
        groups as usize
    ];
    let no_room = |what: &str, g: u64| invalid(format!("no room for the {what} of group {g}"));
    if sb.has_flex_bg() {
        let per_flex = sb.groups_per_flex();
        for f0 in (0..groups).step_by(per_flex as usize) {
            let f1 = (f0 + per_flex).min(groups);
            let n = f1 - f0;
            let hint = sb.group_first_block(f0);
            let bb = plan
                .alloc(hint, blocks, n, true)
                .ok_or_else(|| no_room("block bitmaps", f0))?;
            let ib = plan
                .alloc(bb + n, blocks, n, true)
                .ok_or_else(|| no_room("inode bitmaps", f0))?;
            let mut it_hint = ib + n;
            for (k, g) in (f0..f1).enumerate() {
                let it = plan
                    .alloc(it_hint, blocks, itb, true)
                    .ok_or_else(|| no_room("inode table", g))?;
                it_hint = it + itb;
                tables[g as usize] = GroupTables {
                    block_bitmap: bb + k as u64,
                    inode_bitmap: ib + k as u64,
                    inode_table: it,
                };
            }
        }
    } else {
        for g in 0..groups {
            let start = sb.group_first_block(g);
            let end = start + u64::from(sb.blocks_in_group(g));
            let bb = plan
                .alloc(start, end, 1, false)
                .ok_or_else(|| no_room("block bitmap", g))?;
            let ib = plan
                .alloc(start, end, 1, false)
                .ok_or_else(|| no_room("inode bitmap", g))?;
            let it = plan
                .alloc(start, end, itb, false)
                .ok_or_else(|| no_room("inode table", g))?;
            tables[g as usize] = GroupTables {
                block_bitmap: bb,
                inode_bitmap: ib,
                inode_table: it,
            };
        }
    }
    let data_hint = tables[0].inode_table + itb;
    let root_block = plan
        .alloc(data_hint, blocks, 1, true)
        .ok_or_else(|| no_room("root directory", 0))?;
    let lf_blocks = (LOST_FOUND_BYTES / bs)
        .max(2)
        .min(if extents { u32::MAX } else { 12 });
    let lf_start = plan
        .alloc(root_block + 1, blocks, u64::from(lf_blocks), true)
        .ok_or_else(|| no_room("lost+found directory", 0))?;

    let journal = if features.has_compat(compat::HAS_JOURNAL) {
        let jb = match opts.journal_blocks {
            Some(n) => n,
            None => mkfs_journal::default_journal_blocks(blocks)
                .ok_or_else(|| invalid(format!("{blocks} blocks is too small for a journal")))?,
        };
        if jb < mkfs_journal::MIN_JOURNAL_BLOCKS || u64::from(jb) > blocks / 2 {
            return Err(invalid(format!(
                "journal of {jb} blocks: must be at least {} and at most half the file system",
                mkfs_journal::MIN_JOURNAL_BLOCKS
            )));
        }
        if !extents {
            return Err(invalid("has_journal needs extent in ordo mkfs"));
        }
        // fast_commit: mke2fs adds a fast-commit area of 1/64 of the log
        // after it (create_journal records its size).
        let jb = if features.has_compat(compat::FAST_COMMIT) {
            jb + jb / FC_BLOCKS_RATIO
        } else {
            jb
        };
        // Middle of the file system, like mke2fs: away from the hot metadata.
        // One run when there is room for it, else as few runs as the free
        // space between backups and flex tables allows.
        let hint = sb.group_first_block(groups / 2);
        let runs = match plan.alloc(hint, blocks, u64::from(jb), true) {
            Some(start) => vec![(0u32, start, jb)],
            None => plan
                .alloc_runs(hint, u64::from(jb))
                .ok_or_else(|| invalid(format!("no room for a {jb}-block journal")))?,
        };
        let leaf = if mkfs_journal::needs_leaf_block(&runs) {
            let after = runs.last().map_or(hint, |r| r.1 + u64::from(r.2));
            Some(
                plan.alloc(after, blocks, 1, true)
                    .ok_or_else(|| no_room("journal extent leaf", groups / 2))?,
            )
        } else {
            None
        };
        let ji = mkfs_journal::journal_inode(bs, &runs, leaf)?;
        Some((runs, ji))
    } else {
        None
    };

    // ----- superblock fields -----
    sb.r_blocks_count = blocks * u64::from(opts.reserved_percent) / 100;
    sb.wtime = time;
    sb.lastcheck = time;
    sb.mkfs_time = time;
    sb.max_mnt_count = -1;
    sb.state = superblock::STATE_VALID;
    sb.errors = superblock::ERRORS_CONTINUE;
    sb.creator_os = superblock::OS_LINUX;
    sb.rev_level = superblock::REV_DYNAMIC;
    sb.first_ino = superblock::GOOD_OLD_FIRST_INO;
    sb.uuid = uuid;
    sb.volume_name = [0; 16];
    sb.volume_name[..opts.label.len()].copy_from_slice(opts.label.as_bytes());
    let hs = opts.hash_seed.unwrap_or_else(|| random_uuid(&mut rng));
    for (k, w) in sb.hash_seed.iter_mut().enumerate() {
        *w = u32::from_le_bytes(hs[4 * k..4 * k + 4].try_into().expect("4 bytes"));
    }
    sb.def_hash_version = superblock::HASH_HALF_MD4;
    sb.flags = if std::ffi::c_char::MIN == 0 {
        superblock::FLAGS_UNSIGNED_HASH
    } else {
        superblock::FLAGS_SIGNED_HASH
    };
    if isz > 128 {
        sb.min_extra_isize = EXTRA_ISIZE_FULL;
        sb.want_extra_isize = EXTRA_ISIZE_FULL;
    }
    if sb.has_metadata_csum() {
        sb.checksum_type = superblock::CHECKSUM_TYPE_CRC32C;
    }
    if features.has_incompat(incompat::CSUM_SEED) {
        sb.checksum_seed = ordo_format::csum::fs_csum_seed(&uuid);
    }
    let csum_seed = sb.metadata_csum_seed();
    let has_group_csum = sb.has_group_csum();
    let extra_isize = if isz > 128 { EXTRA_ISIZE_FULL } else { 0 };
    let ts = Timestamp {
        sec: time as i64,
        nsec: 0,
    };
    let mut w = Writer {
        dev,
        bytes_written: 0,
        block_size: u64::from(bs),
    };

    // ----- inodes -----
    let new_inode = |m: u16| {
        let mut i = Inode::new(isz, extra_isize);
        i.mode = m;
        i.atime = ts;
        i.ctime = ts;
        i.mtime = ts;
        i.crtime = ts;
        i
    };
    let sectors_per_block = u64::from(bs / 512);
    let mut root = new_inode(inode::mode::S_IFDIR | 0o755);
    root.links_count = 3;
    root.size = u64::from(bs);
    root.blocks = sectors_per_block;
    map_blocks(&mut root, root_block, 1, extents);
    let mut lf = new_inode(inode::mode::S_IFDIR | 0o700);
    lf.links_count = 2;
    lf.size = u64::from(lf_blocks) * u64::from(bs);
    lf.blocks = u64::from(lf_blocks) * sectors_per_block;
    map_blocks(&mut lf, lf_start, lf_blocks, extents);
    let mut jnl_inode = None;
    if let Some((_, ji)) = &journal {
        let mut j = new_inode(inode::mode::S_IFREG | 0o600);
        j.links_count = 1;
        j.size = ji.size_bytes;
        j.blocks = ji.fs_blocks * sectors_per_block;
        j.block = ji.i_block;
        j.flags |= inode::flags::EXTENTS;
        sb.journal_inum = inode::JOURNAL_INO;
        sb.jnl_backup_type = mkfs_journal::JNL_BACKUP_BLOCKS;
        sb.jnl_blocks = ji.jnl_blocks;
        jnl_inode = Some(j);
    }

    // Group 0's inode table head: inodes 1..=11.
    let head_bytes = (11 * usize::from(isz)).div_ceil(bs as usize) * bs as usize;
    let mut itable_head = vec![0u8; head_bytes];
    for ino in 1..=11u32 {
        let i = match ino {
            inode::ROOT_INO => root.clone(),
            inode::LOST_AND_FOUND_INO => lf.clone(),
            inode::JOURNAL_INO if jnl_inode.is_some() => jnl_inode.clone().expect("journal inode"),
            // Reserved inodes: zero, with the extra size set, as mke2fs
            // writes them.
            _ => Inode::new(isz, extra_isize),
        };
        let at = (ino as usize - 1) * usize::from(isz);
        let slot = &mut itable_head[at..at + usize::from(isz)];
        slot.copy_from_slice(&i.encode(csum_seed.map(|s| (s, ino))));
    }

    // ----- directories -----
    let layout = DirBlockLayout {
        block_size: bs as usize,
        has_tail: sb.has_metadata_csum(),
    };
    let filetype = sb.has_filetype();
    let mut root_dir = vec![0u8; bs as usize];
    dir::init_dot_dotdot(
        &mut root_dir,
        layout,
        inode::ROOT_INO,
        inode::ROOT_INO,
        filetype,
    );
    dir::insert(
        &mut root_dir,
        layout,
        inode::LOST_AND_FOUND_INO,
        b"lost+found",
        if filetype { dir::ft::DIR } else { 0 },
    )?
    .ok_or_else(|| invalid("root directory block has no room for lost+found"))?;
    let mut lf_dir = vec![0u8; lf_blocks as usize * bs as usize];
    for (k, blk) in lf_dir.chunks_mut(bs as usize).enumerate() {
        if k == 0 {
            dir::init_dot_dotdot(
                blk,
                layout,
                inode::LOST_AND_FOUND_INO,
                inode::ROOT_INO,
                filetype,
            );
        } else {
            dir::init_empty(blk, layout);
        }
    }
    if let Some(seed) = csum_seed {
        dir::set_dirent_tail_checksum(&mut root_dir, inode_csum_seed(seed, inode::ROOT_INO, 0));
        let s = inode_csum_seed(seed, inode::LOST_AND_FOUND_INO, 0);
        for blk in lf_dir.chunks_mut(bs as usize) {
            dir::set_dirent_tail_checksum(blk, s);
        }
    }

    // ----- bitmaps, inode tables and descriptors, one group at a time -----
    // Each group's bitmaps are built, checksummed and written before the
    // next, so memory stays at one block per bitmap whatever the size.
    let mut descs = Vec::with_capacity(groups as usize);
    let mut free_blocks_total = 0u64;
    let mut free_inodes_total = 0u64;
    let head_blocks = (head_bytes / bs as usize) as u64;
    for g in 0..groups {
        let t = tables[g as usize];
        let first = sb.group_first_block(g);
        let n = u64::from(sb.blocks_in_group(g));
        let mut bb = vec![0u8; bs as usize];
        for k in 0..n {
            if plan.is_used(first + k) {
                bitmap::set(&mut bb, k as usize);
            }
        }
        bitmap::set_range(&mut bb, n as usize, 8 * bs as usize);
        let free_blocks = bitmap::count_zero(&bb, 0, n as usize) as u32;
        let used_inodes = if g == 0 { 11 } else { 0 };
        let mut ib = vec![0u8; bs as usize];
        bitmap::set_range(&mut ib, 0, used_inodes);
        bitmap::set_range(&mut ib, ipg as usize, 8 * bs as usize);
        let mut d = GroupDesc {
            block_bitmap: t.block_bitmap,
            inode_bitmap: t.inode_bitmap,
            inode_table: t.inode_table,
            free_blocks_count: free_blocks,
            free_inodes_count: ipg - used_inodes as u32,
            used_dirs_count: if g == 0 { 2 } else { 0 },
            ..GroupDesc::default()
        };
        if has_group_csum {
            d.flags = BG_INODE_ZEROED;
            d.itable_unused = ipg - used_inodes as u32;
            if used_inodes == 0 {
                d.flags |= BG_INODE_UNINIT;
            }
        }
        if let Some(seed) = csum_seed {
            d.block_bitmap_csum = block_bitmap_checksum(seed, &bb, sb.clusters_per_group);
            d.inode_bitmap_csum = inode_bitmap_checksum(seed, &ib, ipg);
        }
        free_blocks_total += u64::from(free_blocks);
        free_inodes_total += u64::from(d.free_inodes_count);
        descs.push(d);
        w.write(t.block_bitmap, &bb, BlockClass::GroupMeta)?;
        w.write(t.inode_bitmap, &ib, BlockClass::GroupMeta)?;
        if g == 0 {
            w.write(t.inode_table, &itable_head, BlockClass::InodeTable)?;
            if !opts.assume_zeroed {
                w.zero(
                    t.inode_table + head_blocks,
                    itb - head_blocks,
                    BlockClass::InodeTable,
                )?;
            }
        } else if !opts.assume_zeroed {
            w.zero(t.inode_table, itb, BlockClass::InodeTable)?;
        }
    }
    sb.free_blocks_count = free_blocks_total;
    sb.free_inodes_count = free_inodes_total as u32;
    let gcsum = sb.group_csum();
    let mut gdt = vec![0u8; (gdt_blocks * u64::from(bs)) as usize];
    for (g, d) in descs.iter().enumerate() {
        let ds = usize::from(desc_size);
        d.encode_into(&mut gdt[g * ds..(g + 1) * ds], g as u32, gcsum);
    }

    w.write(root_block, &root_dir, BlockClass::Directory)?;
    w.write(lf_start, &lf_dir, BlockClass::Directory)?;
    if let Some((runs, ji)) = &journal {
        create_journal(&mut w, &sb, runs, ji)?;
    }
    for g in 1..groups {
        if sb.has_super(g) {
            let first = sb.group_first_block(g);
            let mut blk = vec![0u8; bs as usize];
            blk[..1024].copy_from_slice(&sb.encode_for_group(g as u32));
            w.write(first, &blk, BlockClass::Super)?;
            w.write(first + 1, &gdt, BlockClass::GroupMeta)?;
        }
    }
    w.write(u64::from(first_data_block) + 1, &gdt, BlockClass::GroupMeta)?;
    dev.flush()?;
    // The primary superblock last, once everything it describes is durable.
    let mut blk0 = vec![0u8; bs as usize];
    let sb_block = u64::from(first_data_block);
    let sb_off = ordo_format::superblock::super_offset(bs);
    w.bytes_written += u64::from(bs);
    sb.kbytes_written = w.bytes_written.div_ceil(1024);
    blk0[sb_off..sb_off + 1024].copy_from_slice(&sb.encode_for_group(0));
    w.write(sb_block, &blk0, BlockClass::Super)?;
    dev.flush()?;

    Ok(MkfsReport {
        block_size: bs,
        blocks_count: blocks,
        groups_count: groups,
        inodes_count: sb.inodes_count,
        inodes_per_group: ipg,
        free_blocks: sb.free_blocks_count,
        free_inodes: sb.free_inodes_count,
        uuid,
        features: sb.features,
        journal_blocks: journal
            .as_ref()
            .map_or(0, |(runs, _)| runs.iter().map(|r| r.2).sum()),
    })
}

/// Write the contents of a fresh internal journal on `runs` (inode 8 and
/// the superblock's backup of its mapping are mkfs's job): the extent leaf
/// when the mapping needs one, then the clean JBD2 superblock and zeroed
/// log of [`mkfs_journal::write_journal`].
fn create_journal(
    w: &mut Writer<'_>,
    sb: &Superblock,
    runs: &[(u32, u64, u32)],
    ji: &mkfs_journal::JournalInode,
) -> Result<()> {
    if let Some((leaf_block, img)) = &ji.leaf {
        let mut img = img.clone();
        if let Some(seed) = sb.metadata_csum_seed() {
            mkfs_journal::seal_leaf(&mut img, seed, 0);
        }
        w.write(*leaf_block, &img, BlockClass::ExtentTree)?;
    }
    let jsb = mkfs_journal::write_journal(w.dev, runs, sb.uuid)?;
    let journal_blocks: u64 = runs.iter().map(|r| u64::from(r.2)).sum();
    if sb.features.has_compat(compat::FAST_COMMIT) {
        // s_num_fc_blks: the log of `log` blocks got `log / 64` more.
        let total = journal_blocks as u32;
        let log = (total * FC_BLOCKS_RATIO / (FC_BLOCKS_RATIO + 1)..=total)
            .find(|j| j + j / FC_BLOCKS_RATIO == total)
            .unwrap_or(total);
        let mut jsb = jsb;
        jsb.num_fc_blocks = total - log;
        let p = mkfs_journal::journal_extents(runs)
            .iter()
            .find(|e| e.0 == 0)
            .map(|e| e.1)
            .ok_or_else(|| invalid("journal block 0 is not mapped"))?;
        w.write(p, &jsb.encode(), BlockClass::Journal)?;
    }
    w.bytes_written += journal_blocks * w.block_size;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_features_sets_and_clears() {
        let f = parse_features("^metadata_csum,uninit_bg, ^flex_bg", DEFAULT_FEATURES).unwrap();
        assert!(!f.has_ro_compat(ro_compat::METADATA_CSUM));
        assert!(f.has_ro_compat(ro_compat::GDT_CSUM));
        assert!(!f.has_incompat(incompat::FLEX_BG));
        assert!(f.has_incompat(incompat::EXTENTS));
        let e = parse_features("extents,bogus", DEFAULT_FEATURES).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let f = parse_features("none,filetype", DEFAULT_FEATURES).unwrap();
        assert_eq!(f.incompat, incompat::FILETYPE);
        assert_eq!(f.compat | f.ro_compat, 0);
    }

    #[test]
    fn unsupported_features_are_named() {
        let f = parse_features("inline_data,resize_inode", DEFAULT_FEATURES).unwrap();
        let bad = unsupported_mkfs_features(&f);
        assert_eq!(bad, vec!["resize_inode", "inline_data"]);
    }

    #[test]
    fn extent_root_layout() {
        let mut b = [0u8; inode::I_BLOCK_SIZE];
        set_extent_root(&mut b, &[(0x1_0000_0005, 3)]);
        assert_eq!(&b[0..8], &[0x0A, 0xF3, 1, 0, 4, 0, 0, 0]);
        assert_eq!(&b[12..24], &[0, 0, 0, 0, 3, 0, 1, 0, 5, 0, 0, 0]);
    }
}
