//! The grammars of the values a provider's rate-limit headers hold: counts,
//! delay-seconds and HTTP dates (`Retry-After`), Go-style durations
//! (`6m0s`), RFC 3339 times, and the IETF `RateLimit` and
//! `RateLimit-Policy` lists.
//!
//! Each takes bytes the provider controls: it never panics, reads at most
//! a bounded prefix of them, and allocates nothing (the IETF lists: only
//! what sfv allocates for a string with escapes or a byte sequence, within
//! the field's bounded length). An error is why the value was ignored, in
//! words for the log.

use std::borrow::Cow;
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use sfv::visitor::{
    EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, KeyRef, Parser, StringRef};

/// Why a value was ignored, in words.
pub(super) type Why = &'static str;

pub(super) const NOT_TEXT: Why = "not visible ASCII text";
pub(super) const EMPTY: Why = "empty";
pub(super) const TOO_LONG: Why = "longer than a value of its kind can be";
pub(super) const MALFORMED: Why = "malformed";
pub(super) const NEGATIVE: Why = "negative";
pub(super) const OVERFLOWS: Why = "too large to count";
pub(super) const PAST: Why = "a time that is not in the future";
pub(super) const ABSURD: Why = "longer than the reader's max_signal";
pub(super) const NO_RESET: Why = "a remaining with no reset beside it";
pub(super) const NO_REMAINING: Why = "a reset with no remaining beside it";
pub(super) const NO_PARAMS: Why = "an item without both its r and t";
pub(super) const NOT_A_NAME: Why = "an item that is not a policy name (a string)";
pub(super) const TOO_MANY: Why = "more items or lines than are read";

/// The longest value of one count, duration or time read: an HTTP date is
/// 29 bytes, an RFC 3339 time with nanoseconds and an offset 35.
const MAX_VALUE_LEN: usize = 64;

/// The longest line of an IETF field read.
const MAX_FIELD_LEN: usize = 1024;

/// The most items of the `RateLimit` field read, over all its lines, and
/// the most lines of each IETF field read.
pub(super) const MAX_ITEMS: usize = 16;

/// The value's text, trimmed of spaces and tabs: visible ASCII, not empty,
/// at most [`MAX_VALUE_LEN`] bytes.
pub(super) fn text(value: &HeaderValue) -> Result<&str, Why> {
    if value.len() > MAX_VALUE_LEN {
        return Err(TOO_LONG);
    }
    let text = value.to_str().map_err(|_| NOT_TEXT)?;
    let text = text.trim_matches([' ', '\t']);
    if text.is_empty() {
        Err(EMPTY)
    } else {
        Ok(text)
    }
}

/// A count: plain decimal digits (Azure's `-1` is negative, not "none").
pub(super) fn count(text: &str) -> Result<u64, Why> {
    let digits = match text.strip_prefix('-') {
        Some(rest) if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) => {
            // `-0` is no count either: a count has no sign.
            return Err(NEGATIVE);
        }
        _ => text,
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MALFORMED);
    }
    digits.parse().map_err(|_| OVERFLOWS)
}

/// `d` if it is at most `max`.
fn within(d: Duration, max: Duration) -> Result<Duration, Why> {
    if d > max { Err(ABSURD) } else { Ok(d) }
}

/// How long from `now` until `at`, which must be later than `now`.
pub(super) fn until(at: SystemTime, now: SystemTime, max: Duration) -> Result<Duration, Why> {
    match at.duration_since(now) {
        Ok(d) if !d.is_zero() => within(d, max),
        _ => Err(PAST),
    }
}

/// `Retry-After` (RFC 9110, section 10.2.3): delay-seconds, or an HTTP
/// date (IMF-fixdate, or the obsolete RFC 850 and asctime forms), as a
/// delay from `now`. Zero seconds is a valid delay of zero; a date at or
/// before `now` is ignored.
pub(super) fn retry_after(text: &str, now: SystemTime, max: Duration) -> Result<Duration, Why> {
    if text.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        let secs = count(text)?;
        return within(Duration::from_secs(secs), max);
    }
    let at = httpdate::parse_http_date(text).map_err(|_| MALFORMED)?;
    until(at, now, max)
}

/// A Go-style duration, as OpenAI's `x-ratelimit-reset-*` send it: one or
/// more numbers, each with an optional fraction and a unit (`ns`, `us`,
/// `ms`, `s`, `m`, `h`): `6m0s`, `1s`, `120ms`, `1h2m3.5s`, `0.5s`; or a
/// bare `0`. No sign: a negative duration is ignored. Fractions finer than
/// a nanosecond are cut.
pub(super) fn go_duration(text: &str, max: Duration) -> Result<Duration, Why> {
    let bytes = text.as_bytes();
    if bytes.first() == Some(&b'-') {
        return Err(NEGATIVE);
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total: u128 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let mut whole: u128 = 0;
        let mut digits = 0;
        while let Some(&b) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u128::from(b - b'0')))
                .ok_or(OVERFLOWS)?;
            digits += 1;
            i += 1;
        }
        // The fraction, to 18 digits: below a nanosecond of the largest unit.
        let (mut fraction, mut scale) = (0u128, 1u128);
        if bytes.get(i) == Some(&b'.') {
            i += 1;
            while let Some(&b) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
                if scale < 1_000_000_000_000_000_000 {
                    fraction = fraction * 10 + u128::from(b - b'0');
                    scale *= 10;
                }
                digits += 1;
                i += 1;
            }
        }
        if digits == 0 {
            return Err(MALFORMED);
        }
        let start = i;
        while bytes.get(i).is_some_and(|b| b.is_ascii_alphabetic()) {
            i += 1;
        }
        let unit: u128 = match &bytes[start..i] {
            b"ns" => 1,
            b"us" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return Err(MALFORMED),
        };
        // fraction < 10^18 and unit < 4 * 10^12: the product fits.
        let part = whole
            .checked_mul(unit)
            .and_then(|nanos| nanos.checked_add(fraction * unit / scale))
            .ok_or(OVERFLOWS)?;
        total = total.checked_add(part).ok_or(OVERFLOWS)?;
    }
    if total > max.as_nanos() {
        return Err(ABSURD);
    }
    // At most `max`, so the seconds fit a u64.
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| OVERFLOWS)?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// An RFC 3339 date-time (`2024-05-01T12:00:30Z`,
/// `2024-05-01T14:00:30.5+02:00`), as Anthropic's
/// `anthropic-ratelimit-*-reset` send it: `T`, `t` or a space between the
/// date and the time, `Z`, `z` or an offset of at most 23:59, a leap
/// second (`:60`) read as the second after `:59`. A time before 1970 is
/// in the past.
pub(super) fn rfc3339(text: &str) -> Result<SystemTime, Why> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return Err(MALFORMED);
    }
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(at, sep)| b[at] != sep) || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(MALFORMED);
    }
    let year = digits(&b[0..4])?;
    let (month, day) = (digits(&b[5..7])?, digits(&b[8..10])?);
    let (hour, minute, second) = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(MALFORMED);
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        let mut scale = 100_000_000;
        while let Some(&d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            nanos += u32::from(d - b'0') * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return Err(MALFORMED);
        }
    }
    let offset: i64 = match &b[i.min(b.len())..] {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (hours, minutes) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if hours > 23 || minutes > 59 {
                return Err(MALFORMED);
            }
            let offset = i64::from(hours * 3600 + minutes * 60);
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return Err(MALFORMED),
    };
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset;
    // Before 1970 is long past; at most year 9999 plus a day fits.
    let secs = u64::try_from(secs).map_err(|_| PAST)?;
    UNIX_EPOCH
        .checked_add(Duration::new(secs, nanos))
        .ok_or(OVERFLOWS)
}

/// The number of `bytes`, all ASCII digits (at most 4 of them).
fn digits(bytes: &[u8]) -> Result<u32, Why> {
    bytes.iter().try_fold(0u32, |n, &b| {
        if b.is_ascii_digit() {
            Ok(n * 10 + u32::from(b - b'0'))
        } else {
            Err(MALFORMED)
        }
    })
}

/// The days in `month` (1 to 12) of `year`, in the proleptic Gregorian
/// calendar.
fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to `year-month-day` (month 1 to 12), in the
/// proleptic Gregorian calendar: Howard Hinnant's `days_from_civil`.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// What one item of the IETF `RateLimit` field says: its policy's name,
/// what remains (`r`) and in how long its quota resets (`t`, seconds).
#[derive(Debug)]
pub(super) struct Limit<'a> {
    pub(super) name: Cow<'a, StringRef>,
    pub(super) left: u64,
    pub(super) reset: Duration,
    /// The quota unit its `RateLimit-Policy` item names (`qu`), if any.
    pub(super) unit: Option<QuotaUnit>,
}

/// The quota unit (`qu`) of a `RateLimit-Policy` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaUnit {
    Requests,
    Tokens,
    /// `content-bytes`, `concurrent-requests`, or anything else: not a
    /// budget of calls or tokens.
    Other,
}

/// The items of a response's `RateLimit` field (each line parsed on its
/// own, as a list split across lines is), then the quota units its
/// `RateLimit-Policy` field names for them.
#[derive(Debug)]
pub(super) struct Limits<'a> {
    items: [Option<Limit<'a>>; MAX_ITEMS],
    len: usize,
    max: Duration,
    /// Why the first item of the line being read was left out.
    why: Option<Why>,
}

impl<'a> Limits<'a> {
    pub(super) fn new(max: Duration) -> Self {
        Self {
            items: [const { None }; MAX_ITEMS],
            len: 0,
            max,
            why: None,
        }
    }

    /// Reads one line of `RateLimit`. A line that does not parse adds
    /// nothing; one that does adds its well-formed items, and the error
    /// says why the first other one was left out.
    pub(super) fn line(&mut self, line: &'a HeaderValue) -> Result<(), Why> {
        if line.len() > MAX_FIELD_LEN {
            return Err(TOO_LONG);
        }
        let start = self.len;
        self.why = None;
        if Parser::new(line.as_bytes())
            .parse_list_with_visitor(self)
            .is_err()
        {
            for item in &mut self.items[start..self.len] {
                *item = None;
            }
            self.len = start;
            return Err(MALFORMED);
        }
        self.why.take().map_or(Ok(()), Err)
    }

    /// Reads one line of `RateLimit-Policy`: each of its items gives its
    /// quota unit to the `RateLimit` items of the same name. A line that
    /// does not parse gives none.
    pub(super) fn policy_line(&mut self, line: &'a HeaderValue) -> Result<(), Why> {
        if line.len() > MAX_FIELD_LEN {
            return Err(TOO_LONG);
        }
        let mut policies = Policies {
            limits: self,
            units: [None; MAX_ITEMS],
        };
        Parser::new(line.as_bytes())
            .parse_list_with_visitor(&mut policies)
            .map_err(|_| MALFORMED)?;
        let units = policies.units;
        for (item, unit) in self.items.iter_mut().zip(units) {
            if let (Some(item), Some(unit)) = (item, unit) {
                item.unit = Some(unit);
            }
        }
        Ok(())
    }

    /// The items read.
    pub(super) fn items(&self) -> impl Iterator<Item = &Limit<'a>> {
        self.items.iter().flatten()
    }

    fn note(&mut self, why: Why) {
        self.why.get_or_insert(why);
    }
}

impl<'de> ListVisitor<'de> for Limits<'de> {
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Infallible> {
        Ok(LimitEntry { limits: self })
    }
}

/// One entry of a `RateLimit` line being read.
struct LimitEntry<'v, 'de> {
    limits: &'v mut Limits<'de>,
}

impl<'de> ItemVisitor<'de> for LimitEntry<'_, 'de> {
    type Error = Infallible;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de>, Infallible> {
        let name = match bare_item {
            BareItemFromInput::String(name) => Some(name),
            _ => None,
        };
        Ok(LimitParams {
            limits: self.limits,
            name,
            r: None,
            t: None,
        })
    }
}

impl<'de> EntryVisitor<'de> for LimitEntry<'_, 'de> {
    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Infallible> {
        self.limits.note(NOT_A_NAME);
        Ok(Ignored)
    }
}

/// The parameters of one `RateLimit` item, as they are read: each a
/// count, or why not (the last of a key counts, as RFC 9651 says).
struct LimitParams<'v, 'de> {
    limits: &'v mut Limits<'de>,
    name: Option<Cow<'de, StringRef>>,
    r: Option<Result<u64, Why>>,
    t: Option<Result<u64, Why>>,
}

/// A non-negative sf-integer.
fn sf_count(value: &BareItemFromInput<'_>) -> Result<u64, Why> {
    match value {
        BareItemFromInput::Integer(n) => u64::try_from(i64::from(*n)).map_err(|_| NEGATIVE),
        _ => Err(MALFORMED),
    }
}

impl<'de> ParameterVisitor<'de> for LimitParams<'_, 'de> {
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Infallible> {
        match key.as_str() {
            "r" => self.r = Some(sf_count(&value)),
            "t" => self.t = Some(sf_count(&value)),
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Infallible> {
        let limits = self.limits;
        let read = match (self.name, self.r, self.t) {
            (None, ..) => Err(NOT_A_NAME),
            (Some(_), None, _) | (Some(_), _, None) => Err(NO_PARAMS),
            (Some(name), Some(r), Some(t)) => r.and_then(|left| {
                let reset = within(Duration::from_secs(t?), limits.max)?;
                Ok(Limit {
                    name,
                    left,
                    reset,
                    unit: None,
                })
            }),
        };
        match read {
            Ok(limit) => match limits.items.get_mut(limits.len) {
                Some(slot) => {
                    *slot = Some(limit);
                    limits.len += 1;
                }
                None => limits.note(TOO_MANY),
            },
            Err(why) => limits.note(why),
        }
        Ok(())
    }
}

/// A `RateLimit-Policy` line being read: the quota unit each of its items
/// gives the `RateLimit` items of its name, kept apart until the line
/// has parsed whole.
struct Policies<'v, 'a> {
    limits: &'v Limits<'a>,
    units: [Option<QuotaUnit>; MAX_ITEMS],
}

impl<'de> ListVisitor<'de> for Policies<'_, '_> {
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Infallible> {
        Ok(PolicyEntry { policies: self })
    }
}

/// One entry of a `RateLimit-Policy` line being read.
struct PolicyEntry<'v, 'w, 'a> {
    policies: &'v mut Policies<'w, 'a>,
}

impl<'de> ItemVisitor<'de> for PolicyEntry<'_, '_, '_> {
    type Error = Infallible;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de>, Infallible> {
        let name = match bare_item {
            BareItemFromInput::String(name) => Some(name),
            _ => None,
        };
        Ok(PolicyParams {
            policies: self.policies,
            name,
            unit: QuotaUnit::Requests,
        })
    }
}

impl<'de> EntryVisitor<'de> for PolicyEntry<'_, '_, '_> {
    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Infallible> {
        Ok(Ignored)
    }
}

/// The parameters of one `RateLimit-Policy` item: its quota unit (`qu`,
/// `"requests"` when absent, as the draft says).
struct PolicyParams<'v, 'w, 'a, 'de> {
    policies: &'v mut Policies<'w, 'a>,
    name: Option<Cow<'de, StringRef>>,
    unit: QuotaUnit,
}

impl<'de> ParameterVisitor<'de> for PolicyParams<'_, '_, '_, 'de> {
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Infallible> {
        if key.as_str() == "qu" {
            let unit = match &value {
                BareItemFromInput::String(unit) => Some(unit.as_str()),
                BareItemFromInput::Token(unit) => Some(unit.as_str()),
                _ => None,
            };
            self.unit = match unit {
                Some("requests") => QuotaUnit::Requests,
                Some("tokens") => QuotaUnit::Tokens,
                _ => QuotaUnit::Other,
            };
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Infallible> {
        let Some(name) = self.name else {
            return Ok(());
        };
        let named = self.policies.limits.items.iter().map(|item| {
            item.as_ref()
                .is_some_and(|item| item.name.as_str() == name.as_str())
        });
        for (unit, named) in self.policies.units.iter_mut().zip(named) {
            if named {
                *unit = Some(self.unit);
            }
        }
        Ok(())
    }
}
