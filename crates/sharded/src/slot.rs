//! The packed 16-byte slot word: a 64-bit tag and the algorithm's 64-bit state.
//!
//! ```text
//! bit 127                    68 67   64 63                                   0
//!     [ key hash, high 60 bits | tier ] [ algorithm state word              ]
//!     \__________ tag (64 bits) ______/
//! ```
//! * `tag == 0`: the slot is empty (never held a key). A stored tag's hash part is never 0.
//! * `tier`: 0 and 15 = the limiter's default quota (its even and odd generations, see
//!   `defaults.rs`); `1..=14` = override quota `tier - 1` (a pinned slot, never evicted).
//! * `state`: the [`Algorithm`](tollgate_core::Algorithm) word (0 = fresh).

/// Bits of the tag that hold the override tier.
pub(crate) const TIER_BITS: u32 = 4;
/// Mask of the tier within a tag.
pub(crate) const TIER_MASK: u64 = (1 << TIER_BITS) - 1;
/// Mask of the hash part within a tag.
pub(crate) const HASH_MASK: u64 = !TIER_MASK;
/// Where the tag sits in the 128-bit word.
const TAG_SHIFT: u32 = 64;

/// The hash part of a tag for a key whose 64-bit hash is `hash`: its high 60 bits, never zero.
#[inline]
pub(crate) fn tag_hash(hash: u64) -> u64 {
    let part = hash & HASH_MASK;
    if part == 0 { 1 << TIER_BITS } else { part }
}

/// One slot's contents, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotWord {
    /// Hash part | tier; 0 = empty.
    pub tag: u64,
    /// The algorithm's state word.
    pub state: u64,
}

impl SlotWord {
    /// A slot for the key with tag hash `hash_part` (from [`tag_hash`]), tier `tier`, state `state`.
    #[inline]
    pub(crate) fn new(hash_part: u64, tier: u8, state: u64) -> Self {
        SlotWord {
            tag: (hash_part & HASH_MASK) | (u64::from(tier) & TIER_MASK),
            state,
        }
    }

    /// The 128-bit word.
    #[inline]
    pub(crate) fn pack(self) -> u128 {
        (u128::from(self.tag) << TAG_SHIFT) | u128::from(self.state)
    }

    /// Splits a 128-bit word.
    #[inline]
    pub(crate) fn unpack(word: u128) -> Self {
        SlotWord {
            tag: (word >> TAG_SHIFT) as u64,
            state: word as u64,
        }
    }

    /// Whether the slot never held a key.
    #[inline]
    pub(crate) fn is_empty(self) -> bool {
        self.tag == 0
    }

    /// The tag's hash part.
    #[inline]
    pub(crate) fn hash_part(self) -> u64 {
        self.tag & HASH_MASK
    }

    /// The override tier (0 = default quota).
    #[inline]
    pub(crate) fn tier(self) -> u8 {
        (self.tag & TIER_MASK) as u8
    }

    /// The same key and tier with another state.
    #[inline]
    pub(crate) fn with_state(self, state: u64) -> Self {
        SlotWord { state, ..self }
    }

    /// The same key and state with another tier.
    #[inline]
    pub(crate) fn with_tier(self, tier: u8) -> Self {
        SlotWord::new(self.tag, tier, self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pack_round_trips(hash: u64, tier in 0u8..16, state: u64) {
            let word = SlotWord::new(tag_hash(hash), tier, state);
            prop_assert_eq!(SlotWord::unpack(word.pack()), word);
            prop_assert_eq!(word.tier(), tier);
            prop_assert_eq!(word.state, state);
            prop_assert_eq!(word.hash_part(), tag_hash(hash));
            prop_assert!(!word.is_empty());
            prop_assert_eq!(word.with_tier(0).hash_part(), word.hash_part());
        }
    }

    #[test]
    fn zero_hash_still_gets_a_non_empty_tag() {
        assert!(!SlotWord::new(tag_hash(0), 0, 0).is_empty());
        assert!(!SlotWord::new(tag_hash(0xF), 0, 0).is_empty());
        assert!(SlotWord::unpack(0).is_empty());
    }
}
