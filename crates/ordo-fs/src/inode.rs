//! Inodes: decoding from the inode table, field changes as updates,
//! initialization, release, and the orphan list.
//!
//! Inodes live in the cached inode-table blocks; there is no second
//! in-memory copy to keep coherent. Reading decodes the 256 bytes (cheap);
//! every field change is one [`Core::modify`] of the field's bytes, with the
//! inode's checksum recomputed once at the end of the handle.
//!
//! Unlinked-but-open inodes and inodes being truncated at a crash are found
//! through ext4's classic orphan list: `s_last_orphan` names the first, and
//! each orphan's `i_dtime` names the next.

use ordo_dev::BlockClass;

use crate::error::{errno, FsError, Result};
use crate::layout::{self, decode_time, encode_time, ino as io, le16, le32};
use crate::state::Core;
use crate::types::{Attr, Creds, FileType, Timespec};
use crate::update::{Ino, InodeField, UpdateKind};

/// A decoded inode.
#[derive(Clone, Debug)]
pub(crate) struct Inode {
    pub ino: Ino,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub links: u16,
    /// `i_blocks` in 512-byte sectors (converted if `HUGE_FILE_FL`).
    pub sectors: u64,
    pub flags: u32,
    pub block: [u8; 60],
    pub generation: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub dtime: u32,
}

impl Inode {
    pub fn kind(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }
    pub fn is_reg(&self) -> bool {
        self.mode & 0o170000 == 0o100000
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & 0o170000 == 0o120000
    }
    pub fn uses_extents(&self) -> bool {
        self.flags & io::FL_EXTENTS != 0
    }
    /// The device number of a device node, as Linux decodes it.
    pub fn rdev(&self) -> u32 {
        let b0 = le32(&self.block, 0);
        if b0 != 0 {
            // old encoding: major 8 bits, minor 8 bits
            let major = (b0 >> 8) & 0xFF;
            let minor = b0 & 0xFF;
            new_encode_dev(major, minor)
        } else {
            le32(&self.block, 4)
        }
    }
}

/// Linux `new_encode_dev` of (major, minor).
pub fn new_encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// Linux `new_decode_dev`: (major, minor).
pub fn new_decode_dev(dev: u32) -> (u32, u32) {
    ((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

#[inline]
fn ts(raw: &[u8], lo: usize, extra: Option<usize>) -> Timespec {
    let e = extra.map(|x| le32(raw, x)).unwrap_or(0);
    let (sec, nsec) = decode_time(le32(raw, lo), e);
    Timespec { sec, nsec }
}

impl Core {
    /// Whether the inode has room for the extra field at `off` (4 bytes).
    fn has_extra(&self, raw: &[u8], off: usize) -> bool {
        self.seal.inode_size > 128 && 128 + le16(raw, io::EXTRA_ISIZE) as usize >= off + 4
    }

    /// Raw bytes of inode `ino`.
    pub fn inode_raw(&mut self, ino: Ino) -> Result<Vec<u8>> {
        let (img, off) = self.inode_image(ino)?;
        Ok(img[off..off + self.seal.inode_size as usize].to_vec())
    }

    /// The cached image of the inode-table block holding inode `ino`, and
    /// the inode's offset in it: its bytes without a copy.
    fn inode_image(&mut self, ino: Ino) -> Result<(std::sync::Arc<Vec<u8>>, usize)> {
        self.check_ino(ino)?;
        let (block, off) = self.inode_loc(ino);
        Ok((self.read_block(block, BlockClass::InodeTable)?, off))
    }

    /// Decode inode `ino` (no check that it is in use).
    pub fn read_inode(&mut self, ino: Ino) -> Result<Inode> {
        let (img, off) = self.inode_image(ino)?;
        let raw = &img[off..off + self.seal.inode_size as usize];
        let (block, _) = self.inode_loc(ino);
        let x = |off: usize| self.has_extra(raw, off).then_some(off);
        let flags = le32(raw, io::FLAGS);
        let mut sectors = le32(raw, io::BLOCKS_LO) as u64 | (le16(raw, io::BLOCKS_HI) as u64) << 32;
        if flags & io::FL_HUGE_FILE != 0 {
            sectors *= (self.bs / 512) as u64;
        }
        let mut block_bytes = [0u8; 60];
        block_bytes.copy_from_slice(&raw[io::BLOCK..io::BLOCK + 60]);
        let inode = Inode {
            ino,
            mode: le16(raw, io::MODE),
            uid: le16(raw, io::UID) as u32 | (le16(raw, io::UID_HI) as u32) << 16,
            gid: le16(raw, io::GID) as u32 | (le16(raw, io::GID_HI) as u32) << 16,
            size: le32(raw, io::SIZE_LO) as u64 | (le32(raw, io::SIZE_HI) as u64) << 32,
            links: le16(raw, io::LINKS),
            sectors,
            flags,
            block: block_bytes,
            generation: le32(raw, io::GENERATION),
            atime: ts(raw, io::ATIME, x(io::ATIME_EXTRA)),
            mtime: ts(raw, io::MTIME, x(io::MTIME_EXTRA)),
            ctime: ts(raw, io::CTIME, x(io::CTIME_EXTRA)),
            crtime: if self.has_extra(raw, io::CRTIME_EXTRA) {
                ts(raw, io::CRTIME, Some(io::CRTIME_EXTRA))
            } else {
                Timespec::default()
            },
            dtime: le32(raw, io::DTIME),
        };
        self.check_inode_head(ino, block, inode.mode, inode.links, inode.flags)?;
        Ok(inode)
    }

    /// The checks every decoded inode passes ([`Core::read_inode`]): its
    /// checksum, a file type for an inode in use, no inline data.
    fn check_inode_head(
        &self,
        ino: Ino,
        block: u64,
        mode: u16,
        links: u16,
        flags: u32,
    ) -> Result<()> {
        if mode != 0 && self.seal.csum {
            // Every inode of an inode-table block was checked when the
            // block came from the device (`Core::read_block`), and the
            // core seals each inode it rewrites: what failed then and has
            // not been rewritten since is in `inode_csum_bad`, clean block
            // or dirty. (Checking a clean block in place again on every
            // read cost a checksum per lookup and stat.)
            if let Some(&(stored, computed)) = self.inode_csum_bad.get(&ino) {
                return Err(FsError::corrupt(
                    block,
                    format!("inode {ino} checksum"),
                    format!("i_checksum stored {stored:#010x}, computed {computed:#010x}"),
                ));
            }
        }
        if links > 0 && mode != 0 {
            if FileType::from_mode(mode).is_none() {
                return Err(FsError::corrupt(
                    block,
                    format!("inode {ino} i_mode"),
                    format!("{:#o} is not a file type", mode),
                ));
            }
            if flags & io::FL_INLINE_DATA != 0 {
                return Err(FsError::Unsupported(format!(
                    "inode {ino} uses inline_data"
                )));
            }
        }
        Ok(())
    }

    /// The generation of inode `ino` and whether it maps its blocks with
    /// extents, after the same checks as [`Core::read_inode`], without
    /// decoding the rest: for the extent-tree accessor, used several times
    /// by every write.
    pub(crate) fn inode_tree_head(&mut self, ino: Ino) -> Result<(u32, bool)> {
        let (img, off) = self.inode_image(ino)?;
        let raw = &img[off..off + self.seal.inode_size as usize];
        let (block, _) = self.inode_loc(ino);
        let (mode, links, flags) = (
            le16(raw, io::MODE),
            le16(raw, io::LINKS),
            le32(raw, io::FLAGS),
        );
        let generation = le32(raw, io::GENERATION);
        drop(img);
        self.check_inode_head(ino, block, mode, links, flags)?;
        Ok((generation, flags & io::FL_EXTENTS != 0))
    }

    /// Decode inode `ino` and require it to be in use.
    pub fn live_inode(&mut self, ino: Ino) -> Result<Inode> {
        let i = self.read_inode(ino)?;
        if i.mode == 0 || (i.links == 0 && !self.open_counts.contains_key(&ino)) {
            return Err(errno(libc::ENOENT));
        }
        Ok(i)
    }

    /// Attributes as `stat` shows them.
    pub fn attr_of(&self, i: &Inode) -> Attr {
        Attr {
            ino: i.ino,
            kind: i.kind().unwrap_or(FileType::Regular),
            perm: i.mode & 0o7777,
            nlink: i.links as u32,
            uid: i.uid,
            gid: i.gid,
            size: i.size,
            // With its delayed blocks, as ext4's stat counts them.
            blocks: i.sectors + self.delayed.blocks_of(i.ino) * u64::from(self.bs / 512),
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            rdev: match i.kind() {
                Some(FileType::CharDevice) | Some(FileType::BlockDevice) => i.rdev(),
                _ => 0,
            },
            blksize: self.bs,
            generation: i.generation,
            flags: i.flags,
        }
    }

    /// Change bytes of inode `ino` at `field_off`.
    pub fn set_inode_bytes(&mut self, ino: Ino, field_off: usize, bytes: &[u8], field: InodeField) {
        let (block, off) = self.inode_loc(ino);
        if self.ensure(block, BlockClass::InodeTable).is_err() {
            return;
        }
        self.touch_inode(ino);
        self.modify(
            block,
            off + field_off,
            bytes,
            UpdateKind::Inode { ino, field },
        );
        self.csum_inode(ino);
    }

    pub fn set_mode(&mut self, ino: Ino, mode: u16) {
        self.set_inode_bytes(ino, io::MODE, &mode.to_le_bytes(), InodeField::Mode);
    }

    pub fn set_links(&mut self, ino: Ino, links: u16) {
        self.set_inode_bytes(ino, io::LINKS, &links.to_le_bytes(), InodeField::Links);
    }

    pub fn set_owner(&mut self, ino: Ino, uid: u32, gid: u32) {
        self.set_inode_bytes(ino, io::UID, &(uid as u16).to_le_bytes(), InodeField::Owner);
        self.set_inode_bytes(ino, io::GID, &(gid as u16).to_le_bytes(), InodeField::Owner);
        self.set_inode_bytes(
            ino,
            io::UID_HI,
            &((uid >> 16) as u16).to_le_bytes(),
            InodeField::Owner,
        );
        self.set_inode_bytes(
            ino,
            io::GID_HI,
            &((gid >> 16) as u16).to_le_bytes(),
            InodeField::Owner,
        );
    }

    pub fn set_size(&mut self, ino: Ino, size: u64) {
        self.set_inode_bytes(
            ino,
            io::SIZE_LO,
            &(size as u32).to_le_bytes(),
            InodeField::Size,
        );
        self.set_inode_bytes(
            ino,
            io::SIZE_HI,
            &((size >> 32) as u32).to_le_bytes(),
            InodeField::Size,
        );
    }

    pub fn set_flags(&mut self, ino: Ino, flags: u32) {
        self.set_inode_bytes(ino, io::FLAGS, &flags.to_le_bytes(), InodeField::Flags);
    }

    pub fn set_dtime(&mut self, ino: Ino, v: u32, field: InodeField) {
        self.set_inode_bytes(ino, io::DTIME, &v.to_le_bytes(), field);
    }

    /// Set a time field (`which` is one of the `io::*TIME` offsets).
    pub fn set_time(&mut self, ino: Ino, which: usize, t: Timespec) {
        let (lo, extra) = encode_time(t.sec, t.nsec);
        self.set_inode_bytes(ino, which, &lo.to_le_bytes(), InodeField::Times);
        let xoff = match which {
            io::ATIME => io::ATIME_EXTRA,
            io::MTIME => io::MTIME_EXTRA,
            io::CTIME => io::CTIME_EXTRA,
            io::CRTIME => io::CRTIME_EXTRA,
            _ => return,
        };
        // Let go of the image before changing it: a second reference would
        // make the change copy the whole block.
        let has_extra = self
            .inode_image(ino)
            .is_ok_and(|(img, off)| self.has_extra(&img[off..], xoff));
        if has_extra {
            self.set_inode_bytes(ino, xoff, &extra.to_le_bytes(), InodeField::Times);
        }
    }

    /// ctime (and mtime when `mtime`) to now.
    ///
    /// The two times lie side by side on disk (`i_ctime`, `i_mtime`; their
    /// extra words likewise), so both are one change of each pair: half
    /// the changes of setting them one by one, for every write and every
    /// entry added to a directory.
    pub fn touch_times(&mut self, ino: Ino, mtime: bool) {
        let now = self.now();
        if !mtime {
            self.set_time(ino, io::CTIME, now);
            return;
        }
        const { assert!(io::MTIME == io::CTIME + 4 && io::MTIME_EXTRA == io::CTIME_EXTRA + 4) };
        let (lo, extra) = encode_time(now.sec, now.nsec);
        let mut pair = [0u8; 8];
        pair[..4].copy_from_slice(&lo.to_le_bytes());
        pair[4..].copy_from_slice(&lo.to_le_bytes());
        self.set_inode_bytes(ino, io::CTIME, &pair, InodeField::Times);
        let room = self
            .inode_image(ino)
            .map(|(img, off)| {
                let raw = &img[off..];
                (
                    self.has_extra(raw, io::CTIME_EXTRA),
                    self.has_extra(raw, io::MTIME_EXTRA),
                )
            })
            .unwrap_or((false, false));
        pair[..4].copy_from_slice(&extra.to_le_bytes());
        pair[4..].copy_from_slice(&extra.to_le_bytes());
        match room {
            (true, true) => self.set_inode_bytes(ino, io::CTIME_EXTRA, &pair, InodeField::Times),
            (true, false) => {
                self.set_inode_bytes(ino, io::CTIME_EXTRA, &pair[..4], InodeField::Times)
            }
            _ => {}
        }
    }

    /// Add `delta_blocks` file-system blocks to `i_blocks`.
    pub fn add_iblocks(&mut self, ino: Ino, delta_blocks: i64) -> Result<()> {
        let i = self.read_inode(ino)?;
        let per = (self.bs / 512) as i64;
        let sectors = (i.sectors as i64 + delta_blocks * per).max(0) as u64;
        let (stored, flags) = if sectors >> 48 != 0 {
            // Only with HUGE_FILE_FL: count in file-system blocks.
            (sectors / per as u64, i.flags | io::FL_HUGE_FILE)
        } else {
            (sectors, i.flags & !io::FL_HUGE_FILE)
        };
        if flags != i.flags {
            self.set_flags(ino, flags);
        }
        self.set_inode_bytes(
            ino,
            io::BLOCKS_LO,
            &(stored as u32).to_le_bytes(),
            InodeField::BlockCount,
        );
        self.set_inode_bytes(
            ino,
            io::BLOCKS_HI,
            &((stored >> 32) as u16).to_le_bytes(),
            InodeField::BlockCount,
        );
        Ok(())
    }

    /// Write the whole first image of a freshly allocated inode.
    #[allow(clippy::too_many_arguments)]
    pub fn init_inode(
        &mut self,
        ino: Ino,
        mode: u16,
        creds: &Creds,
        gid: u32,
        links: u16,
        flags: u32,
        block: &[u8; 60],
    ) -> Result<Inode> {
        let isz = self.seal.inode_size as usize;
        let mut raw = vec![0u8; isz];
        let now = self.now();
        let (tlo, textra) = encode_time(now.sec, now.nsec);
        let generation = self.next_generation();
        layout::put16(&mut raw, io::MODE, mode);
        layout::put16(&mut raw, io::UID, creds.uid as u16);
        layout::put16(&mut raw, io::UID_HI, (creds.uid >> 16) as u16);
        layout::put16(&mut raw, io::GID, gid as u16);
        layout::put16(&mut raw, io::GID_HI, (gid >> 16) as u16);
        layout::put16(&mut raw, io::LINKS, links);
        layout::put32(&mut raw, io::FLAGS, flags);
        raw[io::BLOCK..io::BLOCK + 60].copy_from_slice(block);
        layout::put32(&mut raw, io::GENERATION, generation);
        for off in [io::ATIME, io::CTIME, io::MTIME] {
            layout::put32(&mut raw, off, tlo);
        }
        if isz > 128 {
            let extra = 32u16.min(isz as u16 - 128);
            layout::put16(&mut raw, io::EXTRA_ISIZE, extra);
            if extra >= 32 {
                for off in [
                    io::ATIME_EXTRA,
                    io::CTIME_EXTRA,
                    io::MTIME_EXTRA,
                    io::CRTIME_EXTRA,
                ] {
                    layout::put32(&mut raw, off, textra);
                }
                layout::put32(&mut raw, io::CRTIME, tlo);
            }
        }
        let (blk, off) = self.inode_loc(ino);
        self.ensure(blk, BlockClass::InodeTable)?;
        self.touch_inode(ino);
        self.modify(
            blk,
            off,
            &raw,
            UpdateKind::Inode {
                ino,
                field: InodeField::Whole,
            },
        );
        self.csum_inode(ino);
        self.read_inode(ino)
    }

    /// Clear a released inode: `i_dtime` set, mode and links zero (the
    /// bytes stay for forensics as ext4 leaves them), bitmap bit cleared.
    pub fn clear_inode(&mut self, i: &Inode) -> Result<()> {
        let now = self.now();
        self.set_dtime(i.ino, now.sec as u32, InodeField::Dtime);
        self.set_links(i.ino, 0);
        self.set_inode_bytes(i.ino, io::MODE, &0u16.to_le_bytes(), InodeField::Whole);
        self.set_size(i.ino, 0);
        self.free_inode_bit(i.ino, i.is_dir())?;
        self.drop_dir_index(i.ino);
        Ok(())
    }

    // ----- orphan list -----

    /// Put `ino` on the orphan list (its `i_dtime` links to the old head).
    pub fn orphan_add(&mut self, ino: Ino) -> Result<()> {
        if self.orphan_contains(ino)? {
            return Ok(());
        }
        let head = self.sb32(layout::sb::LAST_ORPHAN)?;
        self.set_dtime(ino, head, InodeField::OrphanLink);
        self.set_sb(
            layout::sb::LAST_ORPHAN,
            &ino.to_le_bytes(),
            UpdateKind::Other,
        )?;
        Ok(())
    }

    fn orphan_chain(&mut self) -> Result<Vec<Ino>> {
        let mut v = Vec::new();
        let mut cur = self.sb32(layout::sb::LAST_ORPHAN)?;
        while cur != 0 {
            if cur > self.sbi.inodes_count
                || v.len() as u32 > self.sbi.inodes_count
                || v.contains(&cur)
            {
                let (b, _) = (self.seal.sb_block, 0);
                return Err(FsError::corrupt(
                    b,
                    "orphan list",
                    format!("bad or looping inode {cur}"),
                ));
            }
            v.push(cur);
            cur = self.read_inode(cur)?.dtime;
        }
        Ok(v)
    }

    pub fn orphan_contains(&mut self, ino: Ino) -> Result<bool> {
        Ok(self.orphan_chain()?.contains(&ino))
    }

    /// Remove `ino` from the orphan list.
    pub fn orphan_remove(&mut self, ino: Ino) -> Result<()> {
        let chain = self.orphan_chain()?;
        let Some(pos) = chain.iter().position(|&x| x == ino) else {
            return Ok(());
        };
        let next = chain.get(pos + 1).copied().unwrap_or(0);
        if pos == 0 {
            self.set_sb(
                layout::sb::LAST_ORPHAN,
                &next.to_le_bytes(),
                UpdateKind::Other,
            )?;
        } else {
            self.set_dtime(chain[pos - 1], next, InodeField::OrphanLink);
        }
        self.set_dtime(ino, 0, InodeField::OrphanLink);
        Ok(())
    }

    /// The orphan list, head first (for mount-time cleanup).
    pub fn orphans(&mut self) -> Result<Vec<Ino>> {
        self.orphan_chain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_encoding_round_trips() {
        for &(ma, mi) in &[(8u32, 1u32), (259, 65536 + 3), (0, 0), (4095, 1 << 19)] {
            let d = new_encode_dev(ma, mi);
            assert_eq!(new_decode_dev(d), (ma, mi));
        }
    }
}
