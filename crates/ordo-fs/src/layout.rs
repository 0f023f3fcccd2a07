//! Byte offsets of the ext4 fields the core reads and changes in place, and
//! the checksum arithmetic over them.
//!
//! The core changes metadata as byte ranges inside cached blocks (that is
//! what an [`crate::update::Update`] records), so it addresses fields by
//! offset rather than decoding and re-encoding whole structures. The values
//! are those of `ext2_fs.h`; `docs/FORMAT.md` documents the subset.

/// Little-endian readers and writers over byte slices.
pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
pub fn le64(b: &[u8], off: usize) -> u64 {
    le32(b, off) as u64 | (le32(b, off + 4) as u64) << 32
}
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// ext4's `ext4_chksum`: crc32c continued from `seed`, without the final
/// inversion the `crc32c` crate applies.
pub fn ext4_crc(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// Superblock field offsets (within the 1024-byte superblock).
pub mod sb {
    pub const INODES_COUNT: usize = 0x0;
    pub const BLOCKS_COUNT_LO: usize = 0x4;
    pub const R_BLOCKS_COUNT_LO: usize = 0x8;
    pub const FREE_BLOCKS_LO: usize = 0xC;
    pub const FREE_INODES: usize = 0x10;
    pub const FIRST_DATA_BLOCK: usize = 0x14;
    pub const LOG_BLOCK_SIZE: usize = 0x18;
    pub const LOG_CLUSTER_SIZE: usize = 0x1C;
    pub const BLOCKS_PER_GROUP: usize = 0x20;
    pub const INODES_PER_GROUP: usize = 0x28;
    pub const MTIME: usize = 0x2C;
    pub const WTIME: usize = 0x30;
    pub const MNT_COUNT: usize = 0x34;
    pub const MAGIC: usize = 0x38;
    pub const STATE: usize = 0x3A;
    pub const REV_LEVEL: usize = 0x4C;
    pub const FIRST_INO: usize = 0x54;
    pub const INODE_SIZE: usize = 0x58;
    pub const FEATURE_COMPAT: usize = 0x5C;
    pub const FEATURE_INCOMPAT: usize = 0x60;
    pub const FEATURE_RO_COMPAT: usize = 0x64;
    pub const UUID: usize = 0x68;
    pub const JOURNAL_INUM: usize = 0xE0;
    pub const LAST_ORPHAN: usize = 0xE8;
    pub const DESC_SIZE: usize = 0xFE;
    pub const BLOCKS_COUNT_HI: usize = 0x150;
    pub const R_BLOCKS_COUNT_HI: usize = 0x154;
    pub const FREE_BLOCKS_HI: usize = 0x158;
    pub const MIN_EXTRA_ISIZE: usize = 0x15C;
    pub const WANT_EXTRA_ISIZE: usize = 0x15E;
    pub const KBYTES_WRITTEN: usize = 0x178;
    pub const CHECKSUM_TYPE: usize = 0x175;
    pub const CHECKSUM_SEED: usize = 0x270;
    pub const CHECKSUM: usize = 0x3FC;
    pub const MAGIC_VALUE: u16 = 0xEF53;
    pub const STATE_VALID: u16 = 1;
    pub const STATE_ERROR: u16 = 2;
}

/// Feature bits.
pub mod feat {
    pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
    pub const COMPAT_EXT_ATTR: u32 = 0x8;
    pub const COMPAT_RESIZE_INODE: u32 = 0x10;
    pub const COMPAT_DIR_INDEX: u32 = 0x20;
    pub const COMPAT_FAST_COMMIT: u32 = 0x400;
    pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

    pub const INCOMPAT_FILETYPE: u32 = 0x2;
    pub const INCOMPAT_RECOVER: u32 = 0x4;
    pub const INCOMPAT_EXTENTS: u32 = 0x40;
    pub const INCOMPAT_64BIT: u32 = 0x80;
    pub const INCOMPAT_FLEX_BG: u32 = 0x200;
    pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
    pub const INCOMPAT_LARGEDIR: u32 = 0x4000;

    pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
    pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
    pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
    pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
    pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
    pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
    pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
    pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

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

    /// Names of incompat bits, for refusal messages.
    pub fn incompat_name(bit: u32) -> &'static str {
        match bit {
            0x1 => "compression",
            0x2 => "filetype",
            0x4 => "needs_recovery",
            0x8 => "journal_dev",
            0x10 => "meta_bg",
            0x40 => "extent",
            0x80 => "64bit",
            0x100 => "mmp",
            0x200 => "flex_bg",
            0x400 => "ea_inode",
            0x1000 => "dirdata",
            0x2000 => "metadata_csum_seed",
            0x4000 => "large_dir",
            0x8000 => "inline_data",
            0x10000 => "encrypt",
            0x20000 => "casefold",
            _ => "unknown",
        }
    }
    /// Names of ro_compat bits, for refusal messages.
    pub fn ro_compat_name(bit: u32) -> &'static str {
        match bit {
            0x1 => "sparse_super",
            0x2 => "large_file",
            0x4 => "btree_dir",
            0x8 => "huge_file",
            0x10 => "uninit_bg",
            0x20 => "dir_nlink",
            0x40 => "extra_isize",
            0x100 => "quota",
            0x200 => "bigalloc",
            0x400 => "metadata_csum",
            0x1000 => "read-only",
            0x2000 => "project",
            0x8000 => "verity",
            0x10000 => "orphan_present",
            _ => "unknown",
        }
    }
}

/// Group descriptor field offsets.
pub mod gd {
    pub const BLOCK_BITMAP_LO: usize = 0x0;
    pub const INODE_BITMAP_LO: usize = 0x4;
    pub const INODE_TABLE_LO: usize = 0x8;
    pub const FREE_BLOCKS_LO: usize = 0xC;
    pub const FREE_INODES_LO: usize = 0xE;
    pub const USED_DIRS_LO: usize = 0x10;
    pub const FLAGS: usize = 0x12;
    pub const BLOCK_BITMAP_CSUM_LO: usize = 0x18;
    pub const INODE_BITMAP_CSUM_LO: usize = 0x1A;
    pub const ITABLE_UNUSED_LO: usize = 0x1C;
    pub const CHECKSUM: usize = 0x1E;
    pub const BLOCK_BITMAP_HI: usize = 0x20;
    pub const INODE_BITMAP_HI: usize = 0x24;
    pub const INODE_TABLE_HI: usize = 0x28;
    pub const FREE_BLOCKS_HI: usize = 0x2C;
    pub const FREE_INODES_HI: usize = 0x2E;
    pub const USED_DIRS_HI: usize = 0x30;
    pub const ITABLE_UNUSED_HI: usize = 0x32;
    pub const BLOCK_BITMAP_CSUM_HI: usize = 0x38;
    pub const INODE_BITMAP_CSUM_HI: usize = 0x3A;

    pub const FLAG_INODE_UNINIT: u16 = 0x1;
    pub const FLAG_BLOCK_UNINIT: u16 = 0x2;
    pub const FLAG_INODE_ZEROED: u16 = 0x4;
}

/// Inode field offsets.
pub mod ino {
    pub const MODE: usize = 0x0;
    pub const UID: usize = 0x2;
    pub const SIZE_LO: usize = 0x4;
    pub const ATIME: usize = 0x8;
    pub const CTIME: usize = 0xC;
    pub const MTIME: usize = 0x10;
    pub const DTIME: usize = 0x14;
    pub const GID: usize = 0x18;
    pub const LINKS: usize = 0x1A;
    pub const BLOCKS_LO: usize = 0x1C;
    pub const FLAGS: usize = 0x20;
    pub const BLOCK: usize = 0x28;
    pub const BLOCK_LEN: usize = 60;
    pub const GENERATION: usize = 0x64;
    pub const FILE_ACL_LO: usize = 0x68;
    pub const SIZE_HI: usize = 0x6C;
    pub const BLOCKS_HI: usize = 0x74;
    pub const FILE_ACL_HI: usize = 0x76;
    pub const UID_HI: usize = 0x78;
    pub const GID_HI: usize = 0x7A;
    pub const CHECKSUM_LO: usize = 0x7C;
    pub const EXTRA_ISIZE: usize = 0x80;
    pub const CHECKSUM_HI: usize = 0x82;
    pub const CTIME_EXTRA: usize = 0x84;
    pub const MTIME_EXTRA: usize = 0x88;
    pub const ATIME_EXTRA: usize = 0x8C;
    pub const CRTIME: usize = 0x90;
    pub const CRTIME_EXTRA: usize = 0x94;

    pub const FL_INDEX: u32 = 0x1000;
    pub const FL_HUGE_FILE: u32 = 0x40000;
    pub const FL_EXTENTS: u32 = 0x80000;
    pub const FL_EA_INODE: u32 = 0x200000;
    pub const FL_INLINE_DATA: u32 = 0x1000_0000;
}

/// Directory entry constants.
pub mod dirent {
    /// Size of the checksum tail at the end of a leaf block.
    pub const TAIL_LEN: usize = 12;
    /// `det_reserved_ft` of the tail.
    pub const TAIL_FT: u8 = 0xDE;
    /// ext4 file-type codes.
    pub const FT_UNKNOWN: u8 = 0;
    pub const FT_REG: u8 = 1;
    pub const FT_DIR: u8 = 2;
    pub const FT_CHR: u8 = 3;
    pub const FT_BLK: u8 = 4;
    pub const FT_FIFO: u8 = 5;
    pub const FT_SOCK: u8 = 6;
    pub const FT_SYMLINK: u8 = 7;
    /// The record length an entry with a name of `name_len` bytes needs.
    pub fn rec_len_for(name_len: usize) -> usize {
        (8 + name_len + 3) & !3
    }
}

/// Extent-tree constants.
pub mod ext {
    pub const MAGIC: u16 = 0xF30A;
    /// Longest initialized extent.
    pub const MAX_INIT_LEN: u32 = 32768;
    /// Longest unwritten extent.
    pub const MAX_UNWRITTEN_LEN: u32 = 32767;
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
