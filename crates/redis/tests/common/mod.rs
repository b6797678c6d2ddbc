//! A private `redis-server` per test: started on a free loopback port, killed on drop.
#![allow(dead_code)]

pub mod cluster;
mod redis_server;

#[allow(unused_imports)] // each test binary uses some of these
pub use redis_server::{RedisServer, answers_as, command, command_calls, info, ping};

use std::time::Duration;

use tollgate_core::Decision;

/// The core's decision with durations rounded up to whole µs (what the µs scripts report).
pub fn round_up_us(d: Decision) -> Decision {
    let up = |d: Duration| Duration::from_micros(d.as_nanos().div_ceil(1000) as u64);
    match d {
        Decision::Allowed {
            remaining,
            reset_after,
        } => Decision::Allowed {
            remaining,
            reset_after: up(reset_after),
        },
        Decision::Denied {
            retry_after,
            reset_after,
        } => Decision::Denied {
            retry_after: up(retry_after),
            reset_after: up(reset_after),
        },
    }
}
