//! What an operator sees of a budget in this process: the calls waiting
//! per budget key, and the keys closed by the provider's word (feature
//! `operator`).

use std::sync::Arc;
use std::time::Duration;

use crate::key::Key;

use super::heard::Heard;
use super::line::Lines;

/// A budget's state in this process, shared with its layer.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub(crate) name: Arc<str>,
    pub(crate) lines: Arc<Lines>,
    pub(crate) heard: Arc<Heard>,
}

impl Watch {
    /// The calls waiting per budget key, its line's head included.
    pub(crate) fn waiting(&self) -> Vec<(Key, usize)> {
        self.lines.waiting_by_key()
    }

    /// The keys this process holds closed, and for how long from now.
    pub(crate) fn closed(&self) -> Vec<(Key, Duration)> {
        self.heard.closed_keys()
    }
}
