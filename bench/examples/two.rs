use std::hint::black_box;
use std::num::NonZeroU32;
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Backend, Counter, MemoryBackend};
use tower_pinned_window::key::Key;
const TWO: &[Counter<'static>] = &[
    Counter {
        namespace: "bench",
        quota: Quota::per_hour(NonZeroU32::MAX),
    },
    Counter {
        namespace: "bench:day",
        quota: Quota::per_hour(NonZeroU32::MAX),
    },
];
#[inline(never)]
fn case_two(store: &MemoryBackend, n: usize) {
    for i in 0..n {
        let key = Key::new(((i % 4) as u32).to_be_bytes());
        let hits = store.hit_all(black_box(&key), TWO).into_inner().unwrap();
        black_box(hits);
    }
}
fn main() {
    let store = MemoryBackend::new();
    case_two(&store, 1000);
    case_two(&store, 100_000);
}
