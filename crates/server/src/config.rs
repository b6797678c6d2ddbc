//! The server's config file: listen addresses and, per Envoy domain, a policy and a backend.
//!
//! ```toml
//! [server]
//! grpc = "127.0.0.1:8081"   # Envoy RLS v3 + gRPC health
//! http = "127.0.0.1:8080"   # POST /v1/check, GET /metrics, GET /healthz
//! reload_poll = "1s"        # how often the file is checked for changes (SIGHUP reloads at once)
//! allow_empty = false       # see below
//! reservations = { max_open = 100000, expiry = "5m" }  # POST /v1/reserve (read at start)
//!
//! [[domains]]
//! name = "edge"             # RateLimitRequest.domain
//! backend = "embedded"      # the default: this process holds the state
//! [domains.policy]          # a tollgate-policy PolicyConfig
//! [[domains.policy.rules]]
//! name = "per_ip"
//! match = { remote_address = "any" }
//! key = ["remote_address"]
//! limit = 100
//! period = "1s"
//! ```
//!
//! A domain on Redis instead (see [`RedisBackend`] for every field and
//! [`crate::redis_backend`] for keys, what holds across several rules and the fail policy):
//!
//! ```toml
//! [[domains]]
//! name = "api"
//! backend = { redis = { url = "redis://127.0.0.1:6379/", mode = "per_request", fail = "closed" } }
//! ```
//!
//! On Redis as embedded, a descriptor's rules are decided as one: a denial gives back what the
//! other rules admitted.
//!
//! **Descriptor matching**: Envoy sends one descriptor per `rate_limits` entry of a route, and each
//! descriptor is one policy check. A rule applies to a descriptor only when the descriptor has no
//! entry the rule's `match` does not name (tollgate-policy's `descriptor_match = "exact"`, which
//! the server sets for every domain whose policy leaves it unset): `match = { remote_address =
//! "any" }` counts the descriptor `remote_address` and not the descriptor `remote_address` +
//! `path`, so one request is counted once per rule. A rule with an empty `match` would apply to no
//! descriptor and is refused at load: give a global limit a `generic_key` action and match that.
//! `descriptor_match = "subset"` in `[domains.policy]` gives the engine's own behaviour (a rule
//! applies whatever other entries the descriptor has).
//!
//! The file is TOML, or YAML when its name ends in `.yaml`/`.yml` (same schema).
//!
//! **An empty config is refused** (at start, and on reload, where the running config stays): a
//! file with no domains, or a domain with no rules, would drop every domain's state or limit
//! nothing, and is far more often a save caught half way (truncate, then write) than meant. Set
//! `allow_empty = true` in `[server]` when it is meant (a server that is to answer `NOT_FOUND`,
//! or a domain kept with no limits for now).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_policy::{DescriptorMatch, PolicyConfig};

/// The whole file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen addresses and reload settings.
    #[serde(default)]
    pub server: ListenConfig,
    /// The domains served.
    #[serde(default)]
    pub domains: Vec<DomainConfig>,
}

/// `[server]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// gRPC address (RLS and health). Port 0 picks a free port; the bound address is printed.
    #[serde(default = "default_grpc")]
    pub grpc: SocketAddr,
    /// HTTP address (JSON check, metrics, healthz).
    #[serde(default = "default_http")]
    pub http: SocketAddr,
    /// How often the config file is checked for changes; 0 turns file watching off (SIGHUP still
    /// reloads).
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub reload_poll: Duration,
    /// Accept a config with no domains, or with a domain that has no rules (refused otherwise,
    /// see the [module docs](self)).
    #[serde(default)]
    pub allow_empty: bool,
    /// TLS (and with a client CA, mutual TLS) on the gRPC port; absent: plaintext.
    #[serde(default)]
    pub tls: Option<GrpcTls>,
    /// The table of open reservations (`POST /v1/reserve`, `POST /v1/settle`).
    #[serde(default)]
    pub reservations: ReservationLimits,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            grpc: default_grpc(),
            http: default_http(),
            reload_poll: default_poll(),
            allow_empty: false,
            tls: None,
            reservations: ReservationLimits::default(),
        }
    }
}

/// `[server.reservations]`: bounds on the reservations `POST /v1/reserve` holds open until
/// `POST /v1/settle` (see [`crate::reservations`]). Read at start; a reload does not change them.
///
/// ```toml
/// [server.reservations]
/// max_open = 100000   # more open at once: a reserve answers 503 (and takes nothing)
/// expiry = "5m"       # unsettled by then: settled at its estimate (the units stay taken)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationLimits {
    /// The most reservations open at once.
    #[serde(default = "default_max_open")]
    pub max_open: usize,
    /// How long a reservation stays open; then it is settled at its estimate.
    #[serde(default = "default_expiry", with = "humantime_serde")]
    pub expiry: Duration,
}

impl Default for ReservationLimits {
    fn default() -> Self {
        ReservationLimits {
            max_open: default_max_open(),
            expiry: default_expiry(),
        }
    }
}

fn default_max_open() -> usize {
    100_000
}
fn default_expiry() -> Duration {
    Duration::from_secs(300)
}

/// `[server.tls]`: the gRPC port speaks TLS (ALPN `h2`); with `client_ca`, mutual TLS.
///
/// ```toml
/// [server.tls]
/// cert = "tls/server.pem"        # PEM certificate chain, the server's own first
/// key = "tls/server.key"         # PEM private key (PKCS#8, PKCS#1 or SEC1)
/// client_ca = "tls/ca.pem"       # optional: require a client certificate issued by these CAs
/// handshake_timeout = "10s"      # a client that has not finished its handshake by then is dropped
/// ```
///
/// A relative path is read from the config file's directory. The files are read again on every
/// reload (SIGHUP, or a change of the config file or of any of these files): new connections get
/// the new certificates, open ones keep theirs; files that do not load reject the reload and the
/// running config stays. TLS cannot be turned on or off by a reload (restart for that). The
/// HTTP port (JSON check, metrics) stays plaintext.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTls {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// The private key (PEM).
    pub key: PathBuf,
    /// The CAs a client certificate must chain to (PEM); absent: no client certificate asked for.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// The longest a handshake may take.
    #[serde(default = "default_handshake_timeout", with = "humantime_serde")]
    pub handshake_timeout: Duration,
}

impl GrpcTls {
    /// The files the settings name (the reloader watches them).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

fn default_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_grpc() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}
fn default_http() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_poll() -> Duration {
    Duration::from_secs(1)
}

/// One `[[domains]]` entry.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The Envoy domain (`RateLimitRequest.domain`).
    pub name: String,
    /// Where the state lives.
    #[serde(default)]
    pub backend: Backend,
    /// How the descriptors of one call are decided: `"atomic"` (default) or `"independent"`.
    #[serde(default)]
    pub descriptors: DescriptorMode,
    /// The domain's rules.
    pub policy: PolicyConfig,
}

/// How the descriptors of one `ShouldRateLimit` call are decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DescriptorMode {
    /// As one (the default): when any descriptor is over its limit (or its cost can never be
    /// admitted), what the others admitted is given back, so a call Envoy refuses consumes
    /// nothing anywhere. Envoy refuses the whole request when any descriptor is over, so units
    /// the others kept would be spent on a request that never went through.
    #[default]
    Atomic,
    /// Each descriptor on its own, as Envoy's reference service decides them: one admitted keeps
    /// its units even when another of the same call is over its limit.
    Independent,
}

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
/// # lease = { size = 100, ttl = "100ms", min_grant = 1, max_keys = 10000 }   lease mode only
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
/// acknowledgement; `WAIT` holds the domain's shared connection while it waits.
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

/// `lease = { size = 100, ttl = "100ms", min_grant = 1, max_keys = 10000 }` (tollgate-redis
/// `LeaseConfig`; every field optional).
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
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            size: default_lease_size(),
            ttl: default_lease_ttl(),
            min_grant: default_min_grant(),
            max_keys: default_max_keys(),
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
    /// [`ServerConfig::parse`].)
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

/// Why a config file was rejected.
#[derive(Debug)]
pub enum ConfigFileError {
    /// The file could not be read.
    Io(std::io::Error),
    /// It does not parse.
    Parse(String),
    /// It parses but is not a valid config (duplicate domain, bad policy).
    Invalid(String),
    /// It has no domains, or a domain with no rules, and `[server] allow_empty` is not set.
    Empty(String),
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigFileError::Io(e) => write!(f, "cannot read config: {e}"),
            ConfigFileError::Parse(e) => write!(f, "config does not parse: {e}"),
            ConfigFileError::Invalid(e) => write!(f, "invalid config: {e}"),
            ConfigFileError::Empty(e) => write!(
                f,
                "empty config: {e} (set `allow_empty = true` in [server] if that is meant)"
            ),
        }
    }
}

impl std::error::Error for ConfigFileError {}

impl ServerConfig {
    /// Reads and checks a config file (YAML by extension, else TOML). A relative `[server.tls]`
    /// path is taken from the file's directory (the files themselves are read by
    /// [`crate::tls`]).
    ///
    /// # Errors
    /// [`ConfigFileError`] naming what is wrong.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(ConfigFileError::Io)?;
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        let mut config = Self::parse(&text, yaml)?;
        if let (Some(tls), Some(dir)) = (&mut config.server.tls, path.parent()) {
            for file in [
                Some(&mut tls.cert),
                Some(&mut tls.key),
                tls.client_ca.as_mut(),
            ]
            .into_iter()
            .flatten()
            {
                if file.is_relative() {
                    *file = dir.join(&*file);
                }
            }
        }
        Ok(config)
    }

    /// Parses and checks config text.
    ///
    /// # Errors
    /// [`ConfigFileError::Parse`], [`ConfigFileError::Invalid`], or [`ConfigFileError::Empty`]
    /// (unless `[server] allow_empty`).
    pub fn parse(text: &str, yaml: bool) -> Result<Self, ConfigFileError> {
        let mut config: ServerConfig = if yaml {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigFileError::Parse(e.to_string()))?
        } else {
            toml::from_str(text).map_err(|e| ConfigFileError::Parse(e.to_string()))?
        };
        // What the server adds to each domain's policy, here so that every use of `policy` sees it:
        // the domain as a metrics label (two domains may name rules alike; a `domain` label the
        // config sets itself wins), and Envoy's descriptor matching (a rule applies to a descriptor
        // only when the descriptor has no entry the rule does not name, unless the config says
        // `descriptor_match = "subset"`).
        for domain in &mut config.domains {
            domain
                .policy
                .descriptor_match
                .get_or_insert(DescriptorMatch::Exact);
            domain
                .policy
                .metric_labels
                .entry("domain".to_owned())
                .or_insert_with(|| domain.name.clone());
        }
        let mut seen = HashSet::new();
        for domain in &config.domains {
            if domain.name.is_empty() {
                return Err(ConfigFileError::Invalid(
                    "a domain has an empty name".into(),
                ));
            }
            if !seen.insert(domain.name.as_str()) {
                return Err(ConfigFileError::Invalid(format!(
                    "domain `{}` is listed twice",
                    domain.name
                )));
            }
            // An RLS call is one question asked before the request: Envoy never tells the server
            // when the request ends, so a permit taken here could never be given back.
            if let Some(rule) = domain.policy.concurrency.first() {
                return Err(ConfigFileError::Invalid(format!(
                    "domain `{}`: concurrency rule `{}` needs to see each request end, which the \
                     Envoy RLS never does (it is asked once, before the request); limit requests \
                     in flight in Envoy itself (a cluster's circuit_breakers max_requests, or the \
                     adaptive_concurrency filter) or at an edge that owns the request \
                     (tollgate-http's AdmitLayer, tollgate-pingora), and keep rate rules here",
                    domain.name, rule.name
                )));
            }
            let valid = match domain.backend {
                Backend::Embedded => domain.policy.validate(),
                Backend::Redis(_) => domain.policy.validate_shared(),
            };
            valid
                .map_err(|e| ConfigFileError::Invalid(format!("domain `{}`: {e}", domain.name)))?;
            // An RLS answer is OK or OVER_LIMIT: it cannot hold a request for a two-stage rule's
            // delay, and admitting without the wait would silently drop the rule's pacing.
            if let Some(rule) = domain.policy.rules.iter().find(|r| r.delay.is_some()) {
                return Err(ConfigFileError::Invalid(format!(
                    "domain `{}`: rule `{}` has a two-stage delay, which the Envoy RLS cannot hold \
                     (its answer is OK or OVER_LIMIT); hold delays at an edge that owns the \
                     request (tollgate-http's PolicyLayer, tollgate-pingora) or remove `delay`",
                    domain.name, rule.name
                )));
            }
            if domain.policy.descriptor_match == Some(DescriptorMatch::Exact) {
                // A descriptor always has an entry, so under exact matching a rule that names
                // none would never apply: refused rather than silently dead.
                if let Some(rule) = domain.policy.rules.iter().find(|r| r.matches.is_empty()) {
                    return Err(ConfigFileError::Invalid(format!(
                        "domain `{}`, rule `{}`: an empty `match` applies to no Envoy descriptor \
                         (descriptors are matched exactly); match the descriptor Envoy sends, \
                         e.g. `match = {{ generic_key = {{ exact = \"global\" }} }}` for a \
                         `generic_key` action, or set `descriptor_match = \"subset\"`",
                        domain.name, rule.name
                    )));
                }
            }
            if let Backend::Redis(redis) = &domain.backend {
                redis.validate(&domain.policy).map_err(|e| {
                    ConfigFileError::Invalid(format!("domain `{}`: {e}", domain.name))
                })?;
            }
        }
        let reservations = config.server.reservations;
        if reservations.max_open == 0 || reservations.expiry.is_zero() {
            return Err(ConfigFileError::Invalid(format!(
                "[server.reservations]: max_open ({}) and expiry ({:?}) must be above zero",
                reservations.max_open, reservations.expiry
            )));
        }
        if !config.server.allow_empty {
            if config.domains.is_empty() {
                return Err(ConfigFileError::Empty("no domains".into()));
            }
            if let Some(d) = config.domains.iter().find(|d| d.policy.rules.is_empty()) {
                return Err(ConfigFileError::Empty(format!(
                    "domain `{}` has no rules",
                    d.name
                )));
            }
        }
        Ok(config)
    }
}

impl ServerConfig {
    /// What `tollgate-server check` prints: the file read and checked by [`load`](Self::load) (the
    /// code the server's start and every reload run), then each domain's policy with every default
    /// spelled out (tollgate-policy's [`PolicyConfig::normalized`]) and a Redis domain in lease
    /// mode with its lease settings, as TOML.
    ///
    /// # Errors
    /// What [`load`](Self::load) refuses, naming the domain, rule and field.
    pub fn check(path: &Path) -> Result<String, ConfigFileError> {
        let config = Self::load(path)?.normalized()?;
        toml::to_string(&config).map_err(|e| ConfigFileError::Invalid(e.to_string()))
    }

    /// This config with every default spelled out (see [`check`](Self::check)).
    ///
    /// # Errors
    /// A domain whose policy does not validate.
    pub fn normalized(&self) -> Result<ServerConfig, ConfigFileError> {
        let mut config = self.clone();
        for domain in &mut config.domains {
            let policy = match &mut domain.backend {
                Backend::Embedded => domain.policy.normalized(),
                Backend::Redis(redis) => {
                    if redis.mode == RedisMode::Lease {
                        redis.lease.get_or_insert_default();
                    }
                    domain.policy.normalized_shared()
                }
            };
            domain.policy = policy
                .map_err(|e| ConfigFileError::Invalid(format!("domain `{}`: {e}", domain.name)))?;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_configs_parse_and_build() {
        for (text, yaml) in [
            (include_str!("../examples/configs/embedded.toml"), false),
            (include_str!("../examples/configs/embedded.yaml"), true),
        ] {
            let config = ServerConfig::parse(text, yaml).expect("example parses");
            assert!(!config.domains.is_empty());
            crate::service::LiveDomains::new(&config).expect("example builds");
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
        crate::service::LiveDomains::new(&config).expect("example builds");
        let yaml = ServerConfig::parse(include_str!("../examples/configs/redis.yaml"), true)
            .expect("yaml example parses");
        assert!(
            matches!(&yaml.domains[1].backend, Backend::Redis(r) if r.mode == RedisMode::Lease && r.lease.map(|l| l.size) == Some(50))
        );
        crate::service::LiveDomains::new(&yaml).expect("yaml example builds");
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
        assert!(
            matches!(&config.domains[0].backend, Backend::Redis(r) if r.mode == RedisMode::Lease)
        );
        crate::service::LiveDomains::new(&config).expect("the guide's fragment builds");
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
        assert!(
            parse_err(r#"{ redis = { url = "redis://x/", mdoe = "lease" } }"#).contains("mdoe")
        );
        assert!(
            parse_err(r#"{ redis = { url = "redis://x/", mode = "leases" } }"#).contains("leases")
        );
        assert!(parse_err(r#"{ redis = { mode = "lease" } }"#).contains("url"));
        assert!(parse_err(r#""redis""#).contains("needs settings"));
        assert!(parse_err(r#""memcached""#).contains("memcached"));
        let invalid =
            |backend: &str, rule: &str| match ServerConfig::parse(&toml(backend, rule), false) {
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
            crate::service::LiveDomains::new(&config).expect("builds");
        }
        let yaml = ServerConfig::parse("server: { allow_empty: true }\n", true).expect("allowed");
        assert!(yaml.domains.is_empty());
    }
}
