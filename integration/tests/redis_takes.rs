//! Takes and give-backs of slots in flight through the Redis backend's
//! lanes, against a real redis-server that the harness starts: many steps
//! share a script call and each stays exact (never past a key's cap), a
//! corrupt record fails only its own steps, a give-back nobody waits for
//! is sent, and a connection killed mid-batch counts a take once or not at
//! all. The slots' batch script itself: each step as if sent alone, bad
//! arguments refused with nothing written for them. Take-alls (a slot and
//! the request's counters in one step): a script call each at most, fewer
//! when coalesced, each exact; a corrupt record or counter fails its own
//! step with nothing written; counted as `hit_all` and `spend_all` count;
//! denied by the deny cache without a call.

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::collections::BTreeSet;
use std::time::Duration;

use redis::aio::ConnectionManager;
use stores::redis::slots_key;
use support::redis::RedisServer;
use tower_pinned_window::backend::{
    Backend, BackendError, Cap, Counter, Hits, Leasing, SlotId, Spend, Spending, Taken,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{InFlight, Quota, Window};
use tower_pinned_window_redis::RedisBackend;
use trial::Needs;

async fn manager(server: &RedisServer) -> ConnectionManager {
    server.client().get_connection_manager().await.unwrap()
}

/// A cap of `max` slots on leases of `secs` seconds, under the namespace "n".
fn cap(max: u64, secs: u64) -> Cap<'static> {
    Cap {
        namespace: "n",
        in_flight: InFlight::new(max, Duration::from_secs(secs)).unwrap(),
    }
}

/// Script calls the server has run so far (`EVALSHA` and `EVAL`).
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cmd(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The slots the record of `key` holds (its members), read with `con`.
fn members(
    con: &mut redis::Connection,
    store: &RedisBackend<ConnectionManager>,
    key: &Key,
) -> BTreeSet<SlotId> {
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(slots_key(store, "n", key))
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap();
    members
        .iter()
        .map(|m| SlotId::parse(m.as_bytes()).unwrap_or_else(|| panic!("not a slot: {m}")))
        .collect()
}

/// The live slots of `key`, once the store answers (its connection may
/// still be the one a kill closed: the first call on it fails, and the
/// connection reconnects).
async fn in_use(store: &RedisBackend<ConnectionManager>, key: &Key) -> u64 {
    for _ in 0..250 {
        if let Ok(n) = store.in_use("n", key).await {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key:?}: Redis never came back");
}

/// Takes on their own tasks, so that many are in flight together: one per
/// (key, slot) of `takes`, each under `cap`. Gives back each one's key,
/// slot and answer, in order.
async fn take_together(
    store: &RedisBackend<ConnectionManager>,
    cap: Cap<'static>,
    takes: Vec<(Key, SlotId)>,
) -> Vec<(Key, SlotId, Result<Taken, BackendError>)> {
    let tasks: Vec<_> = takes
        .into_iter()
        .map(|(key, slot)| {
            let store = store.clone();
            tokio::spawn(async move {
                let taken = store.take(&key, cap, slot).await;
                (key, slot, taken)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Takes and give-backs issued together share script calls, and each
/// stays exact: no key passes its cap, each key grants exactly its cap,
/// the record holds exactly the slots granted, with a lifetime; the
/// give-backs, sent with nobody waiting ([`Leasing::release`]), empty the
/// records in a few calls too.
async fn takes_and_give_backs_in_flight_together_share_calls() {
    let server = redis_or_skip!(RedisServer::start(
        "takes_and_give_backs_in_flight_together_share_calls"
    ));
    let store = RedisBackend::new(manager(&server).await);
    let keys: Vec<Key> = (0..20)
        .map(|k| Key::display(format_args!("k{k}")))
        .collect();
    let takes: Vec<(Key, SlotId)> = (0..10)
        .flat_map(|_| keys.iter().map(|key| (key.clone(), SlotId::next())))
        .collect();
    let before = script_calls(&server);
    let answers = take_together(&store, cap(3, 60), takes).await;
    let calls = script_calls(&server) - before;
    assert!(
        calls * 4 < answers.len() as u64,
        "200 takes in flight together share calls: {calls} calls"
    );
    let mut con = server.sync();
    for key in &keys {
        let granted: BTreeSet<SlotId> = answers
            .iter()
            .filter(|(at, _, taken)| at == key && taken.as_ref().unwrap().granted)
            .map(|(_, slot, _)| *slot)
            .collect();
        assert_eq!(granted.len(), 3, "{key:?}: its cap, no more, no less");
        assert_eq!(members(&mut con, &store, key), granted, "{key:?}");
        for (_, _, taken) in answers.iter().filter(|(at, ..)| at == key) {
            let taken = taken.as_ref().unwrap();
            assert!((1..=3).contains(&taken.in_use), "{key:?}: {taken:?}");
            if !taken.granted {
                assert_eq!(taken.in_use, 3, "{key:?}: refused at the cap");
                assert!(taken.retry > Duration::from_secs(55), "{key:?}: {taken:?}");
            }
        }
        let ttl: i64 = redis::cmd("PTTL")
            .arg(slots_key(&store, "n", key))
            .query(&mut con)
            .unwrap();
        assert!(
            ttl > 55_000,
            "{key:?}: the record lives past its leases: {ttl}"
        );
    }
    let before = script_calls(&server);
    let granted: Vec<_> = answers
        .iter()
        .filter(|(_, _, taken)| taken.as_ref().unwrap().granted)
        .collect();
    for (key, slot, _) in &granted {
        store.release("n", key, *slot);
    }
    for _ in 0..250 {
        if keys
            .iter()
            .all(|key| members(&mut con, &store, key).is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for key in &keys {
        assert!(
            members(&mut con, &store, key).is_empty(),
            "{key:?}: every slot given back without waiting"
        );
        assert_eq!(store.in_use("n", key).await.unwrap(), 0);
    }
    let calls = script_calls(&server) - before - keys.len() as u64;
    // Shared: well under a call each (how many each call carries moves
    // with the machine's load: 15 for 60 under CI's).
    assert!(
        calls * 2 < granted.len() as u64,
        "60 give-backs released together share calls: {calls} calls"
    );
}

/// A backend built with `coalesce(false)` sends each step in a call of its
/// own, and a slot released (nobody waiting) is given back all the same.
async fn without_lanes_each_step_is_a_call_and_a_release_is_sent() {
    let server = redis_or_skip!(RedisServer::start(
        "without_lanes_each_step_is_a_call_and_a_release_is_sent"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .coalesce(false)
        .build();
    let keys: Vec<Key> = (0..5).map(|k| Key::display(format_args!("k{k}"))).collect();
    let takes: Vec<(Key, SlotId)> = (0..4)
        .flat_map(|_| keys.iter().map(|key| (key.clone(), SlotId::next())))
        .collect();
    // The script loaded (the first call of each is an `EVAL` too).
    take_together(&store, cap(3, 60), vec![(Key::new("warm"), SlotId::next())]).await;
    let before = script_calls(&server);
    let answers = take_together(&store, cap(3, 60), takes).await;
    assert_eq!(script_calls(&server) - before, 20, "a call a take");
    let mut con = server.sync();
    for (key, slot, taken) in &answers {
        if taken.as_ref().unwrap().granted {
            store.release("n", key, *slot);
        }
    }
    for key in &keys {
        for _ in 0..250 {
            if members(&mut con, &store, key).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(members(&mut con, &store, key).is_empty(), "{key:?}");
    }
}

/// Steps on a corrupt record, in the same calls as steps on good ones,
/// fail as corrupt (named by the record, left exactly as it was); the
/// other steps of those calls are made.
async fn a_corrupt_record_fails_only_its_own_steps_in_a_batch() {
    let server = redis_or_skip!(RedisServer::start(
        "a_corrupt_record_fails_only_its_own_steps_in_a_batch"
    ));
    let store = RedisBackend::new(manager(&server).await);
    let mut con = server.sync();
    let bad = Key::new("bad");
    let record = slots_key(&store, "n", &bad);
    let _: () = redis::cmd("ZADD")
        .arg(&record)
        .arg(1)
        .arg("not-a-slot")
        .query(&mut con)
        .unwrap();
    let before: Vec<u8> = redis::cmd("DUMP").arg(&record).query(&mut con).unwrap();
    let takes: Vec<(Key, SlotId)> = (0..60)
        .map(|i| {
            let key = if i % 4 == 3 {
                bad.clone()
            } else {
                Key::display(format_args!("good{}", i % 5))
            };
            (key, SlotId::next())
        })
        .collect();
    let calls = script_calls(&server);
    let answers = take_together(&store, cap(100, 60), takes).await;
    assert!(script_calls(&server) - calls < 30, "the steps shared calls");
    let name = record.escape_ascii().to_string();
    for (key, slot, taken) in &answers {
        if *key == bad {
            assert!(
                matches!(taken, Err(BackendError::Corrupt { key, detail }) if *key == name && detail.contains("not a slot")),
                "{taken:?}"
            );
            let given = store.give_back("n", key, *slot).await;
            assert!(
                matches!(given, Err(BackendError::Corrupt { .. })),
                "{given:?}"
            );
        } else {
            assert!(taken.as_ref().unwrap().granted, "{key:?}: {taken:?}");
        }
    }
    let after: Vec<u8> = redis::cmd("DUMP").arg(&record).query(&mut con).unwrap();
    assert_eq!(after, before, "the corrupt record is left as it was");
    let held: usize = (0..5)
        .map(|k| members(&mut con, &store, &Key::display(format_args!("good{k}"))).len())
        .sum();
    assert_eq!(held, 45, "every good take of the calls was made");
}

/// The issue's test: connections killed while calls of takes are in
/// flight, at their worst moments: while the server is paused (calls sent
/// and never run) and at random during traffic (calls that ran and whose
/// answer is lost). A caller that sees a take fail either asks again with
/// the same slot (granted without taking two) or gives it back by its name
/// (as the layer does). Afterwards every key's record holds exactly the
/// slots their callers saw granted: each take counted once or not at all.
async fn a_client_kill_mid_batch_counts_a_take_once_or_not_at_all() {
    let server = redis_or_skip!(RedisServer::start(
        "a_client_kill_mid_batch_counts_a_take_once_or_not_at_all"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .no_breaker()
        .build();
    let warm = take_together(&store, cap(1, 60), vec![(Key::new("warm"), SlotId::next())]).await;
    assert!(warm[0].2.as_ref().unwrap().granted);
    let (keys, per_key) = (8, 25);
    let (mut failed, mut retried) = (0, 0);
    for round in 0..6u64 {
        // Rounds of a cap every take fits in, and rounds where most are
        // refused.
        let limit = if round % 3 == 2 {
            cap(10, 60)
        } else {
            cap(1_000, 60)
        };
        let keys: Vec<Key> = (0..keys)
            .map(|k| Key::display(format_args!("r{round}k{k}")))
            .collect();
        let takes: Vec<(usize, Key, SlotId)> = (0..per_key)
            .flat_map(|i| keys.iter().map(move |key| (i, key.clone(), SlotId::next())))
            .collect();
        let paused = round % 2 == 0;
        if paused {
            // Paused before the takes are sent: their calls wait unrun,
            // and the kill drops them.
            server.cmd(&["CLIENT", "PAUSE", "300", "WRITE"]).unwrap();
        }
        let killer = async {
            if paused {
                // The first kill cuts the lane's two calls; the second, the
                // call of every take queued behind them, sent again paused.
                for _ in 0..2 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
                }
                return;
            }
            // During traffic: calls that ran, and whose answers are lost.
            for kill in 0..5 {
                tokio::time::sleep(Duration::from_millis(round + 2 * kill)).await;
                server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
            }
        };
        let callers = takes.into_iter().map(|(i, key, slot)| {
            let store = store.clone();
            tokio::spawn(async move {
                if !paused {
                    // Spread over the kills.
                    tokio::time::sleep(Duration::from_micros(i as u64 * 1_500)).await;
                }
                let first = store.take(&key, limit, slot).await;
                let Err(_) = first else {
                    return (key, slot, first.unwrap().granted, false);
                };
                if i % 2 == 1 {
                    // Not known: given back by its name, as the layer does.
                    store.release("n", &key, slot);
                    return (key, slot, false, true);
                }
                // Asked again with the same slot once Redis is back.
                for _ in 0..250 {
                    if let Ok(taken) = store.take(&key, limit, slot).await {
                        return (key, slot, taken.granted, true);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("{key:?}: Redis never came back");
            })
        });
        let callers: Vec<_> = callers.collect();
        let (_, answers) = tokio::join!(killer, async {
            let mut answers = Vec::new();
            for caller in callers {
                answers.push(caller.await.unwrap());
            }
            answers
        });
        server.cmd(&["CLIENT", "UNPAUSE"]).unwrap();
        // A connection of this round's own: the kills closed the others.
        let mut con = server.sync();
        failed += answers.iter().filter(|a| a.3).count();
        retried += answers.iter().filter(|a| a.3 && a.2).count();
        for key in &keys {
            let granted: BTreeSet<SlotId> = answers
                .iter()
                .filter(|(at, _, granted, _)| at == key && *granted)
                .map(|(_, slot, ..)| *slot)
                .collect();
            assert!(
                granted.len() as u64 <= limit.in_flight.max(),
                "{key:?}: {} granted",
                granted.len()
            );
            // The give-backs by name go without waiting: read until they
            // landed.
            let mut held = members(&mut con, &store, key);
            for _ in 0..250 {
                if held == granted {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                held = members(&mut con, &store, key);
            }
            assert_eq!(
                held, granted,
                "{key:?} (round {round}): the record holds exactly the slots seen granted"
            );
            assert_eq!(in_use(&store, key).await, granted.len() as u64);
        }
    }
    eprintln!("{failed} takes cut by a kill, {retried} granted when asked again");
    // The kills landed on calls in flight: some takes saw them, and some
    // asked again.
    assert!(failed > 0, "no take was cut by a kill");
    assert!(retried > 0, "no take was asked again after a kill");
}

/// A counter of `namespace` with a quota of `limit` a minute.
fn counter(namespace: &'static str, limit: u64) -> Counter<'static> {
    Counter {
        namespace,
        quota: Quota::new(limit, Duration::from_secs(60)).unwrap(),
        lowers: false,
    }
}

/// Take-alls on their own tasks, so that many are in flight together: one
/// per (key, slot) of `steps`, each under `cap` on `counters` (plain
/// hits). Gives back each one's key, slot and answer, in order.
async fn take_all_together(
    store: &RedisBackend<ConnectionManager>,
    cap: Cap<'static>,
    counters: &[Counter<'static>],
    steps: Vec<(Key, SlotId)>,
) -> Vec<(Key, SlotId, Result<Hits, BackendError>)> {
    let tasks: Vec<_> = steps
        .into_iter()
        .map(|(key, slot)| {
            let store = store.clone();
            let counters = counters.to_vec();
            tokio::spawn(async move {
                let hits = store.take_all(&key, cap, slot, &counters, None).await;
                (key, slot, hits)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// The count stored in `namespace`'s counter for `key` (0 when missing).
fn stored_count(
    con: &mut redis::Connection,
    store: &RedisBackend<ConnectionManager>,
    namespace: &str,
    key: &Key,
) -> u64 {
    let value: Option<u64> = redis::cmd("GET")
        .arg(store.storage_key(namespace, key))
        .query(con)
        .unwrap();
    value.unwrap_or(0)
}

/// Take-alls in flight together, with and without lanes: at most a script
/// call each (a call each without lanes; far fewer with them), and each
/// exact: every key grants exactly its cap, its record holds exactly the
/// slots granted, and its counters count exactly the steps that were
/// counted (the cap's refusals read them, counting nothing).
async fn take_alls_in_flight_use_a_call_each_at_most_and_stay_exact() {
    let server = redis_or_skip!(RedisServer::start(
        "take_alls_in_flight_use_a_call_each_at_most_and_stay_exact"
    ));
    let counters = [counter("q", 5), counter("q:10", 10)];
    for coalesce in [true, false] {
        let store = RedisBackend::builder(manager(&server).await)
            .coalesce(coalesce)
            .build();
        let round = if coalesce { "lanes" } else { "alone" };
        // The script loaded (the first call is an `EVAL` too).
        let warm = Key::display(format_args!("{round}-warm"));
        take_all_together(&store, cap(3, 60), &counters, vec![(warm, SlotId::next())]).await;
        let keys: Vec<Key> = (0..10)
            .map(|k| Key::display(format_args!("{round}{k}")))
            .collect();
        let steps: Vec<(Key, SlotId)> = (0..8)
            .flat_map(|_| keys.iter().map(|key| (key.clone(), SlotId::next())))
            .collect();
        let before = script_calls(&server);
        let answers = take_all_together(&store, cap(3, 60), &counters, steps).await;
        let calls = script_calls(&server) - before;
        let n = answers.len() as u64;
        eprintln!("{round}: {n} take-alls in {calls} script calls");
        if coalesce {
            assert!(
                calls * 2 < n,
                "{n} take-alls in flight together share calls: {calls} calls"
            );
        } else {
            assert_eq!(calls, n, "a call a take-all");
        }
        let mut con = server.sync();
        for key in &keys {
            let mut granted = BTreeSet::new();
            for (_, slot, hits) in answers.iter().filter(|(at, ..)| at == key) {
                let (hits, taken) = hits.as_ref().unwrap().clone().split_taken();
                let taken = taken.expect("the counters admit every step");
                assert_eq!(hits.len(), 2, "{key:?}: {hits:?}");
                if taken.granted {
                    granted.insert(*slot);
                    assert!(hits.iter().all(|h| h.deadline.is_some()), "{hits:?}");
                } else {
                    assert_eq!(taken.in_use, 3, "{key:?}: refused at the cap");
                    assert!(hits.iter().all(|h| h.deadline.is_none()), "{hits:?}");
                }
            }
            assert_eq!(granted.len(), 3, "{key:?}: its cap, no more, no less");
            assert_eq!(members(&mut con, &store, key), granted, "{key:?}");
            for namespace in ["q", "q:10"] {
                assert_eq!(
                    stored_count(&mut con, &store, namespace, key),
                    3,
                    "{key:?}: counted with the slots granted only"
                );
            }
        }
    }
}

/// A take-all on a corrupt record (another type) fails as corrupt, named
/// by the record, and changes nothing: its counters are not created, the
/// record is left as it was; in the same calls, the take-alls of good
/// keys are made. A corrupt counter fails its step too, before anything
/// is written: the other counter is not counted, and a lease run out in
/// the record is not even dropped.
async fn a_corrupt_record_or_counter_fails_a_take_all_and_writes_nothing() {
    let server = redis_or_skip!(RedisServer::start(
        "a_corrupt_record_or_counter_fails_a_take_all_and_writes_nothing"
    ));
    let store = RedisBackend::new(manager(&server).await);
    let mut con = server.sync();
    let bad = Key::new("bad");
    let record = slots_key(&store, "n", &bad);
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg("abc")
        .query(&mut con)
        .unwrap();
    let before: Vec<u8> = redis::cmd("DUMP").arg(&record).query(&mut con).unwrap();
    let counters = [counter("q", 100)];
    let steps: Vec<(Key, SlotId)> = (0..40)
        .map(|i| {
            let key = if i % 4 == 3 {
                bad.clone()
            } else {
                Key::display(format_args!("good{}", i % 5))
            };
            (key, SlotId::next())
        })
        .collect();
    let answers = take_all_together(&store, cap(100, 60), &counters, steps).await;
    let name = record.escape_ascii().to_string();
    for (key, _, hits) in &answers {
        if *key == bad {
            assert!(
                matches!(hits, Err(BackendError::Corrupt { key, detail }) if *key == name && detail.contains("type string")),
                "{hits:?}"
            );
        } else {
            let (hits, taken) = hits.as_ref().unwrap().clone().split_taken();
            assert!(taken.is_some_and(|t| t.granted), "{key:?}: {hits:?}");
        }
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(store.storage_key("q", &bad))
        .query(&mut con)
        .unwrap();
    assert!(!exists, "a take-all that failed creates no counter");
    let after: Vec<u8> = redis::cmd("DUMP").arg(&record).query(&mut con).unwrap();
    assert_eq!(after, before, "the corrupt record is left as it was");
    let counted: u64 = (0..5)
        .map(|k| {
            stored_count(
                &mut con,
                &store,
                "q",
                &Key::display(format_args!("good{k}")),
            )
        })
        .sum();
    assert_eq!(counted, 30, "every good take-all of the calls was counted");

    // A corrupt counter, beside a good one and a record with a lease run
    // out.
    let key = Key::new("counter");
    let record = slots_key(&store, "n", &key);
    let stale = format!("{:032x}", 0x5);
    let _: () = redis::cmd("ZADD")
        .arg(&record)
        .arg(1)
        .arg(&stale)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&record)
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(store.storage_key("r", &key))
        .arg("12abc")
        .query(&mut con)
        .unwrap();
    for spend in [None, Some(Spend::cost(1))] {
        let err = store
            .take_all(
                &key,
                cap(5, 60),
                SlotId::next(),
                &[counter("q", 100), counter("r", 100)],
                spend,
            )
            .await
            .expect_err("a corrupt counter fails the step");
        let name = store.storage_key("r", &key).escape_ascii().to_string();
        assert!(
            matches!(&err, BackendError::Corrupt { key, detail } if *key == name && detail.contains("12abc")),
            "{spend:?}: {err:?}"
        );
        assert_eq!(stored_count(&mut con, &store, "q", &key), 0, "{spend:?}");
        assert_eq!(
            members(&mut con, &store, &key),
            BTreeSet::from([SlotId::parse(stale.as_bytes()).unwrap()]),
            "{spend:?}: nothing written, not even the lease run out dropped"
        );
    }
    let value: String = redis::cmd("GET")
        .arg(store.storage_key("r", &key))
        .query(&mut con)
        .unwrap();
    assert_eq!(value, "12abc", "a corrupt counter is left as it is");
}

/// A take-all with room in the cap counts exactly as `hit_all` (no
/// spend) or `spend_all` (a spend) counts on another key: the same counts,
/// times left and deadlines (or none), the same stored counts and
/// lockouts; the slot is taken exactly when every count is within its
/// limit.
async fn a_take_all_counts_as_hit_all_and_spend_all() {
    let server = redis_or_skip!(RedisServer::start(
        "a_take_all_counts_as_hit_all_and_spend_all"
    ));
    // No deny cache: every step goes to Redis on both sides.
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let mut con = server.sync();
    let counters = [counter("q", 3), counter("q:10", 10)];
    let lockout = Window::new(Duration::from_secs(10)).unwrap();
    let steps: Vec<Option<Spend>> = vec![
        None,
        Some(Spend::cost(0)),
        Some(Spend::cost(0).open()),
        Some(Spend::cost(1)),
        None,
        Some(Spend::cost(2)),
        Some(Spend::cost(2).block(lockout)),
        Some(Spend::cost(1)),
        None,
        Some(Spend::cost(0)),
    ];
    let (alone, together) = (Key::new("alone"), Key::new("together"));
    let mut held = 0;
    for (at, spend) in steps.iter().enumerate() {
        let want = match spend {
            None => store.hit_all(&alone, &counters).await.unwrap(),
            Some(spend) => store.spend_all(&alone, &counters, *spend).await.unwrap(),
        };
        let (got, taken) = store
            .take_all(&together, cap(100, 60), SlotId::next(), &counters, *spend)
            .await
            .unwrap()
            .split_taken();
        let what = format!("step {at} ({spend:?}): {want:?} / {got:?}");
        assert_eq!(got.len(), want.len(), "{what}");
        for (got, want) in got.iter().zip(want.iter()) {
            assert_eq!(got.count, want.count, "{what}");
            assert_eq!(got.deadline.is_some(), want.deadline.is_some(), "{what}");
            let apart = got.reset.abs_diff(want.reset);
            assert!(apart < Duration::from_millis(500), "{what}");
        }
        let admitted = want
            .iter()
            .zip(&counters)
            .all(|(hit, c)| hit.count <= c.quota.limit());
        if admitted {
            held += 1;
            assert!(
                taken.is_some_and(|t| t.granted && t.in_use == held),
                "{what}"
            );
        } else {
            assert_eq!(taken, None, "{what}: no slot");
        }
        assert_eq!(store.in_use("n", &together).await.unwrap(), held, "{what}");
        for c in &counters {
            assert_eq!(
                stored_count(&mut con, &store, c.namespace, &together),
                stored_count(&mut con, &store, c.namespace, &alone),
                "{what}: {}",
                c.namespace
            );
            let mut locked = |key: &Key| -> i64 {
                let mut lock = store.storage_key(c.namespace, key);
                lock.extend_from_slice(b":lock");
                redis::cmd("PTTL").arg(lock).query(&mut con).unwrap()
            };
            let (here, there) = (locked(&together), locked(&alone));
            assert_eq!(here > 0, there > 0, "{what}: lockout");
        }
    }
    assert!(
        held > 0 && held < steps.len() as u64,
        "some admitted, some not"
    );
}

/// A take-all the deny cache already denies is answered without a call:
/// nothing counted, no slot taken (`taken` is `None`); the denial was
/// remembered from a take-all's own answer.
async fn a_take_all_the_deny_cache_denies_makes_no_call() {
    let server = redis_or_skip!(RedisServer::start(
        "a_take_all_the_deny_cache_denies_makes_no_call"
    ));
    let store = RedisBackend::new(manager(&server).await);
    let mut con = server.sync();
    let key = Key::new("denied");
    let counters = [counter("q", 2)];
    for n in 1..=3u64 {
        let hits = store
            .take_all(&key, cap(100, 60), SlotId::next(), &counters, None)
            .await
            .unwrap();
        assert_eq!(hits[0].count, n, "{hits:?}");
        let (hits, taken) = hits.split_taken();
        assert_eq!(taken.is_some(), n <= 2, "{hits:?}");
    }
    let before = script_calls(&server);
    for spend in [None, Some(Spend::cost(1))] {
        let hits = store
            .take_all(&key, cap(100, 60), SlotId::next(), &counters, spend)
            .await
            .unwrap();
        assert_eq!(hits.clone().split_taken().1, None, "{spend:?}: {hits:?}");
        assert!(hits[0].count > 2 && hits[0].deadline.is_none(), "{hits:?}");
    }
    assert_eq!(script_calls(&server), before, "answered by the deny cache");
    assert_eq!(stored_count(&mut con, &store, "q", &key), 3);
    assert_eq!(store.in_use("n", &key).await.unwrap(), 2);
}

/// The take-all script on its own (`EVAL` of its text): requests in one
/// call, each as if sent alone; bad arguments, a corrupt record and a
/// corrupt counter or lockout each refuse only their own request, with
/// nothing written for it; a call whose requests cannot be read at all is
/// refused whole, before anything is written.
fn the_take_all_script_refuses_bad_requests_and_writes_nothing_for_them() {
    let server = redis_or_skip!(RedisServer::start(
        "the_take_all_script_refuses_bad_requests_and_writes_nothing_for_them"
    ));
    let mut con = server.sync();
    for (key, value) in [("tpw:n{text}:slots", "abc"), ("tpw:q{bad}", "1x")] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query(&mut con)
            .unwrap();
    }
    // A lockout without a lifetime.
    let _: () = redis::cmd("SET")
        .arg("tpw:q{lock}:lock")
        .arg("1")
        .query(&mut con)
        .unwrap();
    let a = format!("{:032x}", 0xa);
    let script = concat!(
        include_str!("../../redis/src/slots.lua"),
        include_str!("../../redis/src/take_all.lua")
    );
    // (key, argument after the slot, spends, what the request must answer:
    // its code, or the reason's end)
    type Case<'a> = (&'a str, &'a str, bool, Result<i64, &'a str>);
    let requests: &[Case<'_>] = &[
        ("x", "2 60000 1 - 0 0 5 60000", false, Ok(1)),
        ("x", "2 60000 1 1 0 0 5 60000", true, Ok(1)),
        ("x", "2 60000 1 - 0 0 5 60000", false, Ok(0)),
        (
            "y",
            "0 60000 1 - 0 0 5 60000",
            false,
            Err("invalid cap 0 60000"),
        ),
        ("y", "2 0 1 - 0 0 5 60000", false, Err("invalid cap 2 0")),
        ("y", "2 60000 1 1.5 0 0 5 60000", true, Err("invalid spend")),
        (
            "y",
            "2 60000 1 1 0 0 5 60000 first x",
            true,
            Err("invalid spend"),
        ),
        (
            "y",
            "2 60000 1 1 0 0 5 60000 first 01",
            true,
            Err("invalid spend"),
        ),
        (
            "y",
            "2 60000 1 - 0 0 5 60000 first 1",
            false,
            Err("invalid spend"),
        ),
        ("y", "2 60000 1 01 0 0 5 60000", true, Err("invalid spend")),
        (
            "y",
            "2 60000 1 - 0 0 5 0",
            false,
            Err("invalid limit or window"),
        ),
        (
            "text",
            "2 60000 1 - 0 0 5 60000",
            false,
            Err("a key of type string"),
        ),
        ("bad", "2 60000 1 - 0 0 5 60000", false, Err("value 1x")),
        (
            "lock",
            "2 60000 1 1 0 0 5 60000",
            true,
            Err("a lockout without a lifetime"),
        ),
    ];
    let mut cmd = redis::cmd("EVAL");
    let keys: usize = requests.iter().map(|r| if r.2 { 3 } else { 2 }).sum();
    cmd.arg(script).arg(keys);
    for (key, _, spends, _) in requests {
        cmd.arg(format!("tpw:n{{{key}}}:slots"))
            .arg(format!("tpw:q{{{key}}}"));
        if *spends {
            cmd.arg(format!("tpw:q{{{key}}}:lock"));
        }
    }
    for (at, (_, argument, ..)) in requests.iter().enumerate() {
        // The third request's slot differs: the cap of 2 is then full.
        let slot = if at == 2 {
            format!("{:032x}", 0xb)
        } else {
            a.clone()
        };
        let slot = if at == 1 {
            format!("{:032x}", 0xc)
        } else {
            slot
        };
        cmd.arg(format!("{slot} {argument}"));
    }
    let reply: Vec<redis::Value> = cmd.query(&mut con).unwrap();
    let (packed, reasons) = match reply.as_slice() {
        [redis::Value::BulkString(packed), reasons @ ..] => (packed, reasons),
        other => panic!("unexpected reply {other:?}"),
    };
    let mut nums = packed
        .chunks(8)
        .map(|n| i64::from_be_bytes(n.try_into().unwrap()));
    let mut reasons = reasons.iter();
    for (at, (key, argument, _, want)) in requests.iter().enumerate() {
        let code = nums.next().unwrap();
        let what = format!("request {at}: {key} {argument:?}: {code}");
        match want {
            Ok(want) => {
                assert_eq!(code, *want, "{what}");
                let (in_use, ms) = (nums.next().unwrap(), nums.next().unwrap());
                assert_eq!(in_use, 2.min(at as i64 + 1), "{what}");
                let [count, left, deadline, full] = std::array::from_fn(|_| nums.next().unwrap());
                assert_eq!(count, 2.min(at as i64 + 1), "{what}: counted, then read");
                assert!(left > 55_000 && full == 0, "{what}: {left} {full}");
                if code == 0 {
                    assert!(ms > 55_000 && deadline == -1, "{what}: {ms}");
                } else {
                    assert!(ms == 0 && deadline > 0, "{what}: {ms}");
                }
            }
            Err(why) => {
                let want = if why.starts_with("invalid") { -2 } else { -1 };
                assert_eq!(code, want, "{what}");
                if code == -1 {
                    let place = nums.next().unwrap();
                    assert_eq!(place, if *key == "text" { 0 } else { 1 }, "{what}");
                }
                let reason = match reasons.next() {
                    Some(redis::Value::BulkString(reason)) => String::from_utf8_lossy(reason),
                    other => panic!("{what}: reason {other:?}"),
                };
                assert!(reason.ends_with(why), "{what}: {reason}");
            }
        }
    }
    assert!(
        nums.next().is_none() && reasons.next().is_none(),
        "{reply:?}"
    );
    for key in [
        "tpw:n{y}:slots",
        "tpw:q{y}",
        "tpw:q{text}",
        "tpw:n{bad}:slots",
        "tpw:n{lock}:slots",
        "tpw:q{lock}",
    ] {
        let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut con).unwrap();
        assert!(!exists, "{key}: nothing written for a refused request");
    }
    let kept: Vec<(String, String)> = ["tpw:n{text}:slots", "tpw:q{bad}"]
        .iter()
        .map(|key| {
            let value: String = redis::cmd("GET").arg(*key).query(&mut con).unwrap();
            (key.to_string(), value)
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("tpw:n{text}:slots".to_string(), "abc".to_string()),
            ("tpw:q{bad}".to_string(), "1x".to_string())
        ],
        "corrupt keys are left as they are"
    );
    // A request whose counters cannot be read refuses the call whole.
    let err = redis::cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg("tpw:n{z}:slots")
        .arg("tpw:q{z}")
        .arg(format!("{a} 2 60000 2 - 0 0 5 60000"))
        .query::<redis::Value>(&mut con)
        .expect_err("two counters named, one sent");
    assert!(err.to_string().contains("invalid take_all batch"), "{err}");
    let exists: bool = redis::cmd("EXISTS")
        .arg("tpw:n{z}:slots")
        .query(&mut con)
        .unwrap();
    assert!(!exists);
}

/// The slots' batch script on its own (`EVAL` of its text): each step
/// answered as if sent alone, in order, a record named twice seeing the
/// steps before; bad arguments refused with nothing written for them; a
/// corrupt record refusing only its own steps.
fn the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments() {
    let server = redis_or_skip!(RedisServer::start(
        "the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments"
    ));
    let mut con = server.sync();
    let _: () = redis::cmd("SET")
        .arg("tpw:n{text}:slots")
        .arg("abc")
        .query(&mut con)
        .unwrap();
    let a = format!("{:032x}", 0xa);
    let b = format!("{:032x}", 0xb);
    let c = format!("{:032x}", 0xc);
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000)
        .to_string();
    // "old": a lease long run out (a), a live one to the hour (b), the
    // record living an hour; "stale": a lease run out, still there.
    for (record, score, slot) in [
        ("old", "1", &a),
        ("old", far.as_str(), &b),
        ("stale", "1", &c),
    ] {
        let _: () = redis::cmd("ZADD")
            .arg(format!("tpw:n{{{record}}}:slots"))
            .arg(score)
            .arg(slot)
            .query(&mut con)
            .unwrap();
    }
    for (record, ms) in [("old", 3_600_000), ("stale", 60_000)] {
        let _: () = redis::cmd("PEXPIRE")
            .arg(format!("tpw:n{{{record}}}:slots"))
            .arg(ms)
            .query(&mut con)
            .unwrap();
    }
    // (record, slot, spec, what the step must answer: code, in use, or the
    // reason's end)
    type Case<'a> = (&'a str, &'a str, &'a str, Result<(i64, i64), &'a str>);
    let steps: &[Case<'_>] = &[
        ("x", &a, "2 60000", Ok((1, 1))),
        ("x", &a, "2 60000", Ok((1, 1))),
        ("x", &b, "2 60000", Ok((1, 2))),
        ("x", &c, "2 60000", Ok((0, 2))),
        ("x", &a, "-", Ok((1, 0))),
        ("x", &a, "-", Ok((0, 0))),
        ("x", &c, "2 60000", Ok((1, 2))),
        ("y", "not-a-slot", "2 60000", Err("invalid slot not-a-slot")),
        ("y", &a, "0 60000", Err("invalid take 0 60000")),
        ("y", &a, "2 0", Err("invalid take 2 0")),
        ("y", &a, "2", Err("invalid take 2")),
        ("y", &a, "2 1.5", Err("invalid take 2 1.5")),
        ("y", &a, "", Err("invalid take ")),
        ("text", &a, "2 60000", Err("a key of type string")),
        ("text", &a, "-", Err("a key of type string")),
        ("y", &a, "-", Ok((0, 0))),
        ("z", &b, "1 30000", Ok((1, 1))),
        // The lease run out is dropped by the take; the record's hour is
        // not shortened to the new lease.
        ("old", &c, "2 60000", Ok((1, 2))),
        ("old", &a, "-", Ok((0, 0))),
        // A give-back finds a slot run out but still there, as ZREM does.
        ("stale", &c, "-", Ok((1, 0))),
    ];
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(concat!(
        include_str!("../../redis/src/slots.lua"),
        include_str!("../../redis/src/slots_batch.lua")
    ))
    .arg(steps.len());
    for (record, ..) in steps {
        cmd.arg(format!("tpw:n{{{record}}}:slots"));
    }
    for (_, slot, spec, _) in steps {
        cmd.arg(*slot).arg(*spec);
    }
    let reply: Vec<redis::Value> = cmd.query(&mut con).unwrap();
    let (packed, refused) = match reply.as_slice() {
        [redis::Value::BulkString(packed), refused @ ..] => (packed, refused),
        other => panic!("unexpected reply {other:?}"),
    };
    assert_eq!(packed.len(), 24 * steps.len(), "{reply:?}");
    let int = |bytes: &[u8]| i64::from_be_bytes(bytes.try_into().unwrap());
    for (at, ((record, slot, spec, want), step)) in steps.iter().zip(packed.chunks(24)).enumerate()
    {
        let (code, in_use, ms) = (int(&step[..8]), int(&step[8..16]), int(&step[16..]));
        let what = format!("step {at}: {record} {slot} {spec:?}: {code}, {in_use}, {ms}");
        let reason = refused
            .chunks(2)
            .find(|r| r[0] == redis::Value::Int(at as i64 + 1))
            .map(|r| match &r[1] {
                redis::Value::BulkString(why) => String::from_utf8_lossy(why).into_owned(),
                other => panic!("{what}: reason {other:?}"),
            });
        match want {
            Ok((want_code, want_in_use)) => {
                assert_eq!((code, in_use), (*want_code, *want_in_use), "{what}");
                assert!(reason.is_none(), "{what}");
                if *spec != "-" && code == 0 {
                    assert!(
                        (55_000..=60_000).contains(&ms),
                        "{what}: the earliest lease"
                    );
                } else {
                    assert_eq!(ms, 0, "{what}");
                }
            }
            Err(why) => {
                let reason = reason.unwrap_or_else(|| panic!("{what}: no reason"));
                assert!(reason.ends_with(why), "{what}: {reason}");
                let want_code = if why.starts_with("invalid") { -2 } else { -1 };
                assert_eq!((code, in_use, ms), (want_code, 0, 0), "{what}");
            }
        }
    }
    let members = |record: &str| -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(format!("tpw:n{{{record}}}:slots"))
            .arg(0)
            .arg(-1)
            .query(&mut server.sync())
            .unwrap()
    };
    assert_eq!(members("x"), [b.clone(), c.clone()]);
    assert!(
        members("y").is_empty(),
        "nothing written for a refused step"
    );
    assert_eq!(members("z"), std::slice::from_ref(&b));
    let exists: bool = redis::cmd("EXISTS")
        .arg("tpw:n{y}:slots")
        .query(&mut con)
        .unwrap();
    assert!(!exists);
    for (record, lease) in [("x", 60_000), ("z", 30_000)] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("tpw:n{{{record}}}:slots"))
            .query(&mut con)
            .unwrap();
        assert!(ttl > lease - 5_000 && ttl <= lease, "{record}: {ttl}");
    }
    assert_eq!(members("old"), [c.clone(), b.clone()]);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("tpw:n{old}:slots")
        .query(&mut con)
        .unwrap();
    assert!(ttl > 3_500_000, "never shortened: {ttl}");
    assert!(members("stale").is_empty(), "emptied, so deleted");
    let text: String = redis::cmd("GET")
        .arg("tpw:n{text}:slots")
        .query(&mut con)
        .unwrap();
    assert_eq!(text, "abc", "a record that is not one is left as it is");
}

fn main() {
    let trials = vec![
        trial::multi(
            "takes_and_give_backs_in_flight_together_share_calls",
            Needs::Redis,
            takes_and_give_backs_in_flight_together_share_calls,
        ),
        trial::multi(
            "without_lanes_each_step_is_a_call_and_a_release_is_sent",
            Needs::Redis,
            without_lanes_each_step_is_a_call_and_a_release_is_sent,
        ),
        trial::multi(
            "a_corrupt_record_fails_only_its_own_steps_in_a_batch",
            Needs::Redis,
            a_corrupt_record_fails_only_its_own_steps_in_a_batch,
        ),
        trial::multi(
            "a_client_kill_mid_batch_counts_a_take_once_or_not_at_all",
            Needs::Redis,
            a_client_kill_mid_batch_counts_a_take_once_or_not_at_all,
        ),
        trial::multi(
            "take_alls_in_flight_use_a_call_each_at_most_and_stay_exact",
            Needs::Redis,
            take_alls_in_flight_use_a_call_each_at_most_and_stay_exact,
        ),
        trial::multi(
            "a_corrupt_record_or_counter_fails_a_take_all_and_writes_nothing",
            Needs::Redis,
            a_corrupt_record_or_counter_fails_a_take_all_and_writes_nothing,
        ),
        trial::multi(
            "a_take_all_counts_as_hit_all_and_spend_all",
            Needs::Redis,
            a_take_all_counts_as_hit_all_and_spend_all,
        ),
        trial::multi(
            "a_take_all_the_deny_cache_denies_makes_no_call",
            Needs::Redis,
            a_take_all_the_deny_cache_denies_makes_no_call,
        ),
        trial::trial(
            "the_take_all_script_refuses_bad_requests_and_writes_nothing_for_them",
            Needs::Redis,
            the_take_all_script_refuses_bad_requests_and_writes_nothing_for_them,
        ),
        trial::trial(
            "the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments",
            Needs::Redis,
            the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments,
        ),
    ];
    trial::run(trials, ());
}
