//! The backend contract (`tower_pinned_window_testkit`) on the in-memory
//! backend, as it is and wrapped in `PrivateKeys`: one test per scenario,
//! `memory::<scenario>` and `private_memory::<scenario>`. The other
//! backends run the same scenarios in their own test files, next to the
//! tests of what only they do.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::sync::Arc;

use tower_pinned_window::backend::MemoryBackend;
use tower_pinned_window_testkit::{Private, Store};
use trial::Needs;

/// A new `MemoryBackend` per scenario; the memory holds no bytes to corrupt
/// and no lifetime to read, so those scenarios are not applicable.
/// `PrivateKeys` holds no limits (a key's limit would be stored under its
/// digest), so the limits' scenarios run on the memory alone.
struct Memory;

impl Store for Memory {
    type Backend = MemoryBackend;

    async fn fresh(&self) -> MemoryBackend {
        MemoryBackend::new()
    }
}

const SECRET: &[u8; 32] = b"contract: 32 bytes of a secret!!";

fn main() {
    let mut trials = trial::contract("memory", Needs::Nothing, Arc::new(Memory));
    trials.extend(trial::contract_leases(
        "memory",
        Needs::Nothing,
        Arc::new(Memory),
    ));
    trials.extend(trial::contract_heeds(
        "memory",
        Needs::Nothing,
        Arc::new(Memory),
    ));
    trials.extend(trial::contract_limits(
        "memory",
        Needs::Nothing,
        Arc::new(Memory),
    ));
    trials.extend(trial::contract(
        "private_memory",
        Needs::Nothing,
        Arc::new(Private::new(Memory, SECRET)),
    ));
    trials.extend(trial::contract_leases(
        "private_memory",
        Needs::Nothing,
        Arc::new(Private::new(Memory, SECRET)),
    ));
    trials.extend(trial::contract_heeds(
        "private_memory",
        Needs::Nothing,
        Arc::new(Private::new(Memory, SECRET)),
    ));
    trial::run(trials, ())
}
