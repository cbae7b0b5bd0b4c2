//! Tests and examples of `tower-pinned-window` that need heavy
//! dev-dependencies, kept out of the crate so that a first
//! `cargo run --example quickstart` compiles only what it needs; and the
//! README's examples, compiled and run as doctests.

#![forbid(unsafe_code)]

/// The README's examples, compiled and run as doctests.
#[cfg(all(
    doctest,
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "postgres",
    feature = "serde"
))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
