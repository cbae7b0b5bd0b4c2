//! What a [`Decision`](crate::Decision) shows of its quota: the names it
//! reports, and the quota's rate-limit header fields, serialized once.
//!
//! The policy builds a label for each of its quotas (`policy.rs`), each
//! decision refers to its quota's, and `response.rs` writes the fields. A
//! label holds plain values only: no metric handle, no backend.

use std::sync::Arc;

use http::HeaderValue;

/// What a decision shows of its quota, built once per quota: plain
/// values, shared by the quota's decisions (one reference count per
/// decision). The quota's metric handles are kept beside it, in its policy
/// (`policy.rs`), not here.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Label {
    /// The layer's name.
    pub(crate) limiter: Arc<str>,
    /// The quota's policy name, as the headers show it.
    pub(crate) policy: Arc<str>,
    /// How its decisions are written in the response headers.
    pub(crate) headers: QuotaHeaders,
}

/// A quota's rate-limit header fields, serialized once when the layer is
/// built (`response::quota_headers`) and completed per decision with its
/// count and reset (`response::write_headers`). A decision reaches them
/// through its label, so a passed request's future holds nothing else of
/// its policy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QuotaHeaders {
    /// No rate-limit fields.
    None,
    /// `RateLimit` and `RateLimit-Policy`.
    Ietf {
        /// Every quota of the policy, as one sf-list.
        policy: HeaderValue,
        /// This quota's policy name as an sf-string, with its quotes.
        name_item: Box<str>,
    },
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    Legacy {
        /// This quota's limit.
        limit: HeaderValue,
    },
}
