//! One entry point that runs every decoder of this crate over arbitrary
//! bytes, for the `fuzz/` target and the stable-toolchain garbage test.
//! A decoder may return an error; it must never panic, loop or allocate
//! without bound, whatever the input. Covers every module's decoders,
//! including the extent, JBD2 and fast-commit ones.

use crate::dir::{self, DirBlockLayout};
use crate::group::{self, GroupDesc};
use crate::inode::{self, Inode};
use crate::superblock::{GroupCsum, Superblock};
use crate::{extent, fc, jbd2};

/// Decode `data` as every structure. `selector` picks the parameters a
/// decoder takes besides the bytes (descriptor size, block size, whether a
/// checksum tail is expected), so a fuzzer explores them too.
pub fn decode_any(data: &[u8], selector: u64) {
    let seed = (selector >> 32) as u32;
    if let Ok(sb) = Superblock::decode_unverified(data) {
        // Every geometry helper must be safe on a validated superblock.
        let g = sb.groups_count();
        let _ = (sb.has_super(g.saturating_sub(1)), sb.gdt_blocks());
        let _ = (
            sb.blocks_in_group(g.saturating_sub(1)),
            sb.inode_table_blocks(),
        );
        let _ = (
            sb.group_of_inode(sb.inodes_count),
            sb.csum_seed(),
            sb.label(),
        );
        let _ = sb.features.unsupported_for_write();
        let _ = Superblock::decode(&sb.encode());
    }
    let _ = Superblock::decode(data);

    let desc_size = [32u16, 64, 128, 16][(selector & 3) as usize];
    if let Ok(d) = GroupDesc::decode(data, desc_size) {
        let _ = group::verify_group_desc(
            &data[..usize::from(desc_size)],
            3,
            GroupCsum::Crc32c { seed },
        );
        let _ = d.encode(desc_size.max(32), 3, GroupCsum::None);
    }
    let _ = group::block_bitmap_checksum(seed, data, 32768);
    let _ = group::inode_bitmap_checksum(seed, data, 8192);

    if let Ok(i) = Inode::decode(data) {
        let _ = i.encode(None);
        let _ = i.is_fast_symlink(1024);
    }
    let _ = inode::verify_inode_checksum(data, seed, 12);

    let layout = DirBlockLayout {
        block_size: data.len(),
        has_tail: selector & 4 != 0,
    };
    for e in dir::iter(data, layout).take(data.len() / 8 + 1) {
        if e.is_err() {
            break;
        }
    }
    let _ = dir::validate_block(data, layout, Some(1 << 20));
    let _ = dir::verify_dirent_block(data, seed);
    let has_csum = selector & 8 != 0;
    if let Ok(d) = dir::decode_dx_root(data, has_csum) {
        let _ = dir::verify_dx_checksum(data, &d, seed);
    }
    if let Ok(d) = dir::decode_dx_node(data, has_csum) {
        let _ = dir::verify_dx_checksum(data, &d, seed);
    }

    let _ = extent::ExtentNode::decode_root(data);
    let _ = extent::ExtentNode::decode_block(data);
    let _ = extent::verify_tail(seed, 12, 0, data);
    let bs = [1024u32, 2048, 4096][((selector >> 4) % 3) as usize];
    let _ = jbd2::JournalSuperblock::decode(data, bs);
    let _ = jbd2::BlockHeader::decode(data);

    if data.len() >= 2 {
        let tag = u16::from_le_bytes([data[0], data[1]]);
        let _ = fc::Tag::decode(tag, &data[2..], 256);
    }
    let _ = fc::scan([data], seed, 256);
}
