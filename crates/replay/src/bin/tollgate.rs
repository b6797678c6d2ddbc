//! `tollgate replay --config new.toml [--baseline current.toml] [--format json|nginx|envoy]
//! [--svg timeline.svg] TRAFFIC` (`-` reads stdin), and `tollgate generate` (traffic with a known
//! answer, for the benchmark).

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use tollgate_policy::{ConfigFormat, PolicyConfig};
use tollgate_replay::{Format, Replay};

/// Tollgate's operator commands.
#[derive(Parser, Debug)]
#[command(name = "tollgate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replays recorded traffic through a policy config on a simulated clock.
    Replay {
        /// The policy config to try (TOML, or YAML by extension).
        #[arg(long)]
        config: PathBuf,
        /// The policy config in force, to compare with.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// The traffic's format.
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
        /// Writes the timeline (admitted and denied per second, per rule) as SVG here.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// How many of the most denied keys to list per rule.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// The traffic file (`-`: stdin).
        traffic: PathBuf,
    },
    /// Writes JSON-lines traffic: `keys` users each sending `rate` requests per second for
    /// `seconds` seconds.
    Generate {
        /// Distinct keys (`user` = k0, k1, ...).
        #[arg(long, default_value_t = 1)]
        keys: u64,
        /// Requests per second per key.
        #[arg(long, default_value_t = 20)]
        rate: u64,
        /// Seconds of traffic.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

fn load(path: &PathBuf) -> Result<PolicyConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = match ConfigFormat::of_path(path) {
        ConfigFormat::Toml => PolicyConfig::from_toml(&text),
        ConfigFormat::Yaml => PolicyConfig::from_yaml(&text),
    };
    config.map_err(|e| format!("{}: {e}", path.display()))
}

fn replay(
    config: &PathBuf,
    baseline: Option<&PathBuf>,
    format: Format,
    svg: Option<&PathBuf>,
    top: usize,
    traffic: &PathBuf,
) -> Result<(), String> {
    let new = load(config)?;
    let baseline = baseline.map(load).transpose()?;
    let mut replay = Replay::new(new, baseline).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let read = if traffic.as_os_str() == "-" {
        replay.run(std::io::stdin().lock(), format)
    } else {
        let file =
            std::fs::File::open(traffic).map_err(|e| format!("{}: {e}", traffic.display()))?;
        replay.run(BufReader::with_capacity(1 << 20, file), format)
    };
    read.map_err(|e| format!("{}: {e}", traffic.display()))?;
    let elapsed = started.elapsed();
    print!("{}", replay.report(top));
    #[allow(clippy::cast_precision_loss)]
    let rate = replay.requests as f64 / elapsed.as_secs_f64().max(1e-9);
    eprintln!(
        "replayed {} requests in {:.3} s: {:.2} M requests/s",
        replay.requests,
        elapsed.as_secs_f64(),
        rate / 1e6
    );
    if let Some(svg) = svg {
        tollgate_replay::plot::timeline_svg(&replay, svg)?;
        eprintln!("timeline written to {}", svg.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Replay {
            config,
            baseline,
            format,
            svg,
            top,
            traffic,
        } => replay(
            config,
            baseline.as_ref(),
            *format,
            svg.as_ref(),
            *top,
            traffic,
        ),
        Command::Generate {
            keys,
            rate,
            seconds,
        } => tollgate_replay::generate(
            std::io::BufWriter::new(std::io::stdout().lock()),
            *keys,
            *rate,
            *seconds,
            1_700_000_000,
        )
        .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}
