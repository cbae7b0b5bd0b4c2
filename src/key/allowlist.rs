//! [`Allowlist`]: clients that bypass the limiter, found the way
//! [`ClientIp`] finds them.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::client_ip::{ClientIp, parse_net};
use super::ip::{canonical, canonical_nets, peer};
use crate::error::ConfigError;
use crate::request::RequestHead;

/// Client addresses and networks whose requests bypass the limiter (see
/// [`RateLimitLayer::allowlist`](crate::RateLimitLayer::allowlist)).
///
/// The client is the one the [`ClientIp`] given to [`new`](Self::new)
/// finds: the peer address, or behind proxies that `ClientIp` trusts, the
/// first untrusted hop of the forwarded header. From a peer that is not a
/// trusted proxy, no header is read, so a client cannot skip the limit by
/// sending an allowlisted address in `X-Forwarded-For`. A request whose
/// client cannot be found (no peer address, a malformed entry where the
/// client should be, too many hops) is not on the list.
///
/// Addresses are compared in canonical form: an IPv4 address written in
/// IPv6 (`::ffff:192.0.2.7`) is its IPv4 address, on the list and in the
/// request.
///
/// ```
/// use http::Request;
/// use tower_pinned_window::key::RequestHead;
/// use tower_pinned_window::key::{Allowlist, ClientIp};
///
/// let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
/// let list = Allowlist::new(client_ip).allow("192.0.2.0/24").unwrap().allow("2001:db8::1").unwrap();
/// let request = |peer: [u8; 4], forwarded: &str| {
///     let mut req = Request::get("/").header("x-forwarded-for", forwarded).body(()).unwrap();
///     req.extensions_mut().insert(std::net::SocketAddr::from((peer, 443)));
///     req
/// };
/// // Through the trusted load balancer, the forwarded client is the client.
/// assert!(list.contains(&RequestHead::new(&request([10, 0, 0, 1], "192.0.2.7"))));
/// assert!(!list.contains(&RequestHead::new(&request([10, 0, 0, 1], "203.0.113.9"))));
/// // From anyone else, the header is theirs: the peer is the client.
/// assert!(!list.contains(&RequestHead::new(&request([203, 0, 113, 9], "192.0.2.7"))));
/// assert!(Allowlist::new(ClientIp::new()).allow("192.0.2.0/33").is_err());
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Allowlist {
    client: ClientIp,
    nets: Arc<[IpNet]>,
}

impl Allowlist {
    /// An empty list whose requests' clients are found by `client` (give it
    /// the same [`ClientIp`] you key by, trusting the same proxies).
    pub fn new(client: ClientIp) -> Self {
        Self {
            client,
            nets: Arc::new([]),
        }
    }

    /// Add `cidr`: a network (`192.0.2.0/24`, `2001:db8::/48`) or one
    /// address.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use tower_pinned_window::key::{Allowlist, ClientIp};
    ///
    /// let list = Allowlist::new(ClientIp::new()).allow("192.0.2.0/24").unwrap();
    /// assert!(list.contains_ip(IpAddr::from([192, 0, 2, 200])));
    /// // Compared in canonical form: the IPv4-mapped address is on the list too.
    /// assert!(list.contains_ip("::ffff:192.0.2.200".parse().unwrap()));
    /// assert!(!list.contains_ip(IpAddr::from([192, 0, 3, 1])));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::InvalidCidr`] when `cidr` is neither.
    pub fn allow(self, cidr: &str) -> Result<Self, ConfigError> {
        Ok(self.allow_net(parse_net(cidr)?))
    }

    /// Add the network `net`.
    fn allow_net(mut self, net: IpNet) -> Self {
        let mut nets = self.nets.to_vec();
        nets.extend(canonical_nets(net));
        self.nets = nets.into();
        self
    }

    /// Whether `ip` is on the list (example: [`allow`](Self::allow)).
    pub fn contains_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// Whether the client of `request` is on the list; `false` when it has
    /// none that can be found (example: [`Allowlist`]).
    pub fn contains(&self, request: &RequestHead<'_>) -> bool {
        if self.nets.is_empty() {
            return false;
        }
        let Ok(peer) = peer(request) else {
            return false;
        };
        self.client
            .client_ip(peer, request.headers())
            .is_ok_and(|ip| self.contains_ip(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use std::net::SocketAddr;

    fn request(peer: &str, forwarded: Option<&str>) -> Request<()> {
        let mut builder = Request::get("/");
        if let Some(value) = forwarded {
            builder = builder.header("x-forwarded-for", value);
        }
        let mut request = builder.body(()).unwrap();
        request
            .extensions_mut()
            .insert(SocketAddr::new(peer.parse().unwrap(), 443));
        request
    }

    #[test]
    fn the_client_is_found_as_client_ip_finds_it() {
        let direct = Allowlist::new(ClientIp::new())
            .allow("192.0.2.0/24")
            .unwrap()
            .allow("2001:db8::/48")
            .unwrap();
        let proxied = Allowlist::new(ClientIp::new().trust("10.0.0.0/8").unwrap())
            .allow("192.0.2.0/24")
            .unwrap();
        let cases = [
            ("direct, listed", &direct, "192.0.2.7", None, true),
            ("direct, not listed", &direct, "203.0.113.9", None, false),
            ("direct, mapped", &direct, "::ffff:192.0.2.7", None, true),
            ("direct, v6 network", &direct, "2001:db8:0:1::9", None, true),
            ("direct, v6 outside", &direct, "2001:db9::1", None, false),
            (
                "direct: forwarded header ignored",
                &direct,
                "203.0.113.9",
                Some("192.0.2.7"),
                false,
            ),
            (
                "behind the proxy, listed",
                &proxied,
                "10.0.0.1",
                Some("192.0.2.7"),
                true,
            ),
            (
                "behind the proxy, not listed",
                &proxied,
                "10.0.0.1",
                Some("203.0.113.9"),
                false,
            ),
            (
                "forged left of the client",
                &proxied,
                "10.0.0.1",
                Some("192.0.2.7, 203.0.113.9"),
                false,
            ),
            (
                "forged from an untrusted peer",
                &proxied,
                "203.0.113.9",
                Some("192.0.2.7"),
                false,
            ),
            (
                "malformed where the client is",
                &proxied,
                "10.0.0.1",
                Some("192.0.2.7, bogus"),
                false,
            ),
            (
                "the proxy itself is not listed",
                &proxied,
                "10.0.0.1",
                None,
                false,
            ),
        ];
        for (name, list, peer, forwarded, want) in cases {
            let req = request(peer, forwarded);
            assert_eq!(list.contains(&RequestHead::new(&req)), want, "{name}");
        }
        let no_peer = Request::get("/").body(()).unwrap();
        assert!(
            !direct.contains(&RequestHead::new(&no_peer)),
            "no peer address: not listed"
        );
        assert!(
            !Allowlist::new(ClientIp::new())
                .contains(&RequestHead::new(&request("192.0.2.7", None))),
            "an empty list holds no one"
        );
    }

    #[test]
    fn cidrs_are_parsed() {
        let list = Allowlist::new(ClientIp::new());
        for good in ["192.0.2.0/24", "192.0.2.7", "2001:db8::/32", "::1"] {
            assert!(list.clone().allow(good).is_ok(), "{good}");
        }
        for bad in ["192.0.2.0/33", "nope", "", "10.0.0.0/"] {
            assert_eq!(
                list.clone().allow(bad).unwrap_err(),
                ConfigError::InvalidCidr(bad.into()),
                "{bad}"
            );
        }
        let mapped = list.allow("::ffff:192.0.2.0/120").unwrap();
        assert!(
            mapped.contains_ip("192.0.2.9".parse().unwrap()),
            "a mapped CIDR covers IPv4"
        );
        // Found by the allowlist fuzz target (fuzz/regressions/allowlist/):
        // a network of IPv4-compatible addresses whose first address, `::`,
        // is not IPv4 held none of the IPv4 addresses inside it.
        let compatible = Allowlist::new(ClientIp::new()).allow("::/96").unwrap();
        for inside in [
            "::255.255.255.255",
            "::1.2.3.4",
            "1.2.3.4",
            "::",
            "::1",
            "::0.0.1.1",
        ] {
            assert!(
                compatible.contains_ip(inside.parse().unwrap()),
                "::/96 holds {inside}"
            );
        }
        for outside in ["::1:0:0", "::2:0:0", "2001:db8::1"] {
            assert!(
                !compatible.contains_ip(outside.parse().unwrap()),
                "::/96 holds {outside}"
            );
        }
        let wide = Allowlist::new(ClientIp::new()).allow("::/64").unwrap();
        assert!(
            !wide.contains_ip("::ffff:1.2.3.4".parse().unwrap()),
            "a wider IPv6 network holds no IPv4 address"
        );
    }
}
