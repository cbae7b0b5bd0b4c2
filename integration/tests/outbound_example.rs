//! The outbound example (examples/outbound.rs), run shortened as a test. It
//! lives beside the example, which runs on Redis too with `--features redis`:
//! the Redis backend is a crate of its own, which the crate's own examples and
//! tests do not build.

#[allow(dead_code)]
#[path = "../examples/outbound.rs"]
mod outbound;

/// examples/outbound.rs, shortened: four clients at three times the
/// provider's budget are never answered 429, no provider window sees more
/// than its limit, every call the provider saw was one a client sent, and
/// the budget is used in full while demand exceeds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbound_example_never_meets_a_429_and_uses_the_budget() {
    use tower_pinned_window::backend::MemoryBackend;

    let store = MemoryBackend::new();
    let (outcomes, seen) = outbound::run(vec![store; outbound::CLIENTS], 3)
        .await
        .unwrap();
    assert_eq!(seen.rejected, 0, "{}", seen.line());
    assert!(seen.most() <= outbound::LIMIT, "{}", seen.line());
    let ok: u64 = outcomes.iter().map(|calls| calls.ok).sum();
    assert_eq!(ok, seen.calls(), "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|calls| calls.failed == 0 && calls.rejected == 0)
    );
    let refused: u64 = outcomes.iter().map(|c| c.exhausted + c.shed).sum();
    assert!(
        refused > 0,
        "demand above the budget was refused: {outcomes:?}"
    );
    // Every window but the last was full.
    let windows = &seen.windows;
    assert!(windows.len() >= 3, "{}", seen.line());
    assert!(
        windows[..windows.len() - 1]
            .iter()
            .all(|&n| n == outbound::LIMIT),
        "{windows:?}"
    );
    assert!(seen.line().ends_with("429s: 0"), "{}", seen.line());
}
