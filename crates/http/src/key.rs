//! Which bucket a request is charged to: the key extractors.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};
use ipnet::IpNet;

use crate::forwarded::{self, Hop};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A borrowed view of a request's head: what key extractors and cost functions get to read.
///
/// It holds references only (building one is free), and it does not depend on the body type, so one
/// extractor or closure serves every body type a stack uses.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The request target.
    pub uri: &'a Uri,
    /// The HTTP version.
    pub version: Version,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The extensions (where the connection's peer address lives).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// A view of `request`'s head.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The connection's peer address: axum's `ConnectInfo<SocketAddr>` extension (with the `axum`
    /// feature), else a plain [`SocketAddr`] extension (what a hyper server inserts per connection).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(*addr);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

/// Why no key could be extracted from a request. What happens then is the layer's
/// [`MissingKey`](crate::MissingKey) policy, never a panic or a surprise 500.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// No peer address in the request's extensions: the server was not set up to record it (axum:
    /// serve with `into_make_service_with_connect_info::<SocketAddr>()`).
    NoPeerAddr,
    /// The header the key is read from is absent or empty.
    MissingHeader,
    /// Behind trusted proxies, the first untrusted hop of the forwarding header is not an address
    /// (`unknown`, an obfuscated name, or garbage written by a misbehaving proxy).
    UnidentifiedClient,
    /// A custom extractor found nothing.
    Custom,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::NoPeerAddr => "the request carries no peer address",
            KeyError::MissingHeader => "the rate-limit key header is absent or empty",
            KeyError::UnidentifiedClient => {
                "the forwarding header's first untrusted hop is not an address"
            }
            KeyError::Custom => "the custom key extractor found no key",
        })
    }
}

impl std::error::Error for KeyError {}

/// Maps a request to the key its quota is counted under.
///
/// Implementations must be cheap: they run on every request, before the limiter. The built-in ones
/// do not allocate.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key type (what the keyed limiter is indexed by).
    type Key: Send + Sync + 'static;

    /// The key for `request`, or why there is none.
    ///
    /// # Errors
    /// A [`KeyError`] when the request does not carry what this extractor reads.
    fn extract(&self, request: &RequestHead<'_>) -> Result<Self::Key, KeyError>;
}

/// One key for every request: a global limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ();

    #[inline]
    fn extract(&self, _: &RequestHead<'_>) -> Result<(), KeyError> {
        Ok(())
    }
}

/// How addresses are grouped into keys: IPv4-mapped IPv6 addresses become IPv4, and IPv6 addresses may
/// be cut to a prefix (a /64 is what one subscriber usually gets, so keying on whole addresses lets
/// one client rotate through 2^64 keys).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpGrouping {
    v6_prefix: Option<u8>,
}

impl IpGrouping {
    /// Whole addresses.
    pub const fn exact() -> Self {
        IpGrouping { v6_prefix: None }
    }

    /// IPv6 addresses cut to their first `prefix` bits (clamped to 128); IPv4 addresses whole.
    pub const fn ipv6_prefix(prefix: u8) -> Self {
        IpGrouping {
            v6_prefix: Some(if prefix > 128 { 128 } else { prefix }),
        }
    }

    /// The key for `ip`.
    #[inline]
    pub fn group(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V6(v6) => match self.v6_prefix {
                Some(prefix) => {
                    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                    IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
                }
                None => IpAddr::V6(v6),
            },
            v4 => v4,
        }
    }
}

/// The connection's peer address (see [`RequestHead::peer_addr`]). Correct only when clients
/// connect directly; behind a proxy every request would share the proxy's key — use [`ClientIp`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerIp {
    grouping: IpGrouping,
}

impl PeerIp {
    /// Keys on whole peer addresses.
    pub fn new() -> Self {
        PeerIp::default()
    }

    /// Groups addresses as `grouping` says (e.g. IPv6 /64).
    pub fn grouping(mut self, grouping: IpGrouping) -> Self {
        self.grouping = grouping;
        self
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    #[inline]
    fn extract(&self, request: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let peer = request.peer_addr().ok_or(KeyError::NoPeerAddr)?;
        Ok(self.grouping.group(peer.ip()))
    }
}

/// Which forwarding header the trusted proxies write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// The client's address behind a chain of trusted proxies.
///
/// If the peer is not a trusted proxy, the key is the peer itself and forwarding headers are
/// ignored (a client cannot spoof them). If it is, the key is the right-most address in the configured
/// forwarding header that is not itself a trusted proxy: the address the outermost trusted proxy
/// saw. Everything left of it was written by the client and is never read. Only the one configured
/// header is read: a proxy that sets `X-Forwarded-For` does not strip a client's `Forwarded`.
///
/// ```
/// use tollgate_http::{ClientIp, ForwardedHeader, IpGrouping};
/// let key = ClientIp::trusting(["10.0.0.0/8".parse()?, "::1/128".parse()?])
///     .header(ForwardedHeader::XForwardedFor)
///     .grouping(IpGrouping::ipv6_prefix(64));
/// # let _ = key;
/// # Ok::<(), ipnet::AddrParseError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClientIp {
    trusted: Box<[IpNet]>,
    header: ForwardedHeader,
    grouping: IpGrouping,
}

impl ClientIp {
    /// Trusts forwarding headers only from peers in `proxies` (CIDR ranges).
    pub fn trusting(proxies: impl IntoIterator<Item = IpNet>) -> Self {
        ClientIp {
            trusted: proxies.into_iter().map(|net| net.trunc()).collect(),
            header: ForwardedHeader::default(),
            grouping: IpGrouping::default(),
        }
    }

    /// Reads `header` (default `X-Forwarded-For`).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups addresses as `grouping` says (e.g. IPv6 /64).
    pub fn grouping(mut self, grouping: IpGrouping) -> Self {
        self.grouping = grouping;
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address (grouped) of a request from `peer` with these `headers`: the same
    /// trusted-proxy walk as [`KeyExtractor::extract`], for integrations that hold the peer
    /// address and the header map rather than an `http::Request` (a Pingora filter).
    ///
    /// # Errors
    /// [`KeyError::UnidentifiedClient`] when a trusted hop names an obfuscated client.
    pub fn client_addr(&self, peer: IpAddr, headers: &http::HeaderMap) -> Result<IpAddr, KeyError> {
        self.client_of(peer, headers)
            .map(|ip| self.grouping.group(ip))
    }

    /// The client address, before grouping.
    fn client(&self, request: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let peer = request.peer_addr().ok_or(KeyError::NoPeerAddr)?.ip();
        self.client_of(peer, request.headers)
    }

    fn client_of(&self, peer: IpAddr, headers: &http::HeaderMap) -> Result<IpAddr, KeyError> {
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        match self.header {
            ForwardedHeader::XForwardedFor => {
                let values = headers.get_all(&X_FORWARDED_FOR);
                self.walk(peer, forwarded::x_forwarded_for_rev(values.iter()))
            }
            ForwardedHeader::Forwarded => {
                let values = headers.get_all(http::header::FORWARDED);
                self.walk(peer, forwarded::forwarded_rev(values.iter()))
            }
        }
    }

    /// The peer is a trusted proxy: walks its chain from the right. If every hop is trusted (a
    /// request from inside the proxy tier), the left-most one is the origin.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Hop>) -> Result<IpAddr, KeyError> {
        let mut origin = peer;
        for hop in hops {
            match hop {
                Hop::Ip(ip) if self.is_trusted(ip) => origin = ip,
                Hop::Ip(ip) => return Ok(ip),
                Hop::Opaque => return Err(KeyError::UnidentifiedClient),
            }
        }
        Ok(origin)
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;

    fn extract(&self, request: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        self.client(request).map(|ip| self.grouping.group(ip))
    }
}

/// A header's value (an API key, a tenant id). The key is the [`HeaderValue`] itself: cloning it
/// shares the request's buffer, so extraction does not allocate. Absent or empty headers (and, when
/// several lines are present, all but the first) are ignored.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys on the value of `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl KeyExtractor for HeaderKey {
    type Key = HeaderValue;

    #[inline]
    fn extract(&self, request: &RequestHead<'_>) -> Result<HeaderValue, KeyError> {
        match request.headers.get(&self.name) {
            Some(value) if !value.is_empty() => Ok(value.clone()),
            _ => Err(KeyError::MissingHeader),
        }
    }
}

/// A key computed by a closure; `None` means "no key" ([`KeyError::Custom`]).
///
/// ```
/// use tollgate_http::{KeyFn, RequestHead};
/// // One bucket per (tenant header, first path segment).
/// let key = KeyFn::new(|req: &RequestHead<'_>| {
///     let tenant = req.headers.get("x-tenant")?.to_str().ok()?.to_owned();
///     let section = req.uri.path().split('/').nth(1).unwrap_or("").to_owned();
///     Some((tenant, section))
/// });
/// # let _ = key;
/// ```
#[derive(Clone, Copy)]
pub struct KeyFn<F> {
    f: F,
}

impl<F> KeyFn<F> {
    /// Wraps `f`.
    pub fn new<K>(f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<K>,
    {
        KeyFn { f }
    }
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn").finish_non_exhaustive()
    }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    type Key = K;

    #[inline]
    fn extract(&self, request: &RequestHead<'_>) -> Result<K, KeyError> {
        (self.f)(request).ok_or(KeyError::Custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, headers: &[(&str, &str)]) -> http::Request<()> {
        let mut builder = http::Request::builder().uri("/x");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut req = builder.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn client_ip(extractor: &ClientIp, req: &http::Request<()>) -> Result<IpAddr, KeyError> {
        extractor.extract(&RequestHead::of(req))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_ignores_forwarding_headers() {
        let ex = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
        let req = request(
            "203.0.113.9:5000",
            &[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8")],
        );
        assert_eq!(client_ip(&ex, &req), Ok(ip("203.0.113.9")));
    }

    #[test]
    fn trusted_chain_yields_right_most_untrusted_hop() {
        let ex = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
        // The client spoofed "6.6.6.6"; the edge proxy 10.0.0.2 appended the real 198.51.100.7.
        let req = request(
            "10.0.0.1:80",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")],
        );
        assert_eq!(client_ip(&ex, &req), Ok(ip("198.51.100.7")));

        let fwd = ex.clone().header(ForwardedHeader::Forwarded);
        let req = request(
            "10.0.0.1:80",
            &[
                ("x-forwarded-for", "6.6.6.6"),
                (
                    "forwarded",
                    r#"for=6.6.6.6, for="[2001:db8::5]:1234", for=10.0.0.2"#,
                ),
            ],
        );
        assert_eq!(client_ip(&fwd, &req), Ok(ip("2001:db8::5")));
    }

    #[test]
    fn all_trusted_or_no_header_falls_back_to_the_origin() {
        let ex = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
        let req = request("10.0.0.1:80", &[("x-forwarded-for", "10.1.1.1, 10.0.0.2")]);
        assert_eq!(client_ip(&ex, &req), Ok(ip("10.1.1.1")));
        let req = request("10.0.0.1:80", &[]);
        assert_eq!(client_ip(&ex, &req), Ok(ip("10.0.0.1")));
    }

    #[test]
    fn opaque_first_untrusted_hop_is_a_key_error() {
        let ex =
            ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]).header(ForwardedHeader::Forwarded);
        let req = request("10.0.0.1:80", &[("forwarded", "for=1.2.3.4, for=unknown")]);
        assert_eq!(client_ip(&ex, &req), Err(KeyError::UnidentifiedClient));
    }

    #[test]
    fn ipv4_mapped_peers_match_ipv4_ranges() {
        let ex = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
        let req = request(
            "[::ffff:10.0.0.1]:80",
            &[("x-forwarded-for", "198.51.100.7")],
        );
        assert_eq!(client_ip(&ex, &req), Ok(ip("198.51.100.7")));
    }

    #[test]
    fn ipv6_prefix_grouping() {
        let g = IpGrouping::ipv6_prefix(64);
        assert_eq!(g.group(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(g.group(ip("192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(g.group(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(
            IpGrouping::ipv6_prefix(0).group(ip("2001:db8::1")),
            ip("::")
        );
        assert_eq!(
            IpGrouping::ipv6_prefix(200).group(ip("2001:db8::1")),
            ip("2001:db8::1")
        );
        let peer = PeerIp::new().grouping(g);
        let req = request("[2001:db8:1:2:3:4:5:6]:9", &[]);
        assert_eq!(
            peer.extract(&RequestHead::of(&req)),
            Ok(ip("2001:db8:1:2::"))
        );
    }

    #[test]
    fn missing_sources_are_errors() {
        let req = http::Request::builder().body(()).unwrap();
        let head = RequestHead::of(&req);
        assert_eq!(PeerIp::new().extract(&head), Err(KeyError::NoPeerAddr));
        let hk = HeaderKey::new(HeaderName::from_static("x-api-key"));
        assert_eq!(hk.extract(&head), Err(KeyError::MissingHeader));
        let req = http::Request::builder()
            .header("x-api-key", "")
            .body(())
            .unwrap();
        assert_eq!(
            hk.extract(&RequestHead::of(&req)),
            Err(KeyError::MissingHeader)
        );
        let req = http::Request::builder()
            .header("x-api-key", "k1")
            .body(())
            .unwrap();
        assert_eq!(
            hk.extract(&RequestHead::of(&req)),
            Ok(HeaderValue::from_static("k1"))
        );
    }
}
