//! Tollgate's load generator and accuracy harness, behind the `tollgate-bench` binary.
//!
//! ```text
//! cargo run --release -p tollgate-loadgen                 # the default suite -> report/
//! cargo run --release -p tollgate-loadgen -- --impls gcra,governor --keys zipf:100000:1.1 --threads 1,2,4
//! cargo run --release -p tollgate-loadgen -- accuracy     # the accuracy table -> report/accuracy.md
//! ```
//!
//! # What a run measures, and how
//! Each implementation ([`targets::Impl`]) is built once per run and shared by `N` worker threads,
//! pinned to cores with `core_affinity` when `N` ≤ cores (otherwise unpinned and flagged
//! *oversubscribed* in every output). Threads start together on a `Barrier`, run a warm-up, then are
//! measured until an `AtomicU8` phase flag says stop. Every thread cycles through its own
//! pregenerated key stream, so no random number is drawn on the timed path.
//!
//! **Key streams cover the key space.** A stream is at least `--stream-len` keys (64 Ki by default)
//! and is built by apportioning, then shuffling ([`keys::KeyDist::stream`]): `uniform:K` holds every
//! key equally often (at least once, so `uniform:1000000` touches all 1 M keys per pass), `zipf:K:S`
//! holds about `8 × K` keys, each key its rounded Zipf share and at least once. Each record carries
//! `stream_len` and `stream_keys` (distinct keys in the stream), so the coverage is in the results.
//!
//! **Keyed tables are prefilled.** Before the warm-up every key of the scenario's key space is decided
//! once (`prefilled` in the record), for Tollgate's and governor's keyed limiters alike: no
//! first-touch insert falls in the measured time, and in deny mode every measured decision is a
//! denial of a key already held.
//!
//! **Repetitions.** `--repeat N` runs the whole plan N times, interleaved (forwards, then backwards,
//! ...), and each row reports the repetition with the median ns/decision, listing all of them in
//! `ns_per_decision_runs`: on a shared machine one run of a row can land on a bad moment.
//!
//! **ns/decision (closed loop).** A decision costs a few nanoseconds, about what reading the clock
//! costs, so decisions are timed in batches: one `quanta` raw (TSC) read before and after each batch
//! of 64 decisions. The two reads cost about 10–40 ns together, so per decision they add well under
//! 1 ns (a 64th of it), and the loop's own cost (loading the next key) is included, as it would be in
//! a caller. `ns/decision` is the median batch duration ÷ decisions per batch, per thread: on a
//! shared machine a batch that the scheduler interrupts lasts milliseconds, and the median ignores
//! those while the mean (`ns_per_decision_mean`, also reported) does not. `decisions/s` adds up all
//! threads' decisions over their measured wall time, interference included.
//!
//! **Latency percentiles.** After each batch, one more decision is timed alone: TSC read, decide, TSC
//! read. The median cost of a back-to-back pair of reads is calibrated at start-up (100 000 pairs)
//! and subtracted from every sample; the overhead is printed and written to the report header
//! (`timer_overhead_ns`). So percentiles come from one sample per 65 decisions — over a million per
//! second of run — and their floor is the timer's resolution: values of a few ns are "about one
//! clock read", not exact. Samples go into a per-thread `hdrhistogram` (1 ns – 100 s, 3 significant
//! digits), merged after the run. Without an invariant TSC quanta falls back to the OS clock; the
//! header says which was used. On a virtual machine the TSC may tick coarsely (the committed run's
//! samples come in steps of 10 ns), which quantises the percentiles, not the batch means.
//!
//! **The floors.** The `clock_only` row reads the clock and decides nothing: every other row's
//! ns/decision includes that one clock read, so the difference is the limiter's own cost. The
//! `cas_floor` row is the least a correct one-word lock-free limiter does: the clock read, one load
//! of a padded word and, when admitting, one compare-and-swap; no quota arithmetic, no result
//! beyond a boolean. `--clock fixed` gives every limiter (Tollgate's and the peers') a
//! caller-supplied instant, read from a plain field ([`targets::FixedClock`]): what
//! `check_at(now, ..)` costs at a precomputed `now`, the limiter's own cost with no clock read.
//! The report's ratio table divides each Tollgate row by governor's in the same run and shows the
//! floor's ratio beside it.
//!
//! **Open loop.** With `--loop open` (or one run per implementation under the default `both`) every
//! thread issues decisions on a fixed schedule (`rate / threads` per second each), times each one,
//! and records it with `record_correct(sample, interval)`, so a stall that delays the schedule also
//! counts the requests that would have waited behind it (coordinated-omission correction).
//!
//! **Quotas.** `allow` gives each implementation the most generous per-second quota it represents
//! (GCRA 10^9/s; window counters cap their limit by their packed layout, e.g. the sliding window at
//! 16 383/s, so on one key they mostly deny — the allowed fraction column shows it); `deny` gives
//! one per hour, so after the first request every decision is a denial (the read-only path). Peers
//! read the same clock as Tollgate through an adapter ([`targets::SharedClock`]) so clock cost is
//! equal; `--clock coarse` switches everyone to a cached 1 ms clock, `--clock fixed` to a given
//! instant.
//!
//! **Bytes per key.** Keyed runs report heap bytes per key: with [`alloc::CountingAlloc`] as the
//! global allocator (the binary installs it), a fresh limiter is built and each of the `K` keys is
//! touched once; (live bytes after − before construction) ÷ `K`.
//!
//! # Outputs
//! `--out DIR` (default `report/`, git-ignored): `suite.json` (header with command, commit, CPU,
//! cores, date, timer overhead, load average; one record per implementation × scenario × threads),
//! `report.md`, and SVG plots (`ns_per_decision.svg`, `latency_percentiles.svg`,
//! `throughput_vs_threads.svg`). `--json PATH` writes the JSON to a second place too. The accuracy
//! mode writes `accuracy.md` and `accuracy.json` (see [`accuracy`]).

pub mod accuracy;
pub mod alloc;
pub mod cli;
pub mod keys;
pub mod machine;
pub mod progress;
pub mod report;
pub mod runner;
pub mod suite;
mod sync;
pub mod targets;
