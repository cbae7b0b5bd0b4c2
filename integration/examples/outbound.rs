//! Four clients share one provider's budget: they wait for its window
//! instead of being answered 429.
//!
//! A fake provider (a small axum server on 127.0.0.1) allows `LIMIT` calls
//! per window pinned to the first call it sees, answers 429 past that, and
//! counts what it receives. Four clients, each with its own
//! [`BudgetLayer`] and its own backend, all pointed at one store, call it
//! over TCP through hyper-util's client; together they demand three times
//! the budget for about 20 s (`DURATION_SECS`). A call the budget cannot serve
//! within 2 s fails (at once, when its client can tell), and calls beyond 64
//! waiting per client are shed; neither reaches the provider.
//!
//! The store is the memory backend, shared in this process, or Redis when
//! `REDIS_URL` is set (build with `--features redis`):
//!
//! ```text
//! cargo run --example outbound
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example outbound --features redis
//! ```
//!
//! The clients are given the provider's own quota. Their layers add the
//! default margin (`DEFAULT_MARGIN`, 20 ms) to each window the store pins:
//! the provider's window opens when the first call reaches it, a little
//! after the store counted that call, and without the margin a call of the
//! clients' next window could land in the provider's previous one.
//!
//! The per-client lines show how the budget is shared across processes:
//! the store serves whoever asks first, and a client whose line's head
//! asks first when a window opens sends as much of its line as fits, so
//! the shares are uneven (one run: 139, 107, 60 and 134 calls; shares as
//! far apart as 194 and 57 have been seen). Nothing evens them out over a
//! run: arrival order holds only within a client's own line. The total is
//! what holds: no provider window past its limit, every window used in
//! full. See "Fairness across processes" in `docs/outbound.md`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::Heeding;
use tower_pinned_window::outbound::{BudgetError, BudgetLayer, DEFAULT_MARGIN};

/// The provider's limit per window.
pub const LIMIT: u64 = 20;
/// The provider's window.
pub const WINDOW: Duration = Duration::from_secs(1);
/// The clients.
pub const CLIENTS: usize = 4;

/// What the provider saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Calls per window, in order, the current one last.
    pub windows: Vec<u64>,
    /// Calls answered 429.
    pub rejected: u64,
    start: Option<Instant>,
}

impl Seen {
    /// Calls received.
    pub fn calls(&self) -> u64 {
        self.windows.iter().sum()
    }

    /// The most calls in one window.
    pub fn most(&self) -> u64 {
        self.windows.iter().copied().max().unwrap_or(0)
    }

    /// The report's last line.
    pub fn line(&self) -> String {
        format!(
            "provider saw {} calls in {} windows, at most {} in one window (limit {LIMIT}), 429s: {}",
            self.calls(),
            self.windows.len(),
            self.most(),
            self.rejected
        )
    }
}

/// One call, as the provider counts it: in the window pinned to the first
/// call after the last one closed.
async fn provider(State(seen): State<Arc<Mutex<Seen>>>) -> StatusCode {
    let mut seen = seen.lock().unwrap();
    let now = Instant::now();
    if seen.start.is_none_or(|start| now >= start + WINDOW) {
        seen.start = Some(now);
        seen.windows.push(0);
    }
    let count = seen.windows.last_mut().expect("a window");
    *count += 1;
    if *count > LIMIT {
        seen.rejected += 1;
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    }
}

/// What one client's calls came to.
#[derive(Debug, Default, Clone, Copy)]
pub struct Calls {
    /// Answered 200.
    pub ok: u64,
    /// Answered 429 by the provider.
    pub rejected: u64,
    /// Refused: the budget could not return within the max wait.
    pub exhausted: u64,
    /// Shed: too many calls waiting.
    pub shed: u64,
    /// Any other failure.
    pub failed: u64,
    /// What the refused calls waited before they failed, together.
    pub refused_waits: Duration,
}

/// Runs the story for `seconds` with `backends` (one per client, all on
/// one store): each client's outcome, and what the provider saw.
pub async fn run<Bk: Heeding>(
    backends: Vec<Bk>,
    seconds: u64,
) -> Result<(Vec<Calls>, Seen), Box<dyn std::error::Error>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app = Router::new()
        .route("/", get(provider))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url: http::Uri = format!("http://{}/", listener.local_addr()?).parse()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let budget = Quota::new(LIMIT, WINDOW)?;
    // Three times the budget, spread over the clients.
    let every = WINDOW * CLIENTS as u32 / (3 * LIMIT as u32);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut clients = Vec::new();
    for backend in backends {
        let http = Client::builder(TokioExecutor::new()).build_http::<String>();
        let client = BudgetLayer::new("provider", budget)
            .backend(backend)
            .max_wait(Duration::from_secs(2))
            .max_waiters(64)
            .layer(http);
        let url = url.clone();
        clients.push(tokio::spawn(async move {
            let outcomes = Arc::new(Mutex::new(Calls::default()));
            let mut calls = Vec::new();
            let mut tick = tokio::time::interval(every);
            while Instant::now() < end {
                tick.tick().await;
                let client = client.clone();
                let request = http::Request::get(url.clone()).body(String::new());
                let outcomes = Arc::clone(&outcomes);
                calls.push(tokio::spawn(async move {
                    let sent = Instant::now();
                    let answer = client.oneshot(request.expect("a request")).await;
                    let mut outcomes = outcomes.lock().unwrap();
                    match answer {
                        Ok(response) if response.status() == StatusCode::OK => outcomes.ok += 1,
                        Ok(_) => outcomes.rejected += 1,
                        Err(err) => match err.downcast_ref::<BudgetError>() {
                            Some(BudgetError::Exhausted { .. }) => {
                                outcomes.exhausted += 1;
                                outcomes.refused_waits += sent.elapsed();
                            }
                            Some(BudgetError::Overloaded { .. }) => outcomes.shed += 1,
                            _ => outcomes.failed += 1,
                        },
                    }
                }));
            }
            for call in calls {
                call.await.expect("a call's task");
            }
            *outcomes.lock().unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.push(client.await?);
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    Ok((outcomes, seen))
}

/// Four backends on one store: clones of one memory backend, or four Redis
/// connections.
#[allow(dead_code, reason = "the tests call `run` with their own backends")]
async fn stores() -> Result<(), Box<dyn std::error::Error>> {
    let seconds = match std::env::var("DURATION_SECS") {
        Ok(seconds) => seconds.parse()?,
        Err(_) => 20,
    };
    let (outcomes, seen) = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            use tower_pinned_window_redis::RedisBackend;
            let mut backends = Vec::new();
            for _ in 0..CLIENTS {
                backends.push(RedisBackend::connect(&url).await?);
            }
            println!("{CLIENTS} clients, each its own connection to Redis at {url}");
            run(backends, seconds).await?
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => return Err("REDIS_URL is set: build with `--features redis`".into()),
        Err(_) => {
            let store = tower_pinned_window::backend::MemoryBackend::new();
            println!("{CLIENTS} clients, one memory backend in this process");
            run(vec![store; CLIENTS], seconds).await?
        }
    };
    println!(
        "budget: {LIMIT} calls per {WINDOW:?} (the layer adds {DEFAULT_MARGIN:?}), demand: 3 times that, for {seconds} s"
    );
    for (n, calls) in outcomes.iter().enumerate() {
        println!(
            "client {n}: {} ok, {} answered 429, {} refused (the budget not back within 2 s; after {:?} on average), {} shed, {} other failures",
            calls.ok,
            calls.rejected,
            calls.exhausted,
            calls
                .refused_waits
                .checked_div(u32::try_from(calls.exhausted).unwrap_or(u32::MAX))
                .unwrap_or_default(),
            calls.shed,
            calls.failed
        );
    }
    println!("{}", seen.line());
    Ok(())
}

#[allow(dead_code, reason = "the tests include this file as a module")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    stores().await
}
