//! The ext4 superblock (1024 bytes at byte offset 1024 of the device, with
//! backups at the start of some groups).
//!
//! Decoding keeps the raw 1024 bytes and encoding patches the fields ordo
//! knows back into them, so every field ordo does not understand (error
//! records, mount options, encryption salts, fields added by kernels newer
//! than this code) survives a read-modify-write bit for bit. The checksum
//! (`metadata_csum`) is crc32c over bytes 0..0x3FC, stored at 0x3FC.

use crate::csum::{ext4_crc32c, fs_csum_seed};
use crate::features::{compat, incompat, ro_compat, FeatureSet};
use crate::le::*;
use crate::{FormatError, Result};

/// Size of the superblock in bytes.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// Byte offset of the primary superblock on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// `s_magic`.
pub const EXT4_MAGIC: u16 = 0xEF53;
/// `s_state` bit: cleanly unmounted.
pub const STATE_VALID: u16 = 0x0001;
/// `s_state` bit: errors detected.
pub const STATE_ERROR: u16 = 0x0002;
/// `s_state` bit: orphans being recovered.
pub const STATE_ORPHAN: u16 = 0x0004;
/// `s_errors`: continue on errors.
pub const ERRORS_CONTINUE: u16 = 1;
/// `s_errors`: remount read-only on errors.
pub const ERRORS_RO: u16 = 2;
/// `s_errors`: panic on errors.
pub const ERRORS_PANIC: u16 = 3;
/// `s_rev_level` of dynamic-inode-size file systems.
pub const REV_DYNAMIC: u32 = 1;
/// `s_checksum_type` for crc32c.
pub const CHECKSUM_TYPE_CRC32C: u8 = 1;
/// `s_def_hash_version` values.
pub const HASH_LEGACY: u8 = 0;
pub const HASH_HALF_MD4: u8 = 1;
pub const HASH_TEA: u8 = 2;
/// `s_flags`: directory hashes use unsigned chars.
pub const FLAGS_UNSIGNED_HASH: u32 = 0x0002;
/// `s_flags`: directory hashes use signed chars.
pub const FLAGS_SIGNED_HASH: u32 = 0x0001;
/// `s_creator_os` Linux.
pub const OS_LINUX: u32 = 0;
/// `s_jnl_backup_type`: `s_jnl_blocks` holds a copy of the journal inode's i_block.
pub const JNL_BACKUP_BLOCKS: u8 = 1;
/// The first inode number of a revision-0 file system and the minimum `s_first_ino`.
pub const GOOD_OLD_FIRST_INO: u32 = 11;
/// Inode size of a revision-0 file system.
pub const GOOD_OLD_INODE_SIZE: u16 = 128;
/// Group descriptor size without `64bit`.
pub const MIN_DESC_SIZE: u16 = 32;
/// Minimum group descriptor size with `64bit`.
pub const MIN_DESC_SIZE_64BIT: u16 = 64;

/// Field offsets, named as in the kernel's `struct ext4_super_block`.
#[allow(missing_docs)]
pub mod off {
    pub const INODES_COUNT: usize = 0x00;
    pub const BLOCKS_COUNT_LO: usize = 0x04;
    pub const R_BLOCKS_COUNT_LO: usize = 0x08;
    pub const FREE_BLOCKS_COUNT_LO: usize = 0x0C;
    pub const FREE_INODES_COUNT: usize = 0x10;
    pub const FIRST_DATA_BLOCK: usize = 0x14;
    pub const LOG_BLOCK_SIZE: usize = 0x18;
    pub const LOG_CLUSTER_SIZE: usize = 0x1C;
    pub const BLOCKS_PER_GROUP: usize = 0x20;
    pub const CLUSTERS_PER_GROUP: usize = 0x24;
    pub const INODES_PER_GROUP: usize = 0x28;
    pub const MTIME: usize = 0x2C;
    pub const WTIME: usize = 0x30;
    pub const MNT_COUNT: usize = 0x34;
    pub const MAX_MNT_COUNT: usize = 0x36;
    pub const MAGIC: usize = 0x38;
    pub const STATE: usize = 0x3A;
    pub const ERRORS: usize = 0x3C;
    pub const MINOR_REV_LEVEL: usize = 0x3E;
    pub const LASTCHECK: usize = 0x40;
    pub const CHECKINTERVAL: usize = 0x44;
    pub const CREATOR_OS: usize = 0x48;
    pub const REV_LEVEL: usize = 0x4C;
    pub const DEF_RESUID: usize = 0x50;
    pub const DEF_RESGID: usize = 0x52;
    pub const FIRST_INO: usize = 0x54;
    pub const INODE_SIZE: usize = 0x58;
    pub const BLOCK_GROUP_NR: usize = 0x5A;
    pub const FEATURE_COMPAT: usize = 0x5C;
    pub const FEATURE_INCOMPAT: usize = 0x60;
    pub const FEATURE_RO_COMPAT: usize = 0x64;
    pub const UUID: usize = 0x68;
    pub const VOLUME_NAME: usize = 0x78;
    pub const LAST_MOUNTED: usize = 0x88;
    pub const ALGORITHM_USAGE_BITMAP: usize = 0xC8;
    pub const PREALLOC_BLOCKS: usize = 0xCC;
    pub const PREALLOC_DIR_BLOCKS: usize = 0xCD;
    pub const RESERVED_GDT_BLOCKS: usize = 0xCE;
    pub const JOURNAL_UUID: usize = 0xD0;
    pub const JOURNAL_INUM: usize = 0xE0;
    pub const JOURNAL_DEV: usize = 0xE4;
    pub const LAST_ORPHAN: usize = 0xE8;
    pub const HASH_SEED: usize = 0xEC;
    pub const DEF_HASH_VERSION: usize = 0xFC;
    pub const JNL_BACKUP_TYPE: usize = 0xFD;
    pub const DESC_SIZE: usize = 0xFE;
    pub const DEFAULT_MOUNT_OPTS: usize = 0x100;
    pub const FIRST_META_BG: usize = 0x104;
    pub const MKFS_TIME: usize = 0x108;
    pub const JNL_BLOCKS: usize = 0x10C;
    pub const BLOCKS_COUNT_HI: usize = 0x150;
    pub const R_BLOCKS_COUNT_HI: usize = 0x154;
    pub const FREE_BLOCKS_COUNT_HI: usize = 0x158;
    pub const MIN_EXTRA_ISIZE: usize = 0x15C;
    pub const WANT_EXTRA_ISIZE: usize = 0x15E;
    pub const FLAGS: usize = 0x160;
    pub const RAID_STRIDE: usize = 0x164;
    pub const MMP_INTERVAL: usize = 0x166;
    pub const MMP_BLOCK: usize = 0x168;
    pub const RAID_STRIPE_WIDTH: usize = 0x170;
    pub const LOG_GROUPS_PER_FLEX: usize = 0x174;
    pub const CHECKSUM_TYPE: usize = 0x175;
    pub const ENCRYPTION_LEVEL: usize = 0x176;
    pub const KBYTES_WRITTEN: usize = 0x178;
    pub const SNAPSHOT_INUM: usize = 0x180;
    pub const ERROR_COUNT: usize = 0x194;
    pub const FIRST_ERROR_TIME: usize = 0x198;
    pub const LAST_ERROR_TIME: usize = 0x1CC;
    pub const MOUNT_OPTS: usize = 0x200;
    pub const USR_QUOTA_INUM: usize = 0x240;
    pub const GRP_QUOTA_INUM: usize = 0x244;
    pub const OVERHEAD_CLUSTERS: usize = 0x248;
    pub const BACKUP_BGS: usize = 0x24C;
    pub const ENCRYPT_ALGOS: usize = 0x254;
    pub const LPF_INO: usize = 0x268;
    pub const PRJ_QUOTA_INUM: usize = 0x26C;
    pub const CHECKSUM_SEED: usize = 0x270;
    pub const WTIME_HI: usize = 0x274;
    pub const MTIME_HI: usize = 0x275;
    pub const MKFS_TIME_HI: usize = 0x276;
    pub const LASTCHECK_HI: usize = 0x277;
    pub const ENCODING: usize = 0x27C;
    pub const ENCODING_FLAGS: usize = 0x27E;
    pub const ORPHAN_FILE_INUM: usize = 0x280;
    pub const CHECKSUM: usize = 0x3FC;
}

/// How group descriptors are checksummed on this file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupCsum {
    /// Neither `metadata_csum` nor `uninit_bg`: `bg_checksum` is unused (0).
    None,
    /// `uninit_bg` (gdt_csum): crc16 over uuid, group number and descriptor.
    Crc16 {
        /// The file system's `s_uuid`.
        uuid: [u8; 16],
    },
    /// `metadata_csum`: low 16 bits of crc32c(seed, group, descriptor).
    Crc32c {
        /// The file system's checksum seed.
        seed: u32,
    },
}

/// The decoded superblock. Public fields are the ones ordo uses; edit them
/// and call [`Superblock::encode`]. Everything else lives on in the raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    raw: Box<[u8; SUPERBLOCK_SIZE]>,

    pub inodes_count: u32,
    /// 64-bit when `64bit` is set (lo + hi), else the lo word.
    pub blocks_count: u64,
    pub r_blocks_count: u64,
    pub free_blocks_count: u64,
    pub free_inodes_count: u32,
    pub first_data_block: u32,
    pub log_block_size: u32,
    pub log_cluster_size: u32,
    pub blocks_per_group: u32,
    pub clusters_per_group: u32,
    pub inodes_per_group: u32,
    /// Last mount time, seconds (40 bits with `s_mtime_hi`).
    pub mtime: u64,
    /// Last write time, seconds.
    pub wtime: u64,
    pub mnt_count: u16,
    pub max_mnt_count: i16,
    pub state: u16,
    pub errors: u16,
    pub minor_rev_level: u16,
    /// Last fsck time, seconds.
    pub lastcheck: u64,
    pub checkinterval: u32,
    pub creator_os: u32,
    pub rev_level: u32,
    pub def_resuid: u16,
    pub def_resgid: u16,
    pub first_ino: u32,
    pub inode_size: u16,
    /// Group this copy lives in (0 for the primary; set per backup).
    pub block_group_nr: u16,
    pub features: FeatureSet,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub last_mounted: [u8; 64],
    pub reserved_gdt_blocks: u16,
    pub journal_uuid: [u8; 16],
    pub journal_inum: u32,
    pub journal_dev: u32,
    /// Head of the orphan inode list (`s_last_orphan`).
    pub last_orphan: u32,
    pub hash_seed: [u32; 4],
    pub def_hash_version: u8,
    pub jnl_backup_type: u8,
    /// As stored; see [`Superblock::desc_size`] for the effective size.
    pub desc_size_raw: u16,
    pub default_mount_opts: u32,
    pub first_meta_bg: u32,
    /// File system creation time, seconds.
    pub mkfs_time: u64,
    /// Backup of the journal inode's i_block (15 words), i_size_high, i_size.
    pub jnl_blocks: [u32; 17],
    pub min_extra_isize: u16,
    pub want_extra_isize: u16,
    pub flags: u32,
    pub raid_stride: u16,
    pub mmp_interval: u16,
    pub mmp_block: u64,
    pub raid_stripe_width: u32,
    pub log_groups_per_flex: u8,
    pub checksum_type: u8,
    /// KiB written over the file system's lifetime.
    pub kbytes_written: u64,
    pub error_count: u32,
    pub usr_quota_inum: u32,
    pub grp_quota_inum: u32,
    pub prj_quota_inum: u32,
    pub overhead_clusters: u32,
    /// Groups holding backups with `sparse_super2` (0 = none).
    pub backup_bgs: [u32; 2],
    pub lpf_ino: u32,
    /// Used instead of crc32c(uuid) when `metadata_csum_seed` is set.
    pub checksum_seed: u32,
    pub encoding: u16,
    pub encoding_flags: u16,
    pub orphan_file_inum: u32,
    /// `s_checksum` as read (encode recomputes it).
    pub checksum: u32,
}

fn bad(field: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::new(field, detail)
}

impl Superblock {
    /// Decode and validate a superblock image (at least 1024 bytes; only the
    /// first 1024 are used). Verifies the checksum when `metadata_csum` is set.
    pub fn decode(bytes: &[u8]) -> Result<Superblock> {
        let sb = Self::decode_unverified(bytes)?;
        if sb.has_metadata_csum() {
            let want = superblock_checksum(&sb.raw[..]);
            if want != sb.checksum {
                return Err(bad(
                    "superblock s_checksum",
                    format!("stored {:#010x}, computed {:#010x}", sb.checksum, want),
                ));
            }
        }
        Ok(sb)
    }

    /// Decode and validate everything except the checksum (for fsck and
    /// tools that must look at a damaged superblock).
    pub fn decode_unverified(bytes: &[u8]) -> Result<Superblock> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(bad(
                "superblock",
                format!("{} bytes, need {SUPERBLOCK_SIZE}", bytes.len()),
            ));
        }
        let mut raw = Box::new([0u8; SUPERBLOCK_SIZE]);
        raw.copy_from_slice(&bytes[..SUPERBLOCK_SIZE]);
        let b = &raw[..];
        let magic = u16_at(b, off::MAGIC);
        if magic != EXT4_MAGIC {
            return Err(bad(
                "superblock s_magic",
                format!("{magic:#06x}, expected {EXT4_MAGIC:#06x}"),
            ));
        }
        let features = FeatureSet {
            compat: u32_at(b, off::FEATURE_COMPAT),
            incompat: u32_at(b, off::FEATURE_INCOMPAT),
            ro_compat: u32_at(b, off::FEATURE_RO_COMPAT),
        };
        let is64 = features.has_incompat(incompat::INCOMPAT_64BIT);
        let lohi = |lo: usize, hi: usize| -> u64 {
            u64::from(u32_at(b, lo))
                | if is64 {
                    u64::from(u32_at(b, hi)) << 32
                } else {
                    0
                }
        };
        let time = |lo: usize, hi: usize| -> u64 {
            u64::from(u32_at(b, lo)) | (u64::from(u8_at(b, hi)) << 32)
        };
        let mut hash_seed = [0u32; 4];
        for (i, h) in hash_seed.iter_mut().enumerate() {
            *h = u32_at(b, off::HASH_SEED + 4 * i);
        }
        let mut jnl_blocks = [0u32; 17];
        for (i, j) in jnl_blocks.iter_mut().enumerate() {
            *j = u32_at(b, off::JNL_BLOCKS + 4 * i);
        }
        let arr16 = |o: usize| -> [u8; 16] { b[o..o + 16].try_into().expect("16 bytes") };
        let sb = Superblock {
            inodes_count: u32_at(b, off::INODES_COUNT),
            blocks_count: lohi(off::BLOCKS_COUNT_LO, off::BLOCKS_COUNT_HI),
            r_blocks_count: lohi(off::R_BLOCKS_COUNT_LO, off::R_BLOCKS_COUNT_HI),
            free_blocks_count: lohi(off::FREE_BLOCKS_COUNT_LO, off::FREE_BLOCKS_COUNT_HI),
            free_inodes_count: u32_at(b, off::FREE_INODES_COUNT),
            first_data_block: u32_at(b, off::FIRST_DATA_BLOCK),
            log_block_size: u32_at(b, off::LOG_BLOCK_SIZE),
            log_cluster_size: u32_at(b, off::LOG_CLUSTER_SIZE),
            blocks_per_group: u32_at(b, off::BLOCKS_PER_GROUP),
            clusters_per_group: u32_at(b, off::CLUSTERS_PER_GROUP),
            inodes_per_group: u32_at(b, off::INODES_PER_GROUP),
            mtime: time(off::MTIME, off::MTIME_HI),
            wtime: time(off::WTIME, off::WTIME_HI),
            mnt_count: u16_at(b, off::MNT_COUNT),
            max_mnt_count: u16_at(b, off::MAX_MNT_COUNT) as i16,
            state: u16_at(b, off::STATE),
            errors: u16_at(b, off::ERRORS),
            minor_rev_level: u16_at(b, off::MINOR_REV_LEVEL),
            lastcheck: time(off::LASTCHECK, off::LASTCHECK_HI),
            checkinterval: u32_at(b, off::CHECKINTERVAL),
            creator_os: u32_at(b, off::CREATOR_OS),
            rev_level: u32_at(b, off::REV_LEVEL),
            def_resuid: u16_at(b, off::DEF_RESUID),
            def_resgid: u16_at(b, off::DEF_RESGID),
            first_ino: u32_at(b, off::FIRST_INO),
            inode_size: u16_at(b, off::INODE_SIZE),
            block_group_nr: u16_at(b, off::BLOCK_GROUP_NR),
            features,
            uuid: arr16(off::UUID),
            volume_name: arr16(off::VOLUME_NAME),
            last_mounted: b[off::LAST_MOUNTED..off::LAST_MOUNTED + 64]
                .try_into()
                .expect("64 bytes"),
            reserved_gdt_blocks: u16_at(b, off::RESERVED_GDT_BLOCKS),
            journal_uuid: arr16(off::JOURNAL_UUID),
            journal_inum: u32_at(b, off::JOURNAL_INUM),
            journal_dev: u32_at(b, off::JOURNAL_DEV),
            last_orphan: u32_at(b, off::LAST_ORPHAN),
            hash_seed,
            def_hash_version: u8_at(b, off::DEF_HASH_VERSION),
            jnl_backup_type: u8_at(b, off::JNL_BACKUP_TYPE),
            desc_size_raw: u16_at(b, off::DESC_SIZE),
            default_mount_opts: u32_at(b, off::DEFAULT_MOUNT_OPTS),
            first_meta_bg: u32_at(b, off::FIRST_META_BG),
            mkfs_time: time(off::MKFS_TIME, off::MKFS_TIME_HI),
            jnl_blocks,
            min_extra_isize: u16_at(b, off::MIN_EXTRA_ISIZE),
            want_extra_isize: u16_at(b, off::WANT_EXTRA_ISIZE),
            flags: u32_at(b, off::FLAGS),
            raid_stride: u16_at(b, off::RAID_STRIDE),
            mmp_interval: u16_at(b, off::MMP_INTERVAL),
            mmp_block: u64_at(b, off::MMP_BLOCK),
            raid_stripe_width: u32_at(b, off::RAID_STRIPE_WIDTH),
            log_groups_per_flex: u8_at(b, off::LOG_GROUPS_PER_FLEX),
            checksum_type: u8_at(b, off::CHECKSUM_TYPE),
            kbytes_written: u64_at(b, off::KBYTES_WRITTEN),
            error_count: u32_at(b, off::ERROR_COUNT),
            usr_quota_inum: u32_at(b, off::USR_QUOTA_INUM),
            grp_quota_inum: u32_at(b, off::GRP_QUOTA_INUM),
            prj_quota_inum: u32_at(b, off::PRJ_QUOTA_INUM),
            overhead_clusters: u32_at(b, off::OVERHEAD_CLUSTERS),
            backup_bgs: [u32_at(b, off::BACKUP_BGS), u32_at(b, off::BACKUP_BGS + 4)],
            lpf_ino: u32_at(b, off::LPF_INO),
            checksum_seed: u32_at(b, off::CHECKSUM_SEED),
            encoding: u16_at(b, off::ENCODING),
            encoding_flags: u16_at(b, off::ENCODING_FLAGS),
            orphan_file_inum: u32_at(b, off::ORPHAN_FILE_INUM),
            checksum: u32_at(b, off::CHECKSUM),
            raw,
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Check the geometry is self-consistent, so that every helper below is
    /// safe to call (no division by zero, no overflow, no absurd sizes).
    pub fn validate(&self) -> Result<()> {
        if self.log_block_size > 6 {
            return Err(bad(
                "superblock s_log_block_size",
                format!("{} (block size over 64 KiB)", self.log_block_size),
            ));
        }
        let bs = self.block_size();
        if self.rev_level > REV_DYNAMIC {
            return Err(bad(
                "superblock s_rev_level",
                format!("{} (only 0 and 1 exist)", self.rev_level),
            ));
        }
        if self.rev_level >= REV_DYNAMIC {
            let isz = self.inode_size;
            if isz < GOOD_OLD_INODE_SIZE || !isz.is_power_of_two() || u32::from(isz) > bs {
                return Err(bad(
                    "superblock s_inode_size",
                    format!("{isz} (must be a power of two in 128..={bs})"),
                ));
            }
            if self.first_ino < GOOD_OLD_FIRST_INO {
                return Err(bad(
                    "superblock s_first_ino",
                    format!("{} (must be at least 11)", self.first_ino),
                ));
            }
        }
        if self.blocks_per_group == 0 || self.blocks_per_group > 8 * bs {
            return Err(bad(
                "superblock s_blocks_per_group",
                format!("{} (must be in 1..={})", self.blocks_per_group, 8 * bs),
            ));
        }
        let inodes_per_block = bs / u32::from(self.inode_size());
        if self.inodes_per_group < inodes_per_block || self.inodes_per_group > 8 * bs {
            return Err(bad(
                "superblock s_inodes_per_group",
                format!(
                    "{} (must be in {inodes_per_block}..={})",
                    self.inodes_per_group,
                    8 * bs
                ),
            ));
        }
        if self.first_data_block > 1 || u64::from(self.first_data_block) >= self.blocks_count {
            return Err(bad(
                "superblock s_first_data_block",
                format!(
                    "{} with {} blocks",
                    self.first_data_block, self.blocks_count
                ),
            ));
        }
        if self.blocks_count >= 1 << 48 {
            return Err(bad(
                "superblock s_blocks_count",
                format!("{} (over 2^48)", self.blocks_count),
            ));
        }
        let groups = self.groups_count();
        if groups.checked_mul(u64::from(self.inodes_per_group))
            != Some(u64::from(self.inodes_count))
        {
            return Err(bad(
                "superblock s_inodes_count",
                format!(
                    "{} != {groups} groups x {} inodes per group",
                    self.inodes_count, self.inodes_per_group
                ),
            ));
        }
        if self.has_64bit() {
            let d = self.desc_size_raw;
            if !(MIN_DESC_SIZE_64BIT..=1024).contains(&d) || !d.is_power_of_two() {
                return Err(bad(
                    "superblock s_desc_size",
                    format!("{d} (64bit needs a power of two in 64..=1024)"),
                ));
            }
        }
        if self.has_metadata_csum() && self.checksum_type != CHECKSUM_TYPE_CRC32C {
            return Err(bad(
                "superblock s_checksum_type",
                format!("{} (only 1, crc32c, exists)", self.checksum_type),
            ));
        }
        if self.log_groups_per_flex > 31 {
            return Err(bad(
                "superblock s_log_groups_per_flex",
                format!("{}", self.log_groups_per_flex),
            ));
        }
        Ok(())
    }

    /// The bytes this superblock was decoded from (before any edits).
    pub fn raw(&self) -> &[u8; SUPERBLOCK_SIZE] {
        &self.raw
    }

    /// A fresh superblock for mkfs: all bytes zero except the magic,
    /// revision 1 and `first_ino` 11, so that `validate` fails until the
    /// caller fills in the geometry.
    pub fn blank() -> Superblock {
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        put_u16(&mut raw, off::MAGIC, EXT4_MAGIC);
        put_u32(&mut raw, off::REV_LEVEL, REV_DYNAMIC);
        put_u32(&mut raw, off::FIRST_INO, GOOD_OLD_FIRST_INO);
        put_u16(&mut raw, off::INODE_SIZE, 256);
        put_u32(&mut raw, off::LOG_CLUSTER_SIZE, 0);
        put_u32(&mut raw, off::BLOCKS_PER_GROUP, 8192);
        put_u32(&mut raw, off::INODES_PER_GROUP, 8192);
        put_u32(&mut raw, off::BLOCKS_COUNT_LO, 8192);
        put_u32(&mut raw, off::INODES_COUNT, 8192);
        put_u32(&mut raw, off::FIRST_DATA_BLOCK, 1);
        // Bypass validation: decode_unverified only fails on geometry, and
        // the geometry above is valid for 1 KiB blocks.
        Superblock::decode_unverified(&raw).expect("blank superblock geometry is valid")
    }

    /// Encode: the raw bytes with every known field patched in and, with
    /// `metadata_csum`, the checksum recomputed. `block_group_nr` is written
    /// as set; use [`Superblock::encode_for_group`] for backups.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = *self.raw;
        let is64 = self.has_64bit();
        assert!(
            is64 || (self.blocks_count | self.r_blocks_count | self.free_blocks_count) >> 32 == 0,
            "block counts over 2^32 need 64bit"
        );
        let put_lohi = |b: &mut [u8], lo: usize, hi: usize, v: u64| {
            put_u32(b, lo, v as u32);
            if is64 {
                put_u32(b, hi, (v >> 32) as u32);
            }
        };
        let put_time = |b: &mut [u8], lo: usize, hi: usize, v: u64| {
            put_u32(b, lo, v as u32);
            put_u8(b, hi, (v >> 32) as u8);
        };
        put_u32(&mut b, off::INODES_COUNT, self.inodes_count);
        put_lohi(
            &mut b,
            off::BLOCKS_COUNT_LO,
            off::BLOCKS_COUNT_HI,
            self.blocks_count,
        );
        put_lohi(
            &mut b,
            off::R_BLOCKS_COUNT_LO,
            off::R_BLOCKS_COUNT_HI,
            self.r_blocks_count,
        );
        put_lohi(
            &mut b,
            off::FREE_BLOCKS_COUNT_LO,
            off::FREE_BLOCKS_COUNT_HI,
            self.free_blocks_count,
        );
        put_u32(&mut b, off::FREE_INODES_COUNT, self.free_inodes_count);
        put_u32(&mut b, off::FIRST_DATA_BLOCK, self.first_data_block);
        put_u32(&mut b, off::LOG_BLOCK_SIZE, self.log_block_size);
        put_u32(&mut b, off::LOG_CLUSTER_SIZE, self.log_cluster_size);
        put_u32(&mut b, off::BLOCKS_PER_GROUP, self.blocks_per_group);
        put_u32(&mut b, off::CLUSTERS_PER_GROUP, self.clusters_per_group);
        put_u32(&mut b, off::INODES_PER_GROUP, self.inodes_per_group);
        put_time(&mut b, off::MTIME, off::MTIME_HI, self.mtime);
        put_time(&mut b, off::WTIME, off::WTIME_HI, self.wtime);
        put_u16(&mut b, off::MNT_COUNT, self.mnt_count);
        put_u16(&mut b, off::MAX_MNT_COUNT, self.max_mnt_count as u16);
        put_u16(&mut b, off::MAGIC, EXT4_MAGIC);
        put_u16(&mut b, off::STATE, self.state);
        put_u16(&mut b, off::ERRORS, self.errors);
        put_u16(&mut b, off::MINOR_REV_LEVEL, self.minor_rev_level);
        put_time(&mut b, off::LASTCHECK, off::LASTCHECK_HI, self.lastcheck);
        put_u32(&mut b, off::CHECKINTERVAL, self.checkinterval);
        put_u32(&mut b, off::CREATOR_OS, self.creator_os);
        put_u32(&mut b, off::REV_LEVEL, self.rev_level);
        put_u16(&mut b, off::DEF_RESUID, self.def_resuid);
        put_u16(&mut b, off::DEF_RESGID, self.def_resgid);
        put_u32(&mut b, off::FIRST_INO, self.first_ino);
        put_u16(&mut b, off::INODE_SIZE, self.inode_size);
        put_u16(&mut b, off::BLOCK_GROUP_NR, self.block_group_nr);
        put_u32(&mut b, off::FEATURE_COMPAT, self.features.compat);
        put_u32(&mut b, off::FEATURE_INCOMPAT, self.features.incompat);
        put_u32(&mut b, off::FEATURE_RO_COMPAT, self.features.ro_compat);
        b[off::UUID..off::UUID + 16].copy_from_slice(&self.uuid);
        b[off::VOLUME_NAME..off::VOLUME_NAME + 16].copy_from_slice(&self.volume_name);
        b[off::LAST_MOUNTED..off::LAST_MOUNTED + 64].copy_from_slice(&self.last_mounted);
        put_u16(&mut b, off::RESERVED_GDT_BLOCKS, self.reserved_gdt_blocks);
        b[off::JOURNAL_UUID..off::JOURNAL_UUID + 16].copy_from_slice(&self.journal_uuid);
        put_u32(&mut b, off::JOURNAL_INUM, self.journal_inum);
        put_u32(&mut b, off::JOURNAL_DEV, self.journal_dev);
        put_u32(&mut b, off::LAST_ORPHAN, self.last_orphan);
        for (i, h) in self.hash_seed.iter().enumerate() {
            put_u32(&mut b, off::HASH_SEED + 4 * i, *h);
        }
        put_u8(&mut b, off::DEF_HASH_VERSION, self.def_hash_version);
        put_u8(&mut b, off::JNL_BACKUP_TYPE, self.jnl_backup_type);
        put_u16(&mut b, off::DESC_SIZE, self.desc_size_raw);
        put_u32(&mut b, off::DEFAULT_MOUNT_OPTS, self.default_mount_opts);
        put_u32(&mut b, off::FIRST_META_BG, self.first_meta_bg);
        put_time(&mut b, off::MKFS_TIME, off::MKFS_TIME_HI, self.mkfs_time);
        for (i, j) in self.jnl_blocks.iter().enumerate() {
            put_u32(&mut b, off::JNL_BLOCKS + 4 * i, *j);
        }
        put_u16(&mut b, off::MIN_EXTRA_ISIZE, self.min_extra_isize);
        put_u16(&mut b, off::WANT_EXTRA_ISIZE, self.want_extra_isize);
        put_u32(&mut b, off::FLAGS, self.flags);
        put_u16(&mut b, off::RAID_STRIDE, self.raid_stride);
        put_u16(&mut b, off::MMP_INTERVAL, self.mmp_interval);
        put_u64(&mut b, off::MMP_BLOCK, self.mmp_block);
        put_u32(&mut b, off::RAID_STRIPE_WIDTH, self.raid_stripe_width);
        put_u8(&mut b, off::LOG_GROUPS_PER_FLEX, self.log_groups_per_flex);
        put_u8(&mut b, off::CHECKSUM_TYPE, self.checksum_type);
        put_u64(&mut b, off::KBYTES_WRITTEN, self.kbytes_written);
        put_u32(&mut b, off::ERROR_COUNT, self.error_count);
        put_u32(&mut b, off::USR_QUOTA_INUM, self.usr_quota_inum);
        put_u32(&mut b, off::GRP_QUOTA_INUM, self.grp_quota_inum);
        put_u32(&mut b, off::PRJ_QUOTA_INUM, self.prj_quota_inum);
        put_u32(&mut b, off::OVERHEAD_CLUSTERS, self.overhead_clusters);
        put_u32(&mut b, off::BACKUP_BGS, self.backup_bgs[0]);
        put_u32(&mut b, off::BACKUP_BGS + 4, self.backup_bgs[1]);
        put_u32(&mut b, off::LPF_INO, self.lpf_ino);
        put_u32(&mut b, off::CHECKSUM_SEED, self.checksum_seed);
        put_u16(&mut b, off::ENCODING, self.encoding);
        put_u16(&mut b, off::ENCODING_FLAGS, self.encoding_flags);
        put_u32(&mut b, off::ORPHAN_FILE_INUM, self.orphan_file_inum);
        if self.has_metadata_csum() {
            let c = superblock_checksum(&b);
            put_u32(&mut b, off::CHECKSUM, c);
        } else {
            put_u32(&mut b, off::CHECKSUM, self.checksum);
        }
        b
    }

    /// Encode the copy stored in `group` (its `s_block_group_nr` set).
    pub fn encode_for_group(&self, group: u32) -> [u8; SUPERBLOCK_SIZE] {
        let mut copy = self.clone();
        copy.block_group_nr = group as u16;
        copy.encode()
    }

    // ----- features -----

    /// `metadata_csum` is set.
    pub fn has_metadata_csum(&self) -> bool {
        self.features.has_ro_compat(ro_compat::METADATA_CSUM)
    }
    /// `uninit_bg` (gdt_csum) is set and `metadata_csum` is not (the kernel
    /// lets metadata_csum win when both are set).
    pub fn has_gdt_csum(&self) -> bool {
        !self.has_metadata_csum() && self.features.has_ro_compat(ro_compat::GDT_CSUM)
    }
    /// Group descriptors carry checksums and the uninit flags are honoured.
    pub fn has_group_csum(&self) -> bool {
        self.has_metadata_csum() || self.has_gdt_csum()
    }
    /// `64bit` is set.
    pub fn has_64bit(&self) -> bool {
        self.features.has_incompat(incompat::INCOMPAT_64BIT)
    }
    /// `flex_bg` is set.
    pub fn has_flex_bg(&self) -> bool {
        self.features.has_incompat(incompat::FLEX_BG)
    }
    /// `has_journal` is set.
    pub fn has_journal(&self) -> bool {
        self.features.has_compat(compat::HAS_JOURNAL)
    }
    /// `huge_file` is set.
    pub fn has_huge_file(&self) -> bool {
        self.features.has_ro_compat(ro_compat::HUGE_FILE)
    }
    /// `filetype` is set (directory entries carry a type byte).
    pub fn has_filetype(&self) -> bool {
        self.features.has_incompat(incompat::FILETYPE)
    }
    /// `dir_nlink` is set (directories over 65000 links store 1).
    pub fn has_dir_nlink(&self) -> bool {
        self.features.has_ro_compat(ro_compat::DIR_NLINK)
    }

    // ----- geometry -----

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1024u32 << self.log_block_size.min(6)
    }
    /// Inode size in bytes (128 for revision 0).
    pub fn inode_size(&self) -> u16 {
        if self.rev_level == 0 {
            GOOD_OLD_INODE_SIZE
        } else {
            self.inode_size
        }
    }
    /// The first non-reserved inode (11 for revision 0).
    pub fn first_ino(&self) -> u32 {
        if self.rev_level == 0 {
            GOOD_OLD_FIRST_INO
        } else {
            self.first_ino
        }
    }
    /// Group descriptor size in bytes: `s_desc_size` with `64bit`, else 32.
    pub fn desc_size(&self) -> u16 {
        if self.has_64bit() {
            self.desc_size_raw
        } else {
            MIN_DESC_SIZE
        }
    }
    /// Number of block groups.
    pub fn groups_count(&self) -> u64 {
        let data = self.blocks_count - u64::from(self.first_data_block);
        data.div_ceil(u64::from(self.blocks_per_group))
    }
    /// First block of `group`.
    pub fn group_first_block(&self, group: u64) -> u64 {
        u64::from(self.first_data_block) + group * u64::from(self.blocks_per_group)
    }
    /// Number of blocks in `group` (the last group may be short).
    pub fn blocks_in_group(&self, group: u64) -> u32 {
        let first = self.group_first_block(group);
        let end = (first + u64::from(self.blocks_per_group)).min(self.blocks_count);
        end.saturating_sub(first) as u32
    }
    /// The group holding `block`.
    pub fn group_of_block(&self, block: u64) -> u64 {
        block.saturating_sub(u64::from(self.first_data_block)) / u64::from(self.blocks_per_group)
    }
    /// Index of `block` within its group.
    pub fn block_index_in_group(&self, block: u64) -> u32 {
        (block.saturating_sub(u64::from(self.first_data_block)) % u64::from(self.blocks_per_group))
            as u32
    }
    /// The group holding inode `ino` (inode numbers start at 1).
    pub fn group_of_inode(&self, ino: u32) -> u64 {
        u64::from(ino.saturating_sub(1) / self.inodes_per_group)
    }
    /// Index of inode `ino` within its group's inode table.
    pub fn inode_index_in_group(&self, ino: u32) -> u32 {
        ino.saturating_sub(1) % self.inodes_per_group
    }
    /// Inodes per inode-table block.
    pub fn inodes_per_block(&self) -> u32 {
        self.block_size() / u32::from(self.inode_size())
    }
    /// Blocks of one group's inode table.
    pub fn inode_table_blocks(&self) -> u32 {
        (self.inodes_per_group * u32::from(self.inode_size())).div_ceil(self.block_size())
    }
    /// Blocks holding the group descriptor table (one copy).
    pub fn gdt_blocks(&self) -> u64 {
        (self.groups_count() * u64::from(self.desc_size())).div_ceil(u64::from(self.block_size()))
    }
    /// First block of the descriptor table copy that follows the
    /// superblock copy in `group` (the primary for group 0). Only
    /// meaningful when `has_super(group)`; `meta_bg` is not supported.
    pub fn gdt_first_block(&self, group: u64) -> u64 {
        self.group_first_block(group) + 1
    }
    /// Where inode `ino` lives, given its group's inode-table start:
    /// (block, byte offset in that block).
    pub fn inode_location(&self, inode_table: u64, ino: u32) -> (u64, usize) {
        let idx = u64::from(self.inode_index_in_group(ino));
        let per_block = u64::from(self.inodes_per_block());
        (
            inode_table + idx / per_block,
            ((idx % per_block) * u64::from(self.inode_size())) as usize,
        )
    }
    /// Groups per flex group (1 without `flex_bg`).
    pub fn groups_per_flex(&self) -> u64 {
        if self.has_flex_bg() {
            1u64 << self.log_groups_per_flex
        } else {
            1
        }
    }
    /// Whether `group` holds a superblock and group-descriptor backup
    /// (`sparse_super`: groups 0, 1 and powers of 3, 5, 7;
    /// `sparse_super2`: group 0 and the two named in `s_backup_bgs`).
    pub fn has_super(&self, group: u64) -> bool {
        if group == 0 {
            return true;
        }
        if self.features.has_compat(compat::SPARSE_SUPER2) {
            return self
                .backup_bgs
                .iter()
                .any(|&g| g != 0 && u64::from(g) == group);
        }
        if group <= 1 || !self.features.has_ro_compat(ro_compat::SPARSE_SUPER) {
            return true;
        }
        if group & 1 == 0 {
            return false;
        }
        is_power_of(group, 3) || is_power_of(group, 5) || is_power_of(group, 7)
    }
    /// Blocks at the start of `group` taken by the superblock copy, the group
    /// descriptor table and the reserved GDT blocks (0 if `group` has no backup).
    pub fn super_overhead_blocks(&self, group: u64) -> u64 {
        if !self.has_super(group) {
            return 0;
        }
        // With 1 KiB blocks and first_data_block 1 the superblock is block 1
        // and group 0 starts there; with larger blocks the superblock sits
        // inside block 0 of group 0. Either way one block.
        1 + self.gdt_blocks() + u64::from(self.reserved_gdt_blocks)
    }
    /// The checksum seed of `metadata_csum` structures.
    pub fn csum_seed(&self) -> u32 {
        if self.features.has_incompat(incompat::CSUM_SEED) {
            self.checksum_seed
        } else {
            fs_csum_seed(&self.uuid)
        }
    }
    /// The checksum seed when `metadata_csum` is set, else `None`.
    pub fn metadata_csum_seed(&self) -> Option<u32> {
        self.has_metadata_csum().then(|| self.csum_seed())
    }
    /// How group descriptors are checksummed.
    pub fn group_csum(&self) -> GroupCsum {
        if self.has_metadata_csum() {
            GroupCsum::Crc32c {
                seed: self.csum_seed(),
            }
        } else if self.has_gdt_csum() {
            GroupCsum::Crc16 { uuid: self.uuid }
        } else {
            GroupCsum::None
        }
    }
    /// The volume label as a string (up to the first NUL).
    pub fn label(&self) -> String {
        let end = self.volume_name.iter().position(|&c| c == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.volume_name[..end]).into_owned()
    }
}

fn is_power_of(mut n: u64, base: u64) -> bool {
    while n > 1 && n.is_multiple_of(base) {
        n /= base;
    }
    n == 1
}

/// crc32c(~0, bytes 0..0x3FC) of a superblock image.
pub fn superblock_checksum(raw: &[u8]) -> u32 {
    ext4_crc32c(!0, &raw[..off::CHECKSUM])
}

/// The device block holding the primary superblock (byte
/// [`SUPERBLOCK_OFFSET`]): block 1 with 1 KiB blocks, block 0 otherwise.
pub fn super_block_nr(block_size: u32) -> u64 {
    SUPERBLOCK_OFFSET / u64::from(block_size)
}

/// Byte offset of the primary superblock within [`super_block_nr`].
pub fn super_offset(block_size: u32) -> usize {
    (SUPERBLOCK_OFFSET % u64::from(block_size)) as usize
}

/// Whether a superblock image (at least 1024 bytes) has `metadata_csum`.
fn raw_has_metadata_csum(sb: &[u8]) -> bool {
    u32_at(sb, off::FEATURE_RO_COMPAT) & ro_compat::METADATA_CSUM != 0
}

/// Recompute `s_checksum` of a 1024-byte superblock image in place when it
/// has `metadata_csum` (without it the field is unused and left alone).
/// Code that patches single fields of a cached superblock calls this
/// instead of decoding and re-encoding the whole structure.
pub fn reseal(sb: &mut [u8]) {
    if raw_has_metadata_csum(sb) {
        let c = superblock_checksum(sb);
        put_u32(sb, off::CHECKSUM, c);
    }
}

/// Whether a 1024-byte superblock image with `metadata_csum` fails its
/// checksum (an image without it never does).
pub fn checksum_fails(sb: &[u8]) -> bool {
    raw_has_metadata_csum(sb) && superblock_checksum(sb) != u32_at(sb, off::CHECKSUM)
}

/// Set or clear `needs_recovery` in a block image holding the primary
/// superblock (a device block of `block_size` bytes), resealing it.
/// Returns whether anything changed.
pub fn set_needs_recovery(block_image: &mut [u8], block_size: u32, on: bool) -> bool {
    let at = super_offset(block_size);
    let sb = &mut block_image[at..at + SUPERBLOCK_SIZE];
    let old = u32_at(sb, off::FEATURE_INCOMPAT);
    let new = if on {
        old | incompat::RECOVER
    } else {
        old & !incompat::RECOVER
    };
    if new == old {
        return false;
    }
    put_u32(sb, off::FEATURE_INCOMPAT, new);
    reseal(sb);
    true
}

/// Whether a 1024-byte superblock image fails its checksum only because a
/// write that flipped `needs_recovery` was torn between its two sectors
/// (the flag is in the first, the checksum in the second): the image with
/// the flag flipped back passes. Any other mismatch is real corruption.
pub fn torn_needs_recovery_flip(sb: &[u8]) -> bool {
    if !checksum_fails(sb) {
        return false;
    }
    let stored = u32_at(sb, off::CHECKSUM);
    let mut flipped = sb[..SUPERBLOCK_SIZE].to_vec();
    let inc = u32_at(&flipped, off::FEATURE_INCOMPAT) ^ incompat::RECOVER;
    put_u32(&mut flipped, off::FEATURE_INCOMPAT, inc);
    superblock_checksum(&flipped) == stored
}

/// The superblock fields that locate the journal, decoded leniently.
///
/// Journal recovery runs on crash images before mount validates the
/// superblock (a replay may be what repairs it), so this view checks only
/// the magic: a damaged field recovery does not read must not stop it from
/// reaching the journal. Everything else is [`Superblock`]'s job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalView {
    pub first_data_block: u32,
    pub log_block_size: u32,
    /// Raw `s_inode_size` (0 on revision-0 file systems).
    pub inode_size: u16,
    pub features: FeatureSet,
    pub journal_inum: u32,
    pub journal_dev: u32,
    pub jnl_backup_type: u8,
    /// Raw `s_desc_size`.
    pub desc_size: u16,
    /// `s_jnl_blocks`: 15 words of `i_block`, then `i_size_high`, `i_size`.
    pub jnl_blocks: [u32; 17],
}

impl JournalView {
    /// Decode the journal fields of a superblock image (at least 1024
    /// bytes). Fails only on a short image or a wrong magic.
    pub fn decode(b: &[u8]) -> Result<JournalView> {
        if b.len() < SUPERBLOCK_SIZE {
            return Err(bad(
                "superblock",
                format!("{} bytes, need {SUPERBLOCK_SIZE}", b.len()),
            ));
        }
        let magic = u16_at(b, off::MAGIC);
        if magic != EXT4_MAGIC {
            return Err(bad(
                "superblock s_magic",
                format!("{magic:#06x}, expected {EXT4_MAGIC:#06x}"),
            ));
        }
        let mut jnl_blocks = [0u32; 17];
        for (i, w) in jnl_blocks.iter_mut().enumerate() {
            *w = u32_at(b, off::JNL_BLOCKS + 4 * i);
        }
        Ok(JournalView {
            first_data_block: u32_at(b, off::FIRST_DATA_BLOCK),
            log_block_size: u32_at(b, off::LOG_BLOCK_SIZE),
            inode_size: u16_at(b, off::INODE_SIZE),
            features: FeatureSet {
                compat: u32_at(b, off::FEATURE_COMPAT),
                incompat: u32_at(b, off::FEATURE_INCOMPAT),
                ro_compat: u32_at(b, off::FEATURE_RO_COMPAT),
            },
            journal_inum: u32_at(b, off::JOURNAL_INUM),
            journal_dev: u32_at(b, off::JOURNAL_DEV),
            jnl_backup_type: u8_at(b, off::JNL_BACKUP_TYPE),
            desc_size: u16_at(b, off::DESC_SIZE),
            jnl_blocks,
        })
    }

    /// `has_journal`.
    pub fn has_journal(&self) -> bool {
        self.features.has_compat(compat::HAS_JOURNAL)
    }

    /// `needs_recovery`.
    pub fn needs_recovery(&self) -> bool {
        self.features.needs_recovery()
    }

    /// `64bit`.
    pub fn has_64bit(&self) -> bool {
        self.features.has_incompat(incompat::INCOMPAT_64BIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let mut sb = Superblock::blank();
        sb.log_block_size = 2;
        sb.blocks_per_group = 32768;
        sb.clusters_per_group = 32768;
        sb.blocks_count = 100_000;
        sb.first_data_block = 0;
        sb.inodes_per_group = 8192;
        sb.inodes_count = 4 * 8192;
        sb.features.incompat = incompat::FILETYPE | incompat::EXTENTS | incompat::INCOMPAT_64BIT;
        sb.features.ro_compat = ro_compat::METADATA_CSUM | ro_compat::SPARSE_SUPER;
        sb.checksum_type = CHECKSUM_TYPE_CRC32C;
        sb.desc_size_raw = 64;
        sb.uuid = *b"0123456789abcdef";
        sb.mtime = 0x1_2345_6789;
        sb.kbytes_written = 77;
        sb.jnl_blocks[16] = 9;
        sb
    }

    #[test]
    fn encode_decode_round_trip_with_checksum() {
        let sb = sample();
        let bytes = sb.encode();
        let back = Superblock::decode(&bytes).unwrap();
        assert_eq!(back.blocks_count, 100_000);
        assert_eq!(back.mtime, 0x1_2345_6789);
        assert_eq!(back.kbytes_written, 77);
        assert_eq!(back.jnl_blocks[16], 9);
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.groups_count(), 4);
        assert_eq!(back.blocks_in_group(3), 100_000 - 3 * 32768);
    }

    #[test]
    fn unknown_bytes_survive() {
        let mut bytes = sample().encode();
        bytes[off::MOUNT_OPTS] = b'x';
        bytes[0x300] = 0xAB;
        let c = superblock_checksum(&bytes);
        bytes[off::CHECKSUM..off::CHECKSUM + 4].copy_from_slice(&c.to_le_bytes());
        let mut sb = Superblock::decode(&bytes).unwrap();
        sb.free_inodes_count = 5;
        let out = sb.encode();
        assert_eq!(out[off::MOUNT_OPTS], b'x');
        assert_eq!(out[0x300], 0xAB);
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let mut bytes = sample().encode();
        bytes[0x10] ^= 1;
        let e = Superblock::decode(&bytes).unwrap_err();
        assert_eq!(e.field, "superblock s_checksum");
    }

    #[test]
    fn bad_magic_and_geometry_are_errors() {
        let mut bytes = sample().encode();
        bytes[off::MAGIC] = 0;
        assert_eq!(
            Superblock::decode_unverified(&bytes).unwrap_err().field,
            "superblock s_magic"
        );
        let mut sb = sample();
        sb.blocks_per_group = 0;
        assert!(Superblock::decode_unverified(&sb.encode()).is_err());
        let mut sb = sample();
        sb.inodes_count += 1;
        assert_eq!(
            Superblock::decode_unverified(&sb.encode())
                .unwrap_err()
                .field,
            "superblock s_inodes_count"
        );
    }

    #[test]
    fn sparse_super_backups() {
        let mut sb = sample();
        let with: Vec<u64> = (0..50).filter(|&g| sb.has_super(g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49]);
        sb.features.compat |= compat::SPARSE_SUPER2;
        sb.backup_bgs = [1, 40];
        let with: Vec<u64> = (0..50).filter(|&g| sb.has_super(g)).collect();
        assert_eq!(with, vec![0, 1, 40]);
    }

    #[test]
    fn primary_superblock_location_for_every_block_size() {
        assert_eq!((super_block_nr(1024), super_offset(1024)), (1, 0));
        for bs in [2048, 4096, 65536] {
            assert_eq!((super_block_nr(bs), super_offset(bs)), (0, 1024));
        }
    }

    #[test]
    fn needs_recovery_flip_reseals_and_its_tear_is_recognized() {
        let mut block = vec![0u8; 4096];
        block[1024..2048].copy_from_slice(&sample().encode());
        let old = block.clone();
        assert!(!checksum_fails(&old[1024..2048]));
        assert!(set_needs_recovery(&mut block, 4096, true));
        assert!(!set_needs_recovery(&mut block, 4096, true), "already set");
        assert!(!checksum_fails(&block[1024..2048]));
        assert!(JournalView::decode(&block[1024..])
            .unwrap()
            .needs_recovery());
        assert!(!torn_needs_recovery_flip(&block[1024..2048]));
        // New first sector (flag), old second sector (checksum): torn.
        let mut torn = old.clone();
        torn[1024..1536].copy_from_slice(&block[1024..1536]);
        assert!(checksum_fails(&torn[1024..2048]));
        assert!(torn_needs_recovery_flip(&torn[1024..2048]));
        // Any other damage is not mistaken for the tear.
        let mut other = old.clone();
        other[1024 + 0x70] ^= 1;
        assert!(!torn_needs_recovery_flip(&other[1024..2048]));
        reseal(&mut other[1024..2048]);
        assert!(!checksum_fails(&other[1024..2048]));
    }

    #[test]
    fn journal_view_needs_only_the_magic() {
        let mut raw = sample().encode();
        // Geometry Superblock::decode refuses; the journal fields still read.
        put_u32(&mut raw, off::BLOCKS_PER_GROUP, 0);
        put_u32(&mut raw, off::JOURNAL_INUM, 8);
        put_u32(&mut raw, off::FEATURE_COMPAT, compat::HAS_JOURNAL);
        assert!(Superblock::decode_unverified(&raw).is_err());
        let v = JournalView::decode(&raw).unwrap();
        assert_eq!(v.journal_inum, 8);
        assert!(v.has_journal() && v.has_64bit() && !v.needs_recovery());
        put_u16(&mut raw, off::MAGIC, 0);
        assert_eq!(
            JournalView::decode(&raw).unwrap_err().field,
            "superblock s_magic"
        );
        assert!(JournalView::decode(&raw[..100]).is_err());
    }
}
