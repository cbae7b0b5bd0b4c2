//! How many hits a key may make, and in how long a window.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use crate::error::ConfigError;

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

    /// The window in milliseconds.
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
    pub const fn with_window(limit: NonZeroU64, window: Window) -> Self {
        Self { limit, window }
    }

    /// `limit` hits per second.
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 1_000)
    }

    /// `limit` hits per minute.
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 60_000)
    }

    /// `limit` hits per hour.
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::per_millis(limit, 3_600_000)
    }

    /// `limit` hits per day.
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
    pub const fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The window's length.
    pub const fn window(&self) -> Window {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_round_up_and_stay_within_one_bound() {
        let max = Window::MAX.as_millis();
        let too_long = Err(ConfigError::WindowTooLong);
        let non_positive = Err(ConfigError::NonPositiveWindow);
        let ms = |ms: u64| Ok(ms);
        type Case = (
            &'static str,
            Result<Window, ConfigError>,
            Result<u64, ConfigError>,
        );
        let cases: &[Case] = &[
            ("zero", Window::new(Duration::ZERO), non_positive.clone()),
            ("1 ns", Window::new(Duration::from_nanos(1)), ms(1)),
            ("0.4 ms", Window::new(Duration::from_micros(400)), ms(1)),
            (
                "1.0000001 ms",
                Window::new(Duration::from_nanos(1_000_001)),
                ms(2),
            ),
            (
                "exact 15 min",
                Window::new(Duration::from_secs(900)),
                ms(900_000),
            ),
            (
                "exactly MAX",
                Window::new(Window::MAX.as_duration()),
                ms(max),
            ),
            (
                "MAX and 1 ns",
                Window::new(Window::MAX.as_duration() + Duration::from_nanos(1)),
                too_long.clone(),
            ),
            (
                "Duration::MAX",
                Window::new(Duration::MAX),
                too_long.clone(),
            ),
            ("millis 0", Window::try_from_millis(0), non_positive.clone()),
            (
                "millis -5",
                Window::try_from_millis(-5),
                non_positive.clone(),
            ),
            (
                "millis i64::MIN",
                Window::try_from_millis(i64::MIN),
                non_positive.clone(),
            ),
            ("millis 7", Window::try_from_millis(7), ms(7)),
            ("millis MAX", Window::try_from_millis(max as i64), ms(max)),
            (
                "millis MAX + 1",
                Window::try_from_millis(max as i64 + 1),
                too_long.clone(),
            ),
            (
                "millis 2^53",
                Window::try_from_millis(1 << 53),
                too_long.clone(),
            ),
            (
                "millis i64::MAX",
                Window::try_from_millis(i64::MAX),
                too_long.clone(),
            ),
            (
                "secs 0",
                Window::try_from_secs_f64(0.0),
                non_positive.clone(),
            ),
            (
                "secs -0",
                Window::try_from_secs_f64(-0.0),
                non_positive.clone(),
            ),
            (
                "secs -1.0",
                Window::try_from_secs_f64(-1.0),
                non_positive.clone(),
            ),
            (
                "secs NaN",
                Window::try_from_secs_f64(f64::NAN),
                non_positive.clone(),
            ),
            (
                "secs -inf",
                Window::try_from_secs_f64(f64::NEG_INFINITY),
                non_positive.clone(),
            ),
            ("secs 1e-10", Window::try_from_secs_f64(1e-10), ms(1)),
            (
                "secs smallest positive",
                Window::try_from_secs_f64(f64::from_bits(1)),
                ms(1),
            ),
            ("secs 0.0004", Window::try_from_secs_f64(0.0004), ms(1)),
            ("secs 1.1", Window::try_from_secs_f64(1.1), ms(1100)),
            (
                "secs MAX",
                Window::try_from_secs_f64(max as f64 / 1000.0),
                ms(max),
            ),
            (
                "secs MAX + 1",
                Window::try_from_secs_f64(max as f64 / 1000.0 + 1.0),
                too_long.clone(),
            ),
            (
                "secs inf",
                Window::try_from_secs_f64(f64::INFINITY),
                too_long.clone(),
            ),
            (
                "secs 1e300",
                Window::try_from_secs_f64(1e300),
                too_long.clone(),
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(&got.clone().map(Window::as_millis), want, "{name}");
        }
    }

    #[test]
    fn every_constructor_keeps_the_bound() {
        assert_eq!(Window::MAX.as_millis(), 36_525 * 24 * 3_600_000);
        // Within every backend's exact range.
        assert!(Window::MAX.as_millis() < 1 << 53, "Lua doubles");
        assert!(
            Window::MAX
                .as_millis()
                .checked_mul(1_000_000)
                .is_some_and(|ns| ns < u64::MAX / 5),
            "the memory backend's nanoseconds, with centuries of uptime to spare"
        );
        assert_eq!(
            Quota::new(1, Window::MAX.as_duration() + Duration::from_millis(1)),
            Err(ConfigError::WindowTooLong)
        );
        assert_eq!(
            Quota::new(1, Window::MAX.as_duration()).map(|q| q.window()),
            Ok(Window::MAX)
        );
        let one = NonZeroU32::MIN;
        for quota in [
            Quota::per_second(one),
            Quota::per_minute(one),
            Quota::per_hour(one),
            Quota::per_day(one),
        ] {
            assert!(quota.window() <= Window::MAX);
            assert_eq!(
                Window::new(quota.window().as_duration()),
                Ok(quota.window())
            );
        }
        assert!(
            ConfigError::WindowTooLong
                .to_string()
                .contains("3155760000000 ms")
        );
    }

    #[test]
    fn quota_rejects_zero_limit() {
        assert_eq!(
            Quota::new(0, Duration::from_secs(1)),
            Err(ConfigError::ZeroLimit)
        );
        let q = Quota::per_minute(NonZeroU32::new(100).unwrap());
        assert_eq!((q.limit(), q.window().as_millis()), (100, 60_000));
    }
}
