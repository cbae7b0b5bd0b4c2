//! The system allocator, counting the allocations it is asked to count: the
//! one global allocator of the allocation benchmarks (`allocs.rs`,
//! `app_allocs.rs`), each of which says which allocations count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `System`, with a count of the allocations (and reallocations) for which
/// `counted` answers true.
pub struct Counting {
    pub counted: fn() -> bool,
}

/// Allocations counted so far.
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// While set, each counted allocation prints a backtrace (`ALLOCS_TRACE`).
pub static TRACE: AtomicBool = AtomicBool::new(false);

/// Allocations counted so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

impl Counting {
    fn count(&self) {
        if !(self.counted)() {
            return;
        }
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // Off while the backtrace is written: it allocates too.
        if TRACE.swap(false, Ordering::Relaxed) {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
            TRACE.store(true, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; only a counter is
// added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count();
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}
