//! ext4 inodes: the 128-byte base plus `i_extra_isize` bytes of extra fields
//! (nanosecond timestamps, creation time, checksum high half, project id),
//! and the in-inode extended-attribute area after them.
//!
//! Decoding keeps the raw `s_inode_size` bytes; encoding patches known
//! fields into them, so in-inode xattrs and fields ordo does not model are
//! preserved. A field that lies beyond `i_extra_isize` does not exist on
//! disk: it decodes as zero and encoding drops it, as the kernel does.

use crate::csum::{ext4_crc32c, inode_csum_seed};
use crate::le::*;
use crate::{FormatError, Result};

/// Size of the base inode (revision 0).
pub const GOOD_OLD_INODE_SIZE: usize = 128;
/// Bytes of `i_block`.
pub const I_BLOCK_SIZE: usize = 60;
/// `i_extra_isize` that covers every extra field ordo knows (through `i_projid`).
pub const EXTRA_ISIZE_FULL: u16 = 32;

/// Reserved inode numbers.
pub const BAD_INO: u32 = 1;
pub const ROOT_INO: u32 = 2;
pub const USR_QUOTA_INO: u32 = 3;
pub const GRP_QUOTA_INO: u32 = 4;
pub const BOOT_LOADER_INO: u32 = 5;
pub const UNDEL_DIR_INO: u32 = 6;
pub const RESIZE_INO: u32 = 7;
pub const JOURNAL_INO: u32 = 8;
pub const EXCLUDE_INO: u32 = 9;
pub const REPLICA_INO: u32 = 10;
/// lost+found as mke2fs creates it (the first non-reserved inode).
pub const LOST_AND_FOUND_INO: u32 = 11;

/// `i_flags` bits.
pub mod flags {
    pub const SECRM: u32 = 0x0000_0001;
    pub const UNRM: u32 = 0x0000_0002;
    pub const COMPR: u32 = 0x0000_0004;
    pub const SYNC: u32 = 0x0000_0008;
    pub const IMMUTABLE: u32 = 0x0000_0010;
    pub const APPEND: u32 = 0x0000_0020;
    pub const NODUMP: u32 = 0x0000_0040;
    pub const NOATIME: u32 = 0x0000_0080;
    pub const ENCRYPT: u32 = 0x0000_0800;
    /// Hash-indexed directory (htree).
    pub const INDEX: u32 = 0x0000_1000;
    pub const IMAGIC: u32 = 0x0000_2000;
    pub const JOURNAL_DATA: u32 = 0x0000_4000;
    pub const NOTAIL: u32 = 0x0000_8000;
    pub const DIRSYNC: u32 = 0x0001_0000;
    pub const TOPDIR: u32 = 0x0002_0000;
    /// `i_blocks` counts file-system blocks, not 512-byte sectors.
    pub const HUGE_FILE: u32 = 0x0004_0000;
    /// `i_block` holds an extent tree.
    pub const EXTENTS: u32 = 0x0008_0000;
    pub const VERITY: u32 = 0x0010_0000;
    pub const EA_INODE: u32 = 0x0020_0000;
    pub const DAX: u32 = 0x0200_0000;
    pub const INLINE_DATA: u32 = 0x1000_0000;
    pub const PROJINHERIT: u32 = 0x2000_0000;
    pub const CASEFOLD: u32 = 0x4000_0000;
}

/// `S_IFMT` and the file-type bits of `i_mode`.
pub mod mode {
    pub const S_IFMT: u16 = 0o170000;
    pub const S_IFSOCK: u16 = 0o140000;
    pub const S_IFLNK: u16 = 0o120000;
    pub const S_IFREG: u16 = 0o100000;
    pub const S_IFBLK: u16 = 0o060000;
    pub const S_IFDIR: u16 = 0o040000;
    pub const S_IFCHR: u16 = 0o020000;
    pub const S_IFIFO: u16 = 0o010000;
}

/// Field offsets of `struct ext4_inode`.
#[allow(missing_docs)]
pub mod off {
    pub const MODE: usize = 0x00;
    pub const UID: usize = 0x02;
    pub const SIZE_LO: usize = 0x04;
    pub const ATIME: usize = 0x08;
    pub const CTIME: usize = 0x0C;
    pub const MTIME: usize = 0x10;
    pub const DTIME: usize = 0x14;
    pub const GID: usize = 0x18;
    pub const LINKS_COUNT: usize = 0x1A;
    pub const BLOCKS_LO: usize = 0x1C;
    pub const FLAGS: usize = 0x20;
    pub const VERSION: usize = 0x24;
    pub const BLOCK: usize = 0x28;
    pub const GENERATION: usize = 0x64;
    pub const FILE_ACL_LO: usize = 0x68;
    pub const SIZE_HIGH: usize = 0x6C;
    pub const OBSO_FADDR: usize = 0x70;
    pub const BLOCKS_HIGH: usize = 0x74;
    pub const FILE_ACL_HIGH: usize = 0x76;
    pub const UID_HIGH: usize = 0x78;
    pub const GID_HIGH: usize = 0x7A;
    pub const CHECKSUM_LO: usize = 0x7C;
    pub const EXTRA_ISIZE: usize = 0x80;
    pub const CHECKSUM_HI: usize = 0x82;
    pub const CTIME_EXTRA: usize = 0x84;
    pub const MTIME_EXTRA: usize = 0x88;
    pub const ATIME_EXTRA: usize = 0x8C;
    pub const CRTIME: usize = 0x90;
    pub const CRTIME_EXTRA: usize = 0x94;
    pub const VERSION_HI: usize = 0x98;
    pub const PROJID: usize = 0x9C;
}

/// A timestamp as ext4 stores it: 32-bit seconds extended by 2 epoch bits
/// (years 1901..2446) and 30 bits of nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    /// Decode from the 32-bit seconds field and the extra field.
    pub fn decode(secs: u32, extra: u32) -> Timestamp {
        let epoch = i64::from(extra & 3);
        Timestamp {
            sec: i64::from(secs as i32) + (epoch << 32),
            nsec: (extra >> 2).min(999_999_999),
        }
    }
    /// Encode as (seconds field, extra field).
    pub fn encode(self) -> (u32, u32) {
        let secs = self.sec as i32;
        let epoch = ((self.sec - i64::from(secs)) >> 32) as u32 & 3;
        (secs as u32, epoch | (self.nsec.min(999_999_999) << 2))
    }
}

/// A decoded inode. Edit the public fields and call [`Inode::encode_into`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    raw: Vec<u8>,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub ctime: Timestamp,
    pub mtime: Timestamp,
    /// Creation time (zero when `i_extra_isize` does not cover it).
    pub crtime: Timestamp,
    /// Deletion time, or the next inode on the orphan list.
    pub dtime: u32,
    pub links_count: u16,
    /// 48-bit `i_blocks`, in 512-byte sectors, or in file-system blocks when
    /// the inode has `HUGE_FILE`.
    pub blocks: u64,
    pub flags: u32,
    /// `i_version` (osd1, plus `i_version_hi` when present).
    pub version: u64,
    /// The 60 raw bytes of `i_block`: extent tree root, fast symlink target,
    /// or device number.
    pub block: [u8; I_BLOCK_SIZE],
    pub generation: u32,
    /// Extended attribute block (48-bit).
    pub file_acl: u64,
    /// Bytes of extra fields past the 128-byte base (0 for 128-byte inodes).
    pub extra_isize: u16,
    pub projid: u32,
    /// The checksum as read (lo, and hi when present).
    pub checksum: u32,
}

fn bad(field: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::new(field, detail)
}

impl Inode {
    /// A zeroed inode of `inode_size` bytes whose extra area covers
    /// `extra_isize` bytes (0 for 128-byte inodes).
    pub fn new(inode_size: u16, extra_isize: u16) -> Inode {
        let isz = usize::from(inode_size);
        assert!(isz >= GOOD_OLD_INODE_SIZE && isz.is_power_of_two());
        let extra = if isz > GOOD_OLD_INODE_SIZE {
            extra_isize
        } else {
            0
        };
        assert!(GOOD_OLD_INODE_SIZE + usize::from(extra) <= isz && extra % 4 == 0);
        let mut raw = vec![0u8; isz];
        if isz > GOOD_OLD_INODE_SIZE {
            put_u16(&mut raw, off::EXTRA_ISIZE, extra);
        }
        Inode::decode(&raw).expect("a zeroed inode is valid")
    }

    /// Decode an inode slot (`s_inode_size` bytes). Validates the extra
    /// size only; checksums are checked by [`verify_inode_checksum`].
    pub fn decode(raw: &[u8]) -> Result<Inode> {
        check_inode_len(raw)?;
        let b = raw;
        let extra_isize = if b.len() > GOOD_OLD_INODE_SIZE {
            u16_at(b, off::EXTRA_ISIZE)
        } else {
            0
        };
        if GOOD_OLD_INODE_SIZE + usize::from(extra_isize) > b.len() || extra_isize % 4 != 0 {
            return Err(bad(
                "inode i_extra_isize",
                format!("{extra_isize} with {}-byte inodes", b.len()),
            ));
        }
        let has = |field_off: usize, len: usize| -> bool {
            field_off + len <= GOOD_OLD_INODE_SIZE + usize::from(extra_isize)
        };
        let x32 = |o: usize| if has(o, 4) { u32_at(b, o) } else { 0 };
        let mut block = [0u8; I_BLOCK_SIZE];
        block.copy_from_slice(&b[off::BLOCK..off::BLOCK + I_BLOCK_SIZE]);
        let checksum = u32::from(u16_at(b, off::CHECKSUM_LO))
            | if has(off::CHECKSUM_HI, 2) {
                u32::from(u16_at(b, off::CHECKSUM_HI)) << 16
            } else {
                0
            };
        Ok(Inode {
            mode: u16_at(b, off::MODE),
            uid: u32::from(u16_at(b, off::UID)) | (u32::from(u16_at(b, off::UID_HIGH)) << 16),
            gid: u32::from(u16_at(b, off::GID)) | (u32::from(u16_at(b, off::GID_HIGH)) << 16),
            size: u64::from(u32_at(b, off::SIZE_LO)) | (u64::from(u32_at(b, off::SIZE_HIGH)) << 32),
            atime: Timestamp::decode(u32_at(b, off::ATIME), x32(off::ATIME_EXTRA)),
            ctime: Timestamp::decode(u32_at(b, off::CTIME), x32(off::CTIME_EXTRA)),
            mtime: Timestamp::decode(u32_at(b, off::MTIME), x32(off::MTIME_EXTRA)),
            crtime: if has(off::CRTIME, 4) {
                Timestamp::decode(u32_at(b, off::CRTIME), x32(off::CRTIME_EXTRA))
            } else {
                Timestamp::default()
            },
            dtime: u32_at(b, off::DTIME),
            links_count: u16_at(b, off::LINKS_COUNT),
            blocks: u64::from(u32_at(b, off::BLOCKS_LO))
                | (u64::from(u16_at(b, off::BLOCKS_HIGH)) << 32),
            flags: u32_at(b, off::FLAGS),
            version: u64::from(u32_at(b, off::VERSION)) | (u64::from(x32(off::VERSION_HI)) << 32),
            block,
            generation: u32_at(b, off::GENERATION),
            file_acl: u64::from(u32_at(b, off::FILE_ACL_LO))
                | (u64::from(u16_at(b, off::FILE_ACL_HIGH)) << 32),
            extra_isize,
            projid: x32(off::PROJID),
            checksum,
            raw: raw.to_vec(),
        })
    }

    /// The inode's size on disk (`s_inode_size`).
    pub fn inode_size(&self) -> usize {
        self.raw.len()
    }

    /// The raw bytes this inode was decoded from (or created as).
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    fn has_field(&self, field_off: usize, len: usize) -> bool {
        field_off + len <= GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize)
            && field_off + len <= self.raw.len()
    }

    /// Patch every known field into `out` (the inode's slot in the inode
    /// table, `s_inode_size` bytes, normally holding the bytes this inode was
    /// decoded from) and, when `csum` is `Some((fs_seed, ino))`, set the
    /// checksum. Bytes past the known fields are left as they are in `out`.
    pub fn encode_into(&self, out: &mut [u8], csum: Option<(u32, u32)>) {
        assert_eq!(out.len(), self.raw.len(), "inode slot size");
        assert!(
            self.blocks < 1 << 48 && self.file_acl < 1 << 48,
            "48-bit fields overflow"
        );
        let b = out;
        put_u16(b, off::MODE, self.mode);
        put_u16(b, off::UID, self.uid as u16);
        put_u16(b, off::UID_HIGH, (self.uid >> 16) as u16);
        put_u16(b, off::GID, self.gid as u16);
        put_u16(b, off::GID_HIGH, (self.gid >> 16) as u16);
        put_u32(b, off::SIZE_LO, self.size as u32);
        put_u32(b, off::SIZE_HIGH, (self.size >> 32) as u32);
        let times = [
            (off::ATIME, off::ATIME_EXTRA, self.atime),
            (off::CTIME, off::CTIME_EXTRA, self.ctime),
            (off::MTIME, off::MTIME_EXTRA, self.mtime),
        ];
        for (lo, extra, t) in times {
            let (s, x) = t.encode();
            put_u32(b, lo, s);
            if self.has_field(extra, 4) {
                put_u32(b, extra, x);
            }
        }
        if self.has_field(off::CRTIME, 4) {
            let (s, x) = self.crtime.encode();
            put_u32(b, off::CRTIME, s);
            if self.has_field(off::CRTIME_EXTRA, 4) {
                put_u32(b, off::CRTIME_EXTRA, x);
            }
        }
        put_u32(b, off::DTIME, self.dtime);
        put_u16(b, off::LINKS_COUNT, self.links_count);
        put_u32(b, off::BLOCKS_LO, self.blocks as u32);
        put_u16(b, off::BLOCKS_HIGH, (self.blocks >> 32) as u16);
        put_u32(b, off::FLAGS, self.flags);
        put_u32(b, off::VERSION, self.version as u32);
        if self.has_field(off::VERSION_HI, 4) {
            put_u32(b, off::VERSION_HI, (self.version >> 32) as u32);
        }
        b[off::BLOCK..off::BLOCK + I_BLOCK_SIZE].copy_from_slice(&self.block);
        put_u32(b, off::GENERATION, self.generation);
        put_u32(b, off::FILE_ACL_LO, self.file_acl as u32);
        put_u16(b, off::FILE_ACL_HIGH, (self.file_acl >> 32) as u16);
        if b.len() > GOOD_OLD_INODE_SIZE {
            put_u16(b, off::EXTRA_ISIZE, self.extra_isize);
        }
        if self.has_field(off::PROJID, 4) {
            put_u32(b, off::PROJID, self.projid);
        }
        if let Some((seed, ino)) = csum {
            set_inode_checksum(b, seed, ino);
        }
    }

    /// Encode into a copy of the raw bytes.
    pub fn encode(&self, csum: Option<(u32, u32)>) -> Vec<u8> {
        let mut out = self.raw.clone();
        self.encode_into(&mut out, csum);
        out
    }

    /// `i_mode & S_IFMT`.
    pub fn file_format(&self) -> u16 {
        self.mode & mode::S_IFMT
    }
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.file_format() == mode::S_IFDIR
    }
    /// A regular file.
    pub fn is_reg(&self) -> bool {
        self.file_format() == mode::S_IFREG
    }
    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.file_format() == mode::S_IFLNK
    }
    /// A character or block device.
    pub fn is_device(&self) -> bool {
        matches!(self.file_format(), mode::S_IFCHR | mode::S_IFBLK)
    }
    /// Whether a flag is set.
    pub fn has_flag(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }
    /// `i_block` holds an extent tree.
    pub fn uses_extents(&self) -> bool {
        self.has_flag(flags::EXTENTS)
    }

    /// `i_blocks` in 512-byte sectors, given the file-system block size
    /// (converts when the inode is flagged `HUGE_FILE`).
    pub fn blocks_512(&self, block_size: u32) -> u64 {
        if self.has_flag(flags::HUGE_FILE) {
            self.blocks * u64::from(block_size / 512)
        } else {
            self.blocks
        }
    }
    /// Set `i_blocks` from a count of 512-byte sectors. Counts that do not
    /// fit 48 bits switch the inode to `HUGE_FILE` units (needs the
    /// `huge_file` feature; the caller checks). Returns false if it cannot fit.
    pub fn set_blocks_512(&mut self, sectors: u64, block_size: u32) -> bool {
        if sectors < 1 << 48 {
            self.blocks = sectors;
            self.flags &= !flags::HUGE_FILE;
            true
        } else {
            let per = u64::from(block_size / 512);
            let fs_blocks = sectors.div_ceil(per);
            if fs_blocks >= 1 << 48 {
                return false;
            }
            self.blocks = fs_blocks;
            self.flags |= flags::HUGE_FILE;
            true
        }
    }

    /// A fast symlink: the target is stored in `i_block`. Decided as the
    /// kernel does (`ext4_inode_is_fast_symlink`): a symlink without inline
    /// data that owns no blocks besides its xattr block. `block_size` sizes
    /// that xattr block.
    pub fn is_fast_symlink(&self, block_size: u32) -> bool {
        if !self.is_symlink() || self.has_flag(flags::INLINE_DATA) {
            return false;
        }
        if self.has_flag(flags::EA_INODE) {
            return self.size > 0 && (self.size as usize) < I_BLOCK_SIZE;
        }
        let ea_sectors = if self.file_acl != 0 {
            u64::from(block_size / 512)
        } else {
            0
        };
        self.blocks_512(block_size) == ea_sectors
    }
    /// The target of a fast symlink.
    pub fn fast_symlink_target(&self, block_size: u32) -> Result<&[u8]> {
        if !self.is_fast_symlink(block_size) {
            return Err(bad("inode i_block", "not a fast symlink"));
        }
        if self.size as usize >= I_BLOCK_SIZE {
            return Err(bad(
                "inode i_size",
                format!("{} bytes for a fast symlink (max 59)", self.size),
            ));
        }
        Ok(&self.block[..self.size as usize])
    }
    /// Make this a fast symlink to `target` (< 60 bytes): target in
    /// `i_block`, size set, EXTENTS flag cleared.
    pub fn set_fast_symlink(&mut self, target: &[u8]) {
        assert!(target.len() < I_BLOCK_SIZE, "fast symlink target too long");
        self.block = [0; I_BLOCK_SIZE];
        self.block[..target.len()].copy_from_slice(target);
        self.size = target.len() as u64;
        self.blocks = 0;
        self.flags &= !(flags::EXTENTS | flags::HUGE_FILE);
    }

    /// The device number (major, minor) of a device inode.
    pub fn device(&self) -> (u32, u32) {
        decode_dev(&self.block)
    }
    /// Store a device number in `i_block`, in the old encoding when major and
    /// minor both fit in 8 bits (as the kernel does), else the new one.
    pub fn set_device(&mut self, major: u32, minor: u32) {
        self.block = [0; I_BLOCK_SIZE];
        encode_dev(&mut self.block, major, minor);
        self.flags &= !flags::EXTENTS;
    }
}

/// Decode (major, minor) from `i_block`: word 0 holds the old 16-bit
/// encoding, or is zero and word 1 holds the new 32-bit encoding.
pub fn decode_dev(block: &[u8; I_BLOCK_SIZE]) -> (u32, u32) {
    let w0 = u32_at(block, 0);
    if w0 != 0 {
        ((w0 >> 8) & 0xFF, w0 & 0xFF)
    } else {
        let d = u32_at(block, 4);
        ((d & 0xFFF00) >> 8, (d & 0xFF) | ((d >> 12) & 0xFFF00))
    }
}

/// Encode (major, minor) into `i_block`, as `ext4_encode_dev` does.
pub fn encode_dev(block: &mut [u8; I_BLOCK_SIZE], major: u32, minor: u32) {
    if major < 256 && minor < 256 {
        put_u32(block, 0, (major << 8) | minor);
        put_u32(block, 4, 0);
    } else {
        put_u32(block, 0, 0);
        let d = (minor & 0xFF) | ((major & 0xFFF) << 8) | ((minor & !0xFF) << 12);
        put_u32(block, 4, d);
    }
}

/// Inode slots are a power of two of at least 128 bytes.
fn check_inode_len(raw: &[u8]) -> Result<()> {
    if raw.len() < GOOD_OLD_INODE_SIZE || !raw.len().is_power_of_two() {
        return Err(bad(
            "inode",
            format!("{} bytes, need a power of two of at least 128", raw.len()),
        ));
    }
    Ok(())
}

fn fits_checksum_hi(raw: &[u8]) -> bool {
    raw.len() > GOOD_OLD_INODE_SIZE
        && usize::from(u16_at(raw, off::EXTRA_ISIZE)) + GOOD_OLD_INODE_SIZE >= off::CHECKSUM_HI + 2
}

/// The checksum an inode slot should carry (32 bits; only the low 16 are
/// stored when `i_extra_isize` does not cover `i_checksum_hi`).
pub fn inode_checksum(raw: &[u8], fs_seed: u32, ino: u32) -> u32 {
    let gen = u32_at(raw, off::GENERATION);
    let mut c = inode_csum_seed(fs_seed, ino, gen);
    c = ext4_crc32c(c, &raw[..off::CHECKSUM_LO]);
    c = ext4_crc32c(c, &[0, 0]);
    c = ext4_crc32c(c, &raw[off::CHECKSUM_LO + 2..GOOD_OLD_INODE_SIZE]);
    if raw.len() > GOOD_OLD_INODE_SIZE {
        c = ext4_crc32c(c, &raw[GOOD_OLD_INODE_SIZE..off::CHECKSUM_HI]);
        let mut rest = off::CHECKSUM_HI;
        if fits_checksum_hi(raw) {
            c = ext4_crc32c(c, &[0, 0]);
            rest += 2;
        }
        c = ext4_crc32c(c, &raw[rest..]);
    }
    c
}

/// Compute and store the checksum of an inode slot.
pub fn set_inode_checksum(raw: &mut [u8], fs_seed: u32, ino: u32) {
    let c = inode_checksum(raw, fs_seed, ino);
    put_u16(raw, off::CHECKSUM_LO, c as u16);
    if fits_checksum_hi(raw) {
        put_u16(raw, off::CHECKSUM_HI, (c >> 16) as u16);
    }
}

/// Check an inode slot's checksum. An all-zero slot (never used) is
/// accepted, as e2fsprogs does.
pub fn verify_inode_checksum(raw: &[u8], fs_seed: u32, ino: u32) -> Result<()> {
    check_inode_len(raw)?;
    let hi = fits_checksum_hi(raw);
    if raw.len() > GOOD_OLD_INODE_SIZE
        && GOOD_OLD_INODE_SIZE + usize::from(u16_at(raw, off::EXTRA_ISIZE)) > raw.len()
    {
        return Err(bad("inode i_extra_isize", "past the end of the inode"));
    }
    let mut stored = u32::from(u16_at(raw, off::CHECKSUM_LO));
    let mut want = inode_checksum(raw, fs_seed, ino);
    if hi {
        stored |= u32::from(u16_at(raw, off::CHECKSUM_HI)) << 16;
    } else {
        want &= 0xFFFF;
    }
    if stored != want {
        if raw.iter().all(|&x| x == 0) {
            return Ok(());
        }
        return Err(bad(
            "inode i_checksum",
            format!("inode {ino}: stored {stored:#010x}, computed {want:#010x}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Inode {
        let mut i = Inode::new(256, EXTRA_ISIZE_FULL);
        i.mode = mode::S_IFREG | 0o644;
        i.uid = 0x1_0005;
        i.gid = 0x2_0007;
        i.size = 0x1_0000_0001;
        i.atime = Timestamp { sec: -5, nsec: 1 };
        i.mtime = Timestamp {
            sec: 0x3_0000_0000,
            nsec: 999_999_999,
        };
        i.ctime = Timestamp {
            sec: 1_700_000_000,
            nsec: 123,
        };
        i.crtime = Timestamp { sec: 7, nsec: 8 };
        i.links_count = 3;
        i.blocks = 0x1234_5678_9ABC;
        i.flags = flags::EXTENTS;
        i.generation = 0xCAFE;
        i.file_acl = 0x1_0000_0002;
        i.version = 0x5_0000_0006;
        i.projid = 42;
        i
    }

    #[test]
    fn round_trip_with_checksum() {
        let i = sample();
        let bytes = i.encode(Some((0xFEED, 12)));
        verify_inode_checksum(&bytes, 0xFEED, 12).unwrap();
        let back = Inode::decode(&bytes).unwrap();
        assert_eq!(
            Inode {
                checksum: 0,
                raw: Vec::new(),
                ..back.clone()
            },
            Inode {
                raw: Vec::new(),
                ..i
            }
        );
        assert_eq!(back.encode(Some((0xFEED, 12))), bytes);
        // Wrong inode number, seed or a flipped byte all fail.
        assert!(verify_inode_checksum(&bytes, 0xFEED, 13).is_err());
        assert!(verify_inode_checksum(&bytes, 0xFEEE, 12).is_err());
        for pos in [0usize, 0x7D, 0x83, 0xA0, 0xFF] {
            let mut b = bytes.clone();
            b[pos] ^= 0x10;
            assert!(verify_inode_checksum(&b, 0xFEED, 12).is_err(), "byte {pos}");
        }
    }

    #[test]
    fn in_inode_xattrs_survive() {
        let mut raw = sample().encode(None);
        raw[0xA0..0xA4].copy_from_slice(&0xEA02_0000u32.to_le_bytes());
        raw[0xB0] = 0x77;
        let mut i = Inode::decode(&raw).unwrap();
        i.size = 5;
        let out = i.encode(None);
        assert_eq!(&out[0xA0..0xA4], &0xEA02_0000u32.to_le_bytes());
        assert_eq!(out[0xB0], 0x77);
    }

    #[test]
    fn small_extra_isize_drops_fields() {
        let mut i = Inode::new(256, 4);
        i.mtime = Timestamp { sec: 10, nsec: 500 };
        i.crtime = Timestamp { sec: 10, nsec: 500 };
        let bytes = i.encode(Some((1, 2)));
        verify_inode_checksum(&bytes, 1, 2).unwrap();
        let back = Inode::decode(&bytes).unwrap();
        assert_eq!(back.mtime, Timestamp { sec: 10, nsec: 0 });
        assert_eq!(back.crtime, Timestamp::default());
        // 128-byte inodes: only the low 16 bits of the checksum exist.
        let i = Inode::new(128, 0);
        let bytes = i.encode(Some((1, 2)));
        assert_eq!(bytes.len(), 128);
        verify_inode_checksum(&bytes, 1, 2).unwrap();
    }

    #[test]
    fn bad_extra_isize_is_an_error() {
        let mut raw = vec![0u8; 256];
        raw[off::EXTRA_ISIZE] = 200;
        assert_eq!(
            Inode::decode(&raw).unwrap_err().field,
            "inode i_extra_isize"
        );
        raw[off::EXTRA_ISIZE] = 6;
        assert!(Inode::decode(&raw).is_err());
    }

    #[test]
    fn timestamps_cover_the_epoch_range() {
        for sec in [
            -0x8000_0000i64,
            -1,
            0,
            0x7FFF_FFFF,
            0x8000_0000,
            0x3_7FFF_FFFF,
        ] {
            let t = Timestamp { sec, nsec: 42 };
            let (s, x) = t.encode();
            assert_eq!(Timestamp::decode(s, x), t, "sec {sec}");
        }
    }

    #[test]
    fn device_numbers_old_and_new() {
        let mut i = Inode::new(256, 32);
        i.mode = mode::S_IFCHR | 0o600;
        i.set_device(1, 3);
        assert_eq!(u32_at(&i.block, 0), 0x0103);
        assert_eq!(i.device(), (1, 3));
        i.set_device(259, 0x12345);
        assert_eq!(u32_at(&i.block, 0), 0);
        assert_eq!(i.device(), (259, 0x12345));
    }

    #[test]
    fn fast_symlink() {
        let mut i = Inode::new(256, 32);
        i.mode = mode::S_IFLNK | 0o777;
        i.flags = flags::EXTENTS;
        i.set_fast_symlink(b"/target");
        assert!(i.is_fast_symlink(4096));
        assert_eq!(i.fast_symlink_target(4096).unwrap(), b"/target");
        // An xattr block does not make it slow; a data block does.
        i.file_acl = 77;
        i.blocks = 8;
        assert!(i.is_fast_symlink(4096));
        i.blocks = 16;
        assert!(!i.is_fast_symlink(4096));
        assert!(i.fast_symlink_target(4096).is_err());
        i.blocks = 8;
        i.size = 100;
        assert!(i.fast_symlink_target(4096).is_err());
    }

    #[test]
    fn huge_file_blocks() {
        let mut i = Inode::new(256, 32);
        assert!(i.set_blocks_512(1 << 49, 4096));
        assert!(i.has_flag(flags::HUGE_FILE));
        assert_eq!(i.blocks_512(4096), 1 << 49);
        assert!(i.set_blocks_512(16, 4096));
        assert_eq!(i.blocks, 16);
        assert!(!i.has_flag(flags::HUGE_FILE));
    }
}
