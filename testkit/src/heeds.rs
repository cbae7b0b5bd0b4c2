//! The provider's word ([`Heeding`]): closures and raises.
//!
//! These scenarios call [`Heeding::close`] and [`Heeding::raise`], and
//! spend to see what they left; [`heed_scenarios`] is the one list that
//! asks for [`Heeding`], so a backend that only spends (or also leases)
//! runs the rest.

use std::time::Duration;

use tower_pinned_window::Window;
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Heeding, Hit, Hits, Spend, Spending,
};
use tower_pinned_window::key::Key;

use crate::check::{PAST_SHORT, SHORT, count, minute, peek, quota, stored};
use crate::scenario::Scenario;
use crate::store::{Ability, Store, Stored};

/// The scenarios of the provider's word, in a fixed order, for a store
/// whose backend implements [`Heeding`] (every backend of
/// `tower-pinned-window` does). [`scenarios`](crate::scenarios) does not
/// hold them, so that a backend without the fourth trait runs the rest.
pub fn heed_scenarios<S: Store>() -> Vec<Scenario<S>>
where
    S::Backend: Heeding,
{
    vec![
        scenario!(heeds: a_close_refuses_spends_until_it_ends),
        scenario!(heeds: a_shorter_close_never_shortens_a_longer_one_extends),
        scenario!(heeds: a_close_extends_a_spends_lockout),
        scenario!(heeds: a_raise_keeps_a_live_window_and_never_lowers),
        scenario!(heeds: a_raise_creates_a_missing_counter_in_the_shorter_window),
        scenario!(heeds: a_raise_of_zero_creates_and_changes_nothing),
        scenario!(
            heeds: corrupt_counters_fail_heeds_and_are_left_as_they_are,
            Corrupt,
            ReadStored
        ),
        scenario!(
            heeds: lockouts_without_a_lifetime_fail_closes_and_are_left_as_they_are,
            CorruptLockout
        ),
    ]
}

/// Room a loaded machine may take between a store's answer and the next.
const SLACK: Duration = Duration::from_millis(250);

fn window(duration: Duration) -> Window {
    Window::new(duration).expect("the suite's windows are valid")
}

fn counter(namespace: &str, limit: u64) -> Counter<'_> {
    Counter {
        namespace,
        quota: minute(limit),
        lowers: false,
    }
}

async fn close<B: Heeding>(backend: &B, namespace: &str, key: &Key, span: Duration) -> Duration {
    backend
        .close(namespace, key, window(span))
        .await
        .unwrap_or_else(|e| panic!("close on {namespace}/{key:?}: {e}"))
}

async fn raise<B: Heeding>(
    backend: &B,
    key: &Key,
    counter: Counter<'_>,
    count: u64,
    within: Duration,
) -> Hit {
    backend
        .raise(key, counter, count, window(within))
        .await
        .unwrap_or_else(|e| panic!("raise on {}/{key:?}: {e}", counter.namespace))
}

async fn spend<B: Spending>(backend: &B, key: &Key, counter: Counter<'_>, spend: Spend) -> Hit {
    let hits: Hits = backend
        .spend_all(key, &[counter], spend)
        .await
        .unwrap_or_else(|e| panic!("spend on {}/{key:?}: {e}", counter.namespace));
    hits[0]
}

/// `left` is about `span`: at most it, and less only by the time the call
/// took.
fn assert_about(left: Duration, span: Duration, what: &str) {
    assert!(
        left <= span && left + SLACK > span,
        "{what}: {left:?} left, about {span:?} expected"
    );
}

/// A close locks the counter out: a spend is refused with the lockout's
/// time left and spends nothing, until the lockout ends; other counters and
/// keys are not closed, no counter is created, and a reset lifts it.
async fn a_close_refuses_spends_until_it_ends<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let n = counter("n", 10);
    assert_eq!(spend(&backend, &key, n, Spend::cost(2)).await.count, 2);
    let span = Duration::from_millis(600);
    let left = close(&backend, "n", &key, span).await;
    assert_about(left, span, "a new lockout");

    let denied = spend(&backend, &key, n, Spend::cost(1)).await;
    assert_eq!(
        (denied.count, denied.deadline),
        (10 + 1, None),
        "closed: the limit stands in the way, nothing counted"
    );
    assert!(
        denied.reset <= left && denied.reset + SLACK > left,
        "the retry is the lockout's time left: {:?}, closed for {left:?}",
        denied.reset
    );
    let check = spend(&backend, &key, n, Spend::cost(0)).await;
    assert!(check.count > 10, "a check is refused too");
    assert_eq!(count(&backend, "n", &key).await, 2, "nothing spent");

    // Only this counter of this key is closed.
    assert_eq!(
        spend(&backend, &key, counter("m", 10), Spend::cost(1))
            .await
            .count,
        1,
        "another counter of the key"
    );
    assert_eq!(
        spend(&backend, &Key::new("k2"), n, Spend::cost(1))
            .await
            .count,
        1,
        "another key"
    );
    // A close creates no counter.
    let closed = Key::new("closed");
    close(&backend, "n", &closed, span).await;
    assert_eq!(peek(&backend, "n", &closed).await, None, "no counter");

    tokio::time::sleep(span + Duration::from_millis(120)).await;
    let open = spend(&backend, &key, n, Spend::cost(1)).await;
    assert_eq!(open.count, 3, "after the lockout, in the same window");
    assert!(open.deadline.is_some());
    assert_eq!(
        spend(&backend, &closed, n, Spend::cost(1)).await.count,
        1,
        "after the lockout, a key closed before it had a counter"
    );

    close(&backend, "n", &key, Duration::from_secs(60)).await;
    assert!(spend(&backend, &key, n, Spend::cost(1)).await.count > 10);
    assert!(
        backend.reset("n", &key).await.expect("reset"),
        "a reset finds the counter"
    );
    assert_eq!(
        spend(&backend, &key, n, Spend::cost(1)).await.count,
        1,
        "a reset lifts a closure"
    );
}

/// Deadlines only extend: a later close that ends sooner leaves the
/// lockout as it is (and answers its time left), one that ends later moves
/// it; once a lockout has ended, the next close makes a new one.
async fn a_shorter_close_never_shortens_a_longer_one_extends<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let n = counter("n", 10);
    let minute = Duration::from_secs(60);
    let long = close(&backend, "n", &key, minute).await;
    assert_about(long, minute, "a new lockout");
    let short = close(&backend, "n", &key, Duration::from_secs(1)).await;
    assert!(
        short <= long && short + SLACK > long,
        "a shorter close left it as it was: {long:?}, then {short:?}"
    );
    let denied = spend(&backend, &key, n, Spend::cost(1)).await;
    assert!(denied.count > 10, "still closed");
    assert_about(denied.reset, minute, "the retry after a shorter close");

    let two = 2 * minute;
    let longer = close(&backend, "n", &key, two).await;
    assert_about(longer, two, "a longer close");
    let denied = spend(&backend, &key, n, Spend::cost(1)).await;
    assert!(denied.count > 10, "still closed");
    assert_about(denied.reset, two, "the retry after a longer close");

    // An ended lockout is no lockout: the next close makes one anew.
    let other = Key::new("other");
    close(&backend, "n", &other, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(spend(&backend, &other, n, Spend::cost(1)).await.count, 1);
    let span = Duration::from_millis(200);
    let again = close(&backend, "n", &other, span).await;
    assert_about(again, span, "a close after the last one ended");
}

/// A close and a spend's lockout are one marker: a close moves the end of
/// a lockout a spend set, and its end holds past the spend's.
async fn a_close_extends_a_spends_lockout<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let login = counter("login", 1);
    let block = Duration::from_millis(400);
    let locking = Spend::cost(1).block(window(block));
    assert_eq!(spend(&backend, &key, login, locking).await.count, 1);
    let locked = spend(&backend, &key, login, locking).await;
    assert!(locked.count > 1, "locked out by the spend");
    assert_about(locked.reset, block, "the spend's lockout");

    let minute = Duration::from_secs(60);
    let left = close(&backend, "login", &key, minute).await;
    assert_about(left, minute, "the close moved the spend's lockout");
    let denied = spend(&backend, &key, login, locking).await;
    assert_about(denied.reset, minute, "a spend sees the close's end");
    tokio::time::sleep(block + Duration::from_millis(100)).await;
    let denied = spend(&backend, &key, login, locking).await;
    assert!(denied.count > 1, "closed past the spend's lockout");
    assert!(
        denied.reset > minute - block - SLACK,
        "the close's end: {:?}",
        denied.reset
    );
    assert_eq!(count(&backend, "login", &key).await, 1, "nothing spent");
}

/// A raise on a live counter keeps its window (the deadline a spend
/// named); it never lowers the count and never raises it past the limit;
/// its answer names the window, for an amend.
async fn a_raise_keeps_a_live_window_and_never_lowers<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let n = counter("n", 10);
    let spent = spend(&backend, &key, n, Spend::cost(3)).await;
    assert!(spent.deadline.is_some());
    let raised = raise(&backend, &key, n, 7, SHORT).await;
    assert_eq!(raised.count, 7);
    assert_eq!(raised.deadline, spent.deadline, "the same window");
    assert!(
        raised.reset > Duration::from_secs(50),
        "its window kept, not the provider's: {:?}",
        raised.reset
    );
    assert_eq!(count(&backend, "n", &key).await, 7);

    let lower = raise(&backend, &key, n, 5, SHORT).await;
    assert_eq!(
        (lower.count, lower.deadline),
        (7, spent.deadline),
        "never lowered"
    );
    let capped = raise(&backend, &key, n, 99, SHORT).await;
    assert_eq!(
        (capped.count, capped.deadline),
        (10, spent.deadline),
        "never past the limit"
    );
    assert_eq!(count(&backend, "n", &key).await, 10);
    assert!(
        spend(&backend, &key, n, Spend::cost(1)).await.count > 10,
        "full"
    );

    // The answer's deadline is the window's identity.
    let amend = |change| backend.amend("n", &key, &capped, change);
    assert!(amend(Amend::Refund(4)).await.expect("amend"));
    assert_eq!(count(&backend, "n", &key).await, 6);
    assert!(amend(Amend::Charge(10)).await.expect("amend"));
    let past = raise(&backend, &key, n, 12, SHORT).await;
    assert_eq!(past.count, 16, "a charge past the limit stays");
    assert_eq!(peek(&backend, "m", &key).await, None, "no other counter");
}

/// A raise on a missing counter creates it at the count (at most the
/// limit) with the shorter of the provider's reset and the quota's window;
/// a spend then counts in that window; once it closes, a raise opens
/// another.
async fn a_raise_creates_a_missing_counter_in_the_shorter_window<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let n = counter("n", 10);
    let made = raise(&backend, &key, n, 4, SHORT).await;
    assert_eq!(made.count, 4);
    assert!(made.deadline.is_some(), "a counter made is named");
    assert_about(made.reset, SHORT, "the provider's reset");
    let seen = peek(&backend, "n", &key).await.expect("created");
    assert_eq!(seen.count, 4);
    let spent = spend(&backend, &key, n, Spend::cost(1)).await;
    assert_eq!(
        (spent.count, spent.deadline),
        (5, made.deadline),
        "a spend counts in the raise's window"
    );
    if store.abilities().contains(&Ability::ReadStored) {
        assert_eq!(
            stored(store, &backend, "n", &key).await,
            Stored::Value {
                value: "5".to_owned(),
                expiry: made.deadline.map(|d| d.get()),
            },
            "the lifetime attached in the raise's step"
        );
    }

    let capped = raise(&backend, &Key::new("capped"), n, 50, SHORT).await;
    assert_eq!(capped.count, 10, "created at most at the limit");

    // The quota's window when the provider's reset is later.
    let short = Counter {
        namespace: "s",
        quota: quota(10, SHORT),
        lowers: false,
    };
    let made_short = raise(&backend, &key, short, 3, Duration::from_secs(60)).await;
    assert_eq!(made_short.count, 3);
    assert_about(made_short.reset, SHORT, "the quota's window");

    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(peek(&backend, "n", &key).await, None, "the window closed");
    assert_eq!(peek(&backend, "s", &key).await, None, "the window closed");
    let again = raise(&backend, &key, n, 2, Duration::from_secs(60)).await;
    assert_eq!(again.count, 2, "a new window");
    assert_ne!(again.deadline, made.deadline);
    assert!(
        again.reset > Duration::from_secs(50),
        "the quota's minute: {:?}",
        again.reset
    );
}

/// A raise of 0 creates nothing, and answers the counter as it stands.
async fn a_raise_of_zero_creates_and_changes_nothing<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("k");
    let n = counter("n", 10);
    let zero = raise(&backend, &key, n, 0, SHORT).await;
    assert_eq!((zero.count, zero.deadline), (0, None), "no counter");
    assert_eq!(peek(&backend, "n", &key).await, None, "none created");
    if store.abilities().contains(&Ability::ReadStored) {
        assert_eq!(stored(store, &backend, "n", &key).await, Stored::Absent);
    }
    let spent = spend(&backend, &key, n, Spend::cost(3)).await;
    let read = raise(&backend, &key, n, 0, SHORT).await;
    assert_eq!((read.count, read.deadline), (3, spent.deadline));
    assert!(read.reset > Duration::from_secs(50), "its window kept");
    assert_eq!(count(&backend, "n", &key).await, 3);
}

/// A counter that is not one fails a close and a raise, any count, and is
/// left exactly as it was.
async fn corrupt_counters_fail_heeds_and_are_left_as_they_are<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("bad");
    store
        .corrupt(&backend, "n", &key)
        .await
        .expect("the store claims Corrupt but `corrupt` answered None");
    let before = stored(store, &backend, "n", &key).await;
    assert_ne!(before, Stored::Absent, "the corrupt value is stored");
    match backend
        .close("n", &key, window(Duration::from_secs(60)))
        .await
    {
        Err(err @ BackendError::Corrupt { .. }) => assert!(err.is_corrupt()),
        other => panic!("a close on a corrupt counter: {other:?}"),
    }
    for n in [0, 5, u64::MAX] {
        match backend
            .raise(&key, counter("n", 10), n, window(SHORT))
            .await
        {
            Err(BackendError::Corrupt { .. }) => {}
            other => panic!("a raise of {n} on a corrupt counter: {other:?}"),
        }
    }
    assert_eq!(
        stored(store, &backend, "n", &key).await,
        before,
        "left as it was"
    );
    // Another key is a counter of its own.
    let fine = Key::new("fine");
    assert_eq!(
        raise(&backend, &fine, counter("n", 10), 2, SHORT)
            .await
            .count,
        2
    );
    close(&backend, "n", &fine, SHORT).await;
}

/// A lockout without a lifetime fails a close, and is left as it is: the
/// next close fails too.
async fn lockouts_without_a_lifetime_fail_closes_and_are_left_as_they_are<S: Store>(store: &S)
where
    S::Backend: Heeding,
{
    let backend = store.fresh().await;
    let key = Key::new("bad");
    store
        .corrupt_lockout(&backend, "n", &key)
        .await
        .expect("the store claims CorruptLockout but `corrupt_lockout` answered None");
    for attempt in ["first", "again"] {
        match backend
            .close("n", &key, window(Duration::from_secs(60)))
            .await
        {
            Err(err @ BackendError::Corrupt { .. }) => assert!(err.is_corrupt()),
            other => panic!("{attempt}: a close on a lockout without a lifetime: {other:?}"),
        }
    }
    assert_about(
        close(&backend, "n", &Key::new("fine"), SHORT).await,
        SHORT,
        "another key",
    );
}
