//! Which quotas a request is checked against: the layer's quota, a route's
//! or a gRPC method's, or one a closure picks (a tier), plus the quotas added
//! with [`also`](crate::RateLimitLayer::also), all hit in one backend call;
//! and the names clients see for them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use arc_swap::ArcSwapOption;
use smallvec::SmallVec;

use crate::backend::{Backend, Counter, Hit, Hits, LimitScope, StoredLimits};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::Key;
use crate::label::{Label, QuotaHeaders};
use crate::limits::{LimitBook, Page};
use crate::metrics::QuotaMetrics;
use crate::name::{is_policy_name, is_sf_string_byte};
use crate::quota::{Quota, Share};
use crate::request::{RequestHead, Route};
use crate::response::{HeaderStyle, quota_headers};

/// A quota with the name clients see for it: the policy name in the
/// `RateLimit` and `RateLimit-Policy` headers, and
/// [`Decision::policy`](crate::Decision::policy).
///
/// [`route_quota`](crate::RateLimitLayer::route_quota),
/// [`also`](crate::RateLimitLayer::also) and
/// [`quota_by`](crate::RateLimitLayer::quota_by) take a `NamedQuota` or a
/// plain [`Quota`]. A plain quota is named by the layer: a route's quota
/// `"<layer> <route>"` (`"api /auth.Auth/Login"`), any other
/// `"<layer> <limit>/<window>"` (`"api 1000/1h"`), and a quota equal to the
/// layer's own is the layer's policy, named as the layer.
///
/// A name only changes what clients see: counters are kept per quota, so
/// renaming a quota keeps its counts.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{NamedQuota, Quota};
///
/// let login = NamedQuota::new("login", Quota::new(5, Duration::from_secs(900)).unwrap());
/// assert_eq!(login.name(), Some("login"));
/// assert_eq!(login.quota().limit(), 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use]
pub struct NamedQuota {
    quota: Quota,
    name: Option<Arc<str>>,
}

impl NamedQuota {
    /// `quota`, named `name`.
    ///
    /// # Panics
    /// When `name` is empty or has a character outside printable ASCII
    /// (space to `~`, what an sf-string holds), like
    /// [`http::HeaderValue::from_static`] on a bad literal. Use
    /// [`try_new`](Self::try_new) for a name known only at run time.
    ///
    /// See the [example](NamedQuota#example).
    #[track_caller]
    pub fn new(name: &'static str, quota: Quota) -> Self {
        match Self::try_new(name, quota) {
            Ok(named) => named,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`new`](Self::new), for a name known only at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::{ConfigError, NamedQuota, Quota};
    ///
    /// let quota = Quota::new(1000, Duration::from_secs(3600)).unwrap();
    /// let tier = format!("{} tier", "pro");
    /// assert_eq!(NamedQuota::try_new(tier, quota).unwrap().name(), Some("pro tier"));
    /// assert!(matches!(
    ///     NamedQuota::try_new("caf\u{e9}", quota),
    ///     Err(ConfigError::InvalidPolicyName(_))
    /// ));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::InvalidPolicyName`] for a name that is empty or has a
    /// character outside printable ASCII.
    pub fn try_new(name: impl Into<String>, quota: Quota) -> Result<Self, ConfigError> {
        let name = name.into();
        if !is_policy_name(&name) {
            return Err(ConfigError::InvalidPolicyName(name));
        }
        Ok(Self {
            quota,
            name: Some(name.into()),
        })
    }

    /// The quota. See the [example](NamedQuota#example).
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The name given, if any (a plain [`Quota`] has none; the layer names
    /// it). See the [example](Self::try_new).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// A quota with no name of its own: the layer names it.
impl From<Quota> for NamedQuota {
    fn from(quota: Quota) -> Self {
        Self { quota, name: None }
    }
}

pub(crate) type QuotaBy = Arc<dyn Fn(&RequestHead<'_>) -> Option<NamedQuota> + Send + Sync>;

/// One quota of a policy: the counter it is hit in, what its decisions show
/// of it, and its metric handles (feature `metrics`; zero-sized without).
#[derive(Debug)]
struct Slot {
    namespace: Arc<str>,
    quota: Quota,
    /// The layer's answers may lower the counter ([`Counter::lowers`]).
    lowers: bool,
    label: Arc<Label>,
    metrics: QuotaMetrics,
}

/// The quotas one request is checked against, with their counters' names
/// and headers (in their labels), built once.
#[derive(Debug)]
pub(crate) struct Policy {
    slots: SmallVec<[Slot; 2]>,
}

/// The counter of the quota in `slot`.
#[inline]
fn counter(slot: &Slot) -> Counter<'_> {
    Counter {
        namespace: &slot.namespace,
        quota: slot.quota,
        lowers: slot.lowers,
    }
}

impl Policy {
    /// Counts a hit of `key` on each of the policy's counters in `backend`.
    #[inline]
    pub(crate) fn hit<Bk: Backend>(&self, backend: &Bk, key: &Key) -> Bk::Future {
        self.with_counters(|counters| backend.hit_all(key, counters))
    }

    /// Calls `f` with the policy's counters: the usual one quota's counter
    /// is handed over as a one-element slice, with nothing to build.
    #[inline]
    pub(crate) fn with_counters<R>(&self, f: impl FnOnce(&[Counter<'_>]) -> R) -> R {
        match &self.slots[..] {
            [one] => f(std::slice::from_ref(&counter(one))),
            _ => f(&self.counters()),
        }
    }

    /// The index of the quota that a request of `cost` can never fit, when
    /// there is one: the one with the smallest limit below the cost.
    #[inline]
    pub(crate) fn never_fits(&self, cost: u64) -> Option<usize> {
        let (index, slot) = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, slot)| slot.quota.limit())?;
        (cost > slot.quota.limit()).then_some(index)
    }

    /// The decision on a request of `cost` that the quota at `index` can
    /// never fit (see [`never_fits`](Self::never_fits)), given its `hit` in
    /// the store's spend of that cost, which the store denied (`None`
    /// when the store did not answer).
    #[cold]
    pub(crate) fn never_fitting(
        &self,
        index: usize,
        cost: u64,
        hit: Option<&Hit>,
        shadow: bool,
        route: Option<Route>,
    ) -> Decision {
        let slot = &self.slots[index];
        // The store denies a cost above the limit with a count above it;
        // a hit that is not was never judged (a deny cache answered for
        // another counter): what stands is not known.
        let hit = hit.filter(|hit| hit.count > slot.quota.limit());
        Decision::never_fitting(
            slot.label.clone(),
            route,
            slot.quota.limit(),
            hit.map(|hit| hit.count.saturating_sub(cost)),
            hit.map_or(slot.quota.window().as_duration(), |hit| hit.reset),
            shadow,
        )
    }

    /// The policy the insurance limiter applies while the backend is out:
    /// the same counters, labels and metric handles, each limit cut to
    /// `share` of it.
    #[cold]
    pub(crate) fn insured(&self, share: Share) -> Self {
        let slots = self
            .slots
            .iter()
            .map(|slot| Slot {
                namespace: Arc::clone(&slot.namespace),
                quota: slot.quota.share(share),
                lowers: slot.lowers,
                label: Arc::clone(&slot.label),
                metrics: slot.metrics.clone(),
            })
            .collect();
        Self { slots }
    }

    /// The counters to hit, built straight into the inline buffer for the
    /// usual one or two.
    pub(crate) fn counters(&self) -> SmallVec<[Counter<'_>; 2]> {
        match &self.slots[..] {
            [one] => SmallVec::from_buf_and_len([counter(one), counter(one)], 1),
            [one, two] => SmallVec::from_buf([counter(one), counter(two)]),
            slots => slots.iter().map(counter).collect(),
        }
    }

    /// The hit that decides, and the index of its quota: of the quotas over
    /// their limit, the one that resets last; otherwise the one with the
    /// fewest hits left.
    #[inline]
    pub(crate) fn decisive<'h>(&self, hits: &'h Hits) -> Option<(usize, &'h Hit)> {
        match (hits.as_slice(), &self.slots[..]) {
            // The usual one quota: nothing to choose between.
            ([hit], [_]) => Some((0, hit)),
            _ => self.deciding(hits),
        }
    }

    /// The decision on the deciding `hit` of the quota at `index` (as
    /// [`decisive`](Self::decisive) returned them). `route` is the
    /// request's; `cost` its cost under a layer that spends, whose denied
    /// spend reports what stands plus `max(cost, 1)` (the
    /// [spend contract](crate::backend#costs-lockouts-and-amends)): the
    /// decision shows what stands, as nothing was spent.
    #[inline]
    pub(crate) fn decision(
        &self,
        index: usize,
        hit: &Hit,
        cost: Option<u64>,
        shadow: bool,
        route: Option<Route>,
    ) -> Decision {
        let slot = &self.slots[index];
        let limit = slot.quota.limit();
        match cost {
            Some(cost) if hit.count > limit => Decision::refused(
                slot.label.clone(),
                route,
                limit,
                hit.count.saturating_sub(cost.max(1)),
                hit.reset,
                shadow,
            ),
            _ => Decision::new(
                slot.label.clone(),
                route,
                limit,
                hit.count,
                hit.reset,
                shadow,
            ),
        }
    }

    /// Whether a request whose deciding `hit` is of the quota at `index`
    /// passes with nothing to show for it: within the limit with hits to
    /// spare (so no `Retry-After` to raise), no rate-limit headers, no
    /// metrics recorded.
    #[inline]
    pub(crate) fn passes_unseen(&self, index: usize, hit: &Hit) -> bool {
        let slot = &self.slots[index];
        !QuotaMetrics::RECORDS
            && hit.count < slot.quota.limit()
            && matches!(slot.label.headers, QuotaHeaders::None)
    }

    /// The metric handles of the quota at `index` (as [`decide`](Self::decide)
    /// returned it), which count its decisions.
    #[inline]
    pub(crate) fn quota_metrics(&self, index: usize) -> &QuotaMetrics {
        &self.slots[index].metrics
    }

    /// Of several quotas, the one that decides: any that is over its limit
    /// (the longest wait among them), else the one with the fewest hits left.
    fn deciding<'h>(&self, hits: &'h Hits) -> Option<(usize, &'h Hit)> {
        let mut best: Option<(usize, &Hit)> = None;
        for (i, (hit, slot)) in hits.iter().zip(&self.slots).enumerate() {
            let limit = slot.quota.limit();
            let over = hit.count > limit;
            let better = match best {
                None => true,
                Some((j, other)) => {
                    let other_limit = self.slots[j].quota.limit();
                    let other_over = other.count > other_limit;
                    match (over, other_over) {
                        (true, false) => true,
                        (false, true) => false,
                        (true, true) => hit.reset > other.reset,
                        (false, false) => {
                            limit.saturating_sub(hit.count)
                                < other_limit.saturating_sub(other.count)
                        }
                    }
                }
            };
            if better {
                best = Some((i, hit));
            }
        }
        best
    }
}

/// A quota of a policy being built: the quota, the name clients see, the
/// counter it is counted in.
type Named = (Quota, Arc<str>, Arc<str>);

/// What a policy's first quota is to the layer, which decides its default
/// name.
#[derive(Clone, Copy)]
enum Primary<'a> {
    /// The layer's own quota.
    Layer,
    /// A route's quota.
    Route(&'a str),
    /// A quota `quota_by` picked.
    Tier,
}

/// A counter a layer hits, known when the layer is built
/// ([`Policies::known_counters`]).
#[cfg(feature = "operator")]
#[derive(Debug, Clone)]
pub(crate) struct KnownCounter {
    /// The counter's namespace in the store (never shown to clients).
    pub(crate) namespace: Arc<str>,
    pub(crate) quota: Quota,
    /// The route whose quota it is, for a route quota.
    pub(crate) route: Option<Box<str>>,
}

/// Every policy a layer can apply, and how to pick one.
pub(crate) struct Policies {
    name: Arc<str>,
    style: HeaderStyle,
    default_quota: Quota,
    also: Vec<NamedQuota>,
    default: Arc<Policy>,
    routes: HashMap<Box<str>, Arc<Policy>>,
    route_quotas: Vec<(Box<str>, NamedQuota)>,
    quota_by: Option<QuotaBy>,
    /// The layer has an option whose answers lower counts (a settle, a
    /// refund, a clear): every counter it hits [lowers](Counter::lowers).
    lowers: bool,
    /// Policies for quotas a `quota_by` closure returned, built on first use
    /// and then only read: a request takes the read lock, which never waits
    /// for another reader.
    chosen: RwLock<HashMap<NamedQuota, Arc<Policy>>>,
    /// The layer's limits held in the store, as this process last read
    /// them ([`LimitBook`](crate::LimitBook)).
    stored: Option<Arc<Page>>,
    /// The policy of the layer's stored limit, as last chosen: the requests
    /// it applies to find it with no lock and no hash of the quota. (Keys'
    /// limits differ from key to key: kept here, they would take each
    /// other's place.)
    stored_last: ArcSwapOption<StoredChoice>,
}

/// A stored limit's policy, kept by [`Policies::stored_last`].
struct StoredChoice {
    quota: Quota,
    policy: Arc<Policy>,
}

/// Distinct quotas a `quota_by` closure's policies are kept for. Past it,
/// each new quota takes the place of an old one, so the map stays bounded
/// and the quotas in use keep being found: there is no count past which
/// every request builds its policy.
const CHOSEN_CAP: usize = 1024;

impl Policies {
    pub(crate) fn new(name: Arc<str>, quota: Quota, style: HeaderStyle) -> Self {
        let mut this = Self {
            default: Arc::new(Policy {
                slots: SmallVec::new(),
            }),
            name,
            style,
            default_quota: quota,
            also: Vec::new(),
            routes: HashMap::new(),
            route_quotas: Vec::new(),
            quota_by: None,
            lowers: false,
            chosen: RwLock::default(),
            stored: None,
            stored_last: ArcSwapOption::empty(),
        };
        this.rebuild();
        this
    }

    /// The counter name of a route's or an `also` quota: the layer's name
    /// for the layer's own quota, `name:LIMIT/WINDOWms` for any other, so
    /// equal quotas share counters and different ones never do. (A tier's
    /// counter is the layer's: see `build`.) Clients never see it.
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

    /// The name clients see for `quota`: the one the user gave, the layer's
    /// for the layer's own quota, otherwise a readable default (see
    /// [`NamedQuota`]).
    fn policy_name(&self, quota: &NamedQuota, primary: Primary<'_>) -> Arc<str> {
        if let Some(name) = &quota.name {
            return name.clone();
        }
        if quota.quota == self.default_quota {
            return self.name.clone();
        }
        let mut name = String::with_capacity(self.name.len() + 16);
        name.push_str(&self.name);
        name.push(' ');
        match primary {
            Primary::Route(route) => push_escaped(&mut name, route),
            Primary::Layer | Primary::Tier => push_rate(&mut name, quota.quota),
        }
        name.into()
    }

    fn build(&self, primary: &NamedQuota, kind: Primary<'_>) -> Arc<Policy> {
        // Each distinct counter, with its quota and the name clients see.
        // The layer's quota and every tier `quota_by` picks count in the
        // layer's own counter, so a tier that changes (an upgrade, a
        // downgrade) keeps the count: its limit applies to the count so
        // far, and its window from the key's next window. Equal quotas are
        // one counter: the first one names it.
        let counted = match kind {
            Primary::Layer | Primary::Tier => self.name.clone(),
            Primary::Route(_) => self.counter_name(primary.quota),
        };
        let mut named: SmallVec<[Named; 2]> = SmallVec::new();
        named.push((primary.quota, self.policy_name(primary, kind), counted));
        for quota in &self.also {
            let counted = self.counter_name(quota.quota);
            if named
                .iter()
                .any(|(q, _, n)| *q == quota.quota || *n == counted)
            {
                continue;
            }
            named.push((quota.quota, self.policy_name(quota, Primary::Tier), counted));
        }
        let listed: SmallVec<[(&str, Quota); 2]> =
            named.iter().map(|(q, name, _)| (&**name, *q)).collect();
        let headers = quota_headers(self.style, &listed);
        drop(listed);
        let slots = named
            .into_iter()
            .zip(headers)
            .map(|((quota, name, namespace), headers)| Slot {
                namespace,
                quota,
                lowers: self.lowers,
                label: Arc::new(Label {
                    limiter: self.name.clone(),
                    policy: name,
                    headers,
                }),
                metrics: Default::default(),
            })
            .collect();
        Arc::new(Policy { slots })
    }

    fn rebuild(&mut self) {
        self.default = self.build(&self.default_quota.into(), Primary::Layer);
        self.routes = self
            .route_quotas
            .iter()
            .map(|(route, quota)| (route.clone(), self.build(quota, Primary::Route(route))))
            .collect();
        self.chosen = RwLock::default();
    }

    pub(crate) fn set_style(&mut self, style: HeaderStyle) {
        self.style = style;
        self.rebuild();
    }

    pub(crate) fn style(&self) -> HeaderStyle {
        self.style
    }

    pub(crate) fn add_also(&mut self, quota: NamedQuota) {
        self.also.push(quota);
        self.rebuild();
    }

    pub(crate) fn add_route(&mut self, route: &str, quota: NamedQuota) {
        self.route_quotas.retain(|(r, _)| &**r != route);
        self.route_quotas.push((route.into(), quota));
        self.rebuild();
    }

    /// Whether the layer's answers may lower its counters (see
    /// [`Counter::lowers`]); the policies are built again when it changes.
    pub(crate) fn set_lowers(&mut self, lowers: bool) {
        if self.lowers != lowers {
            self.lowers = lowers;
            self.rebuild();
        }
    }

    pub(crate) fn set_quota_by(&mut self, quota_by: QuotaBy) {
        self.quota_by = Some(quota_by);
    }

    /// The counters known when the layer is built, each once: the layer's
    /// own quota's, those added with `also`, then the routes' (with the
    /// first route that names each). What the operator's service reads,
    /// resets and blocks; a `quota_by` closure's are not among them.
    #[cfg(feature = "operator")]
    pub(crate) fn known_counters(&self) -> Vec<KnownCounter> {
        let mut known: Vec<KnownCounter> = Vec::new();
        let quotas = std::iter::once((self.default_quota, None))
            .chain(self.also.iter().map(|q| (q.quota(), None)))
            .chain(
                self.route_quotas
                    .iter()
                    .map(|(route, q)| (q.quota(), Some(route.clone()))),
            );
        for (quota, route) in quotas {
            if known.iter().any(|k| k.quota == quota) {
                continue;
            }
            known.push(KnownCounter {
                namespace: self.counter_name(quota),
                quota,
                route,
            });
        }
        known
    }

    pub(crate) fn default_quota(&self) -> Quota {
        self.default_quota
    }

    /// The smallest limit among the quotas known when the layer is built:
    /// its own, its routes', and those added with `also` (a `quota_by`
    /// closure's are known only per request).
    pub(crate) fn smallest_limit(&self) -> u64 {
        std::iter::once(self.default_quota)
            .chain(self.also.iter().map(NamedQuota::quota))
            .chain(self.route_quotas.iter().map(|(_, q)| q.quota()))
            .map(|q| q.limit())
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Read the layer's limits from `book` too.
    pub(crate) fn set_book(&mut self, book: &LimitBook) {
        self.stored = Some(book.page(&self.name));
    }

    /// The policy for a request of `key`.
    #[inline]
    pub(crate) fn select(&self, head: &RequestHead<'_>, key: &Key) -> Selected<'_> {
        if let Some(page) = &self.stored {
            let stored = page.current();
            if !stored.is_empty() {
                return self.select_stored(head, key, &stored);
            }
        }
        if self.quota_by.is_none() && self.routes.is_empty() {
            return Selected::Kept(&self.default);
        }
        self.select_among(head)
    }

    /// [`select`](Self::select) under limits held in the store: the key's
    /// stored limit, else its tier's (by name), else the tier as picked,
    /// else the layer's stored limit, for the layer's own counter; a route
    /// quota's request keeps its route's policy.
    fn select_stored(
        &self,
        head: &RequestHead<'_>,
        key: &Key,
        stored: &StoredLimits,
    ) -> Selected<'_> {
        let tier = self.quota_by.as_ref().and_then(|f| f(head));
        let by_key = stored.key(key.as_bytes());
        let quota = match tier {
            Some(tier) => {
                let by_tier = tier
                    .name
                    .as_deref()
                    .and_then(|name| stored.get(LimitScope::Tier(name)));
                NamedQuota {
                    quota: by_key.or(by_tier).unwrap_or(tier.quota),
                    name: tier.name,
                }
            }
            None => {
                if let Some(route) = head.route().and_then(|route| self.routes.get(route)) {
                    return Selected::Kept(route);
                }
                // Shown under the layer's name, as its own quota is.
                let named = |quota| NamedQuota {
                    quota,
                    name: Some(self.name.clone()),
                };
                if let Some(quota) = by_key {
                    return self.chosen_policy(named(quota));
                }
                let Some(quota) = stored.get(LimitScope::Layer) else {
                    return Selected::Kept(&self.default);
                };
                if let Some(last) = &*self.stored_last.load()
                    && last.quota == quota
                {
                    return Selected::Built(Arc::clone(&last.policy));
                }
                let chosen = self.chosen_policy(named(quota));
                self.stored_last.store(Some(Arc::new(StoredChoice {
                    quota,
                    policy: chosen.to_arc(),
                })));
                return chosen;
            }
        };
        self.chosen_policy(quota)
    }

    /// [`select`](Self::select), for a layer with route or tier quotas.
    fn select_among(&self, head: &RequestHead<'_>) -> Selected<'_> {
        if let Some(quota) = self.quota_by.as_ref().and_then(|f| f(head)) {
            if quota.quota == self.default_quota && quota.name.is_none() {
                return Selected::Kept(&self.default);
            }
            return self.chosen_policy(quota);
        }
        Selected::Kept(
            head.route()
                .and_then(|route| self.routes.get(route))
                .unwrap_or(&self.default),
        )
    }
}

impl Policies {
    /// The policy of a quota picked per request (a tier, a stored limit),
    /// built on first use and kept (at most [`CHOSEN_CAP`]).
    fn chosen_policy(&self, quota: NamedQuota) -> Selected<'_> {
        if let Some(policy) = self
            .chosen
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&quota)
        {
            return Selected::Built(policy.clone());
        }
        let policy = self.build(&quota, Primary::Tier);
        let mut chosen = self.chosen.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = chosen.get(&quota) {
            // Another request built it meanwhile: one policy per quota.
            return Selected::Built(kept.clone());
        }
        if chosen.len() >= CHOSEN_CAP
            && let Some(old) = chosen.keys().next().cloned()
        {
            chosen.remove(&old);
        }
        chosen.insert(quota, policy.clone());
        Selected::Built(policy)
    }
}

/// The policy [`Policies::select`] picked for a request: one the layer keeps
/// for its lifetime, borrowed, or one a `quota_by` answer picked, which the
/// layer may drop meanwhile. Borrowing the kept ones means a request that is
/// judged at once takes no count on a reference shared by every request
/// (an atomic on a cache line all cores write).
pub(crate) enum Selected<'a> {
    Kept(&'a Arc<Policy>),
    Built(Arc<Policy>),
}

impl Selected<'_> {
    fn arc(&self) -> &Arc<Policy> {
        match self {
            Self::Kept(policy) => policy,
            Self::Built(policy) => policy,
        }
    }

    /// The policy, for what outlives the call that selected it.
    pub(crate) fn to_arc(&self) -> Arc<Policy> {
        Arc::clone(self.arc())
    }
}

impl std::ops::Deref for Selected<'_> {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        self.arc()
    }
}

/// `route`, with every byte an sf-string cannot hold percent-encoded.
fn push_escaped(name: &mut String, route: &str) {
    for &b in route.as_bytes() {
        if is_sf_string_byte(b) {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
}

/// `LIMIT/WINDOW`: the quota's canonical rate string (`100/1min`,
/// `5/15min`, `20/500ms`), which parses back to the same quota.
fn push_rate(name: &mut String, quota: Quota) {
    use std::fmt::Write;
    write!(name, "{quota}").expect("writing to a String does not fail");
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
            lowers: self.lowers,
            chosen: RwLock::default(),
            stored: self.stored.clone(),
            stored_last: ArcSwapOption::empty(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn quota(limit: u64, millis: u64) -> Quota {
        Quota::new(limit, Duration::from_millis(millis)).unwrap()
    }

    #[test]
    fn default_names_are_readable() {
        let policies = Policies::new("api".into(), quota(100, 60_000), HeaderStyle::Ietf);
        let cases = [
            ("layer's own", quota(100, 60_000), Primary::Tier, "api"),
            (
                "a day",
                quota(10_000, 86_400_000),
                Primary::Tier,
                "api 10000/1d",
            ),
            ("an hour", quota(3, 3_600_000), Primary::Layer, "api 3/1h"),
            (
                "15 minutes",
                quota(5, 900_000),
                Primary::Tier,
                "api 5/15min",
            ),
            ("seconds", quota(10, 1_000), Primary::Tier, "api 10/1s"),
            ("90 seconds", quota(10, 90_000), Primary::Tier, "api 10/90s"),
            (
                "milliseconds",
                quota(20, 500),
                Primary::Tier,
                "api 20/500ms",
            ),
            (
                "a gRPC method",
                quota(2, 900_000),
                Primary::Route("/auth.Auth/Login"),
                "api /auth.Auth/Login",
            ),
            (
                "an axum route",
                quota(2, 900_000),
                Primary::Route("/users/{id}"),
                "api /users/{id}",
            ),
            (
                "non-ASCII escaped",
                quota(2, 900_000),
                Primary::Route("/caf\u{e9}"),
                "api /caf%C3%A9",
            ),
        ];
        for (case, q, primary, want) in cases {
            let name = policies.policy_name(&q.into(), primary);
            assert_eq!(&*name, want, "{case}");
            assert!(is_policy_name(&name), "{case}: a valid sf-string");
        }
        let named = NamedQuota::new("login", quota(2, 900_000));
        assert_eq!(
            &*policies.policy_name(&named, Primary::Route("/login")),
            "login",
            "a given name wins"
        );
    }

    #[test]
    fn policy_names_follow_the_one_rule() {
        let q = quota(1, 1_000);
        for bad in ["", "tab\t", "caf\u{e9}"] {
            assert_eq!(
                NamedQuota::try_new(bad, q),
                Err(ConfigError::InvalidPolicyName(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(
            NamedQuota::try_new("pro tier", q).unwrap().name(),
            Some("pro tier")
        );
        assert_eq!(NamedQuota::from(q).name(), None);
    }

    #[test]
    #[should_panic(expected = "invalid policy name \"\"")]
    fn a_bad_literal_policy_name_panics() {
        let _ = NamedQuota::new("", quota(1, 1_000));
    }

    #[test]
    fn the_layers_own_policies_are_lent_not_counted() {
        let mut policies = Policies::new("api".into(), quota(100, 60_000), HeaderStyle::Ietf);
        // A gRPC call's route is its method.
        policies.add_route("/auth.Auth/Login", quota(5, 60_000).into());
        let default = Arc::strong_count(&policies.default);
        let login = Arc::strong_count(&policies.routes["/auth.Auth/Login"]);
        for (path, quota_seen) in [
            ("/", quota(100, 60_000)),
            ("/auth.Auth/Login", quota(5, 60_000)),
        ] {
            let request = http::Request::post(path)
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let selected = policies.select(&RequestHead::new(&request), &Key::new("k"));
            assert!(matches!(selected, Selected::Kept(_)), "{path}");
            assert_eq!(selected.counters()[0].quota, quota_seen, "{path}");
            // While the selection is held: no count was taken.
            assert_eq!(Arc::strong_count(&policies.default), default);
            assert_eq!(
                Arc::strong_count(&policies.routes["/auth.Auth/Login"]),
                login
            );
        }
    }

    #[test]
    fn a_cost_that_never_fits_shows_what_the_store_said_stands() {
        let mut policies = Policies::new("api".into(), quota(100, 60_000), HeaderStyle::Ietf);
        policies.add_also(quota(10, 1_000).into());
        let policy = &policies.default;
        let index = policy.never_fits(25).expect("above the smaller limit");
        assert_eq!(policy.slots[index].quota, quota(10, 1_000));
        let hit = |count| Hit {
            count,
            reset: Duration::from_millis(400),
            deadline: None,
        };
        let cases = [
            ("4 stand, the cost 25", Some(hit(4 + 25)), 6, 400),
            ("nothing stands", Some(hit(25)), 10, 400),
            ("the store failed", None, 0, 1_000),
            (
                "a deny cache answered for another counter",
                Some(hit(0)),
                0,
                1_000,
            ),
        ];
        for (case, hit, left, reset_ms) in cases {
            let decision = policy.never_fitting(index, 25, hit.as_ref(), false, None);
            assert!(decision.never_fits() && !decision.passed(), "{case}");
            assert_eq!(decision.remaining(), left, "{case}");
            assert_eq!(decision.reset(), Duration::from_millis(reset_ms), "{case}");
        }
    }

    #[test]
    fn tier_policies_are_kept_bounded_and_found_again() {
        let mut policies = Policies::new("api".into(), quota(100, 60_000), HeaderStyle::Ietf);
        policies.set_quota_by(Arc::new(|head: &RequestHead<'_>| {
            let limit = head.headers().get("tier")?.to_str().ok()?.parse().ok()?;
            Some(quota(limit, 1_000).into())
        }));
        let select = |limit: usize| {
            let request = http::Request::get("/")
                .header("tier", limit.to_string())
                .body(())
                .unwrap();
            policies
                .select(&RequestHead::new(&request), &Key::new("k"))
                .to_arc()
        };
        let first = select(1);
        assert!(Arc::ptr_eq(&first, &select(1)), "built once, then found");
        for limit in 2..CHOSEN_CAP + 100 {
            let policy = select(limit);
            assert!(Arc::ptr_eq(&policy, &select(limit)), "tier {limit} kept");
        }
        let held = policies.chosen.read().unwrap().len();
        assert_eq!(held, CHOSEN_CAP, "bounded");
        assert_eq!(
            select(7).counters()[0].quota,
            quota(7, 1_000),
            "a rebuilt policy is the same policy"
        );
    }
}
