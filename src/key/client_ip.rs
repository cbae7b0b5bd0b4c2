use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, Request};
use ipnet::IpNet;

use super::forwarded::{self, Hop};
use super::{Key, KeyError, KeyExtractor};
use crate::ConfigError;

/// Which header a trusted proxy records the client in. Pick the one your
/// proxy **sets or appends to**: a header the proxy passes through untouched
/// is written by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, most load
    /// balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`, one address that the proxy overwrites.
    XRealIp,
}

/// The client's IP address, read through proxies you trust and no others.
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (feature
/// `axum`), tonic's `TcpConnectInfo` (feature `tonic`), or a `SocketAddr` in
/// the request's extensions (for plain hyper services that put it there).
///
/// - When the peer is **not** a trusted proxy, the peer is the client and no
///   header is read: a client cannot pick its own key by sending
///   `X-Forwarded-For`.
/// - When it is, the configured [`ForwardedHeader`] is walked from the right
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
/// whatever notation they arrive. IPv6 clients are grouped by their /64
/// (configurable), since one client usually holds a whole /64.
///
/// ```
/// use tower_pinned_window::key::{ClientIp, ForwardedHeader};
/// use http::HeaderMap;
///
/// let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap().header(ForwardedHeader::XForwardedFor);
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
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
    max_hops: usize,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            trusted: Arc::new([]),
            header: ForwardedHeader::default(),
            ipv6_prefix: 64,
            max_hops: 16,
        }
    }
}

impl ClientIp {
    /// The peer address, trusting no proxy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust the proxies in `cidr` (`10.0.0.0/8`, `2001:db8::/32`, or one
    /// address).
    ///
    /// # Errors
    /// [`ConfigError::InvalidCidr`] when `cidr` is neither.
    pub fn trust(self, cidr: &str) -> Result<Self, ConfigError> {
        let net = cidr
            .parse::<IpNet>()
            .or_else(|_| cidr.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| ConfigError::InvalidCidr(cidr.to_string()))?;
        Ok(self.trust_net(net))
    }

    /// Trust the proxies in `net`.
    pub fn trust_net(mut self, net: IpNet) -> Self {
        let mut trusted = self.trusted.to_vec();
        trusted.push(canonical_net(net));
        self.trusted = trusted.into();
        self
    }

    /// Trust loopback proxies (`127.0.0.0/8`, `::1`): a proxy on this host.
    pub fn trust_loopback(self) -> Self {
        self.trust_nets(&["127.0.0.0/8", "::1/128"])
    }

    /// Trust proxies in private ranges (`10.0.0.0/8`, `172.16.0.0/12`,
    /// `192.168.0.0/16`, `fc00::/7`): a load balancer in your network.
    pub fn trust_private(self) -> Self {
        self.trust_nets(&["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])
    }

    fn trust_nets(self, nets: &[&str]) -> Self {
        nets.iter().fold(self, |this, net| {
            this.trust_net(net.parse().expect("the presets are valid CIDRs"))
        })
    }

    /// The header trusted proxies record the client in (default
    /// `X-Forwarded-For`).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Group IPv6 clients by a prefix of `bits` (32 to 128; default 64).
    ///
    /// # Errors
    /// [`ConfigError::InvalidIpv6Prefix`] outside 32..=128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        if !(32..=128).contains(&bits) {
            return Err(ConfigError::InvalidIpv6Prefix(bits));
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// The most hops walked before a request is rejected (default 16).
    pub fn max_hops(mut self, hops: usize) -> Self {
        self.max_hops = hops.max(1);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
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
        let hops: Box<dyn Iterator<Item = Hop> + '_> = match self.header {
            ForwardedHeader::XForwardedFor => Box::new(forwarded::x_forwarded_for(headers)),
            ForwardedHeader::Forwarded => Box::new(forwarded::forwarded(headers)),
            ForwardedHeader::XRealIp => Box::new(forwarded::x_real_ip(headers).into_iter()),
        };
        let mut farthest_trusted = peer;
        for (walked, hop) in hops.enumerate() {
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

    /// The key for `ip`: the IPv4 address, or the IPv6 prefix.
    pub fn key_for(&self, ip: IpAddr) -> Key {
        ip_key(ip, self.ipv6_prefix)
    }
}

impl<B> KeyExtractor<B> for ClientIp {
    fn extract(&self, request: &Request<B>) -> Result<Key, KeyError> {
        let peer = peer_addr(request).ok_or(KeyError::Misconfigured(
            "no peer address: serve axum with into_make_service_with_connect_info::<SocketAddr>(), \
             or use tonic's server, or insert a SocketAddr into the request's extensions",
        ))?;
        let ip = self.client_ip(peer.ip(), request.headers())?;
        Ok(self.key_for(ip))
    }
}

/// The connection's peer address, wherever the server put it.
fn peer_addr<B>(request: &Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr);
    }
    extensions.get::<SocketAddr>().copied()
}

/// IPv4 addresses carried in IPv6 (mapped, translated, compatible) as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let v4 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    match bits >> 32 {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        0xffff | 0xffff_0000 => Some(v4),
        // ::a.b.c.d (compatible), but not :: and ::1.
        0 if (bits >> 16) != 0 => Some(v4),
        _ => None,
    }
}

fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match embedded_v4(v6.network()) {
            Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net),
            None => net,
        },
        _ => net,
    }
}

/// `a.b.c.d`, written without the formatting machinery (this runs on every
/// request keyed by IP).
fn ipv4_key(ip: Ipv4Addr) -> Key {
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(octet).as_bytes();
        text[len..len + digits.len()].copy_from_slice(digits);
        len += digits.len();
    }
    Key::new(&text[..len])
}

/// The key for `ip`: canonical IPv4, or the IPv6 network of `prefix` bits.
pub(crate) fn ip_key(ip: IpAddr, prefix: u8) -> Key {
    match canonical(ip) {
        IpAddr::V4(v4) => ipv4_key(v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(prefix);
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            let network = Ipv6Addr::from(u128::from(v6) & mask);
            Key::display(format_args!("{network}/{bits}"))
        }
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
    fn canonical_forms_of_ipv4_in_ipv6() {
        let cases = [
            ("mapped", "::ffff:192.0.2.1", "192.0.2.1"),
            ("mapped, hex", "::ffff:c000:201", "192.0.2.1"),
            ("mapped, full", "0:0:0:0:0:ffff:c000:0201", "192.0.2.1"),
            ("mapped, upper case", "::FFFF:C000:201", "192.0.2.1"),
            ("translated", "::ffff:0:192.0.2.1", "192.0.2.1"),
            ("compatible", "::192.0.2.1", "192.0.2.1"),
            ("compatible, hex", "::c000:201", "192.0.2.1"),
            ("loopback stays v6", "::1", "::1"),
            ("unspecified stays v6", "::", "::"),
            ("plain v6", "2001:db8::1", "2001:db8::1"),
            (
                "nat64 is not mapped",
                "64:ff9b::192.0.2.1",
                "64:ff9b::c000:201",
            ),
            ("v4", "192.0.2.1", "192.0.2.1"),
        ];
        for (name, input, want) in cases {
            assert_eq!(canonical(ip(input)), ip(want), "{name}");
        }
    }

    #[test]
    fn ipv4_keys_are_dotted_quads() {
        for text in [
            "0.0.0.0",
            "1.2.3.4",
            "10.0.0.255",
            "192.168.100.1",
            "255.255.255.255",
        ] {
            assert_eq!(ipv4_key(text.parse().unwrap()), Key::new(text), "{text}");
        }
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
            ("v6 /128", "2001:db8::1", 128, "2001:db8::1/128"),
        ];
        for (name, input, prefix, want) in cases {
            assert_eq!(ip_key(ip(input), prefix), Key::new(want), "{name}");
        }
    }

    #[test]
    fn the_client_is_the_first_untrusted_hop_from_the_right() {
        let lb = ClientIp::new().trust("10.0.0.0/8").unwrap();
        let fwd = lb.clone().header(ForwardedHeader::Forwarded);
        let real = lb.clone().header(ForwardedHeader::XRealIp);
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
    fn without_a_peer_address_the_server_is_misconfigured() {
        let req = Request::get("/").body(()).unwrap();
        assert!(matches!(
            ClientIp::new().extract(&req),
            Err(KeyError::Misconfigured(_))
        ));
        let mut req = Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert("198.51.100.1:443".parse::<SocketAddr>().unwrap());
        assert_eq!(ClientIp::new().extract(&req), Ok(Key::new("198.51.100.1")));
    }
}
