//! Checksums used by ext4, computed exactly as the kernel computes them.
//!
//! The kernel's `ext4_chksum(seed, data)` is a raw CRC32C (Castagnoli,
//! reflected) with no pre- or post-inversion: the seed goes in as the
//! register value and the register comes out as the result. The `crc32c`
//! crate computes the conventional form (`!raw(!crc, data)`), so we invert
//! on the way in and out. Getting this wrong by one inversion produces
//! checksums that e2fsck rejects, which is why every use goes through
//! [`ext4_crc32c`].
//!
//! `crc16` is the ANSI CRC-16 (polynomial 0x8005, reflected 0xA001) of
//! lib/crc16.c, used only by the older `uninit_bg` (gdt_csum) group
//! descriptor checksum.

/// The kernel's `ext4_chksum(seed, data)`: raw CRC32C, no inversions.
pub fn ext4_crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// CRC-16 (ANSI, reflected polynomial 0xA001) continuing from `crc`, as
/// lib/crc16.c computes it (no final inversion).
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= b as u16;
        for _ in 0..8 {
            if crc & 1 != 0 {
                crc = (crc >> 1) ^ 0xA001;
            } else {
                crc >>= 1;
            }
        }
    }
    crc
}

/// The per-file-system checksum seed: `s_checksum_seed` when the
/// `metadata_csum_seed` feature is set, otherwise `crc32c(~0, uuid)`.
pub fn fs_csum_seed(uuid: &[u8; 16]) -> u32 {
    ext4_crc32c(!0, uuid)
}

/// The per-inode seed used by inode, directory-block, extent-block and
/// xattr checksums: `crc32c(crc32c(fs_seed, le ino), le generation)`.
pub fn inode_csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    // One pass over the eight bytes: a CRC continued over two pieces is the
    // CRC of the two together, and each call has a fixed cost that is most
    // of the work for so few bytes.
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&ino.to_le_bytes());
    b[4..].copy_from_slice(&generation.to_le_bytes());
    ext4_crc32c(fs_seed, &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inode_seed_is_the_crc_continued_over_number_then_generation() {
        for (seed, ino, generation) in [(!0u32, 2u32, 0u32), (0x1234_5678, 12, 0xdead_beef)] {
            let two_steps = ext4_crc32c(
                ext4_crc32c(seed, &ino.to_le_bytes()),
                &generation.to_le_bytes(),
            );
            assert_eq!(inode_csum_seed(seed, ino, generation), two_steps);
        }
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The conventional CRC32C of "123456789" is 0xE3069283; the raw form
        // with seed ~0 is its inverse.
        assert_eq!(!ext4_crc32c(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn crc32c_chains_like_one_pass() {
        let a = ext4_crc32c(0x1234_5678, b"hello ");
        assert_eq!(
            ext4_crc32c(a, b"world"),
            ext4_crc32c(0x1234_5678, b"hello world")
        );
    }

    #[test]
    fn crc16_matches_the_arc_check_value() {
        // CRC-16/ARC (init 0) of "123456789" is 0xBB3D; CRC-16/MODBUS (init
        // 0xFFFF) is 0x4B37. Same polynomial and reflection as lib/crc16.c.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
        assert_eq!(crc16(0xFFFF, b"123456789"), 0x4B37);
    }
}
