//! Heap allocations per request, counted by a counting global allocator:
//! requests driven through an axum `Router` as a server drives them (a 204
//! handler, the layer in front as a `route_layer`, the peer address in the
//! request's extensions as `into_make_service_with_connect_info` puts it),
//! over 10,000 client addresses on the memory backend.
//!
//! `bash bench/allocs.sh` runs this with the CI budgets. Run by hand:
//!
//! ```text
//! cargo run --release -p tower-pinned-window-bench --example allocs
//! cargo run --release -p tower-pinned-window-bench --example allocs -- \
//!     --budget headers-off-unread=0 --budget headers-on-unread=3
//! ```
//!
//! Each case is warmed up first (every address is hit once, so the
//! backend's tables have grown, and first-use costs are paid), then
//! `REQUESTS` requests are counted. Only the router's `call`, the polling
//! of its future and the dropping of the response are counted: building
//! the request is the server's work, the same with or without the layer.
//! An allocation is a call of `alloc`, `alloc_zeroed` or `realloc`.
//!
//! "Added by the layer" is a case's count less its base's: the same route
//! with a `route_layer` that does nothing in the limiter's place. axum
//! wraps whatever layer `route_layer` is given in a route of its own, which
//! costs two allocations a request (the layered service's clone and its
//! boxed future) whatever the layer does; the "over bare axum" column
//! includes them.
//!
//! With `--budget CASE=N` (any number of times), it exits with status 1
//! when the layer adds more than `N` allocations a request to `CASE`.
//!
//! With `REDIS_URL` in the environment, it adds the Redis route's rows (a
//! Redis of the run's own: the keys are written; on a current-thread
//! runtime, every thread's allocations counted): one request at a time,
//! and 64 in flight together (amortized: allocations divided by requests,
//! the lanes' calls shared by many requests). `--budget` takes their names
//! too.
//!
//! With `REDIS_CLUSTER_URLS` (a Cluster's nodes, separated by commas) and
//! feature `cluster`, it adds Redis Cluster rows: the crate's Cluster client
//! beside the `redis` crate's own (`bench/cluster_allocs.sh` starts a
//! Cluster and runs them).
//!
//! The client rows (`client-*`) are the outbound side: one call at a time
//! of a client (`service_fn`) through `outbound::BudgetLayer` (memory
//! backend, one key, a budget that always has room), through
//! `tower::limit::RateLimit` (a rate that never blocks), and bare; what a
//! layer adds is its count less the bare client's. `--budget` takes their
//! names too.
//!
//! With `ALLOCS_TRACE=1` in the environment, it prints a backtrace of
//! every `alloc` made by one request of each case (on stderr, after the
//! warm-up), to find where they come from.

#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Router, middleware};
use bytes::Bytes;
use http_body_util::Empty;
use tower::Service;
use tower::limit::RateLimit;
use tower::limit::rate::Rate;
use tower::util::MapResponseLayer;
use tower_pinned_window::backend::MemoryBackend;
use tower_pinned_window::denied::TopDenied;
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::outbound::BudgetLayer;
use tower_pinned_window::{
    Decision, DecisionIn, LimitBook, Quota, RateLimitLayer, Window, outcome::WantDecision,
    response::HeaderStyle,
};
use tower_pinned_window_redis::RedisBackend;

#[path = "support/counting.rs"]
mod counting;

use counting::{TRACE, allocations};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting {
    counted: every_allocation,
};

/// Every thread's allocations count (one request at a time, or a
/// current-thread runtime).
fn every_allocation() -> bool {
    true
}

const KEYS: u32 = 10_000;
/// Requests counted per case, after the warm-up.
const REQUESTS: u32 = 100_000;

fn request(i: u32) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    let peer = SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + i % KEYS), 4000));
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// Allocations made by `router` answering `request`, which must be
/// answered at once (the memory backend and the handlers here never wait).
fn one(router: &mut Router, request: Request<Body>) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let before = allocations();
    {
        assert!(Service::<Request<Body>>::poll_ready(router, &mut cx).is_ready());
        let future = pin!(router.call(request));
        let Poll::Ready(response) = future.poll(&mut cx) else {
            panic!("the router did not answer at once");
        };
        let response = response.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        black_box(response);
    }
    allocations() - before
}

/// Allocations made by `router` answering `request` on `runtime`: the
/// process's, every thread's (the Redis client's tasks too).
fn one_on(runtime: &tokio::runtime::Runtime, router: &mut Router, request: Request<Body>) -> u64 {
    let before = allocations();
    runtime.block_on(async {
        let response = tower::ServiceExt::<Request<Body>>::ready(&mut *router)
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        black_box(response);
    });
    allocations() - before
}

/// [`per_request`] for a route whose backend goes out (Redis), one request
/// at a time on a current-thread runtime.
fn per_request_on(runtime: &tokio::runtime::Runtime, router: Router) -> f64 {
    let mut router = router.with_state(());
    for i in 0..KEYS + 1000 {
        one_on(runtime, &mut router, request(i));
    }
    if std::env::var("ALLOCS_TRACE").is_ok() {
        let request = request(7);
        TRACE.store(true, Ordering::Relaxed);
        one_on(runtime, &mut router, request);
        TRACE.store(false, Ordering::Relaxed);
        eprintln!("=================== end of request");
    }
    let requests = REQUESTS / 10;
    let mut total = 0;
    for i in 0..requests {
        let request = request(i);
        total += one_on(runtime, &mut router, request);
    }
    total as f64 / f64::from(requests)
}

/// Requests in flight together in [`per_request_in_flight`].
const IN_FLIGHT: u32 = 64;

/// Allocations per request through `router` on `runtime` with
/// [`IN_FLIGHT`] requests in flight together: as many tasks' worth of
/// requests (one future each, polled together, each sending its next
/// request as soon as its last is answered, as a server's connections
/// do), every thread's allocations counted and divided by the requests.
/// The futures and the requests are made before counting; what a request
/// costs is the router's `call`, its future and the response, as in
/// [`one_on`].
fn per_request_in_flight(runtime: &tokio::runtime::Runtime, router: Router) -> f64 {
    let router = router.with_state(());
    let run = |per_worker: u32, offset: u32| {
        let workers: Vec<_> = (0..IN_FLIGHT)
            .map(|w| {
                let mut router = router.clone();
                // Built before counting, as in `one_on`: the server's work.
                let requests: Vec<_> = (0..per_worker)
                    .map(|i| request(offset + w + i * IN_FLIGHT))
                    .collect();
                Box::pin(async move {
                    for request in requests {
                        let response = tower::ServiceExt::<Request<Body>>::ready(&mut router)
                            .await
                            .unwrap()
                            .call(request)
                            .await
                            .unwrap();
                        assert!(response.status().is_success(), "{}", response.status());
                        black_box(response);
                    }
                })
            })
            .collect();
        let mut workers: Vec<Option<_>> = workers.into_iter().map(Some).collect();
        let before = allocations();
        runtime.block_on(std::future::poll_fn(|cx| {
            let mut pending = false;
            for slot in workers.iter_mut() {
                if let Some(worker) = slot {
                    if worker.as_mut().poll(cx).is_ready() {
                        *slot = None;
                    } else {
                        pending = true;
                    }
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
        let counted = allocations() - before;
        drop(workers);
        counted
    };
    // Warm-up: every address, and the lanes' buffers grown.
    run(KEYS.div_ceil(IN_FLIGHT) + 20, 0);
    if std::env::var("ALLOCS_TRACE").is_ok() {
        // Two requests per task, every allocation of theirs.
        TRACE.store(true, Ordering::Relaxed);
        run(2, 0);
        TRACE.store(false, Ordering::Relaxed);
        eprintln!("=================== end of {} requests", 2 * IN_FLIGHT);
    }
    let per_worker = REQUESTS / 10 / IN_FLIGHT;
    let total = run(per_worker, 0);
    total as f64 / f64::from(per_worker * IN_FLIGHT)
}

/// The Redis route's rows, when `REDIS_URL` names a Redis to count in (never
/// a shared one: the keys are written). Measured, not budgeted.
fn redis_rows() -> Vec<(&'static str, &'static str, f64)> {
    let cluster = cluster_urls();
    let url = std::env::var("REDIS_URL").ok();
    if url.is_none() && cluster.is_empty() {
        return Vec::new();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows = vec![
        (
            "redis-identity",
            "the `identity` route, driven as the Redis rows are (`block_on`)",
            per_request_on(&runtime, identity()),
        ),
        (
            "redis-identity-64",
            "the `identity` route, 64 requests in flight together",
            per_request_in_flight(&runtime, identity()),
        ),
    ];
    if let Some(url) = url {
        rows.extend(standalone_rows(&runtime, url));
    }
    rows.extend(cluster_rows(&runtime, cluster));
    rows
}

/// The Redis Cluster's nodes to count in (`REDIS_CLUSTER_URLS`, separated
/// by commas; never a shared Cluster: the keys are written).
fn cluster_urls() -> Vec<String> {
    std::env::var("REDIS_CLUSTER_URLS")
        .map(|urls| urls.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The Redis Cluster rows: the Cluster client this crate makes
/// (`connect_cluster`, whose nodes are `ClusterNode`s) beside the `redis`
/// crate's own (`get_async_connection`), so that what `ClusterNode` adds
/// a request shows as the difference. Needs feature `cluster`.
#[cfg(feature = "cluster")]
fn cluster_rows(
    runtime: &tokio::runtime::Runtime,
    urls: Vec<String>,
) -> Vec<(&'static str, &'static str, f64)> {
    if urls.is_empty() {
        return Vec::new();
    }
    let ours = runtime.block_on(async {
        let client = tower_pinned_window_redis::connection::cluster_client_builder(urls.clone())
            .build()
            .unwrap();
        tower_pinned_window_redis::connection::connect_cluster_client(&client)
            .await
            .unwrap()
    });
    let plain = runtime.block_on(async {
        tower_pinned_window_redis::connection::cluster_client_builder(urls)
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    });
    fn route<C>(connection: C) -> Router
    where
        C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
    {
        let layer = layer(HeaderStyle::Ietf, DecisionIn::Response)
            .backend(RedisBackend::builder(connection).build())
            .timeout(Window::new(Duration::from_secs(600)).unwrap());
        Router::new().route("/", get(no_content)).route_layer(layer)
    }
    let ours_route = || route(ours.clone());
    let plain_route = || route(plain.clone());
    vec![
        (
            "redis-cluster-plain",
            "Redis Cluster, the `redis` crate's own client (`get_async_connection`)",
            per_request_on(runtime, plain_route()),
        ),
        (
            "redis-cluster",
            "Redis Cluster, the crate's client (`connect_cluster`: `ClusterNode`s)",
            per_request_on(runtime, ours_route()),
        ),
        (
            "redis-cluster-plain-64",
            "Redis Cluster, the `redis` crate's own client, 64 in flight (amortized)",
            per_request_in_flight(runtime, plain_route()),
        ),
        (
            "redis-cluster-64",
            "Redis Cluster, the crate's client, 64 in flight (amortized)",
            per_request_in_flight(runtime, ours_route()),
        ),
    ]
}

#[cfg(not(feature = "cluster"))]
fn cluster_rows(
    _runtime: &tokio::runtime::Runtime,
    urls: Vec<String>,
) -> Vec<(&'static str, &'static str, f64)> {
    if !urls.is_empty() {
        eprintln!("REDIS_CLUSTER_URLS needs feature `cluster`: no Cluster rows");
    }
    Vec::new()
}

/// The standalone Redis rows (`REDIS_URL`).
fn standalone_rows(
    runtime: &tokio::runtime::Runtime,
    url: String,
) -> Vec<(&'static str, &'static str, f64)> {
    let connection = runtime.block_on(async {
        redis::Client::open(url)
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    });
    let route = |place: DecisionIn| {
        let backend = RedisBackend::builder(connection.clone()).build();
        // A timeout no call reaches, even under ALLOCS_TRACE (a backtrace
        // per allocation): the layer's timer is armed all the same.
        let layer = layer(HeaderStyle::Ietf, place)
            .backend(backend)
            .timeout(Window::new(Duration::from_secs(600)).unwrap());
        Router::new().route("/", get(no_content)).route_layer(layer)
    };
    vec![
        (
            "redis",
            "Redis backend, headers on, `Decision` in the response (`DecisionIn::Response`)",
            per_request_on(runtime, route(DecisionIn::Response)),
        ),
        (
            "redis-request",
            "Redis backend, headers on, `Decision` in the request (`DecisionIn::Request`)",
            per_request_on(runtime, route(DecisionIn::Request)),
        ),
        (
            "redis-unread",
            "Redis backend, headers on, the defaults: `Decision` unread (`DecisionIn::Asked`)",
            per_request_on(runtime, route(DecisionIn::Asked)),
        ),
        (
            "redis-64",
            "Redis backend, headers on, `Decision` in the response, 64 in flight (amortized)",
            per_request_in_flight(runtime, route(DecisionIn::Response)),
        ),
        (
            "redis-request-64",
            "Redis backend, headers on, `Decision` in the request, 64 in flight (amortized)",
            per_request_in_flight(runtime, route(DecisionIn::Request)),
        ),
        (
            "redis-unread-64",
            "Redis backend, headers on, the defaults: `Decision` unread, 64 in flight (amortized)",
            per_request_in_flight(runtime, route(DecisionIn::Asked)),
        ),
    ]
}

/// Allocations per request through `router`, after a warm-up over every
/// address.
fn per_request(router: Router) -> f64 {
    // What `axum::serve` does first (`into_make_service`): the handlers are
    // made into routes once, not on every request.
    let mut router = router.with_state(());
    for i in 0..KEYS + 1000 {
        one(&mut router, request(i));
    }
    if std::env::var("ALLOCS_TRACE").is_ok() {
        let request = request(7);
        TRACE.store(true, Ordering::Relaxed);
        one(&mut router, request);
        TRACE.store(false, Ordering::Relaxed);
        eprintln!("=================== end of request");
    }
    let mut total = 0;
    for i in 0..REQUESTS {
        let request = request(i);
        total += one(&mut router, request);
    }
    total as f64 / f64::from(REQUESTS)
}

/// Allocations made by `router` answering `request` at once with a 429.
fn one_denied(router: &mut Router, request: Request<Body>) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let before = allocations();
    {
        assert!(Service::<Request<Body>>::poll_ready(router, &mut cx).is_ready());
        let future = pin!(router.call(request));
        let Poll::Ready(response) = future.poll(&mut cx) else {
            panic!("the router did not answer at once");
        };
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        black_box(response);
    }
    allocations() - before
}

/// Allocations per denied request through `router` (a limit of 1 a key
/// an hour), once every address was let through once and denied once (so
/// a table of the keys denied most, smaller than `KEYS`, is full and
/// evicts on every new key).
fn per_denial(router: Router) -> f64 {
    let mut router = router.with_state(());
    for i in 0..KEYS {
        one(&mut router, request(i));
    }
    for i in 0..KEYS {
        one_denied(&mut router, request(i));
    }
    let mut total = 0;
    for i in 0..REQUESTS {
        total += one_denied(&mut router, request(i));
    }
    total as f64 / f64::from(REQUESTS)
}

/// The denial rows: a denied request without and with the keys denied
/// most (a table of 1,000 counters, 10,000 keys: every denial of a key
/// out of the table evicts).
fn denial_rows() -> Vec<(&'static str, &'static str, f64)> {
    let denying = || {
        let quota = Quota::new(1, Duration::from_secs(3600)).unwrap();
        RateLimitLayer::new("bench", quota)
            .key(ClientIp::new())
            .headers(HeaderStyle::None)
    };
    let route = |layer| Router::new().route("/", get(no_content)).route_layer(layer);
    vec![
        (
            "denied",
            "headers off, every request denied",
            per_denial(route(denying())),
        ),
        (
            "top-denied-denials",
            "the same with `top_denied(TopDenied::new(1000))`: added by the top-N",
            per_denial(route(denying().top_denied(TopDenied::new(1000).unwrap()))),
        ),
    ]
}

/// The 204 route behind a `route_layer` that does nothing: what the
/// limiter's cases are measured against.
fn identity() -> Router {
    Router::new()
        .route("/", get(no_content))
        .route_layer(MapResponseLayer::new(|r: Response| r))
}

async fn no_content() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// A handler that reads the decision from the request's extensions.
async fn reads_decision(decision: Decision) -> StatusCode {
    black_box(decision.remaining());
    StatusCode::NO_CONTENT
}

/// An outer layer that does nothing: the counterpart of the next.
async fn passes_through(request: Request<Body>, next: middleware::Next) -> Response {
    black_box(next.run(request).await)
}

/// An outer layer that asks for the decision and reads it from the response.
async fn asks_for_decision(mut request: Request<Body>, next: middleware::Next) -> Response {
    request.extensions_mut().insert(WantDecision);
    let response = next.run(request).await;
    let decision = response.extensions().get::<Decision>();
    black_box(decision.expect("asked for").remaining());
    response
}

fn layer(headers: HeaderStyle, place: DecisionIn) -> RateLimitLayer<ClientIp> {
    let quota = Quota::new(u64::MAX, Duration::from_secs(3600)).unwrap();
    RateLimitLayer::new("bench", quota)
        .key(ClientIp::new())
        .headers(headers)
        .decision_in(place)
}

fn limited(headers: HeaderStyle, place: DecisionIn) -> Router {
    Router::new()
        .route("/", get(no_content))
        .route_layer(layer(headers, place))
}

/// Allocations made by one client call through `svc`, as
/// `ServiceExt::ready().call()` makes it (`poll_ready`, `call`, the future
/// polled to its answer, the answer dropped); every client here answers at
/// once. The request is built before counting, as in [`one`].
fn one_call<S>(svc: &mut S) -> u64
where
    S: Service<http::Request<Empty<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    let request = http::Request::new(Empty::new());
    let mut cx = Context::from_waker(Waker::noop());
    let before = allocations();
    {
        let Poll::Ready(ready) = svc.poll_ready(&mut cx) else {
            panic!("the client was not ready at once");
        };
        ready.unwrap();
        let future = pin!(svc.call(request));
        let Poll::Ready(response) = future.poll(&mut cx) else {
            panic!("the client did not answer at once");
        };
        black_box(response.unwrap());
    }
    allocations() - before
}

/// Allocations per call through `svc`, after a warm-up.
fn per_call<S>(mut svc: S) -> f64
where
    S: Service<http::Request<Empty<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..1000 {
        one_call(&mut svc);
    }
    if std::env::var("ALLOCS_TRACE").is_ok() {
        TRACE.store(true, Ordering::Relaxed);
        one_call(&mut svc);
        TRACE.store(false, Ordering::Relaxed);
        eprintln!("=================== end of call");
    }
    let total: u64 = (0..REQUESTS).map(|_| one_call(&mut svc)).sum();
    total as f64 / f64::from(REQUESTS)
}

/// The client rows: a client behind `BudgetLayer` (memory backend, the
/// default key, a budget of `u64::MAX` an hour: always room), behind
/// tower's `RateLimit` (`u64::MAX` calls a second: never limited), and
/// bare, the base of both.
fn client_rows() -> Vec<(&'static str, &'static str, f64)> {
    // RateLimit arms a tokio timer when it is made.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let client = tower::service_fn(|_req: http::Request<Empty<Bytes>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<Bytes>::new()))
    });
    let quota = Quota::new(u64::MAX, Duration::from_secs(3600)).unwrap();
    vec![
        (
            "client-bare",
            "bare client (`service_fn`)",
            per_call(client),
        ),
        (
            "client-rate-limit",
            "tower's `RateLimit` (a rate that never blocks)",
            per_call(RateLimit::new(
                client,
                Rate::new(u64::MAX, Duration::from_secs(1)),
            )),
        ),
        (
            "client-budget",
            "`outbound::BudgetLayer`, memory backend, the budget has room",
            per_call(tower::Layer::layer(
                &BudgetLayer::new("bench", quota),
                client,
            )),
        ),
        (
            "client-budget-limits",
            "the same, reading limits held in the store (`limits`, none stored)",
            per_call(tower::Layer::layer(
                &BudgetLayer::new("bench", quota)
                    .limits(LimitBook::new(&MemoryBackend::new(), Duration::from_secs(1)).unwrap()),
                client,
            )),
        ),
    ]
}

struct Case {
    name: &'static str,
    what: &'static str,
    router: Router,
    /// The case that differs from it only by the limiter: a route_layer
    /// that does nothing in its place. axum wraps any layer given to
    /// `route_layer` in a route of its own, which boxes (two allocations a
    /// request), whatever the layer does; that is not the limiter's cost.
    base: &'static str,
}

fn cases() -> Vec<Case> {
    use DecisionIn::{Asked, Request as InRequest, Response as InResponse};
    use HeaderStyle::{Ietf, None as NoHeaders};
    let case = |name, base, what, router| Case {
        name,
        what,
        router,
        base,
    };
    vec![
        case(
            "bare",
            "bare",
            "bare axum (no layer)",
            Router::new().route("/", get(no_content)),
        ),
        case(
            "identity",
            "identity",
            "axum with a `route_layer` that does nothing (`MapResponseLayer`)",
            identity(),
        ),
        case(
            "headers-on",
            "identity",
            "headers on, `Decision` in the request (`DecisionIn::Request`), unread",
            limited(Ietf, InRequest),
        ),
        case(
            "headers-on-response",
            "identity",
            "headers on, `Decision` in the response (`DecisionIn::Response`)",
            limited(Ietf, InResponse),
        ),
        case(
            "headers-on-unread",
            "identity",
            "headers on, `Decision` unread (`DecisionIn::Asked`, the default)",
            limited(Ietf, Asked),
        ),
        case(
            "headers-off",
            "identity",
            "headers off, `Decision` in the request (`DecisionIn::Request`), unread",
            limited(NoHeaders, InRequest),
        ),
        case(
            "headers-off-response",
            "identity",
            "headers off, `Decision` in the response (`DecisionIn::Response`)",
            limited(NoHeaders, InResponse),
        ),
        case(
            "headers-off-unread",
            "identity",
            "headers off, `Decision` unread (`DecisionIn::Asked`, the default)",
            limited(NoHeaders, Asked),
        ),
        case(
            "top-denied-unread",
            "headers-off-unread",
            "`headers-off-unread` with `top_denied(TopDenied::new(1000))`, every request allowed: added by the top-N",
            Router::new()
                .route("/", get(no_content))
                .route_layer(layer(NoHeaders, Asked).top_denied(TopDenied::new(1000).unwrap())),
        ),
        case(
            "headers-off-handler",
            "identity",
            "headers off, the handler extracts `Decision` (`DecisionIn::Request`)",
            Router::new()
                .route("/", get(reads_decision))
                .route_layer(layer(NoHeaders, InRequest)),
        ),
        case(
            "outer-bare",
            "outer-bare",
            "the `identity` route behind an outer layer (`middleware::from_fn`) that passes through",
            identity().route_layer(middleware::from_fn(passes_through)),
        ),
        case(
            "headers-off-outer",
            "outer-bare",
            "headers off, `DecisionIn::Asked` (the default), an outer layer asks (`WantDecision`) and reads it",
            limited(NoHeaders, Asked).route_layer(middleware::from_fn(asks_for_decision)),
        ),
        case(
            "headers-off-outer-request",
            "outer-bare",
            "headers off, `DecisionIn::Request`, an outer layer asks (`WantDecision`) and reads it",
            limited(NoHeaders, InRequest).route_layer(middleware::from_fn(asks_for_decision)),
        ),
    ]
}

fn main() -> ExitCode {
    let mut budgets: Vec<(String, f64)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let budget = match arg.as_str() {
            "--budget" => args.next(),
            _ => None,
        };
        let Some((case, n)) = budget.as_deref().and_then(|b| b.split_once('=')) else {
            eprintln!("usage: allocs [--budget CASE=N]...");
            return ExitCode::from(2);
        };
        let Ok(n) = n.parse() else {
            eprintln!("not a number of allocations: {n:?}");
            return ExitCode::from(2);
        };
        budgets.push((case.to_owned(), n));
    }

    let measured: Vec<(Case, f64)> = cases()
        .into_iter()
        .map(|mut case| {
            let router = std::mem::take(&mut case.router);
            let n = per_request(router);
            (case, n)
        })
        .collect();
    let of = |name: &str| {
        measured
            .iter()
            .find(|(case, _)| case.name == name)
            .map(|(_, n)| *n)
    };

    println!("| case | route | allocations per request | over bare axum | added by the layer |");
    println!("|---|---|---|---|---|");
    let bare = of("bare").expect("measured");
    for (case, n) in &measured {
        let base = of(case.base).expect("every case names a measured base case");
        let added = if case.name == case.base {
            String::new()
        } else {
            format!("{:.2}", n - base)
        };
        println!(
            "| `{}` | {} | {n:.2} | {:.2} | {added} |",
            case.name,
            case.what,
            n - bare
        );
    }

    let redis = redis_rows();
    // The Redis rows' "added by the layer", for their budgets.
    let mut redis_added: Vec<(&str, f64)> = Vec::new();
    if let Some((_, _, identity)) = redis.first() {
        println!();
        println!(
            "| case | route | allocations per request | over bare axum | added by the layer |"
        );
        println!("|---|---|---|---|---|");
        let identity_64 = redis
            .iter()
            .find(|(name, _, _)| *name == "redis-identity-64")
            .map_or(*identity, |(_, _, n)| *n);
        for (name, what, n) in &redis {
            let base = if name.ends_with("-64") {
                identity_64
            } else {
                *identity
            };
            let added = if name.starts_with("redis-identity") {
                String::new()
            } else {
                redis_added.push((name, n - base));
                format!("{:.2}", n - base)
            };
            println!("| `{name}` | {what} | {n:.2} | {:.2} | {added} |", n - bare);
        }
    }
    let denials = denial_rows();
    let denied_bare = denials[0].2;
    let denial_added: Vec<(&str, f64)> = denials
        .iter()
        .skip(1)
        .map(|(name, _, n)| (*name, n - denied_bare))
        .collect();
    println!();
    println!("| case | route | allocations per denied request | added by the top-N |");
    println!("|---|---|---|---|");
    for (name, what, n) in &denials {
        let added = denial_added
            .iter()
            .find(|(case, _)| case == name)
            .map_or_else(String::new, |(_, added)| format!("{added:.2}"));
        println!("| `{name}` | {what} | {n:.2} | {added} |");
    }
    let clients = client_rows();
    let client_bare = clients[0].2;
    let client_added: Vec<(&str, f64)> = clients
        .iter()
        .skip(1)
        .map(|(name, _, n)| (*name, n - client_bare))
        .collect();
    println!();
    println!("| case | client | allocations per call | added by the layer |");
    println!("|---|---|---|---|");
    for (name, what, n) in &clients {
        let added = client_added
            .iter()
            .find(|(case, _)| case == name)
            .map_or_else(String::new, |(_, added)| format!("{added:.2}"));
        println!("| `{name}` | {what} | {n:.2} | {added} |");
    }
    std::io::stdout().flush().expect("stdout");
    let mut over = false;
    for (name, budget) in &budgets {
        let memory = measured
            .iter()
            .find(|(case, _)| case.name == name)
            .map(|(case, n)| n - of(case.base).expect("measured"));
        let redis = || redis_added.iter().find(|(case, _)| case == name);
        let client = || client_added.iter().find(|(case, _)| case == name);
        let denial = || denial_added.iter().find(|(case, _)| case == name);
        let Some(added) = memory
            .or_else(|| redis().map(|(_, added)| *added))
            .or_else(|| client().map(|(_, added)| *added))
            .or_else(|| denial().map(|(_, added)| *added))
        else {
            eprintln!("no case {name:?} (the Redis cases need REDIS_URL)");
            return ExitCode::from(2);
        };
        // Averages of whole counts: a hundredth is far below one
        // allocation in a hundred requests.
        if added > budget + 0.01 {
            eprintln!(
                "{name}: the layer adds {added:.2} allocations a request, over the budget of {budget}"
            );
            over = true;
        } else {
            eprintln!("{name}: {added:.2} added, within the budget of {budget}");
        }
    }
    if over {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
