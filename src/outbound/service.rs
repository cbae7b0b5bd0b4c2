//! The budgeted client: each call's key and cost are read from its request,
//! and the budget is asked at once; a call it admits goes straight to the
//! client, one it turns away waits (see [`admit`](super::admit)).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower_service::Service;

use crate::backend::Heeding;
use crate::key::KeyExtractor;
use crate::request::RequestHead;

use super::admit::{Budget, Start, Try, wait};
use super::deadline;
use super::error::{BoxError, BudgetError};
use super::future::BudgetFuture;

/// A client service behind a [`BudgetLayer`](super::BudgetLayer).
///
/// `poll_ready` is the client's own: its backpressure passes through as it
/// is. The budget is per call (its key and cost are in the request), so it
/// is waited for in the call's future, which holds the client's readiness
/// for that call (tower's convention for a service that waits before it
/// calls): at most [`max_waiters`](super::BudgetLayer::max_waiters) calls
/// do so at a time, the others are shed at once.
pub struct Budgeted<S, K, Bk> {
    inner: S,
    key: K,
    budget: Arc<Budget<Bk>>,
}

impl<S, K, Bk> Budgeted<S, K, Bk> {
    pub(crate) fn new(inner: S, key: K, budget: Arc<Budget<Bk>>) -> Self {
        Self { inner, key, budget }
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, K: Clone, Bk> Clone for Budgeted<S, K, Bk> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            budget: Arc::clone(&self.budget),
        }
    }
}

impl<S, K, Bk> std::fmt::Debug for Budgeted<S, K, Bk> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgeted")
            .field("budget", &self.budget.name)
            .field("quota", &self.budget.quota)
            .finish_non_exhaustive()
    }
}

impl<S, K, Bk, B, ResB> Service<Request<B>> for Budgeted<S, K, Bk>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    K: KeyExtractor,
    Bk: Heeding,
    B: Send + 'static,
    ResB: http_body::Body,
{
    type Response = Response<crate::cost::Metered<ResB>>;
    type Error = BoxError;
    type Future = BudgetFuture<S, Request<B>, Bk>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The instance `poll_ready` made ready goes with this call.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let budget = &self.budget;
        let head = RequestHead::new(&request);
        let key = match self.key.extract(&head) {
            Ok(key) => key,
            Err(error) => {
                return BudgetFuture::failed(BudgetError::Key {
                    budget: Arc::clone(&budget.name),
                    error,
                });
            }
        };
        let cost = budget.cost(&head);
        let quotas = budget.quotas(&key);
        let limit = quotas.cost().limit();
        if cost > limit {
            return BudgetFuture::failed(BudgetError::NeverFits {
                budget: Arc::clone(&budget.name),
                cost,
                limit,
            });
        }
        // Under a cap in flight, every call takes its slot in its line; a
        // key the provider closed waits in its line until it opens.
        let closed = budget.heard.closed_for(&key);
        let start = if let Some(left) = closed {
            Start::Denied(left, None)
        } else if budget.lines.busy(&key) || budget.slots.is_some() {
            Start::Busy
        } else {
            let mut answer = budget.spend(&key, cost, &quotas);
            match Pin::new(&mut answer).poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(answer) => match budget.judge(&key, cost, &quotas, answer) {
                    Ok(Try::Admitted(admitted)) => {
                        return BudgetFuture::call(service, request, budget, key, cost, admitted);
                    }
                    Ok(Try::Denied(reset)) => Start::Denied(reset, Some(quotas)),
                    Err(err) => return BudgetFuture::failed(err),
                },
                Poll::Pending => Start::Pending(answer, quotas),
            }
        };
        let deadline = deadline::of(&request, tokio::time::Instant::now());
        let waiting = wait(Arc::clone(budget), key.clone(), cost, deadline, start);
        BudgetFuture::waiting(Box::pin(waiting), service, request, budget, key, cost)
    }
}
