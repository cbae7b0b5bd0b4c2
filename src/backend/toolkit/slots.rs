//! One-shot answers without an allocation per request: the requests queued
//! in a lane share an *arena* of answer slots (one allocation for up to
//! [`ARENA_SLOTS`] requests), each holding a [`Reply`] (the call's end) and
//! a [`Ticket`] (the request's end) to its own slot. Each pair behaves as a
//! `tokio::sync::oneshot` channel does: the ticket waits for the answer, or
//! learns that the reply was dropped unanswered; the reply learns when the
//! ticket is gone (so a request given up is not sent, and a call whose
//! requests are all gone is dropped).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// Slots in one arena at most: a lane starts a new arena beyond it, so an
/// arena (and the answers it holds until they are read) stays bounded even
/// when a lane's queue never empties.
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
/// allocation for many requests, each answered through its own slot.
///
/// [`channel`](Self::channel) hands out a slot's two ends. Guarantees,
/// per slot, as `tokio::sync::oneshot` gives them: the [`Ticket`] gets the
/// answer its [`Reply`] sent and no other, or `None` once the reply was
/// dropped unanswered; the reply learns when the ticket is gone
/// ([`is_closed`](Reply::is_closed), [`poll_closed`](Reply::poll_closed)),
/// so a request given up need not be sent. An arena grows with every slot
/// it hands out and frees them all together when its last end is dropped:
/// start a new one past [`ARENA_SLOTS`] so that a queue that never empties
/// holds a bounded number of answers.
///
/// ```
/// use std::future::Future;
/// use std::pin::pin;
/// use std::task::{Context, Poll, Waker};
/// use tower_pinned_window::backend::toolkit::Arena;
///
/// let arena = Arena::with_capacity(2);
/// let (reply, ticket) = arena.channel();
/// let mut ticket = pin!(ticket);
/// let mut cx = Context::from_waker(Waker::noop());
/// assert!(ticket.as_mut().poll(&mut cx).is_pending());
/// reply.send(7).unwrap();
/// assert_eq!(ticket.as_mut().poll(&mut cx), Poll::Ready(Some(7)));
/// ```
pub struct Arena<T> {
    slots: Mutex<Vec<Slot<T>>>,
}

impl<T> Arena<T> {
    /// An arena with room for `capacity` slots before it grows.
    #[must_use]
    pub fn with_capacity(capacity: usize) -> Arc<Self> {
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
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No slot handed out yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// A new slot: its two ends.
    pub fn channel(self: &Arc<Self>) -> (Reply<T>, Ticket<T>) {
        let at = {
            let mut slots = self.lock();
            slots.push(Slot {
                state: State::Waiting(None),
                closing: None,
            });
            slots.len() - 1
        };
        (
            Reply {
                arena: Arc::clone(self),
                at: Some(at),
            },
            Ticket {
                arena: Arc::clone(self),
                at,
            },
        )
    }
}

/// The answering end of a slot ([`Arena::channel`]): the call that carries
/// the request sends its answer here. Dropped unanswered, its [`Ticket`]
/// gives `None`.
pub struct Reply<T> {
    arena: Arc<Arena<T>>,
    /// `None` once answered.
    at: Option<usize>,
}

impl<T> Reply<T> {
    /// The ticket is gone: nobody reads an answer.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.at
            .is_none_or(|at| matches!(self.arena.lock()[at].state, State::Closed))
    }

    /// Ready once the ticket is gone.
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

    /// Answer; the answer back when the ticket is gone.
    pub fn send(mut self, answer: T) -> Result<(), T> {
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

/// The waiting end of a slot ([`Arena::channel`]): a future of the answer,
/// `None` when its [`Reply`] was dropped unanswered.
/// [`BackendFuture::queued`](super::BackendFuture::queued) waits on one.
#[must_use = "futures do nothing unless polled"]
pub struct Ticket<T> {
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

impl<T> std::fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("slots", &self.len()).finish()
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
        let arena = Arena::with_capacity(2);
        let (a, ticket_a) = arena.channel();
        let (b, ticket_b) = arena.channel();
        let (mut ticket_a, mut ticket_b) = (pin!(ticket_a), pin!(ticket_b));
        assert!(poll(ticket_a.as_mut()).is_pending());
        b.send(2).unwrap();
        assert!(poll(ticket_a.as_mut()).is_pending());
        assert!(matches!(poll(ticket_b.as_mut()), Poll::Ready(Some(2))));
        a.send(1).unwrap();
        assert!(matches!(poll(ticket_a.as_mut()), Poll::Ready(Some(1))));
        assert_eq!(arena.len(), 2);
    }

    #[test]
    fn a_dropped_reply_is_an_error_and_a_dropped_ticket_closes_the_reply() {
        let arena = Arena::with_capacity(1);
        let (reply, ticket) = arena.channel();
        drop(reply);
        assert!(matches!(poll(pin!(ticket)), Poll::Ready(None)));

        let (reply, ticket) = arena.channel();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!reply.is_closed());
        assert!(reply.poll_closed(&mut cx).is_pending());
        drop(ticket);
        assert!(reply.is_closed());
        assert!(reply.poll_closed(&mut cx).is_ready());
        assert_eq!(reply.send(3), Err(3));
    }
}
