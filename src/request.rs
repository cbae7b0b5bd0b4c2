//! The way in: the body-free view of a request that key extractors and
//! quota pickers read, and the only place where the framework types a
//! request carries (axum's `MatchedPath` and `ConnectInfo`, tonic's
//! `TcpConnectInfo`) are read.

use std::fmt;
use std::net::SocketAddr;

use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use http::{Extensions, HeaderMap, Method, Request, Uri};

/// The parts of a request a limiter reads: everything but the body.
///
/// [Key extractors](crate::key::KeyExtractor) and
/// [`quota_by`](crate::RateLimitLayer::quota_by) see a request through it,
/// so they never depend on the body type.
///
/// ```
/// use http::Request;
/// use tower_pinned_window::key::RequestHead;
///
/// let request = Request::post("/auth.Auth/Login")
///     .header("content-type", "application/grpc")
///     .body(())
///     .unwrap();
/// let head = RequestHead::new(&request);
/// assert!(head.is_grpc());
/// assert_eq!(head.route(), Some("/auth.Auth/Login"));
/// assert_eq!(head.peer_addr(), None, "no server put a peer address in");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The view of `request` (example: [`RequestHead`]).
    #[inline]
    pub fn new<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The view of a request's `parts`, for a caller that has split the
    /// request already.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use http::{Method, Request};
    /// use tower_pinned_window::key::RequestHead;
    ///
    /// let mut request = Request::put("/items/7?dry-run").header("x-user", "alice").body(()).unwrap();
    /// request.extensions_mut().insert(SocketAddr::from(([192, 0, 2, 7], 443)));
    /// let (parts, ()) = request.into_parts();
    /// let head = RequestHead::from_parts(&parts);
    /// assert_eq!(head.method(), Method::PUT);
    /// assert_eq!(head.uri().path(), "/items/7");
    /// assert_eq!(head.headers()["x-user"], "alice");
    /// assert_eq!(head.peer_addr(), Some(SocketAddr::from(([192, 0, 2, 7], 443))));
    /// assert_eq!(head.extensions().len(), 1);
    /// assert!(!head.is_grpc());
    /// assert_eq!(head.route(), None, "not inside an axum route");
    /// ```
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The method (example: [`from_parts`](Self::from_parts)).
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI (example: [`from_parts`](Self::from_parts)).
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers (gRPC metadata included; example:
    /// [`from_parts`](Self::from_parts)).
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (what the server and earlier layers attached: your
    /// authentication's user, say; example: [`from_parts`](Self::from_parts)).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// Whether this is a gRPC call (`content-type: application/grpc*`;
    /// example: [`RequestHead`]).
    #[inline]
    pub fn is_grpc(&self) -> bool {
        is_grpc(self.headers)
    }

    /// The route the request matched: for a gRPC call its method
    /// (`/package.Service/Method`), otherwise axum's `MatchedPath`
    /// (`/users/{id}`, never the raw path, which the client chooses; feature
    /// `axum`). `None` for a plain HTTP request outside an axum route (axum
    /// sets `MatchedPath` for layers added with `route_layer` or on a route).
    ///
    /// A gRPC call's method comes first because tonic routes with axum: a
    /// layer around one service (`add_service(layer.layer(service))`) sees
    /// the service's wildcard (`/package.Service/{*rest}`) as its
    /// `MatchedPath`, the same for every method.
    ///
    /// Examples: [`RequestHead`] (a gRPC call), and
    /// [`RouteKey`](crate::key::RouteKey) (axum routes).
    pub fn route(&self) -> Option<&'a str> {
        if self.is_grpc() {
            return self.uri.path_and_query().map(PathAndQuery::path);
        }
        #[cfg(feature = "axum")]
        if let Some(path) = self.extensions.get::<axum::extract::MatchedPath>() {
            return Some(path.as_str());
        }
        None
    }

    /// [`route`](Self::route), owned: a reference-counted clone, never a copy
    /// of the text.
    #[inline]
    pub(crate) fn route_owned(&self) -> Option<Route> {
        if self.is_grpc() {
            return self
                .uri
                .path_and_query()
                .map(|path| Route(RouteInner::Method(path.clone())));
        }
        #[cfg(feature = "axum")]
        if let Some(path) = self.extensions.get::<axum::extract::MatchedPath>() {
            return Some(Route(RouteInner::Matched(path.clone())));
        }
        None
    }

    /// The connection's peer address, wherever the server put it: axum's
    /// `ConnectInfo<SocketAddr>` (feature `axum`; serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
    /// `TcpConnectInfo` (feature `tonic`), or a `SocketAddr` in the
    /// extensions (for a plain hyper server that puts it there). Example:
    /// [`from_parts`](Self::from_parts).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(*addr);
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = self
            .extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
        {
            return Some(addr);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

impl<'a, B> From<&'a Request<B>> for RequestHead<'a> {
    fn from(request: &'a Request<B>) -> Self {
        Self::new(request)
    }
}

/// Whether `headers` are a gRPC call's (`content-type: application/grpc*`).
#[inline]
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A request's route, held past the request: what
/// [`RequestHead::route`] reads, shared rather than copied.
#[derive(Clone)]
pub(crate) struct Route(RouteInner);

#[derive(Clone)]
enum RouteInner {
    #[cfg(feature = "axum")]
    Matched(axum::extract::MatchedPath),
    Method(PathAndQuery),
}

impl Route {
    pub(crate) fn as_str(&self) -> &str {
        match &self.0 {
            #[cfg(feature = "axum")]
            RouteInner::Matched(path) => path.as_str(),
            RouteInner::Method(path) => path.path(),
        }
    }
}

impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Route {}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(path: &str) -> Request<()> {
        Request::post(path)
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap()
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let cases = [
            ("grpc", "application/grpc", true),
            ("grpc+proto", "application/grpc+proto", true),
            ("grpc-web", "application/grpc-web", true),
            ("json", "application/json", false),
            ("none", "", false),
        ];
        for (name, content_type, want) in cases {
            let mut request = Request::new(());
            if !content_type.is_empty() {
                request
                    .headers_mut()
                    .insert(CONTENT_TYPE, content_type.parse().unwrap());
            }
            assert_eq!(RequestHead::new(&request).is_grpc(), want, "{name}");
        }
    }

    #[test]
    fn routes_are_grpc_methods_or_matched_paths_never_raw_paths() {
        let call = grpc("/grpc.health.v1.Health/Check?x=1");
        let head = RequestHead::new(&call);
        assert_eq!(head.route(), Some("/grpc.health.v1.Health/Check"));
        assert_eq!(
            head.route_owned().unwrap().as_str(),
            "/grpc.health.v1.Health/Check",
            "one rule, owned or borrowed"
        );
        let raw = Request::get("/users/12345").body(()).unwrap();
        assert_eq!(
            RequestHead::new(&raw).route(),
            None,
            "the raw path is the client's choice"
        );
        assert!(RequestHead::new(&raw).route_owned().is_none());
    }

    #[cfg(feature = "axum")]
    #[test]
    fn axum_matched_path_is_the_route() {
        // MatchedPath has no public constructor: let a router set it.
        use axum::{Router, extract::Request as AxumRequest, routing::get};
        use tower::ServiceExt;
        let app = Router::new().route(
            "/users/{id}",
            get(|request: AxumRequest| async move {
                let head = RequestHead::new(&request);
                format!(
                    "{:?} {:?}",
                    head.route(),
                    head.route_owned().map(|r| r.as_str().to_owned())
                )
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = runtime.block_on(async {
            let response = app
                .oneshot(
                    Request::get("/users/12345")
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap()
        });
        assert_eq!(
            body,
            "Some(\"/users/{id}\") Some(\"/users/{id}\")".as_bytes()
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn a_grpc_call_is_routed_by_its_method_inside_a_wildcard_route() {
        // tonic routes each service with an axum wildcard route.
        use axum::{Router, extract::Request as AxumRequest, routing::any};
        use tower::ServiceExt;
        let app = Router::new().route(
            "/pkg.Svc/{*rest}",
            any(|request: AxumRequest| async move {
                let head = RequestHead::new(&request);
                format!("{:?}", head.route_owned().map(|r| r.as_str().to_owned()))
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = runtime.block_on(async {
            let call = grpc("/pkg.Svc/Method").map(|()| axum::body::Body::empty());
            let response = app.oneshot(call).await.unwrap();
            axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap()
        });
        assert_eq!(body, "Some(\"/pkg.Svc/Method\")".as_bytes());
    }

    #[test]
    fn the_peer_address_from_each_source() {
        let addr: SocketAddr = "198.51.100.7:4711".parse().unwrap();
        let mut request = Request::new(());
        assert_eq!(RequestHead::new(&request).peer_addr(), None, "none");
        request.extensions_mut().insert(addr);
        assert_eq!(
            RequestHead::new(&request).peer_addr(),
            Some(addr),
            "a SocketAddr extension"
        );

        #[cfg(feature = "axum")]
        {
            let connect: SocketAddr = "203.0.113.9:80".parse().unwrap();
            let mut request = Request::new(());
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(connect));
            request.extensions_mut().insert(addr);
            assert_eq!(
                RequestHead::new(&request).peer_addr(),
                Some(connect),
                "axum's ConnectInfo first"
            );
        }

        #[cfg(feature = "tonic")]
        {
            let remote: SocketAddr = "[2001:db8::7]:50051".parse().unwrap();
            let mut request = Request::new(());
            request
                .extensions_mut()
                .insert(tonic::transport::server::TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some(remote),
                });
            assert_eq!(
                RequestHead::new(&request).peer_addr(),
                Some(remote),
                "tonic's TcpConnectInfo"
            );
            let mut request = Request::new(());
            request
                .extensions_mut()
                .insert(tonic::transport::server::TcpConnectInfo {
                    local_addr: None,
                    remote_addr: None,
                });
            request.extensions_mut().insert(addr);
            assert_eq!(
                RequestHead::new(&request).peer_addr(),
                Some(addr),
                "a TcpConnectInfo without a remote address falls through"
            );
        }
    }
}
