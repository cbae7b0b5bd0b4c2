//! The guides, the same text as the repository's `docs/*.md`, one module
//! each. Their examples are compiled and run as doctests of the
//! repository's `integration/` member, with every feature on.
//!
//! | guide | what it covers |
//! |---|---|
//! | [`usage`] | plain tower, your own key and denial, the order of layers (`ResBody: Default`), and every builder option |
//! | [`guarantees`] | what holds on every backend, and why the window is pinned |
//! | [`client_identity`] | proxies, forwarded headers, trusted hops, IPv6 prefixes; skipping requests and allowlists |
//! | [`quotas`] | per route, per gRPC method, several quotas, tiers |
//! | [`configuration`] | rate strings (`"5 per 15m"`) and whole limiters from TOML, YAML, JSON or the environment |
//! | [`outcomes`] | counting only failures (`count_if`), and how refunds work |
//! | [`costs`] | request costs, response charges (token budgets), reserve then settle, lockouts, reset on success |
//! | [`outbound`] | a budget for the calls your service makes, shared by its instances |
//! | [`in_flight`] | at most N requests in flight per key across instances, slots on leases, what holds under each failure |
//! | [`headers`] | `RateLimit`, `RateLimit-Policy`, `Retry-After`, nested layers |
//! | [`metrics`] | metric names and labels |
//! | [`operations`] | the operator's service: an admin route to read, reset, block and unblock a key, never mounted without authentication |
//! | [`grpc`] | tonic servers, per service and per method |
//! | [`redis`] | Redis, Cluster, Sentinel, outages and the circuit breaker, the audit |
//! | [`postgres`] | the table, the cleaner, the audit |
//! | [`private_keys`] | a keyed digest of each key stored instead of the key |
//! | [`testing`] | what the test suite needs and starts |
//!
//! Only rustdoc builds this module: nothing of it is compiled into the
//! crate.

// Each guide's relative links (`costs.md`) are reference-style, defined at
// its end for the repository's web view; `links.md` defines the same labels
// first, as rustdoc reads them (tools/guide-links.py writes both).
macro_rules! guides {
    ($($module:ident = $path:literal;)*) => {$(
        #[doc = include_str!("links.md")]
        #[doc = include_str!($path)]
        pub mod $module {}
    )*};
}

guides! {
    usage = "../../docs/usage.md";
    guarantees = "../../docs/guarantees.md";
    client_identity = "../../docs/client-identity.md";
    quotas = "../../docs/quotas.md";
    configuration = "../../docs/configuration.md";
    outcomes = "../../docs/outcomes.md";
    costs = "../../docs/costs.md";
    outbound = "../../docs/outbound.md";
    in_flight = "../../docs/in-flight.md";
    headers = "../../docs/headers.md";
    metrics = "../../docs/metrics.md";
    operations = "../../docs/operations.md";
    grpc = "../../docs/grpc.md";
    redis = "../../docs/redis.md";
    postgres = "../../docs/postgres.md";
    private_keys = "../../docs/private-keys.md";
    testing = "../../docs/testing.md";
}
