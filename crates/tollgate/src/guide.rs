//! The guides: one page per topic, each a file under `guides/` in the repository, rendered here so
//! that docs.rs shows them and every Rust block in them compiles and runs as a doctest (with the
//! features the page needs: `cargo test -p tollgate --doc --all-features`).

#[doc = include_str!("../../../guides/algorithms.md")]
pub mod algorithms {}

#[doc = include_str!("../../../guides/keyed.md")]
pub mod keyed {}

#[doc = include_str!("../../../guides/striped.md")]
pub mod striped {}

#[cfg(feature = "policy")]
#[doc = include_str!("../../../guides/policy.md")]
pub mod policy {}

#[doc = include_str!("../../../guides/http.md")]
pub mod http {}

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
