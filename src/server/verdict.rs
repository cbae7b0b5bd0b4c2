//! The verdict: once the backend has answered (or failed), a request is
//! passed on, denied (429 / RESOURCE_EXHAUSTED), or answered for a failure
//! (503 / UNAVAILABLE under fail-closed, 500 / INTERNAL for corrupt state,
//! 400 or 500 for a request without a usable key).
//!
//! One function, [`decide`], makes that call for every request, whether the
//! backend answered at once or later (the response future calls it, in its
//! `start` or its poll): the failure policy with the insurance limiter, the
//! decision on the hits, and the request's tab when the layer counts by
//! outcome. The
//! verdict picks the answer; [`response`](crate::response) builds it and
//! writes every header, and the quota's metrics count the decision.

use std::sync::Arc;

use http::Response;

use crate::backend::{Backend, BackendError, Cap, Hits, Taken};
use crate::budget::failure::{self, Outage};
use crate::budget::settle::Wait;
use crate::core::{CapCore, Core};
use crate::cost::leased::SlotGuard;
use crate::decision::{Carry, Decision};
use crate::key::{Key, KeyError};
use crate::policy::{Policy, Selected};
use crate::request::RequestHead;
use crate::response::{self, Deny, InFlightFields};
use crate::server::tab::{Passed, RefundTab};

/// What the limiter does with a request.
pub(crate) enum Verdict<B, T> {
    /// Call the service; write the decision onto its answer
    /// ([`response::passed`]), if there is one: `None` for a request passed
    /// uncounted, or counted with nothing to show.
    Pass(Option<Passed>),
    /// Call the service, counted, under a layer that counts by outcome: its
    /// answer settles the tab, which holds the decision.
    Counted(Box<T>),
    /// Answer without calling the service.
    Respond(Response<B>),
    /// Answer without calling the service, once the denial's refunds,
    /// which no tokio runtime can finish in the background, are done.
    Refunding(Response<B>, Wait),
}

/// What a request gets when its store fails under fail-closed, in the
/// outage warning's words.
const FAILS: &str = "answering 503";

/// The request a verdict is on.
#[derive(Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) request: &'a RequestHead<'a>,
    pub(crate) policy: &'a Selected<'a>,
    /// Where a passed request's decision goes.
    pub(crate) carry: Carry,
    /// The key, for the insurance limiter and the keys denied most (a tab
    /// holds its own).
    pub(crate) key: Option<&'a Key>,
    /// What the request spends, under a layer that spends.
    pub(crate) cost: Option<u64>,
    /// The index of the quota the cost can never fit, when there is one:
    /// the backend was asked to spend it only to learn what the key's
    /// counters hold.
    pub(crate) never_fits: Option<usize>,
}

/// The verdict on `ask` given the backend's `result`; `tab` is the
/// request's under a layer that counts by outcome.
///
/// When the backend failed and the layer is insured, the insurance
/// limiter counts the request instead (what it counts is amended in its
/// own store). Under a tab, the request goes through [`tabbed`].
#[inline(always)]
pub(crate) fn decide<Bk, D, B>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    ask: Ask<'_>,
    tab: Option<Box<RefundTab<Bk, D>>>,
) -> Verdict<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    if let (Some(index), Some(cost)) = (ask.never_fits, ask.cost) {
        return never_fits(core, result, ask.policy, index, cost, ask.request, ask.key);
    }
    if let Err(err) = &result
        && core.settings.failure.insures(err)
    {
        let Err(err) = result else {
            unreachable!("matched as an error above")
        };
        return insured(core, err, &ask, tab);
    }
    match tab {
        None => {
            let judged = Judged {
                policy: ask.policy,
                request: ask.request,
                key: ask.key,
                cost: ask.cost,
            };
            judge(core, result, judged, ask.carry.anywhere(), false)
        }
        Some(tab) => {
            let kept = || ask.policy.to_arc();
            let judged = (&**ask.policy, ask.request, ask.cost);
            tabbed(core, result, judged, kept, tab, false)
        }
    }
}

/// A verdict under a cap, and the slot a passed request holds.
pub(crate) type Holds<B, T> = (Verdict<B, T>, Option<Box<Holding>>);

/// A slot a passed request holds until its answer's body ends, and what
/// its answer says of it.
pub(crate) struct Holding {
    guard: SlotGuard,
    /// The slots left after this one.
    left: u64,
    fields: Option<Arc<InFlightFields>>,
}

impl Holding {
    /// The slot `guard` asked for, before the store's answer: boxed at
    /// once, the one allocation a request under a cap keeps until its
    /// answer's body ends (and a future waiting on the store holds 8 bytes
    /// for it, not the guard's).
    pub(crate) fn boxed(guard: SlotGuard) -> Box<Self> {
        Box::new(Self {
            guard,
            left: 0,
            fields: None,
        })
    }

    /// Writes the cap's fields onto `response`; the guard goes to its body.
    pub(crate) fn onto<B>(self, response: &mut Response<B>) -> SlotGuard {
        if let Some(fields) = &self.fields {
            fields.write(response.headers_mut(), self.left, None);
        }
        self.guard
    }
}

/// [`decide`], under an in-flight cap when `slot` (the guard of the
/// request's slot) is there: the verdict, and the slot a passed request
/// holds.
#[inline(always)]
pub(crate) fn decide_holding<Bk, D, B>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    ask: Ask<'_>,
    tab: Option<Box<RefundTab<Bk, D>>>,
    slot: Option<Box<Holding>>,
) -> Holds<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    match slot {
        None => (decide(core, result, ask, tab), None),
        Some(held) => capped(core, result, ask, tab, held),
    }
}

/// [`decide_holding`] under a cap, whose store step took the slot with the
/// counters ([`Leasing::take_all`](crate::backend::Leasing::take_all)): a
/// full cap answers 429 with nothing counted; counters that refuse took no
/// slot, and decide as without a cap; a slot taken goes with a request
/// that passes, and back when it does not.
#[inline(never)]
fn capped<Bk, D, B>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    ask: Ask<'_>,
    tab: Option<Box<RefundTab<Bk, D>>>,
    mut held: Box<Holding>,
) -> Holds<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    let cap = core.cap.as_ref().expect("a slot's guard comes with a cap");
    let (result, taken) = match result {
        Ok(hits) => {
            let (hits, taken) = hits.split_taken();
            (Ok(hits), taken)
        }
        Err(err) => (Err(err), None),
    };
    let taken = match &result {
        Ok(_) => taken,
        Err(err) if err.is_corrupt() => {
            // Left as it is: nothing to give back.
            held.guard.disarm();
            return (decide(core, result, ask, tab), None);
        }
        Err(err) => {
            let insured = core.settings.failure.insures(err);
            return capped_outage(core, cap, result, ask, tab, held, insured);
        }
    };
    match taken {
        Some(taken) if !taken.granted => {
            held.guard.disarm();
            (busy(core, cap, taken, ask.request), None)
        }
        Some(taken) => {
            let verdict = decide(core, result, ask, tab);
            // A request that does not pass drops the guard: the slot goes
            // back.
            if !passes(&verdict) {
                return (verdict, None);
            }
            held.guard.hold();
            held.left = cap.in_flight.max().saturating_sub(taken.in_use);
            held.fields.clone_from(&cap.fields);
            (verdict, Some(held))
        }
        None => {
            // The counters refused: no slot was taken.
            held.guard.disarm();
            (decide(core, result, ask, tab), None)
        }
    }
}

/// [`capped`] when the store failed (not on corrupt state): its take may
/// have been made (a timeout), so the guard, dropped, gives it back by
/// name. Under insurance the slot is taken in this instance's share of
/// the cap first, then the counters are counted there too; otherwise the
/// failure policy decides as without a cap (a request passed uncounted
/// holds no slot).
#[cold]
fn capped_outage<Bk, D, B>(
    core: &Core<Bk, D>,
    cap: &CapCore,
    result: Result<Hits, BackendError>,
    ask: Ask<'_>,
    tab: Option<Box<RefundTab<Bk, D>>>,
    mut held: Box<Holding>,
    insured: bool,
) -> Holds<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    let s = &core.settings;
    let insurance = s.failure.insurance().filter(|_| insured);
    let Some(insurance) = insurance else {
        return (decide(core, result, ask, tab), None);
    };
    let in_flight = Cap {
        namespace: &s.name,
        in_flight: cap.in_flight,
    };
    match insurance.take(held.guard.key(), in_flight, held.guard.slot()) {
        Ok(taken) if taken.granted => {
            // The local slot's guard takes the place of the store's, which,
            // dropped, gives back the store's take, if any; the local one is
            // given back locally unless the request passes.
            let local = held.guard.local();
            drop(std::mem::replace(&mut held.guard, local));
            let verdict = decide(core, result, ask, tab);
            if !passes(&verdict) {
                return (verdict, None);
            }
            let share = insurance.share().of(cap.in_flight.max());
            held.left = share.saturating_sub(taken.in_use);
            held.fields.clone_from(&cap.fields);
            (verdict, Some(held))
        }
        Ok(taken) => (busy(core, cap, taken, ask.request), None),
        Err(local) => {
            s.metrics.backend_error(&s.name, &local);
            (decide(core, result, ask, tab), None)
        }
    }
}

/// Whether `verdict` calls the service.
fn passes<B, T>(verdict: &Verdict<B, T>) -> bool {
    matches!(verdict, Verdict::Pass(_) | Verdict::Counted(_))
}

/// The answer to `request`, refused a slot by a full cap (`taken`):
/// `429` with `Retry-After` (gRPC `RESOURCE_EXHAUSTED`) and the cap's
/// fields; nothing was counted. In shadow mode it passes, uncounted.
#[cold]
fn busy<Bk, D, B: Default, T>(
    core: &Core<Bk, D>,
    cap: &CapCore,
    taken: Taken,
    request: &RequestHead<'_>,
) -> Verdict<B, T> {
    let s = &core.settings;
    if s.shadow {
        tracing::debug!(limiter = %s.name, in_use = taken.in_use, "in-flight cap full (shadow mode): passing the request uncounted");
        return Verdict::Pass(None);
    }
    tracing::debug!(limiter = %s.name, in_use = taken.in_use, "in-flight cap full: answering 429");
    let mut response = response::busy(request.is_grpc(), taken.retry);
    if let Some(fields) = &cap.fields {
        let left = cap.in_flight.max().saturating_sub(taken.in_use);
        fields.write(response.headers_mut(), left, Some(taken.retry));
    }
    Verdict::Respond(response)
}

/// [`decide`] when the backend failed with `err` and the layer is insured:
/// the failure policy decides ([`Failure::decide`](crate::budget::failure::Failure::decide)),
/// with the insurance limiter's count of the request at its share, or as
/// in an outage when the limiter cannot decide either.
#[cold]
fn insured<Bk, D, B>(
    core: &Core<Bk, D>,
    err: BackendError,
    ask: &Ask<'_>,
    tab: Option<Box<RefundTab<Bk, D>>>,
) -> Verdict<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    let s = &core.settings;
    s.metrics.backend_error(&s.name, &err);
    let (key, cost) = match (ask.key, tab.as_deref()) {
        (Some(key), _) => (key, ask.cost),
        (None, Some(tab)) => (&tab.key, tab.cost()),
        (None, None) => return outage(core, err, ask.request),
    };
    let spend = match (cost, &s.spend) {
        (Some(cost), Some(plan)) => Some(plan.spend(cost)),
        _ => None,
    };
    let decided = s
        .failure
        .decide(&s.name, &s.warn_gate, err, FAILS, |insurance| {
            // The same counters, labels and metric handles, each limit cut
            // to the share: the insurance counts on them, and the judge
            // decides by them.
            let policy = ask.policy.insured(insurance.share());
            let counted = policy.with_counters(|counters| insurance.count(key, counters, spend));
            match counted {
                Ok(hits) => Ok((hits, policy)),
                Err(local) => {
                    s.metrics.backend_error(&s.name, &local);
                    Err(local)
                }
            }
        });
    let (hits, policy) = match decided {
        Outage::Insured(counted) => counted,
        Outage::Open => return Verdict::Pass(None),
        Outage::Closed(err) => return unavailable(err, ask.request),
    };
    match tab {
        None => {
            let judged = Judged {
                policy: &policy,
                request: ask.request,
                key: Some(key),
                cost: ask.cost,
            };
            judge(core, Ok(hits), judged, true, true)
        }
        Some(tab) => {
            // What the insurance counted is refunded, charged or cleared
            // in its own store, never in the backend.
            let policy = Arc::new(policy);
            let kept = || Arc::clone(&policy);
            let judged = (&*policy, ask.request, ask.cost);
            tabbed(core, Ok(hits), judged, kept, tab, true)
        }
    }
}

/// [`judge`] of `judged` (the policy, the request and its cost), for a
/// layer that counts by outcome: the hits and the policy
/// (`kept`, for what outlives the call) are kept on `tab` when they may be
/// refunded, for a request passed counted (after its answer) or denied (at
/// once). Any other verdict drops the tab: a failure or a request passed
/// uncounted has nothing to refund.
fn tabbed<Bk, D, B>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    judged: (&Policy, &RequestHead<'_>, Option<u64>),
    kept: impl FnOnce() -> Arc<Policy>,
    mut tab: Box<RefundTab<Bk, D>>,
    insured: bool,
) -> Verdict<B, RefundTab<Bk, D>>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    let counted = match &result {
        Ok(hits) => {
            tab.counted(hits, kept(), insured);
            true
        }
        Err(_) => false,
    };
    let (policy, request, cost) = judged;
    let judged = Judged {
        policy,
        request,
        key: Some(&tab.key),
        cost,
    };
    match judge(core, result, judged, true, insured) {
        Verdict::Pass(Some(passed)) => {
            tab.pass(passed);
            Verdict::Counted(tab)
        }
        Verdict::Respond(mut response) => match counted.then(|| tab.deny(&mut response)) {
            Some(Some(wait)) => Verdict::Refunding(response, wait),
            _ => Verdict::Respond(response),
        },
        verdict => verdict,
    }
}

/// What [`judge`] judges: the request, its key when it is known (to
/// count a denial among the keys denied most), its cost under a layer
/// that spends, and the policy whose counters were hit.
#[derive(Clone, Copy)]
struct Judged<'a> {
    policy: &'a Policy,
    request: &'a RequestHead<'a>,
    key: Option<&'a Key>,
    cost: Option<u64>,
}

/// The verdict on `judged`'s request, given the hits (or failure) `result`
/// on its policy's counters; `insured` when the insurance limiter counted
/// them.
///
/// Unless `read` (the decision on a passed request is carried to the
/// request or the response, settled under `count_if`, or insured), a
/// request that passes with nothing to show for it (no headers, no
/// metrics, no [`on_decision`](crate::RateLimitLayer::on_decision)
/// callback, no debug log, hits to spare) gets no decision at all: nobody
/// would read it.
#[inline(always)]
fn judge<Bk, D, B, T>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    judged: Judged<'_>,
    read: bool,
    insured: bool,
) -> Verdict<B, T>
where
    D: Deny<B>,
    B: Default,
{
    let Judged {
        policy,
        request,
        key,
        cost,
    } = judged;
    let s = &core.settings;
    if let Err(err) = &result {
        s.metrics.backend_error(&s.name, err);
    }
    let hits = match result {
        Ok(hits) => hits,
        Err(err) if err.is_corrupt() => {
            failure::corrupt(&s.name, &err);
            let mut response = response::corrupt(request.is_grpc());
            response.extensions_mut().insert(Arc::new(err));
            return Verdict::Respond(response);
        }
        Err(err) => return outage(core, err, request),
    };
    let Some((index, hit)) = policy.decisive(&hits) else {
        let err = failure::no_hit();
        s.metrics.backend_error(&s.name, &err);
        return outage(core, err, request);
    };
    if !read
        && s.observer.is_none()
        && policy.passes_unseen(index, hit)
        && !tracing::enabled!(tracing::Level::DEBUG)
    {
        return Verdict::Pass(None);
    }
    let mut decision = policy.decision(index, hit, cost, s.shadow, request.route_owned());
    if insured {
        decision.insure();
    }
    tracing::debug!(limiter = %s.name, policy = decision.policy(), count = decision.count(), limit = decision.limit(), outcome = ?decision.outcome(), insured, "rate-limit decision");
    conclude(core, policy, index, decision, request, key)
}

/// The verdict of `decision`, made on the quota at `index` of `policy`:
/// counted in the quota's metrics, shown to the observer, counted among
/// the keys denied most when it is over the limit (a denial, or a
/// shadowed one) and the layer counts them, then passed on or denied.
#[inline(always)]
fn conclude<Bk, D, B, T>(
    core: &Core<Bk, D>,
    policy: &Policy,
    index: usize,
    decision: Decision,
    request: &RequestHead<'_>,
    key: Option<&Key>,
) -> Verdict<B, T>
where
    D: Deny<B>,
    B: Default,
{
    policy.quota_metrics(index).record(&decision);
    if let Some(observer) = &core.settings.observer {
        observer(&decision);
    }
    if decision.over_limit()
        && let (Some(denied), Some(key)) = (&core.settings.denied, key)
    {
        denied.record(key);
    }
    if decision.passed() {
        return Verdict::Pass(Some(Passed {
            decision,
            quota: index,
        }));
    }
    Verdict::Respond(response::denial(&core.deny, decision, request.is_grpc()))
}

/// The verdict on `request`, whose `cost` is above the limit of the quota
/// at `index` of `policy`: denied (passed in shadow mode), with nothing
/// counted, since it could never be admitted. `result` is the backend's
/// answer to a spend of that cost, which spends nothing (a cost above a
/// limit never fits) and says what the key's counters hold; whatever the
/// backend answered, or however it failed, the request is denied, and
/// the insurance limiter is not asked.
#[cold]
fn never_fits<Bk, D, B, T>(
    core: &Core<Bk, D>,
    result: Result<Hits, BackendError>,
    policy: &Policy,
    index: usize,
    cost: u64,
    request: &RequestHead<'_>,
    key: Option<&Key>,
) -> Verdict<B, T>
where
    D: Deny<B>,
    B: Default,
{
    let s = &core.settings;
    let hit = match &result {
        Ok(hits) => hits.as_slice().get(index),
        Err(err) => {
            s.metrics.backend_error(&s.name, err);
            tracing::debug!(limiter = %s.name, error = %err, "rate-limit backend failed on a cost above the limit: denied, with nothing shown as left");
            None
        }
    };
    let decision = policy.never_fitting(index, cost, hit, s.shadow, request.route_owned());
    tracing::debug!(limiter = %s.name, policy = decision.policy(), cost, limit = decision.limit(), "rate-limit cost above the limit: the request can never be admitted");
    conclude(core, policy, index, decision, request, key)
}

/// The verdict on `request` when the backend failed with `err`: a pass
/// uncounted under fail-open, otherwise 503 (under insurance, when the
/// insurance limiter could not decide either).
#[cold]
fn outage<Bk, D, B: Default, T>(
    core: &Core<Bk, D>,
    err: BackendError,
    request: &RequestHead<'_>,
) -> Verdict<B, T> {
    let s = &core.settings;
    if s.failure.outage(&s.name, &s.warn_gate, &err, FAILS) {
        return Verdict::Pass(None);
    }
    unavailable(err, request)
}

/// The 503 (gRPC: UNAVAILABLE) answer to `request`, whose backend failed
/// with `err`.
#[cold]
fn unavailable<B: Default, T>(err: BackendError, request: &RequestHead<'_>) -> Verdict<B, T> {
    let mut response = response::unavailable(request.is_grpc());
    // Where a decision would be: what kind of failure answered.
    response.extensions_mut().insert(Arc::new(err));
    Verdict::Respond(response)
}

/// The answer to a request without a usable key, under
/// the default [`allow_missing_key(false)`](crate::RateLimitLayer::allow_missing_key).
pub(crate) fn key_rejected<Bk, D, B: Default>(
    core: &Core<Bk, D>,
    err: &KeyError,
    request: &RequestHead<'_>,
) -> Response<B> {
    let s = &core.settings;
    match err {
        KeyError::Misconfigured(_) => {
            if let Some(suppressed) = s.key_gate.admit() {
                tracing::error!(limiter = %s.name, error = %err, suppressed, "rate-limit key extractor misconfigured: answering 500");
            }
        }
        _ => {
            if let Some(suppressed) = s.key_gate.admit() {
                tracing::warn!(limiter = %s.name, error = %err, suppressed, "request without a usable rate-limit key: answering 400");
            }
        }
    }
    response::key_rejected(request.is_grpc(), err.status())
}
