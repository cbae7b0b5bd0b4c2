//! What a remote backend's future holds: its result, already there (the
//! local deny cache answered, or there is nothing to send), or the call that
//! brings it, one round trip away. The Redis and PostgreSQL futures wrap it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::BackendError;

/// A result that is here already, or a boxed call that brings it.
pub(crate) enum ResultOrCall<T> {
    Ready(Option<Result<T, BackendError>>),
    Remote(Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>),
}

impl<T> ResultOrCall<T> {
    /// Polls the call, or hands out the ready result once; `what` names the
    /// future in the panic of a poll after completion.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        what: &str,
    ) -> Poll<Result<T, BackendError>> {
        match self {
            Self::Ready(result) => Poll::Ready(
                result
                    .take()
                    .unwrap_or_else(|| panic!("{what} polled after it completed")),
            ),
            Self::Remote(future) => future.as_mut().poll(cx),
        }
    }

    /// What a `Debug` line shows of it.
    pub(crate) fn state(&self) -> &'static str {
        match self {
            Self::Ready(_) => "ready",
            Self::Remote(_) => "remote",
        }
    }
}
