//! The Cluster watcher: while a breaker of a Cluster connection is open,
//! a background task reads `CLUSTER INFO` and lets the open breakers probe
//! at once when the Cluster is whole again, and reads `CLUSTER SLOTS` to
//! follow a silent master's slots to their new master.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use ::redis::aio::ConnectionLike;

use super::breaker::{BREAKER_FIRST_PROBE, Breakers};
#[cfg(feature = "cluster")]
use super::node::nudge;

/// How often `CLUSTER INFO` is read while a Cluster breaker is open, and
/// how long one read may take.
const CLUSTER_WATCH: Duration = BREAKER_FIRST_PROBE;

/// How many polls (one second's) after `CLUSTER INFO` turned from `fail`
/// to `ok` an `ok` lets the open breakers probe at once again: the nodes
/// turn ok one by one, and a probe sent while its master still refused
/// failed and grew its breaker's wait.
const CLUSTER_OK_RELEASES: u32 = 40;

/// On a Cluster with a breaker open: read `CLUSTER INFO` in the
/// background (one node at random, every [`CLUSTER_WATCH`]) until no
/// breaker is open, and when it turns from `fail` back to `ok`, let
/// every open breaker probe at once, and again on each `ok` for
/// [`CLUSTER_OK_RELEASES`] polls. A breaker opened while the Cluster
/// refused every key is then closed by the first probe after its
/// master is ok, not after its grown wait. One watcher per backend.
pub(super) fn watch_cluster<C>(breakers: &Arc<Breakers>, connection: &C)
where
    C: ConnectionLike + Clone + Send + 'static,
{
    if !breakers.is_cluster() || !breakers.start_watching() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        breakers.stop_watching();
        return;
    };
    let (mut connection, breakers) = (connection.clone(), Arc::clone(breakers));
    runtime.spawn(async move {
        // `fail` was read since the last release; polls left in which
        // an `ok` releases the open breakers again.
        let (mut failed, mut releases) = (false, 0);
        let mut polls = 0u32;
        while breakers.any_open() {
            let info = tokio::time::timeout(
                CLUSTER_WATCH * 4,
                ::redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async::<String>(&mut connection),
            )
            .await;
            match info {
                Ok(Ok(info)) if info.contains("cluster_state:fail") => {
                    (failed, releases) = (true, 0);
                }
                Ok(Ok(info)) if (failed || releases > 0) && info.contains("cluster_state:ok") => {
                    breakers.cluster_ok_again(std::mem::take(&mut failed));
                    if releases == 0 {
                        releases = CLUSTER_OK_RELEASES;
                    }
                    releases -= 1;
                }
                _ => {}
            }
            polls += 1;
            if polls.is_multiple_of(SLOTS_EVERY) {
                follow_moves(&breakers, &mut connection).await;
            }
            tokio::time::sleep(CLUSTER_WATCH).await;
        }
        breakers.stop_watching();
    });
}

/// Without `redis-cluster`, no connection is one of the `redis` crate's
/// Cluster clients: nothing to nudge.
#[cfg(not(feature = "cluster"))]
async fn nudge<C>(_connection: &mut C, _slot: u16, _via: &str) -> bool {
    true
}

/// Every how many `CLUSTER INFO` polls the watcher reads `CLUSTER SLOTS`
/// too (every 100 ms): a master whose breaker is open may have been
/// replaced while it said nothing.
const SLOTS_EVERY: u32 = 4;

/// Read `CLUSTER SLOTS` (bounded), take it in, and when slots of a
/// master whose breaker is open have a new master (found by this read or
/// by the periodic one: [`Breakers::map`]), make the Cluster client read
/// its slot map again ([`nudge`]): a master that went silent gives the
/// client neither an error nor a redirection, so its map would point at
/// the silent node until it woke.
///
/// A nudge is sent again, at each call, until the client routes the slot
/// to a master that answers, or the silent master's breaker closes. The
/// node asked, or the node the client reads its map from, may not know of
/// the promotion yet (the Cluster spreads it by gossip) and send the
/// client back to the silent master: one nudge only would then leave the
/// client's map pointing there until the master woke, and the hits on its
/// keys would time out behind the new master's breaker.
async fn follow_moves<C>(breakers: &Breakers, connection: &mut C)
where
    C: ConnectionLike + Send + 'static,
{
    let asked = breakers.map_asked();
    let reply = tokio::time::timeout(
        CLUSTER_WATCH * 4,
        ::redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(connection),
    )
    .await;
    if let Ok(Ok(reply)) = reply {
        breakers.map(&reply, asked);
    }
    let mut left = Vec::new();
    for (slot, from, to) in breakers.unfollowed() {
        if !breakers.is_open(from) {
            continue;
        }
        let followed = match breakers.bystander(from, to) {
            Some(via) => nudge(connection, slot, &via).await,
            None => false,
        };
        if !followed {
            left.push((slot, from, to));
        }
    }
    breakers.unfollowed_again(left);
}
