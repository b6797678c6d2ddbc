//! A stripe's packed lease word.

/// A stripe's lease state, packed into one `u64` that the stripe's `AtomicU64` holds.
///
/// ```text
///  63      62 ........................ 20  19 ................ 0
/// [locked][ generation (43 bits)          ][ units (20 bits)    ]
/// ```
///
/// * `units`: how many units of the lease are still unused. They are the *top* `units` positions of
///   the lease's segment on the shared timeline, `[end − units·T, end)`, where `end` is kept in the
///   stripe's second atomic (a full 64-bit nanosecond value does not fit beside the count).
/// * `generation`: bumped every time the lock holder publishes a new word, so a compare-and-swap
///   based on a word read before a lease was replaced fails (no ABA short of 2^43 replacements
///   while one thread is stalled between its load and its CAS).
/// * `locked`: a thread is replacing this stripe's lease (retiring the old one, taking a new one from
///   the shared state). Nobody else writes the word meanwhile; other callers on this stripe go to the
///   shared state directly, so a preempted lock holder slows the stripe but blocks no one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct LeaseWord(u64);

impl LeaseWord {
    /// Bits of the unit count.
    pub const UNITS_BITS: u32 = 20;
    /// Mask of the unit count (at shift 0). Also the largest lease a stripe can hold.
    pub const UNITS_MASK: u64 = (1 << Self::UNITS_BITS) - 1;
    /// Shift of the generation.
    pub const GEN_SHIFT: u32 = Self::UNITS_BITS;
    /// Mask of the generation (after shifting down).
    pub const GEN_MASK: u64 = (1 << (Self::LOCKED_SHIFT - Self::GEN_SHIFT)) - 1;
    /// Shift of the locked flag.
    pub const LOCKED_SHIFT: u32 = 63;

    /// An unlocked word holding `units` (masked to [`UNITS_MASK`](Self::UNITS_MASK)) at generation
    /// `generation` (masked to [`GEN_MASK`](Self::GEN_MASK), so it wraps).
    #[inline]
    pub const fn new(units: u64, generation: u64) -> Self {
        LeaseWord((units & Self::UNITS_MASK) | ((generation & Self::GEN_MASK) << Self::GEN_SHIFT))
    }

    /// The word from its raw bits.
    #[inline]
    pub const fn from_bits(bits: u64) -> Self {
        LeaseWord(bits)
    }

    /// The raw bits.
    #[inline]
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Unused units of the lease (some may already have expired: see the crate docs).
    #[inline]
    pub const fn units(self) -> u64 {
        self.0 & Self::UNITS_MASK
    }

    /// The generation.
    #[inline]
    pub const fn generation(self) -> u64 {
        (self.0 >> Self::GEN_SHIFT) & Self::GEN_MASK
    }

    /// Whether a thread is replacing the lease.
    #[inline]
    pub const fn is_locked(self) -> bool {
        self.0 >> Self::LOCKED_SHIFT == 1
    }

    /// The same word with `units` units (masked).
    #[inline]
    pub const fn with_units(self, units: u64) -> Self {
        LeaseWord((self.0 & !Self::UNITS_MASK) | (units & Self::UNITS_MASK))
    }

    /// The same word, locked.
    #[inline]
    pub const fn locked(self) -> Self {
        LeaseWord(self.0 | (1 << Self::LOCKED_SHIFT))
    }

    /// The unlocked word the lock holder publishes next: `units` at the next generation.
    #[inline]
    pub const fn next(self, units: u64) -> Self {
        LeaseWord::new(units, self.generation().wrapping_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseWord;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(units in 0..=LeaseWord::UNITS_MASK, generation in 0..=LeaseWord::GEN_MASK,
                       other in 0..=LeaseWord::UNITS_MASK) {
            let word = LeaseWord::new(units, generation);
            prop_assert_eq!(word.units(), units);
            prop_assert_eq!(word.generation(), generation);
            prop_assert!(!word.is_locked());
            let locked = word.locked();
            prop_assert!(locked.is_locked());
            prop_assert_eq!(locked.locked(), locked, "locking a locked word keeps it locked");
            prop_assert_eq!(locked.units(), units);
            prop_assert_eq!(locked.generation(), generation);
            let changed = word.with_units(other);
            prop_assert_eq!(changed.units(), other);
            prop_assert_eq!(changed.generation(), generation);
            let next = locked.next(other);
            prop_assert!(!next.is_locked());
            prop_assert_eq!(next.units(), other);
            prop_assert_eq!(next.generation(), (generation + 1) & LeaseWord::GEN_MASK);
            prop_assert_eq!(LeaseWord::from_bits(word.bits()), word);
        }
    }

    #[test]
    fn fields_do_not_overlap() {
        assert_eq!(
            LeaseWord::UNITS_MASK & (LeaseWord::GEN_MASK << LeaseWord::GEN_SHIFT),
            0
        );
        assert_eq!(
            (LeaseWord::GEN_MASK << LeaseWord::GEN_SHIFT) >> LeaseWord::LOCKED_SHIFT,
            0
        );
        assert_eq!(LeaseWord::new(u64::MAX, u64::MAX).locked().bits(), u64::MAX);
    }
}
