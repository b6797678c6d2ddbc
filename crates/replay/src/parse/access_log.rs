//! The access-log formats: nginx `combined` and Envoy's default text format, each read into a
//! request through the field mapping the [parent module](super) states.

use smallvec::SmallVec;

use super::{LineError, LoggedRequest, fraction_ns};

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

pub(super) fn parse_nginx(line: &str) -> Result<LoggedRequest<'_>, LineError> {
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
    Ok(LoggedRequest {
        ts_ns,
        descriptors,
        cost: 1,
    })
}

pub(super) fn parse_envoy(line: &str) -> Result<LoggedRequest<'_>, LineError> {
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
    Ok(LoggedRequest {
        ts_ns,
        descriptors,
        cost: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{pairs, parse};
    use super::super::{Format, LineError};

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
