//! Concurrency limits that follow the upstream: how many requests may be in flight at once, with
//! the limit moved by measured latency.
//!
//! A rate limit bounds requests per second; it does not stop a slow upstream from being buried by
//! requests it already admitted. An in-flight limit does, and an *adaptive* one finds the limit
//! itself: the concurrency past which the upstream only queues (its knee).
//!
//! * [`ConcurrencyLimiter`]: [`acquire`](ConcurrencyLimiter::acquire) a [`Token`] (or `None`: answer
//!   503 at once), [`complete`](Token::complete) it with the latency, or drop it (a drop: no
//!   sample). Admission is lock-free (one compare-and-swap); a finished request takes one short,
//!   uncontended-in-practice lock around the algorithm's update. A lock-free sample path (atomic
//!   sums swapped out per window) was not worth its subtlety: a window's latency sum and its count
//!   would be swapped out separately, and the update would need a lock anyway.
//! * Behind one [`LimitAlgorithm`] trait: [`GradientLimit`] (adaptive), [`AimdLimit`] (loss-based,
//!   for comparison) and [`FixedLimit`].
//! * [`sim`]: a deterministic simulator (simulated time, seeded arrivals, a model upstream with a
//!   knee) that the tests and `results/concurrency/adaptive.md` use.
//!
//! # Which algorithm, and why
//! [`GradientLimit`] is **Gradient-like** (Netflix's Gradient2 family, also Envoy's gradient
//! controller) rather than Vegas-like: it compares the recent latency with a no-load baseline
//! and, when latency is up, scales the limit by their ratio (`limit × baseline / latency`). In a
//! saturated upstream, concurrency × baseline / latency is the concurrency the upstream actually
//! serves, so one step lands on the knee; Vegas instead estimates a queue length
//! (`limit × (1 − baseline / latency)`) and walks towards a queue of α…β requests one step at a
//! time, so its settling point depends on absolute thresholds that must be tuned per service.
//! Two known weak spots of the peers shaped the rest:
//!
//! * **Probe-time 503 bursts (Envoy #8337, #18152, #46532).** Envoy's gradient controller
//!   re-measures its minimum RTT by pinning concurrency to `min_concurrency` (1, later 3) for a
//!   window of requests, which refuses almost all traffic meanwhile; the same knob is also the
//!   controller's floor. Here there is **no probe**: the baseline is the lowest *window mean* of
//!   the last `baseline_windows` windows, refreshed by ordinary traffic, because every decrease
//!   brings concurrency back to the knee, where latency is the baseline again. `min_limit` is only
//!   a floor. When the upstream itself gets slower (latency stays up while the limit keeps
//!   falling for `relearn_after` windows), the baseline is re-learned from current windows
//!   instead of pinning the limit down.
//! * **Gradient2's upward creep (Netflix/concurrency-limits PR #134).** Gradient2 sets
//!   `limit × gradient + queue_size` on every update, so under moderate overload (gradient
//!   about 0.8) the added queue term outgrows the cut and the limit climbs without end; its
//!   baseline is also a long-term average that drifts up with sustained load. Here growth
//!   happens **only** in windows that saw no queueing (`latency ≤ tolerance × baseline`) and used
//!   at least half the limit, and the baseline is a windowed minimum, not an average.
//!
//! Bounds: `min_limit ≤ limit ≤ max_limit`. Smoothing: latency is averaged over a window of at
//! least `max(min_window, limit)` requests (about one round trip of the whole limit), extended until
//! the window's mean is precise to a quarter of the tolerance (noisy upstreams), a decrease moves
//! `smoothing` of the way to its target and cuts at most to `max_decrease × limit` per window,
//! growth is `max(1, growth × limit)` per window.
//!
//! In the simulator (knee 100, base 10 ms, Poisson arrivals at 1.5 × capacity, seed fixed) the
//! limit settles within 10 % of the knee within 3 s of simulated time (1.6–2.5 s over 30 seeds),
//! stays there for a minute of steady load with no creep and no refusal bursts, and is within 10 %
//! of the knee within 1 s after a 3 × latency spike ends (during it the limit dips for a few
//! windows, then re-learns and restores it): see `tests/simulation.rs` and
//! `results/concurrency/adaptive.md`.
//!
//! **Noise.** `tolerance` (default 3 %) must exceed what noise does to a window's mean. The window
//! grows with the noise, which covers per-request noise up to about ±10–20 %; for a noisier
//! upstream (±50 % uniform in the tests) set `tolerance` to 1.1, or noise reads as queueing and
//! the limit sinks well below the knee.
//!
//! # What the caller measures
//! The limiter reads no clock: the caller passes the latency it measured. A request that ends in
//! an error the upstream answered quickly (a 4xx) may still be completed with its latency; a
//! request cancelled or timed out should be dropped, so a timeout's arbitrary latency does not
//! pollute the mean.

// The guide's code blocks are this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../guides/adaptive.md")]
struct GuideAdaptive;

mod algorithm;
mod gradient;
mod limiter;
pub mod sim;

pub use algorithm::{AimdConfig, AimdLimit, FixedLimit, LimitAlgorithm, LimitConfigError, Sample};
pub use gradient::{GradientConfig, GradientLimit};
pub use limiter::{ConcurrencyLimiter, OwnedToken, Token};
