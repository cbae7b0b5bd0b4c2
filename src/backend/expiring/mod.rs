//! A bounded, sharded table of entries that each live until a deadline:
//! the memory backend's counters and the deny cache's denials are both
//! held in one.
//!
//! An entry is named by an [`Id`] (its namespace and key) and holds a
//! deadline, in nanoseconds since an epoch its owner chooses, and a value
//! of the owner's type (a count, or nothing). The table reclaims expired
//! entries itself as new ones arrive, with no task to schedule: a shard is
//! swept whenever it has doubled since its last sweep, and before it
//! refuses a new entry. A shard full of **live** entries refuses new ones:
//! nothing live is ever evicted. Checking that nothing can be reclaimed
//! costs O(1), so a flood at the cap cannot make each insert scan the
//! shard.
//!
//! Each shard publishes how many entries it holds, so that a reader who
//! only needs to know whether an entry may be there (the deny cache, asked
//! about every request while nobody is denied) reads one atomic and takes
//! no lock.

pub(crate) mod id;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::{DefaultHashBuilder, HashTable};

use id::{Id, KeyBytes, Names, Scratch, StoredId, short_word_hash};

/// A shard is swept of expired entries at least once each time it doubles.
pub(crate) const MIN_SWEEP_LEN: usize = 64;

/// Entries held until their deadlines, in shards that are each behind a
/// read-write lock: a lookup takes the read lock, so lookups on one shard
/// (and of one entry) don't wait for each other; a change takes the write
/// lock.
#[derive(Debug)]
pub(crate) struct Table<V> {
    hasher: DefaultHashBuilder,
    names: Names,
    shards: Box<[Shard<V>]>,
    shard_bits: u32,
}

/// One shard: its entries, behind their lock, and their count, published.
/// The lock comes first (`repr(C)`), at the shard's own address, so that a
/// lookup addresses the lock and the entries from one pointer: with the
/// count in front, every hit paid two instructions more.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Shard<V> {
    slots: RwLock<Slots<V>>,
    /// How many entries the shard holds, written under the write lock after
    /// each change of the number. Read without the lock, it may be a moment
    /// stale: it can miss only an entry being written.
    held: AtomicUsize,
}

/// A shard's entries.
#[derive(Debug)]
pub(crate) struct Slots<V> {
    /// Entries with a short id (see [`Names`]).
    short: HashTable<ShortSlot<V>>,
    /// Every other entry.
    long: HashTable<LongSlot<V>>,
    /// The most live entries this shard holds: its exact share of the
    /// table's capacity.
    cap: usize,
    /// Sweep when the shard holds this many.
    sweep_at: usize,
    /// No entry expires before this.
    min_deadline: u64,
}

/// What the table holds for an id: a deadline, and a value.
#[derive(Debug)]
pub(crate) struct Entry<V> {
    /// Nanoseconds since the owner's epoch; changed only under the write
    /// lock (through [`EntryMut`]).
    deadline: u64,
    /// The owner's: an atomic value may change under the read lock.
    pub(crate) value: V,
}

/// An entry with a short id: 32 bytes for a value of up to 8 bytes,
/// aligned to 32, so two share a cache line and none straddles two. Over
/// 100k keys the table is half the size it would be with 64-byte slots,
/// and the difference decides how often a lookup waits on memory.
#[derive(Debug)]
#[repr(align(32))]
struct ShortSlot<V> {
    /// The tag (the namespace's short id, then the key's length, four bits
    /// each) in the low byte, then the key, zero-padded.
    id: u128,
    entry: Entry<V>,
}

/// Any other entry: 64 bytes for a value of up to 8 bytes, aligned to 64,
/// so the table holds each in one cache line: a lookup of a key that is not
/// in cache misses once for its entry, not twice.
#[derive(Debug)]
#[repr(align(64))]
struct LongSlot<V> {
    id: StoredId,
    entry: Entry<V>,
}

const _: () = assert!(
    size_of::<ShortSlot<u64>>() == 32
        && size_of::<LongSlot<u64>>() == 64
        && size_of::<ShortSlot<()>>() == 32
        && size_of::<LongSlot<()>>() == 64,
    "a short slot is half a cache line, a long one a whole line"
);

impl<V> Entry<V> {
    pub(crate) fn new(deadline: u64, value: V) -> Self {
        Self { deadline, value }
    }

    /// When the entry expires: it is live while this is after `now`.
    #[inline(always)]
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline
    }

    /// What the entry holds beside its deadline.
    #[inline(always)]
    pub(crate) fn value(&self) -> &V {
        &self.value
    }
}

impl<V> Table<V> {
    /// A table of at most `capacity` live entries, in as many shards as
    /// `most` (a power of two) but no shard under `min_per_shard` entries
    /// (and at least one). The capacity is split exactly: the shards' caps
    /// (each `capacity / shards` or one more) add up to `capacity`.
    pub(crate) fn new(capacity: usize, most: usize, min_per_shard: usize) -> Self {
        debug_assert!(most.is_power_of_two());
        let fit = 1 << (capacity / min_per_shard).max(1).ilog2();
        let shards = most.min(fit);
        // The exact split: the first `extra` shards hold one entry more.
        let (share, extra) = (capacity / shards, capacity % shards);
        Self {
            hasher: DefaultHashBuilder::default(),
            names: Names::default(),
            shards: (0..shards)
                .map(|i| Shard {
                    slots: RwLock::new(Slots {
                        short: HashTable::new(),
                        long: HashTable::new(),
                        cap: share + usize::from(i < extra),
                        sweep_at: MIN_SWEEP_LEN,
                        min_deadline: u64::MAX,
                    }),
                    held: AtomicUsize::new(0),
                })
                .collect(),
            shard_bits: shards.trailing_zeros(),
        }
    }

    /// An empty table of the same shards, caps and hasher as this one: an
    /// [`Id`] built by this table's [`id`](Self::id) has the same hash in
    /// both, and its entry goes to the shard of the same index in each
    /// ([`shard_of`](Self::shard_of) finds it from the hash), so one hash
    /// of a key serves both tables. Its entries are only ever named by ids
    /// built by this table: its own namespaces' short ids may differ.
    pub(crate) fn sibling<W>(&self) -> Table<W> {
        Table {
            hasher: self.hasher.clone(),
            names: Names::default(),
            shards: self
                .shards
                .iter()
                .map(|shard| Shard {
                    slots: RwLock::new(Slots {
                        short: HashTable::new(),
                        long: HashTable::new(),
                        cap: shard.read().cap,
                        sweep_at: MIN_SWEEP_LEN,
                        min_deadline: u64::MAX,
                    }),
                    held: AtomicUsize::new(0),
                })
                .collect(),
            shard_bits: self.shard_bits,
        }
    }

    /// The shard of an id whose hash is `hash` (what
    /// [`locate`](Self::locate) gives with it).
    #[inline(always)]
    pub(crate) fn shard_of(&self, hash: u64) -> &Shard<V> {
        &self.shards[shard_index(hash, self.shard_bits)]
    }

    /// How many shards the table has.
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Live and expired-but-unswept entries held now, as the shards last
    /// published it.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(Shard::held).sum()
    }

    /// The id of (`namespace`, `key`), built in `scratch` when it is long.
    #[inline(always)]
    pub(crate) fn id<'a>(
        &self,
        namespace: &'a str,
        key: KeyBytes<'a>,
        scratch: &'a mut Scratch,
    ) -> Id<'a> {
        Id::new(&self.names, namespace, key, scratch)
    }

    /// The hash of `id` and its shard.
    #[inline(always)]
    pub(crate) fn locate(&self, id: &Id<'_>) -> (u64, &Shard<V>) {
        let hash = id.hash(&self.hasher);
        (hash, self.shard_of(hash))
    }

    /// The shard's entries, to change.
    pub(crate) fn write<'a>(&'a self, shard: &'a Shard<V>) -> SlotsMut<'a, V> {
        SlotsMut {
            slots: shard
                .slots
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            held: &shard.held,
            hasher: &self.hasher,
        }
    }

    /// Every shard's entries, for tests to look into.
    #[cfg(test)]
    pub(crate) fn each(&self) -> impl Iterator<Item = RwLockReadGuard<'_, Slots<V>>> {
        self.shards.iter().map(Shard::read)
    }

    /// Whether every shard publishes its length.
    #[cfg(test)]
    pub(crate) fn published(&self) -> bool {
        self.shards.iter().all(|s| s.held() == s.read().len())
    }
}

impl<V> Shard<V> {
    /// How many entries the shard held when it was last changed: 0 means the
    /// entry looked for is not there, or is being written right now.
    #[inline(always)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    // A panic while holding a lock cannot leave a half-written entry (every
    // write is a single field store), so the data is still sound.
    #[inline(always)]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Slots<V>> {
        self.slots
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<V> Slots<V> {
    /// Entries held, live or expired.
    pub(crate) fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    /// The most live entries this shard holds.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// How many entries are held in short slots, and how many in long ones.
    #[cfg(test)]
    pub(crate) fn forms(&self) -> (usize, usize) {
        (self.short.len(), self.long.len())
    }

    /// Every entry held, live or expired.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry<V>> {
        let short = self.short.iter().map(|e| &e.entry);
        short.chain(self.long.iter().map(|e| &e.entry))
    }

    /// The entry `id` names, live or expired, in the part of the shard its
    /// form goes to.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, id: &Id<'_>) -> Option<&Entry<V>> {
        match id {
            Id::Short(short) => self
                .short
                .find(hash, |e| e.id == short.word())
                .map(|e| &e.entry),
            _ => self
                .long
                .find(hash, |e| id.matches(&e.id))
                .map(|e| &e.entry),
        }
    }
}

/// A shard's entries under its write lock; every change of their number
/// is published before the lock is let go.
pub(crate) struct SlotsMut<'a, V> {
    slots: RwLockWriteGuard<'a, Slots<V>>,
    held: &'a AtomicUsize,
    hasher: &'a DefaultHashBuilder,
}

/// An entry found under the write lock: its deadline changes only through
/// [`set_deadline`](Self::set_deadline), which keeps the shard's earliest
/// deadline.
pub(crate) struct EntryMut<'a, V> {
    entry: &'a mut Entry<V>,
    min_deadline: &'a mut u64,
}

impl<V> EntryMut<'_, V> {
    /// The entry as it is.
    #[inline(always)]
    pub(crate) fn get(&self) -> &Entry<V> {
        self.entry
    }

    /// The entry's value, to change.
    pub(crate) fn value_mut(&mut self) -> &mut V {
        &mut self.entry.value
    }

    /// Moves the entry's deadline.
    pub(crate) fn set_deadline(&mut self, deadline: u64) {
        self.entry.deadline = deadline;
        *self.min_deadline = (*self.min_deadline).min(deadline);
    }
}

impl<V> SlotsMut<'_, V> {
    fn publish(&self) {
        self.held.store(self.slots.len(), Ordering::Relaxed);
    }

    /// The entry `id` names, live or expired, found again under the write
    /// lock.
    pub(crate) fn find(&mut self, hash: u64, id: &Id<'_>) -> Option<EntryMut<'_, V>> {
        let Slots {
            short,
            long,
            min_deadline,
            ..
        } = &mut *self.slots;
        let entry = match id {
            Id::Short(short_id) => short
                .find_mut(hash, |e| e.id == short_id.word())
                .map(|e| &mut e.entry),
            _ => long
                .find_mut(hash, |e| id.matches(&e.id))
                .map(|e| &mut e.entry),
        }?;
        Some(EntryMut {
            entry,
            min_deadline,
        })
    }

    /// Takes the entry `id` names, live or expired, out of the table.
    pub(crate) fn remove(&mut self, hash: u64, id: &Id<'_>) -> Option<Entry<V>> {
        let slots = &mut *self.slots;
        let removed = match id {
            Id::Short(short) => slots
                .short
                .find_entry(hash, |e| e.id == short.word())
                .ok()
                .map(|e| e.remove().0.entry),
            _ => slots
                .long
                .find_entry(hash, |e| id.matches(&e.id))
                .ok()
                .map(|e| e.remove().0.entry),
        };
        if removed.is_some() {
            self.publish();
        }
        removed
    }

    /// Whether a new entry may be inserted at `now`: the shard is swept of
    /// expired entries first when it has doubled since its last sweep or
    /// is full; `false` when it is still full, of live entries.
    pub(crate) fn has_room(&mut self, now: u64) -> bool {
        let len = self.slots.len();
        if len >= self.slots.sweep_at || len >= self.slots.cap {
            self.sweep(now);
            return self.slots.len() < self.slots.cap;
        }
        true
    }

    /// A new entry, which [`find`](Self::find) did not find, after
    /// [`has_room`](Self::has_room) said yes.
    pub(crate) fn insert(&mut self, hash: u64, id: Id<'_>, entry: Entry<V>) {
        let hasher = self.hasher;
        let slots = &mut *self.slots;
        slots.min_deadline = slots.min_deadline.min(entry.deadline);
        match id {
            Id::Short(short) => {
                let id = short.word();
                slots
                    .short
                    .insert_unique(hash, ShortSlot { id, entry }, |e| {
                        short_word_hash(hasher, e.id)
                    });
            }
            _ => {
                let id = id.to_owned();
                slots
                    .long
                    .insert_unique(hash, LongSlot { id, entry }, |e| e.id.hash(hasher));
            }
        }
        self.publish();
    }

    /// Drop expired entries, unless none can have expired yet (O(1)).
    fn sweep(&mut self, now: u64) {
        let hasher = self.hasher;
        let slots = &mut *self.slots;
        if slots.min_deadline > now {
            slots.sweep_at = slots.sweep_at.max(slots.len().saturating_mul(2));
            return;
        }
        let mut min_deadline = u64::MAX;
        let mut live = |entry: &Entry<V>| {
            let live = entry.deadline > now;
            if live {
                min_deadline = min_deadline.min(entry.deadline);
            }
            live
        };
        slots.short.retain(|e| live(&e.entry));
        slots.long.retain(|e| live(&e.entry));
        slots.min_deadline = min_deadline;
        let short = slots.short.len();
        if short < slots.short.capacity() / 4 {
            slots
                .short
                .shrink_to(short * 2, |e| short_word_hash(hasher, e.id));
        }
        let long = slots.long.len();
        if long < slots.long.capacity() / 4 {
            slots.long.shrink_to(long * 2, |e| e.id.hash(hasher));
        }
        slots.sweep_at = slots.len().saturating_mul(2).max(MIN_SWEEP_LEN);
        self.publish();
    }
}

/// The shard of `hash` among `1 << bits`: bits 40 and up (at most 16 of
/// them, below bit 57). The hash table inside a shard reads the low bits
/// (where a key goes) and the top 7 (the tag it compares before the key),
/// so the shard's bits take entropy from neither: were the shard read from
/// the top bits, every key of a shard would share most of its tag, and a
/// lookup would compare several keys where it should compare one.
#[inline(always)]
fn shard_index(hash: u64, bits: u32) -> usize {
    ((hash >> 40) & ((1 << bits) - 1)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    /// Inserts (`namespace`, `key`) until `deadline`, if there is room at
    /// `now` and it is not there already.
    fn put(table: &Table<()>, now: u64, key: &Key, deadline: u64) -> bool {
        let mut scratch = Scratch::new();
        let id = table.id("n", KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let mut slots = table.write(shard);
        if slots.find(hash, &id).is_some() || !slots.has_room(now) {
            return false;
        }
        slots.insert(hash, id, Entry::new(deadline, ()));
        true
    }

    #[test]
    fn every_change_is_published_and_the_cap_holds() {
        let table = Table::<()>::new(100, 1, 1);
        assert_eq!(table.shards(), 1);
        for i in 0..100 {
            assert!(put(&table, 0, &Key::display(i), 10), "key {i}");
        }
        assert!(table.published());
        assert!(
            !put(&table, 5, &Key::new("one more"), 10),
            "full of live entries"
        );
        assert_eq!(table.len(), 100);
        let mut scratch = Scratch::new();
        let key = Key::display(7);
        let id = table.id("n", KeyBytes::of(&key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        assert!(table.write(shard).remove(hash, &id).is_some());
        assert_eq!(shard.held(), 99);
        assert!(table.published());
        // The room a removal made is taken without a sweep.
        assert!(put(&table, 5, &Key::new("after"), 20));
        assert_eq!(table.len(), 100);
        // Once the deadlines pass, the sweep before a refusal makes room,
        // and publishes what is left.
        assert!(put(&table, 10, &Key::new("later"), 20));
        assert_eq!(table.len(), 2);
        assert!(table.published());
    }
}
