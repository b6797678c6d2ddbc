//! Where the suite is, for the person waiting on it: a progress bar on a terminal, one plain line
//! per run otherwise (a CI log, `| tee`, a file), so a log shows which scenario is running and how
//! many remain instead of nothing until the report.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The suite's progress display, chosen once from whether stderr is a terminal.
pub enum Progress {
    /// A terminal: an indicatif bar (position in milliseconds of planned run time).
    Bar {
        /// The bar (hidden when the plan is too short to watch).
        bar: ProgressBar,
        /// Planned milliseconds per run.
        run_ms: f64,
    },
    /// Not a terminal: a line per run on stderr, [`line()`].
    Lines {
        /// Runs in the whole plan (every repetition).
        total: usize,
        /// Planned seconds per run (warm-up and measured window).
        run_secs: f64,
    },
}

impl Progress {
    /// A bar when stderr is a terminal and the plan is long enough to watch (over 3 s), else plain
    /// lines; `total` runs of `run_secs` each.
    pub fn new(total: usize, run_secs: f64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::Lines { total, run_secs };
        }
        let total_secs = run_secs * total as f64;
        let bar = if total_secs > 3.0 {
            let bar = ProgressBar::new((total_secs * 1000.0) as u64);
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent:>3}% {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress::Bar {
            bar,
            run_ms: run_secs * 1000.0,
        }
    }

    /// Run number `done + 1` starts; `what` names it ("keyed_gcra closed/allow/single 2 threads").
    pub fn start(&self, done: usize, what: &str) {
        match self {
            Progress::Bar { bar, .. } => bar.set_message(what.to_owned()),
            Progress::Lines { total, run_secs } => {
                let left = Duration::from_secs_f64(run_secs * total.saturating_sub(done) as f64);
                // A failed write to stderr is no reason to stop measuring.
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "{}",
                    line(done + 1, *total, what, left)
                );
            }
        }
    }

    /// Within run number `done + 1`, `fraction` of it is done (called about every 100 ms).
    pub fn tick(&self, done: usize, fraction: f64) {
        if let Progress::Bar { bar, run_ms } = self {
            bar.set_position(((done as f64 + fraction) * run_ms) as u64);
        }
    }

    /// Clears the bar (lines stay in the log).
    pub fn finish(&self) {
        if let Progress::Bar { bar, .. } = self {
            bar.finish_and_clear();
        }
    }
}

/// One progress line: `[3/17] keyed_gcra closed/allow/single 4 threads (about 1m 12s left)`, the
/// time left being the planned run time of this run and every later one.
pub fn line(number: usize, total: usize, what: &str, left: Duration) -> String {
    let secs = left.as_secs_f64().ceil() as u64;
    let left = if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    };
    format!("[{number}/{total}] {what} (about {left} left)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_run_its_number_and_the_time_left() {
        assert_eq!(
            line(
                3,
                17,
                "keyed_gcra closed/allow/single 4 threads",
                Duration::from_secs(75)
            ),
            "[3/17] keyed_gcra closed/allow/single 4 threads (about 1m 15s left)"
        );
        assert_eq!(
            line(
                17,
                17,
                "gcra open:1000000/deny/single 1 thread",
                Duration::from_millis(1250)
            ),
            "[17/17] gcra open:1000000/deny/single 1 thread (about 2s left)"
        );
    }
}
