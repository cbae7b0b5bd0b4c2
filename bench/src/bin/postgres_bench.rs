//! Hits per second through the PostgreSQL backend, for
//! `bench/postgres.sh`.
//!
//! ```text
//! cargo run --release -p tower-pinned-window-bench --bin postgres_bench -- URL SCHEMA MODE IN_FLIGHT SECONDS
//! ```
//!
//! MODE is `fresh` (every hit a new key: the insert path), `hot` (each task
//! hits its own key over and over: the update path), or `flood` (fresh keys
//! with a 1-second window, the cleaner running every second, printing the
//! table's rows and size each second: how big the table gets under a flood).
//! The pool has IN_FLIGHT connections, as pgbench has at that concurrency;
//! `STATEMENTS` sets the backend's statements in flight (default 4).
//! `fresh` and `hot` print one number: hits per second.
//!
//! MODE `cost` (a spend of cost 1 per request) and `charged` (a check that
//! opens the window, then a charge of 1 once answered: `Spend::cost(0).open()`
//! then `Amend::Charge(1)`) pick each request's key at random among 10,000,
//! and print three numbers: requests per second, the statements the database
//! ran per request (from `pg_stat_statements`, BEGIN and COMMIT included; `nan`
//! when the extension is not installed) and the transactions per request
//! (from `pg_stat_database`, read once the pool is closed).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Amend, Backend, Counter, Spend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window_postgres::PostgresBackend;
use tower_pinned_window_postgres::deadpool_postgres::{Manager, Pool};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, schema, mode, in_flight, seconds] = args.as_slice() else {
        return Err(
            "usage: postgres_bench URL SCHEMA fresh|hot|flood|cost|charged IN_FLIGHT SECONDS"
                .into(),
        );
    };
    if mode == "cost" || mode == "charged" {
        return spends(
            url,
            schema,
            mode == "charged",
            in_flight.parse()?,
            seconds.parse()?,
        )
        .await;
    }
    let in_flight: usize = in_flight.parse()?;
    let duration = Duration::from_secs_f64(seconds.parse()?);
    let pool = Pool::builder(Manager::new(url.parse()?, NoTls))
        .max_size(in_flight)
        .build()?;
    let flood = mode == "flood";
    let mut builder = PostgresBackend::builder(pool).schema(schema);
    if let Ok(statements) = std::env::var("STATEMENTS") {
        builder = builder.statements(statements.parse()?);
    }
    builder = if flood {
        builder
            .clean_every(Duration::from_secs(1))
            .clean_batch(NonZeroU32::new(1_000).unwrap())
    } else {
        builder.no_cleaner()
    };
    let backend = builder.build();
    backend.migrate().await?;
    let window = if flood {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(600)
    };
    let quota = Quota::new(u64::MAX, window)?;
    let hits = Arc::new(AtomicU64::new(0));

    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let backend = backend.clone();
        let hits = hits.clone();
        let hot = mode == "hot";
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let key = if hot {
                    Key::display(format_args!("hot-{task}"))
                } else {
                    Key::display(format_args!("{task}-{i}"))
                };
                backend.hit("b", &key, quota).await.unwrap();
                hits.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    if flood {
        let (db, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(connection);
        let table = backend.table().to_owned();
        println!("second  hits/s  rows  expired  table+index size");
        let mut last = 0;
        let mut max_rows = 0i64;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = hits.load(Ordering::Relaxed);
            let row = db
                .query_one(
                    &format!(
                        "SELECT count(*), count(*) FILTER (WHERE expires_at <= now()), \
                         pg_size_pretty(pg_total_relation_size('{table}')) FROM {table}"
                    ),
                    &[],
                )
                .await?;
            let rows: i64 = row.get(0);
            max_rows = max_rows.max(rows);
            println!(
                "{:>6}  {:>6}  {:>6}  {:>6}  {}",
                start.elapsed().as_secs(),
                now - last,
                rows,
                row.get::<_, i64>(1),
                row.get::<_, String>(2)
            );
            last = now;
        }
        for task in tasks {
            task.await?;
        }
        let total = hits.load(Ordering::Relaxed);
        println!(
            "{total} distinct keys in {:.1} s ({:.0}/s), 1 s windows: at most {max_rows} rows in the table",
            start.elapsed().as_secs_f64(),
            total as f64 / start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!("{:.0}", hits.load(Ordering::Relaxed) as f64 / elapsed);
    Ok(())
}

/// Statements run so far (`pg_stat_statements`, every database), or `None`
/// without the extension.
async fn statements(db: &Client) -> Option<i64> {
    let row = db
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat_%'",
            &[],
        )
        .await
        .ok()?;
    row.get(0)
}

/// Transactions committed or rolled back in this database so far.
async fn transactions(db: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database \
             WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The `cost` and `charged` modes: requests per second, statements per
/// request, transactions per request.
async fn spends(
    url: &str,
    schema: &str,
    charged: bool,
    in_flight: usize,
    seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    const KEYS: u64 = 10_000;
    let pool = Pool::builder(Manager::new(url.parse()?, NoTls))
        .max_size(in_flight)
        .build()?;
    let mut builder = PostgresBackend::builder(pool).schema(schema).no_cleaner();
    if let Ok(statements) = std::env::var("STATEMENTS") {
        builder = builder.statements(statements.parse()?);
    }
    let backend = builder.build();
    backend.migrate().await?;
    let (db, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let quota = Quota::new(u64::MAX / 2, Duration::from_secs(600))?;
    let requests = Arc::new(AtomicU64::new(0));
    let _ = db.execute("SELECT pg_stat_statements_reset()", &[]).await;
    let (statements_before, transactions_before) =
        (statements(&db).await, transactions(&db).await?);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for task in 0..in_flight as u64 {
        let backend = backend.clone();
        let requests = requests.clone();
        tasks.push(tokio::spawn(async move {
            // A small xorshift: keys spread over KEYS, no two tasks alike.
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (task + 1);
            let counters = [Counter {
                namespace: "b",
                quota,
                lowers: false,
            }];
            while Instant::now() < deadline {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let key = Key::display(format_args!("k{}", state % KEYS));
                if charged {
                    let hits = backend
                        .spend_all(&key, &counters, Spend::cost(0).open())
                        .await
                        .unwrap();
                    let charged = backend
                        .amend("b", &key, &hits[0], Amend::Charge(1))
                        .await
                        .unwrap();
                    assert!(charged, "the charge found its window");
                } else {
                    let hits = backend
                        .spend_all(&key, &counters, Spend::cost(1))
                        .await
                        .unwrap();
                    assert!(hits[0].deadline.is_some(), "admitted");
                }
                requests.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let statements_after = statements(&db).await;
    // Closing the pool's connections makes their backends report their
    // transactions.
    drop(backend);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let transactions_after = transactions(&db).await?;
    let done = requests.load(Ordering::Relaxed) as f64;
    let statements = match (statements_before, statements_after) {
        (Some(before), Some(after)) => (after - before) as f64 / done,
        _ => f64::NAN,
    };
    println!(
        "{:.0} {:.3} {:.3}",
        done / elapsed,
        statements,
        (transactions_after - transactions_before) as f64 / done
    );
    Ok(())
}
