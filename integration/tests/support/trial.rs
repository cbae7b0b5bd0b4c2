//! Tests as `libtest-mimic` trials, for the test binaries that need a server
//! (`harness = false`): a test whose server is missing is marked ignored
//! before it runs, so the summary line counts it as ignored, never as
//! passed. With `REQUIRE_REDIS=1` / `REQUIRE_POSTGRES=1`, it fails instead.
//!
//! The standard test arguments (a filter, `--exact`, `--ignored`,
//! `--test-threads`, `--list`, ...) work as with the built-in harness.
//!
//! Each such binary includes it as `#[path = "support/trial.rs"] mod
//! trial;` beside `mod support;` (the integration/ member shares
//! `support/` but not this harness).

#![allow(dead_code)]

use std::future::Future;
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Failed, Trial};

/// What a trial needs to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Nothing outside the process.
    Nothing,
    /// `redis-server` and `redis-cli` (the harness starts its own servers).
    Redis,
    /// The machine's PostgreSQL server (`TEST_DATABASE_URL`).
    Postgres,
    /// PostgreSQL's server binaries, for a private server of the test's own.
    PgServer,
}

impl Needs {
    /// Why the trial cannot run here, or `None` when it can.
    fn missing(self) -> Option<String> {
        match self {
            Self::Nothing => None,
            #[cfg(feature = "redis")]
            Self::Redis => crate::support::redis::missing(),
            #[cfg(feature = "postgres")]
            Self::Postgres => crate::support::postgres::missing_server(),
            #[cfg(feature = "postgres")]
            Self::PgServer => crate::support::postgres::missing_binaries(),
            #[allow(unreachable_patterns)]
            _ => Some(format!("{self:?}: not built with its feature")),
        }
    }

    fn required(self) -> bool {
        let var = match self {
            Self::Nothing => return false,
            Self::Redis => "REQUIRE_REDIS",
            Self::Postgres | Self::PgServer => "REQUIRE_POSTGRES",
        };
        std::env::var(var).as_deref() == Ok("1")
    }

    /// Checked once per process (and per kind).
    fn check(self) -> Option<&'static str> {
        static CHECKED: [OnceLock<Option<String>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        CHECKED[self as usize]
            .get_or_init(|| {
                let why = self.missing();
                if let Some(why) = &why {
                    let what = if self.required() {
                        "failing"
                    } else {
                        "ignored"
                    };
                    eprintln!("tests that need {self:?} are {what}: {why}");
                }
                why
            })
            .as_deref()
    }
}

/// A trial of `run`, ignored when `needs` is missing (failing when it is
/// required).
pub fn trial(name: impl Into<String>, needs: Needs, run: impl FnOnce() + Send + 'static) -> Trial {
    let name = name.into();
    match needs.check() {
        None => Trial::test(name, move || {
            run();
            Ok(())
        }),
        Some(why) => {
            let required = needs.required();
            let why = why.to_owned();
            // Run anyway (`--ignored`), it fails: it cannot pass here.
            Trial::test(name, move || {
                Err(Failed::from(if required {
                    format!("required but missing: {why}")
                } else {
                    format!("cannot run here: {why}")
                }))
            })
            .with_ignored_flag(!required)
        }
    }
}

/// Run `test` to completion on a runtime made by `builder`, with every
/// driver (I/O, time) on.
fn block_on<F: Future<Output = ()>>(mut builder: tokio::runtime::Builder, test: F) {
    builder.enable_all().build().unwrap().block_on(test)
}

/// Two workers, as `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`.
fn two_workers() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2);
    builder
}

/// A trial of an async test on a current-thread runtime (`#[tokio::test]`).
pub fn current<F>(name: &str, needs: Needs, test: fn() -> F) -> Trial
where
    F: Future<Output = ()> + 'static,
{
    trial(name, needs, move || {
        block_on(tokio::runtime::Builder::new_current_thread(), test())
    })
}

/// A trial of an async test on a current-thread runtime whose clock starts
/// paused (`#[tokio::test(start_paused = true)]`).
pub fn paused<F>(name: &str, needs: Needs, test: fn() -> F) -> Trial
where
    F: Future<Output = ()> + 'static,
{
    trial(name, needs, move || {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.start_paused(true);
        block_on(builder, test())
    })
}

/// A trial of an async test on a two-worker multi-thread runtime
/// (`#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`).
pub fn multi<F>(name: &str, needs: Needs, test: fn() -> F) -> Trial
where
    F: Future<Output = ()> + Send + 'static,
{
    trial(name, needs, move || block_on(two_workers(), test()))
}

/// A trial of a test that must panic with a message containing `expected`
/// (`#[should_panic(expected = ...)]`).
pub fn should_panic(name: &str, needs: Needs, expected: &'static str, test: fn()) -> Trial {
    trial(name, needs, move || {
        let err = std::panic::catch_unwind(test).expect_err("the test did not panic");
        let message = err
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| err.downcast_ref::<&str>().copied())
            .unwrap_or("");
        assert!(
            message.contains(expected),
            "panicked with {message:?}, not {expected:?}"
        );
    })
}

/// One trial per scenario of the backend contract, named
/// `{prefix}::{scenario}`, on `store` (shared by every trial). A scenario
/// that needs an ability the store lacks is ignored.
pub fn contract<S: tower_pinned_window_testkit::Store>(
    prefix: &str,
    needs: Needs,
    store: std::sync::Arc<S>,
) -> Vec<Trial>
where
    S::Backend: tower_pinned_window::backend::Spending,
{
    trials_of(
        prefix,
        needs,
        store,
        tower_pinned_window_testkit::scenarios::<S>(),
    )
}

/// [`contract`] for the in-flight contract's scenarios (`Leasing`).
#[allow(dead_code, reason = "not every test crate needs it")]
pub fn contract_leases<S: tower_pinned_window_testkit::Store>(
    prefix: &str,
    needs: Needs,
    store: std::sync::Arc<S>,
) -> Vec<Trial>
where
    S::Backend: tower_pinned_window::backend::Leasing + tower_pinned_window::backend::Spending,
{
    trials_of(
        prefix,
        needs,
        store,
        tower_pinned_window_testkit::lease_scenarios::<S>(),
    )
}

/// [`contract`] for the scenarios of the provider's word (`Heeding`).
#[allow(dead_code, reason = "not every test crate needs it")]
pub fn contract_heeds<S: tower_pinned_window_testkit::Store>(
    prefix: &str,
    needs: Needs,
    store: std::sync::Arc<S>,
) -> Vec<Trial>
where
    S::Backend: tower_pinned_window::backend::Heeding,
{
    trials_of(
        prefix,
        needs,
        store,
        tower_pinned_window_testkit::heed_scenarios::<S>(),
    )
}

/// [`contract`] for the scenarios of limits held in the store (`Limits`).
#[allow(dead_code, reason = "not every test crate needs it")]
pub fn contract_limits<S: tower_pinned_window_testkit::Store>(
    prefix: &str,
    needs: Needs,
    store: std::sync::Arc<S>,
) -> Vec<Trial>
where
    S::Backend: tower_pinned_window::backend::Limits,
{
    trials_of(
        prefix,
        needs,
        store,
        tower_pinned_window_testkit::limit_scenarios::<S>(),
    )
}

/// A trial per scenario of `scenarios`, named `prefix::scenario`.
fn trials_of<S: tower_pinned_window_testkit::Store>(
    prefix: &str,
    needs: Needs,
    store: std::sync::Arc<S>,
    scenarios: Vec<tower_pinned_window_testkit::Scenario<S>>,
) -> Vec<Trial> {
    scenarios
        .into_iter()
        .map(|scenario| {
            let name = format!("{prefix}::{}", scenario.name);
            if let Some(ability) = scenario.missing(&store) {
                // Not applicable: ignored, and failing if run anyway. The
                // reason is the trial's kind, which the test lines print
                // before its name (`test [not applicable: ...] memory::...`).
                let why = format!("not applicable: the store cannot {ability}");
                return Trial::test(name, {
                    let why = why.clone();
                    move || Err(Failed::from(why))
                })
                .with_kind(why)
                .with_ignored_flag(true);
            }
            let store = store.clone();
            trial(name, needs, move || {
                block_on(two_workers(), scenario.run(&store))
            })
        })
        .collect()
}

/// As [`run`], one trial at a time whatever `--test-threads` says: for
/// trials that measure how long answers take under their own load.
#[allow(dead_code, reason = "not every test crate needs it")]
pub fn run_one_at_a_time(trials: Vec<Trial>, keep: impl Sized) -> ! {
    let mut arguments = Arguments::from_args();
    arguments.test_threads = Some(1);
    let conclusion = libtest_mimic::run(&arguments, trials);
    drop(keep);
    conclusion.exit()
}

/// Run `trials` with the command line's arguments, then exit with their
/// verdict. `keep` (shared servers) is dropped before the exit, so their
/// processes are killed and reaped.
pub fn run(trials: Vec<Trial>, keep: impl Sized) -> ! {
    let conclusion = libtest_mimic::run(&Arguments::from_args(), trials);
    drop(keep);
    conclusion.exit()
}
