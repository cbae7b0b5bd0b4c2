//! The provider's word: what an answer's status and rate-limit headers say
//! about the budgets a provider keeps for its callers (`429` with
//! `Retry-After`, OpenAI's and Anthropic's `*-ratelimit-*` headers, the
//! IETF `RateLimit` fields), read into a [`Word`] by a [`Reader`]. Pure:
//! it reads the answer's head and a wall-clock time, and changes nothing.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::count::ResponseHead;
use crate::quota::Window;

mod parse;

use parse::{Limits, MAX_ITEMS, QuotaUnit, Why};

/// Values longer than this are ignored by default (see
/// [`Reader::max_signal`]): one hour.
pub const DEFAULT_MAX_SIGNAL: Duration = Duration::from_secs(60 * 60);

/// Which of a provider's budgets a signal is about: providers of LLM APIs
/// limit both the calls and the tokens they spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The budget of calls.
    Requests,
    /// The budget of tokens.
    Tokens,
}

/// What an answer says remains of one budget: `left` calls (or tokens),
/// until `reset` from the time the answer was read, when the provider's
/// budget is whole again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    /// What the provider says is left, as it sent it (even above the
    /// budget's limit: comparing is the layer's work).
    pub left: u64,
    /// How long until the provider's budget resets.
    pub reset: Duration,
}

/// What an answer says about one budget. Empty (the [`Default`]) when it
/// says nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Signal {
    /// Stop sending until this long from the time the answer was read
    /// (the budget is "closed"). Never zero: an answer that says "retry
    /// now" closes nothing.
    pub closed_for: Option<Duration>,
    /// What remains, when the answer says so.
    pub remaining: Option<Remaining>,
}

impl Signal {
    /// Whether the signal says nothing.
    pub fn is_silent(&self) -> bool {
        self.closed_for.is_none() && self.remaining.is_none()
    }
}

/// What one answer says: a [`Signal`] per [`Unit`]. Every duration in it is
/// at most its reader's [`max_signal`](Reader::max_signal).
///
/// A [custom reader](Reader::custom) starts from the silent
/// [`Word::default()`] and sets the fields it reads (see [`Reader`]'s
/// example).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Word {
    /// About the budget of calls.
    pub requests: Signal,
    /// About the budget of tokens.
    pub tokens: Signal,
}

impl Word {
    /// The signal about `unit`.
    ///
    /// ```
    /// use tower_pinned_window::outbound::{Unit, Word};
    ///
    /// let mut word = Word::default();
    /// word.tokens.closed_for = Some(std::time::Duration::from_secs(2));
    /// assert!(word.of(Unit::Requests).is_silent());
    /// assert!(!word.of(Unit::Tokens).is_silent());
    /// ```
    pub fn of(&self, unit: Unit) -> &Signal {
        match unit {
            Unit::Requests => &self.requests,
            Unit::Tokens => &self.tokens,
        }
    }

    /// Whether the answer says nothing about either budget: what an answer
    /// without rate-limit headers (or with only ignored ones) says.
    pub fn is_silent(&self) -> bool {
        self.requests.is_silent() && self.tokens.is_silent()
    }

    fn of_mut(&mut self, unit: Unit) -> &mut Signal {
        match unit {
            Unit::Requests => &mut self.requests,
            Unit::Tokens => &mut self.tokens,
        }
    }
}

/// A value that was present and ignored: which header, and why, for the
/// layer's log. Its [`Display`](fmt::Display) is `header: why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ignored {
    /// The header's name, in lowercase (`"retry-after"`), or `"custom"`
    /// for a value a [custom reader](Reader::custom) gave.
    pub header: &'static str,
    /// Why it was ignored, in words (`"negative"`, `"malformed"`, ...).
    pub why: &'static str,
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.header, self.why)
    }
}

/// The reader of a closure (see [`Reader::custom`]).
type ReadFn = Arc<dyn Fn(&ResponseHead<'_>) -> Word + Send + Sync>;

/// How a budget reads its provider's answers: into a [`Word`], from the
/// answer's head ([`ResponseHead`](crate::outcome::ResponseHead): its
/// status and headers, what a `Response` gives without its body) and the
/// wall-clock time it arrived.
///
/// - [`standard`](Self::standard) (the default) reads every format below;
/// - [`none`](Self::none) reads nothing: the budget follows only its own
///   quota;
/// - [`custom`](Self::custom) is your own reading, a closure over the head.
///
/// | format | headers | values |
/// |---|---|---|
/// | `Retry-After` (RFC 9110), on `429` and `503` only | `retry-after` | delay-seconds, or an HTTP date |
/// | OpenAI | `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests`, `x-ratelimit-remaining-tokens`, `x-ratelimit-reset-tokens` | counts; durations such as `6m0s`, `1s`, `120ms`, `1h2m3.5s`, `0.5s` (units `h`, `m`, `s`, `ms`, `us`, `ns`) |
/// | Anthropic | `anthropic-ratelimit-requests-remaining` and `-reset`, `anthropic-ratelimit-tokens-*`, `-input-tokens-*`, `-output-tokens-*` (all three tokens) | counts; RFC 3339 times (`2024-05-01T12:00:30Z`, with an offset too) |
/// | IETF (draft-ietf-httpapi-ratelimit-headers), as [`HeaderStyle::Ietf`](crate::response::HeaderStyle::Ietf) writes it | `RateLimit: "name";r=R;t=T` and `RateLimit-Policy` | `r` what remains, `t` seconds until it resets; requests, unless the policy of the same name says `qu="tokens"` |
///
/// What the standard reader makes of them:
///
/// - **What remains** of a unit is its smallest remaining among the
///   formats (and among the IETF items, and Anthropic's three token
///   budgets), with its reset; of two equal ones, the later reset. It
///   needs both values of its pair (a remaining and its reset).
/// - **Closed:** a `429` (or a `503`) with a valid `Retry-After` longer
///   than zero closes the units whose remaining is 0 for that long, or
///   both units when none says 0 (the provider refused the call without
///   saying which budget). Otherwise, a unit whose remaining is 0 is
///   closed until its reset. A `429` with nothing usable closes nothing:
///   **no wait is ever invented**.
/// - **Ignored:** a value that is malformed, negative (Azure's `-1`), not
///   visible ASCII, too large to count, empty, a time at or before `now`,
///   or longer than [`max_signal`](Self::max_signal) changes nothing, and
///   the first one (in the order of the table) is returned beside the
///   word. So is a remaining without its reset (or the reverse), and an
///   IETF item without its `r` and `t`. A policy field that does not parse
///   makes the IETF items unreadable (their units are unknown): they are
///   ignored too. Items of a policy whose unit is neither requests nor
///   tokens (`content-bytes`) are not read.
/// - **Bounds:** a header's first value is read (every line of the IETF
///   fields, up to 16 items); values longer than a value of their kind
///   can be (64 bytes, 1024 a line for the IETF fields) are ignored.
///
/// Absolute times (HTTP dates, RFC 3339) are read against the `now` given
/// to [`read`](Self::read): a clock that differs from the provider's by
/// some seconds moves them by as much.
///
/// # Example
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::Response;
/// use tower_pinned_window::Window;
/// use tower_pinned_window::outbound::{Reader, Remaining, Unit, Word};
/// use tower_pinned_window::outcome::ResponseHead;
///
/// let answer = Response::builder()
///     .status(429)
///     .header("retry-after", "3")
///     .header("x-ratelimit-remaining-requests", "0")
///     .header("x-ratelimit-reset-requests", "6m0s")
///     .header("x-ratelimit-remaining-tokens", "-1")
///     .header("x-ratelimit-reset-tokens", "1s")
///     .body(())
///     .unwrap();
/// let (word, ignored) = Reader::standard().read(&ResponseHead::new(&answer), SystemTime::now());
/// // The calls are closed for 3 s, and the tokens' `-1` (Azure's "none") is ignored.
/// assert_eq!(word.of(Unit::Requests).closed_for, Some(Duration::from_secs(3)));
/// assert_eq!(
///     word.requests.remaining,
///     Some(Remaining { left: 0, reset: Duration::from_secs(360) })
/// );
/// assert!(word.of(Unit::Tokens).is_silent());
/// assert_eq!(ignored.unwrap().to_string(), "x-ratelimit-remaining-tokens: negative");
///
/// // Values beyond `max_signal` are ignored: 6 minutes is more than 5.
/// let five_minutes = Window::new(Duration::from_secs(300)).unwrap();
/// let (word, _) = Reader::standard()
///     .max_signal(five_minutes)
///     .read(&ResponseHead::new(&answer), SystemTime::now());
/// assert_eq!(word.requests.remaining, None);
///
/// // A reader of your own: a provider that says `x-quota-wait-ms` when to come back.
/// let reader = Reader::custom(|head: &ResponseHead<'_>| {
///     let mut word = Word::default();
///     let wait = head.headers().get("x-quota-wait-ms").and_then(|v| v.to_str().ok()?.parse().ok());
///     word.requests.closed_for = wait.map(Duration::from_millis);
///     word
/// });
/// let answer = Response::builder().header("x-quota-wait-ms", "250").body(()).unwrap();
/// let (word, _) = reader.read(&ResponseHead::new(&answer), SystemTime::now());
/// assert_eq!(word.requests.closed_for, Some(Duration::from_millis(250)));
/// ```
#[derive(Clone)]
#[must_use]
pub struct Reader {
    reads: Reads,
    max: Duration,
}

#[derive(Clone)]
enum Reads {
    Standard,
    Nothing,
    Custom(ReadFn),
}

impl Default for Reader {
    /// The [standard](Reader::standard) reader.
    fn default() -> Self {
        Self::standard()
    }
}

impl Reader {
    /// Every format in the [table](Reader), with values up to
    /// [`DEFAULT_MAX_SIGNAL`]: the reader a budget uses unless told
    /// otherwise.
    pub fn standard() -> Self {
        Self {
            reads: Reads::Standard,
            max: DEFAULT_MAX_SIGNAL,
        }
    }

    /// Reads nothing: every answer is silent, and the budget follows only
    /// its own quota.
    ///
    /// ```
    /// # use std::time::SystemTime;
    /// # use tower_pinned_window::{outbound::Reader, outcome::ResponseHead};
    /// let answer = http::Response::builder().status(429).header("retry-after", "5").body(()).unwrap();
    /// let (word, ignored) = Reader::none().read(&ResponseHead::new(&answer), SystemTime::now());
    /// assert!(word.is_silent() && ignored.is_none());
    /// ```
    pub fn none() -> Self {
        Self {
            reads: Reads::Nothing,
            max: DEFAULT_MAX_SIGNAL,
        }
    }

    /// Your own reading: `read` turns an answer's head into a [`Word`]
    /// (see the [example](Reader#example)). The
    /// [`max_signal`](Self::max_signal) holds for it too: a duration
    /// above it is dropped and reported as [`Ignored`] (header `"custom"`),
    /// and a `closed_for` of zero is dropped silently.
    pub fn custom<F>(read: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> Word + Send + Sync + 'static,
    {
        Self {
            reads: Reads::Custom(Arc::new(read)),
            max: DEFAULT_MAX_SIGNAL,
        }
    }

    /// Values longer than `max` (a reset, a `Retry-After`, a closing time)
    /// are absurd: they are ignored, and reported as [`Ignored`] (default
    /// [`DEFAULT_MAX_SIGNAL`], one hour). A [`Window`], so never zero, as
    /// every other duration a layer is given.
    pub fn max_signal(mut self, max: Window) -> Self {
        self.max = max.as_duration();
        self
    }

    /// What the answer whose head is `head` says, read at wall-clock `now`
    /// (for HTTP dates and RFC 3339 times), and the first value ignored, if
    /// any. Never panics; allocates nothing when the answer has no
    /// rate-limit header (it only compares the headers' names), and bounds
    /// the work on every value (see [`Reader`]).
    pub fn read(&self, head: &ResponseHead<'_>, now: SystemTime) -> (Word, Option<Ignored>) {
        self.read_with(head, || now)
    }

    /// [`read`](Self::read), the wall clock read only when a value is a
    /// time: an answer without one costs no clock read.
    pub(crate) fn read_now(&self, head: &ResponseHead<'_>) -> (Word, Option<Ignored>) {
        self.read_with(head, SystemTime::now)
    }

    fn read_with(
        &self,
        head: &ResponseHead<'_>,
        now: impl Fn() -> SystemTime + Copy,
    ) -> (Word, Option<Ignored>) {
        match &self.reads {
            Reads::Standard => standard(head.status(), head.headers(), now, self.max),
            Reads::Nothing => (Word::default(), None),
            Reads::Custom(read) => capped(read(head), self.max),
        }
    }
}

impl Reader {
    /// Whether it reads anything: a budget that reads nothing does not
    /// keep what it needs to hear an answer.
    pub(crate) fn reads(&self) -> bool {
        !matches!(self.reads, Reads::Nothing)
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reads = match self.reads {
            Reads::Standard => "standard",
            Reads::Nothing => "none",
            Reads::Custom(_) => "custom",
        };
        f.debug_struct("Reader")
            .field("reads", &reads)
            .field("max_signal", &self.max)
            .finish()
    }
}

/// The `header` of an [`Ignored`] value a custom reader gave.
const CUSTOM: &str = "custom";

/// A custom reader's `word`, with what is above `max` dropped.
fn capped(mut word: Word, max: Duration) -> (Word, Option<Ignored>) {
    let mut ignored = Notes::default();
    for unit in [Unit::Requests, Unit::Tokens] {
        let signal = word.of_mut(unit);
        if signal.closed_for.is_some_and(|d| d > max) {
            signal.closed_for = None;
            ignored.note(CUSTOM, parse::ABSURD);
        }
        if signal.closed_for == Some(Duration::ZERO) {
            signal.closed_for = None;
        }
        if signal.remaining.is_some_and(|r| r.reset > max) {
            signal.remaining = None;
            ignored.note(CUSTOM, parse::ABSURD);
        }
    }
    (word, ignored.0)
}

/// The first value ignored.
#[derive(Default)]
struct Notes(Option<Ignored>);

impl Notes {
    fn note(&mut self, header: &'static str, why: Why) {
        self.0.get_or_insert(Ignored { header, why });
    }
}

const RETRY_AFTER: &str = "retry-after";
const RATELIMIT: &str = "ratelimit";
const RATELIMIT_POLICY: &str = "ratelimit-policy";

/// How a pair's reset is written.
#[derive(Clone, Copy)]
enum Reset {
    /// A duration from now, `6m0s` (OpenAI).
    After,
    /// An RFC 3339 time (Anthropic).
    At,
}

/// A pair of headers about one budget: what remains, and when it resets.
struct Pair {
    unit: Unit,
    remaining: &'static str,
    reset: &'static str,
    written: Reset,
}

/// The pairs read, in the order of the table.
const PAIRS: [Pair; 6] = [
    Pair {
        unit: Unit::Requests,
        remaining: "x-ratelimit-remaining-requests",
        reset: "x-ratelimit-reset-requests",
        written: Reset::After,
    },
    Pair {
        unit: Unit::Tokens,
        remaining: "x-ratelimit-remaining-tokens",
        reset: "x-ratelimit-reset-tokens",
        written: Reset::After,
    },
    Pair {
        unit: Unit::Requests,
        remaining: "anthropic-ratelimit-requests-remaining",
        reset: "anthropic-ratelimit-requests-reset",
        written: Reset::At,
    },
    Pair {
        unit: Unit::Tokens,
        remaining: "anthropic-ratelimit-tokens-remaining",
        reset: "anthropic-ratelimit-tokens-reset",
        written: Reset::At,
    },
    Pair {
        unit: Unit::Tokens,
        remaining: "anthropic-ratelimit-input-tokens-remaining",
        reset: "anthropic-ratelimit-input-tokens-reset",
        written: Reset::At,
    },
    Pair {
        unit: Unit::Tokens,
        remaining: "anthropic-ratelimit-output-tokens-remaining",
        reset: "anthropic-ratelimit-output-tokens-reset",
        written: Reset::At,
    },
];

/// The rate-limit headers an answer has: the first value of each, and
/// whether the IETF fields are there (their lines are read from the map).
#[derive(Default)]
struct Found<'a> {
    any: bool,
    retry_after: Option<&'a HeaderValue>,
    /// Each pair's remaining and reset.
    pairs: [[Option<&'a HeaderValue>; 2]; PAIRS.len()],
    limits: bool,
    policy: bool,
}

impl<'a> Found<'a> {
    /// One pass over the headers' names: each compared with the names read
    /// only when its first letter is one of theirs.
    fn of(headers: &'a HeaderMap) -> Self {
        let mut found = Self::default();
        for (name, value) in headers {
            let name = name.as_str();
            if !matches!(name.as_bytes().first(), Some(b'a' | b'r' | b'x')) {
                continue;
            }
            let slot = match name {
                RETRY_AFTER => &mut found.retry_after,
                RATELIMIT => {
                    found.limits = true;
                    found.any = true;
                    continue;
                }
                RATELIMIT_POLICY => {
                    found.policy = true;
                    continue;
                }
                _ => {
                    let pair = PAIRS.iter().enumerate().find_map(|(i, pair)| {
                        [pair.remaining, pair.reset]
                            .iter()
                            .position(|n| *n == name)
                            .map(|side| (i, side))
                    });
                    let Some((i, side)) = pair else {
                        continue;
                    };
                    &mut found.pairs[i][side]
                }
            };
            found.any = true;
            slot.get_or_insert(value);
        }
        found
    }
}

/// The standard reader (see [`Reader`]).
fn standard(
    status: StatusCode,
    headers: &HeaderMap,
    now: impl Fn() -> SystemTime + Copy,
    max: Duration,
) -> (Word, Option<Ignored>) {
    let found = Found::of(headers);
    let mut word = Word::default();
    if !found.any {
        return (word, None);
    }
    let mut ignored = Notes::default();

    let refused = matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    );
    let retry_after = match found.retry_after.filter(|_| refused) {
        Some(value) => {
            match parse::text(value).and_then(|text| parse::retry_after(text, now(), max)) {
                Ok(delay) => Some(delay),
                Err(why) => {
                    ignored.note(RETRY_AFTER, why);
                    None
                }
            }
        }
        None => None,
    };

    for (pair, [remaining, reset]) in PAIRS.iter().zip(found.pairs) {
        let (remaining, reset) = match (remaining, reset) {
            (None, None) => continue,
            (Some(_), None) => {
                ignored.note(pair.remaining, parse::NO_RESET);
                continue;
            }
            (None, Some(_)) => {
                ignored.note(pair.reset, parse::NO_REMAINING);
                continue;
            }
            (Some(remaining), Some(reset)) => (remaining, reset),
        };
        let left = match parse::text(remaining).and_then(parse::count) {
            Ok(left) => left,
            Err(why) => {
                ignored.note(pair.remaining, why);
                continue;
            }
        };
        let reset = parse::text(reset).and_then(|text| match pair.written {
            Reset::After => parse::go_duration(text, max),
            Reset::At => parse::rfc3339(text).and_then(|at| parse::until(at, now(), max)),
        });
        match reset {
            Ok(reset) => keep(
                &mut word.of_mut(pair.unit).remaining,
                Remaining { left, reset },
            ),
            Err(why) => ignored.note(pair.reset, why),
        }
    }

    if found.limits {
        ietf(headers, found.policy, max, &mut word, &mut ignored);
    }

    match retry_after.filter(|delay| !delay.is_zero()) {
        Some(delay) => {
            let spent = |signal: &Signal| signal.remaining.is_some_and(|r| r.left == 0);
            let (requests, tokens) = (spent(&word.requests), spent(&word.tokens));
            let neither = !requests && !tokens;
            if requests || neither {
                word.requests.closed_for = Some(delay);
            }
            if tokens || neither {
                word.tokens.closed_for = Some(delay);
            }
        }
        None => {
            for signal in [&mut word.requests, &mut word.tokens] {
                signal.closed_for = signal
                    .remaining
                    .filter(|r| r.left == 0 && !r.reset.is_zero())
                    .map(|r| r.reset);
            }
        }
    }
    (word, ignored.0)
}

/// The IETF fields' items, each kept in its unit's remaining.
fn ietf(headers: &HeaderMap, policy: bool, max: Duration, word: &mut Word, ignored: &mut Notes) {
    let mut limits = Limits::new(max);
    for (i, line) in headers.get_all(RATELIMIT).iter().enumerate() {
        if i == MAX_ITEMS {
            ignored.note(RATELIMIT, parse::TOO_MANY);
            break;
        }
        if let Err(why) = limits.line(line) {
            ignored.note(RATELIMIT, why);
        }
    }
    if policy {
        for (i, line) in headers.get_all(RATELIMIT_POLICY).iter().enumerate() {
            if i == MAX_ITEMS {
                ignored.note(RATELIMIT_POLICY, parse::TOO_MANY);
                break;
            }
            if let Err(why) = limits.policy_line(line) {
                // The units of the items are unknown: none is read.
                ignored.note(RATELIMIT_POLICY, why);
                return;
            }
        }
    }
    for limit in limits.items() {
        let unit = match limit.unit {
            None | Some(QuotaUnit::Requests) => Unit::Requests,
            Some(QuotaUnit::Tokens) => Unit::Tokens,
            Some(QuotaUnit::Other) => continue,
        };
        let remaining = Remaining {
            left: limit.left,
            reset: limit.reset,
        };
        keep(&mut word.of_mut(unit).remaining, remaining);
    }
}

/// Keeps the more restrictive of `kept` and `new`: the smaller remaining,
/// or of two equal ones the later reset.
fn keep(kept: &mut Option<Remaining>, new: Remaining) {
    let restricts = |old: &Remaining| {
        (new.left, std::cmp::Reverse(new.reset)) < (old.left, std::cmp::Reverse(old.reset))
    };
    if kept.as_ref().is_none_or(restricts) {
        *kept = Some(new);
    }
}

#[cfg(test)]
mod tests;
