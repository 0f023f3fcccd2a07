//! The benign repair: what `sync` and `async` run after a crash.
//!
//! It rewrites only derivable state, from what the checker found: the
//! allocation bitmaps and their checksums, group and superblock free
//! counts, link counts, i_blocks and xattr block refcounts that are too
//! high, extent index keys below their child's first key, leaked inodes
//! (in use, named by no entry, their references to a shared xattr block
//! dropped) and the orphan list; and it removes the stale second name of
//! a directory that an interrupted rename left with two (the name in the
//! parent its `..` does not name: the directory stays reachable). It never
//! runs when the check found an unsafe problem (the caller makes sure), so
//! it never writes to an image it does not understand, and it writes
//! nothing that a reachable file depends on. Writes go straight to the
//! device, then one flush.

use std::collections::{HashMap, HashSet};

use ordo_dev::BlockClass;

use super::checker::{Checker, DirName};
use super::layout::*;
use super::Disk;
use crate::error::FsError;

/// Rewrite one inode in place through `edit`, recomputing its checksum.
fn edit_inode(
    disk: &Disk<'_>,
    c: &Checker<'_>,
    ino: u32,
    edit: impl FnOnce(&mut Vec<u8>),
) -> Result<bool, FsError> {
    let Some((blk, off)) = c.inode_location(ino) else {
        return Ok(false);
    };
    let isz = c.geo.inode_size as usize;
    let mut block = disk.read_block(blk, BlockClass::InodeTable)?;
    let mut inode = Inode::decode(&block[off..off + isz], c.sb.has_incompat(INCOMPAT_64BIT));
    edit(&mut inode.raw);
    if c.sb.metadata_csum() {
        inode.set_checksum(c.geo.csum_seed, ino);
    }
    block[off..off + isz].copy_from_slice(&inode.raw);
    disk.write_block(blk, &block, BlockClass::InodeTable)?;
    Ok(true)
}

/// Remove the entry at `gone` from its directory block, as ext4 does, and
/// reseal the block's checksum tail. The checker found the block well
/// formed, so the walk from its start reaches the entry.
fn remove_entry(disk: &Disk<'_>, c: &Checker<'_>, gone: &DirName) -> Result<(), FsError> {
    let bs = c.geo.block_size as usize;
    let mut block = disk.read_block(gone.pblk, BlockClass::Directory)?;
    let csum = c.sb.metadata_csum();
    let end = if csum { bs - 12 } else { bs };
    let rec_len_at = |b: &[u8], off: usize| -> usize {
        let r = le16(b, off + 4) as usize;
        if bs >= 65536 && (r == 65535 || r == 0) {
            65536
        } else {
            r
        }
    };
    let mut prev: Option<usize> = None;
    let mut off = 0usize;
    while off < gone.off {
        let r = rec_len_at(&block, off);
        if r < 12 || off + r > end {
            break;
        }
        prev = Some(off);
        off += r;
    }
    if off != gone.off || le32(&block, off) != gone.ino {
        return Err(FsError::corrupt(
            gone.pblk,
            "directory entry",
            format!(
                "entry '{}' -> {} expected at offset {} of directory {} block {} is not there",
                gone.name, gone.ino, gone.off, gone.dir, gone.pblk
            ),
        ));
    }
    let r = rec_len_at(&block, off);
    match prev {
        Some(p) => {
            let merged = rec_len_at(&block, p) + r;
            let enc = if merged >= 65536 { 65535 } else { merged };
            put_le16(&mut block, p + 4, enc as u16);
        }
        None => put_le32(&mut block, off, 0),
    }
    if csum {
        let generation = c.inodes.get(&gone.dir).map_or(0, |i| i.generation);
        let dseed = Inode::csum_seed(c.geo.csum_seed, gone.dir, generation);
        let sum = crc32c_raw(dseed, &block[..bs - 12]);
        put_le32(&mut block, bs - 4, sum);
    }
    disk.write_block(gone.pblk, &block, BlockClass::Directory)?;
    Ok(())
}

fn set_bit(bytes: &mut [u8], i: u64) {
    bytes[(i / 8) as usize] |= 1 << (i % 8);
}

/// Repair the benign problems `c` found, stamping `now` (seconds since the
/// epoch) as the `i_dtime` of inodes it releases. Returns one line per
/// change.
pub(crate) fn repair(
    disk: &Disk<'_>,
    c: &mut Checker<'_>,
    now: u32,
) -> Result<Vec<String>, FsError> {
    let mut done = Vec::new();
    let bs = c.geo.block_size as usize;

    // Stale names of directories moved by an interrupted rename: the
    // entry is removed as ext4 removes one (merged into its predecessor,
    // or its inode zeroed when it opens the block), and the block's
    // checksum tail recomputed.
    for gone in c.stale_names.clone() {
        remove_entry(disk, c, &gone)?;
        done.push(format!(
            "removed stale entry '{}' -> {} from directory {} (block {} offset {})",
            gone.name, gone.ino, gone.dir, gone.pblk, gone.off
        ));
    }

    // Leftover htree blocks of unindexed directories rewritten linear: a
    // root keeps "." and "..", whose record now ends at the tail; a node
    // becomes an empty block. Both get their checksum tail.
    for (dir, lblk, pblk) in c.leftover_dx.clone() {
        let mut block = disk.read_block(pblk, BlockClass::Directory)?;
        if lblk == 0 {
            put_le16(&mut block, 16, (bs - 12 - 12) as u16);
            block[24..bs - 12].fill(0);
        } else {
            block.fill(0);
            put_le16(&mut block, 4, (bs - 12) as u16);
        }
        block[bs - 12..].fill(0);
        put_le16(&mut block, bs - 12 + 4, 12);
        block[bs - 12 + 7] = 0xDE;
        let generation = c.inodes.get(&dir).map_or(0, |i| i.generation);
        let dseed = Inode::csum_seed(c.geo.csum_seed, dir, generation);
        let sum = crc32c_raw(dseed, &block[..bs - 12]);
        put_le32(&mut block, bs - 4, sum);
        disk.write_block(pblk, &block, BlockClass::Directory)?;
        done.push(format!(
            "rewrote directory {dir} block {pblk} (logical {lblk}), an htree block left by dropping the index, as a linear block"
        ));
    }

    // Inodes: leaked ones released, orphans settled, link counts lowered,
    // deleted inodes given a dtime.
    let wanted_links = c.wanted_links();
    let leaked: Vec<u32> = c.leaked.clone();
    // References to xattr blocks that released inodes drop.
    let mut xattr_dropped: HashMap<u64, u32> = HashMap::new();
    for &ino in &leaked {
        edit_inode(disk, c, ino, |r| {
            put_le16(r, I_LINKS, 0);
            put_le32(r, I_DTIME, now);
        })?;
        if let Some(info) = c.inodes.remove(&ino) {
            if let Some(xb) = info.xattr_block {
                *xattr_dropped.entry(xb).or_default() += 1;
            }
            for (start, len) in info.claimed {
                for b in start..start + len {
                    // A shared xattr block is freed below, once no
                    // inode refers to it any more.
                    if !c.meta.get(b) && Some(b) != info.xattr_block {
                        c.used.clear(b);
                    }
                }
            }
        }
        c.inode_used.clear(ino as u64);
        done.push(format!("released leaked inode {ino}"));
    }
    // Xattr blocks: a refcount above the inodes that still refer to it
    // (left so by a crash, or by the inodes just released) lowered to
    // their number, the block checksum resealed; a block no inode refers
    // to any more is freed.
    let mut xblocks: Vec<(u64, (u32, u32))> = c.xattr.iter().map(|(&b, &v)| (b, v)).collect();
    xblocks.sort();
    for (b, (counted, on_disk)) in xblocks {
        let left = counted.saturating_sub(xattr_dropped.get(&b).copied().unwrap_or(0));
        if left == 0 {
            if !c.meta.get(b) {
                c.used.clear(b);
            }
            done.push(format!("xattr block {b}: freed, no inode refers to it"));
            continue;
        }
        if on_disk <= left {
            continue;
        }
        let mut block = disk.read_block(b, BlockClass::Other)?;
        put_le32(&mut block, 4, left);
        if c.sb.metadata_csum() {
            put_le32(&mut block, 0x10, 0);
            let seed = crc32c_raw(c.geo.csum_seed, &b.to_le_bytes());
            let sum = crc32c_raw(seed, &block);
            put_le32(&mut block, 0x10, sum);
        }
        disk.write_block(b, &block, BlockClass::Other)?;
        c.xattr.insert(b, (left, left));
        done.push(format!(
            "xattr block {b}: h_refcount lowered from {on_disk} to {left}"
        ));
    }
    let leaked_set: HashSet<u32> = leaked.iter().copied().collect();
    // Extent index keys lower than their child's first key raised to it
    // (a tree block's tail checksum recomputed).
    for k in c.stale_index_keys.clone() {
        if leaked_set.contains(&k.ino) {
            continue;
        }
        let at = 12 + 12 * k.entry;
        match k.node_block {
            None => {
                edit_inode(disk, c, k.ino, |r| put_le32(r, I_BLOCK + at, k.key))?;
            }
            Some(b) => {
                let mut block = disk.read_block(b, BlockClass::ExtentTree)?;
                put_le32(&mut block, at, k.key);
                if c.sb.metadata_csum() {
                    let max = le16(&block, 4) as usize;
                    let tail = 12 + 12 * max;
                    if tail + 4 <= block.len() {
                        let generation = c.inodes.get(&k.ino).map_or(0, |i| i.generation);
                        let seed = Inode::csum_seed(c.geo.csum_seed, k.ino, generation);
                        let sum = crc32c_raw(seed, &block[..tail]);
                        put_le32(&mut block, tail, sum);
                    }
                }
                disk.write_block(b, &block, BlockClass::ExtentTree)?;
            }
        }
        done.push(format!(
            "inode {}: extent index {} of {} raised to {}",
            k.ino,
            k.entry,
            k.node_block
                .map_or_else(|| "i_block".to_string(), |b| format!("block {b}")),
            k.key
        ));
    }
    // i_blocks that is too high (blocks counted whose mappings are not
    // set, or no longer are) lowered to what the tree maps.
    for (ino, want) in c.high_iblocks.clone() {
        if leaked_set.contains(&ino) {
            continue;
        }
        edit_inode(disk, c, ino, |r| {
            put_le32(r, I_BLOCKS_LO, want as u32);
            if r.len() >= I_BLOCKS_HI + 2 {
                put_le16(r, I_BLOCKS_HI, (want >> 32) as u16);
            }
        })?;
        done.push(format!("inode {ino}: i_blocks lowered to {want}"));
    }
    for (&ino, &n) in &wanted_links {
        if leaked_set.contains(&ino) {
            continue;
        }
        edit_inode(disk, c, ino, |r| put_le16(r, I_LINKS, n as u16))?;
        done.push(format!("inode {ino}: i_links_count lowered to {n}"));
    }
    let orphans = c.orphans.clone();
    for &ino in &orphans {
        let live = c.inode_used.get(ino as u64) && !leaked_set.contains(&ino);
        edit_inode(disk, c, ino, |r| {
            put_le32(r, I_DTIME, if live { 0 } else { now });
        })?;
        done.push(format!(
            "orphan inode {ino}: {}",
            if live {
                "taken off the orphan list"
            } else {
                "released"
            }
        ));
    }
    for &ino in &c.zero_dtime.clone() {
        if orphans.contains(&ino) {
            continue;
        }
        edit_inode(disk, c, ino, |r| put_le32(r, I_DTIME, now))?;
        done.push(format!("deleted inode {ino}: i_dtime set"));
    }

    // Bitmaps and group descriptors.
    let ipg = c.geo.inodes_per_group as u64;
    let big_desc = c.geo.desc_size >= 64;
    let seed = c.geo.csum_seed;
    let csum = c.sb.gdt_csum();
    let mut total_free_blocks = 0u64;
    let mut total_free_inodes = 0u64;
    let mut gd_changed = vec![false; c.geo.groups as usize];
    for g in 0..c.geo.groups {
        let gi = g as usize;
        if !c.gd_ok[gi] {
            continue;
        }
        let mut gd = c.gds[gi].clone();
        let first = c.geo.group_first_block(g);
        let count = c.geo.group_block_count(g);
        let mut bm = vec![0xFFu8; bs];
        for i in 0..c.geo.blocks_per_group {
            if i < count && !c.used.get(first + i) {
                bm[(i / 8) as usize] &= !(1 << (i % 8));
            }
        }
        let used_blocks = (0..count).filter(|&i| c.used.get(first + i)).count() as u64;
        let free_blocks = count - used_blocks;
        total_free_blocks += free_blocks;
        let nb = (c.sb.clusters_per_group / 8) as usize;
        let uninit_b = csum && gd.flags & BG_BLOCK_UNINIT != 0;
        let matches_view = c.disk_block_bitmaps[gi].as_ref().is_some_and(|v| {
            (0..count).all(|i| {
                (v[(i / 8) as usize] >> (i % 8)) & 1 == bm[(i / 8) as usize] >> (i % 8) & 1
            })
        });
        if uninit_b && matches_view {
            // Still derivable from the group's metadata: leave it uninit.
        } else {
            let on_disk = disk.read_block(gd.block_bitmap, BlockClass::GroupMeta)?;
            let want_csum = bitmap_checksum(seed, &bm[..nb], big_desc);
            if on_disk != bm
                || uninit_b
                || (c.sb.metadata_csum() && gd.block_bitmap_csum != want_csum)
            {
                disk.write_block(gd.block_bitmap, &bm, BlockClass::GroupMeta)?;
                done.push(format!(
                    "group {g}: block bitmap (block {}) rewritten",
                    gd.block_bitmap
                ));
            }
            if uninit_b {
                gd.flags &= !BG_BLOCK_UNINIT;
            }
            if c.sb.metadata_csum() {
                gd.block_bitmap_csum = want_csum;
            }
        }
        // Inode bitmap.
        let uninit_i = csum && gd.flags & BG_INODE_UNINIT != 0;
        let mut used_inodes = 0u64;
        let mut dirs = 0u64;
        let mut ib = vec![0xFFu8; bs];
        for i in 0..ipg {
            let ino = g as u64 * ipg + i + 1;
            if c.inode_used.get(ino) {
                used_inodes += 1;
                if c.inodes.get(&(ino as u32)).is_some_and(|x| x.is_dir()) {
                    dirs += 1;
                }
            } else {
                ib[(i / 8) as usize] &= !(1 << (i % 8));
            }
        }
        let _ = set_bit;
        let free_inodes = ipg - used_inodes;
        total_free_inodes += free_inodes;
        if !uninit_i {
            let ni = (ipg / 8) as usize;
            let want_csum = bitmap_checksum(seed, &ib[..ni], big_desc);
            let on_disk = disk.read_block(gd.inode_bitmap, BlockClass::GroupMeta)?;
            if on_disk != ib || (c.sb.metadata_csum() && gd.inode_bitmap_csum != want_csum) {
                disk.write_block(gd.inode_bitmap, &ib, BlockClass::GroupMeta)?;
                done.push(format!(
                    "group {g}: inode bitmap (block {}) rewritten",
                    gd.inode_bitmap
                ));
            }
            if c.sb.metadata_csum() {
                gd.inode_bitmap_csum = want_csum;
            }
        }
        gd.free_blocks = free_blocks as u32;
        gd.free_inodes = free_inodes as u32;
        gd.used_dirs = dirs as u32;
        gd.encode_counts();
        if let Some(sum) = GroupDesc::computed_checksum(&c.sb, seed, g, &gd.raw) {
            put_le16(&mut gd.raw, GD_CHECKSUM, sum);
        }
        if gd.raw != c.gds[gi].raw {
            gd_changed[gi] = true;
            done.push(format!(
                "group {g}: descriptor counts set to {free_blocks} free blocks, {free_inodes} free \
                 inodes, {dirs} directories"
            ));
            c.gds[gi] = GroupDesc::decode(&gd.raw);
        }
    }
    // Write the changed GDT blocks (primary copy).
    let ds = c.geo.desc_size as usize;
    let gdt_first = c.geo.first_data_block + 1;
    for blk_idx in 0..c.geo.gdt_blocks {
        let per = bs / ds;
        let g0 = blk_idx as usize * per;
        let g1 = (g0 + per).min(c.geo.groups as usize);
        if !(g0..g1).any(|g| gd_changed[g]) {
            continue;
        }
        let mut block = disk.read_block(gdt_first + blk_idx, BlockClass::GroupMeta)?;
        for g in g0..g1 {
            let off = (g - g0) * ds;
            block[off..off + ds].copy_from_slice(&c.gds[g].raw);
        }
        disk.write_block(gdt_first + blk_idx, &block, BlockClass::GroupMeta)?;
    }

    // Superblock.
    let mut raw = c.sb.raw.clone();
    put_le32(&mut raw, SB_FREE_BLOCKS_LO, total_free_blocks as u32);
    if c.sb.has_incompat(INCOMPAT_64BIT) {
        put_le32(
            &mut raw,
            SB_FREE_BLOCKS_HI,
            (total_free_blocks >> 32) as u32,
        );
    }
    put_le32(&mut raw, SB_FREE_INODES, total_free_inodes as u32);
    if !orphans.is_empty() || c.sb.last_orphan != 0 {
        put_le32(&mut raw, SB_LAST_ORPHAN, 0);
    }
    if c.sb.metadata_csum() {
        let sum = Super::computed_checksum(&raw);
        put_le32(&mut raw, SB_CHECKSUM, sum);
    }
    if raw != c.sb.raw {
        disk.write_bytes(1024, &raw, BlockClass::Super)?;
        done.push(format!(
            "superblock: free counts set to {total_free_blocks} blocks, {total_free_inodes} \
             inodes{}",
            if c.sb.last_orphan != 0 {
                ", orphan list cleared"
            } else {
                ""
            }
        ));
        c.sb = Super::decode(&raw);
    }
    disk.flush()?;
    Ok(done)
}
