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
    let line = std::str::from_utf8(line).map_err(|_| LineError::Utf8)?;
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

/// A cursor over a JSON line (bytes of a valid UTF-8 line: every slice it cuts at an ASCII
/// quote is valid UTF-8 too).
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

/// `Ok(None)`: a string with escapes; the caller falls back to serde_json.
type Fast<T> = Result<Option<T>, LineError>;

impl<'a> Cursor<'a> {
    #[inline]
    fn ws(&mut self) {
        let b = self.s.as_bytes();
        while let Some(b' ' | b'\t' | b'\r') = b.get(self.i) {
            self.i += 1;
        }
    }
    #[inline]
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
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.as_bytes().get(self.i).copied()
    }
    /// A string without escapes, borrowed.
    #[inline]
    fn string(&mut self) -> Fast<&'a str> {
        if !self.eat(b'"') {
            return Err(LineError::Syntax);
        }
        let b = self.s.as_bytes();
        let start = self.i;
        let mut end = start;
        loop {
            match b.get(end) {
                Some(b'"') => break,
                Some(b'\\') => return Ok(None),
                Some(_) => end += 1,
                None => return Err(LineError::Syntax),
            }
        }
        self.i = end + 1;
        // The quotes are ASCII, so both ends are character boundaries.
        Ok(self.s.get(start..end))
    }
    /// A number's text.
    #[inline]
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
        Ok(&self.s[start..self.i])
    }
    /// A timestamp (seconds, an optional fraction) as nanoseconds, in one pass: what
    /// [`seconds_to_ns`] of [`number`](Self::number)'s text answers, with the same errors (no
    /// number: `Syntax`; a number that is not whole seconds with an optional fraction, or too
    /// large: `Timestamp`).
    #[inline]
    fn timestamp(&mut self) -> Result<u64, LineError> {
        let in_number = |c: &u8| matches!(c, b'0'..=b'9' | b'.' | b'-' | b'+' | b'e' | b'E');
        self.ws();
        let b = self.s.as_bytes();
        let start = self.i;
        let mut seconds = Some(0u64);
        while let Some(&d) = b.get(self.i).filter(|d| d.is_ascii_digit()) {
            seconds = seconds.and_then(|s| s.checked_mul(10)?.checked_add(u64::from(d - b'0')));
            self.i += 1;
        }
        let whole = self.i - start;
        let mut ns = Some(0);
        if b.get(self.i) == Some(&b'.') {
            self.i += 1;
            let digits = self.i;
            while b.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            ns = fraction_ns(&b[digits..self.i]);
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
    #[inline]
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
            found.push((name, value));
            if self.eat(b'}') {
                return Ok(Some(()));
            }
            if !self.eat(b',') {
                return Err(LineError::Syntax);
            }
        }
    }
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
                b"cost" => cost = c.number()?.parse().map_err(|_| LineError::Cost)?,
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
    // Fewer than 9 digits: scale up (".125" is 125 000 000 ns).
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
    Some(ns * SCALE[digits.len().min(9)])
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
