//! Replays recorded traffic through a tollgate-policy config on a simulated clock, before the
//! config ships: what each rule would have allowed, denied and shadow-denied, which keys it would
//! have denied and when first, the difference from the config in force (`--baseline`), and a
//! timeline picture.
//!
//! * Input ([`parse`]): JSON lines, nginx `combined` and Envoy default access logs, each through the
//!   field mapping stated there. Read as a stream, one line at a time, in bounded memory: the
//!   policy's tables are bounded by their `capacity`, each rule tracks at most
//!   [`MAX_TRACKED_KEYS`] denied keys, and the timeline at most [`MAX_SECONDS`] seconds.
//! * Malformed lines are counted, the first [`MAX_REPORTED_LINES`] listed with their numbers;
//!   they never stop the replay.
//! * Time: each request is decided at its timestamp on the policy's [`ManualClock`]'s scale (the
//!   first request at 0). A line earlier than one before it is decided at the latest time seen
//!   (logs are written as requests finish, slightly out of order).
//! * Counts per rule are the engine's own ([`Policy::snapshot`]'s meaning): a rule evaluated after
//!   another denied is only peeked, and its verdict counted.

pub mod parse;
pub mod plot;

use std::collections::HashMap;
use std::io::BufRead;

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigError, Policy, PolicyConfig, RuleOutcome};

pub use parse::{Format, LineError, Request};

/// Distinct denied keys tracked per rule; more are counted as denials but not told apart.
pub const MAX_TRACKED_KEYS: usize = 100_000;
/// Seconds of timeline kept; later requests are decided and counted but not plotted.
pub const MAX_SECONDS: usize = 7 * 86_400;
/// Malformed lines listed by number (all are counted).
pub const MAX_REPORTED_LINES: usize = 20;

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
    /// Denials (enforced or shadow) per key; at most [`MAX_TRACKED_KEYS`] keys.
    pub denied_keys: HashMap<Box<str>, u64>,
    /// Whether more keys were denied than tracked.
    pub keys_overflowed: bool,
    /// The first denial: line number, seconds since the first request, key.
    pub first_denial: Option<(u64, f64, String)>,
    /// Per second: (admitted, denied including shadow).
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
}

impl Side {
    /// Builds the policy for `config` on a manual clock.
    ///
    /// # Errors
    /// The config's [`ConfigError`].
    pub fn new(config: PolicyConfig) -> Result<Self, ConfigError> {
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
                if let Some(count) = rule.denied_keys.get_mut(self.key.as_str()) {
                    *count += 1;
                } else if rule.denied_keys.len() < MAX_TRACKED_KEYS {
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
}

impl Replay {
    /// A replay of `new`, beside `baseline` when given.
    ///
    /// # Errors
    /// A config's [`ConfigError`].
    pub fn new(new: PolicyConfig, baseline: Option<PolicyConfig>) -> Result<Self, ConfigError> {
        Ok(Replay {
            new: Side::new(new)?,
            baseline: baseline.map(Side::new).transpose()?,
            lines: 0,
            requests: 0,
            malformed: 0,
            malformed_lines: Vec::new(),
            span_ns: 0,
            t0: None,
            last: 0,
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
            .filter(|&s| s < MAX_SECONDS);
        self.new.decide(request, now, line, second);
        if let Some(baseline) = &mut self.baseline {
            baseline.decide(request, now, line, second);
        }
    }

    /// Counts a malformed line.
    pub fn malformed(&mut self, line: u64, why: LineError) {
        self.malformed += 1;
        if self.malformed_lines.len() < MAX_REPORTED_LINES {
            self.malformed_lines.push((line, why));
        }
    }

    /// Reads every line of `input` in `format` and decides it. Memory stays bounded whatever the
    /// input's size (one line buffer).
    ///
    /// # Errors
    /// Only reading errors; malformed lines are counted.
    pub fn run(&mut self, input: impl BufRead, format: Format) -> std::io::Result<()> {
        let mut input = input;
        let mut buf = Vec::with_capacity(4096);
        let mut scratch = parse::Scratch::default();
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf)? == 0 {
                return Ok(());
            }
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
