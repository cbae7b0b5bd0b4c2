//! [`RateLimitLayer`]: the configuration, and the middleware's constructor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower_layer::Layer;

use crate::backend::{Backend, InFlight, MemoryBackend};
use crate::budget::check::{built, layer_name};
use crate::budget::failure::FailurePolicy;
use crate::budget::spend::{Cost, CostFn, SpendPlan};
use crate::core::{CapCore, Core, OnMissingKey, Settings, SkipIf};
use crate::cost::Mode;
use crate::cost::body::{self, BodyEstimate};
use crate::count::ResponseHead;
use crate::decision::{Decision, DecisionIn};
use crate::denied::{DeniedKeys, TopDenied};
use crate::error::ConfigError;
use crate::in_flight::layer::lease_above;
use crate::in_flight::slot::Shared;
use crate::key::{Allowlist, Key, KeyError, KeyExtractor};
use crate::limits::LimitBook;
use crate::policy::{NamedQuota, Policies};
use crate::quota::{Quota, Window};
use crate::request::RequestHead;
use crate::response::{DefaultDeny, HeaderStyle, InFlightFields};
use crate::server::service::RateLimit;
use crate::timeout::DEFAULT_TIMEOUT;

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
/// Every option, with examples, is in the guides (Markdown files in the
/// repository): [`docs/usage.md`](crate::guide::usage) (the options table), [`docs/quotas.md`](crate::guide::quotas),
/// [`docs/client-identity.md`](crate::guide::client_identity), [`docs/outcomes.md`](crate::guide::outcomes), [`docs/costs.md`](crate::guide::costs) and
/// [`docs/headers.md`](crate::guide::headers).
///
/// # The response body must implement `Default`
///
/// A denial is answered with an empty body of the service's own body type,
/// so the wrapped service's `Response<ResBody>` needs `ResBody: Default`.
/// tower-http's `TraceLayer` and `CompressionLayer` wrap the body in types
/// without it: put this layer *inside* them (below them in a
/// `ServiceBuilder`), where the trace also records the 429s. Guide:
/// [`docs/usage.md#with-other-layers-the-response-body-must-implement-default`](crate::guide::usage#with-other-layers-the-response-body-must-implement-default).
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
/// `M` is the layer's mode: `()`, plain hits, unless it spends (a
/// [`cost`](Self::cost), a [`reserve`](Self::reserve), a
/// [`block_for`](Self::block_for), a [`reset_if`](Self::reset_if)) or has a
/// [`charge`](Self::charge), and [`Capped`](crate::cost::Capped) over that
/// with an [`in_flight`](Self::in_flight) cap.
///
/// `R` says where a reservation is read from: `()`, the request's head,
/// unless [`reserve_from_body`](Self::reserve_from_body) made it a
/// [`BodyEstimate`], whose [`RateLimit`] reads each request's body before
/// its limiter runs (a layer without it never awaits the request's body).
///
/// # Panics
/// [`Layer::layer`] panics when the layer cannot work (see
/// [`check`](Self::check)): settings that depend on each other are checked
/// there, once, whatever the order they were set in.
#[must_use]
pub struct RateLimitLayer<K = (), Bk = MemoryBackend, D = DefaultDeny, M = (), R = ()> {
    key: K,
    core: Core<Bk, D>,
    mode: PhantomData<fn() -> M>,
    /// Where a reservation is read from: `()`, the head, or the body
    /// ([`BodyEstimate`]).
    reads: R,
}

impl RateLimitLayer {
    /// A layer named `name` that limits every request to `quota` in one
    /// global budget, counted in a fresh [`MemoryBackend`]. Pick the key with
    /// [`key`](Self::key) and the store with [`backend`](Self::backend).
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`](crate::name::MAX_NAME_LEN)
    /// characters from `A-Z a-z 0-9 _ - . :`. Use [`try_new`](Self::try_new) for
    /// a name known only at run time.
    #[track_caller]
    pub fn new(name: &'static str, quota: Quota) -> Self {
        built(Self::try_new(name, quota))
    }

    /// Like [`new`](Self::new), for a name known only at run time. Guide:
    /// [`docs/usage.md#values-read-at-run-time`](crate::guide::usage#values-read-at-run-time).
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for a name that is empty, longer than
    /// [`MAX_NAME_LEN`](crate::name::MAX_NAME_LEN), or has a character outside `A-Z a-z 0-9 _ - . :`.
    pub fn try_new(name: impl Into<String>, quota: Quota) -> Result<Self, ConfigError> {
        let name = layer_name(name.into())?;
        let policies = Policies::new(name.clone(), quota, HeaderStyle::default());
        Ok(Self {
            key: (),
            core: Core::new(
                MemoryBackend::new(),
                DefaultDeny,
                name,
                policies,
                DEFAULT_TIMEOUT,
            ),
            mode: PhantomData,
            reads: (),
        })
    }
}

impl<K, Bk, D, M, R> RateLimitLayer<K, Bk, D, M, R> {
    /// Charge each request to the key `key` extracts (see [`crate::key`]):
    /// a built-in extractor, a pair of them, or your own [`KeyExtractor`].
    /// For a closure, use [`key_fn`](Self::key_fn). Guide:
    /// [`docs/client-identity.md`](crate::guide::client_identity).
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<K2, Bk, D, M, R> {
        RateLimitLayer {
            key,
            core: self.core,
            mode: PhantomData,
            reads: self.reads,
        }
    }

    /// Charge each request to the key the closure `key` reads from the
    /// request's head; its argument type is inferred. Guide:
    /// [`docs/usage.md#your-own-key-your-own-denial`](crate::guide::usage#your-own-key-your-own-denial).
    pub fn key_fn<F>(self, key: F) -> RateLimitLayer<F, Bk, D, M, R>
    where
        F: Fn(&RequestHead<'_>) -> Result<Key, KeyError>,
    {
        self.key(key)
    }

    /// Keep counters in `backend` instead of this layer's own
    /// [`MemoryBackend`]. Layers given clones of one backend share counters
    /// only where their names are equal. Guide:
    /// [`docs/usage.md#sharing-a-backend-reading-a-counter`](crate::guide::usage#sharing-a-backend-reading-a-counter).
    ///
    /// A layer that spends (a [cost](Self::cost), a [charge](Self::charge), a
    /// [lockout](Self::block_for) or a [reset on success](Self::reset_if))
    /// needs a backend that implements
    /// [`Spending`](crate::backend::Spending), set before or after them: on
    /// another, it does not compile.
    pub fn backend<Bk2: Backend>(self, backend: Bk2) -> RateLimitLayer<K, Bk2, D, M, R> {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend,
                deny: self.core.deny,
                settings: self.core.settings,
                cap: None,
            },
            mode: PhantomData,
            reads: self.reads,
        }
    }

    /// Answer denied (non-gRPC) requests with `deny`'s response instead of
    /// an empty 429. `Retry-After` and the rate-limit headers are added to it,
    /// each unless the response already has it. The closure's argument type is
    /// inferred. Guide: [`docs/usage.md#your-own-key-your-own-denial`](crate::guide::usage#your-own-key-your-own-denial).
    pub fn deny_with<F, B>(self, deny: F) -> RateLimitLayer<K, Bk, F, M, R>
    where
        F: Fn(&Decision) -> Response<B>,
    {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend: self.core.backend,
                deny,
                settings: self.core.settings,
                cap: None,
            },
            mode: PhantomData,
            reads: self.reads,
        }
    }

    /// At most `cap.max()` requests **in flight** per key as well, shared
    /// by every instance on the backend, in the same store step as the
    /// quotas: one round trip decides both. A request takes a slot with its
    /// counters and holds it until its answer's body ends, fails or is
    /// dropped; the answers' bodies become [`Leased`](crate::in_flight::Leased).
    ///
    /// - A request refused by the cap counts nothing: `429` with
    ///   `Retry-After` (gRPC `RESOURCE_EXHAUSTED`), and the cap's IETF
    ///   fields (`qu="concurrent-requests"`) beside the quotas'.
    /// - A request refused by its quotas takes no slot, and is denied as
    ///   any other.
    /// - Slots live on leases, extended by one store call per instance
    ///   every third of the lease, as [`InFlightLayer`](crate::InFlightLayer)'s:
    ///   the guide, [`docs/in-flight.md`](crate::guide::in_flight), says
    ///   what "at most N" means under each failure.
    ///
    /// It builds only on a backend that implements
    /// [`Leasing`](crate::backend::Leasing) (every backend of this crate
    /// does), set before or after it. A lease no longer than the layer's
    /// [`timeout`](Self::timeout) is refused by [`check`](Self::check).
    /// The slots are named by the layer's name and the key, apart from its
    /// counters.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{InFlight, Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("completions", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .in_flight(InFlight::new(1, Duration::from_secs(30)).unwrap());
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// let call = || app.clone().oneshot(Request::new(Body::empty()));
    /// let fields = |response: &axum::response::Response| -> Vec<String> {
    ///     let all = response.headers().get_all("ratelimit").iter();
    ///     all.map(|value| value.to_str().unwrap().to_owned()).collect()
    /// };
    /// let first = call().await.unwrap();
    /// assert_eq!(first.status(), StatusCode::OK);
    /// // The quota's member, and the cap's: no slot left.
    /// assert_eq!(fields(&first), ["\"completions\";r=99;t=60, \"completions\";r=0"]);
    /// // The first answer's body still holds its slot: nothing is counted.
    /// let second = call().await.unwrap();
    /// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(fields(&second), ["\"completions\";r=0;t=30"]);
    /// drop(first);
    /// let third = call().await.unwrap();
    /// assert_eq!(third.status(), StatusCode::OK);
    /// assert_eq!(fields(&third), ["\"completions\";r=98;t=60, \"completions\";r=0"]);
    /// # }
    /// ```
    pub fn in_flight(mut self, cap: InFlight) -> RateLimitLayer<K, Bk, D, M::Capped, R>
    where
        M: Mode,
    {
        self.core.settings.in_flight = Some(cap);
        RateLimitLayer {
            key: self.key,
            core: self.core,
            mode: PhantomData,
            reads: self.reads,
        }
    }

    /// Which rate-limit headers responses carry (default: the IETF fields).
    /// See the [example](HeaderStyle#example); guide: [`docs/headers.md`](crate::guide::headers).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.core.settings.policies.set_style(style);
        self
    }

    /// Check every request against `quota` too, in the same backend call: a
    /// request over any of its quotas is denied. Clients see it under the name a
    /// [`NamedQuota`] gives it, or `"<layer> <limit>/<window>"` for a plain
    /// [`Quota`]. Guide: [`docs/quotas.md#more-quotas-also`](crate::guide::quotas#more-quotas-also).
    ///
    /// A fixed [`cost`](Self::cost) above `quota`'s limit is refused when
    /// the layer is built ([`check`](Self::check)).
    pub fn also(mut self, quota: impl Into<NamedQuota>) -> Self {
        self.core.settings.policies.add_also(quota.into());
        self
    }

    /// Use `quota` instead of the layer's for one route: axum's matched path
    /// (add the layer with `route_layer`) or a gRPC method. Quotas added with
    /// [`also`](Self::also) still apply. Guide:
    /// [`docs/quotas.md#per-route-or-method-route_quota`](crate::guide::quotas#per-route-or-method-route_quota).
    ///
    /// A fixed [`cost`](Self::cost) above `quota`'s limit is refused when
    /// the layer is built, as for [`also`](Self::also).
    pub fn route_quota(mut self, route: &str, quota: impl Into<NamedQuota>) -> Self {
        self.core.settings.policies.add_route(route, quota.into());
        self
    }

    /// Pick a request's quota with `choose` (a tier your authentication
    /// attached, say); `None` falls back to the route's quota or the layer's.
    /// Quotas added with [`also`](Self::also) still apply. Every tier counts
    /// in the layer's own counter, so a key whose tier changes keeps its
    /// count and its window (a downgrade mid-window denies at once). Guide:
    /// [`docs/quotas.md#tiers-quota_by`](crate::guide::quotas#tiers-quota_by).
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

    /// Read the layer's limits from `book` too: limits held in the store per
    /// layer, tier and key, set while the service runs and applied within
    /// the book's staleness bound, with no store call on the request path
    /// (see [`LimitBook`](crate::LimitBook) for which limit applies). The
    /// count is kept when a limit changes. Guide:
    /// [limits that change](crate::guide::guarantees#limits-that-change).
    pub fn limits(mut self, book: LimitBook) -> Self {
        self.core.settings.policies.set_book(&book);
        self
    }

    /// Let the requests `skip` picks bypass the limiter: they are not counted,
    /// get no rate-limit headers and no [`Decision`], and their key is never
    /// read. Each call adds a predicate; the closure's argument type is
    /// inferred. Guide: [`docs/client-identity.md#skipping-requests`](crate::guide::client_identity#skipping-requests).
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
    /// [`skip_if`](Self::skip_if) does, found through the proxies its
    /// [`ClientIp`](crate::key::ClientIp) trusts and no others. Guide:
    /// [`docs/client-identity.md#skipping-requests`](crate::guide::client_identity#skipping-requests).
    pub fn allowlist(self, allowlist: Allowlist) -> Self {
        self.skip_if(move |req| allowlist.contains(req))
    }

    /// Count a request only if the service's answer says so: `counts` reads
    /// the answer's [`ResponseHead`], and a hit it rejects is handed back
    /// ([`Backend::refund`]) in every quota, as a denied request's is. The
    /// closure's argument type is inferred; a later call replaces an earlier one.
    /// The usual choices are methods of the view:
    /// `count_if(|res| res.is_auth_failure())` ([`is_failure`](ResponseHead::is_failure),
    /// [`is_auth_failure`](ResponseHead::is_auth_failure),
    /// [`is_server_error`](ResponseHead::is_server_error),
    /// [`is_success`](ResponseHead::is_success)).
    /// Guide (what counts, and when): [`docs/outcomes.md`](crate::guide::outcomes).
    pub fn count_if<F>(mut self, counts: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        let outcome = self.core.settings.outcome.get_or_insert_default();
        outcome.count_if = Some(Arc::new(counts));
        self
    }

    /// What requests get when the backend is down, slow or full (default:
    /// [`FailurePolicy::FailClosed`]). See the
    /// [example](FailurePolicy#example).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        // The insurance limiter's counters, made once: a layer and its
        // clones share them.
        self.core.settings.failure.set(policy);
        self
    }

    /// Whether a request whose key cannot be extracted passes on uncounted
    /// (`true`), or is answered with the status its
    /// [`KeyError`](crate::key::KeyError) names (`false`, the default): 400
    /// for a request that lacks its key, 500 for a server that is not set up
    /// for the extractor (gRPC: INVALID_ARGUMENT or INTERNAL).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{HeaderName, Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
    /// let by_api_key = RateLimitLayer::new("api", quota)
    ///     .key(HeaderName::from_static("x-api-key"));
    /// let status = |layer: RateLimitLayer<HeaderName>| async move {
    ///     let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    ///     app.oneshot(Request::new(Body::empty())).await.unwrap().status()
    /// };
    /// // No `x-api-key` header:
    /// assert_eq!(status(by_api_key.clone()).await, StatusCode::BAD_REQUEST);
    /// let lenient = by_api_key.allow_missing_key(true);
    /// assert_eq!(status(lenient).await, StatusCode::OK);
    /// # }
    /// ```
    pub fn allow_missing_key(mut self, allow: bool) -> Self {
        self.core.settings.missing_key = if allow {
            OnMissingKey::Allow
        } else {
            OnMissingKey::Reject
        };
        self
    }

    /// How long one backend call may take (default [`DEFAULT_TIMEOUT`]);
    /// past it the request is handled under the [`FailurePolicy`]. The timer
    /// only starts if the backend does not answer at once. A [`Window`] is
    /// never zero. Guide: [`docs/usage.md#values-read-at-run-time`](crate::guide::usage#values-read-at-run-time).
    pub fn timeout(mut self, timeout: Window) -> Self {
        self.core.settings.timeout = timeout.as_duration();
        self
    }

    /// Shadow (dry-run) mode: count and set headers, but never deny. Requests
    /// over the limit pass, and their [`Decision`](crate::Decision) is both
    /// [`passed`](crate::Decision::passed) and
    /// [`over_limit`](crate::Decision::over_limit), so a new limit can be
    /// watched before it is enforced. See the
    /// [example](crate::Decision::over_limit).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.core.settings.shadow = shadow;
        self
    }

    /// Where a passed request's [`Decision`] goes: only where asked for
    /// ([`DecisionIn::Asked`], the default: nothing is paid for a decision
    /// nobody reads), the request's extensions, for the handler
    /// ([`DecisionIn::Request`]: a handler that takes a `Decision` needs
    /// it), or the response's ([`DecisionIn::Response`]). A denial always
    /// carries it in the response's extensions, and a request carrying
    /// [`WantDecision`](crate::outcome::WantDecision) gets it in its response's. See
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

    /// Count the keys this layer denies most in a table of
    /// `top.capacity()` counters, kept in this process's memory and shown
    /// as keyed digests, never the keys; read it through
    /// [`denied_keys`](Self::denied_keys). An allowed request never touches
    /// it, and a denial costs no store call. Each call makes a new, empty
    /// table, which the layer's clones and services then share. Module
    /// docs: [`denied`](crate::denied); guide:
    /// [`docs/metrics.md#the-keys-denied-most`](crate::guide::metrics#the-keys-denied-most).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::denied::TopDenied;
    /// use tower_pinned_window::{Quota, RateLimitLayer};
    ///
    /// let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
    /// let layer = RateLimitLayer::new("api", quota).top_denied(TopDenied::new(1_000).unwrap());
    /// assert_eq!(layer.denied_keys().unwrap().capacity(), 1_000);
    /// ```
    pub fn top_denied(mut self, top: TopDenied) -> Self {
        let s = &mut self.core.settings;
        s.denied = Some(top.table(&s.name));
        self
    }

    /// The handle on the keys this layer denied most, when
    /// [`top_denied`](Self::top_denied) turned them on; `None` otherwise.
    /// Take it before the layer goes into a router: the handle and the
    /// layer's services share one table.
    pub fn denied_keys(&self) -> Option<DeniedKeys> {
        self.core.settings.denied.clone()
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.core.settings.name
    }

    /// The layer's quota.
    pub fn quota(&self) -> Quota {
        self.core.settings.policies.default_quota()
    }

    /// The layer's backend, for [`peek`](Backend::peek) and
    /// [`reset`](Backend::reset). Guide:
    /// [`docs/usage.md#sharing-a-backend-reading-a-counter`](crate::guide::usage#sharing-a-backend-reading-a-counter).
    pub fn backend_ref(&self) -> &Bk {
        &self.core.backend
    }

    /// The layer's settings, for the operator's service
    /// (`operator/`), which reads its name, counters and whether it spends.
    #[cfg(feature = "operator")]
    pub(crate) fn settings(&self) -> &Settings {
        &self.core.settings
    }
}

/// Costs, reservations, charges, lockouts and resets on success (the
/// guide: [`docs/costs.md`](crate::guide::costs)). Each moves the layer to a mode that spends
/// ([`Spends`](crate::cost::Spends), or [`Charged`](crate::cost::Charged)), which builds only on a
/// backend that implements [`Spending`](crate::backend::Spending), whatever
/// the order of the calls.
impl<K, Bk, D, M: Mode, R> RateLimitLayer<K, Bk, D, M, R> {
    /// The spend plan, once the layer spends.
    fn spending<M2>(mut self, set: impl FnOnce(&mut Settings)) -> RateLimitLayer<K, Bk, D, M2, R> {
        self.core.settings.spend.get_or_insert_with(SpendPlan::new);
        set(&mut self.core.settings);
        RateLimitLayer {
            key: self.key,
            core: self.core,
            mode: PhantomData,
            reads: self.reads,
        }
    }

    /// The layer, its reservation read from where `reads` says.
    fn reading<R2>(self, reads: R2) -> RateLimitLayer<K, Bk, D, M, R2> {
        RateLimitLayer {
            key: self.key,
            core: self.core,
            mode: PhantomData,
            reads,
        }
    }

    /// Every request costs `cost` in each of its quotas, instead of 1: it is
    /// admitted only if its whole cost fits in every quota, and a denied request
    /// spends nothing. A cost of 0 checks without counting. A cost above one of
    /// the layer's limits could never be admitted: the layer refuses it when it
    /// is built ([`check`](Self::check)). Guide: [`docs/costs.md#request-cost`](crate::guide::costs#request-cost).
    pub fn cost(self, cost: u64) -> RateLimitLayer<K, Bk, D, M::Spending, R> {
        self.spending(|s| s.spend.as_mut().expect("a plan").cost = Some(Cost::Fixed(cost)))
    }

    /// Each request costs what `cost` reads from its head, as
    /// [`cost`](Self::cost) does. A cost above the limit of the request's
    /// quota is denied, with [`Decision::never_fits`] and no `Retry-After`,
    /// whatever the backend answers: the backend is asked only what the
    /// key's counters hold, for the headers, and nothing is spent. It runs
    /// on every request: keep it cheap.
    /// Guide: [`docs/costs.md#request-cost`](crate::guide::costs#request-cost).
    pub fn cost_fn<F>(self, cost: F) -> RateLimitLayer<K, Bk, D, M::Spending, R>
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        let cost = Cost::By(Arc::new(cost));
        self.spending(|s| s.spend.as_mut().expect("a plan").cost = Some(cost))
    }

    /// A response's cost, read from its [`ResponseHead`] when its body ends
    /// (a token count in a trailer, say: the view has the body's
    /// [trailers](ResponseHead::trailers) and [last chunk](ResponseHead::last_chunk)
    /// then), added to the window the request
    /// was counted in. The request goes in as a check that opens the
    /// window; the answers' bodies become [`Metered`](crate::cost::Metered).
    /// Guide: [`docs/costs.md#response-cost-charge`](crate::guide::costs#response-cost-charge).
    ///
    /// `charge` answers a `u64`, or an `Option<u64>` where `None` means
    /// that the answer's usage is absent or malformed: nothing is charged
    /// (under [`reserve`](Self::reserve), nothing is settled, and the
    /// reservation stays spent), and a warning is logged, at most once every
    /// few seconds. A charge never panics the layer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{Quota, RateLimitLayer, outcome::ResponseHead};
    ///
    /// /// The tokens an answer used, when it says (`None`: it does not).
    /// fn tokens(end: &ResponseHead) -> Option<u64> {
    ///     end.headers().get("x-usage-tokens")?.to_str().ok()?.parse().ok()
    /// }
    /// let quota = Quota::new(1000, Duration::from_secs(60)).unwrap();
    /// let by_tokens = RateLimitLayer::new("tokens", quota).charge(tokens);
    /// // A plain count still works: 0 charges nothing.
    /// let by_calls = RateLimitLayer::new("calls", quota).charge(|end| u64::from(end.status().is_success()));
    /// assert!(by_tokens.check().is_ok() && by_calls.check().is_ok());
    /// ```
    pub fn charge<F, T>(self, charge: F) -> RateLimitLayer<K, Bk, D, M::Charged, R>
    where
        F: Fn(&ResponseHead<'_>) -> T + Send + Sync + 'static,
        T: Into<Option<u64>>,
    {
        self.spending(|s| {
            s.spend.as_mut().expect("a plan").charge =
                Some(Arc::new(move |end: &ResponseHead<'_>| charge(end).into()));
        })
    }

    /// Reserve, then settle: each request spends what `estimate` reads from
    /// its head (an LLM request's `max_tokens`, say) on the way in, all or
    /// nothing like a [`cost_fn`](Self::cost_fn), and its answer settles the
    /// reservation to the actual use the [`charge`](Self::charge) reads:
    /// the difference is charged when it used more, refunded when it used
    /// less, in the request's own window under the refund rules. So a window
    /// never admits more than its budget in estimates, and the headers and
    /// the [`Decision`] show the budget after the reservation.
    ///
    /// - An estimate above the limit of the request's quota is denied,
    ///   with [`Decision::never_fits`] and no `Retry-After`; a denied
    ///   request spends nothing, and its headers show what is left.
    /// - A charge that cannot read the use (`None`) settles nothing: the
    ///   reservation stays spent.
    /// - An answer that [`count_if`](Self::count_if) rejects refunds the
    ///   whole estimate; one that [`reset_if`](Self::reset_if) picks clears
    ///   the counters.
    /// - It needs a `charge` ([`ConfigError::ReserveWithoutCharge`]) and
    ///   takes the place of a [`cost`](Self::cost) or `cost_fn`: a layer with
    ///   both is refused ([`ConfigError::ReserveWithCost`]), in
    ///   [`check`](Self::check), whatever the order of the calls.
    ///
    /// It runs on every request: keep it cheap. Guide:
    /// [`docs/costs.md#reserve-then-settle`](crate::guide::costs#reserve-then-settle).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer, outcome::ResponseHead};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let header = |h: &http::HeaderMap, name: &str| -> Option<u64> {
    ///     h.get(name)?.to_str().ok()?.parse().ok()
    /// };
    /// let budget = RateLimitLayer::new("tokens", Quota::new(1000, Duration::from_secs(60)).unwrap())
    ///     .reserve(move |req| header(req.headers(), "x-max-tokens").unwrap_or(1000))
    ///     .charge(move |end: &ResponseHead| header(end.headers(), "x-usage-tokens"));
    /// let app = Router::new()
    ///     .route("/complete", post(|| async { ([("x-usage-tokens", "100")], "...") }))
    ///     .layer(budget);
    /// let complete = || async {
    ///     let request = Request::post("/complete").header("x-max-tokens", "400");
    ///     let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    ///     let (status, left) = (response.status(), response.headers()["ratelimit"].clone());
    ///     // The body sent: its usage of 100 settles the reservation of 400.
    ///     axum::body::to_bytes(Body::new(response.into_body()), 1 << 16).await.unwrap();
    ///     (status, left)
    /// };
    /// // The headers show the budget after the reservation: 1000 - 400.
    /// assert_eq!(complete().await, (StatusCode::OK, "\"tokens\";r=600;t=60".parse().unwrap()));
    /// // Settled to 100: 900 left, then 500 after this reservation.
    /// assert_eq!(complete().await.1, "\"tokens\";r=500;t=60");
    /// # }
    /// ```
    pub fn reserve<F>(self, estimate: F) -> RateLimitLayer<K, Bk, D, M::Spending>
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        let estimate: CostFn = Arc::new(estimate);
        self.spending(|s| s.spend.as_mut().expect("a plan").reserve = Some(estimate))
            .reading(())
    }

    /// Reserve, then settle, with the estimate read from the request's
    /// body (an LLM request's `max_tokens` in its JSON): as
    /// [`reserve`](Self::reserve), whose rules it follows (it needs a
    /// [`charge`](Self::charge), and takes the place of a
    /// [`cost`](Self::cost); a later `reserve` or `reserve_from_body`
    /// replaces an earlier one). [`BodyEstimate`] says how the estimate is
    /// read, from at most how many bytes, and what a longer body gets (the
    /// fallback, or 413).
    ///
    /// Each request's body is read up to that limit before the limiter
    /// runs, then handed on whole to the service (a
    /// [`Replay`](crate::cost::Replay): the frames read, then the rest of
    /// the stream, trailers kept). A body that cannot be read (empty, not
    /// of the format, without the field, failing, or too long) reserves
    /// the fallback; gRPC bodies are not read. The layer makes a
    /// `RateLimit<S, K, Bk, D, M, BodyEstimate>` (see [`RateLimit`]), whose
    /// future reads the body first; a layer without this setter never
    /// awaits the body.
    /// Guide: [`docs/costs.md#reserve-from-the-body`](crate::guide::costs#reserve-from-the-body).
    ///
    /// ```
    /// # #[cfg(feature = "json")] {
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Quota, RateLimitLayer, cost::BodyEstimate, outcome::ResponseHead};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let budget = RateLimitLayer::new("tokens", Quota::new(1000, Duration::from_secs(60)).unwrap())
    ///     .reserve_from_body(BodyEstimate::json_field("max_tokens", 1000))
    ///     .charge(|end: &ResponseHead| end.headers().get("x-usage-tokens")?.to_str().ok()?.parse().ok());
    /// let app = Router::new()
    ///     // The handler gets the body whole.
    ///     .route("/complete", post(|body: String| async move { ([("x-usage-tokens", "100")], body) }))
    ///     .layer(budget);
    /// let request = Request::post("/complete").body(Body::from(r#"{"max_tokens": 400}"#)).unwrap();
    /// let response = app.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), StatusCode::OK);
    /// assert_eq!(response.headers()["ratelimit"], "\"tokens\";r=600;t=60");
    /// let body = axum::body::to_bytes(Body::new(response.into_body()), 1 << 16).await.unwrap();
    /// assert_eq!(body, r#"{"max_tokens": 400}"#);
    /// # }
    /// # }
    /// ```
    pub fn reserve_from_body(
        self,
        estimate: BodyEstimate,
    ) -> RateLimitLayer<K, Bk, D, M::Spending, BodyEstimate> {
        let fallback = estimate.fallback();
        let read: CostFn = Arc::new(move |head| body::estimated(head, fallback));
        self.spending(|s| s.spend.as_mut().expect("a plan").reserve = Some(read))
            .reading(estimate)
    }

    /// Once a request does not fit, lock its key out for `block`, counted
    /// from that first denial and never extended; `Retry-After` gives the
    /// lockout's end. Guide: [`docs/costs.md#lockouts-block_for`](crate::guide::costs#lockouts-block_for).
    pub fn block_for(self, block: Window) -> RateLimitLayer<K, Bk, D, M::Spending, R> {
        self.spending(|s| s.spend.as_mut().expect("a plan").block = Some(block))
    }

    /// A passed request whose answer `reset` picks (a successful login)
    /// clears its key's counters in the request's window, never creating
    /// one; its decision is [`cleared`](Decision::cleared). Guide:
    /// [`docs/costs.md#reset-on-success-reset_if`](crate::guide::costs#reset-on-success-reset_if).
    pub fn reset_if<F>(self, reset: F) -> RateLimitLayer<K, Bk, D, M::Spending, R>
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.spending(|s| s.outcome.get_or_insert_default().reset_if = Some(Arc::new(reset)))
    }
}

impl<K, Bk, D, M, R> RateLimitLayer<K, Bk, D, M, R> {
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
    /// - [`ConfigError::CostAboveLimit`] when a fixed [`cost`](Self::cost) is
    ///   above the limit of one of the layer's quotas (its own, a route's, or
    ///   one added with [`also`](Self::also)): no request could be admitted.
    /// - [`ConfigError::ReserveWithoutCharge`] for a
    ///   [`reserve`](Self::reserve) without a [`charge`](Self::charge) to
    ///   settle it.
    /// - [`ConfigError::LeaseNotAboveTimeout`] for an
    ///   [`in_flight`](Self::in_flight) cap whose lease is no longer than
    ///   the layer's [`timeout`](Self::timeout): a slot could run out before
    ///   the answer that took it arrived.
    /// - [`ConfigError::ReserveWithCost`] for a `reserve` together with a
    ///   `cost` or [`cost_fn`](Self::cost_fn): the reservation is the
    ///   request's cost on the way in.
    pub fn check(&self) -> Result<(), ConfigError> {
        let s = &self.core.settings;
        if let Some(cap) = s.in_flight {
            lease_above(cap.lease(), s.timeout)?;
        }
        match &s.spend {
            Some(plan) => plan.check(s.policies.smallest_limit()),
            None => Ok(()),
        }
    }
}

impl<K: Clone, Bk: Clone, D: Clone, M, R: Clone> Clone for RateLimitLayer<K, Bk, D, M, R> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            core: self.core.clone(),
            mode: PhantomData,
            reads: self.reads.clone(),
        }
    }
}

impl<K: fmt::Debug, Bk: fmt::Debug, D, M, R: fmt::Debug> fmt::Debug
    for RateLimitLayer<K, Bk, D, M, R>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.key)
            .field("core", &self.core)
            .field("reads", &self.reads)
            .finish()
    }
}

/// A layer that [reserves from the body](RateLimitLayer::reserve_from_body)
/// makes a `RateLimit<S, K, Bk, D, M, BodyEstimate>`, which reads each
/// request's body before its limiter runs; any other, a `RateLimit` that
/// never awaits the body.
///
/// # Panics
/// When the layer cannot work: see [`check`](RateLimitLayer::check).
impl<S, K: Clone, Bk: Backend, D: Clone, M, R: Clone> Layer<S> for RateLimitLayer<K, Bk, D, M, R> {
    type Service = RateLimit<S, K, Bk, D, M, R>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        built(self.check());
        let mut core = self.core.clone();
        // Known only now, whatever the order the options were set in.
        let lowers = core.lowers_counts();
        core.settings.policies.set_lowers(lowers);
        if let Some(in_flight) = core.settings.in_flight {
            let s = &core.settings;
            let slots = Shared::new(
                Arc::clone(&s.name),
                in_flight,
                core.backend.clone(),
                s.failure.clone(),
                s.timeout,
                Duration::ZERO,
            );
            let fields = (s.policies.style() == HeaderStyle::Ietf)
                .then(|| Arc::new(InFlightFields::new(&s.name, in_flight.max())));
            core.cap = Some(CapCore {
                in_flight,
                slots: Arc::new(slots),
                fields,
            });
        }
        RateLimit::new(inner, self.key.clone(), Arc::new(core), self.reads.clone())
    }
}

#[cfg(test)]
mod tests;
