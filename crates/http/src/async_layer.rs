//! [`AsyncRateLimitLayer`]: the layer for limiters that decide asynchronously (a Redis limiter, a
//! policy over a remote store), through [`AsyncKeyedCheck`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate_core::{CheckError, Decision, Quota};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::check::KeyedCheck;
use crate::headers::{self, HeaderMode, PolicyHeaders, PolicyNameError};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::{Fields, MissingKey, RequestCost, UnitCost, denial, json_response};

const MISSING_KEY_BODY: &[u8] = br#"{"error":"rate limit key missing"}"#;
const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

/// The asynchronous sibling of [`KeyedCheck`]: a limiter whose decision is a future (a network round
/// trip to Redis, say). Every [`KeyedCheck`] is one (its futures are ready at once), so the same
/// limiters work behind both layers.
///
/// ```
/// use tollgate_core::{CheckError, Decision, Gcra, Quota};
/// use tollgate_http::AsyncKeyedCheck;
/// use tollgate_sharded::KeyedLimiter;
///
/// /// A limiter behind a network hop (here simulated by a yield).
/// struct Remote(KeyedLimiter<String, Gcra>);
///
/// impl AsyncKeyedCheck<String> for Remote {
///     async fn check_key(&self, key: &String, cost: u64) -> Result<Decision, CheckError> {
///         tokio::task::yield_now().await;
///         self.0.check_key(key, cost)
///     }
///     async fn peek_key(&self, key: &String, cost: u64) -> Result<Decision, CheckError> {
///         self.0.peek_key(key, cost)
///     }
///     fn quota(&self) -> &Quota {
///         self.0.quota()
///     }
/// }
/// # let _ = Remote(KeyedLimiter::new(Quota::per_second(1)?, 10)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncKeyedCheck<K: ?Sized>: Send + Sync + 'static {
    /// Decides `cost` units for `key`, consuming them if allowed.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] when `cost` can never be admitted. A storage error
    /// (Redis down) is the implementation's to answer by its fail policy: the layer sees decisions.
    fn check_key(
        &self,
        key: &K,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send;

    /// What [`check_key`](Self::check_key) would decide, consuming nothing (for the `RateLimit`
    /// field's `t`, as [`KeyedCheck::peek_key`]).
    ///
    /// # Errors
    /// As [`check_key`](Self::check_key).
    fn peek_key(
        &self,
        key: &K,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send;

    /// The quota advertised in the `RateLimit-Policy` header.
    fn quota(&self) -> &Quota;
}

impl<K: Sync + ?Sized, L: KeyedCheck<K>> AsyncKeyedCheck<K> for L {
    fn check_key(
        &self,
        key: &K,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
        std::future::ready(KeyedCheck::check_key(self, key, cost))
    }

    fn peek_key(
        &self,
        key: &K,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
        std::future::ready(KeyedCheck::peek_key(self, key, cost))
    }

    fn quota(&self) -> &Quota {
        KeyedCheck::quota(self)
    }
}

struct Config<E: KeyExtractor, L, Cf> {
    extractor: E,
    limiter: L,
    headers: PolicyHeaders,
    missing: MissingKey<E::Key>,
    cost: Cf,
    mode: HeaderMode,
    cost_error_status: StatusCode,
}

/// A tower [`Layer`] over one [`AsyncKeyedCheck`] limiter: the same keys, responses and fields as
/// [`RateLimitLayer`](crate::RateLimitLayer), with the decision awaited before the inner service
/// is called (so a denied request never reaches it).
///
/// The inner service must be `Clone` (tower's rule for calling a service from a future: the readied
/// instance is taken and a clone left in its place); the response future is boxed.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate_core::{Gcra, Quota};
/// use tollgate_http::{AsyncRateLimitLayer, PeerIp};
/// use tollgate_sharded::KeyedLimiter;
///
/// // Any KeyedCheck works here too; a Redis-backed AsyncKeyedCheck is the point.
/// let layer = AsyncRateLimitLayer::builder(
///     PeerIp::new(),
///     "per_ip",
///     KeyedLimiter::<IpAddr, Gcra>::new(Quota::per_second(20)?, 100_000)?,
/// )?
/// .build();
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncRateLimitLayer<E: KeyExtractor, L, Cf = UnitCost> {
    config: Arc<Config<E, L, Cf>>,
}

impl<E: KeyExtractor, L, Cf> Clone for AsyncRateLimitLayer<E, L, Cf> {
    fn clone(&self) -> Self {
        AsyncRateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<E: KeyExtractor, L, Cf> fmt::Debug for AsyncRateLimitLayer<E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRateLimitLayer")
            .field("headers", &self.config.mode)
            .finish_non_exhaustive()
    }
}

impl<E: KeyExtractor, L: AsyncKeyedCheck<E::Key>> AsyncRateLimitLayer<E, L> {
    /// A layer keyed by `extractor`, deciding with `limiter`; `name` is the policy name in the
    /// `RateLimit` fields.
    ///
    /// # Errors
    /// [`PolicyNameError`] when `name` is not printable ASCII.
    pub fn builder(
        extractor: E,
        name: &str,
        limiter: L,
    ) -> Result<AsyncRateLimitLayerBuilder<E, L>, PolicyNameError> {
        let headers = PolicyHeaders::new(name, limiter.quota())?;
        Ok(AsyncRateLimitLayerBuilder {
            config: Config {
                extractor,
                limiter,
                headers,
                missing: MissingKey::default(),
                cost: UnitCost,
                mode: HeaderMode::default(),
                cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
            },
        })
    }
}

/// Builds an [`AsyncRateLimitLayer`].
pub struct AsyncRateLimitLayerBuilder<E: KeyExtractor, L, Cf = UnitCost> {
    config: Config<E, L, Cf>,
}

impl<E: KeyExtractor, L, Cf> fmt::Debug for AsyncRateLimitLayerBuilder<E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRateLimitLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl<E: KeyExtractor, L, Cf> AsyncRateLimitLayerBuilder<E, L, Cf> {
    /// What to do when the key cannot be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.config.missing = missing;
        self
    }

    /// Which fields responses carry (default: IETF `RateLimit`/`RateLimit-Policy` on every response).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.config.mode = mode;
        self
    }

    /// The status for a request whose cost exceeds what the quota can ever admit (default 413).
    pub fn cost_error_status(mut self, status: StatusCode) -> Self {
        self.config.cost_error_status = status;
        self
    }

    /// A per-request cost (default: 1 per request).
    pub fn cost<Cf2: RequestCost>(self, cost: Cf2) -> AsyncRateLimitLayerBuilder<E, L, Cf2> {
        let c = self.config;
        AsyncRateLimitLayerBuilder {
            config: Config {
                extractor: c.extractor,
                limiter: c.limiter,
                headers: c.headers,
                missing: c.missing,
                cost,
                mode: c.mode,
                cost_error_status: c.cost_error_status,
            },
        }
    }

    /// The layer.
    pub fn build(self) -> AsyncRateLimitLayer<E, L, Cf> {
        AsyncRateLimitLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, E: KeyExtractor, L, Cf> Layer<S> for AsyncRateLimitLayer<E, L, Cf> {
    type Service = AsyncRateLimit<S, E, L, Cf>;

    fn layer(&self, inner: S) -> Self::Service {
        AsyncRateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`AsyncRateLimitLayer`] wraps around an inner service.
pub struct AsyncRateLimit<S, E: KeyExtractor, L, Cf = UnitCost> {
    inner: S,
    config: Arc<Config<E, L, Cf>>,
}

impl<S: Clone, E: KeyExtractor, L, Cf> Clone for AsyncRateLimit<S, E, L, Cf> {
    fn clone(&self) -> Self {
        AsyncRateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, E: KeyExtractor, L, Cf> fmt::Debug for AsyncRateLimit<S, E, L, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The boxed future [`AsyncRateLimit`] returns.
pub type AsyncResponseFuture<ResB, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<ResB>>, E>> + Send>>;

/// `(r, t)` by [`headers::service_limit`] (the one definition), with the looks it asks for made
/// first through the async peek (they are futures here) and then answered from.
async fn service_limit<K: ?Sized, L: AsyncKeyedCheck<K>>(
    limiter: &L,
    key: &K,
    cost: u64,
    decision: &Decision,
) -> (u64, u64) {
    let mut looked: [Option<(u64, Option<Decision>)>; 2] = [None, None];
    let first = match *decision {
        Decision::Allowed { remaining, .. } => remaining.checked_add(1),
        Decision::Denied { .. } if cost > 1 => Some(1),
        Decision::Denied { .. } => None,
    };
    if let Some(units) = first {
        let seen = limiter.peek_key(key, units).await.ok();
        looked[0] = Some((units, seen));
        // A denial of more than one unit with some left: the wait for one more than are left.
        if let (false, Some(Decision::Allowed { remaining, .. })) = (decision.is_allowed(), seen) {
            if let Some(units) = remaining.saturating_add(1).checked_add(1) {
                looked[1] = Some((units, limiter.peek_key(key, units).await.ok()));
            }
        }
    }
    headers::service_limit(decision, cost, |units| {
        looked
            .iter()
            .flatten()
            .find(|(asked, _)| *asked == units)
            .and_then(|(_, seen)| *seen)
    })
}

impl<S, E, L, Cf, ReqB, ResB> Service<Request<ReqB>> for AsyncRateLimit<S, E, L, Cf>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    E: KeyExtractor + Send + Sync + 'static,
    E::Key: Clone + Send + Sync + 'static,
    L: AsyncKeyedCheck<E::Key>,
    Cf: RequestCost,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = AsyncResponseFuture<ResB, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let head = RequestHead::of(&request);
        let cost = config.cost.cost(&head);
        let key = match config.extractor.extract(&head) {
            Ok(key) => Some(key),
            Err(_) => match &config.missing {
                MissingKey::Fallback(key) => Some(key.clone()),
                MissingKey::Allow => None,
                MissingKey::Reject(status) => {
                    let response = json_response(*status, Bytes::from_static(MISSING_KEY_BODY));
                    return Box::pin(std::future::ready(Ok(response.map(RateLimitBody::full))));
                }
            },
        };
        // Take the readied service, leave a clone (tower's rule for calling it from a future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let Some(key) = key else {
                return inner
                    .call(request)
                    .await
                    .map(|r| r.map(RateLimitBody::inner));
            };
            let mode = config.mode;
            let with_fields = mode.ietf || mode.legacy;
            match config.limiter.check_key(&key, cost).await {
                Ok(decision @ Decision::Allowed { .. }) => {
                    let fields = if mode.on_allowed && with_fields {
                        let limit = service_limit(&config.limiter, &key, cost, &decision).await;
                        Some(Fields::new(mode, &config.headers, limit))
                    } else {
                        None
                    };
                    let mut response = inner.call(request).await?;
                    if let Some(fields) = fields {
                        fields.apply(response.headers_mut());
                    }
                    Ok(response.map(RateLimitBody::inner))
                }
                Ok(decision @ Decision::Denied { .. }) => {
                    let limit = if with_fields {
                        Some(service_limit(&config.limiter, &key, cost, &decision).await)
                    } else {
                        None
                    };
                    let limit = limit.map(|limit| (&config.headers, limit));
                    Ok(denial(mode, &decision, limit).map(RateLimitBody::full))
                }
                Err(_) => Ok(json_response(
                    config.cost_error_status,
                    Bytes::from_static(COST_BODY),
                )
                .map(RateLimitBody::full)),
            }
        })
    }
}
