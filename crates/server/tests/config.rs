//! The server's config file: the examples parse and build, descriptor matching, the Redis
//! backend's fields and errors, durability, duplicate and empty configs.

use std::time::Duration;

use tollgate_policy::DescriptorMatch;
use tollgate_server::backend::{Backend, DurableSettings, FailMode, RedisMode};
use tollgate_server::config::{ConfigFileError, ServerConfig};

#[test]
fn example_configs_parse_and_build() {
    for (text, yaml) in [
        (include_str!("../examples/configs/embedded.toml"), false),
        (include_str!("../examples/configs/embedded.yaml"), true),
    ] {
        let config = ServerConfig::parse(text, yaml).expect("example parses");
        assert!(!config.domains.is_empty());
        tollgate_server::service::LiveDomains::new(&config).expect("example builds");
    }
}

#[tokio::test]
async fn redis_example_parses_and_builds() {
    // Building connects lazily (inside a runtime): no Redis needs to run.
    let config = ServerConfig::parse(include_str!("../examples/configs/redis.toml"), false)
        .expect("example parses");
    let Backend::Redis(edge) = &config.domains[0].backend else {
        panic!("edge is on redis");
    };
    assert_eq!(edge.mode, RedisMode::PerRequest);
    assert_eq!(edge.fail, FailMode::Closed);
    let Backend::Redis(api) = &config.domains[1].backend else {
        panic!("api is on redis");
    };
    assert_eq!(api.mode, RedisMode::Lease);
    assert_eq!(api.fail, FailMode::Open);
    assert_eq!(api.lease.map(|l| l.size), Some(50));
    tollgate_server::service::LiveDomains::new(&config).expect("example builds");
    let yaml = ServerConfig::parse(include_str!("../examples/configs/redis.yaml"), true)
        .expect("yaml example parses");
    assert!(
        matches!(&yaml.domains[1].backend, Backend::Redis(r) if r.mode == RedisMode::Lease && r.lease.map(|l| l.size) == Some(50))
    );
    tollgate_server::service::LiveDomains::new(&yaml).expect("yaml example builds");
}

#[tokio::test]
async fn the_server_guide_redis_fragment_parses_and_builds() {
    let readme = include_str!("../../../guides/server.md");
    let section = readme
        .split("# tollgate-server")
        .nth(1)
        .expect("the server guide has its section");
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + section[start..].find("```").expect("the block ends");
    // The fragment shows the backend; its `[domains.policy]` is left for the reader's rules.
    let fragment = format!(
        "{}[[domains.policy.rules]]\nname = \"r\"\nmatch = {{ k = \"any\" }}\nlimit = 5\nperiod = \"1s\"\n",
        &section[start..end]
    );
    let config = ServerConfig::parse(&fragment, false).expect("the guide's fragment parses");
    assert!(matches!(&config.domains[0].backend, Backend::Redis(r) if r.mode == RedisMode::Lease));
    tollgate_server::service::LiveDomains::new(&config).expect("the guide's fragment builds");
}

#[test]
fn a_concurrency_rule_is_refused_with_what_to_use_instead() {
    let toml = "[[domains]]\nname = \"a\"\n[domains.policy]\n\
                [[domains.policy.rules]]\nname = \"r\"\nmatch = { k = \"any\" }\n\
                limit = 5\nperiod = \"1s\"\n\
                [[domains.policy.concurrency]]\nname = \"busy\"\nlimit = 5\n";
    match ServerConfig::parse(toml, false) {
        Err(ConfigFileError::Invalid(message)) => {
            assert!(message.contains("concurrency rule `busy`"), "{message}");
            assert!(message.contains("circuit_breakers"), "{message}");
            assert!(message.contains("AdmitLayer"), "{message}");
        }
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn domains_match_descriptors_exactly_unless_their_policy_says_subset() {
    let domain = |extra: &str, rule: &str| {
        format!(
            "[[domains]]\nname = \"a\"\n[domains.policy]\n{extra}[[domains.policy.rules]]\n\
             name = \"r\"\n{rule}limit = 5\nperiod = \"1s\"\n"
        )
    };
    let config =
        ServerConfig::parse(&domain("", "match = { k = \"any\" }\n"), false).expect("parses");
    assert_eq!(
        config.domains[0].policy.descriptor_match,
        Some(DescriptorMatch::Exact)
    );
    // Under exact matching an empty match could never apply: refused, naming the rule.
    match ServerConfig::parse(&domain("", ""), false) {
        Err(ConfigFileError::Invalid(m)) => assert!(m.contains("rule `r`"), "{m}"),
        other => panic!("expected an invalid config, got {other:?}"),
    }
    let config = ServerConfig::parse(&domain("descriptor_match = \"subset\"\n", ""), false)
        .expect("subset keeps the engine's matching, where an empty match is every request");
    assert_eq!(
        config.domains[0].policy.descriptor_match,
        Some(DescriptorMatch::Subset)
    );
}

#[test]
fn duplicate_domains_and_bad_policies_are_rejected() {
    let dup = "[[domains]]\nname = \"a\"\n[domains.policy]\n[[domains]]\nname = \"a\"\n[domains.policy]\n";
    assert!(
        matches!(ServerConfig::parse(dup, false), Err(ConfigFileError::Invalid(m)) if m.contains("twice"))
    );
    let bad = "[[domains]]\nname = \"a\"\n[domains.policy]\n[[domains.policy.rules]]\nname = \"r\"\nlimit = 0\nperiod = \"1s\"\n";
    assert!(
        matches!(ServerConfig::parse(bad, false), Err(ConfigFileError::Invalid(m)) if m.contains("domain `a`"))
    );
    assert!(matches!(
        ServerConfig::parse("[[domains]]\nnme = 1", false),
        Err(ConfigFileError::Parse(_))
    ));
}

#[test]
fn an_empty_config_is_refused_unless_allowed() {
    let rule = "[[domains.policy.rules]]\nname = \"r\"\nmatch = { k = \"any\" }\nlimit = 5\nperiod = \"1s\"\n";
    let no_rules = "[[domains]]\nname = \"a\"\n[domains.policy]\n";
    let second_empty = format!(
        "[[domains]]\nname = \"a\"\n[domains.policy]\n{rule}\
         [[domains]]\nname = \"b\"\n[domains.policy]\n"
    );
    for (text, yaml, what) in [
        ("", false, "no domains"),
        ("", true, "no domains"),
        ("\n# nothing yet\n", false, "no domains"),
        ("[server]\nreload_poll = \"1s\"\n", false, "no domains"),
        ("domains: []\n", true, "no domains"),
        (no_rules, false, "domain `a` has no rules"),
        (&second_empty, false, "domain `b` has no rules"),
    ] {
        match ServerConfig::parse(text, yaml) {
            Err(e @ ConfigFileError::Empty(_)) => {
                assert!(e.to_string().contains(what), "{text:?}: {e}");
                assert!(e.to_string().contains("allow_empty"), "{e}");
            }
            other => panic!("{text:?}: expected an empty-config error, got {other:?}"),
        }
    }
    for text in [
        "[server]\nallow_empty = true\n".to_owned(),
        format!("[server]\nallow_empty = true\n{no_rules}"),
    ] {
        let config = ServerConfig::parse(&text, false).expect("allowed");
        tollgate_server::service::LiveDomains::new(&config).expect("builds");
    }
    let yaml = ServerConfig::parse("server: { allow_empty: true }\n", true).expect("allowed");
    assert!(yaml.domains.is_empty());
}

#[test]
fn redis_domains_keyed_rules_need_no_capacity() {
    let toml = |backend: &str, capacity: &str| {
        format!(
            "[[domains]]\nname = \"a\"\nbackend = {backend}\n[domains.policy]\n\
             [[domains.policy.rules]]\nname = \"per_user\"\nmatch = {{ user = \"any\" }}\n\
             key = [\"user\"]\nlimit = 5\nperiod = \"1s\"\n{capacity}"
        )
    };
    let redis = r#"{ redis = { url = "redis://127.0.0.1:1/" } }"#;
    for capacity in ["", "capacity = 10000000\n"] {
        let config = ServerConfig::parse(&toml(redis, capacity), false).expect("parses");
        assert_eq!(
            config.domains[0].policy.metric_labels.get("domain"),
            Some(&"a".to_owned()),
            "the domain labels its rules' metrics"
        );
    }
    // Embedded domains keep theirs, and still need one.
    let config =
        ServerConfig::parse(&toml("\"embedded\"", "capacity = 1000\n"), false).expect("parses");
    assert_eq!(config.domains[0].policy.rules[0].capacity, Some(1000));
    assert!(ServerConfig::parse(&toml("\"embedded\"", ""), false).is_err());
}

#[test]
fn redis_backend_yaml_and_errors() {
    let policy = "  policy:\n    rules:\n      - { name: g, match: { generic_key: any }, limit: 5, period: 1s }\n";
    let yaml = format!(
        "domains:\n- name: a\n  backend: {{ redis: {{ url: 'redis://127.0.0.1:1/', mode: lease, fail: open }} }}\n{policy}- name: b\n  backend: embedded\n{policy}"
    );
    let config = ServerConfig::parse(&yaml, true).expect("yaml parses");
    assert!(
        matches!(&config.domains[0].backend, Backend::Redis(r) if r.mode == RedisMode::Lease && r.fail == FailMode::Open)
    );
    assert_eq!(config.domains[1].backend, Backend::Embedded);

    let toml = |backend: &str, rule: &str| {
        format!(
            "[[domains]]\nname = \"a\"\nbackend = {backend}\n[domains.policy]\n[[domains.policy.rules]]\nname = \"r\"\nmatch = {{ generic_key = \"any\" }}\nlimit = 5\nperiod = \"1s\"\n{rule}"
        )
    };
    let parse_err = |backend: &str| match ServerConfig::parse(&toml(backend, ""), false) {
        Err(ConfigFileError::Parse(m)) => m,
        other => panic!("{backend}: expected a parse error, got {other:?}"),
    };
    assert!(parse_err(r#"{ redis = { url = "redis://x/", mdoe = "lease" } }"#).contains("mdoe"));
    assert!(parse_err(r#"{ redis = { url = "redis://x/", mode = "leases" } }"#).contains("leases"));
    assert!(parse_err(r#"{ redis = { mode = "lease" } }"#).contains("url"));
    assert!(parse_err(r#""redis""#).contains("needs settings"));
    assert!(parse_err(r#""memcached""#).contains("memcached"));
    let invalid = |backend: &str, rule: &str| match ServerConfig::parse(&toml(backend, rule), false)
    {
        Err(ConfigFileError::Invalid(m)) => m,
        other => panic!("{backend}: expected invalid, got {other:?}"),
    };
    let lease = r#"{ redis = { url = "redis://x/", mode = "lease" } }"#;
    assert!(invalid(lease, "algorithm = \"fixed_window\"\n").contains("gcra only"));
    assert!(invalid(lease, "delay = { max_delay = \"100ms\" }\n").contains("delay"));
    assert!(
        invalid(
            r#"{ redis = { url = "redis://x/", lease = { size = 5 } } }"#,
            ""
        )
        .contains("only for mode")
    );
}

#[test]
fn durable_parses_and_is_checked_against_the_mode_and_the_timeout() {
    let toml = |backend: &str| {
        format!(
            "[[domains]]\nname = \"a\"\nbackend = {backend}\n[domains.policy]\n[[domains.policy.rules]]\nname = \"r\"\nmatch = {{ generic_key = \"any\" }}\nlimit = 5\nperiod = \"1s\"\n"
        )
    };
    let config = ServerConfig::parse(
        &toml(r#"{ redis = { url = "redis://x/", durable = { replicas = 1, timeout = "5ms" } } }"#),
        false,
    )
    .expect("parses");
    let Backend::Redis(redis) = &config.domains[0].backend else {
        panic!("on redis");
    };
    assert_eq!(
        redis.durable,
        Some(DurableSettings {
            replicas: 1,
            timeout: Duration::from_millis(5)
        })
    );
    let invalid = |backend: &str| match ServerConfig::parse(&toml(backend), false) {
        Err(ConfigFileError::Invalid(m)) => m,
        other => panic!("{backend}: expected invalid, got {other:?}"),
    };
    assert!(
        invalid(r#"{ redis = { url = "redis://x/", mode = "lease", durable = { replicas = 1, timeout = "5ms" } } }"#)
            .contains("only for mode = \"per_request\"")
    );
    assert!(
        invalid(
            r#"{ redis = { url = "redis://x/", durable = { replicas = 0, timeout = "5ms" } } }"#
        )
        .contains("above 0")
    );
    // The default call timeout is 50 ms; a WAIT of 50 ms (or 49.5 ms, rounded up) is not below.
    for wait in ["50ms", "49500us", "1s"] {
        let backend = format!(
            r#"{{ redis = {{ url = "redis://x/", durable = {{ replicas = 1, timeout = "{wait}" }} }} }}"#
        );
        assert!(invalid(&backend).contains("must be below"), "{wait}");
    }
    let ok = r#"{ redis = { url = "redis://x/", timeout = "2s", durable = { replicas = 2, timeout = "1s" } } }"#;
    assert!(ServerConfig::parse(&toml(ok), false).is_ok());
    let tagged = ServerConfig::parse(
        &toml(r#"{ redis = { url = "redis://x/", hash_tag = "generic_key" } }"#),
        false,
    )
    .expect("hash_tag parses");
    let Backend::Redis(redis) = &tagged.domains[0].backend else {
        panic!("on redis");
    };
    assert_eq!(redis.hash_tag.as_deref(), Some("generic_key"));
    assert!(
        invalid(r#"{ redis = { url = "redis://x/", cluster = true, durable = { replicas = 1, timeout = "5ms" } } }"#)
            .contains("not supported on a cluster")
    );
    assert!(
        invalid(r#"{ redis = { url = "redis://x/", cluster = true, password_env = "P" } }"#)
            .contains("not supported on a cluster")
    );
}
