//! Takes and give-backs of slots in flight through the Redis backend's
//! lanes, against a real redis-server that the harness starts: many steps
//! share a script call and each stays exact (never past a key's cap), a
//! corrupt record fails only its own steps, a give-back nobody waits for
//! is sent, and a connection killed mid-batch counts a take once or not at
//! all. The slots' batch script itself: each step as if sent alone, bad
//! arguments refused with nothing written for them.

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
use tower_pinned_window::InFlight;
use tower_pinned_window::backend::{BackendError, Cap, Leasing, SlotId, Taken};
use tower_pinned_window::key::Key;
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

/// The test: connections killed while calls of takes are in
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
        trial::trial(
            "the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments",
            Needs::Redis,
            the_slots_batch_script_makes_each_step_as_alone_and_refuses_bad_arguments,
        ),
    ];
    trial::run(trials, ());
}
