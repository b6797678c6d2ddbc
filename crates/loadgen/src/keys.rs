//! Key distributions and the per-thread key streams pregenerated from them.

use std::fmt;
use std::str::FromStr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How requests pick their key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyDist {
    /// Every request uses key 0.
    Single,
    /// Keys drawn uniformly from `0..keys`.
    Uniform {
        /// Distinct keys.
        keys: u64,
    },
    /// Key of rank `k` (1-based) drawn with probability ∝ `1 / k^s`, over `keys` keys.
    Zipf {
        /// Distinct keys.
        keys: u64,
        /// Exponent (`s = 0` is uniform; about 1 is typical of web traffic).
        s: f64,
    },
}

/// A key distribution string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyDistError(String);

impl fmt::Display for KeyDistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad key distribution {:?}: expected single, uniform:K or zipf:K:S (K >= 1, S >= 0)",
            self.0
        )
    }
}

impl std::error::Error for KeyDistError {}

impl FromStr for KeyDist {
    type Err = KeyDistError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || KeyDistError(text.to_owned());
        let parts: Vec<&str> = text.trim().split(':').collect();
        let keys = |s: &str| {
            s.replace('_', "")
                .parse::<u64>()
                .ok()
                .filter(|&k| k >= 1)
                .ok_or_else(err)
        };
        match parts.as_slice() {
            ["single"] => Ok(KeyDist::Single),
            ["uniform", k] => Ok(KeyDist::Uniform { keys: keys(k)? }),
            ["zipf", k, s] => {
                let s: f64 = s.parse().map_err(|_| err())?;
                if !(s.is_finite() && s >= 0.0) {
                    return Err(err());
                }
                Ok(KeyDist::Zipf { keys: keys(k)?, s })
            }
            _ => Err(err()),
        }
    }
}

impl fmt::Display for KeyDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDist::Single => f.write_str("single"),
            KeyDist::Uniform { keys } => write!(f, "uniform:{keys}"),
            KeyDist::Zipf { keys, s } => write!(f, "zipf:{keys}:{s}"),
        }
    }
}

impl KeyDist {
    /// Distinct keys the distribution can produce.
    pub fn key_count(&self) -> u64 {
        match *self {
            KeyDist::Single => 1,
            KeyDist::Uniform { keys } | KeyDist::Zipf { keys, .. } => keys,
        }
    }

    /// A reusable sampler for this distribution.
    pub fn sampler(&self) -> KeySampler {
        let cdf = match *self {
            KeyDist::Zipf { keys, s } => Some(zipf_cdf(keys, s)),
            _ => None,
        };
        KeySampler { dist: *self, cdf }
    }

    /// `len` keys drawn with a generator seeded by `seed` (the same seed gives the same stream).
    pub fn generate(&self, len: usize, seed: u64) -> Vec<u64> {
        let sampler = self.sampler();
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..len).map(|_| sampler.sample(&mut rng)).collect()
    }
}

/// Normalised cumulative weights `1/k^s`, k = 1..=keys.
fn zipf_cdf(keys: u64, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=keys)
        .map(|k| {
            acc += (k as f64).powf(-s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// Draws keys from a [`KeyDist`]; Zipf by binary search over a precomputed CDF (exact, `O(log K)`).
#[derive(Clone, Debug)]
pub struct KeySampler {
    dist: KeyDist,
    cdf: Option<Vec<f64>>,
}

impl KeySampler {
    /// One key (Zipf: rank − 1, so the most popular key is 0).
    pub fn sample<R: Rng>(&self, rng: &mut R) -> u64 {
        match (&self.dist, &self.cdf) {
            (KeyDist::Uniform { keys }, _) => rng.random_range(0..*keys),
            (KeyDist::Zipf { .. }, Some(cdf)) => {
                let u: f64 = rng.random();
                (cdf.partition_point(|&c| c <= u) as u64).min(cdf.len() as u64 - 1)
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        for text in ["single", "uniform:1000", "zipf:10000:1.1", "zipf:5:0"] {
            let dist: KeyDist = text.parse().unwrap();
            assert_eq!(dist.to_string(), text);
        }
        assert_eq!(
            "uniform:10_000".parse::<KeyDist>().unwrap().key_count(),
            10_000
        );
    }

    #[test]
    fn rejects_bad_strings() {
        for text in [
            "",
            "uniform",
            "uniform:0",
            "zipf:10",
            "zipf:10:-1",
            "zipf:10:nan",
            "x:1",
        ] {
            assert!(text.parse::<KeyDist>().is_err(), "{text}");
        }
    }

    #[test]
    fn streams_are_seeded_and_in_range() {
        let dist: KeyDist = "zipf:100:1.0".parse().unwrap();
        let a = dist.generate(10_000, 7);
        assert_eq!(a, dist.generate(10_000, 7));
        assert_ne!(a, dist.generate(10_000, 8));
        assert!(a.iter().all(|&k| k < 100));
        assert!(KeyDist::Single.generate(10, 1).iter().all(|&k| k == 0));
    }

    #[test]
    fn zipf_favours_low_ranks_by_the_expected_ratio() {
        // With s = 1, rank 1 is twice as likely as rank 2.
        let keys = "zipf:1000:1.0"
            .parse::<KeyDist>()
            .unwrap()
            .generate(200_000, 3);
        let first = keys.iter().filter(|&&k| k == 0).count() as f64;
        let second = keys.iter().filter(|&&k| k == 1).count() as f64;
        let ratio = first / second;
        assert!((1.8..2.2).contains(&ratio), "ratio {ratio}");
        // Uniform does not.
        let keys = "uniform:1000"
            .parse::<KeyDist>()
            .unwrap()
            .generate(200_000, 3);
        let first = keys.iter().filter(|&&k| k == 0).count();
        assert!(first < 400, "{first}");
    }
}
