//! Tests and examples of `tower-pinned-window` that need heavy
//! dev-dependencies, kept out of the crate so that a first
//! `cargo run --example quickstart` compiles only what it needs; and the
//! README's and the guides' (`docs/*.md`) examples, compiled and run as
//! doctests.

#![forbid(unsafe_code)]

/// Compiles and runs the Rust blocks of one Markdown file as doctests: one
/// hidden item per file, so a failure names the file. Only under `doctest`,
/// with the features the blocks use (every feature, as
/// `cargo test --all-features` runs them).
macro_rules! markdown_doctests {
    ($($item:ident = $path:literal;)*) => {$(
        #[cfg(all(
            doctest,
            feature = "redis-cluster",
            feature = "redis-sentinel",
            feature = "postgres",
            feature = "serde",
            feature = "json",
            feature = "tonic",
            feature = "metrics",
            feature = "operator"
        ))]
        #[doc = include_str!($path)]
        pub struct $item;
    )*};
}

markdown_doctests! {
    ReadmeDoctests = "../../README.md";
    UsageGuide = "../../docs/usage.md";
    GuaranteesGuide = "../../docs/guarantees.md";
    ClientIdentityGuide = "../../docs/client-identity.md";
    QuotasGuide = "../../docs/quotas.md";
    ConfigurationGuide = "../../docs/configuration.md";
    OutcomesGuide = "../../docs/outcomes.md";
    CostsGuide = "../../docs/costs.md";
    OutboundGuide = "../../docs/outbound.md";
    HeadersGuide = "../../docs/headers.md";
    MetricsGuide = "../../docs/metrics.md";
    OperationsGuide = "../../docs/operations.md";
    GrpcGuide = "../../docs/grpc.md";
    RedisGuide = "../../docs/redis.md";
    PostgresGuide = "../../docs/postgres.md";
    PrivateKeysGuide = "../../docs/private-keys.md";
    TestingGuide = "../../docs/testing.md";
}
