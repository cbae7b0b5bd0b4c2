//! The quickstart's routes, with the limiter's metrics served in
//! Prometheus' text format at `GET /metrics` (feature `metrics`, through
//! `metrics-exporter-prometheus`).
//!
//! ```text
//! cargo run --example metrics --features metrics
//! for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics | grep tower_pinned_window
//! ```
//!
//! `PORT` changes the port (default 3000), `RATE_LIMIT` the quota (default
//! `5/10s`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};

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
    let quota = rate_limit().unwrap_or_else(|err| {
        eprintln!("{err}");
        std::process::exit(2);
    });

    // Install the recorder before the first request: the limiter registers
    // its counters with whatever recorder is installed when it first counts.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let limit = RateLimitLayer::new("quickstart", quota).key(ClientIp::new());
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(limit)
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let prometheus = prometheus.clone();
                async move {
                    // Without the exporter's HTTP listener, nothing else
                    // drains the histograms' buckets.
                    prometheus.run_upkeep();
                    prometheus.render()
                }
            }),
        );

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr} ({quota} per client IP)");
    println!(
        "try: for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done; curl -s http://{addr}/metrics"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The quota in `RATE_LIMIT` (a rate string such as `100/min`), or 5 per
/// 10 seconds when it is not set.
fn rate_limit() -> Result<Quota, String> {
    match std::env::var("RATE_LIMIT") {
        Ok(rate) => rate.parse().map_err(|e| format!("RATE_LIMIT: {e}")),
        Err(std::env::VarError::NotPresent) => {
            Ok(Quota::new(5, Duration::from_secs(10)).expect("5 per 10 s is a valid quota"))
        }
        Err(err) => Err(format!("RATE_LIMIT: {err}")),
    }
}
