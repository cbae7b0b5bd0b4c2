//! A streaming "completion" endpoint that runs at most 3 completions in
//! flight per API key, across every instance of the service.
//!
//! Several instances of the app (`INSTANCES`, 4 by default), each an axum
//! server on 127.0.0.1 with its own `InFlightLayer` and its own backend, all
//! pointed at one store, serve `POST /v1/completions`: an answer streamed in
//! chunks for about 200 ms. Clients on several API keys call them over TCP
//! through hyper-util's client, many more at once than the cap allows; a
//! refused call (429) is tried again 5 ms later (`RETRY_MS`). The handler counts what is
//! truly in flight per key, across every instance, while each answer
//! streams: the count is taken when the handler starts and given back when
//! the last chunk has gone.
//!
//! The store is the memory backend, shared in this process, or Redis when
//! `REDIS_URL` is set (build with `--features redis`), or PostgreSQL when
//! `DATABASE_URL` is set (`--features postgres`):
//!
//! ```text
//! cargo run --example in_flight
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example in_flight --features redis
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --release --example in_flight --features postgres
//! ```
//!
//! Its settings come from the environment: `INSTANCES` (4), `KEYS` (3),
//! `CALLERS` per key (8), `MAX` in flight per key (3), `DURATION_SECS` (5),
//! `TIMEOUT_MS`, the layer's timeout for a store call (100; a call past it
//! fails closed, 503), `RETRY_MS`, how long a refused caller waits before
//! it calls again (5).
//! The figures in `bench/README.md` ("Requests in flight") are
//! `INSTANCES=4 KEYS=20 CALLERS=50 MAX=5 DURATION_SECS=10`: 1,000 callers.
//!
//! It prints, per key, the calls served and refused, the most ever in
//! flight at once (never above the cap while the store answers) and the
//! mean in flight over the run (near the cap: the callers saturate it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower_pinned_window::backend::Leasing;
use tower_pinned_window::{InFlight, InFlightLayer};

/// The header that names the caller's API key.
const API_KEY: &str = "x-api-key";
/// The chunks of one completion, and the time between two.
const CHUNKS: u32 = 5;
const CHUNK_EVERY: Duration = Duration::from_millis(40);

/// What the run's settings are.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Instances of the app, each with its own layer and backend.
    pub instances: usize,
    /// API keys.
    pub keys: usize,
    /// Callers per key, each calling again as soon as it is answered.
    pub callers: usize,
    /// The cap per key.
    pub max: u64,
    /// How long the callers call.
    pub seconds: u64,
    /// The layer's timeout for a store call, in milliseconds.
    pub timeout_ms: u64,
    /// How long a caller refused (429) waits before it calls again, in
    /// milliseconds.
    pub retry_ms: u64,
}

impl Settings {
    /// From the environment, with the defaults above.
    pub fn from_env() -> Result<Self, Box<dyn std::error::Error>> {
        let read = |name: &str, default: u64| -> Result<u64, Box<dyn std::error::Error>> {
            match std::env::var(name) {
                Ok(value) => Ok(value.parse()?),
                Err(_) => Ok(default),
            }
        };
        Ok(Self {
            instances: usize::try_from(read("INSTANCES", 4)?)?,
            keys: usize::try_from(read("KEYS", 3)?)?,
            callers: usize::try_from(read("CALLERS", 8)?)?,
            max: read("MAX", 3)?,
            seconds: read("DURATION_SECS", 5)?,
            timeout_ms: read("TIMEOUT_MS", 100)?,
            retry_ms: read("RETRY_MS", 5)?,
        })
    }
}

/// True concurrency per key, across every instance: the handler's count.
#[derive(Debug, Default)]
pub struct Meter {
    keys: Mutex<HashMap<String, Arc<KeyMeter>>>,
}

/// One key's count, the most seen at once, and the time integral of the
/// count (for the mean), in microsecond-calls.
#[derive(Debug, Default)]
pub struct KeyMeter {
    now: AtomicU64,
    most: AtomicU64,
    area: Mutex<(Option<Instant>, f64)>,
}

impl KeyMeter {
    fn change(&self, up: bool) {
        let mut area = self.area.lock().unwrap();
        let at = Instant::now();
        let before = self.now.load(Ordering::SeqCst);
        if let Some(since) = area.0 {
            area.1 += before as f64 * (at - since).as_secs_f64();
        }
        area.0 = Some(at);
        let after = if up { before + 1 } else { before - 1 };
        self.now.store(after, Ordering::SeqCst);
        self.most.fetch_max(after, Ordering::SeqCst);
    }
}

impl Meter {
    fn key(&self, key: &str) -> Arc<KeyMeter> {
        let mut keys = self.keys.lock().unwrap();
        Arc::clone(keys.entry(key.to_owned()).or_default())
    }
}

/// A completion's body: `CHUNKS` chunks, `CHUNK_EVERY` apart; it leaves the
/// meter when it ends or is dropped.
struct Completion {
    sent: u32,
    next: Pin<Box<tokio::time::Sleep>>,
    meter: Arc<KeyMeter>,
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.meter.change(false);
    }
}

impl http_body::Body for Completion {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent == CHUNKS {
            return Poll::Ready(None);
        }
        std::task::ready!(self.next.as_mut().poll(cx));
        self.sent += 1;
        let at = Instant::now() + CHUNK_EVERY;
        self.next.as_mut().reset(at);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
            "data: chunk {}\n\n",
            self.sent
        ))))))
    }
}

async fn complete(State(meter): State<Arc<Meter>>, headers: HeaderMap) -> Body {
    let key = headers
        .get(API_KEY)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let meter = meter.key(key);
    meter.change(true);
    Body::new(Completion {
        sent: 0,
        next: Box::pin(tokio::time::sleep(CHUNK_EVERY)),
        meter,
    })
}

/// One instance of the app on 127.0.0.1, with its own layer on `backend`.
async fn instance<Bk: Leasing>(
    backend: Bk,
    settings: Settings,
    meter: Arc<Meter>,
) -> Result<http::Uri, Box<dyn std::error::Error>> {
    let cap = InFlight::new(settings.max, Duration::from_secs(10))?;
    let layer = InFlightLayer::new("completions", cap)
        .key(http::HeaderName::from_static(API_KEY))
        .backend(backend)
        .timeout(Duration::from_millis(settings.timeout_ms));
    layer.check()?;
    let app = Router::new()
        .route("/v1/completions", post(complete))
        .with_state(meter)
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let uri = format!("http://{}/v1/completions", listener.local_addr()?).parse()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(uri)
}

/// What one key's callers got.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Completions streamed to their end.
    pub served: u64,
    /// Calls answered 429.
    pub refused: u64,
    /// Anything else: an error, another status.
    pub failed: u64,
    /// The most in flight at once, as the handler counted.
    pub most: u64,
    /// The mean in flight over the run.
    pub mean: f64,
}

/// Runs the instances on `backends` (one each) and the callers; per key,
/// what they got.
pub async fn run<Bk: Leasing>(
    backends: Vec<Bk>,
    settings: Settings,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    let meter = Arc::new(Meter::default());
    let mut uris = Vec::new();
    for backend in backends {
        uris.push(instance(backend, settings, Arc::clone(&meter)).await?);
    }
    let started = Instant::now();
    let end = started + Duration::from_secs(settings.seconds);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(settings.callers * settings.keys)
        .build_http::<String>();
    let outcomes: Vec<Arc<Mutex<Outcome>>> = (0..settings.keys).map(|_| Arc::default()).collect();
    let mut callers = Vec::new();
    for caller in 0..settings.keys * settings.callers {
        let key = caller % settings.keys;
        let uri = uris[caller % uris.len()].clone();
        let (client, outcome) = (client.clone(), Arc::clone(&outcomes[key]));
        let retry = Duration::from_millis(settings.retry_ms);
        callers.push(tokio::spawn(async move {
            while Instant::now() < end {
                let request = http::Request::post(uri.clone())
                    .header(API_KEY, format!("key-{key}"))
                    .body(String::new())
                    .expect("a request");
                let answer = match client.request(request).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        outcome.lock().unwrap().failed += 1;
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                };
                let status = answer.status();
                // Read the whole answer: the stream holds its slot.
                let read = http_body_util::BodyExt::collect(answer.into_body()).await;
                let refused = {
                    let mut outcome = outcome.lock().unwrap();
                    match (status, read) {
                        (StatusCode::OK, Ok(_)) => outcome.served += 1,
                        (StatusCode::TOO_MANY_REQUESTS, _) => outcome.refused += 1,
                        _ => outcome.failed += 1,
                    }
                    status == StatusCode::TOO_MANY_REQUESTS
                };
                if refused {
                    tokio::time::sleep(retry).await;
                }
            }
        }));
    }
    for caller in callers {
        caller.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut per_key = Vec::new();
    for (key, outcome) in outcomes.iter().enumerate() {
        let mut outcome = *outcome.lock().unwrap();
        let meter = meter.key(&format!("key-{key}"));
        outcome.most = meter.most.load(Ordering::SeqCst);
        let area = meter.area.lock().unwrap();
        outcome.mean = area.1 / elapsed;
        per_key.push(outcome);
    }
    Ok(per_key)
}

/// One backend per instance, each with its own connection, on one store.
#[allow(dead_code, reason = "the test calls `run` with its own backends")]
async fn backends_and_run(settings: Settings) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        let mut backends = Vec::new();
        for _ in 0..settings.instances {
            backends.push(tower_pinned_window_redis::RedisBackend::connect(&url).await?);
        }
        println!("store: Redis at {url}");
        return run(backends, settings).await;
    }
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let mut backends = Vec::new();
        for _ in 0..settings.instances {
            backends.push(tower_pinned_window_postgres::PostgresBackend::connect(&url).await?);
        }
        // The table (and its slots' table) made if missing.
        backends[0].migrate().await?;
        println!("store: PostgreSQL at {url}");
        return run(backends, settings).await;
    }
    let store = tower_pinned_window::backend::MemoryBackend::new();
    println!("store: memory (set REDIS_URL or DATABASE_URL for a shared store)");
    run(vec![store; settings.instances], settings).await
}

#[allow(dead_code, reason = "the test has its own main")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::from_env()?;
    println!(
        "{} instances, {} keys x {} callers, at most {} in flight per key, {} s, store timeout {} ms",
        settings.instances,
        settings.keys,
        settings.callers,
        settings.max,
        settings.seconds,
        settings.timeout_ms
    );
    let outcomes = backends_and_run(settings).await?;
    let mut most = 0;
    for (key, outcome) in outcomes.iter().enumerate() {
        most = most.max(outcome.most);
        println!(
            "key-{key}: served {}, refused {}, failed {}; in flight: at most {}, mean {:.2} (cap {})",
            outcome.served,
            outcome.refused,
            outcome.failed,
            outcome.most,
            outcome.mean,
            settings.max
        );
    }
    let mean = outcomes.iter().map(|o| o.mean).sum::<f64>() / outcomes.len().max(1) as f64;
    println!(
        "all keys: at most {most} in flight (cap {}), mean {mean:.2} = {:.2} of the cap",
        settings.max,
        mean / settings.max as f64
    );
    Ok(())
}
