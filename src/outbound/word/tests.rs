//! The readers' unit tests: each format, each rule, each bad value.

use std::time::UNIX_EPOCH;

use http::Response;

use super::parse::{
    ABSURD, EMPTY, MALFORMED, NEGATIVE, NO_PARAMS, NO_REMAINING, NO_RESET, NOT_A_NAME, NOT_TEXT,
    OVERFLOWS, PAST, TOO_LONG, TOO_MANY,
};
use super::*;

/// 2024-05-01T12:00:00Z, when every answer of these tests is read.
const NOW_SECS: u64 = 1_714_564_800;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// An answer with `status` and `headers` (each value any bytes a header
/// value can hold).
fn answer(status: u16, headers: &[(&str, &[u8])]) -> Response<()> {
    let mut response = Response::builder().status(status).body(()).unwrap();
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        let value = HeaderValue::from_bytes(value).unwrap();
        response.headers_mut().append(name, value);
    }
    response
}

/// What the standard reader makes of `status` and `headers`, at [`now`].
fn read(status: u16, headers: &[(&str, &str)]) -> (Word, Option<Ignored>) {
    let bytes: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    read_bytes(status, &bytes)
}

fn read_bytes(status: u16, headers: &[(&str, &[u8])]) -> (Word, Option<Ignored>) {
    let answer = answer(status, headers);
    Reader::standard().read(&ResponseHead::new(&answer), now())
}

fn remaining(left: u64, reset: Duration) -> Option<Remaining> {
    Some(Remaining { left, reset })
}

fn ignored(header: &'static str, why: &'static str) -> Option<Ignored> {
    Some(Ignored { header, why })
}

fn signal(closed_for: Option<Duration>, remaining: Option<Remaining>) -> Signal {
    Signal {
        closed_for,
        remaining,
    }
}

// Retry-After.

#[test]
fn retry_after_on_429_closes_both_units_when_no_unit_says_zero() {
    let (word, ignored) = read(429, &[("retry-after", "3")]);
    assert_eq!(word.requests, signal(Some(secs(3)), None));
    assert_eq!(word.tokens, signal(Some(secs(3)), None));
    assert_eq!(ignored, None);
}

#[test]
fn retry_after_on_503_closes_too() {
    let (word, ignored) = read(503, &[("retry-after", "120")]);
    assert_eq!(word.requests.closed_for, Some(secs(120)));
    assert_eq!(word.tokens.closed_for, Some(secs(120)));
    assert_eq!(ignored, None);
}

#[test]
fn retry_after_is_read_on_429_and_503_only() {
    for status in [200, 201, 301, 400, 500, 502, 504] {
        let (word, ignored) = read(status, &[("retry-after", "3")]);
        assert!(word.is_silent(), "{status}");
        assert_eq!(ignored, None, "{status}: not read, so not ignored");
    }
}

#[test]
fn retry_after_closes_only_the_units_that_say_zero() {
    let (word, _) = read(
        429,
        &[
            ("retry-after", "7"),
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "30s"),
        ],
    );
    assert_eq!(word.requests, signal(None, remaining(12, secs(20))));
    assert_eq!(word.tokens, signal(Some(secs(7)), remaining(0, secs(30))));

    // Both say zero: both are closed for the Retry-After.
    let (word, _) = read(
        429,
        &[
            ("retry-after", "7"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "30s"),
        ],
    );
    assert_eq!(word.requests.closed_for, Some(secs(7)));
    assert_eq!(word.tokens.closed_for, Some(secs(7)));
}

#[test]
fn retry_after_http_dates_in_each_form() {
    let cases = [
        (
            "IMF-fixdate",
            "Wed, 01 May 2024 12:00:30 GMT",
            Some(secs(30)),
        ),
        (
            "RFC 850",
            "Wednesday, 01-May-24 12:01:00 GMT",
            Some(secs(60)),
        ),
        ("asctime", "Wed May  1 12:00:05 2024", Some(secs(5))),
    ];
    for (case, date, closed) in cases {
        let (word, ignored) = read(429, &[("retry-after", date)]);
        assert_eq!(word.requests.closed_for, closed, "{case}");
        assert_eq!(word.tokens.closed_for, closed, "{case}");
        assert_eq!(ignored, None, "{case}");
    }
}

#[test]
fn retry_after_bad_values_close_nothing_and_are_reported() {
    let cases: &[(&str, &[u8], &str)] = &[
        ("a date in the past", b"Wed, 01 May 2024 11:59:59 GMT", PAST),
        ("a date that is now", b"Wed, 01 May 2024 12:00:00 GMT", PAST),
        ("a date in 1994", b"Sun, 06 Nov 1994 08:49:37 GMT", PAST),
        ("negative (Azure)", b"-1", NEGATIVE),
        ("a fraction", b"1.5", MALFORMED),
        ("a plus sign", b"+3", MALFORMED),
        ("words", b"soon", MALFORMED),
        ("a bad date", b"Wed, 32 May 2024 12:00:30 GMT", MALFORMED),
        ("empty", b"", EMPTY),
        ("blank", b"  \t ", EMPTY),
        ("not UTF-8", b"\xff\xfe3", NOT_TEXT),
        ("Latin-1 text", b"3 s\xe9c", NOT_TEXT),
        ("too large to count", b"18446744073709551616", OVERFLOWS),
        ("absurd: past an hour", b"3601", ABSURD),
        ("absurd: u64::MAX seconds", b"18446744073709551615", ABSURD),
        (
            "absurd: a date next year",
            b"Thu, 01 May 2025 12:00:00 GMT",
            ABSURD,
        ),
        ("too long", &[b'1'; 65], TOO_LONG),
    ];
    for (case, value, why) in cases {
        let (word, got) = read_bytes(429, &[("retry-after", value)]);
        assert!(word.is_silent(), "{case}: {word:?}");
        assert_eq!(got, ignored("retry-after", why), "{case}");
    }
}

#[test]
fn retry_after_at_the_bounds() {
    let (word, ignored) = read(429, &[("retry-after", "3600")]);
    assert_eq!(
        word.requests.closed_for,
        Some(secs(3600)),
        "an hour is not absurd"
    );
    assert_eq!(ignored, None);
    let (word, ignored) = read(429, &[("retry-after", " 5 ")]);
    assert_eq!(word.requests.closed_for, Some(secs(5)), "spaces around it");
    assert_eq!(ignored, None);
}

#[test]
fn retry_after_zero_closes_nothing_and_is_no_error() {
    let (word, ignored) = read(429, &[("retry-after", "0")]);
    assert!(word.is_silent());
    assert_eq!(ignored, None);
    // Nothing from the Retry-After: a unit that says 0 closes until its reset.
    let (word, _) = read(
        429,
        &[
            ("retry-after", "0"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "2s"),
        ],
    );
    assert_eq!(word.requests.closed_for, Some(secs(2)));
    assert_eq!(word.tokens.closed_for, None);
}

#[test]
fn a_429_without_headers_closes_nothing() {
    let (word, ignored) = read(429, &[]);
    assert!(word.is_silent());
    assert_eq!(ignored, None);
    // Nor with headers that are not about rate limits.
    let (word, ignored) = read(
        429,
        &[
            ("content-type", "application/json"),
            ("x-request-id", "abc"),
            ("age", "3"),
        ],
    );
    assert!(word.is_silent());
    assert_eq!(ignored, None);
}

#[test]
fn a_429_with_only_bad_values_closes_nothing() {
    let (word, ignored) = read(
        429,
        &[
            ("retry-after", "later"),
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-reset-requests", "-1"),
        ],
    );
    assert!(word.is_silent(), "no wait is invented: {word:?}");
    assert_eq!(
        ignored,
        Some(Ignored {
            header: "retry-after",
            why: MALFORMED
        })
    );
}

// OpenAI.

#[test]
fn openai_durations() {
    let cases = [
        ("6m0s", secs(360)),
        ("1s", secs(1)),
        ("120ms", ms(120)),
        ("1h2m3.5s", ms(3_723_500)),
        ("0.5s", ms(500)),
        (".5s", ms(500)),
        ("1.s", secs(1)),
        ("2m59.56s", ms(179_560)),
        ("0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("17ms", ms(17)),
        ("1500us", Duration::from_micros(1500)),
        ("250ns", Duration::from_nanos(250)),
        ("1h", secs(3600)),
        ("59m60s", secs(3600)),
        ("1.0000000001s", secs(1)),
        ("0.123456789123s", Duration::from_nanos(123_456_789)),
    ];
    // Two hours, for `1h2m3.5s`.
    let reader = Reader::standard().max_signal(Window::new(secs(7200)).unwrap());
    for (text, want) in cases {
        let answer = answer(
            200,
            &[
                ("x-ratelimit-remaining-requests", b"5"),
                ("x-ratelimit-reset-requests", text.as_bytes()),
            ],
        );
        let (word, ignored) = reader.read(&ResponseHead::new(&answer), now());
        assert_eq!(word.requests.remaining, remaining(5, want), "{text}");
        assert_eq!(ignored, None, "{text}");
    }
}

#[test]
fn openai_bad_durations_are_ignored() {
    let mut overflow = String::from("1");
    overflow.push_str(&"0".repeat(40));
    overflow.push('s');
    let cases: &[(&str, &[u8], &str)] = &[
        ("no unit", b"5", MALFORMED),
        ("only a unit", b"s", MALFORMED),
        ("an unknown unit", b"5d", MALFORMED),
        ("a trailing number", b"1s2", MALFORMED),
        ("a space inside", b"1 s", MALFORMED),
        ("an exponent", b"1e3s", MALFORMED),
        ("a dot alone", b".s", MALFORMED),
        ("upper case", b"1S", MALFORMED),
        ("negative", b"-1s", NEGATIVE),
        ("negative zero", b"-0", NEGATIVE),
        ("a plus sign", b"+1s", MALFORMED),
        ("overflows", overflow.as_bytes(), OVERFLOWS),
        ("absurd: above an hour", b"1h0m0.001s", ABSURD),
        (
            "absurd: u64::MAX + 1 seconds",
            b"18446744073709551616s",
            ABSURD,
        ),
        ("not UTF-8", b"1\xc3\x28s", NOT_TEXT),
        ("micro sign", "1µs".as_bytes(), NOT_TEXT),
        ("empty", b"", EMPTY),
        ("too long", &[b'1'; 70], TOO_LONG),
    ];
    for (case, value, why) in cases {
        let (word, got) = read_bytes(
            200,
            &[
                ("x-ratelimit-remaining-tokens", b"0"),
                ("x-ratelimit-reset-tokens", value),
            ],
        );
        assert!(word.is_silent(), "{case}: {word:?}");
        assert_eq!(got, ignored("x-ratelimit-reset-tokens", why), "{case}");
    }
}

#[test]
fn counts_and_their_bad_values() {
    let good = [
        ("0", 0),
        ("42", 42),
        ("007", 7),
        ("18446744073709551615", u64::MAX),
    ];
    for (text, want) in good {
        let (word, ignored) = read(
            200,
            &[
                ("x-ratelimit-remaining-requests", text),
                ("x-ratelimit-reset-requests", "1s"),
            ],
        );
        assert_eq!(word.requests.remaining, remaining(want, secs(1)), "{text}");
        assert_eq!(ignored, None, "{text}");
    }
    let bad: &[(&str, &[u8], &str)] = &[
        ("Azure's -1", b"-1", NEGATIVE),
        ("negative zero", b"-0", NEGATIVE),
        ("overflows", b"18446744073709551616", OVERFLOWS),
        ("a fraction", b"1.0", MALFORMED),
        ("a plus sign", b"+1", MALFORMED),
        ("a minus alone", b"-", MALFORMED),
        ("words", b"many", MALFORMED),
        ("a space inside", b"1 000", MALFORMED),
        ("empty", b"", EMPTY),
        ("not UTF-8", b"\x80\x81", NOT_TEXT),
        ("too long", &[b'9'; 65], TOO_LONG),
    ];
    for (case, value, why) in bad {
        let (word, got) = read_bytes(
            200,
            &[
                ("x-ratelimit-remaining-requests", value),
                ("x-ratelimit-reset-requests", b"1s"),
            ],
        );
        assert!(word.is_silent(), "{case}");
        assert_eq!(
            got,
            ignored("x-ratelimit-remaining-requests", why),
            "{case}"
        );
    }
}

#[test]
fn a_remaining_above_any_limit_is_reported_as_sent() {
    let (word, ignored) = read(
        200,
        &[
            ("x-ratelimit-remaining-requests", "1000000000"),
            ("x-ratelimit-reset-requests", "1s"),
        ],
    );
    assert_eq!(
        word.requests,
        signal(None, remaining(1_000_000_000, secs(1)))
    );
    assert_eq!(ignored, None);
}

#[test]
fn a_remaining_of_zero_closes_its_unit_until_the_reset() {
    let (word, ignored) = read(
        200,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-remaining-tokens", "1500"),
            ("x-ratelimit-reset-tokens", "2s"),
        ],
    );
    assert_eq!(
        word.requests,
        signal(Some(secs(360)), remaining(0, secs(360)))
    );
    assert_eq!(word.tokens, signal(None, remaining(1500, secs(2))));
    assert_eq!(ignored, None);
    // On a 429 without Retry-After, the same.
    let (word, _) = read(
        429,
        &[
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "250ms"),
        ],
    );
    assert_eq!(word.tokens.closed_for, Some(ms(250)));
    assert_eq!(word.requests.closed_for, None);
}

#[test]
fn a_remaining_of_zero_that_resets_now_closes_nothing() {
    let (word, ignored) = read(
        429,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "0s"),
        ],
    );
    assert_eq!(word.requests, signal(None, remaining(0, Duration::ZERO)));
    assert_eq!(ignored, None);
}

#[test]
fn half_a_pair_is_ignored() {
    let (word, got) = read(200, &[("x-ratelimit-remaining-requests", "0")]);
    assert!(word.is_silent());
    assert_eq!(got, ignored("x-ratelimit-remaining-requests", NO_RESET));
    let (word, got) = read(
        200,
        &[("anthropic-ratelimit-tokens-reset", "2024-05-01T12:00:30Z")],
    );
    assert!(word.is_silent());
    assert_eq!(
        got,
        ignored("anthropic-ratelimit-tokens-reset", NO_REMAINING)
    );
}

#[test]
fn a_header_s_first_value_is_read() {
    let (word, ignored) = read(
        429,
        &[
            ("retry-after", "4"),
            ("retry-after", "400"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
        ],
    );
    assert_eq!(word.requests, signal(Some(secs(4)), remaining(3, secs(1))));
    assert_eq!(ignored, None);
}

// Anthropic.

#[test]
fn anthropic_times() {
    let cases = [
        ("UTC", "2024-05-01T12:00:30Z", secs(30)),
        ("lower case", "2024-05-01t12:00:30z", secs(30)),
        ("a space", "2024-05-01 12:00:30Z", secs(30)),
        ("an offset east", "2024-05-01T14:00:30+02:00", secs(30)),
        ("an offset west", "2024-05-01T11:30:30-00:30", secs(30)),
        ("a zero offset", "2024-05-01T12:00:30+00:00", secs(30)),
        ("a fraction", "2024-05-01T12:00:30.5Z", ms(30_500)),
        (
            "nanoseconds and more",
            "2024-05-01T12:00:00.0000000019Z",
            Duration::from_nanos(1),
        ),
        ("a leap second", "2024-05-01T12:00:60Z", secs(60)),
        ("across midnight", "2024-05-02T01:00:00+12:00", secs(3600)),
        ("the hour", "2024-05-01T13:00:00Z", secs(3600)),
    ];
    for (case, time, want) in cases {
        let (word, ignored) = read(
            200,
            &[
                ("anthropic-ratelimit-requests-remaining", "9"),
                ("anthropic-ratelimit-requests-reset", time),
            ],
        );
        assert_eq!(word.requests.remaining, remaining(9, want), "{case}");
        assert_eq!(ignored, None, "{case}");
    }
}

#[test]
fn anthropic_bad_times_are_ignored() {
    let cases: &[(&str, &[u8], &str)] = &[
        ("in the past", b"2024-05-01T11:59:59Z", PAST),
        ("now", b"2024-05-01T12:00:00Z", PAST),
        ("before 1970", b"1969-12-31T23:59:59Z", PAST),
        ("year 0", b"0000-01-01T00:00:00Z", PAST),
        (
            "absurd: an hour and a second",
            b"2024-05-01T13:00:01Z",
            ABSURD,
        ),
        ("absurd: year 9999", b"9999-12-31T23:59:60-23:59", ABSURD),
        ("month 13", b"2024-13-01T12:00:30Z", MALFORMED),
        ("month 0", b"2024-00-01T12:00:30Z", MALFORMED),
        ("April 31", b"2024-04-31T12:00:30Z", MALFORMED),
        ("February 29, 2023", b"2023-02-29T12:00:30Z", MALFORMED),
        ("February 29, 2100", b"2100-02-29T12:00:30Z", MALFORMED),
        ("hour 24", b"2024-05-01T24:00:00Z", MALFORMED),
        ("minute 60", b"2024-05-01T12:60:00Z", MALFORMED),
        ("second 61", b"2024-05-01T12:00:61Z", MALFORMED),
        ("offset 24:00", b"2024-05-01T12:00:30+24:00", MALFORMED),
        (
            "offset without a colon",
            b"2024-05-01T12:00:30+0200",
            MALFORMED,
        ),
        ("no zone", b"2024-05-01T12:00:30", MALFORMED),
        ("a date alone", b"2024-05-01", MALFORMED),
        ("a dot without digits", b"2024-05-01T12:00:30.Z", MALFORMED),
        ("a sign in a field", b"2024-+5-01T12:00:30Z", MALFORMED),
        ("seconds, not a time", b"30", MALFORMED),
        ("a duration", b"30s", MALFORMED),
        ("trailing bytes", b"2024-05-01T12:00:30Zx", MALFORMED),
        ("not UTF-8", b"2024-05-01T12:00:30\xffZ", NOT_TEXT),
        ("empty", b"", EMPTY),
    ];
    for (case, value, why) in cases {
        let (word, got) = read_bytes(
            200,
            &[
                ("anthropic-ratelimit-requests-remaining", b"0"),
                ("anthropic-ratelimit-requests-reset", value),
            ],
        );
        assert!(word.is_silent(), "{case}: {word:?}");
        assert_eq!(
            got,
            ignored("anthropic-ratelimit-requests-reset", why),
            "{case}"
        );
    }
}

#[test]
fn february_29_of_a_leap_year_is_a_day() {
    let now = UNIX_EPOCH + Duration::from_secs(1_709_164_800); // 2024-02-29T00:00:00Z
    let answer = answer(
        200,
        &[
            ("anthropic-ratelimit-requests-remaining", b"1"),
            (
                "anthropic-ratelimit-requests-reset",
                b"2024-02-29T00:10:00Z",
            ),
        ],
    );
    let (word, ignored) = Reader::standard().read(&ResponseHead::new(&answer), now);
    assert_eq!(word.requests.remaining, remaining(1, secs(600)));
    assert_eq!(ignored, None);
}

#[test]
fn anthropic_token_budgets_fold_into_tokens_at_the_smallest() {
    let (word, ignored) = read(
        200,
        &[
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:01Z"),
            ("anthropic-ratelimit-tokens-remaining", "5000"),
            ("anthropic-ratelimit-tokens-reset", "2024-05-01T12:00:10Z"),
            ("anthropic-ratelimit-input-tokens-remaining", "300"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2024-05-01T12:00:20Z",
            ),
            ("anthropic-ratelimit-output-tokens-remaining", "900"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2024-05-01T12:00:30Z",
            ),
        ],
    );
    assert_eq!(word.requests, signal(None, remaining(49, secs(1))));
    assert_eq!(word.tokens, signal(None, remaining(300, secs(20))));
    assert_eq!(ignored, None);

    // Output tokens spent: tokens close until their reset; requests do not.
    let (word, _) = read(
        200,
        &[
            ("anthropic-ratelimit-tokens-remaining", "5000"),
            ("anthropic-ratelimit-tokens-reset", "2024-05-01T12:00:10Z"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2024-05-01T12:00:45Z",
            ),
        ],
    );
    assert_eq!(word.tokens, signal(Some(secs(45)), remaining(0, secs(45))));
    assert!(word.requests.is_silent());
}

#[test]
fn of_two_equal_remainings_the_later_reset_is_kept() {
    let (word, _) = read(
        200,
        &[
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2024-05-01T12:00:20Z",
            ),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2024-05-01T12:00:50Z",
            ),
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2024-05-01T12:00:30Z"),
        ],
    );
    assert_eq!(word.tokens, signal(Some(secs(50)), remaining(0, secs(50))));
}

#[test]
fn the_formats_together_give_the_smallest_remaining() {
    let (word, ignored) = read(
        200,
        &[
            ("x-ratelimit-remaining-requests", "10"),
            ("x-ratelimit-reset-requests", "10s"),
            ("anthropic-ratelimit-requests-remaining", "3"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:05Z"),
            ("ratelimit", "\"api\";r=7;t=2"),
        ],
    );
    assert_eq!(word.requests.remaining, remaining(3, secs(5)));
    assert_eq!(ignored, None);
}

// IETF.

#[test]
fn ietf_items_as_the_server_layer_writes_them() {
    let (word, ignored) = read(
        200,
        &[
            ("ratelimit", "\"api\";r=0;t=10"),
            ("ratelimit-policy", "\"api\";q=2;w=10"),
        ],
    );
    assert_eq!(
        word.requests,
        signal(Some(secs(10)), remaining(0, secs(10)))
    );
    assert!(word.tokens.is_silent());
    assert_eq!(ignored, None);
}

#[test]
fn ietf_the_most_restrictive_item_of_each_unit() {
    let (word, ignored) = read(
        200,
        &[
            ("ratelimit", "\"minute\";r=50;t=30, \"day\";r=4;t=3000"),
            ("ratelimit", "\"burst\";r=9;t=1"),
            (
                "ratelimit-policy",
                "\"minute\";q=100;w=60, \"day\";q=1000;w=86400",
            ),
        ],
    );
    assert_eq!(word.requests.remaining, remaining(4, secs(3000)));
    assert_eq!(ignored, None);
}

#[test]
fn ietf_a_policy_in_tokens_counts_as_tokens() {
    let (word, ignored) = read(
        200,
        &[
            ("ratelimit", "\"tok\";r=0;t=60, \"req\";r=5;t=10"),
            ("ratelimit-policy", "\"tok\";q=10000;w=60;qu=\"tokens\""),
            ("ratelimit-policy", "\"req\";q=10;w=10;qu=\"requests\""),
        ],
    );
    assert_eq!(word.tokens, signal(Some(secs(60)), remaining(0, secs(60))));
    assert_eq!(word.requests, signal(None, remaining(5, secs(10))));
    assert_eq!(ignored, None);
    // A policy in another unit is not a budget of calls or tokens.
    let (word, ignored) = read(
        200,
        &[
            ("ratelimit", "\"bytes\";r=0;t=60"),
            (
                "ratelimit-policy",
                "\"bytes\";q=100000;w=60;qu=\"content-bytes\"",
            ),
        ],
    );
    assert!(word.is_silent());
    assert_eq!(ignored, None);
}

#[test]
fn ietf_bad_items_are_ignored_and_the_rest_read() {
    let cases: &[(&str, &str, &str)] = &[
        ("negative r", "\"a\";r=-1;t=10", NEGATIVE),
        ("negative t", "\"a\";r=1;t=-10", NEGATIVE),
        ("r as a decimal", "\"a\";r=1.5;t=10", MALFORMED),
        ("t as a string", "\"a\";r=1;t=\"10\"", MALFORMED),
        ("no t", "\"a\";r=1", NO_PARAMS),
        ("no r", "\"a\";t=1", NO_PARAMS),
        ("a token for a name", "a;r=1;t=10", NOT_A_NAME),
        ("an inner list", "(\"a\" \"b\");r=1;t=10", NOT_A_NAME),
        ("absurd t", "\"a\";r=1;t=3601", ABSURD),
    ];
    for (case, bad, why) in cases {
        let line = format!("{bad}, \"b\";r=8;t=20");
        let (word, got) = read(200, &[("ratelimit", &line)]);
        assert_eq!(word.requests.remaining, remaining(8, secs(20)), "{case}");
        assert_eq!(got, ignored("ratelimit", why), "{case}");
    }
}

#[test]
fn ietf_a_line_that_does_not_parse_adds_nothing() {
    let bad: &[(&str, &[u8])] = &[
        (
            "the old dictionary form",
            b"limit=100, remaining=0, reset=5",
        ),
        ("unclosed string", b"\"a;r=0;t=5"),
        ("a trailing comma", b"\"a\";r=0;t=5,"),
        ("not UTF-8", b"\"a\xff\";r=0;t=5"),
        (
            "an integer too large for sfv",
            b"\"a\";r=0;t=10000000000000000",
        ),
    ];
    for (case, line) in bad {
        let (word, got) = read_bytes(200, &[("ratelimit", line), ("ratelimit", b"\"b\";r=3;t=4")]);
        assert_eq!(word.requests, signal(None, remaining(3, secs(4))), "{case}");
        assert_eq!(got, ignored("ratelimit", MALFORMED), "{case}");
    }
    let long = format!("\"a\";r=0;t=5{}", " ".repeat(1100));
    let (word, got) = read(200, &[("ratelimit", &long)]);
    assert!(word.is_silent());
    assert_eq!(got, ignored("ratelimit", TOO_LONG));
}

#[test]
fn ietf_a_policy_that_does_not_parse_leaves_the_units_unknown() {
    let (word, got) = read(
        200,
        &[
            ("ratelimit", "\"tok\";r=0;t=60"),
            ("ratelimit-policy", "\"tok\";qu=\"tokens\";;"),
        ],
    );
    assert!(word.is_silent(), "{word:?}");
    assert_eq!(got, ignored("ratelimit-policy", MALFORMED));
}

#[test]
fn ietf_items_past_the_bound_are_left_out() {
    // 16 items from 20 down to 5; the 17th, with the smallest r, is not read.
    let mut line: Vec<String> = (0..16)
        .map(|i| format!("\"p{i}\";r={};t=9", 20 - i))
        .collect();
    line.push("\"last\";r=0;t=9".to_owned());
    let (word, got) = read(200, &[("ratelimit", &line.join(", "))]);
    assert_eq!(word.requests, signal(None, remaining(5, secs(9))));
    assert_eq!(got, ignored("ratelimit", TOO_MANY));

    let lines: Vec<(&str, &str)> =
        std::iter::repeat_n(("ratelimit", "\"p\";r=1;t=9"), 17).collect();
    let (word, got) = read(200, &lines);
    assert_eq!(word.requests.remaining, remaining(1, secs(9)));
    assert_eq!(got, ignored("ratelimit", TOO_MANY));
}

#[test]
fn the_server_layer_s_own_denial_reads_back() {
    use crate::quota::Quota;
    use crate::server::layer::RateLimitLayer;
    use tower::ServiceExt;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let denied = runtime.block_on(async {
        let layer = RateLimitLayer::new("api", Quota::new(1, secs(20)).unwrap());
        let service =
            tower::ServiceBuilder::new()
                .layer(layer)
                .service_fn(|_: http::Request<()>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(()))
                });
        service
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .unwrap();
        service.oneshot(http::Request::new(())).await.unwrap()
    });
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let (word, ignored) = Reader::standard().read(&ResponseHead::new(&denied), SystemTime::now());
    assert_eq!(
        word.requests,
        signal(Some(secs(20)), remaining(0, secs(20)))
    );
    assert!(word.tokens.is_silent());
    assert_eq!(ignored, None);
}

// Every header, every bad byte.

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

#[test]
fn the_names_are_the_reader_s() {
    let mut read: Vec<&str> = vec![RETRY_AFTER, RATELIMIT, RATELIMIT_POLICY];
    read.extend(PAIRS.iter().flat_map(|pair| [pair.remaining, pair.reset]));
    read.sort_unstable();
    let mut names = NAMES.to_vec();
    names.sort_unstable();
    assert_eq!(read, names);
}

#[test]
fn a_value_that_is_not_text_changes_nothing_in_any_header() {
    for name in NAMES {
        // Each pair's header beside a good partner, so that only its own value is bad.
        let mut headers: Vec<(&str, &[u8])> = Vec::new();
        for pair in &PAIRS {
            let good_reset: &[u8] = match pair.written {
                Reset::After => b"1s",
                Reset::At => b"2024-05-01T12:00:30Z",
            };
            if name == RATELIMIT_POLICY {
                headers.push((RATELIMIT, b"\"p\";r=0;t=5"));
                break;
            }
            if name == pair.remaining {
                headers.push((pair.reset, good_reset));
            } else if name == pair.reset {
                headers.push((pair.remaining, b"0"));
            }
        }
        headers.push((name, b"\xff\xfe\x80"));
        let (word, got) = read_bytes(429, &headers);
        assert!(word.is_silent(), "{name}: {word:?}");
        let why = if name.starts_with("ratelimit") {
            MALFORMED
        } else {
            NOT_TEXT
        };
        assert_eq!(got, ignored(name, why), "{name}");
    }
}

#[test]
fn the_first_value_ignored_is_reported_in_the_table_s_order() {
    let (_, got) = read(
        429,
        &[
            ("ratelimit", "garbage;;"),
            ("anthropic-ratelimit-requests-remaining", "-1"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:30Z"),
            ("x-ratelimit-remaining-tokens", "1"),
            ("x-ratelimit-reset-tokens", "1d"),
            ("retry-after", "-5"),
        ],
    );
    assert_eq!(got, ignored("retry-after", NEGATIVE));
    let (_, got) = read(
        200,
        &[
            ("ratelimit", "garbage;;"),
            ("anthropic-ratelimit-requests-remaining", "-1"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:30Z"),
            ("x-ratelimit-remaining-tokens", "1"),
            ("x-ratelimit-reset-tokens", "1d"),
        ],
    );
    assert_eq!(got, ignored("x-ratelimit-reset-tokens", MALFORMED));
}

// The reader's settings.

#[test]
fn max_signal_bounds_every_value() {
    let five_minutes = Reader::standard().max_signal(Window::new(secs(300)).unwrap());
    let answer = answer(
        429,
        &[
            ("retry-after", b"301"),
            ("x-ratelimit-remaining-requests", b"0"),
            ("x-ratelimit-reset-requests", b"5m"),
            ("x-ratelimit-remaining-tokens", b"0"),
            ("x-ratelimit-reset-tokens", b"5m0.001s"),
        ],
    );
    let (word, got) = five_minutes.read(&ResponseHead::new(&answer), now());
    assert_eq!(got, ignored("retry-after", ABSURD));
    // No Retry-After: the requests close until their reset, at the bound.
    assert_eq!(
        word.requests,
        signal(Some(secs(300)), remaining(0, secs(300)))
    );
    assert!(word.tokens.is_silent());
}

#[test]
fn the_none_reader_reads_nothing() {
    let answer = answer(
        429,
        &[
            ("retry-after", b"5"),
            ("x-ratelimit-remaining-requests", b"-1"),
        ],
    );
    assert_eq!(
        Reader::none().read(&ResponseHead::new(&answer), now()),
        (Word::default(), None)
    );
}

#[test]
fn a_custom_reader_is_held_to_max_signal() {
    let reader = Reader::custom(|head: &ResponseHead<'_>| {
        let mut word = Word::default();
        if head.status() == StatusCode::TOO_MANY_REQUESTS {
            word.requests.closed_for = Some(secs(7200));
            word.tokens.closed_for = Some(Duration::ZERO);
            word.tokens.remaining = remaining(0, secs(30));
        } else {
            word.requests.remaining = remaining(3, secs(3601));
            word.tokens.closed_for = Some(secs(9));
        }
        word
    });
    let refused = answer(429, &[]);
    let (word, got) = reader.read(&ResponseHead::new(&refused), now());
    assert_eq!(word.requests, Signal::default());
    assert_eq!(
        word.tokens,
        signal(None, remaining(0, secs(30))),
        "a zero close is dropped"
    );
    assert_eq!(got, ignored("custom", ABSURD));
    let ok = answer(200, &[]);
    let (word, got) = reader.read(&ResponseHead::new(&ok), now());
    assert_eq!(word.requests, Signal::default());
    assert_eq!(word.tokens, signal(Some(secs(9)), None));
    assert_eq!(got, ignored("custom", ABSURD));
}

#[test]
fn the_reader_s_traits_and_debug() {
    fn shared<T: Clone + fmt::Debug + Send + Sync + 'static>() {}
    shared::<Reader>();
    shared::<Word>();
    shared::<Ignored>();
    assert_eq!(
        format!("{:?}", Reader::default()),
        "Reader { reads: \"standard\", max_signal: 3600s }"
    );
    assert_eq!(
        format!(
            "{:?}",
            Reader::custom(|_: &ResponseHead<'_>| Word::default())
        ),
        "Reader { reads: \"custom\", max_signal: 3600s }"
    );
    let ignored = Ignored {
        header: "retry-after",
        why: NEGATIVE,
    };
    assert_eq!(ignored.to_string(), "retry-after: negative");
}

#[test]
fn word_of_each_unit() {
    let mut word = Word::default();
    assert!(word.is_silent());
    word.tokens.remaining = remaining(1, secs(1));
    assert!(!word.is_silent());
    assert!(word.of(Unit::Requests).is_silent());
    assert_eq!(word.of(Unit::Tokens).remaining, remaining(1, secs(1)));
}

// Properties.

/// The calendar of the standard library's neighbour, httpdate, agrees with
/// the RFC 3339 reader's: a time written as an HTTP date and as RFC 3339
/// reads back to the same instant.
fn rfc3339_of(at: SystemTime) -> String {
    let date = httpdate::fmt_http_date(at); // "Wed, 01 May 2024 12:00:30 GMT"
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == &date[8..11])
    .unwrap()
        + 1;
    format!(
        "{}-{month:02}-{}T{}Z",
        &date[12..16],
        &date[5..7],
        &date[17..25]
    )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 3000, ..Default::default() })]

    #[test]
    fn any_bytes_in_any_header_never_panic_nor_pass_max_signal(
        status in proptest::prop_oneof![
            proptest::strategy::Just(429u16),
            proptest::strategy::Just(503u16),
            proptest::strategy::Just(200u16),
            100u16..1000,
        ],
        max_ms in 1u64..=7_200_000,
        headers in proptest::collection::vec(
            (0..NAMES.len(), proptest::collection::vec(proptest::num::u8::ANY, 0..80)),
            0..8,
        ),
        near in proptest::collection::vec((0..NAMES.len(), 0usize..6, 0u64..8000), 0..6),
    ) {
        // Arbitrary bytes, and values close to the formats' own.
        let mut values: Vec<(&str, Vec<u8>)> = headers
            .into_iter()
            .filter(|(_, value)| HeaderValue::from_bytes(value).is_ok())
            .map(|(name, value)| (NAMES[name], value))
            .collect();
        for (name, form, n) in near {
            let at = now() + secs(n) - secs(1000);
            let value = match form {
                0 => n.to_string(),
                1 => format!("{}m{}.{}s", n / 60, n % 60, n % 7),
                2 => rfc3339_of(at),
                3 => httpdate::fmt_http_date(at),
                4 => format!("\"p{}\";r={};t={}", n % 3, n % 2, n),
                _ => format!("\"p{}\";q=5;w=5;qu=\"tokens\"", n % 3),
            };
            values.push((NAMES[name], value.into_bytes()));
        }
        let pairs: Vec<(&str, &[u8])> = values.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let answer = answer(status, &pairs);
        let max = ms(max_ms);
        let reader = Reader::standard().max_signal(Window::new(max).unwrap());
        let (word, got) = reader.read(&ResponseHead::new(&answer), now());
        let refused = matches!(status, 429 | 503)
            && answer.headers().contains_key("retry-after");
        for signal in [word.requests, word.tokens] {
            if let Some(closed) = signal.closed_for {
                proptest::prop_assert!(closed <= max && !closed.is_zero(), "{word:?}");
                // No wait is invented: it is the Retry-After's, or a spent unit's reset.
                let reset = signal.remaining.filter(|r| r.left == 0).map(|r| r.reset);
                proptest::prop_assert!(refused || reset == Some(closed), "{word:?}");
            }
            if let Some(remaining) = signal.remaining {
                proptest::prop_assert!(remaining.reset <= max, "{word:?}");
            }
        }
        if let Some(got) = got {
            proptest::prop_assert!(answer.headers().contains_key(got.header), "{got:?}");
        }
        if pairs.is_empty() {
            proptest::prop_assert!(word.is_silent() && got.is_none());
        }
        // The same answer reads the same.
        proptest::prop_assert_eq!(reader.read(&ResponseHead::new(&answer), now()), (word, got));
    }

    #[test]
    fn rfc3339_agrees_with_http_dates(secs_since_epoch in 0u64..253_402_214_400, offset_min in 0u32..(24 * 60)) {
        let at = UNIX_EPOCH + secs(secs_since_epoch);
        let text = rfc3339_of(at);
        proptest::prop_assert_eq!(parse::rfc3339(&text), Ok(at), "{}", text);
        // The same instant, written with an offset east of UTC.
        let east = at + Duration::from_secs(u64::from(offset_min) * 60);
        let text = format!(
            "{}+{:02}:{:02}",
            rfc3339_of(east).trim_end_matches('Z'),
            offset_min / 60,
            offset_min % 60,
        );
        proptest::prop_assert_eq!(parse::rfc3339(&text), Ok(at), "{}", text);
    }

    #[test]
    fn go_durations_read_their_parts(h in 0u64..2, m in 0u64..60, s in 0u64..60, frac in 0u64..1000) {
        let text = format!("{h}h{m}m{s}.{frac:03}s");
        let want = secs(h * 3600 + m * 60 + s) + ms(frac);
        let got = parse::go_duration(&text, secs(7200));
        proptest::prop_assert_eq!(got, Ok(want), "{}", text);
        let text = format!("{}ms", want.as_millis());
        proptest::prop_assert_eq!(parse::go_duration(&text, secs(7200)), Ok(want), "{}", text);
    }
}
