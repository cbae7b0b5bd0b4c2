//! The quota's unit tests.

use super::*;

#[test]
fn windows_round_up_and_stay_within_one_bound() {
    let max = Window::MAX.as_millis();
    let too_long = Err(ConfigError::WindowTooLong);
    let non_positive = Err(ConfigError::NonPositiveWindow);
    let ms = |ms: u64| Ok(ms);
    type Case = (
        &'static str,
        Result<Window, ConfigError>,
        Result<u64, ConfigError>,
    );
    let cases: &[Case] = &[
        ("zero", Window::new(Duration::ZERO), non_positive.clone()),
        ("1 ns", Window::new(Duration::from_nanos(1)), ms(1)),
        ("0.4 ms", Window::new(Duration::from_micros(400)), ms(1)),
        (
            "1.0000001 ms",
            Window::new(Duration::from_nanos(1_000_001)),
            ms(2),
        ),
        (
            "exact 15 min",
            Window::new(Duration::from_secs(900)),
            ms(900_000),
        ),
        (
            "exactly MAX",
            Window::new(Window::MAX.as_duration()),
            ms(max),
        ),
        (
            "MAX and 1 ns",
            Window::new(Window::MAX.as_duration() + Duration::from_nanos(1)),
            too_long.clone(),
        ),
        (
            "Duration::MAX",
            Window::new(Duration::MAX),
            too_long.clone(),
        ),
        ("millis 0", Window::try_from_millis(0), non_positive.clone()),
        (
            "millis -5",
            Window::try_from_millis(-5),
            non_positive.clone(),
        ),
        (
            "millis i64::MIN",
            Window::try_from_millis(i64::MIN),
            non_positive.clone(),
        ),
        ("millis 7", Window::try_from_millis(7), ms(7)),
        ("millis MAX", Window::try_from_millis(max as i64), ms(max)),
        (
            "millis MAX + 1",
            Window::try_from_millis(max as i64 + 1),
            too_long.clone(),
        ),
        (
            "millis 2^53",
            Window::try_from_millis(1 << 53),
            too_long.clone(),
        ),
        (
            "millis i64::MAX",
            Window::try_from_millis(i64::MAX),
            too_long.clone(),
        ),
        (
            "secs 0",
            Window::try_from_secs_f64(0.0),
            non_positive.clone(),
        ),
        (
            "secs -0",
            Window::try_from_secs_f64(-0.0),
            non_positive.clone(),
        ),
        (
            "secs -1.0",
            Window::try_from_secs_f64(-1.0),
            non_positive.clone(),
        ),
        (
            "secs NaN",
            Window::try_from_secs_f64(f64::NAN),
            non_positive.clone(),
        ),
        (
            "secs -inf",
            Window::try_from_secs_f64(f64::NEG_INFINITY),
            non_positive.clone(),
        ),
        ("secs 1e-10", Window::try_from_secs_f64(1e-10), ms(1)),
        (
            "secs smallest positive",
            Window::try_from_secs_f64(f64::from_bits(1)),
            ms(1),
        ),
        ("secs 0.0004", Window::try_from_secs_f64(0.0004), ms(1)),
        ("secs 1.1", Window::try_from_secs_f64(1.1), ms(1100)),
        (
            "secs MAX",
            Window::try_from_secs_f64(max as f64 / 1000.0),
            ms(max),
        ),
        (
            "secs MAX + 1",
            Window::try_from_secs_f64(max as f64 / 1000.0 + 1.0),
            too_long.clone(),
        ),
        (
            "secs inf",
            Window::try_from_secs_f64(f64::INFINITY),
            too_long.clone(),
        ),
        (
            "secs 1e300",
            Window::try_from_secs_f64(1e300),
            too_long.clone(),
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(&got.clone().map(Window::as_millis), want, "{name}");
    }
}

#[test]
fn every_constructor_keeps_the_bound() {
    assert_eq!(Window::MAX.as_millis(), 36_525 * 24 * 3_600_000);
    // Within every backend's exact range.
    assert!(Window::MAX.as_millis() < 1 << 53, "Lua doubles");
    assert!(
        Window::MAX
            .as_millis()
            .checked_mul(1_000_000)
            .is_some_and(|ns| ns < u64::MAX / 5),
        "the memory backend's nanoseconds, with centuries of uptime to spare"
    );
    assert_eq!(
        Quota::new(1, Window::MAX.as_duration() + Duration::from_millis(1)),
        Err(ConfigError::WindowTooLong)
    );
    assert_eq!(
        Quota::new(1, Window::MAX.as_duration()).map(|q| q.window()),
        Ok(Window::MAX)
    );
    let one = NonZeroU32::MIN;
    for quota in [
        Quota::per_second(one),
        Quota::per_minute(one),
        Quota::per_hour(one),
        Quota::per_day(one),
    ] {
        assert!(quota.window() <= Window::MAX);
        assert_eq!(
            Window::new(quota.window().as_duration()),
            Ok(quota.window())
        );
    }
    assert!(
        ConfigError::WindowTooLong
            .to_string()
            .contains("3155760000000 ms")
    );
}

#[test]
fn quota_rejects_zero_limit() {
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroLimit)
    );
    let q = Quota::per_minute(NonZeroU32::new(100).unwrap());
    assert_eq!((q.limit(), q.window().as_millis()), (100, 60_000));
}

fn q(limit: u64, millis: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(millis)).unwrap()
}

#[test]
fn rate_strings_parse() {
    let cases: &[(&str, Quota, &str)] = &[
        ("100/min", q(100, 60_000), "100/1min"),
        ("100/m", q(100, 60_000), "100/1min"),
        ("5 per 15m", q(5, 900_000), "5/15min"),
        ("5 per 15 min", q(5, 900_000), "5/15min"),
        ("10/s", q(10, 1_000), "10/1s"),
        ("1000/1h", q(1000, 3_600_000), "1000/1h"),
        ("20/500ms", q(20, 500), "20/500ms"),
        ("10000/1d", q(10_000, 86_400_000), "10000/1d"),
        ("10000/d", q(10_000, 86_400_000), "10000/1d"),
        ("7/90s", q(7, 90_000), "7/90s"),
        ("7/1500ms", q(7, 1_500), "7/1500ms"),
        ("3/120m", q(3, 7_200_000), "3/2h"),
        ("3/24h", q(3, 86_400_000), "3/1d"),
        ("3/60000ms", q(3, 60_000), "3/1min"),
        ("  3 / 2h  ", q(3, 7_200_000), "3/2h"),
        ("\t3\tper\t2 h\t", q(3, 7_200_000), "3/2h"),
        ("007/min", q(7, 60_000), "7/1min"),
        ("1/36525d", q(1, Window::MAX.as_millis()), "1/36525d"),
        (
            "18446744073709551615/ms",
            q(u64::MAX, 1),
            "18446744073709551615/1ms",
        ),
    ];
    for (text, want, canonical) in cases {
        let got: Quota = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(got, *want, "{text:?}");
        assert_eq!(got.to_string(), *canonical, "{text:?}");
        assert_eq!(canonical.parse::<Quota>(), Ok(got), "{text:?} canonical");
    }
}

#[test]
fn shares_parse_strictly_and_never_round_to_zero() {
    let share = |n, d| Share::new(n, d).unwrap();
    for (text, want) in [
        ("1/4", Some(share(1, 4))),
        (" 3 / 4 ", Some(share(3, 4))),
        ("1/1", Some(Share::WHOLE)),
        ("0/4", None),
        ("5/4", None),
        ("1/0", None),
        ("+1/4", None),
        ("-1/4", None),
        ("1/4/5", None),
        ("1.5/4", None),
        ("1", None),
        ("/4", None),
        ("4294967296/4294967297", None),
    ] {
        assert_eq!(text.parse::<Share>().ok(), want, "{text:?}");
        if let Some(share) = want {
            assert_eq!(share.to_string().parse::<Share>(), Ok(share));
        }
    }
    assert_eq!(
        "a quarter".parse::<Share>(),
        Err(ConfigError::InvalidShare("a quarter".into()))
    );
    let quarter = share(1, 4);
    assert_eq!(quarter.of(100), 25);
    assert_eq!(quarter.of(7), 1);
    assert_eq!(quarter.of(1), 1);
    assert_eq!(share(3, 4).of(u64::MAX), u64::MAX / 4 * 3 + 2);
    assert_eq!(Share::WHOLE.of(u64::MAX), u64::MAX);
}

#[test]
fn bad_rate_strings_say_what_was_wrong() {
    use RateProblem::*;
    // The input, what was wrong with which part, and the message's words.
    let cases: &[(&str, RateProblem, &str, &str)] = &[
        ("", Empty, "", "it is empty"),
        ("   ", Empty, "", "it is empty"),
        ("abc", NoSeparator, "abc", "no \"/\" or \" per \""),
        ("100", NoSeparator, "100", "no \"/\" or \" per \""),
        ("5per15m", NoSeparator, "5per15m", "no \"/\" or \" per \""),
        ("0/min", ZeroLimit, "0", "the limit is 0"),
        ("-1/min", NegativeLimit, "-1", "the limit -1 is negative"),
        (
            "+1/min",
            InvalidLimit,
            "+1",
            "the limit \"+1\" is not a whole number",
        ),
        (
            "1.5/min",
            InvalidLimit,
            "1.5",
            "the limit \"1.5\" is not a whole number",
        ),
        ("1_000/min", InvalidLimit, "1_000", "not a whole number"),
        (
            "/min",
            InvalidLimit,
            "",
            "the limit \"\" is not a whole number",
        ),
        ("ten/min", InvalidLimit, "ten", "the limit \"ten\""),
        (
            "18446744073709551616/min",
            LimitTooLarge,
            "18446744073709551616",
            "the limit 18446744073709551616 is larger than 18446744073709551615",
        ),
        ("10/", MissingWindow, "", "the window is missing"),
        ("10 per ", NoSeparator, "10 per", "no \"/\""),
        ("10/0s", ZeroWindow, "0s", "the window \"0s\" is zero"),
        ("10/0ms", ZeroWindow, "0ms", "is zero"),
        (
            "10/-5s",
            NegativeWindow,
            "-5s",
            "the window \"-5s\" is negative",
        ),
        (
            "10/60",
            MissingUnit,
            "60",
            "the window \"60\" has no unit (ms, s, m or min, h, d)",
        ),
        (
            "10/5y",
            UnknownUnit,
            "y",
            "unknown unit \"y\" (use ms, s, m or min, h, d)",
        ),
        ("10/5M", UnknownUnit, "M", "unknown unit \"M\""),
        ("10/5 mins", UnknownUnit, "mins", "unknown unit \"mins\""),
        ("10/week", UnknownUnit, "week", "unknown unit \"week\""),
        (
            "10/1.5s",
            InvalidWindow,
            "1.5s",
            "the window \"1.5s\" is not a whole number and a unit",
        ),
        (
            "10/+5s",
            InvalidWindow,
            "+5s",
            "not a whole number and a unit",
        ),
        (
            "10/5s/2",
            InvalidWindow,
            "5s/2",
            "not a whole number and a unit",
        ),
        (
            "10/36526d",
            WindowTooLong,
            "36526d",
            "the window \"36526d\" is longer than 36525d",
        ),
        (
            "10/18446744073709551615d",
            WindowTooLong,
            "18446744073709551615d",
            "longer than 36525d",
        ),
        (
            "10/99999999999999999999999ms",
            WindowTooLong,
            "99999999999999999999999ms",
            "longer than 36525d",
        ),
    ];
    for (text, problem, part, message) in cases {
        let err = text.parse::<Quota>().unwrap_err();
        // What was wrong, and with which part: the reason says exactly that.
        assert_eq!(
            err,
            ConfigError::invalid_rate(text, *problem, part),
            "{text:?}: {err}"
        );
        assert!(
            matches!(&err, ConfigError::InvalidRate { input, .. } if input == text),
            "{text:?}: {err:?}"
        );
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!("invalid rate {text:?}: ")),
            "{text:?}: {shown}"
        );
        assert!(shown.contains(message), "{text:?}: {shown}");
        // `?` in a function returning `ConfigError` keeps it whole.
        let from_config = |text: &str| -> Result<u64, ConfigError> {
            let quota = text.parse::<Quota>()?;
            Ok(quota.limit())
        };
        let config = from_config(text).unwrap_err();
        assert_eq!(config.to_string(), shown, "{text:?}");
        assert_eq!(config, err, "{text:?}");
    }
}

#[test]
fn windows_parse_alone() {
    assert_eq!("15m".parse::<Window>().map(Window::as_millis), Ok(900_000));
    assert_eq!(
        " h ".parse::<Window>().map(Window::as_millis),
        Ok(3_600_000)
    );
    assert_eq!(Window::MAX.to_string(), "36525d");
    assert_eq!(
        "0s".parse::<Window>(),
        Err(ConfigError::invalid_rate(
            "0s",
            RateProblem::ZeroWindow,
            "0s"
        ))
    );
    assert_eq!(
        "".parse::<Window>(),
        Err(ConfigError::invalid_rate(
            "",
            RateProblem::MissingWindow,
            ""
        ))
    );
}

proptest::proptest! {
    /// Every quota's canonical form parses back to it exactly.
    #[test]
    fn display_round_trips(limit in 1..=u64::MAX, millis in 1..=MAX_MILLIS) {
        let quota = q(limit, millis);
        let text = quota.to_string();
        proptest::prop_assert_eq!(text.parse::<Quota>(), Ok(quota), "{}", text);
        proptest::prop_assert!(!text.contains(' '));
    }

    /// Round windows print in their unit.
    #[test]
    fn round_windows_print_in_their_unit(
        amount in 1..=36_525u64,
        unit in proptest::sample::select(vec![("d", 86_400_000u64), ("h", 3_600_000), ("min", 60_000), ("s", 1_000), ("ms", 1)]),
    ) {
        let window: Window = format!("{amount}{}", unit.0).parse().unwrap();
        proptest::prop_assert_eq!(window.as_millis(), amount * unit.1);
        proptest::prop_assert_eq!(window.to_string().parse::<Window>(), Ok(window));
    }

    /// Whatever the text, parsing answers (never panics), and what it
    /// accepts prints in a form it accepts again.
    #[test]
    fn parsing_never_panics(text in "[ 0-9a-z/+.-]{0,24}") {
        if let Ok(quota) = text.parse::<Quota>() {
            proptest::prop_assert_eq!(quota.to_string().parse::<Quota>(), Ok(quota));
        }
    }
}
