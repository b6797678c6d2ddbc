//! Which keys a stripe's overflow state has decided: so that a key inserted later starts from that
//! state instead of a fresh one (no second burst), while keys that never overflowed still start fresh.

/// How many distinct overflowed keys a stripe remembers; past that it assumes every key may owe the
/// overflow state (strict, never loose). 32 tags are 256 B per stripe header.
pub(crate) const LEDGER_TAGS: usize = 32;

/// The hash tags of keys decided by one stripe's overflow state since it was last fresh, and of the
/// keys pinned there by [`pin_key`](crate::KeyedLimiter::pin_key).
///
/// Lives under the stripe's insert mutex: only inserts, overrides, pins and overflow decisions touch
/// it, all of which hold that lock.
#[derive(Debug)]
pub(crate) struct OverflowLedger {
    tags: [u64; LEDGER_TAGS],
    len: usize,
    /// More distinct keys overflowed than `tags` holds: every new key is treated as one of them.
    saturated: bool,
    /// Hash tags of pinned keys (one entry per pin): their slots are never eviction candidates.
    /// Empty except while a caller holds pins (a prepared policy reload), so an eviction scan pays
    /// one length check.
    pinned: Vec<u64>,
}

impl OverflowLedger {
    pub(crate) const fn new() -> Self {
        OverflowLedger {
            tags: [0; LEDGER_TAGS],
            len: 0,
            saturated: false,
            pinned: Vec::new(),
        }
    }

    /// Pins the key with this tag once more.
    pub(crate) fn pin(&mut self, tag: u64) {
        self.pinned.push(tag);
    }

    /// Takes one pin of the key with this tag away; whether it had one.
    pub(crate) fn unpin(&mut self, tag: u64) -> bool {
        match self.pinned.iter().position(|&t| t == tag) {
            Some(i) => {
                self.pinned.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether the key with this tag is pinned.
    #[inline]
    pub(crate) fn is_pinned(&self, tag: u64) -> bool {
        !self.pinned.is_empty() && self.pinned.contains(&tag)
    }

    /// Notes that the key with this tag was decided by the overflow state.
    pub(crate) fn record(&mut self, tag: u64) {
        if self.saturated || self.tags[..self.len].contains(&tag) {
            return;
        }
        if self.len == LEDGER_TAGS {
            self.saturated = true;
        } else {
            self.tags[self.len] = tag;
            self.len += 1;
        }
    }

    /// Whether the key with this tag may have admissions recorded only in the overflow state.
    pub(crate) fn owes(&self, tag: u64) -> bool {
        self.saturated || self.tags[..self.len].contains(&tag)
    }

    /// The key took a slot holding the overflow state's word: its debt now lives in its own state.
    pub(crate) fn settle(&mut self, tag: u64) {
        if let Some(i) = self.tags[..self.len].iter().position(|&t| t == tag) {
            self.len -= 1;
            self.tags.swap(i, self.len);
        }
    }

    /// The overflow state is fresh again: no key owes it anything.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.saturated = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_settles_and_saturates() {
        let mut ledger = OverflowLedger::new();
        ledger.record(7);
        ledger.record(7);
        assert!(ledger.owes(7) && !ledger.owes(8));
        ledger.settle(7);
        assert!(!ledger.owes(7));
        for tag in 1..=LEDGER_TAGS as u64 {
            ledger.record(tag);
        }
        assert!(!ledger.owes(0), "exactly full is not saturated");
        ledger.record(1_000);
        assert!(
            ledger.owes(0) && ledger.owes(1_000),
            "saturated: everyone owes"
        );
        ledger.clear();
        assert!(!ledger.owes(1));
    }
}
