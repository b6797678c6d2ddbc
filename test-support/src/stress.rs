//! Round-based std-threads stress harness.
//!
//! Each round: the calling thread runs `before(round)`, which prepares the round (typically moves a
//! [`ManualClock`] to the round's frozen instant) and returns the exact number of units the round must
//! admit; then `threads` fresh worker threads, released together by a start gate, each run
//! `work(round, thread)` and report how many units they admitted; the sum must equal the expectation.
//! The first round that does not stops the run and is returned as a [`Mismatch`].
//!
//! Why this catches a broken compare-and-swap: every worker hammers the same state word at once, so a
//! read-modify-write that is not atomic loses updates and the round admits more than it may. The
//! gate maximises overlap; with more threads than cores the scheduler also preempts workers between
//! their load and their store. Rounds are bounded (no time limit), so a correct implementation always
//! runs the same amount of work.
//!
//! [`ManualClock`]: https://docs.rs/tollgate-core/latest/tollgate_core/struct.ManualClock.html

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// How many threads and rounds a stress run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stress {
    /// Worker threads per round (besides the calling thread, which only prepares and tallies).
    pub threads: usize,
    /// Rounds to run when every round matches.
    pub rounds: usize,
}

impl Stress {
    /// The default used by the workspace's stress tests: 8 threads (more than the 2 cores of the CI
    /// machine, so workers are also preempted mid-update) and 200 rounds.
    pub const DEFAULT: Stress = Stress {
        threads: 8,
        rounds: 200,
    };
}

impl Default for Stress {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A round whose total differed from its expectation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The round (0-based).
    pub round: usize,
    /// What the workers admitted in total.
    pub admitted: u64,
    /// What the round had to admit.
    pub expected: u64,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {}: admitted {} units, expected exactly {}",
            self.round, self.admitted, self.expected
        )
    }
}

impl std::error::Error for Mismatch {}

/// Runs `stress.rounds` rounds (see the [module docs](self)); `Err` at the first mismatching round.
///
/// `before(round)` runs on the calling thread while every worker waits, and returns the round's
/// expected total; `work(round, thread)` runs on worker `thread` (`0..stress.threads`) and returns
/// what it admitted. Everything `before` wrote happens-before every `work` of the round (the spawns),
/// and every `work` of a round happens-before the next `before` (the joins).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tollgate_test_support::stress::{Stress, run};
///
/// // A correct "limiter": a counter that admits while below 10.
/// let used = AtomicU64::new(0);
/// let result = run(
///     Stress { threads: 4, rounds: 20 },
///     |_| {
///         used.store(0, Ordering::Relaxed);
///         10
///     },
///     |_, _| {
///         (0..10)
///             .filter(|_| {
///                 used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < 10).then_some(n + 1))
///                     .is_ok()
///             })
///             .count() as u64
///     },
/// );
/// assert_eq!(result, Ok(()));
/// ```
///
/// # Panics
/// If `stress.threads` is 0, or if `before` or a worker panics.
pub fn run(
    stress: Stress,
    mut before: impl FnMut(usize) -> u64,
    work: impl Fn(usize, usize) -> u64 + Sync,
) -> Result<(), Mismatch> {
    assert!(stress.threads > 0, "a stress run needs at least one thread");
    // One run at a time per process: the test harness runs tests in parallel, and two runs sharing
    // the cores would mostly take turns instead of overlapping their own workers. A panicking run
    // poisons the lock; the next run may still go (the lock guards no data).
    let _exclusive = EXCLUSIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for round in 0..stress.rounds {
        let expected = before(round);
        let admitted = hammer_once(stress.threads, |thread| work(round, thread));
        if admitted != expected {
            return Err(Mismatch {
                round,
                admitted,
                expected,
            });
        }
    }
    Ok(())
}

/// Spawns `threads` fresh threads that start `work(thread)` together and returns the sum of what they
/// returned.
///
/// Fresh threads each round, not a pool parked on a barrier between rounds: the scheduler spreads new
/// threads over the cores, while threads woken together from a barrier tended to be woken onto the
/// waker's core and run one after the other (measured on the 2-core machine: with a barrier pool a
/// lost update was caught in round 0 and then never again).
fn hammer_once(threads: usize, work: impl Fn(usize) -> u64 + Sync) -> u64 {
    // Relaxed: the scope's joins order everything; `ready` is a start gate only.
    let ready = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (ready, work) = (&ready, &work);
                scope.spawn(move || {
                    // Start gate: begin only once every worker is running, so the work overlaps even
                    // when starting a thread takes longer than one worker's share.
                    ready.fetch_add(1, Ordering::Relaxed);
                    while ready.load(Ordering::Relaxed) < threads {
                        std::thread::yield_now();
                    }
                    work(thread)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .sum()
    })
}

/// [`run`] with [`Stress::DEFAULT`], panicking with the mismatch (for `#[test]`s).
///
/// # Panics
/// At the first round whose total differs from its expectation.
#[track_caller]
pub fn assert_exact_every_round(
    before: impl FnMut(usize) -> u64,
    work: impl Fn(usize, usize) -> u64 + Sync,
) {
    if let Err(mismatch) = run(Stress::DEFAULT, before, work) {
        panic!("{mismatch}");
    }
}
