//! The load and the judge of the limits-that-change soak (`bash
//! soak/limits.sh`; soak/README.md says what it does): the targets of issue
//! 43 for limits held in the store.
//!
//! ```text
//! limits_soak redis       four instances on the Redis at REDIS_URL (counters under PREFIX)
//! limits_soak postgres    four instances on PostgreSQL (DATABASE_URL, SCHEMA; migrated here)
//! ```
//!
//! One process holds `INSTANCES` (4) instances of a service, each a
//! `RateLimitLayer` named `limits` keyed by `x-key` (`LIMIT` a `WINDOW_MS`
//! window, failing closed) over a backend of its own (its own Redis
//! connection, or its own pool) and a `LimitBook` of its own, staleness
//! `STALENESS_MS`. `WORKERS` tasks an instance send `RATE` requests a second
//! between them to one of `KEYS` keys for `DURATION` seconds, while a
//! controller (a fifth connection and book) sets the layer's stored limit
//! every `PERIOD_MS` to the next of `LIMITS` (a cycle). Every answer is
//! written down: when its request started and ended, the instance, the key,
//! the status, the limit the layer applied and the count the store answered
//! ([`Decision`]), and for an admission the window's deadline (the end plus
//! the decision's `reset`).
//!
//! Then two steady stretches of `STEADY` seconds each, the same load: the
//! layers with the book (its limit held), and four layers named `fixed` with
//! a fixed quota and no book; the store's calls are read before and after
//! each (`INFO commandstats` on Redis; on PostgreSQL the table scans of
//! `pg_stat_user_tables`, since `pg_stat_statements` needs a server
//! restart to load).
//!
//! It prints the figures and exits 1 when an invariant fails: a window that
//! admitted more than the highest limit in force during [its start − the
//! bound, its end] (the bound: `STALENESS_MS` plus `READ_MS`, one read), or
//! more than the highest limit its own admissions were decided under; a
//! window that admitted past a lowered limit from a request started once
//! the bound had passed since the set; an instance that applied a limit
//! later than the bound after its set, or an older limit again after a
//! newer one; an answer of 500; more background reads of the limits than one
//! per staleness per instance in a steady stretch.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_pinned_window::backend::{LimitScope, Limits};
use tower_pinned_window::{Decision, DecisionIn, LimitBook, Quota, RateLimitLayer, Window};
use tower_pinned_window_postgres::PostgresBackend;
use tower_pinned_window_postgres::deadpool_postgres::{Manager, Pool};
use tower_pinned_window_postgres::tokio_postgres::{self, NoTls};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::connection_manager_config;

#[path = "../soak_env.rs"]
mod soak_env;
use soak_env::{Error, env, unix_us};

/// The name of the layers whose limits change.
const LAYER: &str = "limits";
/// The name of the layers of the steady stretch without a book.
const FIXED: &str = "fixed";

/// The run's settings, from the environment.
#[derive(Clone)]
struct Settings {
    instances: usize,
    keys: u32,
    workers: u32,
    rate: f64,
    window: Duration,
    base: u64,
    limits: Vec<u64>,
    period: Duration,
    duration: Duration,
    steady: Duration,
    staleness: Duration,
    read: Duration,
}

impl Settings {
    fn read() -> Result<Self, Error> {
        let limits: String = env("LIMITS", "10,30,15,40".to_owned())?;
        let limits = limits
            .split(',')
            .map(|l| l.trim().parse::<u64>().map_err(|e| format!("LIMITS: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if limits.is_empty() || limits.contains(&0) {
            return Err("LIMITS: a list of limits of at least 1".into());
        }
        Ok(Self {
            instances: env("INSTANCES", 4)?,
            keys: env("KEYS", 4)?,
            workers: env("WORKERS", 16)?,
            rate: env("RATE", 400.0)?,
            window: Duration::from_millis(env("WINDOW_MS", 1_000)?),
            base: env("LIMIT", 40)?,
            limits,
            period: Duration::from_millis(env("PERIOD_MS", 1_000)?),
            duration: Duration::from_secs(env("DURATION", 30)?),
            steady: Duration::from_secs(env("STEADY", 10)?),
            staleness: Duration::from_millis(env("STALENESS_MS", 200)?),
            read: Duration::from_millis(env("READ_MS", 100)?),
        })
    }

    fn quota(&self) -> Result<Quota, Error> {
        Ok(Quota::new(self.base, self.window)?)
    }

    fn bound_us(&self) -> u64 {
        (self.staleness + self.read).as_micros() as u64
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = Settings::read()?;
    let passed = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["redis"] => redis_run(&settings).await?,
        ["postgres"] => postgres_run(&settings).await?,
        _ => return Err("usage: limits_soak redis|postgres".into()),
    };
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

/// How the store's calls are counted around a steady stretch.
enum Calls {
    /// `INFO commandstats` on this connection.
    Redis(redis::aio::MultiplexedConnection),
    /// `pg_stat_user_tables` of the schema.
    Postgres(Pool, String),
}

/// Calls per command (Redis) or scans and writes per table (PostgreSQL).
type Counts = BTreeMap<String, u64>;

impl Calls {
    async fn read(&mut self) -> Result<Counts, Error> {
        match self {
            Self::Redis(connection) => {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(connection)
                    .await?;
                let mut counts = Counts::new();
                for line in info.lines() {
                    let Some(rest) = line.strip_prefix("cmdstat_") else {
                        continue;
                    };
                    let Some((name, fields)) = rest.split_once(':') else {
                        continue;
                    };
                    if name == "info" {
                        continue;
                    }
                    let calls = fields
                        .split(',')
                        .find_map(|f| f.strip_prefix("calls="))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    counts.insert(name.to_owned(), calls);
                }
                Ok(counts)
            }
            Self::Postgres(pool, schema) => {
                // Backends flush their statistics when idle, at most once a
                // second (or after 10 s): read until two reads a second
                // apart agree, for up to 15 s.
                let client = pool.get().await?;
                let mut last: Option<Counts> = None;
                for _ in 0..15 {
                    let rows = client
                        .query(
                            "SELECT relname::text, coalesce(seq_scan, 0) + coalesce(idx_scan, 0),
                                    n_tup_ins + n_tup_upd
                             FROM pg_stat_user_tables WHERE schemaname = $1",
                            &[&schema.as_str()],
                        )
                        .await?;
                    let mut counts = Counts::new();
                    for row in rows {
                        let table: String = row.get(0);
                        counts.insert(format!("{table} scans"), row.get::<_, i64>(1) as u64);
                        counts.insert(format!("{table} writes"), row.get::<_, i64>(2) as u64);
                    }
                    if last.as_ref() == Some(&counts) {
                        return Ok(counts);
                    }
                    last = Some(counts);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(last.unwrap_or_default())
            }
        }
    }
}

async fn redis_run(settings: &Settings) -> Result<bool, Error> {
    let url: String = std::env::var("REDIS_URL").map_err(|_| "REDIS_URL is not set")?;
    let prefix: String = env("PREFIX", "tpw-limits-soak:".to_owned())?;
    let client = redis::Client::open(url.as_str())?;
    let mut backends = Vec::new();
    // The instances' and the controller's: each its own connection.
    for _ in 0..=settings.instances {
        let connection = client
            .get_connection_manager_with_config(connection_manager_config())
            .await?;
        backends.push(
            RedisBackend::builder(connection)
                .try_prefix(prefix.clone())?
                .build(),
        );
    }
    let calls = Calls::Redis(client.get_multiplexed_async_connection().await?);
    println!("store: Redis at {url}");
    run(settings, backends, calls).await
}

async fn postgres_run(settings: &Settings) -> Result<bool, Error> {
    let url: String = env(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test".to_owned(),
    )?;
    let schema: String = env("SCHEMA", "tpw_limits_soak".to_owned())?;
    let pool = |app: String| -> Result<Pool, Error> {
        let mut config: tokio_postgres::Config = url.parse()?;
        config.application_name(&app);
        Ok(Pool::builder(Manager::new(config, NoTls))
            .max_size(env("POOL_SIZE", 8)?)
            .build()?)
    };
    let mut backends = Vec::new();
    for i in 0..=settings.instances {
        backends.push(
            PostgresBackend::builder(pool(format!("tpw-limits-soak-{i}"))?)
                .schema(&schema)
                .build(),
        );
    }
    backends[0].migrate().await?;
    let calls = Calls::Postgres(pool("tpw-limits-soak-stats".to_owned())?, schema.clone());
    println!("store: PostgreSQL at {url}, schema {schema}");
    run(settings, backends, calls).await
}

/// One answer, as its instance saw it.
#[derive(Clone, Copy)]
struct Answer {
    start_us: u64,
    end_us: u64,
    instance: usize,
    key: u32,
    status: u16,
    /// The limit the layer applied (0: no decision).
    limit: u64,
    count: u64,
    /// The window's deadline, for an admission (else 0).
    deadline_ms: u64,
}

/// A set of the controller: when it was asked, when the store answered, and
/// the limit.
#[derive(Clone, Copy, Debug)]
struct Set {
    start_us: u64,
    ack_us: u64,
    limit: u64,
}

/// The service the layers guard: 200, at once.
async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

async fn run<B>(settings: &Settings, mut backends: Vec<B>, mut calls: Calls) -> Result<bool, Error>
where
    B: Limits + Clone + Send + Sync + 'static,
    B::Future: Send,
{
    let controller = backends.pop().expect("a controller's backend");
    let control = LimitBook::new(&controller, settings.staleness)?;
    control.clear(LAYER, LimitScope::Layer).await?;
    let quota = settings.quota()?;
    let header = HeaderName::from_static("x-key");
    let timeout = Window::new(Duration::from_millis(env("LAYER_TIMEOUT_MS", 100)?))?;
    let mut services = Vec::new();
    let mut fixed = Vec::new();
    for backend in &backends {
        let book = LimitBook::new(backend, settings.staleness)?;
        services.push(
            RateLimitLayer::new(LAYER, quota)
                .key(header.clone())
                .decision_in(DecisionIn::Response)
                .timeout(timeout)
                .backend(backend.clone())
                .limits(book)
                .layer(tower::service_fn(ok)),
        );
        fixed.push(
            RateLimitLayer::new(FIXED, quota)
                .key(header.clone())
                .decision_in(DecisionIn::Response)
                .timeout(timeout)
                .backend(backend.clone())
                .layer(tower::service_fn(ok)),
        );
    }
    println!(
        "limits soak: {} instances x {} workers, {} requests/s each, {} keys, {} per {} ms (the layer's quota), \
         the stored limit set every {} ms to the next of {:?} for {} s; staleness {} ms, bound {} ms (+ one read, READ_MS {})",
        settings.instances,
        settings.workers,
        settings.rate,
        settings.keys,
        settings.base,
        settings.window.as_millis(),
        settings.period.as_millis(),
        settings.limits,
        settings.duration.as_secs(),
        settings.staleness.as_millis(),
        settings.bound_us() / 1000,
        settings.read.as_millis(),
    );

    // The limits that change, under load.
    let start_us = unix_us();
    let end_us = start_us + settings.duration.as_micros() as u64;
    let loads = start_load(settings, &services, end_us);
    let mut sets = vec![Set {
        start_us: 0,
        ack_us: 0,
        limit: settings.base,
    }];
    let mut next = start_us;
    for limit in settings.limits.iter().cycle() {
        next += settings.period.as_micros() as u64;
        if next >= end_us {
            break;
        }
        tokio::time::sleep(Duration::from_micros(next.saturating_sub(unix_us()))).await;
        let set_start = unix_us();
        control
            .set(
                LAYER,
                LimitScope::Layer,
                Quota::new(*limit, settings.window)?,
            )
            .await?;
        sets.push(Set {
            start_us: set_start,
            ack_us: unix_us(),
            limit: *limit,
        });
    }
    let mut answers = Vec::new();
    for load in loads {
        answers.extend(load.await?);
    }
    let mut passed = judge(settings, start_us, &sets, &answers);

    // The steady stretches: with the book, its stored limit the fixed
    // quota's (so that both admit alike), then the fixed quota alone.
    control
        .set(LAYER, LimitScope::Layer, settings.quota()?)
        .await?;
    // Applied, and every window of the changing stretch closed (no load
    // meanwhile): both stretches start on fresh windows.
    tokio::time::sleep(settings.staleness + settings.read + settings.window).await;
    println!(
        "\nsteady stretches of {} s, the same load: the layers with the book (stored limit {}, applied), then layers of the same quota, fixed, without a book",
        settings.steady.as_secs(),
        settings.base
    );
    let mut per_request = Vec::new();
    for (name, with_book) in [("with the book", true), ("fixed quota", false)] {
        let before = calls.read().await?;
        let end_us = unix_us() + settings.steady.as_micros() as u64;
        let loads = if with_book {
            start_load(settings, &services, end_us)
        } else {
            start_load(settings, &fixed, end_us)
        };
        let mut requests = 0u64;
        let mut admitted = 0u64;
        for load in loads {
            for a in load.await? {
                requests += 1;
                admitted += u64::from(a.status == 200);
            }
        }
        let after = calls.read().await?;
        let diff: Counts = after
            .iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        // The calls a client sends: on Redis the scripts and the reads of
        // the limits (commandstats counts the commands a script runs too,
        // listed after); on PostgreSQL the tables' scans.
        let total: u64 = diff
            .iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "evalsha" | "eval" | "evalsha_ro" | "eval_ro" | "hgetall"
                ) || k.ends_with(" scans")
            })
            .map(|(_, v)| v)
            .sum();
        println!(
            "  {name}: {requests} requests ({admitted} admitted), store calls {total}: {:.4} a request; all counted: {}",
            total as f64 / requests.max(1) as f64,
            diff.iter()
                .map(|(k, v)| format!(
                    "{k} {v} ({:.4}/request)",
                    *v as f64 / requests.max(1) as f64
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if with_book {
            // The reads of the limits: at most one per staleness per
            // instance (and one more each, at the stretch's edges).
            let reads = limit_reads(&diff);
            let most = settings.instances as u64
                * (settings.steady.as_millis() as u64
                    / settings.staleness.as_millis().max(1) as u64
                    + 2);
            match reads {
                Some(reads) => {
                    let ok = reads <= most;
                    println!(
                        "  reads of the limits: {reads} in {} s by {} instances (at most {most}: one per staleness each): {}",
                        settings.steady.as_secs(),
                        settings.instances,
                        if ok { "ok" } else { "FAILED" }
                    );
                    passed &= ok;
                }
                None => println!("  reads of the limits: none counted"),
            }
        }
        let reads = limit_reads(&diff).unwrap_or(0);
        per_request.push((
            total as f64 / requests.max(1) as f64,
            (total - reads) as f64 / requests.max(1) as f64,
        ));
        // The next stretch starts on fresh windows too.
        tokio::time::sleep(settings.window).await;
    }
    if let Calls::Postgres(..) = calls {
        println!(
            "  (PostgreSQL: pg_stat_statements is not loaded here (it needs shared_preload_libraries and a restart): \
             statements per request not measured; the figures are the tables' scans and rows written, pg_stat_user_tables)"
        );
    }
    println!(
        "  store calls per request: with the book {:.4} ({:.4} without its reads of the limits), fixed {:.4}; \
         the difference less those reads: {:+.4}",
        per_request[0].0,
        per_request[0].1,
        per_request[1].0,
        per_request[0].1 - per_request[1].1
    );
    println!("\n{}", if passed { "PASSED" } else { "FAILED" });
    Ok(passed)
}

/// The reads of the limits among `diff`: `HGETALL`s on Redis, the scans of
/// the limits table on PostgreSQL.
fn limit_reads(diff: &Counts) -> Option<u64> {
    diff.get("hgetall").copied().or_else(|| {
        diff.iter()
            .find(|(k, _)| k.ends_with("_limits scans"))
            .map(|(_, v)| *v)
    })
}

/// Start the load on `services` until `end_us`: each instance's answers.
fn start_load<S>(
    settings: &Settings,
    services: &[S],
    end_us: u64,
) -> Vec<tokio::task::JoinHandle<Vec<Answer>>>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let period = Duration::from_secs_f64(f64::from(settings.workers) / settings.rate);
    let keys = settings.keys;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (instance, service) in services.iter().enumerate() {
        let workers: Vec<_> = (0..settings.workers)
            .map(|w| {
                let service = service.clone();
                let stop = Arc::clone(&stop);
                let mut seed = ((instance as u64) << 32 | u64::from(w))
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    | 1;
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut tick = tokio::time::interval(period);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    while unix_us() < end_us && !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let key = (seed % u64::from(keys)) as u32;
                        let request = Request::builder()
                            .header("x-key", format!("k{key}"))
                            .body(Body::empty())
                            .expect("a valid request");
                        let start_us = unix_us();
                        let Ok(response) = service.clone().oneshot(request).await;
                        let end_us = unix_us();
                        let decision = response.extensions().get::<Decision>();
                        let status = response.status();
                        answers.push(Answer {
                            start_us,
                            end_us,
                            instance,
                            key,
                            status: status.as_u16(),
                            limit: decision.map_or(0, Decision::limit),
                            count: decision.map_or(0, Decision::count),
                            deadline_ms: match decision {
                                Some(d) if status == StatusCode::OK => {
                                    end_us / 1000 + d.reset().as_millis() as u64
                                }
                                _ => 0,
                            },
                        });
                    }
                    answers
                })
            })
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut all = Vec::new();
            for worker in workers {
                all.extend(worker.await.expect("a load task"));
            }
            all
        }));
    }
    tasks
        .into_iter()
        .map(|t| tokio::spawn(async move { t.await.expect("an instance's load") }))
        .collect()
}

/// One window of a key, over every instance.
struct KeyWindow {
    key: u32,
    /// The earliest deadline its admissions read.
    deadline_ms: u64,
    admitted: u64,
    /// The highest limit its admissions were decided under.
    applied: u64,
    /// Admissions from requests started once the bound had passed since a
    /// lowered limit's set, past that limit (by the store's count).
    past_lowered: u64,
}

/// The figures of the changing stretch; `true` when its invariants hold.
fn judge(settings: &Settings, start_us: u64, sets: &[Set], answers: &[Answer]) -> bool {
    let bound = settings.bound_us();
    let window_ms = settings.window.as_millis() as u64;
    let mut passed = true;
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for a in answers {
        *statuses.entry(a.status).or_default() += 1;
    }
    println!("\nanswers by status: {statuses:?}");
    if statuses.contains_key(&500) {
        println!("FAILED: answers of 500");
        passed = false;
    }

    // The limit in force at a moment: each set's from its start until the
    // next one's answer.
    let in_force = |from_us: u64, to_us: u64| -> u64 {
        sets.iter()
            .enumerate()
            .filter(|(i, s)| {
                let until = sets.get(i + 1).map_or(u64::MAX, |n| n.ack_us);
                s.start_us <= to_us && until >= from_us
            })
            .map(|(_, s)| s.limit)
            .max()
            .unwrap_or(settings.base)
    };
    // The set in force, for a request started at `at` once the bound had
    // passed since it was answered (and before the next one was asked).
    let settled = |at: u64| -> Option<&Set> {
        sets.iter().enumerate().find_map(|(i, s)| {
            let next = sets.get(i + 1).map_or(u64::MAX, |n| n.start_us);
            (at >= s.ack_us + bound && at < next).then_some(s)
        })
    };

    // Windows: a key's admissions grouped by deadline, those within half a
    // window of the first one the same window.
    let mut admitted: Vec<&Answer> = answers.iter().filter(|a| a.status == 200).collect();
    admitted.sort_by_key(|a| (a.key, a.deadline_ms));
    let mut windows: Vec<KeyWindow> = Vec::new();
    for a in admitted {
        let same = windows
            .last()
            .is_some_and(|w| w.key == a.key && a.deadline_ms < w.deadline_ms + window_ms / 2);
        if !same {
            windows.push(KeyWindow {
                key: a.key,
                deadline_ms: a.deadline_ms,
                admitted: 0,
                applied: 0,
                past_lowered: 0,
            });
        }
        let w = windows.last_mut().expect("a window");
        w.admitted += 1;
        w.applied = w.applied.max(a.limit);
        if let Some(set) = settled(a.start_us) {
            let lowered = sets
                .iter()
                .position(|s| s.start_us == set.start_us)
                .is_some_and(|i| i > 0 && sets[i - 1].limit > set.limit);
            if lowered && a.count > set.limit {
                w.past_lowered += 1;
            }
        }
    }
    windows.sort_by_key(|w| (w.deadline_ms, w.key));
    let first_ms = start_us / 1000;
    println!(
        "\nper window (start in ms from the load's start): key, admitted, highest limit in force during [start - bound, end], highest limit applied"
    );
    let mut exceeded = 0;
    let mut past_applied = 0;
    let mut past_lowered = 0;
    let mut lines = Vec::new();
    for w in &windows {
        let start_ms = w.deadline_ms - window_ms;
        let highest = in_force(
            (start_ms * 1000).saturating_sub(bound),
            w.deadline_ms * 1000,
        );
        let over = w.admitted > highest;
        exceeded += usize::from(over);
        past_applied += usize::from(w.admitted > w.applied);
        past_lowered += usize::from(w.past_lowered > 0);
        lines.push(format!(
            "{:>6} k{} {:>3} {:>3} {:>3}{}{}",
            start_ms as i64 - first_ms as i64,
            w.key,
            w.admitted,
            highest,
            w.applied,
            if over { " EXCEEDED" } else { "" },
            if w.past_lowered > 0 {
                format!(" {} past a lowered limit", w.past_lowered)
            } else {
                String::new()
            }
        ));
    }
    for chunk in lines.chunks(4) {
        println!("  {}", chunk.join("   |"));
    }
    let full = windows
        .iter()
        .filter(|w| {
            let start = (w.deadline_ms - window_ms) * 1000;
            w.admitted == in_force(start.saturating_sub(bound), w.deadline_ms * 1000)
        })
        .count();
    println!(
        "windows: {}; exceeding the highest limit in force: {exceeded}; exceeding the highest limit applied: {past_applied}; \
         at the highest limit in force exactly: {full}",
        windows.len()
    );
    println!(
        "windows admitting past a lowered limit once the bound ({} ms) had passed since its set: {past_lowered}",
        bound / 1000
    );
    if exceeded > 0 || past_applied > 0 || past_lowered > 0 {
        println!("FAILED: a window past its limit");
        passed = false;
    }

    // Staleness: per set and instance, from the set's answer to the start
    // of the instance's first request decided under the new limit.
    let mut lags: Vec<i64> = Vec::new();
    let mut late = 0;
    let mut missing = 0;
    let mut back = 0;
    let mut by_instance: HashMap<usize, Vec<&Answer>> = HashMap::new();
    for a in answers.iter().filter(|a| a.limit > 0) {
        by_instance.entry(a.instance).or_default().push(a);
    }
    for list in by_instance.values_mut() {
        list.sort_by_key(|a| a.start_us);
    }
    for (i, set) in sets.iter().enumerate().skip(1) {
        let next = sets.get(i + 1).map_or(u64::MAX, |n| n.start_us);
        for instance in 0..settings.instances {
            let list = by_instance.get(&instance).map_or(&[][..], Vec::as_slice);
            let Some(first) = list
                .iter()
                .find(|a| a.start_us >= set.start_us && a.start_us < next && a.limit == set.limit)
            else {
                missing += 1;
                continue;
            };
            let lag = first.start_us as i64 - set.ack_us as i64;
            lags.push(lag);
            if lag > bound as i64 {
                late += 1;
            }
            // Once applied, never an older limit again in this set's time.
            back += list
                .iter()
                .filter(|a| a.start_us > first.end_us && a.start_us < next && a.limit != set.limit)
                .count();
        }
    }
    lags.sort_unstable();
    let pick = |q: f64| {
        lags.get(((lags.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |v| *v as f64 / 1000.0)
    };
    println!(
        "\nstaleness, from a set's answer to each instance's first request decided under it ({} sets x {} instances): \
         min {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms; later than the bound: {late}; never applied: {missing}; \
         an older limit after the new one: {back}",
        sets.len() - 1,
        settings.instances,
        pick(0.0),
        pick(0.5),
        pick(0.9),
        pick(1.0),
    );
    if late > 0 || missing > 0 || back > 0 {
        println!("FAILED: a limit applied late, never, or undone");
        passed = false;
    }
    let latency: Vec<u64> = {
        let mut l: Vec<u64> = answers.iter().map(|a| a.end_us - a.start_us).collect();
        l.sort_unstable();
        l
    };
    if !latency.is_empty() {
        println!(
            "answer latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            latency[latency.len() / 2] as f64 / 1000.0,
            latency[(latency.len() - 1) * 99 / 100] as f64 / 1000.0,
            latency[latency.len() - 1] as f64 / 1000.0
        );
    }
    passed
}
