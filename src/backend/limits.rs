//! Limits held in the store ([`Limits`]): what a layer's quota is for the
//! layer, a tier or one key, set by the application while the service runs
//! and read by every instance. The layers read them through a
//! [`LimitBook`](crate::LimitBook), with a bounded staleness and no store
//! call on the request path.
//!
//! [`Limits`] says the contract.

use std::collections::HashMap;
use std::future::Future;

use crate::backend::{Backend, BackendError};
use crate::key::Key;
use crate::quota::{Quota, Window};

/// Where a limit held in the store applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitScope<'a> {
    /// The layer's own quota.
    Layer,
    /// A tier: the name of the [`NamedQuota`](crate::NamedQuota) a
    /// [`quota_by`](crate::RateLimitLayer::quota_by) closure picks.
    Tier(&'a str),
    /// One key.
    Key(&'a Key),
}

/// Every limit a layer has in the store, as [`Limits::limits`] read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredLimits {
    layer: Option<Quota>,
    tiers: HashMap<Box<str>, Quota>,
    keys: HashMap<Box<[u8]>, Quota>,
    corrupt: usize,
}

impl StoredLimits {
    /// No limits.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one stored entry as the store holds it: its scope as
    /// [`encode_scope`] made it and its value as [`encode_limit`] made it.
    /// An entry that is not a limit, or whose scope is not one, is left
    /// out, counted as [`corrupt`](Self::corrupt) and logged.
    pub fn insert_stored(&mut self, scope: &[u8], value: &[u8]) {
        let Some(quota) = decode_limit(value) else {
            self.corrupt += 1;
            tracing::warn!(
                value = %String::from_utf8_lossy(value),
                "a stored limit is not a limit: the layer's own quota applies"
            );
            return;
        };
        match scope {
            b"layer" => self.layer = Some(quota),
            _ => {
                if let Some(tier) = scope.strip_prefix(b"tier:") {
                    if let Ok(tier) = std::str::from_utf8(tier) {
                        self.tiers.insert(tier.into(), quota);
                        return;
                    }
                } else if let Some(key) = scope.strip_prefix(b"key:") {
                    self.keys.insert(key.into(), quota);
                    return;
                }
                self.corrupt += 1;
                tracing::warn!("a stored limit has a scope that is none: left out");
            }
        }
    }

    /// Set the limit of `scope` (`None`: remove it), as a store in this
    /// process keeps them.
    pub fn set(&mut self, scope: LimitScope<'_>, quota: Option<Quota>) {
        match (scope, quota) {
            (LimitScope::Layer, quota) => self.layer = quota,
            (LimitScope::Tier(tier), Some(quota)) => {
                self.tiers.insert(tier.into(), quota);
            }
            (LimitScope::Tier(tier), None) => {
                self.tiers.remove(tier);
            }
            (LimitScope::Key(key), Some(quota)) => {
                self.keys.insert(key.as_bytes().into(), quota);
            }
            (LimitScope::Key(key), None) => {
                self.keys.remove(key.as_bytes());
            }
        }
    }

    /// The limit of `scope`, if one is stored.
    #[must_use]
    pub fn get(&self, scope: LimitScope<'_>) -> Option<Quota> {
        match scope {
            LimitScope::Layer => self.layer,
            LimitScope::Tier(tier) => self.tiers.get(tier).copied(),
            LimitScope::Key(key) => self.keys.get(key.as_bytes()).copied(),
        }
    }

    /// The limit of the key whose bytes are `key`, if one is stored.
    pub(crate) fn key(&self, key: &[u8]) -> Option<Quota> {
        if self.keys.is_empty() {
            return None;
        }
        self.keys.get(key).copied()
    }

    /// How many limits are stored (the layer's, tiers' and keys').
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.layer.is_some()) + self.tiers.len() + self.keys.len()
    }

    /// Whether no limit is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tiers' limits, by tier name.
    pub fn tiers(&self) -> impl Iterator<Item = (&str, Quota)> {
        self.tiers.iter().map(|(tier, quota)| (&**tier, *quota))
    }

    /// The keys' limits, by the key's bytes.
    pub fn keys(&self) -> impl Iterator<Item = (&[u8], Quota)> {
        self.keys.iter().map(|(key, quota)| (&**key, *quota))
    }

    /// How many stored entries were not limits and were left out.
    #[must_use]
    pub fn corrupt(&self) -> usize {
        self.corrupt
    }
}

/// A scope as a store keeps it: `layer`, `tier:NAME` or `key:BYTES`. The
/// three forms never meet: a tier and a key of the same bytes are two
/// scopes.
#[must_use]
pub fn encode_scope(scope: LimitScope<'_>) -> Vec<u8> {
    match scope {
        LimitScope::Layer => b"layer".to_vec(),
        LimitScope::Tier(tier) => [b"tier:", tier.as_bytes()].concat(),
        LimitScope::Key(key) => [b"key:", key.as_bytes()].concat(),
    }
}

/// A limit as a store keeps it: `LIMIT/WINDOWms`.
#[must_use]
pub fn encode_limit(quota: Quota) -> String {
    format!("{}/{}ms", quota.limit(), quota.window().as_millis())
}

/// A stored limit read back: `None` for anything [`encode_limit`] does not
/// make a quota of (not UTF-8, a zero or negative limit, a zero window,
/// text). Never "no limit".
#[must_use]
pub fn decode_limit(value: &[u8]) -> Option<Quota> {
    let text = std::str::from_utf8(value).ok()?;
    let (limit, window) = text.split_once('/')?;
    let window = window.strip_suffix("ms")?;
    let limit: u64 = limit.parse().ok()?;
    let window: i64 = window.parse().ok()?;
    let window = Window::try_from_millis(window).ok()?;
    Some(Quota::with_window(
        std::num::NonZeroU64::new(limit)?,
        window,
    ))
}

/// A [`Backend`] that also holds limits: what a
/// [`LimitBook`](crate::LimitBook) reads and writes. The memory backend,
/// Redis and PostgreSQL implement it.
///
/// # The contract
///
/// - A limit is a [`Quota`] per layer name and [`LimitScope`]: the layer as a
///   whole, a tier (by the name of the [`NamedQuota`](crate::NamedQuota) a
///   `quota_by` closure picks), or one key. A store keeps the scopes of two
///   layers, and a tier and a key of the same bytes, apart.
/// - [`set_limit`](Limits::set_limit) writes one limit, or removes it
///   (`None`), in one step; it never touches a counter.
/// - [`limits`](Limits::limits) reads every limit of a layer in one step. A
///   stored value that is not a limit (written by hand, or by another
///   program) is never read as "no limit" and never fails the read: it is
///   left out and counted in [`StoredLimits::corrupt`], so the layer's own
///   quota applies to that scope and the reader can report it.
/// - Values are stored as `LIMIT/WINDOWms` ([`encode_limit`]), read back
///   with [`decode_limit`]; scopes as [`encode_scope`] makes them.
pub trait Limits: Backend {
    /// Write the limit of `scope` for `layer`, or remove it (`None`), in
    /// one step. Never touches a counter.
    fn set_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Option<Quota>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'static;

    /// Every limit `layer` has, in one step; stored values that are not
    /// limits are left out and counted ([`StoredLimits::corrupt`]).
    fn limits(
        &self,
        layer: &str,
    ) -> impl Future<Output = Result<StoredLimits, BackendError>> + Send + 'static;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stored_limits_read_back_and_anything_else_is_left_out() {
        let quota = Quota::new(50, Duration::from_millis(1500)).unwrap();
        assert_eq!(encode_limit(quota), "50/1500ms");
        assert_eq!(decode_limit(encode_limit(quota).as_bytes()), Some(quota));
        for bad in [
            &b"0/1000ms"[..],
            b"-1/1000ms",
            b"10/0ms",
            b"10/-5ms",
            b"10/1000",
            b"ten/1000ms",
            b"",
            b"\xff/1ms",
            b"99999999999999999999999/1ms",
        ] {
            assert_eq!(decode_limit(bad), None, "{bad:?}");
        }
        let mut stored = StoredLimits::new();
        stored.insert_stored(b"layer", b"5/1000ms");
        stored.insert_stored(b"tier:pro", b"nonsense");
        stored.insert_stored(b"what", b"5/1000ms");
        stored.insert_stored(b"key:k", b"7/1000ms");
        assert_eq!(stored.corrupt(), 2);
        assert_eq!(stored.len(), 2);
        assert_eq!(stored.get(LimitScope::Tier("pro")), None);
        assert_eq!(
            stored.get(LimitScope::Key(&Key::new("k"))).unwrap().limit(),
            7
        );
    }

    #[test]
    fn scopes_of_the_same_bytes_never_meet() {
        let key = Key::new("pro");
        let forms = [
            encode_scope(LimitScope::Layer),
            encode_scope(LimitScope::Tier("pro")),
            encode_scope(LimitScope::Key(&key)),
            encode_scope(LimitScope::Key(&Key::new("layer"))),
        ];
        for (i, a) in forms.iter().enumerate() {
            for b in &forms[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
