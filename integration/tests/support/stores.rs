//! The harnesses of the backend contract (`tower_pinned_window_testkit`):
//! a `Store` per real backend, for the test binaries that run the contract
//! (`#[path = "support/stores.rs"] mod stores;` beside `mod support;`; the
//! integration/ member shares `support/` but not these, nor the testkit
//! crate).

#![allow(dead_code)]

/// What `report` says, in the suite's terms: the same for every store.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn audit_of(
    report: &tower_pinned_window::backend::AuditReport,
) -> tower_pinned_window_testkit::Audit {
    tower_pinned_window_testkit::Audit {
        without_lifetime: report
            .without_lifetime
            .iter()
            .filter(|name| !report.corrupt.contains(name))
            .count(),
        corrupt: report.corrupt.len(),
    }
}

/// The backend contract (`tower_pinned_window_testkit`) on Redis: each
/// fresh backend has its own key prefix on a shared server, Cluster or
/// Sentinel group, and its own connection.
#[cfg(feature = "redis")]
pub mod redis {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use redis::aio::ConnectionLike;
    use tower_pinned_window::backend::toolkit::storage_key;
    use tower_pinned_window::backend::{LimitScope, SlotId, encode_scope};
    use tower_pinned_window::key::Key;
    use tower_pinned_window_redis::RedisBackend;
    use tower_pinned_window_redis::connection::Nodes;
    use tower_pinned_window_testkit::{Ability, Audit, SlotsRecord, Store, Stored};

    type Connect<C> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = C> + Send>> + Send + Sync>;

    pub struct RedisStore<C> {
        connect: Connect<C>,
        deny_cache: usize,
        /// The replica-acknowledged mode's replicas and timeout, if on.
        wait: Option<(u32, std::time::Duration)>,
        /// Coalesced calls (the backend's default), or one call a step.
        coalesce: bool,
    }

    /// Numbers the prefixes of every store of the process: stores share a
    /// server.
    static PREFIXES: AtomicUsize = AtomicUsize::new(0);

    impl<C> RedisStore<C> {
        /// Backends on connections that `connect` makes (on the runtime of
        /// the trial), with a deny cache of `deny_cache` keys.
        pub fn new<F>(deny_cache: usize, connect: impl Fn() -> F + Send + Sync + 'static) -> Self
        where
            F: Future<Output = C> + Send + 'static,
        {
            Self {
                connect: Box::new(move || Box::pin(connect())),
                deny_cache,
                wait: None,
                coalesce: true,
            }
        }

        /// Backends that send one call a step (`coalesce(false)`).
        #[allow(dead_code, reason = "not every test crate sends one call a step")]
        pub fn single_calls(mut self) -> Self {
            self.coalesce = false;
            self
        }

        /// Backends in the replica-acknowledged mode
        /// (`RedisBackendBuilder::wait_for_replicas`).
        #[allow(dead_code, reason = "not every test crate waits for replicas")]
        pub fn wait_for_replicas(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
            self.wait = Some((replicas, timeout));
            self
        }

        fn build(&self, connection: C, prefix: Vec<u8>) -> RedisBackend<C>
        where
            C: ConnectionLike + Clone + Send + Sync + 'static,
        {
            let builder = RedisBackend::builder(connection)
                .prefix(prefix)
                .deny_cache(self.deny_cache)
                .coalesce(self.coalesce);
            match self.wait {
                Some((replicas, timeout)) => builder.wait_for_replicas(replicas, timeout),
                None => builder,
            }
            .build()
        }
    }

    /// The prefix `backend` stores under: what its storage keys hold before
    /// the brace of the key (a prefix holds no brace, the empty namespace
    /// adds nothing).
    fn prefix_of<C>(backend: &RedisBackend<C>) -> Vec<u8>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let stored = backend.storage_key("", &Key::new("k"));
        let brace = stored.iter().position(|&b| b == b'{').unwrap();
        stored[..brace].to_vec()
    }

    /// The key of the record of `key`'s slots under `namespace` of
    /// `backend`, as the crate's toolkit names it.
    pub fn slots_key<C>(backend: &RedisBackend<C>, namespace: &str, key: &Key) -> Vec<u8>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        storage_key::encode_slots(&prefix_of(backend), namespace, key)
    }

    /// What `record` holds, read with `con`: nothing, a sorted set of
    /// slots (how many, and the lifetime left), or anything else as text
    /// (its type, then its members with their scores, or its value).
    pub async fn read_slots(con: &mut impl ConnectionLike, record: &[u8]) -> SlotsRecord {
        let kind: String = redis::cmd("TYPE")
            .arg(record)
            .query_async(con)
            .await
            .unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(record)
            .query_async(con)
            .await
            .unwrap();
        match kind.as_str() {
            "none" => SlotsRecord::Absent,
            "zset" => {
                let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                    .arg(record)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(con)
                    .await
                    .unwrap();
                if members
                    .iter()
                    .all(|(m, _)| SlotId::parse(m.as_bytes()).is_some())
                {
                    let slots: usize = redis::cmd("ZCARD")
                        .arg(record)
                        .query_async(con)
                        .await
                        .unwrap();
                    SlotsRecord::Held {
                        slots,
                        lifetime: u64::try_from(pttl)
                            .ok()
                            .map(std::time::Duration::from_millis),
                    }
                } else {
                    SlotsRecord::Other(format!("zset {members:?}, PTTL {pttl}"))
                }
            }
            "string" => {
                let value: String = redis::cmd("GET")
                    .arg(record)
                    .query_async(con)
                    .await
                    .unwrap();
                SlotsRecord::Other(format!("string {value:?}, PTTL {pttl}"))
            }
            other => SlotsRecord::Other(format!("a {other}, PTTL {pttl}")),
        }
    }

    impl<C> Store for RedisStore<C>
    where
        C: ConnectionLike + Nodes + Clone + Send + Sync + 'static,
    {
        type Backend = RedisBackend<C>;

        async fn fresh(&self) -> RedisBackend<C> {
            let n = PREFIXES.fetch_add(1, Ordering::Relaxed);
            self.build((self.connect)().await, format!("kit{n}:").into_bytes())
        }

        async fn another(&self, backend: &RedisBackend<C>) -> RedisBackend<C> {
            self.build((self.connect)().await, prefix_of(backend))
        }

        fn abilities(&self) -> &'static [Ability] {
            &[
                Ability::Corrupt,
                Ability::ReadStored,
                Ability::Audit,
                Ability::ReadSlots,
                Ability::CorruptSlots,
                Ability::CorruptLockout,
                Ability::CorruptLimit,
            ]
        }

        /// The counter's lockout marker as a spend sets it (the time it was
        /// set), with no lifetime.
        async fn corrupt_lockout(
            &self,
            backend: &RedisBackend<C>,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let mut con = (self.connect)().await;
            let lock = storage_key::encode_lockout(&prefix_of(backend), namespace, key);
            let _: () = redis::cmd("SET")
                .arg(lock)
                .arg("1700000000000")
                .query_async(&mut con)
                .await
                .unwrap();
            Some(())
        }

        /// A field of the layer's limits hash whose value is not a limit.
        async fn corrupt_limit(
            &self,
            backend: &RedisBackend<C>,
            layer: &str,
            scope: LimitScope<'_>,
        ) -> Option<()> {
            let mut con = (self.connect)().await;
            let _: () = redis::cmd("HSET")
                .arg(storage_key::encode_limits(&prefix_of(backend), layer))
                .arg(encode_scope(scope))
                .arg("lots/60000ms")
                .query_async(&mut con)
                .await
                .unwrap();
            Some(())
        }

        async fn slots_record(
            &self,
            backend: &RedisBackend<C>,
            namespace: &str,
            key: &Key,
        ) -> Option<SlotsRecord> {
            let mut con = (self.connect)().await;
            Some(read_slots(&mut con, &slots_key(backend, namespace, key)).await)
        }

        /// A sorted set of the record's shape but for one member, which is
        /// not a slot's name, beside a live slot: the record's type alone
        /// does not give it away. No lifetime, so that two reads of it
        /// agree.
        async fn corrupt_slots(
            &self,
            backend: &RedisBackend<C>,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let mut con = (self.connect)().await;
            let far = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 3_600_000;
            let _: () = redis::cmd("ZADD")
                .arg(slots_key(backend, namespace, key))
                .arg(far)
                .arg(SlotId::next().to_string())
                .arg(far)
                .arg("not-a-slot")
                .query_async(&mut con)
                .await
                .unwrap();
            Some(())
        }

        async fn corrupt(
            &self,
            backend: &RedisBackend<C>,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let mut con = (self.connect)().await;
            let _: () = redis::cmd("SET")
                .arg(backend.storage_key(namespace, key))
                .arg("abc")
                .query_async(&mut con)
                .await
                .unwrap();
            Some(())
        }

        async fn stored(
            &self,
            backend: &RedisBackend<C>,
            namespace: &str,
            key: &Key,
        ) -> Option<Stored> {
            let mut con = (self.connect)().await;
            let stored = backend.storage_key(namespace, key);
            let value: Option<String> = redis::cmd("GET")
                .arg(&stored)
                .query_async(&mut con)
                .await
                .unwrap();
            let expiry: i64 = redis::cmd("PEXPIRETIME")
                .arg(&stored)
                .query_async(&mut con)
                .await
                .unwrap();
            Some(match value {
                None => Stored::Absent,
                Some(value) => Stored::Value {
                    value,
                    expiry: u64::try_from(expiry).ok(),
                },
            })
        }

        async fn audit(&self, backend: &RedisBackend<C>) -> Option<Audit> {
            // With a repair window: only then are the keys without a
            // lifetime read, and the corrupt ones told apart (and left as
            // they are).
            let window =
                tower_pinned_window::Window::new(std::time::Duration::from_secs(60)).unwrap();
            let report = backend.audit(Some(window)).await.unwrap();
            Some(super::audit_of(&report))
        }
    }
}

/// The backend contract (`tower_pinned_window_testkit`) on PostgreSQL: each
/// fresh backend has a schema of its own on the machine's server, kept until
/// the store is dropped.
#[cfg(feature = "postgres")]
pub mod postgres {
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use tower_pinned_window::backend::{LimitScope, SlotId, encode_scope};
    use tower_pinned_window::key::Key;
    use tower_pinned_window_postgres::PostgresBackend;
    use tower_pinned_window_testkit::{Ability, Audit, SlotsRecord, Store, Stored};

    use crate::support::postgres::{TestSchema, connect, pool, url};

    pub struct PostgresStore {
        deny_cache: usize,
        schemas: Mutex<Vec<TestSchema>>,
    }

    impl PostgresStore {
        /// Backends with a deny cache of `deny_cache` counters.
        pub fn new(deny_cache: usize) -> Self {
            Self {
                deny_cache,
                schemas: Mutex::new(Vec::new()),
            }
        }
    }

    /// The schema of `backend`'s table (`schema.table`).
    fn schema_of(backend: &PostgresBackend) -> &str {
        backend.table().split('.').next().unwrap()
    }

    /// The table of `backend`'s limits held in the store, beside its
    /// counters'.
    pub fn limits_table(backend: &PostgresBackend) -> String {
        format!("{}_limits", backend.table())
    }

    /// The table of `backend`'s slots in flight, beside its counters'.
    pub fn slots_table(backend: &PostgresBackend) -> String {
        format!("{}_slots", backend.table())
    }

    impl Store for PostgresStore {
        type Backend = PostgresBackend;

        async fn fresh(&self) -> PostgresBackend {
            let schema = TestSchema::create("kit")
                .await
                .expect("PostgreSQL was there when the trials were listed");
            let backend = schema.builder().deny_cache(self.deny_cache).build();
            backend.migrate().await.unwrap();
            self.schemas.lock().unwrap().push(schema);
            backend
        }

        async fn another(&self, backend: &PostgresBackend) -> PostgresBackend {
            let schema = schema_of(backend);
            PostgresBackend::builder(pool(&url(), schema, 8))
                .schema(schema)
                .deny_cache(self.deny_cache)
                .build()
        }

        fn abilities(&self) -> &'static [Ability] {
            &[
                Ability::Corrupt,
                Ability::ReadStored,
                Ability::Audit,
                Ability::ReadSlots,
                Ability::CorruptSlots,
                Ability::CorruptLockout,
                Ability::CorruptLimit,
            ]
        }

        /// A live counter locked out until `infinity`, which the table's
        /// constraint refuses: it is dropped first, as hand-written SQL
        /// could.
        async fn corrupt_lockout(
            &self,
            backend: &PostgresBackend,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let client = connect(&url()).await.unwrap();
            let table = backend.table();
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS tpw_counters_blocked_until_check"
                ))
                .await
                .unwrap();
            client
                .execute(
                    &format!(
                        "INSERT INTO {table} VALUES \
                         ($1, $2, 1, now() + interval '1 minute', 'infinity')"
                    ),
                    &[&namespace, &key.as_bytes()],
                )
                .await
                .unwrap();
            Some(())
        }

        /// A limit of 0, written as hand-written SQL could.
        async fn corrupt_limit(
            &self,
            backend: &PostgresBackend,
            layer: &str,
            scope: LimitScope<'_>,
        ) -> Option<()> {
            let client = connect(&url()).await.unwrap();
            client
                .execute(
                    &format!(
                        "INSERT INTO {} VALUES ($1, $2, '0/60000ms') \
                         ON CONFLICT (layer, scope) DO UPDATE SET value = excluded.value",
                        limits_table(backend)
                    ),
                    &[&layer, &encode_scope(scope)],
                )
                .await
                .unwrap();
            Some(())
        }

        /// A negative count, which the table's constraints refuse: they
        /// are dropped first, as hand-written SQL could.
        async fn corrupt(
            &self,
            backend: &PostgresBackend,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let client = connect(&url()).await.unwrap();
            let table = backend.table();
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS tpw_counters_count_check"
                ))
                .await
                .unwrap();
            client
                .execute(
                    &format!(
                        "INSERT INTO {table} VALUES ($1, $2, -3, now() + interval '1 minute')"
                    ),
                    &[&namespace, &key.as_bytes()],
                )
                .await
                .unwrap();
            Some(())
        }

        async fn stored(
            &self,
            backend: &PostgresBackend,
            namespace: &str,
            key: &Key,
        ) -> Option<Stored> {
            let client = connect(&url()).await.unwrap();
            let row = client
                .query_opt(
                    &format!(
                        "SELECT coalesce(count::text, 'NULL'), expires_at, \
                         expires_at IS NULL OR expires_at > now() \
                         FROM {} WHERE namespace = $1 AND key = $2",
                        backend.table()
                    ),
                    &[&namespace, &key.as_bytes()],
                )
                .await
                .unwrap();
            Some(match row {
                Some(row) if row.get::<_, bool>(2) => Stored::Value {
                    value: row.get(0),
                    expiry: row.get::<_, Option<SystemTime>>(1).map(|at| {
                        u64::try_from(at.duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
                    }),
                },
                // No row, or an expired one waiting for the cleaner.
                _ => Stored::Absent,
            })
        }

        /// Report only: PostgreSQL tells corrupt rows apart without
        /// repairing.
        async fn audit(&self, backend: &PostgresBackend) -> Option<Audit> {
            let report = backend.audit(None).await.unwrap();
            Some(super::audit_of(&report))
        }

        /// The key's record of slots: its slots (live or not yet dropped)
        /// and the time left on its `expires_at`, by the database's clock;
        /// `Absent` when there is none or it has expired (waiting for the
        /// cleaner); `Other` with the row as JSON when it is not of the
        /// store's shape (a name that is not a slot's, a slot without a
        /// lease, no `expires_at`).
        async fn slots_record(
            &self,
            backend: &PostgresBackend,
            namespace: &str,
            key: &Key,
        ) -> Option<SlotsRecord> {
            let client = connect(&url()).await.unwrap();
            let row = client
                .query_opt(
                    &format!(
                        "SELECT c.slots, cardinality(c.leases), array_position(c.leases, NULL), \
                         (extract(epoch FROM c.expires_at - now()) * 1000000)::bigint, \
                         row_to_json(c)::text \
                         FROM {} AS c WHERE c.namespace = $1 AND c.key = $2",
                        slots_table(backend)
                    ),
                    &[&namespace, &key.as_bytes()],
                )
                .await
                .unwrap();
            let Some(row) = row else {
                return Some(SlotsRecord::Absent);
            };
            let slots: Option<Vec<Option<String>>> = row.get(0);
            let leases: Option<i32> = row.get(1);
            let null_lease: Option<i32> = row.get(2);
            let left: Option<i64> = row.get(3);
            let names: Option<Vec<SlotId>> = slots.as_ref().and_then(|slots| {
                slots
                    .iter()
                    .map(|slot| SlotId::parse(slot.as_deref()?.as_bytes()))
                    .collect()
            });
            Some(match (names, leases, null_lease, left) {
                (Some(names), Some(leases), None, Some(left))
                    if usize::try_from(leases) == Ok(names.len()) =>
                {
                    match u64::try_from(left) {
                        Ok(micros) if micros > 0 => SlotsRecord::Held {
                            slots: names.len(),
                            lifetime: Some(Duration::from_micros(micros)),
                        },
                        _ => SlotsRecord::Absent,
                    }
                }
                _ => SlotsRecord::Other(row.get(4)),
            })
        }

        /// A record holding a name that is not a slot's, which the table's
        /// constraints refuse: they are dropped first, as hand-written SQL
        /// could.
        async fn corrupt_slots(
            &self,
            backend: &PostgresBackend,
            namespace: &str,
            key: &Key,
        ) -> Option<()> {
            let client = connect(&url()).await.unwrap();
            let table = slots_table(backend);
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS slot_names"
                ))
                .await
                .unwrap();
            client
                .execute(
                    &format!(
                        "INSERT INTO {table} VALUES ($1, $2, ARRAY['not a slot'], \
                         ARRAY[now() + interval '1 minute'], now() + interval '1 minute')"
                    ),
                    &[&namespace, &key.as_bytes()],
                )
                .await
                .unwrap();
            Some(())
        }
    }
}
