//! A token budget: an LLM-style "completion" endpoint whose answers are
//! charged what they cost, in tokens, per API key. `POST /complete` with
//! `{"tokens": N}` answers with `x-usage-tokens: N` (a real service would
//! count the tokens it generated). Each `x-api-key` may spend
//! `TOKEN_BUDGET` (default `1000/min`) tokens per window: a request is
//! admitted while its key is under the budget, its answer's tokens are
//! charged once the body has been sent, and once the budget is spent every
//! request with that key gets 429 with `Retry-After` until the window that
//! its first request opened closes.
//!
//! ```text
//! cargo run --example token_budget           # on 127.0.0.1:$PORT (3000)
//! curl -si -H 'x-api-key: k1' -d '{"tokens": 300}' -H 'content-type: application/json' http://127.0.0.1:3000/complete
//! ```

use std::net::SocketAddr;

use axum::http::HeaderName;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use tower_pinned_window::backend::MemoryBackend;
use tower_pinned_window::key::HeaderKey;
use tower_pinned_window::{Quota, RateLimitLayer, cost::ResponseEnd};

/// The header the answer's cost is read from.
const USAGE: &str = "x-usage-tokens";

/// The budget from `TOKEN_BUDGET` (a rate string such as `1000/min` or
/// `50000 per 1d`), or 1000 tokens a minute.
pub fn budget() -> Result<Quota, String> {
    match std::env::var("TOKEN_BUDGET") {
        Ok(rate) => rate.parse().map_err(|e| format!("TOKEN_BUDGET: {e}")),
        Err(_) => Ok("1000/min".parse().expect("a valid rate")),
    }
}

/// The tokens an answer used, from its `x-usage-tokens` header (0 when it
/// has none: an error answer costs nothing).
fn tokens_used(end: &ResponseEnd<'_>) -> u64 {
    end.headers()
        .get(USAGE)
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

/// The app: `budget` tokens per API key, counted in `backend`.
pub fn app(backend: MemoryBackend, budget: Quota) -> Router {
    let limit = RateLimitLayer::new("tokens", budget)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .backend(backend)
        .charge(tokens_used);
    Router::new()
        .route("/complete", post(complete))
        .layer(limit)
}

/// Answers with as many tokens as asked for.
async fn complete(Json(body): Json<Value>) -> ([(&'static str, String); 1], Json<Value>) {
    let tokens = body["tokens"].as_u64().unwrap_or(0);
    let text = "lorem ".repeat(usize::try_from(tokens.min(10_000)).unwrap_or(0));
    (
        [(USAGE, tokens.to_string())],
        Json(json!({ "text": text.trim_end(), "usage": { "tokens": tokens } })),
    )
}

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
    let budget = budget()?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}: {budget} tokens per API key");
    println!(
        "five completions of 300 tokens (200, 200, 200, 200, then 429 with Retry-After):\n  for i in 1 2 3 4 5; do curl -si -H 'x-api-key: k1' -H 'content-type: application/json' -d '{{\"tokens\": 300}}' http://{addr}/complete | grep -iE '^(HTTP|retry-after|ratelimit:)'; done"
    );
    axum::serve(
        listener,
        app(MemoryBackend::new(), budget).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
