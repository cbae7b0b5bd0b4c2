//! Replays every input in `fuzz/regressions/<target>/` (inputs that once
//! made a fuzz target fail; see fuzz/README.md) through the checks of its
//! target that found something, so `cargo test` holds them without
//! cargo-fuzz. The fuzz targets themselves replay all of them too.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use tower_pinned_window::key::{Allowlist, ClientIp};
use tower_pinned_window::{Quota, Window};

/// The files of `fuzz/regressions/<target>/`, with their names.
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "fuzz", "regressions", target]
        .iter()
        .collect();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run from the repository)", dir.display()));
    let mut files: Vec<_> = entries
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("a readable input"))
        })
        .collect();
    assert!(!files.is_empty(), "{}: no input", dir.display());
    files.sort();
    files
}

/// IPv4 carried in IPv6 (mapped, translated, or compatible other than
/// `::0.0.x.x`), which the crate compares as IPv4.
fn is_v4_in_v6(ip: IpAddr) -> bool {
    let IpAddr::V6(v6) = ip else { return false };
    let bits = u128::from(v6);
    let high = bits >> 32;
    high == 0xffff || high == 0xffff_0000 || (high == 0 && bits >> 16 != 0)
}

/// An IPv6 network inside one of the three /96 ranges of IPv4 in IPv6.
fn in_v4_range(net: IpNet) -> bool {
    let IpNet::V6(v6) = net else { return false };
    v6.prefix_len() >= 96 && matches!(u128::from(v6.network()) >> 32, 0 | 0xffff | 0xffff_0000)
}

#[test]
fn allowlist_inputs_hold_their_networks() {
    for (name, input) in inputs("allowlist") {
        let text = String::from_utf8(input).expect("a text input");
        let (cidrs, lookups) = text.split_once("\n?").unwrap_or((&text, ""));
        let mut list = Allowlist::new(ClientIp::new());
        for cidr in cidrs.split_ascii_whitespace() {
            let parsed = cidr
                .parse::<IpNet>()
                .ok()
                .or_else(|| cidr.parse::<IpAddr>().ok().map(IpNet::from));
            let allowed = Allowlist::new(ClientIp::new()).allow(cidr);
            assert_eq!(allowed.is_ok(), parsed.is_some(), "{name}: allow({cidr:?})");
            assert_eq!(
                ClientIp::new().trust(cidr).is_ok(),
                parsed.is_some(),
                "{name}: trust({cidr:?})"
            );
            let (Ok(alone), Some(net)) = (allowed, parsed) else {
                continue;
            };
            for ip in [net.network(), net.broadcast()] {
                // An IPv6 network wider than those ranges holds no IPv4.
                let wide = matches!(net, IpNet::V6(_)) && !in_v4_range(net) && is_v4_in_v6(ip);
                assert!(
                    wide || alone.contains_ip(ip),
                    "{name}: {cidr:?} does not hold {ip}"
                );
            }
            list = list.allow(cidr).expect("allowed alone");
        }
        for ip in lookups
            .split_ascii_whitespace()
            .filter_map(|s| s.parse::<IpAddr>().ok())
        {
            let _ = list.contains_ip(ip);
        }
    }
}

#[test]
fn rate_inputs_parse_in_bounds_and_round_up() {
    for (name, input) in inputs("rate") {
        let Ok(text) = String::from_utf8(input) else {
            continue;
        };
        if let Ok(quota) = text.parse::<Quota>() {
            assert_eq!(quota.to_string().parse::<Quota>(), Ok(quota), "{name}");
        }
        if let Ok(window) = text.parse::<Window>() {
            assert_eq!(window.to_string().parse::<Window>(), Ok(window), "{name}");
        }
        if let Ok(secs) = text.trim().parse::<f64>()
            && let Ok(window) = Window::try_from_secs_f64(secs)
        {
            let nanos = Duration::try_from_secs_f64(secs).expect("in range");
            assert!(
                window.as_duration() >= nanos,
                "{name}: {secs} -> {window:?}"
            );
            assert!(window <= Window::MAX, "{name}");
        }
    }
}
