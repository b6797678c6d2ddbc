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
//! Many threads, one hot quota (a service-wide cap in a proxy). One thread alone decides as plain
//! [`tollgate_core::GcraLimiter`] does (see "One thread alone"), and a denial costs what plain GCRA's
//! does plus the read of one switch, which also stands for GCRA's cost check (see "One thread
//! alone"; `results/striped`: 26 instructions against 24 at a fixed instant), so a flood over the
//! cap does not pay for the leases. Decisions are the core
//! [`Decision`](tollgate_core::Decision)s; a cost above the burst
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
//! locked and unlocked (its generation bumped) only when a refill was attempted and refused, which
//! the cached denial makes rare.
//!
//! **The cached denial.** A stripe whose word holds no unit (and is not locked) first asks the shared
//! word itself, with one `Relaxed` load and GCRA's compare: if it refuses `cost` at `now`, that is the
//! answer, with no lock, no CAS and no write. Only when it could grant does the stripe lock and take a
//! lease. The shared TAT is the stripe's memory of until when it is refused: a refusal never writes
//! it, so during a flood of denials its cache line stays shared by every core and the load hits.
//! (A private copy of the TAT a stripe was refused at would also be one load, but would miss a
//! give-back or a refund that lowers the TAT, and at a frozen instant deny those units for ever;
//! the loom model `a_cached_denial_does_not_outlive_a_refund` fails for such a copy.) Its proof
//! obligations:
//! * *It never over-admits*: it only denies, and writes nothing, so the admitted stream, and with it
//!   Invariant I and the conformance proof above, are those of a run without the denied requests.
//! * *It denies nothing a refill would grant*: with no unit held, the refill's give-back is empty
//!   (`lo = end`), so the refill's grant is GCRA on the shared TAT at `now` for `cost`; the cached
//!   denial decides exactly that on a TAT value the word held after this thread's own earlier
//!   operations on it (coherence), the same value a refill's first attempt could have read. A stale
//!   value is older, hence (the TAT falls only by give-backs and refunds, which the next decision
//!   sees) the denial is one the shared word really gave, at most one load ago.
//! * *It cannot deny for ever*: nothing is remembered between decisions, so once the shared word can
//!   grant (time passed its TAT, or a give-back or refund lowered it), the next decision on the stripe
//!   goes to the refill.
//!
//! A word holding units (live or expired) takes the locked refill as before, since giving its live
//! units back may make `cost` fit.
//!
//! # One thread alone
//! A limiter used by one thread at a time gains nothing from leases. It starts on the *alone path*:
//! `check_at` decides with plain GCRA on the shared word (the same CAS loop and transition as
//! [`tollgate_core::GcraLimiter`], so its decisions are that limiter's, exactly), after one `Relaxed`
//! load of a switch on a cache line of its own (beside the shared word it would move between cores
//! with every lease). The switch is the bound of the costs the alone path decides: `burst + 1`
//! while it is on, 0 while off, so one compare tests both the switch and the cost check plain GCRA
//! makes (a cost above the burst goes to the stripes' path, which refuses it as GCRA does). A
//! denial writes nothing, so it is answered before the CAS loop. The limiter knows it is alone for
//! free: a
//! compare-and-swap on the shared word fails only when another thread wrote the word between our read
//! and our CAS; the first such failure turns the switch off and every thread goes to its stripe from its
//! next decision. Conversely, a stripe that takes four leases in a row with
//! the shared TAT still at its previous lease's end (nobody else took from the shared word in between:
//! the give-back test of the lease transition) turns it on again. Denials never write, so a flood of
//! denials stays on the alone path at any thread count. The switch is a hint: both paths keep Invariant
//! I (an alone-path admission is a grant of exactly `cost` units at `max(TAT, now)`, the lease
//! transition with `want = cost`), so the bounds above hold whatever the switch says and however stale
//! a thread's view of it is; a stale view costs speed (two threads on the shared word for a moment),
//! never a unit. Units a stripe still holds when the limiter goes alone expire as wasted, within the
//! stranded-capacity bound. [`StripedConfig::always_lease`] turns the alone path off.
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
//! and its CAS fails. Generations make a CAS based on a replaced lease fail. The cached denial adds
//! one `Relaxed` load of the shared word (argued above) behind the word's `Acquire` load, on which it
//! relies as the lease path does: a reader that finds units in the word must find their `end` (the
//! loom model `cached_denials_racing_refills_on_one_stripe_admit_exactly_the_burst` fails when that
//! load is weakened to `Relaxed`). The alone switch is `Relaxed` throughout: it publishes nothing and
//! every decision is exact whatever value is read.

mod config;
#[cfg(feature = "diagnostics")]
mod diagnostics;
mod error;
mod grant;
mod handover;
mod lease;
mod lease_path;
mod limiter;
mod receipt;
mod refund;
mod shared;
mod stripe;
mod sync;

pub use config::{LeaseSize, MAX_STRIPES, StripedConfig};
pub use error::StripedError;
pub use lease::LeaseWord;
pub use limiter::StripedLimiter;
pub use receipt::LeaseReceipt;
