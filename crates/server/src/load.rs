//! `tollgate-server load`: a closed-loop gRPC load client for `ShouldRateLimit`.
//!
//! `--streams N` tokio tasks each keep one unary call in flight (send, await the answer, send the
//! next), spread round-robin over `--channels` HTTP/2 connections (tonic `Channel`s). One channel
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
//! Each call carries one descriptor built from `--descriptor key=value` entries (in order); a
//! value's `{key}` is replaced by the call's key index, cycling through `0..--keys`, so `--keys N`
//! spreads the load over N limiter keys.
//!
//! The report also gives the CPU time this client and (with `--server-pid`) the server spent over
//! the window, from `/proc/<pid>/stat`: on a machine the two share, the server's CPU per call is
//! what its throughput on dedicated cores would follow.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

/// The `load` subcommand's arguments.
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
    /// `RateLimitRequest.hits_addend` (0 means 1).
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    /// Client runtime worker threads (default: the machine's cores).
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
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s).map_err(|e| e.to_string())
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
    /// Client runtime worker threads.
    pub threads: usize,
    /// Distinct key indices.
    pub keys: u64,
    /// The descriptor's entries as given.
    pub descriptor: Vec<String>,
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
            "{} domain={} streams={} channels={} threads={} keys={} window={:.1}s",
            self.target,
            self.domain,
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

const DEFAULT_DESCRIPTOR: &str = "remote_address=10.0.0.{key}";

fn parse_entries(given: &[String]) -> Result<Vec<EntryTemplate>, LoadError> {
    let default = [DEFAULT_DESCRIPTOR.to_owned()];
    let given = if given.is_empty() {
        &default[..]
    } else {
        given
    };
    given
        .iter()
        .map(|s| {
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
        })
        .collect()
}

/// The request for key index `index`.
fn build_request(
    domain: &str,
    entries: &[EntryTemplate],
    hits: u32,
    index: u64,
) -> RateLimitRequest {
    let index = index.to_string();
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|t| Entry {
                    key: t.key.clone(),
                    value: t.pieces.join(&index),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: hits,
    }
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(LoadError::Runtime)?;
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
    let entries = parse_entries(&args.descriptor)?;
    if args.keys > 1 && entries.iter().all(|t| t.pieces.len() == 1) {
        return Err(LoadError::Args(
            "--keys > 1 needs `{key}` in a --descriptor value".into(),
        ));
    }
    let channels = args.channels.unwrap_or(args.streams.min(4));
    if channels == 0 {
        return Err(LoadError::Args("--channels must be at least 1".into()));
    }
    let endpoint = Endpoint::from_shared(args.target.clone())
        .map_err(|e| LoadError::Args(format!("--target: {e}")))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut clients = Vec::with_capacity(channels);
    for _ in 0..channels {
        let channel: Channel = endpoint
            .connect()
            .await
            .map_err(|e| LoadError::Connect(format!("{}: {e}", args.target)))?;
        clients.push(RateLimitServiceClient::new(channel));
    }

    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let streams = args.streams as u64;
    let mut tasks = Vec::with_capacity(args.streams);
    for task in 0..args.streams {
        let mut client = clients[task % channels].clone();
        let entries = entries.clone();
        let domain = args.domain.clone();
        let (hits, keys) = (args.hits, args.keys);
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
                let request = build_request(&domain, &entries, hits, n % keys);
                n = n.wrapping_add(streams);
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let result = client.should_rate_limit(request).await;
                let t1 = Instant::now();
                if t0 < measure_from || t1 > end {
                    continue;
                }
                tally
                    .histogram
                    .saturating_record(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
                match result.map(|r| r.into_inner().overall_code) {
                    Ok(c) if c == Code::Ok as i32 => tally.ok += 1,
                    Ok(c) if c == Code::OverLimit as i32 => tally.over_limit += 1,
                    Ok(c) => {
                        tally.errors += 1;
                        tally
                            .first_error
                            .get_or_insert_with(|| format!("overall_code {c}"));
                    }
                    Err(status) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert_with(|| status.to_string());
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
        threads,
        keys: args.keys,
        descriptor: if args.descriptor.is_empty() {
            vec![DEFAULT_DESCRIPTOR.to_owned()]
        } else {
            args.descriptor.clone()
        },
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
    fn descriptor_templates_substitute_the_key_index() {
        let entries = parse_entries(&["route=/api".into(), "user=u{key}-{key}".into()]).unwrap();
        let r = build_request("edge", &entries, 3, 42);
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 3);
        let e = &r.descriptors[0].entries;
        assert_eq!((e[0].key.as_str(), e[0].value.as_str()), ("route", "/api"));
        assert_eq!((e[1].key.as_str(), e[1].value.as_str()), ("user", "u42-42"));
        let default = parse_entries(&[]).unwrap();
        let r = build_request("edge", &default, 0, 7);
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
}
