//! How many hits a key may make, and in how long a window.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use crate::ConfigError;

/// The length of a pinned window, in whole milliseconds (never zero).
///
/// A window opens at a key's first hit and closes a fixed time later; hits in
/// between never move it. Sub-millisecond parts round **up**, so a window can
/// never collapse to zero, and a zero or negative window is rejected rather
/// than read as "no expiry".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window(NonZeroU64);

impl Window {
    /// A window of `duration`, rounded up to whole milliseconds.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for a zero duration,
    /// [`ConfigError::WindowTooLong`] past `u64::MAX` milliseconds.
    pub fn new(duration: Duration) -> Result<Self, ConfigError> {
        let nanos = duration.as_nanos();
        if nanos == 0 {
            return Err(ConfigError::NonPositiveWindow);
        }
        let millis = nanos.div_ceil(1_000_000);
        let millis = u64::try_from(millis).map_err(|_| ConfigError::WindowTooLong)?;
        NonZeroU64::new(millis)
            .map(Self)
            .ok_or(ConfigError::NonPositiveWindow)
    }

    /// A window of `millis` milliseconds, for values read from configuration.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for zero or a negative number.
    pub fn try_from_millis(millis: i64) -> Result<Self, ConfigError> {
        u64::try_from(millis)
            .ok()
            .and_then(NonZeroU64::new)
            .map(Self)
            .ok_or(ConfigError::NonPositiveWindow)
    }

    /// A window of `secs` seconds, for values read from configuration; a
    /// fractional millisecond rounds up.
    ///
    /// # Errors
    /// [`ConfigError::NonPositiveWindow`] for zero, a negative number or NaN,
    /// [`ConfigError::WindowTooLong`] for infinity or anything past `u64::MAX`
    /// milliseconds.
    pub fn try_from_secs_f64(secs: f64) -> Result<Self, ConfigError> {
        if secs.is_nan() || secs <= 0.0 {
            return Err(ConfigError::NonPositiveWindow);
        }
        let duration = Duration::try_from_secs_f64(secs).map_err(|_| ConfigError::WindowTooLong)?;
        Self::new(duration)
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
    fn windows_round_up_and_reject_non_positive() {
        let cases: &[(&str, Result<Window, ConfigError>, Option<u64>)] = &[
            ("zero", Window::new(Duration::ZERO), None),
            ("0.4 ms", Window::new(Duration::from_micros(400)), Some(1)),
            ("1 ns", Window::new(Duration::from_nanos(1)), Some(1)),
            (
                "1.0000001 ms",
                Window::new(Duration::from_nanos(1_000_001)),
                Some(2),
            ),
            (
                "exact 15 min",
                Window::new(Duration::from_secs(900)),
                Some(900_000),
            ),
            ("millis 0", Window::try_from_millis(0), None),
            ("millis -5", Window::try_from_millis(-5), None),
            ("millis 7", Window::try_from_millis(7), Some(7)),
            ("secs -1.0", Window::try_from_secs_f64(-1.0), None),
            ("secs NaN", Window::try_from_secs_f64(f64::NAN), None),
            ("secs 0.0004", Window::try_from_secs_f64(0.0004), Some(1)),
        ];
        for (name, got, want) in cases {
            match want {
                Some(ms) => assert_eq!(got.as_ref().map(|w| w.as_millis()), Ok(*ms), "{name}"),
                None => assert_eq!(got, &Err(ConfigError::NonPositiveWindow), "{name}"),
            }
        }
        assert_eq!(
            Window::try_from_secs_f64(f64::INFINITY),
            Err(ConfigError::WindowTooLong)
        );
        assert_eq!(Window::new(Duration::MAX), Err(ConfigError::WindowTooLong));
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
