//! The Redis backend's reply parsers: the hit, amend, spend, take-all,
//! peek, close and raise scripts' replies, and the batch script's, fed
//! `redis::Value` trees built from the input with `arbitrary` (every RESP2
//! and RESP3 shape but server errors, nested up to the input's length).
//!
//! Checked: no panic; a reply of the expected shape is read exactly (its
//! count, its time left, its deadline), and anything else is an error: a
//! malformed reply never gives a count, nor a wrong one. A batch gives one
//! result per entry, or the reply back whole. A close or a raise answered
//! `{reason}` is the counter's corruption, with that reason; any other
//! shape is an outage, never corrupt state.
#![no_main]

use std::num::NonZeroU64;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::backend::BackendError;
use tower_pinned_window_redis::fuzzing::{
    batch_reply as redis_batch_reply, close_reply as redis_close_reply,
    hit_reply as redis_hit_reply, peek_reply as redis_peek_reply, raise_reply as redis_raise_reply,
    refund_reply as redis_refund_reply, spend_reply as redis_spend_reply,
    take_all_reply as redis_take_all_reply,
};
use tower_pinned_window_redis::redis::Value;

/// A `redis::Value`, as `arbitrary` can build it.
#[derive(Debug, Arbitrary)]
enum Resp {
    Nil,
    Int(i64),
    /// Small counts and times, which the parsers' checks are about.
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
    single: Resp,
    /// The batch's entries: (window, hits) each; at most 8 are used.
    entries: Vec<(u64, u64)>,
    /// The packed answers: (count, deadline) each.
    packed: Vec<(i64, i64)>,
    /// Whether the packed answers are cut or padded to the expected length.
    sized: bool,
    clock: i64,
    /// The refused entries' (place, reason) pairs.
    batch: Vec<(Resp, Resp)>,
}

const KEY: &[u8] = b"tpw:api{203.0.113.7}";

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let single = Value::from(input.single);

    match redis_hit_reply(single.clone(), KEY) {
        Ok(hit) => match &single {
            Value::Array(items)
                if matches!(
                    items.as_slice(),
                    [Value::Int(_), Value::Int(_), Value::Int(_)]
                ) =>
            {
                let [Value::Int(count), Value::Int(ttl), Value::Int(deadline)] = items.as_slice()
                else {
                    unreachable!()
                };
                assert!(*count >= 1 && *ttl >= 0, "{single:?}");
                assert_eq!(hit.count, *count as u64);
                assert_eq!(hit.reset, Duration::from_millis(*ttl as u64));
                assert_eq!(
                    hit.deadline,
                    u64::try_from(*deadline).ok().and_then(NonZeroU64::new)
                );
            }
            _ => panic!("a hit {hit:?} read from {single:?}"),
        },
        Err(err) => {
            let _ = err.to_string();
        }
    }

    // The amend reply for one amend: [codes, reason...], a code a byte.
    match redis_refund_reply(single.clone(), KEY) {
        Ok(Ok(taken)) => assert!(
            matches!(&single, Value::Array(v)
                if matches!(v.as_slice(), [Value::BulkString(c)] if c == &[u8::from(taken)])),
            "refund {taken} read from {single:?}"
        ),
        Ok(Err(err)) => {
            assert!(
                matches!(&single, Value::Array(v)
                    if matches!(v.as_slice(), [Value::BulkString(c), _] if c.len() == 1 && c[0] > 1)),
                "{single:?}"
            );
            let _ = err.to_string();
        }
        Err(back) => assert_eq!(format!("{back:?}"), format!("{single:?}")),
    }

    // The spend reply, read for requests of 1, 2 and 1 counters: what is
    // read has every counter of its request, with a count and a time left
    // as sent.
    let sizes = [1, 2, 1];
    if let Ok(spent) = redis_spend_reply(single.clone(), &sizes) {
        assert_eq!(spent.len(), sizes.len(), "{single:?}");
        for (request, n) in spent.iter().zip(sizes) {
            if let Some(counters) = request {
                assert_eq!(counters.len(), n, "{single:?}");
            }
        }
    }

    // The take-all reply, read for requests of 1, 2 and 1 counters: what
    // is read has every counter of its request, and the cap's answer as
    // the script can give it (a grant with its slot in use and no wait, a
    // refusal with slots in use).
    if let Ok(took) = redis_take_all_reply(single.clone(), &sizes) {
        assert_eq!(took.len(), sizes.len(), "{single:?}");
        for (request, n) in took.iter().zip(sizes) {
            if let Some((taken, counters)) = request {
                assert_eq!(counters.len(), n, "{single:?}");
                if let Some(taken) = taken {
                    assert!(taken.in_use >= 1, "{single:?}");
                    if taken.granted {
                        assert_eq!(taken.retry, Duration::ZERO, "{single:?}");
                    }
                }
            }
        }
    }

    match redis_peek_reply(single.clone(), KEY) {
        Ok(None) => assert!(
            matches!(&single, Value::Array(v) if v.is_empty()),
            "{single:?}"
        ),
        Ok(Some(hit)) => match &single {
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(digits), Value::Int(ttl)] => {
                    let text = std::str::from_utf8(digits).expect("digits are text");
                    assert_eq!(text.parse::<u64>(), Ok(hit.count), "{single:?}");
                    let reset = u64::try_from(*ttl).map_or(Duration::MAX, Duration::from_millis);
                    assert_eq!(hit.reset, reset);
                    assert_eq!(hit.deadline, None);
                }
                _ => panic!("a peek {hit:?} read from {single:?}"),
            },
            _ => panic!("a peek {hit:?} read from {single:?}"),
        },
        Err(err) => {
            let _ = err.to_string();
        }
    }

    // The provider's word: a close answers {ms left}, a raise {count as
    // digits, ms left or -1, deadline}; {reason} is the counter's
    // corruption; anything else an outage.
    let reason = |err: &BackendError| match (&single, err) {
        (Value::Array(items), BackendError::Corrupt { key, detail }) => match items.as_slice() {
            [Value::BulkString(reason)] => {
                assert_eq!(key.as_bytes(), KEY, "{single:?}");
                assert_eq!(*detail, String::from_utf8_lossy(reason), "{single:?}");
            }
            _ => panic!("corrupt from {single:?}"),
        },
        (_, BackendError::Corrupt { .. }) => panic!("corrupt from {single:?}"),
        (_, BackendError::Unavailable(_)) => assert!(
            !matches!(&single, Value::Array(v) if matches!(v.as_slice(), [Value::BulkString(_)])),
            "a reason read as an outage: {single:?}"
        ),
        (_, other) => panic!("{other:?} from {single:?}"),
    };
    match redis_close_reply(single.clone(), KEY) {
        Ok(left) => assert!(
            matches!(&single, Value::Array(v)
                if matches!(v.as_slice(), [Value::Int(ms)]
                    if *ms >= 0 && Duration::from_millis(*ms as u64) == left)),
            "a close {left:?} read from {single:?}"
        ),
        Err(err) => {
            reason(&err);
            let _ = err.to_string();
        }
    }
    match redis_raise_reply(single.clone(), KEY) {
        Ok(hit) => {
            let Value::Array(items) = &single else {
                panic!("a raise {hit:?} read from {single:?}");
            };
            let [
                Value::BulkString(digits),
                Value::Int(left),
                Value::Int(deadline),
            ] = items.as_slice()
            else {
                panic!("a raise {hit:?} read from {single:?}");
            };
            assert!(digits.iter().all(u8::is_ascii_digit), "{single:?}");
            let text = std::str::from_utf8(digits).expect("digits are text");
            assert_eq!(text.parse::<u64>(), Ok(hit.count), "{single:?}");
            assert!(*left >= -1, "{single:?}");
            let reset = u64::try_from(*left).map_or(Duration::MAX, Duration::from_millis);
            assert_eq!(hit.reset, reset, "{single:?}");
            assert_eq!(
                hit.deadline,
                u64::try_from(*deadline).ok().and_then(NonZeroU64::new),
                "{single:?}"
            );
        }
        Err(err) => {
            reason(&err);
            let _ = err.to_string();
        }
    }

    // The batch: [clock, packed answers, place, reason, ...], with two
    // big-endian i64 per entry in the packed answers.
    let entries: Vec<(&[u8], u64, u64)> = input
        .entries
        .iter()
        .take(8)
        .map(|&(window, hits)| (KEY, window, hits))
        .collect();
    let mut packed: Vec<u8> = input
        .packed
        .iter()
        .flat_map(|(count, when)| count.to_be_bytes().into_iter().chain(when.to_be_bytes()))
        .collect();
    if input.sized {
        packed.resize(16 * entries.len(), 0);
    }
    let mut items = vec![Value::Int(input.clock), Value::BulkString(packed.clone())];
    for (place, reason) in input.batch {
        items.push(place.into());
        items.push(reason.into());
    }
    let reply = Value::Array(items.clone());
    match redis_batch_reply(reply.clone(), &entries) {
        Err(back) => {
            // Compared as printed: a NaN is not equal to itself.
            assert_eq!(
                format!("{back:?}"),
                format!("{reply:?}"),
                "the reply is given back whole"
            );
        }
        Ok(results) => {
            assert_eq!(packed.len(), 16 * entries.len(), "{reply:?} read");
            assert!(input.clock >= -1);
            assert_eq!(results.len(), entries.len(), "one result per entry");
            let clock = u64::try_from(input.clock).ok();
            for (result, pair) in results.iter().zip(packed.chunks_exact(16)) {
                let count = i64::from_be_bytes(pair[..8].try_into().unwrap());
                let when = i64::from_be_bytes(pair[8..].try_into().unwrap());
                match result {
                    Ok(hit) => {
                        assert!(count >= 1 && when >= 0, "{pair:?} read as {hit:?}");
                        assert_eq!(hit.count, count as u64, "{pair:?}: a wrong count");
                        let when = when as u64;
                        match clock {
                            Some(now) => {
                                assert_eq!(
                                    hit.reset,
                                    Duration::from_millis(when.saturating_sub(now))
                                );
                                assert_eq!(hit.deadline, NonZeroU64::new(when));
                            }
                            None => {
                                assert_eq!(hit.reset, Duration::from_millis(when));
                                assert_eq!(hit.deadline, None);
                            }
                        }
                    }
                    Err(err) => {
                        let _ = err.to_string();
                    }
                }
            }
        }
    }
});
