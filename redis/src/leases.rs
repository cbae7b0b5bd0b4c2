//! Slots in flight ([`Leasing`](tower_pinned_window::backend::Leasing)):
//! each of take, give back, extend and in use as one call of its script
//! (`take.lua`, `give_back.lua`, `extend.lua`, `in_use.lua`, each after
//! `slots.lua`, the record's shape and its corrupt check). Takes and
//! give-backs go through the lanes by default (`takes.rs`), which send a
//! step alone with these calls.
//!
//! A key's slots are a sorted set beside its counters
//! (`storage_key::encode_slots`: the pair's storage key and `:slots`, in the
//! same Cluster slot): a member per slot, its name's 32 hex digits, scored
//! by its lease's end in Unix milliseconds on the server's clock (`TIME` in
//! the script), so every instance reads one clock. An extend names the
//! records of many keys: they go in one call on a standalone server or
//! Sentinel, in one call per hash slot on a Cluster, the calls sent
//! together.

use std::sync::atomic::{AtomicBool, Ordering};

use ::redis::aio::ConnectionLike;
use ::redis::{RedisResult, Value};
use futures_util::future::join_all;
use hashbrown::HashMap;
use smallvec::SmallVec;

use super::connection::classify::{is_cross_slot, unavailable};
use super::connection::guarded::Guarded;
use super::connection::slot::key_slot;
use super::reply::{self, Extended, parse_extend, parse_give_back, parse_in_use, parse_take};
use super::script::{EXTEND, GIVE_BACK, IN_USE, Size, TAKE, U64_DIGITS};
use tower_pinned_window::Window;
use tower_pinned_window::backend::{BackendError, InFlight, SlotId, Taken};

/// Bytes of a slot's name (its [`Display`](std::fmt::Display)).
pub(super) const SLOT_DIGITS: usize = 32;

/// A slot's name as the scripts read it: its 32 lowercase hex digits (its
/// [`Display`](std::fmt::Display)), with no allocation.
pub(super) fn slot_name(slot: SlotId) -> [u8; SLOT_DIGITS] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let id = slot.as_u128();
    std::array::from_fn(|at| HEX[(id >> (4 * (SLOT_DIGITS - 1 - at)) & 0xf) as usize])
}

/// Take `slot` of `in_flight` in the record at `record`, in one atomic step.
pub(super) async fn take<C>(
    connection: &Guarded<C>,
    record: &[u8],
    in_flight: InFlight,
    slot: SlotId,
) -> Result<Taken, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let reply = take_call(connection, record, in_flight, slot)
        .await
        .map_err(unavailable)?;
    parse_take(reply, record)
}

/// The take script's call for `slot` of `in_flight` in the record at
/// `record`: its reply, read by [`parse_take`].
pub(super) async fn take_call<C>(
    connection: &Guarded<C>,
    record: &[u8],
    in_flight: InFlight,
    slot: SlotId,
) -> RedisResult<Value>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let name = slot_name(slot);
    let size = Size {
        keys: 1,
        args: 4,
        bytes: record.len() + SLOT_DIGITS + 2 * U64_DIGITS,
    };
    TAKE.run(&mut connection.for_write(record), size, |cmd| {
        cmd.arg(record)
            .arg(&name[..])
            .arg(in_flight.max())
            .arg(in_flight.lease().as_millis());
    })
    .await
}

/// Give `slot` back to the record at `record`: whether it was there.
pub(super) async fn give_back<C>(
    connection: &Guarded<C>,
    record: &[u8],
    slot: SlotId,
) -> Result<bool, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let reply = give_back_call(connection, record, slot)
        .await
        .map_err(unavailable)?;
    parse_give_back(reply, record)
}

/// The give-back script's call for `slot` in the record at `record`: its
/// reply, read by [`parse_give_back`].
pub(super) async fn give_back_call<C>(
    connection: &Guarded<C>,
    record: &[u8],
    slot: SlotId,
) -> RedisResult<Value>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let name = slot_name(slot);
    let size = Size {
        keys: 1,
        args: 2,
        bytes: record.len() + SLOT_DIGITS,
    };
    GIVE_BACK
        .run(&mut connection.for_write(record), size, |cmd| {
            cmd.arg(record).arg(&name[..]);
        })
        .await
}

/// The live slots of the record at `record`.
pub(super) async fn in_use<C>(connection: &Guarded<C>, record: &[u8]) -> Result<u64, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let reply = IN_USE
        .run(
            &mut connection.for_key(record),
            Size::one_key(record),
            |cmd| {
                cmd.arg(record);
            },
        )
        .await
        .map_err(unavailable)?;
    parse_in_use(reply, record)
}

/// The slots an extend names, by record: each record once, in the order
/// first named, with its slots.
#[derive(Debug, Default)]
pub(super) struct Records {
    records: Vec<(Vec<u8>, SmallVec<[SlotId; 1]>)>,
    /// A record's place in `records`.
    places: HashMap<Vec<u8>, usize>,
}

impl Records {
    /// `slot`, held in the record at `record`.
    pub(super) fn add(&mut self, record: Vec<u8>, slot: SlotId) {
        let place = *self.places.entry(record).or_insert_with_key(|record| {
            self.records.push((record.clone(), SmallVec::new()));
            self.records.len() - 1
        });
        self.records[place].1.push(slot);
    }

    /// The records, in one call per hash slot (a Cluster), each call's
    /// records by their places.
    fn by_hash_slot(&self) -> Vec<SmallVec<[usize; 1]>> {
        let mut by_hash_slot: HashMap<u16, usize> = HashMap::new();
        let mut calls: Vec<SmallVec<[usize; 1]>> = Vec::new();
        for (place, (record, _)) in self.records.iter().enumerate() {
            let call = *by_hash_slot.entry(key_slot(record)).or_insert_with(|| {
                calls.push(SmallVec::new());
                calls.len() - 1
            });
            calls[call].push(place);
        }
        calls
    }
}

/// Extend the slots of `records` that are still live to `now + lease`,
/// their records' lifetimes to at least that: the slots extended. One call
/// for all the records, or, when `by_slot` says so (a Cluster), one per
/// hash slot, sent together; a call refused as cross-slot (nothing ran) is
/// sent again by slot, and `by_slot` learns it. A record that is not one is
/// skipped (logged, left as it is, not counted); the others are extended.
/// A call that fails fails the extend: the calls that went through did
/// extend, and extending again is harmless.
pub(super) async fn extend<C>(
    connection: &Guarded<C>,
    by_slot: &AtomicBool,
    records: &Records,
    lease: Window,
) -> Result<u64, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if records.records.is_empty() {
        return Ok(0);
    }
    if !by_slot.load(Ordering::Relaxed) {
        let all: SmallVec<[usize; 1]> = (0..records.records.len()).collect();
        match extend_call(connection, records, &all, lease).await {
            Err(err) if is_cross_slot(&err) => {
                // Nothing ran: a Cluster, by slot from now on.
                tracing::debug!("records of several slots in one extend: by slot from now on");
                by_slot.store(true, Ordering::Relaxed);
            }
            result => return answered(records, &all, result),
        }
    }
    let calls = records.by_hash_slot();
    let results = join_all(
        calls
            .iter()
            .map(|call| extend_call(connection, records, call, lease)),
    )
    .await;
    let mut extended = 0;
    for (call, result) in calls.iter().zip(results) {
        extended += answered(records, call, result)?;
    }
    Ok(extended)
}

/// One call of the extend script, on the records of `call` (places in
/// `records`): its reply, read by [`answered`].
async fn extend_call<C>(
    connection: &Guarded<C>,
    records: &Records,
    call: &[usize],
    lease: Window,
) -> RedisResult<Value>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let of_call = || call.iter().map(|&place| &records.records[place]);
    let slots: usize = of_call().map(|(_, slots)| slots.len()).sum();
    let size = Size {
        keys: call.len(),
        args: 2 * call.len() + 1 + slots,
        bytes: of_call()
            .map(|(record, _)| record.len() + U64_DIGITS)
            .sum::<usize>()
            + U64_DIGITS
            + slots * SLOT_DIGITS,
    };
    let (first, _) = &records.records[call[0]];
    EXTEND
        .run(&mut connection.for_write(first), size, |cmd| {
            for (record, _) in of_call() {
                cmd.arg(record.as_slice());
            }
            cmd.arg(lease.as_millis());
            for (_, slots) in of_call() {
                cmd.arg(slots.len());
                for &slot in slots {
                    cmd.arg(&slot_name(slot)[..]);
                }
            }
        })
        .await
}

/// The slots one extend call on the records of `call` extended, its
/// corrupt records logged.
fn answered(
    records: &Records,
    call: &[usize],
    reply: RedisResult<Value>,
) -> Result<u64, BackendError> {
    let (first, _) = &records.records[call[0]];
    let Extended { slots, corrupt } = parse_extend(reply.map_err(unavailable)?, call.len(), first)?;
    for &at in &corrupt {
        let (record, _) = &records.records[call[at]];
        tracing::warn!(
            key = %reply::name(record),
            "a record of slots in flight that is not one: its slots were not extended, and it was left as it is"
        );
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str) -> Vec<u8> {
        format!("tpw:n{{{key}}}:slots").into_bytes()
    }

    #[test]
    fn slot_names_are_their_32_digits() {
        assert_eq!(
            &slot_name(SlotId::from_u128(0xabc)),
            b"00000000000000000000000000000abc"
        );
        for slot in [0, 1, u128::MAX, SlotId::next().as_u128()].map(SlotId::from_u128) {
            assert_eq!(
                &slot_name(slot)[..],
                slot.to_string().as_bytes(),
                "{slot:?}"
            );
        }
    }

    #[test]
    fn an_extend_names_each_record_once_and_groups_calls_by_hash_slot() {
        let mut records = Records::default();
        let (a, b, c) = (
            SlotId::from_u128(1),
            SlotId::from_u128(2),
            SlotId::from_u128(3),
        );
        records.add(record("x"), a);
        records.add(record("y"), b);
        records.add(record("x"), c);
        assert_eq!(records.records.len(), 2);
        assert_eq!(records.records[0].1.as_slice(), [a, c]);
        assert_eq!(records.records[1].1.as_slice(), [b]);
        // "x" and "y" are in different hash slots; "{x}" shares x's.
        assert_ne!(key_slot(&record("x")), key_slot(&record("y")));
        records.add(b"tpw:other{x}:slots".to_vec(), SlotId::from_u128(4));
        let calls: Vec<Vec<usize>> = records
            .by_hash_slot()
            .into_iter()
            .map(|call| call.to_vec())
            .collect();
        assert_eq!(calls, [vec![0, 2], vec![1]]);
    }
}
