//! The replica-acknowledged mode (`RedisBackendBuilder::wait_for_replicas`)
//! against real servers that the harness starts: a healthy Cluster with
//! replicas counts exactly; a master frozen through its failover and woken
//! deposed admits nothing it answers; a replica lost behind a Sentinel
//! master fails the writes as not acknowledged, and the counts stay; the
//! backend contract (`contract_wait::*`) through the sentinels in the mode;
//! and bad builder input is refused.

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncConnectionConfig;
use stores::redis::RedisStore;
use support::http::multi_thread_runtime;
use support::redis::{RedisCluster, SENTINEL_MASTER, SentinelGroup, Shared, plain_storage_key};
use tower_pinned_window::backend::{Amend, Backend, BackendError, Counter, Spend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window::{ConfigError, Quota};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::SentinelConnection;
use trial::Needs;

/// How long a write may wait for its replica in these tests: far above a
/// replication round trip on loopback, so a healthy replica always makes
/// it.
const WAIT: Duration = Duration::from_millis(500);

fn quota(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(600)).unwrap()
}

/// `WAIT` commands the servers ran.
fn waits<'a>(servers: impl IntoIterator<Item = &'a support::redis::RedisServer>) -> u64 {
    servers.into_iter().map(|s| s.calls(&["wait"])).sum()
}

/// With the mode on, a Cluster of three masters with a replica each:
/// concurrent hits from four instances on keys of every master admit
/// exactly the limit, each hit counted once; concurrent spends admit costs
/// that add up to the stored count; refunds and resets go through; every
/// one of those writes went with a `WAIT`, and each pipeline of a call and
/// its `WAIT` went straight to the master of its slot (no `MOVED`).
fn a_healthy_cluster_with_replicas_counts_exactly() {
    let cluster = redis_or_skip!(RedisCluster::start_with_replicas(
        "a_healthy_cluster_with_replicas_counts_exactly",
        5000
    ));
    cluster.wait_in_sync();
    multi_thread_runtime().block_on(async {
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(
                RedisBackend::builder(cluster.advised_connection().await)
                    .deny_cache(0)
                    .wait_for_replicas(1, WAIT)
                    .build(),
            );
        }
        let (keys, per_key, limit) = (24, 30, 20);
        let tasks: Vec<_> = (0..keys * per_key)
            .map(|i| {
                let store = stores[i % 4].clone();
                tokio::spawn(async move {
                    let key = format!("k{}", i % keys);
                    let hit = store.hit("wait", &Key::new(key.clone()), quota(limit)).await;
                    (key, hit)
                })
            })
            .collect();
        let mut admitted: BTreeMap<String, u64> = BTreeMap::new();
        for task in tasks {
            let (key, hit) = task.await.unwrap();
            let hit = hit.unwrap_or_else(|e| panic!("{key}: {e}"));
            *admitted.entry(key).or_default() += u64::from(hit.count <= limit);
        }
        assert_eq!(admitted.len(), keys);
        for (key, admitted) in &admitted {
            assert_eq!(*admitted, limit, "{key}: exactly the limit admitted");
            let stored = stores[0].peek("wait", &Key::new(key.clone())).await.unwrap();
            assert_eq!(
                stored.map(|h| h.count),
                Some(per_key as u64),
                "{key}: every hit counted once"
            );
        }
        // Spends of varied costs on one key: the admitted costs are the
        // stored count.
        let spends: Vec<_> = (0..200u64)
            .map(|i| {
                let store = stores[i as usize % 4].clone();
                tokio::spawn(async move {
                    let cost = 1 + i % 5;
                    let counters = [Counter {
                        namespace: "spend",
                        quota: quota(300),
                        lowers: false,
                    }];
                    let hits = store
                        .spend_all(&Key::new("hot"), &counters, Spend::cost(cost))
                        .await
                        .unwrap();
                    if hits[0].deadline.is_some() { cost } else { 0 }
                })
            })
            .collect();
        let mut spent = 0;
        for task in spends {
            spent += task.await.unwrap();
        }
        let stored = stores[1].peek("spend", &Key::new("hot")).await.unwrap();
        assert!(spent <= 300, "spent {spent}");
        assert_eq!(Some(spent), stored.map(|h| h.count));
        // A refund and a reset, acknowledged too.
        let key = Key::new("amended");
        let hit = stores[2].hit("amend", &key, quota(10)).await.unwrap();
        stores[2].hit("amend", &key, quota(10)).await.unwrap();
        assert!(
            stores[3]
                .amend("amend", &key, &hit, Amend::Refund(1))
                .await
                .unwrap()
        );
        let stored = stores[0].peek("amend", &key).await.unwrap().unwrap();
        assert_eq!(stored.count, 1, "refunded");
        assert!(stores[1].reset("amend", &key).await.unwrap());
        // Each pipeline went to the master of its slot at once: no node
        // redirected one (`MOVED` counted in `INFO errorstats`).
        for node in &cluster.nodes {
            let errors = node.cmd(&["INFO", "errorstats"]).unwrap();
            assert!(
                !errors.contains("errorstat_MOVED"),
                "{} redirected a call:\n{errors}",
                node.port()
            );
        }
        let waited = waits(&cluster.nodes);
        eprintln!(
            "wait mode on a Cluster with replicas: {} hits, 200 spends, a refund and a reset: {waited} WAIT on the masters",
            keys * per_key
        );
        assert!(
            waited >= (keys + 2 + 2) as u64,
            "the writes went with WAIT ({waited})"
        );
    });
}

/// What one run of [`deposed`] saw.
#[derive(Debug, Default)]
struct Deposed {
    /// Hits admitted before the freeze, and by the woken master.
    admitted_before: u64,
    admitted_deposed: u64,
    /// The woken master's answers that failed, by message.
    failed: BTreeMap<String, u64>,
    /// Hits sent to the frozen master.
    sent: u64,
    /// Scripts the woken master ran (its `EVALSHA` calls after the freeze:
    /// those it refused with `MOVED` are not calls).
    ran: u64,
    /// The counts on the new master, after the old one resynced.
    stored: u64,
    /// Keys whose stored count differs from their admissions.
    off: Vec<String>,
}

/// Hits on keys of one master A, through a backend connected to A alone
/// (so that they surely reach A): 3 per key before A is frozen
/// (`SIGSTOP`); once its replica has been promoted, 2 per key more, which
/// wait on A's socket; then A is woken (`SIGCONT`) and answers them before
/// or after it learns it was deposed. Once A is a replica in sync with the
/// new master, the new master's counts are read. With `min_replicas`,
/// every node has `min-replicas-to-write 1` and `min-replicas-max-lag 1`
/// for the run.
async fn deposed(cluster: &RedisCluster, run: &str, wait: bool, min_replicas: bool) -> Deposed {
    let (before, during, limit) = (3, 2, 10);
    let (to_write, max_lag) = if min_replicas {
        ("1", "1")
    } else {
        ("0", "10")
    };
    for node in &cluster.nodes {
        node.cmd(&[
            "CONFIG",
            "SET",
            "min-replicas-to-write",
            to_write,
            "min-replicas-max-lag",
            max_lag,
        ])
        .unwrap();
    }
    cluster.wait_in_sync();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    let (a, ref slots) = masters[0];
    let witness = masters[1].0;
    let node = cluster.nodes.iter().find(|n| n.port() == a).unwrap();
    let namespace = format!("deposed-{run}");
    let keys: Vec<Key> = (0..)
        .map(|i| Key::display(format_args!("client-{i}")))
        .filter(|key| {
            let stored = plain_storage_key("tpw:", &namespace, key.as_bytes());
            let slot: u16 = node
                .cmd(&["CLUSTER", "KEYSLOT", &String::from_utf8(stored).unwrap()])
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
        })
        .take(16)
        .collect();
    let connection = node
        .client()
        .get_multiplexed_async_connection_with_config(
            &AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    let builder = RedisBackend::builder(connection)
        .deny_cache(0)
        // One call per hit: each waits on A's socket on its own.
        .coalesce(false);
    let store = if wait {
        builder.wait_for_replicas(1, Duration::from_millis(200))
    } else {
        builder
    }
    .build();
    let mut seen = Deposed::default();
    for key in &keys {
        for _ in 0..before {
            let hit = store.hit(&namespace, key, quota(limit)).await.unwrap();
            assert!(hit.count <= limit);
            seen.admitted_before += 1;
        }
    }
    // Every hit so far on A's replica, so that the failover loses none.
    cluster.wait_in_sync();
    let ran_before = node.calls(&["evalsha", "eval"]);

    node.signal("STOP");
    let frozen = Instant::now();
    loop {
        let now = cluster.masters_seen_by(witness);
        if now.len() == 3 && now.iter().all(|(port, _)| *port != a) {
            break;
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(60),
            "no replica took over within 60 s: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{run}: the replica of {a} was promoted {:.2} s after the freeze",
        frozen.elapsed().as_secs_f64()
    );
    let hits: Vec<_> = keys
        .iter()
        .flat_map(|key| std::iter::repeat_n(key.clone(), during))
        .map(|key| {
            let (store, namespace) = (store.clone(), namespace.clone());
            tokio::spawn(async move { store.hit(&namespace, &key, quota(limit)).await })
        })
        .collect();
    seen.sent = hits.len() as u64;
    // Written to A's socket, where they wait.
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.signal("CONT");
    for hit in hits {
        match tokio::time::timeout(Duration::from_secs(10), hit)
            .await
            .expect("the woken master answers")
            .unwrap()
        {
            Ok(hit) if hit.count <= limit => seen.admitted_deposed += 1,
            Ok(hit) => panic!("over the limit: {hit:?}"),
            Err(err) => {
                let what = match &err {
                    BackendError::Unavailable(_) => err.to_string(),
                    other => format!("not an outage: {other:?}"),
                };
                *seen.failed.entry(what).or_default() += 1;
            }
        }
    }
    let woken = Instant::now();
    while !node.is_synced_replica() {
        assert!(
            woken.elapsed() < Duration::from_secs(60),
            "{a} never became a replica in sync:\n{}",
            node.cmd(&["INFO", "replication"]).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen.ran = node.calls(&["evalsha", "eval"]) - ran_before;
    let reader = RedisBackend::new(cluster.advised_connection().await);
    for key in &keys {
        let stored = reader
            .peek(&namespace, key)
            .await
            .unwrap()
            .map_or(0, |h| h.count);
        seen.stored += stored;
        if stored != before as u64 {
            seen.off.push(format!("{key:?}: {stored}"));
        }
    }
    seen
}

/// A master frozen (`SIGSTOP`) until its replica has taken over, then
/// woken with hits waiting on its socket: with the mode on, none of what it
/// answers is admitted (each fails as an outage), and after it has become a
/// replica and resynced, the new master's counts equal the admissions. The
/// same sequence with the mode off is then measured and printed (what the
/// deposed master admits, and the over-admission once its writes are lost),
/// and with `TPW_MIN_REPLICAS=1`, once more with Redis's
/// `min-replicas-to-write 1` (`min-replicas-max-lag 1`) instead of the mode.
fn a_deposed_master_admits_nothing_it_answers() {
    let cluster = redis_or_skip!(RedisCluster::start_with_replicas(
        "a_deposed_master_admits_nothing_it_answers",
        1500
    ));
    multi_thread_runtime().block_on(async {
        let on = deposed(&cluster, "on", true, false).await;
        eprintln!("deposed master, wait mode on: {on:?}");
        let off = deposed(&cluster, "off", false, false).await;
        eprintln!("deposed master, wait mode off: {off:?}");
        if std::env::var("TPW_MIN_REPLICAS").is_ok() {
            // What `min-replicas-to-write` does instead, mode off.
            let min = deposed(&cluster, "min-replicas", false, true).await;
            eprintln!(
                "deposed master, wait mode off, min-replicas-to-write 1, min-replicas-max-lag 1: {} sent, {} ran, {} admitted: {min:?}",
                min.sent, min.ran, min.admitted_deposed
            );
        }
        eprintln!(
            "deposed master: {} hits sent to it while frozen; mode on: {} ran on it after waking, {} admitted, over-admission {}; mode off: {} ran, {} admitted, over-admission {}",
            on.sent,
            on.ran,
            on.admitted_deposed,
            (on.admitted_before + on.admitted_deposed).saturating_sub(on.stored),
            off.ran,
            off.admitted_deposed,
            (off.admitted_before + off.admitted_deposed).saturating_sub(off.stored),
        );
        assert!(
            on.ran >= 1,
            "the woken master ran none of the hits (it learnt first that it was deposed): this run shows nothing of the mode: {on:?}"
        );
        assert_eq!(on.admitted_deposed, 0, "the deposed master admitted: {on:?}");
        assert_eq!(
            on.failed.values().sum::<u64>(),
            on.sent,
            "every hit sent to it failed: {on:?}"
        );
        assert!(
            on.failed
                .keys()
                .all(|what| what.starts_with("rate-limit backend unavailable")),
            "each as an outage: {on:?}"
        );
        assert_eq!(
            on.stored, on.admitted_before,
            "the stored counts equal the admissions: {on:?}"
        );
        assert!(on.off.is_empty(), "per key: {on:?}");
    });
}

/// Through a `SentinelConnection` in the mode: hits are counted and each
/// went with a `WAIT`; with the replica frozen, a hit fails as not
/// acknowledged within the timeout, and its count stays on the master;
/// with the replica back, hits are admitted again.
fn a_lost_replica_fails_writes_through_the_sentinels() {
    let group = redis_or_skip!(SentinelGroup::start(
        "a_lost_replica_fails_writes_through_the_sentinels"
    ));
    multi_thread_runtime().block_on(async {
        let connection = SentinelConnection::connect(group.sentinel_urls(), SENTINEL_MASTER)
            .await
            .unwrap();
        let timeout = Duration::from_millis(100);
        let store = RedisBackend::builder(connection)
            .deny_cache(0)
            .wait_for_replicas(1, timeout)
            .build();
        let key = Key::new("k");
        for n in 1..=5 {
            assert_eq!(store.hit("s", &key, quota(100)).await.unwrap().count, n);
        }
        let (master, replica) = (&group.servers[0], &group.servers[1]);
        assert!(waits([master]) >= 5, "each hit went with a WAIT");
        replica.signal("STOP");
        let sent = Instant::now();
        let err = store.hit("s", &key, quota(100)).await.unwrap_err();
        let took = sent.elapsed();
        replica.signal("CONT");
        eprintln!("sentinel: with the replica frozen, a hit failed after {took:?}: {err}");
        assert!(
            matches!(err, BackendError::Unavailable(_))
                && err
                    .to_string()
                    .contains("not acknowledged by 1 replica(s) within 100 ms (0 did)"),
            "{err}"
        );
        assert!(took >= timeout, "WAIT waited its timeout: {took:?}");
        let stored = store.peek("s", &key).await.unwrap().unwrap();
        assert_eq!(stored.count, 6, "the master's count stays");
        let again = Instant::now();
        loop {
            match store.hit("s", &key, quota(100)).await {
                Ok(hit) => {
                    assert!(hit.count >= 7);
                    break;
                }
                Err(err) => assert!(
                    again.elapsed() < Duration::from_secs(10),
                    "the replica is back, yet: {err}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Zero replicas and a zero timeout are refused, each with its own error
/// and a message that says what to write; the panicking setter panics with
/// that message.
async fn bad_wait_settings_are_refused() {
    let backend = RedisBackend::connect_in_background("redis://127.0.0.1:1/").unwrap();
    let builder = || RedisBackend::builder(backend.connection().clone());
    let zero = builder()
        .try_wait_for_replicas(0, Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(zero, ConfigError::ZeroWaitReplicas);
    assert!(zero.to_string().contains("at least one replica"), "{zero}");
    let forever = builder()
        .try_wait_for_replicas(1, Duration::ZERO)
        .unwrap_err();
    assert_eq!(forever, ConfigError::ZeroWaitTimeout);
    assert!(forever.to_string().contains("waits forever"), "{forever}");
    assert!(
        builder()
            .try_wait_for_replicas(2, Duration::from_nanos(1))
            .is_ok()
    );
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder().wait_for_replicas(1, Duration::ZERO)
    }))
    .unwrap_err();
    let message = panicked
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert_eq!(message, ConfigError::ZeroWaitTimeout.to_string());
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
fn main() {
    let mut trials = vec![
        trial::trial(
            "a_healthy_cluster_with_replicas_counts_exactly",
            Needs::Redis,
            a_healthy_cluster_with_replicas_counts_exactly,
        ),
        trial::trial(
            "a_deposed_master_admits_nothing_it_answers",
            Needs::Redis,
            a_deposed_master_admits_nothing_it_answers,
        ),
        trial::trial(
            "a_lost_replica_fails_writes_through_the_sentinels",
            Needs::Redis,
            a_lost_replica_fails_writes_through_the_sentinels,
        ),
        trial::current(
            "bad_wait_settings_are_refused",
            Needs::Nothing,
            bad_wait_settings_are_refused,
        ),
    ];
    // The backend contract in the mode, through the sentinels of a group
    // whose master has a replica.
    let group = Shared::new(|| SentinelGroup::start("contract_wait"));
    let shared = group.clone();
    let store = RedisStore::new(0, move || {
        let group = shared.clone();
        async move {
            SentinelConnection::connect(group.get().sentinel_urls(), SENTINEL_MASTER)
                .await
                .unwrap()
        }
    })
    .wait_for_replicas(1, WAIT);
    let store = Arc::new(store);
    trials.extend(trial::contract(
        "contract_wait",
        Needs::Redis,
        store.clone(),
    ));
    trials.extend(trial::contract_leases(
        "contract_wait",
        Needs::Redis,
        store.clone(),
    ));
    trials.extend(trial::contract_heeds(
        "contract_wait",
        Needs::Redis,
        store.clone(),
    ));
    trials.extend(trial::contract_limits("contract_wait", Needs::Redis, store));
    trial::run(trials, group)
}
