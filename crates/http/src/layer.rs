//! The one tower layer, generic over a [`Decide`]r: builder ([`GateBuilder`]), service ([`Gate`])
//! and future ([`ResponseFuture`]) exist once, and each decider only turns a request into a
//! [`Verdict`] that the service renders. The deciders: one keyed limiter per route
//! ([`KeyedDecider`], behind [`RateLimitLayer`]), an asynchronous keyed limiter
//! ([`AsyncKeyedDecider`](crate::AsyncKeyedDecider), behind
//! [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer)) and a whole policy
//! ([`PolicyEdge`](crate::PolicyEdge), behind `PolicyLayer`, feature `policy`).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::{CheckError, Decision};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::check::KeyedCheck;
use crate::headers::{
    self, ExplainField, HeaderMode, PolicyHeaders, PolicyNameError, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::key::{KeyExtractor, RequestHead};

pub(crate) const MISSING_KEY_BODY: &[u8] = br#"{"error":"rate limit key missing"}"#;
pub(crate) const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

/// What to do with a request whose key cannot be extracted (see [`KeyError`](crate::KeyError)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissingKey<K> {
    /// Answer with this status and the JSON body `{"error":"rate limit key missing"}`; the inner
    /// service is not called. The default is `Reject(StatusCode::BAD_REQUEST)`.
    Reject(StatusCode),
    /// Pass the request through unlimited, with no rate-limit fields. Choose this only where the
    /// key's absence cannot be provoked by a client (an internal route, say).
    Allow,
    /// Charge the request to one shared key (all key-less requests share its quota).
    Fallback(K),
}

impl<K> Default for MissingKey<K> {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// How many units a request costs.
pub trait RequestCost: Send + Sync + 'static {
    /// The cost of `request` (0 passes without consuming anything).
    fn cost(&self, request: &RequestHead<'_>) -> u64;
}

/// Every request costs one unit (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl RequestCost for UnitCost {
    #[inline]
    fn cost(&self, _: &RequestHead<'_>) -> u64 {
        1
    }
}

impl<F> RequestCost for F
where
    F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, request: &RequestHead<'_>) -> u64 {
        self(request)
    }
}

/// What the layer does with one request: a decider's answer, rendered by [`Gate`] alone.
pub enum Verdict {
    /// Forward untouched, with no fields (no policy applies, or a missing key is let through).
    Pass,
    /// Forward; the response gains these fields.
    Forward(Option<Fields>),
    /// `429 Too Many Requests` with `Retry-After: retry_after` (whole seconds), the JSON body and
    /// the fields.
    Deny {
        /// `Retry-After` in whole seconds (at least 1).
        retry_after: u64,
        /// The fields the 429 carries.
        fields: Option<Fields>,
    },
    /// Answer `status` with a fixed JSON body (a missing key, a cost that can never be admitted).
    Refuse {
        /// The status.
        status: StatusCode,
        /// The JSON body.
        body: &'static [u8],
    },
}

/// A decider's answer: now, or after a future (a round trip, a two-stage delay) completes.
// The verdict is returned by value on purpose: boxing it would allocate per request, and a
// synchronous decider's `L` is empty.
#[allow(clippy::large_enum_variant)]
pub enum Decided<L> {
    /// Decided at once.
    Now(Verdict),
    /// Decided when this completes; the service holds the request meanwhile.
    Later(L),
}

/// The layer settings a decider needs to say what the response carries.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// Which fields responses carry (a decider skips the look-ups for fields not sent).
    pub mode: HeaderMode,
    /// The status for a cost that can never be admitted.
    pub cost_error_status: StatusCode,
}

impl Answer {
    /// Whether the response to `decision` carries fields (so its `(r, t)` is worth a look-up).
    pub(crate) fn wants_fields(&self, decision: &Decision) -> bool {
        (self.mode.ietf || self.mode.legacy) && (self.mode.on_allowed || !decision.is_allowed())
    }

    /// The verdict for a keyed limiter's `checked` answer, `limit` its `(r, t)` when
    /// [`wants_fields`](Self::wants_fields): the one place a keyed decision becomes a verdict.
    pub(crate) fn keyed(
        &self,
        headers: &PolicyHeaders,
        checked: Result<Decision, CheckError>,
        limit: Option<(u64, u64)>,
    ) -> Verdict {
        let fields = limit.map(|limit| Fields::new(self.mode, headers, limit));
        match checked {
            Ok(Decision::Allowed { .. }) => Verdict::Forward(fields),
            Ok(Decision::Denied { retry_after, .. }) => Verdict::Deny {
                retry_after: headers::retry_secs(retry_after),
                fields,
            },
            // `CostExceedsCapacity` (the only error today): retrying can never pass, so no
            // Retry-After; any future error kind fails closed the same way.
            Err(_) => Verdict::Refuse {
                status: self.cost_error_status,
                body: COST_BODY,
            },
        }
    }
}

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// What a [`GateLayer`] is generic over: something that turns a request (its head and cost)
/// into a [`Verdict`], at once or later. Sealed: the crate's deciders are [`KeyedDecider`] (a
/// keyed limiter per route: a one-rule decider), [`AsyncKeyedDecider`](crate::AsyncKeyedDecider)
/// and [`PolicyEdge`](crate::PolicyEdge); put your own storage behind them through
/// [`KeyedCheck`], [`AsyncKeyedCheck`](crate::AsyncKeyedCheck) or a policy.
pub trait Decide: Sealed + Send + Sync + 'static {
    /// A decision still under way: [`Infallible`] for a synchronous decider (no future, no box),
    /// [`LaterVerdict`] for one that awaits.
    type Later;

    /// Decides `head`, asking `cost` for its cost only when a limit applies.
    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: Answer,
    ) -> Decided<Self::Later>;
}

/// An asynchronous decider's later verdict.
pub type LaterVerdict = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// A decision under way, as [`ResponseFuture`] holds it with the inner service and the request.
pub trait Pending<S, ReqB> {
    /// What is held while the decision is under way.
    type Held;
    /// Polls the decision.
    fn poll_verdict(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict>;
    /// Takes the readied `inner` (leaving a clone: tower's rule for calling a service from a
    /// future) and `request` along.
    fn hold(&self, inner: &mut S, request: Request<ReqB>) -> Self::Held;
    /// The service and request back.
    fn release(held: Self::Held) -> (S, Request<ReqB>);
}

/// A synchronous decider never defers: nothing is held, and the inner service need not be `Clone`.
impl<S, ReqB> Pending<S, ReqB> for Infallible {
    type Held = Infallible;
    fn poll_verdict(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Verdict> {
        match *self {}
    }
    fn hold(&self, _: &mut S, _: Request<ReqB>) -> Infallible {
        match *self {}
    }
    fn release(held: Infallible) -> (S, Request<ReqB>) {
        match held {}
    }
}

impl<S: Clone, ReqB> Pending<S, ReqB> for LaterVerdict {
    type Held = (S, Request<ReqB>);
    fn poll_verdict(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        self.get_mut().as_mut().poll(cx)
    }
    fn hold(&self, inner: &mut S, request: Request<ReqB>) -> Self::Held {
        let clone = inner.clone();
        (std::mem::replace(inner, clone), request)
    }
    fn release(held: Self::Held) -> (S, Request<ReqB>) {
        held
    }
}

struct Config<D, Cf> {
    decider: D,
    cost: Cf,
    answer: Answer,
}

/// The tower [`Layer`] over a decider `D`; [`RateLimitLayer`],
/// [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer) and `PolicyLayer` are its names for the
/// crate's deciders. Cheap to clone (one `Arc`).
pub struct GateLayer<D, Cf = UnitCost> {
    config: Arc<Config<D, Cf>>,
}

impl<D, Cf> Clone for GateLayer<D, Cf> {
    fn clone(&self) -> Self {
        GateLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<D, Cf> fmt::Debug for GateLayer<D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateLayer")
            .field("headers", &self.config.answer.mode)
            .finish_non_exhaustive()
    }
}

/// Builds a [`GateLayer`]: the settings every decider shares here, the decider's own on its
/// builder names ([`RateLimitLayerBuilder`], ...).
pub struct GateBuilder<D, Cf = UnitCost> {
    config: Config<D, Cf>,
}

impl<D, Cf> fmt::Debug for GateBuilder<D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder").finish_non_exhaustive()
    }
}

impl<D> GateBuilder<D> {
    /// A builder over `decider`, with the defaults: unit cost, [`HeaderMode::default`], 413.
    pub(crate) fn new(decider: D) -> Self {
        GateBuilder {
            config: Config {
                decider,
                cost: UnitCost,
                answer: Answer {
                    mode: HeaderMode::default(),
                    cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
                },
            },
        }
    }
}

impl<D, Cf> GateBuilder<D, Cf> {
    pub(crate) fn decider_mut(&mut self) -> &mut D {
        &mut self.config.decider
    }

    /// Which fields responses carry (default: IETF `RateLimit`/`RateLimit-Policy` on every response).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.config.answer.mode = mode;
        self
    }

    /// The status for a request whose cost exceeds what the quota (an enforcing rule) can ever
    /// admit (default 413).
    pub fn cost_error_status(mut self, status: StatusCode) -> Self {
        self.config.answer.cost_error_status = status;
        self
    }

    /// A per-request cost (default: 1 per request).
    ///
    /// ```
    /// # use tollgate_core::{GcraLimiter, Quota};
    /// # use tollgate_http::{GlobalKey, RateLimitLayer, RequestHead};
    /// // Batch endpoints pay per item: `?n=10` costs 10.
    /// let layer = RateLimitLayer::builder(GlobalKey)
    ///     .policy("batch", GcraLimiter::new(Quota::per_second(100)?)?)?
    ///     .cost(|req: &RequestHead<'_>| {
    ///         req.uri.query()
    ///             .and_then(|q| q.strip_prefix("n="))
    ///             .and_then(|n| n.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost<Cf2: RequestCost>(self, cost: Cf2) -> GateBuilder<D, Cf2> {
        let Config {
            decider, answer, ..
        } = self.config;
        GateBuilder {
            config: Config {
                decider,
                cost,
                answer,
            },
        }
    }

    /// The layer.
    pub fn build(self) -> GateLayer<D, Cf> {
        GateLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, D, Cf> Layer<S> for GateLayer<D, Cf> {
    type Service = Gate<S, D, Cf>;

    fn layer(&self, inner: S) -> Self::Service {
        Gate {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service a [`GateLayer`] wraps around an inner service.
pub struct Gate<S, D, Cf = UnitCost> {
    inner: S,
    config: Arc<Config<D, Cf>>,
}

impl<S: Clone, D, Cf> Clone for Gate<S, D, Cf> {
    fn clone(&self) -> Self {
        Gate {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, D, Cf> fmt::Debug for Gate<S, D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, D, Cf, ReqB, ResB> Service<Request<ReqB>> for Gate<S, D, Cf>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    D: Decide,
    D::Later: Pending<S, ReqB>,
    Cf: RequestCost,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, D::Later>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        let answer = config.answer;
        let decided = config
            .decider
            .decide(&RequestHead::of(&request), &config.cost, answer);
        let state = match decided {
            // The readied instance is called here, synchronously: nothing needs to own it.
            Decided::Now(verdict) => render(&mut self.inner, request, verdict, answer.mode),
            Decided::Later(later) => State::Later {
                held: Some(later.hold(&mut self.inner, request)),
                later,
                mode: answer.mode,
            },
        };
        ResponseFuture { state }
    }
}

/// The state `verdict` leads to: the inner call, or the layer's own response.
fn render<S, ReqB, L>(
    inner: &mut S,
    request: Request<ReqB>,
    verdict: Verdict,
    mode: HeaderMode,
) -> State<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    let response = match verdict {
        Verdict::Pass => None,
        Verdict::Forward(fields) => fields,
        Verdict::Deny {
            retry_after,
            fields,
        } => return State::ready(too_many_requests(mode, retry_after, fields)),
        Verdict::Refuse { status, body } => {
            return State::ready(json_response(status, Bytes::from_static(body)));
        }
    };
    State::Inner {
        future: inner.call(request),
        fields: response,
    }
}

pin_project! {
    /// The future [`Gate`] returns: the inner call's, a response decided at once, or a decision
    /// under way (`L`, [`Decide::Later`]) followed by one of those.
    pub struct ResponseFuture<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
        L: Pending<S, ReqB>,
    {
        #[pin]
        state: State<S, ReqB, L>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
        L: Pending<S, ReqB>,
    {
        Inner {
            #[pin]
            future: S::Future,
            fields: Option<Fields>,
        },
        Later {
            #[pin]
            later: L,
            held: Option<L::Held>,
            mode: HeaderMode,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, L> State<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    fn ready(response: Response<Bytes>) -> Self {
        State::Ready {
            response: Some(response),
        }
    }
}

impl<S, ReqB, L> fmt::Debug for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB, L> Future for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    L: Pending<S, ReqB>,
{
    type Output = Result<Response<RateLimitBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Inner { future, fields } => {
                    let mut response = std::task::ready!(future.poll(cx))?;
                    if let Some(fields) = fields.take() {
                        fields.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Later { later, held, mode } => {
                    let verdict = std::task::ready!(later.poll_verdict(cx));
                    match held.take() {
                        Some(held) => {
                            let (mut inner, request) = L::release(held);
                            render(&mut inner, request, verdict, *mode)
                        }
                        // Unreachable (the state is left at once); fail as a re-poll does.
                        None => State::Ready { response: None },
                    }
                }
                StateProj::Ready { response } => {
                    let response = response.take().unwrap_or_else(|| {
                        // Polled after completion: a caller's contract breach; an empty 500, no
                        // panic.
                        let mut response = Response::new(Bytes::new());
                        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        response
                    });
                    return Poll::Ready(Ok(response.map(RateLimitBody::full)));
                }
            };
            state.set(next);
        }
    }
}

/// A named quota: a limiter and the header material advertising it, built once.
struct Route<L> {
    /// Empty for the default policy.
    prefix: String,
    limiter: L,
    headers: PolicyHeaders,
}

impl<L> Route<L> {
    /// `prefix` matches itself and anything below it on a segment boundary: `/api` matches `/api` and
    /// `/api/x`, not `/apix`.
    fn matches(&self, path: &str) -> bool {
        match path.strip_prefix(self.prefix.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/') || self.prefix.ends_with('/'),
            None => false,
        }
    }
}

/// The decider of a [`RateLimitLayer`]: a keyed limiter ([`KeyedCheck`]) per route prefix plus a
/// default, the key from a [`KeyExtractor`]. Synchronous: no future, no allocation but the
/// header values sent.
pub struct KeyedDecider<E: KeyExtractor, L> {
    extractor: E,
    /// Longest prefix first.
    routes: Vec<Route<L>>,
    default: Option<Route<L>>,
    missing: MissingKey<E::Key>,
}

impl<E: KeyExtractor, L> Sealed for KeyedDecider<E, L> {}

impl<E: KeyExtractor, L> KeyedDecider<E, L> {
    #[inline]
    fn route_for(&self, path: &str) -> Option<&Route<L>> {
        self.routes
            .iter()
            .find(|route| route.matches(path))
            .or(self.default.as_ref())
    }
}

/// Decides `cost` units for `key` under `route`.
#[inline]
fn decide_key<K: ?Sized, L: KeyedCheck<K>>(
    route: &Route<L>,
    key: &K,
    cost: u64,
    answer: Answer,
) -> Verdict {
    let checked = route.limiter.check_key(key, cost);
    let limit = checked
        .as_ref()
        .ok()
        .filter(|decision| answer.wants_fields(decision))
        .map(|decision| headers::keyed_service_limit(&route.limiter, key, cost, decision));
    answer.keyed(&route.headers, checked, limit)
}

impl<E, L> Decide for KeyedDecider<E, L>
where
    E: KeyExtractor + Send + Sync + 'static,
    E::Key: Send + Sync + 'static,
    L: KeyedCheck<E::Key>,
{
    type Later = Infallible;

    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: Answer,
    ) -> Decided<Infallible> {
        let Some(route) = self.route_for(head.uri.path()) else {
            return Decided::Now(Verdict::Pass);
        };
        let cost = cost.cost(head);
        Decided::Now(match self.extractor.extract(head) {
            Ok(key) => decide_key(route, &key, cost, answer),
            Err(_) => match &self.missing {
                MissingKey::Fallback(key) => decide_key(route, key, cost, answer),
                MissingKey::Allow => Verdict::Pass,
                MissingKey::Reject(status) => Verdict::Refuse {
                    status: *status,
                    body: MISSING_KEY_BODY,
                },
            },
        })
    }
}

/// A tower [`Layer`] that rate-limits requests by key, per route: the [`GateLayer`] over a
/// [`KeyedDecider`].
///
/// Cheap to clone (one `Arc`); usable as an axum `Router` layer or around any tower/hyper service
/// whose responses are `http::Response<B>`. Build one with [`RateLimitLayer::builder`].
///
/// Per request: find the policy for the path (longest matching route prefix, else the default; none →
/// pass through untouched), extract the key ([`MissingKey`] decides when there is none), compute the
/// cost, decide. Allowed: the inner service is called and its response gains the `RateLimit` fields.
/// Denied: `429 Too Many Requests` at once, with `Retry-After` (whole seconds, rounded up, at least 1),
/// the fields, and `{"error":"rate limit exceeded","retry_after":N}`. A cost the quota can never
/// admit gets [`GateBuilder::cost_error_status`] (default 413) and no `Retry-After`.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate_core::{Gcra, Quota};
/// use tollgate_http::{PeerIp, RateLimitLayer};
/// use tollgate_sharded::KeyedLimiter;
///
/// let per_ip = |q| KeyedLimiter::<std::net::IpAddr, Gcra>::new(q, 100_000);
/// let layer = RateLimitLayer::builder(PeerIp::new())
///     .policy("default", per_ip(Quota::per_second(50)?)?)?
///     .route("/login", "login", per_ip(Quota::per_minute(5)?)?)?
///     .build();
/// // axum: Router::new().route(..).layer(layer), served with
/// // `into_make_service_with_connect_info::<SocketAddr>()`.
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type RateLimitLayer<E, L, Cf = UnitCost> = GateLayer<KeyedDecider<E, L>, Cf>;

/// Builds a [`RateLimitLayer`].
pub type RateLimitLayerBuilder<E, L, Cf = UnitCost> = GateBuilder<KeyedDecider<E, L>, Cf>;

/// The service [`RateLimitLayer`] wraps around an inner service.
pub type RateLimit<S, E, L, Cf = UnitCost> = Gate<S, KeyedDecider<E, L>, Cf>;

impl<E: KeyExtractor> GateLayer<KeyedDecider<E, ()>> {
    /// Starts a layer keyed by `extractor`; add at least one policy.
    pub fn builder<L>(extractor: E) -> RateLimitLayerBuilder<E, L> {
        GateBuilder::new(KeyedDecider {
            extractor,
            routes: Vec::new(),
            default: None,
            missing: MissingKey::default(),
        })
    }
}

impl<E: KeyExtractor, L: KeyedCheck<E::Key>, Cf> GateBuilder<KeyedDecider<E, L>, Cf> {
    /// The policy for requests no route matches (without one, they pass unlimited). `name` is the
    /// policy name in the `RateLimit` fields.
    ///
    /// The policy's fixed field text (`RateLimit-Policy`, tens of bytes) is allocated once and kept
    /// for the life of the process, so responses share it without reference counting; build layers
    /// once, not per request.
    ///
    /// # Errors
    /// [`PolicyNameError`] when `name` is not printable ASCII.
    pub fn policy(mut self, name: &str, limiter: L) -> Result<Self, PolicyNameError> {
        let headers = PolicyHeaders::new(name, limiter.quota())?;
        self.decider_mut().default = Some(Route {
            prefix: String::new(),
            limiter,
            headers,
        });
        Ok(self)
    }

    /// A policy for paths under `prefix` (on a segment boundary: `/api` matches `/api` and `/api/x`,
    /// not `/apix`); the longest matching prefix wins.
    ///
    /// # Errors
    /// [`PolicyNameError`] when `name` is not printable ASCII.
    pub fn route(
        mut self,
        prefix: impl Into<String>,
        name: &str,
        limiter: L,
    ) -> Result<Self, PolicyNameError> {
        let headers = PolicyHeaders::new(name, limiter.quota())?;
        let route = Route {
            prefix: prefix.into(),
            limiter,
            headers,
        };
        let routes = &mut self.decider_mut().routes;
        let at = routes
            .iter()
            .position(|r| r.prefix.len() < route.prefix.len())
            .unwrap_or(routes.len());
        routes.insert(at, route);
        Ok(self)
    }

    /// What to do when the key cannot be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.decider_mut().missing = missing;
        self
    }
}

/// The `RateLimit` (and legacy) fields a response gains, computed with the verdict.
pub struct Fields {
    ietf: Option<(HeaderValue, HeaderValue)>,
    legacy: Option<(HeaderValue, HeaderValue, HeaderValue)>,
    /// A trusted caller's trace (boxed: one pointer, null on every other response).
    explain: Option<Box<ExplainField>>,
}

impl Fields {
    /// The fields for service limit `(r, t)` ([`headers::service_limit`]).
    pub(crate) fn new(mode: HeaderMode, policy: &PolicyHeaders, (r, t): (u64, u64)) -> Self {
        Fields {
            ietf: mode
                .ietf
                .then(|| (policy.policy.clone(), policy.ratelimit(r, t))),
            legacy: mode.legacy.then(|| {
                (
                    policy.limit.clone(),
                    HeaderValue::from(r),
                    HeaderValue::from(t),
                )
            }),
            explain: None,
        }
    }

    /// The fields of a policy verdict's values (their `(r, t)` already worked out).
    #[cfg(feature = "policy")]
    pub(crate) fn of_values(mode: HeaderMode, values: &crate::FieldValues) -> Self {
        let (r, t) = values.service_limit;
        Fields {
            ietf: mode
                .ietf
                .then(|| (values.ratelimit_policy.clone(), values.ratelimit.to_value())),
            legacy: mode.legacy.then(|| {
                (
                    values.limit.clone(),
                    HeaderValue::from(r),
                    HeaderValue::from(t),
                )
            }),
            explain: None,
        }
    }

    /// `fields` with a trusted caller's trace added (`explain` is `None` but for such callers).
    pub(crate) fn with_explain(
        fields: Option<Fields>,
        explain: Option<Box<ExplainField>>,
    ) -> Option<Fields> {
        let Some(explain) = explain else {
            return fields;
        };
        let mut fields = fields.unwrap_or(Fields {
            ietf: None,
            legacy: None,
            explain: None,
        });
        fields.explain = Some(explain);
        Some(fields)
    }

    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, ratelimit)) = self.ietf {
            // `append`: list fields; a second layer's policy becomes a second list member.
            headers.append(&RATELIMIT_POLICY, policy);
            headers.append(&RATELIMIT, ratelimit);
        }
        if let Some((limit, remaining, reset)) = self.legacy {
            headers.insert(&X_RATELIMIT_LIMIT, limit);
            headers.insert(&X_RATELIMIT_REMAINING, remaining);
            headers.insert(&X_RATELIMIT_RESET, reset);
        }
        if let Some(explain) = self.explain {
            let ExplainField { name, value } = *explain;
            headers.insert(name, value);
        }
    }
}

pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The 429 with `Retry-After: secs`, the JSON body and `fields`: every layer answers a denial
/// with this.
pub(crate) fn too_many_requests(
    mode: HeaderMode,
    secs: u64,
    fields: Option<Fields>,
) -> Response<Bytes> {
    let mut response = Response::new(headers::denial_body(secs));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    // Size the map once: content-type, retry-after, and the fields.
    let count = 2 * usize::from(mode.ietf) + 3 * usize::from(mode.legacy);
    response.headers_mut().reserve(2 + count);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
        .headers_mut()
        .insert(RETRY_AFTER, headers::number(secs));
    if let Some(fields) = fields {
        fields.apply(response.headers_mut());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inner service whose future is ready at once.
    struct Echo;

    impl Service<Request<()>> for Echo {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new(())))
        }
    }

    /// A synchronous decider's response future holds nothing for a later decision: it is no
    /// larger than the keyed layer's own future was before the three layers were folded into
    /// one (the inner call's future and its fields, or a response decided at once).
    #[test]
    fn a_sync_deciders_future_is_no_larger_than_the_keyed_layers_was() {
        #[allow(dead_code)]
        enum Before<F> {
            Inner(F, Option<Fields>),
            Ready(Option<Response<Bytes>>),
        }
        type Sync = ResponseFuture<Echo, (), Infallible>;
        let before = size_of::<Before<<Echo as Service<Request<()>>>::Future>>();
        assert!(
            size_of::<Sync>() <= before,
            "{} > {before}",
            size_of::<Sync>()
        );
    }
}
