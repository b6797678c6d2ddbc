//! The run's outputs: JSON records, the Markdown report, SVG plots and the terminal summary.

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::ranged1d::AsRangedCoord;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::machine::Machine;

/// One measured (implementation, scenario, threads) row: the `--json` record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// Implementation name (`gcra`, `governor`, ...).
    #[serde(rename = "impl")]
    pub imp: String,
    /// Algorithm it runs.
    pub algorithm: String,
    /// `tollgate`, `peer` or `baseline`.
    pub family: String,
    /// `<loop>/<quota mode>/<key distribution>`, e.g. `closed/allow/zipf:10000:1`.
    pub scenario: String,
    /// `closed` or `open:<rate>`.
    pub loop_mode: String,
    /// `allow` or `deny`.
    pub quota_mode: String,
    /// The quota the implementation ran with.
    pub quota: String,
    /// Key distribution.
    pub key_dist: String,
    /// Distinct keys.
    pub keys: u64,
    /// Worker threads.
    pub threads: usize,
    /// Threads were pinned to cores.
    pub pinned: bool,
    /// More threads than cores.
    pub oversubscribed: bool,
    /// `tsc` or `coarse`.
    pub clock: String,
    /// Typical time one thread spends per decision, ns: closed loop, median batch duration ÷ `batch`
    /// (robust to preemption); open loop, mean service time.
    pub ns_per_decision: f64,
    /// Closed loop: mean over all batches, including those stretched by preemption, ns.
    pub ns_per_decision_mean: f64,
    /// Decisions per second, all threads.
    pub decisions_per_sec: f64,
    /// Single-decision latency, ns (timer overhead subtracted).
    pub p50_ns: u64,
    /// p99, ns.
    pub p99_ns: u64,
    /// p99.9, ns.
    pub p999_ns: u64,
    /// p99.99, ns.
    pub p9999_ns: u64,
    /// Max, ns.
    pub max_ns: u64,
    /// Admitted / decided.
    pub allowed_fraction: f64,
    /// Heap bytes per key after touching every key once (keyed runs), else `null`.
    pub bytes_per_key: Option<f64>,
    /// Decisions measured.
    pub decisions: u64,
    /// Latency samples.
    pub samples: u64,
    /// (quantile, ns) points of the latency curve.
    pub percentiles: Vec<(f64, u64)>,
    /// Keyed runs: every key of the scenario was decided once before the warm-up, so no
    /// first-touch insert falls in the measured time.
    #[serde(default)]
    pub prefilled: bool,
    /// Keys in each thread's stream (one pass).
    #[serde(default)]
    pub stream_len: u64,
    /// Distinct keys in the shortest-covering thread's stream (equal to `keys` when it covers).
    #[serde(default)]
    pub stream_keys: u64,
    /// ns/decision of every repetition of this run (`--repeat`), in run order; the record's other
    /// figures come from the repetition with the median.
    #[serde(default)]
    pub ns_per_decision_runs: Vec<f64>,
}

/// How the run was made: the JSON header.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    /// Tool and format version.
    pub tool: String,
    /// The exact command line.
    pub command: String,
    /// Machine and build facts.
    #[serde(flatten)]
    pub machine: Machine,
    /// Measured duration per run, seconds.
    pub duration_s: f64,
    /// Warm-up per run, seconds.
    pub warmup_s: f64,
    /// Decisions per timed batch.
    pub batch: u32,
    /// Median cost of a pair of timer reads, subtracted from each latency sample, ns.
    pub timer_overhead_ns: u64,
    /// Whether the timer is the TSC.
    pub timer_is_tsc: bool,
    /// Load average when the suite started.
    pub loadavg_before: String,
    /// Load average when it ended.
    pub loadavg_after: String,
    /// Sizes in bytes of the values a decision returns and of the limiters (see
    /// [`crate::targets::layout`]).
    #[serde(default)]
    pub layout: Vec<(String, usize)>,
}

/// The whole `--json` file.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteFile<'a> {
    /// How the run was made.
    pub header: &'a Header,
    /// One per (implementation, scenario, threads).
    pub records: &'a [Record],
}

/// A `--json` file read back (for `tollgate-bench report`).
#[derive(Clone, Debug, Deserialize)]
pub struct OwnedSuiteFile {
    /// How the run was made.
    pub header: Header,
    /// One per (implementation, scenario, threads).
    pub records: Vec<Record>,
}

fn fmt_rate(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2} G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn fmt_bytes(b: Option<f64>) -> String {
    b.map_or_else(|| "–".into(), |b| format!("{b:.0}"))
}

/// The one-screen summary printed at the end.
pub fn summary_table(records: &[Record]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<15} {:<30} {:>3} {:>8} {:>10} {:>6} {:>6} {:>7} {:>7} {:>8} {:>7} {:>6}",
        "impl",
        "scenario",
        "thr",
        "ns/dec",
        "dec/s",
        "p50",
        "p99",
        "p99.9",
        "p99.99",
        "max",
        "allow%",
        "B/key"
    );
    for r in records {
        let _ = writeln!(
            out,
            "{:<15} {:<30} {:>2}{} {:>8.2} {:>10} {:>6} {:>6} {:>7} {:>7} {:>8} {:>7.2} {:>6}",
            r.imp,
            r.scenario,
            r.threads,
            if r.oversubscribed { "!" } else { " " },
            r.ns_per_decision,
            fmt_rate(r.decisions_per_sec),
            r.p50_ns,
            r.p99_ns,
            r.p999_ns,
            r.p9999_ns,
            r.max_ns,
            r.allowed_fraction * 100.0,
            fmt_bytes(r.bytes_per_key),
        );
    }
    if records.iter().any(|r| r.oversubscribed) {
        out.push_str("! = more threads than cores (oversubscribed, not pinned)\n");
    }
    out
}

/// The Markdown report.
pub fn markdown(header: &Header, records: &[Record], plots: &[&str]) -> String {
    let mut md = String::new();
    let m = &header.machine;
    let _ = writeln!(md, "# Tollgate load generator report\n");
    let _ = writeln!(md, "- command: `{}`", header.command);
    let _ = writeln!(
        md,
        "- commit: `{}`{} · date: {} · CPU: {} · cores: {}",
        m.git_commit,
        if m.git_dirty { " (dirty tree)" } else { "" },
        m.date_utc,
        m.cpu_model,
        m.cores
    );
    let _ = writeln!(
        md,
        "- per run: {:.1} s measured after {:.1} s warm-up; batches of {} decisions; timer {} with {} ns \
         pair overhead subtracted from latency samples",
        header.duration_s,
        header.warmup_s,
        header.batch,
        if header.timer_is_tsc {
            "TSC"
        } else {
            "OS clock"
        },
        header.timer_overhead_ns
    );
    if !header.layout.is_empty() {
        let sizes: Vec<String> = header
            .layout
            .iter()
            .map(|(name, bytes)| format!("`{name}` {bytes} B"))
            .collect();
        let _ = writeln!(md, "- sizes: {}", sizes.join(", "));
    }
    let _ = writeln!(
        md,
        "- load average before / after: {} / {}\n",
        header.loadavg_before, header.loadavg_after
    );
    md.push_str(
        "`ns/dec` is the typical time one thread spends per decision: the median duration of timed \
         batches ÷ decisions per batch (the mean, which also counts batches stretched by preemption, \
         is `ns_per_decision_mean` in the JSON); `dec/s` is all threads together over wall time, \
         interference included; percentiles are single-decision latencies sampled once per batch (open loop: \
         every decision, coordinated-omission corrected). Peers read the same clock as Tollgate; \
         `clock_only` is the floor (one clock read, no limiter). \
         `allow%` is the admitted fraction: window algorithms cap their per-second limit (sliding \
         window 16 383/s, sliding log 2^20/s here), so in `allow` mode on one key they mostly deny.\n\n",
    );
    let mut scenarios: Vec<&str> = Vec::new();
    for r in records {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    for scenario in scenarios {
        let _ = writeln!(md, "## {scenario}\n");
        let _ = writeln!(
            md,
            "| impl | algorithm | threads | ns/dec | dec/s | p50 | p99 | p99.9 | p99.99 | max | allowed | bytes/key | quota |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for r in records.iter().filter(|r| r.scenario == scenario) {
            let _ = writeln!(
                md,
                "| {}{} | {} | {}{} | {:.2} | {} | {} | {} | {} | {} | {} | {:.2} % | {} | {} |",
                if r.family == "tollgate" { "**" } else { "" },
                r.imp.clone() + if r.family == "tollgate" { "**" } else { "" },
                r.algorithm,
                r.threads,
                if r.oversubscribed {
                    " (oversubscribed)"
                } else {
                    ""
                },
                r.ns_per_decision,
                fmt_rate(r.decisions_per_sec),
                r.p50_ns,
                r.p99_ns,
                r.p999_ns,
                r.p9999_ns,
                r.max_ns,
                r.allowed_fraction * 100.0,
                fmt_bytes(r.bytes_per_key),
                r.quota,
            );
        }
        md.push('\n');
    }
    md.push_str(&ratio_table(records));
    if !plots.is_empty() {
        md.push_str("## Plots\n\n");
        for p in plots {
            let _ = writeln!(md, "![{p}]({p})\n");
        }
    }
    md
}

/// The peer a Tollgate row is compared with: governor's keyed limiter for keyed implementations,
/// its direct limiter otherwise.
pub fn peer_of(imp: &str) -> &'static str {
    if imp.starts_with("keyed_") {
        "governor_keyed"
    } else {
        "governor"
    }
}

/// One Tollgate row against governor in the same run.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    /// Tollgate implementation.
    pub imp: String,
    /// `allow` or `deny`.
    pub quota_mode: String,
    /// Key distribution.
    pub key_dist: String,
    /// Threads.
    pub threads: usize,
    /// Tollgate's ns/decision.
    pub ns: f64,
    /// The peer's ns/decision, same scenario and threads.
    pub peer_ns: f64,
    /// `ns / peer_ns`.
    pub ratio: f64,
    /// The floor of the path in the same run (`cas_floor`, unkeyed rows), ns/decision, if measured.
    pub floor_ns: Option<f64>,
    /// `clock_only` in the same run, same quota mode and threads.
    pub clock_ns: Option<f64>,
}

impl Ratio {
    /// The best ratio any implementation at the measured floor could show: `floor / peer`.
    pub fn floor_ratio(&self) -> Option<f64> {
        self.floor_ns.map(|f| f / self.peer_ns)
    }

    /// `≤ 0.9`, `floor` (the floor itself is above 0.9 × the peer, so no limiter could be), or
    /// `peer wins` (not explained by the floor: see the notes beside the table).
    pub fn verdict(&self) -> &'static str {
        if self.ratio <= 0.9 {
            "≤ 0.9"
        } else if self.floor_ratio().is_some_and(|f| f > 0.9) {
            "floor"
        } else {
            "peer wins"
        }
    }
}

/// Every closed-loop Tollgate row that has a governor row beside it in `records`.
pub fn ratios(records: &[Record]) -> Vec<Ratio> {
    let find = |imp: &str, r: &Record, key_dist: &str| {
        records.iter().find(|o| {
            o.imp == imp
                && o.loop_mode == "closed"
                && o.quota_mode == r.quota_mode
                && o.key_dist == key_dist
                && o.threads == r.threads
        })
    };
    records
        .iter()
        .filter(|r| r.family == "tollgate" && r.loop_mode == "closed")
        .filter_map(|r| {
            let peer = find(peer_of(&r.imp), r, &r.key_dist)?;
            let keyed = r.imp.starts_with("keyed_");
            Some(Ratio {
                imp: r.imp.clone(),
                quota_mode: r.quota_mode.clone(),
                key_dist: r.key_dist.clone(),
                threads: r.threads,
                ns: r.ns_per_decision,
                peer_ns: peer.ns_per_decision,
                ratio: r.ns_per_decision / peer.ns_per_decision,
                floor_ns: (!keyed)
                    .then(|| find("cas_floor", r, "single"))
                    .flatten()
                    .map(|f| f.ns_per_decision),
                clock_ns: find("clock_only", r, "single").map(|f| f.ns_per_decision),
            })
        })
        .collect()
}

/// The ratio table of one run, for its report.
pub fn ratio_table(records: &[Record]) -> String {
    let rows = ratios(records);
    let mut md = String::new();
    if rows.is_empty() {
        return md;
    }
    md.push_str(
        "## Ratio to governor (same run)\n\n\
         ns/decision of each Tollgate row ÷ governor's (keyed rows: governor's keyed limiter) in the \
         same scenario and threads. `floor`: `cas_floor` (clock read + one load, + one CAS when \
         admitting; nothing else) ÷ governor, the best ratio any one-word lock-free limiter could \
         show; verdict `floor` when that is above 0.9.\n\n\
         | impl | quota | keys | threads | ns | governor ns | ratio | clock_only ns | floor ns | floor ratio | verdict |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let opt =
        |x: Option<f64>, digits: usize| x.map_or_else(|| "–".into(), |x| format!("{x:.digits$}"));
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.imp,
            r.quota_mode,
            r.key_dist,
            r.threads,
            r.ns,
            r.peer_ns,
            r.ratio,
            opt(r.clock_ns, 2),
            opt(r.floor_ns, 2),
            opt(r.floor_ratio(), 2),
            r.verdict()
        );
    }
    md.push('\n');
    md
}

/// One table over several runs (one per clock): per Tollgate row, its ratio to governor at each.
pub fn ratios_across(runs: &[(String, Vec<Record>)]) -> String {
    let per_run: Vec<(String, Vec<Ratio>)> = runs
        .iter()
        .map(|(clock, records)| (clock.clone(), ratios(records)))
        .collect();
    let mut keys: Vec<(String, String, String, usize)> = Vec::new();
    for (_, rows) in &per_run {
        for r in rows {
            let key = (
                r.imp.clone(),
                r.quota_mode.clone(),
                r.key_dist.clone(),
                r.threads,
            );
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    let mut md = String::new();
    let _ = write!(md, "| impl | quota | keys | threads |");
    for (clock, _) in &per_run {
        let _ = write!(md, " {clock}: ns (governor) | {clock}: ratio (floor) |");
    }
    md.push('\n');
    md.push_str("|---|---|---|---:|");
    for _ in &per_run {
        md.push_str("---:|---|");
    }
    md.push('\n');
    for (imp, quota, dist, threads) in keys {
        let _ = write!(md, "| {imp} | {quota} | {dist} | {threads} |");
        for (_, rows) in &per_run {
            match rows.iter().find(|r| {
                r.imp == imp && r.quota_mode == quota && r.key_dist == dist && r.threads == threads
            }) {
                Some(r) => {
                    let floor = r
                        .floor_ratio()
                        .map_or_else(String::new, |f| format!(" ({f:.2})"));
                    let mark = match r.verdict() {
                        "≤ 0.9" => "",
                        "floor" => " floor",
                        _ => " **peer wins**",
                    };
                    let _ = write!(
                        md,
                        " {:.1} ({:.1}) | {:.2}{floor}{mark} |",
                        r.ns, r.peer_ns, r.ratio
                    );
                }
                None => md.push_str(" – | – |"),
            }
        }
        md.push('\n');
    }
    md
}

/// The records plotted as "the" headline: closed loop, `quota_mode`, one key (or the first
/// distribution present), `threads` threads.
fn headline<'a>(records: &'a [Record], quota_mode: &str, threads: usize) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|r| {
            r.loop_mode == "closed"
                && r.quota_mode == quota_mode
                && r.threads == threads
                && (r.key_dist == "single"
                    || !records
                        .iter()
                        .any(|o| o.imp == r.imp && o.key_dist == "single"))
        })
        .fold(Vec::new(), |mut acc: Vec<&Record>, r| {
            if !acc.iter().any(|a| a.imp == r.imp) {
                acc.push(r);
            }
            acc
        })
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;

const PALETTE: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(197, 176, 213),
];

/// What differs between the report's plots around their data: file size, caption, label areas and
/// the legend's corner.
struct Frame<'a> {
    size: (u32, u32),
    caption: &'a str,
    caption_px: i32,
    x_label_area: u32,
    y_label_area: u32,
    legend: SeriesLabelPosition,
}

/// A chart drawn into an SVG file, with `X` and `Y` coordinates.
type SvgChart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Draws one plot to `path`: a white canvas, the frame's caption and label areas over `x` × `y`,
/// whatever `body` draws (mesh and series), then the legend in the frame's corner.
fn draw_plot<X: AsRangedCoord, Y: AsRangedCoord>(
    path: &Path,
    frame: Frame<'_>,
    x: X,
    y: Y,
    body: impl FnOnce(&mut SvgChart<'_, '_, X::CoordDescType, Y::CoordDescType>) -> PlotResult,
) -> PlotResult {
    let root = SVGBackend::new(path, frame.size).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(frame.caption, ("sans-serif", frame.caption_px))
        .margin(10)
        .x_label_area_size(frame.x_label_area)
        .y_label_area_size(frame.y_label_area)
        .build_cartesian_2d(x, y)?;
    body(&mut chart)?;
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(frame.legend)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Draws a line through `points` in `style`, with a short stroke of that style in the legend.
fn labelled_line<X, Y>(
    chart: &mut SvgChart<'_, '_, X, Y>,
    points: impl IntoIterator<Item = (f64, f64)>,
    style: ShapeStyle,
    label: String,
) -> PlotResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(points, style))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
    Ok(())
}

/// Horizontal bars: ns/decision per implementation (closed loop, 1 thread, allow and deny).
pub fn plot_ns_per_decision(records: &[Record], path: &Path) -> PlotResult {
    let allow = headline(records, "allow", 1);
    let deny = headline(records, "deny", 1);
    let rows: Vec<(String, f64, Option<f64>)> = allow
        .iter()
        .map(|r| {
            let d = deny
                .iter()
                .find(|d| d.imp == r.imp)
                .map(|d| d.ns_per_decision);
            (format!("{} [{}]", r.imp, r.key_dist), r.ns_per_decision, d)
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    let max = rows
        .iter()
        .map(|(_, a, d)| a.max(d.unwrap_or(0.0)))
        .fold(1.0, f64::max);
    let n = rows.len();
    let frame = Frame {
        size: (900, 80 + 34 * n as u32),
        caption: "ns per decision, 1 thread, closed loop",
        caption_px: 20,
        x_label_area: 35,
        y_label_area: 230,
        legend: SeriesLabelPosition::LowerRight,
    };
    draw_plot(path, frame, 0.0..max * 1.1, 0.0..n as f64, |chart| {
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let i = (n as f64 - y - 0.5).round();
                if (y - y.floor() - 0.5).abs() < 0.01 && i >= 0.0 && (i as usize) < n {
                    rows[i as usize].0.clone()
                } else {
                    String::new()
                }
            })
            .x_desc("ns / decision (lower is better)")
            .draw()?;
        for (i, (_, a, d)) in rows.iter().enumerate() {
            let top = n as f64 - i as f64;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, top - 0.15), (*a, top - 0.5)],
                PALETTE[0].filled(),
            )))?;
            if let Some(d) = d {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(0.0, top - 0.5), (*d, top - 0.85)],
                    PALETTE[1].filled(),
                )))?;
            }
        }
        // Empty bars that only carry the two legend entries.
        for (label, color) in [("allow mode", PALETTE[0]), ("deny mode", PALETTE[1])] {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, 0.0), (0.0, 0.0)],
                    color.filled(),
                )))?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        Ok(())
    })
}

/// Latency percentile curves (x: number of nines), closed loop, allow mode, 1 thread.
pub fn plot_percentiles(records: &[Record], path: &Path) -> PlotResult {
    let rows = headline(records, "allow", 1);
    if rows.is_empty() {
        return Ok(());
    }
    let nines = |q: f64| if q >= 1.0 { 5.0 } else { -(1.0 - q).log10() };
    let max = rows.iter().map(|r| r.max_ns).max().unwrap_or(1).max(10) as f64;
    let frame = Frame {
        size: (900, 560),
        caption: "single-decision latency by percentile, 1 thread, closed loop, allow mode",
        caption_px: 18,
        x_label_area: 40,
        y_label_area: 60,
        legend: SeriesLabelPosition::UpperLeft,
    };
    let y = (1f64..max * 2.0).log_scale();
    draw_plot(path, frame, 0.25f64..5.1f64, y, |chart| {
        chart
            .configure_mesh()
            .x_labels(6)
            .x_label_formatter(&|x| match x.round() as i64 {
                0 => "p0".into(),
                1 => "p90".into(),
                2 => "p99".into(),
                3 => "p99.9".into(),
                4 => "p99.99".into(),
                5 => "max".into(),
                _ => String::new(),
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_desc("percentile")
            .y_desc("ns (log)")
            .draw()?;
        for (i, r) in rows.iter().enumerate() {
            let points = r
                .percentiles
                .iter()
                .map(|&(q, v)| (nines(q), v.max(1) as f64));
            let style = PALETTE[i % PALETTE.len()].stroke_width(2);
            labelled_line(chart, points, style, r.imp.clone())?;
        }
        Ok(())
    })
}

/// Throughput against thread count, closed loop, one line per (implementation, scenario).
pub fn plot_throughput(records: &[Record], path: &Path) -> PlotResult {
    let mut lines: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for r in records.iter().filter(|r| r.loop_mode == "closed") {
        let name = format!("{} {}/{}", r.imp, r.quota_mode, r.key_dist);
        let point = (r.threads, r.decisions_per_sec / 1e6);
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    lines.retain(|(_, pts)| pts.len() > 1);
    // Keep the plot legible: allow mode, one line per implementation (keyed ones on their Zipf run
    // when there is one).
    lines.retain(|(n, _)| n.contains(" allow/"));
    let imp_of = |n: &str| n.split(' ').next().unwrap_or("").to_owned();
    let mut chosen: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for (name, pts) in &lines {
        let imp = imp_of(name);
        let better = |old: &str| !old.contains("zipf") && name.contains("zipf");
        match chosen.iter_mut().find(|(n, _)| imp_of(n) == imp) {
            Some(entry) if better(&entry.0) => *entry = (name.clone(), pts.clone()),
            Some(_) => {}
            None => chosen.push((name.clone(), pts.clone())),
        }
    }
    let lines = chosen;
    if lines.is_empty() {
        return Ok(());
    }
    let max_threads = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .max()
        .unwrap_or(1);
    let max_y = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .fold(1.0, f64::max);
    let frame = Frame {
        size: (900, 600),
        caption: "throughput vs threads, closed loop, allow mode",
        caption_px: 20,
        x_label_area: 40,
        y_label_area: 60,
        legend: SeriesLabelPosition::UpperRight,
    };
    let x = 0.8f64..max_threads as f64 * 1.6;
    draw_plot(path, frame, x, 0f64..max_y * 1.1, |chart| {
        chart
            .configure_mesh()
            .x_labels(max_threads + 1)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 0.05 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .x_desc("threads")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_desc("million decisions / s (all threads)")
            .draw()?;
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let style = if i < PALETTE.len() {
                color.stroke_width(2)
            } else {
                color.stroke_width(4)
            };
            let mut pts = pts.clone();
            pts.sort_by_key(|p| p.0);
            let points = pts.iter().map(|&(t, y)| (t as f64, y));
            labelled_line(chart, points, style, name.clone())?;
            chart.draw_series(
                pts.iter()
                    .map(|&(t, y)| Circle::new((t as f64, y), 3, color.filled())),
            )?;
        }
        Ok(())
    })
}
