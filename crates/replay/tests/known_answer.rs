//! Replays of generated traffic whose answer is known exactly.

use std::process::Command;

use tollgate_policy::PolicyConfig;
use tollgate_replay::{LineError, Replay, generate};

/// Fixed windows of 1 s starting at the first request: each second, each key's first 10 pass.
const NEW: &str = r#"
[[rules]]
name = "global_shadow"
algorithm = "fixed_window"
limit = 15
period = "1s"
mode = "shadow"

[[rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
algorithm = "fixed_window"
limit = 10
period = "1s"
capacity = 100
"#;

fn traffic() -> Vec<u8> {
    // Two keys, 20 requests per second each, for 10 s: 400 lines, k0 and k1 interleaved.
    let mut out = Vec::new();
    generate(&mut out, 2, 20, 10, 1_700_000_000).expect("generate");
    out
}

#[test]
fn a_ten_per_second_limit_against_twenty_per_second_for_ten_seconds() {
    let baseline = NEW.replace("limit = 10", "limit = 15");
    let mut replay = Replay::new(
        PolicyConfig::from_toml(NEW).unwrap(),
        Some(PolicyConfig::from_toml(&baseline).unwrap()),
    )
    .expect("configs");
    replay
        .run(&traffic()[..], tollgate_replay::Format::Json)
        .expect("read");
    assert_eq!(
        (replay.lines, replay.requests, replay.malformed),
        (400, 400, 0)
    );
    assert_eq!((replay.new.admitted, replay.new.denied), (200, 200));

    let per_user = &replay.new.rules[1];
    assert_eq!(per_user.rule, "per_user");
    assert_eq!(
        (per_user.allowed, per_user.denied, per_user.shadow_denied),
        (200, 200, 0)
    );
    assert_eq!(per_user.top_denied(5), [("k0", 100), ("k1", 100)]);
    // The 11th request of k0 (at 0.5 s) is line 21: lines 1..20 are n = 0..9 of k0 and k1.
    let (line, at, key) = per_user.first_denial.clone().expect("a denial");
    assert_eq!((line, key.as_str()), (21, "k0"));
    assert!((at - 0.5).abs() < 1e-9, "{at}");
    // Every second: 20 admitted, 20 denied.
    assert_eq!(per_user.timeline, vec![(20, 20); 10]);

    // The shadow rule goes first: 15 pass a second, 25 would have been denied; nothing is.
    let shadow = &replay.new.rules[0];
    assert_eq!(
        (shadow.allowed, shadow.denied, shadow.shadow_denied),
        (150, 0, 250)
    );

    // The baseline lets 15 a second through per key.
    let baseline = replay.baseline.as_ref().expect("baseline");
    assert_eq!((baseline.admitted, baseline.denied), (300, 100));
    let diff = replay.diff();
    let per_user = diff
        .iter()
        .find(|d| d.rule == "per_user")
        .expect("per_user");
    assert_eq!((per_user.allowed, per_user.denied), (-100, 100));
    let report = replay.report(3);
    assert!(
        report.contains("per_user                 allowed -100, denied +100"),
        "{report}"
    );
}

#[test]
fn malformed_lines_are_counted_with_their_numbers_and_change_nothing_else() {
    let mut input = traffic();
    // Line 401: not JSON; 402: not UTF-8; 403: no timestamp; a blank line 404 is skipped.
    input.extend_from_slice(b"garbage\n\xff\xfe\n{\"descriptors\":{}}\n\n");
    let mut replay = Replay::new(PolicyConfig::from_toml(NEW).unwrap(), None).expect("config");
    replay
        .run(&input[..], tollgate_replay::Format::Json)
        .expect("read");
    assert_eq!(replay.requests, 400);
    assert_eq!(replay.malformed, 3);
    assert_eq!(
        replay.malformed_lines,
        [
            (401, LineError::Syntax),
            (402, LineError::Utf8),
            (403, LineError::Timestamp)
        ]
    );
    assert_eq!((replay.new.admitted, replay.new.denied), (200, 200));
    assert!(replay.report(3).contains("malformed line 402: not UTF-8"));
}

#[test]
fn the_command_prints_the_report_and_writes_the_timeline() {
    let dir = std::env::temp_dir().join(format!("tollgate-replay-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (config, baseline, log, svg) = (
        dir.join("new.toml"),
        dir.join("current.toml"),
        dir.join("traffic.jsonl"),
        dir.join("timeline.svg"),
    );
    std::fs::write(&config, NEW).unwrap();
    std::fs::write(&baseline, NEW.replace("limit = 10", "limit = 15")).unwrap();
    std::fs::write(&log, traffic()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("replay")
        .arg("--config")
        .arg(&config)
        .arg("--baseline")
        .arg(&baseline)
        .arg("--svg")
        .arg(&svg)
        .arg(&log)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("400 requests"), "{report}");
    assert!(
        report.contains("top denied keys: `k0` 100, `k1` 100"),
        "{report}"
    );
    let picture = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        picture.starts_with("<svg"),
        "{}",
        &picture[..100.min(picture.len())]
    );
    assert!(picture.contains("per_user"));
    let _ = std::fs::remove_dir_all(&dir);
}
