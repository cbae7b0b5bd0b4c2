//! A deploy kills the request that created a rate-limit key, between its
//! `INCR` and its `EXPIRE`. This replays that against a real Redis, time
//! compressed (one "minute" is one second by default), for two limiters side
//! by side: the common two-call one, and this crate's Redis backend.
//!
//! A 6-minute sale, one user sending 50 requests a minute, a limit of 100 a
//! minute. The deploy lands on the user's first request, in minute 1.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p tower-pinned-window-redis --example deploy_crash
//! ```
//!
//! Its keys live under a prefix unique to the run and are deleted at the end.
//! `MINUTE_MS` sets the length of a compressed minute.
//!
//! Each row shows the key as Redis holds it when the minute's last request
//! has been made: its count and the lifetime it has left. The pinned
//! window is the user's, not the clock's: it opens with the first request
//! that finds no counter, and lasts exactly a minute. Its count is the
//! requests made since it opened, its lifetime what is left of it.
//!
//! - Minute 1 reads 50 or 49: the deploy drops the first request while its
//!   script is in flight, and the script runs whole or not at all. When it
//!   ran, the window opened with it; when not, with the second request,
//!   20 ms later (with the default 1 s minute), and it outlives the minute
//!   by about that much more.
//! - The counts then go down (49, 48, ...) and the lifetimes up (tens of
//!   ms, up to about 120): requests come exactly 20 ms apart and a window
//!   lasts exactly 50 of them, so the request due when a window ends races
//!   its lifetime. When it reaches Redis first, it is counted in the old
//!   window, and the next window opens with the request after it. Each
//!   window thus starts a request or two later than the one before, and
//!   how often that happens depends on the latency, from run to run.
//!
//! Either way each window holds at most 100 requests and always ends. The
//! naive key has no lifetime from the first request on: its count only
//! grows, and from minute 3 every request is denied.

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::time::{Instant, sleep_until};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::Backend;
use tower_pinned_window::key::Key;
use tower_pinned_window_redis::RedisBackend;

const MINUTES: u32 = 6;
const PER_MINUTE: u32 = 50;
const LIMIT: u64 = 100;

#[derive(Default, Clone, Copy)]
struct Tally {
    allowed: u32,
    denied: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let minute = Duration::from_millis(
        std::env::var("MINUTE_MS")
            .ok()
            .map_or(Ok(1000), |v| v.parse())?,
    );
    let run = format!("deploy-crash:{}:", std::process::id());
    let naive_key = format!("{run}naive:user");

    let mut con: ConnectionManager = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let pinned = RedisBackend::builder(con.clone())
        .prefix(format!("{run}pinned:"))
        .deny_cache(0)
        .build();
    let quota = Quota::new(LIMIT, minute)?;
    let user = Key::new("user");
    let pinned_key = String::from_utf8(pinned.storage_key("sale", &user))?;

    println!(
        "{MINUTES}-minute sale, {PER_MINUTE} requests a minute, limit {LIMIT} a minute; one minute = {minute:?}"
    );
    println!("a deploy kills the user's first request in minute 1, between INCR and EXPIRE\n");
    println!(
        "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
        "minute", "naive", "", "", "", "pinned", "", "", ""
    );
    println!(
        "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
        "", "allowed", "denied", "count", "lifetime", "allowed", "denied", "count", "lifetime"
    );

    let (mut naive_total, mut pinned_total) = (Tally::default(), Tally::default());
    let mut first_denied_minute = None;
    let start = Instant::now();
    for m in 0..MINUTES {
        let (mut naive_minute, mut pinned_minute) = (Tally::default(), Tally::default());
        for i in 0..PER_MINUTE {
            sleep_until(start + minute * m + minute * i / PER_MINUTE).await;
            let deploy = m == 0 && i == 0;

            // The common limiter: INCR, then EXPIRE in a second call when the
            // INCR created the key. The deploy kills it in between.
            let count: u64 = con.incr(&naive_key, 1).await?;
            if count == 1 && !deploy {
                let _: bool = con.pexpire(&naive_key, minute.as_millis() as i64).await?;
            }
            tally(&mut naive_minute, count <= LIMIT);

            // This crate: one atomic script. The deploy drops the request
            // while its hit is in flight: the script ran whole or not at all.
            let hit = pinned.hit("sale", &user, quota);
            if deploy {
                let _ = tokio::time::timeout(Duration::from_micros(1), hit).await;
                tally(&mut pinned_minute, true);
            } else {
                tally(&mut pinned_minute, hit.await?.count <= LIMIT);
            }
        }
        if naive_minute.denied > 0 && first_denied_minute.is_none() {
            first_denied_minute = Some(m + 1);
        }
        let naive_state = state(&mut con, &naive_key).await?;
        let pinned_state = state(&mut con, &pinned_key).await?;
        println!(
            "{:>6} | {:>7} {:>6} {:>5} {:>9} | {:>7} {:>6} {:>5} {:>9}",
            m + 1,
            naive_minute.allowed,
            naive_minute.denied,
            naive_state.0,
            naive_state.1,
            pinned_minute.allowed,
            pinned_minute.denied,
            pinned_state.0,
            pinned_state.1
        );
        add(&mut naive_total, naive_minute);
        add(&mut pinned_total, pinned_minute);
    }
    let (final_count, ttl) = state(&mut con, &naive_key).await?;
    let _: () = con.del(&[naive_key.as_str(), pinned_key.as_str()]).await?;

    println!(
        "\ncount, lifetime: the key's count and time left as each minute ends. The pinned window opens with the \
         first request that finds no counter, so it starts a request ({:?}) later now and then: counts 50, 49, 48..., \
         lifetimes growing (see this file's docs).",
        minute / PER_MINUTE
    );
    println!(
        "\nnaive: allowed={} denied={} first_denied_minute={} final_count={} ttl={} | pinned: allowed={} denied={}",
        naive_total.allowed,
        naive_total.denied,
        first_denied_minute.map_or("none".to_string(), |m| m.to_string()),
        final_count,
        ttl,
        pinned_total.allowed,
        pinned_total.denied
    );
    Ok(())
}

fn tally(t: &mut Tally, allowed: bool) {
    if allowed {
        t.allowed += 1;
    } else {
        t.denied += 1;
    }
}

fn add(total: &mut Tally, minute: Tally) {
    total.allowed += minute.allowed;
    total.denied += minute.denied;
}

/// The key's count and lifetime as Redis holds them now.
async fn state(con: &mut ConnectionManager, key: &str) -> redis::RedisResult<(String, String)> {
    let count: Option<u64> = con.get(key).await?;
    let ttl: i64 = con.pttl(key).await?;
    let ttl = match ttl {
        -1 => "none".to_string(),
        -2 => "-".to_string(),
        ms => format!("{ms}ms"),
    };
    Ok((count.map_or("-".to_string(), |c| c.to_string()), ttl))
}
