//! Spends that were refused after they were counted: the `COMMIT` of their
//! batch was sent and its reply lost (the connection failed), or their
//! caller had gone (the layer's timeout) when the batch committed. Each is
//! given back: its cost refunded on each of its counters, only in the
//! window it was counted in, never below zero, in one transaction of
//! amends (the same rules as [`Amend::Refund`]).
//!
//! A lost `COMMIT` is first settled with `txid_status`: the spends are
//! given back only once it says the transaction committed; aborted, it
//! counted nothing. A database that does not answer within
//! [`CHECK_FOR`] leaves the spends counted (the safe side). Nothing is
//! given back twice: the refunds are sent once, and a refund transaction
//! whose own reply is lost is not sent again.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;

use super::db::Db;
use super::row::deadline_time;
use super::spend::{Op, Request, Spent, send};
use crate::backend::{Amend, Spend};
use crate::key::Key;
use crate::quota::Quota;

/// How long a lost `COMMIT` is asked after (`txid_status`) before its
/// spends are left counted.
const CHECK_FOR: Duration = Duration::from_secs(30);

/// The first wait before asking again; doubled each time, at most
/// [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(25);
const MAX_WAIT: Duration = Duration::from_secs(1);

/// One counter's share of a spend to give back.
pub(super) struct Refund {
    key: Key,
    namespace: Box<str>,
    expires_at: SystemTime,
    cost: u64,
}

/// Adds to `out` what `spent` counted of the spend `spend` of `key` on
/// `counters`: its cost on each counter that counted it.
pub(super) fn refunds(
    out: &mut Vec<Refund>,
    key: &Key,
    counters: &[(Box<str>, Quota)],
    spend: Spend,
    spent: &Spent,
) {
    if spend.cost == 0 {
        return;
    }
    for ((namespace, _), hit) in counters.iter().zip(&spent.hits) {
        if let Some(deadline) = hit.deadline {
            out.push(Refund {
                key: key.clone(),
                namespace: namespace.clone(),
                expires_at: deadline_time(deadline),
                cost: spend.cost,
            });
        }
    }
}

/// Gives `refunds` back, on a task of its own; first, when `txid` names a
/// transaction whose `COMMIT` reply was lost, only once it has committed.
pub(super) fn give_back(db: &Arc<Db>, txid: Option<i64>, refunds: Vec<Refund>) {
    if refunds.is_empty() {
        return;
    }
    tokio::spawn(settle(Arc::clone(db), txid, refunds));
}

async fn settle(db: Arc<Db>, txid: Option<i64>, refunds: Vec<Refund>) {
    if let Some(txid) = txid
        && !committed(&db, txid).await
    {
        return;
    }
    let n = refunds.len();
    let (requests, answers): (Vec<Request>, Vec<_>) = refunds
        .into_iter()
        .map(|refund| {
            let (reply, answer) = oneshot::channel();
            let request = Request {
                key: refund.key,
                op: Op::Amend {
                    namespace: refund.namespace,
                    expires_at: refund.expires_at,
                    amend: Amend::Refund(refund.cost),
                    reply,
                },
            };
            (request, answer)
        })
        .unzip();
    // Boxed: this runs in a task `send` spawns.
    Box::pin(send(&db, requests)).await;
    let mut failed = 0;
    for answer in answers {
        if !matches!(answer.await, Ok(Ok(_))) {
            failed += 1;
        }
    }
    if failed == 0 {
        tracing::info!(
            refunds = n,
            "spends refused after they were counted (a COMMIT's reply lost, or their caller gone): given back"
        );
    } else {
        tracing::warn!(
            refunds = n,
            failed,
            "spends refused after they were counted could not all be given back: they may stay counted"
        );
    }
}

/// Whether transaction `txid` committed, asked until the database says
/// it committed or aborted, for at most [`CHECK_FOR`].
async fn committed(db: &Db, txid: i64) -> bool {
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
