//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::keys::KeyDist;
use crate::targets::{ClockKind, QuotaMode};

/// Tollgate's benchmark suite: ns/decision, tail latency and throughput of every Tollgate limiter
/// beside its peers, and the accuracy of every algorithm against an exact window.
///
/// With no subcommand it runs the default suite (every implementation, 1 and 2 threads, one key and
/// keyed uniform/Zipf distributions, allow and deny quotas, closed and open loop) and writes its
/// report to `report/`.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate-bench",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to run (default: the throughput suite).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of the throughput suite when no subcommand is given.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The throughput and latency suite (the default).
    Run(RunArgs),
    /// Replay seeded request traces with manual time through every algorithm and judge them against
    /// an exact sliding window.
    Accuracy(AccuracyArgs),
    /// Rewrite the Markdown report and plots from a suite JSON, without measuring again.
    Report(ReportArgs),
    /// One table of every Tollgate row's ratio to governor across several suite JSONs (one per
    /// clock), from the committed runs, without measuring again.
    Ratios(RatiosArgs),
}

/// Options of `ratios`.
#[derive(Clone, Debug, Args)]
pub struct RatiosArgs {
    /// Suite JSON files, comma-separated, one column pair each (labelled by their clock).
    #[arg(long, value_delimiter = ',', required = true)]
    pub json: Vec<PathBuf>,
    /// Markdown file to write (the table is also printed).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Options of `report`.
#[derive(Clone, Debug, Args)]
pub struct ReportArgs {
    /// The suite JSON to read.
    #[arg(long, default_value = "report/suite.json")]
    pub json: PathBuf,
    /// Output folder (default: the JSON's folder).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Which loops to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoopChoice {
    /// Closed loop only (maximum throughput).
    Closed,
    /// Open loop only (fixed offered rate).
    Open,
    /// Closed loop for every scenario, plus one open-loop run per implementation.
    Both,
}

/// Options of the throughput suite.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// Implementations, comma-separated: names (gcra, leaky_bucket, fixed_window, sliding_window,
    /// sliding_log, striped, keyed_gcra, keyed_sliding_window, governor, governor_keyed, ratelimit,
    /// mutex_gcra) or groups (all, tollgate, peers, keyed, unkeyed).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub impls: Vec<String>,
    /// Key distributions, comma-separated: single, uniform:K, zipf:K:S. Unkeyed implementations run
    /// only `single`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,uniform:10000,zipf:10000:1.0"
    )]
    pub keys: Vec<KeyDist>,
    /// Thread counts, comma-separated. More threads than cores runs unpinned and is flagged.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Measured time per run (e.g. 1s, 500ms).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub duration: Duration,
    /// Unmeasured warm-up per run.
    #[arg(long, value_parser = parse_duration, default_value = "250ms")]
    pub warmup: Duration,
    /// Clock every limiter reads.
    #[arg(long, value_enum, default_value_t = ClockKind::Tsc)]
    pub clock: ClockKind,
    /// Quota modes, comma-separated: allow (mostly admissions), deny (mostly denials).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "allow,deny")]
    pub quota: Vec<QuotaMode>,
    /// Closed loop, open loop, or both.
    #[arg(long = "loop", value_enum, default_value_t = LoopChoice::Both)]
    pub loop_mode: LoopChoice,
    /// Offered decisions per second (all threads) for open-loop runs.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub rate: f64,
    /// Decisions per timed batch in closed loop.
    #[arg(long, default_value_t = 64)]
    pub batch: u32,
    /// Least keys pregenerated per thread, cycled through. Streams grow to cover the key space:
    /// uniform at least one pass over every key, Zipf at least 8 × keys with every key present.
    #[arg(long, default_value_t = 1 << 16)]
    pub stream_len: usize,
    /// Measure every run this many times, interleaved (the whole plan once, then again in reverse
    /// order, ...); each row reports the run with the median ns/decision and lists all of them.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Seed of the key streams.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Do not pin threads to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Also write the JSON records to this path (always written to `<out>/suite.json`).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Output folder for the JSON, Markdown report and SVG plots.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Skip the plots.
    #[arg(long)]
    pub no_plots: bool,
}

/// Options of the accuracy mode.
#[derive(Clone, Debug, Args)]
pub struct AccuracyArgs {
    /// Output folder for `accuracy.md` and `accuracy.json`.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Also write the JSON to this path.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Suite JSON files to take ns/decision from, comma-separated, one column each (default:
    /// `<out>/suite.json` when present).
    #[arg(long, value_delimiter = ',')]
    pub throughput: Vec<PathBuf>,
    /// Seed of every trace.
    #[arg(long, default_value_t = 0x70_11_6a_7e)]
    pub seed: u64,
    /// Limit per period.
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Period.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub period: Duration,
    /// Trace length scale (1.0: 300 periods steady, 150 on/off cycles, 50 attacks, 30 periods of
    /// 1000 sources).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
}

/// Parses `1s`, `250ms`, `2.5s`, `100us`, `50ns`, `1m`.
///
/// # Errors
/// A message when the text is not a number followed by a unit.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?}: missing unit (ns, us, ms, s, m)"))?;
    let (num, unit) = text.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("{text:?}: not a number"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        for bad in ["", "1", "s", "1x", "-1s", "1e999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_cli_parses_defaults_and_subcommands() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["tollgate-bench"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.threads, vec![1, 2]);
        assert_eq!(cli.run.keys.len(), 3);
        let cli = Cli::try_parse_from([
            "tollgate-bench",
            "--impls",
            "gcra,governor",
            "--keys",
            "zipf:100:1.2",
            "--threads",
            "1,2,4",
            "--quota",
            "deny",
            "--clock",
            "coarse",
        ])
        .unwrap();
        assert_eq!(cli.run.impls, vec!["gcra", "governor"]);
        assert_eq!(cli.run.threads, vec![1, 2, 4]);
        assert_eq!(cli.run.quota, vec![QuotaMode::Deny]);
        let cli = Cli::try_parse_from(["tollgate-bench", "accuracy", "--scale", "0.5"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Accuracy(a)) if a.scale == 0.5));
        assert!(Cli::try_parse_from(["tollgate-bench", "--keys", "zipf:0:1"]).is_err());
    }
}
