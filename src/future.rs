//! [`ResponseFuture`]: waits for the backend's answer, then for the service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::backend::{Backend, BackendError, Hits};
use crate::decision::Decision;
use crate::key::KeyError;
use crate::layer::{Core, FailurePolicy};
use crate::policy::Policy;
use crate::response::{Deny, GrpcCode, grpc_response, is_grpc, status_response};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, ReqBody, Bk, D>
    where
        S: Service<Request<ReqBody>>,
        Bk: Backend,
    {
        #[pin]
        state: State<Bk::Future, S, Request<ReqBody>, S::Future, S::Response>,
        core: Arc<Core<Bk, D>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<H, Svc, Req, F, Res> {
        // Waiting for the backend's count; the timer is armed only if the
        // backend does not answer on the first poll (boxed, so that the
        // in-memory path does not carry a timer's weight).
        Checking {
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
                hit,
                timer: None,
                service: Some(service),
                request: Some(request),
                policy,
            },
            core,
        }
    }

    pub(crate) fn passing(core: Arc<Core<Bk, D>>, future: S::Future, stamp: Option<Stamp>) -> Self {
        Self {
            state: State::Inner { future, stamp },
            core,
        }
    }

    pub(crate) fn respond(core: Arc<Core<Bk, D>>, response: S::Response) -> Self {
        Self {
            state: State::Respond {
                response: Some(response),
            },
            core,
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
                                Box::pin(tokio::time::sleep(this.core.settings.timeout))
                            });
                            ready!(timer.as_mut().poll(cx));
                            Err(BackendError::TimedOut)
                        }
                    };
                    let headers = request
                        .as_ref()
                        .expect("the request is taken once")
                        .headers();
                    match this.core.judge(result, policy.clone(), headers) {
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
                    if let Some(Stamp {
                        policy,
                        index,
                        decision,
                    }) = stamp
                    {
                        policy
                            .headers
                            .write(response.headers_mut(), index, &decision, false);
                        response.extensions_mut().insert(decision);
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

/// What the limiter does with a request once the backend has answered.
pub(crate) enum Verdict<B> {
    /// Call the service; decorate its response with the decision, if any.
    Pass(Option<Stamp>),
    /// Answer without calling the service.
    Respond(Response<B>),
}

/// A passed request's decision, to be written onto its response.
pub(crate) struct Stamp {
    policy: Arc<Policy>,
    /// Which of the policy's quotas the decision is about.
    index: usize,
    decision: Decision,
}

impl<Bk, D> Core<Bk, D> {
    /// `request` is only read (for its content-type) when the request is not
    /// passed on.
    pub(crate) fn judge<B>(
        &self,
        result: Result<Hits, BackendError>,
        policy: Arc<Policy>,
        request: &HeaderMap,
    ) -> Verdict<B>
    where
        D: Deny<B>,
        B: Default,
    {
        let s = &self.settings;
        let hits = match result {
            Ok(hits) => hits,
            Err(err) if err.is_corrupt() => {
                tracing::error!(limiter = %s.name, error = %err, "corrupt rate-limit counter: request stopped, value left untouched");
                return Verdict::Respond(if is_grpc(request) {
                    grpc_response(GrpcCode::Internal, "rate limiter state is corrupt", None)
                } else {
                    status_response(StatusCode::INTERNAL_SERVER_ERROR)
                });
            }
            Err(err) => return self.outage(err, request),
        };
        let Some((index, decision)) = policy.decide(&hits, s.shadow) else {
            let err = BackendError::Unavailable("the backend answered no hit".into());
            return self.outage(err, request);
        };
        tracing::debug!(limiter = %s.name, count = decision.count(), limit = decision.limit(), outcome = ?decision.outcome(), "rate-limit decision");
        if let Some(observer) = &s.observer {
            observer(&decision);
        }
        if decision.passed() {
            return Verdict::Pass(Some(Stamp {
                policy,
                index,
                decision,
            }));
        }
        let mut response = if is_grpc(request) {
            grpc_response(
                GrpcCode::ResourceExhausted,
                "rate limit exceeded",
                Some(decision.reset()),
            )
        } else {
            self.deny.deny(&decision)
        };
        policy
            .headers
            .write(response.headers_mut(), index, &decision, true);
        response.extensions_mut().insert(decision);
        Verdict::Respond(response)
    }

    fn outage<B: Default>(&self, err: BackendError, request: &HeaderMap) -> Verdict<B> {
        let s = &self.settings;
        let fail_open = s.failure == FailurePolicy::FailOpen;
        if let Some(suppressed) = s.warn_gate.admit() {
            let action = if fail_open {
                "passing requests uncounted"
            } else {
                "answering 503"
            };
            tracing::warn!(limiter = %s.name, error = %err, suppressed, "rate-limit backend failed: {action}");
        }
        if fail_open {
            return Verdict::Pass(None);
        }
        Verdict::Respond(if is_grpc(request) {
            grpc_response(GrpcCode::Unavailable, "rate limiter unavailable", None)
        } else {
            let mut response = status_response(StatusCode::SERVICE_UNAVAILABLE);
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            response
        })
    }

    pub(crate) fn key_error_response<B: Default>(&self, err: &KeyError, grpc: bool) -> Response<B> {
        let s = &self.settings;
        match err {
            KeyError::Misconfigured(_) => {
                if let Some(suppressed) = s.key_gate.admit() {
                    tracing::error!(limiter = %s.name, error = %err, suppressed, "rate-limit key extractor misconfigured: answering 500");
                }
            }
            _ => {
                if let Some(suppressed) = s.key_gate.admit() {
                    tracing::warn!(limiter = %s.name, error = %err, suppressed, "request without a usable rate-limit key: answering 400");
                }
            }
        }
        match (grpc, err.status()) {
            (false, status) => status_response(status),
            (true, StatusCode::BAD_REQUEST) => grpc_response(
                GrpcCode::InvalidArgument,
                "rate-limit key missing or invalid",
                None,
            ),
            (true, _) => grpc_response(
                GrpcCode::Internal,
                "rate-limit key extractor misconfigured",
                None,
            ),
        }
    }
}
