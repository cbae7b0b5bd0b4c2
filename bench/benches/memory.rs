//! The memory backend and the layer, each beside governor / tower_governor
//! measured in the same run.
//!
//! `cargo bench -p tower-pinned-window-bench --bench memory` (from the
//! repository root); the README's table is read off its output.

#![allow(missing_docs)]

use std::convert::Infallible;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_pinned_window::backend::{Backend, Counter, MemoryBackend};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, RateLimitLayer, response::HeaderStyle};

const KEYS: usize = 100_000;

/// 100k addresses, in an order that no hash function's structure can
/// follow (sorted by splitmix64 of their index): a hit on the next key is
/// a hit anywhere in the table, for every limiter alike.
fn ips() -> Vec<IpAddr> {
    let mut ips: Vec<u32> = (0..KEYS as u32).collect();
    ips.sort_by_key(|&i| splitmix64(u64::from(i)));
    ips.into_iter()
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect()
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn governor() -> DefaultKeyedRateLimiter<IpAddr> {
    RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX))
}

const COUNTER: &[Counter<'static>] = &[Counter {
    namespace: "bench",
    quota: Quota::per_hour(NonZeroU32::MAX),
    lowers: false,
}];

fn backend_hits(c: &mut Criterion) {
    // Both sides read the same IpAddr array; ours builds its key from the
    // address's octets in the loop, as an extractor would per request.
    let ips = ips();
    let key = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) => Key::new(v4.octets()),
        IpAddr::V6(v6) => Key::new(v6.octets()),
    };

    let mut group = c.benchmark_group("hot_key");
    let store = MemoryBackend::new();
    group.bench_function("pinned_window", |b| {
        b.iter(|| {
            store
                .hit_all(&key(black_box(&ips[0])), COUNTER)
                .into_inner()
                .unwrap()
        })
    });
    let limiter = governor();
    group.bench_function("governor", |b| {
        b.iter(|| limiter.check_key(black_box(&ips[0])).is_ok())
    });
    group.finish();

    let mut group = c.benchmark_group("100k_keys");
    let store = MemoryBackend::new();
    let mut i = 0;
    group.bench_function("pinned_window", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            store
                .hit_all(&key(black_box(&ips[i])), COUNTER)
                .into_inner()
                .unwrap()
        })
    });
    let limiter = governor();
    let mut i = 0;
    group.bench_function("governor", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            limiter.check_key(black_box(&ips[i])).is_ok()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("contended_2_threads");
    let store = Arc::new(MemoryBackend::new());
    group.bench_function("pinned_window", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                store
                    .hit_all(&key(black_box(&ips[0])), COUNTER)
                    .into_inner()
                    .unwrap();
            })
        })
    });
    let limiter = Arc::new(governor());
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                let _ = limiter.check_key(black_box(&ips[0]));
            })
        })
    });
    group.finish();
}

/// Time for `iters` calls of `hit` split over two threads running at once.
fn two_threads(iters: u64, hit: impl Fn() + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..iters / 2 {
                    hit();
                }
            });
        }
    });
    start.elapsed()
}

fn layer_overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let mut group = c.benchmark_group("layer");
    macro_rules! bench {
        ($name:expr, $svc:expr) => {{
            let svc = $svc;
            group.bench_function($name, |b| {
                b.to_async(&runtime)
                    .iter(|| svc.clone().oneshot(Request::new(Body::empty())))
            });
        }};
    }

    bench!("bare_service", inner);

    let quota = Quota::new(u64::MAX, Duration::from_secs(3600)).unwrap();
    bench!(
        "pinned_window",
        RateLimitLayer::new("bench", quota).layer(inner)
    );
    bench!(
        "pinned_window_no_headers",
        RateLimitLayer::new("bench", quota)
            .headers(HeaderStyle::None)
            .layer(inner)
    );

    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(GlobalKeyExtractor)
        .use_headers()
        .finish()
        .unwrap();
    bench!("tower_governor", GovernorLayer::new(config).layer(inner));
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .unwrap();
    bench!(
        "tower_governor_no_headers",
        GovernorLayer::new(config).layer(inner)
    );
    group.finish();
}

criterion_group!(benches, backend_hits, layer_overhead);
criterion_main!(benches);
