//! The Redis backend's readers of the replies of the scripts of slots in
//! flight, one step each: take, give-back, in use and extend, fed
//! `redis::Value` trees built from the input with `arbitrary` (every RESP2
//! and RESP3 shape but server errors, nested up to the input's length).
//!
//! Checked: no panic; a reply of the script's shape is read exactly (a
//! grant, the slots in use, the wait, whether a slot was there, the slots
//! extended and the records skipped); `{reason}` is a corrupt record named
//! by the record, with the reason as its detail; anything else is an
//! outage (`Unavailable`), never an answer and never corrupt state.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::backend::BackendError;
use tower_pinned_window_redis::fuzzing::{extend_reply, give_back_reply, in_use_reply, take_reply};
use tower_pinned_window_redis::redis::Value;

/// A `redis::Value`, as `arbitrary` can build it.
#[derive(Debug, Arbitrary)]
enum Resp {
    Nil,
    Int(i64),
    /// Small counts, codes and places, which the parsers' checks are about.
    SmallInt(i8),
    BulkString(Vec<u8>),
    Digits(u64),
    Array(Vec<Resp>),
    SimpleString(String),
    Okay,
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Double(f64),
    Boolean(bool),
    BigNumber(Vec<u8>),
}

impl From<Resp> for Value {
    fn from(resp: Resp) -> Self {
        let all = |items: Vec<Resp>| items.into_iter().map(Value::from).collect();
        match resp {
            Resp::Nil => Value::Nil,
            Resp::Int(n) => Value::Int(n),
            Resp::SmallInt(n) => Value::Int(n.into()),
            Resp::BulkString(bytes) => Value::BulkString(bytes),
            Resp::Digits(n) => Value::BulkString(n.to_string().into_bytes()),
            Resp::Array(items) => Value::Array(all(items)),
            Resp::SimpleString(text) => Value::SimpleString(text),
            Resp::Okay => Value::Okay,
            Resp::Map(pairs) => Value::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ),
            Resp::Set(items) => Value::Set(all(items)),
            Resp::Double(x) => Value::Double(x),
            Resp::Boolean(b) => Value::Boolean(b),
            Resp::BigNumber(bytes) => Value::BigNumber(bytes),
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    reply: Resp,
    /// The records of the extend's call (1 to 4).
    records: u8,
}

const RECORD: &[u8] = b"tpw:api{203.0.113.7}:slots";

/// `err` is the record's corruption exactly when `value` is `{reason}`
/// (then with that reason); an outage otherwise.
fn check_error(what: &str, value: &Value, err: &BackendError) {
    match (value, err) {
        (Value::Array(items), BackendError::Corrupt { key, detail }) => match items.as_slice() {
            [Value::BulkString(reason)] => {
                assert_eq!(key.as_bytes(), RECORD, "{what}: {value:?}");
                assert_eq!(*detail, String::from_utf8_lossy(reason), "{what}: {value:?}");
            }
            _ => panic!("{what}: corrupt from {value:?}"),
        },
        (_, BackendError::Corrupt { .. }) => panic!("{what}: corrupt from {value:?}"),
        (_, BackendError::Unavailable(_)) => {
            assert!(
                !matches!(value, Value::Array(items) if matches!(items.as_slice(), [Value::BulkString(_)])),
                "{what}: a reason read as an outage: {value:?}"
            );
        }
        (_, other) => panic!("{what}: {other:?} from {value:?}"),
    }
    let _ = err.to_string();
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let value = Value::from(input.reply);

    match take_reply(value.clone(), RECORD) {
        Ok(taken) => match &value {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(1), Value::Int(in_use)] => {
                    assert!(*in_use >= 1, "{value:?}");
                    assert!(taken.granted && taken.in_use == *in_use as u64);
                    assert_eq!(taken.retry, Duration::ZERO);
                }
                [Value::Int(0), Value::Int(in_use), Value::Int(retry)] => {
                    assert!(*in_use >= 1 && *retry >= 0, "{value:?}");
                    assert!(!taken.granted && taken.in_use == *in_use as u64);
                    assert_eq!(taken.retry, Duration::from_millis(*retry as u64));
                }
                _ => panic!("a take {taken:?} read from {value:?}"),
            },
            _ => panic!("a take {taken:?} read from {value:?}"),
        },
        Err(err) => check_error("take", &value, &err),
    }

    match give_back_reply(value.clone(), RECORD) {
        Ok(found) => assert_eq!(value, Value::Int(i64::from(found)), "{value:?}"),
        Err(err) => check_error("give-back", &value, &err),
    }

    match in_use_reply(value.clone(), RECORD) {
        Ok(n) => assert!(
            matches!(value, Value::Int(sent) if sent >= 0 && sent as u64 == n),
            "{n} in use read from {value:?}"
        ),
        Err(err) => check_error("in use", &value, &err),
    }

    // An extend's reply is never a reason: every error is an outage.
    let records = usize::from(input.records % 4) + 1;
    match extend_reply(value.clone(), records, RECORD) {
        Ok((slots, corrupt)) => {
            let Value::Array(items) = &value else {
                panic!("an extend read from {value:?}");
            };
            let [Value::Int(sent), places @ ..] = items.as_slice() else {
                panic!("an extend read from {value:?}");
            };
            assert!(*sent >= 0 && *sent as u64 == slots, "{value:?}");
            let places: Vec<usize> = places
                .iter()
                .map(|place| match place {
                    Value::Int(p) if *p >= 1 && (*p as usize) <= records => *p as usize - 1,
                    other => panic!("a place {other:?} read from {value:?}"),
                })
                .collect();
            assert_eq!(corrupt, places, "{value:?}");
            assert!(corrupt.windows(2).all(|w| w[0] < w[1]), "each once, in order");
        }
        Err(err) => {
            assert!(matches!(err, BackendError::Unavailable(_)), "{err:?} from {value:?}");
            let _ = err.to_string();
        }
    }
});
