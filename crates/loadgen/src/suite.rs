//! The throughput suite and the accuracy mode, from parsed arguments to files on disk.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::accuracy::{self, AccuracyConfig};
use crate::cli::{AccuracyArgs, LoopChoice, RunArgs};
use crate::keys::{self, KeyDist};
use crate::machine::{self, Machine};
use crate::progress::Progress;
use crate::report::{self, Header, Record, SuiteFile};
use crate::runner::{self, LoopMode, RunConfig, Timer};
use crate::targets::{self, BuildError, Impl, QuotaMode, Target, TargetInfo, Visit};

/// Why the suite stopped.
#[derive(Debug)]
pub enum SuiteError {
    /// Bad arguments.
    Usage(String),
    /// An implementation could not be built.
    Build(BuildError),
    /// Writing outputs failed.
    Io(io::Error),
}

impl std::fmt::Display for SuiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuiteError::Usage(m) => write!(f, "{m}"),
            SuiteError::Build(e) => write!(f, "{e}"),
            SuiteError::Io(e) => write!(f, "writing the report: {e}"),
        }
    }
}

impl std::error::Error for SuiteError {}

impl From<io::Error> for SuiteError {
    fn from(e: io::Error) -> Self {
        SuiteError::Io(e)
    }
}

impl From<BuildError> for SuiteError {
    fn from(e: BuildError) -> Self {
        SuiteError::Build(e)
    }
}

/// One planned run.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Implementation.
    pub imp: Impl,
    /// Quota mode.
    pub quota: QuotaMode,
    /// Key distribution.
    pub keys: KeyDist,
    /// Threads.
    pub threads: usize,
    /// Loop.
    pub mode: LoopMode,
}

/// Expands the arguments into runs: every (quota, distribution, implementation, threads) in closed
/// loop (unkeyed implementations only on `single`), plus, for `--loop both`, one open-loop run per
/// implementation (allow quota, its first distribution, the fewest threads).
///
/// # Errors
/// Unknown implementation names, or no thread counts.
pub fn plan(args: &RunArgs) -> Result<Vec<Planned>, SuiteError> {
    let mut impls: Vec<Impl> = Vec::new();
    for name in &args.impls {
        for imp in Impl::resolve(name).map_err(|e| SuiteError::Usage(e.to_string()))? {
            if !impls.contains(&imp) {
                impls.push(imp);
            }
        }
    }
    if args.threads.is_empty() || args.threads.contains(&0) {
        return Err(SuiteError::Usage(
            "--threads needs counts of at least 1".into(),
        ));
    }
    if !(args.rate.is_finite() && args.rate > 0.0) {
        return Err(SuiteError::Usage("--rate must be positive".into()));
    }
    let dists_for = |imp: Impl| -> Vec<KeyDist> {
        if imp.keyed() {
            args.keys.clone()
        } else {
            vec![KeyDist::Single]
        }
    };
    let mut out = Vec::new();
    if args.loop_mode != LoopChoice::Open {
        for &quota in &args.quota {
            for imp in &impls {
                for keys in dists_for(*imp) {
                    for &threads in &args.threads {
                        out.push(Planned {
                            imp: *imp,
                            quota,
                            keys,
                            threads,
                            mode: LoopMode::Closed,
                        });
                    }
                }
            }
        }
    }
    if args.loop_mode != LoopChoice::Closed {
        let open = LoopMode::Open { rate: args.rate };
        for imp in &impls {
            let dists = dists_for(*imp);
            let runs: Vec<(KeyDist, usize)> = if args.loop_mode == LoopChoice::Open {
                dists
                    .iter()
                    .flat_map(|d| args.threads.iter().map(move |&t| (*d, t)))
                    .collect()
            } else {
                let keys = dists
                    .iter()
                    .copied()
                    .find(|d| *d != KeyDist::Single)
                    .unwrap_or(KeyDist::Single);
                vec![(keys, args.threads.iter().copied().min().unwrap_or(1))]
            };
            for (keys, threads) in runs {
                out.push(Planned {
                    imp: *imp,
                    quota: QuotaMode::Allow,
                    keys,
                    threads,
                    mode: open,
                });
            }
        }
    }
    Ok(out)
}

/// Measures one run.
struct Measure<'a> {
    planned: &'a Planned,
    cfg: RunConfig,
    streams: &'a [Vec<u64>],
    timer: &'a Timer,
    tick: &'a mut dyn FnMut(f64),
}

impl Visit for Measure<'_> {
    type Out = (runner::RunResult, TargetInfo);
    fn visit<T: Target>(self, target: &T, info: &TargetInfo) -> Self::Out {
        if self.planned.imp.keyed() {
            prefill(target, self.planned.keys.key_count());
        }
        (
            runner::run(target, &self.cfg, self.streams, self.timer, self.tick),
            info.clone(),
        )
    }
}

/// Decides every key of `0..keys` once, so that the table holds the whole key space before the
/// warm-up and no first-touch insert is timed. (In deny mode this also spends each key's one
/// admission: the measured decisions are then all denials, the read path the mode is for.)
fn prefill<T: Target>(target: &T, keys: u64) {
    for key in 0..keys {
        std::hint::black_box(target.decide(key));
    }
}

/// Touches keys `0..keys` once each and returns heap bytes per key, measured from before the
/// target was built.
struct BytesPerKey {
    keys: u64,
    before: Option<usize>,
}

impl Visit for BytesPerKey {
    type Out = Option<f64>;
    fn visit<T: Target>(self, target: &T, _: &TargetInfo) -> Option<f64> {
        for k in 0..self.keys {
            std::hint::black_box(target.decide(k));
        }
        let after = crate::alloc::allocated_bytes()?;
        Some(after.saturating_sub(self.before?) as f64 / self.keys as f64)
    }
}

fn scenario_name(p: &Planned) -> (String, String) {
    let loop_mode = match p.mode {
        LoopMode::Closed => "closed".to_owned(),
        LoopMode::Open { rate } => format!("open:{rate:.0}"),
    };
    (format!("{loop_mode}/{}/{}", p.quota, p.keys), loop_mode)
}

/// Runs the suite, prints the summary, writes the outputs; returns the records.
///
/// # Errors
/// Bad arguments, an implementation that cannot be built, or an output that cannot be written.
pub fn run_suite(args: &RunArgs, command: &str) -> Result<Vec<Record>, SuiteError> {
    let planned = plan(args)?;
    if args.repeat == 0 {
        return Err(SuiteError::Usage("--repeat needs at least 1".into()));
    }
    let loadavg_before = machine::loadavg();
    let timer = Timer::calibrate();
    let stream_len = args.stream_len.max(1);
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    // One set of per-thread streams per distribution, built once (a covering Zipf stream over 1 M
    // keys is 8 M keys per thread).
    let mut streams_by_dist: Vec<(KeyDist, Vec<Vec<u64>>)> = Vec::new();
    for p in &planned {
        if !streams_by_dist.iter().any(|(d, _)| *d == p.keys) {
            let streams = (0..max_threads as u64)
                .map(|t| p.keys.stream(stream_len, args.seed.wrapping_add(t)))
                .collect();
            streams_by_dist.push((p.keys, streams));
        }
    }
    let run_secs = (args.warmup + args.duration).as_secs_f64();
    let total_runs = planned.len() * args.repeat;
    let progress = Progress::new(total_runs, run_secs);
    let mut bytes_cache: Vec<((Impl, u64), Option<f64>)> = Vec::new();
    // Every repetition of every planned run, indexed like `planned`.
    let mut results: Vec<Vec<(runner::RunResult, TargetInfo)>> = vec![Vec::new(); planned.len()];
    let mut done = 0usize;
    for rep in 0..args.repeat {
        // Odd repetitions walk the plan backwards, so slow drift of the machine (load, heat) does not
        // always favour the same rows.
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..planned.len()).collect()
        } else {
            (0..planned.len()).rev().collect()
        };
        for i in order {
            let p = &planned[i];
            let (scenario, _) = scenario_name(p);
            let repetition = if args.repeat > 1 {
                format!(", repetition {}/{}", rep + 1, args.repeat)
            } else {
                String::new()
            };
            let threads = if p.threads == 1 { "thread" } else { "threads" };
            progress.start(
                done,
                &format!("{} {scenario} {} {threads}{repetition}", p.imp, p.threads),
            );
            let streams = streams_by_dist
                .iter()
                .find(|(d, _)| *d == p.keys)
                .map(|(_, s)| s.as_slice())
                .unwrap_or_default();
            let cfg = RunConfig {
                threads: p.threads,
                duration: args.duration,
                warmup: args.warmup,
                mode: p.mode,
                batch: args.batch.max(1),
                pin: !args.no_pin,
            };
            let mut tick = |f: f64| progress.tick(done, f);
            let measured = targets::build(
                p.imp,
                p.quota,
                args.clock,
                p.keys.key_count(),
                Measure {
                    planned: p,
                    cfg,
                    streams,
                    timer: &timer,
                    tick: &mut tick,
                },
            )?;
            results[i].push(measured);
            done += 1;
        }
    }
    let mut records = Vec::new();
    for (p, runs) in planned.iter().zip(results) {
        let (scenario, loop_mode) = scenario_name(p);
        let streams = streams_by_dist
            .iter()
            .find(|(d, _)| *d == p.keys)
            .map(|(_, s)| s.as_slice())
            .unwrap_or_default();
        let used = &streams[..p.threads.min(streams.len())];
        let stream_keys = used
            .iter()
            .map(|s| keys::distinct_keys(s, p.keys.key_count()))
            .min()
            .unwrap_or(0);
        let stream_len = used.iter().map(|s| s.len() as u64).min().unwrap_or(0);
        let ns_per_decision_runs: Vec<f64> = runs.iter().map(|(r, _)| r.ns_per_decision).collect();
        let mut by_speed: Vec<usize> = (0..runs.len()).collect();
        by_speed.sort_by(|&a, &b| ns_per_decision_runs[a].total_cmp(&ns_per_decision_runs[b]));
        let Some((result, info)) = by_speed.get(by_speed.len() / 2).map(|&m| runs[m].clone())
        else {
            continue;
        };
        let bytes_per_key = if p.imp.keyed() && p.keys.key_count() > 1 {
            let key = (p.imp, p.keys.key_count());
            match bytes_cache.iter().find(|(k, _)| *k == key) {
                Some((_, b)) => *b,
                None => {
                    let b = targets::build(
                        p.imp,
                        QuotaMode::Allow,
                        args.clock,
                        p.keys.key_count(),
                        BytesPerKey {
                            keys: p.keys.key_count(),
                            before: crate::alloc::allocated_bytes(),
                        },
                    )?;
                    bytes_cache.push((key, b));
                    b
                }
            }
        } else {
            None
        };
        records.push(Record {
            imp: p.imp.name().into(),
            algorithm: p.imp.algorithm().into(),
            family: format!("{:?}", p.imp.family()).to_lowercase(),
            scenario,
            loop_mode,
            quota_mode: p.quota.to_string(),
            quota: info.quota,
            key_dist: p.keys.to_string(),
            keys: p.keys.key_count(),
            threads: result.threads,
            pinned: result.pinned,
            oversubscribed: result.oversubscribed,
            clock: args.clock.to_string(),
            ns_per_decision: result.ns_per_decision,
            ns_per_decision_mean: result.ns_per_decision_mean,
            decisions_per_sec: result.decisions_per_sec,
            p50_ns: result.p50_ns,
            p99_ns: result.p99_ns,
            p999_ns: result.p999_ns,
            p9999_ns: result.p9999_ns,
            max_ns: result.max_ns,
            allowed_fraction: result.allowed as f64 / result.decisions.max(1) as f64,
            bytes_per_key,
            decisions: result.decisions,
            samples: result.samples,
            percentiles: result.percentiles,
            prefilled: p.imp.keyed(),
            stream_len,
            stream_keys,
            ns_per_decision_runs,
        });
    }
    progress.finish();
    let header = Header {
        tool: format!("tollgate-bench {}", env!("CARGO_PKG_VERSION")),
        command: command.to_owned(),
        machine: Machine::collect(),
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        batch: args.batch.max(1),
        timer_overhead_ns: timer.overhead_ns,
        timer_is_tsc: timer.tsc,
        loadavg_before,
        loadavg_after: machine::loadavg(),
        layout: targets::layout(),
    };
    write_suite(args, &header, &records)?;
    println!("{}", report::summary_table(&records));
    println!(
        "timer: {} ns per pair of reads subtracted from latency samples ({}); load average {} -> {}",
        header.timer_overhead_ns,
        if header.timer_is_tsc {
            "TSC"
        } else {
            "OS clock"
        },
        header.loadavg_before,
        header.loadavg_after
    );
    if !header.machine.release_build {
        println!("warning: debug build; run with --release for meaningful numbers");
    }
    println!("report: {}", args.out.join("report.md").display());
    Ok(records)
}

fn write_suite(args: &RunArgs, header: &Header, records: &[Record]) -> Result<(), SuiteError> {
    fs::create_dir_all(&args.out)?;
    let file = SuiteFile { header, records };
    let json = serde_json::to_string_pretty(&file).map_err(io::Error::other)?;
    fs::write(args.out.join("suite.json"), &json)?;
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, &json)?;
    }
    write_report(&args.out, header, records, !args.no_plots)
}

/// Rewrites `report.md` and the plots in `out` from a suite JSON.
///
/// # Errors
/// The JSON cannot be read or parsed, or an output cannot be written.
pub fn rewrite_report(json: &Path, out: Option<&Path>) -> Result<(), SuiteError> {
    let text = fs::read_to_string(json)?;
    let file: report::OwnedSuiteFile = serde_json::from_str(&text).map_err(io::Error::other)?;
    let out = out
        .map(Path::to_path_buf)
        .or_else(|| json.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    fs::create_dir_all(&out)?;
    write_report(&out, &file.header, &file.records, true)?;
    println!("{}", report::summary_table(&file.records));
    println!("report: {}", out.join("report.md").display());
    Ok(())
}

/// Writes (and prints) [`report::ratios_across`] over the suite JSONs in `jsons`.
///
/// # Errors
/// A JSON cannot be read or parsed, or the output cannot be written.
pub fn write_ratios(jsons: &[PathBuf], out: Option<&Path>) -> Result<(), SuiteError> {
    let mut runs = Vec::new();
    for json in jsons {
        let text = fs::read_to_string(json)?;
        let file: report::OwnedSuiteFile = serde_json::from_str(&text).map_err(io::Error::other)?;
        let clock = file
            .records
            .first()
            .map_or_else(|| json.display().to_string(), |r| r.clock.clone());
        runs.push((clock, file.records));
    }
    let md = report::ratios_across(&runs);
    if let Some(out) = out {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)?;
        }
        fs::write(out, &md)?;
    }
    println!("{md}");
    Ok(())
}

fn write_report(
    out: &Path,
    header: &Header,
    records: &[Record],
    with_plots: bool,
) -> Result<(), SuiteError> {
    let mut plots = Vec::new();
    if with_plots {
        type Plot = fn(&[Record], &Path) -> Result<(), Box<dyn std::error::Error>>;
        let all: [(&str, Plot); 3] = [
            ("ns_per_decision.svg", report::plot_ns_per_decision),
            ("latency_percentiles.svg", report::plot_percentiles),
            ("throughput_vs_threads.svg", report::plot_throughput),
        ];
        for (name, plot) in all {
            let path = out.join(name);
            match plot(records, &path) {
                Ok(()) if path.exists() => plots.push(name),
                Ok(()) => {}
                Err(e) => eprintln!("plot {name}: {e}"),
            }
        }
    }
    fs::write(
        out.join("report.md"),
        report::markdown(header, records, &plots),
    )?;
    Ok(())
}

/// Runs the accuracy mode and writes `accuracy.md` and `accuracy.json`.
///
/// # Errors
/// Bad arguments or an output that cannot be written.
pub fn run_accuracy(args: &AccuracyArgs, command: &str) -> Result<(), SuiteError> {
    let period_ns = u64::try_from(args.period.as_nanos())
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| SuiteError::Usage("--period must be positive".into()))?;
    if args.limit == 0 || !(args.scale.is_finite() && args.scale > 0.0) {
        return Err(SuiteError::Usage(
            "--limit and --scale must be positive".into(),
        ));
    }
    let cfg = AccuracyConfig {
        limit: args.limit,
        period_ns,
        seed: args.seed,
        scale: args.scale,
    };
    let (traces, rows) = accuracy::run_all(&cfg);
    let mut throughput_paths = args.throughput.clone();
    if throughput_paths.is_empty() {
        throughput_paths.extend(Some(args.out.join("suite.json")).filter(|p| p.exists()));
    }
    let mut speeds = Vec::new();
    for path in &throughput_paths {
        let text = fs::read_to_string(path)?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(io::Error::other)?;
        speeds.push((
            accuracy::clock_of_suite(&json),
            accuracy::throughput_from_suite(&json),
        ));
    }
    let m = Machine::collect();
    let provenance = format!(
        "- command: `{command}`\n- commit: `{}`{} · date: {} · CPU: {} · cores: {}\n- ns/decision from: {}\n",
        m.git_commit,
        if m.git_dirty { " (dirty tree)" } else { "" },
        m.date_utc,
        m.cpu_model,
        m.cores,
        if throughput_paths.is_empty() {
            "(none)".to_owned()
        } else {
            throughput_paths
                .iter()
                .map(|p| format!("`{}`", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    fs::create_dir_all(&args.out)?;
    let md = accuracy::markdown(&cfg, &traces, &rows, &speeds, &provenance);
    fs::write(args.out.join("accuracy.md"), &md)?;
    let json = serde_json::json!({
        "header": {
            "tool": format!("tollgate-bench {} accuracy", env!("CARGO_PKG_VERSION")),
            "command": command,
            "machine": m,
            "config": cfg,
            "traces": traces.iter().map(|t| serde_json::json!({
                "name": t.name, "description": t.description,
                "requests": t.requests.len(), "sources": t.sources,
            })).collect::<Vec<_>>(),
            "ns_per_decision_from": throughput_paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        },
        "rows": rows,
        "ns_per_decision": speeds.iter().map(|(clock, speed)| (clock.clone(), speed.iter().map(|(k, (a, d))| (k.clone(), serde_json::json!({"allow": a, "deny": d}))).collect::<serde_json::Map<_, _>>().into())).collect::<serde_json::Map<String, serde_json::Value>>(),
    });
    let json = serde_json::to_string_pretty(&json).map_err(io::Error::other)?;
    fs::write(args.out.join("accuracy.json"), &json)?;
    if let Some(path) = &args.json {
        fs::write(path, &json)?;
    }
    println!("{md}");
    println!("report: {}", args.out.join("accuracy.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["tollgate-bench"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().run
    }

    #[test]
    fn the_default_plan_covers_every_implementation_at_1_and_2_threads() {
        let plan = plan(&args(&[])).unwrap();
        for imp in Impl::ALL {
            for threads in [1, 2] {
                assert!(
                    plan.iter().any(|p| p.imp == imp
                        && p.threads == threads
                        && p.mode == LoopMode::Closed),
                    "{imp} ×{threads}"
                );
            }
            assert!(
                plan.iter()
                    .any(|p| p.imp == imp && p.mode != LoopMode::Closed)
            );
        }
        // Unkeyed implementations only run one key; keyed ones every distribution.
        assert!(
            plan.iter()
                .all(|p| p.imp.keyed() || p.keys == KeyDist::Single)
        );
        assert!(
            plan.iter()
                .any(|p| p.imp.keyed() && p.keys != KeyDist::Single)
        );
    }

    #[test]
    fn repeats_are_interleaved_and_the_median_reported() {
        let out = std::env::temp_dir().join(format!("tollgate-loadgen-rep-{}", std::process::id()));
        let a = args(&[
            "--impls",
            "keyed_gcra,governor_keyed,gcra,governor,cas_floor",
            "--keys",
            "uniform:5000",
            "--threads",
            "1",
            "--loop",
            "closed",
            "--quota",
            "deny",
            "--duration",
            "20ms",
            "--warmup",
            "5ms",
            "--repeat",
            "3",
            "--no-plots",
            "--out",
            out.to_str().unwrap(),
        ]);
        let records = run_suite(&a, "test").unwrap();
        assert_eq!(records.len(), 5);
        for r in &records {
            assert_eq!(r.ns_per_decision_runs.len(), 3);
            let mut sorted = r.ns_per_decision_runs.clone();
            sorted.sort_by(f64::total_cmp);
            assert_eq!(r.ns_per_decision, sorted[1], "the median run is reported");
        }
        // The stream (64 Ki keys by default) covers all 5 000 keys; keyed rows are prefilled.
        let keyed = records.iter().find(|r| r.imp == "keyed_gcra").unwrap();
        assert_eq!((keyed.stream_keys, keyed.prefilled), (5000, true));
        assert_eq!(keyed.allowed_fraction, 0.0);
        let rows = report::ratios(&records);
        let imps: Vec<&str> = rows.iter().map(|r| r.imp.as_str()).collect();
        assert_eq!(imps, ["keyed_gcra", "gcra"]);
        assert!(rows[0].floor_ns.is_none() && rows[1].floor_ns.is_some());
        let report = std::fs::read_to_string(out.join("report.md")).unwrap();
        assert!(report.contains("## Ratio to governor"), "{report}");
        write_ratios(&[out.join("suite.json")], Some(&out.join("ratios.md"))).unwrap();
        let md = std::fs::read_to_string(out.join("ratios.md")).unwrap();
        assert!(
            md.contains("| keyed_gcra | deny | uniform:5000 | 1 |"),
            "{md}"
        );
        assert!(matches!(
            run_suite(&args(&["--repeat", "0"]), "test"),
            Err(SuiteError::Usage(_))
        ));
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn keyed_runs_are_prefilled_before_timing() {
        // No warm-up and a measured window far too short to touch 200 000 keys: without the prefill
        // every decision is a fresh key's first touch (admitted, an insert); with it every measured
        // decision in deny mode is a denial of a key already in the table.
        let out = std::env::temp_dir().join(format!("tollgate-loadgen-pre-{}", std::process::id()));
        let a = args(&[
            "--impls",
            "keyed_gcra,governor_keyed",
            "--keys",
            "uniform:200000",
            "--threads",
            "1",
            "--loop",
            "closed",
            "--quota",
            "deny",
            "--duration",
            "2ms",
            "--warmup",
            "0ms",
            "--no-plots",
            "--out",
            out.to_str().unwrap(),
        ]);
        for r in run_suite(&a, "test").unwrap() {
            assert!(r.prefilled && r.stream_keys == 200_000, "{}", r.imp);
            assert_eq!(
                r.allowed_fraction, 0.0,
                "{}: first touches were timed",
                r.imp
            );
        }
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn bad_plans_are_usage_errors() {
        assert!(matches!(
            plan(&args(&["--impls", "nope"])),
            Err(SuiteError::Usage(_))
        ));
        assert!(matches!(
            plan(&args(&["--threads", "0"])),
            Err(SuiteError::Usage(_))
        ));
    }

    #[test]
    fn a_tiny_suite_writes_every_output() {
        let out =
            std::env::temp_dir().join(format!("tollgate-loadgen-test-{}", std::process::id()));
        let json = out.join("copy.json");
        let a = args(&[
            "--impls",
            "gcra,governor_keyed",
            "--keys",
            "single,uniform:64",
            "--threads",
            "1,2",
            "--duration",
            "30ms",
            "--warmup",
            "10ms",
            "--stream-len",
            "256",
            "--out",
            out.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ]);
        let records = run_suite(&a, "test").unwrap();
        // gcra: 2 quotas × 2 threads + 1 open; governor_keyed: 2 quotas × 2 dists × 2 threads + 1 open.
        assert_eq!(records.len(), 5 + 9);
        // A thread starved through a whole 30 ms run on a loaded machine measures nothing, so only
        // the total is asserted.
        assert!(records.iter().map(|r| r.decisions).sum::<u64>() > 0);
        for r in &records {
            assert!(r.ns_per_decision.is_finite() && r.allowed_fraction <= 1.0);
            assert!(
                r.bytes_per_key.is_none(),
                "no counting allocator in unit tests"
            );
        }
        let text = std::fs::read_to_string(&json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        for field in [
            "impl",
            "algorithm",
            "scenario",
            "keys",
            "threads",
            "ns_per_decision",
            "decisions_per_sec",
            "p50_ns",
            "p99_ns",
            "p999_ns",
            "p9999_ns",
            "max_ns",
            "allowed_fraction",
            "bytes_per_key",
        ] {
            assert!(v["records"][0].get(field).is_some(), "{field}");
        }
        for field in ["command", "git_commit", "cpu_model", "cores", "date_utc"] {
            assert!(v["header"].get(field).is_some(), "{field}");
        }
        for file in [
            "suite.json",
            "report.md",
            "ns_per_decision.svg",
            "latency_percentiles.svg",
            "throughput_vs_threads.svg",
        ] {
            assert!(out.join(file).exists(), "{file}");
        }
        std::fs::remove_file(out.join("report.md")).unwrap();
        rewrite_report(&out.join("suite.json"), None).unwrap();
        assert!(out.join("report.md").exists());
        let deny = records
            .iter()
            .find(|r| r.imp == "gcra" && r.quota_mode == "deny")
            .unwrap();
        assert!(deny.allowed_fraction < 0.01);
        // Keyed rows are prefilled: in deny mode every key's one admission was spent before timing,
        // so the measured decisions are all denials (without the prefill each key's first touch
        // admits and inserts inside the timed window).
        for r in records.iter().filter(|r| r.imp == "governor_keyed") {
            assert!(r.prefilled, "{}", r.scenario);
            assert_eq!(r.stream_keys, r.keys, "{}: the stream covers", r.scenario);
            if r.quota_mode == "deny" {
                assert_eq!(r.allowed_fraction, 0.0, "{}", r.scenario);
            }
        }
        let acc = AccuracyArgs {
            out: out.clone(),
            json: None,
            throughput: vec![out.join("suite.json")],
            seed: 1,
            limit: 10,
            period: std::time::Duration::from_millis(100),
            scale: 0.05,
        };
        run_accuracy(&acc, "test").unwrap();
        let md = std::fs::read_to_string(out.join("accuracy.md")).unwrap();
        assert!(md.contains("| **gcra** |"), "{md}");
        assert!(md.contains("tsc clock"), "{md}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
