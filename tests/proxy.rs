//! Client identity end to end: a real axum server on 127.0.0.1:0 that trusts
//! the "proxy" at 127.0.0.1, and real clients bound to 127.0.0.1 (the proxy)
//! or 127.0.0.2 (an untrusted client).

mod support;

use std::time::Duration;

use axum::{Router, routing::get};
use http::StatusCode;
use support::http::{Client, serve};
use tower_pinned_window::key::{ClientIp, RouteKey};
use tower_pinned_window::{Quota, RateLimitLayer};

fn behind_proxy(limit: u64) -> Router {
    let client_ip = ClientIp::new().trust("127.0.0.1/32").unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/other", get(|| async { "other" }))
        .route_layer(
            RateLimitLayer::new("proxy", Quota::new(limit, Duration::from_secs(60)).unwrap())
                .key(client_ip),
        )
}

fn from(ip: &str) -> Client {
    Client::from_ip(ip)
}

async fn fetch(client: &Client, url: &str, xff: Option<&str>) -> StatusCode {
    let mut request = client.get(url);
    if let Some(xff) = xff {
        request = request.header("x-forwarded-for", xff);
    }
    request.send().await.unwrap().status()
}

#[tokio::test]
async fn an_untrusted_peer_can_neither_escape_nor_frame_anyone() {
    let server = serve(behind_proxy(2)).await;
    let attacker = from("127.0.0.2");
    let proxy = from("127.0.0.1");
    // The attacker forges a new X-Forwarded-For on every request.
    let forged = [
        "203.0.113.50",
        "198.51.100.1",
        "10.0.0.1",
        "127.0.0.1",
        "::1",
        "garbage",
        "",
        "1.1.1.1, 2.2.2.2",
    ];
    let mut statuses = Vec::new();
    for xff in forged {
        statuses.push(fetch(&attacker, &server.url, Some(xff)).await);
    }
    assert_eq!(&statuses[..2], [StatusCode::OK, StatusCode::OK]);
    assert!(
        statuses[2..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "forgeries do not escape: {statuses:?}"
    );
    // The address the attacker named is not locked out: its budget is untouched.
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.50")).await,
        StatusCode::OK
    );
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.50")).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn clients_behind_one_trusted_proxy_get_separate_budgets() {
    let server = serve(behind_proxy(1)).await;
    let proxy = from("127.0.0.1");
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.1")).await,
        StatusCode::OK
    );
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.2")).await,
        StatusCode::OK,
        "a second client"
    );
    // A client that forged an entry before reaching the proxy is still itself.
    assert_eq!(
        fetch(&proxy, &server.url, Some("9.9.9.9, 203.0.113.3")).await,
        StatusCode::OK
    );
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.2, 203.0.113.3")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A proxy that forwards garbage where the client should be gets a 400, not a shared bucket.
    assert_eq!(
        fetch(&proxy, &server.url, Some("203.0.113.4, junk")).await,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn addresses_rotating_inside_one_slash_64_share_a_budget() {
    let server = serve(behind_proxy(3)).await;
    let proxy = from("127.0.0.1");
    let rotating = [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "2001:db8:1:2:ffff::9",
        "2001:db8:1:2:abcd::1",
    ];
    let mut statuses = Vec::new();
    for ip in rotating {
        statuses.push(fetch(&proxy, &server.url, Some(ip)).await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        fetch(&proxy, &server.url, Some("2001:db8:1:3::1")).await,
        StatusCode::OK,
        "the next /64 is another client"
    );
    // IPv4-mapped forms of one address are one client.
    for (i, form) in [
        "::ffff:198.51.100.7",
        "198.51.100.7",
        "::ffff:c633:6407",
        "[::ffff:198.51.100.7]:9000",
    ]
    .iter()
    .enumerate()
    {
        let want = if i < 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(fetch(&proxy, &server.url, Some(form)).await, want, "{form}");
    }
}

#[tokio::test]
async fn per_client_and_per_route() {
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .route_layer(
            RateLimitLayer::new("per-route", Quota::new(1, Duration::from_secs(60)).unwrap())
                .key((ClientIp::new(), RouteKey::new())),
        );
    let server = serve(app).await;
    let one = from("127.0.0.1");
    let two = from("127.0.0.2");
    let a = format!("{}/a", server.url);
    let b = format!("{}/b", server.url);
    assert_eq!(fetch(&one, &a, None).await, StatusCode::OK);
    assert_eq!(fetch(&one, &a, None).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(fetch(&one, &b, None).await, StatusCode::OK, "another route");
    assert_eq!(
        fetch(&two, &a, None).await,
        StatusCode::OK,
        "another client"
    );
    let res = one
        .get(format!("{}/a?x=1", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the query string is not a new route"
    );
}
