//! A long log streams in bounded memory: a lazily generated stream of 160 000 lines (spanning
//! 1 600 s, 30 000 distinct users, long keys and over-long lines among them) is replayed in two
//! halves; what the replay keeps never passes [`Replay::retained_bound`], every bound is reached,
//! and the heap (counted by this test's allocator) does not grow over the second half.
//!
//! One test in this file on purpose: the allocator counts the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufReader, Read};
use std::sync::atomic::{AtomicIsize, Ordering};

use tollgate_policy::PolicyConfig;
use tollgate_replay::{Format, LineError, Replay, ReplayBounds};

/// Live heap bytes.
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting live bytes.
struct Counting;

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged, so `System`'s
// guarantees hold; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's `layout` contract is `System::alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            // Relaxed: a statistic read by the test's own thread after the work it measures; it
            // orders nothing else.
            LIVE.fetch_add(size(layout.size()), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through `alloc`/`realloc` above) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        // Relaxed: as in `alloc`.
        LIVE.fetch_sub(size(layout.size()), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract (`ptr` from this allocator with `layout`, `new_size`
        // valid) is `System::realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Relaxed: as in `alloc`.
            LIVE.fetch_add(size(new_size) - size(layout.size()), Ordering::Relaxed);
        }
        p
    }
}

fn size(bytes: usize) -> isize {
    isize::try_from(bytes).unwrap_or(isize::MAX)
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Lines per half.
const HALF: u64 = 80_000;
/// Every this many lines, one longer than the line bound (4 096 bytes).
const TOO_LONG_EVERY: u64 = 5_000;
/// Every this many lines, a user whose key is 600 bytes (longer than the key bound, 64).
const LONG_KEY_EVERY: u64 = 7_000;

/// JSON lines `from..to`, made as they are read: line `i` at 10 ms × `i`, user `u{i % 30 000}`
/// on `/api`.
struct Synthetic {
    next: u64,
    to: u64,
    line: Vec<u8>,
    at: usize,
}

impl Synthetic {
    fn new(from: u64, to: u64) -> Self {
        Synthetic {
            next: from,
            to,
            line: Vec::new(),
            at: 0,
        }
    }

    fn make(&mut self) {
        use std::io::Write;
        let i = self.next;
        self.next += 1;
        self.line.clear();
        self.at = 0;
        let ms = i * 10;
        let (s, frac) = (1_700_000_000 + ms / 1_000, (ms % 1_000) * 1_000_000);
        let user = if i % TOO_LONG_EVERY == TOO_LONG_EVERY - 1 {
            "x".repeat(5_000)
        } else if i % LONG_KEY_EVERY == LONG_KEY_EVERY - 1 {
            "L".repeat(600)
        } else {
            format!("u{}", i % 30_000)
        };
        let _ = writeln!(
            self.line,
            r#"{{"ts":{s}.{frac:09},"descriptors":{{"user":"{user}","path":"/api"}},"cost":1}}"#
        );
    }
}

impl Read for Synthetic {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.line.len() {
            if self.next == self.to {
                return Ok(0);
            }
            self.make();
        }
        let n = out.len().min(self.line.len() - self.at);
        out[..n].copy_from_slice(&self.line[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

const NEW: &str = r#"
[[rules]]
name = "per_user"
match = { user = "any" }
key = ["user"]
limit = 1
period = "1h"
capacity = 1000

[[rules]]
name = "all"
limit = 50
period = "1s"
mode = "shadow"
"#;

#[test]
fn a_long_stream_keeps_no_more_than_its_bounds_and_the_heap_stops_growing() {
    let bounds = ReplayBounds {
        tracked_keys: 500,
        key_bytes: 64,
        seconds: 600,
        line_bytes: 4_096,
        reported_lines: 5,
    };
    let new = PolicyConfig::from_toml(NEW).expect("config");
    let baseline =
        PolicyConfig::from_toml(&NEW.replace("limit = 1\n", "limit = 2\n")).expect("baseline");
    let mut replay = Replay::with_bounds(new, Some(baseline), bounds).expect("replay");
    let bound = replay.retained_bound();

    replay
        .run(BufReader::new(Synthetic::new(0, HALF)), Format::Json)
        .expect("read");
    let live_half = LIVE.load(Ordering::Relaxed);
    let held = replay.retained();
    let too_long = HALF / TOO_LONG_EVERY;
    assert_eq!(replay.lines, HALF);
    assert_eq!(replay.malformed, too_long);
    assert_eq!(replay.requests, HALF - too_long);
    assert_eq!(
        replay.malformed_lines,
        (1..=5)
            .map(|k| (k * TOO_LONG_EVERY, LineError::TooLong))
            .collect::<Vec<_>>(),
        "numbered from 1, every line counted"
    );

    replay
        .run(BufReader::new(Synthetic::new(HALF, 2 * HALF)), Format::Json)
        .expect("read");
    let live_end = LIVE.load(Ordering::Relaxed);
    let end = replay.retained();
    assert_eq!(replay.lines, 2 * HALF);
    assert_eq!(replay.malformed, 2 * too_long);

    // Every bound is reached, none is passed: the stream is long enough to matter.
    for (name, now, most) in [
        ("denied keys", end.denied_keys, bound.denied_keys),
        ("key bytes", end.key_bytes, bound.key_bytes),
        ("timeline slots", end.timeline_slots, bound.timeline_slots),
        (
            "malformed lines",
            end.malformed_lines,
            bound.malformed_lines,
        ),
        ("line buffer", end.line_buffer, bound.line_buffer),
    ] {
        assert!(now <= most, "{name}: {now} > {most}");
    }
    assert_eq!(
        end.denied_keys,
        2 * (500 + 1),
        "per config: per_user's 500, and the global rule's one (empty) key"
    );
    assert_eq!(
        end.timeline_slots,
        4 * 600,
        "1 600 s of log, 600 s kept per rule"
    );
    assert_eq!(end.malformed_lines, 5);
    for rule in replay
        .new
        .rules
        .iter()
        .chain(&replay.baseline.as_ref().expect("baseline").rules)
    {
        assert!(
            rule.denied_keys.keys().all(|k| k.len() <= 64),
            "{}",
            rule.rule
        );
    }
    assert!(replay.new.rules[0].keys_overflowed);
    assert_eq!(held, end, "all bounds were reached in the first half");
    assert!(
        live_end < 4 << 20,
        "the whole process, the policies' tables included, holds {live_end} bytes"
    );
    assert!(
        live_end - live_half <= 16 * 1024,
        "the heap grew by {} bytes over the second half ({live_half} -> {live_end})",
        live_end - live_half
    );
}
