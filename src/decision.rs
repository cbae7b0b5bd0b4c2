//! What the limiter decided for one request.

use std::sync::Arc;
use std::time::Duration;

/// Whether a request went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Within the limit: the request was passed on.
    Allowed,
    /// Over the limit: the request was answered with a denial.
    Denied,
    /// Over the limit, but the layer is in shadow mode: the request was passed
    /// on, and the response carries the headers a denial would.
    Shadowed,
}

/// One request's verdict. It is handed to the
/// [`on_decision`](crate::RateLimitLayer::on_decision) callback and inserted
/// into the response's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    name: Arc<str>,
    limit: u64,
    count: u64,
    reset: Duration,
    outcome: Outcome,
}

impl Decision {
    pub(crate) fn new(
        name: Arc<str>,
        limit: u64,
        count: u64,
        reset: Duration,
        shadow: bool,
    ) -> Self {
        let outcome = match (count <= limit, shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Denied,
            (false, true) => Outcome::Shadowed,
        };
        Self {
            name,
            limit,
            count,
            reset,
            outcome,
        }
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hits admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The key's counter after this request (it counts denied requests too).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Hits left in this window after this request.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.count)
    }

    /// Time until the window closes.
    pub fn reset(&self) -> Duration {
        self.reset
    }

    /// [`reset`](Self::reset) in whole seconds, rounded up, at least 1: the
    /// value of `Retry-After` on a denial.
    pub fn reset_secs(&self) -> u64 {
        ceil_secs(self.reset)
    }

    /// What happened to the request.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the request was passed on to the service (allowed or shadowed).
    pub fn passed(&self) -> bool {
        self.outcome != Outcome::Denied
    }

    /// Whether the request was over the limit (denied or shadowed).
    pub fn over_limit(&self) -> bool {
        self.outcome != Outcome::Allowed
    }
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn ceil_secs(duration: Duration) -> u64 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_never_reach_zero() {
        let cases = [
            ("zero", Duration::ZERO, 1),
            ("1 ns", Duration::from_nanos(1), 1),
            ("exactly 1 s", Duration::from_secs(1), 1),
            ("1.001 s", Duration::from_millis(1001), 2),
            ("9.5 s", Duration::from_millis(9500), 10),
            ("15 min", Duration::from_secs(900), 900),
        ];
        for (name, duration, want) in cases {
            assert_eq!(ceil_secs(duration), want, "{name}");
        }
    }

    #[test]
    fn outcomes() {
        let d = |count, shadow| Decision::new("n".into(), 3, count, Duration::from_secs(1), shadow);
        assert_eq!(d(3, false).outcome(), Outcome::Allowed);
        assert_eq!(d(3, false).remaining(), 0);
        assert_eq!(d(4, false).outcome(), Outcome::Denied);
        assert!(!d(4, false).passed());
        assert_eq!(d(4, true).outcome(), Outcome::Shadowed);
        assert!(d(4, true).passed() && d(4, true).over_limit());
    }
}
