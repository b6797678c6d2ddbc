//! Equality of the short strings a decision compares on every request (descriptor names, match
//! values and prefixes: a few bytes each), in at most two word compares and no call.
//!
//! `==` on byte slices calls `memcmp` (or `bcmp`) for any length not known when compiling: a call
//! and its set-up for strings of 4 bytes, several times per request, was a measurable share of a
//! 3-rule decision (results/replay).

/// Whether `a` and `b` hold the same bytes: one or two overlapping loads per side for lengths up
/// to 16, the library compare beyond.
#[inline(always)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        // Bytes 0, n / 2 and n - 1 are every byte of a string of 1 to 3.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        // The first 4 and the last 4 (overlapping) cover 4 to 8 bytes.
        4..=8 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        9..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        _ => a == b,
    }
}

/// Whether `text` starts with `prefix` ([`same`] on the prefix's length).
#[inline(always)]
pub(crate) fn starts_with(text: &[u8], prefix: &[u8]) -> bool {
    text.get(..prefix.len())
        .is_some_and(|head| same(head, prefix))
}

/// The `N` bytes of `s` at `at`, as an array the compiler compares as one word (always `Some` for
/// the callers above, whose lengths bound `at + N`).
#[inline(always)]
fn word<const N: usize>(s: &[u8], at: usize) -> Option<[u8; N]> {
    s.get(at..)
        .and_then(|rest| rest.first_chunk::<N>())
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_the_library_compare_for_every_length_and_every_differing_byte() {
        for n in 0..=40usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same(&a, &a.clone()), "{n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!same(&a, &b), "{n} {at}");
            }
            let longer = [a.as_slice(), b"x"].concat();
            assert!(!same(&a, &longer), "{n}");
            assert!(starts_with(&longer, &a), "{n}");
            assert!(!starts_with(&a, &longer), "{n}");
        }
        assert!(starts_with(b"/api/items", b"/api"));
        assert!(!starts_with(b"/apx/items", b"/api"));
        assert!(starts_with(b"anything", b""));
    }
}
