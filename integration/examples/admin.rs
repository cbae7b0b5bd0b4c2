//! An API with an operator's route: `/admin/limits`, behind a bearer
//! token, reads, resets, blocks and unblocks an API key's budget, and sets
//! the limits of a tier while the API runs.
//!
//! **Never mount the operator's service without authentication**: here a
//! bearer token from `ADMIN_TOKEN` (at least 16 characters), compared in
//! constant time. The API, `GET /api/hello`, allows 5 requests a minute per
//! `x-api-key` (tier `free`), or 60 for keys that start with `pro_` (tier
//! `pro`), and its requests spend (`cost(1)`), so they read lockouts and a
//! block blocks. The tiers' limits are held in the store too (a
//! [`LimitBook`], staleness 1 s): `/admin/limits/limits/set` changes a tier
//! for every instance on the store, the count of each key kept.
//!
//! The store is the memory backend, or Redis when `REDIS_URL` is set
//! (build with `--features redis`), or PostgreSQL when `DATABASE_URL` is
//! set (`--features postgres`):
//!
//! ```text
//! ADMIN_TOKEN=change-me-to-a-long-secret cargo run --example admin --features operator
//! curl -H 'x-api-key: alice' localhost:3000/api/hello
//! T='authorization: Bearer change-me-to-a-long-secret'; J='content-type: application/json'
//! curl -H "$T" localhost:3000/admin/limits
//! curl -H "$T" -H "$J" -d '{"layer":"api","key":"alice"}' localhost:3000/admin/limits/read
//! curl -H "$T" -H "$J" -d '{"layer":"api","key":"alice","seconds":600}' localhost:3000/admin/limits/block
//! curl -H "$T" -H "$J" -d '{"layer":"api","key":"alice"}' localhost:3000/admin/limits/unblock
//! curl -H "$T" -H "$J" -d '{"layer":"api","key":"alice"}' localhost:3000/admin/limits/reset
//! ```
//!
//! A tier upgraded and downgraded under load: one shell sends a request a
//! tenth of a second as `bob` and prints each status, another changes the
//! `free` tier. Bob gets 5, then 429s; upgraded to 12 a minute he gets 7
//! more (his count is kept, no fresh budget), within a second; downgraded
//! to 3 he is denied until his window ends, and so is a new key past its 3rd:
//!
//! ```text
//! while sleep 0.1; do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: bob' localhost:3000/api/hello; done
//! curl -H "$T" -H "$J" -d '{"layer":"api","tier":"free","rate":"12/min"}' localhost:3000/admin/limits/limits/set
//! curl -H "$T" -H "$J" -d '{"layer":"api","tier":"free","rate":"3/min"}' localhost:3000/admin/limits/limits/set
//! curl -H "$T" -H "$J" -d '{"layer":"api"}' localhost:3000/admin/limits/limits
//! curl -H "$T" -H "$J" -d '{"layer":"api","tier":"free"}' localhost:3000/admin/limits/limits/clear
//! ```
//!
//! With `REDIS_URL` or `DATABASE_URL`, run two instances on two ports
//! (`PORT=3001`): a set through either applies on both within the book's
//! staleness (1 s) plus one read.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower_pinned_window::backend::{Heeding, Limits};
use tower_pinned_window::key::RequestHead;
use tower_pinned_window::operator::Operator;
use tower_pinned_window::{LimitBook, NamedQuota, Quota, RateLimitLayer};

/// The header that names the caller's API key.
pub const API_KEY: &str = "x-api-key";

/// The shortest admin token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// How stale each instance's copy of the limits held in the store may be.
pub const STALENESS: Duration = Duration::from_secs(1);

/// The tier of a request: `pro` for an API key that starts with `pro_`,
/// else `free` (an application would look it up from its authentication).
fn tier(head: &RequestHead<'_>, free: &NamedQuota, pro: &NamedQuota) -> Option<NamedQuota> {
    let key = head.headers().get(API_KEY)?.as_bytes();
    Some(if key.starts_with(b"pro_") { pro } else { free }.clone())
}

/// The app: the API, rate-limited per API key in `store` at its tier's
/// limit (held in the store, else `free` 5 a minute, `pro` 60), and the
/// operator's service under `/admin/limits`, behind `token`.
///
/// # Panics
/// When `token` is shorter than [`MIN_TOKEN_LEN`].
pub fn app<Bk: Heeding + Limits>(store: Bk, token: &str) -> Router {
    assert!(
        token.len() >= MIN_TOKEN_LEN,
        "the admin token must be at least {MIN_TOKEN_LEN} characters"
    );
    let minute = |n| Quota::new(n, Duration::from_secs(60)).unwrap();
    let (free, pro) = (
        NamedQuota::new("free", minute(5)),
        NamedQuota::new("pro", minute(60)),
    );
    // One book for the layer and the operator: a set through the
    // operator is read again by this instance at its next request.
    let book = LimitBook::new(&store, STALENESS).unwrap();
    let api = RateLimitLayer::new("api", minute(5))
        .key(header::HeaderName::from_static(API_KEY))
        .quota_by(move |head| tier(head, &free, &pro))
        .backend(store)
        .limits(book.clone())
        .cost(1);
    let operator = Operator::new().layer(&api).limits(book);
    let token: Arc<[u8]> = token.as_bytes().into();
    let admin = Router::new()
        .nest_service("/admin/limits", operator.service())
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let token = Arc::clone(&token);
            async move { bearer(&token, request, next).await }
        }));
    Router::new()
        .route("/api/hello", get(|| async { "hello" }))
        .layer(api)
        .merge(admin)
}

/// Lets the request through only with `authorization: Bearer <token>`;
/// otherwise 401, as a problem document.
async fn bearer(token: &[u8], request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    match given {
        Some(given) if same(given, token) => next.run(request).await,
        _ => {
            let body = r#"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"an admin bearer token is required"}"#;
            let mut response = (StatusCode::UNAUTHORIZED, Body::from(body)).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// Whether `given` is `expected`, in a time that depends only on
/// `expected`'s length: every byte of it is compared, whatever `given`
/// holds.
pub fn same(given: &[u8], expected: &[u8]) -> bool {
    let mut differ = given.len() ^ expected.len();
    for (i, &byte) in expected.iter().enumerate() {
        differ |= usize::from(given.get(i).copied().unwrap_or(0) ^ byte);
    }
    std::hint::black_box(differ) == 0
}

#[allow(dead_code, reason = "the test has its own main")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let token = std::env::var("ADMIN_TOKEN")
        .map_err(|_| "set ADMIN_TOKEN to a secret of at least 16 characters")?;
    if token.len() < MIN_TOKEN_LEN {
        return Err("ADMIN_TOKEN must be at least 16 characters".into());
    }
    let app = store_app(&token).await?;
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |p| p.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// The app on the store the environment names.
#[allow(dead_code, reason = "the test builds its own stores")]
async fn store_app(token: &str) -> Result<Router, Box<dyn std::error::Error>> {
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        println!("store: Redis at {url}");
        return Ok(app(
            tower_pinned_window_redis::RedisBackend::connect(&url).await?,
            token,
        ));
    }
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let store = tower_pinned_window_postgres::PostgresBackend::connect(&url).await?;
        store.migrate().await?;
        println!("store: PostgreSQL at {url}");
        return Ok(app(store, token));
    }
    println!("store: memory (set REDIS_URL or DATABASE_URL for a shared store)");
    Ok(app(
        tower_pinned_window::backend::MemoryBackend::new(),
        token,
    ))
}
