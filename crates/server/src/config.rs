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
//! A domain on Redis instead (see [`RedisBackend`](crate::backend::RedisBackend) for every field and
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

use crate::backend::{Backend, RedisMode};

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
    pub fn normalized_toml(path: &Path) -> Result<String, ConfigFileError> {
        let config = Self::load(path)?.normalized()?;
        toml::to_string(&config).map_err(|e| ConfigFileError::Invalid(e.to_string()))
    }

    /// This config with every default spelled out (see [`normalized_toml`](Self::normalized_toml)).
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
