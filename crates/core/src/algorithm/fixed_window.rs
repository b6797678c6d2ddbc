//! Fixed window: at most `limit` units per aligned window of length `period`.
//!
//! The cheapest algorithm and the coarsest: a client can spend a whole window's limit just before a
//! boundary and another just after it, so up to `2 × limit` may pass within one window's length.
//! Bound: in every aligned window, admissions total at most `limit`.

use crate::algorithm::window::WindowQuota;
use crate::algorithm::{Algorithm, Transition};
use crate::clock::Nanos;
use crate::decision::{CheckError, Decision};
use crate::quota::{Quota, QuotaError};

/// A fixed-window state, unpacked: which window, and how much it has admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedState {
    /// `now / period` when the state was last written.
    pub index: u64,
    /// Units admitted in that window.
    pub count: u64,
}

/// The bit layout of a [`FixedState`] in one `u64`: `[ index : 64 − B | count : B ]`.
///
/// `B` is fixed per limiter as `⌊log₂ period_ns⌋` (at most 63). Then the largest window index the
/// clock can ever produce, `u64::MAX / period`, is below `2^(64 − B)`: the index never wraps, so a
/// limiter idle for any length of time reads as a past window, never as the current one. The price is
/// the largest limit, `2^B − 1`: about 5.4 × 10⁸ for a 1 s window, 5.2 × 10⁵ for 1 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedLayout {
    count_bits: u32,
}

impl FixedLayout {
    /// The layout for windows of `period` nanoseconds (`period >= 1`).
    pub fn for_period(period: Nanos) -> Self {
        FixedLayout {
            count_bits: period.max(1).ilog2(),
        }
    }

    /// The largest count this layout holds.
    pub fn max_count(self) -> u64 {
        (1u64 << self.count_bits) - 1
    }

    /// Packs `state`; `state.count` must be at most [`max_count`](Self::max_count).
    #[inline]
    pub fn pack(self, state: FixedState) -> u64 {
        (state.index << self.count_bits) | state.count
    }

    /// Unpacks a word written by [`pack`](Self::pack).
    #[inline]
    pub fn unpack(self, word: u64) -> FixedState {
        FixedState {
            index: word >> self.count_bits,
            count: word & self.max_count(),
        }
    }
}

/// Fixed window counter: `quota.limit()` units per aligned window of `quota.period()`.
///
/// State word: window index and count, packed by [`FixedLayout`] (0 = fresh). A denial is one load and
/// no write; an admission one compare-and-swap. Memory: 8 bytes per limiter or key.
///
/// ```
/// use tollgate_core::{algorithm::Algorithm, FixedWindow, Quota};
/// let fw = FixedWindow::from_quota(Quota::per_minute(100)?)?;
/// let minute = 60_000_000_000;
/// // 100 at 00:59 ...
/// let t = fw.decide(0, 59 * minute / 60, 100)?;
/// assert!(t.decision.is_allowed());
/// // ... and 100 more at 01:00: the boundary burst this algorithm allows.
/// assert!(fw.decide(t.next.unwrap(), minute, 100)?.decision.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    params: WindowQuota,
    layout: FixedLayout,
}

impl FixedWindow {
    /// The packing this limiter uses.
    pub fn layout(&self) -> FixedLayout {
        self.layout
    }
}

impl Algorithm for FixedWindow {
    const NAME: &'static str = "fixed_window";

    /// # Errors
    /// [`QuotaError::LimitTooLarge`] when `limit` exceeds `2^⌊log₂ period_ns⌋ − 1` (see [`FixedLayout`]).
    fn from_quota(quota: Quota) -> Result<Self, QuotaError> {
        let layout = FixedLayout::for_period(quota.period_nanos());
        Ok(FixedWindow {
            params: WindowQuota::new(quota, layout.max_count())?,
            layout,
        })
    }

    fn quota(&self) -> &Quota {
        &self.params.quota
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.params.limit
    }

    #[inline]
    fn decide(&self, word: u64, now: Nanos, cost: u64) -> Result<Transition, CheckError> {
        self.check_cost(cost)?;
        let state = self.layout.unpack(word);
        let now_index = now / self.params.window;
        // A later window starts from zero; a clock gone backwards keeps counting in the stored window.
        let (index, count) = if now_index > state.index {
            (now_index, 0)
        } else {
            (state.index, state.count)
        };
        // `index <= u64::MAX / window`, but `(index + 1) × window` may pass the end of time: the last
        // window then never ends within the range (`Decision::NEVER`). Otherwise `end > now`.
        let until_end = (index + 1)
            .checked_mul(self.params.window)
            .map_or(Nanos::MAX, |end| end - now);
        let used = count + cost; // both at most `limit`, so no overflow
        if used > self.params.limit {
            // `cost <= limit`, so the next window admits it.
            return Ok(Transition::unchanged(Decision::denied(
                until_end, until_end,
            )));
        }
        let reset_after = if used == 0 { 0 } else { until_end };
        let decision = Decision::allowed(self.params.limit - used, reset_after);
        if cost == 0 {
            return Ok(Transition::unchanged(decision));
        }
        Ok(Transition::allow(
            decision,
            self.layout.pack(FixedState { index, count: used }),
        ))
    }

    #[inline]
    fn is_fresh(&self, word: u64, now: Nanos) -> bool {
        let state = self.layout.unpack(word);
        state.count == 0 || now / self.params.window > state.index
    }

    /// Adds `cost` to `now`'s window count, beyond the limit if need be (capped at what the layout
    /// holds, [`FixedLayout::max_count`]); a clock gone backwards counts into the stored window, as
    /// a decision does. The next window starts from zero: a fixed window carries no debt over.
    #[inline]
    fn charge(&self, word: u64, now: Nanos, cost: u64) -> Option<u64> {
        if cost == 0 {
            return None;
        }
        let state = self.layout.unpack(word);
        let now_index = now / self.params.window;
        let (index, count) = if now_index > state.index {
            (now_index, 0)
        } else {
            (state.index, state.count)
        };
        let count = count.saturating_add(cost).min(self.layout.max_count());
        Some(self.layout.pack(FixedState { index, count }))
    }

    /// Takes `cost` off the count when the stored window is `now`'s window (where the admission
    /// counted it). A later stored window means the count it was in has already reset: nothing to
    /// undo, which is exact. An earlier or clock-gone-backwards window is ambiguous, so nothing is
    /// given back there (stricter).
    #[inline]
    fn refund(&self, word: u64, now: Nanos, cost: u64) -> Option<u64> {
        let state = self.layout.unpack(word);
        if cost == 0 || state.count == 0 || state.index != now / self.params.window {
            return None;
        }
        Some(self.layout.pack(FixedState {
            index: state.index,
            count: state.count.saturating_sub(cost),
        }))
    }
}
