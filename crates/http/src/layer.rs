//! The one tower layer, generic over a [`Decide`]r: builder ([`GateBuilder`]), service ([`Gate`])
//! and future ([`ResponseFuture`]) exist once, and each decider only turns a request into a
//! [`Verdict`] that the service renders (the deciders' side is in `decide.rs`). The deciders: one
//! keyed limiter per route ([`KeyedDecider`](crate::KeyedDecider), behind
//! [`RateLimitLayer`](crate::RateLimitLayer)), an asynchronous keyed limiter
//! ([`AsyncKeyedDecider`](crate::AsyncKeyedDecider), behind
//! [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer)) and a whole policy
//! ([`PolicyEdge`](crate::PolicyEdge), behind `PolicyLayer`, feature `policy`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::cost::{RequestCost, UnitCost};
use crate::decide::{Decide, Decided, Pending, ResponseSettings, Verdict};
use crate::headers::HeaderMode;
use crate::key::RequestHead;
use crate::response::{Fields, json_response, too_many_requests};

struct Config<D, Cf> {
    decider: D,
    cost: Cf,
    answer: ResponseSettings,
}

/// The tower [`Layer`] over a decider `D`; [`RateLimitLayer`](crate::RateLimitLayer),
/// [`AsyncRateLimitLayer`](crate::AsyncRateLimitLayer) and `PolicyLayer` are its names for the
/// crate's deciders. Cheap to clone (one `Arc`).
pub struct GateLayer<D, Cf = UnitCost> {
    config: Arc<Config<D, Cf>>,
}

impl<D, Cf> Clone for GateLayer<D, Cf> {
    fn clone(&self) -> Self {
        GateLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<D, Cf> fmt::Debug for GateLayer<D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateLayer")
            .field("headers", &self.config.answer.mode)
            .finish_non_exhaustive()
    }
}

/// Builds a [`GateLayer`]: the settings every decider shares here, the decider's own on its
/// builder names ([`RateLimitLayerBuilder`](crate::RateLimitLayerBuilder), ...).
pub struct GateBuilder<D, Cf = UnitCost> {
    config: Config<D, Cf>,
}

impl<D, Cf> fmt::Debug for GateBuilder<D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder").finish_non_exhaustive()
    }
}

impl<D> GateBuilder<D> {
    /// A builder over `decider`, with the defaults: unit cost, [`HeaderMode::default`], 413.
    pub(crate) fn new(decider: D) -> Self {
        GateBuilder {
            config: Config {
                decider,
                cost: UnitCost,
                answer: ResponseSettings {
                    mode: HeaderMode::default(),
                    cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
                },
            },
        }
    }
}

impl<D, Cf> GateBuilder<D, Cf> {
    pub(crate) fn decider_mut(&mut self) -> &mut D {
        &mut self.config.decider
    }

    /// Which fields responses carry (default: IETF `RateLimit`/`RateLimit-Policy` on every response).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.config.answer.mode = mode;
        self
    }

    /// The status for a request whose cost exceeds what the quota (an enforcing rule) can ever
    /// admit (default 413).
    pub fn cost_error_status(mut self, status: StatusCode) -> Self {
        self.config.answer.cost_error_status = status;
        self
    }

    /// A per-request cost (default: 1 per request).
    ///
    /// ```
    /// # use tollgate_core::{GcraLimiter, Quota};
    /// # use tollgate_http::{GlobalKey, RateLimitLayer, RequestHead};
    /// // Batch endpoints pay per item: `?n=10` costs 10.
    /// let layer = RateLimitLayer::builder(GlobalKey)
    ///     .policy("batch", GcraLimiter::new(Quota::per_second(100)?)?)?
    ///     .cost(|req: &RequestHead<'_>| {
    ///         req.uri.query()
    ///             .and_then(|q| q.strip_prefix("n="))
    ///             .and_then(|n| n.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost<Cf2: RequestCost>(self, cost: Cf2) -> GateBuilder<D, Cf2> {
        let Config {
            decider, answer, ..
        } = self.config;
        GateBuilder {
            config: Config {
                decider,
                cost,
                answer,
            },
        }
    }

    /// The layer.
    pub fn build(self) -> GateLayer<D, Cf> {
        GateLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, D, Cf> Layer<S> for GateLayer<D, Cf> {
    type Service = Gate<S, D, Cf>;

    fn layer(&self, inner: S) -> Self::Service {
        Gate {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service a [`GateLayer`] wraps around an inner service.
pub struct Gate<S, D, Cf = UnitCost> {
    inner: S,
    config: Arc<Config<D, Cf>>,
}

impl<S: Clone, D, Cf> Clone for Gate<S, D, Cf> {
    fn clone(&self) -> Self {
        Gate {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, D, Cf> fmt::Debug for Gate<S, D, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, D, Cf, ReqB, ResB> Service<Request<ReqB>> for Gate<S, D, Cf>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    D: Decide,
    D::Later: Pending<S, ReqB>,
    Cf: RequestCost,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, D::Later>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        let answer = config.answer;
        let decided = config
            .decider
            .decide(&RequestHead::of(&request), &config.cost, answer);
        let state = match decided {
            // The readied instance is called here, synchronously: nothing needs to own it.
            Decided::Now(verdict) => render(&mut self.inner, request, verdict, answer.mode),
            Decided::Later(later) => State::Later {
                held: Some(later.hold(&mut self.inner, request)),
                later,
                mode: answer.mode,
            },
        };
        ResponseFuture { state }
    }
}

/// The state `verdict` leads to: the inner call, or the layer's own response.
fn render<S, ReqB, L>(
    inner: &mut S,
    request: Request<ReqB>,
    verdict: Verdict,
    mode: HeaderMode,
) -> State<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    let response = match verdict {
        Verdict::Pass => None,
        Verdict::Forward(fields) => fields,
        Verdict::Deny {
            retry_after,
            fields,
        } => return State::ready(too_many_requests(mode, retry_after, fields)),
        Verdict::Refuse { status, body } => {
            return State::ready(json_response(status, Bytes::from_static(body)));
        }
    };
    State::Inner {
        future: inner.call(request),
        fields: response,
    }
}

pin_project! {
    /// The future [`Gate`] returns: the inner call's, a response decided at once, or a decision
    /// under way (`L`, [`Decide::Later`]) followed by one of those.
    pub struct ResponseFuture<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
        L: Pending<S, ReqB>,
    {
        #[pin]
        state: State<S, ReqB, L>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
        L: Pending<S, ReqB>,
    {
        Inner {
            #[pin]
            future: S::Future,
            fields: Option<Fields>,
        },
        Later {
            #[pin]
            later: L,
            held: Option<L::Held>,
            mode: HeaderMode,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, L> State<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    fn ready(response: Response<Bytes>) -> Self {
        State::Ready {
            response: Some(response),
        }
    }
}

impl<S, ReqB, L> fmt::Debug for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
    L: Pending<S, ReqB>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB, L> Future for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    L: Pending<S, ReqB>,
{
    type Output = Result<Response<RateLimitBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Inner { future, fields } => {
                    let mut response = std::task::ready!(future.poll(cx))?;
                    if let Some(fields) = fields.take() {
                        fields.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Later { later, held, mode } => {
                    let verdict = std::task::ready!(later.poll_verdict(cx));
                    match held.take() {
                        Some(held) => {
                            let (mut inner, request) = L::release(held);
                            render(&mut inner, request, verdict, *mode)
                        }
                        // Unreachable (the state is left at once); fail as a re-poll does.
                        None => State::Ready { response: None },
                    }
                }
                StateProj::Ready { response } => {
                    let response = response.take().unwrap_or_else(|| {
                        // Polled after completion: a caller's contract breach; an empty 500, no
                        // panic.
                        let mut response = Response::new(Bytes::new());
                        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        response
                    });
                    return Poll::Ready(Ok(response.map(RateLimitBody::full)));
                }
            };
            state.set(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    /// An inner service whose future is ready at once.
    struct Echo;

    impl Service<Request<()>> for Echo {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new(())))
        }
    }

    /// A synchronous decider's response future holds nothing for a later decision: it is no
    /// larger than the keyed layer's own future was before the three layers were folded into
    /// one (the inner call's future and its fields, or a response decided at once).
    #[test]
    fn a_sync_deciders_future_is_no_larger_than_the_keyed_layers_was() {
        #[allow(dead_code)]
        enum Before<F> {
            Inner(F, Option<Fields>),
            Ready(Option<Response<Bytes>>),
        }
        type Sync = ResponseFuture<Echo, (), Infallible>;
        let before = size_of::<Before<<Echo as Service<Request<()>>>::Future>>();
        assert!(
            size_of::<Sync>() <= before,
            "{} > {before}",
            size_of::<Sync>()
        );
    }
}
