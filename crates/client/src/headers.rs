//! Reading the server's pacing hints: `Retry-After` (RFC 9110 §10.2.3) and the IETF
//! `RateLimit` header (draft-ietf-httpapi-ratelimit-headers, Structured Fields syntax).
//!
//! Both functions take the current wall-clock time as an argument instead of reading a clock,
//! so tests and simulations need no real time.

use std::fmt;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::RETRY_AFTER;

/// The `RateLimit` response header name (lowercase, as HTTP/2 and `http` require).
pub const RATELIMIT: &str = "ratelimit";

/// Why a `Retry-After` value could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidRetryAfter {
    /// Neither a non-negative integer of seconds nor an HTTP-date.
    Unparseable,
}

impl fmt::Display for InvalidRetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidRetryAfter::Unparseable => {
                "Retry-After value is neither delay-seconds nor an HTTP-date"
            }
        })
    }
}

impl std::error::Error for InvalidRetryAfter {}

/// Parse one `Retry-After` value into a wait measured from `now`.
///
/// * delay-seconds (`"120"`): that many seconds; a number too large for `u64` saturates to
///   `u64::MAX` seconds (the caller's cap then gives up).
/// * HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`, also the obsolete RFC 850 and asctime
///   forms, via the `httpdate` crate): the time from `now` until that date, or zero if the
///   date has passed.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tollgate_client::parse_retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT
/// assert_eq!(parse_retry_after("7", now), Ok(Duration::from_secs(7)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Ok(Duration::from_secs(10)),
/// );
/// ```
///
/// # Errors
/// [`InvalidRetryAfter`] when the value is neither form.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Result<Duration, InvalidRetryAfter> {
    let value = value.trim_matches([' ', '\t']);
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only overflow can fail, and a larger-than-u64 wait saturates.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Ok(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).map_err(|_| InvalidRetryAfter::Unparseable)?;
    Ok(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait a response's `Retry-After` header asks for, measured from `now`.
///
/// `None` when the header is absent or unreadable (a malformed hint is ignored and the
/// caller falls back to its own backoff). With several `Retry-After` fields the first one
/// counts.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?;
    let text = value.to_str().ok()?;
    parse_retry_after(text, now).ok()
}

/// A `RateLimit` field that is not a valid Structured Fields List.
#[derive(Debug)]
pub struct InvalidRateLimit(sfv::Error);

impl fmt::Display for InvalidRateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid RateLimit header: {}", self.0)
    }
}

impl std::error::Error for InvalidRateLimit {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// One policy entry of a `RateLimit` header: `"name";r=<remaining>;t=<seconds>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitEntry {
    /// The policy name (the Structured Fields string item).
    pub policy: String,
    /// `r`: quota units the client may still spend now.
    pub remaining: Option<u64>,
    /// `t`: seconds until more than `r` units become available (the draft's "time until
    /// additional quota is made available"; Tollgate's server sends exactly that on allowed and
    /// denied responses alike). Not necessarily the time until the whole quota is back.
    pub reset: Option<Duration>,
}

/// Parse every `RateLimit` header field into its policy entries (current draft syntax: a
/// Structured Fields List of string items with `r` and `t` integer parameters, e.g.
/// `"default";r=0;t=5`). Several header fields are one list, in order. Entries that are not
/// string items are skipped; negative or non-integer `r`/`t` read as absent.
///
/// # Errors
/// [`InvalidRateLimit`] when a field is not a valid Structured Fields List.
pub fn ratelimit_entries(headers: &HeaderMap) -> Result<Vec<RateLimitEntry>, InvalidRateLimit> {
    let mut list: sfv::List = Vec::new();
    for value in headers.get_all(RATELIMIT) {
        list = sfv::Parser::new(value.as_bytes())
            .parse_list_with_visitor(list)
            .map_err(InvalidRateLimit)?;
    }
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let sfv::ListEntry::Item(item) = entry else {
            continue;
        };
        let Some(name) = item.bare_item.as_string() else {
            continue;
        };
        let int = |key: &str| {
            item.params
                .get(key)
                .and_then(|v| v.as_integer())
                .and_then(|i| u64::try_from(i64::from(i)).ok())
        };
        out.push(RateLimitEntry {
            policy: name.as_str().to_owned(),
            remaining: int("r"),
            reset: int("t").map(Duration::from_secs),
        });
    }
    Ok(out)
}

/// How long to pause before the next request, according to the `RateLimit` header: the
/// longest `t` among policies with nothing remaining (`r=0`).
///
/// With `r=0`, `t` is the wait until the policy admits a unit again, so a client that honours it
/// waits exactly as long as a 429's `Retry-After` would have told it (for one-unit requests)
/// instead of spending a request on a certain 429. `None` when the header is absent or
/// malformed, or every policy still has quota left.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use tollgate_client::pause_hint;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit", HeaderValue::from_static(r#""default";r=0;t=5"#));
/// assert_eq!(pause_hint(&headers), Some(Duration::from_secs(5)));
///
/// headers.insert("ratelimit", HeaderValue::from_static(r#""default";r=3;t=5"#));
/// assert_eq!(pause_hint(&headers), None);
/// ```
pub fn pause_hint(headers: &HeaderMap) -> Option<Duration> {
    ratelimit_entries(headers)
        .ok()?
        .into_iter()
        .filter(|e| e.remaining == Some(0))
        .filter_map(|e| e.reset)
        .max()
}
