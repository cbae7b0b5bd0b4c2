//! End to end over gRPC: a real tonic server on 127.0.0.1:0 and a real tonic
//! client; one layer for the whole server, or one per service
//! (examples/grpc_services.rs).

use std::time::Duration;

use tonic::Code;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower::Layer;
use tower_pinned_window::backend::{Backend, BackendError, Counter, Hit, Hits};
use tower_pinned_window::key::{ClientIp, Key, RouteKey};
use tower_pinned_window::{Quota, RateLimitLayer};

#[allow(dead_code)]
#[path = "../examples/grpc_services.rs"]
mod grpc_services;
use grpc_services::{Auth, call_auth, per_method, per_service};

async fn serve<L>(layer: L) -> (HealthClient<Channel>, tokio::task::JoinHandle<()>)
where
    L: tower::Layer<tonic::service::Routes> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let task = tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (HealthClient::new(channel), task)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn a_tonic_client_gets_resource_exhausted_with_a_retry_delay() {
    let layer = RateLimitLayer::new("grpc", Quota::new(3, Duration::from_secs(10)).unwrap())
        .key(ClientIp::new());
    let (mut client, task) = serve(layer).await;
    for remaining in [2, 1, 0] {
        let response = client.check(check()).await.unwrap();
        assert_eq!(
            response.metadata().get("ratelimit").unwrap(),
            format!("\"grpc\";r={remaining};t=10").as_str()
        );
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded");
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("a RetryInfo");
    assert!(
        delay > Duration::from_secs(9) && delay <= Duration::from_secs(10),
        "{delay:?}"
    );
    assert_eq!(status.metadata().get("retry-after").unwrap(), "10");
    assert_eq!(
        status.metadata().get("ratelimit").unwrap(),
        "\"grpc\";r=0;t=10"
    );
    task.abort();
}

#[tokio::test]
async fn one_layer_limits_grpc_methods_apart() {
    // Keyed by (client IP, method): the Check budget is not the Watch budget.
    let layer = RateLimitLayer::new("methods", Quota::new(1, Duration::from_secs(60)).unwrap())
        .key((ClientIp::new(), RouteKey::new()));
    let (mut client, task) = serve(layer).await;
    client.check(check()).await.unwrap();
    assert_eq!(
        client.check(check()).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let watch = client.watch(check()).await;
    assert!(
        watch.is_ok(),
        "another method has its own budget: {watch:?}"
    );
    task.abort();
}

/// A backend that is down or holds corrupt state, to see the gRPC codes.
#[derive(Clone, Debug)]
struct Failing(bool);

impl Backend for Failing {
    type Future = std::future::Ready<Result<Hits, BackendError>>;
    type Refund = std::future::Ready<Result<bool, BackendError>>;

    fn hit_all(&self, _: &Key, _: &[Counter<'_>]) -> Self::Future {
        std::future::ready(Err(if self.0 {
            BackendError::Corrupt {
                key: "k".into(),
                detail: "value abc".into(),
            }
        } else {
            BackendError::Unavailable("connection refused".into())
        }))
    }

    fn refund(&self, _: &str, _: &Key, _: &Hit) -> Self::Refund {
        std::future::ready(Ok(false))
    }

    async fn peek(&self, _: &str, _: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(None)
    }

    async fn reset(&self, _: &str, _: &Key) -> Result<bool, BackendError> {
        Ok(false)
    }
}

#[tokio::test]
async fn backend_failure_is_unavailable_and_corruption_is_internal() {
    for (corrupt, code) in [(false, Code::Unavailable), (true, Code::Internal)] {
        let layer = RateLimitLayer::new("fail", Quota::new(3, Duration::from_secs(10)).unwrap())
            .backend(Failing(corrupt));
        let (mut client, task) = serve(layer).await;
        assert_eq!(client.check(check()).await.unwrap_err().code(), code);
        task.abort();
    }
}

/// A tonic server with `routes` (each service behind its own layer) on
/// 127.0.0.1:0, and a channel to it.
async fn serve_routes(routes: Routes) -> (Channel, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        Server::builder()
            .add_routes(routes)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, task)
}

fn code<T>(result: Result<T, tonic::Status>) -> Code {
    result.map_or_else(|status| status.code(), |_| Code::Ok)
}

#[tokio::test]
async fn two_services_on_one_server_one_limited_per_service_one_per_method() {
    use tonic::server::NamedService;
    // The limited services keep their names, which is what tonic routes by.
    assert_eq!(
        <tower_pinned_window::RateLimit<
            Auth,
            (ClientIp, RouteKey),
            tower_pinned_window::backend::MemoryBackend,
            tower_pinned_window::response::DefaultDeny,
        > as NamedService>::NAME,
        "demo.Auth"
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let routes = Routes::new(per_service().layer(health)).add_service(per_method().layer(Auth));
    let (channel, task) = serve_routes(routes).await;
    let mut health = HealthClient::new(channel.clone());

    // Health: one budget for the whole service.
    for remaining in [2, 1, 0] {
        let response = health.check(check()).await.unwrap();
        assert_eq!(
            response.metadata().get("ratelimit").unwrap(),
            format!("\"health\";r={remaining};t=10").as_str()
        );
    }
    assert_eq!(code(health.check(check()).await), Code::ResourceExhausted);
    assert_eq!(
        code(health.watch(check()).await),
        Code::ResourceExhausted,
        "Watch shares Check's budget"
    );

    // demo.Auth: a budget per method, untouched by the health calls.
    for _ in 0..3 {
        let response = call_auth(channel.clone(), "Ping", "hi").await.unwrap();
        assert_eq!(response.get_ref(), "hi");
    }
    assert_eq!(
        code(call_auth(channel.clone(), "Ping", "hi").await),
        Code::ResourceExhausted
    );
    let login = call_auth(channel.clone(), "Login", "hunter2")
        .await
        .unwrap();
    assert_eq!(
        login.metadata().get("ratelimit").unwrap(),
        "\"auth\";r=2;t=10",
        "Login has its own budget"
    );
    assert_eq!(
        code(call_auth(channel.clone(), "Login", "guess").await),
        Code::Unauthenticated
    );
    task.abort();
}

#[tokio::test]
async fn failed_grpc_calls_count_and_successful_ones_are_refunded() {
    // A unary call that fails comes back trailers-only, its status in the
    // head; a successful one carries its status in the trailers.
    let failed_logins =
        RateLimitLayer::new("login", Quota::new(2, Duration::from_secs(60)).unwrap())
            .key(ClientIp::new())
            .count_if(|res| res.is_auth_failure());
    let (channel, task) = serve_routes(Routes::new(failed_logins.layer(Auth))).await;
    for _ in 0..5 {
        let response = call_auth(channel.clone(), "Login", "hunter2")
            .await
            .unwrap();
        assert_eq!(
            response.metadata().get("ratelimit").unwrap(),
            "\"login\";r=2;t=60",
            "a success is refunded"
        );
    }
    for _ in 0..2 {
        assert_eq!(
            code(call_auth(channel.clone(), "Login", "guess").await),
            Code::Unauthenticated
        );
    }
    let denied = call_auth(channel.clone(), "Login", "hunter2")
        .await
        .unwrap_err();
    assert_eq!(
        denied.code(),
        Code::ResourceExhausted,
        "two failures: even the right password waits"
    );
    assert_eq!(denied.metadata().get("retry-after").unwrap(), "60");
    task.abort();
}

#[tokio::test]
async fn a_charge_reads_the_grpc_status_in_the_trailers_when_the_stream_ends() {
    // A successful unary call ends with its status in the trailers, which
    // the charge reads once the body has ended: each success costs 2 of 5.
    // A failed call is trailers-only (its status in the head): no charge.
    let charged = RateLimitLayer::new("charged", Quota::new(5, Duration::from_secs(60)).unwrap())
        .key(ClientIp::new())
        .charge(|end| {
            let ok = end
                .trailers()
                .and_then(|trailers| trailers.get("grpc-status"))
                .is_some_and(|status| status == "0");
            if ok { 2 } else { 0 }
        });
    let (channel, task) = serve_routes(Routes::new(charged.layer(Auth))).await;
    assert_eq!(
        code(call_auth(channel.clone(), "Login", "guess").await),
        Code::Unauthenticated
    );
    for remaining in [5, 3, 1] {
        let response = call_auth(channel.clone(), "Ping", "hi").await.unwrap();
        assert_eq!(response.get_ref(), "hi");
        assert_eq!(
            response.metadata().get("ratelimit").unwrap(),
            format!("\"charged\";r={remaining};t=60").as_str(),
            "the failed call cost nothing; each success 2, once its trailers were sent"
        );
    }
    let denied = call_auth(channel.clone(), "Ping", "hi").await.unwrap_err();
    assert_eq!(
        denied.code(),
        Code::ResourceExhausted,
        "6 charged of 5: denied until the window ends"
    );
    task.abort();
}

/// The outbound layer around a tonic `Channel`: a generated client takes
/// it as it is; a call over the budget waits for the window, and one whose
/// `grpc-timeout` (set by `Request::set_timeout`) ends before the budget
/// returns fails at once, without reaching the server.
#[tokio::test]
async fn a_tonic_client_waits_for_its_outbound_budget() {
    use tokio::time::Instant;
    use tower_pinned_window::outbound::BudgetLayer;

    let routes = Routes::new(tonic_health::server::health_reporter().1);
    let (channel, server) = serve_routes(routes).await;
    let budget = BudgetLayer::new("health", Quota::new(1, Duration::from_millis(400)).unwrap());
    let mut client = HealthClient::new(tower::ServiceBuilder::new().layer(budget).service(channel));
    let started = Instant::now();
    client.check(check()).await.unwrap();
    let mut hurried = tonic::Request::new(check());
    hurried.set_timeout(Duration::from_millis(100));
    let status = client.check(hurried).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(350),
        "failed at once, not after the window (400 ms)"
    );
    assert!(status.message().contains("budget"), "{status:?}");
    client.check(check()).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(390),
        "the second call waited for the window: {:?}",
        started.elapsed()
    );
    server.abort();
}
