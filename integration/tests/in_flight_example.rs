//! The in-flight example (examples/in_flight.rs), run shortened as a test
//! on the memory backend shared by its instances: many more callers than
//! the cap, and never more in flight per key than the cap, measured by the
//! handler across every instance.

#[allow(dead_code)]
#[path = "../examples/in_flight.rs"]
mod in_flight;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_example_never_passes_its_cap() {
    use tower_pinned_window::backend::MemoryBackend;

    let settings = in_flight::Settings {
        instances: 2,
        keys: 2,
        callers: 6,
        max: 3,
        seconds: 2,
        timeout_ms: 100,
        retry_ms: 5,
    };
    let store = MemoryBackend::new();
    let outcomes = in_flight::run(vec![store; settings.instances], settings)
        .await
        .unwrap();
    for outcome in &outcomes {
        assert!(outcome.most <= settings.max, "{outcomes:?}");
        assert_eq!(outcome.failed, 0, "{outcomes:?}");
        assert!(outcome.served > 0, "{outcomes:?}");
        assert!(
            outcome.refused > 0,
            "6 callers on a cap of 3 are refused some calls: {outcomes:?}"
        );
    }
}
