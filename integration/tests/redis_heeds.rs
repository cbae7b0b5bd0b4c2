//! The provider's word (`Heeding`) through the Redis backend, against a
//! real redis-server that the harness starts: what only Redis does beside
//! the contract's scenarios (run in `redis.rs`, `redis_cluster.rs`,
//! `redis_sentinel.rs`): the scripts move only what they say, on the
//! server's clock, refuse bad arguments with nothing written, and a close
//! is held in the closing instance's deny cache.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::time::Duration;

use redis::aio::ConnectionManager;
use support::redis::RedisServer;
use tower_pinned_window::backend::{BackendError, Counter, Heeding, Spend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, Window};
use tower_pinned_window_redis::RedisBackend;
use trial::Needs;

fn counter(limit: u64, secs: u64) -> Counter<'static> {
    Counter {
        namespace: "n",
        quota: Quota::new(limit, Duration::from_secs(secs)).unwrap(),
        lowers: false,
    }
}

fn window(ms: u64) -> Window {
    Window::new(Duration::from_millis(ms)).unwrap()
}

async fn manager(server: &RedisServer) -> ConnectionManager {
    server.client().get_connection_manager().await.unwrap()
}

fn query<T: redis::FromRedisValue>(con: &mut redis::Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(con).unwrap()
}

/// The counter of `key` under `n`, and its lockout, as the backend names
/// them (prefix `tpw:`).
fn keys(key: &str) -> (String, String) {
    (format!("tpw:n{{{key}}}"), format!("tpw:n{{{key}}}:lock"))
}

/// A close touches the lockout only: the counter keeps its value and its
/// deadline; the lockout's end is the server's clock plus the span, moved
/// later and never sooner, its value (when a spend set it) kept.
async fn a_close_moves_only_the_lockout_and_only_later() {
    let server = redis_or_skip!(RedisServer::start(
        "a_close_moves_only_the_lockout_and_only_later"
    ));
    let mut con = server.sync();
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let (stored, lock) = keys("k");
    let _: () = query(&mut con, &["SET", &stored, "5", "PX", "60000"]);
    let deadline: i64 = query(&mut con, &["PEXPIRETIME", &stored]);
    let key = Key::new("k");

    let left = store.close("n", &key, window(30_000)).await.unwrap();
    assert_eq!(
        left,
        Duration::from_secs(30),
        "a new lockout: the whole span"
    );
    let ends: i64 = query(&mut con, &["PEXPIRETIME", &lock]);
    let set_at: i64 = query(&mut con, &["GET", &lock]);
    assert_eq!(
        ends - set_at,
        30_000,
        "set at the server's time, for the span"
    );
    assert_eq!(query::<String>(&mut con, &["GET", &stored]), "5");
    assert_eq!(
        query::<i64>(&mut con, &["PEXPIRETIME", &stored]),
        deadline,
        "the counter's window is not touched"
    );

    let shorter = store.close("n", &key, window(1_000)).await.unwrap();
    assert!(shorter > Duration::from_secs(29), "{shorter:?}");
    assert_eq!(
        query::<i64>(&mut con, &["PEXPIRETIME", &lock]),
        ends,
        "never sooner"
    );
    let longer = store.close("n", &key, window(90_000)).await.unwrap();
    assert_eq!(longer, Duration::from_secs(90));
    let moved: i64 = query(&mut con, &["PEXPIRETIME", &lock]);
    assert!(moved >= ends + 60_000, "moved later: {ends} then {moved}");
    assert_eq!(
        query::<i64>(&mut con, &["GET", &lock]),
        set_at,
        "moved, not set again"
    );
    // A key of no counter: a lockout, and still no counter.
    let (none, none_lock) = keys("none");
    store
        .close("n", &Key::new("none"), window(5_000))
        .await
        .unwrap();
    assert_eq!(query::<i64>(&mut con, &["EXISTS", &none]), 0);
    assert!(query::<i64>(&mut con, &["PTTL", &none_lock]) > 4_000);
}

/// A counter that is not one fails a close, which then creates no lockout;
/// the value is left as it is, whatever its type.
async fn a_close_on_a_corrupt_counter_writes_nothing() {
    let server = redis_or_skip!(RedisServer::start(
        "a_close_on_a_corrupt_counter_writes_nothing"
    ));
    let mut con = server.sync();
    let store = RedisBackend::new(manager(&server).await);
    let (text, text_lock) = keys("text");
    let (hash, hash_lock) = keys("hash");
    let _: () = query(&mut con, &["SET", &text, "12abc"]);
    let _: () = query(&mut con, &["HSET", &hash, "f", "1"]);
    for (key, lock, detail) in [
        ("text", &text_lock, "value 12abc"),
        ("hash", &hash_lock, "a key of type hash"),
    ] {
        match store.close("n", &Key::new(key), window(60_000)).await {
            Err(BackendError::Corrupt {
                key: named,
                detail: said,
            }) => {
                assert_eq!(said, detail, "{key}");
                assert_eq!(named, format!("tpw:n{{{key}}}"), "named by the counter");
            }
            other => panic!("{key}: {other:?}"),
        }
        assert_eq!(
            query::<i64>(&mut con, &["EXISTS", lock]),
            0,
            "{key}: no lockout"
        );
    }
    assert_eq!(query::<String>(&mut con, &["GET", &text]), "12abc");
    assert_eq!(query::<String>(&mut con, &["TYPE", &hash]), "hash");
    assert_eq!(
        query::<i64>(&mut con, &["PTTL", &text]),
        -1,
        "no lifetime given"
    );
}

/// A raise writes the count with its lifetime in one step: a counter older
/// code left without a lifetime gets the shorter window, a count charged
/// past the limit stays, and one of another type is left as it is.
async fn a_raise_writes_the_count_and_its_lifetime_together() {
    let server = redis_or_skip!(RedisServer::start(
        "a_raise_writes_the_count_and_its_lifetime_together"
    ));
    let mut con = server.sync();
    let store = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let (old, _) = keys("old");
    let _: () = query(&mut con, &["SET", &old, "3"]);
    let raised = store
        .raise(&Key::new("old"), counter(10, 60), 5, window(2_000))
        .await
        .unwrap();
    assert_eq!((raised.count, raised.reset), (5, Duration::from_secs(2)));
    let expiry: i64 = query(&mut con, &["PEXPIRETIME", &old]);
    assert_eq!(raised.deadline.map(|d| d.get() as i64), Some(expiry));
    assert_eq!(query::<String>(&mut con, &["GET", &old]), "5");

    let (over, _) = keys("over");
    let _: () = query(&mut con, &["SET", &over, "12", "PX", "60000"]);
    let deadline: i64 = query(&mut con, &["PEXPIRETIME", &over]);
    let kept = store
        .raise(&Key::new("over"), counter(10, 60), 11, window(2_000))
        .await
        .unwrap();
    assert_eq!(kept.count, 12, "never lowered");
    assert_eq!(kept.deadline.map(|d| d.get() as i64), Some(deadline));
    assert_eq!(query::<i64>(&mut con, &["PEXPIRETIME", &over]), deadline);

    // Exact past 2^53: counts are compared as text.
    let (big, _) = keys("big");
    let near = "9007199254740993";
    let _: () = query(&mut con, &["SET", &big, near, "PX", "60000"]);
    let at_most = counter(u64::MAX, 60);
    let same = store
        .raise(
            &Key::new("big"),
            at_most,
            9_007_199_254_740_992,
            window(2_000),
        )
        .await
        .unwrap();
    assert_eq!(same.count, 9_007_199_254_740_993);
    let more = store
        .raise(&Key::new("big"), at_most, u64::MAX, window(2_000))
        .await
        .unwrap();
    assert_eq!(more.count, i64::MAX as u64, "the most a counter holds");
    assert_eq!(
        query::<String>(&mut con, &["GET", &big]),
        i64::MAX.to_string()
    );

    let (list, _) = keys("list");
    let _: () = query(&mut con, &["RPUSH", &list, "x"]);
    match store
        .raise(&Key::new("list"), counter(10, 60), 4, window(2_000))
        .await
    {
        Err(BackendError::Corrupt { detail, .. }) => assert_eq!(detail, "a key of type list"),
        other => panic!("{other:?}"),
    }
    assert_eq!(query::<String>(&mut con, &["TYPE", &list]), "list");
    assert_eq!(query::<i64>(&mut con, &["PTTL", &list]), -1);
}

/// The scripts on their own, with arguments the backend never sends: each
/// is refused, and nothing is written.
fn the_scripts_of_the_providers_word_refuse_bad_arguments() {
    let server = redis_or_skip!(RedisServer::start(
        "the_scripts_of_the_providers_word_refuse_bad_arguments"
    ));
    let mut con = server.sync();
    let close = include_str!("../../redis/src/close.lua");
    let raise = include_str!("../../redis/src/raise.lua");
    let (stored, lock) = keys("k");
    for span in ["0", "-1", "1.5", "abc", "", "1e3", "9007199254740992"] {
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(close)
            .arg(2)
            .arg(&stored)
            .arg(&lock)
            .arg(span)
            .query(&mut con);
        let err = reply.expect_err(span);
        assert!(err.to_string().contains("invalid close"), "{span:?}: {err}");
    }
    let good = ["3", "10", "60000", "1000"];
    for (place, bad) in [
        (0, "01"),
        (0, "-1"),
        (0, "18446744073709551616"),
        (0, "3.0"),
        (1, "0"),
        (1, "+10"),
        (2, "0"),
        (2, "x"),
        (3, "0"),
        (3, "1.5"),
    ] {
        let mut args = good;
        args[place] = bad;
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(raise)
            .arg(1)
            .arg(&stored)
            .arg(&args[..])
            .query(&mut con);
        let err = reply.expect_err(bad);
        assert!(err.to_string().contains("invalid raise"), "{args:?}: {err}");
    }
    let reply: redis::Value = redis::cmd("EVAL")
        .arg(raise)
        .arg(1)
        .arg(&stored)
        .arg(&good[..])
        .query(&mut con)
        .unwrap();
    assert!(
        matches!(&reply, redis::Value::Array(items) if items.len() == 3),
        "good arguments: {reply:?}"
    );
    let _: () = query(&mut con, &["DEL", &stored]);
    assert_eq!(query::<i64>(&mut con, &["DBSIZE"]), 0, "nothing written");
}

/// The closing instance holds the lockout in its deny cache until its end:
/// its spends are refused with no round trip, while an instance without
/// the cache asks Redis.
async fn a_close_is_held_in_the_closing_instances_deny_cache() {
    let server = redis_or_skip!(RedisServer::start(
        "a_close_is_held_in_the_closing_instances_deny_cache"
    ));
    let mut con = server.sync();
    let cached = RedisBackend::new(manager(&server).await);
    let uncached = RedisBackend::builder(manager(&server).await)
        .deny_cache(0)
        .build();
    let key = Key::new("k");
    let left = cached.close("n", &key, window(60_000)).await.unwrap();
    let (_, lock) = keys("k");
    // Lifted behind the instance's back: only Redis knows.
    let _: () = query(&mut con, &["DEL", &lock]);
    let here = cached
        .spend_all(&key, &[counter(10, 60)], Spend::cost(1))
        .await
        .unwrap()[0];
    assert!(here.count > 10 && here.deadline.is_none(), "refused here");
    assert!(here.reset <= left && here.reset > left - Duration::from_secs(2));
    let there = uncached
        .spend_all(&key, &[counter(10, 60)], Spend::cost(1))
        .await
        .unwrap()[0];
    assert_eq!(there.count, 1, "Redis has no lockout");
}

fn main() {
    let trials = vec![
        trial::current(
            "a_close_moves_only_the_lockout_and_only_later",
            Needs::Redis,
            a_close_moves_only_the_lockout_and_only_later,
        ),
        trial::current(
            "a_close_on_a_corrupt_counter_writes_nothing",
            Needs::Redis,
            a_close_on_a_corrupt_counter_writes_nothing,
        ),
        trial::current(
            "a_raise_writes_the_count_and_its_lifetime_together",
            Needs::Redis,
            a_raise_writes_the_count_and_its_lifetime_together,
        ),
        trial::trial(
            "the_scripts_of_the_providers_word_refuse_bad_arguments",
            Needs::Redis,
            the_scripts_of_the_providers_word_refuse_bad_arguments,
        ),
        trial::current(
            "a_close_is_held_in_the_closing_instances_deny_cache",
            Needs::Redis,
            a_close_is_held_in_the_closing_instances_deny_cache,
        ),
    ];
    trial::run(trials, ())
}
