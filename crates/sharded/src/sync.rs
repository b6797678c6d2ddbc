//! The one place that names the atomics and locks this crate uses.
//!
//! Built normally this re-exports `std` and wraps [`portable_atomic::AtomicU128`] (a real 128-bit
//! atomic: `cmpxchg16b` on x86_64, with 16-byte SSE loads where the CPU guarantees their atomicity);
//! built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports loom's model-checked doubles. Loom has no
//! 128-bit atomic, so under loom [`AtomicPair`] is a `loom::sync::Mutex<u128>`: a linearizable cell with
//! the same `load`/`compare_exchange` API, whose every access is a scheduling point loom explores. That
//! models the real type's guarantees (each access is atomic and all accesses to one cell are totally
//! ordered) though not its weaker-than-lock ordering; the slot protocol never relies on more than
//! per-cell linearizability plus the Acquire/Release pairing described in `table.rs`.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};

/// Locks `mutex`, ignoring poisoning: every critical section in this crate leaves the table
/// consistent before anything in it can panic (it only runs pure algorithm code and atomics).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A 16-byte cell read and compare-and-swapped as one unit.
#[cfg(not(tollgate_loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct AtomicPair(portable_atomic::AtomicU128);

#[cfg(not(tollgate_loom))]
impl AtomicPair {
    /// A cell holding `value`.
    pub(crate) const fn new(value: u128) -> Self {
        AtomicPair(portable_atomic::AtomicU128::new(value))
    }

    /// Atomically reads all 16 bytes.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> u128 {
        self.0.load(order)
    }

    /// `len` cells holding 0, from zeroed memory: for a large table that is fresh, untouched pages
    /// from the OS, and on Linux the range is advised for transparent huge pages before first touch
    /// (one TLB entry per 2 MiB instead of per 4 KiB on the random-access decision path).
    pub(crate) fn zeroed_slice(len: usize) -> Box<[AtomicPair]> {
        if len == 0 {
            return Box::new([]);
        }
        let Ok(layout) = std::alloc::Layout::array::<AtomicPair>(len) else {
            // Callers bound `len × 16` by `isize::MAX` first; this is unreachable.
            return (0..len).map(|_| AtomicPair::new(0)).collect();
        };
        // SAFETY: `layout` has a non-zero size (len > 0, size_of::<AtomicPair>() == 16).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicPair>();
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        advise_huge_pages(ptr.cast::<u8>(), layout.size());
        // SAFETY: `ptr` was just allocated by the global allocator with `Layout::array::<AtomicPair>(len)`,
        // which is exactly the layout `Box<[AtomicPair]>` of length `len` frees with; its bytes are all
        // zero, and an all-zero `AtomicU128` is a valid cell holding 0 (the empty slot).
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) }
    }

    /// Replaces the cell with `new` iff it holds `current`; on failure returns what it held.
    #[inline]
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

/// A 16-byte cell read and compare-and-swapped as one unit (loom model: a mutex-guarded `u128`).
#[cfg(tollgate_loom)]
#[derive(Debug)]
pub(crate) struct AtomicPair(loom::sync::Mutex<u128>);

#[cfg(tollgate_loom)]
impl AtomicPair {
    /// A cell holding `value`.
    pub(crate) fn new(value: u128) -> Self {
        AtomicPair(loom::sync::Mutex::new(value))
    }

    /// `len` cells holding 0.
    pub(crate) fn zeroed_slice(len: usize) -> Box<[AtomicPair]> {
        (0..len).map(|_| AtomicPair::new(0)).collect()
    }

    /// Atomically reads all 16 bytes.
    pub(crate) fn load(&self, _order: Ordering) -> u128 {
        *lock(&self.0)
    }

    /// Replaces the cell with `new` iff it holds `current`; on failure returns what it held.
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        _success: Ordering,
        _failure: Ordering,
    ) -> Result<u128, u128> {
        let mut cell = lock(&self.0);
        if *cell == current {
            *cell = new;
            Ok(current)
        } else {
            Err(*cell)
        }
    }
}

/// Asks the CPU to start fetching the cache line holding `cell`, without waiting for it: a lookup
/// issued a few keys ahead then finds its slot already in cache, so several lookups' memory latency
/// overlaps. A hint only: x86_64 `prefetcht0`; elsewhere (and under loom) nothing.
#[inline]
pub(crate) fn prefetch<T>(cell: &T) {
    #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
    // SAFETY: `prefetcht0` never faults and writes nothing; `cell` is a valid reference anyway.
    // (`allow`: newer toolchains make this intrinsic safe to call, older ones do not.)
    #[allow(unused_unsafe)]
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(cell).cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(tollgate_loom))))]
    let _ = cell;
}

/// Advises the kernel to back the 2 MiB-aligned interior of `[ptr, ptr + len)` with transparent huge
/// pages (`MADV_HUGEPAGE`; effective when THP is in `madvise` or `always` mode). Advisory only: any
/// failure is ignored and changes nothing but speed.
#[cfg(all(target_os = "linux", not(tollgate_loom)))]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = ptr.addr().next_multiple_of(HUGE);
    let end = (ptr.addr() + len) & !(HUGE - 1);
    if end > start {
        // SAFETY: `[start, end)` lies inside an allocation we own and have not yet touched; madvise
        // with MADV_HUGEPAGE only changes how the kernel backs those pages, never their contents.
        unsafe {
            libc::madvise(
                ptr.with_addr(start).cast::<libc::c_void>(),
                end - start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

#[cfg(all(not(target_os = "linux"), not(tollgate_loom)))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}
