//! The Lua scripts, and the one way every one of them is run: `EVALSHA` by
//! its SHA1, then once more with `EVAL` (which loads it again) when the
//! server has lost it (`NOSCRIPT` after a restart, `SCRIPT FLUSH` or a
//! failover).
//!
//! Each script is a `.lua` file beside this module.

use std::cell::RefCell;
use std::future::Future;
use std::sync::OnceLock;

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use super::connection::guarded::Routed;

/// The script run for every hit, by its SHA1 (`EVALSHA`).
///
/// It increments the counter and attaches the window's lifetime only when the
/// counter has none, which is the case for a counter it just created (or one
/// left without a lifetime by older code); an existing lifetime is never
/// touched. A value that is not a non-negative integer, or a key of another
/// type, is corrupt: the script answers `{reason}` and the stored value is
/// left exactly as it was. The window is checked before anything is written,
/// so no error can leave a counter without a lifetime.
///
/// It answers `{count, PTTL, PEXPIRETIME}`: the counter's absolute expiry
/// names the window for [`refund`](tower_pinned_window::backend::Backend::refund) (`-1` on
/// a server older than Redis 7.0, where hits are never refunded).
///
/// It is plain text in `hit.lua`, beside this file, for a review or a
/// `SCRIPT LOAD` of your own.
pub(crate) const HIT_SCRIPT: &str = include_str!("hit.lua");

/// The script of a coalesced call: [`HIT_SCRIPT`]'s step for several
/// counters, each taking one or more hits.
const HIT_BATCH_SCRIPT: &str = include_str!("hit_batch.lua");

/// Refunds, charges or clears the counter a hit was counted in, only in
/// that window (the counter's `PEXPIRETIME`, and the reset marker); never creates a key or touches a lifetime.
const AMEND_SCRIPT: &str = include_str!("amend.lua");

/// A spend, all or nothing, on every counter of a request, with its
/// lockouts.
const SPEND_SCRIPT: &str = include_str!("spend.lua");

/// Deletes a counter and its lockout, and records the deletion in the reset
/// marker.
const RESET_SCRIPT: &str = include_str!("reset.lua");

/// Reads a counter without counting.
const PEEK_SCRIPT: &str = include_str!("peek.lua");

/// Closes a counter for a span (the provider's word): its lockout created
/// with that lifetime, or moved later, never sooner.
const CLOSE_SCRIPT: &str = include_str!("close.lua");

/// Raises a counter's count (the provider's word): never past the limit,
/// never lowered, a live window kept, a missing counter created with its
/// lifetime in the same step.
const RAISE_SCRIPT: &str = include_str!("raise.lua");

/// Attaches a window to a counter that has no lifetime; touches nothing
/// else, and never a corrupt key (whose lifetime would make it vanish).
const REPAIR_SCRIPT: &str = include_str!("repair.lua");

/// The record of a key's slots in flight (a sorted set of slot names
/// scored by their leases' ends on the server's clock): what the
/// scripts of slots share, their corrupt check first. Each of them is this
/// text followed by its own file's.
macro_rules! slots_script {
    ($file:literal) => {
        concat!(include_str!("slots.lua"), include_str!($file))
    };
}

/// Takes a slot: drops the leases that ran out, then adds the slot with its
/// lease when fewer than the cap are live, and gives the record a lifetime
/// of at least that lease in the same step.
const TAKE_SCRIPT: &str = slots_script!("take.lua");

/// Gives a slot back; never creates a record.
const GIVE_BACK_SCRIPT: &str = slots_script!("give_back.lua");

/// Extends the live slots of one or more records (skipping a corrupt one);
/// never adds a slot that is gone.
const EXTEND_SCRIPT: &str = slots_script!("extend.lua");

/// Takes and gives back slots of one or more records in one call (the
/// lanes'), each step exactly as [`TAKE_SCRIPT`] or [`GIVE_BACK_SCRIPT`]
/// makes it alone, a corrupt record refusing only its own steps.
const SLOTS_BATCH_SCRIPT: &str = slots_script!("slots_batch.lua");

/// Takes a slot and counts (or spends on) a request's counters in one
/// atomic step, for one or more requests: the slot only when the counters
/// admit the request, the counters only read when the slot is held already
/// or the cap is full.
const TAKE_ALL_SCRIPT: &str = slots_script!("take_all.lua");

/// Counts a record's live slots.
const IN_USE_SCRIPT: &str = slots_script!("in_use.lua");

/// Attaches a lifetime to a record of slots that has none, never shorter
/// than its latest lease; never to a record that is not one.
const REPAIR_SLOTS_SCRIPT: &str = slots_script!("repair_slots.lua");

/// A script, its SHA1 (the name `EVALSHA` runs it by), and what a log line
/// calls it.
pub(super) struct Script {
    name: &'static str,
    text: &'static str,
    /// Computed on the first call.
    sha: OnceLock<String>,
}

impl Script {
    const fn new(name: &'static str, text: &'static str) -> Self {
        Self {
            name,
            text,
            sha: OnceLock::new(),
        }
    }

    /// The SHA1 `EVALSHA` runs the script by.
    fn sha(&self) -> &str {
        self.sha.get_or_init(|| sha1_hex(self.text))
    }
}

/// One hit on one counter.
pub(super) static HIT: Script = Script::new("hit", HIT_SCRIPT);

/// Hits on several counters, in one call.
pub(super) static HIT_BATCH: Script = Script::new("hit_batch", HIT_BATCH_SCRIPT);

/// A hit refunded, charged or cleared.
pub(super) static AMEND: Script = Script::new("amend", AMEND_SCRIPT);

/// A spend.
pub(super) static SPEND: Script = Script::new("spend", SPEND_SCRIPT);

/// A reset.
pub(super) static RESET: Script = Script::new("reset", RESET_SCRIPT);

/// A counter read.
pub(super) static PEEK: Script = Script::new("peek", PEEK_SCRIPT);

/// A counter closed by the provider's word.
pub(super) static CLOSE: Script = Script::new("close", CLOSE_SCRIPT);

/// A counter raised by the provider's word.
pub(super) static RAISE: Script = Script::new("raise", RAISE_SCRIPT);

/// A lifetime given to a counter found without one (the audit).
pub(super) static REPAIR: Script = Script::new("repair", REPAIR_SCRIPT);

/// A slot taken.
pub(super) static TAKE: Script = Script::new("take", TAKE_SCRIPT);

/// A slot given back.
pub(super) static GIVE_BACK: Script = Script::new("give_back", GIVE_BACK_SCRIPT);

/// Slots taken and given back, many in one call.
pub(super) static SLOTS_BATCH: Script = Script::new("slots_batch", SLOTS_BATCH_SCRIPT);

/// Slots taken with their requests' counters, one or more in one call.
pub(super) static TAKE_ALL: Script = Script::new("take_all", TAKE_ALL_SCRIPT);

/// Slots extended.
pub(super) static EXTEND: Script = Script::new("extend", EXTEND_SCRIPT);

/// Live slots counted.
pub(super) static IN_USE: Script = Script::new("in_use", IN_USE_SCRIPT);

/// A lifetime given to a record of slots found without one (the audit).
pub(super) static REPAIR_SLOTS: Script = Script::new("repair_slots", REPAIR_SLOTS_SCRIPT);

/// Bytes in the decimal form of any `u64`, at most.
pub(super) const U64_DIGITS: usize = 20;

/// Where a script call goes: a connection (the backend's, behind its
/// breaker), or one node of a deployment (the audit).
pub(super) trait Target {
    /// Send `cmd` and give its reply.
    fn send(&mut self, cmd: &Cmd) -> impl Future<Output = RedisResult<Value>> + Send;
}

/// As `cmd.query_async(connection)` sends it: a server's error reply
/// (`NOSCRIPT`, say) is an error, after the breaker has taken the reply as
/// it came.
impl<C: ConnectionLike + Clone + Send + 'static> Target for Routed<C> {
    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.call(cmd).await?.extract_error()
    }
}

/// Commands kept per thread for the next script calls to fill.
const SPARE_CMDS: usize = 4;

thread_local! {
    /// Commands whose buffers the next script calls reuse: a call takes one
    /// (or makes one), and gives it back cleared once answered, so that a
    /// call allocates nothing for its command once the thread has run a
    /// few. A command is at most a batch's (about 35 KB for 512 counters),
    /// so a thread holds at most [`SPARE_CMDS`] of those.
    static SPARE: RefCell<Vec<Cmd>> = const { RefCell::new(Vec::new()) };
}

/// A command to fill: a spare one of this thread's, or a new one with room
/// for `args` arguments of `bytes` bytes in all.
fn take_cmd(args: usize, bytes: usize) -> Cmd {
    SPARE
        .try_with(|spare| spare.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Cmd::with_capacity(args, bytes))
}

/// `cmd` cleared, for the next call on this thread.
fn give_back(mut cmd: Cmd) {
    cmd.clear();
    let _ = SPARE.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARE_CMDS {
            spare.push(cmd);
        }
    });
}

/// The size of a script call, known before it is built: its keys, the
/// arguments that follow `numkeys` (keys included), and their bytes in all.
/// A command grown one argument at a time reallocates both its buffers as it
/// grows: a dozen times for a batch, several of them over a kilobyte, which
/// also has the allocator sort through every small block freed since.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size {
    pub(super) keys: usize,
    pub(super) args: usize,
    pub(super) bytes: usize,
}

impl Size {
    /// A call on one key, with at most one number after it.
    pub(super) fn one_key(key: &[u8]) -> Self {
        Self {
            keys: 1,
            args: 2,
            bytes: key.len() + U64_DIGITS,
        }
    }
}

impl Script {
    /// Run the script on `target` by its SHA1, and once more by its text if
    /// the server has lost it. `args` appends the keys and arguments, as
    /// `size` announced them; it is called again for the second try.
    pub(super) async fn run(
        &self,
        target: &mut impl Target,
        size: Size,
        args: impl Fn(&mut Cmd),
    ) -> RedisResult<Value> {
        let build = |name: &str, script: &str| {
            let bytes = name.len() + script.len() + U64_DIGITS + size.bytes;
            let mut cmd = take_cmd(3 + size.args, bytes);
            cmd.arg(name).arg(script).arg(size.keys);
            args(&mut cmd);
            cmd
        };
        // Given back only once answered: a call dropped before (its
        // request gone) drops its command too.
        let cmd = build("EVALSHA", self.sha());
        let reply = target.send(&cmd).await;
        give_back(cmd);
        match reply {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(
                    script = self.name,
                    "script missing on the server (restart or SCRIPT FLUSH): sending it with EVAL"
                );
                let cmd = build("EVAL", self.text);
                let reply = target.send(&cmd).await;
                give_back(cmd);
                reply
            }
            other => other,
        }
    }

    /// [`run`](Self::run) on one key, with `arg` after it when there is one.
    pub(super) async fn run_on_key(
        &self,
        target: &mut impl Target,
        key: &[u8],
        arg: Option<u64>,
    ) -> RedisResult<Value> {
        self.run(target, Size::one_key(key), |cmd| {
            cmd.arg(key).arg(arg);
        })
        .await
    }
}

/// SHA1 of `text`, in lowercase hex: the name `EVALSHA` runs a script by.
fn sha1_hex(text: &str) -> String {
    ::redis::Script::new(text).get_hash().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_shas_are_sha1_of_their_text() {
        assert_eq!(sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        for script in [
            &HIT,
            &HIT_BATCH,
            &AMEND,
            &SPEND,
            &RESET,
            &PEEK,
            &CLOSE,
            &RAISE,
            &REPAIR,
            &TAKE,
            &GIVE_BACK,
            &SLOTS_BATCH,
            &TAKE_ALL,
            &EXTEND,
            &IN_USE,
            &REPAIR_SLOTS,
        ] {
            assert_eq!(script.sha(), sha1_hex(script.text), "{}", script.name);
            assert_eq!(script.sha().len(), 40, "{}", script.name);
        }
    }

    /// A record of slots that is not one is left as it is: each script of
    /// slots reads it through a shared check before its first write
    /// (the check itself, against a real server, is in the integration
    /// tests: `corrupt_records_of_slots_of_every_shape_are_left_as_they_are`).
    #[test]
    fn the_scripts_of_slots_check_the_record_before_they_write() {
        let shared = include_str!("slots.lua");
        for script in [
            &TAKE,
            &GIVE_BACK,
            &SLOTS_BATCH,
            &TAKE_ALL,
            &EXTEND,
            &IN_USE,
            &REPAIR_SLOTS,
        ] {
            let own = script
                .text
                .strip_prefix(shared)
                .unwrap_or_else(|| panic!("{}: the shared text comes first", script.name));
            // `not_slots` checks a record; `slots_of` reads it whole,
            // checked.
            let check = ["not_slots(", "slots_of("]
                .iter()
                .filter_map(|check| own.find(check))
                .min()
                .unwrap_or_else(|| panic!("{}: no corrupt check", script.name));
            for write in [
                "'ZADD'",
                "'ZREM'",
                "'ZREMRANGEBYSCORE'",
                "'PEXPIRE",
                "'DEL'",
                "'SET'",
                "'INCR",
                "live_until(",
            ] {
                if let Some(at) = own.find(write) {
                    assert!(check < at, "{}: {write} before the check", script.name);
                }
            }
        }
    }

    /// A counter that is not one, and a lockout without a lifetime, are
    /// left as they are: the scripts of the provider's word read them
    /// before their first write (the checks themselves, against a real
    /// server, are in the integration tests).
    #[test]
    fn the_scripts_of_the_providers_word_check_before_they_write() {
        for (script, checks) in [
            (
                &CLOSE,
                &["redis.pcall('GET', KEYS[1])", "'PEXPIRETIME', KEYS[2]"][..],
            ),
            (&RAISE, &["redis.pcall('GET', KEYS[1])"][..]),
        ] {
            let last_check = checks
                .iter()
                .map(|check| {
                    script
                        .text
                        .find(check)
                        .unwrap_or_else(|| panic!("{}: no {check}", script.name))
                })
                .max()
                .unwrap_or_default();
            for write in ["'SET'", "'PEXPIREAT'", "'PEXPIRE'", "'DEL'", "'INCR"] {
                if let Some(at) = script.text.find(write) {
                    assert!(last_check < at, "{}: {write} before a check", script.name);
                }
            }
        }
    }

    /// A target that answers `NOSCRIPT` to every `EVALSHA`, and records
    /// what it was sent.
    struct Forgetful(Vec<Vec<u8>>);

    impl Target for Forgetful {
        async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
            let name = match cmd.args_iter().next() {
                Some(::redis::Arg::Simple(name)) => name.to_vec(),
                _ => Vec::new(),
            };
            self.0.push(name.clone());
            if name == b"EVALSHA" {
                Err(::redis::RedisError::from((
                    ErrorKind::Server(ServerErrorKind::NoScript),
                    "no script",
                )))
            } else {
                Ok(Value::Int(cmd.args_iter().count() as i64))
            }
        }
    }

    /// A connection whose server has lost every script: it answers
    /// `EVALSHA` with a `NOSCRIPT` error reply, as Redis does (a value, not
    /// an I/O error), and anything else with 1.
    #[derive(Clone, Default)]
    struct Restarted(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

    impl ConnectionLike for Restarted {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> ::redis::RedisFuture<'a, Value> {
            let name = match cmd.args_iter().next() {
                Some(::redis::Arg::Simple(name)) => name.to_vec(),
                _ => Vec::new(),
            };
            let reply = if name == b"EVALSHA" {
                ::redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n").unwrap()
            } else {
                Value::Int(1)
            };
            self.0.lock().unwrap().push(name);
            Box::pin(std::future::ready(Ok(reply)))
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a ::redis::Pipeline,
            _: usize,
            _: usize,
        ) -> ::redis::RedisFuture<'a, Vec<Value>> {
            unreachable!("a script call is one command")
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[test]
    fn a_noscript_reply_through_the_breaker_sends_the_text() {
        let connection = Restarted::default();
        let guarded = crate::connection::guarded::Guarded::new(connection.clone(), None, None);
        let reply = futures_util::FutureExt::now_or_never(HIT.run_on_key(
            &mut guarded.for_write(b"tpw:n{k}"),
            b"tpw:n{k}",
            Some(60_000),
        ))
        .expect("ready");
        assert_eq!(reply.unwrap(), Value::Int(1));
        assert_eq!(
            *connection.0.lock().unwrap(),
            [b"EVALSHA".to_vec(), b"EVAL".to_vec()]
        );
    }

    #[test]
    fn a_lost_script_is_sent_again_by_its_text_once() {
        let mut target = Forgetful(Vec::new());
        let reply = futures_util::FutureExt::now_or_never(HIT.run_on_key(
            &mut target,
            b"tpw:n{k}",
            Some(60_000),
        ))
        .expect("ready");
        // EVAL, the script, numkeys, the key and the window.
        assert_eq!(reply.unwrap(), Value::Int(5));
        assert_eq!(target.0, [b"EVALSHA".to_vec(), b"EVAL".to_vec()]);
    }
}
