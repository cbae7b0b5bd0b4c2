//! The rules for the names users give: a layer's name (it namespaces the
//! layer's counters and is its policy name in the headers) and a quota's
//! policy name (what clients see in the `RateLimit` headers).
//!
//! Both rules keep a name inside what an sf-string (RFC 9651) can carry, so
//! a name checked here goes into the headers as it is.

/// The longest layer name, in bytes.
///
/// ```
/// use tower_pinned_window::{MAX_NAME_LEN, Quota, RateLimitLayer};
///
/// let quota: Quota = "10/s".parse().unwrap();
/// assert!(RateLimitLayer::try_new("a".repeat(MAX_NAME_LEN), quota).is_ok());
/// assert!(RateLimitLayer::try_new("a".repeat(MAX_NAME_LEN + 1), quota).is_err());
/// ```
pub const MAX_NAME_LEN: usize = 32;

/// A layer name: 1 to [`MAX_NAME_LEN`] characters from `A-Z a-z 0-9 _ - . :`.
pub(crate) fn is_layer_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// A policy name: at least one character, each printable ASCII (space to
/// `~`), the characters an sf-string holds.
pub(crate) fn is_policy_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_sf_string_byte)
}

/// Whether an sf-string can hold `b` (quotes and backslashes are escaped by
/// the serializer).
pub(crate) fn is_sf_string_byte(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names() {
        for good in ["api", "login:v2", "a.b-c_d", &"x".repeat(MAX_NAME_LEN)] {
            assert!(is_layer_name(good), "{good:?}");
        }
        for bad in [
            "",
            "with space",
            "quote\"",
            "é",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(!is_layer_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn policy_names() {
        for good in [
            "pro",
            "pro tier",
            "/auth.Auth/Login",
            "a \"quoted\" \\ name",
            "~",
        ] {
            assert!(is_policy_name(good), "{good:?}");
        }
        for bad in ["", "tab\there", "new\nline", "é", "\u{7f}"] {
            assert!(!is_policy_name(bad), "{bad:?}");
        }
    }
}
