//! A budget for **outbound** calls, shared by every instance of a service:
//! a tower layer for clients (a hyper-util client, a tonic `Channel`,
//! anything that takes an `http::Request`), which spends each call's cost
//! from a named budget in the same pinned windows as the server layer, and
//! **waits** for the window to end when the budget is spent, instead of
//! failing.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_pinned_window::Quota;
//! use tower_pinned_window::outbound::BudgetLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A partner allows 2 calls in 200 ms, for every instance of the service:
//! // give each instance's layer the same shared backend (Redis, ...).
//! let budget = BudgetLayer::new("partner", Quota::new(2, Duration::from_millis(200)).unwrap())
//!     .max_wait(Duration::from_secs(5));
//! let client = ServiceBuilder::new().layer(budget).service_fn(|_: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
//! });
//!
//! let started = tokio::time::Instant::now();
//! for _ in 0..3 {
//!     client.clone().oneshot(http::Request::new(String::new())).await.unwrap();
//! }
//! // The third call waited for the window its first call opened to end.
//! assert!(started.elapsed() >= Duration::from_millis(200));
//! # }
//! ```
//!
//! # What a call gets
//!
//! - **Room in the budget:** it spends its cost (all or nothing, like a
//!   server layer's [`cost`](crate::RateLimitLayer::cost)) in one atomic
//!   step of the store, and is sent.
//! - **The budget is spent:** it waits until the window ends, as the store
//!   says, and asks again. Within a process, the calls that wait for one
//!   budget key form a line and are served in arrival order. Only the
//!   line's head asks the store, once when the window ends (up to 1 ms
//!   later, at random, so that the processes sharing a budget do not all
//!   ask in the same instant). When the store admits it with room left,
//!   the calls behind it that fit ask together, and the next head is
//!   chosen once they have their answers.
//! - **It cannot be served in time:** when the budget cannot return within
//!   the call's [`max_wait`](BudgetLayer::max_wait) or its own deadline
//!   (a [`WaitBound`] in its extensions, or the `grpc-timeout` a tonic client sets), the call
//!   fails at once with [`BudgetError::Exhausted`], which names the budget
//!   and the bound ([`WaitBound`]) and says when the budget returns. The
//!   estimate counts a window for every share of a window queued ahead in
//!   this process, and is made again at every window the call's line
//!   misses (another process took it): a call fails as soon as, at the
//!   share of each window this process has won while its line waited, its
//!   turn comes after its bound. The share is the whole window until the
//!   line has had two whole windows to win in (then what it won, with one
//!   window won whole counted beside them); a drop in other processes'
//!   demand could have served a call that failed so.
//! - **Too many waiters:** beyond [`max_waiters`](BudgetLayer::max_waiters)
//!   calls waiting in the process, a call fails at once with
//!   [`BudgetError::Overloaded`].
//! - **Cancelled:** a call dropped while it waits spends nothing (a turned
//!   away spend spends nothing, and the admitting spend is the wait's last
//!   step). A call dropped once admitted keeps what it spent: the provider
//!   may have counted it. A metered answer dropped before its body ends
//!   settles with what was read by then, as the server layer's charge does.
//! - **The store fails:** the [`FailurePolicy`](crate::FailurePolicy) decides,
//!   as on the server: the call fails with [`BudgetError::Backend`], is
//!   sent uncounted, or is counted by an insurance limiter at the
//!   instance's share. A corrupt counter stops the call under any policy.
//!
//! Only the store's answer admits a call: no timer, clock or local count
//! does, so no call is sent past the budget while the store is up.
//!
//! Give the layer the provider's own quota: each window the store pins is
//! the quota's plus a [`margin`](BudgetLayer::margin) (default
//! [`DEFAULT_MARGIN`], 20 ms), because the provider's window opens when the
//! first call reaches it, a little after ours; without it, a call of our
//! next window that reaches the provider faster could land in the
//! provider's previous window and be answered 429.
//!
//! # Tower's conventions
//!
//! `poll_ready` is the client's own, so its backpressure passes through.
//! The budget is per call (the key and cost are read from the request), so
//! it is waited for in the call's future, which holds the client's
//! readiness for that call; the service is `Clone` (as hyper-util's client
//! and tonic's `Channel` are) and the call takes the instance that was made
//! ready. Errors are boxed, as tower's `Timeout` and `LoadShed` do: the
//! client's own pass through, and the budget's are a [`BudgetError`].
//!
//! The guide, with the measurements: [`docs/outbound.md`](crate::guide::outbound).

mod admit;
mod deadline;
mod error;
mod future;
mod heard;
mod heed;
mod layer;
mod line;
mod service;
mod settle;
mod stored;
#[cfg(feature = "operator")]
pub(crate) mod watch;
mod word;

pub use error::{BudgetError, WaitBound};
pub use future::BudgetFuture;
pub use layer::{BudgetLayer, DEFAULT_MARGIN, DEFAULT_MAX_WAIT, DEFAULT_MAX_WAITERS};
pub use service::Budgeted;
pub use word::{DEFAULT_MAX_SIGNAL, Ignored, Reader, Remaining, Signal, Unit, Word};
