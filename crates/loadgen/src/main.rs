//! `tollgate-bench`: see the `tollgate_loadgen` crate docs.

use std::process::ExitCode;

use clap::Parser;
use tollgate_loadgen::alloc::CountingAlloc;
use tollgate_loadgen::cli::{Cli, Command};
use tollgate_loadgen::suite;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let result = match &cli.command {
        None => suite::run_suite(&cli.run, &command).map(|_| ()),
        Some(Command::Run(args)) => suite::run_suite(args, &command).map(|_| ()),
        Some(Command::Accuracy(args)) => suite::run_accuracy(args, &command),
        Some(Command::Report(args)) => suite::rewrite_report(&args.json, args.out.as_deref()),
        Some(Command::Ratios(args)) => suite::write_ratios(&args.json, args.out.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
