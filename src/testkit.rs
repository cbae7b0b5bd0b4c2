//! The [backend contract](crate::backend#the-contract) as a test suite, written
//! once and run against every [`Backend`]: the crate's own (memory, Redis,
//! Redis Cluster, Redis Sentinel, PostgreSQL, [`PrivateKeys`] over any of
//! them) and yours.
//!
//! Each [`Scenario`] checks one promise of the contract on a fresh backend:
//! the pinned window, the exact count under concurrency, refunds, corrupt
//! counters, peek and reset, and the audit where the store has one. A test
//! harness turns each scenario into a test of its own (so a failure names
//! itself), or [`run_all`] runs them one after another.
//!
//! The suite reaches the store through a [`Store`]: a fresh, isolated
//! backend per scenario, and the few things only the store's own client can
//! do, each optional ([`Ability`]). A scenario that needs an ability the
//! store does not have is not applicable to it ([`Scenario::missing`]): a
//! harness reports it as ignored, never as passed.
//!
//! Counts are asserted only below the limit: a backend may answer a denial
//! from a local cache without counting it (the Redis deny cache), which the
//! contract allows ([`Hit::deadline`] is `None` then).
//!
//! The scenarios use real time and short windows (300 ms): a backend under
//! test keeps its own clock, so the suite cannot advance it. Run them on a
//! multi-threaded tokio runtime: the concurrency scenarios spawn tasks.
//!
//! # Example: running the contract against a backend of your own
//!
//! A store that can only make fresh backends runs every scenario that needs
//! no [`Ability`]. This runs the whole suite against the in-memory backend
//! (swap in your own), then checks what passed:
//!
//! ```
//! use tower_pinned_window::backend::MemoryBackend;
//! use tower_pinned_window::testkit::{self, Store};
//!
//! /// Each scenario gets a new, empty `MemoryBackend`.
//! struct Memory;
//!
//! impl Store for Memory {
//!     type Backend = MemoryBackend;
//!
//!     async fn fresh(&self) -> MemoryBackend {
//!         MemoryBackend::new()
//!     }
//! }
//!
//! # fn main() {
//! let runtime = tokio::runtime::Builder::new_multi_thread()
//!     .worker_threads(2)
//!     .enable_all()
//!     .build()
//!     .unwrap();
//! // A failing scenario panics with its name.
//! let report = runtime.block_on(testkit::run_all(&Memory));
//! assert!(report.passed.contains(&"pinned_window"));
//! assert!(report.passed.contains(&"refunds_apply_only_to_their_own_window"));
//! // Memory holds no bytes to corrupt: those scenarios are not applicable.
//! assert!(report.not_applicable.contains(&"corrupt_counters_fail_and_are_left_as_they_are"));
//! assert_eq!(report.passed.len() + report.not_applicable.len(), testkit::scenarios::<Memory>().len());
//! # }
//! ```
//!
//! With `libtest-mimic` (or any harness that lists tests at run time), each
//! scenario becomes a test named after it; the crate's own tests do this in
//! `tests/contract.rs` and in each backend's test file.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::{
    Amend, Backend, BackendError, Counter, Hit, Hits, MIN_SECRET_LEN, PrivateKeys, Spend, Spending,
};
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::{Quota, Window};

/// What a store may be able to do besides making backends. A scenario that
/// needs one the store lacks is not applicable to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ability {
    /// [`Store::corrupt`]: write a value that is not a counter.
    Corrupt,
    /// [`Store::stored`]: read what the store holds for a counter, with its
    /// lifetime.
    ReadStored,
    /// [`Store::audit`]: run the backend's audit.
    Audit,
}

impl fmt::Display for Ability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Corrupt => "write a corrupt counter",
            Self::ReadStored => "read a stored counter and its lifetime",
            Self::Audit => "run an audit",
        })
    }
}

/// What a store holds for one counter, as its own client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Nothing: no counter, or one whose window has closed.
    Absent,
    /// A value.
    Value {
        /// The value as text: the count (`"3"`) for a counter, anything else
        /// for corrupt state. Two reads of an untouched value are equal.
        value: String,
        /// The deadline attached to it, in the store's clock, the unit of
        /// [`Hit::deadline`]; `None` when it has no lifetime.
        expiry: Option<u64>,
    },
}

/// What a backend's audit found, in the terms the suite checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Audit {
    /// Counters without a lifetime that are not corrupt.
    pub without_lifetime: usize,
    /// Values that are not counters.
    pub corrupt: usize,
}

/// A backend's test harness, as the suite needs it.
///
/// Only [`fresh`](Store::fresh) is required. The other methods are
/// abilities: a store that has one says so in
/// [`abilities`](Store::abilities) and implements its method; the defaults
/// answer `None`, which a scenario that relies on the ability treats as a
/// broken harness (it only runs where the ability is claimed).
pub trait Store: Send + Sync + 'static {
    /// The backend under test: it keeps the whole contract, the spends
    /// ([`Spending`]) included.
    type Backend: Spending;

    /// A backend on counters that no other backend from `fresh` shares (its
    /// own key prefix, schema or process), empty. Called once or more per
    /// scenario.
    fn fresh(&self) -> impl Future<Output = Self::Backend> + Send;

    /// Another instance on the same counters as `backend`, as another
    /// application server would have (its own connection and caches). The
    /// default is a clone.
    fn another(&self, backend: &Self::Backend) -> impl Future<Output = Self::Backend> + Send {
        let backend = backend.clone();
        async move { backend }
    }

    /// The abilities this store has.
    fn abilities(&self) -> &'static [Ability] {
        &[]
    }

    /// [`Ability::Corrupt`]: store a value that is not a counter (text, a
    /// negative count: what the store can hold) for `namespace` and `key` of
    /// `backend`, in a form its audit reports as corrupt (a Redis audit
    /// looks at keys without a lifetime: give it none). `None` when the
    /// store cannot.
    fn corrupt(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<()>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::ReadStored`]: what the store holds for `namespace` and
    /// `key` of `backend`. `None` when the store cannot tell.
    fn stored(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<Stored>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::Audit`]: run `backend`'s audit and say what it found
    /// (repairing what it repairs is allowed: the suite only reads what was
    /// found). `None` when the backend has none.
    fn audit(&self, backend: &Self::Backend) -> impl Future<Output = Option<Audit>> + Send {
        let _ = backend;
        async { None }
    }
}

/// A store whose backends are `S`'s wrapped in [`PrivateKeys`]: the same
/// contract must hold on keyed digests. Its abilities are `S`'s, reached
/// through the digest of each key.
pub struct Private<S> {
    inner: S,
    secret: Vec<u8>,
}

impl<S> Private<S> {
    /// `inner`'s backends, keyed by digests under `secret` (see
    /// [`PrivateKeys::new`]).
    ///
    /// # Panics
    /// When `secret` is shorter than [`MIN_SECRET_LEN`] bytes. Use
    /// [`try_new`](Self::try_new) for a secret read at run time.
    #[track_caller]
    pub fn new(inner: S, secret: impl AsRef<[u8]>) -> Self {
        match Self::try_new(inner, secret) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`new`](Self::new), for a secret read at run time.
    ///
    /// # Errors
    /// [`ConfigError::SecretTooShort`] for a secret shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn try_new(inner: S, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::SecretTooShort(secret.len()));
        }
        Ok(Self {
            inner,
            secret: secret.to_vec(),
        })
    }
}

impl<S: fmt::Debug> fmt::Debug for Private<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Private")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Store for Private<S> {
    type Backend = PrivateKeys<S::Backend>;

    async fn fresh(&self) -> Self::Backend {
        PrivateKeys::new(self.inner.fresh().await, &self.secret)
    }

    async fn another(&self, backend: &Self::Backend) -> Self::Backend {
        PrivateKeys::new(self.inner.another(backend.get_ref()).await, &self.secret)
    }

    fn abilities(&self) -> &'static [Ability] {
        self.inner.abilities()
    }

    async fn corrupt(&self, backend: &Self::Backend, namespace: &str, key: &Key) -> Option<()> {
        let digest = backend.digest(key);
        self.inner
            .corrupt(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn stored(&self, backend: &Self::Backend, namespace: &str, key: &Key) -> Option<Stored> {
        let digest = backend.digest(key);
        self.inner
            .stored(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn audit(&self, backend: &Self::Backend) -> Option<Audit> {
        self.inner.audit(backend.get_ref()).await
    }
}

/// The future of one scenario's run.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One promise of the contract, checked on fresh backends of a [`Store`]. A
/// broken promise panics, with a message that says which.
pub struct Scenario<S> {
    /// Its name, a Rust identifier (`pinned_window`): name a test after it.
    pub name: &'static str,
    /// The abilities the store needs for it.
    pub needs: &'static [Ability],
    run: for<'a> fn(&'a S) -> ScenarioFuture<'a>,
}

impl<S> fmt::Debug for Scenario<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for Scenario<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Scenario<S> {}

impl<S: Store> Scenario<S> {
    /// The first ability the scenario needs that `store` lacks: then it is
    /// not applicable to `store`, and a harness reports it as ignored.
    pub fn missing(&self, store: &S) -> Option<Ability> {
        let has = store.abilities();
        self.needs.iter().copied().find(|need| !has.contains(need))
    }

    /// Run it on `store` (a panic is a failure).
    ///
    /// # Panics
    /// When the backend breaks the promise; when the scenario is not
    /// applicable to `store` ([`missing`](Self::missing)), naming the
    /// ability, since a run that skipped its checks must not pass.
    pub fn run<'a>(&self, store: &'a S) -> ScenarioFuture<'a> {
        if let Some(ability) = self.missing(store) {
            panic!("{}: not applicable, the store cannot {ability}", self.name);
        }
        (self.run)(store)
    }
}

macro_rules! scenario {
    ($name:ident $(, $need:ident)*) => {{
        fn run<S: Store>(store: &S) -> ScenarioFuture<'_> {
            Box::pin($name(store))
        }
        Scenario {
            name: stringify!($name),
            needs: &[$(Ability::$need),*],
            run: run::<S>,
        }
    }};
}

/// Every scenario of the contract, in a fixed order.
pub fn scenarios<S: Store>() -> Vec<Scenario<S>> {
    vec![
        scenario!(pinned_window),
        scenario!(a_closed_window_starts_over_at_one),
        scenario!(concurrent_hits_count_each_count_once),
        scenario!(never_more_admitted_than_the_limit),
        scenario!(every_counter_of_a_hit_is_counted),
        scenario!(keys_and_namespaces_never_meet),
        scenario!(a_window_of_window_max_works),
        scenario!(refunds_never_go_below_zero),
        scenario!(refunds_never_create_a_counter),
        scenario!(refunds_apply_only_to_their_own_window),
        scenario!(concurrent_hits_and_refunds_keep_at_most_the_limit),
        scenario!(peek_and_reset),
        scenario!(the_stored_lifetime_is_the_hits_deadline, ReadStored),
        scenario!(refunds_leave_the_lifetime_as_it_is, ReadStored),
        scenario!(
            corrupt_counters_fail_and_are_left_as_they_are,
            Corrupt,
            ReadStored
        ),
        scenario!(the_audit_finds_nothing_after_the_contract, Audit),
        scenario!(
            the_audit_reports_corrupt_counters,
            Audit,
            Corrupt,
            ReadStored
        ),
        scenario!(spends_count_their_cost_and_denials_spend_nothing),
        scenario!(checks_create_nothing_unless_they_open_the_window),
        scenario!(lockouts_are_pinned_to_the_first_denial),
        scenario!(amends_follow_the_refund_rules),
        scenario!(amends_after_a_reset_never_touch_the_new_window),
        scenario!(concurrent_spends_never_pass_the_limit),
    ]
}

/// What [`run_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The scenarios that ran and passed.
    pub passed: Vec<&'static str>,
    /// The scenarios that need an ability the store lacks.
    pub not_applicable: Vec<&'static str>,
}

/// Run every scenario that applies to `store`, one after another.
///
/// # Panics
/// At the first broken promise, with the scenario's name.
pub async fn run_all<S: Store>(store: &S) -> Report {
    let mut report = Report::default();
    for scenario in scenarios::<S>() {
        if scenario.missing(store).is_some() {
            report.not_applicable.push(scenario.name);
            continue;
        }
        let name = scenario.name;
        let guard = Naming(name);
        scenario.run(store).await;
        std::mem::forget(guard);
        report.passed.push(name);
    }
    report
}

/// Names the scenario whose run is unwinding.
struct Naming(&'static str);

impl Drop for Naming {
    fn drop(&mut self) {
        eprintln!("testkit: scenario {} failed", self.0);
    }
}

// --- helpers ---------------------------------------------------------------

/// The windows the suite lets close: short, and still far above the
/// millisecond a store may round to.
const SHORT: Duration = Duration::from_millis(300);
/// Past [`SHORT`], with room for a loaded machine.
const PAST_SHORT: Duration = Duration::from_millis(420);

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).expect("the suite's quotas are valid")
}

fn minute(limit: u64) -> Quota {
    quota(limit, Duration::from_secs(60))
}

async fn hit<B: Backend>(backend: &B, namespace: &str, key: &Key, quota: Quota) -> Hit {
    backend
        .hit(namespace, key, quota)
        .await
        .unwrap_or_else(|e| panic!("hit on {namespace}/{key:?}: {e}"))
}

async fn refund<B: Backend>(backend: &B, namespace: &str, key: &Key, hit: &Hit) -> bool {
    backend
        .refund(namespace, key, hit)
        .await
        .unwrap_or_else(|e| panic!("refund on {namespace}/{key:?}: {e}"))
}

async fn peek<B: Backend>(backend: &B, namespace: &str, key: &Key) -> Option<Hit> {
    backend
        .peek(namespace, key)
        .await
        .unwrap_or_else(|e| panic!("peek on {namespace}/{key:?}: {e}"))
}

/// The count `peek` reads, 0 when there is no counter.
async fn count<B: Backend>(backend: &B, namespace: &str, key: &Key) -> u64 {
    peek(backend, namespace, key).await.map_or(0, |h| h.count)
}

async fn stored<S: Store>(store: &S, backend: &S::Backend, namespace: &str, key: &Key) -> Stored {
    store
        .stored(backend, namespace, key)
        .await
        .expect("the store claims ReadStored but `stored` answered None")
}

fn assert_reset_within(hit: &Hit, window: Duration, what: &str) {
    assert!(
        hit.reset <= window && hit.reset + Duration::from_secs(2).min(window / 2) > window,
        "{what}: {:?} left of a {window:?} window",
        hit.reset
    );
}

// --- the scenarios ---------------------------------------------------------

/// Hits never move the deadline: every hit of a window names the deadline
/// the first one set, and the time left only shrinks.
async fn pinned_window<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("alice");
    let q = minute(10);
    let first = hit(&backend, "login", &key, q).await;
    assert_eq!(first.count, 1, "the first hit opens the window");
    assert_reset_within(&first, q.window().as_duration(), "the first hit");
    assert!(first.deadline.is_some(), "a counted hit names its window");
    tokio::time::sleep(Duration::from_millis(60)).await;
    let mut last = first;
    for n in 2..=4 {
        let later = hit(&backend, "login", &key, q).await;
        assert_eq!(later.count, n, "hit {n} is counted");
        if let Some(deadline) = later.deadline {
            assert_eq!(Some(deadline), first.deadline, "hit {n} moved the deadline");
        }
        assert!(
            later.reset + Duration::from_millis(40) <= first.reset,
            "hit {n} refreshed the window: {:?} left, then {:?}",
            first.reset,
            later.reset
        );
        assert!(later.reset <= last.reset, "hit {n}: the time left grew");
        last = later;
    }
    let peeked = peek(&backend, "login", &key).await.expect("a live counter");
    assert_eq!(peeked.count, 4);
    assert!(peeked.reset <= last.reset, "peek: the time left grew");
    assert_eq!(
        hit(&backend, "login", &Key::new("bob"), q).await.count,
        1,
        "another key, its own counter"
    );
}

/// A hit after first-hit + window opens a new window at 1, with a new
/// deadline; the closed counter is gone for peek and reset.
async fn a_closed_window_starts_over_at_one<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = quota(2, SHORT);
    let first = hit(&backend, "n", &key, q).await;
    assert_reset_within(&first, SHORT, "the first hit");
    assert_eq!(hit(&backend, "n", &key, q).await.count, 2);
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        peek(&backend, "n", &key).await,
        None,
        "a closed window is absent"
    );
    let again = hit(&backend, "n", &key, q).await;
    assert_eq!(again.count, 1, "a new window");
    assert_reset_within(&again, SHORT, "the new window's first hit");
    assert_ne!(again.deadline, first.deadline, "a new deadline");
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        !backend.reset("n", &key).await.expect("reset"),
        "a closed window was no counter to reset"
    );
}

/// Hits in flight together, over four instances and many keys: on each key
/// the counts are 1..=N, each exactly once, all in one window.
async fn concurrent_hits_count_each_count_once<S: Store>(store: &S) {
    let first = store.fresh().await;
    let mut instances = vec![first.clone()];
    for _ in 1..4 {
        instances.push(store.another(&first).await);
    }
    let hits = 400usize;
    let q = minute(u64::MAX);
    let mut tasks = Vec::new();
    for i in 0..hits {
        let backend = instances[i % instances.len()].clone();
        let key = if i % 2 == 0 {
            "hot".to_owned()
        } else {
            format!("k{}", i % 40)
        };
        tasks.push(tokio::spawn(async move {
            let got = hit(&backend, "every", &Key::new(&key), q).await;
            (key, got)
        }));
    }
    let mut by_key: HashMap<String, Vec<Hit>> = HashMap::new();
    for task in tasks {
        let (key, got) = task.await.expect("a hit task");
        by_key.entry(key).or_default().push(got);
    }
    assert_eq!(by_key.len(), 21);
    for (key, hits) in &by_key {
        let mut counts: Vec<u64> = hits.iter().map(|h| h.count).collect();
        counts.sort_unstable();
        let want: Vec<u64> = (1..=hits.len() as u64).collect();
        assert_eq!(counts, want, "{key}: every count exactly once");
        assert!(
            hits.iter()
                .all(|h| h.deadline.is_some() && h.deadline == hits[0].deadline),
            "{key}: one window"
        );
        let peeked = peek(&first, "every", &Key::new(key)).await.expect("live");
        assert_eq!(peeked.count, hits.len() as u64, "{key}");
    }
}

/// Out of more concurrent hits than the limit, over four instances, exactly
/// the limit get a count within it.
async fn never_more_admitted_than_the_limit<S: Store>(store: &S) {
    for (limit, hits) in [(1u64, 100usize), (37, 300), (300, 300)] {
        let first = store.fresh().await;
        let mut instances = vec![first.clone()];
        for _ in 1..4 {
            instances.push(store.another(&first).await);
        }
        let q = minute(limit);
        let mut tasks = Vec::new();
        for i in 0..hits {
            let backend = instances[i % instances.len()].clone();
            tasks.push(tokio::spawn(async move {
                hit(&backend, "burst", &Key::new("*"), q).await
            }));
        }
        let mut admitted = Vec::new();
        for task in tasks {
            let got = task.await.expect("a hit task");
            if got.count <= limit {
                admitted.push(got.count);
            }
        }
        admitted.sort_unstable();
        let want: Vec<u64> = (1..=limit.min(hits as u64)).collect();
        assert_eq!(
            admitted, want,
            "limit {limit}, {hits} hits over 4 instances"
        );
    }
}

/// `hit_all` counts every counter, each with its own window, and they stay
/// apart from each other.
async fn every_counter_of_a_hit_is_counted<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("c");
    let minute_q = minute(10);
    let hour_q = quota(10, Duration::from_secs(3600));
    let counters = [
        Counter {
            namespace: "api",
            quota: minute_q,
        },
        Counter {
            namespace: "api:10/3600000ms",
            quota: hour_q,
        },
    ];
    for n in 1..=4 {
        let hits = backend
            .hit_all(&key, &counters)
            .await
            .unwrap_or_else(|e| panic!("hit_all: {e}"));
        assert_eq!(hits.len(), 2, "one hit per counter");
        assert_eq!((hits[0].count, hits[1].count), (n, n), "hit {n}");
        assert_reset_within(
            &hits[0],
            minute_q.window().as_duration(),
            "the minute counter",
        );
        assert_reset_within(&hits[1], hour_q.window().as_duration(), "the hour counter");
    }
    assert_eq!(count(&backend, "api", &key).await, 4);
    assert_eq!(count(&backend, "api:10/3600000ms", &key).await, 4);
    // A single hit on one of them leaves the other alone.
    assert_eq!(hit(&backend, "api", &key, minute_q).await.count, 5);
    assert_eq!(count(&backend, "api:10/3600000ms", &key).await, 4);
}

/// Keys are bytes: every key, and every namespace, has a counter of its
/// own, whatever separators, braces or bytes it holds.
async fn keys_and_namespaces_never_meet<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let q = minute(1_000);
    let long = [b"victim-".as_slice(), &[b'l'; 70]].concat();
    let keys: Vec<Vec<u8>> = [
        b"".as_slice(),
        b"a",
        b"a\0",
        b"\xff\xfe",
        b"{tag}:x",
        b"'; DROP TABLE x; --",
        b"victim",
        b"{victim}",
        b"}victim",
        b"victim}",
        b"%7Bvictim%7D",
        b"%",
        b"victim\t",
        b":victim",
        b"b:victim",
        &long,
        &long[..70],
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    for (i, key) in keys.iter().enumerate() {
        for _ in 0..=i {
            hit(&backend, "a", &Key::new(key), q).await;
        }
        hit(&backend, "a:b", &Key::new(key), q).await;
        hit(&backend, "a:b:", &Key::new(key), q).await;
    }
    for (i, key) in keys.iter().enumerate() {
        let what = key.escape_ascii();
        assert_eq!(
            count(&backend, "a", &Key::new(key)).await,
            i as u64 + 1,
            "a/{what}"
        );
        assert_eq!(
            count(&backend, "a:b", &Key::new(key)).await,
            1,
            "a:b/{what}"
        );
        assert_eq!(
            count(&backend, "a:b:", &Key::new(key)).await,
            1,
            "a:b:/{what}"
        );
    }
}

/// A quota at exactly [`Window::MAX`] is accepted, and its counter gets that
/// lifetime.
async fn a_window_of_window_max_works<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let max = Quota::with_window(NonZeroU64::MIN, Window::MAX);
    let first = hit(&backend, "n", &key, max).await;
    assert_eq!(first.count, 1);
    assert_eq!(first.reset, Window::MAX.as_duration());
    assert_eq!(hit(&backend, "n", &key, max).await.count, 2);
    if store.abilities().contains(&Ability::ReadStored) {
        match stored(store, &backend, "n", &key).await {
            Stored::Value { expiry, .. } => {
                assert_eq!(expiry, first.deadline.map(NonZeroU64::get), "the lifetime")
            }
            Stored::Absent => panic!("the counter is not stored"),
        }
    }
}

/// A refund takes back one hit of its window, and never takes the count
/// below zero; the window is kept, and counting goes on from there.
async fn refunds_never_go_below_zero<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(10);
    let first = hit(&backend, "n", &key, q).await;
    let second = hit(&backend, "n", &key, q).await;
    assert_eq!(second.count, 2);
    assert!(refund(&backend, "n", &key, &second).await, "the second hit");
    assert_eq!(count(&backend, "n", &key).await, 1);
    assert!(refund(&backend, "n", &key, &first).await, "the first hit");
    assert_eq!(count(&backend, "n", &key).await, 0);
    assert!(
        !refund(&backend, "n", &key, &first).await,
        "never below zero"
    );
    assert_eq!(count(&backend, "n", &key).await, 0);
    let third = hit(&backend, "n", &key, q).await;
    assert_eq!(third.count, 1, "counted on from zero");
    assert_eq!(third.deadline, first.deadline, "in the same window");
}

/// A refund never creates a counter: not for a namespace or key that has
/// none, not after a reset, and not for a hit the store did not count.
async fn refunds_never_create_a_counter<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(10);
    let counted = hit(&backend, "n", &key, q).await;
    assert!(
        !refund(&backend, "other", &key, &counted).await,
        "another namespace"
    );
    assert_eq!(peek(&backend, "other", &key).await, None, "nothing created");
    assert!(
        !refund(&backend, "n", &Key::new("nobody"), &counted).await,
        "another key"
    );
    assert_eq!(peek(&backend, "n", &Key::new("nobody")).await, None);

    let uncounted = Hit {
        deadline: None,
        ..counted
    };
    assert!(
        !refund(&backend, "n", &key, &uncounted).await,
        "a hit not counted in the store is never refunded"
    );
    assert_eq!(count(&backend, "n", &key).await, 1);

    assert!(
        backend.reset("n", &key).await.expect("reset"),
        "the counter existed"
    );
    assert!(
        !refund(&backend, "n", &key, &counted).await,
        "after a reset"
    );
    assert_eq!(
        peek(&backend, "n", &key).await,
        None,
        "a reset counter stays gone"
    );
    if store.abilities().contains(&Ability::ReadStored) {
        assert_eq!(stored(store, &backend, "n", &key).await, Stored::Absent);
        assert_eq!(stored(store, &backend, "other", &key).await, Stored::Absent);
    }
}

/// A refund applies only to the window its hit was counted in: not once it
/// has closed, not to the window that opened after it, not under another
/// window's deadline.
async fn refunds_apply_only_to_their_own_window<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = quota(10, SHORT);
    let old = hit(&backend, "n", &key, q).await;
    assert!(old.deadline.is_some(), "a counted hit names its window");
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        !refund(&backend, "n", &key, &old).await,
        "its window closed"
    );
    assert_eq!(
        peek(&backend, "n", &key).await,
        None,
        "a late refund creates nothing"
    );
    if store.abilities().contains(&Ability::ReadStored) {
        assert_eq!(
            stored(store, &backend, "n", &key).await,
            Stored::Absent,
            "a late refund stores nothing, no lifetime either"
        );
    }

    let first = hit(&backend, "n", &key, q).await;
    let second = hit(&backend, "n", &key, q).await;
    assert_eq!(second.count, 2);
    assert_eq!(first.deadline, second.deadline);
    assert_ne!(first.deadline, old.deadline, "a new window");
    assert!(
        !refund(&backend, "n", &key, &old).await,
        "the old window's hit never touches the new one"
    );
    let elsewhere = Hit {
        deadline: first.deadline.and_then(|d| d.checked_add(1)),
        ..first
    };
    assert!(
        !refund(&backend, "n", &key, &elsewhere).await,
        "another window's deadline"
    );
    assert_eq!(count(&backend, "n", &key).await, 2);
    assert!(refund(&backend, "n", &key, &second).await);
    assert_eq!(count(&backend, "n", &key).await, 1);
    tokio::time::sleep(PAST_SHORT).await;
    assert!(!refund(&backend, "n", &key, &first).await, "closed on time");
    assert_eq!(
        peek(&backend, "n", &key).await,
        None,
        "the window closed on time"
    );
}

/// Many tasks, each on its own instance, hit one key and take back every
/// hit they do not keep (every denial, and two admitted hits in three): no
/// more than `limit` admitted hits are kept, and the counter ends holding
/// exactly the kept hits.
async fn concurrent_hits_and_refunds_keep_at_most_the_limit<S: Store>(store: &S) {
    let limit = 20;
    let q = quota(limit, Duration::from_secs(600));
    let first = store.fresh().await;
    let kept = Arc::new(AtomicU64::new(0));
    let refunded = Arc::new(AtomicU64::new(0));
    let counted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..8u64 {
        let backend = store.another(&first).await;
        let (kept, refunded, counted) = (kept.clone(), refunded.clone(), counted.clone());
        tasks.push(tokio::spawn(async move {
            let key = Key::new("shared");
            for i in 0..150u64 {
                let got = hit(&backend, "race", &key, q).await;
                if got.deadline.is_some() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                if got.count <= limit && (task + i) % 3 == 0 {
                    kept.fetch_add(1, Ordering::Relaxed);
                } else if refund(&backend, "race", &key, &got).await {
                    refunded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a hit task");
    }
    let (kept, refunded, counted) = (
        kept.load(Ordering::Relaxed),
        refunded.load(Ordering::Relaxed),
        counted.load(Ordering::Relaxed),
    );
    assert!(
        kept <= limit,
        "kept {kept} admitted hits past the limit of {limit}"
    );
    assert!(kept > 0, "some hits were kept");
    assert_eq!(
        refunded,
        counted - kept,
        "every counted hit not kept came back"
    );
    assert_eq!(
        count(&first, "race", &Key::new("shared")).await,
        kept,
        "the counter holds exactly the kept hits"
    );
}

/// `peek` reads without counting; `reset` deletes, once.
async fn peek_and_reset<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(5);
    assert_eq!(peek(&backend, "n", &key).await, None);
    hit(&backend, "n", &key, q).await;
    hit(&backend, "n", &key, q).await;
    let peeked = peek(&backend, "n", &key).await.expect("a live counter");
    assert_eq!(peeked.count, 2);
    assert_reset_within(&peeked, q.window().as_duration(), "peek");
    assert_eq!(peeked.deadline, None, "a peek counted nothing to refund");
    assert_eq!(count(&backend, "n", &key).await, 2, "peek does not count");
    assert!(backend.reset("n", &key).await.expect("reset"));
    assert!(!backend.reset("n", &key).await.expect("reset"), "once");
    assert_eq!(peek(&backend, "n", &key).await, None);
    assert_eq!(hit(&backend, "n", &key, q).await.count, 1, "a fresh window");
}

/// The store holds the counter with the hit's deadline as its lifetime,
/// attached by the first hit and never moved by the later ones.
async fn the_stored_lifetime_is_the_hits_deadline<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(10);
    assert_eq!(stored(store, &backend, "n", &key).await, Stored::Absent);
    let first = hit(&backend, "n", &key, q).await;
    let deadline = first.deadline.map(NonZeroU64::get);
    let want = |count: u64| Stored::Value {
        value: count.to_string(),
        expiry: deadline,
    };
    assert_eq!(stored(store, &backend, "n", &key).await, want(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    for n in 2..=4 {
        hit(&backend, "n", &key, q).await;
        assert_eq!(
            stored(store, &backend, "n", &key).await,
            want(n),
            "hit {n} left the lifetime as it was"
        );
    }
}

/// A refund changes the count only: the lifetime stays as the first hit set
/// it, down to zero.
async fn refunds_leave_the_lifetime_as_it_is<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(10);
    let first = hit(&backend, "n", &key, q).await;
    let second = hit(&backend, "n", &key, q).await;
    let expiry = first.deadline.map(NonZeroU64::get);
    assert!(refund(&backend, "n", &key, &second).await);
    assert!(refund(&backend, "n", &key, &first).await);
    assert!(
        !refund(&backend, "n", &key, &first).await,
        "never below zero"
    );
    assert_eq!(
        stored(store, &backend, "n", &key).await,
        Stored::Value {
            value: "0".to_owned(),
            expiry
        },
        "the count is zero and the lifetime unchanged"
    );
}

/// A value that is not a counter fails hits, peeks and refunds with
/// [`BackendError::Corrupt`], whatever the quota, and stays as it was.
async fn corrupt_counters_fail_and_are_left_as_they_are<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("bad");
    store
        .corrupt(&backend, "n", &key)
        .await
        .expect("the store claims Corrupt but `corrupt` answered None");
    let before = stored(store, &backend, "n", &key).await;
    assert_ne!(before, Stored::Absent, "the corrupt value is stored");
    for q in [minute(5), minute(u64::MAX), quota(1, SHORT)] {
        match backend.hit("n", &key, q).await {
            Err(err @ BackendError::Corrupt { .. }) => {
                assert!(err.is_corrupt());
            }
            other => panic!("a hit on a corrupt counter: {other:?}"),
        }
    }
    let peeked = backend.peek("n", &key).await;
    assert!(
        matches!(peeked, Err(BackendError::Corrupt { .. })),
        "peek: {peeked:?}"
    );
    let forged = Hit {
        count: 1,
        reset: Duration::from_secs(60),
        deadline: match &before {
            Stored::Value {
                expiry: Some(expiry),
                ..
            } => NonZeroU64::new(*expiry),
            _ => NonZeroU64::new(1),
        },
    };
    let refunded = backend.refund("n", &key, &forged).await;
    assert!(
        matches!(refunded, Ok(false) | Err(BackendError::Corrupt { .. })),
        "a refund on a corrupt counter: {refunded:?}"
    );
    assert_eq!(
        stored(store, &backend, "n", &key).await,
        before,
        "the corrupt value was left as it is"
    );
    assert_eq!(
        hit(&backend, "n", &Key::new("good"), minute(5)).await.count,
        1,
        "other keys count on"
    );
}

/// After hits, refunds, resets and closed windows, the audit finds no
/// counter without a lifetime and nothing corrupt.
async fn the_audit_finds_nothing_after_the_contract<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let long = quota(5, Duration::from_secs(60));
    for i in 0..10 {
        let key = Key::display(format_args!("k{i}"));
        let got = hit(&backend, "n", &key, long).await;
        hit(&backend, "n:short", &key, quota(5, SHORT)).await;
        if i % 2 == 0 {
            refund(&backend, "n", &key, &got).await;
        }
        if i % 3 == 0 {
            backend.reset("n", &key).await.expect("reset");
        }
    }
    tokio::time::sleep(PAST_SHORT).await;
    let audit = store
        .audit(&backend)
        .await
        .expect("the store claims Audit but `audit` answered None");
    assert_eq!(audit, Audit::default(), "a clean store");
}

/// The audit reports a corrupt value as corrupt, and leaves it as it is.
async fn the_audit_reports_corrupt_counters<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("bad");
    hit(&backend, "n", &Key::new("good"), minute(5)).await;
    store
        .corrupt(&backend, "n", &key)
        .await
        .expect("the store claims Corrupt but `corrupt` answered None");
    let before = stored(store, &backend, "n", &key).await;
    let audit = store
        .audit(&backend)
        .await
        .expect("the store claims Audit but `audit` answered None");
    assert_eq!(
        audit,
        Audit {
            without_lifetime: 0,
            corrupt: 1
        }
    );
    assert_eq!(
        stored(store, &backend, "n", &key).await,
        before,
        "left as it is"
    );
}

// --- spends, lockouts and amends -------------------------------------------

/// A fresh backend that says it keeps the spend contract: a backend that
/// does not fails these scenarios, since a layer with a cost, a charge, a
/// lockout or a reset on success would not build on it.
async fn spender<S: Store>(store: &S) -> S::Backend {
    store.fresh().await
}

async fn spend<B: Spending>(
    backend: &B,
    key: &Key,
    counters: &[Counter<'_>],
    spend: Spend,
) -> Hits {
    let hits = backend
        .spend_all(key, counters, spend)
        .await
        .unwrap_or_else(|e| panic!("spend on {key:?}: {e}"));
    assert_eq!(hits.len(), counters.len(), "one hit per counter");
    hits
}

async fn amend<B: Spending>(
    backend: &B,
    namespace: &str,
    key: &Key,
    hit: &Hit,
    amend: Amend,
) -> bool {
    backend
        .amend(namespace, key, hit, amend)
        .await
        .unwrap_or_else(|e| panic!("amend on {namespace}/{key:?}: {e}"))
}

fn denied(hit: &Hit, limit: u64) -> bool {
    hit.count > limit && hit.deadline.is_none()
}

/// A spend of n counts n; a spend that does not fit spends nothing, on any
/// of its counters; a check (cost 0) on a full counter is denied.
async fn spends_count_their_cost_and_denials_spend_nothing<S: Store>(store: &S) {
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: minute(10),
    }];
    let first = spend(&backend, &key, &one, Spend::cost(4)).await[0];
    assert_eq!(first.count, 4);
    assert!(first.deadline.is_some(), "a counted spend names its window");
    assert_reset_within(&first, Duration::from_secs(60), "a new counter");
    assert!(denied(
        &spend(&backend, &key, &one, Spend::cost(7)).await[0],
        10
    ));
    assert_eq!(
        count(&backend, "a", &key).await,
        4,
        "a denied spend spends nothing"
    );
    let full = spend(&backend, &key, &one, Spend::cost(6)).await[0];
    assert_eq!((full.count, full.deadline), (10, first.deadline));
    assert!(denied(
        &spend(&backend, &key, &one, Spend::cost(0)).await[0],
        10
    ));
    assert!(denied(
        &spend(&backend, &key, &one, Spend::cost(1)).await[0],
        10
    ));
    assert_eq!(count(&backend, "a", &key).await, 10);

    let other = Key::new("both");
    let two = [
        Counter {
            namespace: "a",
            quota: minute(10),
        },
        Counter {
            namespace: "b",
            quota: minute(5),
        },
    ];
    let hits = spend(&backend, &other, &two, Spend::cost(4)).await;
    assert_eq!((hits[0].count, hits[1].count), (4, 4));
    let hits = spend(&backend, &other, &two, Spend::cost(3)).await;
    assert!(
        hits.iter().all(|h| h.deadline.is_none()),
        "nothing counted anywhere"
    );
    assert!(denied(&hits[1], 5));
    assert_eq!(count(&backend, "a", &other).await, 4, "all or nothing");
    assert_eq!(count(&backend, "b", &other).await, 4, "all or nothing");
    let hits = spend(&backend, &other, &two, Spend::cost(1)).await;
    assert_eq!((hits[0].count, hits[1].count), (5, 5));
}

/// A check creates nothing; with `open` it creates the counter at 0 with
/// its window; a cost above the limit never fits, not even on no counter.
async fn checks_create_nothing_unless_they_open_the_window<S: Store>(store: &S) {
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: minute(3),
    }];
    let check = spend(&backend, &key, &one, Spend::cost(0)).await[0];
    assert_eq!((check.count, check.deadline), (0, None));
    assert_eq!(
        peek(&backend, "a", &key).await,
        None,
        "a check creates nothing"
    );
    let opened = spend(&backend, &key, &one, Spend::cost(0).open()).await[0];
    assert_eq!(opened.count, 0);
    assert!(opened.deadline.is_some(), "an opened window is named");
    let seen = peek(&backend, "a", &key)
        .await
        .expect("open creates the counter");
    assert_eq!(seen.count, 0);
    assert_reset_within(&seen, Duration::from_secs(60), "an opened counter");

    let big = Key::new("big");
    let hit = spend(&backend, &big, &one, Spend::cost(4)).await[0];
    assert!(denied(&hit, 3), "a cost above the limit never fits");
    assert_eq!(peek(&backend, "a", &big).await, None);
}

/// A lockout starts at the first denial and lasts its duration, however
/// often the key knocks; then the key starts over; a reset lifts it.
async fn lockouts_are_pinned_to_the_first_denial<S: Store>(store: &S) {
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "login",
        quota: quota(2, SHORT),
    }];
    let block = Window::new(Duration::from_millis(600)).expect("a valid block");
    let locked = Spend::cost(1).block(block);
    assert_eq!(spend(&backend, &key, &one, locked).await[0].count, 1);
    assert_eq!(spend(&backend, &key, &one, locked).await[0].count, 2);
    let first = spend(&backend, &key, &one, locked).await[0];
    assert!(denied(&first, 2));
    assert!(
        first.reset <= Duration::from_millis(600) && first.reset > Duration::from_millis(400),
        "the lockout's end: {:?}",
        first.reset
    );
    // The window closes; the lockout holds, and knocking does not move it.
    tokio::time::sleep(PAST_SHORT).await;
    let again = spend(&backend, &key, &one, locked).await[0];
    assert!(denied(&again, 2), "still locked after the window closed");
    assert!(
        again.reset + Duration::from_millis(150) < first.reset,
        "not extended: {:?} then {:?}",
        first.reset,
        again.reset
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        spend(&backend, &key, &one, locked).await[0].count,
        1,
        "after the lockout"
    );
    spend(&backend, &key, &one, locked).await;
    assert!(denied(&spend(&backend, &key, &one, locked).await[0], 2));
    assert!(
        backend.reset("login", &key).await.expect("reset"),
        "a reset finds the counter"
    );
    assert_eq!(
        spend(&backend, &key, &one, locked).await[0].count,
        1,
        "a reset lifts the lockout"
    );
}

/// Amends never create a counter, never go below zero, may charge past the
/// limit (then later requests are denied), and a clear deletes the counter.
async fn amends_follow_the_refund_rules<S: Store>(store: &S) {
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: quota(3, SHORT),
    }];
    let check = spend(&backend, &key, &one, Spend::cost(0)).await[0];
    for change in [Amend::Charge(5), Amend::Refund(1), Amend::Clear] {
        assert!(
            !amend(&backend, "a", &key, &check, change).await,
            "nothing was counted"
        );
    }
    assert_eq!(
        peek(&backend, "a", &key).await,
        None,
        "an amend creates nothing"
    );

    let opened = spend(&backend, &key, &one, Spend::cost(0).open()).await[0];
    assert!(amend(&backend, "a", &key, &opened, Amend::Charge(7)).await);
    assert_eq!(
        count(&backend, "a", &key).await,
        7,
        "a charge may pass the limit"
    );
    assert!(denied(
        &spend(&backend, &key, &one, Spend::cost(0)).await[0],
        3
    ));
    assert!(amend(&backend, "a", &key, &opened, Amend::Refund(5)).await);
    assert_eq!(count(&backend, "a", &key).await, 2);
    assert!(amend(&backend, "a", &key, &opened, Amend::Refund(5)).await);
    assert_eq!(count(&backend, "a", &key).await, 0, "never below zero");
    assert!(!amend(&backend, "a", &key, &opened, Amend::Refund(1)).await);
    assert!(amend(&backend, "a", &key, &opened, Amend::Clear).await);
    assert_eq!(peek(&backend, "a", &key).await, None, "a clear deletes it");

    let later = spend(&backend, &key, &one, Spend::cost(1)).await[0];
    tokio::time::sleep(PAST_SHORT).await;
    for change in [Amend::Charge(5), Amend::Refund(1), Amend::Clear] {
        assert!(
            !amend(&backend, "a", &key, &later, change).await,
            "its window closed"
        );
    }
    assert_eq!(
        peek(&backend, "a", &key).await,
        None,
        "a late amend creates nothing"
    );
    if store.abilities().contains(&Ability::ReadStored) {
        assert_eq!(stored(store, &backend, "a", &key).await, Stored::Absent);
    }
}

/// Hit, reset, hit, then an amend of the first hit, over many keys: the
/// new window keeps its hit every time, even when both windows close in
/// the same instant.
async fn amends_after_a_reset_never_touch_the_new_window<S: Store>(store: &S) {
    let backend = spender(store).await;
    let q = minute(10);
    let mut wrong = Vec::new();
    for i in 0..200 {
        let key = Key::new(format!("k{i}"));
        let old = hit(&backend, "n", &key, q).await;
        backend.reset("n", &key).await.expect("reset");
        hit(&backend, "n", &key, q).await;
        let refunded = refund(&backend, "n", &key, &old).await;
        let charged = amend(&backend, "n", &key, &old, Amend::Charge(5)).await;
        let cleared = amend(&backend, "n", &key, &old, Amend::Clear).await;
        if refunded || charged || cleared || count(&backend, "n", &key).await != 1 {
            wrong.push(i);
        }
    }
    assert!(
        wrong.is_empty(),
        "the old window's amends reached the new one for keys {wrong:?}"
    );
}

/// Many tasks, each on its own instance, spend varied costs on one key:
/// the admitted costs never add up past the limit, and the counter holds
/// exactly what was admitted.
async fn concurrent_spends_never_pass_the_limit<S: Store>(store: &S) {
    let limit = 100;
    let q = quota(limit, Duration::from_secs(600));
    let first = spender(store).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let backend = if t == 0 {
            first.clone()
        } else {
            store.another(&first).await
        };
        let admitted = Arc::clone(&admitted);
        tasks.push(tokio::spawn(async move {
            let key = Key::new("hot");
            let one = [Counter {
                namespace: "n",
                quota: q,
            }];
            for i in 0..25u64 {
                let cost = 1 + (t + i * 3) % 7;
                let hit = backend
                    .spend_all(&key, &one, Spend::cost(cost))
                    .await
                    .expect("spend")[0];
                if hit.count <= limit {
                    assert!(hit.deadline.is_some(), "an admitted spend is counted");
                    admitted.fetch_add(cost, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a spending task");
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let stored = count(&first, "n", &Key::new("hot")).await;
    assert!(admitted <= limit, "{admitted} admitted of {limit}");
    assert_eq!(admitted, stored, "the counter holds what was admitted");
    assert!(
        admitted > limit / 2,
        "most of the budget was spent: {admitted}"
    );
}
