//! A tonic server serving the standard gRPC Health service behind the
//! layer: 5 calls per 10 seconds per client IP. Over the limit, calls fail
//! with RESOURCE_EXHAUSTED and a `google.rpc.RetryInfo` telling the client
//! how long to wait.
//!
//! ```text
//! cargo run --example grpc --features tonic            # serve on 127.0.0.1:$PORT (50051)
//! cargo run --example grpc --features tonic -- client  # call it 7 times, print the statuses
//! ```

use std::time::Duration;

use tonic::transport::Server;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower_pinned_window::key::ClientIp;
use tower_pinned_window::{Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .map_or(Ok(50051), |p| p.parse())?;
    if std::env::args().nth(1).as_deref() == Some("client") {
        return client(port).await;
    }

    let (_reporter, health) = tonic_health::server::health_reporter();
    let limit =
        RateLimitLayer::new("grpc", Quota::new(5, Duration::from_secs(10))?).key(ClientIp::new());
    let addr = ([127, 0, 0, 1], port).into();
    println!("serving grpc.health.v1.Health on {addr}, 5 calls per 10 s per client IP");
    println!("try: cargo run --example grpc --features tonic -- client");
    Server::builder()
        .layer(limit)
        .add_service(health)
        .serve(addr)
        .await?;
    Ok(())
}

async fn client(port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    let mut health = HealthClient::new(channel);
    for call in 1..=7 {
        match health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
        {
            Ok(response) => {
                let ratelimit = response
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string();
                println!(
                    "call {call}: OK ({:?}), ratelimit: {ratelimit}",
                    response.into_inner().status()
                );
            }
            Err(status) => {
                let retry = status
                    .get_details_retry_info()
                    .and_then(|info| info.retry_delay);
                println!(
                    "call {call}: {:?} {:?}, retry delay: {retry:?}",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
