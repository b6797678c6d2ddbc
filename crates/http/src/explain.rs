//! The decision's trace as a response header, opt-in and for trusted callers only.
//!
//! [`PolicyEdge::explain_header`] names a header (conventionally
//! [`TOLLGATE_EXPLAIN`](crate::headers::TOLLGATE_EXPLAIN)) and a predicate over the request's
//! [`RequestFacts`] saying whom the operator trusts (a peer on an internal network, a request
//! carrying an operator's token). A request the predicate trusts is decided by
//! [`Policy::explain_next_at`](tollgate_policy::Policy::explain_next_at) (or
//! [`Policy::admit_explained_at`](tollgate_policy::Policy::admit_explained_at) on the admit path):
//! the same decision, consuming the same units, with its trace, rendered in one line (the
//! [`Explanation`](tollgate_policy::Explanation)'s `Display`: which rule decided, each rule's key,
//! quota, tier, state before and after, or why it did not apply) and made header-safe by
//! [`explain_value`]. Every other request is decided as without the option: the decision path
//! pays one `None` check when the option is off, and the predicate's call when it is on.
//!
//! Nothing a client sends turns the header on: asking for it (sending the header, say) is not
//! trust, only the predicate is. Every edge over a [`PolicyEdge`] adds the header as it is: the
//! tower [`PolicyLayer`](crate::PolicyLayer) on the forwarded response and on a 429 (its 413 for
//! a cost no rule can ever admit carries no trace: its body says why), the
//! [`AdmitLayer`](crate::AdmitLayer) on those and on its 503, tollgate-pingora on every answer.
//! Only in-process policies explain (not the Redis edges): a trace reads each rule's state, which
//! on Redis would cost round trips.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use tollgate_core::Clock;
use tollgate_policy::PolicyError;

use crate::admit_layer::Admitted;
use crate::edge::{EdgeVerdict, PolicyEdge, RequestFacts};
use crate::headers::{ExplainField, explain_value};

/// Whom the trace is for.
type Trust = dyn Fn(&RequestFacts<'_>) -> bool + Send + Sync;

/// The explain option of an edge: the header's name and the trust predicate.
#[derive(Clone)]
pub(crate) struct ExplainHeader {
    name: HeaderName,
    trust: Arc<Trust>,
}

impl fmt::Debug for ExplainHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExplainHeader")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ExplainHeader {
    /// Header `name` for the requests `trust` accepts.
    pub(crate) fn new(
        name: HeaderName,
        trust: impl Fn(&RequestFacts<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        ExplainHeader {
            name,
            trust: Arc::new(trust),
        }
    }

    /// The header for `text` (an explanation's one-line text).
    fn field(&self, text: &str) -> Box<ExplainField> {
        Box::new(ExplainField {
            name: self.name.clone(),
            value: explain_value(text),
        })
    }
}

/// The one-line text of a request that could not be decided.
fn refused(error: &PolicyError) -> String {
    format!("refused: {error}")
}

impl<C: Clock + Clone + 'static> PolicyEdge<C> {
    /// Adds the decision's trace, as response header `name`, to the answer of every request
    /// `trust` accepts (see the [module docs](crate::explain)); default: never. `trust` sees the
    /// request's facts (the TCP peer, method, path and headers) and should accept only callers
    /// the operator trusts: the trace shows every rule's keys, quotas and remaining units.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::{HeaderMap, HeaderValue};
    /// use tollgate_http::headers::TOLLGATE_EXPLAIN;
    /// use tollgate_http::{ClientIp, PolicyEdge, RequestFacts};
    /// use tollgate_policy::{Policy, PolicyConfig};
    ///
    /// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_ip"
    ///     match = { remote_address = "any" }
    ///     key = ["remote_address"]
    ///     limit = 1
    ///     period = "1m"
    ///     capacity = 1024
    /// "#)?)?);
    /// // Traces for peers on the operators' network only.
    /// let ops: ipnet::IpNet = "10.9.0.0/16".parse()?;
    /// let edge = PolicyEdge::new(policy)
    ///     .client_ip(ClientIp::trusting([]))
    ///     .explain_header(TOLLGATE_EXPLAIN.clone(), move |facts| {
    ///         facts.peer.is_some_and(|peer| ops.contains(&peer))
    ///     });
    /// let headers = HeaderMap::new();
    /// let from = |peer: [u8; 4]| RequestFacts {
    ///     peer: Some(peer.into()),
    ///     method: "GET",
    ///     path: "/",
    ///     headers: &headers,
    /// };
    /// assert!(edge.decide(&from([192, 0, 2, 1]), 1).explain.is_none());
    /// let operator = from([10, 9, 0, 7]);
    /// edge.decide(&operator, 1);
    /// let denied = edge.decide(&operator, 1);
    /// let trace = denied.explain.expect("trusted");
    /// assert!(trace.value.to_str()?.starts_with("denied by per_ip; per_ip: key `10.9.0.7` denied"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn explain_header(
        mut self,
        name: HeaderName,
        trust: impl Fn(&RequestFacts<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.explain = Some(ExplainHeader::new(name, trust));
        self
    }

    /// The explain option, when it is set and trusts `facts`.
    #[inline]
    pub(crate) fn explain_for(&self, facts: &RequestFacts<'_>) -> Option<&ExplainHeader> {
        self.explain.as_ref().filter(|e| (e.trust)(facts))
    }

    /// [`decide`](Self::decide) with the trace: [`Policy::explain_next_at`] decides, and the
    /// verdict is worked out from its answer as from `check_next_at`'s.
    ///
    /// [`Policy::explain_next_at`]: tollgate_policy::Policy::explain_next_at
    pub(crate) fn decide_explained(
        &self,
        facts: &RequestFacts<'_>,
        cost: u64,
        explain: &ExplainHeader,
    ) -> EdgeVerdict {
        self.with_descriptors(facts, |descriptors| {
            let policy = self.policy();
            let now = policy.now();
            let (checked, text) = match policy.explain_next_at(descriptors, now, cost) {
                Ok((decided, next, why)) => (Ok((decided, next)), why.to_string()),
                Err(error) => {
                    let text = refused(&error);
                    (Err(error), text)
                }
            };
            let rule = checked.as_ref().ok().and_then(|(d, _)| d.rule);
            let mut verdict = EdgeVerdict::of_check(checked, cost, &self.fields, |units| {
                policy.peek_rule_at(rule?, descriptors, now, units)?.ok()
            });
            verdict.explain = Some(explain.field(&text));
            verdict
        })
    }

    /// [`admit`](Self::admit) with the trace ([`Policy::admit_explained_at`]).
    ///
    /// [`Policy::admit_explained_at`]: tollgate_policy::Policy::admit_explained_at
    pub(crate) fn admit_explained(
        &self,
        facts: &RequestFacts<'_>,
        cost: u64,
        explain: &ExplainHeader,
    ) -> Admitted {
        self.with_descriptors(facts, |descriptors| {
            let policy = self.policy();
            let now = policy.now();
            let (admitted, text) = match policy.admit_explained_at(descriptors, now, cost) {
                Ok((admission, why)) => (Ok(admission), why.to_string()),
                Err(error) => {
                    let text = refused(&error);
                    (Err(error), text)
                }
            };
            let mut admitted = self.render_admission(admitted, descriptors, now, cost);
            admitted.verdict.explain = Some(explain.field(&text));
            admitted
        })
    }
}
