//! [`RedisPolicyLayer`]: the [`GateLayer`] over a [`RedisPolicy`] (features `policy` and `redis`):
//! the same rules, descriptors, answers and fields as [`PolicyLayer`](crate::PolicyLayer), with
//! every rule's state in a shared Redis, so every replica behind a load balancer shares each
//! rule's quota. The decision is awaited before the inner service is called.

use std::fmt;
use std::sync::Arc;

use tollgate_policy::RedisPolicy;

use crate::PolicyFields;
use crate::cost::{RequestCost, UnitCost};
use crate::decide::{Decide, Decided, LaterVerdict, ResponseSettings, Sealed};
use crate::edge::{
    DescriptorNames, DescriptorSourceError, EdgeVerdict, RequestFacts, with_descriptors,
};
use crate::key::{ClientIp, RequestHead};
use crate::layer::{GateBuilder, GateLayer};
use crate::policy_layer::{EdgeDescriptors, rendered};

/// The transport-free edge over a [`RedisPolicy`]: request facts to descriptors (as
/// [`PolicyEdge`](crate::PolicyEdge) builds them), the policy's decision on Redis, one
/// [`EdgeVerdict`]. A denial of more than one unit gets the conservative `RateLimit` values (a
/// look at the rule would cost a round trip).
pub struct RedisPolicyEdge {
    policy: Arc<RedisPolicy>,
    client_ip: Option<ClientIp>,
    names: DescriptorNames,
    fields: Arc<PolicyFields>,
}

impl fmt::Debug for RedisPolicyEdge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPolicyEdge")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl RedisPolicyEdge {
    /// An edge over `policy` (share the `Arc` to reload it), with the default descriptor names.
    pub fn new(policy: Arc<RedisPolicy>) -> Self {
        RedisPolicyEdge {
            policy,
            client_ip: None,
            names: DescriptorNames::default(),
            fields: Arc::new(PolicyFields::new()),
        }
    }

    /// The client address, through `client`'s trusted-proxy logic, as the client descriptor.
    pub fn client_ip(mut self, client: ClientIp) -> Self {
        self.client_ip = Some(client);
        self
    }

    /// Also passes request header `header` to the policy as descriptor `name`
    /// ([`DescriptorNames::header`]): an absent, empty or non-text value leaves it out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid header name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        self.names = std::mem::take(&mut self.names).header(header, name)?;
        Ok(self)
    }

    /// Decides `facts` for `cost` units on Redis.
    pub async fn decide(&self, facts: &RequestFacts<'_>, cost: u64) -> EdgeVerdict {
        let owned = self.descriptors(facts);
        decide_owned(&self.policy, &self.fields, &owned, cost).await
    }

    /// The descriptors of `facts`, owned (they outlive the request head across the round trip).
    fn descriptors(&self, facts: &RequestFacts<'_>) -> Vec<(String, String)> {
        with_descriptors(&self.names, self.client_ip.as_ref(), facts, |d| {
            d.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        })
    }
}

async fn decide_owned(
    policy: &RedisPolicy,
    fields: &PolicyFields,
    owned: &[(String, String)],
    cost: u64,
) -> EdgeVerdict {
    let descriptors: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (&**k, &**v)).collect();
    let checked = policy.check(&descriptors, cost).await;
    EdgeVerdict::of_check(checked, cost, fields, |_| None)
}

impl Sealed for RedisPolicyEdge {}

impl EdgeDescriptors for RedisPolicyEdge {
    fn sources_mut(&mut self) -> (&mut Option<ClientIp>, &mut DescriptorNames) {
        (&mut self.client_ip, &mut self.names)
    }
}

/// A Redis policy is a decider whose answer is always later: one boxed future per request (the
/// round trip), then the same rendering as [`PolicyLayer`](crate::PolicyLayer)'s.
impl Decide for RedisPolicyEdge {
    type Later = LaterVerdict;

    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: ResponseSettings,
    ) -> Decided<LaterVerdict> {
        let cost = cost.cost(head);
        let owned = self.descriptors(&RequestFacts::of(head));
        let (policy, fields) = (Arc::clone(&self.policy), Arc::clone(&self.fields));
        Decided::Later(Box::pin(async move {
            let verdict = decide_owned(&policy, &fields, &owned, cost).await;
            match rendered(verdict, answer) {
                Decided::Now(verdict) => verdict,
                Decided::Later(held) => held.await,
            }
        }))
    }
}

/// A tower layer over a [`RedisPolicy`]: [`PolicyLayer`](crate::PolicyLayer)'s descriptors,
/// responses and fields, decided on Redis.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tollgate_http::{ClientIp, RedisPolicyLayer};
/// use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
///
/// let config = PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "per_ip"
///     match = { remote_address = "any" }
///     key = ["remote_address"]
///     limit = 20
///     period = "1s"
/// "#)?;
/// let conn = tollgate_redis::connect("redis://127.0.0.1/", &Default::default())?;
/// let policy = Arc::new(RedisPolicy::new(config, conn, RedisSettings::default())?);
/// let layer = RedisPolicyLayer::builder(policy).client_ip(ClientIp::trusting([])).build();
/// # let _ = layer; Ok(()) }
/// ```
pub type RedisPolicyLayer<Cf = UnitCost> = GateLayer<RedisPolicyEdge, Cf>;

impl GateLayer<RedisPolicyEdge> {
    /// Starts a layer over `policy`. Default descriptors: `route` (the path) and `method`; add the
    /// client address and headers.
    pub fn builder(policy: Arc<RedisPolicy>) -> GateBuilder<RedisPolicyEdge> {
        GateBuilder::new(RedisPolicyEdge::new(policy))
    }
}
