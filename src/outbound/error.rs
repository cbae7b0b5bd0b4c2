//! What a budgeted call fails with when it is not the client's own error.

use std::fmt;
use std::time::Duration;

use crate::backend::{BackendError, BackendErrorKind};
use crate::key::KeyError;

/// A boxed error, as tower's middleware fail with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a call through a [`BudgetLayer`](super::BudgetLayer) was not sent.
///
/// The layer's services fail with a [`tower::BoxError`]-style
/// `Box<dyn Error + Send + Sync>`, as tower's own `Timeout` and `LoadShed`
/// do: the client's own errors pass through as they are, and these are
/// found with `downcast_ref::<BudgetError>()`.
///
/// [`tower::BoxError`]: https://docs.rs/tower/latest/tower/type.BoxError.html
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::outbound::BudgetError;
///
/// let err: Box<dyn std::error::Error + Send + Sync> =
///     Box::new(BudgetError::Exhausted { retry_after: Duration::from_millis(1500) });
/// let budget = err.downcast_ref::<BudgetError>().unwrap();
/// assert_eq!(budget.retry_after(), Some(Duration::from_millis(1500)));
/// assert_eq!(
///     err.to_string(),
///     "the call's budget is spent and returns in 1.5s, after the call's wait would end"
/// );
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BudgetError {
    /// The budget is spent, and it cannot return for this call within its
    /// [`max_wait`](super::BudgetLayer::max_wait) or its own deadline: the
    /// call fails at once instead of waiting in vain. `retry_after` is when
    /// the budget returns, as far as this process knows (the window's end,
    /// plus a window for each window's worth of calls queued ahead).
    Exhausted {
        /// How long until the budget returns for this call.
        retry_after: Duration,
    },
    /// More calls are waiting in this process than
    /// [`max_waiters`](super::BudgetLayer::max_waiters) allows: this one
    /// was shed at once, without waiting or spending.
    Overloaded,
    /// The call's cost is above the budget's limit: it could never be sent.
    NeverFits {
        /// The call's cost.
        cost: u64,
        /// The budget's limit.
        limit: u64,
    },
    /// The call's key could not be read from it.
    Key(KeyError),
    /// The store failed and the failure policy is
    /// [`FailClosed`](crate::FailurePolicy::FailClosed), or its counter is
    /// corrupt (which stops the call whatever the policy).
    Backend(BackendError),
}

impl BudgetError {
    /// When the budget returns, for [`Exhausted`](Self::Exhausted).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Exhausted { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// The store's failure kind, for [`Backend`](Self::Backend).
    pub fn backend_kind(&self) -> Option<BackendErrorKind> {
        match self {
            Self::Backend(err) => Some(err.kind()),
            _ => None,
        }
    }
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted { retry_after } => write!(
                f,
                "the call's budget is spent and returns in {retry_after:?}, after the call's wait would end"
            ),
            Self::Overloaded => f.write_str(
                "too many calls are waiting for the budget in this process: the call was shed",
            ),
            Self::NeverFits { cost, limit } => write!(
                f,
                "a call cost of {cost} is above the budget's limit of {limit}: it could never be sent"
            ),
            Self::Key(err) => write!(f, "the call's budget key could not be read: {err}"),
            Self::Backend(err) => write!(f, "the call's budget could not be checked: {err}"),
        }
    }
}

impl std::error::Error for BudgetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Key(err) => Some(err),
            Self::Backend(err) => Some(err),
            _ => None,
        }
    }
}
