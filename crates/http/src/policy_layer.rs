//! [`PolicyLayer`]: the [`GateLayer`] over a [`tollgate_policy::Policy`], several rules per
//! request decided as one. The decider is the transport-free [`PolicyEdge`]; this file only turns
//! its [`EdgeVerdict`](crate::EdgeVerdict) into the layer's [`Verdict`].

use std::sync::Arc;

use http::header::HeaderName;

use tollgate_core::{Clock, MonotonicClock};
use tollgate_policy::Policy;

use crate::cost::{RequestCost, UnitCost};
use crate::decide::{Decide, Decided, LaterVerdict, ResponseSettings, Sealed, Verdict};
use crate::edge::{DescriptorNames, DescriptorSourceError, PolicyEdge, RequestFacts};
use crate::explain::ExplainHeader;
use crate::key::{ClientIp, RequestHead};
use crate::layer::{Gate, GateBuilder, GateLayer};
use crate::response::{COST_BODY, Fields};

impl<C> Sealed for PolicyEdge<C> {}

/// A policy is a decider: its [`EdgeVerdict`](crate::EdgeVerdict) rendered as the layer's
/// [`Verdict`]. Synchronous but for a two-stage rule's delay, held on tokio's timer (the only
/// boxed future, on delayed requests only).
impl<C: Clock + Clone + 'static> Decide for PolicyEdge<C> {
    type Later = LaterVerdict;

    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: ResponseSettings,
    ) -> Decided<LaterVerdict> {
        let cost = cost.cost(head);
        let verdict = PolicyEdge::decide(self, &RequestFacts::of(head), cost);
        rendered(verdict, answer)
    }
}

/// The layer's [`Verdict`] for an [`EdgeVerdict`](crate::EdgeVerdict): every policy decider's one
/// rendering. A two-stage rule's delay is held on tokio's timer (the only boxed future).
pub(crate) fn rendered(
    verdict: crate::EdgeVerdict,
    answer: ResponseSettings,
) -> Decided<LaterVerdict> {
    let mode = answer.mode;
    if verdict.cost_too_large() {
        return Decided::Now(Verdict::Refuse {
            status: answer.cost_error_status,
            body: COST_BODY,
        });
    }
    let fields = verdict
        .fields
        .as_ref()
        .filter(|_| mode.ietf || mode.legacy)
        .map(|values| Fields::of_values(mode, values));
    if !verdict.allowed {
        return Decided::Now(Verdict::Deny {
            retry_after: verdict.retry_after.unwrap_or(1),
            fields: Fields::with_explain(fields, verdict.explain),
        });
    }
    let fields = fields.filter(|_| mode.on_allowed);
    let forward = Verdict::Forward(Fields::with_explain(fields, verdict.explain));
    if verdict.delay.is_zero() {
        return Decided::Now(forward);
    }
    let delay = verdict.delay;
    Decided::Later(Box::pin(async move {
        tokio::time::sleep(delay).await;
        forward
    }))
}

/// A tower [`Layer`](tower_layer::Layer) that decides each request against a [`Policy`]: every applicable rule at once,
/// admitted only if all enforcing rules admit (a denied request consumes nothing in any rule).
///
/// Descriptors come from the request as [`PolicyEdge`] builds them for every HTTP edge: the client
/// address (through [`ClientIp`]'s trusted-proxy logic; descriptor `remote_address` by default), the
/// path (`route`), the method (`method`), and the headers you name (an empty value counts as
/// absent); [`DescriptorNames`] renames them. A rule whose descriptors a request lacks does not limit it (see the policy
/// crate). Responses: as [`RateLimitLayer`](crate::RateLimitLayer): a denial is a `429` with
/// `Retry-After` and `{"error":"rate limit exceeded","retry_after":N}`; `RateLimit-Policy` and
/// `RateLimit` describe the rule that decided, with the quota that applies to this request's key (its
/// override, e.g. a plan tier). A two-stage rule's delay holds the request (on tokio's timer) before
/// it is forwarded. A cost an enforcing rule can never admit gets
/// [`cost_error_status`](PolicyLayerBuilder::cost_error_status) (default 413).
///
/// ```
/// use std::sync::Arc;
/// use tollgate_http::{ClientIp, PolicyLayer};
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     limit = 20
///     period = "1s"
///     capacity = 100000
///
///     [[rules]]
///     name = "per_api_key"
///     match = { api_key = "any" }
///     key = ["api_key"]
///     limit = 100
///     period = "1m"
///     capacity = 10000
/// "#)?)?);
/// let layer = PolicyLayer::builder(Arc::clone(&policy))
///     .client_ip(ClientIp::trusting(["10.0.0.0/8".parse()?]))
///     .header("x-api-key", "api_key")?
///     .build();
/// // axum: Router::new().route(..).layer(layer); reload with `policy.reload(new_config)`.
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type PolicyLayer<C = MonotonicClock, Cf = UnitCost> = GateLayer<PolicyEdge<C>, Cf>;

/// Builds a [`PolicyLayer`].
pub type PolicyLayerBuilder<C = MonotonicClock, Cf = UnitCost> = GateBuilder<PolicyEdge<C>, Cf>;

/// The service [`PolicyLayer`] wraps around an inner service.
pub type PolicyRateLimit<S, C = MonotonicClock, Cf = UnitCost> = Gate<S, PolicyEdge<C>, Cf>;

impl<C: Clock + Clone + 'static> GateLayer<PolicyEdge<C>> {
    /// Starts a layer over `policy` (share the `Arc` to reload it while the layer runs). Default
    /// descriptors: `route` (the path) and `method`; add the client address and headers.
    pub fn builder(policy: Arc<Policy<C>>) -> PolicyLayerBuilder<C> {
        GateBuilder::new(PolicyEdge::new(policy))
    }
}

impl<C: Clock + Clone + 'static, Cf> GateBuilder<PolicyEdge<C>, Cf> {
    /// Adds the decision's trace, as response header `name` (conventionally
    /// [`TOLLGATE_EXPLAIN`](crate::headers::TOLLGATE_EXPLAIN)), to the answers to requests `trust`
    /// accepts, and only to those: see [`PolicyEdge::explain_header`] and the
    /// [explain module](crate::explain). Default: never; off, a decision pays one `None` check.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_http::headers::TOLLGATE_EXPLAIN;
    /// use tollgate_http::{ClientIp, PolicyLayer};
    /// use tollgate_policy::{Policy, PolicyConfig};
    ///
    /// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
    ///     [[rules]]
    ///     name = "per_ip"
    ///     match = { remote_address = "any" }
    ///     key = ["remote_address"]
    ///     limit = 20
    ///     period = "1s"
    ///     capacity = 100000
    /// "#)?)?);
    /// let ops: ipnet::IpNet = "10.9.0.0/16".parse()?;
    /// let layer = PolicyLayer::builder(policy)
    ///     .client_ip(ClientIp::trusting([]))
    ///     // The operators' network sees why; nobody else does, whatever they send.
    ///     .explain_header(TOLLGATE_EXPLAIN.clone(), move |facts| {
    ///         facts.peer.is_some_and(|peer| ops.contains(&peer))
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn explain_header(
        mut self,
        name: HeaderName,
        trust: impl Fn(&RequestFacts<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.decider_mut().explain = Some(ExplainHeader::new(name, trust));
        self
    }
}

/// A policy decider whose descriptors come from request facts ([`PolicyEdge`], and
/// `RedisPolicyEdge` with feature `redis`): the builder methods below serve both.
pub trait EdgeDescriptors: Sealed {
    /// The client address logic and the descriptor names, to change in place.
    #[doc(hidden)]
    fn sources_mut(&mut self) -> (&mut Option<ClientIp>, &mut DescriptorNames);
}

impl<C: Clock + Clone + 'static> EdgeDescriptors for PolicyEdge<C> {
    fn sources_mut(&mut self) -> (&mut Option<ClientIp>, &mut DescriptorNames) {
        self.descriptor_sources()
    }
}

impl<D: Decide + EdgeDescriptors, Cf> GateBuilder<D, Cf> {
    /// The client address, through `client`'s trusted-proxy logic, as descriptor `remote_address`.
    pub fn client_ip(mut self, client: ClientIp) -> Self {
        *self.decider_mut().sources_mut().0 = Some(client);
        self
    }

    /// The client address as descriptor `name`.
    pub fn client_ip_as(self, client: ClientIp, name: &str) -> Self {
        self.client_ip(client)
            .with_names(|names| names.client(Some(name)))
    }

    /// Request header `header` (an API key, a tenant id) as descriptor `name`; absent, empty or
    /// non-text values leave the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid field name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        let names = self.decider_mut().sources_mut().1;
        *names = std::mem::take(names).header(header, name)?;
        Ok(self)
    }

    /// The descriptor name for the path (`route` by default; `None` leaves it out).
    pub fn route_descriptor(self, name: Option<&str>) -> Self {
        self.with_names(|names| names.route(name))
    }

    /// The descriptor name for the method (`method` by default; `None` leaves it out).
    pub fn method_descriptor(self, name: Option<&str>) -> Self {
        self.with_names(|names| names.method(name))
    }

    /// Every descriptor name at once (replaces what the methods above set, headers included).
    pub fn descriptor_names(mut self, names: DescriptorNames) -> Self {
        *self.decider_mut().sources_mut().1 = names;
        self
    }

    fn with_names(mut self, f: impl FnOnce(DescriptorNames) -> DescriptorNames) -> Self {
        let names = self.decider_mut().sources_mut().1;
        *names = f(std::mem::take(names));
        self
    }
}
