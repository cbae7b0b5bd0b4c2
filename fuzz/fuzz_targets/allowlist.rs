//! Allowlist CIDRs: `Allowlist::allow` (and `ClientIp::trust`, which reads
//! them the same way) on arbitrary text, then membership.
//!
//! The input is text: CIDRs or addresses separated by whitespace, then
//! optionally a line `? ADDRESS...` of addresses to look up.
//!
//! Checked: no panic; `allow` accepts exactly what `ipnet`/`std` parse as a
//! network or an address, and so does `trust`; an accepted network holds its
//! first and last address and nothing beside them, and every lookup agrees
//! with the networks' contents, addresses compared in canonical form (IPv4
//! carried in IPv6 is its IPv4 address).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use tower_pinned_window::key::{Allowlist, ClientIp};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (cidrs, lookups) = text.split_once("\n?").unwrap_or((text, ""));
    let mut list = Allowlist::new(ClientIp::new());
    let mut nets = Vec::new();
    for cidr in cidrs.split_ascii_whitespace() {
        let net = cidr
            .parse::<ipnet::IpNet>()
            .ok()
            .or_else(|| cidr.parse::<IpAddr>().ok().map(ipnet::IpNet::from));
        let allowed = list.clone().allow(cidr);
        let trusted = ClientIp::new().trust(cidr);
        assert_eq!(allowed.is_ok(), net.is_some(), "allow({cidr:?})");
        assert_eq!(trusted.is_ok(), net.is_some(), "trust({cidr:?})");
        let Ok(allowed) = allowed else {
            let err = allowed.unwrap_err();
            let _ = err.to_string();
            continue;
        };
        let net = net.expect("checked");
        let held = canonical_nets(net);
        let holds = |ip: IpAddr| held.iter().any(|n| n.contains(&canonical(ip)));
        // Alone on a list: its first and last address in, none beside it,
        // and every address as the canonical networks say.
        let alone = Allowlist::new(ClientIp::new())
            .allow(cidr)
            .expect("allowed once");
        for ip in [net.network(), net.broadcast()] {
            // An IPv6 network wider than a /96 holds no IPv4 address
            // (fuzz/regressions/allowlist/: `::/80` ends in
            // ::ffff:255.255.255.255).
            let wide = net.max_prefix_len() == 128 && held.len() == 1 && is_v4_in_v6(ip);
            assert!(wide || alone.contains_ip(ip), "{cidr:?} does not hold {ip}");
        }
        for ip in beside(net) {
            // Beside an IPv6 network wider than a /96 may be an IPv4
            // address, which is another network's.
            if held.len() > 1 || net.prefix_len() == net.max_prefix_len() || !is_v4_in_v6(ip) {
                assert!(!alone.contains_ip(ip), "{cidr:?} holds {ip}, outside it");
            }
        }
        for ip in [net.addr(), net.network(), net.broadcast()]
            .into_iter()
            .chain(beside(net))
        {
            assert_eq!(alone.contains_ip(ip), holds(ip), "{cidr:?} and {ip}");
        }
        if let ipnet::IpNet::V4(v4) = net {
            let mapped = IpAddr::V6(v4.addr().to_ipv6_mapped());
            assert!(alone.contains_ip(mapped), "{cidr:?} does not hold {mapped}");
        }
        list = allowed;
        nets.extend(held);
    }
    for ip in lookups
        .split_ascii_whitespace()
        .filter_map(|s| s.parse::<IpAddr>().ok())
    {
        let want = nets.iter().any(|net| net.contains(&canonical(ip)));
        assert_eq!(list.contains_ip(ip), want, "{ip} in {nets:?}");
    }
});

/// The addresses just outside `net`, where there are any.
fn beside(net: ipnet::IpNet) -> Vec<IpAddr> {
    match net {
        ipnet::IpNet::V4(n) => {
            let (lo, hi) = (u32::from(n.network()), u32::from(n.broadcast()));
            [lo.checked_sub(1), hi.checked_add(1)]
                .into_iter()
                .flatten()
                .map(|x| IpAddr::V4(Ipv4Addr::from(x)))
                .collect()
        }
        ipnet::IpNet::V6(n) => {
            let (lo, hi) = (u128::from(n.network()), u128::from(n.broadcast()));
            [lo.checked_sub(1), hi.checked_add(1)]
                .into_iter()
                .flatten()
                .map(|x| IpAddr::V6(Ipv6Addr::from(x)))
                .collect()
        }
    }
}

/// IPv4 carried in IPv6 (mapped `::ffff:a.b.c.d`, translated
/// `::ffff:0:a.b.c.d`, compatible `::a.b.c.d` but not `::` and `::1`), as
/// the crate's docs define it: the oracle for its canonical form.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let high = bits >> 32;
    (high == 0xffff || high == 0xffff_0000 || (high == 0 && bits >> 16 != 0))
        .then(|| Ipv4Addr::from(bits as u32))
}

fn is_v4_in_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if embedded_v4(v6).is_some())
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The networks `net` holds canonical addresses of: itself, and the IPv4
/// network it covers when it lies in a range of IPv4 carried in IPv6.
fn canonical_nets(net: ipnet::IpNet) -> Vec<ipnet::IpNet> {
    let mut nets = vec![net];
    if let ipnet::IpNet::V6(v6) = net {
        for base in [0xffff_u128 << 32, 0xffff_0000 << 32, 0] {
            let range = ipnet::Ipv6Net::new(Ipv6Addr::from(base), 96).expect("a /96");
            if range.contains(&v6) {
                let start = Ipv4Addr::from(u128::from(v6.network()) as u32);
                nets.extend(
                    ipnet::Ipv4Net::new(start, v6.prefix_len() - 96)
                        .ok()
                        .map(ipnet::IpNet::V4),
                );
            }
        }
    }
    nets
}
