//! tollgate-server: the rate-limit service that Envoy-based gateways call
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, gRPC), plus `POST /v1/check`
//! (JSON), `GET /metrics` (Prometheus), `/healthz` and the standard gRPC health service, over one
//! tollgate-policy [`Policy`](tollgate_policy::Policy) per Envoy domain.
//!
//! * Each `RateLimitDescriptor` is one policy check (entries -> descriptors, cost = its
//!   `hits_addend`, else the request's, whose 0 means 1; a descriptor's explicit 0 decides without
//!   taking anything; see [`request`] for what a call may carry). Every rule that applies to a descriptor is
//!   decided as one; the descriptors of one call are decided as one too (a call over the limit
//!   anywhere consumes nothing), or independently with `descriptors = "independent"`, at one
//!   clock reading (see [`service::LiveDomains::check`]).
//! * Each descriptor's verdict is tollgate-http's [`EdgeVerdict`](tollgate_http::EdgeVerdict),
//!   the one the tower layer and Pingora render too (a conformance table, `tests/conformance.rs`,
//!   checks that all three answer alike). Shadow rules answer OK. A cost no enforcing rule can
//!   ever admit is answered OVER_LIMIT without `Retry-After` (fails closed; retrying cannot help).
//!   A domain with a two-stage delay rule is refused when the config loads: an RLS answer cannot
//!   hold a request. An unknown domain is `NOT_FOUND` and a malformed request `INVALID_ARGUMENT` (Envoy's
//!   `failure_mode_deny` then decides; the server keeps serving).
//! * The response carries `RateLimit`, `RateLimit-Policy` and, when over the limit, `Retry-After`
//!   (text from tollgate-http, the fields' one home) for Envoy to add.
//! * Costs known only after the response (LLM tokens, rows, bytes): Envoy's call when a stream is
//!   done, its descriptors marked `tollgate=charge`, is charged rather than decided ([`charge`]);
//!   or `POST /v1/reserve` reserves an estimate and answers an id, `POST /v1/settle` settles the
//!   actual cost ([`reserve`], [`http_api`], held in a bounded table that settles an expired
//!   reservation at its estimate: [`reservations`]).
//! * Its load client is a lab tool: `cargo run --release -p tollgate-lab --bin rls-load`.
//! * The gRPC port speaks TLS, or mutual TLS with a client CA, when `[server.tls]` says so
//!   ([`tls`]; certificates reloaded with the config).
//! * Backend per domain: embedded (this process holds the state) or Redis (per-request scripts or
//!   local leases, shared by every replica; see [`redis_backend`] for keys, what holds across
//!   several rules, and the fail-open/closed answer while Redis is down).

pub mod answer;
pub mod app;
pub mod backend;
pub mod charge;
pub mod config;
pub mod domain;
pub mod grpc;
pub mod http_api;
pub mod redis_backend;
pub mod request;
pub mod reservations;
pub mod reserve;
pub mod service;
pub mod telemetry;
pub mod tls;
