//! A local table of storage keys known to be over their limit until a
//! deadline, so that a remote store (Redis now) is not asked again about a
//! key it has already denied. Free of any store's types: keys are bytes,
//! deadlines are instants of this process.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Keys known to be over their limit until a deadline, on this instance.
pub(crate) struct DenyCache {
    pub(crate) capacity: usize,
    hasher: DefaultHashBuilder,
    state: Mutex<DenyState>,
}

struct DenyState {
    table: HashTable<(Box<[u8]>, quanta::Instant)>,
    /// No entry expires before this; a full cache is not swept until then.
    min_deadline: Option<quanta::Instant>,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            hasher: DefaultHashBuilder::default(),
            state: Mutex::new(DenyState {
                table: HashTable::new(),
                min_deadline: None,
            }),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write(key);
        state.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DenyState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Time left while `key` is denied.
    pub(crate) fn check(&self, key: &[u8]) -> Option<Duration> {
        let hash = self.hash(key);
        let now = quanta::Instant::now();
        let mut state = self.lock();
        match state.table.find_entry(hash, |(k, _)| **k == *key) {
            Ok(entry) if entry.get().1 > now => Some(entry.get().1 - now),
            Ok(entry) => {
                entry.remove();
                None
            }
            Err(_) => None,
        }
    }

    pub(crate) fn insert(&self, key: Vec<u8>, deadline: quanta::Instant) {
        let hash = self.hash(&key);
        let now = quanta::Instant::now();
        if deadline <= now {
            return;
        }
        let mut state = self.lock();
        if state.table.len() >= self.capacity {
            if state.min_deadline.is_some_and(|min| min > now) {
                return; // full of live entries: this key just costs a round trip
            }
            state.table.retain(|(_, d)| *d > now);
            state.min_deadline = state.table.iter().map(|(_, d)| *d).min();
            if state.table.len() >= self.capacity {
                return;
            }
        }
        state.min_deadline = Some(state.min_deadline.map_or(deadline, |min| min.min(deadline)));
        let hasher = &self.hasher;
        match state.table.find_entry(hash, |(k, _)| **k == *key) {
            Ok(mut entry) => entry.get_mut().1 = deadline,
            Err(absent) => {
                let table = absent.into_table();
                table.insert_unique(hash, (key.into(), deadline), |(k, _)| {
                    let mut state = hasher.build_hasher();
                    state.write(k);
                    state.finish()
                });
            }
        }
    }

    pub(crate) fn remove(&self, key: &[u8]) {
        let hash = self.hash(key);
        let mut state = self.lock();
        if let Ok(entry) = state.table.find_entry(hash, |(k, _)| **k == *key) {
            entry.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deny_cache_expires_and_stays_bounded() {
        let cache = DenyCache::new(2);
        let now = quanta::Instant::now();
        let later = now + Duration::from_secs(60);
        cache.insert(b"a".to_vec(), later);
        cache.insert(b"b".to_vec(), later);
        cache.insert(b"c".to_vec(), later);
        assert!(cache.check(b"a").is_some());
        assert!(cache.check(b"b").is_some());
        assert_eq!(
            cache.check(b"c"),
            None,
            "a full cache of live entries takes no more"
        );
        cache.remove(b"a");
        assert_eq!(cache.check(b"a"), None);
        cache.insert(b"past".to_vec(), now);
        assert_eq!(
            cache.check(b"past"),
            None,
            "a deadline already gone is not cached"
        );
    }
}
