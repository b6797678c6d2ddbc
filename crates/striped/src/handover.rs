//! Handing a striped limiter's place on the GCRA timeline to a successor (a reload with a new
//! quota, a hot key's demotion): read it ([`shared_tat`](StripedLimiter::shared_tat)), stop the
//! old limiter granting ([`retire`](StripedLimiter::retire)), start the new one there
//! ([`with_shared_tat`](StripedLimiter::with_shared_tat),
//! [`raise_shared_tat`](StripedLimiter::raise_shared_tat)).

use crossbeam_utils::CachePadded;
use tollgate_core::{Clock, Nanos};

use crate::limiter::StripedLimiter;
use crate::shared::Shared;

impl<C: Clock> StripedLimiter<C> {
    /// This (fresh) limiter with its shared GCRA word set to `tat`: how a reconfigured limiter takes
    /// over a predecessor's position on the timeline (read with
    /// [`shared_tat`](Self::shared_tat)), so that a quota change hands nobody a fresh burst. Units the
    /// predecessor's stripes still hold are not carried (stricter); admissions the predecessor makes
    /// after the read are not seen (looser by at most what its in-flight callers take).
    pub fn with_shared_tat(self, tat: Nanos) -> Self {
        StripedLimiter {
            shared: CachePadded::new(Shared::new(tat, !self.always_lease)),
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
}
