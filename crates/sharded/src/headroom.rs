//! How much a keyed decision must leave for higher priority classes, as a type (one idea: the
//! headroom; the table's decision paths are generic over it).

use tollgate_core::{Algorithm, CheckError, Decision, Nanos};

/// How much a decision must leave for higher priority classes: a type, so that the plain path
/// ([`Plain`]) compiles to exactly `Algorithm::decide` with no test of a reserve at run time, and
/// a reserve (`u64` units) to `Algorithm::decide_reserving`.
pub(crate) trait Headroom: Copy {
    /// The units kept back (0 for [`Plain`]).
    fn units(self) -> u64;

    /// The transition for `cost` units at `now` from `state`.
    fn decide<A: Algorithm>(
        self,
        algorithm: &A,
        state: u64,
        now: Nanos,
        cost: u64,
    ) -> Result<tollgate_core::Transition, CheckError>;

    /// The same decision applied to an atomic state word (the stripe's overflow state).
    fn apply<A: Algorithm>(
        self,
        state: &tollgate_core::AtomicState,
        algorithm: &A,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError>;
}

/// No headroom: a plain decision.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plain;

impl Headroom for Plain {
    #[inline(always)]
    fn units(self) -> u64 {
        0
    }

    #[inline(always)]
    fn decide<A: Algorithm>(
        self,
        algorithm: &A,
        state: u64,
        now: Nanos,
        cost: u64,
    ) -> Result<tollgate_core::Transition, CheckError> {
        algorithm.decide(state, now, cost)
    }

    #[inline(always)]
    fn apply<A: Algorithm>(
        self,
        state: &tollgate_core::AtomicState,
        algorithm: &A,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        state.apply(algorithm, now, cost)
    }
}

impl Headroom for u64 {
    #[inline(always)]
    fn units(self) -> u64 {
        self
    }

    #[inline(always)]
    fn decide<A: Algorithm>(
        self,
        algorithm: &A,
        state: u64,
        now: Nanos,
        cost: u64,
    ) -> Result<tollgate_core::Transition, CheckError> {
        algorithm.decide_reserving(state, now, cost, self)
    }

    #[inline(always)]
    fn apply<A: Algorithm>(
        self,
        state: &tollgate_core::AtomicState,
        algorithm: &A,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        state.apply_reserving(algorithm, now, cost, self)
    }
}
