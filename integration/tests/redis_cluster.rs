//! The Redis backend on a real three-master Redis Cluster that the harness
//! starts: the backend contract (`contract::*`, `contract_deny_cache::*`,
//! on one shared Cluster, each scenario under its own prefix), then what
//! only a Cluster does, one test each: keys over every master, coalescing by
//! slot, the audit of every master, hash tags, the warning under
//! `cluster-require-full-coverage yes` (failovers:
//! `redis_cluster_failover.rs`). A test that
//! counts the Cluster's script calls or scans every master has a Cluster of
//! its own.

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use stores::redis::{RedisStore, slots_key};
use support::http::{burst, from, multi_thread_runtime, ok_count, ok_service};
use support::logs::capture;
use support::redis::{RedisCluster, Shared, cases};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::{Backend, Cap, Held, Leasing, SlotId, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window::{InFlight, Quota, RateLimitLayer, Window};
use tower_pinned_window_redis::RedisBackend;
use tracing_subscriber::filter::LevelFilter;
use trial::Needs;

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

async fn keys_spread_over_every_master_and_windows_stay_pinned(cluster: &RedisCluster) {
    let store = RedisBackend::builder(cluster.connection().await)
        .deny_cache(0)
        .build();
    let svc = RateLimitLayer::new("spread", quota(2, 60))
        .key(http::HeaderName::from_static("x-client"))
        .backend(store.clone())
        .layer(ok_service());
    for i in 0..60 {
        let client = format!("client-{i}");
        let first = svc.clone().oneshot(from(&client)).await.unwrap();
        assert_eq!(
            first.headers()["ratelimit"],
            "\"spread\";r=1;t=60",
            "{client}"
        );
        svc.clone().oneshot(from(&client)).await.unwrap();
        let denied = svc.clone().oneshot(from(&client)).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS, "{client}");
        let retry: u64 = denied.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((59..=60).contains(&retry), "{client}: Retry-After {retry}");
    }
    for node in &cluster.nodes {
        let keys = node.cmd(&["DBSIZE"]).unwrap();
        let keys: u64 = keys.trim().parse().unwrap();
        assert!(
            keys >= 5,
            "master {} holds {keys} of the 60 keys",
            node.port()
        );
    }
    // Every key has its window, which the later hits did not move.
    for i in 0..60 {
        let hit = store
            .peek("spread", &Key::display(format_args!("client-{i}")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(hit.count, 3);
        assert!(hit.reset <= Duration::from_secs(60) && hit.reset > Duration::from_secs(50));
    }
}

/// Script calls (`EVALSHA` and `EVAL`) every master has run.
fn script_calls(cluster: &RedisCluster) -> u64 {
    let mut calls = 0;
    for node in &cluster.nodes {
        let stats = node.cmd(&["INFO", "commandstats"]).unwrap();
        calls += stats
            .lines()
            .filter_map(|line| {
                line.strip_prefix("cmdstat_evalsha:calls=")
                    .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
            })
            .filter_map(|rest| rest.split(',').next())
            .map(|n| n.parse::<u64>().unwrap())
            .sum::<u64>();
    }
    calls
}

async fn exactly_the_limit_is_admitted_across_four_instances(cluster: &RedisCluster) {
    for (key, limit, hits) in [("k1", 1u64, 100usize), ("k2", 37, 300), ("k3", 300, 300)] {
        let before = script_calls(cluster);
        let mut instances = Vec::new();
        for _ in 0..4 {
            let store = RedisBackend::new(cluster.connection().await);
            let layer = RateLimitLayer::new("exact", quota(limit, 60))
                .key(http::HeaderName::from_static("x-client"))
                .backend(store);
            instances.push(layer.layer(ok_service()));
        }
        let allowed = ok_count(&burst(&instances, hits, || from(key)).await);
        assert_eq!(
            allowed,
            limit.min(hits as u64) as usize,
            "{key}: limit {limit}, {hits} hits"
        );
        if limit == hits as u64 {
            // No denial, so no deny cache: every hit reached Redis.
            let calls = script_calls(cluster) - before;
            assert!(
                calls < hits as u64,
                "{key}: coalesced, {calls} calls for {hits} hits"
            );
        }
    }
}

/// Hits on keys of many slots, over 4 instances: on each key, every count
/// once, as if the hits had gone one by one.
async fn hit_many_keys<C>(stores: Vec<RedisBackend<C>>, namespace: &'static str, hits: usize)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut tasks = Vec::new();
    for i in 0..hits {
        let store = stores[i % stores.len()].clone();
        tasks.push(tokio::spawn(async move {
            let key = if i % 2 == 0 {
                "hot".to_string()
            } else {
                format!("k{}", i % 40)
            };
            let hit = tokio::time::timeout(
                Duration::from_secs(10),
                store.hit(namespace, &Key::new(key.clone()), quota(u64::MAX, 60)),
            )
            .await
            .expect("answered")
            .unwrap_or_else(|e| panic!("{key}: {e}"));
            (key, hit)
        }));
    }
    let mut by_key: std::collections::HashMap<String, Vec<_>> = Default::default();
    for task in tasks {
        let (key, hit) = task.await.unwrap();
        by_key.entry(key).or_default().push(hit);
    }
    assert_eq!(by_key.len(), 21);
    for (key, hits) in &by_key {
        let mut counts: Vec<u64> = hits.iter().map(|h| h.count).collect();
        counts.sort_unstable();
        assert_eq!(counts, (1..=hits.len() as u64).collect::<Vec<_>>(), "{key}");
        assert!(
            hits.iter()
                .all(|h| h.deadline == hits[0].deadline && h.deadline.is_some()),
            "{key}: one window"
        );
        let peeked = stores[0]
            .peek(namespace, &Key::new(key.clone()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(peeked.count, hits.len() as u64, "{key}");
        assert!(peeked.reset <= Duration::from_secs(60), "{key}: a lifetime");
    }
}

async fn coalesced_hits_take_every_count_once(cluster: &RedisCluster) {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(
            RedisBackend::builder(cluster.connection().await)
                .deny_cache(0)
                .build(),
        );
    }
    let before = script_calls(cluster);
    let hits = 1_200;
    hit_many_keys(stores, "every", hits).await;
    let calls = script_calls(cluster) - before;
    assert!(
        calls < hits as u64 / 2,
        "coalesced by slot: {calls} calls for {hits} hits"
    );
}

/// A Cluster connection the backend cannot recognise by its type.
#[derive(Clone)]
struct Opaque(redis::cluster_async::ClusterConnection);

impl redis::aio::ConnectionLike for Opaque {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// Its first calls mix slots; Redis refuses them as cross-slot before
/// running anything, and the backend sends them again by slot.
async fn a_connection_not_known_as_a_cluster_learns_to_coalesce_by_slot(cluster: &RedisCluster) {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(
            RedisBackend::builder(Opaque(cluster.connection().await))
                .deny_cache(0)
                .build(),
        );
    }
    let rejected = || -> u64 {
        cluster
            .nodes
            .iter()
            .map(|node| {
                let stats = node.cmd(&["INFO", "commandstats"]).unwrap();
                stats
                    .lines()
                    .filter(|line| line.starts_with("cmdstat_evalsha:"))
                    .filter_map(|line| line.split("rejected_calls=").nth(1))
                    .filter_map(|rest| rest.split(',').next())
                    .map(|n| n.trim().parse::<u64>().unwrap())
                    .sum::<u64>()
            })
            .sum()
    };
    let before = rejected();
    hit_many_keys(stores, "opaque", 1_200).await;
    assert!(
        rejected() > before,
        "the first calls mixed slots and were refused (CROSSSLOT), then went by slot"
    );
}

/// An extend of many keys' slots goes in one call per hash slot (a key's
/// record of slots shares the slot of its counters), over every master; a
/// connection not known as a Cluster learns it from its first extend, which
/// Redis refuses as cross-slot before running anything, and extends all
/// the same.
async fn extends_go_by_hash_slot_over_every_master(cluster: &RedisCluster) {
    let known = RedisBackend::new(cluster.connection().await);
    let opaque = RedisBackend::new(Opaque(cluster.connection().await));
    let cap = Cap {
        namespace: "n",
        in_flight: InFlight::new(2, Duration::from_secs(10)).unwrap(),
    };
    let lease = Window::new(Duration::from_secs(60)).unwrap();
    let keys: Vec<Key> = (0..30)
        .map(|i| Key::display(format_args!("k{i}")))
        .collect();
    let mut held = Vec::new();
    for key in &keys {
        for _ in 0..2 {
            let slot = SlotId::next();
            assert!(known.take(key, cap, slot).await.unwrap().granted, "{key:?}");
            held.push(Held {
                namespace: "n",
                key,
                slot,
            });
        }
    }
    let hash_slots: std::collections::HashSet<u16> = keys
        .iter()
        .map(|key| cluster.keyslot(&slots_key(&known, "n", key)))
        .collect();
    let served = cluster.masters();
    let masters: std::collections::HashSet<u16> = hash_slots
        .iter()
        .map(|slot| {
            served
                .iter()
                .find(|(_, ranges)| ranges.iter().any(|(lo, hi)| lo <= slot && slot <= hi))
                .expect("every slot is served")
                .0
        })
        .collect();
    assert_eq!(masters.len(), 3, "the keys are over every master");
    // The first extend loads the script on each master.
    assert_eq!(known.extend(&held, lease).await.unwrap(), 60);
    let before = script_calls(cluster);
    assert_eq!(known.extend(&held, lease).await.unwrap(), 60, "every slot");
    assert_eq!(
        script_calls(cluster) - before,
        hash_slots.len() as u64,
        "one call per hash slot"
    );
    for _ in 0..2 {
        assert_eq!(
            opaque.extend(&held, lease).await.unwrap(),
            60,
            "a connection not known as a Cluster extends every slot too"
        );
    }
    for key in &keys {
        let refused = known.take(key, cap, SlotId::next()).await.unwrap();
        assert!(
            !refused.granted && refused.retry > Duration::from_secs(55),
            "{key:?}: extended to a minute: {refused:?}"
        );
    }
}

async fn the_audit_covers_every_master(cluster: &RedisCluster) {
    let mut con = cluster.connection().await;
    // A corrupt counter: reported by the audit, never repaired.
    let _: () = redis::cmd("SET")
        .arg("tpw:bad{text}")
        .arg("abc")
        .query_async(&mut con)
        .await
        .unwrap();
    for i in 0..90 {
        let _: () = redis::cmd("SET")
            .arg(format!("tpw:legacy:{i}"))
            .arg(4)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let store = RedisBackend::new(con.clone());
    let report = store.audit(None).await.unwrap();
    assert_eq!(report.nodes, 3, "every master");
    // The 90, and the corrupt key.
    assert_eq!(report.without_lifetime.len(), 91, "{report:?}");
    assert!(report.scanned >= 90);
    for node in &cluster.nodes {
        let on_node = node
            .cmd(&["--scan", "--pattern", "tpw:legacy:*"])
            .unwrap()
            .lines()
            .count();
        assert!(on_node > 0, "master {} holds some of them", node.port());
    }
    let report = store
        .audit(Some(Window::new(Duration::from_secs(300)).unwrap()))
        .await
        .unwrap();
    assert_eq!(report.repaired.len(), 90);
    assert_eq!(
        report.corrupt,
        ["tpw:bad{text}"],
        "the corrupt key is reported, not repaired"
    );
    let after = store.audit(None).await.unwrap();
    assert_eq!(after.without_lifetime, ["tpw:bad{text}"]);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("tpw:legacy:7")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!((299_000..=300_000).contains(&ttl));
}

async fn client_chosen_keys_reach_no_other_counter_nor_pick_a_slot(cluster: &RedisCluster) {
    let prefix = "adv:";
    let list = || -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for node in &cluster.nodes {
            let out = node.cmd(&["--scan", "--pattern", "adv:*"]).unwrap();
            keys.extend(out.lines().map(|l| l.as_bytes().to_vec()));
        }
        keys
    };
    let victim_keys =
        cases::client_chosen_keys_reach_no_other_counter(cluster.connection().await, prefix, list)
            .await;
    // Every counter of one key (every layer, every quota) is in the slot of
    // the crate's tag: the escaped key.
    let store = RedisBackend::new(cluster.connection().await);
    for stored in &victim_keys {
        let open = stored.iter().position(|&b| b == b'{').unwrap();
        let tag = &stored[open + 1..stored.len() - 1];
        assert_eq!(
            cluster.keyslot(stored),
            cluster.keyslot(tag),
            "{}",
            stored.escape_ascii()
        );
    }
    let victim = cluster.keyslot(b"victim");
    for namespace in ["api", "api:1/3600000ms", "api:v2", "login", "login:v2"] {
        assert_eq!(
            cluster.keyslot(&store.storage_key(namespace, &Key::new("victim"))),
            victim,
            "{namespace}: one slot for every counter of a key"
        );
    }
    // A client that wraps a key in braces does not choose the slot: the
    // braces are escaped, and the crate's tag holds them.
    let (_, attackers) = cases::adversarial_keys();
    for key in attackers {
        let stored = String::from_utf8(store.storage_key("api", &Key::new(&key))).unwrap();
        let escaped = &stored[stored.find('{').unwrap() + 1..stored.len() - 1];
        assert!(!escaped.contains(['{', '}']), "{stored}");
        assert_eq!(
            cluster.keyslot(stored.as_bytes()),
            cluster.keyslot(escaped.as_bytes()),
            "{stored}"
        );
    }
    let braced = store.storage_key("api", &Key::new("{victim}"));
    assert_eq!(braced, b"tpw:api{%7Bvictim%7D}");
    assert_ne!(
        cluster.keyslot(&braced),
        victim,
        "{{victim}} does not land in the slot the client named"
    );
    assert_eq!(cluster.keyslot(&braced), cluster.keyslot(b"%7Bvictim%7D"));
}

/// `RedisBackend::connect_cluster` reads `cluster-require-full-coverage`
/// when it connects: under `yes` (Redis's default) it warns, in one line
/// per connection made, of what `yes` costs in a failover and where the
/// docs are; under `no` it says nothing; and where `CONFIG GET` is refused
/// (an ACL), it connects all the same and says so at debug level only.
fn the_full_coverage_warning_is_given_once_under_yes() {
    let cluster = redis_or_skip!(RedisCluster::start(
        "the_full_coverage_warning_is_given_once_under_yes"
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let on_every_node = |args: &[&str]| {
        for node in &cluster.nodes {
            let reply = node.cmd(args).expect("redis-cli");
            assert!(!reply.contains("ERR"), "{args:?}: {reply}");
        }
    };
    // Connect, with this thread's logs captured at `level`: the lines that
    // name the setting.
    let connect = |level| {
        let (backend, lines) = capture(level, || {
            runtime.block_on(RedisBackend::connect_cluster(cluster.urls()))
        });
        backend.expect("connected");
        lines
            .into_iter()
            .filter(|line| line.contains("cluster-require-full-coverage"))
            .collect::<Vec<_>>()
    };
    for value in ["yes", "no", "yes"] {
        on_every_node(&["CONFIG", "SET", "cluster-require-full-coverage", value]);
        let lines = connect(LevelFilter::WARN);
        eprintln!("full coverage {value}: {lines:?}");
        if value == "yes" {
            assert_eq!(lines.len(), 1, "one warning a connection: {lines:?}");
            let line = &lines[0];
            assert!(line.contains("WARN"), "{line}");
            assert!(
                line.contains("CLUSTERDOWN") && line.contains("promotion"),
                "says what yes costs: {line}"
            );
            assert!(line.contains("docs/redis.md"), "points to the docs: {line}");
        } else {
            assert!(lines.is_empty(), "no warning under no: {lines:?}");
        }
    }
    // Under `yes` still, but `CONFIG GET` refused: no warning, a debug line.
    on_every_node(&["ACL", "SETUSER", "default", "-config|get"]);
    let refused = cluster.nodes[0]
        .cmd(&["CONFIG", "GET", "cluster-require-full-coverage"])
        .unwrap_or_else(|err| err);
    assert!(refused.contains("NOPERM"), "CONFIG GET refused: {refused}");
    assert!(
        connect(LevelFilter::WARN).is_empty(),
        "no warning when CONFIG is refused"
    );
    let debug = connect(LevelFilter::DEBUG);
    assert!(
        debug.iter().any(|line| line.contains("DEBUG")),
        "the refusal is logged at debug level: {debug:?}"
    );
    assert!(!debug.iter().any(|line| line.contains("WARN")), "{debug:?}");
}

/// Concurrent spends of varied costs on one key, from four instances: the
/// admitted costs add up to no more than the limit, and to exactly the
/// stored count; a lockout and its counter share the key's slot.
async fn concurrent_spends_of_varied_costs_are_exact(cluster: &RedisCluster) {
    use tower_pinned_window::backend::{Counter, Spend};
    let limit = 1_000;
    let q = quota(limit, 60);
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(RedisBackend::new(cluster.connection().await));
    }
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let store = stores[i as usize % 4].clone();
            tokio::spawn(async move {
                let cost = 1 + i % 7;
                let hits = store
                    .spend_all(
                        &Key::new("hot"),
                        &[Counter {
                            namespace: "x",
                            quota: q,
                            lowers: false,
                        }],
                        Spend::cost(cost),
                    )
                    .await
                    .unwrap();
                if hits[0].deadline.is_some() { cost } else { 0 }
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let peeked = stores[0]
        .peek("x", &Key::new("hot"))
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "cluster: 400 spends of costs 1..=7 on a limit of {limit} from 4 instances: admitted {admitted}, stored {}",
        peeked.count
    );
    assert!(admitted <= limit, "admitted {admitted}");
    assert_eq!(admitted, peeked.count);
    // Spends on keys of many slots in flight together: each slot's lane
    // carries its own, and every key's admitted costs are its stored count.
    let tasks: Vec<_> = (0..1_200u64)
        .map(|i| {
            let store = stores[i as usize % 4].clone();
            tokio::spawn(async move {
                let (key, cost) = (format!("spread{}", i % 60), 1 + i % 3);
                let hits = store
                    .spend_all(
                        &Key::new(key.clone()),
                        &[Counter {
                            namespace: "y",
                            quota: quota(30, 60),
                            lowers: false,
                        }],
                        Spend::cost(cost),
                    )
                    .await
                    .unwrap();
                (key, if hits[0].deadline.is_some() { cost } else { 0 })
            })
        })
        .collect();
    let mut by_key: std::collections::BTreeMap<String, u64> = Default::default();
    for task in tasks {
        let (key, cost) = task.await.unwrap();
        *by_key.entry(key).or_default() += cost;
    }
    assert_eq!(by_key.len(), 60);
    for (key, admitted) in by_key {
        let stored = stores[1].peek("y", &Key::new(key.clone())).await.unwrap();
        assert!(admitted <= 30, "{key}: admitted {admitted}");
        assert_eq!(Some(admitted), stored.map(|h| h.count), "{key}");
    }
    // A lockout on a Cluster: written in the counter's slot, in one step.
    let lock = Spend::cost(1).block(Window::new(std::time::Duration::from_secs(60)).unwrap());
    let one = [Counter {
        namespace: "login",
        quota: quota(1, 60),
        lowers: false,
    }];
    let key = Key::new("ip");
    assert_eq!(
        stores[1].spend_all(&key, &one, lock).await.unwrap()[0].count,
        1
    );
    let denied = stores[2].spend_all(&key, &one, lock).await.unwrap();
    assert_eq!(denied[0].count, 2);
    assert!(stores[3].reset("login", &key).await.unwrap());
    assert_eq!(
        stores[0].spend_all(&key, &one, lock).await.unwrap()[0].count,
        1
    );
}

/// A trial of `case` on a Cluster of its own.
/// A spend whose future is dropped (the layer's timeout) while its master
/// is frozen runs when the master wakes: what it spent is given back, the
/// marker being in the counter's slot.
async fn a_spend_dropped_in_flight_keeps_no_cost(cluster: &RedisCluster) {
    let store = RedisBackend::builder(cluster.connection().await)
        .deny_cache(0)
        .build();
    let key = Key::new("lost");
    let spend = |cost| {
        store.spend_all(
            &key,
            &[tower_pinned_window::backend::Counter {
                namespace: "x",
                quota: quota(10, 60),
                lowers: false,
            }],
            tower_pinned_window::backend::Spend::cost(cost),
        )
    };
    assert_eq!(spend(1).await.unwrap()[0].count, 1);
    let stored = store.storage_key("x", &key);
    let slot = cluster.keyslot(&stored);
    let (master, _) = cluster
        .masters()
        .into_iter()
        .find(|(_, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .expect("a master serves the slot");
    let node = cluster.node(master);
    let stored = String::from_utf8(stored).unwrap();

    node.signal("STOP");
    let timed_out = tokio::time::timeout(Duration::from_millis(100), spend(3)).await;
    assert!(timed_out.is_err(), "answered by a frozen master");
    node.signal("CONT");
    let mut count = String::new();
    for _ in 0..100 {
        count = node.cmd(&["GET", &stored]).unwrap().trim().to_owned();
        if count == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count, "1", "the dropped spend's 3 stay counted");
}

macro_rules! on_its_own_cluster {
    ($case:ident) => {
        trial::trial(stringify!($case), Needs::Redis, || {
            let cluster = redis_or_skip!(RedisCluster::start(stringify!($case)));
            multi_thread_runtime().block_on($case(&cluster));
        })
    };
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
fn main() {
    let mut trials = vec![
        on_its_own_cluster!(keys_spread_over_every_master_and_windows_stay_pinned),
        on_its_own_cluster!(exactly_the_limit_is_admitted_across_four_instances),
        on_its_own_cluster!(coalesced_hits_take_every_count_once),
        on_its_own_cluster!(a_connection_not_known_as_a_cluster_learns_to_coalesce_by_slot),
        on_its_own_cluster!(extends_go_by_hash_slot_over_every_master),
        on_its_own_cluster!(the_audit_covers_every_master),
        on_its_own_cluster!(client_chosen_keys_reach_no_other_counter_nor_pick_a_slot),
        on_its_own_cluster!(deny_cache_hits_are_never_refunded),
        on_its_own_cluster!(concurrent_spends_of_varied_costs_are_exact),
        on_its_own_cluster!(a_spend_dropped_in_flight_keeps_no_cost),
        trial::trial(
            "the_full_coverage_warning_is_given_once_under_yes",
            Needs::Redis,
            the_full_coverage_warning_is_given_once_under_yes,
        ),
    ];
    let cluster = Shared::new(|| RedisCluster::start("contract"));
    for (name, deny_cache) in [("contract", 0), ("contract_deny_cache", 1024)] {
        let cluster = cluster.clone();
        let store = RedisStore::new(deny_cache, move || {
            let cluster = cluster.clone();
            async move { cluster.get().connection().await }
        });
        let store = Arc::new(store);
        trials.extend(trial::contract(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_leases(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_heeds(name, Needs::Redis, store.clone()));
        trials.extend(trial::contract_limits(name, Needs::Redis, store));
    }
    trial::run(trials, cluster)
}

async fn deny_cache_hits_are_never_refunded(cluster: &RedisCluster) {
    cases::deny_cache_hits_are_never_refunded(cluster.connection().await, "cache:").await;
}
