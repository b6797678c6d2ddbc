//! `validate_config`: validation as loading does it, the config printed back with every default
//! spelled out, and errors that name the rule and field.

use tollgate_core::ManualClock;
use tollgate_policy::{ConfigErrorKind, ConfigFormat, Policy, PolicyConfig, validate_config};

const CONFIG: &str = r#"
[[rules]]
name = "per_ip"
match = { remote_address = "any", path = { prefix = "/api/" } }
key = ["remote_address"]
algorithm = "token_bucket"
limit = 10
period = "1s"
capacity = 1000

[[rules]]
name = "global"
limit = 100
period = "1m"
mode = "shadow"

[[overrides]]
rule = "per_ip"
tier = "gold"
values = ["192.0.2.1"]
limit = 50
period = "1s"
"#;

#[test]
fn the_normalised_config_spells_out_defaults_and_loads_as_the_same_policy() {
    let text = validate_config(CONFIG, ConfigFormat::Toml).expect("valid");
    for default in [
        "dry_run = false",
        "metrics = true",
        "descriptor_match = \"subset\"",
        "algorithm = \"gcra\"",
        "burst = 10",
        "burst = 100",
        "burst = 50",
        "mode = \"enforce\"",
        "mode = \"shadow\"",
        "storage = \"atomic\"",
        "period = \"1m\"",
    ] {
        assert!(text.contains(default), "missing `{default}` in\n{text}");
    }
    // The printed config is a fixed point, and it decides as the original does.
    let normalised = PolicyConfig::from_toml(&text).expect("reads back");
    assert_eq!(normalised.normalized().expect("valid"), normalised);
    let original = Policy::with_clock(PolicyConfig::from_toml(CONFIG).unwrap(), ManualClock::new())
        .expect("original");
    let reread = Policy::with_clock(normalised, ManualClock::new()).expect("normalised");
    let ip = [("remote_address", "192.0.2.9"), ("path", "/api/x")];
    for _ in 0..12 {
        assert_eq!(
            original.check_at(&ip, 1, 1).unwrap(),
            reread.check_at(&ip, 1, 1).unwrap()
        );
    }
    // YAML in, the same TOML out.
    let yaml = "rules:\n  - { name: g, limit: 5, period: 1s }\n";
    let from_yaml = validate_config(yaml, ConfigFormat::Yaml).expect("yaml");
    let from_toml = validate_config(
        "[[rules]]\nname = \"g\"\nlimit = 5\nperiod = \"1s\"\n",
        ConfigFormat::Toml,
    )
    .expect("toml");
    assert_eq!(from_yaml, from_toml);
}

#[test]
fn an_invalid_config_names_the_rule_and_the_field() {
    let broken = CONFIG.replace("limit = 100", "limit = 0");
    let error = validate_config(&broken, ConfigFormat::Toml).expect_err("limit 0");
    assert_eq!(error.rule.as_deref(), Some("global"));
    assert_eq!(error.field, "limit");
    assert!(matches!(error.kind, ConfigErrorKind::Quota(_)));
    let shown = error.to_string();
    assert!(shown.contains("rule `global`, field `limit`"), "{shown}");

    let unknown = CONFIG.replace("\"token_bucket\"", "\"token_bukket\"");
    let error = validate_config(&unknown, ConfigFormat::Toml).expect_err("algorithm");
    assert_eq!(
        (error.rule.as_deref(), error.field),
        (Some("per_ip"), "algorithm")
    );
    // The same error that loading gives.
    let load = Policy::new(PolicyConfig::from_toml(&unknown).unwrap()).expect_err("load");
    assert_eq!(load, error);
}
