//! Extended attributes as ext4 stores them, and POSIX ACLs in ext4's
//! compact form.
//!
//! Two places hold attributes:
//!
//! - **in the inode**, after the `i_extra_isize` fields: a magic word
//!   ([`MAGIC`]), then the entries, then (growing down from the end of the
//!   inode) the values. Value offsets count from the first entry;
//! - **in one attribute block** named by `i_file_acl`: a 32-byte header
//!   (magic, reference count, `h_blocks` = 1, a hash of the entries, a
//!   checksum), the entries sorted by (name index, name length, name), and
//!   the values growing down from the end of the block. Value offsets count
//!   from the start of the block. Inodes whose attributes are identical
//!   share one block; its reference count says how many.
//!
//! An entry is 16 bytes of header (`e_name_len`, `e_name_index`,
//! `e_value_offs`, `e_value_inum`, `e_value_size`, `e_hash`) and the name
//! without its namespace prefix, padded to 4 bytes; four zero bytes end the
//! list. Values are padded to 4 bytes. The namespace prefix is a number
//! ([`split_name`]): `user.` 1, `system.posix_acl_access` 2 (empty name),
//! `system.posix_acl_default` 3 (empty name), `trusted.` 4, `security.` 6.
//!
//! Hashes are the kernel's: [`entry_hash`] over the name and the padded
//! value as little-endian words (stored in block entries; in-inode entries
//! carry 0), and [`block_hash`] over the entries' hashes (0 when any entry
//! hash is 0: such a block is never shared). The block checksum is crc32c
//! seeded with the file system's seed and the block number
//! ([`block_checksum`]).
//!
//! Attribute values stored in separate inodes (`ea_inode`) are not
//! supported: an entry with `e_value_inum != 0` is an error.

use crate::le::{put_u16, put_u32, u16_at, u32_at};
use crate::{FormatError, Result};

/// `h_magic` of an attribute block and the in-inode magic word.
pub const MAGIC: u32 = 0xEA02_0000;
/// Size of an attribute block's header.
pub const BLOCK_HEADER: usize = 32;
/// Offset of `h_checksum` in the block header.
pub const BLOCK_CHECKSUM: usize = 0x10;
/// Size of an entry's fixed part.
pub const ENTRY_HEADER: usize = 16;
/// Most inodes one attribute block is shared by (the kernel's
/// `EXT4_XATTR_REFCOUNT_MAX`).
pub const REFCOUNT_MAX: u32 = 1024;
/// Longest name after the prefix (`e_name_len` is one byte).
pub const NAME_MAX: usize = 255;
/// Longest value the VFS passes (`XATTR_SIZE_MAX`).
pub const VALUE_MAX: usize = 65536;

/// Name indexes (`e_name_index`).
pub mod index {
    pub const USER: u8 = 1;
    pub const POSIX_ACL_ACCESS: u8 = 2;
    pub const POSIX_ACL_DEFAULT: u8 = 3;
    pub const TRUSTED: u8 = 4;
    pub const SECURITY: u8 = 6;
    pub const SYSTEM: u8 = 7;
}

/// The full names of the two ACL attributes.
pub const ACL_ACCESS_NAME: &[u8] = b"system.posix_acl_access";
/// See [`ACL_ACCESS_NAME`].
pub const ACL_DEFAULT_NAME: &[u8] = b"system.posix_acl_default";

const PREFIXES: &[(&[u8], u8)] = &[
    (b"user.", index::USER),
    (b"trusted.", index::TRUSTED),
    (b"security.", index::SECURITY),
];

/// Why a full attribute name cannot be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameError {
    /// A namespace ext4 does not serve (`EOPNOTSUPP`).
    Unsupported,
    /// Empty after the prefix (`EINVAL`).
    Empty,
    /// Longer than [`NAME_MAX`] after the prefix (`ERANGE`, as the kernel).
    TooLong,
}

/// Split a full name (`user.mime_type`) into its name index and the name
/// stored on disk (`mime_type`).
pub fn split_name(full: &[u8]) -> std::result::Result<(u8, &[u8]), NameError> {
    if full == ACL_ACCESS_NAME {
        return Ok((index::POSIX_ACL_ACCESS, b""));
    }
    if full == ACL_DEFAULT_NAME {
        return Ok((index::POSIX_ACL_DEFAULT, b""));
    }
    for &(prefix, idx) in PREFIXES {
        if let Some(rest) = full.strip_prefix(prefix) {
            if rest.is_empty() {
                return Err(NameError::Empty);
            }
            if rest.len() > NAME_MAX {
                return Err(NameError::TooLong);
            }
            return Ok((idx, rest));
        }
    }
    Err(NameError::Unsupported)
}

/// The full name of an entry, or `None` for a name index ordo does not
/// serve (such entries are kept, never listed).
pub fn full_name(idx: u8, name: &[u8]) -> Option<Vec<u8>> {
    match idx {
        index::POSIX_ACL_ACCESS if name.is_empty() => Some(ACL_ACCESS_NAME.to_vec()),
        index::POSIX_ACL_DEFAULT if name.is_empty() => Some(ACL_DEFAULT_NAME.to_vec()),
        _ => PREFIXES.iter().find(|p| p.1 == idx).map(|p| {
            let mut v = p.0.to_vec();
            v.extend_from_slice(name);
            v
        }),
    }
}

/// One attribute: name index, name (without prefix), value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attr {
    /// `e_name_index`.
    pub index: u8,
    /// The name after the prefix.
    pub name: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

impl Attr {
    /// The order entries of a block are kept in (the kernel's lookup stops
    /// at the first entry not below the name it looks for).
    pub fn key(&self) -> (u8, usize, &[u8]) {
        (self.index, self.name.len(), &self.name)
    }
    /// Bytes of its entry (header and padded name).
    pub fn entry_len(&self) -> usize {
        entry_len(self.name.len())
    }
    /// Bytes of its value, padded.
    pub fn value_len(&self) -> usize {
        pad4(self.value.len())
    }
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Bytes of an entry with a name of `name_len` bytes.
pub fn entry_len(name_len: usize) -> usize {
    pad4(ENTRY_HEADER + name_len)
}

/// The kernel's `ext4_xattr_hash_entry`: the name's bytes, then the value
/// padded to 4 bytes as little-endian words.
pub fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    entry_hash_with(name, value, u32::from)
}

/// The same hash with the name's bytes taken as signed chars, which
/// kernels before 6.2 computed on x86: a checker accepts either.
pub fn entry_hash_signed(name: &[u8], value: &[u8]) -> u32 {
    entry_hash_with(name, value, |c| c as i8 as i32 as u32)
}

fn entry_hash_with(name: &[u8], value: &[u8], ch: impl Fn(u8) -> u32) -> u32 {
    let mut hash: u32 = 0;
    for &c in name {
        hash = (hash << 5) ^ (hash >> 27) ^ ch(c);
    }
    for w in value.chunks(4) {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        hash = (hash << 16) ^ (hash >> 16) ^ u32::from_le_bytes(b);
    }
    hash
}

/// The kernel's `ext4_xattr_rehash`: the entries' hashes folded, 0 when
/// any of them is 0.
pub fn block_hash(entry_hashes: impl IntoIterator<Item = u32>) -> u32 {
    let mut hash: u32 = 0;
    for h in entry_hashes {
        if h == 0 {
            return 0;
        }
        hash = (hash << 16) ^ (hash >> 16) ^ h;
    }
    hash
}

/// `h_checksum` of attribute block `blocknr` under `metadata_csum`.
pub fn block_checksum(csum_seed: u32, blocknr: u64, block: &[u8]) -> u32 {
    let mut c = crate::csum::ext4_crc32c(csum_seed, &blocknr.to_le_bytes());
    c = crate::csum::ext4_crc32c(c, &block[..BLOCK_CHECKSUM]);
    c = crate::csum::ext4_crc32c(c, &[0; 4]);
    crate::csum::ext4_crc32c(c, &block[BLOCK_CHECKSUM + 4..])
}

/// Decode the entries of a region. `entries` is where the first entry
/// starts, `value_base` what value offsets count from, `end` where the
/// region ends (all offsets into `buf`).
fn decode_entries(
    buf: &[u8],
    entries: usize,
    value_base: usize,
    end: usize,
    what: &'static str,
) -> Result<Vec<Attr>> {
    let mut out = Vec::new();
    let mut at = entries;
    loop {
        if at + 4 > end {
            return Err(FormatError::new(what, format!("entries run past {end}")));
        }
        if u32_at(buf, at) == 0 {
            break;
        }
        if at + ENTRY_HEADER > end {
            return Err(FormatError::new(
                what,
                format!("entry at {at} is cut short"),
            ));
        }
        let name_len = usize::from(buf[at]);
        let idx = buf[at + 1];
        let offs = usize::from(u16_at(buf, at + 2));
        let inum = u32_at(buf, at + 4);
        let size = u32_at(buf, at + 8) as usize;
        let next = at + entry_len(name_len);
        if next + 4 > end {
            return Err(FormatError::new(
                what,
                format!("entry at {at}: name runs past the region"),
            ));
        }
        if inum != 0 {
            return Err(FormatError::new(
                what,
                format!("entry at {at}: value in inode {inum} (ea_inode) is not supported"),
            ));
        }
        let name = buf[at + ENTRY_HEADER..at + ENTRY_HEADER + name_len].to_vec();
        let value = if size == 0 {
            Vec::new()
        } else {
            let start = value_base + offs;
            if start < next || start + size > end {
                return Err(FormatError::new(
                    what,
                    format!(
                        "entry at {at}: value at {offs} of {size} bytes lies outside the region"
                    ),
                ));
            }
            buf[start..start + size].to_vec()
        };
        out.push(Attr {
            index: idx,
            name,
            value,
        });
        at = next;
    }
    Ok(out)
}

/// Bytes `attrs` need in a region besides the fixed part: entries, the
/// end marker and the padded values.
pub fn space_needed(attrs: &[Attr]) -> usize {
    attrs
        .iter()
        .map(|a| a.entry_len() + a.value_len())
        .sum::<usize>()
        + 4
}

/// Lay out `attrs` in `buf[entries..end]` (zeroed first): entries from the
/// front, values from the back in entry order. Returns the entry hashes
/// (0 for every entry when `hashes` is false, as in-inode entries carry).
fn encode_entries(
    buf: &mut [u8],
    entries: usize,
    value_base: usize,
    end: usize,
    attrs: &[Attr],
    hashes: bool,
) -> Vec<u32> {
    assert!(
        entries + space_needed(attrs) <= end,
        "attributes do not fit the region"
    );
    buf[entries..end].fill(0);
    let mut at = entries;
    let mut vend = end;
    let mut out = Vec::with_capacity(attrs.len());
    for a in attrs {
        assert!(a.name.len() <= NAME_MAX);
        buf[at] = a.name.len() as u8;
        buf[at + 1] = a.index;
        let offs = if a.value.is_empty() {
            0
        } else {
            vend -= a.value_len();
            buf[vend..vend + a.value.len()].copy_from_slice(&a.value);
            vend - value_base
        };
        put_u16(buf, at + 2, offs as u16);
        put_u32(buf, at + 4, 0);
        put_u32(buf, at + 8, a.value.len() as u32);
        let h = if hashes {
            entry_hash(&a.name, &a.value)
        } else {
            0
        };
        put_u32(buf, at + 12, h);
        buf[at + ENTRY_HEADER..at + ENTRY_HEADER + a.name.len()].copy_from_slice(&a.name);
        out.push(h);
        at += a.entry_len();
    }
    out
}

/// The attributes stored in an inode (`raw`, the whole on-disk inode),
/// given its `i_extra_isize`. An inode without the magic word has none.
pub fn decode_ibody(raw: &[u8], extra_isize: u16) -> Result<Vec<Attr>> {
    let start = 128 + usize::from(extra_isize);
    if raw.len() < start + 4 || u32_at(raw, start) != MAGIC {
        return Ok(Vec::new());
    }
    decode_entries(raw, start + 4, start + 4, raw.len(), "inode xattr entries")
}

/// Room for attributes in an inode of `inode_size` bytes with this
/// `i_extra_isize` (what [`space_needed`] must not exceed), 0 when there
/// is none.
pub fn ibody_room(inode_size: usize, extra_isize: u16) -> usize {
    inode_size.saturating_sub(128 + usize::from(extra_isize) + 4)
}

/// Write `attrs` into the inode's attribute area (or clear it when
/// `attrs` is empty). Panics when they do not fit: check [`ibody_room`].
pub fn encode_ibody(raw: &mut [u8], extra_isize: u16, attrs: &[Attr]) {
    let start = 128 + usize::from(extra_isize);
    let end = raw.len();
    if attrs.is_empty() {
        if end >= start {
            raw[start..].fill(0);
        }
        return;
    }
    put_u32(raw, start, MAGIC);
    encode_entries(raw, start + 4, start + 4, end, attrs, false);
}

/// A decoded attribute block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrBlock {
    /// `h_refcount`.
    pub refcount: u32,
    /// `h_hash`.
    pub hash: u32,
    /// The entries, in block order.
    pub attrs: Vec<Attr>,
}

/// Decode attribute block `buf` (checksum not checked: see
/// [`block_checksum`]).
pub fn decode_block(buf: &[u8]) -> Result<XattrBlock> {
    if buf.len() < BLOCK_HEADER + 4 {
        return Err(FormatError::new("xattr block", "shorter than its header"));
    }
    let magic = u32_at(buf, 0);
    if magic != MAGIC {
        return Err(FormatError::new(
            "xattr block h_magic",
            format!("{magic:#010x}"),
        ));
    }
    let nblocks = u32_at(buf, 8);
    if nblocks != 1 {
        return Err(FormatError::new(
            "xattr block h_blocks",
            format!("{nblocks}, not 1"),
        ));
    }
    Ok(XattrBlock {
        refcount: u32_at(buf, 4),
        hash: u32_at(buf, 12),
        attrs: decode_entries(buf, BLOCK_HEADER, 0, buf.len(), "xattr block entries")?,
    })
}

/// Encode an attribute block of `block_size` bytes holding `attrs` (sorted
/// here) with reference count `refcount`; the checksum is left 0 (see
/// [`block_checksum`]). Panics when they do not fit: check
/// [`space_needed`] against `block_size - BLOCK_HEADER`.
pub fn encode_block(block_size: usize, refcount: u32, attrs: &[Attr]) -> Vec<u8> {
    let mut sorted: Vec<Attr> = attrs.to_vec();
    sorted.sort_by(|a, b| a.key().cmp(&b.key()));
    let mut buf = vec![0u8; block_size];
    put_u32(&mut buf, 0, MAGIC);
    put_u32(&mut buf, 4, refcount);
    put_u32(&mut buf, 8, 1);
    let hashes = encode_entries(&mut buf, BLOCK_HEADER, 0, block_size, &sorted, true);
    put_u32(&mut buf, 12, block_hash(hashes));
    buf
}

// ----- POSIX ACLs -----

/// ACL entry tags (the same numbers on disk and in the VFS format).
pub mod acl_tag {
    pub const USER_OBJ: u16 = 0x01;
    pub const USER: u16 = 0x02;
    pub const GROUP_OBJ: u16 = 0x04;
    pub const GROUP: u16 = 0x08;
    pub const MASK: u16 = 0x10;
    pub const OTHER: u16 = 0x20;
}

/// `a_version` of ext4's on-disk ACL.
pub const ACL_DISK_VERSION: u32 = 1;
/// `a_version` of the VFS's `system.posix_acl_*` value.
pub const ACL_XATTR_VERSION: u32 = 2;
const UNDEFINED_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclEntry {
    /// One of [`acl_tag`].
    pub tag: u16,
    /// `rwx` bits.
    pub perm: u16,
    /// The uid or gid of a `USER` or `GROUP` entry.
    pub id: u32,
}

/// A POSIX ACL: entries in the canonical order (by tag, then id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Acl {
    /// The entries.
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// The three entries mode bits stand for.
    pub fn from_mode(mode: u16) -> Acl {
        Acl {
            entries: vec![
                AclEntry {
                    tag: acl_tag::USER_OBJ,
                    perm: (mode >> 6) & 7,
                    id: UNDEFINED_ID,
                },
                AclEntry {
                    tag: acl_tag::GROUP_OBJ,
                    perm: (mode >> 3) & 7,
                    id: UNDEFINED_ID,
                },
                AclEntry {
                    tag: acl_tag::OTHER,
                    perm: mode & 7,
                    id: UNDEFINED_ID,
                },
            ],
        }
    }

    /// The VFS's `posix_acl_valid`: entries in order, exactly one of each
    /// `*_OBJ` and `OTHER`, named entries unique, a `MASK` when there is
    /// any named entry, permissions within `rwx`.
    pub fn validate(&self) -> std::result::Result<(), &'static str> {
        let (mut uo, mut go, mut other, mut mask, mut named) = (0, 0, 0, 0, 0);
        let mut prev: Option<(u16, u32)> = None;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err("permission bits beyond rwx");
            }
            let key = match e.tag {
                acl_tag::USER_OBJ => {
                    uo += 1;
                    (e.tag, 0)
                }
                acl_tag::GROUP_OBJ => {
                    go += 1;
                    (e.tag, 0)
                }
                acl_tag::MASK => {
                    mask += 1;
                    (e.tag, 0)
                }
                acl_tag::OTHER => {
                    other += 1;
                    (e.tag, 0)
                }
                acl_tag::USER | acl_tag::GROUP => {
                    named += 1;
                    (e.tag, e.id)
                }
                _ => return Err("unknown entry tag"),
            };
            if let Some(p) = prev {
                if key <= p {
                    return Err("entries out of order or repeated");
                }
            }
            prev = Some(key);
        }
        if uo != 1 || go != 1 || other != 1 || mask > 1 {
            return Err("needs exactly one owner, group and other entry");
        }
        if named > 0 && mask == 0 {
            return Err("named entries need a mask entry");
        }
        Ok(())
    }

    /// The permission bits this ACL gives the mode (owner, group class:
    /// the mask when there is one, other).
    pub fn mode_bits(&self) -> u16 {
        let mut m = 0;
        let mut group_obj = 0;
        let mut mask = None;
        for e in &self.entries {
            match e.tag {
                acl_tag::USER_OBJ => m |= (e.perm & 7) << 6,
                acl_tag::GROUP_OBJ => group_obj = e.perm & 7,
                acl_tag::MASK => mask = Some(e.perm & 7),
                acl_tag::OTHER => m |= e.perm & 7,
                _ => {}
            }
        }
        m | (mask.unwrap_or(group_obj) << 3)
    }

    /// Whether mode bits say all this ACL says (no named entries, no
    /// mask): such an access ACL is not stored (`posix_acl_equiv_mode`).
    pub fn is_equivalent_to_mode(&self) -> bool {
        self.entries.iter().all(|e| {
            matches!(
                e.tag,
                acl_tag::USER_OBJ | acl_tag::GROUP_OBJ | acl_tag::OTHER
            )
        })
    }

    /// Change the entries mode bits stand for (`posix_acl_chmod`): owner,
    /// the mask (or the owning group without one), other.
    pub fn chmod(&mut self, mode: u16) {
        let has_mask = self.entries.iter().any(|e| e.tag == acl_tag::MASK);
        for e in &mut self.entries {
            match e.tag {
                acl_tag::USER_OBJ => e.perm = (mode >> 6) & 7,
                acl_tag::GROUP_OBJ if !has_mask => e.perm = (mode >> 3) & 7,
                acl_tag::MASK => e.perm = (mode >> 3) & 7,
                acl_tag::OTHER => e.perm = mode & 7,
                _ => {}
            }
        }
    }

    /// A new inode's access ACL from its directory's default ACL and the
    /// mode it was created with (`posix_acl_create_masq`): returns the
    /// ACL, the mode's new permission bits, and whether the ACL says more
    /// than the mode (it is stored only then).
    pub fn create_masq(&self, mode: u16) -> (Acl, u16, bool) {
        let mut acl = self.clone();
        let mut m = mode & 0o777;
        let mut not_equiv = false;
        let (mut group_obj, mut mask) = (None, None);
        for (i, e) in acl.entries.iter_mut().enumerate() {
            match e.tag {
                acl_tag::USER_OBJ => {
                    e.perm &= (m >> 6) & 7;
                    m &= (e.perm << 6) | !0o700;
                }
                acl_tag::USER | acl_tag::GROUP => not_equiv = true,
                acl_tag::GROUP_OBJ => group_obj = Some(i),
                acl_tag::OTHER => {
                    e.perm &= m & 7;
                    m &= e.perm | !0o007;
                }
                acl_tag::MASK => {
                    mask = Some(i);
                    not_equiv = true;
                }
                _ => {}
            }
        }
        if let Some(g) = mask.or(group_obj) {
            let e = &mut acl.entries[g];
            e.perm &= (m >> 3) & 7;
            m &= (e.perm << 3) | !0o070;
        }
        (acl, m & 0o777, not_equiv)
    }

    /// Parse the VFS form (`system.posix_acl_*` as `getfacl` reads it).
    pub fn from_xattr(v: &[u8]) -> Result<Acl> {
        if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
            return Err(FormatError::new("posix acl", format!("{} bytes", v.len())));
        }
        let ver = u32_at(v, 0);
        if ver != ACL_XATTR_VERSION {
            return Err(FormatError::new("posix acl a_version", format!("{ver}")));
        }
        let entries = v[4..]
            .chunks(8)
            .map(|c| {
                let tag = u16_at(c, 0);
                AclEntry {
                    tag,
                    perm: u16_at(c, 2),
                    id: if matches!(tag, acl_tag::USER | acl_tag::GROUP) {
                        u32_at(c, 4)
                    } else {
                        UNDEFINED_ID
                    },
                }
            })
            .collect();
        Ok(Acl { entries })
    }

    /// The VFS form.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&ACL_XATTR_VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, acl_tag::USER | acl_tag::GROUP) {
                e.id
            } else {
                UNDEFINED_ID
            };
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// Parse ext4's on-disk form: a version word, then 4-byte entries for
    /// the `*_OBJ`, `MASK` and `OTHER` tags and 8-byte ones (with the id)
    /// for `USER` and `GROUP`.
    pub fn from_disk(v: &[u8]) -> Result<Acl> {
        if v.len() < 4 || u32_at(v, 0) != ACL_DISK_VERSION {
            return Err(FormatError::new(
                "ext4 acl a_version",
                format!("{:?}", v.get(..4)),
            ));
        }
        let mut entries = Vec::new();
        let mut at = 4;
        while at < v.len() {
            if at + 4 > v.len() {
                return Err(FormatError::new("ext4 acl", "entry cut short"));
            }
            let tag = u16_at(v, at);
            let perm = u16_at(v, at + 2);
            let id = match tag {
                acl_tag::USER | acl_tag::GROUP => {
                    if at + 8 > v.len() {
                        return Err(FormatError::new("ext4 acl", "named entry cut short"));
                    }
                    let id = u32_at(v, at + 4);
                    at += 8;
                    id
                }
                acl_tag::USER_OBJ | acl_tag::GROUP_OBJ | acl_tag::MASK | acl_tag::OTHER => {
                    at += 4;
                    UNDEFINED_ID
                }
                t => return Err(FormatError::new("ext4 acl e_tag", format!("{t:#x}"))),
            };
            entries.push(AclEntry { tag, perm, id });
        }
        Ok(Acl { entries })
    }

    /// ext4's on-disk form.
    pub fn to_disk(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ACL_DISK_VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            if matches!(e.tag, acl_tag::USER | acl_tag::GROUP) {
                v.extend_from_slice(&e.id.to_le_bytes());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(index: u8, name: &str, value: &[u8]) -> Attr {
        Attr {
            index,
            name: name.as_bytes().to_vec(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn names_split_and_join() {
        assert_eq!(split_name(b"user.x"), Ok((index::USER, &b"x"[..])));
        assert_eq!(
            split_name(b"system.posix_acl_access"),
            Ok((index::POSIX_ACL_ACCESS, &b""[..]))
        );
        assert_eq!(split_name(b"user."), Err(NameError::Empty));
        assert_eq!(split_name(b"foo.bar"), Err(NameError::Unsupported));
        assert_eq!(split_name(b"system.other"), Err(NameError::Unsupported));
        let long = [b"user.".to_vec(), vec![b'a'; 256]].concat();
        assert_eq!(split_name(&long), Err(NameError::TooLong));
        assert_eq!(
            full_name(index::SECURITY, b"selinux").unwrap(),
            b"security.selinux"
        );
        assert_eq!(full_name(9, b"c"), None);
    }

    #[test]
    fn block_roundtrip_sorted_with_hashes() {
        let attrs = vec![
            attr(index::USER, "zz", b"1"),
            attr(index::USER, "a", b"hello world"),
            attr(index::TRUSTED, "t", b""),
        ];
        let b = encode_block(4096, 3, &attrs);
        let d = decode_block(&b).unwrap();
        assert_eq!(d.refcount, 3);
        assert_eq!(
            d.attrs.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
            vec![b"a".to_vec(), b"zz".to_vec(), b"t".to_vec()]
        );
        assert_eq!(d.attrs[0].value, b"hello world");
        let h0 = u32_at(&b, BLOCK_HEADER + 12);
        assert_eq!(h0, entry_hash(b"a", b"hello world"));
        // The empty value's entry hashes its name only.
        assert_ne!(d.hash, 0);
    }

    #[test]
    fn ibody_roundtrip_and_room() {
        let mut raw = vec![0u8; 256];
        assert_eq!(ibody_room(256, 32), 92);
        let attrs = vec![attr(index::USER, "k", b"v")];
        assert!(space_needed(&attrs) <= 92);
        encode_ibody(&mut raw, 32, &attrs);
        assert_eq!(u32_at(&raw, 160), MAGIC);
        assert_eq!(decode_ibody(&raw, 32).unwrap(), attrs);
        encode_ibody(&mut raw, 32, &[]);
        assert!(raw[160..].iter().all(|&b| b == 0));
        assert!(decode_ibody(&raw, 32).unwrap().is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut b = encode_block(1024, 1, &[attr(index::USER, "a", b"xyz")]);
        put_u16(&mut b, BLOCK_HEADER + 2, 1022);
        assert!(decode_block(&b).is_err());
        let mut raw = vec![0xffu8; 256];
        put_u32(&mut raw, 160, MAGIC);
        assert!(decode_ibody(&raw, 32).is_err());
        for i in 0..256 {
            let mut r = vec![0u8; 256];
            encode_ibody(&mut r, 32, &[attr(index::USER, "abc", b"0123456789")]);
            r[164 + (i % 92)] = i as u8;
            let _ = decode_ibody(&r, 32);
        }
    }

    #[test]
    fn acl_forms_roundtrip_and_masq() {
        let acl = Acl {
            entries: vec![
                AclEntry {
                    tag: acl_tag::USER_OBJ,
                    perm: 7,
                    id: UNDEFINED_ID,
                },
                AclEntry {
                    tag: acl_tag::USER,
                    perm: 6,
                    id: 1000,
                },
                AclEntry {
                    tag: acl_tag::GROUP_OBJ,
                    perm: 5,
                    id: UNDEFINED_ID,
                },
                AclEntry {
                    tag: acl_tag::MASK,
                    perm: 7,
                    id: UNDEFINED_ID,
                },
                AclEntry {
                    tag: acl_tag::OTHER,
                    perm: 0,
                    id: UNDEFINED_ID,
                },
            ],
        };
        acl.validate().unwrap();
        assert_eq!(Acl::from_disk(&acl.to_disk()).unwrap(), acl);
        assert_eq!(Acl::from_xattr(&acl.to_xattr()).unwrap(), acl);
        assert_eq!(acl.to_disk().len(), 4 + 4 + 8 + 4 + 4 + 4);
        assert_eq!(acl.mode_bits(), 0o770);
        let (a, m, ne) = acl.create_masq(0o666);
        assert!(ne);
        assert_eq!(m, 0o660);
        assert_eq!(a.entries[0].perm, 6);
        assert_eq!(a.entries[3].perm, 6);
        assert!(Acl::from_mode(0o640).is_equivalent_to_mode());
        let mut bad = acl.clone();
        bad.entries.remove(3);
        assert!(bad.validate().is_err());
    }
}
