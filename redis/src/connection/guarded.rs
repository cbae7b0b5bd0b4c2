//! The connection wrapper every command the backend sends goes through,
//! whatever path sends it: a command is sent on [`Guarded::for_key`], which
//! is told the key the command is for and picks its breaker
//! ([`Breakers`]) from that key (the command itself is never read back to
//! find it); a command that writes counters on [`Guarded::for_write`], with
//! its `WAIT` in the replica-acknowledged mode ([`Acks`]).

use std::sync::Arc;

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::acks::Acks;
use super::breaker::{Breakers, Settle};
use super::classify::open_error;
use super::cluster_watch::watch_cluster;
use super::slot_map::MAP_REPLY_BOUND;

/// A connection behind the backend's breakers. Commands go out on
/// [`for_key`](Self::for_key), or [`for_write`](Self::for_write) for those
/// that write counters.
#[derive(Clone)]
pub(crate) struct Guarded<C> {
    inner: C,
    /// `None` when the breaker is off.
    breakers: Option<Arc<Breakers>>,
    /// The replicas a write waits for; `None` (the default): none.
    acks: Option<Acks>,
}

impl<C> Guarded<C> {
    /// `inner` behind `breakers` (`None`: no breaker), its writes
    /// acknowledged by `acks` (`None`: not waited for).
    pub(crate) fn new(inner: C, breakers: Option<Arc<Breakers>>, acks: Option<Acks>) -> Self {
        Self {
            inner,
            breakers,
            acks,
        }
    }

    /// The connection, without its breakers.
    pub(crate) fn unguarded(&self) -> &C {
        &self.inner
    }
}

impl<C: Clone> Guarded<C> {
    /// The connection for commands on `key`, behind that key's breaker: its
    /// master's on a Cluster. Costs what a clone of the connection costs.
    pub(crate) fn for_key(&self, key: &[u8]) -> Routed<C> {
        Routed {
            inner: self.inner.clone(),
            breaker: self
                .breakers
                .as_ref()
                .map(|breakers| (Arc::clone(breakers), breakers.for_key(key))),
            acks: None,
        }
    }

    /// [`for_key`](Self::for_key), for a command that writes counters: in
    /// the replica-acknowledged mode it goes with its `WAIT` ([`Acks`]).
    pub(crate) fn for_write(&self, key: &[u8]) -> Routed<C> {
        Routed {
            acks: self.acks,
            ..self.for_key(key)
        }
    }
}

/// A connection behind one breaker, the one of the key its commands are
/// for ([`Guarded::for_key`]).
pub(crate) struct Routed<C> {
    inner: C,
    /// The breakers and the index of this key's; `None` when the breaker
    /// is off.
    breaker: Option<(Arc<Breakers>, usize)>,
    /// A command is sent with its `WAIT` ([`Guarded::for_write`] in the
    /// replica-acknowledged mode).
    acks: Option<Acks>,
}

impl<C> Routed<C> {
    fn settle(&self) -> Result<Option<Settle>, RedisError> {
        let Some((breakers, index)) = &self.breaker else {
            return Ok(None);
        };
        match Settle::admit(breakers, *index) {
            Some(settle) => Ok(Some(settle)),
            None => Err(open_error()),
        }
    }
}

impl<C> Routed<C>
where
    C: ConnectionLike + Clone + Send + 'static,
{
    /// On a Cluster, read the slot map in the background when it is due.
    fn refresh_map(&self) {
        let Some((breakers, _)) = &self.breaker else {
            return;
        };
        if !breakers.map_due() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            breakers.map_not_asked();
            return;
        };
        let (mut connection, breakers) = (self.inner.clone(), Arc::clone(breakers));
        let asked = breakers.map_asked();
        runtime.spawn(async move {
            // Asked of a node at random: one that is silent answers when
            // it wakes, with the map it had before it went silent. A reply
            // later than `MAP_REPLY_BOUND` is dropped: taken in, it could
            // point a promoted replica's slots back at the old master
            // (newer than anything the watcher read, once the watcher
            // stopped with the breakers closed).
            let reply = tokio::time::timeout(
                MAP_REPLY_BOUND,
                ::redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut connection),
            )
            .await;
            match reply {
                Ok(Ok(reply)) => {
                    breakers.map(&reply, asked);
                }
                Ok(Err(err)) => tracing::debug!(error = %err, "CLUSTER SLOTS failed: breakers keep the slot map they have"),
                Err(_) => tracing::debug!("CLUSTER SLOTS answered too late: breakers keep the slot map they have"),
            }
        });
    }

    /// `cmd` past the breaker, as [`req_packed_command`] sends it, in a
    /// future of its own rather than a box: a script call holds it in
    /// place (one allocation fewer a call than the trait's boxed future).
    ///
    /// [`req_packed_command`]: ConnectionLike::req_packed_command
    pub(crate) async fn call(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let settle = self.admit()?;
        match self.acks {
            None => settled(settle, self.inner.req_packed_command(cmd)).await,
            Some(acks) => settled(settle, acks.send(&mut self.inner, cmd)).await,
        }
    }

    /// Whether a call may go out now: `Err` while the breaker is open (the
    /// call is answered at once), else how to settle it ([`settled`]).
    fn admit(&self) -> Result<Option<Settle>, RedisError> {
        self.refresh_map();
        let settle = self.settle();
        if settle.is_err()
            && let Some((breakers, _)) = &self.breaker
        {
            watch_cluster(breakers, &self.inner);
        }
        settle
    }
}

/// A call past its breaker, settled with it when answered, or when
/// dropped (its request gone) before (see [`Settle`]).
async fn settled<T>(
    settle: Option<Settle>,
    call: impl Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    let result = call.await;
    if let Some(settle) = settle {
        settle.result(&result);
    }
    result
}

impl<C> ConnectionLike for Routed<C>
where
    C: ConnectionLike + Clone + Send + 'static,
{
    /// The command past its breaker; with [`Acks`], with its `WAIT`, and a
    /// write not acknowledged settles as a failure of the breaker.
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let settle = self.admit();
        Box::pin(async move {
            settled(
                settle?,
                self.inner.req_packed_commands(pipeline, offset, count),
            )
            .await
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::connection::breaker::{BreakerConfig, Pass};
    use crate::connection::classify::{is_open, is_outage};

    /// Answers a command alone with 1, and a pipeline (a write with its
    /// `WAIT`) with 1 and no replica.
    #[derive(Clone)]
    struct NoReplica;

    impl ConnectionLike for NoReplica {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            Box::pin(std::future::ready(Ok(Value::Int(1))))
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a Pipeline,
            _: usize,
            _: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(std::future::ready(Ok(vec![Value::Int(1), Value::Int(0)])))
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[test]
    fn a_write_not_acknowledged_counts_against_its_breaker() {
        let breakers = Arc::new(Breakers::new(
            BreakerConfig {
                failures: 2,
                cooldown: Duration::from_secs(60),
            },
            false,
            None,
        ));
        let guarded = Guarded::new(
            NoReplica,
            Some(Arc::clone(&breakers)),
            Some(Acks::new(1, Duration::from_millis(5))),
        );
        let send = |mut routed: Routed<NoReplica>| {
            futures_util::FutureExt::now_or_never(
                ::redis::cmd("EVALSHA").query_async::<Value>(&mut routed),
            )
            .expect("ready")
        };
        for _ in 0..3 {
            assert_eq!(
                send(guarded.for_key(b"k")).unwrap(),
                Value::Int(1),
                "a read goes alone"
            );
        }
        assert_eq!(breakers.admit(0), Some(Pass::Closed));
        for _ in 0..2 {
            let err = send(guarded.for_write(b"k")).unwrap_err();
            assert!(is_outage(&err), "{err}");
        }
        assert_eq!(
            breakers.admit(0),
            None,
            "open after 2 writes not acknowledged"
        );
        assert!(is_open(&send(guarded.for_write(b"k")).unwrap_err()));
    }
}
