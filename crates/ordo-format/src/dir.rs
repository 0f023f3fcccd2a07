//! Directory blocks: linear entries (`ext4_dir_entry_2`), the 12-byte
//! checksum tail of `metadata_csum`, and recognition of htree (dx) blocks.
//!
//! Every mutating helper works on a `&mut [u8]` block image and returns the
//! byte range it changed, because the core reports each change as an update
//! with its old and new bytes. Helpers never fix checksums themselves: the
//! caller sets the tail once after all edits to a block
//! ([`set_dirent_tail_checksum`]), which is itself a reported change.
//!
//! An htree's interior blocks look like a single empty entry to a linear
//! reader, which is how ext4 stays readable by ext2 code. ordo validates dx
//! blocks (structure and checksum) and can rewrite one as an ordinary empty
//! linear block when it drops a directory's index.

use std::ops::Range;

use crate::csum::ext4_crc32c;
use crate::le::*;
use crate::{FormatError, Result};

/// Longest file name.
pub const NAME_LEN_MAX: usize = 255;
/// Size of the entry header (inode, rec_len, name_len, file_type).
pub const DIRENT_HEADER: usize = 8;
/// Size of the `metadata_csum` tail at the end of each leaf block.
pub const DIRENT_TAIL_SIZE: usize = 12;
/// `det_reserved_ft` of the tail: marks the fake entry as a checksum tail.
pub const DIRENT_TAIL_FT: u8 = 0xDE;

/// `file_type` values.
pub mod ft {
    pub const UNKNOWN: u8 = 0;
    pub const REG_FILE: u8 = 1;
    pub const DIR: u8 = 2;
    pub const CHRDEV: u8 = 3;
    pub const BLKDEV: u8 = 4;
    pub const FIFO: u8 = 5;
    pub const SOCK: u8 = 6;
    pub const SYMLINK: u8 = 7;
    /// Largest valid value.
    pub const MAX: u8 = 7;
}

/// The directory-entry file type of an inode mode.
pub fn file_type_from_mode(mode: u16) -> u8 {
    use crate::inode::mode::*;
    match mode & S_IFMT {
        S_IFREG => ft::REG_FILE,
        S_IFDIR => ft::DIR,
        S_IFCHR => ft::CHRDEV,
        S_IFBLK => ft::BLKDEV,
        S_IFIFO => ft::FIFO,
        S_IFSOCK => ft::SOCK,
        S_IFLNK => ft::SYMLINK,
        _ => ft::UNKNOWN,
    }
}

/// The `S_IFMT` bits matching a directory-entry file type (0 for unknown).
pub fn mode_from_file_type(t: u8) -> u16 {
    use crate::inode::mode::*;
    match t {
        ft::REG_FILE => S_IFREG,
        ft::DIR => S_IFDIR,
        ft::CHRDEV => S_IFCHR,
        ft::BLKDEV => S_IFBLK,
        ft::FIFO => S_IFIFO,
        ft::SOCK => S_IFSOCK,
        ft::SYMLINK => S_IFLNK,
        _ => 0,
    }
}

/// Bytes an entry with a name of `name_len` needs: header + name, rounded to 4.
pub const fn rec_len_for(name_len: usize) -> usize {
    (DIRENT_HEADER + name_len + 3) & !3
}

/// Decode an on-disk `rec_len` (64 KiB blocks store 65536 as 0 or 65535).
pub fn rec_len_from_disk(dlen: u16, block_size: usize) -> usize {
    let len = usize::from(dlen);
    if block_size < 65536 {
        return len;
    }
    if dlen == u16::MAX || dlen == 0 {
        return block_size;
    }
    (len & 65532) | ((len & 3) << 16)
}

/// Encode a `rec_len` for disk.
pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    assert!(len <= block_size && len.is_multiple_of(4), "rec_len {len}");
    if len < 65536 {
        return len as u16;
    }
    if len == block_size {
        if block_size == 65536 {
            return u16::MAX;
        }
        return 0;
    }
    ((len & 65532) | ((len >> 16) & 3)) as u16
}

/// One directory entry, borrowed from a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Byte offset of the entry in the block.
    pub offset: usize,
    /// Inode number, 0 for an unused entry.
    pub inode: u32,
    /// Decoded record length.
    pub rec_len: usize,
    /// File type byte (0 when the file system lacks `filetype`).
    pub file_type: u8,
    pub name: &'a [u8],
}

impl DirEntry<'_> {
    /// Bytes this entry's name actually needs.
    pub fn used_len(&self) -> usize {
        if self.inode == 0 {
            0
        } else {
            rec_len_for(self.name.len())
        }
    }
    /// Byte range of this record in the block.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.rec_len
    }
}

/// Geometry of a leaf block: its size and whether it ends in a checksum tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirBlockLayout {
    pub block_size: usize,
    /// `metadata_csum`: the last 12 bytes are the tail, not entries.
    pub has_tail: bool,
}

impl DirBlockLayout {
    /// Where entries end (the tail's offset, or the block size).
    pub fn entries_end(&self) -> usize {
        if self.has_tail {
            self.block_size.saturating_sub(DIRENT_TAIL_SIZE)
        } else {
            self.block_size
        }
    }
}

/// Iterate over the entries of a leaf block, validating each as the kernel's
/// `ext4_check_dir_entry` does. Yields an error (once) at the first bad entry.
pub struct DirIter<'a> {
    block: &'a [u8],
    layout: DirBlockLayout,
    pos: usize,
    done: bool,
}

/// Iterate over the entries of `block`.
pub fn iter(block: &[u8], layout: DirBlockLayout) -> DirIter<'_> {
    DirIter {
        block,
        layout,
        pos: 0,
        done: false,
    }
}

fn bad(field: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::new(field, detail)
}

/// Decode and validate the entry at `offset`.
pub fn entry_at(block: &[u8], layout: DirBlockLayout, offset: usize) -> Result<DirEntry<'_>> {
    let end = layout.entries_end();
    if block.len() != layout.block_size {
        return Err(bad(
            "directory block",
            format!("{} bytes, block size {}", block.len(), layout.block_size),
        ));
    }
    if !offset.is_multiple_of(4) || offset + DIRENT_HEADER > end {
        return Err(bad(
            "directory entry",
            format!("offset {offset} past the entry area (ends at {end})"),
        ));
    }
    let inode = u32_at(block, offset);
    let rec_len = rec_len_from_disk(u16_at(block, offset + 4), layout.block_size);
    let name_len = usize::from(block[offset + 6]);
    let file_type = block[offset + 7];
    if rec_len < rec_len_for(1) {
        return Err(bad(
            "directory entry rec_len",
            format!("{rec_len} at offset {offset} is smaller than minimal"),
        ));
    }
    if !rec_len.is_multiple_of(4) {
        return Err(bad(
            "directory entry rec_len",
            format!("{rec_len} at offset {offset} is not a multiple of 4"),
        ));
    }
    if rec_len < rec_len_for(name_len) {
        return Err(bad(
            "directory entry rec_len",
            format!("{rec_len} at offset {offset} too small for name_len {name_len}"),
        ));
    }
    if offset + rec_len > end {
        return Err(bad(
            "directory entry rec_len",
            format!("{rec_len} at offset {offset} runs past the entry area ({end})"),
        ));
    }
    Ok(DirEntry {
        offset,
        inode,
        rec_len,
        file_type,
        name: &block[offset + DIRENT_HEADER..offset + DIRENT_HEADER + name_len],
    })
}

impl<'a> Iterator for DirIter<'a> {
    type Item = Result<DirEntry<'a>>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.pos >= self.layout.entries_end() {
            return None;
        }
        match entry_at(self.block, self.layout, self.pos) {
            Ok(e) => {
                self.pos += e.rec_len;
                Some(Ok(e))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Validate a whole leaf block: entries chain exactly to the entry area's
/// end, names are non-empty for live entries, file types are known, and the
/// tail (if expected) is well formed. Inode numbers are checked against
/// `inodes_count` when given.
pub fn validate_block(
    block: &[u8],
    layout: DirBlockLayout,
    inodes_count: Option<u32>,
) -> Result<()> {
    let mut last_end = 0;
    for e in iter(block, layout) {
        let e = e?;
        if e.inode != 0 && e.name.is_empty() {
            return Err(bad(
                "directory entry name_len",
                format!("0 for live entry at offset {}", e.offset),
            ));
        }
        if e.file_type > ft::MAX {
            return Err(bad(
                "directory entry file_type",
                format!("{} at offset {}", e.file_type, e.offset),
            ));
        }
        if let Some(max) = inodes_count {
            if e.inode > max {
                return Err(bad(
                    "directory entry inode",
                    format!(
                        "{} at offset {} exceeds s_inodes_count {max}",
                        e.inode, e.offset
                    ),
                ));
            }
        }
        last_end = e.offset + e.rec_len;
    }
    if last_end != layout.entries_end() {
        return Err(bad(
            "directory block",
            format!(
                "entries end at {last_end}, expected {}",
                layout.entries_end()
            ),
        ));
    }
    if layout.has_tail && !has_valid_tail(block) {
        return Err(bad(
            "directory block tail",
            "missing or malformed checksum tail",
        ));
    }
    Ok(())
}

/// Find a live entry by name.
pub fn find<'a>(
    block: &'a [u8],
    layout: DirBlockLayout,
    name: &[u8],
) -> Result<Option<DirEntry<'a>>> {
    for e in iter(block, layout) {
        let e = e?;
        if e.inode != 0 && e.name == name {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

fn write_entry(
    block: &mut [u8],
    bs: usize,
    offset: usize,
    inode: u32,
    rec_len: usize,
    name: &[u8],
    file_type: u8,
) {
    put_u32(block, offset, inode);
    put_u16(block, offset + 4, rec_len_to_disk(rec_len, bs));
    block[offset + 6] = name.len() as u8;
    block[offset + 7] = file_type;
    block[offset + DIRENT_HEADER..offset + DIRENT_HEADER + name.len()].copy_from_slice(name);
    // Zero the padding so block images are deterministic.
    let pad_end = offset + rec_len_for(name.len());
    block[offset + DIRENT_HEADER + name.len()..pad_end].fill(0);
}

/// Insert an entry in the first record with room (an unused record, or the
/// slack after a live one), as the kernel does. Returns the changed byte
/// range, or `None` when the block has no room. Does not check for a
/// duplicate name: the caller looks up first.
pub fn insert(
    block: &mut [u8],
    layout: DirBlockLayout,
    inode: u32,
    name: &[u8],
    file_type: u8,
) -> Result<Option<Range<usize>>> {
    assert!(inode != 0, "inserting inode 0");
    if name.is_empty() || name.len() > NAME_LEN_MAX {
        return Err(bad(
            "directory entry name_len",
            format!("{} bytes", name.len()),
        ));
    }
    let need = rec_len_for(name.len());
    let bs = layout.block_size;
    let mut slot = None;
    for e in iter(block, layout) {
        let e = e?;
        if e.inode == 0 && e.rec_len >= need {
            slot = Some((e.offset, e.rec_len, None));
            break;
        }
        let used = e.used_len();
        if e.inode != 0 && e.rec_len >= used + need {
            slot = Some((e.offset, e.rec_len, Some(used)));
            break;
        }
    }
    let Some((offset, rec_len, split)) = slot else {
        return Ok(None);
    };
    match split {
        None => {
            write_entry(block, bs, offset, inode, rec_len, name, file_type);
            Ok(Some(offset..offset + rec_len_for(name.len())))
        }
        Some(used) => {
            put_u16(block, offset + 4, rec_len_to_disk(used, bs));
            let new_off = offset + used;
            write_entry(block, bs, new_off, inode, rec_len - used, name, file_type);
            Ok(Some(offset + 4..new_off + need))
        }
    }
}

/// Remove the live entry named `name`: merged into the previous record when
/// there is one, else marked unused (inode 0), as the kernel does; the
/// removed record's bytes are wiped (all but a first record's `rec_len`),
/// as Linux does since 5.13, so deleted names do not linger on disk.
/// Returns the changed range and the inode the entry named, or `None` if
/// absent.
pub fn remove(
    block: &mut [u8],
    layout: DirBlockLayout,
    name: &[u8],
) -> Result<Option<(Range<usize>, u32)>> {
    let mut prev: Option<(usize, usize)> = None;
    let mut found = None;
    for e in iter(block, layout) {
        let e = e?;
        if e.inode != 0 && e.name == name {
            found = Some((e.offset, e.rec_len, e.inode));
            break;
        }
        prev = Some((e.offset, e.rec_len));
    }
    let Some((offset, rec_len, ino)) = found else {
        return Ok(None);
    };
    let bs = layout.block_size;
    match prev {
        Some((poff, plen)) => {
            put_u16(block, poff + 4, rec_len_to_disk(plen + rec_len, bs));
            block[offset..offset + rec_len].fill(0);
            Ok(Some((poff + 4..offset + rec_len, ino)))
        }
        None => {
            put_u32(block, offset, 0);
            block[offset + 6..offset + rec_len].fill(0);
            Ok(Some((offset..offset + rec_len, ino)))
        }
    }
}

/// Point the entry at `offset` to another inode and file type (rename over
/// an existing name). Returns the changed range.
pub fn set_entry_target(
    block: &mut [u8],
    offset: usize,
    inode: u32,
    file_type: u8,
) -> Range<usize> {
    put_u32(block, offset, inode);
    block[offset + 7] = file_type;
    offset..offset + DIRENT_HEADER
}

/// Initialize an empty leaf block: one unused record spanning the entry area,
/// and the tail when the layout has one. Returns the whole block range.
pub fn init_empty(block: &mut [u8], layout: DirBlockLayout) -> Range<usize> {
    block.fill(0);
    let end = layout.entries_end();
    put_u16(block, 4, rec_len_to_disk(end, layout.block_size));
    if layout.has_tail {
        init_tail(block);
    }
    0..layout.block_size
}

/// Initialize a directory's first block with "." and "..".
pub fn init_dot_dotdot(
    block: &mut [u8],
    layout: DirBlockLayout,
    self_ino: u32,
    parent_ino: u32,
    filetype: bool,
) -> Range<usize> {
    block.fill(0);
    let bs = layout.block_size;
    let t = if filetype { ft::DIR } else { 0 };
    write_entry(block, bs, 0, self_ino, 12, b".", t);
    write_entry(
        block,
        bs,
        12,
        parent_ino,
        layout.entries_end() - 12,
        b"..",
        t,
    );
    if layout.has_tail {
        init_tail(block);
    }
    0..bs
}

/// Write an empty checksum tail (checksum 0) in the last 12 bytes.
pub fn init_tail(block: &mut [u8]) {
    let t = block.len() - DIRENT_TAIL_SIZE;
    block[t..].fill(0);
    put_u16(block, t + 4, DIRENT_TAIL_SIZE as u16);
    block[t + 7] = DIRENT_TAIL_FT;
}

/// The tail is present and well formed.
pub fn has_valid_tail(block: &[u8]) -> bool {
    if block.len() < DIRENT_TAIL_SIZE {
        return false;
    }
    let t = block.len() - DIRENT_TAIL_SIZE;
    u32_at(block, t) == 0
        && u16_at(block, t + 4) == DIRENT_TAIL_SIZE as u16
        && block[t + 6] == 0
        && block[t + 7] == DIRENT_TAIL_FT
}

/// The checksum of a leaf block: crc32c(inode seed, bytes before the tail).
/// `inode_seed` is [`crate::csum::inode_csum_seed`] of the directory.
pub fn dirent_block_checksum(block: &[u8], inode_seed: u32) -> u32 {
    ext4_crc32c(
        inode_seed,
        &block[..block.len().saturating_sub(DIRENT_TAIL_SIZE)],
    )
}

/// Compute and store a leaf block's tail checksum. Returns the changed range.
pub fn set_dirent_tail_checksum(block: &mut [u8], inode_seed: u32) -> Range<usize> {
    let c = dirent_block_checksum(block, inode_seed);
    let at = block.len() - 4;
    put_u32(block, at, c);
    at..block.len()
}

/// Check a leaf block's tail and checksum.
pub fn verify_dirent_block(block: &[u8], inode_seed: u32) -> Result<()> {
    if !has_valid_tail(block) {
        return Err(bad(
            "directory block tail",
            "missing or malformed checksum tail",
        ));
    }
    let stored = u32_at(block, block.len() - 4);
    let want = dirent_block_checksum(block, inode_seed);
    if stored != want {
        return Err(bad(
            "directory block det_checksum",
            format!("stored {stored:#010x}, computed {want:#010x}"),
        ));
    }
    Ok(())
}

// ----- htree (dx) blocks -----

/// Offset of `dx_root_info` in the root block.
const DX_ROOT_INFO: usize = 0x18;
/// Offset of the count/limit header in the root block (after the 8-byte info).
const DX_ROOT_COUNTLIMIT: usize = 0x20;
/// Offset of the count/limit header in an interior node (after the fake entry header).
const DX_NODE_COUNTLIMIT: usize = 0x08;
/// Most levels of interior dx nodes below the root (`indirect_levels`)
/// without `large_dir` (a two-level tree)...
pub const DX_MAX_INDIRECT_LEVELS: u8 = 1;
/// ...and with `large_dir` (three levels). Decoding accepts up to this;
/// the caller compares with [`DX_MAX_INDIRECT_LEVELS`] when the file system
/// lacks `large_dir`.
pub const DX_MAX_INDIRECT_LEVELS_LARGE_DIR: u8 = 2;
/// Size of `struct dx_tail`.
pub const DX_TAIL_SIZE: usize = 8;

/// Which kind of dx block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DxKind {
    Root,
    Node,
}

/// A decoded htree index block (root or interior node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DxBlock {
    pub kind: DxKind,
    /// Root only: hash version (0 legacy, 1 half-md4, 2 tea, +3 unsigned).
    pub hash_version: u8,
    /// Root only: levels of interior nodes below the root (0 = leaves directly).
    pub indirect_levels: u8,
    /// Offset of the count/limit header.
    pub countlimit_offset: usize,
    pub limit: u16,
    pub count: u16,
    /// (hash, logical block) pairs; the first hash is implicitly 0.
    pub entries: Vec<(u32, u32)>,
}

/// Decode a dx root block (the directory's block 0 when `INDEX_FL` is set).
pub fn decode_dx_root(block: &[u8], has_csum: bool) -> Result<DxBlock> {
    let bs = block.len();
    if bs < 64 {
        return Err(bad("dx root", "block too small"));
    }
    let dot_len = rec_len_from_disk(u16_at(block, 4), bs);
    if dot_len != 12 || block[6] != 1 || block[8] != b'.' {
        return Err(bad("dx root \".\" entry", "not a 12-byte \".\" entry"));
    }
    let dd_len = rec_len_from_disk(u16_at(block, 16), bs);
    if dd_len != bs - 12 || block[18] != 2 || &block[20..22] != b".." {
        return Err(bad(
            "dx root \"..\" entry",
            format!("rec_len {dd_len}, expected {}", bs - 12),
        ));
    }
    let reserved_zero = u32_at(block, DX_ROOT_INFO);
    let hash_version = block[DX_ROOT_INFO + 4];
    let info_length = block[DX_ROOT_INFO + 5];
    let indirect_levels = block[DX_ROOT_INFO + 6];
    if reserved_zero != 0 || info_length != 8 {
        return Err(bad(
            "dx root info",
            format!("reserved {reserved_zero:#x}, info_length {info_length}"),
        ));
    }
    if hash_version > 5 {
        return Err(bad("dx root hash_version", format!("{hash_version}")));
    }
    if indirect_levels > DX_MAX_INDIRECT_LEVELS_LARGE_DIR {
        return Err(bad(
            "dx root indirect_levels",
            format!("{indirect_levels} (max {DX_MAX_INDIRECT_LEVELS_LARGE_DIR}, with large_dir)"),
        ));
    }
    let mut d = decode_countlimit(block, DX_ROOT_COUNTLIMIT, has_csum, DxKind::Root)?;
    d.hash_version = hash_version;
    d.indirect_levels = indirect_levels;
    Ok(d)
}

/// Decode a dx interior node (a block whose fake entry has inode 0 and
/// `rec_len` equal to the block size).
pub fn decode_dx_node(block: &[u8], has_csum: bool) -> Result<DxBlock> {
    let bs = block.len();
    if bs < 64 {
        return Err(bad("dx node", "block too small"));
    }
    if u32_at(block, 0) != 0 || rec_len_from_disk(u16_at(block, 4), bs) != bs || block[6] != 0 {
        return Err(bad("dx node fake entry", "not an empty whole-block entry"));
    }
    decode_countlimit(block, DX_NODE_COUNTLIMIT, has_csum, DxKind::Node)
}

/// Whether `block` looks like a dx interior node (cheap test, no validation).
pub fn looks_like_dx_node(block: &[u8]) -> bool {
    block.len() >= 64
        && u32_at(block, 0) == 0
        && rec_len_from_disk(u16_at(block, 4), block.len()) == block.len()
        && block[6] == 0
}

/// Whether `block` has the shape of a dx root (cheap test, no validation):
/// a 12-byte "." and a ".." whose record runs to the very end of the block.
/// Under `metadata_csum` no linear block has this shape (its records end at
/// the checksum tail), so it marks a root left over from an index; without
/// `metadata_csum` a linear block holding only "." and ".." has it too.
pub fn looks_like_dx_root(block: &[u8]) -> bool {
    let bs = block.len();
    bs >= 64
        && rec_len_from_disk(u16_at(block, 4), bs) == 12
        && block[6] == 1
        && block[8] == b'.'
        && rec_len_from_disk(u16_at(block, 16), bs) == bs - 12
        && block[18] == 2
        && &block[20..22] == b".."
}

fn max_dx_limit(bs: usize, cl_off: usize, has_csum: bool) -> usize {
    (bs - cl_off - if has_csum { DX_TAIL_SIZE } else { 0 }) / 8
}

fn decode_countlimit(block: &[u8], cl_off: usize, has_csum: bool, kind: DxKind) -> Result<DxBlock> {
    let bs = block.len();
    let limit = u16_at(block, cl_off);
    let count = u16_at(block, cl_off + 2);
    let max = max_dx_limit(bs, cl_off, has_csum);
    if usize::from(limit) != max {
        return Err(bad("dx limit", format!("{limit}, expected {max}")));
    }
    if count == 0 || count > limit {
        return Err(bad("dx count", format!("{count} with limit {limit}")));
    }
    let mut entries = Vec::with_capacity(usize::from(count));
    for i in 0..usize::from(count) {
        let o = cl_off + 8 * i;
        let hash = if i == 0 { 0 } else { u32_at(block, o) };
        entries.push((hash, u32_at(block, o + 4)));
    }
    Ok(DxBlock {
        kind,
        hash_version: 0,
        indirect_levels: 0,
        countlimit_offset: cl_off,
        limit,
        count,
        entries,
    })
}

/// Offset of a dx block's `dx_tail`, or an error when the block has no room
/// for one (it was decoded without `metadata_csum`, or is inconsistent).
fn dx_tail_offset(block: &[u8], d: &DxBlock) -> Result<usize> {
    let tail = d.countlimit_offset + 8 * usize::from(d.limit);
    let used = d.countlimit_offset + 8 * usize::from(d.count);
    if tail + DX_TAIL_SIZE > block.len() || used > tail {
        return Err(bad(
            "dx tail",
            format!(
                "no room for the checksum tail after {} entries in a {}-byte block",
                d.limit,
                block.len()
            ),
        ));
    }
    Ok(tail)
}

/// The checksum of a dx block: crc32c(inode seed, bytes up to the last used
/// entry, then the tail's reserved word and a zero checksum).
pub fn dx_checksum(block: &[u8], d: &DxBlock, inode_seed: u32) -> Result<u32> {
    let tail = dx_tail_offset(block, d)?;
    let size = d.countlimit_offset + 8 * usize::from(d.count);
    let mut c = ext4_crc32c(inode_seed, &block[..size]);
    c = ext4_crc32c(c, &block[tail..tail + 4]);
    Ok(ext4_crc32c(c, &[0; 4]))
}

/// Check a dx block's checksum.
pub fn verify_dx_checksum(block: &[u8], d: &DxBlock, inode_seed: u32) -> Result<()> {
    let tail = dx_tail_offset(block, d)?;
    let stored = u32_at(block, tail + 4);
    let want = dx_checksum(block, d, inode_seed)?;
    if stored != want {
        return Err(bad(
            "dx tail dt_checksum",
            format!("stored {stored:#010x}, computed {want:#010x}"),
        ));
    }
    Ok(())
}

/// Compute and store a dx block's checksum; returns the changed range.
/// `d` must have been decoded with `has_csum` (so the tail exists).
pub fn set_dx_checksum(block: &mut [u8], d: &DxBlock, inode_seed: u32) -> Range<usize> {
    let tail = dx_tail_offset(block, d).expect("dx block decoded with metadata_csum has a tail");
    let c = dx_checksum(block, d, inode_seed).expect("tail checked above");
    put_u32(block, tail + 4, c);
    tail + 4..tail + 8
}

/// Rewrite a dx block as a linear leaf when the directory's index is being
/// dropped: a root keeps "." and ".." (the ".." record absorbs the rest of
/// the block), an interior node becomes one empty record. The tail is
/// written when the layout has one (its checksum is the caller's job).
/// Returns the changed range (the whole block).
pub fn linearize_dx_block(block: &mut [u8], layout: DirBlockLayout, kind: DxKind) -> Range<usize> {
    let bs = layout.block_size;
    match kind {
        DxKind::Root => {
            let self_ino = u32_at(block, 0);
            let parent = u32_at(block, 12);
            let self_ft = block[7];
            let parent_ft = block[19];
            block.fill(0);
            write_entry(block, bs, 0, self_ino, 12, b".", self_ft);
            write_entry(
                block,
                bs,
                12,
                parent,
                layout.entries_end() - 12,
                b"..",
                parent_ft,
            );
            if layout.has_tail {
                init_tail(block);
            }
            0..bs
        }
        DxKind::Node => init_empty(block, layout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: DirBlockLayout = DirBlockLayout {
        block_size: 1024,
        has_tail: true,
    };

    fn names(block: &[u8], layout: DirBlockLayout) -> Vec<(Vec<u8>, u32)> {
        iter(block, layout)
            .map(|e| e.unwrap())
            .filter(|e| e.inode != 0)
            .map(|e| (e.name.to_vec(), e.inode))
            .collect()
    }

    #[test]
    fn insert_find_remove() {
        let mut b = vec![0u8; 1024];
        init_dot_dotdot(&mut b, L, 2, 2, true);
        validate_block(&b, L, None).unwrap();
        let r = insert(&mut b, L, 12, b"hello", ft::REG_FILE)
            .unwrap()
            .unwrap();
        assert_eq!(r, 16..24 + rec_len_for(5));
        insert(&mut b, L, 13, b"world", ft::DIR).unwrap().unwrap();
        validate_block(&b, L, Some(100)).unwrap();
        assert_eq!(
            names(&b, L),
            vec![
                (b".".to_vec(), 2),
                (b"..".to_vec(), 2),
                (b"hello".to_vec(), 12),
                (b"world".to_vec(), 13)
            ]
        );
        assert_eq!(find(&b, L, b"world").unwrap().unwrap().file_type, ft::DIR);
        let (r, ino) = remove(&mut b, L, b"hello").unwrap().unwrap();
        assert_eq!(ino, 12);
        assert_eq!(r, 16..24 + rec_len_for(5));
        assert!(
            b[24..24 + rec_len_for(5)].iter().all(|&x| x == 0),
            "name wiped"
        );
        assert!(find(&b, L, b"hello").unwrap().is_none());
        validate_block(&b, L, None).unwrap();
        // Reuse the freed space.
        insert(&mut b, L, 14, b"again", ft::REG_FILE)
            .unwrap()
            .unwrap();
        assert_eq!(find(&b, L, b"again").unwrap().unwrap().offset, 24);
        assert!(remove(&mut b, L, b"missing").unwrap().is_none());
    }

    #[test]
    fn block_fills_up() {
        let mut b = vec![0u8; 1024];
        init_empty(&mut b, L);
        let mut n = 0;
        while insert(&mut b, L, 100 + n, format!("file{n:04}").as_bytes(), 1)
            .unwrap()
            .is_some()
        {
            n += 1;
        }
        // 1012 bytes of entry area, 16 bytes per entry.
        assert_eq!(n, 63);
        validate_block(&b, L, None).unwrap();
        // Removing the first entry leaves an unused record at offset 0.
        let (r, _) = remove(&mut b, L, b"file0000").unwrap().unwrap();
        assert_eq!(r, 0..16);
        assert_eq!(&b[0..8], &[0, 0, 0, 0, 16, 0, 0, 0]);
        assert!(insert(&mut b, L, 7, b"x", 1).unwrap().is_some());
    }

    #[test]
    fn tail_checksum() {
        let mut b = vec![0u8; 1024];
        init_dot_dotdot(&mut b, L, 2, 2, true);
        set_dirent_tail_checksum(&mut b, 0x1234);
        verify_dirent_block(&b, 0x1234).unwrap();
        assert!(verify_dirent_block(&b, 0x1235).is_err());
        b[13] ^= 1;
        assert!(verify_dirent_block(&b, 0x1234).is_err());
    }

    #[test]
    fn corrupt_entries_are_errors() {
        let mut b = vec![0u8; 1024];
        init_dot_dotdot(&mut b, L, 2, 2, true);
        put_u16(&mut b, 16, 2000);
        assert_eq!(
            validate_block(&b, L, None).unwrap_err().field,
            "directory entry rec_len"
        );
        put_u16(&mut b, 16, 6);
        assert!(validate_block(&b, L, None).is_err());
        init_dot_dotdot(&mut b, L, 2, 2, true);
        b[18] = 255; // name_len beyond rec_len? rec_len is 1000, so fine; make rec_len small
        put_u16(&mut b, 16, 12);
        assert!(validate_block(&b, L, None).is_err());
        init_dot_dotdot(&mut b, L, 2, 500, true);
        assert!(validate_block(&b, L, Some(100)).is_err());
    }

    #[test]
    fn rec_len_64k() {
        assert_eq!(rec_len_to_disk(65536, 65536), 65535);
        assert_eq!(rec_len_from_disk(65535, 65536), 65536);
        assert_eq!(rec_len_from_disk(0, 65536), 65536);
        assert_eq!(
            rec_len_from_disk(rec_len_to_disk(65532, 65536), 65536),
            65532
        );
        assert_eq!(rec_len_to_disk(4096, 4096), 4096);
        let layout = DirBlockLayout {
            block_size: 65536,
            has_tail: false,
        };
        let mut b = vec![0u8; 65536];
        init_empty(&mut b, layout);
        assert_eq!(u16_at(&b, 4), 65535);
        insert(&mut b, layout, 5, b"a", 1).unwrap().unwrap();
        validate_block(&b, layout, None).unwrap();
    }

    fn make_dx_root(bs: usize, csum: bool) -> Vec<u8> {
        let mut b = vec![0u8; bs];
        let layout = DirBlockLayout {
            block_size: bs,
            has_tail: false,
        };
        init_dot_dotdot(&mut b, layout, 2, 2, true);
        b[DX_ROOT_INFO + 4] = 1;
        b[DX_ROOT_INFO + 5] = 8;
        let limit = max_dx_limit(bs, DX_ROOT_COUNTLIMIT, csum) as u16;
        put_u16(&mut b, DX_ROOT_COUNTLIMIT, limit);
        put_u16(&mut b, DX_ROOT_COUNTLIMIT + 2, 2);
        put_u32(&mut b, DX_ROOT_COUNTLIMIT + 4, 1);
        put_u32(&mut b, DX_ROOT_COUNTLIMIT + 8, 0x8000_0000);
        put_u32(&mut b, DX_ROOT_COUNTLIMIT + 12, 2);
        b
    }

    #[test]
    fn dx_root_decode_checksum_and_linearize() {
        let mut b = make_dx_root(4096, true);
        let d = decode_dx_root(&b, true).unwrap();
        assert_eq!(d.entries, vec![(0, 1), (0x8000_0000, 2)]);
        assert_eq!(d.limit, 507);
        set_dx_checksum(&mut b, &d, 99);
        verify_dx_checksum(&b, &d, 99).unwrap();
        b[DX_ROOT_COUNTLIMIT + 12] ^= 1;
        assert!(verify_dx_checksum(&b, &d, 99).is_err());
        assert!(
            decode_dx_root(&b, false).is_err(),
            "limit must match the csum layout"
        );
        let layout = DirBlockLayout {
            block_size: 4096,
            has_tail: true,
        };
        linearize_dx_block(&mut b, layout, DxKind::Root);
        validate_block(&b, layout, None).unwrap();
        assert_eq!(names(&b, layout).len(), 2);
    }

    #[test]
    fn dx_checksum_without_a_tail_is_an_error() {
        // Decoded without metadata_csum, the entries fill the block: asking
        // for its checksum must fail, not read past the end (found by fuzzing).
        let b = make_dx_root(1024, false);
        let d = decode_dx_root(&b, false).unwrap();
        assert_eq!(verify_dx_checksum(&b, &d, 1).unwrap_err().field, "dx tail");
        assert!(dx_checksum(&b, &d, 1).is_err());
    }

    #[test]
    fn dx_root_shape() {
        let b = make_dx_root(4096, true);
        assert!(looks_like_dx_root(&b));
        let mut lin = vec![0u8; 4096];
        init_dot_dotdot(&mut lin, L4K_TAIL, 2, 2, true);
        assert!(!looks_like_dx_root(&lin), "a linear root ends at the tail");
        let mut n = vec![0u8; 4096];
        init_empty(&mut n, L4K_TAIL);
        assert!(!looks_like_dx_root(&n));
    }

    const L4K_TAIL: DirBlockLayout = DirBlockLayout {
        block_size: 4096,
        has_tail: true,
    };

    #[test]
    fn dx_node_recognition() {
        let mut b = vec![0u8; 4096];
        put_u16(&mut b, 4, 4096);
        put_u16(
            &mut b,
            DX_NODE_COUNTLIMIT,
            max_dx_limit(4096, 8, false) as u16,
        );
        put_u16(&mut b, DX_NODE_COUNTLIMIT + 2, 1);
        assert!(looks_like_dx_node(&b));
        let d = decode_dx_node(&b, false).unwrap();
        assert_eq!(d.kind, DxKind::Node);
        assert_eq!(d.limit, 511);
    }
}
