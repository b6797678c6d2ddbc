//! [`SettleLayer`]: a request reserves an estimated cost; the response settles the actual one
//! (LLM tokens, rows, bytes), read from a response header or counted from the body as it streams,
//! optionally cutting a stream at the next event boundary once the key's budget is spent.
//!
//! The decision is [`Policy::reserve`](tollgate_policy::Policy::reserve) (the same engine as a
//! check, atomic over the request's rules); a denial is the same 429 (or 413) as
//! [`PolicyLayer`](crate::PolicyLayer)'s, rendered from the same [`EdgeVerdict`](crate::EdgeVerdict) ([`PolicyEdge::reserve`]). Then:
//!
//! * [`ActualCost::Header`]: the response's header (e.g. `x-usage-tokens`) is the actual cost,
//!   settled when the response head arrives. A missing, negative or malformed value settles at the
//!   estimate (the units stay taken: never an over-admission for a bad upstream).
//! * [`ActualCost::Body`]: a [`CostMeter`] counts the body as it streams ([`ByteMeter`], or
//!   [`SseMeter`] for server-sent events: one unit per event, or the tokens each event reports),
//!   settled when the body ends. With [`SettleLayerBuilder::cut_when_exhausted`], each time the
//!   running count passes what is held at an event boundary, the difference is taken from the
//!   key's rules as a decision ([`Reservation::extend_at`]); when they refuse, the body ends
//!   there, cleanly, after the event that spent the budget.
//! * A response body dropped before its end (a client gone, a cancelled request) settles at what
//!   is held (the estimate): [`Settled::cancelled`].
//!
//! Not held here: a two-stage rule's delay (a reservation forwards at once; use rules without
//! `delay` for cost budgets).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderName;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_policy::{Reservation, Settlement};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::edge::{PolicyEdge, RequestFacts};
use crate::headers::HeaderMode;
use crate::key::RequestHead;
use crate::response::{COST_BODY, Fields, json_response, too_many_requests};

/// Counts a response body's cost as it streams.
pub trait CostMeter: Send + 'static {
    /// Takes the next chunk of the body.
    fn feed(&mut self, chunk: &[u8]);
    /// The cost counted so far.
    fn so_far(&self) -> u64;
    /// Whether the bytes fed so far end at an event boundary (where a stream may be cut).
    fn at_boundary(&self) -> bool {
        true
    }
    /// The actual cost once the body has ended (`None`: unknown, settle at the estimate).
    fn finish(&mut self) -> Option<u64> {
        Some(self.so_far())
    }
}

/// Counts bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteMeter(u64);

impl CostMeter for ByteMeter {
    fn feed(&mut self, chunk: &[u8]) {
        self.0 = self.0.saturating_add(chunk.len() as u64);
    }
    fn so_far(&self) -> u64 {
        self.0
    }
}

/// What one server-sent event says about the cost, for [`SseMeter::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// Nothing.
    None,
    /// This event cost this many units (tokens streamed so far add up).
    Add(u64),
    /// The whole response's cost, as the upstream reports it (a final usage event): the actual
    /// cost when the stream ends.
    Total(u64),
}

/// Counts server-sent events (`text/event-stream`): each complete event (ended by a blank line)
/// passes its `data` (the `data:` lines joined by `\n`) to a closure saying what it cost.
pub struct SseMeter<F> {
    pending: Vec<u8>,
    added: u64,
    total: Option<u64>,
    usage: F,
}

impl<F> fmt::Debug for SseMeter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseMeter")
            .field("added", &self.added)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl SseMeter<fn(&str) -> Usage> {
    /// One unit per event.
    pub fn events() -> Self {
        SseMeter::new(|_| Usage::Add(1))
    }
}

impl<F: FnMut(&str) -> Usage + Send + 'static> SseMeter<F> {
    /// Each event's data through `usage`.
    pub fn new(usage: F) -> Self {
        SseMeter {
            pending: Vec::new(),
            added: 0,
            total: None,
            usage,
        }
    }

    fn event(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let data: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return;
        }
        match (self.usage)(&data.join("\n")) {
            Usage::None => {}
            Usage::Add(n) => self.added = self.added.saturating_add(n),
            Usage::Total(n) => self.total = Some(n),
        }
    }
}

impl<F: FnMut(&str) -> Usage + Send + 'static> CostMeter for SseMeter<F> {
    fn feed(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
        // Events end at a blank line ("\n\n"; "\r\n\r\n" normalised by looking for "\n\n" after
        // dropping '\r').
        self.pending.retain(|&b| b != b'\r');
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = self.pending.drain(..end + 2).collect();
            self.event(&raw);
        }
    }
    fn so_far(&self) -> u64 {
        self.added.max(self.total.unwrap_or(0))
    }
    fn at_boundary(&self) -> bool {
        self.pending.is_empty()
    }
    fn finish(&mut self) -> Option<u64> {
        Some(self.total.unwrap_or(self.added))
    }
}

/// Where the actual cost comes from.
#[derive(Clone)]
pub enum ActualCost {
    /// A response header holding a non-negative integer.
    Header(HeaderName),
    /// A meter over the body, a fresh one per response.
    Body(Arc<dyn Fn() -> Box<dyn CostMeter> + Send + Sync>),
}

impl fmt::Debug for ActualCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActualCost::Header(name) => f.debug_tuple("Header").field(name).finish(),
            ActualCost::Body(_) => f.write_str("Body(..)"),
        }
    }
}

/// The cost in response header `name`: a non-negative integer (surrounding blanks allowed);
/// `None` when absent, negative or malformed (an edge then settles at what is held, never below).
///
/// ```
/// use http::{HeaderMap, HeaderName, HeaderValue};
/// let name = HeaderName::from_static("x-usage-tokens");
/// let mut headers = HeaderMap::new();
/// assert_eq!(tollgate_http::header_cost(&headers, &name), None);
/// headers.insert(&name, HeaderValue::from_static(" 312 "));
/// assert_eq!(tollgate_http::header_cost(&headers, &name), Some(312));
/// headers.insert(&name, HeaderValue::from_static("-5"));
/// assert_eq!(tollgate_http::header_cost(&headers, &name), None);
/// ```
pub fn header_cost(headers: &http::HeaderMap, name: &HeaderName) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// One settled request, for [`SettleLayerBuilder::on_settled`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// What the policy settled.
    pub settlement: Settlement,
    /// Whether the stream was cut because the key's budget was spent.
    pub cut: bool,
    /// Whether the body was dropped before its end (settled at what was held).
    pub cancelled: bool,
}

type Estimate = dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync;
type OnSettled = dyn Fn(&Settled) + Send + Sync;

/// What the body needs to settle, without the clock type.
trait Settler: Send + Sync {
    fn settle(&self, reservation: Reservation, actual: u64, cut: bool, cancelled: bool);
    fn extend(&self, reservation: &mut Reservation, more: u64) -> bool;
}

struct Config<C> {
    edge: PolicyEdge<C>,
    estimate: Box<Estimate>,
    actual: ActualCost,
    cut: bool,
    mode: HeaderMode,
    on_settled: Option<Box<OnSettled>>,
}

impl<C: Clock + Clone + Send + Sync + 'static> Settler for Config<C> {
    fn settle(&self, reservation: Reservation, actual: u64, cut: bool, cancelled: bool) {
        let settlement = self.edge.policy().settle(reservation, actual);
        if let Some(on_settled) = &self.on_settled {
            on_settled(&Settled {
                settlement,
                cut,
                cancelled,
            });
        }
    }

    fn extend(&self, reservation: &mut Reservation, more: u64) -> bool {
        let now = self.edge.policy().now();
        reservation.extend_at(now, more).unwrap_or(false)
    }
}

/// A tower layer that reserves an estimate per request and settles the actual cost from the
/// response: from a response header ([`ActualCost::Header`]; missing, negative or malformed
/// settles at the estimate), or from a [`CostMeter`] over the body ([`ActualCost::Body`]),
/// optionally cutting a stream at the next event boundary once the key's budget is spent
/// ([`SettleLayerBuilder::cut_when_exhausted`]). A body dropped before its end settles at what is
/// held ([`Settled::cancelled`]). The worked example and the bound are in the repository's
/// `guides/settle.md`.
///
/// ```
/// use std::sync::Arc;
/// use http::HeaderName;
/// use tollgate_http::{ActualCost, DescriptorNames, PolicyEdge, SettleLayer};
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
/// let edge = PolicyEdge::new(policy)
///     .names(DescriptorNames::default().route(None).method(None).header("x-tenant", "tenant")?);
/// let layer = SettleLayer::builder(edge)
///     .estimate(|_| 500)
///     .actual(ActualCost::Header(HeaderName::from_static("x-usage-tokens")))
///     .build();
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SettleLayer<C = MonotonicClock> {
    config: Arc<Config<C>>,
}

impl<C> Clone for SettleLayer<C> {
    fn clone(&self) -> Self {
        SettleLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<C> fmt::Debug for SettleLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleLayer")
            .field("actual", &self.config.actual)
            .field("cut", &self.config.cut)
            .finish_non_exhaustive()
    }
}

/// Builds a [`SettleLayer`].
pub struct SettleLayerBuilder<C> {
    config: Config<C>,
}

impl<C> fmt::Debug for SettleLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleLayerBuilder")
            .field("actual", &self.config.actual)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> SettleLayer<C> {
    /// Starts a layer over `edge` (its policy and descriptor names). Defaults: an estimate of 1,
    /// the actual cost from header `x-usage`, no cutting.
    pub fn builder(edge: PolicyEdge<C>) -> SettleLayerBuilder<C> {
        SettleLayerBuilder {
            config: Config {
                edge,
                estimate: Box::new(|_| 1),
                actual: ActualCost::Header(HeaderName::from_static("x-usage")),
                cut: false,
                mode: HeaderMode::default(),
                on_settled: None,
            },
        }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> SettleLayerBuilder<C> {
    /// The estimate reserved for a request (say, its `max_tokens`).
    pub fn estimate(
        mut self,
        estimate: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.config.estimate = Box::new(estimate);
        self
    }

    /// Where the actual cost comes from.
    pub fn actual(mut self, actual: ActualCost) -> Self {
        self.config.actual = actual;
        self
    }

    /// The actual cost counted from the body by a fresh `meter()` per response.
    pub fn meter<M: CostMeter>(self, meter: impl Fn() -> M + Send + Sync + 'static) -> Self {
        self.actual(ActualCost::Body(Arc::new(move || Box::new(meter()))))
    }

    /// With a body meter: end the body at the first event boundary where the key's rules refuse
    /// what the count has grown past the reservation.
    pub fn cut_when_exhausted(mut self, cut: bool) -> Self {
        self.config.cut = cut;
        self
    }

    /// Which rate-limit header fields responses carry.
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.config.mode = mode;
        self
    }

    /// Called with every settlement (metrics, audit logs, tests).
    pub fn on_settled(mut self, on_settled: impl Fn(&Settled) + Send + Sync + 'static) -> Self {
        self.config.on_settled = Some(Box::new(on_settled));
        self
    }

    /// The layer.
    pub fn build(self) -> SettleLayer<C> {
        SettleLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, C> Layer<S> for SettleLayer<C> {
    type Service = SettleService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        SettleService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`SettleLayer`] wraps around an inner service.
pub struct SettleService<S, C = MonotonicClock> {
    inner: S,
    config: Arc<Config<C>>,
}

impl<S: Clone, C> Clone for SettleService<S, C> {
    fn clone(&self) -> Self {
        SettleService {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, C> fmt::Debug for SettleService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleService").finish_non_exhaustive()
    }
}

/// The response future of [`SettleService`] (boxed: one allocation per admitted request).
pub type SettleFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<SettleBody<B>>, E>> + Send>>;

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for SettleService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: Send + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    type Response = Response<SettleBody<ResB>>;
    type Error = S::Error;
    type Future = SettleFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let head = RequestHead::of(&request);
        let estimate = (config.estimate)(&head);
        let (verdict, reservation) = config.edge.reserve(&RequestFacts::of(&head), estimate);
        let mode = config.mode;
        let fields = verdict
            .fields
            .as_ref()
            .filter(|_| mode.ietf || mode.legacy)
            .map(|values| Fields::of_values(mode, values));
        let Some(reservation) = reservation else {
            let refused = if verdict.cost_too_large() {
                json_response(StatusCode::PAYLOAD_TOO_LARGE, Bytes::from_static(COST_BODY))
            } else {
                too_many_requests(mode, verdict.retry_after.unwrap_or(1), fields)
            };
            let refused = refused.map(|body| SettleBody::done(RateLimitBody::full(body)));
            return Box::pin(std::future::ready(Ok(refused)));
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            if let Some(fields) = fields.filter(|_| mode.on_allowed) {
                fields.apply(response.headers_mut());
            }
            let settler: Arc<dyn Settler> = config.clone();
            let meter = match &config.actual {
                ActualCost::Header(name) => {
                    let actual =
                        header_cost(response.headers(), name).unwrap_or(reservation.held());
                    settler.settle(reservation, actual, false, false);
                    return Ok(response.map(|body| SettleBody::done(RateLimitBody::inner(body))));
                }
                ActualCost::Body(meter) => meter(),
            };
            Ok(response.map(|body| SettleBody {
                inner: RateLimitBody::inner(body),
                metered: Some(Metered {
                    meter,
                    reservation: Some(reservation),
                    settler,
                    cut: config.cut,
                }),
                ended: false,
            }))
        })
    }
}

/// The body's settlement state.
struct Metered {
    meter: Box<dyn CostMeter>,
    reservation: Option<Reservation>,
    settler: Arc<dyn Settler>,
    cut: bool,
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            // Ended early: settle at what is held (the estimate), explicitly.
            let held = reservation.held();
            self.settler.settle(reservation, held, false, true);
        }
    }
}

pin_project! {
    /// The response body of a [`SettleService`]: the inner one, metered when the actual cost comes
    /// from the body, and ended early when a cut is due.
    pub struct SettleBody<B> {
        #[pin]
        inner: RateLimitBody<B>,
        metered: Option<Metered>,
        ended: bool,
    }
}

impl<B> fmt::Debug for SettleBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleBody")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<B> SettleBody<B> {
    fn done(inner: RateLimitBody<B>) -> Self {
        SettleBody {
            inner,
            metered: None,
            ended: false,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for SettleBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let polled = this.inner.poll_frame(cx);
        let Some(metered) = this.metered.as_mut() else {
            return polled;
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    metered.meter.feed(data);
                }
                if metered.cut && metered.meter.at_boundary() {
                    let running = metered.meter.so_far();
                    if let Some(reservation) = metered.reservation.as_mut() {
                        let held = reservation.held();
                        if running > held && !metered.settler.extend(reservation, running - held) {
                            // The key's budget is spent: this frame is the last.
                            if let Some(reservation) = metered.reservation.take() {
                                metered.settler.settle(reservation, running, true, false);
                            }
                            *this.ended = true;
                        }
                    }
                }
            }
            Poll::Ready(None) => {
                if let Some(reservation) = metered.reservation.take() {
                    let actual = metered.meter.finish().unwrap_or(reservation.held());
                    metered.settler.settle(reservation, actual, false, false);
                }
            }
            // An error ends the body: the drop settles at what is held.
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.metered.as_ref().is_some_and(|m| m.cut) {
            // A cut may end it early.
            let mut hint = SizeHint::new();
            if let Some(upper) = self.inner.size_hint().upper() {
                hint.set_upper(upper);
            }
            hint
        } else {
            self.inner.size_hint()
        }
    }
}
