//! Replica-acknowledged writes
//! ([`wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas)):
//! a command that writes counters goes out as one pipeline,
//! `[the command, WAIT <replicas> <timeout ms>]`, on the connection (so the
//! node) it would have gone on alone: no second round trip, and on a
//! Cluster the pipeline goes to the master of the command's key (the
//! `redis` client routes a pipeline by its first keyed command; `WAIT` has
//! no key).
//!
//! The command's answer counts only once `WAIT` says that `replicas`
//! replicas hold what the connection wrote. Fewer (the timeout ran out: the
//! master lost its replicas, or was deposed and has none left to answer it)
//! and the answer is dropped: the call fails as an outage, which counts
//! against its master's breaker. What the master did stays as it is: the
//! command is never sent again, and nothing is undone.

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};

/// How many replicas must hold a write, and how long `WAIT` may wait for
/// them (milliseconds, at least 1: `WAIT n 0` would wait forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acks {
    pub(crate) replicas: u32,
    pub(crate) timeout_ms: u64,
}

impl Acks {
    /// `replicas` (at least 1) within `timeout` (not zero), rounded up to
    /// the next millisecond; the caller has checked both.
    pub(crate) fn new(replicas: u32, timeout: Duration) -> Self {
        debug_assert!(replicas > 0 && !timeout.is_zero());
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        // WAIT reads a signed 64-bit count of milliseconds.
        let timeout_ms = u64::try_from(ms).unwrap_or(u64::MAX).min(i64::MAX as u64);
        Self {
            replicas,
            timeout_ms,
        }
    }

    /// Send `cmd` followed by `WAIT`, in one pipeline on `connection`; the
    /// command's answer once acknowledged. The command's own error (a
    /// missing script, a refusal) is given as it would be alone, whatever
    /// `WAIT` said. An answer not acknowledged by enough replicas is an
    /// error ([`NotAcknowledged`], an I/O kind, so it counts as an outage).
    pub(crate) async fn send<C: ConnectionLike>(
        self,
        connection: &mut C,
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        let mut pipeline = Pipeline::with_capacity(2);
        pipeline.add_command(cmd.clone());
        pipeline.cmd("WAIT").arg(self.replicas).arg(self.timeout_ms);
        let replies = connection.req_packed_commands(&pipeline, 0, 2).await?;
        let Ok([reply, acked]) = <[Value; 2]>::try_from(replies) else {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a write and its WAIT did not get two answers",
            )));
        };
        let reply = reply.extract_error()?;
        match acked {
            Value::Int(n) if n >= i64::from(self.replicas) => Ok(reply),
            other => Err(RedisError::from(std::io::Error::other(NotAcknowledged {
                acks: self,
                answer: other,
            }))),
        }
    }
}

/// A write that `WAIT` did not see reach enough replicas in time: its
/// answer is not used.
#[derive(Debug)]
pub(crate) struct NotAcknowledged {
    acks: Acks,
    /// `WAIT`'s answer: the replicas that did acknowledge, or its error.
    answer: Value,
}

impl fmt::Display for NotAcknowledged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Acks {
            replicas,
            timeout_ms,
        } = self.acks;
        write!(
            f,
            "the write was not acknowledged by {replicas} replica(s) within {timeout_ms} ms ("
        )?;
        match &self.answer {
            Value::Int(n) => write!(f, "{n} did")?,
            Value::ServerError(err) => write!(f, "WAIT answered {err}")?,
            other => write!(f, "WAIT answered {other:?}")?,
        }
        f.write_str(NOT_ACKNOWLEDGED)
    }
}

impl std::error::Error for NotAcknowledged {}

/// Whether `err` is a write `WAIT` did not see acknowledged: its reply came
/// back (the master ran it), only the replicas' acknowledgement is missing.
/// The `redis` crate keeps the I/O error it wraps to itself, so this reads
/// its message (only on a failed call).
pub(crate) fn is_not_acknowledged(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Io && err.to_string().contains(NOT_ACKNOWLEDGED)
}

/// What [`NotAcknowledged`]'s message says, and no other error's.
const NOT_ACKNOWLEDGED: &str = "): its answer is not used; what the master counted stays";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_rounded_up_to_whole_milliseconds() {
        let ms = |timeout| Acks::new(1, timeout).timeout_ms;
        assert_eq!(ms(Duration::from_nanos(1)), 1);
        assert_eq!(ms(Duration::from_millis(1)), 1);
        assert_eq!(ms(Duration::from_micros(1_001)), 2);
        assert_eq!(ms(Duration::from_secs(2)), 2_000);
        assert_eq!(ms(Duration::MAX), i64::MAX as u64);
    }

    /// A connection that answers each pipeline with `replies`, and records
    /// the commands it was sent.
    struct Canned {
        replies: Vec<Value>,
        sent: Vec<Vec<u8>>,
    }

    impl ConnectionLike for Canned {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> ::redis::RedisFuture<'a, Value> {
            unreachable!("a write goes with its WAIT")
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a Pipeline,
            _: usize,
            _: usize,
        ) -> ::redis::RedisFuture<'a, Vec<Value>> {
            self.sent = pipeline
                .cmd_iter()
                .map(|cmd| cmd.get_packed_command())
                .collect();
            Box::pin(std::future::ready(Ok(self.replies.clone())))
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn send(replies: Vec<Value>) -> (RedisResult<Value>, Vec<Vec<u8>>) {
        let mut connection = Canned {
            replies,
            sent: Vec::new(),
        };
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg("sha").arg(1).arg("k");
        let acks = Acks::new(2, Duration::from_micros(1_500));
        let reply =
            futures_util::FutureExt::now_or_never(acks.send(&mut connection, &cmd)).expect("ready");
        (reply, connection.sent)
    }

    #[test]
    fn an_answer_counts_once_enough_replicas_hold_it() {
        let (reply, sent) = send(vec![Value::Int(7), Value::Int(2)]);
        assert_eq!(reply.unwrap(), Value::Int(7));
        assert_eq!(sent.len(), 2, "the write and its WAIT, in one pipeline");
        assert_eq!(
            sent[1],
            ::redis::cmd("WAIT").arg(2).arg(2).get_packed_command()
        );
    }

    #[test]
    fn an_answer_not_acknowledged_is_an_outage() {
        let (reply, _) = send(vec![Value::Int(7), Value::Int(1)]);
        let err = reply.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "counted as an outage");
        assert!(is_not_acknowledged(&err));
        assert!(
            err.to_string()
                .contains("not acknowledged by 2 replica(s) within 2 ms (1 did)"),
            "{err}"
        );
    }

    #[test]
    fn the_write_s_own_error_comes_first() {
        let no_script = ::redis::parse_redis_value(b"-NOSCRIPT no script\r\n").unwrap();
        let (reply, _) = send(vec![no_script, Value::Int(0)]);
        assert_eq!(
            reply.unwrap_err().kind(),
            ErrorKind::Server(::redis::ServerErrorKind::NoScript)
        );
    }
}
