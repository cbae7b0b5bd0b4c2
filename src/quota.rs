//! How many hits a key may make, and in how long a window; and their
//! text form, the rate string (see [`Quota`]).

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::str::FromStr;
use std::time::Duration;

use crate::error::{ConfigError, RateProblem};

/// The length of a pinned window, in whole milliseconds, from 1 ms to
/// [`Window::MAX`] (100 years).
///
/// A window opens at a key's first hit and closes a fixed time later; hits in
/// between never move it. Sub-millisecond parts round **up**, so a window can
/// never collapse to zero, and a zero or negative window is rejected rather
/// than read as "no expiry". A window past [`Window::MAX`] is rejected too,
/// when the quota is built: every backend holds every accepted window
/// exactly, so no quota accepted here fails on every request.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{ConfigError, Window};
///
/// assert_eq!(Window::new(Duration::from_micros(1)).unwrap().as_millis(), 1);
/// assert_eq!(Window::try_from_secs_f64(1e-10).unwrap().as_millis(), 1);
/// assert_eq!(Window::new(Duration::ZERO), Err(ConfigError::NonPositiveWindow));
/// assert_eq!(Window::new(Window::MAX.as_duration()), Ok(Window::MAX));
/// assert_eq!(
///     Window::try_from_millis(Window::MAX.as_millis() as i64 + 1),
///     Err(ConfigError::WindowTooLong)
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window(NonZeroU64);

/// [`Window::MAX`] in milliseconds: 36,525 days.
const MAX_MILLIS: u64 = 36_525 * 86_400_000;

impl Window {
    /// The longest window: 100 years (36,525 days, 3,155,760,000,000 ms).
    ///
    /// Every backend holds it exactly, with room to spare: the memory
    /// backend counts nanoseconds since it was made in a `u64` (584 years),
    /// Redis's Lua numbers are doubles, exact to 2^53 ms (285,000 years),
    /// `PEXPIRE` takes any such count of milliseconds, and PostgreSQL's
    /// `timestamptz` reaches the year 294276, so `now() + window` stays
    /// representable. A limit on anything longer is not a rate limit.
    ///
    /// See [`Window`]'s example, which builds it.
    pub const MAX: Window = match NonZeroU64::new(MAX_MILLIS) {
        Some(millis) => Window(millis),
        None => unreachable!(),
    };

    /// A window of `duration`, rounded up to whole milliseconds.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for a zero duration,
    /// [`ConfigError::WindowTooLong`] past [`Window::MAX`].
    pub fn new(duration: Duration) -> Result<Self, ConfigError> {
        let nanos = duration.as_nanos();
        if nanos == 0 {
            return Err(ConfigError::NonPositiveWindow);
        }
        Self::from_millis(nanos.div_ceil(1_000_000))
    }

    /// A window of `millis` milliseconds, for values read from configuration.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for zero or a negative number,
    /// [`ConfigError::WindowTooLong`] past [`Window::MAX`].
    pub fn try_from_millis(millis: i64) -> Result<Self, ConfigError> {
        if millis <= 0 {
            return Err(ConfigError::NonPositiveWindow);
        }
        Self::from_millis(millis.unsigned_abs().into())
    }

    /// A window of `secs` seconds, for values read from configuration; a
    /// fractional millisecond rounds up, so any positive number, however
    /// small, is at least 1 ms.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for zero, a negative number or NaN,
    /// [`ConfigError::WindowTooLong`] for infinity or anything past
    /// [`Window::MAX`].
    pub fn try_from_secs_f64(secs: f64) -> Result<Self, ConfigError> {
        if secs.is_nan() || secs <= 0.0 {
            return Err(ConfigError::NonPositiveWindow);
        }
        let duration = Duration::try_from_secs_f64(secs).map_err(|_| ConfigError::WindowTooLong)?;
        // A positive value below half a nanosecond converts to zero: it is
        // still a positive window, so it rounds up like any other.
        Self::new(duration.max(Duration::from_nanos(1)))
    }

    /// 1 to [`Window::MAX`] milliseconds, or why not.
    fn from_millis(millis: u128) -> Result<Self, ConfigError> {
        if millis > u128::from(MAX_MILLIS) {
            return Err(ConfigError::WindowTooLong);
        }
        u64::try_from(millis)
            .ok()
            .and_then(NonZeroU64::new)
            .map(Self)
            .ok_or(ConfigError::NonPositiveWindow)
    }

    /// The window in milliseconds (see [`Window`]'s example).
    pub const fn as_millis(self) -> u64 {
        self.0.get()
    }

    /// The window as a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_millis(self.0.get())
    }
}

impl TryFrom<Duration> for Window {
    type Error = ConfigError;

    fn try_from(duration: Duration) -> Result<Self, ConfigError> {
        Self::new(duration)
    }
}

/// At most `limit` hits per key in each window pinned to the key's first hit.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::Quota;
///
/// let login = Quota::new(5, Duration::from_secs(15 * 60)).unwrap();
/// assert_eq!(login.limit(), 5);
/// assert_eq!(login.window().as_millis(), 900_000);
///
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// assert!(Quota::new(5, Duration::ZERO).is_err());
/// ```
///
/// # Rate strings
///
/// A `Quota` parses from and displays as a rate string, so limits can come
/// from configuration (an environment variable, a TOML file); with the
/// `serde` feature it serialises as one, and deserialises from one (see
/// `config::LimiterConfig` for a whole limiter):
///
/// ```text
/// rate   = limit "/" window             "100/min", "1000 / 1h", "20/500ms"
///        | limit " per " window         "5 per 15m", "10 per s"
/// limit  = digits                       1 to 18446744073709551615
/// window = [amount] unit                the amount defaults to 1
/// amount = digits                       at least 1
/// unit   = "ms" | "s" | "m" | "min" | "h" | "d"
/// ```
///
/// - Numbers are plain decimal digits: no sign, no fraction, no separators
///   (write `1500ms`, not `1.5s`).
/// - Units are lowercase: `ms` milliseconds, `s` seconds, `m` or `min`
///   minutes (never months), `h` hours, `d` days.
/// - Whitespace (spaces and tabs) is allowed at either end, around `/`, and
///   between the amount and its unit; `per` is a word of its own, with
///   whitespace on both sides.
/// - The window is bounded like every window: longer than zero, at most
///   [`Window::MAX`] (36525d).
///
/// The canonical form, which [`Display`](fmt::Display) writes, is
/// `LIMIT/AMOUNTUNIT` with no spaces and the largest unit that divides the
/// window exactly (`d`, `h`, `min`, `s`, `ms`): `"100/1min"`, `"5/15min"`,
/// `"10/1s"`, `"1000/1h"`, `"20/500ms"`, `"7/90s"`. Any quota's canonical
/// form parses back to the same quota, and it is also the readable default
/// policy name the layer gives an unnamed extra or tier quota
/// (`"api 10000/1d"`).
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::Quota;
///
/// let login: Quota = "5 per 15m".parse().unwrap();
/// assert_eq!(login, Quota::new(5, Duration::from_secs(900)).unwrap());
/// assert_eq!(login.to_string(), "5/15min");
/// assert_eq!(login.to_string().parse::<Quota>().unwrap(), login);
///
/// let err = "0/min".parse::<Quota>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "invalid rate \"0/min\": the limit is 0; a quota admits at least 1 request per window"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU64,
    window: Window,
}

impl Quota {
    /// `limit` hits per `window`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroLimit`] for a zero limit, and the errors of
    /// [`Window::new`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let limit = NonZeroU64::new(limit).ok_or(ConfigError::ZeroLimit)?;
        Ok(Self::with_window(limit, Window::new(window)?))
    }

    /// `limit` hits per an already validated [`Window`].
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, Window};
    ///
    /// let window = Window::new(Duration::from_secs(90)).unwrap();
    /// let quota = Quota::with_window(NonZeroU64::new(5).unwrap(), window);
    /// assert_eq!(quota, "5/90s".parse().unwrap());
    /// ```
    pub const fn with_window(limit: NonZeroU64, window: Window) -> Self {
        Self { limit, window }
    }

    /// `limit` hits per second. `per_minute`, `per_hour` and `per_day` are
    /// the same with a longer window.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_pinned_window::Quota;
    ///
    /// let ten = NonZeroU32::new(10).unwrap();
    /// assert_eq!(Quota::per_second(ten).window().as_duration(), Duration::from_secs(1));
    /// assert_eq!(Quota::per_minute(ten), "10/min".parse().unwrap());
    /// assert_eq!(Quota::per_hour(ten), "10/h".parse().unwrap());
    /// assert_eq!(Quota::per_day(ten).limit(), 10);
    /// ```
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 1_000)
    }

    /// `limit` hits per minute (example: [`per_second`](Self::per_second)).
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 60_000)
    }

    /// `limit` hits per hour (example: [`per_second`](Self::per_second)).
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 3_600_000)
    }

    /// `limit` hits per day (example: [`per_second`](Self::per_second)).
    pub const fn per_day(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 86_400_000)
    }

    const fn per_millis(limit: NonZeroU32, millis: u64) -> Self {
        // Both are non-zero by construction; `match` keeps this `const`.
        let limit = match NonZeroU64::new(limit.get() as u64) {
            Some(limit) => limit,
            None => unreachable!(),
        };
        let window = match NonZeroU64::new(millis) {
            Some(window) => Window(window),
            None => unreachable!(),
        };
        Self { limit, window }
    }

    /// Hits admitted per window.
    ///
    /// ```
    /// use tower_pinned_window::Quota;
    ///
    /// let quota: Quota = "5 per 15m".parse().unwrap();
    /// assert_eq!(quota.limit(), 5);
    /// assert_eq!(quota.window().as_millis(), 15 * 60 * 1000);
    /// ```
    pub const fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The window's length (example: [`limit`](Self::limit)).
    pub const fn window(&self) -> Window {
        self.window
    }

    /// This quota with its limit cut to `share` of it (at least 1), in the
    /// same window: what the insurance limiter applies.
    pub(crate) fn share(self, share: Share) -> Self {
        let limit =
            NonZeroU64::new(share.of(self.limit())).expect("a share of a limit is at least 1");
        Self::with_window(limit, self.window)
    }
}

/// The units of a rate string, largest first: what [`Window`]'s
/// [`Display`](fmt::Display) picks from, in this order.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("min", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The milliseconds in one `unit`, for every spelling the parser accepts.
fn unit_millis(unit: &str) -> Option<u64> {
    match unit {
        "m" => Some(60_000),
        _ => UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, millis)| *millis),
    }
}

fn is_space(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The window as a whole number of the largest unit that divides it:
/// `15min`, `1d`, `90s`, `500ms`.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.as_millis();
        let (unit, size) = UNITS
            .into_iter()
            .find(|(_, size)| millis.is_multiple_of(*size))
            .unwrap_or(("ms", 1));
        write!(f, "{}{unit}", millis / size)
    }
}

/// Parses a window of a rate string: `[amount] unit`, such as `15m`,
/// `500ms`, `min` (see the [rate-string grammar](Quota#rate-strings)).
///
/// ```
/// use tower_pinned_window::Window;
///
/// let window: Window = "15m".parse().unwrap();
/// assert_eq!(window.as_millis(), 900_000);
/// assert_eq!(window.to_string(), "15min");
/// assert!("0s".parse::<Window>().is_err());
/// ```
impl FromStr for Window {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        parse_window(text.trim_matches(is_space))
            .map_err(|(kind, part)| ConfigError::invalid_rate(text, kind, part))
    }
}

/// The window part of a rate string, already trimmed; on error, what was
/// wrong and the part that was.
fn parse_window(text: &str) -> Result<Window, (RateProblem, &str)> {
    if text.is_empty() {
        return Err((RateProblem::MissingWindow, text));
    }
    if text.starts_with('-') {
        return Err((RateProblem::NegativeWindow, text));
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let unit = text[digits..].trim_start_matches(is_space);
    if unit.is_empty() {
        return Err((RateProblem::MissingUnit, text));
    }
    if !unit.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err((RateProblem::InvalidWindow, text));
    }
    let size = unit_millis(unit).ok_or((RateProblem::UnknownUnit, unit))?;
    let amount = match &text[..digits] {
        "" => 1,
        // Only digits: the one way this fails is a number past u64::MAX.
        amount => amount
            .parse::<u64>()
            .map_err(|_| (RateProblem::WindowTooLong, text))?,
    };
    if amount == 0 {
        return Err((RateProblem::ZeroWindow, text));
    }
    let millis = amount
        .checked_mul(size)
        .ok_or((RateProblem::WindowTooLong, text))?;
    Window::from_millis(millis.into()).map_err(|_| (RateProblem::WindowTooLong, text))
}

/// The limit part of a rate string, already trimmed.
fn parse_limit(text: &str) -> Result<NonZeroU64, RateProblem> {
    if text.starts_with('-') && text.len() > 1 && text[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(RateProblem::NegativeLimit);
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RateProblem::InvalidLimit);
    }
    let limit = text
        .parse::<u64>()
        .map_err(|_| RateProblem::LimitTooLarge)?;
    NonZeroU64::new(limit).ok_or(RateProblem::ZeroLimit)
}

/// `text` split at its separator, `/` or the word `per`: the limit and the
/// window, each trimmed.
fn split_rate(text: &str) -> Option<(&str, &str)> {
    if let Some((limit, window)) = text.split_once('/') {
        return Some((limit, window));
    }
    text.match_indices("per").find_map(|(at, per)| {
        let (before, after) = (&text[..at], &text[at + per.len()..]);
        (before.ends_with(is_space) && after.starts_with(is_space)).then_some((before, after))
    })
}

/// The canonical rate string: `LIMIT/WINDOW`, such as `100/1min` or
/// `5/15min` (see the [rate-string grammar](Quota#rate-strings)).
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.limit, self.window)
    }
}

/// Parses a rate string: `"100/min"`, `"5 per 15m"`, `"10/s"`,
/// `"1000/1h"`, `"20/500ms"` (the grammar is in the [rate-string grammar](Quota#rate-strings)).
///
/// ```
/// use tower_pinned_window::{ConfigError, Quota};
///
/// let quota: Quota = "1000 / 1h".parse().unwrap();
/// assert_eq!((quota.limit(), quota.window().as_millis()), (1000, 3_600_000));
/// for (bad, reason) in [
///     ("abc", "no \"/\" or \" per \" between the limit and the window"),
///     ("-1/min", "the limit -1 is negative"),
///     ("10/0s", "the window \"0s\" is zero"),
///     ("10/5y", "unknown unit \"y\""),
/// ] {
///     let err = bad.parse::<Quota>().unwrap_err();
///     assert!(matches!(&err, ConfigError::InvalidRate { reason: r, .. } if r.starts_with(reason)), "{bad}");
/// }
/// ```
impl FromStr for Quota {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let trimmed = text.trim_matches(is_space);
        if trimmed.is_empty() {
            return Err(ConfigError::invalid_rate(text, RateProblem::Empty, ""));
        }
        let (limit, window) = split_rate(trimmed)
            .ok_or_else(|| ConfigError::invalid_rate(text, RateProblem::NoSeparator, trimmed))?;
        let (limit, window) = (limit.trim_matches(is_space), window.trim_matches(is_space));
        let limit =
            parse_limit(limit).map_err(|kind| ConfigError::invalid_rate(text, kind, limit))?;
        let window = parse_window(window)
            .map_err(|(kind, part)| ConfigError::invalid_rate(text, kind, part))?;
        Ok(Self::with_window(limit, window))
    }
}

/// An instance's share of each quota's limit under
/// [`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance): a fraction in `(0, 1]` of the limit that
/// this process admits on its own while the backend is out.
///
/// With `n` instances behind a balancer that spreads a key's requests over
/// them, `Share::one_in(n)` keeps the fleet's total near the limit. The
/// insured limit is the share of the limit rounded down, and at least 1, so
/// a limit smaller than the number of instances is passed by each of them.
///
/// How far past the limit a key can go around an outage: the backend's
/// window that was open when it failed had admitted up to the limit, the
/// local windows open from the first request after the failure, and a store
/// that comes back empty (Redis without persistence) opens new windows
/// too. Each of those counts within its own window; the measured figures of
/// a 4-instance soak through a Redis `kill -9` are in `soak/README.md`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{ConfigError, FailurePolicy, Quota, RateLimitLayer, Share};
///
/// // Four instances: each admits a quarter of the limit while the store is out.
/// let share = Share::one_in(4).unwrap();
/// assert_eq!(share.of(100), 25);
/// assert_eq!(share.of(3), 1, "never 0");
/// assert_eq!(share.to_string(), "1/4");
/// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60)).unwrap())
///     .on_failure(FailurePolicy::Insurance(share));
///
/// assert_eq!(Share::new(3, 2), Err(ConfigError::InvalidShare("3/2".into())));
/// assert_eq!(Share::one_in(0), Err(ConfigError::InvalidShare("1/0".into())));
/// // From configuration: `N/D`, as it prints.
/// assert_eq!("1/4".parse::<Share>(), Ok(share));
/// assert!("a quarter".parse::<Share>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Share {
    numerator: u32,
    denominator: u32,
}

impl Share {
    /// The whole limit: each instance admits as many as the backend would.
    pub const WHOLE: Self = Self {
        numerator: 1,
        denominator: 1,
    };

    /// `numerator / denominator` of each limit; [`ConfigError::InvalidShare`]
    /// unless `0 < numerator <= denominator`.
    pub fn new(numerator: u32, denominator: u32) -> Result<Self, ConfigError> {
        if numerator == 0 || denominator == 0 || numerator > denominator {
            return Err(ConfigError::InvalidShare(format!(
                "{numerator}/{denominator}"
            )));
        }
        Ok(Self {
            numerator,
            denominator,
        })
    }

    /// `1 / instances` of each limit, for `instances` instances that share
    /// the load; [`ConfigError::InvalidShare`] for 0.
    pub fn one_in(instances: u32) -> Result<Self, ConfigError> {
        Self::new(1, instances)
    }

    /// The fraction's numerator.
    pub fn numerator(&self) -> u32 {
        self.numerator
    }

    /// The fraction's denominator.
    pub fn denominator(&self) -> u32 {
        self.denominator
    }

    /// The insured limit for `limit`: the share of it rounded down, and at
    /// least 1.
    pub fn of(&self, limit: u64) -> u64 {
        let share = u128::from(limit) * u128::from(self.numerator) / u128::from(self.denominator);
        u64::try_from(share).unwrap_or(u64::MAX).max(1)
    }
}

/// `N/D`, spaces around either number allowed: what [`Display`](fmt::Display)
/// prints parses back to the same share.
impl FromStr for Share {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let invalid = || ConfigError::InvalidShare(text.to_owned());
        let (numerator, denominator) = text.split_once('/').ok_or_else(invalid)?;
        let number = |part: &str| {
            let part = part.trim();
            // Digits only: no sign, as `u32::from_str` would take.
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            part.parse::<u32>().map_err(|_| invalid())
        };
        Self::new(number(numerator)?, number(denominator)?).map_err(|_| invalid())
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.numerator, self.denominator)
    }
}

#[cfg(test)]
mod tests;
