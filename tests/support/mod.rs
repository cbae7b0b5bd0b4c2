//! Helpers shared by the crate's tests: small services and an HTTP client
//! and server, so each test file reads as its cases. The real Redis and
//! PostgreSQL servers, and the store tests that use them, are in the
//! integration/ member (integration/tests/support/), whose helpers include
//! this module's `http`.

#![allow(dead_code)]

pub mod http;
