//! Reading the client address out of `X-Forwarded-For` and `Forwarded` (RFC 7239), right to left.
//!
//! Only the right end of these headers is trustworthy: each proxy appends the address it received the
//! request from, and everything to the left of the first untrusted hop was written by the client. So
//! both parsers walk from the right and never look further left than they must; a client's garbage in
//! the left part is never even read. Neither allocates.

use std::net::{IpAddr, SocketAddr};

/// One hop of a forwarding chain, as written by the proxy that received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// A usable address.
    Ip(IpAddr),
    /// `unknown`, an obfuscated identifier (`_hidden`), or something that does not parse.
    Opaque,
}

/// The hops of every `X-Forwarded-For` line, right-most first (later lines come after earlier ones,
/// as if joined with commas, RFC 9110 §5.3).
pub(crate) fn x_forwarded_for_rev<'a>(
    values: impl DoubleEndedIterator<Item = &'a http::HeaderValue>,
) -> impl Iterator<Item = Hop> {
    values
        .rev()
        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
        .map(|entry| parse_node(trim(entry)))
        .filter(|node| *node != Node::Empty)
        .map(Hop::from)
}

/// The `for=` hops of every `Forwarded` line, right-most first. An element without `for=` is opaque.
pub(crate) fn forwarded_rev<'a>(
    values: impl DoubleEndedIterator<Item = &'a http::HeaderValue>,
) -> impl Iterator<Item = Hop> {
    values
        .rev()
        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
        .map(|element| {
            let element = trim(element);
            if element.is_empty() {
                return Node::Empty;
            }
            element
                .split(|&b| b == b';')
                .find_map(|pair| {
                    let pair = trim(pair);
                    let eq = pair.iter().position(|&b| b == b'=')?;
                    let (name, value) = (trim(&pair[..eq]), trim(&pair[eq + 1..]));
                    name.eq_ignore_ascii_case(b"for")
                        .then(|| parse_node(unquote(value)))
                })
                .unwrap_or(Node::Opaque)
        })
        .filter(|node| *node != Node::Empty)
        .map(Hop::from)
}

/// A parsed list element, before empty elements are dropped (`a,,b` is legal list syntax).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Ip(IpAddr),
    Opaque,
    Empty,
}

impl From<Node> for Hop {
    fn from(node: Node) -> Hop {
        match node {
            Node::Ip(ip) => Hop::Ip(ip),
            Node::Opaque | Node::Empty => Hop::Opaque,
        }
    }
}

/// Parses `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_node(node: &[u8]) -> Node {
    if node.is_empty() {
        return Node::Empty;
    }
    let Ok(text) = std::str::from_utf8(node) else {
        return Node::Opaque;
    };
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Node::Ip(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Node::Ip(addr.ip());
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        if let Ok(ip) = inner.parse::<std::net::Ipv6Addr>() {
            return Node::Ip(IpAddr::V6(ip));
        }
    }
    Node::Opaque
}

fn unquote(value: &[u8]) -> &[u8] {
    match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> Hop {
        Hop::Ip(s.parse().unwrap())
    }

    #[test]
    fn xff_is_read_right_to_left_across_lines() {
        let a = HeaderValue::from_static("1.1.1.1, garbage ,2.2.2.2");
        let b = HeaderValue::from_static("3.3.3.3:8080,[2001:db8::1]:443, ,");
        let hops: Vec<Hop> = x_forwarded_for_rev([&a, &b].into_iter()).collect();
        assert_eq!(
            hops,
            vec![
                ip("2001:db8::1"),
                ip("3.3.3.3"),
                ip("2.2.2.2"),
                Hop::Opaque,
                ip("1.1.1.1")
            ]
        );
    }

    #[test]
    fn forwarded_takes_the_for_parameter_case_insensitively() {
        let a = HeaderValue::from_static(
            r#"for=192.0.2.43, For="[2001:db8:cafe::17]:4711";proto=https, by=10.0.0.1, for=unknown, for=_hidden"#,
        );
        let hops: Vec<Hop> = forwarded_rev([&a].into_iter()).collect();
        assert_eq!(
            hops,
            vec![
                Hop::Opaque,
                Hop::Opaque,
                Hop::Opaque,
                ip("2001:db8:cafe::17"),
                ip("192.0.2.43")
            ]
        );
    }

    #[test]
    fn non_utf8_and_empty_values_do_not_panic() {
        let a = HeaderValue::from_bytes(b"\xff\xfe, 9.9.9.9").unwrap();
        let e = HeaderValue::from_static("");
        let hops: Vec<Hop> = x_forwarded_for_rev([&e, &a].into_iter()).collect();
        assert_eq!(hops, vec![ip("9.9.9.9"), Hop::Opaque]);
        let hops: Vec<Hop> = forwarded_rev([&e].into_iter()).collect();
        assert!(hops.is_empty());
    }
}
