//! Costs charged on the response path: a descriptor that carries the entry
//! [`CHARGE_KEY`]` = `[`CHARGE_VALUE`] is not decided but charged.
//!
//! Envoy (1.33 and later) can call the rate-limit service a second time when a stream is done: a
//! `rate_limits` entry with `apply_on_stream_done: true` (in the filter's per-route config) sends
//! its descriptors then, each with a `hits_addend` that can be read from the response
//! (`format: "%RESP(x-usage-tokens)%"`), and ignores the answer. Nothing in that call says it comes after the response, so the entry
//! does: a `generic_key` action with `descriptor_key: tollgate` and `descriptor_value: charge` in
//! that `rate_limits` entry. Such a descriptor, with the marker entry taken out, is charged its
//! `hits_addend` in every rule that applies to it ([`Policy::charge`](tollgate_policy::Policy::charge)): a key with nothing left
//! goes into debt, and its next request-path calls are denied until the overdraft has refilled.
//! An explicit `hits_addend` of 0 (no usage) charges nothing. The descriptor's answer is `OK`,
//! with no fields.
//!
//! The other descriptors of the same call, if any, are decided as usual. The entry key
//! [`CHARGE_KEY`] is reserved: any other value of it is a malformed request, as is a charge in an
//! explain or a reservation.
//!
//! # Failure
//! An embedded domain's charge cannot fail. On Redis, a charge Redis did not confirm is logged,
//! counted (`tollgate_server_charge_failures_total{domain}`) and lost: an under-count of at most
//! that charge, never an over-admission by more (the request was already served).

use tollgate_core::Decision;
use tollgate_http::EdgeVerdict;
use tollgate_policy::{Charged, PolicyDecision};

use crate::domain::{Domain, DomainPolicy};
use crate::request::RequestError;

/// The key of the entry that makes a descriptor a charge.
pub const CHARGE_KEY: &str = "tollgate";
/// The value of that entry (the only one it may have).
pub const CHARGE_VALUE: &str = "charge";

/// Whether a descriptor is a charge (carries the marker entry).
///
/// # Errors
/// [`RequestError::Malformed`] for the reserved key with another value.
pub fn is_charge(entries: &[(&str, &str)]) -> Result<bool, RequestError> {
    let mut marked = false;
    for &(key, value) in entries {
        if key == CHARGE_KEY {
            if value != CHARGE_VALUE {
                return Err(RequestError::Malformed(format!(
                    "descriptor entry `{CHARGE_KEY}` is reserved: its one value is \
                     `{CHARGE_VALUE}`, not `{value}`"
                )));
            }
            marked = true;
        }
    }
    Ok(marked)
}

/// Whether any descriptor of a call is a charge.
///
/// # Errors
/// As [`is_charge`].
pub fn any_charge(descriptors: &[(Vec<(&str, &str)>, u64)]) -> Result<bool, RequestError> {
    let mut any = false;
    for (entries, _) in descriptors {
        any |= is_charge(entries)?;
    }
    Ok(any)
}

/// A descriptor's entries without the marker.
pub fn unmarked<'a>(entries: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    entries
        .iter()
        .filter(|(key, _)| *key != CHARGE_KEY)
        .copied()
        .collect()
}

/// Charges `cost` units to every rule of `dom` that applies to `entries` (the marker taken out).
pub async fn charge(name: &str, dom: &Domain, entries: &[(&str, &str)], cost: u64) -> Charged {
    let charged = match &dom.policy {
        DomainPolicy::Embedded(policy) => policy.charge(entries, cost),
        DomainPolicy::Redis(policy) => match policy.charge(entries, cost).await {
            Ok(charged) => charged,
            Err(error) => {
                metrics::counter!("tollgate_server_charge_failures_total", "domain" => name.to_owned())
                    .increment(1);
                tracing::warn!(domain = name, descriptor = ?entries, cost, %error, "charge not confirmed by redis");
                return Charged { cost, rules: 0 };
            }
        },
    };
    dom.metrics.charged(charged.cost);
    tracing::debug!(domain = name, descriptor = ?entries, cost, rules = charged.rules, "charged");
    charged
}

/// A charged descriptor's verdict: `OK`, no rule, no fields.
pub fn charged_verdict(dom: &Domain) -> EdgeVerdict {
    let decided = PolicyDecision {
        decision: Decision::Allowed {
            remaining: u64::MAX,
            reset_after: std::time::Duration::ZERO,
        },
        rule: None,
        quota: None,
        delay: std::time::Duration::ZERO,
        shadow_denied: false,
    };
    EdgeVerdict::of_check(Ok((decided, None)), 0, &dom.fields, |_| None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_found_anywhere_and_its_key_is_reserved() {
        assert!(!is_charge(&[("tenant", "a")]).unwrap());
        assert!(is_charge(&[("tenant", "a"), ("tollgate", "charge")]).unwrap());
        assert!(is_charge(&[("tollgate", "charge"), ("tenant", "a")]).unwrap());
        assert!(matches!(
            is_charge(&[("tollgate", "yes")]),
            Err(RequestError::Malformed(m)) if m.contains("reserved")
        ));
        assert_eq!(
            unmarked(&[("tenant", "a"), ("tollgate", "charge"), ("route", "/x")]),
            [("tenant", "a"), ("route", "/x")]
        );
    }
}
