//! End to end: a real axum server on 127.0.0.1:0 and a real HTTP client.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{Router, routing::get};
use http::StatusCode;
use support::http::{Client, serve};
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};

fn client_from(ip: &str) -> Client {
    Client::from_ip(ip)
}

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

async fn status(client: &Client, url: &str) -> StatusCode {
    client.get(url).send().await.unwrap().status()
}

#[tokio::test]
async fn the_quickstart_setup_limits_each_client_ip() {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route_layer(RateLimitLayer::new("quickstart", quota(5, 10)).key(ClientIp::new()))
        .route("/health", get(|| async { "ok" }));
    let server = serve(app).await;
    let url = format!("{}/", server.url);
    let one = client_from("127.0.0.1");
    for i in 0..5 {
        let res = one.get(&url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"quickstart\";r={};t=10", 4 - i).as_str()
        );
        assert_eq!(res.headers()["ratelimit-policy"], "\"quickstart\";q=5;w=10");
    }
    let res = one.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        res.headers()["ratelimit"],
        format!("\"quickstart\";r=0;t={retry}").as_str()
    );

    assert_eq!(
        status(&client_from("127.0.0.2"), &url).await,
        StatusCode::OK,
        "another address has its own budget"
    );
    for _ in 0..10 {
        assert_eq!(
            status(&one, &format!("{}/health", server.url)).await,
            StatusCode::OK,
            "/health is not limited"
        );
    }
}

#[tokio::test]
async fn two_route_layers_do_not_share_counters() {
    let app = Router::new()
        .route(
            "/login",
            get(|| async { "login" }).layer(RateLimitLayer::new("login", quota(1, 60))),
        )
        .route(
            "/search",
            get(|| async { "search" }).layer(RateLimitLayer::new("search", quota(2, 60))),
        );
    let server = serve(app).await;
    let client = Client::new();
    let login = format!("{}/login", server.url);
    let search = format!("{}/search", server.url);
    assert_eq!(status(&client, &login).await, StatusCode::OK);
    assert_eq!(status(&client, &login).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        status(&client, &search).await,
        StatusCode::OK,
        "login's budget is not search's"
    );
    assert_eq!(status(&client, &search).await, StatusCode::OK);
    assert_eq!(
        status(&client, &search).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn one_layer_on_a_router_is_one_budget() {
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .route_layer(RateLimitLayer::new("both", quota(2, 60)));
    let server = serve(app).await;
    let client = Client::new();
    assert_eq!(
        status(&client, &format!("{}/a", server.url)).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&client, &format!("{}/b", server.url)).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&client, &format!("{}/a", server.url)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&client, &format!("{}/b", server.url)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn shadow_mode_over_http() {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new("trial", quota(1, 60)).shadow(true));
    let server = serve(app).await;
    let client = Client::new();
    for remaining in [0, 0, 0] {
        let res = client.get(&server.url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"trial\";r={remaining};t=60").as_str()
        );
        assert!(res.headers().get("retry-after").is_none());
        assert_eq!(res.body(), "hello");
    }
}

#[tokio::test]
async fn a_server_without_connect_info_answers_500_not_a_panic() {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new("ip", quota(1, 60)).key(ClientIp::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    // Served without into_make_service_with_connect_info.
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::new();
    for _ in 0..3 {
        assert_eq!(
            status(&client, &url).await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    task.abort();
}

#[tokio::test]
async fn a_route_quota_through_route_layer() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new()
        .route("/login", get(|| async { "login" }))
        .route("/items/{id}", get(|| async { "item" }))
        .route_layer(
            RateLimitLayer::new("site", quota(3, 60))
                .key(ClientIp::new())
                .route_quota("/login", quota(1, 900))
                .on_decision(move |d| {
                    log.lock().unwrap().push(format!(
                        "{} {} {:?} {}",
                        d.name(),
                        d.policy(),
                        d.route(),
                        match (d.passed(), d.over_limit()) {
                            (true, false) => "Allowed",
                            (true, true) => "Shadowed",
                            (false, _) => "Denied",
                        }
                    ))
                }),
        );
    let server = serve(app).await;
    let client = Client::new();
    let login = format!("{}/login", server.url);
    assert_eq!(status(&client, &login).await, StatusCode::OK);
    let denied = client.get(&login).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers()["ratelimit-policy"],
        "\"site /login\";q=1;w=900",
        "the route's quota under a readable name"
    );
    // /items/{id} is one route whatever the id, under the layer's quota.
    for (i, want) in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(
            status(&client, &format!("{}/items/{i}", server.url)).await,
            want,
            "item {i}"
        );
    }
    assert_eq!(
        seen.lock().unwrap()[..3],
        [
            "site site /login Some(\"/login\") Allowed",
            "site site /login Some(\"/login\") Denied",
            "site site Some(\"/items/{id}\") Allowed",
        ],
        "decisions name the policy and the matched route, never the raw path"
    );
}

#[allow(dead_code)]
#[path = "../examples/token_budget.rs"]
mod token_budget;

/// examples/token_budget.rs on a real server: each call reserves its
/// body's `max_tokens` on the way in, and its answer settles the reservation to
/// the tokens its `x-usage-tokens` header says, once hyper has sent its body.
#[tokio::test]
async fn the_token_budget_example_reserves_then_settles_per_api_key() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioExecutor;
    use tower_pinned_window::backend::{Backend, MemoryBackend};
    use tower_pinned_window::key::Key;

    let budget = token_budget::budget().unwrap();
    assert_eq!(budget, quota(1000, 60), "the default, TOKEN_BUDGET unset");
    let backend = MemoryBackend::new();
    let server = serve(token_budget::app(backend.clone(), budget)).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let url = format!("{}/complete", server.url);
    let complete = |key: &'static str, max_tokens: Option<&'static str>, tokens: u64| {
        let request = http::Request::post(&url)
            .header("x-api-key", key)
            .header("content-type", "application/json");
        let body = match max_tokens {
            Some(max_tokens) => format!("{{\"max_tokens\": {max_tokens}, \"tokens\": {tokens}}}"),
            None => format!("{{\"tokens\": {tokens}}}"),
        };
        let body = Bytes::from(body);
        let request = request.body(Full::new(body)).unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts, body)
        }
    };
    let spent = |key: &'static str| {
        let backend = backend.clone();
        async move {
            let hit = backend.peek("tokens", &Key::new(key)).await.unwrap();
            hit.map(|hit| hit.count)
        }
    };
    let limit = budget.limit();
    let mut left = limit;
    while left >= 300 {
        let (parts, body) = complete("k1", Some("300"), 300).await;
        assert_eq!(parts.status, StatusCode::OK, "{left} left");
        assert_eq!(parts.headers["x-usage-tokens"], "300");
        left -= 300;
        // The headers show the budget after this call's reservation.
        assert_eq!(
            parts.headers["ratelimit"],
            format!("\"tokens\";r={left};t=60").as_str(),
        );
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["usage"]["tokens"], 300);
    }
    // Less than an estimate left: denied, and nothing spent past the budget.
    let (parts, _) = complete("k1", Some("300"), 300).await;
    assert_eq!(parts.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = parts.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(spent("k1").await, Some(limit - left));

    // A call that uses less than it reserved gives the rest back.
    let (parts, _) = complete("k2", Some("300"), 120).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(
        parts.headers["ratelimit"],
        format!("\"tokens\";r={};t=60", limit - 300).as_str()
    );
    assert_eq!(parts.headers["x-usage-tokens"], "120");
    assert_eq!(spent("k2").await, Some(120), "settled to the use");
    // Without `max_tokens`, the default estimate is reserved and the
    // answer capped at it.
    let (parts, _) = complete("k3", None, 10_000).await;
    let default = token_budget::DEFAULT_MAX_TOKENS;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(
        parts.headers["x-usage-tokens"],
        default.to_string().as_str()
    );
    assert_eq!(spent("k3").await, Some(default));
}

/// A request body sent in `frames`, one a poll, with no length: hyper
/// sends it chunked.
struct Chunked(std::collections::VecDeque<bytes::Bytes>);

impl http_body::Body for Chunked {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(
            self.0
                .pop_front()
                .map(|data| Ok(http_body::Frame::data(data))),
        )
    }
}

/// examples/token_budget.rs on a real server, its calls' bodies sent
/// chunked in several frames by a real client: the layer reads
/// `max_tokens` across the frames, the handler gets the body whole, and a
/// body over the example's limit gets 413 and spends nothing.
#[tokio::test]
async fn the_token_budget_example_reserves_from_a_chunked_body() {
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioExecutor;
    use tower_pinned_window::backend::{Backend, MemoryBackend};
    use tower_pinned_window::key::Key;

    let backend = MemoryBackend::new();
    let server = serve(token_budget::app(backend.clone(), quota(1000, 60))).await;
    let client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Chunked>();
    let url = format!("{}/complete", server.url);
    let call = |key: &'static str, frames: Vec<String>| {
        let request = http::Request::post(&url)
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(Chunked(
                frames.into_iter().map(bytes::Bytes::from).collect(),
            ))
            .unwrap();
        assert!(request.headers().get("content-length").is_none());
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        }
    };
    let spent = |key: &'static str| {
        let backend = backend.clone();
        async move {
            let hit = backend.peek("tokens", &Key::new(key)).await.unwrap();
            hit.map(|hit| hit.count)
        }
    };
    let frames = ["{\"max_to", "kens\": 40", "0, \"tok", "ens\": 150}"].map(String::from);
    let (parts, body) = call("k1", frames.to_vec()).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(
        parts.headers["ratelimit"], "\"tokens\";r=600;t=60",
        "400 reserved"
    );
    // The handler parsed the whole body: 150 tokens, under max_tokens.
    assert_eq!(parts.headers["x-usage-tokens"], "150");
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["usage"]["tokens"], 150);
    assert_eq!(spent("k1").await, Some(150), "settled to the use");

    // Over the example's limit (64 KiB), chunked: 413, nothing spent.
    let pad = "x".repeat(16 * 1024);
    let mut frames = vec!["{\"max_tokens\": 10, \"pad\": \"".to_owned()];
    frames.extend(std::iter::repeat_n(pad, 5));
    frames.push("\"}".to_owned());
    let (parts, _) = call("k2", frames).await;
    assert_eq!(parts.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(spent("k2").await, None);
}

/// examples/token_budget.rs's `--measure`: sequential calls until the first
/// 429, charged only, or reserved then settled; the figures follow from the
/// budget and the scenario's estimate and use.
#[tokio::test]
async fn the_token_budget_measure_mode_never_overspends_with_reservations() {
    use token_budget::Budgeting;

    let budget = token_budget::budget().unwrap();
    let limit = budget.limit();
    let estimate = 300;
    for usage in [300, 120] {
        // Charged only: admitted while under the budget, so the last call
        // takes the count past it.
        let charged = token_budget::measure(budget, Budgeting::ChargeOnly, estimate, usage)
            .await
            .unwrap();
        let admitted = limit.div_ceil(usage);
        assert_eq!(
            (charged.admitted, charged.spent),
            (admitted, admitted * usage),
            "{charged}"
        );
        assert_eq!(charged.overspend(), admitted * usage - limit);
        assert!(charged.overspend() > 0, "{charged}");
        // Reserved then settled: admitted only while the estimate fits.
        let reserved = token_budget::measure(budget, Budgeting::ReserveThenSettle, estimate, usage)
            .await
            .unwrap();
        let admitted = (limit - estimate) / usage + 1;
        assert_eq!(
            (reserved.admitted, reserved.spent),
            (admitted, admitted * usage),
            "{reserved}"
        );
        assert_eq!(reserved.overspend(), 0);
        assert_eq!(
            reserved.to_string(),
            format!(
                "reserve then settle: admitted {admitted}, spent {} of {limit} (overspend 0)",
                admitted * usage
            )
        );
        if usage < estimate {
            // The refund of the unused estimate lets more calls in than
            // estimates fit in the budget.
            assert!(reserved.admitted > limit / estimate, "{reserved}");
        }
    }
}
