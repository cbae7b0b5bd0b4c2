//! Coalesced requests: the requests issued while earlier ones are in
//! flight go to Redis together, many in one script call. What a request
//! carries is its [`Work`]: its hits (`hits.rs`, the batch script
//! `hit_batch.lua`), its spend or its amend (`spends.rs`), a take or
//! give-back of a slot in flight (`takes.rs`), or a slot taken with its
//! request's counters (`take_alls.rs`). Each kind has lanes of its own;
//! one call carries one kind.
//!
//! Requests wait in a *lane*: one lane for a standalone server (any keys can
//! go in one script call), one lane per hash slot on a Cluster (a script call
//! may only name keys of one slot). A request that finds its lane idle is
//! sent at once, from its own task: a request never waits for a timer to
//! fill a batch. While a lane's call is in flight, new requests queue; when
//! the answer is back, a driver task sends all of them in the next call, and
//! goes on until the queue is empty. A lane has one call in flight, or two
//! once as many requests queue behind the first as it carries (at most
//! [`SECOND_CALL_AT`]): under load, Redis then works on one call while the
//! answers of the other go out and their requests send their next ones, so
//! neither side waits a whole round trip for the other.
//!
//! A dropped request never leaves a half-done call behind: the script either
//! ran whole or not at all. A call sent by a driver goes on for the requests
//! still waiting; a dropped waiter only loses its answer. A request whose
//! waiter is gone before its call is sent is not sent, and a call whose
//! waiters are all gone is dropped (a call sent from a request's own task
//! goes with it, like a lone request's); the requests queued behind it get a
//! driver. A call that failed is never sent again by the lanes: each of its
//! requests was done once (the script ran) or not at all.
//!
//! A request may also be sent with nobody waiting for its answer
//! ([`detach`]: a slot given back when a request ends): it is queued as any
//! other, never withdrawn, and a call that carries one is never dropped for
//! its waiters being gone; its answer goes to [`Work::detached`]. It needs
//! no task of its own: behind a busy lane it waits in the queue, and in an
//! idle lane it starts the lane's driver, which then sends what queues
//! behind it too.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use futures_util::future::{Either, select};
use hashbrown::HashMap;
use hashbrown::hash_map::Entry;
use smallvec::SmallVec;

use super::connection::classify::{is_cross_slot, unavailable};
use super::connection::guarded::Guarded;
use super::connection::slot::key_slot;
use tower_pinned_window::backend::BackendError;
use tower_pinned_window::backend::toolkit::{BackendFuture, Reply};

/// At most this many requests go in one script call; the rest wait for the
/// next (bounds how long one call keeps Redis busy).
const MAX_PER_CALL: usize = 512;

/// A lane sends a second call while one is in flight (never a third) once
/// as many requests queue behind it as the call in flight carries, or this
/// many, whichever is fewer. Matching the call in flight keeps the two
/// calls of a lane about the same size, so that one's answers are being
/// written while the other is in Redis: with a fixed threshold above the
/// requests in flight (16 connections on one hot key), a lane never had two
/// calls, and the server sat idle for every round trip. The cap keeps a
/// large queue from waiting for an equally large one: at 64 in flight a
/// second call at 32 queued beat one at 8, 16, 24 or 48.
const SECOND_CALL_AT: usize = 32;

/// The lane of a standalone server: every key.
const ANY_SLOT: u32 = u32::MAX;

/// A request's work for a lane: its hits, its spend or its amend. All the
/// keys of one work share a hash slot (the crate's hash tag), so that one
/// script call can carry it on a Cluster.
pub(super) trait Work: Send + Sync + Sized + 'static {
    /// What the request gets back.
    type Answer: Send + 'static;

    /// A key of the work's: its slot is the work's lane on a Cluster.
    fn key(&self) -> &[u8];

    /// One script call for `works` (one lane's, in order), and each work's
    /// answer, in the same order. An error is the call's, for every work
    /// of it (a refusal as cross-slot sends them again, by slot).
    fn run<'a, C, B>(
        connection: &'a Guarded<C>,
        works: &'a [B],
    ) -> impl Future<Output = RedisResult<Answers<Self::Answer>>> + Send + 'a
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync;

    /// The answers of a call that came back to waiters who were gone (the
    /// layer's timeout): their requests were refused. By default nothing
    /// is done (a hit stays counted); a spend gives back what it spent.
    fn unread<C>(connection: &Guarded<C>, unread: Vec<(Self, Self::Answer)>)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let _ = (connection, unread);
    }

    /// The answer of `work`, sent with nobody waiting for it ([`detach`]).
    /// By default it is dropped.
    fn detached(work: Self, answer: Result<Self::Answer, BackendError>) {
        let _ = (work, answer);
    }
}

/// The answers of one call, one per work: one inline, so that a request
/// sent alone allocates nothing for its answer.
pub(super) type Answers<A> = SmallVec<[Result<A, BackendError>; 1]>;

/// What a request gets back from its lane.
pub(super) type Answered<W> = Result<<W as Work>::Answer, BackendError>;

/// One request's work, waiting in a lane.
pub(super) struct Pending<W: Work> {
    work: W,
    /// Where its answer goes; `None` for a request nobody waits for
    /// ([`detach`]), sent all the same.
    reply: Option<Reply<W::Answer>>,
}

impl<W: Work> Pending<W> {
    /// Its waiter is gone: it need not be sent. Never so for a request
    /// nobody waited for.
    fn is_closed(&self) -> bool {
        self.reply.as_ref().is_some_and(Reply::is_closed)
    }
}

impl<W: Work> Borrow<W> for Pending<W> {
    fn borrow(&self) -> &W {
        &self.work
    }
}

/// A lane exists while a task sends its calls: a hit's own task (its call
/// sent alone) or a driver; at most two, so at most two calls in flight.
struct Lane<W: Work> {
    queue: Vec<Pending<W>>,
    /// The tasks sending this lane's calls (1 or 2).
    calls: u8,
    /// The requests in the lane's calls in flight.
    flying: usize,
    /// The requests of the lane's last call: the room new answer slots
    /// start with.
    last_call: usize,
}

impl<W: Work> Lane<W> {
    /// A lane whose first call is a request's own (1 request in flight),
    /// its queue in `queue` (empty: a spare one, [`Lanes::spare`]).
    fn alone(queue: Vec<Pending<W>>) -> Self {
        debug_assert!(queue.is_empty());
        Self {
            queue,
            calls: 1,
            flying: 1,
            last_call: 1,
        }
    }

    /// An answer slot for a request to be queued: beside the last queued
    /// request's (one allocation for many requests), in new slots once the
    /// queue was taken.
    fn channel(&self) -> (Reply<W::Answer>, BackendFuture<W::Answer>) {
        Reply::channel(
            self.queue.last().and_then(|p| p.reply.as_ref()),
            self.last_call,
        )
    }

    /// Queued requests that make a second call: as many as the call in
    /// flight carries, at most [`SECOND_CALL_AT`].
    fn second_call_at(&self) -> usize {
        self.flying.clamp(1, SECOND_CALL_AT)
    }

    /// A task whose call is over has nothing more to send: the queue is
    /// empty, or the lane's other call will take it (too few to need a call
    /// of their own).
    fn done_with(&self) -> bool {
        self.queue.is_empty() || (self.calls > 1 && self.queue.len() < self.second_call_at())
    }

    /// A call of `requests` requests is over (answered, dropped or never
    /// sent).
    fn landed(&mut self, requests: usize) {
        self.flying = self.flying.saturating_sub(requests);
    }

    /// The next call of a task of this lane, into `batch` (empty): at most
    /// [`MAX_PER_CALL`] requests, none whose waiter is gone (nothing was
    /// counted for them). `false` when the task has nothing more to send.
    fn next_call(&mut self, batch: &mut Vec<Pending<W>>) -> bool {
        self.queue.retain(|p| !p.is_closed());
        if self.done_with() {
            return false;
        }
        self.take(batch);
        true
    }

    /// The next [`MAX_PER_CALL`] requests of the queue, into `batch`
    /// (empty), counted in flight.
    fn take(&mut self, batch: &mut Vec<Pending<W>>) {
        debug_assert!(batch.is_empty());
        let take = self.queue.len().min(MAX_PER_CALL);
        self.flying += take;
        self.last_call = take.max(1);
        // Once the queue is empty, the requests queued from now on share
        // new slots; these go when their requests have read them.
        batch.extend(self.queue.drain(..take));
    }

    /// Queue a hit; `true` when it is the lane's second call's turn: the
    /// caller takes that call's requests ([`take`](Self::take)) under the
    /// same lock, so that no other hit sees the lane with one call and a
    /// full queue, and spawns a driver for them.
    fn queue(&mut self, pending: Pending<W>) -> bool {
        self.queue.push(pending);
        if self.calls >= 2 || self.queue.len() < self.second_call_at() {
            return false;
        }
        self.queue.retain(|p| !p.is_closed());
        if self.queue.is_empty() {
            return false;
        }
        self.calls += 1;
        true
    }
}

/// Lists of requests kept emptied for the next, at most.
const SPARE_LISTS: usize = 4;

/// The most requests a kept list has room for: a list grown past it by a
/// burst is let go, so the lists kept are at most a few tens of KB.
const SPARE_ROOM: usize = 128;

/// A batcher's lanes, by slot, and the emptied lists its lanes' queues and
/// calls reuse.
struct Lanes<W: Work> {
    by_slot: HashMap<u32, Lane<W>>,
    /// Queues of lanes gone and batches of calls answered, emptied: a new
    /// lane's queue and a call's batch take one, so that a list grows once
    /// rather than once a lane or a call. At most [`SPARE_LISTS`], each
    /// with room for at most [`SPARE_ROOM`] requests.
    spare: Vec<Vec<Pending<W>>>,
}

impl<W: Work> Default for Lanes<W> {
    fn default() -> Self {
        Self {
            by_slot: HashMap::new(),
            spare: Vec::new(),
        }
    }
}

/// An emptied list of `spare`'s, or a new one.
fn spare_list<W: Work>(spare: &mut Vec<Vec<Pending<W>>>) -> Vec<Pending<W>> {
    spare.pop().unwrap_or_default()
}

/// The requests of a lane's next call ([`Lane::take`]), in a list of
/// `spare`'s.
fn take_call<W: Work>(lane: &mut Lane<W>, spare: &mut Vec<Vec<Pending<W>>>) -> Vec<Pending<W>> {
    let mut batch = spare_list(spare);
    lane.take(&mut batch);
    batch
}

/// `list`, emptied, kept in `spare` for the next lane or call.
fn keep_list<W: Work>(spare: &mut Vec<Vec<Pending<W>>>, mut list: Vec<Pending<W>>) {
    list.clear();
    if spare.len() < SPARE_LISTS && list.capacity() <= SPARE_ROOM {
        spare.push(list);
    }
}

/// The lanes of one kind of work, and the connection their calls go on.
pub(super) struct Batcher<C, W: Work> {
    /// The backend's connection, behind the same breakers.
    connection: Guarded<C>,
    lanes: Mutex<Lanes<W>>,
    /// Lanes are per slot: a Cluster connection (known from its type, or
    /// learnt from a `CROSSSLOT` refusal).
    by_slot: AtomicBool,
}

impl<C, W: Work> Batcher<C, W> {
    /// Lanes for calls on `connection`: by slot from the start on a Cluster
    /// connection.
    pub(super) fn new(connection: Guarded<C>, cluster: bool) -> Self {
        Self {
            connection,
            lanes: Mutex::default(),
            by_slot: AtomicBool::new(cluster),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lanes<W>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lane of `work`: the slot of its keys, computed only for lanes by
    /// slot, so a standalone server's calls never pay for the CRC.
    fn lane_of(&self, work: &W) -> u32 {
        if self.by_slot.load(Ordering::Relaxed) {
            u32::from(key_slot(work.key()))
        } else {
            ANY_SLOT
        }
    }
}

/// A task of `lane` has nothing more to send: the lane goes with its
/// last task (under the lock, so a request queued from then on starts a
/// lane of its own).
fn leave<W: Work>(lanes: &mut Lanes<W>, lane: u32) {
    if let Entry::Occupied(mut state) = lanes.by_slot.entry(lane) {
        state.get_mut().calls -= 1;
        if state.get().calls == 0 {
            keep_list(&mut lanes.spare, state.remove().queue);
        }
    }
}

/// Where [`enqueue`] put a request's work.
// Alone is large (it carries the request's work): boxing it would cost an
// allocation on a path that has none, and the value is matched as soon as
// it is made.
#[allow(clippy::large_enum_variant)]
pub(super) enum Enqueued<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    /// In the queue of a busy lane: the call that takes it answers here.
    Queued(BackendFuture<W::Answer>),
    /// The lane was idle: the request sends its own call
    /// ([`Alone::send`]).
    Alone(Alone<C, W>),
}

/// Put one request's work in its lane. Done at once, not when a future is
/// first polled: a request queued behind a call in flight (most, under
/// load) needs no future of its own, only the answer's receiver. Needs a
/// tokio runtime (the lane's driver is a task); the caller checks for one.
pub(super) fn enqueue<C, W>(
    batcher: &Arc<Batcher<C, W>>,
    runtime: &tokio::runtime::Handle,
    work: W,
) -> Enqueued<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    let lane = batcher.lane_of(&work);
    let mut lanes = batcher.lock();
    let Lanes { by_slot, spare } = &mut *lanes;
    match by_slot.entry(lane) {
        Entry::Occupied(mut busy) => {
            // Queued: the call that takes the work answers in a slot.
            let lane_state = busy.get_mut();
            let (reply, answer) = lane_state.channel();
            let second = lane_state
                .queue(Pending {
                    work,
                    reply: Some(reply),
                })
                .then(|| take_call(lane_state, spare));
            drop(lanes);
            if let Some(batch) = second {
                spawn_driver(batcher, runtime, lane, batch);
            }
            Enqueued::Queued(answer)
        }
        // An idle lane: this request goes at once, from its own task (no
        // driver task, no wake-up, no channel), and the lane is busy until
        // its answer is back.
        Entry::Vacant(idle) => {
            idle.insert(Lane::alone(spare_list(spare)));
            drop(lanes);
            // The handover is armed from here: should the request's future
            // be dropped before it sends, the lane passes to a driver all
            // the same.
            Enqueued::Alone(Alone {
                work,
                handover: Handover {
                    batcher: Arc::clone(batcher),
                    runtime: runtime.clone(),
                    lane,
                },
            })
        }
    }
}

/// A request whose work found its lane idle: it sends it itself.
pub(super) struct Alone<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    work: W,
    handover: Handover<C, W>,
}

impl<C, W> Alone<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    /// Send the call, hand the lane over, and give the request's answer.
    pub(super) async fn send(self) -> Answered<W> {
        let Self { work, handover } = self;
        let batcher = &handover.batcher;
        let result = W::run(&batcher.connection, std::slice::from_ref(&work)).await;
        match result {
            Ok(mut answers) => {
                drop(handover);
                answers.pop().unwrap_or_else(|| Err(dropped()))
            }
            Err(err) if handover.lane == ANY_SLOT && is_cross_slot(&err) => {
                // CROSSSLOT: nothing ran; the work goes again, by slot,
                // once this task has left the lane.
                batcher.by_slot.store(true, Ordering::Relaxed);
                let (batcher, runtime) = (Arc::clone(batcher), handover.runtime.clone());
                drop(handover);
                let (reply, answer) = Reply::channel(None, 1);
                submit(
                    &batcher,
                    &runtime,
                    Pending {
                        work,
                        reply: Some(reply),
                    },
                );
                answer.await
            }
            Err(err) => {
                drop(handover);
                Err(unavailable(err))
            }
        }
    }
}

/// The answer to a request whose call was dropped (its runtime shut down)
/// before it was answered.
pub(super) fn dropped() -> BackendError {
    BackendError::Unavailable("the Redis call was dropped before it was answered".into())
}

/// Ends a call sent from a request's own task, answered or dropped (or
/// never sent: the request's future was dropped first): the requests
/// queued behind it meanwhile get a driver, unless the lane's other call
/// takes them; with none, the task leaves the lane.
struct Handover<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    batcher: Arc<Batcher<C, W>>,
    runtime: tokio::runtime::Handle,
    lane: u32,
}

impl<C, W> Drop for Handover<C, W>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    fn drop(&mut self) {
        let mut lanes = self.batcher.lock();
        let Lanes { by_slot, spare } = &mut *lanes;
        let Some(state) = by_slot.get_mut(&self.lane) else {
            return;
        };
        state.landed(1);
        let mut batch = spare_list(spare);
        if !state.next_call(&mut batch) {
            keep_list(spare, batch);
            leave(&mut lanes, self.lane);
            return;
        }
        drop(lanes);
        // A driver takes this task's place in the lane.
        spawn_driver(&self.batcher, &self.runtime, self.lane, batch);
    }
}

/// Put `work` in its lane with nobody waiting for its answer: it is sent
/// all the same (never withdrawn, and its call never dropped for its
/// waiters being gone), and its answer goes to [`Work::detached`]. Behind a
/// busy lane it waits in the queue, with no task of its own; in an idle
/// lane it starts the lane's driver. Needs a tokio runtime, as
/// [`enqueue`].
pub(super) fn detach<C, W>(batcher: &Arc<Batcher<C, W>>, runtime: &tokio::runtime::Handle, work: W)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    submit(batcher, runtime, Pending { work, reply: None });
}

/// `pending` in its lane: queued behind a busy lane (or making its second
/// call), or the first call of a driver of an idle one.
fn submit<C, W>(batcher: &Arc<Batcher<C, W>>, runtime: &tokio::runtime::Handle, pending: Pending<W>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    let lane = batcher.lane_of(&pending.work);
    let start = {
        let mut lanes = batcher.lock();
        let Lanes { by_slot, spare } = &mut *lanes;
        match by_slot.entry(lane) {
            Entry::Occupied(mut busy) => {
                let state = busy.get_mut();
                state.queue(pending).then(|| take_call(state, spare))
            }
            Entry::Vacant(idle) => {
                idle.insert(Lane::alone(spare_list(spare)));
                let mut batch = spare_list(spare);
                batch.push(pending);
                Some(batch)
            }
        }
    };
    if let Some(batch) = start {
        spawn_driver(batcher, runtime, lane, batch);
    }
}

/// A driver for `lane`, sending `batch` first (already counted in the
/// lane's calls and in flight). Its guard is made here: should the task be
/// dropped before it first runs (its runtime shutting down), the lane goes
/// all the same.
fn spawn_driver<C, W>(
    batcher: &Arc<Batcher<C, W>>,
    runtime: &tokio::runtime::Handle,
    lane: u32,
    batch: Vec<Pending<W>>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    let guard = DriverGuard {
        batcher: Arc::clone(batcher),
        lane,
        armed: true,
    };
    runtime.spawn(drive(guard, runtime.clone(), batch));
}

/// Ends a lane's driver: on a normal exit it has left the lane; when the
/// task is dropped mid-call (its runtime shut down) or panics, the lane is
/// removed with its queue, whose waiters then get `Unavailable` instead of
/// waiting for a driver that is gone.
struct DriverGuard<C, W: Work> {
    batcher: Arc<Batcher<C, W>>,
    lane: u32,
    /// Still to be cleaned up: the driver has not ended normally.
    armed: bool,
}

impl<C, W: Work> Drop for DriverGuard<C, W> {
    fn drop(&mut self) {
        if self.armed {
            self.batcher.lock().by_slot.remove(&self.lane);
        }
    }
}

/// A lane's driver: sends `batch`, then what is queued, one call at a
/// time, until the queue is empty or the lane's other call takes what is
/// left.
async fn drive<C, W>(
    mut guard: DriverGuard<C, W>,
    runtime: tokio::runtime::Handle,
    first: Vec<Pending<W>>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    let (batcher, lane) = (Arc::clone(&guard.batcher), guard.lane);
    let mut batch = first;
    loop {
        let sent = batch.len();
        let retry = if lane == ANY_SLOT && batcher.by_slot.load(Ordering::Relaxed) {
            // Learnt that the connection is a Cluster: to the slots' lanes.
            true
        } else {
            let cross_slot = call(&batcher, &mut batch, lane == ANY_SLOT).await;
            if cross_slot {
                // CROSSSLOT: nothing ran; the work goes again, by slot.
                batcher.by_slot.store(true, Ordering::Relaxed);
            }
            cross_slot
        };
        if retry {
            for pending in batch.drain(..) {
                submit(&batcher, &runtime, pending);
            }
        }
        // The batch is empty now: the next call's requests go in it.
        let mut lanes = batcher.lock();
        let Lanes { by_slot, spare } = &mut *lanes;
        let Some(state) = by_slot.get_mut(&lane) else {
            keep_list(spare, batch);
            guard.armed = false;
            return;
        };
        state.landed(sent);
        if !state.next_call(&mut batch) {
            keep_list(spare, batch);
            leave(&mut lanes, lane);
            guard.armed = false;
            return;
        }
    }
}

/// One script call for `batch`, and each request's answer, which empties
/// it; `true`, the batch left as it was, when the server refused it as
/// cross-slot (nothing ran).
///
/// When every waiter of the batch is gone before Redis answers (the layer's
/// timeout during an outage, say), the call is dropped, as a lone
/// request's would be: a call still waiting for a connection is then never
/// sent.
async fn call<C, W>(batcher: &Batcher<C, W>, batch: &mut Vec<Pending<W>>, any_slot: bool) -> bool
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    let result = {
        let run = std::pin::pin!(W::run(&batcher.connection, batch));
        let abandoned = std::pin::pin!(all_closed(batch));
        match select(run, abandoned).await {
            Either::Left((result, _)) => Some(result),
            Either::Right(_) => None,
        }
    };
    let Some(result) = result else {
        tracing::debug!("every waiter of a batch is gone: the call is dropped");
        batch.clear();
        return false;
    };
    let answers = match result {
        Ok(answers) if answers.len() == batch.len() => answers,
        Ok(answers) => {
            let detail = format!("{} answers to a batch of {}", answers.len(), batch.len());
            batch
                .iter()
                .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                .collect()
        }
        Err(err) if any_slot && is_cross_slot(&err) => {
            tracing::debug!("keys of several slots in one call: coalescing by slot from now on");
            return true;
        }
        Err(err) => batch
            .iter()
            .map(|_| Err(unavailable(err.clone())))
            .collect(),
    };
    let mut unread = Vec::new();
    for (Pending { work, reply }, answer) in batch.drain(..).zip(answers) {
        let Some(reply) = reply else {
            W::detached(work, answer);
            continue;
        };
        // A waiter that is gone loses its answer: the work was done, and
        // is its kind's to undo (`Work::unread`).
        if let Err(Ok(answer)) = reply.send(answer) {
            unread.push((work, answer));
        }
    }
    if !unread.is_empty() {
        W::unread(&batcher.connection, unread);
    }
    false
}

/// Ready once every waiter of a call is gone; never for a call that
/// carries a request nobody waited for ([`detach`]). Waits on one waiter at
/// a time (a waiter that is gone stays gone), so a call costs one
/// registered waker and no future or allocation per waiter.
fn all_closed<W: Work>(batch: &[Pending<W>]) -> impl Future<Output = ()> + '_ {
    let mut next = 0;
    std::future::poll_fn(move |cx| {
        while let Some(Pending { reply, .. }) = batch.get(next) {
            match reply {
                // Sent whoever waits: the call is never abandoned.
                None => return std::task::Poll::Pending,
                Some(reply) if reply.poll_closed(cx).is_pending() => {
                    return std::task::Poll::Pending;
                }
                Some(_) => next += 1,
            }
        }
        std::task::Poll::Ready(())
    })
}

#[cfg(test)]
mod tests;
