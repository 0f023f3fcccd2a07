//! ext4 extent-tree nodes: header, leaf extents, index entries, and the
//! tail checksum of a tree block.
//!
//! A file's block map is a B+tree. Its root is the 60 bytes of the inode's
//! `i_block`: a 12-byte header and room for 4 entries. Every other node is a
//! whole file-system block: the header, `(block_size - 12) / 12` entries,
//! and, right after the last *possible* entry (offset `12 + 12 * eh_max`), a
//! 4-byte crc32c of everything before it, seeded with the owning inode's
//! checksum seed (file-system seed, then the inode number, then its
//! generation). Nodes at depth 0 hold extents (`ee_*`); higher nodes hold
//! index entries (`ei_*`) whose key is the first logical block of the child.
//!
//! Everything here is pure encode / decode. Decoding validates what a node
//! can say about itself (magic, counts, depth, ordering, lengths); whether a
//! node fits its tree (depth of a child, index keys against children, block
//! numbers in range) is the tree walker's job in `ordo-fs`.
//!
//! ```text
//!  offset  header (12 bytes)        extent (12 bytes)        index (12 bytes)
//!   0      eh_magic   u16 0xF30A    ee_block    u32          ei_block   u32
//!   2      eh_entries u16
//!   4      eh_max     u16           ee_len      u16          ei_leaf_lo u32
//!   6      eh_depth   u16           ee_start_hi u16
//!   8      eh_generation u32        ee_start_lo u32          ei_leaf_hi u16
//!  10                                                        ei_unused  u16
//! ```

use crate::csum::{ext4_crc32c, inode_csum_seed};
use crate::le::{put_u16, put_u32, u16_at, u32_at};
use crate::{FormatError, Result};

/// `eh_magic`.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Size of the header and of every entry, in bytes.
pub const EXTENT_HEADER_SIZE: usize = 12;
/// Size of an extent or index entry, in bytes.
pub const EXTENT_ENTRY_SIZE: usize = 12;
/// Size of the tail checksum of a tree block, in bytes.
pub const EXTENT_TAIL_SIZE: usize = 4;
/// Size of the root node (the inode's `i_block`), in bytes.
pub const EXTENT_ROOT_SIZE: usize = 60;
/// Entries of the root node.
pub const EXTENT_ROOT_MAX_ENTRIES: u16 = 4;
/// Deepest tree ext4 accepts (`EXT4_MAX_EXTENT_DEPTH`).
pub const EXTENT_DEPTH_MAX: u16 = 5;
/// Longest initialized extent, in blocks (`EXT_INIT_MAX_LEN`).
pub const EXTENT_INIT_MAX_LEN: u32 = 32768;
/// Longest unwritten extent, in blocks (`EXT_UNWRITTEN_MAX_LEN`).
pub const EXTENT_UNWRITTEN_MAX_LEN: u32 = 32767;
/// Physical block numbers are 48-bit.
pub const EXTENT_PBLK_LIMIT: u64 = 1 << 48;
/// Logical block numbers are 32-bit: no extent reaches past this.
pub const EXTENT_LBLK_LIMIT: u64 = 1 << 32;

/// Entries a tree block of `block_size` bytes holds (`ext4_ext_space_block`).
pub fn block_max_entries(block_size: u32) -> u16 {
    let n = (block_size as usize).saturating_sub(EXTENT_HEADER_SIZE) / EXTENT_ENTRY_SIZE;
    n.min(u16::MAX as usize) as u16
}

/// Offset of the tail checksum in a node whose header says `max` entries.
pub fn tail_offset(max: u16) -> usize {
    EXTENT_HEADER_SIZE + EXTENT_ENTRY_SIZE * max as usize
}

/// Longest extent of the given kind, in blocks.
pub fn max_len(unwritten: bool) -> u32 {
    if unwritten {
        EXTENT_UNWRITTEN_MAX_LEN
    } else {
        EXTENT_INIT_MAX_LEN
    }
}

/// The 12-byte node header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentHeader {
    /// Valid entries that follow.
    pub entries: u16,
    /// Capacity of the node, in entries.
    pub max: u16,
    /// 0 for a leaf (entries are extents); otherwise entries are indexes.
    pub depth: u16,
    /// Unused by Linux (always written 0), preserved.
    pub generation: u32,
}

impl ExtentHeader {
    /// Decode and check the magic (the only check a header can make alone).
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() < EXTENT_HEADER_SIZE {
            return Err(FormatError::new(
                "extent header",
                format!("{} bytes, need {EXTENT_HEADER_SIZE}", b.len()),
            ));
        }
        let magic = u16_at(b, 0);
        if magic != EXTENT_MAGIC {
            return Err(FormatError::new(
                "extent header eh_magic",
                format!("{magic:#06x}, expected {EXTENT_MAGIC:#06x}"),
            ));
        }
        Ok(ExtentHeader {
            entries: u16_at(b, 2),
            max: u16_at(b, 4),
            depth: u16_at(b, 6),
            generation: u32_at(b, 8),
        })
    }

    /// Encode into the first 12 bytes of `b`.
    pub fn encode_into(&self, b: &mut [u8]) {
        put_u16(b, 0, EXTENT_MAGIC);
        put_u16(b, 2, self.entries);
        put_u16(b, 4, self.max);
        put_u16(b, 6, self.depth);
        put_u32(b, 8, self.generation);
    }
}

/// A leaf entry: `len` logical blocks from `lblk` map to physical blocks
/// from `pblk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExtentLeaf {
    /// First logical block (`ee_block`).
    pub lblk: u32,
    /// Length in blocks: 1..=32768 when written, 1..=32767 when unwritten.
    pub len: u32,
    /// Allocated but never written: reads return zeros.
    pub unwritten: bool,
    /// First physical block (`ee_start_hi:ee_start_lo`, 48 bits).
    pub pblk: u64,
}

impl ExtentLeaf {
    /// One past the last logical block.
    pub fn end(&self) -> u64 {
        u64::from(self.lblk) + u64::from(self.len)
    }

    /// Decode one 12-byte entry, checking its length and range.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let raw_len = u16_at(b, 4);
        let (len, unwritten) = if u32::from(raw_len) <= EXTENT_INIT_MAX_LEN {
            (u32::from(raw_len), false)
        } else {
            (u32::from(raw_len) - EXTENT_INIT_MAX_LEN, true)
        };
        if len == 0 {
            return Err(FormatError::new("extent ee_len", "zero length"));
        }
        let pblk = u64::from(u32_at(b, 8)) | (u64::from(u16_at(b, 6)) << 32);
        let e = ExtentLeaf {
            lblk: u32_at(b, 0),
            len,
            unwritten,
            pblk,
        };
        if e.end() > EXTENT_LBLK_LIMIT {
            return Err(FormatError::new(
                "extent ee_block",
                format!("extent {}+{} passes the last logical block", e.lblk, e.len),
            ));
        }
        Ok(e)
    }

    /// Encode into 12 bytes. Panics (an invariant, not input) when the
    /// length or physical block does not fit the on-disk fields.
    pub fn encode_into(&self, b: &mut [u8]) {
        assert!(
            self.len >= 1 && self.len <= max_len(self.unwritten),
            "extent length {} (unwritten {})",
            self.len,
            self.unwritten
        );
        assert!(self.pblk < EXTENT_PBLK_LIMIT, "extent pblk {}", self.pblk);
        let raw_len = if self.unwritten {
            self.len + EXTENT_INIT_MAX_LEN
        } else {
            self.len
        };
        put_u32(b, 0, self.lblk);
        put_u16(b, 4, raw_len as u16);
        put_u16(b, 6, (self.pblk >> 32) as u16);
        put_u32(b, 8, self.pblk as u32);
    }
}

/// An index entry: the child node at `child` holds the keys from `lblk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExtentIndex {
    /// First logical block covered by the child (`ei_block`).
    pub lblk: u32,
    /// Physical block of the child node (`ei_leaf_hi:ei_leaf_lo`, 48 bits).
    pub child: u64,
}

impl ExtentIndex {
    /// Decode one 12-byte entry.
    pub fn decode(b: &[u8]) -> Result<Self> {
        Ok(ExtentIndex {
            lblk: u32_at(b, 0),
            child: u64::from(u32_at(b, 4)) | (u64::from(u16_at(b, 8)) << 32),
        })
    }

    /// Encode into 12 bytes (`ei_unused` written 0).
    pub fn encode_into(&self, b: &mut [u8]) {
        assert!(self.child < EXTENT_PBLK_LIMIT, "index child {}", self.child);
        put_u32(b, 0, self.lblk);
        put_u32(b, 4, self.child as u32);
        put_u16(b, 8, (self.child >> 32) as u16);
        put_u16(b, 10, 0);
    }
}

/// The entries of a node: extents in a leaf, indexes above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtentEntries {
    Leaf(Vec<ExtentLeaf>),
    Index(Vec<ExtentIndex>),
}

impl ExtentEntries {
    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            ExtentEntries::Leaf(v) => v.len(),
            ExtentEntries::Index(v) => v.len(),
        }
    }
    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Key (first logical block) of entry `i`.
    pub fn key(&self, i: usize) -> u32 {
        match self {
            ExtentEntries::Leaf(v) => v[i].lblk,
            ExtentEntries::Index(v) => v[i].lblk,
        }
    }
}

/// A decoded node: a header and its valid entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentNode {
    /// `eh_max`, `eh_depth` and `eh_generation` (the entry count is
    /// `entries.len()`; `header.entries` always agrees after decode).
    pub header: ExtentHeader,
    pub entries: ExtentEntries,
}

impl ExtentNode {
    /// An empty leaf with room for `max` entries.
    pub fn empty_leaf(max: u16) -> Self {
        ExtentNode {
            header: ExtentHeader {
                entries: 0,
                max,
                depth: 0,
                generation: 0,
            },
            entries: ExtentEntries::Leaf(Vec::new()),
        }
    }

    /// Decode the root node from the inode's 60-byte `i_block`.
    pub fn decode_root(b: &[u8]) -> Result<Self> {
        if b.len() != EXTENT_ROOT_SIZE {
            return Err(FormatError::new(
                "extent root",
                format!("{} bytes, expected {EXTENT_ROOT_SIZE}", b.len()),
            ));
        }
        Self::decode_in(b, b.len())
    }

    /// Decode a tree block (the whole block; the tail is not verified here,
    /// see [`verify_tail`]).
    pub fn decode_block(b: &[u8]) -> Result<Self> {
        Self::decode_in(b, b.len().saturating_sub(EXTENT_TAIL_SIZE))
    }

    /// Decode a node whose header and entries must fit in `space` bytes.
    fn decode_in(b: &[u8], space: usize) -> Result<Self> {
        let header = ExtentHeader::decode(b)?;
        if header.max == 0 {
            return Err(FormatError::new("extent header eh_max", "zero"));
        }
        if tail_offset(header.max) > space {
            return Err(FormatError::new(
                "extent header eh_max",
                format!("{} entries do not fit in {space} bytes", header.max),
            ));
        }
        if header.entries > header.max {
            return Err(FormatError::new(
                "extent header eh_entries",
                format!("{} exceeds eh_max {}", header.entries, header.max),
            ));
        }
        if header.depth > EXTENT_DEPTH_MAX {
            return Err(FormatError::new(
                "extent header eh_depth",
                format!("{} exceeds {EXTENT_DEPTH_MAX}", header.depth),
            ));
        }
        let n = header.entries as usize;
        let entry = |i: usize| {
            let off = EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
            &b[off..off + EXTENT_ENTRY_SIZE]
        };
        let entries = if header.depth == 0 {
            let mut v: Vec<ExtentLeaf> = Vec::with_capacity(n);
            for i in 0..n {
                let e = ExtentLeaf::decode(entry(i)).map_err(|e| FormatError {
                    detail: format!("entry {i}: {}", e.detail),
                    ..e
                })?;
                if let Some(prev) = v.last() {
                    if u64::from(e.lblk) < prev.end() {
                        return Err(FormatError::new(
                            "extent ee_block",
                            format!(
                                "entry {i} starts at {} inside or before entry {} ({}+{})",
                                e.lblk,
                                i - 1,
                                prev.lblk,
                                prev.len
                            ),
                        ));
                    }
                }
                v.push(e);
            }
            ExtentEntries::Leaf(v)
        } else {
            let mut v: Vec<ExtentIndex> = Vec::with_capacity(n);
            for i in 0..n {
                let e = ExtentIndex::decode(entry(i))?;
                if let Some(prev) = v.last() {
                    if e.lblk <= prev.lblk {
                        return Err(FormatError::new(
                            "extent index ei_block",
                            format!(
                                "entry {i} key {} not above entry {} key {}",
                                e.lblk,
                                i - 1,
                                prev.lblk
                            ),
                        ));
                    }
                }
                v.push(e);
            }
            ExtentEntries::Index(v)
        };
        Ok(ExtentNode { header, entries })
    }

    /// Encode header and entries into `b` (the root's 60 bytes or a whole
    /// block), zeroing the unused entry slots. Bytes from the tail on are
    /// left alone. Panics (an invariant) when the node does not fit `b` or
    /// its kind disagrees with its depth.
    pub fn encode_into(&self, b: &mut [u8]) {
        let n = self.entries.len();
        assert!(n <= self.header.max as usize, "extent node overfull");
        assert!(tail_offset(self.header.max) <= b.len(), "extent node max");
        assert_eq!(
            self.header.depth == 0,
            matches!(self.entries, ExtentEntries::Leaf(_)),
            "extent node kind and depth disagree"
        );
        let header = ExtentHeader {
            entries: n as u16,
            ..self.header
        };
        header.encode_into(b);
        for i in 0..self.header.max as usize {
            let off = EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
            let slot = &mut b[off..off + EXTENT_ENTRY_SIZE];
            match &self.entries {
                ExtentEntries::Leaf(v) if i < n => v[i].encode_into(slot),
                ExtentEntries::Index(v) if i < n => v[i].encode_into(slot),
                _ => slot.fill(0),
            }
        }
    }

    /// The 60-byte root image of this node.
    pub fn encode_root(&self) -> [u8; EXTENT_ROOT_SIZE] {
        let mut b = [0u8; EXTENT_ROOT_SIZE];
        self.encode_into(&mut b);
        b
    }

    /// A whole tree block of `block_size` bytes (tail zero: see
    /// [`set_tail`]).
    pub fn encode_block(&self, block_size: u32) -> Vec<u8> {
        let mut b = vec![0u8; block_size as usize];
        self.encode_into(&mut b);
        b
    }
}

/// The tail checksum a tree block should carry: crc32c seeded with the
/// inode's seed (`fs_csum_seed`, then `ino`, then `generation`, all
/// little-endian) over the block up to the tail.
pub fn tail_csum(fs_csum_seed: u32, ino: u32, generation: u32, block: &[u8]) -> Result<u32> {
    let header = ExtentHeader::decode(block)?;
    let off = tail_offset(header.max);
    if off + EXTENT_TAIL_SIZE > block.len() {
        return Err(FormatError::new(
            "extent header eh_max",
            format!("tail at {off} outside a {}-byte block", block.len()),
        ));
    }
    let seed = inode_csum_seed(fs_csum_seed, ino, generation);
    Ok(ext4_crc32c(seed, &block[..off]))
}

/// Compute and store the tail checksum of a tree block.
pub fn set_tail(fs_csum_seed: u32, ino: u32, generation: u32, block: &mut [u8]) -> Result<()> {
    let csum = tail_csum(fs_csum_seed, ino, generation, block)?;
    let off = tail_offset(u16_at(block, 4));
    put_u32(block, off, csum);
    Ok(())
}

/// Check the tail checksum of a tree block.
pub fn verify_tail(fs_csum_seed: u32, ino: u32, generation: u32, block: &[u8]) -> Result<()> {
    let want = tail_csum(fs_csum_seed, ino, generation, block)?;
    let off = tail_offset(u16_at(block, 4));
    let have = u32_at(block, off);
    if have != want {
        return Err(FormatError::new(
            "extent tail et_checksum",
            format!("{have:#010x}, computed {want:#010x}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(lblk: u32, len: u32, unwritten: bool, pblk: u64) -> ExtentLeaf {
        ExtentLeaf {
            lblk,
            len,
            unwritten,
            pblk,
        }
    }

    fn leaf_node(max: u16, v: Vec<ExtentLeaf>) -> ExtentNode {
        ExtentNode {
            header: ExtentHeader {
                entries: v.len() as u16,
                max,
                depth: 0,
                generation: 0,
            },
            entries: ExtentEntries::Leaf(v),
        }
    }

    #[test]
    fn block_capacity_matches_ext4() {
        assert_eq!(block_max_entries(1024), 84);
        assert_eq!(block_max_entries(4096), 340);
        assert_eq!(tail_offset(84), 1020);
        assert_eq!(tail_offset(340), 4092);
        assert_eq!(tail_offset(EXTENT_ROOT_MAX_ENTRIES), EXTENT_ROOT_SIZE);
    }

    #[test]
    fn leaf_entry_encodes_like_the_kernel() {
        let mut b = [0u8; 12];
        leaf(0x0102_0304, 7, false, 0x1234_5678_9abc).encode_into(&mut b);
        assert_eq!(
            b,
            [0x04, 0x03, 0x02, 0x01, 7, 0, 0x34, 0x12, 0xbc, 0x9a, 0x78, 0x56]
        );
        // Unwritten: length + 32768.
        leaf(5, 3, true, 9).encode_into(&mut b);
        assert_eq!(u16_at(&b, 4), 32771);
        assert_eq!(ExtentLeaf::decode(&b).unwrap(), leaf(5, 3, true, 9));
        // 32768 is the longest written extent, not an unwritten one.
        leaf(0, 32768, false, 1).encode_into(&mut b);
        assert_eq!(u16_at(&b, 4), 32768);
        assert_eq!(ExtentLeaf::decode(&b).unwrap(), leaf(0, 32768, false, 1));
        leaf(0, 32767, true, 1).encode_into(&mut b);
        assert_eq!(u16_at(&b, 4), 65535);
        assert_eq!(ExtentLeaf::decode(&b).unwrap(), leaf(0, 32767, true, 1));
    }

    #[test]
    fn index_entry_round_trips() {
        let mut b = [0xffu8; 12];
        let e = ExtentIndex {
            lblk: 77,
            child: 0xabcd_0000_1111,
        };
        e.encode_into(&mut b);
        assert_eq!(&b[10..12], &[0, 0]);
        assert_eq!(ExtentIndex::decode(&b).unwrap(), e);
    }

    #[test]
    fn zero_length_extent_is_rejected() {
        let mut b = [0u8; 12];
        leaf(1, 1, false, 1).encode_into(&mut b);
        put_u16(&mut b, 4, 0);
        let err = ExtentLeaf::decode(&b).unwrap_err();
        assert_eq!(err.field, "extent ee_len");
    }

    #[test]
    fn extent_past_the_last_logical_block_is_rejected() {
        let mut b = [0u8; 12];
        leaf(u32::MAX, 1, false, 1).encode_into(&mut b);
        assert!(ExtentLeaf::decode(&b).is_ok());
        leaf(u32::MAX, 2, false, 1).encode_into(&mut b);
        assert_eq!(ExtentLeaf::decode(&b).unwrap_err().field, "extent ee_block");
    }

    #[test]
    fn root_round_trips() {
        let n = leaf_node(
            4,
            vec![
                leaf(0, 10, false, 100),
                leaf(10, 5, true, 200),
                leaf(100, 1, false, 7),
            ],
        );
        let b = n.encode_root();
        assert_eq!(u16_at(&b, 0), EXTENT_MAGIC);
        assert_eq!(u16_at(&b, 2), 3);
        assert_eq!(&b[48..60], &[0u8; 12]);
        assert_eq!(ExtentNode::decode_root(&b).unwrap(), n);

        let idx = ExtentNode {
            header: ExtentHeader {
                entries: 2,
                max: 4,
                depth: 3,
                generation: 9,
            },
            entries: ExtentEntries::Index(vec![
                ExtentIndex { lblk: 0, child: 50 },
                ExtentIndex {
                    lblk: 1000,
                    child: 1 << 40,
                },
            ]),
        };
        assert_eq!(ExtentNode::decode_root(&idx.encode_root()).unwrap(), idx);
    }

    #[test]
    fn block_round_trips_with_checksum() {
        let v: Vec<ExtentLeaf> = (0..84)
            .map(|i| leaf(i * 3, 2, i % 2 == 1, 1000 + u64::from(i) * 2))
            .collect();
        let n = leaf_node(84, v);
        let mut b = n.encode_block(1024);
        set_tail(0xdead_beef, 12, 3, &mut b).unwrap();
        verify_tail(0xdead_beef, 12, 3, &b).unwrap();
        assert_eq!(ExtentNode::decode_block(&b).unwrap(), n);
        // Seeded by ino and generation: another inode's seed fails.
        assert_eq!(
            verify_tail(0xdead_beef, 13, 3, &b).unwrap_err().field,
            "extent tail et_checksum"
        );
        assert!(verify_tail(0xdead_beef, 12, 4, &b).is_err());
        // Any flipped bit before the tail fails.
        for off in [0usize, 2, 13, 500, 1019] {
            let mut c = b.clone();
            c[off] ^= 0x10;
            assert!(verify_tail(0xdead_beef, 12, 3, &c).is_err(), "offset {off}");
        }
    }

    #[test]
    fn checksum_chains_fs_seed_ino_generation_then_block() {
        // ext4_chksum(ext4_chksum(ext4_chksum(~0, uuid), ino), gen) then the
        // block up to the tail. (That the kernel agrees is shown by ordo-fs's
        // tests/extent_image.rs, which verifies tails the kernel wrote.)
        let uuid = [7u8; 16];
        let fs_seed = crate::csum::fs_csum_seed(&uuid);
        let n = leaf_node(340, vec![leaf(0, 1, false, 5)]);
        let b = n.encode_block(4096);
        let mut seed = ext4_crc32c(fs_seed, &12u32.to_le_bytes());
        seed = ext4_crc32c(seed, &0u32.to_le_bytes());
        let want = ext4_crc32c(seed, &b[..4092]);
        assert_eq!(tail_csum(fs_seed, 12, 0, &b).unwrap(), want);
    }

    #[test]
    fn bad_headers_name_the_field() {
        let good = leaf_node(4, vec![leaf(0, 1, false, 5), leaf(4, 1, false, 6)]).encode_root();
        let field = |f: &dyn Fn(&mut [u8; 60])| {
            let mut b = good;
            f(&mut b);
            ExtentNode::decode_root(&b).unwrap_err().field
        };
        assert_eq!(field(&|b| put_u16(b, 0, 0xf30b)), "extent header eh_magic");
        assert_eq!(field(&|b| put_u16(b, 2, 5)), "extent header eh_entries");
        assert_eq!(field(&|b| put_u16(b, 4, 5)), "extent header eh_max");
        assert_eq!(field(&|b| put_u16(b, 4, 0)), "extent header eh_max");
        assert_eq!(field(&|b| put_u16(b, 6, 6)), "extent header eh_depth");
        // Second extent overlapping the first.
        assert_eq!(field(&|b| put_u32(b, 24, 0)), "extent ee_block");
        // As an index node: equal keys.
        assert_eq!(
            field(&|b| {
                put_u16(b, 6, 1);
                put_u32(b, 24, 0);
            }),
            "extent index ei_block"
        );
        // A block whose eh_max leaves no room for the tail.
        let mut blk = leaf_node(84, vec![]).encode_block(1024);
        put_u16(&mut blk, 4, 85);
        assert_eq!(
            ExtentNode::decode_block(&blk).unwrap_err().field,
            "extent header eh_max"
        );
        assert!(ExtentNode::decode_root(&[0u8; 12]).is_err());
    }

    fn arb_node(block: bool) -> impl proptest::strategy::Strategy<Value = (ExtentNode, u32)> {
        use proptest::prelude::*;
        let max: u16 = if block { 84 } else { 4 };
        (
            0..=max as usize,
            0u16..=EXTENT_DEPTH_MAX,
            any::<u32>(),
            proptest::collection::vec((1u32..40, 1u32..=32768, any::<bool>(), 1u64..(1 << 48)), 84),
        )
            .prop_map(move |(n, depth, generation, raw)| {
                // Keys strictly increasing, extents non-overlapping.
                let mut next: u64 = 0;
                let mut leaves = Vec::new();
                let mut indexes = Vec::new();
                for &(gap, len, unwritten, pblk) in raw.iter().take(n) {
                    let lblk = next + u64::from(gap);
                    let len = len.min(max_len(unwritten));
                    leaves.push(ExtentLeaf {
                        lblk: lblk as u32,
                        len,
                        unwritten,
                        pblk,
                    });
                    indexes.push(ExtentIndex {
                        lblk: lblk as u32,
                        child: pblk,
                    });
                    next = lblk + u64::from(len);
                }
                let entries = if depth == 0 {
                    ExtentEntries::Leaf(leaves)
                } else {
                    ExtentEntries::Index(indexes)
                };
                let node = ExtentNode {
                    header: ExtentHeader {
                        entries: n as u16,
                        max,
                        depth,
                        generation,
                    },
                    entries,
                };
                (node, generation)
            })
    }

    proptest::proptest! {
        #[test]
        fn any_root_round_trips((node, _) in arb_node(false)) {
            proptest::prop_assert_eq!(ExtentNode::decode_root(&node.encode_root()).unwrap(), node);
        }

        #[test]
        fn any_block_round_trips_and_verifies((node, generation) in arb_node(true), seed: u32, ino: u32) {
            let mut b = node.encode_block(1024);
            set_tail(seed, ino, generation, &mut b).unwrap();
            verify_tail(seed, ino, generation, &b).unwrap();
            proptest::prop_assert_eq!(ExtentNode::decode_block(&b).unwrap(), node);
        }
    }

    #[test]
    fn decoders_never_panic_on_random_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut b = vec![0u8; 1024];
            for c in b.iter_mut() {
                *c = next() as u8;
            }
            // Plausible headers so the entry checks are reached.
            put_u16(&mut b, 0, EXTENT_MAGIC);
            put_u16(&mut b, 2, (next() % 90) as u16);
            put_u16(&mut b, 4, (next() % 90) as u16);
            put_u16(&mut b, 6, (next() % 7) as u16);
            if let Ok(n) = ExtentNode::decode_block(&b) {
                // What decodes re-encodes to the same entries.
                let mut c = b.clone();
                n.encode_into(&mut c);
                assert_eq!(ExtentNode::decode_block(&c).unwrap(), n);
            }
            let _ = ExtentNode::decode_root(&b[..60]);
            let _ = tail_csum(1, 2, 3, &b);
        }
    }
}
