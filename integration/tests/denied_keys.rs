//! The keys denied most, through a real axum app over TCP: one key floods,
//! a thousand distinct keys are denied once each, and the layer's handle
//! shows the flooding key first, with its exact count, as a digest; on the
//! memory backend and (feature `redis`) on a real Redis, whose answers
//! come later.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{HeaderName, StatusCode};
use support::http::{Client, serve};
use tower_pinned_window::backend::{Backend, MemoryBackend};
use tower_pinned_window::denied::{DeniedKeys, TopDenied};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, RateLimitLayer};
use trial::Needs;

/// The flooding client's API key.
const HEAVY: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
/// Its requests: the first passes, the rest are denied.
const HEAVY_REQUESTS: u64 = 200;
/// Distinct clients, each sending two requests: one denial each.
const DISTINCT: u64 = 1_000;
/// The table's size.
const CAPACITY: usize = 50;

/// The flood through `backend`, then what the handle shows.
async fn flood_and_read<Bk: Backend>(backend: Bk) {
    let quota = Quota::new(1, Duration::from_secs(60)).unwrap();
    let layer = RateLimitLayer::new("api", quota)
        .key(HeaderName::from_static("x-api-key"))
        .backend(backend)
        .top_denied(TopDenied::new(CAPACITY).unwrap());
    let denied = layer.denied_keys().expect("turned on");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let server = serve(app).await;
    let client = Client::new();
    let send = |key: String| {
        let request = client.get(&server.url).header("x-api-key", key);
        async move { request.send().await.unwrap().status() }
    };

    let mut heavy_denied = 0;
    let mut distinct_denied = 0;
    let mut heavy_sent = 0;
    for i in 0..DISTINCT {
        for _ in 0..2 {
            if send(format!("client-{i:04}")).await == StatusCode::TOO_MANY_REQUESTS {
                distinct_denied += 1;
            }
        }
        if i % 5 == 0 && heavy_sent < HEAVY_REQUESTS {
            heavy_sent += 1;
            if send(HEAVY.to_owned()).await == StatusCode::TOO_MANY_REQUESTS {
                heavy_denied += 1;
            }
        }
    }
    assert_eq!(heavy_sent, HEAVY_REQUESTS);
    assert_eq!(
        (heavy_denied, distinct_denied),
        (HEAVY_REQUESTS - 1, DISTINCT)
    );
    read(&denied, heavy_denied, distinct_denied);
}

/// What the handle shows after the flood.
fn read(denied: &DeniedKeys, heavy_denied: u64, distinct_denied: u64) {
    assert_eq!(denied.denials(), heavy_denied + distinct_denied);
    let top = denied.top(5);
    assert_eq!(top[0].digest, denied.digest(&Key::new(HEAVY)), "{top:?}");
    assert_eq!((top[0].denied, top[0].error), (heavy_denied, 0), "exact");
    assert!(top[1].denied < heavy_denied / 2, "{top:?}");
    // Bounded: never more than its capacity, however many keys were denied.
    assert_eq!(denied.top(usize::MAX).len(), CAPACITY);
    for shown in denied.top(usize::MAX) {
        assert_eq!(shown.digest.len(), 32);
        assert!(!shown.digest.contains("client-") && !shown.digest.contains("sk_live"));
    }
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_string(&top[0]).unwrap();
        let want = format!(
            r#"{{"digest":"{}","denied":{heavy_denied},"error":0}}"#,
            top[0].digest
        );
        assert_eq!(json, want);
    }
}

async fn on_the_memory_backend() {
    flood_and_read(MemoryBackend::new()).await;
}

#[cfg(feature = "redis")]
async fn on_a_redis_server() {
    use support::redis::RedisServer;
    use tower_pinned_window_redis::RedisBackend;
    let server = redis_or_skip!(RedisServer::start("denied_keys on_a_redis_server"));
    let manager = server.client().get_connection_manager().await.unwrap();
    flood_and_read(RedisBackend::new(manager)).await;
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test
/// whose server is missing is reported as ignored.
fn main() {
    #[allow(unused_mut)]
    let mut trials = vec![trial::current(
        "on_the_memory_backend",
        Needs::Nothing,
        on_the_memory_backend,
    )];
    #[cfg(feature = "redis")]
    trials.push(trial::current(
        "on_a_redis_server",
        Needs::Redis,
        on_a_redis_server,
    ));
    trial::run(trials, ())
}
