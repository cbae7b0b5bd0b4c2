//! A provider's answer read by `outbound::Reader::standard()`: its status,
//! and any bytes as the values of the rate-limit headers it reads.
//!
//! The input is text, one item a line (the values are bytes):
//!
//! ```text
//! 429 300000                      the status, and the reader's max_signal in
//!                                 ms (either optional: 429, one hour)
//! retry-after: 3                  header lines: a name, `:`, the value (one
//! x-ratelimit-reset-tokens:6m0s   leading space dropped); a name the reader
//! ratelimit: "api";r=0;t=10       does not read stands for one it does,
//!                                 chosen by its bytes
//! ```
//!
//! Read at 2024-05-01T12:00:00Z. Checked: no panic; every duration in the
//! word is at most max_signal, and no `closed_for` is zero; a unit is closed
//! only by a Retry-After on a 429 or 503, or for the reset of a remaining of
//! 0 (no wait is invented); an answer without those headers is silent, and
//! the header an `Ignored` names is in the answer; the `Retry-After` of any
//! other status changes nothing; the same answer reads the same.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, Response, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_pinned_window::Window;
use tower_pinned_window::outbound::Reader;
use tower_pinned_window::outcome::ResponseHead;

/// Every header the standard reader reads.
const NAMES: [&str; 15] = [
    "retry-after",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "ratelimit",
    "ratelimit-policy",
];

/// 2024-05-01T12:00:00Z.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_714_564_800)
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&b| b == b'\n');
    let first = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let mut first = first.split_ascii_whitespace();
    let status = first
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut reader = Reader::standard();
    let mut max = Duration::from_secs(3600);
    if let Some(ms) = first.next().and_then(|s| s.parse::<u64>().ok()) {
        if let Ok(window) = Window::new(Duration::from_millis(ms)) {
            reader = reader.max_signal(window);
            max = window.as_duration();
        }
    }

    let mut answer = Response::builder().status(status).body(()).unwrap();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let name = NAMES
            .iter()
            .find(|known| known.as_bytes().eq_ignore_ascii_case(name))
            .copied()
            .unwrap_or_else(|| {
                let sum = name.iter().map(|&b| usize::from(b)).sum::<usize>();
                NAMES[sum % NAMES.len()]
            });
        // Bytes no header value can hold (CR, LF, NUL, ...) never reach a reader.
        if let Ok(value) = HeaderValue::from_bytes(value) {
            answer
                .headers_mut()
                .append(HeaderName::from_static(name), value);
        }
    }

    let head = ResponseHead::new(&answer);
    let (word, ignored) = reader.read(&head, now());

    let refused = matches!(status.as_u16(), 429 | 503);
    let retry_after = answer.headers().contains_key("retry-after");
    for signal in [word.requests, word.tokens] {
        if let Some(closed) = signal.closed_for {
            assert!(closed <= max, "{word:?} past {max:?}");
            assert!(!closed.is_zero(), "{word:?}: closed for no time");
            let reset = signal.remaining.filter(|r| r.left == 0).map(|r| r.reset);
            assert!(
                (refused && retry_after) || reset == Some(closed),
                "{word:?}: a wait from nowhere"
            );
        }
        if let Some(remaining) = signal.remaining {
            assert!(remaining.reset <= max, "{word:?} past {max:?}");
        }
    }
    if answer.headers().is_empty() {
        assert!(word.is_silent() && ignored.is_none(), "{word:?} {ignored:?}");
    }
    if let Some(ignored) = ignored {
        assert!(
            answer.headers().contains_key(ignored.header),
            "{ignored:?} is not in the answer"
        );
    }
    assert_eq!(reader.read(&head, now()), (word, ignored), "read twice");

    if !refused && retry_after {
        let mut without = answer;
        without.headers_mut().remove("retry-after");
        let (alone, _) = reader.read(&ResponseHead::new(&without), now());
        assert_eq!(alone, word, "the Retry-After of a {status} changed the word");
    }
});
