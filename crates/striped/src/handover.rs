//! Handing a striped limiter's place on the GCRA timeline to a successor (a reload with a new
//! quota, a hot key's demotion): read it ([`shared_tat`](StripedLimiter::shared_tat)), stop the
//! old limiter granting ([`retire`](StripedLimiter::retire)), start the new one there
//! ([`with_shared_tat`](StripedLimiter::with_shared_tat),
//! [`raise_shared_tat`](StripedLimiter::raise_shared_tat)); and when to, once the quota has been
//! idle ([`is_idle_at`](StripedLimiter::is_idle_at)).

use crossbeam_utils::CachePadded;
use tollgate_core::{Algorithm, Clock, Nanos};

use crate::limiter::StripedLimiter;
use crate::shared::Shared;
use crate::sync::Ordering;

impl<C: Clock> StripedLimiter<C> {
    /// This (fresh) limiter with its shared GCRA word set to `tat`: how a reconfigured limiter takes
    /// over a predecessor's position on the timeline (read with
    /// [`shared_tat`](Self::shared_tat)), so that a quota change hands nobody a fresh burst. Units the
    /// predecessor's stripes still hold are not carried (stricter); admissions the predecessor makes
    /// after the read are not seen (looser by at most what its in-flight callers take).
    pub fn with_shared_tat(self, tat: Nanos) -> Self {
        StripedLimiter {
            shared: CachePadded::new(Shared::new(
                tat,
                !self.always_lease,
                self.gcra.quota().burst(),
            )),
            ..self
        }
    }

    /// Moves the shared GCRA word up to `tat` if it is below (never down): how a limiter replacing
    /// another (see [`retire`](Self::retire)) takes over the predecessor's place on the timeline
    /// before anyone decides on it. Only stricter, so safe on a live limiter too.
    pub fn raise_shared_tat(&self, tat: Nanos) {
        let raised: Result<((), u64), std::convert::Infallible> =
            self.shared.update(self.shared.load(), |current| {
                Ok(((), (tat > current).then_some(tat)))
            });
        let _ = raised;
    }

    /// Stops this limiter granting anything more from its shared word, for good, and returns the word
    /// as it was: for a limiter being replaced (a reload with a new quota) while threads may still be
    /// deciding on it. Those threads use up the leases their stripes already hold (units the
    /// returned word accounts for) and are denied beyond them, so the successor, started from the
    /// returned word (carried over as the caller sees fit), never shares a unit with it.
    ///
    /// The word is moved two bucket depths past `max(word, at)`: a grant then needs a caller's `now`
    /// more than one depth past `at`, far beyond any decision already under way at `at`, and a
    /// denial's `retry_after` stays within two depths.
    pub fn retire(&self, at: Nanos) -> Nanos {
        let closed = |tat: Nanos| {
            tat.max(at)
                .saturating_add(self.gcra.depth().saturating_mul(2))
        };
        let retired: Result<(Nanos, u64), std::convert::Infallible> = self
            .shared
            .update(self.shared.load(), |tat| Ok((tat, Some(closed(tat)))));
        match retired {
            Ok((tat, _)) => tat,
            Err(never) => match never {},
        }
    }

    /// The shared GCRA state: the instant the quota's bucket would be full again if every lease
    /// were used. A limiter rebuilt with [`with_shared_tat`](Self::with_shared_tat) at this value
    /// continues the same timeline (the policy engine's reload of a striped rule does this).
    pub fn shared_tat(&self) -> Nanos {
        self.shared.load()
    }

    /// Whether the quota's bucket has been full for at least `idle` at `now`: the shared TAT is at
    /// or before `now − idle` (the test a keyed table's promoted key cools by).
    ///
    /// Cheap while the limiter is busy: when the calling thread's stripe holds a lease ending after
    /// `now − idle`, the answer is `false` without reading the shared word, whose cache line every
    /// lease writes (a lease ends at or before the shared TAT). A refund or give-back that lowered
    /// the shared TAT below that lease's end can make the answer `false` where the shared word alone
    /// would say `true`, until this stripe's next lease: the hint delays the answer, never
    /// advances it.
    ///
    /// ```
    /// use tollgate_core::{Limiter, ManualClock, Quota};
    /// use tollgate_striped::StripedLimiter;
    ///
    /// let limiter = StripedLimiter::with_clock(Quota::per_second(10)?, ManualClock::new())?;
    /// assert!(limiter.check_at(1_000_000_000, 1)?.is_allowed());
    /// // The unit is back 100 ms later; the bucket has been full since then.
    /// assert!(!limiter.is_idle_at(1_050_000_000, 0));
    /// assert!(limiter.is_idle_at(1_300_000_000, 200_000_000));
    /// assert!(!limiter.is_idle_at(1_300_000_000, 250_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_idle_at(&self, now: Nanos, idle: Nanos) -> bool {
        let Some(since) = now.checked_sub(idle) else {
            return false;
        };
        // Relaxed: a hint; an earlier end than the latest only sends us to the shared word, which
        // answers exactly, and a later one is a lease that did end after `since`.
        let end = self.stripes[self.current_stripe()]
            .end
            .load(Ordering::Relaxed);
        end <= since && self.shared.load() <= since
    }
}
