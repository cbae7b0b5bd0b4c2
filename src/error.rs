//! Errors raised while building a limiter.

use std::fmt;

use crate::name::MAX_NAME_LEN;
use crate::quota::ParseRateError;

/// A configuration mistake, reported when the limiter is built and never while
/// serving a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The limit was zero: a quota must admit at least one request per window.
    ZeroLimit,
    /// The window was zero, negative, or not a number. A window that short is a
    /// bug in the caller; it is never treated as "no expiry".
    NonPositiveWindow,
    /// The window is longer than [`Window::MAX`](crate::Window::MAX) (100
    /// years), the longest every backend holds exactly.
    WindowTooLong,
    /// The layer's name is empty, too long, or has a character outside
    /// `A-Z a-z 0-9 _ - . :` (see [`RateLimitLayer::try_new`](crate::RateLimitLayer::try_new)).
    InvalidName(String),
    /// The key-store capacity was zero.
    ZeroCapacity,
    /// A shard count of zero, or above
    /// [`MAX_SHARDS`](crate::backend::MAX_SHARDS).
    InvalidShards(usize),
    /// A storage-key prefix with a `{` or `}`, which would choose the Redis
    /// Cluster hash tag in place of the key (shown escaped).
    InvalidPrefix(String),
    /// The backend timeout was zero.
    ZeroTimeout,
    /// An IPv6 grouping prefix outside 32..=128 bits.
    InvalidIpv6Prefix(u8),
    /// A trusted-proxy or allowlist range that is neither a CIDR nor an IP
    /// address.
    InvalidCidr(String),
    /// A proxy-hop limit of zero: at least one hop must be walkable.
    ZeroHops,
    /// A policy name that is empty or has a character outside printable
    /// ASCII (see [`NamedQuota::try_new`](crate::NamedQuota::try_new)).
    InvalidPolicyName(String),
    /// A PostgreSQL schema or table name outside `a-z 0-9 _` (not starting
    /// with a digit), empty, or too long (63 bytes for a schema, 52 for a
    /// table, whose index name adds 11).
    InvalidSqlIdentifier(String),
    /// The interval between two runs of a backend's cleaner was zero.
    ZeroCleanInterval,
    /// A rate string that is not a quota (`"0/min"`, `"10/5y"`); the error
    /// says what was wrong.
    InvalidRate(ParseRateError),
    /// A header name that is not a valid HTTP header name.
    InvalidHeaderName(String),
    /// A secret for [`PrivateKeys`](crate::backend::PrivateKeys) shorter
    /// than [`MIN_SECRET_LEN`](crate::backend::MIN_SECRET_LEN) bytes (its
    /// length; the secret itself is never shown).
    SecretTooShort(usize),
    /// A Redis URL that does not parse (the reason; the URL itself is not
    /// shown, since it may hold a password).
    InvalidUrl(String),
    /// A circuit breaker that would open after zero failures.
    ZeroBreakerFailures,
    /// A circuit breaker with a zero cool-down.
    ZeroBreakerCooldown,
}

impl From<ParseRateError> for ConfigError {
    fn from(err: ParseRateError) -> Self {
        Self::InvalidRate(err)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("a quota's limit must be at least 1"),
            Self::NonPositiveWindow => f.write_str(
                "a quota's window must be longer than zero (it is never read as \"no expiry\")",
            ),
            Self::WindowTooLong => write!(
                f,
                "a quota's window must be at most {} ms (36,525 days, Window::MAX)",
                crate::Window::MAX.as_millis()
            ),
            Self::InvalidName(name) => write!(
                f,
                "invalid limiter name {name:?}: use 1 to {} characters from A-Z a-z 0-9 _ - . :",
                MAX_NAME_LEN
            ),
            Self::ZeroCapacity => f.write_str("the key-store capacity must be at least 1"),
            Self::InvalidShards(shards) => write!(
                f,
                "the shard count must be 1 to {}, not {shards}",
                crate::backend::MAX_SHARDS
            ),
            Self::InvalidPrefix(prefix) => write!(
                f,
                "the storage-key prefix {prefix:?} must not contain '{{' or '}}' (they would choose the Redis Cluster hash tag)"
            ),
            Self::ZeroTimeout => f.write_str("the backend timeout must be longer than zero"),
            Self::InvalidCidr(cidr) => {
                write!(
                    f,
                    "{cidr:?} is neither a CIDR (10.0.0.0/8) nor an IP address"
                )
            }
            Self::ZeroHops => f.write_str("the proxy-hop limit must be at least 1"),
            Self::InvalidPolicyName(name) => write!(
                f,
                "invalid policy name {name:?}: use at least one character, each printable ASCII (space to ~)"
            ),
            Self::InvalidSqlIdentifier(name) => write!(
                f,
                "invalid PostgreSQL name {name:?}: use 1 to 63 characters (52 for a table) from a-z 0-9 _, not starting with a digit"
            ),
            Self::ZeroCleanInterval => {
                f.write_str("the cleaner's interval must be longer than zero")
            }
            Self::InvalidRate(err) => err.fmt(f),
            Self::InvalidHeaderName(name) => {
                write!(f, "{name:?} is not a valid HTTP header name")
            }
            Self::SecretTooShort(len) => write!(
                f,
                "the private-keys secret is {len} bytes; it must be at least {} (random bytes, such as `openssl rand -hex 32`)",
                crate::backend::MIN_SECRET_LEN
            ),
            Self::InvalidUrl(reason) => write!(f, "invalid Redis URL: {reason}"),
            Self::ZeroBreakerFailures => {
                f.write_str("a circuit breaker must open after at least one failure")
            }
            Self::ZeroBreakerCooldown => {
                f.write_str("a circuit breaker's cool-down must be longer than zero")
            }
            Self::InvalidIpv6Prefix(bits) => {
                write!(
                    f,
                    "an IPv6 grouping prefix must be 32 to 128 bits, not {bits}"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}
