//! The layer's configuration checks: names, timeouts, and the settings that
//! depend on each other, in any order.

use std::time::Duration;

use super::*;
use crate::name::MAX_NAME_LEN;

#[test]
fn names_are_checked() {
    let q = Quota::new(1, Duration::from_secs(1)).unwrap();
    for good in ["api", "login:v2", "a.b-c_d", &"x".repeat(MAX_NAME_LEN)] {
        assert!(RateLimitLayer::try_new(good, q).is_ok(), "{good:?}");
    }
    for bad in [
        "",
        "with space",
        "quote\"",
        "é",
        &"x".repeat(MAX_NAME_LEN + 1),
    ] {
        assert_eq!(
            RateLimitLayer::try_new(bad, q).unwrap_err(),
            ConfigError::InvalidName(bad.to_string()),
            "{bad:?}"
        );
    }
}

#[test]
#[should_panic(expected = "invalid limiter name")]
fn new_panics_on_a_bad_literal_name() {
    let _ = RateLimitLayer::new("no spaces", Quota::new(1, Duration::from_secs(1)).unwrap());
}

#[test]
fn a_timeout_is_a_window_never_zero() {
    let q = Quota::new(1, Duration::from_secs(1)).unwrap();
    assert_eq!(
        Window::new(Duration::ZERO).unwrap_err(),
        ConfigError::NonPositiveWindow
    );
    let layer = RateLimitLayer::new("t", q).timeout(Window::new(Duration::from_millis(1)).unwrap());
    assert_eq!(
        layer.core.settings.timeout,
        Duration::from_millis(1),
        "kept as given"
    );
}

#[derive(Clone, Debug)]
struct Old(MemoryBackend);

/// A backend that only counts hits: it implements `Backend`, not
/// `Spending`.
impl Backend for Old {
    type Future = <MemoryBackend as Backend>::Future;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[crate::backend::Counter<'_>]) -> Self::Future {
        self.0.hit_all(key, counters)
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &crate::backend::Hit) -> Self::Refund {
        self.0.refund(namespace, key, hit)
    }

    async fn peek(
        &self,
        namespace: &str,
        key: &Key,
    ) -> Result<Option<crate::backend::Hit>, crate::backend::BackendError> {
        self.0.peek(namespace, key).await
    }

    async fn reset(
        &self,
        namespace: &str,
        key: &Key,
    ) -> Result<bool, crate::backend::BackendError> {
        self.0.reset(namespace, key).await
    }
}

#[tokio::test]
async fn a_backend_that_cannot_spend_builds_plain_layers_in_any_order() {
    use tower::{ServiceExt, service_fn};
    let q = Quota::new(1, Duration::from_secs(60)).unwrap();
    let ok = service_fn(|_request: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    });
    // A plain layer on it, its backend set first or last; a layer that
    // spends does not compile on it (the doctest on `Counts`).
    let first = RateLimitLayer::new("t", q)
        .backend(Old(MemoryBackend::new()))
        .count_if(|_| true);
    let last = RateLimitLayer::new("t", q)
        .count_if(|_| true)
        .backend(Old(MemoryBackend::new()));
    for layer in [first, last] {
        let service = layer.layer(ok);
        let statuses = [
            service
                .clone()
                .oneshot(http::Request::new(String::new()))
                .await
                .unwrap()
                .status(),
            service
                .oneshot(http::Request::new(String::new()))
                .await
                .unwrap()
                .status(),
        ];
        assert_eq!(statuses.map(|s| s.as_u16()), [200, 429]);
    }
    // A layer that spends takes a backend that spends before or after.
    let before = RateLimitLayer::new("t", q)
        .backend(MemoryBackend::new())
        .cost(1);
    let after = RateLimitLayer::new("t", q)
        .cost(1)
        .backend(MemoryBackend::new());
    assert_eq!(before.check(), Ok(()));
    assert_eq!(after.check(), Ok(()));
}

#[test]
fn a_cost_a_quota_cannot_fit_is_refused_in_any_order() {
    let q = Quota::new(10, Duration::from_secs(1)).unwrap();
    let small = Quota::new(3, Duration::from_secs(60)).unwrap();
    let layer = || RateLimitLayer::new("t", q);
    let refused = Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 });
    assert_eq!(layer().cost(4).also(small).check(), refused, "also after");
    assert_eq!(layer().also(small).cost(4).check(), refused, "also before");
    assert_eq!(
        layer().cost(4).route_quota("/a", small).check(),
        refused,
        "route after"
    );
    assert_eq!(
        layer().route_quota("/a", small).cost(4).check(),
        refused,
        "route before"
    );
    // Building it panics with the same error.
    let service = || {
        tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(()))
        })
    };
    let built = std::panic::catch_unwind(|| layer().cost(4).also(small).layer(service()))
        .map(drop)
        .expect_err("a layer that cannot work does not build");
    let message = built.downcast_ref::<String>().expect("a message");
    assert!(
        message.contains("a request cost of 4 is above the limit of 3"),
        "{message}"
    );
    // Quotas the cost fits, before or after it.
    let big = Quota::new(4, Duration::from_secs(60)).unwrap();
    assert_eq!(
        layer().cost(4).also(big).route_quota("/b", big).check(),
        Ok(())
    );
    assert_eq!(layer().also(big).cost(4).check(), Ok(()));
}

#[test]
fn a_cost_above_a_limit_and_a_bad_lockout_are_config_errors() {
    let q = Quota::new(10, Duration::from_secs(1)).unwrap();
    let small = Quota::new(3, Duration::from_secs(60)).unwrap();
    let layer = || RateLimitLayer::new("t", q);
    assert_eq!(
        layer().cost(11).check(),
        Err(ConfigError::CostAboveLimit {
            cost: 11,
            limit: 10
        })
    );
    assert_eq!(
        layer().also(small).cost(4).check(),
        Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
    );
    assert_eq!(
        layer().route_quota("/a", small).cost(4).check(),
        Err(ConfigError::CostAboveLimit { cost: 4, limit: 3 })
    );
    // A lockout's length is a window: never zero, never past the
    // longest window, milliseconds rounded up.
    assert_eq!(
        Window::new(Duration::ZERO).unwrap_err(),
        ConfigError::NonPositiveWindow
    );
    assert_eq!(
        Window::new(Window::MAX.as_duration() + Duration::from_millis(1)).unwrap_err(),
        ConfigError::WindowTooLong
    );
    let blocked = layer().block_for(Window::new(Duration::from_nanos(1_000_001)).unwrap());
    let plan = blocked.core.settings.spend.unwrap();
    assert_eq!(plan.block.unwrap().as_millis(), 2, "rounded up");
}

#[test]
fn a_reservation_needs_a_charge_and_no_cost_in_any_order() {
    let layer = || RateLimitLayer::new("t", Quota::new(10, Duration::from_secs(1)).unwrap());
    let estimate = |_: &RequestHead<'_>| 3;
    let used = |_: &ResponseHead<'_>| Some(2);
    assert_eq!(
        layer().reserve(estimate).check(),
        Err(ConfigError::ReserveWithoutCharge)
    );
    assert_eq!(
        layer()
            .reserve(estimate)
            .block_for(Window::new(Duration::from_secs(1)).unwrap())
            .check(),
        Err(ConfigError::ReserveWithoutCharge)
    );
    assert_eq!(layer().reserve(estimate).charge(used).check(), Ok(()));
    assert_eq!(layer().charge(used).reserve(estimate).check(), Ok(()));
    assert_eq!(
        layer().cost(2).charge(used).reserve(estimate).check(),
        Err(ConfigError::ReserveWithCost)
    );
    assert_eq!(
        layer()
            .reserve(estimate)
            .charge(used)
            .cost_fn(estimate)
            .check(),
        Err(ConfigError::ReserveWithCost)
    );
    // A charge alone, and a cost beside a charge, as before.
    assert_eq!(layer().charge(|_: &ResponseHead<'_>| 1).check(), Ok(()));
    assert_eq!(layer().cost(2).charge(used).check(), Ok(()));
}

#[test]
#[should_panic(expected = "a request cost of 11 is above the limit of 10")]
fn a_literal_cost_above_the_limit_panics_when_built() {
    let layer = RateLimitLayer::new("t", Quota::new(10, Duration::from_secs(1)).unwrap()).cost(11);
    let _ = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
}

/// A memory backend that records, per call, whether the layer told it
/// that its counters may go down (`Counter::lowers`).
#[derive(Clone, Debug, Default)]
struct Told(MemoryBackend, Arc<std::sync::Mutex<Vec<bool>>>);

impl Told {
    fn record(&self, counters: &[crate::backend::Counter<'_>]) {
        let lowers = counters.iter().all(|counter| counter.lowers);
        self.1.lock().unwrap().push(lowers);
    }
}

impl Backend for Told {
    type Future = <MemoryBackend as Backend>::Future;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[crate::backend::Counter<'_>]) -> Self::Future {
        self.record(counters);
        self.0.hit_all(key, counters)
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &crate::backend::Hit) -> Self::Refund {
        self.0.refund(namespace, key, hit)
    }

    async fn peek(
        &self,
        namespace: &str,
        key: &Key,
    ) -> Result<Option<crate::backend::Hit>, crate::backend::BackendError> {
        self.0.peek(namespace, key).await
    }

    async fn reset(
        &self,
        namespace: &str,
        key: &Key,
    ) -> Result<bool, crate::backend::BackendError> {
        self.0.reset(namespace, key).await
    }
}

impl crate::backend::Spending for Told {
    fn spend_all(
        &self,
        key: &Key,
        counters: &[crate::backend::Counter<'_>],
        spend: crate::backend::Spend,
    ) -> Self::Future {
        self.record(counters);
        self.0.spend_all(key, counters, spend)
    }

    fn amend(
        &self,
        namespace: &str,
        key: &Key,
        hit: &crate::backend::Hit,
        amend: crate::backend::Amend,
    ) -> Self::Refund {
        self.0.amend(namespace, key, hit, amend)
    }
}

#[tokio::test]
async fn a_layer_that_reserves_tells_the_backend_its_counts_go_down_from_the_head_or_the_body() {
    use tower::{ServiceExt, service_fn};
    let q = Quota::new(100, Duration::from_secs(60)).unwrap();
    let settled = |_: &ResponseHead<'_>| None::<u64>;
    async fn ok<B>(
        _request: http::Request<B>,
    ) -> Result<Response<String>, std::convert::Infallible> {
        Ok(Response::new(String::new()))
    }
    let told = Told::default();
    let plain = RateLimitLayer::new("plain", q).backend(told.clone());
    let _ = plain
        .layer(service_fn(ok::<String>))
        .oneshot(http::Request::new(String::new()))
        .await;
    let from_head = RateLimitLayer::new("head", q)
        .backend(told.clone())
        .reserve(|_| 1)
        .charge(settled);
    let _ = from_head
        .layer(service_fn(ok::<String>))
        .oneshot(http::Request::new(String::new()))
        .await;
    let from_body = RateLimitLayer::new("body", q)
        .backend(told.clone())
        .reserve_from_body(BodyEstimate::new(1, |_| None))
        .charge(settled);
    let _ = from_body
        .layer(service_fn(ok::<crate::cost::Replay<String>>))
        .oneshot(http::Request::new(String::new()))
        .await;
    assert_eq!(
        *told.1.lock().unwrap(),
        [false, true, true],
        "plain, head, body"
    );
}
