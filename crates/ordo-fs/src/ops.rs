//! Namespace and attribute operations, with Linux ext4's error cases.
//!
//! Each function here runs inside one operation handle opened by `Fs` and
//! checks every error condition *before* changing anything. What can still
//! fail half-way (ENOSPC, I/O) is undone by the handle's rollback
//! (`Core::rollback_to`), so a failing call leaves no partial change behind. The order of the changes inside an
//! operation does not matter for crash consistency: protocols derive the
//! order of writes from the meaning of each update.

use ordo_dev::BlockClass;

use crate::error::{errno, Result};
use crate::extent;
use crate::inode::{new_decode_dev, Inode};
use crate::layout::{ino as io, put32};
use crate::state::{Core, Owner};
use crate::types::*;
use crate::update::{Ino, InodeField, UpdateKind};

/// ext4's maximum link count (`EXT4_LINK_MAX`).
pub const LINK_MAX: u16 = 65000;
/// Longest name in a directory entry.
pub const NAME_MAX: usize = 255;

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(errno(libc::ENAMETOOLONG));
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(errno(libc::EINVAL));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Core {
    /// A live directory, or ENOTDIR / ENOENT.
    pub fn live_dir(&mut self, ino: Ino) -> Result<Inode> {
        let i = self.live_inode(ino)?;
        if !i.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(i)
    }

    /// Fail with EROFS on a read-only mount.
    pub fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    pub fn op_lookup(&mut self, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.live_dir(parent)?;
        if name.len() > NAME_MAX {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let (ino, ft) = if name == b"." {
            (parent, 0)
        } else {
            let slot = self
                .dir_lookup(parent, name)?
                .ok_or_else(|| errno(libc::ENOENT))?;
            (slot.ino, slot.ft)
        };
        if self.backlinks && name != b"." && !self.entry_type_matches(ino, ft)? {
            // A name left from an earlier inode of that number.
            self.nofs.stale_names += 1;
            return Err(errno(libc::ENOENT));
        }
        if self.backlinks && name != b"." {
            // `..` resolves to the directory `parent` names back.
            if name == b".." {
                if parent != crate::types::ROOT_INO {
                    self.check_backlink(ino, parent)?;
                }
            } else {
                self.check_backlink(parent, ino)?;
            }
        }
        let i = self.read_inode(ino)?;
        if i.mode == 0 {
            return Err(crate::error::FsError::corrupt(
                self.inode_loc(ino).0,
                format!(
                    "directory {parent} entry {:?}",
                    String::from_utf8_lossy(name)
                ),
                format!("names free inode {ino}"),
            ));
        }
        Ok(self.attr_of(&i))
    }

    /// Ownership of a new inode in `parent` (setgid directories).
    fn new_owner(&mut self, parent: &Inode, mode: u16, creds: &Creds) -> (u16, u32) {
        let mut mode = mode;
        let gid = if parent.mode & 0o2000 != 0 {
            if mode & 0o170000 == 0o040000 {
                mode |= 0o2000;
            }
            parent.gid
        } else {
            creds.gid
        };
        if mode & 0o170000 != 0o040000
            && mode & 0o2000 != 0
            && creds.uid != 0
            && gid != creds.gid
            && !creds.groups.contains(&gid)
        {
            mode &= !0o2000;
        }
        (mode, gid)
    }

    fn check_new_entry(&mut self, parent: Ino, name: &[u8]) -> Result<Inode> {
        self.check_writable()?;
        let p = self.live_dir(parent)?;
        if is_dot(name) {
            return Err(errno(libc::EEXIST));
        }
        check_name(name)?;
        if p.links == 0 {
            return Err(errno(libc::ENOENT));
        }
        if self.dir_lookup(parent, name)?.is_some() {
            return Err(errno(libc::EEXIST));
        }
        Ok(p)
    }

    pub fn op_create(
        &mut self,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        perm: u16,
        rdev: u32,
        creds: &Creds,
    ) -> Result<Attr> {
        if kind == FileType::Directory {
            return self.op_mkdir(parent, name, perm, creds);
        }
        if kind == FileType::Symlink {
            return Err(errno(libc::EINVAL));
        }
        let p = self.check_new_entry(parent, name)?;
        let (perm, access, default) =
            self.inherit_acls(parent, perm & 0o7777, creds.umask, false)?;
        let (mode, gid) = self.new_owner(&p, kind.mode_bits() | perm, creds);
        let ino = self.alloc_inode(parent, false)?;
        let mut block = [0u8; 60];
        let mut flags = 0;
        match kind {
            FileType::Regular => {
                block.copy_from_slice(&extent::empty_root());
                flags |= io::FL_EXTENTS;
            }
            FileType::CharDevice | FileType::BlockDevice => {
                let (major, minor) = new_decode_dev(rdev);
                if major < 256 && minor < 256 {
                    put32(&mut block, 0, (major << 8) | minor);
                } else {
                    put32(&mut block, 4, rdev);
                }
            }
            _ => {}
        }
        let i = self.init_inode(ino, mode, creds, gid, 1, flags, &block)?;
        self.store_inherited_acls(ino, access, default)?;
        self.dir_add(parent, name, ino, kind)?;
        self.touch_times(parent, true);
        Ok(self.attr_of(&i))
    }

    /// Raise a directory's link count for a new subdirectory (dir_nlink:
    /// past the limit the count becomes 1, "many").
    fn dir_inc_links(&mut self, dir: Ino) -> Result<()> {
        let d = self.read_inode(dir)?;
        if d.links == 1 && self.sbi.has_dir_nlink() {
            return Ok(());
        }
        let n = d.links + 1;
        if n > LINK_MAX && self.sbi.has_dir_nlink() {
            self.set_links(dir, 1);
        } else {
            self.set_links(dir, n);
        }
        Ok(())
    }

    /// Lower a directory's link count for a removed subdirectory.
    fn dir_dec_links(&mut self, dir: Ino) -> Result<()> {
        let d = self.read_inode(dir)?;
        if d.links > 2 {
            self.set_links(dir, d.links - 1);
        }
        Ok(())
    }

    fn check_dir_link_room(&mut self, dir: &Inode) -> Result<()> {
        if dir.links >= LINK_MAX && !self.sbi.has_dir_nlink() {
            return Err(errno(libc::EMLINK));
        }
        Ok(())
    }

    pub fn op_mkdir(&mut self, parent: Ino, name: &[u8], perm: u16, creds: &Creds) -> Result<Attr> {
        let p = self.check_new_entry(parent, name)?;
        self.check_dir_link_room(&p)?;
        let (perm, access, default) =
            self.inherit_acls(parent, perm & 0o7777, creds.umask, true)?;
        let (mode, gid) = self.new_owner(&p, 0o040000 | perm, creds);
        let ino = self.alloc_inode(parent, true)?;
        let goal = self.inode_goal(ino);
        let (blk, _) = match self.alloc_blocks(goal, 1) {
            Ok(x) => x,
            Err(e) => {
                // Give the inode back: nothing points at it yet.
                self.free_inode_bit(ino, true)?;
                return Err(e);
            }
        };
        let mut root = [0u8; 60];
        root.copy_from_slice(&extent::empty_root());
        let i = self.init_inode(ino, mode, creds, gid, 2, io::FL_EXTENTS, &root)?;
        self.store_inherited_acls(ino, access, default)?;
        self.seal.owners.insert(
            blk,
            Owner::Dir {
                ino,
                generation: i.generation,
            },
        );
        let img = self.new_dir_block(ino, parent);
        self.init_block(
            blk,
            BlockClass::Directory,
            &img,
            UpdateKind::DirBlockInit { dir: ino },
        );
        self.csum_dir_block(blk);
        extent::insert(&mut self.tree(ino)?, 0, blk, 1, false)?;
        self.add_iblocks(ino, 1)?;
        self.set_size(ino, self.bs as u64);
        self.dir_inc_links(parent)?;
        self.dir_add(parent, name, ino, FileType::Directory)?;
        self.touch_times(parent, true);
        let i = self.read_inode(ino)?;
        Ok(self.attr_of(&i))
    }

    pub fn op_symlink(
        &mut self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        creds: &Creds,
    ) -> Result<Attr> {
        let p = self.check_new_entry(parent, name)?;
        if target.is_empty() {
            return Err(errno(libc::ENOENT));
        }
        if target.len() + 1 > self.bs as usize {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let (mode, gid) = self.new_owner(&p, 0o120777, creds);
        let ino = self.alloc_inode(parent, false)?;
        let fast = target.len() < 60;
        let mut block = [0u8; 60];
        let i = if fast {
            block[..target.len()].copy_from_slice(target);
            let i = self.init_inode(ino, mode, creds, gid, 1, 0, &block)?;
            self.set_size(ino, target.len() as u64);
            i
        } else {
            block.copy_from_slice(&extent::empty_root());
            let i = self.init_inode(ino, mode, creds, gid, 1, io::FL_EXTENTS, &block)?;
            let goal = self.inode_goal(ino);
            let (blk, _) = self.alloc_blocks(goal, 1)?;
            let mut img = vec![0u8; self.bs as usize];
            img[..target.len()].copy_from_slice(target);
            self.cache.insert_new(blk, BlockClass::Data, img);
            self.proto.on_data_write(
                &crate::update::DataWrite {
                    ino,
                    lblk: 0,
                    pblk: blk,
                    generation: i.generation,
                    fresh: true,
                },
                &self.handle,
            );
            extent::insert(&mut self.tree(ino)?, 0, blk, 1, false)?;
            self.add_iblocks(ino, 1)?;
            self.set_size(ino, target.len() as u64);
            i
        };
        let _ = i;
        self.dir_add(parent, name, ino, FileType::Symlink)?;
        self.touch_times(parent, true);
        let i = self.read_inode(ino)?;
        Ok(self.attr_of(&i))
    }

    pub fn op_readlink(&mut self, ino: Ino) -> Result<Vec<u8>> {
        let i = self.live_inode(ino)?;
        if !i.is_symlink() {
            return Err(errno(libc::EINVAL));
        }
        if !i.uses_extents() {
            let n = (i.size as usize).min(60);
            return Ok(i.block[..n].to_vec());
        }
        let size = i.size.min(self.bs as u64) as u32;
        self.file_read(ino, 0, size)
    }

    pub fn op_link(&mut self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.check_writable()?;
        let i = self.live_inode(ino)?;
        // As the VFS: the new name is looked up before the source is judged.
        self.check_new_entry(newparent, newname)?;
        if i.is_dir() {
            return Err(errno(libc::EPERM));
        }
        if i.links == 0 {
            return Err(errno(libc::ENOENT));
        }
        if i.links >= LINK_MAX {
            return Err(errno(libc::EMLINK));
        }
        self.set_links(ino, i.links + 1);
        self.touch_times(ino, false);
        self.dir_add(
            newparent,
            newname,
            ino,
            i.kind().unwrap_or(FileType::Regular),
        )?;
        self.touch_times(newparent, true);
        let i = self.read_inode(ino)?;
        Ok(self.attr_of(&i))
    }

    /// Drop one link of `i` (a name was removed); release it when unused.
    fn drop_link(&mut self, i: &Inode) -> Result<()> {
        let links = i.links.saturating_sub(1);
        self.set_links(i.ino, links);
        self.touch_times(i.ino, false);
        if links == 0 {
            self.release_or_orphan(i.ino)?;
        }
        Ok(())
    }

    /// An inode with no links left: free it now, or keep it on the orphan
    /// list until its last open handle is released.
    fn release_or_orphan(&mut self, ino: Ino) -> Result<()> {
        if self.open_counts.get(&ino).copied().unwrap_or(0) > 0 {
            self.orphan_add(ino)
        } else {
            self.evict(ino)
        }
    }

    /// Free inode `ino` and all its blocks.
    pub fn evict(&mut self, ino: Ino) -> Result<()> {
        self.orphan_remove(ino)?;
        let i = self.read_inode(ino)?;
        if i.mode == 0 {
            return Ok(());
        }
        self.free_all_blocks(ino)?;
        self.release_xattr_block(ino)?;
        let i = self.read_inode(ino)?;
        self.clear_inode(&i)
    }

    pub fn op_unlink(&mut self, parent: Ino, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.live_dir(parent)?;
        check_name(name)?;
        if is_dot(name) {
            return Err(errno(libc::EISDIR));
        }
        let slot = self
            .dir_lookup(parent, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let i = self.read_inode(slot.ino)?;
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        self.dir_remove(parent, name)?;
        self.touch_times(parent, true);
        self.drop_link(&i)
    }

    pub fn op_rmdir(&mut self, parent: Ino, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.live_dir(parent)?;
        if name == b"." {
            return Err(errno(libc::EINVAL));
        }
        if name == b".." {
            return Err(errno(libc::ENOTEMPTY));
        }
        check_name(name)?;
        let slot = self
            .dir_lookup(parent, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let i = self.read_inode(slot.ino)?;
        if !i.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        if self.dir_entry_count(slot.ino)? > 2 {
            return Err(errno(libc::ENOTEMPTY));
        }
        self.dir_remove(parent, name)?;
        self.set_links(slot.ino, 0);
        self.dir_dec_links(parent)?;
        self.touch_times(parent, true);
        self.touch_times(slot.ino, false);
        self.set_size(slot.ino, 0);
        self.release_or_orphan(slot.ino)
    }

    /// Whether directory `ancestor` is `dir` or one of its ancestors.
    ///
    /// The walk follows `..` entries read from disk, so a corrupted image
    /// can make them cycle: a chain longer than the number of inodes cannot
    /// reach the root, and a directory that is its own parent is not one.
    fn is_ancestor(&mut self, ancestor: Ino, mut dir: Ino) -> Result<bool> {
        let mut steps = 0u32;
        loop {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            let up = self
                .dir_lookup(dir, b"..")?
                .ok_or_else(|| errno(libc::ENOENT))?
                .ino;
            steps += 1;
            if up == dir || steps > self.sbi.inodes_count {
                let block = self.dir_index(dir)?.pblks.first().copied().unwrap_or(0);
                return Err(crate::error::FsError::corrupt(
                    block,
                    format!("directory {dir} \"..\" entry"),
                    format!("points at {up}: the parent chain loops after {steps} steps"),
                ));
            }
            dir = up;
        }
    }

    pub fn op_rename(
        &mut self,
        p1: Ino,
        n1: &[u8],
        p2: Ino,
        n2: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.check_writable()?;
        if flags.noreplace && flags.exchange {
            return Err(errno(libc::EINVAL));
        }
        let d1 = self.live_dir(p1)?;
        let d2 = self.live_dir(p2)?;
        if n1.len() > NAME_MAX || n2.len() > NAME_MAX {
            return Err(errno(libc::ENAMETOOLONG));
        }
        // The VFS refuses `.` and `..` on either side before any lookup.
        if is_dot(n1) {
            return Err(errno(libc::EBUSY));
        }
        if is_dot(n2) {
            return Err(errno(if flags.noreplace {
                libc::EEXIST
            } else {
                libc::EBUSY
            }));
        }
        check_name(n1)?;
        check_name(n2)?;
        let s = self
            .dir_lookup(p1, n1)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let t = self.dir_lookup(p2, n2)?;
        if flags.noreplace && t.is_some() {
            return Err(errno(libc::EEXIST));
        }
        if flags.exchange && t.is_none() {
            return Err(errno(libc::ENOENT));
        }
        let si = self.read_inode(s.ino)?;
        let ti = match t {
            Some(t) => Some(self.read_inode(t.ino)?),
            None => None,
        };
        // The source must not be an ancestor of the target, nor the target
        // an ancestor of the source (checked in this order, as the VFS does).
        if si.is_dir() && p1 != p2 && self.is_ancestor(s.ino, p2)? {
            return Err(errno(libc::EINVAL));
        }
        if let Some(ti) = &ti {
            if ti.is_dir() && p1 != p2 && self.is_ancestor(ti.ino, p1)? {
                return Err(errno(if flags.exchange {
                    libc::EINVAL
                } else {
                    libc::ENOTEMPTY
                }));
            }
            if ti.ino == si.ino {
                return Ok(());
            }
        }
        // The victim (a target replaced) must be a directory exactly when
        // the source is, and an empty one.
        if let (false, Some(ti)) = (flags.exchange, &ti) {
            if si.is_dir() && !ti.is_dir() {
                return Err(errno(libc::ENOTDIR));
            }
            if !si.is_dir() && ti.is_dir() {
                return Err(errno(libc::EISDIR));
            }
            if ti.is_dir() && self.dir_entry_count(ti.ino)? > 2 {
                return Err(errno(libc::ENOTEMPTY));
            }
        }
        let skind = si.kind().unwrap_or(FileType::Regular);
        if flags.exchange {
            let ti = ti.expect("checked");
            let tkind = ti.kind().unwrap_or(FileType::Regular);
            if p1 != p2 {
                if si.is_dir() && !ti.is_dir() {
                    self.check_dir_link_room(&d2)?;
                }
                if ti.is_dir() && !si.is_dir() {
                    self.check_dir_link_room(&d1)?;
                }
            }
            // Links up before new entries, down after the old ones went.
            if p1 != p2 && si.is_dir() != ti.is_dir() {
                if si.is_dir() {
                    self.dir_inc_links(p2)?;
                } else {
                    self.dir_inc_links(p1)?;
                }
            }
            // While the two entries are rewritten one after the other, each
            // inode may have one name more than before: count it first (as
            // FFS's rename does), and uncount it once both are in place.
            for x in [&si, &ti] {
                if x.links > 1 {
                    self.set_links(x.ino, x.links.saturating_add(1));
                }
            }
            self.dir_retarget(p2, n2, si.ino, skind)?;
            self.dir_retarget(p1, n1, ti.ino, tkind)?;
            for x in [&si, &ti] {
                if x.links > 1 {
                    self.set_links(x.ino, x.links);
                }
            }
            if p1 != p2 {
                if si.is_dir() {
                    self.dir_retarget(si.ino, b"..", p2, FileType::Directory)?;
                }
                if ti.is_dir() {
                    self.dir_retarget(ti.ino, b"..", p1, FileType::Directory)?;
                }
                if si.is_dir() != ti.is_dir() {
                    if si.is_dir() {
                        self.dir_dec_links(p1)?;
                    } else {
                        self.dir_dec_links(p2)?;
                    }
                }
            }
            self.touch_times(si.ino, false);
            self.touch_times(ti.ino, false);
            self.touch_times(p1, true);
            if p2 != p1 {
                self.touch_times(p2, true);
            }
            return Ok(());
        }
        let moving_dir = si.is_dir() && p1 != p2;
        if moving_dir && ti.is_none() {
            self.check_dir_link_room(&d2)?;
            self.dir_inc_links(p2)?;
        }
        // The source has two names between the new entry and the removal of
        // the old one: its link count covers both meanwhile (FFS's rename
        // does the same, directories included), so that no crash leaves it
        // with more names than links. A directory counted as "many" (1,
        // dir_nlink) stays so.
        let bump = !si.is_dir() || si.links > 1;
        if bump {
            self.set_links(si.ino, si.links.saturating_add(1));
        }
        match &ti {
            Some(_) => {
                self.dir_retarget(p2, n2, si.ino, skind)?;
            }
            None => self.dir_add(p2, n2, si.ino, skind)?,
        }
        // A moved directory's `..` follows its new entry before the old
        // entry goes, so no crash leaves its only name disagreeing with `..`.
        if moving_dir {
            self.dir_retarget(si.ino, b"..", p2, FileType::Directory)?;
        }
        self.dir_remove(p1, n1)?;
        if bump {
            self.set_links(si.ino, si.links);
        }
        if moving_dir {
            self.dir_dec_links(p1)?;
        }
        if let Some(ti) = &ti {
            if ti.is_dir() {
                self.set_links(ti.ino, 0);
                self.set_size(ti.ino, 0);
                self.touch_times(ti.ino, false);
                if !moving_dir {
                    // The victim's `..` no longer counts in p2.
                    self.dir_dec_links(p2)?;
                }
                self.release_or_orphan(ti.ino)?;
            } else {
                let ti = self.read_inode(ti.ino)?;
                self.drop_link(&ti)?;
            }
        }
        self.touch_times(si.ino, false);
        self.touch_times(p1, true);
        if p2 != p1 {
            self.touch_times(p2, true);
        }
        Ok(())
    }

    /// Drop set-user-ID (and set-group-ID by the kernel's rule) of a
    /// regular file before `creds` writes to it; nothing when neither is
    /// set (the common case: no inode change at all).
    pub fn kill_suid_for_write(&mut self, ino: Ino, creds: &Creds) -> Result<()> {
        let i = self.live_inode(ino)?;
        if !i.is_reg() || i.mode & 0o6000 == 0 {
            return Ok(());
        }
        let in_group = creds.gid == i.gid || creds.groups.contains(&i.gid);
        let perm = crate::types::kill_suid_sgid(i.mode & 0o7777, in_group);
        let mode = (i.mode & 0o170000) | perm;
        if mode != i.mode {
            self.set_mode(ino, mode);
            // A mode change stamps ctime; the write stamps it again.
            self.touch_times(ino, false);
        }
        Ok(())
    }

    pub fn op_setattr(&mut self, ino: Ino, set: &SetAttr, creds: Option<&Creds>) -> Result<Attr> {
        self.check_writable()?;
        let i = self.live_inode(ino)?;
        if let Some(size) = set.size {
            if i.is_dir() {
                return Err(errno(libc::EISDIR));
            }
            if !i.is_reg() {
                return Err(errno(libc::EINVAL));
            }
            if size > self.max_file_bytes() {
                return Err(errno(libc::EFBIG));
            }
        }
        if let Some(size) = set.size {
            self.file_truncate(ino, size)?;
        }
        let mut mode = i.mode;
        if let Some(perm) = set.perm {
            mode = (mode & 0o170000) | (perm & 0o7777);
            if let Some(c) = creds {
                let gid = set.gid.unwrap_or(i.gid);
                if c.uid != 0 && gid != c.gid && !c.groups.contains(&gid) {
                    mode &= !0o2000;
                }
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(i.uid);
            let gid = set.gid.unwrap_or(i.gid);
            self.set_owner(ino, uid, gid);
            if !i.is_dir() {
                mode &= !0o4000;
                if mode & 0o010 != 0 {
                    mode &= !0o2000;
                }
            }
        }
        if mode != i.mode {
            self.set_mode(ino, mode);
            if mode & 0o777 != i.mode & 0o777 {
                self.acl_chmod(ino, mode)?;
            }
        }
        let now = self.now();
        if let Some(t) = set.atime {
            let v = match t {
                TimeSet::Now => now,
                TimeSet::At(ts) => ts,
            };
            self.set_time(ino, io::ATIME, v);
        }
        // A size change stamps mtime (file_truncate did) unless the caller
        // names another one.
        if let Some(t) = set.mtime {
            let v = match t {
                TimeSet::Now => now,
                TimeSet::At(ts) => ts,
            };
            self.set_time(ino, io::MTIME, v);
        } else if set.size.is_some() {
            self.set_time(ino, io::MTIME, now);
        }
        self.set_time(ino, io::CTIME, set.ctime.unwrap_or(now));
        let i = self.read_inode(ino)?;
        Ok(self.attr_of(&i))
    }

    /// Process the orphan list at mount: free unlinked inodes, finish
    /// interrupted truncates.
    pub fn process_orphans(&mut self) -> Result<u32> {
        let list = self.orphans()?;
        let mut n = 0;
        for ino in list {
            let i = self.read_inode(ino)?;
            if i.links == 0 {
                self.evict(ino)?;
            } else {
                self.orphan_remove(ino)?;
                if i.is_reg() {
                    let size = i.size;
                    let keep = size.div_ceil(self.bs as u64);
                    if i.uses_extents() {
                        let freed = extent::remove_range(
                            &mut self.tree(ino)?,
                            keep.min(extent::LBLK_END) as u32,
                            extent::LBLK_END - keep.min(extent::LBLK_END),
                        )?;
                        let mut total = 0i64;
                        for (p, len) in freed {
                            self.free_blocks(p, len as u64)?;
                            total += len as i64;
                        }
                        if total > 0 {
                            self.add_iblocks(ino, -total)?;
                        }
                    }
                }
            }
            n += 1;
        }
        let _ = InodeField::Other;
        Ok(n)
    }
}
