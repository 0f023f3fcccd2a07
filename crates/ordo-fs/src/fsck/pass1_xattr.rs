//! Pass 1, extended attributes: the in-inode attribute area and the
//! shared attribute blocks (e2fsck's `check_ea_in_inode` and
//! `check_ext_attr`), and what the refcount check at the end of pass 1
//! compares.
//!
//! The entries are walked here with fsck's own reader, not ordo-format's
//! `xattr::decode_*`: those stop at the first fault with an error, while
//! e2fsck's walk decides *which* faults are errors (and some that a
//! decoder would reject, e2fsck lets pass), so the walk mirrors e2fsck's
//! step by step. Only the pure functions of ordo-format are shared: the
//! kernel's entry hash (both the unsigned and the signed-char variant, as
//! e2fsck accepts either), the block hash, and the ACL decoder.
//!
//! As in e2fsck, every byte of the area is allotted at most once (the
//! header, each entry, each padded value, the four-byte end marker): an
//! entry or value outside the area, or overlapping another, is an error.
//! Names must fit, value sizes must fit what is left (in the inode) or the
//! block (at most 64 KiB), `e_value_inum` must be 0 (ea_inode is not
//! supported), and `e_hash` must be the entry's hash: in a block always,
//! in the inode when it is not 0 (older kernels stored 0 there). A block
//! entry's `e_name_index` must not be 0. All of these are unsafe.
//!
//! Two things are reported without being errors, because e2fsck does not
//! check them either: a block's `h_hash` that is not the hash of its
//! entries' hashes (the kernel uses it only to find blocks to share; a
//! wrong one loses sharing, nothing else), and an ACL value
//! (`system.posix_acl_access` / `_default`) that ext4's on-disk ACL
//! format does not decode (the kernel would refuse to read it).
//!
//! The reference count of a block is compared in `pass1.rs` once every
//! inode is scanned; see there for which direction is benign.

use ordo_dev::BlockClass;
use ordo_format::xattr::{block_hash, entry_hash, entry_hash_signed, Acl};

use super::checker::*;
use super::layout::*;
use crate::error::FsError;

/// The in-inode magic word and `h_magic` of an attribute block.
const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of an attribute block's header.
const BLOCK_HEADER: usize = 32;
/// Size of an entry's fixed part.
const ENTRY_HEADER: usize = 16;
/// Largest value e2fsck accepts in a block (`EXT2_XATTR_SIZE_MAX`).
const XATTR_SIZE_MAX: usize = 1 << 16;

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

fn entry_len(name_len: usize) -> usize {
    pad4(ENTRY_HEADER + name_len)
}

/// The bytes of an area handed out so far, as e2fsck's `region_t`: a
/// range outside `0..len`, empty, or overlapping one handed out before is
/// refused.
struct Region {
    len: usize,
    taken: Vec<(usize, usize)>,
}

impl Region {
    fn new(len: usize) -> Region {
        Region {
            len,
            taken: Vec::new(),
        }
    }

    /// Hand out `start..start + n`; `Err` says why not.
    fn take(&mut self, start: usize, n: usize) -> Result<(), &'static str> {
        let end = start.checked_add(n).ok_or("lies outside the area")?;
        if end > self.len {
            return Err("lies outside the area");
        }
        if n == 0 {
            return Err("is empty");
        }
        if self.taken.iter().any(|&(s, e)| start < e && s < end) {
            return Err("overlaps an entry or value before it");
        }
        self.taken.push((start, end));
        Ok(())
    }
}

/// One entry's fixed fields.
struct Entry {
    name_len: usize,
    index: u8,
    value_offs: usize,
    value_inum: u32,
    value_size: usize,
    hash: u32,
}

impl Entry {
    fn read(buf: &[u8], at: usize) -> Entry {
        Entry {
            name_len: usize::from(buf.get(at).copied().unwrap_or(0)),
            index: buf.get(at + 1).copied().unwrap_or(0),
            value_offs: usize::from(le16(buf, at + 2)),
            value_inum: le32(buf, at + 4),
            value_size: le32(buf, at + 8) as usize,
            hash: le32(buf, at + 12),
        }
    }
}

/// Whether `stored` is the kernel's hash of this name and padded value
/// (either variant of the name hash).
fn hash_matches(stored: u32, name: &[u8], padded_value: &[u8]) -> bool {
    stored == entry_hash(name, padded_value) || stored == entry_hash_signed(name, padded_value)
}

/// Whether an ACL value (name index 2 or 3) decodes in ext4's form.
fn acl_problem(index: u8, value: &[u8]) -> Option<String> {
    if index != 2 && index != 3 {
        return None;
    }
    Acl::from_disk(value)
        .err()
        .map(|e| format!("{}: {}", e.field, e.detail))
}

impl<'a> Checker<'a> {
    /// The attributes in inode `ino`'s body (`raw`, the whole on-disk
    /// inode, whose `i_extra_isize` was found valid), as e2fsck's
    /// `check_ea_in_inode`: the first fault found is reported.
    pub(super) fn check_ibody_xattrs(&mut self, ino: u32, inode: &Inode, iblock: u64) {
        let raw = &inode.raw;
        let isz = raw.len();
        if isz <= 128 {
            return;
        }
        let max = isz - 128;
        let extra = usize::from(inode.extra_isize);
        // No room for a header at all: nothing to look at (as e2fsck).
        if extra + 4 >= max {
            return;
        }
        let header = 128 + extra;
        if le32(raw, header) != XATTR_MAGIC {
            return;
        }
        let storage = max - extra;
        let area = &raw[header..];
        let mut region = Region::new(storage);
        let bad = |c: &mut Self, why: String| {
            problem!(
                c,
                Unsafe,
                Xattr,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) in-inode extended attributes: {why}"
            );
        };
        let _ = region.take(0, 4);
        let mut remain = storage - 4;
        let mut at = 4usize;
        let mut notes = Vec::new();
        while remain >= ENTRY_HEADER && le32(area, at) != 0 {
            let e = Entry::read(area, at);
            if let Err(why) = region.take(at, entry_len(e.name_len)) {
                bad(self, format!("entry at offset {at} {why}"));
                return;
            }
            remain -= ENTRY_HEADER;
            if pad4(e.name_len) > remain {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_name_len {} runs past the inode",
                        e.name_len
                    ),
                );
                return;
            }
            remain -= pad4(e.name_len);
            if e.value_inum != 0 {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_value_inum {} (values in inodes, ea_inode, \
                         are not supported)",
                        e.value_inum
                    ),
                );
                return;
            }
            if e.value_size > remain {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_value_size {} exceeds the {remain} bytes left",
                        e.value_size
                    ),
                );
                return;
            }
            let name = &area[at + ENTRY_HEADER..at + ENTRY_HEADER + e.name_len];
            let mut padded: &[u8] = &[];
            if e.value_size > 0 {
                // Value offsets count from the first entry, 4 bytes in.
                let start = 4 + e.value_offs;
                if let Err(why) = region.take(start, pad4(e.value_size)) {
                    bad(
                        self,
                        format!(
                            "entry at offset {at}: value (e_value_offs {}, e_value_size {}) {why}",
                            e.value_offs, e.value_size
                        ),
                    );
                    return;
                }
                padded = &area[start..start + pad4(e.value_size)];
            }
            if e.hash != 0 && !hash_matches(e.hash, name, padded) {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_hash {:#010x} is not the entry's hash",
                        e.hash
                    ),
                );
                return;
            }
            if let Some(why) = acl_problem(e.index, padded.get(..e.value_size).unwrap_or(&[])) {
                notes.push(format!("entry at offset {at}: ACL value: {why}"));
            }
            remain -= e.value_size;
            at += entry_len(e.name_len);
        }
        if let Err(why) = region.take(at, 4) {
            bad(self, format!("end of entries at offset {at} {why}"));
            return;
        }
        for n in notes {
            problem!(
                self,
                Info,
                Xattr,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) in-inode extended attributes: {n} (the kernel \
                 would refuse it; e2fsck does not check ACL values)"
            );
        }
    }

    /// Inode `ino`'s attribute block: the first inode naming it validates
    /// it (header, checksum, entries, as e2fsck's `check_ext_attr`), every
    /// one is counted for the refcount check. Returns the blocks it adds
    /// to i_blocks.
    pub(super) fn check_xattr_block(
        &mut self,
        ino: u32,
        inode: &Inode,
        iblock: u64,
        info: &mut InodeInfo,
    ) -> Result<u64, FsError> {
        let b = inode.file_acl;
        if !self.sb.has_compat(COMPAT_EXT_ATTR) || !self.geo.in_range(b) {
            problem!(
                self,
                Unsafe,
                Xattr,
                Some(ino),
                Some(iblock),
                "inode {ino} (block {iblock}) i_file_acl {b} is invalid"
            );
            return Ok(0);
        }
        if let Some(e) = self.xattr.get_mut(&b) {
            e.0 += 1;
            info.xattr_block = Some(b);
            return Ok(1);
        }
        let clash = self.meta.get(b) || self.used.get(b);
        self.claim(ino, b, 1, "xattr block", info);
        if clash {
            return Ok(1);
        }
        info.xattr_block = Some(b);
        let data = self.disk.read_block(b, BlockClass::Other)?;
        let magic = le32(&data, 0);
        let refcount = le32(&data, 4);
        let nblocks = le32(&data, 8);
        if magic != XATTR_MAGIC || nblocks != 1 {
            problem!(
                self,
                Unsafe,
                Xattr,
                Some(ino),
                Some(b),
                "inode {ino} xattr block {b} h_magic {magic:#010x} / h_blocks {nblocks} is invalid"
            );
        } else {
            if self.sb.metadata_csum() {
                let mut tmp = data.clone();
                put_le32(&mut tmp, 0x10, 0);
                let c = crc32c_raw(self.geo.csum_seed, &b.to_le_bytes());
                let want = crc32c_raw(c, &tmp);
                let have = le32(&data, 0x10);
                if want != have {
                    problem!(
                        self,
                        Unsafe,
                        Xattr,
                        Some(ino),
                        Some(b),
                        "xattr block {b} h_checksum is {have:#010x}, computed {want:#010x}"
                    );
                }
            }
            self.check_xattr_entries(ino, b, &data);
        }
        self.xattr.insert(b, (1, refcount));
        Ok(1)
    }

    /// The entries of attribute block `b` (first named by `ino`).
    fn check_xattr_entries(&mut self, ino: u32, b: u64, data: &[u8]) {
        let bs = data.len();
        let mut region = Region::new(bs);
        let _ = region.take(0, BLOCK_HEADER);
        let bad = |c: &mut Self, why: String| {
            problem!(
                c,
                Unsafe,
                Xattr,
                Some(ino),
                Some(b),
                "inode {ino} xattr block {b}: {why}"
            );
        };
        let mut at = BLOCK_HEADER;
        let mut hashes = Vec::new();
        let mut notes = Vec::new();
        let mut walked = true;
        while at < bs && le32(data, at) != 0 {
            let e = Entry::read(data, at);
            if let Err(why) = region.take(at, entry_len(e.name_len)) {
                bad(self, format!("entry at offset {at} {why}"));
                walked = false;
                break;
            }
            if e.index == 0 {
                bad(self, format!("entry at offset {at}: e_name_index is 0"));
                walked = false;
                break;
            }
            hashes.push(e.hash);
            if e.value_inum != 0 {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_value_inum {} (values in inodes, ea_inode, \
                         are not supported)",
                        e.value_inum
                    ),
                );
                at += entry_len(e.name_len);
                continue;
            }
            if e.value_size > XATTR_SIZE_MAX || e.value_offs + e.value_size > bs {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: value (e_value_offs {}, e_value_size {}) lies \
                         outside the block",
                        e.value_offs, e.value_size
                    ),
                );
                walked = false;
                break;
            }
            if e.value_size > 0 {
                if let Err(why) = region.take(e.value_offs, pad4(e.value_size)) {
                    bad(
                        self,
                        format!(
                            "entry at offset {at}: value (e_value_offs {}, e_value_size {}) {why}",
                            e.value_offs, e.value_size
                        ),
                    );
                }
            }
            let name = &data[at + ENTRY_HEADER..at + ENTRY_HEADER + e.name_len];
            let vend = (e.value_offs + pad4(e.value_size)).min(bs);
            let padded = &data[e.value_offs.min(vend)..vend];
            if !hash_matches(e.hash, name, padded) {
                bad(
                    self,
                    format!(
                        "entry at offset {at}: e_hash {:#010x} is not the entry's hash",
                        e.hash
                    ),
                );
            }
            if let Some(why) = acl_problem(e.index, padded.get(..e.value_size).unwrap_or(&[])) {
                notes.push(format!("entry at offset {at}: ACL value: {why}"));
            }
            at += entry_len(e.name_len);
        }
        if walked {
            if let Err(why) = region.take(at, 4) {
                bad(self, format!("end of entries at offset {at} {why}"));
            }
            let have = le32(data, 12);
            let want = block_hash(hashes);
            if have != want {
                notes.push(format!(
                    "h_hash is {have:#010x}, the entries' hashes give {want:#010x} (the block \
                     is only shared less; e2fsck does not check it)"
                ));
            }
        }
        for n in notes {
            problem!(
                self,
                Info,
                Xattr,
                Some(ino),
                Some(b),
                "xattr block {b}: {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Region;

    #[test]
    fn region_refuses_overlap_outside_and_empty() {
        let mut r = Region::new(64);
        assert!(r.take(0, 4).is_ok());
        assert!(r.take(4, 16).is_ok());
        assert!(r.take(8, 4).is_err());
        assert!(r.take(60, 8).is_err());
        assert!(r.take(usize::MAX, 2).is_err());
        assert!(r.take(40, 0).is_err());
        assert!(r.take(60, 4).is_ok());
    }
}
