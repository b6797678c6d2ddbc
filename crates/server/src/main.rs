//! `tollgate-server --config <file>`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// Tollgate's rate-limit service (Envoy RLS v3 over gRPC, JSON over HTTP).
#[derive(Parser, Debug)]
#[command(name = "tollgate-server", version)]
struct Cli {
    /// The config file (TOML, or YAML by extension).
    #[arg(long)]
    config: PathBuf,
    /// gRPC listen address (overrides `[server] grpc`).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// HTTP listen address (overrides `[server] http`).
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
    match runtime.block_on(tollgate_server::app::run(cli.config, overrides)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "tollgate-server failed");
            eprintln!("tollgate-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
