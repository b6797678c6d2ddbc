//! A counting global allocator, so keyed runs can report bytes per key.
//!
//! The binary installs it with `#[global_allocator]`; [`allocated_bytes`] then reads the live heap
//! size. It adds one relaxed `fetch_add`/`fetch_sub` per allocation and nothing on paths that do not
//! allocate (every Tollgate decision path).

use std::alloc::{GlobalAlloc, Layout, System};

use crate::sync::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters only observe sizes.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we forward unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            // Relaxed: a statistic; it orders nothing else. INSTALLED tells readers the counter is live.
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            INSTALLED.store(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            // Relaxed: a statistic (see `alloc`).
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            INSTALLED.store(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was returned by this allocator (so by `System`) with `layout`, per the contract.
        unsafe { System.dealloc(ptr, layout) };
        // Relaxed: a statistic (see `alloc`).
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, forwarded unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Relaxed: a statistic (see `alloc`).
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Live heap bytes, or `None` when [`CountingAlloc`] is not the global allocator (as in unit tests).
pub fn allocated_bytes() -> Option<usize> {
    // Relaxed: a statistic read between single-threaded measurement steps.
    (INSTALLED.load(Ordering::Relaxed) == 1).then(|| LIVE.load(Ordering::Relaxed))
}
