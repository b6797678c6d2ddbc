//! Replays recorded traffic through a tollgate-policy config on a simulated clock, before the
//! config ships: what each rule would have allowed, denied and shadow-denied, which keys it would
//! have denied and when first, the difference from the config in force (`--baseline`), and a
//! timeline picture.
//!
//! * Input ([`parse`]): JSON lines, nginx `combined` and Envoy default access logs, each through the
//!   field mapping stated there. Read as a stream, one line at a time (see *Memory* below).
//! * Malformed lines are counted, every one, and the first [`MAX_REPORTED_LINES`] listed with their
//!   line numbers (1-based, blank lines counted) and why ([`LineError`]: not UTF-8, syntax, bad or
//!   missing timestamp, descriptors or cost, or longer than [`MAX_LINE_BYTES`]); the report says
//!   how many more there were. They never stop the replay and change nothing else: the lines
//!   around them are decided as if they were absent. Only a read error (the file itself) stops it.
//! * Time: each request is decided at its timestamp on the policy's
//!   [`ManualClock`](tollgate_core::ManualClock)'s scale (the first request at 0). A line earlier
//!   than one before it is decided at the latest time seen (logs are written as requests finish,
//!   slightly out of order).
//! * Counts per rule are the engine's own
//!   ([`Policy::snapshot`](tollgate_policy::Policy::snapshot)'s meaning): a rule evaluated after
//!   another denied is only peeked, and its verdict counted.
//!
//! # Memory
//! Nothing a replay keeps grows with the number of lines; one thing grows with the log's time
//! span, up to a bound. Per config (the new one, and the baseline when given), it keeps:
//!
//! * the policy's own state: each keyed rule's table is bounded by its `capacity` (a full table
//!   shares its overflow state, as in production), a global rule is one word or a striped
//!   limiter;
//! * per rule, at most [`MAX_TRACKED_KEYS`] distinct denied keys, each at most [`MAX_KEY_BYTES`]
//!   of text (a longer key is cut and ends in `...`), with a count each; further keys are counted
//!   as denials but not told apart (the report shows `>=` before their number);
//! * per rule, one timeline slot (two `u32`: 8 bytes) per second of the log's span, at most
//!   [`MAX_SECONDS`] (seven days: 4.8 MiB per rule): **this is what grows with the time span**;
//!   requests later than that are decided and counted but not plotted;
//! * per rule, its first denial (one key);
//!
//! and for the stream: one line buffer of at most [`MAX_LINE_BYTES`] (a longer line is skipped
//! to its end without being buffered, and counted malformed), and [`MAX_REPORTED_LINES`] malformed
//! line numbers. A line that lies whole in the input's own buffer (the [`BufRead`]'s) is decided
//! there; the line buffer holds only a line across that buffer's end. [`ReplayBounds`] sets these bounds (the defaults are the constants);
//! [`Replay::retained`] says what a replay holds now and [`Replay::retained_bound`] the most it
//! can hold, which `tests/bounded_memory.rs` checks on a long synthetic stream (with a counting
//! allocator: the heap does not grow over its second half). The report and the timeline picture
//! are computed from these (the picture averages long spans into at most 600 points a line).

mod lines;
pub mod parse;
pub mod plot;
mod report;
mod side;

use std::io::BufRead;

use tollgate_policy::{ConfigError, PolicyConfig};

use lines::{Line, read_line};
pub use parse::{Format, LineError, LoggedRequest};
pub use report::RuleDiff;
pub use side::{RuleReport, Side};

/// Distinct denied keys tracked per rule; more are counted as denials but not told apart.
pub const MAX_TRACKED_KEYS: usize = 100_000;
/// Seconds of timeline kept; later requests are decided and counted but not plotted.
pub const MAX_SECONDS: usize = 7 * 86_400;
/// Malformed lines listed by number (all are counted).
pub const MAX_REPORTED_LINES: usize = 20;
/// Bytes of a tracked denied key's text; a longer key is cut and ends in `...`.
pub const MAX_KEY_BYTES: usize = 256;
/// Bytes of one line (its newline excluded); a longer line is malformed ([`LineError::TooLong`]).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// What a replay keeps at most, whatever the log's length (see the [crate docs](crate#memory)).
/// The defaults are the `MAX_*` constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayBounds {
    /// Distinct denied keys tracked per rule ([`MAX_TRACKED_KEYS`]).
    pub tracked_keys: usize,
    /// Bytes of a tracked key's text ([`MAX_KEY_BYTES`]; at least 4).
    pub key_bytes: usize,
    /// Timeline seconds per rule ([`MAX_SECONDS`]).
    pub seconds: usize,
    /// Bytes of one line ([`MAX_LINE_BYTES`]).
    pub line_bytes: usize,
    /// Malformed lines listed by number ([`MAX_REPORTED_LINES`]).
    pub reported_lines: usize,
}

impl Default for ReplayBounds {
    fn default() -> Self {
        ReplayBounds {
            tracked_keys: MAX_TRACKED_KEYS,
            key_bytes: MAX_KEY_BYTES,
            seconds: MAX_SECONDS,
            line_bytes: MAX_LINE_BYTES,
            reported_lines: MAX_REPORTED_LINES,
        }
    }
}

/// What a replay holds (the policies' own tables aside), summed over both configs' rules:
/// [`Replay::retained`] now, [`Replay::retained_bound`] at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    /// Tracked denied keys.
    pub denied_keys: usize,
    /// Bytes of their text.
    pub key_bytes: usize,
    /// Timeline slots (8 bytes each).
    pub timeline_slots: usize,
    /// Malformed lines listed by number.
    pub malformed_lines: usize,
    /// The line buffer's capacity, in bytes.
    pub line_buffer: usize,
}

/// A replay of one traffic stream through a config and, optionally, a baseline.
pub struct Replay {
    /// The config being rolled out.
    pub new: Side,
    /// The config in force, when given.
    pub baseline: Option<Side>,
    /// Lines read (blank lines included).
    pub lines: u64,
    /// Requests decided.
    pub requests: u64,
    /// Malformed lines: how many.
    pub malformed: u64,
    /// The first [`MAX_REPORTED_LINES`] malformed lines: number and why.
    pub malformed_lines: Vec<(u64, LineError)>,
    /// Seconds from the first to the last request.
    pub span_ns: u64,
    t0: Option<u64>,
    last: u64,
    bounds: ReplayBounds,
    /// The line being read, reused (at most `bounds.line_bytes + 1`).
    buf: Vec<u8>,
}

impl Replay {
    /// A replay of `new`, beside `baseline` when given.
    ///
    /// # Errors
    /// A config's [`ConfigError`].
    pub fn new(new: PolicyConfig, baseline: Option<PolicyConfig>) -> Result<Self, ConfigError> {
        Replay::with_bounds(new, baseline, ReplayBounds::default())
    }

    /// [`new`](Self::new), keeping at most what `bounds` allows.
    ///
    /// # Errors
    /// A config's [`ConfigError`].
    pub fn with_bounds(
        new: PolicyConfig,
        baseline: Option<PolicyConfig>,
        bounds: ReplayBounds,
    ) -> Result<Self, ConfigError> {
        let bounds = ReplayBounds {
            key_bytes: bounds.key_bytes.max(4),
            ..bounds
        };
        Ok(Replay {
            new: Side::with_bounds(new, bounds)?,
            baseline: baseline.map(|b| Side::with_bounds(b, bounds)).transpose()?,
            lines: 0,
            requests: 0,
            malformed: 0,
            malformed_lines: Vec::new(),
            span_ns: 0,
            t0: None,
            last: 0,
            bounds,
            buf: Vec::new(),
        })
    }

    /// Decides one request read from line `line`.
    #[inline]
    pub fn request(&mut self, request: &LoggedRequest<'_>, line: u64) {
        let t0 = *self.t0.get_or_insert(request.ts_ns);
        // Out of order: at the latest time seen.
        let now = request.ts_ns.saturating_sub(t0).max(self.last);
        self.last = now;
        self.span_ns = now;
        self.requests += 1;
        let second = usize::try_from(now / 1_000_000_000)
            .ok()
            .filter(|&s| s < self.bounds.seconds);
        self.new.decide(request, now, line, second);
        if let Some(baseline) = &mut self.baseline {
            baseline.decide(request, now, line, second);
        }
    }

    /// Counts a malformed line.
    pub fn malformed(&mut self, line: u64, why: LineError) {
        self.malformed += 1;
        if self.malformed_lines.len() < self.bounds.reported_lines {
            self.malformed_lines.push((line, why));
        }
    }

    /// Reads every line of `input` in `format` and decides it, continuing the replay (line
    /// numbers and the clock go on from the previous call's). Memory stays bounded whatever the
    /// input's size (see the [crate docs](crate#memory)).
    ///
    /// # Errors
    /// Only reading errors; malformed lines are counted.
    pub fn run(&mut self, input: impl BufRead, format: Format) -> std::io::Result<()> {
        let mut input = input;
        let mut buf = std::mem::take(&mut self.buf);
        let mut scratch = parse::Scratch::default();
        let max = self.bounds.line_bytes;
        let read = loop {
            // Most lines lie whole in the reader's buffer: decided there, not copied.
            let available = match input.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            };
            if available.is_empty() {
                break Ok(());
            }
            if let Some(at) = memchr::memchr(b'\n', available).filter(|&at| at <= max) {
                self.lines += 1;
                self.line(&available[..at], format, &mut scratch);
                input.consume(at + 1);
                continue;
            }
            // A line across the end of the reader's buffer, or longer than the bound.
            match read_line(&mut input, &mut buf, max) {
                Ok(Line::End) => break Ok(()),
                Ok(Line::TooLong) => {
                    self.lines += 1;
                    self.malformed(self.lines, LineError::TooLong);
                }
                Ok(Line::Whole) => {
                    self.lines += 1;
                    self.line(&buf, format, &mut scratch);
                }
                Err(e) => break Err(e),
            }
        };
        self.buf = buf;
        read
    }

    /// Decides line number `self.lines`, `text` (its newline, if any, still on): blank lines are
    /// skipped, malformed ones counted.
    #[inline]
    fn line(&mut self, mut text: &[u8], format: Format, scratch: &mut parse::Scratch) {
        while let [rest @ .., b'\n' | b'\r'] = text {
            text = rest;
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let line = self.lines;
        let mut request = LoggedRequest::default();
        match parse::parse_line_into(format, text, scratch, &mut request) {
            Ok(()) => self.request(&request, line),
            Err(why) => self.malformed(line, why),
        }
    }

    /// What this replay holds now, the policies' tables aside (see the
    /// [crate docs](crate#memory)).
    pub fn retained(&self) -> Retained {
        let mut held = self.new.retained();
        if let Some(baseline) = &self.baseline {
            let b = baseline.retained();
            held.denied_keys += b.denied_keys;
            held.key_bytes += b.key_bytes;
            held.timeline_slots += b.timeline_slots;
        }
        held.malformed_lines = self.malformed_lines.len();
        held.line_buffer = self.buf.capacity();
        held
    }

    /// The most [`retained`](Self::retained) can ever say for these configs and bounds, however
    /// long the log: per rule of each config, `tracked_keys` keys of `key_bytes` and `seconds`
    /// slots; `reported_lines` lines; a line buffer of `line_bytes` and its newline (rounded up
    /// by the allocator's growth to at most twice that).
    pub fn retained_bound(&self) -> Retained {
        let rules = self.new.rules.len() + self.baseline.as_ref().map_or(0, |b| b.rules.len());
        let b = self.bounds;
        Retained {
            denied_keys: rules * b.tracked_keys,
            key_bytes: rules * b.tracked_keys * b.key_bytes,
            timeline_slots: rules * b.seconds,
            malformed_lines: b.reported_lines,
            line_buffer: 2 * (b.line_bytes + 1),
        }
    }
}

/// Writes JSON lines of traffic with a known answer: `keys` keys (`k0`, `k1`, ...) under the
/// descriptor `user`, with `path` = `/api`, each sending `rate` requests per second, evenly
/// spaced, for `seconds` seconds, starting at Unix second `start`. Requests are interleaved in time
/// order (for the benchmark and the tests).
///
/// # Errors
/// Writing errors.
pub fn generate(
    mut out: impl std::io::Write,
    keys: u64,
    rate: u64,
    seconds: u64,
    start: u64,
) -> std::io::Result<()> {
    let step = 1_000_000_000 / rate.max(1);
    for n in 0..rate * seconds {
        let ns = n * step;
        let (s, frac) = (start + ns / 1_000_000_000, ns % 1_000_000_000);
        for k in 0..keys {
            writeln!(
                out,
                r#"{{"ts":{s}.{frac:09},"descriptors":{{"user":"k{k}","path":"/api"}},"cost":1}}"#
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a replay found, to compare two replays of the same log.
    fn outcome(replay: &Replay) -> String {
        let rules: Vec<String> = replay
            .new
            .rules
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} {:?} {:?}",
                    r.rule,
                    r.allowed,
                    r.denied,
                    r.shadow_denied,
                    r.top_denied(10),
                    r.first_denial
                )
            })
            .collect();
        format!(
            "{} lines, {} requests, malformed {:?}; {rules:?}",
            replay.lines, replay.requests, replay.malformed_lines
        )
    }

    #[test]
    fn lines_across_the_readers_buffer_are_decided_as_lines_within_it() {
        let config = || {
            PolicyConfig::from_toml(
                r#"
                [[rules]]
                name = "per_user"
                match = { user = "any" }
                key = ["user"]
                limit = 2
                period = "1s"
                capacity = 10
                [[rules]]
                name = "per_pair"
                match = { user = "any", path = "any" }
                key = ["user", "path"]
                limit = 3
                period = "1s"
                capacity = 10
                "#,
            )
            .expect("config")
        };
        let mut log = String::new();
        for n in 0..12 {
            let user = ["a", "b", "a\\\"q"][n % 3];
            log.push_str(&format!(
                "{{\"ts\":{}.{n:03},\"descriptors\":{{\"user\":\"{user}\",\"path\":\"/p\"}}}}\n",
                n / 4
            ));
            match n % 4 {
                0 => log.push('\n'),
                1 => log.push_str(&format!("{{\"ts\":1,\"pad\":\"{}\"}}\n", "x".repeat(100))),
                2 => log.push_str("{\"ts\":2,\"descriptors\":{\"user\":\"c\"}}\r\n"),
                _ => log.push_str("not json\n"),
            }
        }
        log.push_str(r#"{"ts":9,"descriptors":{"user":"z"}}"#);
        let bounds = ReplayBounds {
            line_bytes: 80,
            ..ReplayBounds::default()
        };
        let mut whole = Replay::with_bounds(config(), None, bounds).expect("replay");
        whole.run(log.as_bytes(), Format::Json).expect("read");
        assert_eq!(
            whole.malformed_lines.len(),
            6,
            "{:?}",
            whole.malformed_lines
        );
        assert!(whole.malformed_lines.contains(&(4, LineError::TooLong)));
        assert_eq!(whole.requests, 12 + 3 + 1);
        let expected = outcome(&whole);
        for capacity in [1, 2, 7, 40, 79, 80, 81, 82, 200] {
            let input = std::io::BufReader::with_capacity(capacity, log.as_bytes());
            let mut replay = Replay::with_bounds(config(), None, bounds).expect("replay");
            replay.run(input, Format::Json).expect("read");
            assert_eq!(
                outcome(&replay),
                expected,
                "reader buffer of {capacity} bytes"
            );
        }
    }
}
