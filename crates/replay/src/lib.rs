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
//! * Time: each request is decided at its timestamp on the policy's [`ManualClock`]'s scale (the
//!   first request at 0). A line earlier than one before it is decided at the latest time seen
//!   (logs are written as requests finish, slightly out of order).
//! * Counts per rule are the engine's own ([`Policy::snapshot`]'s meaning): a rule evaluated after
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
//! line numbers. [`ReplayBounds`] sets these bounds (the defaults are the constants);
//! [`Replay::retained`] says what a replay holds now and [`Replay::retained_bound`] the most it
//! can hold, which `tests/bounded_memory.rs` checks on a long synthetic stream (with a counting
//! allocator: the heap does not grow over its second half). The report and the timeline picture
//! are computed from these (the picture averages long spans into at most 600 points a line).

pub mod parse;
pub mod plot;

use std::collections::HashMap;
use std::io::{BufRead, Read};

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigError, Policy, PolicyConfig, RuleOutcome};

pub use parse::{Format, LineError, Request};

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

/// One rule's tally.
#[derive(Clone, Debug, Default)]
pub struct RuleReport {
    /// The rule's name.
    pub rule: String,
    /// Its own admissions.
    pub allowed: u64,
    /// Its enforced denials.
    pub denied: u64,
    /// What it would have denied, as a shadow rule (or under dry run).
    pub shadow_denied: u64,
    /// Denials (enforced or shadow) per key; at most [`ReplayBounds::tracked_keys`] keys, each
    /// at most [`ReplayBounds::key_bytes`] long.
    pub denied_keys: HashMap<Box<str>, u64>,
    /// Whether more keys were denied than tracked.
    pub keys_overflowed: bool,
    /// The first denial: line number, seconds since the first request, key.
    pub first_denial: Option<(u64, f64, String)>,
    /// Per second: (admitted, denied including shadow); at most [`ReplayBounds::seconds`].
    pub timeline: Vec<(u32, u32)>,
    key_names: Vec<String>,
}

impl RuleReport {
    /// The `n` keys with the most denials, most first (ties by key).
    pub fn top_denied(&self, n: usize) -> Vec<(&str, u64)> {
        let mut keys: Vec<(&str, u64)> = self.denied_keys.iter().map(|(k, v)| (&**k, *v)).collect();
        keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        keys.truncate(n);
        keys
    }
}

/// One config's replay.
pub struct Side {
    policy: Policy<ManualClock>,
    outcomes: Vec<RuleOutcome>,
    /// Per rule, in the config's order.
    pub rules: Vec<RuleReport>,
    /// Requests admitted overall.
    pub admitted: u64,
    /// Requests denied overall.
    pub denied: u64,
    /// Requests no enforcing rule could ever admit (cost too large).
    pub errors: u64,
    key: String,
    bounds: ReplayBounds,
}

impl Side {
    /// Builds the policy for `config` on a manual clock.
    ///
    /// # Errors
    /// The config's [`ConfigError`].
    pub fn new(config: PolicyConfig) -> Result<Self, ConfigError> {
        Side::with_bounds(config, ReplayBounds::default())
    }

    /// [`new`](Self::new), keeping at most what `bounds` allows.
    ///
    /// # Errors
    /// The config's [`ConfigError`].
    pub fn with_bounds(config: PolicyConfig, bounds: ReplayBounds) -> Result<Self, ConfigError> {
        let rules = config
            .rules
            .iter()
            .map(|r| RuleReport {
                rule: r.name.clone(),
                key_names: r.key.clone(),
                ..RuleReport::default()
            })
            .collect();
        Ok(Side {
            policy: Policy::with_clock(config, ManualClock::new())?,
            outcomes: Vec::with_capacity(8),
            rules,
            admitted: 0,
            denied: 0,
            errors: 0,
            key: String::new(),
            bounds,
        })
    }

    #[inline]
    fn decide(&mut self, request: &Request<'_>, now: u64, line: u64, second: Option<usize>) {
        let decided = self.policy.check_detailed_at(
            &request.descriptors,
            now,
            request.cost,
            &mut self.outcomes,
        );
        match decided {
            Ok(d) if d.is_allowed() => self.admitted += 1,
            Ok(_) => self.denied += 1,
            Err(_) => self.errors += 1,
        }
        for outcome in &self.outcomes {
            let Some(rule) = self.rules.iter_mut().find(|r| r.rule == outcome.rule) else {
                continue;
            };
            let allowed = outcome.decision.is_allowed();
            if allowed {
                rule.allowed += 1;
            } else if outcome.enforced {
                rule.denied += 1;
            } else {
                rule.shadow_denied += 1;
            }
            if let Some(s) = second {
                if rule.timeline.len() <= s {
                    rule.timeline.resize(s + 1, (0, 0));
                }
                let slot = &mut rule.timeline[s];
                if allowed {
                    slot.0 += 1;
                } else {
                    slot.1 += 1;
                }
            }
            if !allowed {
                self.key.clear();
                for (k, name) in rule.key_names.iter().enumerate() {
                    if k > 0 {
                        self.key.push(',');
                    }
                    let value = request
                        .descriptors
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or("", |(_, v)| v);
                    self.key.push_str(value);
                }
                cut(&mut self.key, self.bounds.key_bytes);
                if let Some(count) = rule.denied_keys.get_mut(self.key.as_str()) {
                    *count += 1;
                } else if rule.denied_keys.len() < self.bounds.tracked_keys {
                    rule.denied_keys.insert(self.key.as_str().into(), 1);
                } else {
                    rule.keys_overflowed = true;
                }
                if rule.first_denial.is_none() {
                    #[allow(clippy::cast_precision_loss)]
                    let secs = now as f64 / 1e9;
                    rule.first_denial = Some((line, secs, self.key.clone()));
                }
            }
        }
    }

    fn retained(&self) -> Retained {
        let mut held = Retained::default();
        for rule in &self.rules {
            held.denied_keys += rule.denied_keys.len();
            held.key_bytes += rule.denied_keys.keys().map(|k| k.len()).sum::<usize>();
            held.timeline_slots += rule.timeline.len();
        }
        held
    }
}

/// Cuts `key` to at most `max` bytes (on a character boundary), ending in `...` when cut.
fn cut(key: &mut String, max: usize) {
    if key.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(3);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    key.truncate(end);
    key.push_str("...");
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
    pub fn request(&mut self, request: &Request<'_>, line: u64) {
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
        let read = loop {
            match read_line(&mut input, &mut buf, self.bounds.line_bytes) {
                Ok(Line::End) => break Ok(()),
                Ok(Line::TooLong) => {
                    self.lines += 1;
                    self.malformed(self.lines, LineError::TooLong);
                }
                Ok(Line::Whole) => {
                    self.lines += 1;
                    let line = self.lines;
                    let mut text = &buf[..];
                    while let [rest @ .., b'\n' | b'\r'] = text {
                        text = rest;
                    }
                    if text.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match parse::parse_line(format, text, &mut scratch) {
                        Ok(request) => self.request(&request, line),
                        Err(why) => self.malformed(line, why),
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.buf = buf;
        read
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

    /// The text report: per rule, and the difference per rule from the baseline when there is one.
    pub fn report(&self, top: usize) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        #[allow(clippy::cast_precision_loss)]
        let span = self.span_ns as f64 / 1e9;
        let _ = writeln!(
            out,
            "{} requests over {span:.3} s ({} lines, {} malformed)",
            self.requests, self.lines, self.malformed
        );
        for (line, why) in &self.malformed_lines {
            let _ = writeln!(out, "  malformed line {line}: {why}");
        }
        if self.malformed > self.malformed_lines.len() as u64 {
            let _ = writeln!(
                out,
                "  ... and {} more",
                self.malformed - self.malformed_lines.len() as u64
            );
        }
        let side = |out: &mut String, name: &str, side: &Side| {
            let _ = writeln!(
                out,
                "\n{name}: {} admitted, {} denied, {} cost too large",
                side.admitted, side.denied, side.errors
            );
            let _ = writeln!(
                out,
                "  {:<24} {:>10} {:>10} {:>10} {:>12}",
                "rule", "allowed", "denied", "shadow", "keys denied"
            );
            for r in &side.rules {
                let keys = format!(
                    "{}{}",
                    if r.keys_overflowed { ">=" } else { "" },
                    r.denied_keys.len()
                );
                let _ = writeln!(
                    out,
                    "  {:<24} {:>10} {:>10} {:>10} {:>12}",
                    r.rule, r.allowed, r.denied, r.shadow_denied, keys
                );
                if let Some((line, at, key)) = &r.first_denial {
                    let _ = writeln!(
                        out,
                        "    first denial: line {line}, at {at:.3} s, key `{key}`"
                    );
                }
                let tops = r.top_denied(top);
                if !tops.is_empty() {
                    let list: Vec<String> =
                        tops.iter().map(|(k, n)| format!("`{k}` {n}")).collect();
                    let _ = writeln!(out, "    top denied keys: {}", list.join(", "));
                }
            }
        };
        side(&mut out, "new", &self.new);
        if let Some(baseline) = &self.baseline {
            side(&mut out, "baseline", baseline);
            let _ = writeln!(
                out,
                "\nnew - baseline: admitted {:+}, denied {:+}",
                signed(self.new.admitted, baseline.admitted),
                signed(self.new.denied, baseline.denied)
            );
            for diff in self.diff() {
                let _ = writeln!(
                    out,
                    "  {:<24} allowed {:+}, denied {:+}, shadow-denied {:+}{}",
                    diff.rule,
                    diff.allowed,
                    diff.denied,
                    diff.shadow_denied,
                    match (diff.in_new, diff.in_baseline) {
                        (true, false) => " (new rule)",
                        (false, true) => " (removed)",
                        _ => "",
                    }
                );
            }
        }
        out
    }

    /// Per rule (by name, the new config's first, then rules only the baseline has): new minus
    /// baseline. Empty without a baseline.
    pub fn diff(&self) -> Vec<RuleDiff> {
        let Some(baseline) = &self.baseline else {
            return Vec::new();
        };
        let find = |side: &Side, name: &str| side.rules.iter().find(|r| r.rule == name).cloned();
        let mut names: Vec<&str> = self.new.rules.iter().map(|r| r.rule.as_str()).collect();
        for r in &baseline.rules {
            if !names.contains(&r.rule.as_str()) {
                names.push(&r.rule);
            }
        }
        names
            .into_iter()
            .map(|name| {
                let (n, b) = (find(&self.new, name), find(baseline, name));
                let get =
                    |r: &Option<RuleReport>, f: fn(&RuleReport) -> u64| r.as_ref().map_or(0, f);
                RuleDiff {
                    rule: name.to_owned(),
                    in_new: n.is_some(),
                    in_baseline: b.is_some(),
                    allowed: signed(get(&n, |r| r.allowed), get(&b, |r| r.allowed)),
                    denied: signed(get(&n, |r| r.denied), get(&b, |r| r.denied)),
                    shadow_denied: signed(
                        get(&n, |r| r.shadow_denied),
                        get(&b, |r| r.shadow_denied),
                    ),
                }
            })
            .collect()
    }
}

/// What [`read_line`] found.
enum Line {
    /// The input is done.
    End,
    /// A line (with its newline, unless it is the input's last) is in the buffer.
    Whole,
    /// A line longer than the bound was skipped to its end (the buffer holds nothing of it).
    TooLong,
}

/// Reads one line of at most `max` bytes (its newline excluded) into `buf`; a longer one is read
/// to its end without being kept, so `buf` never holds more than `max + 1` bytes.
fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    buf.clear();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let n = input.by_ref().take(limit).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') || buf.len() <= max {
        // A whole line, or the input's last (no newline) within the bound.
        return Ok(Line::Whole);
    }
    buf.clear();
    loop {
        let available = match input.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(Line::TooLong);
        }
        match available.iter().position(|&b| b == b'\n') {
            Some(at) => {
                input.consume(at + 1);
                return Ok(Line::TooLong);
            }
            None => {
                let all = available.len();
                input.consume(all);
            }
        }
    }
}

/// One rule's difference, new minus baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleDiff {
    /// The rule.
    pub rule: String,
    /// Whether the new config has it.
    pub in_new: bool,
    /// Whether the baseline has it.
    pub in_baseline: bool,
    /// Allowed, new minus baseline.
    pub allowed: i128,
    /// Denied.
    pub denied: i128,
    /// Shadow-denied.
    pub shadow_denied: i128,
}

fn signed(a: u64, b: u64) -> i128 {
    i128::from(a) - i128::from(b)
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

    fn lines(input: &[u8], max: usize) -> Vec<(String, bool)> {
        let mut input = std::io::BufReader::with_capacity(3, input);
        let mut buf = Vec::new();
        let mut found = Vec::new();
        loop {
            match read_line(&mut input, &mut buf, max).expect("read") {
                Line::End => return found,
                Line::Whole => {
                    assert!(buf.len() <= max + 1);
                    found.push((String::from_utf8(buf.clone()).expect("text"), true));
                }
                Line::TooLong => {
                    assert!(buf.is_empty());
                    found.push((String::new(), false));
                }
            }
        }
    }

    #[test]
    fn a_line_past_the_bound_is_skipped_to_its_end_and_the_next_one_is_read() {
        let whole = |s: &str| (s.to_owned(), true);
        let skipped = (String::new(), false);
        assert_eq!(
            lines(b"abcd\nabcde\nab\n\nabcdefghij\nxy", 4),
            [
                whole("abcd\n"),
                skipped.clone(),
                whole("ab\n"),
                whole("\n"),
                skipped.clone(),
                whole("xy"),
            ]
        );
        assert_eq!(
            lines(b"abcd", 4),
            [whole("abcd")],
            "the last line, no newline"
        );
        assert_eq!(
            lines(b"abcde", 4),
            [skipped],
            "too long at the end of input"
        );
        assert!(lines(b"", 4).is_empty());
    }

    #[test]
    fn a_long_key_is_cut_on_a_character_boundary() {
        let mut key = "é".repeat(10); // 20 bytes
        cut(&mut key, 8);
        assert_eq!(key, "éé...");
        let mut short = "abcd".to_owned();
        cut(&mut short, 4);
        assert_eq!(short, "abcd");
    }

    #[test]
    fn a_denied_key_past_the_bound_is_tracked_cut() {
        let config = PolicyConfig::from_toml(
            r#"
            [[rules]]
            name = "per_user"
            match = { user = "any" }
            key = ["user"]
            limit = 1
            period = "1h"
            capacity = 10
            "#,
        )
        .expect("config");
        let bounds = ReplayBounds {
            key_bytes: 8,
            ..ReplayBounds::default()
        };
        let mut replay = Replay::with_bounds(config, None, bounds).expect("replay");
        let line = r#"{"ts":1,"descriptors":{"user":"abcdefghijkl"}}"#;
        let log = format!("{line}\n{line}\n");
        replay.run(log.as_bytes(), Format::Json).expect("read");
        let rule = &replay.new.rules[0];
        assert_eq!(rule.top_denied(1), [("abcde...", 1)]);
        assert_eq!(
            rule.first_denial.as_ref().map(|d| d.2.as_str()),
            Some("abcde...")
        );
    }
}
