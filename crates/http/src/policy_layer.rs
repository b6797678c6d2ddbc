//! [`PolicyLayer`]: the tower layer over a [`tollgate_policy::Policy`], several rules per request
//! decided as one.

use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::{Clock, MonotonicClock, Quota};
use tollgate_policy::{Policy, PolicyDecision};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::headers::{HeaderMode, PolicyHeaders};
use crate::key::{ClientIp, KeyExtractor, RequestHead};
use crate::layer::{Fields, RequestCost, UnitCost, denial, json_response};
use crate::policy_fields::PolicyFields;

const COST_BODY: &[u8] = br#"{"error":"request cost exceeds quota capacity"}"#;
/// Descriptors one request can carry: the client address, the route, the method and this many
/// configured headers.
const MAX_HEADER_DESCRIPTORS: usize = 13;

/// Where each descriptor of a request comes from.
struct Sources {
    /// `remote_address` (or the configured name): the client address through the trusted-proxy
    /// logic of [`ClientIp`].
    client: Option<(ClientIp, Box<str>)>,
    /// The request path, as this descriptor.
    route: Option<Box<str>>,
    /// The method, as this descriptor.
    method: Option<Box<str>>,
    /// Request headers, each as a descriptor.
    headers: Vec<(HeaderName, Box<str>)>,
}

struct Config<C, Cf> {
    policy: Arc<Policy<C>>,
    sources: Sources,
    cost: Cf,
    mode: HeaderMode,
    cost_error_status: StatusCode,
    /// Field text per (rule, quota): the deciding rule and its quota vary per request (overrides,
    /// reloads), and each pair's `RateLimit-Policy` text is made once. Bounded by the rules' quota
    /// generations times their override tiers.
    fields: PolicyFields,
}

/// A tower [`Layer`] that decides each request against a [`Policy`]: every applicable rule at once,
/// admitted only if all enforcing rules admit (a denied request consumes nothing in any rule).
///
/// Descriptors come from the request: the client address (through [`ClientIp`]'s trusted-proxy
/// logic; descriptor `remote_address` by default), the path (`route`), the method (`method`), and the
/// headers you name. A rule whose descriptors a request lacks does not limit it (see the policy
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
                policy,
                sources: Sources {
                    client: None,
                    route: Some("route".into()),
                    method: Some("method".into()),
                    headers: Vec::new(),
                },
                cost: UnitCost,
                mode: HeaderMode::default(),
                cost_error_status: StatusCode::PAYLOAD_TOO_LARGE,
                fields: PolicyFields::new(),
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

/// A header name that is not a valid HTTP field name, or more headers than a request can carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorSourceError {
    header: String,
}

impl fmt::Display for DescriptorSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "header `{}` cannot be a descriptor source (not a field name, or more than \
             {MAX_HEADER_DESCRIPTORS} headers)",
            self.header
        )
    }
}

impl std::error::Error for DescriptorSourceError {}

impl<C, Cf> PolicyLayerBuilder<C, Cf> {
    /// The client address, through `client`'s trusted-proxy logic, as descriptor `remote_address`.
    pub fn client_ip(self, client: ClientIp) -> Self {
        self.client_ip_as(client, "remote_address")
    }

    /// The client address as descriptor `name`.
    pub fn client_ip_as(mut self, client: ClientIp, name: &str) -> Self {
        self.config.sources.client = Some((client, name.into()));
        self
    }

    /// Request header `header` (an API key, a tenant id) as descriptor `name`; absent, empty or
    /// non-text values leave the descriptor out.
    ///
    /// # Errors
    /// [`DescriptorSourceError`] for an invalid field name, or past 13 headers.
    pub fn header(mut self, header: &str, name: &str) -> Result<Self, DescriptorSourceError> {
        let err = || DescriptorSourceError {
            header: header.to_owned(),
        };
        if self.config.sources.headers.len() == MAX_HEADER_DESCRIPTORS {
            return Err(err());
        }
        let header = HeaderName::try_from(header).map_err(|_| err())?;
        self.config.sources.headers.push((header, name.into()));
        Ok(self)
    }

    /// The descriptor name for the path (`route` by default; `None` leaves it out).
    pub fn route_descriptor(mut self, name: Option<&str>) -> Self {
        self.config.sources.route = name.map(Into::into);
        self
    }

    /// The descriptor name for the method (`method` by default; `None` leaves it out).
    pub fn method_descriptor(mut self, name: Option<&str>) -> Self {
        self.config.sources.method = name.map(Into::into);
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
                policy: c.policy,
                sources: c.sources,
                cost,
                mode: c.mode,
                cost_error_status: c.cost_error_status,
                fields: c.fields,
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

/// An IP address's text on the stack (the longest, an IPv6 address with an IPv4 tail, is 45 bytes).
struct AddrText {
    buf: [u8; 48],
    len: usize,
}

impl fmt::Write for AddrText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl AddrText {
    fn as_str(&self) -> &str {
        // Only whole `&str`s were copied in.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl<C: Clock + Clone + 'static, Cf> Config<C, Cf> {
    /// The field text for `rule` under `quota`, made once per pair.
    fn policy_headers(&self, rule: &'static str, quota: Quota) -> Option<&'static PolicyHeaders> {
        self.fields.headers(rule, quota)
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
        let sources = &config.sources;
        let mut addr = AddrText {
            buf: [0; 48],
            len: 0,
        };
        let mut descriptors: [(&str, &str); MAX_HEADER_DESCRIPTORS + 3] =
            [("", ""); MAX_HEADER_DESCRIPTORS + 3];
        let mut len = 0;
        if let Some((client, name)) = &sources.client {
            if let Ok(ip) = client.extract(&head) {
                if write!(addr, "{ip}").is_ok() {
                    descriptors[len] = (name, addr.as_str());
                    len += 1;
                }
            }
        }
        if let Some(name) = &sources.route {
            descriptors[len] = (name, head.uri.path());
            len += 1;
        }
        if let Some(name) = &sources.method {
            descriptors[len] = (name, head.method.as_str());
            len += 1;
        }
        for (header, name) in &sources.headers {
            if let Some(value) = header_text(head.headers, header) {
                descriptors[len] = (name, value);
                len += 1;
            }
        }
        let descriptors = &descriptors[..len];
        let cost = config.cost.cost(&head);
        let now = config.policy.now();
        let mode = config.mode;
        // `t` on an admission needs a look at the deciding rule; skip it when no field says it.
        let fields_on_allowed = mode.on_allowed && (mode.ietf || mode.legacy);
        let checked = if fields_on_allowed {
            config.policy.check_next_at(descriptors, now, cost)
        } else {
            config
                .policy
                .check_at(descriptors, now, cost)
                .map(|decided| (decided, None))
        };
        let (decided, next_unit) = match checked {
            Ok(checked) => checked,
            Err(_) => {
                return ready(json_response(
                    config.cost_error_status,
                    Bytes::from_static(COST_BODY),
                ));
            }
        };
        let fields_for = |decided: &PolicyDecision| {
            let (rule, quota) = (decided.rule?, decided.quota?);
            let headers = config.policy_headers(rule, quota)?;
            let (r, t, _) = crate::policy_fields::service_limit(&decided.decision, next_unit);
            Some((headers, (r, t)))
        };
        if !decided.is_allowed() {
            let fields = (mode.ietf || mode.legacy)
                .then(|| fields_for(&decided))
                .flatten();
            return ready(denial(mode, &decided.decision, fields));
        }
        let fields = fields_on_allowed
            .then(|| fields_for(&decided))
            .flatten()
            .map(|(policy_headers, limit)| Fields::new(mode, policy_headers, limit));
        if decided.delay.is_zero() {
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
        let delay: Duration = decided.delay;
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

/// A header's first value as text, if present, non-empty and visible ASCII.
fn header_text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
}
