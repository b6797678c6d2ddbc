//! The one place that names the atomics and locks this crate uses.
//!
//! Built normally this re-exports `std` and wraps [`portable_atomic::AtomicU128`] (a real 128-bit
//! atomic: `cmpxchg16b` on x86_64, with 16-byte SSE loads where the CPU guarantees their atomicity);
//! built with `RUSTFLAGS="--cfg tollgate_loom"` it re-exports loom's model-checked doubles.
//!
//! Loom has no 128-bit atomic, so under loom [`AtomicPair`] is a loom `AtomicUsize` holding the
//! index of the cell's current value in an append-only list of the values ever stored in it: each
//! load and compare-and-swap is one loom access with the caller's orderings, so loom explores stale
//! reads and checks the happens-before edges the slot protocol claims (a mutex, as this shim once
//! was, adds edges of its own and hid every ordering). The list is behind a `std` mutex, invisible to
//! loom and never held across a loom operation. Likewise [`OnceLock`] is, under loom, `std`'s
//! `OnceLock` gated by a loom `AtomicBool` (`Release` on set, `Acquire` on get), so a reader that
//! sees an override tier without the edge that publishes its quota is visible to the models.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, AtomicUsize, Ordering},
};

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard, OnceLock,
    atomic::{AtomicU64, AtomicUsize, Ordering},
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
    /// Atomically reads all 16 bytes.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> u128 {
        self.0.load(order)
    }

    /// `len` cells holding 0, from zeroed memory: for a large table that is fresh, untouched pages
    /// from the OS, and on Linux the range is advised for transparent huge pages before first touch
    /// (one TLB entry per 2 MiB instead of per 4 KiB on the random-access decision path). `None`
    /// when the allocator cannot provide it (or `len × 16` overflows the address space): the caller
    /// reports a typed error instead of the process aborting.
    pub(crate) fn zeroed_slice(len: usize) -> Option<Box<[AtomicPair]>> {
        if len == 0 {
            return Some(Box::new([]));
        }
        let layout = std::alloc::Layout::array::<AtomicPair>(len).ok()?;
        // SAFETY: `layout` has a non-zero size (len > 0, size_of::<AtomicPair>() == 16).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicPair>();
        if ptr.is_null() {
            return None;
        }
        advise_huge_pages(ptr.cast::<u8>(), layout.size());
        // SAFETY: `ptr` was just allocated by the global allocator with `Layout::array::<AtomicPair>(len)`,
        // which is exactly the layout `Box<[AtomicPair]>` of length `len` frees with; its bytes are all
        // zero, and an all-zero `AtomicU128` is a valid cell holding 0 (the empty slot).
        Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
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

/// A 16-byte cell read and compare-and-swapped as one unit (loom model: a loom atomic index into
/// the values stored so far; see the module docs).
#[cfg(tollgate_loom)]
#[derive(Debug)]
pub(crate) struct AtomicPair {
    /// Index into `values.0` of the cell's current value.
    current: AtomicUsize,
    /// Every value ever stored (append-only), and the index the last successful exchange installed.
    values: std::sync::Mutex<(Vec<u128>, usize)>,
}

#[cfg(tollgate_loom)]
impl AtomicPair {
    /// A cell holding `value`.
    pub(crate) fn new(value: u128) -> Self {
        AtomicPair {
            current: AtomicUsize::new(0),
            values: std::sync::Mutex::new((vec![value], 0)),
        }
    }

    /// `len` cells holding 0 (models use small tables: never `None`).
    pub(crate) fn zeroed_slice(len: usize) -> Option<Box<[AtomicPair]>> {
        Some((0..len).map(|_| AtomicPair::new(0)).collect())
    }

    fn values(&self) -> std::sync::MutexGuard<'_, (Vec<u128>, usize)> {
        self.values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Atomically reads all 16 bytes.
    pub(crate) fn load(&self, order: Ordering) -> u128 {
        let index = self.current.load(order);
        self.values().0[index]
    }

    /// Replaces the cell with `new` iff it holds `current`; on failure returns what it held. The
    /// value is compared, not the index: two stores of one value are distinct indices.
    ///
    /// One loom compare-and-swap, with the caller's orderings, and no other loom access: a plain
    /// load before it (with any ordering) made loom miss stale reads by threads that read this
    /// exchange's value (found with a message-passing probe: load + Release CAS in the writer, a
    /// Relaxed reader, and loom never showed the reader an older flag). Loom runs one thread at a
    /// time, so the last installed index is what an exchange now would read, unless another thread
    /// runs between our look-up and our exchange: then the exchange fails and we go again.
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        let mut expected = self.values().1;
        loop {
            let (attempt, next) = {
                let mut values = self.values();
                if values.0[expected] == current {
                    values.0.push(new);
                    (expected, values.0.len() - 1)
                } else {
                    // A value mismatch: still one loom exchange, one that cannot succeed (no index
                    // is usize::MAX), so the value is read as a failed exchange reads it: the
                    // latest, with the failure ordering.
                    (usize::MAX, usize::MAX)
                }
            };
            match self
                .current
                .compare_exchange(attempt, next, success, failure)
            {
                Ok(_) => {
                    self.values().1 = next;
                    return Ok(current);
                }
                Err(found) => {
                    let value = self.values().0[found];
                    if value != current {
                        return Err(value);
                    }
                    expected = found;
                }
            }
        }
    }
}

/// `std::sync::OnceLock` as far as this crate uses it (`new`, `get`, `set`), its publication made
/// visible to loom (see the module docs).
#[cfg(tollgate_loom)]
#[derive(Debug)]
pub(crate) struct OnceLock<T> {
    ready: loom::sync::atomic::AtomicBool,
    value: std::sync::OnceLock<T>,
}

#[cfg(tollgate_loom)]
impl<T> OnceLock<T> {
    /// An empty cell.
    pub(crate) fn new() -> Self {
        OnceLock {
            ready: loom::sync::atomic::AtomicBool::new(false),
            value: std::sync::OnceLock::new(),
        }
    }

    /// The value, if set and published to this thread.
    pub(crate) fn get(&self) -> Option<&T> {
        // Acquire: as std's OnceLock::get, pairs with the Release in `set`.
        if self.ready.load(Ordering::Acquire) {
            self.value.get()
        } else {
            None
        }
    }

    /// Sets the value if empty; otherwise gives `value` back.
    pub(crate) fn set(&self, value: T) -> Result<(), T> {
        self.value.set(value)?;
        // Release: as std's OnceLock initialisation.
        self.ready.store(true, Ordering::Release);
        Ok(())
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
