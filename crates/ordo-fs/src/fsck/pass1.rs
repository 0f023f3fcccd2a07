//! Pass 1: every inode e2fsck would scan (e2fsck's `pass1.c`).
//!
//! Follows the orphan chain from `s_last_orphan` first (a loop or an
//! illegal inode in it is unsafe), then reads each group's inode table,
//! skipping `INODE_UNINIT` groups and the `bg_itable_unused` tail as
//! e2fsck does. For each inode: its checksum, mode, flags, dtime, the
//! reserved inodes (root, journal, resize), device inodes, fast and slow
//! symlinks, i_size against what is mapped, and i_blocks against the
//! blocks counted. The mapping itself (extent tree or block map, block
//! ownership) is walked by `pass1_blocks.rs`, the extended attributes (in
//! the inode and in a block) by `pass1_xattr.rs`. What it keeps
//! about every in-use inode ([`InodeInfo`]) feeds passes 2 to 5; the xattr
//! block refcounts are compared once every inode is scanned.
//!
//! Repairs (through the benign repair, from what this pass records):
//! i_blocks *higher* than the blocks mapped (lowered), an xattr block's
//! h_refcount *higher* than the inodes naming it (lowered), and unused
//! inodes with a mode but no dtime. i_blocks or a refcount too low, and
//! everything else found here, is unsafe.

use std::collections::HashSet;

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use super::pass1_blocks::Mapping;
use crate::error::FsError;

impl<'a> Checker<'a> {
    fn collect_orphans(&mut self) -> Result<(), FsError> {
        let mut ino = self.sb.last_orphan;
        let mut seen = HashSet::new();
        // The inode whose i_dtime gave `ino`, and whether it was free.
        let mut from: Option<(u32, bool)> = None;
        while ino != 0 {
            if ino < self.sb.first_ino || ino > self.geo.inodes_count {
                match from {
                    // A freed inode's i_dtime is its deletion time: the
                    // chain still names an inode already released (the
                    // orphan list is a delayed write for the protocols
                    // without a journal, so the pointer to a released
                    // orphan may outlive it). The list ends there, as the
                    // kernel ends it (ext4_orphan_get fails, s_last_orphan
                    // is cleared) and e2fsck drops it
                    // (PR_0_ORPHAN_ILLEGAL_INODE, then a full check).
                    Some((prev, true)) => problem!(
                        self,
                        Benign,
                        Orphan,
                        Some(prev),
                        None,
                        "orphan list reaches released inode {prev}, whose i_dtime {ino} is \
                         its deletion time: the list ends there"
                    ),
                    _ => problem!(
                        self,
                        Unsafe,
                        Orphan,
                        Some(ino),
                        None,
                        "orphan list (superblock s_last_orphan / i_dtime chain) names illegal inode {ino}"
                    ),
                }
                break;
            }
            if !seen.insert(ino) {
                problem!(
                    self,
                    Unsafe,
                    Orphan,
                    Some(ino),
                    None,
                    "orphan list loops back to inode {ino}"
                );
                break;
            }
            let Some(inode) = self.read_inode(ino)? else {
                break;
            };
            self.orphans.push(ino);
            from = Some((ino, inode.links == 0));
            ino = inode.dtime;
        }
        Ok(())
    }

    pub(super) fn pass1(&mut self) -> Result<(), FsError> {
        self.collect_orphans()?;
        let orphan_set: HashSet<u32> = self.orphans.iter().copied().collect();
        let isz = self.geo.inode_size as u64;
        let bs = self.geo.block_size;
        let ipg = self.geo.inodes_per_group;
        let is64 = self.sb.has_incompat(INCOMPAT_64BIT);
        // Reserved inodes are always in use.
        for ino in 1..self.sb.first_ino.min(self.geo.inodes_count + 1) {
            self.inode_used.set(ino as u64);
        }
        for g in 0..self.geo.groups {
            if !self.gd_ok[g as usize] {
                continue;
            }
            let n = self.scan_limit(g);
            if n == 0 {
                continue;
            }
            let nblocks = (n as u64 * isz).div_ceil(bs);
            let table = self.gds[g as usize].inode_table;
            // Read the table in bounded chunks.
            let chunk_blocks = 64u64;
            let mut blk = 0;
            while blk < nblocks {
                let cnt = chunk_blocks.min(nblocks - blk);
                let buf = self
                    .disk
                    .read_blocks(table + blk, cnt, BlockClass::InodeTable)?;
                let per_block = bs / isz;
                for i in 0..cnt * per_block {
                    let idx = blk * per_block + i;
                    if idx >= n as u64 {
                        break;
                    }
                    let ino = g * ipg + idx as u32 + 1;
                    let off = (i * isz) as usize;
                    let inode = Inode::decode(&buf[off..off + isz as usize], is64);
                    self.inode_scanned.set(ino as u64);
                    let itable_block = table + blk + i / per_block;
                    self.check_inode(ino, inode, itable_block, orphan_set.contains(&ino))?;
                }
                blk += cnt;
            }
        }
        // Xattr block reference counts.
        let mut xs: Vec<_> = self.xattr.iter().map(|(&b, &v)| (b, v)).collect();
        xs.sort();
        for (b, (counted, on_disk)) in xs {
            if on_disk > counted {
                // An in-place file system raises the count before it sets
                // an inode's pointer and lowers it after clearing one: a
                // crash between the two leaves it too high. Nothing that
                // refers to the block is lost; the repair lowers it.
                problem!(
                    self,
                    Benign,
                    Xattr,
                    None,
                    Some(b),
                    "xattr block {b} h_refcount is {on_disk}, {counted} inodes refer to it \
                     (too high)"
                );
            } else if on_disk < counted {
                problem!(
                    self,
                    Unsafe,
                    Xattr,
                    None,
                    Some(b),
                    "xattr block {b} h_refcount is {on_disk}, {counted} inodes refer to it \
                     (too low)"
                );
            }
        }
        Ok(())
    }

    fn check_inode(
        &mut self,
        ino: u32,
        inode: Inode,
        iblock: u64,
        on_orphan_list: bool,
    ) -> Result<(), FsError> {
        let seed = self.geo.csum_seed;
        if self.sb.metadata_csum() && !inode.checksum_ok(seed, ino) {
            let want = inode.computed_checksum(seed, ino);
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_checksum does not match (computed {want:#010x})"
            );
        }
        let reserved = ino < self.sb.first_ino;
        if reserved && ino != 2 {
            return self.check_reserved_inode(ino, &inode, iblock);
        }
        if inode.links == 0 {
            if on_orphan_list {
                problem!(
                    self,
                    Benign,
                    Orphan,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) is on the orphan list with i_links_count 0: \
                     pending release"
                );
            }
            if ino == 2 {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "root inode (block {iblock}) is not in use (i_links_count 0)"
                );
            } else if inode.dtime == 0 && inode.mode != 0 {
                problem!(
                    self,
                    Benign,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "deleted inode {ino} (block {iblock}) has i_mode {:#o} but zero i_dtime",
                    inode.mode
                );
                self.zero_dtime.push(ino);
            }
            return Ok(());
        }
        self.inode_used.set(ino as u64);
        if inode.dtime != 0 {
            if on_orphan_list {
                problem!(
                    self,
                    Benign,
                    Orphan,
                    Some(ino),
                    Some(iblock),
                    "in-use inode {ino} (block {iblock}) is on the orphan list (i_dtime {})",
                    inode.dtime
                );
            } else {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "in-use inode {ino} (block {iblock}) has i_dtime {} set",
                    inode.dtime
                );
            }
        } else if on_orphan_list {
            problem!(
                self,
                Info,
                Orphan,
                Some(ino),
                Some(iblock),
                "in-use inode {ino} (block {iblock}) is on the orphan list"
            );
        }
        self.check_inode_fields(ino, &inode, iblock);
        let mut info = InodeInfo {
            mode: inode.mode,
            links: inode.links,
            flags: inode.flags,
            generation: inode.generation,
            dir_blocks: Vec::new(),
            claimed: Vec::new(),
            xattr_block: None,
        };
        let ftype = inode.file_type();
        if ino == 2 && ftype != S_IFDIR {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "root inode (block {iblock}) i_mode {:#o} is not a directory",
                inode.mode
            );
        }
        let mut counted_blocks: u64 = 0;
        match ftype {
            S_IFREG | S_IFDIR | S_IFLNK => {
                let fast_symlink = ftype == S_IFLNK && inode.size > 0 && inode.size < 60;
                if fast_symlink {
                    self.check_fast_symlink(ino, &inode, iblock);
                } else if inode.flags & INODE_EXTENTS_FL != 0 {
                    let m = self.walk_extents(ino, &inode, iblock, &mut info)?;
                    counted_blocks += m.blocks;
                    self.check_sizes(ino, &inode, iblock, &m);
                    if ftype == S_IFLNK {
                        self.check_slow_symlink(ino, &inode, iblock, &m)?;
                    }
                } else if inode.flags & INODE_INLINE_DATA_FL != 0 {
                    problem!(
                        self,
                        Unsafe,
                        Inode,
                        Some(ino),
                        Some(iblock),
                        "inode {ino} (block {iblock}) i_flags has INLINE_DATA without the feature"
                    );
                } else {
                    let m = self.walk_block_map(ino, &inode, iblock, &mut info)?;
                    counted_blocks += m.blocks;
                    self.check_sizes(ino, &inode, iblock, &m);
                    if ftype == S_IFLNK {
                        self.check_slow_symlink(ino, &inode, iblock, &m)?;
                    }
                }
            }
            S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {
                self.check_special(ino, &inode, iblock);
            }
            _ => {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_mode {:#o} has an invalid file type",
                    inode.mode
                );
            }
        }
        if inode.file_acl != 0 {
            counted_blocks += self.check_xattr_block(ino, &inode, iblock, &mut info)?;
        }
        // i_blocks.
        let huge = self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE);
        let stored = inode.blocks_lo as u64
            | if huge {
                (inode.blocks_hi as u64) << 32
            } else {
                0
            };
        let want = if huge && inode.flags & INODE_HUGE_FILE_FL != 0 {
            counted_blocks
        } else {
            counted_blocks * (self.geo.block_size / 512)
        };
        if stored > want {
            // Too high: a block was counted before its mapping was set, or
            // is still counted after its mapping was cleared (the two are
            // separate in-place writes). Nothing mapped is lost; the
            // repair lowers the count, as FFS's fsck does.
            problem!(
                self,
                Benign,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks is {stored}, counted {want} (too high)"
            );
            self.high_iblocks.push((ino, want));
        } else if stored < want {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks is {stored}, counted {want} (too low)"
            );
        }
        if info.is_dir() && info.dir_blocks.is_empty() {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "directory inode {ino} (block {iblock}) has no blocks"
            );
        }
        self.inodes.insert(ino, info);
        Ok(())
    }

    fn check_inode_fields(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        let isz = self.geo.inode_size as u16;
        if isz > 128 {
            let max = isz - 128;
            let e = inode.extra_isize;
            if e != 0 && (e < 4 || e > max || e & 3 != 0) {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_extra_isize {e} is invalid"
                );
            } else {
                // As e2fsck: the attribute area is looked at only behind
                // a valid i_extra_isize.
                self.check_ibody_xattrs(ino, inode, iblock);
            }
        }
        if inode.faddr != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_faddr is {}, should be zero",
                inode.faddr
            );
        }
        if inode.is_dir() && inode.size_high != 0 && !self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "directory inode {ino} (block {iblock}) i_size_high is {}, should be zero",
                inode.size_high
            );
        }
        if !self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) && inode.blocks_hi != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_blocks_hi is {}, should be zero",
                inode.blocks_hi
            );
        }
        if !self.sb.has_incompat(INCOMPAT_64BIT) && inode.file_acl_hi != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_file_acl_hi is {}, should be zero",
                inode.file_acl_hi
            );
        }
        if inode.flags & INODE_EXTENTS_FL != 0 && !self.sb.has_incompat(INCOMPAT_EXTENTS) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has EXTENTS without the extent feature"
            );
        }
        if inode.flags & INODE_INDEX_FL != 0
            && (!inode.is_dir() || !self.sb.has_compat(COMPAT_DIR_INDEX))
        {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has INDEX on a {} without dir_index",
                if inode.is_dir() {
                    "directory"
                } else {
                    "non-directory"
                }
            );
        }
        if inode.flags & INODE_HUGE_FILE_FL != 0 && !self.sb.has_ro_compat(RO_COMPAT_HUGE_FILE) {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has HUGE_FILE without the feature"
            );
        }
        if inode.flags & INODE_EA_INODE_FL != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_flags has EA_INODE without the feature"
            );
        }
    }

    /// The resize inode (7), as e2fsck's `check_resize_inode` and pass 1
    /// see it. Without `resize_inode` it must map nothing. With it, its only
    /// pointer is the double-indirect block, whose entries name the
    /// reserved GDT blocks after the group descriptors (at offset
    /// `gdt_blocks + i` modulo the entries per block), each of which lists
    /// its copies in the groups that hold a superblock backup; `i_blocks`
    /// counts all of them. The reserved GDT blocks are metadata already
    /// (pass 0); the double-indirect block is claimed here.
    fn check_resize_inode(
        &mut self,
        inode: &Inode,
        iblock: u64,
        info: &mut InodeInfo,
    ) -> Result<(), FsError> {
        const DIND: usize = 13;
        let ptrs: Vec<u64> = (0..15)
            .map(|i| le32(inode.i_block(), i * 4) as u64)
            .collect();
        if !self.sb.has_compat(COMPAT_RESIZE_INODE) {
            if ptrs.iter().any(|&p| p != 0) {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(7),
                    Some(iblock),
                    "resize inode 7 (block {iblock}) i_block is not empty without the resize_inode feature"
                );
            }
            return Ok(());
        }
        let dind = ptrs[DIND];
        let stray = ptrs
            .iter()
            .enumerate()
            .find(|&(i, &p)| i != DIND && p != 0)
            .map(|(i, _)| i);
        let why = if let Some(i) = stray {
            Some(format!(
                "i_block[{i}] is {}, only the double-indirect block may be set",
                ptrs[i]
            ))
        } else if dind == 0 {
            Some("i_block[13] (double-indirect block) is 0".to_string())
        } else if dind < self.geo.first_data_block || dind >= self.geo.blocks_count {
            Some(format!(
                "i_block[13] (double-indirect block) {dind} is outside the file system"
            ))
        } else if inode.links == 0 {
            Some("i_links_count is 0".to_string())
        } else if inode.file_type() != S_IFREG {
            Some(format!("i_mode {:#o} is not a regular file", inode.mode))
        } else {
            None
        };
        if let Some(why) = why {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(7),
                Some(iblock),
                "resize inode 7 (block {iblock}): {why}"
            );
            return Ok(());
        }
        self.claim(7, dind, 1, "resize inode double-indirect block", info);
        let per_block = (self.geo.block_size / 4) as usize;
        let backups: Vec<u64> = (1..self.geo.groups)
            .filter(|&g| group_has_super(&self.sb, g))
            .map(u64::from)
            .collect();
        let rsv = self.sb.reserved_gdt_blocks as usize;
        let dbuf = self.disk.read_block(dind, BlockClass::Other)?;
        let mut counted = 1u64;
        for i in 0..rsv {
            let off = (self.geo.gdt_blocks as usize + i) % per_block;
            let want = self.geo.first_data_block + 1 + self.geo.gdt_blocks + i as u64;
            let got = le32(&dbuf, off * 4) as u64;
            if got != want {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(7),
                    Some(dind),
                    "resize inode 7: double-indirect block {dind} entry {off} is {got}, should be reserved GDT block {want}"
                );
                return Ok(());
            }
            counted += 1;
            let ibuf = self.disk.read_block(want, BlockClass::Other)?;
            for (k, &g) in backups.iter().enumerate().take(per_block) {
                let copy = want + g * self.geo.blocks_per_group;
                if copy >= self.geo.blocks_count {
                    break;
                }
                let got = le32(&ibuf, k * 4) as u64;
                if got != copy {
                    problem!(
                        self,
                        Unsafe,
                        Inode,
                        Some(7),
                        Some(want),
                        "resize inode 7: reserved GDT block {want} entry {k} is {got}, should be its copy {copy} in group {g}"
                    );
                    return Ok(());
                }
                counted += 1;
            }
        }
        let stored = inode.blocks_lo as u64;
        let want = counted * (self.geo.block_size / 512);
        if stored != want {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(7),
                Some(iblock),
                "resize inode 7 (block {iblock}) i_blocks is {stored}, should be {want}"
            );
        }
        Ok(())
    }

    fn check_reserved_inode(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
    ) -> Result<(), FsError> {
        let journal = self.sb.has_compat(COMPAT_HAS_JOURNAL) && ino == self.sb.journal_inum;
        let bad_mode = match ino {
            1 | 8 => false,
            5 => inode.is_dir(),
            7 => inode.mode != 0 && inode.file_type() != S_IFREG,
            _ => inode.mode != 0,
        };
        if bad_mode && !journal {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "reserved inode {ino} (block {iblock}) has bad i_mode {:#o}",
                inode.mode
            );
        }
        let mut info = InodeInfo {
            mode: inode.mode,
            links: inode.links,
            flags: inode.flags,
            generation: inode.generation,
            dir_blocks: Vec::new(),
            claimed: Vec::new(),
            xattr_block: None,
        };
        if ino == 7 {
            return self.check_resize_inode(inode, iblock, &mut info);
        }
        if inode.mode != 0 && inode.flags & INODE_EXTENTS_FL != 0 {
            let m = self.walk_extents(ino, inode, iblock, &mut info)?;
            if journal && m.blocks == 0 {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    Some(ino),
                    Some(iblock),
                    "journal inode {ino} (block {iblock}) has no blocks"
                );
            }
        } else if journal {
            problem!(
                self,
                Unsafe,
                Journal,
                Some(ino),
                Some(iblock),
                "journal inode {ino} (block {iblock}) is not an extent-mapped file (i_mode {:#o})",
                inode.mode
            );
        }
        Ok(())
    }

    fn check_special(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        // As e2fsck: extent/index flags make a device inode bogus, and
        // immutable/append are not allowed on one (i_block past the device
        // number is only looked at by e2fsck together with those flags).
        if inode.flags & (INODE_EXTENTS_FL | INODE_INDEX_FL | INODE_IMMUTABLE_FL | INODE_APPEND_FL)
            != 0
        {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "special inode {ino} (block {iblock}) has bad i_flags {:#x}",
                inode.flags
            );
        }
        if inode.size != 0 {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "special inode {ino} (block {iblock}) i_size is {}, should be zero",
                inode.size
            );
        }
    }

    fn check_fast_symlink(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        let ib = inode.i_block();
        let len = ib.iter().position(|&b| b == 0).unwrap_or(60) as u64;
        if inode.flags & INODE_EXTENTS_FL != 0 || len >= 60 || len != inode.size {
            problem!(
                self,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "fast symlink inode {ino} (block {iblock}) i_size {} does not match its target \
                 length {len} in i_block (or EXTENTS is set)",
                inode.size
            );
        }
    }

    fn check_slow_symlink(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        m: &Mapping,
    ) -> Result<(), FsError> {
        let bs = self.geo.block_size;
        let bad = |c: &mut Self, why: String| {
            problem!(
                c,
                Unsafe,
                Inode,
                Some(ino),
                Some(iblock),
                "symlink inode {ino} (block {iblock}): {why}"
            );
        };
        if inode.size == 0 || inode.size >= bs {
            bad(self, format!("i_size {} is invalid", inode.size));
            return Ok(());
        }
        if m.data_blocks != 1 || m.first_pblk.is_none() || m.last_lblk != Some(0) {
            bad(
                self,
                format!("maps {} blocks, should map exactly block 0", m.data_blocks),
            );
            return Ok(());
        }
        let pblk = m.first_pblk.unwrap_or(0);
        if !self.geo.in_range(pblk) {
            return Ok(());
        }
        let data = self.disk.read_block(pblk, BlockClass::Data)?;
        let len = data.iter().position(|&b| b == 0).unwrap_or(data.len()) as u64;
        if len != inode.size {
            bad(
                self,
                format!(
                    "target in block {pblk} is {len} bytes long, i_size is {}",
                    inode.size
                ),
            );
        }
        Ok(())
    }

    fn check_sizes(&mut self, ino: u32, inode: &Inode, iblock: u64, m: &Mapping) {
        let bs = self.geo.block_size;
        if inode.is_dir() {
            let nblock = inode.size / bs;
            let last_plus = m.last_lblk.map_or(0, |l| l + 1);
            let bad = !inode.size.is_multiple_of(bs)
                || nblock > last_plus
                || (nblock < last_plus && last_plus - nblock > self.sb.prealloc_dir_blocks as u64);
            if bad {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "directory inode {ino} (block {iblock}) i_size {} does not match its {} \
                     mapped blocks",
                    inode.size,
                    last_plus
                );
            }
        } else {
            let size = inode.size;
            let bits = bs.trailing_zeros();
            if let Some(l) = m.last_init_lblk {
                if size < l * bs {
                    problem!(
                        self,
                        Unsafe,
                        Inode,
                        Some(ino),
                        Some(iblock),
                        "inode {ino} (block {iblock}) i_size {size} is smaller than its last \
                         written block {l} allows"
                    );
                    return;
                }
            }
            let max = if inode.flags & INODE_EXTENTS_FL != 0 {
                (1u64 << (32 + bits)) - 1
            } else {
                block_map_max_size(bs)
            };
            if size > max {
                problem!(
                    self,
                    Unsafe,
                    Inode,
                    Some(ino),
                    Some(iblock),
                    "inode {ino} (block {iblock}) i_size {size} exceeds the largest file size {max}"
                );
            }
        }
    }
}

fn block_map_max_size(bs: u64) -> u64 {
    // e2fsck's ext2_max_sizes: what 12 direct pointers and single, double
    // and triple indirect blocks can map.
    let per = bs / 4;
    (12 + per + per * per + per * per * per) * bs
}
