//! HTTP helpers: a trivial inner service, requests from a named client,
//! a real axum server on 127.0.0.1:0, and a real HTTP client for it.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::{Service, service_fn};

/// Request and response bodies of the `service_fn` tests.
pub type Body = String;

/// A service that answers every request with 200 "ok".
pub fn ok_service()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new("ok".to_string())) })
}

/// A request from the client named in `x-client`.
pub fn from(client: &str) -> Request<Body> {
    Request::builder()
        .header("x-client", client)
        .body(String::new())
        .unwrap()
}

/// Key requests by `x-client`.
pub fn by_client() -> HeaderName {
    HeaderName::from_static("x-client")
}

/// An axum server on a free port of 127.0.0.1, with connect info, stopped
/// on drop.
pub struct Server {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(app: axum::Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Server { url, task }
}

/// A real HTTP/1.1 client (hyper-util's, with its connection pool) for the
/// end-to-end tests: `client.get(url).header(name, value).send().await`
/// answers the status, the headers and the whole body.
#[derive(Clone)]
pub struct Client(hyper_util::client::legacy::Client<HttpConnector, Empty<Bytes>>);

impl Client {
    /// A client on whatever address the system picks (127.0.0.1 for a
    /// server on 127.0.0.1).
    pub fn new() -> Self {
        Self::bound(None)
    }

    /// A client whose connections leave from `ip` ("127.0.0.2" is another
    /// client to a server on 127.0.0.1).
    pub fn from_ip(ip: &str) -> Self {
        Self::bound(Some(ip.parse::<IpAddr>().unwrap()))
    }

    fn bound(ip: Option<IpAddr>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_local_address(ip);
        Self(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector))
    }

    /// A GET of `url`, to add headers to and send.
    pub fn get(&self, url: impl AsRef<str>) -> Get {
        Get {
            client: self.clone(),
            request: Request::get(url.as_ref()),
        }
    }
}

/// A GET request being built: see [`Client::get`].
pub struct Get {
    client: Client,
    request: http::request::Builder,
}

impl Get {
    /// Adds a header (the name and value as `http::request::Builder` takes them).
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.request = self.request.header(name, value);
        self
    }

    /// Sends the request; the response, with its whole body read.
    pub async fn send(self) -> Result<Response<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
        let request = self.request.body(Empty::new())?;
        let (head, body) = self.client.0.request(request).await?.into_parts();
        Ok(Response::from_parts(head, body.collect().await?.to_bytes()))
    }
}

/// Send `hits` requests at once, each on its own task, round-robin over
/// `services` (several app servers); the statuses, in order.
pub async fn burst<S>(
    services: &[S],
    hits: usize,
    request: impl Fn() -> Request<Body>,
) -> Vec<http::StatusCode>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    use tower::ServiceExt;
    let tasks: Vec<_> = (0..hits)
        .map(|i| {
            let svc = services[i % services.len()].clone();
            let req = request();
            tokio::spawn(async move { svc.oneshot(req).await.unwrap().status() })
        })
        .collect();
    let mut statuses = Vec::with_capacity(hits);
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

/// How many of `statuses` are 200.
pub fn ok_count(statuses: &[http::StatusCode]) -> usize {
    statuses
        .iter()
        .filter(|s| **s == http::StatusCode::OK)
        .count()
}

/// A runtime with four worker threads, for tests of concurrency.
pub fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}
