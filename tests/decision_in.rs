//! Where a passed request's `Decision` goes (`DecisionIn`, `WantDecision`),
//! how a handler extracts it (and is told the setter when it is missing),
//! and that a request nobody reads the decision of is still counted and
//! answered exactly as before.
#![cfg(feature = "axum")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Extension;
use axum::http::{HeaderValue, Request, StatusCode, header::RETRY_AFTER};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Router, middleware};
use tower::ServiceExt;
use tower_pinned_window::{
    Decision, DecisionIn, Quota, RateLimitLayer, outcome::WantDecision, response::HeaderStyle,
};

fn quota(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(60)).unwrap()
}

fn layer(limit: u64, place: DecisionIn) -> RateLimitLayer {
    RateLimitLayer::new("api", quota(limit)).decision_in(place)
}

async fn send(app: &Router, request: Request<Body>) -> Response {
    app.clone().oneshot(request).await.unwrap()
}

fn get_root() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

fn asking() -> Request<Body> {
    let mut request = get_root();
    request.extensions_mut().insert(WantDecision);
    request
}

fn decision(response: &Response) -> Option<&Decision> {
    response.extensions().get::<Decision>()
}

/// What the handler saw: `remaining` and `count` of the decision in its
/// request, or "none".
async fn reports(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(d)) => format!("remaining={} count={}", d.remaining(), d.count()),
        None => "none".to_owned(),
    }
}

async fn body(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn a_handler_reads_the_decision_from_its_request() {
    let app = Router::new()
        .route("/", get(reports))
        .route_layer(layer(3, DecisionIn::Request));
    let first = send(&app, get_root()).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(decision(&first).is_none(), "not in the response unasked");
    assert_eq!(first.headers()["ratelimit"], "\"api\";r=2;t=60");
    assert_eq!(body(first).await, "remaining=2 count=1");
    assert_eq!(
        body(send(&app, get_root()).await).await,
        "remaining=1 count=2"
    );
}

#[tokio::test]
async fn by_default_the_decision_goes_only_where_asked() {
    assert_eq!(DecisionIn::default(), DecisionIn::Asked);
    // No `decision_in`: the layer's default.
    let app = Router::new()
        .route("/", get(reports))
        .route_layer(RateLimitLayer::new("api", quota(3)));
    let first = send(&app, get_root()).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(decision(&first).is_none(), "not in the response unasked");
    assert_eq!(first.headers()["ratelimit"], "\"api\";r=2;t=60");
    assert_eq!(body(first).await, "none", "not in the request untold");
    let asked = send(&app, asking()).await;
    assert_eq!(decision(&asked).map(Decision::count), Some(2));
    assert_eq!(body(asked).await, "none");
}

/// What the handler saw through the `Decision` extractor.
async fn extracts(decision: Decision) -> String {
    format!(
        "remaining={} count={}",
        decision.remaining(),
        decision.count()
    )
}

/// What the handler saw through the `Option<Decision>` extractor.
async fn extracts_if_any(decision: Option<Decision>) -> String {
    decision.map_or_else(
        || "none".to_owned(),
        |d| format!("remaining={} count={}", d.remaining(), d.count()),
    )
}

#[tokio::test]
async fn a_handler_extracts_the_decision_when_the_layer_gives_it() {
    let app = Router::new()
        .route("/", get(extracts))
        .route("/maybe", get(extracts_if_any))
        .route_layer(layer(3, DecisionIn::Request));
    let first = send(&app, get_root()).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(body(first).await, "remaining=2 count=1");
    let maybe = send(&app, Request::get("/maybe").body(Body::empty()).unwrap()).await;
    assert_eq!(body(maybe).await, "remaining=1 count=2");
}

#[tokio::test]
async fn a_handler_that_extracts_a_decision_it_was_not_given_is_told_the_setter() {
    for place in [DecisionIn::Asked, DecisionIn::Response] {
        let app = Router::new()
            .route("/", get(extracts))
            .route_layer(layer(3, place));
        let response = send(&app, get_root()).await;
        assert_eq!(
            response.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{place:?}"
        );
        let text = body(response).await;
        assert!(
            text.contains("`.decision_in(DecisionIn::Request)`"),
            "{place:?}: {text}"
        );
        assert!(text.contains("`Option<Decision>`"), "{place:?}: {text}");
    }
}

#[tokio::test]
async fn an_optional_decision_is_none_when_the_layer_gives_none() {
    // Untold, and skipped: the handler runs, without a decision.
    let untold = Router::new()
        .route("/", get(extracts_if_any))
        .route_layer(layer(3, DecisionIn::Asked));
    let response = send(&untold, get_root()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response).await, "none");
    let skipped = Router::new()
        .route("/", get(extracts_if_any))
        .route_layer(layer(3, DecisionIn::Request).skip_if(|_| true));
    let response = send(&skipped, get_root()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response).await, "none");
}

#[tokio::test]
async fn the_handler_does_not_get_it_under_response_and_asked() {
    for place in [DecisionIn::Response, DecisionIn::Asked] {
        let app = Router::new()
            .route("/", get(reports))
            .route_layer(layer(3, place));
        assert_eq!(
            body(send(&app, get_root()).await).await,
            "none",
            "{place:?}"
        );
    }
}

#[tokio::test]
async fn the_response_carries_it_under_response_and_when_asked() {
    let cases = [
        (DecisionIn::Response, false, true),
        (DecisionIn::Response, true, true),
        (DecisionIn::Request, false, false),
        (DecisionIn::Request, true, true),
        (DecisionIn::Asked, false, false),
        (DecisionIn::Asked, true, true),
    ];
    for (place, ask, carried) in cases {
        let app = Router::new()
            .route("/", get(|| async { StatusCode::NO_CONTENT }))
            .route_layer(layer(3, place));
        let response = send(&app, if ask { asking() } else { get_root() }).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            decision(&response).map(Decision::count),
            carried.then_some(1),
            "{place:?}, asked: {ask}"
        );
        // The headers do not depend on where the decision goes.
        assert_eq!(response.headers()["ratelimit"], "\"api\";r=2;t=60");
    }
}

#[tokio::test]
async fn an_outer_layer_that_asks_gets_it() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let outer = middleware::from_fn(move |mut request: Request<Body>, next: middleware::Next| {
        let log = Arc::clone(&log);
        async move {
            request.extensions_mut().insert(WantDecision);
            let response = next.run(request).await;
            let decision = response.extensions().get::<Decision>().cloned();
            log.lock()
                .unwrap()
                .push(decision.map(|d| ((d.passed(), d.over_limit()), d.remaining())));
            response
        }
    });
    let app = Router::new()
        .route("/", get(reports))
        .route_layer(layer(1, DecisionIn::Request))
        .route_layer(outer);
    // The handler gets it from the request, and the outer layer from the
    // response.
    assert_eq!(
        body(send(&app, get_root()).await).await,
        "remaining=0 count=1"
    );
    let denied = send(&app, get_root()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        *seen.lock().unwrap(),
        [Some(((true, false), 0)), Some(((false, true), 0))]
    );
}

#[tokio::test]
async fn a_denial_always_carries_it() {
    for place in [DecisionIn::Response, DecisionIn::Request, DecisionIn::Asked] {
        let app = Router::new()
            .route("/", get(|| async { StatusCode::NO_CONTENT }))
            .route_layer(layer(1, place).headers(HeaderStyle::None));
        send(&app, get_root()).await;
        let denied = send(&app, get_root()).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "{place:?}");
        assert_eq!(decision(&denied).map(Decision::count), Some(2), "{place:?}");
        assert_eq!(denied.headers()[RETRY_AFTER], "60");
    }
}

#[tokio::test]
async fn an_unread_decision_keeps_the_limit_exact() {
    // Headers off, nobody reading: the path that makes no decision for a
    // passed request. The limit is still exact, and the denial still
    // carries its decision.
    let app = Router::new()
        .route("/", get(|| async { StatusCode::NO_CONTENT }))
        .route_layer(layer(3, DecisionIn::Asked).headers(HeaderStyle::None));
    for _ in 0..3 {
        let response = send(&app, get_root()).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        assert!(decision(&response).is_none());
        for name in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "retry-after",
        ] {
            assert!(!response.headers().contains_key(name), "{name}");
        }
    }
    let denied = send(&app, get_root()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(decision(&denied).unwrap().count(), 4);
    // Asking after the fact shows the count went on.
    let asked = send(&app, asking()).await;
    assert_eq!(decision(&asked).unwrap().count(), 5);
}

#[tokio::test]
async fn an_unread_decision_still_raises_retry_after_on_the_last_hit() {
    // A service whose answer says "retry in 1 s"; this layer's last hit of
    // the window leaves nothing, so a retry waits for the window: 60 s.
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                ([(RETRY_AFTER, HeaderValue::from_static("1"))], "ok").into_response()
            }),
        )
        .route_layer(layer(2, DecisionIn::Asked).headers(HeaderStyle::None));
    let first = send(&app, get_root()).await;
    assert_eq!(first.headers()[RETRY_AFTER], "1", "one hit to spare");
    let last = send(&app, get_root()).await;
    assert_eq!(last.status(), StatusCode::OK);
    assert_eq!(last.headers()[RETRY_AFTER], "60", "nothing left");
}

#[tokio::test]
async fn on_decision_sees_every_decision_even_unread() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let app = Router::new()
        .route("/", get(|| async { StatusCode::NO_CONTENT }))
        .route_layer(
            layer(2, DecisionIn::Asked)
                .headers(HeaderStyle::None)
                .on_decision(move |d: &Decision| log.lock().unwrap().push(d.count())),
        );
    for _ in 0..3 {
        send(&app, get_root()).await;
    }
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
}

#[tokio::test]
async fn under_count_if_the_response_carries_it_and_the_request_gets_it_before_any_refund() {
    let app = Router::new()
        .route(
            "/",
            get(|decision: Option<Extension<Decision>>| async move {
                // Answered 404, which does not count: its hit is refunded
                // after this handler saw the decision.
                (StatusCode::NOT_FOUND, reports(decision).await)
            }),
        )
        .route_layer(
            layer(3, DecisionIn::Request).count_if(|head| head.status() != StatusCode::NOT_FOUND),
        );
    for _ in 0..2 {
        let response = send(&app, get_root()).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let d = decision(&response).expect("settled under count_if");
        assert!(d.refunded());
        assert_eq!(d.count(), 0);
        assert_eq!(body(response).await, "remaining=2 count=1");
    }
}
