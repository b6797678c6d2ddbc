//! The server's config file: listen addresses and, per Envoy domain, a policy and a backend.
//!
//! ```toml
//! [server]
//! grpc = "127.0.0.1:8081"   # Envoy RLS v3 + gRPC health
//! http = "127.0.0.1:8080"   # POST /v1/check, GET /metrics, GET /healthz
//! reload_poll = "1s"        # how often the file is checked for changes (SIGHUP reloads at once)
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
//! The file is TOML, or YAML when its name ends in `.yaml`/`.yml` (same schema).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use tollgate_policy::PolicyConfig;

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
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
#[derive(Clone, Debug, Deserialize)]
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
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            grpc: default_grpc(),
            http: default_http(),
            reload_poll: default_poll(),
        }
    }
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
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The Envoy domain (`RateLimitRequest.domain`).
    pub name: String,
    /// Where the state lives.
    #[serde(default)]
    pub backend: Backend,
    /// The domain's rules.
    pub policy: PolicyConfig,
}

/// A domain's state backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The process holds the state (tollgate-policy's own limiters).
    #[default]
    Embedded,
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
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigFileError::Io(e) => write!(f, "cannot read config: {e}"),
            ConfigFileError::Parse(e) => write!(f, "config does not parse: {e}"),
            ConfigFileError::Invalid(e) => write!(f, "invalid config: {e}"),
        }
    }
}

impl std::error::Error for ConfigFileError {}

impl ServerConfig {
    /// Reads and checks a config file (YAML by extension, else TOML).
    ///
    /// # Errors
    /// [`ConfigFileError`] naming what is wrong.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(ConfigFileError::Io)?;
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        Self::parse(&text, yaml)
    }

    /// Parses and checks config text.
    ///
    /// # Errors
    /// [`ConfigFileError::Parse`] or [`ConfigFileError::Invalid`].
    pub fn parse(text: &str, yaml: bool) -> Result<Self, ConfigFileError> {
        let config: ServerConfig = if yaml {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigFileError::Parse(e.to_string()))?
        } else {
            toml::from_str(text).map_err(|e| ConfigFileError::Parse(e.to_string()))?
        };
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
            domain
                .policy
                .validate()
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
            crate::service::Limiter::new(&config).expect("example builds");
        }
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
}
