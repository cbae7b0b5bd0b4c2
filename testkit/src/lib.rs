//! The [backend contract] of [`tower-pinned-window`](tower_pinned_window)
//! as a test suite, written once and run against every [`Backend`]: the
//! crate's own (memory, Redis, Redis Cluster, Redis Sentinel, PostgreSQL,
//! [`PrivateKeys`] over any of them) and yours. It stands beside the crate
//! as `tower-test` stands beside `tower`, and uses only its public API.
//!
//! Each [`Scenario`] checks one promise of the contract on a fresh backend:
//! the pinned window, the exact count under concurrency, refunds, corrupt
//! counters, peek and reset, the audit where the store has one, and the
//! spend contract (costs, lockouts, amends); [`lease_scenarios`],
//! [`heed_scenarios`] and [`limit_scenarios`] hold those of the in-flight
//! contract, of the provider's word and of limits held in the store, for a
//! backend with those traits. A test harness turns
//! each scenario into a test of its own (so a failure names itself), or
//! [`run_all`] runs them one after another.
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
//! ```toml
//! [dev-dependencies]
//! tower-pinned-window-testkit = "0.1"
//! tokio = { version = "1", features = ["rt-multi-thread"] }
//! ```
//!
//! # Example: running the contract against a backend
//!
//! A store that can only make fresh backends runs every scenario that needs
//! no [`Ability`]. This runs the whole suite against the in-memory backend
//! (swap in your own), then checks what passed; [`example`] has a backend
//! written from scratch, a map behind a lock, that passes it too:
//!
//! ```
//! use tower_pinned_window::backend::MemoryBackend;
//! use tower_pinned_window_testkit::{self as testkit, Store};
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
//! `integration/tests/contract.rs` and in each backend's test file.
//!
//! [backend contract]: tower_pinned_window::backend#the-contract

/// One [`Scenario`] of the scenario function `$name`, which needs the
/// abilities `$need`.
macro_rules! scenario {
    // A scenario of the spend contract: its store's backend spends.
    (spends: $name:ident $(, $need:ident)*) => {{
        fn run<S: $crate::store::Store>(store: &S) -> $crate::scenario::ScenarioFuture<'_>
        where
            S::Backend: ::tower_pinned_window::backend::Spending,
        {
            Box::pin($name(store))
        }
        $crate::scenario::Scenario::new(
            stringify!($name),
            &[$($crate::store::Ability::$need),*],
            run::<S>,
        )
    }};
    // A scenario of the in-flight contract: its store's backend leases
    // (and spends, for the steps that take a slot and spend together).
    (leases: $name:ident $(, $need:ident)*) => {{
        fn run<S: $crate::store::Store>(store: &S) -> $crate::scenario::ScenarioFuture<'_>
        where
            S::Backend: ::tower_pinned_window::backend::Leasing
                + ::tower_pinned_window::backend::Spending,
        {
            Box::pin($name(store))
        }
        $crate::scenario::Scenario::new(
            stringify!($name),
            &[$($crate::store::Ability::$need),*],
            run::<S>,
        )
    }};
    // A scenario of the provider's word: its store's backend heeds (and
    // so spends).
    (heeds: $name:ident $(, $need:ident)*) => {{
        fn run<S: $crate::store::Store>(store: &S) -> $crate::scenario::ScenarioFuture<'_>
        where
            S::Backend: ::tower_pinned_window::backend::Heeding,
        {
            Box::pin($name(store))
        }
        $crate::scenario::Scenario::new(
            stringify!($name),
            &[$($crate::store::Ability::$need),*],
            run::<S>,
        )
    }};
    // A scenario of limits held in the store: its store's backend holds
    // them.
    (limits: $name:ident $(, $need:ident)*) => {{
        fn run<S: $crate::store::Store>(store: &S) -> $crate::scenario::ScenarioFuture<'_>
        where
            S::Backend: ::tower_pinned_window::backend::Limits,
        {
            Box::pin($name(store))
        }
        $crate::scenario::Scenario::new(
            stringify!($name),
            &[$($crate::store::Ability::$need),*],
            run::<S>,
        )
    }};
    ($name:ident $(, $need:ident)*) => {{
        fn run<S: $crate::store::Store>(store: &S) -> $crate::scenario::ScenarioFuture<'_> {
            Box::pin($name(store))
        }
        $crate::scenario::Scenario::new(
            stringify!($name),
            &[$($crate::store::Ability::$need),*],
            run::<S>,
        )
    }};
}

mod check;
pub mod example;
mod heeds;
mod hits;
mod leases;
mod limits;
mod scenario;
mod spends;
mod store;

pub use heeds::heed_scenarios;
pub use leases::lease_scenarios;
pub use limits::limit_scenarios;
pub use scenario::{Scenario, ScenarioFuture};
pub use store::{Ability, Audit, Private, SlotsRecord, Store, Stored};

use tower_pinned_window::backend::Spending;
#[cfg(doc)]
use tower_pinned_window::backend::{Backend, Hit, PrivateKeys};

/// Every scenario of the contract, in a fixed order: those of [`Backend`]
/// (hits, refunds, peek and reset, what the store's client reads), then
/// those of [`Spending`] (costs, lockouts, amends).
pub fn scenarios<S: Store>() -> Vec<Scenario<S>>
where
    S::Backend: Spending,
{
    let mut all = hit_scenarios();
    all.extend(spends::spend_scenarios());
    all
}

/// The scenarios of [`Backend`] alone, for a backend that counts hits but
/// does not implement [`Spending`] (a layer that spends does not build on
/// it).
pub fn hit_scenarios<S: Store>() -> Vec<Scenario<S>> {
    hits::scenarios()
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
pub async fn run_all<S: Store>(store: &S) -> Report
where
    S::Backend: Spending,
{
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
