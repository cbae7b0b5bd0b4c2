//! The insurance limiter: while the backend is out (down, timed out, its
//! breaker open, or full), a store in this process's memory decides, each
//! quota's limit cut to the instance's [`Share`] of it
//! ([`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance)).
//!
//! The verdict reaches it through one seam: [`Insurance::count`] when the
//! backend failed, and [`Insurance::amend`] for what the outcome step hands
//! back, charges or clears of what it counted. Nothing it counts ever
//! reaches the backend, and every request still goes to the backend first,
//! so the backend decides again from its first answer.

use crate::backend::{
    Amend, Backend, BackendError, Counter, Hit, Hits, MemoryBackend, Spend, Spending,
};
use crate::key::Key;
use crate::policy::Policy;
use crate::quota::{Quota, Share};

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

    /// Counts `key` on `policy`'s counters with each limit cut to the share,
    /// spending `spend` under a layer that spends: the hits and the policy
    /// at the share they were counted under, or the local store's own
    /// failure (full, or a corrupt counter).
    #[cold]
    pub(crate) fn count(
        &self,
        policy: &Policy,
        key: &Key,
        spend: Option<Spend>,
    ) -> Result<(Hits, Policy), BackendError> {
        let policy = policy.insured(self.share);
        // The memory backend answers at once.
        let hits = match spend {
            Some(spend) => {
                policy.with_counters(|counters| self.local.spend_all(key, counters, spend))
            }
            None => policy.hit(&self.local, key),
        };
        Ok((hits.into_inner()?, policy))
    }

    /// Spends `spend` of `key` on one counter, `namespace`'s with `quota`'s
    /// limit cut to the share (the outbound layer's one budget).
    #[cold]
    pub(crate) fn spend_one(
        &self,
        namespace: &str,
        quota: Quota,
        key: &Key,
        spend: Spend,
    ) -> Result<Hit, BackendError> {
        let counter = Counter {
            namespace,
            quota: quota.share(self.share),
            lowers: false,
        };
        let hits = self
            .local
            .spend_all(key, std::slice::from_ref(&counter), spend)
            .into_inner()?;
        hits.first()
            .copied()
            .ok_or_else(|| BackendError::Unavailable("the backend answered no hit".into()))
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
