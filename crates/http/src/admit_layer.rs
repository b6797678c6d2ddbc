//! [`AdmitLayer`]: a [`Policy`](tollgate_policy::Policy)'s rate *and* concurrency rules at the
//! tower edge. Each request is decided by [`Policy::admit`](tollgate_policy::Policy::admit); the
//! [`Admission`] (its in-flight permits) is held by the response future and then by the response
//! body, so the permits come back when the body is dropped: fully sent, the client gone, the
//! request cancelled before a response, or the handler panicked. The answers are on
//! [`AdmitLayer`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate_core::Clock;
use tollgate_policy::Admission;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::edge::{Admitted, PolicyEdge, RequestFacts};
use crate::headers::{self, HeaderMode};
use crate::key::RequestHead;
use crate::response::{COST_BODY, Fields, json_response, too_many_requests};

/// A tower layer deciding each request (cost 1) with [`PolicyEdge::admit`] and holding its
/// permits until the response body is dropped.
///
/// Answers: a concurrency denial is **`503 Service Unavailable`** with `Retry-After` (the rule's
/// `retry_after`, default 1 s) and `{"error":"too many requests in flight","retry_after":N}`; a
/// rate denial is the usual `429` with `Retry-After` and the `RateLimit` fields; a cost no rule can
/// ever admit is `413`. Why 503 and not 429: 429 says *this client* sent too many requests in a
/// period; an in-flight limit is about the service being busy with requests already admitted, the
/// case RFC 9110 gives 503 with `Retry-After`, and clients and load balancers treat it as "try
/// again shortly" (tollgate-client's retry policy honours `Retry-After` on both).
///
/// ```
/// use std::sync::Arc;
/// use tollgate_http::{AdmitLayer, PolicyEdge};
/// use tollgate_policy::{Policy, PolicyConfig};
///
/// let policy = Arc::new(Policy::new(PolicyConfig::from_toml(r#"
///     [[concurrency]]
///     name = "reports"
///     match = { route = { prefix = "/reports/" } }
///     limit = 8
///     max_hold = "2m"
/// "#)?)?);
/// let layer = AdmitLayer::new(PolicyEdge::new(policy));
/// // axum: Router::new().route(..).layer(layer)
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AdmitLayer<C = tollgate_core::MonotonicClock> {
    edge: Arc<PolicyEdge<C>>,
    mode: HeaderMode,
}

impl<C> Clone for AdmitLayer<C> {
    fn clone(&self) -> Self {
        AdmitLayer {
            edge: Arc::clone(&self.edge),
            mode: self.mode,
        }
    }
}

impl<C> AdmitLayer<C> {
    /// A layer deciding with `edge` (its descriptor sources and names), default header mode.
    pub fn new(edge: PolicyEdge<C>) -> Self {
        AdmitLayer {
            edge: Arc::new(edge),
            mode: HeaderMode::default(),
        }
    }

    /// Which `RateLimit` fields responses carry.
    pub fn header_mode(mut self, mode: HeaderMode) -> Self {
        self.mode = mode;
        self
    }
}

impl<S, C> Layer<S> for AdmitLayer<C> {
    type Service = Admit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Admit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AdmitLayer`] wraps around an inner service.
pub struct Admit<S, C = tollgate_core::MonotonicClock> {
    inner: S,
    layer: AdmitLayer<C>,
}

impl<S: Clone, C> Clone for Admit<S, C> {
    fn clone(&self) -> Self {
        Admit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for Admit<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    C: Clock + Clone + 'static,
{
    type Response = Response<AdmitBody<ResB>>;
    type Error = S::Error;
    type Future = AdmitFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let mode = self.layer.mode;
        let Admitted { verdict, admission } = self
            .layer
            .edge
            .admit(&RequestFacts::of(&RequestHead::of(&request)), 1);
        let fields = verdict
            .fields
            .as_ref()
            .filter(|_| mode.ietf || mode.legacy)
            .map(|values| Fields::of_values(mode, values));
        let explain = verdict.explain;
        let ready = |response: Response<Bytes>| AdmitFuture {
            state: AdmitState::Ready {
                response: Some(response),
            },
        };
        let secs = verdict.retry_after.unwrap_or(1);
        match verdict.status {
            StatusCode::OK => AdmitFuture {
                state: AdmitState::Inner {
                    future: self.inner.call(request),
                    admission,
                    fields: Fields::with_explain(fields.filter(|_| mode.on_allowed), explain),
                },
            },
            StatusCode::SERVICE_UNAVAILABLE => {
                let mut response = busy(secs);
                if let Some(fields) = Fields::with_explain(None, explain) {
                    fields.apply(response.headers_mut());
                }
                ready(response)
            }
            StatusCode::TOO_MANY_REQUESTS => ready(too_many_requests(
                mode,
                secs,
                Fields::with_explain(fields, explain),
            )),
            status => ready(json_response(status, Bytes::from_static(COST_BODY))),
        }
    }
}

/// The 503 of a concurrency denial.
fn busy(secs: u64) -> Response<Bytes> {
    let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, headers::busy_json(secs));
    response
        .headers_mut()
        .insert(RETRY_AFTER, headers::number(secs));
    response
}

pin_project! {
    /// The future [`Admit`] returns: the inner call's (holding the admission), or an answer
    /// decided at once.
    pub struct AdmitFuture<F> {
        #[pin]
        state: AdmitState<F>,
    }
}

pin_project! {
    #[project = AdmitStateProj]
    enum AdmitState<F> {
        Inner {
            #[pin]
            future: F,
            admission: Option<Admission>,
            fields: Option<Fields>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F, ResB, E> Future for AdmitFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<AdmitBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            AdmitStateProj::Inner {
                future,
                admission,
                fields,
            } => {
                let mut response = match future.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // An error drops the admission with this future.
                    Poll::Ready(result) => result?,
                };
                if let Some(fields) = fields.take() {
                    fields.apply(response.headers_mut());
                }
                let admission = admission.take();
                Poll::Ready(Ok(response.map(|body| AdmitBody {
                    body: RateLimitBody::inner(body),
                    _admission: admission,
                })))
            }
            AdmitStateProj::Ready { response } => {
                let response = response
                    .take()
                    .expect("AdmitFuture polled after it completed");
                Poll::Ready(Ok(response.map(|body| AdmitBody {
                    body: RateLimitBody::full(body),
                    _admission: None,
                })))
            }
        }
    }
}

pin_project! {
    /// The response body, holding the request's [`Admission`] (its in-flight permits) until it is
    /// dropped.
    pub struct AdmitBody<B> {
        #[pin]
        body: RateLimitBody<B>,
        _admission: Option<Admission>,
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for AdmitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmitBody")
            .field("body", &self.body)
            .field("holds_permits", &self.holds_permits())
            .finish()
    }
}

impl<B> AdmitBody<B> {
    /// Whether it still holds permits.
    pub fn holds_permits(&self) -> bool {
        self._admission.as_ref().is_some_and(|a| a.permits() > 0)
    }
}

impl<B> Body for AdmitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
