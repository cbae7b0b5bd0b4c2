//! The PostgreSQL backend against a real PostgreSQL: the machine's server,
//! one schema per test, and private servers for the tests that crash one.
//! The backend contract runs here (`contract::*`, `contract_deny_cache::*`);
//! the other tests are what only PostgreSQL does: SQL, constraints, the
//! cleaner, migrations, connections and crashes.

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use http::{Request, StatusCode};
use stores::postgres::PostgresStore;
use support::http::{by_client, from, ok_service};
use support::postgres::{PgServer, TestSchema, connect, pool};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::Held as HeldSlot;
use tower_pinned_window::backend::Hit;
use tower_pinned_window::backend::{
    Backend, BackendError, Cap, Leasing, LimitScope, Limits, SlotId, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{ConfigError, Decision, FailurePolicy, Quota, RateLimitLayer, Window};
use tower_pinned_window_postgres::PostgresBackend;
use trial::Needs;

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).unwrap()
}

/// The row as the table holds it: count and expires_at.
async fn row(schema: &TestSchema, namespace: &str, key: &str) -> Option<(i64, SystemTime)> {
    schema
        .client
        .query_opt(
            &format!(
                "SELECT count, expires_at FROM {} WHERE namespace = $1 AND key = $2",
                schema.table()
            ),
            &[&namespace, &key.as_bytes()],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// The `blocked_until` of the test table's one row.
async fn blocked_until(schema: &TestSchema) -> SystemTime {
    schema
        .client
        .query_one(
            &format!("SELECT blocked_until FROM {}", schema.table()),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn rows(schema: &TestSchema) -> i64 {
    schema
        .client
        .query_one(&format!("SELECT count(*) FROM {}", schema.table()), &[])
        .await
        .unwrap()
        .get(0)
}

async fn the_window_is_pinned_and_denials_carry_retry_after() {
    let schema = pg_or_skip!(TestSchema::create("pinned").await);
    let store = schema.backend().await;
    let svc = RateLimitLayer::new("login", quota(3, Duration::from_secs(60)))
        .key(by_client())
        .backend(store)
        .layer(ok_service());

    let res = svc.clone().oneshot(from("alice")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], "\"login\";r=2;t=60");
    let (count, deadline) = row(&schema, "login", "alice").await.unwrap();
    assert_eq!(count, 1);
    let left = deadline.duration_since(SystemTime::now()).unwrap();
    assert!(
        left > Duration::from_secs(58) && left <= Duration::from_secs(61),
        "{left:?}"
    );

    tokio::time::sleep(Duration::from_millis(50)).await;
    svc.clone().oneshot(from("alice")).await.unwrap();
    svc.clone().oneshot(from("alice")).await.unwrap();
    let denied = svc.clone().oneshot(from("alice")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers()["retry-after"],
        "60",
        "59.9 s left rounds up"
    );
    assert_eq!(denied.headers()["ratelimit"], "\"login\";r=0;t=60");
    assert_eq!(denied.extensions().get::<Decision>().unwrap().count(), 4);
    assert_eq!(
        row(&schema, "login", "alice").await,
        Some((4, deadline)),
        "later hits count, and never move the deadline"
    );
    let other = svc.clone().oneshot(from("bob")).await.unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another key, its own budget"
    );
}

async fn a_closed_window_starts_over_at_one_with_a_new_deadline() {
    let schema = pg_or_skip!(TestSchema::create("closed_window").await);
    let store = schema.backend().await;
    let q = quota(2, Duration::from_millis(200));
    let key = Key::new("k");
    let first = store.hit("n", &key, q).await.unwrap();
    assert_eq!(first.count, 1);
    assert!(first.reset <= Duration::from_millis(200) && first.reset > Duration::from_millis(100));
    let (_, opened) = row(&schema, "n", "k").await.unwrap();
    assert_eq!(store.hit("n", &key, q).await.unwrap().count, 2);
    assert_eq!(
        store.hit("n", &key, q).await.unwrap().count,
        3,
        "over the limit, still counted"
    );
    assert_eq!(row(&schema, "n", "k").await.unwrap().1, opened);

    tokio::time::sleep(Duration::from_millis(250)).await;
    let hit = store.hit("n", &key, q).await.unwrap();
    assert_eq!(hit.count, 1, "a new window");
    assert!(hit.reset <= Duration::from_millis(200) && hit.reset > Duration::from_millis(100));
    let (count, reopened) = row(&schema, "n", "k").await.unwrap();
    assert_eq!(count, 1);
    assert!(
        reopened >= opened + Duration::from_millis(200),
        "the new window opens with the hit that found the old one closed"
    );
    assert_eq!(rows(&schema).await, 1, "the same row, reused");
}

async fn sub_millisecond_windows_round_up_and_the_bound_is_held() {
    let schema = pg_or_skip!(TestSchema::create("rounding").await);
    let store = schema.backend().await;
    // The statement that opens a window reads the clock once: the time left
    // it reports is the window, to the microsecond.
    let q = Quota::new(5, Duration::from_micros(1_500)).unwrap();
    let hit = store.hit("n", &Key::new("round"), q).await.unwrap();
    assert_eq!(hit.reset, Duration::from_millis(2), "1.5 ms rounds up to 2");

    let longest = Quota::with_window(std::num::NonZeroU64::MIN, Window::MAX);
    let hit = store.hit("n", &Key::new("long"), longest).await.unwrap();
    assert_eq!(hit.reset, Window::MAX.as_duration());
    assert_eq!(
        store
            .hit("n", &Key::new("long"), longest)
            .await
            .unwrap()
            .count,
        2
    );
    assert!(
        store.audit(None).await.unwrap().is_clean(),
        "a window at the bound is not corrupt"
    );
}

async fn killed_connections_and_dropped_futures_count_no_hit_twice() {
    let schema = pg_or_skip!(TestSchema::create("killed").await);
    let store = schema.backend().await;
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..8u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Per key: (hits sent, hits answered Ok).
            let mut sent = vec![(0u32, 0u32); 20];
            for i in 0..400u32 {
                let slot = (i % 20) as usize;
                let key = Key::display(format_args!("w{worker}-{slot}"));
                let hit = store.hit("crash", &key, quota(1_000, Duration::from_secs(600)));
                sent[slot].0 += 1;
                let answered = if i % 3 == 0 {
                    // Dropped mid-flight, like a request whose client went away.
                    tokio::time::timeout(Duration::from_micros(100), hit)
                        .await
                        .ok()
                } else {
                    Some(hit.await)
                };
                if let Some(Ok(hit)) = answered {
                    sent[slot].1 += 1;
                    assert!(
                        hit.count <= u64::from(sent[slot].0),
                        "counted twice: {hit:?}"
                    );
                }
            }
            sent
        }));
    }
    let killer = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut killed = 0;
            while !done.load(Ordering::Relaxed) {
                killed += schema.kill_connections().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (schema, killed)
        })
    };
    let mut sent = Vec::new();
    for task in tasks {
        sent.push(task.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    let (schema, killed) = killer.await.unwrap();
    assert!(killed > 0, "the test killed no connection");

    let (mut ok_total, mut with_rows) = (0, 0);
    for (worker, per_key) in sent.iter().enumerate() {
        for (slot, (hits, ok)) in per_key.iter().enumerate() {
            ok_total += ok;
            let key = format!("w{worker}-{slot}");
            let Some((count, expires_at)) = row(&schema, "crash", &key).await else {
                assert_eq!(*ok, 0, "{key}: no row after {ok} counted hits");
                continue;
            };
            with_rows += 1;
            assert!(
                i64::from(*ok) <= count && count <= i64::from(*hits),
                "{key}: {count} counted, {ok} answered, {hits} sent"
            );
            let left = expires_at.duration_since(SystemTime::now()).unwrap();
            assert!(
                left <= Duration::from_secs(600),
                "{key}: deadline {left:?} away"
            );
        }
    }
    eprintln!("{killed} connections killed; {ok_total} of 3,200 hits answered");
    // The point is the counts above; this only checks that traffic went
    // through between the kills (about 1,000 answered here).
    assert!(
        ok_total >= 100,
        "traffic went through: {ok_total} hits answered"
    );
    let report = schema.backend().await.audit(None).await.unwrap();
    assert_eq!(report.scanned, with_rows);
    assert!(report.is_clean(), "{report:?}");
}

async fn a_crashed_database_recovers_by_itself_and_unlogged_counters_are_lost() {
    let mut server = pg_or_skip!(PgServer::start("crash_recovery"));
    let url = server.url();
    let logged = PostgresBackend::builder(pool(&url, "crash-logged", 4))
        .table("logged")
        .build();
    let unlogged = PostgresBackend::builder(pool(&url, "crash-unlogged", 4))
        .table("unlogged")
        .unlogged(true)
        .build();
    logged.migrate().await.unwrap();
    unlogged.migrate().await.unwrap();
    let q = quota(1_000, Duration::from_secs(600));
    let key = Key::new("user");
    let svc = RateLimitLayer::new("traffic", q)
        .backend(logged.clone())
        .timeout(Window::new(Duration::from_secs(2)).unwrap())
        .layer(ok_service());

    // Traffic runs on its own task through the crash and the restart.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, unavailable) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let traffic = {
        let (svc, stop, ok, unavailable) =
            (svc.clone(), stop.clone(), ok.clone(), unavailable.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match svc
                    .clone()
                    .oneshot(Request::new(String::new()))
                    .await
                    .unwrap()
                    .status()
                {
                    StatusCode::OK => ok.fetch_add(1, Ordering::Relaxed),
                    StatusCode::SERVICE_UNAVAILABLE => unavailable.fetch_add(1, Ordering::Relaxed),
                    other => panic!("{other}"),
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for _ in 0..5 {
        logged.hit("direct", &key, q).await.unwrap();
        unlogged.hit("direct", &key, q).await.unwrap();
    }
    while ok.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    server.crash();
    assert!(logged.hit("direct", &key, q).await.is_err(), "down");
    let failed_before = unavailable.load(Ordering::Relaxed);
    server.restart();

    // Recovers by itself: same backends, same pools, no call to reconnect.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let after = loop {
        match logged.hit("direct", &key, q).await {
            Ok(hit) => break hit,
            Err(err) => {
                assert!(std::time::Instant::now() < deadline, "no recovery: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(
        after.count, 6,
        "the logged table kept its count through the crash"
    );
    let ok_at_restart = ok.load(Ordering::Relaxed);
    while ok.load(Ordering::Relaxed) < ok_at_restart + 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "traffic did not resume"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();
    assert!(
        unavailable.load(Ordering::Relaxed) >= failed_before,
        "requests during the outage were answered 503"
    );
    let traffic_count = logged
        .peek("traffic", &Key::new("*"))
        .await
        .unwrap()
        .unwrap()
        .count;
    assert!(
        traffic_count >= ok.load(Ordering::Relaxed)
            && traffic_count <= ok.load(Ordering::Relaxed) + unavailable.load(Ordering::Relaxed),
        "{traffic_count} counted, {} passed, {} failed",
        ok.load(Ordering::Relaxed),
        unavailable.load(Ordering::Relaxed)
    );

    let hit = unlogged.hit("direct", &key, q).await.unwrap();
    assert_eq!(
        hit.count, 1,
        "an unlogged table is emptied by a crash: a fresh window"
    );
}

/// Drop the table's constraints, so a test can write rows no hit may count.
async fn without_constraints(schema: &TestSchema) {
    let table = schema.table();
    schema
        .client
        .batch_execute(&format!(
            "ALTER TABLE {table} DROP CONSTRAINT tpw_counters_count_check; \
             ALTER TABLE {table} DROP CONSTRAINT tpw_counters_expires_at_check; \
             ALTER TABLE {table} ALTER COLUMN count DROP NOT NULL; \
             ALTER TABLE {table} ALTER COLUMN expires_at DROP NOT NULL"
        ))
        .await
        .unwrap();
}

/// The row's text and its xmin: equal before and after means untouched.
async fn raw(schema: &TestSchema, key: &str) -> (String, String) {
    let row = schema
        .client
        .query_one(
            &format!(
                "SELECT c::text, xmin::text FROM {} c WHERE namespace = 'n' AND key = $1",
                schema.table()
            ),
            &[&key.as_bytes()],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

async fn the_constraints_refuse_impossible_rows() {
    let schema = pg_or_skip!(TestSchema::create("constraints").await);
    schema.backend().await;
    for (case, values) in [
        ("zero-less count", "-1, now() + interval '1 minute'"),
        ("no count", "NULL, now() + interval '1 minute'"),
        ("no expiry", "1, NULL"),
        ("infinite expiry", "1, 'infinity'"),
    ] {
        let err = schema
            .client
            .execute(
                &format!("INSERT INTO {} VALUES ('n', 'k', {values})", schema.table()),
                &[],
            )
            .await
            .unwrap_err();
        assert!(
            err.as_db_error()
                .is_some_and(|e| e.code().code().starts_with("23")),
            "{case}: {err}"
        );
    }
}

async fn corrupt_rows_stop_requests_and_are_left_untouched() {
    let schema = pg_or_skip!(TestSchema::create("corrupt").await);
    let store = schema.backend().await;
    without_constraints(&schema).await;
    let table = schema.table();
    let cases = [
        (
            "negative",
            "-3, now() + interval '1 minute'",
            "negative count -3",
        ),
        (
            "negative-expired",
            "-3, now() - interval '1 minute'",
            "negative count -3",
        ),
        (
            "null-count",
            "NULL, now() + interval '1 minute'",
            "count is NULL",
        ),
        ("no-expiry", "7, NULL", "no expiry"),
        ("infinite", "7, 'infinity'", "past the"),
        ("far", "7, now() + interval '200 years'", "past the"),
        (
            "full",
            "9223372036854775807, now() + interval '1 minute'",
            "cannot grow",
        ),
    ];
    for (key, values, _) in &cases {
        schema
            .client
            .execute(
                &format!("INSERT INTO {table} VALUES ('n', '{key}', {values})"),
                &[],
            )
            .await
            .unwrap();
    }
    let open = RateLimitLayer::new("n", quota(10, Duration::from_secs(60)))
        .key(by_client())
        .backend(store.clone())
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    for (key, _, detail) in &cases {
        let before = raw(&schema, key).await;
        match store
            .hit("n", &Key::new(*key), quota(10, Duration::from_secs(60)))
            .await
        {
            Err(BackendError::Corrupt {
                key: named,
                detail: got,
            }) => {
                assert!(named.contains(key), "{key}: {named}");
                assert!(got.contains(detail), "{key}: {got}");
            }
            other => panic!("{key}: {other:?}"),
        }
        assert!(
            matches!(
                store.peek("n", &Key::new(*key)).await,
                Err(BackendError::Corrupt { .. })
            ),
            "{key}: peek"
        );
        let res = open.clone().oneshot(from(key)).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{key}: 500 even failing open"
        );
        assert_eq!(
            raw(&schema, key).await,
            before,
            "{key}: the row was written"
        );
    }

    // Nothing removes them but a reset: not the cleaner, not the audit.
    assert_eq!(
        store
            .clean_expired(NonZeroU32::new(100).unwrap())
            .await
            .unwrap(),
        0
    );
    let report = store.audit(None).await.unwrap();
    let named = |keys: &[&str]| -> Vec<String> {
        let mut names: Vec<String> = keys
            .iter()
            .map(|key| format!("{table} n{{{key}}}"))
            .collect();
        names.sort();
        names
    };
    // Every row no hit may count is listed: a bad count as corrupt, a bad
    // deadline as without a lifetime.
    let mut found: Vec<String> = report
        .corrupt
        .iter()
        .chain(&report.without_lifetime)
        .cloned()
        .collect();
    found.sort();
    found.dedup();
    let want: Vec<&str> = cases.iter().map(|(key, _, _)| *key).collect();
    assert_eq!(found, named(&want));
    let sorted = |names: &[String]| {
        let mut names = names.to_vec();
        names.sort();
        names
    };
    assert_eq!(
        sorted(&report.corrupt),
        named(&["full", "negative", "negative-expired", "null-count"])
    );
    assert_eq!(
        sorted(&report.without_lifetime),
        named(&["far", "infinite", "no-expiry"])
    );
    assert!(report.repaired.is_empty());
    assert!(!report.is_clean());
    assert_eq!((report.nodes, report.scanned), (1, cases.len() as u64));
}

async fn the_audit_repairs_only_rows_with_a_usable_count() {
    let schema = pg_or_skip!(TestSchema::create("audit").await);
    let store = schema.backend().await;
    store
        .hit("n", &Key::new("healthy"), quota(5, Duration::from_secs(60)))
        .await
        .unwrap();
    without_constraints(&schema).await;
    let table = schema.table();
    schema
        .client
        .batch_execute(&format!(
            "INSERT INTO {table} VALUES ('n', 'no-expiry', 40, NULL), ('n', 'infinite', 3, 'infinity'), \
             ('n', 'negative', -1, NULL), ('n', 'expired', 2, now() - interval '1 s')"
        ))
        .await
        .unwrap();
    let name = |key: &str| format!("{table} n{{{key}}}");
    let report = store.audit(None).await.unwrap();
    assert_eq!((report.scanned, report.expired), (5, 1));
    // The three rows no hit may count: all without a usable deadline, one
    // with a negative count as well.
    assert_eq!(
        report.without_lifetime,
        [name("infinite"), name("negative"), name("no-expiry")],
        "{report:?}"
    );
    assert_eq!(report.corrupt, [name("negative")]);
    assert!(report.repaired.is_empty());

    let report = store
        .audit(Some(Window::new(Duration::from_secs(30)).unwrap()))
        .await
        .unwrap();
    assert_eq!(
        report.without_lifetime,
        [name("infinite"), name("negative"), name("no-expiry")]
    );
    assert_eq!(
        report.repaired,
        [name("infinite"), name("no-expiry")],
        "only rows with a usable count"
    );
    assert_eq!(report.corrupt, [name("negative")]);
    let hit = store
        .hit(
            "n",
            &Key::new("no-expiry"),
            quota(5, Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(hit.count, 41, "counted on, never reset");
    assert!(
        hit.reset <= Duration::from_secs(30),
        "the repair's window: {:?}",
        hit.reset
    );
    let report = store.audit(None).await.unwrap();
    assert_eq!(
        (report.without_lifetime, report.corrupt),
        (vec![name("negative")], vec![name("negative")]),
        "only the negative count is left"
    );
}

async fn the_cleaner_deletes_expired_rows_in_batches_and_never_a_live_one() {
    let schema = pg_or_skip!(TestSchema::create("clean_batches").await);
    let store = schema.builder().no_cleaner().build();
    store.migrate().await.unwrap();
    let table = schema.table();
    schema
        .client
        .batch_execute(&format!(
            "INSERT INTO {table} SELECT 'n', int4send(g), 1, now() - interval '1 s' FROM generate_series(1, 2500) g; \
             INSERT INTO {table} SELECT 'n', int4send(-g), 1, now() + interval '1 h' FROM generate_series(1, 300) g"
        ))
        .await
        .unwrap();
    let batch = NonZeroU32::new(1_000).unwrap();
    let mut batches = Vec::new();
    loop {
        let deleted = store.clean_expired(batch).await.unwrap();
        batches.push(deleted);
        if deleted == 0 {
            break;
        }
    }
    assert_eq!(batches, [1_000, 1_000, 500, 0]);
    assert_eq!(rows(&schema).await, 300, "live rows are kept");

    // A row held by a hit in progress is skipped, not waited for.
    schema
        .client
        .batch_execute(&format!(
            "INSERT INTO {table} VALUES ('n', 'held', 1, now() - interval '1 s'), ('n', 'free', 1, now() - interval '1 s')"
        ))
        .await
        .unwrap();
    let holder = connect(&schema.url).await.unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            &format!("SELECT 1 FROM {table} WHERE key = 'held' FOR UPDATE"),
            &[],
        )
        .await
        .unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(10), store.clean_expired(batch))
        .await
        .expect("the cleaner waited for a locked row")
        .unwrap();
    assert_eq!(deleted, 1);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert!(row(&schema, "n", "held").await.is_some());
}

async fn the_cleaner_keeps_the_table_bounded_under_a_flood_of_keys() {
    let schema = pg_or_skip!(TestSchema::create("flood").await);
    let store = schema
        .builder()
        .clean_every(Duration::from_millis(20))
        .clean_batch(NonZeroU32::new(500).unwrap())
        .build();
    store.migrate().await.unwrap();
    let live = quota(1, Duration::from_secs(3600));
    store.hit("n", &Key::new("stays"), live).await.unwrap();

    let short = quota(1_000, Duration::from_millis(50));
    let mut tasks = Vec::new();
    for worker in 0..16u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_250u32 {
                let key = Key::display(format_args!("{worker}-{i}"));
                store.hit("flood", &key, short).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // All 20,000 keys have gone through the table; the cleaner deletes them
    // as their windows close.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = rows(&schema).await;
        if left == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} rows left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        store
            .peek("n", &Key::new("stays"))
            .await
            .unwrap()
            .unwrap()
            .count,
        1
    );
}

async fn the_cleaner_stops_with_the_backend() {
    let schema = pg_or_skip!(TestSchema::create("cleaner_stops").await);
    let store = schema
        .builder()
        .clean_every(Duration::from_millis(10))
        .build();
    store.migrate().await.unwrap();
    store
        .hit("n", &Key::new("k"), quota(1, Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(schema.connections().await > 0);
    let copy = store.clone();
    drop(store);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(schema.connections().await > 0, "a clone keeps it running");
    drop(copy);
    // The pool closes its connections once the cleaner, its last user, ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while schema.connections().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cleaner still holds the pool"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn several_quotas_are_counted_together() {
    let schema = pg_or_skip!(TestSchema::create("quotas").await);
    let store = schema.backend().await;
    let svc = RateLimitLayer::new("api", quota(3, Duration::from_secs(60)))
        .also(quota(2, Duration::from_secs(1)))
        .key(by_client())
        .backend(store.clone())
        .layer(ok_service());
    assert_eq!(
        svc.clone().oneshot(from("c")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(from("c")).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = svc.clone().oneshot(from("c")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers()["retry-after"],
        "1",
        "the per-second quota binds"
    );
    assert_eq!(rows(&schema).await, 2, "one row per quota");
}

/// A database of the release before limits (no `{table}_limits`) migrates
/// forward: its counters are kept, and limits work once `migrate` ran.
async fn a_database_without_limits_migrates_forward_and_keeps_its_counters() {
    let schema = pg_or_skip!(TestSchema::create("limits_forward").await);
    let store = schema.backend().await;
    let key = Key::new("k");
    let q = quota(10, Duration::from_secs(60));
    store.hit("api", &key, q).await.unwrap();
    store.hit("api", &key, q).await.unwrap();
    schema
        .client
        .batch_execute(&format!("DROP TABLE {}_limits", schema.table()))
        .await
        .unwrap();
    assert!(
        store.limits("api").await.is_err(),
        "before the migration, limits fail: never \"no limit\" in silence"
    );
    store.migrate().await.unwrap();
    assert_eq!(store.peek("api", &key).await.unwrap().unwrap().count, 2);
    store
        .set_limit(
            "api",
            LimitScope::Layer,
            Some(quota(1, Duration::from_secs(60))),
        )
        .await
        .unwrap();
    let limits = store.limits("api").await.unwrap();
    assert_eq!(
        limits.get(LimitScope::Layer),
        Some(quota(1, Duration::from_secs(60)))
    );
    assert_eq!(store.hit("api", &key, q).await.unwrap().count, 3);
}

async fn migrate_is_idempotent_concurrent_and_takes_its_names() {
    let schema = pg_or_skip!(TestSchema::create("migrate").await);
    let backends: Vec<PostgresBackend> = (0..4)
        .map(|_| schema.builder().table("limits").unlogged(true).build())
        .collect();
    let runs: Vec<_> = backends
        .iter()
        .map(|b| {
            let b = b.clone();
            tokio::spawn(async move { b.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    backends[0].migrate().await.unwrap();
    assert_eq!(backends[0].table(), format!("{}.limits", schema.name));
    let persistence: i8 = schema
        .client
        .query_one(
            "SELECT relpersistence::\"char\" FROM pg_class WHERE oid = $1::text::regclass",
            &[&format!("{}.limits", schema.name)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(persistence as u8, b'u', "unlogged");
    let limits: i8 = schema
        .client
        .query_one(
            "SELECT relpersistence::\"char\" FROM pg_class WHERE oid = $1::text::regclass",
            &[&format!("{}.limits_limits", schema.name)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        limits as u8, b'p',
        "limits are configuration: logged beside an unlogged table"
    );
    assert!(
        backends[0]
            .migration_sql()
            .contains("CREATE UNLOGGED TABLE IF NOT EXISTS")
    );
    assert!(
        backends[0]
            .migration_sql()
            .contains(&format!("\"{}\".\"limits\"", schema.name))
    );

    let fresh = PostgresBackend::builder(schema.pool(1))
        .schema(&format!("{}_own", schema.name))
        .build();
    fresh.migrate().await.unwrap();
    fresh
        .hit("n", &Key::new("k"), quota(1, Duration::from_secs(1)))
        .await
        .unwrap();
    schema
        .client
        .batch_execute(&format!("DROP SCHEMA {}_own CASCADE", schema.name))
        .await
        .unwrap();

    let bad = PostgresBackend::builder(schema.pool(1)).try_table("Limits; DROP");
    assert_eq!(
        bad.unwrap_err(),
        ConfigError::InvalidSqlIdentifier("Limits; DROP".into())
    );
    let bad = PostgresBackend::builder(schema.pool(1)).try_schema("");
    assert_eq!(
        bad.unwrap_err(),
        ConfigError::InvalidSqlIdentifier(String::new())
    );
    let zero = PostgresBackend::builder(schema.pool(1)).try_clean_every(Duration::ZERO);
    assert_eq!(zero.unwrap_err(), ConfigError::ZeroCleanInterval);
}

fn a_bad_literal_table_name_panics() {
    let _ =
        PostgresBackend::builder(pool(&support::postgres::url(), "unused", 1)).table("bad-name");
}

async fn an_outage_follows_the_policy_and_a_slow_database_times_out() {
    let mut server = pg_or_skip!(PgServer::start("outage"));
    let store = PostgresBackend::builder(pool(&server.url(), "outage", 4)).build();
    store.migrate().await.unwrap();
    let timeout = Window::new(Duration::from_millis(300)).unwrap();
    let layer = || {
        RateLimitLayer::new("outage", quota(1_000, Duration::from_secs(60)))
            .backend(store.clone())
            .timeout(timeout)
    };
    let closed = layer().layer(ok_service());
    let open = layer()
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    let get = || Request::new(String::new());
    assert_eq!(
        closed.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );

    // A hit waiting on a row another transaction holds: the layer's timeout.
    let holder = connect(&server.url()).await.unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM public.tpw_counters WHERE namespace = 'outage' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let res = closed.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    let res = open.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "fail open lets it through");
    assert!(res.extensions().get::<Decision>().is_none(), "uncounted");
    holder.batch_execute("ROLLBACK").await.unwrap();

    server.crash();
    for _ in 0..3 {
        let res = closed.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let res = open.clone().oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
}

async fn denied_counters_are_answered_locally_until_their_window_closes() {
    let schema = pg_or_skip!(TestSchema::create("deny_cache").await);
    let store = schema.backend().await;
    let key = Key::new("k");
    let q = quota(2, Duration::from_millis(400));
    for _ in 0..3 {
        store.hit("n", &key, q).await.unwrap();
    }
    assert_eq!(
        row(&schema, "n", "k").await.unwrap().0,
        3,
        "the hit that went over was counted"
    );
    for _ in 0..20 {
        let hit = store.hit("n", &key, q).await.unwrap();
        assert_eq!(hit.count, 3, "limit + 1");
        assert_eq!(
            hit.deadline, None,
            "not counted in the table: never refunded"
        );
        assert!(hit.reset <= Duration::from_millis(400));
    }
    assert_eq!(
        row(&schema, "n", "k").await.unwrap().0,
        3,
        "no statement for cached denials"
    );

    // A refund asks the database and forgets the cached denial.
    let over = Hit {
        count: 3,
        reset: Duration::ZERO,
        deadline: None,
    };
    assert!(!store.refund("n", &key, &over).await.unwrap());
    assert_eq!(
        store.hit("n", &key, q).await.unwrap().deadline,
        None,
        "still cached"
    );
    assert!(store.reset("n", &key).await.unwrap());
    assert_eq!(
        store.hit("n", &key, q).await.unwrap().count,
        1,
        "a reset clears this instance's cache"
    );

    // Past the window, the cache lets the next hit through to the table.
    for _ in 0..2 {
        store.hit("n", &key, q).await.unwrap();
    }
    assert_eq!(store.hit("n", &key, q).await.unwrap().deadline, None);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let hit = store.hit("n", &key, q).await.unwrap();
    assert_eq!(hit.count, 1, "a new window, from the table");
    assert!(hit.deadline.is_some());
}

async fn hits_in_flight_together_share_a_statement_and_each_get_their_own_count() {
    let schema = pg_or_skip!(TestSchema::create("coalesced").await);
    // Every hit reaches the table: a hit that starts after the first denial
    // came back would otherwise be answered by the deny cache.
    let store = schema
        .builder()
        .statements(std::num::NonZeroUsize::new(1).unwrap())
        .deny_cache(0)
        .build();
    store.migrate().await.unwrap();
    let q = quota(100, Duration::from_secs(60));
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let store = store.clone();
            // Two counters: one key shared by all, one key each.
            tokio::spawn(async move {
                let shared = store.hit("n", &Key::new("shared"), q).await.unwrap();
                let own = store.hit("n", &Key::display(i), q).await.unwrap();
                (shared, own)
            })
        })
        .collect();
    let mut counts = Vec::new();
    let mut resets = Vec::new();
    for task in tasks {
        let (shared, own) = task.await.unwrap();
        assert_eq!(own.count, 1);
        counts.push(shared.count);
        resets.push(shared.reset);
    }
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=500).collect::<Vec<u64>>(),
        "each hit its own count"
    );
    assert_eq!(
        counts.iter().filter(|c| **c <= 100).count(),
        100,
        "exactly the limit admitted"
    );
    resets.sort_unstable();
    resets.dedup();
    // Hits of one statement read one clock: fewer distinct times than hits.
    assert!(
        resets.len() < 250,
        "{} statements for 500 hits",
        resets.len()
    );
    assert_eq!(row(&schema, "n", "shared").await.unwrap().0, 500);
}

fn a_runtime_shut_down_mid_statement_leaves_the_backend_usable_on_another() {
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some((schema, store)) = first.block_on(async {
        let schema = TestSchema::create("runtimes").await?;
        let store = schema
            .builder()
            .statements(std::num::NonZeroUsize::new(1).unwrap())
            .deny_cache(0)
            .build();
        store.migrate().await.unwrap();
        store
            .hit("n", &Key::new("k"), quota(5, Duration::from_secs(60)))
            .await
            .unwrap();
        // Hold the row, so that the only sender waits in its statement.
        let holder = connect(&schema.url).await.unwrap();
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .execute(&format!("SELECT 1 FROM {} FOR UPDATE", schema.table()), &[])
            .await
            .unwrap();
        let waiting = store.clone();
        tokio::spawn(async move {
            let _ = waiting
                .hit("n", &Key::new("k"), quota(5, Duration::from_secs(60)))
                .await;
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        Some((schema, store))
    }) else {
        return;
    };
    drop(first); // the sender is cancelled mid-statement; the holder's connection dies

    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let hit = tokio::time::timeout(
            Duration::from_secs(20),
            store.hit("n", &Key::new("other"), quota(5, Duration::from_secs(60))),
        )
        .await
        .expect("no sender took the hit: the cancelled one kept its place");
        assert_eq!(hit.unwrap().count, 1);
    });
    drop(schema);
}

/// What only PostgreSQL holds: an expired row waiting for the cleaner. A
/// refund for its window leaves it as it is, and a new window reuses it.
/// (The contract's refunds: `contract::refunds_*`.)
async fn a_late_refund_leaves_the_expired_row_alone() {
    let schema = pg_or_skip!(TestSchema::create("late_refund").await);
    let store = schema.builder().deny_cache(0).build();
    store.migrate().await.unwrap();
    let key = Key::new("k");
    let q = quota(3, Duration::from_millis(300));
    let hit = store.hit("n", &key, q).await.unwrap();
    let (count, window) = row(&schema, "n", "k").await.unwrap();
    assert_eq!(count, 1);
    let micros = window
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    assert_eq!(
        hit.deadline.map(|d| u128::from(d.get())),
        Some(micros),
        "the hit names its window"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!store.refund("n", &key, &hit).await.unwrap(), "closed");
    assert_eq!(
        row(&schema, "n", "k").await,
        Some((1, window)),
        "an expired row is left alone"
    );
    let next = store.hit("n", &key, q).await.unwrap();
    let (count, new_window) = row(&schema, "n", "k").await.unwrap();
    assert_eq!((count, next.count), (1, 1));
    assert!(new_window > window);
    assert!(
        !store.refund("n", &key, &hit).await.unwrap(),
        "the old window's id"
    );
    assert_eq!(row(&schema, "n", "k").await, Some((1, new_window)));
    assert_eq!(rows(&schema).await, 1, "the same row, reused");
}

/// Reset markers (`tpw_counters_resets`) in the test schema: deadline and key.
async fn markers(schema: &TestSchema) -> Vec<(SystemTime, Vec<u8>)> {
    schema
        .client
        .query(
            &format!(
                "SELECT expires_at, key FROM {}_resets ORDER BY expires_at, key",
                schema.table()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// A window opened after a reset with exactly the deleted window's
/// `expires_at` (written here by hand: a hit would need to land in the same
/// microsecond) is never refunded, charged or cleared for a hit of the
/// deleted window: the reset left a marker for that deadline.
async fn amends_after_a_reset_never_reach_a_new_window_of_the_same_deadline() {
    use tower_pinned_window::backend::Amend;
    let schema = pg_or_skip!(TestSchema::create("reset_marker").await);
    let store = schema.builder().deny_cache(0).build();
    store.migrate().await.unwrap();
    let table = schema.table();
    let q = quota(10, Duration::from_secs(60));
    for (i, via_clear) in [false, true].into_iter().enumerate() {
        let name = format!("k{i}");
        let key = Key::new(name.clone());
        let old = store.hit("n", &key, q).await.unwrap();
        let (_, window) = row(&schema, "n", &name).await.unwrap();
        if via_clear {
            assert!(store.amend("n", &key, &old, Amend::Clear).await.unwrap());
        } else {
            assert!(store.reset("n", &key).await.unwrap());
        }
        assert_eq!(row(&schema, "n", &name).await, None, "deleted");
        schema
            .client
            .execute(
                &format!("INSERT INTO {table} (namespace, key, count, expires_at) VALUES ('n', $1, 1, $2)"),
                &[&name.as_bytes(), &window],
            )
            .await
            .unwrap();
        let what = if via_clear {
            "after a clear"
        } else {
            "after a reset"
        };
        assert!(
            !store.refund("n", &key, &old).await.unwrap(),
            "{what}: the refund answers false"
        );
        assert_eq!(
            row(&schema, "n", &name).await,
            Some((1, window)),
            "{what}: refund"
        );
        for amend in [Amend::Refund(1), Amend::Charge(5), Amend::Clear] {
            assert!(
                !store.amend("n", &key, &old, amend).await.unwrap(),
                "{what}: {amend:?} answers false"
            );
            assert_eq!(
                row(&schema, "n", &name).await,
                Some((1, window)),
                "{what}: {amend:?} left the new window alone"
            );
        }
    }
    assert_eq!(
        markers(&schema).await.len(),
        2,
        "one marker per deleted window"
    );

    // A clear under a live lockout keeps the row for its lockout, as a
    // closed window, and leaves a marker too.
    use tower_pinned_window::backend::{Counter, Spend};
    let key = Key::new("locked");
    let one = quota(1, Duration::from_secs(60));
    let c = [Counter {
        namespace: "n",
        quota: one,
        lowers: false,
    }];
    let block = Window::new(Duration::from_secs(60)).unwrap();
    let first = store.spend_all(&key, &c, Spend::cost(1)).await.unwrap()[0];
    let denied = store
        .spend_all(&key, &c, Spend::cost(1).block(block))
        .await
        .unwrap()[0];
    assert_eq!(denied.deadline, None, "locked");
    let (_, window) = row(&schema, "n", "locked").await.unwrap();
    assert!(store.amend("n", &key, &first, Amend::Clear).await.unwrap());
    assert_eq!(store.peek("n", &key).await.unwrap(), None, "no counter");
    assert!(
        !store
            .amend("n", &key, &first, Amend::Charge(3))
            .await
            .unwrap(),
        "the cleared window takes no charge"
    );
    assert!(
        markers(&schema)
            .await
            .contains(&(window, b"locked".to_vec())),
        "the clear left a marker"
    );
}

/// Markers are deleted by the cleaner once their deadline has passed (and a
/// second more), never while their window could still be open.
async fn the_cleaner_deletes_expired_reset_markers() {
    let schema = pg_or_skip!(TestSchema::create("marker_clean").await);
    let store = schema.builder().deny_cache(0).no_cleaner().build();
    store.migrate().await.unwrap();
    let short = quota(10, Duration::from_millis(100));
    let long = quota(10, Duration::from_secs(3600));
    for (name, q) in [("short", short), ("long", long)] {
        let key = Key::new(name);
        store.hit("n", &key, q).await.unwrap();
        assert!(store.reset("n", &key).await.unwrap());
    }
    assert_eq!(markers(&schema).await.len(), 2);
    // An expired row's reset leaves no marker: no later window can share
    // its deadline.
    schema
        .client
        .execute(
            &format!(
                "INSERT INTO {} VALUES ('n', 'gone', 1, now() - interval '1 s')",
                schema.table()
            ),
            &[],
        )
        .await
        .unwrap();
    assert!(!store.reset("n", &Key::new("gone")).await.unwrap());
    assert_eq!(markers(&schema).await.len(), 2);
    let batch = NonZeroU32::new(100).unwrap();
    assert_eq!(store.clean_expired(batch).await.unwrap(), 0, "not yet");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(store.clean_expired(batch).await.unwrap(), 1);
    let left = markers(&schema).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].1, b"long".to_vec(), "the live marker is kept");
}

/// Many concurrent spends of varied costs on one key, from several pool
/// connections and two instances: the admitted costs add up to at most the
/// limit, and to exactly the stored count.
async fn concurrent_spends_never_admit_more_than_the_limit() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("spend_exact").await);
    let one = schema.backend().await;
    let two = schema.builder().build();
    let limit = 1_000;
    let q = quota(limit, Duration::from_secs(600));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..400u64 {
        let backend = if i % 2 == 0 { one.clone() } else { two.clone() };
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            let cost = 1 + (i * 7) % 13;
            let hits = backend
                .spend_all(
                    &Key::new("k"),
                    &[Counter {
                        namespace: "n",
                        quota: q,
                        lowers: false,
                    }],
                    Spend::cost(cost),
                )
                .await
                .unwrap();
            if hits[0].deadline.is_some() {
                assert!(hits[0].count <= limit);
                admitted.fetch_add(cost, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let stored = row(&schema, "n", "k").await.unwrap().0 as u64;
    eprintln!("spend exactness: admitted {admitted} of limit {limit}, stored {stored}");
    assert!(admitted <= limit, "admitted {admitted}");
    assert_eq!(admitted, stored);
    assert!(admitted > limit - 13, "the budget was used up: {admitted}");
}

/// A denied spend spends nothing; a lockout is pinned to the first denial;
/// amends stay in their window; reset deletes the lockout.
async fn spends_lockouts_and_amends() {
    use tower_pinned_window::backend::{Amend, Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("spend_lock").await);
    let backend = schema.backend().await;
    let key = Key::new("k");
    let q = quota(5, Duration::from_secs(60));
    let c = [Counter {
        namespace: "n",
        quota: q,
        lowers: false,
    }];
    let block = Window::new(Duration::from_secs(3600)).unwrap();
    let first = backend.spend_all(&key, &c, Spend::cost(4)).await.unwrap()[0];
    assert_eq!(first.count, 4);
    assert!(first.deadline.is_some());
    let denied = backend
        .spend_all(&key, &c, Spend::cost(2).block(block))
        .await
        .unwrap()[0];
    // Locked by this step: the limit stands in its way, plus the cost.
    assert_eq!((denied.count, denied.deadline), (5 + 2, None));
    assert!(denied.reset > Duration::from_secs(3590), "{denied:?}");
    assert_eq!(
        row(&schema, "n", "k").await.unwrap().0,
        4,
        "denied: nothing spent"
    );
    let blocked = blocked_until(&schema).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = backend
        .spend_all(&key, &c, Spend::cost(0).block(block))
        .await
        .unwrap()[0];
    assert_eq!(
        (again.count, again.deadline),
        (6, None),
        "locked, even a check"
    );
    let still = blocked_until(&schema).await;
    assert_eq!(still, blocked, "never extended");
    assert!(
        backend
            .amend("n", &key, &first, Amend::Refund(10))
            .await
            .unwrap()
    );
    assert_eq!(
        row(&schema, "n", "k").await.unwrap().0,
        0,
        "never below zero"
    );
    assert!(
        backend
            .amend("n", &key, &first, Amend::Charge(9))
            .await
            .unwrap()
    );
    assert_eq!(row(&schema, "n", "k").await.unwrap().0, 9, "past the limit");
    assert!(backend.reset("n", &key).await.unwrap());
    assert_eq!(rows(&schema).await, 0, "reset deletes the lockout too");
    assert!(
        !backend
            .amend("n", &key, &first, Amend::Charge(1))
            .await
            .unwrap()
    );
    assert_eq!(rows(&schema).await, 0, "an amend never creates a counter");
    let fresh = backend.spend_all(&key, &c, Spend::cost(1)).await.unwrap()[0];
    assert_eq!(fresh.count, 1);
    assert!(
        backend
            .amend("n", &key, &fresh, Amend::Clear)
            .await
            .unwrap()
    );
    assert_eq!(rows(&schema).await, 0);
    let check = backend.spend_all(&key, &c, Spend::cost(0)).await.unwrap()[0];
    assert_eq!((check.count, check.deadline), (0, None));
    assert!(
        row(&schema, "n", "k")
            .await
            .is_none_or(|(_, at)| at <= SystemTime::now()),
        "a check creates no counter"
    );
    let opened = backend
        .spend_all(&key, &c, Spend::cost(0).open())
        .await
        .unwrap()[0];
    assert_eq!(opened.count, 0);
    assert!(opened.deadline.is_some());
    // It spends: checked by the compiler.
    fn spends<B: tower_pinned_window::backend::Spending>(_: &B) {}
    spends(&backend);
}

/// A backend on `schema` with one connection and one sender, whose sender
/// is made to wait: [`Held::queue`] then lines requests up behind it, in
/// order, and [`Held::release`] lets them go, all in the one next batch.
struct Held {
    hold: Option<tower_pinned_window_postgres::deadpool_postgres::Object>,
    first: tower_pinned_window::backend::toolkit::BackendFuture<tower_pinned_window::backend::Hits>,
}

/// A one-connection, one-sender backend on `schema`, its table migrated,
/// no deny cache (every request reaches the table).
async fn one_sender(schema: &TestSchema) -> PostgresBackend {
    let backend = PostgresBackend::builder(schema.pool(1))
        .schema(&schema.name)
        .statements(std::num::NonZeroUsize::MIN)
        .deny_cache(0)
        .no_cleaner()
        .build();
    backend.migrate().await.unwrap();
    backend
}

impl Held {
    /// Take the backend's only connection, and queue a first spend (on a
    /// key of its own): once the sender has taken it and waits for the
    /// connection, every request queued is sent in the batch after it.
    async fn new(backend: &PostgresBackend) -> Self {
        use tower_pinned_window::backend::{Counter, Spend};
        let hold = backend.pool().get().await.unwrap();
        let counters = [Counter {
            namespace: "first",
            quota: quota(1_000, Duration::from_secs(600)),
            lowers: false,
        }];
        let mut first = backend.spend_all(&Key::new("first"), &counters, Spend::cost(1));
        Self::queue(&mut first).await;
        while backend.pool().status().waiting == 0 {
            tokio::task::yield_now().await;
        }
        Self {
            hold: Some(hold),
            first,
        }
    }

    /// Poll `request` once: it is queued, behind those queued before it.
    async fn queue<F: std::future::Future + Unpin>(request: &mut F) {
        std::future::poll_fn(|cx| {
            assert!(
                std::pin::Pin::new(&mut *request).poll(cx).is_pending(),
                "queued, not answered"
            );
            std::task::Poll::Ready(())
        })
        .await;
    }

    /// Let the first batch go, then the one queued behind it.
    async fn release(mut self) {
        drop(self.hold.take());
        self.first.await.unwrap();
    }
}

/// Transactions that wrote the test table's rows of `namespace` (their
/// distinct `xmin`s).
async fn writers(schema: &TestSchema, namespace: &str) -> i64 {
    schema
        .client
        .query_one(
            &format!(
                "SELECT count(DISTINCT xmin::text) FROM {} WHERE namespace = $1",
                schema.table()
            ),
            &[&namespace],
        )
        .await
        .unwrap()
        .get(0)
}

/// Spends and amends of one batch are decided in the order they were
/// queued, each on the counters as the ones before it left them, each all
/// or nothing across its counters.
async fn a_batch_decides_its_requests_in_order_and_all_or_nothing() {
    use tower_pinned_window::backend::{Amend, Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("batch_order").await);
    let backend = one_sender(&schema).await;
    let a = Counter {
        namespace: "a",
        quota: quota(10, Duration::from_secs(600)),
        lowers: false,
    };
    let b = Counter {
        namespace: "b",
        quota: quota(6, Duration::from_secs(600)),
        lowers: false,
    };
    let (k, j) = (Key::new("k"), Key::new("j"));
    let held = Held::new(&backend).await;
    let mut spends = vec![
        backend.spend_all(&k, &[a], Spend::cost(3)),    // a 3
        backend.spend_all(&k, &[a, b], Spend::cost(4)), // a 7, b 4
        backend.spend_all(&k, &[a, b], Spend::cost(3)), // b would pass 6: nothing
        backend.spend_all(&k, &[a], Spend::cost(3)),    // a 10, the limit
        backend.spend_all(&k, &[a], Spend::cost(0)),    // a check: at the limit
        backend.spend_all(&k, &[b], Spend::cost(2)),    // b 6
        backend.spend_all(&j, &[a], Spend::cost(11)),   // never fits
        backend.spend_all(&j, &[a], Spend::cost(5)),    // j's own a 5
    ];
    for spend in &mut spends {
        Held::queue(spend).await;
    }
    held.release().await;
    let mut hits = Vec::new();
    for spend in spends {
        hits.push(spend.await.unwrap());
    }
    let counts = |i: usize| -> Vec<(u64, bool)> {
        hits[i]
            .iter()
            .map(|h| (h.count, h.deadline.is_some()))
            .collect()
    };
    assert_eq!(counts(0), [(3, true)]);
    assert_eq!(counts(1), [(7, true), (4, true)]);
    assert_eq!(
        counts(2),
        [(7, false), (7, false)],
        "b did not fit: nothing spent"
    );
    assert_eq!(counts(3), [(10, true)]);
    assert_eq!(
        counts(4),
        [(11, false)],
        "at the limit, even a check is denied"
    );
    assert_eq!(counts(5), [(6, true)]);
    assert_eq!(counts(6), [(11, false)]);
    assert_eq!(counts(7), [(5, true)]);
    assert_eq!(row(&schema, "a", "k").await.unwrap().0, 10);
    assert_eq!(row(&schema, "b", "k").await.unwrap().0, 6);
    assert_eq!(row(&schema, "a", "j").await.unwrap().0, 5);
    assert_eq!(writers(&schema, "a").await, 1, "one transaction");
    assert_eq!(writers(&schema, "b").await, 1, "the same one");

    // Amends in a batch, in order with its spends: a refund makes room for
    // the spend behind it; a clear deletes the window, which the spend
    // behind it opens again, and a charge of the cleared window changes
    // nothing.
    let (ka, kb) = (hits[1][0], hits[5][0]);
    let held = Held::new(&backend).await;
    let mut refund = backend.amend("a", &k, &ka, Amend::Refund(4)); // a 6
    let mut fits = backend.spend_all(&k, &[a], Spend::cost(4)); // a 10
    let mut full = backend.spend_all(&k, &[a], Spend::cost(1)); // denied
    let mut clear = backend.amend("b", &k, &kb, Amend::Clear);
    let mut reopened = backend.spend_all(&k, &[b], Spend::cost(6)); // a new b, 6
    let mut late = backend.amend("b", &k, &kb, Amend::Charge(1)); // the old window: no
    Held::queue(&mut refund).await;
    Held::queue(&mut fits).await;
    Held::queue(&mut full).await;
    Held::queue(&mut clear).await;
    Held::queue(&mut reopened).await;
    Held::queue(&mut late).await;
    held.release().await;
    assert!(refund.await.unwrap());
    let fits = fits.await.unwrap()[0];
    assert_eq!(
        (fits.count, fits.deadline),
        (10, ka.deadline),
        "after the refund"
    );
    assert_eq!(full.await.unwrap()[0].deadline, None);
    assert!(clear.await.unwrap());
    let reopened = reopened.await.unwrap()[0];
    assert_eq!(reopened.count, 6, "a new window after the clear");
    assert!(reopened.deadline.is_some() && reopened.deadline != kb.deadline);
    assert!(!late.await.unwrap(), "the cleared window is gone");
    assert_eq!(row(&schema, "a", "k").await.unwrap().0, 10);
    assert_eq!(row(&schema, "b", "k").await.unwrap().0, 6);
    let marked = markers(&schema).await;
    assert_eq!(marked.len(), 1, "the clear's reset marker: {marked:?}");
}

/// A corrupt counter fails the requests that name it, and only those; it
/// is left as it is, and the rest of the batch is decided as usual.
async fn a_corrupt_counter_fails_only_its_requests_in_a_batch() {
    use tower_pinned_window::backend::{Amend, Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("batch_corrupt").await);
    let backend = one_sender(&schema).await;
    without_constraints(&schema).await;
    schema
        .client
        .execute(
            &format!(
                "INSERT INTO {} VALUES ('n', 'bad', -3, now() + interval '1 minute')",
                schema.table()
            ),
            &[],
        )
        .await
        .unwrap();
    let before = raw(&schema, "bad").await;
    let q = quota(10, Duration::from_secs(600));
    let n = Counter {
        namespace: "n",
        quota: q,
        lowers: false,
    };
    let m = Counter {
        namespace: "m",
        quota: q,
        lowers: false,
    };
    let (good, other, bad) = (Key::new("good"), Key::new("other"), Key::new("bad"));
    let early = backend
        .spend_all(&good, &[n], Spend::cost(1))
        .await
        .unwrap()[0];
    let held = Held::new(&backend).await;
    let mut spends = vec![
        backend.spend_all(&good, &[n], Spend::cost(2)),
        backend.spend_all(&bad, &[n], Spend::cost(1)),
        backend.spend_all(&bad, &[m, n], Spend::cost(1)),
        backend.spend_all(&other, &[n, m], Spend::cost(4)),
        backend.spend_all(&bad, &[m], Spend::cost(5)),
        backend.spend_all(&good, &[n], Spend::cost(3)),
    ];
    let mut amends = vec![
        backend.amend("n", &good, &early, Amend::Charge(1)),
        backend.amend("n", &bad, &early, Amend::Clear),
    ];
    for spend in &mut spends {
        Held::queue(spend).await;
    }
    for amend in &mut amends {
        Held::queue(amend).await;
    }
    held.release().await;
    let mut results = Vec::new();
    for spend in spends {
        results.push(spend.await);
    }
    let count = |i: usize| results[i].as_ref().unwrap()[0].count;
    assert_eq!(count(0), 3);
    for i in [1, 2] {
        match &results[i] {
            Err(BackendError::Corrupt { key, detail }) => {
                assert!(key.contains("n{bad}"), "{key}");
                assert!(detail.contains("-3"), "{detail}");
            }
            other => panic!("{i}: {other:?}"),
        }
    }
    assert_eq!(count(3), 4);
    assert_eq!(count(4), 5, "another counter of the same key counts");
    assert_eq!(count(5), 6);
    assert!(amends.remove(0).await.unwrap());
    assert!(
        !amends.remove(0).await.unwrap(),
        "an amend of it changes nothing"
    );
    assert_eq!(raw(&schema, "bad").await, before, "left as it is");
    assert_eq!(row(&schema, "n", "good").await.unwrap().0, 7);
    assert_eq!(row(&schema, "n", "other").await.unwrap().0, 4);
    assert_eq!(row(&schema, "m", "other").await.unwrap().0, 4);
    assert_eq!(
        row(&schema, "m", "bad").await.unwrap().0,
        5,
        "the request naming the corrupt counter spent nothing on m"
    );
}

/// Many concurrent spends of a fixed cost per key, from two instances, on
/// keys with one counter and keys with two: each key's admitted costs add up
/// to at most its limit and exactly to its stored counts, the same on both
/// counters of a two-counter request (all or nothing), and the spends went
/// out batched.
async fn batched_spends_are_exact_under_concurrency() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("batch_exact").await);
    let one = schema.builder().deny_cache(0).build();
    one.migrate().await.unwrap();
    let two = schema.builder().build();
    const KEYS: usize = 6;
    let costs = [1u64, 3, 7, 10, 2, 5];
    let (wide, narrow) = (
        quota(100, Duration::from_secs(600)),
        quota(60, Duration::from_secs(600)),
    );
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let both_admitted: Arc<Vec<AtomicU64>> =
        Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..900usize {
        let backend = if i % 2 == 0 { one.clone() } else { two.clone() };
        let (admitted, both_admitted) = (admitted.clone(), both_admitted.clone());
        tasks.push(tokio::spawn(async move {
            let k = i % KEYS;
            let key = Key::display(format_args!("k{k}"));
            let n = Counter {
                namespace: "n",
                quota: wide,
                lowers: false,
            };
            let m = Counter {
                namespace: "m",
                quota: narrow,
                lowers: false,
            };
            // A third of the requests name both counters.
            let two_counters = (i / KEYS).is_multiple_of(3);
            let counters: &[Counter<'_>] = if two_counters { &[n, m] } else { &[n] };
            let hits = backend
                .spend_all(&key, counters, Spend::cost(costs[k]))
                .await
                .unwrap();
            let spent = hits.iter().all(|h| h.deadline.is_some());
            assert_eq!(spent, hits.iter().any(|h| h.deadline.is_some()), "{hits:?}");
            if spent {
                assert!(hits[0].count <= 100);
                admitted[k].fetch_add(1, Ordering::Relaxed);
                if two_counters {
                    assert!(hits[1].count <= 60);
                    both_admitted[k].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (k, cost) in costs.iter().enumerate() {
        let key = format!("k{k}");
        let n = row(&schema, "n", &key).await.unwrap().0 as u64;
        let m = row(&schema, "m", &key)
            .await
            .map_or(0, |(count, _)| count as u64);
        let admitted = admitted[k].load(Ordering::Relaxed) * cost;
        let both = both_admitted[k].load(Ordering::Relaxed) * cost;
        eprintln!("{key}: cost {cost}, admitted {admitted} (n {n}), both {both} (m {m})");
        assert_eq!(admitted, n, "{key}: n");
        assert!(n <= 100 && n > 100 - cost, "{key}: n used up, never passed");
        assert_eq!(both, m, "{key}: m");
        assert!(m <= 60, "{key}: m");
    }
    let transactions: i64 = schema
        .client
        .query_one(
            &format!("SELECT count(DISTINCT xmin::text) FROM {}", schema.table()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Rows show the transaction that last wrote them: with one spend per
    // transaction, each of the 12 rows would show its own.
    assert!(
        transactions < 12,
        "{transactions} transactions wrote 12 rows last"
    );
}

/// Spends and charges in flight while the backend's connections are killed
/// over and over: a request is counted once or not at all, never again by
/// a retry, and each admission reported was counted: the stored counts are
/// the admissions and charges answered.
async fn a_batch_cut_by_a_killed_connection_never_counts_twice() {
    use tower_pinned_window::backend::{Amend, Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("batch_killed").await);
    let backend = schema.backend().await;
    let done = Arc::new(AtomicBool::new(false));
    const KEYS: usize = 8;
    let q = quota(1_000_000, Duration::from_secs(600));
    let mut tasks = Vec::new();
    for worker in 0..32usize {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            // Per key: units answered as counted (spends of 2, charges of 1),
            // and requests that failed.
            let mut counted = [0u64; KEYS];
            let mut failed = 0u64;
            for i in 0..150usize {
                let k = (worker + i) % KEYS;
                let key = Key::display(format_args!("k{k}"));
                let counters = [Counter {
                    namespace: "n",
                    quota: q,
                    lowers: false,
                }];
                match backend.spend_all(&key, &counters, Spend::cost(2)).await {
                    Ok(hits) => {
                        assert!(hits[0].deadline.is_some(), "{hits:?}");
                        counted[k] += 2;
                        if i % 2 == 0 {
                            match backend.amend("n", &key, &hits[0], Amend::Charge(1)).await {
                                Ok(true) => counted[k] += 1,
                                Ok(false) => panic!("the charge found no window"),
                                Err(_) => failed += 1,
                            }
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            (counted, failed)
        }));
    }
    let killer = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut killed = 0;
            while !done.load(Ordering::Relaxed) {
                killed += schema.kill_connections().await;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            (schema, killed)
        })
    };
    let (mut counted, mut failed) = ([0u64; KEYS], 0);
    for task in tasks {
        let (theirs, their_failed) = task.await.unwrap();
        for k in 0..KEYS {
            counted[k] += theirs[k];
        }
        failed += their_failed;
    }
    done.store(true, Ordering::Relaxed);
    let (schema, killed) = killer.await.unwrap();
    eprintln!("{killed} connections killed; {failed} requests failed; counted {counted:?}");
    assert!(killed > 0, "the test killed no connection");
    assert!(failed > 0, "no batch was cut");
    for (k, counted) in counted.iter().enumerate() {
        let stored = row(&schema, "n", &format!("k{k}"))
            .await
            .map_or(0, |(c, _)| c as u64);
        assert_eq!(stored, *counted, "k{k}: stored, answered as counted");
    }
    assert!(counted.iter().sum::<u64>() > 0, "traffic went through");
}

/// The deny cache on the spend route: a counter at its limit is denied
/// here until its window closes, a lockout until it ends; a cost that only
/// does not fit is asked again; a spend that would lock a counter out goes
/// to the table; an amend forgets the counter.
async fn spends_use_the_deny_cache_only_for_what_every_spend_is_denied() {
    use tower_pinned_window::backend::{Amend, Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("spend_deny").await);
    let backend = schema.backend().await;
    let key = Key::new("k");
    let c = [Counter {
        namespace: "n",
        quota: quota(5, Duration::from_secs(600)),
        lowers: false,
    }];
    let set_count = |count: i64| {
        let (client, table) = (&schema.client, schema.table());
        async move {
            client
                .execute(&format!("UPDATE {table} SET count = $1"), &[&count])
                .await
                .unwrap();
        }
    };
    let first = backend.spend_all(&key, &c, Spend::cost(4)).await.unwrap()[0];
    assert_eq!(first.count, 4);
    let too_big = backend.spend_all(&key, &c, Spend::cost(2)).await.unwrap()[0];
    assert_eq!(too_big.deadline, None, "does not fit");
    let fits = backend.spend_all(&key, &c, Spend::cost(1)).await.unwrap()[0];
    assert_eq!(
        fits.count, 5,
        "the cost that did not fit was not remembered"
    );
    let full = backend.spend_all(&key, &c, Spend::cost(1)).await.unwrap()[0];
    assert_eq!(full.deadline, None);
    // Behind the backend's back: the table would admit now.
    set_count(0).await;
    let cached = backend.spend_all(&key, &c, Spend::cost(0)).await.unwrap()[0];
    assert_eq!(cached.deadline, None, "at its limit: denied here");
    assert!(
        cached.reset > Duration::from_secs(590),
        "until the window closes"
    );
    assert_eq!(row(&schema, "n", "k").await.unwrap().0, 0, "nothing sent");
    // A spend that locks out is not answered by that: the table decides.
    let block = Window::new(Duration::from_secs(3600)).unwrap();
    let locking = backend
        .spend_all(&key, &c, Spend::cost(1).block(block))
        .await
        .unwrap()[0];
    assert_eq!(locking.count, 1, "the table admits it");
    set_count(5).await;
    let locked = backend
        .spend_all(&key, &c, Spend::cost(1).block(block))
        .await
        .unwrap()[0];
    assert_eq!(locked.deadline, None);
    let until = blocked_until(&schema).await;
    set_count(0).await;
    schema
        .client
        .execute(
            &format!("UPDATE {} SET blocked_until = NULL", schema.table()),
            &[],
        )
        .await
        .unwrap();
    let cached = backend
        .spend_all(&key, &c, Spend::cost(1).block(block))
        .await
        .unwrap()[0];
    assert_eq!(cached.deadline, None, "locked out: denied here");
    assert!(
        cached.reset > Duration::from_secs(3590),
        "until the lockout ends"
    );
    assert!(until > SystemTime::now() + Duration::from_secs(3590));
    // An amend forgets the counter: the table decides again.
    assert!(
        backend
            .amend("n", &key, &first, Amend::Charge(1))
            .await
            .unwrap()
    );
    let asked = backend.spend_all(&key, &c, Spend::cost(1)).await.unwrap()[0];
    assert_eq!(asked.count, 2, "asked the table");
}

/// A table made by the previous release (its DDL as it was) is migrated in
/// place: its rows are kept and spends work on it.
async fn a_table_of_the_previous_release_is_migrated_in_place() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("old_table").await);
    schema
        .client
        .batch_execute(&format!(
            "CREATE TABLE {t} (namespace text NOT NULL, key bytea NOT NULL, \
             count bigint NOT NULL CHECK (count >= 0), \
             expires_at timestamptz NOT NULL CHECK (isfinite(expires_at)), \
             PRIMARY KEY (namespace, key)) WITH (fillfactor = 80); \
             CREATE INDEX tpw_counters_expires_at ON {t} (expires_at); \
             INSERT INTO {t} VALUES ('n', 'k', 2, now() + interval '1 minute')",
            t = schema.table()
        ))
        .await
        .unwrap();
    let backend = schema.backend().await; // migrates
    backend.migrate().await.unwrap();
    let q = quota(3, Duration::from_secs(60));
    let c = [Counter {
        namespace: "n",
        quota: q,
        lowers: false,
    }];
    let block = Window::new(Duration::from_secs(60)).unwrap();
    let hit = backend
        .spend_all(&Key::new("k"), &c, Spend::cost(1))
        .await
        .unwrap()[0];
    assert_eq!(hit.count, 3, "the old row counts on");
    let denied = backend
        .spend_all(&Key::new("k"), &c, Spend::cost(1).block(block))
        .await
        .unwrap()[0];
    assert_eq!(denied.deadline, None);
    assert_eq!(backend.hit("n", &Key::new("k"), q).await.unwrap().count, 4);
    assert!(backend.reset("n", &Key::new("k")).await.unwrap());
    assert_eq!(
        markers(&schema).await.len(),
        1,
        "migrate made the reset markers' table beside the old one"
    );
    let slot = SlotId::next();
    let taken = take_slot(&backend, "k", in_flight(1, Duration::from_secs(60)), slot).await;
    assert!(
        taken.unwrap().granted,
        "migrate made the slots' table beside the old one"
    );
    assert!(backend.give_back("n", &Key::new("k"), slot).await.unwrap());
}

/// The count of the test table's row `x` of `key`, once it reads `want`
/// (the give-back is a task of its own), or as it is after 5 s.
async fn count_once(schema: &TestSchema, key: &str, want: i64) -> i64 {
    count_once_on(schema, "x", key, want).await
}

/// [`count_once`] on the row of `namespace`.
async fn count_once_on(schema: &TestSchema, namespace: &str, key: &str, want: i64) -> i64 {
    for _ in 0..100 {
        if row(schema, namespace, key).await.map(|(count, _)| count) == Some(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    row(schema, namespace, key)
        .await
        .map_or(0, |(count, _)| count)
}

fn spend_x(
    store: &PostgresBackend,
    key: &str,
    cost: u64,
) -> impl std::future::Future<Output = Result<tower_pinned_window::backend::Hits, BackendError>> + use<>
{
    store.spend_all(
        &Key::new(key),
        &[tower_pinned_window::backend::Counter {
            namespace: "x",
            quota: quota(10, Duration::from_secs(60)),
            lowers: false,
        }],
        tower_pinned_window::backend::Spend::cost(cost),
    )
}

/// The issue's case: a cost-3 spend whose `COMMIT` a proxy lets through
/// and whose reply it drops (the transaction committed, the connection
/// closed before its answer) fails, and what it spent is given back: the
/// stored count is the one before it, 1, not 4.
async fn a_spend_whose_commit_reply_is_lost_keeps_no_cost() {
    let schema = pg_or_skip!(TestSchema::create("commit_reply_lost").await);
    let upstream: tokio_postgres::Config = schema.url.parse().unwrap();
    let proxy = support::drop_reply::DropReply::start(upstream.get_ports()[0]).await;
    let through = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        upstream.get_user().unwrap_or("postgres"),
        proxy.port(),
        upstream.get_dbname().unwrap_or("test")
    );
    let pool = pool(&through, &schema.name, 1);
    let store = PostgresBackend::builder(pool)
        .schema(&schema.name)
        .deny_cache(0)
        .build();
    store.migrate().await.unwrap();
    assert_eq!(spend_x(&store, "lost", 1).await.unwrap()[0].count, 1);

    proxy.drop_reply_to(b"COMMIT\0", b"COMMIT\0");
    let lost = spend_x(&store, "lost", 3).await;
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(proxy.dropped(), 1);
    assert_eq!(
        count_once(&schema, "lost", 1).await,
        1,
        "the refused spend's 3 stay counted"
    );
    // The connection is back, and the budget is whole.
    assert_eq!(spend_x(&store, "lost", 9).await.unwrap()[0].count, 10);
}

/// A spend with a first unit whose `COMMIT` reply is lost, as above: each
/// counter is given back what it spent, the unit on the first and the
/// cost on the other.
async fn a_first_unit_whose_commit_reply_is_lost_is_given_back_on_each_counter() {
    let schema = pg_or_skip!(TestSchema::create("first_commit_lost").await);
    let upstream: tokio_postgres::Config = schema.url.parse().unwrap();
    let proxy = support::drop_reply::DropReply::start(upstream.get_ports()[0]).await;
    let through = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        upstream.get_user().unwrap_or("postgres"),
        proxy.port(),
        upstream.get_dbname().unwrap_or("test")
    );
    let pool = pool(&through, &schema.name, 1);
    let store = PostgresBackend::builder(pool)
        .schema(&schema.name)
        .deny_cache(0)
        .build();
    store.migrate().await.unwrap();
    let key = Key::new("lost");
    let both = [
        tower_pinned_window::backend::Counter {
            namespace: "x",
            quota: quota(10, Duration::from_secs(60)),
            lowers: false,
        },
        tower_pinned_window::backend::Counter {
            namespace: "y",
            quota: quota(100, Duration::from_secs(60)),
            lowers: false,
        },
    ];
    let spend = |unit, cost| {
        let spend = tower_pinned_window::backend::Spend::cost(cost).first(unit);
        store.spend_all(&key, &both, spend)
    };
    let kept = spend(1, 3).await.unwrap();
    assert_eq!((kept[0].count, kept[1].count), (1, 3));

    proxy.drop_reply_to(b"COMMIT\0", b"COMMIT\0");
    let lost = spend(2, 5).await;
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(proxy.dropped(), 1);
    assert_eq!(
        count_once_on(&schema, "y", "lost", 3).await,
        3,
        "the refused spend's 5 tokens stay counted"
    );
    assert_eq!(
        count_once_on(&schema, "x", "lost", 1).await,
        1,
        "the requests counter is given back its unit, 2, not the cost"
    );
}

/// A spend whose caller gives up (the layer's timeout) while its
/// transaction waits on a lock is counted when the lock goes, and given
/// back.
async fn a_spend_whose_caller_has_gone_keeps_no_cost() {
    let schema = pg_or_skip!(TestSchema::create("caller_gone").await);
    let store = schema.builder().deny_cache(0).build();
    store.migrate().await.unwrap();
    assert_eq!(spend_x(&store, "gone", 1).await.unwrap()[0].count, 1);

    schema
        .client
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {} WHERE key = 'gone' FOR UPDATE",
            schema.table()
        ))
        .await
        .unwrap();
    let waiting = tokio::spawn(tokio::time::timeout(
        Duration::from_secs(1),
        spend_x(&store, "gone", 3),
    ));
    // Its transaction waits on the lock before the caller gives up.
    let mut on_lock = Vec::new();
    for _ in 0..100 {
        on_lock = schema
            .client
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&schema.name],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<_, i32>(0))
            .collect();
        if !on_lock.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        on_lock.len(),
        1,
        "the spend's transaction waits on the lock"
    );
    let timed_out = waiting.await.unwrap();
    assert!(timed_out.is_err(), "answered past a held lock");
    schema.client.batch_execute("COMMIT").await.unwrap();
    // The spend's transaction goes on once the lock is gone: until its
    // connection is idle, the row may still read 1 from before it.
    for _ in 0..100 {
        let busy = schema
            .client
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state <> 'idle'",
                &[&on_lock[0]],
            )
            .await
            .unwrap();
        if busy.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        count_once(&schema, "gone", 1).await,
        1,
        "the refused spend's 3 stay counted"
    );
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
/// The table of the test schema's slots in flight, beside its counters'.
fn slots_table(schema: &TestSchema) -> String {
    format!("{}_slots", schema.table())
}

fn in_flight(max: u64, lease: Duration) -> tower_pinned_window::InFlight {
    tower_pinned_window::InFlight::new(max, lease).unwrap()
}

/// Take `slot` of `key` under `n`, as a layer would.
async fn take_slot(
    backend: &PostgresBackend,
    key: &str,
    cap: tower_pinned_window::InFlight,
    slot: SlotId,
) -> Result<tower_pinned_window::backend::Taken, BackendError> {
    backend
        .take(
            &Key::new(key),
            Cap {
                namespace: "n",
                in_flight: cap,
            },
            slot,
        )
        .await
}

/// Drop the slots table's constraints, so a test can write records no take
/// may change.
async fn slots_without_constraints(schema: &TestSchema) {
    let table = slots_table(schema);
    schema
        .client
        .batch_execute(&format!(
            "ALTER TABLE {table} DROP CONSTRAINT slot_names; \
             ALTER TABLE {table} DROP CONSTRAINT slot_leases; \
             ALTER TABLE {table} DROP CONSTRAINT record_lifetime; \
             ALTER TABLE {table} DROP CONSTRAINT a_lease_per_slot; \
             ALTER TABLE {table} ALTER COLUMN expires_at DROP NOT NULL"
        ))
        .await
        .unwrap();
}

/// The record's text and its xmin: equal before and after means untouched.
async fn raw_slots(schema: &TestSchema, key: &str) -> (String, String) {
    let row = schema
        .client
        .query_one(
            &format!(
                "SELECT c::text, xmin::text FROM {} c WHERE namespace = 'n' AND key = $1",
                slots_table(schema)
            ),
            &[&key.as_bytes()],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// A slot's name, as the table holds it.
const SLOT: &str = "0123456789abcdef0123456789abcdef";

async fn the_constraints_refuse_impossible_records_of_slots() {
    let schema = pg_or_skip!(TestSchema::create("slot_constraints").await);
    schema.backend().await;
    let table = slots_table(&schema);
    let later = "now() + interval '1 minute'";
    for (case, values) in [
        (
            "a name that is not a slot's",
            format!("ARRAY['abc'], ARRAY[{later}], {later}"),
        ),
        (
            "an upper-case name",
            format!("ARRAY['{}'], ARRAY[{later}], {later}", SLOT.to_uppercase()),
        ),
        (
            "a NULL name",
            format!("ARRAY['{SLOT}', NULL], ARRAY[{later}, {later}], {later}"),
        ),
        (
            "a slot without a lease",
            format!("ARRAY['{SLOT}'], ARRAY[]::timestamptz[], {later}"),
        ),
        (
            "a NULL lease",
            format!("ARRAY['{SLOT}'], ARRAY[NULL::timestamptz], {later}"),
        ),
        (
            "no lifetime",
            format!("ARRAY['{SLOT}'], ARRAY[{later}], NULL"),
        ),
        (
            "an infinite lifetime",
            format!("ARRAY['{SLOT}'], ARRAY[{later}], 'infinity'"),
        ),
    ] {
        let err = schema
            .client
            .execute(
                &format!("INSERT INTO {table} VALUES ('n', 'k', {values})"),
                &[],
            )
            .await
            .unwrap_err();
        assert!(
            err.as_db_error()
                .is_some_and(|e| e.code().code().starts_with("23")),
            "{case}: {err}"
        );
    }
    // What a take writes passes them.
    schema
        .client
        .execute(
            &format!(
                "INSERT INTO {table} VALUES ('n', 'k', ARRAY['{SLOT}'], ARRAY[{later}], {later})"
            ),
            &[],
        )
        .await
        .unwrap();
}

/// Every form of a record no take may change fails the key's takes,
/// give-backs, extends and counts with `Corrupt` (naming the record), and is
/// left exactly as it is, by the cleaner and the audit too.
async fn corrupt_records_of_slots_stop_their_key_and_are_left_untouched() {
    let schema = pg_or_skip!(TestSchema::create("slot_corrupt").await);
    let store = schema.builder().no_cleaner().build();
    store.migrate().await.unwrap();
    slots_without_constraints(&schema).await;
    let table = slots_table(&schema);
    let (later, earlier) = ("now() + interval '1 minute'", "now() - interval '1 minute'");
    let other = "fedcba9876543210fedcba9876543210";
    let cases = [
        (
            "bad-name",
            format!("ARRAY['not a slot'], ARRAY[{later}], {later}"),
        ),
        (
            "bad-name-expired",
            format!("ARRAY['not a slot'], ARRAY[{earlier}], {earlier}"),
        ),
        (
            "twice",
            format!("ARRAY['{SLOT}', '{SLOT}'], ARRAY[{later}, {later}], {later}"),
        ),
        (
            "no-lease",
            format!("ARRAY['{SLOT}', '{other}'], ARRAY[{later}], {later}"),
        ),
        (
            "null-lease",
            format!("ARRAY['{SLOT}'], ARRAY[NULL::timestamptz], {later}"),
        ),
        (
            "no-lifetime",
            format!("ARRAY['{SLOT}'], ARRAY[{later}], NULL"),
        ),
        (
            "infinite",
            format!("ARRAY['{SLOT}'], ARRAY[{later}], 'infinity'"),
        ),
        (
            "far",
            format!("ARRAY['{SLOT}'], ARRAY[{later}], now() + interval '200 years'"),
        ),
        (
            "lease-past-lifetime",
            format!("ARRAY['{SLOT}'], ARRAY[now() + interval '1 hour'], {later}"),
        ),
        (
            "two-dimensions",
            format!("ARRAY[ARRAY['{SLOT}']], ARRAY[ARRAY[{later}]], {later}"),
        ),
    ];
    for (key, values) in &cases {
        schema
            .client
            .execute(
                &format!("INSERT INTO {table} VALUES ('n', '{key}', {values})"),
                &[],
            )
            .await
            .unwrap();
    }
    let cap = in_flight(5, Duration::from_secs(30));
    let slot = SlotId::parse(SLOT.as_bytes()).unwrap();
    let is_named = |key: &str, result: &dyn std::fmt::Debug, err: Option<&BackendError>| match err {
        Some(BackendError::Corrupt { key: named, .. }) => {
            assert_eq!(*named, format!("{table} n{{{key}}}:slots"), "{key}");
        }
        _ => panic!("{key}: not corrupt: {result:?}"),
    };
    for (key, _) in &cases {
        let before = raw_slots(&schema, key).await;
        let taken = take_slot(&store, key, cap, SlotId::next()).await;
        is_named(key, &taken, taken.as_ref().err());
        let retried = take_slot(&store, key, cap, slot).await;
        is_named(key, &retried, retried.as_ref().err());
        let given = store.give_back("n", &Key::new(*key), slot).await;
        is_named(key, &given, given.as_ref().err());
        let k = Key::new(*key);
        let held = [HeldSlot {
            namespace: "n",
            key: &k,
            slot,
        }];
        let extended = store.extend(&held, cap.lease()).await;
        is_named(key, &extended, extended.as_ref().err());
        let counted = store.in_use("n", &k).await;
        is_named(key, &counted, counted.as_ref().err());
        assert_eq!(raw_slots(&schema, key).await, before, "{key}: written");
    }
    // An extend of a good slot and a corrupt record extends the good one
    // all the same, and names the corrupt one.
    let good = SlotId::next();
    assert!(take_slot(&store, "good", cap, good).await.unwrap().granted);
    let (g, b) = (Key::new("good"), Key::new("bad-name"));
    let held = [
        HeldSlot {
            namespace: "n",
            key: &b,
            slot,
        },
        HeldSlot {
            namespace: "n",
            key: &g,
            slot: good,
        },
    ];
    let before = raw_slots(&schema, "good").await;
    let extended = store.extend(&held, cap.lease()).await;
    is_named("bad-name", &extended, extended.as_ref().err());
    assert_ne!(
        raw_slots(&schema, "good").await,
        before,
        "the good one moved"
    );
    assert_eq!(store.in_use("n", &g).await.unwrap(), 1);

    // Nothing removes them: not the cleaner, not the audit.
    assert_eq!(
        store
            .clean_expired(NonZeroU32::new(100).unwrap())
            .await
            .unwrap(),
        0
    );
    let report = store
        .audit(Some(Window::new(Duration::from_secs(60)).unwrap()))
        .await
        .unwrap();
    let mut want: Vec<String> = cases
        .iter()
        .map(|(key, _)| format!("{table} n{{{key}}}:slots"))
        .collect();
    want.sort();
    let mut corrupt = report.corrupt.clone();
    corrupt.sort();
    assert_eq!(corrupt, want, "every one");
    assert_eq!(
        report.without_lifetime,
        [
            format!("{table} n{{far}}:slots"),
            format!("{table} n{{infinite}}:slots"),
            format!("{table} n{{no-lifetime}}:slots"),
        ],
        "those whose expires_at is not usable"
    );
    assert!(report.repaired.is_empty(), "records are never repaired");
    assert_eq!(report.scanned, 0, "no counter");
    for (key, _) in &cases {
        assert_eq!(
            schema
                .client
                .query_one(
                    &format!("SELECT count(*) FROM {table} WHERE key = $1"),
                    &[&key.as_bytes()],
                )
                .await
                .unwrap()
                .get::<_, i64>(0),
            1,
            "{key}: still there"
        );
    }
}

/// The cleaner deletes a record once its latest lease has run out, never
/// before: not one whose slot was extended, nor one with a live slot.
async fn the_cleaner_deletes_records_of_slots_after_their_last_lease() {
    let schema = pg_or_skip!(TestSchema::create("slot_clean").await);
    let store = schema.builder().no_cleaner().build();
    store.migrate().await.unwrap();
    let short = in_flight(3, Duration::from_millis(100));
    let long = in_flight(3, Duration::from_secs(3600));
    assert!(
        take_slot(&store, "short", short, SlotId::next())
            .await
            .unwrap()
            .granted
    );
    assert!(
        take_slot(&store, "mixed", short, SlotId::next())
            .await
            .unwrap()
            .granted
    );
    assert!(
        take_slot(&store, "mixed", long, SlotId::next())
            .await
            .unwrap()
            .granted
    );
    let extended = SlotId::next();
    assert!(
        take_slot(&store, "extended", short, extended)
            .await
            .unwrap()
            .granted
    );
    let k = Key::new("extended");
    let held = [HeldSlot {
        namespace: "n",
        key: &k,
        slot: extended,
    }];
    assert_eq!(store.extend(&held, long.lease()).await.unwrap(), 1);
    let given = SlotId::next();
    assert!(
        take_slot(&store, "given", short, given)
            .await
            .unwrap()
            .granted
    );
    assert!(
        store
            .give_back("n", &Key::new("given"), given)
            .await
            .unwrap()
    );
    let batch = NonZeroU32::new(100).unwrap();
    assert_eq!(store.clean_expired(batch).await.unwrap(), 0, "not yet");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        store.clean_expired(batch).await.unwrap(),
        2,
        "the record of the short slot, and the emptied one"
    );
    let left: Vec<Vec<u8>> = schema
        .client
        .query(
            &format!("SELECT key FROM {} ORDER BY key", slots_table(&schema)),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(left, [b"extended".to_vec(), b"mixed".to_vec()]);
    assert_eq!(store.in_use("n", &Key::new("mixed")).await.unwrap(), 1);
    assert_eq!(store.in_use("n", &k).await.unwrap(), 1);
}

/// Takes, extends and give-backs of one key from two instances and many
/// connections at once: no more slots are ever held than the cap, and all
/// are back at the end.
async fn takes_and_give_backs_from_many_connections_never_pass_the_cap() {
    let schema = pg_or_skip!(TestSchema::create("slot_churn").await);
    let one = schema.backend().await;
    let two = schema.builder().build();
    let cap = in_flight(4, Duration::from_secs(30));
    let holding = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..160u64 {
        let backend = if i % 2 == 0 { one.clone() } else { two.clone() };
        let (holding, granted) = (holding.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let slot = SlotId::next();
            for _ in 0..3 {
                let taken = take_slot(&backend, "hot", cap, slot).await.expect("take");
                assert!(taken.in_use <= 4, "{taken:?}");
                if !taken.granted {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                granted.fetch_add(1, Ordering::Relaxed);
                // Every task counted here holds a slot in the table.
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 4, "{now} slots held at once");
                let k = Key::new("hot");
                let held = [HeldSlot {
                    namespace: "n",
                    key: &k,
                    slot,
                }];
                assert_eq!(backend.extend(&held, cap.lease()).await.expect("extend"), 1);
                holding.fetch_sub(1, Ordering::SeqCst);
                assert!(backend.give_back("n", &k, slot).await.expect("give back"));
                break;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(granted.load(Ordering::Relaxed) >= 4, "some were granted");
    assert_eq!(one.in_use("n", &Key::new("hot")).await.unwrap(), 0);
}

/// An extend that waits for a record another step is changing (here a
/// slot added by hand in an open transaction, as a take would) extends it
/// as that step left it: the slot added is kept, the one named extended.
/// (Computing the record from the lock's read, one version, over the row
/// the statement began with, another, broke the table's constraints.)
async fn an_extend_that_waits_for_a_record_extends_it_as_the_other_step_left_it() {
    let schema = pg_or_skip!(TestSchema::create("slot_extend_wait").await);
    let store = schema.backend().await;
    let table = slots_table(&schema);
    let cap = in_flight(3, Duration::from_secs(30));
    let held_slot = SlotId::next();
    assert!(
        take_slot(&store, "k", cap, held_slot)
            .await
            .unwrap()
            .granted
    );
    let holder = connect(&schema.url).await.unwrap();
    holder
        .batch_execute(&format!(
            "BEGIN; UPDATE {table} SET slots = slots || '{SLOT}'::text, \
             leases = leases || (now() + interval '20 s'), \
             expires_at = greatest(expires_at, now() + interval '20 s') \
             WHERE key = 'k'"
        ))
        .await
        .unwrap();
    let extending = tokio::spawn({
        let store = store.clone();
        async move {
            let k = Key::new("k");
            let held = [HeldSlot {
                namespace: "n",
                key: &k,
                slot: held_slot,
            }];
            store
                .extend(&held, Window::new(Duration::from_secs(60)).unwrap())
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!extending.is_finished(), "the extend waits for the record");
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(extending.await.unwrap().unwrap(), 1);
    let row = schema
        .client
        .query_one(
            &format!(
                "SELECT slots, ARRAY(SELECT (extract(epoch FROM l - now()))::bigint \
                 FROM unnest(leases) AS l) FROM {table} WHERE key = 'k'"
            ),
            &[],
        )
        .await
        .unwrap();
    let (slots, left): (Vec<String>, Vec<i64>) = (row.get(0), row.get(1));
    assert_eq!(slots, [held_slot.to_string(), SLOT.to_owned()]);
    assert!(
        (58..=60).contains(&left[0]) && (18..=20).contains(&left[1]),
        "the held slot extended, the added one as it was: {left:?}"
    );
    assert_eq!(store.in_use("n", &Key::new("k")).await.unwrap(), 2);
}

/// A backend on `schema` whose one connection goes through `proxy`, with
/// no deny cache and no cleaner: every call of a test on it is on that
/// connection.
async fn through_proxy(
    schema: &TestSchema,
    proxy: &support::drop_reply::DropReply,
) -> PostgresBackend {
    let upstream: tokio_postgres::Config = schema.url.parse().unwrap();
    let through = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        upstream.get_user().unwrap_or("postgres"),
        proxy.port(),
        upstream.get_dbname().unwrap_or("test")
    );
    let store = PostgresBackend::builder(pool(&through, &schema.name, 1))
        .schema(&schema.name)
        .deny_cache(0)
        .no_cleaner()
        .build();
    store.migrate().await.unwrap();
    store
}

/// The transaction ids (`xmin`) that last wrote the key's record of slots
/// under `n` and its counter's row under `namespace`, once both show
/// `slot` held and the counter at `count`: what another connection sees
/// only once the step has committed.
async fn committed_step(
    schema: &TestSchema,
    key: &str,
    slot: SlotId,
    namespace: &str,
    count: i64,
) -> Option<(String, String)> {
    let row = schema
        .client
        .query_opt(
            &format!(
                "SELECT s.xmin::text, c.xmin::text FROM {slots} s, {table} c \
                 WHERE s.namespace = 'n' AND s.key = $1 AND $2 = ANY(s.slots) \
                   AND c.namespace = $3 AND c.key = $1 AND c.count = $4",
                slots = slots_table(schema),
                table = schema.table()
            ),
            &[&key.as_bytes(), &slot.to_string(), &namespace, &count],
        )
        .await
        .unwrap()?;
    Some((row.get(0), row.get(1)))
}

/// A `take_all` is one round trip: with every reply held back from its
/// `BEGIN` on, its step still commits (the slot and the counters written
/// by one transaction), so nothing of it waited for an answer; once the
/// replies go on, it answers what it did. The same for hits and for a
/// spend.
async fn a_take_all_is_one_transaction_sent_in_one_round_trip() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("take_all_round_trip").await);
    let proxy = support::drop_reply::DropReply::start(
        schema
            .url
            .parse::<tokio_postgres::Config>()
            .unwrap()
            .get_ports()[0],
    )
    .await;
    let store = through_proxy(&schema, &proxy).await;
    let cap = in_flight(3, Duration::from_secs(30));
    for (n, spend) in [None, Some(Spend::cost(2))].into_iter().enumerate() {
        let namespace = format!("q{n}");
        let counters = [Counter {
            namespace: &namespace,
            quota: quota(10, Duration::from_secs(60)),
            lowers: false,
        }];
        let key = format!("k{n}");
        // The connection's statements prepared: the step alone is left.
        let warm = store
            .take_all(
                &Key::new(format!("warm{n}")),
                Cap {
                    namespace: "n",
                    in_flight: cap,
                },
                SlotId::next(),
                &counters,
                spend,
            )
            .await
            .unwrap();
        assert!(
            warm.clone().split_taken().1.is_some_and(|t| t.granted),
            "{warm:?}"
        );

        proxy.hold_reply_to(b"BEGIN\0");
        let slot = SlotId::next();
        let call = tokio::spawn({
            let (store, key, namespace) = (store.clone(), key.clone(), namespace.clone());
            async move {
                let counters = [Counter {
                    namespace: &namespace,
                    quota: quota(10, Duration::from_secs(60)),
                    lowers: false,
                }];
                let cap = Cap {
                    namespace: "n",
                    in_flight: cap,
                };
                store
                    .take_all(&Key::new(key), cap, slot, &counters, spend)
                    .await
            }
        });
        let want = if spend.is_some() { 2 } else { 1 };
        let mut step = None;
        for _ in 0..100 {
            step = committed_step(&schema, &key, slot, &namespace, want).await;
            if step.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (slots_xmin, counter_xmin) = step.unwrap_or_else(|| {
            panic!("step {n}: with every reply held, the take_all never committed")
        });
        assert_eq!(
            slots_xmin, counter_xmin,
            "step {n}: one transaction wrote the slot and the counter"
        );
        assert!(
            !call.is_finished(),
            "step {n}: no reply has reached the caller yet"
        );
        proxy.release();
        let hits = call.await.unwrap().unwrap();
        let taken = hits.clone().split_taken().1.expect("the cap answered");
        assert!(taken.granted && taken.in_use == 1, "step {n}: {hits:?}");
        assert_eq!(hits[0].count, want as u64, "step {n}: {hits:?}");
        assert!(hits[0].deadline.is_some(), "step {n}: counted: {hits:?}");
    }
}

/// Concurrent `take_all`s on one key, from two instances, hits and spends
/// mixed, none giving its slot back: exactly the cap's `max` are granted,
/// and only those are counted. Each counts a counter of its own, so only
/// the key's record of slots orders them.
async fn concurrent_take_alls_never_pass_the_cap() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("take_all_cap").await);
    let one = schema.backend().await;
    let two = schema.builder().build();
    let cap = in_flight(5, Duration::from_secs(60));
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let backend = if i % 2 == 0 { one.clone() } else { two.clone() };
            tokio::spawn(async move {
                let namespace = format!("q{i}");
                let counters = [Counter {
                    namespace: &namespace,
                    quota: quota(1_000, Duration::from_secs(60)),
                    lowers: false,
                }];
                let spend = (i % 4 >= 2).then_some(Spend::cost(1));
                let cap = Cap {
                    namespace: "n",
                    in_flight: cap,
                };
                backend
                    .take_all(&Key::new("hot"), cap, SlotId::next(), &counters, spend)
                    .await
                    .expect("take_all")
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        let hits = task.await.unwrap();
        let taken = hits
            .clone()
            .split_taken()
            .1
            .expect("the quota admits every request");
        assert!(taken.in_use <= 5, "{hits:?}");
        if taken.granted {
            granted += 1;
            assert_eq!(hits[0].count, 1, "counted with its slot: {hits:?}");
            assert!(hits[0].deadline.is_some(), "{hits:?}");
        } else {
            assert_eq!(hits[0].count, 0, "refused, not counted: {hits:?}");
            assert!(hits[0].deadline.is_none(), "{hits:?}");
            assert_eq!(taken.in_use, 5, "{hits:?}");
        }
    }
    assert_eq!(granted, 5, "exactly the cap granted");
    let counted: i64 = schema
        .client
        .query_one(
            &format!(
                "SELECT coalesce(sum(count), 0)::bigint FROM {} WHERE expires_at > now()",
                schema.table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, 5, "only the granted steps counted");
    assert_eq!(one.in_use("n", &Key::new("hot")).await.unwrap(), 5);
}

/// A `take_all` whose counters include a row no hit may count fails whole,
/// hits and spends alike: corrupt, naming that row; the row is left as it
/// is, and nothing else is written (no slot, no other counter counted, no
/// record or row made by the step's locks).
async fn a_take_all_on_a_corrupt_counter_changes_nothing() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("take_all_corrupt").await);
    let store = schema.backend().await;
    without_constraints(&schema).await;
    let table = schema.table();
    let cases = [
        (
            "negative",
            "-1, now() + interval '1 minute'",
            "count Some(-1)",
        ),
        ("no-expiry", "7, NULL", "expires_at is NULL"),
        ("infinite", "7, 'infinity'", "past the bound"),
    ];
    let cap = in_flight(3, Duration::from_secs(30));
    for (key, values, detail) in cases {
        schema
            .client
            .execute(
                &format!("INSERT INTO {table} VALUES ('n', '{key}', {values})"),
                &[],
            )
            .await
            .unwrap();
        let before = raw(&schema, key).await;
        for spend in [None, Some(Spend::cost(1))] {
            let q = quota(10, Duration::from_secs(60));
            let counters = [
                Counter {
                    namespace: "good",
                    quota: q,
                    lowers: false,
                },
                Counter {
                    namespace: "n",
                    quota: q,
                    lowers: false,
                },
            ];
            let cap = Cap {
                namespace: "cap",
                in_flight: cap,
            };
            let err = store
                .take_all(&Key::new(key), cap, SlotId::next(), &counters, spend)
                .await
                .expect_err("a corrupt counter fails the step");
            match &err {
                BackendError::Corrupt {
                    key: name,
                    detail: said,
                } => {
                    assert!(name.ends_with(&format!("n{{{key}}}")), "{key}: {name}");
                    assert!(said.contains(detail), "{key}: {said}");
                }
                other => panic!("{key}: corrupt, not {other}"),
            }
            assert_eq!(raw(&schema, key).await, before, "{key}: left as it is");
            assert_eq!(
                row(&schema, "good", key).await,
                None,
                "{key} ({spend:?}): the other counter is not counted, nor made"
            );
            let records: i64 = schema
                .client
                .query_one(
                    &format!("SELECT count(*) FROM {}", slots_table(&schema)),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(records, 0, "{key} ({spend:?}): no record of slots made");
        }
    }
}

/// A `take_all` that spends with a lockout: a counter that does not fit is
/// locked out in the same step, no slot is taken, and the next spend is
/// refused by the lockout (here by the deny cache, with nothing sent: not
/// even the slot's record is read).
async fn a_take_all_that_spends_locks_out_as_a_spend_does() {
    use tower_pinned_window::backend::{Counter, Spend};
    let schema = pg_or_skip!(TestSchema::create("take_all_lockout").await);
    let store = schema.backend().await;
    let counters = [Counter {
        namespace: "login",
        quota: quota(2, Duration::from_secs(60)),
        lowers: false,
    }];
    let block = Window::new(Duration::from_secs(600)).unwrap();
    let spend = Some(Spend::cost(1).block(block));
    let cap = Cap {
        namespace: "n",
        in_flight: in_flight(10, Duration::from_secs(30)),
    };
    let key = Key::new("mallory");
    for n in 1..=2 {
        let hits = store
            .take_all(&key, cap, SlotId::next(), &counters, spend)
            .await
            .unwrap();
        assert!(
            hits.clone().split_taken().1.is_some_and(|t| t.granted),
            "{n}: {hits:?}"
        );
        assert_eq!(hits[0].count, n);
    }
    let denied = store
        .take_all(&key, cap, SlotId::next(), &counters, spend)
        .await
        .unwrap();
    assert_eq!(denied.clone().split_taken().1, None, "no slot: {denied:?}");
    assert!(
        denied[0].count > 2 && denied[0].deadline.is_none(),
        "{denied:?}"
    );
    assert!(
        denied[0].reset > Duration::from_secs(590),
        "the lockout's end: {denied:?}"
    );
    let locked = blocked_until(&schema).await;
    let left = locked.duration_since(SystemTime::now()).unwrap();
    assert!(
        left > Duration::from_secs(590),
        "locked out for the block: {left:?}"
    );
    assert_eq!(store.in_use("n", &key).await.unwrap(), 2);
    // Answered here: the key's record is locked by another connection, and
    // the step does not wait for it.
    let holder = connect(&schema.url).await.unwrap();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {} FOR UPDATE",
            slots_table(&schema)
        ))
        .await
        .unwrap();
    let again = tokio::time::timeout(
        Duration::from_secs(2),
        store.take_all(&key, cap, SlotId::next(), &counters, spend),
    )
    .await
    .expect("the deny cache answers without the database")
    .unwrap();
    assert_eq!(again.clone().split_taken().1, None, "{again:?}");
    assert!(
        again[0].count > 2 && again[0].deadline.is_none(),
        "{again:?}"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(blocked_until(&schema).await, locked, "never extended");
    assert_eq!(row(&schema, "login", "mallory").await.unwrap().0, 2);
}

fn main() {
    let mut trials = vec![
        trial::multi(
            "a_spend_whose_commit_reply_is_lost_keeps_no_cost",
            Needs::Postgres,
            a_spend_whose_commit_reply_is_lost_keeps_no_cost,
        ),
        trial::multi(
            "a_first_unit_whose_commit_reply_is_lost_is_given_back_on_each_counter",
            Needs::Postgres,
            a_first_unit_whose_commit_reply_is_lost_is_given_back_on_each_counter,
        ),
        trial::multi(
            "a_spend_whose_caller_has_gone_keeps_no_cost",
            Needs::Postgres,
            a_spend_whose_caller_has_gone_keeps_no_cost,
        ),
        trial::multi(
            "concurrent_spends_never_admit_more_than_the_limit",
            Needs::Postgres,
            concurrent_spends_never_admit_more_than_the_limit,
        ),
        trial::current(
            "a_batch_decides_its_requests_in_order_and_all_or_nothing",
            Needs::Postgres,
            a_batch_decides_its_requests_in_order_and_all_or_nothing,
        ),
        trial::current(
            "a_corrupt_counter_fails_only_its_requests_in_a_batch",
            Needs::Postgres,
            a_corrupt_counter_fails_only_its_requests_in_a_batch,
        ),
        trial::multi(
            "batched_spends_are_exact_under_concurrency",
            Needs::Postgres,
            batched_spends_are_exact_under_concurrency,
        ),
        trial::multi(
            "a_batch_cut_by_a_killed_connection_never_counts_twice",
            Needs::Postgres,
            a_batch_cut_by_a_killed_connection_never_counts_twice,
        ),
        trial::current(
            "spends_use_the_deny_cache_only_for_what_every_spend_is_denied",
            Needs::Postgres,
            spends_use_the_deny_cache_only_for_what_every_spend_is_denied,
        ),
        trial::current(
            "spends_lockouts_and_amends",
            Needs::Postgres,
            spends_lockouts_and_amends,
        ),
        trial::current(
            "a_table_of_the_previous_release_is_migrated_in_place",
            Needs::Postgres,
            a_table_of_the_previous_release_is_migrated_in_place,
        ),
        trial::current(
            "the_window_is_pinned_and_denials_carry_retry_after",
            Needs::Postgres,
            the_window_is_pinned_and_denials_carry_retry_after,
        ),
        trial::current(
            "a_closed_window_starts_over_at_one_with_a_new_deadline",
            Needs::Postgres,
            a_closed_window_starts_over_at_one_with_a_new_deadline,
        ),
        trial::current(
            "sub_millisecond_windows_round_up_and_the_bound_is_held",
            Needs::Postgres,
            sub_millisecond_windows_round_up_and_the_bound_is_held,
        ),
        trial::multi(
            "killed_connections_and_dropped_futures_count_no_hit_twice",
            Needs::Postgres,
            killed_connections_and_dropped_futures_count_no_hit_twice,
        ),
        trial::multi(
            "a_crashed_database_recovers_by_itself_and_unlogged_counters_are_lost",
            Needs::PgServer,
            a_crashed_database_recovers_by_itself_and_unlogged_counters_are_lost,
        ),
        trial::current(
            "the_constraints_refuse_impossible_rows",
            Needs::Postgres,
            the_constraints_refuse_impossible_rows,
        ),
        trial::current(
            "corrupt_rows_stop_requests_and_are_left_untouched",
            Needs::Postgres,
            corrupt_rows_stop_requests_and_are_left_untouched,
        ),
        trial::current(
            "the_audit_repairs_only_rows_with_a_usable_count",
            Needs::Postgres,
            the_audit_repairs_only_rows_with_a_usable_count,
        ),
        trial::current(
            "the_cleaner_deletes_expired_rows_in_batches_and_never_a_live_one",
            Needs::Postgres,
            the_cleaner_deletes_expired_rows_in_batches_and_never_a_live_one,
        ),
        trial::multi(
            "the_cleaner_keeps_the_table_bounded_under_a_flood_of_keys",
            Needs::Postgres,
            the_cleaner_keeps_the_table_bounded_under_a_flood_of_keys,
        ),
        trial::multi(
            "the_cleaner_stops_with_the_backend",
            Needs::Postgres,
            the_cleaner_stops_with_the_backend,
        ),
        trial::current(
            "several_quotas_are_counted_together",
            Needs::Postgres,
            several_quotas_are_counted_together,
        ),
        trial::current(
            "a_database_without_limits_migrates_forward_and_keeps_its_counters",
            Needs::Postgres,
            a_database_without_limits_migrates_forward_and_keeps_its_counters,
        ),
        trial::current(
            "migrate_is_idempotent_concurrent_and_takes_its_names",
            Needs::Postgres,
            migrate_is_idempotent_concurrent_and_takes_its_names,
        ),
        trial::should_panic(
            "a_bad_literal_table_name_panics",
            Needs::Nothing,
            "invalid PostgreSQL name \"bad-name\"",
            a_bad_literal_table_name_panics,
        ),
        trial::multi(
            "an_outage_follows_the_policy_and_a_slow_database_times_out",
            Needs::PgServer,
            an_outage_follows_the_policy_and_a_slow_database_times_out,
        ),
        trial::current(
            "denied_counters_are_answered_locally_until_their_window_closes",
            Needs::Postgres,
            denied_counters_are_answered_locally_until_their_window_closes,
        ),
        trial::multi(
            "hits_in_flight_together_share_a_statement_and_each_get_their_own_count",
            Needs::Postgres,
            hits_in_flight_together_share_a_statement_and_each_get_their_own_count,
        ),
        trial::trial(
            "a_runtime_shut_down_mid_statement_leaves_the_backend_usable_on_another",
            Needs::Postgres,
            a_runtime_shut_down_mid_statement_leaves_the_backend_usable_on_another,
        ),
        trial::current(
            "amends_after_a_reset_never_reach_a_new_window_of_the_same_deadline",
            Needs::Postgres,
            amends_after_a_reset_never_reach_a_new_window_of_the_same_deadline,
        ),
        trial::current(
            "the_cleaner_deletes_expired_reset_markers",
            Needs::Postgres,
            the_cleaner_deletes_expired_reset_markers,
        ),
        trial::current(
            "a_late_refund_leaves_the_expired_row_alone",
            Needs::Postgres,
            a_late_refund_leaves_the_expired_row_alone,
        ),
        trial::current(
            "the_constraints_refuse_impossible_records_of_slots",
            Needs::Postgres,
            the_constraints_refuse_impossible_records_of_slots,
        ),
        trial::current(
            "corrupt_records_of_slots_stop_their_key_and_are_left_untouched",
            Needs::Postgres,
            corrupt_records_of_slots_stop_their_key_and_are_left_untouched,
        ),
        trial::multi(
            "takes_and_give_backs_from_many_connections_never_pass_the_cap",
            Needs::Postgres,
            takes_and_give_backs_from_many_connections_never_pass_the_cap,
        ),
        trial::current(
            "an_extend_that_waits_for_a_record_extends_it_as_the_other_step_left_it",
            Needs::Postgres,
            an_extend_that_waits_for_a_record_extends_it_as_the_other_step_left_it,
        ),
        trial::current(
            "a_take_all_is_one_transaction_sent_in_one_round_trip",
            Needs::Postgres,
            a_take_all_is_one_transaction_sent_in_one_round_trip,
        ),
        trial::current(
            "a_take_all_on_a_corrupt_counter_changes_nothing",
            Needs::Postgres,
            a_take_all_on_a_corrupt_counter_changes_nothing,
        ),
        trial::current(
            "a_take_all_that_spends_locks_out_as_a_spend_does",
            Needs::Postgres,
            a_take_all_that_spends_locks_out_as_a_spend_does,
        ),
        trial::multi(
            "concurrent_take_alls_never_pass_the_cap",
            Needs::Postgres,
            concurrent_take_alls_never_pass_the_cap,
        ),
        trial::current(
            "the_cleaner_deletes_records_of_slots_after_their_last_lease",
            Needs::Postgres,
            the_cleaner_deletes_records_of_slots_after_their_last_lease,
        ),
    ];
    // The backend contract, each scenario on schemas of its own: without
    // the deny cache, and with it.
    let stores: Vec<Arc<PostgresStore>> = [0, 1024]
        .into_iter()
        .map(|deny_cache| Arc::new(PostgresStore::new(deny_cache)))
        .collect();
    for (name, store) in ["contract", "contract_deny_cache"].into_iter().zip(&stores) {
        trials.extend(trial::contract(name, Needs::Postgres, store.clone()));
        trials.extend(trial::contract_leases(name, Needs::Postgres, store.clone()));
        trials.extend(trial::contract_heeds(name, Needs::Postgres, store.clone()));
        trials.extend(trial::contract_limits(name, Needs::Postgres, store.clone()));
    }
    trial::run(trials, stores)
}
