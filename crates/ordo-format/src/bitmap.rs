//! Bit operations on block and inode bitmaps, held as byte slices (bit `i`
//! is bit `i % 8` of byte `i / 8`, as ext4 stores them).

/// Whether bit `i` is set.
pub fn test(bitmap: &[u8], i: usize) -> bool {
    bitmap[i / 8] & (1 << (i % 8)) != 0
}

/// Set bit `i`; returns its previous value.
pub fn set(bitmap: &mut [u8], i: usize) -> bool {
    let was = test(bitmap, i);
    bitmap[i / 8] |= 1 << (i % 8);
    was
}

/// Clear bit `i`; returns its previous value.
pub fn clear(bitmap: &mut [u8], i: usize) -> bool {
    let was = test(bitmap, i);
    bitmap[i / 8] &= !(1 << (i % 8));
    was
}

/// Set bits `start..end`.
pub fn set_range(bitmap: &mut [u8], start: usize, end: usize) {
    for i in start..end {
        set(bitmap, i);
    }
}

/// The first clear bit in `start..end`, if any.
pub fn find_first_zero(bitmap: &[u8], start: usize, end: usize) -> Option<usize> {
    let mut i = start;
    while i < end {
        // Skip whole 0xFF bytes when aligned.
        if i.is_multiple_of(8) && i + 8 <= end && bitmap[i / 8] == 0xFF {
            i += 8;
            continue;
        }
        if !test(bitmap, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The first set bit in `start..end`, if any.
pub fn find_first_set(bitmap: &[u8], start: usize, end: usize) -> Option<usize> {
    let mut i = start;
    while i < end {
        if i.is_multiple_of(8) && i + 8 <= end && bitmap[i / 8] == 0 {
            i += 8;
            continue;
        }
        if test(bitmap, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Number of set bits in `start..end`.
pub fn count_set(bitmap: &[u8], start: usize, end: usize) -> usize {
    (start..end).filter(|&i| test(bitmap, i)).count()
}

/// Number of clear bits in `start..end`.
pub fn count_zero(bitmap: &[u8], start: usize, end: usize) -> usize {
    (end - start) - count_set(bitmap, start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_find() {
        let mut b = vec![0u8; 4];
        assert!(!set(&mut b, 3));
        assert!(set(&mut b, 3));
        assert_eq!(b[0], 0b1000);
        set_range(&mut b, 0, 17);
        assert_eq!(find_first_zero(&b, 0, 32), Some(17));
        assert_eq!(find_first_set(&b, 17, 32), None);
        assert!(clear(&mut b, 9));
        assert_eq!(find_first_zero(&b, 0, 32), Some(9));
        assert_eq!(count_set(&b, 0, 32), 16);
        assert_eq!(count_zero(&b, 0, 32), 16);
        assert_eq!(find_first_zero(&[0xFF; 4], 0, 32), None);
    }
}
