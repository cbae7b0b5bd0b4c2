//! A token budget: an LLM-style "completion" endpoint whose calls spend
//! tokens per API key. `POST /complete` with the JSON body
//! `{"max_tokens": M, "tokens": N}` (`max_tokens`: the most the call may
//! use, where OpenAI's and Anthropic's APIs put it;
//! [`DEFAULT_MAX_TOKENS`] without one; `tokens`: how many the fake model
//! generates) answers with `x-usage-tokens: min(N, M)` (a real service
//! would count the tokens it generated). Each `x-api-key` may spend
//! `TOKEN_BUDGET` (default `1000/min`) tokens per window.
//!
//! Each call **reserves** its body's `max_tokens` on the way in, all or
//! nothing: the layer reads at most [`BODY_LIMIT`] bytes of the body before
//! it decides (a longer body gets 413), then hands the body whole to the
//! handler. A call is admitted only if the estimate fits in what is left, and its
//! `RateLimit` header shows the budget after the reservation. Once the body
//! has been sent, its answer **settles** the reservation to the tokens it
//! used: the unused part goes back to the budget. A call whose estimate
//! does not fit in what is left gets 429 with `Retry-After` until the
//! window that its first call opened closes, and its `RateLimit` header
//! shows what is left (`r=100` after three calls of 300); an estimate
//! above the whole budget gets 429 without `Retry-After`, since no wait
//! makes room for it.
//!
//! ```text
//! cargo run --example token_budget --features json   # on 127.0.0.1:$PORT (3000)
//! curl -si -H 'x-api-key: k1' -H 'content-type: application/json' -d '{"max_tokens": 300, "tokens": 300}' http://127.0.0.1:3000/complete
//! cargo run --example token_budget --features json -- --measure
//! ```
//!
//! `--measure` serves the app on 127.0.0.1 (a free port) twice per case,
//! charged only after the answer and reserved then settled, sends calls with
//! one key one after another until the first 429, and prints what each
//! admitted and spent, read from the backend:
//!
//! ```text
//! calls of 300 tokens, estimate 300, on a budget of 1000 per window:
//!   charge only: admitted 4, spent 1200 of 1000 (overspend 200)
//!   reserve then settle: admitted 3, spent 900 of 1000 (overspend 0)
//! ```

use std::fmt;
use std::net::SocketAddr;

use axum::http::HeaderName;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use tower_pinned_window::backend::{Backend, MemoryBackend};
use tower_pinned_window::cost::BodyEstimate;
use tower_pinned_window::key::Key;
use tower_pinned_window::outcome::ResponseHead;
use tower_pinned_window::{Quota, RateLimitLayer};

/// The layer's name: the namespace of its counters.
const NAME: &str = "tokens";

/// The header the answer's cost is read from.
const USAGE: &str = "x-usage-tokens";

/// The body's field a call's estimate is read from: the most tokens it may
/// use.
const MAX_TOKENS: &str = "max_tokens";

/// A call's estimate when its body has no `max_tokens`, or one that is not
/// a non-negative integer, or is not JSON: the most tokens it may then use.
pub const DEFAULT_MAX_TOKENS: u64 = 256;

/// The most bytes of a body read for its estimate; a longer body gets 413.
pub const BODY_LIMIT: usize = 64 * 1024;

/// The budget from `TOKEN_BUDGET` (a rate string such as `1000/min` or
/// `50000 per 1d`), or 1000 tokens a minute.
pub fn budget() -> Result<Quota, String> {
    match std::env::var("TOKEN_BUDGET") {
        Ok(rate) => rate.parse().map_err(|e| format!("TOKEN_BUDGET: {e}")),
        Err(_) => Ok("1000/min".parse().expect("a valid rate")),
    }
}

/// How the app spends a call's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budgeting {
    /// Admitted while the key is under its budget, charged the tokens used
    /// once the answer has been sent: the last call of a window can
    /// overspend by its whole cost.
    ChargeOnly,
    /// Reserves its estimate on the way in, all or nothing; the answer
    /// settles it to the tokens used.
    ReserveThenSettle,
}

impl fmt::Display for Budgeting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ChargeOnly => "charge only",
            Self::ReserveThenSettle => "reserve then settle",
        })
    }
}

/// A call's estimate: its body's `max_tokens`, or [`DEFAULT_MAX_TOKENS`];
/// a body over [`BODY_LIMIT`] bytes gets 413.
fn estimate() -> BodyEstimate {
    BodyEstimate::json_field(MAX_TOKENS, DEFAULT_MAX_TOKENS)
        .body_limit(BODY_LIMIT)
        .reject_over_limit(true)
}

/// The tokens an answer used, from its `x-usage-tokens` header; `None`
/// when it has none or it is not a number (nothing is charged, and a
/// reservation stays spent).
pub fn tokens_used(end: &ResponseHead<'_>) -> Option<u64> {
    end.headers().get(USAGE)?.to_str().ok()?.parse().ok()
}

/// The app: `budget` tokens per API key, counted in `backend`, reserved
/// then settled.
pub fn app(backend: MemoryBackend, budget: Quota) -> Router {
    app_with(backend, budget, Budgeting::ReserveThenSettle)
}

/// The app, spending tokens as `budgeting` says.
pub fn app_with(backend: MemoryBackend, budget: Quota, budgeting: Budgeting) -> Router {
    let limit = RateLimitLayer::new(NAME, budget)
        .key(HeaderName::from_static("x-api-key"))
        .backend(backend)
        .charge(tokens_used);
    let router = Router::new().route("/complete", post(complete));
    match budgeting {
        Budgeting::ChargeOnly => router.layer(limit),
        Budgeting::ReserveThenSettle => router.layer(limit.reserve_from_body(estimate())),
    }
}

/// Answers with as many tokens as asked for, at most `max_tokens`.
async fn complete(Json(body): Json<Value>) -> ([(&'static str, String); 1], Json<Value>) {
    let max_tokens = body[MAX_TOKENS].as_u64().unwrap_or(DEFAULT_MAX_TOKENS);
    let tokens = body["tokens"].as_u64().unwrap_or(0).min(max_tokens);
    let text = "lorem ".repeat(usize::try_from(tokens.min(10_000)).unwrap_or(0));
    (
        [(USAGE, tokens.to_string())],
        Json(json!({ "text": text.trim_end(), "usage": { "tokens": tokens } })),
    )
}

/// What one run of [`measure`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// How the app spent tokens.
    pub budgeting: Budgeting,
    /// Calls answered 200 before the first 429.
    pub admitted: u64,
    /// The key's count in the backend once the first 429 came.
    pub spent: u64,
    /// The budget's limit.
    pub limit: u64,
}

impl Measured {
    /// Tokens spent past the budget.
    pub fn overspend(&self) -> u64 {
        self.spent.saturating_sub(self.limit)
    }
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: admitted {}, spent {} of {} (overspend {})",
            self.budgeting,
            self.admitted,
            self.spent,
            self.limit,
            self.overspend()
        )
    }
}

/// Serves the app (spending as `budgeting` says) on 127.0.0.1, a free port,
/// over real TCP, and sends calls with one key, each with
/// `{"max_tokens": estimate, "tokens": usage}`, one after another, until the first
/// 429. `spent` is read from the backend (`Backend::peek`), not added up.
pub async fn measure(
    budget: Quota,
    budgeting: Budgeting,
    estimate: u64,
    usage: u64,
) -> Result<Measured, Box<dyn std::error::Error + Send + Sync>> {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    if usage == 0 {
        return Err("calls that use no tokens would be admitted for ever".into());
    }
    let backend = MemoryBackend::new();
    let app = app_with(backend.clone(), budget, budgeting);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = Bytes::from(json!({ MAX_TOKENS: estimate, "tokens": usage }).to_string());
    let mut admitted = 0;
    // Each admitted call spends at least one token: the budget is spent
    // within `limit + 1` calls.
    let mut denied = false;
    for _ in 0..=budget.limit() {
        let request = http::Request::post(format!("http://{addr}/complete"))
            .header("x-api-key", "k1")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))?;
        let response = client.request(request).await?;
        let status = response.status();
        // The whole body: once it has been sent, the answer is charged.
        response.into_body().collect().await?;
        match status.as_u16() {
            200 => admitted += 1,
            429 => {
                denied = true;
                break;
            }
            other => return Err(format!("unexpected status {other}").into()),
        }
    }
    server.abort();
    if !denied {
        return Err(format!("no 429 after {admitted} calls").into());
    }
    let spent = backend
        .peek(NAME, &Key::new("k1"))
        .await?
        .map_or(0, |hit| hit.count);
    Ok(Measured {
        budgeting,
        admitted,
        spent,
        limit: budget.limit(),
    })
}

/// `--measure`: the overspend per window, with and without reservations,
/// for calls that use their whole estimate and calls that use less.
async fn measure_all(budget: Quota) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let estimate = 300;
    let mut settled = Vec::new();
    for usage in [300, 120] {
        println!(
            "calls of {usage} tokens, estimate {estimate}, on a budget of {} per window:",
            budget.limit()
        );
        for budgeting in [Budgeting::ChargeOnly, Budgeting::ReserveThenSettle] {
            let measured = measure(budget, budgeting, estimate, usage).await?;
            println!("  {measured}");
            if budgeting == Budgeting::ReserveThenSettle {
                settled.push((usage, measured.admitted));
            }
        }
    }
    if let [(full, all), (part, some)] = settled[..] {
        println!(
            "settling refunds the unused estimate: {some} calls of {part} tokens admitted, {all} of {full}"
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let budget = budget()?;
    if std::env::args().skip(1).any(|arg| arg == "--measure") {
        return measure_all(budget).await;
    }
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse().map_err(|e| format!("PORT={port:?}: {e}"))?,
        Err(_) => 3000,
    };

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}: {budget} tokens per API key, reserved then settled");
    println!(
        "four completions of 300 tokens, each reserving 300 (200, 200, 200, then 429 with Retry-After and r=100):\n  for i in 1 2 3 4; do curl -si -H 'x-api-key: k1' -H 'content-type: application/json' -d '{{\"max_tokens\": 300, \"tokens\": 300}}' http://{addr}/complete | grep -iE '^(HTTP|retry-after|ratelimit:)'; done"
    );
    axum::serve(
        listener,
        app(MemoryBackend::new(), budget).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
