//! The in-memory backend's unit tests.

use super::*;
use crate::backend::expiring::MIN_SWEEP_LEN;
use crate::backend::expiring::id::{SHORT_KEY, SHORT_NAMES};
use crate::key::MAX_KEY_LEN;
use proptest::prelude::*;

const MS: u64 = 1_000_000;

fn window(ms: u64) -> Window {
    Window::new(Duration::from_millis(ms)).unwrap()
}

/// A hit without its deadline, to compare count and reset.
fn seen(hit: Hit) -> (u64, Duration) {
    (hit.count, hit.reset)
}

#[test]
fn the_window_stays_pinned_to_the_first_hit() {
    let store = MemoryBackend::new();
    let key = Key::new("alice");
    let w = window(15 * 60 * 1000);
    let min = 60 * 1000 * MS;
    let at = |t: u64| store.hit_at(t, "login", &key, w).unwrap();
    assert_eq!(seen(at(0)), (1, Duration::from_secs(900)));
    assert_eq!(
        seen(at(14 * min)),
        (2, Duration::from_secs(60)),
        "the 14-minute knock does not move the window"
    );
    assert_eq!(at(15 * min - 1).count, 3, "still inside the first window");
    assert_eq!(
        seen(at(15 * min + MS)),
        (1, Duration::from_secs(900)),
        "a new window opens with count 1"
    );
    // A client knocking every 14 minutes is not locked out forever: each
    // window closes 15 minutes after the hit that opened it.
    let mut opened = 0;
    for i in 1..=40u64 {
        let hit = at(15 * min + MS + i * 14 * min);
        if hit.count == 1 {
            opened += 1;
        }
        assert!(hit.count <= 2, "knock {i} counted {}", hit.count);
    }
    assert_eq!(opened, 20, "every other knock opens a fresh window");
}

#[test]
fn the_default_clock_counts_within_the_window() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    let quota = Quota::with_window(std::num::NonZeroU64::MIN, window(60_000));
    let counter = [Counter {
        namespace: "n",
        quota,
        lowers: false,
    }];
    let first = store.hit_all(&key, &counter).into_inner().unwrap()[0];
    let second = store.hit_all(&key, &counter).into_inner().unwrap()[0];
    assert_eq!((first.count, second.count), (1, 2));
    assert!(second.reset <= first.reset && first.reset <= Duration::from_secs(60));
    assert!(second.reset > Duration::from_secs(59), "{:?}", second.reset);
}

#[test]
fn long_namespaces_are_hashed_like_keys() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    let long = "n".repeat(200);
    let other = format!("{}m", "n".repeat(199));
    assert_eq!(store.hit_at(0, &long, &key, window(1000)).unwrap().count, 1);
    assert_eq!(store.hit_at(0, &long, &key, window(1000)).unwrap().count, 2);
    assert_eq!(
        store.hit_at(0, &other, &key, window(1000)).unwrap().count,
        1
    );
    assert_eq!(store.peek_at(0, &long, &key).unwrap().count, 2);
}

#[test]
fn namespaces_keep_counters_apart() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    assert_eq!(store.hit_at(0, "a", &key, window(1000)).unwrap().count, 1);
    assert_eq!(store.hit_at(0, "a", &key, window(1000)).unwrap().count, 2);
    assert_eq!(store.hit_at(0, "b", &key, window(1000)).unwrap().count, 1);
}

#[test]
fn adversarial_pairs_count_apart() {
    let store = MemoryBackend::new();
    let long = Key::new([b'h'; MAX_KEY_LEN + 1]);
    // More namespaces than get a short id, so some pairs land in each
    // table.
    let more: Vec<String> = (0..SHORT_NAMES).map(|i| format!("a{i}")).collect();
    let names = ["a", "a:b", "api", "api:1/3600000ms", "api:v2", ""]
        .into_iter()
        .chain(more.iter().map(String::as_str));
    let names: Vec<&str> = names.collect();
    let keys = [
        Key::new([0u8; SHORT_KEY - 1]),
        Key::new([0u8; SHORT_KEY]),
        Key::new([0u8; SHORT_KEY + 1]),
        Key::new("a\0"),
        Key::new("a"),
        Key::new("255.255.255.255"),
        Key::new("255.255.255.2550"),
        Key::new("b:c"),
        Key::new("c"),
        Key::new(":c"),
        Key::new("1/3600000ms:v"),
        Key::new("v2:v"),
        Key::new("v"),
        Key::new(""),
        Key::new("{v}"),
        Key::new([0u8]),
        Key::new(&long.as_bytes()[..MAX_KEY_LEN]),
        Key::new(long.as_bytes()),
        long.clone(),
    ];
    for name in &names {
        for key in &keys {
            let hit = store.hit_at(0, name, key, window(1000)).unwrap();
            assert_eq!(hit.count, 1, "{name:?} {key:?} met another counter");
        }
    }
    assert_eq!(store.len(), names.len() * keys.len());
    let (short, long) = store.inner.table.each().fold((0, 0), |(s, l), slots| {
        let (short, long) = slots.forms();
        (s + short, l + long)
    });
    assert!(short > 0 && long > 0, "{short} short, {long} long");
}

#[test]
fn a_namespace_first_seen_by_several_threads_at_once_is_one_counter() {
    for round in 0..20 {
        let store = MemoryBackend::new();
        let threads = 4;
        let barrier = std::sync::Barrier::new(threads);
        std::thread::scope(|scope| {
            for i in 0..threads {
                let (store, barrier) = (&store, &barrier);
                scope.spawn(move || {
                    // Each thread first sees its own namespace, then
                    // all of them race on the shared one.
                    store
                        .hit_at(0, &format!("own{i}"), &Key::new("k"), window(1000))
                        .unwrap();
                    barrier.wait();
                    store
                        .hit_at(0, "shared", &Key::new("k"), window(1000))
                        .unwrap();
                });
            }
        });
        let shared = store
            .peek_at(0, "shared", &Key::new("k"))
            .map(|hit| hit.count);
        assert_eq!(shared, Some(threads as u64), "round {round}");
        assert_eq!(store.len(), threads + 1, "round {round}");
    }
}

#[test]
fn peek_does_not_count_and_reset_deletes() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    assert_eq!(store.peek_at(0, "n", &key), None);
    store.hit_at(0, "n", &key, window(1000)).unwrap();
    store.hit_at(MS, "n", &key, window(1000)).unwrap();
    assert_eq!(
        store.peek_at(2 * MS, "n", &key),
        Some(Hit {
            count: 2,
            reset: Duration::from_millis(998),
            deadline: None,
        }),
        "a peek counts nothing, so it names no window to refund"
    );
    assert_eq!(
        store.peek_at(2 * MS, "n", &key).unwrap().count,
        2,
        "peek does not count"
    );
    assert!(store.remove_at(3 * MS, "n", &key));
    assert!(!store.remove_at(3 * MS, "n", &key));
    assert_eq!(
        store.hit_at(4 * MS, "n", &key, window(1000)).unwrap().count,
        1
    );
    assert_eq!(store.peek_at(1004 * MS, "n", &key), None, "expired");
}

#[test]
fn a_full_store_refuses_new_keys_and_keeps_live_counters() {
    let store = MemoryBackend::new().max_keys(100).shards(1);
    let w = window(1000);
    for i in 0..100 {
        store.hit_at(0, "n", &Key::display(i), w).unwrap();
    }
    // A flood of distinct keys is refused, not let in by eviction.
    for i in 100..10_000 {
        assert!(matches!(
            store.hit_at(MS, "n", &Key::display(i), w),
            Err(BackendError::AtCapacity)
        ));
    }
    assert_eq!(store.len(), 100);
    // Every live counter is intact and still counting.
    for i in 0..100 {
        assert_eq!(
            store
                .hit_at(2 * MS, "n", &Key::display(i), w)
                .unwrap()
                .count,
            2,
            "key {i}"
        );
    }
    // Once the windows close, room is made without anyone scheduling it.
    assert_eq!(
        store
            .hit_at(1000 * MS, "n", &Key::display(100_000), w)
            .unwrap()
            .count,
        1
    );
    assert_eq!(store.len(), 1, "the expired counters were swept");
}

#[test]
fn expired_counters_are_reclaimed_as_keys_arrive() {
    let store = MemoryBackend::new().shards(1);
    let w = window(10);
    for i in 0..100_000u64 {
        // Every key lives 10 ms; a new key arrives every millisecond.
        store.hit_at(i * MS, "n", &Key::display(i), w).unwrap();
    }
    assert!(
        store.len() < 2 * MIN_SWEEP_LEN.max(20),
        "held {} counters",
        store.len()
    );
}

/// Live counters held now (the table may also hold expired ones).
fn live(store: &MemoryBackend, now: u64) -> usize {
    store
        .inner
        .table
        .each()
        .map(|s| s.entries().filter(|e| e.deadline() > now).count())
        .sum()
}

#[test]
fn max_keys_is_never_exceeded_under_a_flood() {
    let cases = [
        ("17, default shards", MemoryBackend::new().max_keys(17)),
        ("1000, default shards", MemoryBackend::new().max_keys(1000)),
        (
            "1000 asked for 64 shards",
            MemoryBackend::new().max_keys(1000).shards(64),
        ),
        (
            "5000 over 4 shards",
            MemoryBackend::new().max_keys(5000).shards(4),
        ),
        (
            "4099 over 4 shards",
            MemoryBackend::new().max_keys(4099).shards(4),
        ),
        ("one shard", MemoryBackend::new().max_keys(300).shards(1)),
    ];
    for (name, store) in cases {
        let n = store.capacity();
        let caps: usize = store.inner.table.each().map(|s| s.cap()).sum();
        assert_eq!(caps, n, "{name}: the shards' caps add up to max_keys");
        let mut held = 0;
        let mut first_refusal = None;
        for i in 0..(20 * n).max(5_000) {
            match store.hit_at(0, "n", &Key::display(i), window(60_000)) {
                Ok(_) => held += 1,
                Err(BackendError::AtCapacity) => {
                    first_refusal.get_or_insert(held);
                }
                Err(err) => panic!("{name}: {err}"),
            }
            if i % 512 == 0 {
                assert!(
                    live(&store, 0) <= n,
                    "{name}: {} > {n} after key {i}",
                    live(&store, 0)
                );
            }
        }
        assert!(live(&store, 0) <= n, "{name}: {} > {n}", live(&store, 0));
        assert_eq!(held, store.len(), "{name}");
        assert!(held <= n, "{name}: held {held} of {n}");
        if store.shard_count() == 1 {
            assert_eq!(first_refusal, Some(n), "{name}: one shard holds exactly n");
            assert_eq!(held, n, "{name}");
        }
    }
}

#[test]
fn small_caps_get_fewer_shards_never_more_than_asked() {
    let cases: &[(usize, usize, usize)] = &[
        // (max_keys, shards asked, shards used)
        (1, 16, 1),
        (17, 16, 1),
        (1000, 16, 1),
        (2047, 16, 1),
        (2048, 16, 2),
        (5000, 16, 4),
        (1_000_000, 16, 16),
        (1_000_000, 3, 4),
        (1_000_000, 1, 1),
    ];
    for &(max_keys, asked, used) in cases {
        let store = MemoryBackend::new().max_keys(max_keys).shards(asked);
        assert_eq!(
            store.shard_count(),
            used,
            "max_keys {max_keys}, shards({asked})"
        );
        assert_eq!(store.capacity(), max_keys);
    }
}

#[test]
fn bad_builder_values_are_errors_or_panics_never_changed() {
    assert_eq!(
        MemoryBackend::new().try_max_keys(0).err(),
        Some(ConfigError::ZeroCapacity)
    );
    assert_eq!(
        MemoryBackend::new().try_shards(0).err(),
        Some(ConfigError::InvalidShards(0))
    );
    assert_eq!(
        MemoryBackend::new().try_shards(MAX_SHARDS + 1).err(),
        Some(ConfigError::InvalidShards(MAX_SHARDS + 1))
    );
    assert!(MemoryBackend::new().try_shards(MAX_SHARDS).is_ok());
    for (name, result) in [
        (
            "max_keys(0)",
            std::panic::catch_unwind(|| MemoryBackend::new().max_keys(0)),
        ),
        (
            "shards(0)",
            std::panic::catch_unwind(|| MemoryBackend::new().shards(0)),
        ),
    ] {
        let message = result.expect_err(name);
        let message = message.downcast_ref::<String>().expect(name);
        assert!(message.contains("must be"), "{name}: {message}");
    }
}

#[test]
fn a_refund_takes_back_one_hit_of_its_own_window_only() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    let w = window(1000);
    let refund = |now, hit: Hit| store.refund_at(now, "n", &key, hit.deadline.unwrap().get());

    let first = store.hit_at(0, "n", &key, w).unwrap();
    let second = store.hit_at(MS, "n", &key, w).unwrap();
    assert_eq!(first.deadline, second.deadline, "one window, one deadline");
    assert!(refund(2 * MS, second));
    assert_eq!(store.peek_at(2 * MS, "n", &key).unwrap().count, 1);
    assert!(refund(3 * MS, first));
    assert_eq!(store.peek_at(3 * MS, "n", &key).unwrap().count, 0);
    assert!(!refund(4 * MS, first), "never below zero");
    assert_eq!(store.peek_at(4 * MS, "n", &key).unwrap().count, 0);
    let again = store.hit_at(5 * MS, "n", &key, w).unwrap();
    assert_eq!(
        (again.count, again.deadline),
        (1, first.deadline),
        "same window"
    );

    // The window closes: a refund of its hit does nothing, and creates
    // nothing.
    assert!(!refund(1000 * MS, again));
    assert_eq!(store.peek_at(1000 * MS, "n", &key), None);
    // A new window opens; the old window's hit never touches it.
    let fresh = store.hit_at(1500 * MS, "n", &key, w).unwrap();
    assert_eq!(fresh.count, 1);
    assert_ne!(fresh.deadline, again.deadline);
    assert!(!refund(1501 * MS, again), "an old window's hit");
    assert_eq!(store.peek_at(1501 * MS, "n", &key).unwrap().count, 1);
    assert!(refund(1502 * MS, fresh));

    // No counter, no refund, and none created.
    let other = Key::new("never hit");
    assert!(!store.refund_at(0, "n", &other, fresh.deadline.unwrap().get()));
    assert_eq!(store.peek_at(0, "n", &other), None);
    assert_eq!(store.len(), 1);
}

#[test]
fn a_refund_after_the_window_closed_leaves_nothing() {
    let store = MemoryBackend::new().shards(1);
    let key = Key::new("k");
    let hit = store.hit_at(0, "n", &key, window(10)).unwrap();
    // The expired counter is swept by a later sweep...
    for i in 0..200u64 {
        store
            .hit_at(20 * MS, "sweep", &Key::display(i), window(10))
            .unwrap();
    }
    assert_eq!(store.peek_at(20 * MS, "n", &key), None);
    // ...and the late refund creates nothing.
    assert!(!store.refund_at(20 * MS, "n", &key, hit.deadline.unwrap().get()));
    assert_eq!(store.peek_at(20 * MS, "n", &key), None);
    let counted = store.hit_at(21 * MS, "n", &key, window(10)).unwrap();
    assert_eq!(
        counted.count, 1,
        "a fresh window, not one made by the refund"
    );
}

#[test]
fn hits_answer_refunds_through_the_trait() {
    let store = MemoryBackend::new();
    let key = Key::new("k");
    let quota = Quota::with_window(std::num::NonZeroU64::MIN, window(60_000));
    let counters = [Counter {
        namespace: "n",
        quota,
        lowers: false,
    }];
    let hit = store.hit_all(&key, &counters).into_inner().unwrap()[0];
    assert!(store.refund("n", &key, &hit).into_inner().unwrap());
    let uncounted = Hit {
        deadline: None,
        ..hit
    };
    store.hit_all(&key, &counters).into_inner().unwrap();
    assert!(
        !store.refund("n", &key, &uncounted).into_inner().unwrap(),
        "a hit the store did not count is never refunded"
    );
    assert_eq!(store.peek_at(store.now(), "n", &key).unwrap().count, 1);
}

#[test]
fn concurrent_hits_take_every_count_once_in_each_window() {
    // Four threads, one key, a clock that moves through five windows of
    // 1 ms: each window's counts are exactly 1..=n, with no count given
    // twice or skipped, whether a hit took the read lock's increment or
    // opened the window under the write lock.
    let store = MemoryBackend::new().shards(1);
    let key = Key::new("k");
    let w = window(1);
    let seen: Vec<Vec<(u64, u64)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4u64)
            .map(|thread| {
                let (store, key) = (&store, &key);
                scope.spawn(move || {
                    (0..20_000u64)
                        .map(|i| {
                            // Windows open at 0, 1, 2, 3 and 4 ms.
                            let now = (i / 4_000) * MS + thread;
                            let hit = store.hit_at(now, "race", key, w).unwrap();
                            (hit.deadline.unwrap().get(), hit.count)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut by_window = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for (deadline, count) in seen.into_iter().flatten() {
        by_window.entry(deadline).or_default().push(count);
    }
    let total: usize = by_window.values().map(Vec::len).sum();
    assert_eq!(total, 80_000);
    for (deadline, mut counts) in by_window {
        counts.sort_unstable();
        let n = counts.len() as u64;
        assert!(
            counts.iter().copied().eq(1..=n),
            "window closing at {deadline}: counts are not exactly 1..={n}"
        );
    }
}

#[test]
fn concurrent_hits_and_refunds_never_keep_more_than_the_limit() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let store = MemoryBackend::new();
    let limit = 25u64;
    let quota = Quota::with_window(std::num::NonZeroU64::new(limit).unwrap(), window(3_600_000));
    let kept = AtomicU64::new(0);
    let refunded = AtomicU64::new(0);
    let hits = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let (store, kept, refunded, hits) = (&store, &kept, &refunded, &hits);
            scope.spawn(move || {
                let key = Key::new("shared");
                let counters = [Counter {
                    namespace: "race",
                    quota,
                    lowers: false,
                }];
                for i in 0..2_000u64 {
                    let hit = store.hit_all(&key, &counters).into_inner().unwrap()[0];
                    hits.fetch_add(1, Ordering::Relaxed);
                    // One admitted hit in three is kept (its request
                    // "failed"); every other hit, denied ones included,
                    // is taken back.
                    if hit.count <= limit && (thread + i) % 3 == 0 {
                        kept.fetch_add(1, Ordering::Relaxed);
                    } else if store.refund("race", &key, &hit).into_inner().unwrap() {
                        refunded.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let count = store
        .peek_at(store.now(), "race", &Key::new("shared"))
        .unwrap()
        .count;
    let (kept, refunded, hits) = (kept.into_inner(), refunded.into_inner(), hits.into_inner());
    assert!(
        kept <= limit,
        "kept {kept} admitted hits past the limit of {limit}"
    );
    assert_eq!(refunded, hits - kept, "every hit not kept was taken back");
    assert_eq!(count, kept, "the counter holds exactly the kept hits");
    assert_eq!(kept, limit, "the budget was spent in full");
}

/// The reference model: a map from key to (count, deadline) where only a
/// hit that finds no live counter sets the deadline.
#[derive(Default)]
struct Model<K = u8>(std::collections::HashMap<K, (u64, u64)>);

impl<K: std::hash::Hash + Eq> Model<K> {
    fn hit(&mut self, now: u64, key: K, window_ns: u64) -> Hit {
        let entry = self.0.entry(key).or_insert((0, 0));
        if entry.1 <= now {
            *entry = (0, now + window_ns);
        }
        entry.0 += 1;
        Hit {
            count: entry.0,
            reset: Duration::from_nanos(entry.1 - now),
            deadline: NonZeroU64::new(entry.1),
        }
    }
}

proptest! {
    #[test]
    fn matches_the_reference_model(
        window_ms in 1u64..50,
        steps in proptest::collection::vec((0u64..20_000_000, 0u8..4), 1..300),
    ) {
        let store = MemoryBackend::new().shards(2);
        let mut model = Model::default();
        let mut now = 0;
        let w = window(window_ms);
        let mut opened = std::collections::HashMap::new();
        for (advance, key) in steps {
            now += advance;
            let got = store.hit_at(now, "p", &Key::new([key]), w).unwrap();
            let want = model.hit(now, key, window_ms * MS);
            prop_assert_eq!(got, want);
            // The window never moves once created.
            if got.count == 1 {
                opened.insert(key, now);
            }
            prop_assert_eq!(now + got.reset.as_nanos() as u64, opened[&key] + window_ms * MS);
        }
    }

    /// Counters of up to 20 namespaces (more than get a short id) and
    /// keys of zeros and ones around the short form's 15 bytes, where a
    /// key and the same key with a zero more differ only by their
    /// length: every (namespace, key) pair keeps its own count, in
    /// whichever table it lands.
    #[test]
    fn short_and_long_counters_match_the_reference_model(
        steps in proptest::collection::vec(
            (0u64..3_000_000, 0u8..20, 13usize..18, 0u8..3),
            1..400,
        ),
    ) {
        let store = MemoryBackend::new().shards(2);
        let mut model = Model::default();
        let w = window(5);
        let mut now = 0;
        for (advance, name, len, fill) in steps {
            now += advance;
            let namespace = format!("n{name}");
            // Zeros, ones, or zeros ending in a one: few enough keys
            // that they are hit again, after the tables have grown.
            let mut key = vec![u8::from(fill == 1); len];
            key[len - 1] |= u8::from(fill == 2);
            let got = store.hit_at(now, &namespace, &Key::new(&key), w).unwrap();
            prop_assert_eq!(got, model.hit(now, (name, key), 5 * MS));
        }
    }
}
