//! The provider's word: what an answer says about its budgets (read by the
//! budget's [`Reader`]) becomes shared state in the store, and this process
//! honours it at once.
//!
//! - **Closed until T** (a 429 or 503 with `Retry-After`, a remaining of 0
//!   with a reset): the budget's counter for the key is closed in the
//!   store ([`Heeding::close`]: its lockout, which every spend reads in its
//!   own step, so honouring it costs no store call), and in this process
//!   at once, so that the calls here wait without asking. A closure only
//!   ever extends.
//! - **Fewer remain than the budget thinks:** the counter is raised
//!   ([`Heeding::raise`]) so that no more than that remain, never past the
//!   limit and never lowered. A remaining that takes the count no higher
//!   than this process has seen in the window says nothing new, and costs
//!   no store call.
//!
//! A write the store refuses or that times out is logged (at most once per
//! period) and kept in this process: the closure still holds here.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{BackendError, Counter, Heeding, Hit};
use crate::budget::failure::timed;
use crate::count::ResponseHead;
use crate::key::Key;
use crate::quota::Window;

use super::admit::{Admitted, Budget};
use super::stored::Quotas;
use super::word::{Ignored, Remaining, Unit};

impl<Bk: Heeding> Budget<Bk> {
    /// Take in what the answer to a call of `key` says (its `head`), the
    /// call having been `admitted` so.
    pub(crate) fn hear(self: &Arc<Self>, key: &Key, admitted: &Admitted, head: &ResponseHead<'_>) {
        let (word, ignored) = self.reader.read_now(head);
        if let Some(ignored) = ignored {
            self.ignored(&ignored);
        }
        if word.is_silent() {
            return;
        }
        let now = Instant::now();
        let quotas = self.quotas(key);
        let counters = self.counters(&quotas);
        for (at, counter) in counters.iter().enumerate() {
            let signal = word.of(self.unit(at));
            if let Some(span) = signal.closed_for.filter(|span| !span.is_zero()) {
                self.closed(key, at, span, now);
            } else if let Some(remaining) = signal.remaining {
                let own = admitted.own(at);
                self.remains(key, at, (counter, quotas), remaining, own, now);
            }
        }
    }

    /// Counter `at` of `key` is closed for `span`: here at once, and in
    /// the store.
    fn closed(self: &Arc<Self>, key: &Key, at: usize, span: Duration, now: Instant) {
        self.heard.close(key, now + span, now);
        let Ok(span) = Window::new(span) else {
            return;
        };
        let budget = Arc::clone(self);
        let key = key.clone();
        // Unwritten, it holds in this process all the same.
        self.write("close", move || async move {
            let namespace = budget.namespace(at);
            let write = budget.backend.close(namespace, &key, span);
            timed(budget.timeout, write).await.map(drop)
        });
    }

    /// The provider says `remaining` of counter `at` of `key`: raised to
    /// it when that is news.
    fn remains(
        self: &Arc<Self>,
        key: &Key,
        at: usize,
        (counter, quotas): (&Counter<'_>, Quotas),
        remaining: Remaining,
        own: Option<Hit>,
        now: Instant,
    ) {
        let limit = counter.quota.limit();
        if remaining.left >= limit || remaining.reset.is_zero() {
            // Nothing a count could say (a remaining above the limit: the
            // provider's limit is above ours).
            return;
        }
        let target = limit - remaining.left;
        if !self.heard.rises(key, at, target, own, now) {
            return;
        }
        let Ok(within) = Window::new(remaining.reset) else {
            return;
        };
        let budget = Arc::clone(self);
        let key = key.clone();
        let forgotten = key.clone();
        let sent = self.write("raise", move || async move {
            let counter = budget.counters(&quotas)[at];
            let write = budget.backend.raise(&key, counter, target, within);
            let written = timed(budget.timeout, write).await.map(drop);
            if written.is_err() {
                // Not in the store: the provider's next word raises again.
                budget.heard.forget(&key, at, target);
            }
            written
        });
        if !sent {
            self.heard.forget(&forgotten, at, target);
        }
    }

    /// Send a write to the store on the current tokio runtime (`false`
    /// when there is none); one that fails is logged.
    fn write<F, Fut>(&self, what: &'static str, write: F) -> bool
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BackendError>> + Send,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.unwritten(what, &BackendError::Unavailable("no tokio runtime".into()));
            return false;
        };
        let budget_name = Arc::clone(&self.name);
        let gate = Arc::clone(&self.heard);
        runtime.spawn(async move {
            if let Err(err) = write().await
                && let Some(suppressed) = gate.unwritten.admit()
            {
                log_unwritten(&budget_name, what, &err, suppressed);
            }
        });
        true
    }

    #[cold]
    fn unwritten(&self, what: &'static str, err: &BackendError) {
        if let Some(suppressed) = self.heard.unwritten.admit() {
            log_unwritten(&self.name, what, err, suppressed);
        }
    }

    #[cold]
    fn ignored(&self, ignored: &Ignored) {
        if let Some(suppressed) = self.heard.ignored.admit() {
            tracing::warn!(
                budget = %self.name,
                header = %ignored.header,
                why = ignored.why,
                suppressed,
                "a provider's rate-limit header was ignored: it changes nothing"
            );
        }
    }

    /// Which of the provider's budgets counter `at` counts.
    fn unit(&self, at: usize) -> Unit {
        match (at, &self.tokens) {
            (0, None) => self.unit,
            (0, Some(_)) => Unit::Requests,
            _ => Unit::Tokens,
        }
    }
}

#[cold]
fn log_unwritten(budget: &str, what: &str, err: &BackendError, suppressed: u64) {
    if err.is_corrupt() {
        tracing::error!(budget, what, error = %err, suppressed, "the provider's word could not be written: a corrupt counter, left as it is; it holds in this process only");
    } else {
        tracing::warn!(budget, what, error = %err, suppressed, "the provider's word could not be written to the store: it holds in this process only");
    }
}
