//! The storage key: one byte string per (counter, key) pair, for stores whose
//! keys are byte strings (Redis, and any backend like it).
//!
//! Guarantees: [`encode`] is one-to-one ([`decode`] undoes it exactly), two
//! different (namespace, key) pairs never share a storage key whatever
//! bytes a client puts in its key, a counter's markers
//! ([`encode_lockout`], [`encode_reset_marker`]) and its key's record of
//! slots in flight ([`encode_slots`]) never meet a counter or
//! another counter's marker, a layer's limits ([`encode_limits`]) never
//! meet any of them, and the hash tag is always the crate's.
//!
//! The prefix, the escaped namespace, then the escaped key between braces:
//!
//! ```text
//! PREFIX NAMESPACE "{" KEY "}"
//!
//! tpw:api{203.0.113.7}                   layer "api", key 203.0.113.7
//! tpw:api:100/86400000ms{203.0.113.7}    the same layer's `also` quota of 100 a day
//! tpw:api{1/3600000ms:victim}            layer "api", a client that sent the key "1/3600000ms:victim"
//! tpw:api{%7Bx%7D}                       the key "{x}"
//! tpw:api{%}                             the empty key
//! tpw:api{#<64 hex digits>}             a key longer than 64 bytes: its SHA-256
//! tpw:api{@<64 hex digits>}             any key, behind PrivateKeys: its HMAC-SHA256
//! ```
//!
//! # Escaping
//!
//! Printable ASCII (`0x21..=0x7E`) is written as it is, except `%`, `{` and
//! `}`; every other byte is `%` and two uppercase hex digits. Escaping `%`
//! itself makes this one-to-one: [`decode`] undoes [`encode`] exactly. Layer
//! names (`A-Z a-z 0-9 _ - . :`) and IP addresses appear verbatim, and a
//! storage key (with a printable prefix) is printable ASCII, safe to log or
//! type into `redis-cli`.
//!
//! The escaped namespace holds no `{` and the escaped key no `}`, so the
//! first `{` ends the namespace and the last byte closes the key: two
//! different (namespace, key) pairs never share a storage key, whatever bytes
//! a client puts in its key. A key longer than [`MAX_KEY_LEN`] is held as its
//! digest, which is longer than any key kept as it is, so it cannot meet a
//! raw key either; a [private key](crate::backend::PrivateKeys)'s keyed digest is as
//! long, and marked `@` where a hashed key has `#`.
//!
//! The empty key is written `%`: a `%` that no two hex digits follow, which
//! no non-empty key produces. (An empty `{}` would not be a hash tag at all,
//! see below.)
//!
//! # The Redis Cluster hash tag is the crate's choice
//!
//! Redis Cluster places a key by the text between its first `{` and the first
//! `}` after it. Here that is always the escaped key, braces placed by this
//! crate: client bytes can never open or close a tag, and never choose a
//! slot. Every counter of one key (every layer, every quota) sits in one
//! slot, on purpose, so that all counters a request hits can be reached in
//! one call on a Cluster. The prefix must not contain braces (it would take
//! the tag over); the Redis backend's builder refuses one that does.
//!
//! # Other backends
//!
//! The [memory backend](crate::backend::MemoryBackend) keeps the pair apart
//! structurally (the namespace is length-prefixed) and never builds this
//! string, because it is on the hot path. Every store with byte-string keys
//! uses this encoding, so counters mean the same in each.

use crate::key::{HASHED_KEY_LEN, HASHED_KEY_MARK, Key, MAX_KEY_LEN, PRIVATE_KEY_MARK};

/// The bytes that are written as `%XX`: everything outside printable ASCII,
/// and the three bytes that carry structure.
const fn escaped(byte: u8) -> bool {
    !matches!(byte, 0x21..=0x7E) || matches!(byte, b'%' | b'{' | b'}')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn escape_into(out: &mut impl FnMut(&[u8]), mut bytes: &[u8]) {
    // Runs of bytes written as they are go in one piece.
    while let Some(at) = bytes.iter().position(|&b| escaped(b)) {
        let byte = bytes[at];
        out(&bytes[..at]);
        out(&[
            b'%',
            HEX[usize::from(byte >> 4)],
            HEX[usize::from(byte & 0xf)],
        ]);
        bytes = &bytes[at + 1..];
    }
    out(bytes);
}

/// The storage key of `namespace`'s counter for `key`, under `prefix`; see
/// the [module docs](self) for the format.
///
/// ```
/// use tower_pinned_window::backend::toolkit::storage_key;
/// use tower_pinned_window::key::Key;
///
/// let stored = storage_key::encode(b"tpw:", "api", &Key::new("{x}"));
/// assert_eq!(stored, b"tpw:api{%7Bx%7D}");
/// assert_eq!(storage_key::decode(b"tpw:", &stored), Some(("api".into(), b"{x}".to_vec())));
/// ```
#[must_use]
pub fn encode(prefix: &[u8], namespace: &str, key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + namespace.len() + key.as_bytes().len() + 8);
    encode_with(prefix, namespace, key, |bytes| out.extend_from_slice(bytes));
    out
}

/// [`encode`], handed to `put` piece by piece, in order, so that it can be
/// written into any buffer (an inline one, which then allocates nothing
/// for a key that fits).
pub fn encode_with(prefix: &[u8], namespace: &str, key: &Key, mut put: impl FnMut(&[u8])) {
    let key = key.as_bytes();
    put(prefix);
    escape_into(&mut put, namespace.as_bytes());
    put(b"{");
    if key.is_empty() {
        put(b"%");
    } else {
        escape_into(&mut put, key);
    }
    put(b"}");
}

/// The storage key of the lockout marker of `namespace`'s counter for
/// `key`: the counter's storage key followed by `:lock`. Every counter's
/// storage key ends with `}`, so a marker never meets a counter, whatever
/// bytes a client puts in its key; [`encode`] is one-to-one, so two
/// counters' markers never meet either; the hash tag is the counter's, so a
/// counter and its markers share a Redis Cluster slot. [`decode`] reads no
/// marker.
#[must_use]
pub fn encode_lockout(prefix: &[u8], namespace: &str, key: &Key) -> Vec<u8> {
    marker(prefix, namespace, key, LOCKOUT)
}

/// What follows a counter's storage key in its lockout marker's.
pub const LOCKOUT: &[u8] = b":lock";

/// What follows a key's storage key in the record of its slots in flight
/// ([`encode_slots`]).
pub const SLOTS: &[u8] = b":slots";

/// The storage key of the record of `key`'s slots in flight under
/// `namespace` ([`Leasing`](crate::backend::Leasing)): the storage key a
/// counter of the pair would have, followed by `:slots`. Apart from every
/// counter and marker for the reasons [`encode_lockout`] gives, and in the
/// same Redis Cluster slot as the key's counters.
#[must_use]
pub fn encode_slots(prefix: &[u8], namespace: &str, key: &Key) -> Vec<u8> {
    marker(prefix, namespace, key, SLOTS)
}

/// What follows a counter's storage key in its reset marker's.
pub const RESET_MARKER: &[u8] = b":reset";

/// The storage key of the reset marker of `namespace`'s counter for `key`
/// (the Redis backend's record of the last deleted window, which tells a
/// window opened after a reset from the one before it): the counter's
/// storage key followed by `:reset`, apart from every counter and lockout
/// for the reasons [`encode_lockout`] gives.
#[must_use]
pub fn encode_reset_marker(prefix: &[u8], namespace: &str, key: &Key) -> Vec<u8> {
    marker(prefix, namespace, key, RESET_MARKER)
}

/// What follows a layer's escaped name in the storage key of its limits
/// ([`encode_limits`]).
pub const LIMITS: &[u8] = b":limits";

/// The storage key of the limits held in the store for the layer `layer`
/// ([`Limits`](crate::backend::Limits)): the prefix, the escaped layer name
/// and `:limits`, with no brace at all.
///
/// Every counter's storage key, and every marker's, holds the `{` that
/// opens its hash tag, and an escaped name never holds one: so a layer's
/// limits never meet a counter, a lockout, a reset marker or a record of
/// slots, whatever bytes a layer name or a client's key holds; the escape
/// is one-to-one, so two layers' limits never meet either. With no hash
/// tag, Redis Cluster places it by the whole key: one key, one slot.
/// [`decode`] reads none.
///
/// ```
/// use tower_pinned_window::backend::toolkit::storage_key;
///
/// assert_eq!(storage_key::encode_limits(b"tpw:", "api"), b"tpw:api:limits");
/// assert_eq!(storage_key::encode_limits(b"tpw:", "a{b}"), b"tpw:a%7Bb%7D:limits");
/// ```
#[must_use]
pub fn encode_limits(prefix: &[u8], layer: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + layer.len() + LIMITS.len());
    out.extend_from_slice(prefix);
    escape_into(
        &mut |bytes: &[u8]| out.extend_from_slice(bytes),
        layer.as_bytes(),
    );
    out.extend_from_slice(LIMITS);
    out
}

fn marker(prefix: &[u8], namespace: &str, key: &Key, suffix: &[u8]) -> Vec<u8> {
    let mut out = encode(prefix, namespace, key);
    out.extend_from_slice(suffix);
    out
}

/// The namespace and key bytes a storage key was made from, or `None` when
/// `stored` is not exactly what [`encode`] makes under `prefix` (another
/// prefix, a missing brace, an escape that `encode` would not write). The
/// key bytes are a hashed key's digest text when the key was hashed.
#[must_use]
pub fn decode(prefix: &[u8], stored: &[u8]) -> Option<(String, Vec<u8>)> {
    let rest = stored.strip_prefix(prefix)?.strip_suffix(b"}")?;
    let open = rest.iter().position(|&b| b == b'{')?;
    let namespace = String::from_utf8(unescape(&rest[..open])?).ok()?;
    let key = match &rest[open + 1..] {
        b"%" => Vec::new(),
        [] => return None,
        escaped => unescape(escaped)?,
    };
    let digest = |key: &[u8]| {
        key.len() == HASHED_KEY_LEN
            && matches!(key[0], HASHED_KEY_MARK | PRIVATE_KEY_MARK)
            && key[1..]
                .iter()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (key.len() <= MAX_KEY_LEN || digest(&key)).then_some((namespace, key))
}

/// The inverse of [`escape_into`]; `None` for anything it would not write.
fn unescape(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.iter();
    while let Some(&byte) = bytes.next() {
        if byte == b'%' {
            let hi = hex_digit(*bytes.next()?)?;
            let lo = hex_digit(*bytes.next()?)?;
            let byte = hi << 4 | lo;
            if !escaped(byte) {
                return None;
            }
            out.push(byte);
        } else if escaped(byte) {
            return None;
        } else {
            out.push(byte);
        }
    }
    Some(out)
}

fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {

    // The examples the codec documented when it was public.
    #[test]
    fn encode_writes_the_documented_examples() {
        let cases = [
            ("api", "203.0.113.7", "tpw:api{203.0.113.7}"),
            // A key crafted to look like another quota's counter stays in
            // its own.
            ("api", "1/3600000ms:v", "tpw:api{1/3600000ms:v}"),
            ("api:1/3600000ms", "v", "tpw:api:1/3600000ms{v}"),
            ("api", "}{x", "tpw:api{%7D%7Bx}"),
            ("api", "", "tpw:api{%}"),
        ];
        for (namespace, key, stored) in cases {
            assert_eq!(
                encode(b"tpw:", namespace, &Key::new(key)),
                stored.as_bytes(),
                "{namespace:?} {key:?}"
            );
        }
    }

    #[test]
    fn a_lockout_marker_is_the_counters_key_then_lock() {
        let lock = encode_lockout(b"tpw:", "login", &Key::new("203.0.113.7"));
        assert_eq!(lock, b"tpw:login{203.0.113.7}:lock");
        assert_eq!(decode(b"tpw:", &lock), None);
    }

    #[test]
    fn decode_undoes_encode_and_reads_no_older_format() {
        let stored = encode(b"tpw:", "login:v2", &Key::new(b"a{b}%\n"));
        assert_eq!(stored, b"tpw:login:v2{a%7Bb%7D%25%0A}");
        assert_eq!(
            decode(b"tpw:", &stored),
            Some(("login:v2".to_string(), b"a{b}%\n".to_vec()))
        );
        assert_eq!(
            decode(b"tpw:", b"tpw:login:v2:a"),
            None,
            "an older format is not read"
        );
    }
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Every byte on its own, escaped or not, round-trips.
    #[test]
    fn every_byte_round_trips() {
        for byte in 0..=255u8 {
            let stored = encode(b"p:", "n", &Key::new([byte]));
            assert_eq!(
                decode(b"p:", &stored),
                Some(("n".into(), vec![byte])),
                "{byte:#04x}"
            );
            let tag =
                &stored[stored.iter().position(|&b| b == b'{').unwrap() + 1..stored.len() - 1];
            assert!(!tag.contains(&b'{') && !tag.contains(&b'}'), "{byte:#04x}");
        }
    }

    #[test]
    fn foreign_and_non_canonical_keys_do_not_decode() {
        let cases: &[(&str, &[u8])] = &[
            ("other prefix", b"xyz:n{k}"),
            ("old format", b"p:n:k"),
            ("no closing brace", b"p:n{k"),
            ("empty tag", b"p:n{}"),
            ("lowercase hex", b"p:n{%7b}"),
            ("escaped without need", b"p:n{%41}"),
            ("raw brace in key", b"p:n{a{b}"),
            ("raw space", b"p:n{a b}"),
            ("short escape", b"p:n{%7}"),
            ("lone percent in a longer key", b"p:n{a%}"),
            (
                "a raw key too long to be kept",
                &[b"p:n{".as_slice(), &[b'k'; 65], b"}"].concat(),
            ),
        ];
        for (name, stored) in cases {
            assert_eq!(decode(b"p:", stored), None, "{name}");
        }
    }

    /// Adversarial (namespace, key) pairs, from the layer's own counter
    /// names and from keys a client controls: no two share a storage key.
    #[test]
    fn adversarial_pairs_never_share_a_storage_key() {
        let long = |byte: u8, len: usize| vec![byte; len];
        let hashed = Key::new(long(b'h', MAX_KEY_LEN + 1));
        let names = [
            "a",
            "a:b",
            "api",
            "api:1/3600000ms",
            "api:100/86400000ms",
            "login:v2",
            "login",
            "",
            "a{b",
            "a}b",
            "a%7Bb",
            "a%b",
        ];
        let keys: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"%".to_vec(),
            b"%%".to_vec(),
            b"%25".to_vec(),
            b"b:c".to_vec(),
            b"c".to_vec(),
            b"b".to_vec(),
            b":c".to_vec(),
            b"v2:victim".to_vec(),
            b"victim".to_vec(),
            b"1/3600000ms:victim".to_vec(),
            b"100/86400000ms:victim".to_vec(),
            b":1/3600000ms{victim}".to_vec(),
            b"{victim}".to_vec(),
            b"}victim".to_vec(),
            b"victim{".to_vec(),
            b"}{".to_vec(),
            b"{}".to_vec(),
            b"%7Bvictim%7D".to_vec(),
            b"\x00".to_vec(),
            b"\x00\x00".to_vec(),
            b"\n".to_vec(),
            b" ".to_vec(),
            b"%20".to_vec(),
            b"\xff".to_vec(),
            b"%FF".to_vec(),
            b"#".to_vec(),
            long(b'k', MAX_KEY_LEN - 1),
            long(b'k', MAX_KEY_LEN),
            long(b'k', MAX_KEY_LEN + 1),
            long(b'{', MAX_KEY_LEN),
            long(b'{', MAX_KEY_LEN + 1),
            // A raw key that spells out a hashed key's digest: 65 bytes, so
            // hashed in turn; its first 64 bytes are a raw key of their own.
            hashed.as_bytes().to_vec(),
            hashed.as_bytes()[..MAX_KEY_LEN].to_vec(),
            long(b'h', MAX_KEY_LEN + 1),
        ];
        let mut seen: HashMap<Vec<u8>, (&str, Key)> = HashMap::new();
        for name in names {
            for raw in &keys {
                let key = Key::new(raw);
                let stored = encode(b"tpw:", name, &key);
                assert_eq!(
                    decode(b"tpw:", &stored),
                    Some((name.to_string(), key.as_bytes().to_vec())),
                    "{name:?} {key:?}"
                );
                if let Some((other_name, other_key)) = seen.get(&stored) {
                    // Only the very same pair may meet itself (the table
                    // holds a key and its hashed twin on purpose).
                    assert!(
                        *other_name == name && *other_key == key,
                        "{name:?} {key:?} meets {other_name:?} {other_key:?} at {}",
                        stored.escape_ascii()
                    );
                }
                seen.insert(stored, (name, key));
            }
        }
    }

    fn any_key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::collection::vec(
                prop_oneof![
                    Just(b'%'),
                    Just(b'{'),
                    Just(b'}'),
                    Just(b':'),
                    Just(b'#'),
                    any::<u8>()
                ],
                0..80
            ),
            proptest::collection::vec(any::<u8>(), 60..70),
        ]
    }

    fn any_name() -> impl Strategy<Value = String> {
        "[a-c:{}%/]{0,6}"
    }

    proptest! {
        #[test]
        fn distinct_pairs_never_share_a_storage_key(
            a in (any_name(), any_key()),
            b in (any_name(), any_key()),
        ) {
            let (ka, kb) = (Key::new(&a.1), Key::new(&b.1));
            let (sa, sb) = (encode(b"tpw:", &a.0, &ka), encode(b"tpw:", &b.0, &kb));
            prop_assert_eq!(sa == sb, a.0 == b.0 && ka == kb);
            prop_assert_eq!(decode(b"tpw:", &sa), Some((a.0.clone(), ka.as_bytes().to_vec())));
            prop_assert_eq!(decode(b"tpw:", &sb), Some((b.0.clone(), kb.as_bytes().to_vec())));
        }

        /// Lockout and reset markers, and records of slots, never meet a counter or another
        /// pair's marker, and keep the counter's hash tag.
        #[test]
        fn markers_never_meet_a_counter_or_another_pairs_marker(
            a in (any_name(), any_key()),
            b in (any_name(), any_key()),
        ) {
            let (ka, kb) = (Key::new(&a.1), Key::new(&b.1));
            let same = a.0 == b.0 && ka == kb;
            let counter_b = encode(b"tpw:", &b.0, &kb);
            for (marker_a, marker_b) in [
                (encode_lockout(b"tpw:", &a.0, &ka), encode_lockout(b"tpw:", &b.0, &kb)),
                (encode_reset_marker(b"tpw:", &a.0, &ka), encode_reset_marker(b"tpw:", &b.0, &kb)),
                (encode_slots(b"tpw:", &a.0, &ka), encode_slots(b"tpw:", &b.0, &kb)),
            ] {
                prop_assert_ne!(&marker_a, &counter_b);
                prop_assert_eq!(marker_a == marker_b, same);
                prop_assert_eq!(decode(b"tpw:", &marker_a), None);
                let tag = |k: &[u8]| {
                    let open = k.iter().position(|&c| c == b'{').unwrap();
                    let close = open + k[open..].iter().position(|&c| c == b'}').unwrap();
                    k[open..=close].to_vec()
                };
                prop_assert_eq!(tag(&marker_a), tag(&encode(b"tpw:", &a.0, &ka)));
            }
            prop_assert_ne!(
                encode_lockout(b"tpw:", &a.0, &ka),
                encode_reset_marker(b"tpw:", &b.0, &kb)
            );
            for other in [encode_lockout(b"tpw:", &b.0, &kb), encode_reset_marker(b"tpw:", &b.0, &kb)] {
                prop_assert_ne!(encode_slots(b"tpw:", &a.0, &ka), other);
            }
        }

        /// A layer's limits never meet a counter, a marker, a record of
        /// slots or another layer's limits.
        #[test]
        fn limits_never_meet_a_counter_a_marker_or_another_layers_limits(
            layer in any_name(),
            other in any_name(),
            b in (any_name(), any_key()),
        ) {
            let limits = encode_limits(b"tpw:", &layer);
            let kb = Key::new(&b.1);
            for form in [
                encode(b"tpw:", &b.0, &kb),
                encode_lockout(b"tpw:", &b.0, &kb),
                encode_reset_marker(b"tpw:", &b.0, &kb),
                encode_slots(b"tpw:", &b.0, &kb),
            ] {
                prop_assert_ne!(&limits, &form);
            }
            prop_assert_eq!(limits == encode_limits(b"tpw:", &other), layer == other);
            prop_assert_eq!(decode(b"tpw:", &limits), None);
            let braces = limits.iter().filter(|&&c| c == b'{' || c == b'}').count();
            prop_assert_eq!(braces, 0, "a brace in {}", limits.escape_ascii());
        }

        #[test]
        fn decode_accepts_only_what_encode_writes(text in proptest::collection::vec(any::<u8>(), 0..24)) {
            let mut stored = b"p:".to_vec();
            stored.extend_from_slice(&text);
            if let Some((namespace, key)) = decode(b"p:", &stored) {
                prop_assert!(key.len() <= MAX_KEY_LEN);
                prop_assert_eq!(encode(b"p:", &namespace, &Key::new(&key)), stored);
            }
        }
    }
}
