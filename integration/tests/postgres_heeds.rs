//! The provider's word (`Heeding`) through the PostgreSQL backend, on the
//! machine's server, one schema per test: what only PostgreSQL does beside
//! the contract's scenarios (run in `postgres.rs`): each statement writes
//! only its own columns, a closed row outlives its window for its lockout
//! and the cleaner keeps it until then, and corrupt rows are named from the
//! statement's own read.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use support::postgres::TestSchema;
use tower_pinned_window::backend::{Backend, BackendError, Counter, Heeding, Spend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, Window};
use trial::Needs;

fn counter(limit: u64, ms: u64) -> Counter<'static> {
    Counter {
        namespace: "n",
        quota: Quota::new(limit, Duration::from_millis(ms)).unwrap(),
        lowers: false,
    }
}

fn window(ms: u64) -> Window {
    Window::new(Duration::from_millis(ms)).unwrap()
}

/// The row of `key` under `n`: count, expires_at, blocked_until.
async fn row(schema: &TestSchema, key: &str) -> Option<(i64, SystemTime, Option<SystemTime>)> {
    schema
        .client
        .query_opt(
            &format!(
                "SELECT count, expires_at, blocked_until FROM {} \
                 WHERE namespace = 'n' AND key = $1",
                schema.table()
            ),
            &[&key.as_bytes()],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
}

/// A close writes only `blocked_until`, later and never sooner: a live
/// counter keeps its count and `expires_at`; a missing one becomes a closed
/// window (count 0, at the epoch) holding the lockout, which no peek sees
/// and the cleaner keeps until the lockout ends. A raise keeps the
/// lockout.
async fn a_close_writes_only_the_lockout_and_the_cleaner_keeps_it() {
    let schema = pg_or_skip!(TestSchema::create("heed_close").await);
    let store = schema.builder().deny_cache(0).no_cleaner().build();
    store.migrate().await.unwrap();
    let live = Key::new("live");
    let spent = store
        .spend_all(&live, &[counter(10, 60_000)], Spend::cost(4))
        .await
        .unwrap()[0];
    let (count, expires_at, none) = row(&schema, "live").await.unwrap();
    assert_eq!((count, none), (4, None));
    let left = store.close("n", &live, window(30_000)).await.unwrap();
    assert_eq!(left, Duration::from_secs(30), "the database's clock, exact");
    let (count_after, expires_after, blocked) = row(&schema, "live").await.unwrap();
    assert_eq!(
        (count_after, expires_after),
        (count, expires_at),
        "untouched"
    );
    let blocked = blocked.expect("locked");
    let shorter = store.close("n", &live, window(1_000)).await.unwrap();
    assert!(shorter > Duration::from_secs(29), "{shorter:?}");
    assert_eq!(
        row(&schema, "live").await.unwrap().2,
        Some(blocked),
        "never sooner"
    );
    // A raise keeps the lockout, and counts in the same window.
    let raised = store
        .raise(&live, counter(10, 60_000), 6, window(500))
        .await
        .unwrap();
    assert_eq!((raised.count, raised.deadline), (6, spent.deadline));
    assert_eq!(row(&schema, "live").await.unwrap().2, Some(blocked));

    let gone = Key::new("gone");
    let left = store.close("n", &gone, window(400)).await.unwrap();
    assert_eq!(left, Duration::from_millis(400));
    let (count, expires_at, blocked) = row(&schema, "gone").await.expect("a row for the lockout");
    assert_eq!(
        (count, expires_at),
        (0, SystemTime::UNIX_EPOCH),
        "a closed window"
    );
    assert!(blocked.is_some());
    assert_eq!(store.peek("n", &gone).await.unwrap(), None, "no counter");
    let batch = NonZeroU32::new(100).unwrap();
    store.clean_expired(batch).await.unwrap();
    assert!(row(&schema, "gone").await.is_some(), "kept for its lockout");
    tokio::time::sleep(Duration::from_millis(450)).await;
    store.clean_expired(batch).await.unwrap();
    assert!(
        row(&schema, "gone").await.is_none(),
        "cleaned once it ended"
    );
}

/// A raise of a row whose window has closed opens a new one, in the shorter
/// of the provider's reset and the quota's window, on the database's
/// clock, exact to the microsecond; a raise of 0 writes nothing.
async fn a_raise_opens_a_closed_window_and_a_raise_of_zero_writes_nothing() {
    let schema = pg_or_skip!(TestSchema::create("heed_raise").await);
    let store = schema.builder().deny_cache(0).no_cleaner().build();
    store.migrate().await.unwrap();
    let key = Key::new("k");
    let zero = store
        .raise(&key, counter(10, 60_000), 0, window(700))
        .await
        .unwrap();
    assert_eq!(
        (zero.count, zero.reset, zero.deadline),
        (0, Duration::from_millis(700), None)
    );
    assert!(row(&schema, "k").await.is_none(), "no row written");
    let first = store
        .raise(&key, counter(10, 60_000), 3, window(200))
        .await
        .unwrap();
    assert_eq!((first.count, first.reset), (3, Duration::from_millis(200)));
    let (_, expires_at, _) = row(&schema, "k").await.unwrap();
    let micros = expires_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert_eq!(first.deadline.map(|d| d.get()), Some(micros));
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The closed row is still there (no cleaner): a new window from it.
    assert!(row(&schema, "k").await.is_some());
    let again = store
        .raise(&key, counter(10, 60_000), 2, window(90_000))
        .await
        .unwrap();
    assert_eq!(
        (again.count, again.reset),
        (2, Duration::from_secs(60)),
        "the quota's window, from 2 (not 3 + 2)"
    );
}

/// Rows no statement of the crate can write (constraints dropped, as
/// hand-written SQL could): each step fails naming the row and saying why,
/// and the row is left as it is.
async fn corrupt_rows_are_named_and_left_as_they_are() {
    let schema = pg_or_skip!(TestSchema::create("heed_corrupt").await);
    let store = schema.builder().deny_cache(0).no_cleaner().build();
    store.migrate().await.unwrap();
    let table = schema.table();
    schema
        .client
        .batch_execute(&format!(
            "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS tpw_counters_count_check; \
             ALTER TABLE {table} DROP CONSTRAINT IF EXISTS tpw_counters_expires_at_check; \
             ALTER TABLE {table} DROP CONSTRAINT IF EXISTS tpw_counters_blocked_until_check; \
             INSERT INTO {table} VALUES \
               ('n', 'negative', -2, now() + interval '1 minute', NULL), \
               ('n', 'forever', 1, 'infinity', NULL), \
               ('n', 'locked', 1, now() + interval '1 minute', 'infinity')"
        ))
        .await
        .unwrap();
    let before: Vec<String> = schema
        .client
        .query(
            &format!("SELECT c::text FROM {table} AS c WHERE key <> 'locked' ORDER BY key"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let corrupt = |result: Result<(), BackendError>, what: &str, says: &str| match result {
        Err(BackendError::Corrupt { key, detail }) => {
            assert!(key.ends_with(&format!("n{{{what}}}")), "{what}: {key}");
            assert!(detail.contains(says), "{what}: {detail}");
        }
        other => panic!("{what}: {other:?}"),
    };
    for (what, says) in [
        ("negative", "count Some(-2)"),
        ("forever", "past the bound"),
    ] {
        let key = Key::new(what);
        corrupt(
            store.close("n", &key, window(1_000)).await.map(drop),
            what,
            says,
        );
        for n in [0, 4] {
            corrupt(
                store
                    .raise(&key, counter(10, 60_000), n, window(1_000))
                    .await
                    .map(drop),
                what,
                says,
            );
        }
    }
    let locked = Key::new("locked");
    corrupt(
        store.close("n", &locked, window(1_000)).await.map(drop),
        "locked",
        "a lockout without a lifetime",
    );
    // A raise does not read the lockout.
    let raised = store
        .raise(&locked, counter(10, 60_000), 4, window(1_000))
        .await
        .unwrap();
    assert_eq!(raised.count, 4);
    let after: Vec<String> = schema
        .client
        .query(
            &format!("SELECT c::text FROM {table} AS c WHERE key <> 'locked' ORDER BY key"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(after, before, "left as they were");
    assert_eq!(after.len(), 2);
    let still: bool = schema
        .client
        .query_one(
            &format!("SELECT blocked_until = 'infinity' FROM {table} WHERE key = 'locked'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(still, "the lockout left as it was");
}

fn main() {
    let trials = vec![
        trial::current(
            "a_close_writes_only_the_lockout_and_the_cleaner_keeps_it",
            Needs::Postgres,
            a_close_writes_only_the_lockout_and_the_cleaner_keeps_it,
        ),
        trial::current(
            "a_raise_opens_a_closed_window_and_a_raise_of_zero_writes_nothing",
            Needs::Postgres,
            a_raise_opens_a_closed_window_and_a_raise_of_zero_writes_nothing,
        ),
        trial::current(
            "corrupt_rows_are_named_and_left_as_they_are",
            Needs::Postgres,
            corrupt_rows_are_named_and_left_as_they_are,
        ),
    ];
    trial::run(trials, ())
}
