//! Private keys on a real Redis, a real Redis Cluster and PostgreSQL: the
//! store holds keyed digests, never the keys, and counts exactly as before.
//! The backend contract runs on `PrivateKeys` over Redis and PostgreSQL too
//! (`contract_redis::*`, `contract_postgres::*`).

#[path = "support/stores.rs"]
mod stores;
mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use redis::aio::ConnectionLike;
use stores::redis::RedisStore;
use support::http::{burst, by_client, from, multi_thread_runtime, ok_count, ok_service};
use support::redis::{RedisServer, Shared};
use tower::{Layer, ServiceExt};
use tower_pinned_window::backend::PrivateKeys;
use tower_pinned_window::key::Key;
use tower_pinned_window::{Quota, RateLimitLayer};
use tower_pinned_window_redis::RedisBackend;
use tower_pinned_window_redis::connection::Nodes;
use tower_pinned_window_testkit::Private;
use trial::Needs;

const SECRET_A: &[u8; 32] = b"secret A: 32 random bytes, here!";
const SECRET_B: &[u8; 32] = b"secret B: 32 random bytes, here!";

fn quota(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(60)).unwrap()
}

async fn get<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> Option<i64> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut con.clone())
        .await
        .unwrap()
}

/// The whole story on one connection, under `prefix`; `keys` lists every
/// key in the store under `prefix`.
async fn private_keys_are_digests_and_count_exactly<C>(
    con: C,
    prefix: &str,
    keys: impl Fn() -> Vec<Vec<u8>>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static + Nodes,
{
    let backend = |secret: &[u8]| {
        let redis = RedisBackend::builder(con.clone())
            .prefix(prefix)
            .deny_cache(0)
            .build();
        PrivateKeys::try_new(redis, secret).unwrap()
    };
    let store_a = backend(SECRET_A);
    let layer = |store: PrivateKeys<RedisBackend<C>>| {
        RateLimitLayer::new("api", quota(3))
            .key(by_client())
            .backend(store)
            .layer(ok_service())
    };

    // The limit holds, counted under the digest.
    let svc = layer(store_a.clone());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            svc.clone()
                .oneshot(from("sk_live_alice"))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(ok_count(&statuses), 3, "{prefix} {statuses:?}");
    let alice = store_a.digest(&Key::new("sk_live_alice"));
    let stored = store_a.get_ref().storage_key("api", &alice);
    assert_eq!(keys(), vec![stored.clone()], "{prefix}");
    assert!(
        stored.starts_with(format!("{prefix}api{{@").as_bytes())
            && stored.len() == prefix.len() + 3 + 2 + 65,
        "{}",
        stored.escape_ascii()
    );
    assert_eq!(get(&con, &stored).await, Some(5), "{prefix}");
    assert_eq!(
        stored,
        [prefix.as_bytes(), b"api{", alice.as_bytes(), b"}"].concat(),
        "the stored key holds the digest as it is"
    );

    // Another secret, the same name, the same store: its own counters.
    let svc_b = layer(backend(SECRET_B));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            svc_b
                .clone()
                .oneshot(from("sk_live_alice"))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "{prefix}"
    );
    assert_eq!(keys().len(), 2, "{prefix}");
    assert_eq!(
        get(&con, &stored).await,
        Some(5),
        "secret A's counter untouched"
    );

    // Concurrent hits from two instances (two backends, one secret): exactly
    // the limit is admitted, and every hit is counted in one counter.
    let instances = [layer(backend(SECRET_A)), layer(backend(SECRET_A))];
    let statuses = burst(&instances, 40, || from("sk_live_carol")).await;
    assert_eq!(ok_count(&statuses), 3, "{prefix}");
    let carol = store_a
        .get_ref()
        .storage_key("api", &store_a.digest(&Key::new("sk_live_carol")));
    assert_eq!(get(&con, &carol).await, Some(40), "{prefix}");

    let listed = keys();
    assert_eq!(listed.len(), 3, "{prefix}");
    for key in &listed {
        assert!(
            !key.windows(7).any(|w| w == b"sk_live"),
            "a raw key reached the store: {}",
            key.escape_ascii()
        );
    }

    // The audit still works: it lists the digest of a counter without a
    // lifetime, and peek and reset take the raw key.
    let _: i64 = redis::cmd("PERSIST")
        .arg(&stored)
        .query_async(&mut con.clone())
        .await
        .unwrap();
    let report = store_a.get_ref().audit(None).await.unwrap();
    assert_eq!(report.scanned, 3, "{prefix}");
    assert_eq!(
        report.without_lifetime,
        [String::from_utf8(stored.clone()).unwrap()],
        "{prefix}: named by its storage key, printable"
    );
    let alice_hit =
        tower_pinned_window::backend::Backend::peek(&store_a, "api", &Key::new("sk_live_alice"))
            .await
            .unwrap();
    assert_eq!(alice_hit.map(|hit| hit.count), Some(5));
    assert!(
        tower_pinned_window::backend::Backend::reset(&store_a, "api", &Key::new("sk_live_alice"))
            .await
            .unwrap()
    );
    assert_eq!(get(&con, &stored).await, None, "{prefix}");
}

fn on_a_redis_server() {
    let server = redis_or_skip!(RedisServer::start("private keys on a redis server"));
    multi_thread_runtime().block_on(async {
        let con = server.client().get_connection_manager().await.unwrap();
        let keys = || {
            let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
                .arg("private:*")
                .query(&mut server.sync())
                .unwrap();
            keys.sort();
            keys
        };
        private_keys_are_digests_and_count_exactly(con, "private:", keys).await;
    });
}

#[cfg(feature = "redis-cluster")]
fn on_a_cluster() {
    use support::redis::RedisCluster;

    let cluster = redis_or_skip!(RedisCluster::start("private keys on a cluster"));
    multi_thread_runtime().block_on(async {
        let keys = || {
            let mut keys: Vec<Vec<u8>> = Vec::new();
            for node in &cluster.nodes {
                let on_node: Vec<Vec<u8>> = redis::cmd("KEYS")
                    .arg("private:*")
                    .query(&mut node.sync())
                    .unwrap();
                keys.extend(on_node);
            }
            keys.sort();
            keys
        };
        private_keys_are_digests_and_count_exactly(cluster.connection().await, "private:", keys)
            .await;
    });
}

/// On PostgreSQL: the table holds digests, and counts exactly.
#[cfg(feature = "postgres")]
fn on_postgres() {
    use support::postgres::TestSchema;

    multi_thread_runtime().block_on(async {
        let schema = pg_or_skip!(TestSchema::create("private_keys").await);
        let store = schema.backend().await;
        let layer = |store| {
            RateLimitLayer::new("api", quota(3))
                .key(by_client())
                .backend(store)
                .layer(ok_service())
        };
        let private = PrivateKeys::try_new(store.clone(), SECRET_A).unwrap();
        let instances = [layer(private.clone()), layer(private.clone())];
        let statuses = burst(&instances, 40, || from("sk_live_dave")).await;
        assert_eq!(ok_count(&statuses), 3);
        let other = layer(PrivateKeys::try_new(store, SECRET_B).unwrap());
        assert_eq!(
            other.oneshot(from("sk_live_dave")).await.unwrap().status(),
            StatusCode::OK,
            "another secret: its own counter"
        );

        let rows = schema
            .client
            .query(
                &format!(
                    "SELECT namespace, key, count FROM {} ORDER BY count",
                    schema.table()
                ),
                &[],
            )
            .await
            .unwrap();
        let rows: Vec<(String, Vec<u8>, i64)> = rows
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        let dave = private.digest(&Key::new("sk_live_dave"));
        let (namespace, key, count) = &rows[1];
        assert_eq!(
            (namespace.as_str(), key.as_slice()),
            ("api", dave.as_bytes())
        );
        assert!(
            *count >= 3,
            "every hit the deny cache did not answer is counted: {count}"
        );
        for (_, key, _) in &rows {
            assert!(
                key.starts_with(b"@") && key.len() == 65,
                "{}",
                key.escape_ascii()
            );
        }
    });
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
fn main() {
    let mut trials = vec![trial::trial(
        "on_a_redis_server",
        Needs::Redis,
        on_a_redis_server,
    )];
    #[cfg(feature = "redis-cluster")]
    trials.push(trial::trial("on_a_cluster", Needs::Redis, on_a_cluster));
    #[cfg(feature = "postgres")]
    trials.push(trial::trial("on_postgres", Needs::Postgres, on_postgres));
    // The backend contract on keyed digests: PrivateKeys over Redis (one
    // shared server, a prefix per scenario) and over PostgreSQL (a schema
    // per scenario).
    let server = Shared::new(|| RedisServer::start("private contract"));
    let redis = {
        let server = server.clone();
        RedisStore::new(0, move || {
            let server = server.clone();
            async move {
                server
                    .get()
                    .client()
                    .get_connection_manager()
                    .await
                    .unwrap()
            }
        })
    };
    let redis = Arc::new(Private::new(redis, SECRET_A));
    trials.extend(trial::contract(
        "contract_redis",
        Needs::Redis,
        redis.clone(),
    ));
    trials.extend(trial::contract_leases(
        "contract_redis",
        Needs::Redis,
        redis.clone(),
    ));
    trials.extend(trial::contract_heeds("contract_redis", Needs::Redis, redis));
    #[cfg(feature = "postgres")]
    trials.extend(trial::contract(
        "contract_postgres",
        Needs::Postgres,
        Arc::new(Private::new(
            stores::postgres::PostgresStore::new(0),
            SECRET_A,
        )),
    ));
    #[cfg(feature = "postgres")]
    trials.extend(trial::contract_leases(
        "contract_postgres",
        Needs::Postgres,
        Arc::new(Private::new(
            stores::postgres::PostgresStore::new(0),
            SECRET_A,
        )),
    ));
    #[cfg(feature = "postgres")]
    trials.extend(trial::contract_heeds(
        "contract_postgres",
        Needs::Postgres,
        Arc::new(Private::new(
            stores::postgres::PostgresStore::new(0),
            SECRET_A,
        )),
    ));
    trial::run(trials, server)
}
