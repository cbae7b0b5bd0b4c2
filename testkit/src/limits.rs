//! Limits held in the store ([`Limits`]): set and read back per scope,
//! scopes and layers kept apart, removal, a corrupt stored value left out
//! and counted, and a limit that never touches a counter.
//!
//! [`limit_scenarios`] is the one list that asks for [`Limits`], so a
//! backend without it (or a [`PrivateKeys`](tower_pinned_window::backend::PrivateKeys)
//! wrapper, which does not hold limits) runs the rest.

use std::time::Duration;

use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Backend, LimitScope, Limits, StoredLimits};
use tower_pinned_window::key::Key;

use crate::check::{count, hit, minute, quota};
use crate::scenario::Scenario;
use crate::store::Store;

/// The scenarios of limits held in the store, in a fixed order, for a
/// store whose backend implements [`Limits`] (the memory, Redis and
/// PostgreSQL backends of `tower-pinned-window` do).
/// [`scenarios`](crate::scenarios) does not hold them, so that a backend
/// without the trait runs the rest.
pub fn limit_scenarios<S: Store>() -> Vec<Scenario<S>>
where
    S::Backend: Limits,
{
    vec![
        scenario!(limits: limits_read_back_per_scope_on_every_instance),
        scenario!(limits: scopes_of_the_same_bytes_and_two_layers_never_meet),
        scenario!(limits: a_removed_limit_is_gone_and_a_missing_one_removes_nothing),
        scenario!(
            limits: a_corrupt_stored_limit_is_left_out_and_counted,
            CorruptLimit
        ),
        scenario!(limits: setting_a_limit_never_touches_a_counter),
    ]
}

async fn set<B: Limits>(backend: &B, layer: &str, scope: LimitScope<'_>, limit: Option<Quota>) {
    backend
        .set_limit(layer, scope, limit)
        .await
        .unwrap_or_else(|e| panic!("set_limit on {layer:?} {scope:?}: {e}"));
}

async fn read<B: Limits>(backend: &B, layer: &str) -> StoredLimits {
    backend
        .limits(layer)
        .await
        .unwrap_or_else(|e| panic!("limits of {layer:?}: {e}"))
}

/// A limit of each scope reads back as set, on this instance and on
/// another one; a second set replaces the first.
async fn limits_read_back_per_scope_on_every_instance<S: Store>(store: &S)
where
    S::Backend: Limits,
{
    let backend = store.fresh().await;
    let key = Key::new("203.0.113.7");
    assert!(read(&backend, "api").await.is_empty(), "fresh: no limits");
    set(&backend, "api", LimitScope::Layer, Some(minute(100))).await;
    set(&backend, "api", LimitScope::Tier("pro"), Some(minute(1000))).await;
    let odd = quota(7, Duration::from_millis(1500));
    set(&backend, "api", LimitScope::Key(&key), Some(odd)).await;

    let other = store.another(&backend).await;
    for (who, instance) in [("this instance", &backend), ("another instance", &other)] {
        let stored = read(instance, "api").await;
        assert_eq!(stored.len(), 3, "{who}: {stored:?}");
        assert_eq!(stored.corrupt(), 0, "{who}");
        assert_eq!(stored.get(LimitScope::Layer), Some(minute(100)), "{who}");
        assert_eq!(
            stored.get(LimitScope::Tier("pro")),
            Some(minute(1000)),
            "{who}"
        );
        assert_eq!(stored.get(LimitScope::Key(&key)), Some(odd), "{who}");
    }

    set(&other, "api", LimitScope::Tier("pro"), Some(minute(10))).await;
    let stored = read(&backend, "api").await;
    assert_eq!(
        stored.get(LimitScope::Tier("pro")),
        Some(minute(10)),
        "a second set replaces the first, for every instance"
    );
    assert_eq!(stored.len(), 3);
}

/// A tier and a key of the same bytes, a key that spells another scope's
/// stored form, and keys of any bytes are scopes of their own; two layers'
/// limits (names with braces and colons too) never meet.
async fn scopes_of_the_same_bytes_and_two_layers_never_meet<S: Store>(store: &S)
where
    S::Backend: Limits,
{
    let backend = store.fresh().await;
    let keys = [
        Key::new("pro"),
        Key::new("layer"),
        Key::new("tier:pro"),
        Key::new("key:pro"),
        Key::new(""),
        Key::new(b"{x}\xff\x00%"),
        Key::new(vec![b'k'; 200]),
    ];
    set(&backend, "api", LimitScope::Tier("pro"), Some(minute(1))).await;
    for (i, key) in keys.iter().enumerate() {
        set(
            &backend,
            "api",
            LimitScope::Key(key),
            Some(minute(10 + i as u64)),
        )
        .await;
    }
    let stored = read(&backend, "api").await;
    assert_eq!(stored.len(), 1 + keys.len(), "{stored:?}");
    assert_eq!(
        stored.get(LimitScope::Layer),
        None,
        "no layer limit was set"
    );
    assert_eq!(stored.get(LimitScope::Tier("pro")), Some(minute(1)));
    assert_eq!(stored.get(LimitScope::Tier("layer")), None);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            stored.get(LimitScope::Key(key)),
            Some(minute(10 + i as u64)),
            "{key:?}"
        );
    }
    assert_eq!(stored.corrupt(), 0);

    let layers = ["api:limits", "api{x}", "ap", "api:", "{api}", ""];
    for (i, layer) in layers.iter().enumerate() {
        assert!(
            read(&backend, layer).await.is_empty(),
            "{layer:?} reads another layer's limits"
        );
        set(
            &backend,
            layer,
            LimitScope::Layer,
            Some(minute(500 + i as u64)),
        )
        .await;
    }
    for (i, layer) in layers.iter().enumerate() {
        let stored = read(&backend, layer).await;
        assert_eq!(stored.len(), 1, "{layer:?}: {stored:?}");
        assert_eq!(stored.get(LimitScope::Layer), Some(minute(500 + i as u64)));
    }
    assert_eq!(
        read(&backend, "api").await.len(),
        1 + keys.len(),
        "other layers' limits land apart"
    );
}

/// A limit removed is gone, and only it; removing a limit that is not
/// there is no error and removes nothing else.
async fn a_removed_limit_is_gone_and_a_missing_one_removes_nothing<S: Store>(store: &S)
where
    S::Backend: Limits,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    set(&backend, "api", LimitScope::Layer, Some(minute(5))).await;
    set(&backend, "api", LimitScope::Tier("k"), Some(minute(6))).await;
    set(&backend, "api", LimitScope::Key(&key), Some(minute(7))).await;
    set(&backend, "api", LimitScope::Tier("k"), None).await;
    let stored = read(&backend, "api").await;
    assert_eq!(stored.get(LimitScope::Tier("k")), None, "removed");
    assert_eq!(stored.get(LimitScope::Key(&key)), Some(minute(7)), "kept");
    assert_eq!(stored.get(LimitScope::Layer), Some(minute(5)), "kept");

    set(&backend, "api", LimitScope::Tier("never"), None).await;
    set(&backend, "other", LimitScope::Layer, None).await;
    assert_eq!(read(&backend, "api").await.len(), 2);
    set(&backend, "api", LimitScope::Layer, None).await;
    set(&backend, "api", LimitScope::Key(&key), None).await;
    assert!(read(&backend, "api").await.is_empty());
}

/// A stored value that is not a limit is left out of the read and counted,
/// never read as "no limit" and never failing the read: the other scopes
/// read as set, and a set over it repairs it.
async fn a_corrupt_stored_limit_is_left_out_and_counted<S: Store>(store: &S)
where
    S::Backend: Limits,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    set(&backend, "api", LimitScope::Layer, Some(minute(5))).await;
    set(&backend, "api", LimitScope::Tier("pro"), Some(minute(50))).await;
    store
        .corrupt_limit(&backend, "api", LimitScope::Tier("pro"))
        .await
        .expect("the store claims CorruptLimit but `corrupt_limit` answered None");
    store
        .corrupt_limit(&backend, "api", LimitScope::Key(&key))
        .await
        .expect("the store claims CorruptLimit but `corrupt_limit` answered None");

    let stored = read(&backend, "api").await;
    assert_eq!(stored.corrupt(), 2, "{stored:?}");
    assert_eq!(stored.len(), 1, "only the layer's limit is a limit");
    assert_eq!(stored.get(LimitScope::Tier("pro")), None);
    assert_eq!(stored.get(LimitScope::Key(&key)), None);
    assert_eq!(stored.get(LimitScope::Layer), Some(minute(5)));

    set(&backend, "api", LimitScope::Tier("pro"), Some(minute(40))).await;
    let stored = read(&backend, "api").await;
    assert_eq!(stored.get(LimitScope::Tier("pro")), Some(minute(40)));
    assert_eq!(stored.corrupt(), 1, "the key's value is still corrupt");
    set(&backend, "api", LimitScope::Key(&key), None).await;
    assert_eq!(read(&backend, "api").await.corrupt(), 0, "removed");
}

/// Setting, changing and removing limits never touches a counter, and a
/// reset of the counter never touches the limits.
async fn setting_a_limit_never_touches_a_counter<S: Store>(store: &S)
where
    S::Backend: Limits,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let q = minute(10);
    for _ in 0..3 {
        hit(&backend, "api", &key, q).await;
    }
    set(&backend, "api", LimitScope::Layer, Some(minute(2))).await;
    set(&backend, "api", LimitScope::Key(&key), Some(minute(1))).await;
    set(&backend, "api", LimitScope::Tier("api"), Some(minute(100))).await;
    assert_eq!(count(&backend, "api", &key).await, 3, "a set: same count");
    set(&backend, "api", LimitScope::Key(&key), None).await;
    assert_eq!(
        count(&backend, "api", &key).await,
        3,
        "a removal: same count"
    );
    assert_eq!(
        hit(&backend, "api", &key, q).await.count,
        4,
        "counting goes on"
    );

    backend
        .reset("api", &key)
        .await
        .unwrap_or_else(|e| panic!("reset: {e}"));
    assert_eq!(count(&backend, "api", &key).await, 0);
    assert_eq!(
        read(&backend, "api").await.len(),
        2,
        "a reset keeps the limits"
    );
}
