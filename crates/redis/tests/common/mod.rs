//! A private `redis-server` per test: started on a free loopback port, killed on drop.
#![allow(dead_code)]

pub mod cluster;
mod redis_server;

#[allow(unused_imports)] // each test binary uses some of these
pub use redis_server::{RedisServer, ping};
