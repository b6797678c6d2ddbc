//! [`AsyncRateLimitLayer`]: the [`GateLayer`] over one limiter that decides asynchronously (a
//! Redis limiter, a policy over a remote store), through [`AsyncKeyedCheck`].

use std::future::Future;
use std::sync::Arc;

use tollgate_core::{CheckError, Decision, Quota};

use crate::check::KeyedCheck;
use crate::cost::{RequestCost, UnitCost};
use crate::decide::{Decide, Decided, LaterVerdict, ResponseSettings, Sealed, Verdict};
use crate::headers::{self, PolicyHeaders, PolicyNameError};
use crate::key::{KeyExtractor, RequestHead};
use crate::keyed_decider::MissingKey;
use crate::layer::{GateBuilder, GateLayer};
use crate::response::MISSING_KEY_BODY;

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

/// The decider of an [`AsyncRateLimitLayer`]: one [`AsyncKeyedCheck`] limiter, the key from a
/// [`KeyExtractor`]. The key is extracted at once; the decision (and the look-ups for `(r, t)`)
/// is awaited in one boxed future before the inner service is called, so a denied request never
/// reaches it.
pub struct AsyncKeyedDecider<E: KeyExtractor, L> {
    extractor: E,
    missing: MissingKey<E::Key>,
    /// Shared with the decisions under way.
    limiter: Arc<(L, PolicyHeaders)>,
}

impl<E: KeyExtractor, L> Sealed for AsyncKeyedDecider<E, L> {}

impl<E, L> Decide for AsyncKeyedDecider<E, L>
where
    E: KeyExtractor + Send + Sync + 'static,
    E::Key: Clone + Send + Sync + 'static,
    L: AsyncKeyedCheck<E::Key>,
{
    type Later = LaterVerdict;

    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: ResponseSettings,
    ) -> Decided<LaterVerdict> {
        let cost = cost.cost(head);
        let key = match self.extractor.extract(head) {
            Ok(key) => key,
            Err(_) => match &self.missing {
                MissingKey::Fallback(key) => key.clone(),
                MissingKey::Allow => return Decided::Now(Verdict::Pass),
                MissingKey::Reject(status) => {
                    return Decided::Now(Verdict::Refuse {
                        status: *status,
                        body: MISSING_KEY_BODY,
                    });
                }
            },
        };
        let shared = Arc::clone(&self.limiter);
        Decided::Later(Box::pin(async move {
            let (limiter, headers) = &*shared;
            let checked = limiter.check_key(&key, cost).await;
            let limit = match &checked {
                Ok(decision) if answer.wants_fields(decision) => {
                    Some(service_limit(limiter, &key, cost, decision).await)
                }
                _ => None,
            };
            answer.keyed(headers, checked, limit)
        }))
    }
}

/// A tower [`Layer`](tower_layer::Layer) over one [`AsyncKeyedCheck`] limiter: the same keys,
/// responses and fields as [`RateLimitLayer`](crate::RateLimitLayer), with the decision awaited
/// before the inner service is called (so a denied request never reaches it). The
/// [`GateLayer`] over an [`AsyncKeyedDecider`].
///
/// The inner service must be `Clone` (tower's rule for calling a service from a future: the readied
/// instance is taken and a clone left in its place); the decision's future is boxed.
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
pub type AsyncRateLimitLayer<E, L, Cf = UnitCost> = GateLayer<AsyncKeyedDecider<E, L>, Cf>;

/// Builds an [`AsyncRateLimitLayer`].
pub type AsyncRateLimitLayerBuilder<E, L, Cf = UnitCost> = GateBuilder<AsyncKeyedDecider<E, L>, Cf>;

/// The service [`AsyncRateLimitLayer`] wraps around an inner service.
pub type AsyncRateLimit<S, E, L, Cf = UnitCost> = crate::Gate<S, AsyncKeyedDecider<E, L>, Cf>;

impl<E: KeyExtractor, L: AsyncKeyedCheck<E::Key>> GateLayer<AsyncKeyedDecider<E, L>> {
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
        Ok(GateBuilder::new(AsyncKeyedDecider {
            extractor,
            missing: MissingKey::default(),
            limiter: Arc::new((limiter, headers)),
        }))
    }
}

impl<E: KeyExtractor, L, Cf> GateBuilder<AsyncKeyedDecider<E, L>, Cf> {
    /// What to do when the key cannot be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.decider_mut().missing = missing;
        self
    }
}

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
