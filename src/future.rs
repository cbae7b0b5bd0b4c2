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
use crate::policy::Policy;
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
        state: State<Arc<Core<Bk, D>>, Bk::Future, S, Request<ReqBody>, S::Future, S::Response>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<C, H, Svc, Req, F, Res> {
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
        },
        // Passed on: waiting for the service.
        Inner {
            #[pin]
            future: F,
            stamp: Option<Stamp>,
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
    ) -> Self {
        Self {
            state: State::Checking {
                core,
                hit,
                timer: None,
                service: Some(service),
                request: Some(request),
                policy,
            },
        }
    }

    pub(crate) fn passing(future: S::Future, stamp: Option<Stamp>) -> Self {
        Self {
            state: State::Inner { future, stamp },
        }
    }

    pub(crate) fn respond(response: S::Response) -> Self {
        Self {
            state: State::Respond {
                response: Some(response),
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
                    let head =
                        RequestHead::new(request.as_ref().expect("the request is taken once"));
                    match core.judge(result, policy.clone(), &head) {
                        Verdict::Pass(stamp) => {
                            let mut service = service.take().expect("the service is taken once");
                            let request = request.take().expect("the request is taken once");
                            let future = service.call(request);
                            this.state.set(State::Inner { future, stamp });
                        }
                        Verdict::Respond(response) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                    }
                }
                StateProj::Inner { future, stamp } => {
                    let result = ready!(future.poll(cx));
                    let stamp = stamp.take();
                    this.state.set(State::Done);
                    let mut response = result?;
                    if let Some(stamp) = stamp {
                        stamp.apply(&mut response);
                    }
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
            State::Respond { .. } => "respond",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
