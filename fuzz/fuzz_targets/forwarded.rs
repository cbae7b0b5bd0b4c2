//! `Forwarded`, `X-Forwarded-For`, `X-Real-IP` and a CDN's header of one
//! address through `ClientIp`'s trusted-proxy walk, with each configured.
//!
//! The input is text, one item a line:
//!
//! ```text
//! 16 64                        max hops, IPv6 prefix (either optional)
//! 10.0.0.1                     the peer address
//! 10.0.0.0/8 loopback          trusted CIDRs, addresses, `loopback`, `private`
//! f:for=192.0.2.1;proto=https  header lines: `f:` Forwarded, `r:` X-Real-IP,
//! 198.51.100.7, 10.0.0.2       `c:` CF-Connecting-IP, anything else
//!                              X-Forwarded-For (`x:` optional)
//! ```
//!
//! Checked: no panic; the extractor and `client_ip` agree; from an untrusted
//! peer no header is read; entries left of the client found are never read.
#![no_main]

use std::net::{IpAddr, SocketAddr};

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::key::RequestHead;
use tower_pinned_window::key::{Allowlist, ClientIp, KeyExtractor};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const HEADERS: [HeaderName; 4] = [
    X_FORWARDED_FOR,
    FORWARDED,
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("cf-connecting-ip"),
];

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&b| b == b'\n');
    let settings = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let peer = String::from_utf8_lossy(lines.next().unwrap_or_default());
    let peer: IpAddr = peer.trim().parse().unwrap_or(IpAddr::from([10, 0, 0, 1]));
    let trusted = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();

    let mut client = ClientIp::new();
    // The same networks, to ask whether an address is trusted.
    let mut nets = Allowlist::new(ClientIp::new());
    let mut settings = settings.split_ascii_whitespace();
    if let Some(hops) = settings.next().and_then(|s| s.parse::<usize>().ok()) {
        client = match client.clone().try_max_hops(hops) {
            Ok(c) => c,
            Err(_) => {
                assert_eq!(hops, 0, "only zero hops is refused");
                client
            }
        };
    }
    if let Some(bits) = settings.next().and_then(|s| s.parse::<u8>().ok()) {
        client = client.clone().try_ipv6_prefix(bits).unwrap_or(client);
    }
    for cidr in trusted.split_ascii_whitespace() {
        let presets: &[&str] = match cidr {
            "loopback" => &["127.0.0.0/8", "::1/128"],
            "private" => &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"],
            _ => &[],
        };
        if cidr == "loopback" {
            client = client.trust_loopback();
        } else if cidr == "private" {
            client = client.trust_private();
        }
        for preset in presets {
            nets = nets.allow(preset).expect("a preset");
        }
        if presets.is_empty() {
            match (client.clone().trust(cidr), nets.clone().allow(cidr)) {
                (Ok(c), Ok(n)) => (client, nets) = (c, n),
                (Err(_), Err(_)) => {}
                _ => panic!("trust and allow disagree on {cidr:?}"),
            }
        }
    }

    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = match line {
            [b'f', b':', rest @ ..] => ("forwarded", rest),
            [b'r', b':', rest @ ..] => ("x-real-ip", rest),
            [b'c', b':', rest @ ..] => ("cf-connecting-ip", rest),
            [b'x', b':', rest @ ..] => ("x-forwarded-for", rest),
            _ => ("x-forwarded-for", line),
        };
        // Bytes a header value cannot hold never reach the parsers.
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }

    let direct = client
        .client_ip(peer, &HeaderMap::new())
        .expect("a peer alone is its client");
    for header in HEADERS {
        let client = client.clone().header(header.clone());
        let found = client.client_ip(peer, &headers);

        // The extractor, as the layer calls it, finds the same client.
        let mut request = Request::new(());
        *request.headers_mut() = headers.clone();
        request.extensions_mut().insert(SocketAddr::new(peer, 443));
        let key = client.extract(&RequestHead::new(&request));
        match (&found, &key) {
            (Ok(ip), Ok(key)) => assert_eq!(key.as_bytes(), client.key_for(*ip).as_bytes()),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("client_ip {found:?} but extract {key:?}"),
        }

        if !nets.contains_ip(peer) {
            // An untrusted peer is the client, whatever it sends.
            assert_eq!(
                found,
                Ok(direct),
                "{header:?}: an untrusted peer's header was read"
            );
            continue;
        }
        // Entries left of an untrusted client are the client's own: more of
        // them change nothing.
        if let Ok(ip) = found
            && (header == X_FORWARDED_FOR || header == FORWARDED)
            && !nets.contains_ip(ip)
        {
            let mut more = HeaderMap::new();
            let (name, forged) = if header == FORWARDED {
                ("forwarded", "for=6.6.6.6, for=\"[\", junk")
            } else {
                ("x-forwarded-for", "6.6.6.6, [, junk")
            };
            more.append(name, HeaderValue::from_static(forged));
            for (name, value) in &headers {
                more.append(name, value.clone());
            }
            assert_eq!(
                client.client_ip(peer, &more),
                Ok(ip),
                "{header:?}: a left entry was read"
            );
        }
    }
});
