//! [`Operator`]: the operator's calls, as plain async methods over the
//! store contract, for the layers registered with it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::backend::{BackendError, Counter, Heeding, LimitScope, Spend, StoredLimits};
use crate::denied::{DeniedKey, DeniedKeys};
use crate::error::ConfigError;
use crate::key::Key;
use crate::limits::LimitBook;
use crate::outbound::BudgetLayer;
use crate::outbound::watch::Watch;
use crate::policy::KnownCounter;
use crate::quota::{Quota, Window};
use crate::server::layer::RateLimitLayer;

/// The operator's calls over the layers registered with it: read a key's
/// counters and lockout, reset it, block it, unblock it. Each is the same
/// store step whether called here or through the
/// [`OperatorService`](super::OperatorService) that [`service`](Self::service) makes.
///
/// Register a layer with [`layer`](Self::layer): the operator keeps the
/// layer's name, a clone of its backend (a
/// [`PrivateKeys`](crate::backend::PrivateKeys) store digests the key the
/// operator names just as it digests a request's, so both meet the same
/// counter) and the counters known when the layer is built (its own quota,
/// those of [`also`](RateLimitLayer::also) and of
/// [`route_quota`](RateLimitLayer::route_quota)). Each store call it makes
/// is bounded by the layer's [`timeout`](RateLimitLayer::timeout).
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::backend::MemoryBackend;
/// use tower_pinned_window::key::Key;
/// use tower_pinned_window::operator::Operator;
/// use tower_pinned_window::{Quota, RateLimitLayer, Window};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryBackend::new();
/// // `cost(1)` makes the layer spend: its requests read lockouts, so a
/// // block blocks (see `Operator::block`).
/// let api = RateLimitLayer::new("api", Quota::new(10, Duration::from_secs(60)).unwrap())
///     .backend(store.clone())
///     .cost(1);
/// let operator = Operator::new().layer(&api);
///
/// let key = Key::new("203.0.113.7");
/// let state = operator.read("api", &key).await.unwrap();
/// assert_eq!(state.counters[0].count, 0);
/// assert_eq!(state.blocked_for, None);
///
/// let hour = Window::new(Duration::from_secs(3600)).unwrap();
/// operator.block("api", &key, hour).await.unwrap();
/// assert!(operator.read("api", &key).await.unwrap().blocked_for.is_some());
/// operator.unblock("api", &key).await.unwrap();
/// assert_eq!(operator.read("api", &key).await.unwrap().blocked_for, None);
/// # }
/// ```
#[must_use]
pub struct Operator<Bk> {
    layers: BTreeMap<Arc<str>, Registered<Bk>>,
    /// Outbound budgets, by name: what each holds in this process.
    budgets: BTreeMap<Arc<str>, Watch>,
    /// Keys listed are shown as their keyed digest under this secret,
    /// drawn when the operator is made: a list never holds a key, and a
    /// digest of a guessable key (an address) cannot be reversed by
    /// trying every guess without it.
    digests: Arc<Hmac<Sha256>>,
    /// The limits held in the store, set and read through the operator
    /// ([`limits`](Self::limits)).
    book: Option<LimitBook>,
}

/// The most keys a budget's list holds; past it, the answer says it was
/// cut.
pub const MAX_LISTED: usize = 1000;

/// A budget key with calls waiting in this process, or closed by the
/// provider's word, as [`Operator::budget_keys`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetKey {
    /// The key's digest ([`Operator::digest`]), never the key.
    pub digest: String,
    /// Calls waiting in this process in the key's line (its head
    /// included).
    pub waiting: usize,
    /// How long the provider's word keeps the key closed in this process
    /// (its `429` or `Retry-After`); `None` when open.
    pub closed_for: Option<Duration>,
}

/// A layer as the operator knows it.
#[derive(Clone)]
struct Registered<Bk> {
    backend: Bk,
    counters: Vec<KnownCounter>,
    /// Whether the layer's requests read lockouts (it spends).
    spends: bool,
    /// The layer's timeout for a store call: each of the operator's store
    /// calls is bounded by it too.
    timeout: Duration,
    /// The keys the layer denied most, when it keeps them
    /// ([`RateLimitLayer::top_denied`]).
    denied: Option<DeniedKeys>,
}

/// `call`'s answer, or [`BackendError::TimedOut`] past `timeout`.
async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, OperatorError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(OperatorError::Backend(BackendError::TimedOut)),
    }
}

/// A key's state in one layer, as [`Operator::read`] found it: nothing was
/// counted to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// Each counter known of the layer, in the order
    /// [`Operator::counters`] lists them.
    pub counters: Vec<CounterState>,
    /// How long the key stays locked out (a [block](Operator::block), a
    /// layer's [`block_for`](RateLimitLayer::block_for), or a provider's
    /// closure): the longest lockout among its counters; `None` when none
    /// is live.
    pub blocked_for: Option<Duration>,
}

/// One counter of a key, as [`Operator::read`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterState {
    /// The counter's quota.
    pub quota: Quota,
    /// The route whose quota it is, for a
    /// [`route_quota`](RateLimitLayer::route_quota).
    pub route: Option<String>,
    /// The count in the key's current window; 0 when it has none.
    pub count: u64,
    /// Time left in the key's window; `None` when it has none (its next
    /// hit opens one).
    pub resets_in: Option<Duration>,
}

impl CounterState {
    /// What is left of the quota in the current window (0 past the limit).
    pub fn remaining(&self) -> u64 {
        self.quota.limit().saturating_sub(self.count)
    }
}

/// A counter a layer hits, as [`Operator::counters`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterInfo {
    /// The counter's quota.
    pub quota: Quota,
    /// The route whose quota it is, for a
    /// [`route_quota`](RateLimitLayer::route_quota).
    pub route: Option<String>,
}

/// Why an operator's call did not happen.
#[derive(Debug)]
#[non_exhaustive]
pub enum OperatorError {
    /// No layer of that name is registered.
    UnknownLayer(String),
    /// The layer counts plain hits, which never read a lockout: a block
    /// would not block. Give the layer a [`cost`](RateLimitLayer::cost)
    /// (`cost(1)` counts as a hit does) or a
    /// [`block_for`](RateLimitLayer::block_for).
    NotBlockable(String),
    /// No [`LimitBook`] was given ([`Operator::limits`]): limits cannot be
    /// set or read.
    NoLimitBook,
    /// The store failed; nothing is known to have changed.
    Backend(BackendError),
}

impl fmt::Display for OperatorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownLayer(name) => write!(f, "no layer named {name:?} is registered"),
            Self::NotBlockable(name) => write!(
                f,
                "layer {name:?} counts plain hits, which never read a lockout: a block would not \
                 block (give the layer a cost, e.g. cost(1), or a block_for)"
            ),
            Self::NoLimitBook => f.write_str(
                "no limit book was given to the operator (Operator::limits): limits held in the store cannot be set or read",
            ),
            Self::Backend(err) => write!(f, "the store failed: {err}"),
        }
    }
}

impl std::error::Error for OperatorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(err) => Some(err),
            _ => None,
        }
    }
}

impl From<BackendError> for OperatorError {
    fn from(err: BackendError) -> Self {
        Self::Backend(err)
    }
}

/// The limit of the probe that reads a lockout: no count reaches it (Redis
/// scripts hold whole numbers up to 2^53 - 1), so the probe fits every
/// counter that is not locked out.
const PROBE_LIMIT: NonZeroU64 = NonZeroU64::new((1 << 53) - 1).unwrap();

impl<Bk> Operator<Bk> {
    /// An operator with no layer yet.
    pub fn new() -> Self {
        // 256 bits drawn from the OS through std's SipHash keys (each
        // `RandomState` holds 128 random bits).
        let mut secret = [0u8; 32];
        for (i, chunk) in secret.chunks_exact_mut(8).enumerate() {
            use std::hash::BuildHasher;
            let draw = std::collections::hash_map::RandomState::new().hash_one(i);
            chunk.copy_from_slice(&draw.to_le_bytes());
        }
        Self {
            layers: BTreeMap::new(),
            budgets: BTreeMap::new(),
            digests: Arc::new(
                Hmac::<Sha256>::new_from_slice(&secret).expect("HMAC takes a key of any length"),
            ),
            book: None,
        }
    }

    /// Set and read the limits `book` holds for the registered layers
    /// ([`set_limit`](Self::set_limit), [`clear_limit`](Self::clear_limit),
    /// [`read_limits`](Self::read_limits)): give it the book the layers
    /// were given ([`RateLimitLayer::limits`]).
    pub fn limits(mut self, book: LimitBook) -> Self {
        self.book = Some(book);
        self
    }

    fn book(&self, layer: &str) -> Result<&LimitBook, OperatorError> {
        if !self.layers.contains_key(layer) {
            return Err(OperatorError::UnknownLayer(layer.to_owned()));
        }
        self.book.as_ref().ok_or(OperatorError::NoLimitBook)
    }

    /// Set `layer`'s limit of `scope` in the store: its layers apply it
    /// within the book's staleness bound, the count kept.
    ///
    /// # Errors
    /// [`OperatorError::UnknownLayer`], [`OperatorError::NoLimitBook`], or
    /// the store's error (nothing set).
    pub async fn set_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Quota,
    ) -> Result<(), OperatorError> {
        Ok(self.book(layer)?.set(layer, scope, quota).await?)
    }

    /// Remove `layer`'s limit of `scope`: its own quota applies again.
    ///
    /// # Errors
    /// As [`set_limit`](Self::set_limit).
    pub async fn clear_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
    ) -> Result<(), OperatorError> {
        Ok(self.book(layer)?.clear(layer, scope).await?)
    }

    /// Every limit `layer` has in the store, read now.
    ///
    /// # Errors
    /// As [`set_limit`](Self::set_limit).
    pub async fn read_limits(&self, layer: &str) -> Result<StoredLimits, OperatorError> {
        Ok(self.book(layer)?.read(layer).await?)
    }

    /// Register the outbound budget `budget`: [`budget_keys`](Self::budget_keys)
    /// lists its keys with calls waiting or closed, in this process.
    ///
    /// # Panics
    /// When a budget of the same name is registered already; use
    /// [`try_budget`](Self::try_budget) for budgets known only at run time.
    #[track_caller]
    pub fn budget<K, Bk2>(self, budget: &BudgetLayer<K, Bk2>) -> Self {
        crate::budget::check::built(self.try_budget(budget))
    }

    /// Like [`budget`](Self::budget).
    ///
    /// # Errors
    /// [`ConfigError::OperatorNameTaken`] when a budget of the same name is
    /// registered already.
    pub fn try_budget<K, Bk2>(mut self, budget: &BudgetLayer<K, Bk2>) -> Result<Self, ConfigError> {
        let watch = budget.watch();
        if self.budgets.contains_key(&watch.name) {
            return Err(ConfigError::OperatorNameTaken(watch.name.to_string()));
        }
        self.budgets.insert(Arc::clone(&watch.name), watch);
        Ok(self)
    }

    /// The names of the registered budgets, in order.
    pub fn budget_names(&self) -> impl Iterator<Item = &str> {
        self.budgets.keys().map(|name| &**name)
    }

    /// `budget`'s keys that have calls waiting in this process, or that
    /// the provider's word holds closed here, as digests, the most waiting
    /// first; at most [`MAX_LISTED`] (`true` beside them when some were
    /// left out). Process memory only: no store call.
    ///
    /// # Errors
    /// [`OperatorError::UnknownLayer`] for a budget not registered.
    pub fn budget_keys(&self, budget: &str) -> Result<(Vec<BudgetKey>, bool), OperatorError> {
        let watch = self
            .budgets
            .get(budget)
            .ok_or_else(|| OperatorError::UnknownLayer(budget.to_owned()))?;
        let mut keys: std::collections::HashMap<Key, (usize, Option<Duration>)> =
            std::collections::HashMap::new();
        for (key, waiting) in watch.waiting() {
            keys.entry(key).or_default().0 = waiting;
        }
        for (key, closed) in watch.closed() {
            keys.entry(key).or_default().1 = Some(closed);
        }
        let mut listed: Vec<(usize, Option<Duration>, Key)> = keys
            .into_iter()
            .map(|(key, (waiting, closed))| (waiting, closed, key))
            .collect();
        listed.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        let cut = listed.len() > MAX_LISTED;
        listed.truncate(MAX_LISTED);
        let keys = listed
            .into_iter()
            .map(|(waiting, closed_for, key)| BudgetKey {
                digest: self.digest(&key),
                waiting,
                closed_for,
            })
            .collect();
        Ok((keys, cut))
    }

    /// The digest a list shows for `key`: 16 hex digits of its HMAC-SHA256
    /// under a secret this operator drew when it was made (so stable for
    /// its lifetime, and different in another process).
    pub fn digest(&self, key: &Key) -> String {
        self.digest_bytes(key.as_bytes())
    }

    /// [`digest`](Self::digest) of a key's bytes as a store keeps them.
    pub(crate) fn digest_bytes(&self, key: &[u8]) -> String {
        let mut mac = Hmac::clone(&self.digests);
        mac.update(key);
        let bytes = mac.finalize().into_bytes();
        bytes[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Register `layer`: its name, a clone of its backend and the counters
    /// known when it is built.
    ///
    /// # Panics
    /// When a layer of the same name is registered already; use
    /// [`try_layer`](Self::try_layer) for layers known only at run time.
    #[track_caller]
    pub fn layer<K, D, M, R>(self, layer: &RateLimitLayer<K, Bk, D, M, R>) -> Self
    where
        Bk: Clone,
    {
        crate::budget::check::built(self.try_layer(layer))
    }

    /// Like [`layer`](Self::layer).
    ///
    /// # Errors
    /// [`ConfigError::OperatorNameTaken`] when a layer of the same name is
    /// registered already.
    pub fn try_layer<K, D, M, R>(
        mut self,
        layer: &RateLimitLayer<K, Bk, D, M, R>,
    ) -> Result<Self, ConfigError>
    where
        Bk: Clone,
    {
        let settings = layer.settings();
        if self.layers.contains_key(&settings.name) {
            return Err(ConfigError::OperatorNameTaken(settings.name.to_string()));
        }
        self.layers.insert(
            settings.name.clone(),
            Registered {
                backend: layer.backend_ref().clone(),
                counters: settings.policies.known_counters(),
                spends: settings.spend.is_some(),
                timeout: settings.timeout,
                denied: layer.denied_keys(),
            },
        );
        Ok(self)
    }

    /// The `n` keys `layer` denied most, as its table's digests
    /// ([`DeniedKeys::top`]); `None` when the layer keeps no such table.
    ///
    /// # Errors
    /// [`OperatorError::UnknownLayer`].
    pub fn denied(&self, layer: &str, n: usize) -> Result<Option<Vec<DeniedKey>>, OperatorError> {
        let registered = self
            .layers
            .get(layer)
            .ok_or_else(|| OperatorError::UnknownLayer(layer.to_owned()))?;
        Ok(registered.denied.as_ref().map(|denied| denied.top(n)))
    }

    /// The names of the registered layers, in order.
    pub fn layer_names(&self) -> impl Iterator<Item = &str> {
        self.layers.keys().map(|name| &**name)
    }

    /// The counters known of `layer`, in the order a [`KeyState`] holds
    /// them; `None` for a layer not registered.
    pub fn counters(&self, layer: &str) -> Option<Vec<CounterInfo>> {
        let registered = self.layers.get(layer)?;
        Some(
            registered
                .counters
                .iter()
                .map(|c| CounterInfo {
                    quota: c.quota,
                    route: c.route.as_deref().map(str::to_owned),
                })
                .collect(),
        )
    }

    /// Whether [`block`](Self::block) works on `layer` (its requests read
    /// lockouts); `None` for a layer not registered.
    pub fn blockable(&self, layer: &str) -> Option<bool> {
        self.layers.get(layer).map(|r| r.spends)
    }

    fn get(&self, layer: &str) -> Result<&Registered<Bk>, OperatorError> {
        let registered = self
            .layers
            .get(layer)
            .ok_or_else(|| OperatorError::UnknownLayer(layer.to_owned()))?;
        Ok(registered)
    }
}

impl<Bk: Heeding> Operator<Bk> {
    /// `key`'s counters in `layer` and its lockout, **without counting**:
    /// each counter is read with [`Backend::peek`](crate::backend::Backend::peek), and the lockout with a
    /// spend of cost 0 against a limit no count reaches
    /// ([`Spending::spend_all`](crate::backend::Spending::spend_all)), which adds nothing, creates nothing and
    /// does not fit only where a lockout stands.
    ///
    /// # Errors
    /// [`OperatorError::UnknownLayer`],
    /// or the store's [`OperatorError::Backend`].
    pub async fn read(&self, layer: &str, key: &Key) -> Result<KeyState, OperatorError> {
        let registered = self.get(layer)?;
        let mut counters = Vec::with_capacity(registered.counters.len());
        for known in &registered.counters {
            let hit = within(
                registered.timeout,
                registered.backend.peek(&known.namespace, key),
            )
            .await?;
            counters.push(CounterState {
                quota: known.quota,
                route: known.route.as_deref().map(str::to_owned),
                count: hit.map_or(0, |h| h.count),
                resets_in: hit.map(|h| h.reset),
            });
        }
        let probes: Vec<Counter<'_>> = registered
            .counters
            .iter()
            .map(|known| Counter {
                namespace: &known.namespace,
                quota: Quota::with_window(PROBE_LIMIT, known.quota.window()),
                lowers: false,
            })
            .collect();
        // With a lockout asked for, a deny cache answers only for a lockout
        // it holds, never for a counter at its limit; a counter that does not
        // fit is locked out already, so the probe sets none.
        let probe = Spend::cost(0).block(Window::new(Duration::from_millis(1)).expect("1 ms"));
        let hits = within(
            registered.timeout,
            registered.backend.spend_all(key, &probes, probe),
        )
        .await?;
        let blocked_for = hits
            .iter()
            .filter(|hit| hit.count > PROBE_LIMIT.get())
            .map(|hit| hit.reset)
            .max();
        Ok(KeyState {
            counters,
            blocked_for,
        })
    }

    /// Delete `key`'s counters in `layer` and their lockouts
    /// ([`Backend::reset`](crate::backend::Backend::reset)): its next request opens a fresh window. `true`
    /// when any existed.
    ///
    /// # Errors
    /// As [`read`](Self::read). A store that fails part-way may have reset
    /// some counters and not others: calling it again finishes it.
    pub async fn reset(&self, layer: &str, key: &Key) -> Result<bool, OperatorError> {
        let registered = self.get(layer)?;
        let mut any = false;
        for known in &registered.counters {
            any |= within(
                registered.timeout,
                registered.backend.reset(&known.namespace, key),
            )
            .await?;
        }
        Ok(any)
    }

    /// Lock `key` out of `layer` for `span` from now: a lockout on each of
    /// its counters ([`Heeding::close`]), which every request of the layer
    /// reads in its own store step. **Deadlines only extend**: a lockout
    /// that ends later is kept, never shortened. Answers the time the key
    /// stays locked out (at least `span`).
    ///
    /// The counts and windows are left as they are. Only a layer whose
    /// requests spend reads lockouts (a [`cost`](RateLimitLayer::cost), a
    /// [`block_for`](RateLimitLayer::block_for), ...): on a layer that
    /// counts plain hits, the block is refused, since it would not block.
    ///
    /// # Errors
    /// [`OperatorError::NotBlockable`], and those of [`read`](Self::read).
    pub async fn block(
        &self,
        layer: &str,
        key: &Key,
        span: Window,
    ) -> Result<Duration, OperatorError> {
        let registered = self.get(layer)?;
        if !registered.spends {
            return Err(OperatorError::NotBlockable(layer.to_owned()));
        }
        let mut left = Duration::ZERO;
        for known in &registered.counters {
            left = left.max(
                registered
                    .backend
                    .close(&known.namespace, key, span)
                    .await?,
            );
        }
        Ok(left)
    }

    /// Lift `key`'s lockout in `layer`. The store contract has no step that
    /// shortens a lockout (deadlines only extend), so this is a
    /// [`reset`](Self::reset): the counters go with the lockout, and the
    /// key's next request opens a fresh window. `true` when anything
    /// existed.
    ///
    /// # Errors
    /// As [`reset`](Self::reset).
    pub async fn unblock(&self, layer: &str, key: &Key) -> Result<bool, OperatorError> {
        self.reset(layer, key).await
    }
}

impl<Bk> Default for Operator<Bk> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Bk: Clone> Clone for Operator<Bk> {
    fn clone(&self) -> Self {
        Self {
            layers: self.layers.clone(),
            budgets: self.budgets.clone(),
            digests: Arc::clone(&self.digests),
            book: self.book.clone(),
        }
    }
}

impl<Bk> fmt::Debug for Operator<Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operator")
            .field("layers", &self.layers.keys().collect::<Vec<_>>())
            .field("budgets", &self.budgets.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests;
