//! [`KeyedDecider`]: a keyed limiter per route prefix plus a default, the decider behind
//! [`RateLimitLayer`], with that layer's builder methods; and [`MissingKey`], what a keyed decider
//! does with a request that has no key.

use std::convert::Infallible;

use http::StatusCode;

use crate::check::KeyedCheck;
use crate::cost::{RequestCost, UnitCost};
use crate::decide::{Decide, Decided, ResponseSettings, Sealed, Verdict};
use crate::headers::{self, PolicyHeaders, PolicyNameError};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::{Gate, GateBuilder, GateLayer};
use crate::response::MISSING_KEY_BODY;

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
    answer: ResponseSettings,
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
        answer: ResponseSettings,
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
///
/// [`Layer`]: tower_layer::Layer
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
