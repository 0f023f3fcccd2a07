//! JBD2 on-disk structures: the journal superblock, block headers,
//! descriptor blocks and their tags, revoke blocks and commit blocks, with
//! their checksums, exactly as Linux `include/linux/jbd2.h` lays them out.
//!
//! Why byte-exact: an ordo journal must be replayable by the kernel and by
//! `e2fsck`, and ordo must replay theirs. Every multi-byte field of JBD2 is
//! **big-endian** (unlike ext4, which is little-endian): the format comes
//! from ext3's journal, which was designed to be byte-order independent.
//!
//! ```text
//!  journal block 0          1 .. maxlen-1 (circular log, from s_first)
//! +-----------------+  +------------+------+------+-----+--------+--------+
//! | superblock v2   |  | descriptor | copy | copy | ... | commit | revoke |...
//! | s_start, s_seq  |  | tags+uuid  |      |      |     |        |        |
//! +-----------------+  +------------+------+------+-----+--------+--------+
//! ```
//!
//! A transaction is: descriptor blocks, each followed by the copies of the
//! blocks its tags name; revoke blocks; and one commit block. Every block
//! that carries a header has the transaction id in `h_sequence`, which is
//! how recovery finds the end of the log. A copy whose first four bytes
//! are the JBD2 magic is *escaped* (the magic zeroed, the tag flagged) so
//! that recovery never mistakes it for a header.
//!
//! Checksums (feature `csum_v2` / `csum_v3`): every checksum is the
//! kernel's raw CRC32C (no pre- or post-inversion). The journal seed is
//! `crc32c(~0, s_uuid)`. The superblock is checksummed with seed `~0`
//! over its 1024 bytes; descriptor and revoke blocks carry a 4-byte tail
//! checksum over the whole block (tail zeroed); commit blocks carry
//! `h_chksum[0]` over the whole block (type, size and `h_chksum[0]`
//! zeroed); each tag checksums the copy as written in the journal, seeded
//! with the big-endian transaction id. Version 3 stores 32 bits per tag,
//! version 2 the low 16 bits.
//!
//! The older `COMPAT_CHECKSUM` (v1) feature, which the kernel uses when
//! the file system lacks `metadata_csum`, stores a big-endian CRC32 of the
//! transaction's descriptor and data blocks in the commit block;
//! [`crc32_be`] computes it so recovery can verify kernel journals too.

use crate::le::{be_u16_at, be_u32_at, be_u64_at, put_be_u16, put_be_u32, put_be_u64};
use crate::{FormatError, Result};

/// `h_magic` of every JBD2 block that carries a header.
pub const JBD2_MAGIC: u32 = 0xC03B_3998;

/// Size of the common block header (`journal_header_t`).
pub const HEADER_BYTES: usize = 12;
/// Size of the superblock structure (`journal_superblock_t`).
pub const SUPERBLOCK_BYTES: usize = 1024;
/// Byte offset of `s_checksum` in the superblock.
const SB_CHECKSUM_OFFSET: usize = 0xFC;
/// Size of the UUID that follows the first tag of a descriptor block.
pub const UUID_BYTES: usize = 16;
/// Size of the checksum tail of descriptor and revoke blocks.
pub const TAIL_BYTES: usize = 4;
/// Size of the revoke block header (`jbd2_journal_revoke_header_t`).
pub const REVOKE_HEADER_BYTES: usize = 16;
/// Default number of fast-commit blocks when `s_num_fc_blks` is zero.
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;

/// `h_blocktype` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockType {
    /// Descriptor block: tags naming the home locations of the copies that follow.
    Descriptor,
    /// Commit block: the transaction is complete.
    Commit,
    /// Version 1 superblock.
    SuperblockV1,
    /// Version 2 superblock (features, checksums).
    SuperblockV2,
    /// Revoke block: blocks whose earlier copies must not be replayed.
    Revoke,
    /// Fast-commit block (in the fast-commit area only).
    FastCommit,
}

impl BlockType {
    /// The on-disk value.
    pub fn to_raw(self) -> u32 {
        match self {
            BlockType::Descriptor => 1,
            BlockType::Commit => 2,
            BlockType::SuperblockV1 => 3,
            BlockType::SuperblockV2 => 4,
            BlockType::Revoke => 5,
            BlockType::FastCommit => 6,
        }
    }
    /// Decode an on-disk value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => BlockType::Descriptor,
            2 => BlockType::Commit,
            3 => BlockType::SuperblockV1,
            4 => BlockType::SuperblockV2,
            5 => BlockType::Revoke,
            6 => BlockType::FastCommit,
            _ => return None,
        })
    }
}

/// `s_feature_compat`: v1 CRC32 checksum of each transaction in its commit block.
pub const FEATURE_COMPAT_CHECKSUM: u32 = 0x1;
/// `s_feature_incompat`: revoke blocks may be present.
pub const FEATURE_INCOMPAT_REVOKE: u32 = 0x1;
/// `s_feature_incompat`: block numbers in tags and revoke records are 64-bit.
pub const FEATURE_INCOMPAT_64BIT: u32 = 0x2;
/// `s_feature_incompat`: commit block written without waiting for the data.
pub const FEATURE_INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
/// `s_feature_incompat`: checksums v2 (16-bit tag checksums).
pub const FEATURE_INCOMPAT_CSUM_V2: u32 = 0x8;
/// `s_feature_incompat`: checksums v3 (32-bit tag checksums).
pub const FEATURE_INCOMPAT_CSUM_V3: u32 = 0x10;
/// `s_feature_incompat`: a fast-commit area follows the log.
pub const FEATURE_INCOMPAT_FAST_COMMIT: u32 = 0x20;
/// Every incompatible feature ordo understands.
/// ordo's `mode=optimistic`: commit blocks carry a data-tag table
/// ([`encode_commit_with_data_tags`]) and were written without a flush
/// before them, so a replay must verify every tagged home block and stop
/// before the first transaction whose data did not reach the disk. Set
/// only while such transactions are live; the kernel and e2fsck refuse a
/// journal with it (an unknown incompatible feature) instead of replaying
/// it without the checks.
pub const FEATURE_INCOMPAT_ORDO_DATA_TAGS: u32 = 0x8000_0000;
/// The incompatible features ordo's journal code understands.
pub const FEATURE_INCOMPAT_KNOWN: u32 = FEATURE_INCOMPAT_REVOKE
    | FEATURE_INCOMPAT_64BIT
    | FEATURE_INCOMPAT_ASYNC_COMMIT
    | FEATURE_INCOMPAT_CSUM_V2
    | FEATURE_INCOMPAT_CSUM_V3
    | FEATURE_INCOMPAT_FAST_COMMIT
    | FEATURE_INCOMPAT_ORDO_DATA_TAGS;

/// `s_checksum_type` for CRC32C.
pub const CHECKSUM_TYPE_CRC32C: u8 = 4;
/// `h_chksum_type` of a v1 (`COMPAT_CHECKSUM`) commit block: CRC32.
pub const COMMIT_CHKSUM_TYPE_CRC32: u8 = 1;
/// `h_chksum_size` of a v1 commit block checksum.
pub const COMMIT_CHKSUM_SIZE_CRC32: u8 = 4;

/// Tag flag: the copy's first four bytes were the magic and are zeroed.
pub const TAG_FLAG_ESCAPE: u32 = 0x1;
/// Tag flag: no UUID follows this tag (same as the previous one).
pub const TAG_FLAG_SAME_UUID: u32 = 0x2;
/// Tag flag: block deleted by this transaction (unused by Linux).
pub const TAG_FLAG_DELETED: u32 = 0x4;
/// Tag flag: last tag of the descriptor block.
pub const TAG_FLAG_LAST_TAG: u32 = 0x8;

/// The kernel's `jbd2_chksum(seed, data)`: raw CRC32C, no inversions.
pub fn jbd2_crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The kernel's `crc32_be(seed, data)` (polynomial 0x04C11DB7, MSB first,
/// no inversions), used by the v1 `COMPAT_CHECKSUM` commit checksum.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc ^= (b as u32) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Transaction ids wrap around; `a` is after `b` when the signed distance
/// is positive (the kernel's `tid_gt`).
pub fn tid_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// `tid_geq`.
pub fn tid_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// The common header of every JBD2 metadata block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// What the block is.
    pub blocktype: BlockType,
    /// Transaction id (for the superblock: unused, 0).
    pub sequence: u32,
}

impl BlockHeader {
    /// Write the header at the start of `buf`.
    pub fn encode(&self, buf: &mut [u8]) {
        put_be_u32(buf, 0, JBD2_MAGIC);
        put_be_u32(buf, 4, self.blocktype.to_raw());
        put_be_u32(buf, 8, self.sequence);
    }
    /// Read a header; `None` when the magic is absent (not a JBD2 block, or
    /// an escaped or foreign data block).
    pub fn decode(buf: &[u8]) -> Result<Option<BlockHeader>> {
        if buf.len() < HEADER_BYTES {
            return Err(FormatError::new(
                "jbd2 header",
                format!("block of {} bytes is too short", buf.len()),
            ));
        }
        if be_u32_at(buf, 0) != JBD2_MAGIC {
            return Ok(None);
        }
        let raw = be_u32_at(buf, 4);
        let blocktype = BlockType::from_raw(raw).ok_or_else(|| {
            FormatError::new("jbd2 header h_blocktype", format!("unknown type {raw}"))
        })?;
        Ok(Some(BlockHeader {
            blocktype,
            sequence: be_u32_at(buf, 8),
        }))
    }
}

/// The journal superblock (`journal_superblock_t`), version 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSuperblock {
    /// Version 2 (features and checksums) or version 1.
    pub v2: bool,
    /// Journal block size in bytes (the file-system block size).
    pub block_size: u32,
    /// Total blocks in the journal, including the fast-commit area.
    pub maxlen: u32,
    /// First block of the log (1 for an internal journal).
    pub first: u32,
    /// First transaction id expected in the log.
    pub sequence: u32,
    /// Block of the log's tail (first live block); 0 means clean.
    pub start: u32,
    /// Error recorded by the file system (negative errno), 0 if none.
    pub errno: i32,
    /// `s_feature_compat`.
    pub feature_compat: u32,
    /// `s_feature_incompat`.
    pub feature_incompat: u32,
    /// `s_feature_ro_compat`.
    pub feature_ro_compat: u32,
    /// UUID of the journal (for an internal journal, the file system's).
    pub uuid: [u8; 16],
    /// Number of file systems sharing the journal (1 for internal).
    pub nr_users: u32,
    /// `s_dynsuper` (unused).
    pub dynsuper: u32,
    /// Limit of blocks per transaction (0: unlimited; unused by Linux).
    pub max_transaction: u32,
    /// Limit of data blocks per transaction (unused by Linux).
    pub max_trans_data: u32,
    /// `s_checksum_type` (4 = CRC32C when csum v2/v3).
    pub checksum_type: u8,
    /// Blocks of the fast-commit area (0: the default of 256 when the
    /// fast-commit feature is set).
    pub num_fc_blocks: u32,
    /// `s_head`: block of the log head at the last clean unmount (hint only).
    pub head: u32,
    /// `s_users`: 48 UUIDs, 768 bytes.
    pub users: Vec<u8>,
}

impl JournalSuperblock {
    /// A fresh v2 superblock as `mke2fs` writes it for an internal journal
    /// of `maxlen` blocks: clean (`s_start = 0`), sequence 1, one user,
    /// no features (the file system enables checksums and 64-bit at mount).
    pub fn new_internal(block_size: u32, maxlen: u32, uuid: [u8; 16]) -> Self {
        JournalSuperblock {
            v2: true,
            block_size,
            maxlen,
            first: 1,
            sequence: 1,
            start: 0,
            errno: 0,
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            uuid,
            nr_users: 1,
            dynsuper: 0,
            max_transaction: 0,
            max_trans_data: 0,
            checksum_type: 0,
            num_fc_blocks: 0,
            head: 0,
            users: vec![0u8; 768],
        }
    }

    /// Whether checksums v2 or v3 are enabled.
    pub fn csum_v2or3(&self) -> bool {
        self.v2
            && self.feature_incompat & (FEATURE_INCOMPAT_CSUM_V2 | FEATURE_INCOMPAT_CSUM_V3) != 0
    }

    /// The number of fast-commit blocks at the end of the journal (0 when
    /// the feature is off).
    pub fn fast_commit_blocks(&self) -> u32 {
        if self.v2 && self.feature_incompat & FEATURE_INCOMPAT_FAST_COMMIT != 0 {
            if self.num_fc_blocks == 0 {
                DEFAULT_FAST_COMMIT_BLOCKS
            } else {
                self.num_fc_blocks
            }
        } else {
            0
        }
    }

    /// One past the last block of the circular log (the kernel's `j_last`).
    pub fn log_end(&self) -> u32 {
        self.maxlen.saturating_sub(self.fast_commit_blocks())
    }

    /// The format parameters block encoders and decoders need.
    pub fn format(&self) -> JournalFormat {
        JournalFormat {
            block_size: self.block_size,
            feature_compat: if self.v2 { self.feature_compat } else { 0 },
            feature_incompat: if self.v2 { self.feature_incompat } else { 0 },
            uuid: self.uuid,
        }
    }

    /// Encode into a fresh block of `block_size` bytes (the rest zeroed).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; (self.block_size as usize).max(SUPERBLOCK_BYTES)];
        self.encode_into(&mut b);
        b
    }

    /// Write every field ordo knows over `buf` (at least 1024 bytes),
    /// leaving other bytes (padding, future fields) as they are, and
    /// recompute the checksum when csum v2/v3 is on.
    pub fn encode_into(&self, buf: &mut [u8]) {
        assert!(buf.len() >= SUPERBLOCK_BYTES);
        BlockHeader {
            blocktype: if self.v2 {
                BlockType::SuperblockV2
            } else {
                BlockType::SuperblockV1
            },
            sequence: 0,
        }
        .encode(buf);
        put_be_u32(buf, 0x0C, self.block_size);
        put_be_u32(buf, 0x10, self.maxlen);
        put_be_u32(buf, 0x14, self.first);
        put_be_u32(buf, 0x18, self.sequence);
        put_be_u32(buf, 0x1C, self.start);
        put_be_u32(buf, 0x20, self.errno as u32);
        put_be_u32(buf, 0x24, self.feature_compat);
        put_be_u32(buf, 0x28, self.feature_incompat);
        put_be_u32(buf, 0x2C, self.feature_ro_compat);
        buf[0x30..0x40].copy_from_slice(&self.uuid);
        put_be_u32(buf, 0x40, self.nr_users);
        put_be_u32(buf, 0x44, self.dynsuper);
        put_be_u32(buf, 0x48, self.max_transaction);
        put_be_u32(buf, 0x4C, self.max_trans_data);
        buf[0x50] = self.checksum_type;
        put_be_u32(buf, 0x54, self.num_fc_blocks);
        put_be_u32(buf, 0x58, self.head);
        let users = self.users.len().min(768);
        buf[0x100..0x100 + users].copy_from_slice(&self.users[..users]);
        if self.csum_v2or3() {
            put_be_u32(buf, SB_CHECKSUM_OFFSET, 0);
            let c = jbd2_crc32c(!0, &buf[..SUPERBLOCK_BYTES]);
            put_be_u32(buf, SB_CHECKSUM_OFFSET, c);
        }
    }

    /// The checksum the superblock in `buf` should carry.
    pub fn compute_checksum(buf: &[u8]) -> u32 {
        let mut copy = buf[..SUPERBLOCK_BYTES].to_vec();
        put_be_u32(&mut copy, SB_CHECKSUM_OFFSET, 0);
        jbd2_crc32c(!0, &copy)
    }

    /// Decode and validate a journal superblock (the first journal block).
    /// `fs_block_size` is the file system's block size, which an internal
    /// journal must share.
    pub fn decode(buf: &[u8], fs_block_size: u32) -> Result<Self> {
        if buf.len() < SUPERBLOCK_BYTES {
            return Err(FormatError::new(
                "jbd2 superblock",
                format!("buffer of {} bytes is too short", buf.len()),
            ));
        }
        if be_u32_at(buf, 0) != JBD2_MAGIC {
            return Err(FormatError::new(
                "jbd2 superblock h_magic",
                format!("{:#010x}, expected {:#010x}", be_u32_at(buf, 0), JBD2_MAGIC),
            ));
        }
        let v2 = match BlockType::from_raw(be_u32_at(buf, 4)) {
            Some(BlockType::SuperblockV2) => true,
            Some(BlockType::SuperblockV1) => false,
            _ => {
                return Err(FormatError::new(
                    "jbd2 superblock h_blocktype",
                    format!("{} is not a superblock type", be_u32_at(buf, 4)),
                ))
            }
        };
        let sb = JournalSuperblock {
            v2,
            block_size: be_u32_at(buf, 0x0C),
            maxlen: be_u32_at(buf, 0x10),
            first: be_u32_at(buf, 0x14),
            sequence: be_u32_at(buf, 0x18),
            start: be_u32_at(buf, 0x1C),
            errno: be_u32_at(buf, 0x20) as i32,
            feature_compat: be_u32_at(buf, 0x24),
            feature_incompat: be_u32_at(buf, 0x28),
            feature_ro_compat: be_u32_at(buf, 0x2C),
            uuid: buf[0x30..0x40].try_into().expect("16 bytes"),
            nr_users: be_u32_at(buf, 0x40),
            dynsuper: be_u32_at(buf, 0x44),
            max_transaction: be_u32_at(buf, 0x48),
            max_trans_data: be_u32_at(buf, 0x4C),
            checksum_type: buf[0x50],
            num_fc_blocks: be_u32_at(buf, 0x54),
            head: be_u32_at(buf, 0x58),
            users: buf[0x100..0x400].to_vec(),
        };
        if sb.block_size != fs_block_size {
            return Err(FormatError::new(
                "jbd2 superblock s_blocksize",
                format!(
                    "{} differs from the file system's {fs_block_size}",
                    sb.block_size
                ),
            ));
        }
        if sb.maxlen < 2 || sb.first == 0 || sb.first >= sb.log_end() {
            return Err(FormatError::new(
                "jbd2 superblock s_first/s_maxlen",
                format!(
                    "first {} and maxlen {} (log end {}) leave no log",
                    sb.first,
                    sb.maxlen,
                    sb.log_end()
                ),
            ));
        }
        if sb.start != 0 && (sb.start < sb.first || sb.start >= sb.log_end()) {
            return Err(FormatError::new(
                "jbd2 superblock s_start",
                format!(
                    "{} is outside the log [{}, {})",
                    sb.start,
                    sb.first,
                    sb.log_end()
                ),
            ));
        }
        if v2 {
            let unknown = sb.feature_incompat & !FEATURE_INCOMPAT_KNOWN;
            if unknown != 0 {
                return Err(FormatError::new(
                    "jbd2 superblock s_feature_incompat",
                    format!("unknown incompatible features {unknown:#x}"),
                ));
            }
            if sb.feature_incompat & FEATURE_INCOMPAT_CSUM_V2 != 0
                && sb.feature_incompat & FEATURE_INCOMPAT_CSUM_V3 != 0
            {
                return Err(FormatError::new(
                    "jbd2 superblock s_feature_incompat",
                    "both csum v2 and csum v3 are set",
                ));
            }
            if sb.csum_v2or3() {
                if sb.checksum_type != CHECKSUM_TYPE_CRC32C {
                    return Err(FormatError::new(
                        "jbd2 superblock s_checksum_type",
                        format!("{} is not crc32c (4)", sb.checksum_type),
                    ));
                }
                let stored = be_u32_at(buf, SB_CHECKSUM_OFFSET);
                let want = Self::compute_checksum(buf);
                if stored != want {
                    return Err(FormatError::new(
                        "jbd2 superblock s_checksum",
                        format!("stored {stored:#010x}, computed {want:#010x}"),
                    ));
                }
            }
        }
        Ok(sb)
    }
}

/// What encoders and decoders of log blocks need to know about a journal:
/// its block size, features and UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalFormat {
    /// Block size in bytes.
    pub block_size: u32,
    /// `s_feature_compat`.
    pub feature_compat: u32,
    /// `s_feature_incompat`.
    pub feature_incompat: u32,
    /// Journal UUID (checksum seed).
    pub uuid: [u8; 16],
}

impl JournalFormat {
    /// Checksums v3 (32-bit tag checksums).
    pub fn csum_v3(&self) -> bool {
        self.feature_incompat & FEATURE_INCOMPAT_CSUM_V3 != 0
    }
    /// Checksums v2 (16-bit tag checksums).
    pub fn csum_v2(&self) -> bool {
        self.feature_incompat & FEATURE_INCOMPAT_CSUM_V2 != 0
    }
    /// Either checksum version.
    pub fn csum_v2or3(&self) -> bool {
        self.csum_v2() || self.csum_v3()
    }
    /// v1 CRC32 commit checksums (only when neither v2 nor v3 is on).
    pub fn csum_v1(&self) -> bool {
        !self.csum_v2or3() && self.feature_compat & FEATURE_COMPAT_CHECKSUM != 0
    }
    /// 64-bit block numbers.
    pub fn is_64bit(&self) -> bool {
        self.feature_incompat & FEATURE_INCOMPAT_64BIT != 0
    }
    /// The checksum seed: `crc32c(~0, uuid)`.
    pub fn csum_seed(&self) -> u32 {
        jbd2_crc32c(!0, &self.uuid)
    }
    /// Bytes per descriptor tag (the kernel's `journal_tag_bytes`).
    pub fn tag_bytes(&self) -> usize {
        if self.csum_v3() {
            return 16;
        }
        let mut sz = 12;
        if self.csum_v2() {
            sz += 2;
        }
        if self.is_64bit() {
            sz
        } else {
            sz - 4
        }
    }
    /// Bytes of checksum tail at the end of descriptor and revoke blocks.
    pub fn tail_bytes(&self) -> usize {
        if self.csum_v2or3() {
            TAIL_BYTES
        } else {
            0
        }
    }
    /// Bytes per revoke record.
    pub fn revoke_record_bytes(&self) -> usize {
        if self.is_64bit() {
            8
        } else {
            4
        }
    }
    /// How many tags one descriptor block written by ordo holds (the first
    /// tag is followed by the UUID).
    pub fn tags_per_descriptor(&self) -> usize {
        (self.block_size as usize - HEADER_BYTES - UUID_BYTES - self.tail_bytes())
            / self.tag_bytes()
    }
    /// How many records one revoke block holds.
    pub fn records_per_revoke(&self) -> usize {
        (self.block_size as usize - REVOKE_HEADER_BYTES - self.tail_bytes())
            / self.revoke_record_bytes()
    }
    /// The checksum of a tag: `crc32c(seed, be32 sequence, copy)` over the
    /// copy exactly as written in the journal (after escaping).
    pub fn tag_checksum(&self, sequence: u32, copy: &[u8]) -> u32 {
        let c = jbd2_crc32c(self.csum_seed(), &sequence.to_be_bytes());
        jbd2_crc32c(c, copy)
    }
    /// The tail checksum of a descriptor or revoke block (tail zeroed).
    fn tail_checksum(&self, block: &[u8]) -> u32 {
        let bs = self.block_size as usize;
        let mut c = jbd2_crc32c(self.csum_seed(), &block[..bs - TAIL_BYTES]);
        c = jbd2_crc32c(c, &[0u8; TAIL_BYTES]);
        c
    }
    /// Whether the tail checksum of a descriptor or revoke block is right
    /// (always true without csum v2/v3).
    pub fn verify_tail(&self, block: &[u8]) -> bool {
        if !self.csum_v2or3() {
            return true;
        }
        let bs = self.block_size as usize;
        block.len() >= bs && be_u32_at(block, bs - TAIL_BYTES) == self.tail_checksum(block)
    }
    fn set_tail(&self, block: &mut [u8]) {
        if self.csum_v2or3() {
            let bs = self.block_size as usize;
            let c = self.tail_checksum(block);
            put_be_u32(block, bs - TAIL_BYTES, c);
        }
    }
    fn check_len(&self, what: &'static str, block: &[u8]) -> Result<()> {
        if block.len() != self.block_size as usize {
            return Err(FormatError::new(
                what,
                format!(
                    "block of {} bytes, journal block size {}",
                    block.len(),
                    self.block_size
                ),
            ));
        }
        Ok(())
    }
}

/// One tag of a descriptor block: the home block of the copy that follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTag {
    /// Home block number (file-system block).
    pub blocknr: u64,
    /// The copy's first four bytes were the magic and are zeroed in the journal.
    pub escaped: bool,
    /// `TAG_FLAG_DELETED` (never written by ordo or Linux; kept for round trips).
    pub deleted: bool,
    /// Checksum of the copy (v3: 32 bits, v2: low 16 bits; 0 without csum).
    pub checksum: u32,
}

/// Encode a descriptor block of transaction `sequence` holding `tags` (at
/// most [`JournalFormat::tags_per_descriptor`]). The first tag carries the
/// UUID; the last is flagged `LAST_TAG`; the tail checksum is set.
pub fn encode_descriptor(fmt: &JournalFormat, sequence: u32, tags: &[BlockTag]) -> Vec<u8> {
    assert!(!tags.is_empty() && tags.len() <= fmt.tags_per_descriptor());
    let bs = fmt.block_size as usize;
    let mut b = vec![0u8; bs];
    BlockHeader {
        blocktype: BlockType::Descriptor,
        sequence,
    }
    .encode(&mut b);
    let mut off = HEADER_BYTES;
    for (i, t) in tags.iter().enumerate() {
        assert!(fmt.is_64bit() || t.blocknr <= u32::MAX as u64);
        let mut flags = 0u32;
        if t.escaped {
            flags |= TAG_FLAG_ESCAPE;
        }
        if t.deleted {
            flags |= TAG_FLAG_DELETED;
        }
        if i > 0 {
            flags |= TAG_FLAG_SAME_UUID;
        }
        if i + 1 == tags.len() {
            flags |= TAG_FLAG_LAST_TAG;
        }
        put_be_u32(&mut b, off, t.blocknr as u32);
        if fmt.csum_v3() {
            put_be_u32(&mut b, off + 4, flags);
            put_be_u32(&mut b, off + 8, (t.blocknr >> 32) as u32);
            put_be_u32(&mut b, off + 12, t.checksum);
        } else {
            put_be_u16(&mut b, off + 4, t.checksum as u16);
            put_be_u16(&mut b, off + 6, flags as u16);
            if fmt.is_64bit() {
                put_be_u32(&mut b, off + 8, (t.blocknr >> 32) as u32);
            }
        }
        off += fmt.tag_bytes();
        if i == 0 {
            b[off..off + UUID_BYTES].copy_from_slice(&fmt.uuid);
            off += UUID_BYTES;
        }
    }
    fmt.set_tail(&mut b);
    b
}

/// Decode the tags of a descriptor block as the kernel's recovery does
/// (`count_tags`): tags run until `LAST_TAG` or the end of the usable
/// space; a tag without `SAME_UUID` is followed by 16 bytes of UUID. The
/// header and the tail checksum are checked by the caller
/// ([`BlockHeader::decode`], [`JournalFormat::verify_tail`]).
pub fn decode_descriptor(fmt: &JournalFormat, block: &[u8]) -> Result<Vec<BlockTag>> {
    fmt.check_len("jbd2 descriptor", block)?;
    let size = block.len() - fmt.tail_bytes();
    let tag_bytes = fmt.tag_bytes();
    let mut off = HEADER_BYTES;
    let mut tags = Vec::new();
    while off + tag_bytes <= size {
        let lo = be_u32_at(block, off) as u64;
        let (flags, hi, checksum) = if fmt.csum_v3() {
            (
                be_u32_at(block, off + 4),
                be_u32_at(block, off + 8),
                be_u32_at(block, off + 12),
            )
        } else {
            let hi = if fmt.is_64bit() {
                be_u32_at(block, off + 8)
            } else {
                0
            };
            (
                be_u16_at(block, off + 6) as u32,
                hi,
                be_u16_at(block, off + 4) as u32,
            )
        };
        let blocknr = if fmt.is_64bit() {
            lo | ((hi as u64) << 32)
        } else {
            lo
        };
        tags.push(BlockTag {
            blocknr,
            escaped: flags & TAG_FLAG_ESCAPE != 0,
            deleted: flags & TAG_FLAG_DELETED != 0,
            checksum,
        });
        off += tag_bytes;
        if flags & TAG_FLAG_SAME_UUID == 0 {
            off += UUID_BYTES;
        }
        if flags & TAG_FLAG_LAST_TAG != 0 {
            break;
        }
    }
    if tags.is_empty() {
        return Err(FormatError::new("jbd2 descriptor tags", "no tag fits"));
    }
    Ok(tags)
}

/// Whether a tag's checksum matches the copy as read from the journal
/// (always true without csum v2/v3).
pub fn verify_tag(fmt: &JournalFormat, tag: &BlockTag, sequence: u32, copy: &[u8]) -> bool {
    if fmt.csum_v3() {
        tag.checksum == fmt.tag_checksum(sequence, copy)
    } else if fmt.csum_v2() {
        tag.checksum as u16 == fmt.tag_checksum(sequence, copy) as u16
    } else {
        true
    }
}

/// Escape a block image for the journal: when it begins with the magic,
/// zero those four bytes and return true (the tag must say `ESCAPE`).
pub fn escape(copy: &mut [u8]) -> bool {
    if copy.len() >= 4 && be_u32_at(copy, 0) == JBD2_MAGIC {
        copy[..4].fill(0);
        true
    } else {
        false
    }
}

/// Undo [`escape`] on a copy read from the journal.
pub fn unescape(copy: &mut [u8]) {
    put_be_u32(copy, 0, JBD2_MAGIC);
}

/// Encode a revoke block of transaction `sequence` (at most
/// [`JournalFormat::records_per_revoke`] blocks).
pub fn encode_revoke(fmt: &JournalFormat, sequence: u32, blocks: &[u64]) -> Vec<u8> {
    assert!(blocks.len() <= fmt.records_per_revoke());
    let bs = fmt.block_size as usize;
    let mut b = vec![0u8; bs];
    BlockHeader {
        blocktype: BlockType::Revoke,
        sequence,
    }
    .encode(&mut b);
    let rec = fmt.revoke_record_bytes();
    let mut off = REVOKE_HEADER_BYTES;
    for &blk in blocks {
        if rec == 8 {
            put_be_u64(&mut b, off, blk);
        } else {
            assert!(blk <= u32::MAX as u64);
            put_be_u32(&mut b, off, blk as u32);
        }
        off += rec;
    }
    put_be_u32(&mut b, HEADER_BYTES, off as u32);
    fmt.set_tail(&mut b);
    b
}

/// Decode the records of a revoke block (header and tail checksum are
/// checked by the caller).
pub fn decode_revoke(fmt: &JournalFormat, block: &[u8]) -> Result<Vec<u64>> {
    fmt.check_len("jbd2 revoke", block)?;
    let count = be_u32_at(block, HEADER_BYTES) as usize;
    let max = block.len() - fmt.tail_bytes();
    if count < REVOKE_HEADER_BYTES || count > max {
        return Err(FormatError::new(
            "jbd2 revoke r_count",
            format!("{count} bytes is outside [{REVOKE_HEADER_BYTES}, {max}]"),
        ));
    }
    let rec = fmt.revoke_record_bytes();
    let mut off = REVOKE_HEADER_BYTES;
    let mut out = Vec::with_capacity((count - off) / rec);
    while off + rec <= count {
        out.push(if rec == 8 {
            be_u64_at(block, off)
        } else {
            be_u32_at(block, off) as u64
        });
        off += rec;
    }
    Ok(out)
}

/// A decoded commit block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    /// Transaction id.
    pub sequence: u32,
    /// `h_chksum_type` (0 with csum v2/v3; 1 = CRC32 with v1).
    pub chksum_type: u8,
    /// `h_chksum_size`.
    pub chksum_size: u8,
    /// `h_chksum[0]`.
    pub chksum: u32,
    /// Commit time, seconds.
    pub commit_sec: u64,
    /// Commit time, nanoseconds.
    pub commit_nsec: u32,
}

const COMMIT_CHKSUM_TYPE_OFFSET: usize = 0x0C;
const COMMIT_CHKSUM_OFFSET: usize = 0x10;
const COMMIT_SEC_OFFSET: usize = 0x30;
const COMMIT_NSEC_OFFSET: usize = 0x38;

/// Encode the commit block of transaction `sequence`. `v1_crc32` is the
/// running CRC32 of the transaction's blocks, stored when the journal has
/// `COMPAT_CHECKSUM` and no v2/v3 (ordo itself never enables v1).
pub fn encode_commit(
    fmt: &JournalFormat,
    sequence: u32,
    commit_sec: u64,
    commit_nsec: u32,
    v1_crc32: Option<u32>,
) -> Vec<u8> {
    let mut b = vec![0u8; fmt.block_size as usize];
    BlockHeader {
        blocktype: BlockType::Commit,
        sequence,
    }
    .encode(&mut b);
    put_be_u64(&mut b, COMMIT_SEC_OFFSET, commit_sec);
    put_be_u32(&mut b, COMMIT_NSEC_OFFSET, commit_nsec);
    if fmt.csum_v1() {
        if let Some(c) = v1_crc32 {
            b[COMMIT_CHKSUM_TYPE_OFFSET] = COMMIT_CHKSUM_TYPE_CRC32;
            b[COMMIT_CHKSUM_TYPE_OFFSET + 1] = COMMIT_CHKSUM_SIZE_CRC32;
            put_be_u32(&mut b, COMMIT_CHKSUM_OFFSET, c);
        }
    }
    if fmt.csum_v2or3() {
        let c = commit_checksum(fmt, &b);
        put_be_u32(&mut b, COMMIT_CHKSUM_OFFSET, c);
    }
    b
}

fn commit_checksum(fmt: &JournalFormat, block: &[u8]) -> u32 {
    let mut copy = block.to_vec();
    copy[COMMIT_CHKSUM_TYPE_OFFSET] = 0;
    copy[COMMIT_CHKSUM_TYPE_OFFSET + 1] = 0;
    put_be_u32(&mut copy, COMMIT_CHKSUM_OFFSET, 0);
    jbd2_crc32c(fmt.csum_seed(), &copy)
}

/// Decode a commit block (the header is checked by the caller).
pub fn decode_commit(fmt: &JournalFormat, block: &[u8]) -> Result<CommitBlock> {
    fmt.check_len("jbd2 commit", block)?;
    Ok(CommitBlock {
        sequence: be_u32_at(block, 8),
        chksum_type: block[COMMIT_CHKSUM_TYPE_OFFSET],
        chksum_size: block[COMMIT_CHKSUM_TYPE_OFFSET + 1],
        chksum: be_u32_at(block, COMMIT_CHKSUM_OFFSET),
        commit_sec: be_u64_at(block, COMMIT_SEC_OFFSET),
        commit_nsec: be_u32_at(block, COMMIT_NSEC_OFFSET),
    })
}

/// Whether a commit block's v2/v3 checksum is right (always true without
/// csum v2/v3; the v1 CRC32 is checked against the transaction by recovery).
pub fn verify_commit(fmt: &JournalFormat, block: &[u8]) -> bool {
    if !fmt.csum_v2or3() {
        return true;
    }
    block.len() == fmt.block_size as usize
        && be_u32_at(block, COMMIT_CHKSUM_OFFSET) == commit_checksum(fmt, block)
}

/// Bytes of a commit block's header (`struct commit_header`: the block
/// header, checksum type, size and values, commit time).
pub const COMMIT_HEADER_BYTES: usize = 60;

/// Offset of the data-tag table in a commit block (after the header,
/// 8-byte aligned). The kernel and e2fsck read nothing past the header;
/// the v2/v3 commit checksum covers the whole block, table included.
pub const DATA_TAGS_OFFSET: usize = 0x40;
/// Magic of the data-tag table (`"ODTG"`).
pub const DATA_TAGS_MAGIC: u32 = 0x4F44_5447;
/// Bytes of the table's header: magic, count.
const DATA_TAGS_HEADER: usize = 8;
/// Bytes of one data tag: big-endian home block (8), big-endian CRC32C
/// of the block's contents (4).
pub const DATA_TAG_BYTES: usize = 12;

/// One data tag: a block of file data written in place (not journaled)
/// by the transaction, and the checksum its contents must have for the
/// transaction to be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataTag {
    /// Home block.
    pub block: u64,
    /// [`JournalFormat::data_checksum`] of its contents.
    pub checksum: u32,
}

impl JournalFormat {
    /// How many data tags one commit block holds.
    pub fn data_tags_per_commit(&self) -> usize {
        (self.block_size as usize).saturating_sub(DATA_TAGS_OFFSET + DATA_TAGS_HEADER)
            / DATA_TAG_BYTES
    }
    /// The checksum a data tag carries: CRC32C of the contents, seeded by
    /// the journal's UUID (not by the transaction id: a block's contents
    /// are compared across transactions at replay).
    pub fn data_checksum(&self, data: &[u8]) -> u32 {
        jbd2_crc32c(self.csum_seed(), data)
    }
}

/// [`encode_commit`] of a commit block that also carries `tags` (at most
/// [`JournalFormat::data_tags_per_commit`]) in its table, under the commit
/// checksum. Needs csum v2/v3: without a commit checksum the table would
/// be unprotected.
pub fn encode_commit_with_data_tags(
    fmt: &JournalFormat,
    sequence: u32,
    commit_sec: u64,
    commit_nsec: u32,
    tags: &[DataTag],
) -> Result<Vec<u8>> {
    if !fmt.csum_v2or3() {
        return Err(FormatError::new(
            "jbd2 commit data tags",
            "a data-tag table needs journal checksums v2 or v3",
        ));
    }
    if tags.len() > fmt.data_tags_per_commit() {
        return Err(FormatError::new(
            "jbd2 commit data tags",
            format!(
                "{} tags do not fit in one commit block ({} do)",
                tags.len(),
                fmt.data_tags_per_commit()
            ),
        ));
    }
    let mut b = encode_commit(fmt, sequence, commit_sec, commit_nsec, None);
    put_be_u32(&mut b, DATA_TAGS_OFFSET, DATA_TAGS_MAGIC);
    put_be_u32(&mut b, DATA_TAGS_OFFSET + 4, tags.len() as u32);
    for (i, t) in tags.iter().enumerate() {
        let at = DATA_TAGS_OFFSET + DATA_TAGS_HEADER + i * DATA_TAG_BYTES;
        put_be_u64(&mut b, at, t.block);
        put_be_u32(&mut b, at + 8, t.checksum);
    }
    let c = commit_checksum(fmt, &b);
    put_be_u32(&mut b, COMMIT_CHKSUM_OFFSET, c);
    Ok(b)
}

/// The data tags of a commit block (empty when it has no table: a plain
/// JBD2 commit block is zeros after its header). The caller verifies the
/// commit checksum first; a table that claims more tags than fit is an
/// error.
pub fn decode_data_tags(fmt: &JournalFormat, block: &[u8]) -> Result<Vec<DataTag>> {
    fmt.check_len("jbd2 commit", block)?;
    if be_u32_at(block, DATA_TAGS_OFFSET) != DATA_TAGS_MAGIC {
        return Ok(Vec::new());
    }
    let n = be_u32_at(block, DATA_TAGS_OFFSET + 4) as usize;
    if n > fmt.data_tags_per_commit() {
        return Err(FormatError::new(
            "jbd2 commit data-tag count",
            format!("{n} tags, at most {} fit", fmt.data_tags_per_commit()),
        ));
    }
    Ok((0..n)
        .map(|i| {
            let at = DATA_TAGS_OFFSET + DATA_TAGS_HEADER + i * DATA_TAG_BYTES;
            DataTag {
                block: be_u64_at(block, at),
                checksum: be_u32_at(block, at + 8),
            }
        })
        .collect())
}

/// Whether a commit block whose [`verify_commit`] fails is a torn write of
/// a valid one: its checksum verifies over its header followed by zeros,
/// which is the block JBD2 wrote (a commit block is its header and zeros),
/// so only sectors after the first failed to reach the disk. The kernel's
/// recovery accepts such a block as the commit
/// (`jbd2_commit_block_csum_verify_partial`). Always false without csum
/// v2/v3.
pub fn verify_commit_header(fmt: &JournalFormat, block: &[u8]) -> bool {
    if !fmt.csum_v2or3() || block.len() != fmt.block_size as usize {
        return false;
    }
    let mut copy = vec![0u8; block.len()];
    copy[..COMMIT_HEADER_BYTES].copy_from_slice(&block[..COMMIT_HEADER_BYTES]);
    be_u32_at(&copy, COMMIT_CHKSUM_OFFSET) == commit_checksum(fmt, &copy)
}

/// The next block of the circular log `first..last` after `b`: the log
/// wraps from its last block back to `first` (journal block 0 is the
/// superblock, and blocks from `last` on are the fast-commit area).
pub fn log_next(first: u32, last: u32, b: u32) -> u32 {
    debug_assert!(first < last);
    if b + 1 >= last {
        first
    } else {
        b + 1
    }
}

/// One block of a transaction's body, in log order, as
/// [`TransactionWriter::body`] lays it out. Copies are named by their index
/// in the caller's list rather than copied, so that a writer holding shared
/// images (the commit path's `Arc`s) writes them without a clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyBlock {
    /// A descriptor or revoke block, encoded.
    Encoded(Vec<u8>),
    /// Copy `index` of the caller's list, written as it is.
    Copy(usize),
    /// Copy `index` of the caller's list, escaped: its first four bytes
    /// were the magic and are zeroed here (its tag says `ESCAPE`).
    Escaped(usize, Vec<u8>),
}

/// The one encoder of a JBD2 transaction: descriptor blocks, each followed
/// by the (escaped) copies its tags name, with per-copy tag checksums;
/// revoke blocks; one commit block. Both ordo's journal commit and its
/// fast-commit replay (which writes its result as a transaction) use it,
/// so the two can never disagree on the bytes the kernel and e2fsck read.
///
/// The writer only encodes; where each block goes in the log (after the
/// live log, wrapping with [`log_next`]) and when to flush is the caller's,
/// since the flushes are what make the transaction atomic.
#[derive(Clone, Copy, Debug)]
pub struct TransactionWriter {
    fmt: JournalFormat,
    sequence: u32,
}

impl TransactionWriter {
    /// A writer for transaction `sequence` of a journal of format `fmt`.
    pub fn new(fmt: &JournalFormat, sequence: u32) -> Self {
        TransactionWriter {
            fmt: *fmt,
            sequence,
        }
    }

    /// Log blocks a transaction of `copies` copies and `revokes` revoke
    /// records takes, commit block included.
    pub fn log_blocks(&self, copies: usize, revokes: usize) -> u64 {
        let d = copies.div_ceil(self.fmt.tags_per_descriptor().max(1));
        let r = revokes.div_ceil(self.fmt.records_per_revoke().max(1));
        (d + copies + r + 1) as u64
    }

    /// The body of the transaction in log order: for each run of at most
    /// [`JournalFormat::tags_per_descriptor`] copies, a descriptor then the
    /// copies; then the revoke blocks. `copies` are (home block, image).
    pub fn body(&self, copies: &[(u64, &[u8])], revoked: &[u64]) -> Vec<BodyBlock> {
        let fmt = &self.fmt;
        let per = fmt.tags_per_descriptor().max(1);
        let mut out = Vec::with_capacity(self.log_blocks(copies.len(), revoked.len()) as usize);
        for (c, chunk) in copies.chunks(per).enumerate() {
            let mut tags = Vec::with_capacity(chunk.len());
            let mut imgs = Vec::with_capacity(chunk.len());
            for (i, &(blocknr, copy)) in chunk.iter().enumerate() {
                let index = c * per + i;
                let (block, escaped) = if copy.len() >= 4 && be_u32_at(copy, 0) == JBD2_MAGIC {
                    let mut e = copy.to_vec();
                    let escaped = escape(&mut e);
                    debug_assert!(escaped);
                    (BodyBlock::Escaped(index, e), true)
                } else {
                    (BodyBlock::Copy(index), false)
                };
                // The checksum covers the copy as the journal holds it.
                let checksum = if fmt.csum_v2or3() {
                    match &block {
                        BodyBlock::Escaped(_, e) => fmt.tag_checksum(self.sequence, e),
                        _ => fmt.tag_checksum(self.sequence, copy),
                    }
                } else {
                    0
                };
                tags.push(BlockTag {
                    blocknr,
                    escaped,
                    deleted: false,
                    checksum,
                });
                imgs.push(block);
            }
            out.push(BodyBlock::Encoded(encode_descriptor(
                fmt,
                self.sequence,
                &tags,
            )));
            out.extend(imgs);
        }
        for chunk in revoked.chunks(fmt.records_per_revoke().max(1)) {
            out.push(BodyBlock::Encoded(encode_revoke(fmt, self.sequence, chunk)));
        }
        out
    }

    /// The commit block, stamped with the given commit time.
    pub fn commit(&self, commit_sec: u64, commit_nsec: u32) -> Vec<u8> {
        encode_commit(&self.fmt, self.sequence, commit_sec, commit_nsec, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(incompat: u32) -> JournalFormat {
        JournalFormat {
            block_size: 4096,
            feature_compat: 0,
            feature_incompat: incompat,
            uuid: *b"0123456789abcdef",
        }
    }

    const V3_64: u32 = FEATURE_INCOMPAT_CSUM_V3 | FEATURE_INCOMPAT_64BIT | FEATURE_INCOMPAT_REVOKE;

    #[test]
    fn data_tags_round_trip_under_the_commit_checksum() {
        let f = fmt(V3_64);
        assert_eq!(f.data_tags_per_commit(), 335);
        let tags: Vec<DataTag> = (0..f.data_tags_per_commit() as u64)
            .map(|i| DataTag {
                block: 1000 + i,
                checksum: f.data_checksum(&[i as u8; 64]),
            })
            .collect();
        let b = encode_commit_with_data_tags(&f, 7, 1, 2, &tags).unwrap();
        assert!(verify_commit(&f, &b));
        assert_eq!(decode_data_tags(&f, &b).unwrap(), tags);
        // A flipped bit in the table breaks the commit checksum.
        let mut bad = b.clone();
        bad[DATA_TAGS_OFFSET + 20] ^= 1;
        assert!(!verify_commit(&f, &bad));
        // A plain commit block has no table; too many tags do not fit.
        assert!(decode_data_tags(&f, &encode_commit(&f, 7, 1, 2, None))
            .unwrap()
            .is_empty());
        let mut more = tags.clone();
        more.push(tags[0]);
        assert!(encode_commit_with_data_tags(&f, 7, 1, 2, &more).is_err());
        let mut lying = b;
        put_be_u32(&mut lying, DATA_TAGS_OFFSET + 4, 10_000);
        assert!(decode_data_tags(&f, &lying).is_err());
        // No table without journal checksums.
        assert!(encode_commit_with_data_tags(&fmt(0), 7, 1, 2, &tags[..1]).is_err());
    }

    #[test]
    fn transaction_writer_lays_out_descriptors_copies_and_revokes() {
        let f = fmt(V3_64);
        let per = f.tags_per_descriptor();
        let plain = vec![7u8; 4096];
        let mut magic = vec![1u8; 4096];
        magic[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let copies: Vec<(u64, &[u8])> = (0..per + 1)
            .map(|i| (100 + i as u64, if i == 1 { &magic[..] } else { &plain[..] }))
            .collect();
        let w = TransactionWriter::new(&f, 9);
        let body = w.body(&copies, &[5, 6]);
        assert_eq!(body.len() as u64 + 1, w.log_blocks(copies.len(), 2));
        let BodyBlock::Encoded(d) = &body[0] else {
            panic!("a descriptor first")
        };
        let tags = decode_descriptor(&f, d).unwrap();
        assert_eq!(tags.len(), per);
        assert!(tags[1].escaped && !tags[0].escaped);
        let BodyBlock::Escaped(1, e) = &body[2] else {
            panic!("copy 1 escaped")
        };
        assert!(verify_tag(&f, &tags[1], 9, e));
        assert_eq!(body[1], BodyBlock::Copy(0));
        assert!(matches!(body[per + 1], BodyBlock::Encoded(_)));
        assert_eq!(body[per + 2], BodyBlock::Copy(per));
        let BodyBlock::Encoded(r) = &body[per + 3] else {
            panic!("a revoke block last")
        };
        assert_eq!(decode_revoke(&f, r).unwrap(), vec![5, 6]);
        assert!(verify_commit(&f, &w.commit(1, 2)));
    }

    #[test]
    fn crc32_be_check_value() {
        // CRC-32/MPEG-2 ("123456789", init ~0, no final xor) is 0x0376E6E7.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }

    #[test]
    fn tag_sizes_match_the_kernel() {
        assert_eq!(fmt(FEATURE_INCOMPAT_CSUM_V3).tag_bytes(), 16);
        assert_eq!(fmt(V3_64).tag_bytes(), 16);
        assert_eq!(fmt(0).tag_bytes(), 8);
        assert_eq!(fmt(FEATURE_INCOMPAT_64BIT).tag_bytes(), 12);
        assert_eq!(fmt(FEATURE_INCOMPAT_CSUM_V2).tag_bytes(), 10);
        assert_eq!(
            fmt(FEATURE_INCOMPAT_CSUM_V2 | FEATURE_INCOMPAT_64BIT).tag_bytes(),
            14
        );
        assert_eq!(fmt(V3_64).tags_per_descriptor(), (4096 - 12 - 16 - 4) / 16);
    }

    #[test]
    fn superblock_round_trip_and_checksum() {
        let mut sb = JournalSuperblock::new_internal(4096, 1024, [7; 16]);
        sb.feature_incompat = V3_64;
        sb.checksum_type = CHECKSUM_TYPE_CRC32C;
        sb.start = 5;
        sb.sequence = 0xFFFF_FFF0;
        let b = sb.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..4], &[0xC0, 0x3B, 0x39, 0x98]);
        let back = JournalSuperblock::decode(&b, 4096).unwrap();
        assert_eq!(back, sb);
        let mut bad = b.clone();
        bad[0x18] ^= 1;
        let e = JournalSuperblock::decode(&bad, 4096).unwrap_err();
        assert_eq!(e.field, "jbd2 superblock s_checksum");
        assert!(JournalSuperblock::decode(&b, 1024).is_err());
    }

    #[test]
    fn superblock_rejects_bad_geometry() {
        let mut sb = JournalSuperblock::new_internal(1024, 1024, [1; 16]);
        sb.start = 2000;
        assert!(JournalSuperblock::decode(&sb.encode(), 1024).is_err());
        sb.start = 0;
        sb.first = 0;
        assert!(JournalSuperblock::decode(&sb.encode(), 1024).is_err());
        let mut b = JournalSuperblock::new_internal(1024, 1024, [1; 16]).encode();
        b[0x28..0x2C].copy_from_slice(&0x8000u32.to_be_bytes());
        assert!(JournalSuperblock::decode(&b, 1024).is_err());
        assert!(JournalSuperblock::decode(&[0u8; 100], 1024).is_err());
    }

    #[test]
    fn fast_commit_area_shortens_the_log() {
        let mut sb = JournalSuperblock::new_internal(4096, 1024, [1; 16]);
        assert_eq!(sb.log_end(), 1024);
        sb.feature_incompat = FEATURE_INCOMPAT_FAST_COMMIT;
        assert_eq!(sb.log_end(), 1024 - 256);
        sb.num_fc_blocks = 64;
        assert_eq!(sb.log_end(), 960);
    }

    #[test]
    fn descriptor_round_trip_every_tag_format() {
        for incompat in [
            0,
            FEATURE_INCOMPAT_64BIT,
            FEATURE_INCOMPAT_CSUM_V2,
            FEATURE_INCOMPAT_CSUM_V2 | FEATURE_INCOMPAT_64BIT,
            FEATURE_INCOMPAT_CSUM_V3,
            V3_64,
        ] {
            let f = fmt(incompat);
            let n = f.tags_per_descriptor();
            let tags: Vec<BlockTag> = (0..n as u64)
                .map(|i| BlockTag {
                    blocknr: if f.is_64bit() { (i << 33) | i } else { i * 7 },
                    escaped: i % 3 == 0,
                    deleted: false,
                    checksum: if f.csum_v3() {
                        0xDEAD_0000 | i as u32
                    } else if f.csum_v2() {
                        i as u32 & 0xFFFF
                    } else {
                        0
                    },
                })
                .collect();
            let b = encode_descriptor(&f, 42, &tags);
            assert_eq!(
                BlockHeader::decode(&b).unwrap(),
                Some(BlockHeader {
                    blocktype: BlockType::Descriptor,
                    sequence: 42
                })
            );
            assert!(f.verify_tail(&b));
            assert_eq!(
                decode_descriptor(&f, &b).unwrap(),
                tags,
                "incompat {incompat:#x}"
            );
            // One tag.
            let b1 = encode_descriptor(&f, 1, &tags[..1]);
            assert_eq!(decode_descriptor(&f, &b1).unwrap(), tags[..1].to_vec());
            // Corrupting any byte breaks the tail checksum.
            if f.csum_v2or3() {
                let mut bad = b.clone();
                bad[100] ^= 0x40;
                assert!(!f.verify_tail(&bad));
            }
        }
    }

    #[test]
    fn revoke_round_trip() {
        for incompat in [0, FEATURE_INCOMPAT_64BIT, V3_64, FEATURE_INCOMPAT_CSUM_V3] {
            let f = fmt(incompat);
            let n = f.records_per_revoke();
            let blocks: Vec<u64> = (0..n as u64)
                .map(|i| if f.is_64bit() { (1 << 40) + i } else { i + 9 })
                .collect();
            let b = encode_revoke(&f, 9, &blocks);
            assert!(f.verify_tail(&b));
            assert_eq!(decode_revoke(&f, &b).unwrap(), blocks);
            let empty = encode_revoke(&f, 9, &[]);
            assert_eq!(decode_revoke(&f, &empty).unwrap(), Vec::<u64>::new());
            let mut bad = b.clone();
            bad[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&5000u32.to_be_bytes());
            assert!(decode_revoke(&f, &bad).is_err());
        }
    }

    #[test]
    fn commit_round_trip_and_checksum() {
        let f = fmt(V3_64);
        let b = encode_commit(&f, 77, 1_700_000_000, 123, None);
        let c = decode_commit(&f, &b).unwrap();
        assert_eq!(c.sequence, 77);
        assert_eq!(c.commit_sec, 1_700_000_000);
        assert_eq!(c.commit_nsec, 123);
        assert_eq!((c.chksum_type, c.chksum_size), (0, 0));
        assert!(verify_commit(&f, &b));
        let mut bad = b.clone();
        bad[COMMIT_SEC_OFFSET + 7] ^= 1;
        assert!(!verify_commit(&f, &bad));
        let mut v1 = fmt(0);
        v1.feature_compat = FEATURE_COMPAT_CHECKSUM;
        let b = encode_commit(&v1, 3, 0, 0, Some(0x1234_5678));
        let c = decode_commit(&v1, &b).unwrap();
        assert_eq!(
            (c.chksum_type, c.chksum_size, c.chksum),
            (1, 4, 0x1234_5678)
        );
    }

    #[test]
    fn a_commit_block_torn_after_its_header_verifies_by_its_header() {
        let f = fmt(V3_64);
        let b = encode_commit(&f, 9, 1_700_000_000, 5, None);
        assert!(verify_commit_header(&f, &b));
        // The sectors after the first still hold an old block's bytes.
        let mut torn = b.clone();
        torn[512..].fill(0xA5);
        assert!(!verify_commit(&f, &torn));
        assert!(verify_commit_header(&f, &torn));
        // Damage inside the header is still damage.
        let mut bad = torn.clone();
        bad[COMMIT_SEC_OFFSET] ^= 1;
        assert!(!verify_commit_header(&f, &bad));
        // Without block checksums there is nothing to check it by.
        let mut v1 = fmt(0);
        v1.feature_compat = FEATURE_COMPAT_CHECKSUM;
        assert!(!verify_commit_header(
            &v1,
            &encode_commit(&v1, 9, 0, 0, Some(1))
        ));
    }

    #[test]
    fn escaping() {
        let mut blk = vec![0u8; 64];
        blk[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        blk[4] = 9;
        let orig = blk.clone();
        assert!(escape(&mut blk));
        assert_eq!(&blk[..4], &[0, 0, 0, 0]);
        assert_eq!(BlockHeader::decode(&blk).unwrap(), None);
        unescape(&mut blk);
        assert_eq!(blk, orig);
        let mut plain = vec![1u8; 64];
        assert!(!escape(&mut plain));
        assert_eq!(plain, vec![1u8; 64]);
    }

    #[test]
    fn tag_checksum_depends_on_sequence_and_data() {
        let f = fmt(V3_64);
        let data = vec![5u8; 4096];
        let c = f.tag_checksum(1, &data);
        assert_ne!(c, f.tag_checksum(2, &data));
        let tag = BlockTag {
            blocknr: 1,
            escaped: false,
            deleted: false,
            checksum: c,
        };
        assert!(verify_tag(&f, &tag, 1, &data));
        assert!(!verify_tag(&f, &tag, 2, &data));
    }

    #[test]
    fn tid_comparison_wraps() {
        assert!(tid_gt(1, 0));
        assert!(tid_gt(0, u32::MAX));
        assert!(!tid_gt(5, 5));
        assert!(tid_geq(5, 5));
        assert!(!tid_gt(u32::MAX, 0));
    }

    #[test]
    fn decoders_never_panic_on_garbage() {
        let f = fmt(V3_64);
        for seed in 0u32..200 {
            let mut b = vec![0u8; 4096];
            let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *byte = x as u8;
            }
            b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
            let _ = BlockHeader::decode(&b);
            let _ = decode_descriptor(&f, &b);
            let _ = decode_revoke(&f, &b);
            let _ = decode_commit(&f, &b);
            let _ = JournalSuperblock::decode(&b, 4096);
            let _ = decode_descriptor(&fmt(0), &b);
        }
        assert!(decode_descriptor(&f, &[0u8; 10]).is_err());
    }
}
