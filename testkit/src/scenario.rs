//! One scenario of the contract: its name, the abilities it needs, and the
//! function that runs it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::store::{Ability, Store};

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

impl<S> Scenario<S> {
    /// The scenario `name`, run by `run` on a store with every ability of
    /// `needs` (the `scenario!` macro of lib.rs builds it).
    pub(crate) const fn new(
        name: &'static str,
        needs: &'static [Ability],
        run: for<'a> fn(&'a S) -> ScenarioFuture<'a>,
    ) -> Self {
        Self { name, needs, run }
    }
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
