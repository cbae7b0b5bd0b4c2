//! The outcome capability's switch and state: what a passed request's
//! answer does to its hits ([`count_if`](crate::RateLimitLayer::count_if),
//! [`reset_if`](crate::RateLimitLayer::reset_if)), as one value, and the
//! step that reads an answer with it ([`OutcomeRules::fate`]).
//!
//! A layer holds the value only once one of them is set: a layer without
//! it never reads its answers' heads. A charge, which the answer's body
//! settles, is the spend plan's
//! ([`SpendPlan`](crate::budget::spend::SpendPlan)), as every middleware's
//! is.

use std::fmt;

use http::Response;

use crate::count::{CountIf, ResponseHead};

/// What a passed request's answer does to its hits: kept unless
/// `count_if` rejects the answer, cleared when `reset_if` picks it.
#[derive(Clone, Default)]
pub(crate) struct OutcomeRules {
    /// When set, a passed request's hit is kept only if its answer counts;
    /// otherwise it is refunded.
    pub(crate) count_if: Option<CountIf>,
    /// A passed request whose answer it picks clears its counters.
    pub(crate) reset_if: Option<CountIf>,
}

/// What an answer makes of the hits of the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// They stay counted (and, under a charge, the body is metered).
    Keep,
    /// They are refunded: `count_if` rejected the answer.
    Refund,
    /// The key's counters are cleared: `reset_if` picked the answer, which
    /// then counts whatever `count_if` says.
    Clear,
}

impl OutcomeRules {
    /// The fate of the hits of a request the service answered with
    /// `response`, read through its [`ResponseHead`]: `reset_if` is asked
    /// first, and `count_if` only about an answer it did not pick.
    pub(crate) fn fate<B>(&self, response: &Response<B>) -> Fate {
        let head = ResponseHead::new(response);
        if self.reset_if.as_ref().is_some_and(|reset| reset(&head)) {
            return Fate::Clear;
        }
        if self.count_if.as_ref().is_none_or(|counts| counts(&head)) {
            Fate::Keep
        } else {
            Fate::Refund
        }
    }
}

impl fmt::Debug for OutcomeRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeRules")
            .field("count_if", &self.count_if.is_some())
            .field("reset_if", &self.reset_if.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn status(code: u16) -> Response<()> {
        Response::builder().status(code).body(()).unwrap()
    }

    #[test]
    fn reset_if_decides_first_and_count_if_refunds_what_it_rejects() {
        let failures: CountIf = Arc::new(|head: &ResponseHead<'_>| head.is_failure());
        let successes: CountIf = Arc::new(|head: &ResponseHead<'_>| head.is_success());
        let rules = |count_if: Option<&CountIf>, reset_if: Option<&CountIf>| OutcomeRules {
            count_if: count_if.cloned(),
            reset_if: reset_if.cloned(),
        };
        let cases = [
            ("neither", rules(None, None), 401, Fate::Keep),
            (
                "count_if keeps",
                rules(Some(&failures), None),
                401,
                Fate::Keep,
            ),
            (
                "count_if refunds",
                rules(Some(&failures), None),
                200,
                Fate::Refund,
            ),
            (
                "reset_if clears",
                rules(None, Some(&successes)),
                200,
                Fate::Clear,
            ),
            (
                "reset_if passes",
                rules(None, Some(&successes)),
                401,
                Fate::Keep,
            ),
            (
                "reset_if before count_if",
                rules(Some(&failures), Some(&successes)),
                200,
                Fate::Clear,
            ),
            (
                "then count_if",
                rules(Some(&failures), Some(&successes)),
                401,
                Fate::Keep,
            ),
        ];
        for (case, rules, code, want) in cases {
            assert_eq!(rules.fate(&status(code)), want, "{case}");
        }
    }

    #[test]
    fn count_if_is_not_asked_about_an_answer_reset_if_picked() {
        let asked = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&asked);
        let rules = OutcomeRules {
            count_if: Some(Arc::new(move |_: &ResponseHead<'_>| {
                seen.fetch_add(1, Ordering::Relaxed);
                false
            })),
            reset_if: Some(Arc::new(|_: &ResponseHead<'_>| true)),
        };
        assert_eq!(rules.fate(&status(200)), Fate::Clear);
        assert_eq!(asked.load(Ordering::Relaxed), 0);
    }
}
