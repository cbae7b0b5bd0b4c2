//! Hits per second through the Redis backend, for `bench/redis.sh`.
//!
//! ```text
//! cargo run --release -p tower-pinned-window-bench --bin redis_bench -- URL MODE IN_FLIGHT SECONDS
//! cargo run --release -p tower-pinned-window-bench --bin redis_bench -- script
//! ```
//!
//! MODE is `pinned` (this crate's backend, one EVALSHA per hit), `naive`
//! (INCR, then PEXPIRE when the INCR created the key: two round trips), or
//! `denied` (hits on one key over its limit, answered by the deny cache).
//! Every hit of `pinned` and `naive` creates a fresh key, so `naive` always
//! pays its second round trip. Prints one number: hits per second.
//!
//! `script` prints the backend's Lua script (`HIT_SCRIPT`), which the
//! script's ceiling runs through `redis-benchmark`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tower_pinned_window::Quota;
use tower_pinned_window::backend::Backend;
use tower_pinned_window::backend::redis::{HIT_SCRIPT, RedisBackend};
use tower_pinned_window::key::Key;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args == ["script"] {
        print!("{HIT_SCRIPT}");
        return Ok(());
    }
    let [url, mode, in_flight, seconds] = args.as_slice() else {
        return Err(
            "usage: redis_bench URL pinned|naive|denied IN_FLIGHT SECONDS, or redis_bench script"
                .into(),
        );
    };
    let in_flight: usize = in_flight.parse()?;
    let duration = Duration::from_secs_f64(seconds.parse()?);
    let connection: ConnectionManager = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let backend = RedisBackend::builder(connection.clone())
        .prefix(format!("bench:{mode}:"))
        .build();
    let hits = Arc::new(AtomicU64::new(0));
    let window = Duration::from_secs(60);

    if mode == "denied" {
        // Put the key over its limit once; every later hit is a local denial.
        let quota = Quota::new(1, window)?;
        backend.hit("b", &Key::new("hot"), quota).await?;
        backend.hit("b", &Key::new("hot"), quota).await?;
    }

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
    println!("{:.0}", hits.load(Ordering::Relaxed) as f64 / elapsed);
    Ok(())
}
