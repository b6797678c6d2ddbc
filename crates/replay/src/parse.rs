//! Reading one line of recorded traffic into a request: a timestamp, descriptors and a cost.
//!
//! * **JSON lines** (`json`): `{"ts": 1733300000.125, "descriptors": {"remote_address":
//!   "192.0.2.1", "path": "/api"}, "cost": 1}`. `ts` is seconds (fractions to the nanosecond) since
//!   any epoch; `cost` is optional (1). Unknown top-level fields are skipped. A line without
//!   escapes is read in place by a small scanner (no allocation); a line with escapes goes
//!   through serde_json.
//! * **nginx** (`nginx`), the `combined` format:
//!   `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//!   "$http_referer" "$http_user_agent"`. Descriptors: `remote_address` = `$remote_addr`,
//!   `method` and `path` (without the query) from `$request`, `user` = `$remote_user` when not
//!   `-`. Cost 1.
//! * **Envoy** (`envoy`), Envoy's default text format:
//!   `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE%
//!   ... "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%"
//!   ...`. Descriptors: `method`, `path` (without the query), `remote_address` = the first
//!   address of `X-Forwarded-For` when not `-`, `authority` = `:authority`. Cost 1.

mod access_log;

use std::fmt;

use smallvec::SmallVec;

use access_log::{parse_envoy, parse_nginx};

/// The format of a traffic file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON lines: `{"ts": seconds, "descriptors": {...}, "cost": n}`.
    Json,
    /// nginx `combined` access log.
    Nginx,
    /// Envoy's default text access log.
    Envoy,
}

/// One request read from a line; strings borrow the line (or the [`Scratch`]). The default is
/// a request at 0 with no descriptors and cost 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest<'a> {
    /// Nanoseconds since the log's epoch (Unix time for nginx and Envoy logs).
    pub ts_ns: u64,
    /// The request's descriptors.
    pub descriptors: SmallVec<[(&'a str, &'a str); 8]>,
    /// Units.
    pub cost: u64,
}

impl Default for LoggedRequest<'_> {
    fn default() -> Self {
        LoggedRequest {
            ts_ns: 0,
            descriptors: SmallVec::new(),
            cost: 1,
        }
    }
}

/// Why a line was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    /// Not UTF-8.
    Utf8,
    /// Not the format's syntax.
    Syntax,
    /// No timestamp, or one that cannot be read.
    Timestamp,
    /// A descriptor value that is not a string, or no descriptors object.
    Descriptors,
    /// A cost that is not a whole number.
    Cost,
    /// Longer than [`ReplayBounds::line_bytes`](crate::ReplayBounds::line_bytes): skipped to its
    /// end without being buffered.
    TooLong,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LineError::Utf8 => "not UTF-8",
            LineError::Syntax => "syntax",
            LineError::Timestamp => "bad or missing timestamp",
            LineError::Descriptors => "bad or missing descriptors",
            LineError::Cost => "bad cost",
            LineError::TooLong => "too long (skipped unread)",
        })
    }
}

/// Owned strings for the lines the in-place scanner leaves to serde_json.
#[derive(Debug, Default)]
pub struct Scratch {
    entries: Vec<(String, String)>,
}

#[derive(serde::Deserialize)]
struct OwnedLine {
    ts: serde_json::Number,
    descriptors: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    cost: Option<u64>,
}

/// Reads one line (without its newline) of `format`.
///
/// # Errors
/// [`LineError`] saying what is wrong.
pub fn parse_line<'a>(
    format: Format,
    line: &'a [u8],
    scratch: &'a mut Scratch,
) -> Result<LoggedRequest<'a>, LineError> {
    let mut request = LoggedRequest::default();
    parse_line_into(format, line, scratch, &mut request)?;
    Ok(request)
}

/// [`parse_line`] into `request` (overwritten; on an error, left in any state): the replay's hot
/// loop keeps one request on its stack, so its descriptors are not moved on every return.
///
/// # Errors
/// As [`parse_line`].
#[inline]
pub fn parse_line_into<'a>(
    format: Format,
    line: &'a [u8],
    scratch: &'a mut Scratch,
    request: &mut LoggedRequest<'a>,
) -> Result<(), LineError> {
    let line = text(line)?;
    match format {
        Format::Json => {
            if !parse_json_fast(line, request)? {
                *request = parse_json_slow(line, scratch)?;
            }
        }
        Format::Nginx => *request = parse_nginx(line)?,
        Format::Envoy => *request = parse_envoy(line)?,
    }
    Ok(())
}

/// `line` as text: an ASCII line (nearly every log line) is checked 8 bytes at a time and taken
/// as it is; any other goes through the full UTF-8 check.
#[inline]
fn text(line: &[u8]) -> Result<&str, LineError> {
    if line.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(line) })
    } else {
        std::str::from_utf8(line).map_err(|_| LineError::Utf8)
    }
}

/// The position of the first `"` or `\` in `b` at or after `from`, if any: 8 bytes per step (a
/// zero-byte test on the word XORed with each byte), then byte by byte for the last few.
#[inline(always)]
fn quote_or_escape(b: &[u8], mut from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = ONES * b'"' as u64;
    const ESCAPES: u64 = ONES * b'\\' as u64;
    while let Some(&chunk) = b.get(from..).and_then(|rest| rest.first_chunk::<8>()) {
        let word = u64::from_le_bytes(chunk);
        let (q, e) = (word ^ QUOTES, word ^ ESCAPES);
        // High bit set in the lowest byte that is zero (no false positive below the first one).
        let found = ((q.wrapping_sub(ONES) & !q) | (e.wrapping_sub(ONES) & !e)) & HIGHS;
        if found != 0 {
            return Some(from + (found.trailing_zeros() / 8) as usize);
        }
        from += 8;
    }
    b.get(from..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|at| from + at)
}

/// A cursor over a JSON line (bytes of a valid UTF-8 line: every slice it cuts at an ASCII
/// quote is valid UTF-8 too).
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

/// `Ok(None)`: a string with escapes; the caller falls back to serde_json.
type Fast<T> = Result<Option<T>, LineError>;

impl<'a> Cursor<'a> {
    /// `s[start..end]` for `start <= end <= s.len()` found by the scanner next to ASCII bytes
    /// (a quote or a digit) or at the line's ends, which are character boundaries.
    #[inline(always)]
    fn cut(&self, start: usize, end: usize) -> &'a str {
        debug_assert!(self.s.is_char_boundary(start) && self.s.is_char_boundary(end));
        debug_assert!(start <= end);
        // SAFETY: the callers' bounds are within the line and ordered (a quote's position plus
        // one and the next quote's, or a number's first and past-last byte), and each is at an
        // ASCII byte or the line's end, so on a character boundary.
        unsafe { self.s.get_unchecked(start..end) }
    }
    #[inline(always)]
    fn ws(&mut self) {
        let b = self.s.as_bytes();
        while let Some(b' ' | b'\t' | b'\r') = b.get(self.i) {
            self.i += 1;
        }
    }
    #[inline(always)]
    fn eat(&mut self, c: u8) -> bool {
        // Compact JSON (no whitespace between tokens) takes the first test.
        if self.s.as_bytes().get(self.i) == Some(&c) {
            self.i += 1;
            return true;
        }
        self.ws();
        if self.s.as_bytes().get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.as_bytes().get(self.i).copied()
    }
    /// A string without escapes, borrowed.
    #[inline(always)]
    fn string(&mut self) -> Fast<&'a str> {
        if !self.eat(b'"') {
            return Err(LineError::Syntax);
        }
        let b = self.s.as_bytes();
        let start = self.i;
        let end = quote_or_escape(b, start).ok_or(LineError::Syntax)?;
        if b[end] == b'\\' {
            return Ok(None);
        }
        self.i = end + 1;
        Ok(Some(self.cut(start, end)))
    }
    /// A number's text.
    #[inline(always)]
    fn number(&mut self) -> Result<&'a str, LineError> {
        self.ws();
        let b = self.s.as_bytes();
        let start = self.i;
        while let Some(b'0'..=b'9' | b'.' | b'-' | b'+' | b'e' | b'E') = b.get(self.i) {
            self.i += 1;
        }
        if start == self.i {
            return Err(LineError::Syntax);
        }
        Ok(self.cut(start, self.i))
    }
    /// A cost: a whole number of units, as `number`'s text parsed as a `u64` (a run of at most
    /// 19 digits, the common case, read in the same pass).
    #[inline(always)]
    fn cost(&mut self) -> Result<u64, LineError> {
        self.ws();
        let b = self.s.as_bytes();
        let (n, value) = digit_run(b, self.i);
        let in_number = |c: &u8| matches!(c, b'.' | b'-' | b'+' | b'e' | b'E');
        if (1..=19).contains(&n) && !b.get(self.i + n).is_some_and(in_number) {
            self.i += n;
            return Ok(value);
        }
        self.number()?.parse().map_err(|_| LineError::Cost)
    }
    /// A timestamp (seconds, an optional fraction) as nanoseconds, in one pass: what
    /// [`seconds_to_ns`] of [`number`](Self::number)'s text answers, with the same errors (no
    /// number: `Syntax`; a number that is not whole seconds with an optional fraction, or too
    /// large: `Timestamp`).
    #[inline(always)]
    fn timestamp(&mut self) -> Result<u64, LineError> {
        let in_number = |c: &u8| matches!(c, b'0'..=b'9' | b'.' | b'-' | b'+' | b'e' | b'E');
        self.ws();
        let b = self.s.as_bytes();
        let start = self.i;
        let (whole, seconds) = digit_run(b, start);
        self.i += whole;
        // 19 digits never overflow a u64; more are too many seconds for u64 nanoseconds anyway.
        let seconds = Some(seconds).filter(|_| whole <= 19);
        let mut ns = Some(0);
        if b.get(self.i) == Some(&b'.') {
            self.i += 1;
            let digits = self.i;
            let (n, value) = digit_run(b, digits);
            self.i += n;
            ns = match SCALE.get(n) {
                Some(scale) => Some(value * scale),
                None => fraction_ns(&b[digits..self.i]),
            };
        }
        if self.i == start && !b.get(self.i).is_some_and(in_number) {
            return Err(LineError::Syntax);
        }
        if whole == 0 || b.get(self.i).is_some_and(in_number) {
            return Err(LineError::Timestamp);
        }
        seconds
            .and_then(|s| s.checked_mul(1_000_000_000)?.checked_add(ns?))
            .ok_or(LineError::Timestamp)
    }
    /// Skips a scalar value (string, number, true, false, null).
    fn skip_scalar(&mut self) -> Fast<()> {
        match self.peek() {
            Some(b'"') => Ok(self.string()?.map(drop)),
            Some(b't') | Some(b'f') | Some(b'n') => {
                let b = self.s.as_bytes();
                while self.i < b.len() && b[self.i].is_ascii_alphabetic() {
                    self.i += 1;
                }
                Ok(Some(()))
            }
            // Objects and arrays in unknown fields: serde_json skips them.
            Some(b'{') | Some(b'[') => Ok(None),
            _ => self.number().map(|_| Some(())),
        }
    }
    /// The descriptors object, `{"name": "value", ...}`, borrowed into `found` (cleared first).
    #[inline(always)]
    fn descriptors(&mut self, found: &mut SmallVec<[(&'a str, &'a str); 8]>) -> Fast<()> {
        found.clear();
        if !self.eat(b'{') {
            return Err(LineError::Descriptors);
        }
        if self.eat(b'}') {
            return Ok(Some(()));
        }
        loop {
            let Some(name) = self.string()? else {
                return Ok(None);
            };
            if !self.eat(b':') {
                return Err(LineError::Syntax);
            }
            if self.peek() != Some(b'"') {
                return Err(LineError::Descriptors);
            }
            let Some(value) = self.string()? else {
                return Ok(None);
            };
            push_pair(found, name, value);
            if self.eat(b'}') {
                return Ok(Some(()));
            }
            if !self.eat(b',') {
                return Err(LineError::Syntax);
            }
        }
    }
}

/// `found.push((name, value))`, the pair taken in registers: pushed inline, the pair went through
/// a stack copy that `SmallVec::push` (a call) read back in 16-byte loads over the caller's 8-byte
/// stores, a store-forwarding stall that cost about 5 % of a replay (perf).
#[inline(never)]
fn push_pair<'a>(found: &mut SmallVec<[(&'a str, &'a str); 8]>, name: &'a str, value: &'a str) {
    found.push((name, value));
}

/// The fast scanner into `request`: `Ok(false)` for a line it leaves to serde_json (escapes, an
/// object or array in an unknown field).
fn parse_json_fast<'a>(line: &'a str, request: &mut LoggedRequest<'a>) -> Result<bool, LineError> {
    let mut c = Cursor { s: line, i: 0 };
    if !c.eat(b'{') {
        return Err(LineError::Syntax);
    }
    let (mut ts, mut cost, mut descriptors) = (None, 1, false);
    if !c.eat(b'}') {
        loop {
            let Some(field) = c.string()? else {
                return Ok(false);
            };
            if !c.eat(b':') {
                return Err(LineError::Syntax);
            }
            // Matched as bytes: compiled to a length test and a word compare, not a call.
            match field.as_bytes() {
                b"ts" => ts = Some(c.timestamp()?),
                b"cost" => cost = c.cost()?,
                b"descriptors" => {
                    if c.descriptors(&mut request.descriptors)?.is_none() {
                        return Ok(false);
                    }
                    descriptors = true;
                }
                _ => {
                    if c.skip_scalar()?.is_none() {
                        return Ok(false);
                    }
                }
            }
            if c.eat(b'}') {
                break;
            }
            if !c.eat(b',') {
                return Err(LineError::Syntax);
            }
        }
    }
    c.ws();
    if c.i != line.len() {
        return Err(LineError::Syntax);
    }
    request.ts_ns = ts.ok_or(LineError::Timestamp)?;
    if !descriptors {
        return Err(LineError::Descriptors);
    }
    request.cost = cost;
    Ok(true)
}

fn parse_json_slow<'a>(
    line: &str,
    scratch: &'a mut Scratch,
) -> Result<LoggedRequest<'a>, LineError> {
    let owned: OwnedLine = serde_json::from_str(line).map_err(|_| LineError::Syntax)?;
    let ts_ns = seconds_to_ns(&owned.ts.to_string()).ok_or(LineError::Timestamp)?;
    scratch.entries.clear();
    for (name, value) in owned.descriptors {
        let serde_json::Value::String(value) = value else {
            return Err(LineError::Descriptors);
        };
        scratch.entries.push((name, value));
    }
    Ok(LoggedRequest {
        ts_ns,
        descriptors: scratch
            .entries
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect(),
        cost: owned.cost.unwrap_or(1),
    })
}

/// `"1733300000.125"` seconds as nanoseconds, exactly (at most 9 fraction digits are read; the
/// rest must be digits too). One pass, no allocation.
fn seconds_to_ns(text: &str) -> Option<u64> {
    let (whole, frac) = match text.as_bytes().iter().position(|&b| b == b'.') {
        Some(dot) => (&text.as_bytes()[..dot], &text.as_bytes()[dot + 1..]),
        None => (text.as_bytes(), &[][..]),
    };
    if whole.is_empty() {
        return None;
    }
    let mut seconds: u64 = 0;
    for &b in whole {
        if !b.is_ascii_digit() {
            return None;
        }
        seconds = seconds.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    seconds
        .checked_mul(1_000_000_000)?
        .checked_add(fraction_ns(frac)?)
}

/// The digits after a decimal point as nanoseconds (the first 9 read; all must be digits).
fn fraction_ns(digits: &[u8]) -> Option<u64> {
    let mut ns: u64 = 0;
    for (k, &b) in digits.iter().enumerate() {
        if !b.is_ascii_digit() {
            return None;
        }
        if k < 9 {
            ns = ns * 10 + u64::from(b - b'0');
        }
    }
    Some(ns * SCALE[digits.len().min(9)])
}

/// What `n` fraction digits (at most 9) are multiplied by to make nanoseconds (".125" is
/// 125 000 000 ns).
const SCALE: [u64; 10] = [
    1_000_000_000,
    100_000_000,
    10_000_000,
    1_000_000,
    100_000,
    10_000,
    1_000,
    100,
    10,
    1,
];

/// The run of ASCII digits at `b[from..]`: its length, and its value (wrapping past `u64::MAX`:
/// the callers bound the length). Eight digits per step where the line has them.
#[inline(always)]
fn digit_run(b: &[u8], from: usize) -> (usize, u64) {
    let mut at = from;
    let mut value = 0u64;
    while let Some(eight) = b
        .get(at..)
        .and_then(|rest| rest.first_chunk::<8>())
        .and_then(|&chunk| eight_digits(chunk))
    {
        value = value.wrapping_mul(100_000_000).wrapping_add(eight);
        at += 8;
    }
    while let Some(&d) = b.get(at).filter(|d| d.is_ascii_digit()) {
        value = value.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        at += 1;
    }
    (at - from, value)
}

/// Eight ASCII digits (the first the most significant) as their value, in a few word operations;
/// `None` when any byte is not a digit.
#[inline(always)]
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    const NIBBLES: u64 = u64::from_ne_bytes([0xF0; 8]);
    let word = u64::from_le_bytes(chunk);
    // A digit's high nibble is 3, and stays 3 when 6 is added (0x3A..=0x3F would carry to 4).
    let digits =
        (word & NIBBLES) | ((word.wrapping_add(u64::from_ne_bytes([6; 8])) & NIBBLES) >> 4);
    if digits != u64::from_ne_bytes([0x33; 8]) {
        return None;
    }
    // Byte k is digit k (0..=9); then byte 2k holds the pair 10 d(2k) + d(2k+1).
    let d = word - u64::from_ne_bytes([b'0'; 8]);
    let pairs = d.wrapping_mul(10).wrapping_add(d >> 8);
    const EVEN: u64 = 0x0000_00FF_0000_00FF;
    // Pairs 0 and 2 (bytes 0 and 4) times 10^6 and 10^2, pairs 1 and 3 (bytes 2 and 6) times 10^4
    // and 1, summed in the high half.
    let high = (pairs & EVEN).wrapping_mul(100 + (1_000_000 << 32));
    let low = ((pairs >> 16) & EVEN).wrapping_mul(1 + (10_000 << 32));
    Some(high.wrapping_add(low) >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) type Parsed = (u64, Vec<(String, String)>, u64);

    pub(super) fn parse(format: Format, line: &str) -> Result<Parsed, LineError> {
        let mut scratch = Scratch::default();
        parse_line(format, line.as_bytes(), &mut scratch).map(|r| {
            (
                r.ts_ns,
                r.descriptors
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
                r.cost,
            )
        })
    }

    pub(super) fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn json_lines_fast_and_with_escapes() {
        let line =
            r#"{"ts": 12.5, "descriptors": {"ip": "a", "path": "/x"}, "cost": 3, "note": null}"#;
        assert_eq!(
            parse(Format::Json, line),
            Ok((12_500_000_000, pairs(&[("ip", "a"), ("path", "/x")]), 3))
        );
        let escaped = r#"{"descriptors": {"path": "/a\"b"}, "ts": 1}"#;
        assert_eq!(
            parse(Format::Json, escaped),
            Ok((1_000_000_000, pairs(&[("path", "/a\"b")]), 1))
        );
        assert_eq!(parse(Format::Json, "{\"ts\": 1"), Err(LineError::Syntax));
        assert_eq!(
            parse(Format::Json, r#"{"descriptors": {}}"#),
            Err(LineError::Timestamp)
        );
        assert_eq!(
            parse(Format::Json, r#"{"ts": 1, "descriptors": {"a": 1}}"#),
            Err(LineError::Descriptors)
        );
        assert_eq!(
            parse(Format::Json, r#"{"ts": 1, "descriptors": {}, "cost": -1}"#),
            Err(LineError::Cost)
        );
        assert_eq!(parse(Format::Json, "garbage"), Err(LineError::Syntax));
        let cost = |text: &str| {
            parse(
                Format::Json,
                &format!(r#"{{"ts":1,"descriptors":{{}},"cost":{text}}}"#),
            )
            .map(|p| p.2)
        };
        assert_eq!(cost("7"), Ok(7));
        assert_eq!(cost(" 12 "), Ok(12));
        assert_eq!(cost("+2"), Ok(2), "as `u64::from_str` reads it");
        assert_eq!(cost("18446744073709551615"), Ok(u64::MAX));
        for bad in ["18446744073709551616", "1.5", "1e3", "2E1", "-0"] {
            assert_eq!(cost(bad), Err(LineError::Cost), "{bad}");
        }
    }

    #[test]
    fn digit_runs_read_eight_at_a_time_as_one_at_a_time() {
        let naive = |b: &[u8], from: usize| {
            let n = b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
            let value = b[from..from + n].iter().fold(0u64, |v, &d| {
                v.wrapping_mul(10).wrapping_add(u64::from(d - b'0'))
            });
            (n, value)
        };
        // Every run length up to 24 from several offsets, with each kind of byte after it
        // (including the ASCII neighbours of the digits, '/' and ':').
        for len in 0..=24 {
            for after in [b"", &b"/"[..], b":", b".", b"\"", b"\xff", b"\x00"] {
                for offset in 0..3 {
                    let mut line = vec![b'x'; offset];
                    line.extend((0..len).map(|k| b"9876543210"[(k * 7 + offset) % 10]));
                    line.extend_from_slice(after);
                    line.extend_from_slice(b"12345678");
                    if after.is_empty() {
                        line.truncate(offset + len);
                    }
                    assert_eq!(digit_run(&line, offset), naive(&line, offset), "{line:?}");
                }
            }
        }
        assert_eq!(eight_digits(*b"00000000"), Some(0));
        assert_eq!(eight_digits(*b"99999999"), Some(99_999_999));
        assert_eq!(eight_digits(*b"12345678"), Some(12_345_678));
        for bad in 0..=255u8 {
            if !bad.is_ascii_digit() {
                for at in 0..8 {
                    let mut chunk = *b"55555555";
                    chunk[at] = bad;
                    assert_eq!(eight_digits(chunk), None, "{chunk:?}");
                }
            }
        }
    }

    #[test]
    fn json_timestamps_read_in_one_pass_as_seconds_to_ns_reads_them() {
        let ts = |text: &str| {
            parse(
                Format::Json,
                &format!(r#"{{"ts":{text},"descriptors":{{}}}}"#),
            )
            .map(|p| p.0)
        };
        assert_eq!(ts("1700000000.123456789"), Ok(1_700_000_000_123_456_789));
        assert_eq!(ts("12.5"), Ok(12_500_000_000));
        assert_eq!(ts("7"), Ok(7_000_000_000));
        assert_eq!(ts("7."), Ok(7_000_000_000));
        assert_eq!(
            ts("1.0000000019"),
            Ok(1_000_000_001),
            "digits past the 9th are dropped"
        );
        assert_eq!(ts(" 3 "), Ok(3_000_000_000));
        for bad in [
            ".5",
            "-5",
            "1e5",
            "1.2.3",
            "1.5E3",
            "+1",
            "18446744073709551616",
        ] {
            assert_eq!(ts(bad), Err(LineError::Timestamp), "{bad}");
            assert_eq!(seconds_to_ns(bad), None, "{bad}");
        }
        assert_eq!(
            ts("18446744074"),
            Err(LineError::Timestamp),
            "past u64 nanoseconds"
        );
        for bad in ["\"x\"", "null", "true"] {
            assert_eq!(ts(bad), Err(LineError::Syntax), "{bad}");
        }
    }
}
