//! What the layers write themselves: the fields a forwarded response gains ([`Fields`]) and the
//! layers' own answers (the 429 of a denial, a fixed JSON body).

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::headers::{
    self, ExplainField, HeaderMode, PolicyHeaders, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

/// The body of a request refused for want of a key ([`MissingKey::Reject`](crate::MissingKey)).
pub(crate) const MISSING_KEY_BODY: &[u8] = br#"{"error":"rate limit key missing"}"#;
/// The body of a request whose cost no quota can ever admit.
pub(crate) const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

/// The `RateLimit` (and legacy) fields a response gains, computed with the verdict.
pub struct Fields {
    ietf: Option<(HeaderValue, HeaderValue)>,
    legacy: Option<(HeaderValue, HeaderValue, HeaderValue)>,
    /// A trusted caller's trace (boxed: one pointer, null on every other response).
    explain: Option<Box<ExplainField>>,
}

impl Fields {
    /// The fields for service limit `(r, t)` ([`headers::service_limit`]).
    pub(crate) fn new(mode: HeaderMode, policy: &PolicyHeaders, (r, t): (u64, u64)) -> Self {
        Fields {
            ietf: mode
                .ietf
                .then(|| (policy.policy.clone(), policy.ratelimit(r, t))),
            legacy: mode.legacy.then(|| {
                (
                    policy.limit.clone(),
                    HeaderValue::from(r),
                    HeaderValue::from(t),
                )
            }),
            explain: None,
        }
    }

    /// The fields of a policy verdict's values (their `(r, t)` already worked out).
    #[cfg(feature = "policy")]
    pub(crate) fn of_values(mode: HeaderMode, values: &crate::FieldValues) -> Self {
        let (r, t) = values.service_limit;
        Fields {
            ietf: mode
                .ietf
                .then(|| (values.ratelimit_policy.clone(), values.ratelimit.to_value())),
            legacy: mode.legacy.then(|| {
                (
                    values.limit.clone(),
                    HeaderValue::from(r),
                    HeaderValue::from(t),
                )
            }),
            explain: None,
        }
    }

    /// `fields` with a trusted caller's trace added (`explain` is `None` but for such callers).
    #[cfg(feature = "policy")]
    pub(crate) fn with_explain(
        fields: Option<Fields>,
        explain: Option<Box<ExplainField>>,
    ) -> Option<Fields> {
        let Some(explain) = explain else {
            return fields;
        };
        let mut fields = fields.unwrap_or(Fields {
            ietf: None,
            legacy: None,
            explain: None,
        });
        fields.explain = Some(explain);
        Some(fields)
    }

    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, ratelimit)) = self.ietf {
            // `append`: list fields; a second layer's policy becomes a second list member.
            headers.append(&RATELIMIT_POLICY, policy);
            headers.append(&RATELIMIT, ratelimit);
        }
        if let Some((limit, remaining, reset)) = self.legacy {
            headers.insert(&X_RATELIMIT_LIMIT, limit);
            headers.insert(&X_RATELIMIT_REMAINING, remaining);
            headers.insert(&X_RATELIMIT_RESET, reset);
        }
        if let Some(explain) = self.explain {
            let ExplainField { name, value } = *explain;
            headers.insert(name, value);
        }
    }
}

/// A response of `status` with a JSON `body`: a layer's own answer (a refusal, a 503).
pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The 429 with `Retry-After: secs`, the JSON body and `fields`: every layer answers a denial
/// with this.
pub(crate) fn too_many_requests(
    mode: HeaderMode,
    secs: u64,
    fields: Option<Fields>,
) -> Response<Bytes> {
    let mut response = Response::new(headers::denial_body(secs));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    // Size the map once: content-type, retry-after, and the fields.
    let count = 2 * usize::from(mode.ietf) + 3 * usize::from(mode.legacy);
    response.headers_mut().reserve(2 + count);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
        .headers_mut()
        .insert(RETRY_AFTER, headers::number(secs));
    if let Some(fields) = fields {
        fields.apply(response.headers_mut());
    }
    response
}
