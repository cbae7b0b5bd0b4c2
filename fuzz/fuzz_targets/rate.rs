//! Rate strings (`"100/min"`, `"5 per 15m"`) and windows (`"15m"`), through
//! `FromStr`, serde (a JSON string, as configuration holds it) and the
//! numeric `Window` constructors.
//!
//! Checked: no panic; what parses is in bounds and prints as a rate string
//! that parses back to the same value; serde accepts exactly what `FromStr`
//! accepts; an error's message is built without panicking.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tower_pinned_window::{ConfigError, Quota, Window};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    let quota = text.parse::<Quota>();
    match &quota {
        Ok(quota) => {
            assert!(quota.limit() >= 1, "{text:?}: a zero limit");
            check_window(text, quota.window());
            let printed = quota.to_string();
            assert_eq!(
                printed.parse::<Quota>().as_ref(),
                Ok(quota),
                "{text:?} printed {printed:?}"
            );
        }
        Err(err) => {
            assert!(
                matches!(&err, ConfigError::InvalidRate { input, .. } if input == text),
                "{text:?}: {err:?}"
            );
            let _ = err.to_string();
        }
    }
    // serde reads the same grammar.
    let json = serde_json::to_string(text).expect("a string serialises");
    let from_serde = serde_json::from_str::<Quota>(&json);
    match (&quota, &from_serde) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "{text:?}");
            let back = serde_json::to_string(b).expect("a quota serialises");
            assert_eq!(serde_json::from_str::<Quota>(&back).ok().as_ref(), Some(a));
        }
        (Err(_), Err(err)) => {
            let _ = err.to_string();
        }
        _ => panic!("{text:?}: FromStr {quota:?} but serde {from_serde:?}"),
    }

    match text.parse::<Window>() {
        Ok(window) => check_window(text, window),
        Err(err) => {
            assert!(
                matches!(&err, ConfigError::InvalidRate { input, .. } if input == text),
                "{text:?}: {err:?}"
            );
            let _ = err.to_string();
        }
    }

    // The numeric constructors, on the same text read as a number.
    if let Ok(millis) = text.trim().parse::<i64>() {
        match Window::try_from_millis(millis) {
            Ok(window) => {
                assert_eq!(i64::try_from(window.as_millis()), Ok(millis));
                check_window(text, window);
            }
            Err(_) => assert!(millis <= 0 || millis as u64 > Window::MAX.as_millis()),
        }
    }
    if let Ok(secs) = text.trim().parse::<f64>()
        && let Ok(window) = Window::try_from_secs_f64(secs)
    {
        assert!(secs > 0.0, "{secs}: a window from a non-positive number");
        // Rounded up to the millisecond, never down, from the nanoseconds
        // a `Duration` holds (fuzz/regressions/rate/: a fraction of a
        // nanosecond over a whole second is not a fractional millisecond).
        let nanos = Duration::try_from_secs_f64(secs).expect("in range");
        assert!(window.as_duration() >= nanos, "{secs} -> {window:?}");
        check_window(text, window);
    }
    if let Ok(nanos) = text.trim().parse::<u64>()
        && let Ok(window) = Window::new(Duration::from_nanos(nanos))
    {
        assert!(
            window.as_duration() >= Duration::from_nanos(nanos),
            "rounded down"
        );
        check_window(text, window);
    }
});

/// In bounds, and prints as a window that parses back to itself.
fn check_window(text: &str, window: Window) {
    assert!(window.as_millis() >= 1, "{text:?}: an empty window");
    assert!(window <= Window::MAX, "{text:?}: past Window::MAX");
    let printed = window.to_string();
    assert_eq!(
        printed.parse::<Window>(),
        Ok(window),
        "{text:?} printed {printed:?}"
    );
}
