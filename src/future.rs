//! [`ResponseFuture`]: waits for the backend's answer, then for the service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::backend::{Backend, BackendError};
use crate::judge::{Core, Stamp, Verdict};
use crate::metrics::Stopwatch;
use crate::policy::{Policy, Selected};
use crate::refund::{self, Tab, Wait};
use crate::request::RequestHead;
use crate::response::Deny;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, ReqBody, Bk, D>
    where
        S: Service<Request<ReqBody>>,
        Bk: Backend,
    {
        #[pin]
        state: State<
            Arc<Core<Bk, D>>,
            Tab<Bk, D>,
            Bk::Future,
            S,
            Request<ReqBody>,
            S::Future,
            S::Response,
        >,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, T, H, Svc, Req, F, Res> {
        // Waiting for the backend's count; the timer is armed only if the
        // backend does not answer on the first poll (boxed, so that the
        // in-memory path does not carry a timer's weight). Only this state
        // needs the core: a request judged in `call` never touches it again.
        Checking {
            core: C,
            hit: H,
            timer: Option<Pin<Box<Sleep>>>,
            service: Option<Svc>,
            request: Option<Req>,
            policy: Arc<Policy>,
            // Since the backend call was found waiting (feature `metrics`;
            // zero-sized without).
            stopwatch: Stopwatch,
            // Only when the layer counts by outcome.
            tab: Option<Box<T>>,
        },
        // Passed on: waiting for the service.
        Inner {
            #[pin]
            future: F,
            stamp: Option<Stamp>,
            // Only when the layer counts by outcome and the hit was counted.
            tab: Option<Box<T>>,
        },
        // Answered, waiting for refunds that no tokio runtime can finish
        // in the background.
        Refunding {
            wait: Wait,
            response: Option<Res>,
        },
        // Answered by the limiter itself.
        Respond {
            response: Option<Res>,
        },
        Done,
    }
}

impl<S, ReqBody, Bk, D> ResponseFuture<S, ReqBody, Bk, D>
where
    S: Service<Request<ReqBody>>,
    Bk: Backend,
{
    pub(crate) fn checking(
        core: Arc<Core<Bk, D>>,
        hit: Bk::Future,
        service: S,
        request: Request<ReqBody>,
        policy: Arc<Policy>,
        tab: Option<Box<Tab<Bk, D>>>,
    ) -> Self {
        Self {
            state: State::Checking {
                core,
                hit,
                timer: None,
                service: Some(service),
                request: Some(request),
                policy,
                stopwatch: Stopwatch::start(),
                tab,
            },
        }
    }

    pub(crate) fn passing(
        future: S::Future,
        stamp: Option<Stamp>,
        tab: Option<Box<Tab<Bk, D>>>,
    ) -> Self {
        Self {
            state: State::Inner { future, stamp, tab },
        }
    }

    pub(crate) fn respond(response: S::Response) -> Self {
        Self {
            state: State::Respond {
                response: Some(response),
            },
        }
    }

    /// A denial, after `wait` if its refunds must finish first.
    pub(crate) fn answered(response: S::Response, wait: Option<Wait>) -> Self {
        match wait {
            None => Self::respond(response),
            Some(wait) => Self {
                state: State::Refunding {
                    wait,
                    response: Some(response),
                },
            },
        }
    }
}

impl<S, ReqBody, ResBody, Bk, D> Future for ResponseFuture<S, ReqBody, Bk, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    Bk: Backend,
    D: Deny<ResBody>,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    core,
                    hit,
                    timer,
                    service,
                    request,
                    policy,
                    stopwatch,
                    tab,
                } => {
                    let result = match Pin::new(hit).poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            let timer = timer.get_or_insert_with(|| {
                                Box::pin(tokio::time::sleep(core.settings.timeout))
                            });
                            ready!(timer.as_mut().poll(cx));
                            Err(BackendError::TimedOut)
                        }
                    };
                    let s = &core.settings;
                    s.metrics.backend_latency(&s.name, stopwatch.elapsed());
                    let head =
                        RequestHead::new(request.as_ref().expect("the request is taken once"));
                    let (verdict, tab) =
                        refund::judge(core, tab.take(), result, &Selected::Kept(policy), &head);
                    match verdict {
                        Verdict::Pass(stamp) => {
                            let mut service = service.take().expect("the service is taken once");
                            let request = request.take().expect("the request is taken once");
                            let future = service.call(request);
                            this.state.set(State::Inner { future, stamp, tab });
                        }
                        Verdict::Respond(mut response) => {
                            if let Some(wait) = tab.and_then(|tab| tab.deny(&mut response)) {
                                this.state.set(State::Refunding {
                                    wait,
                                    response: Some(response),
                                });
                                continue;
                            }
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                    }
                }
                StateProj::Inner { future, stamp, tab } => {
                    let result = ready!(future.poll(cx));
                    let stamp = stamp.take();
                    let tab = tab.take();
                    this.state.set(State::Done);
                    // An error is no answer: the hit stays counted.
                    let mut response = result?;
                    if let Some(mut stamp) = stamp {
                        let wait = tab.and_then(|tab| tab.settle(&mut stamp, &response));
                        stamp.apply(&mut response);
                        if let Some(wait) = wait {
                            this.state.set(State::Refunding {
                                wait,
                                response: Some(response),
                            });
                            continue;
                        }
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Refunding { wait, response } => {
                    ready!(wait.as_mut().poll(cx));
                    let response = response.take().expect("the response is taken once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Respond { response } => {
                    let response = response.take().expect("the response is taken once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

impl<S, ReqBody, Bk, D> fmt::Debug for ResponseFuture<S, ReqBody, Bk, D>
where
    S: Service<Request<ReqBody>>,
    Bk: Backend,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Inner { .. } => "inner",
            State::Refunding { .. } => "refunding",
            State::Respond { .. } => "respond",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
