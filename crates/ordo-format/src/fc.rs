//! The ext4 fast-commit log: tag-length-value records in the fast-commit
//! area at the end of the JBD2 journal, byte for byte as Linux
//! `fs/ext4/fast_commit.{c,h}` writes them and as the kernel and
//! `e2fsck` replay them.
//!
//! Why byte-exact: a log ordo writes must replay under the kernel and
//! `e2fsck -fy`, and ordo must replay a log the kernel wrote. Every field
//! is **little-endian** (ext4's order, not JBD2's).
//!
//! ```text
//!  fast-commit area: the last s_num_fc_blks blocks of the journal
//! +---------------------------------------------+  +--------------------------
//! | HEAD | INODE | ADD_RANGE | CREAT | ... |TAIL|  | INODE | DEL_RANGE | TAIL ...
//! +---------------------------------------------+  +--------------------------
//!  commit 1 (HEAD only at the start of the area)     commit 2 (next block)
//! ```
//!
//! - A record is `le16 tag, le16 len`, then `len` value bytes, packed with
//!   no alignment. A record never straddles a block: when it does not fit
//!   in what is left of a block *while leaving room for a 4-byte PAD
//!   header*, the block is closed with a PAD record covering the rest of
//!   it (value zeroed) and the record starts the next block.
//! - The area starts with a HEAD (`features`, `tid`): `tid` is the JBD2
//!   transaction that was running when the first fast commit was made, the
//!   one after the last full commit. It is written once per full-commit
//!   interval; later fast commits follow in later blocks.
//! - Every fast commit ends with a TAIL (`tid`, `crc`) whose length
//!   reaches the end of its block, so the next commit starts a fresh block.
//!   The CRC is the raw CRC32C (seed 0, no inversions) of every byte of the
//!   commit's blocks from the first block's start through the TAIL's `tid`
//!   (PAD records included, zeros and all).
//! - Replay (scan) accepts a commit only when its TAIL names the expected
//!   tid (the JBD2 transaction after the last one recovered) and its CRC
//!   matches; it stops at the first bad record, bad TAIL or HEAD of another
//!   tid, and replays every tag up to the last valid TAIL.

use crate::csum::ext4_crc32c;
use crate::le::{u16_at, u32_at};
use crate::{FormatError, Result};

/// `EXT4_FC_TAG_ADD_RANGE`: blocks mapped to an inode.
pub const TAG_ADD_RANGE: u16 = 1;
/// `EXT4_FC_TAG_DEL_RANGE`: logical blocks unmapped from an inode.
pub const TAG_DEL_RANGE: u16 = 2;
/// `EXT4_FC_TAG_CREAT`: an inode created and linked into a directory.
pub const TAG_CREAT: u16 = 3;
/// `EXT4_FC_TAG_LINK`: a directory entry added.
pub const TAG_LINK: u16 = 4;
/// `EXT4_FC_TAG_UNLINK`: a directory entry removed.
pub const TAG_UNLINK: u16 = 5;
/// `EXT4_FC_TAG_INODE`: the latest image of an inode.
pub const TAG_INODE: u16 = 6;
/// `EXT4_FC_TAG_PAD`: filler to the end of a block.
pub const TAG_PAD: u16 = 7;
/// `EXT4_FC_TAG_TAIL`: end of a fast commit, with its CRC.
pub const TAG_TAIL: u16 = 8;
/// `EXT4_FC_TAG_HEAD`: start of the fast-commit area.
pub const TAG_HEAD: u16 = 9;

/// `EXT4_FC_TAG_BASE_LEN`: the tag and length header of every record.
pub const TL_BYTES: usize = 4;
/// `EXT4_FC_SUPPORTED_FEATURES`: no HEAD feature bits are defined.
pub const SUPPORTED_FEATURES: u32 = 0;
/// Value size of ADD_RANGE (`le32 ino` + a 12-byte `ext4_extent`).
pub const ADD_RANGE_BYTES: usize = 16;
/// Value size of DEL_RANGE (`le32 ino, lblk, len`).
pub const DEL_RANGE_BYTES: usize = 12;
/// Value size of HEAD (`le32 features, tid`).
pub const HEAD_BYTES: usize = 8;
/// Value size of TAIL (`le32 tid, crc`) before its stretch to the block end.
pub const TAIL_BYTES: usize = 8;
/// Fixed part of a dentry value (`le32 parent_ino, ino`).
pub const DENTRY_FIXED_BYTES: usize = 8;
/// Longest name a dentry record may carry (`EXT4_NAME_LEN`).
pub const NAME_MAX: usize = 255;
/// The smallest raw inode an INODE record may carry.
pub const GOOD_OLD_INODE_SIZE: usize = 128;
/// `ee_len` values above this mark an unwritten extent.
const EXT_INIT_MAX_LEN: u16 = 32768;

/// A directory-entry record (CREAT, LINK, UNLINK).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dentry {
    /// The directory.
    pub parent: u32,
    /// The inode the entry names.
    pub ino: u32,
    /// The entry's name (1 to 255 bytes).
    pub name: Vec<u8>,
}

/// One fast-commit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tag {
    /// `len` blocks of `ino` from logical `lblk` map to physical `pblk`.
    AddRange {
        ino: u32,
        lblk: u32,
        pblk: u64,
        /// Blocks (1..=32768 written, 1..=32767 unwritten).
        len: u32,
        unwritten: bool,
    },
    /// Logical blocks `lblk .. lblk + len` of `ino` are unmapped.
    DelRange { ino: u32, lblk: u32, len: u32 },
    /// Inode created and named by an entry.
    Creat(Dentry),
    /// Entry added.
    Link(Dentry),
    /// Entry removed.
    Unlink(Dentry),
    /// The on-disk image of inode `ino` (the first 128 bytes plus its
    /// `i_extra_isize`).
    Inode { ino: u32, raw: Vec<u8> },
    /// Filler of `len` value bytes (zeros).
    Pad { len: u16 },
    /// End of a commit.
    Tail { tid: u32, crc: u32 },
    /// Start of the area.
    Head { features: u32, tid: u32 },
}

impl Tag {
    /// The on-disk tag number.
    pub fn code(&self) -> u16 {
        match self {
            Tag::AddRange { .. } => TAG_ADD_RANGE,
            Tag::DelRange { .. } => TAG_DEL_RANGE,
            Tag::Creat(_) => TAG_CREAT,
            Tag::Link(_) => TAG_LINK,
            Tag::Unlink(_) => TAG_UNLINK,
            Tag::Inode { .. } => TAG_INODE,
            Tag::Pad { .. } => TAG_PAD,
            Tag::Tail { .. } => TAG_TAIL,
            Tag::Head { .. } => TAG_HEAD,
        }
    }

    /// The kernel's name of the tag (`debugfs logdump` prints these).
    pub fn name(&self) -> &'static str {
        tag_name(self.code())
    }

    /// The inode the record is about, if any.
    pub fn ino(&self) -> Option<u32> {
        match self {
            Tag::AddRange { ino, .. } | Tag::DelRange { ino, .. } | Tag::Inode { ino, .. } => {
                Some(*ino)
            }
            Tag::Creat(d) | Tag::Link(d) | Tag::Unlink(d) => Some(d.ino),
            _ => None,
        }
    }

    /// Length of the value (what `fc_len` says), except for TAIL, whose
    /// on-disk length also covers the rest of its block.
    pub fn value_len(&self) -> usize {
        match self {
            Tag::AddRange { .. } => ADD_RANGE_BYTES,
            Tag::DelRange { .. } => DEL_RANGE_BYTES,
            Tag::Creat(d) | Tag::Link(d) | Tag::Unlink(d) => DENTRY_FIXED_BYTES + d.name.len(),
            Tag::Inode { raw, .. } => 4 + raw.len(),
            Tag::Pad { len } => *len as usize,
            Tag::Tail { .. } => TAIL_BYTES,
            Tag::Head { .. } => HEAD_BYTES,
        }
    }

    /// Bytes the record takes in the log (header and value).
    pub fn record_len(&self) -> usize {
        TL_BYTES + self.value_len()
    }

    /// Check the record against the limits the kernel's scan enforces
    /// (`ext4_fc_value_len_isvalid`), for an image with `inode_size`-byte
    /// inodes.
    pub fn validate(&self, inode_size: usize) -> Result<()> {
        match self {
            Tag::AddRange { len, unwritten, .. } => {
                let max = if *unwritten {
                    EXT_INIT_MAX_LEN as u32 - 1
                } else {
                    EXT_INIT_MAX_LEN as u32
                };
                if *len == 0 || *len > max {
                    return Err(FormatError::new(
                        "fast commit ADD_RANGE ee_len",
                        format!("{len} blocks (max {max})"),
                    ));
                }
            }
            Tag::Creat(d) | Tag::Link(d) | Tag::Unlink(d) => {
                if d.name.is_empty() || d.name.len() > NAME_MAX {
                    return Err(FormatError::new(
                        "fast commit dentry name",
                        format!("{} bytes (1..=255)", d.name.len()),
                    ));
                }
            }
            Tag::Inode { raw, .. } => {
                if raw.len() < GOOD_OLD_INODE_SIZE || raw.len() > inode_size {
                    return Err(FormatError::new(
                        "fast commit INODE length",
                        format!("{} bytes (128..={inode_size})", raw.len()),
                    ));
                }
            }
            Tag::Head { features, .. } => {
                if features & !SUPPORTED_FEATURES != 0 {
                    return Err(FormatError::new(
                        "fast commit HEAD fc_features",
                        format!("unknown features {features:#x}"),
                    ));
                }
            }
            Tag::DelRange { .. } | Tag::Pad { .. } | Tag::Tail { .. } => {}
        }
        Ok(())
    }

    /// Encode the value bytes (TAIL without its stretch).
    pub fn encode_value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.value_len());
        match self {
            Tag::AddRange {
                ino,
                lblk,
                pblk,
                len,
                unwritten,
            } => {
                let ee_len = if *unwritten {
                    *len as u16 + EXT_INIT_MAX_LEN
                } else {
                    *len as u16
                };
                v.extend_from_slice(&ino.to_le_bytes());
                v.extend_from_slice(&lblk.to_le_bytes());
                v.extend_from_slice(&ee_len.to_le_bytes());
                v.extend_from_slice(&((*pblk >> 32) as u16).to_le_bytes());
                v.extend_from_slice(&(*pblk as u32).to_le_bytes());
            }
            Tag::DelRange { ino, lblk, len } => {
                v.extend_from_slice(&ino.to_le_bytes());
                v.extend_from_slice(&lblk.to_le_bytes());
                v.extend_from_slice(&len.to_le_bytes());
            }
            Tag::Creat(d) | Tag::Link(d) | Tag::Unlink(d) => {
                v.extend_from_slice(&d.parent.to_le_bytes());
                v.extend_from_slice(&d.ino.to_le_bytes());
                v.extend_from_slice(&d.name);
            }
            Tag::Inode { ino, raw } => {
                v.extend_from_slice(&ino.to_le_bytes());
                v.extend_from_slice(raw);
            }
            Tag::Pad { len } => v.resize(*len as usize, 0),
            Tag::Tail { tid, crc } => {
                v.extend_from_slice(&tid.to_le_bytes());
                v.extend_from_slice(&crc.to_le_bytes());
            }
            Tag::Head { features, tid } => {
                v.extend_from_slice(&features.to_le_bytes());
                v.extend_from_slice(&tid.to_le_bytes());
            }
        }
        debug_assert_eq!(v.len(), self.value_len());
        v
    }

    /// Decode one record from its tag number and value bytes (`fc_len`
    /// of them), checking lengths as the kernel's scan does.
    pub fn decode(tag: u16, value: &[u8], inode_size: usize) -> Result<Tag> {
        let want = |ok: bool, field: &'static str| -> Result<()> {
            if ok {
                Ok(())
            } else {
                Err(FormatError::new(
                    field,
                    format!("value of {} bytes is not valid", value.len()),
                ))
            }
        };
        let t = match tag {
            TAG_ADD_RANGE => {
                want(value.len() == ADD_RANGE_BYTES, "fast commit ADD_RANGE")?;
                let ee_len = u16_at(value, 8);
                let (len, unwritten) = if ee_len > EXT_INIT_MAX_LEN {
                    ((ee_len - EXT_INIT_MAX_LEN) as u32, true)
                } else {
                    (ee_len as u32, false)
                };
                Tag::AddRange {
                    ino: u32_at(value, 0),
                    lblk: u32_at(value, 4),
                    len,
                    unwritten,
                    pblk: ((u16_at(value, 10) as u64) << 32) | u32_at(value, 12) as u64,
                }
            }
            TAG_DEL_RANGE => {
                want(value.len() == DEL_RANGE_BYTES, "fast commit DEL_RANGE")?;
                Tag::DelRange {
                    ino: u32_at(value, 0),
                    lblk: u32_at(value, 4),
                    len: u32_at(value, 8),
                }
            }
            TAG_CREAT | TAG_LINK | TAG_UNLINK => {
                want(
                    value.len() > DENTRY_FIXED_BYTES
                        && value.len() <= DENTRY_FIXED_BYTES + NAME_MAX,
                    "fast commit dentry",
                )?;
                let d = Dentry {
                    parent: u32_at(value, 0),
                    ino: u32_at(value, 4),
                    name: value[DENTRY_FIXED_BYTES..].to_vec(),
                };
                match tag {
                    TAG_CREAT => Tag::Creat(d),
                    TAG_LINK => Tag::Link(d),
                    _ => Tag::Unlink(d),
                }
            }
            TAG_INODE => {
                want(
                    value.len() >= 4 + GOOD_OLD_INODE_SIZE && value.len() <= 4 + inode_size,
                    "fast commit INODE",
                )?;
                Tag::Inode {
                    ino: u32_at(value, 0),
                    raw: value[4..].to_vec(),
                }
            }
            TAG_PAD => Tag::Pad {
                len: value.len() as u16,
            },
            TAG_TAIL => {
                want(value.len() >= TAIL_BYTES, "fast commit TAIL")?;
                Tag::Tail {
                    tid: u32_at(value, 0),
                    crc: u32_at(value, 4),
                }
            }
            TAG_HEAD => {
                want(value.len() == HEAD_BYTES, "fast commit HEAD")?;
                Tag::Head {
                    features: u32_at(value, 0),
                    tid: u32_at(value, 4),
                }
            }
            other => {
                return Err(FormatError::new(
                    "fast commit fc_tag",
                    format!("unknown tag {other}"),
                ))
            }
        };
        t.validate(inode_size)?;
        Ok(t)
    }
}

/// The kernel's name of a tag number.
pub fn tag_name(code: u16) -> &'static str {
    match code {
        TAG_ADD_RANGE => "ADD_RANGE",
        TAG_DEL_RANGE => "DEL_RANGE",
        TAG_CREAT => "CREAT_DENTRY",
        TAG_LINK => "ADD_ENTRY",
        TAG_UNLINK => "DEL_ENTRY",
        TAG_INODE => "INODE",
        TAG_PAD => "PAD",
        TAG_TAIL => "TAIL",
        TAG_HEAD => "HEAD",
        _ => "UNKNOWN",
    }
}

/// A record does not fit in a block even alone (a name or inode too long
/// for a tiny block size): the commit must fall back to a full commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fast-commit record of {record_bytes} bytes does not fit in a {block_size}-byte block")]
pub struct RecordTooLarge {
    /// Header and value.
    pub record_bytes: usize,
    /// The block size.
    pub block_size: usize,
}

/// Builds the blocks of one fast commit exactly as the kernel lays them
/// out (`ext4_fc_reserve_space`, `ext4_fc_write_tail`).
#[derive(Clone, Debug)]
pub struct LogWriter {
    block_size: usize,
    /// Finished blocks and the one being filled (last).
    blocks: Vec<Vec<u8>>,
    /// Fill offset in the last block.
    off: usize,
    /// CRC of the finished blocks of this commit.
    crc: u32,
}

impl LogWriter {
    /// An empty commit of `block_size`-byte blocks.
    pub fn new(block_size: usize) -> Self {
        assert!(block_size >= 256 && block_size.is_power_of_two());
        LogWriter {
            block_size,
            blocks: vec![vec![0u8; block_size]],
            off: 0,
            crc: 0,
        }
    }

    /// Whether a record of `record_bytes` could ever be logged.
    pub fn fits_alone(&self, record_bytes: usize) -> bool {
        record_bytes <= self.block_size - TL_BYTES
    }

    /// Reserve `len` bytes, closing the current block with a PAD when they
    /// do not fit alongside room for a PAD header.
    fn reserve(&mut self, len: usize) -> std::result::Result<usize, RecordTooLarge> {
        if !self.fits_alone(len) {
            return Err(RecordTooLarge {
                record_bytes: len,
                block_size: self.block_size,
            });
        }
        let remaining = self.block_size - TL_BYTES - self.off;
        if len <= remaining {
            let at = self.off;
            self.off += len;
            return Ok(at);
        }
        let last = self.blocks.last_mut().expect("one block");
        last[self.off..self.off + 2].copy_from_slice(&TAG_PAD.to_le_bytes());
        last[self.off + 2..self.off + 4].copy_from_slice(&(remaining as u16).to_le_bytes());
        last[self.off + 4..].fill(0);
        self.crc = ext4_crc32c(self.crc, last);
        self.blocks.push(vec![0u8; self.block_size]);
        self.off = len;
        Ok(0)
    }

    /// Append one record (never a PAD or TAIL: those are the writer's).
    pub fn add(&mut self, tag: &Tag) -> std::result::Result<(), RecordTooLarge> {
        debug_assert!(!matches!(tag, Tag::Pad { .. } | Tag::Tail { .. }));
        let len = tag.record_len();
        let at = self.reserve(len)?;
        let value = tag.encode_value();
        let b = self.blocks.last_mut().expect("one block");
        b[at..at + 2].copy_from_slice(&tag.code().to_le_bytes());
        b[at + 2..at + 4].copy_from_slice(&(value.len() as u16).to_le_bytes());
        b[at + 4..at + 4 + value.len()].copy_from_slice(&value);
        Ok(())
    }

    /// Blocks the commit takes if it were closed now (the TAIL included).
    pub fn blocks_when_closed(&self) -> usize {
        let tail = TL_BYTES + TAIL_BYTES;
        if tail <= self.block_size - TL_BYTES - self.off {
            self.blocks.len()
        } else {
            self.blocks.len() + 1
        }
    }

    /// Whether nothing was added yet.
    pub fn is_empty(&self) -> bool {
        self.blocks.len() == 1 && self.off == 0
    }

    /// Close the commit with a TAIL naming `tid` and return its blocks.
    pub fn finish(mut self, tid: u32) -> Vec<Vec<u8>> {
        let at = self
            .reserve(TL_BYTES + TAIL_BYTES)
            .expect("a tail fits in any block");
        let bs = self.block_size;
        let end = at + TL_BYTES + TAIL_BYTES;
        let b = self.blocks.last_mut().expect("one block");
        b[at..at + 2].copy_from_slice(&TAG_TAIL.to_le_bytes());
        let stretched = (bs - end + TAIL_BYTES) as u16;
        b[at + 2..at + 4].copy_from_slice(&stretched.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&tid.to_le_bytes());
        let crc = ext4_crc32c(self.crc, &b[..at + 8]);
        b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        b[end..].fill(0);
        self.blocks
    }
}

/// Why a scan stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The area does not start with a HEAD: nothing to replay.
    NoHead,
    /// The HEAD names another transaction (the log is stale).
    StaleHead { tid: u32 },
    /// A record or TAIL that does not belong to a valid commit: the normal
    /// end of a log (or a torn last commit).
    Stop {
        /// Block of the area (0-based) where the scan stopped.
        block: usize,
        /// What was found there.
        reason: String,
    },
    /// Every block of the area was read.
    AreaEnd,
}

/// What a scan of the fast-commit area found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The records of every valid commit, in log order (HEAD, PAD and TAIL
    /// records left out).
    pub tags: Vec<Tag>,
    /// Valid commits (TAILs accepted).
    pub commits: u32,
    /// Blocks of the area the valid commits take.
    pub blocks: usize,
    /// Why the scan stopped.
    pub end: ScanEnd,
}

/// Scan the blocks of a fast-commit area (in order, from its first block)
/// for commits made on top of JBD2 transaction `expected_tid`, exactly as
/// `ext4_fc_replay_scan` does: the first block must start with a HEAD of
/// that tid; each TAIL must carry the tid and the CRC of everything since
/// the previous TAIL (or the start); the scan stops at the first record
/// that does not parse, and only commits closed by a valid TAIL count.
pub fn scan<'a>(
    blocks: impl IntoIterator<Item = &'a [u8]>,
    expected_tid: u32,
    inode_size: usize,
) -> Scan {
    let mut out = Scan {
        tags: Vec::new(),
        commits: 0,
        blocks: 0,
        end: ScanEnd::AreaEnd,
    };
    let mut pending: Vec<Tag> = Vec::new();
    let mut crc: u32 = 0;
    for (bi, block) in blocks.into_iter().enumerate() {
        if bi == 0 && (block.len() < TL_BYTES || u16_at(block, 0) != TAG_HEAD) {
            out.end = ScanEnd::NoHead;
            return out;
        }
        let stop = |reason: String| ScanEnd::Stop { block: bi, reason };
        let mut cur = 0usize;
        while cur + TL_BYTES <= block.len() {
            let tag = u16_at(block, cur);
            let len = u16_at(block, cur + 2) as usize;
            let val_at = cur + TL_BYTES;
            if len > block.len() - val_at {
                out.end = stop(format!("record at byte {cur} overruns the block"));
                return out;
            }
            let value = &block[val_at..val_at + len];
            let t = match Tag::decode(tag, value, inode_size) {
                Ok(t) => t,
                Err(e) => {
                    out.end = stop(format!("byte {cur}: {e}"));
                    return out;
                }
            };
            match t {
                Tag::Head { tid, .. } => {
                    if tid != expected_tid {
                        out.end = ScanEnd::StaleHead { tid };
                        return out;
                    }
                    crc = ext4_crc32c(crc, &block[cur..val_at + len]);
                }
                Tag::Tail { tid, crc: stored } => {
                    crc = ext4_crc32c(crc, &block[cur..val_at + 4]);
                    if tid != expected_tid || stored != crc {
                        out.end = stop(format!(
                            "TAIL of tid {tid} crc {stored:#010x} (expected tid {expected_tid}, crc {crc:#010x})"
                        ));
                        return out;
                    }
                    out.tags.append(&mut pending);
                    out.commits += 1;
                    out.blocks = bi + 1;
                    crc = 0;
                }
                Tag::Pad { .. } => {
                    crc = ext4_crc32c(crc, &block[cur..val_at + len]);
                }
                other => {
                    crc = ext4_crc32c(crc, &block[cur..val_at + len]);
                    pending.push(other);
                }
            }
            cur = val_at + len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first block of a fast-commit area written by Linux 6.18
    /// (`mkfs.ext4 -O fast_commit`, 4 KiB blocks, 256-byte inodes): HEAD,
    /// INODE 13, ADD_RANGE, CREAT "a.txt", INODE 13, TAIL of tid 3. Only
    /// the first 397 bytes; the rest of the block is zeros.
    const KERNEL_BLOCK_HEX: &str = "0900080000000000030000000600a4000d000000a481000012000000bc10036bbc10036bbc10036b00000000000001000800000000000800010000000af301000400000000000000000000000100000022080000000000000000000000000000000000000000000000000000000000000000000000000000d3b9a1860000000000000000000000000000000000000000961f0000200001046c08a3af6c08a3af6c08a3afbc10036b6c08a3af0000000000000000010010000d00000000000000010000002208000003000d00020000000d000000612e7478740600a4000d000000a481000012000000bc10036bbc10036bbc10036b00000000000001000800000000000800010000000af301000400000000000000000000000100000022080000000000000000000000000000000000000000000000000000000000000000000000000000d3b9a1860000000000000000000000000000000000000000961f0000200001046c08a3af6c08a3af6c08a3afbc10036b6c08a3af000000000000000008007b0e03000000e2e4efab";

    fn kernel_block() -> Vec<u8> {
        let mut b: Vec<u8> = (0..KERNEL_BLOCK_HEX.len() / 2)
            .map(|i| u8::from_str_radix(&KERNEL_BLOCK_HEX[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        b.resize(4096, 0);
        b
    }

    fn dentry(parent: u32, ino: u32, name: &str) -> Dentry {
        Dentry {
            parent,
            ino,
            name: name.as_bytes().to_vec(),
        }
    }

    fn sample_tags() -> Vec<Tag> {
        vec![
            Tag::Inode {
                ino: 13,
                raw: (0..160u32).map(|i| i as u8).collect(),
            },
            Tag::AddRange {
                ino: 13,
                lblk: 7,
                pblk: 0x1_0000_2082,
                len: 3,
                unwritten: false,
            },
            Tag::AddRange {
                ino: 13,
                lblk: 10,
                pblk: 9000,
                len: 32767,
                unwritten: true,
            },
            Tag::DelRange {
                ino: 14,
                lblk: 0x8000_0000,
                len: 0x7fff_ffff,
            },
            Tag::Creat(dentry(2, 13, "a.txt")),
            Tag::Link(dentry(12, 15, "c-link")),
            Tag::Unlink(dentry(2, 15, "c.txt")),
        ]
    }

    #[test]
    fn every_tag_round_trips() {
        let mut all = sample_tags();
        all.push(Tag::Head {
            features: 0,
            tid: 77,
        });
        all.push(Tag::Tail {
            tid: 77,
            crc: 0xdead_beef,
        });
        all.push(Tag::Pad { len: 9 });
        for t in all {
            let v = t.encode_value();
            assert_eq!(v.len(), t.value_len(), "{t:?}");
            let back = Tag::decode(t.code(), &v, 256).unwrap();
            assert_eq!(back, t);
        }
    }

    #[test]
    fn decoder_rejects_what_the_kernel_rejects() {
        assert!(Tag::decode(TAG_ADD_RANGE, &[0; 15], 256).is_err());
        assert!(Tag::decode(TAG_DEL_RANGE, &[0; 16], 256).is_err());
        assert!(Tag::decode(TAG_CREAT, &[0; 8], 256).is_err());
        assert!(Tag::decode(TAG_LINK, &[1; 8 + 256], 256).is_err());
        assert!(Tag::decode(TAG_INODE, &[0; 4 + 127], 256).is_err());
        assert!(Tag::decode(TAG_INODE, &[0; 4 + 257], 256).is_err());
        assert!(Tag::decode(TAG_HEAD, &[1, 0, 0, 0, 0, 0, 0, 0], 256).is_err());
        assert!(Tag::decode(TAG_TAIL, &[0; 7], 256).is_err());
        assert!(Tag::decode(0, &[], 256).is_err());
        assert!(Tag::decode(10, &[0; 4], 256).is_err());
        // An ADD_RANGE of zero blocks.
        let mut v = Tag::AddRange {
            ino: 1,
            lblk: 0,
            pblk: 5,
            len: 1,
            unwritten: false,
        }
        .encode_value();
        v[8] = 0;
        assert!(Tag::decode(TAG_ADD_RANGE, &v, 256).is_err());
    }

    #[test]
    fn kernel_block_scans_and_is_rebuilt_byte_for_byte() {
        let block = kernel_block();
        let s = scan([block.as_slice()], 3, 256);
        assert_eq!(s.commits, 1);
        assert_eq!(s.blocks, 1);
        let names: Vec<_> = s.tags.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["INODE", "ADD_RANGE", "CREAT_DENTRY", "INODE"]);
        assert_eq!(
            s.tags[1],
            Tag::AddRange {
                ino: 13,
                lblk: 0,
                pblk: 2082,
                len: 1,
                unwritten: false
            }
        );
        assert_eq!(s.tags[2], Tag::Creat(dentry(2, 13, "a.txt")));
        // The same records through the writer give the same bytes.
        let mut w = LogWriter::new(4096);
        w.add(&Tag::Head {
            features: 0,
            tid: 3,
        })
        .unwrap();
        for t in &s.tags {
            w.add(t).unwrap();
        }
        assert_eq!(w.blocks_when_closed(), 1);
        let blocks = w.finish(3);
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0], block);
    }

    #[test]
    fn wrong_tid_or_crc_replays_nothing() {
        let block = kernel_block();
        let s = scan([block.as_slice()], 4, 256);
        assert_eq!(s.end, ScanEnd::StaleHead { tid: 3 });
        assert!(s.tags.is_empty());
        let mut bad = block.clone();
        bad[100] ^= 1; // inside the first INODE record
        let s = scan([bad.as_slice()], 3, 256);
        assert_eq!(s.commits, 0);
        assert!(s.tags.is_empty());
        assert!(matches!(s.end, ScanEnd::Stop { block: 0, .. }));
        let zeros = vec![0u8; 4096];
        assert_eq!(scan([zeros.as_slice()], 3, 256).end, ScanEnd::NoHead);
    }

    fn commit(tid: u32, head: bool, tags: &[Tag], bs: usize) -> Vec<Vec<u8>> {
        let mut w = LogWriter::new(bs);
        if head {
            w.add(&Tag::Head { features: 0, tid }).unwrap();
        }
        for t in tags {
            w.add(t).unwrap();
        }
        w.finish(tid)
    }

    #[test]
    fn records_never_straddle_and_multi_block_commits_scan() {
        // Many INODE records in 1 KiB blocks: several blocks, PADs between.
        let tags: Vec<Tag> = (0..20u32)
            .map(|i| Tag::Inode {
                ino: 100 + i,
                raw: vec![i as u8; 160],
            })
            .collect();
        let blocks = commit(9, true, &tags, 1024);
        assert!(blocks.len() > 3);
        for b in &blocks {
            // Walk each block alone: records tile it exactly.
            let mut cur = 0;
            while cur + TL_BYTES <= b.len() {
                let len = u16_at(b, cur + 2) as usize;
                assert!(cur + TL_BYTES + len <= b.len());
                let tag = u16_at(b, cur);
                cur += TL_BYTES + len;
                if tag == TAG_PAD || tag == TAG_TAIL {
                    assert_eq!(cur, b.len(), "PAD and TAIL end their block");
                }
            }
        }
        let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        let s = scan(refs, 9, 256);
        assert_eq!(s.tags, tags);
        assert_eq!(s.commits, 1);
        assert_eq!(s.blocks, blocks.len());
    }

    #[test]
    fn scan_stops_at_the_last_valid_tail() {
        let a = commit(5, true, &sample_tags()[..3], 4096);
        let b = commit(5, false, &sample_tags()[3..], 4096);
        let mut torn = commit(5, false, &sample_tags()[..1], 4096);
        torn[0][40] ^= 0xff;
        let mut all: Vec<Vec<u8>> = Vec::new();
        all.extend(a.clone());
        all.extend(b.clone());
        all.extend(torn);
        all.push(vec![0u8; 4096]);
        let refs: Vec<&[u8]> = all.iter().map(|b| b.as_slice()).collect();
        let s = scan(refs, 5, 256);
        assert_eq!(s.commits, 2);
        assert_eq!(s.tags, sample_tags());
        assert_eq!(s.blocks, a.len() + b.len());
        assert!(matches!(s.end, ScanEnd::Stop { block: 2, .. }));
        // A stale commit of an older tid after valid ones also stops.
        let stale = commit(4, false, &sample_tags()[..1], 4096);
        let mut all2 = a.clone();
        all2.extend(stale);
        let refs: Vec<&[u8]> = all2.iter().map(|b| b.as_slice()).collect();
        let s = scan(refs, 5, 256);
        assert_eq!(s.commits, 1);
    }

    #[test]
    fn oversized_records_are_refused() {
        let mut w = LogWriter::new(256);
        let t = Tag::Inode {
            ino: 12,
            raw: vec![0; 256],
        };
        assert!(w.add(&t).is_err());
        assert!(w.is_empty());
        let t = Tag::Inode {
            ino: 12,
            raw: vec![0; 128],
        };
        w.add(&t).unwrap();
        assert!(!w.is_empty());
    }
}
