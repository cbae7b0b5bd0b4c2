//! The backstop: find (and on request repair) limiter keys without a
//! lifetime, on one server or on every master of a Cluster: counters, and
//! records of slots in flight (a key that holds slots always has a
//! lifetime, the in-flight contract says).

use ::redis::{Cmd, RedisResult, Value};

use super::connection::classify::unavailable;
use super::connection::nodes::{Node, Nodes};
use super::reply::name;
use super::script::{REPAIR, REPAIR_SLOTS, Target};
use tower_pinned_window::Window;
use tower_pinned_window::backend::toolkit::storage_key::{LIMITS, SLOTS};
use tower_pinned_window::backend::{AuditReport, BackendError, SlotId};

/// A command target that is one node of a deployment: a script run on it
/// goes to that node.
struct OnNode<'a, N> {
    connection: &'a mut N,
    node: &'a Node,
}

impl<N: Nodes + Send> Target for OnNode<'_, N> {
    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        // A Cluster node's error reply (`NOSCRIPT`, say) comes back as a
        // value: made an error here, as a connection's `query_async` does.
        self.connection
            .on_node(self.node, cmd.clone())
            .await?
            .extract_error()
    }
}

/// Scan every key under `prefix` on every node of `connection`, and repair
/// what `repair` says: see [`RedisBackend::audit`](super::RedisBackend::audit).
pub(super) async fn run<N: Nodes + Send>(
    mut connection: N,
    prefix: &[u8],
    repair: Option<Window>,
) -> Result<AuditReport, BackendError> {
    let nodes = connection.nodes().await.map_err(unavailable)?;
    let pattern = glob_escape(prefix);
    let mut report = AuditReport::default();
    report.nodes = nodes.len();
    for node in &nodes {
        let mut cursor = 0u64;
        loop {
            let mut scan = ::redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let reply = connection.on_node(node, scan).await.map_err(unavailable)?;
            let (next, keys): (u64, Vec<Vec<u8>>) =
                ::redis::from_redis_value(reply).map_err(malformed)?;
            for key in keys {
                report.scanned += 1;
                if is_limits(&key) {
                    // Limits are configuration: they live until removed.
                    continue;
                }
                let mut pttl = ::redis::cmd("PTTL");
                pttl.arg(&key);
                let ttl: i64 = ::redis::from_redis_value(
                    connection.on_node(node, pttl).await.map_err(unavailable)?,
                )
                .map_err(malformed)?;
                if ttl != -1 {
                    continue;
                }
                let slots = is_slots_record(&key);
                if let Some(window) = repair {
                    let mut target = OnNode {
                        connection: &mut connection,
                        node,
                    };
                    // A record of slots keeps its latest lease, at least.
                    let script = if slots { &REPAIR_SLOTS } else { &REPAIR };
                    let reply = script
                        .run_on_key(&mut target, &key, Some(window.as_millis()))
                        .await
                        .map_err(unavailable)?;
                    let set: i64 = ::redis::from_redis_value(reply).map_err(malformed)?;
                    match set {
                        1 => report.repaired.push(name(&key)),
                        -1 => report.corrupt.push(name(&key)),
                        _ => {}
                    }
                } else if slots {
                    if !holds_slots(&mut connection, node, &key).await? {
                        report.corrupt.push(name(&key));
                    }
                } else if !holds_a_counter(&mut connection, node, &key).await? {
                    report.corrupt.push(name(&key));
                }
                report.without_lifetime.push(name(&key));
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(report)
}

/// The type Redis gives `key` on `node` (`TYPE`: `none` when it is gone).
async fn type_of<N: Nodes + Send>(
    connection: &mut N,
    node: &Node,
    key: &[u8],
) -> Result<String, BackendError> {
    let mut kind = ::redis::cmd("TYPE");
    kind.arg(key);
    ::redis::from_redis_value(connection.on_node(node, kind).await.map_err(unavailable)?)
        .map_err(malformed)
}

/// Whether `key` holds a counter, as the repair script judges it: a string
/// of decimal digits. A key that is gone by now counts as one (there is
/// nothing corrupt left to report). Read only: a report changes nothing.
async fn holds_a_counter<N: Nodes + Send>(
    connection: &mut N,
    node: &Node,
    key: &[u8],
) -> Result<bool, BackendError> {
    match type_of(connection, node, key).await?.as_str() {
        "none" => return Ok(true),
        "string" => {}
        _ => return Ok(false),
    }
    let mut get = ::redis::cmd("GET");
    get.arg(key);
    let value: Option<Vec<u8>> =
        ::redis::from_redis_value(connection.on_node(node, get).await.map_err(unavailable)?)
            .map_err(malformed)?;
    Ok(value.is_none_or(|value| is_count(&value)))
}

/// Whether `key` names a record of slots in flight
/// (`storage_key::encode_slots`): a pair's storage key, which ends with its
/// key's closing brace, then `:slots`. No counter's key ends so (a
/// counter's ends with the brace), whatever bytes a client sent.
fn is_slots_record(key: &[u8]) -> bool {
    key.strip_suffix(SLOTS)
        .is_some_and(|pair| pair.ends_with(b"}"))
}

/// Whether `key` names a layer's limits (`storage_key::encode_limits`):
/// a key with no brace that ends with `:limits`. Every counter's key and
/// every marker's holds the brace of its hash tag, whatever bytes a client
/// sent, so none is taken for one.
fn is_limits(key: &[u8]) -> bool {
    key.ends_with(LIMITS) && !key.contains(&b'{')
}

/// Whether `key` holds a record of slots, as the scripts of slots judge
/// it: a sorted set whose members are slots' names. A key that is gone by
/// now counts as one. Read only.
async fn holds_slots<N: Nodes + Send>(
    connection: &mut N,
    node: &Node,
    key: &[u8],
) -> Result<bool, BackendError> {
    match type_of(connection, node, key).await?.as_str() {
        "none" => return Ok(true),
        "zset" => {}
        _ => return Ok(false),
    }
    let mut members = ::redis::cmd("ZRANGE");
    members.arg(key).arg(0).arg(-1);
    let members: Vec<Vec<u8>> = ::redis::from_redis_value(
        connection
            .on_node(node, members)
            .await
            .map_err(unavailable)?,
    )
    .map_err(malformed)?;
    Ok(members.iter().all(|member| is_slot(member)))
}

/// A slot's name: what [`SlotId`] reads back (32 lowercase hex digits).
fn is_slot(member: &[u8]) -> bool {
    SlotId::parse(member).is_some()
}

/// A counter's value: one or more ASCII digits (the repair script's
/// `^%d+$`).
fn is_count(value: &[u8]) -> bool {
    !value.is_empty() && value.iter().all(u8::is_ascii_digit)
}

/// `prefix*`, with the prefix's glob characters escaped.
fn glob_escape(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 1);
    for &byte in prefix {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.push(b'*');
    pattern
}

fn malformed(err: ::redis::ParsingError) -> BackendError {
    BackendError::Unavailable(Box::new(err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_pinned_window::backend::toolkit::storage_key;
    use tower_pinned_window::key::Key;

    #[test]
    fn only_a_layers_limits_are_taken_for_limits() {
        assert!(is_limits(&storage_key::encode_limits(b"tpw:", "api{x}")));
        for key in [Key::new(":limits"), Key::new("}:limits"), Key::new("")] {
            for name in ["api", "api:limits", ""] {
                let counter = storage_key::encode(b"tpw:", name, &key);
                assert!(!is_limits(&counter), "{}", counter.escape_ascii());
                for marker in [
                    storage_key::encode_lockout(b"tpw:", name, &key),
                    storage_key::encode_slots(b"tpw:", name, &key),
                    storage_key::encode_reset_marker(b"tpw:", name, &key),
                ] {
                    assert!(!is_limits(&marker), "{}", marker.escape_ascii());
                }
            }
        }
    }

    #[test]
    fn counts_are_digits_only() {
        for (value, count) in [
            (&b"0"[..], true),
            (b"42", true),
            (b"", false),
            (b"-1", false),
            (b"1.5", false),
            (b" 1", false),
            (b"abc", false),
            (b"1\n", false),
        ] {
            assert_eq!(is_count(value), count, "{value:?}");
        }
    }

    #[test]
    fn records_of_slots_are_told_from_counters_and_markers() {
        for (key, slots) in [
            (&b"tpw:api{k}:slots"[..], true),
            (b"tpw:api{%}:slots", true),
            (b"tpw:api{k}", false),
            (b"tpw:api{k}:lock", false),
            (b"tpw:api{k}:reset", false),
            // A counter whose key a client made end in ":slots" ends with
            // its brace all the same.
            (b"tpw:api{k:slots}", false),
            (b"tpw:legacy:slots", false),
            (b":slots", false),
        ] {
            assert_eq!(is_slots_record(key), slots, "{}", key.escape_ascii());
        }
    }

    #[test]
    fn slot_members_are_32_lowercase_hex_digits() {
        for (member, slot) in [
            (&b"0123456789abcdef0123456789abcdef"[..], true),
            (b"0123456789ABCDEF0123456789ABCDEF", false),
            (b"0123456789abcdef0123456789abcde", false),
            (b"0123456789abcdef0123456789abcdef0", false),
            (b"not-a-slot", false),
            (b"", false),
            (b"\xff", false),
        ] {
            assert_eq!(is_slot(member), slot, "{}", member.escape_ascii());
        }
    }

    #[test]
    fn audit_patterns_escape_globs() {
        assert_eq!(glob_escape(b"tpw:"), b"tpw:*");
        assert_eq!(glob_escape(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*");
    }
}
