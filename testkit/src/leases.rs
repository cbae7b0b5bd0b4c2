//! The in-flight contract: slots on leases ([`Leasing`]).
//!
//! These scenarios call [`Leasing::take`], [`Leasing::take_all`],
//! [`Leasing::give_back`], [`Leasing::extend`] and [`Leasing::in_use`];
//! [`lease_scenarios`] is the one list that asks for [`Leasing`] (with
//! [`Spending`], for a step that takes a slot and spends), so a backend
//! that only counts hits (or also spends) runs the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tower_pinned_window::InFlight;
use tower_pinned_window::backend::{
    Backend, Cap, Counter, Held, Hits, Leasing, SlotId, Spend, Spending, Taken,
};
use tower_pinned_window::key::Key;

use crate::check::{count, hit, minute};
use crate::scenario::Scenario;
use crate::store::{SlotsRecord, Store};

/// The scenarios of the in-flight contract, in a fixed order, for a store
/// whose backend implements [`Leasing`] and [`Spending`] (every backend of
/// `tower-pinned-window` does). [`scenarios`](crate::scenarios) does not
/// hold them, so that a backend without the third trait runs the rest.
pub fn lease_scenarios<S: Store>() -> Vec<Scenario<S>>
where
    S::Backend: Leasing + Spending,
{
    vec![
        scenario!(leases: slots_are_capped_and_given_back),
        scenario!(leases: a_take_retried_never_takes_two),
        scenario!(leases: a_lease_that_ran_out_is_never_extended),
        scenario!(leases: extends_keep_a_live_holders_slots_and_no_more),
        scenario!(leases: concurrent_takes_never_pass_the_cap),
        scenario!(leases: slots_never_meet_counters_namespaces_or_keys),
        scenario!(leases: a_record_with_slots_has_a_lifetime_past_its_leases, ReadSlots),
        scenario!(leases: corrupt_slots_fail_and_are_left_as_they_are, CorruptSlots, ReadSlots),
        scenario!(leases: take_all_counts_and_takes_together_or_neither),
        scenario!(leases: take_all_retried_counts_once),
        scenario!(leases: take_all_spends_only_what_fits),
        scenario!(leases: take_all_spends_a_first_unit_on_the_first_counter),
    ]
}

fn cap(max: u64, lease: Duration) -> InFlight {
    InFlight::new(max, lease).expect("the suite's caps are valid")
}

async fn take<B: Leasing>(
    backend: &B,
    namespace: &str,
    key: &Key,
    in_flight: InFlight,
    slot: SlotId,
) -> Taken {
    backend
        .take(
            key,
            Cap {
                namespace,
                in_flight,
            },
            slot,
        )
        .await
        .unwrap_or_else(|e| panic!("take on {namespace}/{key:?}: {e}"))
}

/// One [`Leasing::take_all`] of `slot` on `counters`.
async fn take_all<B: Leasing>(
    backend: &B,
    key: &Key,
    in_flight: InFlight,
    slot: SlotId,
    counters: &[Counter<'_>],
    spend: Option<Spend>,
) -> (Hits, Option<Taken>) {
    let cap = Cap {
        namespace: "n",
        in_flight,
    };
    backend
        .take_all(key, cap, slot, counters, spend)
        .await
        .unwrap_or_else(|e| panic!("take_all on {key:?}: {e}"))
        .split_taken()
}

fn counter(namespace: &str, limit: u64) -> Counter<'_> {
    Counter {
        namespace,
        quota: minute(limit),
        lowers: false,
    }
}

async fn give_back<B: Leasing>(backend: &B, namespace: &str, key: &Key, slot: SlotId) -> bool {
    backend
        .give_back(namespace, key, slot)
        .await
        .unwrap_or_else(|e| panic!("give back on {namespace}/{key:?}: {e}"))
}

async fn in_use<B: Leasing>(backend: &B, namespace: &str, key: &Key) -> u64 {
    backend
        .in_use(namespace, key)
        .await
        .unwrap_or_else(|e| panic!("in use on {namespace}/{key:?}: {e}"))
}

async fn extend<B: Leasing>(
    backend: &B,
    namespace: &str,
    key: &Key,
    slot: SlotId,
    in_flight: InFlight,
) -> u64 {
    backend
        .extend(
            &[Held {
                namespace,
                key,
                slot,
            }],
            in_flight.lease(),
        )
        .await
        .unwrap_or_else(|e| panic!("extend on {namespace}/{key:?}: {e}"))
}

/// At most `max` slots are granted; a refusal says how many are in use and
/// when the earliest lease runs out; a slot given back is free at once, and
/// only once.
async fn slots_are_capped_and_given_back<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("tenant");
    let c = cap(3, Duration::from_secs(30));
    let slots: Vec<SlotId> = (0..4).map(|_| SlotId::next()).collect();
    for (n, slot) in slots[..3].iter().enumerate() {
        let taken = take(&backend, "n", &key, c, *slot).await;
        assert!(taken.granted, "slot {n} of 3 is granted");
        assert_eq!(taken.in_use, n as u64 + 1, "slot {n}: in use after it");
        assert_eq!(taken.retry, Duration::ZERO, "a granted take has no wait");
    }
    assert_eq!(in_use(&backend, "n", &key).await, 3);
    let refused = take(&backend, "n", &key, c, slots[3]).await;
    assert!(!refused.granted, "a fourth slot of 3 is refused");
    assert_eq!(refused.in_use, 3, "the refusal says what is in use");
    assert!(
        refused.retry <= Duration::from_secs(30) && refused.retry > Duration::from_secs(25),
        "the earliest lease runs out in about 30 s, not {:?}",
        refused.retry
    );
    assert!(
        give_back(&backend, "n", &key, slots[1]).await,
        "a held slot is given back"
    );
    assert!(
        !give_back(&backend, "n", &key, slots[1]).await,
        "and only once"
    );
    assert_eq!(in_use(&backend, "n", &key).await, 2);
    let taken = take(&backend, "n", &key, c, slots[3]).await;
    assert!(
        taken.granted && taken.in_use == 3,
        "the freed slot is taken: {taken:?}"
    );
    assert!(
        !give_back(&backend, "n", &Key::new("nobody"), slots[0]).await,
        "a slot of another key is not found"
    );
    for slot in [slots[0], slots[2], slots[3]] {
        assert!(give_back(&backend, "n", &key, slot).await);
    }
    assert_eq!(in_use(&backend, "n", &key).await, 0);
}

/// Taking a slot the key already holds changes nothing and is granted.
async fn a_take_retried_never_takes_two<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("retry");
    let c = cap(2, Duration::from_secs(30));
    let slot = SlotId::next();
    for attempt in 0..3 {
        let taken = take(&backend, "n", &key, c, slot).await;
        assert!(taken.granted, "attempt {attempt} of one slot is granted");
        assert_eq!(taken.in_use, 1, "attempt {attempt}: still one slot");
    }
    assert!(
        take(&backend, "n", &key, c, SlotId::next()).await.granted,
        "the second slot"
    );
    let full = take(&backend, "n", &key, c, SlotId::next()).await;
    assert!(!full.granted && full.in_use == 2, "two of two: {full:?}");
    let again = take(&backend, "n", &key, c, slot).await;
    assert!(
        again.granted && again.in_use == 2,
        "a held slot asked again at the cap: {again:?}"
    );
}

/// A slot whose lease ran out is gone: another request takes its place, and
/// its holder's late extend never creates it again.
async fn a_lease_that_ran_out_is_never_extended<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("stalled");
    let c = cap(1, Duration::from_millis(300));
    let (stalled, next) = (SlotId::next(), SlotId::next());
    assert!(take(&backend, "n", &key, c, stalled).await.granted);
    let refused = take(&backend, "n", &key, c, next).await;
    assert!(!refused.granted, "one of one is held");
    assert!(
        refused.retry <= Duration::from_millis(300),
        "{:?}",
        refused.retry
    );
    tokio::time::sleep(Duration::from_millis(420)).await;
    assert_eq!(in_use(&backend, "n", &key).await, 0, "the lease ran out");
    assert_eq!(
        extend(&backend, "n", &key, stalled, c).await,
        0,
        "a lease that ran out is not extended"
    );
    assert_eq!(in_use(&backend, "n", &key).await, 0, "nor created again");
    let taken = take(&backend, "n", &key, c, next).await;
    assert!(
        taken.granted && taken.in_use == 1,
        "its place is free: {taken:?}"
    );
    assert_eq!(
        extend(&backend, "n", &key, stalled, c).await,
        0,
        "still not the stalled one's"
    );
    assert_eq!(in_use(&backend, "n", &key).await, 1, "one slot, never two");
}

/// A holder that extends keeps its slot past the lease; once it stops, the
/// slot returns within the lease, and not before.
async fn extends_keep_a_live_holders_slots_and_no_more<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let other = store.another(&backend).await;
    let key = Key::new("held");
    let lease = Duration::from_millis(400);
    let c = cap(1, lease);
    let (holder, waiting) = (SlotId::next(), SlotId::next());
    assert!(take(&backend, "n", &key, c, holder).await.granted);
    let start = Instant::now();
    // Extended every 100 ms for three leases. The lease runs from the
    // store's own step, after the extend was sent: the time it was sent is
    // the earliest the lease can have started from.
    let mut last_sent = start;
    while start.elapsed() < 3 * lease {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last_sent = Instant::now();
        assert_eq!(
            extend(&backend, "n", &key, holder, c).await,
            1,
            "a live slot is extended"
        );
        assert!(
            !take(&other, "n", &key, c, waiting).await.granted,
            "the slot is held {:?} into a {lease:?} lease",
            start.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let early = take(&other, "n", &key, c, waiting).await;
    assert!(
        !early.granted,
        "{:?} after the last extend was sent, the slot is still held",
        last_sent.elapsed()
    );
    assert!(
        early.retry <= lease
            && early.retry + Duration::from_millis(250) >= lease - Duration::from_millis(150),
        "the earliest lease ends about {:?} on: {:?}",
        lease - Duration::from_millis(150),
        early.retry
    );
    // Poll until the lease has run out: never before a lease after the
    // last extend was sent (less a millisecond a store may round to).
    loop {
        if take(&other, "n", &key, c, waiting).await.granted {
            // The store granted it before its answer came back.
            let waited = last_sent.elapsed();
            assert!(
                waited + Duration::from_millis(2) >= lease,
                "granted {waited:?} after the last extend was sent: before the lease ran out"
            );
            break;
        }
        let waited = last_sent.elapsed();
        assert!(
            waited < lease + Duration::from_millis(500),
            "still held {waited:?} after the last extend"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(in_use(&backend, "n", &key).await, 1);
}

/// Many tasks on several instances take slots of one key at once: exactly
/// the cap is granted.
async fn concurrent_takes_never_pass_the_cap<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let first = store.fresh().await;
    let c = cap(5, Duration::from_secs(30));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let backend = if t == 0 {
            first.clone()
        } else {
            store.another(&first).await
        };
        for _ in 0..16 {
            let (backend, granted) = (backend.clone(), Arc::clone(&granted));
            tasks.push(tokio::spawn(async move {
                let taken = backend
                    .take(
                        &Key::new("hot"),
                        Cap {
                            namespace: "n",
                            in_flight: c,
                        },
                        SlotId::next(),
                    )
                    .await
                    .expect("take");
                assert!(taken.in_use <= 5, "in use past the cap: {taken:?}");
                if taken.granted {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a taking task");
    }
    assert_eq!(
        granted.load(Ordering::Relaxed),
        5,
        "exactly the cap is granted"
    );
    assert_eq!(in_use(&first, "n", &Key::new("hot")).await, 5);
}

/// A key's slots are its own: another key, another namespace, and the
/// counters and resets of the same namespace and key never touch them.
async fn slots_never_meet_counters_namespaces_or_keys<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let c = cap(1, Duration::from_secs(30));
    let q = minute(10);
    assert_eq!(hit(&backend, "api", &key, q).await.count, 1);
    assert!(take(&backend, "api", &key, c, SlotId::next()).await.granted);
    assert_eq!(count(&backend, "api", &key).await, 1, "a take is not a hit");
    assert_eq!(
        hit(&backend, "api", &key, q).await.count,
        2,
        "a hit is not a take"
    );
    assert!(
        take(&backend, "api", &Key::new("k2"), c, SlotId::next())
            .await
            .granted,
        "another key"
    );
    assert!(
        take(&backend, "other", &key, c, SlotId::next())
            .await
            .granted,
        "another namespace"
    );
    // The key "k}" and the namespace "api{k" must not reach "api"'s "k".
    assert!(
        take(&backend, "api", &Key::new("k}"), c, SlotId::next())
            .await
            .granted
    );
    assert!(
        take(&backend, "api{k", &Key::new(""), c, SlotId::next())
            .await
            .granted
    );
    assert!(
        backend.reset("api", &key).await.expect("reset"),
        "the counter is reset"
    );
    assert_eq!(
        in_use(&backend, "api", &key).await,
        1,
        "a reset leaves the slots"
    );
    assert!(
        !take(&backend, "api", &key, c, SlotId::next()).await.granted,
        "still one of one"
    );
}

/// The record of a key's slots always has a lifetime, and it is at least
/// its latest lease: a store that loses the holder still loses the record.
async fn a_record_with_slots_has_a_lifetime_past_its_leases<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("timed");
    let short = cap(3, Duration::from_secs(20));
    let long = cap(3, Duration::from_secs(40));
    let record = |what: &'static str| {
        let backend = &backend;
        let key = &key;
        async move {
            store
                .slots_record(backend, "n", key)
                .await
                .unwrap_or_else(|| {
                    panic!("{what}: the store claims ReadSlots but `slots_record` answered None")
                })
        }
    };
    let first = SlotId::next();
    assert!(take(&backend, "n", &key, long, first).await.granted);
    let SlotsRecord::Held {
        lifetime: Some(after_long),
        ..
    } = record("a take of 40 s").await
    else {
        panic!("a record with a slot has a lifetime");
    };
    assert!(
        after_long > Duration::from_secs(38) && after_long <= Duration::from_secs(40),
        "{after_long:?}"
    );
    assert!(
        take(&backend, "n", &key, short, SlotId::next())
            .await
            .granted
    );
    let SlotsRecord::Held {
        lifetime: Some(after_short),
        slots,
    } = record("then 20 s").await
    else {
        panic!("a record with slots has a lifetime");
    };
    assert_eq!(slots, 2);
    assert!(
        after_short > Duration::from_secs(37),
        "a shorter lease shortened the record: {after_short:?}"
    );
    assert_eq!(extend(&backend, "n", &key, first, long).await, 1);
    assert!(give_back(&backend, "n", &key, first).await);
    match record("after a give-back").await {
        SlotsRecord::Held {
            lifetime: Some(left),
            slots: 1,
        } => {
            assert!(left > Duration::from_secs(15), "{left:?}");
        }
        other => panic!("one slot, with a lifetime: {other:?}"),
    }
}

/// A record that is not of the store's shape fails the key's takes,
/// give-backs and extends, and is left as it is; other keys are served.
async fn corrupt_slots_fail_and_are_left_as_they_are<S: Store>(store: &S)
where
    S::Backend: Leasing,
{
    let backend = store.fresh().await;
    let key = Key::new("bad");
    let c = cap(3, Duration::from_secs(30));
    store
        .corrupt_slots(&backend, "n", &key)
        .await
        .expect("the store claims CorruptSlots but `corrupt_slots` answered None");
    let before = store
        .slots_record(&backend, "n", &key)
        .await
        .expect("ReadSlots");
    let slot = SlotId::next();
    let err = backend
        .take(
            &key,
            Cap {
                namespace: "n",
                in_flight: c,
            },
            slot,
        )
        .await
        .expect_err("a take on corrupt slots fails");
    assert!(err.is_corrupt(), "corrupt, not an outage: {err}");
    let err = backend
        .give_back("n", &key, slot)
        .await
        .expect_err("a give-back fails");
    assert!(err.is_corrupt(), "{err}");
    let _ = backend
        .extend(
            &[Held {
                namespace: "n",
                key: &key,
                slot,
            }],
            c.lease(),
        )
        .await;
    let after = store
        .slots_record(&backend, "n", &key)
        .await
        .expect("ReadSlots");
    let counters = [counter("q", 5)];
    let err = backend
        .take_all(
            &key,
            Cap {
                namespace: "n",
                in_flight: c,
            },
            SlotId::next(),
            &counters,
            None,
        )
        .await
        .expect_err("a take_all on corrupt slots fails");
    assert!(err.is_corrupt(), "{err}");
    assert_eq!(
        count(&backend, "q", &key).await,
        0,
        "a take_all that failed counts nothing"
    );
    assert_eq!(before, after, "the corrupt record is left as it was");
    assert!(
        take(&backend, "n", &Key::new("good"), c, SlotId::next())
            .await
            .granted,
        "other keys are served"
    );
}

/// `take_all`: a full cap counts nothing (the counters are read), counters
/// that refuse take no slot (and count as hits count), and both pass
/// together: the slot is taken and every counter counted.
async fn take_all_counts_and_takes_together_or_neither<S: Store>(store: &S)
where
    S::Backend: Leasing + Spending,
{
    let backend = store.fresh().await;
    let key = Key::new("both");
    let c = cap(2, Duration::from_secs(30));
    let counters = [counter("q", 3), counter("q:10", 10)];
    let (a, b) = (SlotId::next(), SlotId::next());
    for (n, slot) in [a, b].into_iter().enumerate() {
        let (hits, hits_taken) = take_all(&backend, &key, c, slot, &counters, None).await;
        let taken = hits_taken.expect("the cap answered");
        assert!(taken.granted, "slot {n} is taken: {hits:?}");
        assert_eq!(taken.in_use, n as u64 + 1, "slot {n}: in use after it");
        assert_eq!(hits.len(), 2, "a hit per counter");
        for hit in hits.iter() {
            assert_eq!(hit.count, n as u64 + 1, "counted with the slot: {hits:?}");
            assert!(hit.deadline.is_some(), "counted in the store: {hit:?}");
        }
    }
    // The cap is full: nothing is counted, the counters are read.
    let (full, full_taken) = take_all(&backend, &key, c, SlotId::next(), &counters, None).await;
    let refused = full_taken.expect("the cap answered");
    assert!(!refused.granted && refused.in_use == 2, "{full:?}");
    assert!(refused.retry > Duration::from_secs(25), "{refused:?}");
    for hit in full.iter() {
        assert_eq!(hit.count, 2, "read, not counted: {full:?}");
        assert!(hit.deadline.is_none(), "nothing counted: {hit:?}");
        assert!(hit.reset > Duration::from_secs(50), "{hit:?}");
    }
    assert_eq!(
        count(&backend, "q", &key).await,
        2,
        "refused by the cap: uncounted"
    );
    assert_eq!(in_use(&backend, "n", &key).await, 2);
    // A counter missing from a full cap's step reads 0 with its window.
    let fresh = [counter("fresh", 3)];
    let (read, read_taken) = take_all(&backend, &key, c, SlotId::next(), &fresh, None).await;
    assert!(
        read_taken.is_some_and(|t| !t.granted),
        "the cap is full: {read:?}"
    );
    assert_eq!(read[0].count, 0, "{read:?}");
    assert_eq!(
        count(&backend, "fresh", &key).await,
        0,
        "and is not created"
    );
    assert!(give_back(&backend, "n", &key, a).await);
    let (third, third_taken) = take_all(&backend, &key, c, SlotId::next(), &counters, None).await;
    assert!(third_taken.is_some_and(|t| t.granted), "{third:?}");
    assert_eq!(third[0].count, 3, "the third of 3 is counted with its slot");
    assert!(give_back(&backend, "n", &key, b).await);
    // The counters refuse (4 of 3): counted as hits are, and no slot.
    let (over, over_taken) = take_all(&backend, &key, c, SlotId::next(), &counters, None).await;
    assert_eq!(over_taken, None, "refused by a quota: no slot: {over:?}");
    assert_eq!(
        over[0].count, 4,
        "a plain hit counts when refused, as hit_all"
    );
    assert_eq!(over[1].count, 4);
    assert_eq!(
        in_use(&backend, "n", &key).await,
        1,
        "only the third's slot"
    );
    assert_eq!(count(&backend, "q", &key).await, 4);
    let plain = take(&backend, "n", &Key::new("other"), c, SlotId::next()).await;
    assert!(plain.granted && plain.in_use == 1, "other keys: {plain:?}");
}

/// A `take_all` retried with its slot (held) is granted and counts nothing
/// again.
async fn take_all_retried_counts_once<S: Store>(store: &S)
where
    S::Backend: Leasing + Spending,
{
    let backend = store.fresh().await;
    let key = Key::new("again");
    let c = cap(2, Duration::from_secs(30));
    let counters = [counter("q", 5)];
    let slot = SlotId::next();
    let (first, first_taken) = take_all(&backend, &key, c, slot, &counters, None).await;
    assert!(
        first_taken.is_some_and(|t| t.granted && t.in_use == 1),
        "{first:?}"
    );
    assert_eq!(first[0].count, 1);
    let (again, again_taken) = take_all(&backend, &key, c, slot, &counters, None).await;
    assert!(
        again_taken.is_some_and(|t| t.granted && t.in_use == 1),
        "{again:?}"
    );
    assert_eq!(again[0].count, 1, "read, not counted again: {again:?}");
    assert!(again[0].deadline.is_none(), "nothing counted: {again:?}");
    assert_eq!(count(&backend, "q", &key).await, 1);
    assert_eq!(in_use(&backend, "n", &key).await, 1);
}

/// A `take_all` that spends: a spend that does not fit spends nothing and
/// takes no slot; one that fits spends its cost with the slot.
async fn take_all_spends_only_what_fits<S: Store>(store: &S)
where
    S::Backend: Leasing + Spending,
{
    let backend = store.fresh().await;
    let key = Key::new("spend");
    let c = cap(5, Duration::from_secs(30));
    let counters = [counter("q", 3)];
    let spend = Some(Spend::cost(2));
    let (first, first_taken) = take_all(&backend, &key, c, SlotId::next(), &counters, spend).await;
    assert!(first_taken.is_some_and(|t| t.granted), "{first:?}");
    assert_eq!(first[0].count, 2, "the cost is spent with the slot");
    let (second, second_taken) =
        take_all(&backend, &key, c, SlotId::next(), &counters, spend).await;
    assert_eq!(
        second_taken, None,
        "2 more of 3 do not fit: no slot: {second:?}"
    );
    assert!(
        second[0].count > 3,
        "a spend that did not fit says so: {second:?}"
    );
    assert_eq!(count(&backend, "q", &key).await, 2, "and spends nothing");
    assert_eq!(
        in_use(&backend, "n", &key).await,
        1,
        "the first's slot only"
    );
    let (one, one_taken) = take_all(
        &backend,
        &key,
        c,
        SlotId::next(),
        &counters,
        Some(Spend::cost(1)),
    )
    .await;
    assert!(
        one_taken.is_some_and(|t| t.granted && t.in_use == 2),
        "{one:?}"
    );
    assert_eq!(count(&backend, "q", &key).await, 3);
    // Spent in full, the counter is never a slot's record.
    assert_eq!(hit(&backend, "q", &key, minute(3)).await.count, 4);
}

/// A `take_all` whose spend has a first unit ([`Spend::first`]) spends as
/// [`Spending::spend_all`] does: the unit on the first counter, the cost
/// on the other, all or nothing, and a slot only when both fit.
async fn take_all_spends_a_first_unit_on_the_first_counter<S: Store>(store: &S)
where
    S::Backend: Leasing + Spending,
{
    let backend = store.fresh().await;
    let key = Key::new("first");
    let c = cap(5, Duration::from_secs(30));
    let counters = [counter("requests", 3), counter("tokens", 100)];
    let call = |unit, tokens| Some(Spend::cost(tokens).first(unit));
    let (both, both_taken) =
        take_all(&backend, &key, c, SlotId::next(), &counters, call(1, 60)).await;
    assert!(both_taken.is_some_and(|t| t.granted), "{both:?}");
    assert_eq!(
        (both[0].count, both[1].count),
        (1, 60),
        "each its own amount"
    );
    assert!(both.iter().all(|h| h.deadline.is_some()), "{both:?}");

    let (tokens, tokens_taken) =
        take_all(&backend, &key, c, SlotId::next(), &counters, call(1, 50)).await;
    assert_eq!(
        tokens_taken, None,
        "the tokens do not fit: no slot: {tokens:?}"
    );
    assert!(tokens.iter().all(|h| h.deadline.is_none()), "{tokens:?}");
    assert_eq!(tokens[1].count, 60 + 50, "what stands plus the cost");
    let (requests, requests_taken) =
        take_all(&backend, &key, c, SlotId::next(), &counters, call(3, 10)).await;
    assert_eq!(
        requests_taken, None,
        "the requests do not fit: no slot: {requests:?}"
    );
    assert_eq!(requests[0].count, 1 + 3, "what stands plus the unit");
    assert_eq!(count(&backend, "requests", &key).await, 1, "nothing spent");
    assert_eq!(count(&backend, "tokens", &key).await, 60, "nothing spent");

    let (check, check_taken) =
        take_all(&backend, &key, c, SlotId::next(), &counters, call(0, 10)).await;
    assert!(
        check_taken.is_some_and(|t| t.granted && t.in_use == 2),
        "a unit of 0 checks the requests: {check:?}"
    );
    assert_eq!((check[0].count, check[1].count), (1, 70));
    assert_eq!(count(&backend, "requests", &key).await, 1);
    assert_eq!(count(&backend, "tokens", &key).await, 70);
}
