//! Pass 0: the superblock and the group descriptors, before any inode is
//! read (e2fsck's `super.c`, which runs ahead of its pass 1).
//!
//! Checks: the superblock's sanity (magic, checksum, block and group
//! geometry, inode size, descriptor size, that it fits the device) and the
//! features this checker covers; a primary superblock that fails while a
//! backup in group 1 is valid stops the check there, as e2fsck falls back
//! to the backup. Then every group descriptor: its checksum, that its
//! bitmaps and inode table lie inside its group (inside the file system
//! under `flex_bg`) and overlap no other metadata, the `*_UNINIT` flags
//! and `bg_itable_unused`, and counts that are out of range. It marks
//! every metadata block (superblocks, GDT, reserved GDT, bitmaps, inode
//! tables) as used, for pass 1's ownership checks and pass 5.
//!
//! Repairs: a group descriptor checksum alone is reported as info and the
//! benign repair rewrites it; out-of-range group counts are benign (pass 5
//! recounts them). Everything else here is unsafe and never repaired.

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use super::Disk;
use crate::error::FsError;

impl<'a> Checker<'a> {
    pub(super) fn pass0(&mut self) -> Result<(), FsError> {
        let sb_block = if self.geo.block_size == 1024 { 1 } else { 0 };
        if self.sb.metadata_csum() {
            let want = Super::computed_checksum(&self.sb.raw);
            if want != self.sb.checksum {
                problem!(
                    self,
                    Unsafe,
                    Superblock,
                    None,
                    Some(sb_block),
                    "superblock (block {sb_block}) s_checksum is {:#010x}, computed {want:#010x}",
                    self.sb.checksum
                );
            }
        }
        // Group descriptors.
        let gdt_first = self.geo.first_data_block + 1;
        let gdt = self
            .disk
            .read_blocks(gdt_first, self.geo.gdt_blocks, BlockClass::GroupMeta)?;
        let ds = self.geo.desc_size as usize;
        let seed = self.geo.csum_seed;
        let groups = self.geo.groups;
        for g in 0..groups {
            let raw = &gdt[g as usize * ds..(g as usize + 1) * ds];
            let gd = GroupDesc::decode(raw);
            let gd_block = gdt_first + (g as u64 * ds as u64) / self.geo.block_size;
            if let Some(want) = GroupDesc::computed_checksum(&self.sb, seed, g, raw) {
                if want != gd.checksum {
                    // `e2fsck -n` reports this and exits 0 when nothing
                    // else is wrong; the kernel refuses to mount it, and
                    // the repair rewrites the checksum.
                    problem!(
                        self,
                        Info,
                        GroupDescriptor,
                        None,
                        Some(gd_block),
                        "group {g} descriptor (block {gd_block}) bg_checksum is {:#06x}, computed \
                         {want:#06x} (the kernel will not mount this until it is repaired)",
                        gd.checksum
                    );
                }
            }
            self.gds.push(gd);
            self.gd_ok.push(true);
        }
        // Metadata of every group.
        for g in 0..groups {
            let first = self.geo.group_first_block(g);
            if group_has_super(&self.sb, g) {
                let n = 1 + self.geo.gdt_blocks + self.sb.reserved_gdt_blocks as u64;
                for b in first..first + n {
                    if b < self.geo.blocks_count {
                        self.meta.set(b);
                    }
                }
            }
        }
        for g in 0..groups {
            self.check_group_desc(g);
        }
        for b in 0..self.geo.blocks_count {
            if self.meta.get(b) {
                self.used.set(b);
            }
        }
        Ok(())
    }

    fn check_group_desc(&mut self, g: u32) {
        let gd = self.gds[g as usize].clone();
        let gd_block = self.geo.first_data_block
            + 1
            + (g as u64 * self.geo.desc_size as u64) / self.geo.block_size;
        let flex = self.sb.has_incompat(INCOMPAT_FLEX_BG);
        let gfirst = self.geo.group_first_block(g);
        let glast = gfirst + self.geo.group_block_count(g);
        let (fdb, nblocks) = (self.geo.first_data_block, self.geo.blocks_count);
        let within = |b: u64, n: u64| {
            if flex {
                b >= fdb && b.saturating_add(n) <= nblocks
            } else {
                b >= gfirst && b.saturating_add(n) <= glast
            }
        };
        let items = [
            ("bg_block_bitmap", gd.block_bitmap, 1u64),
            ("bg_inode_bitmap", gd.inode_bitmap, 1),
            ("bg_inode_table", gd.inode_table, self.geo.itable_blocks),
        ];
        for (field, b, n) in items {
            if !within(b, n) {
                problem!(
                    self,
                    Unsafe,
                    GroupDescriptor,
                    None,
                    Some(gd_block),
                    "group {g} descriptor (block {gd_block}) {field} = {b} is outside {}",
                    if flex { "the file system" } else { "its group" }
                );
                self.gd_ok[g as usize] = false;
                continue;
            }
            let mut clash = None;
            for x in b..b + n {
                if self.meta.set(x) && clash.is_none() {
                    clash = Some(x);
                }
            }
            if let Some(x) = clash {
                problem!(
                    self,
                    Unsafe,
                    BlockConflict,
                    None,
                    Some(x),
                    "group {g} descriptor (block {gd_block}) {field} = {b}: block {x} is already \
                     used by other file-system metadata"
                );
            }
        }
        let csum = self.sb.gdt_csum();
        let ipg = self.geo.inodes_per_group;
        // Without group checksums libext2fs ignores these fields, and
        // e2fsck reports them without counting an error.
        if !csum && (gd.flags & (BG_BLOCK_UNINIT | BG_INODE_UNINIT) != 0 || gd.itable_unused != 0) {
            problem!(
                self,
                Info,
                GroupDescriptor,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) bg_flags {:#x} / bg_itable_unused {} set \
                 without group checksums",
                gd.flags,
                gd.itable_unused
            );
        }
        if g == self.geo.groups - 1 && gd.flags & BG_BLOCK_UNINIT != 0 {
            problem!(
                self,
                Info,
                GroupDescriptor,
                None,
                Some(gd_block),
                "last group {g} descriptor (block {gd_block}) has BLOCK_UNINIT set"
            );
        }
        if csum && (gd.itable_unused > ipg || gd.itable_unused > gd.free_inodes) {
            problem!(
                self,
                Unsafe,
                GroupDescriptor,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) bg_itable_unused {} exceeds free inodes \
                 {} or inodes per group {ipg}",
                gd.itable_unused,
                gd.free_inodes
            );
        }
        if gd.free_blocks as u64 > self.geo.blocks_per_group
            || gd.free_inodes > ipg
            || gd.used_dirs > ipg
        {
            problem!(
                self,
                Benign,
                GroupCounts,
                None,
                Some(gd_block),
                "group {g} descriptor (block {gd_block}) counts out of range: free blocks {}, \
                 free inodes {}, directories {}",
                gd.free_blocks,
                gd.free_inodes,
                gd.used_dirs
            );
        }
    }
}

/// Superblock sanity: everything the rest of the checker relies on.
pub(super) fn validate_super(sb: &Super, device_bytes: u64) -> Result<(), String> {
    if sb.magic != EXT4_MAGIC {
        return Err(format!(
            "s_magic is {:#06x}, not {EXT4_MAGIC:#06x}",
            sb.magic
        ));
    }
    if sb.metadata_csum() {
        let want = Super::computed_checksum(&sb.raw);
        if want != sb.checksum {
            return Err(format!(
                "s_checksum is {:#010x}, computed {want:#010x}",
                sb.checksum
            ));
        }
    }
    if sb.log_block_size > 6 {
        return Err(format!(
            "s_log_block_size {} is too large",
            sb.log_block_size
        ));
    }
    let bs = 1024u64 << sb.log_block_size;
    if sb.blocks_count == 0 || sb.blocks_per_group == 0 || sb.inodes_per_group == 0 {
        return Err("s_blocks_count / s_blocks_per_group / s_inodes_per_group is zero".into());
    }
    if sb.blocks_per_group as u64 > 8 * bs || sb.inodes_per_group as u64 > 8 * bs {
        return Err(format!(
            "s_blocks_per_group {} / s_inodes_per_group {} exceed one bitmap block",
            sb.blocks_per_group, sb.inodes_per_group
        ));
    }
    if sb.clusters_per_group != sb.blocks_per_group {
        return Err(format!(
            "s_clusters_per_group {} differs from s_blocks_per_group {}",
            sb.clusters_per_group, sb.blocks_per_group
        ));
    }
    let want_first = if bs == 1024 { 1 } else { 0 };
    if sb.first_data_block != want_first {
        return Err(format!(
            "s_first_data_block is {}, should be {want_first}",
            sb.first_data_block
        ));
    }
    if sb.blocks_count <= sb.first_data_block as u64 {
        return Err(format!("s_blocks_count {} is too small", sb.blocks_count));
    }
    let groups =
        (sb.blocks_count - sb.first_data_block as u64).div_ceil(sb.blocks_per_group as u64);
    if groups * sb.inodes_per_group as u64 != sb.inodes_count as u64 {
        return Err(format!(
            "s_inodes_count {} is not {groups} groups of {} inodes",
            sb.inodes_count, sb.inodes_per_group
        ));
    }
    let isz = sb.inode_size as u64;
    if isz < 128 || !isz.is_power_of_two() || isz > bs {
        return Err(format!("s_inode_size {} is invalid", sb.inode_size));
    }
    if sb.rev_level > 0 && (sb.first_ino < 11 || sb.first_ino > sb.inodes_count) {
        return Err(format!("s_first_ino {} is invalid", sb.first_ino));
    }
    if sb.has_incompat(INCOMPAT_64BIT) {
        let d = sb.desc_size as u64;
        if !(64..=1024).contains(&d) || !d.is_power_of_two() {
            return Err(format!("s_desc_size {} is invalid", sb.desc_size));
        }
    }
    if sb.blocks_count.saturating_mul(bs) > device_bytes {
        return Err(format!(
            "s_blocks_count {} ({} bytes) is larger than the device ({device_bytes} bytes)",
            sb.blocks_count,
            sb.blocks_count.saturating_mul(bs)
        ));
    }
    Ok(())
}

/// Look for a valid backup superblock in group 1, for each block size.
pub(super) fn find_backup_super(disk: &Disk<'_>) -> Option<u64> {
    for log in 0..=2u32 {
        let bs = 1024u64 << log;
        let blk = bs * 8 + if bs == 1024 { 1 } else { 0 };
        let off = blk * bs;
        let Ok(raw) = read_super_bytes(disk, off) else {
            continue;
        };
        let sb = Super::decode(&raw);
        if sb.log_block_size == log && validate_super(&sb, disk.size_bytes()).is_ok() {
            return Some(blk);
        }
    }
    None
}

/// Refuse images whose features this checker does not cover.
pub(super) fn check_features(sb: &Super) -> Result<(), FsError> {
    let mut bad = Vec::new();
    let incompat = [
        (INCOMPAT_COMPRESSION, "compression"),
        (INCOMPAT_JOURNAL_DEV, "journal_dev"),
        (INCOMPAT_META_BG, "meta_bg"),
        (INCOMPAT_MMP, "mmp"),
        (INCOMPAT_EA_INODE, "ea_inode"),
        (INCOMPAT_DIRDATA, "dirdata"),
        (INCOMPAT_INLINE_DATA, "inline_data"),
        (INCOMPAT_ENCRYPT, "encrypt"),
        (INCOMPAT_CASEFOLD, "casefold"),
    ];
    for (f, name) in incompat {
        if sb.has_incompat(f) {
            bad.push(name);
        }
    }
    let known_incompat = INCOMPAT_FILETYPE
        | INCOMPAT_RECOVER
        | INCOMPAT_EXTENTS
        | INCOMPAT_64BIT
        | INCOMPAT_FLEX_BG
        | INCOMPAT_CSUM_SEED
        | INCOMPAT_LARGEDIR
        | incompat.iter().fold(0, |a, (f, _)| a | f);
    if sb.incompat & !known_incompat != 0 {
        bad.push("unknown incompat flags");
    }
    let ro = [
        (RO_COMPAT_BIGALLOC, "bigalloc"),
        (RO_COMPAT_QUOTA, "quota"),
        (RO_COMPAT_PROJECT, "project"),
        (RO_COMPAT_VERITY, "verity"),
    ];
    for (f, name) in ro {
        if sb.has_ro_compat(f) {
            bad.push(name);
        }
    }
    if sb.has_compat(COMPAT_ORPHAN_FILE) {
        bad.push("orphan_file");
    }
    if sb.has_compat(COMPAT_HAS_JOURNAL) && sb.journal_inum == 0 {
        bad.push("external journal");
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(FsError::Unsupported(format!(
            "fsck does not check images with: {}",
            bad.join(", ")
        )))
    }
}

pub(super) fn geometry(sb: &Super) -> Geometry {
    let block_size = 1024u64 << sb.log_block_size;
    let groups =
        (sb.blocks_count - sb.first_data_block as u64).div_ceil(sb.blocks_per_group as u64) as u32;
    let desc_size = if sb.has_incompat(INCOMPAT_64BIT) {
        sb.desc_size as u32
    } else {
        32
    };
    Geometry {
        block_size,
        blocks_count: sb.blocks_count,
        first_data_block: sb.first_data_block as u64,
        blocks_per_group: sb.blocks_per_group as u64,
        inodes_per_group: sb.inodes_per_group,
        inodes_count: sb.inodes_count,
        groups,
        inode_size: sb.inode_size as u32,
        desc_size,
        itable_blocks: (sb.inodes_per_group as u64 * sb.inode_size as u64).div_ceil(block_size),
        gdt_blocks: (groups as u64 * desc_size as u64).div_ceil(block_size),
        csum_seed: sb.csum_seed(),
    }
}
