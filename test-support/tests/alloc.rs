//! The counting allocator, installed: bytes, peak and per-thread call counts follow what the test
//! allocates.

use tollgate_test_support::alloc::{
    CountingAlloc, allocated_bytes, count_allocations, live_bytes, peak_bytes, reset_peak,
    start_counting,
};

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

#[test]
fn counts_bytes_peak_and_this_threads_calls() {
    let base = live_bytes();
    reset_peak();
    let (block, calls) = count_allocations(|| vec![0u8; 1 << 20]);
    assert_eq!(calls, 1);
    // Other test threads may allocate meanwhile, but none holds a megabyte.
    assert!(live_bytes() >= base + (1 << 20));
    assert!(peak_bytes() >= base + (1 << 20));
    assert!(allocated_bytes().is_some());
    drop(block);
    assert!(live_bytes() < base + (1 << 20));
    assert!(peak_bytes() >= base + (1 << 20));

    // Nested counts: the inner sees its own call, the outer both.
    let outer = start_counting();
    let (boxed, inner) = count_allocations(|| Box::new(7u64));
    let other = Box::new(8u64);
    assert_eq!(inner, 1);
    assert_eq!(outer.finish(), 2);
    // Another thread's allocations are not this thread's.
    let count = start_counting();
    std::thread::scope(|s| {
        s.spawn(|| drop(vec![1u8; 64]));
    });
    let spawned = count.finish();
    assert_eq!(*boxed + *other, 15);
    // Spawning allocates on this thread (the thread's handle), the vector on the other one.
    assert!(spawned < 10, "{spawned}");
}
