//! tollgate-redis's limiters behind [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer): one
//! limit per key shared by every replica pointing at the same Redis (feature `redis`).
//!
//! A [`RedisLimiter`] (one atomic script per decision, exact) or a [`LeasedLimiter`] (local leases
//! of a shared GCRA bucket) is an [`AsyncKeyedCheck`] for the keys the crate's extractors produce:
//! `IpAddr` (its text), `HeaderValue` (its bytes, as text where they are not UTF-8 only lossily),
//! `()` (one global key, empty), `String` and `str`. Redis down or slow is answered by the
//! limiter's own [`FaultPolicy`](tollgate_redis::FaultPolicy): the layer sees decisions.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_core::Quota;
//! use tollgate_http::{AsyncRateLimitLayer, PeerIp};
//! use tollgate_redis::{RedisConfig, RedisLimiter};
//!
//! let config = RedisConfig::default().with_prefix("api:per_ip:");
//! let conn = tollgate_redis::connect("redis://127.0.0.1/", &config)?;
//! let limiter = RedisLimiter::gcra(conn, Quota::per_second(20)?, config)?;
//! let layer = AsyncRateLimitLayer::builder(PeerIp::new(), "per_ip", limiter)?.build();
//! # let _ = layer; Ok(()) }
//! ```

use std::borrow::Cow;
use std::future::Future;
use std::net::IpAddr;

use http::HeaderValue;
use tollgate_core::{CheckError, Decision, Quota};
use tollgate_redis::{ConnectionManager, LeasedLimiter, RedisEncoding, RedisLimiter};

use crate::AsyncKeyedCheck;

/// A key as Redis text.
trait KeyText {
    fn text(&self) -> Cow<'_, str>;
}

impl KeyText for IpAddr {
    fn text(&self) -> Cow<'_, str> {
        Cow::Owned(self.to_string())
    }
}

impl KeyText for HeaderValue {
    fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }
}

impl KeyText for () {
    fn text(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
}

impl KeyText for String {
    fn text(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl KeyText for str {
    fn text(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

/// One impl per concrete key type: a generic `K` would overlap the blanket impl over
/// [`KeyedCheck`](crate::KeyedCheck) in coherence's eyes.
macro_rules! redis_keyed_check {
    ($($key:ty),*) => {$(
        impl<A> AsyncKeyedCheck<$key> for RedisLimiter<A, ConnectionManager>
        where
            A: RedisEncoding + Send + Sync + 'static,
        {
            fn check_key(
                &self,
                key: &$key,
                cost: u64,
            ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
                let key = key.text().into_owned();
                async move { self.check(&key, cost).await }
            }

            fn peek_key(
                &self,
                key: &$key,
                cost: u64,
            ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
                let key = key.text().into_owned();
                async move { self.peek(&key, cost).await }
            }

            fn quota(&self) -> &Quota {
                RedisLimiter::quota(self)
            }
        }

        impl AsyncKeyedCheck<$key> for LeasedLimiter {
            fn check_key(
                &self,
                key: &$key,
                cost: u64,
            ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
                let key = key.text().into_owned();
                async move { self.check(&key, cost).await }
            }

            /// A lease is not peeked (a round trip on the shared bucket for a figure that is this
            /// process's alone): the answer is "not now, no known wait", so the `RateLimit`
            /// field's `t` is 0 and a denial keeps its own `Retry-After`.
            fn peek_key(
                &self,
                _key: &$key,
                _cost: u64,
            ) -> impl Future<Output = Result<Decision, CheckError>> + Send {
                std::future::ready(Ok(Decision::Denied {
                    retry_after: std::time::Duration::ZERO,
                    reset_after: std::time::Duration::ZERO,
                }))
            }

            fn quota(&self) -> &Quota {
                LeasedLimiter::quota(self)
            }
        }
    )*};
}

redis_keyed_check!(IpAddr, HeaderValue, (), String, str);
