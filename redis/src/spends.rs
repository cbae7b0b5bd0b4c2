//! Spends through the lanes, as hits go: the spends of the requests issued
//! while a call is in flight go together in the next call of the spend
//! script (`spend.lua`); their amends (refunds, charges, clears) go through
//! lanes of their own (`amends.rs`), beside the hits'
//! ([`coalesce`](super::coalesce)).
//!
//! A call of several changes nothing about each one: the script applies
//! them in order, each request all or nothing over its own counters, and
//! each sees the counters as the ones before it left them, exactly as if
//! each had been its own call. So the admitted costs of a key never pass
//! its limit and add up to its stored count, however many share a call. A
//! corrupt counter answers only the requests on it; the others of the call
//! are decided. A call cut by a dropped connection is never sent again by
//! the crate: each of its requests was counted once (the script ran) or not
//! at all, and its caller sees the failure; what it counted is given back
//! (`lost.rs`: every spend call names a marker the script writes its
//! answers to).

use std::borrow::Borrow;

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use smallvec::SmallVec;

use super::amends::beside;
use super::coalesce::{Answers, Work};
use super::connection::guarded::Guarded;
use super::hits::{Finish, StoredKey};
use super::lost::{self, Carried, InFlight, MARKER_ARG};
use super::reply::{Spent, corrupt, parse_spends};
use super::script::{SPEND, Size, U64_DIGITS};
use tower_pinned_window::backend::toolkit::storage_key::LOCKOUT;
use tower_pinned_window::backend::{BackendError, Hits, Spend};

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
    /// then each counter's limit and window, then the first counter's own
    /// amount and its word, when it has one.
    fn numbers(&self) -> usize {
        let first = if self.spend.first.is_some() { 2 } else { 0 };
        4 + 2 * self.counters.len() + first
    }

    /// The request's one argument: its numbers in decimal, apart by a
    /// space (`1 5 0 0 100 60000`), written inline; a spend whose first
    /// counter has an amount of its own ([`Spend::first`]) ends with the
    /// word `first` and that amount (`2 700 0 0 50 60000 10000 60000
    /// first 1`), and any other is sent as it was before there was one.
    fn argument(&self) -> SmallVec<[u8; 64]> {
        let Spend {
            cost,
            open,
            block,
            first,
            ..
        } = self.spend;
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
            .flat_map(|c| [c.quota.limit(), c.quota.window().as_millis()]);
        let mut out = SmallVec::new();
        let mut digits = itoa::Buffer::new();
        for (i, n) in head.into_iter().chain(quotas).enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(digits.format(n).as_bytes());
        }
        if let Some(unit) = first {
            out.extend_from_slice(b" first ");
            out.extend_from_slice(digits.format(unit).as_bytes());
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
        let batch = works;
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
        // The call's marker, beside its first counter (`lost`).
        let marker = lost::marker_key(first);
        let size = Size {
            keys: size.keys + 1,
            args: size.args + 2,
            bytes: size.bytes + marker.len() + MARKER_ARG.len(),
        };
        let in_flight = InFlight::new(connection, batch, &marker);
        let reply = SPEND
            .run(&mut connection.for_write(first), size, |cmd| {
                for work in works() {
                    for counter in &work.counters {
                        let lock = beside(counter, LOCKOUT);
                        cmd.arg(counter.as_slice()).arg(lock.as_slice());
                    }
                }
                cmd.arg(marker.as_slice());
                for work in works() {
                    cmd.arg(work.argument().as_slice());
                }
                cmd.arg(MARKER_ARG);
            })
            .await;
        in_flight.landed(&reply);
        let reply = reply?;
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

    /// Admitted spends whose waiters were gone give back what they spent.
    fn unread<C>(connection: &Guarded<C>, unread: Vec<(Self, Hits)>)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        lost::give_back_unread(connection, unread);
    }
}

impl SpendWork {
    /// The request's hits, from the script's answer for it. A counter no
    /// spend can fit until its time left is over (at its limit, or locked
    /// out) is remembered by the deny cache until then.
    fn answer(&self, spent: Spent) -> Result<Hits, BackendError> {
        match spent {
            Spent::Decided(counters) => Ok(self.finish.decided(&self.counters, counters)),
            Spent::Corrupt { counter, reason } => {
                let key = self.counters.get(counter).map_or(&[][..], |stored| stored);
                Err(corrupt(key, reason))
            }
            Spent::Invalid(reason) => Err(BackendError::Unavailable(reason.into())),
        }
    }
}

/// What the give-back of a lost reply reads of a spend (`lost.rs`).
impl Carried for SpendWork {
    fn counters(&self) -> &[StoredKey] {
        &self.counters
    }

    fn spend(&self) -> Spend {
        self.spend
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tower_pinned_window::{Quota, Window};

    use super::*;
    use crate::hits::CounterQuota;

    fn work(limits: &[u64], spend: Spend) -> SpendWork {
        SpendWork {
            counters: limits.iter().map(|_| StoredKey::from_slice(b"k")).collect(),
            spend,
            finish: Finish {
                quotas: limits
                    .iter()
                    .map(|&limit| CounterQuota {
                        quota: Quota::new(limit, Duration::from_secs(60)).unwrap(),
                        lowers: false,
                    })
                    .collect(),
                deny: None,
                prefix: 0,
                sent: Instant::now(),
            },
        }
    }

    /// A spend without a first unit sends the argument it sent before
    /// there was one; with one, the tail `first <unit>`. Each as many
    /// numbers as `numbers` counts.
    #[test]
    fn a_first_unit_is_a_tail_and_nothing_else_changes() {
        let block = Window::new(Duration::from_secs(5)).unwrap();
        let cases: [(&[u64], Spend, &str); 5] = [
            (&[100], Spend::cost(5), "1 5 0 0 100 60000"),
            (&[100], Spend::cost(0).open(), "1 0 1 0 100 60000"),
            (
                &[3, 9],
                Spend::cost(1).block(block),
                "2 1 0 5000 3 60000 9 60000",
            ),
            (
                &[50, 10_000],
                Spend::cost(700).first(1),
                "2 700 0 0 50 60000 10000 60000 first 1",
            ),
            (
                &[50],
                Spend::cost(u64::MAX).first(0).open(),
                "1 18446744073709551615 1 0 50 60000 first 0",
            ),
        ];
        for (limits, spend, want) in cases {
            let work = work(limits, spend);
            let sent = work.argument();
            assert_eq!(std::str::from_utf8(&sent).unwrap(), want, "{spend:?}");
            assert_eq!(
                want.split(' ').count(),
                work.numbers(),
                "{spend:?}: the words counted for the call's size"
            );
        }
    }
}
