//! What Redis answers, read: the replies of the scripts, each checked for
//! its shape. A counter that holds something else than a count is
//! [`BackendError::Corrupt`], named by its storage key.

use std::num::NonZeroU64;
use std::time::Duration;

use ::redis::Value;

use crate::backend::{BackendError, Hit, Hits};

/// A counter that holds something else than a count, named by its storage
/// key.
pub(super) fn corrupt(key: &[u8], detail: String) -> BackendError {
    BackendError::Corrupt {
        key: name(key),
        detail,
    }
}

/// A counter's name in errors and audit reports: its storage key, escaped.
pub(super) fn name(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

/// The reply of the hit script: `{count, microseconds left, PEXPIRETIME}`,
/// or `{reason}` for a corrupt counter.
pub(super) fn parse_hit(value: Value, key: &[u8]) -> Result<Hit, BackendError> {
    match value {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(count), Value::Int(ttl), Value::Int(deadline)]
                if *count >= 1 && *ttl >= 0 =>
            {
                Ok(Hit {
                    count: *count as u64,
                    reset: Duration::from_millis(*ttl as u64),
                    deadline: u64::try_from(*deadline).ok().and_then(NonZeroU64::new),
                })
            }
            [Value::BulkString(reason)] => {
                Err(corrupt(key, String::from_utf8_lossy(reason).into_owned()))
            }
            _ => Err(corrupt(key, format!("unexpected script reply {items:?}"))),
        },
        other => Err(corrupt(key, format!("unexpected script reply {other:?}"))),
    }
}

/// The reply of the refund script: 1 taken back, 0 nothing to take back, or
/// `{reason}` for a corrupt counter.
pub(super) fn parse_refund(value: Value, key: &[u8]) -> Result<bool, BackendError> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(reason)] => {
                Err(corrupt(key, String::from_utf8_lossy(reason).into_owned()))
            }
            _ => Err(corrupt(key, format!("unexpected script reply {items:?}"))),
        },
        other => Err(corrupt(key, format!("unexpected script reply {other:?}"))),
    }
}

/// The reply of the peek script: `{}` no counter, `{value, PTTL}`, or
/// `{reason}` for a corrupt counter.
pub(super) fn parse_peek(value: Value, key: &[u8]) -> Result<Option<Hit>, BackendError> {
    let Value::Array(items) = value else {
        return Err(corrupt(key, format!("unexpected script reply {value:?}")));
    };
    match items.as_slice() {
        [] => Ok(None),
        [Value::BulkString(reason)] => {
            Err(corrupt(key, String::from_utf8_lossy(reason).into_owned()))
        }
        [Value::BulkString(digits), Value::Int(ttl)] => {
            let count = std::str::from_utf8(digits)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| corrupt(key, format!("value {}", digits.escape_ascii())))?;
            // A counter without a lifetime (PTTL -1) never resets by itself.
            let reset = u64::try_from(*ttl).map_or(Duration::MAX, Duration::from_millis);
            Ok(Some(Hit {
                count,
                reset,
                deadline: None,
            }))
        }
        _ => Err(corrupt(key, format!("unexpected script reply {items:?}"))),
    }
}

/// The batch script's reply, `[clock, count, deadline, count, deadline,
/// ...]`: one result per entry, the entry's last hit (its count, the
/// counter's time left and deadline). `entries` are (storage key, window,
/// hits), in the order of the call. The clock is the server's, in ms, when deadlines
/// follow; -1 (a server before 7.0) when times left follow instead. A reply
/// of another shape is given back, for the error.
pub(super) fn parse_batch(
    reply: Value,
    entries: &[(&[u8], u64, u64)],
) -> Result<Vec<Result<Hit, BackendError>>, Value> {
    let shape = match &reply {
        Value::Array(items) if items.len() == 1 + 2 * entries.len() => match items[0] {
            Value::Int(now) if now >= -1 => Some((u64::try_from(now).ok(), &items[1..])),
            _ => None,
        },
        _ => None,
    };
    let Some((clock, items)) = shape else {
        return Err(reply);
    };
    Ok(items
        .chunks_exact(2)
        .zip(entries)
        .map(|(item, (key, _, _))| parse_entry(item, clock, key))
        .collect())
}

/// One entry's two values: its last hit, or why there is none. `clock`
/// is the server's when the second value is the counter's deadline; `None`
/// when it is the time left.
fn parse_entry(item: &[Value], clock: Option<u64>, key: &[u8]) -> Result<Hit, BackendError> {
    match item {
        [Value::Int(count), Value::Int(when)] if *count >= 1 && *when >= 0 => {
            let (count, when) = (*count as u64, *when as u64);
            Ok(match clock {
                Some(now) => Hit {
                    count,
                    reset: Duration::from_millis(when.saturating_sub(now)),
                    deadline: NonZeroU64::new(when),
                },
                None => Hit {
                    count,
                    reset: Duration::from_millis(when),
                    deadline: None,
                },
            })
        }
        [Value::Int(-1), Value::BulkString(reason)] => {
            Err(corrupt(key, String::from_utf8_lossy(reason).into_owned()))
        }
        [Value::Int(-2), Value::BulkString(err)] => Err(BackendError::Unavailable(
            String::from_utf8_lossy(err).into_owned().into(),
        )),
        _ => Err(corrupt(key, format!("unexpected script reply {item:?}"))),
    }
}

/// The reply of the spend script: `[admitted, count, ms left, deadline,
/// ...]` with one triple per counter (deadline -1 when nothing was counted),
/// or `[-1, i, reason]` when counter `i` (from 1) is corrupt.
pub(super) fn parse_spend(value: Value, keys: &[&[u8]]) -> Result<Hits, BackendError> {
    let Value::Array(items) = value else {
        return Err(corrupt(
            keys.first().copied().unwrap_or_default(),
            format!("unexpected script reply {value:?}"),
        ));
    };
    let unexpected = |items: &[Value]| {
        corrupt(
            keys.first().copied().unwrap_or_default(),
            format!("unexpected script reply {items:?}"),
        )
    };
    match items.as_slice() {
        [Value::Int(-1), Value::Int(i), Value::BulkString(reason)] => {
            let key = usize::try_from(*i)
                .ok()
                .and_then(|i| keys.get(i.checked_sub(1)?))
                .copied()
                .unwrap_or_default();
            Err(corrupt(key, String::from_utf8_lossy(reason).into_owned()))
        }
        [Value::Int(admitted @ (0 | 1)), rest @ ..] if rest.len() == 3 * keys.len() => rest
            .chunks_exact(3)
            .map(|entry| match entry {
                [Value::Int(count), Value::Int(left), Value::Int(deadline)]
                    if *count >= 0 && *left >= 0 && *deadline >= -1 =>
                {
                    Ok(Hit {
                        count: *count as u64,
                        reset: Duration::from_millis(*left as u64),
                        deadline: if *admitted == 1 {
                            u64::try_from(*deadline).ok().and_then(NonZeroU64::new)
                        } else {
                            None
                        },
                    })
                }
                _ => Err(unexpected(&items)),
            })
            .collect(),
        _ => Err(unexpected(&items)),
    }
}

/// The parsers above, for the fuzz targets (`fuzz/`): built only under
/// `--cfg fuzzing`, which cargo-fuzz passes, and reached through the
/// crate's hidden `fuzzing` module.
#[cfg(fuzzing)]
pub(crate) mod fuzzing {
    use super::{BackendError, Hit, Value};

    pub(crate) fn hit(value: Value, key: &[u8]) -> Result<Hit, BackendError> {
        super::parse_hit(value, key)
    }

    pub(crate) fn refund(value: Value, key: &[u8]) -> Result<bool, BackendError> {
        super::parse_refund(value, key)
    }

    pub(crate) fn peek(value: Value, key: &[u8]) -> Result<Option<Hit>, BackendError> {
        super::parse_peek(value, key)
    }

    pub(crate) fn batch(
        reply: Value,
        entries: &[(&[u8], u64, u64)],
    ) -> Result<Vec<Result<Hit, BackendError>>, Value> {
        super::parse_batch(reply, entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replies_parse() {
        let at = NonZeroU64::new(1_700_000_060_000);
        let cases: &[(&str, Value, Result<Hit, &str>)] = &[
            (
                "fresh",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Int(60_000),
                    Value::Int(1_700_000_060_000),
                ]),
                Ok(Hit {
                    count: 1,
                    reset: Duration::from_secs(60),
                    deadline: at,
                }),
            ),
            (
                "a server without PEXPIRETIME",
                Value::Array(vec![Value::Int(2), Value::Int(5), Value::Int(-1)]),
                Ok(Hit {
                    count: 2,
                    reset: Duration::from_millis(5),
                    deadline: None,
                }),
            ),
            (
                "corrupt value",
                Value::Array(vec![Value::BulkString(b"value abc".to_vec())]),
                Err("value abc"),
            ),
            (
                "zero count",
                Value::Array(vec![Value::Int(0), Value::Int(5), Value::Int(9)]),
                Err("unexpected script reply"),
            ),
            (
                "negative ttl",
                Value::Array(vec![Value::Int(3), Value::Int(-1), Value::Int(9)]),
                Err("unexpected script reply"),
            ),
            (
                "an older script's reply",
                Value::Array(vec![Value::Int(1), Value::Int(60_000)]),
                Err("unexpected script reply"),
            ),
            (
                "not an array",
                Value::Int(7),
                Err("unexpected script reply"),
            ),
        ];
        for (name, value, want) in cases {
            match (parse_hit(value.clone(), b"tpw:n{k}"), want) {
                (Ok(hit), Ok(want)) => assert_eq!(hit, *want, "{name}"),
                (Err(BackendError::Corrupt { key, detail }), Err(want)) => {
                    assert_eq!(key, "tpw:n{k}", "{name}");
                    assert!(detail.contains(want), "{name}: {detail}");
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn refund_replies_parse() {
        let cases: &[(&str, Value, Result<bool, &str>)] = &[
            ("taken back", Value::Int(1), Ok(true)),
            ("nothing to take back", Value::Int(0), Ok(false)),
            (
                "corrupt",
                Value::Array(vec![Value::BulkString(b"value abc".to_vec())]),
                Err("value abc"),
            ),
            ("unexpected", Value::Int(2), Err("unexpected script reply")),
        ];
        for (name, value, want) in cases {
            match (parse_refund(value.clone(), b"k"), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{name}"),
                (Err(BackendError::Corrupt { detail, .. }), Err(want)) => {
                    assert!(detail.contains(want), "{name}: {detail}");
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    const KEYS: [(&[u8], u64, u64); 4] = [
        (b"tpw:n{a}", 60_000, 1),
        (b"tpw:n{b}", 60_000, 1),
        (b"tpw:n{c}", 60_000, 1),
        (b"tpw:n{d}", 60_000, 1),
    ];

    #[test]
    fn replies_parse() {
        let reply = vec![
            Value::Int(1_000),
            Value::Int(7),
            Value::Int(1_500),
            Value::Int(-2),
            text("ERR tower-pinned-window: invalid window 0"),
            // A deadline already behind the clock: no time left.
            Value::Int(2),
            Value::Int(990),
            Value::Int(-1),
            text("value abc"),
        ];
        let replies = parse_batch(Value::Array(reply), &KEYS).unwrap();
        assert_eq!(
            replies[0].as_ref().unwrap(),
            &Hit {
                count: 7,
                reset: Duration::from_millis(500),
                deadline: NonZeroU64::new(1_500),
            }
        );
        match &replies[1] {
            Err(BackendError::Unavailable(err)) => {
                assert!(err.to_string().contains("invalid window"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            replies[2].as_ref().unwrap(),
            &Hit {
                count: 2,
                reset: Duration::ZERO,
                deadline: NonZeroU64::new(990),
            }
        );
        match &replies[3] {
            Err(BackendError::Corrupt { key, detail }) => {
                assert_eq!((key.as_str(), detail.as_str()), ("tpw:n{d}", "value abc"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn before_redis_7_the_time_left_comes_without_a_deadline() {
        let reply = vec![Value::Int(-1), Value::Int(2), Value::Int(5)];
        let replies = parse_batch(Value::Array(reply), &KEYS[..1]).unwrap();
        assert_eq!(
            replies[0].as_ref().unwrap(),
            &Hit {
                count: 2,
                reset: Duration::from_millis(5),
                deadline: None,
            }
        );
    }

    #[test]
    fn unexpected_entries_are_corrupt() {
        for entry in [
            [Value::Int(0), Value::Int(5)],
            [Value::Int(3), Value::Int(-1)],
            [Value::Int(-3), text("x")],
            [Value::Int(-1), Value::Int(0)],
        ] {
            let mut reply = vec![Value::Int(1_000)];
            reply.extend(entry.iter().cloned());
            let replies = parse_batch(Value::Array(reply), &KEYS[..1]).unwrap();
            assert!(
                matches!(replies[0], Err(BackendError::Corrupt { .. })),
                "{entry:?}"
            );
        }
    }

    #[test]
    fn replies_of_another_shape_are_refused_whole() {
        for reply in [
            // A value too few, a value too many.
            vec![Value::Int(1_000), Value::Int(1)],
            vec![
                Value::Int(1_000),
                Value::Int(1),
                Value::Int(2_000),
                Value::Int(3),
            ],
            // No clock, a clock that is not one.
            vec![Value::Int(1), Value::Int(2_000)],
            vec![text("1000"), Value::Int(1), Value::Int(2_000)],
            vec![Value::Int(-5), Value::Int(1), Value::Int(2_000)],
            vec![],
        ] {
            assert!(
                parse_batch(Value::Array(reply.clone()), &KEYS[..1]).is_err(),
                "{reply:?}"
            );
        }
        // The shape before, three integers per entry, for two entries.
        let before = [7, 500, 1_500, 2, 5, 1_005].map(Value::Int).to_vec();
        assert!(parse_batch(Value::Array(before), &KEYS[..2]).is_err());
    }
}
