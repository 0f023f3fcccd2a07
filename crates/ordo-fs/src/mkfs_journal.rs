//! Journal creation for `ordo mkfs`: an internal JBD2 journal in inode 8,
//! sized and laid out as `mke2fs` does it.
//!
//! mkfs allocates the journal's blocks (contiguous where it can: the
//! journal is read and written sequentially, and `mke2fs` puts it in one
//! run near the middle of the file system) and hands the runs here. This
//! module produces everything else: the JBD2 v2 superblock at journal
//! block 0 with the rest of the journal zeroed (a zeroed log can never be
//! mistaken for transactions), the inode's extent root (with one leaf block
//! when the runs need more than the four extents `i_block` holds), and the
//! `s_jnl_blocks` backup that lets e2fsck find the journal when inode 8 is
//! damaged. The journal superblock carries no features: like the kernel,
//! ordo turns on checksums (v3, with `metadata_csum`) and 64-bit block
//! numbers when it first writes the journal at mount.

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};
use ordo_format::extent::EXTENT_MAGIC;
use ordo_format::jbd2::JournalSuperblock;

use crate::error::{FsError, Result};

/// Longest extent ext4 maps in one entry (initialized extents).
const EXT_MAX_LEN: u32 = 32768;
/// Extents that fit in the inode's `i_block`.
const EXTENTS_IN_INODE: usize = 4;

/// `mke2fs`'s default journal size in blocks (`ext2fs_default_journal_size`)
/// for a file system of `fs_blocks` blocks, or `None` when it is too small
/// for a journal (fewer than 2048 blocks). The thresholds count blocks, not
/// bytes, whatever the block size.
pub fn default_journal_blocks(fs_blocks: u64) -> Option<u32> {
    Some(match fs_blocks {
        0..=2047 => return None,
        2048..=32767 => 1024,
        32768..=262_143 => 4096,
        262_144..=524_287 => 8192,
        524_288..=4_194_303 => 16384,
        4_194_304..=8_388_607 => 32768,
        8_388_608..=16_777_215 => 65536,
        16_777_216..=33_554_431 => 131_072,
        _ => 262_144,
    })
}

/// Smallest journal ordo accepts (`JBD2_MIN_JOURNAL_BLOCKS`).
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;

/// Split (logical, physical, length) runs into ext4 extents of at most
/// 32768 blocks, in logical order.
pub fn journal_extents(runs: &[(u32, u64, u32)]) -> Vec<(u32, u64, u32)> {
    let mut runs = runs.to_vec();
    runs.sort_unstable();
    let mut out = Vec::new();
    for (l, p, n) in runs {
        let mut done = 0;
        while done < n {
            let len = (n - done).min(EXT_MAX_LEN);
            out.push((l + done, p + done as u64, len));
            done += len;
        }
    }
    out
}

/// Whether the journal needs an extent leaf block (more than four extents).
pub fn needs_leaf_block(runs: &[(u32, u64, u32)]) -> bool {
    journal_extents(runs).len() > EXTENTS_IN_INODE
}

/// What mkfs writes into inode 8 and the superblock.
#[derive(Clone, Debug)]
pub struct JournalInode {
    /// `i_block` (extent root), 60 bytes.
    pub i_block: [u8; 60],
    /// `i_size` in bytes.
    pub size_bytes: u64,
    /// Blocks the inode owns, journal plus leaf (for `i_blocks`, multiply by
    /// block_size / 512).
    pub fs_blocks: u64,
    /// The extent leaf block image to write at the leaf block, when one was
    /// needed. Its tail checksum is left for mkfs to seal when it has
    /// `metadata_csum` (the seed depends on inode 8's generation), see
    /// [`seal_leaf`].
    pub leaf: Option<(u64, Vec<u8>)>,
    /// `s_jnl_blocks`: `i_block` as 15 words, then `i_size_high`, `i_size`.
    pub jnl_blocks: [u32; 17],
}

/// `s_jnl_backup_type` to store alongside [`JournalInode::jnl_blocks`].
pub use ordo_format::superblock::JNL_BACKUP_BLOCKS;

fn put_header(buf: &mut [u8], entries: u16, max: u16, depth: u16) {
    buf[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
    buf[2..4].copy_from_slice(&entries.to_le_bytes());
    buf[4..6].copy_from_slice(&max.to_le_bytes());
    buf[6..8].copy_from_slice(&depth.to_le_bytes());
    buf[8..12].fill(0);
}

fn put_extent(buf: &mut [u8], (l, p, n): (u32, u64, u32)) {
    buf[0..4].copy_from_slice(&l.to_le_bytes());
    buf[4..6].copy_from_slice(&(n as u16).to_le_bytes());
    buf[6..8].copy_from_slice(&((p >> 32) as u16).to_le_bytes());
    buf[8..12].copy_from_slice(&(p as u32).to_le_bytes());
}

/// Build inode 8's mapping for a journal on `runs` (total length = the
/// journal's size in blocks). `leaf_block` must be given (a block mkfs
/// allocated for the inode) exactly when [`needs_leaf_block`] says so.
pub fn journal_inode(
    block_size: u32,
    runs: &[(u32, u64, u32)],
    leaf_block: Option<u64>,
) -> Result<JournalInode> {
    let exts = journal_extents(runs);
    let total: u64 = exts.iter().map(|e| e.2 as u64).sum();
    let mut expect = 0u64;
    for e in &exts {
        if e.0 as u64 != expect {
            return Err(FsError::Invalid(format!(
                "journal runs leave a hole at logical block {expect}"
            )));
        }
        expect += e.2 as u64;
    }
    if total < MIN_JOURNAL_BLOCKS as u64 || total > u32::MAX as u64 {
        return Err(FsError::Invalid(format!(
            "journal of {total} blocks (at least {MIN_JOURNAL_BLOCKS})"
        )));
    }
    let mut i_block = [0u8; 60];
    let mut leaf = None;
    if exts.len() <= EXTENTS_IN_INODE {
        if leaf_block.is_some() {
            return Err(FsError::Invalid(
                "a leaf block was given for a journal that fits in the inode".into(),
            ));
        }
        put_header(&mut i_block, exts.len() as u16, EXTENTS_IN_INODE as u16, 0);
        for (i, e) in exts.iter().enumerate() {
            put_extent(&mut i_block[12 + 12 * i..24 + 12 * i], *e);
        }
    } else {
        let Some(lb) = leaf_block else {
            return Err(FsError::Invalid(format!(
                "{} extents need a leaf block",
                exts.len()
            )));
        };
        let max = (block_size as usize - 12) / 12;
        if exts.len() > max {
            return Err(FsError::Invalid(format!(
                "{} extents do not fit in one leaf",
                exts.len()
            )));
        }
        let mut img = vec![0u8; block_size as usize];
        put_header(&mut img, exts.len() as u16, max as u16, 0);
        for (i, e) in exts.iter().enumerate() {
            put_extent(&mut img[12 + 12 * i..24 + 12 * i], *e);
        }
        put_header(&mut i_block, 1, EXTENTS_IN_INODE as u16, 1);
        // Index entry: ei_block, ei_leaf_lo, ei_leaf_hi, unused.
        i_block[12..16].copy_from_slice(&0u32.to_le_bytes());
        i_block[16..20].copy_from_slice(&(lb as u32).to_le_bytes());
        i_block[20..22].copy_from_slice(&((lb >> 32) as u16).to_le_bytes());
        leaf = Some((lb, img));
    }
    let size_bytes = total * block_size as u64;
    let mut jnl_blocks = [0u32; 17];
    for (i, w) in jnl_blocks.iter_mut().take(15).enumerate() {
        *w = u32::from_le_bytes(i_block[4 * i..4 * i + 4].try_into().expect("4"));
    }
    jnl_blocks[15] = (size_bytes >> 32) as u32;
    jnl_blocks[16] = size_bytes as u32;
    Ok(JournalInode {
        i_block,
        size_bytes,
        fs_blocks: total + leaf.is_some() as u64,
        leaf,
        jnl_blocks,
    })
}

/// Set the `metadata_csum` tail of an extent leaf of inode 8:
/// `crc32c(inode seed, block up to the tail)` where the inode seed is
/// `crc32c(crc32c(fs seed, le ino), le generation)`.
pub fn seal_leaf(leaf: &mut [u8], fs_csum_seed: u32, generation: u32) {
    let max = u16::from_le_bytes([leaf[4], leaf[5]]) as usize;
    let tail = 12 + 12 * max;
    let c = ordo_format::jbd2::jbd2_crc32c(
        fs_csum_seed,
        &ordo_format::inode::JOURNAL_INO.to_le_bytes(),
    );
    let c = ordo_format::jbd2::jbd2_crc32c(c, &generation.to_le_bytes());
    let c = ordo_format::jbd2::jbd2_crc32c(c, &leaf[..tail]);
    leaf[tail..tail + 4].copy_from_slice(&c.to_le_bytes());
}

/// Write the journal itself on `dev`: the JBD2 v2 superblock at journal
/// block 0 and zeros everywhere else, as `mke2fs` does. Returns the
/// superblock written.
pub fn write_journal(
    dev: &dyn BlockDevice,
    runs: &[(u32, u64, u32)],
    uuid: [u8; 16],
) -> Result<JournalSuperblock> {
    let bs = dev.block_size();
    let exts = journal_extents(runs);
    let total: u64 = exts.iter().map(|e| e.2 as u64).sum();
    let sb = JournalSuperblock::new_internal(bs, total as u32, uuid);
    // Zero in chunks of up to 1 MiB (or one block) per write.
    let chunk_blocks = (1u64 << 20).div_ceil(bs as u64).max(1);
    let zeros = vec![0u8; (chunk_blocks * bs as u64) as usize];
    for &(l, p, n) in &exts {
        let mut done = 0u64;
        while done < n as u64 {
            let k = (n as u64 - done).min(chunk_blocks);
            let bytes = (k * bs as u64) as usize;
            if l == 0 && done == 0 {
                // Journal block 0: the superblock.
                dev.write(p, &sb.encode(), WriteFlags::new(BlockClass::Journal))?;
                if k > 1 {
                    dev.write(
                        p + 1,
                        &zeros[..bytes - bs as usize],
                        WriteFlags::new(BlockClass::Journal),
                    )?;
                }
            } else {
                dev.write(
                    p + done,
                    &zeros[..bytes],
                    WriteFlags::new(BlockClass::Journal),
                )?;
            }
            done += k;
        }
    }
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes_match_mke2fs() {
        // Measured with mke2fs 1.47.0 (dumpe2fs "Total journal blocks").
        assert_eq!(default_journal_blocks(2047), None);
        assert_eq!(default_journal_blocks(2304), Some(1024));
        assert_eq!(default_journal_blocks(16384), Some(1024));
        assert_eq!(default_journal_blocks(33024), Some(4096));
        assert_eq!(default_journal_blocks(65536), Some(4096));
        assert_eq!(default_journal_blocks(281_600), Some(8192));
        assert_eq!(default_journal_blocks(786_432), Some(16384));
        assert_eq!(default_journal_blocks(3_145_728), Some(16384));
        assert_eq!(default_journal_blocks(1 << 40), Some(262_144));
    }

    #[test]
    fn inline_extent_root_and_backup() {
        let j = journal_inode(4096, &[(0, 1000, 4096)], None).unwrap();
        assert_eq!(&j.i_block[0..2], &[0x0A, 0xF3]);
        assert_eq!(u16::from_le_bytes([j.i_block[2], j.i_block[3]]), 1);
        assert_eq!(
            u32::from_le_bytes(j.i_block[20..24].try_into().unwrap()),
            1000
        );
        assert_eq!(j.size_bytes, 4096 * 4096);
        assert_eq!(j.jnl_blocks[16], (4096u64 * 4096) as u32);
        assert_eq!(
            j.jnl_blocks[0],
            u32::from_le_bytes(j.i_block[0..4].try_into().unwrap())
        );
        assert!(j.leaf.is_none());
        assert_eq!(j.fs_blocks, 4096);
    }

    #[test]
    fn long_runs_split_and_need_a_leaf() {
        let runs = [(0, 100_000, 262_144)];
        assert!(needs_leaf_block(&runs));
        assert!(journal_inode(4096, &runs, None).is_err());
        let j = journal_inode(4096, &runs, Some(5000)).unwrap();
        let (lb, img) = j.leaf.clone().unwrap();
        assert_eq!(lb, 5000);
        assert_eq!(u16::from_le_bytes([img[2], img[3]]), 8);
        assert_eq!(u16::from_le_bytes([j.i_block[6], j.i_block[7]]), 1);
        assert_eq!(j.fs_blocks, 262_145);
        let mut leaf = img.clone();
        seal_leaf(&mut leaf, 1234, 0);
        assert_ne!(leaf, img);
    }

    #[test]
    fn holes_and_tiny_journals_are_refused() {
        assert!(journal_inode(4096, &[(0, 10, 600), (601, 700, 600)], None).is_err());
        assert!(journal_inode(4096, &[(0, 10, 100)], None).is_err());
    }
}
