use super::*;

fn table(capacity: usize) -> DeniedKeys {
    TopDenied::new(capacity).unwrap().table("test")
}

fn record_n(denied: &DeniedKeys, key: &str, n: u64) {
    for _ in 0..n {
        denied.record(&Key::new(key));
    }
}

#[test]
fn a_table_of_zero_or_too_many_counters_is_refused() {
    assert_eq!(
        TopDenied::new(0).unwrap_err(),
        ConfigError::InvalidTopDenied(0)
    );
    assert_eq!(
        TopDenied::new(MAX_TOP_DENIED + 1).unwrap_err(),
        ConfigError::InvalidTopDenied(MAX_TOP_DENIED + 1)
    );
    assert_eq!(
        TopDenied::with_secret(0, [1u8; 32]).unwrap_err(),
        ConfigError::InvalidTopDenied(0)
    );
    assert_eq!(TopDenied::new(1).unwrap().capacity(), 1);
    assert_eq!(
        TopDenied::new(MAX_TOP_DENIED).unwrap().capacity(),
        MAX_TOP_DENIED
    );
    let message = TopDenied::new(0).unwrap_err().to_string();
    assert!(message.contains("1 to 65536 counters, not 0"), "{message}");
}

#[test]
fn a_short_secret_is_refused_and_never_shown() {
    assert_eq!(
        TopDenied::with_secret(10, [9u8; 31]).unwrap_err(),
        ConfigError::SecretTooShort(31)
    );
    let top = TopDenied::with_secret(10, "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t").unwrap();
    let shown = format!("{top:?} {:?}", top.table("api"));
    assert!(!shown.contains("s3cr3t"), "{shown}");
}

#[test]
fn counts_are_exact_while_the_table_has_room() {
    let denied = table(10);
    record_n(&denied, "a", 5);
    record_n(&denied, "b", 3);
    record_n(&denied, "c", 7);
    let top = denied.top(10);
    let counts: Vec<_> = top.iter().map(|k| (k.denied, k.error)).collect();
    assert_eq!(counts, [(7, 0), (5, 0), (3, 0)]);
    assert_eq!(top[0].digest, denied.digest(&Key::new("c")));
    assert_eq!(denied.top(2).len(), 2, "at most n");
    assert_eq!(denied.denials(), 15);
    assert_eq!(denied.get(&Key::new("b")).unwrap().denied, 3);
    assert_eq!(denied.get(&Key::new("never denied")), None);
}

#[test]
fn a_heavy_hitter_keeps_its_exact_count_through_a_flood_of_distinct_keys() {
    let denied = table(100);
    let heavy = Key::new("203.0.113.7");
    let mut heavy_denials = 0;
    for i in 0..100_000u32 {
        denied.record(&Key::display(format_args!(
            "198.51.{}.{}",
            i >> 8,
            i & 0xff
        )));
        if i % 20 == 0 {
            denied.record(&heavy);
            heavy_denials += 1;
        }
    }
    let top = denied.top(1);
    assert_eq!(top[0].digest, denied.digest(&heavy));
    assert_eq!(top[0].denied, heavy_denials, "exact: it was never evicted");
    assert_eq!(top[0].error, 0);
    assert_eq!(denied.denials(), 100_000 + heavy_denials);
}

#[test]
fn memory_stays_bounded_under_100000_distinct_denied_keys() {
    let denied = table(1_000);
    for i in 0..1_000u32 {
        denied.record(&Key::display(i));
    }
    let full = denied.bytes_held();
    let capacities = |d: &DeniedKeys| {
        let t = d.lock();
        (
            t.slots.capacity(),
            t.heap.capacity(),
            t.at.capacity(),
            t.index.allocation_size(),
        )
    };
    let before = capacities(&denied);
    for i in 1_000..101_000u32 {
        denied.record(&Key::display(i));
    }
    assert_eq!(capacities(&denied), before, "nothing grew");
    assert_eq!(denied.bytes_held(), full);
    assert_eq!(denied.lock().slots.len(), 1_000);
    assert_eq!(denied.lock().index.len(), 1_000);
    // The figure the module docs give.
    let metrics = if TopDeniedMetrics::RECORDS { 8_000 } else { 0 };
    assert_eq!(full, 126_032 + metrics, "bytes held");
    eprintln!("a table of 1,000 counters holds {full} bytes, after 101,000 distinct keys");
}

#[test]
fn the_counts_bound_each_keys_true_denials() {
    // A skewed stream: key i is denied 1000 / (i + 1) times, interleaved.
    let denied = table(20);
    let truth: Vec<u64> = (0..200u64).map(|i| 1_000 / (i + 1)).collect();
    let mut left = truth.clone();
    while left.iter().any(|&n| n > 0) {
        for (i, n) in left.iter_mut().enumerate() {
            if *n > 0 {
                *n -= 1;
                denied.record(&Key::display(i));
            }
        }
    }
    let by_digest: std::collections::HashMap<String, u64> = (0..200)
        .map(|i| (denied.digest(&Key::display(i)), truth[i]))
        .collect();
    let top = denied.top(20);
    assert_eq!(top.len(), 20);
    for key in &top {
        let truth = by_digest[&key.digest];
        assert!(
            key.denied - key.error <= truth && truth <= key.denied,
            "{key:?}: {truth}"
        );
    }
    // Every key above 1/20 of the denials is in the table.
    let total: u64 = truth.iter().sum();
    for (i, &n) in truth.iter().enumerate() {
        if n * 20 > total {
            assert!(
                denied.get(&Key::display(i)).is_some(),
                "key {i} ({n} of {total})"
            );
        }
    }
}

#[test]
fn digests_never_show_the_raw_key() {
    let long = "k".repeat(200);
    let keys = [
        "203.0.113.7",
        "2001:db8::1",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "0123456789abcdef0123456789abcdef",
        "",
        "{tag}",
        "\u{0}\u{1}\r\n",
        long.as_str(),
    ];
    let denied = table(16);
    for raw in keys {
        let key = Key::new(raw);
        denied.record(&key);
        let digest = denied.digest(&key);
        assert_eq!(digest.len(), 32, "{raw:?}");
        assert!(
            digest
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(digest.as_bytes(), key.as_bytes(), "{raw:?}");
        if raw.len() >= 6 {
            assert!(!digest.contains(raw), "{raw:?} in {digest}");
            let stored = String::from_utf8_lossy(key.as_bytes()).into_owned();
            assert!(
                !digest.contains(&stored),
                "{raw:?}'s stored bytes in {digest}"
            );
        }
    }
    for shown in denied.top(16) {
        assert!(keys.iter().all(|raw| shown.digest != *raw));
    }
    // Keyed: a plain SHA-256 of the key is not its digest.
    use sha2::Digest as _;
    let plain = sha2::Sha256::digest(b"203.0.113.7");
    assert_ne!(
        denied.digest(&Key::new("203.0.113.7")),
        hex(&plain[..16].try_into().unwrap())
    );
}

#[test]
fn two_tables_are_apart() {
    let one = table(10);
    let two = table(10);
    record_n(&one, "a", 3);
    assert_eq!(two.top(10), [], "nothing in the other table");
    assert_eq!(two.denials(), 0);
    // Each has its own random secret.
    let key = Key::new("a");
    assert_ne!(one.digest(&key), two.digest(&key));
    // A clone of the handle is the same table.
    let clone = one.clone();
    record_n(&clone, "a", 1);
    assert_eq!(one.top(1)[0].denied, 4);
}

#[test]
fn a_secret_of_yours_gives_the_same_digests_on_every_table() {
    let secret = [42u8; 32];
    let one = TopDenied::with_secret(10, secret).unwrap().table("api");
    let two = TopDenied::with_secret(10, secret).unwrap().table("api");
    let other = TopDenied::with_secret(10, [43u8; 32]).unwrap().table("api");
    let key = Key::new("203.0.113.7");
    assert_eq!(one.digest(&key), two.digest(&key));
    assert_ne!(one.digest(&key), other.digest(&key));
}

#[test]
fn a_table_of_one_counter_keeps_the_last_key_with_every_denial() {
    let denied = table(1);
    record_n(&denied, "a", 2);
    record_n(&denied, "b", 1);
    let top = denied.top(5);
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].digest, denied.digest(&Key::new("b")));
    assert_eq!((top[0].denied, top[0].error), (3, 2));
}
