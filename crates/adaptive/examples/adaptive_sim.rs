//! Fixed, AIMD and gradient in-flight limits in the deterministic simulator, side by side: the
//! figures behind `results/concurrency/adaptive.md`.
//!
//! ```text
//! cargo run --release -p tollgate-adaptive --example adaptive_sim            # the table
//! cargo run --release -p tollgate-adaptive --example adaptive_sim -- out.csv # and the limits
//! ```
//!
//! The upstream has its knee at 100 in flight and answers in 10 ms (± 10 %) up to it; arrivals
//! are Poisson at 15 000 per second (1.5 × its capacity of 10 000); from 8 s to 10 s it is 3 ×
//! slower. Simulated time, seed 1: the same output on any machine.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate_adaptive::sim::{Run, Scenario, Spike, Upstream, simulate};
use tollgate_adaptive::{AimdConfig, AimdLimit, FixedLimit, GradientConfig, GradientLimit};

const KNEE: u64 = 100;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "–".to_owned(),
        |d| format!("{:.1}", d.as_secs_f64() * 1e3),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spike = Spike {
        start: secs(8.0),
        end: secs(10.0),
        factor: 3.0,
    };
    let scenario = Scenario {
        upstream: Upstream {
            knee: KNEE,
            base: Duration::from_millis(10),
            jitter: 0.1,
            spike: Some(spike),
        },
        arrival_rate: 15_000.0,
        duration: secs(20.0),
        seed: 1,
        sample_every: Duration::from_millis(10),
    };
    let aimd = AimdConfig {
        // Twice the unloaded latency: a request slower than that counts as a loss.
        timeout: Duration::from_millis(20),
        ..AimdConfig::default()
    };
    // (label, CSV column prefix, run)
    let runs: Vec<(&str, &str, Run)> = vec![
        (
            "fixed 100 (the knee, known)",
            "fixed100",
            simulate(FixedLimit::new(KNEE)?, &scenario),
        ),
        (
            "fixed 200 (a guess)",
            "fixed200",
            simulate(FixedLimit::new(2 * KNEE)?, &scenario),
        ),
        (
            "aimd (timeout 20 ms)",
            "aimd",
            simulate(AimdLimit::new(aimd)?, &scenario),
        ),
        (
            "gradient (defaults)",
            "gradient",
            simulate(GradientLimit::new(GradientConfig::default())?, &scenario),
        ),
    ];

    let (steady, spiked, after) = (
        (secs(2.5), spike.start),
        (spike.start, spike.end),
        (spike.end + secs(2.0), scenario.duration),
    );
    let mut table = String::new();
    writeln!(
        table,
        "| limit | settled within 10 % of the knee after | steady limit: mean [min, max] | \
         steady throughput /s | refused | p50 ms | p99 ms | spike throughput /s | spike p99 ms | \
         back within 10 % after the spike | after: p50 / p99 ms |"
    )?;
    writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for (name, _, run) in &runs {
        let settle = run.settling_time(KNEE, 0.1, Duration::ZERO, spike.start);
        let back = run.settling_time(KNEE, 0.1, spike.end, scenario.duration);
        let (mean, lo, hi) = run.limit_range(steady.0, steady.1).unwrap_or_default();
        writeln!(
            table,
            "| {name} | {} | {mean:.1} [{lo}, {hi}] | {:.0} | {:.1} % | {} | {} | {:.0} | {} | {} | {} / {} |",
            settle.map_or_else(
                || "never".to_owned(),
                |t| format!("{:.2} s", t.as_secs_f64())
            ),
            run.throughput(steady.0, steady.1),
            100.0 * run.refused_share(steady.0, steady.1),
            ms(run.latency_quantile(0.5, steady.0, steady.1)),
            ms(run.latency_quantile(0.99, steady.0, steady.1)),
            run.throughput(spiked.0, spiked.1),
            ms(run.latency_quantile(0.99, spiked.0, spiked.1)),
            back.map_or_else(
                || "never".to_owned(),
                |t| format!("{:.2} s", t.as_secs_f64())
            ),
            ms(run.latency_quantile(0.5, after.0, after.1)),
            ms(run.latency_quantile(0.99, after.0, after.1)),
        )?;
    }
    print!("{table}");

    if let Some(path) = std::env::args().nth(1) {
        let mut csv = String::from("time_ms");
        for (_, tag, _) in &runs {
            write!(csv, ",{tag}_limit,{tag}_in_flight")?;
        }
        csv.push('\n');
        let points = runs[0].2.series.len();
        for i in 0..points {
            write!(csv, "{}", runs[0].2.series[i].at / 1_000_000)?;
            for (_, _, run) in &runs {
                let p = run.series[i];
                write!(csv, ",{},{}", p.limit, p.in_flight)?;
            }
            csv.push('\n');
        }
        std::fs::write(path, csv)?;
    }
    Ok(())
}
