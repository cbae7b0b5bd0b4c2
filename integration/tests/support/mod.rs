//! Helpers shared by the integration tests: real servers (Redis, PostgreSQL),
//! small services and captured logs (`logs`), so each test file reads as its
//! cases. `http` is the crate's own (tests/support/http.rs), shared with the
//! tests there.

#![allow(dead_code)]

pub mod drop_reply;
#[path = "../../../tests/support/http.rs"]
pub mod http;
pub mod logs;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
