//! The response fields: `Retry-After`, the IETF `RateLimit` / `RateLimit-Policy` structured fields,
//! and the legacy `X-RateLimit-*` trio.
//!
//! Field syntax follows draft-ietf-httpapi-ratelimit-headers (-10/-11), serialised with `sfv`:
//! * `RateLimit-Policy: "name";q=<units>;w=<seconds>` — computed once per policy.
//! * `RateLimit: "name";r=<units>;t=<seconds>` — per response, the key's service limit:
//!   * `r`: the units the key could spend right now, after this request (0 on a denial unless some
//!     units are left that are fewer than the cost asked).
//!   * `t`: **the whole seconds, rounded up, until the key's quota admits more than `r` units**:
//!     the draft's "time until additional quota is made available" (-10), which is also its
//!     "effective window, within which the client can use no more than the available quota"
//!     (-11). The meaning is the same on allowed and denied responses: the response that spends
//!     the last unit says `r=0;t=20` and the denial right after it says `r=0;t=20` too. `t` is
//!     *not* the time until the quota is whole again (a client pacing on that would wait up to
//!     `burst` times too long). With `r = 0`, `t` is at least 1, like `Retry-After`.
//!   * On a denial `Retry-After` is the wait until the cost asked fits: equal to `t` for
//!     one-unit requests, and never earlier than `t` (as the draft requires) for larger ones.
//!
//!   `t` is found by asking the limiter, without consuming anything, when `r + 1` units would be
//!   admitted ([`KeyedCheck::peek_key`]), so it is exact for every
//!   algorithm (a bucket refills a unit at a time, a fixed window all at once at its end). When
//!   `r` is the whole quota (only after a zero-cost request), nothing more can become available
//!   and `t` is 0.
//!
//! Both fields are Lists; one policy makes a one-member list, which serialises exactly as its item.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http::header::HeaderName;
use sfv::{Integer, ItemSerializer, KeyRef, StringRef};
use tollgate_core::{Decision, Quota};

use crate::check::KeyedCheck;

mod public;
pub use public::{busy_json, denial_json, retry_after_secs, seconds_value};

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// Legacy `X-RateLimit-Limit`: units per window (the policy's `q`).
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`: units left now (the `r` parameter).
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`: the `t` parameter (delta-seconds until more than `r` units would be
/// admitted), NOT a Unix timestamp.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// `Tollgate-Explain`, the conventional name of the opt-in header carrying a decision's trace to
/// a trusted caller (see [`PolicyEdge::explain_header`](crate::PolicyEdge::explain_header)).
pub static TOLLGATE_EXPLAIN: HeaderName = HeaderName::from_static("tollgate-explain");

/// The longest explain header value, in bytes: a longer trace is cut and ends in ` ...`. Proxies
/// commonly refuse response heads past 8 KiB; a trace is about 100 bytes a rule.
pub const MAX_EXPLAIN_LEN: usize = 4096;

/// A decision's trace as a response header, computed by the edge that decided, for a trusted
/// caller only: every edge adds it as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainField {
    /// The header's name.
    pub name: HeaderName,
    /// Its value: the trace in one line, made header-safe by [`explain_value`].
    pub value: HeaderValue,
}

/// `text` (an explanation's one-line `Display`) as a header value: visible ASCII and spaces are
/// kept, every other byte (control characters, line breaks, non-ASCII text from a descriptor) and
/// `%` itself are written `%XX`, so the value is always valid and a client can decode it; past
/// [`MAX_EXPLAIN_LEN`] bytes it is cut and ends in ` ...`.
///
/// ```
/// use tollgate_http::headers::explain_value;
/// assert_eq!(explain_value("denied by per_ip; per_ip: key `a\r\nb`"),
///            "denied by per_ip; per_ip: key `a%0D%0Ab`");
/// assert_eq!(explain_value("100% caf\u{e9}"), "100%25 caf%C3%A9");
/// ```
pub fn explain_value(text: &str) -> HeaderValue {
    const CUT: &[u8] = b" ...";
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(byte);
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 15)],
            ]);
        }
    }
    if out.len() > MAX_EXPLAIN_LEN {
        let mut end = MAX_EXPLAIN_LEN - CUT.len();
        // Never split a `%XX`.
        if let Some(at) = out[end.saturating_sub(2)..end]
            .iter()
            .position(|&b| b == b'%')
        {
            end = end.saturating_sub(2) + at;
        }
        out.truncate(end);
        out.extend_from_slice(CUT);
    }
    // Every byte is visible ASCII or a space (and the value does not start or end with a space
    // that matters: `HeaderValue` keeps them as given).
    HeaderValue::from_maybe_shared(Bytes::from(out))
        .unwrap_or_else(|_| HeaderValue::from_static("unrepresentable trace"))
}

const Q: &KeyRef = KeyRef::constant("q");
const W: &KeyRef = KeyRef::constant("w");

/// Which informational fields a response carries. `Retry-After` is always sent on a 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderMode {
    /// `RateLimit` and `RateLimit-Policy` (default on).
    pub ietf: bool,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (default off). Limit is units per the policy's
    /// window `w`, Remaining is `r` (units), Reset is `t`: delta-seconds until more than Remaining
    /// would be admitted (see the [module docs](self)), on allowed and denied responses alike.
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
///
/// The fixed values live in strings leaked for the life of the process (tens of bytes per policy
/// built), so every response shares them as static bytes: cloning them per response touches no
/// reference count that all cores would contend on, and the `RateLimit` value starts with a copy of
/// the name's serialised bytes instead of serialising the name again.
#[derive(Clone, Debug)]
pub(crate) struct PolicyHeaders {
    /// The serialised name (`"name"` with escapes): the start of both fields' text.
    name: &'static [u8],
    /// `"name";q=..;w=..`
    pub(crate) policy: HeaderValue,
    /// `q` (for `X-RateLimit-Limit`).
    pub(crate) limit: HeaderValue,
}

/// A header value over bytes that live for the rest of the process.
fn leaked(text: String) -> Option<HeaderValue> {
    static_value(Box::leak(text.into_boxed_str()))
}

/// A header value over static text, `None` when the text is not a valid value.
fn static_value(text: &'static str) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from_static(text.as_bytes())).ok()
}

/// Decimal digits of `v` (at least 1).
fn digits(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Clamps to the structured-field integer range (15 decimal digits).
const SF_INT_MAX: u64 = 999_999_999_999_999;

/// `"0".."999"` as static bytes, three to a slot (left-aligned, zero-free).
static SMALL: [[u8; 3]; 1000] = {
    let mut table = [[0u8; 3]; 1000];
    let mut n = 0;
    while n < 1000 {
        let (h, t, o) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            [b'0' + h, b'0' + t, b'0' + o]
        } else if n >= 10 {
            [b'0' + t, b'0' + o, 0]
        } else {
            [b'0' + o, 0, 0]
        };
        n += 1;
    }
    table
};

/// `n` as a header value; below 1000 (every realistic `Retry-After`) without allocating.
#[inline]
pub(crate) fn number(n: u64) -> HeaderValue {
    if n < 1000 {
        let slot: &'static [u8; 3] = &SMALL[n as usize];
        let value = Bytes::from_static(&slot[..digits(n)]);
        if let Ok(value) = HeaderValue::from_maybe_shared(value) {
            return value;
        }
    }
    HeaderValue::from(n)
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

/// `v` clamped to the structured-field integer range.
fn sf_int(v: u64) -> Integer {
    i64::try_from(v.min(SF_INT_MAX))
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
        let name_len = ItemSerializer::new().bare_item(sf_name).finish().len();
        let (q, w) = quota_window(quota);
        let policy: &'static str = Box::leak(
            ItemSerializer::new()
                .bare_item(sf_name)
                .parameter(Q, sf_int(q))
                .parameter(W, sf_int(w))
                .finish()
                .into_boxed_str(),
        );
        Ok(PolicyHeaders {
            name: policy.as_bytes().get(..name_len).ok_or_else(err)?,
            policy: static_value(policy).ok_or_else(err)?,
            limit: leaked(q.to_string()).unwrap_or_else(|| HeaderValue::from(q)),
        })
    }

    /// `"name";r=..;t=..` for one response: one allocation, sized exactly.
    pub(crate) fn ratelimit(&self, remaining: u64, t: u64) -> HeaderValue {
        self.ratelimit_value(remaining, t).to_value()
    }

    /// The `RateLimit` value for one response, as its parts: nothing is written or allocated
    /// until a response carries it.
    #[inline]
    pub(crate) fn ratelimit_value(&self, remaining: u64, t: u64) -> RateLimitValue {
        RateLimitValue {
            name: self.name,
            r: remaining,
            t,
        }
    }
}

/// One response's `RateLimit` value, `"name";r=..;t=..`, kept as its parts (the rule's serialised
/// name and the two numbers) so that deciding a request allocates nothing:
/// [`to_value`](Self::to_value) (or `HeaderValue::from`) writes it when a response carries it, and
/// it compares equal to its text.
///
/// ```
/// use tollgate_core::Quota;
/// use tollgate_http::PolicyFields;
/// let f = PolicyFields::new()
///     .for_rule("api", Quota::per_minute(10)?, &tollgate_core::Decision::allowed(3, 0), None)
///     .unwrap();
/// assert_eq!(f.ratelimit, "\"api\";r=3;t=0");
/// let value: http::HeaderValue = f.ratelimit.into();
/// assert_eq!(value, "\"api\";r=3;t=0");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RateLimitValue {
    /// The serialised name (`"name"` with escapes): validated visible ASCII.
    name: &'static [u8],
    r: u64,
    t: u64,
}

impl RateLimitValue {
    /// `r`, the units the key could spend now (before the structured-field clamp).
    pub fn remaining(&self) -> u64 {
        self.r
    }

    /// `t`, whole seconds until more than `r` units would pass (before the clamp).
    pub fn reset(&self) -> u64 {
        self.t
    }

    /// Calls `f` with the value's text, written on the stack.
    fn with_text<R>(&self, f: impl FnOnce(&[u8], &[u8], &[u8]) -> R) -> R {
        let (mut r_text, mut t_text) = (itoa::Buffer::new(), itoa::Buffer::new());
        let r = r_text.format(self.r.min(SF_INT_MAX)).as_bytes();
        let t = t_text.format(self.t.min(SF_INT_MAX)).as_bytes();
        f(self.name, r, t)
    }

    /// The header value: one allocation, sized exactly. The text is what `sfv` serialises (the
    /// name as it was serialised once per rule and quota, then two integer parameters), written
    /// directly.
    pub fn to_value(&self) -> HeaderValue {
        self.with_text(|name, r, t| {
            // `;r=` and `;t=` are 3 bytes each.
            let mut out = Vec::with_capacity(name.len() + 6 + r.len() + t.len());
            out.extend_from_slice(name);
            out.extend_from_slice(b";r=");
            out.extend_from_slice(r);
            out.extend_from_slice(b";t=");
            out.extend_from_slice(t);
            // Every byte is a validated name's or a digit; a failure cannot happen, and would
            // only drop the field (never panic).
            HeaderValue::from_maybe_shared(Bytes::from(out))
                .unwrap_or_else(|_| HeaderValue::from_static(""))
        })
    }

    /// Whether the text is `other`, compared piece by piece (nothing written).
    fn is(&self, other: &[u8]) -> bool {
        self.with_text(|name, r, t| {
            let mut rest = other;
            for part in [name, b";r=", r, b";t=", t] {
                match rest.strip_prefix(part) {
                    Some(tail) => rest = tail,
                    None => return false,
                }
            }
            rest.is_empty()
        })
    }
}

impl fmt::Display for RateLimitValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_text(|name, r, t| {
            for part in [name, b";r=", r, b";t=", t] {
                // Visible ASCII only (see `name`); a byte that is not would be skipped.
                f.write_str(std::str::from_utf8(part).unwrap_or_default())?;
            }
            Ok(())
        })
    }
}

impl fmt::Debug for RateLimitValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl PartialEq<str> for RateLimitValue {
    fn eq(&self, other: &str) -> bool {
        self.is(other.as_bytes())
    }
}

impl PartialEq<&str> for RateLimitValue {
    fn eq(&self, other: &&str) -> bool {
        self.is(other.as_bytes())
    }
}

impl From<RateLimitValue> for HeaderValue {
    fn from(value: RateLimitValue) -> Self {
        value.to_value()
    }
}

impl From<&RateLimitValue> for HeaderValue {
    fn from(value: &RateLimitValue) -> Self {
        value.to_value()
    }
}

/// Whole seconds, rounded up (saturating).
#[inline]
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The `Retry-After` / `t` value for a denial: seconds rounded up, never 0 (a client told 0 would
/// retry at once into another denial), and within the structured-field integer range so that
/// `Retry-After` and `t` always agree (the cap is 31 million years).
#[inline]
pub(crate) fn retry_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after).clamp(1, SF_INT_MAX)
}

/// `(r, t)` for a decision of `cost` units: the `RateLimit` field's service limit as the
/// [module docs](self) define it, worked out here only (every layer, Pingora and the server come
/// here). `peek(units)` is a read-only look at the deciding limiter for `units` units now (`None`
/// when it cannot look); it is asked for `r + 1` on admissions, and on denials of more than one
/// unit for 1 (how many are left), then for `r + 1`. One-unit denials need no look.
pub(crate) fn service_limit(
    decision: &Decision,
    cost: u64,
    mut peek: impl FnMut(u64) -> Option<Decision>,
) -> (u64, u64) {
    // Whole seconds, rounded up, until more than `r` units would pass; 0 when they already would,
    // or when `r` is the whole quota (nothing more can become available).
    fn next_unit_secs(peek: &mut impl FnMut(u64) -> Option<Decision>, r: u64) -> u64 {
        match r.checked_add(1).and_then(peek) {
            Some(Decision::Denied { retry_after, .. }) => ceil_secs(retry_after),
            Some(Decision::Allowed { .. }) | None => 0,
        }
    }
    let (r, t) = match *decision {
        Decision::Allowed { remaining, .. } => (remaining, next_unit_secs(&mut peek, remaining)),
        // One unit asked: the wait until it fits is the wait until a unit is available.
        Decision::Denied { retry_after, .. } if cost <= 1 => (0, retry_secs(retry_after)),
        Decision::Denied { retry_after, .. } => match peek(1) {
            Some(Decision::Allowed { remaining, .. }) => {
                let r = remaining.saturating_add(1);
                (r, next_unit_secs(&mut peek, r))
            }
            Some(Decision::Denied { retry_after, .. }) => (0, retry_secs(retry_after)),
            // No look possible (or one unit can never fit): say nothing shorter than the
            // denial's own wait, and promise no units.
            None => (0, retry_secs(retry_after)),
        },
    };
    // With nothing left the wait is never 0 (a client told 0 would retry into a denial); the
    // peek can only find a unit already back if the clock moved since the decision.
    (r, if r == 0 { t.max(1) } else { t })
}

/// [`service_limit`] for `key` of a [`KeyedCheck`] limiter, looking with its `peek_key`.
pub(crate) fn keyed_service_limit<K, L>(
    limiter: &L,
    key: &K,
    cost: u64,
    decision: &Decision,
) -> (u64, u64)
where
    K: ?Sized,
    L: KeyedCheck<K> + ?Sized,
{
    service_limit(decision, cost, |units| limiter.peek_key(key, units).ok())
}

/// The 429 body `{"error":"rate limit exceeded","retry_after":N}`: one allocation, sized exactly.
pub(crate) fn denial_body(retry_secs: u64) -> Bytes {
    const HEAD: &[u8] = br#"{"error":"rate limit exceeded","retry_after":"#;
    let mut digits = itoa::Buffer::new();
    let n = digits.format(retry_secs).as_bytes();
    let mut body = Vec::with_capacity(HEAD.len() + n.len() + 1);
    body.extend_from_slice(HEAD);
    body.extend_from_slice(n);
    body.push(b'}');
    Bytes::from(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_trace_is_cut_between_escapes_and_stays_a_valid_value() {
        let short = "x".repeat(MAX_EXPLAIN_LEN);
        assert_eq!(
            explain_value(&short).len(),
            MAX_EXPLAIN_LEN,
            "a trace that fits is kept"
        );
        for pad in 0..3 {
            // Escapes straddle the cut at every offset.
            let text = format!("{}{}", "a".repeat(pad), "\u{e9}".repeat(MAX_EXPLAIN_LEN));
            let value = explain_value(&text);
            let bytes = value.as_bytes();
            assert!(bytes.len() <= MAX_EXPLAIN_LEN);
            assert!(bytes.ends_with(b" ..."));
            let body = &bytes[..bytes.len() - 4];
            let escaped = &body[pad..];
            assert_eq!(escaped.len() % 3, 0, "no `%XX` split (pad {pad})");
            assert!(escaped.chunks(3).all(|c| c == b"%C3" || c == b"%A9"));
        }
    }

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
        assert_eq!(retry_secs(Duration::MAX), SF_INT_MAX);
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
    fn denial_body_is_the_documented_json() {
        let body = denial_body(42);
        assert_eq!(
            &body[..],
            br#"{"error":"rate limit exceeded","retry_after":42}"#
        );
    }

    #[test]
    fn numbers_render_with_and_without_the_table() {
        for n in [0, 1, 9, 10, 42, 99, 100, 999, 1000, 123_456, u64::MAX] {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
            assert_eq!(digits(n), n.to_string().len(), "{n}");
        }
    }

    #[test]
    fn ratelimit_values_are_what_sfv_serialises() {
        const R: &KeyRef = KeyRef::constant("r");
        const T: &KeyRef = KeyRef::constant("t");
        for name in ["api", r#"q"uo\te"#, "", "a b;c=d"] {
            let h = PolicyHeaders::new(name, &Quota::per_minute(100).unwrap()).unwrap();
            for (r, t) in [(0, 0), (7, 60), (123_456, 1), (u64::MAX, u64::MAX)] {
                let value = h.ratelimit(r, t);
                let expected = ItemSerializer::new()
                    .bare_item(StringRef::from_str(name).unwrap())
                    .parameter(R, sf_int(r))
                    .parameter(T, sf_int(t))
                    .finish();
                assert_eq!(value, expected.as_str(), "{name:?} r={r} t={t}");
            }
        }
    }
}
