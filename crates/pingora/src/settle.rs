//! [`PingoraSettle`]: costs known only after the response (LLM tokens, rows, bytes) in Pingora's
//! filters, the way tollgate-http's [`SettleLayer`](tollgate_http::SettleLayer) settles them.
//!
//! * `request_filter` → [`PingoraSettle::request_filter`]: the request reserves its estimate
//!   through the shared [`PolicyEdge::reserve`] (the same decision as a check of the estimate,
//!   atomic over the request's rules). A denial is answered here (the same `429` or `413` as
//!   [`PingoraLimiter`]'s) and never reaches the upstream; an admission
//!   keeps the [`Reservation`] in the [`SettleCtx`].
//! * `response_filter` → [`PingoraSettle::response_filter`]: adds the reserving rule's
//!   `RateLimit-Policy` and `RateLimit` fields. With [`ActualCost::Header`], the response's
//!   header is the actual cost, settled here ([`header_cost`]: a missing, negative or malformed
//!   value settles at what is held, never below). With [`ActualCost::Body`], a fresh
//!   [`CostMeter`] starts counting.
//! * `response_body_filter` → [`PingoraSettle::response_body_filter`]: feeds each chunk to the
//!   meter; at the end of the body, settles at what it counted.
//! * `logging` → [`PingoraSettle::logging`] (Pingora's last phase, run for every request): a
//!   reservation still held (the client or the upstream went away mid-response, an upstream
//!   error) settles at what is held, the estimate: [`Settled::cancelled`]. A context dropped
//!   without `logging` settles the same way (a [`Reservation`] dropped unsettled keeps its units).
//!
//! **No cutting of streams.** Unlike the tower layer's
//! [`cut_when_exhausted`](tollgate_http::SettleLayerBuilder::cut_when_exhausted), this edge does
//! not end a stream when the key's budget runs out mid-response: Pingora 0.9's
//! `response_body_filter` receives `end_of_stream` by value and cannot end the downstream body
//! itself. It can only drop the chunks that follow (the client then waits, on an open response,
//! until the upstream ends) or fail the request (the client sees a truncated body, an error): neither
//! ends a body cleanly, so a stream here runs to its end and its whole count is settled (a key
//! that overran goes into debt and waits it out, within the bound tollgate-policy states).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::HeaderMap;
use http::header::HeaderName;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_http::{
    ActualCost, ClientIp, CostMeter, DescriptorNames, DescriptorSourceError, FieldValues,
    PolicyEdge, RequestFacts, Settled, header_cost,
};
use tollgate_policy::{Policy, Reservation};

use crate::{PingoraLimiter, peer_of};
use tollgate_http::EdgeVerdict;

/// Per-request settle state: keep one in the proxy's `CTX`.
#[derive(Default)]
pub struct SettleCtx {
    /// What the request holds until settled.
    reservation: Option<Reservation>,
    /// The reserving rule's fields, added to the response head.
    fields: Option<FieldValues>,
    /// The body's meter, from the response head on ([`ActualCost::Body`]). In a `Mutex` only
    /// to make the context `Sync`, as Pingora asks of a `CTX` (a meter need not be): it is only
    /// ever reached through `&mut` ([`Mutex::get_mut`], no locking).
    meter: Option<Mutex<Box<dyn CostMeter>>>,
}

impl std::fmt::Debug for SettleCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleCtx")
            .field("held", &self.reservation.as_ref().map(Reservation::held))
            .field("metered", &self.meter.is_some())
            .finish_non_exhaustive()
    }
}

impl SettleCtx {
    /// The units the request holds now (`None`: nothing reserved, or already settled).
    pub fn held(&self) -> Option<u64> {
        self.reservation.as_ref().map(Reservation::held)
    }
}

/// A request's estimate, from its facts.
type EstimateFn = dyn Fn(&RequestFacts<'_>) -> u64 + Send + Sync;
type OnSettled = dyn Fn(&Settled) + Send + Sync;

/// Reserve in `request_filter`, settle from the response (see the [module docs](self)).
///
/// ```
/// use std::sync::Arc;
/// use http::HeaderName;
/// use tollgate_http::{ActualCost, ClientIp};
/// use tollgate_pingora::PingoraSettle;
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
///     [[rules]]
///     name = "tokens_per_tenant"
///     match = { tenant = "any" }
///     key = ["tenant"]
///     limit = 10000
///     period = "1m"
///     capacity = 10000
/// "#)?)?);
/// let settle = PingoraSettle::new(policy, ClientIp::trusting([]))
///     .descriptor_header(HeaderName::from_static("x-tenant"), "tenant")?
///     .estimate(|facts| {
///         facts.headers.get("x-max-tokens")
///             .and_then(|v| v.to_str().ok()?.parse().ok())
///             .unwrap_or(1000)
///     })
///     .actual(ActualCost::Header(HeaderName::from_static("x-usage-tokens")));
/// # let _ = settle;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PingoraSettle<C = MonotonicClock> {
    edge: PolicyEdge<C>,
    estimate: Arc<EstimateFn>,
    actual: ActualCost,
    on_settled: Option<Arc<OnSettled>>,
}

impl<C> std::fmt::Debug for PingoraSettle<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingoraSettle")
            .field("edge", &self.edge)
            .field("actual", &self.actual)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone + 'static> PingoraSettle<C> {
    /// Settle filters over `policy`, finding the client with `client_ip` (trusted proxies).
    /// Defaults: an estimate of 1, the actual cost from response header `x-usage` (as
    /// [`SettleLayer`](tollgate_http::SettleLayer)'s).
    pub fn new(policy: Arc<Policy<C>>, client_ip: ClientIp) -> Self {
        PingoraSettle {
            edge: PolicyEdge::new(policy).client_ip(client_ip),
            estimate: Arc::new(|_| 1),
            actual: ActualCost::Header(HeaderName::from_static("x-usage")),
            on_settled: None,
        }
    }

    /// Also passes request header `header` to the policy as descriptor `descriptor` (a tenant,
    /// an API key); an absent or empty value leaves the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] past 13 headers.
    pub fn descriptor_header(
        mut self,
        header: HeaderName,
        descriptor: &str,
    ) -> Result<Self, DescriptorSourceError> {
        self.edge = self.edge.header(header.as_str(), descriptor)?;
        Ok(self)
    }

    /// Every descriptor name at once (replaces what
    /// [`descriptor_header`](Self::descriptor_header) set).
    pub fn descriptor_names(mut self, names: DescriptorNames) -> Self {
        self.edge = self.edge.names(names);
        self
    }

    /// The estimate reserved for a request (say, its `max_tokens`, from a header).
    pub fn estimate(
        mut self,
        estimate: impl Fn(&RequestFacts<'_>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.estimate = Arc::new(estimate);
        self
    }

    /// Where the actual cost comes from: a response header, or a meter over the body
    /// (tollgate-http's [`ByteMeter`](tollgate_http::ByteMeter),
    /// [`SseMeter`](tollgate_http::SseMeter) or your own [`CostMeter`]).
    pub fn actual(mut self, actual: ActualCost) -> Self {
        self.actual = actual;
        self
    }

    /// The actual cost counted from the body by a fresh `meter()` per response.
    pub fn meter<M: CostMeter>(self, meter: impl Fn() -> M + Send + Sync + 'static) -> Self {
        self.actual(ActualCost::Body(Arc::new(move || Box::new(meter()))))
    }

    /// Called with every settlement (metrics, audit logs, tests). [`Settled::cut`] is always
    /// `false` here (no stream is cut).
    pub fn on_settled(mut self, on_settled: impl Fn(&Settled) + Send + Sync + 'static) -> Self {
        self.on_settled = Some(Arc::new(on_settled));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy<C> {
        self.edge.policy()
    }

    /// Reserves a request from `peer` with this method, path and headers at its estimate: the
    /// verdict, and the reservation when admitted ([`request_filter`](Self::request_filter)
    /// calls it).
    pub fn reserve(
        &self,
        peer: Option<IpAddr>,
        method: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> (EdgeVerdict, Option<Reservation>) {
        let facts = RequestFacts {
            peer,
            method,
            path,
            headers,
        };
        let estimate = (self.estimate)(&facts);
        self.edge.reserve(&facts, estimate)
    }

    /// Call from `ProxyHttp::request_filter`: `Ok(true)` when the request was answered here
    /// (denied, or an estimate no rule can admit), `Ok(false)` to proxy it, holding its
    /// reservation in `ctx`.
    ///
    /// # Errors
    /// Writing the response to the downstream failed.
    pub async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut SettleCtx,
    ) -> pingora_core::Result<bool> {
        let peer = peer_of(session);
        let req = session.req_header();
        let (verdict, reservation) =
            self.reserve(peer, req.method.as_str(), req.uri.path(), &req.headers);
        match reservation {
            Some(reservation) => {
                ctx.reservation = Some(reservation);
                ctx.fields = verdict.fields;
                Ok(false)
            }
            None => {
                let (head, body) = PingoraLimiter::denial_response(&verdict)?;
                session.set_keepalive(None);
                session.write_response_header(Box::new(head), false).await?;
                session.write_response_body(Some(body), true).await?;
                Ok(true)
            }
        }
    }

    /// Call from `ProxyHttp::response_filter`: adds the fields; settles from the header, or
    /// starts the body's meter.
    ///
    /// # Errors
    /// Pingora's, when a header cannot be added.
    pub fn response_filter(
        &self,
        upstream_response: &mut ResponseHeader,
        ctx: &mut SettleCtx,
    ) -> pingora_core::Result<()> {
        // No explain header here: the settle path does not offer one (see PingoraLimiter).
        PingoraLimiter::add_fields(ctx.fields.take().as_ref(), None, upstream_response)?;
        match &self.actual {
            ActualCost::Header(name) => {
                if let Some(reservation) = ctx.reservation.take() {
                    let actual =
                        header_cost(&upstream_response.headers, name).unwrap_or(reservation.held());
                    self.settle(reservation, actual, false);
                }
            }
            ActualCost::Body(meter) => {
                if ctx.reservation.is_some() {
                    ctx.meter = Some(Mutex::new(meter()));
                }
            }
        }
        Ok(())
    }

    /// Call from `ProxyHttp::response_body_filter`: counts the chunk; at the end of the body,
    /// settles at the count (the meter's [`finish`](CostMeter::finish), else what is held).
    /// Never changes the body.
    pub fn response_body_filter(
        &self,
        body: Option<&Bytes>,
        end_of_stream: bool,
        ctx: &mut SettleCtx,
    ) {
        let Some(meter) = ctx.meter.as_mut() else {
            return;
        };
        // Never poisoned (never locked); taken as is if it were.
        let meter = meter.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(chunk) = body {
            meter.feed(chunk);
        }
        if end_of_stream {
            let actual = meter.finish();
            ctx.meter = None;
            if let Some(reservation) = ctx.reservation.take() {
                let actual = actual.unwrap_or(reservation.held());
                self.settle(reservation, actual, false);
            }
        }
    }

    /// Call from `ProxyHttp::logging`: a reservation still held (the response ended early, or
    /// failed) settles at what is held.
    pub fn logging(&self, ctx: &mut SettleCtx) {
        ctx.meter = None;
        if let Some(reservation) = ctx.reservation.take() {
            let held = reservation.held();
            self.settle(reservation, held, true);
        }
    }

    fn settle(&self, reservation: Reservation, actual: u64, cancelled: bool) {
        let settlement = self.edge.policy().settle(reservation, actual);
        if let Some(on_settled) = &self.on_settled {
            on_settled(&Settled {
                settlement,
                cut: false,
                cancelled,
            });
        }
    }
}
