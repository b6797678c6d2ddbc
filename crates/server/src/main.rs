//! `tollgate-server --config <file>`, and `tollgate-server check --config <file>` (its load client is `tollgate-lab`'s `rls-load`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// The allocator (feature `mimalloc`, on by default): per-call allocations of tonic, h2 and the
/// protos cost a measurable share of the server's CPU with the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tollgate's rate-limit service (Envoy RLS v3 over gRPC, JSON over HTTP).
#[derive(Parser, Debug)]
#[command(
    name = "tollgate-server",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// The config file (TOML, or YAML by extension).
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// gRPC listen address (overrides `[server] grpc`).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// HTTP listen address (overrides `[server] http`).
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// Runtime worker threads (default: one per core). Fewer than the cores leaves the rest to
    /// whatever shares the machine (a sidecar's proxy, a load client).
    #[arg(long)]
    workers: Option<std::num::NonZeroUsize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Checks a config as the server's start and reload do, and prints it back with every default
    /// spelled out; exits non-zero naming the domain, rule and field on an error.
    Check {
        /// The config file (TOML, or YAML by extension).
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let config = match (cli.command, cli.config) {
        (Some(Command::Check { config }), _) => {
            return match tollgate_server::config::ServerConfig::normalized_toml(&config) {
                Ok(text) => {
                    print!("{text}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("tollgate-server: {}: {e}", config.display());
                    std::process::ExitCode::FAILURE
                }
            };
        }
        (None, Some(config)) => config,
        // `--config` is required without a subcommand: clap refuses the call before this.
        (None, None) => return std::process::ExitCode::FAILURE,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    // One worker: a current-thread runtime, which skips the work-stealing scheduler's bookkeeping
    // (nothing to steal from).
    let mut runtime = match cli.workers.map(std::num::NonZeroUsize::get) {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(workers) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate-server: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let overrides = tollgate_server::app::Overrides {
        grpc: cli.grpc,
        http: cli.http,
    };
    match runtime.block_on(tollgate_server::app::run(config, overrides)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "tollgate-server failed");
            eprintln!("tollgate-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
