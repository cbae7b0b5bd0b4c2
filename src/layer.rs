//! [`RateLimitLayer`]: the configuration, and the middleware's constructor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower_layer::Layer;

use crate::backend::{Backend, MemoryBackend};
use crate::charge::{Charged, NoCharge, ResponseEnd};
use crate::cost::{Cost, SpendPlan};
use crate::count::{CountOnly, ResponseHead};
use crate::decision::{Decision, DecisionIn};
use crate::error::ConfigError;
use crate::judge::{Core, FailurePolicy, OnMissingKey, SkipIf};
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
/// `C` is [`NoCharge`] unless the layer has a [`charge`](Self::charge).
#[must_use]
pub struct RateLimitLayer<K = GlobalKey, Bk = MemoryBackend, D = DefaultDeny, C = NoCharge> {
    key: K,
    core: Core<Bk, D>,
    charge: PhantomData<fn() -> C>,
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
            charge: PhantomData,
        })
    }
}

impl<K, Bk, D, C> RateLimitLayer<K, Bk, D, C> {
    /// Charge each request to the key `key` extracts (see [`crate::key`]):
    /// a built-in extractor, a pair of them, or your own [`KeyExtractor`].
    /// For a closure, use [`key_fn`](Self::key_fn), which infers its
    /// argument's type.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<K2, Bk, D, C> {
        RateLimitLayer {
            key,
            core: self.core,
            charge: PhantomData,
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
    pub fn key_fn<F>(self, key: F) -> RateLimitLayer<F, Bk, D, C>
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
    /// # Panics
    /// When the layer spends (a [cost](Self::cost), a [charge](Self::charge),
    /// a [lockout](Self::block_for) or a [reset on success](Self::reset_if))
    /// and `backend` does not
    /// [support it](crate::backend::Backend::supports_spend). Use
    /// [`try_backend`](Self::try_backend) to get the error instead.
    #[track_caller]
    pub fn backend<Bk2: Backend>(self, backend: Bk2) -> RateLimitLayer<K, Bk2, D, C> {
        match self.try_backend(backend) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`backend`](Self::backend), with the error instead of a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer, backend::MemoryBackend};
    ///
    /// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .cost(2)
    ///     .try_backend(MemoryBackend::new())
    ///     .unwrap(); // the memory backend spends
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::SpendUnsupported`] when the layer spends and `backend`
    /// does not support it.
    pub fn try_backend<Bk2: Backend>(
        self,
        backend: Bk2,
    ) -> Result<RateLimitLayer<K, Bk2, D, C>, ConfigError> {
        if self.core.settings.spend.is_some() && !backend.supports_spend() {
            return Err(ConfigError::SpendUnsupported);
        }
        Ok(RateLimitLayer {
            key: self.key,
            core: Core {
                backend,
                deny: self.core.deny,
                settings: self.core.settings,
            },
            charge: PhantomData,
        })
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
    pub fn deny_with<F, B>(self, deny: F) -> RateLimitLayer<K, Bk, F, C>
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
            charge: PhantomData,
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
    /// # Panics
    /// When a fixed [`cost`](Self::cost) set before it is above `quota`'s
    /// limit: every request would be denied. Set the quotas first, and the
    /// cost after them with [`try_cost`](Self::try_cost) when it is read at
    /// run time.
    #[track_caller]
    pub fn also(mut self, quota: impl Into<NamedQuota>) -> Self {
        let quota = quota.into();
        self.refuse_a_cost_above(quota.quota().limit());
        self.core.settings.policies.add_also(quota);
        self
    }

    /// Panics when the layer's fixed cost is above `limit`, a quota's being
    /// added: no request could ever fit it.
    #[track_caller]
    fn refuse_a_cost_above(&self, limit: u64) {
        let fixed = self
            .core
            .settings
            .spend
            .as_ref()
            .and_then(|plan| match plan.cost {
                Some(Cost::Fixed(cost)) => Some(cost),
                _ => None,
            });
        if let Some(cost) = fixed
            && cost > limit
        {
            panic!(
                "{} (the cost was set before this quota: set the quotas first)",
                ConfigError::CostAboveLimit { cost, limit }
            );
        }
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
    /// # Panics
    /// When a fixed [`cost`](Self::cost) set before it is above `quota`'s
    /// limit, as [`also`](Self::also) does.
    #[track_caller]
    pub fn route_quota(mut self, route: &str, quota: impl Into<NamedQuota>) -> Self {
        let quota = quota.into();
        self.refuse_a_cost_above(quota.quota().limit());
        self.core.settings.policies.add_route(route, quota);
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
        match policy {
            FailurePolicy::Insurance(_) => {
                settings.insurance.get_or_insert_with(MemoryBackend::new);
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
    /// backend never arms it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{DEFAULT_TIMEOUT, Quota, RateLimitLayer};
    ///
    /// assert_eq!(DEFAULT_TIMEOUT, Duration::from_millis(100));
    /// // A store across the world: give it longer.
    /// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .timeout(Duration::from_millis(250));
    /// ```
    ///
    /// # Panics
    /// When `timeout` is zero (every call would time out), like
    /// [`http::HeaderValue::from_static`] on a bad literal. Use
    /// [`try_timeout`](Self::try_timeout) for a value read at run time.
    #[track_caller]
    pub fn timeout(self, timeout: Duration) -> Self {
        match self.try_timeout(timeout) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`timeout`](Self::timeout), for a value read at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60)).unwrap());
    /// assert!(matches!(
    ///     layer.try_timeout(Duration::ZERO),
    ///     Err(ConfigError::ZeroTimeout)
    /// ));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`] for zero.
    pub fn try_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        self.core.settings.timeout = timeout;
        Ok(self)
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

/// Costs, charges, lockouts and resets on success: see the guide,
/// `docs/costs.md`. A layer with any of them counts with
/// [`Backend::spend_all`] (one atomic step per request) and amends with
/// [`Backend::amend`]; one with none counts with `hit_all`, as it always
/// has, and pays nothing for them. Each builds only on a backend that
/// [supports spending](Backend::supports_spend): every backend of this
/// crate does; a backend written before this answers `false`, and the layer
/// refuses it (see the [one rule](crate::ConfigError)).
impl<K, Bk: Backend, D, C> RateLimitLayer<K, Bk, D, C> {
    /// The layer's spend plan, made when first asked for: `Err` when the
    /// backend does not support spending.
    fn plan(&mut self) -> Result<&mut SpendPlan, ConfigError> {
        if !self.core.backend.supports_spend() {
            return Err(ConfigError::SpendUnsupported);
        }
        Ok(self.core.settings.spend.get_or_insert_with(SpendPlan::new))
    }

    /// Every request costs `cost` in each of its quotas, instead of 1: a
    /// request is admitted only if its whole cost fits in what is left of
    /// every quota, and then counts `cost` in each; a denied request spends
    /// nothing. A cost of 0 checks without counting: admitted while the
    /// counter is under its limit.
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
    /// The cost is checked against the layer's quota, its routes' and those
    /// added with [`also`](Self::also), whichever comes first: `also` or
    /// `route_quota` after `cost` panics on a quota the cost exceeds. A
    /// quota picked by [`quota_by`](Self::quota_by) is known only per
    /// request: one the cost exceeds denies that request, with
    /// [`Decision::never_fits`].
    ///
    /// # Panics
    /// When `cost` is above one of those limits (it could never be
    /// admitted), or the backend does not support spending. Use
    /// [`try_cost`](Self::try_cost) for a cost read at run time.
    #[track_caller]
    pub fn cost(self, cost: u64) -> Self {
        match self.try_cost(cost) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`cost`](Self::cost), for a cost read at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("export", Quota::new(10, Duration::from_secs(60)).unwrap());
    /// assert_eq!(
    ///     layer.clone().try_cost(11).unwrap_err(),
    ///     ConfigError::CostAboveLimit { cost: 11, limit: 10 }
    /// );
    /// assert!(layer.try_cost(10).is_ok());
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::CostAboveLimit`] when `cost` is above the limit of a
    /// quota the layer has; [`ConfigError::SpendUnsupported`] when the
    /// backend does not support spending.
    pub fn try_cost(mut self, cost: u64) -> Result<Self, ConfigError> {
        let limit = self.core.settings.policies.smallest_limit();
        if cost > limit {
            return Err(ConfigError::CostAboveLimit { cost, limit });
        }
        self.plan()?.cost = Some(Cost::Fixed(cost));
        Ok(self)
    }

    /// Each request costs what `cost` reads from its head (a header, the
    /// route, an extension your authentication set), in each of its quotas:
    /// [`cost`](Self::cost), per request. A cost above a quota's limit can
    /// never be admitted: the request is denied without counting, with
    /// [`Decision::never_fits`] and no `Retry-After` (see its example). The
    /// closure's argument type is inferred; it runs on every request, before
    /// the backend is called: keep it cheap.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // A batch of N items costs N, of 100 a minute.
    /// let layer = RateLimitLayer::new("items", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .cost_fn(|req| {
    ///         let items = req.headers().get("x-batch-size").and_then(|v| v.to_str().ok()?.parse().ok());
    ///         items.unwrap_or(1)
    ///     });
    /// let app = Router::new().route("/batch", post(|| async { "ok" })).layer(layer);
    /// let batch = |n: u64| {
    ///     let request = Request::post("/batch").header("x-batch-size", n).body(Body::empty()).unwrap();
    ///     app.clone().oneshot(request)
    /// };
    /// assert_eq!(batch(60).await.unwrap().status(), StatusCode::OK);
    /// assert_eq!(batch(60).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(batch(40).await.unwrap().status(), StatusCode::OK, "40 still fit");
    /// # }
    /// ```
    ///
    /// # Panics
    /// When the backend does not support spending; use
    /// [`try_cost_fn`](Self::try_cost_fn) to get the error instead.
    #[track_caller]
    pub fn cost_fn<F>(self, cost: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        match self.try_cost_fn(cost) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`cost_fn`](Self::cost_fn), with the error instead of a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("items", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .try_cost_fn(|req| if req.method() == "POST" { 5 } else { 1 })
    ///     .unwrap();
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::SpendUnsupported`] when the backend does not support
    /// spending.
    pub fn try_cost_fn<F>(mut self, cost: F) -> Result<Self, ConfigError>
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        self.plan()?.cost = Some(Cost::By(Arc::new(cost)));
        Ok(self)
    }

    /// Charge each answer what `charge` reads from it once the service has
    /// answered: its status and headers, and, for a streamed body, its
    /// trailers and last data frame, read when the body ends (see
    /// [`ResponseEnd`]). A budget can then be counted in what the answers
    /// cost (LLM tokens, rows, bytes) rather than in requests.
    ///
    /// - A request is admitted while its counter is under its limit, since
    ///   its cost is not known yet: its own cost is 0 (a
    ///   [`cost`](Self::cost) set too is spent on the way in, as usual).
    /// - The charge is added to every counter the request was counted in,
    ///   in one atomic step each ([`Backend::amend`]), and may take a count
    ///   past its limit: later requests are then denied until the window
    ///   closes.
    /// - Like a refund, a charge never creates a counter, never gives one a
    ///   lifetime, and only touches the window its request was counted in:
    ///   a charge that lands after that window closed (or was reset) does
    ///   nothing.
    /// - A body dropped before its end (the client went away mid-stream) is
    ///   charged when it is dropped, with what was sent by then
    ///   ([`ResponseEnd::complete`] is `false`): the service did the work.
    /// - The answer's rate-limit headers and [`Decision`] show the count
    ///   before the charge.
    /// - An answer [`count_if`](Self::count_if) does not count, or that
    ///   [`reset_if`](Self::reset_if) picks, is not charged.
    ///
    /// The answers' bodies become [`Metered`](crate::Metered) around the
    /// service's own, which axum and tonic take as they take the body
    /// inside. A layer without a charge keeps the service's body type, and
    /// pays nothing for this.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tokens = RateLimitLayer::new("tokens", Quota::new(1000, Duration::from_secs(60)).unwrap())
    ///     .charge(|end| {
    ///         let used = end.headers().get("x-usage-tokens").and_then(|v| v.to_str().ok()?.parse().ok());
    ///         used.unwrap_or(0)
    ///     });
    /// let app = Router::new()
    ///     .route("/complete", post(|| async { ([("x-usage-tokens", "600")], "...") }))
    ///     .layer(tokens);
    /// let complete = || async {
    ///     let response = app.clone().oneshot(Request::post("/complete").body(Body::empty()).unwrap());
    ///     let response = response.await.unwrap();
    ///     let status = response.status();
    ///     // The charge is taken when the body ends.
    ///     axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1024).await.unwrap();
    ///     status
    /// };
    /// assert_eq!(complete().await, StatusCode::OK); // 600 of 1000
    /// assert_eq!(complete().await, StatusCode::OK); // under the limit: admitted, 1200
    /// assert_eq!(complete().await, StatusCode::TOO_MANY_REQUESTS);
    /// # }
    /// ```
    ///
    /// # Panics
    /// When the backend does not support spending; use
    /// [`try_charge`](Self::try_charge) to get the error instead.
    #[track_caller]
    pub fn charge<F>(self, charge: F) -> RateLimitLayer<K, Bk, D, Charged>
    where
        F: Fn(&ResponseEnd<'_>) -> u64 + Send + Sync + 'static,
    {
        match self.try_charge(charge) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`charge`](Self::charge), with the error instead of a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// let bytes = RateLimitLayer::new("egress", Quota::new(1 << 30, Duration::from_secs(86_400)).unwrap())
    ///     .try_charge(|end| end.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0))
    ///     .unwrap();
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::SpendUnsupported`] when the backend does not support
    /// spending.
    pub fn try_charge<F>(
        mut self,
        charge: F,
    ) -> Result<RateLimitLayer<K, Bk, D, Charged>, ConfigError>
    where
        F: Fn(&ResponseEnd<'_>) -> u64 + Send + Sync + 'static,
    {
        self.plan()?.open = true;
        self.core.settings.charge = Some(Arc::new(charge));
        Ok(RateLimitLayer {
            key: self.key,
            core: self.core,
            charge: PhantomData,
        })
    }

    /// Lock a key out for `duration` once a request does not fit in its
    /// count: that request and every one after it are denied until the
    /// lockout ends, counted from that first denial. The lockout is pinned
    /// like the window: more attempts never extend it. `Retry-After` and the
    /// rate-limit headers give the lockout's end. Each quota of the request
    /// locks on its own; [`reset`](Backend::reset) lifts a key's counter and
    /// lockout. Sub-millisecond parts round up, as a [`Window`]'s do.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // 3 attempts a minute; past them, locked out for an hour.
    /// let layer = RateLimitLayer::new("otp", Quota::new(3, Duration::from_secs(60)).unwrap())
    ///     .block_for(Duration::from_secs(3600));
    /// let app = Router::new().route("/otp", post(|| async { "checked" })).layer(layer);
    /// let attempt = || app.clone().oneshot(Request::post("/otp").body(Body::empty()).unwrap());
    /// for _ in 0..3 {
    ///     assert_eq!(attempt().await.unwrap().status(), StatusCode::OK);
    /// }
    /// let locked = attempt().await.unwrap();
    /// assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(locked.headers()["retry-after"], "3600");
    /// # }
    /// ```
    ///
    /// # Panics
    /// When `duration` is zero or longer than [`Window::MAX`], or the
    /// backend does not support spending. Use
    /// [`try_block_for`](Self::try_block_for) for a value read at run time.
    #[track_caller]
    pub fn block_for(self, duration: Duration) -> Self {
        match self.try_block_for(duration) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`block_for`](Self::block_for), for a value read at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("otp", Quota::new(3, Duration::from_secs(60)).unwrap());
    /// assert_eq!(
    ///     layer.clone().try_block_for(Duration::ZERO).unwrap_err(),
    ///     ConfigError::ZeroBlock
    /// );
    /// assert!(layer.try_block_for(Duration::from_micros(1)).is_ok(), "rounds up to 1 ms");
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::ZeroBlock`] for zero, [`ConfigError::BlockTooLong`]
    /// past [`Window::MAX`], [`ConfigError::SpendUnsupported`] when the
    /// backend does not support spending.
    pub fn try_block_for(mut self, duration: Duration) -> Result<Self, ConfigError> {
        let block = Window::new(duration).map_err(|err| match err {
            ConfigError::NonPositiveWindow => ConfigError::ZeroBlock,
            _ => ConfigError::BlockTooLong,
        })?;
        self.plan()?.block = Some(block);
        Ok(self)
    }

    /// Clear the key's counter in each of the request's quotas when the
    /// service's answer is one `reset` picks: "5 failures in a row", not "5
    /// failures per window". The clear ([`Backend::amend`] with
    /// [`Amend::Clear`](crate::backend::Amend::Clear)) applies only to the
    /// window the request was counted in and never creates a counter; the
    /// answer's [`Decision`] is [`cleared`](Decision::cleared). A request
    /// that was denied is never served, so never resets anything. The
    /// closure's argument type is inferred.
    ///
    /// **The trade-off:** whoever knows one valid password can clear the
    /// counter it shares with others. Counted per client IP, one account's
    /// owner (or an attacker holding one stolen password) resets the
    /// counter between guesses at every other account from that address.
    /// Count per username *and* IP, so that a success clears only that
    /// pair's run:
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::key::{HeaderKey, Key, KeyExtractor, KeyError, PeerIp};
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let user = HeaderKey::new(http::HeaderName::from_static("x-username"));
    /// let layer = RateLimitLayer::new("login", Quota::new(3, Duration::from_secs(900)).unwrap())
    ///     .key((user, PeerIp::new())) // the pair: username and client IP
    ///     .reset_if(|res| res.status() == StatusCode::OK);
    /// let app = Router::new()
    ///     .route("/login", post(|body: String| async move {
    ///         if body == "hunter2" { StatusCode::OK } else { StatusCode::UNAUTHORIZED }
    ///     }))
    ///     .layer(layer);
    /// let login = |user: &str, password: &str| {
    ///     let mut request = Request::post("/login")
    ///         .header("x-username", user)
    ///         .body(Body::from(password.to_owned()))
    ///         .unwrap();
    ///     request.extensions_mut().insert(axum::extract::ConnectInfo(
    ///         std::net::SocketAddr::from(([192, 0, 2, 7], 4711)),
    ///     ));
    ///     app.clone().oneshot(request)
    /// };
    /// for _ in 0..2 {
    ///     assert_eq!(login("alice", "guess").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    /// }
    /// // Alice's success clears her run of failures, not anyone else's.
    /// assert_eq!(login("alice", "hunter2").await.unwrap().status(), StatusCode::OK);
    /// for _ in 0..3 {
    ///     assert_eq!(login("bob", "guess").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    /// }
    /// assert_eq!(login("bob", "guess").await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(login("alice", "guess").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    /// # }
    /// ```
    ///
    /// # Panics
    /// When the backend does not support spending; use
    /// [`try_reset_if`](Self::try_reset_if) to get the error instead.
    #[track_caller]
    pub fn reset_if<F>(self, reset: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        match self.try_reset_if(reset) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`reset_if`](Self::reset_if), with the error instead of a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new("login", Quota::new(5, Duration::from_secs(900)).unwrap())
    ///     .try_reset_if(|res| res.status().is_success())
    ///     .unwrap();
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::SpendUnsupported`] when the backend does not support
    /// spending.
    pub fn try_reset_if<F>(mut self, reset: F) -> Result<Self, ConfigError>
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.plan()?;
        self.core.settings.reset_if = Some(Arc::new(reset));
        Ok(self)
    }
}

impl<K: Clone, Bk: Clone, D: Clone, C> Clone for RateLimitLayer<K, Bk, D, C> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            core: self.core.clone(),
            charge: PhantomData,
        }
    }
}

impl<K: fmt::Debug, Bk: fmt::Debug, D, C> fmt::Debug for RateLimitLayer<K, Bk, D, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.key)
            .field("core", &self.core)
            .finish()
    }
}

impl<S, K: Clone, Bk: Clone, D: Clone, C> Layer<S> for RateLimitLayer<K, Bk, D, C> {
    type Service = RateLimit<S, K, Bk, D, C>;

    fn layer(&self, inner: S) -> Self::Service {
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
    fn zero_timeout_is_rejected() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert_eq!(
            RateLimitLayer::new("t", q)
                .try_timeout(Duration::ZERO)
                .unwrap_err(),
            ConfigError::ZeroTimeout
        );
        let layer = RateLimitLayer::new("t", q).try_timeout(Duration::from_millis(1));
        assert_eq!(
            layer.unwrap().core.settings.timeout,
            Duration::from_millis(1),
            "kept as given"
        );
    }

    /// A backend written before spending: it counts, refunds, peeks and
    /// resets, and answers `supports_spend` with the default `false`.
    #[derive(Clone, Debug)]
    struct Old(MemoryBackend);

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

    #[test]
    fn a_backend_that_cannot_spend_is_refused_whatever_the_order() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let old = || RateLimitLayer::new("t", q).backend(Old(MemoryBackend::new()));
        let refused = Err::<(), _>(ConfigError::SpendUnsupported);
        assert_eq!(old().try_cost(1).map(drop), refused);
        assert_eq!(old().try_cost_fn(|_| 1).map(drop), refused);
        assert_eq!(old().try_charge(|_| 1).map(drop), refused);
        assert_eq!(
            old().try_block_for(Duration::from_secs(1)).map(drop),
            refused
        );
        assert_eq!(old().try_reset_if(|_| true).map(drop), refused);
        // Without any of them it builds and counts as it always has.
        let _plain = old();
        if MemoryBackend::new().supports_spend() {
            let spending = RateLimitLayer::new("t", q).cost(2);
            assert_eq!(
                spending.try_backend(Old(MemoryBackend::new())).map(drop),
                refused
            );
        }
    }

    #[test]
    #[should_panic(expected = "does not support costs, charges, lockouts or resets on success")]
    fn a_backend_that_cannot_spend_panics_the_plain_builder() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let _ = RateLimitLayer::new("t", q)
            .backend(Old(MemoryBackend::new()))
            .block_for(Duration::from_secs(1));
    }

    #[test]
    fn a_quota_added_after_a_cost_it_cannot_fit_panics() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let small = Quota::new(3, Duration::from_secs(60)).unwrap();
        let layer = || RateLimitLayer::new("t", q).cost(4);
        let also = std::panic::catch_unwind(|| layer().also(small)).map(drop);
        let route = std::panic::catch_unwind(|| layer().route_quota("/a", small)).map(drop);
        for (what, result) in [("also", also), ("route_quota", route)] {
            let message = result.expect_err(what);
            let message = message.downcast_ref::<String>().expect(what);
            assert!(
                message.contains("4") && message.contains("set the quotas first"),
                "{what}: {message}"
            );
        }
        // Quotas the cost fits, before or after it, and a cost set after.
        let big = Quota::new(4, Duration::from_secs(60)).unwrap();
        let _ = layer().also(big).route_quota("/b", big);
        let _ = RateLimitLayer::new("t", q).also(big).cost(4);
    }

    #[test]
    fn a_cost_above_a_limit_and_a_bad_lockout_are_config_errors() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let small = Quota::new(3, Duration::from_secs(60)).unwrap();
        let layer = || RateLimitLayer::new("t", q);
        assert_eq!(
            layer().try_cost(11).map(drop),
            Err(ConfigError::CostAboveLimit {
                cost: 11,
                limit: 10
            })
        );
        assert_eq!(
            layer().also(small).try_cost(4).map(drop),
            Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
        );
        assert_eq!(
            layer().route_quota("/a", small).try_cost(4).map(drop),
            Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
        );
        assert_eq!(
            layer().try_block_for(Duration::ZERO).map(drop),
            Err(ConfigError::ZeroBlock)
        );
        assert_eq!(
            layer()
                .try_block_for(Window::MAX.as_duration() + Duration::from_millis(1))
                .map(drop),
            Err(ConfigError::BlockTooLong)
        );
        if MemoryBackend::new().supports_spend() {
            let blocked = layer()
                .try_block_for(Duration::from_nanos(1_000_001))
                .unwrap();
            let plan = blocked.core.settings.spend.unwrap();
            assert_eq!(plan.block.unwrap().as_millis(), 2, "rounded up");
        }
    }

    #[test]
    #[should_panic(expected = "a request cost of 11 is above the limit of 10")]
    fn a_literal_cost_above_the_limit_panics() {
        let _ = RateLimitLayer::new("t", Quota::new(10, Duration::from_secs(1)).unwrap()).cost(11);
    }

    #[test]
    #[should_panic(expected = "the backend timeout must be longer than zero")]
    fn a_zero_literal_timeout_panics() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        let _ = RateLimitLayer::new("t", q).timeout(Duration::ZERO);
    }
}
