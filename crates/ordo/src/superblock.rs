//! A read-only look at an image's primary superblock, for `ordo info` and
//! for finding the block size before the device is opened.
//!
//! Reading the few fields `dumpe2fs -h` prints needs no file system: the
//! superblock sits at byte 1024 whatever the block size, and its layout is
//! fixed (`struct ext2_super_block` in e2fsprogs' `ext2_fs.h`, whose byte
//! offsets `ordo_format::superblock::off` declares).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ordo_format::features::FeatureSet;
use ordo_format::le::{u16_at as le16, u32_at as le32, u64_at as le64};
use ordo_format::superblock::{off, STATE_ERROR, STATE_ORPHAN, STATE_VALID};

/// Byte offset of the primary superblock.
pub const SUPERBLOCK_OFFSET_BYTES: u64 = ordo_format::superblock::SUPERBLOCK_OFFSET;
/// Size of the superblock structure.
pub const SUPERBLOCK_SIZE_BYTES: usize = ordo_format::superblock::SUPERBLOCK_SIZE;
pub use ordo_format::superblock::EXT4_MAGIC;

/// The superblock fields `ordo info` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperblockView {
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub reserved_blocks_count: u64,
    pub free_blocks_count: u64,
    pub free_inodes_count: u32,
    pub first_data_block: u32,
    pub block_size: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub mount_time: u32,
    pub write_time: u32,
    pub mount_count: u16,
    pub max_mount_count: i16,
    pub state: u16,
    pub errors: u16,
    pub rev_level: u32,
    pub first_ino: u32,
    pub inode_size: u16,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub volume_name: String,
    pub last_mounted: String,
    pub journal_inum: u32,
    pub last_orphan: u32,
    pub desc_size: u16,
    pub mkfs_time: u32,
    pub flags: u32,
    pub checksum_type: u8,
    pub kbytes_written: u64,
    pub error_count: u32,
    pub checksum: u32,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The ways an image can fail to show a superblock.
#[derive(Debug)]
pub enum ProbeError {
    /// The image could not be read.
    Io(io::Error),
    /// The bytes at 1024 are not an ext4 superblock.
    NotExt4(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Io(e) => write!(f, "{e}"),
            ProbeError::NotExt4(d) => write!(f, "{d}"),
        }
    }
}

impl std::error::Error for ProbeError {}

impl SuperblockView {
    /// Decode the 1024 superblock bytes, checking the magic and the block
    /// size field.
    pub fn decode(b: &[u8]) -> Result<SuperblockView, ProbeError> {
        if b.len() < SUPERBLOCK_SIZE_BYTES {
            return Err(ProbeError::NotExt4(format!(
                "superblock: only {} bytes",
                b.len()
            )));
        }
        let magic = le16(b, off::MAGIC);
        if magic != EXT4_MAGIC {
            return Err(ProbeError::NotExt4(format!(
                "block 0 byte 1024: superblock s_magic is {magic:#06x}, not {EXT4_MAGIC:#06x}: not an ext4 image"
            )));
        }
        let log_block_size = le32(b, off::LOG_BLOCK_SIZE);
        if log_block_size > 6 {
            return Err(ProbeError::NotExt4(format!(
                "superblock s_log_block_size is {log_block_size} (block size would exceed 64 KiB)"
            )));
        }
        let incompat = le32(b, off::FEATURE_INCOMPAT);
        let is_64bit = incompat & ordo_format::features::incompat::INCOMPAT_64BIT != 0;
        let hi = |lo: u32, hi_off: usize| -> u64 {
            u64::from(lo)
                | if is_64bit {
                    u64::from(le32(b, hi_off)) << 32
                } else {
                    0
                }
        };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[off::UUID..off::UUID + 16]);
        Ok(SuperblockView {
            inodes_count: le32(b, off::INODES_COUNT),
            blocks_count: hi(le32(b, off::BLOCKS_COUNT_LO), off::BLOCKS_COUNT_HI),
            reserved_blocks_count: hi(le32(b, off::R_BLOCKS_COUNT_LO), off::R_BLOCKS_COUNT_HI),
            free_blocks_count: hi(
                le32(b, off::FREE_BLOCKS_COUNT_LO),
                off::FREE_BLOCKS_COUNT_HI,
            ),
            free_inodes_count: le32(b, off::FREE_INODES_COUNT),
            first_data_block: le32(b, off::FIRST_DATA_BLOCK),
            block_size: 1024 << log_block_size,
            blocks_per_group: le32(b, off::BLOCKS_PER_GROUP),
            inodes_per_group: le32(b, off::INODES_PER_GROUP),
            mount_time: le32(b, off::MTIME),
            write_time: le32(b, off::WTIME),
            mount_count: le16(b, off::MNT_COUNT),
            max_mount_count: le16(b, off::MAX_MNT_COUNT) as i16,
            state: le16(b, off::STATE),
            errors: le16(b, off::ERRORS),
            rev_level: le32(b, off::REV_LEVEL),
            first_ino: le32(b, off::FIRST_INO),
            inode_size: le16(b, off::INODE_SIZE),
            feature_compat: le32(b, off::FEATURE_COMPAT),
            feature_incompat: incompat,
            feature_ro_compat: le32(b, off::FEATURE_RO_COMPAT),
            uuid,
            volume_name: cstr(&b[off::VOLUME_NAME..off::LAST_MOUNTED]),
            last_mounted: cstr(&b[off::LAST_MOUNTED..off::ALGORITHM_USAGE_BITMAP]),
            journal_inum: le32(b, off::JOURNAL_INUM),
            last_orphan: le32(b, off::LAST_ORPHAN),
            desc_size: le16(b, off::DESC_SIZE),
            mkfs_time: le32(b, off::MKFS_TIME),
            flags: le32(b, off::FLAGS),
            checksum_type: b[off::CHECKSUM_TYPE],
            kbytes_written: le64(b, off::KBYTES_WRITTEN),
            error_count: le32(b, off::ERROR_COUNT),
            checksum: le32(b, off::CHECKSUM),
        })
    }

    /// Read and decode the primary superblock of the image at `path`.
    pub fn read(path: &Path) -> Result<SuperblockView, ProbeError> {
        let file = File::open(path).map_err(ProbeError::Io)?;
        let mut buf = vec![0u8; SUPERBLOCK_SIZE_BYTES];
        file.read_exact_at(&mut buf, SUPERBLOCK_OFFSET_BYTES)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    ProbeError::NotExt4("image is smaller than 2 KiB: no superblock".into())
                } else {
                    ProbeError::Io(e)
                }
            })?;
        Self::decode(&buf)
    }

    /// Feature names in `dumpe2fs` order (compat, incompat, ro_compat),
    /// with unknown bits as `FEATURE_X0x...`.
    pub fn feature_names(&self) -> Vec<String> {
        FeatureSet {
            compat: self.feature_compat,
            incompat: self.feature_incompat,
            ro_compat: self.feature_ro_compat,
        }
        .names()
    }

    /// `s_state` as dumpe2fs words it.
    pub fn state_name(&self) -> String {
        let mut s = if self.state & STATE_VALID != 0 {
            "clean".to_string()
        } else {
            "not clean".to_string()
        };
        if self.state & STATE_ERROR != 0 {
            s.push_str(" with errors");
        }
        if self.state & STATE_ORPHAN != 0 {
            s.push_str(", orphans being processed");
        }
        s
    }

    /// The UUID in the usual 8-4-4-4-12 form.
    pub fn uuid_string(&self) -> String {
        let h: Vec<String> = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            h[0..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..16].concat()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_SIZE_BYTES];
        b[0x00..0x04].copy_from_slice(&1024u32.to_le_bytes());
        b[0x04..0x08].copy_from_slice(&16384u32.to_le_bytes());
        b[0x0C..0x10].copy_from_slice(&15000u32.to_le_bytes());
        b[0x10..0x14].copy_from_slice(&1000u32.to_le_bytes());
        b[0x18..0x1C].copy_from_slice(&2u32.to_le_bytes());
        b[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
        b[0x3A..0x3C].copy_from_slice(&1u16.to_le_bytes());
        b[0x5C..0x60].copy_from_slice(&0x0004u32.to_le_bytes()); // has_journal
        b[0x60..0x64].copy_from_slice(&0x0042u32.to_le_bytes()); // filetype, extent
        b[0x64..0x68].copy_from_slice(&0x8000_0000u32.to_le_bytes()); // unknown
        b[0x68] = 0xab;
        b[0x78..0x7C].copy_from_slice(b"demo");
        b
    }

    #[test]
    fn decodes_the_fields_info_prints() {
        let sb = SuperblockView::decode(&sample()).unwrap();
        assert_eq!(sb.block_size, 4096);
        assert_eq!(sb.blocks_count, 16384);
        assert_eq!(sb.free_blocks_count, 15000);
        assert_eq!(sb.inodes_count, 1024);
        assert_eq!(sb.volume_name, "demo");
        assert_eq!(sb.state_name(), "clean");
        assert!(sb.uuid_string().starts_with("ab000000-"));
        assert_eq!(
            sb.feature_names(),
            vec!["has_journal", "filetype", "extent", "FEATURE_R31"]
        );
    }

    #[test]
    fn refuses_a_bad_magic() {
        let mut b = sample();
        b[0x38] = 0;
        let e = SuperblockView::decode(&b).unwrap_err();
        assert!(e.to_string().contains("s_magic"), "{e}");
    }
}
