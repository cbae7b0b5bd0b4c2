//! The in-flight contract's types: a cap on slots, a slot's name, and what a
//! take answers (the trait, [`Leasing`](super::Leasing), is in `mod.rs`
//! beside the other two).

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::Window;

/// At most `max` requests in flight per key, each holding a slot on a
/// `lease`: what an [`InFlightLayer`](crate::InFlightLayer) caps, and what
/// [`Leasing::take`](super::Leasing::take) is asked to keep.
///
/// A slot is created with its lease in one atomic step and lives until it
/// is given back or its lease runs out; a live holder extends its leases
/// long before they run out, so the lease is the longest a crashed holder's
/// slots stay taken. A zero `max` or a zero lease is refused here, where
/// the value is made.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{ConfigError, InFlight};
///
/// let cap = InFlight::new(3, Duration::from_secs(30)).unwrap();
/// assert_eq!(cap.max(), 3);
/// assert_eq!(cap.lease().as_duration(), Duration::from_secs(30));
/// assert_eq!(InFlight::new(0, Duration::from_secs(30)), Err(ConfigError::ZeroInFlight));
/// assert_eq!(InFlight::new(3, Duration::ZERO), Err(ConfigError::NonPositiveWindow));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InFlight {
    max: NonZeroU64,
    lease: Window,
}

impl InFlight {
    /// At most `max` in flight per key, each slot on a lease of `lease`
    /// (rounded up to whole milliseconds).
    ///
    /// # Errors
    /// [`ConfigError::ZeroInFlight`] for a `max` of 0;
    /// [`ConfigError::NonPositiveWindow`] for a zero lease,
    /// [`ConfigError::WindowTooLong`] for one past
    /// [`Window::MAX`](crate::Window::MAX).
    pub fn new(max: u64, lease: Duration) -> Result<Self, ConfigError> {
        let max = NonZeroU64::new(max).ok_or(ConfigError::ZeroInFlight)?;
        Ok(Self {
            max,
            lease: Window::new(lease)?,
        })
    }

    /// The most slots per key.
    #[must_use]
    pub const fn max(&self) -> u64 {
        self.max.get()
    }

    /// Each slot's lease: how long it lives unless its holder extends it.
    #[must_use]
    pub const fn lease(&self) -> Window {
        self.lease
    }
}

/// One cap a [`take`](super::Leasing::take) is asked to keep: the namespace
/// that names the key's slots (with the key; slots never meet a counter of
/// the same namespace) and the cap itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap<'a> {
    /// Names the key's slots together with the key.
    pub namespace: &'a str,
    /// The most slots, and the lease a new slot gets.
    pub in_flight: InFlight,
}

/// The name of one slot: unique across every process that shares a store
/// (a random 64-bit number drawn once per process, then a count), made by
/// the holder before it asks for the slot, so a take that is retried or
/// answered twice never takes two.
///
/// Stores write it as 32 lowercase hex digits (its [`Display`](fmt::Display)).
///
/// ```
/// use tower_pinned_window::backend::SlotId;
///
/// let (a, b) = (SlotId::next(), SlotId::next());
/// assert_ne!(a, b);
/// assert_eq!(a.to_string().len(), 32);
/// assert_eq!(SlotId::from_u128(0xabc).to_string(), "00000000000000000000000000000abc");
/// assert_eq!(SlotId::parse(b"00000000000000000000000000000abc"), Some(SlotId::from_u128(0xabc)));
/// assert_eq!(SlotId::parse(b"abc"), None, "not 32 digits: not a slot");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(u128);

impl SlotId {
    /// A slot name no other call, in this process or another, has made.
    #[must_use]
    pub fn next() -> Self {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            // Seeded by the OS's randomness (std's hasher keys).
            let seed = RandomState::new().hash_one(std::process::id());
            seed ^ RandomState::new().hash_one(std::time::SystemTime::now())
        });
        let count = COUNT.fetch_add(1, Ordering::Relaxed);
        Self(u128::from(process) << 64 | u128::from(count))
    }

    /// The slot of this number (a store's tests, a slot read back).
    #[must_use]
    pub const fn from_u128(id: u128) -> Self {
        Self(id)
    }

    /// Its number.
    #[must_use]
    pub const fn as_u128(&self) -> u128 {
        self.0
    }

    /// The slot named by `text`, as [`Display`](fmt::Display) writes it:
    /// 32 lowercase hex digits, nothing else (a store's record read back;
    /// anything else is not a slot, and a record holding it is corrupt).
    #[must_use]
    pub fn parse(text: &[u8]) -> Option<Self> {
        if text.len() != 32
            || !text
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return None;
        }
        let text = std::str::from_utf8(text).ok()?;
        u128::from_str_radix(text, 16).ok().map(Self)
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What a [`take`](super::Leasing::take) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Whether the slot was taken (created with its lease).
    pub granted: bool,
    /// The slots of the key held after the step, live leases only: this
    /// one included when granted; when refused, the cap's `max` or more.
    pub in_use: u64,
    /// When refused, the time until the earliest live lease of the key
    /// runs out: the longest a slot can stay taken unless its holder
    /// extends it (a slot given back frees it sooner). Zero when granted.
    pub retry: Duration,
}

/// One slot a holder still holds, named for
/// [`extend`](super::Leasing::extend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    /// The cap's namespace.
    pub namespace: &'a str,
    /// The key the slot was taken for.
    pub key: &'a Key,
    /// The slot.
    pub slot: SlotId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_read_back_and_refuse_anything_else() {
        for id in [0, 1, u128::MAX, SlotId::next().as_u128()] {
            let slot = SlotId::from_u128(id);
            assert_eq!(SlotId::parse(slot.to_string().as_bytes()), Some(slot));
        }
        for bad in [
            "",
            "0",
            "0000000000000000000000000000000g",
            "0000000000000000000000000000000A",
            "+0000000000000000000000000000000",
            "000000000000000000000000000000000",
        ] {
            assert_eq!(SlotId::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn slots_made_in_a_row_differ_and_share_the_process_half() {
        let a = SlotId::next().as_u128();
        let b = SlotId::next().as_u128();
        assert_ne!(a, b);
        assert_eq!(a >> 64, b >> 64);
    }
}
