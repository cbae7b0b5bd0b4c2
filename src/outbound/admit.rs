//! The admission step: a call spends its cost from the shared budget in one
//! atomic step of the store, or, when the budget is spent, waits in its
//! key's [line](super::line) for the window the store says ends it.
//!
//! Only the store's answer admits a call: no timer and no local count ever
//! does, so a waiting call is never admitted past the budget, whatever the
//! clock or the store's latency does (a store that fails is the failure
//! policy's to decide).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{BackendError, Counter, Hit, Hits, Spending};
use crate::budget::failure::{self, Failure, Outage};
use crate::budget::log::LogGate;
use crate::budget::spend::SpendPlan;
use crate::denied::DeniedKeys;
use crate::key::Key;
use crate::quota::Quota;
use crate::request::RequestHead;

use crate::backend::SlotId;
use crate::in_flight::slot::{Admission, SlotGuard, Slots, next_ask};

use super::error::{BudgetError, WaitBound};
use super::heard::Heard;
use super::line::{Lines, Place, Turn, Wake};
use super::stored::{Quotas, Stored};
use super::word::{Reader, Unit};

/// The shortest nap between two asks of a spent budget, when the store says
/// it returns in less (a window that ends this millisecond).
const MIN_NAP: Duration = Duration::from_millis(1);

/// The longest wake-up jitter of a line's head (a twentieth of the window
/// when that is shorter).
const MAX_JITTER: Duration = Duration::from_millis(1);

/// The longest jitter of a line's head, under `quota`.
fn jitter(quota: Quota) -> Duration {
    MAX_JITTER.min(quota.window().as_duration() / 20)
}

/// A budget's settings and state, shared by a layer's services.
pub(crate) struct Budget<Bk> {
    pub(crate) name: Arc<str>,
    pub(crate) quota: Quota,
    pub(crate) backend: Bk,
    /// What a call spends on its way out (its reservation, under
    /// `reserve`), and what its answer's usage settles (under `charge`).
    pub(crate) plan: SpendPlan,
    pub(crate) max_wait: Duration,
    pub(crate) max_waiters: usize,
    pub(crate) timeout: Duration,
    /// The failure policy, and the insurance limiter under
    /// [`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance).
    pub(crate) failure: Failure,
    pub(crate) lines: Arc<Lines>,
    pub(crate) warn_gate: Arc<LogGate>,
    /// The cap on calls in flight, under
    /// [`in_flight`](super::BudgetLayer::in_flight).
    pub(crate) slots: Option<Arc<dyn Slots>>,
    /// The provider's tokens, a budget of their own beside the calls,
    /// under [`tokens`](super::BudgetLayer::tokens).
    pub(crate) tokens: Option<Tokens>,
    /// Which of the provider's budgets the first counter counts (requests
    /// beside `tokens`).
    pub(crate) unit: Unit,
    /// How the provider's answers are read.
    pub(crate) reader: Reader,
    /// What this process heard from the provider.
    pub(crate) heard: Arc<Heard>,
    /// The keys refused most, when counted.
    pub(crate) denied: Option<DeniedKeys>,
    /// The limits held in the store, under
    /// [`limits`](super::BudgetLayer::limits).
    pub(crate) stored: Option<Box<Stored>>,
}

/// A provider's tokens: a second budget on every call, which spends its
/// cost there and one call from the first.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    pub(crate) name: Arc<str>,
    pub(crate) quota: Quota,
}

/// A budget's counters: the calls', and the tokens' when there are any.
pub(crate) struct Counters<'a> {
    all: [Counter<'a>; 2],
    len: usize,
}

impl<'a> std::ops::Deref for Counters<'a> {
    type Target = [Counter<'a>];

    #[inline]
    fn deref(&self) -> &[Counter<'a>] {
        &self.all[..self.len]
    }
}

/// A call the budget let through.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    /// What the store counted; `None` when the call passed uncounted
    /// ([`FailurePolicy::FailOpen`](crate::FailurePolicy::FailOpen) during an outage).
    pub(crate) hit: Option<Hit>,
    /// The insurance limiter counted it, in this process.
    pub(crate) insured: bool,
    /// What is left in the window after it, as far as the store said.
    pub(crate) room: u64,
    /// Beside a [`tokens`](super::BudgetLayer::tokens) budget, what the
    /// calls' counter counted (`hit` is the tokens').
    pub(crate) calls: Option<Hit>,
}

impl Admitted {
    /// What counter `at` of the budget counted for the call.
    pub(crate) fn own(&self, at: usize) -> Option<Hit> {
        match (at, self.calls) {
            (0, Some(calls)) => Some(calls),
            _ => self.hit,
        }
    }
}

/// One ask's answer.
pub(crate) enum Try {
    Admitted(Admitted),
    /// Spent; the store says the budget returns after this long.
    Denied(Duration),
}

/// Where a call's wait starts from.
pub(crate) enum Start<F> {
    /// The store is still answering the first ask, made under these
    /// quotas.
    Pending(F, Quotas),
    /// The first ask was turned away, under these quotas (none: by the
    /// provider's word).
    Denied(Duration, Option<Quotas>),
    /// Calls of its key already wait here: it queues behind them.
    Busy,
}

impl<Bk: Spending> Budget<Bk> {
    /// What the call with `head` spends.
    #[inline]
    pub(crate) fn cost(&self, head: &RequestHead<'_>) -> u64 {
        self.plan.cost(head)
    }

    /// The store's step for a call of `cost` on `key` under `quotas`:
    /// beside a tokens budget, one call from the first counter and `cost`
    /// from the tokens, all or nothing.
    #[inline]
    pub(crate) fn spend(&self, key: &Key, cost: u64, quotas: &Quotas) -> Bk::Future {
        let counters = self.counters(quotas);
        let mut spend = self.plan.spend(cost);
        if self.tokens.is_some() {
            spend = spend.first(1);
        }
        self.backend.spend_all(key, &counters, spend)
    }

    /// What the store's answer to a spend of `cost` on `key` means for the
    /// call: admitted, turned away until the budget returns, or failed as
    /// the failure policy says; `quotas` are the ones the spend was made
    /// under.
    pub(crate) fn judge(
        &self,
        key: &Key,
        cost: u64,
        quotas: &Quotas,
        answer: Result<Hits, BackendError>,
    ) -> Result<Try, BudgetError> {
        match answer.and_then(|hits| self.verdict(&hits, &self.counters(quotas), false)) {
            Ok(judged) => Ok(judged),
            Err(err) if err.is_corrupt() => {
                failure::corrupt(&self.name, &err);
                Err(self.backend_error(err))
            }
            Err(err) => self.outage(key, cost, quotas, err),
        }
    }

    /// The store failed: the failure policy decides.
    #[cold]
    fn outage(
        &self,
        key: &Key,
        cost: u64,
        quotas: &Quotas,
        err: BackendError,
    ) -> Result<Try, BudgetError> {
        let (name, gate) = (&*self.name, &*self.warn_gate);
        // What a call gets when its store fails under fail-closed.
        let fails = "failing the call";
        let decided = self.failure.decide(name, gate, err, fails, |insurance| {
            // The budget's counters, their limits cut to the share.
            let mut counters = self.counters(quotas);
            for counter in &mut counters.all {
                counter.quota = counter.quota.share(insurance.share());
            }
            let mut spend = self.plan.spend(cost);
            if self.tokens.is_some() {
                spend = spend.first(1);
            }
            let hits = insurance.count(key, &counters, Some(spend))?;
            self.verdict(&hits, &counters, true)
        });
        match decided {
            Outage::Insured(judged) => Ok(judged),
            Outage::Open => Ok(Try::Admitted(Admitted {
                hit: None,
                insured: false,
                room: 0,
                calls: None,
            })),
            Outage::Closed(err) => Err(self.backend_error(err)),
        }
    }

    /// The store's `error`, as this budget's.
    fn backend_error(&self, error: BackendError) -> BudgetError {
        BudgetError::Backend {
            budget: Arc::clone(&self.name),
            error,
        }
    }

    /// This budget cannot return within `bound` for a call of `key`: it
    /// returns in `retry_after`. The one refusal of a call by its budget,
    /// counted here among the keys refused most.
    pub(crate) fn exhausted(
        &self,
        key: &Key,
        retry_after: Duration,
        bound: WaitBound,
    ) -> BudgetError {
        if let Some(denied) = &self.denied {
            denied.record(key);
        }
        BudgetError::Exhausted {
            budget: Arc::clone(&self.name),
            retry_after,
            bound,
        }
    }

    /// `answer`, or a timeout after the layer's timeout.
    pub(crate) async fn timed(
        &self,
        answer: impl Future<Output = Result<Hits, BackendError>>,
    ) -> Result<Hits, BackendError> {
        failure::timed(self.timeout, answer).await
    }

    /// The quotas a call of `key` spends from now: the limits held in the
    /// store when the layer reads them (its copy, read again in the
    /// background once it is older than the staleness bound), else the
    /// layer's own.
    #[inline]
    pub(crate) fn quotas(&self, key: &Key) -> Quotas {
        let own = Quotas {
            calls: self.quota,
            tokens: self.tokens.as_ref().map(|tokens| tokens.quota),
        };
        match &self.stored {
            None => own,
            Some(stored) => stored.apply(key, own),
        }
    }

    /// The budget's counters under `quotas`: the calls', then the tokens'
    /// when there are any.
    #[inline]
    pub(crate) fn counters(&self, quotas: &Quotas) -> Counters<'_> {
        let calls = Counter {
            namespace: &self.name,
            quota: quotas.calls,
            // A settle may give back part of a reservation.
            lowers: self.plan.reserves() && self.tokens.is_none(),
        };
        match &self.tokens {
            None => Counters {
                all: [calls; 2],
                len: 1,
            },
            Some(tokens) => Counters {
                all: [
                    calls,
                    Counter {
                        namespace: &tokens.name,
                        quota: quotas.tokens.unwrap_or(tokens.quota),
                        lowers: self.plan.reserves(),
                    },
                ],
                len: 2,
            },
        }
    }

    /// The name of counter `at`.
    pub(crate) fn namespace(&self, at: usize) -> &str {
        match (at, &self.tokens) {
            (0, _) | (_, None) => &self.name,
            (_, Some(tokens)) => &tokens.name,
        }
    }

    /// Where the counter a call's cost is spent from is: the tokens', or
    /// the one.
    pub(crate) fn cost_at(&self) -> usize {
        usize::from(self.tokens.is_some())
    }

    /// Sleeps until `until`, the end of the window the head of `place`'s
    /// line waits for; under limits held in the store, wakes sooner when a
    /// limit of `key` rises above the one the store turned the line away
    /// under, looking at the layer's copy a few times per staleness bound.
    async fn nap(&self, place: &Place, key: &Key, until: Instant) {
        let Some(stored) = &self.stored else {
            tokio::time::sleep_until(until).await;
            return;
        };
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            tokio::time::sleep_until(until.min(now + stored.look)).await;
            if Instant::now() < until && place.raised(&self.quotas(key)) {
                return;
            }
        }
    }

    /// The meaning of `hits`, a spend's answer on `counters`: counted in
    /// the store's step (every count within its limit), or turned away
    /// until the last of the counters that did not fit returns.
    #[inline]
    fn verdict(
        &self,
        hits: &Hits,
        counters: &[Counter<'_>],
        insured: bool,
    ) -> Result<Try, BackendError> {
        if hits.len() != counters.len() {
            return Err(failure::no_hit());
        }
        let mut denied: Option<Duration> = None;
        for (hit, counter) in hits.iter().zip(counters) {
            if hit.count > counter.quota.limit() {
                denied = Some(denied.map_or(hit.reset, |reset| reset.max(hit.reset)));
            }
        }
        if let Some(reset) = denied {
            return Ok(Try::Denied(reset));
        }
        // The cost's counter is the last; the calls' is first beside it.
        let (last, limit) = (
            hits[hits.len() - 1],
            counters[counters.len() - 1].quota.limit(),
        );
        let calls = (hits.len() > 1).then(|| hits[0]);
        let room = match calls {
            Some(calls) if calls.count >= counters[0].quota.limit() => 0,
            _ => limit - last.count,
        };
        Ok(Try::Admitted(Admitted {
            hit: Some(last),
            insured,
            room,
            calls,
        }))
    }
}

/// The wait of a call of `cost` on `key` that the budget did not admit at
/// once (`start`): in its key's line, in arrival order, until the store
/// admits it, or until it is clear that the budget cannot return within
/// the call's `max_wait` or `deadline`. That is judged again at every
/// window the line misses (each time the store turns a call of the line
/// away), at the share of each window the line has won while it waited
/// (the whole limit until it has had two whole windows; see
/// `Place::earliest`), so a call whose
/// windows other processes take fails as soon as its turn at that share
/// comes after its bound, not at its bound. Dropping it (a
/// cancelled call) spends nothing: only the store's admitting step
/// spends, and it is the last thing here.
pub(crate) async fn wait<Bk: Spending>(
    budget: Arc<Budget<Bk>>,
    key: Key,
    cost: u64,
    deadline: Option<(Instant, WaitBound)>,
    start: Start<Bk::Future>,
) -> Result<(Admitted, Option<SlotGuard>), BudgetError> {
    let arrived = Instant::now();
    let (bound, hit) = match deadline {
        Some((deadline, which)) if deadline < arrived + budget.max_wait => (deadline, which),
        _ => (
            arrived + budget.max_wait,
            WaitBound::MaxWait(budget.max_wait),
        ),
    };
    let (denied, under) = match start {
        Start::Pending(answer, quotas) => {
            match budget.judge(&key, cost, &quotas, budget.timed(answer).await)? {
                // Never under a cap in flight, whose calls start `Busy`.
                Try::Admitted(admitted) => match budget.heard.closed_for(&key) {
                    None => return Ok((admitted, None)),
                    // Closed by the provider's word while the store answered:
                    // the call waits for it as a denied one would.
                    Some(left) => (Some(left), None),
                },
                Try::Denied(reset) => (Some(reset), Some(quotas)),
            }
        }
        Start::Denied(reset, under) => (Some(reset), under),
        Start::Busy => (None, None),
    };
    let now = Instant::now();
    if let Some(reset) = denied
        && now + reset > bound
    {
        return Err(budget.exhausted(&key, reset, hit));
    }
    let (place, ahead) = budget
        .lines
        .join(
            &key,
            cost,
            budget.max_waiters,
            budget.quotas(&key).cost().window().as_duration(),
        )
        .ok_or_else(|| BudgetError::Overloaded {
            budget: Arc::clone(&budget.name),
            max_waiters: budget.max_waiters,
        })?;
    if let Some(reset) = denied {
        place.closed_until(now + reset.max(MIN_NAP));
        if let Some(under) = under {
            place.under(under);
        }
    }
    // Each look at what the budget can serve is under the quotas in force
    // then: a limit held in the store may change while the call waits.
    if let Some(earliest) = place.earliest(now, ahead, budget.quotas(&key).cost())
        && earliest > bound
    {
        return Err(budget.exhausted(&key, earliest - now, hit));
    }
    loop {
        let Ok(wake) = tokio::time::timeout_at(bound, place.turn()).await else {
            let now = Instant::now();
            let returns = place
                .earliest(now, place.ahead(), budget.quotas(&key).cost())
                .unwrap_or(now);
            return Err(budget.exhausted(&key, returns - now, hit));
        };
        let now = Instant::now();
        let turn = match wake {
            Wake::Turn(turn) => turn,
            Wake::Missed => {
                // The store turned a call of the line away: the window it
                // waited for went (to another process, or to calls ahead).
                if let Some(earliest) =
                    place.earliest(now, place.ahead(), budget.quotas(&key).cost())
                    && earliest > bound
                {
                    return Err(budget.exhausted(&key, earliest - now, hit));
                }
                continue;
            }
        };
        if turn == Turn::Head
            && let Some(opens_at) = place.opens_at(now)
        {
            // The one call of this line that waits for the window's end.
            if opens_at > bound {
                return Err(budget.exhausted(&key, opens_at - now, hit));
            }
            let most = jitter(budget.quotas(&key).cost());
            let wake = opens_at + budget.lines.jitter(most);
            budget.nap(&place, &key, wake.min(bound)).await;
        }
        // Closed by the provider's word in this process (its write to the
        // store may be late, or lost): no call goes before it opens.
        if let Some(left) = budget.heard.closed_for(&key) {
            let opens_at = Instant::now() + left;
            place.denied(opens_at);
            if opens_at > bound {
                return Err(budget.exhausted(&key, left, hit));
            }
            continue;
        }
        // Under a cap in flight, the slot first: a call of the line is
        // sent only with both, and one refused a slot holds the line as a
        // spent window does.
        let slot = match &budget.slots {
            None => None,
            Some(slots) => match budget.slot(slots, &key).await? {
                Ok(guard) => guard,
                Err(retry) => {
                    let opens_at = Instant::now() + next_ask(retry);
                    place.denied(opens_at);
                    if opens_at > bound {
                        return Err(budget.exhausted(&key, retry, hit));
                    }
                    continue;
                }
            },
        };
        let quotas = budget.quotas(&key);
        let answer = budget.timed(budget.spend(&key, cost, &quotas)).await;
        match budget.judge(&key, cost, &quotas, answer)? {
            Try::Admitted(admitted) => {
                // Closed by the provider's word while the store answered
                // (the store decided before the closure reached it): the
                // call is not sent before it opens, and asks again then.
                if let Some(left) = budget.heard.closed_for(&key) {
                    drop(slot);
                    let opens_at = Instant::now() + left;
                    place.denied(opens_at);
                    if opens_at > bound {
                        return Err(budget.exhausted(&key, left, hit));
                    }
                    continue;
                }
                place.admitted(admitted.room);
                return Ok((admitted, slot));
            }
            Try::Denied(reset) => {
                // The slot goes back at once (dropped here).
                drop(slot);
                let now = Instant::now();
                let opens_at = now + reset.max(MIN_NAP);
                place.denied(opens_at);
                place.under(quotas);
                if opens_at > bound {
                    return Err(budget.exhausted(&key, reset, hit));
                }
            }
        }
    }
}

impl<Bk> Budget<Bk> {
    /// A slot of `slots` for a call of `key`: its guard (none when the
    /// store is out and the failure policy passes the call uncounted), the
    /// time until the earliest lease runs out when the cap is full, or the
    /// failure policy's error.
    async fn slot(
        &self,
        slots: &Arc<dyn Slots>,
        key: &Key,
    ) -> Result<Result<Option<SlotGuard>, Duration>, BudgetError> {
        let id = SlotId::next();
        match Arc::clone(slots).take_boxed(key.clone(), id).await {
            Admission::Slot { local, .. } => {
                Ok(Ok(Some(Arc::clone(slots).guard(key.clone(), id, local))))
            }
            Admission::Uncounted => Ok(Ok(None)),
            Admission::Answered(taken) => Ok(Err(taken.retry)),
            Admission::Failed(error) => {
                if error.is_corrupt() {
                    failure::corrupt(&self.name, &error);
                }
                Err(BudgetError::Backend {
                    budget: Arc::clone(&self.name),
                    error,
                })
            }
        }
    }
}
