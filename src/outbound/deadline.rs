//! A call's own bound on its wait, read from its request: a [`WaitBound`]
//! in its extensions, or the `grpc-timeout` header a tonic client sets
//! (`Request::set_timeout`). The earlier one bounds the call's wait.

use std::time::Duration;

use http::Request;
use tokio::time::Instant;

use super::error::WaitBound;

/// The earlier of `request`'s own [`WaitBound`] and its `grpc-timeout`
/// from `now`, and which one it is; a malformed `grpc-timeout` is ignored,
/// and so is a bound too far away for the clock to hold.
pub(crate) fn of<B>(request: &Request<B>, now: Instant) -> Option<(Instant, WaitBound)> {
    let set = request.extensions().get::<WaitBound>().and_then(|&bound| {
        let until = match bound {
            WaitBound::Deadline(deadline) => Some(Instant::from_std(deadline)),
            WaitBound::MaxWait(wait) | WaitBound::GrpcTimeout(wait) => now.checked_add(wait),
        };
        until.map(|until| (until, bound))
    });
    let grpc = request
        .headers()
        .get("grpc-timeout")
        .and_then(|value| grpc_timeout(value.as_bytes()))
        .and_then(|timeout| Some((now.checked_add(timeout)?, WaitBound::GrpcTimeout(timeout))));
    match (set, grpc) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// A `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`,
/// `m`, `u`, `n`), as the gRPC over HTTP/2 spec writes it.
fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout(b"30S"), Some(Duration::from_secs(30)));
        assert_eq!(grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            grpc_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(grpc_timeout(b"5n"), Some(Duration::from_nanos(5)));
        for bad in [
            &b""[..],
            b"S",
            b"123456789S",
            b"1x",
            b"-1S",
            b"1.5S",
            b" 1S",
            b"\xff1S",
        ] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_earlier_deadline_bounds_the_call() {
        let now = Instant::now();
        let mut request = Request::builder()
            .header("grpc-timeout", "2S")
            .body(())
            .unwrap();
        assert_eq!(
            of(&request, now),
            Some((
                now + Duration::from_secs(2),
                WaitBound::GrpcTimeout(Duration::from_secs(2))
            ))
        );
        let sooner = now + Duration::from_secs(1);
        let deadline = WaitBound::Deadline(sooner.into_std());
        request.extensions_mut().insert(deadline);
        assert_eq!(of(&request, now), Some((sooner, deadline)));
        request
            .headers_mut()
            .insert("grpc-timeout", "bogus".parse().unwrap());
        assert_eq!(
            of(&request, now),
            Some((sooner, deadline)),
            "a malformed header is ignored"
        );
        assert_eq!(of(&Request::new(()), now), None);
        // A call's own wait counts from `now`; one too long for the clock is
        // no bound at all, never a panic.
        let wait = WaitBound::MaxWait(Duration::from_millis(500));
        request.extensions_mut().insert(wait);
        assert_eq!(
            of(&request, now),
            Some((now + Duration::from_millis(500), wait))
        );
        request
            .extensions_mut()
            .insert(WaitBound::MaxWait(Duration::MAX));
        assert_eq!(of(&request, now), None);
    }
}
