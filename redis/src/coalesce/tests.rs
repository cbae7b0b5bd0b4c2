//! The lanes' rules, over an in-process fake connection that answers,
//! holds, fails or half-answers each call as its test scripts it, and
//! records what each call carried. A test [`Job`] is one request: an id,
//! answered with itself, in a call of one command that names the ids in
//! order. The fake also counts hits as the hit scripts do, for the lanes of
//! [`HitWork`]. The real-Redis tests (`integration/tests/redis*.rs`) check
//! the scripts themselves, and spends.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use ::redis::{Arg, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::oneshot;

use super::*;
use crate::hits::{CounterQuota, Finish, HitWork, StoredKey};
use tower_pinned_window::Quota;

/// What the fake does with a call, in the order calls come; a call with no
/// step left is answered.
enum Step {
    /// Waits until the test opens the gate, then answers; the gate dropped
    /// unopened is the connection lost mid-call.
    Hold(oneshot::Receiver<()>),
    /// The connection fails: an I/O error for the whole call.
    Fail,
    /// Half done: the reply holds the answers of the first half of the
    /// call's requests only.
    Half,
}

/// What the fake was told to do, and what it saw.
#[derive(Default)]
struct Log {
    plan: Mutex<VecDeque<Step>>,
    /// The ids each call carried, in the order the calls were sent.
    calls: Mutex<Vec<Vec<u64>>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// The counters of the hit scripts' calls.
    counters: Mutex<HashMap<Vec<u8>, i64>>,
}

impl Log {
    /// A hit script's call (`EVALSHA sha numkeys keys.. args..`), run at
    /// once, as Redis runs it: the one-hit script (one key, its window:
    /// `{count, ttl, -1}`), or the batch script (each key's hits and
    /// window: no clock, then each entry's count and time left, packed).
    fn hit_script(&self, args: &[&[u8]]) -> Value {
        let number = |arg: &[u8]| std::str::from_utf8(arg).unwrap().parse::<i64>().unwrap();
        let keys = usize::try_from(number(args[2])).unwrap();
        let (keys, numbers) = args[3..].split_at(keys);
        let mut counters = self.counters.lock().unwrap();
        let mut count = |key: &[u8], hits: i64| {
            let count = counters.entry(key.to_vec()).or_default();
            *count += hits;
            *count
        };
        if let ([key], [window]) = (keys, numbers) {
            return Value::Array(vec![
                Value::Int(count(key, 1)),
                Value::Int(number(window)),
                Value::Int(-1),
            ]);
        }
        let mut packed = Vec::new();
        for (key, pair) in keys.iter().zip(numbers.chunks_exact(2)) {
            packed.extend_from_slice(&count(key, number(pair[0])).to_be_bytes());
            packed.extend_from_slice(&number(pair[1]).to_be_bytes());
        }
        Value::Array(vec![Value::Int(-1), Value::BulkString(packed)])
    }
}

/// The fake connection: clones share one [`Log`].
#[derive(Clone, Default)]
struct Fake(Arc<Log>);

impl Fake {
    fn plan(&self, steps: impl IntoIterator<Item = Step>) {
        self.0.plan.lock().unwrap().extend(steps);
    }

    fn calls(&self) -> Vec<Vec<u64>> {
        self.0.calls.lock().unwrap().clone()
    }

    /// Every id sent, in the order sent.
    fn sent(&self) -> Vec<u64> {
        self.calls().concat()
    }

    fn most_in_flight(&self) -> usize {
        self.0.most_in_flight.load(Ordering::SeqCst)
    }
}

/// A call of the fake's in flight: counted until it is answered or dropped.
struct Flying(Arc<Log>);

impl Flying {
    fn new(log: &Arc<Log>) -> Self {
        let now = log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        log.most_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(Arc::clone(log))
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn io(kind: std::io::ErrorKind) -> RedisError {
    RedisError::from(std::io::Error::from(kind))
}

impl ConnectionLike for Fake {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(arg) => arg,
                _ => unreachable!("only plain arguments"),
            })
            .collect();
        let (whole, half) = match args[0] {
            b"LANE" => {
                let ids: Vec<i64> = args[1..]
                    .iter()
                    .map(|id| std::str::from_utf8(id).unwrap().parse().unwrap())
                    .collect();
                self.0
                    .calls
                    .lock()
                    .unwrap()
                    .push(ids.iter().map(|&id| id as u64).collect());
                let answer =
                    |ids: &[i64]| Value::Array(ids.iter().copied().map(Value::Int).collect());
                (answer(&ids), answer(&ids[..ids.len() / 2]))
            }
            b"EVALSHA" => (self.0.hit_script(&args), Value::Nil),
            other => unreachable!("the fake knows no {other:?}"),
        };
        let step = self.0.plan.lock().unwrap().pop_front();
        let flying = Flying::new(&self.0);
        Box::pin(async move {
            let _flying = flying;
            match step {
                None => Ok(whole),
                Some(Step::Hold(gate)) => match gate.await {
                    Ok(()) => Ok(whole),
                    Err(_) => Err(io(std::io::ErrorKind::ConnectionAborted)),
                },
                Some(Step::Fail) => Err(io(std::io::ErrorKind::ConnectionReset)),
                Some(Step::Half) => Ok(half),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        unreachable!("the lanes send no pipeline")
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A job nobody waited for, as [`Work::detached`] saw it: its id, and its
/// answer (`None` for an error).
type Detached = (u64, Option<u64>);

/// One request of the tests.
struct Job {
    id: u64,
    /// The answers given back by [`Work::unread`] (their waiters gone),
    /// shared by a test's jobs.
    unread: Arc<Mutex<Vec<u64>>>,
    /// The answers of the jobs nobody waited for ([`Work::detached`]): the
    /// job's id, and its answer or `None` for an error.
    detached: Arc<Mutex<Vec<Detached>>>,
    /// Held while the job lives: a test counts the jobs left (none leak).
    _alive: Arc<()>,
}

impl Work for Job {
    type Answer = u64;

    fn key(&self) -> &[u8] {
        b"tpw:test{k}"
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<u64>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        let mut cmd = ::redis::cmd("LANE");
        for work in works {
            cmd.arg(work.borrow().id);
        }
        let first = works.first().map_or(&[][..], |work| work.borrow().key());
        let reply: Vec<u64> = cmd.query_async(&mut connection.for_key(first)).await?;
        Ok(reply.into_iter().map(Ok).collect())
    }

    fn unread<C>(_: &Guarded<C>, unread: Vec<(Self, u64)>)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        for (work, answer) in unread {
            work.unread.lock().unwrap().push(answer);
        }
    }

    fn detached(work: Self, answer: Answered<Self>) {
        work.detached.lock().unwrap().push((work.id, answer.ok()));
    }
}

/// A test's lanes on its fake, and what its jobs share.
struct Lanes {
    fake: Fake,
    batcher: Arc<Batcher<Fake, Job>>,
    unread: Arc<Mutex<Vec<u64>>>,
    detached: Arc<Mutex<Vec<Detached>>>,
    alive: Arc<()>,
}

type Waiter = Pin<Box<dyn Future<Output = Answered<Job>> + Send>>;

impl Lanes {
    /// The lanes of a standalone server (one lane), no breaker.
    fn new() -> Self {
        let fake = Fake::default();
        Self {
            batcher: Arc::new(Batcher::new(Guarded::new(fake.clone(), None, None), false)),
            fake,
            unread: Arc::default(),
            detached: Arc::default(),
            alive: Arc::default(),
        }
    }

    fn job(&self, id: u64) -> Job {
        Job {
            id,
            unread: Arc::clone(&self.unread),
            detached: Arc::clone(&self.detached),
            _alive: Arc::clone(&self.alive),
        }
    }

    /// Request `id`, put in its lane now with nobody waiting for it.
    fn detach(&self, id: u64) {
        detach(
            &self.batcher,
            &tokio::runtime::Handle::current(),
            self.job(id),
        );
    }

    /// The answers of the requests nobody waited for, once `n` came.
    async fn detached(&self, n: usize) -> Vec<Detached> {
        for _ in 0..10_000 {
            if self.detached.lock().unwrap().len() >= n {
                break;
            }
            tokio::task::yield_now().await;
        }
        self.detached.lock().unwrap().clone()
    }

    /// Request `id`, put in its lane now (as the backend does); the waiter
    /// of its answer.
    fn request(&self, id: u64) -> Waiter {
        match enqueue(
            &self.batcher,
            &tokio::runtime::Handle::current(),
            self.job(id),
        ) {
            Enqueued::Queued(answer) => Box::pin(answer),
            Enqueued::Alone(alone) => Box::pin(alone.send()),
        }
    }

    /// Requests `ids`, each waited for by a task of its own.
    fn spawn(&self, ids: std::ops::Range<u64>) -> Vec<tokio::task::JoinHandle<Answered<Job>>> {
        ids.map(|id| tokio::spawn(self.request(id))).collect()
    }

    /// Let the tasks run until the fake has seen `calls` calls.
    async fn until_sent(&self, calls: usize) {
        for _ in 0..10_000 {
            if self.fake.calls().len() >= calls {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{calls} calls never went out: {:?}", self.fake.calls());
    }

    /// Every lane gone and every job dropped: nothing is left behind.
    async fn assert_nothing_left(&self) {
        for _ in 0..10_000 {
            if self.batcher.lock().by_slot.is_empty() && Arc::strong_count(&self.alive) == 1 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "left behind: {} lane(s), {} job(s)",
            self.batcher.lock().by_slot.len(),
            Arc::strong_count(&self.alive) - 1
        );
    }
}

/// The answer of a waiter; a waiter that never gets one fails the test
/// (the clock is paused: the runtime moves it on once every task waits).
async fn answer(waiter: tokio::task::JoinHandle<Answered<Job>>) -> Answered<Job> {
    tokio::time::timeout(Duration::from_secs(3600), waiter)
        .await
        .expect("a caller hangs")
        .expect("its task ran")
}

async fn answers(waiters: Vec<tokio::task::JoinHandle<Answered<Job>>>) -> Vec<Answered<Job>> {
    let mut all = Vec::new();
    for waiter in waiters {
        all.push(answer(waiter).await);
    }
    all
}

fn gate() -> (oneshot::Sender<()>, Step) {
    let (open, gate) = oneshot::channel();
    (open, Step::Hold(gate))
}

fn is_unavailable(answer: &Answered<Job>) -> bool {
    matches!(answer, Err(BackendError::Unavailable(_)))
}

#[tokio::test(start_paused = true)]
async fn answers_reach_their_callers_in_order() {
    let lanes = Lanes::new();
    let (open, hold) = gate();
    lanes.fake.plan([hold]);
    // 0 goes alone and is held; 1 makes the lane's second call; the rest
    // queue behind them.
    let waiters = lanes.spawn(0..40);
    lanes.until_sent(3).await;
    open.send(()).unwrap();
    let answers = answers(waiters).await;
    for (id, answer) in (0..).zip(&answers) {
        assert_eq!(
            answer.as_ref().ok(),
            Some(&id),
            "request {id}: its own answer"
        );
    }
    assert_eq!(
        lanes.fake.sent(),
        (0..40).collect::<Vec<_>>(),
        "each request sent once, in the order it came"
    );
    assert!(
        lanes.fake.calls().len() < 40,
        "the queued requests share a call: {:?}",
        lanes.fake.calls()
    );
    assert_eq!(
        lanes.fake.most_in_flight(),
        2,
        "never more than two calls in flight"
    );
    assert!(
        lanes.unread.lock().unwrap().is_empty(),
        "every answer was read"
    );
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_loses_only_its_answer_and_nothing_leaks() {
    let lanes = Lanes::new();
    let ((open_0, hold_0), (open_1, hold_1), (open_2, hold_2)) = (gate(), gate(), gate());
    lanes.fake.plan([hold_0, hold_1, hold_2]);
    let mut waiters = lanes.spawn(0..2);
    // Queued behind the two calls in flight: 3 and 4 are waited for by
    // the test itself, to drop them.
    waiters.push(tokio::spawn(lanes.request(2)));
    let (three, four) = (lanes.request(3), lanes.request(4));
    waiters.extend(lanes.spawn(5..7));
    lanes.until_sent(2).await;
    drop(four);
    open_1.send(()).unwrap();
    lanes.until_sent(3).await;
    assert_eq!(
        lanes.fake.calls()[2],
        [2, 3, 5, 6],
        "a request whose waiter is gone before its call is not sent"
    );
    drop(three);
    open_2.send(()).unwrap();
    open_0.send(()).unwrap();
    let answers = answers(waiters).await;
    for (id, answer) in [0, 1, 2, 5, 6].into_iter().zip(&answers) {
        assert_eq!(
            answer.as_ref().ok(),
            Some(&id),
            "request {id}: its own answer"
        );
    }
    assert_eq!(
        *lanes.unread.lock().unwrap(),
        [3],
        "the answer of a waiter gone mid-call goes back to its work, not to another caller"
    );
    assert!(!lanes.fake.sent().contains(&4));
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_waiters_are_all_gone_is_dropped() {
    let lanes = Lanes::new();
    let ((open_0, hold_0), (open_1, hold_1)) = (gate(), gate());
    lanes.fake.plan([hold_0, hold_1]);
    let first = lanes.spawn(0..1);
    let second = lanes.request(1);
    let mut second = tokio::spawn(second);
    lanes.until_sent(2).await;
    second.abort();
    assert!((&mut second).await.unwrap_err().is_cancelled());
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        open_1.send(()).is_err(),
        "the call of a batch nobody waits for is dropped"
    );
    open_0.send(()).unwrap();
    assert_eq!(answers(first).await[0].as_ref().ok(), Some(&0));
    assert!(
        lanes.unread.lock().unwrap().is_empty(),
        "a dropped call answers nobody"
    );
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_fails_mid_batch_answers_every_caller() {
    let lanes = Lanes::new();
    let ((open_0, hold_0), (open_1, hold_1)) = (gate(), gate());
    // 0 held (then the connection is lost), 1 held then answered, 2..10
    // half answered, 10 failed, 11..15 answered.
    lanes.fake.plan([hold_0, hold_1, Step::Half, Step::Fail]);
    let mut waiters = lanes.spawn(0..10);
    lanes.until_sent(2).await;
    open_1.send(()).unwrap();
    lanes.until_sent(3).await;
    assert_eq!(lanes.fake.calls()[2], (2..10).collect::<Vec<_>>());
    waiters.extend(lanes.spawn(10..15));
    lanes.until_sent(5).await;
    drop(open_0);
    let answers = answers(waiters).await;
    for (id, answer) in (0..).zip(&answers) {
        match id {
            1 | 11..15 => assert_eq!(answer.as_ref().ok(), Some(&id), "request {id}"),
            _ => assert!(
                is_unavailable(answer),
                "request {id}: its call failed or was half answered, so it is an error, \
                 never another's answer: {answer:?}"
            ),
        }
    }
    let mut sent = lanes.fake.sent();
    sent.sort_unstable();
    assert_eq!(sent, (0..15).collect::<Vec<_>>(), "each sent once");
    assert!(lanes.unread.lock().unwrap().is_empty());
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_is_never_sent_twice() {
    let lanes = Lanes::new();
    let (open, hold) = gate();
    // 0 held, then answered; the calls of 1 and of 2..6 fail.
    lanes.fake.plan([hold, Step::Fail, Step::Fail]);
    let waiters = lanes.spawn(0..6);
    lanes.until_sent(3).await;
    open.send(()).unwrap();
    let answers = answers(waiters).await;
    assert_eq!(answers[0].as_ref().ok(), Some(&0));
    for (id, answer) in (1..).zip(&answers[1..]) {
        assert!(is_unavailable(answer), "request {id}: {answer:?}");
    }
    // A request alone whose call fails is not sent again either.
    lanes.fake.plan([Step::Fail]);
    let alone = lanes.spawn(6..7);
    assert!(is_unavailable(&answers_of(alone).await));
    assert_eq!(
        lanes.fake.calls(),
        [vec![0], vec![1], (2..6).collect(), vec![6]],
        "every request sent once: a failed call is never sent again"
    );
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_request_nobody_waits_for_is_sent_from_an_idle_lane() {
    let lanes = Lanes::new();
    lanes.detach(0);
    assert_eq!(
        lanes.detached(1).await,
        [(0, Some(0))],
        "sent with nobody waiting, and its answer handed to its kind"
    );
    assert_eq!(lanes.fake.calls(), [vec![0]]);
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn requests_nobody_waits_for_queue_behind_a_busy_lane_without_a_task_each() {
    let lanes = Lanes::new();
    let (open, hold) = gate();
    lanes.fake.plan([hold]);
    let first = lanes.spawn(0..1);
    lanes.until_sent(1).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks = metrics.num_alive_tasks();
    // Fewer than the call in flight's second call needs (1 in flight: a
    // second call at 1 queued), so the first is a second call's; the rest
    // wait in the queue.
    for id in 1..50 {
        lanes.detach(id);
    }
    assert!(
        metrics.num_alive_tasks() <= tasks + 1,
        "one driver at most (the lane's second call), not a task per request: {} tasks, {tasks} before",
        metrics.num_alive_tasks()
    );
    open.send(()).unwrap();
    assert_eq!(answers(first).await[0].as_ref().ok(), Some(&0));
    let mut detached = lanes.detached(49).await;
    detached.sort_unstable();
    assert_eq!(
        detached,
        (1..50).map(|id| (id, Some(id))).collect::<Vec<_>>(),
        "each sent once and answered to its kind"
    );
    assert!(
        lanes.fake.calls().len() <= 4,
        "they share calls: {:?}",
        lanes.fake.calls()
    );
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_call_that_carries_a_request_nobody_waits_for_is_never_dropped() {
    let lanes = Lanes::new();
    let ((open_0, hold_0), (open_1, hold_1), (open_2, hold_2)) = (gate(), gate(), gate());
    lanes.fake.plan([hold_0, hold_1, hold_2]);
    // 0 alone and 1, the lane's second call, both held; then 2, which
    // nobody waits for, and 3, whose waiter the test holds, queue.
    let first = lanes.spawn(0..2);
    lanes.until_sent(2).await;
    lanes.detach(2);
    let third = lanes.request(3);
    open_0.send(()).unwrap();
    lanes.until_sent(3).await;
    assert_eq!(lanes.fake.calls()[2], [2, 3]);
    drop(third);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        open_2.send(()).is_ok(),
        "the call goes on for the request nobody waited for"
    );
    assert_eq!(lanes.detached(1).await, [(2, Some(2))]);
    open_1.send(()).unwrap();
    let answers = answers(first).await;
    assert_eq!(answers[0].as_ref().ok(), Some(&0));
    assert_eq!(answers[1].as_ref().ok(), Some(&1));
    assert_eq!(
        *lanes.unread.lock().unwrap(),
        [3],
        "the waiter gone loses its answer"
    );
    lanes.assert_nothing_left().await;
}

#[tokio::test(start_paused = true)]
async fn a_request_nobody_waits_for_is_never_withdrawn_nor_sent_twice() {
    let lanes = Lanes::new();
    let (open, hold) = gate();
    // 0 held; the call of 1 (the lane's second) and the one that carries
    // 2 and 3 fail.
    lanes.fake.plan([hold, Step::Fail, Step::Fail]);
    let first = lanes.spawn(0..1);
    lanes.until_sent(1).await;
    for id in 1..4 {
        lanes.detach(id);
    }
    open.send(()).unwrap();
    assert_eq!(answers(first).await[0].as_ref().ok(), Some(&0));
    let mut detached = lanes.detached(3).await;
    detached.sort_unstable();
    assert_eq!(
        detached,
        [(1, None), (2, None), (3, None)],
        "a failed call's requests are told, once"
    );
    assert_eq!(
        lanes.fake.calls(),
        [vec![0], vec![1], vec![2, 3]],
        "each sent once: a failed call is never sent again"
    );
    lanes.assert_nothing_left().await;
}

async fn answers_of(waiters: Vec<tokio::task::JoinHandle<Answered<Job>>>) -> Answered<Job> {
    let mut answers = answers(waiters).await;
    assert_eq!(answers.len(), 1);
    answers.remove(0)
}

/// A request's hit on one counter of a 1000-a-minute quota.
fn hit(key: &[u8]) -> HitWork {
    HitWork {
        counters: std::iter::once((StoredKey::from_slice(key), 60_000)).collect(),
        finish: Finish {
            quotas: std::iter::once(CounterQuota {
                quota: Quota::new(1000, Duration::from_secs(60)).unwrap(),
                lowers: false,
            })
            .collect(),
            deny: None,
            prefix: 4,
            sent: std::time::Instant::now(),
        },
    }
}

#[tokio::test(start_paused = true)]
async fn hits_on_one_counter_take_their_counts_in_the_order_they_came() {
    let fake = Fake::default();
    let batcher = Arc::new(Batcher::new(Guarded::new(fake.clone(), None, None), false));
    let (open, hold) = gate();
    fake.plan([hold]);
    let request = |key: &'static [u8]| -> Pin<Box<dyn Future<Output = Answered<HitWork>> + Send>> {
        match enqueue(&batcher, &tokio::runtime::Handle::current(), hit(key)) {
            Enqueued::Queued(answer) => Box::pin(answer),
            Enqueued::Alone(alone) => Box::pin(alone.send()),
        }
    };
    // The first goes alone (the one-hit script) and is held; the second
    // makes the lane's second call; the rest share a call of the batch
    // script, on two counters.
    let keys: Vec<&'static [u8]> = (0..30)
        .map(|n| {
            if n % 3 == 2 {
                &b"tpw:api{b}"[..]
            } else {
                &b"tpw:api{a}"[..]
            }
        })
        .collect();
    let waiters: Vec<_> = keys.iter().map(|key| tokio::spawn(request(key))).collect();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    open.send(()).unwrap();
    let mut counted: HashMap<&[u8], u64> = HashMap::new();
    for (n, (key, waiter)) in keys.iter().zip(waiters).enumerate() {
        let hits = tokio::time::timeout(Duration::from_secs(3600), waiter)
            .await
            .expect("a caller hangs")
            .unwrap()
            .unwrap_or_else(|err| panic!("request {n}: {err}"));
        let count = counted.entry(key).or_default();
        *count += 1;
        assert_eq!(
            hits.as_slice()[0].count,
            *count,
            "request {n}: the count its place among its counter's hits gives"
        );
    }
    assert_eq!(fake.most_in_flight(), 2);
    assert!(batcher.lock().by_slot.is_empty(), "the lane is gone");
}

/// The batch script's buffers are kept per thread from one call to the
/// next: what a call counted, and a call dropped before its answer, carry
/// nothing into the next call's entries.
#[tokio::test(start_paused = true)]
async fn a_batch_carries_nothing_into_the_next() {
    let fake = Fake::default();
    let guarded = Guarded::new(fake.clone(), None, None);
    let counts = |answers: Answers<tower_pinned_window::backend::Hits>| -> Vec<u64> {
        answers
            .into_iter()
            .map(|hits| hits.unwrap().as_slice()[0].count)
            .collect()
    };
    let first = [hit(b"tpw:api{a}"), hit(b"tpw:api{a}"), hit(b"tpw:api{b}")];
    let answers = HitWork::run(&guarded, &first).await.unwrap();
    assert_eq!(counts(answers), [1, 2, 1]);

    // A call dropped while Redis holds it: its buffers go with it.
    let (_open, hold) = gate();
    fake.plan([hold]);
    let dropped = [hit(b"tpw:api{x}"), hit(b"tpw:api{y}")];
    let mut call = Box::pin(HitWork::run(&guarded, &dropped));
    assert!(futures_util::FutureExt::now_or_never(&mut call).is_none());
    drop(call);

    let next = [hit(b"tpw:api{c}"), hit(b"tpw:api{a}"), hit(b"tpw:api{c}")];
    let answers = HitWork::run(&guarded, &next).await.unwrap();
    assert_eq!(counts(answers), [1, 3, 2], "only this call's entries");
    let again = [hit(b"tpw:api{b}"), hit(b"tpw:api{d}")];
    let answers = HitWork::run(&guarded, &again).await.unwrap();
    assert_eq!(counts(answers), [2, 1]);
}
