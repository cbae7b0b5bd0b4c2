//! Failed logins are limited, successful ones are free, and too many
//! failures lock the address out: `POST /login` with
//! `{"username": "alice", "password": "..."}` answers 200 for `hunter2` and
//! 401 for anything else. Each client IP may fail 5 times per 15 minutes;
//! a successful login is never counted (its hit is refunded once the 200 is
//! out). The attempt after 5 failures in a window locks the address out for
//! an hour, counted from that attempt: it and every attempt from that
//! address until the hour is over, the right password included, get 429
//! with `Retry-After` (3600 on the first), and more attempts never extend
//! the lockout.
//!
//! ```text
//! cargo run --example login                  # on 127.0.0.1:$PORT (3000)
//! curl -si -H 'content-type: application/json' -d '{"username":"alice","password":"guess"}' http://127.0.0.1:3000/login
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use tower_pinned_window::backend::MemoryBackend;
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer, Window};

/// How long an address is locked out once it has failed too often.
pub const LOCKOUT: Duration = Duration::from_secs(60 * 60);

/// The app, counting failed logins in `backend`.
pub fn app(backend: MemoryBackend) -> Router {
    let failed_logins = Quota::new(5, Duration::from_secs(15 * 60)).expect("a valid quota");
    let limit = RateLimitLayer::new("login", failed_logins)
        .key(ClientIp::new())
        .count_if(|res| res.is_auth_failure()) // only 401 and 403 count
        .backend(backend)
        .block_for(Window::new(LOCKOUT).expect("an hour is a window")); // the 6th attempt locks the address out
    Router::new().route("/login", post(login)).layer(limit)
}

/// `alice` / `hunter2` is right; anything else is 401. (A real service
/// would check a password hash, in constant time.)
async fn login(Json(body): Json<HashMap<String, String>>) -> (StatusCode, &'static str) {
    let field = |name| body.get(name).map(String::as_str);
    if field("username") == Some("alice") && field("password") == Some("hunter2") {
        (StatusCode::OK, "welcome, alice\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong username or password\n")
    }
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

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let login = |password: &str| {
        format!(
            "curl -si -H 'content-type: application/json' -d '{{\"username\":\"alice\",\"password\":\"{password}\"}}' http://{addr}/login | grep -iE '^(HTTP|retry-after|ratelimit:)'"
        )
    };
    println!(
        "listening on http://{addr}: 5 failed logins per 15 minutes per client IP, then locked out for an hour"
    );
    println!("a failed login (401, counted):\n  {}", login("guess"));
    println!(
        "the right password (200, never counted):\n  {}",
        login("hunter2")
    );
    println!(
        "five failures, then the right password gets 429 with Retry-After: 3600:\n  for i in 1 2 3 4 5; do {}; done; {}",
        login("guess"),
        login("hunter2")
    );
    axum::serve(
        listener,
        app(MemoryBackend::new()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
