//! What a budgeted call fails with when it is not the client's own error.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::BackendError;
use crate::key::KeyError;

/// A boxed error, as tower's middleware fail with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a call through a [`BudgetLayer`](super::BudgetLayer) was not sent.
/// Every case names its budget (the layer's name), and its message says
/// which bound was hit and when the budget returns.
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
/// use tower::{Layer, ServiceExt};
/// use tower_pinned_window::Quota;
/// use tower_pinned_window::outbound::{BudgetError, BudgetLayer, WaitBound};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let quota = Quota::new(1, Duration::from_secs(60)).unwrap();
/// let layer = BudgetLayer::new("payments", quota).max_wait(Duration::from_secs(5));
/// let client = layer.layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// client.clone().oneshot(http::Request::new(())).await.unwrap();
/// // The budget returns in about a minute: past the call's 5 s.
/// let err = client.oneshot(http::Request::new(())).await.unwrap_err();
/// let budget = err.downcast_ref::<BudgetError>().unwrap();
/// assert_eq!(budget.budget(), "payments");
/// assert!(budget.retry_after().unwrap() > Duration::from_secs(59));
/// assert!(matches!(
///     budget,
///     BudgetError::Exhausted { bound: WaitBound::MaxWait(max_wait), .. }
///         if *max_wait == Duration::from_secs(5)
/// ));
/// assert!(err.to_string().starts_with(r#"budget "payments" is spent: it returns in "#));
/// assert!(err.to_string().ends_with("after the call's max_wait of 5s"));
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BudgetError {
    /// The budget is spent, and it cannot return for this call within its
    /// [`max_wait`](super::BudgetLayer::max_wait) or its own deadline: the
    /// call fails at once instead of waiting in vain. `retry_after` is when
    /// the budget returns, as far as this process knows (the window's end,
    /// plus a window for each share of a window queued ahead: the whole
    /// window, or what this process won of each while its line waited; see
    /// [`max_wait`](super::BudgetLayer::max_wait)).
    #[non_exhaustive]
    Exhausted {
        /// The budget's name.
        budget: Arc<str>,
        /// How long until the budget returns for this call.
        retry_after: Duration,
        /// The bound the call could not be served within.
        bound: WaitBound,
    },
    /// More calls are waiting in this process than
    /// [`max_waiters`](super::BudgetLayer::max_waiters) allows: this one
    /// was shed at once, without waiting or spending.
    #[non_exhaustive]
    Overloaded {
        /// The budget's name.
        budget: Arc<str>,
        /// The layer's `max_waiters`: how many calls already wait.
        max_waiters: usize,
    },
    /// The call's cost is above the budget's limit: it could never be sent.
    #[non_exhaustive]
    NeverFits {
        /// The budget's name.
        budget: Arc<str>,
        /// The call's cost.
        cost: u64,
        /// The budget's limit.
        limit: u64,
    },
    /// The call's key could not be read from it.
    #[non_exhaustive]
    Key {
        /// The budget's name.
        budget: Arc<str>,
        /// Why not.
        error: KeyError,
    },
    /// The store failed and the failure policy is
    /// [`FailClosed`](crate::FailurePolicy::FailClosed), or its counter is
    /// corrupt (which stops the call whatever the policy).
    #[non_exhaustive]
    Backend {
        /// The budget's name.
        budget: Arc<str>,
        /// The store's error.
        error: BackendError,
    },
}

/// A bound on a call's wait for its budget. The layer's
/// [`max_wait`](super::BudgetLayer::max_wait) is one; a call can carry its
/// own in its request's extensions (a deadline, or a shorter wait), and a
/// tonic client sets a `grpc-timeout`. The earliest bound holds, and the
/// [`BudgetError::Exhausted`] of a call that could not be served within it
/// names it. A call's own bound can shorten the layer's, never lengthen it.
///
/// ```
/// use std::time::{Duration, Instant};
/// use tower_pinned_window::outbound::WaitBound;
///
/// let mut request = http::Request::new(());
/// request
///     .extensions_mut()
///     .insert(WaitBound::Deadline(Instant::now() + Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitBound {
    /// At most this long from the call's arrival: the layer's
    /// [`max_wait`](super::BudgetLayer::max_wait), or a call's own.
    MaxWait(Duration),
    /// A deadline: the call waits only as long as it can still be sent
    /// before then.
    Deadline(std::time::Instant),
    /// The request's `grpc-timeout` header (tonic's `Request::set_timeout`),
    /// from the call's arrival.
    GrpcTimeout(Duration),
}

impl BudgetError {
    /// The budget's name: the layer's.
    pub fn budget(&self) -> &str {
        match self {
            Self::Exhausted { budget, .. }
            | Self::Overloaded { budget, .. }
            | Self::NeverFits { budget, .. }
            | Self::Key { budget, .. }
            | Self::Backend { budget, .. } => budget,
        }
    }

    /// When the budget returns, for [`Exhausted`](Self::Exhausted).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Exhausted { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The name of the store's failure kind, for [`Backend`](Self::Backend)
    /// (see [`BackendError::kind_name`]).
    pub fn backend_kind(&self) -> Option<&'static str> {
        match self {
            Self::Backend { error, .. } => Some(error.kind_name()),
            _ => None,
        }
    }
}

impl fmt::Display for WaitBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MaxWait(max_wait) => write!(f, "the call's max_wait of {max_wait:?}"),
            Self::Deadline(_) => f.write_str("the call's Deadline"),
            Self::GrpcTimeout(timeout) => write!(f, "the call's grpc-timeout of {timeout:?}"),
        }
    }
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted {
                budget,
                retry_after,
                bound,
            } => write!(
                f,
                "budget {budget:?} is spent: it returns in {retry_after:?}, after {bound}"
            ),
            Self::Overloaded {
                budget,
                max_waiters,
            } => write!(
                f,
                "budget {budget:?}: {max_waiters} calls (its max_waiters) already wait in this process: the call was shed"
            ),
            Self::NeverFits {
                budget,
                cost,
                limit,
            } => write!(
                f,
                "budget {budget:?}: a call cost of {cost} is above its limit of {limit}: it could never be sent"
            ),
            Self::Key { budget, error } => {
                write!(
                    f,
                    "budget {budget:?}: the call's key could not be read: {error}"
                )
            }
            Self::Backend { budget, error } => {
                write!(f, "budget {budget:?} could not be checked: {error}")
            }
        }
    }
}

impl std::error::Error for BudgetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Key { error, .. } => Some(error),
            Self::Backend { error, .. } => Some(error),
            _ => None,
        }
    }
}
