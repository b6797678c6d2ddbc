//! A Pingora reverse proxy in front of one loopback upstream, rate-limited by a Tollgate policy.
//!
//! ```text
//! cargo run -p tollgate-pingora --release --example proxy -- \
//!     --listen 127.0.0.1:6188 --upstream 127.0.0.1:8080 \
//!     --policy crates/pingora/examples/policy.toml --trust 127.0.0.0/8 --key-header x-client-key
//! ```
//!
//! `--key-header NAME` passes that request header to the policy as the `client_key` descriptor;
//! `--trust CIDR` (repeatable) names the proxies whose `X-Forwarded-For` is believed.

use std::sync::Arc;

use pingora_core::server::Server;
use pingora_proxy::http_proxy_service;
use tollgate_http::ClientIp;
use tollgate_pingora::{PingoraLimiter, SingleUpstreamProxy};
use tollgate_policy::{Policy, PolicyConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen = "127.0.0.1:6188".to_owned();
    let mut upstream = "127.0.0.1:8080".to_owned();
    let mut policy_path = "crates/pingora/examples/policy.toml".to_owned();
    let mut trust = Vec::new();
    let mut key_header = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--upstream" => upstream = value()?,
            "--policy" => policy_path = value()?,
            "--trust" => trust.push(value()?.parse()?),
            "--key-header" => key_header = Some(http::HeaderName::try_from(value()?)?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let config = PolicyConfig::from_toml(&std::fs::read_to_string(&policy_path)?)?;
    let policy = Arc::new(Policy::new(config)?);
    let mut limiter = PingoraLimiter::new(policy, ClientIp::trusting(trust));
    if let Some(h) = key_header {
        limiter = limiter.descriptor_header(h, "client_key")?;
    }

    let mut server = Server::new(None)?;
    server.bootstrap();
    let mut service = http_proxy_service(
        &server.configuration,
        SingleUpstreamProxy::new(limiter, upstream),
    );
    service.add_tcp(&listen);
    server.add_service(service);
    println!("listening on {listen}");
    server.run_forever()
}
