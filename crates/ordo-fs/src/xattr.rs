//! Extended attributes and POSIX ACLs, as ext4 keeps them.
//!
//! Placement follows `ext4_xattr_set_handle`: an attribute goes into the
//! inode's own area when it fits there, into the attribute block
//! otherwise; setting it in one place removes it from the other. The block
//! is shared between inodes whose attributes are identical, as ext4's
//! mbcache shares them: when a block's new contents equal those of a block
//! this mount has seen (same `h_hash`, same entries, fewer than
//! [`xattr::REFCOUNT_MAX`] users), the inode points there instead and the
//! count rises. A block only this inode uses is changed in place; a shared
//! one is copied first (copy on write).
//!
//! Every change is a typed update ([`UpdateKind::Xattr`] for an area's
//! contents, [`UpdateKind::XattrBlockInit`] for a new block,
//! [`UpdateKind::XattrRef`] for `i_file_acl`, [`UpdateKind::XattrRefcount`]
//! for a shared block's count), made in the order the ordering rules want
//! (a new block initialized and counted in `i_blocks` before it is pointed
//! at; a pointer cleared before the count falls and the block is freed), so
//! that each protocol can journal or order them.
//!
//! ACLs (`system.posix_acl_access` and `system.posix_acl_default`) arrive
//! in the VFS's form and are stored in ext4's compact one; setting an
//! access ACL sets the mode's permission bits from it, and one the mode
//! says all of is not stored (`posix_acl_update_mode`); `chmod` rewrites
//! the access ACL's owner, mask and other entries (`posix_acl_chmod`); a
//! new inode inherits its directory's default ACL (`posix_acl_create`).
//! Permission checks are the VFS's (FUSE `default_permissions` with
//! `FUSE_POSIX_ACL`): the kernel reads the access ACL through `getxattr`.

use ordo_dev::BlockClass;
use ordo_format::xattr::{self, Acl, Attr, NameError};

use crate::error::{errno, FsError, Result};
use crate::layout::{self, ino as io, le16, le32};
use crate::state::{Core, Owner};
use crate::types::Creds;
use crate::update::{Ino, UpdateKind};

/// `XATTR_CREATE`: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `XATTR_REPLACE`: fail with ENODATA if it does not.
pub const XATTR_REPLACE: u32 = 2;

/// What a new inode inherits from its directory: its permission bits,
/// and the access and default ACLs to store (ext4's form).
pub(crate) type Inherited = (u16, Option<Vec<u8>>, Option<Vec<u8>>);

/// An inode's attributes as they are on disk.
struct Stored {
    /// In the inode's own area.
    ibody: Vec<Attr>,
    /// Bytes available in that area (0 without one).
    room: usize,
    extra_isize: u16,
    /// The attribute block, its reference count and its attributes.
    block: Option<(u64, u32, Vec<Attr>)>,
}

impl Stored {
    fn find(&self, index: u8, name: &[u8]) -> Option<&Attr> {
        self.ibody
            .iter()
            .chain(self.block.iter().flat_map(|b| b.2.iter()))
            .find(|a| a.index == index && a.name == name)
    }
}

fn name_errno(e: NameError) -> FsError {
    errno(match e {
        NameError::Unsupported => libc::EOPNOTSUPP,
        NameError::Empty => libc::EINVAL,
        NameError::TooLong => libc::ERANGE,
    })
}

/// ordo's own attributes (backlinks, `crate::backlinks`), kept on disk
/// but neither listed nor read nor set through the attribute calls.
fn is_internal(index: u8, name: &[u8]) -> bool {
    index == xattr::index::TRUSTED
        && (name == crate::backlinks::NAME
            || name == crate::backlinks::EIO_NAME
            || name == crate::backlinks::OWNER_NAME)
}

fn is_acl(index: u8) -> bool {
    matches!(
        index,
        xattr::index::POSIX_ACL_ACCESS | xattr::index::POSIX_ACL_DEFAULT
    )
}

impl Core {
    /// Read `ino`'s attributes (in-inode area and block).
    fn xattrs_stored(&mut self, ino: Ino) -> Result<Stored> {
        let raw = self.inode_raw(ino)?;
        let (iblock, _) = self.inode_loc(ino);
        let isz = raw.len();
        let extra_isize = if isz > 128 {
            le16(&raw, io::EXTRA_ISIZE)
        } else {
            0
        };
        let room = if isz > 128 {
            xattr::ibody_room(isz, extra_isize)
        } else {
            0
        };
        let ibody = if room > 0 {
            xattr::decode_ibody(&raw, extra_isize).map_err(|e| FsError::from(e.at(iblock)))?
        } else {
            Vec::new()
        };
        let blk = io::file_acl(&raw);
        let block = if blk == 0 {
            None
        } else {
            if blk <= self.sbi.first_data_block as u64 || blk >= self.sbi.blocks_count {
                return Err(FsError::corrupt(
                    iblock,
                    format!("inode {ino} i_file_acl"),
                    format!("block {blk} outside the file system"),
                ));
            }
            let was_cached = self.cache.contains(blk);
            let img = self.read_block(blk, BlockClass::Other)?;
            if self.backlinks && !was_cached {
                // Read from the device: the block must be this inode's, as
                // a file block must.
                let generation = self.read_inode(ino)?.generation;
                if !self.xattr_block_owned(ino, generation, blk, &img) {
                    drop(img);
                    self.cache.forget(blk);
                    return Err(errno(libc::EIO));
                }
            }
            if let Err((have, want)) = self.xattr_csum_check(blk, &img) {
                return Err(FsError::corrupt(
                    blk,
                    "xattr block h_checksum",
                    format!("{have:#010x}, computed {want:#010x}"),
                ));
            }
            let d = xattr::decode_block(&img).map_err(|e| FsError::from(e.at(blk)))?;
            drop(img);
            self.seal.owners.insert(blk, Owner::Xattr);
            self.xattr_note_block(blk, d.hash);
            Some((blk, d.refcount, d.attrs))
        };
        Ok(Stored {
            ibody,
            room,
            extra_isize,
            block,
        })
    }

    /// The value of attribute (`index`, `name`) of `ino` as stored, with
    /// no permission or liveness check (the core's own attributes).
    pub(crate) fn xattr_get_raw(
        &mut self,
        ino: Ino,
        index: u8,
        name: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let st = self.xattrs_stored(ino)?;
        Ok(st.find(index, name).map(|a| a.value.clone()))
    }

    /// Store (or, `None`, remove) attribute (`index`, `name`) of `ino`
    /// where ext4 would, with no permission check and no ctime change (the
    /// core's own attributes).
    pub(crate) fn xattr_put_raw(
        &mut self,
        ino: Ino,
        index: u8,
        name: &[u8],
        value: Option<Vec<u8>>,
    ) -> Result<()> {
        let st = self.xattrs_stored(ino)?;
        let cur = st.find(index, name).map(|a| a.value.clone());
        if cur == value {
            return Ok(());
        }
        self.xattr_store(ino, st, index, name, value)
    }

    /// Set the reference count of attribute block `blk` to `n` (the
    /// scanners' rebuild).
    pub(crate) fn xattr_set_refcount(&mut self, blk: u64, n: u32) -> Result<()> {
        self.ensure(blk, BlockClass::Other)?;
        let cur = le32(&self.cache.snapshot(blk).expect("ensured"), 4);
        if cur != n {
            self.xattr_refcount(blk, cur, n as i32 - cur as i32);
        }
        Ok(())
    }

    /// Whether `img`, read at `blk`, is a valid attribute block there
    /// (magic, checksum, entries).
    pub(crate) fn xattr_block_ok(&self, blk: u64, img: &[u8]) -> bool {
        self.xattr_csum_check(blk, img).is_ok() && xattr::decode_block(img).is_ok()
    }

    /// Remember a block as a candidate for sharing.
    fn xattr_note_block(&mut self, blk: u64, hash: u32) {
        if hash != 0 {
            let v = self.xattr_shared.entry(hash).or_default();
            if !v.contains(&blk) {
                v.push(blk);
            }
        }
    }

    fn xattr_forget_block(&mut self, blk: u64) {
        for v in self.xattr_shared.values_mut() {
            v.retain(|&b| b != blk);
        }
        self.xattr_shared.retain(|_, v| !v.is_empty());
    }

    /// Whether `ino` has no attributes at all (no in-inode magic, no
    /// block), read in place: the kernel asks for `security.capability`
    /// before every write, and the answer is almost always this one.
    fn xattrs_none(&mut self, ino: Ino) -> Result<bool> {
        self.check_ino(ino)?;
        let (block, off) = self.inode_loc(ino);
        let isz = self.seal.inode_size as usize;
        let img = self.read_block(block, BlockClass::InodeTable)?;
        let raw = &img[off..off + isz];
        let acl = le32(raw, io::FILE_ACL_LO) != 0 || le16(raw, io::FILE_ACL_HI) != 0;
        let extra = if isz > 128 {
            usize::from(le16(raw, io::EXTRA_ISIZE))
        } else {
            0
        };
        let magic = 128 + extra + 4 <= isz && le32(raw, 128 + extra) == xattr::MAGIC;
        Ok(!acl && !magic)
    }

    /// The value of attribute `name` of `ino` (ENODATA when absent).
    pub fn op_getxattr(&mut self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let (index, n) = xattr::split_name(name).map_err(name_errno)?;
        if is_internal(index, n) {
            return Err(errno(libc::ENODATA));
        }
        if self.xattrs_none(ino)? && self.open_counts.contains_key(&ino) {
            // An open file (the write path's question): alive, and bare.
            return Err(errno(libc::ENODATA));
        }
        self.live_inode(ino)?;
        let st = self.xattrs_stored(ino)?;
        let a = st.find(index, n).ok_or_else(|| errno(libc::ENODATA))?;
        if is_acl(index) {
            let (iblock, _) = self.inode_loc(ino);
            let acl = Acl::from_disk(&a.value).map_err(|e| FsError::from(e.at(iblock)))?;
            return Ok(acl.to_xattr());
        }
        Ok(a.value.clone())
    }

    /// The names of `ino`'s attributes, each followed by a NUL, in-inode
    /// ones first (as ext4 lists them). `trusted.` names only for a
    /// privileged caller; names of namespaces ordo does not serve are kept
    /// on disk but not listed.
    pub fn op_listxattr(&mut self, ino: Ino, privileged: bool) -> Result<Vec<u8>> {
        self.live_inode(ino)?;
        let st = self.xattrs_stored(ino)?;
        let mut out = Vec::new();
        for a in st
            .ibody
            .iter()
            .chain(st.block.iter().flat_map(|b| b.2.iter()))
        {
            if (a.index == xattr::index::TRUSTED && !privileged) || is_internal(a.index, &a.name) {
                continue;
            }
            if let Some(full) = xattr::full_name(a.index, &a.name) {
                out.extend_from_slice(&full);
                out.push(0);
            }
        }
        Ok(out)
    }

    /// Set (`value: Some`) or remove (`None`) attribute `name` of `ino`.
    /// `flags`: [`XATTR_CREATE`], [`XATTR_REPLACE`]. `creds`: the caller,
    /// whose group membership decides whether an access ACL keeps the
    /// set-group-ID bit (`None`: privileged).
    pub fn op_setxattr(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
        creds: Option<&Creds>,
    ) -> Result<()> {
        self.check_writable()?;
        let i = self.live_inode(ino)?;
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(errno(libc::EINVAL));
        }
        if i.flags & (ordo_format::inode::flags::IMMUTABLE | ordo_format::inode::flags::APPEND) != 0
        {
            return Err(errno(libc::EPERM));
        }
        let (index, n) = xattr::split_name(name).map_err(name_errno)?;
        if is_internal(index, n) {
            // ordo's own attribute: neither shown nor settable.
            return Err(errno(libc::EPERM));
        }
        if let Some(v) = value {
            if v.len() > xattr::VALUE_MAX {
                return Err(errno(libc::E2BIG));
            }
        }
        if index == xattr::index::USER && !(i.is_reg() || i.is_dir()) {
            return Err(errno(libc::EPERM));
        }
        let mut value = value.map(|v| v.to_vec());
        let mut new_mode = None;
        if is_acl(index) {
            // An empty value removes the ACL, as the VFS's handler does.
            if value.as_ref().is_some_and(|v| v.is_empty()) {
                value = None;
            }
            if index == xattr::index::POSIX_ACL_DEFAULT && !i.is_dir() {
                return if value.is_some() {
                    Err(errno(libc::EACCES))
                } else {
                    Ok(())
                };
            }
            if let Some(v) = &value {
                let acl = Acl::from_xattr(v).map_err(|_| errno(libc::EINVAL))?;
                acl.validate().map_err(|_| errno(libc::EINVAL))?;
                if index == xattr::index::POSIX_ACL_ACCESS {
                    let mut mode = (i.mode & !0o777) | acl.mode_bits();
                    if let Some(c) = creds {
                        if c.uid != 0 && c.gid != i.gid && !c.groups.contains(&i.gid) {
                            mode &= !0o2000;
                        }
                    }
                    new_mode = Some(mode);
                    // An ACL the mode says all of is not stored.
                    value = if acl.is_equivalent_to_mode() {
                        None
                    } else {
                        Some(acl.to_disk())
                    };
                } else {
                    value = Some(acl.to_disk());
                }
            }
        }
        let st = self.xattrs_stored(ino)?;
        let exists = st.find(index, n).is_some();
        if flags & XATTR_CREATE != 0 && exists {
            return Err(errno(libc::EEXIST));
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(errno(libc::ENODATA));
        }
        if value.is_none() && !exists && new_mode.is_none() {
            // Removing an ACL that is not there succeeds and changes
            // nothing (ext4_set_acl with no ACL); any other name is
            // ENODATA.
            return if is_acl(index) {
                Ok(())
            } else {
                Err(errno(libc::ENODATA))
            };
        }
        if let Some(m) = new_mode {
            if m != i.mode {
                self.set_mode(ino, m);
            }
        }
        let same = matches!((&value, st.find(index, n)), (Some(v), Some(a)) if *v == a.value);
        if !same && (exists || value.is_some()) {
            self.xattr_store(ino, st, index, n, value)?;
        }
        let now = self.now();
        self.set_time(ino, io::CTIME, now);
        Ok(())
    }

    /// Put attribute (`index`, `name`) = `value` (or remove it) where ext4
    /// would: the inode's area first, the block when it does not fit.
    fn xattr_store(
        &mut self,
        ino: Ino,
        st: Stored,
        index: u8,
        name: &[u8],
        value: Option<Vec<u8>>,
    ) -> Result<()> {
        let Stored {
            mut ibody,
            room,
            extra_isize,
            block,
        } = st;
        let (blk, refcount, mut battrs) = match block {
            Some((b, r, a)) => (Some(b), r, a),
            None => (None, 0, Vec::new()),
        };
        let ibody_before = ibody.clone();
        let battrs_before = battrs.clone();
        // ext4 replaces an attribute of the inode's area where its entry
        // is (`ext4_xattr_set_entry` moves the value, not the entry), so
        // listxattr keeps its order.
        let old_pos = ibody
            .iter()
            .position(|a| a.index == index && a.name == name);
        ibody.retain(|a| !(a.index == index && a.name == name));
        battrs.retain(|a| !(a.index == index && a.name == name));
        if let Some(v) = value {
            let new = Attr {
                index,
                name: name.to_vec(),
                value: v,
            };
            let mut try_ibody = ibody.clone();
            match old_pos {
                Some(p) => try_ibody.insert(p, new.clone()),
                None => try_ibody.push(new.clone()),
            }
            // With backlinks nothing is ordered, so an attribute must never
            // move between the inode and its block (the copy removed and
            // the copy added land in no order, and a crash could leave
            // neither): every attribute but the backlinks lives in the
            // block, where an update is one block written in place.
            let in_inode_ok = !self.backlinks
                || (index == xattr::index::TRUSTED && name == crate::backlinks::NAME);
            if in_inode_ok && room > 0 && xattr::space_needed(&try_ibody) <= room {
                ibody = try_ibody;
            } else {
                battrs.push(new);
                battrs.sort_by(|a, b| a.key().cmp(&b.key()));
                if xattr::space_needed(&battrs) > self.bs as usize - xattr::BLOCK_HEADER {
                    return Err(errno(libc::ENOSPC));
                }
            }
        }
        if self.backlinks {
            // The block names its owner (`crate::backlinks::OWNER_NAME`).
            battrs.retain(|a| {
                !(a.index == xattr::index::TRUSTED && a.name == crate::backlinks::OWNER_NAME)
            });
            if !battrs.is_empty() {
                let generation = self.read_inode(ino)?.generation;
                battrs.push(crate::backlinks::owner_mark(ino, generation));
                battrs.sort_by(|a, b| a.key().cmp(&b.key()));
                if xattr::space_needed(&battrs) > self.bs as usize - xattr::BLOCK_HEADER {
                    return Err(errno(libc::ENOSPC));
                }
            }
        }
        // The place that gains the attribute is written first, the place
        // that loses it after (the ordering rules keep the two updates in
        // this order across blocks): a crash in between leaves the
        // attribute in both places (the inode's copy, the new one, is what
        // lookups find first), never in neither.
        let to_block = battrs
            .iter()
            .any(|a| a.index == index && a.name == name && !battrs_before.contains(a));
        if to_block {
            self.xattr_write_block(ino, blk, refcount, &battrs)?;
            if ibody != ibody_before {
                self.xattr_write_ibody(ino, extra_isize, &ibody)?;
            }
        } else {
            if ibody != ibody_before {
                self.xattr_write_ibody(ino, extra_isize, &ibody)?;
            }
            if battrs != battrs_before {
                self.xattr_write_block(ino, blk, refcount, &battrs)?;
            }
        }
        if !ibody.is_empty() || !battrs.is_empty() {
            self.xattr_feature()?;
        }
        Ok(())
    }

    /// The superblock says attributes exist (`ext_attr`), as
    /// `ext4_xattr_update_super_block` makes it.
    fn xattr_feature(&mut self) -> Result<()> {
        let c = self.sb32(layout::sb::FEATURE_COMPAT)?;
        if c & layout::feat::COMPAT_EXT_ATTR == 0 {
            self.set_sb(
                layout::sb::FEATURE_COMPAT,
                &(c | layout::feat::COMPAT_EXT_ATTR).to_le_bytes(),
                crate::update::UpdateKind::Other,
            )?;
        }
        Ok(())
    }

    fn xattr_write_ibody(&mut self, ino: Ino, extra_isize: u16, attrs: &[Attr]) -> Result<()> {
        let raw = self.inode_raw(ino)?;
        let mut new = raw.clone();
        xattr::encode_ibody(&mut new, extra_isize, attrs);
        let start = 128 + usize::from(extra_isize);
        let (block, off) = self.inode_loc(ino);
        self.ensure(block, BlockClass::InodeTable)?;
        self.touch_inode(ino);
        self.modify(block, off + start, &new[start..], UpdateKind::Xattr { ino });
        self.csum_inode(ino);
        Ok(())
    }

    /// Set `i_file_acl` of `ino` from `from` to `to`, as one update (see
    /// [`UpdateKind::XattrRef`]).
    fn xattr_set_pointer(&mut self, ino: Ino, from: u64, to: u64) {
        let (block, off) = self.inode_loc(ino);
        if self.ensure(block, BlockClass::InodeTable).is_err() {
            return;
        }
        self.touch_inode(ino);
        // i_file_acl's low word at 0x68 and high half at 0x76. The high
        // half is 0 below 2^32 blocks (16 TiB at 4 KiB): one update then.
        let kind = UpdateKind::XattrRef { ino, from, to };
        self.modify(
            block,
            off + io::FILE_ACL_LO,
            &(to as u32).to_le_bytes(),
            kind.clone(),
        );
        if (from >> 32) != (to >> 32) {
            self.modify(
                block,
                off + io::FILE_ACL_HI,
                &((to >> 32) as u16).to_le_bytes(),
                kind,
            );
        }
        self.csum_inode(ino);
    }

    /// Whether attribute block `blk`'s image carries the right checksum
    /// (always, without `metadata_csum`); `Err((stored, computed))` if not.
    fn xattr_csum_check(&self, blk: u64, img: &[u8]) -> std::result::Result<(), (u32, u32)> {
        if !self.seal.csum {
            return Ok(());
        }
        let want = xattr::block_checksum(self.seal.csum_seed, blk, img);
        let have = le32(img, xattr::BLOCK_CHECKSUM);
        if want == have {
            Ok(())
        } else {
            Err((have, want))
        }
    }

    /// Recompute a cached attribute block's checksum.
    fn xattr_csum(&mut self, blk: u64) {
        if !self.seal.csum {
            return;
        }
        let Some(img) = self.cache.snapshot(blk) else {
            return;
        };
        let c = xattr::block_checksum(self.seal.csum_seed, blk, &img);
        drop(img);
        self.modify(
            blk,
            xattr::BLOCK_CHECKSUM,
            &c.to_le_bytes(),
            UpdateKind::Checksum,
        );
    }

    /// Change a shared block's reference count by `delta`.
    fn xattr_refcount(&mut self, blk: u64, refcount: u32, delta: i32) {
        let n = (refcount as i64 + delta as i64) as u32;
        self.modify(
            blk,
            4,
            &n.to_le_bytes(),
            UpdateKind::XattrRefcount { block: blk, delta },
        );
        self.xattr_csum(blk);
    }

    /// A block of this mount whose attributes are exactly `attrs` and that
    /// can take one more user.
    fn xattr_find_shared(
        &mut self,
        attrs: &[Attr],
        hash: u32,
        not: Option<u64>,
    ) -> Option<(u64, u32)> {
        // Under backlinks no block is shared: a shared block's change is a
        // copy and a pointer switch, two writes nothing may order, and a
        // crash between them would lose the attributes; a block of one
        // inode changes in place, one atomic write.
        if hash == 0 || self.backlinks {
            return None;
        }
        let cands = self.xattr_shared.get(&hash).cloned().unwrap_or_default();
        for b in cands {
            if Some(b) == not || self.freed_by_handle(b) || !self.block_in_use(b).unwrap_or(false) {
                continue;
            }
            let Ok(img) = self.read_block(b, BlockClass::Other) else {
                continue;
            };
            if self.xattr_csum_check(b, &img).is_err() {
                continue;
            }
            if let Ok(d) = xattr::decode_block(&img) {
                if d.hash == hash
                    && d.attrs == attrs
                    && d.refcount > 0
                    && d.refcount < xattr::REFCOUNT_MAX
                {
                    return Some((b, d.refcount));
                }
            }
        }
        None
    }

    /// Make `ino`'s attribute block hold `attrs` (none: drop the block).
    fn xattr_write_block(
        &mut self,
        ino: Ino,
        cur: Option<u64>,
        refcount: u32,
        attrs: &[Attr],
    ) -> Result<()> {
        if attrs.is_empty() {
            return self.release_xattr_block(ino);
        }
        let bs = self.bs as usize;
        let img = xattr::encode_block(bs, 1, attrs);
        let hash = le32(&img, 12);
        let sorted = xattr::decode_block(&img)
            .expect("encoded block decodes")
            .attrs;
        if let Some((b, r)) = self.xattr_find_shared(&sorted, hash, cur) {
            // Share: count the new user, then point at it, then let the
            // old block go.
            self.xattr_refcount(b, r, 1);
            if cur.is_none() {
                self.add_iblocks(ino, 1)?;
            }
            self.xattr_set_pointer(ino, cur.unwrap_or(0), b);
            if let Some(c) = cur {
                self.xattr_drop_ref(ino, c, refcount, false)?;
            }
            return Ok(());
        }
        match cur {
            Some(c) if refcount == 1 => {
                // Only this inode uses it: change it in place.
                let mut new = img;
                crate::layout::put32(&mut new, 4, 1);
                self.read_block(c, BlockClass::Other)?;
                self.xattr_forget_block(c);
                self.modify(c, 0, &new, UpdateKind::Xattr { ino });
                self.xattr_csum(c);
                self.xattr_note_block(c, hash);
            }
            _ => {
                // A new block (the first, or a copy of a shared one).
                let goal = self.inode_goal(ino);
                let (b, _) = self.alloc_blocks(goal, 1)?;
                self.seal.owners.insert(b, Owner::Xattr);
                self.init_block(
                    b,
                    BlockClass::Other,
                    &img,
                    UpdateKind::XattrBlockInit { ino },
                );
                self.xattr_csum(b);
                self.xattr_note_block(b, hash);
                if cur.is_none() {
                    self.add_iblocks(ino, 1)?;
                }
                self.xattr_set_pointer(ino, cur.unwrap_or(0), b);
                if let Some(c) = cur {
                    self.xattr_drop_ref(ino, c, refcount, false)?;
                }
            }
        }
        Ok(())
    }

    /// With backlinks: whether attribute block `blk`, read as `img`, is
    /// inode `ino`'s (generation `generation`). A block ordo wrote names
    /// its owner in the hidden attribute `trusted.ordo.own`; any version
    /// of the owner's is its own, a block that still holds an earlier
    /// owner's attributes is not. A block without the mark (the kernel's)
    /// must match its owner record, which is rebuilt from the tree after
    /// the kernel has had the image.
    pub(crate) fn xattr_block_owned(
        &mut self,
        ino: Ino,
        generation: u32,
        blk: u64,
        img: &[u8],
    ) -> bool {
        let Ok(d) = xattr::decode_block(img) else {
            return false;
        };
        match d
            .attrs
            .iter()
            .find(|a| a.index == xattr::index::TRUSTED && a.name == crate::backlinks::OWNER_NAME)
        {
            Some(a) => {
                a.value == crate::backlinks::owner_mark(ino, generation).value
                    || !self.proto.checks_owner_marks()
            }
            None => {
                let owner = crate::update::BlockOwner {
                    ino,
                    generation,
                    lblk: crate::update::XATTR_LBLK,
                };
                self.proto.check_block_read(owner, blk, img).is_ok()
            }
        }
    }

    /// `ino` no longer uses block `blk` (its pointer already changed):
    /// lower the count, or free the block with its last user. With
    /// `uncount`, `ino`'s `i_blocks` drops the block too.
    fn xattr_drop_ref(&mut self, ino: Ino, blk: u64, refcount: u32, uncount: bool) -> Result<()> {
        if refcount > 1 {
            self.xattr_refcount(blk, refcount, -1);
        } else {
            self.xattr_forget_block(blk);
            self.free_blocks(blk, 1)?;
        }
        if uncount {
            self.add_iblocks(ino, -1)?;
        }
        Ok(())
    }

    /// Drop inode `ino`'s reference to its extended-attribute block (when
    /// the inode is released, or its last block attribute goes): the
    /// pointer is cleared first, then the block's count falls or, with its
    /// last user, the block is freed. In-inode attributes go with the
    /// inode.
    pub fn release_xattr_block(&mut self, ino: Ino) -> Result<()> {
        let raw = self.inode_raw(ino)?;
        let blk = io::file_acl(&raw);
        if blk == 0 {
            return Ok(());
        }
        let (iblock, _) = self.inode_loc(ino);
        if blk <= self.sbi.first_data_block as u64 || blk >= self.sbi.blocks_count {
            return Err(FsError::corrupt(
                iblock,
                format!("inode {ino} i_file_acl"),
                format!("block {blk} outside the file system"),
            ));
        }
        let img = self.read_block(blk, BlockClass::Other)?;
        if le32(&img, 0) != xattr::MAGIC {
            return Err(FsError::corrupt(
                blk,
                "xattr block h_magic",
                format!("{:#010x}", le32(&img, 0)),
            ));
        }
        let refcount = le32(&img, 4);
        drop(img);
        self.seal.owners.insert(blk, Owner::Xattr);
        self.xattr_set_pointer(ino, blk, 0);
        self.xattr_drop_ref(ino, blk, refcount, true)
    }

    /// The ACLs a new inode in `parent` inherits, and its permission bits:
    /// `perm` less `umask` when the directory has no default ACL
    /// (`posix_acl_create`). Returns (permission bits, access ACL to
    /// store, default ACL to store).
    pub(crate) fn inherit_acls(
        &mut self,
        parent: Ino,
        perm: u16,
        umask: u16,
        is_dir: bool,
    ) -> Result<Inherited> {
        let st = self.xattrs_stored(parent)?;
        let Some(a) = st.find(xattr::index::POSIX_ACL_DEFAULT, b"") else {
            return Ok((perm & !umask, None, None));
        };
        let (iblock, _) = self.inode_loc(parent);
        let def = Acl::from_disk(&a.value).map_err(|e| FsError::from(e.at(iblock)))?;
        let (acl, bits, not_equiv) = def.create_masq(perm & 0o777);
        let perm = (perm & !0o777) | bits;
        let access = not_equiv.then(|| acl.to_disk());
        let default = is_dir.then(|| def.to_disk());
        Ok((perm, access, default))
    }

    /// Store a new inode's inherited ACLs (see [`Core::inherit_acls`]).
    pub(crate) fn store_inherited_acls(
        &mut self,
        ino: Ino,
        access: Option<Vec<u8>>,
        default: Option<Vec<u8>>,
    ) -> Result<()> {
        // The default ACL first, as ext4_init_acl stores them (the order
        // listxattr shows).
        for (index, v) in [
            (xattr::index::POSIX_ACL_DEFAULT, default),
            (xattr::index::POSIX_ACL_ACCESS, access),
        ] {
            if let Some(v) = v {
                let st = self.xattrs_stored(ino)?;
                self.xattr_store(ino, st, index, b"", Some(v))?;
            }
        }
        Ok(())
    }

    /// After a mode change: the access ACL's owner, mask (or group) and
    /// other entries follow the new permission bits (`posix_acl_chmod`).
    pub(crate) fn acl_chmod(&mut self, ino: Ino, mode: u16) -> Result<()> {
        let st = self.xattrs_stored(ino)?;
        let Some(a) = st.find(xattr::index::POSIX_ACL_ACCESS, b"") else {
            return Ok(());
        };
        let (iblock, _) = self.inode_loc(ino);
        let mut acl = Acl::from_disk(&a.value).map_err(|e| FsError::from(e.at(iblock)))?;
        acl.chmod(mode);
        let v = acl.to_disk();
        if v != a.value {
            self.xattr_store(ino, st, xattr::index::POSIX_ACL_ACCESS, b"", Some(v))?;
        }
        Ok(())
    }
}
