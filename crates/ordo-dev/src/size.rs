//! Sizes as people type them ("4096", "64M", "2GiB"): every tool that takes
//! a device or cache size (`ordo mkfs -s`, `ordo mount -o cache=`,
//! `ordo-bench --size`) parses them alike, so they share this one parser.

/// Parse a size: a number of bytes with an optional suffix K, M, G or T
/// (powers of 1024; a trailing "B" or "iB" is accepted: "64M", "64MiB").
pub fn parse_size_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size '{s}' (expected e.g. 4096, 64M, 2G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_powers_of_1024() {
        assert_eq!(parse_size_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_size_bytes(" 512k ").unwrap(), 512 << 10);
        assert_eq!(parse_size_bytes("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size_bytes("2GB").unwrap(), 2 << 30);
        assert_eq!(parse_size_bytes("1T").unwrap(), 1 << 40);
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in ["", "M", "12Q", "-1", "1.5G", "99999999999T"] {
            assert!(parse_size_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }
}
