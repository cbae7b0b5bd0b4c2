//! [`PeerIp`], and the address logic it shares with
//! [`ClientIp`](super::ClientIp): canonical IPv4, IPv6 grouping, the key of
//! an address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::{Key, KeyError, KeyExtractor};
use crate::error::ConfigError;
use crate::request::RequestHead;

/// The connection's peer address, trusting no proxy.
///
/// The address comes from axum's `ConnectInfo<SocketAddr>` (feature `axum`;
/// serve with `into_make_service_with_connect_info::<SocketAddr>()`),
/// tonic's `TcpConnectInfo` (feature `tonic`), or a `SocketAddr` in the
/// request's extensions. A server that provides none is misconfigured
/// ([`KeyError::Misconfigured`], 500 by default).
///
/// IPv4 addresses carried in IPv6 (`::ffff:a.b.c.d` mapped, `::ffff:0:a.b.c.d`
/// translated, `::a.b.c.d` compatible) are keyed as their IPv4 address, and
/// IPv6 peers are grouped by their /64 ([configurable](Self::ipv6_prefix)),
/// since one client usually holds a whole /64.
///
/// Behind a proxy or load balancer the peer is the proxy, and every client
/// would share its budget: use [`ClientIp`](super::ClientIp) and name the
/// proxy.
///
/// ```
/// use tower_pinned_window::key::PeerIp;
/// use tower_pinned_window::key::Key;
///
/// let peer = PeerIp::new().ipv6_prefix(48);
/// assert_eq!(peer.key_for("::ffff:203.0.113.7".parse().unwrap()), Key::new("203.0.113.7"));
/// assert_eq!(peer.key_for("2001:db8:1:2::9".parse().unwrap()), Key::new("2001:db8:1::/48"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self { ipv6_prefix: 64 }
    }
}

impl PeerIp {
    /// Key by the peer address, IPv6 peers grouped by /64 (example:
    /// [`PeerIp`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Group IPv6 peers by a prefix of `bits` (default 64).
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
        if !(32..=128).contains(&bits) {
            return Err(ConfigError::InvalidIpv6Prefix(bits));
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// The key for `ip`: the canonical IPv4 address, or the IPv6 network of
    /// the configured prefix (`2001:db8:1:2::/64`; example: [`PeerIp`]).
    pub fn key_for(&self, ip: IpAddr) -> Key {
        match canonical(ip) {
            IpAddr::V4(v4) => ipv4_key(v4),
            IpAddr::V6(v6) => {
                let bits = u32::from(self.ipv6_prefix);
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(v6) & mask);
                Key::display(format_args!("{network}/{bits}"))
            }
        }
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        Ok(self.key_for(peer(request)?))
    }
}

/// The request's peer address, or why the server is misconfigured.
pub(super) fn peer(request: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
    request
        .peer_addr()
        .map(|addr| addr.ip())
        .ok_or(KeyError::Misconfigured(
            "no peer address: serve axum with into_make_service_with_connect_info::<SocketAddr>(), \
         or use tonic's server, or insert a SocketAddr into the request's extensions",
        ))
}

/// IPv4 addresses carried in IPv6 (mapped, translated, compatible) as IPv4.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
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

/// `net` as the networks that hold the same canonical addresses: the net
/// itself, and when it lies in a range of IPv4 carried in IPv6 (mapped
/// `::ffff:0:0/96`, translated `::ffff:0:0:0/96`, compatible `::/96`), the
/// IPv4 network it covers (`::ffff:10.0.0.0/104` is `10.0.0.0/8`, `::/96`
/// is `0.0.0.0/0`). Canonical addresses there are IPv4, so only the IPv4
/// network holds them, even when the net's first address is not one (`::`
/// is not IPv4, but `::/96` holds `::255.255.255.255`). A wider IPv6
/// network (`::/64`, `::/0`) is an IPv6 network: it holds no IPv4 address.
pub(super) fn canonical_nets(net: IpNet) -> impl Iterator<Item = IpNet> {
    let v4_parts = match net {
        IpNet::V6(v6) => [0xffff_u128 << 32, 0xffff_0000 << 32, 0].map(|base| {
            let range = ipnet::Ipv6Net::new(Ipv6Addr::from(base), 96).expect("a /96");
            if !range.contains(&v6) {
                return None;
            }
            let start = Ipv4Addr::from((u128::from(v6.network()) & 0xffff_ffff) as u32);
            ipnet::Ipv4Net::new(start, v6.prefix_len() - 96)
                .ok()
                .map(IpNet::V4)
        }),
        IpNet::V4(_) => [None; 3],
    };
    std::iter::once(net).chain(v4_parts.into_iter().flatten())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
            ("v6 /32", "2001:db8:1:2::1", 32, "2001:db8::/32"),
            ("v6 /128", "2001:db8::1", 128, "2001:db8::1/128"),
        ];
        for (name, input, prefix, want) in cases {
            let peer = PeerIp::new().ipv6_prefix(prefix);
            assert_eq!(peer.key_for(ip(input)), Key::new(want), "{name}");
        }
    }

    #[test]
    fn prefixes_outside_32_to_128_are_errors() {
        for bits in [0, 31, 129, 255] {
            assert_eq!(
                PeerIp::new().try_ipv6_prefix(bits),
                Err(ConfigError::InvalidIpv6Prefix(bits)),
                "{bits}"
            );
        }
        for bits in [32, 64, 128] {
            assert!(PeerIp::new().try_ipv6_prefix(bits).is_ok(), "{bits}");
        }
    }

    #[test]
    #[should_panic(expected = "an IPv6 grouping prefix must be 32 to 128 bits, not 129")]
    fn a_bad_literal_prefix_panics() {
        let _ = PeerIp::new().ipv6_prefix(129);
    }

    #[test]
    fn without_a_peer_address_the_server_is_misconfigured() {
        let req = http::Request::get("/").body(()).unwrap();
        assert!(matches!(
            PeerIp::new().extract(&RequestHead::new(&req)),
            Err(KeyError::Misconfigured(_))
        ));
        let mut req = http::Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert("[::ffff:198.51.100.1]:443".parse::<SocketAddr>().unwrap());
        assert_eq!(
            PeerIp::new().extract(&RequestHead::new(&req)),
            Ok(Key::new("198.51.100.1"))
        );
    }
}
