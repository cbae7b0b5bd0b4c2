//! The load, the store's watcher and the judge of the in-flight soak
//! (`bash soak/in_flight.sh`; soak/README.md says what it does): processes
//! that serve an axum app behind an `InFlightLayer` over one Redis, one of
//! them killed with `kill -9` while it holds slots, Redis restarted once.
//!
//! ```text
//! in_flight_soak instance ID OUT           one process: its server and its CALLERS callers
//! in_flight_soak watch OUT                 the store's records, every POLL_MS, until STOP_MS
//! in_flight_soak report EVENTS WATCH OUT...   the figures; exits 1 when a promise broke
//! ```
//!
//! An instance serves `GET /` on 127.0.0.1 (a port of its own) through
//! `InFlightLayer` named `soak`: at most `MAX` in flight per `x-key`, slots
//! on a lease of `LEASE_MS`, in a `RedisBackend` of its own at `REDIS_URL`
//! under `PREFIX` (a `ConnectionManager` with the crate's settings), failing
//! closed, the layer's defaults otherwise (a timeout of 100 ms, no wait).
//! The handler holds each request for the `x-hold-ms` it names: its body
//! sends a byte every 100 ms or so and ends when the time is up, so a
//! request holds its slot until its last byte. From `START_MS` until
//! `END_MS`, `CALLERS` tasks call the instance's own server over HTTP
//! (hyper-util), each call on a key drawn from the `SHARED_KEYS` keys every
//! instance uses (`s0`, `s1`, ...) and the `OWN_KEYS` keys only this
//! instance uses (`p<ID>-0`, ...), holding `HOLD_MIN_MS` to `HOLD_MAX_MS`,
//! or, for `LONG_PCT` percent of the calls, `LONG_MIN_MS` to `LONG_MAX_MS`
//! (longer than the lease: only the extends keep such a slot). A call
//! answered other than 200 is followed by a pause of `PAUSE_MIN_MS` to
//! `PAUSE_MAX_MS`.
//!
//! An instance writes OUT as it goes, one `write` a line, so a process
//! killed with `kill -9` leaves every line up to its death:
//!
//! - `s UNIX_US KEY ID`: the handler started request ID (its slot taken);
//! - `e UNIX_US KEY ID HOW`: its body ended (`done`), or was dropped
//!   unfinished (`dropped`), before the slot is given back;
//! - `a SENT_US DONE_US KEY STATUS`: a caller's answer, its body read to
//!   the end (status 0: the call failed in the HTTP client).
//!
//! and OUT.slots: the first 16 hex digits of the names of the slots it
//! takes ([`SlotId::next`] draws a random number once per process, then
//! counts), by which the watcher's records tell its slots from the others'.
//!
//! The watcher asks Redis every `POLL_MS` (one script, one instant: its
//! clock, each key under `PREFIX` with its `PTTL`, type and members per
//! process, live or run out) and writes `p SERVER_MS LOCAL_MS KEYS`, then
//! `k SERVER_MS KEY PTTL TYPE PROCESS:MEMBERS:LIVE...` per key, or
//! `down LOCAL_MS` when Redis did not answer.
//!
//! The report reads EVENTS (`event UNIX_MS load-start|load-end|redis-restarted`,
//! `fault UNIX_MS instance-kill-9 ID`, `fault UNIX_MS redis-kill-9`, `scan
//! UNIX_MS NAME RECORDS WITHOUT_LIFETIME LONGEST_LEFT_MS`), the watcher's
//! file and every instance's OUT, in the order of their IDs, and fails on a
//! moment where more than `MAX` requests of a key ran at once (from the
//! handlers' `s` and `e` lines of every instance), a live slot of the killed
//! instance later than `LEASE_MS` + `MARGIN_MS` after the kill, a record of
//! its own keys alive after then, a record without a lifetime (or with one
//! past the lease), a record left after the run, a record holding more than
//! `MAX` live slots, an answer of 500 (or anything but 200, 429 and 503), and
//! a request started while Redis was down.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fs::File;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Request, Response};
use axum::routing::get;
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Sleep;
use tower_pinned_window::backend::SlotId;
use tower_pinned_window::{InFlight, InFlightLayer};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::connection_manager_config;

#[path = "../soak_env.rs"]
#[allow(dead_code, reason = "the failure policy is fixed here: fail closed")]
mod soak_env;
use soak_env::{Error, env, required, unix_us};

/// The layer's name: the namespace of its records.
const LAYER: &str = "soak";

/// The watcher's script: the store at one instant.
const WATCH_LUA: &str = include_str!("../in_flight_watch.lua");

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
        ["instance", id, out] => instance(id.parse()?, out).await,
        ["watch", out] => watch(out).await,
        ["report", events, watched, outs @ ..] if !outs.is_empty() => {
            if report(events, watched, outs)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        _ => Err(
            "usage: in_flight_soak instance ID OUT | in_flight_soak watch OUT | in_flight_soak report EVENTS WATCH OUT..."
                .into(),
        ),
    }
}

/// The cap every instance and the report share: `MAX` per key, a lease of
/// `LEASE_MS`.
fn cap() -> Result<InFlight, Error> {
    Ok(InFlight::new(
        env("MAX", 4)?,
        Duration::from_millis(env("LEASE_MS", 3_000)?),
    )?)
}

/// The keys instance `id` calls: the shared ones, then its own.
fn keys_of(id: u32) -> Result<Vec<String>, Error> {
    let shared = (0..env::<u32>("SHARED_KEYS", 6)?).map(|k| format!("s{k}"));
    let own = (0..env::<u32>("OWN_KEYS", 2)?).map(|k| format!("p{id}-{k}"));
    Ok(shared.chain(own).collect())
}

/// A range of milliseconds `MIN..=MAX` from the environment.
fn range_ms(name: &str, min: u64, max: u64) -> Result<(u64, u64), Error> {
    let range = (
        env(&format!("{name}_MIN_MS"), min)?,
        env(&format!("{name}_MAX_MS"), max)?,
    );
    if range.0 > range.1 {
        return Err(format!("{name}_MIN_MS is above {name}_MAX_MS").into());
    }
    Ok(range)
}

// ---------------------------------------------------------------------------
// An instance.

/// An instance's log: one `write` a line, so a `kill -9` loses none that
/// was written.
struct Log(Mutex<File>);

impl Log {
    fn create(path: &str) -> Result<Self, Error> {
        Ok(Self(Mutex::new(File::create(path)?)))
    }

    fn line(&self, line: String) {
        let mut file = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A line that cannot be written shows as a request without its end.
        let _ = file.write_all(line.as_bytes());
    }
}

/// What the handler shares.
struct App {
    log: Log,
    next: AtomicU64,
}

/// The handler: request ID started, its slot taken; its body holds it for
/// the `x-hold-ms` the caller named.
async fn hold(State(app): State<Arc<App>>, headers: HeaderMap) -> Response<Hold> {
    let key = headers
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let ms: u64 = headers
        .get("x-hold-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let id = app.next.fetch_add(1, Ordering::Relaxed);
    app.log.line(format!("s {} {key} {id}\n", unix_us()));
    Response::new(Hold::new(app, key, id, Duration::from_millis(ms)))
}

/// A body that sends a byte about every 100 ms for its time, then ends;
/// its end (or its drop, unfinished) is written down before the layer's
/// body around it gives the slot back.
struct Hold {
    app: Arc<App>,
    key: String,
    id: u64,
    chunks_left: u32,
    every: Duration,
    sleep: Pin<Box<Sleep>>,
    ended: bool,
}

impl Hold {
    fn new(app: Arc<App>, key: String, id: u64, time: Duration) -> Self {
        let chunks = (time.as_millis().div_ceil(100) as u32).max(1);
        let every = time / chunks;
        Self {
            app,
            key,
            id,
            chunks_left: chunks,
            every,
            sleep: Box::pin(tokio::time::sleep(every)),
            ended: false,
        }
    }

    fn end(&mut self, how: &str) {
        self.ended = true;
        self.app
            .log
            .line(format!("e {} {} {} {how}\n", unix_us(), self.key, self.id));
    }
}

impl HttpBody for Hold {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if this.chunks_left == 0 {
            // Written before the end is returned: the layer's body gives
            // the slot back when it sees the end.
            this.end("done");
            return Poll::Ready(None);
        }
        std::task::ready!(this.sleep.as_mut().poll(cx));
        this.chunks_left -= 1;
        let next = this.sleep.deadline() + this.every;
        this.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b".")))))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.ended {
            self.end("dropped");
        }
    }
}

/// xorshift64, seeded per instance and caller.
struct Rng(u64);

impl Rng {
    fn new(id: u32, caller: u32) -> Self {
        Self((u64::from(id) << 32 | u64::from(caller)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `range`, both ends in.
    fn within(&mut self, range: (u64, u64)) -> u64 {
        range.0 + self.next() % (range.1 - range.0 + 1)
    }
}

/// The first 16 hex digits of the slots this process names: the number
/// [`SlotId::next`] draws once per process. Two names are drawn to check
/// that the layout is still that one.
fn slot_process() -> Result<String, Error> {
    let (a, b) = (SlotId::next().to_string(), SlotId::next().to_string());
    if a.len() != 32 || a[..16] != b[..16] || a[16..] == b[16..] {
        return Err(format!(
            "slot names {a} and {b} do not share a process part: the soak cannot tell the processes' slots apart"
        )
        .into());
    }
    Ok(a[..16].to_owned())
}

async fn instance(id: u32, out: &str) -> Result<(), Error> {
    let url: String = required("REDIS_URL")?;
    let start_ms: u64 = required("START_MS")?;
    let end_us = required::<u64>("END_MS")? * 1000;
    let callers: u32 = env("CALLERS", 64)?;
    let hold_ms = range_ms("HOLD", 100, 600)?;
    let long_ms = range_ms("LONG", 3_500, 4_000)?;
    let long_pct: u64 = env("LONG_PCT", 5)?;
    let pause_ms = range_ms("PAUSE", 100, 300)?;
    let keys = Arc::new(keys_of(id)?);

    std::fs::write(format!("{out}.slots"), format!("{}\n", slot_process()?))?;
    let connection = redis::Client::open(url.as_str())?
        .get_connection_manager_with_config(connection_manager_config())
        .await?;
    let backend = RedisBackend::builder(connection)
        .try_prefix(env("PREFIX", "tpw-inflight:".to_owned())?)?
        .build();
    let layer = InFlightLayer::new(LAYER, cap()?)
        .key(HeaderName::from_static("x-key"))
        .backend(backend);
    layer.check()?;
    let app = Arc::new(App {
        log: Log::create(out)?,
        next: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/", get(hold))
        .with_state(Arc::clone(&app))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let uri = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });

    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    tokio::time::sleep(Duration::from_millis(
        start_ms.saturating_sub(unix_us() / 1000),
    ))
    .await;
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (client, app, keys, uri) = (
                client.clone(),
                Arc::clone(&app),
                Arc::clone(&keys),
                uri.clone(),
            );
            let mut rng = Rng::new(id, caller);
            tokio::spawn(async move {
                let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
                while unix_us() < end_us {
                    let key = &keys[(rng.next() % keys.len() as u64) as usize];
                    let ms = if rng.next() % 100 < long_pct {
                        rng.within(long_ms)
                    } else {
                        rng.within(hold_ms)
                    };
                    let request = Request::get(uri.as_str())
                        .header("x-key", key.as_str())
                        .header("x-hold-ms", ms)
                        .body(Empty::new())
                        .expect("a valid request");
                    let sent = unix_us();
                    let status = match client.request(request).await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            match response.into_body().collect().await {
                                Ok(_) => status,
                                Err(_) => 0,
                            }
                        }
                        Err(_) => 0,
                    };
                    app.log
                        .line(format!("a {sent} {} {key} {status}\n", unix_us()));
                    *statuses.entry(status).or_default() += 1;
                    if status != 200 {
                        tokio::time::sleep(Duration::from_millis(rng.within(pause_ms))).await;
                    }
                }
                statuses
            })
        })
        .collect();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for task in tasks {
        for (status, n) in task.await? {
            *statuses.entry(status).or_default() += n;
        }
    }
    // The last give-backs: a give-back is sent without waiting for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    eprintln!("instance {id}: answers by status {statuses:?}");
    Ok(())
}

// ---------------------------------------------------------------------------
// The watcher.

async fn watch(out: &str) -> Result<(), Error> {
    let url: String = required("REDIS_URL")?;
    let pattern = format!("{}*", required::<String>("PREFIX")?);
    let stop_ms: u64 = required("STOP_MS")?;
    let every = Duration::from_millis(env("POLL_MS", 50)?);
    let mut connection = redis::Client::open(url.as_str())?
        .get_connection_manager_with_config(connection_manager_config())
        .await?;
    let mut text = String::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while unix_us() / 1000 < stop_ms {
        tick.tick().await;
        let local = unix_us() / 1000;
        let mut eval = redis::cmd("EVAL");
        eval.arg(WATCH_LUA).arg(0).arg(&pattern);
        let call = eval.query_async::<Vec<String>>(&mut connection);
        match tokio::time::timeout(Duration::from_millis(250), call).await {
            Ok(Ok(lines)) if !lines.is_empty() => {
                let at = &lines[0];
                text.push_str(&format!("p {at} {local} {}\n", lines.len() - 1));
                for line in &lines[1..] {
                    text.push_str(&format!("k {at} {line}\n"));
                }
            }
            _ => text.push_str(&format!("down {local}\n")),
        }
    }
    std::fs::write(out, text)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The report.

/// One request as its instance's handler saw it: started, ended (when its
/// body ended, or the instance died).
struct Ran {
    instance: usize,
    key: String,
    start_us: u64,
    end_us: Option<u64>,
}

/// A caller's answer.
struct Answer {
    instance: usize,
    sent_us: u64,
    status: u16,
}

/// One key in one look at the store.
struct Record {
    key: String,
    pttl: i64,
    kind: String,
    /// Members and live members per process (the 16 hex digits).
    by_process: HashMap<String, (u64, u64)>,
}

/// One look at the store: its clock, and its records.
struct Look {
    at_ms: u64,
    records: Vec<Record>,
}

impl Look {
    /// The record of `key`, if the store had one.
    fn record(&self, key: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.key == key)
    }
}

/// The key a record's storage key names: between its braces.
fn key_of(stored: &str) -> &str {
    match (stored.find('{'), stored.rfind('}')) {
        (Some(open), Some(close)) if open < close => &stored[open + 1..close],
        _ => stored,
    }
}

fn read_instance(
    instance: usize,
    path: &str,
    ran: &mut Vec<Ran>,
    answers: &mut Vec<Answer>,
) -> Result<u64, Error> {
    let mut open: HashMap<u64, usize> = HashMap::new();
    // The time of the last line: the instance was alive then.
    let mut last_us = 0;
    for line in std::fs::read_to_string(path)?.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["s", at, key, id] => {
                last_us = last_us.max(at.parse()?);
                open.insert(id.parse()?, ran.len());
                ran.push(Ran {
                    instance,
                    key: (*key).to_owned(),
                    start_us: at.parse()?,
                    end_us: None,
                });
            }
            ["e", at, _, id, _] => {
                let at: u64 = at.parse()?;
                last_us = last_us.max(at);
                let i = open
                    .remove(&id.parse()?)
                    .ok_or_else(|| format!("{path}: request {id} ended, never started"))?;
                ran[i].end_us = Some(at);
            }
            ["a", sent, done, _key, status] => {
                last_us = last_us.max(done.parse()?);
                answers.push(Answer {
                    instance,
                    sent_us: sent.parse()?,
                    status: status.parse()?,
                });
            }
            // The last line of a killed instance may be cut short.
            _ => eprintln!("{path}: a line not understood: {line:?}"),
        }
    }
    Ok(last_us)
}

fn read_watch(path: &str) -> Result<(Vec<Look>, Vec<u64>), Error> {
    let mut looks: Vec<Look> = Vec::new();
    let mut down = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["p", at, _local, _n] => looks.push(Look {
                at_ms: at.parse()?,
                records: Vec::new(),
            }),
            ["k", _at, stored, pttl, kind, groups @ ..] => {
                let look = looks
                    .last_mut()
                    .ok_or_else(|| format!("{path}: a record before its look"))?;
                let mut by_process = HashMap::new();
                for group in groups {
                    let mut fields = group.split(':');
                    let (Some(process), Some(all), Some(live), None) =
                        (fields.next(), fields.next(), fields.next(), fields.next())
                    else {
                        return Err(format!("{path}: a group not understood: {group:?}").into());
                    };
                    by_process.insert(process.to_owned(), (all.parse()?, live.parse()?));
                }
                look.records.push(Record {
                    key: key_of(stored).to_owned(),
                    pttl: pttl.parse()?,
                    kind: (*kind).to_owned(),
                    by_process,
                });
            }
            ["down", at] => down.push(at.parse()?),
            _ => return Err(format!("{path}: a line not understood: {line:?}").into()),
        }
    }
    Ok((looks, down))
}

/// The `q` quantile (0..=1) of sorted `values`.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Seconds, from milliseconds.
fn s(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// The report over every file; `false` when a promise broke.
fn report(events: &str, watched: &str, outs: &[&str]) -> Result<bool, Error> {
    let cap = cap()?;
    let max = cap.max();
    let lease_ms = cap.lease().as_duration().as_millis() as u64;
    let margin_ms: u64 = env("MARGIN_MS", 250)?;
    let mut ok = true;
    let mut fail = |text: String| {
        println!("FAIL: {text}");
        ok = false;
    };

    // The events.
    let (mut start_ms, mut end_ms) = (0u64, 0u64);
    let (mut kill, mut redis_kill, mut restart) = (None, None, None);
    let mut scans = Vec::new();
    for line in std::fs::read_to_string(events)?.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["event", at, "load-start"] => start_ms = at.parse()?,
            ["event", at, "load-end"] => end_ms = at.parse()?,
            ["event", at, "redis-restarted"] => restart = Some(at.parse::<u64>()?),
            ["fault", at, "instance-kill-9", id] => {
                kill = Some((at.parse::<u64>()?, id.parse::<usize>()?));
            }
            ["fault", at, "redis-kill-9"] => redis_kill = Some(at.parse::<u64>()?),
            ["scan", at, name, n, bad, longest] => scans.push((
                at.parse::<u64>()?,
                (*name).to_owned(),
                n.parse::<i64>()?,
                bad.parse::<i64>()?,
                longest.parse::<i64>()?,
            )),
            _ => {}
        }
    }
    if start_ms == 0 || end_ms == 0 {
        return Err(format!("{events}: no load-start or load-end event").into());
    }
    let (kill_ms, victim) = kill.ok_or("no instance-kill-9 fault in the events")?;
    if victim == 0 || victim > outs.len() {
        return Err(format!(
            "the killed instance {victim} is not one of 1..={}",
            outs.len()
        )
        .into());
    }
    let victim = victim - 1;
    let outage = redis_kill.map(|k| (k, restart.unwrap_or(u64::MAX)));
    let rel = |ms: u64| (ms as f64 - start_ms as f64) / 1000.0;

    // Every instance's requests and answers, and the process part of its
    // slots' names.
    let mut ran = Vec::new();
    let mut answers = Vec::new();
    let mut processes: HashMap<String, usize> = HashMap::new();
    let mut death_us = kill_ms * 1000;
    for (instance, out) in outs.iter().enumerate() {
        let last_us = read_instance(instance, out, &mut ran, &mut answers)?;
        if instance == victim {
            // Killed at the kill, or after its last line if that is later.
            death_us = death_us.max(last_us);
        }
        let process = std::fs::read_to_string(format!("{out}.slots"))?
            .trim()
            .to_owned();
        processes.insert(process, instance);
    }
    let victim_process = processes
        .iter()
        .find(|(_, i)| **i == victim)
        .map(|(p, _)| p.clone())
        .ok_or("the killed instance wrote no .slots")?;
    println!(
        "{} instances, cap {max} in flight per key, lease {lease_ms} ms; {} requests ran, {} answers; load {:.1} s; instance {} killed at {:+.1} s; Redis killed at {}, restarted at {}",
        outs.len(),
        ran.len(),
        answers.len(),
        s(end_ms - start_ms),
        victim + 1,
        rel(kill_ms),
        redis_kill.map_or("never".into(), |r| format!("{:+.1} s", rel(r))),
        restart.map_or("never".into(), |r| format!("{:+.1} s", rel(r))),
    );

    // 1. The answers.
    let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
    for a in &answers {
        *by_status.entry(a.status).or_default() += 1;
    }
    println!("answers by status: {by_status:?} (0: the call failed in the HTTP client)");
    for (status, n) in &by_status {
        match status {
            200 | 429 | 503 => {}
            500 => fail(format!("{n} answers of 500")),
            0 => fail(format!("{n} calls failed in the HTTP client")),
            other => fail(format!("{n} answers of {other}")),
        }
    }
    for (instance, out) in outs.iter().enumerate() {
        let mut mine: BTreeMap<u16, u64> = BTreeMap::new();
        for a in answers.iter().filter(|a| a.instance == instance) {
            *mine.entry(a.status).or_default() += 1;
        }
        println!("  instance {} ({out}): {mine:?}", instance + 1);
    }
    let unavailable: Vec<u64> = answers
        .iter()
        .filter(|a| a.status == 503)
        .map(|a| a.sent_us / 1000)
        .collect();
    match outage {
        Some((down, up)) => {
            let before = unavailable.iter().filter(|t| **t < down).count();
            let during = unavailable
                .iter()
                .filter(|t| (down..up).contains(*t))
                .count();
            let after: Vec<u64> = unavailable.iter().copied().filter(|t| *t >= up).collect();
            println!(
                "503s: {before} before Redis was killed, {during} while it was down ({:.1} s), {} after its restart, the last {} after it",
                s(up.saturating_sub(down)),
                after.len(),
                after
                    .iter()
                    .max()
                    .map_or("none".into(), |t| format!("{} ms", t - up))
            );
            let first = ran
                .iter()
                .filter(|r| r.start_us / 1000 >= up)
                .map(|r| r.start_us / 1000)
                .min();
            println!(
                "first request started after the restart: {}",
                first.map_or("never".into(), |t| format!("{} ms after it", t - up))
            );
            if first.is_none() {
                fail("no request ran after Redis was restarted".into());
            }
            // Failing closed, nothing starts while the store is down: a
            // second's grace for the takes answered just before the kill.
            let started_down: Vec<&Ran> = ran
                .iter()
                .filter(|r| r.start_us / 1000 >= down + 1_000 && r.start_us / 1000 < up)
                .collect();
            if !started_down.is_empty() {
                fail(format!(
                    "{} requests started while Redis was down (from 1 s after the kill to the restart)",
                    started_down.len()
                ));
            }
        }
        None => println!("503s: {}", unavailable.len()),
    }

    // 2. True concurrency per key, from the handlers' own lines: a
    // request runs from its start to its end, or to the death of its
    // instance.
    let mut unended = 0;
    let mut moves: HashMap<&str, Vec<(u64, i8, usize)>> = HashMap::new();
    for r in &ran {
        let end_us = match r.end_us {
            Some(end) => end,
            None if r.instance == victim => death_us,
            None => {
                unended += 1;
                u64::MAX
            }
        };
        let list = moves.entry(r.key.as_str()).or_default();
        list.push((r.start_us, 1, r.instance));
        list.push((end_us, -1, r.instance));
    }
    if unended > 0 {
        fail(format!(
            "{unended} requests of live instances never ended (counted as running to the end)"
        ));
    }
    // Requests that held their slot longer than its lease: only the
    // extends kept it theirs.
    let past_lease: Vec<u64> = ran
        .iter()
        .filter_map(|r| r.end_us.map(|end| end.saturating_sub(r.start_us) / 1000))
        .filter(|ms| *ms > lease_ms)
        .collect();
    println!(
        "requests that held their slot past its lease, kept by the extends: {} (the longest {:.3} s)",
        past_lease.len(),
        s(past_lease.iter().max().copied().unwrap_or(0))
    );
    let run_us = (end_ms - start_ms) * 1000;
    let mut most_overall = 0;
    let mut over_total = 0;
    let mut per_key: BTreeMap<String, (i64, u64, Option<u64>)> = BTreeMap::new();
    let mut keys_sorted: Vec<&str> = moves.keys().copied().collect();
    keys_sorted.sort_unstable();
    for key in keys_sorted {
        let list = moves.get_mut(key).expect("listed");
        // At the same microsecond, an end before a start: the end was
        // written before its slot was given back, the start after its
        // slot was taken.
        list.sort_unstable_by_key(|m| (m.0, m.1));
        let (mut now, mut most, mut full_us, mut full_since) = (0i64, 0i64, 0u64, None);
        // After the kill, the first moment the survivors held all `max`.
        let mut full_after_kill = None;
        for &(at, step, _) in list.iter() {
            if let Some(since) = full_since.take() {
                full_us += at.min(end_ms * 1000).saturating_sub(since);
            }
            now += i64::from(step);
            if now > max as i64 {
                over_total += 1;
                if over_total <= 10 {
                    fail(format!(
                        "{now} requests of key {key} in flight at {:+.3} s, past the cap of {max}",
                        (at as f64 / 1000.0 - start_ms as f64) / 1000.0
                    ));
                }
            }
            if now >= max as i64 {
                full_since = Some(at.max(start_ms * 1000));
                if step > 0 && at > death_us && full_after_kill.is_none() {
                    full_after_kill = Some(at / 1000 - kill_ms);
                }
            }
            most = most.max(now);
        }
        most_overall = most_overall.max(most);
        per_key.insert(key.to_owned(), (most, full_us, full_after_kill));
    }
    if over_total > 10 {
        fail(format!("{over_total} moments past the cap in all"));
    }
    let line = |keys: &mut dyn Iterator<Item = (&String, &(i64, u64, Option<u64>))>| {
        keys.map(|(k, (most, full, _))| {
            format!(
                "{k} {most} ({:.0}%)",
                100.0 * *full as f64 / run_us.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
    };
    println!(
        "most in flight at once, over every instance: {most_overall} (cap {max}); per key, the most (and the time at the cap): {}",
        line(&mut per_key.iter())
    );

    // 3. The killed instance's slots, from the watcher's looks at the store.
    let (looks, down) = read_watch(watched)?;
    println!(
        "watcher: {} looks at the store ({} while it did not answer), from {:+.1} s to {:+.1} s",
        looks.len(),
        down.len(),
        looks.first().map_or(0.0, |l| rel(l.at_ms)),
        looks.last().map_or(0.0, |l| rel(l.at_ms)),
    );
    let own_prefix = format!("p{}-", victim + 1);
    let deadline = kill_ms + lease_ms + margin_ms;
    // Held at the kill: the first look at or after it.
    let at_kill = looks
        .iter()
        .find(|l| l.at_ms >= kill_ms)
        .ok_or("no look at the store after the kill")?;
    let held: BTreeMap<&str, u64> = at_kill
        .records
        .iter()
        .filter_map(|r| {
            let live = r.by_process.get(&victim_process).map_or(0, |g| g.1);
            (live > 0).then_some((r.key.as_str(), live))
        })
        .collect();
    let held_own: u64 = held
        .iter()
        .filter(|(k, _)| k.starts_with(&own_prefix))
        .map(|(_, n)| n)
        .sum();
    println!(
        "the killed instance's live slots {} ms after the kill: {} on its own keys, {} on shared keys ({})",
        at_kill.at_ms - kill_ms,
        held_own,
        held.values().sum::<u64>() - held_own,
        held.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if held_own == 0 {
        fail(
            "the killed instance held no slot of its own keys at the kill: nothing to see return"
                .into(),
        );
    }
    let checked = looks
        .iter()
        .filter(|l| l.at_ms > deadline && outage.is_none_or(|(d, _)| l.at_ms < d))
        .count();
    if checked == 0 {
        fail(format!(
            "no look at the store between the lease's end after the kill ({:+.1} s) and Redis's kill: nothing checked",
            rel(deadline)
        ));
    }
    let mut recoveries = Vec::new();
    for (key, n) in &held {
        let after: Vec<&Look> = looks.iter().filter(|l| l.at_ms >= kill_ms).collect();
        let live_at = |l: &&Look| {
            l.record(key)
                .map_or(0, |r| r.by_process.get(&victim_process).map_or(0, |g| g.1))
        };
        let returned = after
            .iter()
            .find(|l| live_at(l) == 0)
            .map(|l| l.at_ms - kill_ms);
        let gone = after
            .iter()
            .find(|l| {
                l.record(key)
                    .is_none_or(|r| !r.by_process.contains_key(&victim_process))
            })
            .map(|l| l.at_ms - kill_ms);
        let own = key.starts_with(&own_prefix);
        let record_gone = own
            .then(|| {
                after
                    .iter()
                    .find(|l| l.record(key).is_none())
                    .map(|l| l.at_ms - kill_ms)
            })
            .flatten();
        println!(
            "  {key}: {n} live at the kill; none live {} after it; its names gone from the record {}{}{}",
            returned.map_or("never".into(), |t| format!("{:.3} s", s(t))),
            gone.map_or("never".into(), |t| format!("{:.3} s after", s(t))),
            if own { "; the record gone " } else { "" },
            if own {
                record_gone.map_or("never".into(), |t| format!("{:.3} s after", s(t)))
            } else {
                String::new()
            }
        );
        if let Some(t) = returned {
            recoveries.push(t);
        }
        if !own && let Some(Some(t)) = per_key.get(*key).map(|k| k.2) {
            println!(
                "    the survivors held all {max} of {key} again {:.3} s after the kill",
                s(t)
            );
        }
    }
    recoveries.sort_unstable();
    println!(
        "time for the killed instance's slots to return, per key: min {:.3} s, p50 {:.3} s, max {:.3} s (lease {:.3} s)",
        s(recoveries.first().copied().unwrap_or(0)),
        s(quantile(&recoveries, 0.5)),
        s(recoveries.last().copied().unwrap_or(0)),
        s(lease_ms)
    );
    let mut late = 0;
    let mut late_records = 0;
    for look in looks.iter().filter(|l| l.at_ms > deadline) {
        for r in &look.records {
            let live = r.by_process.get(&victim_process).map_or(0, |g| g.1);
            if live > 0 {
                late += 1;
                if late <= 5 {
                    fail(format!(
                        "{live} slots of the killed instance still live on {} at {:+.3} s, {} ms after the kill (lease {lease_ms} ms + {margin_ms} ms)",
                        r.key,
                        rel(look.at_ms),
                        look.at_ms - kill_ms
                    ));
                }
            }
            if r.key.starts_with(&own_prefix) {
                late_records += 1;
                if late_records <= 5 {
                    fail(format!(
                        "the record of {} (the killed instance's own key) still there {} ms after the kill, {} members",
                        r.key,
                        look.at_ms - kill_ms,
                        r.by_process.values().map(|g| g.0).sum::<u64>()
                    ));
                }
            }
        }
    }
    if late > 5 || late_records > 5 {
        fail(format!(
            "{late} records with a live slot of the killed instance, {late_records} records of its own keys, past the lease in all"
        ));
    }
    println!(
        "slots of the killed instance live past the lease + {margin_ms} ms: {late} (in {} looks after {:+.3} s)",
        looks.iter().filter(|l| l.at_ms > deadline).count(),
        rel(deadline)
    );

    // 4. Every record: a lifetime within the lease, at most `max` live,
    // made by one of the instances, on its keys; none left at the end.
    let (mut no_lifetime, mut past_lease, mut not_records, mut over, mut strangers, mut crossed) =
        (0, 0, 0, 0, 0, 0);
    let mut most_live = 0;
    let mut most_records = 0;
    for look in &looks {
        most_records = most_records.max(look.records.len());
        for r in &look.records {
            if r.pttl == -1 {
                no_lifetime += 1;
            } else if r.pttl > lease_ms as i64 {
                past_lease += 1;
            }
            if r.kind != "zset" {
                not_records += 1;
            }
            let live: u64 = r.by_process.values().map(|g| g.1).sum();
            most_live = most_live.max(live);
            if live > max {
                over += 1;
            }
            for process in r.by_process.keys() {
                match processes.get(process) {
                    None => strangers += 1,
                    Some(i) => {
                        // An instance's own keys hold its slots alone.
                        if let Some(owner) =
                            r.key.strip_prefix('p').and_then(|k| k.split('-').next())
                            && owner != (i + 1).to_string()
                        {
                            crossed += 1;
                        }
                    }
                }
            }
        }
    }
    println!(
        "records in the looks: at most {most_records} at once, at most {most_live} live slots in one (cap {max}); {no_lifetime} without a lifetime, {past_lease} with one past the lease, {not_records} not sorted sets, {strangers} groups of slots no instance made, {crossed} slots on another instance's own key"
    );
    if no_lifetime > 0 {
        fail(format!(
            "{no_lifetime} times a record had no lifetime (PTTL -1)"
        ));
    }
    if past_lease > 0 {
        fail(format!(
            "{past_lease} times a record's lifetime was past the lease"
        ));
    }
    if not_records > 0 {
        fail(format!(
            "{not_records} times a key under the prefix was not a record of slots"
        ));
    }
    if over > 0 {
        fail(format!(
            "{over} times a record held more than {max} live slots"
        ));
    }
    if strangers > 0 || crossed > 0 {
        fail(
            "slots the soak cannot place: its check of the killed instance's slots is not sound"
                .into(),
        );
    }
    if most_records == 0 {
        fail("no look found a record: the watcher saw nothing".into());
    }
    match looks.last() {
        Some(last) if last.at_ms > end_ms => {
            println!(
                "records left at the last look, {:.1} s after the load's end: {}",
                s(last.at_ms - end_ms),
                last.records.len()
            );
            if !last.records.is_empty() {
                fail(format!(
                    "{} records left after the run: {}",
                    last.records.len(),
                    last.records
                        .iter()
                        .map(|r| format!("{} (PTTL {})", r.key, r.pttl))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        _ => fail("no look at the store after the load's end".into()),
    }
    let mut records_seen = false;
    for (at, name, n, bad, longest) in &scans {
        println!(
            "scan {name} at {:+.1} s: {n} records, {bad} without a lifetime or past the lease, longest left {longest} ms",
            rel(*at)
        );
        if *n < 0 {
            fail(format!("scan {name} could not read the store"));
        }
        if *bad > 0 {
            fail(format!(
                "scan {name}: {bad} records without a lifetime (or past the lease)"
            ));
        }
        records_seen |= *n > 0;
    }
    if !scans.is_empty() && !records_seen {
        fail("no scan found a record: the lifetime check saw nothing".into());
    }
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
