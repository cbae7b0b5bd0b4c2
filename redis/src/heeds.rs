//! The provider's word ([`Heeding`](tower_pinned_window::backend::Heeding)):
//! a close and a raise, each one call of its script (`close.lua`,
//! `raise.lua`) on the key's master, through the guarded connection (its
//! breaker, and its `WAIT` in the replica-acknowledged mode), as a reset
//! is sent. No lane: a provider speaks rarely (a `429`, a header that says
//! something new), so nothing is there to share a call with.
//!
//! A close names the counter and its lockout marker
//! (`storage_key::encode_lockout`: the counter's storage key and `:lock`),
//! which share the key's hash tag, so one Cluster slot; a raise names the
//! counter alone. Both read the server's clock (`TIME`).

use std::time::Duration;

use ::redis::aio::ConnectionLike;

use super::connection::classify::unavailable;
use super::connection::guarded::Guarded;
use super::reply::{parse_close, parse_raise};
use super::script::{CLOSE, RAISE, Size, U64_DIGITS};
use tower_pinned_window::Window;
use tower_pinned_window::backend::{BackendError, Hit};

/// Close the counter at `counter` for `span`: its lockout at `lock`
/// created with that lifetime, or moved later, never sooner. The time left
/// of the lockout after the step.
pub(super) async fn close<C>(
    connection: &Guarded<C>,
    counter: &[u8],
    lock: &[u8],
    span: Window,
) -> Result<Duration, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let size = Size {
        keys: 2,
        args: 3,
        bytes: counter.len() + lock.len() + U64_DIGITS,
    };
    let reply = CLOSE
        .run(&mut connection.for_write(counter), size, |cmd| {
            cmd.arg(counter).arg(lock).arg(span.as_millis());
        })
        .await
        .map_err(unavailable)?;
    parse_close(reply, counter)
}

/// What a raise asks of a counter: at least `count`, at most `limit`; a
/// counter it creates lives `min(window, within)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Raise {
    pub(super) count: u64,
    pub(super) limit: u64,
    pub(super) window: Window,
    pub(super) within: Window,
}

/// The most a Redis counter holds (`INCRBY` counts in signed 64 bits): a
/// count or a limit past it is sent as it.
const MOST: u64 = i64::MAX as u64;

/// Raise the counter at `counter` as `raise` asks: the counter after the
/// step.
pub(super) async fn raise<C>(
    connection: &Guarded<C>,
    counter: &[u8],
    raise: Raise,
) -> Result<Hit, BackendError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let size = Size {
        keys: 1,
        args: 5,
        bytes: counter.len() + 4 * U64_DIGITS,
    };
    let reply = RAISE
        .run(&mut connection.for_write(counter), size, |cmd| {
            cmd.arg(counter)
                .arg(raise.count.min(MOST))
                .arg(raise.limit.min(MOST))
                .arg(raise.window.as_millis())
                .arg(raise.within.as_millis());
        })
        .await
        .map_err(unavailable)?;
    parse_raise(reply, counter)
}
