//! One GCRA quota shared by many threads, scaled with per-stripe leases.
//!
//! When every worker checks the same global limit, one atomic word's cache line bounces between
//! cores and caps the total rate. [`StripedLimiter`] keeps the shared GCRA word (a
//! [`tollgate_core::AtomicState`] running [`tollgate_core::Gcra`]) but lets each *stripe* (a
//! cache-padded slot; a thread picks one by a thread-local ordinal assigned round robin at first use,
//! so unpinned threads work) take a **lease** of `k` units from it in one compare-and-swap, then
//! decide from its own cache line until the lease runs out.
//!
//! # When to use it
//! Many threads, one hot quota, mostly-allowed traffic (a service-wide cap in a proxy). For one or two
//! threads, or for quotas that are mostly denying, plain [`tollgate_core::GcraLimiter`] is as good
//! and exact. Decisions are the core [`Decision`](tollgate_core::Decision)s; a cost above the burst
//! is a [`CheckError`](tollgate_core::CheckError). `remaining` and `reset_after` are approximate
//! (this stripe's lease plus what the shared state had free when the lease was taken).
//!
//! # Leases are positions on the GCRA timeline
//! Write `T` for the emission interval and `D = burst × T` for the bucket depth. The shared word is
//! the theoretical arrival time (TAT). Admitting a unit in exact GCRA at time `u` places it at
//! position `p = max(TAT, u)` and moves TAT to `p + T`; admission requires the new TAT `≤ u + D`.
//! A lease of `g` units taken at `t₀` is the segment `[b, b + g·T)` with `b = max(TAT, t₀)`, granted
//! only if `b + g·T ≤ t₀ + D` (the GCRA rule for cost `g`), and the shared TAT becomes its end. The
//! stripe holds its unused units as the *top* positions of the segment, `[end − n·T, end)`, and a
//! unit may be used at time `u` only while its position is `≥ u`: positions that time has passed
//! **expire** (exactly as an exact GCRA's idle capacity does). A request of cost `c` uses the `c`
//! lowest live positions. The stripe's state is one [`LeaseWord`] (`n`, a generation, a lock bit)
//! plus the segment's `end` in a second word written only under the lock.
//!
//! When a stripe runs short it locks its word, and in **one CAS** on the shared TAT gives back its
//! live positions `[lo, end)` (only if `TAT == end`: nothing was granted above them since) and takes a
//! new segment of `min(want, available)` units (at least the request's cost).
//!
//! # Bounds (proved here, tested in `tests/`, modelled in `loom-tests/tests/striped.rs`)
//! **Invariant I.** No position `≥` the shared TAT is used or held. Grants start at `≥ TAT`; a
//! give-back sets TAT to `lo` only when `TAT == end`, so `[lo, end)` was held by the returner alone
//! (it locked and retired it) and nothing above `end` was held. Hence every position is used at most
//! once and used positions never overlap.
//!
//! **Never over-admits (exact).** The admitted stream conforms to the exact GCRA: fed only the
//! admitted requests `(uᵢ, cᵢ)` in time order, an exact GCRA admits every one of them. Proof: the
//! exact TAT after request `n` is `maxₖ (u_k + Σ_{k≤j≤n} c_j·T)`. Requests `k..n` used disjoint
//! positions, each `≥` its use time `≥ u_k` and below its lease's end `≤` take time `+ D ≤ u_n + D`.
//! So `Σ c_j·T ≤ u_n + D − u_k`, i.e. every term is `≤ u_n + D`: request `n` conforms. In
//! particular, over any window of length `d` the admitted units are at most `burst + d / T`, and at
//! a frozen instant at most what the shared GCRA would admit; leases are taken, never invented.
//!
//! **Stranded capacity.** Units held by leases are at most `max_lease × stripes` at any instant, and
//! each is held only until its position passes — at most one lease lifetime (`end − t₀ ≤ D`; `g·T`
//! when the bucket was full). Units that expire unused, or cannot be given back because a later grant
//! sits above them, are *wasted*: they were leased from the shared GCRA and not used. The tested lower
//! bound, for unit costs over any multi-stripe trace and every prefix, is
//! `admitted_striped ≥ admitted_exact − (units held in stripe words + units wasted so far)`.
//! Adaptive leases shrink after a lease expires unused, so an idle stripe wastes at most a halving
//! series of leases.
//!
//! **Denials.** A denial writes nothing to the shared word: the lease transition stores only when it
//! grants at least the request's cost (the stripe then keeps its old lease). The stripe's own word is
//! locked and unlocked (its generation bumped) when a denial follows a failed refill.
//!
//! # Choosing the lease size
//! A lease of `g` units saves `g − 1` shared CASes but strands up to `g` units per stripe for up to
//! one lease lifetime, and at a full bucket expires `g·T` after it was taken. Choose `g` so that a
//! stripe uses a lease in well under that time at the rates you care about, and `g × stripes` is a
//! small fraction of the burst: e.g. for 10⁹/s and a burst of 10⁹, 4 096–65 536 units; for 1 000/s
//! with a burst of 100, a handful. The default adapts: it starts at one unit, doubles while a stripe
//! refills within 20 µs of its last lease, halves when an older lease expires unused, and stays
//! `≤ burst / (4 × stripes)` (and `≤ 65 536`). [`LeaseSize::Fixed`] pins it.
//!
//! # Ordering
//! The shared word is [`AtomicState`](tollgate_core::AtomicState) (all `Relaxed`: see its docs). A
//! stripe's lock holder writes the lease end and bookkeeping, then publishes the unlocked word with
//! `Release`; readers load the word with `Acquire` and then the end with `Acquire`, pairing with the
//! end's `Release` store so that a reader who sees a newer end also sees the lock that preceded it,
//! and its CAS fails. Generations make a CAS based on a replaced lease fail.

mod grant;
mod lease;
mod limiter;
mod sync;

pub use lease::LeaseWord;
pub use limiter::{
    LeaseReceipt, LeaseSize, MAX_STRIPES, StripedConfig, StripedError, StripedLimiter,
};
