//! A slot and a request's counters in one step
//! ([`Leasing::take_all`](tower_pinned_window::backend::Leasing::take_all)):
//! one call of the take-all script (`take_all.lua`, after `slots.lua`) on
//! the key's record of slots and its counters (and their lockouts, for a
//! spend), which share the key's hash tag, so one Cluster slot.
//!
//! Through the lanes by default, as hits, spends and takes go: the steps
//! issued while a call is in flight go together in the next call of the
//! same script, which makes each one exactly as if it had been its own
//! call (in the order queued, each seeing the record and counters as the
//! ones before it left them), so a key's slots never pass its cap and its
//! counters count exactly what separate steps would. A corrupt record or
//! counter fails only its own step, with nothing written for it; the other
//! steps of the call are made.
//!
//! A call cut by a dropped connection is never sent again: each of its
//! steps ran once (the script ran) or not at all. A slot taken by a step
//! whose answer was lost is freed by its lease (or granted again, counting
//! nothing, to a step retried with the same slot); what it counted stays
//! counted, as a hit's does (a spend's lost reply is not given back here,
//! unlike [`spend_all`](tower_pinned_window::backend::Spending::spend_all)'s).

use std::borrow::Borrow;

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use smallvec::SmallVec;

use super::amends::beside;
use super::coalesce::{Answers, Work};
use super::connection::guarded::Guarded;
use super::hits::{Finish, StoredKey};
use super::leases::{SLOT_DIGITS, slot_name};
use super::reply::{TookAll, corrupt, parse_take_alls};
use super::script::{Size, TAKE_ALL, U64_DIGITS};
use tower_pinned_window::backend::toolkit::storage_key::LOCKOUT;
use tower_pinned_window::backend::{BackendError, Hits, InFlight, SlotId, Spend};

/// One request's take-all, for a lane: the record of its key's slots, the
/// slot and the cap, its counters' storage keys (a lockout's key is its
/// counter's and a suffix, written only into the call), what it spends
/// (`None`: plain hits), and what makes its hits of the answer.
pub(super) struct TakeAllWork {
    pub(super) record: StoredKey,
    pub(super) slot: SlotId,
    pub(super) in_flight: InFlight,
    pub(super) counters: SmallVec<[StoredKey; 2]>,
    pub(super) spend: Option<Spend>,
    pub(super) finish: Finish,
}

impl TakeAllWork {
    /// The keys the request names: its record, then each counter (and its
    /// lockout, for a spend).
    fn keys(&self) -> usize {
        let per = if self.spend.is_some() { 2 } else { 1 };
        1 + per * self.counters.len()
    }

    /// The numbers of the request's one argument after its slot's name:
    /// max, lease, n, cost, open, lockout, then each counter's limit and
    /// window, then the first counter's own amount and its word, when the
    /// spend has one.
    fn numbers(&self) -> usize {
        let first = match self.spend {
            Some(Spend { first: Some(_), .. }) => 2,
            _ => 0,
        };
        6 + 2 * self.counters.len() + first
    }

    /// The request's one argument: the slot's name, then its numbers in
    /// decimal, apart by a space (`<slot> 2 30000 1 - 0 0 100 60000`; the
    /// cost is `-` for plain hits), written inline; a spend whose first
    /// counter has an amount of its own ([`Spend::first`]) ends with the
    /// word `first` and that amount, and any other is sent as it was
    /// before there was one.
    fn argument(&self) -> SmallVec<[u8; 128]> {
        let mut out = SmallVec::new();
        out.extend_from_slice(&slot_name(self.slot));
        let mut digits = itoa::Buffer::new();
        let mut number = |out: &mut SmallVec<[u8; 128]>, n: u64| {
            out.push(b' ');
            out.extend_from_slice(digits.format(n).as_bytes());
        };
        number(&mut out, self.in_flight.max());
        number(&mut out, self.in_flight.lease().as_millis());
        number(&mut out, self.counters.len() as u64);
        match self.spend {
            None => out.extend_from_slice(b" - 0 0"),
            Some(Spend {
                cost, open, block, ..
            }) => {
                number(&mut out, cost);
                number(&mut out, u64::from(open));
                number(&mut out, block.map_or(0, |b| b.as_millis()));
            }
        }
        for c in &self.finish.quotas {
            number(&mut out, c.quota.limit());
            number(&mut out, c.quota.window().as_millis());
        }
        if let Some(Spend {
            first: Some(unit), ..
        }) = self.spend
        {
            out.extend_from_slice(b" first");
            number(&mut out, unit);
        }
        out
    }

    /// The request's hits, with the cap's answer, from the script's answer
    /// for it. A counter no step can fit until its time left is over (at
    /// its limit, or locked out) is remembered by the deny cache until
    /// then.
    fn answer(&self, took: TookAll) -> Result<Hits, BackendError> {
        match took {
            TookAll::Decided { taken, counters } => Ok(self
                .finish
                .decided(&self.counters, counters)
                .with_taken(taken)),
            TookAll::Corrupt { counter, reason } => {
                let key = match counter {
                    None => &self.record[..],
                    Some(at) => self.counters.get(at).map_or(&[][..], |stored| stored),
                };
                Err(corrupt(key, reason))
            }
            TookAll::Invalid(reason) => Err(BackendError::Unavailable(reason.into())),
        }
    }
}

impl Work for TakeAllWork {
    type Answer = Hits;

    fn key(&self) -> &[u8] {
        &self.record
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Hits>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        let works = || works.iter().map(Borrow::borrow);
        let keys: usize = works().map(TakeAllWork::keys).sum();
        let size = Size {
            keys,
            args: keys + works().count(),
            bytes: works()
                .map(|w| {
                    let counters: usize =
                        w.counters.iter().map(|c| 2 * c.len() + LOCKOUT.len()).sum();
                    w.record.len() + counters + SLOT_DIGITS + w.numbers() * (U64_DIGITS + 1)
                })
                .sum(),
        };
        // The breaker of the call's slot (one slot, on a Cluster), named by
        // its first record.
        let first = works().next().map_or(&[][..], TakeAllWork::key);
        let reply = TAKE_ALL
            .run(&mut connection.for_write(first), size, |cmd| {
                for work in works() {
                    cmd.arg(work.record.as_slice());
                    for counter in &work.counters {
                        cmd.arg(counter.as_slice());
                        if work.spend.is_some() {
                            cmd.arg(beside(counter, LOCKOUT).as_slice());
                        }
                    }
                }
                for work in works() {
                    cmd.arg(work.argument().as_slice());
                }
            })
            .await?;
        Ok(
            match parse_take_alls(reply, works().map(|w| w.counters.len())) {
                Ok(took) => works()
                    .zip(took)
                    .map(|(work, took)| work.answer(took))
                    .collect(),
                Err(other) => {
                    let detail = format!("unexpected reply to a take-all batch: {other:?}");
                    works()
                        .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                        .collect()
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::hits::CounterQuota;
    use tower_pinned_window::Quota;

    fn work(spend: Option<Spend>) -> TakeAllWork {
        let quota = |limit| CounterQuota {
            quota: Quota::new(limit, Duration::from_secs(60)).unwrap(),
            lowers: false,
        };
        TakeAllWork {
            record: StoredKey::from_slice(b"tpw:n{k}:slots"),
            slot: SlotId::from_u128(0xab),
            in_flight: InFlight::new(2, Duration::from_secs(30)).unwrap(),
            counters: [b"tpw:q{k}", b"tpw:r{k}"]
                .into_iter()
                .map(|c| StoredKey::from_slice(c))
                .collect(),
            spend,
            finish: Finish {
                quotas: [quota(100), quota(5)].into_iter().collect(),
                deny: None,
                prefix: 4,
                sent: std::time::Instant::now(),
            },
        }
    }

    #[test]
    fn a_take_all_is_read_by_its_argument() {
        let hits = work(None);
        assert_eq!(
            hits.argument().as_slice(),
            b"000000000000000000000000000000ab 2 30000 2 - 0 0 100 60000 5 60000"
        );
        assert_eq!(hits.keys(), 3);
        assert_eq!(hits.key(), b"tpw:n{k}:slots");
        let spend = work(Some(Spend::cost(3).block(
            tower_pinned_window::Window::new(Duration::from_secs(10)).unwrap(),
        )));
        assert_eq!(
            spend.argument().as_slice(),
            b"000000000000000000000000000000ab 2 30000 2 3 0 10000 100 60000 5 60000"
        );
        assert_eq!(spend.keys(), 5);
        assert!(!spend.argument().spilled(), "inline for two counters");
        // A first unit: the tail, and nothing else changes.
        let first = work(Some(Spend::cost(700).first(1)));
        assert_eq!(
            first.argument().as_slice(),
            b"000000000000000000000000000000ab 2 30000 2 700 0 0 100 60000 5 60000 first 1"
        );
        assert_eq!(first.numbers(), 12);
        assert_eq!(work(None).numbers(), 10);
    }
}
