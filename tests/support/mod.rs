//! Helpers shared by the integration tests: real servers and small
//! services, so each test file reads as its cases.

#![allow(dead_code)]

pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
