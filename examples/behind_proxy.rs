//! The quickstart behind a reverse proxy on the same host: the proxy at
//! 127.0.0.1 is trusted, so the client is read from the `X-Forwarded-For` it
//! appends; from any other peer the header is ignored. `GET /` allows 5
//! requests per 10 seconds per client IP; `GET /health` is not limited.
//!
//! ```text
//! cargo run --example behind_proxy
//! # as the proxy, for two clients: separate budgets
//! curl -s -o /dev/null -w '%{http_code}\n' -H 'X-Forwarded-For: 203.0.113.1' http://127.0.0.1:3000/
//! # a client that is not the proxy cannot choose its key
//! curl -s -o /dev/null -w '%{http_code}\n' --interface 127.0.0.2 -H 'X-Forwarded-For: 1.2.3.4' http://127.0.0.1:3000/
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, http::HeaderName, routing::get};
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let port: u16 = std::env::var("PORT").ok().map_or(Ok(3000), |p| p.parse())?;

    let client_ip = ClientIp::new()
        .trust("127.0.0.1/32")?
        .header(HeaderName::from_static("x-forwarded-for"));
    let limit =
        RateLimitLayer::new("behind-proxy", Quota::new(5, Duration::from_secs(10))?).key(client_ip);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(limit)
        .route("/health", get(|| async { "ok\n" }));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}, trusting the proxy at 127.0.0.1",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
