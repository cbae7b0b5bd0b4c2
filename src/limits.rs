//! Limits that change while the service runs: a [`LimitBook`] sets and
//! reads the limits a store holds ([`Limits`]), and the layers given it
//! read them from a copy each process keeps, read again from the store at
//! most once per staleness bound per layer, in the background. No request
//! waits for it, and none makes a store call for it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use tokio::time::Instant;

use crate::backend::{BackendError, LimitScope, Limits, StoredLimits};
use crate::error::ConfigError;
use crate::metrics::StoredLimitsMetrics;
use crate::quota::Quota;

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// A store of limits with its type erased: a book is one type whatever
/// the backend.
trait Store: Send + Sync {
    fn set(&self, layer: &str, scope: LimitScope<'_>, quota: Option<Quota>) -> Boxed<()>;
    fn read(&self, layer: &str) -> Boxed<StoredLimits>;
}

impl<B: Limits> Store for B {
    fn set(&self, layer: &str, scope: LimitScope<'_>, quota: Option<Quota>) -> Boxed<()> {
        Box::pin(self.set_limit(layer, scope, quota))
    }

    fn read(&self, layer: &str) -> Boxed<StoredLimits> {
        Box::pin(self.limits(layer))
    }
}

/// The limits held in a store, set and read by the application, and read
/// by the layers it is given to, both of them
/// ([`RateLimitLayer::limits`](crate::RateLimitLayer::limits) and
/// [`BudgetLayer::limits`](crate::outbound::BudgetLayer::limits)), with a
/// bounded staleness.
///
/// What a server layer applies, for a request whose count is in the layer's own
/// counter (its quota, or a tier [`quota_by`](crate::RateLimitLayer::quota_by)
/// picked): the key's stored limit, else its tier's (by the
/// [`NamedQuota`](crate::NamedQuota)'s name), else the tier's quota as
/// the closure gave it, else the layer's stored limit, else the layer's
/// quota. Route quotas and `also` quotas are not changed. What an outbound
/// budget applies to a call: the stored limit of its budget key, else the
/// budget's, else its quota; a tokens budget reads its own under its own
/// name. The count is kept whatever the limit (see
/// [limits that change](crate::guide::guarantees#limits-that-change)).
///
/// **Staleness.** Each process reads a layer's limits at most once per
/// `staleness`, in the background, started by a request that finds its copy
/// older than that; until the first read answers, and while the store does
/// not, the layer applies what it read last (its own quotas, at first). A
/// limit set through this book is applied by this process from its next
/// request's read; by the others within `staleness` plus one read.
///
/// **Bad input.** A stored value that is not a limit is left out (the layer's
/// quota applies to that scope), counted ([`StoredLimits::corrupt`], and the
/// gauge `tower_pinned_window_stored_limits_corrupt` under the `metrics`
/// feature) and logged when the count changes, never read as "no limit"; a
/// [`Quota`] cannot be zero, so no setter takes one.
///
/// **Private keys.** [`PrivateKeys`](crate::backend::PrivateKeys) holds no
/// limits: a key's limit would be stored under the key as given, not its
/// digest. Give a layer on it limits per layer or tier only.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::backend::{LimitScope, MemoryBackend};
/// use tower_pinned_window::key::Key;
/// use tower_pinned_window::{LimitBook, Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = MemoryBackend::new();
/// let book = LimitBook::new(&backend, Duration::from_secs(1))?;
/// let minute = |n| Quota::new(n, Duration::from_secs(60));
/// let layer = RateLimitLayer::new("api", minute(100)?)
///     .backend(backend)
///     .limits(book.clone());
/// // An abuser gets 5 a minute; the count so far is kept.
/// let key = Key::new("203.0.113.7");
/// book.set("api", LimitScope::Key(&key), minute(5)?).await?;
/// let stored = book.read("api").await?;
/// assert_eq!(stored.get(LimitScope::Key(&key)).map(|q| q.limit()), Some(5));
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LimitBook {
    store: Arc<dyn Store>,
    staleness: Duration,
    pages: Arc<RwLock<HashMap<Box<str>, Arc<Page>>>>,
}

impl std::fmt::Debug for LimitBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitBook")
            .field("staleness", &self.staleness)
            .finish_non_exhaustive()
    }
}

impl LimitBook {
    /// A book of the limits `backend` holds, which layers read at most once
    /// per `staleness` per process.
    ///
    /// # Errors
    /// [`ConfigError::ZeroStaleness`] for a zero `staleness` (every request
    /// would read the store).
    pub fn new<B: Limits>(backend: &B, staleness: Duration) -> Result<Self, ConfigError> {
        if staleness.is_zero() {
            return Err(ConfigError::ZeroStaleness);
        }
        Ok(Self {
            store: Arc::new(backend.clone()),
            staleness,
            pages: Arc::default(),
        })
    }

    /// How stale a layer's copy of its limits may be.
    pub fn staleness(&self) -> Duration {
        self.staleness
    }

    /// Set the limit of `scope` for the layer named `layer`.
    ///
    /// # Errors
    /// The store's error: nothing was set.
    pub async fn set(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Quota,
    ) -> Result<(), BackendError> {
        self.write(layer, scope, Some(quota)).await
    }

    /// Remove the limit of `scope` for `layer`: the layer's own quota (or
    /// the tier's) applies again.
    ///
    /// # Errors
    /// The store's error: nothing was removed.
    pub async fn clear(&self, layer: &str, scope: LimitScope<'_>) -> Result<(), BackendError> {
        self.write(layer, scope, None).await
    }

    async fn write(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Option<Quota>,
    ) -> Result<(), BackendError> {
        self.store.set(layer, scope, quota).await?;
        // This process reads it again on the layer's next request.
        if let Some(page) = self
            .pages
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(layer)
        {
            page.read_at.store(0, Ordering::Release);
        }
        Ok(())
    }

    /// Every limit `layer` has in the store, read now.
    ///
    /// # Errors
    /// The store's error.
    pub async fn read(&self, layer: &str) -> Result<StoredLimits, BackendError> {
        self.store.read(layer).await
    }

    /// The copy the layer named `layer` reads (made on first use).
    pub(crate) fn page(&self, layer: &str) -> Arc<Page> {
        let mut pages = self.pages.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(pages.entry(layer.into()).or_insert_with(|| {
            Arc::new(Page {
                layer: layer.into(),
                store: Arc::clone(&self.store),
                staleness: self.staleness,
                origin: Instant::now(),
                current: ArcSwap::default(),
                read_at: AtomicU64::new(0),
                reading: AtomicBool::new(false),
                corrupt: AtomicUsize::new(0),
                metrics: StoredLimitsMetrics::new(),
            })
        }))
    }
}

/// One layer's copy of its stored limits.
pub(crate) struct Page {
    layer: Box<str>,
    store: Arc<dyn Store>,
    staleness: Duration,
    origin: Instant,
    /// The limits as last read: swapped whole by a read, loaded by every
    /// request without a lock or a count on a shared reference.
    current: ArcSwap<StoredLimits>,
    /// When the copy was last read, in milliseconds since `origin` plus
    /// one; 0: never (or a limit was set here since).
    read_at: AtomicU64,
    /// A read is out.
    reading: AtomicBool,
    /// Corrupt values in the last read, to log a change once.
    corrupt: AtomicUsize,
    /// Their gauge (feature `metrics`).
    metrics: StoredLimitsMetrics,
}

impl Page {
    /// The limits as last read; starts a read in the background when the
    /// copy is older than the staleness bound (and none is out).
    #[inline]
    pub(crate) fn current(self: &Arc<Self>) -> Guard<Arc<StoredLimits>> {
        let now = self.now_ms();
        let read_at = self.read_at.load(Ordering::Acquire);
        let staleness = u64::try_from(self.staleness.as_millis()).unwrap_or(u64::MAX);
        if (read_at == 0 || now.saturating_sub(read_at) >= staleness)
            && !self.reading.swap(true, Ordering::AcqRel)
        {
            self.read_again();
        }
        self.current.load()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    #[cold]
    fn read_again(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reading.store(false, Ordering::Release);
            return;
        };
        let page = Arc::clone(self);
        let asked = self.now_ms();
        runtime.spawn(async move {
            // Bounded: a store that does not answer is asked again after
            // the staleness bound, not never.
            let read = tokio::time::timeout(page.staleness, page.store.read(&page.layer)).await;
            match read {
                Ok(Ok(limits)) => {
                    let corrupt = limits.corrupt();
                    page.metrics.read(&page.layer, corrupt);
                    if page.corrupt.swap(corrupt, Ordering::Relaxed) != corrupt && corrupt > 0 {
                        tracing::warn!(
                            limiter = %page.layer,
                            corrupt,
                            "stored limits that are not limits were left out: the layer's own quotas apply to them"
                        );
                    }
                    page.current.store(Arc::new(limits));
                }
                Ok(Err(err)) => tracing::warn!(
                    limiter = %page.layer,
                    error = %err,
                    "stored limits could not be read: the layer keeps the ones it read last"
                ),
                Err(_) => tracing::warn!(
                    limiter = %page.layer,
                    "stored limits were not read within the staleness bound: the layer keeps the ones it read last"
                ),
            }
            page.read_at.store(asked, Ordering::Release);
            page.reading.store(false, Ordering::Release);
        });
    }
}
