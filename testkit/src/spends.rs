//! The spend contract: costs (a first counter's own unit among them),
//! checks and opened windows, lockouts, amends.
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
        scenario!(spends: denied_spends_report_what_stands_plus_their_cost),
        scenario!(spends: lockouts_are_pinned_to_the_first_denial),
        scenario!(spends: amends_follow_the_refund_rules),
        scenario!(spends: amends_after_a_reset_never_touch_the_new_window),
        scenario!(spends: concurrent_spends_never_pass_the_limit),
        scenario!(spends: a_first_unit_and_a_cost_count_each_their_own),
        scenario!(spends: a_first_unit_spends_nothing_when_the_cost_does_not_fit),
        scenario!(spends: a_cost_spends_nothing_when_the_first_unit_does_not_fit),
        scenario!(spends: a_first_unit_of_zero_is_a_check_on_the_first_counter),
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

/// A counter that does not fit reports what stands in its way plus the
/// spend's cost (at least 1), so that a layer shows what is truly left:
/// its count as it stands, at least its limit under a lockout (one it had
/// or one the spend set), 0 with no counter. A local deny cache answers
/// the same: the spends at the limit are each asked twice.
async fn denied_spends_report_what_stands_plus_their_cost<S: Store>(store: &S)
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
    let count_of = |hits: Hits| hits[0].count;
    assert_eq!(
        count_of(spend(&backend, &key, &one, Spend::cost(6)).await),
        6
    );
    let denied = spend(&backend, &key, &one, Spend::cost(7)).await[0];
    assert_eq!(
        (denied.count, denied.deadline),
        (6 + 7, None),
        "4 left, a cost of 7: the count as it stands plus the cost"
    );
    assert_reset_within(&denied, Duration::from_secs(60), "its window's end");
    assert_eq!(count(&backend, "a", &key).await, 6, "nothing spent");

    // A cost above the limit, on no counter: nothing stands in its way.
    let fresh = spend(&backend, &Key::new("fresh"), &one, Spend::cost(25)).await[0];
    assert_eq!((fresh.count, fresh.deadline), (25, None));

    // At the limit, then charged past it: what stands is the count.
    let full = spend(&backend, &key, &one, Spend::cost(4)).await[0];
    assert_eq!(full.count, 10);
    for asked in ["first", "again"] {
        let hits = spend(&backend, &key, &one, Spend::cost(3)).await;
        assert_eq!(hits[0].count, 10 + 3, "at the limit, asked {asked}");
        let check = spend(&backend, &key, &one, Spend::cost(0)).await;
        assert_eq!(
            check[0].count,
            10 + 1,
            "a check at the limit, asked {asked}"
        );
    }
    assert!(amend(&backend, "a", &key, &full, Amend::Charge(2)).await);
    let over = spend(&backend, &key, &one, Spend::cost(20)).await[0];
    assert_eq!(over.count, 12 + 20, "charged past the limit");

    // Two counters: each reports its own.
    let both = Key::new("both");
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
    spend(&backend, &both, &two, Spend::cost(4)).await;
    let hits = spend(&backend, &both, &two, Spend::cost(3)).await;
    assert!(hits.iter().all(|h| h.deadline.is_none()), "nothing counted");
    assert_eq!(hits[1].count, 4 + 3, "the counter that does not fit");

    // A lockout: what stands is at least the limit, from the spend that
    // sets it on.
    let locked_key = Key::new("locked");
    let login = [Counter {
        namespace: "login",
        quota: minute(5),
        lowers: false,
    }];
    let block = Window::new(Duration::from_secs(60)).expect("a valid block");
    let locking = Spend::cost(3).block(block);
    assert_eq!(
        count_of(spend(&backend, &locked_key, &login, locking).await),
        3
    );
    for asked in ["locks it", "locked", "locked again"] {
        let hits = spend(&backend, &locked_key, &login, locking).await;
        assert_eq!(hits[0].count, 5 + 3, "{asked}: the limit stands");
    }
    let hits = spend(&backend, &locked_key, &login, Spend::cost(1)).await;
    assert_eq!(hits[0].count, 5 + 1, "a spend that fits the count, locked");
    assert_eq!(
        count(&backend, "login", &locked_key).await,
        3,
        "nothing spent"
    );
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

/// A provider's two budgets, for the scenarios of [`Spend::first`]: the
/// requests counter first (`requests` a minute), then the tokens counter
/// (`tokens` a minute).
fn requests_and_tokens(requests: u64, tokens: u64) -> [Counter<'static>; 2] {
    [
        Counter {
            namespace: "requests",
            quota: minute(requests),
            lowers: false,
        },
        Counter {
            namespace: "tokens",
            quota: minute(tokens),
            lowers: false,
        },
    ]
}

/// One call: `unit` from the requests counter, `tokens` from the tokens
/// counter.
fn call(unit: u64, tokens: u64) -> Spend {
    Spend::cost(tokens).first(unit)
}

/// With [`Spend::first`], the first counter is spent its unit and the
/// others the cost, in one step: each counted with its own amount, in its
/// own window.
async fn a_first_unit_and_a_cost_count_each_their_own<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let both = requests_and_tokens(5, 100);
    let hits = spend(&backend, &key, &both, call(1, 60)).await;
    assert_eq!(
        (hits[0].count, hits[1].count),
        (1, 60),
        "each its own amount"
    );
    for (hit, what) in hits
        .iter()
        .zip(["the requests counter", "the tokens counter"])
    {
        assert!(
            hit.deadline.is_some(),
            "{what} is counted, its window named"
        );
        assert_reset_within(hit, Duration::from_secs(60), what);
    }
    assert_eq!(count(&backend, "requests", &key).await, 1);
    assert_eq!(count(&backend, "tokens", &key).await, 60);
    let again = spend(&backend, &key, &both, call(2, 30)).await;
    assert_eq!((again[0].count, again[1].count), (3, 90));
    assert_eq!(
        (again[0].deadline, again[1].deadline),
        (hits[0].deadline, hits[1].deadline),
        "the same windows"
    );
    // Without `first`, the same counters are each spent the cost.
    let plain = spend(&backend, &key, &both, Spend::cost(1)).await;
    assert_eq!((plain[0].count, plain[1].count), (4, 91));
}

/// The tokens do not fit: nothing is spent on either counter, the
/// requests counter stays as it was, and the tokens counter reports what
/// stands plus its own cost. At its limit, asked twice (a local deny cache
/// may answer the second): its limit plus the cost, at least 1.
async fn a_first_unit_spends_nothing_when_the_cost_does_not_fit<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let both = requests_and_tokens(5, 100);
    spend(&backend, &key, &both, call(1, 60)).await;
    let hits = spend(&backend, &key, &both, call(1, 50)).await;
    assert!(
        hits.iter().all(|h| h.deadline.is_none()),
        "nothing counted anywhere"
    );
    assert_eq!(
        hits[1].count,
        60 + 50,
        "the tokens: what stands plus the cost"
    );
    assert_reset_within(&hits[1], Duration::from_secs(60), "its window's end");
    assert!(
        hits[0].count <= 5,
        "the requests counter fits: {:?}",
        hits[0]
    );
    assert_eq!(count(&backend, "requests", &key).await, 1, "all or nothing");
    assert_eq!(count(&backend, "tokens", &key).await, 60, "all or nothing");

    let full = spend(&backend, &key, &both, call(1, 40)).await;
    assert_eq!((full[0].count, full[1].count), (2, 100));
    for asked in ["first", "again"] {
        let hits = spend(&backend, &key, &both, call(2, 7)).await;
        assert!(hits.iter().all(|h| h.deadline.is_none()), "asked {asked}");
        assert_eq!(
            hits[1].count,
            100 + 7,
            "the tokens at their limit, asked {asked}"
        );
        let check = spend(&backend, &key, &both, call(2, 0)).await;
        assert_eq!(
            check[1].count,
            100 + 1,
            "a check of the tokens, asked {asked}"
        );
    }
    assert_eq!(
        count(&backend, "requests", &key).await,
        2,
        "the requests stay"
    );
}

/// The requests do not fit: nothing is spent on either counter, though the
/// tokens would fit, and the requests counter reports what stands plus its
/// own unit (below its limit, then at it, asked twice).
async fn a_cost_spends_nothing_when_the_first_unit_does_not_fit<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let both = requests_and_tokens(5, 1000);
    assert_eq!(spend(&backend, &key, &both, call(4, 10)).await[0].count, 4);
    let hits = spend(&backend, &key, &both, call(3, 10)).await;
    assert!(
        hits.iter().all(|h| h.deadline.is_none()),
        "nothing counted anywhere"
    );
    assert_eq!(
        hits[0].count,
        4 + 3,
        "the requests: what stands plus the unit"
    );
    assert_reset_within(&hits[0], Duration::from_secs(60), "its window's end");
    assert!(hits[1].count <= 1000, "the tokens fit: {:?}", hits[1]);
    assert_eq!(count(&backend, "requests", &key).await, 4, "all or nothing");
    assert_eq!(count(&backend, "tokens", &key).await, 10, "all or nothing");

    let full = spend(&backend, &key, &both, call(1, 10)).await;
    assert_eq!((full[0].count, full[1].count), (5, 20));
    for asked in ["first", "again"] {
        let hits = spend(&backend, &key, &both, call(2, 10)).await;
        assert!(hits.iter().all(|h| h.deadline.is_none()), "asked {asked}");
        assert_eq!(
            hits[0].count,
            5 + 2,
            "the requests at their limit, asked {asked}"
        );
    }
    assert_eq!(count(&backend, "tokens", &key).await, 20, "the tokens stay");
}

/// `first(0)` with a cost of 5: the first counter is checked (admitted
/// while under its limit, created only when the spend opens it), the
/// other spent 5.
async fn a_first_unit_of_zero_is_a_check_on_the_first_counter<S: Store>(store: &S)
where
    S::Backend: Spending,
{
    let backend = spender(store).await;
    let key = Key::new("k");
    let both = requests_and_tokens(2, 100);
    let hits = spend(&backend, &key, &both, call(0, 5)).await;
    assert_eq!(
        (hits[0].count, hits[0].deadline),
        (0, None),
        "a check creates nothing"
    );
    assert_eq!(peek(&backend, "requests", &key).await, None);
    assert_eq!(hits[1].count, 5);
    assert!(hits[1].deadline.is_some(), "the cost is counted");
    let hits = spend(&backend, &key, &both, call(2, 5)).await;
    assert_eq!((hits[0].count, hits[1].count), (2, 10));
    let checked = spend(&backend, &key, &both, call(0, 5)).await;
    assert!(
        checked.iter().all(|h| h.deadline.is_none()),
        "a full requests counter refuses the check, and the cost is not spent"
    );
    assert_eq!(checked[0].count, 2 + 1, "a check reports the count and 1");
    assert_eq!(count(&backend, "tokens", &key).await, 10);

    let other = Key::new("opened");
    let opened = spend(&backend, &other, &both, call(0, 5).open()).await;
    assert_eq!((opened[0].count, opened[1].count), (0, 5));
    assert!(opened[0].deadline.is_some(), "open creates it, at 0");
    let seen = peek(&backend, "requests", &other)
        .await
        .expect("open creates the counter");
    assert_eq!(seen.count, 0);
    assert_reset_within(&seen, Duration::from_secs(60), "an opened counter");
}
