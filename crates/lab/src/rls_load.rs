//! `rls-load` (`cargo run --release -p tollgate-lab --bin rls-load -- ...`): a closed-loop gRPC load
//! client for Envoy RLS v3's `ShouldRateLimit`, such as tollgate-server's.
//!
//! `--streams N` tokio tasks each keep one unary call in flight (send, await the answer, send the
//! next), spread round-robin over `--channels` HTTP/2 connections (see [`ClientKind`] for the
//! two ways calls are made). One channel
//! funnels every call through a single connection and its buffer task, which a single core's worth
//! of client work can saturate; a few channels let the client's runtime threads and the server's
//! connection tasks run in parallel. The default is `min(streams, 4)`.
//!
//! Every call's latency (from just before the call is issued to its answer) is recorded in a
//! per-task `hdrhistogram` (nanoseconds, 3 significant digits), merged at the end. Calls that start
//! during `--warmup` or end after the measured window are neither counted nor recorded, so
//! calls/s is the count of calls that both started and finished inside the window, divided by it.
//! Closed loop: a slow answer delays the task's next call, so the percentiles are the service
//! time under that concurrency (no coordinated-omission correction applies to a closed loop).
//!
//! Each call carries one descriptor built from `--descriptor key=value` entries (in order), or,
//! with `--descriptor-set k=v,k=v` repeated, one descriptor per `--descriptor-set` (in order), as
//! Envoy sends one descriptor per `rate_limits` action of a route. A value's `{key}` is replaced by
//! the call's key index, cycling through `0..--keys`, so `--keys N` spreads the load over N
//! limiter keys (every descriptor of a call gets the same index).
//!
//! The report also gives the CPU time this client and (with `--server-pid`) the server spent over
//! the window, from `/proc/<pid>/stat`: on a machine the two share, the server's CPU per call is
//! what its throughput on dedicated cores would follow.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hdrhistogram::Histogram;
use prost::Message as _;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

/// `rls-load`'s arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// The server's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target: String,
    /// `RateLimitRequest.domain`.
    #[arg(long, default_value = "edge")]
    pub domain: String,
    /// Concurrent in-flight calls (one tokio task each).
    #[arg(long, default_value_t = 64)]
    pub streams: usize,
    /// HTTP/2 connections the streams are spread over (default: min(streams, 4)).
    #[arg(long)]
    pub channels: Option<usize>,
    /// The measured window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before the measured window (not counted).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Distinct key indices `{key}` cycles through.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// One descriptor entry, `key=value` (repeat for more entries; `{key}` in a value is replaced by
    /// the key index). Default: `remote_address=10.0.0.{key}`.
    #[arg(long = "descriptor", value_name = "KEY=VALUE")]
    pub descriptor: Vec<String>,
    /// One whole descriptor, its entries `key=value` separated by `,` (so a value cannot hold a
    /// `,`); repeat for several descriptors per call, sent in the order given. `{key}` as in
    /// `--descriptor`. Not together with `--descriptor`.
    #[arg(
        long = "descriptor-set",
        value_name = "KEY=VALUE[,KEY=VALUE...]",
        conflicts_with = "descriptor"
    )]
    pub descriptor_set: Vec<String>,
    /// `RateLimitRequest.hits_addend` (0 means 1).
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    /// Client runtime worker threads (default: the machine's cores; 1: a current-thread runtime).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The server's process id, to report the CPU time it spent over the window (Linux `/proc`).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Another process whose CPU time over the window is reported (e.g. the redis-server).
    #[arg(long)]
    pub other_pid: Option<u32>,
    /// How calls are made: `h2` (default) sends pre-encoded requests on `h2` connections directly,
    /// `tonic` through tonic's generated client and `Channel`.
    #[arg(long, value_enum, default_value_t = ClientKind::H2)]
    pub client: ClientKind,
}

/// How the load client makes its calls.
///
/// The server's cost per call is what a run measures, so on a machine the two share the client
/// should spend as little as it can: `h2` encodes each key's request once, before the run, and
/// makes every call as one HTTP/2 stream on a shared connection (request headers, one DATA frame,
/// then the response's DATA and trailers: `grpc-status` checked, the answer decoded with prost).
/// `tonic` is the generated client over a `Channel` (a tower buffer task in front of hyper), what
/// an application would write, and costs the client about as much CPU per call as the server
/// spends (results/server).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// `h2` connections, pre-encoded requests.
    H2,
    /// tonic's generated client.
    Tonic,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// Why a load run could not be made or reported.
#[derive(Debug)]
pub enum LoadError {
    /// The arguments are inconsistent.
    Args(String),
    /// The client runtime could not start.
    Runtime(std::io::Error),
    /// A channel could not connect.
    Connect(String),
    /// The JSON report could not be written.
    Output(std::io::Error),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Args(m) => write!(f, "bad arguments: {m}"),
            LoadError::Runtime(e) => write!(f, "cannot start the client runtime: {e}"),
            LoadError::Connect(m) => write!(f, "cannot connect: {m}"),
            LoadError::Output(e) => write!(f, "cannot write the report: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Fastest call.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest call.
    pub max: f64,
}

/// What a run measured (the JSON report).
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// The server address.
    pub target: String,
    /// The domain.
    pub domain: String,
    /// Concurrent in-flight calls.
    pub streams: usize,
    /// HTTP/2 connections.
    pub channels: usize,
    /// How the calls were made.
    pub client: ClientKind,
    /// Client runtime worker threads.
    pub threads: usize,
    /// Distinct key indices.
    pub keys: u64,
    /// The `--descriptor` entries as given (the default one when neither `--descriptor` nor
    /// `--descriptor-set` is given; empty with `--descriptor-set`).
    pub descriptor: Vec<String>,
    /// The `--descriptor-set` descriptors as given, one per descriptor of each call.
    pub descriptor_sets: Vec<String>,
    /// Warm-up seconds (not measured).
    pub warmup_s: f64,
    /// The measured window in seconds.
    pub duration_s: f64,
    /// Calls that started and finished inside the window.
    pub calls: u64,
    /// `calls / duration_s`.
    pub calls_per_s: f64,
    /// Calls answered `OK`.
    pub ok: u64,
    /// Calls answered `OVER_LIMIT`.
    pub over_limit: u64,
    /// `over_limit / calls`.
    pub over_limit_fraction: f64,
    /// Calls that failed (a gRPC error, or an `UNKNOWN` overall code).
    pub errors: u64,
    /// One error message, when there were errors.
    pub first_error: Option<String>,
    /// Per-call latency over the window (every counted call, errors included).
    pub latency_us: Latency,
    /// CPU time (user + system) this client process spent over the window; `None` without `/proc`.
    pub client_cpu: Option<CpuUse>,
    /// The same for the `--server-pid` process.
    pub server_cpu: Option<CpuUse>,
    /// The same for the `--other-pid` process.
    pub other_cpu: Option<CpuUse>,
}

/// CPU time a process spent over the measured window.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CpuUse {
    /// CPU seconds / window seconds (1.0 = one core busy all along).
    pub cores: f64,
    /// CPU microseconds per counted call.
    pub us_per_call: f64,
}

/// User + system CPU time of process `pid` (`"self"` for this one) from `/proc/<pid>/stat`, in
/// clock ticks of 10 ms (USER_HZ is 100 on Linux); `None` where that cannot be read.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesised and may hold spaces; fields restart after it,
    // with the state (field 3) first, so utime (14) and stime (15) are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn cpu_use(before: Option<u64>, after: Option<u64>, window: f64, calls: u64) -> Option<CpuUse> {
    let secs = after?.checked_sub(before?)? as f64 / 100.0;
    Some(CpuUse {
        cores: secs / window,
        us_per_call: if calls == 0 {
            0.0
        } else {
            secs * 1e6 / calls as f64
        },
    })
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.latency_us;
        writeln!(
            f,
            "{} domain={} client={:?} streams={} channels={} threads={} keys={} window={:.1}s",
            self.target,
            self.domain,
            self.client,
            self.streams,
            self.channels,
            self.threads,
            self.keys,
            self.duration_s
        )?;
        writeln!(
            f,
            "calls={} calls/s={:.0} ok={} over_limit={} ({:.2}%) errors={}",
            self.calls,
            self.calls_per_s,
            self.ok,
            self.over_limit,
            100.0 * self.over_limit_fraction,
            self.errors
        )?;
        write!(
            f,
            "latency us: p50={:.1} p90={:.1} p99={:.1} p99.9={:.1} max={:.1} mean={:.1}",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        )?;
        for (who, cpu) in [
            ("client", self.client_cpu),
            ("server", self.server_cpu),
            ("other", self.other_cpu),
        ] {
            if let Some(c) = cpu {
                write!(
                    f,
                    "\n{who} cpu: {:.2} cores, {:.1} us/call",
                    c.cores, c.us_per_call
                )?;
            }
        }
        if let Some(e) = &self.first_error {
            write!(f, "\nfirst error: {e}")?;
        }
        Ok(())
    }
}

/// One descriptor entry template: `key`, and the value split around `{key}`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct EntryTemplate {
    key: String,
    /// The value's literal pieces; between consecutive pieces goes the key index.
    pieces: Vec<String>,
}

/// One descriptor's entry templates, in order.
type DescriptorTemplate = Vec<EntryTemplate>;

const DEFAULT_DESCRIPTOR: &str = "remote_address=10.0.0.{key}";

/// One `key=value` entry.
fn parse_entry(s: &str) -> Result<EntryTemplate, LoadError> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| LoadError::Args(format!("descriptor `{s}` is not key=value")))?;
    if key.is_empty() {
        return Err(LoadError::Args(format!(
            "descriptor `{s}` has an empty key"
        )));
    }
    Ok(EntryTemplate {
        key: key.to_owned(),
        pieces: value.split("{key}").map(str::to_owned).collect(),
    })
}

/// The `--descriptor` entries (the default one when none is given) as one descriptor.
fn parse_entries(given: &[String]) -> Result<DescriptorTemplate, LoadError> {
    if given.is_empty() {
        return Ok(vec![parse_entry(DEFAULT_DESCRIPTOR)?]);
    }
    given.iter().map(|s| parse_entry(s)).collect()
}

/// Each call's descriptors: one per `--descriptor-set` (its entries split at `,`), or the one
/// `--descriptor` builds. `--keys` above 1 needs `{key}` in some value, or every key index would
/// be the same request.
fn parse_descriptors(
    entries: &[String],
    sets: &[String],
    keys: u64,
) -> Result<Vec<DescriptorTemplate>, LoadError> {
    let descriptors = if sets.is_empty() {
        vec![parse_entries(entries)?]
    } else {
        if !entries.is_empty() {
            return Err(LoadError::Args(
                "--descriptor and --descriptor-set do not go together".into(),
            ));
        }
        sets.iter()
            .map(|set| {
                if set.is_empty() {
                    return Err(LoadError::Args("an empty --descriptor-set".into()));
                }
                set.split(',').map(parse_entry).collect()
            })
            .collect::<Result<_, _>>()?
    };
    if keys > 1 && descriptors.iter().flatten().all(|t| t.pieces.len() == 1) {
        return Err(LoadError::Args(
            "--keys > 1 needs `{key}` in a descriptor value".into(),
        ));
    }
    Ok(descriptors)
}

/// The request for key index `index`: one descriptor per template, in order.
fn build_request(
    domain: &str,
    descriptors: &[DescriptorTemplate],
    hits: u32,
    index: u64,
) -> RateLimitRequest {
    let index = index.to_string();
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|t| Entry {
                        key: t.key.clone(),
                        value: t.pieces.join(&index),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// The gRPC method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One connection's way of making a call, cloned into each task that uses the connection.
#[derive(Clone)]
enum Caller {
    Tonic {
        client: RateLimitServiceClient<Channel>,
        domain: Arc<str>,
        descriptors: Arc<[DescriptorTemplate]>,
        hits: u32,
    },
    H2 {
        send: h2::client::SendRequest<Bytes>,
        uri: http::Uri,
        /// Each key index's request, as a gRPC message frame.
        frames: Arc<[Bytes]>,
    },
}

impl Caller {
    /// One call for key index `index`: the answer's `overall_code`, or what went wrong.
    async fn call(&mut self, index: u64) -> Result<i32, String> {
        match self {
            Caller::Tonic {
                client,
                domain,
                descriptors,
                hits,
            } => {
                let request = build_request(domain, descriptors, *hits, index);
                client
                    .should_rate_limit(request)
                    .await
                    .map(|r| r.into_inner().overall_code)
                    .map_err(|status| status.to_string())
            }
            Caller::H2 { send, uri, frames } => {
                let frame = usize::try_from(index)
                    .ok()
                    .and_then(|i| frames.get(i))
                    .cloned()
                    .ok_or("no request for this key")?;
                h2_call(send, uri, frame).await
            }
        }
    }
}

/// One unary call as one HTTP/2 stream.
async fn h2_call(
    send: &mut h2::client::SendRequest<Bytes>,
    uri: &http::Uri,
    frame: Bytes,
) -> Result<i32, String> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    std::future::poll_fn(|cx| send.poll_ready(cx))
        .await
        .map_err(|e| e.to_string())?;
    let (response, mut body) = send
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    body.send_data(frame, true).map_err(|e| e.to_string())?;
    let (head, mut recv) = response.await.map_err(|e| e.to_string())?.into_parts();
    if !head.status.is_success() {
        return Err(format!("HTTP status {}", head.status));
    }
    // A trailers-only answer (an error) carries grpc-status in the headers.
    grpc_status(&head.headers)?;
    let mut message = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await.map_err(|e| e.to_string())?;
    match trailers {
        Some(trailers) => grpc_status(&trailers)?,
        None if head.headers.contains_key("grpc-status") => {}
        None => return Err("no grpc-status".into()),
    }
    let body = message
        .get(5..)
        .filter(|_| message[0] == 0)
        .ok_or("not one uncompressed gRPC message")?;
    RateLimitResponse::decode(body)
        .map(|r| r.overall_code)
        .map_err(|e| format!("undecodable answer: {e}"))
}

/// `Err` with the status and message unless `grpc-status` is absent or 0.
fn grpc_status(headers: &http::HeaderMap) -> Result<(), String> {
    match headers.get("grpc-status").map(http::HeaderValue::as_bytes) {
        None | Some(b"0") => Ok(()),
        Some(code) => Err(format!(
            "grpc-status {}: {}",
            String::from_utf8_lossy(code),
            headers
                .get("grpc-message")
                .map(|m| percent_decoded(m.as_bytes()))
                .unwrap_or_default()
        )),
    }
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2); invalid escapes are kept as they are.
fn percent_decoded(text: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let escaped = (text[i] == b'%')
            .then(|| Some(hex(*text.get(i + 1)?)? * 16 + hex(*text.get(i + 2)?)?))
            .flatten();
        match escaped.and_then(|v| u8::try_from(v).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `request` as a gRPC message frame: not compressed, the length, the message.
fn grpc_frame(request: &RateLimitRequest) -> Result<Bytes, LoadError> {
    let message = request.encode_to_vec();
    let len =
        u32::try_from(message.len()).map_err(|_| LoadError::Args("a request over 4 GiB".into()))?;
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.extend_from_slice(&[0]);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&message);
    Ok(frame.freeze())
}

/// `channels` connections to the target, each as a [`Caller`] of the kind asked for.
async fn connect(
    args: &LoadArgs,
    channels: usize,
    descriptors: &[DescriptorTemplate],
) -> Result<Vec<Caller>, LoadError> {
    let connect_error = |e: &dyn fmt::Display| LoadError::Connect(format!("{}: {e}", args.target));
    let mut callers = Vec::with_capacity(channels);
    match args.client {
        ClientKind::Tonic => {
            let endpoint = Endpoint::from_shared(args.target.clone())
                .map_err(|e| LoadError::Args(format!("--target: {e}")))?
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(5));
            let (domain, descriptors): (Arc<str>, Arc<[DescriptorTemplate]>) =
                (args.domain.as_str().into(), descriptors.into());
            for _ in 0..channels {
                let channel: Channel = endpoint.connect().await.map_err(|e| connect_error(&e))?;
                callers.push(Caller::Tonic {
                    client: RateLimitServiceClient::new(channel),
                    domain: Arc::clone(&domain),
                    descriptors: Arc::clone(&descriptors),
                    hits: args.hits,
                });
            }
        }
        ClientKind::H2 => {
            let target: http::Uri = args
                .target
                .parse()
                .map_err(|e| LoadError::Args(format!("--target: {e}")))?;
            if target.scheme_str() != Some("http") {
                return Err(LoadError::Args(
                    "--target: the h2 client speaks plain http:// (no TLS)".into(),
                ));
            }
            let authority = target
                .authority()
                .ok_or_else(|| LoadError::Args("--target has no host:port".into()))?
                .clone();
            let uri = http::Uri::builder()
                .scheme("http")
                .authority(authority.clone())
                .path_and_query(SHOULD_RATE_LIMIT)
                .build()
                .map_err(|e| LoadError::Args(format!("--target: {e}")))?;
            let frames: Arc<[Bytes]> = (0..args.keys)
                .map(|i| grpc_frame(&build_request(&args.domain, descriptors, args.hits, i)))
                .collect::<Result<_, _>>()?;
            let addr = format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            );
            for _ in 0..channels {
                let tcp = tokio::time::timeout(
                    Duration::from_secs(5),
                    tokio::net::TcpStream::connect(&addr),
                )
                .await
                .map_err(|e| connect_error(&e))?
                .map_err(|e| connect_error(&e))?;
                tcp.set_nodelay(true).map_err(|e| connect_error(&e))?;
                // Windows large enough that flow control never holds a call back.
                let (send, connection) = h2::client::Builder::new()
                    .initial_window_size(1 << 20)
                    .initial_connection_window_size(1 << 24)
                    .handshake::<_, Bytes>(tcp)
                    .await
                    .map_err(|e| connect_error(&e))?;
                tokio::spawn(async move {
                    // Ends when every sender is dropped or the connection fails (calls then
                    // report the error).
                    let _ = connection.await;
                });
                callers.push(Caller::H2 {
                    send,
                    uri: uri.clone(),
                    frames: Arc::clone(&frames),
                });
            }
        }
    }
    Ok(callers)
}

/// One task's tallies.
struct Tally {
    histogram: Histogram<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
}

/// 1 ns .. 60 s at 3 significant digits (longer calls are recorded as 60 s).
fn histogram() -> Result<Histogram<u64>, LoadError> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| LoadError::Args(format!("histogram: {e}")))
}

/// Runs the load on its own runtime and returns (and, with `--json`, writes) the report.
///
/// # Errors
/// [`LoadError`]: bad arguments, no runtime, a channel that does not connect, an unwritable
/// report. Failed calls are counted in the report, not returned as errors.
pub fn run(args: &LoadArgs) -> Result<LoadReport, LoadError> {
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if threads == 0 {
        return Err(LoadError::Args("--threads must be at least 1".into()));
    }
    // One thread: a current-thread runtime (no work-stealing bookkeeping), as the server's
    // `--workers 1`.
    let mut runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    let runtime = runtime.enable_all().build().map_err(LoadError::Runtime)?;
    let report = runtime.block_on(drive(args, threads))?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| LoadError::Output(std::io::Error::other(e)))?;
        std::fs::write(path, text + "\n").map_err(LoadError::Output)?;
    }
    Ok(report)
}

async fn drive(args: &LoadArgs, threads: usize) -> Result<LoadReport, LoadError> {
    if args.streams == 0 {
        return Err(LoadError::Args("--streams must be at least 1".into()));
    }
    if args.keys == 0 {
        return Err(LoadError::Args("--keys must be at least 1".into()));
    }
    if args.duration.is_zero() {
        return Err(LoadError::Args("--duration must be positive".into()));
    }
    let descriptors = parse_descriptors(&args.descriptor, &args.descriptor_set, args.keys)?;
    let channels = args.channels.unwrap_or(args.streams.min(4));
    if channels == 0 {
        return Err(LoadError::Args("--channels must be at least 1".into()));
    }
    let callers = connect(args, channels, &descriptors).await?;

    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let streams = args.streams as u64;
    let mut tasks = Vec::with_capacity(args.streams);
    for task in 0..args.streams {
        let mut caller = callers[task % channels].clone();
        let keys = args.keys;
        let histogram = histogram()?;
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally {
                histogram,
                ok: 0,
                over_limit: 0,
                errors: 0,
                first_error: None,
            };
            let mut n = task as u64;
            loop {
                let index = n % keys;
                n = n.wrapping_add(streams);
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let result = caller.call(index).await;
                let t1 = Instant::now();
                if t0 < measure_from || t1 > end {
                    continue;
                }
                tally
                    .histogram
                    .saturating_record(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
                match result {
                    Ok(c) if c == Code::Ok as i32 => tally.ok += 1,
                    Ok(c) if c == Code::OverLimit as i32 => tally.over_limit += 1,
                    Ok(c) => {
                        tally.errors += 1;
                        tally
                            .first_error
                            .get_or_insert_with(|| format!("overall_code {c}"));
                    }
                    Err(e) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert(e);
                    }
                }
            }
            tally
        }));
    }
    // CPU use over the window: read at its two ends while the tasks run.
    let server = args.server_pid.map(|p| p.to_string());
    let other = args.other_pid.map(|p| p.to_string());
    let read_cpu = || {
        (
            cpu_ticks("self"),
            server.as_deref().and_then(cpu_ticks),
            other.as_deref().and_then(cpu_ticks),
        )
    };
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = read_cpu();
    tokio::time::sleep_until(end.into()).await;
    let cpu_after = read_cpu();
    let mut total = histogram()?;
    let (mut ok, mut over_limit, mut errors, mut first_error) = (0, 0, 0, None);
    for task in tasks {
        let tally = task
            .await
            .map_err(|e| LoadError::Args(format!("a load task failed: {e}")))?;
        // Same bounds on both sides, so adding cannot fail.
        let _ = total.add(&tally.histogram);
        ok += tally.ok;
        over_limit += tally.over_limit;
        errors += tally.errors;
        if first_error.is_none() {
            first_error = tally.first_error;
        }
    }
    let calls = ok + over_limit + errors;
    let secs = args.duration.as_secs_f64();
    let us = |ns: u64| ns as f64 / 1_000.0;
    Ok(LoadReport {
        target: args.target.clone(),
        domain: args.domain.clone(),
        streams: args.streams,
        channels,
        client: args.client,
        threads,
        keys: args.keys,
        descriptor: if args.descriptor.is_empty() && args.descriptor_set.is_empty() {
            vec![DEFAULT_DESCRIPTOR.to_owned()]
        } else {
            args.descriptor.clone()
        },
        descriptor_sets: args.descriptor_set.clone(),
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: secs,
        calls,
        calls_per_s: calls as f64 / secs,
        ok,
        over_limit,
        over_limit_fraction: if calls == 0 {
            0.0
        } else {
            over_limit as f64 / calls as f64
        },
        errors,
        first_error,
        latency_us: Latency {
            min: us(total.min()),
            mean: total.mean() / 1_000.0,
            p50: us(total.value_at_quantile(0.50)),
            p90: us(total.value_at_quantile(0.90)),
            p99: us(total.value_at_quantile(0.99)),
            p999: us(total.value_at_quantile(0.999)),
            max: us(total.max()),
        },
        client_cpu: cpu_use(cpu_before.0, cpu_after.0, secs, calls),
        server_cpu: cpu_use(cpu_before.1, cpu_after.1, secs, calls),
        other_cpu: cpu_use(cpu_before.2, cpu_after.2, secs, calls),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decoded(b"unknown%20domain%20%60nope%60"),
            "unknown domain `nope`"
        );
        assert_eq!(percent_decoded(b"100%"), "100%");
        assert_eq!(percent_decoded(b"%zz%4"), "%zz%4");
        assert_eq!(percent_decoded(b"%C3%A9"), "\u{e9}");
    }

    #[test]
    fn descriptor_templates_substitute_the_key_index() {
        let entries = parse_entries(&["route=/api".into(), "user=u{key}-{key}".into()]).unwrap();
        let r = build_request("edge", &[entries], 3, 42);
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 3);
        let e = &r.descriptors[0].entries;
        assert_eq!((e[0].key.as_str(), e[0].value.as_str()), ("route", "/api"));
        assert_eq!((e[1].key.as_str(), e[1].value.as_str()), ("user", "u42-42"));
        let default = parse_entries(&[]).unwrap();
        let r = build_request("edge", &[default], 0, 7);
        assert_eq!(r.descriptors[0].entries[0].value, "10.0.0.7");
        assert!(matches!(
            parse_entries(&["novalue".into()]),
            Err(LoadError::Args(_))
        ));
        assert!(matches!(
            parse_entries(&["=v".into()]),
            Err(LoadError::Args(_))
        ));
    }

    /// As Envoy sends them for a route with three `rate_limits` actions: one descriptor each.
    #[test]
    fn descriptor_sets_make_one_descriptor_each_with_the_same_key_index() {
        let sets = [
            "remote_address=10.0.0.{key}".to_owned(),
            "remote_address=10.0.0.{key},path=/api/items".to_owned(),
            "generic_key=global".to_owned(),
        ];
        let descriptors = parse_descriptors(&[], &sets, 100).unwrap();
        let r = build_request("edge", &descriptors, 0, 5);
        let got: Vec<Vec<(&str, &str)>> = r
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect()
            })
            .collect();
        assert_eq!(
            got,
            [
                vec![("remote_address", "10.0.0.5")],
                vec![("remote_address", "10.0.0.5"), ("path", "/api/items")],
                vec![("generic_key", "global")],
            ]
        );
        // Without sets: the one `--descriptor` descriptor (or the default).
        let one = parse_descriptors(&["user=u{key}".into()], &[], 2).unwrap();
        assert_eq!(build_request("edge", &one, 0, 1).descriptors.len(), 1);
        let args_error = |r: Result<_, LoadError>| matches!(r, Err(LoadError::Args(_)));
        assert!(args_error(parse_descriptors(&["a=1".into()], &sets, 1)));
        assert!(args_error(parse_descriptors(&[], &[String::new()], 1)));
        assert!(args_error(parse_descriptors(
            &[],
            &["a=1,novalue".into()],
            1
        )));
        assert!(args_error(parse_descriptors(&[], &["a=1,=2".into()], 1)));
        // More than one key index, and no `{key}` anywhere: every call would be the same.
        assert!(args_error(parse_descriptors(
            &[],
            &["a=1".into(), "b=2".into()],
            2
        )));
    }

    #[test]
    fn descriptor_set_repeats_on_the_command_line_and_excludes_descriptor() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let cli = Cli::try_parse_from([
            "rls-load",
            "--descriptor-set",
            "remote_address=10.0.0.{key}",
            "--descriptor-set",
            "generic_key=global",
        ])
        .unwrap();
        assert_eq!(
            cli.load.descriptor_set,
            ["remote_address=10.0.0.{key}", "generic_key=global"]
        );
        assert!(
            Cli::try_parse_from(["rls-load", "--descriptor", "a=1", "--descriptor-set", "b=2"])
                .is_err()
        );
    }
}
