//! [`PolicyLayer`]: the tower layer over a [`tollgate_policy::Policy`], several rules per request
//! decided as one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_policy::Policy;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::edge::{DescriptorNames, DescriptorSourceError, PolicyEdge, RequestFacts};
use crate::headers::HeaderMode;
use crate::key::{ClientIp, RequestHead};
use crate::layer::{Fields, RequestCost, UnitCost, json_response, too_many_requests};

const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;

struct Config<C, Cf> {
    /// Descriptors, decision and field values: the transport-free edge this layer renders.
    edge: PolicyEdge<C>,
    cost: Cf,
    mode: HeaderMode,
    cost_error_status: StatusCode,
}

/// A tower [`Layer`] that decides each request against a [`Policy`]: every applicable rule at once,
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
pub struct PolicyLayer<C = MonotonicClock, Cf = UnitCost> {
    config: Arc<Config<C, Cf>>,
}

impl<C, Cf> Clone for PolicyLayer<C, Cf> {
    fn clone(&self) -> Self {
        PolicyLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<C, Cf> fmt::Debug for PolicyLayer<C, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyLayer")
            .field("headers", &self.config.mode)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone + 'static> PolicyLayer<C> {
    /// Starts a layer over `policy` (share the `Arc` to reload it while the layer runs). Default
    /// descriptors: `route` (the path) and `method`; add the client address and headers.
    pub fn builder(policy: Arc<Policy<C>>) -> PolicyLayerBuilder<C> {
        PolicyLayerBuilder {
            config: Config {
                edge: PolicyEdge::new(policy),
                cost: UnitCost,
                mode: HeaderMode::default(),
                cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
            },
        }
    }
}

/// Builds a [`PolicyLayer`].
pub struct PolicyLayerBuilder<C = MonotonicClock, Cf = UnitCost> {
    config: Config<C, Cf>,
}

impl<C, Cf> fmt::Debug for PolicyLayerBuilder<C, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyLayerBuilder").finish_non_exhaustive()
    }
}

impl<C: Clock + Clone + 'static, Cf> PolicyLayerBuilder<C, Cf> {
    /// The client address, through `client`'s trusted-proxy logic, as descriptor `remote_address`.
    pub fn client_ip(mut self, client: ClientIp) -> Self {
        self.config.edge = self.config.edge.client_ip(client);
        self
    }

    /// The client address as descriptor `name`.
    pub fn client_ip_as(mut self, client: ClientIp, name: &str) -> Self {
        self.config.edge = self.config.edge.client_ip(client);
        let names = self.config.edge.names_mut();
        *names = std::mem::take(names).client(Some(name));
        self
    }

    /// Request header `header` (an API key, a tenant id) as descriptor `name`; absent, empty or
    /// non-text values leave the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid field name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        let names = self.config.edge.names_mut();
        *names = std::mem::take(names).header(header, name)?;
        Ok(self)
    }

    /// The descriptor name for the path (`route` by default; `None` leaves it out).
    pub fn route_descriptor(mut self, name: Option<&str>) -> Self {
        let names = self.config.edge.names_mut();
        *names = std::mem::take(names).route(name);
        self
    }

    /// The descriptor name for the method (`method` by default; `None` leaves it out).
    pub fn method_descriptor(mut self, name: Option<&str>) -> Self {
        let names = self.config.edge.names_mut();
        *names = std::mem::take(names).method(name);
        self
    }

    /// Every descriptor name at once (replaces what the methods above set, headers included).
    pub fn descriptor_names(mut self, names: DescriptorNames) -> Self {
        self.config.edge = self.config.edge.names(names);
        self
    }

    /// Which fields responses carry (default: IETF `RateLimit`/`RateLimit-Policy` on every response).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.config.mode = mode;
        self
    }

    /// The status for a request whose cost an enforcing rule can never admit (default 413).
    pub fn cost_error_status(mut self, status: StatusCode) -> Self {
        self.config.cost_error_status = status;
        self
    }

    /// A per-request cost (default: 1 per request).
    pub fn cost<Cf2: RequestCost>(self, cost: Cf2) -> PolicyLayerBuilder<C, Cf2> {
        let c = self.config;
        PolicyLayerBuilder {
            config: Config {
                edge: c.edge,
                cost,
                mode: c.mode,
                cost_error_status: c.cost_error_status,
            },
        }
    }

    /// The layer.
    pub fn build(self) -> PolicyLayer<C, Cf> {
        PolicyLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S, C, Cf> Layer<S> for PolicyLayer<C, Cf> {
    type Service = PolicyRateLimit<S, C, Cf>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyRateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`PolicyLayer`] wraps around an inner service.
pub struct PolicyRateLimit<S, C = MonotonicClock, Cf = UnitCost> {
    inner: S,
    config: Arc<Config<C, Cf>>,
}

impl<S: Clone, C, Cf> Clone for PolicyRateLimit<S, C, Cf> {
    fn clone(&self) -> Self {
        PolicyRateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, C, Cf> fmt::Debug for PolicyRateLimit<S, C, Cf> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyRateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future [`PolicyRateLimit`] returns.
    pub struct PolicyResponseFuture<F, ResB, E> {
        #[pin]
        state: State<F, ResB, E>,
    }
}

/// A forwarded call that first waits out a two-stage rule's delay.
type Delayed<ResB, E> = Pin<Box<dyn Future<Output = Result<Response<ResB>, E>> + Send>>;

pin_project! {
    #[project = StateProj]
    enum State<F, ResB, E> {
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
        },
        Delayed {
            future: Delayed<ResB, E>,
            fields: Option<Fields>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F, ResB, E> fmt::Debug for PolicyResponseFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyResponseFuture")
            .finish_non_exhaustive()
    }
}

impl<F, ResB, E> Future for PolicyResponseFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<RateLimitBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (response, fields) = match self.project().state.project() {
            StateProj::Inner { future, fields } => (std::task::ready!(future.poll(cx)), fields),
            StateProj::Delayed { future, fields } => {
                (std::task::ready!(future.as_mut().poll(cx)), fields)
            }
            StateProj::Ready { response } => {
                let response = response.take().unwrap_or_else(|| {
                    // Polled after completion: a caller's contract breach; an empty 500, no panic.
                    let mut response = Response::new(Bytes::new());
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    response
                });
                return Poll::Ready(Ok(response.map(RateLimitBody::full)));
            }
        };
        let mut response = response?;
        if let Some(fields) = fields.take() {
            fields.apply(response.headers_mut());
        }
        Poll::Ready(Ok(response.map(RateLimitBody::inner)))
    }
}

impl<S, C, Cf, ReqB, ResB> Service<Request<ReqB>> for PolicyRateLimit<S, C, Cf>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqB: Send + 'static,
    ResB: 'static,
    C: Clock + Clone + 'static,
    Cf: RequestCost,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = PolicyResponseFuture<S::Future, ResB, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let head = RequestHead::of(&request);
        let cost = config.cost.cost(&head);
        let verdict = config.edge.decide(&RequestFacts::of(&head), cost);
        let mode = config.mode;
        if verdict.cost_too_large() {
            return ready(json_response(
                config.cost_error_status,
                Bytes::from_static(COST_BODY),
            ));
        }
        let fields = verdict
            .fields
            .as_ref()
            .filter(|_| mode.ietf || mode.legacy)
            .map(|values| Fields::of_values(mode, values));
        if !verdict.allowed {
            let secs = verdict.retry_after.unwrap_or(1);
            return ready(too_many_requests(mode, secs, fields));
        }
        let fields = fields.filter(|_| mode.on_allowed);
        if verdict.delay.is_zero() {
            return PolicyResponseFuture {
                state: State::Inner {
                    future: self.inner.call(request),
                    fields,
                },
            };
        }
        // Take the service `poll_ready` readied and leave a clone in its place (tower's rule for
        // calling a service later, from a future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let delay: Duration = verdict.delay;
        PolicyResponseFuture {
            state: State::Delayed {
                future: Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    inner.call(request).await
                }),
                fields,
            },
        }
    }
}

fn ready<F, ResB, E>(response: Response<Bytes>) -> PolicyResponseFuture<F, ResB, E> {
    PolicyResponseFuture {
        state: State::Ready {
            response: Some(response),
        },
    }
}
