//! Limits held in the store that change under load (issue 43), the short
//! version of `soak/limits.sh`: four instances, each a `RateLimitLayer` with
//! a backend of its own (its own Redis connection, its own PostgreSQL pool)
//! and a `LimitBook` of its own, on a real Redis (the harness's own server)
//! and on PostgreSQL (a schema of its own), under load from 24 callers on 3
//! keys, while a controller lowers and raises the layer's stored limit.
//!
//! No timed assertion: after each set, the controller waits (up to 10 s, a
//! patience) until every instance decides under the new limit, and the
//! invariants are counts. A limit is in force from its set until the last
//! answer decided under it ended (the staleness, as it happened); then:
//! every key window admitted at most the highest limit in force during it,
//! and at most the highest limit its own admissions were decided under;
//! once every instance applied a lowered limit, no admission counted past it.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use http::{HeaderName, Request, Response, StatusCode};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::{LimitScope, Limits};
use tower_pinned_window::{Decision, DecisionIn, LimitBook, Quota, RateLimitLayer, Window};
use trial::Needs;

const INSTANCES: usize = 4;
const WORKERS: usize = 6;
const KEYS: u64 = 3;
const WINDOW: Duration = Duration::from_secs(1);
/// The layer's own quota, then the stored limits in turn: lowered, raised,
/// lowered, raised. Every value differs, so a decision's limit names its set.
const BASE: u64 = 30;
const LIMITS: [u64; 4] = [8, 24, 4, 16];
const STALENESS: Duration = Duration::from_millis(100);
/// How long a limit is held once every instance applies it.
const HOLD: Duration = Duration::from_millis(1_100);
const PATIENCE: Duration = Duration::from_secs(10);

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// One answer, as its instance saw it.
#[derive(Clone, Copy, Debug)]
struct Answer {
    start_us: u64,
    end_us: u64,
    key: u64,
    admitted: bool,
    limit: u64,
    count: u64,
    /// The window's deadline (the answer's end plus its `reset`), for an
    /// admission.
    deadline_ms: u64,
}

/// A set: when it was asked, when every instance had decided under it, the
/// limit.
#[derive(Clone, Copy, Debug)]
struct Set {
    start_us: u64,
    applied_us: u64,
    limit: u64,
}

async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

/// The run on `backends`: the first `INSTANCES` are the instances', the
/// last the controller's.
async fn limits_change_under_load<B>(mut backends: Vec<B>)
where
    B: Limits + Clone + Send + Sync + 'static,
    B::Future: Send,
{
    let controller = backends.pop().unwrap();
    let control = LimitBook::new(&controller, STALENESS).unwrap();
    let quota = |limit| Quota::new(limit, WINDOW).unwrap();
    let applied: Arc<Vec<AtomicU64>> =
        Arc::new((0..INSTANCES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (instance, backend) in backends.into_iter().enumerate() {
        let book = LimitBook::new(&backend, STALENESS).unwrap();
        let service = RateLimitLayer::new("changing", quota(BASE))
            .key(HeaderName::from_static("x-key"))
            .decision_in(DecisionIn::Response)
            // Long, so that a loaded machine times nothing out: every answer
            // is the store's.
            .timeout(Window::new(Duration::from_secs(5)).unwrap())
            .backend(backend)
            .limits(book)
            .layer(tower::service_fn(ok));
        for w in 0..WORKERS {
            let service = service.clone();
            let (applied, stop) = (Arc::clone(&applied), Arc::clone(&stop));
            workers.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut n = w as u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = (n * 7 + instance as u64) % KEYS;
                    let request = Request::get("/")
                        .header("x-key", format!("k{key}"))
                        .body(Body::empty())
                        .unwrap();
                    let start_us = unix_us();
                    let Ok(response) = service.clone().oneshot(request).await;
                    let end_us = unix_us();
                    let status = response.status();
                    assert!(
                        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                        "instance {instance}: {status}"
                    );
                    let decision = response.extensions().get::<Decision>().unwrap();
                    applied[instance].store(decision.limit(), Ordering::Relaxed);
                    let admitted = status == StatusCode::OK;
                    answers.push(Answer {
                        start_us,
                        end_us,
                        key,
                        admitted,
                        limit: decision.limit(),
                        count: decision.count(),
                        deadline_ms: if admitted {
                            end_us / 1000 + decision.reset().as_millis() as u64
                        } else {
                            0
                        },
                    });
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers
            }));
        }
    }

    let mut sets = vec![Set {
        start_us: 0,
        applied_us: 0,
        limit: BASE,
    }];
    for limit in LIMITS {
        let start_us = unix_us();
        control
            .set("changing", LimitScope::Layer, quota(limit))
            .await
            .unwrap();
        let patience = Instant::now() + PATIENCE;
        while applied.iter().any(|a| a.load(Ordering::Relaxed) != limit) {
            assert!(
                Instant::now() < patience,
                "a limit of {limit} not applied by every instance within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        sets.push(Set {
            start_us,
            applied_us: unix_us(),
            limit,
        });
        tokio::time::sleep(HOLD).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for worker in workers {
        answers.extend(worker.await.unwrap());
    }
    judge(&sets, &answers);
}

fn judge(sets: &[Set], answers: &[Answer]) {
    // A limit is in force from its set until the last answer decided under
    // it ended.
    let mut last_end: BTreeMap<u64, u64> = BTreeMap::new();
    for a in answers {
        let end = last_end.entry(a.limit).or_default();
        *end = (*end).max(a.end_us);
    }
    for a in answers {
        assert!(
            sets.iter()
                .any(|s| s.limit == a.limit && s.start_us <= a.start_us + 1_000),
            "decided under {} before it was set: {a:?}",
            a.limit
        );
    }
    let in_force = |from_us: u64, to_us: u64| {
        sets.iter()
            .filter(|s| {
                s.start_us <= to_us && last_end.get(&s.limit).is_some_and(|&e| e >= from_us)
            })
            .map(|s| s.limit)
            .max()
            .unwrap_or(BASE)
    };

    // Windows: a key's admissions grouped by deadline.
    let mut admitted: Vec<&Answer> = answers.iter().filter(|a| a.admitted).collect();
    admitted.sort_by_key(|a| (a.key, a.deadline_ms));
    let half = WINDOW.as_millis() as u64 / 2;
    let mut windows: Vec<Vec<&Answer>> = Vec::new();
    for a in admitted {
        match windows.last_mut() {
            Some(w) if w[0].key == a.key && a.deadline_ms < w[0].deadline_ms + half => w.push(a),
            _ => windows.push(vec![a]),
        }
    }
    let mut full = 0;
    for w in &windows {
        let deadline_ms = w[0].deadline_ms;
        let start_us = (deadline_ms - WINDOW.as_millis() as u64) * 1000;
        let highest = in_force(start_us, deadline_ms * 1000);
        let applied = w.iter().map(|a| a.limit).max().unwrap();
        let n = w.len() as u64;
        assert!(
            n <= applied,
            "key k{} admitted {n} in its window closing at {deadline_ms}, past the highest limit its admissions were decided under, {applied}",
            w[0].key
        );
        assert!(
            n <= highest,
            "key k{} admitted {n} in its window closing at {deadline_ms}, past the highest limit in force then, {highest}",
            w[0].key
        );
        full += usize::from(n == applied);
    }
    // Not vacuous: windows filled to their limit.
    assert!(
        full >= 3,
        "only {full} of {} windows reached their limit",
        windows.len()
    );

    // Once every instance applied a lowered limit, nothing counted past it.
    for pair in sets.windows(2) {
        let (before, set) = (pair[0], pair[1]);
        if set.limit >= before.limit {
            continue;
        }
        let next_start = sets
            .iter()
            .find(|s| s.start_us > set.start_us)
            .map_or(u64::MAX, |s| s.start_us);
        let past: Vec<_> = answers
            .iter()
            .filter(|a| {
                a.admitted
                    && a.start_us >= set.applied_us
                    && a.start_us < next_start
                    && a.count > set.limit
            })
            .collect();
        assert!(
            past.is_empty(),
            "{} admissions past the lowered limit {} once every instance applied it: {:?}",
            past.len(),
            set.limit,
            past.first()
        );
    }
}

/// Two workers, as the other store tests' multi-thread runtime.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn on_redis() {
    let Some(server) = support::redis::RedisServer::start("limits_change::redis") else {
        return;
    };
    runtime().block_on(async {
        let mut backends = Vec::new();
        for _ in 0..=INSTANCES {
            // Each its own connection (a ConnectionManager of its own).
            backends.push(
                tower_pinned_window_redis::RedisBackend::connect(&server.url())
                    .await
                    .unwrap(),
            );
        }
        limits_change_under_load(backends).await;
    });
}

fn on_postgres() {
    runtime().block_on(async {
        let Some(schema) = support::postgres::TestSchema::create("limits_change").await else {
            return;
        };
        let mut backends = vec![schema.backend().await];
        for _ in 0..INSTANCES {
            // Each its own pool.
            backends.push(schema.builder().build());
        }
        limits_change_under_load(backends).await;
    });
}

fn main() {
    let trials = vec![
        trial::trial("redis::limits_change_under_load", Needs::Redis, on_redis),
        trial::trial(
            "postgres::limits_change_under_load",
            Needs::Postgres,
            on_postgres,
        ),
    ];
    trial::run(trials, ())
}
