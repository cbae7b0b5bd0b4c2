//! The Redis backend against a real redis-server that the harness starts:
//! the backend contract (`contract::*`, `contract_deny_cache::*`: the
//! scenarios of `tower_pinned_window_testkit`), then what only Redis does:
//! scripts, coalescing, the deny cache, the breaker, outages.

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, StatusCode};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use stores::redis::{RedisStore, slots_key};
use support::http::{by_client, from, multi_thread_runtime, ok_service};
use support::redis::{RedisServer, Shared, cases};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Cap, Held, Hit, Leasing, LimitScope, Limits, SlotId, Spend,
    Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{
    ConfigError, Decision, DecisionIn, FailurePolicy, InFlight, Quota, RateLimitLayer, Share,
    Window,
};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::ConnectError;
use trial::Needs;

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).unwrap()
}

async fn manager(server: &RedisServer) -> ConnectionManager {
    server.client().get_connection_manager().await.unwrap()
}

async fn backend(server: &RedisServer) -> RedisBackend<ConnectionManager> {
    RedisBackend::new(manager(server).await)
}

/// `SET key value` on a test's own server (no lifetime).
fn set(con: &mut redis::Connection, key: impl redis::ToRedisArgs, value: impl redis::ToRedisArgs) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query(con).unwrap();
}

/// `SET key value PX ms` on a test's own server.
fn set_px(con: &mut redis::Connection, key: &str, value: impl redis::ToRedisArgs, ms: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ms)
        .query(con)
        .unwrap();
}

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

async fn the_window_is_pinned_and_denials_carry_retry_after() {
    let server = redis_or_skip!(RedisServer::start(
        "the_window_is_pinned_and_denials_carry_retry_after"
    ));
    let mut con = server.sync();
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let svc = RateLimitLayer::new("login", quota(3, Duration::from_secs(60)))
        .key(by_client())
        .backend(store)
        .layer(ok_service());

    let res = svc.clone().oneshot(from("alice")).await.unwrap();
    assert_eq!(res.headers()["ratelimit"], "\"login\";r=2;t=60");
    let first = pttl(&mut con, "tpw:login{alice}");
    assert!(
        (59_000..=60_000).contains(&first),
        "PTTL after the first hit: {first}"
    );

    tokio::time::sleep(Duration::from_millis(120)).await;
    svc.clone().oneshot(from("alice")).await.unwrap();
    let second = pttl(&mut con, "tpw:login{alice}");
    assert!(
        second <= first - 100,
        "the second hit did not refresh the lifetime: {first} then {second}"
    );

    svc.clone().oneshot(from("alice")).await.unwrap();
    let denied = svc.clone().oneshot(from("alice")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers()["retry-after"],
        "60",
        "59.8 s left rounds up to 60"
    );
    assert_eq!(denied.headers()["ratelimit"], "\"login\";r=0;t=60");
    assert_eq!(denied.extensions().get::<Decision>().unwrap().count(), 4);
    assert!(
        pttl(&mut con, "tpw:login{alice}") <= second,
        "denied hits do not refresh it either"
    );
    let count: i64 = redis::cmd("GET")
        .arg("tpw:login{alice}")
        .query(&mut con)
        .unwrap();
    assert_eq!(count, 4);
    assert_eq!(
        svc.clone().oneshot(from("bob")).await.unwrap().status(),
        StatusCode::OK
    );
}

async fn a_counter_without_a_lifetime_is_healed_not_reset() {
    let server = redis_or_skip!(RedisServer::start(
        "a_counter_without_a_lifetime_is_healed_not_reset"
    ));
    let mut con = server.sync();
    set(&mut con, "tpw:n{k}", 5);
    assert_eq!(pttl(&mut con, "tpw:n{k}"), -1);
    let store = backend(&server).await;
    let hit = store
        .hit("n", &Key::new("k"), quota(10, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(hit.count, 6, "counted on, not reset");
    let ttl = pttl(&mut con, "tpw:n{k}");
    assert!(
        (29_000..=30_000).contains(&ttl),
        "the window was attached: {ttl}"
    );
    assert_eq!(hit.reset, Duration::from_secs(30));
}

/// A layer's limits are one hash at `PREFIX LAYER:limits`, fields the
/// scopes, values the limits; a key of another type there fails the read
/// and the set as corrupt and is left as it is; the audit never reports or
/// touches a limits hash.
async fn limits_are_one_hash_per_layer_and_a_wrong_type_is_corrupt() {
    let server = redis_or_skip!(RedisServer::start(
        "limits_are_one_hash_per_layer_and_a_wrong_type_is_corrupt"
    ));
    let store = backend(&server).await;
    let minute = quota(100, Duration::from_secs(60));
    store
        .set_limit("api", LimitScope::Tier("pro"), Some(minute))
        .await
        .unwrap();
    store
        .set_limit("api", LimitScope::Key(&Key::new("k")), Some(minute))
        .await
        .unwrap();
    let mut con = server.sync();
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg("tpw:api:limits")
        .query(&mut con)
        .unwrap();
    let mut fields = fields;
    fields.sort();
    assert_eq!(
        fields,
        [
            ("key:k".to_string(), "100/60000ms".to_string()),
            ("tier:pro".to_string(), "100/60000ms".to_string()),
        ]
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("tpw:api:limits")
        .query(&mut con)
        .unwrap();
    assert_eq!(pttl, -1, "limits are configuration: no lifetime");
    let window = Window::new(Duration::from_secs(60)).unwrap();
    let report = store.audit(Some(window)).await.unwrap();
    assert!(
        report.without_lifetime.is_empty() && report.corrupt.is_empty(),
        "{report:?}"
    );
    assert_eq!(store.limits("api").await.unwrap().len(), 2, "left as it is");

    set(&mut con, "tpw:other:limits", "100/60000ms");
    let err = store.limits("other").await.unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("other:limits"), "{err}");
    assert!(err.to_string().contains("another type"), "{err}");
    let err = store
        .set_limit("other", LimitScope::Layer, Some(minute))
        .await
        .unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("another type"), "{err}");
    let value: String = redis::cmd("GET")
        .arg("tpw:other:limits")
        .query(&mut con)
        .unwrap();
    assert_eq!(value, "100/60000ms", "left as it is");
}

async fn corrupt_counters_stop_requests_and_are_left_untouched() {
    let server = redis_or_skip!(RedisServer::start(
        "corrupt_counters_stop_requests_and_are_left_untouched"
    ));
    let mut con = server.sync();
    set(&mut con, "tpw:api{text}", "abc");
    set(&mut con, "tpw:api{float}", "2.5");
    set(&mut con, "tpw:api{negative}", "-3");
    // An integer Redis cannot count past (INCRBY would overflow).
    set(&mut con, "tpw:api{full}", "9223372036854775807");
    let _: () = redis::cmd("HSET")
        .arg("tpw:api{hash}")
        .arg("f")
        .arg("v")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg("tpw:api{float}")
        .arg(90_000)
        .query(&mut con)
        .unwrap();

    // Both paths: coalesced hits (hit_batch.lua) and one EVALSHA per hit
    // (hit.lua).
    for coalesce in [true, false] {
        let store = RedisBackend::builder(manager(&server).await)
            .coalesce(coalesce)
            .build();
        let svc = RateLimitLayer::new("api", quota(5, Duration::from_secs(60)))
            .key(by_client())
            .backend(store.clone())
            .on_failure(FailurePolicy::FailOpen)
            .layer(ok_service());
        let cases = [
            ("text", "value abc"),
            ("float", "value 2.5"),
            ("negative", "negative value -3"),
            ("full", "value 9223372036854775807"),
            ("hash", "type hash"),
        ];
        for (client, detail) in cases {
            match store
                .hit("api", &Key::new(client), quota(5, Duration::from_secs(60)))
                .await
            {
                Err(BackendError::Corrupt { key, detail: got }) => {
                    assert_eq!(key, format!("tpw:api{{{client}}}"));
                    assert!(
                        got.contains(detail),
                        "{client} (coalesce {coalesce}): {got}"
                    );
                }
                other => panic!("{client} (coalesce {coalesce}): {other:?}"),
            }
            for _ in 0..3 {
                let res = svc.clone().oneshot(from(client)).await.unwrap();
                assert_eq!(
                    res.status(),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "{client} (coalesce {coalesce}): stopped even when failing open"
                );
            }
        }
    }
    let get = |con: &mut redis::Connection, key: &str| -> String {
        redis::cmd("GET").arg(key).query(con).unwrap()
    };
    assert_eq!(get(&mut con, "tpw:api{text}"), "abc");
    assert_eq!(get(&mut con, "tpw:api{float}"), "2.5");
    assert_eq!(get(&mut con, "tpw:api{negative}"), "-3");
    assert_eq!(get(&mut con, "tpw:api{full}"), "9223372036854775807");
    let hash: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg("tpw:api{hash}")
        .query(&mut con)
        .unwrap();
    assert_eq!(hash, vec![("f".to_string(), "v".to_string())]);
    assert_eq!(
        pttl(&mut con, "tpw:api{text}"),
        -1,
        "no lifetime was added to a corrupt key"
    );
    assert!(
        pttl(&mut con, "tpw:api{float}") > 80_000,
        "nor was its lifetime changed"
    );

    // peek reports the corruption too.
    let store = backend(&server).await;
    assert!(matches!(
        store.peek("api", &Key::new("text")).await,
        Err(BackendError::Corrupt { .. })
    ));
    let peeked = store.peek("api", &Key::new("hash")).await;
    assert!(
        matches!(peeked, Err(BackendError::Corrupt { .. })),
        "{peeked:?}"
    );
}

async fn script_flush_in_the_middle_of_traffic_fails_no_request() {
    let server = redis_or_skip!(RedisServer::start(
        "script_flush_in_the_middle_of_traffic_fails_no_request"
    ));
    let store = backend(&server).await;
    // Traffic runs until the flushes are over, so every flush lands in it.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = Key::display(format_args!("w{worker}-{}", i % 7));
                store
                    .hit("flush", &key, quota(u64::MAX, Duration::from_secs(60)))
                    .await
                    .unwrap_or_else(|e| panic!("hit failed: {e}"));
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut admin = manager(&server).await;
    'flushes: for flush in 0..20 {
        // Hits go on after each flush. A hit that failed has panicked its
        // worker: stop, and the joins below report it. The only time limit
        // is a generous one, so a loaded machine cannot fail this.
        let before = done.load(Ordering::Relaxed);
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while done.load(Ordering::Relaxed) == before {
            if tasks.iter().any(tokio::task::JoinHandle::is_finished) {
                break 'flushes;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no hit was answered for 30 s after flush {flush}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let calls = server.cmd(&["INFO", "commandstats"]).unwrap();
    assert!(
        calls.contains("cmdstat_eval:"),
        "EVAL reloaded the script after a flush:\n{calls}"
    );
}

async fn an_outage_follows_the_policy_and_limiting_resumes_by_itself() {
    let mut server = redis_or_skip!(RedisServer::start(
        "an_outage_follows_the_policy_and_limiting_resumes_by_itself"
    ));
    let store = backend(&server).await;
    let timeout = Duration::from_millis(300);
    let closed = RateLimitLayer::new("outage", quota(1_000, Duration::from_secs(60)))
        .backend(store.clone())
        .timeout(Window::new(timeout).unwrap())
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    let open = RateLimitLayer::new("outage", quota(1_000, Duration::from_secs(60)))
        .backend(store.clone())
        .timeout(Window::new(timeout).unwrap())
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    let get = || Request::new(String::new());
    assert_eq!(
        closed.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );

    server.stop();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let res = closed.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["retry-after"], "1");
        assert!(
            started.elapsed() < timeout * 3,
            "answered within the timeout: {:?}",
            started.elapsed()
        );
        let res = open.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "fail open lets it through");
        assert!(res.extensions().get::<Decision>().is_none(), "uncounted");
    }

    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let res = closed.clone().oneshot(get()).await.unwrap();
        if res.status() == StatusCode::OK {
            assert_eq!(
                res.extensions().get::<Decision>().unwrap().count(),
                1,
                "counting again, on the fresh server"
            );
            break;
        }
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            std::time::Instant::now() < deadline,
            "limiting did not resume after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Under `FailurePolicy::Insurance`, a Redis that is down leaves the
/// deciding to a limiter in the process's memory, at the instance's share of
/// the limit: no 503, denials with Retry-After. Once Redis answers again it
/// decides, from its own counters (a restarted Redis without persistence
/// starts them afresh).
async fn insurance_decides_while_redis_is_out_and_hands_back() {
    let mut server = redis_or_skip!(RedisServer::start(
        "insurance_decides_while_redis_is_out_and_hands_back"
    ));
    let store = backend(&server).await;
    let limiter = RateLimitLayer::new("insured", quota(10, Duration::from_secs(60)))
        .key(by_client())
        .backend(store.clone())
        .timeout(Window::new(Duration::from_millis(300)).unwrap())
        .decision_in(DecisionIn::Response)
        .on_failure(FailurePolicy::Insurance(Share::new(1, 2).unwrap()))
        .layer(ok_service());
    // (status, insured, count, limit, Retry-After)
    let send = |client: &str| {
        let limiter = limiter.clone();
        let request = from(client);
        async move {
            let res = limiter.oneshot(request).await.unwrap();
            let d = res.extensions().get::<Decision>().cloned();
            let retry = res
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            (
                res.status(),
                d.as_ref().map(Decision::insured),
                d.as_ref().map(Decision::count),
                d.as_ref().map(Decision::limit),
                retry,
            )
        }
    };
    for count in 1..=3 {
        assert_eq!(
            send("a").await,
            (StatusCode::OK, Some(false), Some(count), Some(10), None),
            "Redis decides while it is up"
        );
    }

    server.stop();
    for count in 1..=5 {
        assert_eq!(
            send("a").await,
            (StatusCode::OK, Some(true), Some(count), Some(5), None),
            "the insurance decides, on half the limit, from its own count"
        );
    }
    let (status, insured, count, limit, retry) = send("a").await;
    assert_eq!(
        (status, insured, count, limit),
        (StatusCode::TOO_MANY_REQUESTS, Some(true), Some(6), Some(5))
    );
    let retry = retry.expect("a denial says when to retry");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        send("b").await,
        (StatusCode::OK, Some(true), Some(1), Some(5), None),
        "each key has its own local counter"
    );

    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for probe in 0.. {
        // A fresh client each time, so that no local share runs out while
        // the breaker holds the backend back.
        let (status, insured, count, ..) = send(&format!("probe{probe}")).await;
        assert_eq!(status, StatusCode::OK, "never a 503 or a 429 here");
        if insured == Some(false) {
            assert_eq!(count, Some(1), "counted in the restarted Redis");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis did not take over after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send("a").await,
        (StatusCode::OK, Some(false), Some(1), Some(10), None),
        "Redis decides again: the local denial is not carried over, and the restarted Redis starts afresh"
    );
}

/// A hit puts itself in its lane when it is made, not when first polled: a
/// future dropped before it was ever polled sends nothing, and leaves the
/// lane free, or to a driver for the hits queued behind it.
async fn hits_dropped_before_they_are_polled_leave_their_lane_working() {
    let server = redis_or_skip!(RedisServer::start(
        "hits_dropped_before_they_are_polled_leave_their_lane_working"
    ));
    let store = backend(&server).await;
    let window = quota(100, Duration::from_secs(60));
    let within = |f| tokio::time::timeout(Duration::from_secs(10), f);
    // Alone in an idle lane, dropped unpolled: nothing sent, the lane free.
    drop(store.hit("n", &Key::new("a"), window));
    let hit = within(store.hit("n", &Key::new("a"), window))
        .await
        .expect("the lane is free again")
        .unwrap();
    assert_eq!(hit.count, 1, "the dropped hit was never sent");
    // Alone, with another hit queued behind it: dropping the first hands
    // the lane to a driver, which sends the second.
    let first = store.hit("n", &Key::new("b"), window);
    let second = store.hit("n", &Key::new("b"), window);
    drop(first);
    let hit = within(second)
        .await
        .expect("a driver took the lane over")
        .unwrap();
    assert_eq!(hit.count, 1);
    let mut con = server.sync();
    assert!(pttl(&mut con, "tpw:n{b}") > 0);
}

async fn killed_clients_and_dropped_requests_leave_no_key_without_a_lifetime() {
    let server = redis_or_skip!(RedisServer::start(
        "killed_clients_and_dropped_requests_leave_no_key_without_a_lifetime"
    ));
    let store = backend(&server).await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..300u32 {
                let key = Key::display(format_args!("w{worker}-{i}"));
                let hit = store.hit("crash", &key, quota(5, Duration::from_secs(600)));
                if i % 3 == 0 {
                    // Dropped mid-flight, like a request whose client went away.
                    let _ = tokio::time::timeout(Duration::from_micros(50), hit).await;
                } else {
                    let _ = hit.await;
                }
            }
        }));
    }
    for _ in 0..20 {
        let _ = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut con = server.sync();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tpw:crash{*")
        .query(&mut con)
        .unwrap();
    assert!(
        keys.len() > 100,
        "traffic reached Redis: {} keys",
        keys.len()
    );
    for key in &keys {
        assert!(pttl(&mut con, key) > 0, "{key} has no lifetime");
    }
    let report = backend(&server).await.audit(None).await.unwrap();
    assert_eq!(report.scanned as usize, keys.len());
    assert!(report.without_lifetime.is_empty());
    assert!(report.is_clean(), "{report:?}");
}

async fn the_audit_finds_and_repairs_keys_without_a_lifetime() {
    let server = redis_or_skip!(RedisServer::start(
        "the_audit_finds_and_repairs_keys_without_a_lifetime"
    ));
    let mut con = server.sync();
    for i in 0..25 {
        set(&mut con, format!("tpw:legacy:{i}"), 7);
    }
    set_px(&mut con, "tpw:fine:1", 1, 60_000);
    set(&mut con, "unrelated", 1);
    set(&mut con, "tpw:bad:1", "abc");

    let store = backend(&server).await;
    let report = store.audit(None).await.unwrap();
    assert_eq!(
        (
            report.nodes,
            report.scanned,
            report.without_lifetime.len(),
            report.repaired.len()
        ),
        (1, 27, 26, 0)
    );
    assert_eq!(
        report.corrupt,
        ["tpw:bad:1"],
        "a report without a repair window tells the corrupt key apart"
    );
    assert_eq!(report.expired, 0, "Redis deletes expired keys itself");
    assert_eq!(
        pttl(&mut con, "tpw:legacy:3"),
        -1,
        "reporting changes nothing"
    );

    let window = Window::new(Duration::from_secs(120)).unwrap();
    let report = store.audit(Some(window)).await.unwrap();
    assert_eq!(
        (report.without_lifetime.len(), report.repaired.len()),
        (26, 25)
    );
    assert!(report.repaired.contains(&"tpw:legacy:3".to_owned()));
    assert!(!report.repaired.contains(&"tpw:bad:1".to_owned()));
    assert_eq!(report.corrupt, ["tpw:bad:1"]);
    assert_eq!(
        pttl(&mut con, "tpw:bad:1"),
        -1,
        "a corrupt key gets no lifetime"
    );
    for i in 0..25 {
        let key = format!("tpw:legacy:{i}");
        assert!((119_000..=120_000).contains(&pttl(&mut con, &key)), "{key}");
        let value: i64 = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
        assert_eq!(value, 7, "the count is kept");
    }
    assert_eq!(
        pttl(&mut con, "unrelated"),
        -1,
        "keys outside the prefix are not touched"
    );
    assert_eq!(
        store.audit(None).await.unwrap().without_lifetime,
        ["tpw:bad:1"]
    );
}

/// A cap of `max` slots on leases of `secs` seconds, under the namespace "n".
fn slots_cap(max: u64, secs: u64) -> Cap<'static> {
    Cap {
        namespace: "n",
        in_flight: InFlight::new(max, Duration::from_secs(secs)).unwrap(),
    }
}

/// A Unix time in ms an hour from now: a lease that has not run out.
fn an_hour_on() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (now.as_millis() as u64 + 3_600_000).to_string()
}

/// What `key` holds, exactly (`DUMP`), and its lifetime (`PTTL`, -1 none).
fn dump(con: &mut redis::Connection, key: &[u8]) -> (Option<Vec<u8>>, i64) {
    let value = redis::cmd("DUMP").arg(key).query(con).unwrap();
    let ttl = redis::cmd("PTTL").arg(key).query(con).unwrap();
    (value, ttl)
}

/// Every way a record of slots can fail to be one: another type, or a
/// sorted set with a member that is not a slot's name (live or long past).
/// Each fails the key's takes, give-backs and counts as corrupt, named by
/// the record; an extend skips it and extends the rest of its call; and
/// the record is left exactly as it was.
async fn corrupt_records_of_slots_of_every_shape_are_left_as_they_are() {
    let server = redis_or_skip!(RedisServer::start(
        "corrupt_records_of_slots_of_every_shape_are_left_as_they_are"
    ));
    let store = backend(&server).await;
    let mut con = server.sync();
    let far = an_hour_on();
    let slot = SlotId::next().to_string();
    let upper = slot
        .to_uppercase()
        .replace(|c: char| c.is_ascii_digit(), "A");
    let cases: &[(&str, &[&str])] = &[
        ("a string", &["SET", "abc"]),
        ("a counter's digits", &["SET", "3"]),
        ("a hash", &["HSET", "f", "v"]),
        ("a list", &["RPUSH", &slot]),
        ("a set of a slot's name", &["SADD", &slot]),
        ("a member that is not a slot", &["ZADD", &far, "not-a-slot"]),
        ("upper-case digits", &["ZADD", &far, &upper]),
        ("31 digits", &["ZADD", &far, &slot[1..]]),
        ("33 digits", &["ZADD", &far, &format!("0{slot}")]),
        (
            "a bad member beside a live slot",
            &["ZADD", &far, &slot, &far, "x"],
        ),
        ("a bad member long past", &["ZADD", "1", "not-a-slot"]),
    ];
    let good = Key::new("good");
    let held = SlotId::next();
    assert!(
        store
            .take(&good, slots_cap(3, 30), held)
            .await
            .unwrap()
            .granted
    );
    for (case, write) in cases {
        let key = Key::new(*case);
        let record = slots_key(&store, "n", &key);
        let _: () = redis::cmd(write[0])
            .arg(&record)
            .arg(&write[1..])
            .query(&mut con)
            .unwrap();
        let before = dump(&mut con, &record);
        let name = record.escape_ascii().to_string();
        let is_this_record = |err: &BackendError| matches!(err, BackendError::Corrupt { key, detail } if *key == name && !detail.is_empty());
        let taken = store.take(&key, slots_cap(3, 30), SlotId::next()).await;
        assert!(
            taken.as_ref().is_err_and(is_this_record),
            "{case}: a take is corrupt: {taken:?}"
        );
        let given = store.give_back("n", &key, SlotId::next()).await;
        assert!(
            given.as_ref().is_err_and(is_this_record),
            "{case}: a give-back is corrupt: {given:?}"
        );
        let counted = store.in_use("n", &key).await;
        assert!(
            counted.as_ref().is_err_and(is_this_record),
            "{case}: a count is corrupt: {counted:?}"
        );
        let extended = store
            .extend(
                &[
                    Held {
                        namespace: "n",
                        key: &key,
                        slot: SlotId::parse(slot.as_bytes()).unwrap(),
                    },
                    Held {
                        namespace: "n",
                        key: &good,
                        slot: held,
                    },
                ],
                Window::new(Duration::from_secs(60)).unwrap(),
            )
            .await;
        assert_eq!(
            extended.unwrap(),
            1,
            "{case}: the good record of the call is extended, the corrupt one skipped"
        );
        assert_eq!(
            dump(&mut con, &record),
            before,
            "{case}: the record is left as it was"
        );
    }
    assert_eq!(store.in_use("n", &good).await.unwrap(), 1);
}

/// An extend of many keys' slots is one script call on a standalone
/// server, whatever their hash slots: each live slot and its record get the
/// new lease, a slot that is gone is not created, and a corrupt record of
/// the call is skipped.
async fn an_extend_of_many_keys_is_one_call() {
    let server = redis_or_skip!(RedisServer::start("an_extend_of_many_keys_is_one_call"));
    let store = backend(&server).await;
    let mut con = server.sync();
    let keys: Vec<Key> = (0..40)
        .map(|i| Key::display(format_args!("k{i}")))
        .collect();
    let mut held = Vec::new();
    for key in &keys {
        for _ in 0..2 {
            let slot = SlotId::next();
            assert!(
                store
                    .take(key, slots_cap(2, 10), slot)
                    .await
                    .unwrap()
                    .granted
            );
            held.push(Held {
                namespace: "n",
                key,
                slot,
            });
        }
    }
    let gone = Key::new("gone");
    held.push(Held {
        namespace: "n",
        key: &gone,
        slot: SlotId::next(),
    });
    let corrupt = Key::new("corrupt");
    let record = slots_key(&store, "n", &corrupt);
    set(&mut con, &record, "abc");
    held.push(Held {
        namespace: "n",
        key: &corrupt,
        slot: SlotId::next(),
    });
    // The script loaded first (an EVALSHA answered NOSCRIPT is a call).
    assert_eq!(
        store
            .extend(&held[80..81], Window::new(Duration::from_secs(60)).unwrap())
            .await
            .unwrap(),
        0
    );
    let before = server.script_calls();
    let extended = store
        .extend(&held, Window::new(Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    assert_eq!(extended, 80, "every live slot, none of the others");
    assert_eq!(server.script_calls() - before, 1, "one call for all");
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(slots_key(&store, "n", key))
            .query(&mut con)
            .unwrap();
        assert!(
            ttl > 55_000,
            "{key:?}: the record lives past the new lease: {ttl}"
        );
        let refused = store
            .take(key, slots_cap(2, 10), SlotId::next())
            .await
            .unwrap();
        assert!(
            !refused.granted && refused.retry > Duration::from_secs(55),
            "{key:?}: the earliest lease ends a minute on: {refused:?}"
        );
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(slots_key(&store, "n", &gone))
        .query(&mut con)
        .unwrap();
    assert!(!exists, "a slot that is gone is not created");
    assert_eq!(pttl(&mut con, std::str::from_utf8(&record).unwrap()), -1);
    assert_eq!(
        store
            .extend(&[], Window::new(Duration::from_secs(60)).unwrap())
            .await
            .unwrap(),
        0,
        "nothing to extend: no call"
    );
}

/// A record of slots found without a lifetime (which no step of the crate
/// leaves: written by hand, or `PERSIST`ed) is reported as one, not as a
/// corrupt counter; a repair gives it the repair window or its latest
/// lease, whichever ends later. A record that is not one is corrupt, and
/// never repaired.
async fn the_audit_reports_and_repairs_records_of_slots_without_a_lifetime() {
    let server = redis_or_skip!(RedisServer::start(
        "the_audit_reports_and_repairs_records_of_slots_without_a_lifetime"
    ));
    let store = backend(&server).await;
    let mut con = server.sync();
    let (short, long) = (Key::new("short"), Key::new("long"));
    assert!(
        store
            .take(&short, slots_cap(2, 30), SlotId::next())
            .await
            .unwrap()
            .granted
    );
    assert!(
        store
            .take(&long, slots_cap(2, 300), SlotId::next())
            .await
            .unwrap()
            .granted
    );
    let (short_record, long_record) = (
        slots_key(&store, "n", &short),
        slots_key(&store, "n", &long),
    );
    for record in [&short_record, &long_record] {
        let _: () = redis::cmd("PERSIST").arg(record).query(&mut con).unwrap();
    }
    let bad_member = slots_key(&store, "n", &Key::new("bad member"));
    let _: () = redis::cmd("ZADD")
        .arg(&bad_member)
        .arg(an_hour_on())
        .arg("not-a-slot")
        .query(&mut con)
        .unwrap();
    let text = slots_key(&store, "n", &Key::new("text"));
    set(&mut con, &text, "3");
    let name = |record: &[u8]| record.escape_ascii().to_string();

    let report = store.audit(None).await.unwrap();
    assert_eq!(report.scanned, 4);
    let mut without = report.without_lifetime.clone();
    without.sort();
    let mut all = [&short_record, &long_record, &bad_member, &text].map(|r| name(r));
    all.sort();
    assert_eq!(without, all, "every record without a lifetime is reported");
    let mut corrupt = report.corrupt.clone();
    corrupt.sort();
    let mut bad = vec![name(&bad_member), name(&text)];
    bad.sort();
    assert_eq!(
        corrupt, bad,
        "records of slots are not corrupt counters; the others are corrupt"
    );
    assert_eq!(
        dump(&mut con, &short_record).1,
        -1,
        "reporting changes nothing"
    );

    let report = store
        .audit(Some(Window::new(Duration::from_secs(120)).unwrap()))
        .await
        .unwrap();
    let mut repaired = report.repaired.clone();
    repaired.sort();
    let mut records = vec![name(&short_record), name(&long_record)];
    records.sort();
    assert_eq!(repaired, records, "the records of slots are repaired");
    let mut corrupt = report.corrupt.clone();
    corrupt.sort();
    assert_eq!(corrupt, bad, "and only they");
    let ttl = dump(&mut con, &short_record).1;
    assert!(
        (119_000..=120_000).contains(&ttl),
        "the repair window: {ttl}"
    );
    let ttl = dump(&mut con, &long_record).1;
    assert!(
        (295_000..=300_000).contains(&ttl),
        "the latest lease, later than the window: {ttl}"
    );
    for record in [&bad_member, &text] {
        assert_eq!(
            dump(&mut con, record).1,
            -1,
            "a corrupt record gets no lifetime"
        );
    }
    assert_eq!(
        store.in_use("n", &long).await.unwrap(),
        1,
        "the slot is kept"
    );
    let mut without = store.audit(None).await.unwrap().without_lifetime;
    without.sort();
    assert_eq!(
        without, bad,
        "only the corrupt records are left without one"
    );
}

async fn denied_keys_are_answered_locally_until_their_window_closes() {
    let server = redis_or_skip!(RedisServer::start(
        "denied_keys_are_answered_locally_until_their_window_closes"
    ));
    let store = backend(&server).await;
    let svc = RateLimitLayer::new("cache", quota(2, Duration::from_millis(400)))
        .key(by_client())
        .backend(store.clone())
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    for _ in 0..3 {
        svc.clone().oneshot(from("x")).await.unwrap();
    }
    let before = server.calls(&["evalsha"]);
    for _ in 0..50 {
        let res = svc.clone().oneshot(from("x")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(res.extensions().get::<Decision>().unwrap().reset() <= Duration::from_millis(400));
    }
    assert_eq!(
        server.calls(&["evalsha"]),
        before,
        "denials from the cache cost no Redis command"
    );
    assert_eq!(
        svc.clone().oneshot(from("y")).await.unwrap().status(),
        StatusCode::OK,
        "other keys still go to Redis"
    );
    assert_eq!(server.calls(&["evalsha"]), before + 1);

    // reset clears this instance's cache as well as Redis.
    assert!(store.reset("cache", &Key::new("x")).await.unwrap());
    assert_eq!(
        svc.clone().oneshot(from("x")).await.unwrap().status(),
        StatusCode::OK
    );

    // Once the window closes, the key is counted in Redis again.
    for _ in 0..3 {
        svc.clone().oneshot(from("z")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    let res = svc.clone().oneshot(from("z")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Decision>().unwrap().count(), 1);
}

/// What only Redis can hold: a counter without a lifetime (left by other
/// code), which `peek` reports as never resetting. (The contract's peek and
/// reset: `contract::peek_and_reset`.)
async fn peek_of_a_counter_without_a_lifetime_never_resets() {
    let server = redis_or_skip!(RedisServer::start(
        "peek_of_a_counter_without_a_lifetime_never_resets"
    ));
    let store = backend(&server).await;
    let mut con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = con.set("tpw:n{legacy}", 3).await.unwrap();
    assert_eq!(
        store
            .peek("n", &Key::new("legacy"))
            .await
            .unwrap()
            .unwrap()
            .reset,
        Duration::MAX,
        "no lifetime: never resets"
    );
}

async fn a_multiplexed_connection_serves_too() {
    let server = redis_or_skip!(RedisServer::start("a_multiplexed_connection_serves_too"));
    let con = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = RedisBackend::builder(con).prefix("app1:").build();
    let hit = store
        .hit("n", &Key::new("k"), quota(5, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(hit.count, 1);
    let mut sync = server.sync();
    assert!(pttl(&mut sync, "app1:n{k}") > 0);
    assert_eq!(store.audit(None).await.unwrap().scanned, 1);
}

async fn several_quotas_are_counted_in_redis_together() {
    let server = redis_or_skip!(RedisServer::start(
        "several_quotas_are_counted_in_redis_together"
    ));
    let mut con = server.sync();
    // Coalesced, a request's counters go in one script call; one at a time,
    // one EVALSHA per counter, sent together.
    for (coalesce, calls_per_request) in [(true, 1), (false, 2)] {
        let name = if coalesce { "multi1" } else { "multi0" };
        let svc = RateLimitLayer::new(name, quota(2, Duration::from_secs(60)))
            .also(quota(3, Duration::from_secs(3600)))
            .key(by_client())
            .backend(
                RedisBackend::builder(manager(&server).await)
                    .deny_cache(0)
                    .coalesce(coalesce)
                    .build(),
            )
            .layer(ok_service());
        let before = server.calls(&["evalsha"]);
        let statuses: Vec<StatusCode> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(svc.clone().oneshot(from("c")).await.unwrap().status());
            }
            v
        };
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        assert_eq!(
            server.calls(&["evalsha"]) - before,
            4 * calls_per_request,
            "coalesce {coalesce}"
        );
        let minute: i64 = redis::cmd("GET")
            .arg(format!("tpw:{name}{{c}}"))
            .query(&mut con)
            .unwrap();
        let hour_key = format!("tpw:{name}:3/3600000ms{{c}}");
        let hour: i64 = redis::cmd("GET").arg(&hour_key).query(&mut con).unwrap();
        assert_eq!((minute, hour), (4, 4));
        assert!((59_000..=60_000).contains(&pttl(&mut con, &format!("tpw:{name}{{c}}"))));
        assert!((3_599_000..=3_600_000).contains(&pttl(&mut con, &hour_key)));
    }
}

/// Every key under `prefix` on a standalone server.
fn keys_under(server: &RedisServer, prefix: &str) -> Vec<Vec<u8>> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut server.sync())
        .unwrap()
}

async fn client_chosen_keys_reach_no_other_layers_or_quotas_counter() {
    let server = redis_or_skip!(RedisServer::start(
        "client_chosen_keys_reach_no_other_layers_or_quotas_counter"
    ));
    let con = manager(&server).await;
    cases::client_chosen_keys_reach_no_other_counter(con, "adv:", || keys_under(&server, "adv:"))
        .await;
}

async fn refunds_of_deny_cache_answers_send_nothing() {
    let server = redis_or_skip!(RedisServer::start(
        "refunds_of_deny_cache_answers_send_nothing"
    ));
    // Load the scripts, so that every call below is one EVALSHA.
    let warm = backend(&server).await;
    let hit = warm
        .hit("warm", &Key::new("up"), quota(1, Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(warm.refund("warm", &Key::new("up"), &hit).await.unwrap());
    let before = server.calls(&["evalsha"]);
    cases::deny_cache_hits_are_never_refunded(manager(&server).await, "cache:").await;
    // 3 hits and 1 refund reached Redis; the 2 hits the cache answered and
    // the refund of one of them did not.
    assert_eq!(server.calls(&["evalsha"]) - before, 4);
}

async fn prefixes_with_braces_are_refused_and_the_audit_still_matches() {
    let server = redis_or_skip!(RedisServer::start(
        "prefixes_with_braces_are_refused_and_the_audit_still_matches"
    ));
    let con = manager(&server).await;
    for prefix in ["a{b}:", "{", "}"] {
        assert!(
            RedisBackend::builder(con.clone())
                .try_prefix(prefix)
                .is_err(),
            "{prefix}"
        );
    }
    // Glob characters in a prefix are fine: the audit escapes them.
    let store = RedisBackend::builder(manager(&server).await)
        .prefix("a*[x]:")
        .build();
    store
        .hit("n", &Key::new("k{1}"), quota(1, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(keys_under(&server, "a")[0], b"a*[x]:n{k%7B1%7D}");
    assert_eq!(store.audit(None).await.unwrap().scanned, 1);
}

/// The layer's timeout in the outage tests: long enough that a request
/// which waited on Redis would be told apart by its error kind, not by a
/// clock (one that waited out the timeout is `timed_out`).
const OUTAGE_TIMEOUT: Duration = Duration::from_secs(10);

fn kind<B>(res: &http::Response<B>) -> Option<&'static str> {
    res.extensions()
        .get::<std::sync::Arc<BackendError>>()
        .map(|err| err.kind_name())
}

/// `n` requests on keys of their own during an outage: each is answered
/// 503, and what each failure was.
async fn outage_kinds<S, B>(limited: &S, n: usize) -> Vec<&'static str>
where
    S: tower::Service<Request<String>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut kinds = Vec::new();
    for i in 0..n {
        let res = limited
            .clone()
            .oneshot(from(&format!("k{i}")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        kinds.push(kind(&res).unwrap());
    }
    kinds
}

/// Waits, up to 30 s, for a request to be admitted again once Redis answers.
async fn until_admitted<S, B>(limited: &S, why: &str)
where
    S: tower::Service<Request<String>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while limited.clone().oneshot(from("b")).await.unwrap().status() != StatusCode::OK {
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_backend_connecting_in_the_background_starts_during_an_outage() {
    let mut server = redis_or_skip!(RedisServer::start(
        "a_backend_connecting_in_the_background_starts_during_an_outage"
    ));
    // Nothing listens on the server's port until it is started again.
    server.stop();
    let store = RedisBackend::connect_in_background(&server.url()).unwrap();
    assert!(!store.connection().is_connected());
    let limited = RateLimitLayer::new("background", quota(3, Duration::from_secs(60)))
        .backend(store.clone())
        .timeout(Window::new(OUTAGE_TIMEOUT).unwrap())
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    let open = RateLimitLayer::new("background", quota(3, Duration::from_secs(60)))
        .backend(store.clone())
        .timeout(Window::new(OUTAGE_TIMEOUT).unwrap())
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    let mut kinds = Vec::new();
    for i in 0..20 {
        let res = limited
            .clone()
            .oneshot(from(&format!("down-{i}")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "fail-closed");
        assert_eq!(res.headers()["retry-after"], "1");
        kinds.push(kind(&res));
        let res = open
            .clone()
            .oneshot(from(&format!("down-{i}")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "fail-open lets it through");
        assert!(res.extensions().get::<Decision>().is_none(), "uncounted");
    }
    // No request waited on Redis: each was answered for an outage at once,
    // and the breaker opened.
    assert!(
        kinds
            .iter()
            .all(|k| matches!(k, Some("unavailable" | "circuit_open"))),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&Some("circuit_open")),
        "the breaker opened: {kinds:?}"
    );

    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let res = limited.clone().oneshot(from("up")).await.unwrap();
        if res.status() == StatusCode::OK {
            assert_eq!(res.extensions().get::<Decision>().unwrap().count(), 1);
            break;
        }
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            std::time::Instant::now() < deadline,
            "never limited after Redis came up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(store.connection().is_connected());
    let statuses: Vec<StatusCode> = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(limited.clone().oneshot(from("up")).await.unwrap().status());
        }
        statuses
    };
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "limited again: 3 per window"
    );
}

async fn the_breaker_answers_at_once_during_an_outage_and_closes_after() {
    let mut server = redis_or_skip!(RedisServer::start(
        "the_breaker_answers_at_once_during_an_outage_and_closes_after"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .breaker(3, Duration::from_millis(200))
        .deny_cache(0)
        .build();
    let limited = RateLimitLayer::new("breaker", quota(1_000, Duration::from_secs(60)))
        .backend(store.clone())
        .timeout(Window::new(OUTAGE_TIMEOUT).unwrap())
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    assert_eq!(
        limited.clone().oneshot(from("a")).await.unwrap().status(),
        StatusCode::OK
    );
    server.stop();
    let kinds = outage_kinds(&limited, 10).await;
    let first_open = kinds
        .iter()
        .position(|k| *k == "circuit_open")
        .unwrap_or_else(|| panic!("the breaker never opened: {kinds:?}"));
    assert!(first_open <= 3, "open after 3 failures: {kinds:?}");
    assert!(
        kinds[first_open..].iter().all(|k| *k == "circuit_open"),
        "then open: {kinds:?}"
    );
    assert!(!kinds.contains(&"timed_out"), "{kinds:?}");
    assert!(matches!(
        store
            .hit("breaker", &Key::new("x"), quota(5, Duration::from_secs(60)))
            .await,
        Err(BackendError::CircuitOpen)
    ));

    server.restart();
    until_admitted(&limited, "the breaker never closed after Redis came back").await;
    for i in 0..10 {
        let res = limited
            .clone()
            .oneshot(from(&format!("k{i}")))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "closed");
    }
}

async fn a_store_that_stops_answering_opens_the_breaker_on_timeouts() {
    let server = redis_or_skip!(RedisServer::start(
        "a_store_that_stops_answering_opens_the_breaker_on_timeouts"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .breaker(3, Duration::from_millis(200))
        .deny_cache(0)
        .build();
    let limited = RateLimitLayer::new("frozen", quota(1_000, Duration::from_secs(60)))
        .backend(store)
        .timeout(Window::new(Duration::from_millis(50)).unwrap())
        .layer(ok_service());
    assert_eq!(
        limited.clone().oneshot(from("a")).await.unwrap().status(),
        StatusCode::OK
    );
    // Frozen: the connection stays open and nothing answers.
    server.signal("STOP");
    let kinds = outage_kinds(&limited, 8).await;
    server.signal("CONT");
    assert_eq!(&kinds[..3], &["timed_out"; 3], "three timeouts: {kinds:?}");
    assert!(
        kinds[3..].iter().all(|k| *k == "circuit_open"),
        "then answered at once: {kinds:?}"
    );
    until_admitted(
        &limited,
        "the breaker never closed after Redis answered again",
    )
    .await;
}

async fn clients_that_give_up_their_requests_never_open_the_breaker() {
    let server = redis_or_skip!(RedisServer::start(
        "clients_that_give_up_their_requests_never_open_the_breaker"
    ));
    // One failure would open it.
    let store = RedisBackend::builder(manager(&server).await)
        .breaker(1, Duration::from_secs(600))
        .deny_cache(0)
        .build();
    let q = quota(10, Duration::from_secs(600));
    for round in 0..200 {
        // A lone hit sent from its own task, or a batch queued behind it,
        // every one given up while its call is in flight.
        let mut futures: Vec<_> = (0..1 + round % 8)
            .map(|i| store.hit("gone", &Key::display(format_args!("{round}-{i}")), q))
            .collect();
        for future in &mut futures {
            assert!(!poll_once(future), "a hit to Redis is not ready at once");
        }
        for _ in 0..round % 3 {
            tokio::task::yield_now().await;
        }
        drop(futures);
    }
    let hit = store
        .hit("gone", &Key::new("after"), q)
        .await
        .expect("the breaker is closed: no client gone away counts as a failure");
    assert_eq!(hit.count, 1);
}

async fn a_bad_url_is_a_configuration_error() {
    for url in [
        "not a url",
        "redis://127.0.0.1:notaport/",
        "mysql://127.0.0.1/",
    ] {
        assert!(
            matches!(
                RedisBackend::connect_in_background(url),
                Err(ConfigError::InvalidUrl(_))
            ),
            "{url}"
        );
        assert!(
            matches!(
                RedisBackend::connect(url).await,
                Err(ConnectError::Config(ConfigError::InvalidUrl(_)))
            ),
            "{url}"
        );
    }
    let secret = "redis://user:hunter2@127.0.0.1:notaport/";
    let err = RedisBackend::connect_in_background(secret).unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

async fn breaker_settings_are_checked() {
    // A backend that never connects: nothing listens on the discard port.
    let store = RedisBackend::connect_in_background("redis://127.0.0.1:9/").unwrap();
    let builder = || RedisBackend::builder(store.connection().clone());
    assert_eq!(
        builder()
            .try_breaker(0, Duration::from_secs(1))
            .err()
            .map(|e| e.to_string()),
        Some(ConfigError::ZeroBreakerFailures.to_string())
    );
    assert!(matches!(
        builder().try_breaker(1, Duration::ZERO),
        Err(ConfigError::ZeroBreakerCooldown)
    ));
    assert!(builder().try_breaker(1, Duration::from_millis(1)).is_ok());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder().breaker(0, Duration::from_secs(1))
    }));
    assert!(panicked.is_err());
}

/// Polls `future` once, without a runtime's waker: it is then submitted (a
/// coalesced hit is queued in its lane) and can be dropped or awaited.
fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(future).poll(&mut cx).is_ready()
}

/// One hit on `namespace`'s counter for `key` (no limit to reach), on its
/// own task, so that many are in flight together.
fn spawn_hit(
    store: RedisBackend<ConnectionManager>,
    namespace: &'static str,
    key: String,
    window: Duration,
) -> tokio::task::JoinHandle<(String, Hit)> {
    tokio::spawn(async move {
        let hit = store
            .hit(namespace, &Key::new(key.clone()), quota(u64::MAX, window))
            .await
            .unwrap();
        (key, hit)
    })
}

/// The hits of `tasks`, by key, in the order the tasks were spawned.
async fn hits_by_key(
    tasks: Vec<tokio::task::JoinHandle<(String, Hit)>>,
) -> std::collections::HashMap<String, Vec<Hit>> {
    let mut by_key: std::collections::HashMap<String, Vec<_>> = Default::default();
    for task in tasks {
        let (key, hit) = task.await.unwrap();
        by_key.entry(key).or_default().push(hit);
    }
    by_key
}

fn coalesced_hits_take_every_count_once_across_four_instances() {
    let server = redis_or_skip!(RedisServer::start(
        "coalesced_hits_take_every_count_once_across_four_instances"
    ));
    multi_thread_runtime().block_on(async {
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(
                RedisBackend::builder(manager(&server).await)
                    .deny_cache(0)
                    .build(),
            );
        }
        let before = server.script_calls();
        // One hot key, taken with two windows (one namespace: one counter),
        // and 50 other keys; 2,000 hits in flight together over 4 instances.
        let hits = 2_000usize;
        let mut tasks = Vec::new();
        for i in 0..hits {
            let (key, window) = match i % 3 {
                0 => ("hot".to_string(), 60),
                1 => ("hot".to_string(), 30),
                _ => (format!("k{}", i % 50), 60),
            };
            tasks.push(spawn_hit(
                stores[i % 4].clone(),
                "exact",
                key,
                Duration::from_secs(window),
            ));
        }
        let by_key = hits_by_key(tasks).await;
        let calls = server.script_calls() - before;
        assert!(
            calls < hits as u64 / 2,
            "the hits were coalesced: {calls} script calls for {hits} hits"
        );
        let mut con = server.sync();
        for (key, hits) in &by_key {
            let mut counts: Vec<u64> = hits.iter().map(|h| h.count).collect();
            counts.sort_unstable();
            assert_eq!(
                counts,
                (1..=hits.len() as u64).collect::<Vec<_>>(),
                "{key}: every count once, as if sent one by one"
            );
            let deadline = hits[0].deadline.expect("Redis 7 reports deadlines");
            assert!(
                hits.iter().all(|h| h.deadline == Some(deadline)),
                "{key}: one window"
            );
            // The hot key's window is the one of whichever hit created it.
            assert!(
                hits.iter().all(
                    |h| h.reset <= Duration::from_secs(60) && h.reset > Duration::from_secs(20)
                ),
                "{key}"
            );
            let stored: u64 = redis::cmd("GET")
                .arg(format!("tpw:exact{{{key}}}"))
                .query(&mut con)
                .unwrap();
            assert_eq!(stored, hits.len() as u64, "{key}");
            let ttl = pttl(&mut con, &format!("tpw:exact{{{key}}}"));
            assert!(ttl > 20_000 && ttl <= 60_000, "{key}: {ttl}");
        }
    });
}

async fn a_frozen_server_holds_at_most_two_calls_per_lane() {
    let server = redis_or_skip!(RedisServer::start(
        "a_frozen_server_holds_at_most_two_calls_per_lane"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    // Hits in flight together, so that both scripts are loaded (a first
    // call of each is answered NOSCRIPT and sent again with EVAL).
    let warm = (0..200).map(|i| {
        store.hit(
            "warm",
            &Key::new(format!("w{i}")),
            quota(u64::MAX, Duration::from_secs(60)),
        )
    });
    for hit in futures_util::future::join_all(warm).await {
        hit.unwrap();
    }
    let before = server.script_calls();
    // Frozen: the first hit's call and, once enough queue behind it, a
    // second call wait in the socket; every other hit waits in the lane.
    server.signal("STOP");
    let hits = 1_000usize;
    let mut tasks = Vec::new();
    for i in 0..hits {
        let key = if i % 2 == 0 {
            "hot".to_string()
        } else {
            format!("k{}", i % 20)
        };
        tasks.push(spawn_hit(
            store.clone(),
            "frozen",
            key,
            Duration::from_secs(60),
        ));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("CONT");
    let by_key = hits_by_key(tasks).await;
    // The two calls held by the frozen server, then the queue in at most
    // two more (at most 512 requests a call), not a call per few hits.
    let calls = server.script_calls() - before;
    assert!(
        (3..=4).contains(&calls),
        "{calls} script calls for {hits} hits"
    );
    for (key, hits) in by_key {
        let mut counts: Vec<u64> = hits.iter().map(|h| h.count).collect();
        counts.sort_unstable();
        assert_eq!(
            counts,
            (1..=counts.len() as u64).collect::<Vec<_>>(),
            "{key}: every count once"
        );
    }
}

async fn a_mixed_batch_of_healthy_corrupt_and_ttl_less_keys() {
    let server = redis_or_skip!(RedisServer::start(
        "a_mixed_batch_of_healthy_corrupt_and_ttl_less_keys"
    ));
    let mut con = server.sync();
    for (args, what) in [
        (&["SET", "tpw:mix{text}", "abc"][..], "text"),
        (&["SET", "tpw:mix{negative}", "-3"][..], "negative"),
        (&["HSET", "tpw:mix{hash}", "f", "v"][..], "hash"),
        (
            &["SET", "tpw:mix{full}", "9223372036854775807"][..],
            "a counter INCRBY cannot raise",
        ),
        (
            &["SET", "tpw:mix{old}", "5"][..],
            "a counter older code left without a lifetime",
        ),
    ] {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd
            .query(&mut con)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let svc = RateLimitLayer::new("mix", quota(100, Duration::from_secs(60)))
        .key(by_client())
        .backend(store)
        .decision_in(DecisionIn::Response)
        .timeout(Window::new(Duration::from_secs(10)).unwrap())
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    let clients = [
        "h1", "text", "h2", "old", "hash", "h1", "negative", "full", "h3", "old", "h1",
    ];
    let before = server.script_calls();
    // On this current-thread runtime, every request is submitted before the
    // lane's driver first runs: they share calls.
    let mut tasks = Vec::new();
    for round in 0..3 {
        for client in clients {
            let svc = svc.clone();
            tasks.push((
                round,
                client,
                tokio::spawn(async move { svc.oneshot(from(client)).await.unwrap() }),
            ));
        }
    }
    let hits = tasks.len() as u64;
    let mut old_counts = Vec::new();
    let mut h1_counts = Vec::new();
    for (round, client, task) in tasks {
        let res = task.await.unwrap();
        match client {
            "text" | "hash" | "negative" | "full" => assert_eq!(
                res.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{client} (round {round}): a corrupt key stops its own requests, even failing open"
            ),
            _ => {
                assert_eq!(res.status(), StatusCode::OK, "{client} (round {round})");
                let decision = res
                    .extensions()
                    .get::<Decision>()
                    .unwrap_or_else(|| panic!("{client}: counted, not let through uncounted"));
                match client {
                    "old" => old_counts.push(decision.count()),
                    "h1" => h1_counts.push(decision.count()),
                    _ => {}
                }
            }
        }
    }
    let calls = server.script_calls() - before;
    assert!(
        calls < hits / 2,
        "the requests shared calls: {calls} for {hits} requests"
    );
    old_counts.sort_unstable();
    assert_eq!(
        old_counts,
        (6..=11).collect::<Vec<_>>(),
        "counted on, not reset"
    );
    h1_counts.sort_unstable();
    assert_eq!(h1_counts, (1..=9).collect::<Vec<_>>());
    let ttl = pttl(&mut con, "tpw:mix{old}");
    assert!(
        (50_000..=60_000).contains(&ttl),
        "the window was attached: {ttl}"
    );
    for (key, count) in [("h1", 9), ("h2", 3), ("h3", 3)] {
        let key = format!("tpw:mix{{{key}}}");
        let stored: u64 = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
        assert_eq!(stored, count, "{key}");
        assert!(pttl(&mut con, &key) > 50_000, "{key}");
    }
    let get = |con: &mut redis::Connection, key: &str| -> String {
        redis::cmd("GET").arg(key).query(con).unwrap()
    };
    assert_eq!(get(&mut con, "tpw:mix{text}"), "abc");
    assert_eq!(get(&mut con, "tpw:mix{negative}"), "-3");
    assert_eq!(get(&mut con, "tpw:mix{full}"), "9223372036854775807");
    assert_eq!(pttl(&mut con, "tpw:mix{full}"), -1);
    assert_eq!(
        pttl(&mut con, "tpw:mix{text}"),
        -1,
        "no lifetime for corrupt keys"
    );
    assert_eq!(pttl(&mut con, "tpw:mix{negative}"), -1);
    let hash: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg("tpw:mix{hash}")
        .query(&mut con)
        .unwrap();
    assert_eq!(hash, vec![("f".to_string(), "v".to_string())]);
}

async fn dropped_futures_inside_a_batch_leave_no_key_without_a_lifetime() {
    let server = redis_or_skip!(RedisServer::start(
        "dropped_futures_inside_a_batch_leave_no_key_without_a_lifetime"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let q = quota(10, Duration::from_secs(600));
    let mut con = server.sync();
    let exists = |con: &mut redis::Connection, key: &str| -> bool {
        redis::cmd("EXISTS").arg(key).query(con).unwrap()
    };

    // Queued, then half dropped before the lane's driver first runs: those
    // are never sent; the others are counted, each with its lifetime.
    let mut futures: Vec<_> = (0..100)
        .map(|i| store.hit("drop", &Key::display(format_args!("a{i}")), q))
        .collect();
    for future in &mut futures {
        assert!(!poll_once(future), "a hit to Redis is not ready at once");
    }
    let kept: Vec<_> = futures
        .into_iter()
        .enumerate()
        .filter_map(|(i, f)| (i % 2 == 0).then_some((i, f)))
        .collect();
    let before = server.script_calls();
    for (i, future) in kept {
        let hit = future.await.unwrap();
        assert_eq!(hit.count, 1, "a{i}");
    }
    assert!(
        server.script_calls() - before < 50,
        "the 50 kept hits were coalesced"
    );
    for i in 0..100 {
        let key = format!("tpw:drop{{a{i}}}");
        if i % 2 == 0 {
            let ttl = pttl(&mut con, &key);
            assert!(ttl > 590_000, "{key}: {ttl}");
        } else {
            assert!(!exists(&mut con, &key), "{key}: dropped before it was sent");
        }
    }

    // Every waiter of a call in flight dropped: the keys the call reached
    // have their lifetime, and the lane goes on serving.
    for round in 0..20 {
        let mut futures: Vec<_> = (0..50)
            .map(|i| store.hit("drop", &Key::display(format_args!("b{round}-{i}")), q))
            .collect();
        for future in &mut futures {
            poll_once(future);
        }
        // Let the driver send, then give up on every hit.
        for _ in 0..=round % 4 {
            tokio::task::yield_now().await;
        }
        drop(futures);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tpw:drop{b*")
        .query(&mut con)
        .unwrap();
    for key in &keys {
        let ttl = pttl(&mut con, key);
        assert!(ttl > 590_000, "{key} has no lifetime: {ttl}");
    }
    let hit = tokio::time::timeout(
        Duration::from_secs(10),
        store.hit("drop", &Key::new("after"), q),
    )
    .await
    .expect("the lane still answers")
    .unwrap();
    assert_eq!(hit.count, 1);
}

async fn script_flush_and_a_restart_in_the_middle_of_batches() {
    let mut server = redis_or_skip!(RedisServer::start(
        "script_flush_and_a_restart_in_the_middle_of_batches"
    ));
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let (store, stop, done, failed) =
            (store.clone(), stop.clone(), done.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = Key::display(format_args!("w{worker}-{}", i % 7));
                let hit = tokio::time::timeout(
                    Duration::from_secs(10),
                    store.hit("batch", &key, quota(u64::MAX, Duration::from_secs(60))),
                )
                .await
                .expect("a hit never hangs, whatever happens to Redis");
                match hit {
                    Ok(_) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(BackendError::Unavailable(_) | BackendError::TimedOut) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(other) => panic!("{other}"),
                }
            }
        }));
    }
    let mut admin = manager(&server).await;
    let wait_for_hits = |n: usize| {
        let done = done.clone();
        async move {
            let start = done.load(Ordering::Relaxed);
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while done.load(Ordering::Relaxed) < start + n {
                assert!(
                    std::time::Instant::now() < deadline,
                    "hits stopped succeeding"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    wait_for_hits(200).await;
    let before = server.script_calls();
    let hits_before = done.load(Ordering::Relaxed);
    for _ in 0..10 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        wait_for_hits(50).await;
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "a SCRIPT FLUSH fails no hit: NOSCRIPT is answered with EVAL"
    );
    let calls = server.script_calls() - before;
    let hits = (done.load(Ordering::Relaxed) - hits_before) as u64;
    assert!(calls < hits, "coalesced: {calls} calls for {hits} hits");
    let stats = server.cmd(&["INFO", "commandstats"]).unwrap();
    assert!(stats.contains("cmdstat_eval:"), "EVAL reloaded the script");

    server.restart();
    wait_for_hits(500).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let stats = server.cmd(&["INFO", "commandstats"]).unwrap();
    assert!(
        stats.contains("cmdstat_eval:"),
        "the fresh server got the script with EVAL:\n{stats}"
    );
    let mut con = server.sync();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tpw:batch{*")
        .query(&mut con)
        .unwrap();
    assert!(!keys.is_empty(), "counted on the fresh server");
    for key in &keys {
        let ttl = pttl(&mut con, key);
        assert!(ttl > 0, "{key} has no lifetime: {ttl}");
    }
    let calls = server.script_calls();
    let counted: u64 = keys
        .iter()
        .map(|k| redis::cmd("GET").arg(k).query::<u64>(&mut con).unwrap())
        .sum();
    assert!(
        calls < counted,
        "coalesced after the restart too: {calls} calls for {counted} hits"
    );
}

/// One call of the batch script on its own: `entries` are (key under
/// `tpw:args`, hits, window) as sent. The server's clock, and the two values
/// each entry answers.
fn batch_script(
    con: &mut redis::Connection,
    entries: &[(&str, &str, &str)],
) -> (i64, Vec<(redis::Value, redis::Value)>) {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(include_str!("../../redis/src/hit_batch.lua"))
        .arg(entries.len());
    for (key, ..) in entries {
        cmd.arg(format!("tpw:args{{{key}}}"));
    }
    for (_, hits, window) in entries {
        cmd.arg(*hits).arg(*window);
    }
    let reply: Vec<redis::Value> = cmd.query(con).unwrap();
    // The clock, each entry's two integers packed, then each refused
    // entry's place and reason: read back as (count or code, deadline or
    // reason) per entry.
    let (now, packed, refused) = match reply.as_slice() {
        [
            redis::Value::Int(now),
            redis::Value::BulkString(packed),
            refused @ ..,
        ] => (*now, packed, refused),
        other => panic!("unexpected reply {other:?}"),
    };
    assert_eq!(packed.len(), 16 * entries.len(), "{reply:?}");
    let int = |bytes: &[u8]| i64::from_be_bytes(bytes.try_into().unwrap());
    let answers = packed
        .chunks(16)
        .enumerate()
        .map(|(at, pair)| {
            let (count, when) = (int(&pair[..8]), int(&pair[8..]));
            let reason = refused
                .chunks(2)
                .find(|r| r[0] == redis::Value::Int(at as i64 + 1))
                .map(|r| r[1].clone());
            match reason {
                Some(reason) => {
                    assert!(count < 0 && when == 0, "{reply:?}");
                    (redis::Value::Int(count), reason)
                }
                None => (redis::Value::Int(count), redis::Value::Int(when)),
            }
        })
        .collect();
    (now, answers)
}

/// The batch script attaches a lifetime, in the same call, to a counter it
/// creates and to one left without any, and never moves one a counter has,
/// even when its count had come back to zero (a refunded window).
fn the_batch_script_attaches_a_lifetime_only_where_there_is_none() {
    let server = redis_or_skip!(RedisServer::start(
        "the_batch_script_attaches_a_lifetime_only_where_there_is_none"
    ));
    let mut con = server.sync();
    let deadline_of = |con: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(format!("tpw:args{{{key}}}"))
            .query(con)
            .unwrap()
    };
    // A window whose hits were all refunded, and a counter older code left
    // without a lifetime.
    set_px(&mut con, "tpw:args{refunded}", 0, 50_000);
    set(&mut con, "tpw:args{no_lifetime}", 5);
    let refunded = deadline_of(&mut con, "refunded");
    let (now, answers) = batch_script(
        &mut con,
        &[
            ("new", "1", "60000"),
            ("refunded", "1", "60000"),
            ("no_lifetime", "1", "60000"),
            ("new_by_three", "3", "60000"),
            ("new", "2", "30000"),
        ],
    );
    let int = |value: &redis::Value| match value {
        redis::Value::Int(n) => *n,
        other => panic!("{other:?}"),
    };
    let got: Vec<(i64, i64)> = answers.iter().map(|(c, d)| (int(c), int(d))).collect();
    assert_eq!(
        got,
        [
            (1, now + 60_000),
            (1, refunded),
            (6, now + 60_000),
            (3, now + 60_000),
            // The second entry of a key keeps the first one's window.
            (3, now + 60_000),
        ]
    );
    for (key, (_, deadline)) in ["new", "refunded", "no_lifetime", "new_by_three"]
        .iter()
        .zip(&got)
    {
        assert_eq!(deadline_of(&mut con, key), *deadline, "{key}");
    }
}

/// The batch script on its own, with arguments the backend never sends:
/// each bad entry is refused with nothing written, and the entries around
/// it are counted as usual, whatever the order of good and bad arguments.
fn the_batch_script_refuses_bad_arguments_and_writes_nothing_for_them() {
    let server = redis_or_skip!(RedisServer::start(
        "the_batch_script_refuses_bad_arguments_and_writes_nothing_for_them"
    ));
    let mut con = server.sync();
    set(&mut con, "tpw:args{text}", "abc");
    // (key, hits, window, what the entry must answer)
    let entries: &[(&str, &str, &str, &str)] = &[
        ("good1", "1", "60000", "1"),
        ("zero", "0", "60000", "invalid hit count 0"),
        ("good2", "1", "60000", "1"),
        ("leading_zero", "01", "60000", "invalid hit count 01"),
        ("decimal", "1.0", "60000", "invalid hit count 1.0"),
        ("hex", "0x1", "60000", "invalid hit count 0x1"),
        ("space", "1 ", "60000", "invalid hit count 1 "),
        ("exponent", "1e0", "60000", "invalid hit count 1e0"),
        (
            "too_many",
            "4294967296",
            "60000",
            "invalid hit count 4294967296",
        ),
        ("good1", "3", "60000", "4"),
        ("no_window", "1", "0", "invalid window 0"),
        ("fraction", "1", "1.5", "invalid window 1.5"),
        ("good2", "2", "60000", "3"),
        ("text", "1", "60000", "value abc"),
        ("text", "1.0", "60000", "invalid hit count 1.0"),
        ("good3", "1", "30000", "1"),
    ];
    let (now, answers) = batch_script(
        &mut con,
        &entries
            .iter()
            .map(|&(key, hits, window, _)| (key, hits, window))
            .collect::<Vec<_>>(),
    );
    for ((key, hits, window, expected), answer) in entries.iter().zip(&answers) {
        let what = format!("{key} with {hits:?} hits, window {window:?}: {answer:?}");
        match answer {
            (redis::Value::Int(count), redis::Value::Int(deadline)) if *count >= 1 => {
                assert_eq!(count.to_string(), *expected, "{what}");
                assert!(deadline - now > 25_000, "{what}");
            }
            (redis::Value::Int(code), redis::Value::BulkString(why)) => {
                let why = String::from_utf8_lossy(why);
                assert!(why.ends_with(expected), "{what}");
                let code_expected = if expected.starts_with("invalid") {
                    -2
                } else {
                    -1
                };
                assert_eq!(*code, code_expected, "{what}");
            }
            _ => panic!("{what}"),
        }
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "tpw:args{good1}",
            "tpw:args{good2}",
            "tpw:args{good3}",
            "tpw:args{text}"
        ],
        "a refused entry writes nothing"
    );
    let text: String = redis::cmd("GET")
        .arg("tpw:args{text}")
        .query(&mut con)
        .unwrap();
    assert_eq!(text, "abc");
    assert_eq!(pttl(&mut con, "tpw:args{text}"), -1);
    let good3 = pttl(&mut con, "tpw:args{good3}");
    assert!((25_000..=30_000).contains(&good3), "{good3}");
}

/// Issue 23, defect 6a: a hit, a reset, a hit, then the refund of the first
/// hit. Both windows close in the same millisecond for most keys of such a
/// loop; the refund must still leave the new window's hit counted.
async fn a_refund_after_a_reset_never_takes_the_new_windows_hit() {
    let server = redis_or_skip!(RedisServer::start(
        "a_refund_after_a_reset_never_takes_the_new_windows_hit"
    ));
    for coalesce in [true, false] {
        let store = RedisBackend::builder(manager(&server).await)
            .deny_cache(0)
            .coalesce(coalesce)
            .build();
        let q = quota(10, Duration::from_secs(60));
        let mut taken = 0;
        for i in 0..200 {
            let key = Key::new(format!("k{i}-{coalesce}"));
            let first = store.hit("n", &key, q).await.unwrap();
            assert!(store.reset("n", &key).await.unwrap());
            let second = store.hit("n", &key, q).await.unwrap();
            assert_eq!(second.count, 1);
            if store.refund("n", &key, &first).await.unwrap() {
                taken += 1;
            }
            assert_eq!(
                store.peek("n", &key).await.unwrap().map(|h| h.count),
                Some(1),
                "key {i}: the new window lost its hit"
            );
            // The new window's own hit is refunded when its deadline differs
            // from the deleted window's (in the same millisecond it stays
            // counted: the store cannot tell the two apart).
            let refunded = store.refund("n", &key, &second).await.unwrap();
            let left = store.peek("n", &key).await.unwrap().map(|h| h.count);
            assert_eq!(left, Some(u64::from(!refunded)), "key {i}");
            if second.deadline != first.deadline {
                assert!(refunded, "key {i}: another deadline, refunded");
            }
        }
        assert_eq!(taken, 0, "refunds that took the new window's hit");
    }
}

/// A counter written by the previous release (a plain integer with a
/// `PEXPIRE`) keeps working: counted, expiring as it was, refunded by its
/// deadline, amended, spent on.
async fn a_counter_of_the_previous_release_keeps_working() {
    let server = redis_or_skip!(RedisServer::start(
        "a_counter_of_the_previous_release_keeps_working"
    ));
    let mut con = server.sync();
    set_px(&mut con, "tpw:old{a}", 3, 50_000);
    let before: i64 = redis::cmd("PEXPIRETIME")
        .arg("tpw:old{a}")
        .query(&mut con)
        .unwrap();
    for coalesce in [true, false] {
        let store = RedisBackend::builder(manager(&server).await)
            .deny_cache(0)
            .coalesce(coalesce)
            .build();
        let q = quota(10, Duration::from_secs(60));
        let hit = store.hit("old", &Key::new("a"), q).await.unwrap();
        assert_eq!(hit.count, 4);
        assert_eq!(hit.deadline.map(|d| d.get() as i64), Some(before));
        assert!(store.refund("old", &Key::new("a"), &hit).await.unwrap());
        let value: String = redis::cmd("GET").arg("tpw:old{a}").query(&mut con).unwrap();
        assert_eq!(value, "3", "a plain integer still");
    }
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let q = quota(10, Duration::from_secs(60));
    let spent = store
        .spend_all(
            &Key::new("a"),
            &[tower_pinned_window::backend::Counter {
                namespace: "old",
                quota: q,
                lowers: false,
            }],
            Spend::cost(5),
        )
        .await
        .unwrap();
    assert_eq!(spent[0].count, 8);
    assert!(
        store
            .amend("old", &Key::new("a"), &spent[0], Amend::Refund(2))
            .await
            .unwrap()
    );
    let value: String = redis::cmd("GET").arg("tpw:old{a}").query(&mut con).unwrap();
    assert_eq!(value, "6");
    let after: i64 = redis::cmd("PEXPIRETIME")
        .arg("tpw:old{a}")
        .query(&mut con)
        .unwrap();
    assert_eq!(after, before, "the lifetime is the one it had");
}

fn counter(namespace: &str, limit: u64, secs: u64) -> tower_pinned_window::backend::Counter<'_> {
    tower_pinned_window::backend::Counter {
        namespace,
        quota: quota(limit, Duration::from_secs(secs)),
        lowers: false,
    }
}

/// Costs, checks, lockouts and amends on a real server: the contract's
/// rules, with the keys Redis holds.
async fn spends_are_all_or_nothing_with_lockouts_and_amends() {
    let server = redis_or_skip!(RedisServer::start(
        "spends_are_all_or_nothing_with_lockouts_and_amends"
    ));
    let mut con = server.sync();
    let store = backend(&server).await;
    // It spends: checked by the compiler.
    fn spends<B: tower_pinned_window::backend::Spending>(_: &B) {}
    spends(&store);
    let k = Key::new("ip");
    let both = [counter("s", 10, 60), counter("s:2", 5, 60)];
    // A check creates nothing.
    let hits = store.spend_all(&k, &both, Spend::cost(0)).await.unwrap();
    assert_eq!((hits[0].count, hits[0].deadline), (0, None));
    assert_eq!(pttl(&mut con, "tpw:s{ip}"), -2);
    // Opened at 0 with its window.
    let hits = store
        .spend_all(&k, &both[..1], Spend::cost(0).open())
        .await
        .unwrap();
    assert_eq!(hits[0].count, 0);
    assert!(hits[0].deadline.is_some());
    assert!((59_000..=60_000).contains(&pttl(&mut con, "tpw:s{ip}")));
    let hits = store.spend_all(&k, &both, Spend::cost(4)).await.unwrap();
    assert_eq!((hits[0].count, hits[1].count), (4, 4));
    // 4 + 2 > 5 on the second: nothing is spent on either.
    let hits = store.spend_all(&k, &both, Spend::cost(2)).await.unwrap();
    assert_eq!((hits[0].count, hits[1].count), (4, 6));
    assert!(hits.iter().all(|h| h.deadline.is_none()));
    let count: u64 = redis::cmd("GET").arg("tpw:s{ip}").query(&mut con).unwrap();
    assert_eq!(count, 4);
    // A charge may pass the limit; a refund never goes below zero.
    let admitted = store
        .spend_all(&k, &both[..1], Spend::cost(1))
        .await
        .unwrap();
    assert!(
        store
            .amend("s", &k, &admitted[0], Amend::Charge(20))
            .await
            .unwrap()
    );
    let count: u64 = redis::cmd("GET").arg("tpw:s{ip}").query(&mut con).unwrap();
    assert_eq!(count, 25);
    assert!(
        store
            .amend("s", &k, &admitted[0], Amend::Refund(100))
            .await
            .unwrap()
    );
    let count: u64 = redis::cmd("GET").arg("tpw:s{ip}").query(&mut con).unwrap();
    assert_eq!(count, 0);
    assert!(
        !store
            .amend("s", &k, &admitted[0], Amend::Refund(1))
            .await
            .unwrap()
    );
    assert!(
        store
            .amend("s", &k, &admitted[0], Amend::Clear)
            .await
            .unwrap()
    );
    assert_eq!(pttl(&mut con, "tpw:s{ip}"), -2);
    // An amend never creates a counter.
    assert!(
        !store
            .amend("s", &k, &admitted[0], Amend::Charge(3))
            .await
            .unwrap()
    );
    assert_eq!(pttl(&mut con, "tpw:s{ip}"), -2);
    // A lockout, pinned to the first denial.
    let login = [counter("login", 2, 60)];
    let lock = Spend::cost(1).block(Window::new(Duration::from_secs(3600)).unwrap());
    for _ in 0..2 {
        assert!(store.spend_all(&k, &login, lock).await.unwrap()[0].count <= 2);
    }
    let denied = store.spend_all(&k, &login, lock).await.unwrap();
    assert_eq!(denied[0].count, 3);
    assert!(
        denied[0].reset > Duration::from_secs(3590),
        "{:?}",
        denied[0].reset
    );
    let first = pttl(&mut con, "tpw:login{ip}:lock");
    assert!((3_590_000..=3_600_000).contains(&first), "{first}");
    // Even once the window is gone, the lockout holds, and is not extended.
    let _: () = redis::cmd("DEL")
        .arg("tpw:login{ip}")
        .query(&mut con)
        .unwrap();
    let still = store.spend_all(&k, &login, lock).await.unwrap();
    assert_eq!(still[0].count, 3);
    assert!(pttl(&mut con, "tpw:login{ip}:lock") <= first);
    assert_eq!(
        pttl(&mut con, "tpw:login{ip}"),
        -2,
        "a denied request spends nothing"
    );
    // A reset lifts it.
    assert!(store.reset("login", &k).await.unwrap());
    assert_eq!(pttl(&mut con, "tpw:login{ip}:lock"), -2);
    assert_eq!(store.spend_all(&k, &login, lock).await.unwrap()[0].count, 1);
    // A corrupt counter is an error and left as it is.
    set(&mut con, "tpw:bad{ip}", "abc");
    let err = store
        .spend_all(&k, &[counter("bad", 5, 60)], Spend::cost(1))
        .await
        .unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    set_px(&mut con, "tpw:bad2{ip}", "x1", 60_000);
    let d: u64 = redis::cmd("PEXPIRETIME")
        .arg("tpw:bad2{ip}")
        .query(&mut con)
        .unwrap();
    let hit = Hit {
        count: 1,
        reset: Duration::from_millis(10),
        deadline: std::num::NonZeroU64::new(d),
    };
    for amend in [Amend::Refund(1), Amend::Charge(1), Amend::Clear] {
        let err = store.amend("bad2", &k, &hit, amend).await.unwrap_err();
        assert!(err.is_corrupt(), "{err}");
    }
    let value: String = redis::cmd("GET")
        .arg("tpw:bad2{ip}")
        .query(&mut con)
        .unwrap();
    assert_eq!(value, "x1");
    let value: String = redis::cmd("GET")
        .arg("tpw:bad{ip}")
        .query(&mut con)
        .unwrap();
    assert_eq!(value, "abc");
}

/// Concurrent spends of varied costs on one key: the admitted costs add
/// up to no more than the limit, and to exactly the stored count.
async fn concurrent_spends_are_exact<C>(
    store: RedisBackend<C>,
    read: impl Fn() -> u64,
) -> (u64, u64)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let limit = 1_000;
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let cost = 1 + i % 7;
                let hits = store
                    .spend_all(
                        &Key::new("hot"),
                        &[counter("x", limit, 60)],
                        Spend::cost(cost),
                    )
                    .await
                    .unwrap();
                if hits[0].deadline.is_some() { cost } else { 0 }
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let stored = read();
    assert!(admitted <= limit, "admitted {admitted} > {limit}");
    assert_eq!(admitted, stored, "admitted {admitted}, stored {stored}");
    (admitted, stored)
}

async fn concurrent_spends_of_varied_costs_are_exact() {
    let server = redis_or_skip!(RedisServer::start(
        "concurrent_spends_of_varied_costs_are_exact"
    ));
    let store = backend(&server).await;
    let (admitted, stored) = concurrent_spends_are_exact(store, || {
        let mut con = server.sync();
        redis::cmd("GET").arg("tpw:x{hot}").query(&mut con).unwrap()
    })
    .await;
    eprintln!(
        "standalone: 400 spends of costs 1..=7 on a limit of 1000: admitted {admitted}, stored {stored}"
    );
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
fn main() {
    let mut trials = vec![
        trial::current(
            "a_counter_of_the_previous_release_keeps_working",
            Needs::Redis,
            a_counter_of_the_previous_release_keeps_working,
        ),
        trial::current(
            "spends_are_all_or_nothing_with_lockouts_and_amends",
            Needs::Redis,
            spends_are_all_or_nothing_with_lockouts_and_amends,
        ),
        trial::multi(
            "concurrent_spends_of_varied_costs_are_exact",
            Needs::Redis,
            concurrent_spends_of_varied_costs_are_exact,
        ),
        trial::current(
            "a_refund_after_a_reset_never_takes_the_new_windows_hit",
            Needs::Redis,
            a_refund_after_a_reset_never_takes_the_new_windows_hit,
        ),
        trial::current(
            "the_window_is_pinned_and_denials_carry_retry_after",
            Needs::Redis,
            the_window_is_pinned_and_denials_carry_retry_after,
        ),
        trial::current(
            "a_counter_without_a_lifetime_is_healed_not_reset",
            Needs::Redis,
            a_counter_without_a_lifetime_is_healed_not_reset,
        ),
        trial::current(
            "corrupt_counters_stop_requests_and_are_left_untouched",
            Needs::Redis,
            corrupt_counters_stop_requests_and_are_left_untouched,
        ),
        trial::multi(
            "script_flush_in_the_middle_of_traffic_fails_no_request",
            Needs::Redis,
            script_flush_in_the_middle_of_traffic_fails_no_request,
        ),
        trial::multi(
            "an_outage_follows_the_policy_and_limiting_resumes_by_itself",
            Needs::Redis,
            an_outage_follows_the_policy_and_limiting_resumes_by_itself,
        ),
        trial::multi(
            "insurance_decides_while_redis_is_out_and_hands_back",
            Needs::Redis,
            insurance_decides_while_redis_is_out_and_hands_back,
        ),
        trial::current(
            "hits_dropped_before_they_are_polled_leave_their_lane_working",
            Needs::Redis,
            hits_dropped_before_they_are_polled_leave_their_lane_working,
        ),
        trial::multi(
            "killed_clients_and_dropped_requests_leave_no_key_without_a_lifetime",
            Needs::Redis,
            killed_clients_and_dropped_requests_leave_no_key_without_a_lifetime,
        ),
        trial::current(
            "the_audit_finds_and_repairs_keys_without_a_lifetime",
            Needs::Redis,
            the_audit_finds_and_repairs_keys_without_a_lifetime,
        ),
        trial::current(
            "corrupt_records_of_slots_of_every_shape_are_left_as_they_are",
            Needs::Redis,
            corrupt_records_of_slots_of_every_shape_are_left_as_they_are,
        ),
        trial::current(
            "an_extend_of_many_keys_is_one_call",
            Needs::Redis,
            an_extend_of_many_keys_is_one_call,
        ),
        trial::current(
            "the_audit_reports_and_repairs_records_of_slots_without_a_lifetime",
            Needs::Redis,
            the_audit_reports_and_repairs_records_of_slots_without_a_lifetime,
        ),
        trial::current(
            "denied_keys_are_answered_locally_until_their_window_closes",
            Needs::Redis,
            denied_keys_are_answered_locally_until_their_window_closes,
        ),
        trial::current(
            "peek_of_a_counter_without_a_lifetime_never_resets",
            Needs::Redis,
            peek_of_a_counter_without_a_lifetime_never_resets,
        ),
        trial::current(
            "a_multiplexed_connection_serves_too",
            Needs::Redis,
            a_multiplexed_connection_serves_too,
        ),
        trial::current(
            "several_quotas_are_counted_in_redis_together",
            Needs::Redis,
            several_quotas_are_counted_in_redis_together,
        ),
        trial::current(
            "client_chosen_keys_reach_no_other_layers_or_quotas_counter",
            Needs::Redis,
            client_chosen_keys_reach_no_other_layers_or_quotas_counter,
        ),
        trial::current(
            "limits_are_one_hash_per_layer_and_a_wrong_type_is_corrupt",
            Needs::Redis,
            limits_are_one_hash_per_layer_and_a_wrong_type_is_corrupt,
        ),
        trial::current(
            "refunds_of_deny_cache_answers_send_nothing",
            Needs::Redis,
            refunds_of_deny_cache_answers_send_nothing,
        ),
        trial::current(
            "prefixes_with_braces_are_refused_and_the_audit_still_matches",
            Needs::Redis,
            prefixes_with_braces_are_refused_and_the_audit_still_matches,
        ),
        trial::multi(
            "a_backend_connecting_in_the_background_starts_during_an_outage",
            Needs::Redis,
            a_backend_connecting_in_the_background_starts_during_an_outage,
        ),
        trial::multi(
            "the_breaker_answers_at_once_during_an_outage_and_closes_after",
            Needs::Redis,
            the_breaker_answers_at_once_during_an_outage_and_closes_after,
        ),
        trial::multi(
            "a_store_that_stops_answering_opens_the_breaker_on_timeouts",
            Needs::Redis,
            a_store_that_stops_answering_opens_the_breaker_on_timeouts,
        ),
        trial::current(
            "clients_that_give_up_their_requests_never_open_the_breaker",
            Needs::Redis,
            clients_that_give_up_their_requests_never_open_the_breaker,
        ),
        trial::current(
            "a_bad_url_is_a_configuration_error",
            Needs::Nothing,
            a_bad_url_is_a_configuration_error,
        ),
        trial::current(
            "breaker_settings_are_checked",
            Needs::Nothing,
            breaker_settings_are_checked,
        ),
        trial::trial(
            "coalesced_hits_take_every_count_once_across_four_instances",
            Needs::Redis,
            coalesced_hits_take_every_count_once_across_four_instances,
        ),
        trial::multi(
            "a_frozen_server_holds_at_most_two_calls_per_lane",
            Needs::Redis,
            a_frozen_server_holds_at_most_two_calls_per_lane,
        ),
        trial::current(
            "a_mixed_batch_of_healthy_corrupt_and_ttl_less_keys",
            Needs::Redis,
            a_mixed_batch_of_healthy_corrupt_and_ttl_less_keys,
        ),
        trial::current(
            "dropped_futures_inside_a_batch_leave_no_key_without_a_lifetime",
            Needs::Redis,
            dropped_futures_inside_a_batch_leave_no_key_without_a_lifetime,
        ),
        trial::multi(
            "script_flush_and_a_restart_in_the_middle_of_batches",
            Needs::Redis,
            script_flush_and_a_restart_in_the_middle_of_batches,
        ),
        trial::trial(
            "the_batch_script_attaches_a_lifetime_only_where_there_is_none",
            Needs::Redis,
            the_batch_script_attaches_a_lifetime_only_where_there_is_none,
        ),
        trial::trial(
            "the_batch_script_refuses_bad_arguments_and_writes_nothing_for_them",
            Needs::Redis,
            the_batch_script_refuses_bad_arguments_and_writes_nothing_for_them,
        ),
    ];
    // The backend contract, on one shared server, each scenario under its
    // own prefix: without the deny cache, and with it (denials answered
    // locally are not counted, and never refunded).
    let server = Shared::new(|| RedisServer::start("contract"));
    for (name, deny_cache) in [("contract", 0), ("contract_deny_cache", 1024)] {
        let server = server.clone();
        let store = RedisStore::new(deny_cache, move || {
            let server = server.clone();
            async move { manager(server.get()).await }
        });
        let store = Arc::new(store);
        trials.extend(trial::contract(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_leases(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_heeds(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_limits(name, Needs::Redis, store));
    }
    // The lease scenarios on the single-call path too: takes and
    // give-backs are coalesced by default, one call a step without.
    let single = RedisStore::new(0, {
        let server = server.clone();
        move || {
            let server = server.clone();
            async move { manager(server.get()).await }
        }
    })
    .single_calls();
    trials.extend(trial::contract_leases(
        "contract_single",
        Needs::Redis,
        Arc::new(single),
    ));
    trial::run(trials, server)
}
