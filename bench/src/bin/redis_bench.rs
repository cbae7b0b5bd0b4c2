//! Hits per second through the Redis backend, for `bench/redis.sh`.
//!
//! ```text
//! cargo run --release -p tower-pinned-window-bench --bin redis_bench -- URL MODE IN_FLIGHT SECONDS
//! cargo run --release -p tower-pinned-window-bench --bin redis_bench -- script
//! ```
//!
//! MODE is one of
//! - `pinned` (this crate's backend, coalesced hits: the default), and
//!   `pinned-single` (the same with `.coalesce(false)`: one EVALSHA per hit);
//!   every hit creates a fresh key;
//! - `keys` and `keys-single`: hits spread over 10,000 distinct keys, in
//!   turn (each task starts at another key);
//! - `hot` and `hot-single`: every hit on one key;
//! - `naive` (INCR, then PEXPIRE when the INCR created the key: two round
//!   trips; every hit a fresh key, so it always pays its second trip);
//! - `denied` (hits on one key over its limit, answered by the deny cache);
//! - `spend-keys` and `spend-hot`: spends of cost 3 (`Spending::spend_all`,
//!   the spend script), over 10,000 keys or on one key.
//!
//! Prints three numbers: hits per second, the number of hits, and this
//! process's CPU time per hit in microseconds (user + system, from
//! `/proc/self/stat`, so at a 10 ms tick).
//!
//! `script` prints the backend's Lua script (`redis/src/hit.lua`),
//! which the script's ceiling runs through `redis-benchmark`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Backend, Counter, Spend, Spending};
use tower_pinned_window::key::Key;
use tower_pinned_window_redis::RedisBackend;

/// The hit script, as the backend sends it.
const HIT_SCRIPT: &str = include_str!("../../../redis/src/hit.lua");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args == ["script"] {
        print!("{HIT_SCRIPT}");
        return Ok(());
    }
    let [url, mode, in_flight, seconds] = args.as_slice() else {
        return Err(
            "usage: redis_bench URL MODE IN_FLIGHT SECONDS (MODE: pinned, keys, hot, each with -single; naive; denied; spend-keys, spend-hot), or redis_bench script"
                .into(),
        );
    };
    let in_flight: usize = in_flight.parse()?;
    let duration = Duration::from_secs_f64(seconds.parse()?);
    let connection: ConnectionManager = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let single = mode.ends_with("-single");
    let backend = RedisBackend::builder(connection.clone())
        .prefix(format!("bench:{mode}:"))
        .coalesce(!single)
        .build();
    let mode = mode.trim_end_matches("-single").to_owned();
    let hits = Arc::new(AtomicU64::new(0));
    let window = Duration::from_secs(60);

    if mode == "denied" {
        // Put the key over its limit once; every later hit is a local denial.
        let quota = Quota::new(1, window)?;
        backend.hit("b", &Key::new("hot"), quota).await?;
        backend.hit("b", &Key::new("hot"), quota).await?;
    }

    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let backend = backend.clone();
        let mut connection = connection.clone();
        let hits = hits.clone();
        let mode = mode.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                match mode.as_str() {
                    "pinned" => {
                        let key = Key::display(format_args!("{task}-{i}"));
                        backend
                            .hit("b", &key, Quota::new(u64::MAX, window).unwrap())
                            .await
                            .unwrap();
                    }
                    "keys" => {
                        let key = Key::display(format_args!(
                            "k{}",
                            (task as u64 * 7_919 + i) % DISTINCT_KEYS
                        ));
                        backend
                            .hit("b", &key, Quota::new(u64::MAX, window).unwrap())
                            .await
                            .unwrap();
                    }
                    "hot" => {
                        backend
                            .hit("b", &Key::new("hot"), Quota::new(u64::MAX, window).unwrap())
                            .await
                            .unwrap();
                    }
                    "naive" => {
                        let key = format!("bench:naive:b:{task}-{i}");
                        let count: i64 = redis::cmd("INCR")
                            .arg(&key)
                            .query_async(&mut connection)
                            .await
                            .unwrap();
                        if count == 1 {
                            let _: i64 = redis::cmd("PEXPIRE")
                                .arg(&key)
                                .arg(window.as_millis() as u64)
                                .query_async(&mut connection)
                                .await
                                .unwrap();
                        }
                    }
                    "denied" => {
                        let hit = backend
                            .hit("b", &Key::new("hot"), Quota::new(1, window).unwrap())
                            .await
                            .unwrap();
                        assert!(hit.count > 1);
                    }
                    "spend-keys" | "spend-hot" => {
                        let key = if mode == "spend-hot" {
                            Key::new("hot")
                        } else {
                            Key::display(format_args!(
                                "k{}",
                                (task as u64 * 7_919 + i) % DISTINCT_KEYS
                            ))
                        };
                        let counter = Counter {
                            namespace: "b",
                            quota: Quota::new(u64::MAX, window).unwrap(),
                            lowers: false,
                        };
                        backend
                            .spend_all(&key, &[counter], Spend::cost(3))
                            .await
                            .unwrap();
                    }
                    other => panic!("unknown mode {other}"),
                }
                hits.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let hits = hits.load(Ordering::Relaxed);
    println!(
        "{:.0} {hits} {:.2}",
        hits as f64 / elapsed,
        cpu * 1e6 / hits.max(1) as f64
    );
    Ok(())
}

/// The distinct keys of the `keys` modes.
const DISTINCT_KEYS: u64 = 10_000;

/// This process's CPU time so far (user + system), in seconds; 0 where
/// `/proc` is missing.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses): utime is the
    // 12th, stime the 13th, in clock ticks (100 per second on Linux).
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
