//! Directories: linear ext4 directory blocks, an in-memory name index, and
//! the one-time conversion of hashed (htree) directories to linear ones.
//!
//! On disk a directory is a sequence of blocks of variable-length entries
//! (`inode`, `rec_len`, `name_len`, `file_type`, name), each block closed by
//! a 12-byte checksum tail under `metadata_csum`. Adding an entry takes the
//! slack of an existing entry (splitting its `rec_len`) or a new block;
//! removing one merges it into its predecessor's `rec_len` (or zeroes the
//! inode of a block's first entry), exactly as ext4 does, so entries never
//! move and readdir cookies (the entry's byte position in the directory,
//! plus one) stay valid across changes.
//!
//! Lookups must not be O(n): on first access a directory's blocks are read
//! once into a `HashMap` from name to position, kept up to date by every
//! add and remove, together with where each block has room ([`Room`]): an
//! add that can only go after a block's last entry does not walk it.
//!
//! Indexed (htree) directories made by the kernel are read by scanning their
//! leaf blocks (the dx root's `.`/`..` parse as ordinary entries, dx nodes
//! as one empty entry). Before the first change ordo clears the index flag
//! and rewrites the root and node blocks as valid empty linear blocks: a
//! linear directory is valid ext4, and the kernel re-indexes it if it likes.

use std::collections::HashMap;

use ordo_dev::BlockClass;

use crate::error::{errno, FsError, Result};
use crate::extent;
use crate::layout::{dirent as de, ino as io, le16, le32, put16, put32};
use crate::state::{Core, Owner};
use crate::types::FileType;
use crate::update::{Ino, LinkOp, UpdateKind};
use ordo_format::dir as fdir;

/// Where one name lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub lblk: u32,
    pub off: u16,
    pub ino: Ino,
    pub ft: u8,
}

/// What one indexed name costs in memory, counted generously: the key (a
/// vector and a short name), the slot, and the hash table's share.
pub(crate) const DIR_NAME_BYTES: u64 = 96;

/// How many names the directory indexes may hold with a buffer cache of
/// `cache_bytes`: a quarter of the cache's bound again (at least 4,096
/// names), so that walking a tree of millions of names keeps the mount
/// within the configured cache plus this.
pub(crate) fn dir_names_bound(cache_bytes: u64) -> usize {
    usize::try_from((cache_bytes / 4 / DIR_NAME_BYTES).max(4096)).unwrap_or(usize::MAX)
}

/// The in-memory index of one directory.
#[derive(Default)]
pub(crate) struct DirIndex {
    pub names: HashMap<Vec<u8>, Slot>,
    /// When the index was last used ([`Core::dir_index`]), for eviction.
    pub last_use: u64,
    /// Physical block of each logical block (0: hole).
    pub pblks: Vec<u64>,
    /// Where each block has room for a new entry.
    pub room: Vec<Room>,
}

/// Where a directory block has room for a new entry, kept with the index
/// so that a create need not walk its block. Entries are appended, so a
/// new name usually goes into the slack of the block's last entry: when no
/// other entry has room for it (`before_last`), the last entry is the only
/// candidate, and the first fit a walk would find is that entry, at `last`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Room {
    /// The largest record length a new entry could take in the block.
    pub most: u16,
    /// The same, over every entry but the last.
    pub before_last: u16,
    /// The offset of the block's last entry.
    pub last: u16,
}

/// One parsed entry.
#[derive(Clone, Debug)]
pub(crate) struct RawEntry {
    pub off: usize,
    pub ino: Ino,
    pub name: Vec<u8>,
    pub ft: u8,
}

pub(crate) fn ft_of(kind: FileType) -> u8 {
    match kind {
        FileType::Regular => de::FT_REG,
        FileType::Directory => de::FT_DIR,
        FileType::Symlink => de::FT_SYMLINK,
        FileType::CharDevice => de::FT_CHR,
        FileType::BlockDevice => de::FT_BLK,
        FileType::Fifo => de::FT_FIFO,
        FileType::Socket => de::FT_SOCK,
    }
}

pub(crate) fn kind_of_ft(ft: u8) -> Option<FileType> {
    Some(match ft {
        de::FT_REG => FileType::Regular,
        de::FT_DIR => FileType::Directory,
        de::FT_SYMLINK => FileType::Symlink,
        de::FT_CHR => FileType::CharDevice,
        de::FT_BLK => FileType::BlockDevice,
        de::FT_FIFO => FileType::Fifo,
        de::FT_SOCK => FileType::Socket,
        _ => return None,
    })
}

/// Whether `img` ends with a directory checksum tail.
pub(crate) fn has_tail(img: &[u8]) -> bool {
    let n = img.len();
    le32(img, n - 12) == 0 && le16(img, n - 8) == 12 && img[n - 6] == 0 && img[n - 5] == de::TAIL_FT
}

/// One entry's framing, as [`dirents`] walks a block without copying.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dirent {
    pub off: usize,
    pub ino: Ino,
    pub rec_len: usize,
    pub name_len: usize,
    pub ft: u8,
}

impl Dirent {
    /// The entry's name within the block image it was read from.
    pub fn name<'a>(&self, img: &'a [u8]) -> &'a [u8] {
        &img[self.off + 8..self.off + 8 + self.name_len]
    }
    /// The largest record length a new entry could take from this one.
    fn room(&self) -> usize {
        if self.ino == 0 {
            self.rec_len
        } else {
            self.rec_len - de::rec_len_for(self.name_len)
        }
    }
}

/// Walk the entries of a directory block, validating their framing; the
/// walk ends at the first malformed entry, with its error. Allocates
/// nothing: a create walks its block twice (the slot, then the room left),
/// and copying every name of a full block each time was most of the
/// allocator's work in a create.
pub(crate) fn dirents(
    img: &[u8],
    block: u64,
    dir: Ino,
) -> impl Iterator<Item = Result<Dirent>> + '_ {
    let end = walk_end(img);
    let mut off = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || off >= img.len() || Some(off) == end {
            return None;
        }
        match frame_at(img, off) {
            Ok(e) => {
                off += e.rec_len;
                Some(Ok(e))
            }
            Err(()) => {
                failed = true;
                Some(Err(bad_frame(img, block, dir, off)))
            }
        }
    })
}

/// [`dirents`] as an internal walk: `f` sees each entry in turn, and the
/// walk returns the first malformed entry's error (after `f` has seen the
/// entries before it). A create walks its whole block through this: the
/// loop carries no `Option<Result<_>>` per entry, which made the framing
/// checks of a 255-entry block some 18,000 instructions.
pub(crate) fn for_each_dirent(
    img: &[u8],
    block: u64,
    dir: Ino,
    mut f: impl FnMut(Dirent),
) -> Result<()> {
    let end = walk_end(img);
    let mut off = 0usize;
    while off < img.len() && Some(off) != end {
        match frame_at(img, off) {
            Ok(e) => {
                off += e.rec_len;
                f(e);
            }
            Err(()) => return Err(bad_frame(img, block, dir, off)),
        }
    }
    Ok(())
}

/// Where a walk of a block's entries stops early: at the checksum tail when
/// there is one (a dx root's `..`, whose dx tail is no dirent tail, spans
/// the whole block).
fn walk_end(img: &[u8]) -> Option<usize> {
    has_tail(img).then(|| img.len() - de::TAIL_LEN)
}

/// The entry framed at `off`, if its header fits the block, its record
/// length is a multiple of 4 of at least 8 within the block, and its name
/// fits the record.
#[inline(always)]
fn frame_at(img: &[u8], off: usize) -> std::result::Result<Dirent, ()> {
    let limit = img.len();
    let Some(h) = img.get(off..off + 8) else {
        return Err(());
    };
    let ino = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let rec_len = u16::from_le_bytes([h[4], h[5]]) as usize;
    let name_len = h[6] as usize;
    if rec_len < 8 || !rec_len.is_multiple_of(4) || off + rec_len > limit || 8 + name_len > rec_len
    {
        return Err(());
    }
    Ok(Dirent {
        off,
        ino,
        rec_len,
        name_len,
        ft: h[7],
    })
}

/// The error for the malformed entry at `off` (one [`frame_at`] refused).
#[cold]
fn bad_frame(img: &[u8], block: u64, dir: Ino, off: usize) -> FsError {
    let limit = img.len();
    if off + 8 > limit {
        return FsError::corrupt(
            block,
            format!("directory {dir} entry at {off} rec_len"),
            "entry header crosses the end of the block",
        );
    }
    let rec_len = le16(img, off + 4) as usize;
    let name_len = img[off + 6] as usize;
    FsError::corrupt(
        block,
        format!("directory {dir} entry at {off} rec_len"),
        format!("rec_len {rec_len} with name_len {name_len} at offset {off} (limit {limit})"),
    )
}

/// Parse the entries of a directory block (validating their framing), with
/// their names copied out.
pub(crate) fn parse_block(img: &[u8], block: u64, dir: Ino) -> Result<Vec<RawEntry>> {
    dirents(img, block, dir)
        .map(|e| {
            e.map(|e| RawEntry {
                off: e.off,
                ino: e.ino,
                name: e.name(img).to_vec(),
                ft: e.ft,
            })
        })
        .collect()
}

/// Where a directory block has room (its framing validated).
fn block_room(img: &[u8], block: u64, dir: Ino) -> Result<Room> {
    let mut r = Room::default();
    for_each_dirent(img, block, dir, |e| {
        r.before_last = r.most;
        r.most = r.most.max(e.room() as u16);
        r.last = e.off as u16;
    })?;
    Ok(r)
}

/// The extent store of an inode, over the core.
pub(crate) struct InodeTree<'a> {
    pub core: &'a mut Core,
    pub ino: Ino,
    pub generation: u32,
}

/// What [`Core::dir_slot`] found in a directory block.
enum SlotSearch {
    /// The bytes to write at an offset, the new entry's offset, and where
    /// the block has room once they are written.
    Found((usize, Vec<u8>, usize, Room)),
    /// Room, all of it held back by the protocol's reuse rules.
    Refused,
    /// No room.
    NoRoom,
}

fn no_room(p: u64, dir: Ino) -> FsError {
    FsError::corrupt(
        p,
        format!("directory {dir} free-space index"),
        "no room where the index said there was",
    )
}

/// The bytes that put entry `name -> ino` into the room of entry `e` of
/// block image `img`, the offset to write them at, the new entry's offset
/// and the room it leaves: a free record is taken whole, a live one is
/// split after its name.
fn place(img: &[u8], e: Dirent, name: &[u8], ino: Ino, ft: u8) -> (usize, Vec<u8>, usize, usize) {
    let need = de::rec_len_for(name.len());
    if e.ino == 0 {
        let mut bytes = vec![0u8; 8 + name.len()];
        put32(&mut bytes, 0, ino);
        put16(&mut bytes, 4, e.rec_len as u16);
        bytes[6] = name.len() as u8;
        bytes[7] = ft;
        bytes[8..].copy_from_slice(name);
        (e.off, bytes, e.off, e.rec_len - need)
    } else {
        let used = de::rec_len_for(e.name_len);
        let new_off = e.off + used;
        let mut bytes = vec![0u8; used + 8 + name.len()];
        bytes[..used].copy_from_slice(&img[e.off..e.off + used]);
        put16(&mut bytes, 4, used as u16);
        put32(&mut bytes, used, ino);
        put16(&mut bytes, used + 4, (e.rec_len - used) as u16);
        bytes[used + 6] = name.len() as u8;
        bytes[used + 7] = ft;
        bytes[used + 8..].copy_from_slice(name);
        // The entry split keeps no room; the new one has the rest.
        (e.off, bytes, new_off, e.rec_len - used - need)
    }
}

impl Core {
    /// An extent store over inode `ino`.
    pub fn tree(&mut self, ino: Ino) -> Result<InodeTree<'_>> {
        let (generation, extents) = self.inode_tree_head(ino)?;
        if !extents {
            return Err(FsError::Unsupported(format!(
                "inode {ino} maps its blocks without extents (ext2/3 block maps)"
            )));
        }
        Ok(InodeTree {
            core: self,
            ino,
            generation,
        })
    }

    /// Build (once) and return the index of directory `dir`.
    pub fn dir_index(&mut self, dir: Ino) -> Result<&mut DirIndex> {
        if !self.dirs.contains_key(&dir) {
            let idx = self.build_dir_index(dir)?;
            self.dir_names += idx.names.len();
            self.dirs.insert(dir, idx);
        }
        self.dir_uses += 1;
        let uses = self.dir_uses;
        let idx = self.dirs.get_mut(&dir).expect("just inserted");
        idx.last_use = uses;
        Ok(idx)
    }

    /// Drop the index of `dir` (it is rebuilt from the directory's blocks
    /// when next used).
    pub fn drop_dir_index(&mut self, dir: Ino) {
        if let Some(idx) = self.dirs.remove(&dir) {
            self.dir_names -= idx.names.len();
        }
    }

    /// Keep the directory indexes within their bound: past it, drop the
    /// least recently used until a quarter of the bound is free. Only
    /// between operations: an index is a cache of the directory's blocks
    /// (dirty ones included, as the buffer cache holds them), so dropping
    /// one loses nothing.
    pub fn bound_dir_indexes(&mut self) {
        assert!(
            !self.in_handle,
            "directory indexes are trimmed between operations only"
        );
        if self.dir_names <= self.dir_names_bound {
            return;
        }
        debug_assert_eq!(
            self.dir_names,
            self.dirs.values().map(|d| d.names.len()).sum::<usize>(),
            "the count of indexed names drifted from the indexes"
        );
        let target = self.dir_names_bound - self.dir_names_bound / 4;
        let mut by_age: Vec<(u64, Ino)> = self.dirs.iter().map(|(&d, i)| (i.last_use, d)).collect();
        by_age.sort_unstable();
        for (_, d) in by_age {
            if self.dir_names <= target {
                break;
            }
            self.drop_dir_index(d);
            self.dir_index_evictions += 1;
        }
    }

    fn build_dir_index(&mut self, dir: Ino) -> Result<DirIndex> {
        let i = self.read_inode(dir)?;
        if !i.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let nblocks = i.size.div_ceil(self.bs as u64);
        if nblocks > u32::MAX as u64 {
            return Err(FsError::corrupt(
                0,
                format!("directory {dir} i_size"),
                "too large",
            ));
        }
        let mut pblks = vec![0u64; nblocks as usize];
        {
            let mut t = self.tree(dir)?;
            for m in extent::extents(&mut t, 0..nblocks)? {
                for k in 0..m.len {
                    let l = (m.lblk + k) as usize;
                    if l < pblks.len() && !m.unwritten {
                        pblks[l] = m.pblk + k as u64;
                    }
                }
            }
        }
        let indexed = i.flags & io::FL_INDEX != 0;
        let mut idx = DirIndex {
            names: HashMap::new(),
            pblks: pblks.clone(),
            room: vec![Room::default(); nblocks as usize],
            last_use: 0,
        };
        for (l, &p) in pblks.iter().enumerate() {
            if p == 0 {
                continue;
            }
            let img = self.read_block(p, BlockClass::Directory)?;
            self.seal.owners.insert(
                p,
                Owner::Dir {
                    ino: dir,
                    generation: i.generation,
                },
            );
            let is_node = indexed && l > 0 && le32(&img, 0) == 0 && le16(&img, 4) as u32 == self.bs;
            if indexed && (l == 0 || is_node) {
                // Lookups scan the leaves, yet a damaged index must still be
                // reported as what it is (the kernel refuses the directory).
                self.check_dx_block(dir, i.generation, l, p, &img)?;
            }
            if is_node {
                continue;
            }
            if self.seal.csum && has_tail(&img) && !(indexed && l == 0) && !self.cache.is_dirty(p) {
                let want = self.seal.dir_csum(dir, i.generation, &img);
                let n = img.len();
                if le32(&img, n - 4) != want {
                    return Err(FsError::corrupt(
                        p,
                        format!("directory {dir} block {l} checksum"),
                        format!("stored {:#010x}, computed {want:#010x}", le32(&img, n - 4)),
                    ));
                }
            }
            let entries = parse_block(&img, p, dir)?;
            if !(indexed && l == 0) {
                idx.room[l] = block_room(&img, p, dir)?;
            }
            for e in entries {
                if e.ino != 0 {
                    if e.ino > self.sbi.inodes_count {
                        return Err(FsError::corrupt(
                            p,
                            format!(
                                "directory {dir} entry {:?} inode",
                                String::from_utf8_lossy(&e.name)
                            ),
                            format!("{} beyond s_inodes_count", e.ino),
                        ));
                    }
                    idx.names.insert(
                        e.name.clone(),
                        Slot {
                            lblk: l as u32,
                            off: e.off as u16,
                            ino: e.ino,
                            ft: e.ft,
                        },
                    );
                }
            }
        }
        Ok(idx)
    }

    /// Look `name` up in `dir`.
    pub fn dir_lookup(&mut self, dir: Ino, name: &[u8]) -> Result<Option<Slot>> {
        Ok(self.dir_index(dir)?.names.get(name).copied())
    }

    /// Number of entries (including `.` and `..`).
    pub fn dir_entry_count(&mut self, dir: Ino) -> Result<usize> {
        Ok(self.dir_index(dir)?.names.len())
    }

    /// The leaf-block image limit (end of entries) for a new block.
    fn dir_limit(&self) -> usize {
        if self.seal.csum {
            self.bs as usize - de::TAIL_LEN
        } else {
            self.bs as usize
        }
    }

    /// An empty leaf block image (one unused entry spanning it, plus tail).
    pub(crate) fn empty_dir_block(&self) -> Vec<u8> {
        let mut img = vec![0u8; self.bs as usize];
        put16(&mut img, 4, self.dir_limit() as u16);
        if self.seal.csum {
            self.put_tail(&mut img);
        }
        img
    }

    fn put_tail(&self, img: &mut [u8]) {
        let n = img.len();
        put32(img, n - 12, 0);
        put16(img, n - 8, 12);
        img[n - 6] = 0;
        img[n - 5] = de::TAIL_FT;
    }

    /// The first block of a new directory: `.` and `..`.
    pub fn new_dir_block(&self, dir: Ino, parent: Ino) -> Vec<u8> {
        let mut img = vec![0u8; self.bs as usize];
        put32(&mut img, 0, dir);
        put16(&mut img, 4, 12);
        img[6] = 1;
        img[7] = de::FT_DIR;
        img[8] = b'.';
        put32(&mut img, 12, parent);
        put16(&mut img, 16, (self.dir_limit() - 12) as u16);
        img[18] = 2;
        img[19] = de::FT_DIR;
        img[20] = b'.';
        img[21] = b'.';
        if self.seal.csum {
            self.put_tail(&mut img);
        }
        img
    }

    /// Give directory `dir`, which maps no block yet, its first block
    /// (`.` and `..` naming `parent`), as mkdir does: allocated near the
    /// inode, mapped at 0, counted in `i_blocks`, `i_size` one block.
    pub fn dir_make_first_block(&mut self, dir: Ino, parent: Ino) -> Result<u64> {
        let i = self.read_inode(dir)?;
        let (blk, _) = self.alloc_blocks(self.inode_goal(dir), 1)?;
        self.seal.owners.insert(
            blk,
            Owner::Dir {
                ino: dir,
                generation: i.generation,
            },
        );
        let img = self.new_dir_block(dir, parent);
        self.init_block(
            blk,
            BlockClass::Directory,
            &img,
            UpdateKind::DirBlockInit { dir },
        );
        self.csum_dir_block(blk);
        extent::insert(&mut self.tree(dir)?, 0, blk, 1, false)?;
        self.add_iblocks(dir, 1)?;
        self.set_size(dir, self.bs as u64);
        self.drop_dir_index(dir);
        Ok(blk)
    }

    /// Make `dir` linear from any mix of indexed and already converted
    /// blocks: clear `EXT4_INDEX_FL` and rewrite every block shaped like a
    /// dx root (block 0) or node as an empty linear block (the root keeps
    /// `.` and `..`). Unlike the conversion of a directory's first change,
    /// which expects an intact index, it is idempotent whatever part of an
    /// earlier conversion reached the disk: under `metadata_csum` no
    /// linear block has a dx block's shape (a dx block's records run to
    /// the block's end, where a linear block has its checksum tail), and
    /// without it a dx block with the flag clear already is a valid linear
    /// block. (Fast-commit replay that writes home directly relies on it.)
    pub fn dir_linearize(&mut self, dir: Ino) -> Result<()> {
        let i = self.read_inode(dir)?;
        let indexed = i.flags & io::FL_INDEX != 0;
        let csum = self.seal.csum;
        if !indexed && !csum {
            return Ok(());
        }
        if indexed {
            self.set_flags(dir, i.flags & !io::FL_INDEX);
        }
        let layout = fdir::DirBlockLayout {
            block_size: self.bs as usize,
            has_tail: csum,
        };
        let maps = extent::extents(&mut self.tree(dir)?, 0..extent::LBLK_END)?;
        for m in maps {
            for k in 0..m.len {
                let (l, p) = (m.lblk + k, m.pblk + k as u64);
                let img = self.read_block(p, BlockClass::Directory)?;
                let kind = if l == 0 && fdir::looks_like_dx_root(&img) {
                    fdir::DxKind::Root
                } else if l > 0 && fdir::looks_like_dx_node(&img) {
                    fdir::DxKind::Node
                } else {
                    continue;
                };
                let mut new = img.to_vec();
                drop(img);
                fdir::linearize_dx_block(&mut new, layout, kind);
                let owner = Owner::Dir {
                    ino: dir,
                    generation: i.generation,
                };
                self.seal.owners.insert(p, owner);
                self.modify(p, 0, &new, UpdateKind::DirBlockInit { dir });
                self.csum_dir_block(p);
            }
        }
        self.drop_dir_index(dir);
        Ok(())
    }

    /// Validate an htree root (`lblk` 0) or interior node of `dir`: its
    /// structure, and its `dx_tail` checksum when the block is as on disk.
    fn check_dx_block(
        &self,
        dir: Ino,
        generation: u32,
        lblk: usize,
        pblk: u64,
        img: &[u8],
    ) -> Result<()> {
        let csum = self.seal.csum;
        let what = if lblk == 0 {
            "htree root"
        } else {
            "htree node"
        };
        let located = |e: ordo_format::FormatError| {
            FsError::corrupt(
                pblk,
                format!("directory {dir} {what} (block {lblk}) {}", e.field),
                e.detail,
            )
        };
        let d = if lblk == 0 {
            fdir::decode_dx_root(img, csum)
        } else {
            fdir::decode_dx_node(img, csum)
        }
        .map_err(located)?;
        let large_dir = self
            .sbi
            .features
            .has_incompat(ordo_format::features::incompat::LARGEDIR);
        if lblk == 0 && d.indirect_levels > fdir::DX_MAX_INDIRECT_LEVELS && !large_dir {
            return Err(FsError::corrupt(
                pblk,
                format!("directory {dir} htree root (block 0) dx_root indirect_levels"),
                format!("{} without large_dir", d.indirect_levels),
            ));
        }
        if csum && !self.cache.is_dirty(pblk) {
            fdir::verify_dx_checksum(img, &d, self.seal.ino_seed(dir, generation))
                .map_err(located)?;
        }
        Ok(())
    }

    /// Turn an indexed directory into a linear one (before its first change).
    fn dir_unindex(&mut self, dir: Ino) -> Result<()> {
        let i = self.read_inode(dir)?;
        if i.flags & io::FL_INDEX == 0 {
            return Ok(());
        }
        let pblks = self.dir_index(dir)?.pblks.clone();
        let bs = self.bs as usize;
        // The flag goes first: an unindexed dx root reads as a valid linear
        // block, a linear block under the index flag does not.
        self.set_flags(dir, i.flags & !io::FL_INDEX);
        for (l, &p) in pblks.iter().enumerate() {
            if p == 0 {
                continue;
            }
            let img = self.read_block(p, BlockClass::Directory)?;
            let new = if l == 0 {
                // Keep `.` and `..`; `..` now spans the rest of the block.
                let dot_len = le16(&img, 4) as usize;
                if dot_len != 12 || le16(&img, 12 + 4) as usize + 12 != bs {
                    return Err(FsError::corrupt(
                        p,
                        format!("directory {dir} dx root"),
                        "`.`/`..` entries are not where the dx root keeps them",
                    ));
                }
                let mut n = img.to_vec();
                put16(&mut n, 16, (self.dir_limit() - 12) as u16);
                if self.seal.csum {
                    self.put_tail(&mut n);
                }
                Some(n)
            } else if le32(&img, 0) == 0 && le16(&img, 4) as usize == bs {
                Some(self.empty_dir_block())
            } else {
                None
            };
            drop(img);
            if let Some(n) = new {
                self.modify(p, 0, &n, UpdateKind::DirBlockInit { dir });
                self.csum_dir_block(p);
                let r = block_room(&n, p, dir)?;
                self.dir_index(dir)?.room[l] = r;
            }
        }
        Ok(())
    }

    /// Add entry `name -> ino` to `dir` (the caller checked it is absent).
    pub fn dir_add(&mut self, dir: Ino, name: &[u8], ino: Ino, kind: FileType) -> Result<()> {
        if name != b"." && name != b".." {
            self.backlink_add(ino, dir)?;
        }
        self.dir_unindex(dir)?;
        let need = de::rec_len_for(name.len());
        let ft = if self.sbi.has_filetype() {
            ft_of(kind)
        } else {
            0
        };
        // The first block with room whose room the protocol lets this
        // handle reuse (streams hold another stream's freed space), else a
        // new block.
        let candidates: Vec<(u32, Room)> = {
            let idx = self.dir_index(dir)?;
            idx.room
                .iter()
                .enumerate()
                .filter(|(l, r)| r.most as usize >= need && idx.pblks[*l] != 0)
                .map(|(l, r)| (l as u32, *r))
                .collect()
        };
        let mut done = None;
        let mut lblk = 0;
        for (l, room) in candidates {
            let p = self.dir_index(dir)?.pblks[l as usize];
            let found = match self.dir_slot_last(p, room, name, ino, ft)? {
                Some(found) => found,
                None => self.dir_slot(dir, p, name, ino, ft, true)?,
            };
            match found {
                SlotSearch::Found(d) => {
                    done = Some(d);
                    lblk = l;
                    break;
                }
                SlotSearch::Refused => {}
                SlotSearch::NoRoom => return Err(no_room(p, dir)),
            }
        }
        let (at, bytes, new_off, room) = match done {
            Some(d) => d,
            None => {
                lblk = self.dir_append_block(dir)?;
                let p = self.dir_index(dir)?.pblks[lblk as usize];
                match self.dir_slot(dir, p, name, ino, ft, false)? {
                    SlotSearch::Found(d) => d,
                    _ => return Err(no_room(p, dir)),
                }
            }
        };
        let p = self.dir_index(dir)?.pblks[lblk as usize];
        self.modify(
            p,
            at,
            &bytes,
            UpdateKind::Dirent {
                dir,
                name: name.to_vec(),
                ino,
                op: LinkOp::Add,
            },
        );
        self.csum_dir_block(p);
        self.touch_inode(dir);
        debug_assert_eq!(
            Some(room),
            block_room(&self.cache.snapshot(p).expect("cached"), p, dir).ok(),
            "room left in directory block {p}"
        );
        let idx = self.dir_index(dir)?;
        idx.room[lblk as usize] = room;
        let added = idx.names.insert(
            name.to_vec(),
            Slot {
                lblk,
                off: new_off as u16,
                ino,
                ft,
            },
        );
        if added.is_none() {
            self.dir_names += 1;
        }
        Ok(())
    }

    /// [`Core::dir_slot`] without walking the block, when the index says
    /// that only the block's last entry can take the new one: that entry
    /// is framed, checked to end the block's entries, and split (or, free,
    /// taken whole). `None` when the index does not settle it, and the
    /// block is walked.
    fn dir_slot_last(
        &mut self,
        p: u64,
        room: Room,
        name: &[u8],
        ino: Ino,
        ft: u8,
    ) -> Result<Option<SlotSearch>> {
        let need = de::rec_len_for(name.len());
        if room.before_last as usize >= need {
            return Ok(None);
        }
        let img = self.read_block(p, BlockClass::Directory)?;
        let off = room.last as usize;
        let Ok(e) = frame_at(&img, off) else {
            return Ok(None);
        };
        let end = walk_end(&img).unwrap_or(img.len());
        if e.off + e.rec_len != end || e.room() < need {
            return Ok(None);
        }
        if !self
            .proto
            .can_reuse_dir_space(p, e.off..e.off + e.rec_len, &self.handle)
        {
            return Ok(Some(SlotSearch::Refused));
        }
        let (at, bytes, new_off, left) = place(&img, e, name, ino, ft);
        // The entries before the last keep their room; a split last entry
        // keeps none, and the new one is last.
        let room = Room {
            most: room.before_last.max(left as u16),
            before_last: room.before_last,
            last: new_off as u16,
        };
        Ok(Some(SlotSearch::Found((at, bytes, new_off, room))))
    }

    /// Where in directory block `p` a new entry `name` goes: the bytes to
    /// write at an offset, the new entry's offset and where the block has
    /// room with it (what [`block_room`] would find after the write,
    /// counted on this one walk); else whether some
    /// entry had room the protocol does not let this handle reuse (asked
    /// only with `ask`: [`crate::protocol::Protocol::can_reuse_dir_space`]).
    fn dir_slot(
        &mut self,
        dir: Ino,
        p: u64,
        name: &[u8],
        ino: Ino,
        ft: u8,
        ask: bool,
    ) -> Result<SlotSearch> {
        let need = de::rec_len_for(name.len());
        let mut refused = false;
        let img = self.read_block(p, BlockClass::Directory)?;
        // The whole block's framing is validated before any slot in it is
        // used; the first slot with room is the one taken.
        let mut found: Option<Dirent> = None;
        // The most room among the entries the new one leaves as they are,
        // and the same without the last entry.
        let mut others = 0;
        let mut others_before = 0;
        let mut last: Option<Dirent> = None;
        let this = &*self;
        let may = |e: &Dirent| {
            !ask || this
                .proto
                .can_reuse_dir_space(p, e.off..e.off + e.rec_len, &this.handle)
        };
        for_each_dirent(&img, p, dir, |e| {
            last = Some(e);
            others_before = others;
            if found.is_none() {
                // A free record it fits in whole, or a live entry's slack
                // that the new one takes by splitting the record.
                if e.room() >= need {
                    if may(&e) {
                        found = Some(e);
                        return;
                    }
                    refused = true;
                }
            }
            others = others.max(e.room());
        })?;
        if let (Some(e), Some(last)) = (found, last) {
            let (at, bytes, new_off, left) = place(&img, e, name, ino, ft);
            let room = if e.off == last.off {
                // The new entry, or the record it filled, is last.
                Room {
                    most: others.max(left) as u16,
                    before_last: others as u16,
                    last: new_off as u16,
                }
            } else {
                let before_last = others_before.max(left);
                Room {
                    most: before_last.max(last.room()) as u16,
                    before_last: before_last as u16,
                    last: last.off as u16,
                }
            };
            return Ok(SlotSearch::Found((at, bytes, new_off, room)));
        }
        Ok(if refused {
            SlotSearch::Refused
        } else {
            SlotSearch::NoRoom
        })
    }

    /// Append an empty block to `dir`; returns its logical number.
    fn dir_append_block(&mut self, dir: Ino) -> Result<u32> {
        let i = self.read_inode(dir)?;
        let lblk = i.size.div_ceil(self.bs as u64);
        if lblk >= (1u64 << 31) {
            return Err(errno(libc::ENOSPC));
        }
        let lblk = lblk as u32;
        let goal = {
            let idx = self.dir_index(dir)?;
            idx.pblks.iter().rev().find(|&&p| p != 0).map(|p| p + 1)
        }
        .unwrap_or_else(|| self.inode_goal(dir));
        let (p, _) = self.alloc_blocks(goal, 1)?;
        let img = self.empty_dir_block();
        self.seal.owners.insert(
            p,
            Owner::Dir {
                ino: dir,
                generation: i.generation,
            },
        );
        self.init_block(
            p,
            BlockClass::Directory,
            &img,
            UpdateKind::DirBlockInit { dir },
        );
        self.csum_dir_block(p);
        {
            let mut t = self.tree(dir)?;
            extent::insert(&mut t, lblk, p, 1, false)?;
        }
        self.add_iblocks(dir, 1)?;
        self.set_size(dir, (lblk as u64 + 1) * self.bs as u64);
        let r = block_room(&img, p, dir)?;
        let idx = self.dir_index(dir)?;
        while idx.pblks.len() <= lblk as usize {
            idx.pblks.push(0);
            idx.room.push(Room::default());
        }
        idx.pblks[lblk as usize] = p;
        idx.room[lblk as usize] = r;
        Ok(lblk)
    }

    /// Remove entry `name` from `dir`.
    pub fn dir_remove(&mut self, dir: Ino, name: &[u8]) -> Result<Slot> {
        self.dir_unindex(dir)?;
        let slot = self
            .dir_lookup(dir, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        self.dir_remove_slot(dir, name, slot)?;
        Ok(slot)
    }

    /// Remove the entry of `dir` at `slot` (named `name`): [`dir_remove`]'s
    /// work once the entry is found, and the NoFS scanner's removal of a
    /// second entry of one name (the index holds only one of them; the
    /// caller drops the index afterwards).
    ///
    /// [`dir_remove`]: Core::dir_remove
    pub(crate) fn dir_remove_slot(&mut self, dir: Ino, name: &[u8], slot: Slot) -> Result<()> {
        if name != b"." && name != b".." {
            self.backlink_remove(slot.ino, dir)?;
        }
        let p = self.dir_index(dir)?.pblks[slot.lblk as usize];
        let img = self.read_block(p, BlockClass::Directory)?;
        // The entry at the slot's offset and the one before it (whose
        // record absorbs the removed one), the block's framing validated.
        let mut prev: Option<Dirent> = None;
        let mut at: Option<(Option<Dirent>, Dirent)> = None;
        for_each_dirent(&img, p, dir, |e| {
            if at.is_none() && e.off == slot.off as usize {
                at = Some((prev, e));
            }
            prev = Some(e);
        })?;
        drop(img);
        let (before, this) = at.ok_or_else(|| {
            FsError::corrupt(
                p,
                format!("directory {dir} index"),
                "entry not at its offset",
            )
        })?;
        let kind = UpdateKind::Dirent {
            dir,
            name: name.to_vec(),
            ino: slot.ino,
            op: LinkOp::Remove,
        };
        match before {
            None => self.modify(p, slot.off as usize, &0u32.to_le_bytes(), kind),
            Some(prev) => {
                let merged = (prev.rec_len + this.rec_len) as u16;
                self.modify(p, prev.off + 4, &merged.to_le_bytes(), kind);
            }
        }
        self.csum_dir_block(p);
        self.touch_inode(dir);
        let img = self.cache.snapshot(p).expect("cached");
        let r = block_room(&img, p, dir)?;
        let idx = self.dir_index(dir)?;
        idx.room[slot.lblk as usize] = r;
        if idx.names.remove(name).is_some() {
            self.dir_names -= 1;
        }
        Ok(())
    }

    /// Point existing entry `name` of `dir` at `ino` (rename over a target,
    /// `..` of a moved directory). Reported as an add of the new inode and a
    /// removal of the old one on the same bytes.
    pub fn dir_retarget(&mut self, dir: Ino, name: &[u8], ino: Ino, kind: FileType) -> Result<Ino> {
        self.dir_unindex(dir)?;
        let slot = self
            .dir_lookup(dir, name)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        if name != b"." && name != b".." {
            self.backlink_remove(slot.ino, dir)?;
            self.backlink_add(ino, dir)?;
        }
        let p = self.dir_index(dir)?.pblks[slot.lblk as usize];
        self.ensure(p, BlockClass::Directory)?;
        let off = slot.off as usize;
        self.modify(
            p,
            off,
            &ino.to_le_bytes(),
            UpdateKind::Dirent {
                dir,
                name: name.to_vec(),
                ino,
                op: LinkOp::Add,
            },
        );
        let ft = if self.sbi.has_filetype() {
            ft_of(kind)
        } else {
            0
        };
        if ft != slot.ft {
            self.modify(
                p,
                off + 7,
                &[ft],
                UpdateKind::Dirent {
                    dir,
                    name: name.to_vec(),
                    ino,
                    op: LinkOp::Add,
                },
            );
        }
        self.note_update(
            p,
            off,
            4,
            UpdateKind::Dirent {
                dir,
                name: name.to_vec(),
                ino: slot.ino,
                op: LinkOp::Remove,
            },
        );
        self.csum_dir_block(p);
        self.touch_inode(dir);
        let idx = self.dir_index(dir)?;
        if idx
            .names
            .insert(name.to_vec(), Slot { ino, ft, ..slot })
            .is_none()
        {
            self.dir_names += 1;
        }
        Ok(slot.ino)
    }

    /// Report a change of meaning of bytes that did not change (the removal
    /// half of a retarget).
    pub fn note_update(&mut self, block: u64, off: usize, len: usize, kind: UpdateKind) {
        let img = self.cache.snapshot(block).expect("cached");
        let bytes = crate::update::UpdateBytes::from_slice(&img[off..off + len]);
        let u = crate::update::Update {
            block,
            range: off as u32..(off + len) as u32,
            old: bytes.clone(),
            new: bytes,
            kind,
        };
        self.proto.on_update(&u, &self.handle);
    }

    /// Entries of `dir` from cookie `cookie` (0 = start), at most `max`.
    pub fn dir_read(
        &mut self,
        dir: Ino,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<crate::types::DirEntry>> {
        let pblks = self.dir_index(dir)?.pblks.clone();
        let indexed = self.read_inode(dir)?.flags & io::FL_INDEX != 0;
        let bs = self.bs as u64;
        let mut out = Vec::new();
        let first = (cookie / bs) as usize;
        for (l, &p) in pblks.iter().enumerate().skip(first) {
            if p == 0 {
                continue;
            }
            let img = self.read_block(p, BlockClass::Directory)?;
            if indexed && l > 0 && le32(&img, 0) == 0 && le16(&img, 4) as u64 == bs {
                continue;
            }
            for e in parse_block(&img, p, dir)? {
                let pos = l as u64 * bs + e.off as u64;
                if e.ino == 0 || pos < cookie {
                    continue;
                }
                let kind = match kind_of_ft(e.ft) {
                    Some(k) => k,
                    None => {
                        let i = self.read_inode(e.ino)?;
                        i.kind().unwrap_or(FileType::Regular)
                    }
                };
                out.push(crate::types::DirEntry {
                    ino: e.ino,
                    kind,
                    name: e.name,
                    next_offset: pos + 1,
                });
                if out.len() >= max {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// A block near inode `ino`'s group (allocation goal for its first block).
    pub fn inode_goal(&self, ino: Ino) -> u64 {
        let g = (ino - 1) / self.sbi.inodes_per_group;
        let loc = self.groups[g as usize];
        // After the group's inode table when it lives in the group,
        // otherwise the group's start.
        let first = self.sbi.group_first_block(g as u64);
        let itend = loc.inode_table + self.sbi.inode_table_blocks() as u64;
        if itend > first && itend < first + self.sbi.blocks_per_group as u64 {
            itend
        } else {
            first
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_bad_rec_len_without_panicking() {
        let mut img = vec![0u8; 1024];
        put32(&mut img, 0, 2);
        put16(&mut img, 4, 6); // too small
        assert!(parse_block(&img, 7, 2).is_err());
        put16(&mut img, 4, 2048); // past the block
        assert!(parse_block(&img, 7, 2).is_err());
        put16(&mut img, 4, 1024);
        img[6] = 200;
        assert_eq!(parse_block(&img, 7, 2).unwrap().len(), 1);
    }

    /// The internal walk a create uses sees the entries the iterator
    /// yields and ends with the same error, for every kind of bad framing
    /// at every entry of a block.
    #[test]
    fn internal_walk_agrees_with_the_iterator() {
        fn walk(img: &[u8]) -> (Vec<(usize, u32)>, Option<String>) {
            let mut seen = Vec::new();
            let r = for_each_dirent(img, 7, 2, |e| seen.push((e.off, e.ino)));
            (seen, r.err().map(|e| e.to_string()))
        }
        fn iter(img: &[u8]) -> (Vec<(usize, u32)>, Option<String>) {
            let mut seen = Vec::new();
            for e in dirents(img, 7, 2) {
                match e {
                    Ok(e) => seen.push((e.off, e.ino)),
                    Err(e) => return (seen, Some(e.to_string())),
                }
            }
            (seen, None)
        }
        // Eight entries of 16 bytes, the last spanning to the tail.
        let mut good = vec![0u8; 1024];
        for k in 0..8usize {
            let off = k * 16;
            put32(&mut good, off, 11 + k as u32);
            let len = if k == 7 { 1024 - 12 - off } else { 16 };
            put16(&mut good, off + 4, len as u16);
            good[off + 6] = 4;
            good[off + 7] = de::FT_REG;
        }
        // The checksum tail.
        put16(&mut good, 1024 - 8, 12);
        good[1024 - 5] = de::TAIL_FT;
        assert!(has_tail(&good));
        let (seen, err) = walk(&good);
        assert_eq!(seen.len(), 8);
        assert_eq!(err, None);
        assert_eq!((seen, err), iter(&good));
        let mut broken = 0;
        for k in 0..8usize {
            let off = k * 16;
            for (rec_len, name_len) in [(6u16, 4u8), (18, 4), (2048, 4), (16, 9), (0, 0)] {
                let mut img = good.clone();
                put16(&mut img, off + 4, rec_len);
                img[off + 6] = name_len;
                let (seen, err) = walk(&img);
                assert_eq!(
                    (seen.clone(), err.clone()),
                    iter(&img),
                    "entry {k}: {rec_len}/{name_len}"
                );
                if err.is_some() {
                    broken += 1;
                    assert_eq!(seen.len(), k, "entry {k} seen though malformed");
                }
            }
        }
        // Each of the five breaks the block at the entry it is put in.
        assert_eq!(broken, 40);
        // A header that crosses the end of the block.
        let mut img = vec![0u8; 1024];
        put16(&mut img, 4, 1020);
        put32(&mut img, 1020, 5);
        let (seen, err) = walk(&img);
        assert_eq!(seen.len(), 1);
        assert!(
            err.as_deref().unwrap_or("").contains("crosses the end"),
            "{err:?}"
        );
        assert_eq!((seen, err), iter(&img));
    }
}
