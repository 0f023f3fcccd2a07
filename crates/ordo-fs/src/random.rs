//! The file system's random source: seeded, so that a run can be replayed.
//!
//! ordo draws random numbers for inode generations (`i_generation`, which
//! NFS file handles use to tell a reused inode number from the file that
//! had it before) and, in mkfs, for the UUID and directory hash seed when
//! none is given. A mount takes its seed from
//! [`crate::MountOptions::seed`] (mkfs from `MkfsOptions::seed`); without
//! one, the seed is drawn from the operating system, so that two mounts do
//! not hand out the same generations (today's behaviour).
//!
//! The generator is SplitMix64 (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", OOPSLA 2014; the seeder of the
//! xoshiro family), written out here rather than taken from `rand`:
//! - the stream is part of the on-disk result (the same seed must write
//!   the same generations in every future ordo), and a ten-line function
//!   pinned by a test vector cannot change under us the way a crate's
//!   sampling code can between versions;
//! - every 64-bit seed is valid, 0 included (xorshift's all-zero state is
//!   a fixed point), and its output passes BigCrush, far more than
//!   generation numbers need;
//! - its whole state is one `u64`, cheap to keep in the core.
//!
//! It is not cryptographic, and nothing here needs it to be.

/// SplitMix64's state increment (the golden ratio in 64-bit fixed point).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A seeded SplitMix64 generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator seeded from the operating system (a different stream
    /// each time).
    pub fn from_entropy() -> Self {
        Self::new(entropy_seed())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits (the high half: SplitMix64's output is
    /// equally good in both halves, the high one is the usual choice).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Fill `out` with random bytes (little-endian words).
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

/// A seed drawn from the operating system's random source: what a mount or
/// mkfs uses when the caller gives none.
pub fn entropy_seed() -> u64 {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published test vector for seed 1234567 (Vigna's reference
    /// `splitmix64.c`): pins the generator, since its output lands on disk.
    #[test]
    fn matches_the_reference_stream() {
        let mut r = SplitMix64::new(1_234_567);
        let want = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn zero_seed_is_not_stuck() {
        let mut r = SplitMix64::new(0);
        let a = r.next_u64();
        let b = r.next_u64();
        assert_ne!(a, 0);
        assert_ne!(a, b);
    }

    #[test]
    fn fill_bytes_takes_words_in_order() {
        let mut a = SplitMix64::new(9);
        let mut b = a.clone();
        let mut buf = [0u8; 12];
        a.fill_bytes(&mut buf);
        assert_eq!(&buf[..8], &b.next_u64().to_le_bytes());
        assert_eq!(&buf[8..], &b.next_u64().to_le_bytes()[..4]);
    }
}
