//! Byte offsets of the ext4 fields the core reads and changes in place, and
//! the checksum arithmetic over them.
//!
//! The core changes metadata as byte ranges inside cached blocks (that is
//! what an [`crate::update::Update`] records), so it addresses fields by
//! offset rather than decoding and re-encoding whole structures. The values
//! are those of `ext2_fs.h`; `docs/FORMAT.md` documents the subset.

/// Little-endian readers and writers over byte slices, under the short
/// names the core uses (declared once, in `ordo_format::le`).
pub use ordo_format::le::{
    put_u16 as put16, put_u32 as put32, u16_at as le16, u32_at as le32, u64_at as le64,
};

/// ext4's `ext4_chksum`: crc32c continued from `seed`, without the final
/// inversion the `crc32c` crate applies.
pub fn ext4_crc(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

// The offsets and flags below are declared once, in `ordo-format`, next
// to its decoders; the core re-exports them under the short names it
// writes updates with.

/// Superblock field offsets (within the 1024-byte superblock).
pub mod sb {
    pub use ordo_format::superblock::off::{
        BLOCKS_COUNT_HI, BLOCKS_COUNT_LO, BLOCKS_PER_GROUP, CHECKSUM, CHECKSUM_SEED, CHECKSUM_TYPE,
        DESC_SIZE, FEATURE_COMPAT, FEATURE_INCOMPAT, FEATURE_RO_COMPAT, FIRST_DATA_BLOCK,
        FIRST_INO, INODES_COUNT, INODES_PER_GROUP, INODE_SIZE, JOURNAL_INUM, KBYTES_WRITTEN,
        LAST_ORPHAN, LOG_BLOCK_SIZE, LOG_CLUSTER_SIZE, MAGIC, MIN_EXTRA_ISIZE, MNT_COUNT, MTIME,
        REV_LEVEL, R_BLOCKS_COUNT_HI, R_BLOCKS_COUNT_LO, STATE, UUID, WANT_EXTRA_ISIZE, WTIME,
    };
    pub use ordo_format::superblock::off::{
        FREE_BLOCKS_COUNT_HI as FREE_BLOCKS_HI, FREE_BLOCKS_COUNT_LO as FREE_BLOCKS_LO,
        FREE_INODES_COUNT as FREE_INODES,
    };
    pub use ordo_format::superblock::{EXT4_MAGIC as MAGIC_VALUE, STATE_ERROR, STATE_VALID};
}

/// Feature bits.
pub mod feat {
    use ordo_format::features::{compat, incompat, ro_compat, FeatureKind, ALL_FEATURES};

    pub const COMPAT_HAS_JOURNAL: u32 = compat::HAS_JOURNAL;
    pub const COMPAT_EXT_ATTR: u32 = compat::EXT_ATTR;
    pub const COMPAT_RESIZE_INODE: u32 = compat::RESIZE_INODE;
    pub const COMPAT_DIR_INDEX: u32 = compat::DIR_INDEX;
    pub const COMPAT_FAST_COMMIT: u32 = compat::FAST_COMMIT;
    pub const COMPAT_ORPHAN_FILE: u32 = compat::ORPHAN_FILE;

    pub const INCOMPAT_FILETYPE: u32 = incompat::FILETYPE;
    pub const INCOMPAT_RECOVER: u32 = incompat::RECOVER;
    pub const INCOMPAT_EXTENTS: u32 = incompat::EXTENTS;
    pub const INCOMPAT_64BIT: u32 = incompat::INCOMPAT_64BIT;
    pub const INCOMPAT_FLEX_BG: u32 = incompat::FLEX_BG;
    pub const INCOMPAT_CSUM_SEED: u32 = incompat::CSUM_SEED;
    pub const INCOMPAT_LARGEDIR: u32 = incompat::LARGEDIR;

    pub const RO_COMPAT_SPARSE_SUPER: u32 = ro_compat::SPARSE_SUPER;
    pub const RO_COMPAT_LARGE_FILE: u32 = ro_compat::LARGE_FILE;
    pub const RO_COMPAT_HUGE_FILE: u32 = ro_compat::HUGE_FILE;
    pub const RO_COMPAT_GDT_CSUM: u32 = ro_compat::GDT_CSUM;
    pub const RO_COMPAT_DIR_NLINK: u32 = ro_compat::DIR_NLINK;
    pub const RO_COMPAT_EXTRA_ISIZE: u32 = ro_compat::EXTRA_ISIZE;
    pub const RO_COMPAT_METADATA_CSUM: u32 = ro_compat::METADATA_CSUM;
    pub const RO_COMPAT_ORPHAN_PRESENT: u32 = ro_compat::ORPHAN_PRESENT;

    /// Incompatible features ordo reads and writes.
    pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
        | INCOMPAT_EXTENTS
        | INCOMPAT_64BIT
        | INCOMPAT_FLEX_BG
        | INCOMPAT_CSUM_SEED
        | INCOMPAT_LARGEDIR
        | INCOMPAT_RECOVER;
    /// Read-only-compatible features ordo keeps correct when writing.
    pub const RO_COMPAT_SUPPORTED: u32 = RO_COMPAT_SPARSE_SUPER
        | RO_COMPAT_LARGE_FILE
        | RO_COMPAT_HUGE_FILE
        | RO_COMPAT_DIR_NLINK
        | RO_COMPAT_EXTRA_ISIZE
        | RO_COMPAT_METADATA_CSUM
        | RO_COMPAT_ORPHAN_PRESENT;

    /// The e2fsprogs name of bit `bit` of feature word `kind`.
    fn name_of(kind: FeatureKind, bit: u32) -> &'static str {
        ALL_FEATURES
            .iter()
            .find(|f| f.kind == kind && f.bit == bit)
            .map_or("unknown", |f| f.name)
    }
    /// Names of incompat bits, for refusal messages.
    pub fn incompat_name(bit: u32) -> &'static str {
        name_of(FeatureKind::Incompat, bit)
    }
    /// Names of ro_compat bits, for refusal messages.
    pub fn ro_compat_name(bit: u32) -> &'static str {
        name_of(FeatureKind::RoCompat, bit)
    }
}

/// Group descriptor field offsets.
pub mod gd {
    pub use ordo_format::group::off::{
        BLOCK_BITMAP_CSUM_HI, BLOCK_BITMAP_CSUM_LO, BLOCK_BITMAP_HI, BLOCK_BITMAP_LO, CHECKSUM,
        FLAGS, INODE_BITMAP_CSUM_HI, INODE_BITMAP_CSUM_LO, INODE_BITMAP_HI, INODE_BITMAP_LO,
        INODE_TABLE_HI, INODE_TABLE_LO, ITABLE_UNUSED_HI, ITABLE_UNUSED_LO,
    };
    pub use ordo_format::group::off::{
        FREE_BLOCKS_COUNT_HI as FREE_BLOCKS_HI, FREE_BLOCKS_COUNT_LO as FREE_BLOCKS_LO,
        FREE_INODES_COUNT_HI as FREE_INODES_HI, FREE_INODES_COUNT_LO as FREE_INODES_LO,
        USED_DIRS_COUNT_HI as USED_DIRS_HI, USED_DIRS_COUNT_LO as USED_DIRS_LO,
    };
    pub use ordo_format::group::{
        BG_BLOCK_UNINIT as FLAG_BLOCK_UNINIT, BG_INODE_UNINIT as FLAG_INODE_UNINIT,
        BG_INODE_ZEROED as FLAG_INODE_ZEROED,
    };
}

/// Inode field offsets.
pub mod ino {
    pub use ordo_format::inode::flags::{
        EA_INODE as FL_EA_INODE, EXTENTS as FL_EXTENTS, HUGE_FILE as FL_HUGE_FILE,
        INDEX as FL_INDEX, INLINE_DATA as FL_INLINE_DATA,
    };
    pub use ordo_format::inode::off::{
        ATIME, ATIME_EXTRA, BLOCK, BLOCKS_LO, CHECKSUM_HI, CHECKSUM_LO, CRTIME, CRTIME_EXTRA,
        CTIME, CTIME_EXTRA, DTIME, EXTRA_ISIZE, FILE_ACL_LO, FLAGS, GENERATION, GID, MODE, MTIME,
        MTIME_EXTRA, SIZE_LO, UID,
    };
    pub use ordo_format::inode::off::{
        BLOCKS_HIGH as BLOCKS_HI, FILE_ACL_HIGH as FILE_ACL_HI, GID_HIGH as GID_HI,
        LINKS_COUNT as LINKS, SIZE_HIGH as SIZE_HI, UID_HIGH as UID_HI,
    };
    pub use ordo_format::inode::I_BLOCK_SIZE as BLOCK_LEN;

    /// `i_file_acl` (the attribute block, 0: none) of a raw inode.
    pub fn file_acl(raw: &[u8]) -> u64 {
        u64::from(super::le32(raw, FILE_ACL_LO)) | u64::from(super::le16(raw, FILE_ACL_HI)) << 32
    }
}

/// Directory entry constants.
pub mod dirent {
    pub use ordo_format::dir::ft::{
        BLKDEV as FT_BLK, CHRDEV as FT_CHR, DIR as FT_DIR, FIFO as FT_FIFO, REG_FILE as FT_REG,
        SOCK as FT_SOCK, SYMLINK as FT_SYMLINK, UNKNOWN as FT_UNKNOWN,
    };
    pub use ordo_format::dir::{
        rec_len_for, DIRENT_TAIL_FT as TAIL_FT, DIRENT_TAIL_SIZE as TAIL_LEN,
    };
}

/// Extent-tree constants.
pub mod ext {
    pub use ordo_format::extent::{
        EXTENT_INIT_MAX_LEN as MAX_INIT_LEN, EXTENT_MAGIC as MAGIC,
        EXTENT_UNWRITTEN_MAX_LEN as MAX_UNWRITTEN_LEN,
    };
}

/// Encode a timestamp as ext4's (seconds low 32 bits, extra field).
pub fn encode_time(sec: i64, nsec: u32) -> (u32, u32) {
    let epoch = ((sec - (sec as i32 as i64)) >> 32) as u32 & 3;
    (sec as i32 as u32, (nsec << 2) | epoch)
}

/// Decode ext4's (seconds, extra) into (seconds, nanoseconds).
pub fn decode_time(lo: u32, extra: u32) -> (i64, u32) {
    let sec = lo as i32 as i64 + (((extra & 3) as i64) << 32);
    (sec, (extra >> 2).min(999_999_999))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_reference_vector() {
        // crc32c("123456789") = 0xE3069283 with standard pre/post inversion,
        // so ext4's raw form from ~0 is its complement.
        assert_eq!(ext4_crc(!0, b"123456789"), !0xE306_9283);
    }

    #[test]
    fn time_round_trips_including_epoch_bits() {
        for &(s, n) in &[
            (0i64, 0u32),
            (1_700_000_000, 123_456_789),
            (-1, 5),
            (3_000_000_000, 999_999_999),
        ] {
            let (lo, extra) = encode_time(s, n);
            assert_eq!(decode_time(lo, extra), (s, n));
        }
    }
}
