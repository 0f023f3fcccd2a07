//! Recognizable file data.
//!
//! Every byte a workload writes is a function of (file, write, offset), so
//! that any block read back after a crash can be attributed: the oracle can
//! tell "old data of this file", "new data of this file", "zeros" and "bytes
//! that never belonged to this file" apart, and a report can name the file
//! and the write a foreign block came from.
//!
//! The file is tiled with 16-byte records aligned to file offsets:
//!
//! ```text
//!  0      4          8           12            16
//!  | "OrD" tag | file id u32 | write seq u32 | offset/16 u32 |
//! ```
//!
//! A write of `[off, off+len)` stores exactly the bytes of those records that
//! fall inside its range, so unaligned writes still carry their offset. The
//! tag is never all-zero, so a record can not be mistaken for a hole.

/// Size of one record in bytes.
pub const RECORD_BYTES: u64 = 16;
/// The first four bytes of every record.
pub const TAG: [u8; 4] = *b"OrD\x01";

/// Who wrote a record, as decoded from the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The model's file id.
    pub file_id: u32,
    /// The write's sequence number in the workload.
    pub write_seq: u32,
    /// File offset the record was written for.
    pub offset: u64,
}

/// The byte at file offset `offset` of a write `write_seq` to file `file_id`.
pub fn byte_at(file_id: u32, write_seq: u32, offset: u64) -> u8 {
    let record = record(file_id, write_seq, offset - offset % RECORD_BYTES);
    record[(offset % RECORD_BYTES) as usize]
}

/// The 16-byte record starting at the aligned file offset `aligned`.
pub fn record(file_id: u32, write_seq: u32, aligned: u64) -> [u8; 16] {
    debug_assert_eq!(aligned % RECORD_BYTES, 0);
    let mut r = [0u8; 16];
    r[0..4].copy_from_slice(&TAG);
    r[4..8].copy_from_slice(&file_id.to_le_bytes());
    r[8..12].copy_from_slice(&write_seq.to_le_bytes());
    r[12..16].copy_from_slice(&((aligned / RECORD_BYTES) as u32).to_le_bytes());
    r
}

/// The bytes of a write of `len` bytes at `offset`.
pub fn fill(file_id: u32, write_seq: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = offset;
    let end = offset + len as u64;
    while pos < end {
        let aligned = pos - pos % RECORD_BYTES;
        let r = record(file_id, write_seq, aligned);
        let from = (pos - aligned) as usize;
        let to = ((end - aligned).min(RECORD_BYTES)) as usize;
        out.extend_from_slice(&r[from..to]);
        pos = aligned + to as u64;
    }
    debug_assert_eq!(out.len(), len);
    out
}

/// Decode the record covering file offset `offset` in `data` (which starts at
/// file offset `data_offset`), if those 16 bytes are a whole record.
pub fn decode(data: &[u8], data_offset: u64, offset: u64) -> Option<Origin> {
    let aligned = offset - offset % RECORD_BYTES;
    let start = aligned.checked_sub(data_offset)? as usize;
    let r = data.get(start..start + RECORD_BYTES as usize)?;
    if r[0..4] != TAG {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    Some(Origin {
        file_id: word(4),
        write_seq: word(8),
        offset: u64::from(word(12)) * RECORD_BYTES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_fill_matches_byte_at() {
        let data = fill(7, 3, 1000, 77);
        for (i, b) in data.iter().enumerate() {
            assert_eq!(*b, byte_at(7, 3, 1000 + i as u64));
        }
    }

    #[test]
    fn decode_names_the_writer() {
        let data = fill(5, 9, 4096, 4096);
        let o = decode(&data, 4096, 4096 + 100).unwrap();
        assert_eq!(
            o,
            Origin {
                file_id: 5,
                write_seq: 9,
                offset: 4096 + 96
            }
        );
        assert_eq!(decode(&[0u8; 32], 0, 3), None);
    }

    #[test]
    fn different_files_differ_everywhere_a_record_is_whole() {
        let a = fill(1, 1, 0, 64);
        let b = fill(2, 1, 0, 64);
        assert_ne!(a, b);
        assert!(a.iter().any(|&x| x != 0));
    }
}
