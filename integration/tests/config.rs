//! Limiters loaded from TOML: what they build, and the errors bad
//! configurations get.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::{Router, body::Body, routing::get};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_pinned_window::config::{LimiterConfig, Tier};
use tower_pinned_window::{ConfigError, Decision, Quota, outcome::WantDecision};

fn config(text: &str) -> LimiterConfig {
    toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn app(config: &LimiterConfig) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", get(|| async { "welcome" }))
        .route("/users/{id}", get(|| async { "user" }))
        .route_layer(config.layer())
}

/// A request to `path` from the peer `peer`, with `headers`.
fn request(path: &str, peer: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::get(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(Body::empty()).unwrap();
    let peer: SocketAddr = format!("{peer}:4000").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    // As an outer layer that reads the decision does: the response then
    // carries it.
    request.extensions_mut().insert(WantDecision);
    request
}

async fn call(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let policy = response
        .extensions()
        .get::<Decision>()
        .map(|d| d.policy().to_owned())
        .unwrap_or_default();
    (response.status(), policy)
}

#[tokio::test]
async fn a_whole_limiter_from_toml() {
    let limiter = config(
        r#"
        name = "api"
        quota = "2/min"
        key = { header = "x-api-key" }
        also = ["3 per 1h"]

        [routes]
        "/login" = { name = "login", quota = "1 per 15m" }
        "/users/{id}" = "5/10s"

        [tiers]
        pro = "100/min"
        partner = { name = "partner plan", quota = "50/min" }
        "#,
    );
    assert_eq!(limiter.name(), "api");
    assert_eq!(limiter.quota(), "2/min".parse::<Quota>().unwrap());
    let app = app(&limiter);
    let key = |k| request("/", "192.0.2.1", &[("x-api-key", k)]);

    assert_eq!(call(&app, key("a")).await, (StatusCode::OK, "api".into()));
    assert_eq!(call(&app, key("a")).await, (StatusCode::OK, "api".into()));
    assert_eq!(
        call(&app, key("a")).await,
        (StatusCode::TOO_MANY_REQUESTS, "api".into())
    );
    // Another key has its own budget: the key comes from the header.
    assert_eq!(call(&app, key("b")).await.0, StatusCode::OK);

    // The route's quota, under the name it was given.
    let login = |k| request("/login", "192.0.2.1", &[("x-api-key", k)]);
    assert_eq!(
        call(&app, login("c")).await,
        (StatusCode::OK, "login".into())
    );
    assert_eq!(
        call(&app, login("c")).await,
        (StatusCode::TOO_MANY_REQUESTS, "login".into())
    );
    let user = request("/users/7", "192.0.2.1", &[("x-api-key", "d")]);
    let response = app.clone().oneshot(user).await.unwrap();
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"api /users/{id}\";q=5;w=10, \"api 3/1h\";q=3;w=3600"
    );

    // `also` counts every request: key "e" has 3 an hour, whatever the tier.
    let tiered = |tier: &str| {
        let mut r = request("/", "192.0.2.1", &[("x-api-key", "e")]);
        r.extensions_mut().insert(Tier::new(tier));
        r
    };
    assert_eq!(
        call(&app, tiered("pro")).await,
        (StatusCode::OK, "api 3/1h".into())
    );
    assert_eq!(
        call(&app, tiered("partner")).await,
        (StatusCode::OK, "api 3/1h".into())
    );
    let response = app.clone().oneshot(tiered("pro")).await.unwrap();
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"pro\";q=100;w=60, \"api 3/1h\";q=3;w=3600"
    );
    assert_eq!(
        call(&app, tiered("pro")).await,
        (StatusCode::TOO_MANY_REQUESTS, "api 3/1h".into())
    );
    // A tier the configuration does not list gets the layer's quota.
    let response = app.clone().oneshot(tiered("gold")).await.unwrap();
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"api\";q=2;w=60, \"api 3/1h\";q=3;w=3600"
    );
    // A client header naming a tier changes nothing.
    let response = app
        .clone()
        .oneshot(request(
            "/",
            "192.0.2.1",
            &[("x-api-key", "f"), ("x-tier", "pro")],
        ))
        .await
        .unwrap();
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"api\";q=2;w=60, \"api 3/1h\";q=3;w=3600"
    );
    let partner = app.clone().oneshot({
        let mut r = request("/", "192.0.2.1", &[("x-api-key", "g")]);
        r.extensions_mut().insert(Tier::new("partner"));
        r
    });
    assert_eq!(
        partner.await.unwrap().headers()["ratelimit-policy"],
        "\"partner plan\";q=50;w=60, \"api 3/1h\";q=3;w=3600"
    );
}

#[tokio::test]
async fn client_ip_through_trusted_proxies_per_route() {
    let limiter = config(
        r#"
        name = "edge"
        quota = "1/min"
        per-route = true
        key = { client-ip = { trust = ["10.0.0.0/8", "loopback"], header = "x-forwarded-for", max-hops = 4 } }
        "#,
    );
    let app = app(&limiter);
    let via_proxy = |path, client| request(path, "10.0.0.1", &[("x-forwarded-for", client)]);
    assert_eq!(
        call(&app, via_proxy("/", "203.0.113.7")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, via_proxy("/", "203.0.113.7")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Per route: the same client has a budget on /login too.
    assert_eq!(
        call(&app, via_proxy("/login", "203.0.113.7")).await.0,
        StatusCode::OK
    );
    // Another client behind the same proxy.
    assert_eq!(
        call(&app, via_proxy("/", "203.0.113.8")).await.0,
        StatusCode::OK
    );
    // From an untrusted peer the header is ignored: the peer is the client.
    let direct = |client| request("/", "198.51.100.1", &[("x-forwarded-for", client)]);
    assert_eq!(call(&app, direct("1.1.1.1")).await.0, StatusCode::OK);
    assert_eq!(
        call(&app, direct("2.2.2.2")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn operational_switches() {
    let limiter = config(
        r#"
        name = "dry-run"
        quota = "1/min"
        key = "peer-ip"
        shadow = true
        on-missing-key = "allow"
        headers = "legacy"
        "#,
    );
    let app = app(&limiter);
    call(&app, request("/", "192.0.2.1", &[])).await;
    let over = app
        .clone()
        .oneshot(request("/", "192.0.2.1", &[]))
        .await
        .unwrap();
    assert_eq!(over.status(), StatusCode::OK, "shadow mode never denies");
    assert_eq!(
        {
            let d = over.extensions().get::<Decision>().unwrap();
            (d.passed(), d.over_limit())
        },
        (true, true),
        "shadowed"
    );
    assert_eq!(over.headers()["x-ratelimit-limit"], "1");
    // No peer address: the key is missing, and the request passes.
    let no_peer = Request::get("/").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(no_peer).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.extensions().get::<Decision>().is_none());

    // The defaults: fail closed, reject a missing key, IETF headers.
    let strict = app_default();
    let no_peer = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(
        strict.oneshot(no_peer).await.unwrap().status(),
        StatusCode::INTERNAL_SERVER_ERROR,
        "peer-ip without ConnectInfo is a server misconfiguration"
    );
}

fn app_default() -> Router {
    app(&config(
        r#"
        name = "strict"
        quota = "1/min"
        key = "peer-ip"
        "#,
    ))
}

#[test]
fn configurations_round_trip_through_toml() {
    let texts = [
        r#"
        name = "api"
        quota = "5 per 15m"
        "#,
        r#"
        name = "api"
        quota = "100/min"
        key = { client-ip = { trust = ["10.0.0.0/8", "private"], header = "forwarded", ipv6-prefix = 56, max-hops = 3 } }
        per-route = true
        also = ["10000/1d", { name = "burst", quota = "20/1s" }]
        shadow = true
        on-failure = "fail-open"
        on-missing-key = "allow"
        headers = "none"
        routes = { "/login" = { name = "login", quota = "5/15m" }, "/a" = "1/500ms" }
        tiers = { pro = "1000/min", partner = { name = "partner plan", quota = "50/min" } }
        "#,
        r#"
        name = "k"
        quota = "1/s"
        key = { header = "X-Api-Key" }
        "#,
        r#"
        name = "k"
        quota = "1/s"
        key = { peer-ip = { ipv6-prefix = 48 } }
        "#,
        r#"
        name = "k"
        quota = "1/s"
        key = "route"
        "#,
        r#"
        name = "k"
        quota = "100/min"
        on-failure = "insurance 1/4"
        "#,
    ];
    for text in texts {
        let parsed = config(text);
        let written = toml::to_string(&parsed).unwrap();
        let again: LimiterConfig = toml::from_str(&written)
            .unwrap_or_else(|e| panic!("{e}\nwritten:\n{written}\nfrom:\n{text}"));
        assert_eq!(again, parsed, "written:\n{written}");
    }
    let written = toml::to_string(&config(texts[0])).unwrap();
    assert!(written.contains("quota = \"5/15min\""), "{written}");
    assert!(written.contains("key = \"global\""), "{written}");
}

#[test]
fn json_works_too() {
    let limiter: LimiterConfig = serde_json::from_str(
        r#"{"name": "api", "quota": "10/s", "key": {"header": "x-api-key"}, "routes": {"/login": "1/min"}}"#,
    )
    .unwrap();
    assert_eq!(limiter.quota(), "10/1s".parse::<Quota>().unwrap());
}

/// A header key's name is checked as it is read: each bad name is
/// `ConfigError::InvalidHeaderName`, which names it.
#[test]
fn bad_header_names_are_refused_with_their_text() {
    for bad in ["", "x api key", "x-api-key:", "caf\u{e9}", "x\napi"] {
        let json = serde_json::json!({ "name": "api", "quota": "1/s", "key": { "header": bad } });
        let err = serde_json::from_value::<LimiterConfig>(json).unwrap_err();
        let want = ConfigError::InvalidHeaderName(bad.to_owned()).to_string();
        assert!(err.to_string().contains(&want), "{bad:?}: {err}");
    }
}

/// Each bad configuration is refused with an error naming the value and
/// what was wrong, and the line.
#[test]
fn bad_configurations_are_refused_clearly() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "zero limit",
            r#"quota = "0/min""#,
            &["\"0/min\"", "the limit is 0"],
        ),
        (
            "zero window",
            r#"quota = "10/0s""#,
            &["\"10/0s\"", "is zero"],
        ),
        (
            "negative",
            r#"quota = "-1/min""#,
            &["\"-1/min\"", "negative"],
        ),
        (
            "not a rate",
            r#"quota = "abc""#,
            &["\"abc\"", "no \"/\" or \" per \""],
        ),
        (
            "overflowing limit",
            r#"quota = "99999999999999999999/min""#,
            &["larger than 18446744073709551615"],
        ),
        (
            "overflowing window",
            r#"quota = "1/99999999999999999999d""#,
            &["longer than 36525d"],
        ),
        (
            "unknown unit",
            r#"quota = "10/5y""#,
            &["unknown unit \"y\""],
        ),
        (
            "a number for a rate",
            "quota = 100",
            &["expected a rate string such as \"100/min\""],
        ),
        (
            "bad also",
            "quota = \"1/s\"\nalso = [\"1/0s\"]",
            &["\"1/0s\"", "is zero"],
        ),
        (
            "bad route quota",
            "quota = \"1/s\"\nroutes = { \"/a\" = \"0/s\" }",
            &["the limit is 0"],
        ),
        (
            "bad policy name",
            "quota = \"1/s\"\nroutes = { \"/a\" = { name = \"\", quota = \"1/s\" } }",
            &["invalid policy name \"\""],
        ),
        (
            "bad tier name",
            "quota = \"1/s\"\ntiers = { \"é\" = \"1/s\" }",
            &["invalid policy name \"é\""],
        ),
        (
            "insurance without a share",
            "quota = \"1/s\"\non-failure = \"insurance\"",
            &["\"insurance\"", "\"insurance N/D\""],
        ),
        (
            "insurance above the whole",
            "quota = \"1/s\"\non-failure = \"insurance 5/4\"",
            &["not \"5/4\"", "at most 1"],
        ),
        (
            "unknown field",
            "qouta = \"1/s\"",
            &["unknown field `qouta`"],
        ),
        (
            "snake case",
            "quota = \"1/s\"\nper_route = true",
            &["unknown field `per_route`", "per-route"],
        ),
        (
            "unknown key kind",
            "quota = \"1/s\"\nkey = \"ip\"",
            &["unknown variant `ip`", "peer-ip"],
        ),
        (
            "header without a name",
            "quota = \"1/s\"\nkey = \"header\"",
            &["key = { header = \"x-api-key\" }"],
        ),
        (
            "bad header name",
            "quota = \"1/s\"\nkey = { header = \"x api key\" }",
            &["\"x api key\" is not a valid HTTP header name"],
        ),
        (
            "bad CIDR",
            "quota = \"1/s\"\nkey = { client-ip = { trust = [\"10.0.0.0/33\"] } }",
            &["\"10.0.0.0/33\" is neither a CIDR"],
        ),
        (
            "unknown forwarded header",
            "quota = \"1/s\"\nkey = { client-ip = { header = \"x-forwarded\" } }",
            &["unknown variant `x-forwarded`", "x-forwarded-for"],
        ),
        (
            "zero hops",
            "quota = \"1/s\"\nkey = { client-ip = { max-hops = 0 } }",
            &["the proxy-hop limit must be at least 1"],
        ),
        (
            "IPv6 prefix",
            "quota = \"1/s\"\nkey = { peer-ip = { ipv6-prefix = 16 } }",
            &["32 to 128 bits, not 16"],
        ),
        (
            "two key kinds",
            "quota = \"1/s\"\nkey = { header = \"x\", peer-ip = {} }",
            &["a key table names one kind"],
        ),
        (
            "an option on a kind without options",
            "quota = \"1/s\"\nkey = { route = {} }",
            &["takes no options"],
        ),
        (
            "unknown client-ip option",
            "quota = \"1/s\"\nkey = { client-ip = { trusted = [] } }",
            &["unknown field `trusted`"],
        ),
        (
            "failure policy",
            "quota = \"1/s\"\non-failure = \"open\"",
            &["\"open\"", "\"fail-open\""],
        ),
    ];
    for (case, body, wants) in cases {
        let text = format!("name = \"api\"\n{body}\n");
        let err = toml::from_str::<LimiterConfig>(&text)
            .map(|_| ())
            .expect_err(case)
            .to_string();
        for want in *wants {
            assert!(err.contains(want), "{case}: {want:?} not in:\n{err}");
        }
        assert!(err.contains("line "), "{case}: no line in:\n{err}");
    }

    for (case, text, want) in [
        (
            "bad name",
            "name = \"has space\"\nquota = \"1/s\"",
            "invalid limiter name \"has space\"",
        ),
        ("no quota", "name = \"api\"", "missing field `quota`"),
        ("no name", "quota = \"1/s\"", "missing field `name`"),
    ] {
        let err = toml::from_str::<LimiterConfig>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{case}: {want:?} not in:\n{err}");
    }
}
