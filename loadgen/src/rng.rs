//! Small deterministic PRNG and the distributions the workloads draw from.
//!
//! Workloads must be bit-for-bit reproducible from a seed across platforms and
//! dependency upgrades (benchmark runs compare policies on *identical* request
//! streams), so we do not use `rand`, whose algorithms and stream layout may
//! change between versions. SplitMix64 (Steele, Lea, Flood 2014) is tiny, fast,
//! passes BigCrush, and is good enough for shaping load.
//!
//! | distribution | parameters | used for |
//! |---|---|---|
//! | uniform `[0,1)` | 53-bit mantissa | everything below |
//! | exponential | mean | Poisson inter-arrival gaps, think times |
//! | log-normal | median, sigma | tool output / user turn lengths (skewed, heavy right tail) |
//!
//! Independent sub-streams are derived with [`Rng::fork`], so adding draws to
//! one agent does not shift the numbers every other agent sees.

/// SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for sub-stream `stream` (e.g. agent number).
    pub fn fork(&self, stream: u64) -> Self {
        let mut mixer = Rng::new(self.state ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        Rng::new(mixer.next_u64())
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[0, n)`; `n == 0` yields 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            // Multiply-shift: bias is < n / 2^64, irrelevant here.
            ((self.next_u64() as u128 * n as u128) >> 64) as u64
        }
    }

    /// Exponential with the given mean (mean <= 0 yields 0).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        if mean <= 0.0 {
            return 0.0;
        }
        // 1 - u is in (0, 1], so ln never sees 0.
        -mean * (1.0 - self.next_f64()).ln()
    }

    /// Standard normal via Box-Muller (one of the pair is discarded: simpler
    /// state, and workload generation is not on the hot path).
    pub fn standard_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Log-normal with the given median and shape `sigma`.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.standard_normal()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(
            Rng::new(7).fork(1).next_u64(),
            Rng::new(7).fork(2).next_u64()
        );
    }

    #[test]
    fn distributions_are_sane() {
        let mut r = Rng::new(1);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| r.exponential(5.0)).sum::<f64>() / n as f64;
        assert!((mean - 5.0).abs() < 0.3, "exp mean {mean}");
        let mut v: Vec<f64> = (0..n).map(|_| r.lognormal(100.0, 1.0)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[n / 2];
        assert!((median - 100.0).abs() < 8.0, "lognormal median {median}");
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert!((0..1000).all(|_| (0.0..1.0).contains(&r.next_f64())));
    }
}
