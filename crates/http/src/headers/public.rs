//! The header syntax as a public API, for integrations that are not tower layers (a Pingora
//! filter, a gRPC server): the same serialisation the layers use, so the syntax has one home. A
//! policy decision's `RateLimit` / `RateLimit-Policy` values come from
//! [`PolicyFields`](crate::PolicyFields).

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;

/// The `Retry-After` (and denied `t`) value in seconds: rounded up, never 0, within the
/// structured-field integer range.
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    super::retry_secs(retry_after)
}

/// `n` as a header value (below 1000 without allocating).
pub fn seconds_value(n: u64) -> HeaderValue {
    super::number(n)
}

/// The 429 body `{"error":"rate limit exceeded","retry_after":N}`.
pub fn denial_json(retry_secs: u64) -> Bytes {
    super::denial_body(retry_secs)
}

/// The 503 body of an in-flight (concurrency) denial:
/// `{"error":"too many requests in flight","retry_after":N}`.
pub fn busy_json(retry_secs: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"error":"too many requests in flight","retry_after":{retry_secs}}}"#
    ))
}
