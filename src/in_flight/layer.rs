//! [`InFlightLayer`]: its settings, and [`InFlightLimit`], the service that
//! takes a request's slot before calling the service and hands the slot to
//! the answer's body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::backend::{InFlight, Leasing, MemoryBackend, SlotId};
use crate::budget::check::{built, layer_name};
use crate::budget::failure::{self, Failure, FailurePolicy};
use crate::error::ConfigError;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::quota::Window;
use crate::request::RequestHead;
use crate::response;
use crate::timeout::DEFAULT_TIMEOUT;

use super::slot::{Admission, Leased, Release, Shared, SlotGuard};

/// Caps the requests **in flight** per key, shared by every instance on the
/// same backend: at most [`InFlight::max`] run at once per key, each
/// holding a slot from before the service is called until its answer's
/// body ends, fails or is dropped. Guide:
/// [`docs/in-flight.md`](crate::guide::in_flight).
///
/// A slot lives on a **lease**: it is created with its expiry in one atomic
/// step, this instance extends the leases of the slots it holds once every
/// third of the lease (one store call for all of them), and a slot whose
/// holder died (killed, its host lost) returns within the lease. A holder
/// stalled for less than the lease keeps its slots; a slot is never
/// granted twice.
///
/// A request refused a slot is answered `429 Too Many Requests` with
/// `Retry-After` (gRPC: `RESOURCE_EXHAUSTED`), or waits for one up to
/// [`wait`](Self::wait). Every answer carries the IETF fields with the
/// quota unit `concurrent-requests`: `RateLimit-Policy: "name";q=3;qu="concurrent-requests"`
/// and `RateLimit: "name";r=2` (the slots left; with `t`, the seconds until
/// the earliest lease runs out, on a refusal).
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::{Service, ServiceExt};
/// use tower_pinned_window::{InFlight, InFlightLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cap = InFlight::new(1, Duration::from_secs(30)).unwrap();
/// let mut app = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(InFlightLayer::new("completions", cap));
///
/// // The first answer holds the one slot until its body is read or dropped.
/// let first = app.call(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["ratelimit"], "\"completions\";r=0");
/// let second = app.call(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(second.headers()["retry-after"], "30");
///
/// drop(first);
/// let third = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(third.status(), StatusCode::OK);
/// # }
/// ```
///
/// Keyed by nothing (`()`), one cap covers the whole service; a
/// [`key`](Self::key) extractor caps each client, tenant or API key apart.
/// The slots live in a [`MemoryBackend`] unless a [`backend`](Self::backend)
/// shared by every instance is set (Redis, PostgreSQL, or any store that
/// implements [`Leasing`]).
#[must_use]
pub struct InFlightLayer<K = (), Bk = MemoryBackend> {
    key: K,
    shared: Arc<Shared<Bk>>,
}

impl InFlightLayer {
    /// A cap named `name` (the namespace of its slots, and its name in the
    /// headers and logs), keyed by nothing, on a [`MemoryBackend`].
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN)
    /// characters from `A-Z a-z 0-9 _ - . :`. Use [`try_new`](Self::try_new)
    /// for a name read at run time.
    #[track_caller]
    pub fn new(name: impl Into<String>, in_flight: InFlight) -> Self {
        built(Self::try_new(name, in_flight))
    }

    /// Like [`new`](Self::new), for a name read at run time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for a name that is empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN), or has a character outside
    /// `A-Z a-z 0-9 _ - . :`.
    pub fn try_new(name: impl Into<String>, in_flight: InFlight) -> Result<Self, ConfigError> {
        let name = layer_name(name.into())?;
        Ok(Self {
            key: (),
            shared: Arc::new(Shared::new(
                name,
                in_flight,
                MemoryBackend::new(),
                Failure::default(),
                DEFAULT_TIMEOUT,
                Duration::ZERO,
            )),
        })
    }
}

impl<K, Bk: Clone> InFlightLayer<K, Bk> {
    /// Cap each key `key` extracts apart (see [`crate::key`]).
    pub fn key<K2: KeyExtractor>(self, key: K2) -> InFlightLayer<K2, Bk> {
        InFlightLayer {
            key,
            shared: self.shared,
        }
    }

    /// Keep the slots in `backend`, shared by every instance on it.
    pub fn backend<Bk2: Leasing>(self, backend: Bk2) -> InFlightLayer<K, Bk2> {
        let s = &self.shared;
        InFlightLayer {
            key: self.key,
            shared: Arc::new(Shared::new(
                Arc::clone(&s.name),
                s.in_flight,
                backend,
                s.failure.clone(),
                s.timeout,
                s.wait,
            )),
        }
    }

    /// How long a store call may take (default
    /// [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)) before the request is
    /// handled as if the store were down (see
    /// [`on_failure`](Self::on_failure)). The lease must be longer:
    /// [`check`](Self::check).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.timeout = timeout)
    }

    /// Let a request refused a slot wait for one, up to `wait`, asking the
    /// store again as the earliest lease runs out and at least every 50 ms
    /// (a slot given back is seen then); refused with `429` when the wait
    /// is over. Default: no wait.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|s| s.wait = wait)
    }

    /// What a request gets when the store is out (default
    /// [`FailurePolicy::FailClosed`]: `503`): under
    /// [`FailurePolicy::Insurance`], each instance holds at most its
    /// [`Share`](crate::Share) of the cap in its own memory (never the whole
    /// cap each), slots that never reach the store, and the store decides
    /// again from its first answer.
    pub fn on_failure(self, policy: FailurePolicy) -> Self {
        self.with(|s| s.failure.set(policy))
    }

    /// The cap.
    pub fn in_flight(&self) -> InFlight {
        self.shared.in_flight
    }

    /// How many slots this layer's instance holds in its store now (slots
    /// taken from the insurance limiter aside).
    pub fn held(&self) -> usize {
        self.shared.held_count()
    }

    /// This layer with `change` made to its settings: a layer is changed
    /// where it is built, before it has served a request.
    fn with(self, change: impl FnOnce(&mut Shared<Bk>)) -> Self
    where
        Bk: Clone,
    {
        // A new layer, with its own slots: a clone made before keeps the
        // layer it was.
        let s = &self.shared;
        let mut shared = Shared::new(
            Arc::clone(&s.name),
            s.in_flight,
            s.backend.clone(),
            s.failure.clone(),
            s.timeout,
            s.wait,
        );
        change(&mut shared);
        Self {
            key: self.key,
            shared: Arc::new(shared),
        }
    }
}

impl<K, Bk> InFlightLayer<K, Bk> {
    /// The settings checked together, the one place where settings that
    /// depend on each other are: a lease no longer than the
    /// [`timeout`](Self::timeout) is refused, since a slot could run out
    /// before the answer that made it arrived. [`Layer::layer`] panics with
    /// this error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, InFlight, InFlightLayer};
    ///
    /// let cap = InFlight::new(3, Duration::from_millis(80)).unwrap();
    /// let layer = InFlightLayer::new("jobs", cap);
    /// assert_eq!(
    ///     layer.check().err(),
    ///     Some(ConfigError::LeaseNotAboveTimeout { lease_ms: 80, timeout_ms: 100 })
    /// );
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::LeaseNotAboveTimeout`].
    pub fn check(&self) -> Result<(), ConfigError> {
        lease_above(self.shared.in_flight.lease(), self.shared.timeout)
    }
}

impl<K: Clone, Bk> Clone for InFlightLayer<K, Bk> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: fmt::Debug, Bk: fmt::Debug> fmt::Debug for InFlightLayer<K, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayer")
            .field("key", &self.key)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, K: Clone, Bk> Layer<S> for InFlightLayer<K, Bk> {
    type Service = InFlightLimit<S, K, Bk>;

    /// # Panics
    /// When [`check`](InFlightLayer::check) fails.
    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        built(self.check());
        InFlightLimit {
            inner,
            key: self.key.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Caps the requests in flight to `S`; made by [`InFlightLayer`]. Clones
/// share the layer's cap and slots.
#[must_use]
pub struct InFlightLimit<S, K, Bk> {
    inner: S,
    key: K,
    shared: Arc<Shared<Bk>>,
}

impl<S, K, Bk> InFlightLimit<S, K, Bk> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone, Bk> Clone for InFlightLimit<S, K, Bk> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, Bk: fmt::Debug> fmt::Debug for InFlightLimit<S, K, Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("shared", &self.shared)
            .finish()
    }
}

/// The future of an [`InFlightLimit`]'s answer.
pub type InFlightFuture<ResBody, E> =
    Pin<Box<dyn Future<Output = Result<Response<Leased<ResBody>>, E>> + Send>>;

impl<S, K, Bk, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightLimit<S, K, Bk>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor,
    Bk: Leasing,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<Leased<ResBody>>;
    type Error = S::Error;
    type Future = InFlightFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let head = RequestHead::new(&request);
        let grpc = head.is_grpc();
        let key = match self.key.extract(&head) {
            Ok(key) => key,
            Err(err) => {
                let response = key_rejected(&self.shared, &err, grpc);
                return Box::pin(async move { Ok(response.map(|b| Leased::new(b, None))) });
            }
        };
        // The ready service goes into the future; a clone stays for the
        // next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(run(shared, inner, key, grpc, request))
    }
}

/// One request: its slot, then the service, then the answer holding the
/// slot.
async fn run<S, Bk, ReqBody, ResBody>(
    shared: Arc<Shared<Bk>>,
    mut inner: S,
    key: Key,
    grpc: bool,
    request: Request<ReqBody>,
) -> Result<Response<Leased<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    Bk: Leasing,
    ResBody: Default,
{
    let slot = SlotId::next();
    let admission = admit(&shared, &key, slot).await;
    let (guard, left) = match admission {
        Admission::Slot { local, left } => {
            let release: Arc<dyn Release> = shared.clone();
            (Some(SlotGuard::new(release, key, slot, local)), Some(left))
        }
        Admission::Uncounted => (None, None),
        Admission::Answered(taken) => {
            let mut response = response::busy::<ResBody>(grpc, taken.retry);
            let left = shared.in_flight.max().saturating_sub(taken.in_use);
            shared
                .fields
                .write(response.headers_mut(), left, Some(taken.retry));
            return Ok(response.map(|b| Leased::new(b, None)));
        }
        Admission::Failed(err) => {
            let response = if err.is_corrupt() {
                failure::corrupt(&shared.name, &err);
                response::corrupt::<ResBody>(grpc)
            } else {
                response::unavailable::<ResBody>(grpc)
            };
            let mut response = response;
            response.extensions_mut().insert(Arc::new(err));
            return Ok(response.map(|b| Leased::new(b, None)));
        }
    };
    // The guard lives in this future until the answer: a cancelled call or
    // a panicking handler drops it, which gives the slot back.
    let mut response = inner.call(request).await?;
    if let Some(left) = left {
        shared.fields.write(response.headers_mut(), left, None);
    }
    Ok(response.map(|body| Leased::new(body, guard)))
}

/// A lease longer than the store's `timeout`, or the error that says it
/// is not: a slot could run out before the answer that made it arrived.
pub(crate) fn lease_above(lease: Window, timeout: Duration) -> Result<(), ConfigError> {
    let lease = lease.as_duration();
    if lease <= timeout {
        return Err(ConfigError::LeaseNotAboveTimeout {
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        });
    }
    Ok(())
}

/// Takes `slot` for `key`: from the store (waiting up to the layer's
/// `wait` while the cap is full), or, when the store fails, as the failure
/// policy says.
async fn admit<Bk: Leasing>(shared: &Arc<Shared<Bk>>, key: &Key, slot: SlotId) -> Admission {
    let until = tokio::time::Instant::now() + shared.wait;
    loop {
        let taken = match shared.take_once(key, slot).await {
            Admission::Answered(taken) => taken,
            admitted => return admitted,
        };
        let now = tokio::time::Instant::now();
        if now >= until {
            return Admission::Answered(taken);
        }
        // Ask again when the earliest lease runs out, at least every 50 ms
        // (a slot given back frees sooner), never past the wait.
        tokio::time::sleep_until((now + super::slot::next_ask(taken.retry)).min(until)).await;
    }
}

fn key_rejected<Bk, B: Default>(shared: &Shared<Bk>, err: &KeyError, grpc: bool) -> Response<B> {
    if let Some(suppressed) = shared.key_gate.admit() {
        match err {
            KeyError::Misconfigured(_) => {
                tracing::error!(limiter = %shared.name, error = %err, suppressed, "in-flight key extractor misconfigured: answering 500");
            }
            _ => {
                tracing::warn!(limiter = %shared.name, error = %err, suppressed, "request without a usable in-flight key: answering 400");
            }
        }
    }
    response::key_rejected(grpc, err.status())
}
