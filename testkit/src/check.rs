//! The helpers the scenarios share: the suite's windows and quotas, and
//! backend calls that panic with what failed.

use std::time::Duration;

use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Backend, Hit};
use tower_pinned_window::key::Key;

use crate::store::{Store, Stored};

/// The windows the suite lets close: short, and still far above the
/// millisecond a store may round to.
pub(crate) const SHORT: Duration = Duration::from_millis(300);
/// Past [`SHORT`], with room for a loaded machine.
pub(crate) const PAST_SHORT: Duration = Duration::from_millis(420);

pub(crate) fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).expect("the suite's quotas are valid")
}

pub(crate) fn minute(limit: u64) -> Quota {
    quota(limit, Duration::from_secs(60))
}

pub(crate) async fn hit<B: Backend>(backend: &B, namespace: &str, key: &Key, quota: Quota) -> Hit {
    backend
        .hit(namespace, key, quota)
        .await
        .unwrap_or_else(|e| panic!("hit on {namespace}/{key:?}: {e}"))
}

pub(crate) async fn refund<B: Backend>(backend: &B, namespace: &str, key: &Key, hit: &Hit) -> bool {
    backend
        .refund(namespace, key, hit)
        .await
        .unwrap_or_else(|e| panic!("refund on {namespace}/{key:?}: {e}"))
}

pub(crate) async fn peek<B: Backend>(backend: &B, namespace: &str, key: &Key) -> Option<Hit> {
    backend
        .peek(namespace, key)
        .await
        .unwrap_or_else(|e| panic!("peek on {namespace}/{key:?}: {e}"))
}

/// The count `peek` reads, 0 when there is no counter.
pub(crate) async fn count<B: Backend>(backend: &B, namespace: &str, key: &Key) -> u64 {
    peek(backend, namespace, key).await.map_or(0, |h| h.count)
}

pub(crate) async fn stored<S: Store>(
    store: &S,
    backend: &S::Backend,
    namespace: &str,
    key: &Key,
) -> Stored {
    store
        .stored(backend, namespace, key)
        .await
        .expect("the store claims ReadStored but `stored` answered None")
}

pub(crate) fn assert_reset_within(hit: &Hit, window: Duration, what: &str) {
    assert!(
        hit.reset <= window && hit.reset + Duration::from_secs(2).min(window / 2) > window,
        "{what}: {:?} left of a {window:?} window",
        hit.reset
    );
}
