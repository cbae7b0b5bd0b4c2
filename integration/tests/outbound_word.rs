//! The provider's word (`outbound::BudgetLayer::heed`): a provider's 429
//! with `Retry-After`, and its rate-limit headers, become shared state that
//! every instance of a client honours. On the memory backend (two layers
//! on one backend stand for two instances), and on real Redis (standalone,
//! Cluster, Sentinel) and PostgreSQL servers, each instance with its own
//! connection.
//!
//! The provider is a tower service in this process that answers what each
//! test tells it to, and notes when each call reached it. The stores are
//! wrapped (`Counting`) to count their calls: what the provider's word
//! costs in store calls is part of what is tested.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Heeding, Hit, Hits, MemoryBackend, Spend, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::outbound::{BudgetLayer, Reader};
use tower_pinned_window::{Quota, Window};
use trial::Needs;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A store that counts its calls, and can be told to refuse the provider's
/// word (as a store that is down would).
#[derive(Clone)]
struct Counting<Bk> {
    inner: Bk,
    spends: Arc<AtomicU64>,
    closes: Arc<AtomicU64>,
    raises: Arc<AtomicU64>,
    /// The counters of the last spend.
    last_counters: Arc<AtomicU64>,
    refuse_words: Arc<AtomicBool>,
}

impl<Bk> Counting<Bk> {
    fn new(inner: Bk) -> Self {
        Self {
            inner,
            spends: Arc::default(),
            closes: Arc::default(),
            raises: Arc::default(),
            last_counters: Arc::default(),
            refuse_words: Arc::default(),
        }
    }

    /// Another store's wrapper, counting in the same place.
    fn beside<Other>(&self, inner: Other) -> Counting<Other> {
        Counting {
            inner,
            spends: Arc::clone(&self.spends),
            closes: Arc::clone(&self.closes),
            raises: Arc::clone(&self.raises),
            last_counters: Arc::clone(&self.last_counters),
            refuse_words: Arc::clone(&self.refuse_words),
        }
    }

    fn words(&self) -> u64 {
        self.closes.load(Ordering::Relaxed) + self.raises.load(Ordering::Relaxed)
    }
}

impl<Bk: Backend> Backend for Counting<Bk> {
    type Future = Bk::Future;
    type Refund = Bk::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Bk::Future {
        self.inner.hit_all(key, counters)
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

impl<Bk: Spending> Spending for Counting<Bk> {
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Bk::Future {
        self.spends.fetch_add(1, Ordering::Relaxed);
        self.last_counters
            .store(counters.len() as u64, Ordering::Relaxed);
        self.inner.spend_all(key, counters, spend)
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund {
        self.inner.amend(namespace, key, hit, amend)
    }
}

impl<Bk: Heeding> Heeding for Counting<Bk> {
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<Bk> {
        self.closes.fetch_add(1, Ordering::Relaxed);
        // Refused, it never reaches the store (the memory backend writes
        // when called).
        let write = (!self.refuse_words.load(Ordering::Relaxed))
            .then(|| self.inner.close(namespace, key, span));
        async move {
            match write {
                Some(write) => write.await,
                None => Err(BackendError::Unavailable("refused by the test".into())),
            }
        }
    }

    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<Bk> {
        self.raises.fetch_add(1, Ordering::Relaxed);
        let write = (!self.refuse_words.load(Ordering::Relaxed))
            .then(|| self.inner.raise(key, counter, count, within));
        async move {
            match write {
                Some(write) => write.await,
                None => Err(BackendError::Unavailable("refused by the test".into())),
            }
        }
    }
}

/// A store whose spend answers can be held back: the store decides a spend
/// when it is asked, and the answer of a held one reaches the layer only
/// when the test releases it, as a reply in flight over a network does.
#[derive(Clone)]
struct Late<Bk> {
    inner: Bk,
    spends: Arc<AtomicU64>,
    /// The next spend's answer is held.
    hold: Arc<AtomicBool>,
    /// Spends whose answers were held.
    held: Arc<AtomicU64>,
    release: Arc<tokio::sync::Semaphore>,
}

impl<Bk> Late<Bk> {
    fn new(inner: Bk) -> Self {
        Self {
            inner,
            spends: Arc::default(),
            hold: Arc::default(),
            held: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Hits, BackendError>> + Send>>;

impl<Bk: Backend> Backend for Late<Bk> {
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

impl<Bk: Spending> Spending for Late<Bk> {
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Answer {
        self.spends.fetch_add(1, Ordering::Relaxed);
        let answer = self.inner.spend_all(key, counters, spend);
        if !self.hold.swap(false, Ordering::Relaxed) {
            return Box::pin(answer);
        }
        let (held, release) = (Arc::clone(&self.held), Arc::clone(&self.release));
        Box::pin(async move {
            // Decided now, in the store; answered when released.
            let answer = answer.await;
            held.fetch_add(1, Ordering::Relaxed);
            release.acquire().await.unwrap().forget();
            answer
        })
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund {
        self.inner.amend(namespace, key, hit, amend)
    }
}

impl<Bk: Heeding> Heeding for Late<Bk> {
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

/// What the provider answers a call: its status and headers.
type Script = Arc<dyn Fn(u64) -> (StatusCode, Vec<(&'static str, String)>) + Send + Sync>;

/// The provider: answers each call as `script` says for the call's number
/// (in arrival order, from 0), and notes when each call came and what it
/// was answered.
#[derive(Clone)]
struct Provider {
    seen: Arc<Mutex<Vec<(Instant, StatusCode)>>>,
    script: Script,
}

impl Provider {
    fn new(
        script: impl Fn(u64) -> (StatusCode, Vec<(&'static str, String)>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            seen: Arc::default(),
            script: Arc::new(script),
        }
    }

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
        let (seen, script) = (Arc::clone(&self.seen), Arc::clone(&self.script));
        tower::service_fn(move |_: Request<String>| {
            let mut seen = seen.lock().unwrap();
            let (status, headers) = script(seen.len() as u64);
            seen.push((Instant::now(), status));
            drop(seen);
            let mut response = Response::new(String::from("ok"));
            *response.status_mut() = status;
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            async move { Ok(response) }
        })
    }

    fn calls(&self) -> Vec<(Instant, StatusCode)> {
        self.seen.lock().unwrap().clone()
    }
}

fn quota(limit: u64, millis: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(millis)).unwrap()
}

async fn send<S, B>(client: &S) -> Result<StatusCode, BoxError>
where
    S: Service<Request<String>, Response = Response<B>, Error = BoxError> + Clone,
{
    let response = client.clone().oneshot(Request::new(String::new())).await?;
    Ok(response.status())
}

/// The backend timeout of the tests on real stores: a loaded machine's
/// store call past the 100 ms default would fail the call closed.
fn patient() -> Window {
    Window::new(Duration::from_secs(5)).unwrap()
}

/// A provider that answers its first call 429 with `Retry-After: 1`: no
/// instance sends it a call before that second is over, and the budget
/// then serves calls again at once. The closure is one store write; the
/// calls after it cost what calls cost.
async fn a_retry_after_closes_the_budget_on_every_instance<Bk: Heeding>(
    first: Counting<Bk>,
    second: Counting<Bk>,
) {
    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "1".into())],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let budget = BudgetLayer::new("provider", quota(100, 60_000)).timeout(patient());
    let a = budget
        .clone()
        .backend(first.clone())
        .layer(provider.client());
    let b = budget.backend(second).layer(provider.client());
    assert_eq!(send(&a).await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    let refused_at = provider.calls()[0].0;
    // The closure reaches the store from a task of its own.
    let deadline = Instant::now() + Duration::from_secs(1);
    while first.closes.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut calls = Vec::new();
    for client in [a.clone(), b.clone(), a, b] {
        calls.push(tokio::spawn(async move { send(&client).await }));
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), StatusCode::OK);
    }
    let seen = provider.calls();
    assert_eq!(seen.len(), 5, "{seen:?}");
    let earliest = seen[1..].iter().map(|(at, _)| *at).min().unwrap();
    let after = earliest - refused_at;
    eprintln!(
        "Retry-After: 1 answered; the earliest call after it came {:.3} s later",
        after.as_secs_f64()
    );
    assert!(
        after >= Duration::from_millis(990),
        "a call reached the provider {after:?} after its Retry-After: 1"
    );
    assert!(
        after < Duration::from_millis(1_500),
        "the budget resumed {after:?} after a Retry-After: 1"
    );
    assert_eq!(
        first.closes.load(Ordering::Relaxed),
        1,
        "one closure written"
    );
    assert_eq!(first.raises.load(Ordering::Relaxed), 0);
}

async fn a_retry_after_closes_a_memory_budget_on_every_instance() {
    let store = Counting::new(MemoryBackend::new());
    a_retry_after_closes_the_budget_on_every_instance(store.clone(), store).await;
}

/// A provider that says nothing: the store is asked once a call, and
/// never written to by the provider's word. A provider that says what the
/// budget already knows (its remaining is the limit less the store's
/// count) costs nothing more either.
async fn a_provider_that_says_nothing_new_costs_no_store_call() {
    for says in [false, true] {
        let store = Counting::new(MemoryBackend::new());
        let count = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&count);
        let provider = Provider::new(move |_| {
            let used = seen.fetch_add(1, Ordering::Relaxed) + 1;
            let headers = if says {
                vec![
                    ("x-ratelimit-remaining-requests", (50 - used).to_string()),
                    ("x-ratelimit-reset-requests", "60s".into()),
                ]
            } else {
                vec![]
            };
            (StatusCode::OK, headers)
        });
        let client = BudgetLayer::new("provider", quota(50, 60_000))
            .backend(store.clone())
            .layer(provider.client());
        for _ in 0..20 {
            assert_eq!(send(&client).await.unwrap(), StatusCode::OK);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(store.spends.load(Ordering::Relaxed), 20);
        assert_eq!(store.words(), 0, "headers {says}: the store was written to");
    }
}

/// A provider whose limit is below the budget's says so in its
/// remaining: the budget's count is raised (one store write), and the
/// calls sent stop at the provider's limit, not the budget's, with no 429.
async fn fewer_remaining_raise_the_count_and_calls_stop_at_the_provider_limit() {
    let store = Counting::new(MemoryBackend::new());
    // The provider allows 8 in its window; the budget says 10.
    let provider = Provider::new(|n| {
        if n >= 8 {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("x-ratelimit-remaining-requests", "0".into())],
            );
        }
        (
            StatusCode::OK,
            vec![
                ("x-ratelimit-remaining-requests", (7 - n).to_string()),
                ("x-ratelimit-reset-requests", "1m".into()),
            ],
        )
    });
    let client = BudgetLayer::new("provider", quota(10, 60_000))
        .backend(store.clone())
        .max_wait(Duration::ZERO)
        .layer(provider.client());
    // The first call's answer says 7 remain where the budget thinks 9 do.
    assert_eq!(send(&client).await.unwrap(), StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(1);
    while store.raises.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut ok = 1;
    loop {
        match send(&client).await {
            Ok(status) => {
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "the provider was sent a call past its limit"
                );
                ok += 1;
            }
            Err(_) => break,
        }
        assert!(ok <= 10);
    }
    assert_eq!(ok, 8, "calls sent: the provider's 8, not the budget's 10");
    assert_eq!(store.raises.load(Ordering::Relaxed), 1, "one raise");
    let counted = store
        .inner
        .peek("provider", &Key::new("*"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(counted.count, 10, "the budget's count, raised");
}

/// Values a provider can send that say nothing usable: each changes
/// nothing (no store write, no wait), and a call after each is sent at
/// once.
async fn a_malformed_word_changes_nothing() {
    // RFC 9110's own example date: long past.
    let past = String::from("Sun, 06 Nov 1994 08:49:37 GMT");
    let words: Vec<(StatusCode, Vec<(&'static str, String)>)> = vec![
        (StatusCode::TOO_MANY_REQUESTS, vec![]),
        (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "-1".into())],
        ),
        (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "soon".into())],
        ),
        (StatusCode::TOO_MANY_REQUESTS, vec![("retry-after", past)]),
        // Two hours: above the reader's default cap of one.
        (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "7200".into())],
        ),
        (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "99999999999999999999999".into())],
        ),
        (
            StatusCode::OK,
            vec![
                ("x-ratelimit-remaining-requests", "-1".into()),
                ("x-ratelimit-reset-requests", "1s".into()),
            ],
        ),
        (
            StatusCode::OK,
            // Above the budget's limit: the provider allows more.
            vec![
                ("x-ratelimit-remaining-requests", "5000".into()),
                ("x-ratelimit-reset-requests", "1s".into()),
            ],
        ),
        (
            StatusCode::OK,
            vec![
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "9999999999h".into()),
            ],
        ),
        // 200 with a Retry-After: not a refusal.
        (StatusCode::OK, vec![("retry-after", "5".into())]),
    ];
    for (status, headers) in words {
        let store = Counting::new(MemoryBackend::new());
        let said = headers.clone();
        let provider = Provider::new(move |n| {
            if n == 0 {
                (status, said.clone())
            } else {
                (StatusCode::OK, vec![])
            }
        });
        let client = BudgetLayer::new("provider", quota(100, 60_000))
            .backend(store.clone())
            .max_wait(Duration::ZERO)
            .layer(provider.client());
        assert_eq!(send(&client).await.unwrap(), status);
        let started = Instant::now();
        assert_eq!(send(&client).await.unwrap(), StatusCode::OK, "{headers:?}");
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "{headers:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(store.words(), 0, "{headers:?} was written to the store");
    }
    // Header values that are not UTF-8.
    let store = Counting::new(MemoryBackend::new());
    let client = BudgetLayer::new("provider", quota(100, 60_000))
        .backend(store.clone())
        .max_wait(Duration::ZERO)
        .layer(tower::service_fn(|_: Request<String>| async {
            let mut response = Response::new(String::new());
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert(
                "retry-after",
                http::HeaderValue::from_bytes(b"\xff\xfe1").unwrap(),
            );
            Ok::<_, std::convert::Infallible>(response)
        }));
    for _ in 0..2 {
        assert_eq!(send(&client).await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(store.words(), 0);
}

/// A raise the store refuses is not taken as known: the provider's next
/// word raises again (a closure would hold here; a count cannot).
async fn a_raise_the_store_refuses_is_tried_again() {
    let store = Counting::new(MemoryBackend::new());
    store.refuse_words.store(true, Ordering::Relaxed);
    // The same word twice (another client of the provider's spent one).
    let provider = Provider::new(|_| {
        (
            StatusCode::OK,
            vec![
                ("x-ratelimit-remaining-requests", "5".into()),
                ("x-ratelimit-reset-requests", "1m".into()),
            ],
        )
    });
    let client = BudgetLayer::new("provider", quota(10, 60_000))
        .backend(store.clone())
        .layer(provider.client());
    for raises in 1..=2 {
        assert_eq!(send(&client).await.unwrap(), StatusCode::OK);
        let deadline = Instant::now() + Duration::from_secs(1);
        while store.raises.load(Ordering::Relaxed) < raises && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(store.raises.load(Ordering::Relaxed), raises);
    }
}

/// A budget told to read nothing (`Reader::none`) follows only its own
/// quota: a 429 with `Retry-After` holds no call back, and nothing is
/// written.
async fn a_budget_that_reads_nothing_follows_its_quota_only() {
    let store = Counting::new(MemoryBackend::new());
    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "5".into())],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let client = BudgetLayer::new("provider", quota(100, 60_000))
        .heed(Reader::none())
        .backend(store.clone())
        .max_wait(Duration::ZERO)
        .layer(provider.client());
    assert_eq!(send(&client).await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&client).await.unwrap(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(store.words(), 0);
}

/// A closure the store refuses to take is kept in this process: its calls
/// wait for it all the same.
async fn a_closure_the_store_refuses_holds_in_this_process() {
    let store = Counting::new(MemoryBackend::new());
    store.refuse_words.store(true, Ordering::Relaxed);
    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::SERVICE_UNAVAILABLE,
            vec![("retry-after", "1".into())],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let client = BudgetLayer::new("provider", quota(100, 60_000))
        .backend(store.clone())
        .layer(provider.client());
    assert_eq!(
        send(&client).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(send(&client).await.unwrap(), StatusCode::OK);
    let seen = provider.calls();
    assert!(
        seen[1].0 - seen[0].0 >= Duration::from_millis(990),
        "the second call came {:?} after a 503 with Retry-After: 1",
        seen[1].0 - seen[0].0
    );
    assert_eq!(
        store.closes.load(Ordering::Relaxed),
        1,
        "the write was tried"
    );
    // Not in the store: the counter has no lockout.
    let counter = Counter {
        namespace: "provider",
        quota: quota(100, 60_000),
        lowers: false,
    };
    let check = store
        .inner
        .spend_all(&Key::new("*"), &[counter], Spend::cost(0))
        .await
        .unwrap();
    assert!(check[0].count <= 100, "no closure in the store: {check:?}");
}

/// A provider that limits requests and tokens: a call spends one request
/// and its tokens in one store step, and the provider's word about its
/// tokens closes the tokens budget only.
async fn tokens_and_requests_are_spent_in_one_step_and_closed_apart() {
    let store = Counting::new(MemoryBackend::new());
    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![
                ("retry-after", "1".into()),
                ("x-ratelimit-remaining-requests", "400".into()),
                ("x-ratelimit-reset-requests", "1m".into()),
                ("x-ratelimit-remaining-tokens", "0".into()),
                ("x-ratelimit-reset-tokens", "1s".into()),
            ],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let client = BudgetLayer::new("llm", quota(500, 60_000))
        .tokens("llm-tokens", quota(30_000, 60_000))
        .cost(1_000)
        .backend(store.clone())
        .layer(provider.client());
    assert_eq!(send(&client).await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        store.spends.load(Ordering::Relaxed),
        1,
        "one store step a call"
    );
    assert_eq!(
        store.last_counters.load(Ordering::Relaxed),
        2,
        "both budgets in it"
    );
    let deadline = Instant::now() + Duration::from_secs(1);
    while store.closes.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.closes.load(Ordering::Relaxed), 1, "the tokens closed");
    let key = Key::new("*");
    let spend_on = |namespace: &'static str| {
        let store = store.inner.clone();
        let key = key.clone();
        async move {
            let counter = Counter {
                namespace,
                quota: quota(1_000_000, 60_000),
                lowers: false,
            };
            store
                .spend_all(&key, &[counter], Spend::cost(0))
                .await
                .unwrap()[0]
        }
    };
    assert!(
        spend_on("llm-tokens").await.count > 1_000_000,
        "the tokens budget is closed in the store"
    );
    assert!(
        spend_on("llm").await.count <= 1_000_000,
        "the requests budget is open: the word was about tokens"
    );
    // The requests the provider said remain raised the requests' count.
    let requests = store.inner.peek("llm", &key).await.unwrap().unwrap();
    assert_eq!(requests.count, 100, "500 less the 400 remaining");
    let tokens = store.inner.peek("llm-tokens", &key).await.unwrap().unwrap();
    assert_eq!(tokens.count, 1_000, "the call's tokens, counted once");
}

/// `tower::retry` outside the budget, retrying a 429 once: the retry waits
/// in the budget's line for the provider's `Retry-After`, and succeeds.
async fn a_retried_429_waits_for_the_provider() {
    #[derive(Clone)]
    struct RetryA429Once;

    impl<E> tower::retry::Policy<Request<String>, Response<String>, E> for RetryA429Once {
        type Future = std::future::Ready<()>;

        fn retry(
            &mut self,
            _: &mut Request<String>,
            result: &mut Result<Response<String>, E>,
        ) -> Option<std::future::Ready<()>> {
            match result {
                Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => {
                    Some(std::future::ready(()))
                }
                _ => None,
            }
        }

        fn clone_request(&mut self, request: &Request<String>) -> Option<Request<String>> {
            let mut copy = Request::new(request.body().clone());
            *copy.headers_mut() = request.headers().clone();
            Some(copy)
        }
    }

    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "1".into())],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let client = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryA429Once))
        .map_response(|response: Response<_>| response.map(|_| String::new()))
        .layer(BudgetLayer::new("provider", quota(100, 60_000)))
        .service(provider.client());
    let started = Instant::now();
    let response = client.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = provider.calls();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].0 - seen[0].0;
    eprintln!(
        "retried after {:.3} s (Retry-After: 1), answered after {:.3} s",
        waited.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(waited >= Duration::from_millis(990), "{waited:?}");
}

/// A call the store admitted before a closure, whose answer reaches the
/// layer after this process heard the closure, is not sent before the
/// closure ends: it waits, and asks the store again (its first spend stays
/// counted). As in the provider soak (soak/provider.sh), where a whole
/// batch of spends in flight when a `Retry-After: 3` came back went out
/// a millisecond after it.
async fn an_admission_answered_after_a_closure_waits_for_it() {
    let provider = Provider::new(|n| match n {
        0 => (
            StatusCode::TOO_MANY_REQUESTS,
            vec![("retry-after", "1".into())],
        ),
        _ => (StatusCode::OK, vec![]),
    });
    let store = Late::new(MemoryBackend::new());
    let client = BudgetLayer::new("provider", quota(100, 60_000))
        .backend(store.clone())
        .layer(provider.client());
    // A call whose spend the store admits at once; its answer is held.
    store.hold.store(true, Ordering::Relaxed);
    let late = tokio::spawn({
        let client = client.clone();
        async move { send(&client).await }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.held.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the spend was never asked");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Meanwhile another call is answered 429 with Retry-After: 1.
    assert_eq!(send(&client).await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    let refused_at = provider.calls()[0].0;
    store.release.add_permits(1);
    assert_eq!(late.await.unwrap().unwrap(), StatusCode::OK);
    let seen = provider.calls();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let after = seen[1].0 - refused_at;
    eprintln!(
        "the admission answered after the closure was sent {:.3} s after the 429",
        after.as_secs_f64()
    );
    assert!(
        after >= Duration::from_millis(990),
        "a call admitted before the closure was sent {after:?} after the Retry-After: 1"
    );
    assert_eq!(
        store.spends.load(Ordering::Relaxed),
        3,
        "the late call asked the store again after the closure"
    );
}

mod stores {
    use super::*;

    use redis::aio::ConnectionManager;
    use support::redis::{RedisCluster, RedisServer, SENTINEL_MASTER, SentinelGroup};
    use tower_pinned_window_redis::RedisBackend;
    use tower_pinned_window_redis::connection::SentinelConnection;

    async fn manager(server: &RedisServer) -> ConnectionManager {
        server.client().get_connection_manager().await.unwrap()
    }

    pub async fn on_redis() {
        let server = redis_or_skip!(RedisServer::start("word_on_redis"));
        let first = Counting::new(RedisBackend::new(manager(&server).await));
        let second = first.beside(RedisBackend::new(manager(&server).await));
        a_retry_after_closes_the_budget_on_every_instance(first, second).await;
        // Every key has its lifetime.
        let keys = server.cmd(&["--scan"]).unwrap();
        for key in keys.lines().filter(|k| !k.is_empty()) {
            let ttl = server.cmd(&["PTTL", key]).unwrap();
            assert_ne!(ttl.trim(), "-1", "{key} has no lifetime");
        }
    }

    pub async fn on_cluster() {
        let cluster = redis_or_skip!(RedisCluster::start("word_on_cluster"));
        let first = Counting::new(RedisBackend::connect_cluster(cluster.urls()).await.unwrap());
        let second = first.beside(RedisBackend::connect_cluster(cluster.urls()).await.unwrap());
        a_retry_after_closes_the_budget_on_every_instance(first, second).await;
    }

    pub async fn on_sentinel() {
        let group = redis_or_skip!(SentinelGroup::start("word_on_sentinel"));
        let connect = || async {
            SentinelConnection::connect(group.sentinel_urls(), SENTINEL_MASTER)
                .await
                .unwrap()
        };
        let first = Counting::new(RedisBackend::new(connect().await));
        let second = first.beside(RedisBackend::new(connect().await));
        a_retry_after_closes_the_budget_on_every_instance(first, second).await;
    }

    pub async fn on_postgres() {
        let Some(schema) = support::postgres::TestSchema::create("word_on_postgres").await else {
            return;
        };
        let first = Counting::new(schema.backend().await);
        let second = first.beside(schema.backend().await);
        a_retry_after_closes_the_budget_on_every_instance(first, second).await;
    }
}

fn main() {
    let trials = vec![
        trial::multi(
            "a_retry_after_closes_the_budget_on_every_instance::memory",
            Needs::Nothing,
            a_retry_after_closes_a_memory_budget_on_every_instance,
        ),
        trial::multi(
            "a_provider_that_says_nothing_new_costs_no_store_call",
            Needs::Nothing,
            a_provider_that_says_nothing_new_costs_no_store_call,
        ),
        trial::multi(
            "fewer_remaining_raise_the_count_and_calls_stop_at_the_provider_limit",
            Needs::Nothing,
            fewer_remaining_raise_the_count_and_calls_stop_at_the_provider_limit,
        ),
        trial::multi(
            "a_malformed_word_changes_nothing",
            Needs::Nothing,
            a_malformed_word_changes_nothing,
        ),
        trial::multi(
            "a_raise_the_store_refuses_is_tried_again",
            Needs::Nothing,
            a_raise_the_store_refuses_is_tried_again,
        ),
        trial::multi(
            "a_budget_that_reads_nothing_follows_its_quota_only",
            Needs::Nothing,
            a_budget_that_reads_nothing_follows_its_quota_only,
        ),
        trial::multi(
            "a_closure_the_store_refuses_holds_in_this_process",
            Needs::Nothing,
            a_closure_the_store_refuses_holds_in_this_process,
        ),
        trial::multi(
            "tokens_and_requests_are_spent_in_one_step_and_closed_apart",
            Needs::Nothing,
            tokens_and_requests_are_spent_in_one_step_and_closed_apart,
        ),
        trial::multi(
            "a_retried_429_waits_for_the_provider",
            Needs::Nothing,
            a_retried_429_waits_for_the_provider,
        ),
        trial::multi(
            "an_admission_answered_after_a_closure_waits_for_it",
            Needs::Nothing,
            an_admission_answered_after_a_closure_waits_for_it,
        ),
        trial::multi(
            "a_retry_after_closes_the_budget_on_every_instance::redis",
            Needs::Redis,
            stores::on_redis,
        ),
        trial::multi(
            "a_retry_after_closes_the_budget_on_every_instance::cluster",
            Needs::Redis,
            stores::on_cluster,
        ),
        trial::multi(
            "a_retry_after_closes_the_budget_on_every_instance::sentinel",
            Needs::Redis,
            stores::on_sentinel,
        ),
        trial::multi(
            "a_retry_after_closes_the_budget_on_every_instance::postgres",
            Needs::Postgres,
            stores::on_postgres,
        ),
    ];
    trial::run(trials, ());
}
