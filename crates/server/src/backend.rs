//! A domain's state backend: embedded (this process) or Redis, with every Redis setting (URL,
//! mode, fail policy, breaker, lease, durability, TLS) and its checks against the domain's policy.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_policy::PolicyConfig;

/// A domain's state backend: `backend = "embedded"` (the default) or
/// `backend = { redis = { url = "redis://127.0.0.1:6379", ... } }` (YAML:
/// `backend: embedded`, `backend: { redis: { url: ... } }`); see [`RedisBackend`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The process holds the state (tollgate-policy's own limiters).
    #[default]
    Embedded,
    /// Every rule's state lives in one shared Redis, so replicas pointing at it share each rule's
    /// quota. Keyed rules need no `capacity` here (the process keeps no table for them; one given
    /// is ignored).
    Redis(Box<RedisBackend>),
}

/// `backend = { redis = { ... } }`: where and how a domain's rules keep their state in Redis.
///
/// ```toml
/// backend = { redis = { url = "redis://127.0.0.1:6379/", mode = "lease", fail = "open" } }
/// # every field:
/// # url = "redis://host:port/db"   required
/// # mode = "per_request"           or "lease" (gcra rules only)
/// # fail = "closed"                or "open": the answer while Redis is down
/// # fail_retry_after = "1s"        the wait a fail-closed denial advertises
/// # prefix = "tollgate:"           key namespace (then "<domain>:<rule>:<algorithm>:<key>")
/// # timeout = "50ms"               per Redis call; then the fail policy answers
/// # breaker = { failures = 3, probe_interval = "100ms" }   failures = 0: no breaker
/// # lease = { size = 100, ttl = "100ms", min_grant = 1, max_keys = 10000, renew_below = 0 }   lease mode only
/// # username = "limiter"           an ACL user (AUTH username password)
/// # password_file = "/run/secrets/redis"   or password_env = "REDIS_PASSWORD" (never both)
/// # tls = { ca_file = "ca.crt", client_cert = "c.crt", client_key = "c.key" }   rediss:// only
/// # durable = { replicas = 1, timeout = "5ms" }   per_request only: WAIT after each admission
/// # hash_tag = "tenant"            rules keyed by this descriptor keep their keys in its slot
/// # cluster = false                true: url is one node of a Redis Cluster
/// ```
///
/// The password is read when the config is built (at start and at each reload, so a rotated
/// secret is picked up by a reload) and never logged: this type's `Debug` shows the URL with its
/// password (if it has one) as `[redacted]`, and errors name the file or variable, never the value.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisBackend {
    /// `redis://host:port/db` or `rediss://...` (TLS; redis-rs URL syntax). A password in the URL
    /// works too, but a file or an environment variable keeps it out of the config (and a
    /// printed config shows it as `[redacted]`).
    #[serde(serialize_with = "serialize_redacted")]
    pub url: String,
    /// An ACL user to authenticate as (`None`: the URL's, or Redis's `default`).
    #[serde(default)]
    pub username: Option<String>,
    /// A file holding the password (its trailing line break dropped).
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// An environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// TLS files for a `rediss://` URL.
    #[serde(default)]
    pub tls: Option<RedisTls>,
    /// One script call per rule per request, or local leases.
    #[serde(default)]
    pub mode: RedisMode,
    /// What a rule answers while Redis cannot (down, slow, corrupt state).
    #[serde(default)]
    pub fail: FailMode,
    /// The `retry_after` a fail-closed denial advertises.
    #[serde(default = "default_fail_retry", with = "humantime_serde")]
    pub fail_retry_after: Duration,
    /// Key namespace; the Redis key of a rule's key is
    /// `<prefix><domain>:<rule>:<algorithm>:<key>`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Per-call timeout (connect and response).
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The circuit breaker in front of each rule's connection.
    #[serde(default)]
    pub breaker: BreakerSettings,
    /// Lease sizing (lease mode only).
    #[serde(default)]
    pub lease: Option<LeaseSettings>,
    /// Durable admissions (per request mode only): after a script that admitted a request, wait
    /// for `replicas` replicas to confirm it (`WAIT`) for at most `timeout`; when fewer do, the
    /// request is answered by `fail` (closed: `OVER_LIMIT`; open: OK) and counted in
    /// `tollgate_policy_store_failures_total{cause="not_replicated"}`. None by default.
    #[serde(default)]
    pub durable: Option<DurableSettings>,
    /// A descriptor whose value becomes a Redis Cluster hash tag in the keys of the rules keyed by
    /// it (tollgate-policy `RedisSettings::hash_tag`): all of a request's such keys share one slot.
    #[serde(default)]
    pub hash_tag: Option<String>,
    /// The URL is one node of a Redis Cluster (the others are found from it): a request's keys in
    /// several slots are decided as one script per slot with compensating refunds. AUTH as a URL
    /// password only; no TLS, no `durable` (not built for a cluster yet).
    #[serde(default)]
    pub cluster: bool,
}

/// `durable = { replicas = 1, timeout = "5ms" }` (tollgate-redis `Durability`): `WAIT replicas
/// timeout` after each admitting script. `timeout` is rounded up to whole milliseconds and must
/// stay below the backend's `timeout` (a `WAIT` answers only once its timeout has passed when too
/// few replicas confirm). An admitted request costs one more round trip plus the replicas'
/// acknowledgement (one `WAIT` per group of coalesced requests, on one node); `WAIT` holds the
/// domain's shared connection while it waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DurableSettings {
    /// How many replicas must confirm (at least 1).
    pub replicas: u32,
    /// How long to wait for them.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

/// How a Redis domain decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One atomic script call per rule per request (tollgate-redis `RedisLimiter`): exact across
    /// replicas.
    #[default]
    PerRequest,
    /// Each replica leases up to `lease.size` units per call and admits locally
    /// (tollgate-redis `LeasedLimiter`, GCRA rules only): bounded error, far fewer round trips.
    Lease,
}

/// The answer while Redis cannot decide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// Deny (`OVER_LIMIT` with `fail_retry_after`): protection over availability.
    #[default]
    Closed,
    /// Admit, as if the rule did not apply: availability over protection.
    Open,
}

/// `breaker = { failures = 3, probe_interval = "100ms" }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// Consecutive outage failures that open the circuit (then calls are answered by the fail
    /// policy without touching the network); 0 turns the breaker off.
    #[serde(default = "default_failures")]
    pub failures: u32,
    /// While open, one call per interval probes Redis.
    #[serde(default = "default_probe", with = "humantime_serde")]
    pub probe_interval: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failures: default_failures(),
            probe_interval: default_probe(),
        }
    }
}

/// `lease = { size = 100, ttl = "100ms", min_grant = 1, max_keys = 10000, renew_below = 0 }`
/// (tollgate-redis `LeaseConfig`; every field optional).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSettings {
    /// Units asked for per lease (`k`).
    #[serde(default = "default_lease_size")]
    pub size: u64,
    /// How long leased units may be spent before they are dropped.
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub ttl: Duration,
    /// Fewest units worth a round trip.
    #[serde(default = "default_min_grant")]
    pub min_grant: u64,
    /// Most keys a replica tracks locally per rule.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// Units left in a live lease below which the next lease is taken ahead of need, so that a
    /// busy key's requests do not wait on the lease call (tollgate-redis
    /// `LeaseConfig::renew_below`); 0, the default: only when a request needs one.
    #[serde(default)]
    pub renew_below: u64,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            size: default_lease_size(),
            ttl: default_lease_ttl(),
            min_grant: default_min_grant(),
            max_keys: default_max_keys(),
            renew_below: 0,
        }
    }
}

fn default_fail_retry() -> Duration {
    Duration::from_secs(1)
}
fn default_prefix() -> String {
    "tollgate:".to_owned()
}
fn default_timeout() -> Duration {
    Duration::from_millis(50)
}
fn default_failures() -> u32 {
    3
}
fn default_probe() -> Duration {
    Duration::from_millis(100)
}
fn default_lease_size() -> u64 {
    100
}
fn default_lease_ttl() -> Duration {
    Duration::from_millis(100)
}
fn default_min_grant() -> u64 {
    1
}
fn default_max_keys() -> usize {
    10_000
}

/// The form [`Backend`]'s `Deserialize` reads: `"embedded"` or `{ redis = { ... } }`.
impl Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Backend::Embedded => serializer.serialize_str("embedded"),
            Backend::Redis(redis) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("redis", redis)?;
                map.end()
            }
        }
    }
}

/// `"embedded"` or `{ redis = { ... } }`, by hand rather than serde's enum forms: YAML would want a
/// `!redis` tag, and an untagged enum would swallow the inner field errors (`unknown field
/// `mdoe``) that make a bad config easy to fix.
impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Backend;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""embedded" or { redis = { url = "redis://..." } }"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Backend, E> {
                match v {
                    "embedded" => Ok(Backend::Embedded),
                    "redis" => Err(E::custom(
                        r#"backend "redis" needs settings: backend = { redis = { url = "redis://127.0.0.1:6379/" } }"#,
                    )),
                    other => Err(E::unknown_variant(other, &["embedded", "redis"])),
                }
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Backend, M::Error> {
                let Some(key) = map.next_key::<String>()? else {
                    return Err(serde::de::Error::custom(
                        "empty backend table: write \"embedded\" or { redis = { ... } }",
                    ));
                };
                let backend = match key.as_str() {
                    "redis" => Backend::Redis(Box::new(map.next_value()?)),
                    "embedded" => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        Backend::Embedded
                    }
                    other => {
                        return Err(serde::de::Error::unknown_variant(
                            other,
                            &["embedded", "redis"],
                        ));
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(serde::de::Error::custom(
                        "a backend table names exactly one backend",
                    ));
                }
                Ok(backend)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `tls = { ca_file = "...", client_cert = "...", client_key = "..." }` (PEM files; every field
/// optional, the client certificate and its key together).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTls {
    /// The CA that signed the server's certificate (absent: the system's roots).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate, for a server that asks for one.
    #[serde(default)]
    pub client_cert: Option<std::path::PathBuf>,
    /// The client certificate's key.
    #[serde(default)]
    pub client_key: Option<std::path::PathBuf>,
}

/// Serialises a Redis URL as [`redacted_url`] shows it (a printed config never holds a password).
fn serialize_redacted<S: serde::Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&redacted_url(url))
}

/// `url` with the password of its user-info part (`redis://user:password@host`) shown as
/// `[redacted]`: what logs and errors may print.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:[redacted]{}", &rest[at..]),
        None => url.to_owned(),
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &redacted_url(&self.url))
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("password_env", &self.password_env)
            .field("tls", &self.tls)
            .field("mode", &self.mode)
            .field("fail", &self.fail)
            .field("fail_retry_after", &self.fail_retry_after)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("lease", &self.lease)
            .field("durable", &self.durable)
            .field("hash_tag", &self.hash_tag)
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl RedisBackend {
    /// The AUTH and TLS options this backend connects with, its password read now from its file
    /// or environment variable.
    ///
    /// # Errors
    /// The file or variable cannot be read (named; the value never appears).
    pub fn connect_options(&self) -> Result<tollgate_redis::ConnectOptions, String> {
        use tollgate_redis::Secret;
        let password = match (&self.password_file, &self.password_env) {
            (Some(path), None) => Some(
                Secret::from_file(path).map_err(|e| format!("backend.redis.password_file: {e}"))?,
            ),
            (None, Some(name)) => Some(
                Secret::from_env(name).map_err(|e| format!("backend.redis.password_env: {e}"))?,
            ),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err("backend.redis: password_file or password_env, not both".into());
            }
        };
        Ok(tollgate_redis::ConnectOptions {
            username: self.username.clone(),
            password,
            tls: self.tls.as_ref().map(|t| tollgate_redis::TlsFiles {
                ca_file: t.ca_file.clone(),
                client_cert: t.client_cert.clone(),
                client_key: t.client_key.clone(),
            }),
        })
    }

    /// Checks what serde cannot, against the domain's policy: lease mode needs GCRA rules and lease
    /// settings only make sense there. (A two-stage delay is refused for every domain, by
    /// [`ServerConfig::parse`](crate::config::ServerConfig::parse).)
    ///
    /// # Errors
    /// What is wrong, naming the rule.
    pub fn validate(&self, policy: &PolicyConfig) -> Result<(), String> {
        if self.url.is_empty() {
            return Err("backend.redis.url is empty".into());
        }
        if self.mode == RedisMode::PerRequest && self.lease.is_some() {
            return Err(r#"backend.redis.lease is only for mode = "lease""#.into());
        }
        if let Some(lease) = &self.lease {
            if lease.size == 0 || lease.ttl.is_zero() || lease.max_keys == 0 {
                return Err("backend.redis.lease: size, ttl and max_keys must be above 0".into());
            }
        }
        if self.timeout.is_zero() {
            return Err("backend.redis.timeout must be above 0".into());
        }
        if self.cluster
            && (self.tls.is_some()
                || self.username.is_some()
                || self.password_file.is_some()
                || self.password_env.is_some()
                || self.durable.is_some())
        {
            return Err(
                "backend.redis.cluster: tls, username, password_file/password_env and durable are \
                 not supported on a cluster yet (a password in the url is)"
                    .into(),
            );
        }
        if let Some(durable) = &self.durable {
            if self.mode == RedisMode::Lease {
                return Err(
                    r#"backend.redis.durable is only for mode = "per_request" (lease mode spends its leases locally)"#
                        .into(),
                );
            }
            if durable.replicas == 0 || durable.timeout.is_zero() {
                return Err("backend.redis.durable: replicas and timeout must be above 0".into());
            }
            let wait = tollgate_redis::Durability::new(durable.replicas, durable.timeout);
            if Duration::from_millis(wait.wait_args().1) >= self.timeout {
                return Err(format!(
                    "backend.redis.durable.timeout ({:?}, in whole ms) must be below backend.redis.timeout ({:?}): \
                     a WAIT that times out answers only after it",
                    Duration::from_millis(wait.wait_args().1),
                    self.timeout
                ));
            }
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            return Err("backend.redis: password_file or password_env, not both".into());
        }
        if let Some(tls) = &self.tls {
            if !self.url.starts_with("rediss://") {
                return Err("backend.redis.tls needs a rediss:// url".into());
            }
            if tls.client_cert.is_some() != tls.client_key.is_some() {
                return Err("backend.redis.tls: client_cert and client_key go together".into());
            }
        }
        for rule in &policy.rules {
            let algorithm = tollgate_policy::AlgorithmKind::parse(&rule.algorithm);
            if self.mode == RedisMode::Lease
                && algorithm != Some(tollgate_policy::AlgorithmKind::Gcra)
            {
                return Err(format!(
                    "rule `{}`: redis lease mode runs gcra only (algorithm `{}`); use mode = \"per_request\"",
                    rule.name, rule.algorithm
                ));
            }
        }
        Ok(())
    }
}
