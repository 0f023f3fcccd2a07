//! Building a [`Core`] over a device: the superblock, the verified group
//! descriptors and the checksum context, then the core itself.
//!
//! Why apart from [`crate::fs::Fs::mount`]: mount is not the only place
//! that needs ext4's core over an image. Fast-commit replay applies its
//! tags through the same core (with a protocol that writes nothing), so
//! that there is one ext4 mutator in ordo, and that core must see the
//! image exactly as a mount would: same checks, same errors, block and
//! field named. Mount keeps what only a mount does (the feature and
//! orphan checks against its options, recovery, the protocol, the root
//! check, the superblock's mount fields).

use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice};
use ordo_format::group::{group_desc_checksum, GroupDesc};
use ordo_format::superblock::GroupCsum;
use ordo_format::Superblock;

use crate::cache::BufferCache;
use crate::error::{FsError, Result};
use crate::protocol::Protocol;
use crate::state::{Core, GroupLoc, SealCtx};

/// Read the primary superblock's 1024 bytes: (block, byte offset in the
/// block, raw bytes).
pub(crate) fn read_superblock(dev: &dyn BlockDevice) -> Result<(u64, usize, Vec<u8>)> {
    let dbs = dev.block_size() as usize;
    if !(1024..=65536).contains(&dbs) || !dbs.is_power_of_two() {
        return Err(FsError::Invalid(format!("device block size {dbs}")));
    }
    use ordo_format::superblock::{super_block_nr, super_offset, SUPERBLOCK_SIZE};
    let bs = dev.block_size();
    let (block, off) = (super_block_nr(bs), super_offset(bs));
    let mut buf = vec![0u8; dbs];
    dev.read(block, &mut buf, BlockClass::Super)?;
    Ok((block, off, buf[off..off + SUPERBLOCK_SIZE].to_vec()))
}

/// What a core needs to know about an image before its first block read
/// through the cache: the superblock, where it lies, the groups' metadata
/// locations and the checksum context.
pub(crate) struct CoreImage {
    pub sb: Superblock,
    pub groups: Vec<GroupLoc>,
    pub seal: SealCtx,
}

/// How a core is run over an image.
#[derive(Clone, Debug)]
pub(crate) struct CoreOptions {
    /// Bound of the buffer cache, bytes (at least 64 blocks; see
    /// [`BufferCache::new`]). A core that must never evict passes a bound
    /// above everything it can touch.
    pub cache_bytes: u64,
    /// Whether the core refuses every change.
    pub read_only: bool,
    /// The time source of every timestamp the core writes.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Seed of the core's random source (inode generations).
    pub seed: u64,
}

impl CoreImage {
    /// Read and decode the superblock and check it against the device:
    /// same block size, no more blocks than the device has. Returns the
    /// superblock, its block and its byte offset in that block.
    pub(crate) fn read_super(dev: &dyn BlockDevice) -> Result<(Superblock, u64, usize)> {
        let (sb_block, sb_offset, raw) = read_superblock(dev)?;
        let s = Superblock::decode(&raw).map_err(|e| FsError::from(e.at(sb_block)))?;
        let bs = s.block_size();
        if bs != dev.block_size() {
            return Err(FsError::Invalid(format!(
                "the image has {bs}-byte blocks but the device was opened with {}-byte blocks",
                dev.block_size()
            )));
        }
        if s.blocks_count > dev.block_count() {
            return Err(FsError::corrupt(
                sb_block,
                "superblock s_blocks_count",
                format!(
                    "{} blocks but the device has {}",
                    s.blocks_count,
                    dev.block_count()
                ),
            ));
        }
        Ok((s, sb_block, sb_offset))
    }

    /// Decode and verify every group descriptor of the image whose
    /// superblock `s` was read by [`CoreImage::read_super`]: checksum
    /// (metadata_csum or gdt_csum), and bitmaps and inode table inside the
    /// file system. The first bad descriptor is an error naming its
    /// table block and field.
    pub(crate) fn load(
        dev: &dyn BlockDevice,
        s: Superblock,
        sb_block: u64,
        sb_offset: usize,
    ) -> Result<CoreImage> {
        let bs = s.block_size();
        let csum = s.has_metadata_csum();
        let desc_size = s.desc_size() as u32;
        let ngroups = s.groups_count() as u32;
        let gdt_first = if bs == 1024 { 2 } else { 1 };
        let mut seal = SealCtx {
            csum,
            csum_seed: s.csum_seed(),
            block_size: bs,
            inode_size: s.inode_size() as u32,
            inodes_per_group: s.inodes_per_group,
            desc_size,
            groups: ngroups,
            gdt_first,
            gdt_blocks: s.gdt_blocks(),
            sb_block,
            sb_offset,
            uuid: s.uuid,
            group_crc16: s.has_gdt_csum(),
            itables: Default::default(),
            itable_blocks: s.inode_table_blocks() as u64,
            owners: Default::default(),
        };
        let gcsum = s.group_csum();
        let itb = s.inode_table_blocks() as u64;
        let mut groups = Vec::with_capacity(ngroups as usize);
        let mut buf = vec![0u8; bs as usize];
        let per = (bs / desc_size) as u64;
        for g in 0..ngroups {
            let blk = gdt_first + g as u64 / per;
            if (g as u64).is_multiple_of(per) {
                dev.read(blk, &mut buf, BlockClass::GroupMeta)?;
            }
            let off = (g as u64 % per) as usize * desc_size as usize;
            let slot = &buf[off..off + desc_size as usize];
            let d =
                GroupDesc::decode(slot, desc_size as u16).map_err(|e| FsError::from(e.at(blk)))?;
            if gcsum != GroupCsum::None {
                let want = group_desc_checksum(slot, g, gcsum);
                if want != d.checksum {
                    return Err(FsError::corrupt(
                        blk,
                        format!("group descriptor {g} bg_checksum"),
                        format!("stored {:#06x}, computed {want:#06x}", d.checksum),
                    ));
                }
            }
            let loc = GroupLoc {
                block_bitmap: d.block_bitmap,
                inode_bitmap: d.inode_bitmap,
                inode_table: d.inode_table,
            };
            for (what, b, n) in [
                ("bg_block_bitmap", loc.block_bitmap, 1),
                ("bg_inode_bitmap", loc.inode_bitmap, 1),
                ("bg_inode_table", loc.inode_table, itb),
            ] {
                if b <= s.first_data_block as u64 || b + n > s.blocks_count {
                    return Err(FsError::corrupt(
                        blk,
                        format!("group descriptor {g} {what}"),
                        format!("block {b} outside the file system"),
                    ));
                }
            }
            seal.itables.insert(loc.inode_table, g);
            groups.push(loc);
        }
        Ok(CoreImage {
            sb: s,
            groups,
            seal,
        })
    }
}

impl Core {
    /// A core over `dev` whose image `image` describes, driven by `proto`.
    pub(crate) fn open(
        dev: Arc<dyn BlockDevice>,
        image: CoreImage,
        opts: CoreOptions,
        proto: Box<dyn Protocol>,
    ) -> Core {
        let cache = BufferCache::new(image.sb.block_size(), opts.cache_bytes);
        Core::new(
            dev,
            image.sb,
            image.groups,
            cache,
            proto,
            image.seal,
            opts.read_only,
            opts.clock,
            opts.seed,
        )
    }
}
