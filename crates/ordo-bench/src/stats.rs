//! Latency summaries and the deterministic random numbers workloads draw.
//!
//! Every fsync latency is kept (a workload here issues at most a few
//! hundred thousand), so percentiles are exact rather than estimated from
//! buckets.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Mean and percentiles of a set of latencies, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// How many samples.
    pub count: u64,
    /// Arithmetic mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Largest, µs.
    pub max_us: f64,
}

impl LatencySummary {
    /// Summarizes latencies given in nanoseconds; `None` for no samples.
    pub fn from_ns(samples_ns: &mut [u64]) -> Option<LatencySummary> {
        if samples_ns.is_empty() {
            return None;
        }
        samples_ns.sort_unstable();
        let n = samples_ns.len();
        let sum: u128 = samples_ns.iter().map(|&x| x as u128).sum();
        let pct = |p: f64| {
            // Nearest-rank percentile: the smallest sample with at least p%
            // of the samples at or below it.
            let rank = ((p / 100.0) * n as f64).ceil() as usize;
            samples_ns[rank.clamp(1, n) - 1] as f64 / 1e3
        };
        Some(LatencySummary {
            count: n as u64,
            mean_us: sum as f64 / n as f64 / 1e3,
            p50_us: pct(50.0),
            p99_us: pct(99.0),
            max_us: samples_ns[n - 1] as f64 / 1e3,
        })
    }
}

/// The random-number generator of one workload thread: ChaCha8 seeded by
/// the run's seed and the thread's index, so a run is reproducible by seed
/// (up to the interleaving of threads).
pub fn thread_rng(seed: u64, thread: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ thread.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A sample of a gamma distribution with `shape` and mean `mean`
/// (Marsaglia and Tsang's method), as Filebench's `cvar-gamma` draws file
/// sizes.
pub fn gamma(rng: &mut impl Rng, shape: f64, mean: f64) -> f64 {
    assert!(shape > 0.0 && mean > 0.0, "gamma({shape}, {mean})");
    if shape < 1.0 {
        // Boost: G(a) = G(a + 1) * U^(1/a).
        let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        let scale = mean / shape;
        return gamma(rng, shape + 1.0, (shape + 1.0) * scale) * u.powf(1.0 / shape);
    }
    let scale = mean / shape;
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// A standard normal sample (Box-Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A file size drawn from Filebench's gamma(1.5) with mean `mean_bytes`,
/// at least 1 byte and at most 16 times the mean (a bound on one file).
pub fn filebench_size(rng: &mut impl Rng, mean_bytes: u64) -> u64 {
    /// Filebench's personalities use gamma = 1.5 for every file size.
    const FILEBENCH_GAMMA_SHAPE: f64 = 1.5;
    let x = gamma(rng, FILEBENCH_GAMMA_SHAPE, mean_bytes as f64);
    (x.round() as u64).clamp(1, mean_bytes.saturating_mul(16).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let s = LatencySummary::from_ns(&mut v).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us, 50.0);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.max_us, 100.0);
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert!(LatencySummary::from_ns(&mut []).is_none());
        let mut one = vec![7000];
        let s = LatencySummary::from_ns(&mut one).unwrap();
        assert_eq!((s.p50_us, s.p99_us), (7.0, 7.0));
    }

    #[test]
    fn gamma_has_the_requested_mean_and_is_seeded() {
        let mut rng = thread_rng(42, 0);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| gamma(&mut rng, 1.5, 16384.0)).sum::<f64>() / n as f64;
        assert!((mean - 16384.0).abs() < 16384.0 * 0.05, "mean {mean}");
        let a: Vec<u64> = {
            let mut r = thread_rng(7, 3);
            (0..10).map(|_| filebench_size(&mut r, 16384)).collect()
        };
        let b: Vec<u64> = {
            let mut r = thread_rng(7, 3);
            (0..10).map(|_| filebench_size(&mut r, 16384)).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|&x| (1..=16 * 16384).contains(&x)));
        let mut r = thread_rng(1, 1);
        let small: f64 = (0..n).map(|_| gamma(&mut r, 0.5, 100.0)).sum::<f64>() / n as f64;
        assert!((small - 100.0).abs() < 10.0, "mean {small}");
    }
}
