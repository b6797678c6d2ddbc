//! The tower layer and service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::Decision;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::check::KeyedCheck;
use crate::headers::{
    self, HeaderMode, PolicyHeaders, PolicyNameError, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::key::{KeyExtractor, RequestHead};

const MISSING_KEY_BODY: &[u8] = br#"{"error":"rate limit key missing"}"#;
const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

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

/// A named quota: a limiter and the header material advertising it, built once.
struct Policy<L> {
    limiter: L,
    headers: PolicyHeaders,
}

/// A path prefix and its policy.
struct Route<L> {
    prefix: String,
    policy: Policy<L>,
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

struct Config<E: KeyExtractor, L, Cf> {
    extractor: E,
    /// Longest prefix first.
    routes: Vec<Route<L>>,
    default: Option<Policy<L>>,
    missing: MissingKey<E::Key>,
    cost: Cf,
    headers: HeaderMode,
    cost_error_status: StatusCode,
}

impl<E: KeyExtractor, L, Cf> Config<E, L, Cf> {
    #[inline]
    fn policy_for(&self, path: &str) -> Option<&Policy<L>> {
        self.routes
            .iter()
            .find(|route| route.matches(path))
            .map(|route| &route.policy)
            .or(self.default.as_ref())
    }
}

/// A tower [`Layer`] that rate-limits requests by key, per route.
///
/// Cheap to clone (one `Arc`); usable as an axum `Router` layer or around any tower/hyper service
/// whose responses are `http::Response<B>`. Build one with [`RateLimitLayer::builder`].
///
/// Per request: find the policy for the path (longest matching route prefix, else the default; none →
/// pass through untouched), extract the key ([`MissingKey`] decides when there is none), compute the
/// cost, decide. Allowed: the inner service is called and its response gains the `RateLimit` fields.
/// Denied: `429 Too Many Requests` at once, with `Retry-After` (whole seconds, rounded up, at least 1),
/// the fields, and `{"error":"rate limit exceeded","retry_after":N}`. A cost the quota can never
/// admit gets [`RateLimitLayerBuilder::cost_error_status`] (default 413) and no `Retry-After`.
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
pub struct RateLimitLayer<E: KeyExtractor, L, Cf = UnitCost> {
    config: Arc<Config<E, L, Cf>>,
}

impl<E: KeyExtractor, L, Cf> Clone for RateLimitLayer<E, L, Cf> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<E: KeyExtractor, L, Cf> fmt::Debug for RateLimitLayer<E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("routes", &self.config.routes.len())
            .field("headers", &self.config.headers)
            .finish_non_exhaustive()
    }
}

impl<E: KeyExtractor> RateLimitLayer<E, ()> {
    /// Starts a layer keyed by `extractor`; add at least one policy.
    pub fn builder<L>(extractor: E) -> RateLimitLayerBuilder<E, L> {
        RateLimitLayerBuilder {
            config: Config {
                extractor,
                routes: Vec::new(),
                default: None,
                missing: MissingKey::default(),
                cost: UnitCost,
                headers: HeaderMode::default(),
                cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
            },
        }
    }
}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<E: KeyExtractor, L, Cf = UnitCost> {
    config: Config<E, L, Cf>,
}

impl<E: KeyExtractor, L, Cf> fmt::Debug for RateLimitLayerBuilder<E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl<E: KeyExtractor, L: KeyedCheck<E::Key>, Cf> RateLimitLayerBuilder<E, L, Cf> {
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
        self.config.default = Some(Policy { limiter, headers });
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
            policy: Policy { limiter, headers },
        };
        let at = self
            .config
            .routes
            .iter()
            .position(|r| r.prefix.len() < route.prefix.len())
            .unwrap_or(self.config.routes.len());
        self.config.routes.insert(at, route);
        Ok(self)
    }

    /// What to do when the key cannot be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.config.missing = missing;
        self
    }

    /// Which fields responses carry (default: IETF `RateLimit`/`RateLimit-Policy` on every response).
    pub fn headers(mut self, headers: HeaderMode) -> Self {
        self.config.headers = headers;
        self
    }

    /// The status for a request whose cost exceeds what the quota can ever admit (default 413).
    pub fn cost_error_status(mut self, status: StatusCode) -> Self {
        self.config.cost_error_status = status;
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
    pub fn cost<Cf2: RequestCost>(self, cost: Cf2) -> RateLimitLayerBuilder<E, L, Cf2> {
        let c = self.config;
        RateLimitLayerBuilder {
            config: Config {
                extractor: c.extractor,
                routes: c.routes,
                default: c.default,
                missing: c.missing,
                cost,
                headers: c.headers,
                cost_error_status: c.cost_error_status,
            },
        }
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<E, L, Cf> {
        RateLimitLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, E: KeyExtractor, L, Cf> Layer<S> for RateLimitLayer<E, L, Cf> {
    type Service = RateLimit<S, E, L, Cf>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner service.
pub struct RateLimit<S, E: KeyExtractor, L, Cf = UnitCost> {
    inner: S,
    config: Arc<Config<E, L, Cf>>,
}

impl<S: Clone, E: KeyExtractor, L, Cf> Clone for RateLimit<S, E, L, Cf> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, E: KeyExtractor, L, Cf> fmt::Debug for RateLimit<S, E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The fields an allowed response gains, computed before the inner call.
pub(crate) struct Fields {
    ietf: Option<(HeaderValue, HeaderValue)>,
    legacy: Option<(HeaderValue, HeaderValue, HeaderValue)>,
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
        }
    }

    /// The fields of a policy verdict's values (their `(r, t)` already worked out).
    #[cfg(feature = "policy")]
    pub(crate) fn of_values(mode: HeaderMode, values: &crate::FieldValues) -> Self {
        let (r, t) = values.service_limit;
        Fields {
            ietf: mode
                .ietf
                .then(|| (values.ratelimit_policy.clone(), values.ratelimit.clone())),
            legacy: mode.legacy.then(|| {
                (
                    values.limit.clone(),
                    HeaderValue::from(r),
                    HeaderValue::from(t),
                )
            }),
        }
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

/// The 429 for `decision`: `Retry-After`, the JSON body, and the fields of `limit` (the policy and
/// its `(r, t)`) when there are any to send.
pub(crate) fn denial(
    mode: HeaderMode,
    decision: &Decision,
    limit: Option<(&PolicyHeaders, (u64, u64))>,
) -> Response<Bytes> {
    let secs = headers::retry_secs(decision.retry_after().unwrap_or_default());
    let fields = limit.map(|(policy, limit)| Fields::new(mode, policy, limit));
    too_many_requests(mode, secs, fields)
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

/// What the layer does with a request once its policy and key are known.
enum Outcome {
    /// Call the inner service; add these fields to its response.
    Forward(Option<Fields>),
    /// Answer at once (a 429, or the cost error).
    Ready(Response<Bytes>),
}

/// Decides `cost` units for `key` under `policy` and builds what the response needs.
fn decide<K: ?Sized, L: KeyedCheck<K>>(
    policy: &Policy<L>,
    key: &K,
    cost: u64,
    mode: HeaderMode,
    cost_error_status: StatusCode,
) -> Outcome {
    let fields = mode.ietf || mode.legacy;
    match policy.limiter.check_key(key, cost) {
        Ok(decision @ Decision::Allowed { .. }) => {
            Outcome::Forward((mode.on_allowed && fields).then(|| {
                let limit = headers::keyed_service_limit(&policy.limiter, key, cost, &decision);
                Fields::new(mode, &policy.headers, limit)
            }))
        }
        Ok(decision @ Decision::Denied { .. }) => {
            let limit =
                fields.then(|| headers::keyed_service_limit(&policy.limiter, key, cost, &decision));
            Outcome::Ready(denial(
                mode,
                &decision,
                limit.map(|limit| (&policy.headers, limit)),
            ))
        }
        // `CostExceedsCapacity` (the only error today): retrying can never pass, so no
        // Retry-After; any future error kind fails closed the same way.
        Err(_) => Outcome::Ready(json_response(
            cost_error_status,
            Bytes::from_static(COST_BODY),
        )),
    }
}

impl<S, E, L, Cf, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, E, L, Cf>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    E: KeyExtractor,
    L: KeyedCheck<E::Key>,
    Cf: RequestCost,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        let head = RequestHead::of(&request);
        let Some(policy) = config.policy_for(head.uri.path()) else {
            return self.forward(request, None);
        };
        let cost = config.cost.cost(&head);
        let (mode, status) = (config.headers, config.cost_error_status);
        let outcome = match config.extractor.extract(&head) {
            Ok(key) => decide(policy, &key, cost, mode, status),
            Err(_) => match &config.missing {
                MissingKey::Fallback(key) => decide(policy, key, cost, mode, status),
                MissingKey::Allow => return self.forward(request, None),
                MissingKey::Reject(status) => {
                    return ResponseFuture::ready(json_response(
                        *status,
                        Bytes::from_static(MISSING_KEY_BODY),
                    ));
                }
            },
        };
        match outcome {
            Outcome::Forward(fields) => self.forward(request, fields),
            Outcome::Ready(response) => ResponseFuture::ready(response),
        }
    }
}

impl<S, E: KeyExtractor, L, Cf> RateLimit<S, E, L, Cf> {
    /// Calls the inner service: the same instance `poll_ready` readied (no clone: the call is made
    /// here, synchronously, so nothing needs to own the service).
    fn forward<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
        fields: Option<Fields>,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        ResponseFuture::inner(self.inner.call(request), fields)
    }
}

pin_project! {
    /// The future [`RateLimit`] returns: the inner call's, or a response decided at once.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    fn ready(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    fn inner(future: F, fields: Option<Fields>) -> Self {
        ResponseFuture {
            state: State::Inner { future, fields },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, ResB, Err> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, Err>>,
{
    type Output = Result<Response<RateLimitBody<ResB>>, Err>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(fields) = fields.take() {
                    fields.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response.map(RateLimitBody::inner)))
            }
            StateProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(RateLimitBody::full))),
                // Polled again after completion: a contract breach by the caller. Answer with an
                // empty 500 rather than panicking.
                None => {
                    let mut response = Response::new(RateLimitBody::full(Bytes::new()));
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    Poll::Ready(Ok(response))
                }
            },
        }
    }
}
