//! A budgeted call's future: the wait for the budget when it was spent,
//! then the client's own call, whose answer's body is metered when a charge
//! settles it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::backend::Heeding;
use crate::cost::charge::{Meter, Metered};
use crate::count::ResponseHead;
use crate::in_flight::slot::SlotGuard;
use crate::key::Key;

use super::admit::{Admitted, Budget};
use super::error::{BoxError, BudgetError};
use super::settle::Tab;

/// The wait for the budget, boxed: only a call the budget turned away, or
/// whose store answers later, pays for it.
type Waiting =
    Pin<Box<dyn Future<Output = Result<(Admitted, Option<SlotGuard>), BudgetError>> + Send>>;

pin_project! {
    /// The future of a [`Budgeted`](super::Budgeted) call.
    pub struct BudgetFuture<S, R, Bk>
    where
        S: Service<R>,
    {
        #[pin]
        state: State<S, R, Bk>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, R, Bk>
    where
        S: Service<R>,
    {
        Waiting {
            waiting: Waiting,
            call: Option<(S, R)>,
            budget: Arc<Budget<Bk>>,
            key: Key,
            cost: u64,
        },
        Calling {
            #[pin]
            future: S::Future,
            tab: Option<Box<dyn Meter>>,
            hearing: Option<Hearing<Bk>>,
        },
        Failed {
            error: Option<BudgetError>,
        },
    }
}

/// What a call's answer is heard with (see [`Budget::hear`]): the
/// budget, the call's key, and what the store counted for it.
struct Hearing<Bk> {
    budget: Arc<Budget<Bk>>,
    key: Key,
    admitted: Admitted,
}

impl<Bk> Hearing<Bk> {
    /// What `budget`'s reader needs to hear the answer of a call of `key`
    /// `admitted` so; `None` when it reads nothing.
    fn new(budget: &Arc<Budget<Bk>>, key: &Key, admitted: Admitted) -> Option<Self> {
        budget.reader.reads().then(|| Self {
            budget: Arc::clone(budget),
            key: key.clone(),
            admitted,
        })
    }
}

impl<S, R, Bk> BudgetFuture<S, R, Bk>
where
    S: Service<R>,
    Bk: Heeding,
{
    pub(crate) fn failed(error: BudgetError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }

    /// The call, admitted: sent now.
    pub(crate) fn call(
        mut service: S,
        request: R,
        budget: &Arc<Budget<Bk>>,
        key: Key,
        cost: u64,
        admitted: Admitted,
    ) -> Self {
        let hearing = Hearing::new(budget, &key, admitted);
        let tab = tab(budget, key, cost, admitted);
        Self {
            state: State::Calling {
                future: service.call(request),
                tab,
                hearing,
            },
        }
    }

    /// The call, once `waiting` admits it.
    pub(crate) fn waiting(
        waiting: Waiting,
        service: S,
        request: R,
        budget: &Arc<Budget<Bk>>,
        key: Key,
        cost: u64,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiting,
                call: Some((service, request)),
                budget: Arc::clone(budget),
                key,
                cost,
            },
        }
    }
}

/// What a counted call owes its answer's charge, when there is one.
fn tab<Bk: Heeding>(
    budget: &Arc<Budget<Bk>>,
    key: Key,
    cost: u64,
    admitted: Admitted,
) -> Option<Box<dyn Meter>> {
    budget.plan.charge.as_ref()?;
    let hit = admitted.hit.filter(|hit| hit.deadline.is_some())?;
    Some(Box::new(Tab {
        budget: Arc::clone(budget),
        key,
        hit,
        spent: cost,
        insured: admitted.insured,
    }))
}

impl<S, R, Bk, ResB> Future for BudgetFuture<S, R, Bk>
where
    S: Service<R, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    Bk: Heeding,
    ResB: http_body::Body,
{
    type Output = Result<Response<Metered<ResB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting {
                    waiting,
                    call,
                    budget,
                    key,
                    cost,
                } => {
                    let (admitted, slot) = match ready!(waiting.as_mut().poll(cx)) {
                        Ok(admitted) => admitted,
                        Err(err) => return Poll::Ready(Err(err.into())),
                    };
                    let (mut service, request) = call.take().expect("polled after completion");
                    let hearing = Hearing::new(budget, key, admitted);
                    let tab = tab(budget, key.clone(), *cost, admitted);
                    // The slot ends with the answer's body, after its
                    // charge; a call that fails drops it at once.
                    let tab = match slot {
                        Some(slot) => Some(Box::new(Held { slot, tab }) as Box<dyn Meter>),
                        None => tab,
                    };
                    state.set(State::Calling {
                        future: service.call(request),
                        tab,
                        hearing,
                    });
                }
                StateProj::Calling {
                    future,
                    tab,
                    hearing,
                } => {
                    let response = ready!(future.poll(cx)).map_err(Into::into)?;
                    if let Some(Hearing {
                        budget,
                        key,
                        admitted,
                    }) = hearing.take()
                    {
                        budget.hear(&key, &admitted, &ResponseHead::new(&response));
                    }
                    return Poll::Ready(Ok(Metered::wrap(response, tab.take())));
                }
                StateProj::Failed { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error.into()));
                }
            }
        }
    }
}

/// A call's slot in flight, held by its answer's body until it ends, with
/// the charge that body settles, if any.
struct Held {
    slot: SlotGuard,
    tab: Option<Box<dyn Meter>>,
}

impl Meter for Held {
    fn end(self: Box<Self>, end: &crate::count::ResponseHead<'_>) {
        let Self { slot, tab } = *self;
        if let Some(tab) = tab {
            tab.end(end);
        }
        drop(slot);
    }
}

impl<S, R, Bk> std::fmt::Debug for BudgetFuture<S, R, Bk>
where
    S: Service<R>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetFuture").finish_non_exhaustive()
    }
}
