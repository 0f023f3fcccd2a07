//! Block group descriptors (32 bytes, or `s_desc_size` bytes with `64bit`)
//! and the checksums of the group's bitmaps.
//!
//! A descriptor is decoded from, and encoded back into, its own slot of the
//! descriptor table; encoding patches known fields into the slot so the
//! reserved tail of a large descriptor is preserved. The descriptor's own
//! checksum covers the group number, so a descriptor copied into the wrong
//! slot is caught.

use crate::bitmap;
use crate::csum::{crc16, ext4_crc32c};
use crate::le::*;
use crate::superblock::{GroupCsum, Superblock};
use crate::{FormatError, Result};

/// `bg_flags`: inode table and bitmap not initialized.
pub const BG_INODE_UNINIT: u16 = 0x0001;
/// `bg_flags`: block bitmap not initialized.
pub const BG_BLOCK_UNINIT: u16 = 0x0002;
/// `bg_flags`: inode table zeroed.
pub const BG_INODE_ZEROED: u16 = 0x0004;

/// Field offsets of `struct ext4_group_desc`.
#[allow(missing_docs)]
pub mod off {
    pub const BLOCK_BITMAP_LO: usize = 0x00;
    pub const INODE_BITMAP_LO: usize = 0x04;
    pub const INODE_TABLE_LO: usize = 0x08;
    pub const FREE_BLOCKS_COUNT_LO: usize = 0x0C;
    pub const FREE_INODES_COUNT_LO: usize = 0x0E;
    pub const USED_DIRS_COUNT_LO: usize = 0x10;
    pub const FLAGS: usize = 0x12;
    pub const EXCLUDE_BITMAP_LO: usize = 0x14;
    pub const BLOCK_BITMAP_CSUM_LO: usize = 0x18;
    pub const INODE_BITMAP_CSUM_LO: usize = 0x1A;
    pub const ITABLE_UNUSED_LO: usize = 0x1C;
    pub const CHECKSUM: usize = 0x1E;
    pub const BLOCK_BITMAP_HI: usize = 0x20;
    pub const INODE_BITMAP_HI: usize = 0x24;
    pub const INODE_TABLE_HI: usize = 0x28;
    pub const FREE_BLOCKS_COUNT_HI: usize = 0x2C;
    pub const FREE_INODES_COUNT_HI: usize = 0x2E;
    pub const USED_DIRS_COUNT_HI: usize = 0x30;
    pub const ITABLE_UNUSED_HI: usize = 0x32;
    pub const EXCLUDE_BITMAP_HI: usize = 0x34;
    pub const BLOCK_BITMAP_CSUM_HI: usize = 0x38;
    pub const INODE_BITMAP_CSUM_HI: usize = 0x3A;
}

/// One group descriptor. Counts and block numbers combine the lo and hi
/// halves when the descriptor is 64 bytes or larger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks_count: u32,
    pub free_inodes_count: u32,
    pub used_dirs_count: u32,
    /// `BG_*` flags.
    pub flags: u16,
    pub exclude_bitmap: u64,
    /// crc32c of the block bitmap (lo 16 bits, hi 16 bits when the descriptor is large).
    pub block_bitmap_csum: u32,
    /// crc32c of the inode bitmap.
    pub inode_bitmap_csum: u32,
    /// Inodes at the end of the table never used (lets e2fsck skip them).
    pub itable_unused: u32,
    /// `bg_checksum` as read (encode recomputes it).
    pub checksum: u16,
}

impl GroupDesc {
    /// Decode a descriptor slot of `desc_size` bytes (32, or >= 64 with 64bit).
    pub fn decode(b: &[u8], desc_size: u16) -> Result<GroupDesc> {
        let ds = usize::from(desc_size);
        if ds < 32 || b.len() < ds {
            return Err(FormatError::new(
                "group descriptor",
                format!("slot of {} bytes, descriptor size {desc_size}", b.len()),
            ));
        }
        let big = ds >= 64;
        let lohi32 = |lo: usize, hi: usize| -> u64 {
            u64::from(u32_at(b, lo))
                | if big {
                    u64::from(u32_at(b, hi)) << 32
                } else {
                    0
                }
        };
        let lohi16 = |lo: usize, hi: usize| -> u32 {
            u32::from(u16_at(b, lo))
                | if big {
                    u32::from(u16_at(b, hi)) << 16
                } else {
                    0
                }
        };
        Ok(GroupDesc {
            block_bitmap: lohi32(off::BLOCK_BITMAP_LO, off::BLOCK_BITMAP_HI),
            inode_bitmap: lohi32(off::INODE_BITMAP_LO, off::INODE_BITMAP_HI),
            inode_table: lohi32(off::INODE_TABLE_LO, off::INODE_TABLE_HI),
            free_blocks_count: lohi16(off::FREE_BLOCKS_COUNT_LO, off::FREE_BLOCKS_COUNT_HI),
            free_inodes_count: lohi16(off::FREE_INODES_COUNT_LO, off::FREE_INODES_COUNT_HI),
            used_dirs_count: lohi16(off::USED_DIRS_COUNT_LO, off::USED_DIRS_COUNT_HI),
            flags: u16_at(b, off::FLAGS),
            exclude_bitmap: lohi32(off::EXCLUDE_BITMAP_LO, off::EXCLUDE_BITMAP_HI),
            block_bitmap_csum: lohi16(off::BLOCK_BITMAP_CSUM_LO, off::BLOCK_BITMAP_CSUM_HI),
            inode_bitmap_csum: lohi16(off::INODE_BITMAP_CSUM_LO, off::INODE_BITMAP_CSUM_HI),
            itable_unused: lohi16(off::ITABLE_UNUSED_LO, off::ITABLE_UNUSED_HI),
            checksum: u16_at(b, off::CHECKSUM),
        })
    }

    /// Patch this descriptor into its slot (`slot.len() == desc_size`) and
    /// set its checksum for `group`. Bytes past the known fields are kept.
    pub fn encode_into(&self, slot: &mut [u8], group: u32, csum: GroupCsum) {
        let ds = slot.len();
        assert!(
            ds == 32 || (ds >= 64 && ds.is_power_of_two()),
            "descriptor size {ds}"
        );
        let big = ds >= 64;
        let put32 = |s: &mut [u8], lo: usize, hi: usize, v: u64| {
            put_u32(s, lo, v as u32);
            if big {
                put_u32(s, hi, (v >> 32) as u32);
            }
        };
        let put16 = |s: &mut [u8], lo: usize, hi: usize, v: u32| {
            put_u16(s, lo, v as u16);
            if big {
                put_u16(s, hi, (v >> 16) as u16);
            }
        };
        put32(
            slot,
            off::BLOCK_BITMAP_LO,
            off::BLOCK_BITMAP_HI,
            self.block_bitmap,
        );
        put32(
            slot,
            off::INODE_BITMAP_LO,
            off::INODE_BITMAP_HI,
            self.inode_bitmap,
        );
        put32(
            slot,
            off::INODE_TABLE_LO,
            off::INODE_TABLE_HI,
            self.inode_table,
        );
        put16(
            slot,
            off::FREE_BLOCKS_COUNT_LO,
            off::FREE_BLOCKS_COUNT_HI,
            self.free_blocks_count,
        );
        put16(
            slot,
            off::FREE_INODES_COUNT_LO,
            off::FREE_INODES_COUNT_HI,
            self.free_inodes_count,
        );
        put16(
            slot,
            off::USED_DIRS_COUNT_LO,
            off::USED_DIRS_COUNT_HI,
            self.used_dirs_count,
        );
        put_u16(slot, off::FLAGS, self.flags);
        put32(
            slot,
            off::EXCLUDE_BITMAP_LO,
            off::EXCLUDE_BITMAP_HI,
            self.exclude_bitmap,
        );
        put16(
            slot,
            off::BLOCK_BITMAP_CSUM_LO,
            off::BLOCK_BITMAP_CSUM_HI,
            self.block_bitmap_csum,
        );
        put16(
            slot,
            off::INODE_BITMAP_CSUM_LO,
            off::INODE_BITMAP_CSUM_HI,
            self.inode_bitmap_csum,
        );
        put16(
            slot,
            off::ITABLE_UNUSED_LO,
            off::ITABLE_UNUSED_HI,
            self.itable_unused,
        );
        let c = match csum {
            GroupCsum::None => self.checksum,
            _ => group_desc_checksum(slot, group, csum),
        };
        put_u16(slot, off::CHECKSUM, c);
    }

    /// Encode into a fresh zeroed slot of `desc_size` bytes.
    pub fn encode(&self, desc_size: u16, group: u32, csum: GroupCsum) -> Vec<u8> {
        let mut v = vec![0u8; usize::from(desc_size)];
        self.encode_into(&mut v, group, csum);
        v
    }

    /// Whether a flag is set.
    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// The checksum a descriptor slot should carry (the stored checksum field is
/// treated as zero). 0 when `csum` is `None`.
pub fn group_desc_checksum(slot: &[u8], group: u32, csum: GroupCsum) -> u16 {
    let ds = slot.len();
    let le_group = group.to_le_bytes();
    match csum {
        GroupCsum::None => 0,
        GroupCsum::Crc32c { seed } => {
            // crc32c(seed, group || the descriptor with bg_checksum zeroed),
            // in one pass over a copy on the stack: a CRC continued over
            // pieces is the CRC of them together, and each call has a fixed
            // cost that is most of the work for so few bytes.
            assert!(
                (off::CHECKSUM + 2..=1024).contains(&ds),
                "descriptor size {ds} (s_desc_size is checked to be 32..=1024)"
            );
            let mut buf = [0u8; 4 + 1024];
            buf[..4].copy_from_slice(&le_group);
            buf[4..4 + ds].copy_from_slice(slot);
            buf[4 + off::CHECKSUM..4 + off::CHECKSUM + 2].fill(0);
            (ext4_crc32c(seed, &buf[..4 + ds]) & 0xFFFF) as u16
        }
        GroupCsum::Crc16 { uuid } => {
            let mut c = crc16(!0, &uuid);
            c = crc16(c, &le_group);
            c = crc16(c, &slot[..off::CHECKSUM]);
            if ds > off::CHECKSUM + 2 {
                c = crc16(c, &slot[off::CHECKSUM + 2..]);
            }
            c
        }
    }
}

/// Check a descriptor slot's checksum.
pub fn verify_group_desc(slot: &[u8], group: u32, csum: GroupCsum) -> Result<()> {
    if csum == GroupCsum::None {
        return Ok(());
    }
    if slot.len() < 32 {
        return Err(FormatError::new(
            "group descriptor",
            format!("slot of {} bytes", slot.len()),
        ));
    }
    let stored = u16_at(slot, off::CHECKSUM);
    let want = group_desc_checksum(slot, group, csum);
    if stored != want {
        return Err(FormatError::new(
            "group descriptor bg_checksum",
            format!("group {group}: stored {stored:#06x}, computed {want:#06x}"),
        ));
    }
    Ok(())
}

/// The block bitmap of a `BLOCK_UNINIT` group, as the kernel builds it
/// (`ext4_init_block_bitmap`): the superblock backup, descriptor table and
/// reserved GDT blocks when the group has a backup, the group's own bitmaps
/// and inode table where they lie inside the group, and the padding past
/// the group's last block. One block-size buffer.
pub fn uninit_block_bitmap(sb: &Superblock, group: u64, desc: &GroupDesc) -> Vec<u8> {
    let bs = sb.block_size() as usize;
    let mut bm = vec![0u8; bs];
    let meta = sb.super_overhead_blocks(group).min(8 * bs as u64) as usize;
    bitmap::set_range(&mut bm, 0, meta);
    let first = sb.group_first_block(group);
    let n = u64::from(sb.blocks_in_group(group));
    let mut mark = |b: u64| {
        if b >= first && b < first + n {
            bitmap::set(&mut bm, (b - first) as usize);
        }
    };
    mark(desc.block_bitmap);
    mark(desc.inode_bitmap);
    let itb = u64::from(sb.inode_table_blocks());
    for b in desc.inode_table..desc.inode_table.saturating_add(itb) {
        mark(b);
    }
    bitmap::set_range(&mut bm, n as usize, 8 * bs);
    bm
}

/// The inode bitmap of an `INODE_UNINIT` group: every inode free, padding
/// past `inodes_per_group` set. One block-size buffer.
pub fn uninit_inode_bitmap(sb: &Superblock) -> Vec<u8> {
    let bs = sb.block_size() as usize;
    let mut bm = vec![0u8; bs];
    bitmap::set_range(&mut bm, sb.inodes_per_group as usize, 8 * bs);
    bm
}

/// Where group `group`'s descriptor lives in the table copy that starts at
/// `table_block`: (block, byte offset in that block).
pub fn desc_location(sb: &Superblock, table_block: u64, group: u64) -> (u64, usize) {
    let per_block = u64::from(sb.block_size()) / u64::from(sb.desc_size());
    (
        table_block + group / per_block,
        ((group % per_block) * u64::from(sb.desc_size())) as usize,
    )
}

/// crc32c of a block bitmap: over `clusters_per_group / 8` bytes.
pub fn block_bitmap_checksum(seed: u32, bitmap: &[u8], clusters_per_group: u32) -> u32 {
    let n = (clusters_per_group as usize / 8).min(bitmap.len());
    ext4_crc32c(seed, &bitmap[..n])
}

/// crc32c of an inode bitmap: over `inodes_per_group / 8` bytes.
pub fn inode_bitmap_checksum(seed: u32, bitmap: &[u8], inodes_per_group: u32) -> u32 {
    let n = (inodes_per_group as usize / 8).min(bitmap.len());
    ext4_crc32c(seed, &bitmap[..n])
}

/// Compare a stored bitmap checksum with a computed one: only the low 16
/// bits exist in a 32-byte descriptor.
pub fn bitmap_csum_matches(stored: u32, computed: u32, desc_size: u16) -> bool {
    if desc_size >= 64 {
        stored == computed
    } else {
        stored & 0xFFFF == computed & 0xFFFF
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc32c_descriptor_checksum_is_the_crc_over_its_pieces() {
        for ds in [32usize, 64, 1024] {
            let slot: Vec<u8> = (0..ds).map(|i| (i * 7 + 3) as u8).collect();
            let seed = 0x8765_4321;
            let group = 0x0102_0304u32;
            let mut c = ext4_crc32c(seed, &group.to_le_bytes());
            c = ext4_crc32c(c, &slot[..off::CHECKSUM]);
            c = ext4_crc32c(c, &[0, 0]);
            if ds > off::CHECKSUM + 2 {
                c = ext4_crc32c(c, &slot[off::CHECKSUM + 2..]);
            }
            let got = group_desc_checksum(&slot, group, GroupCsum::Crc32c { seed });
            assert_eq!(got, (c & 0xFFFF) as u16, "descriptor of {ds} bytes");
        }
    }

    fn sample() -> GroupDesc {
        GroupDesc {
            block_bitmap: 0x1_0000_0010,
            inode_bitmap: 0x20,
            inode_table: 0x30,
            free_blocks_count: 0x1_2345,
            free_inodes_count: 100,
            used_dirs_count: 3,
            flags: BG_INODE_ZEROED | BG_BLOCK_UNINIT,
            exclude_bitmap: 0,
            block_bitmap_csum: 0xDEAD_BEEF,
            inode_bitmap_csum: 0x1234_5678,
            itable_unused: 90,
            checksum: 0,
        }
    }

    #[test]
    fn round_trip_64_and_32() {
        let csum = GroupCsum::Crc32c { seed: 0xABCD_0123 };
        let d = sample();
        let slot = d.encode(64, 7, csum);
        let back = GroupDesc::decode(&slot, 64).unwrap();
        assert_eq!(
            GroupDesc {
                checksum: 0,
                ..back
            },
            d
        );
        verify_group_desc(&slot, 7, csum).unwrap();
        assert!(verify_group_desc(&slot, 8, csum).is_err());

        let small = GroupDesc {
            block_bitmap: 0x10,
            free_blocks_count: 0x2345,
            block_bitmap_csum: 0xBEEF,
            inode_bitmap_csum: 0x5678,
            ..d
        };
        let csum16 = GroupCsum::Crc16 { uuid: [7; 16] };
        let slot = small.encode(32, 1, csum16);
        let back = GroupDesc::decode(&slot, 32).unwrap();
        assert_eq!(
            GroupDesc {
                checksum: 0,
                ..back
            },
            small
        );
        verify_group_desc(&slot, 1, csum16).unwrap();
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let csum = GroupCsum::Crc32c { seed: 1 };
        let mut slot = sample().encode(64, 0, csum);
        slot[0x0C] ^= 0x40;
        assert!(verify_group_desc(&slot, 0, csum).is_err());
        // The reserved tail is covered too.
        let mut slot = sample().encode(64, 0, csum);
        slot[0x3E] ^= 1;
        assert!(verify_group_desc(&slot, 0, csum).is_err());
    }

    #[test]
    fn reserved_tail_is_preserved() {
        let mut slot = vec![0u8; 64];
        slot[0x3C] = 0x5A;
        sample().encode_into(&mut slot, 0, GroupCsum::None);
        assert_eq!(slot[0x3C], 0x5A);
    }
}
