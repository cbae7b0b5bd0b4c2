//! What a limited request is answered with, and the headers every answer
//! carries: the one place that writes the layer's response headers, on
//! the layer's own answers (a denial, a failure) and on the service's
//! answers it passes back. Pick the headers with [`HeaderStyle`], the
//! denial with a [`Deny`] ([`deny_with`](crate::RateLimitLayer::deny_with));
//! [`DefaultDeny`] answers an empty 429 (gRPC: RESOURCE_EXHAUSTED). The
//! guide: [`docs/headers.md`](crate::guide::headers).

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_TYPE, Entry, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use sfv::{Integer, ItemSerializer, KeyRef, StringRef};

use crate::decision::{Decision, Outcome, ceil_secs};
use crate::label::QuotaHeaders;
use crate::quota::Quota;

/// Which rate-limit headers responses carry.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::Request, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{Quota, RateLimitLayer, response::HeaderStyle};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::new("api", Quota::new(5, Duration::from_secs(60)).unwrap())
///     .headers(HeaderStyle::Legacy);
/// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// let response = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// let headers = response.headers();
/// assert_eq!(headers["x-ratelimit-limit"], "5");
/// assert_eq!(headers["x-ratelimit-remaining"], "4");
/// assert_eq!(headers["x-ratelimit-reset"], "60");
/// assert!(!headers.contains_key("ratelimit"));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// The IETF fields (draft-ietf-httpapi-ratelimit-headers):
    /// `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=42;t=17`.
    /// Both are lists: behind nested layers, each layer appends its items, so
    /// the client sees every limiter that applied.
    #[default]
    Ietf,
    /// The older `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds until the window closes). Each holds one
    /// value: behind nested layers, the innermost layer's.
    Legacy,
    /// No rate-limit headers (a denial still carries `Retry-After`).
    None,
}

/// Builds the response to a request over its limit.
///
/// The layer adds `Retry-After` and the rate-limit headers afterwards, each
/// unless the response already has it: a value the denial set is kept.
/// Implemented for closures `Fn(&Decision) -> Response<B>`, which is what
/// [`deny_with`](crate::RateLimitLayer::deny_with) takes. A gRPC request
/// (content-type `application/grpc*`) is always answered with a gRPC status
/// instead, since a gRPC client could not read anything else.
///
/// See [`deny_with`](crate::RateLimitLayer::deny_with) for an example.
pub trait Deny<B> {
    /// The denial for `decision` (see
    /// [`deny_with`](crate::RateLimitLayer::deny_with) for an example).
    fn deny(&self, decision: &Decision) -> Response<B>;
}

impl<B, F> Deny<B> for F
where
    F: Fn(&Decision) -> Response<B>,
{
    fn deny(&self, decision: &Decision) -> Response<B> {
        self(decision)
    }
}

/// `429 Too Many Requests` with an empty body: the denial a layer answers
/// with unless [`deny_with`](crate::RateLimitLayer::deny_with) replaces it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap());
/// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
/// let denied = app.oneshot(Request::new(Body::empty())).await.unwrap();
/// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(denied.headers()["retry-after"], "60");
/// let body = axum::body::to_bytes(denied.into_body(), 1024).await.unwrap();
/// assert!(body.is_empty());
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultDeny;

impl<B: Default> Deny<B> for DefaultDeny {
    fn deny(&self, _decision: &Decision) -> Response<B> {
        status_response(StatusCode::TOO_MANY_REQUESTS)
    }
}

/// The denial for `decision`, a request over its limit: the user's
/// [`Deny`] (or, for a gRPC request, RESOURCE_EXHAUSTED) with the
/// rate-limit headers and `Retry-After` each added unless the denial set it,
/// and the decision in its extensions.
pub(crate) fn denial<B, D>(deny: &D, decision: Decision, grpc: bool) -> Response<B>
where
    D: Deny<B>,
    B: Default,
{
    let mut response = if grpc {
        grpc_response(
            GrpcCode::ResourceExhausted,
            "rate limit exceeded",
            // Waiting never admits a request that can never fit.
            (!decision.never_fits()).then(|| decision.reset()),
        )
    } else {
        deny.deny(&decision)
    };
    write_headers(response.headers_mut(), &decision, Written::OnDenial);
    response.extensions_mut().insert(decision);
    response
}

/// The service's answer to a request that was passed on: `decision`'s
/// rate-limit headers joined to any it carries, and, when `in_extensions`,
/// the decision in its extensions.
#[inline]
pub(crate) fn passed<B>(response: &mut Response<B>, decision: Decision, in_extensions: bool) {
    write_headers(response.headers_mut(), &decision, Written::OnPassed);
    if in_extensions {
        response.extensions_mut().insert(decision);
    }
}

/// Whether [`passed`] writes anything onto the answer to a request passed
/// with `decision`, the decision itself aside: rate-limit headers, or a
/// raised `Retry-After` when nothing is left.
#[inline]
pub(crate) fn writes_on_passed(decision: &Decision) -> bool {
    !matches!(decision.quota_headers(), QuotaHeaders::None)
        || (decision.outcome() == Outcome::Allowed && decision.remaining() == 0)
}

/// The fields an in-flight cap named `name` writes, made once when its
/// layer is built: `RateLimit-Policy` with the IETF draft's quota unit for
/// concurrency, and the name's sf-string for `RateLimit`, whose parameters
/// are written per answer into a value cut from the thread's block (no
/// allocation of its own). `name` is a layer name: a valid sf-string.
#[derive(Debug)]
pub(crate) struct InFlightFields {
    /// `"name"`.
    name_item: Box<str>,
    policy: HeaderValue,
}

impl InFlightFields {
    pub(crate) fn new(name: &str, max: u64) -> Self {
        let policy = format!("\"{name}\";q={max};qu=\"concurrent-requests\"");
        Self {
            name_item: format!("\"{name}\"").into(),
            policy: HeaderValue::from_maybe_shared(Bytes::from(policy))
                .expect("a layer name is printable ASCII without quotes"),
        }
    }

    /// The fields on an answer: the policy, and `RateLimit` with the slots
    /// left (`r`) and, on a refusal, the seconds until the earliest lease
    /// runs out (`t`, whole seconds rounded up). Beside another layer's
    /// fields, they are more members of the same lists, on one line each
    /// (as [`passed`] writes them).
    pub(crate) fn write(
        &self,
        headers: &mut HeaderMap,
        left: u64,
        retry: Option<std::time::Duration>,
    ) {
        add_member(headers, RATELIMIT_POLICY, &[self.policy.as_bytes()]);
        // ";r=" and ";t=", and two sf-integers of at most 15 digits.
        let mut params = [0u8; 36];
        let mut start = params.len();
        if let Some(retry) = retry {
            start = write_digits(&mut params, start, sf_int_value(ceil_secs(retry).max(1)));
            start -= 3;
            params[start..start + 3].copy_from_slice(b";t=");
        }
        start = write_digits(&mut params, start, sf_int_value(left));
        start -= 3;
        params[start..start + 3].copy_from_slice(b";r=");
        add_member(
            headers,
            RATELIMIT,
            &[self.name_item.as_bytes(), &params[start..]],
        );
    }
}

/// Adds the member made of `parts` to the list field `name`, on the field's
/// one line: a field already there (another layer's members) is joined
/// with it into a value cut from the thread's block, so that neither costs
/// an allocation of its own.
fn add_member(headers: &mut HeaderMap, name: HeaderName, parts: &[&[u8]]) {
    match headers.entry(name) {
        Entry::Vacant(vacant) => {
            vacant.insert(cut_value(parts));
        }
        Entry::Occupied(mut occupied) => {
            if occupied.iter().nth(1).is_some() {
                // Several lines already: appended, then all joined.
                let name = occupied.key().clone();
                occupied.append(cut_value(parts));
                join_lines(headers, name);
                return;
            }
            let line = occupied.get().as_bytes().trim_ascii();
            let value = match (line.is_empty(), parts) {
                (true, _) => cut_value(parts),
                (false, [one]) => cut_value(&[line, b", ", one]),
                (false, [one, two]) => cut_value(&[line, b", ", one, two]),
                (false, _) => cut_value(&[line, b", ", &parts.concat()]),
            };
            occupied.insert(value);
        }
    }
}

/// The answer to a request refused a slot in flight: `429` with
/// `Retry-After` (whole seconds, rounded up, at least 1), or gRPC
/// RESOURCE_EXHAUSTED with the wait.
pub(crate) fn busy<B: Default>(grpc: bool, retry: std::time::Duration) -> Response<B> {
    let mut response = if grpc {
        grpc_response(
            GrpcCode::ResourceExhausted,
            "too many requests in flight",
            Some(retry),
        )
    } else {
        status_response(StatusCode::TOO_MANY_REQUESTS)
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1)));
    response
}

/// The answer under fail-closed when the backend failed: `503` with
/// `Retry-After: 1`, or gRPC UNAVAILABLE.
pub(crate) fn unavailable<B: Default>(grpc: bool) -> Response<B> {
    if grpc {
        return grpc_response(GrpcCode::Unavailable, "rate limiter unavailable", None);
    }
    let mut response = status_response(StatusCode::SERVICE_UNAVAILABLE);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The answer to a request whose counter is corrupt: `500`, or gRPC
/// INTERNAL.
pub(crate) fn corrupt<B: Default>(grpc: bool) -> Response<B> {
    if grpc {
        grpc_response(GrpcCode::Internal, "rate limiter state is corrupt", None)
    } else {
        status_response(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The answer to a request without a usable key: `status` (400 for a
/// request that lacks its key, 500 for a misconfigured extractor), or its
/// gRPC counterpart, INVALID_ARGUMENT or INTERNAL.
pub(crate) fn key_rejected<B: Default>(grpc: bool, status: StatusCode) -> Response<B> {
    match (grpc, status) {
        (false, status) => status_response(status),
        (true, StatusCode::BAD_REQUEST) => grpc_response(
            GrpcCode::InvalidArgument,
            "rate-limit key missing or invalid",
            None,
        ),
        (true, _) => grpc_response(
            GrpcCode::Internal,
            "rate-limit key extractor misconfigured",
            None,
        ),
    }
}

fn status_response<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

/// gRPC status codes the layer answers with.
#[derive(Debug, Clone, Copy)]
enum GrpcCode {
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
}

/// A trailers-only gRPC answer: HTTP 200 with the status in the headers.
/// With the `tonic` feature, a denial carries a `google.rpc.RetryInfo` in
/// `grpc-status-details-bin`, so clients can wait the right time.
fn grpc_response<B: Default>(
    code: GrpcCode,
    message: &'static str,
    retry_after: Option<std::time::Duration>,
) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    #[cfg(feature = "tonic")]
    if let Some(delay) = retry_after {
        use tonic_types::{ErrorDetails, StatusExt};
        let status = tonic::Status::with_error_details(
            tonic::Code::from_i32(code as i32),
            message,
            ErrorDetails::with_retry_info(Some(delay)),
        );
        if status.add_header(headers).is_ok() {
            return response;
        }
    }
    #[cfg(not(feature = "tonic"))]
    let _ = retry_after;
    headers.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    // The messages are fixed ASCII without characters that need
    // percent-encoding.
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    response
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which response the headers are written onto, which says whose headers
/// may already be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// The layer's own denial, fresh from [`Deny`] or the gRPC status: a
    /// header it already carries was set by the user's denial, and is kept.
    OnDenial,
    /// The inner service's response, which may carry inner layers' headers:
    /// the `RateLimit` lists are extended, and `Retry-After` is raised to
    /// this layer's wait when this layer would deny the retry.
    OnPassed,
}

/// Each quota's header fields, in order, for a policy of `quotas`: each
/// quota's policy name (a valid sf-string: names are checked when the layer
/// is built) and the quota. Serialized once, when the layer is built.
pub(crate) fn quota_headers(style: HeaderStyle, quotas: &[(&str, Quota)]) -> Vec<QuotaHeaders> {
    match style {
        HeaderStyle::None => quotas.iter().map(|_| QuotaHeaders::None).collect(),
        HeaderStyle::Legacy => quotas
            .iter()
            .map(|(_, quota)| QuotaHeaders::Legacy {
                limit: HeaderValue::from(quota.limit()),
            })
            .collect(),
        HeaderStyle::Ietf => {
            let mut list = String::new();
            for (name, quota) in quotas {
                if !list.is_empty() {
                    list.push_str(", ");
                }
                let _ = ItemSerializer::with_buffer(&mut list)
                    .bare_item(sf_name(name))
                    .parameter(key("q"), sf_int(quota.limit()))
                    .parameter(key("w"), sf_int(ceil_secs(quota.window().as_duration())));
            }
            let policy = HeaderValue::try_from(list).expect("an sf-list is a valid header value");
            quotas
                .iter()
                .map(|(name, _)| QuotaHeaders::Ietf {
                    policy: policy.clone(),
                    name_item: ItemSerializer::new()
                        .bare_item(sf_name(name))
                        .finish()
                        .into(),
                })
                .collect()
        }
    }
}

/// Write the rate-limit headers for `decision` into `headers`, and
/// `Retry-After` on a denial; `onto` says whose headers may already be
/// there (see [`Written`]).
fn write_headers(headers: &mut HeaderMap, decision: &Decision, onto: Written) {
    let reset = ceil_secs(decision.reset());
    match onto {
        Written::OnDenial if decision.never_fits() => {}
        Written::OnDenial => {
            headers
                .entry(RETRY_AFTER)
                .or_insert_with(|| int_value(reset));
        }
        // Allowed with nothing left: a retry is denied until the window
        // closes, so a later Retry-After from further in is the wait. A
        // shadow layer never denies the retry, so it leaves the wait alone.
        Written::OnPassed
            if decision.outcome() == Outcome::Allowed
                && decision.remaining() == 0
                && !decision.by_shadow_layer() =>
        {
            raise_retry_after(headers, reset);
        }
        Written::OnPassed => {}
    }
    match (decision.quota_headers(), onto) {
        (QuotaHeaders::Ietf { policy, name_item }, Written::OnDenial) => {
            headers
                .entry(RATELIMIT)
                .or_insert_with(|| ratelimit(name_item, decision.remaining(), reset));
            headers
                .entry(RATELIMIT_POLICY)
                .or_insert_with(|| policy.clone());
        }
        (QuotaHeaders::Ietf { policy, name_item }, Written::OnPassed) => {
            // Most responses have neither field: one insertion each, and no
            // entry value to move around. A field the service (or a layer
            // inside this one) set gets this layer's item on its last line,
            // then its lines are joined.
            if headers.append(RATELIMIT, ratelimit(name_item, decision.remaining(), reset)) {
                join_lines(headers, RATELIMIT);
            }
            if headers.append(RATELIMIT_POLICY, policy.clone()) {
                join_lines(headers, RATELIMIT_POLICY);
            }
        }
        (QuotaHeaders::Legacy { limit }, _) => {
            headers.entry(X_LIMIT).or_insert_with(|| limit.clone());
            headers
                .entry(X_REMAINING)
                .or_insert_with(|| int_value(decision.remaining()));
            headers.entry(X_RESET).or_insert_with(|| int_value(reset));
        }
        (QuotaHeaders::None, _) => {}
    }
}

/// `Retry-After` becomes `secs` if it holds fewer seconds. An HTTP-date, or
/// no `Retry-After` at all (nothing further in denied), is left alone.
#[cold]
fn raise_retry_after(headers: &mut HeaderMap, secs: u64) {
    if let Entry::Occupied(mut entry) = headers.entry(RETRY_AFTER) {
        let shorter = entry
            .iter()
            .map(|value| {
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .all(|wait| wait.is_some_and(|wait| wait < secs));
        if shorter {
            entry.insert(int_value(secs));
        }
    }
}

/// Joins the lines of the list field `name` into one (so a client reading
/// the first line sees the whole list), in order, leaving out empty ones.
#[cold]
fn join_lines(headers: &mut HeaderMap, name: HeaderName) {
    let mut joined = Vec::new();
    for line in headers.get_all(&name).iter().map(HeaderValue::as_bytes) {
        let line = line.trim_ascii();
        if !line.is_empty() {
            if !joined.is_empty() {
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(line);
        }
    }
    // Header values joined by ", " are a header value; should that ever
    // fail, the lines are left as they are rather than panic on a response.
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(joined)) {
        headers.insert(name, value);
    }
}

/// `"name";r=R;t=T`: the name was serialized by sfv once; the two parameters
/// are sf-integers, which are plain decimal digits. They are written back
/// to front into one buffer on the stack, so that the value is cut in two
/// copies: the name, then the parameters.
fn ratelimit(name_item: &str, remaining: u64, reset: u64) -> HeaderValue {
    // ";r=" and ";t=", and two sf-integers of at most 15 digits.
    let mut params = [0u8; 36];
    let mut start = params.len();
    start = write_digits(&mut params, start, sf_int_value(reset));
    start -= 3;
    params[start..start + 3].copy_from_slice(b";t=");
    start = write_digits(&mut params, start, sf_int_value(remaining));
    start -= 3;
    params[start..start + 3].copy_from_slice(b";r=");
    cut_value(&[name_item.as_bytes(), &params[start..]])
}

/// The decimal digits of `value` written into `buf` so that they end at
/// `end`, two at a time; returns where they start.
#[inline]
fn write_digits(buf: &mut [u8], mut end: usize, mut value: u64) -> usize {
    const PAIRS: &[u8; 200] = b"\
        0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    while value >= 100 {
        let pair = (value % 100) as usize * 2;
        value /= 100;
        end -= 2;
        buf[end..end + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if value >= 10 {
        let pair = value as usize * 2;
        end -= 2;
        buf[end..end + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        end -= 1;
        buf[end] = b'0' + value as u8;
    }
    end
}

/// A decimal header value, formatted without `fmt`.
fn int_value(value: u64) -> HeaderValue {
    let mut buffer = itoa::Buffer::new();
    cut_value(&[buffer.format(value).as_bytes()])
}

/// The bytes of the header values a thread writes are cut from one block of
/// this size, so that a value costs no allocation of its own: a block is
/// shared by the values cut from it and freed (or, once they are all
/// dropped, reused) as a whole. A value kept for long keeps its block
/// alive: at most this much memory for a value of a few bytes.
const VALUE_BLOCK: usize = 4096;

thread_local! {
    /// The rest of this thread's current block (see [`VALUE_BLOCK`]).
    static VALUE_BYTES: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(VALUE_BLOCK));
}

/// A header value of `parts`, one after the other, which must be visible
/// ASCII: cut from this thread's block of value bytes (see
/// [`VALUE_BLOCK`]), or allocated on its own while the thread is being torn
/// down.
fn cut_value(parts: &[&[u8]]) -> HeaderValue {
    let len = parts.iter().map(|part| part.len()).sum();
    let cut = VALUE_BYTES.try_with(|block| {
        let mut block = block.try_borrow_mut().ok()?;
        // A block whose values are all dropped is reused; one still shared
        // is left to them, for a fresh block of the same size (or larger,
        // for a longer value).
        block.reserve(len);
        for part in parts {
            block.extend_from_slice(part);
        }
        Some(block.split().freeze())
    });
    let bytes = match cut {
        Ok(Some(bytes)) => bytes,
        _ => Bytes::from(parts.concat()),
    };
    HeaderValue::from_maybe_shared(bytes).expect("the parts are a valid header value")
}

fn sf_name(name: &str) -> &StringRef {
    StringRef::from_str(name).expect("policy names are checked when the layer is built")
}

fn key(name: &'static str) -> &'static KeyRef {
    KeyRef::constant(name)
}

/// sf-integers stop at 10^15 - 1; larger values are clamped there.
fn sf_int_value(value: u64) -> u64 {
    value.min(999_999_999_999_999)
}

fn sf_int(value: u64) -> Integer {
    Integer::try_from(sf_int_value(value)).expect("clamped into the sf-integer range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cut_from_blocks_keep_their_bytes() {
        // Kept alive, so that no block is reused: the values run across
        // several blocks, one of them longer than a block.
        let long = vec![b'x'; VALUE_BLOCK + 10];
        let mut kept = Vec::new();
        for i in 0..1000u64 {
            let digits = i.to_string();
            let parts: [&[u8]; 3] = if i == 500 {
                [b"\"long\";r=", &long, b";t=1"]
            } else {
                [b"\"api\";r=", digits.as_bytes(), b";t=60"]
            };
            kept.push((parts.concat(), cut_value(&parts)));
        }
        for (want, value) in &kept {
            assert_eq!(value.as_bytes(), want.as_slice());
        }
        assert_eq!(ratelimit("\"a\"", 42, 17), "\"a\";r=42;t=17");
        assert_eq!(
            ratelimit("\"a\"", u64::MAX, 0),
            "\"a\";r=999999999999999;t=0"
        );
        assert_eq!(int_value(3600), "3600");
        let largest = sf_int_value(u64::MAX);
        for n in [0, 1, 9, 10, 99, 100, 101, 999, 1000, 12_345, largest] {
            let mut buf = [0u8; 20];
            let start = write_digits(&mut buf, 20, n);
            assert_eq!(&buf[start..], n.to_string().as_bytes(), "{n}");
        }
    }
}
