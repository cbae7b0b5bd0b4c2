//! The metrics a layer records (feature `metrics`), rendered by a
//! Prometheus recorder local to each test.

mod support;

use std::future::{Pending, Ready, pending, ready};
use std::num::NonZeroU64;
use std::pin::Pin;
use std::time::Duration;

use http::{Request, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use support::http::{Body, by_client, from, ok_service};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::{Backend, BackendError, Counter, Hit, Hits, MemoryBackend};
use tower_pinned_window::key::Key;
use tower_pinned_window::{FailurePolicy, NamedQuota, Quota, RateLimitLayer, Window};

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).unwrap()
}

/// A recorder for this test's thread (tokio's test runtime is
/// current-thread, so every poll happens here), and its handle.
fn recorder() -> (PrometheusRecorder, PrometheusHandle) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    (recorder, handle)
}

/// The value of the series `series` (name and labels, as rendered), if it
/// was recorded.
fn value(rendered: &str, series: &str) -> Option<f64> {
    rendered.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.parse().ok()
    })
}

#[tokio::test]
async fn decisions_by_limiter_policy_and_outcome() {
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let layer = RateLimitLayer::new("api", quota(2, Duration::from_secs(60)))
        .also(NamedQuota::new(
            "hourly",
            quota(3, Duration::from_secs(3600)),
        ))
        .key(by_client());
    let svc = layer.layer(ok_service());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            svc.clone()
                .oneshot(from("alice-secret-key"))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let shadow = RateLimitLayer::new("dry", quota(1, Duration::from_secs(60)))
        .shadow(true)
        .layer(ok_service());
    for _ in 0..3 {
        shadow
            .clone()
            .oneshot(Request::new(Body::new()))
            .await
            .unwrap();
    }

    let rendered = handle.render();
    let decisions = |limiter: &str, policy: &str, outcome: &str| {
        value(
            &rendered,
            &format!(
                "tower_pinned_window_decisions_total{{limiter=\"{limiter}\",policy=\"{policy}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    // Each decision is the binding quota's: the minute's while it has the
    // fewest left or alone is over, then the hour's, over and resetting last.
    assert_eq!(decisions("api", "api", "allowed"), Some(2.0), "{rendered}");
    assert_eq!(decisions("api", "api", "denied"), Some(1.0), "{rendered}");
    assert_eq!(
        decisions("api", "hourly", "denied"),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(
        decisions("api", "hourly", "allowed"),
        Some(0.0),
        "{rendered}"
    );
    assert_eq!(decisions("dry", "dry", "allowed"), Some(1.0), "{rendered}");
    assert_eq!(decisions("dry", "dry", "shadowed"), Some(2.0), "{rendered}");
    assert!(
        !rendered.contains("alice"),
        "no key in any label:\n{rendered}"
    );
    assert!(
        !rendered.contains("tower_pinned_window_backend_latency_seconds"),
        "the in-memory backend never waits, so no latency is recorded:\n{rendered}"
    );
    assert!(!rendered.contains("tower_pinned_window_deny_cache_answers_total"));
}

#[tokio::test]
async fn the_keys_denied_most_by_rank_never_by_key() {
    use tower_pinned_window::denied::TopDenied;
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let layer = RateLimitLayer::new("top", quota(1, Duration::from_secs(60)))
        .key(by_client())
        .top_denied(TopDenied::new(3).unwrap());
    let denied = layer.denied_keys().unwrap();
    let svc = layer.layer(ok_service());
    svc.clone().oneshot(from("alice-secret-key")).await.unwrap();
    let rendered = handle.render();
    assert!(
        !rendered.contains("tower_pinned_window_top_denied"),
        "nothing before a denial:\n{rendered}"
    );
    // The first denial sets the gauges (then at most once a second).
    let refused = svc.clone().oneshot(from("alice-secret-key")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let rendered = handle.render();
    let rank = |rank: u32| {
        value(
            &rendered,
            &format!("tower_pinned_window_top_denied{{limiter=\"top\",rank=\"{rank}\"}}"),
        )
    };
    assert_eq!(rank(1), Some(1.0), "{rendered}");
    assert_eq!(rank(2), Some(0.0), "{rendered}");
    assert_eq!(rank(3), Some(0.0), "{rendered}");
    assert_eq!(rank(4), None, "no more ranks than counters:\n{rendered}");
    let digest = denied.digest(&Key::new("alice-secret-key"));
    assert!(
        !rendered.contains("alice") && !rendered.contains(&digest),
        "neither the key nor its digest in a label:\n{rendered}"
    );
}

#[tokio::test]
async fn backend_errors_by_kind() {
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let full = MemoryBackend::new().max_keys(1);
    let svc = RateLimitLayer::new("full", quota(5, Duration::from_secs(60)))
        .key(by_client())
        .backend(full)
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    svc.clone().oneshot(from("a")).await.unwrap();
    let refused = svc.clone().oneshot(from("b")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::OK, "failing open");
    svc.clone().oneshot(from("c")).await.unwrap();

    let rendered = handle.render();
    let errors = |kind: &str| {
        value(
            &rendered,
            &format!(
                "tower_pinned_window_backend_errors_total{{limiter=\"full\",kind=\"{kind}\"}}"
            ),
        )
    };
    assert_eq!(errors("at_capacity"), Some(2.0), "{rendered}");
    assert_eq!(errors("timed_out"), Some(0.0), "{rendered}");
    let decisions =
        "tower_pinned_window_decisions_total{limiter=\"full\",policy=\"full\",outcome=\"allowed\"}";
    assert_eq!(
        value(&rendered, decisions),
        Some(1.0),
        "only the counted request is a decision"
    );
}

/// A backend that never answers: every call times out.
#[derive(Clone, Debug)]
struct Silent;

impl Backend for Silent {
    type Future = Pending<Result<Hits, BackendError>>;
    type Refund = Ready<Result<bool, BackendError>>;

    fn hit_all(&self, _key: &Key, _counters: &[Counter<'_>]) -> Self::Future {
        pending()
    }

    fn refund(&self, _namespace: &str, _key: &Key, _hit: &Hit) -> Self::Refund {
        ready(Ok(false))
    }

    async fn peek(&self, _namespace: &str, _key: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(None)
    }

    async fn reset(&self, _namespace: &str, _key: &Key) -> Result<bool, BackendError> {
        Ok(false)
    }
}

/// A backend that answers after a wait (a round trip), or at once with
/// what a deny cache answers: a count over the limit and no deadline.
#[derive(Clone, Debug)]
struct Remote {
    cached: bool,
}

type Boxed = Pin<Box<dyn Future<Output = Result<Hits, BackendError>> + Send>>;

impl Backend for Remote {
    type Future = Boxed;
    type Refund = Ready<Result<bool, BackendError>>;

    fn hit_all(&self, _key: &Key, counters: &[Counter<'_>]) -> Boxed {
        let limit = counters[0].quota.limit();
        if self.cached {
            return Box::pin(ready(Ok(Hits::one(Hit {
                count: limit + 1,
                reset: Duration::from_secs(5),
                deadline: None,
            }))));
        }
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(Hits::one(Hit {
                count: 1,
                reset: Duration::from_secs(60),
                deadline: NonZeroU64::new(60_000),
            }))
        })
    }

    fn refund(&self, _namespace: &str, _key: &Key, _hit: &Hit) -> Self::Refund {
        ready(Ok(false))
    }

    async fn peek(&self, _namespace: &str, _key: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(None)
    }

    async fn reset(&self, _namespace: &str, _key: &Key) -> Result<bool, BackendError> {
        Ok(false)
    }
}

#[tokio::test(start_paused = true)]
async fn latency_only_where_a_call_waited_and_deny_cache_answers() {
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let q = quota(10, Duration::from_secs(60));
    let silent = RateLimitLayer::new("silent", q)
        .backend(Silent)
        .timeout(Window::new(Duration::from_millis(50)).unwrap())
        .layer(ok_service());
    let answer = silent.oneshot(Request::new(Body::new())).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);

    let remote = RateLimitLayer::new("remote", q)
        .backend(Remote { cached: false })
        .layer(ok_service());
    for _ in 0..3 {
        let answer = remote
            .clone()
            .oneshot(Request::new(Body::new()))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }
    let cached = RateLimitLayer::new("cached", q)
        .backend(Remote { cached: true })
        .layer(ok_service());
    for _ in 0..2 {
        let answer = cached
            .clone()
            .oneshot(Request::new(Body::new()))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    let rendered = handle.render();
    let series = |s: &str| value(&rendered, s);
    assert_eq!(
        series("tower_pinned_window_backend_errors_total{limiter=\"silent\",kind=\"timed_out\"}"),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(
        series("tower_pinned_window_backend_latency_seconds_count{limiter=\"silent\"}"),
        Some(1.0),
        "a call that timed out waited too:\n{rendered}"
    );
    assert_eq!(
        series("tower_pinned_window_backend_latency_seconds_count{limiter=\"remote\"}"),
        Some(3.0),
        "{rendered}"
    );
    assert_eq!(
        series("tower_pinned_window_deny_cache_answers_total{limiter=\"cached\"}"),
        Some(2.0),
        "{rendered}"
    );
    assert_eq!(
        series(
            "tower_pinned_window_decisions_total{limiter=\"cached\",policy=\"cached\",outcome=\"denied\"}"
        ),
        Some(2.0),
        "{rendered}"
    );
    assert!(
        !rendered.contains("tower_pinned_window_backend_latency_seconds_count{limiter=\"cached\"}"),
        "an answer given at once reads no clock:\n{rendered}"
    );
    assert!(
        !rendered.contains("tower_pinned_window_deny_cache_answers_total{limiter=\"remote\"}"),
        "a counted hit is no deny-cache answer:\n{rendered}"
    );
}

/// On a real Redis: the first hit over the limit goes to Redis, the next
/// one is the deny cache's.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_round_trips_and_deny_cache_answers() {
    use support::redis::RedisServer;
    use tower_pinned_window_redis::RedisBackend;

    let server = redis_or_skip!(RedisServer::start(
        "redis_round_trips_and_deny_cache_answers"
    ));
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let connection = server.client().get_connection_manager().await.unwrap();
    let svc = RateLimitLayer::new("shared", quota(1, Duration::from_secs(60)))
        .key(by_client())
        .backend(RedisBackend::new(connection))
        .layer(ok_service());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(svc.clone().oneshot(from("bob")).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let rendered = handle.render();
    let series = |s: &str| value(&rendered, s);
    assert_eq!(
        series("tower_pinned_window_backend_latency_seconds_count{limiter=\"shared\"}"),
        Some(2.0),
        "two round trips: the allowed hit and the first denial:\n{rendered}"
    );
    assert_eq!(
        series("tower_pinned_window_deny_cache_answers_total{limiter=\"shared\"}"),
        Some(2.0),
        "{rendered}"
    );
    assert_eq!(
        series(
            "tower_pinned_window_decisions_total{limiter=\"shared\",policy=\"shared\",outcome=\"denied\"}"
        ),
        Some(3.0),
        "{rendered}"
    );
    let count: i64 = redis::cmd("GET")
        .arg("tpw:shared{bob}")
        .query(&mut server.sync())
        .unwrap();
    assert_eq!(
        count, 2,
        "the deny cache's answers were not counted in Redis"
    );
}

/// A stored limit that is not a limit (written behind the book's back) is
/// left out: the layer's own quota applies, and the layer's gauge of
/// corrupt stored limits says how many there are, back to 0 once it is
/// cleared.
#[cfg(feature = "redis")]
#[tokio::test]
async fn corrupt_stored_limits_are_counted_and_ignored() {
    use support::redis::RedisServer;
    use tower_pinned_window::LimitBook;
    use tower_pinned_window::backend::toolkit::storage_key;
    use tower_pinned_window::backend::{LimitScope, encode_scope};
    use tower_pinned_window_redis::RedisBackend;

    let server = redis_or_skip!(RedisServer::start(
        "corrupt_stored_limits_are_counted_and_ignored"
    ));
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let backend = RedisBackend::new(server.client().get_connection_manager().await.unwrap());
    let book = LimitBook::new(&backend, Duration::from_millis(20)).unwrap();
    let hash = storage_key::encode_limits(b"tpw:", "stored");
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg(encode_scope(LimitScope::Layer))
        .arg("lots/60000ms")
        .query(&mut server.sync())
        .unwrap();
    let svc = RateLimitLayer::new("stored", quota(2, Duration::from_secs(60)))
        .key(by_client())
        .backend(backend)
        .limits(book.clone())
        .layer(ok_service());
    let gauge = |handle: &PrometheusHandle| {
        value(
            &handle.render(),
            "tower_pinned_window_stored_limits_corrupt{limiter=\"stored\"}",
        )
    };
    // Each request past the staleness bound starts a read in the background.
    let start = std::time::Instant::now();
    let mut statuses = Vec::new();
    while gauge(&handle) != Some(1.0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no gauge of 1 after 10 s:\n{}",
            handle.render()
        );
        let key = format!("client-{}", statuses.len());
        statuses.push(svc.clone().oneshot(from(&key)).await.unwrap().status());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The layer's own quota of 2 applies, never "no limit".
    for _ in 0..3 {
        statuses.push(svc.clone().oneshot(from("alice")).await.unwrap().status());
    }
    assert_eq!(
        statuses[statuses.len() - 3..],
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let left: String = redis::cmd("HGET")
        .arg(&hash)
        .arg(encode_scope(LimitScope::Layer))
        .query(&mut server.sync())
        .unwrap();
    assert_eq!(left, "lots/60000ms", "a corrupt limit is left as it is");
    book.clear("stored", LimitScope::Layer).await.unwrap();
    let start = std::time::Instant::now();
    while gauge(&handle) != Some(0.0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the gauge stayed at {:?} after the value was cleared",
            gauge(&handle)
        );
        svc.clone().oneshot(from("bob")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// On a real Redis Cluster (`cluster-require-full-coverage yes`, Redis's
/// default) whose master of a key has one of its slots taken away
/// (`CLUSTER DELSLOTS`): that master refuses every key (`CLUSTERDOWN`).
/// Each request on the key is answered 503 within the layer's default
/// timeout, carries `cluster_down`, and is counted under
/// `kind="cluster_down"`: not as a timeout, and, however many in a row,
/// never as an open circuit. Like any outage, the failure policy decides:
/// fail-open passes it, the insurance limiter decides it.
#[cfg(feature = "redis-cluster")]
#[tokio::test]
async fn a_cluster_refusal_is_counted_as_cluster_down() {
    use support::logs::Capture;
    use support::redis::{RedisCluster, plain_storage_key};
    use tower_pinned_window::Share;
    use tower_pinned_window_redis::RedisBackend;
    use tracing_subscriber::filter::LevelFilter;

    let cluster = redis_or_skip!(RedisCluster::start(
        "a_cluster_refusal_is_counted_as_cluster_down"
    ));
    let (recorder, handle) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let logs = Capture::start(LevelFilter::WARN);
    let backend = RedisBackend::connect_cluster(cluster.urls()).await.unwrap();
    let svc = RateLimitLayer::new("refused", quota(1000, Duration::from_secs(60)))
        .key(by_client())
        .backend(backend.clone())
        .layer(ok_service());
    assert_eq!(
        svc.clone().oneshot(from("carol")).await.unwrap().status(),
        StatusCode::OK,
        "served while the Cluster is whole"
    );
    let stored = plain_storage_key("tpw:", "refused", b"carol");
    let slot: u16 = cluster.nodes[0]
        .cmd(&["CLUSTER", "KEYSLOT", std::str::from_utf8(&stored).unwrap()])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (owner, _) = cluster
        .masters()
        .into_iter()
        .find(|(_, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .expect("the key's master");
    let owner = cluster.nodes.iter().find(|n| n.port() == owner).unwrap();
    owner
        .cmd(&["CLUSTER", "DELSLOTS", &slot.to_string()])
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !owner
        .cmd(&["CLUSTER", "INFO"])
        .unwrap_or_default()
        .contains("cluster_state:fail")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the master never refused"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    const REQUESTS: usize = 20;
    let mut took = Vec::new();
    for _ in 0..REQUESTS {
        let sent = std::time::Instant::now();
        let response = svc.clone().oneshot(from("carol")).await.unwrap();
        took.push(sent.elapsed());
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response
                .extensions()
                .get::<std::sync::Arc<BackendError>>()
                .map(|err| err.kind_name()),
            Some("cluster_down"),
            "answered for the Cluster's refusal"
        );
    }
    took.sort();
    eprintln!(
        "a refused request failed in {:.1} to {:.1} ms (median {:.1} ms; {REQUESTS} requests, layer timeout {} ms)",
        took[0].as_secs_f64() * 1e3,
        took[REQUESTS - 1].as_secs_f64() * 1e3,
        took[REQUESTS / 2].as_secs_f64() * 1e3,
        tower_pinned_window::DEFAULT_TIMEOUT.as_millis(),
    );
    for (name, policy) in [
        ("refused_open", FailurePolicy::FailOpen),
        (
            "refused_insured",
            FailurePolicy::Insurance(Share::one_in(2).unwrap()),
        ),
    ] {
        let other = RateLimitLayer::new(name, quota(1000, Duration::from_secs(60)))
            .key(by_client())
            .backend(backend.clone())
            .on_failure(policy)
            .layer(ok_service());
        let response = other.oneshot(from("carol")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{policy:?}");
    }
    // One line a layer (each rate-limits its own), each naming the refusal.
    let lines: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|line| line.contains("limiter="))
        .collect();
    eprintln!("{}", lines.join("\n"));
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (line, action) in lines.iter().zip([
        "answering 503",
        "passing requests uncounted",
        "deciding with the insurance limiter",
    ]) {
        assert!(
            line.contains("cluster refused the hit") && line.contains(action),
            "{line}"
        );
        assert!(
            !line.contains("backend failed") && !line.contains("circuit open"),
            "{line}"
        );
    }
    let rendered = handle.render();
    let errors_of = |limiter: &str, kind: &str| {
        value(
            &rendered,
            &format!(
                "tower_pinned_window_backend_errors_total{{limiter=\"{limiter}\",kind=\"{kind}\"}}"
            ),
        )
    };
    let errors = |kind: &str| errors_of("refused", kind);
    assert_eq!(
        errors_of("refused_open", "cluster_down"),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(
        errors_of("refused_insured", "cluster_down"),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(
        value(
            &rendered,
            "tower_pinned_window_decisions_total{limiter=\"refused_insured\",policy=\"refused_insured\",outcome=\"allowed\"}"
        ),
        Some(1.0),
        "the insurance limiter decided:\n{rendered}"
    );
    assert_eq!(errors("cluster_down"), Some(REQUESTS as f64), "{rendered}");
    assert_eq!(errors("timed_out"), Some(0.0), "{rendered}");
    assert_eq!(
        errors("circuit_open"),
        Some(0.0),
        "{REQUESTS} refusals in a row open no breaker:\n{rendered}"
    );
}
