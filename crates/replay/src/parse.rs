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

use std::fmt;

use smallvec::SmallVec;

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
pub struct Request<'a> {
    /// Nanoseconds since the log's epoch (Unix time for nginx and Envoy logs).
    pub ts_ns: u64,
    /// The request's descriptors.
    pub descriptors: SmallVec<[(&'a str, &'a str); 8]>,
    /// Units.
    pub cost: u64,
}

impl Default for Request<'_> {
    fn default() -> Self {
        Request {
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
) -> Result<Request<'a>, LineError> {
    let mut request = Request::default();
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
    request: &mut Request<'a>,
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
fn parse_json_fast<'a>(line: &'a str, request: &mut Request<'a>) -> Result<bool, LineError> {
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

fn parse_json_slow<'a>(line: &str, scratch: &'a mut Scratch) -> Result<Request<'a>, LineError> {
    let owned: OwnedLine = serde_json::from_str(line).map_err(|_| LineError::Syntax)?;
    let ts_ns = seconds_to_ns(&owned.ts.to_string()).ok_or(LineError::Timestamp)?;
    scratch.entries.clear();
    for (name, value) in owned.descriptors {
        let serde_json::Value::String(value) = value else {
            return Err(LineError::Descriptors);
        };
        scratch.entries.push((name, value));
    }
    Ok(Request {
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

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn unix_ns(
    year: i64,
    month: u32,
    day: u32,
    (h, m, s): (u32, u32, u32),
    frac_ns: u64,
    offset_s: i64,
) -> Option<u64> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let secs = days_from_civil(year, month, day) * 86_400
        + i64::from(h) * 3600
        + i64::from(m) * 60
        + i64::from(s)
        - offset_s;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac_ns)
}

fn num<T: std::str::FromStr>(s: &str) -> Option<T> {
    s.parse().ok()
}

/// nginx `$time_local`: `10/Oct/2000:13:55:36 -0700`.
fn nginx_time(t: &str) -> Option<u64> {
    let (date, zone) = t.split_once(' ')?;
    let mut parts = date.splitn(4, [':', '/']);
    let (d, mon, y) = (parts.next()?, parts.next()?, parts.next()?);
    let mut hms = parts.next()?.splitn(3, ':');
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == mon)?;
    let zone = zone.as_bytes();
    if zone.len() != 5 || !matches!(zone[0], b'+' | b'-') {
        return None;
    }
    let zh: i64 = num(std::str::from_utf8(&zone[1..3]).ok()?)?;
    let zm: i64 = num(std::str::from_utf8(&zone[3..5]).ok()?)?;
    let offset = (zh * 3600 + zm * 60) * if zone[0] == b'-' { -1 } else { 1 };
    unix_ns(
        num(y)?,
        u32::try_from(month + 1).ok()?,
        num(d)?,
        (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?),
        0,
        offset,
    )
}

/// Envoy `%START_TIME%`: `2016-04-15T20:17:00.310Z`.
fn envoy_time(t: &str) -> Option<u64> {
    let t = t.strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, mo, da) = (d.next()?, d.next()?, d.next()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut p = hms.splitn(3, ':');
    let frac_ns = fraction_ns(frac.as_bytes())?;
    unix_ns(
        num(y)?,
        num(mo)?,
        num(da)?,
        (num(p.next()?)?, num(p.next()?)?, num(p.next()?)?),
        frac_ns,
        0,
    )
}

/// The text up to `close`, and the rest after it.
fn until(s: &str, close: char) -> Option<(&str, &str)> {
    let end = s.find(close)?;
    Some((&s[..end], &s[end + close.len_utf8()..]))
}

/// `"GET /path?q HTTP/1.1"` as method and path without the query.
fn request_line(r: &str) -> Option<(&str, &str)> {
    let mut parts = r.split(' ');
    let method = parts.next().filter(|m| !m.is_empty())?;
    let target = parts.next()?;
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Some((method, path))
}

fn parse_nginx(line: &str) -> Result<Request<'_>, LineError> {
    let (addr, rest) = until(line, ' ').ok_or(LineError::Syntax)?;
    let rest = rest.strip_prefix("- ").ok_or(LineError::Syntax)?;
    let (user, rest) = until(rest, ' ').ok_or(LineError::Syntax)?;
    let rest = rest.strip_prefix('[').ok_or(LineError::Syntax)?;
    let (time, rest) = until(rest, ']').ok_or(LineError::Syntax)?;
    let ts_ns = nginx_time(time).ok_or(LineError::Timestamp)?;
    let rest = rest.strip_prefix(" \"").ok_or(LineError::Syntax)?;
    let (request, _) = until(rest, '"').ok_or(LineError::Syntax)?;
    let (method, path) = request_line(request).ok_or(LineError::Syntax)?;
    let mut descriptors = SmallVec::new();
    descriptors.push(("remote_address", addr));
    descriptors.push(("method", method));
    descriptors.push(("path", path));
    if user != "-" {
        descriptors.push(("user", user));
    }
    Ok(Request {
        ts_ns,
        descriptors,
        cost: 1,
    })
}

fn parse_envoy(line: &str) -> Result<Request<'_>, LineError> {
    let rest = line.strip_prefix('[').ok_or(LineError::Syntax)?;
    let (time, rest) = until(rest, ']').ok_or(LineError::Syntax)?;
    let ts_ns = envoy_time(time).ok_or(LineError::Timestamp)?;
    let rest = rest.strip_prefix(" \"").ok_or(LineError::Syntax)?;
    let (request, mut rest) = until(rest, '"').ok_or(LineError::Syntax)?;
    let (method, path) = request_line(request).ok_or(LineError::Syntax)?;
    // The quoted fields after the request: X-Forwarded-For, User-Agent, X-Request-Id, :authority.
    let mut quoted: SmallVec<[&str; 6]> = SmallVec::new();
    while let Some(open) = rest.find('"') {
        let (field, after) = until(&rest[open + 1..], '"').ok_or(LineError::Syntax)?;
        quoted.push(field);
        rest = after;
    }
    let mut descriptors = SmallVec::new();
    descriptors.push(("method", method));
    descriptors.push(("path", path));
    if let Some(xff) = quoted.first().filter(|x| **x != "-") {
        let first = xff.split(',').next().unwrap_or(xff).trim();
        descriptors.push(("remote_address", first));
    }
    if let Some(authority) = quoted.get(3).filter(|a| **a != "-") {
        descriptors.push(("authority", *authority));
    }
    Ok(Request {
        ts_ns,
        descriptors,
        cost: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = (u64, Vec<(String, String)>, u64);

    fn parse(format: Format, line: &str) -> Result<Parsed, LineError> {
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

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
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

    #[test]
    fn nginx_combined() {
        let line = r#"192.0.2.1 - alice [10/Oct/2000:13:55:36 -0700] "GET /api/x?y=1 HTTP/1.1" 200 2326 "-" "curl/8""#;
        // 2000-10-10T20:55:36Z
        assert_eq!(
            parse(Format::Nginx, line),
            Ok((
                971_211_336_000_000_000,
                pairs(&[
                    ("remote_address", "192.0.2.1"),
                    ("method", "GET"),
                    ("path", "/api/x"),
                    ("user", "alice")
                ]),
                1
            ))
        );
        assert_eq!(
            parse(Format::Nginx, "192.0.2.1 - - [bad] \"GET / HTTP/1.1\""),
            Err(LineError::Timestamp)
        );
    }

    #[test]
    fn envoy_default() {
        let line = r#"[2016-04-15T20:17:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28, 10.0.0.1" "nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80""#;
        assert_eq!(
            parse(Format::Envoy, line),
            Ok((
                1_460_751_420_310_000_000,
                pairs(&[
                    ("method", "POST"),
                    ("path", "/api/v1/locations"),
                    ("remote_address", "10.0.35.28"),
                    ("authority", "locations")
                ]),
                1
            ))
        );
    }
}
