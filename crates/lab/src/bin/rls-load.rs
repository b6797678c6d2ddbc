//! `rls-load`: drives `ShouldRateLimit` load at a running Envoy RLS v3 server (tollgate-server) and
//! reports calls/s, latency and CPU use; see [`tollgate_lab::rls_load`].
//!
//! ```text
//! cargo run --release -p tollgate-lab --bin rls-load -- --target http://127.0.0.1:8081 \
//!     --domain edge --streams 64 --duration 10s [--json PATH] [--server-pid PID]
//! ```

use std::process::ExitCode;

use clap::Parser;
use tollgate_lab::rls_load::{self, LoadArgs};

/// Drive ShouldRateLimit load at a running server and report calls/s and latency.
#[derive(Parser, Debug)]
#[command(name = "rls-load", version)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match rls_load::run(&cli.load) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rls-load: {e}");
            ExitCode::FAILURE
        }
    }
}
