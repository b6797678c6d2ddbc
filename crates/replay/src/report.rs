//! The text report of a replay, and its difference per rule from the baseline.

use crate::{Replay, RuleReport, Side};

impl Replay {
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
