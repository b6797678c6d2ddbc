//! Key distributions and the per-thread key streams pregenerated from them.
//!
//! A run's stream must *cover* its key space: a `uniform:1000000` scenario that only ever touches
//! 65 k keys is not a 1 M-key measurement. [`KeyDist::stream`] therefore builds each stream by
//! apportioning, not by sampling: every key gets its expected share of the stream (at least one
//! occurrence), then the stream is shuffled. Drawing keys on the fly instead would put a random
//! draw (and, for Zipf, a binary search over a 1 M-entry CDF: several cache misses) on the timed
//! path, whose cost would then have to be measured and subtracted; a pregenerated stream costs one
//! sequential load per decision, which the hardware prefetcher hides.

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

    /// A shuffled key stream of at least `min_len` keys that covers the key space: every key
    /// `0..key_count()` occurs at least once, each as often as its probability says, rounded.
    ///
    /// * `single`: `min_len` zeros.
    /// * `uniform:K`: `max(min_len, K)` keys, each key `⌊len / K⌋` times plus the remainder drawn
    ///   uniformly; so every key occurs at least once per pass through the stream.
    /// * `zipf:K:S`: length about `max(min_len, ZIPF_PASSES × K)`; key `k` occurs
    ///   `max(1, round(len × p_k))` times. The "at least once" of the tail adds a little mass there
    ///   (1.2 % of the stream at 1 M keys and `S = 1`; at 10 k keys rounding dominates and the
    ///   stream is 0.15 % short of its target); the head keeps its exact Zipf shares.
    ///
    /// The same seed gives the same stream; different seeds give differently shuffled streams.
    pub fn stream(&self, min_len: usize, seed: u64) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = match *self {
            KeyDist::Single => return vec![0; min_len.max(1)],
            KeyDist::Uniform { keys } => {
                let keys_usize = usize::try_from(keys).unwrap_or(usize::MAX);
                let len = min_len.max(keys_usize);
                let per_key = (len / keys_usize) as u64;
                let mut out = Vec::with_capacity(len);
                for key in 0..keys {
                    out.extend(std::iter::repeat_n(key, per_key as usize));
                }
                while out.len() < len {
                    out.push(rng.random_range(0..keys));
                }
                out
            }
            KeyDist::Zipf { keys, s } => {
                let target = min_len.max(usize::try_from(keys).unwrap_or(usize::MAX) * ZIPF_PASSES);
                let cdf = zipf_cdf(keys, s);
                let mut out = Vec::with_capacity(target + target / 16);
                let mut previous = 0.0;
                for (key, &c) in cdf.iter().enumerate() {
                    let count = ((c - previous) * target as f64).round().max(1.0) as usize;
                    previous = c;
                    out.extend(std::iter::repeat_n(key as u64, count));
                }
                out
            }
        };
        // Fisher-Yates: a uniformly random order of the apportioned multiset.
        for i in (1..out.len()).rev() {
            out.swap(i, rng.random_range(0..=i));
        }
        out
    }

    /// `len` keys drawn independently with a generator seeded by `seed` (the same seed gives the same
    /// stream). Unlike [`stream`](Self::stream), a short i.i.d. stream need not cover the key space.
    pub fn generate(&self, len: usize, seed: u64) -> Vec<u64> {
        let sampler = self.sampler();
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..len).map(|_| sampler.sample(&mut rng)).collect()
    }
}

/// A Zipf stream is at least this many times its key count long, so the tail's "at least once"
/// distorts the distribution little (see [`KeyDist::stream`]).
pub const ZIPF_PASSES: usize = 8;

/// Distinct keys of `0..key_count` that occur in `stream` (keys outside the range are not counted).
pub fn distinct_keys(stream: &[u64], key_count: u64) -> u64 {
    let mut seen = vec![false; usize::try_from(key_count).unwrap_or(usize::MAX)];
    let mut distinct = 0;
    for &key in stream {
        if let Some(slot) = usize::try_from(key).ok().and_then(|k| seen.get_mut(k)) {
            if !*slot {
                *slot = true;
                distinct += 1;
            }
        }
    }
    distinct
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
    fn streams_cover_their_key_space() {
        // The default stream length (64 Ki) is far below a million keys: the stream grows to cover.
        for text in [
            "uniform:1000000",
            "zipf:1000000:1.0",
            "uniform:10000",
            "zipf:10000:1.0",
            "zipf:1000:2.5",
            "single",
        ] {
            let dist: KeyDist = text.parse().unwrap();
            let stream = dist.stream(1 << 16, 42);
            assert!(stream.len() >= 1 << 16, "{text}");
            assert_eq!(
                distinct_keys(&stream, dist.key_count()),
                dist.key_count(),
                "{text}: every key occurs"
            );
            assert!(stream.iter().all(|&k| k < dist.key_count()), "{text}");
        }
        // An i.i.d. stream of the same default length does not (what the audit found: ~65 k keys).
        let dist: KeyDist = "uniform:1000000".parse().unwrap();
        assert!(distinct_keys(&dist.generate(1 << 16, 42), 1_000_000) < 70_000);
    }

    #[test]
    fn covering_streams_keep_their_distribution() {
        let dist: KeyDist = "uniform:1000".parse().unwrap();
        let stream = dist.stream(100_000, 1);
        assert_eq!(stream.len(), 100_000);
        let mut counts = vec![0u32; 1000];
        for &k in &stream {
            counts[k as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c == 100 || c > 100 && c < 110));
        // Zipf(1.0): rank 1 twice as frequent as rank 2, three times rank 3; shuffled, seeded.
        let dist: KeyDist = "zipf:10000:1.0".parse().unwrap();
        let stream = dist.stream(1 << 16, 3);
        let count = |key: u64| stream.iter().filter(|&&k| k == key).count() as f64;
        assert!((1.99..2.01).contains(&(count(0) / count(1))));
        assert!((2.98..3.02).contains(&(count(0) / count(2))));
        assert!(stream[..100].iter().any(|&k| k > 100), "shuffled");
        assert_eq!(stream, dist.stream(1 << 16, 3));
        assert_ne!(stream, dist.stream(1 << 16, 4));
        // The tail's "at least once" adds little mass: ≤ 2 % beyond the target length.
        let target = (1usize << 16).max(10_000 * ZIPF_PASSES);
        assert!(stream.len() < target + target / 50, "{}", stream.len());
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
