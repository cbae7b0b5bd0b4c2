//! One-shot answers without an allocation per request: the requests queued
//! in a lane share one allocation of answer slots (for up to
//! [`ARENA_SLOTS`] requests), each slot with a [`Reply`] (the call's end)
//! and a [`BackendFuture`] (the request's end). Each pair behaves as a
//! `tokio::sync::oneshot` channel does: the future waits for the answer,
//! or learns that the reply was dropped unanswered; the reply learns when
//! the future is gone (so a request given up is not sent, and a call whose
//! requests are all gone is dropped).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::BackendFuture;
use crate::backend::BackendError;

/// Slots in one allocation at most: [`Reply::channel`] starts a new one
/// beyond it, so an allocation (and the answers it holds until they are
/// read) stays bounded even when a lane's queue never empties.
pub const ARENA_SLOTS: usize = 512;

enum State<T> {
    /// No answer yet; the ticket's waker once it has waited.
    Waiting(Option<Waker>),
    /// Answered, not yet read.
    Ready(T),
    /// The reply was dropped unanswered.
    Dropped,
    /// The ticket read its answer or is gone.
    Closed,
}

struct Slot<T> {
    state: State<T>,
    /// The reply's waker, once it has waited for the ticket to go.
    closing: Option<Waker>,
}

/// Answer slots shared by the requests of one batch's queue: one
/// allocation for many requests, each answered through its own slot. An
/// arena grows with every slot it hands out and frees them all together
/// when its last end is dropped.
struct Arena<T> {
    slots: Mutex<Vec<Slot<T>>>,
}

impl<T> Arena<T> {
    /// An arena with room for `capacity` slots before it grows.
    fn with_capacity(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(Vec::with_capacity(capacity.min(ARENA_SLOTS))),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot<T>>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Slots handed out so far.
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// A new slot: its index.
    fn push(&self) -> usize {
        let mut slots = self.lock();
        slots.push(Slot {
            state: State::Waiting(None),
            closing: None,
        });
        slots.len() - 1
    }
}

/// What a [`Reply`] sends: the queued call's result.
type Answer<T> = Result<T, BackendError>;

/// The answering end of a queued request, whose waiting end is a
/// [`BackendFuture`]: the call that carries the request sends its result
/// here. Dropped unanswered, its future gives
/// [`BackendError::Unavailable`].
///
/// [`channel`](Self::channel) makes the pair. The requests queued in one
/// batch share an allocation of slots: a pair made beside a reply still
/// waiting in the queue takes its slot in that reply's allocation, with no
/// allocation of its own, until it holds [`ARENA_SLOTS`]; the slots are
/// freed together when the last of their ends is dropped. Guarantees, per
/// pair, as `tokio::sync::oneshot` gives them: the future gets the result
/// its reply sent and no other; the reply learns when the future is gone
/// ([`is_closed`](Self::is_closed), [`poll_closed`](Self::poll_closed)),
/// so a request given up need not be sent.
///
/// ```
/// use tower_pinned_window::backend::toolkit::Reply;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Two requests queued behind a call in flight: one allocation.
/// let (first, first_answer) = Reply::channel(None, 2);
/// let (second, second_answer) = Reply::channel(Some(&first), 2);
/// // The call that carries them answers each in its own slot.
/// second.send(Ok(2_u64)).unwrap();
/// first.send(Ok(1)).unwrap();
/// assert_eq!(first_answer.await.unwrap(), 1);
/// assert_eq!(second_answer.await.unwrap(), 2);
///
/// // A request given up: its reply knows, and need not be sent.
/// let (reply, answer) = Reply::<u64>::channel(None, 1);
/// drop(answer);
/// assert!(reply.is_closed());
/// # }
/// ```
pub struct Reply<T> {
    arena: Arc<Arena<Answer<T>>>,
    /// `None` once answered.
    at: Option<usize>,
}

impl<T> Reply<T> {
    /// A queued request's two ends: the reply its call answers, and the
    /// future it waits on ([`BackendFuture`]'s queued state). The slot is
    /// in `beside`'s allocation when that holds fewer than
    /// [`ARENA_SLOTS`] slots, else in a new allocation with room for
    /// `capacity` (at most [`ARENA_SLOTS`]) before it grows: the size of
    /// the batch you expect.
    pub fn channel(beside: Option<&Self>, capacity: usize) -> (Self, BackendFuture<T>) {
        let (reply, ticket) = Self::open(beside, capacity);
        (reply, BackendFuture::queued(ticket))
    }

    /// [`channel`](Self::channel), with the waiting end as it is.
    fn open(beside: Option<&Self>, capacity: usize) -> (Self, Ticket<Answer<T>>) {
        let arena = match beside {
            Some(beside) if beside.arena.len() < ARENA_SLOTS => Arc::clone(&beside.arena),
            _ => Arena::with_capacity(capacity),
        };
        let at = arena.push();
        let ticket = Ticket {
            arena: Arc::clone(&arena),
            at,
        };
        (
            Self {
                arena,
                at: Some(at),
            },
            ticket,
        )
    }

    /// The future is gone: nobody reads an answer.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.at
            .is_none_or(|at| matches!(self.arena.lock()[at].state, State::Closed))
    }

    /// Ready once the future is gone.
    pub fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(at) = self.at else {
            return Poll::Ready(());
        };
        let mut slots = self.arena.lock();
        let slot = &mut slots[at];
        if matches!(slot.state, State::Closed) {
            return Poll::Ready(());
        }
        match &mut slot.closing {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            closing => *closing = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Answer; the answer back when the future is gone.
    pub fn send(mut self, answer: Answer<T>) -> Result<(), Answer<T>> {
        let Some(at) = self.at.take() else {
            return Err(answer);
        };
        let waker = {
            let mut slots = self.arena.lock();
            let slot = &mut slots[at];
            match std::mem::replace(&mut slot.state, State::Ready(answer)) {
                State::Waiting(waker) => waker,
                other => {
                    let State::Ready(answer) = std::mem::replace(&mut slot.state, other) else {
                        unreachable!("just put")
                    };
                    return Err(answer);
                }
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        let Some(at) = self.at else {
            return;
        };
        let waker = {
            let mut slots = self.arena.lock();
            let slot = &mut slots[at];
            match std::mem::replace(&mut slot.state, State::Dropped) {
                State::Waiting(waker) => waker,
                other => {
                    slot.state = other;
                    None
                }
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The waiting end of a slot: a future of the answer, `None` when its
/// [`Reply`] was dropped unanswered. A queued [`BackendFuture`] waits on
/// one.
#[must_use = "futures do nothing unless polled"]
pub(super) struct Ticket<T> {
    arena: Arc<Arena<T>>,
    at: usize,
}

impl<T> std::future::Future for Ticket<T> {
    type Output = Option<T>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slots = self.arena.lock();
        let slot = &mut slots[self.at];
        match &mut slot.state {
            State::Waiting(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    waker => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            State::Ready(_) => {
                let State::Ready(answer) = std::mem::replace(&mut slot.state, State::Closed) else {
                    unreachable!("matched")
                };
                Poll::Ready(Some(answer))
            }
            State::Dropped | State::Closed => Poll::Ready(None),
        }
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slots = self.arena.lock();
            let slot = &mut slots[self.at];
            // An answer not read is dropped here, with the slot's state.
            let _ = std::mem::replace(&mut slot.state, State::Closed);
            slot.closing.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply").field("slot", &self.at).finish()
    }
}

impl<T> std::fmt::Debug for Ticket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("slot", &self.at).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;

    fn poll<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn an_answer_reaches_its_own_ticket_only() {
        let (a, ticket_a) = Reply::open(None, 2);
        let (b, ticket_b) = Reply::open(Some(&a), 2);
        let arena = Arc::clone(&a.arena);
        let (mut ticket_a, mut ticket_b) = (pin!(ticket_a), pin!(ticket_b));
        assert!(poll(ticket_a.as_mut()).is_pending());
        b.send(Ok(2_u64)).unwrap();
        assert!(poll(ticket_a.as_mut()).is_pending());
        assert!(matches!(poll(ticket_b.as_mut()), Poll::Ready(Some(Ok(2)))));
        a.send(Ok(1)).unwrap();
        assert!(matches!(poll(ticket_a.as_mut()), Poll::Ready(Some(Ok(1)))));
        assert_eq!(arena.len(), 2);
    }

    #[test]
    fn a_dropped_reply_is_an_error_and_a_dropped_ticket_closes_the_reply() {
        let (reply, ticket) = Reply::<u64>::open(None, 1);
        drop(reply);
        assert!(matches!(poll(pin!(ticket)), Poll::Ready(None)));

        let (reply, ticket) = Reply::<u64>::open(None, 1);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!reply.is_closed());
        assert!(reply.poll_closed(&mut cx).is_pending());
        drop(ticket);
        assert!(reply.is_closed());
        assert!(reply.poll_closed(&mut cx).is_ready());
        assert!(matches!(reply.send(Ok(3)), Err(Ok(3))));
    }

    #[test]
    fn a_pair_beside_a_full_allocation_starts_a_new_one() {
        let (first, _answer) = Reply::<u64>::open(None, 1);
        let mut queue = vec![first];
        for _ in 1..ARENA_SLOTS {
            let (reply, _answer) = Reply::open(queue.last(), 1);
            queue.push(reply);
        }
        assert!(queue.iter().all(|r| Arc::ptr_eq(&r.arena, &queue[0].arena)));
        assert_eq!(queue[0].arena.len(), ARENA_SLOTS);
        let (next, _answer) = Reply::open(queue.last(), 4);
        assert!(!Arc::ptr_eq(&next.arena, &queue[0].arena));
        assert_eq!(next.arena.len(), 1);
    }
}
