//! What the soak programs (`bin/soak.rs`, `bin/outbound_soak.rs`) read from
//! their environment, and their clock: one copy for both.

use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use tower_pinned_window::{FailurePolicy, Share};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `name` from the environment, or `default` when it is not set.
pub fn env<T: FromStr>(name: &str, default: T) -> Result<T, Error>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| format!("{name}={v}: {e}").into()),
        Err(_) => Ok(default),
    }
}

/// `name` from the environment, which must be set.
#[allow(dead_code, reason = "not every soak program needs it")]
pub fn required<T: FromStr>(name: &str) -> Result<T, Error>
where
    T::Err: std::fmt::Display,
{
    let v = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
    v.parse().map_err(|e| format!("{name}={v}: {e}").into())
}

/// Microseconds since the Unix epoch: the processes' common clock.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as u64
}

/// `INSURE_SHARE` (`N/D`), when set.
#[allow(dead_code, reason = "not every soak program needs it")]
pub fn insure_share() -> Result<Option<Share>, Error> {
    match std::env::var("INSURE_SHARE") {
        Ok(text) => Ok(Some(
            text.parse()
                .map_err(|e| format!("INSURE_SHARE={text}: {e}"))?,
        )),
        Err(_) => Ok(None),
    }
}

/// Insurance at `INSURE_SHARE` when it is set, else failing closed.
#[allow(dead_code, reason = "not every soak program needs it")]
pub fn failure_policy() -> Result<FailurePolicy, Error> {
    Ok(insure_share()?.map_or(FailurePolicy::FailClosed, FailurePolicy::Insurance))
}
