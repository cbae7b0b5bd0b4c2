//! [`RateLimitLayer`]: the configuration, and the middleware's constructor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower_layer::Layer;

use crate::backend::{Backend, MemoryBackend};
use crate::charge::ResponseEnd;
use crate::core::{Core, FailurePolicy, OnMissingKey, Settings, SkipIf};
use crate::cost::{Charged, Cost, Mode, Plain, SpendPlan};
use crate::count::{CountOnly, ResponseHead};
use crate::decision::{Decision, DecisionIn};
use crate::error::ConfigError;
use crate::insurance::Insurance;
use crate::key::{Allowlist, GlobalKey, Key, KeyError, KeyExtractor};
use crate::name::is_layer_name;
use crate::policy::{NamedQuota, Policies};
use crate::quota::{Quota, Window};
use crate::request::RequestHead;
use crate::response::{DefaultDeny, HeaderStyle};
use crate::service::RateLimit;

/// How long a backend call may take before the request is handled as if the
/// backend were down; see [`timeout`](RateLimitLayer::timeout) for an
/// example.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Applies a pinned-window rate limit to a service.
///
/// Every request is charged to the key that `K` extracts from it. A key's
/// window opens at its first hit and closes [`Quota::window`] later; hits in
/// between never move it. Past [`Quota::limit`] hits, requests are answered
/// with `429 Too Many Requests` and `Retry-After` (gRPC requests with
/// RESOURCE_EXHAUSTED) until the window closes.
///
/// All state lives in the backend, which every clone of the layer and of the
/// services it makes shares: cloning never creates a second budget. A layer's
/// [name](Self::new) namespaces its keys, so two layers never share counters
/// unless they share both a backend and a name.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new("api", quota));
/// ```
///
/// # The response body must implement `Default`
///
/// The layer answers a denial itself, with an empty body of the service's
/// own response body type: the wrapped service's `Response<ResBody>` needs
/// `ResBody: Default` (as tower-http's `TimeoutLayer` and
/// `ValidateRequestHeaderLayer` do). axum's, tonic's and hyper's bodies
/// implement it; a layer that wraps the body in a type of its own may not:
/// tower-http's `TraceLayer` and `CompressionLayer` do not. Put this layer
/// *inside* those (below them in a `ServiceBuilder`, whose first layer is the
/// outermost), which is also where it belongs: the trace then records the
/// 429s.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_http::{timeout::TimeoutLayer, trace::TraceLayer};
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let app = Router::new().route("/", get(|| async { "hello" })).layer(
///     ServiceBuilder::new()
///         .layer(TraceLayer::new_for_http()) // outermost: sees every answer
///         .layer(TimeoutLayer::with_status_code(
///             StatusCode::REQUEST_TIMEOUT,
///             Duration::from_secs(10),
///         ))
///         .layer(RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())),
/// );
/// let status = |app: Router| async move {
///     app.oneshot(Request::new(Body::empty())).await.unwrap().status()
/// };
/// assert_eq!(status(app.clone()).await, StatusCode::OK);
/// assert_eq!(status(app).await, StatusCode::TOO_MANY_REQUESTS);
/// # }
/// ```
///
/// The other way round, the limiter would have to build tower-http's
/// `ResponseBody`, which has no `Default`, and the compiler says
/// ``the trait bound `DefaultDeny: Deny<ResponseBody<..>>` is not satisfied``:
///
/// ```compile_fail,E0277
/// # use std::time::Duration;
/// # use axum::{Router, routing::get};
/// # use tower::ServiceBuilder;
/// # use tower_http::trace::TraceLayer;
/// # use tower_pinned_window::{Quota, RateLimitLayer};
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(
///     ServiceBuilder::new()
///         .layer(RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap()))
///         .layer(TraceLayer::new_for_http()),
/// );
/// ```
///
/// `M` is the layer's [`Mode`]: [`Plain`] unless it spends (a
/// [`cost`](Self::cost), a [`block_for`](Self::block_for), a
/// [`reset_if`](Self::reset_if)) or has a [`charge`](Self::charge).
///
/// # Panics
/// [`Layer::layer`] panics when the layer cannot work (see
/// [`check`](Self::check)): settings that depend on each other are checked
/// there, once, whatever the order they were set in.
#[must_use]
pub struct RateLimitLayer<K = GlobalKey, Bk = MemoryBackend, D = DefaultDeny, M = Plain> {
    key: K,
    core: Core<Bk, D>,
    mode: PhantomData<fn() -> M>,
}

impl RateLimitLayer {
    /// A layer named `name` that limits every request to `quota` in one
    /// global budget, counted in a fresh [`MemoryBackend`]. Pick the key with
    /// [`key`](Self::key) and the store with [`backend`](Self::backend).
    /// See the [type's examples](RateLimitLayer).
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`](crate::name::MAX_NAME_LEN) characters from
    /// `A-Z a-z 0-9 _ - . :`, like [`http::HeaderValue::from_static`]: a
    /// literal name is checked once, when the layer is built. Use
    /// [`try_new`](Self::try_new) for a name known only at run time.
    #[track_caller]
    pub fn new(name: &'static str, quota: Quota) -> Self {
        match Self::try_new(name, quota) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`new`](Self::new), for a name known only at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
    ///
    /// let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
    /// let layer = RateLimitLayer::try_new(String::from("tenant-7"), quota).unwrap();
    /// assert_eq!(layer.name(), "tenant-7");
    /// assert_eq!(layer.quota(), quota);
    /// assert!(matches!(
    ///     RateLimitLayer::try_new("no spaces", quota),
    ///     Err(ConfigError::InvalidName(_))
    /// ));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for a name that is empty, longer than
    /// [`MAX_NAME_LEN`](crate::name::MAX_NAME_LEN), or has a character outside `A-Z a-z 0-9 _ - . :`.
    pub fn try_new(name: impl Into<String>, quota: Quota) -> Result<Self, ConfigError> {
        let name = name.into();
        // The allowed characters are a subset of an sf-string's, so the name
        // goes into the RateLimit headers as it is.
        if !is_layer_name(&name) {
            return Err(ConfigError::InvalidName(name));
        }
        let name: Arc<str> = name.into();
        let policies = Policies::new(name.clone(), quota, HeaderStyle::default());
        Ok(Self {
            key: GlobalKey,
            core: Core::new(
                MemoryBackend::new(),
                DefaultDeny,
                name,
                policies,
                DEFAULT_TIMEOUT,
            ),
            mode: PhantomData,
        })
    }
}

impl<K, Bk, D, M> RateLimitLayer<K, Bk, D, M> {
    /// Charge each request to the key `key` extracts (see [`crate::key`]):
    /// a built-in extractor, a pair of them, or your own [`KeyExtractor`].
    /// For a closure, use [`key_fn`](Self::key_fn), which infers its
    /// argument's type.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<K2, Bk, D, M> {
        RateLimitLayer {
            key,
            core: self.core,
            mode: PhantomData,
        }
    }

    /// Charge each request to the key `key` reads from the request's head.
    /// The closure's argument type is inferred:
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::key::{Key, KeyError};
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("per-user", Quota::new(10, Duration::from_secs(60)).unwrap())
    ///     .key_fn(|req| match req.headers().get("x-user-id") {
    ///         Some(id) => Ok(Key::new(id.as_bytes())),
    ///         None => Err(KeyError::missing("x-user-id")),
    ///     });
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// let anonymous = app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
    /// # }
    /// ```
    pub fn key_fn<F>(self, key: F) -> RateLimitLayer<F, Bk, D, M>
    where
        F: Fn(&RequestHead<'_>) -> Result<Key, KeyError>,
    {
        self.key(key)
    }

    /// Keep counters in `backend` instead of this layer's own
    /// [`MemoryBackend`]. Layers given clones of one backend share counters
    /// only where their names are equal.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer, backend::MemoryBackend};
    ///
    /// let store = MemoryBackend::new();
    /// let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
    /// // Two routers, one budget: same store, same name.
    /// let public = RateLimitLayer::new("api", quota).backend(store.clone());
    /// let admin = RateLimitLayer::new("api", quota).backend(store);
    /// ```
    ///
    /// A layer that spends (a [cost](Self::cost), a [charge](Self::charge), a
    /// [lockout](Self::block_for) or a [reset on success](Self::reset_if))
    /// needs a backend that implements
    /// [`Spending`](crate::backend::Spending), set before or after them: on
    /// another, it does not compile.
    pub fn backend<Bk2: Backend>(self, backend: Bk2) -> RateLimitLayer<K, Bk2, D, M> {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend,
                deny: self.core.deny,
                settings: self.core.settings,
            },
            mode: PhantomData,
        }
    }

    /// Answer denied (non-gRPC) requests with `deny`'s response instead of
    /// an empty 429. `Retry-After` and the rate-limit headers are added to
    /// it, each unless the response already has it: a `Retry-After` you set
    /// is kept. The closure's argument type is inferred:
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, Response, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
    ///     .deny_with(|d| {
    ///         let mut res = Response::new(Body::from(format!("try again in {} s", d.reset_secs())));
    ///         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         res
    ///     });
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
    /// let denied = app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// assert_eq!(denied.headers()["retry-after"], "60");
    /// let body = axum::body::to_bytes(denied.into_body(), 1024).await.unwrap();
    /// assert_eq!(body, "try again in 60 s");
    /// # }
    /// ```
    pub fn deny_with<F, B>(self, deny: F) -> RateLimitLayer<K, Bk, F, M>
    where
        F: Fn(&Decision) -> Response<B>,
    {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend: self.core.backend,
                deny,
                settings: self.core.settings,
            },
            mode: PhantomData,
        }
    }

    /// Which rate-limit headers responses carry (default: the IETF fields).
    /// See the [example](HeaderStyle#example).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.core.settings.policies.set_style(style);
        self
    }

    /// Check every request against `quota` too, in the same backend call:
    /// `Quota` 5 per minute *and* (`also`) 100 per day. A request over any of
    /// its quotas is denied; every quota counts every request. Each quota
    /// other than the layer's own has its own counters, named
    /// `name:LIMIT/WINDOWms` in storage.
    ///
    /// Clients see it under the name a [`NamedQuota`] gives it, or
    /// `"<layer> <limit>/<window>"` (`"api 100/1d"`) for a plain [`Quota`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::Request, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("api", Quota::new(5, Duration::from_secs(60)).unwrap())
    ///     .also(Quota::new(100, Duration::from_secs(86_400)).unwrap());
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// let response = app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// assert_eq!(
    ///     response.headers()["ratelimit-policy"],
    ///     "\"api\";q=5;w=60, \"api 100/1d\";q=100;w=86400"
    /// );
    /// # }
    /// ```
    ///
    /// A fixed [`cost`](Self::cost) above `quota`'s limit is refused when
    /// the layer is built ([`check`](Self::check)).
    pub fn also(mut self, quota: impl Into<NamedQuota>) -> Self {
        self.core.settings.policies.add_also(quota.into());
        self
    }

    /// Use `quota` instead of the layer's for one route: axum's matched path
    /// (`/users/{id}`; add the layer with `route_layer`) or a gRPC method
    /// (`/auth.Auth/Login`). Quotas added with [`also`](Self::also) still
    /// apply. Routes with equal quotas share counters; key by
    /// [`RouteKey`](crate::key::RouteKey) too to keep them apart.
    ///
    /// Clients see it under the name a [`NamedQuota`] gives it, or
    /// `"<layer> <route>"` (`"api /auth.Auth/Login"`) for a plain [`Quota`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{Request, Response};
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_pinned_window::{NamedQuota, Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let minutes = |n, m: u64| Quota::new(n, Duration::from_secs(60 * m)).unwrap();
    /// let layer = RateLimitLayer::new("api", minutes(100, 1))
    ///     .route_quota("/auth.Auth/Login", NamedQuota::new("login", minutes(5, 15)))
    ///     .route_quota("/shop.Shop/Checkout", minutes(10, 1));
    /// let svc = layer.layer(service_fn(|_req: Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// }));
    /// let call = |method: &str| {
    ///     let request = Request::post(method).header("content-type", "application/grpc");
    ///     svc.clone().oneshot(request.body(String::new()).unwrap())
    /// };
    /// let login = call("/auth.Auth/Login").await.unwrap();
    /// assert_eq!(login.headers()["ratelimit"], "\"login\";r=4;t=900");
    /// let checkout = call("/shop.Shop/Checkout").await.unwrap();
    /// assert_eq!(checkout.headers()["ratelimit"], "\"api /shop.Shop/Checkout\";r=9;t=60");
    /// # }
    /// ```
    ///
    /// A fixed [`cost`](Self::cost) above `quota`'s limit is refused when
    /// the layer is built, as for [`also`](Self::also).
    pub fn route_quota(mut self, route: &str, quota: impl Into<NamedQuota>) -> Self {
        self.core.settings.policies.add_route(route, quota.into());
        self
    }

    /// Pick a request's quota with `choose` (a tier looked up from what your
    /// authentication attached, say); `None` falls back to the route's quota
    /// or the layer's. Quotas added with [`also`](Self::also) still apply.
    ///
    /// `choose` returns a [`NamedQuota`] or a plain [`Quota`]; clients see a
    /// plain one as `"<layer> <limit>/<window>"`. Build named tiers once,
    /// outside the closure:
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{Request, Response};
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_pinned_window::{NamedQuota, Quota, RateLimitLayer};
    ///
    /// #[derive(Clone)]
    /// struct Plan { pro: bool } // set by your authentication layer
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let minute = |n| Quota::new(n, Duration::from_secs(60)).unwrap();
    /// let pro = NamedQuota::new("pro", minute(1_000));
    /// let layer = RateLimitLayer::new("api", minute(100))
    ///     .quota_by(move |req| req.extensions().get::<Plan>()?.pro.then(|| pro.clone()));
    /// let svc = layer.layer(service_fn(|_req: Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// }));
    /// let mut request = Request::new(String::new());
    /// request.extensions_mut().insert(Plan { pro: true });
    /// let response = svc.oneshot(request).await.unwrap();
    /// assert_eq!(response.headers()["ratelimit"], "\"pro\";r=999;t=60");
    /// # }
    /// ```
    pub fn quota_by<F, Q>(mut self, choose: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<Q> + Send + Sync + 'static,
        Q: Into<NamedQuota>,
    {
        self.core
            .settings
            .policies
            .set_quota_by(Arc::new(move |head| choose(head).map(Into::into)));
        self
    }

    /// Let the requests `skip` picks bypass the limiter: they are not
    /// counted, get no rate-limit headers and no [`Decision`], and their key
    /// is never read. The closure's argument type is inferred. Each call adds
    /// a predicate; a request any of them picks is skipped.
    ///
    /// It runs on every request, before the key: keep it cheap. To skip
    /// clients by address, use [`allowlist`](Self::allowlist), which finds
    /// the client the way [`ClientIp`](crate::key::ClientIp) does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
    ///     .skip_if(|req| req.uri().path() == "/health");
    /// let app = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .route("/health", get(|| async { "ok" }))
    ///     .layer(layer);
    /// let get = |path| Request::get(path).body(Body::empty()).unwrap();
    /// for _ in 0..3 {
    ///     let health = app.clone().oneshot(get("/health")).await.unwrap();
    ///     assert_eq!(health.status(), StatusCode::OK);
    ///     assert!(health.headers().get("ratelimit").is_none(), "not counted, no headers");
    /// }
    /// assert_eq!(app.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    /// assert_eq!(app.oneshot(get("/")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    /// # }
    /// ```
    pub fn skip_if<F>(mut self, skip: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        let skip: SkipIf = match self.core.settings.skip.take() {
            None => Arc::new(skip),
            Some(earlier) => Arc::new(move |req: &RequestHead<'_>| earlier(req) || skip(req)),
        };
        self.core.settings.skip = Some(skip);
        self
    }

    /// Let the clients on `allowlist` bypass the limiter, as
    /// [`skip_if`](Self::skip_if) does: your own monitoring, an office
    /// network, partner servers.
    ///
    /// The list finds a request's client the way the
    /// [`ClientIp`](crate::key::ClientIp) it was made with does, through the
    /// proxies that `ClientIp` trusts and no others: a client cannot skip by
    /// writing an allowlisted address into `X-Forwarded-For`. The list is
    /// checked before the key, and independently of it: key by
    /// [`ClientIp`](crate::key::ClientIp) (give both the same one), by an
    /// API key, or by anything else. A request whose client cannot be found
    /// (no peer address, a malformed forwarded entry) is not skipped; it
    /// goes on to the key extractor, which answers it as it would any other.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::key::{Allowlist, ClientIp};
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client_ip = ClientIp::new().trust("10.0.0.0/8")?; // the load balancer
    /// let office = Allowlist::new(client_ip.clone()).allow("192.0.2.0/24")?;
    /// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60))?)
    ///     .key(client_ip)
    ///     .allowlist(office);
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// let via_balancer = |client: &str| {
    ///     let mut req = Request::get("/").header("x-forwarded-for", client).body(Body::empty()).unwrap();
    ///     req.extensions_mut().insert(std::net::SocketAddr::from(([10, 0, 0, 1], 443)));
    ///     req
    /// };
    /// for _ in 0..3 {
    ///     let office = app.clone().oneshot(via_balancer("192.0.2.7")).await?;
    ///     assert_eq!(office.status(), StatusCode::OK);
    /// }
    /// assert_eq!(app.clone().oneshot(via_balancer("203.0.113.9")).await?.status(), StatusCode::OK);
    /// assert_eq!(app.oneshot(via_balancer("203.0.113.9")).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(())
    /// # }
    /// ```
    pub fn allowlist(self, allowlist: Allowlist) -> Self {
        self.skip_if(move |req| allowlist.contains(req))
    }

    /// Count a request only if the service's answer says so: `counts`
    /// reads the answer's status and headers (a [`ResponseHead`]), and a
    /// request whose answer it rejects has its hit handed back
    /// ([`Backend::refund`]), in every quota it was counted in; so does a
    /// denied request. "Five failed
    /// logins per 15 minutes, successful ones free" is
    /// `.count_if(|res| res.status() == 401)`, or
    /// [`count_only`](Self::count_only) with [`CountOnly::AuthFailures`]. The
    /// closure's argument type is inferred; a later call replaces an earlier
    /// one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("login", Quota::new(2, Duration::from_secs(900)).unwrap())
    ///     .count_if(|res| res.status() == StatusCode::UNAUTHORIZED);
    /// let app = Router::new()
    ///     .route("/login", post(|body: String| async move {
    ///         if body == "hunter2" { StatusCode::OK } else { StatusCode::UNAUTHORIZED }
    ///     }))
    ///     .layer(layer);
    /// let login = |password: &str| {
    ///     let request = Request::post("/login").body(Body::from(password.to_owned())).unwrap();
    ///     let app = app.clone();
    ///     async move { app.oneshot(request).await.unwrap() }
    /// };
    /// for _ in 0..5 {
    ///     assert_eq!(login("hunter2").await.status(), StatusCode::OK, "successes are free");
    /// }
    /// assert_eq!(login("guess").await.status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(login("guess").await.status(), StatusCode::UNAUTHORIZED);
    /// let denied = login("hunter2").await; // two failures: even the right password waits
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(denied.headers()["retry-after"], "900");
    /// # }
    /// ```
    ///
    /// # What counts, and when
    ///
    /// - **A request is admitted or denied when it arrives**, by its hit,
    ///   before any answer is known. Requests still being served hold their
    ///   hits until their answers are in: with a limit of 5, five slow
    ///   requests in flight deny a sixth, even if all five are then refunded.
    ///   So the limit bounds the counted requests plus those in flight, and
    ///   never more than `limit` counted requests are admitted in a window,
    ///   however hits and refunds interleave.
    /// - **A denied request is refunded at once.** It was never served, so
    ///   it is not an answer that counts. Kept, it would outlive the
    ///   requests that caused it: with a limit of 5 failures, ten parallel
    ///   requests that all succeed would leave 5 denials counted after the 5
    ///   successes were refunded, and the client locked out for the window
    ///   without a single failure. A denial the Redis deny cache answered
    ///   was never counted and needs no refund, so a flood costs about one
    ///   refund per key and instance per round trip, not one per request.
    /// - **No answer, no refund.** A response future dropped after the
    ///   service was called but before it answered (the client went away,
    ///   a timeout layer above gave up) and an error from the service
    ///   (`S::Error`, which is not an answer) leave the hit counted. The
    ///   service may have done the work (checked the password) before it
    ///   was dropped, so a refund would let a client that hangs up early try
    ///   for free. A hit whose count never came back (the future dropped
    ///   while waiting for it, a backend timeout) leaves whatever the
    ///   backend counted, unrefunded.
    /// - **A refund is taken in the hit's own window only**
    ///   ([`Hit::deadline`](crate::backend::Hit::deadline)): once that window
    ///   has closed, or been reset and a new one opened, it does nothing; it
    ///   never creates a counter, never gives one a lifetime and never takes
    ///   a count below zero.
    /// - **Each hit is refunded at most once, and a failed refund is not
    ///   retried**: a backend that is down leaves the hit counted (logged at
    ///   most once every few seconds). So does a process that stops between
    ///   the hit and the refund.
    /// - **The client does not wait for the refund.** It is issued when the
    ///   answer is produced: the memory backend takes it at once; a backend
    ///   that has to go out (Redis) finishes it on a tokio task. Outside a
    ///   tokio runtime, the response waits for it instead.
    /// - **The answer is judged by its head.** A status that comes later
    ///   (a gRPC status in the trailers, after the messages; an error while
    ///   the body streams) is not seen.
    /// - The response's headers and [`Decision`] show the count without the
    ///   refunded hit ([`Decision::refunded`]); the decision given to
    ///   [`on_decision`](Self::on_decision), made before the answer, counts
    ///   it. A skipped request, or one passed uncounted (fail-open,
    ///   [`OnMissingKey::Allow`]), has no hit to refund.
    /// - Without `count_if`, nothing of this runs: no hit is kept past the
    ///   verdict, nothing is allocated, nothing is refunded.
    pub fn count_if<F>(mut self, counts: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.core.settings.count_if = Some(Arc::new(counts));
        self
    }

    /// Count only the answers `which` names: [`count_if`](Self::count_if)
    /// with one of the usual choices (failures, failed authentication,
    /// server errors, successes), which read the HTTP status and the head's
    /// gRPC status.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{CountOnly, Quota, RateLimitLayer};
    ///
    /// let login = RateLimitLayer::new("login", Quota::new(5, Duration::from_secs(900)).unwrap())
    ///     .count_only(CountOnly::AuthFailures);
    /// ```
    pub fn count_only(self, which: CountOnly) -> Self {
        self.count_if(move |res| which.counts(res))
    }

    /// What requests get when the backend is down, slow or full (default:
    /// [`FailurePolicy::FailClosed`]). See the
    /// [example](FailurePolicy#example).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        let settings = &mut self.core.settings;
        settings.failure = policy;
        // The insurance limiter's counters, made once: a layer and its
        // clones share them.
        match (policy, &mut settings.insurance) {
            (FailurePolicy::Insurance(share), Some(insurance)) => insurance.set_share(share),
            (FailurePolicy::Insurance(share), None) => {
                settings.insurance = Some(Insurance::new(share));
            }
            _ => settings.insurance = None,
        }
        self
    }

    /// What requests get when no key can be extracted (default:
    /// [`OnMissingKey::Reject`]). See the [example](OnMissingKey#example).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.core.settings.missing_key = policy;
        self
    }

    /// How long one backend call may take (default [`DEFAULT_TIMEOUT`]);
    /// past it the request is handled under the [`FailurePolicy`]. The timer
    /// only starts if the backend does not answer at once, so the in-memory
    /// backend never arms it. A [`Window`] is never zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{DEFAULT_TIMEOUT, Quota, RateLimitLayer, Window};
    ///
    /// assert_eq!(DEFAULT_TIMEOUT, Duration::from_millis(100));
    /// // A store across the world: give it longer.
    /// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .timeout(Window::new(Duration::from_millis(250)).unwrap());
    /// ```
    pub fn timeout(mut self, timeout: Window) -> Self {
        self.core.settings.timeout = timeout.as_duration();
        self
    }

    /// Shadow (dry-run) mode: count and set headers, but never deny. Requests
    /// over the limit pass with [`Outcome::Shadowed`](crate::Outcome), so a
    /// new limit can be watched before it is enforced. See the
    /// [example](crate::Outcome#example).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.core.settings.shadow = shadow;
        self
    }

    /// Where a passed request's [`Decision`] goes: the request's
    /// extensions, for the handler ([`DecisionIn::Request`], the default),
    /// the response's ([`DecisionIn::Response`]), or only where asked for
    /// ([`DecisionIn::Asked`]). A denial always carries it in the response's
    /// extensions, and a request carrying
    /// [`WantDecision`](crate::WantDecision) gets it in its response's. See
    /// the [example](DecisionIn#example).
    pub fn decision_in(mut self, place: DecisionIn) -> Self {
        self.core.settings.decision_in = place;
        self
    }

    /// Run `observer` on every decision (allowed, denied, shadowed), for
    /// metrics. It runs on the request path: keep it cheap. See the
    /// [example](Decision#example).
    pub fn on_decision(mut self, observer: impl Fn(&Decision) + Send + Sync + 'static) -> Self {
        self.core.settings.observer = Some(Arc::new(observer));
        self
    }

    /// The layer's name. See the [example](Self::try_new).
    pub fn name(&self) -> &str {
        &self.core.settings.name
    }

    /// The layer's quota. See the [example](Self::try_new).
    pub fn quota(&self) -> Quota {
        self.core.settings.policies.default_quota()
    }

    /// The layer's backend, for [`peek`](Backend::peek) and
    /// [`reset`](Backend::reset).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::Request, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer, backend::Backend, key::Key};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("api", Quota::new(5, Duration::from_secs(60)).unwrap());
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer.clone());
    /// app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// // The layer's own quota counts under its name; every request shares
    /// // the global key.
    /// let hit = layer.backend_ref().peek("api", &Key::new("*")).await.unwrap();
    /// assert_eq!(hit.map(|hit| hit.count), Some(1));
    /// # }
    /// ```
    pub fn backend_ref(&self) -> &Bk {
        &self.core.backend
    }
}

/// Costs, charges, lockouts and resets on success (the guide:
/// `docs/costs.md`). Each moves the layer to a mode that spends
/// ([`Spends`](crate::Spends), or [`Charged`]), which builds only on a
/// backend that implements [`Spending`](crate::backend::Spending), whatever
/// the order of the calls.
impl<K, Bk, D, M: Mode> RateLimitLayer<K, Bk, D, M> {
    /// The spend plan, once the layer spends.
    fn spending<M2>(mut self, set: impl FnOnce(&mut Settings)) -> RateLimitLayer<K, Bk, D, M2> {
        self.core.settings.spend.get_or_insert_with(SpendPlan::new);
        set(&mut self.core.settings);
        RateLimitLayer {
            key: self.key,
            core: self.core,
            mode: PhantomData,
        }
    }

    /// Each request costs `cost` in each of its quotas, admitted only when
    /// the whole cost fits; a denied request spends nothing, and a cost of
    /// 0 checks without counting.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // An export costs 3 of 10 a minute.
    /// let layer = RateLimitLayer::new("export", Quota::new(10, Duration::from_secs(60)).unwrap())
    ///     .cost(3);
    /// let app = Router::new().route("/export", post(|| async { "done" })).layer(layer);
    /// let export = || app.clone().oneshot(Request::post("/export").body(Body::empty()).unwrap());
    /// for left in [7, 4, 1] {
    ///     let response = export().await.unwrap();
    ///     assert_eq!(response.headers()["ratelimit"], format!("\"export\";r={left};t=60").as_str());
    /// }
    /// // 1 left: a cost of 3 does not fit, and spends nothing.
    /// assert_eq!(export().await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    /// # }
    /// ```
    ///
    /// A cost above one of the layer's limits could never be admitted: the
    /// layer refuses it when it is built ([`check`](Self::check)).
    pub fn cost(self, cost: u64) -> RateLimitLayer<K, Bk, D, M::Spending> {
        self.spending(|s| s.spend.as_mut().expect("a plan").cost = Some(Cost::Fixed(cost)))
    }

    /// Each request costs what `cost` reads from its head, as
    /// [`cost`](Self::cost) does. A cost above the limit of the request's
    /// quota is denied without asking the backend, with
    /// [`Decision::never_fits`].
    pub fn cost_fn<F>(self, cost: F) -> RateLimitLayer<K, Bk, D, M::Spending>
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        let cost = Cost::By(Arc::new(cost));
        self.spending(|s| s.spend.as_mut().expect("a plan").cost = Some(cost))
    }

    /// A response's cost, read from its [`ResponseEnd`] when its body ends
    /// (a token count in a trailer, say), added to the window the request
    /// was counted in. The request goes in as a check that opens the
    /// window; the answers' bodies become [`Metered`](crate::Metered).
    pub fn charge<F>(self, charge: F) -> RateLimitLayer<K, Bk, D, Charged>
    where
        F: Fn(&ResponseEnd<'_>) -> u64 + Send + Sync + 'static,
    {
        self.spending(|s| {
            s.spend.as_mut().expect("a plan").open = true;
            s.charge = Some(Arc::new(charge));
        })
    }

    /// Once a request does not fit, lock its key out for `block`, counted
    /// from that first denial and never extended; `Retry-After` gives the
    /// lockout's end.
    pub fn block_for(self, block: Window) -> RateLimitLayer<K, Bk, D, M::Spending> {
        self.spending(|s| s.spend.as_mut().expect("a plan").block = Some(block))
    }

    /// A passed request whose answer `reset` picks (a successful login)
    /// clears its key's counters in the request's window, never creating
    /// one; its decision is [`cleared`](Decision::cleared).
    pub fn reset_if<F>(self, reset: F) -> RateLimitLayer<K, Bk, D, M::Spending>
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.spending(|s| s.reset_if = Some(Arc::new(reset)))
    }
}

impl<K, Bk, D, M> RateLimitLayer<K, Bk, D, M> {
    /// Whether the layer can work: the one place where settings that
    /// depend on each other are checked, whatever the order they were set
    /// in. [`Layer::layer`] panics with this error; call it at start-up to
    /// handle the error yourself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("export", Quota::new(10, Duration::from_secs(60)).unwrap());
    /// assert_eq!(
    ///     layer.clone().cost(11).check(),
    ///     Err(ConfigError::CostAboveLimit { cost: 11, limit: 10 })
    /// );
    /// assert_eq!(layer.cost(10).check(), Ok(()));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::CostAboveLimit`] when a fixed [`cost`](Self::cost) is
    /// above the limit of one of the layer's quotas (its own, a route's, or
    /// one added with [`also`](Self::also)): no request could be admitted.
    pub fn check(&self) -> Result<(), ConfigError> {
        let s = &self.core.settings;
        if let Some(SpendPlan {
            cost: Some(Cost::Fixed(cost)),
            ..
        }) = s.spend
        {
            let limit = s.policies.smallest_limit();
            if cost > limit {
                return Err(ConfigError::CostAboveLimit { cost, limit });
            }
        }
        Ok(())
    }
}

impl<K: Clone, Bk: Clone, D: Clone, M> Clone for RateLimitLayer<K, Bk, D, M> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            core: self.core.clone(),
            mode: PhantomData,
        }
    }
}

impl<K: fmt::Debug, Bk: fmt::Debug, D, M> fmt::Debug for RateLimitLayer<K, Bk, D, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.key)
            .field("core", &self.core)
            .finish()
    }
}

/// # Panics
/// When the layer cannot work: see [`check`](RateLimitLayer::check).
impl<S, K: Clone, Bk: Clone, D: Clone, M> Layer<S> for RateLimitLayer<K, Bk, D, M> {
    type Service = RateLimit<S, K, Bk, D, M>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        if let Err(err) = self.check() {
            panic!("{err}");
        }
        RateLimit::new(inner, self.key.clone(), Arc::new(self.core.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::MAX_NAME_LEN;

    #[test]
    fn names_are_checked() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        for good in ["api", "login:v2", "a.b-c_d", &"x".repeat(MAX_NAME_LEN)] {
            assert!(RateLimitLayer::try_new(good, q).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "with space",
            "quote\"",
            "é",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert_eq!(
                RateLimitLayer::try_new(bad, q).unwrap_err(),
                ConfigError::InvalidName(bad.to_string()),
                "{bad:?}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "invalid limiter name")]
    fn new_panics_on_a_bad_literal_name() {
        let _ = RateLimitLayer::new("no spaces", Quota::new(1, Duration::from_secs(1)).unwrap());
    }

    #[test]
    fn a_timeout_is_a_window_never_zero() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert_eq!(
            Window::new(Duration::ZERO).unwrap_err(),
            ConfigError::NonPositiveWindow
        );
        let layer =
            RateLimitLayer::new("t", q).timeout(Window::new(Duration::from_millis(1)).unwrap());
        assert_eq!(
            layer.core.settings.timeout,
            Duration::from_millis(1),
            "kept as given"
        );
    }

    #[derive(Clone, Debug)]
    struct Old(MemoryBackend);

    /// A backend that only counts hits: it implements `Backend`, not
    /// `Spending`.
    impl Backend for Old {
        type Future = <MemoryBackend as Backend>::Future;
        type Refund = <MemoryBackend as Backend>::Refund;

        fn hit_all(&self, key: &Key, counters: &[crate::backend::Counter<'_>]) -> Self::Future {
            self.0.hit_all(key, counters)
        }

        fn refund(&self, namespace: &str, key: &Key, hit: &crate::backend::Hit) -> Self::Refund {
            self.0.refund(namespace, key, hit)
        }

        async fn peek(
            &self,
            namespace: &str,
            key: &Key,
        ) -> Result<Option<crate::backend::Hit>, crate::backend::BackendError> {
            self.0.peek(namespace, key).await
        }

        async fn reset(
            &self,
            namespace: &str,
            key: &Key,
        ) -> Result<bool, crate::backend::BackendError> {
            self.0.reset(namespace, key).await
        }
    }

    #[tokio::test]
    async fn a_backend_that_cannot_spend_builds_plain_layers_in_any_order() {
        use tower::{ServiceExt, service_fn};
        let q = Quota::new(1, Duration::from_secs(60)).unwrap();
        let ok = service_fn(|_request: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        });
        // A plain layer on it, its backend set first or last; a layer that
        // spends does not compile on it (the doctest on `Counts`).
        let first = RateLimitLayer::new("t", q)
            .backend(Old(MemoryBackend::new()))
            .count_if(|_| true);
        let last = RateLimitLayer::new("t", q)
            .count_if(|_| true)
            .backend(Old(MemoryBackend::new()));
        for layer in [first, last] {
            let service = layer.layer(ok);
            let statuses = [
                service
                    .clone()
                    .oneshot(http::Request::new(String::new()))
                    .await
                    .unwrap()
                    .status(),
                service
                    .oneshot(http::Request::new(String::new()))
                    .await
                    .unwrap()
                    .status(),
            ];
            assert_eq!(statuses.map(|s| s.as_u16()), [200, 429]);
        }
        // A layer that spends takes a backend that spends before or after.
        let before = RateLimitLayer::new("t", q)
            .backend(MemoryBackend::new())
            .cost(1);
        let after = RateLimitLayer::new("t", q)
            .cost(1)
            .backend(MemoryBackend::new());
        assert_eq!(before.check(), Ok(()));
        assert_eq!(after.check(), Ok(()));
    }

    #[test]
    fn a_cost_a_quota_cannot_fit_is_refused_in_any_order() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let small = Quota::new(3, Duration::from_secs(60)).unwrap();
        let layer = || RateLimitLayer::new("t", q);
        let refused = Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 });
        assert_eq!(layer().cost(4).also(small).check(), refused, "also after");
        assert_eq!(layer().also(small).cost(4).check(), refused, "also before");
        assert_eq!(
            layer().cost(4).route_quota("/a", small).check(),
            refused,
            "route after"
        );
        assert_eq!(
            layer().route_quota("/a", small).cost(4).check(),
            refused,
            "route before"
        );
        // Building it panics with the same error.
        let service = || {
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(Response::new(()))
            })
        };
        let built = std::panic::catch_unwind(|| layer().cost(4).also(small).layer(service()))
            .map(drop)
            .expect_err("a layer that cannot work does not build");
        let message = built.downcast_ref::<String>().expect("a message");
        assert!(
            message.contains("a request cost of 4 is above the limit of 3"),
            "{message}"
        );
        // Quotas the cost fits, before or after it.
        let big = Quota::new(4, Duration::from_secs(60)).unwrap();
        assert_eq!(
            layer().cost(4).also(big).route_quota("/b", big).check(),
            Ok(())
        );
        assert_eq!(layer().also(big).cost(4).check(), Ok(()));
    }

    #[test]
    fn a_cost_above_a_limit_and_a_bad_lockout_are_config_errors() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let small = Quota::new(3, Duration::from_secs(60)).unwrap();
        let layer = || RateLimitLayer::new("t", q);
        assert_eq!(
            layer().cost(11).check(),
            Err(ConfigError::CostAboveLimit {
                cost: 11,
                limit: 10
            })
        );
        assert_eq!(
            layer().also(small).cost(4).check(),
            Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
        );
        assert_eq!(
            layer().route_quota("/a", small).cost(4).check(),
            Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
        );
        // A lockout's length is a window: never zero, never past the
        // longest window, milliseconds rounded up.
        assert_eq!(
            Window::new(Duration::ZERO).unwrap_err(),
            ConfigError::NonPositiveWindow
        );
        assert_eq!(
            Window::new(Window::MAX.as_duration() + Duration::from_millis(1)).unwrap_err(),
            ConfigError::WindowTooLong
        );
        let blocked = layer().block_for(Window::new(Duration::from_nanos(1_000_001)).unwrap());
        let plan = blocked.core.settings.spend.unwrap();
        assert_eq!(plan.block.unwrap().as_millis(), 2, "rounded up");
    }

    #[test]
    #[should_panic(expected = "a request cost of 11 is above the limit of 10")]
    fn a_literal_cost_above_the_limit_panics_when_built() {
        let layer =
            RateLimitLayer::new("t", Quota::new(10, Duration::from_secs(1)).unwrap()).cost(11);
        let _ = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        }));
    }
}
