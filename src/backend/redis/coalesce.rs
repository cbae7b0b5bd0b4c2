//! Coalesced hits: the hits issued while earlier ones are in flight go to
//! Redis together, in one call of the batch script (`hit_batch.lua`).
//!
//! Hits wait in a *lane*: one lane for a standalone server (any keys can go
//! in one script call), one lane per hash slot on a Cluster (a script call
//! may only name keys of one slot). A hit that finds its lane idle is sent
//! at once, from its own task (with the one-hit script when it has one
//! counter): a hit never waits for a timer to fill a batch. While a lane's
//! call is in flight, new hits queue; when the answer is back, a driver task
//! sends all of them in the next call, and goes on until the queue is empty.
//! A lane has one call in flight, or two once as many requests queue behind
//! the first as it carries (at most [`SECOND_CALL_AT`]): under load, Redis
//! then works on one call while the answers of the other go out and their
//! requests send their next hits, so neither side waits a whole round trip
//! for the other.
//!
//! Exactness: n hits on one counter are one `INCRBY n` in the script, with the
//! lifetime attached in the same atomic step when the counter has none; they
//! take the counts `c-n+1 ..= c`, exactly what n `INCR`s would have given,
//! and each hit gets its own count, the counter's time left and its deadline
//! (`PEXPIRETIME`). Hits on one key with different windows are separate
//! entries, applied in order, as if sent one after the other. A corrupt
//! counter answers its own entry; the other entries of the call are counted.
//!
//! A dropped hit never leaves a half-done call behind: the script either ran
//! whole or not at all. A call sent by a driver goes on for the hits still
//! waiting; a dropped waiter only loses its answer. A hit whose waiter is
//! gone before its call is sent is not sent, and a call whose waiters are
//! all gone is dropped (a call sent from a hit's own task goes with it, like
//! a lone hit's); the hits queued behind it get a driver.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, ServerErrorKind, Value};
use futures_util::future::{Either, select};
use hashbrown::HashMap;
use hashbrown::hash_map::Entry;
use smallvec::SmallVec;

use super::connection::breaker::{Guarded, unavailable};
use super::connection::slot::key_slot;
use super::reply::{parse_batch, parse_hit};
use super::script::{HIT, HIT_BATCH, Size, U64_DIGITS};
use super::slots::{ARENA_SLOTS, Arena, Reply, Ticket};
use crate::backend::deny_cache::DenyCache;
use crate::backend::{BackendError, Hit, Hits, storage_key};
use crate::quota::Quota;

/// At most this many requests' hits go in one script call; the rest wait for
/// the next (bounds how long one call keeps Redis busy).
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

/// The answer to one request: a result per counter, in order.
pub(super) type Answers = SmallVec<[Result<Hit, BackendError>; 2]>;

/// A storage key, inline when it fits (most do: an IPv6 address under a
/// short prefix and layer name), so that a hit allocates nothing for it.
pub(super) type StoredKey = SmallVec<[u8; 64]>;

/// One request's counters: storage key and window (ms) of each.
pub(super) type Counters = SmallVec<[(StoredKey, u64); 2]>;

/// What a request gets back: its hits, made by its [`Finish`] from the
/// call's answers.
pub(super) type Answered = Result<Hits, BackendError>;

/// One request's hits, waiting in a lane.
pub(super) struct Pending {
    /// Storage key and window (ms) of each counter the request hits.
    counters: Counters,
    /// What makes the request's hits of the call's answers.
    finish: Finish,
    reply: Reply<Answered>,
}

/// What turns the answers for a request's counters into its [`Hits`]: the
/// quotas, and the deny cache that remembers a denial.
pub(super) struct Finish {
    pub(super) quotas: SmallVec<[Quota; 2]>,
    pub(super) deny: Option<Arc<DenyCache>>,
    /// The length of the backend's prefix: a denied counter's namespace and
    /// key are read back from its storage key.
    pub(super) prefix: usize,
    /// When the hits were sent: a denial is remembered until this plus the
    /// time Redis said was left, never past the window in Redis.
    pub(super) sent: quanta::Instant,
}

impl Finish {
    /// The request's hits, from the answers for its `counters`.
    fn answered(&self, counters: &Counters, answers: Answers) -> Answered {
        self.hits(
            counters.iter().map(|(stored, _)| stored.as_slice()),
            answers,
        )
    }

    /// `stored`: the counters' storage keys, in the order of `answers`.
    pub(super) fn hits<'a>(
        &self,
        stored: impl Iterator<Item = &'a [u8]>,
        answers: Answers,
    ) -> Result<Hits, BackendError> {
        let mut hits = Hits::with_capacity(answers.len());
        for ((answer, quota), stored) in answers.into_iter().zip(&self.quotas).zip(stored) {
            let hit = answer?;
            if let Some(deny) = &self.deny
                && hit.count > quota.limit()
            {
                // Decoded only on a denial, which is rare: a hit that is
                // let through copies nothing for the cache.
                match storage_key::decode(&stored[..self.prefix], stored) {
                    Some((namespace, key)) => deny.insert(&namespace, &key, self.sent + hit.reset),
                    None => debug_assert!(false, "a storage key this backend made decodes"),
                }
            }
            hits.push(hit);
        }
        Ok(hits)
    }
}

/// The Cluster slot of a request's keys (one slot: they share the crate's
/// hash tag). Computed only for lanes by slot, so a standalone server's hits
/// never pay for the CRC.
fn slot(counters: &Counters) -> u16 {
    counters.first().map_or(0, |(key, _)| key_slot(key))
}

/// A lane exists while a task sends its calls: a hit's own task (its call
/// sent alone) or a driver; at most two, so at most two calls in flight.
struct Lane {
    queue: Vec<Pending>,
    /// The tasks sending this lane's calls (1 or 2).
    calls: u8,
    /// The requests in the lane's calls in flight.
    flying: usize,
    /// The answer slots of the requests queued from now on: one allocation
    /// for many requests. A new one once the queue is taken.
    arena: Option<Arc<Arena<Answered>>>,
    /// The requests of the lane's last call: the room a new arena starts
    /// with.
    last_call: usize,
}

impl Lane {
    /// A lane whose first call is a request's own (1 request in flight).
    fn alone() -> Self {
        Self {
            queue: Vec::new(),
            calls: 1,
            flying: 1,
            arena: None,
            last_call: 1,
        }
    }

    /// An answer slot for a request to be queued.
    fn channel(&mut self) -> (Reply<Answered>, Ticket<Answered>) {
        let hint = self.last_call;
        let arena = match &mut self.arena {
            Some(arena) if arena.len() < ARENA_SLOTS => arena,
            arena => arena.insert(Arena::with_capacity(hint)),
        };
        arena.channel()
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

    /// The next call of a task of this lane: at most [`MAX_PER_CALL`]
    /// requests, none whose waiter is gone (nothing was counted for them).
    /// `None` when the task has nothing more to send.
    fn next_call(&mut self) -> Option<Vec<Pending>> {
        self.queue.retain(|p| !p.reply.is_closed());
        if self.done_with() {
            return None;
        }
        Some(self.take())
    }

    /// The next [`MAX_PER_CALL`] requests of the queue, counted in flight.
    fn take(&mut self) -> Vec<Pending> {
        let take = self.queue.len().min(MAX_PER_CALL);
        self.flying += take;
        self.last_call = take.max(1);
        let batch = self.queue.drain(..take).collect();
        if self.queue.is_empty() {
            // The requests queued from now on share new slots; these go
            // when their requests have read them.
            self.arena = None;
        }
        batch
    }

    /// Queue a hit; when it is the lane's second call's turn, that call's
    /// requests (taken from the queue here, under the lock, so that no
    /// other hit sees the lane with one call and a full queue): the caller
    /// spawns a driver for them.
    fn queue(&mut self, pending: Pending) -> Option<Vec<Pending>> {
        self.queue.push(pending);
        if self.calls >= 2 || self.queue.len() < self.second_call_at() {
            return None;
        }
        self.queue.retain(|p| !p.reply.is_closed());
        if self.queue.is_empty() {
            return None;
        }
        self.calls += 1;
        Some(self.take())
    }
}

/// The lanes of one backend, and the connection their calls go on.
pub(super) struct Batcher<C> {
    /// The backend's connection, behind the same breakers.
    connection: Guarded<C>,
    lanes: Mutex<HashMap<u32, Lane>>,
    /// Lanes are per slot: a Cluster connection (known from its type, or
    /// learnt from a `CROSSSLOT` refusal).
    by_slot: AtomicBool,
}

impl<C> Batcher<C> {
    /// Lanes for calls on `connection`: by slot from the start on a Cluster
    /// connection.
    pub(super) fn new(connection: Guarded<C>, cluster: bool) -> Self {
        Self {
            connection,
            lanes: Mutex::default(),
            by_slot: AtomicBool::new(cluster),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Lane>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lane_of(&self, counters: &Counters) -> u32 {
        if self.by_slot.load(Ordering::Relaxed) {
            u32::from(slot(counters))
        } else {
            ANY_SLOT
        }
    }
}

/// A task of `lane` has nothing more to send: the lane goes with its
/// last task (under the lock, so a hit queued from then on starts a lane
/// of its own).
fn leave(lanes: &mut HashMap<u32, Lane>, lane: u32) {
    if let Entry::Occupied(mut state) = lanes.entry(lane) {
        state.get_mut().calls -= 1;
        if state.get().calls == 0 {
            state.remove();
        }
    }
}

/// Where [`enqueue`] put a request's hits.
// Alone is large (it carries the request's counters and finish): boxing it
// would cost an allocation on a path that has none, and the value is
// matched as soon as it is made.
#[allow(clippy::large_enum_variant)]
pub(super) enum Enqueued<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// In the queue of a busy lane: the call that takes them answers here.
    Queued(Ticket<Answered>),
    /// The lane was idle: the request sends its own call
    /// ([`Alone::send`]).
    Alone(Alone<C>),
}

/// Put one request's hits in their lane: `counters` are (storage key,
/// window in ms), `finish` makes the request's hits of their answers. Done at once, not when a future is first polled: a hit
/// queued behind a call in flight (most hits, under load) needs no future
/// of its own, only the answer's receiver. Needs a tokio runtime (the
/// lane's driver is a task); the caller checks for one.
pub(super) fn enqueue<C>(
    batcher: &Arc<Batcher<C>>,
    runtime: &tokio::runtime::Handle,
    counters: Counters,
    finish: Finish,
) -> Enqueued<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let lane = batcher.lane_of(&counters);
    let mut lanes = batcher.lock();
    match lanes.entry(lane) {
        Entry::Occupied(mut busy) => {
            // Queued: the call that takes the hits answers in a slot.
            let lane_state = busy.get_mut();
            let (reply, answer) = lane_state.channel();
            let second = lane_state.queue(Pending {
                counters,
                finish,
                reply,
            });
            drop(lanes);
            if let Some(batch) = second {
                spawn_driver(batcher, runtime, lane, batch);
            }
            Enqueued::Queued(answer)
        }
        // An idle lane: this hit goes at once, from the request's own task
        // (no driver task, no wake-up, no channel), and the lane is busy
        // until its answer is back.
        Entry::Vacant(idle) => {
            idle.insert(Lane::alone());
            drop(lanes);
            // The handover is armed from here: should the request's future
            // be dropped before it sends, the lane passes to a driver all
            // the same.
            Enqueued::Alone(Alone {
                counters,
                finish,
                handover: Handover {
                    batcher: Arc::clone(batcher),
                    runtime: runtime.clone(),
                    lane,
                },
            })
        }
    }
}

/// A request whose hits found their lane idle: it sends them itself.
pub(super) struct Alone<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    counters: Counters,
    finish: Finish,
    handover: Handover<C>,
}

impl<C> Alone<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Send the call, hand the lane over, and give the request's answers.
    pub(super) async fn send(self) -> Answered {
        let Self {
            counters,
            finish,
            handover,
        } = self;
        let batcher = &handover.batcher;
        if let [(key, window)] = counters.as_slice() {
            // One counter: the one-hit script, the cheapest call for Redis,
            // answered here.
            let answer = one(&batcher.connection, key, *window).await;
            drop(handover);
            return finish.answered(&counters, std::iter::once(answer).collect());
        }
        // Several: the batch script, answered like a queued request's (a
        // refusal as cross-slot sends them again, through lanes).
        let (reply, answer) = Arena::with_capacity(1).channel();
        let pending = Pending {
            counters,
            finish,
            reply,
        };
        let retry = call(batcher, vec![pending], handover.lane == ANY_SLOT).await;
        if let Some(retry) = retry {
            // CROSSSLOT: nothing ran; the hits go again, by slot, once this
            // task has left the lane.
            batcher.by_slot.store(true, Ordering::Relaxed);
            let (batcher, runtime) = (Arc::clone(batcher), handover.runtime.clone());
            drop(handover);
            for pending in retry {
                submit(&batcher, &runtime, pending);
            }
        } else {
            drop(handover);
        }
        answer.await.unwrap_or_else(|_| Err(dropped()))
    }
}

/// The answer to a request whose call was dropped (its runtime shut down)
/// before it was answered.
pub(super) fn dropped() -> BackendError {
    BackendError::Unavailable("the Redis call was dropped before it was answered".into())
}

/// One hit on one counter, alone: the one-hit script
/// ([`HIT_SCRIPT`](super::script::HIT_SCRIPT)), what a batch of one would do.
async fn one<C>(connection: &Guarded<C>, key: &[u8], window: u64) -> Result<Hit, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let reply = HIT
        .run_on_key(&mut connection.for_key(key), key, Some(window))
        .await
        .map_err(unavailable)?;
    parse_hit(reply, key)
}

/// Ends a call sent from a hit's own task, answered or dropped (or never
/// sent: the request's future was dropped first): the hits queued behind it
/// meanwhile get a driver, unless the lane's other call takes them; with
/// none, the task leaves the lane.
struct Handover<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    batcher: Arc<Batcher<C>>,
    runtime: tokio::runtime::Handle,
    lane: u32,
}

impl<C> Drop for Handover<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        let mut lanes = self.batcher.lock();
        let Some(state) = lanes.get_mut(&self.lane) else {
            return;
        };
        state.landed(1);
        let Some(batch) = state.next_call() else {
            leave(&mut lanes, self.lane);
            return;
        };
        drop(lanes);
        // A driver takes this task's place in the lane.
        spawn_driver(&self.batcher, &self.runtime, self.lane, batch);
    }
}

fn submit<C>(batcher: &Arc<Batcher<C>>, runtime: &tokio::runtime::Handle, pending: Pending)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let lane = batcher.lane_of(&pending.counters);
    let start = {
        let mut lanes = batcher.lock();
        match lanes.entry(lane) {
            Entry::Occupied(mut busy) => busy.get_mut().queue(pending),
            Entry::Vacant(idle) => {
                idle.insert(Lane::alone());
                Some(vec![pending])
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
fn spawn_driver<C>(
    batcher: &Arc<Batcher<C>>,
    runtime: &tokio::runtime::Handle,
    lane: u32,
    batch: Vec<Pending>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
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
struct DriverGuard<C> {
    batcher: Arc<Batcher<C>>,
    lane: u32,
    /// Still to be cleaned up: the driver has not ended normally.
    armed: bool,
}

impl<C> Drop for DriverGuard<C> {
    fn drop(&mut self) {
        if self.armed {
            self.batcher.lock().remove(&self.lane);
        }
    }
}

/// A lane's driver: sends `batch`, then what is queued, one call at a
/// time, until the queue is empty or the lane's other call takes what is
/// left.
async fn drive<C>(mut guard: DriverGuard<C>, runtime: tokio::runtime::Handle, first: Vec<Pending>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let (batcher, lane) = (Arc::clone(&guard.batcher), guard.lane);
    let mut batch = first;
    loop {
        let sent = batch.len();
        let retry = if lane == ANY_SLOT && batcher.by_slot.load(Ordering::Relaxed) {
            // Learnt that the connection is a Cluster: to the slots' lanes.
            Some(batch)
        } else {
            call(&batcher, batch, lane == ANY_SLOT).await.inspect(|_| {
                // CROSSSLOT: nothing ran; the hits go again, by slot.
                batcher.by_slot.store(true, Ordering::Relaxed);
            })
        };
        for pending in retry.into_iter().flatten() {
            submit(&batcher, &runtime, pending);
        }
        let mut lanes = batcher.lock();
        let Some(state) = lanes.get_mut(&lane) else {
            guard.armed = false;
            return;
        };
        state.landed(sent);
        let Some(next) = state.next_call() else {
            leave(&mut lanes, lane);
            guard.armed = false;
            return;
        };
        batch = next;
    }
}

/// One script call for `batch`, and each request's answers. Gives the batch
/// back when the server refused it as cross-slot (nothing ran).
///
/// When every waiter of the batch is gone before Redis answers (the layer's
/// timeout during an outage, say), the call is dropped, as a lone hit's
/// would be: a call still waiting for a connection is then never sent.
async fn call<C>(batcher: &Batcher<C>, batch: Vec<Pending>, any_slot: bool) -> Option<Vec<Pending>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    // One entry per distinct (key, window), with its number of hits; each
    // request's counters are (entry, the hit's place among the entry's).
    let mut entries: Vec<(&[u8], u64, u64)> = Vec::with_capacity(batch.len());
    // A hashbrown map (foldhash, seeded per process), not SipHash: it holds
    // at most MAX_PER_CALL keys, so even keys chosen to collide cost a
    // bounded amount per call.
    let mut index: HashMap<(&[u8], u64), usize> = HashMap::with_capacity(batch.len());
    let mut places: Vec<SmallVec<[(usize, u64); 2]>> = Vec::with_capacity(batch.len());
    for Pending { counters, .. } in &batch {
        let mut place = SmallVec::new();
        for (key, window) in counters {
            let at = match index.entry((key.as_slice(), *window)) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    entries.push((key.as_slice(), *window, 0));
                    *e.insert(entries.len() - 1)
                }
            };
            place.push((at, entries[at].2));
            entries[at].2 += 1;
        }
        places.push(place);
    }
    drop(index);

    let reply = {
        let eval = std::pin::pin!(eval(&batcher.connection, &entries));
        let abandoned = std::pin::pin!(all_closed(&batch));
        match select(eval, abandoned).await {
            Either::Left((reply, _)) => reply,
            Either::Right(_) => {
                tracing::debug!("every waiter of a batch is gone: the call is dropped");
                return None;
            }
        }
    };
    // Each entry's last hit.
    let mut replies: Vec<Result<Hit, BackendError>> = match reply {
        Ok(reply) => parse_batch(reply, &entries).unwrap_or_else(|other| {
            let detail = format!(
                "unexpected reply to a batch of {}: {other:?}",
                entries.len()
            );
            entries
                .iter()
                .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                .collect()
        }),
        Err(err) if any_slot && err.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) => {
            tracing::debug!("keys of several slots in one call: coalescing by slot from now on");
            drop(entries);
            return Some(batch);
        }
        Err(err) => entries
            .iter()
            .map(|_| Err(unavailable(err.clone())))
            .collect(),
    };
    // The entry's n hits took count-n+1 ..= count, in order: each reply
    // becomes its entry's first hit, and the nth hit's count is that plus n.
    for (reply, &(_, _, hits)) in replies.iter_mut().zip(&entries) {
        if let Ok(hit) = reply {
            hit.count = hit.count.saturating_sub(hits - 1);
        }
    }
    drop(entries);
    for (
        Pending {
            counters,
            finish,
            reply,
        },
        place,
    ) in batch.into_iter().zip(places)
    {
        let answers: Answers = place
            .iter()
            .map(|&(at, nth)| match &replies[at] {
                Ok(first) => Ok(Hit {
                    count: first.count + nth,
                    ..*first
                }),
                Err(err) => Err(copy(err)),
            })
            .collect();
        // A waiter that is gone only loses its answer: the hit was counted,
        // with its lifetime, like a request whose client went away.
        let _ = reply.send(finish.answered(&counters, answers));
    }
    None
}

/// Ready once every waiter of a call is gone. Waits on one waiter at a time
/// (a waiter that is gone stays gone), so a call costs one registered waker
/// and no future or allocation per waiter.
fn all_closed(batch: &[Pending]) -> impl Future<Output = ()> + '_ {
    let mut next = 0;
    std::future::poll_fn(move |cx| {
        while let Some(Pending { reply, .. }) = batch.get(next) {
            if reply.poll_closed(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            next += 1;
        }
        std::task::Poll::Ready(())
    })
}

/// The batch script for `entries` (storage key, window in ms, hits): every
/// key, then each entry's hits and window. The breaker is the one of the
/// call's slot (one slot, on a Cluster), named by its first key.
async fn eval<C>(
    connection: &Guarded<C>,
    entries: &[(&[u8], u64, u64)],
) -> ::redis::RedisResult<Value>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let size = Size {
        keys: entries.len(),
        args: 3 * entries.len(),
        bytes: entries
            .iter()
            .map(|(key, _, _)| key.len() + 2 * U64_DIGITS)
            .sum(),
    };
    let first = entries.first().map_or(&[][..], |(key, _, _)| key);
    HIT_BATCH
        .run(&mut connection.for_key(first), size, |cmd| {
            for (key, _, _) in entries {
                cmd.arg(*key);
            }
            for (_, window, hits) in entries {
                cmd.arg(*hits).arg(*window);
            }
        })
        .await
}

/// The same error again, for every hit of an entry.
fn copy(err: &BackendError) -> BackendError {
    match err {
        BackendError::Corrupt { key, detail } => BackendError::Corrupt {
            key: key.clone(),
            detail: detail.clone(),
        },
        BackendError::TimedOut => BackendError::TimedOut,
        BackendError::AtCapacity => BackendError::AtCapacity,
        other => BackendError::Unavailable(other.to_string().into()),
    }
}
