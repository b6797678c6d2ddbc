//! The two processes of `results/pingora/run.sh`: a Pingora proxy with a choice of limiter, and a
//! loopback upstream that counts what reaches it per client key.
//!
//! ```text
//! pingora-bench upstream --listen 127.0.0.1:18080 --key-header x-client-id --max-keys 1000000
//! pingora-bench proxy --listen 127.0.0.1:16188 --upstream 127.0.0.1:18080 \
//!     --limiter none|pingora-limits|keyed|policy --limit 100 --capacity 1000000 \
//!     --key-header x-client-id --threads 2
//! pingora-bench decide --iters 2000000
//! ```
//!
//! `decide` runs no server: on one thread it times each limiter's per-request work outside Pingora
//! (the key header read from a `HeaderMap`, the decision; `policy` is `PingoraLimiter::decide`, the
//! header values included) at 1, 10 000 and 1 000 000 keys sent round-robin, limits never reached,
//! and prints `MICRO mode=.. keys=.. ns_per_op=..` per repetition. `policy-headers` is `policy`
//! with the `RateLimit` / `RateLimit-Policy` values then written as header values, as the
//! response filter does (a decision keeps the `RateLimit` text as its parts since the edge stopped
//! allocating per decision). The `none` row is the loop itself
//! (a header insert and get per iteration): subtract it.
//!
//! Limiters (each keyed by the `--key-header` value, falling back to the client address):
//! * `none`: no limiter (the baseline).
//! * `pingora-limits`: as in Pingora's own `rate_limiter` example: one `Rate` with a 1 s window,
//!   `observe(key, 1)` per request, denied with `429` when the count seen in the current window
//!   exceeds `--limit`.
//! * `keyed`: one Tollgate `KeyedLimiter<str, Gcra>` of `--limit` per second (burst = limit),
//!   `--capacity` keys; a denial is a `429` with `Retry-After`.
//! * `policy`: `tollgate_pingora::PingoraLimiter` over a 3-rule policy, decided as one: `per_key`
//!   (`--limit`/s per key header, `--capacity` keys), `per_route` (per path) and `global`, the last
//!   two at `--wide-limit`/s; it adds `RateLimit`/`RateLimit-Policy` to every response.
//!
//! Both denial paths close the connection, as Pingora's example does.
//!
//! The upstream answers `200 ok` to everything. It counts requests whose key header is `k<N>`
//! (`N < --max-keys`) per key; `GET /__counts` answers a summary: `total`, `other` (no such key),
//! `keys_seen`, `max`, then `hist <admitted> <keys>` lines (how many keys were admitted that many
//! times), from which `run.sh` reads the accuracy.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderName;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use pingora_core::server::Server;
use pingora_core::server::configuration::ServerConf;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::ResponseHeader;
use pingora_limits::rate::Rate;
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};
use tollgate_core::{Decision, Gcra, Quota};
use tollgate_http::ClientIp;
use tollgate_http::headers::{retry_after_secs, seconds_value};
use tollgate_pingora::{LimitCtx, PingoraLimiter};
use tollgate_policy::{Policy, PolicyConfig};
use tollgate_sharded::KeyedLimiter;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Command-line options of both roles.
struct Args {
    role: String,
    listen: String,
    upstream: String,
    limiter: String,
    limit: u64,
    wide_limit: u64,
    capacity: usize,
    key_header: HeaderName,
    threads: usize,
    max_keys: usize,
    iters: usize,
    /// `decide`: the modes to time (default: all four), for a profile of one.
    modes: Vec<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = std::env::args().skip(1);
    let role = args
        .next()
        .ok_or("usage: pingora-bench upstream|proxy|decide [options]")?;
    let mut a = Args {
        role,
        listen: "127.0.0.1:16188".to_owned(),
        upstream: "127.0.0.1:18080".to_owned(),
        limiter: "none".to_owned(),
        limit: 1_000_000_000,
        wide_limit: 1_000_000_000,
        capacity: 1_000_000,
        key_header: HeaderName::from_static("x-client-id"),
        threads: 2,
        max_keys: 1_000_000,
        iters: 2_000_000,
        modes: Vec::new(),
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?,
            "--upstream" => a.upstream = value()?,
            "--limiter" => a.limiter = value()?,
            "--limit" => a.limit = value()?.parse()?,
            "--wide-limit" => a.wide_limit = value()?.parse()?,
            "--capacity" => a.capacity = value()?.parse()?,
            "--key-header" => a.key_header = HeaderName::try_from(value()?)?,
            "--threads" => a.threads = value()?.parse()?,
            "--max-keys" => a.max_keys = value()?.parse()?,
            "--iters" => a.iters = value()?.parse()?,
            "--modes" => a.modes = value()?.split(',').map(str::to_owned).collect(),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Error> {
    let args = parse_args()?;
    match args.role.as_str() {
        "upstream" => upstream(&args),
        "proxy" => proxy(args),
        "decide" => micro(&args),
        other => Err(format!("unknown role {other} (upstream|proxy)").into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream

/// Requests seen per key `k<N>`.
struct Counts {
    per_key: Box<[AtomicU32]>,
    other: AtomicU64,
    header: HeaderName,
}

impl Counts {
    fn record(&self, req: &Request<Incoming>) {
        let index = req
            .headers()
            .get(&self.header)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix('k'))
            .and_then(|n| n.parse::<usize>().ok());
        // Relaxed (both): counters read by a later /__counts request, after the load has stopped;
        // they publish nothing else.
        match index.and_then(|i| self.per_key.get(i)) {
            Some(c) => {
                c.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn summary(&self) -> String {
        let mut hist = BTreeMap::<u32, u64>::new();
        let mut total = 0u64;
        for c in self.per_key.iter() {
            // Relaxed: see `record`.
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                *hist.entry(n).or_default() += 1;
                total += u64::from(n);
            }
        }
        // Relaxed: see `record`.
        let other = self.other.load(Ordering::Relaxed);
        let mut out = format!(
            "total {}\nother {other}\nkeys_seen {}\nmax {}\n",
            total + other,
            hist.values().sum::<u64>(),
            hist.keys().next_back().copied().unwrap_or(0),
        );
        for (admitted, keys) in hist {
            out.push_str(&format!("hist {admitted} {keys}\n"));
        }
        out
    }
}

fn upstream(args: &Args) -> Result<(), Error> {
    let counts = Arc::new(Counts {
        per_key: (0..args.max_keys).map(|_| AtomicU32::new(0)).collect(),
        other: AtomicU64::new(0),
        header: args.key_header.clone(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen).await?;
        println!("upstream listening on {}", listener.local_addr()?);
        loop {
            let (sock, _) = listener.accept().await?;
            sock.set_nodelay(true)?;
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let body = if req.uri().path() == "/__counts" {
                        Bytes::from(counts.summary())
                    } else {
                        counts.record(&req);
                        Bytes::from_static(b"ok")
                    };
                    async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
                });
                // A connection's error (the peer went away) ends that connection only.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
            });
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Proxy

// One `Mode` per process, built once and never moved on the request path; boxing the large variant
// would add an indirection to the per-request work this benchmark measures. (Its size depends on
// which tollgate-policy features the build unifies, e.g. `redis` when tollgate-server is built too.)
#[allow(clippy::large_enum_variant)]
enum Mode {
    None,
    PingoraLimits {
        rate: Rate,
        limit: isize,
    },
    Keyed(KeyedLimiter<str, Gcra>),
    Policy(PingoraLimiter),
    /// `decide` only: `policy`, then both field values written as header values (what
    /// `response_filter` adds to an admitted response).
    PolicyHeaders(PingoraLimiter),
}

struct BenchProxy {
    mode: Mode,
    upstream: String,
    key_header: HeaderName,
}

impl BenchProxy {
    /// Calls `f` with the request's key: the key header, else the client address.
    fn with_key<R>(&self, session: &Session, f: impl FnOnce(&str) -> R) -> R {
        match session
            .req_header()
            .headers
            .get(&self.key_header)
            .and_then(|v| v.to_str().ok())
        {
            Some(key) => f(key),
            None => {
                let peer: Option<IpAddr> = session
                    .client_addr()
                    .and_then(|a| a.as_inet())
                    .map(|a| a.ip());
                f(&peer.map(|p| p.to_string()).unwrap_or_default())
            }
        }
    }
}

/// Answers `429` with `extra` headers and closes the connection (Pingora's example does the same).
async fn deny(
    session: &mut Session,
    extra: &[(&'static str, String)],
) -> pingora_core::Result<bool> {
    let mut head = ResponseHeader::build(429, Some(extra.len() + 1))?;
    head.insert_header("content-length", "0")?;
    for (name, value) in extra {
        head.insert_header(*name, value.as_str())?;
    }
    session.set_keepalive(None);
    session.write_response_header(Box::new(head), true).await?;
    Ok(true)
}

#[async_trait]
impl ProxyHttp for BenchProxy {
    type CTX = LimitCtx;

    fn new_ctx(&self) -> LimitCtx {
        LimitCtx::default()
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut LimitCtx,
    ) -> pingora_core::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<bool> {
        match &self.mode {
            Mode::None => Ok(false),
            Mode::PingoraLimits { rate, limit } => {
                let seen = self.with_key(session, |key| rate.observe(&key, 1));
                if seen > *limit {
                    let headers = [
                        ("x-rate-limit-limit", limit.to_string()),
                        ("x-rate-limit-remaining", "0".to_owned()),
                        ("x-rate-limit-reset", "1".to_owned()),
                    ];
                    return deny(session, &headers).await;
                }
                Ok(false)
            }
            Mode::Keyed(limiter) => {
                // A cost of 1 never exceeds the capacity (limit ≥ 1): the error arm fails closed.
                let decision = self.with_key(session, |key| limiter.check_key(key, 1));
                match decision {
                    Ok(Decision::Allowed { .. }) => Ok(false),
                    Ok(Decision::Denied { retry_after, .. }) => {
                        let secs = retry_after_secs(retry_after);
                        let value = seconds_value(secs);
                        let retry = value.to_str().unwrap_or("1").to_owned();
                        deny(session, &[("retry-after", retry)]).await
                    }
                    Err(_) => deny(session, &[]).await,
                }
            }
            Mode::Policy(limiter) | Mode::PolicyHeaders(limiter) => {
                limiter.request_filter(session, ctx).await
            }
        }
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut LimitCtx,
    ) -> pingora_core::Result<()> {
        match &self.mode {
            Mode::Policy(limiter) | Mode::PolicyHeaders(limiter) => {
                limiter.response_filter(upstream_response, ctx)
            }
            _ => Ok(()),
        }
    }
}

/// The 3-rule policy of `--limiter policy`.
fn policy_toml(limit: u64, wide_limit: u64, capacity: usize) -> String {
    format!(
        r#"
[[rules]]
name = "per_key"
match = {{ client_key = "any" }}
key = ["client_key"]
limit = {limit}
period = "1s"
capacity = {capacity}

[[rules]]
name = "per_route"
match = {{ route = "any" }}
key = ["route"]
limit = {wide_limit}
period = "1s"
capacity = 1024

[[rules]]
name = "global"
limit = {wide_limit}
period = "1s"
"#
    )
}

fn build_mode(args: &Args) -> Result<Mode, Error> {
    Ok(match args.limiter.as_str() {
        "none" => Mode::None,
        "pingora-limits" => Mode::PingoraLimits {
            rate: Rate::new(Duration::from_secs(1)),
            limit: isize::try_from(args.limit)?,
        },
        "keyed" => Mode::Keyed(KeyedLimiter::new(
            Quota::per_second(args.limit)?,
            args.capacity,
        )?),
        "policy" | "policy-headers" => {
            let toml = policy_toml(args.limit, args.wide_limit, args.capacity);
            let policy = Arc::new(Policy::new(PolicyConfig::from_toml(&toml)?)?);
            let limiter = PingoraLimiter::new(policy, ClientIp::trusting([]))
                .descriptor_header(args.key_header.clone(), "client_key")?;
            if args.limiter == "policy" {
                Mode::Policy(limiter)
            } else {
                Mode::PolicyHeaders(limiter)
            }
        }
        other => return Err(format!("unknown limiter {other}").into()),
    })
}

fn proxy(args: Args) -> Result<(), Error> {
    let mode = build_mode(&args)?;
    if let Mode::Keyed(limiter) = &mode {
        println!("keyed limiter: {} bytes", limiter.memory_bytes());
    }
    let conf = ServerConf {
        threads: args.threads,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = http_proxy_service(
        &server.configuration,
        BenchProxy {
            mode,
            upstream: args.upstream,
            key_header: args.key_header,
        },
    );
    service.add_tcp(&args.listen);
    server.add_service(service);
    println!("proxy ({}) listening on {}", args.limiter, args.listen);
    server.run_forever()
}

// ---------------------------------------------------------------------------------------------
// In-process decision cost

/// One request's decision outside Pingora: what `request_filter` does before any response is
/// written. Returns whether it was admitted.
fn decide_one(
    mode: &Mode,
    key_header: &HeaderName,
    headers: &http::HeaderMap,
    peer: IpAddr,
) -> bool {
    let key = || {
        headers
            .get(key_header)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    match mode {
        Mode::None => !key().is_empty(),
        Mode::PingoraLimits { rate, limit } => rate.observe(&key(), 1) <= *limit,
        Mode::Keyed(limiter) => limiter.check_key(key(), 1).is_ok_and(|d| d.is_allowed()),
        Mode::Policy(limiter) => limiter.decide(Some(peer), "GET", "/", headers).allowed,
        Mode::PolicyHeaders(limiter) => {
            let verdict = limiter.decide(Some(peer), "GET", "/", headers);
            let written = verdict
                .fields
                .map(|f| (f.ratelimit_policy, http::HeaderValue::from(f.ratelimit)));
            std::hint::black_box(written);
            verdict.allowed
        }
    }
}

fn micro(args: &Args) -> Result<(), Error> {
    let peer: IpAddr = [127, 0, 0, 1].into();
    for keys in [1usize, 10_000, 1_000_000] {
        let values = (0..keys)
            .map(|i| http::HeaderValue::try_from(format!("k{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        for rep in 0..3 {
            for limiter in [
                "none",
                "pingora-limits",
                "keyed",
                "policy",
                "policy-headers",
            ] {
                if !args.modes.is_empty() && !args.modes.iter().any(|m| m == limiter) {
                    continue;
                }
                let mode = build_mode(&Args {
                    role: String::new(),
                    listen: String::new(),
                    upstream: String::new(),
                    limiter: limiter.to_owned(),
                    capacity: keys.max(1024),
                    key_header: args.key_header.clone(),
                    modes: Vec::new(),
                    ..*args
                })?;
                let mut headers = http::HeaderMap::new();
                let mut run = |n: usize| {
                    let mut admitted = 0usize;
                    for i in 0..n {
                        headers.insert(args.key_header.clone(), values[i % keys].clone());
                        admitted += usize::from(std::hint::black_box(decide_one(
                            &mode,
                            &args.key_header,
                            &headers,
                            peer,
                        )));
                    }
                    admitted
                };
                // Warm-up: every key once (the table's first touch), then the timed pass.
                run(keys.min(args.iters));
                let start = std::time::Instant::now();
                let admitted = run(args.iters);
                let ns = start.elapsed().as_nanos() as f64 / args.iters as f64;
                println!(
                    "MICRO mode={limiter} keys={keys} rep={rep} ns_per_op={ns:.1} admitted={admitted} iters={}",
                    args.iters
                );
            }
        }
    }
    Ok(())
}
