//! The Redis backend: a domain whose rules keep their state in a shared Redis, so that every
//! replica pointing at it shares each rule's quota. The domain is a tollgate-policy
//! [`RedisPolicy`] (the same engine and semantics as an embedded domain, see its docs for keys,
//! what holds across a descriptor's rules and the fail policy); this module only turns the
//! domain's `backend.redis` settings into one and shares connections between domains.
//!
//! Key layout: `<prefix><domain>:<rule>:<algorithm>:<key>`. Per request mode decides a
//! descriptor's rules in one script call; lease mode rule by rule on local leases. With `durable`
//! (per request mode), an admitted descriptor also waits for its replicas (`WAIT`), answered by the
//! fail policy and counted as `cause="not_replicated"` when too few confirm in time. With
//! `cluster = true` the URL is one node of a Redis Cluster: a request's keys in several slots are
//! one script per slot with compensating refunds, and `hash_tag` keeps a request's keys keyed by
//! that descriptor in one slot (one exact script). Failures are
//! counted in `tollgate_policy_store_failures_total{domain,rule,cause,answer}`; the breakers'
//! state is tollgate-redis's `tollgate_redis_breaker_open{prefix}` gauge (per request: one breaker
//! per domain, prefix `<prefix><domain>:`; lease mode: one per rule and quota).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tollgate_policy::{PolicyConfig, RedisPolicy, RedisSettings};
use tollgate_redis::{
    BreakerConfig, ConnectOptions, Connection, Durability, FaultPolicy, LeaseConfig, RedisConfig,
};

use crate::backend::{Backend, FailMode, RedisBackend, RedisMode, redacted_url};
use crate::config::ServerConfig;

/// Connections by (URL, timeout, AUTH and TLS options), shared by every domain and kept across
/// reloads (so a reload that keeps them keeps the connection; a changed URL, or a rotated password,
/// gets a new one). After a reload, those no domain uses any more are let go
/// ([`retain_used`](Self::retain_used)): the connection closes when the old domains' limiters
/// holding it are dropped too. Each is one multiplexed redis-rs connection (pipelined commands
/// from every task), lazily reconnecting.
#[derive(Default)]
pub struct Connections {
    open: Mutex<Vec<(Key, Connection)>>,
}

/// URL, timeout, AUTH and TLS, and whether it is a cluster's node.
type Key = (String, Duration, ConnectOptions, bool);

impl Connections {
    fn get(
        &self,
        url: &str,
        options: ConnectOptions,
        cluster: bool,
        config: &RedisConfig,
    ) -> Result<Connection, String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let key = (url.to_owned(), config.timeout(), options, cluster);
        if let Some((_, conn)) = open.iter().find(|(k, _)| *k == key) {
            return Ok(conn.clone());
        }
        let conn = if cluster {
            // The slot map is read at the first command (a cluster down at start is an outage).
            tollgate_redis::connect_cluster_lazy([url], config)
        } else {
            tollgate_redis::connect_with(url, &key.2, config).map(Connection::from)
        }
        .map_err(|e| format!("backend.redis.url `{}`: {e}", redacted_url(url)))?;
        open.push((key, conn.clone()));
        Ok(conn)
    }

    /// Keeps only the connections some Redis domain of `config` uses.
    pub fn retain_used(&self, config: &ServerConfig) {
        let used: HashSet<(&str, Duration)> = config
            .domains
            .iter()
            .filter_map(|d| match &d.backend {
                Backend::Redis(settings) => Some((settings.url.as_str(), settings.timeout)),
                Backend::Embedded => None,
            })
            .collect();
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|((url, timeout, _, _), _)| used.contains(&(url.as_str(), *timeout)));
    }

    /// How many connections are kept.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The tollgate-policy settings a domain's `backend.redis` stands for.
fn settings(domain: &str, backend: &RedisBackend) -> RedisSettings {
    RedisSettings {
        prefix: format!("{}{domain}:", backend.prefix),
        lease: (backend.mode == RedisMode::Lease).then(|| {
            let l = backend.lease.unwrap_or_default();
            LeaseConfig {
                size: l.size,
                ttl: l.ttl,
                min_grant: l.min_grant,
                max_keys: l.max_keys,
                renew_below: l.renew_below,
            }
        }),
        timeout: backend.timeout,
        fail: match backend.fail {
            FailMode::Open => FaultPolicy::FailOpen,
            FailMode::Closed => FaultPolicy::FailClosed {
                retry_after: backend.fail_retry_after,
            },
        },
        breaker: BreakerConfig {
            failures: backend.breaker.failures,
            probe_interval: backend.breaker.probe_interval,
        },
        durable: backend
            .durable
            .map(|d| Durability::new(d.replicas, d.timeout)),
        hash_tag: backend.hash_tag.clone(),
    }
}

/// Builds a Redis domain's policy, carrying `previous`'s limiters and counters over where they
/// stay alike (`previous` keeps deciding until the caller swaps the domains).
///
/// # Errors
/// A malformed URL, or a rule the Redis scripts cannot follow, naming the rule.
pub fn build(
    domain: &str,
    backend: &RedisBackend,
    policy: &PolicyConfig,
    connections: &Connections,
    previous: Option<&RedisPolicy>,
) -> Result<RedisPolicy, String> {
    let settings = settings(domain, backend);
    let config = RedisConfig::default().with_timeout(backend.timeout);
    let conn = connections.get(
        &backend.url,
        backend.connect_options()?,
        backend.cluster,
        &config,
    )?;
    let built = match previous {
        Some(previous) => RedisPolicy::succeed(previous, policy.clone(), conn, settings),
        None => RedisPolicy::new(policy.clone(), conn, settings),
    };
    built.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `lease = { ... }` field reaches the limiter's `LeaseConfig`.
    #[test]
    fn a_lease_table_reaches_the_lease_config() {
        let backend: RedisBackend = toml::from_str(
            r#"
            url = "redis://127.0.0.1:6379/"
            mode = "lease"
            lease = { size = 40, ttl = "250ms", min_grant = 3, max_keys = 500, renew_below = 20 }
            "#,
        )
        .unwrap();
        let lease = settings("edge", &backend).lease.unwrap();
        assert_eq!(
            (
                lease.size,
                lease.ttl,
                lease.min_grant,
                lease.max_keys,
                lease.renew_below
            ),
            (40, Duration::from_millis(250), 3, 500, 20)
        );
        // Omitted, it is off.
        let backend: RedisBackend =
            toml::from_str("url = \"redis://127.0.0.1:6379/\"\nmode = \"lease\"\n").unwrap();
        assert_eq!(settings("edge", &backend).lease.unwrap().renew_below, 0);
    }
}
