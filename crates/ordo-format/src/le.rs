//! Byte-order field access on byte slices: the one set of helpers every
//! ordo crate reads and patches on-disk fields with.
//!
//! ext4 and fast-commit fields are little-endian; JBD2's are big-endian
//! (the `be_*` functions). Two flavours:
//!
//! - `u16_at` / `put_u16` and friends index directly: callers check lengths
//!   first, so a wrong offset is a loud panic in tests, never a silent
//!   misread. The decoders and the core use these.
//! - `u16_or_zero` and friends never panic: an out-of-range read gives 0.
//!   fsck uses them on images it has not validated yet, where a bad offset
//!   must become a finding, not a crash.

/// The `N` bytes at `off`: one range check and one load, where indexing
/// each byte checked each (four compares and branches per `u32`, in every
/// inode decoded).
#[inline(always)]
fn at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let s = &b[off..off + N];
    s.try_into().expect("N bytes")
}

#[inline]
pub fn u8_at(b: &[u8], off: usize) -> u8 {
    b[off]
}
#[inline]
pub fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(at(b, off))
}
#[inline]
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(at(b, off))
}
#[inline]
pub fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from(u32_at(b, off)) | (u64::from(u32_at(b, off + 4)) << 32)
}
#[inline]
pub fn put_u8(b: &mut [u8], off: usize, v: u8) {
    b[off] = v;
}
#[inline]
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Little-endian `u16` at `off`, or 0 when `b` is too short.
#[inline]
pub fn u16_or_zero(b: &[u8], off: usize) -> u16 {
    match b.get(off..off.saturating_add(2)) {
        Some(s) => u16::from_le_bytes([s[0], s[1]]),
        None => 0,
    }
}
/// Little-endian `u32` at `off`, or 0 when `b` is too short.
#[inline]
pub fn u32_or_zero(b: &[u8], off: usize) -> u32 {
    match b.get(off..off.saturating_add(4)) {
        Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

/// Big-endian (JBD2) `u16` at `off`.
#[inline]
pub fn be_u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(at(b, off))
}
/// Big-endian (JBD2) `u32` at `off`.
#[inline]
pub fn be_u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(at(b, off))
}
/// Big-endian (JBD2) `u64` at `off`.
#[inline]
pub fn be_u64_at(b: &[u8], off: usize) -> u64 {
    (u64::from(be_u32_at(b, off)) << 32) | u64::from(be_u32_at(b, off + 4))
}
/// Big-endian (JBD2) `u32` at `off`, or 0 when `b` is too short.
#[inline]
pub fn be_u32_or_zero(b: &[u8], off: usize) -> u32 {
    match b.get(off..off.saturating_add(4)) {
        Some(s) => u32::from_be_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}
#[inline]
pub fn put_be_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub fn put_be_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub fn put_be_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_byte_orders_round_trip() {
        let mut b = [0u8; 16];
        put_u16(&mut b, 0, 0x1234);
        put_u32(&mut b, 2, 0x89AB_CDEF);
        put_u64(&mut b, 6, 0x0102_0304_0506_0708);
        assert_eq!(b[0..2], [0x34, 0x12]);
        assert_eq!(u16_at(&b, 0), 0x1234);
        assert_eq!(u32_at(&b, 2), 0x89AB_CDEF);
        assert_eq!(u64_at(&b, 6), 0x0102_0304_0506_0708);
        put_be_u16(&mut b, 0, 0x1234);
        put_be_u32(&mut b, 2, 0x89AB_CDEF);
        put_be_u64(&mut b, 6, 0x0102_0304_0506_0708);
        assert_eq!(b[0..2], [0x12, 0x34]);
        assert_eq!(be_u16_at(&b, 0), 0x1234);
        assert_eq!(be_u32_at(&b, 2), 0x89AB_CDEF);
        assert_eq!(be_u64_at(&b, 6), 0x0102_0304_0506_0708);
    }

    #[test]
    fn checked_reads_give_zero_past_the_end() {
        let b = [1u8, 2, 3];
        assert_eq!(u16_or_zero(&b, 1), 0x0302);
        assert_eq!(u16_or_zero(&b, 2), 0);
        assert_eq!(u32_or_zero(&b, 0), 0);
        assert_eq!(be_u32_or_zero(&b, usize::MAX), 0);
        assert_eq!(u32_or_zero(&[1, 0, 0, 0], 0), 1);
    }
}
