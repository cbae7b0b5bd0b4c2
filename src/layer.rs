//! [`RateLimitLayer`]: the configuration, and the middleware's constructor.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower_layer::Layer;

use crate::backend::{Backend, MemoryBackend};
use crate::decision::Decision;
use crate::key::GlobalKey;
use crate::policy::{Policies, RequestHead};
use crate::response::{DefaultDeny, HeaderStyle};
use crate::service::RateLimit;
use crate::{ConfigError, Quota};

/// The longest layer name, in bytes.
pub const MAX_NAME_LEN: usize = 32;

/// How long a backend call may take before the request is handled as if the
/// backend were down.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// What a request gets when the backend is down, slow, or full.
///
/// Corrupt state is not an outage: whatever the policy, a request whose
/// counter is corrupt is answered with 500 (gRPC: INTERNAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Answer `503 Service Unavailable` with `Retry-After: 1` (gRPC:
    /// UNAVAILABLE). Nothing gets through uncounted.
    #[default]
    FailClosed,
    /// Let the request through uncounted, with a warning in the log at most
    /// once every few seconds.
    FailOpen,
}

/// What a request gets when its key cannot be extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Answer with the status the [`KeyError`](crate::key::KeyError) names:
    /// 400 for a request that lacks its key, 500 for a server that is not set
    /// up for the extractor (gRPC: INVALID_ARGUMENT or INTERNAL).
    #[default]
    Reject,
    /// Let the request through without counting it.
    Allow,
}

/// A callback run on every decision, for metrics.
pub(crate) type Observer = Arc<dyn Fn(&Decision) + Send + Sync>;

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
pub struct RateLimitLayer<K = GlobalKey, Bk = MemoryBackend, D = DefaultDeny> {
    key: K,
    core: Core<Bk, D>,
}

/// The configuration shared by a service and its futures.
#[derive(Clone)]
pub(crate) struct Core<Bk, D> {
    pub(crate) backend: Bk,
    pub(crate) deny: D,
    pub(crate) settings: Settings,
}

/// Everything in [`Core`] that does not change the layer's type.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) name: Arc<str>,
    pub(crate) policies: Policies,
    pub(crate) failure: FailurePolicy,
    pub(crate) missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) shadow: bool,
    pub(crate) observer: Option<Observer>,
    /// Bounds the warnings about backend failures.
    pub(crate) warn_gate: Arc<WarnGate>,
    /// Bounds the log lines about requests without a usable key.
    pub(crate) key_gate: Arc<WarnGate>,
}

impl RateLimitLayer {
    /// A layer named `name` that limits every request to `quota` in one
    /// global budget, counted in a fresh [`MemoryBackend`]. Pick the key with
    /// [`key`](Self::key) and the store with [`backend`](Self::backend).
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`] characters from
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
    /// # Errors
    /// [`ConfigError::InvalidName`] for a name that is empty, longer than
    /// [`MAX_NAME_LEN`], or has a character outside `A-Z a-z 0-9 _ - . :`.
    pub fn try_new(name: impl Into<String>, quota: Quota) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        // These characters are a subset of an sf-string's, so the name can
        // go into the RateLimit headers as it is.
        if !valid {
            return Err(ConfigError::InvalidName(name));
        }
        let name: Arc<str> = name.into();
        let policies = Policies::new(name.clone(), quota, HeaderStyle::default());
        Ok(Self {
            key: GlobalKey,
            core: Core {
                backend: MemoryBackend::new(),
                deny: DefaultDeny,
                settings: Settings {
                    name,
                    policies,
                    failure: FailurePolicy::default(),
                    missing_key: OnMissingKey::default(),
                    timeout: DEFAULT_TIMEOUT,
                    shadow: false,
                    observer: None,
                    warn_gate: Arc::default(),
                    key_gate: Arc::default(),
                },
            },
        })
    }
}

impl<K, Bk, D> RateLimitLayer<K, Bk, D> {
    /// Charge each request to the key `key` extracts (see [`crate::key`]).
    pub fn key<K2>(self, key: K2) -> RateLimitLayer<K2, Bk, D> {
        RateLimitLayer {
            key,
            core: self.core,
        }
    }

    /// Keep counters in `backend` instead of this layer's own
    /// [`MemoryBackend`]. Layers given clones of one backend share counters
    /// only where their names are equal.
    pub fn backend<Bk2: Backend>(self, backend: Bk2) -> RateLimitLayer<K, Bk2, D> {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend,
                deny: self.core.deny,
                settings: self.core.settings,
            },
        }
    }

    /// Answer denied (non-gRPC) requests with `deny` instead of an empty 429;
    /// `Retry-After` and the rate-limit headers are added to its response.
    pub fn deny_with<D2>(self, deny: D2) -> RateLimitLayer<K, Bk, D2> {
        RateLimitLayer {
            key: self.key,
            core: Core {
                backend: self.core.backend,
                deny,
                settings: self.core.settings,
            },
        }
    }

    /// Which rate-limit headers responses carry (default: the IETF fields).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.core.settings.policies.set_style(style);
        self
    }

    /// Check every request against `quota` too, in the same backend call:
    /// `Quota` 5 per minute *and* (`also`) 100 per day. A request over any of
    /// its quotas is denied; every quota counts every request. Each quota
    /// other than the layer's own has its own counters, named
    /// `name:LIMIT/WINDOWms`.
    pub fn also(mut self, quota: Quota) -> Self {
        self.core.settings.policies.add_also(quota);
        self
    }

    /// Use `quota` instead of the layer's for one route: axum's matched path
    /// (`/users/{id}`; add the layer with `route_layer`) or a gRPC method
    /// (`/auth.Auth/Login`). Quotas added with [`also`](Self::also) still
    /// apply. Routes with equal quotas share counters; key by
    /// [`RouteKey`](crate::key::RouteKey) too to keep them apart.
    pub fn route_quota(mut self, route: &str, quota: Quota) -> Self {
        self.core.settings.policies.add_route(route, quota);
        self
    }

    /// Pick a request's quota with `choose` (a tier looked up from an API
    /// key, say); `None` falls back to the route's quota or the layer's.
    /// Quotas added with [`also`](Self::also) still apply.
    pub fn quota_by(
        mut self,
        choose: impl Fn(&RequestHead<'_>) -> Option<Quota> + Send + Sync + 'static,
    ) -> Self {
        self.core.settings.policies.set_quota_by(Arc::new(choose));
        self
    }

    /// What requests get when the backend is down, slow or full (default:
    /// [`FailurePolicy::FailClosed`]).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.core.settings.failure = policy;
        self
    }

    /// What requests get when no key can be extracted (default:
    /// [`OnMissingKey::Reject`]).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.core.settings.missing_key = policy;
        self
    }

    /// How long one backend call may take (default [`DEFAULT_TIMEOUT`]);
    /// past it the request is handled under the [`FailurePolicy`]. The timer
    /// only starts if the backend does not answer at once, so the in-memory
    /// backend never arms it.
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`] for zero.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        self.core.settings.timeout = timeout;
        Ok(self)
    }

    /// Shadow (dry-run) mode: count and set headers, but never deny. Requests
    /// over the limit pass with [`Outcome::Shadowed`](crate::Outcome), so a
    /// new limit can be watched before it is enforced.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.core.settings.shadow = shadow;
        self
    }

    /// Run `observer` on every decision (allowed, denied, shadowed), for
    /// metrics. It runs on the request path: keep it cheap.
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
    /// [`reset`](Backend::reset).
    pub fn backend_ref(&self) -> &Bk {
        &self.core.backend
    }
}

impl<K: Clone, Bk: Clone, D: Clone> Clone for RateLimitLayer<K, Bk, D> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            core: self.core.clone(),
        }
    }
}

impl<K: fmt::Debug, Bk: fmt::Debug, D> fmt::Debug for RateLimitLayer<K, Bk, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.key)
            .field("core", &self.core)
            .finish()
    }
}

impl<Bk: fmt::Debug, D> fmt::Debug for Core<Bk, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("Core")
            .field("name", &s.name)
            .field("policies", &s.policies)
            .field("backend", &self.backend)
            .field("headers", &s.policies.style())
            .field("failure", &s.failure)
            .field("missing_key", &s.missing_key)
            .field("timeout", &s.timeout)
            .field("shadow", &s.shadow)
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone, Bk: Clone, D: Clone> Layer<S> for RateLimitLayer<K, Bk, D> {
    type Service = RateLimit<S, K, Bk, D>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.key.clone(), Arc::new(self.core.clone()))
    }
}

/// Lets a warning through at most once per [`WarnGate::PERIOD`], counting the
/// ones held back.
#[derive(Debug, Default)]
pub(crate) struct WarnGate {
    /// Milliseconds since `UNIX_EPOCH` of the last warning let through.
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnGate {
    const PERIOD_MS: u64 = 5_000;

    /// `Some(held back since the last one)` when a warning may be logged now.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= Self::PERIOD_MS
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_warn_gate_admits_one_per_period() {
        let gate = WarnGate::default();
        assert_eq!(gate.admit(), Some(0));
        assert_eq!(gate.admit(), None);
        assert_eq!(gate.admit(), None);
        assert_eq!(gate.suppressed.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn zero_timeout_is_rejected() {
        let q = Quota::new(1, Duration::from_secs(1)).unwrap();
        assert_eq!(
            RateLimitLayer::new("t", q)
                .timeout(Duration::ZERO)
                .unwrap_err(),
            ConfigError::ZeroTimeout
        );
    }
}
