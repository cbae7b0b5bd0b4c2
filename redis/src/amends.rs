//! Amends through the lanes, as hits go: the refunds, charges and clears
//! of the requests issued while a call is in flight go together in the
//! next call of the amend script (`amend.lua`), each only in the window its
//! hit was counted in.

use std::borrow::Borrow;
use std::num::NonZeroU64;
use std::sync::Arc;

use ::redis::RedisResult;
use ::redis::aio::ConnectionLike;
use smallvec::SmallVec;

use super::coalesce::{Answers, Work};
use super::connection::guarded::Guarded;
use super::hits::StoredKey;
use super::reply::parse_amends;
use super::script::{AMEND, Size, U64_DIGITS};
use tower_pinned_window::backend::toolkit::Denials;
use tower_pinned_window::backend::toolkit::storage_key::RESET_MARKER;
use tower_pinned_window::backend::{Amend, BackendError};
use tower_pinned_window::key::Key;

/// The key of a marker beside `counter` (its lockout or its reset marker):
/// the counter's key and `suffix`, written into the call only, inline.
pub(super) fn beside(counter: &[u8], suffix: &[u8]) -> StoredKey {
    let mut marker = StoredKey::new();
    marker.extend_from_slice(counter);
    marker.extend_from_slice(suffix);
    marker
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
