//! The rollout guide (guides/rollout.md) shows a replay's report: its two configs, replayed on the
//! traffic its commands generate, print exactly that report.

use tollgate_policy::PolicyConfig;
use tollgate_replay::{Format, Replay};

const GUIDE: &str = include_str!("../../../guides/rollout.md");

/// The guide's fenced blocks of `lang`, in order.
fn blocks(lang: &str) -> Vec<&'static str> {
    let fence = format!("```{lang}\n");
    let mut found = Vec::new();
    let mut rest = GUIDE;
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("the block ends");
        found.push(&body[..end]);
        rest = &body[end + 3..];
    }
    found
}

/// `tollgate generate --keys 3 --rate 5 --seconds 60` and `--keys 1 --rate 40 --seconds 20`,
/// merged as `LC_ALL=C sort` merges them (bytewise).
fn traffic() -> Vec<u8> {
    let start = 1_700_000_000; // what the command passes
    let mut a = Vec::new();
    tollgate_replay::generate(&mut a, 3, 5, 60, start).expect("write");
    tollgate_replay::generate(&mut a, 1, 40, 20, start).expect("write");
    let mut lines: Vec<&[u8]> = a.split_inclusive(|&b| b == b'\n').collect();
    lines.sort_unstable();
    lines.concat()
}

#[test]
fn the_guides_replay_report_is_what_its_configs_and_traffic_give() {
    let tomls = blocks("toml");
    assert_eq!(tomls.len(), 2, "current.toml, then new.toml");
    let current = PolicyConfig::from_toml(tomls[0]).expect("current.toml");
    let new = PolicyConfig::from_toml(tomls[1]).expect("new.toml");
    let mut replay = Replay::new(new, Some(current)).expect("configs");
    replay.run(&traffic()[..], Format::Json).expect("read");
    let shown = blocks("text");
    assert_eq!(replay.report(5), shown[0]);
}
