//! Slots on leases, in the table beside the counters' (`{table}_slots`):
//! the statements of [`Leasing`](tower_pinned_window::backend::Leasing),
//! one round trip each, and what their rows say. The design (a record per
//! key, each step one statement under its row lock) is in the crate docs,
//! "Requests in flight".

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::row::describe;
use tower_pinned_window::Window;
use tower_pinned_window::backend::toolkit::storage_key::SLOTS;
use tower_pinned_window::backend::{BackendError, InFlight, SlotId, Taken};
use tower_pinned_window::key::Key;

/// What a record that is not of the store's shape is said to be.
const NOT_A_RECORD: &str = "not a record of slots this backend writes (a name that is not 32 \
     lowercase hex digits or is there twice, a slot without a lease, a lease past the record's \
     expires_at, or no usable expires_at)";

/// How a key's record of slots is named in errors, logs and audits: the
/// slots' table, then the key's storage key for its slots
/// ([`storage_key::encode_slots`](tower_pinned_window::backend::toolkit::storage_key::encode_slots):
/// `api{203.0.113.7}:slots`).
pub(super) fn describe_slots(db: &Db, namespace: &str, key: &[u8]) -> String {
    let mut name = describe(&db.sql.slots_table, namespace, key);
    name.push_str(&String::from_utf8_lossy(SLOTS));
    name
}

/// The error for the key's record of slots that is not of the store's
/// shape.
pub(super) fn corrupt(db: &Db, namespace: &str, key: &[u8]) -> BackendError {
    BackendError::Corrupt {
        key: describe_slots(db, namespace, key),
        detail: NOT_A_RECORD.to_owned(),
    }
}

/// A window in milliseconds, as the statements take it: [`Window::MAX`]
/// keeps every one inside an `i64`.
pub(super) fn millis(window: Window) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

/// `take.sql`: the slot `slot` of `key` under `namespace`, capped by `cap`.
pub(super) async fn take(
    db: Arc<Db>,
    namespace: Box<str>,
    key: Key,
    cap: InFlight,
    slot: SlotId,
) -> Result<Taken, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.take)
        .await
        .map_err(pg_error)?;
    let max = i64::try_from(cap.max()).unwrap_or(i64::MAX);
    let row = client
        .query_opt(
            &statement,
            &[
                &&*namespace,
                &key.as_bytes(),
                &slot.to_string(),
                &max,
                &millis(cap.lease()),
            ],
        )
        .await
        .map_err(pg_error)?;
    match row {
        Some(row) => Ok(taken(&row)),
        // The ON CONFLICT's WHERE refused the record: corrupt.
        None => Err(corrupt(&db, &namespace, key.as_bytes())),
    }
}

/// What a take's row (granted, in use, the earliest lease, now) says.
fn taken(row: &Row) -> Taken {
    let granted: bool = row.get(0);
    let in_use: i64 = row.get(1);
    let earliest: Option<SystemTime> = row.get(2);
    let now: SystemTime = row.get(3);
    let retry = match (granted, earliest) {
        (false, Some(earliest)) => earliest.duration_since(now).unwrap_or(Duration::ZERO),
        _ => Duration::ZERO,
    };
    Taken {
        granted,
        in_use: in_use.max(0) as u64,
        retry,
    }
}

/// `give_back.sql`: whether `slot` was held, with a live lease, and is
/// given back now.
pub(super) async fn give_back(
    db: Arc<Db>,
    namespace: Box<str>,
    key: Key,
    slot: SlotId,
) -> Result<bool, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.give_back)
        .await
        .map_err(pg_error)?;
    let row = client
        .query_one(
            &statement,
            &[&&*namespace, &key.as_bytes(), &slot.to_string()],
        )
        .await
        .map_err(pg_error)?;
    let (given, bad): (bool, bool) = (row.get(0), row.get(1));
    if bad {
        return Err(corrupt(&db, &namespace, key.as_bytes()));
    }
    Ok(given)
}

/// One slot to extend: the namespace, the key, the slot's name.
pub(super) type HeldSlot = (Box<str>, Key, String);

/// `extend.sql`: every slot of `held` still live moved to at least
/// `now + lease`, in one statement; the number extended. A record named
/// that is not of the store's shape fails the call, after the others were
/// extended.
pub(super) async fn extend(
    db: Arc<Db>,
    held: Vec<HeldSlot>,
    lease: Window,
) -> Result<u64, BackendError> {
    if held.is_empty() {
        return Ok(0);
    }
    let namespaces: Vec<&str> = held.iter().map(|(n, _, _)| &**n).collect();
    let keys: Vec<&[u8]> = held.iter().map(|(_, k, _)| k.as_bytes()).collect();
    let slots: Vec<&str> = held.iter().map(|(_, _, s)| s.as_str()).collect();
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.extend)
        .await
        .map_err(pg_error)?;
    let row = client
        .query_one(&statement, &[&namespaces, &keys, &slots, &millis(lease)])
        .await
        .map_err(pg_error)?;
    let extended: i64 = row.get(0);
    let bad: (Option<String>, Option<Vec<u8>>) = (row.get(1), row.get(2));
    if let (Some(namespace), Some(key)) = bad {
        return Err(corrupt(&db, &namespace, &key));
    }
    Ok(extended.max(0) as u64)
}

/// `in_use.sql`: the live slots of `key` under `namespace`.
pub(super) async fn in_use(db: &Db, namespace: &str, key: &Key) -> Result<u64, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.in_use)
        .await
        .map_err(pg_error)?;
    let row = client
        .query_opt(&statement, &[&namespace, &key.as_bytes()])
        .await
        .map_err(pg_error)?;
    match row {
        None => Ok(0),
        Some(row) if row.get::<_, bool>(1) => Err(corrupt(db, namespace, key.as_bytes())),
        Some(row) => Ok(row.get::<_, i64>(0).max(0) as u64),
    }
}
