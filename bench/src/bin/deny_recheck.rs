//! How long an instance's deny cache keeps denying what another instance
//! freed (issue 39, item 1), for the figures in `bench/README.md`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:PORT/ DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release -p tower-pinned-window-bench --bin deny_recheck
//! ```
//!
//! Two instances, A and B, each a `RateLimitLayer` with `reserve` and
//! `charge` (2,000 tokens a minute per key, `WINDOW_S` to change the
//! window) on a backend of its own connection, on the same store. Each
//! trial, on a fresh key: A's call reserves 2,000 and its answer is held
//! (its body not read); B's call reserving 100 is denied, so B's deny cache
//! learns the key; A's answer ends and settles to 100, and the program
//! waits until the store holds 100 (from then on the store has room); B
//! then asks every 5 ms until it is admitted. It prints, per store, the
//! time from the store having room to B's first admission: the longest,
//! the median and the shortest of `TRIALS` trials (default 20). Each store
//! runs when its URL is set; PostgreSQL in a schema of its own, dropped at
//! the end.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::Spending;
use tower_pinned_window::key::{Key, RequestHead};
use tower_pinned_window::outcome::ResponseHead;
use tower_pinned_window::{Quota, RateLimitLayer};
use tower_pinned_window_postgres::PostgresBackend;
use tower_pinned_window_postgres::deadpool_postgres::{Manager, Pool};
use tower_pinned_window_redis::RedisBackend;

/// The budget per key and window.
const BUDGET: u64 = 2000;

/// Between two of B's asks.
const EVERY: Duration = Duration::from_millis(5);

fn number(headers: &axum::http::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// A request on `key` reserving `max_tokens`, whose answer will report a
/// use of 100.
fn call(key: &str, max_tokens: u64) -> Request<Body> {
    Request::post("/complete")
        .header("x-api-key", key)
        .header("x-max-tokens", max_tokens)
        .body(Body::empty())
        .unwrap()
}

/// One trial on a fresh `key`: the time from the store having room to B's
/// first admission; `None` when B's first call was not denied (nothing to
/// measure).
async fn trial<Bk: Spending>(a: &Bk, b: &Bk, window: Duration, key: &str) -> Option<Duration> {
    let layer = |backend: Bk| {
        RateLimitLayer::new("tokens", Quota::new(BUDGET, window).unwrap())
            .key(axum::http::HeaderName::from_static("x-api-key"))
            .backend(backend)
            .reserve(|req: &RequestHead<'_>| number(req.headers(), "x-max-tokens").unwrap_or(0))
            .charge(|end: &ResponseHead<'_>| number(end.headers(), "x-usage-tokens"))
            .layer(tower::service_fn(|_: Request<Body>| async {
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("x-usage-tokens", "100")
                        .body(Body::from("completion"))
                        .unwrap(),
                )
            }))
    };
    let (on_a, on_b) = (layer(a.clone()), layer(b.clone()));
    let held = on_a.clone().oneshot(call(key, BUDGET)).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK, "A's reservation");
    let denied = on_b.clone().oneshot(call(key, 100)).await.unwrap();
    if denied.status() != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    held.into_body().collect().await.unwrap();
    let key_of = Key::new(key);
    while a.peek("tokens", &key_of).await.unwrap().map(|h| h.count) != Some(100) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let room = Instant::now();
    loop {
        let response = on_b.clone().oneshot(call(key, 100)).await.unwrap();
        let status = response.status();
        response.into_body().collect().await.unwrap();
        if status == StatusCode::OK {
            return Some(room.elapsed());
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Runs the trials on `a` and `b` and prints the figures under `store`.
async fn measure<Bk: Spending>(store: &str, a: Bk, b: Bk, window: Duration, trials: usize) {
    let mut lasted = Vec::with_capacity(trials);
    for i in 0..trials {
        let key = format!("deny-recheck-{}-{i}", std::process::id());
        match trial(&a, &b, window, &key).await {
            Some(time) => lasted.push(time),
            None => eprintln!("{store}: trial {i}: B was not denied first"),
        }
    }
    lasted.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    match (lasted.last(), lasted.first()) {
        (Some(longest), Some(shortest)) => println!(
            "{store}: a false denial lasted at most {:.1} ms after the store had room (median {:.1} ms, least {:.1} ms; {} trials, window {} s)",
            ms(longest),
            ms(&lasted[lasted.len() / 2]),
            ms(shortest),
            lasted.len(),
            window.as_secs()
        ),
        _ => println!("{store}: nothing measured"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials: usize = std::env::var("TRIALS").map_or(Ok(20), |t| t.parse())?;
    let window = Duration::from_secs(std::env::var("WINDOW_S").map_or(Ok(60), |w| w.parse())?);
    if let Ok(url) = std::env::var("REDIS_URL") {
        let client = redis::Client::open(url.as_str())?;
        let a = RedisBackend::new(client.get_connection_manager().await?);
        let b = RedisBackend::new(client.get_connection_manager().await?);
        measure("Redis", a, b, window, trials).await;
    }
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let schema = format!("tpw_deny_recheck_{}", std::process::id());
        let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        db.batch_execute(&format!("CREATE SCHEMA {schema}")).await?;
        let backend = || {
            let pool = Pool::builder(Manager::new(url.parse().unwrap(), tokio_postgres::NoTls))
                .max_size(4)
                .build()
                .unwrap();
            PostgresBackend::builder(pool).schema(&schema).build()
        };
        let (a, b) = (backend(), backend());
        a.migrate().await?;
        measure("PostgreSQL", a, b, window, trials).await;
        db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await?;
    }
    Ok(())
}
