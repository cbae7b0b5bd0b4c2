//! Limits held in the store ([`Limits`](tower_pinned_window::backend::Limits)):
//! one Redis hash per layer, at `storage_key::encode_limits` (the prefix,
//! the escaped layer name and `:limits`, no hash tag: one key, so one
//! Cluster slot, apart from every counter and marker). Its fields are the
//! scopes as `encode_scope` makes them, its values the limits as
//! `encode_limit` makes them.
//!
//! A set is one `HSET` or `HDEL` (atomic), a read one `HGETALL`, each sent
//! on the hash's master through the guarded connection (its breaker; a set
//! with its `WAIT` in the replica-acknowledged mode). A field whose value is
//! not a limit is left out and counted (`StoredLimits::insert_stored`); a
//! hash key that holds another type (a string `SET` by hand) is the whole
//! record corrupt: [`BackendError::Corrupt`], left as it is.

use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, Value};

use super::connection::classify::unavailable;
use super::connection::guarded::Guarded;
use super::reply::corrupt;
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{BackendError, StoredLimits, encode_limit};

/// A command on the limits hash at `hash` failed: a hash key of another
/// type is corrupt, anything else an outage as every command's.
fn failed(err: RedisError, hash: &[u8]) -> BackendError {
    if err.code() == Some("WRONGTYPE") {
        corrupt(
            hash,
            "the limits of a layer are a hash; the key holds another type".into(),
        )
    } else {
        unavailable(err)
    }
}

/// Write the limit of the scope `field` (as `encode_scope` makes it) in the
/// hash at `hash` (`None`: remove it).
pub(super) async fn set<C>(
    connection: &Guarded<C>,
    hash: &[u8],
    field: &[u8],
    quota: Option<Quota>,
) -> Result<(), BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let cmd = match quota {
        Some(quota) => {
            let mut cmd = ::redis::cmd("HSET");
            cmd.arg(hash).arg(field).arg(encode_limit(quota));
            cmd
        }
        None => {
            let mut cmd = ::redis::cmd("HDEL");
            cmd.arg(hash).arg(field);
            cmd
        }
    };
    connection
        .for_write(hash)
        .call(&cmd)
        .await
        .and_then(Value::extract_error)
        .map(drop)
        .map_err(|err| failed(err, hash))
}

/// Every limit in the hash at `hash`.
pub(super) async fn read<C>(
    connection: &Guarded<C>,
    hash: &[u8],
) -> Result<StoredLimits, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut cmd = ::redis::cmd("HGETALL");
    cmd.arg(hash);
    let reply = connection
        .for_key(hash)
        .call(&cmd)
        .await
        .and_then(Value::extract_error)
        .map_err(|err| failed(err, hash))?;
    parse(reply, hash)
}

/// An `HGETALL` reply (an array of fields and values in RESP2, a map in
/// RESP3) as limits.
fn parse(reply: Value, hash: &[u8]) -> Result<StoredLimits, BackendError> {
    let mut stored = StoredLimits::new();
    let unexpected = || corrupt(hash, "HGETALL answered neither fields nor values".into());
    match reply {
        Value::Nil => {}
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err(unexpected());
            }
            for pair in items.chunks_exact(2) {
                let (Value::BulkString(field), Value::BulkString(value)) = (&pair[0], &pair[1])
                else {
                    return Err(unexpected());
                };
                stored.insert_stored(field, value);
            }
        }
        Value::Map(pairs) => {
            for (field, value) in &pairs {
                let (Value::BulkString(field), Value::BulkString(value)) = (field, value) else {
                    return Err(unexpected());
                };
                stored.insert_stored(field, value);
            }
        }
        _ => return Err(unexpected()),
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_as_limits_and_a_bad_value_is_counted() {
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let reply = Value::Array(vec![
            bulk(b"layer"),
            bulk(b"5/1000ms"),
            bulk(b"tier:pro"),
            bulk(b"0/1000ms"),
        ]);
        let stored = parse(reply, b"h").unwrap();
        assert_eq!((stored.len(), stored.corrupt()), (1, 1));
        let map = Value::Map(vec![(bulk(b"key:k"), bulk(b"7/60000ms"))]);
        assert_eq!(parse(map, b"h").unwrap().len(), 1);
        assert!(
            parse(Value::Array(vec![bulk(b"layer")]), b"h")
                .unwrap_err()
                .is_corrupt()
        );
        assert!(parse(Value::Int(3), b"h").unwrap_err().is_corrupt());
        assert!(parse(Value::Nil, b"h").unwrap().is_empty());
    }
}
