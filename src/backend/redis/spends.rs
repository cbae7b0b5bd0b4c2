//! Spends and amends through the lanes, as hits go: the spends of the
//! requests issued while a call is in flight go together in the next call
//! of the spend script (`spend.lua`), and their amends (refunds, charges,
//! clears) in the next call of the amend script (`amend.lua`). Each has
//! lanes of its own, beside the hits' ([`coalesce`](super::coalesce)).
//!
//! A call of several changes nothing about each one: the script applies
//! them in order, each request all or nothing over its own counters, and
//! each sees the counters as the ones before it left them, exactly as if
//! each had been its own call. So the admitted costs of a key never pass
//! its limit and add up to its stored count, however many share a call. A
//! corrupt counter answers only the requests on it; the others of the call
//! are decided. A call cut by a dropped connection is never sent again by
//! the crate: each of its requests was counted once (the script ran) or not
//! at all, and its caller sees the failure.

use std::borrow::Borrow;
use std::num::NonZeroU64;
use std::sync::Arc;

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use smallvec::SmallVec;

use super::coalesce::{Answers, Work};
use super::connection::breaker::Guarded;
use super::hits::{Finish, StoredKey};
use super::reply::{Full, Spent, corrupt, parse_amends, parse_spends};
use super::script::{AMEND, SPEND, Size, U64_DIGITS};
use crate::backend::deny_cache::Denials;
use crate::backend::storage_key::{LOCKOUT, RESET_MARKER};
use crate::backend::{Amend, BackendError, Hits, Spend};
use crate::key::Key;

/// The key of a marker beside `counter` (its lockout or its reset marker):
/// the counter's key and `suffix`, written into the call only, inline.
fn beside(counter: &[u8], suffix: &[u8]) -> StoredKey {
    let mut marker = StoredKey::new();
    marker.extend_from_slice(counter);
    marker.extend_from_slice(suffix);
    marker
}

/// One request's spend, for a lane: its counters' storage keys (a lockout's
/// key is its counter's and a suffix, written only into the call), what it
/// spends, and what makes its hits of the answer (the quotas, and the deny
/// cache that remembers a counter no spend can fit).
pub(super) struct SpendWork {
    pub(super) counters: SmallVec<[StoredKey; 2]>,
    pub(super) spend: Spend,
    pub(super) finish: Finish,
}

impl SpendWork {
    /// The numbers of the request's one argument: n, cost, open, lockout,
    /// then each counter's limit and window.
    fn numbers(&self) -> usize {
        4 + 2 * self.counters.len()
    }

    /// The request's one argument: its numbers in decimal, apart by a
    /// space (`1 5 0 0 100 60000`), written inline.
    fn argument(&self) -> SmallVec<[u8; 64]> {
        let Spend { cost, open, block } = self.spend;
        let head = [
            self.counters.len() as u64,
            cost,
            u64::from(open),
            block.map_or(0, |b| b.as_millis()),
        ];
        let quotas = self
            .finish
            .quotas
            .iter()
            .flat_map(|q| [q.limit(), q.window().as_millis()]);
        let mut out = SmallVec::new();
        let mut digits = itoa::Buffer::new();
        for (i, n) in head.into_iter().chain(quotas).enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(digits.format(n).as_bytes());
        }
        out
    }
}

impl Work for SpendWork {
    type Answer = Hits;

    fn key(&self) -> &[u8] {
        self.counters.first().map_or(&[][..], |key| key)
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Hits>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        let works = || works.iter().map(Borrow::borrow);
        let keys: usize = works().map(|w| 2 * w.counters.len()).sum();
        let size = Size {
            keys,
            args: keys + works().count(),
            bytes: works()
                .map(|w| {
                    w.counters
                        .iter()
                        .map(|c| 2 * c.len() + LOCKOUT.len())
                        .sum::<usize>()
                        + w.numbers() * (U64_DIGITS + 1)
                })
                .sum(),
        };
        let first = works().next().map_or(&[][..], SpendWork::key);
        let reply = SPEND
            .run(&mut connection.for_write(first), size, |cmd| {
                for work in works() {
                    for counter in &work.counters {
                        let lock = beside(counter, LOCKOUT);
                        cmd.arg(counter.as_slice()).arg(lock.as_slice());
                    }
                }
                for work in works() {
                    cmd.arg(work.argument().as_slice());
                }
            })
            .await?;
        let spent = match parse_spends(reply, works().map(|w| w.counters.len())) {
            Ok(spent) => spent,
            Err(other) => {
                let detail = format!("unexpected reply to a spend batch: {other:?}");
                return Ok(works()
                    .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                    .collect());
            }
        };
        Ok(works()
            .zip(spent)
            .map(|(work, spent)| work.answer(spent))
            .collect())
    }
}

impl SpendWork {
    /// The request's hits, from the script's answer for it. A counter no
    /// spend can fit until its time left is over (at its limit, or locked
    /// out) is remembered by the deny cache until then.
    fn answer(&self, spent: Spent) -> Result<Hits, BackendError> {
        match spent {
            Spent::Decided(counters) => Ok(counters
                .into_iter()
                .zip(&self.counters)
                .zip(&self.finish.lowers)
                .map(|(((hit, full), stored), &lowers)| {
                    match full {
                        Full::No => {}
                        Full::AtLimit => self.finish.remember(stored, hit.reset, false, lowers),
                        Full::Locked => self.finish.remember(stored, hit.reset, true, lowers),
                    }
                    hit
                })
                .collect()),
            Spent::Corrupt { counter, reason } => {
                let key = self.counters.get(counter).map_or(&[][..], |stored| stored);
                Err(corrupt(key, reason))
            }
            Spent::Invalid(reason) => Err(BackendError::Unavailable(reason.into())),
        }
    }
}

/// One amend, for a lane: the counter (its reset marker's key is the
/// counter's and a suffix, written only into the call), what to do, and the
/// hit's deadline; with the deny cache, the counter to forget once Redis
/// has answered.
pub(super) struct AmendWork {
    pub(super) counter: StoredKey,
    pub(super) amend: Amend,
    pub(super) deadline: NonZeroU64,
    pub(super) forget: Option<Forget>,
}

/// A counter this instance's deny cache drops once its amend is answered,
/// so that the next request asks Redis again.
pub(super) struct Forget {
    pub(super) deny: Arc<Denials>,
    /// The namespace's bytes, inline when they fit.
    pub(super) namespace: StoredKey,
    pub(super) key: Key,
}

impl Forget {
    fn forget(&self) {
        if let Ok(namespace) = std::str::from_utf8(&self.namespace) {
            self.deny.forget(namespace, self.key.as_bytes());
        }
    }
}

impl Work for AmendWork {
    type Answer = bool;

    fn key(&self) -> &[u8] {
        &self.counter
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<bool>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        let works = || works.iter().map(Borrow::borrow);
        let n = works().count();
        let size = Size {
            keys: 2 * n,
            args: 5 * n,
            bytes: works()
                .map(|w| 2 * w.counter.len() + RESET_MARKER.len() + 3 * U64_DIGITS)
                .sum(),
        };
        let first = works().next().map_or(&[][..], AmendWork::key);
        let reply = AMEND
            .run(&mut connection.for_write(first), size, |cmd| {
                for work in works() {
                    let marker = beside(&work.counter, RESET_MARKER);
                    cmd.arg(work.counter.as_slice()).arg(marker.as_slice());
                }
                for work in works() {
                    let (op, amount) = match work.amend {
                        Amend::Refund(n) => ("refund", n),
                        Amend::Charge(n) => ("charge", n),
                        Amend::Clear => ("clear", 0),
                    };
                    cmd.arg(op).arg(amount).arg(work.deadline.get());
                }
            })
            .await;
        // Answered or failed: this instance asks Redis again either way.
        for work in works() {
            if let Some(forget) = &work.forget {
                forget.forget();
            }
        }
        let counters: SmallVec<[&[u8]; 1]> = works().map(|w| w.counter.as_slice()).collect();
        Ok(match parse_amends(reply?, &counters) {
            Ok(amended) => amended.into_iter().collect(),
            Err(other) => {
                let detail = format!("unexpected reply to an amend batch: {other:?}");
                works()
                    .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                    .collect()
            }
        })
    }
}
