//! Heap allocations per request as a plain axum app sees them: the app a
//! new user writes, served by `axum::serve` over TCP, driven by a load
//! generator that keeps `N` keep-alive connections busy (8 and 64), and
//! compared with the same app without the layer.
//!
//! The app (per case):
//!
//! ```text
//! Router::new().route("/memory", get(handler)).layer(limiter)
//! ```
//!
//! where `limiter` is `RateLimitLayer::new(..).key_fn(..)`, its key read
//! from the `x-api-key` header into `Key::new(value.as_bytes())`, with the
//! default headers and the `Decision`'s default place (`DecisionIn::Asked`:
//! nobody reads it, so it goes nowhere), on the memory backend or on Redis; the cost
//! route adds `.cost(1)`. The in-flight route is `.layer(InFlightLayer::new(..)
//! .key(..))` instead, keyed the same way, with a cap no key reaches (each
//! request takes a slot before the handler and gives it back when its
//! answer's body ends). The capped route is the limiter with
//! `.in_flight(cap)`, the same cap: a hit and a slot in one store step. The
//! base is the same router without `.layer`.
//!
//! Only the server's allocations are counted: the server's runtime (its
//! workers and blocking threads, where the Redis client's tasks run too)
//! marks its threads, and the counting allocator counts the calls made on
//! marked threads. The load generator runs on threads of its own in the
//! same process, unmarked. An allocation is a call of `alloc`,
//! `alloc_zeroed` or `realloc`.
//!
//! Each case runs on a server of its own: the connections are opened, every
//! one of `KEYS` keys is hit, then `REQUESTS` requests are counted (the
//! connections' setup is not: a load generator keeps its connections). The
//! figure is the server's allocations during the counted requests, divided
//! by their number.
//!
//! "Added by the layer" is a case's count less the app's without the layer.
//! "Beyond axum's `.layer`" is a case's count less the app's with a `.layer`
//! that does nothing: `Router::layer` wraps each route in a boxed, cloned
//! service of its own, whatever the layer, which costs two allocations a
//! request (the clone of the layered service and its boxed future).
//!
//! `bash bench/allocs.sh` runs this with the CI budgets. Run by hand:
//!
//! ```text
//! cargo run --release -p tower-pinned-window-bench --example app_allocs
//! REDIS_URL=redis://127.0.0.1:6397/ cargo run --release -p tower-pinned-window-bench --example app_allocs
//! cargo run --release -p tower-pinned-window-bench --example app_allocs -- --budget memory-64=1
//! ```
//!
//! With `--budget CASE=N` (any number of times), it exits with status 1 when
//! the layer adds more than `N` allocations a request to `CASE` (its count
//! less its base's); with `--beyond CASE=N`, when `CASE` costs more than
//! `N` beyond axum's `.layer` (its count less the `noop` case's at the same
//! connections); with `--over CASE=OTHER:N`, when `CASE` costs more than `N`
//! over the case `OTHER` of the same run (the Redis in-flight route over the
//! memory one: what the store adds under the same layer). `--only PREFIX`
//! runs the cases whose names start with it (and their bases).
//!
//! With `REDIS_URL` (a Redis of the run's own: the keys are written), the
//! Redis cases are added. With `ALLOCS_TRACE=1`, a backtrace of every
//! allocation the server makes for one request after the warm-up is
//! printed on stderr, to find where they come from.

#![allow(missing_docs)]

use std::cell::Cell;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::util::MapResponseLayer;
use tower_pinned_window::key::{Key, KeyError, RequestHead};
use tower_pinned_window::{InFlight, InFlightLayer, Quota, RateLimitLayer, Window};
use tower_pinned_window_redis::RedisBackend;

#[path = "support/counting.rs"]
mod counting;

use counting::{TRACE, allocations};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting { counted: on_server };

thread_local! {
    /// Whether this thread is one of the server's (set when its runtime
    /// starts it). A constant with no destructor: readable in the
    /// allocator at any point of the thread's life.
    static SERVER: Cell<bool> = const { Cell::new(false) };
}

/// Only the server's threads' allocations count.
fn on_server() -> bool {
    SERVER.try_with(Cell::get).unwrap_or(false)
}

/// Distinct keys (`x-api-key` values), each hit in the warm-up.
const KEYS: usize = 10_000;
/// Requests counted per case.
const REQUESTS: usize = 100_000;

async fn handler() -> &'static str {
    "ok"
}

/// The key as the issue's user writes it: the `x-api-key` header's bytes.
fn api_key(req: &RequestHead<'_>) -> Result<Key, KeyError> {
    req.headers()
        .get("x-api-key")
        .map(|value| Key::new(value.as_bytes()))
        .ok_or(KeyError::missing("the x-api-key header"))
}

fn quota() -> Quota {
    // Never reached: every request is admitted, as on a healthy service.
    Quota::new(u64::MAX / 4, Duration::from_secs(3600)).unwrap()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    None,
    /// A `.layer` that does nothing (`MapResponseLayer` of the identity):
    /// what axum's `Router::layer` costs whatever the layer.
    Noop,
    Memory,
    Redis,
}

/// What the layer does with a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// A hit of the rate limit.
    Hit,
    /// A spend of 1 (`.cost(1)`).
    Cost,
    /// A slot in flight (`InFlightLayer`), taken and given back.
    InFlight,
    /// A hit and a slot in one step (`RateLimitLayer::in_flight`).
    Capped,
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    what: &'static str,
    store: Store,
    limit: Limit,
    connections: usize,
    /// The same app without the layer, at the same connections.
    base: &'static str,
}

fn cases(redis: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for (
        connections,
        [
            plain,
            noop,
            memory,
            memory_cost,
            memory_in_flight,
            memory_capped,
        ],
        redis_names,
    ) in [
        (
            8,
            [
                "plain-8",
                "noop-8",
                "memory-8",
                "memory-cost-8",
                "memory-in-flight-8",
                "memory-capped-8",
            ],
            [
                "redis-8",
                "redis-cost-8",
                "redis-in-flight-8",
                "redis-capped-8",
            ],
        ),
        (
            64,
            [
                "plain-64",
                "noop-64",
                "memory-64",
                "memory-cost-64",
                "memory-in-flight-64",
                "memory-capped-64",
            ],
            [
                "redis-64",
                "redis-cost-64",
                "redis-in-flight-64",
                "redis-capped-64",
            ],
        ),
    ] {
        let case = |name, what, store, limit| Case {
            name,
            what,
            store,
            limit,
            connections,
            base: plain,
        };
        cases.push(case(
            plain,
            "the app without the layer",
            Store::None,
            Limit::Hit,
        ));
        cases.push(case(
            noop,
            "`.layer` of a layer that does nothing",
            Store::Noop,
            Limit::Hit,
        ));
        cases.push(case(
            memory,
            "`.layer(limiter)`, memory backend",
            Store::Memory,
            Limit::Hit,
        ));
        cases.push(case(
            memory_cost,
            "`.layer(limiter.cost(1))`, memory backend",
            Store::Memory,
            Limit::Cost,
        ));
        cases.push(case(
            memory_in_flight,
            "`.layer(InFlightLayer)`, memory backend",
            Store::Memory,
            Limit::InFlight,
        ));
        cases.push(case(
            memory_capped,
            "`.layer(limiter.in_flight(cap))`, memory backend",
            Store::Memory,
            Limit::Capped,
        ));
        if redis {
            let [redis_name, redis_cost, redis_in_flight, redis_capped] = redis_names;
            cases.push(case(
                redis_name,
                "`.layer(limiter)`, Redis backend",
                Store::Redis,
                Limit::Hit,
            ));
            cases.push(case(
                redis_cost,
                "`.layer(limiter.cost(1))`, Redis backend",
                Store::Redis,
                Limit::Cost,
            ));
            cases.push(case(
                redis_in_flight,
                "`.layer(InFlightLayer)`, Redis backend",
                Store::Redis,
                Limit::InFlight,
            ));
            cases.push(case(
                redis_capped,
                "`.layer(limiter.in_flight(cap))`, Redis backend",
                Store::Redis,
                Limit::Capped,
            ));
        }
    }
    cases
}

/// The in-flight cap of the in-flight route: a cap no key reaches (each
/// key has a request or two in flight at most), on a lease longer than the
/// run.
fn in_flight() -> InFlight {
    InFlight::new(1_000, Duration::from_secs(3600)).unwrap()
}

/// The app of `case`, made on the server's runtime (the Redis client's
/// tasks run there).
async fn app(case: Case) -> Router {
    let router = Router::new().route("/memory", get(handler));
    let limiter = RateLimitLayer::new("app", quota()).key_fn(api_key);
    let capped = InFlightLayer::new("app", in_flight()).key(api_key);
    match (case.store, case.limit) {
        (Store::None, _) => router,
        (Store::Noop, _) => router.layer(MapResponseLayer::new(|r: Response| r)),
        (Store::Memory, Limit::Hit) => router.layer(limiter),
        (Store::Memory, Limit::Cost) => router.layer(limiter.cost(1)),
        (Store::Memory, Limit::InFlight) => router.layer(capped),
        (Store::Memory, Limit::Capped) => router.layer(limiter.in_flight(in_flight())),
        (Store::Redis, limit) => {
            let url = std::env::var("REDIS_URL").expect("the Redis cases need REDIS_URL");
            let connection = redis::Client::open(url)
                .unwrap()
                .get_connection_manager()
                .await
                .unwrap();
            let backend = RedisBackend::builder(connection).build();
            // A timeout no call reaches on a machine busy with the load
            // generator and redis-server too (the default, 100 ms, answers
            // 503 now and then there): the layer's timer is armed all the
            // same, so the count is the default's.
            let timeout = Window::new(Duration::from_secs(600)).unwrap();
            if limit == Limit::InFlight {
                return router.layer(capped.backend(backend).timeout(timeout.as_duration()));
            }
            let limiter = limiter.backend(backend).timeout(timeout);
            match limit {
                Limit::Cost => router.layer(limiter.cost(1)),
                Limit::Capped => router.layer(limiter.in_flight(in_flight())),
                _ => router.layer(limiter),
            }
        }
    }
}

/// Sends `requests` requests on `stream`, one at a time, their keys from
/// `keys`, reading each response whole.
async fn drive(stream: &mut TcpStream, keys: impl Iterator<Item = usize>) {
    let mut buf = vec![0u8; 4096];
    let mut request = Vec::with_capacity(128);
    for key in keys {
        request.clear();
        write!(
            request,
            "GET /memory HTTP/1.1\r\nhost: bench\r\nx-api-key: key-{key}\r\n\r\n"
        )
        .unwrap();
        stream.write_all(&request).await.unwrap();
        // The response: its head to the blank line, then its body by its
        // content-length.
        let mut filled = 0;
        loop {
            let n = stream.read(&mut buf[filled..]).await.unwrap();
            assert!(n > 0, "the server closed the connection");
            filled += n;
            let Some(head_end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = std::str::from_utf8(&buf[..head_end]).unwrap();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length");
            if filled >= head_end + 4 + length {
                assert_eq!(filled, head_end + 4 + length, "one response at a time");
                break;
            }
        }
    }
}

/// `per_connection` requests on each of `streams`, all together; the keys
/// run over every key from `offset`.
async fn round(streams: Vec<TcpStream>, per_connection: usize, offset: usize) -> Vec<TcpStream> {
    let n = streams.len();
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, mut stream)| {
            tokio::spawn(async move {
                let keys = (0..per_connection).map(move |j| (offset + i + j * n) % KEYS);
                drive(&mut stream, keys).await;
                stream
            })
        })
        .collect();
    let mut streams = Vec::with_capacity(n);
    for task in tasks {
        streams.push(task.await.unwrap());
    }
    streams
}

/// Allocations per request the server of `case` makes.
fn measure(case: Case) -> f64 {
    let server = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(|| SERVER.set(true))
        .build()
        .unwrap();
    let addr: SocketAddr = server.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app(case).await;
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });
    let client = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let per_request = client.block_on(async {
        let mut streams = Vec::new();
        for _ in 0..case.connections {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            streams.push(stream);
        }
        // Warm-up: every key, and the connections' buffers grown.
        let per_connection = KEYS.div_ceil(case.connections) + 20;
        streams = round(streams, per_connection, 0).await;
        if std::env::var("ALLOCS_TRACE").is_ok() {
            eprintln!("=================== {}: one request", case.name);
            TRACE.store(true, Ordering::Relaxed);
            drive(&mut streams[0], [7].into_iter()).await;
            // What the server still does for them (a response's drop).
            tokio::time::sleep(Duration::from_millis(50)).await;
            TRACE.store(false, Ordering::Relaxed);
            eprintln!("=================== end of {}", case.name);
        }
        let per_connection = REQUESTS / case.connections;
        let before = allocations();
        let _streams = round(streams, per_connection, 0).await;
        let counted = allocations() - before;
        counted as f64 / (per_connection * case.connections) as f64
    });
    drop(client);
    server.shutdown_background();
    per_request
}

/// What a budget counts a case's allocations against.
enum Against {
    /// The app without the layer (`--budget`).
    Base,
    /// The app with a `.layer` that does nothing (`--beyond`).
    Noop,
    /// Another case of the run (`--over CASE=OTHER:N`): what one store
    /// adds over another under the same layer, say.
    Case(String),
}

fn main() -> ExitCode {
    // (case, allocations, what they are counted against)
    let mut budgets: Vec<(String, f64, Against)> = Vec::new();
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            (flag @ ("--budget" | "--beyond" | "--over"), Some(budget)) => {
                let Some((case, n)) = budget.split_once('=') else {
                    eprintln!("{flag} CASE=N (--over CASE=OTHER:N)");
                    return ExitCode::from(2);
                };
                let (against, n) = match flag {
                    "--budget" => (Against::Base, n),
                    "--beyond" => (Against::Noop, n),
                    _ => match n.split_once(':') {
                        Some((other, n)) => (Against::Case(other.to_owned()), n),
                        None => {
                            eprintln!("--over CASE=OTHER:N");
                            return ExitCode::from(2);
                        }
                    },
                };
                let Ok(n) = n.parse() else {
                    eprintln!("not a number of allocations: {n:?}");
                    return ExitCode::from(2);
                };
                budgets.push((case.to_owned(), n, against));
            }
            ("--only", Some(prefix)) => only = Some(prefix),
            _ => {
                eprintln!(
                    "usage: app_allocs [--budget CASE=N]... [--beyond CASE=N]... [--over CASE=OTHER:N]... [--only PREFIX]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let all = cases(std::env::var("REDIS_URL").is_ok());
    let chosen: Vec<Case> = all
        .iter()
        .filter(|case| match &only {
            None => true,
            Some(prefix) => {
                let picked = |c: &Case| c.name.starts_with(prefix.as_str());
                picked(case)
                    || all.iter().any(|c| {
                        picked(c)
                            && (c.base == case.name || c.base.replace("plain", "noop") == case.name)
                    })
            }
        })
        .copied()
        .collect();
    let measured: Vec<(Case, f64)> = chosen
        .into_iter()
        .map(|case| (case, measure(case)))
        .collect();
    let of = |name: &str| {
        measured
            .iter()
            .find(|(c, _)| c.name == name)
            .map(|(_, n)| *n)
    };

    println!(
        "| case | app | connections | allocations per request | added by the layer | beyond axum's `.layer` |"
    );
    println!("|---|---|---|---|---|---|");
    for (case, n) in &measured {
        let (added, beyond) = if case.name == case.base {
            (String::new(), String::new())
        } else {
            let noop = case.base.replace("plain", "noop");
            (
                format!("{:.2}", n - of(case.base).expect("its base is measured")),
                of(&noop).map_or(String::new(), |noop| format!("{:.2}", n - noop)),
            )
        };
        println!(
            "| `{}` | {} | {} | {n:.2} | {added} | {beyond} |",
            case.name, case.what, case.connections
        );
    }
    std::io::stdout().flush().expect("stdout");

    let mut over = false;
    for (name, budget, against) in &budgets {
        let Some((case, n)) = measured.iter().find(|(c, _)| c.name == name) else {
            eprintln!("no case {name:?} measured (the Redis cases need REDIS_URL)");
            return ExitCode::from(2);
        };
        let (base, what) = match against {
            Against::Noop => (
                case.base.replace("plain", "noop"),
                "beyond the no-op `.layer`".to_owned(),
            ),
            Against::Base => (case.base.to_owned(), "added".to_owned()),
            Against::Case(other) => (other.clone(), format!("over `{other}`")),
        };
        let Some(of_base) = of(&base) else {
            eprintln!("no case {base:?} measured, against which {name:?} is counted");
            return ExitCode::from(2);
        };
        let added = n - of_base;
        // Averages of whole counts over 100,000 requests: a hundredth is one
        // allocation in a hundred requests.
        if added > budget + 0.01 {
            eprintln!(
                "{name}: the layer costs {added:.2} allocations a request {what}, over the budget of {budget}"
            );
            over = true;
        } else {
            eprintln!("{name}: {added:.2} {what}, within the budget of {budget}");
        }
    }
    if over {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
