//! A tower layer that rate-limits HTTP requests with Tollgate's limiters and says so clearly.
//!
//! * **Keys** ([`KeyExtractor`]): the peer address ([`PeerIp`]), the client address behind a
//!   configured list of trusted proxies ([`ClientIp`]: the right-most `X-Forwarded-For` /
//!   `Forwarded` hop that is not a trusted proxy, so clients cannot spoof it), a header such as an
//!   API key ([`HeaderKey`]), one global key ([`GlobalKey`]), or a closure ([`KeyFn`]); IPv6
//!   addresses optionally grouped by prefix ([`IpGrouping`]). A request without a key gets the
//!   configured [`MissingKey`] outcome (default: 400), never a surprise 500.
//! * **Limiters** ([`KeyedCheck`]): [`tollgate_sharded::KeyedLimiter`] per key, or any core single
//!   limiter as a global quota; one per route prefix, plus a default; an optional per-request cost.
//! * **Policies** ([`PolicyLayer`], feature `policy`, on by default): a whole
//!   [`tollgate_policy::Policy`] per request — descriptors from the client address (trusted-proxy
//!   logic), path, method and chosen headers; every rule decided as one; the deciding rule and the
//!   key's own (override) quota in the fields; two-stage delays held on tokio's timer.
//! * **One layer** ([`GateLayer`]: builder, service [`Gate`], future [`ResponseFuture`]) generic
//!   over a [`Decide`]r that turns a request and its cost into a [`Verdict`] the service renders:
//!   [`RateLimitLayer`] is it over a [`KeyedDecider`] (a keyed limiter per route: a one-rule
//!   decider, synchronous, no boxed future), [`AsyncRateLimitLayer`] over an
//!   [`AsyncKeyedDecider`], and [`PolicyLayer`] over a [`PolicyEdge`].
//! * **One edge for every transport** ([`edge`], feature `policy`): request facts to descriptors
//!   ([`DescriptorNames`]) to one [`EdgeVerdict`] (status, delay, `RateLimit` / `RateLimit-Policy`
//!   / `Retry-After` values computed once). [`PolicyLayer`], tollgate-pingora and
//!   tollgate-server only render it; the module docs say how each edge answers an empty header
//!   value, a cost no rule can admit and a two-stage delay.
//! * **Denials**: `429 Too Many Requests`, `Retry-After` in whole seconds rounded **up** (never 0
//!   while denied), and `{"error":"rate limit exceeded","retry_after":N}`.
//! * **Fields** ([`HeaderMode`]): `RateLimit-Policy: "name";q=100;w=60` and
//!   `RateLimit: "name";r=42;t=17` (draft-ietf-httpapi-ratelimit-headers, serialised as Structured
//!   Fields with `sfv`) on every response. `r` is the units the key may still spend now; `t` has one
//!   meaning on allowed and denied responses alike: the whole seconds (rounded up) until the quota
//!   admits more than `r` units, the draft's "time until additional quota is made available" (so
//!   with `r=0` it is the wait until a one-unit request passes, equal to that denial's
//!   `Retry-After`; details in [`headers`]). Optionally the legacy `X-RateLimit-Limit` (units per
//!   `w`), `-Remaining` (`r`) and `-Reset` (`t` in delta-seconds, not a timestamp).
//!
//! With axum, add the layer to a `Router` and serve with
//! `into_make_service_with_connect_info::<SocketAddr>()` (see `examples/server.rs`). With plain hyper,
//! wrap the service with the layer (`tower::ServiceBuilder`), insert each connection's peer
//! `SocketAddr` into the request extensions, and serve it through hyper-util's
//! `TowerToHyperService`: the layer needs only `http::Request<B>` in and `http::Response<B>` out.
//!
//! The decision path builds no clock per request and allocates only the header values it sends; a
//! 429 never reaches the inner service. Computing `t` costs one extra read-only lookup
//! ([`KeyedCheck::peek_key`]) on responses that carry the fields (none on a one-unit denial).
//!
//! ```
//! use std::net::IpAddr;
//! use tollgate_core::{Gcra, Quota};
//! use tollgate_http::{ClientIp, MissingKey, RateLimitLayer};
//! use tollgate_sharded::KeyedLimiter;
//!
//! let per_client = |q| KeyedLimiter::<IpAddr, Gcra>::new(q, 100_000);
//! let layer = RateLimitLayer::builder(ClientIp::trusting(["10.0.0.0/8".parse()?]))
//!     .policy("default", per_client(Quota::per_second(20)?)?)?
//!     .route("/search", "search", per_client(Quota::per_minute(30)?)?)?
//!     .on_missing_key(MissingKey::Fallback(IpAddr::from([0, 0, 0, 0])))
//!     .build();
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "policy")]
// The edge-fields guide's code block is this crate's doctest (it needs the policy engine).
#[cfg(all(doctest, feature = "policy"))]
#[doc = include_str!("../../../guides/edge-fields.md")]
struct GuideEdgeFields;

// The settle guide's code blocks (reserve, then settle; an LLM gateway) are doctests here.
#[cfg(all(doctest, feature = "policy"))]
#[doc = include_str!("../../../guides/settle.md")]
struct GuideSettle;

#[cfg(feature = "policy")]
mod admit_layer;
mod async_layer;
mod body;
mod check;
#[cfg(feature = "policy")]
#[doc(hidden)]
pub mod conformance;
mod cost;
mod decide;
#[cfg(feature = "policy")]
pub mod edge;
#[cfg(feature = "policy")]
pub mod explain;
#[cfg(feature = "policy")]
mod facts;
mod forwarded;
pub mod headers;
mod key;
mod keyed_decider;
mod layer;
#[cfg(feature = "policy")]
mod policy_fields;
#[cfg(feature = "policy")]
mod policy_layer;
#[cfg(feature = "redis")]
mod redis;
#[cfg(all(feature = "redis", feature = "policy"))]
mod redis_edge;
mod response;
#[cfg(feature = "policy")]
mod settle_layer;

#[cfg(feature = "policy")]
pub use admit_layer::{Admit, AdmitBody, AdmitFuture, AdmitLayer};
pub use async_layer::{
    AsyncKeyedCheck, AsyncKeyedDecider, AsyncRateLimit, AsyncRateLimitLayer,
    AsyncRateLimitLayerBuilder,
};
pub use body::RateLimitBody;
pub use check::KeyedCheck;
pub use cost::{RequestCost, UnitCost};
pub use decide::{Decide, Decided, LaterVerdict, Pending, ResponseSettings, Verdict};
#[cfg(feature = "policy")]
pub use edge::{
    Admitted, DescriptorNames, DescriptorSourceError, EdgeVerdict, PolicyEdge, RequestFacts,
};
pub use headers::{HeaderMode, PolicyNameError, RateLimitValue};
pub use key::{
    ClientIp, ForwardedHeader, GlobalKey, HeaderKey, IpGrouping, KeyError, KeyExtractor, KeyFn,
    PeerIp, RequestHead,
};
pub use keyed_decider::{
    KeyedDecider, MissingKey, RateLimit, RateLimitLayer, RateLimitLayerBuilder,
};
pub use layer::{Gate, GateBuilder, GateLayer, ResponseFuture};
#[cfg(feature = "policy")]
pub use policy_fields::{FieldValues, PolicyFields};
#[cfg(feature = "policy")]
pub use policy_layer::{EdgeDescriptors, PolicyLayer, PolicyLayerBuilder, PolicyRateLimit};
#[cfg(all(feature = "redis", feature = "policy"))]
pub use redis_edge::{RedisPolicyEdge, RedisPolicyLayer};
pub use response::Fields;
#[cfg(feature = "policy")]
pub use settle_layer::{
    ActualCost, ByteMeter, CostMeter, SettleBody, SettleFuture, SettleLayer, SettleLayerBuilder,
    SettleService, Settled, SseMeter, Usage, header_cost,
};
