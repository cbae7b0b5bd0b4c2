//! Errors raised while building a limiter.

use std::fmt;

use crate::name::MAX_NAME_LEN;

// The bounds that messages name, as numbers: this module is the one every
// other imports, so it imports none of theirs. Tests beside each constant
// check that these agree with it.
/// [`Window::MAX`](crate::Window::MAX), as a rate string's window.
const MAX_WINDOW: &str = "36525d";
/// [`Window::MAX`](crate::Window::MAX) in milliseconds.
const MAX_WINDOW_MS: u64 = 36_525 * 86_400_000;
/// [`MAX_SHARDS`](crate::backend::MAX_SHARDS).
const MAX_SHARDS: usize = 1 << 16;
/// [`MIN_SECRET_LEN`](crate::backend::MIN_SECRET_LEN).
const MIN_SECRET_LEN: usize = 32;
/// [`MAX_TOP_DENIED`](crate::denied::MAX_TOP_DENIED).
const MAX_TOP_DENIED: usize = 1 << 16;

/// A configuration mistake, reported when the limiter is built and never while
/// serving a request.
///
/// Each constructor that can fail returns it; its message says what to write
/// instead:
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};
///
/// assert_eq!(Quota::new(0, Duration::from_secs(1)), Err(ConfigError::ZeroLimit));
/// let err = RateLimitLayer::try_new("my api", "10/s".parse().unwrap()).unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidName(_)));
/// assert!(err.to_string().starts_with("invalid limiter name \"my api\""));
/// ```
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
    /// A cap of zero requests in flight (see
    /// [`InFlight::new`](crate::InFlight::new)): no request could run.
    ZeroInFlight,
    /// A slot's lease no longer than the layer's backend timeout (see
    /// [`InFlightLayer::check`](crate::InFlightLayer::check)): a slot
    /// could run out before the store's answer that made it arrived.
    LeaseNotAboveTimeout {
        /// The lease, in milliseconds.
        lease_ms: u64,
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// A shard count of zero, or above
    /// [`MAX_SHARDS`](crate::backend::MAX_SHARDS).
    InvalidShards(usize),
    /// A storage-key prefix with a `{` or `}`, which would choose the Redis
    /// Cluster hash tag in place of the key (shown escaped).
    InvalidPrefix(String),
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
    /// A rate string that is not a quota or a window (`"0/min"`,
    /// `"10/5y"`): what [`Quota`](crate::Quota) and
    /// [`Window`](crate::Window) parsing returns. Its message is
    /// `invalid rate "<input>": <reason>`.
    ///
    /// ```
    /// use tower_pinned_window::{ConfigError, Quota};
    ///
    /// fn from_config(rate: &str) -> Result<Quota, ConfigError> {
    ///     Ok(rate.parse::<Quota>()?)
    /// }
    ///
    /// let err = "10/5y".parse::<Quota>().unwrap_err();
    /// let ConfigError::InvalidRate { input, reason } = &err else { unreachable!() };
    /// assert_eq!(input, "10/5y");
    /// assert_eq!(reason, "unknown unit \"y\" (use ms, s, m or min, h, d)");
    /// assert_eq!(err.to_string(), "invalid rate \"10/5y\": unknown unit \"y\" (use ms, s, m or min, h, d)");
    /// assert_eq!(from_config("10/5y"), Err(err));
    /// ```
    InvalidRate {
        /// The text that was parsed.
        input: String,
        /// What was wrong, naming the part of `input` that was: `the
        /// window "0s" is zero; ...`, `unknown unit "y" ...`.
        reason: String,
    },
    /// A header name that is not a valid HTTP header name.
    InvalidHeaderName(String),
    /// A secret for [`PrivateKeys`](crate::backend::PrivateKeys) or
    /// [`TopDenied::with_secret`](crate::denied::TopDenied::with_secret)
    /// shorter than [`MIN_SECRET_LEN`](crate::backend::MIN_SECRET_LEN)
    /// bytes (its length; the secret itself is never shown).
    SecretTooShort(usize),
    /// A Redis URL that does not parse (the reason; the URL itself is not
    /// shown, since it may hold a password).
    InvalidUrl(String),
    /// A circuit breaker that would open after zero failures.
    ZeroBreakerFailures,
    /// A circuit breaker with a zero cool-down.
    ZeroBreakerCooldown,
    /// A replica-acknowledged mode that waits for zero replicas (see
    /// [`RedisBackendBuilder::wait_for_replicas`](https://docs.rs/tower-pinned-window-redis/latest/tower_pinned_window_redis/struct.RedisBackendBuilder.html#method.wait_for_replicas)).
    ZeroWaitReplicas,
    /// A [`LimitBook`](crate::LimitBook) whose layers would read their
    /// limits from the store on every request: a zero staleness bound.
    ZeroStaleness,
    /// A replica-acknowledged mode with a zero timeout: Redis's `WAIT`
    /// would wait forever.
    ZeroWaitTimeout,
    /// A deny cache whose denials of counters that can go down would be
    /// held for no time (see
    /// [`RedisBackendBuilder::deny_cache_recheck`](https://docs.rs/tower-pinned-window-redis/latest/tower_pinned_window_redis/struct.RedisBackendBuilder.html#method.deny_cache_recheck)
    /// and
    /// [`PostgresBackendBuilder::deny_cache_recheck`](https://docs.rs/tower-pinned-window-postgres/latest/tower_pinned_window_postgres/struct.PostgresBackendBuilder.html#method.deny_cache_recheck)):
    /// turn the cache off with `deny_cache(0)` instead.
    ZeroDenyCacheRecheck,
    /// A request cost above a quota's limit (see
    /// [`RateLimitLayer::check`](crate::RateLimitLayer::check)): such
    /// a request could never be admitted.
    CostAboveLimit {
        /// The cost given.
        cost: u64,
        /// The smallest limit among the layer's quotas.
        limit: u64,
    },
    /// A [`reserve`](crate::RateLimitLayer::reserve) without a
    /// [`charge`](crate::RateLimitLayer::charge) to settle it (see
    /// [`RateLimitLayer::check`](crate::RateLimitLayer::check) and
    /// [`BudgetLayer::check`](crate::outbound::BudgetLayer::check)): every
    /// request would keep its whole estimate.
    ReserveWithoutCharge,
    /// A [`reserve`](crate::RateLimitLayer::reserve) together with a
    /// [`cost`](crate::RateLimitLayer::cost) or
    /// [`cost_fn`](crate::RateLimitLayer::cost_fn) (see
    /// [`RateLimitLayer::check`](crate::RateLimitLayer::check) and
    /// [`BudgetLayer::check`](crate::outbound::BudgetLayer::check)): the
    /// reservation is the request's cost on the way in, so only one may
    /// say what a request spends.
    ReserveWithCost,
    /// An insurance [`Share`](crate::Share) that is not a fraction in
    /// `(0, 1]` (a zero numerator or denominator, or a numerator above the
    /// denominator), or text that is not `N/D` (what was given).
    InvalidShare(String),
    /// A body limit of 0 bytes for a reservation read from the body
    /// ([`BodyEstimate::try_body_limit`](crate::cost::BodyEstimate::try_body_limit)):
    /// no body could be read.
    ZeroBodyLimit,
    /// A [`BudgetLayer::tokens`](crate::outbound::BudgetLayer::tokens)
    /// budget named as the budget beside it (the name given): the two
    /// would be one counter.
    TokensNameTaken(String),
    /// A [`BudgetLayer`](crate::outbound::BudgetLayer) that
    /// [`counts`](crate::outbound::BudgetLayer::counts) tokens and has a
    /// [`tokens`](crate::outbound::BudgetLayer::tokens) budget too: beside
    /// one, the budget counts the provider's requests.
    TokensCountedTwice,
    /// An `operator::Operator` was given two layers of
    /// one name (feature `operator`): the operator names a layer by it.
    OperatorNameTaken(String),
    /// A table of the keys denied most (see
    /// [`TopDenied::new`](crate::denied::TopDenied::new)) of zero counters,
    /// which could show nothing, or of more than
    /// [`MAX_TOP_DENIED`](crate::denied::MAX_TOP_DENIED) (the size given).
    InvalidTopDenied(usize),
}

impl ConfigError {
    /// The error on the rate string `input`: `problem` was wrong with
    /// `part`.
    pub(crate) fn invalid_rate(input: &str, problem: RateProblem, part: &str) -> Self {
        Self::InvalidRate {
            input: input.to_owned(),
            reason: problem.reason(part),
        }
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
                "a quota's window must be at most {MAX_WINDOW_MS} ms (36,525 days, Window::MAX)"
            ),
            Self::InvalidName(name) => write!(
                f,
                "invalid limiter name {name:?}: use 1 to {} characters from A-Z a-z 0-9 _ - . :",
                MAX_NAME_LEN
            ),
            Self::ZeroCapacity => f.write_str("the key-store capacity must be at least 1"),
            Self::ZeroInFlight => f.write_str("a cap on requests in flight must be at least 1"),
            Self::LeaseNotAboveTimeout {
                lease_ms,
                timeout_ms,
            } => write!(
                f,
                "a slot's lease of {lease_ms} ms must be longer than the backend timeout of {timeout_ms} ms"
            ),
            Self::InvalidShards(shards) => {
                write!(f, "the shard count must be 1 to {MAX_SHARDS}, not {shards}")
            }
            Self::InvalidPrefix(prefix) => write!(
                f,
                "the storage-key prefix {prefix:?} must not contain '{{' or '}}' (they would choose the Redis Cluster hash tag)"
            ),
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
            Self::InvalidRate { input, reason } => write!(f, "invalid rate {input:?}: {reason}"),
            Self::InvalidHeaderName(name) => {
                write!(f, "{name:?} is not a valid HTTP header name")
            }
            Self::SecretTooShort(len) => write!(
                f,
                "the secret (of private keys, or of the keys denied most) is {len} bytes; it must be at least {MIN_SECRET_LEN} (random bytes, such as `openssl rand -hex 32`)"
            ),
            Self::InvalidUrl(reason) => write!(f, "invalid Redis URL: {reason}"),
            Self::ZeroBreakerFailures => {
                f.write_str("a circuit breaker must open after at least one failure")
            }
            Self::ZeroBreakerCooldown => {
                f.write_str("a circuit breaker's cool-down must be longer than zero")
            }
            Self::ZeroStaleness => f.write_str(
                "stored limits need a staleness bound above zero (a zero bound would read the store on every request)",
            ),
            Self::ZeroWaitReplicas => {
                f.write_str(
                    "a write must wait for at least one replica (or leave wait_for_replicas off)",
                )
            }
            Self::ZeroWaitTimeout => f.write_str(
                "the wait for replicas must have a timeout longer than zero (WAIT with 0 waits forever)",
            ),
            Self::ZeroDenyCacheRecheck => f.write_str(
                "the deny cache's recheck bound must be longer than zero (deny_cache(0) turns the cache off)",
            ),
            Self::CostAboveLimit { cost, limit } => write!(
                f,
                "a request cost of {cost} is above the limit of {limit}: such a request could never be admitted"
            ),
            Self::ReserveWithoutCharge => f.write_str(
                "a reservation (reserve) needs a charge to settle it: add .charge(..), which reads each answer's actual use",
            ),
            Self::ReserveWithCost => f.write_str(
                "a reservation (reserve) is the request's cost on the way in: drop .cost(..) or .cost_fn(..), or the reserve",
            ),
            Self::TokensNameTaken(name) => write!(
                f,
                "the tokens budget is named {name:?}, as the budget beside it: give it a name of its own, or the two are one counter"
            ),
            Self::TokensCountedTwice => f.write_str(
                "a budget with a tokens budget beside it counts the provider's requests: drop .counts(Unit::Tokens), or the tokens budget",
            ),
            Self::OperatorNameTaken(name) => write!(
                f,
                "the operator has a layer named {name:?} already: each layer it serves needs a name of its own"
            ),
            Self::ZeroBodyLimit => f.write_str(
                "a body limit must be at least 1 byte: give the most bytes of a body to read for its estimate",
            ),
            Self::InvalidShare(share) => write!(
                f,
                "an insurance share must be a fraction N/D above 0 and at most 1, such as 1/4, not {share:?}"
            ),
            Self::InvalidTopDenied(capacity) => write!(
                f,
                "the table of the keys denied most must hold 1 to {MAX_TOP_DENIED} counters, not {capacity}"
            ),
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

/// What was wrong with a rate string, which
/// [`ConfigError::InvalidRate`]'s `reason` says in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateProblem {
    /// Nothing but whitespace.
    Empty,
    /// No `/` or ` per ` between the limit and the window (`"abc"`).
    NoSeparator,
    /// The limit is not a whole number of plain digits (`"1.5/s"`, `"x/s"`).
    InvalidLimit,
    /// The limit is negative (`"-1/min"`).
    NegativeLimit,
    /// The limit is zero (`"0/min"`): a quota admits at least one request.
    ZeroLimit,
    /// The limit is larger than `u64::MAX`.
    LimitTooLarge,
    /// Nothing after the separator (`"10/"`).
    MissingWindow,
    /// The window is not a whole number and a unit (`"10/1.5s"`).
    InvalidWindow,
    /// The window has a number but no unit (`"10/60"`).
    MissingUnit,
    /// The unit is none of `ms`, `s`, `m`, `min`, `h`, `d` (`"10/5y"`).
    UnknownUnit,
    /// The window is negative (`"10/-5s"`).
    NegativeWindow,
    /// The window is zero (`"10/0s"`); it is never read as "no expiry".
    ZeroWindow,
    /// The window is longer than [`Window::MAX`](crate::Window::MAX), or its number is too large
    /// to count.
    WindowTooLong,
}

impl RateProblem {
    /// The reason of [`ConfigError::InvalidRate`]: what was wrong, with
    /// `part` (the part of the input that was; empty when the whole was).
    fn reason(self, part: &str) -> String {
        const UNITS: &str = "ms, s, m or min, h, d";
        const FORM: &str = "write LIMIT/WINDOW, such as \"100/min\" or \"5 per 15m\"";
        match self {
            Self::Empty => format!("it is empty; {FORM}"),
            Self::NoSeparator => {
                format!("no \"/\" or \" per \" between the limit and the window; {FORM}")
            }
            Self::InvalidLimit => format!("the limit {part:?} is not a whole number"),
            Self::NegativeLimit => format!("the limit {part} is negative; it must be at least 1"),
            Self::ZeroLimit => {
                "the limit is 0; a quota admits at least 1 request per window".to_owned()
            }
            Self::LimitTooLarge => format!("the limit {part} is larger than {}", u64::MAX),
            Self::MissingWindow => format!("the window is missing; {FORM}"),
            Self::InvalidWindow => format!(
                "the window {part:?} is not a whole number and a unit, such as \"15m\" or \"1500ms\""
            ),
            Self::MissingUnit => format!("the window {part:?} has no unit ({UNITS})"),
            Self::UnknownUnit => format!("unknown unit {part:?} (use {UNITS})"),
            Self::NegativeWindow => {
                format!("the window {part:?} is negative; it must be longer than zero")
            }
            Self::ZeroWindow => format!(
                "the window {part:?} is zero; it must be longer than zero (it is never read as \"no expiry\")"
            ),
            Self::WindowTooLong => {
                format!("the window {part:?} is longer than {MAX_WINDOW} (Window::MAX, 100 years)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_in_messages_are_the_crates() {
        assert_eq!(MAX_WINDOW, crate::Window::MAX.to_string());
        assert_eq!(MAX_WINDOW_MS, crate::Window::MAX.as_millis());
        assert_eq!(MAX_SHARDS, crate::backend::MAX_SHARDS);
        assert_eq!(MIN_SECRET_LEN, crate::backend::MIN_SECRET_LEN);
        assert_eq!(MAX_TOP_DENIED, crate::denied::MAX_TOP_DENIED);
    }
}
