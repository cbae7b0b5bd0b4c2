//! The spend contract: costs, checks and opened windows, lockouts, amends.
//!
//! These scenarios call [`Spending::spend_all`] and [`Spending::amend`], and
//! a backend that does not keep that contract fails them. They are kept
//! apart from the rest of the contract (`hits.rs`): [`spend_scenarios`] is
//! the one list that asks for [`Spending`], as a second bound on the
//! store's backend, and a backend that only counts hits runs the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower_pinned_window::Window;
use tower_pinned_window::backend::{Amend, Backend, Counter, Hit, Hits, Spend, Spending};
use tower_pinned_window::key::Key;

use crate::check::{
    PAST_SHORT, SHORT, assert_reset_within, count, hit, minute, peek, quota, refund, stored,
};
use crate::scenario::Scenario;
use crate::store::{Ability, Store, Stored};

/// The scenarios of the spend contract, in a fixed order (after those of
/// `hits.rs`).
pub(crate) fn spend_scenarios<S: Store>() -> Vec<Scenario<S>>
where
    S::Backend: Spending,
{
    vec![
        scenario!(spends: spends_count_their_cost_and_denials_spend_nothing),
        scenario!(spends: checks_create_nothing_unless_they_open_the_window),
        scenario!(spends: lockouts_are_pinned_to_the_first_denial),
        scenario!(spends: amends_follow_the_refund_rules),
        scenario!(spends: amends_after_a_reset_never_touch_the_new_window),
        scenario!(spends: concurrent_spends_never_pass_the_limit),
    ]
}

/// A fresh backend that spends.
async fn spender<S: Store>(store: &S) -> S::Backend
where
    S::Backend: Spending,
{
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
async fn spends_count_their_cost_and_denials_spend_nothing<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: minute(10),
        lowers: false,
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
            lowers: false,
        },
        Counter {
            namespace: "b",
            quota: minute(5),
            lowers: false,
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
async fn checks_create_nothing_unless_they_open_the_window<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: minute(3),
        lowers: false,
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
async fn lockouts_are_pinned_to_the_first_denial<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "login",
        quota: quota(2, SHORT),
        lowers: false,
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
async fn amends_follow_the_refund_rules<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let one = [Counter {
        namespace: "a",
        quota: quota(3, SHORT),
        lowers: false,
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
async fn amends_after_a_reset_never_touch_the_new_window<S: Store>(store: &S)
where
    S::Backend: Spending,
{
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
async fn concurrent_spends_never_pass_the_limit<S: Store>(store: &S)
where
    S::Backend: Spending,
{
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
                lowers: false,
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
