//! The contract every [`Backend`] keeps: hits, refunds, peek and reset,
//! and what a store's own client can check of them (the stored lifetime,
//! corrupt counters, the audit).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower_pinned_window::backend::{Backend, BackendError, Counter, Hit};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, Window};

use crate::check::{
    PAST_SHORT, SHORT, assert_reset_within, count, hit, minute, peek, quota, refund, stored,
};
use crate::scenario::Scenario;
use crate::store::{Ability, Audit, Store, Stored};

/// The scenarios of [`Backend`]'s contract, in a fixed order.
pub(crate) fn scenarios<S: Store>() -> Vec<Scenario<S>> {
    vec![
        scenario!(pinned_window),
        scenario!(a_closed_window_starts_over_at_one),
        scenario!(concurrent_hits_count_each_count_once),
        scenario!(never_more_admitted_than_the_limit),
        scenario!(a_raised_limit_counts_on_the_same_counter),
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
    ]
}

/// A counter's limit may change from one hit to the next (a tier that
/// changes shares the counter): the count carries over, a lower limit
/// denies at once, and under a raised limit the hit is counted by the
/// store even where an earlier hit was denied at the lower limit (a local
/// cache of denials answers only for that limit or a lower one).
async fn a_raised_limit_counts_on_the_same_counter<S: Store>(store: &S) {
    let backend = store.fresh().await;
    let key = Key::new("upgraded");
    let (low, high) = (minute(2), minute(5));
    for n in 1..=3 {
        assert_eq!(hit(&backend, "tier", &key, low).await.count, n, "hit {n}");
    }
    // Denied at 2 (count 3): asked again at the same limit, a deny cache
    // may answer; asked under a limit of 5, the store counts it.
    let raised = hit(&backend, "tier", &key, high).await;
    assert_eq!(raised.count, 4, "counted on the same counter, not afresh");
    assert!(
        raised.deadline.is_some(),
        "counted in the store, not answered by a cache of the lower limit's denial"
    );
    assert_eq!(peek(&backend, "tier", &key).await.map(|h| h.count), Some(4));
    // Back under the lower limit: denied with the count so far.
    let lowered = hit(&backend, "tier", &key, low).await;
    assert!(lowered.count > low.limit(), "denied under the lower limit");
}

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
            lowers: false,
        },
        Counter {
            namespace: "api:10/3600000ms",
            quota: hour_q,
            lowers: false,
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
