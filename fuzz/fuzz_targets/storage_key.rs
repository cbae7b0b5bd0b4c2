//! The storage-key codec (`src/backend/storage_key.rs`, through the
//! `fuzzing` entry points).
//!
//! The input is read twice: as raw bytes given to `decode`, and through
//! `arbitrary` as a prefix and two (namespace, key) pairs given to `encode`.
//!
//! Checked: `decode` never panics, and what it accepts is exactly what
//! `encode` writes; `decode(encode(x)) == x`; two different pairs never
//! share a storage key.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::backend::toolkit::storage_key::{decode, encode};
use tower_pinned_window::key::{Key, MAX_KEY_LEN};

#[derive(Debug, Arbitrary)]
struct Pairs {
    prefix: Vec<u8>,
    first: (String, Vec<u8>),
    second: (String, Vec<u8>),
}

fuzz_target!(|data: &[u8]| {
    for prefix in [&b"tpw:"[..], b""] {
        if let Some((namespace, key)) = decode(prefix, data) {
            // Only what encode writes decodes: re-encoding gives the bytes
            // back. (A longer key is a digest's text, which is not re-hashed.)
            if key.len() <= MAX_KEY_LEN {
                assert_eq!(
                    encode(prefix, &namespace, &Key::new(&key)),
                    data,
                    "{data:?}"
                );
            }
        }
    }

    let Ok(pairs) = Pairs::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    // The prefix holds no brace (the Redis backend's builder refuses one).
    let prefix: Vec<u8> = pairs
        .prefix
        .into_iter()
        .filter(|b| !b"{}".contains(b))
        .collect();
    let (ns1, k1) = (&pairs.first.0, Key::new(&pairs.first.1));
    let (ns2, k2) = (&pairs.second.0, Key::new(&pairs.second.1));
    let (e1, e2) = (encode(&prefix, ns1, &k1), encode(&prefix, ns2, &k2));
    assert_eq!(
        decode(&prefix, &e1),
        Some((ns1.clone(), k1.as_bytes().to_vec())),
        "round trip"
    );
    assert_eq!(
        decode(&prefix, &e2),
        Some((ns2.clone(), k2.as_bytes().to_vec())),
        "round trip"
    );
    if e1 == e2 {
        assert_eq!(
            (ns1, &pairs.first.1),
            (ns2, &pairs.second.1),
            "two pairs share {e1:?}"
        );
    }
    // The Cluster hash tag is the escaped key: the first `{` after the
    // prefix opens it, and the first `}` after that is the last byte.
    let rest = &e1[prefix.len()..];
    let open = rest
        .iter()
        .position(|&b| b == b'{')
        .expect("an opening brace");
    let close = open
        + 1
        + rest[open + 1..]
            .iter()
            .position(|&b| b == b'}')
            .expect("a closing brace");
    assert_eq!(
        close,
        rest.len() - 1,
        "the key's bytes closed the hash tag early: {e1:?}"
    );
});
