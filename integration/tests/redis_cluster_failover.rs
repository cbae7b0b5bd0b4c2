//! A Cluster master's failure in the middle of traffic, on a real Cluster
//! of three masters with one replica each that each test starts: killed
//! (`kill -9`), frozen (`SIGSTOP`) through its failover, and frozen while
//! another shard is failed over by hand, so that every instance reads its
//! slot map while a node is silent.
//!
//! Each hit is bounded by the layer's default timeout (100 ms): a hit on a
//! healthy master's key that fails or takes longer would be a 503 behind a
//! default layer. The tests run one at a time (each drives eight instances
//! hard on two cores; a neighbour's load would be measured too).
//!
//! `TPW_FULL_COVERAGE=1` runs the Clusters with Redis's default
//! `cluster-require-full-coverage yes` (every master then refuses every key
//! until the replica is promoted, and the tests fail); `TPW_DEBUG=1` prints
//! each failure.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::http::multi_thread_runtime;
use support::redis::{RedisCluster, plain_storage_key};
use tower_pinned_window::backend::{Backend, BackendError};
use tower_pinned_window::key::Key;
use tower_pinned_window::{DEFAULT_TIMEOUT, Quota};
use tower_pinned_window_redis::RedisBackend;
use trial::Needs;

/// How long a master is unreachable before its replica takes over.
const NODE_TIMEOUT_MS: u32 = 2000;

/// Instances of a service, each with a Cluster connection of its own (its
/// own map of nodes, read in its own order).
const INSTANCES: usize = 8;

/// What happens to the victim master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `kill -9`.
    Kill,
    /// `SIGSTOP` until 2 s after its replica's promotion, then `SIGCONT`.
    Freeze,
    /// As `Freeze`, while another shard is failed over by hand three times
    /// (`CLUSTER FAILOVER`): each makes every instance read its slot map.
    FreezeThroughRefreshes,
}

/// One hit: when it was sent (since the start), whether its key is on the
/// victim, whether it was answered within [`DEFAULT_TIMEOUT`], how long it
/// took, the first master of its key's shard.
type Entry = (Duration, bool, bool, Duration, u16);

fn failover(test: &str, fault: Fault) {
    let mut cluster = redis_or_skip!(RedisCluster::start_with_replicas(test, NODE_TIMEOUT_MS));
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "three masters: {masters:?}");
    // Every replica in sync, so that one can take over.
    cluster.wait_in_sync();
    let (victim, victim_slots) = masters[0].clone();
    let by_hand = masters[1].0;
    let namespace = "failover";
    // Each key, and whether it is on the victim; the first master of its
    // shard, for TPW_DEBUG.
    let (keys, shards): (Vec<(Key, bool)>, Vec<u16>) = (0..240)
        .map(|i| {
            let key = Key::display(format_args!("client-{i}"));
            let stored = plain_storage_key("tpw:", namespace, key.as_bytes());
            let slot = cluster.keyslot(&stored);
            let on_victim = victim_slots.iter().any(|&(a, b)| (a..=b).contains(&slot));
            let shard = masters
                .iter()
                .find(|(_, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
                .map_or(0, |(port, _)| *port);
            ((key, on_victim), shard)
        })
        .unzip();
    let healthy_keys = keys.iter().filter(|(_, v)| !v).count();
    assert!(
        healthy_keys > 0 && healthy_keys < keys.len(),
        "keys on every master"
    );

    let runtime = multi_thread_runtime();
    let stores: Vec<_> = (0..INSTANCES)
        .map(|_| {
            runtime.block_on(async {
                RedisBackend::builder(cluster.advised_connection().await)
                    .deny_cache(0)
                    .build()
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let open_answers = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..INSTANCES)
        .map(|w| {
            let (store, keys, stop) = (stores[w].clone(), keys.clone(), stop.clone());
            let shards = shards.clone();
            let open_answers = open_answers.clone();
            runtime.spawn(async move {
                let mut log: Vec<Entry> = Vec::new();
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let (key, on_victim) = &keys[i % keys.len()];
                    let shard = shards[i % keys.len()];
                    i += INSTANCES;
                    let sent = started.elapsed();
                    let hit = tokio::time::timeout(
                        DEFAULT_TIMEOUT,
                        store.hit(namespace, key, quota()),
                    )
                    .await;
                    let ok = matches!(hit, Ok(Ok(_)));
                    if matches!(hit, Ok(Err(BackendError::CircuitOpen))) {
                        open_answers.fetch_add(1, Ordering::Relaxed);
                    }
                    if !ok && std::env::var("TPW_DEBUG").is_ok() {
                        eprintln!(
                            "failure (victim: {on_victim}, shard of {shard}, instance {w}) at {:?}: {:?}",
                            started.elapsed(),
                            hit.map(|r| r.map(|_| ()))
                        );
                    }
                    log.push((sent, *on_victim, ok, started.elapsed() - sent, shard));
                    if !ok {
                        // An outage answers at once: don't spin on it.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                log
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let slots_asked = cluster.node_mut(victim).calls(&["cluster|slots"]);
    let fault_at = started.elapsed();
    match fault {
        Fault::Kill => cluster.node_mut(victim).stop(),
        Fault::Freeze | Fault::FreezeThroughRefreshes => cluster.node_mut(victim).signal("STOP"),
    }
    eprintln!("{fault:?} at {fault_at:?}");
    // When each failover by hand was asked for and done: Redis pauses
    // writes on that shard's master meanwhile.
    let mut by_hand_failovers: Vec<(Duration, Duration)> = Vec::new();
    if fault == Fault::FreezeThroughRefreshes {
        std::thread::sleep(Duration::from_millis(300));
        by_hand_failovers.push(fail_over_by_hand(&cluster, by_hand, started));
    }
    // Until the victim's slots have a new master.
    let promoted = loop {
        let now = cluster.masters();
        if now.len() == 3 && now.iter().all(|(port, _)| *port != victim) {
            eprintln!("promotion seen at {:?}", started.elapsed());
            break started.elapsed();
        }
        assert!(
            started.elapsed() < fault_at + Duration::from_secs(60),
            "no replica took over within 60 s: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    if fault == Fault::FreezeThroughRefreshes {
        by_hand_failovers.push(fail_over_by_hand(&cluster, by_hand, started));
    }
    let promoted_wait = promoted + Duration::from_secs(2);
    std::thread::sleep(promoted_wait.saturating_sub(started.elapsed()));
    let mut slots_asked_while_silent = None;
    if fault != Fault::Kill {
        cluster.node_mut(victim).signal("CONT");
        eprintln!("woken at {:?}", started.elapsed());
        std::thread::sleep(Duration::from_secs(1));
        slots_asked_while_silent =
            Some(cluster.node_mut(victim).calls(&["cluster|slots"]) - slots_asked);
    }
    stop.store(true, Ordering::Relaxed);
    let log: Vec<Entry> = runtime
        .block_on(futures_util::future::join_all(workers))
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();

    let after_fault = |&&(sent, ..): &&Entry| sent >= fault_at;
    // A hit on the shard failed over by hand, sent while Redis paused its
    // writes for that failover (or in the 100 ms after it).
    let paused = |e: &&Entry| {
        e.4 == by_hand
            && by_hand_failovers.iter().any(|&(asked, done)| {
                e.0 + DEFAULT_TIMEOUT >= asked && e.0 <= done + DEFAULT_TIMEOUT
            })
    };
    let by_hand_paused_failed = log.iter().filter(paused).filter(|e| !e.2).count();
    let healthy: Vec<_> = log
        .iter()
        .filter(after_fault)
        .filter(|e| !e.1 && !paused(e))
        .collect();
    let healthy_failed = healthy.iter().filter(|e| !e.2).count();
    let slowest = healthy.iter().map(|e| e.3).max().unwrap_or_default();
    let victim_failed_after_promotion =
        log.iter().filter(|e| e.1 && !e.2 && e.0 > promoted).count();
    let last_victim_failure = log
        .iter()
        .filter(|e| e.1 && !e.2)
        .map(|e| e.0)
        .max()
        .unwrap_or(fault_at);
    eprintln!(
        "{fault:?}: promoted {:.2} s after the fault; {} hits on healthy masters after it, {healthy_failed} failed or took over {DEFAULT_TIMEOUT:?}, the slowest {:.3} s; on the victim's keys {victim_failed_after_promotion} failed after the promotion, the last sent {:+.3} s from it; answered at once by an open breaker: {}; failovers by hand (asked, done): {by_hand_failovers:?}, {by_hand_paused_failed} hits failed on that shard while Redis paused its writes; CLUSTER SLOTS queued on the silent node: {slots_asked_while_silent:?}",
        (promoted - fault_at).as_secs_f64(),
        healthy.len(),
        slowest.as_secs_f64(),
        last_victim_failure.as_secs_f64() - promoted.as_secs_f64(),
        open_answers.load(Ordering::Relaxed),
    );
    assert!(!healthy.is_empty(), "traffic on healthy masters went on");
    assert!(
        open_answers.load(Ordering::Relaxed) > 0,
        "the failed master's breaker opened: its keys were answered at once"
    );
    assert_eq!(
        healthy_failed, 0,
        "hits on keys of healthy masters failed or took over {DEFAULT_TIMEOUT:?} ({fault:?})"
    );
    assert!(
        log.iter()
            .any(|&(sent, on_victim, ok, ..)| on_victim && ok && sent > promoted),
        "the victim's keys are served again after the promotion"
    );
    assert!(
        last_victim_failure <= promoted + Duration::from_secs(1),
        "the victim's keys were served again within 1 s of the promotion ({fault:?}: the last failure was sent {:.3} s after it)",
        last_victim_failure.as_secs_f64() - promoted.as_secs_f64()
    );
}

fn quota() -> Quota {
    Quota::new(u64::MAX / 2, Duration::from_secs(600)).unwrap()
}

/// Fail over by hand the shard first served by the master on `port`: its
/// current replica takes over (`CLUSTER FAILOVER`), within 10 s. Gives
/// when it was asked and when the replica answered `ROLE` as a master,
/// since `started`.
fn fail_over_by_hand(cluster: &RedisCluster, port: u16, started: Instant) -> (Duration, Duration) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (replica, node) = loop {
        // The shard's replica, once it has its master's data.
        if let Some(replica) = shard_replica(cluster, port) {
            let node = cluster.nodes.iter().find(|n| n.port() == replica).unwrap();
            if node
                .cmd(&["INFO", "replication"])
                .unwrap_or_default()
                .contains("master_link_status:up")
            {
                break (replica, node);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no replica in sync in the shard of {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let asked = Instant::now();
    let asked_at = started.elapsed();
    let answer = node.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
    assert_eq!(answer.trim(), "OK", "CLUSTER FAILOVER on {replica}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node
        .cmd(&["ROLE"])
        .unwrap_or_default()
        .starts_with("master")
    {
        assert!(
            Instant::now() < deadline,
            "{replica} did not take over by hand"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = asked.elapsed();
    eprintln!(
        "failed over by hand: {replica} is a master, {:.3} s after it was asked",
        took.as_secs_f64()
    );
    (asked_at, asked_at + took)
}

/// The replica now in the shard of the node on `port` (its master or its
/// replica), from `CLUSTER NODES` as a node that is not frozen sees it
/// (`None` while that node has not seen the last failover).
fn shard_replica(cluster: &RedisCluster, port: u16) -> Option<u16> {
    let nodes = cluster
        .nodes
        .iter()
        .find(|n| !n.is_frozen())
        .unwrap()
        .cmd(&["CLUSTER", "NODES"])
        .unwrap();
    // Each line: id ip:port@bus flags master-id ...
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let port_of = |f: &[&str]| -> u16 {
        f[1].split('@')
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let this = lines.iter().find(|f| port_of(f) == port)?;
    if this[2].contains("slave") {
        return Some(port);
    }
    let replica = lines
        .iter()
        .find(|f| f[3] == this[0] && f[2].contains("slave") && !f[2].contains("fail"))?;
    Some(port_of(replica))
}

/// The tests, one at a time (see the module's documentation).
fn main() {
    let trials = vec![
        trial::trial(
            "a_killed_master_stalls_no_healthy_master",
            Needs::Redis,
            || failover("a_killed_master_stalls_no_healthy_master", Fault::Kill),
        ),
        trial::trial(
            "a_frozen_master_stalls_no_healthy_master_and_its_keys_follow_the_promotion",
            Needs::Redis,
            || failover("frozen_master", Fault::Freeze),
        ),
        trial::trial(
            "a_slot_map_read_during_a_freeze_stalls_no_healthy_master",
            Needs::Redis,
            || failover("freeze_through_refreshes", Fault::FreezeThroughRefreshes),
        ),
    ];
    trial::run_one_at_a_time(trials, ())
}
