//! Redis Cluster hash slots, computed here because coalesced hits need them
//! even without the `redis-cluster` feature (a connection not known as a
//! Cluster learns that it is one from a `CROSSSLOT` refusal), where the
//! `redis` crate's own routing is not compiled.

/// Slots in a Redis Cluster.
pub(super) const CLUSTER_SLOTS: u16 = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between the
/// first `{` and the next `}`, when not empty) or of the whole key, modulo
/// [`CLUSTER_SLOTS`], as the Cluster specification defines it.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % CLUSTER_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_rule() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
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
}
