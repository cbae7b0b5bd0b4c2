//! Redis Cluster hash slots, computed here because coalesced hits need them
//! even without the `cluster` feature (a connection not known as a
//! Cluster learns that it is one from a `CROSSSLOT` refusal), where the
//! `redis` crate's own routing is not compiled (and where it is, its
//! `Slot::for_key` does not give the slot's number back).

use crc::{CRC_16_XMODEM, Crc};

/// Slots in a Redis Cluster.
pub(crate) const CLUSTER_SLOTS: u16 = 16_384;

/// The Cluster's checksum: CRC-16/XMODEM, its table built at compile time.
const XMODEM: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between the
/// first `{` and the next `}`, when not empty) or of the whole key, modulo
/// [`CLUSTER_SLOTS`], as the Cluster specification defines it.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    XMODEM.checksum(tagged) % CLUSTER_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_rule() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(XMODEM.checksum(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"tpw:a{k}"), key_slot(b"tpw:b:1/5ms{k}"));
        assert_eq!(key_slot(b"tpw:api{k}"), key_slot(b"k"));
    }

    #[test]
    fn slots_match_cluster_keyslot() {
        // Each as `CLUSTER KEYSLOT` answers it on a Redis 7 server.
        let cases: &[(&str, &[u8], u16)] = &[
            ("the spec's example", b"foo", 12182),
            ("a", b"a", 15495),
            ("b", b"b", 3300),
            ("c", b"c", 7365),
            ("empty", b"", 0),
            ("a hash tag", b"{user1000}.following", 3443),
            ("the same tag", b"{user1000}.followers", 3443),
            ("the tag alone", b"user1000", 3443),
            ("an empty tag hashes the whole key", b"foo{}{bar}", 8363),
            ("the first tag only", b"foo{bar}{zap}", 5061),
            ("a crate key", b"tpw:api{k}", 7629),
        ];
        for (name, key, slot) in cases {
            assert_eq!(key_slot(key), *slot, "{name}");
        }
    }
}
