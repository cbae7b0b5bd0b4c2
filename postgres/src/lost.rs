//! Spends that were refused after they were counted: the `COMMIT` of their
//! batch was sent and its reply lost (the connection failed), or their
//! caller had gone (the layer's timeout) when the batch committed. Each is
//! given back: what it spent refunded on each of its counters (its cost,
//! or the first counter's own amount), only in the
//! window it was counted in, never below zero, in one transaction of
//! amends (the same rules as [`Amend::Refund`]).
//!
//! A lost `COMMIT` is first settled with `txid_status`: the spends are
//! given back only once it says the transaction committed; aborted, it
//! counted nothing. A database that does not answer within
//! [`CHECK_FOR`] leaves the spends counted (the safe side). Nothing is
//! given back twice: the refunds are sent once, and a refund transaction
//! whose own reply is lost is not sent again.

use std::time::{Duration, SystemTime};

use super::db::Db;
use super::row::deadline_time;
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{Hits, Spend};
use tower_pinned_window::key::Key;

/// How long a lost `COMMIT` is asked after (`txid_status`) before its
/// spends are left counted.
const CHECK_FOR: Duration = Duration::from_secs(30);

/// The first wait before asking again; doubled each time, at most
/// [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(25);
const MAX_WAIT: Duration = Duration::from_secs(1);

/// One counter's share of a spend to give back.
pub(super) struct Refund {
    pub(super) key: Key,
    pub(super) namespace: Box<str>,
    pub(super) expires_at: SystemTime,
    pub(super) cost: u64,
}

/// Adds to `out` what the spend `spend` of `key` on `counters` counted,
/// from its `hits`: what it added to each counter that counted it
/// ([`Spend::cost_of`]).
pub(super) fn refunds(
    out: &mut Vec<Refund>,
    key: &Key,
    counters: &[(Box<str>, Quota)],
    spend: Spend,
    hits: &Hits,
) {
    for (i, ((namespace, _), hit)) in counters.iter().zip(hits).enumerate() {
        let cost = spend.cost_of(i);
        if let (Some(deadline), true) = (hit.deadline, cost > 0) {
            out.push(Refund {
                key: key.clone(),
                namespace: namespace.clone(),
                expires_at: deadline_time(deadline),
                cost,
            });
        }
    }
}

/// Whether transaction `txid` committed, asked until the database says
/// it committed or aborted, for at most [`CHECK_FOR`].
pub(super) async fn committed(db: &Db, txid: i64) -> bool {
    let started = tokio::time::Instant::now();
    let mut wait = FIRST_WAIT;
    loop {
        let status = match db.pool.get().await {
            Ok(client) => client
                .query_one("SELECT txid_status($1)", &[&txid])
                .await
                .map(|row| row.get::<_, Option<String>>(0)),
            Err(err) => {
                tracing::debug!(error = %err, "a lost COMMIT: no connection yet");
                Ok(Some("unknown".to_owned()))
            }
        };
        match status.as_ref().map(|s| s.as_deref()) {
            Ok(Some("committed")) => return true,
            // Aborted: nothing was counted. None: too old to say.
            Ok(Some("aborted") | None) => return false,
            // In progress (the server has not yet seen the connection go),
            // or no answer yet.
            _ => {}
        }
        if started.elapsed() + wait > CHECK_FOR {
            tracing::warn!(
                txid,
                "a COMMIT's reply was lost and the database did not say whether it committed: its spends stay counted"
            );
            return false;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_WAIT);
    }
}
