//! Two gRPC services on one tonic server, each behind a limit of its own,
//! added with `add_service(layer.layer(service))`:
//!
//! - the standard `grpc.health.v1.Health`, limited **per service**: 3 calls
//!   per 10 seconds per client IP, `Check` and `Watch` together;
//! - a small hand-written `demo.Auth`, limited **per method**: `Login` and
//!   `Ping` each get 3 calls per 10 seconds per client IP.
//!
//! ```text
//! cargo run --example grpc_services --features tonic            # serve on 127.0.0.1:$PORT (50051)
//! cargo run --example grpc_services --features tonic -- client  # call each method 4 times, print the codes
//! ```

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::Layer;
use tower_pinned_window::key::{ClientIp, RouteKey};
use tower_pinned_window::{Quota, RateLimitLayer};

/// The health service's limit: one budget per client IP for the whole
/// service.
pub fn per_service() -> RateLimitLayer<ClientIp> {
    RateLimitLayer::new("health", every_10_s(3)).key(ClientIp::new())
}

/// `demo.Auth`'s limit: one budget per client IP and method (the key pairs
/// the client with the gRPC method).
pub fn per_method() -> RateLimitLayer<(ClientIp, RouteKey)> {
    RateLimitLayer::new("auth", every_10_s(3)).key((ClientIp::new(), RouteKey::new()))
}

fn every_10_s(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(10)).expect("a valid quota")
}

/// `demo.Auth`: `Login(password) -> greeting`, UNAUTHENTICATED unless the
/// password is `hunter2`, and `Ping(text) -> text`. Messages are plain
/// strings (protobuf's `StringValue` encoding).
#[derive(Debug, Clone, Default)]
pub struct Auth;

impl NamedService for Auth {
    const NAME: &'static str = "demo.Auth";
}

struct Login;

impl UnaryService<String> for Login {
    type Response = String;
    type Future = Ready<Result<Response<String>, Status>>;

    fn call(&mut self, request: Request<String>) -> Self::Future {
        ready(if request.get_ref() == "hunter2" {
            Ok(Response::new("welcome".to_owned()))
        } else {
            Err(Status::unauthenticated("wrong password"))
        })
    }
}

struct Ping;

impl UnaryService<String> for Ping {
    type Response = String;
    type Future = Ready<Result<Response<String>, Status>>;

    fn call(&mut self, request: Request<String>) -> Self::Future {
        ready(Ok(Response::new(request.into_inner())))
    }
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for Auth {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut grpc = Grpc::new(ProstCodec::<String, String>::default());
        match request.uri().path() {
            "/demo.Auth/Login" => Box::pin(async move { Ok(grpc.unary(Login, request).await) }),
            "/demo.Auth/Ping" => Box::pin(async move { Ok(grpc.unary(Ping, request).await) }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Calls `/demo.Auth/<method>` with `message`.
pub async fn call_auth(
    channel: tonic::transport::Channel,
    method: &'static str,
    message: &str,
) -> Result<Response<String>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = match method {
        "Login" => http::uri::PathAndQuery::from_static("/demo.Auth/Login"),
        _ => http::uri::PathAndQuery::from_static("/demo.Auth/Ping"),
    };
    grpc.unary(
        Request::new(message.to_owned()),
        path,
        ProstCodec::<String, String>::default(),
    )
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse().map_err(|e| format!("PORT={port:?}: {e}"))?,
        Err(_) => 50051,
    };
    if std::env::args().nth(1).as_deref() == Some("client") {
        return client(port).await;
    }
    let (_reporter, health) = tonic_health::server::health_reporter();
    let addr = ([127, 0, 0, 1], port).into();
    println!("serving on {addr}:");
    println!("  grpc.health.v1.Health: 3 calls per 10 s per client IP, all methods together");
    println!("  demo.Auth: 3 calls per 10 s per client IP and method");
    println!("try: cargo run --example grpc_services --features tonic -- client");
    Server::builder()
        .add_service(per_service().layer(health))
        .add_service(per_method().layer(Auth))
        .serve(addr)
        .await?;
    Ok(())
}

async fn client(port: u16) -> Result<(), Box<dyn std::error::Error>> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    let code = |result: Result<(), Status>| match result {
        Ok(()) => "OK".to_owned(),
        Err(status) => format!("{:?}", status.code()),
    };
    let mut health = HealthClient::new(channel.clone());
    let check = HealthCheckRequest {
        service: String::new(),
    };
    for call in 1..=4 {
        let result = health.check(check.clone()).await.map(drop);
        println!("Health/Check #{call}: {}", code(result));
    }
    let watch = health.watch(check).await.map(drop);
    println!(
        "Health/Watch #1: {} (the health budget is shared)",
        code(watch)
    );
    for call in 1..=4 {
        let result = call_auth(channel.clone(), "Ping", "hello").await.map(drop);
        println!("Auth/Ping #{call}: {}", code(result));
    }
    for (call, password) in ["hunter2", "guess", "guess", "hunter2"]
        .into_iter()
        .enumerate()
    {
        let result = call_auth(channel.clone(), "Login", password)
            .await
            .map(drop);
        println!("Auth/Login #{} ({password}): {}", call + 1, code(result));
    }
    Ok(())
}
