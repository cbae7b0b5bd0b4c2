//! The outbound layer's configuration: a named budget, its quota, whom a
//! call is charged to, what it costs, how long it may wait.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use crate::backend::{Heeding, InFlight, Leasing, MemoryBackend};
use crate::budget::check::{built, layer_name};
use crate::budget::failure::{Failure, FailurePolicy};
use crate::budget::log::LogGate;
use crate::budget::spend::{Cost, SpendPlan};
use crate::count::ResponseHead;
use crate::denied::{DeniedKeys, TopDenied};
use crate::error::ConfigError;
use crate::in_flight::slot::{Shared, Slots};
use crate::key::{KeyExtractor, RequestHead};
use crate::limits::LimitBook;
use crate::quota::{Quota, Window};
use crate::timeout::DEFAULT_TIMEOUT;

use super::admit::{Budget, Tokens};
use super::heard::Heard;
use super::line::Lines;
use super::service::Budgeted;
use super::stored::Stored;
use super::word::{Reader, Unit};

/// How long a call waits for its budget by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// How many calls of one layer wait for their budget at a time by default,
/// in one process.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// What a budget adds to its window by default (see
/// [`BudgetLayer::margin`]): a provider window that opens up to 20 ms
/// after ours closes before our next window's calls reach it.
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(20);

/// A tower layer for *clients*: every call it wraps spends from a named
/// budget that every instance of the service shares through its backend,
/// and waits for the budget's window to end when it is spent, instead of
/// failing. See the [module](super) for the rules, and [`docs/outbound.md`](crate::guide::outbound).
///
/// Give it the provider's own quota: each window the store pins is the
/// quota's plus a [`margin`](Self::margin) (default [`DEFAULT_MARGIN`],
/// 20 ms), so that the calls of our next window never land in a provider
/// window that opened a little after ours (its first call took a few ms
/// longer to reach it).
///
/// Its clones share one set of waiting lines: build it once per budget in a
/// process, and clone it.
#[derive(Clone)]
pub struct BudgetLayer<K = (), Bk = MemoryBackend> {
    key: K,
    backend: Bk,
    settings: Settings,
}

/// Everything that does not change the layer's type.
#[derive(Clone)]
struct Settings {
    name: Arc<str>,
    quota: Quota,
    /// What a call spends (`cost`, `cost_fn` or `reserve`), and what its
    /// answer's usage settles (`charge`).
    plan: SpendPlan,
    max_wait: Duration,
    max_waiters: usize,
    /// What the store's window adds to the quota's.
    margin: Duration,
    timeout: Duration,
    /// The failure policy and its insurance limiter.
    failure: Failure,
    lines: Arc<Lines>,
    warn_gate: Arc<LogGate>,
    /// The cap on calls in flight, and what makes its slots on the
    /// layer's backend once the failure policy and timeout are known.
    in_flight: Option<(InFlight, MakeSlots)>,
    /// The provider's tokens, a budget beside the calls.
    tokens: Option<Tokens>,
    /// Which of the provider's budgets the budget counts.
    unit: Unit,
    reader: Reader,
    heard: Arc<Heard>,
    /// The keys refused most, when counted (`top_denied`).
    denied: Option<DeniedKeys>,
    /// The limits held in the store, when read (`limits`).
    book: Option<LimitBook>,
}

/// Makes a layer's slots, on the backend `in_flight` was given with.
type MakeSlots = Arc<dyn Fn(&Failure, Duration) -> Arc<dyn Slots> + Send + Sync>;

impl BudgetLayer {
    /// A budget named `name` of `quota`, with one key for every call,
    /// counted in a fresh [`MemoryBackend`]: one process's budget. Point
    /// [`backend`](Self::backend) at a shared store to share it.
    ///
    /// # Panics
    /// When `name` is not 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN)
    /// characters from `A-Z a-z 0-9 _ - . :`; see [`try_new`](Self::try_new).
    #[track_caller]
    pub fn new(name: &'static str, quota: Quota) -> Self {
        built(Self::try_new(name, quota))
    }

    /// Like [`new`](Self::new), for a name known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for a name that is empty, too long, or
    /// has a character outside `A-Z a-z 0-9 _ - . :`.
    pub fn try_new(name: impl Into<String>, quota: Quota) -> Result<Self, ConfigError> {
        let name = layer_name(name.into())?;
        Ok(Self {
            key: (),
            backend: MemoryBackend::new(),
            settings: Settings {
                name,
                quota,
                plan: SpendPlan::new(),
                max_wait: DEFAULT_MAX_WAIT,
                max_waiters: DEFAULT_MAX_WAITERS,
                margin: DEFAULT_MARGIN,
                timeout: DEFAULT_TIMEOUT,
                failure: Failure::default(),
                lines: Arc::default(),
                warn_gate: Arc::default(),
                in_flight: None,
                tokens: None,
                unit: Unit::Requests,
                reader: Reader::standard(),
                heard: Arc::default(),
                denied: None,
                book: None,
            },
        })
    }
}

impl<K, Bk> BudgetLayer<K, Bk> {
    /// What the operator's service reads of the budget in this process.
    #[cfg(feature = "operator")]
    pub(crate) fn watch(&self) -> super::watch::Watch {
        super::watch::Watch {
            name: Arc::clone(&self.settings.name),
            lines: Arc::clone(&self.settings.lines),
            heard: Arc::clone(&self.settings.heard),
        }
    }

    /// Charge each call to the key `key` reads from it (see
    /// [`crate::key`]), such as the provider's API key in a header:
    /// its [`HeaderName`](http::HeaderName), or a closure. The default,
    /// `()` (keyed by nothing), puts every call on one budget.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> BudgetLayer<K2, Bk> {
        BudgetLayer {
            key,
            backend: self.backend,
            settings: self.settings,
        }
    }

    /// Count in `backend`: every process that points at the same store
    /// (Redis, Redis Cluster or Sentinel, PostgreSQL) shares the budget.
    ///
    /// # Panics
    /// After [`in_flight`](Self::in_flight), whose slots live in the
    /// backend it was given: set the backend first.
    #[track_caller]
    pub fn backend<Bk2: Heeding>(self, backend: Bk2) -> BudgetLayer<K, Bk2> {
        assert!(
            self.settings.in_flight.is_none(),
            "BudgetLayer::in_flight keeps its slots in the layer's backend: call `backend` before `in_flight`"
        );
        BudgetLayer {
            key: self.key,
            backend,
            settings: self.settings,
        }
    }

    /// Every call costs `cost` (default 1; 0 under a
    /// [`charge`](Self::charge) alone), all or nothing: it is sent only
    /// when its whole cost fits in what is left of the window.
    pub fn cost(mut self, cost: u64) -> Self {
        self.settings.plan.cost = Some(Cost::Fixed(cost));
        self
    }

    /// Each call costs what `cost` reads from its request's head, as
    /// [`cost`](Self::cost) does.
    pub fn cost_fn<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        self.settings.plan.cost = Some(Cost::By(Arc::new(cost)));
        self
    }

    /// Each call reserves what `estimate` reads from its request (an LLM
    /// call's `max_tokens`), all or nothing like a cost, and its answer's
    /// [`charge`](Self::charge) settles the reservation to the actual use:
    /// the difference is refunded or charged, in the window the call was
    /// counted in. Needs a charge, and takes the place of a cost: with
    /// either missing or both set, [`check`](Self::check) refuses the
    /// layer, in whatever order the setters came.
    pub fn reserve<F>(mut self, estimate: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        self.settings.plan.reserve = Some(Arc::new(estimate));
        self
    }

    /// What an answer used, read from its
    /// [`ResponseHead`](crate::outcome::ResponseHead) when its body ends (the
    /// tokens an LLM answer reports, in a header, a trailer or the last
    /// chunk). Without [`reserve`](Self::reserve), it is added to
    /// what the call spent; with it, it settles the reservation. `None`
    /// (the usage is absent or malformed) charges nothing, leaves what the
    /// call spent as it is, and is logged at most once every 5 s. The
    /// answers' bodies become
    /// [`Metered`](crate::cost::Metered).
    pub fn charge<F, T>(mut self, usage: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> T + Send + Sync + 'static,
        T: Into<Option<u64>>,
    {
        self.settings.plan.charge = Some(Arc::new(move |end: &ResponseHead<'_>| usage(end).into()));
        self
    }

    /// The longest a call waits for its budget (default
    /// [`DEFAULT_MAX_WAIT`]). A call whose budget cannot return within it,
    /// or within its own [`WaitBound`](super::WaitBound) or `grpc-timeout`,
    /// fails at once with [`BudgetError::Exhausted`](super::BudgetError::Exhausted).
    /// `Duration::ZERO`: never wait.
    ///
    /// A waiting call is judged again at each window its line in this
    /// process misses (the store turned a call of it away), and fails then
    /// when, at the share of each window this process has won while its
    /// line waited, its turn comes after its bound. The share is the whole
    /// window until the line has had two whole windows to win in, then
    /// what it won per window, with one window won whole counted beside
    /// them; it starts over when the line empties. A sudden drop in other processes'
    /// demand could have served a call that failed so; the error's
    /// [`retry_after`](super::BudgetError::retry_after) says when to try
    /// again.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.settings.max_wait = max_wait;
        self
    }

    /// The most calls that wait for this layer's budgets at a time in this
    /// process (default [`DEFAULT_MAX_WAITERS`]); beyond it, a call that
    /// would wait fails at once with
    /// [`BudgetError::Overloaded`](super::BudgetError::Overloaded). 0: never wait.
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.settings.max_waiters = max_waiters;
        self
    }

    /// What each window the store pins adds to the quota's (default
    /// [`DEFAULT_MARGIN`], rounded up to whole milliseconds), so that the
    /// provider's quota can be given as it is. A provider pins its window
    /// to the first call it receives, which reaches it some time after the
    /// store counted it. With the margin, a provider window whose first
    /// call was up to `margin` slower than the fastest of our next window's
    /// has closed before those calls reach the provider, so they never land
    /// in it. Use a larger margin when the calls' latency to the provider
    /// varies more, and `Duration::ZERO` when the store's windows are the
    /// provider's own. A margin that takes the window past [`Window::MAX`]
    /// is refused by [`check`](Self::check). See [`docs/outbound.md`](crate::guide::outbound).
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = margin;
        self
    }

    /// What a call gets when the store fails (default
    /// [`FailurePolicy::FailClosed`]: it fails with
    /// [`BudgetError::Backend`](super::BudgetError::Backend)). Under
    /// [`FailurePolicy::Insurance`], a limiter in this process's memory
    /// spends the instance's share of the budget, and calls wait on it as
    /// they would on the store. A corrupt counter stops the call under any
    /// policy.
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.settings.failure.set(policy);
        self
    }

    /// How long one store call may take (default
    /// [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT)) before it counts as an
    /// outage.
    pub fn timeout(mut self, timeout: Window) -> Self {
        self.settings.timeout = timeout.as_duration();
        self
    }

    /// At most `in_flight.max()` calls of a key in flight at once, across
    /// every instance on the backend, besides the budget: a call waits in
    /// its key's line until it has both a slot and room in the window, and
    /// holds its slot until its answer's body ends, fails or is dropped (a
    /// call that fails gives it back at once). Slots are leases, as under
    /// an [`InFlightLayer`](crate::InFlightLayer) (see
    /// [`docs/in-flight.md`](crate::guide::in_flight)); a call that cannot
    /// get one within its bound fails with
    /// [`BudgetError::Exhausted`](super::BudgetError::Exhausted). Set the
    /// [`backend`](Self::backend) first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tower_pinned_window::{InFlight, Quota};
    /// use tower_pinned_window::outbound::BudgetLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // 600 calls a minute, and at most 2 in flight, for every instance.
    /// let budget = BudgetLayer::new("partner", Quota::new(600, Duration::from_secs(60)).unwrap())
    ///     .in_flight(InFlight::new(2, Duration::from_secs(30)).unwrap())
    ///     .max_wait(Duration::from_millis(50));
    /// let client = ServiceBuilder::new().layer(budget).service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
    /// });
    /// let one = client.clone().oneshot(http::Request::new(String::new())).await.unwrap();
    /// let two = client.clone().oneshot(http::Request::new(String::new())).await.unwrap();
    /// // Both answers' bodies are unread: a third call finds no slot in 50 ms.
    /// let third = client.clone().oneshot(http::Request::new(String::new())).await;
    /// assert!(third.unwrap_err().to_string().contains("partner"));
    /// drop((one, two));
    /// assert!(client.oneshot(http::Request::new(String::new())).await.is_ok());
    /// # }
    /// ```
    pub fn in_flight(mut self, in_flight: InFlight) -> Self
    where
        Bk: Leasing,
    {
        let (backend, name) = (self.backend.clone(), Arc::clone(&self.settings.name));
        let make: MakeSlots = Arc::new(move |failure: &Failure, timeout: Duration| {
            let mut shared = Shared::new(
                Arc::clone(&name),
                in_flight,
                backend.clone(),
                failure.clone(),
                timeout,
                Duration::ZERO,
            );
            shared.fails = "failing the call";
            Arc::new(shared) as Arc<dyn Slots>
        });
        self.settings.in_flight = Some((in_flight, make));
        self
    }

    /// A second budget on every call, for a provider that limits tokens as
    /// well as requests: a call spends its cost ([`cost`](Self::cost),
    /// [`cost_fn`](Self::cost_fn) or [`reserve`](Self::reserve), settled
    /// by [`charge`](Self::charge)) from the tokens budget `name` of
    /// `quota`, and one call from the layer's own budget, which then counts
    /// requests: both in one atomic step of the store, all or nothing, in
    /// one round trip. A call waits until both have room. The provider's
    /// word about one (its `x-ratelimit-remaining-tokens`, say) changes
    /// only that one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::Quota;
    /// use tower_pinned_window::outbound::BudgetLayer;
    ///
    /// // 500 requests and 30,000 tokens a minute; a call's tokens read
    /// // from a header the client sets.
    /// let budget = BudgetLayer::new("openai", Quota::new(500, Duration::from_secs(60)).unwrap())
    ///     .tokens("openai-tokens", Quota::new(30_000, Duration::from_secs(60)).unwrap())
    ///     .cost_fn(|request| {
    ///         request.headers().get("x-max-tokens")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1_000)
    ///     });
    /// assert!(budget.check().is_ok());
    /// ```
    ///
    /// # Panics
    /// When `name` is not a valid budget name, as
    /// [`new`](BudgetLayer::new); see [`try_tokens`](Self::try_tokens).
    #[track_caller]
    pub fn tokens(self, name: &'static str, quota: Quota) -> Self {
        built(self.try_tokens(name, quota))
    }

    /// Like [`tokens`](Self::tokens), for a name known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`], as [`try_new`](BudgetLayer::try_new).
    /// A name equal to the budget's own is refused by
    /// [`check`](Self::check), whatever the order of the setters.
    pub fn try_tokens(
        mut self,
        name: impl Into<String>,
        quota: Quota,
    ) -> Result<Self, ConfigError> {
        let name = layer_name(name.into())?;
        self.settings.tokens = Some(Tokens { name, quota });
        Ok(self)
    }

    /// Which of the provider's budgets this one counts, for the
    /// provider's word (default [`Unit::Requests`]): a budget whose calls
    /// cost their tokens says [`Unit::Tokens`], so that a remaining of
    /// requests is never taken for tokens. Beside a
    /// [`tokens`](Self::tokens) budget, the budget counts requests.
    pub fn counts(mut self, unit: Unit) -> Self {
        self.settings.unit = unit;
        self
    }

    /// How the provider's answers are read (default
    /// [`Reader::standard`]: `Retry-After` on a 429 or 503, and the
    /// `RateLimit`, `x-ratelimit-*` and `anthropic-ratelimit-*` fields).
    /// What an answer says becomes shared state in the store, which every
    /// instance's calls honour: **closed until** a time (a 429 with
    /// `Retry-After`, a remaining of 0 with its reset), which only ever
    /// extends, and **fewer remain** than the budget thinks, which raises
    /// its count (never lowers it, never past the limit). A value that is
    /// missing, malformed or absurd changes nothing and is logged at most
    /// once every 5 s: no wait is ever invented. [`Reader::none`] reads
    /// nothing. See [the provider's word](crate::guide::outbound#the-providers-word).
    ///
    /// The caller gets a 429 as it is. Behind `tower::retry`, with a policy
    /// that retries a 429 once, the retry waits in the budget's line for the
    /// provider's time:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::retry::{Policy, RetryLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tower_pinned_window::Quota;
    /// use tower_pinned_window::outbound::{BudgetLayer, Reader};
    ///
    /// /// Retries a call answered 429, once.
    /// #[derive(Clone)]
    /// struct RetryA429Once {
    ///     retried: bool,
    /// }
    ///
    /// impl<B, E> Policy<Request<String>, Response<B>, E> for RetryA429Once {
    ///     type Future = std::future::Ready<()>;
    ///
    ///     fn retry(
    ///         &mut self,
    ///         _: &mut Request<String>,
    ///         result: &mut Result<Response<B>, E>,
    ///     ) -> Option<std::future::Ready<()>> {
    ///         let refused = matches!(result, Ok(answer) if answer.status() == StatusCode::TOO_MANY_REQUESTS);
    ///         (refused && !std::mem::replace(&mut self.retried, true)).then(|| std::future::ready(()))
    ///     }
    ///
    ///     fn clone_request(&mut self, request: &Request<String>) -> Option<Request<String>> {
    ///         let mut copy = Request::new(request.body().clone());
    ///         *copy.headers_mut() = request.headers().clone();
    ///         Some(copy)
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let budget = BudgetLayer::new("partner", Quota::new(100, Duration::from_secs(60)).unwrap())
    ///     .heed(Reader::standard());
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let provider = {
    ///     let calls = Arc::clone(&calls);
    ///     tower::service_fn(move |_: Request<String>| {
    ///         // The provider refuses the first call, for 1 s.
    ///         let first = calls.fetch_add(1, Ordering::Relaxed) == 0;
    ///         async move {
    ///             let answer = Response::builder();
    ///             let answer = match first {
    ///                 true => answer.status(429).header("retry-after", "1"),
    ///                 false => answer.status(200),
    ///             };
    ///             Ok::<_, std::convert::Infallible>(answer.body(String::new()).unwrap())
    ///         }
    ///     })
    /// };
    /// let client = ServiceBuilder::new()
    ///     .layer(RetryLayer::new(RetryA429Once { retried: false }))
    ///     .layer(budget)
    ///     .service(provider);
    /// let started = tokio::time::Instant::now();
    /// let answer = client.oneshot(Request::new(String::new())).await.unwrap();
    /// // The retry waited for the provider's second, and went through.
    /// assert_eq!(answer.status(), StatusCode::OK);
    /// assert!(started.elapsed() >= Duration::from_secs(1));
    /// assert_eq!(calls.load(Ordering::Relaxed), 2);
    /// # }
    /// ```
    pub fn heed(mut self, reader: Reader) -> Self {
        self.settings.reader = reader;
        self
    }

    /// Count the keys whose calls this budget refuses most
    /// ([`BudgetError::Exhausted`](super::BudgetError::Exhausted): not
    /// served within their wait bound), in a table of `top.capacity()`
    /// counters kept in this process's memory, shown as keyed digests;
    /// read it through [`denied_keys`](Self::denied_keys). As the server
    /// layer's [`top_denied`](crate::RateLimitLayer::top_denied): see
    /// [`denied`](crate::denied).
    pub fn top_denied(mut self, top: TopDenied) -> Self {
        let s = &mut self.settings;
        s.denied = Some(top.table(&s.name));
        self
    }

    /// Read the budget's limits from `book` too: limits held in the store,
    /// set while the service runs (a provider lowers a tier, a customer's
    /// API key gets a higher one) and applied within the book's staleness
    /// bound, with no store call on a call's path: each process reads them
    /// in the background at most once per staleness bound (see
    /// [`LimitBook`]).
    ///
    /// A call's budget is the stored limit of its budget key
    /// ([`LimitScope::Key`](crate::backend::LimitScope::Key)), else the
    /// budget's ([`LimitScope::Layer`](crate::backend::LimitScope::Layer)),
    /// else the layer's quota, all under the budget's name; a
    /// [`tokens`](Self::tokens) budget reads its own, under its own name,
    /// the same way. A stored limit is the provider's, as the layer's quota
    /// is: the [`margin`](Self::margin) is added to its window, and an
    /// insurance limiter's share is taken of it.
    ///
    /// The count is kept: a lower limit makes calls wait for the end of
    /// the key's window (or fail when they cannot be served in time), and a
    /// higher one lets waiting calls go before it ends, within the
    /// staleness bound. A new window length applies from the key's next
    /// window. Guide:
    /// [limits that change](crate::guide::guarantees#limits-that-change).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window::backend::{LimitScope, MemoryBackend};
    /// use tower_pinned_window::outbound::BudgetLayer;
    /// use tower_pinned_window::{LimitBook, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let book = LimitBook::new(&backend, Duration::from_secs(1))?;
    /// let minute = |n| Quota::new(n, Duration::from_secs(60));
    /// let budget = BudgetLayer::new("partner", minute(600)?)
    ///     .backend(backend)
    ///     .limits(book.clone());
    /// // The partner moved us to a lower tier: every instance follows
    /// // within a second, with the calls counted so far kept.
    /// book.set("partner", LimitScope::Layer, minute(300)?).await?;
    /// # let _ = budget;
    /// # Ok(())
    /// # }
    /// ```
    pub fn limits(mut self, book: LimitBook) -> Self {
        self.settings.book = Some(book);
        self
    }

    /// The handle on the keys this budget refused most, when
    /// [`top_denied`](Self::top_denied) turned them on; `None` otherwise.
    pub fn denied_keys(&self) -> Option<DeniedKeys> {
        self.settings.denied.clone()
    }

    /// The budget's name: it names its counters with each key.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The budget's quota, as given (without the [`margin`](Self::margin)).
    pub fn quota(&self) -> Quota {
        self.settings.quota
    }

    /// The quota the store counts: the quota's window plus the margin.
    fn stored_quota(&self) -> Result<Quota, ConfigError> {
        self.stored(self.settings.quota)
    }

    /// `quota` as the store counts it: its window plus the margin.
    fn stored(&self, quota: Quota) -> Result<Quota, ConfigError> {
        let window = quota
            .window()
            .as_duration()
            .checked_add(self.settings.margin)
            .ok_or(ConfigError::WindowTooLong)?;
        let limit = NonZeroU64::new(quota.limit()).ok_or(ConfigError::ZeroLimit)?;
        Ok(Quota::with_window(limit, Window::new(window)?))
    }

    /// Whether the layer can work: the one place where settings that
    /// depend on each other are checked. [`Layer::layer`] panics with this
    /// error.
    ///
    /// # Errors
    /// - [`ConfigError::CostAboveLimit`] for a fixed cost above the limit:
    ///   no call could ever be sent.
    /// - [`ConfigError::ReserveWithoutCharge`] for a reservation that no
    ///   charge settles, and [`ConfigError::ReserveWithCost`] for one beside
    ///   a cost.
    /// - [`ConfigError::WindowTooLong`] when the window and the
    ///   [`margin`](Self::margin) together are longer than [`Window::MAX`].
    /// - [`ConfigError::LeaseNotAboveTimeout`] for an
    ///   [`in_flight`](Self::in_flight) lease no longer than the
    ///   [`timeout`](Self::timeout).
    /// - [`ConfigError::TokensNameTaken`] for a [`tokens`](Self::tokens)
    ///   budget named as this one, and [`ConfigError::TokensCountedTwice`]
    ///   for one beside [`counts`](Self::counts)`(Unit::Tokens)`.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.stored_quota()?;
        if let Some((in_flight, _)) = &self.settings.in_flight {
            crate::in_flight::layer::lease_above(in_flight.lease(), self.settings.timeout)?;
        }
        let Some(tokens) = &self.settings.tokens else {
            return self.settings.plan.check(self.settings.quota.limit());
        };
        self.stored(tokens.quota)?;
        if tokens.name == self.settings.name {
            return Err(ConfigError::TokensNameTaken(tokens.name.to_string()));
        }
        if self.settings.unit == Unit::Tokens {
            return Err(ConfigError::TokensCountedTwice);
        }
        self.settings.plan.check(tokens.quota.limit())
    }
}

impl<S, K: Clone, Bk: Clone> Layer<S> for BudgetLayer<K, Bk> {
    type Service = Budgeted<S, K, Bk>;

    /// # Panics
    /// When [`check`](BudgetLayer::check) fails.
    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        built(self.check());
        let quota = built(self.stored_quota());
        let tokens = self.settings.tokens.as_ref().map(|tokens| Tokens {
            name: Arc::clone(&tokens.name),
            quota: built(self.stored(tokens.quota)),
        });
        let budget = Budget {
            name: Arc::clone(&self.settings.name),
            quota,
            backend: self.backend.clone(),
            plan: self.settings.plan.clone(),
            max_wait: self.settings.max_wait,
            max_waiters: self.settings.max_waiters,
            timeout: self.settings.timeout,
            failure: self.settings.failure.clone(),
            lines: Arc::clone(&self.settings.lines),
            warn_gate: Arc::clone(&self.settings.warn_gate),
            slots: self
                .settings
                .in_flight
                .as_ref()
                .map(|(_, make)| make(&self.settings.failure, self.settings.timeout)),
            tokens,
            unit: self.settings.unit,
            reader: self.settings.reader.clone(),
            heard: Arc::clone(&self.settings.heard),
            denied: self.settings.denied.clone(),
            stored: self.settings.book.as_ref().map(|book| {
                Box::new(Stored {
                    calls: book.page(&self.settings.name),
                    tokens: (self.settings.tokens.as_ref()).map(|tokens| book.page(&tokens.name)),
                    margin: self.settings.margin,
                    look: (book.staleness() / 4).max(Duration::from_millis(1)),
                })
            }),
        };
        Budgeted::new(inner, self.key.clone(), Arc::new(budget))
    }
}

impl<K, Bk> std::fmt::Debug for BudgetLayer<K, Bk> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetLayer")
            .field("name", &self.settings.name)
            .field("quota", &self.settings.quota)
            .field("reserve", &self.settings.plan.reserve.is_some())
            .field("charge", &self.settings.plan.charge.is_some())
            .field("max_wait", &self.settings.max_wait)
            .field("max_waiters", &self.settings.max_waiters)
            .field("margin", &self.settings.margin)
            .field("timeout", &self.settings.timeout)
            .field("failure", &self.settings.failure.policy())
            .field(
                "in_flight",
                &self.settings.in_flight.as_ref().map(|(cap, _)| cap),
            )
            .field("tokens", &self.settings.tokens)
            .field("counts", &self.settings.unit)
            .field("heed", &self.settings.reader)
            .field("limits", &self.settings.book)
            .finish_non_exhaustive()
    }
}
