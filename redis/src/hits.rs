//! Hits through the lanes: the requests' hits of one call, counted by the
//! batch script (`hit_batch.lua`), or by the one-hit script for a call of
//! one request on one counter.
//!
//! Exactness: n hits on one counter are one `INCRBY n` in the script, with the
//! lifetime attached in the same atomic step when the counter has none; they
//! take the counts `c-n+1 ..= c`, exactly what n `INCR`s would have given,
//! and each hit gets its own count, the counter's time left and its deadline
//! (`PEXPIRETIME`). Hits on one key with different windows are separate
//! entries, applied in order, as if sent one after the other. A corrupt
//! counter answers its own entry; the other entries of the call are counted.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{RedisResult, Value};
use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;

use super::coalesce::{Answers, Work};
use super::connection::guarded::Guarded;
use super::reply::{Full, parse_batch, parse_hit};
use super::script::{HIT, HIT_BATCH, Size, U64_DIGITS};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::toolkit::storage_key;
use tower_pinned_window::backend::toolkit::{Denials, Denied};
use tower_pinned_window::backend::{BackendError, Hit, Hits};

/// The answer to one request: a result per counter, in order.
pub(super) type CounterAnswers = SmallVec<[Result<Hit, BackendError>; 2]>;

/// A storage key, inline when it fits (most do: an IPv6 address under a
/// short prefix and layer name), so that a hit allocates nothing for it.
pub(super) type StoredKey = SmallVec<[u8; 64]>;

/// One request's counters: storage key and window (ms) of each.
pub(super) type Counters = SmallVec<[(StoredKey, u64); 2]>;

/// What turns the answers for a request's counters into its [`Hits`]: the
/// quotas, and the deny cache that remembers a denial.
pub(super) struct Finish {
    /// Each counter's quota, and whether it lowers.
    pub(super) quotas: SmallVec<[CounterQuota; 2]>,
    pub(super) deny: Option<Arc<Denials>>,
    /// The length of the backend's prefix: a denied counter's namespace and
    /// key are read back from its storage key.
    pub(super) prefix: usize,
    /// When the hits were sent: a denial is remembered until this plus the
    /// time Redis said was left, never past the window in Redis.
    pub(super) sent: std::time::Instant,
}

/// A counter's quota, and whether it
/// [lowers](tower_pinned_window::backend::Counter::lowers): its denial is then held only
/// for the recheck bound.
#[derive(Clone, Copy)]
pub(super) struct CounterQuota {
    pub(super) quota: Quota,
    pub(super) lowers: bool,
}

impl Finish {
    /// The request's hits, from the answers for its `counters`, in order.
    pub(super) fn answered(
        &self,
        counters: &Counters,
        answers: CounterAnswers,
    ) -> Result<Hits, BackendError> {
        let mut hits = Hits::with_capacity(answers.len());
        for ((answer, counter), (stored, _)) in answers.into_iter().zip(&self.quotas).zip(counters)
        {
            let hit = answer?;
            if hit.count > counter.quota.limit() {
                self.remember(stored, hit.reset, at_limit(counter), counter.lowers);
            }
            hits.push(hit);
        }
        Ok(hits)
    }

    /// The request's hits from a spend's (or a take-all's) answers for its
    /// `counters`, in order, each with whether no step can fit it until its
    /// time left is over: such a counter, at its limit or locked out, is
    /// remembered by the deny cache until then.
    pub(super) fn decided(
        &self,
        counters: &[StoredKey],
        answers: SmallVec<[(Hit, Full); 2]>,
    ) -> Hits {
        answers
            .into_iter()
            .zip(counters)
            .zip(&self.quotas)
            .map(|(((hit, full), stored), counter)| {
                match full {
                    Full::No => {}
                    Full::AtLimit => {
                        self.remember(stored, hit.reset, at_limit(counter), counter.lowers);
                    }
                    Full::Locked => {
                        self.remember(stored, hit.reset, Denied::Locked, counter.lowers);
                    }
                }
                hit
            })
            .collect()
    }

    /// The counter `stored` is denied for `left` from when the request was
    /// sent, as `denied` says (at its limit, or locked out): the deny
    /// cache, when there is one, remembers it until then, or for its
    /// recheck bound when the counter `lowers`.
    pub(super) fn remember(&self, stored: &[u8], left: Duration, denied: Denied, lowers: bool) {
        let Some(denials) = &self.deny else {
            return;
        };
        // Decoded only on a denial, which is rare: a request that is let
        // through copies nothing for the cache.
        match storage_key::decode(&stored[..self.prefix], stored) {
            Some((namespace, key)) => {
                denials.remember(&namespace, &key, self.sent, left, denied, lowers);
            }
            None => debug_assert!(false, "a storage key this backend made decodes"),
        }
    }
}

/// A denial of `counter` at its limit, for the deny cache: it answers
/// requests under that limit or a lower one (a tier's limit may change).
fn at_limit(counter: &CounterQuota) -> Denied {
    Denied::AtLimit {
        limit: counter.quota.limit(),
    }
}

/// One request's hits, for a lane: its counters, and what makes its hits
/// of their answers.
pub(super) struct HitWork {
    pub(super) counters: Counters,
    pub(super) finish: Finish,
}

impl Work for HitWork {
    type Answer = Hits;

    fn key(&self) -> &[u8] {
        self.counters.first().map_or(&[][..], |(key, _)| key)
    }

    async fn run<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Hits>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        B: Borrow<Self> + Sync,
    {
        if let [work] = works
            && let [(key, window)] = work.borrow().counters.as_slice()
        {
            // One request on one counter: the one-hit script, the
            // cheapest call for Redis.
            let work = work.borrow();
            let reply = HIT
                .run_on_key(&mut connection.for_write(key), key, Some(*window))
                .await?;
            let answer = parse_hit(reply, key);
            return Ok(std::iter::once(
                work.finish
                    .answered(&work.counters, std::iter::once(answer).collect()),
            )
            .collect());
        }
        batch(connection, works).await
    }
}

/// The buffers of a batch call, kept per thread for the next: a call takes
/// them and gives them back cleared once answered (a call dropped before
/// drops them), so that a batch allocates none of its own once the thread
/// has run one as large. They hold at most a call's entries
/// (`MAX_PER_CALL`).
#[derive(Default)]
struct Scratch {
    /// The entries' hash (foldhash, seeded per process, not SipHash: the
    /// table holds at most a call's keys, so even keys chosen to collide
    /// cost a bounded amount per call).
    hasher: DefaultHashBuilder,
    /// Each entry's place in `entries`, by its (key, window).
    index: HashTable<usize>,
    /// One per distinct (key, window): the request and counter of its
    /// first hit, and its number of hits.
    entries: Vec<(usize, usize, u64)>,
    /// Each request's counters in order: the entry, and the hit's place
    /// among the entry's hits.
    places: Vec<(usize, u64)>,
    /// Each entry's reply: its last hit, or its error.
    replies: Vec<Result<Hit, BackendError>>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

impl Scratch {
    /// This thread's buffers, or new ones.
    fn take() -> Self {
        SCRATCH
            .try_with(|kept| kept.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Cleared, for the next call on this thread.
    fn give_back(mut self) {
        self.index.clear();
        self.entries.clear();
        self.places.clear();
        self.replies.clear();
        let _ = SCRATCH.try_with(|kept| *kept.borrow_mut() = Some(self));
    }
}

/// The storage key and window of request `work`'s counter `counter`.
fn counter_of<B: Borrow<HitWork>>(works: &[B], (work, counter): (usize, usize)) -> (&[u8], u64) {
    let (key, window) = &works[work].borrow().counters[counter];
    (key.as_slice(), *window)
}

/// The batch script's call for `works`, and each request's hits.
async fn batch<C, B>(connection: &Guarded<C>, works: &[B]) -> RedisResult<Answers<Hits>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    B: Borrow<HitWork> + Sync,
{
    let mut scratch = Scratch::take();
    let Scratch {
        hasher,
        index,
        entries,
        places,
        replies,
    } = &mut scratch;
    let key_of = |entry: &(usize, usize, u64)| counter_of(works, (entry.0, entry.1));
    for (w, work) in works.iter().enumerate() {
        for (c, (key, window)) in work.borrow().counters.iter().enumerate() {
            let this = (key.as_slice(), *window);
            let hash = hasher.hash_one(this);
            let at = match index.find(hash, |&at| key_of(&entries[at]) == this) {
                Some(&at) => at,
                None => {
                    entries.push((w, c, 0));
                    let at = entries.len() - 1;
                    index.insert_unique(hash, at, |&at| hasher.hash_one(key_of(&entries[at])));
                    at
                }
            };
            places.push((at, entries[at].2));
            entries[at].2 += 1;
        }
    }

    let reply = eval(connection, entries, key_of).await?;
    // Each entry's last hit.
    if let Err(other) = parse_batch(reply, entries.len(), |at| key_of(&entries[at]).0, replies) {
        let detail = format!(
            "unexpected reply to a batch of {}: {other:?}",
            entries.len()
        );
        replies.clear();
        replies.extend(
            entries
                .iter()
                .map(|_| Err(BackendError::Unavailable(detail.clone().into()))),
        );
    }
    // The entry's n hits took count-n+1 ..= count, in order: each reply
    // becomes its entry's first hit, and the nth hit's count is that plus n.
    for (reply, &(_, _, hits)) in replies.iter_mut().zip(entries.iter()) {
        if let Ok(hit) = reply {
            hit.count = hit.count.saturating_sub(hits - 1);
        }
    }
    let mut places = places.iter();
    let answers = works
        .iter()
        .map(|work| {
            let work = work.borrow();
            let answers: CounterAnswers = places
                .by_ref()
                .take(work.counters.len())
                .map(|&(at, nth)| match &replies[at] {
                    Ok(first) => Ok(Hit {
                        count: first.count + nth,
                        ..*first
                    }),
                    Err(err) => Err(copy(err)),
                })
                .collect();
            work.finish.answered(&work.counters, answers)
        })
        .collect();
    scratch.give_back();
    Ok(answers)
}

/// The batch script for `entries` (each named by `key_of` as its storage
/// key and window in ms, with its hits): every key, then each entry's hits
/// and window. The breaker is the one of the call's slot (one slot, on a
/// Cluster), named by its first key.
async fn eval<'k, C>(
    connection: &Guarded<C>,
    entries: &[(usize, usize, u64)],
    key_of: impl Fn(&(usize, usize, u64)) -> (&'k [u8], u64),
) -> RedisResult<Value>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let size = Size {
        keys: entries.len(),
        args: 3 * entries.len(),
        bytes: entries
            .iter()
            .map(|entry| key_of(entry).0.len() + 2 * U64_DIGITS)
            .sum(),
    };
    let first = entries.first().map_or(&[][..], |entry| key_of(entry).0);
    HIT_BATCH
        .run(&mut connection.for_write(first), size, |cmd| {
            for entry in entries {
                cmd.arg(key_of(entry).0);
            }
            for entry in entries {
                cmd.arg(entry.2).arg(key_of(entry).1);
            }
        })
        .await
}

/// The same error again, for every hit of an entry.
fn copy(err: &BackendError) -> BackendError {
    match err {
        BackendError::Corrupt { key, detail } => BackendError::Corrupt {
            key: key.clone(),
            detail: detail.clone(),
        },
        BackendError::TimedOut => BackendError::TimedOut,
        BackendError::AtCapacity => BackendError::AtCapacity,
        BackendError::ClusterDown(err) => BackendError::ClusterDown(err.to_string().into()),
        other => BackendError::Unavailable(other.to_string().into()),
    }
}
