//! [`OperatorService`]: the operator's calls as a tower `Service` answering
//! JSON, a thin shell over [`Operator`]'s methods.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Buf;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tower_service::Service;

use crate::backend::{Heeding, LimitScope, StoredLimits};
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::{Quota, Window};

use super::handle::{KeyState, MAX_LISTED, Operator};
use super::problem::Problem;

/// The largest request body read, in bytes: a request names a layer, a key
/// and a time.
pub const MAX_BODY: usize = 16 * 1024;

/// The longest key accepted, in bytes (after hex decoding): longer ones
/// are refused rather than hashed, since no extractor of this crate makes
/// one and a typo should not silently name another counter.
pub const MAX_KEY_BYTES: usize = 1024;

/// The operator's service: JSON in and out, errors as RFC 9457 problem
/// details. **Mount it only behind your own authentication**: it resets
/// and blocks any key. Made by [`Operator::service`].
///
/// Paths are read as the service sees them, so mount it with axum's
/// `nest_service("/admin/limits", ...)` (which strips the prefix):
///
/// | method and path | body | answer |
/// |---|---|---|
/// | `GET /` | | the layers, their counters' quotas, whether a block works |
/// | `GET /budgets` | | per outbound budget, its keys with calls waiting or closed in this process, as digests |
/// | `POST /read` | `{"layer", "key"}` | the key's counts, time left, lockout; counts nothing |
/// | `POST /reset` | `{"layer", "key"}` | `{"reset": true}` when a counter existed |
/// | `POST /block` | `{"layer", "key", "seconds"}` or `"until"` (Unix seconds) | `{"blocked_for_ms"}` |
/// | `POST /unblock` | `{"layer", "key"}` | `{"unblocked": true}` when anything existed (a reset) |
///
/// A key is `"key"` (a string) or `"key_hex"` (its bytes in hex, for keys
/// that are not UTF-8). The guide, with every problem type:
/// [`docs/operations.md`](crate::guide::operations).
#[must_use]
pub struct OperatorService<Bk> {
    operator: Arc<Operator<Bk>>,
}

impl<Bk: Clone> Operator<Bk> {
    /// The operator's calls as a tower `Service`: see [`OperatorService`].
    /// **Mount it only behind your own authentication.**
    pub fn service(&self) -> OperatorService<Bk> {
        OperatorService {
            operator: Arc::new(self.clone()),
        }
    }
}

impl<Bk> Clone for OperatorService<Bk> {
    fn clone(&self) -> Self {
        Self {
            operator: Arc::clone(&self.operator),
        }
    }
}

impl<Bk> fmt::Debug for OperatorService<Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorService")
            .field("operator", &self.operator)
            .finish()
    }
}

/// The future of [`OperatorService`]'s answer.
pub type OperatorFuture =
    Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send + 'static>>;

impl<Bk, B> Service<Request<B>> for OperatorService<Bk>
where
    Bk: Heeding,
    B: Body + Send + 'static,
    B::Data: Send,
{
    type Response = Response<String>;
    type Error = Infallible;
    type Future = OperatorFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let operator = Arc::clone(&self.operator);
        Box::pin(async move {
            Ok(match answer(&operator, request).await {
                Ok(body) => ok(body),
                Err(problem) => problem.into_response(),
            })
        })
    }
}

/// The operations, by path. A new one is an arm here and a function below
/// (the top-N of denied keys, `GET /denied`, goes beside `GET /budgets`). Limits
/// held in the store (`/limits`) are not built yet: the path answers 404.
async fn answer<Bk: Heeding, B>(
    operator: &Operator<Bk>,
    request: Request<B>,
) -> Result<Value, Problem>
where
    B: Body + Send,
{
    let (head, body) = request.into_parts();
    let path = head.uri.path();
    let path = path.strip_suffix('/').unwrap_or(path);
    match path {
        "" => {
            if head.method != Method::GET && head.method != Method::HEAD {
                return Err(Problem::method("GET"));
            }
            Ok(layers(operator))
        }
        "/denied" => {
            if head.method != Method::GET && head.method != Method::HEAD {
                return Err(Problem::method("GET"));
            }
            denied(operator)
        }
        "/budgets" => {
            if head.method != Method::GET && head.method != Method::HEAD {
                return Err(Problem::method("GET"));
            }
            budgets(operator)
        }
        "/limits" | "/limits/set" | "/limits/clear" => {
            if head.method != Method::POST {
                return Err(Problem::method("POST"));
            }
            json_content(&head.headers)?;
            let bytes = collect(body, &head.headers).await?;
            let request: LimitRequest = parse(&bytes)?;
            let key = match (&request.key, &request.key_hex) {
                (None, None) => None,
                (key, hex) => Some(key_of(key.as_deref(), hex.as_deref())?),
            };
            if path == "/limits" {
                if request.tier.is_some() || key.is_some() || request.rate.is_some() {
                    return Err(Problem::bad_request(
                        "a read of limits takes the layer only",
                    ));
                }
                let stored = operator.read_limits(&request.layer).await?;
                return Ok(limits(operator, &request.layer, &stored));
            }
            let scope = match (request.tier.as_deref(), key.as_ref()) {
                (None, None) => LimitScope::Layer,
                (Some(tier), None) => LimitScope::Tier(tier),
                (None, Some(key)) => LimitScope::Key(key),
                (Some(_), Some(_)) => {
                    return Err(Problem::bad_request(
                        "give at most one of \"tier\" and a key: a limit has one scope",
                    ));
                }
            };
            if path == "/limits/clear" {
                if request.rate.is_some() {
                    return Err(Problem::bad_request("a clear takes no \"rate\""));
                }
                operator.clear_limit(&request.layer, scope).await?;
                return Ok(json!({ "cleared": true }));
            }
            let Some(rate) = request.rate.as_deref() else {
                return Err(Problem::bad_request(
                    "missing field `rate` (a rate string, e.g. \"100/min\")",
                ));
            };
            // A limit of 0, a negative or zero window, text: refused here,
            // never stored (the quota's own error says which; it quotes
            // the rate, which is the operator's, not a client's).
            let quota: Quota = rate
                .parse()
                .map_err(|err: ConfigError| Problem::bad_request(err.to_string()))?;
            operator.set_limit(&request.layer, scope, quota).await?;
            Ok(json!({ "set": quota.to_string() }))
        }
        "/read" | "/reset" | "/block" | "/unblock" => {
            if head.method != Method::POST {
                return Err(Problem::method("POST"));
            }
            json_content(&head.headers)?;
            let bytes = collect(body, &head.headers).await?;
            match path {
                "/read" => {
                    let target: Target = parse(&bytes)?;
                    let key = target.key()?;
                    let state = operator.read(&target.layer, &key).await?;
                    Ok(key_state(&target.layer, &state))
                }
                "/reset" => {
                    let target: Target = parse(&bytes)?;
                    let key = target.key()?;
                    Ok(json!({ "reset": operator.reset(&target.layer, &key).await? }))
                }
                "/block" => {
                    let block: BlockRequest = parse(&bytes)?;
                    let key = key_of(block.key.as_deref(), block.key_hex.as_deref())?;
                    let span = block.span(SystemTime::now())?;
                    let left = operator.block(&block.layer, &key, span).await?;
                    Ok(json!({ "blocked_for_ms": millis(left) }))
                }
                _ => {
                    let target: Target = parse(&bytes)?;
                    let key = target.key()?;
                    Ok(json!({ "unblocked": operator.unblock(&target.layer, &key).await? }))
                }
            }
        }
        _ => Err(Problem::not_found()),
    }
}

/// A JSON answer, never cached.
fn ok(body: Value) -> Response<String> {
    let mut response = Response::new(body.to_string());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A layer and a key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Target {
    layer: String,
    key: Option<String>,
    key_hex: Option<String>,
}

impl Target {
    fn key(&self) -> Result<Key, Problem> {
        key_of(self.key.as_deref(), self.key_hex.as_deref())
    }
}

/// The keys each layer denied most (the layers that keep a table), as
/// the table's digests, at most [`MAX_LISTED`] each.
fn denied<Bk>(operator: &Operator<Bk>) -> Result<Value, Problem> {
    let mut layers = Vec::new();
    for name in operator.layer_names() {
        let Some(top) = operator.denied(name, MAX_LISTED)? else {
            continue;
        };
        let keys: Vec<Value> = top
            .iter()
            .map(|k| json!({ "digest": k.digest, "denied": k.denied, "error": k.error }))
            .collect();
        layers.push(json!({ "layer": name, "keys": keys }));
    }
    Ok(json!({ "layers": layers }))
}

/// A limit's layer and scope (the layer, `tier`, or a key), and its
/// `rate` for a set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitRequest {
    layer: String,
    tier: Option<String>,
    key: Option<String>,
    key_hex: Option<String>,
    rate: Option<String>,
}

/// A layer's stored limits: the keys' as digests, never keys, at most
/// [`MAX_LISTED`].
fn limits<Bk>(operator: &Operator<Bk>, layer: &str, stored: &StoredLimits) -> Value {
    let tiers: serde_json::Map<String, Value> = stored
        .tiers()
        .map(|(tier, quota)| (tier.to_owned(), Value::String(quota.to_string())))
        .collect();
    let keys: Vec<Value> = stored
        .keys()
        .take(MAX_LISTED)
        .map(|(key, quota)| json!({ "digest": operator.digest_bytes(key), "rate": quota.to_string() }))
        .collect();
    json!({
        "layer": layer,
        "rate": stored.get(LimitScope::Layer).map(|q| q.to_string()),
        "tiers": tiers,
        "keys": keys,
        "keys_truncated": stored.keys().count() > MAX_LISTED,
        "corrupt": stored.corrupt(),
    })
}

/// A layer, a key, and how long to block it: `seconds` from now, or
/// `until` a Unix time in seconds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockRequest {
    layer: String,
    key: Option<String>,
    key_hex: Option<String>,
    seconds: Option<u64>,
    until: Option<u64>,
}

impl BlockRequest {
    fn span(&self, now: SystemTime) -> Result<Window, Problem> {
        let span = match (self.seconds, self.until) {
            (Some(seconds), None) => Duration::from_secs(seconds),
            (None, Some(until)) => {
                let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
                Duration::from_secs(until).checked_sub(now).ok_or_else(|| {
                    Problem::bad_request("\"until\" is not in the future: nothing to block")
                })?
            }
            _ => {
                return Err(Problem::bad_request(
                    "give exactly one of \"seconds\" (from now) and \"until\" (Unix seconds)",
                ));
            }
        };
        Window::new(span).map_err(|err| Problem::bad_request(format!("the block's span: {err}")))
    }
}

/// The key named by `key` (a string) or `key_hex` (its bytes in hex):
/// exactly one, not empty, at most [`MAX_KEY_BYTES`].
fn key_of(key: Option<&str>, key_hex: Option<&str>) -> Result<Key, Problem> {
    let bytes = match (key, key_hex) {
        (Some(key), None) => key.as_bytes().to_vec(),
        (None, Some(hex)) => from_hex(hex)?,
        _ => {
            return Err(Problem::invalid_key(
                "give exactly one of \"key\" (a string) and \"key_hex\" (its bytes in hex)",
            ));
        }
    };
    if bytes.is_empty() {
        return Err(Problem::invalid_key("the key is empty"));
    }
    if bytes.len() > MAX_KEY_BYTES {
        return Err(Problem::invalid_key(format!(
            "the key is longer than {MAX_KEY_BYTES} bytes"
        )));
    }
    Ok(Key::new(bytes))
}

fn from_hex(hex: &str) -> Result<Vec<u8>, Problem> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    let bad = || Problem::invalid_key("\"key_hex\" is not an even number of hex digits");
    if !hex.len().is_multiple_of(2) {
        return Err(bad());
    }
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)
}

/// `application/json` (with any parameters), or 415.
fn json_content(headers: &http::HeaderMap) -> Result<(), Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        Ok(())
    } else {
        Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "send the body as application/json",
        ))
    }
}

/// The request's body, at most [`MAX_BODY`] bytes.
async fn collect<B: Body>(body: B, headers: &http::HeaderMap) -> Result<Vec<u8>, Problem> {
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Body too large",
            format!("the body is longer than {MAX_BODY} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|_| Problem::bad_request("the body could not be read"))?;
        if let Ok(mut data) = frame.into_data() {
            if bytes.len() + data.remaining() > MAX_BODY {
                return Err(too_large());
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                bytes.extend_from_slice(chunk);
                let read = chunk.len();
                data.advance(read);
            }
        }
    }
    Ok(bytes)
}

/// `bytes` as a `T`, or a 400 that names what was wrong, never the
/// values sent (a key among them).
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(bytes).map_err(|err| {
        let at = format!("line {}, column {}", err.line(), err.column());
        let message = err.to_string();
        let detail = match err.classify() {
            serde_json::error::Category::Data
                if message.starts_with("unknown field") || message.starts_with("missing field") =>
            {
                // serde names the field, and the ones it expects: no value.
                message
            }
            serde_json::error::Category::Data => {
                format!("a field holds a value of the wrong type or range ({at})")
            }
            serde_json::error::Category::Eof => format!("the JSON ends too soon ({at})"),
            _ => format!("the body is not valid JSON ({at})"),
        };
        Problem::bad_request(detail)
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `GET /`: each layer, its counters' quotas and routes, whether a block
/// works. No key is listed.
fn layers<Bk>(operator: &Operator<Bk>) -> Value {
    let layers: Vec<Value> = operator
        .layer_names()
        .map(|name| {
            let counters: Vec<Value> = operator
                .counters(name)
                .unwrap_or_default()
                .iter()
                .map(|c| json!({ "quota": c.quota.to_string(), "route": c.route }))
                .collect();
            json!({
                "name": name,
                "blockable": operator.blockable(name),
                "counters": counters,
            })
        })
        .collect();
    json!({ "layers": layers })
}

/// `GET /budgets`: each outbound budget's keys with calls waiting or
/// closed in this process, as digests.
fn budgets<Bk>(operator: &Operator<Bk>) -> Result<Value, Problem> {
    let mut budgets = Vec::new();
    for name in operator.budget_names() {
        let (keys, truncated) = operator.budget_keys(name)?;
        let keys: Vec<Value> = keys
            .iter()
            .map(|k| {
                json!({
                    "digest": k.digest,
                    "waiting": k.waiting,
                    "closed_for_ms": k.closed_for.map(millis),
                })
            })
            .collect();
        budgets.push(json!({ "name": name, "keys": keys, "truncated": truncated }));
    }
    Ok(json!({ "budgets": budgets }))
}

/// `POST /read`'s answer. The key is not echoed: the operator asked by it.
fn key_state(layer: &str, state: &KeyState) -> Value {
    let counters: Vec<Value> = state
        .counters
        .iter()
        .map(|c| {
            json!({
                "quota": c.quota.to_string(),
                "route": c.route,
                "count": c.count,
                "remaining": c.remaining(),
                "resets_in_ms": c.resets_in.map(millis),
            })
        })
        .collect();
    json!({
        "layer": layer,
        "blocked_for_ms": state.blocked_for.map(millis),
        "counters": counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_of_two_forms_bounded_and_never_empty() {
        let long = "a".repeat(MAX_KEY_BYTES + 1);
        /// A case's name, its `key`, its `key_hex`, and the key's bytes.
        type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a [u8]>);
        let cases: [Case<'_>; 9] = [
            ("a string", Some("203.0.113.7"), None, Some(b"203.0.113.7")),
            (
                "hex, any bytes",
                None,
                Some("00ff7B"),
                Some(&[0, 0xff, 0x7b]),
            ),
            ("both", Some("a"), Some("61"), None),
            ("neither", None, None, None),
            ("empty string", Some(""), None, None),
            ("empty hex", None, Some(""), None),
            ("odd hex", None, Some("abc"), None),
            ("not hex", None, Some("zz"), None),
            ("too long", Some(&long), None, None),
        ];
        for (name, key, hex, want) in cases {
            let got = key_of(key, hex).ok();
            assert_eq!(
                got.as_ref().map(Key::as_bytes),
                want,
                "{name}: the key read"
            );
        }
    }

    #[test]
    fn a_block_names_exactly_one_span_in_the_future() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let block = |seconds, until| BlockRequest {
            layer: "api".into(),
            key: Some("k".into()),
            key_hex: None,
            seconds,
            until,
        };
        let secs = |w: Window| w.as_duration().as_secs();
        assert_eq!(block(Some(60), None).span(now).map(secs).ok(), Some(60));
        assert_eq!(block(None, Some(1_090)).span(now).map(secs).ok(), Some(90));
        for (name, seconds, until) in [
            ("zero seconds", Some(0), None),
            ("until now", None, Some(1_000)),
            ("until the past", None, Some(10)),
            ("both", Some(5), Some(2_000)),
            ("neither", None, None),
            ("past Window::MAX", Some(u64::MAX / 2), None),
        ] {
            assert!(block(seconds, until).span(now).is_err(), "{name}");
        }
    }

    #[test]
    fn parse_errors_never_echo_a_value() {
        let cases = [
            r#"{"layer":"api","key":"s3cret-value","extra":1}"#,
            r#"{"layer":"api","key":12345678}"#,
            r#"{"layer":"api","key":"s3cret-value""#,
            r#"not json s3cret-value"#,
        ];
        for case in cases {
            let problem = parse::<Target>(case.as_bytes()).err().expect(case);
            let body = problem.into_response().into_body();
            assert!(!body.contains("s3cret"), "{case}: {body}");
            assert!(!body.contains("12345678"), "{case}: {body}");
            assert!(body.contains("\"status\":400"), "{case}: {body}");
        }
    }
}
