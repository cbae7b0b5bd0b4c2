use std::net::IpAddr;
use std::sync::Arc;

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use super::forwarded::{self, Hop, X_FORWARDED_FOR};
use super::ip::{self, DEFAULT_IPV6_PREFIX, canonical, canonical_nets, peer};
use super::{Key, KeyError, KeyExtractor};
use crate::error::ConfigError;
use crate::request::RequestHead;

/// The client's IP address: the connection's peer, or, behind proxies you
/// trust, the client they forwarded, and no one else's word.
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (feature
/// `axum`; serve with `into_make_service_with_connect_info::<SocketAddr>()`),
/// tonic's `TcpConnectInfo` (feature `tonic`), or a `SocketAddr` in the
/// request's extensions (for plain hyper services that put it there). A
/// server that provides none is misconfigured
/// ([`KeyError::Misconfigured`], 500 by default).
///
/// - `ClientIp::new()` trusts no proxy: the peer is the client, and no
///   header is read. Behind a proxy or load balancer the peer is the proxy,
///   and every client would share its budget: [trust](Self::trust) the
///   proxy.
/// - When the peer is **not** a trusted proxy, the peer is the client and
///   no header is read: a client cannot pick its own key by sending
///   `X-Forwarded-For`.
/// - When it is, the configured [`header`](Self::header) is walked from the right
///   (the hop nearest to this server), skipping trusted proxies; the first
///   untrusted address is the client. Entries left of it were written by the
///   client and are never read.
/// - A malformed, `unknown` or obfuscated entry where the client should be,
///   or more than [`max_hops`](Self::max_hops) trusted hops, is
///   [`KeyError::Invalid`] (400 by default): never a key the client chose.
///   When every hop is trusted, the farthest one is the client.
///
/// Addresses are canonical before anything else: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`) and
/// IPv4-compatible (`::a.b.c.d`) IPv6 addresses are their IPv4 address, in
/// whatever notation they arrive. The client, once found, is keyed by its
/// IPv4 address, or an IPv6 client by its /64
/// ([configurable](Self::ipv6_prefix)), since one client usually holds a
/// whole /64.
///
/// ```
/// use tower_pinned_window::key::{ClientIp, Key};
///
/// // No proxy: the peer is the client.
/// let peer = ClientIp::new().ipv6_prefix(48);
/// assert_eq!(peer.key_for("::ffff:203.0.113.7".parse().unwrap()), Key::new("203.0.113.7"));
/// assert_eq!(peer.key_for("2001:db8:1:2::9".parse().unwrap()), Key::new("2001:db8:1::/48"));
/// ```
///
/// Behind a load balancer:
///
/// ```
/// use tower_pinned_window::key::ClientIp;
/// use http::HeaderMap;
///
/// // X-Forwarded-For is the default header.
/// let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2".parse().unwrap());
/// // The load balancer at 10.0.0.1 forwarded it: 10.0.0.2 is trusted too,
/// // 203.0.113.7 is the client; 6.6.6.6 is what the client wrote.
/// let ip = client_ip.client_ip("10.0.0.1".parse().unwrap(), &headers).unwrap();
/// assert_eq!(ip, "203.0.113.7".parse::<std::net::IpAddr>().unwrap());
/// // From an untrusted peer the header is ignored.
/// let ip = client_ip.client_ip("198.51.100.1".parse().unwrap(), &headers).unwrap();
/// assert_eq!(ip, "198.51.100.1".parse::<std::net::IpAddr>().unwrap());
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientIp {
    /// The trusted proxies' networks; `None` while none is trusted, so a
    /// clone of the peer's extractor (axum clones a route's service for
    /// each request) takes no count on a shared reference.
    trusted: Option<Arc<[IpNet]>>,
    /// The header trusted proxies record the client in.
    header: HeaderName,
    /// The prefix IPv6 clients are grouped by.
    ipv6_prefix: u8,
    max_hops: usize,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            trusted: None,
            header: X_FORWARDED_FOR,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            max_hops: 16,
        }
    }
}

impl ClientIp {
    /// Key by the peer address, trusting no proxy until one is
    /// [trusted](Self::trust); IPv6 clients grouped by /64 (example:
    /// [`ClientIp`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the proxies in `cidr` (`10.0.0.0/8`, `2001:db8::/32`, or one
    /// address).
    ///
    /// # Errors
    /// [`ConfigError::InvalidCidr`] when `cidr` is neither.
    pub fn trust(self, cidr: &str) -> Result<Self, ConfigError> {
        Ok(self.trust_net(parse_net(cidr)?))
    }

    /// Trust the proxies in `net`.
    fn trust_net(mut self, net: IpNet) -> Self {
        let mut trusted = self.trusted.as_deref().unwrap_or_default().to_vec();
        trusted.extend(canonical_nets(net));
        self.trusted = Some(trusted.into());
        self
    }

    /// Trust loopback proxies (`127.0.0.0/8`, `::1`): a proxy on this host
    /// (example: [`header`](Self::header)).
    pub fn trust_loopback(self) -> Self {
        self.trust_nets(&["127.0.0.0/8", "::1/128"])
    }

    /// Trust proxies in private ranges (`10.0.0.0/8`, `172.16.0.0/12`,
    /// `192.168.0.0/16`, `fc00::/7`): a load balancer in your network.
    ///
    /// ```
    /// use http::HeaderMap;
    /// use http::HeaderName;
    /// use tower_pinned_window::key::ClientIp;
    ///
    /// let client_ip = ClientIp::new()
    ///     .trust_private()
    ///     .trust("198.51.100.0/24") // a CDN's range
    ///     .unwrap()
    ///     .header(HeaderName::from_static("x-real-ip"));
    /// let mut headers = HeaderMap::new();
    /// headers.insert("x-real-ip", "203.0.113.7".parse().unwrap());
    /// for proxy in ["192.168.1.2", "198.51.100.9"] {
    ///     let ip = client_ip.client_ip(proxy.parse().unwrap(), &headers).unwrap();
    ///     assert_eq!(ip, "203.0.113.7".parse::<std::net::IpAddr>().unwrap());
    /// }
    /// ```
    pub fn trust_private(self) -> Self {
        self.trust_nets(&["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])
    }

    fn trust_nets(self, nets: &[&str]) -> Self {
        nets.iter().fold(self, |this, net| {
            this.trust_net(net.parse().expect("the presets are valid CIDRs"))
        })
    }

    /// The header trusted proxies record the client in. Name the one your
    /// proxy **sets or appends to**: a header the proxy passes through
    /// untouched is written by the client.
    ///
    /// - `x-forwarded-for` (the default): `client, proxy1, proxy2`, as
    ///   nginx, HAProxy and most load balancers append to it.
    /// - [`FORWARDED`](http::header::FORWARDED): RFC 7239,
    ///   `for=client, for="[2001:db8::1]:4711"`.
    /// - Any other name holds one address that the proxy overwrites:
    ///   `x-real-ip`, or a CDN's own (`cf-connecting-ip`,
    ///   `true-client-ip`, `fly-client-ip`). A list, or the header twice, is
    ///   [`KeyError::Invalid`].
    ///
    /// A header that never arrives leaves the nearest trusted proxy as the
    /// client, so every client would share its budget: a name is not
    /// checked against your proxy's, so check it with a request through it.
    ///
    /// ```
    /// use http::{HeaderMap, header::FORWARDED};
    /// use tower_pinned_window::key::ClientIp;
    ///
    /// let client_ip = ClientIp::new().trust_loopback().header(FORWARDED);
    /// let mut headers = HeaderMap::new();
    /// headers.insert("forwarded", "for=\"[2001:db8::1]:4711\"".parse().unwrap());
    /// let ip = client_ip.client_ip("127.0.0.1".parse().unwrap(), &headers).unwrap();
    /// assert_eq!(ip, "2001:db8::1".parse::<std::net::IpAddr>().unwrap());
    /// ```
    pub fn header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }

    /// Group IPv6 clients by a prefix of `bits` (default 64; example:
    /// [`ClientIp`]).
    ///
    /// # Panics
    /// When `bits` is outside 32..=128, like
    /// [`http::HeaderValue::from_static`] on a bad literal. Use
    /// [`try_ipv6_prefix`](Self::try_ipv6_prefix) for a value read at run
    /// time.
    #[track_caller]
    pub fn ipv6_prefix(self, bits: u8) -> Self {
        match self.try_ipv6_prefix(bits) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`ipv6_prefix`](Self::ipv6_prefix), for a value read at run
    /// time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidIpv6Prefix`] outside 32..=128.
    pub fn try_ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = ip::ipv6_prefix(bits)?;
        Ok(self)
    }

    /// The most forwarded hops walked (default 16); a request with more
    /// trusted hops than that is rejected ([`KeyError::Invalid`]).
    ///
    /// # Panics
    /// When `hops` is zero (no client could ever be found), like
    /// [`http::HeaderValue::from_static`] on a bad literal. Use
    /// [`try_max_hops`](Self::try_max_hops) for a value read at run time.
    #[track_caller]
    pub fn max_hops(self, hops: usize) -> Self {
        match self.try_max_hops(hops) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`max_hops`](Self::max_hops), for a value read at run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroHops`] for zero.
    pub fn try_max_hops(mut self, hops: usize) -> Result<Self, ConfigError> {
        if hops == 0 {
            return Err(ConfigError::ZeroHops);
        }
        self.max_hops = hops;
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted
            .as_deref()
            .is_some_and(|nets| nets.iter().any(|net| net.contains(&ip)))
    }

    /// The client's address for a request from `peer` with `headers`.
    ///
    /// # Errors
    /// [`KeyError::Invalid`] for a malformed entry where the client should
    /// be, or too many hops.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, KeyError> {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        if self.header == X_FORWARDED_FOR {
            self.walk(peer, forwarded::x_forwarded_for(headers))
        } else if self.header == FORWARDED {
            self.walk(peer, forwarded::forwarded(headers))
        } else {
            self.walk(peer, forwarded::one_address(headers, &self.header))
        }
    }

    /// Walks `hops` (nearest first) from the trusted `peer` to the first
    /// untrusted address.
    fn walk(&self, peer: IpAddr, hops: impl IntoIterator<Item = Hop>) -> Result<IpAddr, KeyError> {
        let mut farthest_trusted = peer;
        for (walked, hop) in hops.into_iter().enumerate() {
            if walked >= self.max_hops {
                return Err(KeyError::Invalid("more forwarded hops than allowed"));
            }
            match hop {
                Hop::Ip(ip) => {
                    let ip = canonical(ip);
                    if !self.is_trusted(ip) {
                        return Ok(ip);
                    }
                    farthest_trusted = ip;
                }
                Hop::Opaque => return Err(KeyError::Invalid("malformed forwarded address")),
            }
        }
        Ok(farthest_trusted)
    }

    /// The key for `ip`: the canonical IPv4 address, or the IPv6 network of
    /// the configured prefix (`2001:db8:1:2::/64`; example: [`ClientIp`]).
    pub fn key_for(&self, ip: IpAddr) -> Key {
        ip::key_for(ip, self.ipv6_prefix)
    }
}

/// `cidr` as a network: a CIDR, or one address.
pub(super) fn parse_net(cidr: &str) -> Result<IpNet, ConfigError> {
    cidr.parse::<IpNet>()
        .or_else(|_| cidr.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| ConfigError::InvalidCidr(cidr.to_string()))
}

impl KeyExtractor for ClientIp {
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        let peer = peer(request)?;
        // Trusting no proxy, the peer is the client: nothing to walk.
        if self.trusted.is_none() {
            return Ok(self.key_for(peer));
        }
        let ip = self.client_ip(peer, request.headers())?;
        Ok(self.key_for(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_client_is_the_first_untrusted_hop_from_the_right() {
        let lb = ClientIp::new().trust("10.0.0.0/8").unwrap();
        let fwd = lb.clone().header(FORWARDED);
        let real = lb.clone().header(HeaderName::from_static("x-real-ip"));
        let cdn = lb
            .clone()
            .header(HeaderName::from_static("cf-connecting-ip"));
        type Case<'a> = (
            &'a str,
            &'a ClientIp,
            &'a str,
            Vec<(&'static str, &'a str)>,
            Result<&'a str, KeyError>,
        );
        let invalid = |what| Err(KeyError::Invalid(what));
        let cases: Vec<Case> = vec![
            (
                "untrusted peer: header ignored",
                &lb,
                "198.51.100.9",
                vec![("x-forwarded-for", "1.2.3.4")],
                Ok("198.51.100.9"),
            ),
            (
                "untrusted peer: garbage ignored",
                &lb,
                "198.51.100.9",
                vec![("x-forwarded-for", "garbage")],
                Ok("198.51.100.9"),
            ),
            (
                "trusted peer, one hop",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "spoofed left entries ignored",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "6.6.6.6, 203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "trusted hops skipped",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7, 10.9.9.9, 10.0.0.2")],
                Ok("203.0.113.7"),
            ),
            (
                "client garbage left of the client",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "<script>, 203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "malformed where the client is",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7, bogus")],
                invalid("malformed forwarded address"),
            ),
            (
                "empty header",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "")],
                invalid("malformed forwarded address"),
            ),
            (
                "no header: the proxy itself",
                &lb,
                "10.0.0.1",
                vec![],
                Ok("10.0.0.1"),
            ),
            (
                "all hops trusted: the farthest",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "10.1.1.1, 10.2.2.2")],
                Ok("10.1.1.1"),
            ),
            (
                "mapped trusted peer",
                &lb,
                "::ffff:10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "mapped client",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "::ffff:203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "mapped trusted hop skipped",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7, ::ffff:10.0.0.3")],
                Ok("203.0.113.7"),
            ),
            (
                "v6 client with port",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "[2001:db8::7]:5555")],
                Ok("2001:db8::7"),
            ),
            (
                "trailing comma",
                &lb,
                "10.0.0.1",
                vec![("x-forwarded-for", "203.0.113.7, 10.0.0.5, ")],
                invalid("malformed forwarded address"),
            ),
            (
                "two lines",
                &lb,
                "10.0.0.1",
                vec![
                    ("x-forwarded-for", "6.6.6.6"),
                    ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                ],
                Ok("203.0.113.7"),
            ),
            (
                "forwarded",
                &fwd,
                "10.0.0.1",
                vec![(
                    "forwarded",
                    "for=6.6.6.6, for=\"[2001:db8::7]:80\";proto=https",
                )],
                Ok("2001:db8::7"),
            ),
            (
                "forwarded unknown",
                &fwd,
                "10.0.0.1",
                vec![("forwarded", "for=unknown")],
                invalid("malformed forwarded address"),
            ),
            (
                "forwarded ignores xff",
                &fwd,
                "10.0.0.1",
                vec![("x-forwarded-for", "1.2.3.4")],
                Ok("10.0.0.1"),
            ),
            (
                "x-real-ip",
                &real,
                "10.0.0.1",
                vec![("x-real-ip", "203.0.113.7")],
                Ok("203.0.113.7"),
            ),
            (
                "x-real-ip repeated",
                &real,
                "10.0.0.1",
                vec![("x-real-ip", "1.1.1.1"), ("x-real-ip", "2.2.2.2")],
                invalid("malformed forwarded address"),
            ),
            (
                "a CDN's header: one address",
                &cdn,
                "10.0.0.1",
                vec![
                    ("cf-connecting-ip", "2001:db8::7"),
                    ("x-forwarded-for", "6.6.6.6"),
                ],
                Ok("2001:db8::7"),
            ),
            (
                "a CDN's header holds no list",
                &cdn,
                "10.0.0.1",
                vec![("cf-connecting-ip", "6.6.6.6, 203.0.113.7")],
                invalid("malformed forwarded address"),
            ),
            (
                "a CDN's header absent: the proxy itself",
                &cdn,
                "10.0.0.1",
                vec![("x-real-ip", "203.0.113.7")],
                Ok("10.0.0.1"),
            ),
            (
                "xff ignores x-real-ip",
                &lb,
                "10.0.0.1",
                vec![("x-real-ip", "1.2.3.4")],
                Ok("10.0.0.1"),
            ),
        ];
        for (name, extractor, peer, pairs, want) in cases {
            let got = extractor.client_ip(ip(peer), &headers(&pairs));
            assert_eq!(got, want.map(ip), "{name}");
        }
        let many = format!("203.0.113.7{}", ", 10.0.0.5".repeat(40));
        assert_eq!(
            lb.client_ip(ip("10.0.0.1"), &headers(&[("x-forwarded-for", &many)])),
            Err(KeyError::Invalid("more forwarded hops than allowed")),
            "hop limit"
        );
    }

    #[test]
    fn cidrs_are_checked() {
        assert!(ClientIp::new().trust("10.0.0.0/8").is_ok());
        assert!(ClientIp::new().trust("2001:db8::/32").is_ok());
        assert!(ClientIp::new().trust("127.0.0.1").is_ok());
        for bad in ["10.0.0.0/33", "nope", "", "10.0.0.0/"] {
            assert_eq!(
                ClientIp::new().trust(bad).unwrap_err(),
                ConfigError::InvalidCidr(bad.into()),
                "{bad}"
            );
        }
        // A mapped-IPv6 CIDR trusts the IPv4 addresses it covers.
        let mapped = ClientIp::new().trust("::ffff:10.0.0.0/104").unwrap();
        assert!(mapped.is_trusted(ip("10.1.2.3")));
        let presets = ClientIp::new().trust_loopback().trust_private();
        for trusted in [
            "127.0.0.1",
            "::1",
            "10.1.1.1",
            "172.20.0.1",
            "192.168.1.1",
            "fd00::1",
        ] {
            assert!(presets.is_trusted(ip(trusted)), "{trusted}");
        }
        for untrusted in ["8.8.8.8", "172.32.0.1", "2001:db8::1"] {
            assert!(!presets.is_trusted(ip(untrusted)), "{untrusted}");
        }
    }

    #[test]
    fn the_hop_limit_is_at_least_one_and_never_changed() {
        let one = ClientIp::new().trust("10.0.0.0/8").unwrap().max_hops(1);
        let xff = |value: &str| headers(&[("x-forwarded-for", value)]);
        assert_eq!(
            one.client_ip(ip("10.0.0.1"), &xff("203.0.113.7")),
            Ok(ip("203.0.113.7")),
            "one hop is walked"
        );
        assert_eq!(
            one.client_ip(ip("10.0.0.1"), &xff("203.0.113.7, 10.0.0.2")),
            Err(KeyError::Invalid("more forwarded hops than allowed")),
            "a second is not"
        );
        assert_eq!(
            ClientIp::new().try_max_hops(0).unwrap_err(),
            ConfigError::ZeroHops
        );
        assert!(ClientIp::new().try_max_hops(1).is_ok());
    }

    #[test]
    #[should_panic(expected = "the proxy-hop limit must be at least 1")]
    fn zero_hops_panics() {
        let _ = ClientIp::new().max_hops(0);
    }

    #[test]
    #[should_panic(expected = "an IPv6 grouping prefix must be 32 to 128 bits, not 16")]
    fn a_bad_literal_prefix_panics() {
        let _ = ClientIp::new().ipv6_prefix(16);
    }

    #[test]
    fn keys_group_ipv6_and_unmap_ipv4() {
        let cases = [
            ("v4", "203.0.113.7", 64, "203.0.113.7"),
            ("mapped v4", "::ffff:203.0.113.7", 64, "203.0.113.7"),
            ("v6 /64", "2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"),
            (
                "rotating in one /64",
                "2001:db8:1:2:ffff:ffff:ffff:ffff",
                64,
                "2001:db8:1:2::/64",
            ),
            ("v6 /48", "2001:db8:1:2::1", 48, "2001:db8:1::/48"),
            ("v6 /32", "2001:db8:1:2::1", 32, "2001:db8::/32"),
            ("v6 /128", "2001:db8::1", 128, "2001:db8::1/128"),
        ];
        for (name, input, prefix, want) in cases {
            let peer = ClientIp::new().ipv6_prefix(prefix);
            assert_eq!(peer.key_for(ip(input)), Key::new(want), "{name}");
        }
    }

    #[test]
    fn prefixes_outside_32_to_128_are_errors() {
        for bits in [0, 31, 129, 255] {
            assert_eq!(
                ClientIp::new().try_ipv6_prefix(bits).unwrap_err(),
                ConfigError::InvalidIpv6Prefix(bits),
                "{bits}"
            );
        }
        for bits in [32, 64, 128] {
            assert!(ClientIp::new().try_ipv6_prefix(bits).is_ok(), "{bits}");
        }
    }

    #[test]
    #[should_panic(expected = "an IPv6 grouping prefix must be 32 to 128 bits, not 129")]
    fn a_bad_literal_prefix_above_128_panics() {
        let _ = ClientIp::new().ipv6_prefix(129);
    }

    #[test]
    fn without_a_peer_address_the_server_is_misconfigured() {
        let req = http::Request::get("/").body(()).unwrap();
        assert!(matches!(
            ClientIp::new().extract(&RequestHead::new(&req)),
            Err(KeyError::Misconfigured(_))
        ));
        let mut req = http::Request::get("/").body(()).unwrap();
        req.extensions_mut().insert(
            "[::ffff:198.51.100.1]:443"
                .parse::<std::net::SocketAddr>()
                .unwrap(),
        );
        assert_eq!(
            ClientIp::new().extract(&RequestHead::new(&req)),
            Ok(Key::new("198.51.100.1"))
        );
    }

    #[test]
    fn trusting_no_proxy_the_peer_is_the_client_whatever_the_headers() {
        let mut req = http::Request::get("/")
            .header("x-forwarded-for", "203.0.113.7")
            .header("forwarded", "for=203.0.113.7")
            .header("x-real-ip", "203.0.113.7")
            .body(())
            .unwrap();
        req.extensions_mut().insert(
            "[2001:db8:1:2::9]:443"
                .parse::<std::net::SocketAddr>()
                .unwrap(),
        );
        for header in [
            X_FORWARDED_FOR,
            FORWARDED,
            HeaderName::from_static("x-real-ip"),
            HeaderName::from_static("cf-connecting-ip"),
        ] {
            assert_eq!(
                ClientIp::new()
                    .header(header.clone())
                    .extract(&RequestHead::new(&req)),
                Ok(Key::new("2001:db8:1:2::/64")),
                "{header:?}"
            );
        }
    }

    #[test]
    fn the_client_is_keyed_with_the_configured_prefix() {
        let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap().ipv6_prefix(48);
        let mut req = http::Request::get("/")
            .header("x-forwarded-for", "2001:db8:1:2::9")
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert("10.0.0.1:443".parse::<std::net::SocketAddr>().unwrap());
        assert_eq!(
            client_ip.extract(&RequestHead::new(&req)),
            Ok(Key::new("2001:db8:1::/48"))
        );
        assert_eq!(
            ClientIp::new().try_ipv6_prefix(200).unwrap_err(),
            ConfigError::InvalidIpv6Prefix(200)
        );
    }
}
