//! What Redis answers, read: the replies of the scripts, each checked for
//! its shape. A counter that holds something else than a count is
//! [`BackendError::Corrupt`], named by its storage key.

use std::num::NonZeroU64;
use std::time::Duration;

use ::redis::Value;

use smallvec::SmallVec;

use tower_pinned_window::backend::{BackendError, Hit, Taken};

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

/// The amend script's reply, `[codes, reason, ...]`: a signed byte per
/// amend, in order (1 changed, 0 nothing to change, -1 a corrupt counter,
/// left as it is, -2 invalid arguments), then the reason of each amend
/// answered -1 or -2, in order. `counters`: the amends' storage keys, in
/// order. A reply of another shape is given back, for the error.
pub(super) fn parse_amends(
    value: Value,
    counters: &[&[u8]],
) -> Result<Vec<Result<bool, BackendError>>, Value> {
    let Some((codes, reasons)) = amends_shape(&value, counters.len()) else {
        return Err(value);
    };
    let mut reasons = reasons.iter();
    Ok(codes
        .iter()
        .zip(counters)
        .map(|(&code, key)| match code as i8 {
            1 => Ok(true),
            0 => Ok(false),
            code => {
                let reason = match reasons.next() {
                    Some(Value::BulkString(reason)) => String::from_utf8_lossy(reason),
                    _ => unreachable!("counted by amends_shape"),
                };
                match code {
                    -1 => Err(corrupt(key, reason.into_owned())),
                    -2 => Err(BackendError::Unavailable(reason.into_owned().into())),
                    other => Err(corrupt(key, format!("unexpected script reply {other}"))),
                }
            }
        })
        .collect())
}

/// The codes and reasons of an amend reply for `n` amends: a code per
/// amend, and a reason (a string) for each one that is neither 1 nor 0.
fn amends_shape(value: &Value, n: usize) -> Option<(&[u8], &[Value])> {
    let Value::Array(items) = value else {
        return None;
    };
    let [Value::BulkString(codes), reasons @ ..] = items.as_slice() else {
        return None;
    };
    let refused = codes.iter().filter(|&&code| code > 1).count();
    let strings = reasons.iter().all(|r| matches!(r, Value::BulkString(_)));
    (codes.len() == n && reasons.len() == refused && strings).then_some((codes, reasons))
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

/// The batch script's reply, `[clock, answers, place, reason, ...]`: one
/// result per entry, the entry's last hit (its count, the counter's time
/// left and deadline). `answers` holds two signed 64-bit big-endian
/// integers per entry (count and deadline, or a code of -1 or -2 and 0 for
/// an entry refused, whose place, from 1, and reason follow), appended to
/// `into`. There are `n` entries, in the order of the call, `key_of` each
/// one's storage key (for a corrupt one's error). The clock is
/// the server's, in ms, when deadlines follow; -1 (a server before 7.0)
/// when times left follow instead. A reply of another shape is given back,
/// for the error.
pub(super) fn parse_batch<'k>(
    reply: Value,
    n: usize,
    key_of: impl Fn(usize) -> &'k [u8],
    into: &mut Vec<Result<Hit, BackendError>>,
) -> Result<(), Value> {
    let Some((clock, answers, refused)) = batch_shape(&reply, n) else {
        return Err(reply);
    };
    into.extend(answers.chunks_exact(16).enumerate().map(|(at, pair)| {
        let (count, when) = pair.split_at(8);
        let count = i64::from_be_bytes(count.try_into().expect("8 bytes"));
        let when = i64::from_be_bytes(when.try_into().expect("8 bytes"));
        let reason = refused
            .iter()
            .find(|(place, _)| *place == at)
            .map(|(_, reason)| *reason);
        parse_entry(count, when, reason, clock, key_of(at))
    }));
    Ok(())
}

/// The parts of a batch reply for `n` entries: the clock (`None` before
/// Redis 7.0), the packed answers, and the refused entries' places (from 0)
/// and reasons; `None` when it is not of that shape.
#[allow(clippy::type_complexity)]
fn batch_shape(
    reply: &Value,
    n: usize,
) -> Option<(Option<u64>, &[u8], SmallVec<[(usize, &[u8]); 2]>)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [Value::Int(now), Value::BulkString(answers), tail @ ..] = items.as_slice() else {
        return None;
    };
    if *now < -1 || answers.len() != 16 * n || tail.len() % 2 != 0 {
        return None;
    }
    let refused = tail
        .chunks_exact(2)
        .map(|pair| match pair {
            [Value::Int(place), Value::BulkString(reason)] => {
                let at = usize::try_from(*place).ok()?.checked_sub(1)?;
                (at < n).then_some((at, reason.as_slice()))
            }
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some((u64::try_from(*now).ok(), answers, refused))
}

/// One entry's answer: its last hit, or why there is none. `clock` is the
/// server's when `when` is the counter's deadline; `None` when it is the
/// time left.
fn parse_entry(
    count: i64,
    when: i64,
    reason: Option<&[u8]>,
    clock: Option<u64>,
    key: &[u8],
) -> Result<Hit, BackendError> {
    match (count, reason) {
        (1.., None) if when >= 0 => {
            let (count, when) = (count as u64, when as u64);
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
        (-1, Some(reason)) => Err(corrupt(key, String::from_utf8_lossy(reason).into_owned())),
        (-2, Some(err)) => Err(BackendError::Unavailable(
            String::from_utf8_lossy(err).into_owned().into(),
        )),
        _ => Err(corrupt(
            key,
            format!("unexpected script reply {count}, {when}, {reason:?}"),
        )),
    }
}

/// Whether a spend's counter can take no spend at all until its time left is
/// over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// It can (or it was not denied).
    No,
    /// At its limit (or over): until its window closes.
    AtLimit,
    /// Locked out: until the lockout ends.
    Locked,
}

/// What the spend script answered for one request.
#[derive(Debug)]
pub(super) enum Spent {
    /// Admitted or denied: each counter's hit (a deadline only when the
    /// request was admitted and the counter counted it), and whether no
    /// spend can fit the counter until the hit's time left is over.
    Decided(SmallVec<[(Hit, Full); 2]>),
    /// Counter `counter` (from 0) is corrupt; nothing was written.
    Corrupt { counter: usize, reason: String },
    /// The request's arguments were refused; nothing was written.
    Invalid(String),
}

/// The spend script's reply, `[answers, reason, ...]`: signed 64-bit
/// big-endian integers, per request in order, `1` admitted or `0` denied
/// then four per counter (count, ms left, deadline or -1, and 1 when at its
/// limit or 2 when locked out, so that no spend fits before the ms left are
/// over, else 0), or
/// `-1, i` when counter `i` (from 1) is corrupt, or `-2` when the request's
/// arguments were refused; then the reason of each request answered -1 or
/// -2, in order. `sizes`: each request's number of counters. A reply of
/// another shape (or with anything left over) is given back, for the error.
pub(super) fn parse_spends(
    value: Value,
    sizes: impl Iterator<Item = usize>,
) -> Result<Vec<Spent>, Value> {
    match spends_shape(&value, sizes) {
        Some(spent) => Ok(spent),
        None => Err(value),
    }
}

fn spends_shape(value: &Value, sizes: impl Iterator<Item = usize>) -> Option<Vec<Spent>> {
    let Value::Array(items) = value else {
        return None;
    };
    let [Value::BulkString(packed), reasons @ ..] = items.as_slice() else {
        return None;
    };
    let mut reasons = reasons.iter().map(|r| match r {
        Value::BulkString(reason) => Some(String::from_utf8_lossy(reason).into_owned()),
        _ => None,
    });
    let spent = unpack_spends(packed, &mut reasons, sizes)?;
    reasons.next().is_none().then_some(spent)
}

/// What a spend call wrote in its marker (`spend.lua`): the first string of
/// its reply, without the reasons (each request answered -1 or -2 gets an
/// empty one). `None` for bytes of another shape.
pub(super) fn parse_spend_marker(
    packed: &[u8],
    sizes: impl Iterator<Item = usize>,
) -> Option<Vec<Spent>> {
    unpack_spends(
        packed,
        &mut std::iter::repeat_with(|| Some(String::new())),
        sizes,
    )
}

/// The answers packed in `packed`, each request's as `sizes` says, with
/// their reasons from `reasons`; `None` when anything is left over or
/// missing.
fn unpack_spends(
    packed: &[u8],
    reasons: &mut impl Iterator<Item = Option<String>>,
    sizes: impl Iterator<Item = usize>,
) -> Option<Vec<Spent>> {
    if !packed.len().is_multiple_of(8) {
        return None;
    }
    let mut nums = packed
        .chunks_exact(8)
        .map(|n| i64::from_be_bytes(n.try_into().expect("8 bytes")));
    let mut spent = Vec::with_capacity(sizes.size_hint().0);
    for n in sizes {
        spent.push(match nums.next()? {
            -1 => {
                let counter = usize::try_from(nums.next()?).ok()?.checked_sub(1)?;
                if counter >= n {
                    return None;
                }
                let reason = reasons.next()??;
                Spent::Corrupt { counter, reason }
            }
            -2 => Spent::Invalid(reasons.next()??),
            admitted @ (0 | 1) => {
                let counters = (0..n)
                    .map(|_| {
                        let (count, left, deadline, full) =
                            (nums.next()?, nums.next()?, nums.next()?, nums.next()?);
                        let full = match full {
                            0 => Full::No,
                            1 => Full::AtLimit,
                            2 => Full::Locked,
                            _ => return None,
                        };
                        if count < 0 || left < 0 || deadline < -1 {
                            return None;
                        }
                        Some((
                            Hit {
                                count: count as u64,
                                reset: Duration::from_millis(left as u64),
                                deadline: if admitted == 1 {
                                    u64::try_from(deadline).ok().and_then(NonZeroU64::new)
                                } else {
                                    None
                                },
                            },
                            full,
                        ))
                    })
                    .collect::<Option<_>>()?;
                Spent::Decided(counters)
            }
            _ => return None,
        });
    }
    nums.next().is_none().then_some(spent)
}

/// What the take-all script answered for one request.
#[derive(Debug)]
pub(super) enum TookAll {
    /// Decided: the cap's answer (`None` when the counters refused the
    /// request and no slot was taken), and each counter's hit (a deadline
    /// only when it was counted) with whether no step can fit it until the
    /// hit's time left is over.
    Decided {
        taken: Option<Taken>,
        counters: SmallVec<[(Hit, Full); 2]>,
    },
    /// The record of slots (`None`) or counter `i` (from 0) is corrupt;
    /// nothing was written.
    Corrupt {
        counter: Option<usize>,
        reason: String,
    },
    /// The request's arguments were refused; nothing was written.
    Invalid(String),
}

/// The take-all script's reply, `[answers, reason, ...]`: signed 64-bit
/// big-endian integers, per request in order: `code, in use, ms` (code 1
/// the slot granted, `in use` after it, ms 0; 0 refused by the cap, ms
/// until the earliest lease runs out; 2 refused by the counters, no slot
/// taken, ms 0), then four per counter (count, ms left, deadline or -1,
/// and 1 at its limit or 2 locked out, else 0); or `-1, i` when the record
/// (`i` 0) or counter `i` (from 1) is corrupt; or `-2` when the request's
/// arguments were refused; then the reason of each request answered -1 or
/// -2, in order. `sizes`: each request's number of counters. A reply of
/// another shape (or with anything left over) is given back, for the
/// error.
pub(super) fn parse_take_alls(
    value: Value,
    sizes: impl Iterator<Item = usize>,
) -> Result<Vec<TookAll>, Value> {
    match take_alls_shape(&value, sizes) {
        Some(took) => Ok(took),
        None => Err(value),
    }
}

fn take_alls_shape(value: &Value, sizes: impl Iterator<Item = usize>) -> Option<Vec<TookAll>> {
    let Value::Array(items) = value else {
        return None;
    };
    let [Value::BulkString(packed), reasons @ ..] = items.as_slice() else {
        return None;
    };
    if !packed.len().is_multiple_of(8) {
        return None;
    }
    let mut reasons = reasons.iter().map(|r| match r {
        Value::BulkString(reason) => Some(String::from_utf8_lossy(reason).into_owned()),
        _ => None,
    });
    let mut nums = packed
        .chunks_exact(8)
        .map(|n| i64::from_be_bytes(n.try_into().expect("8 bytes")));
    let mut took = Vec::with_capacity(sizes.size_hint().0);
    for n in sizes {
        took.push(match nums.next()? {
            -1 => {
                let at = usize::try_from(nums.next()?).ok()?;
                if at > n {
                    return None;
                }
                TookAll::Corrupt {
                    counter: at.checked_sub(1),
                    reason: reasons.next()??,
                }
            }
            -2 => TookAll::Invalid(reasons.next()??),
            code @ 0..=2 => {
                let (in_use, ms) = (nums.next()?, nums.next()?);
                let taken = match code {
                    1 if in_use >= 1 && ms == 0 => Some(Taken {
                        granted: true,
                        in_use: in_use as u64,
                        retry: Duration::ZERO,
                    }),
                    0 if in_use >= 1 && ms >= 0 => Some(Taken {
                        granted: false,
                        in_use: in_use as u64,
                        retry: Duration::from_millis(ms as u64),
                    }),
                    2 if in_use >= 0 && ms == 0 => None,
                    _ => return None,
                };
                let counters = (0..n)
                    .map(|_| {
                        let (count, left, deadline, full) =
                            (nums.next()?, nums.next()?, nums.next()?, nums.next()?);
                        let full = match full {
                            0 => Full::No,
                            1 => Full::AtLimit,
                            2 => Full::Locked,
                            _ => return None,
                        };
                        if count < 0 || left < 0 || deadline < -1 {
                            return None;
                        }
                        Some((
                            Hit {
                                count: count as u64,
                                reset: Duration::from_millis(left as u64),
                                deadline: u64::try_from(deadline).ok().and_then(NonZeroU64::new),
                            },
                            full,
                        ))
                    })
                    .collect::<Option<_>>()?;
                TookAll::Decided { taken, counters }
            }
            _ => return None,
        });
    }
    (nums.next().is_none() && reasons.next().is_none()).then_some(took)
}

/// A reply of the wrong shape to a script of slots in flight: not what the
/// script answers, so the store is not the one the backend was written for
/// (an older script, a proxy in the way). An outage, never corrupt state.
fn unexpected_slots_reply(what: &str, record: &[u8], value: &Value) -> BackendError {
    BackendError::Unavailable(
        format!("unexpected reply to {what} on {}: {value:?}", name(record)).into(),
    )
}

/// A record of slots that is not one, as the scripts of slots answer it:
/// `{reason}`.
fn corrupt_slots(items: &[Value], record: &[u8]) -> Option<BackendError> {
    match items {
        [Value::BulkString(reason)] => Some(corrupt(
            record,
            String::from_utf8_lossy(reason).into_owned(),
        )),
        _ => None,
    }
}

/// The take script's reply: `{1, in use}` granted, `{0, in use, ms until
/// the earliest lease runs out}` refused, or `{reason}` for a record that
/// is not one (corrupt, named by `record`). Any other shape is
/// [`BackendError::Unavailable`].
pub(super) fn parse_take(value: Value, record: &[u8]) -> Result<Taken, BackendError> {
    if let Value::Array(items) = &value {
        match items.as_slice() {
            [Value::Int(1), Value::Int(in_use)] if *in_use >= 1 => {
                return Ok(Taken {
                    granted: true,
                    in_use: *in_use as u64,
                    retry: Duration::ZERO,
                });
            }
            [Value::Int(0), Value::Int(in_use), Value::Int(retry)]
                if *in_use >= 1 && *retry >= 0 =>
            {
                return Ok(Taken {
                    granted: false,
                    in_use: *in_use as u64,
                    retry: Duration::from_millis(*retry as u64),
                });
            }
            items => {
                if let Some(err) = corrupt_slots(items, record) {
                    return Err(err);
                }
            }
        }
    }
    Err(unexpected_slots_reply("a take", record, &value))
}

/// The give-back script's reply: 1 the slot was there, 0 it was not, or
/// `{reason}` for a record that is not one. Any other shape is
/// [`BackendError::Unavailable`].
pub(super) fn parse_give_back(value: Value, record: &[u8]) -> Result<bool, BackendError> {
    match &value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        Value::Array(items) => Err(corrupt_slots(items, record)
            .unwrap_or_else(|| unexpected_slots_reply("a give-back", record, &value))),
        _ => Err(unexpected_slots_reply("a give-back", record, &value)),
    }
}

/// The in-use script's reply: the live slots, or `{reason}` for a record
/// that is not one. Any other shape is [`BackendError::Unavailable`].
pub(super) fn parse_in_use(value: Value, record: &[u8]) -> Result<u64, BackendError> {
    match &value {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        Value::Array(items) => Err(corrupt_slots(items, record)
            .unwrap_or_else(|| unexpected_slots_reply("a count of slots", record, &value))),
        _ => Err(unexpected_slots_reply("a count of slots", record, &value)),
    }
}

/// A reply of the provider's word (`what`, on `counter`) that is of no
/// shape its script answers: [`BackendError::Unavailable`].
fn unexpected_heed_reply(what: &str, counter: &[u8], value: &Value) -> BackendError {
    BackendError::Unavailable(
        format!("unexpected reply to {what} on {}: {value:?}", name(counter)).into(),
    )
}

/// The close script's reply: `{ms left of the lockout}`, or `{reason}` for
/// a counter that is not one or a lockout without a lifetime (corrupt,
/// named by `counter`). Any other shape is [`BackendError::Unavailable`].
pub(super) fn parse_close(value: Value, counter: &[u8]) -> Result<Duration, BackendError> {
    if let Value::Array(items) = &value {
        match items.as_slice() {
            [Value::Int(left)] if *left >= 0 => {
                return Ok(Duration::from_millis(*left as u64));
            }
            [Value::BulkString(reason)] => {
                return Err(corrupt(
                    counter,
                    String::from_utf8_lossy(reason).into_owned(),
                ));
            }
            _ => {}
        }
    }
    Err(unexpected_heed_reply("a close", counter, &value))
}

/// The raise script's reply: `{count, ms left, deadline}` (the count as
/// decimal text; ms left -1 for a counter without a lifetime, a deadline
/// of -1 for none), or `{reason}` for a counter that is not one (corrupt,
/// named by `counter`). Any other shape is [`BackendError::Unavailable`].
pub(super) fn parse_raise(value: Value, counter: &[u8]) -> Result<Hit, BackendError> {
    if let Value::Array(items) = &value {
        match items.as_slice() {
            [
                Value::BulkString(count),
                Value::Int(left),
                Value::Int(deadline),
            ] if *left >= -1 => {
                let count = std::str::from_utf8(count)
                    .ok()
                    .filter(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|digits| digits.parse::<u64>().ok());
                if let Some(count) = count {
                    return Ok(Hit {
                        count,
                        // No lifetime (older code; a raise of 0 gives none).
                        reset: u64::try_from(*left).map_or(Duration::MAX, Duration::from_millis),
                        deadline: u64::try_from(*deadline).ok().and_then(NonZeroU64::new),
                    });
                }
            }
            [Value::BulkString(reason)] => {
                return Err(corrupt(
                    counter,
                    String::from_utf8_lossy(reason).into_owned(),
                ));
            }
            _ => {}
        }
    }
    Err(unexpected_heed_reply("a raise", counter, &value))
}

/// What the extend script answered for one call.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Extended {
    /// The slots extended.
    pub(super) slots: u64,
    /// The places (from 0) of the call's records skipped as corrupt, left
    /// as they are.
    pub(super) corrupt: SmallVec<[usize; 1]>,
}

/// The extend script's reply for a call on `records` records:
/// `{extended, place, ...}`, the slots extended then the place (from 1) of
/// each record skipped as corrupt, each once, in order. Any other shape is
/// [`BackendError::Unavailable`], naming `first`, the call's first record.
pub(super) fn parse_extend(
    value: Value,
    records: usize,
    first: &[u8],
) -> Result<Extended, BackendError> {
    let parsed = match &value {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(slots), places @ ..] if *slots >= 0 && places.len() <= records => {
                let mut corrupt = SmallVec::new();
                let mut last = 0;
                places
                    .iter()
                    .all(|place| match place {
                        // In order, each once, within the call.
                        Value::Int(place) if *place > last && *place as usize <= records => {
                            last = *place;
                            corrupt.push(*place as usize - 1);
                            true
                        }
                        _ => false,
                    })
                    .then_some(Extended {
                        slots: *slots as u64,
                        corrupt,
                    })
            }
            _ => None,
        },
        _ => None,
    };
    parsed.ok_or_else(|| unexpected_slots_reply("an extend", first, &value))
}

/// What a step of a call of the slots' batch script does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Takes a slot.
    Take,
    /// Gives a slot back.
    GiveBack,
}

/// The slots' batch script's reply, `[answers, place, reason, ...]`: three
/// signed 64-bit big-endian integers per step, in order (a take: `1, in
/// use, 0` granted, `0, in use, ms until the earliest lease runs out`
/// refused; a give-back: `1, 0, 0` the slot was there, `0, 0, 0` it was
/// not; either: `-1, 0, 0` a record that is not one, `-2, 0, 0` invalid
/// arguments), then the place (from 1) and reason of each step answered
/// -1 or -2. There are `n` steps, `step_of` each one's kind and record.
/// Each step's answer: a take's [`Taken`]; a give-back's is
/// `Taken { granted, .. }`, `granted` whether the slot was there, nothing
/// in use and no wait. A step answered in another shape is
/// [`BackendError::Unavailable`], as a single step's would be; a reply of
/// another shape is given back, for the error.
pub(super) fn parse_slots_batch<'r>(
    reply: Value,
    n: usize,
    step_of: impl Fn(usize) -> (Step, &'r [u8]),
) -> Result<Vec<Result<Taken, BackendError>>, Value> {
    let Some((answers, refused)) = slots_batch_shape(&reply, n) else {
        return Err(reply);
    };
    Ok(answers
        .chunks_exact(24)
        .enumerate()
        .map(|(at, step)| {
            let [code, in_use, ms] = std::array::from_fn(|i| {
                i64::from_be_bytes(step[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            });
            let reason = refused
                .iter()
                .find(|(place, _)| *place == at)
                .map(|(_, reason)| *reason);
            let (kind, record) = step_of(at);
            parse_slot_step(kind, [code, in_use, ms], reason, record)
        })
        .collect())
}

/// The parts of a slots' batch reply for `n` steps: the packed answers,
/// and the refused steps' places (from 0) and reasons; `None` when it is
/// not of that shape.
#[allow(clippy::type_complexity)]
fn slots_batch_shape(reply: &Value, n: usize) -> Option<(&[u8], SmallVec<[(usize, &[u8]); 2]>)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [Value::BulkString(answers), tail @ ..] = items.as_slice() else {
        return None;
    };
    if answers.len() != 24 * n || tail.len() % 2 != 0 {
        return None;
    }
    let refused = tail
        .chunks_exact(2)
        .map(|pair| match pair {
            [Value::Int(place), Value::BulkString(reason)] => {
                let at = usize::try_from(*place).ok()?.checked_sub(1)?;
                (at < n).then_some((at, reason.as_slice()))
            }
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some((answers, refused))
}

/// One step's answer in a slots' batch: its three numbers, its reason
/// when refused, and its record (named by an error).
fn parse_slot_step(
    kind: Step,
    [code, in_use, ms]: [i64; 3],
    reason: Option<&[u8]>,
    record: &[u8],
) -> Result<Taken, BackendError> {
    let answered = |granted: bool, in_use: i64, ms: i64| Taken {
        granted,
        in_use: in_use as u64,
        retry: Duration::from_millis(ms as u64),
    };
    match (kind, code, reason) {
        (Step::Take, 1, None) if in_use >= 1 && ms == 0 => Ok(answered(true, in_use, 0)),
        (Step::Take, 0, None) if in_use >= 1 && ms >= 0 => Ok(answered(false, in_use, ms)),
        (Step::GiveBack, 0 | 1, None) if in_use == 0 && ms == 0 => Ok(answered(code == 1, 0, 0)),
        (_, -1, Some(reason)) if in_use == 0 && ms == 0 => Err(corrupt(
            record,
            String::from_utf8_lossy(reason).into_owned(),
        )),
        (_, -2, Some(err)) if in_use == 0 && ms == 0 => Err(BackendError::Unavailable(
            String::from_utf8_lossy(err).into_owned().into(),
        )),
        _ => {
            let what = match kind {
                Step::Take => "a take",
                Step::GiveBack => "a give-back",
            };
            Err(BackendError::Unavailable(
                format!(
                    "unexpected reply to {what} in a batch on {}: {code}, {in_use}, {ms}, {:?}",
                    name(record),
                    reason.map(<[u8]>::escape_ascii)
                )
                .into(),
            ))
        }
    }
}

/// The parsers above, for the fuzz targets (`fuzz/`): built only under
/// `--cfg fuzzing`, which cargo-fuzz passes, and reached through the
/// crate's hidden `fuzzing` module.
#[cfg(fuzzing)]
pub(crate) mod fuzzing {
    use super::{BackendError, Hit, Taken, Value};

    pub(crate) fn hit(value: Value, key: &[u8]) -> Result<Hit, BackendError> {
        super::parse_hit(value, key)
    }

    /// The amend script's reply for one amend.
    pub(crate) fn refund(value: Value, key: &[u8]) -> Result<Result<bool, BackendError>, Value> {
        let mut amended = super::parse_amends(value, &[key])?;
        Ok(amended.pop().expect("one amend, one answer"))
    }

    #[allow(clippy::type_complexity)]
    pub(crate) fn spend(
        value: Value,
        sizes: &[usize],
    ) -> Result<Vec<Option<Vec<(Hit, bool)>>>, Value> {
        Ok(super::parse_spends(value, sizes.iter().copied())?
            .into_iter()
            .map(|spent| match spent {
                super::Spent::Decided(counters) => Some(
                    counters
                        .into_iter()
                        .map(|(hit, full)| (hit, full != super::Full::No))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    }

    pub(crate) fn peek(value: Value, key: &[u8]) -> Result<Option<Hit>, BackendError> {
        super::parse_peek(value, key)
    }

    pub(crate) fn batch(
        reply: Value,
        entries: &[(&[u8], u64, u64)],
    ) -> Result<Vec<Result<Hit, BackendError>>, Value> {
        super::batch_of(reply, entries)
    }

    pub(crate) fn take(value: Value, record: &[u8]) -> Result<Taken, BackendError> {
        super::parse_take(value, record)
    }

    pub(crate) fn give_back(value: Value, record: &[u8]) -> Result<bool, BackendError> {
        super::parse_give_back(value, record)
    }

    pub(crate) fn in_use(value: Value, record: &[u8]) -> Result<u64, BackendError> {
        super::parse_in_use(value, record)
    }

    /// The slots extended, and the places of the records skipped.
    pub(crate) fn extend(
        value: Value,
        records: usize,
        first: &[u8],
    ) -> Result<(u64, Vec<usize>), BackendError> {
        let extended = super::parse_extend(value, records, first)?;
        Ok((extended.slots, extended.corrupt.to_vec()))
    }

    /// The take-all script's reply for requests of `sizes` counters: per
    /// request, the cap's answer (`None` when the counters refused) and
    /// each counter's hit and whether it is full, or `None` for a corrupt
    /// record or counter or refused arguments; the reply back when it is
    /// not of the script's shape.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_all(
        value: Value,
        sizes: &[usize],
    ) -> Result<Vec<Option<(Option<Taken>, Vec<(Hit, bool)>)>>, Value> {
        Ok(super::parse_take_alls(value, sizes.iter().copied())?
            .into_iter()
            .map(|took| match took {
                super::TookAll::Decided { taken, counters } => Some((
                    taken,
                    counters
                        .into_iter()
                        .map(|(hit, full)| (hit, full != super::Full::No))
                        .collect(),
                )),
                _ => None,
            })
            .collect())
    }

    /// `takes`: each step's kind (a take, or a give-back), all on
    /// `record`.
    pub(crate) fn slots_batch(
        value: Value,
        takes: &[bool],
        record: &[u8],
    ) -> Result<Vec<Result<Taken, BackendError>>, Value> {
        super::parse_slots_batch(value, takes.len(), |at| {
            let kind = if takes[at] {
                super::Step::Take
            } else {
                super::Step::GiveBack
            };
            (kind, record)
        })
    }
}

/// [`parse_batch`] of `entries` (storage key, window, hits), its results in
/// a new list: for the fuzz target and the tests.
#[cfg(any(test, fuzzing))]
fn batch_of(
    reply: Value,
    entries: &[(&[u8], u64, u64)],
) -> Result<Vec<Result<Hit, BackendError>>, Value> {
    let mut replies = Vec::new();
    parse_batch(reply, entries.len(), |at| entries[at].0, &mut replies)?;
    Ok(replies)
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
    fn amend_replies_parse() {
        // (case, code, reason, answer)
        type Case<'a> = (&'a str, i8, Option<&'a str>, Result<bool, &'a str>);
        let cases: &[Case<'_>] = &[
            ("changed", 1, None, Ok(true)),
            ("nothing to change", 0, None, Ok(false)),
            ("corrupt", -1, Some("value abc"), Err("value abc")),
            ("unexpected", 2, Some("x"), Err("unexpected script reply")),
        ];
        // One call of all the cases: each answer is its own amend's.
        let codes = cases.iter().map(|(_, code, _, _)| *code as u8).collect();
        let mut reply = vec![Value::BulkString(codes)];
        reply.extend(cases.iter().filter_map(|(_, _, why, _)| why.map(text)));
        let keys: Vec<&[u8]> = cases.iter().map(|_| &b"k"[..]).collect();
        let amended = parse_amends(Value::Array(reply), &keys).unwrap();
        assert_eq!(amended.len(), cases.len());
        for ((name, _, _, want), got) in cases.iter().zip(amended) {
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{name}"),
                (Err(BackendError::Corrupt { detail, .. }), Err(want)) => {
                    assert!(detail.contains(want), "{name}: {detail}");
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
        let invalid = Value::Array(vec![
            Value::BulkString(vec![-2i8 as u8]),
            text("ERR invalid amend"),
        ]);
        assert!(matches!(
            parse_amends(invalid, &[b"k"]).unwrap().as_slice(),
            [Err(BackendError::Unavailable(_))]
        ));
        // Another number of codes than amends, a reason missing or left
        // over, or not a string: given back whole.
        let codes = |c: &[u8]| Value::BulkString(c.to_vec());
        for reply in [
            Value::Array(vec![codes(&[])]),
            Value::Array(vec![codes(&[1, 1])]),
            Value::Array(vec![codes(&[255])]),
            Value::Array(vec![codes(&[1]), text("x")]),
            Value::Array(vec![codes(&[255]), Value::Int(1)]),
            Value::Int(1),
        ] {
            assert_eq!(parse_amends(reply.clone(), &[b"k"]).unwrap_err(), reply);
        }
    }

    /// The spend script's reply: the packed integers, then the reasons.
    fn spends(nums: &[i64], reasons: &[&str]) -> Value {
        let packed = nums.iter().flat_map(|n| n.to_be_bytes()).collect();
        let mut reply = vec![Value::BulkString(packed)];
        reply.extend(reasons.iter().map(|r| text(r)));
        Value::Array(reply)
    }

    #[test]
    fn spend_replies_parse() {
        // Admitted on two counters (the second one full: at its limit now),
        // then denied on one, then corrupt counter 2 of two, then refused.
        let reply = spends(
            &[
                1,
                3,
                1_000,
                1_700_000_000_000,
                0,
                10,
                500,
                1_700_000_000_001,
                1,
                0,
                11,
                2_000,
                -1,
                2,
                -1,
                2,
                -2,
            ],
            &["value abc", "ERR tower-pinned-window: invalid spend"],
        );
        let spent = parse_spends(reply, [2, 1, 2, 1].into_iter()).unwrap();
        match &spent[..] {
            [
                Spent::Decided(admitted),
                Spent::Decided(denied),
                Spent::Corrupt { counter: 1, reason },
                Spent::Invalid(err),
            ] => {
                assert_eq!(admitted.len(), 2);
                assert_eq!(admitted[0].0.count, 3);
                assert_eq!(admitted[0].0.reset, Duration::from_secs(1));
                assert_eq!(admitted[0].0.deadline, NonZeroU64::new(1_700_000_000_000));
                assert_eq!((admitted[0].1, admitted[1].1), (Full::No, Full::AtLimit));
                // Denied: nothing counted, so no deadline.
                assert_eq!(denied[0].0.count, 11);
                assert_eq!(denied[0].0.deadline, None);
                assert_eq!(denied[0].1, Full::Locked);
                assert_eq!(reason, "value abc");
                assert!(err.contains("invalid spend"), "{err}");
            }
            other => panic!("{other:?}"),
        }
        // Malformed: too short, too long, a counter index out of range, a
        // negative count, a full flag of 2, a reason missing or left over:
        // each is given back whole.
        for (reply, sizes) in [
            (spends(&[1, 3, 1, -1], &[]), vec![1]),
            (spends(&[0, 3, 1, -1, 0, 9], &[]), vec![1]),
            (spends(&[-1, 2], &["x"]), vec![1]),
            (spends(&[1, -3, 1, -1, 0], &[]), vec![1]),
            (spends(&[1, 3, 1, -1, 3], &[]), vec![1]),
            (spends(&[-2], &[]), vec![1]),
            (spends(&[1, 3, 1, -1, 0], &["x"]), vec![1]),
        ] {
            assert_eq!(
                parse_spends(reply.clone(), sizes.into_iter()).unwrap_err(),
                reply
            );
        }
    }

    #[test]
    fn take_all_replies_parse() {
        // Granted with two counters counted (the second at its limit),
        // refused by the cap (counters read), refused by the counters,
        // a corrupt record, corrupt counter 1, refused arguments.
        let reply = spends(
            &[
                1,
                2,
                0,
                3,
                1_000,
                1_700_000_000_000,
                0,
                10,
                500,
                1_700_000_000_001,
                1,
                0,
                2,
                25_000,
                3,
                1_000,
                -1,
                0,
                2,
                1,
                0,
                11,
                2_000,
                -1,
                2,
                -1,
                0,
                -1,
                1,
                -2,
            ],
            &["a key of type string", "value abc", "ERR invalid slot"],
        );
        let took = parse_take_alls(reply, [2, 1, 1, 1, 1, 1].into_iter()).unwrap();
        match &took[..] {
            [
                TookAll::Decided {
                    taken: Some(granted),
                    counters: counted,
                },
                TookAll::Decided {
                    taken: Some(refused),
                    counters: read,
                },
                TookAll::Decided {
                    taken: None,
                    counters: denied,
                },
                TookAll::Corrupt {
                    counter: None,
                    reason: record,
                },
                TookAll::Corrupt {
                    counter: Some(0),
                    reason: value,
                },
                TookAll::Invalid(err),
            ] => {
                assert!(granted.granted && granted.in_use == 2, "{granted:?}");
                assert_eq!(counted.len(), 2);
                assert_eq!(counted[0].0.deadline, NonZeroU64::new(1_700_000_000_000));
                assert_eq!((counted[0].1, counted[1].1), (Full::No, Full::AtLimit));
                assert!(!refused.granted && refused.in_use == 2);
                assert_eq!(refused.retry, Duration::from_secs(25));
                assert_eq!((read[0].0.count, read[0].0.deadline), (3, None));
                assert_eq!((denied[0].0.count, denied[0].1), (11, Full::Locked));
                assert_eq!(record, "a key of type string");
                assert_eq!(value, "value abc");
                assert!(err.contains("invalid slot"), "{err}");
            }
            other => panic!("{other:?}"),
        }
        // Malformed: too short, too long, a code out of range, granted with
        // nothing in use, a counter index out of range, a full flag of 3,
        // a reason missing or left over: each is given back whole.
        for (reply, sizes) in [
            (spends(&[1, 1, 0, 3, 1, -1], &[]), vec![1]),
            (spends(&[1, 1, 0, 3, 1, -1, 0, 9], &[]), vec![1]),
            (spends(&[3, 1, 0, 3, 1, -1, 0], &[]), vec![1]),
            (spends(&[1, 0, 0, 3, 1, -1, 0], &[]), vec![1]),
            (spends(&[-1, 2], &["x"]), vec![1]),
            (spends(&[1, 1, 0, 3, 1, -1, 3], &[]), vec![1]),
            (spends(&[-2], &[]), vec![1]),
            (spends(&[1, 1, 0, 3, 1, -1, 0], &["x"]), vec![1]),
        ] {
            assert_eq!(
                parse_take_alls(reply.clone(), sizes.into_iter()).unwrap_err(),
                reply
            );
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

    /// The batch script's reply: the clock, each entry's two integers
    /// packed, then the refused entries' places and reasons.
    fn batch(clock: i64, entries: &[(i64, i64)], refused: &[(i64, &str)]) -> Value {
        let packed = entries
            .iter()
            .flat_map(|(a, b)| a.to_be_bytes().into_iter().chain(b.to_be_bytes()))
            .collect();
        let mut reply = vec![Value::Int(clock), Value::BulkString(packed)];
        for (place, reason) in refused {
            reply.extend([Value::Int(*place), text(reason)]);
        }
        Value::Array(reply)
    }

    #[test]
    fn replies_parse() {
        let reply = batch(
            1_000,
            // A deadline already behind the clock: no time left.
            &[(7, 1_500), (-2, 0), (2, 990), (-1, 0)],
            &[
                (2, "ERR tower-pinned-window: invalid window 0"),
                (4, "value abc"),
            ],
        );
        let replies = batch_of(reply, &KEYS).unwrap();
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
        let replies = batch_of(batch(-1, &[(2, 5)], &[]), &KEYS[..1]).unwrap();
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
        for (entry, refused) in [
            ((0, 5), None),
            ((3, -1), None),
            ((-3, 0), Some("x")),
            // A code without its reason, a count with one.
            ((-1, 0), None),
            ((3, 5), Some("x")),
        ] {
            let refused: Vec<_> = refused.into_iter().map(|r| (1, r)).collect();
            let replies = batch_of(batch(1_000, &[entry], &refused), &KEYS[..1]).unwrap();
            assert!(
                matches!(replies[0], Err(BackendError::Corrupt { .. })),
                "{entry:?}"
            );
        }
    }

    const RECORD: &[u8] = b"tpw:n{k}:slots";

    /// Whether `err` is an outage whose message names the record and says
    /// the reply was not of the script's shape.
    fn is_unexpected(err: &BackendError) -> bool {
        matches!(err, BackendError::Unavailable(detail)
            if detail.to_string().contains("unexpected reply")
                && detail.to_string().contains("tpw:n{k}:slots"))
    }

    fn is_corrupt_record(err: &BackendError, reason: &str) -> bool {
        matches!(err, BackendError::Corrupt { key, detail }
            if key == "tpw:n{k}:slots" && detail == reason)
    }

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().copied().map(Value::Int).collect())
    }

    #[test]
    fn take_replies_parse() {
        let granted = |in_use| Taken {
            granted: true,
            in_use,
            retry: Duration::ZERO,
        };
        let cases: &[(&str, Value, Taken)] = &[
            ("granted", ints(&[1, 1]), granted(1)),
            ("granted again, at the cap", ints(&[1, 3]), granted(3)),
            (
                "refused",
                ints(&[0, 3, 29_950]),
                Taken {
                    granted: false,
                    in_use: 3,
                    retry: Duration::from_millis(29_950),
                },
            ),
            (
                "refused as a lease runs out",
                ints(&[0, 1, 0]),
                Taken {
                    granted: false,
                    in_use: 1,
                    retry: Duration::ZERO,
                },
            ),
        ];
        for (name, value, want) in cases {
            assert_eq!(parse_take(value.clone(), RECORD).unwrap(), *want, "{name}");
        }
        let err = parse_take(Value::Array(vec![text("a key of type string")]), RECORD);
        assert!(
            is_corrupt_record(&err.unwrap_err(), "a key of type string"),
            "the script's reason, named by the record"
        );
        for (name, value) in [
            ("granted with nothing in use", ints(&[1, 0])),
            ("granted with a negative count", ints(&[1, -1])),
            ("granted with a wait", ints(&[1, 1, 5])),
            ("refused with nothing in use", ints(&[0, 0, 5])),
            ("refused without a wait", ints(&[0, 3])),
            ("refused with a negative wait", ints(&[0, 3, -1])),
            ("another code", ints(&[2, 1])),
            ("empty", ints(&[])),
            (
                "a reason and more",
                Value::Array(vec![text("x"), Value::Int(1)]),
            ),
            ("a number", Value::Int(1)),
            ("nil", Value::Nil),
            ("a string", text("OK")),
        ] {
            let err = parse_take(value, RECORD).expect_err(name);
            assert!(is_unexpected(&err), "{name}: {err}");
        }
    }

    #[test]
    fn give_back_replies_parse() {
        assert!(parse_give_back(Value::Int(1), RECORD).unwrap());
        assert!(!parse_give_back(Value::Int(0), RECORD).unwrap());
        let err = parse_give_back(Value::Array(vec![text("a key of type hash")]), RECORD);
        assert!(is_corrupt_record(&err.unwrap_err(), "a key of type hash"));
        for (name, value) in [
            ("two removed", Value::Int(2)),
            ("negative", Value::Int(-1)),
            ("empty", ints(&[])),
            ("an array of numbers", ints(&[1])),
            ("nil", Value::Nil),
            ("a string", text("1")),
        ] {
            let err = parse_give_back(value, RECORD).expect_err(name);
            assert!(is_unexpected(&err), "{name}: {err}");
        }
    }

    #[test]
    fn in_use_replies_parse() {
        assert_eq!(parse_in_use(Value::Int(0), RECORD).unwrap(), 0);
        assert_eq!(parse_in_use(Value::Int(7), RECORD).unwrap(), 7);
        let err = parse_in_use(
            Value::Array(vec![text("a member that is not a slot: x")]),
            RECORD,
        );
        assert!(is_corrupt_record(
            &err.unwrap_err(),
            "a member that is not a slot: x"
        ));
        for (name, value) in [
            ("negative", Value::Int(-1)),
            ("empty", ints(&[])),
            ("an array of numbers", ints(&[3])),
            ("nil", Value::Nil),
            ("a string", text("3")),
        ] {
            let err = parse_in_use(value, RECORD).expect_err(name);
            assert!(is_unexpected(&err), "{name}: {err}");
        }
    }

    /// An unexpected reply on the counter `tpw:n{k}`: not corrupt state.
    fn is_unexpected_of_counter(err: &BackendError) -> bool {
        matches!(err, BackendError::Unavailable(detail)
            if detail.to_string().contains("unexpected reply")
                && detail.to_string().contains("on tpw:n{k}:"))
    }

    #[test]
    fn close_replies_parse() {
        let counter = b"tpw:n{k}";
        assert_eq!(
            parse_close(ints(&[60_000]), counter).unwrap(),
            Duration::from_secs(60)
        );
        assert_eq!(parse_close(ints(&[0]), counter).unwrap(), Duration::ZERO);
        let err = parse_close(
            Value::Array(vec![text("a lockout without a lifetime")]),
            counter,
        )
        .unwrap_err();
        assert!(
            matches!(&err, BackendError::Corrupt { key, detail }
                if key == "tpw:n{k}" && detail == "a lockout without a lifetime"),
            "{err:?}"
        );
        for (case, bad) in [
            ("negative", ints(&[-1])),
            ("two numbers", ints(&[1, 2])),
            ("empty", ints(&[])),
            ("not an array", Value::Int(5)),
            ("nil", Value::Nil),
        ] {
            let err = parse_close(bad, counter).unwrap_err();
            assert!(is_unexpected_of_counter(&err), "{case}: {err:?}");
        }
    }

    #[test]
    fn raise_replies_parse() {
        let counter = b"tpw:n{k}";
        let reply = |count: &str, left, deadline| {
            Value::Array(vec![text(count), Value::Int(left), Value::Int(deadline)])
        };
        let cases: &[(&str, Value, Hit)] = &[
            (
                "raised",
                reply("7", 59_000, 1_700_000_060_000),
                Hit {
                    count: 7,
                    reset: Duration::from_secs(59),
                    deadline: NonZeroU64::new(1_700_000_060_000),
                },
            ),
            (
                "at the most a counter holds",
                reply("9223372036854775807", 5, 1_700_000_000_005),
                Hit {
                    count: i64::MAX as u64,
                    reset: Duration::from_millis(5),
                    deadline: NonZeroU64::new(1_700_000_000_005),
                },
            ),
            (
                "a raise of 0 on no counter",
                reply("0", 300, -1),
                Hit {
                    count: 0,
                    reset: Duration::from_millis(300),
                    deadline: None,
                },
            ),
            (
                "a raise of 0 on a counter without a lifetime",
                reply("4", -1, -1),
                Hit {
                    count: 4,
                    reset: Duration::MAX,
                    deadline: None,
                },
            ),
        ];
        for (case, value, want) in cases {
            assert_eq!(
                &parse_raise(value.clone(), counter).unwrap(),
                want,
                "{case}"
            );
        }
        let err = parse_raise(Value::Array(vec![text("value abc")]), counter).unwrap_err();
        assert!(
            matches!(&err, BackendError::Corrupt { detail, .. } if detail == "value abc"),
            "{err:?}"
        );
        for (case, bad) in [
            ("a count that is not one", reply("-3", 5, 5)),
            ("a count past 64 bits", reply("18446744073709551616", 5, 5)),
            ("a count with a sign", reply("+3", 5, 5)),
            ("ms left below -1", reply("3", -2, 5)),
            ("a count as a number", ints(&[3, 5, 5])),
            ("two items", Value::Array(vec![text("3"), Value::Int(5)])),
            ("not an array", text("3")),
        ] {
            let err = parse_raise(bad, counter).unwrap_err();
            assert!(is_unexpected_of_counter(&err), "{case}: {err:?}");
        }
    }

    #[test]
    fn extend_replies_parse() {
        let extended = |slots, corrupt: &[usize]| Extended {
            slots,
            corrupt: corrupt.iter().copied().collect(),
        };
        let cases: &[(&str, &[i64], usize, Extended)] = &[
            ("none", &[0], 1, extended(0, &[])),
            ("all of three", &[5], 3, extended(5, &[])),
            (
                "the first and last corrupt",
                &[2, 1, 3],
                3,
                extended(2, &[0, 2]),
            ),
        ];
        for (name, reply, records, want) in cases {
            assert_eq!(
                parse_extend(ints(reply), *records, RECORD).unwrap(),
                *want,
                "{name}"
            );
        }
        for (name, value, records) in [
            ("empty", ints(&[]), 1),
            ("a negative count", ints(&[-1]), 1),
            ("a place past the call", ints(&[0, 2]), 1),
            ("a place of 0", ints(&[0, 0]), 2),
            ("a place twice", ints(&[0, 1, 1]), 2),
            ("places out of order", ints(&[0, 2, 1]), 2),
            ("more places than records", ints(&[0, 1, 2]), 1),
            (
                "a place that is text",
                Value::Array(vec![Value::Int(0), text("1")]),
                1,
            ),
            (
                "a reason",
                Value::Array(vec![text("a key of type string")]),
                1,
            ),
            ("a number alone", Value::Int(3), 1),
            ("nil", Value::Nil, 1),
        ] {
            let err = parse_extend(value, records, RECORD).expect_err(name);
            assert!(is_unexpected(&err), "{name}: {err}");
        }
    }

    /// The slots' batch script's reply: each step's three integers
    /// packed, then the refused steps' places and reasons.
    fn slots_batch(steps: &[[i64; 3]], refused: &[(i64, &str)]) -> Value {
        let packed = steps
            .iter()
            .flat_map(|step| step.iter().flat_map(|n| n.to_be_bytes()))
            .collect();
        let mut reply = vec![Value::BulkString(packed)];
        for (place, reason) in refused {
            reply.extend([Value::Int(*place), text(reason)]);
        }
        Value::Array(reply)
    }

    #[test]
    fn slots_batch_replies_parse() {
        use Step::{GiveBack, Take};
        let taken = |granted, in_use, ms| Taken {
            granted,
            in_use,
            retry: Duration::from_millis(ms),
        };
        // (case, kind, the step's numbers, its reason, what it reads as)
        type Case<'a> = (
            &'a str,
            Step,
            [i64; 3],
            Option<&'a str>,
            Result<Taken, &'a str>,
        );
        let cases: &[Case<'_>] = &[
            ("granted", Take, [1, 1, 0], None, Ok(taken(true, 1, 0))),
            (
                "refused",
                Take,
                [0, 3, 29_950],
                None,
                Ok(taken(false, 3, 29_950)),
            ),
            (
                "given back",
                GiveBack,
                [1, 0, 0],
                None,
                Ok(taken(true, 0, 0)),
            ),
            (
                "not there",
                GiveBack,
                [0, 0, 0],
                None,
                Ok(taken(false, 0, 0)),
            ),
            (
                "a corrupt take",
                Take,
                [-1, 0, 0],
                Some("a key of type string"),
                Err("corrupt"),
            ),
            (
                "a corrupt give-back",
                GiveBack,
                [-1, 0, 0],
                Some("a key of type hash"),
                Err("corrupt"),
            ),
            (
                "refused arguments",
                Take,
                [-2, 0, 0],
                Some("ERR invalid take"),
                Err("invalid take"),
            ),
            (
                "granted with nothing in use",
                Take,
                [1, 0, 0],
                None,
                Err("unexpected"),
            ),
            (
                "granted with a wait",
                Take,
                [1, 2, 5],
                None,
                Err("unexpected"),
            ),
            (
                "refused with a negative wait",
                Take,
                [0, 3, -1],
                None,
                Err("unexpected"),
            ),
            (
                "refused with nothing in use",
                Take,
                [0, 0, 5],
                None,
                Err("unexpected"),
            ),
            (
                "a give-back with a count",
                GiveBack,
                [1, 2, 0],
                None,
                Err("unexpected"),
            ),
            (
                "a give-back of 2",
                GiveBack,
                [2, 0, 0],
                None,
                Err("unexpected"),
            ),
            (
                "a code without its reason",
                Take,
                [-1, 0, 0],
                None,
                Err("unexpected"),
            ),
            (
                "a grant with a reason",
                Take,
                [1, 1, 0],
                Some("x"),
                Err("unexpected"),
            ),
            (
                "another code",
                Take,
                [-3, 0, 0],
                Some("x"),
                Err("unexpected"),
            ),
        ];
        let steps: Vec<[i64; 3]> = cases.iter().map(|c| c.2).collect();
        let refused: Vec<(i64, &str)> = (1..)
            .zip(cases)
            .filter_map(|(place, c)| c.3.map(|why| (place, why)))
            .collect();
        let records: Vec<Vec<u8>> = (0..cases.len())
            .map(|at| format!("tpw:n{{k{at}}}:slots").into_bytes())
            .collect();
        let answers = parse_slots_batch(slots_batch(&steps, &refused), cases.len(), |at| {
            (cases[at].1, records[at].as_slice())
        })
        .unwrap();
        assert_eq!(answers.len(), cases.len());
        for (at, ((name, _, _, _, want), got)) in cases.iter().zip(answers).enumerate() {
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{name}"),
                (Err(BackendError::Corrupt { key, detail }), Err("corrupt")) => {
                    assert_eq!(
                        key,
                        format!("tpw:n{{k{at}}}:slots"),
                        "{name}: its own record"
                    );
                    assert_eq!(Some(detail.as_str()), cases[at].3, "{name}");
                }
                (Err(BackendError::Unavailable(err)), Err(want)) => {
                    let err = err.to_string();
                    assert!(err.contains(want), "{name}: {err}");
                    if *want == "unexpected" {
                        assert!(
                            err.contains(&format!("k{at}")),
                            "{name} names its record: {err}"
                        );
                    }
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
        // No steps: an empty string.
        assert!(
            parse_slots_batch(slots_batch(&[], &[]), 0, |_| (Take, RECORD))
                .unwrap()
                .is_empty()
        );
        // Another number of steps, a byte too many, a place outside the
        // call or half a pair, no packed string: given back whole.
        let one = [[1, 1, 0]];
        let packed = |n: usize| Value::BulkString(vec![0; n]);
        for reply in [
            slots_batch(&[], &[]),
            slots_batch(&[[1, 1, 0], [1, 2, 0]], &[]),
            Value::Array(vec![packed(25)]),
            slots_batch(&one, &[(2, "x")]),
            slots_batch(&one, &[(0, "x")]),
            Value::Array(vec![packed(24), Value::Int(1)]),
            Value::Array(vec![packed(24), Value::Int(1), Value::Int(1)]),
            Value::Array(vec![Value::Int(1), packed(24)]),
            Value::Array(vec![]),
            Value::Int(1),
            Value::Nil,
        ] {
            assert_eq!(
                parse_slots_batch(reply.clone(), 1, |_| (Take, RECORD)).unwrap_err(),
                reply
            );
        }
    }

    #[test]
    fn replies_of_another_shape_are_refused_whole() {
        let packed = |n: usize| Value::BulkString(vec![0; n]);
        for reply in [
            // An answer too few, a byte too many.
            vec![Value::Int(1_000), packed(0)],
            vec![Value::Int(1_000), packed(17)],
            // No clock, a clock that is not one.
            vec![packed(16)],
            vec![text("1000"), packed(16)],
            vec![Value::Int(-5), packed(16)],
            // A refused entry's place outside the batch, or half a pair.
            vec![Value::Int(1_000), packed(16), Value::Int(2), text("x")],
            vec![Value::Int(1_000), packed(16), Value::Int(0), text("x")],
            vec![Value::Int(1_000), packed(16), Value::Int(1)],
            vec![],
        ] {
            assert!(
                batch_of(Value::Array(reply.clone()), &KEYS[..1]).is_err(),
                "{reply:?}"
            );
        }
        // The shape before, two integers per entry, for two entries.
        let before = [1_000, 7, 1_500, 2, 1_005].map(Value::Int).to_vec();
        assert!(batch_of(Value::Array(before), &KEYS[..2]).is_err());
    }
}
