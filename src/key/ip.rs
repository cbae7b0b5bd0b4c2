//! The address logic of [`ClientIp`](super::ClientIp) and
//! [`Allowlist`](super::Allowlist): the peer address, canonical IPv4, IPv6
//! grouping, the key of an address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::{Key, KeyError};
use crate::error::ConfigError;
use crate::request::RequestHead;

/// The IPv6 grouping prefix by default: one client usually holds a whole
/// /64.
pub(super) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// `bits` as an IPv6 grouping prefix, 32 to 128 bits.
pub(super) fn ipv6_prefix(bits: u8) -> Result<u8, ConfigError> {
    if !(32..=128).contains(&bits) {
        return Err(ConfigError::InvalidIpv6Prefix(bits));
    }
    Ok(bits)
}

/// The key for `ip`: the canonical IPv4 address, or the IPv6 network of
/// `prefix` bits (`2001:db8:1:2::/64`).
pub(super) fn key_for(ip: IpAddr, prefix: u8) -> Key {
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
}
