//! The outbound layer (`tower_pinned_window::outbound`): calls through a
//! client that spend from a shared budget, wait for its window when it is
//! spent, and never go past it. On the memory backend, and on real Redis
//! (standalone, Cluster, Sentinel) and PostgreSQL servers, where two
//! layers with their own backends stand for two instances of a service.
//!
//! Each test records what the store admitted, through a backend wrapper
//! (`Recorded`) that keeps every admitting answer's window (its deadline):
//! the calls the fake provider received are compared with it.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Heeding, Hit, Hits, LimitScope, Limits, MemoryBackend,
    Spend, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::outbound::{BudgetError, BudgetLayer, DEFAULT_MARGIN, WaitBound};
use tower_pinned_window::{ConfigError, FailurePolicy, LimitBook, Quota, Share, Window};
use trial::Needs;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the budget is named in every test.
const NAME: &str = "provider";

/// A backend that records, for every spend the store admitted, the
/// window it was counted in (its deadline), and counts the store's calls.
#[derive(Clone)]
struct Recorded<Bk> {
    inner: Bk,
    admitted: Arc<Mutex<Vec<u64>>>,
    calls: Arc<AtomicU64>,
}

impl<Bk> Recorded<Bk> {
    fn new(inner: Bk) -> Self {
        Self {
            inner,
            admitted: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// Another backend's wrapper that records in the same place.
    fn beside<Other>(&self, inner: Other) -> Recorded<Other> {
        Recorded {
            inner,
            admitted: Arc::clone(&self.admitted),
            calls: Arc::clone(&self.calls),
        }
    }

    /// Admitted spends per window.
    fn windows(&self) -> BTreeMap<u64, u64> {
        let mut windows = BTreeMap::new();
        for deadline in self.admitted.lock().unwrap().iter() {
            *windows.entry(*deadline).or_default() += 1;
        }
        windows
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Hits, BackendError>> + Send>>;

impl<Bk: Backend> Backend for Recorded<Bk> {
    type Future = Answer;
    type Refund = Bk::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Answer {
        Box::pin(self.inner.hit_all(key, counters))
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Bk::Refund {
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

impl<Bk: Spending> Spending for Recorded<Bk> {
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Answer {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let answer = self.inner.spend_all(key, counters, spend);
        let limit = counters[0].quota.limit();
        let admitted = Arc::clone(&self.admitted);
        Box::pin(async move {
            let hits = answer.await;
            if let Ok(hits) = &hits
                && let Some(hit) = hits.first()
                && hit.count <= limit
                && let Some(deadline) = hit.deadline
            {
                admitted.lock().unwrap().push(deadline.get());
            }
            hits
        })
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund {
        self.inner.amend(namespace, key, hit, amend)
    }
}

impl<Bk: Heeding> Heeding for Recorded<Bk> {
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<Bk> {
        self.inner.close(namespace, key, span)
    }

    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<Bk> {
        self.inner.raise(key, counter, count, within)
    }
}

/// The fake provider: answers every call at once, with the usage its
/// request asks for (`x-use`) in `x-usage`, and keeps the order and time
/// of the calls it receives (`x-n` names a call).
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Provider {
    fn client(
        &self,
    ) -> impl Service<
        Request<String>,
        Response = Response<String>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let seen = Arc::clone(&self.seen);
        tower::service_fn(move |request: Request<String>| {
            let name = header(&request, "x-n");
            seen.lock().unwrap().push((Instant::now(), name));
            let usage = header(&request, "x-use");
            async move {
                let mut response = Response::new(String::from("ok"));
                if !usage.is_empty() {
                    response
                        .headers_mut()
                        .insert("x-usage", usage.parse().unwrap());
                }
                Ok(response)
            }
        })
    }

    fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn names(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, name)| name.clone())
            .collect()
    }
}

fn header<B>(request: &Request<B>, name: &str) -> String {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn call(n: impl std::fmt::Display) -> Request<String> {
    Request::builder()
        .header("x-n", n.to_string())
        .body(String::new())
        .unwrap()
}

/// The budget error of a failed call.
fn budget_error(err: &BoxError) -> &BudgetError {
    err.downcast_ref::<BudgetError>()
        .unwrap_or_else(|| panic!("not a budget error: {err}"))
}

/// Sends `request` through `client` and reads the answer's body to its
/// end (which settles a charge).
async fn send<S, B>(client: &S, request: Request<String>) -> Result<Response<()>, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
    B: http_body_util::BodyExt + Send,
    B::Error: std::fmt::Debug,
    B::Data: Send,
{
    let response = client.clone().oneshot(request).await?;
    let (parts, body) = response.into_parts();
    body.collect().await.unwrap();
    Ok(Response::from_parts(parts, ()))
}

/// Sends the calls named `names` on tasks of their own, in that order.
fn spawn_calls<S, B>(
    client: &S,
    names: std::ops::Range<usize>,
) -> Vec<tokio::task::JoinHandle<Result<Response<()>, BoxError>>>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: http_body_util::BodyExt + Send + 'static,
    B::Error: std::fmt::Debug,
    B::Data: Send,
{
    names
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move { send(&client, call(n)).await })
        })
        .collect()
}

/// The backend timeout of the tests on real stores that check what is
/// counted, not how fast: a store call slowed past the 100 ms default by a
/// loaded machine (a fresh pool's first connection, a PostgreSQL commit
/// waiting on fsync) would fail the call closed.
fn patient() -> Window {
    Window::new(Duration::from_secs(5)).unwrap()
}

/// `instances` layers, each with its own backend from `backends`, share a
/// budget of `limit` per `window`: `callers` tasks per instance send calls
/// back to back for `run`. Every call the provider receives was admitted by
/// the store, no window admits more than its limit, every window but the
/// last is used in full, and the store is asked less than twice per call.
async fn instances_share_the_budget<Bk: Heeding>(
    backends: Vec<Recorded<Bk>>,
    limit: u64,
    window: Duration,
    callers: usize,
    run: Duration,
) {
    let provider = Provider::default();
    let quota = Quota::new(limit, window).unwrap();
    let record = backends[0].clone();
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for (instance, backend) in backends.into_iter().enumerate() {
        let client = BudgetLayer::new(NAME, quota)
            .backend(backend)
            .timeout(patient())
            .layer(provider.client());
        for caller in 0..callers {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut sent = 0u64;
                while Instant::now() < end {
                    let request = call(format!("{instance}.{caller}.{sent}"));
                    let answer = tokio::time::timeout_at(end, send(&client, request)).await;
                    match answer {
                        Ok(Ok(_)) => sent += 1,
                        Ok(Err(err)) => panic!("a call failed: {err}"),
                        Err(_) => break,
                    }
                }
                sent
            }));
        }
    }
    let mut sent = 0;
    for task in tasks {
        sent += task.await.unwrap();
    }
    // A call cut by the run's end may have been admitted, not answered.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let windows = record.windows();
    let admitted: u64 = windows.values().sum();
    assert_eq!(
        provider.calls() as u64,
        admitted,
        "every call sent was admitted by the store"
    );
    assert!(sent <= admitted);
    let per_window: Vec<u64> = windows.values().copied().collect();
    assert!(
        per_window.iter().all(|&n| n <= limit),
        "a window past its budget: {per_window:?}"
    );
    assert!(per_window.len() >= 3, "{per_window:?}");
    assert!(
        per_window[..per_window.len() - 1]
            .iter()
            .all(|&n| n == limit),
        "the budget was not used in full: {per_window:?}"
    );
    let calls = record.calls.load(Ordering::Relaxed);
    assert!(
        (calls as f64) < 2.0 * admitted as f64,
        "{calls} store calls for {admitted} admitted calls"
    );
}

fn quota(limit: u64, millis: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(millis)).unwrap()
}

/// Two layers on one memory backend (one process's two clients): the
/// shared budget holds, and is used in full.
async fn two_clients_share_a_memory_budget() {
    let store = Recorded::new(MemoryBackend::new());
    let backends = vec![store.clone(), store];
    instances_share_the_budget(
        backends,
        10,
        Duration::from_millis(300),
        8,
        Duration::from_millis(1_400),
    )
    .await;
}

/// Calls that wait are sent in the order they arrived, and each window
/// sends only the budget.
async fn waiting_calls_go_in_arrival_order() {
    let provider = Provider::default();
    let store = Recorded::new(MemoryBackend::new());
    let client = BudgetLayer::new(NAME, quota(2, 300))
        .backend(store.clone())
        .layer(provider.client());
    let mut tasks = Vec::new();
    for n in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move { send(&client, call(n)).await }));
        // Each one arrives after the one before has joined the line.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let names = provider.names();
    let expected: Vec<String> = (0..8).map(|n| n.to_string()).collect();
    assert_eq!(names, expected, "sent out of arrival order");
    let per_window: Vec<u64> = store.windows().values().copied().collect();
    assert_eq!(per_window, vec![2, 2, 2, 2]);
}

/// A call whose budget cannot return within its max wait, or its own
/// deadline (a `WaitBound::Deadline`, or `grpc-timeout`), fails at once and says when
/// the budget returns; it spends nothing.
async fn a_call_that_cannot_be_served_in_time_fails_at_once() {
    let provider = Provider::default();
    let store = MemoryBackend::new();
    // A window far past every bound below, so that however slow the
    // machine, no call here can be served in time.
    let layer = BudgetLayer::new(NAME, quota(1, 10_000)).backend(store.clone());
    let client = layer.clone().layer(provider.client());
    send(&client, call("first")).await.unwrap();
    let impatient = layer
        .clone()
        .max_wait(Duration::from_secs(1))
        .layer(provider.client());
    let mut deadline = call("deadline");
    deadline.extensions_mut().insert(WaitBound::Deadline(
        std::time::Instant::now() + Duration::from_secs(2),
    ));
    let mut grpc = call("grpc");
    grpc.headers_mut()
        .insert("grpc-timeout", "3S".parse().unwrap());
    let cases: Vec<(&str, _, Request<String>, Duration)> = vec![
        (
            "max wait",
            impatient,
            call("impatient"),
            Duration::from_secs(1),
        ),
        ("deadline", client.clone(), deadline, Duration::from_secs(2)),
        ("grpc-timeout", client.clone(), grpc, Duration::from_secs(3)),
    ];
    for (what, client, request, bound) in cases {
        let started = Instant::now();
        let err = send(&client, request).await.unwrap_err();
        let took = started.elapsed();
        let retry_after = budget_error(&err)
            .retry_after()
            .unwrap_or_else(|| panic!("{what}: {err}"));
        // A call that waited would fail at its bound, not before it.
        assert!(took < bound, "{what}: waited {took:?}, to its bound");
        assert!(
            retry_after > Duration::from_secs(5)
                && retry_after <= Duration::from_secs(10) + DEFAULT_MARGIN,
            "{what}: returns in {retry_after:?}"
        );
    }
    assert_eq!(provider.calls(), 1);
    let stored = store.peek(NAME, &Key::new("*")).await.unwrap().unwrap();
    assert_eq!(stored.count, 1, "the failed calls spent nothing");
}

/// Each call its budget refuses (`Exhausted`) counts once among the keys
/// refused most, by digest; a call served never does.
async fn refused_calls_count_among_the_keys_refused_most() {
    use tower_pinned_window::denied::TopDenied;
    let provider = Provider::default();
    let layer = BudgetLayer::new(NAME, quota(1, 60_000))
        .key(HeaderName::from_static("x-n"))
        .max_wait(Duration::from_millis(100))
        .top_denied(TopDenied::new(4).unwrap());
    let denied = layer.denied_keys().expect("turned on");
    let client = layer.layer(provider.client());
    send(&client, call("alice")).await.unwrap();
    for _ in 0..3 {
        let err = send(&client, call("alice")).await.unwrap_err();
        assert!(
            matches!(budget_error(&err), BudgetError::Exhausted { .. }),
            "{err}"
        );
    }
    send(&client, call("bob")).await.unwrap();
    let top = denied.top(10);
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top[0].digest, denied.digest(&Key::new("alice")));
    assert_eq!((top[0].denied, top[0].error), (3, 0));
    assert_eq!(denied.get(&Key::new("bob")), None, "served, never refused");
    assert_eq!(provider.calls(), 2);
}

/// A call behind more than its wait's worth of queued calls fails at once:
/// the windows it would need are counted.
async fn a_call_behind_too_long_a_line_fails_at_once() {
    let provider = Provider::default();
    let layer = BudgetLayer::new(NAME, quota(2, 500)).max_wait(Duration::from_millis(800));
    let client = layer.layer(provider.client());
    send(&client, call("a")).await.unwrap();
    send(&client, call("b")).await.unwrap();
    // Two wait for the next window, which opens within 500 ms: in time.
    let waiting = spawn_calls(&client, 0..2);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A third needs the window after, 500 ms later: past its 800 ms.
    let started = Instant::now();
    let err = send(&client, call("late")).await.unwrap_err();
    // A call that waited would wait for the next window (about 480 ms).
    let took = started.elapsed();
    assert!(took < Duration::from_millis(400), "waited {took:?}");
    let retry_after = budget_error(&err).retry_after().unwrap();
    assert!(
        retry_after > Duration::from_millis(800),
        "returns in {retry_after:?}"
    );
    for task in waiting {
        task.await.unwrap().unwrap();
    }
    assert_eq!(provider.calls(), 4);
}

/// Another instance takes the window a line waits for: the calls behind
/// its head judge again at once, and one whose bound the windows left
/// cannot meet fails then (one window into its wait), not at its bound.
async fn a_call_fails_as_soon_as_another_instance_takes_its_window() {
    let provider = Provider::default();
    let store = MemoryBackend::new().tokio_clock();
    let window = Duration::from_secs(10);
    // Two layers built apart: two instances, each with its own line.
    let instance = || {
        BudgetLayer::new(NAME, Quota::new(1, window).unwrap())
            .margin(Duration::ZERO)
            .max_wait(Duration::from_secs(25))
            .backend(store.clone())
            .layer(provider.client())
    };
    let (a, b) = (instance(), instance());
    let start = Instant::now();
    send(&a, call("a0")).await.unwrap();
    // a1 waits for the window at 10 s, the head of a's line; a2 behind it
    // needs the one at 20 s, within its 25 s.
    let head = spawn_calls(&a, 1..2);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let behind = {
        let a = a.clone();
        tokio::spawn(async move {
            let answer = send(&a, call(2)).await;
            (answer, Instant::now())
        })
    };
    // b asks the moment the window opens, before a's head wakes (its
    // jitter): a's line misses the window at 10 s.
    tokio::time::sleep_until(start + window).await;
    send(&b, call("b0")).await.unwrap();
    let (answer, failed_at) = behind.await.unwrap();
    let err = answer.unwrap_err();
    let windows_waited = (failed_at - start).as_millis() / window.as_millis();
    assert_eq!(
        windows_waited,
        1,
        "failed {:?} after its start: {err}",
        failed_at - start
    );
    match budget_error(&err) {
        BudgetError::Exhausted {
            retry_after, bound, ..
        } => {
            assert_eq!(*bound, WaitBound::MaxWait(Duration::from_secs(25)));
            // The window at 20 s serves the head; a2's is the one at 30 s.
            assert!(
                failed_at + *retry_after >= start + window * 3,
                "returns in {retry_after:?}"
            );
        }
        other => panic!("{other}"),
    }
    for task in head {
        task.await.unwrap().unwrap();
    }
    assert_eq!(provider.names(), vec!["a0", "b0", "1"]);
}

/// Another instance takes half of every window while a's line waits: once
/// a's line has had two whole windows, its calls are judged at the share it
/// won (with one window won whole beside them), and those that share cannot
/// serve within their bound fail then, not at their bound (nor windows
/// later, as the whole limit would have them); those it can serve are
/// served.
async fn a_call_fails_as_soon_as_its_share_of_the_windows_cannot_serve_it() {
    let provider = Provider::default();
    let store = MemoryBackend::new().tokio_clock();
    let window = Duration::from_secs(10);
    let instance = || {
        BudgetLayer::new(NAME, Quota::new(4, window).unwrap())
            .margin(Duration::ZERO)
            .max_wait(Duration::from_secs(95))
            .backend(store.clone())
            .layer(provider.client())
    };
    let (a, b) = (instance(), instance());
    let start = Instant::now();
    // b takes 2 of every window the moment it opens, before a's head
    // wakes (its jitter); a's line gets the other 2.
    let taker = tokio::spawn(async move {
        for n in 0..10u32 {
            tokio::time::sleep_until(start + window * n).await;
            let (x, y) = tokio::join!(
                send(&b, call(format!("b{n}.0"))),
                send(&b, call(format!("b{n}.1")))
            );
            x.unwrap();
            y.unwrap();
        }
    });
    tokio::task::yield_now().await;
    send(&a, call("a0")).await.unwrap();
    send(&a, call("a1")).await.unwrap();
    // 30 calls wait: at the whole limit (4 a window) all are served by
    // 80 s, within their 95 s; at a's 2 a window, the first 18 are served
    // by 90 s, and the last 12 would need 100 s to 150 s.
    let calls: Vec<_> = (0..30)
        .map(|n| {
            let a = a.clone();
            tokio::spawn(async move {
                let answer = send(&a, call(n)).await;
                (answer, Instant::now())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for (n, task) in calls.into_iter().enumerate() {
        let (answer, at) = task.await.unwrap();
        let answer = answer.map(drop).map_err(|err| match budget_error(&err) {
            BudgetError::Exhausted { bound, .. } => (Some(*bound), err.to_string()),
            other => (None, other.to_string()),
        });
        outcomes.push((n, answer, at - start));
    }
    for (n, answer, after) in &outcomes {
        if *n < 18 {
            assert!(
                answer.is_ok(),
                "call {n} refused after {after:?}: {answer:?}"
            );
        } else {
            let bound = answer.as_ref().err().and_then(|(bound, _)| *bound);
            assert_eq!(
                bound,
                Some(WaitBound::MaxWait(Duration::from_secs(95))),
                "call {n}: {answer:?}"
            );
            // Two whole windows (to 30 s) tell a share; the calls deepest
            // in the line fail then, the others as the share firms up. At
            // the whole limit they would fail from 40 s to 90 s.
            let by = if *n >= 22 { window * 2 } else { window * 6 };
            assert!(
                *after <= by + Duration::from_secs(1),
                "call {n} failed {after:?} after its start, windows late"
            );
        }
    }
    taker.await.unwrap();
}

/// Calls given the provider's quota as it is, under demand above it, so
/// that each window sends its 5 calls at once: those of every other window
/// take 8 ms longer to reach the provider. A provider window opened by slow
/// calls ends 8 ms after ours, and without a margin the fast calls of our
/// next window land in it. `margin` is the layer's; the provider's windows
/// are pinned to the first call each receives.
async fn most_in_a_provider_window(margin: Option<Duration>) -> u64 {
    let store = MemoryBackend::new().tokio_clock();
    let (limit, window) = (5, Duration::from_millis(100));
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let provider = {
        let arrivals = Arc::clone(&arrivals);
        tower::service_fn(move |_: Request<String>| {
            let slow = (sent.fetch_add(1, Ordering::Relaxed) / limit).is_multiple_of(2);
            let arrivals = Arc::clone(&arrivals);
            async move {
                if slow {
                    tokio::time::sleep(Duration::from_millis(8)).await;
                }
                arrivals.lock().unwrap().push(Instant::now());
                Ok::<_, std::convert::Infallible>(Response::new(String::new()))
            }
        })
    };
    let mut layer = BudgetLayer::new(NAME, Quota::new(limit, window).unwrap())
        .backend(store)
        .max_wait(Duration::from_secs(60));
    if let Some(margin) = margin {
        layer = layer.margin(margin);
    }
    let client = layer.layer(provider);
    let end = Instant::now() + Duration::from_secs(3);
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                while Instant::now() < end {
                    send(&client, call("c")).await.unwrap();
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let mut arrivals = arrivals.lock().unwrap().clone();
    arrivals.sort();
    let (mut opened, mut count, mut most) = (None::<Instant>, 0, 0);
    for at in arrivals {
        if opened.is_none_or(|opened| at >= opened + window) {
            (opened, count) = (Some(at), 0);
        }
        count += 1;
        most = most.max(count);
    }
    most
}

/// With the default margin, no provider window receives more than its
/// limit; with none, some do (the test would not catch a margin that does
/// nothing otherwise).
async fn the_default_margin_keeps_each_provider_window_within_its_limit() {
    assert_eq!(most_in_a_provider_window(None).await, 5);
    assert!(
        most_in_a_provider_window(Some(Duration::ZERO)).await > 5,
        "without a margin, the provider's late windows take our next calls"
    );
}

/// A budget error's message names the budget, the bound that was hit and
/// when the budget returns.
async fn budget_errors_say_which_budget_which_bound_and_when() {
    let provider = Provider::default();
    let layer = BudgetLayer::new(NAME, quota(1, 60_000)).max_wait(Duration::from_secs(5));
    let client = layer.clone().layer(provider.client());
    send(&client, call("first")).await.unwrap();
    let mut deadline = call("deadline");
    deadline.extensions_mut().insert(WaitBound::Deadline(
        std::time::Instant::now() + Duration::from_secs(2),
    ));
    let mut grpc = call("grpc");
    grpc.headers_mut()
        .insert("grpc-timeout", "3S".parse().unwrap());
    // A call's own wait shortens the layer's, and never lengthens it.
    let mut shorter = call("shorter");
    shorter
        .extensions_mut()
        .insert(WaitBound::MaxWait(Duration::from_secs(1)));
    let mut longer = call("longer");
    longer
        .extensions_mut()
        .insert(WaitBound::MaxWait(Duration::from_secs(600)));
    let cases = [
        (call("max wait"), "after the call's max_wait of 5s"),
        (deadline, "after the call's Deadline"),
        (grpc, "after the call's grpc-timeout of 3s"),
        (shorter, "after the call's max_wait of 1s"),
        (longer, "after the call's max_wait of 5s"),
    ];
    for (request, bound) in cases {
        let err = send(&client, request).await.unwrap_err();
        let message = err.to_string();
        let retry_after = budget_error(&err).retry_after().unwrap();
        assert_eq!(budget_error(&err).budget(), NAME);
        assert_eq!(
            message,
            format!(r#"budget "provider" is spent: it returns in {retry_after:?}, {bound}"#)
        );
        assert!(retry_after > Duration::from_secs(59), "{message}");
    }
    let shed = layer
        .max_wait(Duration::from_secs(120))
        .max_waiters(0)
        .layer(provider.client());
    let err = send(&shed, call("shed")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"budget "provider": 0 calls (its max_waiters) already wait in this process: the call was shed"#
    );
    let big = BudgetLayer::new(NAME, quota(5, 1_000))
        .cost_fn(|_| 6)
        .layer(provider.client());
    let err = send(&big, call("big")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"budget "provider": a call cost of 6 is above its limit of 5: it could never be sent"#
    );
    let keyed = BudgetLayer::new(NAME, quota(5, 1_000))
        .key(HeaderName::from_static("x-key"))
        .layer(provider.client());
    let err = send(&keyed, call("no key")).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with(r#"budget "provider": the call's key could not be read: "#),
        "{err}"
    );
    assert_eq!(provider.calls(), 1);
}

/// Beyond `max_waiters` waiting calls, a call is shed at once; the ones
/// waiting are still served.
async fn calls_past_max_waiters_are_shed() {
    let provider = Provider::default();
    let client = BudgetLayer::new(NAME, quota(1, 300))
        .max_waiters(2)
        .layer(provider.client());
    send(&client, call("first")).await.unwrap();
    let waiting = spawn_calls(&client, 0..2);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    let err = send(&client, call("shed")).await.unwrap_err();
    assert!(
        matches!(budget_error(&err), BudgetError::Overloaded { .. }),
        "{err}"
    );
    // Not shed, it would wait for the next window (about 280 ms).
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "waited {took:?}");
    for task in waiting {
        task.await.unwrap().unwrap();
    }
    assert_eq!(provider.calls(), 3);
}

/// A call dropped while it waits spends nothing and holds nobody up.
async fn a_call_dropped_while_waiting_spends_nothing() {
    let provider = Provider::default();
    let store = MemoryBackend::new();
    let client = BudgetLayer::new(NAME, quota(1, 300))
        .backend(store.clone())
        .layer(provider.client());
    send(&client, call("first")).await.unwrap();
    let dropped = {
        let client = client.clone();
        tokio::spawn(async move { send(&client, call("dropped")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let behind = {
        let client = client.clone();
        tokio::spawn(async move { send(&client, call("behind")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let started = Instant::now();
    behind.await.unwrap().unwrap();
    // Served in the next window (about 260 ms); held up by the dropped
    // call, it would go in the one after (about 560 ms).
    let took = started.elapsed();
    assert!(took < Duration::from_millis(480), "served after {took:?}");
    assert_eq!(provider.names(), vec!["first", "behind"]);
    let stored = store.peek(NAME, &Key::new("*")).await.unwrap().unwrap();
    assert_eq!(stored.count, 1, "only the call sent spent");
}

/// A reservation is spent on the way out, all or nothing, and the answer's
/// usage settles it in its window: a refund lets the next call in, a
/// charge above it takes more, and an unreadable usage keeps it and is
/// logged once.
async fn a_reservation_settles_to_the_usage<Bk: Heeding>(store: Bk) {
    let provider = Provider::default();
    let estimate = |head: &tower_pinned_window::key::RequestHead<'_>| {
        head.headers()
            .get("x-max")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0)
    };
    let usage = |end: &tower_pinned_window::outcome::ResponseHead<'_>| -> Option<u64> {
        end.headers().get("x-usage")?.to_str().ok()?.parse().ok()
    };
    let client = BudgetLayer::new(NAME, quota(1_000, 60_000))
        .backend(store.clone())
        .timeout(patient())
        .key(HeaderName::from_static("x-key"))
        .reserve(estimate)
        .charge(usage)
        .max_wait(Duration::ZERO)
        .layer(provider.client());
    let request = |key: &str, max: u64, used: Option<u64>| {
        let mut builder = Request::builder()
            .header("x-key", key)
            .header("x-max", max.to_string());
        if let Some(used) = used {
            builder = builder.header("x-use", used.to_string());
        }
        builder.body(String::new()).unwrap()
    };
    // A settle that goes out finishes on its own task: wait until `key`'s
    // count is `want`, and fail when it is not after ten seconds.
    let settled = |key: &'static str, want: u64, what: &'static str| {
        let store = store.clone();
        async move {
            let start = std::time::Instant::now();
            loop {
                let now = store
                    .peek(NAME, &Key::new(key))
                    .await
                    .unwrap()
                    .map_or(0, |hit| hit.count);
                if now == want {
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{what}: the count is {now}, not {want}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // 300 reserved, 120 used: 120 stays.
    send(&client, request("a", 300, Some(120))).await.unwrap();
    settled("a", 120, "120 used of 300 reserved").await;
    // 300 reserved, 450 used: 450 more.
    send(&client, request("a", 300, Some(450))).await.unwrap();
    settled("a", 570, "450 used of 300 reserved").await;
    // 430 left: a reservation of 500 does not fit.
    let err = send(&client, request("a", 500, Some(1))).await.unwrap_err();
    assert!(budget_error(&err).retry_after().is_some(), "{err}");
    // Anything it had spent would show at once: its reservation is counted
    // before the call goes out.
    settled("a", 570, "a call turned away spends nothing").await;
    // Reservations never pass the budget, whatever the answers say: three
    // of 300 fit on a fresh key, the fourth does not.
    for _ in 0..3 {
        send(&client, request("b", 300, Some(300))).await.unwrap();
    }
    assert!(send(&client, request("b", 300, Some(300))).await.is_err());
    settled("b", 900, "three reservations of 300").await;
    // No usage: the reservation stands, and it is logged once.
    let capture = support::logs::Capture::start(tracing::level_filters::LevelFilter::WARN);
    for _ in 0..2 {
        send(&client, request("c", 200, None)).await.unwrap();
    }
    let lines = capture.lines();
    drop(capture);
    settled("c", 400, "two reservations that stand").await;
    let logged = lines
        .iter()
        .filter(|line| line.contains("could not read the answer's usage"))
        .count();
    assert_eq!(logged, 1, "{lines:?}");
}

/// Two instances (`a`, `b`: backends on connections of their own, one
/// store) reserve from a budget of 1,000: A's call reserves it all and its
/// answer is held; B's reservation of 100 is turned away (and B's deny
/// cache learns the key is full); A's answer settles to 100; once B's
/// `recheck` bound has passed, B's reservation is sent, not turned away
/// until the window ends.
async fn a_settle_frees_the_budget_on_another_instance<Bk: Heeding>(
    a: Bk,
    b: Bk,
    recheck: Duration,
) {
    let provider = Provider::default();
    let client = |backend: Bk| {
        BudgetLayer::new(NAME, quota(1_000, 60_000))
            .backend(backend)
            .timeout(patient())
            .key(HeaderName::from_static("x-key"))
            .reserve(|head: &tower_pinned_window::key::RequestHead<'_>| {
                head.headers()
                    .get("x-max")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0)
            })
            .charge(
                |end: &tower_pinned_window::outcome::ResponseHead<'_>| -> Option<u64> {
                    end.headers().get("x-usage")?.to_str().ok()?.parse().ok()
                },
            )
            .max_wait(Duration::ZERO)
            .layer(provider.client())
    };
    let (on_a, on_b) = (client(a.clone()), client(b));
    let request = |max: u64| {
        Request::builder()
            .header("x-key", "shared")
            .header("x-max", max.to_string())
            .header("x-use", "100")
            .body(String::new())
            .unwrap()
    };
    let held = on_a.clone().oneshot(request(1_000)).await.unwrap();
    let err = send(&on_b, request(100)).await.unwrap_err();
    assert!(budget_error(&err).retry_after().is_some(), "{err}");
    // A's answer ends: settled to 100.
    http_body_util::BodyExt::collect(held.into_body())
        .await
        .unwrap();
    let key = Key::new("shared");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.peek(NAME, &key).await.unwrap().map(|hit| hit.count) != Some(100) {
        assert!(Instant::now() < deadline, "A's settle never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(recheck + Duration::from_millis(20)).await;
    send(&on_b, request(100))
        .await
        .expect("B sends what A freed");
    assert_eq!(provider.calls(), 2);
}

async fn a_reservation_settles_in_memory() {
    a_reservation_settles_to_the_usage(MemoryBackend::new()).await;
}

/// A call whose cost is above the budget fails at once; bad settings are
/// refused when the layer is built.
async fn impossible_calls_and_bad_settings_are_refused() {
    let provider = Provider::default();
    let client = BudgetLayer::new(NAME, quota(5, 1_000))
        .cost_fn(|_| 6)
        .layer(provider.client());
    let err = send(&client, call("big")).await.unwrap_err();
    assert!(
        matches!(
            budget_error(&err),
            BudgetError::NeverFits {
                cost: 6,
                limit: 5,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(provider.calls(), 0);
    let layer = BudgetLayer::new(NAME, quota(5, 1_000));
    assert_eq!(
        layer.clone().cost(6).check(),
        Err(ConfigError::CostAboveLimit { cost: 6, limit: 5 })
    );
    assert_eq!(
        layer.clone().reserve(|_| 1).check(),
        Err(ConfigError::ReserveWithoutCharge)
    );
    assert!(layer.clone().reserve(|_| 1).charge(|_| 1).check().is_ok());
    for both in [
        layer.clone().cost(1).reserve(|_| 1).charge(|_| 1),
        layer.clone().reserve(|_| 1).charge(|_| 1).cost_fn(|_| 1),
    ] {
        assert_eq!(both.check(), Err(ConfigError::ReserveWithCost));
    }
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)).unwrap_err(),
        ConfigError::ZeroLimit
    );
    assert_eq!(
        Quota::new(1, Duration::ZERO).unwrap_err(),
        ConfigError::NonPositiveWindow
    );
    assert!(BudgetLayer::try_new("has space", quota(5, 1_000)).is_err());
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer.cost(6).layer(provider.client())
    }));
    assert!(built.is_err(), "a layer that cannot work is not built");
}

/// How stale a layer's copy of the limits held in the store may be, in the
/// tests of those limits.
const STALENESS: Duration = Duration::from_millis(100);

/// How long a test of limits held in the store waits for what it expects
/// (a limit read by another instance, waiting calls served) before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A call charged to the budget key `key`, of `cost` (`x-cost`).
fn keyed(key: &str, cost: u64) -> Request<String> {
    Request::builder()
        .header("x-key", key)
        .header("x-cost", cost.to_string())
        .body(String::new())
        .unwrap()
}

/// The cost a call says in `x-cost`.
fn cost_of(request: &tower_pinned_window::key::RequestHead<'_>) -> u64 {
    request
        .headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// Calls of `key` and `cost` sent one after the other until the budget
/// refuses one (it must be `Exhausted`: the budget, not the store), or
/// `most` were admitted: how many were admitted.
async fn admitted_until_refused<S, B>(client: &S, key: &str, cost: u64, most: u64) -> u64
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
    B: http_body_util::BodyExt + Send,
    B::Error: std::fmt::Debug,
    B::Data: Send,
{
    let mut admitted = 0;
    while admitted < most {
        match send(client, keyed(key, cost)).await {
            Ok(_) => admitted += 1,
            Err(err) => {
                assert!(
                    matches!(budget_error(&err), BudgetError::Exhausted { .. }),
                    "{err}"
                );
                break;
            }
        }
    }
    admitted
}

/// Fresh keys (`prefix` and a number) tried one after the other until one
/// is admitted exactly `expected` calls of `cost`: the instance of `client`
/// has read the limit that gives it. Fails after [`PATIENCE`].
async fn until_fresh_keys_get<S, B>(client: &S, prefix: &str, cost: u64, expected: u64)
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
    B: http_body_util::BodyExt + Send,
    B::Error: std::fmt::Debug,
    B::Data: Send,
{
    let give_up = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    for n in 0.. {
        let got = admitted_until_refused(client, &format!("{prefix}{n}"), cost, expected + 1).await;
        if got == expected {
            return;
        }
        seen.push(got);
        assert!(
            Instant::now() < give_up,
            "{prefix}: never {expected} within {PATIENCE:?}: {seen:?}"
        );
        tokio::time::sleep(STALENESS / 4).await;
    }
}

/// Limits held in the store change an outbound budget, on two instances
/// (`one` and `two`, each with its own backend and its own `LimitBook`),
/// with the count kept: a lowered key limit stops the key's calls at once
/// on the other instance (not at the old limit, and not with a fresh
/// budget), a key's limit beats the budget's, clearing returns to the
/// quota as built, a raised limit lets calls that wait for the window's
/// end go before it ends, and a tokens budget reads its own limits under
/// its own name.
async fn stored_limits_change_the_budget<Bk: Heeding + Limits>(one: Bk, two: Bk) {
    let provider = Provider::default();
    let minute = |n| Quota::new(n, Duration::from_secs(60)).unwrap();
    let books = [
        LimitBook::new(&one, STALENESS).unwrap(),
        LimitBook::new(&two, STALENESS).unwrap(),
    ];
    let name = "stored";
    // A refused call fails at once: a window of a minute is past its wait.
    let budget = |backend: Bk, book: &LimitBook| {
        BudgetLayer::new(name, minute(30))
            .backend(backend)
            .key(HeaderName::from_static("x-key"))
            .max_wait(Duration::from_secs(2))
            .timeout(patient())
            .limits(book.clone())
            .layer(provider.client())
    };
    let (a, b) = (
        budget(one.clone(), &books[0]),
        budget(two.clone(), &books[1]),
    );

    // Lowered: "k" at 6 of 30 gets a limit of 4, set by instance one.
    // Instance two reads it within its staleness bound, and instance one
    // from its next call's read (that call is judged by the copy it finds),
    // and both stop the key: far before the old limit (their calls are
    // spaced so that 24 stale ones take more than ten bounds), and for
    // good, since 6 > 4.
    for _ in 0..6 {
        send(&a, keyed("k", 1)).await.unwrap();
    }
    let k = Key::new("k");
    books[0]
        .set(name, LimitScope::Key(&k), minute(4))
        .await
        .unwrap();
    let mut stale = 0;
    for (instance, client) in [("two", &b), ("one", &a)] {
        loop {
            match send(client, keyed("k", 1)).await {
                Ok(_) => stale += 1,
                Err(err) => {
                    assert!(
                        matches!(budget_error(&err), BudgetError::Exhausted { .. }),
                        "{err}"
                    );
                    break;
                }
            }
            assert!(stale < 24, "instance {instance} never read the lower limit");
            tokio::time::sleep(STALENESS / 2).await;
        }
    }
    for client in [&a, &b] {
        assert_eq!(
            admitted_until_refused(client, "k", 1, 30).await,
            0,
            "the count is kept: no fresh budget of 4"
        );
    }

    // A key's limit beats the budget's. The key's is set first, so a read
    // that has the budget's has the key's too.
    books[0]
        .set(name, LimitScope::Key(&Key::new("big")), minute(6))
        .await
        .unwrap();
    books[0]
        .set(name, LimitScope::Layer, minute(3))
        .await
        .unwrap();
    until_fresh_keys_get(&b, "layer-", 1, 3).await;
    assert_eq!(admitted_until_refused(&b, "big", 1, 30).await, 6);

    // Cleared: the quota as built applies again, with the count kept.
    books[0].clear(name, LimitScope::Layer).await.unwrap();
    books[0]
        .clear(name, LimitScope::Key(&Key::new("big")))
        .await
        .unwrap();
    until_fresh_keys_get(&b, "cleared-", 1, 30).await;
    assert_eq!(
        admitted_until_refused(&b, "big", 1, 30).await,
        24,
        "6 of 30 spent"
    );

    // A tokens budget reads its own limits, under its own name: the
    // budget's of 20 tokens, and a key's of 10 (set first).
    let tokens = |backend: Bk, book: &LimitBook| {
        BudgetLayer::new("calls", minute(100))
            .tokens("tokens", minute(50))
            .cost_fn(cost_of)
            .backend(backend)
            .key(HeaderName::from_static("x-key"))
            .max_wait(Duration::from_secs(2))
            .timeout(patient())
            .limits(book.clone())
            .layer(provider.client())
    };
    let (ta, tb) = (
        tokens(one.clone(), &books[0]),
        tokens(two.clone(), &books[1]),
    );
    assert_eq!(admitted_until_refused(&tb, "t-before", 5, 20).await, 10);
    let t = Key::new("t");
    books[0]
        .set("tokens", LimitScope::Key(&t), minute(10))
        .await
        .unwrap();
    books[0]
        .set("tokens", LimitScope::Layer, minute(20))
        .await
        .unwrap();
    until_fresh_keys_get(&tb, "t-layer-", 5, 4).await;
    assert_eq!(admitted_until_refused(&tb, "t", 5, 20).await, 2);
    // Instance one reads them too.
    until_fresh_keys_get(&ta, "t-one-", 5, 4).await;

    // Raised: calls that wait for the end of a 20 s window go before it
    // ends once the budget's limit is raised on the other instance. The
    // store's windows say so, not a clock: all 13 calls are counted in the
    // window of the first.
    let window = Duration::from_secs(20);
    let record = Recorded::new(one.clone());
    let waiting = |backend, book: &LimitBook| {
        BudgetLayer::new("raised", Quota::new(10, window).unwrap())
            .backend(backend)
            .key(HeaderName::from_static("x-key"))
            .max_wait(Duration::from_secs(30))
            .timeout(patient())
            .limits(book.clone())
            .layer(provider.client())
    };
    let wa = waiting(record.clone(), &books[0]);
    let wb = waiting(record.beside(two.clone()), &books[1]);
    for _ in 0..10 {
        send(&wa, keyed("w", 1)).await.unwrap();
    }
    let asked = record.calls.load(Ordering::Relaxed);
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let client = wb.clone();
            tokio::spawn(async move { send(&client, keyed("w", 1)).await })
        })
        .collect();
    // The store turned the first of them away: they wait.
    let give_up = Instant::now() + PATIENCE;
    while record.calls.load(Ordering::Relaxed) == asked {
        assert!(Instant::now() < give_up, "the waiting calls never asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    books[0]
        .set("raised", LimitScope::Layer, Quota::new(13, window).unwrap())
        .await
        .unwrap();
    for call in calls {
        tokio::time::timeout(PATIENCE, call)
            .await
            .expect("a raised limit lets the waiting calls go")
            .unwrap()
            .unwrap();
    }
    let per_window: Vec<u64> = record.windows().values().copied().collect();
    assert_eq!(per_window, vec![13], "before the window's end");
}

async fn stored_limits_change_a_memory_budget() {
    let store = MemoryBackend::new();
    stored_limits_change_the_budget(store.clone(), store).await;
}

mod stores {
    use super::*;

    use redis::aio::ConnectionManager;
    use support::redis::{RedisCluster, RedisServer, SENTINEL_MASTER, SentinelGroup};
    use tower_pinned_window_postgres::PostgresBackend;
    use tower_pinned_window_redis::connection::SentinelConnection;
    use tower_pinned_window_redis::{DEFAULT_DENY_CACHE_RECHECK, RedisBackend};

    const LIMIT: u64 = 10;
    const WINDOW: Duration = Duration::from_millis(400);
    /// Five windows of 420 ms (the window and the default margin) open at
    /// 0, 420, 840, 1,260 and 1,680 ms: the run ends 320 ms into the fifth,
    /// so a slow store still fills it. At 1,800 ms a store slowed by a
    /// loaded machine could fill 2 of its 10 in the 120 ms left, and its
    /// heads' asks made the store's calls per admitted call look like 2.2
    /// (1.7 to 1.9 otherwise).
    const RUN: Duration = Duration::from_millis(2_000);

    async fn manager(server: &RedisServer) -> ConnectionManager {
        server.client().get_connection_manager().await.unwrap()
    }

    /// Two instances, each with its own connection to one Redis.
    pub async fn two_instances_share_a_redis_budget() {
        let server = redis_or_skip!(RedisServer::start("two_instances_share_a_redis_budget"));
        let first = Recorded::new(RedisBackend::new(manager(&server).await));
        let second = first.beside(RedisBackend::new(manager(&server).await));
        instances_share_the_budget(vec![first, second], LIMIT, WINDOW, 8, RUN).await;
        // Every counter has its lifetime.
        let keys = server.cmd(&["--scan"]).unwrap();
        for key in keys.lines().filter(|k| !k.is_empty()) {
            let ttl = server.cmd(&["PTTL", key]).unwrap();
            assert_ne!(ttl.trim(), "-1", "{key} has no lifetime");
        }
    }

    /// The same on a Redis Cluster.
    pub async fn two_instances_share_a_cluster_budget() {
        let cluster = redis_or_skip!(RedisCluster::start("two_instances_share_a_cluster_budget"));
        let first = Recorded::new(RedisBackend::connect_cluster(cluster.urls()).await.unwrap());
        let second = first.beside(RedisBackend::connect_cluster(cluster.urls()).await.unwrap());
        instances_share_the_budget(vec![first, second], LIMIT, WINDOW, 8, RUN).await;
    }

    /// The same behind Sentinel.
    pub async fn two_instances_share_a_sentinel_budget() {
        let group = redis_or_skip!(SentinelGroup::start(
            "two_instances_share_a_sentinel_budget"
        ));
        let connect = || async {
            SentinelConnection::connect(group.sentinel_urls(), SENTINEL_MASTER)
                .await
                .unwrap()
        };
        let first = Recorded::new(RedisBackend::new(connect().await));
        let second = first.beside(RedisBackend::new(connect().await));
        instances_share_the_budget(vec![first, second], LIMIT, WINDOW, 8, RUN).await;
    }

    /// The same on PostgreSQL, each instance with its own pool.
    pub async fn two_instances_share_a_postgres_budget() {
        let Some(schema) =
            support::postgres::TestSchema::create("two_instances_share_a_postgres_budget").await
        else {
            return;
        };
        let first = Recorded::new(schema.backend().await);
        let second: Recorded<PostgresBackend> = first.beside(schema.backend().await);
        instances_share_the_budget(vec![first, second], LIMIT, WINDOW, 8, RUN).await;
    }

    pub async fn stored_limits_change_a_redis_budget() {
        let server = redis_or_skip!(RedisServer::start("stored_limits_change_a_redis_budget"));
        let (one, two) = (manager(&server).await, manager(&server).await);
        stored_limits_change_the_budget(RedisBackend::new(one), RedisBackend::new(two)).await;
    }

    pub async fn stored_limits_change_a_postgres_budget() {
        let Some(schema) =
            support::postgres::TestSchema::create("stored_limits_change_a_postgres_budget").await
        else {
            return;
        };
        let (one, two) = (schema.backend().await, schema.backend().await);
        stored_limits_change_the_budget(one, two).await;
    }

    pub async fn a_reservation_settles_on_redis() {
        let server = redis_or_skip!(RedisServer::start("a_reservation_settles_on_redis"));
        a_reservation_settles_to_the_usage(RedisBackend::new(manager(&server).await)).await;
    }

    pub async fn a_settle_frees_redis_budget_on_another_instance() {
        let server = redis_or_skip!(RedisServer::start("a_settle_frees_on_another"));
        let a = RedisBackend::new(manager(&server).await);
        let b = RedisBackend::new(manager(&server).await);
        a_settle_frees_the_budget_on_another_instance(a, b, DEFAULT_DENY_CACHE_RECHECK).await;
    }

    pub async fn a_settle_frees_postgres_budget_on_another_instance() {
        let Some(schema) = support::postgres::TestSchema::create("a_settle_frees_on_another").await
        else {
            return;
        };
        let (a, b) = (schema.backend().await, schema.backend().await);
        let recheck = tower_pinned_window_postgres::DEFAULT_DENY_CACHE_RECHECK;
        a_settle_frees_the_budget_on_another_instance(a, b, recheck).await;
    }

    pub async fn a_reservation_settles_on_postgres() {
        let Some(schema) =
            support::postgres::TestSchema::create("a_reservation_settles_on_postgres").await
        else {
            return;
        };
        a_reservation_settles_to_the_usage(schema.backend().await).await;
    }

    /// A call of cost 3 whose spend Redis counted but whose reply a proxy
    /// dropped fails with `BudgetError::Backend`, is never sent, and keeps
    /// no cost: the stored count is the one before it.
    pub async fn a_call_failed_by_a_lost_reply_keeps_no_cost() {
        let server = redis_or_skip!(RedisServer::start(
            "a_call_failed_by_a_lost_reply_keeps_no_cost"
        ));
        let proxy = support::drop_reply::DropReply::start(server.port()).await;
        let through = redis::Client::open(format!("redis://127.0.0.1:{}/", proxy.port())).unwrap();
        let backend = RedisBackend::builder(through.get_connection_manager().await.unwrap())
            .deny_cache(0)
            .build();
        let provider = Provider::default();
        let client = BudgetLayer::new(NAME, quota(10, 60_000))
            .backend(backend.clone())
            .cost(3)
            .max_wait(Duration::ZERO)
            .layer(provider.client());
        send(&client, call(1)).await.unwrap();

        proxy.drop_next_reply();
        let err = send(&client, call(2)).await.unwrap_err();
        assert!(budget_error(&err).backend_kind().is_some(), "{err}");
        assert_eq!(proxy.dropped(), 1);
        assert_eq!(provider.calls(), 1);
        let stored = String::from_utf8(backend.storage_key(NAME, &Key::new("*"))).unwrap();
        let mut count = String::new();
        for _ in 0..100 {
            count = server.cmd(&["GET", &stored]).unwrap().trim().to_owned();
            if count == "3" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(count, "3", "the failed call's 3 stay counted");
    }

    /// While Redis is down: fail closed fails the call, fail open sends it
    /// uncounted, insurance counts the instance's share in this process;
    /// a corrupt counter stops the call under every policy and stays.
    pub async fn outages_follow_the_failure_policy() {
        let mut server = redis_or_skip!(RedisServer::start("outages_follow_the_failure_policy"));
        let backend = RedisBackend::new(manager(&server).await);
        let provider = Provider::default();
        let layer = BudgetLayer::new(NAME, quota(4, 60_000))
            .backend(backend.clone())
            .max_wait(Duration::ZERO);
        // A corrupt counter.
        let stored = String::from_utf8(backend.storage_key(NAME, &Key::new("*"))).unwrap();
        server.cmd(&["SET", &stored, "not-a-number"]).unwrap();
        for policy in [
            FailurePolicy::FailClosed,
            FailurePolicy::FailOpen,
            FailurePolicy::Insurance(Share::one_in(2).unwrap()),
        ] {
            let client = layer.clone().on_failure(policy).layer(provider.client());
            let err = send(&client, call("corrupt")).await.unwrap_err();
            assert!(
                budget_error(&err).backend_kind() == Some("corrupt"),
                "{policy:?}: {err}"
            );
        }
        assert_eq!(
            server.cmd(&["GET", &stored]).unwrap().trim(),
            "not-a-number"
        );
        assert_eq!(provider.calls(), 0);
        server.stop();
        let closed = layer.clone().layer(provider.client());
        let err = send(&closed, call("closed")).await.unwrap_err();
        assert!(budget_error(&err).backend_kind().is_some(), "{err}");
        assert!(
            err.to_string()
                .starts_with(r#"budget "provider" could not be checked: "#),
            "{err}"
        );
        assert_eq!(provider.calls(), 0);
        let open = layer
            .clone()
            .on_failure(FailurePolicy::FailOpen)
            .layer(provider.client());
        for n in 0..6 {
            send(&open, call(n)).await.unwrap();
        }
        assert_eq!(provider.calls(), 6, "fail open sends every call");
        let insured = layer
            .on_failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()))
            .layer(provider.client());
        let answers = [
            send(&insured, call("i0")).await.is_ok(),
            send(&insured, call("i1")).await.is_ok(),
            send(&insured, call("i2")).await.is_ok(),
        ];
        assert_eq!(answers, [true, true, false], "half of 4 in this process");
        assert_eq!(provider.calls(), 8);
        server.restart();
    }

    /// Under `FailurePolicy::Insurance`, the instance's share is taken of
    /// the limit held in the store (read while the store was up), not of
    /// the quota the layer was built with.
    pub async fn insurance_takes_its_share_of_a_stored_limit() {
        let mut server = redis_or_skip!(RedisServer::start("insurance_of_a_stored_limit"));
        let backend = RedisBackend::new(manager(&server).await);
        let book = LimitBook::new(&backend, STALENESS).unwrap();
        let provider = Provider::default();
        let client = BudgetLayer::new(NAME, quota(4, 60_000))
            .backend(backend)
            .key(HeaderName::from_static("x-key"))
            .max_wait(Duration::from_secs(2))
            .on_failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()))
            .limits(book.clone())
            .layer(provider.client());
        book.set(NAME, LimitScope::Layer, quota(8, 60_000))
            .await
            .unwrap();
        until_fresh_keys_get(&client, "up-", 1, 8).await;
        server.stop();
        assert_eq!(
            admitted_until_refused(&client, "down", 1, 8).await,
            4,
            "half of the stored 8 in this process, not half of 4"
        );
        server.restart();
    }
}

fn main() {
    let trials = vec![
        trial::multi(
            "two_clients_share_a_memory_budget",
            Needs::Nothing,
            two_clients_share_a_memory_budget,
        ),
        trial::multi(
            "waiting_calls_go_in_arrival_order",
            Needs::Nothing,
            waiting_calls_go_in_arrival_order,
        ),
        trial::multi(
            "a_call_that_cannot_be_served_in_time_fails_at_once",
            Needs::Nothing,
            a_call_that_cannot_be_served_in_time_fails_at_once,
        ),
        trial::multi(
            "refused_calls_count_among_the_keys_refused_most",
            Needs::Nothing,
            refused_calls_count_among_the_keys_refused_most,
        ),
        trial::multi(
            "a_call_behind_too_long_a_line_fails_at_once",
            Needs::Nothing,
            a_call_behind_too_long_a_line_fails_at_once,
        ),
        trial::paused(
            "a_call_fails_as_soon_as_another_instance_takes_its_window",
            Needs::Nothing,
            a_call_fails_as_soon_as_another_instance_takes_its_window,
        ),
        trial::paused(
            "a_call_fails_as_soon_as_its_share_of_the_windows_cannot_serve_it",
            Needs::Nothing,
            a_call_fails_as_soon_as_its_share_of_the_windows_cannot_serve_it,
        ),
        trial::paused(
            "the_default_margin_keeps_each_provider_window_within_its_limit",
            Needs::Nothing,
            the_default_margin_keeps_each_provider_window_within_its_limit,
        ),
        trial::multi(
            "budget_errors_say_which_budget_which_bound_and_when",
            Needs::Nothing,
            budget_errors_say_which_budget_which_bound_and_when,
        ),
        trial::multi(
            "calls_past_max_waiters_are_shed",
            Needs::Nothing,
            calls_past_max_waiters_are_shed,
        ),
        trial::multi(
            "a_call_dropped_while_waiting_spends_nothing",
            Needs::Nothing,
            a_call_dropped_while_waiting_spends_nothing,
        ),
        trial::current(
            "a_reservation_settles_in_memory",
            Needs::Nothing,
            a_reservation_settles_in_memory,
        ),
        trial::multi(
            "impossible_calls_and_bad_settings_are_refused",
            Needs::Nothing,
            impossible_calls_and_bad_settings_are_refused,
        ),
        trial::multi(
            "stored_limits_change_a_memory_budget",
            Needs::Nothing,
            stored_limits_change_a_memory_budget,
        ),
        trial::multi(
            "stored_limits_change_a_redis_budget",
            Needs::Redis,
            stores::stored_limits_change_a_redis_budget,
        ),
        trial::multi(
            "stored_limits_change_a_postgres_budget",
            Needs::Postgres,
            stores::stored_limits_change_a_postgres_budget,
        ),
        trial::multi(
            "insurance_takes_its_share_of_a_stored_limit",
            Needs::Redis,
            stores::insurance_takes_its_share_of_a_stored_limit,
        ),
        trial::multi(
            "two_instances_share_a_redis_budget",
            Needs::Redis,
            stores::two_instances_share_a_redis_budget,
        ),
        trial::multi(
            "two_instances_share_a_cluster_budget",
            Needs::Redis,
            stores::two_instances_share_a_cluster_budget,
        ),
        trial::multi(
            "two_instances_share_a_sentinel_budget",
            Needs::Redis,
            stores::two_instances_share_a_sentinel_budget,
        ),
        trial::multi(
            "two_instances_share_a_postgres_budget",
            Needs::Postgres,
            stores::two_instances_share_a_postgres_budget,
        ),
        trial::current(
            "a_reservation_settles_on_redis",
            Needs::Redis,
            stores::a_reservation_settles_on_redis,
        ),
        trial::current(
            "a_reservation_settles_on_postgres",
            Needs::Postgres,
            stores::a_reservation_settles_on_postgres,
        ),
        trial::multi(
            "a_settle_frees_the_budget_on_another_instance::redis",
            Needs::Redis,
            stores::a_settle_frees_redis_budget_on_another_instance,
        ),
        trial::multi(
            "a_settle_frees_the_budget_on_another_instance::postgres",
            Needs::Postgres,
            stores::a_settle_frees_postgres_budget_on_another_instance,
        ),
        trial::multi(
            "a_call_failed_by_a_lost_reply_keeps_no_cost",
            Needs::Redis,
            stores::a_call_failed_by_a_lost_reply_keeps_no_cost,
        ),
        trial::multi(
            "outages_follow_the_failure_policy",
            Needs::Redis,
            stores::outages_follow_the_failure_policy,
        ),
    ];
    trial::run(trials, ());
}
