//! `SettleLayer` against an upstream shaped like an LLM API: `/complete` reports its usage in a
//! header, `/stream` is a server-sent-event stream reporting tokens per event and the total in a
//! final usage event. A per-tenant budget of 10 000 tokens per minute, 1 000 requests of random
//! sizes on a `ManualClock`:
//!
//! * admitted tokens in every interval stay within the stated bound (quota + rate × interval + the
//!   last request's overshoot; requests of one tenant do not overlap here);
//! * the accounting is exact: at one instant, the tokens settled are what the state shows;
//! * a cancelled response settles at its estimate;
//! * a stream is cut at the event where the tenant's budget ends.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tollgate_core::{ManualClock, Nanos};
use tollgate_http::{DescriptorNames, PolicyEdge, SettleLayer, Settled, SseMeter, Usage};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Layer, ServiceExt, service_fn};

const MS: Nanos = 1_000_000;
/// 10 000 per minute: one token every 6 ms.
const T: Nanos = 6 * MS;

/// The upstream's body: frames handed out one per poll.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

fn number(request: &Request<()>, name: &str) -> u64 {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `/complete`: the usage in `x-usage-tokens` (raw from `x-test-usage-raw` when given).
async fn complete(request: Request<()>) -> Result<Response<Frames>, Infallible> {
    let tokens = number(&request, "x-test-tokens");
    let usage = match request.headers().get("x-test-usage-raw") {
        Some(raw) => raw.clone(),
        None => tokens.into(),
    };
    let mut response = Response::new(Frames(VecDeque::from([Bytes::from(
        r#"{"choices":[{"text":"..."}]}"#,
    )])));
    response.headers_mut().insert("x-usage-tokens", usage);
    Ok(response)
}

/// `/stream`: `x-test-tokens` tokens in events of `x-test-chunk`, then the usage and `[DONE]`.
async fn stream(request: Request<()>) -> Result<Response<Frames>, Infallible> {
    let tokens = number(&request, "x-test-tokens");
    let chunk = number(&request, "x-test-chunk").max(1);
    let mut frames = VecDeque::new();
    let mut sent = 0;
    while sent < tokens {
        let n = chunk.min(tokens - sent);
        sent += n;
        frames.push_back(Bytes::from(format!(
            "data: {{\"delta\":\"x\",\"tokens\":{n}}}\n\n"
        )));
    }
    frames.push_back(Bytes::from(format!(
        "data: {{\"usage\":{{\"total_tokens\":{tokens}}}}}\n\n"
    )));
    frames.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    let mut response = Response::new(Frames(frames));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    Ok(response)
}

/// What an event reports: the tokens streamed, or the final total.
fn usage(data: &str) -> Usage {
    let field = |name: &str| -> Option<u64> {
        let at = data.find(name)? + name.len();
        let digits: String = data[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    if let Some(total) = field("\"total_tokens\":") {
        Usage::Total(total)
    } else if let Some(tokens) = field("\"tokens\":") {
        Usage::Add(tokens)
    } else {
        Usage::None
    }
}

struct Gateway {
    policy: Arc<Policy<ManualClock>>,
    clock: ManualClock,
    settled: Arc<Mutex<Vec<Settled>>>,
}

impl Gateway {
    fn new() -> Self {
        let config = PolicyConfig::from_toml(
            r#"
            [[rules]]
            name = "tokens"
            match = { tenant = "any" }
            key = ["tenant"]
            limit = 10000
            period = "1m"
            capacity = 100
            "#,
        )
        .unwrap();
        let clock = ManualClock::new();
        clock.set(1_000_000 * MS);
        let policy = Arc::new(Policy::with_clock(config, clock.clone()).unwrap());
        Gateway {
            policy,
            clock,
            settled: Arc::default(),
        }
    }

    fn edge(&self) -> PolicyEdge<ManualClock> {
        PolicyEdge::new(Arc::clone(&self.policy)).names(
            DescriptorNames::default()
                .route(None)
                .method(None)
                .header("x-tenant", "tenant")
                .unwrap(),
        )
    }

    fn record(&self) -> impl Fn(&Settled) + Send + Sync + 'static {
        let settled = Arc::clone(&self.settled);
        move |s: &Settled| settled.lock().unwrap().push(*s)
    }

    fn max_tokens(head: &tollgate_http::RequestHead<'_>) -> u64 {
        head.headers
            .get("x-max-tokens")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    }

    /// Sends one request through the header-settled layer; returns the status.
    async fn complete(
        &self,
        tenant: &str,
        estimate: u64,
        tokens: u64,
        raw: Option<&str>,
    ) -> StatusCode {
        let layer = SettleLayer::builder(self.edge())
            .estimate(Self::max_tokens)
            .actual(tollgate_http::ActualCost::Header(HeaderName::from_static(
                "x-usage-tokens",
            )))
            .on_settled(self.record())
            .build();
        let mut request = Request::builder()
            .uri("/v1/complete")
            .header("x-tenant", tenant)
            .header("x-max-tokens", estimate)
            .header("x-test-tokens", tokens);
        if let Some(raw) = raw {
            request = request.header("x-test-usage-raw", raw);
        }
        let response = layer
            .layer(service_fn(complete))
            .oneshot(request.body(()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        response.into_body().collect().await.unwrap();
        status
    }

    /// Streams one request through the metered, cutting layer, advancing the clock by `step`
    /// after each frame; `keep` frames at most are read (then the body is dropped). Returns the
    /// status and the bytes received.
    async fn stream(
        &self,
        tenant: &str,
        estimate: u64,
        tokens: u64,
        chunk: u64,
        step: Nanos,
        keep: usize,
    ) -> (StatusCode, String) {
        let layer = SettleLayer::builder(self.edge())
            .estimate(Self::max_tokens)
            .meter(|| SseMeter::new(usage))
            .cut_when_exhausted(true)
            .on_settled(self.record())
            .build();
        let request = Request::builder()
            .uri("/v1/stream")
            .header("x-tenant", tenant)
            .header("x-max-tokens", estimate)
            .header("x-test-tokens", tokens)
            .header("x-test-chunk", chunk)
            .body(())
            .unwrap();
        let response = layer
            .layer(service_fn(stream))
            .oneshot(request)
            .await
            .unwrap();
        let status = response.status();
        let mut body = response.into_body();
        let mut text = String::new();
        let mut frames = 0;
        while frames < keep {
            let Some(frame) = body.frame().await else {
                break;
            };
            if let Ok(data) = frame.unwrap().into_data() {
                text.push_str(std::str::from_utf8(&data).unwrap());
            }
            frames += 1;
            self.clock.advance(Duration::from_nanos(step));
        }
        drop(body);
        (status, text)
    }

    fn last(&self) -> Settled {
        *self.settled.lock().unwrap().last().unwrap()
    }

    fn left(&self, tenant: &str) -> u64 {
        let now = self.policy.now();
        self.policy
            .peek_rule_at("tokens", &[("tenant", tenant)], now, 0)
            .unwrap()
            .unwrap()
            .remaining()
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[tokio::test]
async fn a_thousand_llm_requests_stay_within_the_bound() {
    let gateway = Gateway::new();
    let mut rng = Rng(0x5eed);
    let tenants = ["acme", "globex", "initech"];
    // Per tenant: (reserved at, tokens settled, overshoot over the estimate).
    let mut admitted: HashMap<&str, Vec<(Nanos, u64, u64)>> = HashMap::new();
    let (mut cut, mut cancelled, mut denied) = (0, 0, 0);
    for _ in 0..1_000 {
        gateway.clock.advance(Duration::from_millis(rng.below(400)));
        let tenant = tenants[rng.below(3) as usize];
        let estimate = 50 + rng.below(1_500);
        let tokens = rng.below(2_500);
        let at = gateway.policy.now();
        let before = gateway.settled.lock().unwrap().len();
        let status = match rng.below(3) {
            0 => gateway.complete(tenant, estimate, tokens, None).await,
            1 => {
                let chunk = 10 + rng.below(200);
                gateway
                    .stream(
                        tenant,
                        estimate,
                        tokens,
                        chunk,
                        rng.below(30) * MS,
                        usize::MAX,
                    )
                    .await
                    .0
            }
            _ => {
                let chunk = 10 + rng.below(200);
                let keep = rng.below(4) as usize;
                gateway
                    .stream(tenant, estimate, tokens, chunk, 5 * MS, keep)
                    .await
                    .0
            }
        };
        if status != StatusCode::OK {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                gateway.settled.lock().unwrap().len(),
                before,
                "a denial settles nothing"
            );
            denied += 1;
            continue;
        }
        let settled = gateway.last();
        assert_eq!(
            gateway.settled.lock().unwrap().len(),
            before + 1,
            "settled exactly once"
        );
        assert_eq!(settled.settlement.rules, 1);
        if settled.cancelled {
            cancelled += 1;
            assert_eq!(
                settled.settlement.actual, settled.settlement.estimate,
                "at what was held"
            );
        }
        cut += usize::from(settled.cut);
        let actual = settled.settlement.actual;
        admitted
            .entry(tenant)
            .or_default()
            .push((at, actual, actual.saturating_sub(estimate)));
    }
    assert!(
        denied > 50 && cancelled > 50 && cut > 0,
        "denied {denied}, cancelled {cancelled}, cut {cut}"
    );
    for (tenant, list) in &admitted {
        for (i, &(a, ..)) in list.iter().enumerate() {
            let mut total = 0;
            for &(b, actual, overshoot) in &list[i..] {
                total += actual;
                let bound = 10_000 + (b - a) / T + overshoot;
                assert!(
                    total <= bound,
                    "{tenant}: {total} tokens in [{a}, {b}] > {bound}"
                );
            }
        }
    }
}

#[tokio::test]
async fn at_one_instant_the_settled_tokens_are_what_the_state_shows() {
    let gateway = Gateway::new();
    let mut rng = Rng(42);
    let mut spent = 0;
    for i in 0..30 {
        let estimate = 50 + rng.below(300);
        let tokens = rng.below(400);
        let status = match i % 3 {
            0 => gateway.complete("audit", estimate, tokens, None).await,
            1 => {
                gateway
                    .stream("audit", estimate, tokens, 25, 0, usize::MAX)
                    .await
                    .0
            }
            _ => gateway.stream("audit", estimate, tokens, 25, 0, 1).await.0,
        };
        assert_eq!(status, StatusCode::OK);
        let settled = gateway.last();
        if i % 3 == 2 {
            assert!(settled.cancelled);
            assert_eq!(
                settled.settlement.actual, estimate,
                "a cancelled stream pays its estimate"
            );
        } else {
            assert_eq!(settled.settlement.actual, tokens);
        }
        spent += settled.settlement.actual;
        assert_eq!(gateway.left("audit"), 10_000 - spent);
    }
}

#[tokio::test]
async fn bad_usage_headers_settle_at_the_estimate() {
    let gateway = Gateway::new();
    for raw in ["-5", "lots", "", "1e9", "99999999999999999999999"] {
        let before = gateway.left("bad");
        assert_eq!(
            gateway.complete("bad", 100, 0, Some(raw)).await,
            StatusCode::OK
        );
        assert_eq!(gateway.last().settlement.actual, 100, "{raw:?}");
        assert_eq!(gateway.left("bad"), before - 100, "{raw:?}");
    }
    // Zero gives the estimate back; a huge but valid count puts the tenant in debt.
    assert_eq!(
        gateway.complete("bad", 100, 0, Some("0")).await,
        StatusCode::OK
    );
    assert_eq!(gateway.left("bad"), 10_000 - 500);
    assert_eq!(
        gateway.complete("bad", 100, 0, Some("20000")).await,
        StatusCode::OK
    );
    assert_eq!(
        gateway.complete("bad", 1, 0, None).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_stream_is_cut_at_the_event_where_the_budget_ends() {
    let gateway = Gateway::new();
    assert_eq!(
        gateway.complete("cut", 9_700, 9_700, None).await,
        StatusCode::OK
    );
    assert_eq!(gateway.left("cut"), 300);
    // 100 reserved, 1 000 tokens in events of 50: the budget holds 300, so events 1-6 pass (the
    // 3rd to 6th each taking 50 more), the 7th is the one the tenant cannot pay for: the stream
    // ends after it, at an event boundary, without the usage event or `[DONE]`.
    let (status, text) = gateway.stream("cut", 100, 1_000, 50, 0, usize::MAX).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text.matches("\"tokens\":50").count(), 7);
    assert!(text.ends_with("\n\n") && !text.contains("[DONE]"));
    let settled = gateway.last();
    assert!(settled.cut && !settled.cancelled);
    assert_eq!(settled.settlement.actual, 350);
    // 50 tokens of debt: the next token waits 51 × 6 ms.
    let now = gateway.policy.now();
    let wait = gateway
        .policy
        .peek_rule_at("tokens", &[("tenant", "cut")], now, 1)
        .unwrap()
        .unwrap()
        .retry_after();
    assert_eq!(wait, Some(Duration::from_millis(51 * 6)));
}
