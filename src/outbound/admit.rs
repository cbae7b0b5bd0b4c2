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
use crate::key::Key;
use crate::quota::Quota;
use crate::request::RequestHead;

use crate::backend::SlotId;
use crate::in_flight::slot::{Admission, SlotGuard, Slots, next_ask};

use super::error::{BudgetError, WaitBound};
use super::line::{Lines, Turn, Wake};

/// The shortest nap between two asks of a spent budget, when the store says
/// it returns in less (a window that ends this millisecond).
const MIN_NAP: Duration = Duration::from_millis(1);

/// The longest wake-up jitter of a line's head (a twentieth of the window
/// when that is shorter).
const MAX_JITTER: Duration = Duration::from_millis(1);

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
}

/// One ask's answer.
pub(crate) enum Try {
    Admitted(Admitted),
    /// Spent; the store says the budget returns after this long.
    Denied(Duration),
}

/// Where a call's wait starts from.
pub(crate) enum Start<F> {
    /// The store is still answering the first ask.
    Pending(F),
    /// The first ask was turned away.
    Denied(Duration),
    /// Calls of its key already wait here: it queues behind them.
    Busy,
}

impl<Bk: Spending> Budget<Bk> {
    /// What the call with `head` spends.
    #[inline]
    pub(crate) fn cost(&self, head: &RequestHead<'_>) -> u64 {
        self.plan.cost(head)
    }

    /// The budget's one counter.
    #[inline]
    fn counter(&self) -> Counter<'_> {
        Counter {
            namespace: &self.name,
            quota: self.quota,
            // A settle may give back part of a reservation.
            lowers: self.plan.reserves(),
        }
    }

    /// The store's step for a call of `cost` on `key`.
    #[inline]
    pub(crate) fn spend(&self, key: &Key, cost: u64) -> Bk::Future {
        let counter = self.counter();
        self.backend
            .spend_all(key, std::slice::from_ref(&counter), self.plan.spend(cost))
    }

    /// What the store's answer to a spend of `cost` on `key` means for the
    /// call: admitted, turned away until the budget returns, or failed as
    /// the failure policy says.
    pub(crate) fn judge(
        &self,
        key: &Key,
        cost: u64,
        answer: Result<Hits, BackendError>,
    ) -> Result<Try, BudgetError> {
        match answer.and_then(one) {
            Ok(hit) => Ok(verdict(hit, self.quota.limit(), false)),
            Err(err) if err.is_corrupt() => {
                failure::corrupt(&self.name, &err);
                Err(self.backend_error(err))
            }
            Err(err) => self.outage(key, cost, err),
        }
    }

    /// The store failed: the failure policy decides.
    #[cold]
    fn outage(&self, key: &Key, cost: u64, err: BackendError) -> Result<Try, BudgetError> {
        let (name, gate) = (&*self.name, &*self.warn_gate);
        // What a call gets when its store fails under fail-closed.
        let fails = "failing the call";
        let decided = self.failure.decide(name, gate, err, fails, |insurance| {
            // The budget's counter, its limit cut to the share.
            let counter = Counter {
                quota: self.quota.share(insurance.share()),
                ..self.counter()
            };
            let counters = std::slice::from_ref(&counter);
            let hits = insurance.count(key, counters, Some(self.plan.spend(cost)))?;
            Ok(verdict(one(hits)?, counter.quota.limit(), true))
        });
        match decided {
            Outage::Insured(judged) => Ok(judged),
            Outage::Open => Ok(Try::Admitted(Admitted {
                hit: None,
                insured: false,
                room: 0,
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

    /// This budget cannot return within `bound` for a call: it returns in
    /// `retry_after`.
    pub(crate) fn exhausted(&self, retry_after: Duration, bound: WaitBound) -> BudgetError {
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

    /// The longest jitter of a line's head.
    fn jitter(&self) -> Duration {
        MAX_JITTER.min(self.quota.window().as_duration() / 20)
    }
}

/// The one hit of a store's answer about the budget's one counter.
#[inline]
fn one(hits: Hits) -> Result<Hit, BackendError> {
    hits.first().copied().ok_or_else(failure::no_hit)
}

/// A hit's meaning under `limit`: counted in the store's step (a spend's
/// count within its limit), or turned away until its reset.
fn verdict(hit: Hit, limit: u64, insured: bool) -> Try {
    if hit.count <= limit {
        Try::Admitted(Admitted {
            hit: Some(hit),
            insured,
            room: limit - hit.count,
        })
    } else {
        Try::Denied(hit.reset)
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
    let denied = match start {
        Start::Pending(answer) => match budget.judge(&key, cost, budget.timed(answer).await)? {
            // Never under a cap in flight, whose calls start `Busy`.
            Try::Admitted(admitted) => return Ok((admitted, None)),
            Try::Denied(reset) => Some(reset),
        },
        Start::Denied(reset) => Some(reset),
        Start::Busy => None,
    };
    let now = Instant::now();
    if let Some(reset) = denied
        && now + reset > bound
    {
        return Err(budget.exhausted(reset, hit));
    }
    let (place, ahead) = budget
        .lines
        .join(
            &key,
            cost,
            budget.max_waiters,
            budget.quota.window().as_duration(),
        )
        .ok_or_else(|| BudgetError::Overloaded {
            budget: Arc::clone(&budget.name),
            max_waiters: budget.max_waiters,
        })?;
    if let Some(reset) = denied {
        place.closed_until(now + reset.max(MIN_NAP));
    }
    if let Some(earliest) = place.earliest(now, ahead, budget.quota)
        && earliest > bound
    {
        return Err(budget.exhausted(earliest - now, hit));
    }
    loop {
        let Ok(wake) = tokio::time::timeout_at(bound, place.turn()).await else {
            let now = Instant::now();
            let returns = place
                .earliest(now, place.ahead(), budget.quota)
                .unwrap_or(now);
            return Err(budget.exhausted(returns - now, hit));
        };
        let now = Instant::now();
        let turn = match wake {
            Wake::Turn(turn) => turn,
            Wake::Missed => {
                // The store turned a call of the line away: the window it
                // waited for went (to another process, or to calls ahead).
                if let Some(earliest) = place.earliest(now, place.ahead(), budget.quota)
                    && earliest > bound
                {
                    return Err(budget.exhausted(earliest - now, hit));
                }
                continue;
            }
        };
        if turn == Turn::Head
            && let Some(opens_at) = place.opens_at(now)
        {
            // The one call of this line that waits for the window's end.
            if opens_at > bound {
                return Err(budget.exhausted(opens_at - now, hit));
            }
            let wake = opens_at + budget.lines.jitter(budget.jitter());
            tokio::time::sleep_until(wake.min(bound)).await;
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
                        return Err(budget.exhausted(retry, hit));
                    }
                    continue;
                }
            },
        };
        let answer = budget.timed(budget.spend(&key, cost)).await;
        match budget.judge(&key, cost, answer)? {
            Try::Admitted(admitted) => {
                place.admitted(admitted.room);
                return Ok((admitted, slot));
            }
            Try::Denied(reset) => {
                // The slot goes back at once (dropped here).
                drop(slot);
                let now = Instant::now();
                let opens_at = now + reset.max(MIN_NAP);
                place.denied(opens_at);
                if opens_at > bound {
                    return Err(budget.exhausted(reset, hit));
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
