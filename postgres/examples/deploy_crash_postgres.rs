//! A deploy kills the request that created a rate-limit row, between its two
//! statements: the count, then the expiry. This replays that against a real
//! PostgreSQL, time compressed (one "minute" is one second by default), for
//! two limiters side by side: the common two-statement one, and this crate's
//! PostgreSQL backend (one statement per hit).
//!
//! A 6-minute sale, one user sending 50 requests a minute, a limit of 100 a
//! minute. The deploy lands on the user's first request, in minute 1.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p tower-pinned-window-postgres --example deploy_crash_postgres
//! ```
//!
//! Both tables live in a schema made for the run and dropped at the end.
//! `MINUTE_MS` sets the length of a compressed minute.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_postgres::{Client, NoTls};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::Backend;
use tower_pinned_window::key::Key;
use tower_pinned_window_postgres::PostgresBackend;
use tower_pinned_window_postgres::deadpool_postgres::{Manager, Pool};

const MINUTES: u32 = 6;
const PER_MINUTE: u32 = 50;
const LIMIT: u64 = 100;

#[derive(Default, Clone, Copy)]
struct Tally {
    allowed: u32,
    denied: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let minute = Duration::from_millis(
        std::env::var("MINUTE_MS")
            .ok()
            .map_or(Ok(1000), |v| v.parse())?,
    );
    let schema = format!("deploy_crash_{}", std::process::id());

    let (db, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    // The naive limiter's table: an expiry that a second statement fills in.
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.naive (key text PRIMARY KEY, count bigint NOT NULL, expires_at timestamptz)"
    ))
    .await?;
    let pool = Pool::builder(Manager::new(url.parse()?, NoTls)).build()?;
    let pinned = PostgresBackend::builder(pool).schema(&schema).build();
    pinned.migrate().await?;
    let quota = Quota::new(LIMIT, minute)?;
    let user = Key::new("user");

    println!(
        "{MINUTES}-minute sale, {PER_MINUTE} requests a minute, limit {LIMIT} a minute; one minute = {minute:?}"
    );
    println!(
        "a deploy kills the user's first request in minute 1, between the count and the expiry\n"
    );
    println!(
        "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
        "minute", "naive", "", "", "", "pinned", "", "", ""
    );
    println!(
        "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
        "", "allowed", "denied", "count", "lifetime", "allowed", "denied", "count", "lifetime"
    );

    let (mut naive_total, mut pinned_total) = (Tally::default(), Tally::default());
    let mut first_denied_minute = None;
    let start = Instant::now();
    for m in 0..MINUTES {
        let (mut naive_minute, mut pinned_minute) = (Tally::default(), Tally::default());
        for i in 0..PER_MINUTE {
            sleep_until(start + minute * m + minute * i / PER_MINUTE).await;
            let deploy = m == 0 && i == 0;

            // The common limiter: count (a new or expired row starts at 1),
            // then set the expiry in a second statement when the count is 1.
            // The deploy kills it in between.
            let count: i64 = db
                .query_one(
                    &format!(
                        "INSERT INTO {schema}.naive VALUES ('user', 1, NULL) \
                         ON CONFLICT (key) DO UPDATE SET count = CASE \
                           WHEN naive.expires_at <= now() THEN 1 ELSE naive.count + 1 END \
                         RETURNING count"
                    ),
                    &[],
                )
                .await?
                .get(0);
            if count == 1 && !deploy {
                db.execute(
                    &format!(
                        "UPDATE {schema}.naive SET expires_at = now() + $1::bigint * interval '1 millisecond' WHERE key = 'user'"
                    ),
                    &[&(minute.as_millis() as i64)],
                )
                .await?;
            }
            tally(&mut naive_minute, count as u64 <= LIMIT);

            // This crate: one statement. The deploy drops the request while
            // its hit is in flight: the statement ran whole or not at all.
            let hit = pinned.hit("sale", &user, quota);
            if deploy {
                let _ = tokio::time::timeout(Duration::from_micros(1), hit).await;
                tally(&mut pinned_minute, true);
            } else {
                tally(&mut pinned_minute, hit.await?.count <= LIMIT);
            }
        }
        if naive_minute.denied > 0 && first_denied_minute.is_none() {
            first_denied_minute = Some(m + 1);
        }
        let naive_state = naive(&db, &schema).await?;
        let pinned_state = match pinned.peek("sale", &user).await? {
            Some(hit) => (
                hit.count.to_string(),
                format!("{}ms", hit.reset.as_millis()),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        println!(
            "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
            m + 1,
            naive_minute.allowed,
            naive_minute.denied,
            naive_state.0,
            naive_state.1,
            pinned_minute.allowed,
            pinned_minute.denied,
            pinned_state.0,
            pinned_state.1
        );
        add(&mut naive_total, naive_minute);
        add(&mut pinned_total, pinned_minute);
    }
    let (final_count, ttl) = naive(&db, &schema).await?;
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;

    println!(
        "\nnaive: allowed={} denied={} first_denied_minute={} final_count={} ttl={} | pinned: allowed={} denied={}",
        naive_total.allowed,
        naive_total.denied,
        first_denied_minute.map_or("none".to_string(), |m| m.to_string()),
        final_count,
        ttl,
        pinned_total.allowed,
        pinned_total.denied
    );
    Ok(())
}

fn tally(t: &mut Tally, allowed: bool) {
    if allowed {
        t.allowed += 1;
    } else {
        t.denied += 1;
    }
}

fn add(total: &mut Tally, minute: Tally) {
    total.allowed += minute.allowed;
    total.denied += minute.denied;
}

/// The naive row's count and time left, as the database holds them now.
async fn naive(db: &Client, schema: &str) -> Result<(String, String), tokio_postgres::Error> {
    let row = db
        .query_opt(
            &format!(
                "SELECT count, (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM {schema}.naive WHERE key = 'user'"
            ),
            &[],
        )
        .await?;
    Ok(match row {
        None => ("-".to_string(), "-".to_string()),
        Some(row) => {
            let count: i64 = row.get(0);
            let left: Option<i64> = row.get(1);
            let ttl = match left {
                None => "none".to_string(),
                Some(ms) if ms <= 0 => "expired".to_string(),
                Some(ms) => format!("{ms}ms"),
            };
            (count.to_string(), ttl)
        }
    })
}
