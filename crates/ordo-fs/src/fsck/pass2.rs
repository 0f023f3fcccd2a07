//! Pass 2: directory contents (e2fsck's `pass2.c`).
//!
//! Reads every block of every directory pass 1 found: the rec_len chain,
//! names, file types against the inode's mode, "." and "..", the checksum
//! tail, and the htree root and index nodes (structure, limits, hash
//! ordering, checksums). Entries naming a free, unscanned or reserved inode
//! are unsafe. It counts the links entries give, records each directory's
//! "..", parent and names, for passes 3 and 4.
//!
//! Repairs: one shape of a directory named twice, exactly two names with
//! one of them in the directory its ".." names, which a crash inside a
//! rename of a directory leaves under rule 3: the other name is recorded
//! as stale, the benign repair removes it, and links are counted without
//! it. And, under `metadata_csum`, a block of a directory whose index flag
//! is clear that still has the shape of an htree root or node: ordo drops
//! a directory's index on its first change, the flag before the blocks
//! (`dir_unindex`), and a crash in between leaves those blocks, which
//! hold no names (a root's "." and ".." aside). The repair rewrites them
//! as the linear blocks the core would have written. Everything else found
//! here is unsafe.

use std::collections::{HashMap, HashSet};

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use crate::error::FsError;

impl<'a> Checker<'a> {
    pub(super) fn pass2(&mut self) -> Result<(), FsError> {
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dir())
            .map(|(&n, _)| n)
            .collect();
        for dir in dirs {
            self.check_dir(dir)?;
        }
        self.check_double_names();
        Ok(())
    }

    /// Directories named by more than one entry. One case is benign: a
    /// directory with exactly two names, one of them in the directory its
    /// `..` names. That is what a crash inside a rename of a directory
    /// leaves under rule 3 (the new entry is written before the old one is
    /// removed, and `..` follows the new entry), as FFS's fsck knows it:
    /// the name in the parent `..` does not name is stale and the repair
    /// removes it; link counts are then counted without it. When both
    /// names are in the `..` parent (a rename within one directory whose
    /// two entries are in different blocks) either name is the rename's
    /// outcome or its origin: the one found second is removed. Anything
    /// else (three names, or `..` naming neither holder) is unsafe.
    fn check_double_names(&mut self) {
        let mut multi: Vec<(u32, Vec<DirName>)> = self
            .dir_names
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(&d, v)| (d, v.clone()))
            .collect();
        multi.sort_by_key(|(d, _)| *d);
        for (d, names) in multi {
            let dd = self.dotdot.get(&d).copied();
            let stale = match (names.len(), dd) {
                (2, Some(dd)) if names[0].dir == dd => Some(1),
                (2, Some(dd)) if names[1].dir == dd => Some(0),
                _ => None,
            };
            match stale {
                Some(k) => {
                    let keep = &names[1 - k];
                    let gone = names[k].clone();
                    problem!(
                        self,
                        Benign,
                        Connectivity,
                        Some(d),
                        Some(gone.pblk),
                        "directory inode {d} has two names, '{}' in {} (its '..') and '{}' in                          {} (stale, from an interrupted rename)",
                        keep.name,
                        keep.dir,
                        gone.name,
                        gone.dir
                    );
                    self.parent.insert(d, keep.dir);
                    if let Some(c) = self.counted.get_mut(&d) {
                        *c = c.saturating_sub(1);
                    }
                    self.stale_names.push(gone);
                }
                None => {
                    let first = names[0].dir;
                    for n in &names[1..] {
                        problem!(
                            self,
                            Unsafe,
                            Connectivity,
                            Some(d),
                            Some(n.pblk),
                            "directory inode {d} is linked twice: from {first} and as '{}' in {}",
                            n.name,
                            n.dir
                        );
                    }
                }
            }
        }
    }

    fn check_dir(&mut self, dir: u32) -> Result<(), FsError> {
        let info = self.inodes[&dir].clone();
        let bs = self.geo.block_size as usize;
        let dseed = Inode::csum_seed(self.geo.csum_seed, dir, info.generation);
        let htree = info.flags & INODE_INDEX_FL != 0 && self.sb.has_compat(COMPAT_DIR_INDEX);
        let mut dx_nodes: HashSet<u64> = HashSet::new();
        let mut dx_ranges: HashMap<u64, (u32, u32)> = HashMap::new();
        let mut dx_root = false;
        if htree {
            if let Some(&(0, root_pblk)) = info.dir_blocks.first() {
                if self.geo.in_range(root_pblk) {
                    let root = self.disk.read_block(root_pblk, BlockClass::Directory)?;
                    dx_root = self.check_htree(
                        dir,
                        &info,
                        &root,
                        root_pblk,
                        dseed,
                        &mut dx_nodes,
                        &mut dx_ranges,
                    )?;
                }
            }
        }
        let mut saw_dot = false;
        let mut saw_dotdot = false;
        let hash_version = match info.dir_blocks.first() {
            Some(&(0, p)) if dx_root && self.geo.in_range(p) => {
                let v = self.disk.read_block(p, BlockClass::Directory)?[0x1C];
                if v <= 2 && self.sb.flags & 0x2 != 0 {
                    v + 3
                } else {
                    v
                }
            }
            _ => 0,
        };
        for &(lblk, pblk) in &info.dir_blocks {
            if !self.geo.in_range(pblk) {
                continue;
            }
            if dx_nodes.contains(&lblk) {
                continue; // checked by check_htree
            }
            let data = self.disk.read_block(pblk, BlockClass::Directory)?;
            let leftover = !htree && self.sb.metadata_csum() && is_leftover_dx(&data, lblk);
            if leftover {
                problem!(
                    self,
                    Benign,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk} (logical {lblk}) is an htree {} left by \
                     dropping the directory's index (no names in it)",
                    if lblk == 0 { "root" } else { "node" }
                );
                self.leftover_dx.push((dir, lblk, pblk));
            }
            let is_root_block = lblk == 0 && (dx_root || leftover);
            let end = if self.sb.metadata_csum() && !is_root_block {
                bs - 12
            } else {
                bs
            };
            if self.sb.metadata_csum() && !is_root_block && !leftover {
                let t = &data[bs - 12..];
                let tail_ok = le32(t, 0) == 0 && le16(t, 4) == 12 && t[6] == 0 && t[7] == 0xDE;
                if !tail_ok {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk} (logical {lblk}) has no checksum tail"
                    );
                } else {
                    let want = crc32c_raw(dseed, &data[..bs - 12]);
                    let have = le32(t, 8);
                    if want != have {
                        problem!(
                            self,
                            Unsafe,
                            Directory,
                            Some(dir),
                            Some(pblk),
                            "directory inode {dir} block {pblk} (logical {lblk}) tail \
                             det_checksum is {have:#010x}, computed {want:#010x}"
                        );
                    }
                }
            }
            let hashes = self.check_dir_entries(
                dir,
                lblk,
                pblk,
                &data[..end],
                &mut saw_dot,
                &mut saw_dotdot,
                dx_root.then_some(hash_version),
            );
            if let (Some(&(lo, hi)), Some((min, max))) = (dx_ranges.get(&lblk), hashes) {
                if min < lo || max > hi {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk} (logical {lblk}): entry \
                         hashes {min:#x}..{max:#x} fall outside the index range {lo:#x}..{hi:#x}"
                    );
                }
            }
        }
        if !saw_dot || !saw_dotdot {
            let b = info.dir_blocks.first().map(|&(_, p)| p);
            problem!(
                self,
                Unsafe,
                Directory,
                Some(dir),
                b,
                "directory inode {dir} is missing its {} entry",
                if !saw_dot { "\".\"" } else { "\"..\"" }
            );
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn check_dir_entries(
        &mut self,
        dir: u32,
        lblk: u64,
        pblk: u64,
        data: &[u8],
        saw_dot: &mut bool,
        saw_dotdot: &mut bool,
        hash_version: Option<u8>,
    ) -> Option<(u32, u32)> {
        let bs = self.geo.block_size;
        let mut range: Option<(u32, u32)> = None;
        let filetype = self.sb.has_incompat(INCOMPAT_FILETYPE);
        let mut off = 0usize;
        let mut index = 0usize;
        while off < data.len() {
            let ino = le32(data, off);
            let mut rec_len = le16(data, off + 4) as usize;
            if bs >= 65536 && (rec_len == 65535 || rec_len == 0) {
                rec_len = 65536;
            }
            let name_len = data.get(off + 6).copied().unwrap_or(0) as usize;
            let ftype = data.get(off + 7).copied().unwrap_or(0);
            if off + 8 > data.len()
                || rec_len < 12
                || !rec_len.is_multiple_of(4)
                || off + rec_len > data.len()
                || name_len + 8 > rec_len
            {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk} (logical {lblk}) offset {off}: rec_len \
                     {rec_len} / name_len {name_len} is corrupt"
                );
                return range;
            }
            let name = &data[off + 8..off + 8 + name_len];
            let shown = String::from_utf8_lossy(name).into_owned();
            let first_block = lblk == 0;
            if first_block && index == 0 {
                if name != b"." || ino != dir {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: first entry is '{shown}' -> {ino}, \
                         should be '.' -> {dir}"
                    );
                } else {
                    *saw_dot = true;
                }
            } else if first_block && index == 1 {
                if name != b".." || ino == 0 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: second entry is '{shown}', should \
                         be '..'"
                    );
                } else {
                    *saw_dotdot = true;
                    self.dotdot.insert(dir, ino);
                }
            } else if ino != 0 && (name == b"." || name == b"..") {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk} offset {off}: extra '{shown}' entry"
                );
            }
            let dot_entry = first_block && index < 2;
            let entry_off = off;
            index += 1;
            off += rec_len;
            if ino == 0 {
                continue;
            }
            if !dot_entry {
                if name_len == 0 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry -> {ino} has an empty name"
                    );
                    continue;
                }
                if name.iter().any(|&c| c == b'/' || c == 0) {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' has an illegal \
                         character in its name"
                    );
                }
            }
            if (ino != 2 && ino < self.sb.first_ino) || ino > self.geo.inodes_count {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' has bad inode number {ino}"
                );
                continue;
            }
            if !self.inode_scanned.get(ino as u64) {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' references inode {ino} \
                     in its group's uninitialized or unused inode area"
                );
                continue;
            }
            let Some(target) = self.inodes.get(&ino) else {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' names unused inode {ino}"
                );
                continue;
            };
            let tmode = target.mode;
            let tdir = target.is_dir();
            if filetype {
                let want = dirent_type(tmode);
                if ftype != want {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' file_type {ftype}, \
                         inode {ino} has type {want}"
                    );
                }
            } else if ftype != 0 {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "directory inode {dir} block {pblk}: entry '{shown}' file_type {ftype} set \
                     without the filetype feature"
                );
            }
            if !dot_entry {
                self.nonempty_dirs.insert(dir);
                if ino == 2 {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "directory inode {dir} block {pblk}: entry '{shown}' links to the root \
                         directory"
                    );
                } else if tdir {
                    // A second name is judged once every `..` is known
                    // (check_double_names).
                    self.parent.entry(ino).or_insert(dir);
                    self.dir_names.entry(ino).or_default().push(DirName {
                        dir,
                        pblk,
                        off: entry_off,
                        name: shown.clone(),
                        ino,
                    });
                }
            }
            *self.counted.entry(ino).or_insert(0) += 1;
            if let (Some(v), false) = (hash_version, dot_entry) {
                let h = dx_hash(v, name, &self.sb.hash_seed);
                range = Some(match range {
                    Some((lo, hi)) => (lo.min(h), hi.max(h)),
                    None => (h, h),
                });
            }
        }
        range
    }

    /// Check an htree root and its nodes; returns whether block 0 is a
    /// valid dx root (so its ".." covers the rest of the block), and fills
    /// `nodes` with the logical blocks that are index nodes.
    #[allow(clippy::too_many_arguments)]
    fn check_htree(
        &mut self,
        dir: u32,
        info: &InodeInfo,
        root: &[u8],
        root_pblk: u64,
        dseed: u32,
        nodes: &mut HashSet<u64>,
        ranges: &mut HashMap<u64, (u32, u32)>,
    ) -> Result<bool, FsError> {
        let bs = self.geo.block_size as usize;
        let csum_size = if self.sb.metadata_csum() { 8 } else { 0 };
        let numblocks = info.dir_blocks.len() as u64;
        let hash_version = root[0x1C];
        let info_len = root[0x1D];
        let levels = root[0x1E];
        let max_levels = if self.sb.has_incompat(INCOMPAT_LARGEDIR) {
            3
        } else {
            2
        };
        if le32(root, 0x18) != 0 || info_len != 8 || levels >= max_levels || hash_version > 5 {
            problem!(
                self,
                Unsafe,
                Directory,
                Some(dir),
                Some(root_pblk),
                "htree directory inode {dir} root block {root_pblk}: dx_root_info is invalid \
                 (hash {hash_version}, info_length {info_len}, levels {levels})"
            );
            return Ok(false);
        }
        let mut referenced: HashMap<u64, u32> = HashMap::new();
        // (logical block, count offset, depth)
        let mut queue = vec![(0u64, 0x20usize, 0u8, root.to_vec(), root_pblk)];
        let mut budget = numblocks + 1;
        while let Some((lblk, coff, depth, data, pblk)) = queue.pop() {
            let limit = le16(&data, coff) as usize;
            let count = le16(&data, coff + 2) as usize;
            let want_limit = (bs - coff - csum_size) / 8;
            if limit != want_limit || count > limit || count == 0 {
                problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(pblk),
                    "htree directory inode {dir} block {pblk} (logical {lblk}): dx limit {limit} \
                     / count {count}, expected limit {want_limit}"
                );
                continue;
            }
            if csum_size != 0 {
                let toff = coff + limit * 8;
                let c = crc32c_raw(dseed, &data[..coff + count * 8]);
                let c = crc32c_raw(c, &data[toff..toff + 4]);
                let want = crc32c_raw(c, &[0; 4]);
                let have = le32(&data, toff + 4);
                if want != have {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk} (logical {lblk}): dx_tail \
                         checksum is {have:#010x}, computed {want:#010x}"
                    );
                }
            }
            let mut prev_hash = 0u32;
            for i in 0..count {
                let e = coff + i * 8;
                let hash = if i == 0 { 0 } else { le32(&data, e) & !1 };
                let child = le32(&data, e + 4) as u64;
                if i > 0 && hash < prev_hash {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk}: dx entry {i} hash is out of order"
                    );
                }
                prev_hash = hash;
                if child == 0 || child >= numblocks {
                    problem!(
                        self,
                        Unsafe,
                        Directory,
                        Some(dir),
                        Some(pblk),
                        "htree directory inode {dir} block {pblk}: dx entry {i} points to block \
                         {child}, outside the directory"
                    );
                    continue;
                }
                *referenced.entry(child).or_insert(0) += 1;
                if depth == levels {
                    let next = if i + 1 < count {
                        le32(&data, e + 8) & !1
                    } else {
                        0xFFFF_FFFE
                    };
                    ranges.insert(child, (hash, next));
                }
                if depth < levels && referenced[&child] == 1 {
                    nodes.insert(child);
                    if budget == 0 {
                        continue;
                    }
                    budget -= 1;
                    let cp = info.dir_blocks[child as usize].1;
                    if !self.geo.in_range(cp) {
                        continue;
                    }
                    let nd = self.disk.read_block(cp, BlockClass::Directory)?;
                    let span = match le16(&nd, 4) as usize {
                        0 | 65535 if bs >= 65536 => 65536,
                        n => n,
                    };
                    if le32(&nd, 0) != 0 || span != bs {
                        problem!(
                            self,
                            Unsafe,
                            Directory,
                            Some(dir),
                            Some(cp),
                            "htree directory inode {dir} block {cp} (logical {child}): dx node \
                             header is not an empty entry spanning the block"
                        );
                        continue;
                    }
                    queue.push((child, 8, depth + 1, nd, cp));
                }
            }
        }
        for lb in 1..numblocks {
            match referenced.get(&lb).copied().unwrap_or(0) {
                1 => {}
                0 => problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(info.dir_blocks[lb as usize].1),
                    "htree directory inode {dir} logical block {lb} is not referenced by the index"
                ),
                n => problem!(
                    self,
                    Unsafe,
                    Directory,
                    Some(dir),
                    Some(info.dir_blocks[lb as usize].1),
                    "htree directory inode {dir} logical block {lb} is referenced {n} times"
                ),
            }
        }
        Ok(true)
    }
}

/// Whether a directory block with no checksum tail has the exact shape of
/// an htree root (logical block 0: "." of 12 bytes, ".." to the block's
/// end, a valid `dx_root_info`) or node (logical block > 0: one empty
/// entry over the whole block and a plausible count/limit): what an
/// interrupted drop of the index leaves. A linear block under
/// `metadata_csum` never has that shape, since its records end before its
/// tail.
pub(super) fn is_leftover_dx(data: &[u8], lblk: u64) -> bool {
    let bs = data.len();
    if bs < 64 {
        return false;
    }
    let (countlimit, limit_max) = if lblk == 0 {
        let dot = le32(data, 0) != 0 && le16(data, 4) == 12 && data[6] == 1 && &data[8..9] == b".";
        let dotdot_len = le16(data, 16) as usize;
        let dotdot = dotdot_len + 12 == bs && data[18] == 2 && &data[20..22] == b"..";
        // dx_root_info: reserved_zero, hash_version, info_length 8,
        // indirect_levels, unused_flags.
        let info = le32(data, 24) == 0 && data[28] <= 5 && data[29] == 8 && data[30] <= 3;
        if !(dot && dotdot && info) {
            return false;
        }
        (32, (bs - 32) / 8)
    } else {
        if le32(data, 0) != 0 || le16(data, 4) as usize != bs.min(65535) || data[6] != 0 {
            return false;
        }
        (8, (bs - 8) / 8)
    };
    let limit = le16(data, countlimit) as usize;
    let count = le16(data, countlimit + 2) as usize;
    limit > 0 && limit <= limit_max && count >= 1 && count <= limit
}

fn dirent_type(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => 1,
        S_IFDIR => 2,
        S_IFCHR => 3,
        S_IFBLK => 4,
        S_IFIFO => 5,
        S_IFSOCK => 6,
        S_IFLNK => 7,
        _ => 0,
    }
}
