//! The owner table of `mode=backpointers`: one 20-byte record per block of
//! the file system, naming the file block (or the inode's attribute block,
//! logical block `XATTR_LBLK`) it holds and binding it to the block's
//! contents by a checksum. Its layout is docs/FORMAT.md, "Owner
//! table".
//!
//! ```text
//! header block (table block 0):
//!   0  magic "ORDOBPT1"        8  u32 version (3)   12 u32 records per block
//!  16  u64 blocks covered     24  u32 s_mnt_count   28 u32 s_mtime   (this mount)
//!  32  u32 s_mnt_count before 36  u32 s_mtime before                 (the mount before)
//!  bs-4 u32 crc32c of bytes 0..bs-4
//! record block k (table block 1 + k):
//!   0  magic "OBPR"   4 u32 k   8 u32 0   12 u32 crc32c of the block (this field 0)
//!  16  records: u32 ino, u32 generation, u32 lblk, u32 crc32c(data),
//!      u32 crc32c of the version before (0: none); ino 0 = no record
//! ```

use crate::update::BlockOwner;

/// First eight bytes of the header block.
pub const MAGIC: &[u8; 8] = b"ORDOBPT1";
/// First four bytes of every record block.
pub const RECORD_MAGIC: &[u8; 4] = b"OBPR";
/// Format version.
pub const VERSION: u32 = 3;
/// Bytes of a record.
pub const RECORD_BYTES: usize = 20;
/// Bytes before the first record of a record block.
pub const RECORD_HEADER: usize = 16;

/// One record: the owner and the checksum of the contents it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub owner: BlockOwner,
    /// The contents checksum of the version written with this record.
    pub crc: u32,
    /// The checksum of the owner's version before it that a flush made
    /// durable (0: none): while the new version is in flight the disk
    /// may hold either.
    pub prev: u32,
}

/// Records per table block of `bs` bytes.
pub fn per_block(bs: u32) -> u64 {
    ((bs as usize - RECORD_HEADER) / RECORD_BYTES) as u64
}

/// Table blocks (header included) for `blocks` file-system blocks.
pub fn table_blocks(bs: u32, blocks: u64) -> u64 {
    1 + blocks.div_ceil(per_block(bs))
}

/// The contents checksum a record carries.
pub fn data_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub per_block: u32,
    pub blocks: u64,
    pub stamp: (u32, u32),
    pub before: (u32, u32),
}

impl Header {
    /// Decode and verify a header block (`Err`: what is wrong).
    pub fn decode(b: &[u8]) -> Result<Header, String> {
        let bs = b.len();
        if &b[..8] != MAGIC {
            return Err("magic is not ORDOBPT1".into());
        }
        let stored = le32(b, bs - 4);
        let computed = crc32c::crc32c(&b[..bs - 4]);
        if stored != computed {
            return Err(format!(
                "checksum stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        if le32(b, 8) != VERSION {
            return Err(format!("version {} (ordo reads {VERSION})", le32(b, 8)));
        }
        Ok(Header {
            per_block: le32(b, 12),
            blocks: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            stamp: (le32(b, 24), le32(b, 28)),
            before: (le32(b, 32), le32(b, 36)),
        })
    }

    /// Encode into a block of `bs` bytes.
    pub fn encode(&self, bs: usize) -> Vec<u8> {
        let mut b = vec![0u8; bs];
        b[..8].copy_from_slice(MAGIC);
        put32(&mut b, 8, VERSION);
        put32(&mut b, 12, self.per_block);
        b[16..24].copy_from_slice(&self.blocks.to_le_bytes());
        put32(&mut b, 24, self.stamp.0);
        put32(&mut b, 28, self.stamp.1);
        put32(&mut b, 32, self.before.0);
        put32(&mut b, 36, self.before.1);
        let crc = crc32c::crc32c(&b[..bs - 4]);
        put32(&mut b, bs - 4, crc);
        b
    }
}

/// An empty record block `k`.
pub fn empty_record_block(bs: usize, k: u64) -> Vec<u8> {
    let mut b = vec![0u8; bs];
    b[..4].copy_from_slice(RECORD_MAGIC);
    put32(&mut b, 4, k as u32);
    seal_record_block(&mut b);
    b
}

/// Recompute a record block's checksum.
pub fn seal_record_block(b: &mut [u8]) {
    put32(b, 12, 0);
    let crc = crc32c::crc32c(b);
    put32(b, 12, crc);
}

/// Verify record block `k` (`Err`: what is wrong).
pub fn check_record_block(b: &[u8], k: u64) -> Result<(), String> {
    if &b[..4] != RECORD_MAGIC {
        return Err("magic is not OBPR".into());
    }
    if u64::from(le32(b, 4)) != k {
        return Err(format!("names table block {}, not {k}", le32(b, 4)));
    }
    let stored = le32(b, 12);
    let mut copy = b.to_vec();
    put32(&mut copy, 12, 0);
    let computed = crc32c::crc32c(&copy);
    if stored != computed {
        return Err(format!(
            "checksum stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    Ok(())
}

/// Record `slot` of a record block.
pub fn get(b: &[u8], slot: usize) -> Option<Record> {
    let at = RECORD_HEADER + slot * RECORD_BYTES;
    let ino = le32(b, at);
    (ino != 0).then(|| Record {
        owner: BlockOwner {
            ino,
            generation: le32(b, at + 4),
            lblk: le32(b, at + 8),
        },
        crc: le32(b, at + 12),
        prev: le32(b, at + 16),
    })
}

/// Set record `slot` of a record block (`None`: clear it). The block's
/// checksum is left to [`seal_record_block`].
pub fn put(b: &mut [u8], slot: usize, r: Option<Record>) {
    let at = RECORD_HEADER + slot * RECORD_BYTES;
    let (ino, generation, lblk, crc, prev) = match r {
        Some(r) => (r.owner.ino, r.owner.generation, r.owner.lblk, r.crc, r.prev),
        None => (0, 0, 0, 0, 0),
    };
    put32(b, at, ino);
    put32(b, at + 4, generation);
    put32(b, at + 8, lblk);
    put32(b, at + 12, crc);
    put32(b, at + 16, prev);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_corruption() {
        let h = Header {
            per_block: per_block(4096) as u32,
            blocks: 8192,
            stamp: (3, 100),
            before: (2, 90),
        };
        let mut b = h.encode(4096);
        assert_eq!(Header::decode(&b), Ok(h));
        b[20] ^= 1;
        assert!(Header::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn records_round_trip_and_blocks_detect_corruption() {
        let mut b = empty_record_block(4096, 7);
        assert_eq!(check_record_block(&b, 7), Ok(()));
        assert!(check_record_block(&b, 8).is_err());
        let r = Record {
            owner: BlockOwner {
                ino: 12,
                generation: 0xdead,
                lblk: 3,
            },
            crc: 42,
            prev: 7,
        };
        put(&mut b, 203, Some(r));
        seal_record_block(&mut b);
        assert_eq!(get(&b, 203), Some(r));
        assert_eq!(get(&b, 0), None);
        b[100] ^= 1;
        assert!(check_record_block(&b, 7).is_err());
        assert_eq!(per_block(4096), 204);
        assert_eq!(table_blocks(4096, 8192), 1 + 41);
    }
}
