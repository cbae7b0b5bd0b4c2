//! Which quotas a request is checked against: the layer's quota, a route's
//! or a gRPC method's, or one a closure picks (a tier), plus the quotas added
//! with [`also`](crate::RateLimitLayer::also), all hit in one backend call.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use http::{Extensions, HeaderMap, Method, Request, Uri};
use smallvec::SmallVec;

use crate::Quota;
use crate::backend::{Counter, Hit, Hits};
use crate::decision::Decision;
use crate::response::{HeaderStyle, Headers, is_grpc};

/// The parts of a request a quota can be chosen by; see
/// [`RateLimitLayer::quota_by`](crate::RateLimitLayer::quota_by).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers (gRPC metadata included).
    pub headers: &'a HeaderMap,
    /// The extensions (axum's `MatchedPath`, your authentication's user).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    pub(crate) fn of<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The route: axum's `MatchedPath` or, for gRPC, the method path.
    pub fn route(&self) -> Option<&'a str> {
        #[cfg(feature = "axum")]
        if let Some(path) = self.extensions.get::<axum::extract::MatchedPath>() {
            return Some(path.as_str());
        }
        is_grpc(self.headers).then(|| self.uri.path())
    }
}

pub(crate) type QuotaBy = Arc<dyn Fn(&RequestHead<'_>) -> Option<Quota> + Send + Sync>;

/// The quotas one request is checked against, with their counters' names
/// and headers, built once.
#[derive(Debug)]
pub(crate) struct Policy {
    slots: SmallVec<[(Arc<str>, Quota); 2]>,
    pub(crate) headers: Headers,
}

impl Policy {
    fn new(style: HeaderStyle, slots: SmallVec<[(Arc<str>, Quota); 2]>) -> Self {
        let named: Vec<(&str, Quota)> = slots.iter().map(|(n, q)| (&**n, *q)).collect();
        Self {
            headers: Headers::new(style, &named),
            slots,
        }
    }

    pub(crate) fn counters(&self) -> SmallVec<[Counter<'_>; 2]> {
        self.slots
            .iter()
            .map(|(namespace, quota)| Counter {
                namespace,
                quota: *quota,
            })
            .collect()
    }

    /// The binding decision, and the index of its quota: of the quotas over
    /// their limit, the one that resets last; otherwise the one with the
    /// fewest hits left.
    pub(crate) fn decide(&self, hits: &Hits, shadow: bool) -> Option<(usize, Decision)> {
        let mut best: Option<(usize, &Hit)> = None;
        for (i, (hit, (_, quota))) in hits.iter().zip(&self.slots).enumerate() {
            let over = hit.count > quota.limit();
            let better = match best {
                None => true,
                Some((j, other)) => {
                    let other_over = other.count > self.slots[j].1.limit();
                    match (over, other_over) {
                        (true, false) => true,
                        (false, true) => false,
                        (true, true) => hit.reset > other.reset,
                        (false, false) => {
                            quota.limit().saturating_sub(hit.count)
                                < self.slots[j].1.limit().saturating_sub(other.count)
                        }
                    }
                }
            };
            if better {
                best = Some((i, hit));
            }
        }
        let (i, hit) = best?;
        let (name, quota) = &self.slots[i];
        Some((
            i,
            Decision::new(name.clone(), quota.limit(), hit.count, hit.reset, shadow),
        ))
    }
}

/// Every policy a layer can apply, and how to pick one.
pub(crate) struct Policies {
    name: Arc<str>,
    style: HeaderStyle,
    default_quota: Quota,
    also: Vec<Quota>,
    default: Arc<Policy>,
    routes: HashMap<Box<str>, Arc<Policy>>,
    route_quotas: Vec<(Box<str>, Quota)>,
    quota_by: Option<QuotaBy>,
    /// Policies for quotas a `quota_by` closure returned, built on first use.
    chosen: Mutex<HashMap<Quota, Arc<Policy>>>,
}

/// Distinct quotas a `quota_by` closure may return before further ones are
/// built per request instead of kept.
const CHOSEN_CAP: usize = 64;

impl Policies {
    pub(crate) fn new(name: Arc<str>, quota: Quota, style: HeaderStyle) -> Self {
        let mut this = Self {
            default: Arc::new(Policy::new(style, SmallVec::new())),
            name,
            style,
            default_quota: quota,
            also: Vec::new(),
            routes: HashMap::new(),
            route_quotas: Vec::new(),
            quota_by: None,
            chosen: Mutex::default(),
        };
        this.rebuild();
        this
    }

    /// The counter name of `quota`: the layer's name for its own quota,
    /// `name:LIMIT/WINDOWms` for any other, so equal quotas share counters
    /// and different ones never do.
    fn counter_name(&self, quota: Quota) -> Arc<str> {
        if quota == self.default_quota {
            self.name.clone()
        } else {
            format!(
                "{}:{}/{}ms",
                self.name,
                quota.limit(),
                quota.window().as_millis()
            )
            .into()
        }
    }

    fn build(&self, primary: Quota) -> Arc<Policy> {
        let mut slots: SmallVec<[(Arc<str>, Quota); 2]> = SmallVec::new();
        for quota in std::iter::once(primary).chain(self.also.iter().copied()) {
            if !slots.iter().any(|(_, q)| *q == quota) {
                slots.push((self.counter_name(quota), quota));
            }
        }
        Arc::new(Policy::new(self.style, slots))
    }

    fn rebuild(&mut self) {
        self.default = self.build(self.default_quota);
        self.routes = self
            .route_quotas
            .iter()
            .map(|(route, quota)| (route.clone(), self.build(*quota)))
            .collect();
        self.chosen = Mutex::default();
    }

    pub(crate) fn set_style(&mut self, style: HeaderStyle) {
        self.style = style;
        self.rebuild();
    }

    pub(crate) fn style(&self) -> HeaderStyle {
        self.style
    }

    pub(crate) fn add_also(&mut self, quota: Quota) {
        self.also.push(quota);
        self.rebuild();
    }

    pub(crate) fn add_route(&mut self, route: &str, quota: Quota) {
        self.route_quotas.retain(|(r, _)| &**r != route);
        self.route_quotas.push((route.into(), quota));
        self.rebuild();
    }

    pub(crate) fn set_quota_by(&mut self, quota_by: QuotaBy) {
        self.quota_by = Some(quota_by);
    }

    pub(crate) fn default_quota(&self) -> Quota {
        self.default_quota
    }

    /// The policy for a request.
    pub(crate) fn select<B>(&self, request: &Request<B>) -> Arc<Policy> {
        if self.quota_by.is_none() && self.routes.is_empty() {
            return self.default.clone();
        }
        let head = RequestHead::of(request);
        if let Some(quota) = self.quota_by.as_ref().and_then(|f| f(&head)) {
            if quota == self.default_quota {
                return self.default.clone();
            }
            let mut chosen = self.chosen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(policy) = chosen.get(&quota) {
                return policy.clone();
            }
            let policy = self.build(quota);
            if chosen.len() < CHOSEN_CAP {
                chosen.insert(quota, policy.clone());
            }
            return policy;
        }
        head.route()
            .and_then(|route| self.routes.get(route))
            .unwrap_or(&self.default)
            .clone()
    }
}

impl Clone for Policies {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            style: self.style,
            default_quota: self.default_quota,
            also: self.also.clone(),
            default: self.default.clone(),
            routes: self.routes.clone(),
            route_quotas: self.route_quotas.clone(),
            quota_by: self.quota_by.clone(),
            chosen: Mutex::default(),
        }
    }
}

impl fmt::Debug for Policies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policies")
            .field("quota", &self.default_quota)
            .field("also", &self.also)
            .field("routes", &self.route_quotas)
            .field("quota_by", &self.quota_by.is_some())
            .finish()
    }
}
