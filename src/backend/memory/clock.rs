//! The clock a memory backend reads on every hit: nanoseconds since the
//! backend was made, from the processor's time-stamp counter or from
//! tokio's clock.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// Where a backend's time comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    /// The processor's time-stamp counter through [`quanta`], calibrated
    /// against the OS's monotonic clock: about half the cost of
    /// [`std::time::Instant::now`] (the default). The backend reads the
    /// counter itself and scales only the difference from its epoch, so a
    /// hit pays neither quanta's thread-local override check nor a
    /// `Duration`'s division.
    Quanta {
        clock: &'static quanta::Clock,
        /// The counter's raw value when the backend was made.
        epoch: u64,
    },
    /// tokio's clock: `tokio::time::pause` and `tokio::time::advance`
    /// move the windows, so tests need not sleep.
    Tokio(Instant),
}

/// One calibrated clock for every backend of the process: calibrating takes
/// a while, so it is done once, when the first backend is built.
fn tsc_clock() -> &'static quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Clock {
    /// The time-stamp counter, from now.
    pub(crate) fn quanta() -> Self {
        let clock = tsc_clock();
        Self::Quanta {
            clock,
            epoch: clock.raw(),
        }
    }

    /// tokio's clock, from now.
    pub(crate) fn tokio() -> Self {
        Self::Tokio(Instant::now())
    }

    /// Nanoseconds since this clock was made (0 for a reading before it).
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        match *self {
            Self::Quanta { clock, epoch } => clock.delta_as_nanos(epoch, clock.raw()),
            Self::Tokio(epoch) => nanos(Instant::now().saturating_duration_since(epoch)),
        }
    }
}

/// Whole nanoseconds, saturating (without the u128 division of `as_nanos`).
pub(crate) fn nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanos_saturate_instead_of_wrapping() {
        assert_eq!(nanos(Duration::from_nanos(1_500_000_001)), 1_500_000_001);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_a_paused_runtime() {
        let clock = Clock::tokio();
        assert_eq!(clock.now(), 0);
        tokio::time::advance(Duration::from_millis(3)).await;
        assert_eq!(clock.now(), 3_000_000);
    }
}
