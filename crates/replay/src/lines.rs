//! Reading a stream one bounded line at a time.

use std::io::{BufRead, Read};

/// What [`read_line`] found.
pub(crate) enum Line {
    /// The input is done.
    End,
    /// A line (with its newline, unless it is the input's last) is in the buffer.
    Whole,
    /// A line longer than the bound was skipped to its end (the buffer holds nothing of it).
    TooLong,
}

/// Reads one line of at most `max` bytes (its newline excluded) into `buf`; a longer one is read
/// to its end without being kept, so `buf` never holds more than `max + 1` bytes.
pub(crate) fn read_line(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let n = input.by_ref().take(limit).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') || buf.len() <= max {
        // A whole line, or the input's last (no newline) within the bound.
        return Ok(Line::Whole);
    }
    buf.clear();
    loop {
        let available = match input.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(Line::TooLong);
        }
        match available.iter().position(|&b| b == b'\n') {
            Some(at) => {
                input.consume(at + 1);
                return Ok(Line::TooLong);
            }
            None => {
                let all = available.len();
                input.consume(all);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<(String, bool)> {
        let mut input = std::io::BufReader::with_capacity(3, input);
        let mut buf = Vec::new();
        let mut found = Vec::new();
        loop {
            match read_line(&mut input, &mut buf, max).expect("read") {
                Line::End => return found,
                Line::Whole => {
                    assert!(buf.len() <= max + 1);
                    found.push((String::from_utf8(buf.clone()).expect("text"), true));
                }
                Line::TooLong => {
                    assert!(buf.is_empty());
                    found.push((String::new(), false));
                }
            }
        }
    }

    #[test]
    fn a_line_past_the_bound_is_skipped_to_its_end_and_the_next_one_is_read() {
        let whole = |s: &str| (s.to_owned(), true);
        let skipped = (String::new(), false);
        assert_eq!(
            lines(b"abcd\nabcde\nab\n\nabcdefghij\nxy", 4),
            [
                whole("abcd\n"),
                skipped.clone(),
                whole("ab\n"),
                whole("\n"),
                skipped.clone(),
                whole("xy"),
            ]
        );
        assert_eq!(
            lines(b"abcd", 4),
            [whole("abcd")],
            "the last line, no newline"
        );
        assert_eq!(
            lines(b"abcde", 4),
            [skipped],
            "too long at the end of input"
        );
        assert!(lines(b"", 4).is_empty());
    }
}
