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
/// backend were down; see [`timeout`](RateLimitLayer::timeout).
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
/// Every option, with examples, is in the guides (Markdown files in the
/// repository): `docs/usage.md` (the options table), `docs/quotas.md`,
/// `docs/client-identity.md`, `docs/outcomes.md`, `docs/costs.md` and
/// `docs/headers.md`.
///
/// # The response body must implement `Default`
///
/// A denial is answered with an empty body of the service's own body type,
/// so the wrapped service's `Response<ResBody>` needs `ResBody: Default`.
/// tower-http's `TraceLayer` and `CompressionLayer` wrap the body in types
/// without it: put this layer *inside* them (below them in a
/// `ServiceBuilder`), where the trace also records the 429s. Guide:
/// `docs/usage.md#with-other-layers-the-response-body-must-implement-default`.
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
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`](crate::name::MAX_NAME_LEN)
    /// characters from `A-Z a-z 0-9 _ - . :`. Use [`try_new`](Self::try_new) for
    /// a name known only at run time.
    #[track_caller]
    pub fn new(name: &'static str, quota: Quota) -> Self {
        match Self::try_new(name, quota) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`new`](Self::new), for a name known only at run time. Guide:
    /// `docs/usage.md#values-read-at-run-time`.
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
    /// For a closure, use [`key_fn`](Self::key_fn). Guide:
    /// `docs/client-identity.md`.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayer<K2, Bk, D, C> {
        RateLimitLayer {
            key,
            core: self.core,
            charge: PhantomData,
        }
    }

    /// Charge each request to the key the closure `key` reads from the
    /// request's head; its argument type is inferred. Guide:
    /// `docs/usage.md#your-own-key-your-own-denial`.
    pub fn key_fn<F>(self, key: F) -> RateLimitLayer<F, Bk, D, C>
    where
        F: Fn(&RequestHead<'_>) -> Result<Key, KeyError>,
    {
        self.key(key)
    }

    /// Keep counters in `backend` instead of this layer's own
    /// [`MemoryBackend`]. Layers given clones of one backend share counters
    /// only where their names are equal. Guide:
    /// `docs/usage.md#sharing-a-backend-reading-a-counter`.
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
    /// Guide: `docs/costs.md`.
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
    /// an empty 429. `Retry-After` and the rate-limit headers are added to it,
    /// each unless the response already has it. The closure's argument type is
    /// inferred. Guide: `docs/usage.md#your-own-key-your-own-denial`.
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
    /// See the [example](HeaderStyle#example); guide: `docs/headers.md`.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.core.settings.policies.set_style(style);
        self
    }

    /// Check every request against `quota` too, in the same backend call: a
    /// request over any of its quotas is denied. Clients see it under the name a
    /// [`NamedQuota`] gives it, or `"<layer> <limit>/<window>"` for a plain
    /// [`Quota`]. Guide: `docs/quotas.md#more-quotas-also`.
    ///
    /// # Panics
    /// When a fixed [`cost`](Self::cost) set before it is above `quota`'s
    /// limit: every request would be denied.
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
    /// (add the layer with `route_layer`) or a gRPC method. Quotas added with
    /// [`also`](Self::also) still apply. Guide:
    /// `docs/quotas.md#per-route-or-method-route_quota`.
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

    /// Pick a request's quota with `choose` (a tier your authentication
    /// attached, say); `None` falls back to the route's quota or the layer's.
    /// Quotas added with [`also`](Self::also) still apply. Guide:
    /// `docs/quotas.md#tiers-quota_by`.
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

    /// Let the requests `skip` picks bypass the limiter: they are not counted,
    /// get no rate-limit headers and no [`Decision`], and their key is never
    /// read. Each call adds a predicate; the closure's argument type is
    /// inferred. Guide: `docs/client-identity.md#skipping-requests`.
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
    /// `docs/client-identity.md#skipping-requests`.
    pub fn allowlist(self, allowlist: Allowlist) -> Self {
        self.skip_if(move |req| allowlist.contains(req))
    }

    /// Count a request only if the service's answer says so: `counts` reads
    /// the answer's [`ResponseHead`], and a hit it rejects is handed back
    /// ([`Backend::refund`]) in every quota, as a denied request's is. The
    /// closure's argument type is inferred; a later call replaces an earlier one.
    /// Guide (what counts, and when): `docs/outcomes.md`.
    pub fn count_if<F>(mut self, counts: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.core.settings.count_if = Some(Arc::new(counts));
        self
    }

    /// Count only the answers `which` names: [`count_if`](Self::count_if)
    /// with one of the usual choices ([`CountOnly`]). Guide: `docs/outcomes.md`.
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
    /// only starts if the backend does not answer at once. Guide:
    /// `docs/usage.md#values-read-at-run-time`.
    ///
    /// # Panics
    /// When `timeout` is zero (every call would time out). Use
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
    /// `docs/usage.md#sharing-a-backend-reading-a-counter`.
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

    /// Every request costs `cost` in each of its quotas, instead of 1: it is
    /// admitted only if its whole cost fits in every quota, and a denied request
    /// spends nothing. A cost of 0 checks without counting. Guide:
    /// `docs/costs.md#request-cost`.
    ///
    /// # Panics
    /// When `cost` is above the limit of a quota the layer has (its own, its
    /// routes', those added with [`also`](Self::also)), or the backend does not
    /// support spending. Use [`try_cost`](Self::try_cost) for a cost read at run
    /// time.
    #[track_caller]
    pub fn cost(self, cost: u64) -> Self {
        match self.try_cost(cost) {
            Ok(layer) => layer,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`cost`](Self::cost), for a cost read at run time.
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

    /// Each request costs what `cost` reads from its head, in each of its
    /// quotas: [`cost`](Self::cost), per request. A cost above a quota's limit
    /// is denied without counting ([`Decision::never_fits`]). It runs on every
    /// request: keep it cheap. Guide: `docs/costs.md#request-cost`.
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

    /// Charge each answer what `charge` reads from its [`ResponseEnd`] once its
    /// body has ended (LLM tokens, rows, bytes), in every counter its request
    /// was counted in. The answers' bodies become [`Metered`](crate::Metered).
    /// Guide: `docs/costs.md#response-cost-charge`.
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

    /// Lock a key out for `duration` from its first request that does not fit:
    /// it and every request after it are denied until the lockout ends, which
    /// more attempts never extend. Sub-millisecond parts round up, as a
    /// [`Window`]'s do. Guide: `docs/costs.md#lockouts-block_for`.
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
    /// failures per window". Key by username *and* IP: read the trade-off in
    /// the guide, `docs/costs.md#reset-on-success-reset_if`.
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
