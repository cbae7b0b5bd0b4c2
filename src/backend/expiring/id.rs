//! A counter's identity in an expiring table: its namespace and its key,
//! held as a 16-byte word when both are short, inline when they fit in
//! 40 bytes, on the heap otherwise; and the fixed-size byte copies and
//! compares that build and match those forms without a call to `memcpy` or
//! `memcmp`.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, OnceLock, PoisonError};

use hashbrown::DefaultHashBuilder;

use crate::key::{HASHED_KEY_LEN, Key, MAX_KEY_LEN};

/// How many namespaces get a short id: four bits of a short id's tag.
pub(crate) const SHORT_NAMES: usize = 16;

/// The longest key a short id holds: fifteen bytes, beside its one-byte
/// tag, in one 16-byte word.
pub(crate) const SHORT_KEY: usize = 15;

/// The most bytes of an id held inline: namespace and key together up to
/// 38 bytes (a layer's name and an IP address fit).
pub(crate) const INLINE_ID: usize = 40;

/// Namespaces that get a short id, and so 32-byte slots: the first
/// [`SHORT_NAMES`] a table sees, each at the place it was given. A place
/// once given never changes, so whether a namespace has a short id, and
/// which, is the same for the table's whole life, and an entry is always
/// looked for in the part of the table it was put in.
#[derive(Debug, Default)]
pub(crate) struct Names {
    ids: [OnceLock<Box<str>>; SHORT_NAMES],
    /// Held while a namespace is given a place, so two threads seeing a new
    /// namespace at once give it one place, not two.
    adding: Mutex<()>,
}

/// What [`Names::find`] found for a namespace.
enum Place<'a> {
    Given(u8),
    /// The first free place, and its id.
    Free(u8, &'a OnceLock<Box<str>>),
    /// Every place is given to another namespace.
    Full,
}

impl Names {
    /// `namespace`'s short id, given now if it is new and a place is free.
    #[inline(always)]
    fn id(&self, namespace: &str) -> Option<u8> {
        match self.find(namespace) {
            Place::Given(id) => Some(id),
            Place::Free(..) => self.add(namespace),
            Place::Full => None,
        }
    }

    /// The namespace's place, or the first free one: places are given in
    /// order and never taken back, so none is given past a free one.
    #[inline(always)]
    fn find(&self, namespace: &str) -> Place<'_> {
        for (id, slot) in (0u8..).zip(&self.ids) {
            match slot.get() {
                Some(name) if eq_short(name.as_bytes(), namespace.as_bytes()) => {
                    return Place::Given(id);
                }
                Some(_) => {}
                None => return Place::Free(id, slot),
            }
        }
        Place::Full
    }

    /// Gives `namespace` the first free place, unless another thread has
    /// given it one meanwhile. A namespace longer than a key may be is held
    /// hashed, in a long id, and never gets a place.
    #[cold]
    #[inline(never)]
    fn add(&self, namespace: &str) -> Option<u8> {
        if namespace.len() > MAX_KEY_LEN {
            return None;
        }
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        match self.find(namespace) {
            Place::Given(id) => Some(id),
            Place::Free(id, slot) => {
                // Only ever set here, under the lock.
                let _ = slot.set(namespace.into());
                Some(id)
            }
            Place::Full => None,
        }
    }
}

/// A key's bytes, and the same bytes followed by zeros to
/// [`HASHED_KEY_LEN`], so that an id is built from them in fixed-size
/// copies.
#[derive(Clone, Copy)]
pub(crate) struct KeyBytes<'a> {
    bytes: &'a [u8],
    /// `bytes`, then zeros; only its first [`INLINE_ID`]` - 2` bytes are
    /// read, and only for a key that short.
    padded: &'a [u8; HASHED_KEY_LEN],
}

impl<'a> KeyBytes<'a> {
    /// A key as it is held: [`Key::padded`] is already zero-padded.
    #[inline(always)]
    pub(crate) fn of(key: &'a Key) -> Self {
        Self {
            bytes: key.as_bytes(),
            padded: key.padded(),
        }
    }

    /// Bytes that are not a [`Key`] (a key read back from a store's storage
    /// key, of any length), padded in `buffer`.
    pub(crate) fn copied(bytes: &'a [u8], buffer: &'a mut [u8; HASHED_KEY_LEN]) -> Self {
        *buffer = [0; HASHED_KEY_LEN];
        // A longer key is never held inline, so its padding is never read.
        if bytes.len() <= INLINE_ID - 2 {
            buffer[..bytes.len()].copy_from_slice(bytes);
        }
        Self {
            bytes,
            padded: buffer,
        }
    }
}

/// Room on the caller's stack for the parts of a long id that a lookup
/// builds: the hashed form of a namespace longer than a key may be, and
/// the inline form.
pub(crate) struct Scratch {
    hashed: Option<Key>,
    inline: [u8; INLINE_ID],
}

impl Scratch {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Self {
            hashed: None,
            inline: [0; INLINE_ID],
        }
    }
}

/// An id as a table stores it in a long slot. Which form an id takes
/// depends only on its namespace's and key's lengths, so two ids of
/// different forms are never equal.
#[derive(Debug)]
pub(crate) enum StoredId {
    /// `[namespace length][key length][key][namespace]`, zero-padded to
    /// [`INLINE_ID`] bytes: the lengths make the padding unambiguous, so
    /// two ids are equal exactly when their arrays are, and a lookup
    /// compares and hashes a fixed 40 bytes.
    Inline([u8; INLINE_ID]),
    /// `[namespace length][namespace][key]`, for longer ids.
    Heap(Box<[u8]>),
}

impl StoredId {
    /// The same hash as the [`Id`] it was stored from.
    pub(crate) fn hash(&self, hasher: &DefaultHashBuilder) -> u64 {
        match self {
            Self::Inline(id) => {
                let (n, k) = (usize::from(id[0]), usize::from(id[1]));
                hash_parts(hasher, &id[2 + k..2 + k + n], &id[2..2 + k])
            }
            Self::Heap(id) => {
                let (namespace, key) = split(id);
                hash_parts(hasher, namespace, key)
            }
        }
    }
}

/// An id as a lookup sees it: a short id, in one word; the inline form
/// built on the stack; or the two parts of a longer id, borrowed.
#[derive(Clone, Copy)]
pub(crate) enum Id<'a> {
    /// A short slot's id. Its tag makes it unambiguous: the namespace's
    /// place in [`Names`] names the namespace, and the length tells the key
    /// from its zero padding.
    Short(ShortId<'a>),
    /// The inline form, and the parts it was built from (hashed as they
    /// are: see [`hash_parts`]).
    Inline {
        id: &'a [u8; INLINE_ID],
        namespace: &'a [u8],
        key: &'a [u8],
    },
    Parts {
        namespace: &'a [u8],
        key: &'a [u8],
    },
}

impl<'a> Id<'a> {
    /// A short id when the key has at most [`SHORT_KEY`] bytes and `names`
    /// has (or now gives) the namespace a place; otherwise a long id:
    /// `scratch` holds the namespace's hashed form if it is longer than a
    /// key may be (a layer's name never is), and receives the inline form.
    #[inline(always)]
    pub(crate) fn new(
        names: &Names,
        namespace: &'a str,
        key: KeyBytes<'a>,
        scratch: &'a mut Scratch,
    ) -> Self {
        let Scratch { hashed, inline } = scratch;
        let KeyBytes { bytes: key, padded } = key;
        let len = key.len();
        if len <= SHORT_KEY
            && let Some(name) = names.id(namespace)
        {
            let padded = padded[..16].try_into().expect("16 bytes");
            let tag = (name << 4) | len as u8;
            return Self::Short(ShortId { padded, tag, key });
        }
        let namespace = if namespace.len() <= MAX_KEY_LEN {
            namespace.as_bytes()
        } else {
            hashed.insert(Key::new(namespace)).as_bytes()
        };
        let (n, k) = (namespace.len(), key.len());
        if 2 + n + k > INLINE_ID {
            return Self::Parts { namespace, key };
        }
        let id = inline;
        // Both lengths are at most MAX_KEY_LEN + 1, well within a byte.
        id[0] = n as u8;
        id[1] = k as u8;
        // A fixed-size copy of the key and its zero padding, then the
        // namespace over the padding, in fixed-size pieces.
        id[2..].copy_from_slice(&padded[..INLINE_ID - 2]);
        copy_short(&mut id[2 + k..2 + k + n], namespace);
        Self::Inline { id, namespace, key }
    }

    /// Whether a long slot's id is this one (never, for a short id).
    #[inline(always)]
    pub(crate) fn matches(&self, stored: &StoredId) -> bool {
        match (self, stored) {
            (Self::Inline { id, .. }, StoredId::Inline(other)) => inline_eq(id, other),
            (Self::Parts { namespace, key }, StoredId::Heap(other)) => {
                let (other_namespace, other_key) = split(other);
                key == &other_key && namespace == &other_namespace
            }
            _ => false,
        }
    }

    #[inline(always)]
    pub(crate) fn hash(&self, hasher: &DefaultHashBuilder) -> u64 {
        match self {
            Self::Short(short) => hash_short(hasher, short.tag, short.key),
            Self::Inline { namespace, key, .. } | Self::Parts { namespace, key } => {
                hash_parts(hasher, namespace, key)
            }
        }
    }

    /// The stored form of a long id.
    pub(crate) fn to_owned(self) -> StoredId {
        match self {
            Self::Short(_) => unreachable!("a short id is stored as its word"),
            Self::Inline { id, .. } => StoredId::Inline(*id),
            Self::Parts { namespace, key } => {
                let mut id = Vec::with_capacity(1 + namespace.len() + key.len());
                id.push(namespace.len() as u8);
                id.extend_from_slice(namespace);
                id.extend_from_slice(key);
                StoredId::Heap(id.into())
            }
        }
    }
}

/// A short id as a lookup sees it: the parts of a short slot's word.
#[derive(Clone, Copy)]
pub(crate) struct ShortId<'a> {
    /// The key's first 16 bytes: past its length they are zeros (see
    /// [`KeyBytes`]).
    padded: &'a [u8; 16],
    /// The word's low byte: the namespace's place in [`Names`], then the
    /// key's length.
    tag: u8,
    /// The key, hashed as it is (see [`hash_short`]).
    key: &'a [u8],
}

impl ShortId<'_> {
    /// The id's word: the tag, then the key's first 15 bytes (the shift
    /// drops the 16th, a zero). Built where an entry is compared, not
    /// before: the key's bytes were written a moment ago a few at a time,
    /// and a processor that cannot forward those small stores into this one
    /// wide load (AMD's Zen 4, for one) makes it wait until they reach the
    /// cache. Built up front, the hash and the lock waited behind it (about
    /// 48 ns a hit over 100k keys, against 31 ns built here).
    #[inline(always)]
    pub(crate) fn word(&self) -> u128 {
        (u128::from_le_bytes(*self.padded) << 8) | u128::from(self.tag)
    }
}

/// [`hash_short`] of a stored short id's word.
pub(crate) fn short_word_hash(hasher: &DefaultHashBuilder, word: u128) -> u64 {
    let tag = word as u8;
    let key = (word >> 8).to_le_bytes();
    hash_short(hasher, tag, &key[..usize::from(tag & 0xf)])
}

/// `a == b` for the few bytes of a namespace, in fixed-size (possibly
/// overlapping) pieces rather than a call to `memcmp`, the way
/// [`copy_short`] copies them: every piece compares bytes at the same place
/// in both.
#[inline(always)]
fn eq_short(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if b.len() != n {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let half = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        n == 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1])
    }
}

/// `to.copy_from_slice(from)` for the few bytes of a namespace, in
/// fixed-size (possibly overlapping) pieces rather than a call to `memcpy`:
/// every piece writes bytes of `from` at their own place, so the overlaps
/// write the same bytes twice.
#[inline(always)]
fn copy_short(to: &mut [u8], from: &[u8]) {
    let n = from.len();
    debug_assert_eq!(to.len(), n);
    if n >= 16 {
        let mut at = 0;
        while at + 8 < n {
            to[at..at + 8].copy_from_slice(&from[at..at + 8]);
            at += 8;
        }
        to[n - 8..].copy_from_slice(&from[n - 8..]);
    } else if n >= 8 {
        to[..8].copy_from_slice(&from[..8]);
        to[n - 8..].copy_from_slice(&from[n - 8..]);
    } else if n >= 4 {
        to[..4].copy_from_slice(&from[..4]);
        to[n - 4..].copy_from_slice(&from[n - 4..]);
    } else if n > 0 {
        to[0] = from[0];
        to[n / 2] = from[n / 2];
        to[n - 1] = from[n - 1];
    }
}

/// A heap id's namespace and key.
fn split(id: &[u8]) -> (&[u8], &[u8]) {
    let len = usize::from(id[0]);
    (&id[1..=len], &id[1 + len..])
}

/// Whether two inline ids are equal: five word comparisons, without a
/// call to `memcmp`.
#[inline(always)]
fn inline_eq(a: &[u8; INLINE_ID], b: &[u8; INLINE_ID]) -> bool {
    let word = |id: &[u8; INLINE_ID], i: usize| {
        u64::from_ne_bytes(id[8 * i..8 * i + 8].try_into().expect("8 bytes"))
    };
    (0..INLINE_ID / 8).fold(0, |diff, i| diff | (word(a, i) ^ word(b, i))) == 0
}

/// The hash of a short id, from its tag and its key as they are: hashing
/// the id's word instead would wait for that word (see [`ShortId::word`])
/// before the lookup could start.
#[inline(always)]
fn hash_short(hasher: &DefaultHashBuilder, tag: u8, key: &[u8]) -> u64 {
    let mut state = hasher.build_hasher();
    state.write_u8(tag);
    state.write(key);
    state.finish()
}

/// The hash of a long id, whichever form it is stored in. It reads the
/// namespace and the key where they already are: hashing an inline id
/// just built on the stack would read back, in words, bytes that were
/// written a few at a time a moment before, and a processor that cannot
/// forward those small stores into the wider loads (AMD's Zen 4, for one)
/// stalls on each such load.
#[inline(always)]
fn hash_parts(hasher: &DefaultHashBuilder, namespace: &[u8], key: &[u8]) -> u64 {
    // No separator between the two: foldhash turns its state by each
    // write's length before mixing the bytes in, so the same bytes split
    // at another place hash differently.
    let mut state = hasher.build_hasher();
    state.write(namespace);
    state.write(key);
    state.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq_short_compares_every_byte() {
        for n in 0..=MAX_KEY_LEN {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(eq_short(&a, &a.clone()), "{n} bytes equal");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!eq_short(&a, &b), "{n} bytes, byte {at} differs");
            }
            assert!(
                !eq_short(&a, &[a.as_slice(), &[0]].concat()),
                "{n} and one more"
            );
        }
    }

    #[test]
    fn copied_bytes_make_the_same_id_as_the_key() {
        let names = Names::default();
        let hasher = DefaultHashBuilder::default();
        let long = Key::new([b'h'; MAX_KEY_LEN + 1]);
        let keys = [
            Key::new(""),
            Key::new("a"),
            Key::new([0u8; SHORT_KEY]),
            Key::new([0u8; SHORT_KEY + 1]),
            Key::new("203.0.113.7:some-longer-key"),
            Key::new([7u8; MAX_KEY_LEN]),
            long,
        ];
        for namespace in ["n", "api:1/3600000ms", &"m".repeat(MAX_KEY_LEN + 1)] {
            for key in &keys {
                let (mut a, mut b, mut buffer) =
                    (Scratch::new(), Scratch::new(), [7; HASHED_KEY_LEN]);
                let of = Id::new(&names, namespace, KeyBytes::of(key), &mut a);
                let copied = KeyBytes::copied(key.as_bytes(), &mut buffer);
                let copied = Id::new(&names, namespace, copied, &mut b);
                let case = format!("{namespace:?} {key:?}");
                assert_eq!(of.hash(&hasher), copied.hash(&hasher), "{case}");
                match (of, copied) {
                    (Id::Short(of), Id::Short(copied)) => {
                        assert_eq!(of.word(), copied.word(), "{case}");
                        assert_eq!(
                            short_word_hash(&hasher, of.word()),
                            of_hash(&hasher, &of),
                            "{case}"
                        );
                    }
                    (Id::Short(_), _) | (_, Id::Short(_)) => panic!("{case}: two forms"),
                    (of, copied) => {
                        let stored = of.to_owned();
                        assert!(copied.matches(&stored), "{case}");
                        assert_eq!(stored.hash(&hasher), copied.hash(&hasher), "{case}");
                    }
                }
            }
        }
    }

    fn of_hash(hasher: &DefaultHashBuilder, id: &ShortId<'_>) -> u64 {
        Id::Short(*id).hash(hasher)
    }
}
