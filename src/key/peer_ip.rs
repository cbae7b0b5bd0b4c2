use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::Request;

use super::{Key, KeyError, KeyExtractor};
use crate::ConfigError;

/// The connection's peer address, from axum's [`ConnectInfo<SocketAddr>`].
///
/// IPv4 addresses carried in IPv6 (mapped, translated, compatible) are keyed
/// as the IPv4 address, and IPv6 addresses are grouped by their /64 prefix by
/// default, because one client usually holds a whole /64 and can rotate
/// through it. For clients behind proxies, use [`ClientIp`](super::ClientIp).
///
/// The server must be served with
/// `into_make_service_with_connect_info::<SocketAddr>()`; without it every
/// request fails with [`KeyError::Misconfigured`] (a 500 and an error log),
/// never a panic. Behind a proxy or load balancer the peer is the proxy:
/// every client would share its budget.
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self { ipv6_prefix: 64 }
    }
}

impl PeerIp {
    /// Key by peer IP, grouping IPv6 addresses by /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Group IPv6 addresses by a prefix of `bits` (32 to 128; 128 keys every
    /// address apart).
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

    /// The key for `ip` under this extractor's grouping.
    pub fn key_for(&self, ip: IpAddr) -> Key {
        super::client_ip::ip_key(ip, self.ipv6_prefix)
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Result<Key, KeyError> {
        request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| self.key_for(addr.ip()))
            .ok_or(KeyError::Misconfigured(
                "no ConnectInfo<SocketAddr>: serve with into_make_service_with_connect_info::<SocketAddr>()",
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_ip_keys() {
        let peer = PeerIp::new();
        let cases = [
            ("v4", "203.0.113.7", "203.0.113.7"),
            ("v4-mapped", "::ffff:203.0.113.7", "203.0.113.7"),
            ("v4-mapped hex", "::ffff:cb00:7107", "203.0.113.7"),
            ("v6 /64", "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
            ("v6 same /64", "2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
            ("v6 loopback", "::1", "::/64"),
        ];
        for (name, ip, want) in cases {
            assert_eq!(peer.key_for(ip.parse().unwrap()), Key::new(want), "{name}");
        }
        let exact = PeerIp::new().ipv6_prefix(128).unwrap();
        assert_eq!(
            exact.key_for("2001:db8::1".parse().unwrap()),
            Key::new("2001:db8::1/128")
        );
        assert_eq!(
            PeerIp::new().ipv6_prefix(31).unwrap_err(),
            ConfigError::InvalidIpv6Prefix(31)
        );
        assert!(PeerIp::new().ipv6_prefix(129).is_err());
    }

    #[test]
    fn missing_connect_info_is_a_clear_error() {
        let req = Request::get("/").body(()).unwrap();
        assert!(matches!(
            PeerIp::new().extract(&req),
            Err(KeyError::Misconfigured(_))
        ));
    }
}
