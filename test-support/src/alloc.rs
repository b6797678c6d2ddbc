//! A counting global allocator: the system allocator, plus live and peak heap bytes (all threads) and
//! the number of allocator calls (allocations and frees) the current thread makes inside
//! [`count_allocations`].
//!
//! Install it in a binary, bench or integration test (one per program):
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: tollgate_test_support::alloc::CountingAlloc =
//!     tollgate_test_support::alloc::CountingAlloc;
//! ```
//!
//! Cost: a relaxed `fetch_add` and `fetch_max` per allocation (a `fetch_sub` per free), one
//! thread-local read, and nothing on paths that do not allocate (every Tollgate decision path).
//! Every counter is `Relaxed`: they are statistics that order nothing else, read by the thread that
//! measures after the work it measures (or after joining the threads that did it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // `const`, no destructor: safe to touch from inside the allocator (no lazy init that allocates).
    static COUNTING: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The system allocator, counting (see the [module docs](self)).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

fn grew(bytes: usize) {
    // Relaxed: statistics (see the module docs).
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed).wrapping_add(bytes);
    PEAK.fetch_max(live, Ordering::Relaxed);
    INSTALLED.store(1, Ordering::Relaxed);
}

fn called() {
    // `try_with`: during thread teardown the slot may be gone; such calls are not counted.
    let _ = COUNTING.try_with(|count| {
        if let Some(n) = count.get() {
            count.set(Some(n + 1));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters only observe sizes, and the thread-local never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        called();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we forward unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        called();
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        called();
        // SAFETY: `ptr` was returned by this allocator (so by `System`) with `layout`, per the contract.
        unsafe { System.dealloc(ptr, layout) };
        // Relaxed: a statistic.
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        called();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, forwarded unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            grew(new_size);
            // Relaxed: a statistic.
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Live heap bytes, or `None` when [`CountingAlloc`] is not the global allocator (nothing has been
/// counted yet).
pub fn allocated_bytes() -> Option<usize> {
    // Relaxed: a statistic.
    (INSTALLED.load(Ordering::Relaxed) == 1).then(live_bytes)
}

/// Live heap bytes (0 when [`CountingAlloc`] is not installed).
pub fn live_bytes() -> usize {
    // Relaxed: a statistic.
    LIVE.load(Ordering::Relaxed)
}

/// The most live heap bytes seen since the last [`reset_peak`] (or the start).
pub fn peak_bytes() -> usize {
    // Relaxed: a statistic.
    PEAK.load(Ordering::Relaxed)
}

/// Restarts [`peak_bytes`] from the current live bytes.
pub fn reset_peak() {
    // Relaxed: a statistic, reset between single-threaded measurement steps.
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Starts counting the allocator calls (`alloc`, `alloc_zeroed`, `realloc`, `dealloc`) the calling
/// thread makes, until [`AllocationCount::finish`]: zero means it neither allocated nor freed. Other threads' allocations are not counted; nothing is
/// counted when [`CountingAlloc`] is not installed. Counts nest: an inner count sees its own part only
/// and adds it to the outer one when finished.
///
/// ```
/// let count = tollgate_test_support::alloc::start_counting();
/// let sum: u64 = (1..=10).sum(); // allocates nothing
/// assert_eq!(count.finish(), 0);
/// # assert_eq!(sum, 55);
/// ```
#[must_use = "finish() reads the count"]
pub fn start_counting() -> AllocationCount {
    AllocationCount {
        outer: COUNTING.with(|count| count.replace(Some(0))),
    }
}

/// A running count of the calling thread's allocation calls (see [`start_counting`]). Not `Send`:
/// it must finish on the thread that started it.
#[derive(Debug)]
pub struct AllocationCount {
    outer: Option<usize>,
}

impl AllocationCount {
    /// Stops counting and returns the number of allocation calls made since [`start_counting`].
    pub fn finish(self) -> usize {
        let inner = COUNTING.with(Cell::get).unwrap_or(0);
        COUNTING.with(|count| count.set(self.outer.map(|n| n + inner)));
        inner
    }
}

/// Runs `f` and returns its result with the number of allocation calls the calling thread made
/// meanwhile (as [`start_counting`]).
pub fn count_allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let count = start_counting();
    let value = f();
    (value, count.finish())
}
