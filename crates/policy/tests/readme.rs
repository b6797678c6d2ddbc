//! The policy guide's gateway policy (guides/policy.md) is a working config: parsed from the guide itself, built, and
//! exercised; the same config round-trips through YAML (one schema).

use std::time::Duration;

use tollgate_core::{ManualClock, Quota};
use tollgate_policy::{Policy, PolicyConfig};

fn readme_policy() -> String {
    let readme = include_str!("../../../guides/policy.md");
    let section = readme
        .split("# Policies: several limits per request")
        .nth(1)
        .expect("the guide has the policy section");
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + section[start..].find("```").expect("the block ends");
    section[start..end].to_owned()
}

#[test]
fn the_readme_gateway_example_builds_and_decides() {
    let config = PolicyConfig::from_toml(&readme_policy()).unwrap();
    assert_eq!(config.rules.len(), 6);
    let policy = Policy::with_clock(config.clone(), ManualClock::new()).unwrap();
    let now = 10_000_000_000;
    let request = |ip: &'static str, key: &'static str| {
        [
            ("remote_address", ip),
            ("route", "/v1/search/items"),
            ("method", "GET"),
            ("api_key", key),
            ("tenant", "acme"),
        ]
    };
    let mut out = Vec::new();
    let d = policy
        .check_detailed_at(&request("192.0.2.1", "key-free"), now, 1, &mut out)
        .unwrap();
    assert!(d.is_allowed());
    // GET: the writes rule does not apply; the other five do.
    assert_eq!(
        out.iter().map(|o| o.rule).collect::<Vec<_>>(),
        [
            "per_ip",
            "per_api_key",
            "search",
            "global",
            "per_tenant_trial"
        ]
    );
    assert_eq!(d.rule, Some("search"), "the search rule is the tightest");
    // A pro key is limited by its tier.
    policy
        .check_detailed_at(&request("192.0.2.2", "key-pro-1"), now, 1, &mut out)
        .unwrap();
    assert_eq!(out[1].quota, Quota::per_hour(10_000).unwrap());
    // The search rule's burst of 5, then waits of up to 500 ms, then a denial.
    let mut delays = Vec::new();
    loop {
        let d = policy
            .check_at(&request("192.0.2.3", "key-ent-1"), now, 1)
            .unwrap();
        if !d.is_allowed() {
            assert_eq!(d.rule, Some("search"));
            break;
        }
        delays.push(d.delay);
    }
    let ms = Duration::from_millis;
    assert_eq!(
        delays,
        [ms(0), ms(0), ms(0), ms(0), ms(0), ms(200), ms(400)]
    );
    // The shadow rule counts: per_tenant_trial saw every request and denied none (100/s).
    let stats = policy.snapshot();
    assert_eq!(stats.rule("per_tenant_trial").unwrap().allowed, 10);
    // One schema: the same config through YAML.
    let yaml = serde_yaml_ng::to_string(&config).unwrap();
    assert_eq!(PolicyConfig::from_yaml(&yaml).unwrap(), config);
}
