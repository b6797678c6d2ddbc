//! The response fields: `Retry-After`, the IETF `RateLimit` / `RateLimit-Policy` structured fields,
//! and the legacy `X-RateLimit-*` trio.
//!
//! Field syntax follows draft-ietf-httpapi-ratelimit-headers (-09/-10), serialised with `sfv`:
//! * `RateLimit-Policy: "name";q=<units>;w=<seconds>` — computed once per policy.
//! * `RateLimit: "name";r=<remaining>;t=<seconds>` — per response. Allowed: `t` is the time until the
//!   key's quota is whole again (`reset_after`, rounded up). Denied: `t` equals `Retry-After`.
//!
//! Both fields are Lists; one policy makes a one-member list, which serialises exactly as its item.

use std::fmt;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderValue;
use http::header::HeaderName;
use sfv::{Integer, ItemSerializer, KeyRef, StringRef};
use tollgate_core::{Decision, Quota};

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// Legacy `X-RateLimit-Limit`: units per window (the policy's `q`).
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`: units left now (the `r` parameter).
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`: delta-seconds until reset (the `t` parameter), NOT a Unix timestamp.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const Q: &KeyRef = KeyRef::constant("q");
const W: &KeyRef = KeyRef::constant("w");
const R: &KeyRef = KeyRef::constant("r");
const T: &KeyRef = KeyRef::constant("t");

/// Which informational fields a response carries. `Retry-After` is always sent on a 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderMode {
    /// `RateLimit` and `RateLimit-Policy` (default on).
    pub ietf: bool,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (default off). Limit is units per the policy's
    /// window `w`, Remaining is units, Reset is delta-seconds until the key's quota is whole again
    /// (on a denial: until the retry may pass, equal to `Retry-After`).
    pub legacy: bool,
    /// Whether allowed responses carry them too (default on); denials always do (when enabled).
    pub on_allowed: bool,
}

impl Default for HeaderMode {
    fn default() -> Self {
        HeaderMode {
            ietf: true,
            legacy: false,
            on_allowed: true,
        }
    }
}

/// Why a policy name was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyNameError {
    name: String,
}

impl fmt::Display for PolicyNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy name {:?} is not a structured-field string (printable ASCII only)",
            self.name
        )
    }
}

impl std::error::Error for PolicyNameError {}

/// A policy's fixed header material, built once.
#[derive(Clone, Debug)]
pub(crate) struct PolicyHeaders {
    name: String,
    /// `"name";q=..;w=..`
    pub(crate) policy: HeaderValue,
    /// `q` (for `X-RateLimit-Limit`).
    pub(crate) limit: HeaderValue,
}

/// `(q, w)`: `limit` per `period`, with the window in whole seconds as the draft requires. A period
/// that is not whole seconds is advertised over `ceil(period)` seconds with the units scaled down
/// (rounded down, at least 1), so clients are never promised more than the quota gives.
pub(crate) fn quota_window(quota: &Quota) -> (u64, u64) {
    const NANOS: u128 = 1_000_000_000;
    let period = u128::from(quota.period_nanos());
    let limit = u128::from(quota.limit());
    if period % NANOS == 0 {
        return (
            quota.limit(),
            u64::try_from(period / NANOS).unwrap_or(u64::MAX),
        );
    }
    let w = period.div_ceil(NANOS);
    let q = (limit * w * NANOS / period).max(1);
    (
        u64::try_from(q).unwrap_or(u64::MAX),
        u64::try_from(w).unwrap_or(u64::MAX),
    )
}

/// Clamps to the structured-field integer range (15 decimal digits).
fn sf_int(v: u64) -> Integer {
    i64::try_from(v)
        .ok()
        .and_then(|v| Integer::try_from(v).ok())
        .unwrap_or(Integer::MAX)
}

impl PolicyHeaders {
    pub(crate) fn new(name: &str, quota: &Quota) -> Result<Self, PolicyNameError> {
        let err = || PolicyNameError {
            name: name.to_owned(),
        };
        let sf_name = StringRef::from_str(name).map_err(|_| err())?;
        let (q, w) = quota_window(quota);
        let policy = ItemSerializer::new()
            .bare_item(sf_name)
            .parameter(Q, sf_int(q))
            .parameter(W, sf_int(w))
            .finish();
        Ok(PolicyHeaders {
            name: name.to_owned(),
            policy: HeaderValue::try_from(policy).map_err(|_| err())?,
            limit: HeaderValue::from(q),
        })
    }

    /// `"name";r=..;t=..` for one response.
    pub(crate) fn ratelimit(&self, remaining: u64, t: u64) -> HeaderValue {
        let mut out = String::with_capacity(self.name.len() + 32);
        // The name was validated in `new`; a failure here cannot happen, and would only drop the
        // field (never panic).
        if let Ok(name) = StringRef::from_str(&self.name) {
            let _ = ItemSerializer::with_buffer(&mut out)
                .bare_item(name)
                .parameter(R, sf_int(remaining))
                .parameter(T, sf_int(t));
        }
        HeaderValue::try_from(out).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// Whole seconds, rounded up (saturating).
#[inline]
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The `Retry-After` / `t` value for a denial: seconds rounded up, never 0 (a client told 0 would
/// retry at once into another denial).
#[inline]
pub(crate) fn retry_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after).max(1)
}

/// `(remaining, t)` for a decision.
#[inline]
pub(crate) fn r_and_t(decision: &Decision) -> (u64, u64) {
    match *decision {
        Decision::Allowed {
            remaining,
            reset_after,
        } => (remaining, ceil_secs(reset_after)),
        Decision::Denied { retry_after, .. } => (0, retry_secs(retry_after)),
    }
}

/// The 429 body `{"error":"rate limit exceeded","retry_after":N}` and the `Retry-After` value `N`,
/// sharing one buffer.
pub(crate) fn denial_body(retry_secs: u64) -> (Bytes, HeaderValue) {
    const HEAD: &[u8] = br#"{"error":"rate limit exceeded","retry_after":"#;
    let mut digits = itoa::Buffer::new();
    let n = digits.format(retry_secs).as_bytes();
    let mut buf = BytesMut::with_capacity(HEAD.len() + n.len() + 1);
    buf.put_slice(HEAD);
    buf.put_slice(n);
    buf.put_u8(b'}');
    let body = buf.freeze();
    let value = body.slice(HEAD.len()..HEAD.len() + n.len());
    // Digits only: always a valid header value; the fallback is unreachable.
    let retry_after =
        HeaderValue::from_maybe_shared(value).unwrap_or_else(|_| HeaderValue::from(retry_secs));
    (body, retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_up_and_never_zero_on_denial() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
        assert_eq!(retry_secs(Duration::ZERO), 1);
        assert_eq!(retry_secs(Duration::from_millis(200)), 1);
        assert_eq!(retry_secs(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn windows_are_whole_seconds_and_never_overpromise() {
        let q = |p: u64, n| quota_window(&Quota::per(Duration::from_millis(p), n).unwrap());
        assert_eq!(q(1000, 5), (5, 1));
        assert_eq!(q(60_000, 100), (100, 60));
        assert_eq!(q(500, 5), (10, 1));
        assert_eq!(q(1500, 3), (4, 2));
        assert_eq!(q(2500, 1), (1, 3));
    }

    #[test]
    fn fields_serialise_in_draft_syntax() {
        let h = PolicyHeaders::new("api", &Quota::per_minute(100).unwrap()).unwrap();
        assert_eq!(h.policy, r#""api";q=100;w=60"#);
        assert_eq!(h.ratelimit(7, 3), r#""api";r=7;t=3"#);
        assert_eq!(h.ratelimit(u64::MAX, 0), r#""api";r=999999999999999;t=0"#);
        assert!(PolicyHeaders::new("bad\u{7f}", &Quota::per_minute(1).unwrap()).is_err());
        assert!(PolicyHeaders::new("é", &Quota::per_minute(1).unwrap()).is_err());
        let quoted = PolicyHeaders::new(r#"a"b\c"#, &Quota::per_minute(1).unwrap()).unwrap();
        assert_eq!(quoted.policy, r#""a\"b\\c";q=1;w=60"#);
    }

    #[test]
    fn denial_body_and_retry_after_agree() {
        let (body, value) = denial_body(42);
        assert_eq!(
            &body[..],
            br#"{"error":"rate limit exceeded","retry_after":42}"#
        );
        assert_eq!(value, "42");
    }
}
