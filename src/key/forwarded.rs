//! Parsers for the headers proxies write: RFC 7239 `Forwarded`,
//! `X-Forwarded-For`, and one address in `X-Real-IP` or a CDN's header. They never panic, and yield hops from
//! the nearest proxy outwards (right to left).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

/// One hop of a forwarding chain, as a proxy recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    /// An IP address (a port, if any, dropped).
    Ip(IpAddr),
    /// Anything else: `unknown`, an obfuscated identifier, or garbage.
    Opaque,
}

/// `X-Forwarded-For`, the header [`ClientIp`](super::ClientIp) reads by
/// default.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The hops in `X-Forwarded-For`, nearest first. Repeated header lines are
/// one list, in order.
pub(crate) fn x_forwarded_for(headers: &HeaderMap) -> impl Iterator<Item = Hop> + '_ {
    headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
        .map(|entry| parse_node(trim(entry)))
}

/// The `for=` hops in `Forwarded`, nearest first.
pub(crate) fn forwarded(headers: &HeaderMap) -> impl Iterator<Item = Hop> + '_ {
    headers
        .get_all(FORWARDED)
        .iter()
        .rev()
        .flat_map(|line| split_unquoted(line.as_bytes(), b',').into_iter().rev())
        .map(forwarded_for)
}

/// A header that holds one address (`X-Real-IP`, a CDN's
/// `CF-Connecting-IP`): nothing when absent, opaque when repeated.
pub(crate) fn one_address(headers: &HeaderMap, name: &HeaderName) -> Option<Hop> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return Some(Hop::Opaque);
    }
    Some(parse_node(trim(value.as_bytes())))
}

/// The `for=` parameter of one `Forwarded` element.
fn forwarded_for(element: &[u8]) -> Hop {
    let mut found = None;
    for pair in split_unquoted(element, b';') {
        let pair = trim(pair);
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Hop::Opaque;
        };
        let (name, value) = (trim(&pair[..eq]), trim(&pair[eq + 1..]));
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return Hop::Opaque; // two `for=` in one element
            }
            found = Some(unquote(value).map_or(Hop::Opaque, |v| parse_node(&v)));
        }
    }
    found.unwrap_or(Hop::Opaque)
}

/// Splits on `sep` outside double quotes (a backslash escapes in quotes).
fn split_unquoted(input: &[u8], sep: u8) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in input.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            parts.push(&input[start..i]);
            start = i + 1;
        }
    }
    parts.push(&input[start..]);
    parts
}

/// A token as is, or a quoted-string's content; `None` for a broken quote.
fn unquote(value: &[u8]) -> Option<Vec<u8>> {
    match value {
        [b'"', inner @ .., b'"'] => {
            let mut out = Vec::with_capacity(inner.len());
            let mut bytes = inner.iter();
            while let Some(&b) = bytes.next() {
                match b {
                    b'\\' => out.push(*bytes.next()?),
                    b'"' => return None,
                    _ => out.push(b),
                }
            }
            Some(out)
        }
        [b'"', ..] | [.., b'"'] => None,
        token => Some(token.to_vec()),
    }
}

/// A node: `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]`, `[2001:db8::1]:80`, or
/// a bare IPv6 address (as `X-Forwarded-For` carries it).
fn parse_node(node: &[u8]) -> Hop {
    let Ok(text) = std::str::from_utf8(node) else {
        return Hop::Opaque;
    };
    if text.len() > 64 {
        return Hop::Opaque;
    }
    if let Some(rest) = text.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Hop::Opaque;
        };
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return Hop::Opaque;
        }
        return inside
            .parse::<Ipv6Addr>()
            .map_or(Hop::Opaque, |ip| Hop::Ip(IpAddr::V6(ip)));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Hop::Ip(ip);
    }
    match text.split_once(':') {
        Some((v4, port)) if is_port(port) => v4
            .parse::<Ipv4Addr>()
            .map_or(Hop::Opaque, |ip| Hop::Ip(IpAddr::V4(ip))),
        _ => Hop::Opaque,
    }
}

fn is_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: &'static str, values: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(name, HeaderValue::from_bytes(v).unwrap());
        }
        map
    }

    fn ip(s: &str) -> Hop {
        Hop::Ip(s.parse().unwrap())
    }

    /// (case name, header lines, hops expected).
    type Case<'a> = (&'a str, &'a [&'a [u8]], &'a [Hop]);

    #[test]
    fn x_forwarded_for_cases() {
        let cases: &[Case] = &[
            ("one", &[b"203.0.113.7"], &[ip("203.0.113.7")]),
            (
                "chain, nearest first",
                &[b"198.51.100.1, 10.0.0.2"],
                &[ip("10.0.0.2"), ip("198.51.100.1")],
            ),
            (
                "two lines are one list",
                &[b"1.1.1.1", b"2.2.2.2, 3.3.3.3"],
                &[ip("3.3.3.3"), ip("2.2.2.2"), ip("1.1.1.1")],
            ),
            ("ipv6 bare", &[b"2001:db8::1"], &[ip("2001:db8::1")]),
            (
                "ipv6 bracketed with port",
                &[b"[2001:db8::1]:443"],
                &[ip("2001:db8::1")],
            ),
            ("ipv4 with port", &[b"192.0.2.1:8080"], &[ip("192.0.2.1")]),
            (
                "mapped v4",
                &[b"::ffff:192.0.2.1"],
                &[ip("::ffff:192.0.2.1")],
            ),
            ("garbage", &[b"not-an-ip"], &[Hop::Opaque]),
            (
                "empty entry",
                &[b"1.1.1.1,,2.2.2.2"],
                &[ip("2.2.2.2"), Hop::Opaque, ip("1.1.1.1")],
            ),
            ("empty header", &[b""], &[Hop::Opaque]),
            (
                "spaces",
                &[b"  1.1.1.1 ,   2.2.2.2  "],
                &[ip("2.2.2.2"), ip("1.1.1.1")],
            ),
            ("unknown", &[b"unknown"], &[Hop::Opaque]),
            ("bad port", &[b"1.2.3.4:http"], &[Hop::Opaque]),
            ("octet overflow", &[b"256.1.1.1"], &[Hop::Opaque]),
            ("non-utf8", &[b"1.2.3.\xff"], &[Hop::Opaque]),
            ("bracket unclosed", &[b"[2001:db8::1"], &[Hop::Opaque]),
            ("v4 in brackets", &[b"[1.2.3.4]"], &[Hop::Opaque]),
        ];
        for (name, values, want) in cases {
            let got: Vec<Hop> = x_forwarded_for(&headers("x-forwarded-for", values)).collect();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn forwarded_cases() {
        let cases: &[(&str, &[u8], &[Hop])] = &[
            (
                "rfc example",
                b"for=192.0.2.60;proto=http;by=203.0.113.43",
                &[ip("192.0.2.60")],
            ),
            (
                "quoted v6 with port",
                b"for=\"[2001:db8:cafe::17]:4711\"",
                &[ip("2001:db8:cafe::17")],
            ),
            (
                "two elements",
                b"for=192.0.2.43, for=198.51.100.17",
                &[ip("198.51.100.17"), ip("192.0.2.43")],
            ),
            (
                "case-insensitive name",
                b"For=192.0.2.43",
                &[ip("192.0.2.43")],
            ),
            ("unknown", b"for=unknown", &[Hop::Opaque]),
            (
                "obfuscated",
                b"for=_hidden, for=_SEVKISEK",
                &[Hop::Opaque, Hop::Opaque],
            ),
            ("no for", b"proto=https;by=1.2.3.4", &[Hop::Opaque]),
            (
                "comma inside quotes",
                b"for=\"1.2.3.4,5.6.7.8\"",
                &[Hop::Opaque],
            ),
            (
                "semicolon inside quotes",
                b"for=\"a;b\";proto=http",
                &[Hop::Opaque],
            ),
            ("unterminated quote", b"for=\"1.2.3.4", &[Hop::Opaque]),
            (
                "two for in one element",
                b"for=1.1.1.1;for=2.2.2.2",
                &[Hop::Opaque],
            ),
            (
                "bare v6 is not allowed unquoted but parses",
                b"for=\"[::1]\"",
                &[ip("::1")],
            ),
            ("pair without =", b"for", &[Hop::Opaque]),
            ("escaped quote", b"for=\"\\\"1.2.3.4\"", &[Hop::Opaque]),
        ];
        for (name, value, want) in cases {
            let got: Vec<Hop> = forwarded(&headers("forwarded", &[value])).collect();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn huge_headers_stay_bounded() {
        let one_huge = "9".repeat(16 * 1024);
        let map = headers("x-forwarded-for", &[one_huge.as_bytes()]);
        assert_eq!(
            x_forwarded_for(&map).collect::<Vec<_>>(),
            [Hop::Opaque],
            "one huge entry"
        );
        let many = "1.1.1.1,".repeat(5_000);
        let map = headers("x-forwarded-for", &[many.as_bytes()]);
        // The walk is lazy: a caller stops after its hop limit.
        assert_eq!(
            x_forwarded_for(&map).take(3).collect::<Vec<_>>(),
            [Hop::Opaque, ip("1.1.1.1"), ip("1.1.1.1")]
        );
        let quoted = format!("for=\"{}\"", "[".repeat(10_000));
        let map = headers("forwarded", &[quoted.as_bytes()]);
        assert_eq!(forwarded(&map).collect::<Vec<_>>(), [Hop::Opaque]);
    }

    const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

    fn x_real_ip(map: &HeaderMap) -> Option<Hop> {
        one_address(map, &X_REAL_IP)
    }

    #[test]
    fn x_real_ip_cases() {
        assert_eq!(
            x_real_ip(&headers("x-real-ip", &[b"203.0.113.9"])),
            Some(ip("203.0.113.9"))
        );
        assert_eq!(
            x_real_ip(&headers("x-real-ip", &[b"1.1.1.1", b"2.2.2.2"])),
            Some(Hop::Opaque),
            "repeated"
        );
        assert_eq!(
            x_real_ip(&headers("x-real-ip", &[b"junk"])),
            Some(Hop::Opaque)
        );
        assert_eq!(x_real_ip(&HeaderMap::new()), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

        #[test]
        fn parsers_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            // Header values cannot hold every byte; the ones they can are what
            // a client can send.
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
                    let mut map = HeaderMap::new();
                    map.insert(name, value.clone());
                    let hops = x_forwarded_for(&map).chain(forwarded(&map)).chain(x_real_ip(&map)).count();
                    proptest::prop_assert!(hops <= bytes.len() + 1);
                }
            }
        }

        #[test]
        fn listed_addresses_come_back(addrs in proptest::collection::vec(proptest::arbitrary::any::<IpAddr>(), 1..10)) {
            let line = addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            let map = headers("x-forwarded-for", &[line.as_bytes()]);
            let got: Vec<Hop> = x_forwarded_for(&map).collect();
            let want: Vec<Hop> = addrs.iter().rev().map(|a| Hop::Ip(*a)).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
