//! Instruction counts under valgrind's callgrind: the memory backend and the
//! layer, each beside governor / tower_governor, in one run.
//!
//! `bash bench/callgrind.sh` builds this and runs it under
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=*case_*`,
//! so only the `case_*` functions below are counted. Each case is warmed up
//! outside them (first-use costs such as the clock's calibration and the
//! tables' growth are not counted), then run `ITERS` times inside its
//! `case_*` function; the script divides each function's inclusive count by
//! the number of iterations this program prints.
//!
//! Run on its own (no valgrind) it only prints the iteration counts.
//!
//! The `case_client_*` functions are the outbound side: one call of a
//! client through `outbound::BudgetLayer` (memory backend, one key, a
//! budget that always has room), through `tower::limit::RateLimit` (a rate
//! that never blocks), and bare, each driven as a client does
//! (`poll_ready`, `call`, the future polled to its answer).

#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use http::{Request, Response};
use http_body_util::Empty;
use tower::limit::RateLimit;
use tower::limit::rate::Rate;
use tower::{Layer, Service, service_fn};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_pinned_window::InFlight;
use tower_pinned_window::backend::{
    Backend, Cap, Counter, Leasing, LimitScope, MemoryBackend, SlotId,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::outbound::{BudgetLayer, Reader};
use tower_pinned_window::{DecisionIn, LimitBook, Quota, RateLimitLayer, response::HeaderStyle};

const KEYS: usize = 100_000;
/// Hits per memory case.
const ITERS: usize = 200_000;
/// Requests per layer case, and calls per client case.
const REQUESTS: usize = 20_000;

const COUNTER: &[Counter<'static>] = &[Counter {
    namespace: "bench",
    quota: Quota::per_hour(NonZeroU32::MAX),
    lowers: false,
}];

/// A policy of two quotas (`also`): one key, two counters.
const TWO_COUNTERS: &[Counter<'static>] = &[
    COUNTER[0],
    Counter {
        namespace: "bench-day",
        quota: Quota::per_day(NonZeroU32::MAX),
        lowers: false,
    },
];

/// One hit through our memory backend, the key built from the address as
/// an extractor does per request.
#[inline(always)]
fn hit_ours(store: &MemoryBackend, ip: &IpAddr, counters: &[Counter<'_>]) {
    black_box(
        store
            .hit_all(&key(black_box(ip)), counters)
            .into_inner()
            .unwrap(),
    );
}

fn key(ip: &IpAddr) -> Key {
    match ip {
        IpAddr::V4(v4) => Key::new(v4.octets()),
        IpAddr::V6(v6) => Key::new(v6.octets()),
    }
}

fn governor() -> DefaultKeyedRateLimiter<IpAddr> {
    RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX))
}

/// Runs `f` `n` times: the warm-up, not counted.
#[inline(never)]
fn warm(n: usize, f: &mut impl FnMut(usize)) {
    for i in 0..n {
        f(i);
    }
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {$(
        #[inline(never)]
        fn $name(n: usize, f: &mut impl FnMut(usize)) {
            // A constant of its own, so that the compiler never folds two
            // cases with the same code into one function.
            black_box(stringify!($name));
            for i in 0..n {
                f(i);
            }
        }
    )*};
}

cases!(
    case_hot_key_ours,
    case_slot_taken_and_given_back_ours,
    case_take_all_and_given_back_ours,
    case_hot_key_governor,
    case_100k_keys_ours,
    case_100k_keys_governor,
    case_two_counters_ours,
    case_layer_bare,
    case_layer_ours_headers,
    case_layer_ours_no_headers,
    case_layer_ours_headers_response,
    case_layer_ours_no_headers_response,
    case_layer_ours_headers_request,
    case_layer_ours_no_headers_request,
    case_layer_ours_headers_unread,
    case_layer_ours_no_headers_unread,
    case_layer_tower_governor_headers,
    case_layer_tower_governor_no_headers,
    case_layer_bare_axum_request,
    case_layer_ours_headers_axum_request,
    case_layer_ours_no_headers_axum_request,
    case_layer_tower_governor_headers_axum_request,
    case_layer_tower_governor_no_headers_axum_request,
    case_client_bare,
    case_client_rate_limit,
    case_client_budget,
    case_client_budget_reads_nothing,
    case_client_bare_headers,
    case_client_budget_headers,
    case_client_budget_headers_reads_nothing,
    case_layer_ours_no_headers_book_empty,
    case_layer_ours_no_headers_book_stored,
);

/// One request through a clone of `svc` (as axum's router clones a route's
/// service per request), driven to completion with a no-op waker: every
/// service here answers at once.
fn one_request<S>(svc: &S)
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut svc = svc.clone();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let future = pin!(svc.call(Request::new(Body::empty())));
    match future.poll(&mut cx) {
        Poll::Ready(response) => {
            black_box(response.unwrap());
        }
        Poll::Pending => panic!("the service did not answer at once"),
    }
}

/// What axum's router has put into every request's extensions by the time
/// a route's layers see it (its `MatchedPath`, the `ConnectInfo` of
/// `into_make_service_with_connect_info`...): here one small value.
#[derive(Clone)]
struct Routed(#[allow(dead_code)] u64);

/// [`one_request`] with a request that already has extensions, as under
/// axum. Building the request (and its map) is counted, in the bare case
/// too, so the subtraction leaves the layer's own cost.
fn one_axum_request<S>(svc: &S)
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut svc = svc.clone();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut request = Request::new(Body::empty());
    request.extensions_mut().insert(Routed(7));
    let future = pin!(svc.call(request));
    match future.poll(&mut cx) {
        Poll::Ready(response) => {
            black_box(response.unwrap());
        }
        Poll::Pending => panic!("the service did not answer at once"),
    }
}

/// One client call through `svc`, as `ServiceExt::ready().call()` makes
/// it: `poll_ready`, `call`, and its future polled to the answer, with a
/// no-op waker (every client here answers at once). The same instance
/// serves every call: tower's `RateLimit` is not `Clone`.
fn one_call<S>(svc: &mut S)
where
    S: Service<Request<Empty<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(ready) => ready.unwrap(),
        Poll::Pending => panic!("the client was not ready at once"),
    }
    let future = pin!(svc.call(Request::new(Empty::new())));
    match future.poll(&mut cx) {
        Poll::Ready(response) => {
            black_box(response.unwrap());
        }
        Poll::Pending => panic!("the client did not answer at once"),
    }
}

fn main() {
    let ips: Vec<IpAddr> = (0..KEYS as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect();

    // The memory hit: our backend's hit_all (with the key built from the
    // address, as an extractor does per request) and governor's check_key.
    let store = MemoryBackend::new();
    let mut f = |_| hit_ours(&store, &ips[0], COUNTER);
    warm(1000, &mut f);
    case_hot_key_ours(ITERS, &mut f);

    let limiter = governor();
    let mut f = |_| {
        black_box(limiter.check_key(black_box(&ips[0])).is_ok());
    };
    warm(1000, &mut f);
    case_hot_key_governor(ITERS, &mut f);

    let store = MemoryBackend::new();
    let mut f = |i: usize| hit_ours(&store, &ips[i % KEYS], COUNTER);
    warm(KEYS, &mut f);
    case_100k_keys_ours(ITERS, &mut f);

    let limiter = governor();
    let mut f = |i: usize| {
        black_box(limiter.check_key(black_box(&ips[i % KEYS])).is_ok());
    };
    warm(KEYS, &mut f);
    case_100k_keys_governor(ITERS, &mut f);

    // A slot in flight taken and given back on one hot key (the in-flight
    // cap's two store steps per request), beside the plain hit above.
    let store = MemoryBackend::new();
    let cap = Cap {
        namespace: "bench",
        in_flight: InFlight::new(u64::MAX, Duration::from_secs(30)).unwrap(),
    };
    let mut f = |_| {
        let key = key(black_box(&ips[0]));
        let slot = SlotId::next();
        black_box(store.take(&key, cap, slot).into_inner().unwrap());
        let give_back = pin!(store.give_back("bench", &key, slot));
        let Poll::Ready(given) = give_back.poll(&mut Context::from_waker(Waker::noop())) else {
            unreachable!("the memory backend answers at once")
        };
        black_box(given.unwrap());
    };
    warm(1000, &mut f);
    case_slot_taken_and_given_back_ours(ITERS, &mut f);

    // A hit and a slot in one step on one hot key, the slot given back (a
    // `RateLimitLayer` with an in-flight cap: `take_all`, then `release`).
    let store = MemoryBackend::new();
    let mut f = |_| {
        let key = key(black_box(&ips[0]));
        let slot = SlotId::next();
        let hits = store.take_all(&key, cap, slot, COUNTER, None).into_inner();
        black_box(hits.unwrap());
        store.release("bench", &key, slot);
    };
    warm(1000, &mut f);
    case_take_all_and_given_back_ours(ITERS, &mut f);

    // One hot key under two quotas: no governor counterpart.
    let store = MemoryBackend::new();
    let mut f = |_| hit_ours(&store, &ips[0], TWO_COUNTERS);
    warm(1000, &mut f);
    case_two_counters_ours(ITERS, &mut f);

    // The layer around a trivial service.
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let mut f = |_| one_request(&inner);
    warm(1000, &mut f);
    case_layer_bare(REQUESTS, &mut f);

    let quota = Quota::new(u64::MAX, Duration::from_secs(3600)).unwrap();
    // Our layer around `$inner`, with `$headers` and, when given, `$place`.
    macro_rules! ours {
        ($inner:expr, $headers:expr) => {
            RateLimitLayer::new("bench", quota)
                .headers($headers)
                .layer($inner)
        };
        ($inner:expr, $headers:expr, $place:expr) => {
            RateLimitLayer::new("bench", quota)
                .headers($headers)
                .decision_in($place)
                .layer($inner)
        };
    }
    // tower_governor around `$inner`, with its headers or without.
    macro_rules! governed {
        ($inner:expr, headers) => {
            GovernorLayer::new(
                GovernorConfigBuilder::default()
                    .per_nanosecond(1)
                    .burst_size(u32::MAX)
                    .key_extractor(GlobalKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )
            .layer($inner)
        };
        ($inner:expr) => {
            GovernorLayer::new(
                GovernorConfigBuilder::default()
                    .per_nanosecond(1)
                    .burst_size(u32::MAX)
                    .key_extractor(GlobalKeyExtractor)
                    .finish()
                    .unwrap(),
            )
            .layer($inner)
        };
    }
    // One case: `$svc` driven by `$request` (`one_request` or
    // `one_axum_request`), warmed up, then counted in `$case`.
    macro_rules! layer_case {
        ($case:ident, $request:ident, $svc:expr) => {{
            let svc = $svc;
            let mut f = |_| $request(&svc);
            warm(1000, &mut f);
            $case(REQUESTS, &mut f);
        }};
    }
    use DecisionIn::{Asked, Request as InRequest, Response as InResponse};
    use HeaderStyle::{Ietf, None as NoHeaders};

    // The layer at its defaults, then under each `DecisionIn`: `Response`
    // puts the decision into the response's extensions, `Request` into the
    // request's, and under `Asked` a decision nobody asked for goes
    // nowhere (and, with headers off, is not made).
    layer_case!(case_layer_ours_headers, one_request, ours!(inner, Ietf));
    layer_case!(
        case_layer_ours_no_headers,
        one_request,
        ours!(inner, NoHeaders)
    );
    layer_case!(
        case_layer_ours_headers_response,
        one_request,
        ours!(inner, Ietf, InResponse)
    );
    layer_case!(
        case_layer_ours_no_headers_response,
        one_request,
        ours!(inner, NoHeaders, InResponse)
    );
    layer_case!(
        case_layer_ours_headers_request,
        one_request,
        ours!(inner, Ietf, InRequest)
    );
    layer_case!(
        case_layer_ours_no_headers_request,
        one_request,
        ours!(inner, NoHeaders, InRequest)
    );
    layer_case!(
        case_layer_ours_headers_unread,
        one_request,
        ours!(inner, Ietf, Asked)
    );
    layer_case!(
        case_layer_ours_no_headers_unread,
        one_request,
        ours!(inner, NoHeaders, Asked)
    );
    layer_case!(
        case_layer_tower_governor_headers,
        one_request,
        governed!(inner, headers)
    );
    layer_case!(
        case_layer_tower_governor_no_headers,
        one_request,
        governed!(inner)
    );

    // The same at the defaults, each request with extensions already, as
    // axum's router hands it to a route's layers: putting a value into
    // them then makes no map. A service of another type, so that the
    // layer's code for it is compiled (and inlined) on its own, as the
    // cases above are.
    let routed = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    layer_case!(case_layer_bare_axum_request, one_axum_request, routed);
    layer_case!(
        case_layer_ours_headers_axum_request,
        one_axum_request,
        ours!(routed, Ietf)
    );
    layer_case!(
        case_layer_ours_no_headers_axum_request,
        one_axum_request,
        ours!(routed, NoHeaders)
    );
    layer_case!(
        case_layer_tower_governor_headers_axum_request,
        one_axum_request,
        governed!(routed, headers)
    );
    layer_case!(
        case_layer_tower_governor_no_headers_axum_request,
        one_axum_request,
        governed!(routed)
    );

    // The outbound side: a client behind our BudgetLayer (memory backend,
    // the default key, a budget of u64::MAX an hour: always room) and
    // behind tower's RateLimit (u64::MAX calls a second: never limited),
    // the bare client subtracted from both. RateLimit arms a tokio timer
    // when it is made, so the runtime is entered first.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let client = service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    macro_rules! client_case {
        ($case:ident, $svc:expr) => {{
            let mut svc = $svc;
            let mut f = |_| one_call(&mut svc);
            warm(1000, &mut f);
            $case(REQUESTS, &mut f);
        }};
    }
    client_case!(case_client_bare, client);
    client_case!(
        case_client_rate_limit,
        RateLimit::new(client, Rate::new(u64::MAX, Duration::from_secs(1)))
    );
    client_case!(
        case_client_budget,
        BudgetLayer::new("bench", quota).layer(client)
    );
    client_case!(
        case_client_budget_reads_nothing,
        BudgetLayer::new("bench", quota)
            .heed(Reader::none())
            .layer(client)
    );
    // A provider that says what it has left on every answer (OpenAI's
    // headers), and says nothing new: one call of the budget's counted, a
    // reset an hour away. The bare client with the same answers is
    // subtracted, and the same layer reading nothing shows what reading
    // costs.
    let talking = service_fn(|_req: Request<Empty<Bytes>>| async {
        let mut response = Response::new(Empty::<Bytes>::new());
        let headers = response.headers_mut();
        headers.insert(
            "x-ratelimit-remaining-requests",
            http::HeaderValue::from_static("999999999999"),
        );
        headers.insert(
            "x-ratelimit-reset-requests",
            http::HeaderValue::from_static("59m59.9s"),
        );
        headers.insert(
            "x-ratelimit-remaining-tokens",
            http::HeaderValue::from_static("149984"),
        );
        headers.insert(
            "x-ratelimit-reset-tokens",
            http::HeaderValue::from_static("6ms"),
        );
        Ok::<_, Infallible>(response)
    });
    let talked_to = Quota::new(1_000_000_000_000, Duration::from_secs(3600)).unwrap();
    client_case!(case_client_bare_headers, talking);
    client_case!(
        case_client_budget_headers,
        BudgetLayer::new("bench", talked_to).layer(talking)
    );
    client_case!(
        case_client_budget_headers_reads_nothing,
        BudgetLayer::new("bench", talked_to)
            .heed(Reader::none())
            .layer(talking)
    );

    // Limits held in the store (a LimitBook, read once an hour here): with
    // nothing stored, and with the layer's limit stored, beside the same
    // layer with its fixed quota (`case_layer_ours_no_headers`). The
    // book's background read runs on this runtime before the count.
    let store = MemoryBackend::new();
    let book = LimitBook::new(&store, Duration::from_secs(3600)).unwrap();
    let svc = RateLimitLayer::new("bench", quota)
        .headers(HeaderStyle::None)
        .backend(store.clone())
        .limits(book.clone())
        .layer(inner);
    one_request(&svc);
    runtime.block_on(tokio::task::yield_now());
    let mut f = |_| one_request(&svc);
    warm(1000, &mut f);
    case_layer_ours_no_headers_book_empty(REQUESTS, &mut f);
    let store = MemoryBackend::new();
    let book = LimitBook::new(&store, Duration::from_secs(3600)).unwrap();
    let stored = Quota::new(u64::MAX - 1, Duration::from_secs(3600)).unwrap();
    runtime
        .block_on(book.set("bench", LimitScope::Layer, stored))
        .unwrap();
    let svc = RateLimitLayer::new("bench", quota)
        .headers(HeaderStyle::None)
        .backend(store)
        .limits(book)
        .layer(inner);
    one_request(&svc);
    runtime.block_on(tokio::task::yield_now());
    let mut f = |_| one_request(&svc);
    warm(1000, &mut f);
    case_layer_ours_no_headers_book_stored(REQUESTS, &mut f);

    println!("iters memory={ITERS} layer={REQUESTS}");
}
