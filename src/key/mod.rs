//! Which counter a request is charged to.
//!
//! A [`KeyExtractor`] reads a [`Key`] from each request's
//! [`RequestHead`] (the request without its body). Built-ins: `()`, the
//! default (keyed by nothing: one counter for everyone), a header's [`HeaderName`] (its value, such as
//! an API key, or a gRPC metadata value: `HeaderName::from_static("x-api-key")`),
//! [`ClientIp`] (the connection's peer
//! address, or the client's address through the proxies you trust), and
//! [`RouteKey`] (axum's matched route, or the gRPC method). A
//! tuple of extractors keys by all of them (client IP and route, say). Any
//! `Fn(&RequestHead<'_>) -> Result<Key, KeyError>` is an extractor too; give
//! a closure to [`RateLimitLayer::key_fn`](crate::RateLimitLayer::key_fn) and
//! its argument's type is inferred.
//!
//! An [`Allowlist`] picks clients by address, found the way [`ClientIp`]
//! finds them, to bypass the limiter
//! ([`RateLimitLayer::allowlist`](crate::RateLimitLayer::allowlist)).
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tower::{Layer, ServiceExt, service_fn};
//! use tower_pinned_window::key::{Key, KeyError};
//! use tower_pinned_window::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Charge each tenant, named in the path's first segment.
//! let layer = RateLimitLayer::new("tenants", Quota::new(1, Duration::from_secs(60)).unwrap())
//!     .key_fn(|req| {
//!         let segment = req.uri().path().split('/').nth(1).unwrap_or_default();
//!         if segment.is_empty() {
//!             return Err(KeyError::missing("tenant path segment"));
//!         }
//!         Ok(Key::new(segment))
//!     });
//! let svc = layer.layer(service_fn(|_req: Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//! let get = |path: &str| Request::get(path).body(String::new()).unwrap();
//! assert_eq!(svc.clone().oneshot(get("/acme/orders")).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(svc.clone().oneshot(get("/acme/users")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(svc.clone().oneshot(get("/globex/orders")).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(svc.oneshot(get("/")).await.unwrap().status(), StatusCode::BAD_REQUEST);
//! # }
//! ```

mod allowlist;
mod client_ip;
mod forwarded;
mod ip;

pub use allowlist::Allowlist;
pub use client_ip::ClientIp;

/// The request as extractors read it, re-exported here where keys are
/// made from it.
pub use crate::request::RequestHead;

use std::fmt;
use std::hash::{Hash, Hasher};

use http::StatusCode;
use http::header::HeaderName;
use sha2::{Digest, Sha256};

/// The longest key stored as it is, in bytes. A longer key is replaced by
/// its digest: `#` followed by the 64 hex digits of its SHA-256, which is
/// [`HASHED_KEY_LEN`] bytes, so that no client can make a store hold large
/// keys.
pub const MAX_KEY_LEN: usize = 64;

/// The length of a hashed key: one byte more than [`MAX_KEY_LEN`], so a
/// hashed key is never equal to a key kept as it is, whatever its bytes (a
/// 65-byte key is always hashed). Two keys are equal exactly when their bytes
/// are, in every backend and inside a pair of keys.
pub const HASHED_KEY_LEN: usize = 1 + 2 * DIGEST_BYTES;

/// Bytes of the SHA-256 digest a hashed key spells out in hex (all of it).
pub(crate) const DIGEST_BYTES: usize = 32;

/// The first byte of a hashed long key.
pub(crate) const HASHED_KEY_MARK: u8 = b'#';

/// The first byte of a private key's keyed digest
/// ([`PrivateKeys`](crate::backend::PrivateKeys)).
pub(crate) const PRIVATE_KEY_MARK: u8 = b'@';

/// A client's key: at most [`MAX_KEY_LEN`] bytes as given, or the
/// [`HASHED_KEY_LEN`]-byte digest of a longer one; held inline (no heap).
///
/// Keys are opaque bytes; they need not be UTF-8. A key longer than
/// [`MAX_KEY_LEN`] is hashed on construction, so it is bounded whatever the
/// client sends. The hashed form is longer than any key kept as it is, so a
/// client cannot send the text of another key's digest and meet its counter.
///
/// ```
/// use tower_pinned_window::key::{HASHED_KEY_LEN, Key, MAX_KEY_LEN};
///
/// let long = Key::new([b'a'; MAX_KEY_LEN + 1]);
/// assert!(long.is_hashed());
/// assert_eq!(long.as_bytes().len(), HASHED_KEY_LEN);
/// // The digest's own text is too long to be kept, so it is hashed again:
/// // it never names the long key's counter.
/// assert_ne!(Key::new(long.as_bytes()), long);
/// ```
#[derive(Clone)]
pub struct Key {
    len: u8,
    bytes: [u8; HASHED_KEY_LEN],
}

impl Key {
    /// A key from any bytes; longer than [`MAX_KEY_LEN`] bytes, it is hashed.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        let bytes = bytes.as_ref();
        if bytes.len() <= MAX_KEY_LEN {
            let mut key = Self::empty();
            key.bytes[..bytes.len()].copy_from_slice(bytes);
            key.len = bytes.len() as u8;
            key
        } else {
            Self::hashed(bytes)
        }
    }

    /// The key written by `value`'s [`Display`](fmt::Display), without a heap
    /// allocation: always equal to `Key::new(value.to_string())`, hashed if
    /// it runs past [`MAX_KEY_LEN`] bytes.
    pub fn display(value: impl fmt::Display) -> Self {
        let mut writer = InlineWriter {
            key: Self::empty(),
            hasher: None,
        };
        fmt::write(&mut writer, format_args!("{value}")).expect("writing to a key does not fail");
        match writer.hasher {
            None => writer.key,
            Some(hasher) => Self::from_digest(hasher),
        }
    }

    /// Two keys as one, for keying by both: `first`'s length in decimal, `:`,
    /// `first`, then `second`. The length makes the split unambiguous, so
    /// distinct pairs give distinct keys (hashed parts included: a part's
    /// bytes identify it).
    pub(crate) fn join(first: &Key, second: &Key) -> Key {
        let mut joined = [0u8; 3 + 1 + 2 * HASHED_KEY_LEN];
        let mut len = itoa::Buffer::new();
        let len = len.format(first.as_bytes().len()).as_bytes();
        let mut at = 0;
        for part in [len, b":", first.as_bytes(), second.as_bytes()] {
            joined[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Key::new(&joined[..at])
    }

    fn empty() -> Self {
        Self {
            len: 0,
            bytes: [0; HASHED_KEY_LEN],
        }
    }

    fn hashed(bytes: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(bytes);
        Self::from_digest(hasher)
    }

    fn from_digest(hasher: Sha256) -> Self {
        Self::marked(HASHED_KEY_MARK, &hasher.finalize().into())
    }

    /// A digest as a key: `mark`, then the digest's 64 lowercase hex digits
    /// ([`HASHED_KEY_LEN`] bytes, longer than any key kept as it is). The
    /// mark tells a hashed long key (`#`) from a private key's keyed digest
    /// (`@`, see [`PrivateKeys`](crate::backend::PrivateKeys)).
    pub(crate) fn marked(mark: u8, digest: &[u8; DIGEST_BYTES]) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut key = Self::empty();
        key.bytes[0] = mark;
        for (i, byte) in digest.iter().enumerate() {
            key.bytes[1 + 2 * i] = HEX[usize::from(byte >> 4)];
            key.bytes[2 + 2 * i] = HEX[usize::from(byte & 0xf)];
        }
        key.len = HASHED_KEY_LEN as u8;
        key
    }

    /// The key's bytes: as given, or for a hashed key `#` and 64 hex digits
    /// ([`HASHED_KEY_LEN`] bytes).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The key's bytes, then zeros to [`HASHED_KEY_LEN`]: every constructor
    /// starts from zeros and writes only up to the key's length, so a
    /// caller may copy a fixed-size prefix without reading the length first.
    #[inline(always)]
    pub(crate) fn padded(&self) -> &[u8; HASHED_KEY_LEN] {
        &self.bytes
    }

    /// Whether the key is held as a digest, [`HASHED_KEY_LEN`] bytes long:
    /// a key longer than [`MAX_KEY_LEN`] (`#` and its SHA-256), or a key
    /// [`PrivateKeys`](crate::backend::PrivateKeys) replaced by its keyed
    /// digest (`@` and its HMAC-SHA256).
    pub fn is_hashed(&self) -> bool {
        usize::from(self.len) > MAX_KEY_LEN
    }
}

struct InlineWriter {
    key: Key,
    hasher: Option<Sha256>,
}

impl fmt::Write for InlineWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if let Some(hasher) = &mut self.hasher {
            hasher.update(s.as_bytes());
            return Ok(());
        }
        let start = usize::from(self.key.len);
        let end = start + s.len();
        if end <= MAX_KEY_LEN {
            self.key.bytes[start..end].copy_from_slice(s.as_bytes());
            self.key.len = end as u8;
        } else {
            let mut hasher = Sha256::new();
            hasher.update(self.key.as_bytes());
            hasher.update(s.as_bytes());
            self.hasher = Some(hasher);
        }
        Ok(())
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(\"{}\")", self.as_bytes().escape_ascii())
    }
}

/// Shows the key with non-printable bytes escaped, safe for a log line.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_bytes().escape_ascii())
    }
}

/// Why no key could be read from a request.
///
/// ```
/// use http::StatusCode;
/// use tower_pinned_window::key::KeyError;
///
/// let err = KeyError::missing("the x-tenant header");
/// assert_eq!(err.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(err.to_string(), "rate-limit key missing: the x-tenant header");
/// assert_eq!(KeyError::invalid("a tenant id").status(), StatusCode::BAD_REQUEST);
/// ```
///
/// An extractor returns it from a closure, as in [the module's
/// example](self).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request lacks what the key is read from (a header, say): the
    /// client's fault, answered with 400 when missing keys are rejected.
    Missing(&'static str),
    /// What the key is read from is present but unusable: answered with 400.
    Invalid(&'static str),
    /// The server is not set up for this extractor (for example axum's
    /// `ConnectInfo` was never installed): answered with 500.
    Misconfigured(&'static str),
}

impl KeyError {
    /// The request lacks `what` (example: [`KeyError`]).
    pub const fn missing(what: &'static str) -> Self {
        Self::Missing(what)
    }

    /// `what` is present but unusable (example: [`KeyError`]).
    pub const fn invalid(what: &'static str) -> Self {
        Self::Invalid(what)
    }

    /// The status a rejected request is answered with (example:
    /// [`KeyError`]).
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Missing(_) | Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::Misconfigured(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(what) => write!(f, "rate-limit key missing: {what}"),
            Self::Invalid(what) => write!(f, "rate-limit key invalid: {what}"),
            Self::Misconfigured(what) => {
                write!(f, "rate-limit key extractor misconfigured: {what}")
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// Reads the [`Key`] a request is charged to, from the request's head (it
/// never sees the body, so it works for any body type).
///
/// Implemented for closures `Fn(&RequestHead<'_>) -> Result<Key, KeyError>`.
/// Rust infers a closure's argument type only from a bound that names `Fn`
/// itself, so hand a closure to
/// [`RateLimitLayer::key_fn`](crate::RateLimitLayer::key_fn), or annotate
/// its argument (`|req: &RequestHead<'_>|`) for
/// [`key`](crate::RateLimitLayer::key).
///
/// A value that is no extractor is refused at compile time, with a message
/// that names [`key_fn`](crate::RateLimitLayer::key_fn) and the built-ins:
///
/// ```compile_fail
/// use std::time::Duration;
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// // A header's name as text is not an extractor: `HeaderName::from_static("x-api-key")` is.
/// let layer = RateLimitLayer::new("api", Quota::new(10, Duration::from_secs(60)).unwrap())
///     .key("x-api-key");
/// ```
///
/// Your own extractor, a type that reads a tenant header and falls back to
/// one shared key:
///
/// ```
/// use http::Request;
/// use tower_pinned_window::key::RequestHead;
/// use tower_pinned_window::key::{Key, KeyError, KeyExtractor};
///
/// struct TenantOrShared;
///
/// impl KeyExtractor for TenantOrShared {
///     fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
///         Ok(match request.headers().get("x-tenant") {
///             Some(tenant) => Key::new(tenant.as_bytes()),
///             None => Key::new("shared"),
///         })
///     }
/// }
///
/// let request = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// let key = TenantOrShared.extract(&RequestHead::new(&request)).unwrap();
/// assert_eq!(key, Key::new("acme"));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate-limit key extractor",
    label = "not a `KeyExtractor`",
    note = "pass a closure to `.key_fn(|req| ...)`: it infers the argument's type, which `.key(...)` cannot",
    note = "or use a built-in extractor (`HeaderName::from_static(\"x-api-key\")`, `ClientIp::new()`, `RouteKey::new()`, `()` for one budget), a tuple of two, or implement `KeyExtractor`"
)]
pub trait KeyExtractor {
    /// The request's key, or why there is none.
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Result<Key, KeyError>,
{
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        self(request)
    }
}

/// Keyed by nothing, the unit `()`: one key for every request, so the
/// whole service shares one budget. The layers' default; as a pair keys by
/// both of its parts, the empty tuple keys by none.
///
/// ```
/// use http::Request;
/// use tower_pinned_window::key::RequestHead;
/// use tower_pinned_window::key::KeyExtractor;
///
/// let alice = Request::get("/a").header("x-user", "alice").body(()).unwrap();
/// let bob = Request::get("/b").header("x-user", "bob").body(()).unwrap();
/// assert_eq!(
///     ().extract(&RequestHead::new(&alice)),
///     ().extract(&RequestHead::new(&bob)),
/// );
/// ```
impl KeyExtractor for () {
    #[inline]
    fn extract(&self, _request: &RequestHead<'_>) -> Result<Key, KeyError> {
        Ok(Key::new("*"))
    }
}

/// A header's name is an extractor: the request is charged to that
/// header's value (an API key, a user id, a tenant, a gRPC metadata value).
/// Give it as tower-http's header layers take it: a constant of
/// [`http::header`] (`AUTHORIZATION`), `HeaderName::from_static` on a
/// lowercase literal, or a parsed name (`"X-Api-Key".parse()`, which folds
/// upper case, as HTTP header names are case-insensitive).
///
/// A missing or empty header is [`KeyError::Missing`]. When the header is
/// repeated, the first value is used.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderName, Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
///     .key(HeaderName::from_static("x-api-key"))
///     .allow_missing_key(false);
/// let svc = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
/// }));
/// let with_key = |key: &str| {
///     Request::get("/").header("x-api-key", key).body(String::new()).unwrap()
/// };
/// assert_eq!(svc.clone().oneshot(with_key("alice")).await.unwrap().status(), StatusCode::OK);
/// assert_eq!(
///     svc.clone().oneshot(with_key("alice")).await.unwrap().status(),
///     StatusCode::TOO_MANY_REQUESTS,
/// );
/// assert_eq!(svc.clone().oneshot(with_key("bob")).await.unwrap().status(), StatusCode::OK);
/// let no_key = Request::get("/").body(String::new()).unwrap();
/// assert_eq!(svc.oneshot(no_key).await.unwrap().status(), StatusCode::BAD_REQUEST);
/// # }
/// ```
///
/// Each way of naming the header:
///
/// ```
/// use http::Request;
/// use http::header::{AUTHORIZATION, HeaderName};
/// use tower_pinned_window::key::{Key, KeyExtractor, RequestHead};
///
/// let request = Request::get("/")
///     .header("x-api-key", "k1")
///     .header(AUTHORIZATION, "Bearer t1")
///     .body(())
///     .unwrap();
/// let head = RequestHead::new(&request);
/// let parsed: HeaderName = "X-Api-Key".parse().unwrap();
/// for by_api_key in [parsed, HeaderName::from_static("x-api-key")] {
///     assert_eq!(by_api_key.extract(&head), Ok(Key::new("k1")));
/// }
/// assert_eq!(AUTHORIZATION.extract(&head), Ok(Key::new("Bearer t1")));
/// // Not a header name: refused where the name is made.
/// assert!("x api key".parse::<HeaderName>().is_err());
/// ```
impl KeyExtractor for HeaderName {
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        match request.headers().get(self) {
            Some(value) if !value.is_empty() => Ok(Key::new(value.as_bytes())),
            _ => Err(KeyError::Missing("the configured key header")),
        }
    }
}

/// The route a request matched, as [`RequestHead::route`] reads it: axum's
/// `MatchedPath` (`/users/{id}`, never the raw path, which the client
/// chooses), or for a gRPC request its method (`/package.Service/Method`).
/// Combine it with a client key to limit each client per route:
/// `(ClientIp::new(), RouteKey::new())`.
///
/// axum sets `MatchedPath` for layers added with `route_layer` or on a route;
/// elsewhere a plain HTTP request has no route and is [`KeyError::Missing`].
///
/// A gRPC method is the path the client sent, checked by tonic only after
/// the limiter: each made-up method makes a counter of its own (bounded by
/// the store's capacity and the window). Where a flood of made-up methods
/// matters, key by client alone.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::key::RouteKey;
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::new("routes", Quota::new(1, Duration::from_secs(60)).unwrap())
///     .key(RouteKey::new());
/// let app = Router::new()
///     .route("/users/{id}", get(|| async { "user" }))
///     .route("/orders", get(|| async { "orders" }))
///     .route_layer(layer);
/// let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
/// assert_eq!(app.clone().oneshot(get("/users/1")).await.unwrap().status(), StatusCode::OK);
/// // The same route, `/users/{id}`, whatever the id: its budget is spent.
/// assert_eq!(
///     app.clone().oneshot(get("/users/2")).await.unwrap().status(),
///     StatusCode::TOO_MANY_REQUESTS,
/// );
/// assert_eq!(app.oneshot(get("/orders")).await.unwrap().status(), StatusCode::OK);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use]
pub struct RouteKey;

impl RouteKey {
    /// Key by route (example: [`RouteKey`]).
    pub fn new() -> Self {
        Self
    }
}

impl KeyExtractor for RouteKey {
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        request.route().map(Key::new).ok_or(KeyError::Missing(
            "a matched route (add the layer with route_layer)",
        ))
    }
}

/// Both keys: the request is charged to the pair, so `(client, route)` gives
/// each client its own budget on each route. The parts are joined
/// unambiguously (the first is length-prefixed), so no two pairs share a key,
/// hashed parts included.
impl<A, C> KeyExtractor for (A, C)
where
    A: KeyExtractor,
    C: KeyExtractor,
{
    fn extract(&self, request: &RequestHead<'_>) -> Result<Key, KeyError> {
        let first = self.0.extract(request)?;
        let second = self.1.extract(request)?;
        Ok(Key::join(&first, &second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    /// `extractor`'s answer for `request`.
    fn extract(extractor: &impl KeyExtractor, request: &Request<()>) -> Result<Key, KeyError> {
        extractor.extract(&RequestHead::new(request))
    }

    #[test]
    fn pairs_of_keys_never_collide() {
        let pair = |a: &'static str, b: &'static str| {
            let a = move |_: &RequestHead<'_>| Ok(Key::new(a));
            let b = move |_: &RequestHead<'_>| Ok(Key::new(b));
            extract(&(a, b), &Request::new(())).unwrap()
        };
        assert_eq!(pair("1.2.3.4", "/login"), Key::new("7:1.2.3.4/login"));
        assert_ne!(pair("a:b", "c"), pair("a", ":bc"));
        assert_ne!(pair("ab", "c"), pair("a", "bc"));
        let missing = ((), HeaderName::from_static("x-k"));
        assert!(matches!(
            extract(&missing, &Request::new(())),
            Err(KeyError::Missing(_))
        ));
    }

    #[test]
    fn routes_are_grpc_methods_or_matched_paths_never_raw_paths() {
        let grpc = Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        assert_eq!(
            extract(&RouteKey, &grpc),
            Ok(Key::new("/grpc.health.v1.Health/Check"))
        );
        let raw = Request::get("/users/12345").body(()).unwrap();
        assert!(
            matches!(extract(&RouteKey, &raw), Err(KeyError::Missing(_))),
            "the raw path is the client's choice"
        );
    }

    #[test]
    fn keys_are_bounded() {
        let cases: &[(&str, Vec<u8>, usize)] = &[
            ("empty", vec![], 0),
            ("short", b"203.0.113.7".to_vec(), 11),
            ("one under", vec![b'a'; MAX_KEY_LEN - 1], MAX_KEY_LEN - 1),
            ("at the bound", vec![b'a'; MAX_KEY_LEN], MAX_KEY_LEN),
            ("one past", vec![b'a'; MAX_KEY_LEN + 1], HASHED_KEY_LEN),
            ("huge", vec![b'z'; 1 << 20], HASHED_KEY_LEN),
            ("binary", vec![0, 255, 10, 13], 4),
        ];
        for (name, input, len) in cases {
            let key = Key::new(input);
            assert_eq!(key.as_bytes().len(), *len, "{name}");
            assert_eq!(key.is_hashed(), input.len() > MAX_KEY_LEN, "{name}");
            if input.len() > MAX_KEY_LEN {
                assert_eq!(key.as_bytes()[0], b'#', "{name}");
            } else {
                assert_eq!(key.as_bytes(), &input[..], "{name}");
            }
        }
        assert_ne!(
            Key::new(vec![b'a'; 100]),
            Key::new(vec![b'b'; 100]),
            "distinct long keys hash apart"
        );
    }

    #[test]
    fn hashed_keys_never_equal_raw_keys() {
        let long = Key::new([b'x'; 100]);
        let text = long.as_bytes().to_vec();
        // The digest's text, sent as a key, is too long to be kept: it is
        // hashed in turn and never names the long key's counter.
        assert_eq!(text.len(), HASHED_KEY_LEN);
        assert_ne!(Key::new(&text), long);
        // Every shorter prefix of it is a raw key, also distinct.
        for end in 0..=MAX_KEY_LEN {
            let raw = Key::new(&text[..end]);
            assert!(!raw.is_hashed(), "{end}");
            assert_ne!(raw, long, "{end}");
        }
        // What a pre-1.0 version stored for long keys (`#` + 48 hex digits)
        // is an ordinary raw key now.
        assert!(!Key::new(&text[..49]).is_hashed());
    }

    #[test]
    fn pairs_stay_distinct_with_hashed_parts() {
        let long = Key::new([b'l'; 70]);
        let other = Key::new([b'm'; 70]);
        let raw = Key::new(&long.as_bytes()[..MAX_KEY_LEN]);
        let pairs = [
            (long.clone(), Key::new("r")),
            (raw.clone(), Key::new("r")),
            (Key::new("r"), long.clone()),
            (Key::new("r"), other.clone()),
            (long.clone(), other.clone()),
            (other.clone(), long.clone()),
            (long.clone(), Key::new("")),
            (Key::new(""), long.clone()),
        ];
        for (i, (a, b)) in pairs.iter().enumerate() {
            for (j, (c, d)) in pairs.iter().enumerate() {
                assert_eq!(Key::join(a, b) == Key::join(c, d), i == j, "{i} vs {j}");
            }
        }
        // Two hashed parts are 134 bytes joined: within the join's buffer.
        assert!(Key::join(&long, &other).is_hashed());
    }

    #[test]
    fn display_agrees_with_new_at_every_length_threshold() {
        for len in [0, 1, MAX_KEY_LEN - 1, MAX_KEY_LEN, MAX_KEY_LEN + 1, 200] {
            let text = "d".repeat(len);
            assert_eq!(Key::display(&text), Key::new(&text), "{len} in one write");
            // The same text arriving in several writes.
            let (a, b) = text.split_at(len / 2);
            assert_eq!(
                Key::display(format_args!("{a}{b}")),
                Key::new(&text),
                "{len} in two writes"
            );
        }
    }

    #[test]
    fn display_keys_match_byte_keys() {
        let ip: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(Key::display(ip), Key::new("2001:db8::1"));
        let long = "x".repeat(200);
        assert_eq!(
            Key::display(&long),
            Key::new(&long),
            "long keys hash the same either way"
        );
        assert_eq!(
            Key::display(format_args!("{}{}", "a".repeat(40), "b".repeat(40))),
            Key::new(format!("{}{}", "a".repeat(40), "b".repeat(40)))
        );
    }

    #[test]
    fn a_header_name_is_made_from_a_constant_or_its_text() {
        let request = Request::get("/")
            .header("x-api-key", "k1")
            .body(())
            .unwrap();
        let parse = |text: &str| text.parse::<HeaderName>().unwrap();
        let valid = [
            ("a HeaderName", HeaderName::from_static("x-api-key")),
            ("lower-case text", parse("x-api-key")),
            ("mixed-case text", parse("X-Api-Key")),
            (
                "a String",
                HeaderName::try_from(String::from("x-api-key")).unwrap(),
            ),
            ("bytes", HeaderName::from_bytes(b"x-api-key").unwrap()),
        ];
        for (case, extractor) in valid {
            assert_eq!(extract(&extractor, &request), Ok(Key::new("k1")), "{case}");
        }
        // A bad name is refused where it is made (and by the
        // configuration, with `ConfigError::InvalidHeaderName`: its tests).
        for bad in ["", "x api key", "x-api-key:", "caf\u{e9}", "x\napi"] {
            assert!(HeaderName::from_bytes(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_header_key_rejects_missing_and_empty() {
        let extractor = HeaderName::from_static("x-api-key");
        let cases = [
            (
                "missing",
                Request::get("/").body(()).unwrap(),
                Err(KeyError::Missing("the configured key header")),
            ),
            (
                "empty",
                Request::get("/").header("x-api-key", "").body(()).unwrap(),
                Err(KeyError::Missing("the configured key header")),
            ),
            (
                "present",
                Request::get("/")
                    .header("x-api-key", "k1")
                    .body(())
                    .unwrap(),
                Ok(Key::new("k1")),
            ),
            (
                "opaque bytes",
                Request::get("/")
                    .header(
                        "x-api-key",
                        http::HeaderValue::from_bytes(b"\xffz").unwrap(),
                    )
                    .body(())
                    .unwrap(),
                Ok(Key::new(b"\xffz")),
            ),
        ];
        for (name, req, want) in cases {
            assert_eq!(extract(&extractor, &req), want, "{name}");
        }
    }
}
