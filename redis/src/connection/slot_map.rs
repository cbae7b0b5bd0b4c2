//! Which master serves each Redis Cluster slot, read from `CLUSTER SLOTS`:
//! the breakers go by master with it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use ::redis::Value;

use super::slot::CLUSTER_SLOTS;

/// How often a Cluster's slot map is read again (on a command).
pub(crate) const MAP_REFRESH: Duration = Duration::from_secs(5);

/// The longest a background `CLUSTER SLOTS` may take: a later reply is
/// dropped, since the node that sent it was silent (`SIGSTOP`, a long
/// pause) and answers with the map it had before, which may give its old
/// slots back to it after its replica took over.
pub(crate) const MAP_REPLY_BOUND: Duration = Duration::from_secs(1);

/// Masters the map tells apart; past that, a slot has no known master.
pub(crate) const MAX_NODES: usize = 128;

/// No master known for the slot.
const UNKNOWN: u8 = u8::MAX;

/// The masters of a Cluster, and which one serves each slot.
#[derive(Debug)]
pub(crate) struct SlotMap {
    /// Which master serves each slot, as an index into `masters`
    /// ([`UNKNOWN`] until known).
    owners: Box<[AtomicU8]>,
    /// The masters' addresses, the first [`MAX_NODES`] seen, in the order
    /// they were first seen.
    masters: Mutex<Vec<String>>,
    /// When the map was last asked for, in the caller's milliseconds; 0
    /// never.
    asked_at: AtomicU64,
    /// When the reply last taken in was asked for, in the same
    /// milliseconds: a reply to an earlier question is older news.
    taken_ask: AtomicU64,
}

impl SlotMap {
    /// A map that knows no master yet.
    pub(crate) fn new() -> Self {
        Self {
            owners: (0..CLUSTER_SLOTS).map(|_| AtomicU8::new(UNKNOWN)).collect(),
            masters: Mutex::new(Vec::new()),
            asked_at: AtomicU64::new(0),
            taken_ask: AtomicU64::new(0),
        }
    }

    /// The master that serves `slot` (an index below [`MAX_NODES`]), if
    /// known.
    pub(crate) fn master(&self, slot: u16) -> Option<usize> {
        match self.owners[usize::from(slot)].load(Ordering::Relaxed) {
            UNKNOWN => None,
            node => Some(usize::from(node)),
        }
    }

    /// The address of master `index`, if known.
    pub(crate) fn address(&self, index: usize) -> Option<String> {
        let masters = self.masters.lock().unwrap_or_else(|e| e.into_inner());
        masters.get(index).cloned()
    }

    /// Whether the map is due to be read at `now_ms` (at least 1), and now
    /// taken to be read: true for one caller only.
    pub(crate) fn due(&self, now_ms: u64) -> bool {
        let last = self.asked_at.load(Ordering::Relaxed);
        let refresh = u64::try_from(MAP_REFRESH.as_millis()).unwrap_or(u64::MAX);
        (last == 0 || now_ms.saturating_sub(last) >= refresh)
            && self
                .asked_at
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The map was not asked for after all: it is due again.
    pub(crate) fn not_asked(&self) {
        self.asked_at.store(0, Ordering::Relaxed);
    }

    /// Take in a `CLUSTER SLOTS` reply to a question asked at `asked_ms`
    /// (the caller's milliseconds, as [`due`](Self::due) takes them): each
    /// entry is `[start, end, [host, port, ...], replicas...]`. Gives the
    /// slots that changed masters, one slot for each (former master, new
    /// master) pair: `(slot, from, to)`.
    ///
    /// A reply to a question asked before the one whose reply was last
    /// taken changes nothing: a node that was silent (`SIGSTOP`, a long
    /// pause) answers the questions queued on it when it wakes, with the
    /// map it had before its replica took over, and that map must not
    /// point its old slots back at it.
    pub(crate) fn take(&self, reply: &Value, asked_ms: u64) -> Vec<(u16, usize, usize)> {
        let mut moved: Vec<(u16, usize, usize)> = Vec::new();
        let Value::Array(entries) = reply else {
            return moved;
        };
        let mut masters = self.masters.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock: replies are taken one at a time, in the order
        // of their questions.
        if asked_ms < self.taken_ask.load(Ordering::Relaxed) {
            return moved;
        }
        self.taken_ask.store(asked_ms, Ordering::Relaxed);
        for entry in entries {
            let Value::Array(fields) = entry else {
                continue;
            };
            let [Value::Int(start), Value::Int(end), Value::Array(master), ..] = fields.as_slice()
            else {
                continue;
            };
            let [host, Value::Int(port), ..] = master.as_slice() else {
                continue;
            };
            let host = match host {
                Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
                Value::SimpleString(host) => host.clone(),
                _ => continue,
            };
            let address = format!("{host}:{port}");
            let index = match masters.iter().position(|m| *m == address) {
                Some(index) => index,
                None if masters.len() < MAX_NODES => {
                    masters.push(address);
                    masters.len() - 1
                }
                None => usize::from(UNKNOWN),
            };
            let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
                continue;
            };
            let owner = u8::try_from(index).unwrap_or(UNKNOWN);
            for slot in start..=end.min(CLUSTER_SLOTS - 1) {
                let before = self.owners[usize::from(slot)].swap(owner, Ordering::Relaxed);
                if before != UNKNOWN
                    && owner != UNKNOWN
                    && before != owner
                    && !moved
                        .iter()
                        .any(|&(_, f, t)| (f, t) == (usize::from(before), usize::from(owner)))
                {
                    moved.push((slot, usize::from(before), usize::from(owner)));
                }
            }
        }
        moved
    }
}
