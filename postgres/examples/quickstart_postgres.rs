//! The quickstart's server on the PostgreSQL backend: `GET /` allows 5
//! requests per 10 seconds per client IP, shared by every instance pointed at
//! the same database; `GET /health` is not limited.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p tower-pinned-window-postgres --example quickstart_postgres
//! ```
//!
//! It creates the table `public.tpw_counters` if it is missing.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};
use tower_pinned_window_postgres::PostgresBackend;

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
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let backend = PostgresBackend::connect(&url).await?;
    backend.migrate().await?;

    let limit = RateLimitLayer::new("quickstart", Quota::new(5, Duration::from_secs(10))?)
        .key(ClientIp::new())
        .backend(backend.clone());
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(limit)
        .route("/health", get(|| async { "ok\n" }));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!(
        "listening on http://{addr}, counting in {} at {url}",
        backend.table()
    );
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
