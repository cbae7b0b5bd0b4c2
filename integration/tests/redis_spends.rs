//! Spends and amends through the Redis backend's lanes, against a real
//! redis-server that the harness starts: many requests share a script call,
//! and each stays exact, all or nothing, and isolated from a corrupt
//! neighbour; the deny cache answers a counter no spend can fit; a
//! connection killed mid-batch never counts a request twice.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::time::Duration;

use redis::aio::ConnectionManager;
use support::redis::RedisServer;
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Hit, MemoryBackend, Spend, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, Window};
use tower_pinned_window_redis::RedisBackend;
use trial::Needs;

fn counter(namespace: &str, limit: u64, secs: u64) -> Counter<'_> {
    Counter {
        namespace,
        quota: Quota::new(limit, Duration::from_secs(secs)).unwrap(),
        lowers: false,
    }
}

async fn manager(server: &RedisServer) -> ConnectionManager {
    server.client().get_connection_manager().await.unwrap()
}

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

/// Spends on their own tasks, so that many are in flight together: one per
/// (key, cost) of `spends`, each on counter `x` of limit `limit`. Gives
/// back each one's key, cost and answer, in order.
async fn spend_together(
    store: &RedisBackend<ConnectionManager>,
    limit: u64,
    spends: Vec<(String, u64)>,
) -> Vec<(String, u64, Result<Hit, BackendError>)> {
    let tasks: Vec<_> = spends
        .into_iter()
        .map(|(key, cost)| {
            let store = store.clone();
            tokio::spawn(async move {
                let hits = store
                    .spend_all(
                        &Key::new(key.clone()),
                        &[counter("x", limit, 60)],
                        Spend::cost(cost),
                    )
                    .await;
                (key, cost, hits.map(|hits| hits[0]))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Spends queued while the server is frozen go in a few calls, not one
/// each; every key's admitted costs add up to its stored count and stay
/// within its limit; amends queued the same way share calls too.
async fn spends_in_flight_together_share_calls_and_stay_exact() {
    let server = redis_or_skip!(RedisServer::start(
        "spends_in_flight_together_share_calls_and_stay_exact"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    // Both scripts loaded first (a first call is answered NOSCRIPT and
    // sent again with EVAL).
    let warm = spend_together(&store, 100, vec![("warm".into(), 1)]).await;
    let hit = warm[0].2.as_ref().unwrap();
    assert!(
        store
            .amend("x", &Key::new("warm"), hit, Amend::Refund(1))
            .await
            .unwrap()
    );

    let before = server.script_calls();
    server.signal("STOP");
    let spends: Vec<(String, u64)> = (0..1_000u64)
        .map(|i| {
            let key = if i % 2 == 0 {
                "hot".to_string()
            } else {
                format!("k{}", i % 20)
            };
            (key, 1 + i % 3)
        })
        .collect();
    let (_, answers) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.signal("CONT");
        },
        spend_together(&store, 120, spends)
    );
    // The two calls held by the frozen server, then the queue in at most
    // two more (at most 512 requests a call).
    let calls = server.script_calls() - before;
    assert!(
        (2..=4).contains(&calls),
        "{calls} script calls for 1,000 spends"
    );

    let mut con = server.sync();
    let mut admitted: std::collections::BTreeMap<String, u64> = Default::default();
    let mut denied = 0;
    for (key, cost, hit) in &answers {
        let hit = hit.as_ref().unwrap();
        if hit.deadline.is_some() {
            *admitted.entry(key.clone()).or_default() += cost;
        } else {
            assert!(
                hit.count > 120,
                "{key}: a denial reports a count past the limit"
            );
            denied += 1;
        }
    }
    assert!(
        denied > 0,
        "the hot key (about 1,000 spent on 120) was denied"
    );
    for (key, spent) in &admitted {
        let stored: u64 = get(&mut con, &format!("tpw:x{{{key}}}"))
            .unwrap()
            .parse()
            .unwrap();
        assert!(*spent <= 120, "{key}: admitted {spent} > 120");
        assert_eq!(*spent, stored, "{key}: admitted {spent}, stored {stored}");
    }
    assert!(
        admitted["hot"] >= 118,
        "the hot key filled up: {}",
        admitted["hot"]
    );

    // Refunds of every admitted spend, queued while frozen: a few calls.
    let before = server.script_calls();
    server.signal("STOP");
    let refunds: Vec<_> = answers
        .iter()
        .filter_map(|(key, cost, hit)| {
            let hit = *hit.as_ref().unwrap();
            hit.deadline.is_some().then(|| {
                let (store, key, cost) = (store.clone(), Key::new(key.clone()), *cost);
                tokio::spawn(async move { store.amend("x", &key, &hit, Amend::Refund(cost)).await })
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("CONT");
    for refund in refunds {
        assert!(
            refund.await.unwrap().unwrap(),
            "each refund took its cost back"
        );
    }
    let calls = server.script_calls() - before;
    assert!(
        (2..=4).contains(&calls),
        "{calls} script calls for the refunds"
    );
    for key in admitted.keys() {
        assert_eq!(
            get(&mut con, &format!("tpw:x{{{key}}}")).as_deref(),
            Some("0"),
            "{key}"
        );
    }
}

/// Spends in a row on one hot key, with the same cost, in one call: decided
/// together, exactly as one after the other (the first that fit admitted,
/// each at its own count; the rest denied at the count they leave).
async fn a_run_of_spends_on_one_hot_key_is_decided_in_order() {
    let server = redis_or_skip!(RedisServer::start(
        "a_run_of_spends_on_one_hot_key_is_decided_in_order"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let warm = spend_together(&store, 100, vec![("warm".into(), 1)]).await;
    assert!(warm[0].2.is_ok());
    let mut con = server.sync();
    for (round, (cost, admitted_before)) in [(2u64, 0u64), (1, 100)].into_iter().enumerate() {
        let (before, incrby) = (server.script_calls(), server.calls(&["incrby"]));
        server.signal("STOP");
        let spends = (0..300).map(|_| ("hot".to_string(), cost)).collect();
        let (_, answers) = tokio::join!(
            async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                server.signal("CONT");
            },
            spend_together(&store, 101, spends)
        );
        assert!(
            server.script_calls() - before <= 4,
            "round {round}: the run shares calls"
        );
        // A run is one INCRBY a call, not one a request.
        let incrby = server.calls(&["incrby"]) - incrby;
        assert!(incrby <= 6, "round {round}: {incrby} INCRBY for 300 spends");
        let mut counts: Vec<u64> = Vec::new();
        for (_, _, hit) in &answers {
            let hit = hit.as_ref().unwrap();
            if hit.deadline.is_some() {
                counts.push(hit.count);
            } else {
                assert!(
                    hit.count > 101,
                    "round {round}: a denial reports {}",
                    hit.count
                );
            }
        }
        counts.sort_unstable();
        // 2, 4, ..., 100 in the first round (102 > 101); 101 in the second.
        let want: Vec<u64> = (1..)
            .map(|j| admitted_before + j * cost)
            .take_while(|&c| c <= 101)
            .collect();
        assert_eq!(counts, want, "round {round}: each count once, in order");
        let stored: u64 = get(&mut con, "tpw:x{hot}").unwrap().parse().unwrap();
        assert_eq!(
            stored,
            want.last().copied().unwrap_or(admitted_before),
            "round {round}"
        );
    }
}

/// A corrupt counter in a call answers only the requests on it, and is
/// left as it is; the other requests of the same call are decided and
/// counted. The same for amends.
async fn a_corrupt_counter_fails_only_its_own_requests_in_a_batch() {
    let server = redis_or_skip!(RedisServer::start(
        "a_corrupt_counter_fails_only_its_own_requests_in_a_batch"
    ));
    let mut con = server.sync();
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let _: () = redis::cmd("SET")
        .arg("tpw:x{bad}")
        .arg("abc")
        .query(&mut con)
        .unwrap();
    let warm = spend_together(&store, 100, vec![("warm".into(), 1)]).await;
    assert!(warm[0].2.is_ok());

    server.signal("STOP");
    let spends: Vec<(String, u64)> = (0..300)
        .map(|i| {
            (
                if i % 3 == 0 {
                    "bad".into()
                } else {
                    format!("good{}", i % 5)
                },
                1,
            )
        })
        .collect();
    let (_, answers) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            server.signal("CONT");
        },
        spend_together(&store, 1_000, spends)
    );
    let mut good: std::collections::BTreeMap<String, u64> = Default::default();
    for (key, _, hit) in &answers {
        match (key.as_str(), hit) {
            ("bad", Err(BackendError::Corrupt { key, detail })) => {
                assert_eq!(key, "tpw:x{bad}");
                assert!(detail.contains("abc"), "{detail}");
            }
            ("hash", Err(BackendError::Corrupt { key, detail })) => {
                assert_eq!(key, "tpw:x{hash}");
                assert_eq!(detail, "a key of type hash");
            }
            ("bad" | "hash", other) => panic!("the corrupt counter answered {other:?}"),
            (_, Ok(hit)) => {
                assert!(hit.deadline.is_some());
                *good.entry(key.clone()).or_default() += 1;
            }
            (key, Err(err)) => panic!("{key}, beside a corrupt counter: {err}"),
        }
    }
    assert_eq!(
        get(&mut con, "tpw:x{bad}").as_deref(),
        Some("abc"),
        "left as it was"
    );
    assert_eq!(good.len(), 5);
    for (key, n) in &good {
        assert_eq!(
            get(&mut con, &format!("tpw:x{{{key}}}")),
            Some(n.to_string()),
            "{key}"
        );
    }

    // Amends: a counter made corrupt after its hit (its lifetime kept) in
    // a call with healthy refunds.
    let mut hits = Vec::new();
    for key in ["a", "b", "c"] {
        let answer = spend_together(&store, 100, vec![(key.into(), 5)]).await;
        hits.push((key, answer[0].2.as_ref().copied().unwrap()));
    }
    let _: () = redis::cmd("SET")
        .arg("tpw:x{b}")
        .arg("oops")
        .arg("KEEPTTL")
        .query(&mut con)
        .unwrap();
    server.signal("STOP");
    let refunds: Vec<_> = hits
        .iter()
        .map(|&(key, hit)| {
            let store = store.clone();
            tokio::spawn(async move {
                (
                    key,
                    store
                        .amend("x", &Key::new(key), &hit, Amend::Refund(2))
                        .await,
                )
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.signal("CONT");
    for refund in refunds {
        match refund.await.unwrap() {
            ("b", Err(BackendError::Corrupt { detail, .. })) => assert!(detail.contains("oops")),
            ("b", other) => panic!("the corrupt counter's refund answered {other:?}"),
            (key, answer) => assert!(answer.unwrap(), "{key} refunded"),
        }
    }
    assert_eq!(get(&mut con, "tpw:x{a}").as_deref(), Some("3"));
    assert_eq!(get(&mut con, "tpw:x{b}").as_deref(), Some("oops"));
    assert_eq!(get(&mut con, "tpw:x{c}").as_deref(), Some("3"));
}

/// A counter no spend can fit (at its limit, or locked out) is answered by
/// this instance until the deadline Redis gave, with no call; a spend
/// denied only for its size is not remembered; an amend makes the instance
/// ask Redis again.
async fn the_deny_cache_answers_spends_on_a_full_counter() {
    let server = redis_or_skip!(RedisServer::start(
        "the_deny_cache_answers_spends_on_a_full_counter"
    ));
    let store = RedisBackend::new(manager(&server).await);
    let key = Key::new("ip");
    let three = [counter("c", 3, 60)];
    let first = store.spend_all(&key, &three, Spend::cost(1)).await.unwrap();
    // Cost 5 does not fit 1 of 3, but a cost of 1 still does: not cached.
    let big = store.spend_all(&key, &three, Spend::cost(5)).await.unwrap();
    assert_eq!(big[0].deadline, None);
    let before = server.script_calls();
    let fits = store.spend_all(&key, &three, Spend::cost(1)).await.unwrap();
    assert!(fits[0].deadline.is_some(), "a spend that fits is admitted");
    assert_eq!(server.script_calls() - before, 1, "asked Redis");
    // 2 of 3, then 3 of 3; then a check (cost 0) is denied: full.
    store.spend_all(&key, &three, Spend::cost(1)).await.unwrap();
    let full = store.spend_all(&key, &three, Spend::cost(0)).await.unwrap();
    assert_eq!(full[0].deadline, None);
    let before = server.script_calls();
    for cost in [0, 1, 2] {
        let cached = store
            .spend_all(&key, &three, Spend::cost(cost))
            .await
            .unwrap();
        assert_eq!(cached[0].deadline, None);
        assert!(cached[0].count > 3);
        assert!(
            cached[0].reset > Duration::from_secs(55) && cached[0].reset <= Duration::from_secs(60)
        );
    }
    assert_eq!(
        server.script_calls() - before,
        0,
        "answered by the deny cache"
    );
    // A spend that would lock the counter out goes to Redis, which locks
    // it (a counter at its limit is no lockout yet); then it is remembered
    // as locked, and answered here.
    let mut con = server.sync();
    let block = Spend::cost(1).block(Window::new(Duration::from_secs(30)).unwrap());
    let before = server.script_calls();
    let locks = store.spend_all(&key, &three, block).await.unwrap();
    assert_eq!(server.script_calls() - before, 1, "asked Redis");
    assert!(locks[0].reset <= Duration::from_secs(30) && locks[0].reset > Duration::from_secs(29));
    let left: i64 = redis::cmd("PTTL")
        .arg("tpw:c{ip}:lock")
        .query(&mut con)
        .unwrap();
    assert!(
        (29_000..=30_000).contains(&left),
        "locked out in Redis: {left} ms"
    );
    let before = server.script_calls();
    store.spend_all(&key, &three, block).await.unwrap();
    assert_eq!(
        server.script_calls() - before,
        0,
        "the lockout, answered here"
    );
    let _: () = redis::cmd("DEL")
        .arg("tpw:c{ip}:lock")
        .query(&mut con)
        .unwrap();
    // A refund of the first spend: the instance asks again, and it fits.
    assert!(
        store
            .amend("c", &key, &first[0], Amend::Refund(1))
            .await
            .unwrap()
    );
    let before = server.script_calls();
    let again = store.spend_all(&key, &three, Spend::cost(1)).await.unwrap();
    assert!(again[0].deadline.is_some());
    assert_eq!(server.script_calls() - before, 1);

    // A lockout: remembered until the lockout's end, which no later
    // attempt moves.
    let login = Key::new("user");
    let one = [counter("login", 1, 600)];
    let lock = Spend::cost(1).block(Window::new(Duration::from_secs(5)).unwrap());
    store.spend_all(&login, &one, lock).await.unwrap();
    let locked = store.spend_all(&login, &one, lock).await.unwrap();
    assert!(locked[0].reset <= Duration::from_secs(5) && locked[0].reset > Duration::from_secs(4));
    let before = server.script_calls();
    let cached = store.spend_all(&login, &one, lock).await.unwrap();
    assert!(
        cached[0].reset <= locked[0].reset,
        "the lockout's end, not moved"
    );
    assert_eq!(server.script_calls() - before, 0);
    let left: i64 = redis::cmd("PTTL")
        .arg("tpw:login{user}:lock")
        .query(&mut con)
        .unwrap();
    assert!(
        (4_000..=5_000).contains(&left),
        "the lockout lives in Redis: {left} ms"
    );
}

/// Costs whose sum tells which requests were counted: request `i` of a key
/// costs 4^i, so the stored count, in base 4, has a digit of 1 for each
/// request counted once, 0 for one not counted, and a 2 or 3 (or carries)
/// for one counted twice.
fn cost(i: u32) -> u64 {
    4u64.pow(i)
}

/// Connections killed while calls are in flight, on purpose at their worst
/// moments: while the server is paused (calls sent and never run) and at
/// random during traffic (calls that ran and whose answer is lost). A
/// request is counted once or not at all, never twice, and every admitted
/// one is counted.
async fn a_connection_killed_mid_batch_never_counts_a_spend_twice() {
    let server = redis_or_skip!(RedisServer::start(
        "a_connection_killed_mid_batch_never_counts_a_spend_twice"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .no_breaker()
        .build();
    let warm = spend_together(&store, 1, vec![("warm".into(), 1)]).await;
    assert!(warm[0].2.is_ok());
    let limit = u64::MAX / 2;
    let (keys, per_key) = (8, 25);
    let mut failed = 0;
    for round in 0..6 {
        let spends: Vec<(String, u64)> = (0..per_key)
            .flat_map(|i| (0..keys).map(move |k| (format!("r{round}k{k}"), cost(i))))
            .collect();
        let killer = async {
            if round % 2 == 0 {
                // Paused: the calls wait unrun; the kill drops them.
                tokio::time::sleep(Duration::from_millis(5)).await;
                server.cmd(&["CLIENT", "PAUSE", "200", "WRITE"]).unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            } else {
                tokio::time::sleep(Duration::from_millis(round as u64)).await;
            }
            server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
        };
        let (_, answers) = tokio::join!(killer, spend_together(&store, limit, spends));
        server.cmd(&["CLIENT", "UNPAUSE"]).unwrap();
        let mut con = server.sync();
        for k in 0..keys {
            let key = format!("r{round}k{k}");
            let stored: u64 =
                get(&mut con, &format!("tpw:x{{{key}}}")).map_or(0, |v| v.parse().unwrap());
            for (i, (_, cost, hit)) in answers.iter().filter(|(at, _, _)| *at == key).enumerate() {
                let digit = (stored / cost) % 4;
                assert!(
                    digit <= 1,
                    "{key}: request {i} counted {digit} times (stored {stored:#x})"
                );
                match hit {
                    Ok(hit) => {
                        assert!(hit.deadline.is_some(), "{key}: admitted");
                        assert_eq!(digit, 1, "{key}: admitted request {i} not counted");
                    }
                    Err(_) => failed += 1,
                }
            }
            assert!(
                stored < cost(per_key),
                "{key}: stored {stored:#x} past every request's cost"
            );
        }
    }
    // The kills landed on calls in flight: some requests saw them.
    assert!(failed > 0, "no request was cut by a kill");
}

/// The stored count of `key` on counter `x`, once it reads `want` (the
/// give-back is a task of its own), or as it is after 5 s.
fn count_once(server: &RedisServer, key: &str, want: u64) -> u64 {
    count_once_on(server, "x", key, want)
}

/// [`count_once`] on the counter `namespace`.
fn count_once_on(server: &RedisServer, namespace: &str, key: &str, want: u64) -> u64 {
    let mut con = server.sync();
    let read = |con: &mut redis::Connection| {
        get(con, &format!("tpw:{namespace}{{{key}}}")).map_or(0, |v| v.parse::<u64>().unwrap())
    };
    for _ in 0..100 {
        if read(&mut con) == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    read(&mut con)
}

/// The markers spend calls left: an answered call's lives until it
/// expires, a lost one's is taken by its give-back.
fn markers(server: &RedisServer) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*:lost:*")
        .query(&mut server.sync())
        .unwrap()
}

/// The case: a cost-3 spend whose reply a proxy drops (the script
/// ran, the connection closed before its answer) fails, and what it spent
/// is given back: the stored count is the one before it, 1, not 4.
async fn a_spend_whose_reply_is_lost_keeps_no_cost() {
    let server = redis_or_skip!(RedisServer::start(
        "a_spend_whose_reply_is_lost_keeps_no_cost"
    ));
    let proxy = support::drop_reply::DropReply::start(server.port()).await;
    let through = redis::Client::open(format!("redis://127.0.0.1:{}/", proxy.port())).unwrap();
    let store = RedisBackend::builder(through.get_connection_manager().await.unwrap())
        .deny_cache(0)
        .build();
    let key = Key::new("lost");
    let spend = |cost| store.spend_all(&key, &[counter("x", 10, 60)], Spend::cost(cost));
    assert_eq!(spend(1).await.unwrap()[0].count, 1);

    proxy.drop_next_reply();
    let lost = spend(3).await;
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(proxy.dropped(), 1);
    assert_eq!(
        count_once(&server, "lost", 1),
        1,
        "the refused spend's 3 stay counted"
    );
    assert_eq!(markers(&server).len(), 1, "the first spend's only");
    // The connection is back, and the budget is whole.
    assert_eq!(spend(9).await.unwrap()[0].count, 10);
}

/// A spend whose future is dropped (the layer's timeout) while Redis is
/// frozen runs when Redis wakes: what it spent is given back too.
async fn a_spend_dropped_in_flight_keeps_no_cost() {
    let server = redis_or_skip!(RedisServer::start(
        "a_spend_dropped_in_flight_keeps_no_cost"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let key = Key::new("lost");
    let spend = |cost| store.spend_all(&key, &[counter("x", 10, 60)], Spend::cost(cost));
    assert_eq!(spend(1).await.unwrap()[0].count, 1);

    server.signal("STOP");
    let timed_out = tokio::time::timeout(Duration::from_millis(100), spend(3)).await;
    assert!(timed_out.is_err(), "answered by a frozen server");
    server.signal("CONT");
    assert_eq!(
        count_once(&server, "lost", 1),
        1,
        "the dropped spend's 3 stay counted"
    );
    assert_eq!(markers(&server).len(), 1, "the first spend's only");
}

/// A spend with a first unit, dropped in flight as above: each counter is
/// given back what it spent, the unit on the first and the cost on the
/// other.
async fn a_first_unit_dropped_in_flight_is_given_back_on_each_counter() {
    let server = redis_or_skip!(RedisServer::start(
        "a_first_unit_dropped_in_flight_is_given_back_on_each_counter"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let key = Key::new("lost");
    let both = [counter("x", 10, 60), counter("y", 100, 60)];
    let spend = |unit, cost| store.spend_all(&key, &both, Spend::cost(cost).first(unit));
    let kept = spend(1, 3).await.unwrap();
    assert_eq!((kept[0].count, kept[1].count), (1, 3));

    server.signal("STOP");
    let timed_out = tokio::time::timeout(Duration::from_millis(100), spend(2, 5)).await;
    assert!(timed_out.is_err(), "answered by a frozen server");
    server.signal("CONT");
    assert_eq!(
        count_once_on(&server, "y", "lost", 3),
        3,
        "the dropped spend's 5 tokens stay counted"
    );
    assert_eq!(
        count_once_on(&server, "x", "lost", 1),
        1,
        "the requests counter is given back its unit, 2, not the cost"
    );
}

/// A spend whose waiter gives up (the layer's timeout) while its call is in
/// flight with another request's, whose waiter stays, is answered to no
/// one: what it spent is given back.
async fn a_spend_answered_to_a_waiter_gone_keeps_no_cost() {
    let server = redis_or_skip!(RedisServer::start(
        "a_spend_answered_to_a_waiter_gone_keeps_no_cost"
    ));
    let proxy = support::drop_reply::DropReply::start(server.port()).await;
    let through = redis::Client::open(format!("redis://127.0.0.1:{}/", proxy.port())).unwrap();
    let store = RedisBackend::builder(through.get_connection_manager().await.unwrap())
        .deny_cache(0)
        .build();
    let spend = |key: &str, cost| {
        let store = store.clone();
        let key = Key::new(key);
        async move {
            store
                .spend_all(&key, &[counter("x", 10, 60)], Spend::cost(cost))
                .await
        }
    };
    assert_eq!(spend("held", 1).await.unwrap()[0].count, 1);

    // Two calls in flight on a frozen server (a lane's most), then the
    // timed-out spend and another queued behind them: one call for both.
    server.signal("STOP");
    let first = tokio::spawn(spend("w1", 1));
    let second = tokio::spawn(spend("w2", 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.hold_reply_to(b"{held}");
    let gone = tokio::spawn(tokio::time::timeout(
        Duration::from_millis(600),
        spend("held", 3),
    ));
    let stays = tokio::spawn(spend("stays", 1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.signal("CONT");
    assert!(first.await.unwrap().is_ok());
    assert!(second.await.unwrap().is_ok());
    // Their call is in Redis; its answer is held back until the waiter
    // of `held` is gone.
    assert!(gone.await.unwrap().is_err(), "answered while held back");
    proxy.release();
    assert_eq!(stays.await.unwrap().unwrap()[0].count, 1);
    assert_eq!(
        count_once(&server, "held", 1),
        1,
        "the refused spend's 3 stay counted"
    );
}

/// Spends answered as usual leave their markers to expire on their own,
/// each with a lifetime of at most 5 s, and give nothing back.
async fn answered_spends_leave_markers_with_a_lifetime_only() {
    let server = redis_or_skip!(RedisServer::start(
        "answered_spends_leave_markers_with_a_lifetime_only"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let key = Key::new("kept");
    for cost in [1, 3, 20] {
        let _ = store
            .spend_all(&key, &[counter("x", 10, 60)], Spend::cost(cost))
            .await
            .unwrap();
    }
    let markers = markers(&server);
    assert!(!markers.is_empty());
    for marker in markers {
        assert!(marker.starts_with("tpw:x{kept}:lost:"), "{marker}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&marker)
            .query(&mut server.sync())
            .unwrap();
        assert!((1..=5_000).contains(&ttl), "{marker}: {ttl} ms");
    }
    assert_eq!(count_once(&server, "kept", 4), 4);
}

/// One request of [`a_batch_mixing_first_units_answers_each_as_if_alone`]:
/// both counters (requests, then tokens), or the requests counter alone,
/// and what it spends.
fn mixed(i: u64) -> (bool, Spend) {
    let tokens = 1 + (i * 7) % 40;
    match i % 50 {
        // A run of the same plain spend on the requests counter alone
        // (the script decides such a run at once)...
        0..8 => (false, Spend::cost(1)),
        // ...and one of the same spend with a first unit, which must not be
        // taken for one.
        8..14 => (false, Spend::cost(1).first(2)),
        _ => match i % 4 {
            0 => (true, Spend::cost(tokens).first(1)),
            1 => (true, Spend::cost(1 + i % 3)),
            2 => (true, Spend::cost(tokens).first(0)),
            _ => (false, Spend::cost(1)),
        },
    }
}

/// Spends with and without a first unit, on the same two counters (and on
/// the first alone), queued behind the lane's two calls in flight on a
/// frozen server, go in one call: each is answered as if it had been
/// alone, in order. The
/// in-memory backend, given the same spends one after another, is the
/// reference: the same requests admitted, each counter counted (or
/// denied) at the same count, the same totals stored.
async fn a_batch_mixing_first_units_answers_each_as_if_alone() {
    let server = redis_or_skip!(RedisServer::start(
        "a_batch_mixing_first_units_answers_each_as_if_alone"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let reference = MemoryBackend::new();
    let both = [counter("requests", 150, 60), counter("tokens", 2000, 60)];
    let key = Key::new("mixed");
    // The script loaded first (a first call is answered NOSCRIPT and sent
    // again with EVAL), the same spend on the reference.
    let warm = Spend::cost(3).first(1);
    let got = store.spend_all(&key, &both, warm).await.unwrap();
    let want = reference.spend_all(&key, &both, warm).await.unwrap();
    assert_eq!(got.iter().map(|h| h.count).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(want.iter().map(|h| h.count).collect::<Vec<_>>(), [1, 3]);

    let spends: Vec<(bool, Spend)> = (0..400).map(mixed).collect();
    let before = server.script_calls();
    // Two calls in flight on a frozen server (a lane's most), on other
    // keys: the spends after them queue, and go together once it wakes.
    server.signal("STOP");
    let held: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|other| {
            let store = store.clone();
            tokio::spawn(async move {
                let counters = [counter("other", 10, 60)];
                store
                    .spend_all(&Key::new(other), &counters, Spend::cost(1))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Each joins the key's lane when it is called: in this order.
    let calls: Vec<_> = spends
        .iter()
        .map(|&(two, spend)| {
            let counters = if two { &both[..] } else { &both[..1] };
            store.spend_all(&key, counters, spend)
        })
        .collect();
    let (_, answers) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            server.signal("CONT");
        },
        futures_util::future::join_all(calls)
    );
    for call in held {
        assert_eq!(call.await.unwrap().unwrap()[0].count, 1);
    }
    let calls = server.script_calls() - before;
    assert_eq!(calls, 3, "the two held, then one call for the 400 spends");

    let (mut admitted, mut denied, mut firsts) = (0, 0, 0);
    for (i, ((two, spend), answer)) in spends.iter().zip(answers).enumerate() {
        let counters = if *two { &both[..] } else { &both[..1] };
        let got = answer.unwrap_or_else(|e| panic!("spend {i}: {e}"));
        let want = reference.spend_all(&key, counters, *spend).await.unwrap();
        assert_eq!(got.len(), counters.len(), "spend {i}");
        let counted = want.iter().any(|h| h.count > 0 && h.deadline.is_some());
        let refused = want
            .iter()
            .zip(counters)
            .any(|(h, c)| h.count > c.quota.limit());
        for (at, ((got, want), c)) in got.iter().zip(&want).zip(counters).enumerate() {
            let what = format!("spend {i} ({spend:?}), counter {at}");
            assert_eq!(
                got.deadline.is_some(),
                want.deadline.is_some(),
                "{what}: counted? {got:?} / {want:?}"
            );
            if refused && want.count <= c.quota.limit() {
                // It fits, another counter does not: nothing was counted;
                // its count is not the contract's to say.
                assert!(got.count <= c.quota.limit(), "{what}: {got:?}");
            } else {
                assert_eq!(got.count, want.count, "{what}: {got:?} / {want:?}");
            }
        }
        if refused {
            denied += 1;
        } else if counted {
            admitted += 1;
            firsts += usize::from(spend.first.is_some());
        }
    }
    assert!(
        admitted > 100 && denied > 100 && firsts > 50,
        "both outcomes, with first units among the admitted: {admitted} admitted ({firsts} with a first unit), {denied} denied"
    );
    let mut con = server.sync();
    for name in ["requests", "tokens"] {
        let stored: u64 = get(&mut con, &format!("tpw:{name}{{mixed}}"))
            .unwrap()
            .parse()
            .unwrap();
        let want = reference.peek(name, &key).await.unwrap().unwrap().count;
        assert_eq!(stored, want, "{name}: the stored total");
    }
}

/// The spend script on its own (`EVAL` of its text): a first unit after
/// the counters (`first 1`) is read as the first counter's amount, and
/// forgotten by the next argument without one; a tail that is not the word
/// `first` and a whole number in digits refuses only its own request
/// (-2, invalid), with nothing written for it, and the call's other
/// requests are decided.
fn the_spend_script_reads_a_first_unit_and_refuses_a_bad_one() {
    let server = redis_or_skip!(RedisServer::start(
        "the_spend_script_reads_a_first_unit_and_refuses_a_bad_one"
    ));
    let mut con = server.sync();
    let head = "2 7 0 0 5 60000 100 60000";
    // (argument, the request's code, its counts when decided)
    let requests: Vec<(String, i64, [i64; 2])> = vec![
        (format!("{head} first 1"), 1, [1, 7]),
        (format!("{head} first x"), -2, [0, 0]),
        (format!("{head} second 1"), -2, [0, 0]),
        (format!("{head} first -1"), -2, [0, 0]),
        (format!("{head} first 1.0"), -2, [0, 0]),
        (format!("{head} first 01"), -2, [0, 0]),
        ("2 07 0 0 5 60000 100 60000".to_owned(), -2, [0, 0]),
        // Without the tail, both counters are spent the cost: the requests
        // counter does not fit 7 more (1 and 7), the tokens would (7).
        (head.to_owned(), 0, [1 + 7, 7]),
        (format!("{head} first 4"), 1, [5, 14]),
        (format!("{head} first 0"), 0, [5 + 1, 14]),
    ];
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(include_str!("../../redis/src/spend.lua"))
        .arg(4 * requests.len());
    for _ in &requests {
        cmd.arg("tpw:requests{a}")
            .arg("tpw:requests{a}:lock")
            .arg("tpw:tokens{a}")
            .arg("tpw:tokens{a}:lock");
    }
    for (argument, ..) in &requests {
        cmd.arg(argument.as_str());
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
    for (argument, want, counts) in &requests {
        let code = nums.next().unwrap();
        assert_eq!(code, *want, "{argument:?}");
        if code == -2 {
            match reasons.next() {
                Some(redis::Value::BulkString(reason)) => assert!(
                    reason.ends_with(b"invalid spend"),
                    "{argument:?}: {}",
                    String::from_utf8_lossy(reason)
                ),
                other => panic!("{argument:?}: reason {other:?}"),
            }
            continue;
        }
        for (at, want) in counts.iter().enumerate() {
            let [count, _, deadline, _] = std::array::from_fn(|_| nums.next().unwrap());
            assert_eq!(count, *want, "{argument:?}, counter {at}");
            assert_eq!(deadline > 0, code == 1, "{argument:?}, counter {at}");
        }
    }
    assert!(
        nums.next().is_none() && reasons.next().is_none(),
        "{reply:?}"
    );
    assert_eq!(get(&mut con, "tpw:requests{a}").as_deref(), Some("5"));
    assert_eq!(get(&mut con, "tpw:tokens{a}").as_deref(), Some("14"));
}

fn main() {
    let trials = vec![
        trial::multi(
            "spends_in_flight_together_share_calls_and_stay_exact",
            Needs::Redis,
            spends_in_flight_together_share_calls_and_stay_exact,
        ),
        trial::multi(
            "a_run_of_spends_on_one_hot_key_is_decided_in_order",
            Needs::Redis,
            a_run_of_spends_on_one_hot_key_is_decided_in_order,
        ),
        trial::multi(
            "a_corrupt_counter_fails_only_its_own_requests_in_a_batch",
            Needs::Redis,
            a_corrupt_counter_fails_only_its_own_requests_in_a_batch,
        ),
        trial::current(
            "the_deny_cache_answers_spends_on_a_full_counter",
            Needs::Redis,
            the_deny_cache_answers_spends_on_a_full_counter,
        ),
        trial::multi(
            "a_connection_killed_mid_batch_never_counts_a_spend_twice",
            Needs::Redis,
            a_connection_killed_mid_batch_never_counts_a_spend_twice,
        ),
        trial::multi(
            "a_spend_whose_reply_is_lost_keeps_no_cost",
            Needs::Redis,
            a_spend_whose_reply_is_lost_keeps_no_cost,
        ),
        trial::multi(
            "a_spend_dropped_in_flight_keeps_no_cost",
            Needs::Redis,
            a_spend_dropped_in_flight_keeps_no_cost,
        ),
        trial::multi(
            "a_first_unit_dropped_in_flight_is_given_back_on_each_counter",
            Needs::Redis,
            a_first_unit_dropped_in_flight_is_given_back_on_each_counter,
        ),
        trial::multi(
            "a_spend_answered_to_a_waiter_gone_keeps_no_cost",
            Needs::Redis,
            a_spend_answered_to_a_waiter_gone_keeps_no_cost,
        ),
        trial::multi(
            "answered_spends_leave_markers_with_a_lifetime_only",
            Needs::Redis,
            answered_spends_leave_markers_with_a_lifetime_only,
        ),
        trial::multi(
            "a_batch_mixing_first_units_answers_each_as_if_alone",
            Needs::Redis,
            a_batch_mixing_first_units_answers_each_as_if_alone,
        ),
        trial::trial(
            "the_spend_script_reads_a_first_unit_and_refuses_a_bad_one",
            Needs::Redis,
            the_spend_script_reads_a_first_unit_and_refuses_a_bad_one,
        ),
    ];
    trial::run(trials, ());
}
