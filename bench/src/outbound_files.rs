//! The files of the outbound soaks (`bin/outbound_soak.rs`), read back by
//! its reports: the events, each client's calls and spends, the fake
//! provider's log; and the figures' helpers both reports print with.

use super::soak_env::Error;

/// A call line of a client's OUT.
pub struct CallLine {
    pub client: usize,
    pub arrived_us: u64,
    pub admitted_us: u64,
    pub ended_us: u64,
    pub outcome: String,
    pub deadline_ms: u64,
    pub spends: u64,
    pub insured: bool,
}

/// An answer line of a client's OUT.spends.
pub struct SpendLine {
    pub unix_us: u64,
    pub verdict: String,
    pub count: u64,
    pub deadline_ms: u64,
    /// When the store said the window (or a lockout) ends, from the answer.
    pub reset_ms: u64,
    pub local: bool,
}

/// The calls of each step, over every client (OUT.spends' `totals` and
/// `heeds` lines).
#[derive(Default)]
pub struct Totals {
    pub spends: u64,
    pub amends: u64,
    pub hits: u64,
    pub refunds: u64,
    /// The provider's word written to the store: closures and raises.
    pub closes: u64,
    pub raises: u64,
}

/// A line of the provider's log: when a call came (Unix µs), the status it
/// was answered with, and when the provider's window it fell in opened.
/// A log of older runs has the time alone: a 200, in no known window (0).
pub struct ProviderLine {
    pub at_us: u64,
    pub status: u16,
    pub window_us: u64,
}

/// What a run's EVENTS say.
pub struct Events {
    pub start_ms: u64,
    pub end_ms: u64,
    pub kill_ms: Option<u64>,
    pub restart_ms: Option<u64>,
    /// `(unix_ms, name, counters, without an expiry, longest left ms)`.
    pub scans: Vec<(u64, String, i64, i64, i64)>,
    /// The `EVALSHA`s Redis served, over its lives.
    pub evalsha: u64,
}

pub fn fields<const N: usize>(line: &str, file: &str) -> Result<[String; N], Error> {
    let parts: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    parts
        .try_into()
        .map_err(|_| format!("{file}: a line of {N} fields expected: {line:?}").into())
}

/// EVENTS: `event UNIX_MS load-start`, `event UNIX_MS load-end`, `fault
/// UNIX_MS redis-kill-9`, `event UNIX_MS redis-restarted`, `scan UNIX_MS
/// NAME COUNTERS WITHOUT_EXPIRY LONGEST_LEFT_MS`, `calls UNIX_MS NAME N`.
pub fn read_events(path: &str) -> Result<Events, Error> {
    let mut events = Events {
        start_ms: 0,
        end_ms: 0,
        kill_ms: None,
        restart_ms: None,
        scans: Vec::new(),
        evalsha: 0,
    };
    for line in std::fs::read_to_string(path)?.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["event", at, "load-start"] => events.start_ms = at.parse()?,
            ["event", at, "load-end"] => events.end_ms = at.parse()?,
            ["fault", at, _] => events.kill_ms = Some(at.parse::<u64>()?),
            ["event", at, "redis-restarted"] => events.restart_ms = Some(at.parse::<u64>()?),
            ["scan", at, name, n, bad, longest] => events.scans.push((
                at.parse::<u64>()?,
                (*name).to_owned(),
                n.parse::<i64>()?,
                bad.parse::<i64>()?,
                longest.parse::<i64>()?,
            )),
            ["calls", _, _, n] => events.evalsha += n.parse::<u64>()?,
            _ => {}
        }
    }
    if events.start_ms == 0 || events.end_ms == 0 {
        return Err(format!("{path}: no load-start or load-end event").into());
    }
    Ok(events)
}

pub fn read_calls(client: usize, path: &str) -> Result<Vec<CallLine>, Error> {
    let mut calls = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        let [a, t, e, outcome, d, _count, s, i] = fields::<8>(line, path)?;
        calls.push(CallLine {
            client,
            arrived_us: a.parse()?,
            admitted_us: t.parse()?,
            ended_us: e.parse()?,
            outcome,
            deadline_ms: d.parse()?,
            spends: s.parse()?,
            insured: i == "1",
        });
    }
    Ok(calls)
}

pub fn read_spends(path: &str, totals: &mut Totals) -> Result<Vec<SpendLine>, Error> {
    let mut spends = Vec::new();
    let mut seen_totals = false;
    for line in std::fs::read_to_string(path)?.lines() {
        if let Some(rest) = line.strip_prefix("totals ") {
            let [s, a, h, r] = fields::<4>(rest, path)?;
            totals.spends += s.parse::<u64>()?;
            totals.amends += a.parse::<u64>()?;
            totals.hits += h.parse::<u64>()?;
            totals.refunds += r.parse::<u64>()?;
            seen_totals = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("heeds ") {
            let [c, r] = fields::<2>(rest, path)?;
            totals.closes += c.parse::<u64>()?;
            totals.raises += r.parse::<u64>()?;
            continue;
        }
        let [t, verdict, count, d, reset, local] = fields::<6>(line, path)?;
        spends.push(SpendLine {
            unix_us: t.parse()?,
            verdict,
            count: count.parse()?,
            deadline_ms: d.parse()?,
            reset_ms: reset.parse()?,
            local: local == "1",
        });
    }
    if !seen_totals {
        return Err(format!("{path}: no totals line (the client did not finish)").into());
    }
    Ok(spends)
}

/// The provider's log, in the order the calls came.
pub fn read_provider(path: &str) -> Result<Vec<ProviderLine>, Error> {
    let mut seen = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        let mut parts = line.split_whitespace();
        let at_us = parts
            .next()
            .ok_or_else(|| format!("{path}: an empty line"))?
            .parse()?;
        let (status, window_us) = match (parts.next(), parts.next(), parts.next()) {
            (None, None, None) => (200, 0),
            (Some(status), Some(window), None) => (status.parse()?, window.parse()?),
            _ => return Err(format!("{path}: a line of 1 or 3 fields expected: {line:?}").into()),
        };
        seen.push(ProviderLine {
            at_us,
            status,
            window_us,
        });
    }
    Ok(seen)
}

/// The `q` quantile (0..=1) of sorted `values`.
pub fn quantile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// p50, p99 and max of `values`, in ms from µs.
pub fn summary(mut values: Vec<i64>) -> String {
    values.sort_unstable();
    if values.is_empty() {
        return "none".into();
    }
    let ms = |us: i64| us as f64 / 1000.0;
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        ms(quantile(&values, 0.5)),
        ms(quantile(&values, 0.99)),
        ms(*values.last().expect("not empty")),
        values.len()
    )
}
