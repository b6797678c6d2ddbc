//! How a core [`Algorithm`] lives in Redis: its script, the script's parameters, and its state as a
//! stored Redis value.

use std::time::Duration;

use redis::Script;
use tollgate_core::algorithm::Algorithm;
use tollgate_core::algorithm::fixed_window::FixedState;
use tollgate_core::algorithm::sliding_window::SlidingState;
use tollgate_core::{FixedWindow, Gcra, LeakyBucket, Nanos, Quota, QuotaError, SlidingWindow};

use crate::params::ScriptParams;
use crate::scripts::{
    FIXED_WINDOW, FIXED_WINDOW_CHARGE, FIXED_WINDOW_REFUND, GCRA, GCRA_CHARGE, GCRA_REFUND,
    LUA_PARAM_MAX, SLIDING_WINDOW, SLIDING_WINDOW_CHARGE, SLIDING_WINDOW_REFUND,
};

/// The Redis type of a limiter's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// A plain string (one value).
    String,
    /// A hash with exactly these fields, in this order.
    Hash(&'static [&'static str]),
}

impl KeyType {
    /// How many values a state has of this key type.
    pub fn len(self) -> usize {
        match self {
            KeyType::String => 1,
            KeyType::Hash(fields) => fields.len(),
        }
    }

    /// Whether a state has no values (never, for the crate's algorithms).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// A core [`Algorithm`] that runs in Redis: one atomic Lua script on one key restating its
/// [`decide`](Algorithm::decide), with the state word stored as a Redis value.
///
/// The contract, which the crate's differential tests check on random traces and random quotas
/// (core state seeded into Redis, then decision, stored state and TTL compared): for an algorithm
/// `a` whose [`script_params`](Self::script_params) succeed, a state word `w` stored as
/// [`encode(w)`](Self::encode), and a time `now` in whole µs since the Unix epoch (all Redis's
/// `TIME` can give), the script answers `a.decide(w, now, cost)`'s decision, leaves
/// [`decode`](Self::decode) reading its `next` word (or the key untouched when it is `None`), and
/// sets the key's TTL to [`ttl`](Self::ttl) rounded up to whole ms. Per algorithm, where a µs clock
/// forces rounding, the implementation says so.
///
/// **A state remembers its quota.** Every write stores, with the state, the quota it was written
/// under ([`ScriptParams::quota_tag`]). A script running under other parameters (the limit changed
/// under the same key: a reload, an override) reads such a state as the core's
/// [`Algorithm::carry_over`] would carry it at that instant: **as-is in units** (the key keeps
/// `min(the units it could take under its quota then, the new capacity)`, the rest counted as spent
/// at that instant; a state fresh under its quota stays fresh), and stores the result under the new
/// quota even when it denies, so the key never goes on refilling under the quota it left. So a key
/// that just spent its burst gets nothing back whichever way its quota changed, and never more than
/// it could have had under either quota. The carry-over happens at the key's first call under the
/// new quota: a key idle across the change refills under the quota it was written under until then.
/// A state without a tag (written by a version before tags) is read under the caller's quota.
///
/// Scripts follow one calling convention: `KEYS[1]` the key; `ARGV[1]` now in µs (empty: the server's
/// `TIME`), `ARGV[2]` the cost, `ARGV[3]` `1` for a peek (decide, write nothing), then
/// [`ScriptParams::args`]. The reply is `{allowed (0/1), remaining, retry_after, reset_after}`,
/// durations in [`ScriptParams::unit`], `-1` for never.
pub trait RedisEncoding: Algorithm {
    /// The Redis type of the key.
    const KEY_TYPE: KeyType;

    /// The decision script (sent by SHA, loaded on `NOSCRIPT`).
    fn script() -> &'static Script;

    /// The refund script, restating the algorithm's [`refund`](Algorithm::refund) over the key's
    /// stored value; `None` (the default, as the core's default `refund`) gives nothing back, which
    /// is always safe (stricter).
    ///
    /// Same calling convention as [`script`](Self::script), `ARGV[2]` being the units to give back
    /// (any `u64`; the script saturates) and `ARGV[3]` unused. Contract: for a stored state `w` and a
    /// time `now` in whole µs, the script leaves the key holding `a.refund(w, now, cost)` (or `w`
    /// when that is `None`) up to freshness: where that state is fresh at `now`
    /// ([`is_fresh`](Algorithm::is_fresh)) the key may instead be deleted (or, when nothing was
    /// given back, left holding a state that is also fresh), which decides every request at `now`
    /// or later the same. A write sets the TTL to when the new state turns fresh, as the decision
    /// script's writes do. The reply is `{written (0/1), 0, 0, 0}`.
    fn refund_script() -> Option<&'static Script> {
        None
    }

    /// The charge script, restating the algorithm's [`charge`](Algorithm::charge) over the key's
    /// stored value (units counted at `now` without a decision: a settlement's overdraft); `None`
    /// (the default) when the algorithm has none, in which case
    /// [`RedisLimiter::try_charge`](crate::RedisLimiter::try_charge) is an error
    /// ([`Error::NoCharge`](crate::Error::NoCharge)) rather than a silent loss.
    ///
    /// Same calling convention as [`refund_script`](Self::refund_script), `ARGV[2]` being the units
    /// to count (any `u64`). Contract: for a stored state `w` and a time `now` in whole µs, the
    /// script leaves the key holding `a.charge(w, now, cost)` (or `w` when that is `None`), written
    /// with this quota's tag (a state under another quota carried over first, as a decision does),
    /// and its TTL set to when that state turns fresh; where the core's count would go beyond what
    /// the script's exact integers hold, the script stops at its own largest state (documented per
    /// algorithm), which still denies every request the core's would. The reply is `{written
    /// (0/1), 0, 0, 0}`.
    fn charge_script() -> Option<&'static Script> {
        None
    }

    /// The units to send the refund script for a refund of `cost`, or `None` where the core's
    /// [`refund`](Algorithm::refund) gives nothing back for that cost whatever the state (the
    /// default: every cost is sent). The GCRA encodings answer `None` where `cost × interval`
    /// overflows a `u64`, as the core does.
    fn refund_cost(&self, cost: u64) -> Option<u64> {
        Some(cost)
    }

    /// The quota to build the algorithm from so that the script follows it exactly: `quota` itself
    /// where the script can, otherwise the nearest stricter quota (each implementation documents
    /// when, and by how much at most).
    ///
    /// # Errors
    /// A [`QuotaError`] when no such quota keeps the script's figures exact.
    fn redis_quota(quota: Quota) -> Result<Quota, QuotaError> {
        Ok(quota)
    }

    /// The script's parameters, derived from this algorithm's own validated parameters.
    ///
    /// # Errors
    /// A [`QuotaError`] when the script cannot follow this algorithm exactly (build it from
    /// [`redis_quota`](Self::redis_quota) instead).
    fn script_params(&self) -> Result<ScriptParams, QuotaError>;

    /// The stored values (one per [`KEY_TYPE`](Self::KEY_TYPE) field) for state word `word`.
    fn encode(&self, word: u64) -> Vec<String>;

    /// The state word for stored values, as read from the key (`None`: absent; all absent: the fresh
    /// state `0`).
    ///
    /// # Errors
    /// Why the values are not a state of this algorithm.
    fn decode(&self, values: &[Option<String>]) -> Result<u64, String>;

    /// How long after `now` a freshly written state `word` stays distinguishable from the fresh
    /// state: the key's TTL (the script rounds it up to whole ms, at least 1).
    fn ttl(&self, word: u64, now: Nanos) -> Nanos;
}

/// `gcd(a, b)`, Euclid's algorithm.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// GCRA figures in the script's unit: a divisor of 1000 ns that also divides the interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TatUnits {
    /// Nanoseconds per unit.
    pub unit: Nanos,
    /// The emission interval in units.
    pub interval: u64,
    /// The bucket depth in units.
    pub depth: u64,
}

/// The script's GCRA depth stays below 2^51 units, so that a stored TAT up to 2^52 units ahead plus a
/// cost (at most the depth) stays below 2^53: exact in Lua's doubles.
pub(crate) const TAT_DEPTH_MAX: u64 = 1 << 51;

impl TatUnits {
    /// The units for an interval of `interval` ns and a depth of `burst` intervals, if the script can
    /// follow them exactly.
    pub(crate) fn new(interval: Nanos, burst: u64) -> Option<TatUnits> {
        let unit = gcd(interval, 1000);
        let depth = burst.checked_mul(interval / unit)?;
        (depth < TAT_DEPTH_MAX).then_some(TatUnits {
            unit,
            interval: interval / unit,
            depth,
        })
    }

    /// The GCRA script's parameters: units per µs, interval, depth.
    pub(crate) fn params(self) -> ScriptParams {
        ScriptParams::new(self.unit, &[1000 / self.unit, self.interval, self.depth])
    }

    /// The units for a GCRA quota built by [`gcra_quota`].
    pub(crate) fn for_quota(quota: &Quota) -> Result<TatUnits, QuotaError> {
        TatUnits::new(quota.emission_interval_nanos(), quota.burst())
            .ok_or(QuotaError::BurstTooLarge)
    }
}

/// [`RedisEncoding::redis_quota`] for the TAT algorithms: `quota` when its interval and depth fit the
/// script's exact units, else the interval rounded up to whole µs.
pub(crate) fn gcra_quota(quota: Quota) -> Result<Quota, QuotaError> {
    let interval = quota.emission_interval_nanos();
    if TatUnits::new(interval, quota.burst()).is_some() {
        return Ok(quota);
    }
    let rounded = interval
        .div_ceil(1000)
        .checked_mul(1000)
        .ok_or(QuotaError::PeriodTooLong)?;
    TatUnits::new(rounded, quota.burst()).ok_or(QuotaError::BurstTooLarge)?;
    let period = quota
        .limit()
        .checked_mul(rounded)
        .ok_or(QuotaError::PeriodTooLong)?;
    // ceil(limit × rounded / limit) = rounded: the new quota's interval is exactly `rounded`.
    Quota::per(Duration::from_nanos(period), quota.limit())?.with_burst(quota.burst())
}

/// [`RedisEncoding::refund_cost`] for the TAT algorithms: the core moves the TAT back by
/// `cost × interval` and gives nothing back where that overflows.
fn tat_refund_cost(quota: &Quota, cost: u64) -> Option<u64> {
    cost.checked_mul(quota.emission_interval_nanos())
        .map(|_| cost)
}

/// The GCRA state word (the TAT in ns) as the stored string (`<tat>;<quota tag>`), and back.
fn tat_encode(word: u64, params: Result<ScriptParams, QuotaError>) -> Vec<String> {
    match params {
        Ok(params) => vec![format!("{word};{}", params.quota_tag())],
        // A quota no script runs: no tag (read under whichever quota reads it).
        Err(_) => vec![word.to_string()],
    }
}

fn tat_decode(
    values: &[Option<String>],
    params: Result<ScriptParams, QuotaError>,
) -> Result<u64, String> {
    match values {
        [None] => Ok(0),
        [Some(raw)] => match untag(raw, params)?.parse::<u64>() {
            // The scripts' own bound: a TAT within 2^53 whole µs (they also refuse one more than
            // 2^52 units ahead of now, which needs `now`).
            Ok(tat) if tat / 1000 < 2 * LUA_PARAM_MAX => Ok(tat),
            _ => Err(format!("TAT {raw:?} is not a time in ns below 2^53 µs")),
        },
        _ => Err(format!("{} values for a GCRA state", values.len())),
    }
}

/// `raw` without its quota tag, which must be `params`' (or absent: a state from before tags).
fn untag(raw: &str, params: Result<ScriptParams, QuotaError>) -> Result<&str, String> {
    match raw.split_once(';') {
        None => Ok(raw),
        Some((state, tag)) => match params {
            Ok(p) if p.quota_tag() == tag => Ok(state),
            _ => Err(format!("{raw:?} was written under another quota")),
        },
    }
}

/// The encoding of an algorithm whose state word is a TAT ([`Gcra`], and [`LeakyBucket`]'s
/// `empty_at`): the GCRA scripts, the key format and the exactness documented on the two impls.
macro_rules! tat_encoding {
    ($(#[$doc:meta])* $algorithm:ty) => {
        $(#[$doc])*
        impl RedisEncoding for $algorithm {
            const KEY_TYPE: KeyType = KeyType::String;

            fn script() -> &'static Script {
                &GCRA
            }

            fn refund_script() -> Option<&'static Script> {
                Some(&GCRA_REFUND)
            }

            fn charge_script() -> Option<&'static Script> {
                Some(&GCRA_CHARGE)
            }

            fn refund_cost(&self, cost: u64) -> Option<u64> {
                tat_refund_cost(self.quota(), cost)
            }

            fn redis_quota(quota: Quota) -> Result<Quota, QuotaError> {
                gcra_quota(quota)
            }

            fn script_params(&self) -> Result<ScriptParams, QuotaError> {
                TatUnits::for_quota(self.quota()).map(TatUnits::params)
            }

            fn encode(&self, word: u64) -> Vec<String> {
                tat_encode(word, self.script_params())
            }

            fn decode(&self, values: &[Option<String>]) -> Result<u64, String> {
                tat_decode(values, self.script_params())
            }

            fn ttl(&self, tat: u64, now: Nanos) -> Nanos {
                tat.saturating_sub(now)
            }
        }
    };
}

tat_encoding! {
    /// GCRA in Redis: the key is a string, the TAT in nanoseconds since the Unix epoch (the core's state
    /// word, in decimal), then `;` and the quota tag (see the trait's docs).
    ///
    /// **Exact for every quota whose bucket depth is below 2^51 units**, the unit being
    /// `gcd(interval, 1000 ns)`: the script splits the stored TAT into whole µs and nanoseconds and
    /// computes relative to `now` in that unit, so the emission interval need not be a whole number of
    /// µs (e.g. 3/s, 333 333 334 ns). That covers every depth below 26 days, and every depth below 71
    /// years when the interval is whole µs. Beyond that, [`redis_quota`](RedisEncoding::redis_quota)
    /// rounds the interval up to whole µs: a rate lower by less than 1 µs per interval (a relative
    /// error below `1 µs / interval`), and exact again for that quota. The only rounding a µs clock
    /// forces is then that `now`
    /// is a whole µs: decisions, `retry_after` and `reset_after` are the core's at that instant, to the
    /// nanosecond. A TAT past 2^53 µs (year 2255) is refused (denied, never).
    Gcra
}

tat_encoding! {
    /// The leaky bucket meter is GCRA with `empty_at` as the TAT (see [`LeakyBucket`]): the same script,
    /// key format and exactness as [`Gcra`]'s encoding.
    LeakyBucket
}

/// [`RedisEncoding::redis_quota`] for the windows: the period rounded up to whole µs.
fn window_quota(quota: Quota) -> Result<Quota, QuotaError> {
    let period = quota.period_nanos();
    if period % 1000 == 0 {
        return Ok(quota);
    }
    let rounded = period.div_ceil(1000) * 1000; // period < 2^64 / 1000 × 1000 cannot overflow here
    let q = Quota::per(Duration::from_nanos(rounded), quota.limit())?;
    // The windows do not read the burst; keep it where the longer interval allows.
    Ok(q.with_burst(quota.burst()).unwrap_or(q))
}

/// The window scripts' figures in µs, for a period of whole µs (see [`window_quota`]).
#[derive(Clone, Copy, Debug)]
struct WindowUnits {
    window: u64,
    /// The largest window index a valid state holds: `index × window_us < 2^53`.
    max_index: u64,
    /// The largest count a valid state holds: what the core's layout packs, and `count × window_us`
    /// below 2^52 (at least the limit).
    max_count: u64,
}

impl WindowUnits {
    fn new(quota: &Quota, layout_max: u64) -> Result<WindowUnits, QuotaError> {
        let period = quota.period_nanos();
        if period % 1000 != 0 {
            return Err(QuotaError::InvalidDuration);
        }
        let window = period / 1000;
        if window >= LUA_PARAM_MAX {
            return Err(QuotaError::PeriodTooLong);
        }
        let max = (LUA_PARAM_MAX - 1) / window;
        if quota.limit() > max {
            return Err(QuotaError::LimitTooLarge { max });
        }
        Ok(WindowUnits {
            window,
            max_index: (2 * LUA_PARAM_MAX - 1) / window,
            max_count: layout_max.min(max),
        })
    }

    /// `(window_us, limit, max_count)`, durations in µs.
    fn params(self, quota: &Quota) -> ScriptParams {
        ScriptParams::new(1000, &[self.window, quota.limit(), self.max_count])
    }
}

/// Reads hash fields as integers, then the quota tag `q` (the last value: absent, or `params`'):
/// all absent, the fresh state; all present, the values; else corrupt (as the scripts read them).
fn counts<const N: usize>(
    values: &[Option<String>],
    params: Result<ScriptParams, QuotaError>,
) -> Result<Option<[u64; N]>, String> {
    let [values @ .., tag] = values else {
        return Err("no values".to_owned());
    };
    if values.len() != N {
        return Err(format!("{} values, want {}", values.len() + 1, N + 1));
    }
    if values.iter().all(Option::is_none) {
        return match tag {
            None => Ok(None),
            Some(_) => Err("a quota tag without a state".to_owned()),
        };
    }
    if let Some(tag) = tag {
        match params {
            Ok(p) if p.quota_tag() == *tag => {}
            _ => return Err(format!("written under another quota ({tag:?})")),
        }
    }
    let mut out = [0; N];
    for (o, v) in out.iter_mut().zip(values) {
        let raw = v.as_deref().ok_or("a field is missing")?;
        *o = raw
            .parse()
            .map_err(|_| format!("field {raw:?} is not an integer in plain digits"))?;
    }
    Ok(Some(out))
}

/// Fixed window in Redis: the key is a hash `{i: window index, c: count}` (the core's
/// [`FixedState`]), the index counted in windows since the Unix epoch, and `q`, the quota tag (see
/// the trait's docs).
///
/// The script computes in whole µs, so [`redis_quota`](RedisEncoding::redis_quota) rounds a period
/// that is not whole µs up to the next µs (a rate lower by less than 1 µs per window; periods built
/// from seconds, minutes or hours are unchanged). For such periods decisions equal the core's
/// exactly, to the nanosecond.
impl RedisEncoding for FixedWindow {
    const KEY_TYPE: KeyType = KeyType::Hash(&["i", "c", "q"]);

    fn script() -> &'static Script {
        &FIXED_WINDOW
    }

    fn refund_script() -> Option<&'static Script> {
        Some(&FIXED_WINDOW_REFUND)
    }

    fn charge_script() -> Option<&'static Script> {
        Some(&FIXED_WINDOW_CHARGE)
    }

    fn redis_quota(quota: Quota) -> Result<Quota, QuotaError> {
        window_quota(quota)
    }

    fn script_params(&self) -> Result<ScriptParams, QuotaError> {
        WindowUnits::new(self.quota(), self.layout().max_count()).map(|u| u.params(self.quota()))
    }

    fn encode(&self, word: u64) -> Vec<String> {
        let s = self.layout().unpack(word);
        vec![
            s.index.to_string(),
            s.count.to_string(),
            self.script_params()
                .map_or_else(|_| String::new(), |p| p.quota_tag()),
        ]
    }

    fn decode(&self, values: &[Option<String>]) -> Result<u64, String> {
        let Some([index, count]) = counts::<2>(values, self.script_params())? else {
            return Ok(0);
        };
        let layout = self.layout();
        let u = WindowUnits::new(self.quota(), layout.max_count()).map_err(|e| e.to_string())?;
        if count > u.max_count || index > u.max_index {
            return Err(format!("index {index}, count {count} out of range"));
        }
        Ok(layout.pack(FixedState { index, count }))
    }

    fn ttl(&self, word: u64, now: Nanos) -> Nanos {
        let end =
            (self.layout().unpack(word).index + 1).saturating_mul(self.quota().period_nanos());
        end.saturating_sub(now)
    }
}

/// Sliding window counter in Redis: the key is a hash `{i: window index, p: previous count, c:
/// current count}` (the core's [`SlidingState`]) and `q`, the quota tag (see the trait's docs).
///
/// As the fixed window: a period that is not whole µs is rounded up to the next µs by
/// [`redis_quota`](RedisEncoding::redis_quota). Decisions then equal the core's except one rounding
/// the µs clock forces: a denial's `retry_after` is the core's rounded up to whole µs (the first
/// instant a µs clock can see at which the request fits), when `limit` is at most the window in µs.
impl RedisEncoding for SlidingWindow {
    const KEY_TYPE: KeyType = KeyType::Hash(&["i", "p", "c", "q"]);

    fn script() -> &'static Script {
        &SLIDING_WINDOW
    }

    fn refund_script() -> Option<&'static Script> {
        Some(&SLIDING_WINDOW_REFUND)
    }

    fn charge_script() -> Option<&'static Script> {
        Some(&SLIDING_WINDOW_CHARGE)
    }

    fn redis_quota(quota: Quota) -> Result<Quota, QuotaError> {
        window_quota(quota)
    }

    fn script_params(&self) -> Result<ScriptParams, QuotaError> {
        WindowUnits::new(self.quota(), self.layout().max_count()).map(|u| u.params(self.quota()))
    }

    fn encode(&self, word: u64) -> Vec<String> {
        let s = self.layout().unpack(word);
        vec![
            s.index.to_string(),
            s.previous.to_string(),
            s.current.to_string(),
            self.script_params()
                .map_or_else(|_| String::new(), |p| p.quota_tag()),
        ]
    }

    fn decode(&self, values: &[Option<String>]) -> Result<u64, String> {
        let Some([index, previous, current]) = counts::<3>(values, self.script_params())? else {
            return Ok(0);
        };
        let layout = self.layout();
        let u = WindowUnits::new(self.quota(), layout.max_count()).map_err(|e| e.to_string())?;
        let max = u.max_count;
        if previous > max || current > max || index > u.max_index {
            return Err(format!(
                "index {index}, counts {previous}/{current} out of range"
            ));
        }
        Ok(layout.pack(SlidingState {
            index,
            previous,
            current,
        }))
    }

    fn ttl(&self, word: u64, now: Nanos) -> Nanos {
        let end =
            (self.layout().unpack(word).index + 2).saturating_mul(self.quota().period_nanos());
        end.saturating_sub(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_divide_the_interval_and_a_microsecond() {
        let u = TatUnits::new(333_333_334, 3).unwrap();
        assert_eq!((u.unit, u.interval, u.depth), (2, 166_666_667, 500_000_001));
        let u = TatUnits::new(10_000_000, 100).unwrap();
        assert_eq!((u.unit, u.interval), (1000, 10_000));
        // A depth of 2^51 units or more is not exact: the quota is rounded to whole µs instead.
        let q = Quota::per(Duration::from_nanos(1_000_001), 1)
            .unwrap()
            .with_burst(1 << 32)
            .unwrap();
        assert!(TatUnits::new(1_000_001, 1 << 32).is_none());
        let r = gcra_quota(q).unwrap();
        assert_eq!(r.emission_interval_nanos(), 1_001_000);
        assert_eq!((r.limit(), r.burst()), (1, 1 << 32));
        assert!(TatUnits::for_quota(&r).is_ok());
    }

    #[test]
    fn windows_round_the_period_up_to_whole_microseconds() {
        let q = Quota::per(Duration::from_nanos(1_500_001), 7).unwrap();
        let r = window_quota(q).unwrap();
        assert_eq!((r.period_nanos(), r.limit()), (1_501_000, 7));
        let whole = Quota::per_second(5).unwrap();
        assert_eq!(window_quota(whole).unwrap(), whole);
        assert!(WindowUnits::new(&q, 100).is_err());
        let u = WindowUnits::new(&r, 100).unwrap();
        assert_eq!(u.params(&r).args(), ["1501", "7", "100"]);
    }
}
