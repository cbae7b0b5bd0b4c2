//! [`ResponseFuture`]: reads the request's body first under a layer that
//! reserves from it, waits for the backend's answer when it did not come at
//! once, then for the service.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::backend::{Backend, BackendError};
use crate::budget::settle::Wait;
use crate::core::Core;
use crate::cost::Counts;
use crate::cost::charge::Meter;
use crate::decision::{Carry, Decision};
use crate::key::{Key, KeyError};
use crate::metrics::Stopwatch;
use crate::policy::{Policy, Selected};
use crate::request::RequestHead;
use crate::response::{self, Deny};
use crate::server::tab::{Passed, RefundTab, Settled};
use crate::server::verdict::{self, Ask, Holding, Verdict};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): what its
    /// `call` returns, to await (a server awaits it for you). See the
    /// [example](crate::RateLimit#example).
    ///
    /// `ReqBody` is the request body `S` takes; `M` is the layer's
    /// mode (`()` unless it spends, see [`RateLimit`](crate::RateLimit)). `R` and `K` are `()` but under a layer
    /// that [reserves from the body](crate::RateLimitLayer::reserve_from_body):
    /// its future, `ResponseFuture<S, Replay<B>, Bk, D, M, BodyEstimate, K>`,
    /// reads the body first (a [`BodyEstimate`](crate::cost::BodyEstimate)),
    /// holding the key extractor `K` for the limiter that runs after.
    pub struct ResponseFuture<S, ReqBody, Bk, D, M = (), R = (), K = ()>
    where
        S: Service<Request<ReqBody>>,
        Bk: Backend,
        R: Reads<S, ReqBody, K>,
    {
        #[pin]
        state: State<
            Arc<Core<Bk, D>>,
            RefundTab<Bk, D>,
            Bk::Future,
            S,
            Request<ReqBody>,
            S::Future,
            S::Response,
            R::Reading<Bk, D, M>,
        >,
        mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, T, H, Svc, Req, F, Res, Rd> {
        // Waiting for the backend's count; the timer is armed only if the
        // backend does not answer on the first poll. It is held in place,
        // not boxed: a backend that goes out (Redis, PostgreSQL) waits on
        // every request, and a box would be an allocation each. Only this
        // state needs the core: a request decided in `call` never touches
        // it again.
        Checking {
            core: C,
            hit: H,
            #[pin]
            timer: Option<Sleep>,
            service: Option<Svc>,
            request: Option<Req>,
            policy: Arc<Policy>,
            // Since the backend call was found waiting (feature `metrics`;
            // zero-sized without).
            stopwatch: Stopwatch,
            // Only when the layer counts by outcome.
            tab: Option<Box<T>>,
            // The key, for the insurance limiter and the keys denied most;
            // only under `FailurePolicy::Insurance` or `top_denied`,
            // without a tab (which holds it). Inline: no allocation.
            fallback: Option<Key>,
            // What the request spends, under a layer that spends, and the
            // quota its cost can never fit, when there is one.
            cost: Option<u64>,
            never_fits: Option<usize>,
            // Under an in-flight cap, the guard of the slot asked for, boxed
            // (8 bytes here).
            slot: Option<Box<Holding>>,
        },
        // Passed on: waiting for the service, whose answer gets what the
        // decision writes onto it, if the request was counted and anything
        // is to be written. No refund can follow.
        Inner {
            #[pin]
            future: F,
            answer: Option<Answer>,
            // Under an in-flight cap, the slot the answer's body holds.
            held: Option<Box<Holding>>,
        },
        // Passed on counted, under a layer that counts by outcome: waiting
        // for the service, whose answer settles the tab (the decision is
        // in it).
        Counting {
            #[pin]
            future: F,
            tab: Option<Box<T>>,
            held: Option<Box<Holding>>,
        },
        // Answered, waiting for refunds that no tokio runtime can finish
        // in the background.
        Refunding {
            wait: Wait,
            response: Option<Res>,
            // A passed answer's slot, under a cap (a denial holds none).
            slot: Option<Box<Holding>>,
        },
        // Answered by the limiter itself.
        Respond {
            response: Option<Res>,
        },
        Done,
        // Reading the request's body, before the limiter runs: only under
        // a layer that reserves from the body. Uninhabited for any other
        // (`Infallible`), so its futures' layout and code are what they
        // would be without it (last, so the others keep their indices).
        Reading {
            reading: Rd,
        },
    }
}

/// The state of a [`ResponseFuture`], with its types filled in.
type FutureState<S, ReqBody, Bk, D, M, R, K> = State<
    Arc<Core<Bk, D>>,
    RefundTab<Bk, D>,
    <Bk as Backend>::Future,
    S,
    Request<ReqBody>,
    <S as Service<Request<ReqBody>>>::Future,
    <S as Service<Request<ReqBody>>>::Response,
    <R as Reads<S, ReqBody, K>>::Reading<Bk, D, M>,
>;

mod sealed {
    use std::task::{Context, Poll};

    use http::{Request, Response};
    use tower_service::Service;

    use super::ResponseFuture;
    use crate::backend::Backend;
    use crate::cost::Counts;
    use crate::response::Deny;

    /// Where a layer reads a request's reservation, in its
    /// [`RateLimit`](crate::RateLimit)'s type and its future's: from the
    /// head (`()`), with nothing to read first, or from the body
    /// ([`BodyEstimate`](crate::cost::BodyEstimate)), read before the
    /// limiter runs. Sealed: the layer's setters pick it.
    pub trait Reads<S, ReqBody, K> {
        /// The future's state while it reads: uninhabited for `()`.
        type Reading<Bk, D, M>;

        /// Reads on; once read, the future of the request as the limiter
        /// left it.
        fn poll_read<Bk, D, M, ResBody>(
            reading: &mut Self::Reading<Bk, D, M>,
            cx: &mut Context<'_>,
        ) -> Poll<ResponseFuture<S, ReqBody, Bk, D, M, Self, K>>
        where
            Self: Sized,
            S: Service<Request<ReqBody>, Response = Response<ResBody>>,
            Bk: Backend,
            D: Deny<ResBody> + Send + Sync + 'static,
            ResBody: Default,
            M: Counts<Bk, ResBody>;
    }
}

pub(crate) use sealed::Reads;

/// A layer whose reservation, if any, is read from the request's head has
/// nothing to read first.
impl<S, ReqBody, K> Reads<S, ReqBody, K> for () {
    type Reading<Bk, D, M> = Infallible;

    #[inline(always)]
    fn poll_read<Bk, D, M, ResBody>(
        reading: &mut Infallible,
        _cx: &mut Context<'_>,
    ) -> Poll<ResponseFuture<S, ReqBody, Bk, D, M, Self, K>>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        Bk: Backend,
    {
        match *reading {}
    }
}

impl<S, ReqBody, Bk, D, M, R, K> ResponseFuture<S, ReqBody, Bk, D, M, R, K>
where
    S: Service<Request<ReqBody>>,
    Bk: Backend,
    R: Reads<S, ReqBody, K>,
{
    #[inline(always)]
    fn with(state: FutureState<S, ReqBody, Bk, D, M, R, K>) -> Self {
        Self {
            state,
            mode: PhantomData,
        }
    }

    /// A request passed on uncounted (skipped, or without a key under
    /// `allow_missing_key(true)`).
    #[inline(always)]
    pub(crate) fn passing(future: S::Future) -> Self {
        Self::with(State::Inner {
            future,
            answer: None,
            held: None,
        })
    }

    pub(crate) fn respond(response: S::Response) -> Self {
        Self::with(State::Respond {
            response: Some(response),
        })
    }

    /// A request whose body is read before its limiter runs.
    pub(crate) fn reading(reading: R::Reading<Bk, D, M>) -> Self {
        Self::with(State::Reading { reading })
    }
}

impl<S, ReqBody, ResBody, Bk, D, M, R, K> ResponseFuture<S, ReqBody, Bk, D, M, R, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    Bk: Backend,
    R: Reads<S, ReqBody, K>,
{
    /// After the `verdict`: `call` the service (with the decision to put
    /// into the request, when `carry` says so), or answer (after the
    /// denial's refunds when they must finish first).
    #[inline(always)]
    fn decided(
        verdict: Verdict<ResBody, RefundTab<Bk, D>>,
        carry: Carry,
        held: Option<Box<Holding>>,
        call: impl FnOnce(Option<Decision>) -> S::Future,
    ) -> Self {
        // Each arm builds its state in place: a state built first and
        // moved after is a copy of the whole future.
        match verdict {
            Verdict::Pass(None) => Self::with(State::Inner {
                future: call(None),
                answer: None,
                held,
            }),
            Verdict::Pass(Some(Passed { decision, .. })) => {
                if carry.response || response::writes_on_passed(&decision) {
                    let for_request = carry.request.then(|| decision.clone());
                    let answer = Answer {
                        decision,
                        in_extensions: carry.response,
                    };
                    Self::with(State::Inner {
                        future: call(for_request),
                        answer: Some(answer),
                        held,
                    })
                } else {
                    // Nothing to write onto the answer: the decision goes
                    // to the request, or nowhere.
                    Self::with(State::Inner {
                        future: call(carry.request.then_some(decision)),
                        answer: None,
                        held,
                    })
                }
            }
            Verdict::Counted(tab) => Self::with(State::Counting {
                future: call(carry.request.then(|| tab.decision().cloned()).flatten()),
                tab: Some(tab),
                held,
            }),
            Verdict::Respond(response) => Self::respond(response),
            Verdict::Refunding(response, wait) => Self::with(State::Refunding {
                wait,
                response: Some(response),
                slot: None,
            }),
        }
    }
}

/// A request counted in the backend, as the service hands it over.
pub(crate) struct Count<'a> {
    /// The policy whose counters were hit.
    pub(crate) policy: Selected<'a>,
    pub(crate) key: &'a Key,
    /// What the request spends, under a layer that spends.
    pub(crate) cost: Option<u64>,
    /// The index of the quota its cost can never fit, when there is one:
    /// the backend was asked only to learn what the key's counters hold
    /// (a cost above a limit never fits, so nothing is spent).
    pub(crate) never_fits: Option<usize>,
    /// Under an in-flight cap, the guard of the slot asked for with the
    /// counters.
    pub(crate) slot: Option<Box<Holding>>,
}

impl<S, ReqBody, ResBody, Bk, D, M, R, K> ResponseFuture<S, ReqBody, Bk, D, M, R, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    Bk: Backend,
    D: Deny<ResBody>,
    ResBody: Default,
    M: Counts<Bk, ResBody>,
    R: Reads<S, ReqBody, K>,
{
    /// The future of `request`, counted with `hit`.
    ///
    /// A backend that answers at once (the in-memory one does) is decided
    /// here, and the `service` that was driven to readiness is called
    /// directly. A backend that has to go out is polled again, with the real
    /// waker, by the future; the ready service goes into the future and a
    /// clone stays behind for the next call. Only a layer that counts by
    /// outcome opens a tab.
    #[inline(always)]
    pub(crate) fn start(
        core: &Arc<Core<Bk, D>>,
        mut hit: Bk::Future,
        count: Count<'_>,
        service: &mut S,
        request: Request<ReqBody>,
    ) -> Self {
        let Count {
            policy,
            key,
            cost,
            never_fits,
            slot,
        } = count;
        // A request that can never fit is counted nowhere: nothing to
        // amend.
        let tab = (core.counts_by_outcome() && never_fits.is_none())
            .then(|| RefundTab::open(core, key, cost, M::amend));
        match Pin::new(&mut hit).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => {
                let result = core.answered_at_once(result);
                let head = RequestHead::new(&request);
                let carry = core.carry(&head);
                let ask = Ask {
                    request: &head,
                    policy: &policy,
                    carry,
                    key: Some(key),
                    cost,
                    never_fits,
                };
                let (verdict, held) = verdict::decide_holding(core, result, ask, tab, slot);
                Self::decided(verdict, carry, held, |decision| {
                    call_with(service, request, decision)
                })
            }
            Poll::Pending => {
                let clone = service.clone();
                let service = std::mem::replace(service, clone);
                // The insurance limiter and the keys denied most need the
                // key; a tab holds it already.
                let s = &core.settings;
                let needs_key = s.failure.insurance().is_some() || s.denied.is_some();
                let fallback = (tab.is_none() && needs_key).then(|| key.clone());
                Self::with(State::Checking {
                    core: Arc::clone(core),
                    hit,
                    timer: None,
                    service: Some(service),
                    request: Some(request),
                    policy: policy.to_arc(),
                    stopwatch: Stopwatch::start(),
                    tab,
                    fallback,
                    cost,
                    never_fits,
                    slot,
                })
            }
        }
    }

    /// The answer to a request without a usable key.
    pub(crate) fn key_rejected(core: &Core<Bk, D>, err: &KeyError, head: &RequestHead<'_>) -> Self {
        Self::respond(verdict::key_rejected(core, err, head))
    }
}

/// What a passed request's decision writes onto its answer.
struct Answer {
    decision: Decision,
    /// Whether the decision itself goes into the answer's extensions.
    in_extensions: bool,
}

/// Calls the ready `service` with `request`, each taken once, and
/// `decision`, if any, in the request's extensions.
fn call_once<S: Service<Request<B>>, B>(
    service: &mut Option<S>,
    request: &mut Option<Request<B>>,
    decision: Option<Decision>,
) -> S::Future {
    let mut service = service.take().expect("the service is taken once");
    let request = request.take().expect("the request is taken once");
    call_with(&mut service, request, decision)
}

/// Calls `service` with `request`, and `decision`, if any, in the request's
/// extensions.
#[inline(always)]
fn call_with<S: Service<Request<B>>, B>(
    service: &mut S,
    mut request: Request<B>,
    decision: Option<Decision>,
) -> S::Future {
    if let Some(decision) = decision {
        request.extensions_mut().insert(decision);
    }
    service.call(request)
}

impl<S, ReqBody, ResBody, Bk, D, M, R, K> Future for ResponseFuture<S, ReqBody, Bk, D, M, R, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    Bk: Backend,
    D: Deny<ResBody> + Send + Sync + 'static,
    ResBody: Default,
    M: Counts<Bk, ResBody>,
    R: Reads<S, ReqBody, K>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Reading { reading } => {
                    let next = ready!(R::poll_read(reading, cx));
                    this.state.set(next.state);
                }
                StateProj::Checking {
                    core,
                    hit,
                    mut timer,
                    service,
                    request,
                    policy,
                    stopwatch,
                    tab,
                    fallback,
                    cost,
                    never_fits,
                    slot,
                } => {
                    let result = match Pin::new(hit).poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            if timer.is_none() {
                                timer.set(Some(tokio::time::sleep(core.settings.timeout)));
                            }
                            let timer = timer.as_pin_mut().expect("armed above");
                            ready!(timer.poll(cx));
                            Err(BackendError::TimedOut)
                        }
                    };
                    let s = &core.settings;
                    s.metrics.backend_latency(&s.name, stopwatch.elapsed());
                    let head =
                        RequestHead::new(request.as_ref().expect("the request is taken once"));
                    let policy = Selected::Kept(policy);
                    let carry = core.carry(&head);
                    let ask = Ask {
                        request: &head,
                        policy: &policy,
                        carry,
                        key: fallback.as_ref(),
                        cost: *cost,
                        never_fits: *never_fits,
                    };
                    let (verdict, held) =
                        verdict::decide_holding(core, result, ask, tab.take(), slot.take());
                    let next =
                        Self::decided(verdict, carry, held, |d| call_once(service, request, d));
                    this.state.set(next.state);
                }
                StateProj::Inner {
                    future,
                    answer,
                    held,
                } => {
                    let result = ready!(future.poll(cx));
                    let answer = answer.take();
                    let held = held.take();
                    this.state.set(State::Done);
                    let mut response = result?;
                    if let Some(Answer {
                        decision,
                        in_extensions,
                    }) = answer
                    {
                        response::passed(&mut response, decision, in_extensions);
                    }
                    let slot = held.map(|held| held.onto(&mut response));
                    return Poll::Ready(Ok(M::answer(response, None, slot)));
                }
                StateProj::Counting { future, tab, held } => {
                    let result = ready!(future.poll(cx));
                    let tab = tab.take().expect("the tab is taken once");
                    let held = held.take();
                    this.state.set(State::Done);
                    // An error is no answer: the hit stays counted.
                    let mut response = result?;
                    let meter = match tab.settle(&mut response) {
                        Settled::Done => None,
                        Settled::Wait(wait) => {
                            this.state.set(State::Refunding {
                                wait,
                                response: Some(response),
                                slot: held,
                            });
                            continue;
                        }
                        Settled::Meter(tab) => Some(tab as Box<dyn Meter>),
                    };
                    let slot = held.map(|held| held.onto(&mut response));
                    return Poll::Ready(Ok(M::answer(response, meter, slot)));
                }
                StateProj::Refunding {
                    wait,
                    response,
                    slot,
                } => {
                    ready!(wait.as_mut().poll(cx));
                    let mut response = response.take().expect("the response is taken once");
                    let slot = slot.take().map(|held| held.onto(&mut response));
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(M::answer(response, None, slot)));
                }
                StateProj::Respond { response } => {
                    let response = response.take().expect("the response is taken once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(M::answer(response, None, None)));
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

impl<S, ReqBody, Bk, D, M, R, K> fmt::Debug for ResponseFuture<S, ReqBody, Bk, D, M, R, K>
where
    S: Service<Request<ReqBody>>,
    Bk: Backend,
    R: Reads<S, ReqBody, K>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reading { .. } => "reading",
            State::Checking { .. } => "checking",
            State::Inner { .. } => "inner",
            State::Counting { .. } => "counting",
            State::Refunding { .. } => "refunding",
            State::Respond { .. } => "respond",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
