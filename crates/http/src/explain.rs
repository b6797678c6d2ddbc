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
//!
//! [`PolicyEdge`]: crate::PolicyEdge
//! [`PolicyEdge::explain_header`]: crate::PolicyEdge::explain_header

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use tollgate_policy::PolicyError;

use crate::facts::RequestFacts;
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

    /// Whether `facts` come from a caller the operator trusts with the trace.
    #[inline]
    pub(crate) fn trusts(&self, facts: &RequestFacts<'_>) -> bool {
        (self.trust)(facts)
    }

    /// The header for `text` (an explanation's one-line text).
    pub(crate) fn field(&self, text: &str) -> Box<ExplainField> {
        Box::new(ExplainField {
            name: self.name.clone(),
            value: explain_value(text),
        })
    }
}

/// The one-line text of a request that could not be decided.
pub(crate) fn refused(error: &PolicyError) -> String {
    format!("refused: {error}")
}
