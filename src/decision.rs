//! What the limiter decided for one request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Extensions;

use crate::label::{Label, QuotaHeaders};
use crate::request::Route;

/// Whether a request went through: what [`Decision::passed`] and
/// [`Decision::over_limit`] read, and what metrics and logs name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// Within the limit: the request was passed on.
    Allowed,
    /// Over the limit: the request was answered with a denial.
    Denied,
    /// Over the limit, but the layer is in shadow mode: the request was passed
    /// on, and the response carries the headers a denial would.
    Shadowed,
}

/// One request's verdict. It is handed to the
/// [`on_decision`](crate::RateLimitLayer::on_decision) callback, and put
/// where the layer's [`DecisionIn`] says.
///
/// # Where to read it
///
/// - A denial (and any answer under
///   [`count_if`](crate::RateLimitLayer::count_if), where the decision says
///   whether the hit was [refunded](Self::refunded)) always carries it in
///   the response's extensions.
/// - A passed request's decision goes nowhere by default
///   ([`DecisionIn::Asked`]): a server that never reads it pays nothing for
///   it.
/// - A handler that reads it says so with one setter,
///   [`decision_in(DecisionIn::Request)`](crate::RateLimitLayer::decision_in),
///   and takes `Decision` as an extractor (with the `axum` feature; or
///   `Option<Decision>`, for requests passed without one). A handler that
///   asks for one the layer was not told to give is answered `500` with a
///   body that names the setter.
/// - A passed request's response carries it in its extensions when the
///   request asked for it with [`WantDecision`] in its extensions (what an
///   outer layer does to read it), or under [`DecisionIn::Response`].
///
/// Putting a value into empty extensions costs three allocations (the
/// map's box, its table, the boxed value), so [`DecisionIn::Response`]
/// costs three per passed request; [`DecisionIn::Request`] costs one under
/// axum, whose router has already made the request's extensions. At the
/// default, with the headers off, no
/// [`on_decision`](crate::RateLimitLayer::on_decision) callback and no
/// `metrics` feature, a passed request nobody reads the decision of gets
/// none made at all (one with no hit to spare still does, to raise
/// `Retry-After`).
///
/// The counts per request are measured by `bash bench/allocs.sh` (the
/// repository's `bench/`).
///
/// It says which limiter ([`name`](Self::name)), which of its quotas
/// ([`policy`](Self::policy)) and which route ([`route`](Self::route))
/// decided, which makes it a metrics record: all three are bounded sets
/// chosen by the server. It never carries the request's key, for two
/// reasons:
/// - keys are client identities (IP addresses, API keys, user ids): a
///   decision travels to metrics, logs and response extensions that should
///   not hold them;
/// - keys are unbounded: one label value per client would give a metrics
///   system one time series per client.
///
/// A callback that needs the client can read it from the request itself, in
/// a layer of its own.
///
/// # Example
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = Arc::clone(&seen);
/// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
///     .on_decision(move |decision: &Decision| log.lock().unwrap().push(decision.passed()))
///     // The handler reads the decision: the layer puts it in the request.
///     .decision_in(DecisionIn::Request);
/// let handler = |decision: Decision| async move {
///     assert_eq!((decision.name(), decision.policy()), ("api", "api"));
///     assert_eq!((decision.limit(), decision.count(), decision.remaining()), (1, 1, 0));
///     assert!(decision.reset() <= Duration::from_secs(60));
///     assert_eq!(decision.reset_secs(), 60);
///     assert!(decision.passed() && !decision.over_limit() && !decision.refunded());
///     "hello"
/// };
/// let app = Router::new().route("/", get(handler)).layer(layer);
///
/// let response = app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(response.status(), StatusCode::OK);
/// // Nobody asked for it in the response.
/// assert!(response.extensions().get::<Decision>().is_none());
///
/// // A denial always carries it in its response.
/// let denied = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// assert!(denied.extensions().get::<Decision>().unwrap().over_limit());
/// assert_eq!(*seen.lock().unwrap(), [true, false], "passed, then denied");
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Decision {
    label: Arc<Label>,
    route: Option<Route>,
    limit: u64,
    count: u64,
    reset: Duration,
    outcome: Outcome,
    refunded: bool,
    cleared: bool,
    never_fits: bool,
    /// Counted by the insurance limiter, the backend being out.
    insured: bool,
    /// The layer is in shadow mode: it never denies, so it never lengthens
    /// the wait an inner layer's `Retry-After` announces.
    shadow: bool,
}

impl Decision {
    #[inline]
    pub(crate) fn new(
        label: Arc<Label>,
        route: Option<Route>,
        limit: u64,
        count: u64,
        reset: Duration,
        shadow: bool,
    ) -> Self {
        let outcome = match (count <= limit, shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Denied,
            (false, true) => Outcome::Shadowed,
        };
        Self {
            label,
            route,
            limit,
            count,
            reset,
            outcome,
            refunded: false,
            cleared: false,
            never_fits: false,
            insured: false,
            shadow,
        }
    }

    /// The decision on a spend that did not fit: nothing was spent, and
    /// `stands` is what the counter holds (at least `limit` under a
    /// lockout), so [`remaining`](Self::remaining) is what is truly left.
    #[cold]
    pub(crate) fn refused(
        label: Arc<Label>,
        route: Option<Route>,
        limit: u64,
        stands: u64,
        reset: Duration,
        shadow: bool,
    ) -> Self {
        let mut decision = Self::new(label, route, limit, stands, reset, shadow);
        decision.outcome = if shadow {
            Outcome::Shadowed
        } else {
            Outcome::Denied
        };
        decision
    }

    /// The decision on a request whose cost is above `limit`: it can never
    /// be admitted, and nothing was counted. `stands` is what the store
    /// holds for the key, `None` when it could not be read (then the
    /// decision shows nothing left).
    #[cold]
    pub(crate) fn never_fitting(
        label: Arc<Label>,
        route: Option<Route>,
        limit: u64,
        stands: Option<u64>,
        reset: Duration,
        shadow: bool,
    ) -> Self {
        let stands = stands.unwrap_or(limit);
        let mut decision = Self::refused(label, route, limit, stands, reset, shadow);
        decision.never_fits = true;
        decision
    }

    /// Marks a decision of the insurance limiter.
    #[cold]
    pub(crate) fn insure(&mut self) {
        self.insured = true;
    }

    /// Whether the layer that decided is in shadow mode (it never denies).
    pub(crate) fn by_shadow_layer(&self) -> bool {
        self.shadow
    }

    /// Its quota's header fields.
    pub(crate) fn quota_headers(&self) -> &QuotaHeaders {
        &self.label.headers
    }

    /// The layer's name (see [`RateLimitLayer::new`](crate::RateLimitLayer::new)).
    ///
    /// See the [example](Decision#example).
    pub fn name(&self) -> &str {
        &self.label.limiter
    }

    /// The name of the quota that decided, as the `RateLimit` headers show
    /// it: the layer's name for the layer's own quota, the name given with
    /// [`NamedQuota`](crate::NamedQuota), or the readable default the layer
    /// gave an unnamed route, extra or tier quota.
    ///
    /// See the [example](Decision#example).
    pub fn policy(&self) -> &str {
        &self.label.policy
    }

    /// The route the request matched, when it had one: axum's `MatchedPath`
    /// (`/users/{id}`, the route's pattern, never the raw path) or a gRPC
    /// method (`/package.Service/Method`); see
    /// [`RequestHead::route`](crate::key::RequestHead::route).
    ///
    /// See the [example](Decision#example).
    pub fn route(&self) -> Option<&str> {
        self.route.as_ref().map(Route::as_str)
    }

    /// Hits admitted per window.
    ///
    /// See the [example](Decision#example).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The key's counter after this request (it counts denied requests too,
    /// unless the layer spends: see
    /// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost)), less this
    /// request's cost once it was [refunded](Self::refunded).
    ///
    /// Under a layer that spends, a request whose cost does not fit spends
    /// nothing: its count is the counter as it stands (at least the limit
    /// while the key is locked out by
    /// [`block_for`](crate::RateLimitLayer::block_for)), and
    /// [`remaining`](Self::remaining) is what is truly left, which may be
    /// more than 0 on a denial: 100 left deny a cost of 300.
    ///
    /// See the [example](Decision#example).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Hits left in this window after this request: the limit less the
    /// [count](Self::count), or 0. On a denial by cost, what is left that
    /// the cost did not fit in.
    ///
    /// See the [example](Decision#example).
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.count)
    }

    /// Time until the window closes.
    ///
    /// See the [example](Decision#example).
    pub fn reset(&self) -> Duration {
        self.reset
    }

    /// [`reset`](Self::reset) in whole seconds, rounded up, at least 1: the
    /// value of `Retry-After` on a denial.
    ///
    /// See the [example](Decision#example).
    pub fn reset_secs(&self) -> u64 {
        ceil_secs(self.reset)
    }

    /// What happened to the request.
    pub(crate) fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the request was passed on to the service (allowed or shadowed).
    ///
    /// See the [example](Decision#example).
    pub fn passed(&self) -> bool {
        self.outcome != Outcome::Denied
    }

    /// Whether the request was over the limit (denied or shadowed): a
    /// request that [passed](Self::passed) over the limit was shadowed.
    ///
    /// In [shadow](crate::RateLimitLayer::shadow) mode, a request over the
    /// limit is passed on, and its decision says so:
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
    ///     .shadow(true)
    ///     .decision_in(DecisionIn::Response);
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// // (passed, over the limit)
    /// let outcome = |response: &axum::response::Response| {
    ///     let decision = response.extensions().get::<Decision>()?;
    ///     Some((decision.passed(), decision.over_limit()))
    /// };
    ///
    /// let first = app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
    /// assert_eq!(outcome(&first), Some((true, false)), "allowed");
    /// let second = app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// assert_eq!(second.status(), StatusCode::OK);
    /// assert_eq!(outcome(&second), Some((true, true)), "shadowed");
    /// # }
    /// ```
    pub fn over_limit(&self) -> bool {
        self.outcome != Outcome::Allowed
    }

    /// Whether the request's hit was handed back, under
    /// [`count_if`](crate::RateLimitLayer::count_if): its answer did not
    /// count, or it was denied. [`count`](Self::count) then no longer
    /// includes it.
    ///
    /// The refund is issued when the response is produced and lands in the
    /// backend then (the memory backend) or shortly after, in the hit's own
    /// window only, unless the backend fails it. The decision handed to
    /// [`on_decision`](crate::RateLimitLayer::on_decision) is made before
    /// any refund, so it always says `false`.
    ///
    /// See the [example](Decision#example).
    pub fn refunded(&self) -> bool {
        self.refunded
    }

    /// Whether a matching [`reset_if`](crate::RateLimitLayer::reset_if)
    /// cleared the key's counter once the service answered: the count then
    /// reads 0, as the counter does once the clear lands.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Decision, Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("login", Quota::new(5, Duration::from_secs(900)).unwrap())
    ///     .reset_if(|res| res.status() == StatusCode::OK);
    /// let app = Router::new().route("/", get(|| async { "welcome" })).layer(layer);
    /// let response = app.oneshot(Request::new(Body::empty())).await.unwrap();
    /// let decision = response.extensions().get::<Decision>().unwrap();
    /// assert!(decision.cleared() && decision.count() == 0);
    /// # }
    /// ```
    pub fn cleared(&self) -> bool {
        self.cleared
    }

    /// Whether the insurance limiter decided: the backend was out (down,
    /// timed out, its breaker open, or full) under
    /// [`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance), and
    /// the request was counted in this process's memory against this
    /// instance's [`Share`](crate::Share) of the limit, which
    /// [`limit`](Self::limit) is.
    pub fn insured(&self) -> bool {
        self.insured
    }

    /// Whether the request's cost (see
    /// [`cost_fn`](crate::RateLimitLayer::cost_fn)) is above its quota's
    /// [limit](Self::limit): it is denied whatever the count, and would be in
    /// any window, so waiting does not help. Nothing was counted: the
    /// store is asked only what the key's counter holds, which
    /// [`count`](Self::count) is (the limit when the store could not
    /// answer), so [`remaining`](Self::remaining) and the `RateLimit`
    /// header show what is truly left. The denial carries no `Retry-After`
    /// (gRPC: no `RetryInfo`), since no wait brings room for it, and is
    /// denied whatever the store's health or the failure policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
    /// use tower::ServiceExt;
    /// use tower_pinned_window::{Decision, Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = RateLimitLayer::new("rows", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .cost_fn(|req| req.headers().get("x-rows").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1));
    /// let app = Router::new().route("/", get(|| async { "rows" })).layer(layer);
    /// let too_big = Request::get("/").header("x-rows", "500").body(Body::empty()).unwrap();
    /// let denied = app.oneshot(too_big).await.unwrap();
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert!(denied.headers().get("retry-after").is_none(), "waiting would not help");
    /// // Nothing was spent: all 100 are left.
    /// assert_eq!(denied.headers()["ratelimit"], "\"rows\";r=100;t=60");
    /// let decision = denied.extensions().get::<Decision>().unwrap();
    /// assert!(decision.never_fits() && decision.remaining() == 100);
    /// # }
    /// ```
    pub fn never_fits(&self) -> bool {
        self.never_fits
    }

    /// The request's `cost` was handed back: it no longer counts.
    pub(crate) fn refund(&mut self, cost: u64) {
        self.count = self.count.saturating_sub(cost);
        self.refunded = true;
    }

    /// The key's counter was cleared.
    pub(crate) fn clear(&mut self) {
        self.count = 0;
        self.cleared = true;
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("name", &self.name())
            .field("policy", &self.policy())
            .field("route", &self.route())
            .field("limit", &self.limit)
            .field("count", &self.count)
            .field("reset", &self.reset)
            .field("outcome", &self.outcome)
            .field("refunded", &self.refunded)
            .field("cleared", &self.cleared)
            .field("never_fits", &self.never_fits)
            .finish()
    }
}

/// What a handler is answered when it asks for a [`Decision`] its request
/// does not carry: the status and a body that names the setter.
#[cfg(feature = "axum")]
const MISSING: (http::StatusCode, &str) = (
    http::StatusCode::INTERNAL_SERVER_ERROR,
    "no rate-limit `Decision` in this request: the layer puts one in a passed \
     request only when told to, with `RateLimitLayer::decision_in` \
     (`.decision_in(DecisionIn::Request)`). A request the layer passed without \
     counting it (skipped, allowlisted, or passed under `FailurePolicy::FailOpen` \
     or with `allow_missing_key(true)`) has none: extract `Option<Decision>` to allow for it.",
);

/// A handler takes the decision on its request as an extractor, when the
/// layer was told to put it there
/// ([`DecisionIn::Request`](DecisionIn::Request)). A request without one
/// is answered `500`, with a body that names the setter, and logged; take
/// `Option<Decision>` for a route whose requests may pass without one. See
/// the [example](DecisionIn#example).
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Decision {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().cloned().ok_or_else(|| {
            tracing::error!("{}", MISSING.1);
            MISSING
        })
    }
}

/// `Option<Decision>`: the decision on the request, if it carries one.
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for Decision {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned())
    }
}

/// Where a layer puts the [`Decision`] on a request it passes on (see
/// [`RateLimitLayer::decision_in`](crate::RateLimitLayer::decision_in)). A
/// denial always carries its decision in the response's extensions, and a
/// request that carries [`WantDecision`] always gets it in its response's.
///
/// The default, [`Asked`](Self::Asked), puts it nowhere unless asked for,
/// so a server that never reads it pays nothing for it. A handler that
/// reads it needs [`Request`](Self::Request). Measured by
/// `bash bench/allocs.sh` (the repository's `bench/`), through an axum
/// router: none a passed request for the decision at the default, against
/// one for [`Request`](Self::Request) and three for
/// [`Response`](Self::Response).
///
/// # Example
///
/// A handler reads the decision from the request, as its layer was told:
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let quota = Quota::new(5, Duration::from_secs(60)).unwrap();
/// let handler = |decision: Decision| async move { format!("{} left", decision.remaining()) };
/// let app = Router::new()
///     .route("/", get(handler))
///     .route_layer(RateLimitLayer::new("api", quota).decision_in(DecisionIn::Request));
/// let response = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// // Asked for by nobody: not in the response.
/// assert!(response.extensions().get::<Decision>().is_none());
/// let body = axum::body::to_bytes(response.into_body(), 64).await.unwrap();
/// assert_eq!(body, "4 left");
///
/// // Without the setter, the handler is answered 500 with a body that
/// // names it.
/// let app = Router::new()
///     .route("/", get(handler))
///     .route_layer(RateLimitLayer::new("api", quota));
/// let response = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
/// assert!(std::str::from_utf8(&body).unwrap().contains(".decision_in(DecisionIn::Request)"));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DecisionIn {
    /// In the response's extensions, on every passed request: three
    /// allocations a request when the response has no extensions yet. The
    /// handler does not get it.
    Response,
    /// In the request's extensions, for the handler (the `Decision`
    /// extractor, or `axum::Extension<Decision>`): one allocation a request
    /// under axum. The response carries it only when asked for
    /// ([`WantDecision`]).
    Request,
    /// Nowhere, unless the request asks for it with [`WantDecision`]: the
    /// response then carries it. Nothing is allocated for a decision nobody
    /// reads. The default.
    #[default]
    Asked,
}

impl DecisionIn {
    /// Where the decision on the request with `extensions` goes.
    #[inline(always)]
    pub(crate) fn carry(self, extensions: &Extensions) -> Carry {
        let wanted = || extensions.get::<WantDecision>().is_some();
        match self {
            Self::Response => Carry {
                request: false,
                response: true,
            },
            Self::Request => Carry {
                request: true,
                response: wanted(),
            },
            Self::Asked => Carry {
                request: false,
                response: wanted(),
            },
        }
    }
}

/// Asks every limiter a request goes through to put its [`Decision`] in the
/// response's extensions, whatever its [`DecisionIn`]: an outer layer that
/// reads the decision inserts this into the request's extensions. It is
/// zero-sized, so inserting it allocates nothing once the request has
/// extensions (under axum it has).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer, outcome::WantDecision};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::new("api", Quota::new(5, Duration::from_secs(60)).unwrap())
///     .decision_in(DecisionIn::Asked);
/// let app = Router::new().route("/", get(|| async { StatusCode::NO_CONTENT })).layer(layer);
///
/// let unasked = app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
/// assert!(unasked.extensions().get::<Decision>().is_none());
///
/// // What an outer layer does on the way in.
/// let mut request = Request::new(Body::empty());
/// request.extensions_mut().insert(WantDecision);
/// let asked = app.oneshot(request).await.unwrap();
/// assert_eq!(asked.extensions().get::<Decision>().unwrap().remaining(), 3);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WantDecision;

/// Where one passed request's decision goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Carry {
    /// Into the request's extensions, for the service.
    pub(crate) request: bool,
    /// Into the response's extensions.
    pub(crate) response: bool,
}

impl Carry {
    /// Whether the decision goes anywhere.
    #[inline]
    pub(crate) fn anywhere(self) -> bool {
        self.request || self.response
    }
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn ceil_secs(duration: Duration) -> u64 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_never_reach_zero() {
        let cases = [
            ("zero", Duration::ZERO, 1),
            ("1 ns", Duration::from_nanos(1), 1),
            ("exactly 1 s", Duration::from_secs(1), 1),
            ("1.001 s", Duration::from_millis(1001), 2),
            ("9.5 s", Duration::from_millis(9500), 10),
            ("15 min", Duration::from_secs(900), 900),
        ];
        for (name, duration, want) in cases {
            assert_eq!(ceil_secs(duration), want, "{name}");
        }
    }

    #[test]
    fn outcomes() {
        let label = Arc::new(Label {
            limiter: "n".into(),
            policy: "n".into(),
            headers: QuotaHeaders::None,
        });
        let d = |count, shadow| {
            Decision::new(
                label.clone(),
                None,
                3,
                count,
                Duration::from_secs(1),
                shadow,
            )
        };
        assert_eq!(d(3, false).outcome(), Outcome::Allowed);
        assert_eq!(d(3, false).remaining(), 0);
        assert_eq!(d(4, false).outcome(), Outcome::Denied);
        assert!(!d(4, false).passed());
        assert_eq!(d(4, true).outcome(), Outcome::Shadowed);
        assert!(d(4, true).passed() && d(4, true).over_limit());
    }
}
