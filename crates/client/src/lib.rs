//! Client-side retry for services behind Tollgate (or any rate limiter): capped exponential
//! backoff with jitter, the server's `Retry-After` and `RateLimit` hints honoured, as a plain
//! iterator of delays or as a [`tower`] retry layer for `http` services.
//!
//! # Backoff formulas
//! For retry number `n` (0 for the first retry), with `exp(n) = min(cap, base·2^n)`:
//!
//! | [`Jitter`] | delay |
//! | --- | --- |
//! | `None` | `exp(n)` |
//! | `Full` | `random(0, exp(n))` |
//! | `Equal` | `exp(n)/2 + random(0, exp(n)/2)` |
//! | `Decorrelated` | `min(cap, random(base, prev·3))`, `prev` = the previous delay (`base` at first) |
//!
//! All arithmetic saturates on whole nanoseconds (`base·2^n` tops out at `u64::MAX` ns, about
//! 584 years, before the cap applies), so no attempt number or cap can overflow or panic.
//! Randomness comes from a caller-supplied [`rand::Rng`]: a seeded one gives reproducible
//! delays. A nonsensical configuration (zero base, cap below base, zero max attempts, zero max
//! elapsed time) is a [`BackoffError`] from [`BackoffBuilder::build`].
//!
//! # Tollgate's default: full jitter
//! [`Backoff::default`] is base 100 ms, cap 10 s, 5 attempts, **full jitter**, chosen from the
//! herd simulation (tollgate-lab's `herd`; numbers in `results/herd/herd.md`): N clients fail
//! together and retry against a 10 req/s GCRA with burst 10 and with burst 1 (strict pacing).
//! * No jitter is the herd: with strict pacing it made 5150 calls for N = 100 (6.6 times full
//!   jitter) and its last client waited 943 s instead of 25 s; with burst 10 it made 18% more
//!   calls and finished at 62.7 s instead of 12-14 s.
//! * Among the jitters the work is close and depends on the base. Decorrelated made the fewest
//!   calls at a 100 ms or 1 s base, but about 47% more than full jitter at a 10 ms base (it
//!   climbs from `base` by a random factor averaging under 2). Equal jitter keeps half of each
//!   delay fixed, so its herd stays bunched: its last client was 30-55% later with strict
//!   pacing.
//! * Full jitter had no such blow-up at any base, the earliest last client with strict pacing
//!   at N = 100, and needs no state between retries. That robustness is why it is the default;
//!   pick [`Jitter::Decorrelated`] when the base sits near the server's emission interval.
//!
//! # Retry-After and RateLimit rules
//! * A retryable response's `Retry-After` takes precedence over the computed backoff:
//!   delay-seconds or an HTTP-date, the latter measured against a `now: SystemTime` the caller
//!   passes ([`retry_after`], [`parse_retry_after`]). A date in the past means "retry now"; a
//!   malformed value is ignored (backoff applies).
//! * A server-given wait is never shortened, but a small bounded extra is added
//!   ([`ServerJitter`], default up to 50 % of the wait and at most 1 s, from the same seeded
//!   RNG): delay-seconds are whole seconds, so without it every client denied in the same
//!   round comes back together (the herd simulation's `retry-after` rows).
//! * Without `Retry-After`, a `RateLimit` header (`"name";r=0;t=5`, Structured Fields) whose
//!   policy has nothing remaining gives a wait of `t` seconds ([`pause_hint`]): the time until
//!   the policy admits more than `r` (here: any) units, the same wait on a success and on a 429.
//!   A client can read it on successful responses to pause before hitting the wall.
//! * The policy's limits still apply: a server wait **longer than `cap`**, or one that would
//!   start the retry **after `max_elapsed`**, makes the client give up
//!   ([`GiveUp::ServerDelayAboveCap`], [`GiveUp::MaxElapsed`]) and return the last response,
//!   rather than retrying earlier than the server allowed. Server waits count as attempts.
//!
//! # Using it
//! * Any client: [`Backoff::delays`] is an iterator of waits that ends at `max_attempts` or
//!   `max_elapsed`; [`Backoff::next_delay`] is the step function with a server hint.
//! * tower: [`RetryLayer`] / [`RetryPolicy`] retry only idempotent methods, statuses 429 and
//!   503, and every transport error by default; request bodies must be `Clone`. Sleeping is
//!   `tokio::time::sleep`.
//!
//! ```
//! use std::time::Duration;
//! use rand::SeedableRng;
//! use tollgate_client::Backoff;
//!
//! let policy = Backoff::builder().max_elapsed(Duration::from_secs(5)).build()?;
//! let mut total = Duration::ZERO;
//! for wait in policy.delays(rand::rngs::StdRng::seed_from_u64(1)) {
//!     assert!(wait <= policy.cap());
//!     total += wait; // sleep(wait) and call again here
//! }
//! assert!(total <= Duration::from_secs(5));
//! # Ok::<(), tollgate_client::BackoffError>(())
//! ```

mod backoff;
mod headers;
mod retry;

pub use backoff::{
    Backoff, BackoffBuilder, BackoffError, BackoffState, Delays, GiveUp, Jitter, ServerJitter,
};
pub use headers::{
    InvalidRateLimit, InvalidRetryAfter, RATELIMIT, RateLimitEntry, parse_retry_after, pause_hint,
    ratelimit_entries, retry_after,
};
pub use retry::{
    AllErrors, DEFAULT_RETRY_STATUSES, IDEMPOTENT_METHODS, RetryError, RetryLayer, RetryPolicy,
};
