//! The pure arithmetic of leases: what a stripe may still use, and the shared-state transition that
//! returns an old lease and grants a new one in one compare-and-swap.

use tollgate_core::Nanos;
use tollgate_core::algorithm::gcra::Timeline;

/// Units of a lease holding `units` positions `[end − units·T, end)` that are still usable at `now`:
/// those at positions `≥ now`. `None` when the lease may not be used at all at `now` because its end
/// is more than the bucket depth ahead (only possible when the clock went backwards); the caller then
/// goes to the shared state, which is stricter.
#[inline]
pub(crate) fn alive_units(units: u64, end: Nanos, now: Nanos, timeline: &Timeline) -> Option<u64> {
    if end > now.saturating_add(timeline.depth()) {
        return None;
    }
    let ahead = end.saturating_sub(now);
    // Fast case without a division: every held position is still ahead of now.
    match units.checked_mul(timeline.interval()) {
        Some(span) if span <= ahead => Some(units),
        _ => Some(timeline.units_in(ahead).min(units)),
    }
}

/// What one attempt on the shared word decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grant {
    /// `units` units granted at positions `[base, base + units·T)`; the new TAT is that segment's end.
    Granted {
        /// First granted position.
        base: Nanos,
        /// Units granted (`cost ≤ units ≤ want`).
        units: u64,
        /// Whether the caller's old lease was given back in the same write.
        returned: bool,
    },
    /// Not even `cost` units are available: nothing is written.
    Denied {
        /// The shared TAT the denial was based on.
        tat: Nanos,
    },
}

/// The lease transition on the shared TAT: optionally give back the caller's unused positions
/// `[lo, end)` — only when `tat == end`, i.e. nothing was granted above them since — then grant
/// `min(want, available)` units from `max(tat, now)` if that is at least `cost`.
///
/// Returns the outcome and the word to store (`None`: store nothing). A denial stores nothing, even
/// when a give-back was possible: the caller keeps its old lease instead.
///
/// Invariant kept (see the crate docs): no position at or above the shared TAT is used or held by a
/// lease. The give-back keeps it because `[lo, end)` was held only by the caller, who has retired it,
/// and nothing at or above `end` is held when `tat == end`.
#[inline]
pub(crate) fn grant(
    tat: Nanos,
    now: Nanos,
    cost: u64,
    want: u64,
    give_back: Option<(Nanos, Nanos)>,
    timeline: &Timeline,
) -> (Grant, Option<Nanos>) {
    let (from, returned) = match give_back {
        Some((lo, end)) if end == tat => (lo, true),
        _ => (tat, false),
    };
    let base = from.max(now);
    let free = timeline.available(base, now);
    if free < cost || cost == 0 {
        return (Grant::Denied { tat }, None);
    }
    let units = want.max(cost).min(free);
    // `units ≤ free` so `base + units·T ≤ now + depth`, which saturating_add kept ≤ u64::MAX.
    let next = base + units * timeline.interval();
    (
        Grant::Granted {
            base,
            units,
            returned,
        },
        Some(next),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T = 10 ns, D = 100 ns (burst 10).
    fn tl() -> Timeline {
        let quota = tollgate_core::Quota::per(std::time::Duration::from_nanos(10), 1)
            .and_then(|q| q.with_burst(10))
            .expect("valid quota");
        let timeline = Timeline::new(&quota);
        assert_eq!((timeline.interval(), timeline.depth()), (10, 100));
        timeline
    }

    #[test]
    fn alive_drops_positions_behind_now() {
        // Lease of 5 units at [50, 100).
        assert_eq!(alive_units(5, 100, 0, &tl()), Some(5));
        assert_eq!(alive_units(5, 100, 50, &tl()), Some(5));
        assert_eq!(alive_units(5, 100, 51, &tl()), Some(4));
        assert_eq!(alive_units(5, 100, 99, &tl()), Some(0));
        assert_eq!(alive_units(5, 100, 100, &tl()), Some(0));
        assert_eq!(alive_units(5, 100, 1_000, &tl()), Some(0));
        // End more than a depth ahead (clock went back): unusable.
        assert_eq!(alive_units(5, 300, 100, &tl()), None);
    }

    #[test]
    fn grant_takes_what_is_free() {
        // Fresh: 10 free; want 4 → [0, 40).
        assert_eq!(
            grant(0, 0, 1, 4, None, &tl()),
            (
                Grant::Granted {
                    base: 0,
                    units: 4,
                    returned: false
                },
                Some(40)
            )
        );
        // Only 2 free at TAT 80: a cost of 2 gets 2, a cost of 3 is denied and writes nothing.
        assert_eq!(
            grant(80, 0, 2, 4, None, &tl()),
            (
                Grant::Granted {
                    base: 80,
                    units: 2,
                    returned: false
                },
                Some(100)
            )
        );
        assert_eq!(
            grant(80, 0, 3, 4, None, &tl()),
            (Grant::Denied { tat: 80 }, None)
        );
    }

    #[test]
    fn give_back_only_when_tail() {
        // Our lease [60, 100) unused from 70: give back [70, 100) and re-grant from 70.
        assert_eq!(
            grant(100, 0, 1, 3, Some((70, 100)), &tl()),
            (
                Grant::Granted {
                    base: 70,
                    units: 3,
                    returned: true
                },
                Some(100)
            )
        );
        // Someone granted above us (TAT 120): no give-back.
        assert_eq!(
            grant(120, 30, 1, 3, Some((70, 100)), &tl()),
            (
                Grant::Granted {
                    base: 120,
                    units: 1,
                    returned: false
                },
                Some(130)
            )
        );
        // A denial writes nothing even when a give-back was possible.
        assert_eq!(
            grant(100, 0, 5, 5, Some((90, 100)), &tl()),
            (Grant::Denied { tat: 100 }, None)
        );
    }

    #[test]
    fn interval_division_matches_plain_division() {
        for nanos in [1, 2, 3, 8, 10, 1 << 20, 999_999_937] {
            let quota = tollgate_core::Quota::per(std::time::Duration::from_nanos(nanos), 1)
                .expect("valid quota");
            let timeline = Timeline::new(&quota);
            for x in [0, 1, 7, 1_000, 123_456_789, Nanos::MAX] {
                assert_eq!(timeline.units_in(x), x / nanos);
            }
        }
    }

    #[test]
    fn huge_times_do_not_overflow() {
        let (g, next) = grant(Nanos::MAX - 5, Nanos::MAX - 50, 1, 4, None, &tl());
        assert!(matches!(g, Grant::Denied { .. }) || next.is_some());
        assert_eq!(tl().available(0, Nanos::MAX), 0);
    }
}
