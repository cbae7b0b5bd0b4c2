//! The log rules every middleware keeps: one gate bounds each kind of
//! warning (at most one line per period, the ones held back counted), and
//! one report says what became of an amend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::backend::{Amend, BackendError};

/// Lets a log line through at most once per [`LogGate::PERIOD_MS`],
/// counting the ones held back. It reads a monotonic clock, so a wall clock
/// stepped back (NTP, a VM resumed) can neither silence it nor open it.
#[derive(Debug)]
pub(crate) struct LogGate {
    origin: Instant,
    /// Milliseconds since `origin` from which the next line may pass.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for LogGate {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl LogGate {
    const PERIOD_MS: u64 = 5_000;

    /// `Some(held back since the last one)` when a line may be logged now.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.admit_at(now)
    }

    /// [`admit`](Self::admit) at `now` milliseconds since the gate's origin.
    fn admit_at(&self, now: u64) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(Self::PERIOD_MS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Logs one refund's or amend's result; failures at most once per period
/// of `gate`.
pub(crate) fn report(
    limiter: &str,
    gate: &LogGate,
    amend: Option<Amend>,
    result: Result<bool, BackendError>,
) {
    let what = match amend {
        None | Some(Amend::Refund(_)) => "refund",
        Some(Amend::Charge(_)) => "charge",
        Some(Amend::Clear) => "clear",
    };
    match result {
        Ok(true) => tracing::trace!(limiter, what, "rate-limit counter amended"),
        Ok(false) => tracing::debug!(
            limiter,
            what,
            "rate-limit {what} found nothing to change: the hit's window closed or was reset"
        ),
        Err(err) => {
            if let Some(suppressed) = gate.admit() {
                if err.is_corrupt() {
                    tracing::error!(limiter, error = %err, suppressed, "rate-limit {what} found a corrupt counter: the count stays as it is, the value untouched");
                } else {
                    tracing::warn!(limiter, error = %err, suppressed, "rate-limit {what} failed: the count stays as it is");
                }
            }
        }
    }
}

/// The warning about an answer whose usage a charge could not read (absent
/// or malformed), at most once per period of `gate`: nothing is charged,
/// and what the request `reserved` stays spent.
#[cold]
pub(crate) fn unreadable_usage(limiter: &str, gate: &LogGate, reserved: u64) {
    if let Some(suppressed) = gate.admit() {
        tracing::warn!(
            limiter,
            reserved,
            suppressed,
            "rate-limit charge could not read the answer's usage (absent or malformed): nothing charged or settled (a reservation stays spent)"
        );
    } else {
        tracing::debug!(
            limiter,
            "rate-limit charge could not read the answer's usage"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_gate_admits_one_per_period() {
        let gate = LogGate::default();
        assert_eq!(gate.admit_at(0), Some(0), "the first line passes");
        assert_eq!(gate.admit_at(1), None);
        assert_eq!(gate.admit_at(LogGate::PERIOD_MS - 1), None);
        assert_eq!(
            gate.admit_at(LogGate::PERIOD_MS),
            Some(2),
            "a period later, with the count held back"
        );
        assert_eq!(gate.admit_at(LogGate::PERIOD_MS + 1), None);
        assert_eq!(gate.admit_at(3 * LogGate::PERIOD_MS), Some(1));
    }
}
