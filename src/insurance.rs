//! The insurance limiter: while the backend is out (down, timed out, its
//! breaker open, or full), a store in this process's memory decides, each
//! quota's limit cut to the instance's [`Share`] of it
//! ([`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance)).
//!
//! Every middleware reaches it through one seam: [`Insurance::count`] when
//! the backend failed, over the counters it would have asked the backend
//! about, each limit already cut to the share (the server layer's policy,
//! the outbound layer's one budget), and [`Insurance::amend`] for what the
//! answer hands back, refunds, charges or clears of what it counted.
//! Nothing it counts ever reaches the backend, and every request still goes
//! to the backend first, so the backend decides again from its first
//! answer.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use crate::backend::{
    Amend, Backend, BackendError, Cap, Counter, Hit, Hits, InFlight, Leasing, MemoryBackend,
    SlotId, Spend, Spending, Taken,
};
use crate::key::Key;
use crate::quota::Share;

/// The insurance limiter's share and its counters, made once per layer: the
/// layer's clones and services share the store.
#[derive(Clone, Debug)]
pub(crate) struct Insurance {
    share: Share,
    local: MemoryBackend,
}

impl Insurance {
    /// A limiter at `share`, with a new, bounded store.
    pub(crate) fn new(share: Share) -> Self {
        Self {
            share,
            local: MemoryBackend::new(),
        }
    }

    /// The share of each quota's limit this instance decides at.
    pub(crate) fn share(&self) -> Share {
        self.share
    }

    /// The same store, at another share.
    pub(crate) fn set_share(&mut self, share: Share) {
        self.share = share;
    }

    /// Counts `key` on `counters`, each limit already cut to the
    /// [`share`](Self::share) (a policy's insured counters, or one
    /// budget's counter with its quota
    /// [cut](crate::quota::Quota::share)), spending `spend` under a
    /// middleware that spends: the hits, or the local store's own failure
    /// (full, or a corrupt counter).
    #[cold]
    pub(crate) fn count(
        &self,
        key: &Key,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> Result<Hits, BackendError> {
        // The memory backend answers at once.
        let hits = match spend {
            Some(spend) => self.local.spend_all(key, counters, spend),
            None => self.local.hit_all(key, counters),
        };
        hits.into_inner()
    }

    /// Refunds (`None`) or amends `hit`, which [`count`](Self::count)
    /// counted on `namespace`'s counter for `key`, in the local store.
    #[cold]
    pub(crate) fn amend(
        &self,
        namespace: &str,
        key: &Key,
        hit: &Hit,
        amend: Option<Amend>,
    ) -> Result<bool, BackendError> {
        match amend {
            None => self.local.refund(namespace, key, hit),
            Some(amend) => self.local.amend(namespace, key, hit, amend),
        }
        .into_inner()
    }
}

impl Insurance {
    /// Takes `slot` of `cap` for `key` in the local store, the cap cut to
    /// the [`share`](Self::share) (at least 1): an in-flight layer's slot
    /// while its store is out. Never reaches the store.
    #[cold]
    pub(crate) fn take(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
    ) -> Result<Taken, BackendError> {
        let max = self.share.of(cap.in_flight.max());
        // A local slot dies with the process and is always given back by
        // its guard: it needs no lease, so it gets the longest.
        let in_flight = InFlight::new(max, crate::quota::Window::MAX.as_duration())
            .map_err(|err| BackendError::Unavailable(err.to_string().into()))?;
        let cut = Cap { in_flight, ..cap };
        self.local.take(key, cut, slot).into_inner()
    }

    /// Gives back a slot [`take`](Self::take) took.
    #[cold]
    pub(crate) fn give_back(&self, namespace: &str, key: &Key, slot: SlotId) {
        // The memory backend answers at once.
        let call = pin!(self.local.give_back(namespace, key, slot));
        let _ = matches!(
            call.poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(Ok(true))
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::quota::Quota;

    #[test]
    fn one_entry_point_counts_or_spends_on_the_counters_it_is_given() {
        let insurance = Insurance::new(Share::one_in(2).unwrap());
        let quota = Quota::new(4, Duration::from_secs(60)).unwrap();
        let key = Key::new(b"k");
        // The caller cuts the limit to the share: 2 of 4.
        let cut = quota.share(insurance.share());
        let counter = |namespace| Counter {
            namespace,
            quota: cut,
            lowers: false,
        };
        let hits = insurance.count(&key, &[counter("a"), counter("b")], None);
        let counts: Vec<u64> = hits.unwrap().iter().map(|hit| hit.count).collect();
        assert_eq!(counts, [1, 1], "a hit on each counter");
        let spend = Some(Spend::cost(2));
        let spent = insurance.count(&key, &[counter("a")], spend).unwrap();
        assert_eq!(
            spent[0].count, 3,
            "over the share of 2: denied, nothing spent"
        );
        let spent = insurance.count(&key, &[counter("c")], spend).unwrap();
        assert_eq!(spent[0].count, 2, "a cost of 2 fits the share");
        // What it counted is amended in its own store.
        assert!(
            insurance
                .amend("c", &key, &spent[0], Some(Amend::Refund(2)))
                .unwrap()
        );
        let again = insurance.count(&key, &[counter("c")], None).unwrap();
        assert_eq!(again[0].count, 1);
    }
}
