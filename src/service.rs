//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower_service::Service;

use crate::backend::Backend;
use crate::charge::NoCharge;
use crate::future::{ResponseFuture, call_with};
use crate::judge::{Core, Fallback, OnMissingKey};
use crate::key::KeyExtractor;
use crate::refund::{self, ChargeMode, RefundTab};
use crate::request::RequestHead;
use crate::response::Deny;

/// Rate-limits the requests to `S`; made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Clones share the layer's configuration and backend, so they share one
/// budget per key.
///
/// Denials are built as `Response<ResBody>` with `ResBody::default()` as the
/// body, so the service's response body must implement [`Default`]; see
/// [`RateLimitLayer`](crate::RateLimitLayer#the-response-body-must-implement-default).
///
/// # Example
///
/// Any tower service, not only axum's: here a `service_fn`.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use tower_pinned_window::{Quota, RateLimitLayer, ResponseFuture};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let hello = service_fn(|_request: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("hello")))
/// });
/// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap());
/// let mut service = layer.layer(hello);
///
/// // `call` hands back a `ResponseFuture`, to await.
/// let future: ResponseFuture<_, _, _, _> =
///     service.ready().await.unwrap().call(Request::new(String::new()));
/// assert_eq!(future.await.unwrap().status(), StatusCode::OK);
///
/// // A clone shares the budget.
/// let denied = service.clone().oneshot(Request::new(String::new())).await.unwrap();
/// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
///
/// let _hello = service.get_ref();
/// let _hello = service.get_mut();
/// let _hello = service.into_inner();
/// # }
/// ```
///
/// # gRPC
///
/// With the `tonic` feature, a limited tonic service keeps its name
/// (`tonic::server::NamedService`), so one service can be limited on its
/// own: `Server::builder().add_service(layer.layer(MyServer::new(..)))`.
/// This is the async middleware tonic's docs point to for what an
/// `Interceptor` cannot do: an interceptor runs synchronously before the
/// call and never sees the answer, so it can neither wait for a shared
/// counter nor hand a hit back once the answer is known
/// ([`count_if`](crate::RateLimitLayer::count_if)).
///
/// `C` is [`NoCharge`] unless the layer has a
/// [`charge`](crate::RateLimitLayer::charge), whose answers' bodies are
/// [`Metered`](crate::Metered).
#[must_use]
pub struct RateLimit<S, K, Bk, D, C = NoCharge> {
    inner: S,
    key: K,
    core: Arc<Core<Bk, D>>,
    charge: PhantomData<fn() -> C>,
}

impl<S, K, Bk, D, C> RateLimit<S, K, Bk, D, C> {
    pub(crate) fn new(inner: S, key: K, core: Arc<Core<Bk, D>>) -> Self {
        Self {
            inner,
            key,
            core,
            charge: PhantomData,
        }
    }

    /// The wrapped service.
    ///
    /// See the [example](RateLimit#example).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// See the [example](RateLimit#example).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, consuming `self`.
    ///
    /// See the [example](RateLimit#example).
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, Bk, D, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, Bk, D, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
    Bk: Backend,
    D: Deny<ResBody>,
    ResBody: Default,
    C: ChargeMode<ResBody, D>,
{
    type Response = Response<C::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, Bk, D, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let core = &self.core;
        let head = RequestHead::new(&request);
        if let Some(skip) = &core.settings.skip
            && skip(&head)
        {
            tracing::trace!(limiter = %core.settings.name, "request skipped: passing it uncounted");
            return ResponseFuture::passing(self.inner.call(request));
        }
        let key = match self.key.extract(&head) {
            Ok(key) => key,
            Err(err) => {
                if core.settings.missing_key == OnMissingKey::Allow {
                    tracing::debug!(limiter = %core.settings.name, error = %err, "no rate-limit key; passing the request uncounted");
                    return ResponseFuture::passing(self.inner.call(request));
                }
                return ResponseFuture::respond(core.key_error_response(&err, &head));
            }
        };
        let policy = core.settings.policies.select(&head);
        // A layer with a cost, a charge, a lockout or a reset on success
        // spends; any other hits, as it always has.
        let (mut hit, cost) = match &core.settings.spend {
            None => (policy.hit(&core.backend, &key), None),
            Some(plan) => {
                let cost = plan.cost(&head);
                if let Some(index) = policy.never_fits(cost) {
                    let verdict = core.never_fits(&policy, index, cost, &head);
                    let carry = core.carry(&head);
                    return ResponseFuture::judged(verdict, carry, |decision| {
                        call_with(&mut self.inner, request, decision)
                    });
                }
                let spend = plan.spend(cost);
                (policy.spend(&core.backend, &key, spend), Some(cost))
            }
        };
        tracing::trace!(limiter = %core.settings.name, %key, ?cost, "rate-limit hit");
        // A backend that answers at once (the in-memory one does) is judged
        // here, and the service that was driven to readiness is called
        // directly. A backend that has to go out is polled again, with the
        // real waker, by the future; the ready service goes into the future
        // and a clone stays behind for the next call. Only a layer that
        // counts by outcome takes the refund step.
        match Pin::new(&mut hit).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => {
                let result = core.answered_at_once(result);
                let carry = core.carry(&head);
                if core.counts_by_outcome() {
                    let mut tab = RefundTab::open(core, &key);
                    if let Some(cost) = cost {
                        tab.spending(cost);
                    }
                    let verdict = refund::judge(core, tab, result, &policy, &head);
                    ResponseFuture::counted(verdict, carry, |decision| {
                        call_with(&mut self.inner, request, decision)
                    })
                } else {
                    let verdict = match result {
                        Err(err) if core.insures(&err) => {
                            core.insure(err, &policy, &head, Fallback { key: &key, cost })
                                .0
                        }
                        result => core.judge(result, &policy, &head, carry.anywhere()),
                    };
                    ResponseFuture::judged(verdict, carry, |decision| {
                        call_with(&mut self.inner, request, decision)
                    })
                }
            }
            Poll::Pending => {
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let tab = core.counts_by_outcome().then(|| {
                    let mut tab = RefundTab::open(core, &key);
                    if let Some(cost) = cost {
                        tab.spending(cost);
                    }
                    tab
                });
                // The insurance limiter needs the key and the cost; a tab
                // holds them already.
                let fallback = (tab.is_none() && core.settings.insurance.is_some())
                    .then(|| (key.clone(), cost));
                let core = Arc::clone(core);
                ResponseFuture::checking(core, hit, inner, request, policy.to_arc(), tab, fallback)
            }
        }
    }
}

/// A limited tonic service keeps its name, so tonic's
/// `Server::builder().add_service(layer.layer(MyServer::new(..)))` routes to
/// it and the limit applies to that service alone.
#[cfg(feature = "tonic")]
impl<S, K, Bk, D, C> tonic::server::NamedService for RateLimit<S, K, Bk, D, C>
where
    S: tonic::server::NamedService,
{
    const NAME: &'static str = S::NAME;
}

impl<S: Clone, K: Clone, Bk, D, C> Clone for RateLimit<S, K, Bk, D, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            core: Arc::clone(&self.core),
            charge: PhantomData,
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, Bk: fmt::Debug, D, C> fmt::Debug for RateLimit<S, K, Bk, D, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("core", &self.core)
            .finish()
    }
}
