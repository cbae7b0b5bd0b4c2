use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt, service_fn};

use super::*;
use crate::backend::{MemoryBackend, PrivateKeys};
use crate::key::KeyError;
use crate::request::RequestHead;

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

fn window(secs: u64) -> Window {
    Window::new(Duration::from_secs(secs)).unwrap()
}

/// Keys each request on its `x-key` header.
fn by_header(head: &RequestHead<'_>) -> Result<Key, KeyError> {
    head.headers()
        .get("x-key")
        .map(|v| Key::new(v.as_bytes()))
        .ok_or(KeyError::missing("x-key"))
}

type Keyed = fn(&RequestHead<'_>) -> Result<Key, KeyError>;

/// The status of a request from `key` through `layer`.
async fn status<Bk, D, M, R>(layer: &RateLimitLayer<Keyed, Bk, D, M, R>, key: &str) -> StatusCode
where
    RateLimitLayer<Keyed, Bk, D, M, R>: Layer<
        tower::util::ServiceFn<
            fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>,
        >,
    >,
    <RateLimitLayer<Keyed, Bk, D, M, R> as Layer<
        tower::util::ServiceFn<
            fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>,
        >,
    >>::Service: Service<Request<String>, Response = Response<String>, Error = Infallible>,
{
    fn ok(_: Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>> {
        std::future::ready(Ok(Response::new(String::new())))
    }
    let inner: fn(Request<String>) -> _ = ok;
    let service = layer.layer(service_fn(inner));
    let request = Request::get("/")
        .header("x-key", key)
        .body(String::new())
        .unwrap();
    service.oneshot(request).await.unwrap().status()
}

fn spending(
    store: MemoryBackend,
) -> RateLimitLayer<Keyed, MemoryBackend, crate::response::DefaultDeny, crate::cost::Spends> {
    RateLimitLayer::new("api", quota(3, 60))
        .key(by_header as Keyed)
        .backend(store)
        .cost(1)
}

#[tokio::test(start_paused = true)]
async fn a_read_counts_nothing_and_sees_what_requests_counted() {
    let layer = spending(MemoryBackend::new().tokio_clock());
    let operator = Operator::new().layer(&layer);
    let key = Key::new("alice");
    for _ in 0..5 {
        let state = operator.read("api", &key).await.unwrap();
        assert_eq!(state.counters[0].count, 0, "reads count nothing");
        assert_eq!(state.counters[0].resets_in, None);
    }
    assert_eq!(status(&layer, "alice").await, StatusCode::OK);
    tokio::time::advance(Duration::from_secs(10)).await;
    let state = operator.read("api", &key).await.unwrap();
    assert_eq!(state.counters[0].count, 1);
    assert_eq!(state.counters[0].remaining(), 2);
    assert_eq!(state.counters[0].resets_in, Some(Duration::from_secs(50)));
    assert_eq!(state.blocked_for, None);
    // Two more pass: the reads took none of the budget.
    assert_eq!(status(&layer, "alice").await, StatusCode::OK);
    assert_eq!(status(&layer, "alice").await, StatusCode::OK);
    assert_eq!(status(&layer, "alice").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn a_block_denies_the_next_request_and_an_unblock_lets_it_in() {
    let layer = spending(MemoryBackend::new().tokio_clock());
    let operator = Operator::new().layer(&layer);
    let key = Key::new("mallory");
    assert_eq!(status(&layer, "mallory").await, StatusCode::OK);
    let left = operator.block("api", &key, window(600)).await.unwrap();
    assert_eq!(left, Duration::from_secs(600));
    assert_eq!(
        status(&layer, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&layer, "bob").await,
        StatusCode::OK,
        "other keys pass"
    );
    let state = operator.read("api", &key).await.unwrap();
    assert_eq!(state.blocked_for, Some(Duration::from_secs(600)));
    assert_eq!(state.counters[0].count, 1, "the block spent nothing");
    // Deadlines only extend: a shorter block keeps the longer one.
    let left = operator.block("api", &key, window(5)).await.unwrap();
    assert_eq!(left, Duration::from_secs(600));
    // The window closes, the block stays.
    tokio::time::advance(Duration::from_secs(120)).await;
    assert_eq!(
        status(&layer, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(operator.unblock("api", &key).await.unwrap());
    assert_eq!(operator.read("api", &key).await.unwrap().blocked_for, None);
    assert_eq!(status(&layer, "mallory").await, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_reset_opens_a_fresh_window() {
    let layer = spending(MemoryBackend::new().tokio_clock());
    let operator = Operator::new().layer(&layer);
    for _ in 0..3 {
        assert_eq!(status(&layer, "carol").await, StatusCode::OK);
    }
    assert_eq!(status(&layer, "carol").await, StatusCode::TOO_MANY_REQUESTS);
    assert!(operator.reset("api", &Key::new("carol")).await.unwrap());
    assert!(!operator.reset("api", &Key::new("carol")).await.unwrap());
    assert_eq!(status(&layer, "carol").await, StatusCode::OK);
    let state = operator.read("api", &Key::new("carol")).await.unwrap();
    assert_eq!(state.counters[0].count, 1);
    // A full window (the memory store moves a window opened after a reset
    // a nanosecond earlier, to tell it from the one deleted).
    let left = state.counters[0].resets_in.unwrap();
    assert!(left > Duration::from_secs(59), "{left:?}");
}

#[tokio::test(start_paused = true)]
async fn a_plain_layer_refuses_a_block_that_would_not_block() {
    let store = MemoryBackend::new().tokio_clock();
    let layer = RateLimitLayer::new("plain", quota(3, 60))
        .key(by_header as Keyed)
        .backend(store);
    let operator = Operator::new().layer(&layer);
    assert_eq!(operator.blockable("plain"), Some(false));
    let err = operator
        .block("plain", &Key::new("k"), window(60))
        .await
        .unwrap_err();
    assert!(matches!(err, OperatorError::NotBlockable(_)), "{err}");
    assert_eq!(status(&layer, "k").await, StatusCode::OK);
    assert_eq!(
        operator
            .read("plain", &Key::new("k"))
            .await
            .unwrap()
            .blocked_for,
        None
    );
}

#[tokio::test(start_paused = true)]
async fn every_known_counter_is_read_reset_and_blocked() {
    let store = MemoryBackend::new().tokio_clock();
    let layer = spending(store)
        .also(quota(100, 3600))
        .route_quota("/login", quota(2, 60))
        .route_quota("/again", quota(3, 60));
    let operator = Operator::new().layer(&layer);
    let counters = operator.counters("api").unwrap();
    let quotas: Vec<_> = counters
        .iter()
        .map(|c| (c.quota, c.route.clone()))
        .collect();
    assert_eq!(
        quotas,
        vec![
            (quota(3, 60), None),
            (quota(100, 3600), None),
            (quota(2, 60), Some("/login".to_owned())),
        ],
        "each counter once: /again's quota is the layer's own"
    );
    assert_eq!(status(&layer, "dave").await, StatusCode::OK);
    let state = operator.read("api", &Key::new("dave")).await.unwrap();
    let counts: Vec<u64> = state.counters.iter().map(|c| c.count).collect();
    assert_eq!(counts, vec![1, 1, 0]);
    operator
        .block("api", &Key::new("dave"), window(30))
        .await
        .unwrap();
    assert_eq!(status(&layer, "dave").await, StatusCode::TOO_MANY_REQUESTS);
    operator.reset("api", &Key::new("dave")).await.unwrap();
    let state = operator.read("api", &Key::new("dave")).await.unwrap();
    assert!(state.counters.iter().all(|c| c.count == 0), "{state:?}");
    assert_eq!(state.blocked_for, None);
}

#[tokio::test]
async fn a_layer_with_tiers_is_served_and_an_unknown_layer_refused() {
    // Every tier counts in the layer's own counter: the operator reads and
    // blocks a key whatever its tier.
    let layer = spending(MemoryBackend::new()).quota_by(|_: &RequestHead<'_>| Some(quota(9, 60)));
    let operator = Operator::new().layer(&layer);
    let key = Key::new("k");
    assert_eq!(status(&layer, "k").await, StatusCode::OK);
    let state = operator.read("api", &key).await.unwrap();
    assert_eq!(state.counters[0].count, 1, "{state:?}");
    operator.block("api", &key, window(30)).await.unwrap();
    assert_eq!(status(&layer, "k").await, StatusCode::TOO_MANY_REQUESTS);
    operator.unblock("api", &key).await.unwrap();
    assert_eq!(status(&layer, "k").await, StatusCode::OK);
    assert!(matches!(
        operator.read("nope", &key).await,
        Err(OperatorError::UnknownLayer(_))
    ));
}

#[test]
fn two_layers_of_one_name_are_refused() {
    let layer = spending(MemoryBackend::new());
    let err = Operator::new().layer(&layer).try_layer(&layer).unwrap_err();
    assert_eq!(err, ConfigError::OperatorNameTaken("api".into()));
}

#[test]
#[should_panic(expected = "has a layer named \"api\" already")]
fn two_layers_of_one_name_panic_at_the_callers_line() {
    let layer = spending(MemoryBackend::new());
    let _ = Operator::new().layer(&layer).layer(&layer);
}

#[tokio::test(start_paused = true)]
async fn private_keys_meet_the_counter_the_layer_counted() {
    let store = PrivateKeys::new(MemoryBackend::new().tokio_clock(), [7u8; 32]);
    let layer = RateLimitLayer::new("api", quota(3, 60))
        .key(by_header as Keyed)
        .backend(store.clone())
        .cost(1);
    let operator = Operator::new().layer(&layer);
    assert_eq!(status(&layer, "erin").await, StatusCode::OK);
    let state = operator.read("api", &Key::new("erin")).await.unwrap();
    assert_eq!(
        state.counters[0].count, 1,
        "the same digest as the request's"
    );
    operator
        .block("api", &Key::new("erin"), window(60))
        .await
        .unwrap();
    assert_eq!(status(&layer, "erin").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn a_budget_lists_its_waiting_and_closed_keys_as_digests_only() {
    use crate::outbound::BudgetLayer;

    let budget = BudgetLayer::new("partner", quota(1, 60))
        .key(by_header as Keyed)
        .max_wait(Duration::from_secs(600));
    let operator: Operator<MemoryBackend> = Operator::new().budget(&budget);
    let client = budget.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let call = |key: &'static str| {
        let client = client.clone();
        async move {
            let request = Request::get("/")
                .header("x-key", key)
                .body(String::new())
                .unwrap();
            client.oneshot(request).await.map(|r| r.status())
        }
    };
    assert!(operator.budget_keys("partner").unwrap().0.is_empty());
    call("acme").await.unwrap();
    let waiting: Vec<_> = (0..3).map(|_| tokio::spawn(call("acme"))).collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let (keys, cut) = operator.budget_keys("partner").unwrap();
    assert!(!cut);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].waiting, 3, "{keys:?}");
    assert_eq!(keys[0].closed_for, None);
    assert_eq!(keys[0].digest, operator.digest(&Key::new("acme")));
    assert_eq!(keys[0].digest.len(), 16);
    assert!(!keys[0].digest.contains("acme"));
    assert_ne!(
        operator.digest(&Key::new("acme")),
        Operator::<MemoryBackend>::new().digest(&Key::new("acme")),
        "another operator draws another secret"
    );

    // The provider's word closes a key in this process.
    let now = tokio::time::Instant::now();
    budget
        .watch()
        .heard
        .close(&Key::new("beta"), now + Duration::from_secs(30), now);
    let (keys, _) = operator.budget_keys("partner").unwrap();
    let beta = keys
        .iter()
        .find(|k| k.digest == operator.digest(&Key::new("beta")))
        .unwrap();
    assert_eq!(beta.closed_for, Some(Duration::from_secs(30)));
    assert_eq!(beta.waiting, 0);
    assert_eq!(keys[0].waiting, 3, "the most waiting first");

    // Served or given up (the line's estimate may give a call up): each
    // leaves the line.
    for task in waiting {
        let _ = task.await.unwrap();
    }
    let (keys, _) = operator.budget_keys("partner").unwrap();
    assert!(keys.iter().all(|k| k.waiting == 0), "{keys:?}");
    assert!(matches!(
        operator.budget_keys("nope"),
        Err(OperatorError::UnknownLayer(_))
    ));
}

/// `POST path` with `body` to the operator's service: its status and body.
async fn post(operator: &Operator<MemoryBackend>, path: &str, body: &str) -> (StatusCode, String) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .unwrap();
    let response = operator.service().oneshot(request).await.unwrap();
    (response.status(), response.into_body())
}

#[tokio::test]
async fn limits_are_set_read_and_cleared_and_keys_listed_as_digests() {
    let store = MemoryBackend::new();
    let book = crate::LimitBook::new(&store, Duration::from_millis(10)).unwrap();
    let layer = spending(store).limits(book.clone());
    let operator = Operator::new().layer(&layer).limits(book);
    for _ in 0..2 {
        assert_eq!(status(&layer, "abuser").await, StatusCode::OK);
    }
    let (code, body) = post(
        &operator,
        "/limits/set",
        r#"{"layer":"api","key":"abuser","rate":"1/min"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(
        &operator,
        "/limits/set",
        r#"{"layer":"api","tier":"pro","rate":"9/min"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    // The layer reads its copy again on its next request, then applies it
    // to the count so far (2 > 1).
    status(&layer, "abuser").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        status(&layer, "abuser").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (code, body) = post(&operator, "/limits", r#"{"layer":"api"}"#).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(
        !body.contains("abuser"),
        "never a raw key in a list: {body}"
    );
    assert!(
        body.contains(&operator.digest(&Key::new("abuser"))),
        "{body}"
    );
    assert!(body.contains("\"pro\":\"9/1min\""), "{body}");
    // Bad input: refused, nothing stored.
    for bad in [
        r#"{"layer":"api","key":"abuser","rate":"0/min"}"#,
        r#"{"layer":"api","key":"abuser","rate":"5/0s"}"#,
        r#"{"layer":"api","key":"abuser","rate":"-5/min"}"#,
        r#"{"layer":"api","key":"abuser"}"#,
        r#"{"layer":"api","tier":"pro","key":"abuser","rate":"5/min"}"#,
        r#"{"layer":"api","rate":"5/min","extra":1}"#,
    ] {
        let (code, body) = post(&operator, "/limits/set", bad).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let stored = operator.read_limits("api").await.unwrap();
    assert_eq!(
        stored
            .get(LimitScope::Key(&Key::new("abuser")))
            .unwrap()
            .limit(),
        1
    );
    let (code, _) = post(
        &operator,
        "/limits/clear",
        r#"{"layer":"api","key":"abuser"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        operator.read_limits("api").await.unwrap().len(),
        1,
        "the tier's stays"
    );
    let (code, _) = post(&operator, "/limits", r#"{"layer":"nope"}"#).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    // Without a book: 409, said so.
    let bare = Operator::new().layer(&spending(MemoryBackend::new()));
    let (code, body) = post(&bare, "/limits", r#"{"layer":"api"}"#).await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("no-limit-book"), "{body}");
}

#[tokio::test]
async fn the_keys_denied_most_are_listed_as_digests() {
    let layer =
        spending(MemoryBackend::new()).top_denied(crate::denied::TopDenied::new(8).unwrap());
    let operator = Operator::new().layer(&layer);
    for _ in 0..6 {
        status(&layer, "flooder").await;
    }
    let top = operator.denied("api", 10).unwrap().expect("kept");
    assert_eq!(top[0].denied, 3, "6 requests, 3 let through");
    let request = Request::get("/denied").body(String::new()).unwrap();
    let response = operator.service().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body();
    assert!(!body.contains("flooder"), "{body}");
    assert!(body.contains(&top[0].digest), "{body}");
    assert!(body.contains("\"denied\":3"), "{body}");
    // A layer without a table is not listed; an unknown one is refused.
    let plain = Operator::new().layer(&spending(MemoryBackend::new()));
    assert_eq!(plain.denied("api", 10).unwrap(), None);
    assert!(matches!(
        plain.denied("nope", 10),
        Err(OperatorError::UnknownLayer(_))
    ));
}
