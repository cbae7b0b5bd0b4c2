//! The Redis backend's reader of the slots' batch script's reply (takes and
//! give-backs of many keys in one call): `[answers, place, reason, ...]`,
//! three big-endian i64 per step, with the steps' kinds, the packed
//! numbers, the refused places and reasons (any `redis::Value`) built from
//! the input with `arbitrary`.
//!
//! Checked: no panic; a reply of another shape is given back whole; one of
//! the script's shape gives one result per step, each read exactly as the
//! script wrote it (a take's grant, in use and wait; a give-back's whether
//! the slot was there), a corrupt record only for code -1 with its reason,
//! and anything else an outage, never an answer.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::backend::BackendError;
use tower_pinned_window_redis::fuzzing::slots_batch_reply;
use tower_pinned_window_redis::redis::Value;

/// A `redis::Value` in a refused step's place or reason, as `arbitrary`
/// can build it (flat: the batch's shape is about the top level).
#[derive(Debug, Arbitrary)]
enum Resp {
    Nil,
    Int(i64),
    /// Places within a small batch.
    Place(i8),
    BulkString(Vec<u8>),
    SimpleString(String),
    Array(Vec<i8>),
    Double(f64),
}

impl From<Resp> for Value {
    fn from(resp: Resp) -> Self {
        match resp {
            Resp::Nil => Value::Nil,
            Resp::Int(n) => Value::Int(n),
            Resp::Place(n) => Value::Int(n.into()),
            Resp::BulkString(bytes) => Value::BulkString(bytes),
            Resp::SimpleString(text) => Value::SimpleString(text),
            Resp::Array(items) => {
                Value::Array(items.into_iter().map(|n| Value::Int(n.into())).collect())
            }
            Resp::Double(x) => Value::Double(x),
        }
    }
}

/// A number of a step's answer: small ones (codes, counts) most often.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Num {
    Small(i8),
    Any(i64),
}

impl Num {
    fn get(self) -> i64 {
        match self {
            Self::Small(n) => n.into(),
            Self::Any(n) => n,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// Each step's kind: a take (`true`) or a give-back; at most 8 used.
    takes: Vec<bool>,
    /// The packed answers: (code, in use, ms) each.
    packed: Vec<(Num, Num, Num)>,
    /// Whether the packed answers are cut or padded to the expected length.
    sized: bool,
    /// Something before the packed answers (a reply of another shape).
    head: Option<Resp>,
    /// The refused steps' (place, reason) pairs, and one more item.
    refused: Vec<(Resp, Resp)>,
    odd: Option<Resp>,
}

const RECORD: &[u8] = b"tpw:api{203.0.113.7}:slots";

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let takes: Vec<bool> = input.takes.iter().copied().take(8).collect();
    let mut packed: Vec<u8> = input
        .packed
        .iter()
        .flat_map(|(a, b, c)| [a.get(), b.get(), c.get()])
        .flat_map(i64::to_be_bytes)
        .collect();
    if input.sized {
        packed.resize(24 * takes.len(), 0);
    }
    let mut items: Vec<Value> = input.head.into_iter().map(Value::from).collect();
    items.push(Value::BulkString(packed.clone()));
    for (place, reason) in input.refused {
        items.push(place.into());
        items.push(reason.into());
    }
    items.extend(input.odd.map(Value::from));
    let reply = Value::Array(items.clone());

    let results = match slots_batch_reply(reply.clone(), &takes, RECORD) {
        Err(back) => {
            // Compared as printed: a NaN is not equal to itself.
            assert_eq!(format!("{back:?}"), format!("{reply:?}"), "given back whole");
            return;
        }
        Ok(results) => results,
    };
    assert!(matches!(items.first(), Some(Value::BulkString(_))), "{reply:?} read");
    assert_eq!(packed.len(), 24 * takes.len(), "{reply:?} read");
    assert_eq!(results.len(), takes.len(), "one result per step");
    assert!(items.len() % 2 == 1, "places and reasons in pairs: {reply:?}");
    // Each refused step's reason, as the parser finds it: the first pair
    // naming it.
    let reason_of = |at: usize| {
        items[1..].chunks_exact(2).find_map(|pair| match pair {
            [Value::Int(place), Value::BulkString(reason)] if *place == at as i64 + 1 => {
                Some(reason.clone())
            }
            [Value::Int(_), Value::BulkString(_)] => None,
            other => panic!("a pair {other:?} read in {reply:?}"),
        })
    };
    for (at, ((result, step), take)) in results
        .iter()
        .zip(packed.chunks_exact(24))
        .zip(&takes)
        .enumerate()
    {
        let num = |i: usize| i64::from_be_bytes(step[8 * i..8 * i + 8].try_into().unwrap());
        let (code, in_use, ms) = (num(0), num(1), num(2));
        let reason = reason_of(at);
        match result {
            Ok(taken) => {
                assert!(reason.is_none(), "step {at}: a reason and an answer");
                if *take {
                    assert!(in_use >= 1 && (code == 1 || code == 0), "step {at}: {taken:?}");
                    assert_eq!(taken.granted, code == 1);
                    assert_eq!(taken.in_use, in_use as u64);
                    if code == 1 {
                        assert_eq!(ms, 0, "step {at}: a grant with a wait");
                    }
                    assert!(ms >= 0);
                    assert_eq!(taken.retry, Duration::from_millis(ms as u64));
                } else {
                    assert!((code == 1 || code == 0) && in_use == 0 && ms == 0, "step {at}");
                    assert_eq!(taken.granted, code == 1);
                    assert_eq!((taken.in_use, taken.retry), (0, Duration::ZERO));
                }
            }
            Err(BackendError::Corrupt { key, detail }) => {
                assert_eq!(code, -1, "step {at}: corrupt");
                assert_eq!((in_use, ms), (0, 0), "step {at}");
                assert_eq!(key.as_bytes(), RECORD);
                let reason = reason.expect("a corrupt step has its reason");
                assert_eq!(*detail, String::from_utf8_lossy(&reason));
            }
            Err(BackendError::Unavailable(err)) => {
                let _ = err.to_string();
            }
            Err(other) => panic!("step {at}: {other:?}"),
        }
    }
});
