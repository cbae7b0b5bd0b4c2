//! The load and the judge of the soaks in soak/ (`bash soak/sentinel.sh`,
//! `bash soak/cluster.sh`, `bash soak/postgres.sh`, `bash soak/insurance.sh`;
//! soak/README.md says what they do). The scripts
//! start the servers, these instances and the faults; this program is one
//! instance of a service under load, or the report over every instance's
//! answers.
//!
//! ```text
//! soak sentinel ID OUT        one instance, through SentinelConnection
//! soak redis ID OUT           one instance, through a standalone Redis (REDIS_URL)
//! soak cluster ID OUT         one instance, through a Redis Cluster (NODES; feature `cluster`)
//! soak cluster-keys OUT       each key's slot in that Cluster, for the report (KEY_SLOTS)
//! soak postgres ID OUT        one instance, through PostgresBackend
//! soak postgres-migrate       create the soak's table (once, before the instances)
//! soak report EVENTS OUT...   the figures; exits 1 when a guarantee broke
//! ```
//!
//! An instance is `RateLimitLayer` (keyed by the `x-key` header, fail
//! closed) over a `service_fn` answering 200, over its own backend: what one
//! process of a service holds. `WORKERS` tasks send `RATE` requests a second
//! between them, each to one of `KEYS` keys picked at random, until
//! `END_MS` (Unix milliseconds), and the instance writes one line per answer
//! to OUT: `unix_us key status deadline_ms insured latency_us`, where
//! `deadline_ms` is when the store's window of an admitted request closes
//! (the answer's time plus the decision's [`reset`](Decision::reset), read
//! from the store: `PTTL` on Redis, `expires_at` on PostgreSQL), and 0 for
//! any other answer; `insured` 1 when the insurance limiter decided
//! (`INSURE_SHARE`, below), else 0; `latency_us` the time from the request
//! to its answer.
//!
//! With `INSURE_SHARE=N/D` the layer fails over to
//! `FailurePolicy::Insurance(Share::new(N, D))` in place of failing closed,
//! and the report measures what the insurance let through: see
//! soak/README.md.
//!
//! The report counts admissions per (key, window) over every instance,
//! windows told apart by that deadline, and reads from EVENTS the faults
//! (`fault UNIX_MS NAME`), other moments (`event UNIX_MS NAME`) and the
//! scans of the store for counters without an expiry
//! (`scan UNIX_MS NAME COUNTERS WITHOUT_EXPIRY LONGEST_LEFT_MS`, the last
//! the most time any counter had left, which a window bounds).
//!
//! On a Cluster (`soak/cluster.sh`), EVENTS also holds, before each fault,
//! the slots of the master it strikes (`slots UNIX_MS NAME RANGES`, NAME the
//! fault's, RANGES such as `0-5460,5462`), and `KEY_SLOTS` names the file
//! of each key's slot (`soak cluster-keys`). The report then tells the
//! failed master's keys from the healthy masters' keys, and fails on any
//! 503 of a healthy master's key; it fails on over-admissions only with
//! `ACK=1` (hits acknowledged by a replica), since without it a failover
//! may lose hits that were admitted.

use std::collections::HashMap;
use std::convert::Infallible;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderName, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_pinned_window::backend::Backend;
use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer, Window};
use tower_pinned_window_postgres::PostgresBackend;
use tower_pinned_window_postgres::deadpool_postgres::{Manager, Pool};
use tower_pinned_window_postgres::tokio_postgres::{self, NoTls};
use tower_pinned_window_redis::connection::{SentinelConnection, connection_manager_config};
use tower_pinned_window_redis::{RedisBackend, RedisBackendBuilder};

#[path = "../soak_env.rs"]
mod soak_env;
use soak_env::{Error, env, failure_policy, insure_share, unix_us};

/// The layer's name: the namespace of its counters.
const LAYER: &str = "soak";

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
        ["sentinel", id, out] => sentinel(id.parse()?, out).await,
        ["redis", id, out] => standalone(id.parse()?, out).await,
        #[cfg(feature = "cluster")]
        ["cluster", id, out] => cluster(id.parse()?, out).await,
        #[cfg(feature = "cluster")]
        ["cluster-keys", out] => cluster_keys(out).await,
        #[cfg(not(feature = "cluster"))]
        ["cluster" | "cluster-keys", ..] => {
            Err("built without the Cluster mode: cargo build --release -p tower-pinned-window-bench --bin soak --features cluster".into())
        }
        ["postgres", id, out] => postgres(id.parse()?, out).await,
        ["postgres-migrate"] => postgres_backend("tpw-soak-migrate")?
            .migrate()
            .await
            .map_err(Into::into),
        ["report", events, outs @ ..] if !outs.is_empty() => {
            if report(events, outs)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        _ => Err("usage: soak sentinel|redis|cluster|postgres ID OUT | soak cluster-keys OUT | soak postgres-migrate | soak report EVENTS OUT...".into()),
    }
}

/// The quota every instance and the report share: `LIMIT` a `WINDOW_MS`.
fn quota() -> Result<Quota, Error> {
    Ok(Quota::new(
        env("LIMIT", 20)?,
        Duration::from_millis(env("WINDOW_MS", 2_000)?),
    )?)
}

async fn sentinel(id: u32, out: &str) -> Result<(), Error> {
    let sentinels: Vec<String> = std::env::var("SENTINELS")
        .map_err(|_| "SENTINELS (comma-separated redis:// URLs) is not set")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let master: String = env("MASTER_NAME", "tpw-soak".to_owned())?;
    let connection = SentinelConnection::builder(sentinels, &master)
        .connect()
        .await?;
    redis_instance(id, out, connection).await
}

/// One instance over `connection`, its counters under `PREFIX`.
async fn redis_instance<C>(id: u32, out: &str, connection: C) -> Result<(), Error>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
    RedisBackend<C>: Backend + Clone + Send + Sync + 'static,
    <RedisBackend<C> as Backend>::Future: Send,
{
    let backend = redis_backend(connection)?;
    load(
        id,
        out,
        layer()?.backend(backend).layer(tower::service_fn(ok)),
    )
    .await
}

/// The backend of every Redis instance: counters under `PREFIX`, the
/// crate's defaults otherwise (the breaker on), and with `ACK=1` hits
/// acknowledged by a replica.
fn redis_backend<C>(connection: C) -> Result<RedisBackend<C>, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let builder =
        RedisBackend::builder(connection).try_prefix(env("PREFIX", "tpw-soak:".to_owned())?)?;
    Ok(replica_acknowledged(builder)?.build())
}

/// With `ACK=1`, a batch of hits counts as admitted only once a replica
/// holds it, waiting for that up to `ACK_TIMEOUT_MS` (default 50, half the
/// layer's timeout).
fn replica_acknowledged<C>(
    builder: RedisBackendBuilder<C>,
) -> Result<RedisBackendBuilder<C>, Error> {
    if env::<u8>("ACK", 0)? != 1 {
        return Ok(builder);
    }
    let timeout = Duration::from_millis(env("ACK_TIMEOUT_MS", 50)?);
    builder
        .try_wait_for_replicas(1, timeout)
        .map_err(|err| format!("ACK_TIMEOUT_MS: {err}").into())
}

#[cfg(feature = "cluster")]
/// The Redis Cluster nodes of `NODES` (comma-separated `redis://` URLs).
fn cluster_nodes() -> Result<Vec<String>, Error> {
    Ok(std::env::var("NODES")
        .map_err(|_| "NODES (comma-separated redis:// URLs of the Cluster's nodes) is not set")?
        .split(',')
        .map(str::to_owned)
        .collect())
}

#[cfg(feature = "cluster")]
/// One instance through the Redis Cluster of `NODES`, on the connection
/// `RedisBackend::connect_cluster` makes (one breaker per master).
async fn cluster(id: u32, out: &str) -> Result<(), Error> {
    let connection = RedisBackend::connect_cluster(cluster_nodes()?)
        .await?
        .connection()
        .clone();
    redis_instance(id, out, connection).await
}

#[cfg(feature = "cluster")]
/// Each key's slot, one `KEY SLOT` line a key, as the Cluster of `NODES`
/// computes it (`CLUSTER KEYSLOT`) for the key's counter (its storage key
/// under `PREFIX`), to OUT: the report tells a failed master's keys by it.
/// It builds the instances' backend first, so a setting they would refuse
/// (`ACK=1` without its support) stops the soak before it starts.
async fn cluster_keys(out: &str) -> Result<(), Error> {
    let connection = RedisBackend::connect_cluster(cluster_nodes()?)
        .await?
        .connection()
        .clone();
    let backend = redis_backend(connection)?;
    let mut connection = backend.connection().clone();
    let mut text = String::new();
    for key in 0..env::<u32>("KEYS", 50)? {
        let stored = backend.storage_key(
            LAYER,
            &tower_pinned_window::key::Key::new(format!("k{key}")),
        );
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(stored)
            .query_async(&mut connection)
            .await?;
        text.push_str(&format!("{key} {slot}\n"));
    }
    std::fs::write(out, text)?;
    Ok(())
}

/// One instance through a standalone Redis at `REDIS_URL`, over a
/// `ConnectionManager` with the crate's settings (as
/// `RedisBackend::connect` makes it), which reconnects by itself after a
/// restart.
async fn standalone(id: u32, out: &str) -> Result<(), Error> {
    let url: String = std::env::var("REDIS_URL").map_err(|_| "REDIS_URL is not set")?;
    let connection = redis::Client::open(url.as_str())?
        .get_connection_manager_with_config(connection_manager_config())
        .await?;
    redis_instance(id, out, connection).await
}

/// A pool of `POOL_SIZE` connections to `DATABASE_URL`, named `app` in
/// `pg_stat_activity` (the script terminates them by that name), with a
/// `statement_timeout` of `STATEMENT_TIMEOUT_MS`, on the table in `SCHEMA`.
fn postgres_backend(app: &str) -> Result<PostgresBackend, Error> {
    let url: String = env(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test".to_owned(),
    )?;
    let mut config: tokio_postgres::Config = url.parse()?;
    config.application_name(app);
    config.options(format!(
        "-c statement_timeout={}",
        env::<u64>("STATEMENT_TIMEOUT_MS", 250)?
    ));
    let pool = Pool::builder(Manager::new(config, NoTls))
        .max_size(env("POOL_SIZE", 8)?)
        .build()?;
    let schema: String = env("SCHEMA", "tpw_soak".to_owned())?;
    Ok(PostgresBackend::builder(pool).schema(&schema).build())
}

async fn postgres(id: u32, out: &str) -> Result<(), Error> {
    let app: String = env("APP_NAME", "tpw-soak".to_owned())?;
    let backend = postgres_backend(&app)?;
    load(
        id,
        out,
        layer()?.backend(backend).layer(tower::service_fn(ok)),
    )
    .await
}

/// One answer, as the instance saw it.
struct Answer {
    unix_us: u64,
    key: u32,
    status: u16,
    deadline_ms: u64,
    insured: bool,
    latency_us: u64,
}

/// The layer every instance puts in front of its service: `LIMIT` a
/// `WINDOW_MS` per `x-key`, fail closed (or, with `INSURE_SHARE=N/D`, the
/// insurance limiter at that share), a timeout of `LAYER_TIMEOUT_MS`, the
/// decision in the answer.
fn layer() -> Result<RateLimitLayer<HeaderName>, Error> {
    Ok(RateLimitLayer::new(LAYER, quota()?)
        .key(HeaderName::from_static("x-key"))
        .on_failure(failure_policy()?)
        .decision_in(DecisionIn::Response)
        .timeout(Window::new(Duration::from_millis(env(
            "LAYER_TIMEOUT_MS",
            100,
        )?))?))
}

/// The service the layer guards: 200, at once.
async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

async fn load<S>(id: u32, out: &str, service: S) -> Result<(), Error>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let keys: u32 = env("KEYS", 50)?;
    let workers: u32 = env("WORKERS", 16)?;
    let rate: f64 = env("RATE", 500.0)?;
    let end_us = env::<u64>("END_MS", 0)? * 1000;
    if end_us == 0 {
        return Err("END_MS (when to stop, Unix milliseconds) is not set".into());
    }

    let period = Duration::from_secs_f64(f64::from(workers) / rate);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let service = service.clone();
            // xorshift64, seeded per instance and task.
            let mut seed =
                (u64::from(id) << 32 | u64::from(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while unix_us() < end_us {
                    tick.tick().await;
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let key = (seed % u64::from(keys)) as u32;
                    let request = Request::builder()
                        .header("x-key", format!("k{key}"))
                        .body(Body::empty())
                        .expect("a valid request");
                    let sent = Instant::now();
                    let Ok(response) = service.clone().oneshot(request).await;
                    let latency_us = sent.elapsed().as_micros() as u64;
                    let now = unix_us();
                    let decision = response.extensions().get::<Decision>();
                    let deadline_ms = match decision {
                        Some(d) if response.status() == StatusCode::OK => {
                            now / 1000 + d.reset().as_millis() as u64
                        }
                        _ => 0,
                    };
                    answers.push(Answer {
                        unix_us: now,
                        key,
                        status: response.status().as_u16(),
                        deadline_ms,
                        insured: decision.is_some_and(Decision::insured),
                        latency_us,
                    });
                }
                answers
            })
        })
        .collect();
    let mut text = String::new();
    let mut statuses: HashMap<u16, u64> = HashMap::new();
    for task in tasks {
        for a in task.await? {
            *statuses.entry(a.status).or_default() += 1;
            text.push_str(&format!(
                "{} {} {} {} {} {}\n",
                a.unix_us,
                a.key,
                a.status,
                a.deadline_ms,
                u8::from(a.insured),
                a.latency_us
            ));
        }
    }
    std::fs::write(out, text)?;
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort_unstable();
    eprintln!("instance {id}: answers by status {statuses:?}");
    Ok(())
}

/// A line of EVENTS.
enum Event {
    Fault(u64, String),
    Moment(u64, String),
    Scan(u64, String, i64, i64, i64),
    /// The slot ranges of the master a fault (or other moment) of that name
    /// strikes, read just before it.
    Slots(u64, String, Vec<(u16, u16)>),
}

/// Ranges of Cluster slots, first and last of each.
type SlotRanges = [(u16, u16)];

/// `0-5460,5462`: slot ranges, a single slot as a range of one.
/// The faults of `list`: when (as written) and their names.
fn faults(list: &[Event]) -> Vec<(u64, &str)> {
    list.iter()
        .filter_map(|e| match e {
            Event::Fault(at, name) => Some((*at, name.as_str())),
            _ => None,
        })
        .collect()
}

fn slot_ranges(text: &str) -> Result<Vec<(u16, u16)>, Error> {
    text.split(',')
        .map(|range| {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            Ok((from.parse()?, to.parse()?))
        })
        .collect()
}

/// Print the figures; `true` when over-admissions, counters without an
/// expiry and 500s are all 0.
fn report(events: &str, outs: &[&str]) -> Result<bool, Error> {
    let quota = quota()?;
    let (limit, window_ms) = (quota.limit(), quota.window().as_millis());
    let share = insure_share()?;
    // Each answer with the index of the instance that gave it.
    let mut answers = Vec::new();
    let mut instance_of = Vec::new();
    for (instance, out) in outs.iter().enumerate() {
        for line in std::fs::read_to_string(out)?.lines() {
            let f: Vec<u64> = line
                .split(' ')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{out}: {line:?}: {e}"))?;
            let [unix_us, key, status, deadline_ms, insured, latency_us] = f[..] else {
                return Err(format!("{out}: {line:?}: not 6 fields").into());
            };
            answers.push(Answer {
                unix_us,
                key: key as u32,
                status: status as u16,
                deadline_ms,
                insured: insured == 1,
                latency_us,
            });
            instance_of.push(instance);
        }
    }
    let mut order: Vec<usize> = (0..answers.len()).collect();
    order.sort_unstable_by_key(|&i| answers[i].unix_us);
    let instance_of: Vec<usize> = order.iter().map(|&i| instance_of[i]).collect();
    let mut sorted: Vec<Option<Answer>> = answers.into_iter().map(Some).collect();
    let answers: Vec<Answer> = order
        .iter()
        .map(|&i| sorted[i].take().expect("each answer once"))
        .collect();
    let mut list = Vec::new();
    for line in std::fs::read_to_string(events)?.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        list.push(match f[..] {
            ["fault", at, name] => Event::Fault(at.parse()?, name.to_owned()),
            ["event", at, name] => Event::Moment(at.parse()?, name.to_owned()),
            ["scan", at, name, counters, bad, longest] => Event::Scan(
                at.parse()?,
                name.to_owned(),
                counters.parse()?,
                bad.parse()?,
                longest.parse()?,
            ),
            ["slots", at, name, ranges] => {
                Event::Slots(at.parse()?, name.to_owned(), slot_ranges(ranges)?)
            }
            _ => return Err(format!("{events}: {line:?}: not an event").into()),
        });
    }
    let (Some(first), Some(last)) = (answers.first(), answers.last()) else {
        return Err("no answers".into());
    };
    let start_ms = first.unix_us / 1000;
    let secs = (last.unix_us - first.unix_us) as f64 / 1e6;
    let rel = |ms: u64| (ms as f64 - start_ms as f64) / 1e3;

    let count = |status: u16| answers.iter().filter(|a| a.status == status).count();
    let failed = |a: &Answer| a.status != 200 && a.status != 429;
    println!(
        "{} answers in {secs:.1} s over {} instances ({:.0}/s): {} admitted (200), {} denied (429), {} unavailable (503), {} errors (500), {} other",
        answers.len(),
        outs.len(),
        answers.len() as f64 / secs,
        count(200),
        count(429),
        count(503),
        count(500),
        answers
            .iter()
            .filter(|a| ![200, 429, 500, 503].contains(&a.status))
            .count(),
    );

    // Admissions per (key, window) of the store: a key's windows never
    // overlap, and one closes at least a window after the one before it, so
    // sorted by deadline, a deadline more than half a window past the first
    // of its group opens the next window. The insurance limiter's windows
    // are each instance's own: they are counted apart, against the share.
    let mut by_key: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut insured_by_key: HashMap<(usize, u32), Vec<u64>> = HashMap::new();
    for (a, &instance) in answers.iter().zip(&instance_of) {
        if a.status != 200 {
            continue;
        }
        if a.insured {
            insured_by_key
                .entry((instance, a.key))
                .or_default()
                .push(a.deadline_ms);
        } else {
            by_key.entry(a.key).or_default().push(a.deadline_ms);
        }
    }
    let Windows {
        windows,
        over,
        over_windows,
        fullest,
        full,
    } = per_window(&mut by_key, limit, window_ms);
    println!(
        "over-admissions: {over} (in {over_windows} of {windows} windows of {} keys, {full} of which reached the limit; limit {limit} a {window_ms} ms window; most admitted in one window: {fullest})",
        by_key.len()
    );
    let mut insured_over = 0;
    if let Some(share) = share {
        let local = share.of(limit);
        let Windows {
            windows,
            over,
            over_windows,
            fullest,
            ..
        } = per_window(&mut insured_by_key, local, window_ms);
        insured_over = over;
        let insured = |status: u16| {
            answers
                .iter()
                .filter(|a| a.insured && a.status == status)
                .count()
        };
        println!(
            "insurance ({share} of the limit: {local} a window, per instance): {} admitted, {} denied; over-admissions {over} (in {over_windows} of {windows} local windows; most admitted in one: {fullest})",
            insured(200),
            insured(429),
        );
    }
    let first_fault_ms = list.iter().find_map(|e| match e {
        Event::Fault(at, _) => Some(*at),
        _ => None,
    });
    overshoot(&answers, limit, window_ms, first_fault_ms);
    // Admissions a key got per window, on average, between one fault or
    // moment and the next: the limiter's pace in each phase of the run.
    let mut marks: Vec<(u64, &str)> = vec![(start_ms, "start")];
    for e in &list {
        if let Event::Fault(at, name) | Event::Moment(at, name) = e {
            marks.push((*at, name));
        }
    }
    marks.sort_unstable_by_key(|m| m.0);
    let keys = f64::from(env::<u32>("KEYS", 50)?);
    for (i, &(from, name)) in marks.iter().enumerate() {
        let until = marks.get(i + 1).map_or(last.unix_us / 1000, |m| m.0);
        if until <= from {
            continue;
        }
        let admitted = answers
            .iter()
            .filter(|a| a.status == 200 && a.unix_us / 1000 >= from && a.unix_us / 1000 < until)
            .count();
        println!(
            "from {name} ({:.1} s) for {:.1} s: {:.1} admitted per key per window (limit {limit})",
            rel(from),
            (until - from) as f64 / 1e3,
            admitted as f64 / keys / ((until - from) as f64 / window_ms as f64),
        );
    }

    // Each fault's share: the failed answers from it to the next fault.
    let faults = faults(&list);

    let before = faults.first().map_or(u64::MAX, |f| f.0 * 1000);
    println!(
        "before the first fault: {} failed answers",
        answers
            .iter()
            .filter(|a| a.unix_us < before && failed(a))
            .count()
    );
    for (i, &(at, name)) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map_or(u64::MAX, |f| f.0 * 1000);
        let mine: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.unix_us >= at * 1000 && a.unix_us < until && failed(a))
            .collect();
        let recovery = mine.last().map_or("no failed answer".to_owned(), |a| {
            format!("{} ms", a.unix_us / 1000 - at)
        });
        println!(
            "fault {name} at {:.1} s: {} answers of 503, {} other failed; recovery (fault to last failed answer): {recovery}",
            rel(at),
            mine.iter().filter(|a| a.status == 503).count(),
            mine.iter().filter(|a| a.status != 503).count(),
        );
        for e in &list {
            if let Event::Moment(m, what) = e
                && *m >= at
                && *m * 1000 < until
            {
                let after = match mine.last() {
                    Some(a) if a.unix_us / 1000 >= *m => format!("{} ms", a.unix_us / 1000 - m),
                    _ => "none after it".to_owned(),
                };
                println!(
                    "  {what} at {:.1} s ({} ms after the fault); last failed answer after it: {after}",
                    rel(*m),
                    m - at
                );
            }
        }
    }

    // Every failed answer, in bursts (a second without one ends a burst):
    // what a fault cost at once, and any failure apart from the faults.
    let mut bursts: Vec<(u64, u64, usize)> = Vec::new(); // (first, last, answers)
    for a in answers.iter().filter(|a| failed(a)) {
        let ms = a.unix_us / 1000;
        match bursts.last_mut() {
            Some((_, last, n)) if ms <= *last + 1_000 => (*last, *n) = (ms, *n + 1),
            _ => bursts.push((ms, ms, 1)),
        }
    }
    for (first, last, n) in &bursts {
        println!(
            "failed answers from {:.2} s to {:.2} s: {n}",
            rel(*first),
            rel(*last)
        );
    }

    let mut without_expiry = 0;
    let mut scans_ok = true;
    for e in &list {
        if let Event::Scan(at, name, counters, bad, longest) = e {
            println!(
                "scan {name} at {:.1} s: {counters} counters, {bad} without an expiry (or with one past the window); most time left on one: {longest} ms",
                rel(*at)
            );
            if *counters < 0 || *bad < 0 {
                println!("  the scan failed");
                scans_ok = false;
            }
            without_expiry += (*bad).max(0);
        }
    }
    let errors = count(500);
    // Under the insurance, an outage is no reason for a 503.
    let unavailable = if share.is_some() { count(503) } else { 0 };
    // On a Cluster: the healthy masters' keys get no 503; a failover may
    // lose admitted hits unless a replica acknowledged them (`ACK=1`).
    let healthy_unavailable = cluster_report(&answers, &list, start_ms)?;
    let acknowledged = env::<u8>("ACK", 0)? == 1;
    let over_fails = healthy_unavailable.is_none() || acknowledged;
    let pass = (over == 0 || !over_fails)
        && insured_over == 0
        && without_expiry == 0
        && errors == 0
        && unavailable == 0
        && healthy_unavailable.unwrap_or(0) == 0
        && scans_ok;
    println!(
        "{}: over-admissions {over}{}, counters without an expiry {without_expiry}, answers of 500 {errors}{}{}{}",
        if pass { "PASS" } else { "FAIL" },
        if over_fails {
            ""
        } else {
            " (not failed on: hits not acknowledged by a replica, ACK=0)"
        },
        if share.is_some() {
            format!(", insurance over-admissions {insured_over}, answers of 503 {unavailable}")
        } else {
            String::new()
        },
        healthy_unavailable.map_or(String::new(), |n| format!(
            ", answers of 503 on a healthy master's key {n}"
        )),
        if scans_ok { "" } else { ", a scan failed" }
    );
    Ok(pass)
}

/// The Cluster's figures, when EVENTS gives the slots of the failed masters
/// (`slots` lines): per fault (from it to the next), the failed master's
/// keys and the healthy masters' keys told apart by the slot of each key
/// (`KEY_SLOTS`, from `soak cluster-keys`), their 503s before and after the
/// promotion of the failed master's replica (the first `replica-promoted`
/// moment after the fault), and each phase between the moments of the run.
/// Another `slots` line (not a fault's) names a shard whose keys are shown
/// apart too, among the healthy ones. `Some` answers of 503 on a healthy
/// master's key (every key before the first fault), `None` when not a
/// Cluster run.
fn cluster_report(answers: &[Answer], list: &[Event], start_ms: u64) -> Result<Option<u64>, Error> {
    let slots: Vec<(u64, &str, &SlotRanges)> = list
        .iter()
        .filter_map(|e| match e {
            Event::Slots(at, name, ranges) => Some((*at, name.as_str(), ranges.as_slice())),
            _ => None,
        })
        .collect();
    if slots.is_empty() {
        return Ok(None);
    }
    let path = std::env::var("KEY_SLOTS").map_err(|_| "KEY_SLOTS (each key's slot) is not set")?;
    let mut slot_of: HashMap<u32, u16> = HashMap::new();
    for line in std::fs::read_to_string(&path)?.lines() {
        let (key, slot) = line
            .split_once(' ')
            .ok_or_else(|| format!("{path}: {line:?}: not `KEY SLOT`"))?;
        slot_of.insert(key.parse()?, slot.parse()?);
    }
    let in_ranges = |ranges: &SlotRanges, key: u32| {
        slot_of
            .get(&key)
            .is_some_and(|s| ranges.iter().any(|&(from, to)| (from..=to).contains(s)))
    };
    if let Some(a) = answers.iter().find(|a| !slot_of.contains_key(&a.key)) {
        return Err(format!("{path}: no slot for key {}", a.key).into());
    }
    let rel = |ms: u64| (ms as f64 - start_ms as f64) / 1e3;
    let ms = |us: u64| us as f64 / 1e3;
    let end_ms = answers.last().map_or(start_ms, |a| a.unix_us / 1000 + 1);
    // 503s, answers and the slowest answer of `keys` from `from` to `until`
    // (milliseconds), and the last 503's time.
    let tally = |from: u64, until: u64, keys: &dyn Fn(u32) -> bool| {
        let (mut n, mut unavailable, mut slowest, mut last) = (0u64, 0u64, 0u64, None);
        for a in answers
            .iter()
            .filter(|a| a.unix_us >= from * 1000 && a.unix_us < until * 1000 && keys(a.key))
        {
            n += 1;
            slowest = slowest.max(a.latency_us);
            if a.status == 503 {
                unavailable += 1;
                last = Some(a.unix_us / 1000);
            }
        }
        (n, unavailable, slowest, last)
    };
    let faults = faults(list);
    let mut healthy_unavailable = 0;
    let first_fault = faults.first().map_or(end_ms, |f| f.0);
    let (n, unavailable, slowest, _) = tally(start_ms, first_fault, &|_| true);
    healthy_unavailable += unavailable;
    println!(
        "cluster: before the first fault, every master healthy: {unavailable} answers of 503 of {n}, slowest answer {:.1} ms",
        ms(slowest)
    );
    for (i, &(at, name)) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map_or(end_ms, |f| f.0);
        let Some(&(_, _, ranges)) = slots.iter().find(|s| s.1 == name) else {
            return Err(format!("no `slots` line for the fault {name}").into());
        };
        let failed = |key: u32| in_ranges(ranges, key);
        let healthy = |key: u32| !in_ranges(ranges, key);
        let keys = slot_of.keys().filter(|&&k| failed(k)).count();
        let ranges_text: Vec<String> = ranges.iter().map(|(f, t)| format!("{f}-{t}")).collect();
        println!(
            "cluster: fault {name} at {:.1} s, until {:.1} s: the failed master's slots {} ({keys} of {} keys)",
            rel(at),
            rel(until),
            ranges_text.join(","),
            slot_of.len(),
        );
        let promotion = list.iter().find_map(|e| match e {
            Event::Moment(m, what) if *m >= at && *m < until && what == "replica-promoted" => {
                Some(*m)
            }
            _ => None,
        });
        let (_, before, _, _) = tally(at, promotion.unwrap_or(until), &failed);
        match promotion {
            Some(p) => {
                let (_, after, _, last) = tally(p, until, &failed);
                println!(
                    "  the failed master's keys: {before} answers of 503 before the promotion ({} ms after the fault), {after} after it; last 503 on its keys {}",
                    p - at,
                    last.map_or("none after the promotion".to_owned(), |l| format!(
                        "{} ms after the promotion",
                        l - p
                    )),
                );
            }
            None => println!(
                "  the failed master's keys: {before} answers of 503; its replica was not promoted"
            ),
        }
        let (n, unavailable, slowest, _) = tally(at, until, &healthy);
        healthy_unavailable += unavailable;
        println!(
            "  the healthy masters' keys: {unavailable} answers of 503 of {n}, slowest answer {:.1} ms",
            ms(slowest)
        );
        // Each phase, between the moments of the fault's span.
        let mut marks: Vec<(u64, &str)> = vec![(at, name)];
        for e in list {
            if let Event::Moment(m, what) = e
                && *m >= at
                && *m < until
            {
                marks.push((*m, what));
            }
        }
        marks.sort_unstable_by_key(|m| m.0);
        for (j, &(from, what)) in marks.iter().enumerate() {
            let to = marks.get(j + 1).map_or(until, |m| m.0);
            let (fn_, fu, fs, _) = tally(from, to, &failed);
            let (hn, hu, hs, _) = tally(from, to, &healthy);
            let mut line = format!(
                "  from {what} ({:.2} s) for {} ms: failed master's keys {fu} 503s of {fn_}, slowest {:.1} ms; healthy keys {hu} 503s of {hn}, slowest {:.1} ms",
                rel(from),
                to - from,
                ms(fs),
                ms(hs)
            );
            for &(_, shard, shard_ranges) in
                slots.iter().filter(|s| !faults.iter().any(|f| f.1 == s.1))
            {
                let (sn, su, ss, _) =
                    tally(from, to, &|k| in_ranges(shard_ranges, k) && healthy(k));
                line.push_str(&format!(
                    " (of which {shard}'s shard: {su} of {sn}, slowest {:.1} ms)",
                    ms(ss)
                ));
            }
            println!("{line}");
        }
    }
    Ok(Some(healthy_unavailable))
}

/// What [`per_window`] counted.
struct Windows {
    windows: u64,
    /// Admissions past the limit.
    over: u64,
    /// Windows past it.
    over_windows: u64,
    /// The most admitted in one window.
    fullest: u64,
    /// Windows that reached the limit: only in those can an admission the
    /// store lost show.
    full: u64,
}

/// Admissions per window, each group's deadlines (sorted here) told apart as
/// [`report`] says.
fn per_window<K>(groups: &mut HashMap<K, Vec<u64>>, limit: u64, window_ms: u64) -> Windows {
    let (mut windows, mut over, mut over_windows, mut fullest, mut full) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for deadlines in groups.values_mut() {
        deadlines.sort_unstable();
        let mut group: Option<(u64, u64)> = None; // (first deadline, admitted)
        let mut close = |g: Option<(u64, u64)>| {
            if let Some((_, admitted)) = g {
                windows += 1;
                fullest = fullest.max(admitted);
                full += u64::from(admitted >= limit);
                if admitted > limit {
                    over += admitted - limit;
                    over_windows += 1;
                }
            }
        };
        for &d in deadlines.iter() {
            match group {
                Some((first, ref mut n)) if d <= first + window_ms / 2 => *n += 1,
                _ => {
                    close(group);
                    group = Some((d, 1));
                }
            }
        }
        close(group);
    }
    Windows {
        windows,
        over,
        over_windows,
        fullest,
        full,
    }
}

/// How far past its limit each key went, whoever decided: per key, the most
/// admissions (over every instance) in any span of one window, before the
/// first fault (spans that end before it) and from then on. Windows pinned
/// to their first hit let up to twice the limit into a span that straddles
/// two of them, so the figure before the fault is the baseline.
fn overshoot(answers: &[Answer], limit: u64, window_ms: u64, fault_ms: Option<u64>) {
    let mut by_key: HashMap<u32, Vec<u64>> = HashMap::new();
    for a in answers.iter().filter(|a| a.status == 200) {
        by_key.entry(a.key).or_default().push(a.unix_us / 1000);
    }
    let fault = fault_ms.unwrap_or(u64::MAX);
    let (mut before, mut after): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    for times in by_key.values() {
        // Sorted already: the answers are.
        let (mut most_before, mut most_after, mut end) = (0u64, 0u64, 0usize);
        for (start, &t) in times.iter().enumerate() {
            while end < times.len() && times[end] < t + window_ms {
                end += 1;
            }
            let n = (end - start) as u64;
            if t + window_ms <= fault {
                most_before = most_before.max(n);
            } else {
                most_after = most_after.max(n);
            }
        }
        before.push(most_before);
        after.push(most_after);
    }
    let show = |what: &str, mut most: Vec<u64>| {
        if most.is_empty() {
            return;
        }
        most.sort_unstable();
        let keys = most.len();
        let over = |times: u64| most.iter().filter(|&&n| n > times * limit).count();
        println!(
            "most admitted per key in any {window_ms} ms span, {what}: highest {} ({:.2}x the limit of {limit}), median {}; keys above the limit {}, above twice it {}, of {keys}",
            most[keys - 1],
            most[keys - 1] as f64 / limit as f64,
            most[keys / 2],
            over(1),
            over(2),
        );
    };
    show("before the first fault", before);
    if fault_ms.is_some() {
        show("from the first fault on", after);
    }
}
