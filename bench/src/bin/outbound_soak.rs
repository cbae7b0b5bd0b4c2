//! The load and the judge of the outbound soaks (`bash soak/outbound.sh`
//! and `bash soak/provider.sh`; soak/README.md says what they do): clients
//! of a fake provider that share one budget through one Redis, with the
//! client layer `tower_pinned_window::outbound::BudgetLayer`.
//!
//! ```text
//! outbound_soak provider OUT           the fake provider: answers at once, writes when each call came
//! outbound_soak client ID OUT          one client process: CALLERS callers through a BudgetLayer
//! outbound_soak report EVENTS PROVIDER OUT...   the figures; exits 1 when a guarantee broke
//! outbound_soak provider-report EVENTS PROVIDER OUT...   the provider's word soak's figures; exits 1 on a missed target
//! ```
//!
//! The provider listens on `PROVIDER_ADDR` (127.0.0.1:PORT) and answers
//! every call at once: by default 200 without a header; with
//! `PROVIDER_LIMIT`, `PROVIDER_WINDOW_MS`, `PROVIDER_HEADERS=openai` and
//! `RETRY_ONCE_AT`, as a provider with a limit of its own (see [`Rules`]).
//! At `END_MS` + 1 s it writes one line a call to OUT, in the order they
//! came: `at_us status window_opened_us`, the Unix microseconds it came,
//! its answer's status, and when the provider's window it fell in opened.
//!
//! A client is a hyper-util client over TCP behind a `BudgetLayer` named
//! `provider` (one key for every call: the budget of one API key), `LIMIT`
//! calls a `WINDOW_MS`, counted in a `RedisBackend` of its own at
//! `REDIS_URL` under `PREFIX`, failing closed (or, with `INSURE_SHARE=N/D`,
//! over to `FailurePolicy::Insurance(Share::new(N, D))`). `CALLERS` tasks
//! call in a loop from `START_MS` until `END_MS`, each after the other's answer; a failed
//! call is followed by a pause of `RETRY_MS`, as a client's retry would.
//!
//! The backend is wrapped in [`Recording`], which delegates every step to
//! the `RedisBackend` and writes down each spend's answer. A client writes
//! two files:
//!
//! - OUT, one line a call: `arrived_us admitted_us ended_us outcome
//!   deadline_ms count spends insured`: when it was called, when the layer
//!   handed it to the HTTP client (0 when it never did), when it ended; its
//!   outcome (`ok`, `status-N`, `client`, or the budget's error:
//!   `exhausted`, `overloaded`, `never-fits`, `key`, `backend-KIND`); the
//!   window (`PEXPIRETIME`, Unix ms) and count of the store's answer that
//!   admitted it (0 0 when none did); how many spends it asked the backend
//!   for; 1 when it was admitted with the store failing (insurance);
//! - OUT.spends, one line a spend's answer: `unix_us verdict count
//!   deadline_ms reset_ms local`, the verdict `admitted` (a count within
//!   the limit, counted in a window: a deadline), `denied`, `failed`, or
//!   `unanswered` (dropped before its answer: the layer's timeout, or a
//!   call dropped while it waited);
//!   `local` 1 when the answer was ready at once, without a round trip (the
//!   Redis backend's deny cache), and last lines `totals spends amends
//!   hits refunds` and `heeds closes raises` of the calls to each step.
//!
//! The report groups the admitted answers of every client by their window
//! (the deadline names it) and fails on a window past `LIMIT`, on a call
//! sent without the store's word while it was up (fail closed), on a
//! budget error other than the store's failure, on a failure before the
//! fault, and on a counter without an expiry in the scans of EVENTS
//! (`scan UNIX_MS NAME COUNTERS WITHOUT_EXPIRY LONGEST_LEFT_MS`). It reads
//! the load's start and end, the fault and the restart from EVENTS
//! (`event UNIX_MS load-start`, `fault UNIX_MS redis-kill-9`, `event
//! UNIX_MS redis-restarted`, `event UNIX_MS load-end`), and the Redis
//! script calls (`calls UNIX_MS NAME N`, `EVALSHA`s from `INFO
//! commandstats`, before the kill and at the end).
//!
//! The provider's word soak has a report of its own
//! (`bench/src/provider_report.rs`): per provider window, its calls and
//! 429s, and the targets of issue 42.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Heeding, Hit, Hits, Spend, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::outbound::{BudgetError, BudgetLayer};
use tower_pinned_window::{Quota, Window};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::connection_manager_config;

#[path = "../soak_env.rs"]
mod soak_env;
use soak_env::{Error, env, failure_policy, required, unix_us};
#[path = "../outbound_files.rs"]
mod outbound_files;
use outbound_files::{
    CallLine, Events, SpendLine, Totals, quantile, read_calls, read_events, read_provider,
    read_spends, summary,
};
#[path = "../provider_report.rs"]
mod provider_report;

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["provider", out] => provider(out).await,
        ["client", id, out] => client(id.parse()?, out).await,
        ["report", events, provider, outs @ ..] if !outs.is_empty() => {
            if report(events, provider, outs)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        ["provider-report", events, provider, outs @ ..] if !outs.is_empty() => {
            if provider_report::report(events, provider, outs)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        _ => Err(
            "usage: outbound_soak provider OUT | outbound_soak client ID OUT | outbound_soak report EVENTS PROVIDER OUT... | outbound_soak provider-report EVENTS PROVIDER OUT..."
                .into(),
        ),
    }
}

/// The budget every client shares: `LIMIT` calls a `WINDOW_MS`.
fn quota() -> Result<Quota, Error> {
    Ok(Quota::new(
        env("LIMIT", 200)?,
        Duration::from_millis(env("WINDOW_MS", 1_000)?),
    )?)
}

// ---------------------------------------------------------------------------
// The fake provider.

/// How the fake provider answers, from the environment. Unset, it answers
/// every call 200 without a header.
struct Rules {
    /// `PROVIDER_LIMIT`: calls it serves in a window of its own; past it,
    /// it answers 429 with `Retry-After`, the whole seconds left of that
    /// window (rounded up).
    limit: Option<u64>,
    /// `PROVIDER_WINDOW_MS` (default `WINDOW_MS`), in µs: its window, pinned
    /// to the first call after the last one ended.
    window_us: u64,
    /// `PROVIDER_HEADERS=openai`: every answer says what remains of its
    /// window after the call (`x-ratelimit-remaining-requests`) and when
    /// the window ends (`x-ratelimit-reset-requests`, `1.234s`).
    openai: bool,
    /// `RETRY_ONCE_AT` seconds after `START_MS`, as Unix µs: the first call
    /// at or after it is answered 429 with `Retry-After: 3`, once,
    /// whatever else.
    retry_once_at_us: Option<u64>,
}

impl Rules {
    fn from_env() -> Result<Self, Error> {
        let limit = match std::env::var("PROVIDER_LIMIT") {
            Ok(_) => Some(required::<u64>("PROVIDER_LIMIT")?),
            Err(_) => None,
        };
        if limit == Some(0) {
            return Err("PROVIDER_LIMIT=0: a provider serves at least one call a window".into());
        }
        let window_ms: u64 = env("PROVIDER_WINDOW_MS", env("WINDOW_MS", 1_000)?)?;
        if window_ms == 0 {
            return Err("PROVIDER_WINDOW_MS=0: a window is at least 1 ms".into());
        }
        let openai = match std::env::var("PROVIDER_HEADERS").as_deref() {
            Err(_) => false,
            Ok("openai") if limit.is_some() => true,
            Ok("openai") => return Err("PROVIDER_HEADERS=openai needs PROVIDER_LIMIT".into()),
            Ok(other) => return Err(format!("PROVIDER_HEADERS={other}: only openai").into()),
        };
        let retry_once_at_us = match std::env::var("RETRY_ONCE_AT") {
            Ok(_) => {
                let at: f64 = required("RETRY_ONCE_AT")?;
                if !(at >= 0.0 && at.is_finite()) {
                    return Err(format!("RETRY_ONCE_AT={at}: seconds into the load").into());
                }
                Some(required::<u64>("START_MS")? * 1000 + (at * 1e6) as u64)
            }
            Err(_) => None,
        };
        Ok(Self {
            limit,
            window_us: window_ms * 1000,
            openai,
            retry_once_at_us,
        })
    }
}

/// The fake provider's window, and its log.
#[derive(Default)]
struct Books {
    /// When its window opened (Unix µs); 0 before the first call.
    opened_us: u64,
    /// The calls it answered 200 in that window.
    served: u64,
    /// `RETRY_ONCE_AT`'s 429 was sent.
    retried: bool,
    /// Every call: when it came, its status, when its window opened.
    log: Vec<(u64, u16, u64)>,
}

impl Books {
    /// The answer to a call that came at `at_us` (Unix µs, after every
    /// call before it): its status and headers, written down.
    fn answer(&mut self, rules: &Rules, at_us: u64) -> (StatusCode, HeaderMap) {
        if self.opened_us == 0 || at_us >= self.opened_us + rules.window_us {
            self.opened_us = at_us;
            self.served = 0;
        }
        let left_us = self.opened_us + rules.window_us - at_us;
        let mut headers = HeaderMap::new();
        let status = if !self.retried && rules.retry_once_at_us.is_some_and(|t| at_us >= t) {
            self.retried = true;
            headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
            StatusCode::TOO_MANY_REQUESTS
        } else if rules.limit.is_some_and(|limit| self.served >= limit) {
            headers.insert(RETRY_AFTER, HeaderValue::from(left_us.div_ceil(1_000_000)));
            StatusCode::TOO_MANY_REQUESTS
        } else {
            self.served += 1;
            StatusCode::OK
        };
        if rules.openai
            && let Some(limit) = rules.limit
        {
            let ms = left_us.div_ceil(1000);
            headers.insert(
                "x-ratelimit-remaining-requests",
                HeaderValue::from(limit.saturating_sub(self.served)),
            );
            headers.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::try_from(format!("{}.{:03}s", ms / 1000, ms % 1000))
                    .expect("digits are a header value"),
            );
        }
        self.log.push((at_us, status.as_u16(), self.opened_us));
        (status, headers)
    }
}

/// Answers every call on `PROVIDER_ADDR` at once, as its [`Rules`] say
/// (200 without a header by default), and notes each; at `END_MS` + 1 s
/// writes them to `out`, one line a call in the order they came: `at_us
/// status window_opened_us`, and returns.
async fn provider(out: &str) -> Result<(), Error> {
    let addr: String = required("PROVIDER_ADDR")?;
    let end_ms: u64 = required("END_MS")?;
    let rules = Arc::new(Rules::from_env()?);
    let books: Arc<Mutex<Books>> = Arc::default();
    let app = axum::Router::new().fallback({
        let books = Arc::clone(&books);
        move || {
            let answer = {
                let mut books = books.lock().expect("not poisoned");
                books.answer(&rules, unix_us())
            };
            async move { answer }
        }
    });
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let stop = end_ms * 1000 + 1_000_000;
    tokio::time::sleep(Duration::from_micros(stop.saturating_sub(unix_us()))).await;
    server.abort();
    let mut log = std::mem::take(&mut books.lock().expect("not poisoned").log);
    log.sort_by_key(|c| c.0);
    let text: String = log
        .iter()
        .map(|(at, status, opened)| format!("{at} {status} {opened}\n"))
        .collect();
    std::fs::write(out, text)?;
    let refused = log.iter().filter(|c| c.1 != 200).count();
    eprintln!("provider: {} calls, {refused} answered 429", log.len());
    Ok(())
}

// ---------------------------------------------------------------------------
// What one call learned on its way: written by the backend wrapper and the
// client wrapper, which run in the caller's task, read by the caller.

tokio::task_local! {
    static PROBE: Cell<Probe>;
}

#[derive(Debug, Clone, Copy, Default)]
struct Probe {
    /// When the layer handed the call to the HTTP client (Unix µs), 0 if never.
    admitted_us: u64,
    /// Spends asked of the backend for this call.
    spends: u32,
    /// The last spend's answer.
    last: Verdict,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Verdict {
    #[default]
    None,
    Admitted {
        count: u64,
        deadline_ms: u64,
    },
    Denied,
    Failed,
    /// Dropped before its answer: the layer's timeout (an outage, for the
    /// failure policy) or a call dropped while it waited.
    Unanswered,
}

fn probe(change: impl FnOnce(&mut Probe)) {
    // Outside a caller's task (none here), there is nobody to tell.
    let _ = PROBE.try_with(|cell| {
        let mut p = cell.get();
        change(&mut p);
        cell.set(p);
    });
}

// ---------------------------------------------------------------------------
// The recording backend.

/// A spend's answer, as the store gave it.
struct SpendRecord {
    unix_us: u64,
    verdict: Verdict,
    count: u64,
    reset_ms: u64,
    local: bool,
}

#[derive(Default)]
struct Log {
    spends: Mutex<Vec<SpendRecord>>,
    spend_calls: AtomicU64,
    amends: AtomicU64,
    hits: AtomicU64,
    refunds: AtomicU64,
    closes: AtomicU64,
    raises: AtomicU64,
}

/// A backend that delegates every step to `inner` and writes down each
/// spend's answer (and counts the calls of every step).
#[derive(Clone)]
struct Recording<B> {
    inner: B,
    limit: u64,
    log: Arc<Log>,
}

/// The future of a recorded spend: the inner one's answer, written down
/// when it is ready.
impl Log {
    /// Writes down one spend's answer, now.
    fn record(&self, verdict: Verdict, count: u64, reset_ms: u64, local: bool) {
        self.spends.lock().expect("not poisoned").push(SpendRecord {
            unix_us: unix_us(),
            verdict,
            count,
            reset_ms,
            local,
        });
        probe(|p| p.last = verdict);
    }
}

struct Recorded<F> {
    inner: F,
    limit: u64,
    log: Arc<Log>,
    polled: bool,
    done: bool,
}

impl<F> Future for Recorded<F>
where
    F: Future<Output = Result<Hits, BackendError>> + Unpin,
{
    type Output = Result<Hits, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let first = !std::mem::replace(&mut self.polled, true);
        let answer = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        self.done = true;
        let hit = answer.as_ref().ok().and_then(|hits| hits.first().copied());
        let verdict = match hit {
            Some(Hit {
                count,
                deadline: Some(deadline),
                ..
            }) if count <= self.limit => Verdict::Admitted {
                count,
                deadline_ms: deadline.get(),
            },
            Some(_) => Verdict::Denied,
            None => Verdict::Failed,
        };
        self.log.record(
            verdict,
            hit.map_or(0, |h| h.count),
            hit.map_or(0, |h| h.reset.as_millis() as u64),
            first,
        );
        Poll::Ready(answer)
    }
}

impl<F> Drop for Recorded<F> {
    fn drop(&mut self) {
        if !self.done {
            self.log.record(Verdict::Unanswered, 0, 0, false);
        }
    }
}

impl<B: Backend> Backend for Recording<B> {
    type Future = Recorded<B::Future>;
    type Refund = B::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        self.log.hits.fetch_add(1, Ordering::Relaxed);
        self.recorded(self.inner.hit_all(key, counters))
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        self.log.refunds.fetch_add(1, Ordering::Relaxed);
        self.inner.refund(namespace, key, hit)
    }

    fn peek(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Hit>, BackendError>> + Send {
        self.inner.peek(namespace, key)
    }

    fn reset(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        self.inner.reset(namespace, key)
    }
}

impl<B: Spending> Spending for Recording<B> {
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Self::Future {
        self.log.spend_calls.fetch_add(1, Ordering::Relaxed);
        probe(|p| p.spends += 1);
        self.recorded(self.inner.spend_all(key, counters, spend))
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Self::Refund {
        self.log.amends.fetch_add(1, Ordering::Relaxed);
        self.inner.amend(namespace, key, hit, amend)
    }
}

/// The provider's word goes to the store as it is, counted.
impl<B: Heeding> Heeding for Recording<B> {
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<B> {
        self.log.closes.fetch_add(1, Ordering::Relaxed);
        self.inner.close(namespace, key, span)
    }

    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<B> {
        self.log.raises.fetch_add(1, Ordering::Relaxed);
        self.inner.raise(key, counter, count, within)
    }
}

impl<B> Recording<B> {
    fn recorded<F>(&self, inner: F) -> Recorded<F> {
        Recorded {
            inner,
            limit: self.limit,
            log: Arc::clone(&self.log),
            polled: false,
            done: false,
        }
    }
}

// ---------------------------------------------------------------------------
// The client process.

/// The HTTP client, noting when the layer hands it a call.
#[derive(Clone)]
struct Stamped<S>(S);

impl<S, R> Service<R> for Stamped<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let now = unix_us();
        probe(|p| p.admitted_us = now);
        self.0.call(request)
    }
}

/// One call, as its caller saw it.
struct Call {
    arrived_us: u64,
    probe: Probe,
    ended_us: u64,
    outcome: String,
}

/// What a call's error was: the budget's, by kind, or the client's.
fn outcome_of(err: &Error) -> String {
    match err.downcast_ref::<BudgetError>() {
        Some(BudgetError::Exhausted { .. }) => "exhausted".into(),
        Some(BudgetError::Overloaded { .. }) => "overloaded".into(),
        Some(BudgetError::NeverFits { .. }) => "never-fits".into(),
        Some(BudgetError::Key { .. }) => "key".into(),
        Some(BudgetError::Backend { error, .. }) => format!("backend-{}", error.kind_name()),
        Some(_) => "budget-other".into(),
        None => "client".into(),
    }
}

async fn client(id: u32, out: &str) -> Result<(), Error> {
    let redis_url: String = required("REDIS_URL")?;
    let provider: String = required("PROVIDER_ADDR")?;
    let start_us = required::<u64>("START_MS")? * 1000;
    let end_us = required::<u64>("END_MS")? * 1000;
    let callers: u32 = env("CALLERS", 32)?;
    let retry = Duration::from_millis(env("RETRY_MS", 20)?);
    let quota = quota()?;

    let connection = redis::Client::open(redis_url.as_str())?
        .get_connection_manager_with_config(connection_manager_config())
        .await?;
    let redis = RedisBackend::builder(connection)
        .try_prefix(env("PREFIX", "tpw-outbound:".to_owned())?)?
        .build();
    let log = Arc::new(Log::default());
    let backend = Recording {
        inner: redis,
        limit: quota.limit(),
        log: Arc::clone(&log),
    };
    // No margin: the report reads each store window as `WINDOW_MS` long,
    // and its figures were measured so.
    let budget = BudgetLayer::new("provider", quota)
        .margin(Duration::ZERO)
        .backend(backend)
        .on_failure(failure_policy()?);
    let http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let service = ServiceBuilder::new().layer(budget).service(Stamped(http));
    let url = format!("http://{provider}/v1/call");
    // Every client starts its load at START_MS, once the others are up too.
    tokio::time::sleep(Duration::from_micros(start_us.saturating_sub(unix_us()))).await;

    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let service = service.clone();
            let url = url.clone();
            tokio::spawn(PROBE.scope(Cell::new(Probe::default()), async move {
                let mut calls = Vec::new();
                while unix_us() < end_us {
                    PROBE.with(|p| p.set(Probe::default()));
                    let request = Request::get(&url)
                        .body(Empty::<Bytes>::new())
                        .expect("a valid request");
                    let arrived_us = unix_us();
                    let call = async {
                        let response = service.clone().oneshot(request).await?;
                        let status = response.status();
                        response.into_body().collect().await?;
                        Ok::<_, Error>(status)
                    };
                    // The load ends at END_MS: a call still waiting then is
                    // dropped (which spends nothing) and not written down.
                    let left = Duration::from_micros(end_us.saturating_sub(arrived_us));
                    let Ok(result) = tokio::time::timeout(left, call).await else {
                        break;
                    };
                    let outcome = match &result {
                        Ok(StatusCode::OK) => "ok".to_owned(),
                        Ok(status) => format!("status-{}", status.as_u16()),
                        Err(err) => outcome_of(err),
                    };
                    calls.push(Call {
                        arrived_us,
                        probe: PROBE.with(Cell::get),
                        ended_us: unix_us(),
                        outcome,
                    });
                    if result.is_err() {
                        tokio::time::sleep(retry).await;
                    }
                }
                calls
            }))
        })
        .collect();

    let mut text = String::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        for c in task.await? {
            *outcomes.entry(c.outcome.clone()).or_default() += 1;
            let (count, deadline_ms) = match c.probe.last {
                Verdict::Admitted { count, deadline_ms } if c.probe.admitted_us > 0 => {
                    (count, deadline_ms)
                }
                _ => (0, 0),
            };
            let insured = c.probe.admitted_us > 0
                && matches!(c.probe.last, Verdict::Failed | Verdict::Unanswered);
            text.push_str(&format!(
                "{} {} {} {} {} {} {} {}\n",
                c.arrived_us,
                c.probe.admitted_us,
                c.ended_us,
                c.outcome,
                deadline_ms,
                count,
                c.probe.spends,
                u8::from(insured),
            ));
        }
    }
    std::fs::write(out, text)?;

    let mut text = String::new();
    for s in log.spends.lock().expect("not poisoned").iter() {
        let (verdict, deadline_ms) = match s.verdict {
            Verdict::Admitted { deadline_ms, .. } => ("admitted", deadline_ms),
            Verdict::Denied => ("denied", 0),
            Verdict::Failed | Verdict::None => ("failed", 0),
            Verdict::Unanswered => ("unanswered", 0),
        };
        text.push_str(&format!(
            "{} {verdict} {} {deadline_ms} {} {}\n",
            s.unix_us,
            s.count,
            s.reset_ms,
            u8::from(s.local)
        ));
    }
    text.push_str(&format!(
        "totals {} {} {} {}\n",
        log.spend_calls.load(Ordering::Relaxed),
        log.amends.load(Ordering::Relaxed),
        log.hits.load(Ordering::Relaxed),
        log.refunds.load(Ordering::Relaxed),
    ));
    text.push_str(&format!(
        "heeds {} {}\n",
        log.closes.load(Ordering::Relaxed),
        log.raises.load(Ordering::Relaxed),
    ));
    std::fs::write(format!("{out}.spends"), text)?;
    eprintln!("client {id}: calls by outcome {outcomes:?}");
    Ok(())
}

// ---------------------------------------------------------------------------
// The report.

/// The report over every client's files; `false` when a guarantee broke.
fn report(events: &str, provider: &str, outs: &[&str]) -> Result<bool, Error> {
    let limit: u64 = env("LIMIT", 200)?;
    let window_ms: u64 = env("WINDOW_MS", 1_000)?;
    let window_us = window_ms * 1000;
    let insured_run = std::env::var("INSURE_SHARE").is_ok();
    let mut ok = true;
    let mut fail = |text: String| {
        println!("FAIL: {text}");
        ok = false;
    };

    // The events.
    let Events {
        start_ms,
        end_ms,
        kill_ms,
        restart_ms,
        scans,
        evalsha,
    } = read_events(events)?;

    // Every client's calls and the store's answers.
    let mut calls = Vec::new();
    let mut spends = Vec::new();
    let mut totals = Totals::default();
    for (client, out) in outs.iter().enumerate() {
        calls.extend(read_calls(client, out)?);
        spends.extend(read_spends(&format!("{out}.spends"), &mut totals)?);
    }
    calls.sort_by_key(|c| c.arrived_us);
    spends.sort_by_key(|s| s.unix_us);
    let admitted_calls = calls.iter().filter(|c| c.admitted_us > 0).count() as u64;
    let run_s = (end_ms - start_ms) as f64 / 1000.0;
    println!(
        "{} clients, {} calls in {run_s:.1} s, {admitted_calls} sent to the provider; budget {limit} a {window_ms} ms window",
        outs.len(),
        calls.len()
    );

    // 1. No window past its budget: the store's admitting answers of every
    // client, grouped by the window they name.
    let mut windows: BTreeMap<u64, Vec<&SpendLine>> = BTreeMap::new();
    for s in spends.iter().filter(|s| s.verdict == "admitted") {
        windows.entry(s.deadline_ms).or_default().push(s);
    }
    let over: Vec<_> = windows
        .iter()
        .filter(|(_, a)| a.len() as u64 > limit)
        .collect();
    for (deadline, a) in &over {
        fail(format!(
            "window closing at {deadline} admitted {} calls, past its budget of {limit}",
            a.len()
        ));
    }
    let duplicate_counts: usize = windows
        .values()
        .map(|a| {
            let mut counts: Vec<u64> = a.iter().map(|s| s.count).collect();
            counts.sort_unstable();
            counts.windows(2).filter(|w| w[0] == w[1]).count()
        })
        .sum();
    if duplicate_counts > 0 {
        fail(format!(
            "{duplicate_counts} admitting answers repeat a count of their window (one count handed out twice)"
        ));
    }
    println!(
        "windows: {} admitted calls in {} windows, {} past the budget, at most {} in one",
        windows.values().map(Vec::len).sum::<usize>(),
        windows.len(),
        over.len(),
        windows.values().map(Vec::len).max().unwrap_or(0)
    );

    // Every call the provider got was admitted by the store while it was up
    // (fail closed: no call without its word).
    let unbacked = calls
        .iter()
        .filter(|c| c.admitted_us > 0 && c.deadline_ms == 0 && !c.insured)
        .count();
    if unbacked > 0 {
        fail(format!(
            "{unbacked} calls were sent without an admitting answer of the store"
        ));
    }
    let insured = calls.iter().filter(|c| c.insured).count();
    if insured > 0 && !insured_run {
        fail(format!(
            "{insured} calls sent while the store failed, failing closed"
        ));
    }

    // 2. Budget use. A window is [deadline - W, deadline); those wholly in
    // the run, and clear of the outage (from the kill to the restart).
    let outage = kill_ms.map(|k| (k, restart_ms.unwrap_or(end_ms)));
    let clear = |deadline: u64| {
        let opened = deadline - window_ms;
        opened >= start_ms
            && deadline <= end_ms
            && outage.is_none_or(|(k, r)| deadline <= k || opened >= r)
    };
    let mut uses: Vec<f64> = windows
        .iter()
        .filter(|(d, _)| clear(**d))
        .map(|(_, a)| a.len() as f64 / limit as f64)
        .collect();
    uses.sort_by(f64::total_cmp);
    let steady_admitted: usize = windows
        .iter()
        .filter(|(d, _)| clear(**d))
        .map(|(_, a)| a.len())
        .sum();
    if !uses.is_empty() {
        let mean = uses.iter().sum::<f64>() / uses.len() as f64;
        println!(
            "budget use, {} windows wholly in the run and clear of the outage: mean {:.1}%, min {:.1}%, {} below 95% (goal: at least 95%)",
            uses.len(),
            100.0 * mean,
            100.0 * uses[0],
            uses.iter().filter(|u| **u < 0.95).count()
        );
    }
    // Between two windows, the budget is closed until a spend opens the
    // next: the gap from one window's end to the next one's start.
    let deadlines: Vec<u64> = windows.keys().copied().collect();
    let gaps: Vec<i64> = deadlines
        .windows(2)
        .filter(|w| clear(w[0]) && clear(w[1]))
        .map(|w| (w[1] - window_ms) as i64 - w[0] as i64)
        .map(|ms| ms * 1000)
        .collect();
    println!(
        "gap from a window's end to the next one's start (the store's ms): {}",
        summary(gaps)
    );
    let run_windows = (end_ms - start_ms) as f64 / window_ms as f64;
    let steady_span = {
        let clear_deadlines: Vec<u64> = deadlines.iter().copied().filter(|d| clear(*d)).collect();
        match (clear_deadlines.first(), clear_deadlines.last()) {
            (Some(first), Some(last)) if last > first => (last - first + window_ms) as f64,
            _ => 0.0,
        }
    };
    let down_ms = outage.map_or(0, |(k, r)| r - k) as f64;
    println!(
        "budget use overall: {admitted_calls} of {:.0} ({:.1}%) over the whole run; {:.1}% of the time's budget outside the outage",
        run_windows * limit as f64,
        100.0 * admitted_calls as f64 / (run_windows * limit as f64),
        100.0 * steady_admitted as f64
            / ((steady_span - down_ms.min(steady_span)).max(1.0) / window_ms as f64 * limit as f64)
    );

    // 3. Waits: from the call to its handing to the HTTP client.
    let steady_call = |c: &CallLine| {
        outage.is_none_or(|(k, r)| {
            let a = c.arrived_us / 1000;
            a + window_ms < k || a > r + window_ms
        })
    };
    let sent: Vec<&CallLine> = calls
        .iter()
        .filter(|c| c.admitted_us > 0 && !c.insured)
        .collect();
    println!(
        "wait, call to admission, every admitted call: {}",
        summary(
            sent.iter()
                .map(|c| (c.admitted_us - c.arrived_us) as i64)
                .collect()
        )
    );
    println!(
        "wait, away from the outage (arrived more than a window before the kill or after the restart): {}",
        summary(
            sent.iter()
                .filter(|c| steady_call(c))
                .map(|c| (c.admitted_us - c.arrived_us) as i64)
                .collect()
        )
    );
    // The window open when a call arrived (the last one opened by then),
    // and its end: a call that waits must be sent at most 50 ms after it.
    let live_end = |at_us: u64| -> Option<u64> {
        let i = deadlines.partition_point(|d| (d - window_ms) * 1000 <= at_us);
        let d = *deadlines.get(i.checked_sub(1)?)?;
        (d * 1000 > at_us).then_some(d * 1000)
    };
    // A call's wait less the time left in that window when it came: how
    // late it was sent after that window's end.
    let excess_of = |c: &CallLine| -> i64 {
        let from = live_end(c.arrived_us).map_or(c.arrived_us, |end| end.max(c.arrived_us));
        (c.admitted_us as i64 - from as i64).max(0)
    };
    let excess: Vec<(usize, i64)> = sent
        .iter()
        .filter(|c| steady_call(c))
        .map(|c| (c.client, excess_of(c)))
        .collect();
    let excess_p99 = {
        let mut e: Vec<i64> = excess.iter().map(|e| e.1).collect();
        e.sort_unstable();
        quantile(&e, 0.99)
    };
    println!(
        "wait past the end of the window open at arrival (0 when sooner), away from the outage: {} (goal: p99 at most 50 ms: {}); {} calls past 50 ms",
        summary(excess.iter().map(|e| e.1).collect()),
        if excess_p99 <= 50_000 {
            "met"
        } else {
            "missed"
        },
        excess.iter().filter(|e| e.1 > 50_000).count()
    );
    for client in 0..outs.len() {
        let mine: Vec<i64> = excess
            .iter()
            .filter(|e| e.0 == client)
            .map(|e| e.1)
            .collect();
        let past = mine.iter().filter(|e| **e > 50_000).count();
        println!(
            "  client {}: {past} past 50 ms, {}",
            client + 1,
            summary(mine)
        );
    }
    // How fast an open window's budget goes out: admission after the
    // window's start, per call, and per window for its last call.
    let after_start: Vec<i64> = sent
        .iter()
        .filter(|c| steady_call(c) && c.deadline_ms > 0)
        .map(|c| c.admitted_us as i64 - ((c.deadline_ms - window_ms) * 1000) as i64)
        .collect();
    println!(
        "admission after its window's start: {}",
        summary(after_start)
    );
    let mut last_in: HashMap<u64, u64> = HashMap::new();
    for c in sent.iter().filter(|c| c.deadline_ms > 0) {
        let e = last_in.entry(c.deadline_ms).or_default();
        *e = (*e).max(c.admitted_us);
    }
    let handout: Vec<i64> = last_in
        .iter()
        .filter(|(d, _)| clear(**d) && windows.get(d).is_some_and(|a| a.len() as u64 == limit))
        .map(|(d, last)| *last as i64 - ((d - window_ms) * 1000) as i64)
        .collect();
    println!(
        "a full window's budget handed out (its start to its last call's admission): {}",
        summary(handout)
    );
    let per_client: Vec<usize> = (0..outs.len())
        .map(|i| sent.iter().filter(|c| c.client == i).count())
        .collect();
    println!("admitted per client: {per_client:?}");
    let mut top_share: Vec<i64> = last_in
        .keys()
        .filter(|d| clear(**d))
        .map(|d| {
            let mut by_client = vec![0i64; outs.len()];
            for c in sent.iter().filter(|c| c.deadline_ms == *d) {
                by_client[c.client] += 1;
            }
            by_client.into_iter().max().unwrap_or(0)
        })
        .collect();
    top_share.sort_unstable();
    println!(
        "the most one client took of a window clear of the outage: p50 {}, max {} (of {limit}; an even split is {})",
        quantile(&top_share, 0.5),
        top_share.last().copied().unwrap_or(0),
        limit / outs.len() as u64
    );

    // 4. Store calls.
    let by = |verdict: &str, local: bool| {
        spends
            .iter()
            .filter(|s| s.verdict == verdict && s.local == local)
            .count()
    };
    let denied_remote: BTreeMap<u64, usize> = {
        // Denials that went to Redis, per window they fell in (by time).
        let mut m = BTreeMap::new();
        for s in spends.iter().filter(|s| s.verdict == "denied" && !s.local) {
            let i = deadlines.partition_point(|d| *d * 1000 <= s.unix_us);
            if let Some(d) = deadlines.get(i) {
                *m.entry(*d).or_default() += 1;
            }
        }
        m
    };
    let mut denials: Vec<i64> = denied_remote
        .iter()
        .filter(|(d, _)| clear(**d))
        .map(|(_, n)| *n as i64)
        .collect();
    denials.sort_unstable();
    let admitted_store = windows.values().map(Vec::len).sum::<usize>().max(1) as f64;
    let remote = spends.iter().filter(|s| !s.local).count();
    println!(
        "store calls: {} spends ({:.2} per admitted call), {remote} of them sent to Redis ({:.2} per admitted call): admitted {}, denied {}, failed {}, unanswered (timed out or dropped) {}; answered at once in the process: denied {} (the deny cache), failed {}, admitted {}; {} amends, {} hits, {} refunds; the calls' own count: {} spends",
        totals.spends,
        totals.spends as f64 / admitted_store,
        remote as f64 / admitted_store,
        by("admitted", false),
        by("denied", false),
        by("failed", false),
        by("unanswered", false),
        by("denied", true),
        by("failed", true),
        by("admitted", true),
        totals.amends,
        totals.hits,
        totals.refunds,
        calls.iter().map(|c| c.spends).sum::<u64>()
    );
    if totals.spends != spends.len() as u64 {
        fail(format!(
            "{} spends asked, {} written down",
            totals.spends,
            spends.len()
        ));
    }
    // Away from the outage (before the kill, and from the first admission
    // after the restart): what the store is asked while it is up.
    let recovered_us = restart_ms.and_then(|r| {
        spends
            .iter()
            .find(|s| s.verdict == "admitted" && s.unix_us / 1000 >= r)
            .map(|s| s.unix_us)
    });
    let up = |s: &&SpendLine| {
        kill_ms.is_none_or(|k| s.unix_us / 1000 < k || recovered_us.is_some_and(|r| s.unix_us >= r))
    };
    let up_spends: Vec<&SpendLine> = spends.iter().filter(up).collect();
    let up_admitted = up_spends
        .iter()
        .filter(|s| s.verdict == "admitted")
        .count()
        .max(1) as f64;
    println!(
        "store calls while Redis is up (before the kill, from the first admission after the restart): {:.3} spends per admitted call, {:.3} sent to Redis ({} spends, {} admitted)",
        up_spends.len() as f64 / up_admitted,
        up_spends.iter().filter(|s| !s.local).count() as f64 / up_admitted,
        up_spends.len(),
        up_admitted
    );
    println!(
        "Redis EVALSHA calls (INFO commandstats, before the kill and at the end): {evalsha}, {:.2} per admitted call",
        evalsha as f64 / admitted_store
    );
    println!(
        "the provider's word written to the store: {} closes, {} raises",
        totals.closes, totals.raises
    );
    println!(
        "denials from Redis per window (clear of the outage): p50 {}, max {}",
        quantile(&denials, 0.5),
        denials.last().copied().unwrap_or(0)
    );

    // 5. Failures, and what the outage cost.
    let mut failures: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.outcome != "ok") {
        let e = failures
            .entry(c.outcome.as_str())
            .or_insert((0, u64::MAX, 0));
        e.0 += 1;
        e.1 = e.1.min(c.ended_us / 1000);
        e.2 = e.2.max(c.ended_us / 1000);
    }
    let rel = |ms: u64| (ms as f64 - kill_ms.unwrap_or(start_ms) as f64) / 1000.0;
    for (outcome, (n, first, last)) in &failures {
        println!(
            "failed calls, {outcome}: {n}, from {:+.3} s to {:+.3} s after the kill",
            rel(*first),
            rel(*last)
        );
        if !outcome.starts_with("backend-") {
            fail(format!(
                "{n} calls failed with {outcome}: only the store's failure may fail a call"
            ));
        }
    }
    let before_kill = calls
        .iter()
        .filter(|c| c.outcome != "ok" && kill_ms.is_none_or(|k| c.ended_us / 1000 < k))
        .count();
    if before_kill > 0 {
        fail(format!("{before_kill} calls failed before the fault"));
    }
    if let (Some(kill), Some(restart)) = (kill_ms, restart_ms) {
        let first_after = spends
            .iter()
            .find(|s| s.verdict == "admitted" && s.unix_us / 1000 >= restart)
            .map(|s| s.unix_us / 1000);
        let last_before = spends
            .iter()
            .rfind(|s| s.verdict == "admitted" && s.unix_us / 1000 < kill);
        let cut = last_before.map(|s| {
            (
                s.deadline_ms,
                windows.get(&s.deadline_ms).map_or(0, Vec::len),
            )
        });
        println!(
            "outage: Redis down {:.3} s; first admission {} after the restart; the window live at the kill admitted {} of {limit} before it; no store window for {:.2} windows' time",
            (restart - kill) as f64 / 1000.0,
            first_after.map_or("never".into(), |f| format!(
                "{} ms",
                f as i64 - restart as i64
            )),
            cut.map_or(0, |c| c.1),
            first_after.map_or(f64::NAN, |f| (f - cut.map_or(kill, |c| c.0.min(f))) as f64
                / window_ms as f64)
        );
        if first_after.is_none() {
            fail("no call admitted after the restart".into());
        }
        if insured > 0 {
            println!(
                "insured calls (admitted by the process's share while the store failed): {insured}"
            );
        }
    }

    // 6. Counters without an expiry.
    let mut counters_seen = false;
    for (at, name, n, bad, longest) in &scans {
        println!(
            "scan {name} at {:+.1} s: {n} counters, {bad} without an expiry or past the window, longest left {longest} ms",
            (*at as f64 - start_ms as f64) / 1000.0
        );
        if *n < 0 {
            fail(format!("scan {name} could not read the store"));
        }
        if *bad > 0 {
            fail(format!(
                "scan {name}: {bad} counters without an expiry (or past the window)"
            ));
        }
        counters_seen |= *n > 0;
    }
    if !counters_seen {
        fail("no scan found a counter: the expiry check saw nothing".into());
    }

    // 7. The provider's view.
    let seen: Vec<u64> = read_provider(provider)?.iter().map(|c| c.at_us).collect();
    // (opened, calls) of each window pinned to its first call.
    let mut pinned_windows: Vec<(u64, u64)> = Vec::new();
    for &at in &seen {
        match pinned_windows.last_mut() {
            Some((o, n)) if at < *o + window_us => *n += 1,
            _ => pinned_windows.push((at, 1)),
        }
    }
    let pinned: Vec<u64> = pinned_windows.iter().map(|w| w.1).collect();
    let mut sliding = 0usize;
    let mut from = 0;
    for (i, &at) in seen.iter().enumerate() {
        while seen[from] + window_us <= at {
            from += 1;
        }
        sliding = sliding.max(i + 1 - from);
    }
    println!(
        "provider saw {} calls ({} sent): {} windows of {window_ms} ms pinned to their first call, at most {} in one ({} past {limit}); at most {sliding} in any {window_ms} ms",
        seen.len(),
        admitted_calls,
        pinned.len(),
        pinned.iter().max().copied().unwrap_or(0),
        pinned.iter().filter(|n| **n > limit).count()
    );

    for (opened, n) in pinned_windows.iter().filter(|w| w.1 > limit) {
        // The store's windows it overlaps, by their start and what they admitted.
        let overlapping: Vec<String> = windows
            .iter()
            .filter(|(d, _)| **d * 1000 > *opened && (**d - window_ms) * 1000 < opened + window_us)
            .map(|(d, a)| {
                format!(
                    "{:+.3} s: {}",
                    (d - window_ms) as f64 / 1000.0 - *opened as f64 / 1e6,
                    a.len()
                )
            })
            .collect();
        println!(
            "  provider window opened at {:+.3} s ({:+.3} s after the kill): {n} calls; store windows it overlaps, by start from it: {}",
            (*opened as f64 / 1000.0 - start_ms as f64) / 1000.0,
            (*opened as f64 / 1000.0 - kill_ms.unwrap_or(start_ms) as f64) / 1000.0,
            overlapping.join(", ")
        );
    }
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
