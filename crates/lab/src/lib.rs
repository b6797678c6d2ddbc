//! Tollgate's lab (never published): the tools that measure the product crates from outside,
//! through their public APIs, and write what `results/` records. No product crate depends on it.
//!
//! | tool | what it measures | command (from the workspace root) | results |
//! | --- | --- | --- | --- |
//! | [`rls_load`] | an Envoy RLS v3 server (tollgate-server): calls/s, latency, CPU per call | `cargo run --release -p tollgate-lab --bin rls-load -- --target http://127.0.0.1:8081` | `results/server/run.sh`, `results/fleet/run.sh` |
//! | [`herd`] | retry strategies after a shared failure: the work a rate-limited server absorbs, the last client's wait | `cargo run -p tollgate-lab --bin herd` | `results/herd/` |
//! | `redis-bench` | the Redis limiters: decisions/s, latency, the lease mode's accuracy | `cargo run --release -p tollgate-lab --bin redis-bench` | `results/redis/` |
//! | `cluster-bench` | the same on a 3+3 Redis Cluster beside a single Redis | `cargo run --release -p tollgate-lab --bin cluster-bench` | `results/redis-cluster/run.sh` |
//! | `fleet-processes` | a quota shared by 4 OS processes on one Redis (or Cluster) | `cargo run --release -p tollgate-lab --bin fleet-processes` | `results/redis-fleet/run.sh` |
//! | `pingora-bench` | a Pingora proxy with each limiter, and a counting upstream | `cargo build --release -p tollgate-lab --bin pingora-bench` | `results/pingora/run.sh` |
//!
//! The in-process suite (ns/decision, tail latency, accuracy, beside peer crates) is the load
//! generator, `cargo run --release -p tollgate-loadgen`, kept in its own crate so that the main
//! command builds neither Pingora, tonic nor redis-rs; criterion micro-benchmarks are in `benches/`.
//!
//! The Redis tools start their own `redis-server` (and cluster) on free loopback ports with the
//! harness of tollgate-redis's tests, and kill them by PID on exit.

pub mod herd;
pub mod rls_load;
