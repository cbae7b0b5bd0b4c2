//! [`RateLimit`]: the middleware service, and the limiter's step on each
//! request (after its body is read, under a layer that reserves from it).

use std::fmt;
use std::marker::PhantomData;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::backend::{Backend, Cap, SlotId, Spend};
use crate::core::{Core, OnMissingKey};
use crate::cost::Counts;
use crate::cost::body::{self, BodyEstimate, BodyReader, Replay, Start, TooLarge};
use crate::key::KeyExtractor;
use crate::request::RequestHead;
use crate::response::Deny;
use crate::server::future::{Count, Reads, ResponseFuture};
use crate::server::verdict::Holding;

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
/// `M` is the layer's mode: `()`, plain hits, unless it spends ([`Spends`](crate::cost::Spends)) or
/// has a [`charge`](crate::RateLimitLayer::charge), whose answers' bodies
/// are [`Metered`](crate::cost::Metered).
///
/// `R` is `()` unless the layer
/// [reserves from the body](crate::RateLimitLayer::reserve_from_body): a
/// `RateLimit<S, K, Bk, D, M, BodyEstimate>` reads each request's body
/// before its limiter runs (its [`ResponseFuture`] starts by reading), and
/// `S` takes the body whole, as a `Request<`[`Replay<B>`](Replay)`>`. Any
/// other `RateLimit` never awaits the body.
#[must_use]
pub struct RateLimit<S, K, Bk, D, M = (), R = ()> {
    inner: S,
    key: K,
    core: Arc<Core<Bk, D>>,
    mode: PhantomData<fn() -> M>,
    /// Where a reservation is read from: `()`, or the body
    /// ([`BodyEstimate`]).
    reads: R,
}

impl<S, K, Bk, D, M, R> RateLimit<S, K, Bk, D, M, R> {
    pub(crate) fn new(inner: S, key: K, core: Arc<Core<Bk, D>>, reads: R) -> Self {
        Self {
            inner,
            key,
            core,
            mode: PhantomData,
            reads,
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

impl<S, K, Bk, D, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, Bk, D, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
    Bk: Backend,
    D: Deny<ResBody> + Send + Sync + 'static,
    ResBody: Default,
    M: Counts<Bk, ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, Bk, D, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.limit(request)
    }
}

impl<S, K, Bk, D, M, R> RateLimit<S, K, Bk, D, M, R> {
    /// The limiter's step on `request`: skipped, rejected for its key, or
    /// counted in the backend; the future takes it from there.
    #[inline(always)]
    fn limit<ReqBody, ResBody, R2, K2>(
        &mut self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, Bk, D, M, R2, K2>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        K: KeyExtractor,
        Bk: Backend,
        D: Deny<ResBody> + Send + Sync + 'static,
        ResBody: Default,
        M: Counts<Bk, ResBody>,
        R2: Reads<S, ReqBody, K2>,
    {
        let core = &self.core;
        let s = &core.settings;
        let head = RequestHead::new(&request);
        if let Some(skip) = &s.skip
            && skip(&head)
        {
            tracing::trace!(limiter = %s.name, "request skipped: passing it uncounted");
            return ResponseFuture::passing(self.inner.call(request));
        }
        let key = match self.key.extract(&head) {
            Ok(key) => key,
            Err(err) => {
                if s.missing_key == OnMissingKey::Allow {
                    tracing::debug!(limiter = %s.name, error = %err, "no rate-limit key; passing the request uncounted");
                    return ResponseFuture::passing(self.inner.call(request));
                }
                return ResponseFuture::key_rejected(core, &err, &head);
            }
        };
        let policy = s.policies.select(&head, &key);
        // A layer with a cost, a charge, a lockout or a reset on success
        // spends; any other hits, as it always has.
        let (spend, cost, never_fits) = match &s.spend {
            None => (None, None, None),
            Some(plan) => {
                let cost = plan.cost(&head);
                // A cost above a limit is denied whatever the count; it is
                // still spent, without a lockout, which spends nothing and
                // tells what the key's counters hold (for the headers).
                let never_fits = policy.never_fits(cost);
                let spend = match never_fits {
                    None => plan.spend(cost),
                    Some(_) => Spend::cost(cost),
                };
                (Some(spend), Some(cost), never_fits)
            }
        };
        let (hit, slot) = match (&core.cap, spend) {
            (None, None) => (policy.hit(&core.backend, &key), None),
            (None, Some(spend)) => (
                policy.with_counters(|counters| M::spend_all(&core.backend, &key, counters, spend)),
                None,
            ),
            // Under a cap, the slot is taken in the counters' step; its
            // guard is made first, so that a take whose answer never comes
            // back is given back by its name.
            (Some(cap), spend) => {
                let slot = SlotId::next();
                let in_flight = Cap {
                    namespace: &s.name,
                    in_flight: cap.in_flight,
                };
                let hit = policy.with_counters(|counters| {
                    M::take_all(&core.backend, &key, in_flight, slot, counters, spend)
                });
                (hit, M::guard(&cap.slots, &key, slot).map(Holding::boxed))
            }
        };
        tracing::trace!(limiter = %s.name, %key, ?cost, "rate-limit hit");
        let count = Count {
            policy,
            key: &key,
            cost,
            never_fits,
            slot,
        };
        ResponseFuture::start(core, hit, count, &mut self.inner, request)
    }
}

/// A layer that [reserves from the body](crate::RateLimitLayer::reserve_from_body)
/// reads each request's body (a bounded prefix of it) before its limiter
/// runs, and calls `S` with the body whole: a [`Replay`]. The request body
/// must be [`Unpin`] (hyper's and axum's are); box another
/// (`http_body_util::BodyExt::boxed`).
impl<S, K, Bk, D, M, B, ResBody> Service<Request<B>> for RateLimit<S, K, Bk, D, M, BodyEstimate>
where
    S: Service<Request<Replay<B>>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor + Clone,
    Bk: Backend,
    D: Deny<ResBody> + Send + Sync + 'static,
    ResBody: Default,
    M: Counts<Bk, ResBody>,
    B: Body + Unpin,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Replay<B>, Bk, D, M, BodyEstimate, K>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let reader = match BodyReader::start(&self.reads, request) {
            Start::Now(Ok(request)) => return self.limit(request),
            Start::Now(Err(TooLarge)) => return ResponseFuture::respond(body::too_large()),
            Start::Reading(reader) => reader,
        };
        // The ready service goes into the future, with the limiter that
        // runs once the body is read; a clone stays for the next call.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::reading(ReadThenLimit {
            reader,
            limiter: RateLimit::new(inner, self.key.clone(), Arc::clone(&self.core), ()),
        })
    }
}

/// A request whose body is read before its limiter runs, and the limiter,
/// its service ready. `pub` for the [`Reads`] impl's associated type, in a
/// module no user can name.
pub struct ReadThenLimit<S, K, B, Bk, D, M> {
    reader: BodyReader<B>,
    limiter: RateLimit<S, K, Bk, D, M>,
}

impl<S, B, K> Reads<S, Replay<B>, K> for BodyEstimate
where
    S: Clone,
    K: KeyExtractor,
    B: Body + Unpin,
{
    type Reading<Bk, D, M> = ReadThenLimit<S, K, B, Bk, D, M>;

    fn poll_read<Bk, D, M, ResBody>(
        reading: &mut ReadThenLimit<S, K, B, Bk, D, M>,
        cx: &mut Context<'_>,
    ) -> Poll<ResponseFuture<S, Replay<B>, Bk, D, M, Self, K>>
    where
        S: Service<Request<Replay<B>>, Response = Response<ResBody>>,
        Bk: Backend,
        D: Deny<ResBody> + Send + Sync + 'static,
        ResBody: Default,
        M: Counts<Bk, ResBody>,
    {
        Poll::Ready(match ready!(reading.reader.poll_read(cx)) {
            Ok(request) => reading.limiter.limit(request),
            Err(TooLarge) => ResponseFuture::respond(body::too_large()),
        })
    }
}

impl<S, K, B, Bk, D, M> fmt::Debug for ReadThenLimit<S, K, B, Bk, D, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadThenLimit")
            .field("reader", &self.reader)
            .finish_non_exhaustive()
    }
}

/// A limited tonic service keeps its name, so tonic's
/// `Server::builder().add_service(layer.layer(MyServer::new(..)))` routes to
/// it and the limit applies to that service alone.
#[cfg(feature = "tonic")]
impl<S, K, Bk, D, M, R> tonic::server::NamedService for RateLimit<S, K, Bk, D, M, R>
where
    S: tonic::server::NamedService,
{
    const NAME: &'static str = S::NAME;
}

impl<S: Clone, K: Clone, Bk, D, M, R: Clone> Clone for RateLimit<S, K, Bk, D, M, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            core: Arc::clone(&self.core),
            mode: PhantomData,
            reads: self.reads.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, Bk: fmt::Debug, D, M, R: fmt::Debug> fmt::Debug
    for RateLimit<S, K, Bk, D, M, R>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("core", &self.core)
            .field("reads", &self.reads)
            .finish()
    }
}
