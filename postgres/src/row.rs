//! A counter's row, read: what the hit statement returned, a row as it
//! stands (checked as the hit statement checks it), its deadline as
//! [`Hit::deadline`], and how errors and logs name it.

use std::num::NonZeroU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Row;

use tower_pinned_window::Window;
use tower_pinned_window::backend::Hit;
use tower_pinned_window::backend::toolkit::storage_key;
use tower_pinned_window::key::{Key, MAX_KEY_LEN};

/// [`Window::MAX`] in milliseconds: the statements refuse any window, and
/// any row's deadline, further away.
pub(super) const WINDOW_BOUND_MS: i64 = Window::MAX.as_millis() as i64;

/// A counter's row as the hit statement returned it: the count, the
/// window's `expires_at`, and the database's clock when it ran.
#[derive(Debug, Clone, Copy)]
pub(super) struct HitRow {
    pub(super) count: u64,
    pub(super) expires_at: SystemTime,
    pub(super) now: SystemTime,
}

impl HitRow {
    /// The hit it tells of.
    pub(super) fn hit(self) -> Hit {
        Hit {
            count: self.count,
            reset: self
                .expires_at
                .duration_since(self.now)
                .unwrap_or(Duration::ZERO),
            deadline: deadline_id(self.expires_at),
        }
    }
}

/// A window's `expires_at` as [`Hit::deadline`]: Unix microseconds, the
/// column's own precision, so it converts back exactly.
pub(super) fn deadline_id(expires_at: SystemTime) -> Option<NonZeroU64> {
    let micros = expires_at.duration_since(UNIX_EPOCH).ok()?.as_micros();
    NonZeroU64::new(u64::try_from(micros).ok()?)
}

/// The `expires_at` a [`Hit::deadline`] names.
pub(super) fn deadline_time(deadline: NonZeroU64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(deadline.get())
}

/// How a counter is named in errors and logs: the table, then the
/// counter's [canonical storage key](storage_key) (`api{203.0.113.7}`), as
/// the other backends name it. A key no hit can have written (longer than
/// a [`Key`]) is shown escaped.
pub(super) fn describe(table: &str, namespace: &str, key: &[u8]) -> String {
    if key.len() <= MAX_KEY_LEN {
        let name = storage_key::encode(b"", namespace, &Key::new(key));
        format!("{table} {}", String::from_utf8_lossy(&name))
    } else {
        format!("{table} {namespace}{{{}}}", key.escape_ascii())
    }
}

/// A row as it stands (count, expires_at, now), checked as the hit statement
/// checks it: `Ok(None)` when its window has closed.
pub(super) fn read_row(row: &Row) -> Result<Option<Hit>, String> {
    let count: Option<i64> = row.try_get(0).map_err(|e| e.to_string())?;
    // `infinity` arrives as a time past the bound, and is caught below.
    let expires_at: Option<SystemTime> = row.try_get(1).map_err(|e| e.to_string())?;
    let now: SystemTime = row.try_get(2).map_err(|e| e.to_string())?;
    let count = match count {
        None => return Err("count is NULL".to_owned()),
        Some(c) if c < 0 => return Err(format!("negative count {c}")),
        Some(i64::MAX) => return Err(format!("count {} cannot grow", i64::MAX)),
        Some(c) => c as u64,
    };
    let Some(expires_at) = expires_at else {
        return Err(format!("count {count} with no expiry (expires_at is NULL)"));
    };
    match expires_at.duration_since(now) {
        Err(_) => Ok(None),
        Ok(left) if left.is_zero() => Ok(None),
        Ok(left) if left > Window::MAX.as_duration() => Err(format!(
            "count {count} with expires_at {} s away, past the {} s bound (or infinity)",
            left.as_secs(),
            Window::MAX.as_duration().as_secs()
        )),
        Ok(left) => Ok(Some(Hit {
            count,
            reset: left,
            deadline: None,
        })),
    }
}
