//! The backstop: list every limiter key without a lifetime, then a summary.
//!
//! ```text
//! cargo run -p tower-pinned-window-redis --example audit -- REDIS_URL [--prefix tpw:] [--repair SECONDS]
//! cargo run -p tower-pinned-window-redis --example audit --features cluster -- --cluster URL [URL ...] [--repair SECONDS]
//! ```
//!
//! Without `--repair` it changes nothing. With it, each counter found without
//! a lifetime is given that window (its count is kept); keys that are not
//! counters are listed as corrupt and never touched. Exits with 1 when any
//! key without a lifetime was found, so it can drive an alert.

use std::time::Duration;

use tower_pinned_window::Window;
use tower_pinned_window::backend::AuditReport;
use tower_pinned_window_redis::{DEFAULT_PREFIX, RedisBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut urls = Vec::new();
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut repair = None;
    let mut cluster = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--prefix" => prefix = args.next().ok_or("--prefix needs a value")?,
            "--repair" => {
                let secs: f64 = args.next().ok_or("--repair needs SECONDS")?.parse()?;
                repair = Some(Window::try_from_secs_f64(secs)?);
            }
            "--cluster" => cluster = true,
            "-h" | "--help" => {
                println!(
                    "usage: audit REDIS_URL [--prefix P] [--repair SECONDS] | audit --cluster URL... [--repair SECONDS]"
                );
                return Ok(());
            }
            url => urls.push(url.to_string()),
        }
    }
    if urls.is_empty() {
        return Err("give the Redis URL (redis://host:port/)".into());
    }

    let report = if cluster {
        audit_cluster(urls, &prefix, repair).await?
    } else {
        let client = redis::Client::open(urls[0].as_str())?;
        let connection = client.get_multiplexed_async_connection().await?;
        RedisBackend::builder(connection)
            .try_prefix(prefix.as_str())?
            .deny_cache(0)
            .build()
            .audit(repair)
            .await?
    };

    for key in &report.without_lifetime {
        let corrupt = report.corrupt.contains(key);
        println!(
            "{key}{}",
            if corrupt {
                "  (corrupt: not a counter, left untouched)"
            } else {
                ""
            }
        );
    }
    println!(
        "nodes={} scanned={} without_lifetime={} repaired={} corrupt={}{}",
        report.nodes,
        report.scanned,
        report.without_lifetime.len(),
        report.repaired.len(),
        report.corrupt.len(),
        repair.map_or(String::new(), |w| format!(
            " window={:?}",
            Duration::from_millis(w.as_millis())
        ))
    );
    if !report.without_lifetime.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(feature = "cluster")]
async fn audit_cluster(
    urls: Vec<String>,
    prefix: &str,
    repair: Option<Window>,
) -> Result<AuditReport, Box<dyn std::error::Error>> {
    let connection = redis::cluster::ClusterClient::new(urls)?
        .get_async_connection()
        .await?;
    Ok(RedisBackend::builder(connection)
        .try_prefix(prefix)?
        .deny_cache(0)
        .build()
        .audit(repair)
        .await?)
}

#[cfg(not(feature = "cluster"))]
async fn audit_cluster(
    _: Vec<String>,
    _: &str,
    _: Option<Window>,
) -> Result<AuditReport, Box<dyn std::error::Error>> {
    Err("--cluster needs the cluster feature: cargo run -p tower-pinned-window-redis --example audit --features cluster".into())
}
