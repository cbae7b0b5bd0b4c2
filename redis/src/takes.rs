//! Takes and give-backs of slots in flight through the lanes, as hits go:
//! the takes and give-backs issued while a call is in flight go together
//! in the next call of the slots' batch script (`slots_batch.lua`). Both
//! share one kind of lane, so that the slot a request gives back when it
//! ends rides in the same call as the takes of the requests that begin.
//! A call of one step alone is the take or give-back script (`take.lua`,
//! `give_back.lua`), the cheapest call for Redis.
//!
//! A call of several steps changes nothing about each one: the script
//! makes them in the order they were queued, each exactly as if it had
//! been its own call (the record's shape checked, the leases that ran out
//! dropped, the slot added with its lease and the record's lifetime raised
//! to it in the same step), so a key's slots never pass its cap however
//! many of its takes share a call. A corrupt record answers only its own
//! steps. A call cut by a dropped connection is never sent again by the
//! lanes: each of its takes ran once (the script ran) or not at all, and
//! a take that ran but whose answer was lost is its holder's to give back
//! by name (the layer does) or to ask again with the same slot, which is
//! granted without taking two.

use std::borrow::Borrow;
use std::time::Duration;

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use smallvec::SmallVec;

use super::coalesce::{Answers, Work};
use super::connection::guarded::Guarded;
use super::hits::StoredKey;
use super::leases::{self, SLOT_DIGITS, slot_name};
use super::reply::{Step, parse_give_back, parse_slots_batch, parse_take};
use super::script::{SLOTS_BATCH, Size, U64_DIGITS};
use tower_pinned_window::backend::{BackendError, InFlight, SlotId, Taken};

/// One step on a key's slots, for a lane: the record of the key's slots
/// (inline when it fits), the slot, and what to do with it.
pub(super) struct SlotWork {
    record: StoredKey,
    slot: SlotId,
    step: SlotStep,
}

/// What a [`SlotWork`] does.
#[derive(Clone, Copy)]
enum SlotStep {
    /// Take the slot under this cap.
    Take(InFlight),
    /// Give the slot back.
    GiveBack,
}

/// The lanes' answer to a give-back: `granted` whether the slot was there
/// (one kind of lane, so one kind of answer, a [`Taken`]'s).
fn given_back(found: bool) -> Taken {
    Taken {
        granted: found,
        in_use: 0,
        retry: Duration::ZERO,
    }
}

/// The bytes of a take's spec (`max lease`), at most.
const SPEC_BYTES: usize = 2 * U64_DIGITS + 1;

impl SlotWork {
    /// Take `slot` of `in_flight` in the record at `record`.
    pub(super) fn take(record: StoredKey, in_flight: InFlight, slot: SlotId) -> Self {
        Self {
            record,
            slot,
            step: SlotStep::Take(in_flight),
        }
    }

    /// Give `slot` back to the record at `record`.
    pub(super) fn give_back(record: StoredKey, slot: SlotId) -> Self {
        Self {
            record,
            slot,
            step: SlotStep::GiveBack,
        }
    }

    fn kind(&self) -> Step {
        match self.step {
            SlotStep::Take(_) => Step::Take,
            SlotStep::GiveBack => Step::GiveBack,
        }
    }

    /// What the batch script reads the step by: `-` for a give-back,
    /// `max lease` for a take (the lease in ms), written inline.
    fn spec(&self) -> SmallVec<[u8; SPEC_BYTES]> {
        let mut out = SmallVec::new();
        match self.step {
            SlotStep::GiveBack => out.push(b'-'),
            SlotStep::Take(in_flight) => {
                let mut digits = itoa::Buffer::new();
                out.extend_from_slice(digits.format(in_flight.max()).as_bytes());
                out.push(b' ');
                out.extend_from_slice(digits.format(in_flight.lease().as_millis()).as_bytes());
            }
        }
        out
    }
}

impl Work for SlotWork {
    /// A take's answer; a give-back's is [`given_back`]'s.
    type Answer = Taken;

    fn key(&self) -> &[u8] {
        &self.record
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Taken>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        if let [work] = works {
            // One step alone: its own script, the cheapest call for Redis.
            let SlotWork { record, slot, step } = work.borrow();
            let answer = match *step {
                SlotStep::Take(in_flight) => parse_take(
                    leases::take_call(connection, record, in_flight, *slot).await?,
                    record,
                ),
                SlotStep::GiveBack => parse_give_back(
                    leases::give_back_call(connection, record, *slot).await?,
                    record,
                )
                .map(given_back),
            };
            return Ok(std::iter::once(answer).collect());
        }
        batch(connection, works).await
    }

    /// A give-back nobody waits for (a request's end) that failed: its
    /// lease frees the slot. Never sent again: by then the slot may be
    /// another request's.
    fn detached(_: Self, answer: Result<Taken, BackendError>) {
        if let Err(err) = answer {
            left_to_the_lease(&err);
        }
    }
}

/// A give-back nobody waits for failed with `err`: logged (at debug: the
/// lease frees the slot).
pub(super) fn left_to_the_lease(err: &BackendError) {
    tracing::debug!(error = %err, "a slot in flight could not be given back: its lease frees it");
}

/// The slots' batch script's call for `works`, and each step's answer.
async fn batch<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Taken>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    B: Borrow<SlotWork> + Sync,
{
    let steps = || works.iter().map(Borrow::borrow);
    let size = Size {
        keys: works.len(),
        args: 3 * works.len(),
        bytes: steps()
            .map(|w| w.record.len() + SLOT_DIGITS + SPEC_BYTES)
            .sum(),
    };
    // The breaker of the call's slot (one slot, on a Cluster), named by its
    // first record.
    let first = steps().next().map_or(&[][..], |w| w.record.as_slice());
    let reply = SLOTS_BATCH
        .run(&mut connection.for_write(first), size, |cmd| {
            for step in steps() {
                cmd.arg(step.record.as_slice());
            }
            for step in steps() {
                cmd.arg(&slot_name(step.slot)[..])
                    .arg(step.spec().as_slice());
            }
        })
        .await?;
    let step_of = |at: usize| {
        let step: &SlotWork = works[at].borrow();
        (step.kind(), step.record.as_slice())
    };
    Ok(match parse_slots_batch(reply, works.len(), step_of) {
        Ok(answers) => Answers::from_vec(answers),
        Err(other) => {
            let detail = format!(
                "unexpected reply to a batch of {} steps on slots in flight: {other:?}",
                works.len()
            );
            steps()
                .map(|_| Err(BackendError::Unavailable(detail.clone().into())))
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_read_by_its_spec() {
        let record = || StoredKey::from_slice(b"tpw:n{k}:slots");
        let cap = InFlight::new(5, Duration::from_secs(30)).unwrap();
        let take = SlotWork::take(record(), cap, SlotId::from_u128(1));
        assert_eq!(take.spec().as_slice(), b"5 30000");
        assert_eq!(take.kind(), Step::Take);
        let most = InFlight::new(u64::MAX, tower_pinned_window::Window::MAX.as_duration()).unwrap();
        let spec = SlotWork::take(record(), most, SlotId::from_u128(1)).spec();
        assert!(spec.len() <= SPEC_BYTES && !spec.spilled(), "{spec:?}");
        let back = SlotWork::give_back(record(), SlotId::from_u128(1));
        assert_eq!(back.spec().as_slice(), b"-");
        assert_eq!(back.kind(), Step::GiveBack);
        assert_eq!(back.key(), b"tpw:n{k}:slots");
    }
}
