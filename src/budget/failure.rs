//! The failure policy, written once for every middleware: what a request
//! (or a call) gets when its store fails, the warning that says so (at most
//! once per [`LogGate`] period, naming a Redis Cluster's refusal), and the
//! error line for a corrupt counter, which no policy passes.

use std::future::Future;
use std::time::Duration;

use crate::backend::BackendError;
use crate::insurance::Insurance;
use crate::quota::Share;

use super::log::LogGate;

/// What a request gets when the backend is down, slow, or full.
///
/// Corrupt state is not an outage: whatever the policy, a request whose
/// counter is corrupt is answered with 500 (gRPC: INTERNAL).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{FailurePolicy, Quota, RateLimitLayer};
///
/// assert_eq!(FailurePolicy::default(), FailurePolicy::FailClosed);
/// // A limit that is a courtesy, not a defence: keep serving while the
/// // store is down.
/// let layer = RateLimitLayer::new("search", Quota::new(100, Duration::from_secs(60)).unwrap())
///     .on_failure(FailurePolicy::FailOpen);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Answer `503 Service Unavailable` with `Retry-After: 1` (gRPC:
    /// UNAVAILABLE). Nothing gets through uncounted.
    #[default]
    FailClosed,
    /// Let the request through uncounted, with a warning in the log at most
    /// once every few seconds.
    FailOpen,
    /// Decide with a limiter in this process's memory, each quota's limit
    /// cut to this instance's [`Share`](crate::Share) of it, with a warning in the log at
    /// most once every few seconds. Its counters are pinned to their first
    /// hit like the backend's, and live in a bounded
    /// [`MemoryBackend`](crate::backend::MemoryBackend) the layer makes (and its clones share). Every
    /// request still goes to the backend first: once it answers again, it
    /// decides, from its own counts, and the local counters are left to
    /// expire.
    ///
    /// What the insurance counted is refunded (`count_if`), charged
    /// (`charge`) or cleared (`reset_if`) in its own store, under the same
    /// rules as the backend's, and never in the backend. A full local store
    /// answers as under [`FailClosed`](Self::FailClosed). Its decisions say
    /// so: [`Decision::insured`](crate::Decision::insured), and their
    /// [`limit`](crate::Decision::limit) is the share. See [`Share`](crate::Share) for an
    /// example, and for how far past a quota's limit a fleet can go while
    /// its store is out.
    Insurance(Share),
}

/// The failure policy and its state: the insurance limiter's store, made
/// once by [`set`](Self::set), which a layer's clones and services share.
#[derive(Clone, Debug, Default)]
pub(crate) struct Failure {
    policy: FailurePolicy,
    /// The insurance limiter, under [`FailurePolicy::Insurance`].
    insurance: Option<Insurance>,
}

impl Failure {
    /// Sets the policy; under [`FailurePolicy::Insurance`], the insurance
    /// limiter's store is made once, and a later share only changes its
    /// share.
    pub(crate) fn set(&mut self, policy: FailurePolicy) {
        match (policy, &mut self.insurance) {
            (FailurePolicy::Insurance(share), Some(insurance)) => insurance.set_share(share),
            (FailurePolicy::Insurance(share), None) => {
                self.insurance = Some(Insurance::new(share));
            }
            _ => self.insurance = None,
        }
        self.policy = policy;
    }

    /// The policy.
    pub(crate) fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The insurance limiter, under [`FailurePolicy::Insurance`].
    #[inline]
    pub(crate) fn insurance(&self) -> Option<&Insurance> {
        self.insurance.as_ref()
    }

    /// Whether the insurance limiter decides on a request the store
    /// answered `err`: under [`FailurePolicy::Insurance`], for an outage
    /// (corrupt state is never insured).
    #[inline]
    pub(crate) fn insures(&self, err: &BackendError) -> bool {
        self.insurance.is_some() && !err.is_corrupt()
    }

    /// Under [`FailurePolicy::Insurance`], the insurance limiter's count
    /// (`count`, in its own store) of a request whose store failed with
    /// `err`, warned of; `err` back when there is no insurance or the
    /// limiter cannot decide either (the request then goes to
    /// [`outage`](Self::outage), as under fail-closed).
    #[cold]
    pub(crate) fn insure<T>(
        &self,
        limiter: &str,
        gate: &LogGate,
        err: BackendError,
        count: impl FnOnce(&Insurance) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let Some(insurance) = &self.insurance else {
            return Err(err);
        };
        match count(insurance) {
            Ok(counted) => {
                warn(limiter, gate, &err, Action::Insured(insurance.share()));
                Ok(counted)
            }
            Err(local) => {
                tracing::debug!(limiter, error = %local, "the insurance limiter failed too: answering as fail-closed");
                Err(err)
            }
        }
    }

    /// A request whose store failed with `err` (not insured, or the
    /// insurance could not decide): whether it passes uncounted (fail open)
    /// rather than failing; warned of, the failure in the middleware's
    /// words (`fails`: "answering 503").
    #[cold]
    pub(crate) fn outage(
        &self,
        limiter: &str,
        gate: &LogGate,
        err: &BackendError,
        fails: &str,
    ) -> bool {
        let open = self.policy == FailurePolicy::FailOpen;
        let action = if open {
            Action::PassUncounted
        } else {
            Action::Fail(fails)
        };
        warn(limiter, gate, err, action);
        open
    }
}

/// What the failure policy made of a request whose store failed.
pub(crate) enum Outage<T> {
    /// The insurance limiter counted it: its count.
    Insured(T),
    /// It passes uncounted (fail open).
    Open,
    /// It fails, with the store's error (fail closed, or the insurance
    /// could not decide either).
    Closed(BackendError),
}

impl Failure {
    /// The failure policy's decision on a request whose store failed with
    /// `err`, an outage: the insurance limiter's count (`count`, under
    /// [`FailurePolicy::Insurance`]), a pass uncounted, or a failure;
    /// warned of once per `gate` period, as [`insure`](Self::insure) and
    /// [`outage`](Self::outage) say (`fails`: the failure, in the
    /// middleware's words).
    #[cold]
    pub(crate) fn decide<T>(
        &self,
        limiter: &str,
        gate: &LogGate,
        err: BackendError,
        fails: &str,
        count: impl FnOnce(&Insurance) -> Result<T, BackendError>,
    ) -> Outage<T> {
        let err = if self.insures(&err) {
            match self.insure(limiter, gate, err, count) {
                Ok(counted) => return Outage::Insured(counted),
                Err(err) => err,
            }
        } else {
            err
        };
        if self.outage(limiter, gate, &err, fails) {
            Outage::Open
        } else {
            Outage::Closed(err)
        }
    }
}

/// What a middleware does with a request whose store failed.
enum Action<'a> {
    PassUncounted,
    Insured(Share),
    /// Fail closed, in the middleware's words.
    Fail(&'a str),
}

/// The warning about a store that failed with `err`, at most once per
/// `gate`'s period: a Cluster's refusal ([`BackendError::ClusterDown`]) is
/// named as the Cluster's, not as a store that failed.
fn warn(limiter: &str, gate: &LogGate, err: &BackendError, action: Action<'_>) {
    let Some(suppressed) = gate.admit() else {
        return;
    };
    let action = match action {
        Action::PassUncounted => "passing requests uncounted (fail open)".to_owned(),
        Action::Insured(share) => {
            format!("deciding with the insurance limiter, at this instance's share {share}")
        }
        Action::Fail(fails) => format!("{fails} (fail closed)"),
    };
    if matches!(err, BackendError::ClusterDown(_)) {
        tracing::warn!(limiter, error = %err, suppressed, "rate-limit store's cluster refused the hit (not a slow store: no breaker opened): {action}");
    } else {
        tracing::warn!(limiter, error = %err, suppressed, "rate-limit backend failed: {action}");
    }
}

/// The error line for a corrupt counter: whatever the policy, the request
/// is stopped and the value left untouched.
#[cold]
pub(crate) fn corrupt(limiter: &str, err: &BackendError) {
    tracing::error!(limiter, error = %err, "corrupt rate-limit counter: request stopped, value left untouched");
}

/// The error of a store that answered no hit for a counter it was asked
/// about: an outage, under the failure policy.
#[cold]
pub(crate) fn no_hit() -> BackendError {
    BackendError::Unavailable("the backend answered no hit".into())
}

/// `answer`, or [`BackendError::TimedOut`] once `timeout` has passed.
pub(crate) async fn timed<T>(
    timeout: Duration,
    answer: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    tokio::time::timeout(timeout, answer)
        .await
        .unwrap_or(Err(BackendError::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down() -> BackendError {
        BackendError::Unavailable("down".into())
    }

    fn failure(policy: FailurePolicy) -> Failure {
        let mut failure = Failure::default();
        failure.set(policy);
        failure
    }

    #[test]
    fn each_policy_decides_an_outage_its_way() {
        let gate = LogGate::default();
        let decide = |failure: &Failure, count: Result<u32, BackendError>| {
            failure.decide("t", &gate, down(), "failing", |_| count)
        };
        let closed = failure(FailurePolicy::FailClosed);
        assert!(
            matches!(decide(&closed, Ok(1)), Outage::Closed(err) if err.to_string() == down().to_string())
        );
        let open = failure(FailurePolicy::FailOpen);
        assert!(matches!(decide(&open, Ok(1)), Outage::Open));
        let insured = failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()));
        assert!(matches!(decide(&insured, Ok(7)), Outage::Insured(7)));
        // The insurance cannot decide either: fail closed, with the store's
        // error, not the local one.
        let local = Err(BackendError::Unavailable("local".into()));
        assert!(
            matches!(decide(&insured, local), Outage::Closed(err) if err.to_string() == down().to_string())
        );
    }

    #[test]
    fn corrupt_state_is_never_insured() {
        let insured = failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()));
        assert!(insured.insures(&down()));
        let corrupt = BackendError::Corrupt {
            key: "k".into(),
            detail: "not a number".into(),
        };
        assert!(!insured.insures(&corrupt));
        assert!(!failure(FailurePolicy::FailOpen).insures(&down()));
    }

    #[test]
    fn the_insurance_store_is_made_once_and_dropped_with_the_policy() {
        let mut failure = failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()));
        let quarter = Share::one_in(4).unwrap();
        failure.set(FailurePolicy::Insurance(quarter));
        assert_eq!(failure.insurance().map(Insurance::share), Some(quarter));
        assert_eq!(failure.policy(), FailurePolicy::Insurance(quarter));
        failure.set(FailurePolicy::FailClosed);
        assert!(failure.insurance().is_none());
    }
}
