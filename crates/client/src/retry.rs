//! The tower retry policy and layer; see [`RetryPolicy`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use http::{Method, Request, Response, StatusCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, Sleep};
use tower::Layer;

use crate::backoff::{Backoff, BackoffState};
use crate::headers::{pause_hint, retry_after};

/// Decides whether a service error is worth retrying.
///
/// Implemented by [`AllErrors`] and by every closure `Fn(&E) -> bool`.
pub trait RetryError<E> {
    /// `true` to retry after this error.
    fn should_retry(&self, error: &E) -> bool;
}

/// The default error predicate: every error is retried (transport errors are usually
/// transient).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllErrors;

impl<E> RetryError<E> for AllErrors {
    fn should_retry(&self, _: &E) -> bool {
        true
    }
}

impl<E, F: Fn(&E) -> bool> RetryError<E> for F {
    fn should_retry(&self, error: &E) -> bool {
        self(error)
    }
}

/// Hands out one RNG seed per request.
#[derive(Debug)]
struct SeedSource {
    seed: u64,
    next: AtomicU64,
}

impl SeedSource {
    fn new(seed: u64) -> Self {
        SeedSource {
            seed,
            next: AtomicU64::new(0),
        }
    }

    fn rng(&self) -> SmallRng {
        // Relaxed: the counter only has to hand out distinct values; it publishes no other
        // memory, and the order in which concurrent requests draw them does not matter.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // seed_from_u64 scrambles its input, so consecutive counters give unrelated streams.
        SmallRng::seed_from_u64(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

/// Per-request progress, created when a request is first cloned.
#[derive(Debug, Clone)]
struct InFlight {
    start: Instant,
    state: BackoffState,
    rng: SmallRng,
}

/// A [`tower::retry::Policy`] for `http::Request<B>` → `http::Response<_>` services: capped
/// exponential backoff with jitter, `Retry-After` and `RateLimit` honoured, only safe methods
/// retried.
///
/// # Which requests are retried
/// * Only methods that are safe to repeat: by default the idempotent ones, `GET`, `HEAD`,
///   `OPTIONS`, `PUT`, `DELETE` and `TRACE` ([`RetryPolicy::retry_methods`] changes the set).
///   Any other request is not even cloned, so it is never retried.
/// * Responses whose status is in the retry set: `429 Too Many Requests` and
///   `503 Service Unavailable` by default ([`RetryPolicy::retry_statuses`]).
/// * Errors for which the predicate says yes: by default every transport error
///   ([`AllErrors`]; [`RetryPolicy::retry_errors`] takes a closure `Fn(&E) -> bool`).
///
/// # How long to wait
/// A retryable response's `Retry-After` wins; without one, a `RateLimit` header with `r=0`
/// gives its reset `t` ([`crate::pause_hint`]); without either, the [`Backoff`] decides.
/// A server wait longer than the backoff's `cap`, or one that would push the retry past
/// `max_elapsed`, makes the policy give up and hand back the response it got. Waiting is
/// `tokio::time::sleep`, so a paused tokio clock makes tests instant and exact.
///
/// # Request bodies
/// `tower::retry::Policy::clone_request` must copy the request before it is sent, so this
/// policy is implemented for `http::Request<B>` with **`B: Clone`**: buffered bodies such as
/// `()`, `String`, `Vec<u8>` or `bytes::Bytes`. Method, URI, version, headers and extensions
/// are copied too. A streaming body that cannot be cloned must be buffered first (or the
/// request rebuilt by the caller from its own data).
///
/// # Randomness
/// Every request gets its own RNG, seeded from the policy's seed and a per-policy request
/// counter, so concurrent requests do not share a jitter sequence (which would recreate the
/// herd jitter exists to break up). [`RetryPolicy::seed`] makes a run reproducible.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use http::{Method, StatusCode};
/// use tollgate_client::{Backoff, RetryLayer, RetryPolicy};
///
/// let backoff = Backoff::builder().max_attempts(4).cap(Duration::from_secs(30)).build()?;
/// let policy = RetryPolicy::new(backoff)
///    .retry_statuses([StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_GATEWAY])
///    .retry_errors(|e: &std::io::Error| e.kind() != std::io::ErrorKind::InvalidInput)
///    .seed(42);
/// let layer = RetryLayer::new(policy); // wrap any Service<http::Request<B>> with B: Clone
/// # let _ = layer;
/// # Ok::<(), tollgate_client::BackoffError>(())
/// ```
#[derive(Clone)]
pub struct RetryPolicy<F = AllErrors> {
    backoff: Backoff,
    methods: Arc<[Method]>,
    statuses: Arc<[StatusCode]>,
    on_error: F,
    wall_clock: fn() -> SystemTime,
    seeds: Arc<SeedSource>,
    /// `None` in the policy a service holds; `Some` in the copy that travels with a request.
    in_flight: Option<InFlight>,
    /// Set once this copy has scheduled a retry: its later `clone_request` calls belong to
    /// the same request and must keep its progress.
    retrying: bool,
}

impl<F> fmt::Debug for RetryPolicy<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("backoff", &self.backoff)
            .field("methods", &self.methods)
            .field("statuses", &self.statuses)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// Methods that are safe to repeat (RFC 9110 §9.2.2 idempotent methods).
pub const IDEMPOTENT_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::OPTIONS,
    Method::PUT,
    Method::DELETE,
    Method::TRACE,
];

/// Statuses retried by default.
pub const DEFAULT_RETRY_STATUSES: [StatusCode; 2] = [
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::SERVICE_UNAVAILABLE,
];

impl RetryPolicy<AllErrors> {
    /// A policy with this backoff, the idempotent methods, statuses 429 and 503, every error
    /// retried, the system wall clock for HTTP-date `Retry-After`, and a random seed.
    pub fn new(backoff: Backoff) -> Self {
        RetryPolicy {
            backoff,
            methods: Arc::from(IDEMPOTENT_METHODS),
            statuses: Arc::from(DEFAULT_RETRY_STATUSES),
            on_error: AllErrors,
            wall_clock: SystemTime::now,
            seeds: Arc::new(SeedSource::new(rand::rng().random())),
            in_flight: None,
            retrying: false,
        }
    }
}

impl<F> RetryPolicy<F> {
    /// Retry only these methods (replacing the default idempotent set). Include `POST` only
    /// for endpoints that are idempotent by design (e.g. with an idempotency key).
    #[must_use]
    pub fn retry_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Retry responses with these statuses (replacing 429 and 503).
    #[must_use]
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// Retry errors for which `predicate` returns `true` (replacing [`AllErrors`]).
    pub fn retry_errors<G>(self, predicate: G) -> RetryPolicy<G> {
        RetryPolicy {
            backoff: self.backoff,
            methods: self.methods,
            statuses: self.statuses,
            on_error: predicate,
            wall_clock: self.wall_clock,
            seeds: self.seeds,
            in_flight: self.in_flight,
            retrying: self.retrying,
        }
    }

    /// Seed the per-request RNGs, for reproducible jitter.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seeds = Arc::new(SeedSource::new(seed));
        self
    }

    /// The wall clock used to turn an HTTP-date `Retry-After` into a wait (default
    /// `SystemTime::now`; tests pass a fixed time).
    #[must_use]
    pub fn wall_clock(mut self, now: fn() -> SystemTime) -> Self {
        self.wall_clock = now;
        self
    }

    /// The backoff in use.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Schedule the next retry of the current request, or give up (`None`).
    fn schedule(&mut self, server_delay: Option<std::time::Duration>) -> Option<Sleep> {
        let flight = self.in_flight.as_mut()?;
        let elapsed = flight.start.elapsed();
        let delay = self
            .backoff
            .next_delay(&mut flight.state, &mut flight.rng, elapsed, server_delay)
            .ok()?;
        self.retrying = true;
        Some(tokio::time::sleep(delay))
    }
}

impl<B, ResB, E, F> tower::retry::Policy<Request<B>, Response<ResB>, E> for RetryPolicy<F>
where
    B: Clone,
    F: RetryError<E> + Clone,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        _req: &mut Request<B>,
        result: &mut Result<Response<ResB>, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(response) => {
                if !self.statuses.contains(&response.status()) {
                    return None;
                }
                let headers = response.headers();
                let server_delay =
                    retry_after(headers, (self.wall_clock)()).or_else(|| pause_hint(headers));
                self.schedule(server_delay)
            }
            Err(error) => {
                if !self.on_error.should_retry(error) {
                    return None;
                }
                self.schedule(None)
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        if !self.methods.contains(req.method()) {
            return None;
        }
        if !self.retrying {
            // First attempt of a new request: tower calls this on the service's policy right
            // before copying it into the request's future, so the copy starts fresh here.
            self.in_flight = Some(InFlight {
                start: Instant::now(),
                state: BackoffState::new(),
                rng: self.seeds.rng(),
            });
        }
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

/// A [`tower::Layer`] that wraps a service in [`tower::retry::Retry`] with a [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct RetryLayer<F = AllErrors> {
    policy: RetryPolicy<F>,
}

impl<F> RetryLayer<F> {
    /// A layer applying `policy` to every request.
    pub fn new(policy: RetryPolicy<F>) -> Self {
        RetryLayer { policy }
    }
}

impl<S, F: Clone> Layer<S> for RetryLayer<F> {
    type Service = tower::retry::Retry<RetryPolicy<F>, S>;

    fn layer(&self, service: S) -> Self::Service {
        tower::retry::Retry::new(self.policy.clone(), service)
    }
}
