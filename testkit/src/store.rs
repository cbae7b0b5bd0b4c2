//! What the suite needs of a backend's test harness: a [`Store`] that makes
//! fresh backends, and the few things only the store's own client can do
//! ([`Ability`]); [`Private`] runs the same harness through
//! [`PrivateKeys`].

use std::fmt;
use std::future::Future;

use tower_pinned_window::ConfigError;
use tower_pinned_window::backend::{Backend, LimitScope, MIN_SECRET_LEN, PrivateKeys};
use tower_pinned_window::key::Key;

/// What a store may be able to do besides making backends. A scenario that
/// needs one the store lacks is not applicable to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ability {
    /// [`Store::corrupt`]: write a value that is not a counter.
    Corrupt,
    /// [`Store::stored`]: read what the store holds for a counter, with its
    /// lifetime.
    ReadStored,
    /// [`Store::audit`]: run the backend's audit.
    Audit,
    /// [`Store::slots_record`]: read what the store holds for a key's
    /// slots in flight, with its lifetime.
    ReadSlots,
    /// [`Store::corrupt_slots`]: write a record of a key's slots that is
    /// not of the store's shape.
    CorruptSlots,
    /// [`Store::corrupt_lockout`]: write a counter's lockout without a
    /// lifetime.
    CorruptLockout,
    /// [`Store::corrupt_limit`]: write a stored limit that is not a limit.
    CorruptLimit,
}

impl fmt::Display for Ability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Corrupt => "write a corrupt counter",
            Self::ReadStored => "read a stored counter and its lifetime",
            Self::Audit => "run an audit",
            Self::ReadSlots => "read a key's slots in flight and their lifetime",
            Self::CorruptSlots => "write a corrupt record of slots",
            Self::CorruptLockout => "write a lockout without a lifetime",
            Self::CorruptLimit => "write a stored limit that is not a limit",
        })
    }
}

/// What a store holds for one counter, as its own client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Nothing: no counter, or one whose window has closed.
    Absent,
    /// A value.
    Value {
        /// The value as text: the count (`"3"`) for a counter, anything else
        /// for corrupt state. Two reads of an untouched value are equal.
        value: String,
        /// The deadline attached to it, in the store's clock, the unit of
        /// [`Hit::deadline`](tower_pinned_window::backend::Hit::deadline); `None` when it has no lifetime.
        expiry: Option<u64>,
    },
}

/// What a store holds for one key's slots in flight, as its own client
/// reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotsRecord {
    /// Nothing.
    Absent,
    /// A record of slots.
    Held {
        /// The slots in it, live or not yet dropped.
        slots: usize,
        /// The lifetime left on the record; `None` when it has none (a
        /// leak the contract forbids).
        lifetime: Option<std::time::Duration>,
    },
    /// A record that is not of the store's shape, as text: two reads of an
    /// untouched record are equal.
    Other(String),
}

/// What a backend's audit found, in the terms the suite checks.
///
/// For a backend of `tower-pinned-window`, from its `backend::AuditReport`:
/// the names in `without_lifetime` that are not in `corrupt`, and how many
/// `corrupt` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Audit {
    /// Counters without a lifetime that are not corrupt.
    pub without_lifetime: usize,
    /// Values that are not counters.
    pub corrupt: usize,
}

/// A backend's test harness, as the suite needs it.
///
/// Only [`fresh`](Store::fresh) is required. The other methods are
/// abilities: a store that has one says so in
/// [`abilities`](Store::abilities) and implements its method; the defaults
/// answer `None`, which a scenario that relies on the ability treats as a
/// broken harness (it only runs where the ability is claimed).
pub trait Store: Send + Sync + 'static {
    /// The backend under test.
    type Backend: Backend;

    /// A backend on counters that no other backend from `fresh` shares (its
    /// own key prefix, schema or process), empty. Called once or more per
    /// scenario.
    fn fresh(&self) -> impl Future<Output = Self::Backend> + Send;

    /// Another instance on the same counters as `backend`, as another
    /// application server would have (its own connection and caches). The
    /// default is a clone.
    fn another(&self, backend: &Self::Backend) -> impl Future<Output = Self::Backend> + Send {
        let backend = backend.clone();
        async move { backend }
    }

    /// The abilities this store has.
    fn abilities(&self) -> &'static [Ability] {
        &[]
    }

    /// [`Ability::Corrupt`]: store a value that is not a counter (text, a
    /// negative count: what the store can hold) for `namespace` and `key` of
    /// `backend`, in a form its audit reports as corrupt (a Redis audit
    /// looks at keys without a lifetime: give it none). `None` when the
    /// store cannot.
    fn corrupt(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<()>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::ReadStored`]: what the store holds for `namespace` and
    /// `key` of `backend`. `None` when the store cannot tell.
    fn stored(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<Stored>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::ReadSlots`]: what the store holds for `key`'s slots
    /// under `namespace`. `None` when the store cannot tell.
    fn slots_record(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<SlotsRecord>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::CorruptSlots`]: store a record of `key`'s slots under
    /// `namespace` that is not of the store's shape (another type, a member
    /// that is not a slot). `None` when the store cannot.
    fn corrupt_slots(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<()>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::CorruptLockout`]: store a lockout without a lifetime for
    /// `namespace`'s counter for `key` of `backend`: the marker a
    /// [`Spend::block`](tower_pinned_window::backend::Spend::block) lockout
    /// is, with no end (a Redis key without a TTL, an infinite
    /// `blocked_until` in PostgreSQL). `None` when the store cannot.
    fn corrupt_lockout(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Option<()>> + Send {
        let _ = (backend, namespace, key);
        async { None }
    }

    /// [`Ability::CorruptLimit`]: store, as the limit of `scope` for the
    /// layer `layer` of `backend`, a value that is not a limit (text, a
    /// limit of 0: what [`decode_limit`](tower_pinned_window::backend::decode_limit)
    /// refuses), where the backend's
    /// [`Limits::limits`](tower_pinned_window::backend::Limits::limits)
    /// reads it. `None` when the store cannot.
    fn corrupt_limit(
        &self,
        backend: &Self::Backend,
        layer: &str,
        scope: LimitScope<'_>,
    ) -> impl Future<Output = Option<()>> + Send {
        let _ = (backend, layer, scope);
        async { None }
    }

    /// [`Ability::Audit`]: run `backend`'s audit and say what it found
    /// (repairing what it repairs is allowed: the suite only reads what was
    /// found). `None` when the backend has none.
    fn audit(&self, backend: &Self::Backend) -> impl Future<Output = Option<Audit>> + Send {
        let _ = backend;
        async { None }
    }
}

/// A store whose backends are `S`'s wrapped in [`PrivateKeys`]: the same
/// contract must hold on keyed digests. Its abilities are `S`'s, reached
/// through the digest of each key.
pub struct Private<S> {
    inner: S,
    secret: Vec<u8>,
}

impl<S> Private<S> {
    /// `inner`'s backends, keyed by digests under `secret` (see
    /// [`PrivateKeys::new`]).
    ///
    /// # Panics
    /// When `secret` is shorter than [`MIN_SECRET_LEN`] bytes. Use
    /// [`try_new`](Self::try_new) for a secret read at run time.
    #[track_caller]
    pub fn new(inner: S, secret: impl AsRef<[u8]>) -> Self {
        match Self::try_new(inner, secret) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`new`](Self::new), for a secret read at run time.
    ///
    /// # Errors
    /// [`ConfigError::SecretTooShort`] for a secret shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn try_new(inner: S, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::SecretTooShort(secret.len()));
        }
        Ok(Self {
            inner,
            secret: secret.to_vec(),
        })
    }
}

impl<S: fmt::Debug> fmt::Debug for Private<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Private")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Store for Private<S> {
    type Backend = PrivateKeys<S::Backend>;

    async fn fresh(&self) -> Self::Backend {
        PrivateKeys::new(self.inner.fresh().await, &self.secret)
    }

    async fn another(&self, backend: &Self::Backend) -> Self::Backend {
        PrivateKeys::new(self.inner.another(backend.get_ref()).await, &self.secret)
    }

    fn abilities(&self) -> &'static [Ability] {
        self.inner.abilities()
    }

    async fn corrupt(&self, backend: &Self::Backend, namespace: &str, key: &Key) -> Option<()> {
        let digest = backend.digest(key);
        self.inner
            .corrupt(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn corrupt_lockout(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> Option<()> {
        let digest = backend.digest(key);
        self.inner
            .corrupt_lockout(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn stored(&self, backend: &Self::Backend, namespace: &str, key: &Key) -> Option<Stored> {
        let digest = backend.digest(key);
        self.inner
            .stored(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn audit(&self, backend: &Self::Backend) -> Option<Audit> {
        self.inner.audit(backend.get_ref()).await
    }

    async fn slots_record(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> Option<SlotsRecord> {
        let digest = backend.digest(key);
        self.inner
            .slots_record(backend.get_ref(), namespace, &digest)
            .await
    }

    async fn corrupt_slots(
        &self,
        backend: &Self::Backend,
        namespace: &str,
        key: &Key,
    ) -> Option<()> {
        let digest = backend.digest(key);
        self.inner
            .corrupt_slots(backend.get_ref(), namespace, &digest)
            .await
    }
}
