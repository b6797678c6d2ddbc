#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]

pub use tollgate_core::*;

#[cfg(feature = "sharded")]
pub use tollgate_sharded::{self as sharded, KeyedLimiter};

#[cfg(feature = "striped")]
pub use tollgate_striped::{self as striped, StripedLimiter};

#[cfg(feature = "redis")]
pub use tollgate_redis as redis;

#[cfg(feature = "http")]
pub use tollgate_http as http;

#[cfg(feature = "client")]
pub use tollgate_client as client;

#[cfg(feature = "policy")]
pub use tollgate_policy::{self as policy, Policy, PolicyConfig, PolicyDecision};
