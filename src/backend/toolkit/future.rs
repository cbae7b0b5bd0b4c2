//! The one future of the remote backends (the Redis and PostgreSQL crates,
//! and any store of your own): their hits, refunds and amends all return a
//! [`BackendFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::time::Duration;

use smallvec::SmallVec;

use super::refused_count;
use super::slots::Ticket;
use crate::backend::{BackendError, Counter, Hit, Hits, Spend};

/// The future of a remote backend's call (a hit, a spend, a refund or an
/// amend): the `Future` and `Refund` of the Redis and PostgreSQL backends,
/// and of a store of your own that wants one.
///
/// It is in one of three states, fixed when the backend returns it:
///
/// - **answered**: the result is already known (the local deny cache
///   answered a hit, or a refund has nothing to take back), and the first
///   poll gives it, with no round trip;
/// - **queued** (batched requests, as Redis coalesces them): the request
///   waits for the call that carries it, which answers through the
///   future's [`Reply`](super::Reply) (both made by
///   [`Reply::channel`](super::Reply::channel)); nothing is
///   allocated for the future. When the reply is dropped unanswered (the
///   call was dropped, its runtime shut down), it gives
///   [`BackendError::Unavailable`];
/// - **calling**: the request's own call, one round trip away (boxed: a
///   database client's query future is large).
///
/// The layer awaits it; a [`Backend`](crate::backend::Backend) of your own
/// needs none of it. Polling it again after it completed panics.
///
/// `T` is what the call gives: [`Hits`] for a hit or a spend,
/// `bool` for a refund or an amend (whether a counter changed).
#[must_use = "futures do nothing unless polled"]
pub struct BackendFuture<T>(State<T>);

enum State<T> {
    /// Known already; `None` once handed out.
    Answered(Option<Result<T, BackendError>>),
    /// Waiting in a batch for the call that takes it.
    Queued(Ticket<Result<T, BackendError>>),
    /// The request's own call.
    Calling(Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>),
}

impl<T> BackendFuture<T> {
    /// A result known without a call: the first poll gives it.
    pub fn answered(result: Result<T, BackendError>) -> Self {
        Self(State::Answered(Some(result)))
    }

    /// The request's own call (boxed once).
    pub fn calling(call: impl Future<Output = Result<T, BackendError>> + Send + 'static) -> Self {
        Self(State::Calling(Box::pin(call)))
    }

    /// Queued in a batch: the batch's call answers the ticket through its
    /// reply ([`Reply::channel`](super::Reply::channel) makes the pair).
    pub(super) fn queued(ticket: Ticket<Result<T, BackendError>>) -> Self {
        Self(State::Queued(ticket))
    }
}

// Nothing in it is pinned: the result is moved out, never polled in place,
// and the call is boxed.
impl<T> Unpin for BackendFuture<T> {}

impl BackendFuture<Hits> {
    /// The local deny cache's answer to a request's `counters`, when
    /// `left` (asked for each counter by its parts: no storage key is
    /// built for it) remembers any of them denied: those are over their
    /// limit, or locked out, until the time it gives, and no counter is
    /// hit. `None` when it remembers none: the request goes to the store.
    /// A remembered counter reports its limit plus `need` (the spend's
    /// cost, at least 1; 1 for a hit), as a counter at its limit that did
    /// not fit does. For a spend, [`denied_spend`](Self::denied_spend)
    /// gives each counter its own cost.
    #[must_use]
    pub fn denied(
        counters: &[Counter<'_>],
        need: u64,
        left: impl Fn(&Counter<'_>) -> Option<Duration>,
    ) -> Option<Self> {
        Self::denied_each(counters, |_| need, left)
    }

    /// [`denied`](Self::denied) for a [`Spend`]: a remembered counter
    /// reports its limit plus its own cost, at least 1
    /// ([`Spend::cost_of`]), as the
    /// [contract](crate::backend#costs-lockouts-and-amends) has it.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_pinned_window::Quota;
    /// use tower_pinned_window::backend::toolkit::BackendFuture;
    /// use tower_pinned_window::backend::{Counter, Spend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    /// let counters = [
    ///     Counter { namespace: "requests", quota: quota(50), lowers: false },
    ///     Counter { namespace: "tokens", quota: quota(10_000), lowers: false },
    /// ];
    /// // The cache remembers the requests counter at its limit for 5 s.
    /// let left = |c: &Counter<'_>| (c.namespace == "requests").then(|| Duration::from_secs(5));
    /// let spend = Spend::cost(700).first(1);
    /// let hits = BackendFuture::denied_spend(&counters, spend, left).unwrap().await.unwrap();
    /// assert_eq!(hits[0].count, 50 + 1, "its limit and its unit");
    /// assert_eq!((hits[1].count, hits[1].deadline), (0, None), "not asked");
    /// # }
    /// ```
    #[must_use]
    pub fn denied_spend(
        counters: &[Counter<'_>],
        spend: Spend,
        left: impl Fn(&Counter<'_>) -> Option<Duration>,
    ) -> Option<Self> {
        Self::denied_each(counters, |i| spend.cost_of(i).max(1), left)
    }

    /// The deny cache's answer, with counter `i` reporting its limit plus
    /// `need(i)`.
    fn denied_each(
        counters: &[Counter<'_>],
        need: impl Fn(usize) -> u64,
        left: impl Fn(&Counter<'_>) -> Option<Duration>,
    ) -> Option<Self> {
        let cached: SmallVec<[Option<Duration>; 2]> = counters.iter().map(left).collect();
        if cached.iter().all(Option::is_none) {
            return None;
        }
        let hits = counters
            .iter()
            .zip(cached)
            .enumerate()
            .map(|(i, (c, left))| Hit {
                count: left.map_or(0, |_| refused_count(0, c.quota.limit(), true, need(i))),
                reset: left.unwrap_or(Duration::ZERO),
                deadline: None,
            })
            .collect();
        Some(Self::answered(Ok(hits)))
    }
}

impl<T> Future for BackendFuture<T> {
    type Output = Result<T, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            State::Answered(result) => Poll::Ready(
                result
                    .take()
                    .expect("BackendFuture polled after it completed"),
            ),
            State::Queued(ticket) => Pin::new(ticket)
                .poll(cx)
                .map(|answer| answer.unwrap_or_else(|| Err(dropped()))),
            State::Calling(call) => call.as_mut().poll(cx),
        }
    }
}

/// A batch's call dropped before it answered a queued request.
fn dropped() -> BackendError {
    BackendError::Unavailable("the store's call was dropped before it was answered".into())
}

impl<T> fmt::Debug for BackendFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            State::Answered(_) => "answered",
            State::Queued(_) => "queued",
            State::Calling(_) => "calling",
        };
        f.debug_struct("BackendFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::toolkit::Reply;

    #[tokio::test]
    async fn an_answered_future_gives_its_result_without_a_call() {
        let future = BackendFuture::answered(Ok(true));
        assert_eq!(
            format!("{future:?}"),
            r#"BackendFuture { state: "answered" }"#
        );
        assert!(future.await.unwrap());
    }

    #[tokio::test]
    async fn a_calling_future_gives_its_calls_result() {
        let future = BackendFuture::calling(async { Ok(7_u64) });
        assert_eq!(
            format!("{future:?}"),
            r#"BackendFuture { state: "calling" }"#
        );
        assert_eq!(future.await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_queued_future_gives_its_replys_answer_and_unavailable_once_the_reply_is_dropped() {
        let (reply, future) = Reply::channel(None, 2);
        assert_eq!(
            format!("{future:?}"),
            r#"BackendFuture { state: "queued" }"#
        );
        reply.send(Ok(7_u64)).unwrap();
        assert_eq!(future.await.unwrap(), 7);

        let (reply, future) = Reply::<u64>::channel(None, 1);
        drop(reply);
        let err = future.await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable(_)), "{err:?}");
    }

    #[test]
    #[should_panic(expected = "BackendFuture polled after it completed")]
    fn a_future_polled_again_after_it_completed_panics() {
        let mut future = BackendFuture::answered(Ok(()));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut future).poll(&mut cx).is_ready());
        let _ = Pin::new(&mut future).poll(&mut cx);
    }
}
