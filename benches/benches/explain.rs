//! What explain costs: nothing when it is off (the A/B), and how much when it is on.
//!
//! One binary, one 3-rule policy shared by every arm, the same requests:
//!
//! * `per_ip`: keyed by `remote_address` (the TCP peer), 4 096 keys;
//! * `per_api_key`: keyed by `api_key` (header `x-api-key`), 1 024 keys;
//! * `api`: a global rule on `route` prefix `/api/`.
//!
//! Quotas are high enough that every decision admits (the compare-and-swap path in each rule, and
//! the full rendering of an admission). 1 000 peers (`10.1.x.y`) and 100 API keys, drawn into a
//! ring ahead of time; the tables are filled before measuring, so all three rules decide on a
//! present key, in cache.
//!
//! * `explain/engine/check_next_at` (arm 1): `Policy::check_next_at`, the plain decision the
//!   server's embedded domains and the edges' descriptor paths call, on the edge's descriptors
//!   (`remote_address`, `route`, `method`, `api_key`), with the clock read.
//! * `explain/engine/explain_next_at` (arm 2): the same decision through `Policy::explain_next_at`
//!   (each rule's trace, state before and after): what explain costs when it is **on**.
//!   `explain_next_at_text` adds the one-line text (`Explanation`'s `Display`) an edge puts in
//!   the header.
//! * `explain/layer/no_option` (arm 3): the tower `PolicyLayer` over an inner service that answers
//!   an empty 200 at once (as in the `http` bench), no `explain_header` configured: a request is
//!   built, readied, called, and its response dropped.
//! * `explain/layer/untrusted` (arm 4): the same layer with
//!   `explain_header(TOLLGATE_EXPLAIN, trust)` configured, the request neither trusted (its peer is
//!   outside the operators' `10.9.0.0/16`) nor asking: the **off** cost at the edge (one `None`
//!   check and the predicate's call).
//! * `explain/layer/trusted`: the same option, the request from `10.9.x.y`: the trace computed,
//!   rendered and sent as a header (explain **on** at the edge), for scale.
//!
//! Criterion's rows move between runs of the same binary by more than the difference looked for,
//! so before them `explain/layer/interleaved` times arms 3 and 4 and a second layer without the
//! option (an A/A control: the same code as arm 3 in another allocation) in alternating rounds
//! (the order rotates every round) and prints each arm's median ns per request and the median
//! per-round differences `untrusted - no_option` (the A/B) and `no_option_2 - no_option` (the
//! A/A, the noise floor). Explain is free when off when the A/B difference is within the A/A
//! spread. `explain/engine/interleaved` does the same for arms 1 and 2.
//!
//! Run: `results/explain/run.sh` (or `cargo bench -p tollgate-benches --bench explain`).
//! Smoke: `cargo bench -p tollgate-benches --bench explain -- --test`.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use axum::body::Body;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderValue, Request, Response, StatusCode};
use tollgate_http::headers::TOLLGATE_EXPLAIN;
use tollgate_http::{ClientIp, PolicyLayer, RequestFacts};
use tollgate_policy::{Policy, PolicyConfig};
use tower::{Layer, Service};

const RING: usize = 1 << 16;
const PEERS: usize = 1_000;
const API_KEYS: usize = 100;
const PATH: &str = "/api/items";

const POLICY: &str = r#"
    [[rules]]
    name = "per_ip"
    match = { remote_address = "any" }
    key = ["remote_address"]
    limit = 100_000_000
    period = "1s"
    burst = 1_000
    capacity = 4_096

    [[rules]]
    name = "per_api_key"
    match = { api_key = "any" }
    key = ["api_key"]
    limit = 100_000_000
    period = "1s"
    burst = 1_000
    capacity = 1_024

    [[rules]]
    name = "api"
    match = { route = { prefix = "/api/" } }
    limit = 1_000_000_000
    period = "1s"
    burst = 1_000_000
"#;

/// The operators' network, `10.9.0.0/16`: the only peers trusted with a trace.
fn trusted(facts: &RequestFacts<'_>) -> bool {
    matches!(facts.peer, Some(IpAddr::V4(v4)) if v4.octets()[..2] == [10, 9])
}

/// The requests every arm sees, drawn ahead of time.
struct Traffic {
    /// Peers `10.{net}.x.y` as the edge sees them, and as descriptor text.
    peers: Vec<SocketAddr>,
    peer_text: Vec<String>,
    /// The same hosts in the operators' network (`10.9.x.y`), for the trusted arm.
    operators: Vec<SocketAddr>,
    keys: Vec<String>,
    key_values: Vec<HeaderValue>,
    /// Indices into `peers`, uniform; the API key is `peer % API_KEYS`.
    ring: Vec<u32>,
}

impl Traffic {
    fn new() -> Self {
        let host = |net: u8, i: usize| {
            SocketAddr::from((Ipv4Addr::new(10, net, (i >> 8) as u8, i as u8), 40_000))
        };
        let peers: Vec<SocketAddr> = (0..PEERS).map(|i| host(1, i)).collect();
        let keys: Vec<String> = (0..API_KEYS).map(|i| format!("key-{i}")).collect();
        // A fixed-seed xorshift: the same ring in every run, no extra dependency.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let ring = (0..RING)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % PEERS as u64) as u32
            })
            .collect();
        Traffic {
            peer_text: peers.iter().map(|p| p.ip().to_string()).collect(),
            peers,
            operators: (0..PEERS).map(|i| host(9, i)).collect(),
            key_values: keys
                .iter()
                .map(|k| HeaderValue::from_str(k).expect("header value"))
                .collect(),
            keys,
            ring,
        }
    }

    #[inline]
    fn pick(&self, i: usize) -> usize {
        self.ring[i & (RING - 1)] as usize
    }

    /// The descriptors the edge builds for request `i` (client, route, method, header).
    #[inline]
    fn descriptors(&self, i: usize) -> [(&str, &str); 4] {
        let p = self.pick(i);
        [
            ("remote_address", &self.peer_text[p]),
            ("route", PATH),
            ("method", "GET"),
            ("api_key", &self.keys[p % API_KEYS]),
        ]
    }

    /// Request `i` from a peer (`operators`: from the operators' network).
    #[inline]
    fn request(&self, i: usize, operators: bool) -> Request<Body> {
        let p = self.pick(i);
        let mut req = Request::new(Body::empty());
        *req.uri_mut() = http::Uri::from_static(PATH);
        req.headers_mut()
            .insert("x-api-key", self.key_values[p % API_KEYS].clone());
        let peer = if operators {
            self.operators[p]
        } else {
            self.peers[p]
        };
        req.extensions_mut().insert(peer);
        req
    }
}

fn policy() -> Arc<Policy> {
    let config = PolicyConfig::from_toml(POLICY).expect("valid config");
    Arc::new(Policy::new(config).expect("valid policy"))
}

/// An inner service that is always ready and answers an empty 200 without yielding.
#[derive(Clone, Copy)]
struct Ok200;

impl Service<Request<Body>> for Ok200 {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::empty())))
    }
}

/// Readies `svc`, calls it with `req` and polls the future once (nothing here waits: no rule
/// delays).
fn drive<S, B>(svc: &mut S, req: Request<Body>) -> Response<B>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready(), "always ready");
    let mut future = pin!(svc.call(req));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => response,
        Poll::Ready(Err(e)) => match e {},
        Poll::Pending => panic!("no rule delays, so nothing waits"),
    }
}

/// A layer over `policy`: the peer is the client, `x-api-key` is `api_key`; with the explain
/// option when `explain`.
fn layer(policy: &Arc<Policy>, explain: bool) -> PolicyLayer {
    let builder = PolicyLayer::builder(Arc::clone(policy))
        .client_ip(ClientIp::trusting([]))
        .header("x-api-key", "api_key")
        .expect("valid header");
    if explain {
        builder
            .explain_header(TOLLGATE_EXPLAIN.clone(), trusted)
            .build()
    } else {
        builder.build()
    }
}

/// Every peer and API key decided once (and the operators' peers), so the arms decide on present
/// keys.
fn fill(policy: &Policy, traffic: &Traffic) {
    let now = policy.now();
    for p in 0..PEERS {
        for peer in [
            &traffic.peer_text[p],
            &traffic.operators[p].ip().to_string(),
        ] {
            let d = [
                ("remote_address", peer.as_str()),
                ("route", PATH),
                ("method", "GET"),
                ("api_key", traffic.keys[p % API_KEYS].as_str()),
            ];
            let decided = policy.check_at(&d, now, 1).expect("valid cost");
            assert!(decided.is_allowed(), "the quotas admit every request");
        }
    }
}

/// Whether this is a measuring run (`cargo bench`), not a smoke run (`cargo test --bench`, or
/// `cargo bench -- --test`): the interleaved rounds are skipped in a smoke run.
fn measuring() -> bool {
    let mut args = std::env::args();
    args.any(|a| a == "--bench") && !std::env::args().any(|a| a == "--test")
}

/// Times `arms` in alternating rounds of `BATCH` calls (the starting arm rotates every round) and
/// returns each arm's median ns per call and, per arm, the median per-round difference from arm 0.
fn interleaved(arms: &mut [&mut dyn FnMut(usize)]) -> (Vec<f64>, Vec<f64>) {
    const ROUNDS: usize = 41;
    const BATCH: usize = 50_000;
    let time = |arm: &mut dyn FnMut(usize), start: usize| {
        let t = Instant::now();
        for i in start..start + BATCH {
            arm(i);
        }
        t.elapsed().as_nanos() as f64 / BATCH as f64
    };
    for arm in arms.iter_mut() {
        time(&mut **arm, 0);
    }
    let n = arms.len();
    let mut per_arm = vec![Vec::with_capacity(ROUNDS); n];
    let mut diffs = vec![Vec::with_capacity(ROUNDS); n];
    for round in 0..ROUNDS {
        let start = round * BATCH;
        let mut this = vec![0.0; n];
        for k in 0..n {
            let a = (round + k) % n;
            this[a] = time(&mut *arms[a], start);
        }
        for a in 0..n {
            per_arm[a].push(this[a]);
            diffs[a].push(this[a] - this[0]);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (
        per_arm.into_iter().map(median).collect(),
        diffs.into_iter().map(median).collect(),
    )
}

fn engine(c: &mut Criterion) {
    let traffic = Traffic::new();
    let policy = policy();
    fill(&policy, &traffic);

    let mut check = |i: usize| {
        black_box(policy.check_next_at(&traffic.descriptors(i), policy.now(), 1)).ok();
    };
    let mut explain = |i: usize| {
        black_box(policy.explain_next_at(&traffic.descriptors(i), policy.now(), 1)).ok();
    };
    if measuring() {
        let (medians, diffs) = interleaved(&mut [&mut check, &mut explain]);
        eprintln!(
            "explain/engine/interleaved: check_next_at {:.1} ns, explain_next_at {:.1} ns, median per-round difference (explain - check) {:+.1} ns",
            medians[0], medians[1], diffs[1]
        );
    }

    let mut group = c.benchmark_group("explain/engine");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function("check_next_at", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(policy.check_next_at(&traffic.descriptors(i), policy.now(), 1))
        })
    });
    group.bench_function("explain_next_at", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(policy.explain_next_at(&traffic.descriptors(i), policy.now(), 1))
        })
    });
    group.bench_function("explain_next_at_text", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let explained = policy.explain_next_at(&traffic.descriptors(i), policy.now(), 1);
            black_box(explained.map(|(_, _, why)| why.to_string()))
        })
    });
    group.finish();
}

fn bench_layer<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    svc: &mut S,
    traffic: &Traffic,
    operators: bool,
) where
    S: Service<
            Request<Body>,
            Response = Response<tollgate_http::RateLimitBody<Body>>,
            Error = Infallible,
        >,
{
    let mut i = 0usize;
    group.bench_function(name, |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            drive(svc, traffic.request(i, operators))
        })
    });
}

fn edge(c: &mut Criterion) {
    let traffic = Traffic::new();
    let policy = policy();
    fill(&policy, &traffic);
    let mut plain = layer(&policy, false).layer(Ok200);
    let mut plain_2 = layer(&policy, false).layer(Ok200);
    let mut off = layer(&policy, true).layer(Ok200);
    let mut on = layer(&policy, true).layer(Ok200);

    // Each arm answers as it should before anything is timed.
    for (svc, operators, traced) in [
        (&mut plain, false, false),
        (&mut plain_2, false, false),
        (&mut off, false, false),
        (&mut on, true, true),
    ] {
        let response = drive(svc, traffic.request(0, operators));
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("ratelimit"));
        assert_eq!(
            response.headers().contains_key(&TOLLGATE_EXPLAIN),
            traced,
            "only the trusted arm carries a trace"
        );
    }

    let mut a = |i: usize| drop(black_box(drive(&mut plain, traffic.request(i, false))));
    let mut a2 = |i: usize| drop(black_box(drive(&mut plain_2, traffic.request(i, false))));
    let mut b = |i: usize| drop(black_box(drive(&mut off, traffic.request(i, false))));
    if measuring() {
        let (medians, diffs) = interleaved(&mut [&mut a, &mut a2, &mut b]);
        eprintln!(
            "explain/layer/interleaved: no_option {:.1} ns, no_option_2 {:.1} ns, untrusted {:.1} ns; median per-round difference: untrusted - no_option {:+.1} ns (A/B), no_option_2 - no_option {:+.1} ns (A/A)",
            medians[0], medians[1], medians[2], diffs[2], diffs[1]
        );
    }

    let mut group = c.benchmark_group("explain/layer");
    group.throughput(Throughput::Elements(1));
    bench_layer(&mut group, "no_option", &mut plain, &traffic, false);
    bench_layer(&mut group, "untrusted", &mut off, &traffic, false);
    bench_layer(&mut group, "trusted", &mut on, &traffic, true);
    group.finish();
}

criterion_group!(benches, engine, edge);
criterion_main!(benches);
