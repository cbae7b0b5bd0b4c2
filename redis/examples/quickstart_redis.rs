//! The quickstart's server on the Redis backend: `GET /` allows 5 requests
//! per 10 seconds per client IP, shared by every instance pointed at the same
//! Redis; `GET /health` is not limited.
//!
//! It starts even while Redis is down: the backend connects in the
//! background, and until Redis answers every limited request gets a 503 at
//! once (the layer fails closed; `.on_failure(FailurePolicy::FailOpen)`
//! would let them through uncounted). Requests are limited again as soon as
//! Redis is up.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p tower-pinned-window-redis --example quickstart_redis
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};
use tower_pinned_window_redis::RedisBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse().map_err(|e| format!("PORT={port:?}: {e}"))?,
        Err(_) => 3000,
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    // Returns at once; fails only on a URL that is not a Redis URL.
    let backend = RedisBackend::connect_in_background(&url)?;

    let limit = RateLimitLayer::new("quickstart", Quota::new(5, Duration::from_secs(10))?)
        .key(ClientIp::new())
        .backend(backend);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(limit)
        .route("/health", get(|| async { "ok\n" }));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}, counting in {url}");
    println!(
        "try: for i in 1 2 3 4 5 6; do curl -si http://{addr}/ | grep -iE '^(HTTP|retry-after|ratelimit)'; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
