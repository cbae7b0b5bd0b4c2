//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::backend::Backend;
use crate::future::ResponseFuture;
use crate::key::KeyExtractor;
use crate::layer::{Core, OnMissingKey};
use crate::response::{Deny, is_grpc};

/// Rate-limits the requests to `S`; made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Clones share the layer's configuration and backend, so they share one
/// budget per key.
pub struct RateLimit<S, K, Bk, D> {
    inner: S,
    key: K,
    core: Arc<Core<Bk, D>>,
}

impl<S, K, Bk, D> RateLimit<S, K, Bk, D> {
    pub(crate) fn new(inner: S, key: K, core: Arc<Core<Bk, D>>) -> Self {
        Self { inner, key, core }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, Bk, D, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, Bk, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
    Bk: Backend,
    D: Deny<ResBody>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, Bk, D>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was driven to readiness goes into the future; a
        // clone stays behind for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let core = Arc::clone(&self.core);
        let grpc = is_grpc(request.headers());
        match self.key.extract(&request) {
            Ok(key) => {
                let settings = &core.settings;
                let hit = core
                    .backend
                    .hit(&settings.name, &key, settings.quota.window());
                ResponseFuture::checking(core, hit, inner, request, key, grpc)
            }
            Err(err) => match core.settings.missing_key {
                OnMissingKey::Allow => {
                    tracing::debug!(limiter = %core.settings.name, error = %err, "no rate-limit key; passing the request uncounted");
                    let future = {
                        let mut inner = inner;
                        inner.call(request)
                    };
                    ResponseFuture::passing(core, future)
                }
                _ => {
                    let response = core.key_error_response(&err, grpc);
                    ResponseFuture::respond(core, response)
                }
            },
        }
    }
}

impl<S: Clone, K: Clone, Bk, D> Clone for RateLimit<S, K, Bk, D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            key: self.key.clone(),
            core: Arc::clone(&self.core),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, Bk: fmt::Debug, D> fmt::Debug for RateLimit<S, K, Bk, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("core", &self.core)
            .finish()
    }
}
