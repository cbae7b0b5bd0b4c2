//! The limits held in the store that a budget reads
//! ([`limits`](super::BudgetLayer::limits)), and the quotas a call of one
//! key spends from: chosen once per ask of the store.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::LimitScope;
use crate::key::Key;
use crate::limits::Page;
use crate::quota::{Quota, Window};

/// A budget's limits held in the store, as this process last read them.
pub(crate) struct Stored {
    /// The budget's own (the calls', beside tokens).
    pub(crate) calls: Arc<Page>,
    /// The tokens budget's, under its own name.
    pub(crate) tokens: Option<Arc<Page>>,
    /// What the store's windows add to a stored quota's.
    pub(crate) margin: Duration,
    /// How often a head asleep until its window ends looks for a raised
    /// limit: a part of the book's staleness bound.
    pub(crate) look: Duration,
}

impl Stored {
    /// The quotas of a call of `key`: each counter's stored limit of the
    /// key, else its stored limit of the layer, else `own`.
    #[cold]
    pub(crate) fn apply(&self, key: &Key, own: Quotas) -> Quotas {
        let calls = self.pick(&self.calls, key).unwrap_or(own.calls);
        let tokens = match (&self.tokens, own.tokens) {
            (Some(page), Some(quota)) => Some(self.pick(page, key).unwrap_or(quota)),
            (_, tokens) => tokens,
        };
        Quotas { calls, tokens }
    }

    /// The stored limit of `key` on `page`, else the layer's, as the store
    /// counts it (the margin added).
    fn pick(&self, page: &Arc<Page>, key: &Key) -> Option<Quota> {
        let stored = page.current();
        let quota = stored
            .key(key.as_bytes())
            .or_else(|| stored.get(LimitScope::Layer))?;
        let limit = std::num::NonZeroU64::new(quota.limit())?;
        // A window the margin takes past `Window::MAX` is counted at the
        // longest window a store keeps.
        let window = quota
            .window()
            .as_duration()
            .checked_add(self.margin)
            .and_then(|window| Window::new(window).ok())
            .unwrap_or(Window::MAX);
        Some(Quota::with_window(limit, window))
    }
}

/// The quotas a call of one key spends from, as the store counts them (the
/// margin added): the calls', and the tokens' when there are any. Chosen
/// once per ask of the store, so that the store and its answer's reading
/// use the same limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quotas {
    pub(crate) calls: Quota,
    pub(crate) tokens: Option<Quota>,
}

impl Quotas {
    /// The quota a call's cost is spent from: the tokens', or the one.
    #[inline]
    pub(crate) fn cost(&self) -> Quota {
        self.tokens.unwrap_or(self.calls)
    }

    /// Whether a limit of `self` is above the same one of `then`: a call
    /// turned away under `then` may fit now.
    pub(crate) fn raised_from(&self, then: &Self) -> bool {
        let above = |now: Option<Quota>, then: Option<Quota>| match (now, then) {
            (Some(now), Some(then)) => now.limit() > then.limit(),
            _ => false,
        };
        self.calls.limit() > then.calls.limit() || above(self.tokens, then.tokens)
    }
}
