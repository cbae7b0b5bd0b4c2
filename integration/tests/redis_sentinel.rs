//! The Redis backend through Redis Sentinel, against a real master, replica
//! and three sentinels that the harness starts; failovers in the middle of
//! traffic. The backend contract runs here too (`contract::*`,
//! `contract_deny_cache::*`), on connections through the sentinels.
//!
//! How the failover tests count what a failover costs: every hit Redis
//! counted comes back with its count. Over a run inside one window, the hits
//! counted on a key (`counted`) are either on the new master's counter at the
//! end (`final`) or were lost with the old master: `lost = counted - final`.
//! The old master's hits are admitted while under the limit, and the new
//! master goes on counting from what it had received of them, so every lost
//! hit is one more admission once the key reaches its limit on the new
//! master: admissions over the limit equal the lost hits. (A hit whose answer
//! was lost with the connection but that Redis counted and replicated is
//! counted without being admitted, which is why `lost` can be below zero.)

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use http::StatusCode;
use redis::ConnectionAddr;
use stores::redis::RedisStore;
use support::http::{by_client, from, multi_thread_runtime, ok_service};
use support::redis::{RedisServer, SENTINEL_MASTER, SentinelGroup, Shared, cases};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::{Backend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Decision, DecisionIn, FailurePolicy, Quota, RateLimitLayer, Window};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::SentinelConnection;
use trial::Needs;

/// Tasks sending hits, one at a time each.
const TASKS: usize = 8;
/// Keys the tasks take in turn.
const KEYS: usize = 4;
/// The limit per key: reached only on the new master, after the failover.
const LIMIT: u64 = 1_000;
/// Hits counted on every key before the fault.
const BEFORE_FAULT: u64 = 100;
/// The window: longer than any run, so each key has one window throughout.
const WINDOW: Duration = Duration::from_secs(600);

fn quota() -> Quota {
    Quota::new(LIMIT, WINDOW).unwrap()
}

fn key(k: usize) -> String {
    format!("k{k}")
}

async fn connect(group: &SentinelGroup) -> SentinelConnection {
    SentinelConnection::connect(group.sentinel_urls(), SENTINEL_MASTER)
        .await
        .unwrap_or_else(|e| panic!("connect through the sentinels: {e}\n{}", group.logs()))
}

fn port_of(addr: &ConnectionAddr) -> u16 {
    match addr {
        ConnectionAddr::Tcp(_, port) => *port,
        other => panic!("a TCP master, not {other:?}"),
    }
}

/// One hit on key number `k`: its count when Redis counted it, `None` when
/// it failed.
type Hitter = Arc<dyn Fn(usize) -> BoxFuture<'static, Option<u64>> + Send + Sync>;

/// What one hit came back with.
struct Outcome {
    key: usize,
    at: Instant,
    count: Option<u64>,
}

struct Run {
    outcomes: Vec<Outcome>,
    fault_at: Instant,
    /// When a majority of the sentinels named the replica as the master.
    promoted_at: Instant,
}

/// Traffic on every key; once each key has `BEFORE_FAULT` hits, `fault`
/// strikes the master; the traffic goes on until the sentinels have promoted
/// the replica and every key has passed its limit on it.
async fn traffic_through_a_failover(
    group: &mut SentinelGroup,
    fault: impl FnOnce(&mut SentinelGroup),
    hit: Hitter,
) -> Run {
    let new = group.servers[1].port();
    let highest: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (hit, highest, stop) = (hit.clone(), highest.clone(), stop.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                let mut k = task % KEYS;
                while !stop.load(Ordering::Relaxed) {
                    let count = hit(k).await;
                    if let Some(count) = count {
                        highest[k].fetch_max(count, Ordering::Relaxed);
                    }
                    outcomes.push(Outcome {
                        key: k,
                        at: Instant::now(),
                        count,
                    });
                    k = (k + 1) % KEYS;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                outcomes
            })
        })
        .collect();
    let every_key_at = |at_least: u64| {
        let highest = highest.clone();
        move || {
            highest
                .iter()
                .all(|h| h.load(Ordering::Relaxed) >= at_least)
        }
    };
    wait(
        group,
        "traffic on every key",
        Duration::from_secs(30),
        every_key_at(BEFORE_FAULT),
    )
    .await;
    fault(group);
    // After the fault: the old master answered no hit after this but those
    // then in flight.
    let fault_at = Instant::now();
    wait(
        group,
        "the sentinels to promote the replica",
        Duration::from_secs(60),
        || group.master_port() == Some(new),
    )
    .await;
    let promoted_at = Instant::now();
    wait(
        group,
        "every key past its limit on the new master",
        Duration::from_secs(60),
        every_key_at(LIMIT + 100),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.extend(task.await.unwrap());
    }
    Run {
        outcomes,
        fault_at,
        promoted_at,
    }
}

async fn wait(group: &SentinelGroup, what: &str, limit: Duration, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "waited {limit:?} for {what}\n{}",
            group.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every key under `prefix` on `server`, with its value and `PTTL`.
fn counters(server: &RedisServer, prefix: &str) -> Vec<(String, i64, i64)> {
    let mut con = server.sync();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut con)
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let value: i64 = redis::cmd("GET").arg(&k).query(&mut con).unwrap();
            let pttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut con).unwrap();
            (k, value, pttl)
        })
        .collect()
}

/// What a failover cost on one key.
struct KeyFigures {
    /// Hits counted (by either master) that the new master's counter lacks
    /// at the end.
    lost: i64,
    /// Admissions over the limit.
    extra: i64,
}

/// The figures of a run, checked and printed: `name` says which test.
fn check_run(
    name: &str,
    run: &Run,
    new_master: &RedisServer,
    prefix: &str,
    exact: bool,
) -> Vec<KeyFigures> {
    let errors: Vec<&Outcome> = run.outcomes.iter().filter(|o| o.count.is_none()).collect();
    assert!(
        !errors.is_empty(),
        "{name}: the fault interrupted no request, so it did not hit the traffic"
    );
    let last_error = errors.iter().map(|o| o.at).max().unwrap();
    let recovered_at = run
        .outcomes
        .iter()
        .filter(|o| o.count.is_some() && o.at > last_error)
        .map(|o| o.at)
        .min()
        .unwrap_or_else(|| panic!("{name}: no hit succeeded after the last failure"));
    let promoted = run.promoted_at - run.fault_at;
    let recovered = recovered_at - run.fault_at;
    eprintln!(
        "{name}: sentinels promoted the replica {} ms after the fault; the limiter served again {} ms after it ({} failed hits, the last {} ms after the fault; {} hits in all)",
        promoted.as_millis(),
        recovered.as_millis(),
        errors.len(),
        (last_error - run.fault_at).as_millis(),
        run.outcomes.len(),
    );
    // Generous: the connection asks the sentinels again every 100 ms.
    assert!(
        recovered <= promoted + Duration::from_secs(5),
        "{name}: the limiter served again {recovered:?} after the fault, the sentinels promoted the replica after {promoted:?}"
    );

    let stored = counters(new_master, prefix);
    assert_eq!(stored.len(), KEYS, "{name}: {stored:?}");
    for (k, _, pttl) in &stored {
        assert!(
            *pttl > 0 && *pttl <= WINDOW.as_millis() as i64,
            "{name}: {k} has PTTL {pttl} on the new master"
        );
    }
    let mut figures = Vec::new();
    for k in 0..KEYS {
        let outcomes = || run.outcomes.iter().filter(move |o| o.key == k);
        let counted = outcomes().filter(|o| o.count.is_some()).count() as i64;
        let admitted = outcomes()
            .filter(|o| o.count.is_some_and(|c| c <= LIMIT))
            .count() as i64;
        let before_fault = outcomes()
            .filter(|o| o.count.is_some() && o.at < run.fault_at)
            .count() as i64;
        // Hits that failed once the replica was promoted may have been
        // counted there without an answer (a hit given up by the layer).
        let failed_after_promotion = outcomes()
            .filter(|o| o.count.is_none() && o.at > run.promoted_at)
            .count() as i64;
        let stored_key = format!("{prefix}n{{{}}}", key(k));
        let last = stored
            .iter()
            .find(|(name, ..)| *name == stored_key)
            .unwrap_or_else(|| panic!("{name}: {stored_key} is not on the new master"))
            .1;
        let lost = counted - last;
        let extra = admitted - LIMIT as i64;
        eprintln!(
            "{name}: {}: {counted} hits counted ({before_fault} before the fault), {last} on the new master: {lost} lost; {admitted} admitted, {extra} over the limit of {LIMIT}",
            key(k)
        );
        assert!(
            last > LIMIT as i64,
            "{name}: {}: the run reached the limit",
            key(k)
        );
        // The old master counted at most what it acknowledged before the
        // fault and the hits then in flight: no more can be lost.
        assert!(
            lost <= before_fault + TASKS as i64,
            "{name}: {}: {lost} lost of {before_fault} counted before the fault",
            key(k)
        );
        // Every lost hit is one admission over the limit (see the module
        // docs); a hit counted on the new master without an answer can only
        // take an admission away or leave it.
        if exact {
            assert_eq!(extra, lost, "{name}: {}: admissions over the limit", key(k));
        } else {
            assert!(
                extra <= lost + failed_after_promotion,
                "{name}: {}: {extra} admissions over the limit, {lost} hits lost, {failed_after_promotion} failed after the promotion",
                key(k)
            );
        }
        assert!(extra < LIMIT as i64, "{name}: {}", key(k));
        figures.push(KeyFigures { lost, extra });
    }
    eprintln!(
        "{name}: in all {} hits lost and {} admissions over the limit, over {KEYS} keys",
        figures.iter().map(|f| f.lost).sum::<i64>(),
        figures.iter().map(|f| f.extra).sum::<i64>(),
    );
    figures
}

/// Two app instances, each its own connection through the sentinels, with
/// no deny cache: hits through the backend, taking the instances in turn.
async fn two_instances(group: &SentinelGroup, prefix: &str) -> (Hitter, Vec<SentinelConnection>) {
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(
            RedisBackend::builder(connect(group).await)
                .prefix(prefix)
                .deny_cache(0)
                .build(),
        );
    }
    let connections = instances.iter().map(|b| b.connection().clone()).collect();
    let next = AtomicU64::new(0);
    let hit: Hitter = Arc::new(move |k| {
        let store = instances[next.fetch_add(1, Ordering::Relaxed) as usize % 2].clone();
        Box::pin(async move {
            store
                .hit("n", &Key::new(key(k)), quota())
                .await
                .ok()
                .map(|hit| hit.count)
        })
    });
    (hit, connections)
}

/// `kill -9` of the master while 8 tasks over two app instances (each its
/// own connection through the sentinels) hit 4 keys through the backend.
fn a_killed_master_is_replaced_in_the_middle_of_traffic() {
    let mut group = redis_or_skip!(SentinelGroup::start(
        "a_killed_master_is_replaced_in_the_middle_of_traffic"
    ));
    let new = group.servers[1].port();
    multi_thread_runtime().block_on(async {
        let (hit, connections) = two_instances(&group, "kill:").await;
        let run = traffic_through_a_failover(&mut group, |g| g.servers[0].stop(), hit).await;
        for connection in &connections {
            assert_eq!(connection.master().map(|a| port_of(&a)), Some(new));
        }
        check_run("kill -9", &run, group.server(new), "kill:", true);

        // The audit runs on the new master, through the sentinels.
        let store = RedisBackend::builder(connections[0].clone())
            .prefix("kill:")
            .build();
        let report = store.audit(None).await.unwrap();
        assert_eq!(report.nodes, 1);
        assert_eq!(report.scanned, KEYS as u64);
        assert!(report.without_lifetime.is_empty(), "{report:?}");
    });
}

/// The replica falls behind (the master drops its link, and the replica
/// cannot reconnect: it sends a password the master does not take), the master counts on alone for 30 ms, then is
/// killed: the hits it counted meanwhile are lost, and each one is one
/// admission over the limit on the promoted replica.
fn a_failover_to_a_replica_behind_admits_one_more_per_lost_hit() {
    let mut group = redis_or_skip!(SentinelGroup::start(
        "a_failover_to_a_replica_behind_admits_one_more_per_lost_hit"
    ));
    let new = group.servers[1].port();
    multi_thread_runtime().block_on(async {
        let (hit, _connections) = two_instances(&group, "behind:").await;
        let mut cut = None;
        let run = traffic_through_a_failover(
            &mut group,
            |g| {
                let mut master = g.servers[0].sync();
                // The master takes no password: the replica's AUTH fails
                // on every attempt to reconnect.
                g.servers[1]
                    .cmd(&["CONFIG", "SET", "masterauth", "not-the-password"])
                    .unwrap();
                let before = Instant::now();
                let _: i64 = redis::cmd("CLIENT")
                    .arg(&["KILL", "TYPE", "replica"][..])
                    .query(&mut master)
                    .unwrap();
                cut = Some((before, Instant::now()));
                std::thread::sleep(Duration::from_millis(30));
                g.servers[0].stop();
            },
            hit,
        )
        .await;
        let (cut_before, cut_after) = cut.unwrap();
        let figures = check_run("replica behind", &run, group.server(new), "behind:", true);
        for (k, f) in figures.iter().enumerate() {
            let counted_after = |since: Instant| {
                run.outcomes
                    .iter()
                    .filter(|o| o.key == k && o.count.is_some() && o.at > since)
                    .filter(|o| o.at < run.fault_at)
                    .count() as i64
            };
            let (surely, perhaps) = (counted_after(cut_after), counted_after(cut_before));
            eprintln!(
                "replica behind: {}: {surely} to {perhaps} hits counted on the old master after the cut, {} lost",
                key(k),
                f.lost
            );
            assert!(surely > 0, "{}: no traffic after the cut", key(k));
            // What the old master counted after the cut never reached the
            // replica; hits counted just before it may not have either, and
            // a hit answered just after it may have run just before it (at
            // most those in flight either way: coalesced hits are answered
            // together, after the call that counted them).
            assert!(
                ((surely - TASKS as i64).max(1)..=perhaps + TASKS as i64).contains(&f.lost),
                "{}: {} lost, {surely} to {perhaps} counted after the cut",
                key(k),
                f.lost
            );
        }
    });
}

/// `SIGSTOP` of the master, which then neither answers nor closes its
/// connections, while 8 tasks hit 4 keys through the layer (timeout 100 ms,
/// fail closed): requests are answered 503 until the connection, seeing hits
/// go unanswered, asks the sentinels and moves to the promoted replica.
fn a_frozen_master_is_left_for_the_promoted_replica() {
    let mut group = redis_or_skip!(SentinelGroup::start(
        "a_frozen_master_is_left_for_the_promoted_replica"
    ));
    let new = group.servers[1].port();
    multi_thread_runtime().block_on(async {
        let connection = connect(&group).await;
        let store = RedisBackend::builder(connection.clone())
            .prefix("frozen:")
            .deny_cache(0)
            .build();
        let svc = RateLimitLayer::new("n", quota())
            .key(by_client())
            .backend(store)
            .decision_in(DecisionIn::Response)
            .on_failure(FailurePolicy::FailClosed)
            .layer(ok_service());
        let hit: Hitter = Arc::new(move |k| {
            let svc = svc.clone();
            Box::pin(async move {
                let res = svc.oneshot(from(&key(k))).await.unwrap();
                match res.status() {
                    StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
                        Some(res.extensions().get::<Decision>().unwrap().count())
                    }
                    StatusCode::SERVICE_UNAVAILABLE => None,
                    other => panic!("{other}"),
                }
            })
        });
        let run =
            traffic_through_a_failover(&mut group, |g| g.servers[0].signal("STOP"), hit).await;
        assert_eq!(connection.master().map(|a| port_of(&a)), Some(new));
        // Hits given up by the layer may have reached Redis (and are then
        // counted without an answer): the count is not exact here.
        check_run("SIGSTOP", &run, group.server(new), "frozen:", false);
    });
}

/// A master demoted behind the connection's back (no failover, no
/// `CLIENT KILL`: the operator swaps the roles and points the sentinels at
/// the new master) answers `READONLY`; the hit is sent again to the new
/// master and counted once.
fn a_demoted_master_answers_readonly_and_the_hit_goes_to_the_new_master() {
    let group = redis_or_skip!(SentinelGroup::start(
        "a_demoted_master_answers_readonly_and_the_hit_goes_to_the_new_master"
    ));
    let (old, new) = (group.servers[0].port(), group.servers[1].port());
    multi_thread_runtime().block_on(async {
        let connection = connect(&group).await;
        let store = RedisBackend::builder(connection.clone())
            .deny_cache(0)
            .build();
        let k = Key::new("k");
        let q = quota();
        let first = store.hit("n", &k, q).await.unwrap();
        assert_eq!(first.count, 1);
        assert_eq!(connection.master().map(|a| port_of(&a)), Some(old));

        let new_port = new.to_string();
        group.server(new).cmd(&["REPLICAOF", "NO", "ONE"]).unwrap();
        group
            .server(old)
            .cmd(&["REPLICAOF", "127.0.0.1", &new_port])
            .unwrap();
        for sentinel in &group.sentinels {
            sentinel
                .cmd(&["SENTINEL", "REMOVE", SENTINEL_MASTER])
                .unwrap();
            sentinel
                .cmd(&[
                    "SENTINEL",
                    "MONITOR",
                    SENTINEL_MASTER,
                    "127.0.0.1",
                    &new_port,
                    "2",
                ])
                .unwrap();
        }
        wait(
            &group,
            "the old master to follow the new one",
            Duration::from_secs(20),
            || {
                group
                    .server(old)
                    .cmd(&["INFO", "replication"])
                    .is_ok_and(|info| info.contains("master_link_status:up"))
            },
        )
        .await;
        // The connection to the old master is still open: it now answers
        // READONLY, and the connection moves.
        let hit = store.hit("n", &k, q).await.unwrap();
        assert_eq!(hit.count, 2, "counted once, on the new master");
        assert_eq!(connection.master().map(|a| port_of(&a)), Some(new));
        // The window's deadline was replicated as it was: a hit counted on
        // the old master is refunded on the new one.
        assert_eq!(hit.deadline, first.deadline);
        assert!(store.refund("n", &k, &first).await.unwrap());
        let mut con = group.server(new).sync();
        let count: i64 = redis::cmd("GET").arg("tpw:n{k}").query(&mut con).unwrap();
        assert_eq!(count, 1);
    });
}

/// A connection built lazily through the sentinels (the first one listed is
/// down) serves hits, the deny cache and the audit.
fn the_backend_works_through_the_sentinels() {
    let mut group = redis_or_skip!(SentinelGroup::start(
        "the_backend_works_through_the_sentinels"
    ));
    group.sentinels[0].stop();
    multi_thread_runtime().block_on(async {
        let connection = SentinelConnection::builder(group.sentinel_urls(), SENTINEL_MASTER)
            .build()
            .unwrap();
        // Returned before any lookup: the first hit waits for it.
        let store = RedisBackend::builder(connection.clone())
            .prefix("first:")
            .build();
        let hit = store.hit("n", &Key::new("k"), quota()).await.unwrap();
        assert_eq!(hit.count, 1);
        assert_eq!(
            connection.master().map(|a| port_of(&a)),
            Some(group.servers[0].port())
        );

        // The contract's scenarios run in `contract::*`; what only
        // this connection does: it is built lazily, past a sentinel that
        // is down.
        cases::deny_cache_hits_are_never_refunded(connection.clone(), "cache:").await;

        // The audit scans the master and finds a counter left without a
        // lifetime by other code.
        let mut con = group.servers[0].sync();
        let _: () = redis::cmd("SET")
            .arg("audit:n{k}")
            .arg(3)
            .query(&mut con)
            .unwrap();
        let store = RedisBackend::builder(connection.clone())
            .prefix("audit:")
            .build();
        let report = store
            .audit(Some(Window::new(Duration::from_secs(60)).unwrap()))
            .await
            .unwrap();
        assert_eq!(report.without_lifetime, ["audit:n{k}"]);
        assert_eq!(report.repaired, ["audit:n{k}"]);
        let pttl: i64 = redis::cmd("PTTL")
            .arg("audit:n{k}")
            .query(&mut con)
            .unwrap();
        assert!((1..=60_000).contains(&pttl), "{pttl}");
    });
}

/// No sentinel answers: connecting is an error, not a hang.
async fn connecting_without_a_sentinel_is_an_error() {
    // Ports nothing listens on.
    let dead: Vec<String> = (0..2)
        .map(|_| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("redis://{}/", listener.local_addr().unwrap())
        })
        .collect();
    let err = SentinelConnection::connect(dead, SENTINEL_MASTER)
        .await
        .unwrap_err();
    assert!(err.is_connection_refusal(), "{err}");
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
/// A spend whose future is dropped (the layer's timeout) while the master
/// is frozen (shorter than the sentinels' `down-after`) runs when it wakes:
/// what it spent is given back.
fn a_spend_dropped_in_flight_keeps_no_cost() {
    let group = redis_or_skip!(SentinelGroup::start(
        "a_spend_dropped_in_flight_keeps_no_cost"
    ));
    multi_thread_runtime().block_on(async {
        let store = RedisBackend::builder(connect(&group).await)
            .deny_cache(0)
            .build();
        let key = Key::new("lost");
        let spend = |cost| {
            store.spend_all(
                &key,
                &[tower_pinned_window::backend::Counter {
                    namespace: "x",
                    quota: quota(),
                    lowers: false,
                }],
                tower_pinned_window::backend::Spend::cost(cost),
            )
        };
        assert_eq!(spend(1).await.unwrap()[0].count, 1);
        let master = group.server(group.master_port().expect("a master"));
        let stored = String::from_utf8(store.storage_key("x", &key)).unwrap();

        master.signal("STOP");
        let timed_out = tokio::time::timeout(Duration::from_millis(100), spend(3)).await;
        assert!(timed_out.is_err(), "answered by a frozen master");
        master.signal("CONT");
        let mut count = String::new();
        for _ in 0..100 {
            count = master.cmd(&["GET", &stored]).unwrap().trim().to_owned();
            if count == "1" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(count, "1", "the dropped spend's 3 stay counted");
    });
}

fn main() {
    let mut trials = vec![
        trial::trial(
            "a_killed_master_is_replaced_in_the_middle_of_traffic",
            Needs::Redis,
            a_killed_master_is_replaced_in_the_middle_of_traffic,
        ),
        trial::trial(
            "a_failover_to_a_replica_behind_admits_one_more_per_lost_hit",
            Needs::Redis,
            a_failover_to_a_replica_behind_admits_one_more_per_lost_hit,
        ),
        trial::trial(
            "a_frozen_master_is_left_for_the_promoted_replica",
            Needs::Redis,
            a_frozen_master_is_left_for_the_promoted_replica,
        ),
        trial::trial(
            "a_demoted_master_answers_readonly_and_the_hit_goes_to_the_new_master",
            Needs::Redis,
            a_demoted_master_answers_readonly_and_the_hit_goes_to_the_new_master,
        ),
        trial::trial(
            "a_spend_dropped_in_flight_keeps_no_cost",
            Needs::Redis,
            a_spend_dropped_in_flight_keeps_no_cost,
        ),
        trial::trial(
            "the_backend_works_through_the_sentinels",
            Needs::Redis,
            the_backend_works_through_the_sentinels,
        ),
        trial::current(
            "connecting_without_a_sentinel_is_an_error",
            Needs::Nothing,
            connecting_without_a_sentinel_is_an_error,
        ),
    ];
    // The backend contract, on one shared group, each scenario under its
    // own prefix, each backend on its own connection through the sentinels.
    let group = Shared::new(|| SentinelGroup::start("contract"));
    for (name, deny_cache) in [("contract", 0), ("contract_deny_cache", 1024)] {
        let group = group.clone();
        let store = RedisStore::new(deny_cache, move || {
            let group = group.clone();
            async move { connect(group.get()).await }
        });
        let store = Arc::new(store);
        trials.extend(trial::contract(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_leases(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_heeds(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_limits(name, Needs::Redis, store));
    }
    trial::run(trials, group)
}
