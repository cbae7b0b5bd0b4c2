//! The admin example (examples/admin.rs): its `/admin/limits` route, behind
//! a bearer token, on memory, a real Redis (the harness's own server) and
//! PostgreSQL (a schema of its own). Each operation is checked by what it
//! does to the API's real requests: a read counts nothing, a block makes
//! the next request 429 and an unblock lets it in, a reset opens a fresh
//! window; malformed JSON and unknown fields are 400 problems, and no token
//! is 401.

mod support;
#[path = "support/trial.rs"]
mod trial;

#[allow(dead_code)]
#[path = "../examples/admin.rs"]
mod admin;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use trial::Needs;

const TOKEN: &str = "a-test-token-of-32-characters-xx";

/// `GET /api/hello` as `key`.
async fn hello(app: &Router, key: &str) -> StatusCode {
    let request = Request::get("/api/hello")
        .header(admin::API_KEY, key)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

/// `POST /admin/limits{path}` with `json` and the token: the status, the
/// content type and the body as JSON.
async fn admin_call(app: &Router, path: &str, json: &str) -> (StatusCode, String, Value) {
    let request = Request::post(format!("/admin/limits{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(json.to_owned()))
        .unwrap();
    answer(app, request).await
}

async fn answer(app: &Router, request: Request<Body>) -> (StatusCode, String, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, content_type, body)
}

/// A read counts nothing: five reads, then the key's five requests pass.
async fn a_read_counts_nothing(app: Router) {
    assert_eq!(hello(&app, "alice").await, StatusCode::OK);
    for _ in 0..5 {
        let (status, _, body) = admin_call(&app, "/read", r#"{"layer":"api","key":"alice"}"#).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["counters"][0]["count"], 1, "{body}");
        assert_eq!(body["counters"][0]["remaining"], 4, "{body}");
        assert_eq!(body["blocked_for_ms"], Value::Null, "{body}");
        assert!(
            body.to_string().find("alice").is_none(),
            "the key is not echoed: {body}"
        );
    }
    for _ in 0..4 {
        assert_eq!(hello(&app, "alice").await, StatusCode::OK);
    }
    assert_eq!(hello(&app, "alice").await, StatusCode::TOO_MANY_REQUESTS);
}

/// A block makes the next request 429; an unblock lets it in.
async fn a_block_denies_and_an_unblock_lets_in(app: Router) {
    assert_eq!(hello(&app, "mallory").await, StatusCode::OK);
    let (status, _, body) = admin_call(
        &app,
        "/block",
        r#"{"layer":"api","key":"mallory","seconds":600}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let left = body["blocked_for_ms"].as_u64().unwrap();
    assert!((599_000..=600_000).contains(&left), "{body}");
    assert_eq!(hello(&app, "mallory").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(hello(&app, "bob").await, StatusCode::OK, "other keys pass");
    let (_, _, read) = admin_call(&app, "/read", r#"{"layer":"api","key":"mallory"}"#).await;
    assert!(read["blocked_for_ms"].as_u64().unwrap() > 590_000, "{read}");
    assert_eq!(
        read["counters"][0]["count"], 1,
        "a denial spends nothing: {read}"
    );
    let (status, _, body) =
        admin_call(&app, "/unblock", r#"{"layer":"api","key":"mallory"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["unblocked"], true, "{body}");
    assert_eq!(hello(&app, "mallory").await, StatusCode::OK);
    let (_, _, read) = admin_call(&app, "/read", r#"{"layer":"api","key":"mallory"}"#).await;
    assert_eq!(read["blocked_for_ms"], Value::Null, "{read}");
}

/// A reset opens a fresh window for a key at its limit; a key given in hex
/// names the same counter.
async fn a_reset_opens_a_fresh_window(app: Router) {
    for _ in 0..5 {
        assert_eq!(hello(&app, "carol").await, StatusCode::OK);
    }
    assert_eq!(hello(&app, "carol").await, StatusCode::TOO_MANY_REQUESTS);
    // "carol" in hex.
    let (status, _, body) =
        admin_call(&app, "/reset", r#"{"layer":"api","key_hex":"6361726f6c"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["reset"], true, "{body}");
    for _ in 0..5 {
        assert_eq!(hello(&app, "carol").await, StatusCode::OK, "a fresh window");
    }
    assert_eq!(hello(&app, "carol").await, StatusCode::TOO_MANY_REQUESTS);
}

/// Malformed JSON, unknown fields, a bad key, an unknown layer: problem
/// documents, and nothing changes.
async fn bad_input_is_a_problem_and_changes_nothing(app: Router) {
    assert_eq!(hello(&app, "dave").await, StatusCode::OK);
    let cases: [(&str, &str, StatusCode, &str); 9] = [
        (
            "/read",
            r#"{"layer":"api","key":"dave""#,
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        ("/reset", "not json", StatusCode::BAD_REQUEST, "bad-request"),
        (
            "/reset",
            r#"{"layer":"api","key":"dave","all":true}"#,
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "/block",
            r#"{"layer":"api","key":"dave","seconds":"600"}"#,
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "/block",
            r#"{"layer":"api","key":"dave","seconds":0}"#,
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "/block",
            r#"{"layer":"api","key":"dave"}"#,
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "/reset",
            r#"{"layer":"api","key":""}"#,
            StatusCode::BAD_REQUEST,
            "invalid-key",
        ),
        (
            "/reset",
            r#"{"layer":"api","key_hex":"zz"}"#,
            StatusCode::BAD_REQUEST,
            "invalid-key",
        ),
        (
            "/reset",
            r#"{"layer":"apx","key":"dave"}"#,
            StatusCode::NOT_FOUND,
            "unknown-layer",
        ),
    ];
    for (path, json, want, kind) in cases {
        let (status, content_type, body) = admin_call(&app, path, json).await;
        assert_eq!(status, want, "{path} {json}: {body}");
        assert_eq!(content_type, "application/problem+json", "{path} {json}");
        assert_eq!(body["status"], want.as_u16(), "{path} {json}: {body}");
        assert!(body["title"].is_string(), "{path} {json}: {body}");
        assert!(body["detail"].is_string(), "{path} {json}: {body}");
        assert!(
            body["type"]
                .as_str()
                .unwrap()
                .ends_with(&format!("#problem-{kind}")),
            "{path} {json}: {body}"
        );
        assert!(!body.to_string().contains("dave"), "no key echoed: {body}");
    }
    let (_, _, read) = admin_call(&app, "/read", r#"{"layer":"api","key":"dave"}"#).await;
    assert_eq!(read["counters"][0]["count"], 1, "nothing changed: {read}");
    assert_eq!(read["blocked_for_ms"], Value::Null, "{read}");
    // Not JSON by its content type: 415; a GET of an operation: 405.
    let form = Request::post("/admin/limits/reset")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("layer=api&key=dave"))
        .unwrap();
    assert_eq!(
        answer(&app, form).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let get = Request::get("/admin/limits/reset")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(answer(&app, get).await.0, StatusCode::METHOD_NOT_ALLOWED);
    // The list names layers and quotas, never a key.
    let list = Request::get("/admin/limits")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = answer(&app, list).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["layers"][0]["name"], "api", "{body}");
    assert_eq!(body["layers"][0]["blockable"], true, "{body}");
    assert_eq!(
        body["layers"][0]["counters"][0]["quota"], "5/1min",
        "{body}"
    );
}

/// Without the token, or with a wrong one: 401, and nothing changes.
async fn without_the_token_it_is_401(app: Router) {
    for _ in 0..5 {
        assert_eq!(hello(&app, "erin").await, StatusCode::OK);
    }
    let wrong = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let longer = format!("Bearer {TOKEN}x");
    for auth in [
        None,
        Some("Bearer "),
        Some(wrong.as_str()),
        Some(longer.as_str()),
        Some(TOKEN),
    ] {
        let mut request =
            Request::post("/admin/limits/reset").header("content-type", "application/json");
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let request = request
            .body(Body::from(r#"{"layer":"api","key":"erin"}"#))
            .unwrap();
        let (status, content_type, _) = answer(&app, request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(content_type, "application/problem+json", "{auth:?}");
    }
    assert_eq!(
        hello(&app, "erin").await,
        StatusCode::TOO_MANY_REQUESTS,
        "no reset happened"
    );
}

/// A body over 16 KiB is 413, by its declared length or by what is read.
async fn a_body_too_large_is_413(app: Router) {
    let big = format!(r#"{{"layer":"api","key":"{}"}}"#, "k".repeat(17 * 1024));
    let (status, content_type, body) = admin_call(&app, "/read", &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(content_type, "application/problem+json");
    // Streamed without a length: read up to the bound, then refused.
    let request = Request::post("/admin/limits/read")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::new(Spaces(40)))
        .unwrap();
    assert_eq!(answer(&app, request).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

/// A body of this many 1 KiB chunks of spaces, with no length known.
struct Spaces(usize);

impl http_body::Body for Spaces {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        let chunk = bytes::Bytes::from(vec![b' '; 1024]);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }
}

/// Requests as one key from `tasks` tasks in a loop, counted by answer,
/// until dropped.
struct Load {
    admitted: Arc<AtomicU64>,
    denied: Arc<AtomicU64>,
    other: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Load {
    fn start(app: &Router, key: &'static str, tasks: usize) -> Self {
        let load = Self {
            admitted: Arc::default(),
            denied: Arc::default(),
            other: Arc::default(),
            stop: Arc::default(),
        };
        for _ in 0..tasks {
            let app = app.clone();
            let (admitted, denied, other, stop) = (
                Arc::clone(&load.admitted),
                Arc::clone(&load.denied),
                Arc::clone(&load.other),
                Arc::clone(&load.stop),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let counter = match hello(&app, key).await {
                        StatusCode::OK => &admitted,
                        StatusCode::TOO_MANY_REQUESTS => &denied,
                        _ => &other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            });
        }
        load
    }

    fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    fn denied(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }

    /// Wait until `done` holds, up to 10 s (the patience, not a
    /// measurement), with every answer a 200 or a 429.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done(self) {
            assert!(
                std::time::Instant::now() < patience,
                "{what}: not within 10 s ({} admitted, {} denied)",
                self.admitted(),
                self.denied()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(
            self.other.load(Ordering::Relaxed),
            0,
            "answers but 200 and 429"
        );
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A tier's limit set through `/limits/set` while a key's requests run:
/// an upgrade lets the key in up to the new limit, its count kept (no
/// fresh budget); a downgrade denies it again, and a new key gets only the
/// new limit once the layer applies it.
async fn a_tier_set_under_load_takes_effect(app: Router) {
    let erin = Load::start(&app, "erin", 4);
    erin.until("the free tier's 5, then 20 denials", |l| {
        l.admitted() == 5 && l.denied() >= 20
    })
    .await;
    let (status, _, body) = admin_call(
        &app,
        "/limits/set",
        r#"{"layer":"api","tier":"free","rate":"12/min"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    erin.until("the upgrade to 12", |l| l.admitted() >= 12)
        .await;
    let denied = erin.denied();
    erin.until("50 more denials", |l| l.denied() >= denied + 50)
        .await;
    assert_eq!(erin.admitted(), 12, "the count is kept: 7 more, not 12");

    let (status, _, body) = admin_call(
        &app,
        "/limits/set",
        r#"{"layer":"api","tier":"free","rate":"3/min"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Once a request is decided under the new limit, every later one is.
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let request = Request::get("/api/hello")
            .header(admin::API_KEY, "probe")
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let policy = response.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        if policy.contains(";q=3;") {
            break;
        }
        assert!(
            std::time::Instant::now() < patience,
            "not applied within 10 s: {policy}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let frank = Load::start(&app, "frank", 4);
    frank.until("50 denials", |l| l.denied() >= 50).await;
    assert_eq!(frank.admitted(), 3, "a new key gets the lowered limit");
    let denied = erin.denied();
    erin.until("50 more denials", |l| l.denied() >= denied + 50)
        .await;
    assert_eq!(erin.admitted(), 12, "at 12 of a limit of 3: denied");

    let (status, _, body) = admin_call(&app, "/limits", r#"{"layer":"api"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tiers"]["free"], "3/1min", "{body}");
}

type Scenario = fn(Router) -> Pin<Box<dyn Future<Output = ()>>>;

fn scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        ("a_read_counts_nothing", |app| {
            Box::pin(a_read_counts_nothing(app))
        }),
        ("a_block_denies_and_an_unblock_lets_in", |app| {
            Box::pin(a_block_denies_and_an_unblock_lets_in(app))
        }),
        ("a_reset_opens_a_fresh_window", |app| {
            Box::pin(a_reset_opens_a_fresh_window(app))
        }),
        ("bad_input_is_a_problem_and_changes_nothing", |app| {
            Box::pin(bad_input_is_a_problem_and_changes_nothing(app))
        }),
        ("a_body_too_large_is_413", |app| {
            Box::pin(a_body_too_large_is_413(app))
        }),
        ("without_the_token_it_is_401", |app| {
            Box::pin(without_the_token_it_is_401(app))
        }),
        ("a_tier_set_under_load_takes_effect", |app| {
            Box::pin(a_tier_set_under_load_takes_effect(app))
        }),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A store that is gone: each operation is a 503 problem, never a hang or
/// a panic (each store call is bounded by the layer's timeout).
#[cfg(feature = "redis")]
fn a_store_that_fails_is_503() {
    let Some(mut server) = support::redis::RedisServer::start("a_store_that_fails_is_503") else {
        return;
    };
    runtime().block_on(async {
        let store = tower_pinned_window_redis::RedisBackend::connect(&server.url())
            .await
            .unwrap();
        let app = admin::app(store, TOKEN);
        assert_eq!(hello(&app, "frank").await, StatusCode::OK);
        server.stop();
        for (path, json) in [
            ("/read", r#"{"layer":"api","key":"frank"}"#),
            ("/reset", r#"{"layer":"api","key":"frank"}"#),
            ("/block", r#"{"layer":"api","key":"frank","seconds":60}"#),
            ("/unblock", r#"{"layer":"api","key":"frank"}"#),
        ] {
            let (status, content_type, body) = admin_call(&app, path, json).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
            assert_eq!(content_type, "application/problem+json", "{path}");
            assert!(
                body["type"]
                    .as_str()
                    .unwrap()
                    .ends_with("#problem-store-unavailable"),
                "{path}: {body}"
            );
            assert!(!body.to_string().contains("frank"), "{path}: {body}");
        }
    });
}

/// The example served over TCP, called by a real client: the token, a
/// block and an unblock, as a deployment sees them.
fn over_tcp() {
    runtime().block_on(async {
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;

        let app = admin::app(tower_pinned_window::backend::MemoryBackend::new(), TOKEN);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
        let hello = || {
            Request::get(format!("http://{addr}/api/hello"))
                .header(admin::API_KEY, "gina")
                .body(Body::empty())
                .unwrap()
        };
        let admin = |path: &str, token: &str, json: &str| {
            Request::post(format!("http://{addr}/admin/limits{path}"))
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(Body::from(json.to_owned()))
                .unwrap()
        };
        let block = r#"{"layer":"api","key":"gina","seconds":60}"#;
        assert_eq!(client.request(hello()).await.unwrap().status(), 200);
        let refused = client
            .request(admin("/block", "not-the-token", block))
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
        assert_eq!(
            client.request(hello()).await.unwrap().status(),
            200,
            "no block"
        );
        let blocked = client.request(admin("/block", TOKEN, block)).await.unwrap();
        assert_eq!(blocked.status(), 200);
        assert_eq!(client.request(hello()).await.unwrap().status(), 429);
        let unblock = r#"{"layer":"api","key":"gina"}"#;
        let unblocked = client
            .request(admin("/unblock", TOKEN, unblock))
            .await
            .unwrap();
        assert_eq!(unblocked.status(), 200);
        assert_eq!(client.request(hello()).await.unwrap().status(), 200);
    });
}

fn main() {
    let mut trials = vec![trial::trial("memory::over_tcp", Needs::Nothing, over_tcp)];
    #[cfg(feature = "redis")]
    trials.push(trial::trial(
        "redis::a_store_that_fails_is_503",
        Needs::Redis,
        a_store_that_fails_is_503,
    ));
    for (name, scenario) in scenarios() {
        trials.push(trial::trial(
            format!("memory::{name}"),
            Needs::Nothing,
            move || {
                let app = admin::app(tower_pinned_window::backend::MemoryBackend::new(), TOKEN);
                runtime().block_on(scenario(app));
            },
        ));
        #[cfg(feature = "redis")]
        trials.push(trial::trial(
            format!("redis::{name}"),
            Needs::Redis,
            move || {
                let Some(server) = support::redis::RedisServer::start(name) else {
                    return;
                };
                runtime().block_on(async {
                    let store = tower_pinned_window_redis::RedisBackend::connect(&server.url())
                        .await
                        .unwrap();
                    scenario(admin::app(store, TOKEN)).await;
                });
            },
        ));
        #[cfg(feature = "postgres")]
        trials.push(trial::trial(
            format!("postgres::{name}"),
            Needs::Postgres,
            move || {
                runtime().block_on(async {
                    let Some(schema) = support::postgres::TestSchema::create(name).await else {
                        return;
                    };
                    let store = schema.backend().await;
                    scenario(admin::app(store, TOKEN)).await;
                });
            },
        ));
    }
    trial::run(trials, ())
}
