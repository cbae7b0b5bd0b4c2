//! The in-flight cap, [`InFlightLayer`](crate::InFlightLayer): at most N
//! requests in flight per key, across every instance on one store, each
//! holding a slot on a lease (see [requests in flight](crate::backend#requests-in-flight)
//! for the store's side). Its settings and service (`layer.rs`), and a held
//! slot: the layer's shared state with the task that extends the leases,
//! the guard that gives a slot back, and the answer's body that holds it
//! (`slot.rs`).

mod capped;
pub(crate) mod layer;
pub(crate) mod slot;

pub use crate::cost::leased::Leased;
pub use layer::{InFlightFuture, InFlightLimit};
