//! The quickstart's server for load tests: `GET /` per client IP, with the
//! layer (`LIMIT=on`, the default; `LIMIT=noheaders` without the RateLimit
//! headers) or without it (`LIMIT=off`); `LIMIT=book` is `on` with its
//! limit held in the memory backend (a [`LimitBook`] with a staleness of 1 s,
//! the layer's stored limit set once at start). `LIMIT=redis` counts in the Redis
//! at `REDIS_URL` (coalesced hits, the default) and `LIMIT=redis-single` with
//! one EVALSHA per hit (`.coalesce(false)`), both keyed by the `x-client`
//! header (`bench/wrk_keys.lua` spreads it over 10,000 values);
//! `LIMIT=redis-cost` spends a cost of 1 a request, and `LIMIT=redis-charged`
//! checks the budget (a spend of 0 that opens the window) and charges 1 once
//! the answer is sent, as a token budget does. `LIMIT=redis-wait` is the
//! plain hit in the replica-acknowledged mode (`wait_for_replicas(1, 100
//! ms)`: the Redis at `REDIS_URL` needs a replica). `LIMIT=static-headers`
//! has no layer but writes the layer's two headers as constants. The quota is
//! large enough that every request is admitted, so a load test measures what
//! counting costs, not how fast 429s are written; except `LIMIT=redis-limited`,
//! the plain hit with a real limit (5 per 10 s per key), where most
//! requests are denied, most of them by the deny cache.
//! `LIMIT=redis-in-flight` caps the requests in flight per `x-client` in the
//! same Redis instead (`InFlightLayer`, a cap no key reaches): a take before
//! the handler, a give-back when the answer's body ends, both coalesced;
//! `LIMIT=redis-in-flight-single` the same with one call a step
//! (`.coalesce(false)`, as before takes and give-backs were coalesced).
//! `LIMIT=redis-capped` is the plain route's quota with an in-flight cap in
//! the same layer (`RateLimitLayer::in_flight`, a cap no key reaches): one
//! store step takes the slot and counts the hit, and a give-back follows.
//! `LIMIT=redis-book` is the plain route with its limit held in the same
//! Redis (a [`LimitBook`] with a staleness of 1 s, the layer's stored limit
//! set once at start, also too large to reach): what reading stored limits
//! costs a request.
//!
//! Used by `bench/wrk.sh` and `bench/wrk_redis.sh`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use tower_pinned_window::backend::{LimitScope, MemoryBackend};
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{
    InFlight, InFlightLayer, LimitBook, Quota, RateLimitLayer, response::HeaderStyle,
};
use tower_pinned_window_redis::RedisBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT").ok().map_or(Ok(3000), |p| p.parse())?;
    let limit = std::env::var("LIMIT").unwrap_or_else(|_| "on".into());
    let mut app = Router::new().route("/", get(|| async { "hello\n" }));
    match limit.as_str() {
        "on" | "noheaders" | "book" => {
            let quota = Quota::new(u64::MAX, Duration::from_secs(10))?;
            let mut layer = RateLimitLayer::new("wrk", quota).key(ClientIp::new());
            if limit == "noheaders" {
                layer = layer.headers(HeaderStyle::None);
            }
            if limit == "book" {
                let backend = MemoryBackend::new();
                let book = LimitBook::new(&backend, Duration::from_secs(1))?;
                let stored = Quota::new(u64::MAX / 2, Duration::from_secs(10))?;
                book.set("wrk", LimitScope::Layer, stored).await?;
                layer = layer.backend(backend).limits(book);
            }
            app = app.route_layer(layer);
        }
        "redis"
        | "redis-single"
        | "redis-cost"
        | "redis-charged"
        | "redis-wait"
        | "redis-limited"
        | "redis-in-flight"
        | "redis-in-flight-single"
        | "redis-capped"
        | "redis-book" => {
            let url = std::env::var("REDIS_URL")?;
            let mut info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?;
            // NODELAY=1: TCP_NODELAY on the connection to Redis (off by
            // default in redis-rs), so that a lane's second call is not held
            // by Nagle's algorithm until the first call's bytes are acked.
            if std::env::var("NODELAY").is_ok_and(|v| v == "1") {
                let tcp = info.tcp_settings().clone().set_nodelay(true);
                info = info.set_tcp_settings(tcp);
            }
            let connection = redis::Client::open(info)?.get_connection_manager().await?;
            let single = limit == "redis-single" || limit == "redis-in-flight-single";
            let mut backend = RedisBackend::builder(connection).coalesce(!single);
            if limit == "redis-wait" {
                backend = backend.wait_for_replicas(1, Duration::from_millis(100));
            }
            let backend = backend.build();
            if limit.starts_with("redis-in-flight") {
                // Never reached: a key has a request or two in flight.
                let cap = InFlight::new(1_000_000, Duration::from_secs(60))?;
                let layer = InFlightLayer::new("wrk", cap)
                    .key(axum::http::HeaderName::from_static("x-client"))
                    .backend(backend);
                app = app.route_layer(layer);
                return serve(app, port, &limit).await;
            }
            let quota = if limit == "redis-limited" {
                Quota::new(5, Duration::from_secs(10))?
            } else {
                Quota::new(u64::MAX / 2, Duration::from_secs(60))?
            };
            let mut layer = RateLimitLayer::new("wrk", quota)
                .key(axum::http::HeaderName::from_static("x-client"))
                .backend(backend.clone());
            if limit == "redis-book" {
                let book = LimitBook::new(&backend, Duration::from_secs(1))?;
                let stored = Quota::new(u64::MAX / 4, Duration::from_secs(60))?;
                book.set("wrk", LimitScope::Layer, stored).await?;
                layer = layer.limits(book);
            }
            app = match limit.as_str() {
                "redis-cost" => app.route_layer(layer.cost(1)),
                "redis-capped" => {
                    let cap = InFlight::new(1_000_000, Duration::from_secs(60))?;
                    app.route_layer(layer.in_flight(cap))
                }
                "redis-charged" => app.route_layer(layer.charge(|_| 1)),
                _ => app.route_layer(layer),
            };
        }
        "off" => {}
        // A layer that does nothing: what wrapping the route costs by itself.
        "identity" => {
            app = app.route_layer(tower::util::MapResponseLayer::new(
                |r: axum::response::Response| r,
            ));
        }
        // No layer, but the two headers the layer writes, as constants of
        // the same length: what sending those bytes costs by itself.
        "static-headers" => {
            app = app.route_layer(tower::util::MapResponseLayer::new(
                |mut r: axum::response::Response| {
                    let headers = r.headers_mut();
                    headers.insert(
                        "ratelimit",
                        axum::http::HeaderValue::from_static("\"wrk\";r=999999999999999;t=10"),
                    );
                    headers.insert(
                        "ratelimit-policy",
                        axum::http::HeaderValue::from_static("\"wrk\";q=999999999999999;w=10"),
                    );
                    r
                },
            ));
        }
        other => {
            return Err(format!(
                "LIMIT must be on, noheaders, book, redis, redis-single, redis-cost, redis-charged, redis-wait, redis-limited, redis-in-flight, redis-in-flight-single, redis-capped, redis-book, off, identity or static-headers, not {other:?}"
            )
            .into());
        }
    }
    serve(app, port, &limit).await
}

/// Serve `app` on `port` until the process is killed.
async fn serve(app: Router, port: u16, limit: &str) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} (LIMIT={limit})",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
