//! The header syntax as a public API, for integrations that are not tower layers (a Pingora
//! filter, a gRPC server): the same serialisation the layers use, so the syntax has one home.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use tollgate_core::Quota;

use super::{PolicyHeaders, PolicyNameError};

/// One policy's `RateLimit-Policy` value and its `RateLimit` values, serialised as the layers do.
///
/// Building one leaks its fixed text (tens of bytes) for the life of the process: build it once per
/// (rule, quota) pair and keep it, never per request.
#[derive(Clone, Debug)]
pub struct PolicyFields(PolicyHeaders);

impl PolicyFields {
    /// The fields of a policy named `name` enforcing `quota`.
    ///
    /// # Errors
    /// [`PolicyNameError`] when `name` is not a valid structured-field string.
    pub fn new(name: &str, quota: &Quota) -> Result<Self, PolicyNameError> {
        PolicyHeaders::new(name, quota).map(PolicyFields)
    }

    /// `RateLimit-Policy: "name";q=..;w=..` (static bytes; cloning touches no shared counter).
    pub fn policy_value(&self) -> HeaderValue {
        self.0.policy.clone()
    }

    /// `RateLimit: "name";r=..;t=..` for `remaining` units and `t` seconds.
    pub fn ratelimit_value(&self, remaining: u64, t: u64) -> HeaderValue {
        self.0.ratelimit(remaining, t)
    }
}

/// The `Retry-After` (and denied `t`) value in seconds: rounded up, never 0, within the
/// structured-field integer range.
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    super::retry_secs(retry_after)
}

/// Whole seconds rounded up (saturating): the allowed `t` of a wait.
pub fn ceil_secs(d: Duration) -> u64 {
    super::ceil_secs(d)
}

/// `n` as a header value (below 1000 without allocating).
pub fn seconds_value(n: u64) -> HeaderValue {
    super::number(n)
}

/// The 429 body `{"error":"rate limit exceeded","retry_after":N}`.
pub fn denial_json(retry_secs: u64) -> Bytes {
    super::denial_body(retry_secs)
}
