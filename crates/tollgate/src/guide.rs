//! The guides: one page per topic, each a file under `guides/` in the repository, rendered here so
//! that docs.rs shows them and every Rust block in them compiles and runs as a doctest (with the
//! features the page needs: `cargo test -p tollgate --doc --all-features`). The pages on the
//! in-flight limits, adaptive limits, rolling out a limit, edge fields and settling use the lower
//! crates directly and are doctested there (tollgate-policy, tollgate-adaptive, tollgate-http);
//! here they are only shown.

#[doc = include_str!("../../../guides/algorithms.md")]
pub mod algorithms {}

#[doc = include_str!("../../../guides/keyed.md")]
pub mod keyed {}

#[doc = include_str!("../../../guides/striped.md")]
pub mod striped {}

#[cfg(feature = "policy")]
#[doc = include_str!("../../../guides/policy.md")]
pub mod policy {}

#[cfg(not(doctest))]
#[doc = include_str!("../../../guides/rollout.md")]
pub mod rollout {}

#[cfg(not(doctest))]
#[doc = include_str!("../../../guides/concurrency.md")]
pub mod concurrency {}

#[cfg(not(doctest))]
#[doc = include_str!("../../../guides/adaptive.md")]
pub mod adaptive {}

#[doc = include_str!("../../../guides/http.md")]
pub mod http {}

#[cfg(not(doctest))]
#[doc = include_str!("../../../guides/edge-fields.md")]
pub mod edge_fields {}

#[cfg(not(doctest))]
#[doc = include_str!("../../../guides/settle.md")]
pub mod settle {}

#[doc = include_str!("../../../guides/redis.md")]
pub mod redis {}

#[doc = include_str!("../../../guides/server.md")]
pub mod server {}

#[doc = include_str!("../../../guides/pingora.md")]
pub mod pingora {}

#[doc = include_str!("../../../guides/failure.md")]
pub mod failure {}

#[doc = include_str!("../../../guides/proofs.md")]
pub mod proofs {}

#[doc = include_str!("../../../guides/results.md")]
pub mod results {}
