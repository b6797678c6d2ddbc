//! Backoff formulas, limits and header parsing, all with seeded RNGs and explicit times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tollgate_client::{
    Backoff, BackoffError, BackoffState, GiveUp, InvalidRetryAfter, Jitter, ServerJitter,
    parse_retry_after, pause_hint, ratelimit_entries, retry_after,
};

const MS: Duration = Duration::from_millis(1);

fn policy(base_ms: u64, cap_ms: u64, jitter: Jitter) -> Backoff {
    Backoff::builder()
        .base(Duration::from_millis(base_ms))
        .cap(Duration::from_millis(cap_ms))
        .unlimited_attempts()
        .jitter(jitter)
        .build()
        .expect("valid policy")
}

#[test]
fn nonsensical_configs_are_typed_errors() {
    let b = Backoff::builder();
    assert_eq!(b.base(Duration::ZERO).build(), Err(BackoffError::ZeroBase));
    assert_eq!(
        b.base(2 * MS).cap(MS).build(),
        Err(BackoffError::CapBelowBase {
            base: 2 * MS,
            cap: MS
        })
    );
    assert_eq!(
        b.max_attempts(0).build(),
        Err(BackoffError::ZeroMaxAttempts)
    );
    assert_eq!(
        b.max_elapsed(Duration::ZERO).build(),
        Err(BackoffError::ZeroMaxElapsed)
    );
    assert!(b.base(MS).cap(MS).max_attempts(1).build().is_ok());
    assert_eq!(Backoff::builder().build(), Ok(Backoff::default()));
    // Errors render a readable message.
    assert!(BackoffError::ZeroBase.to_string().contains("base"));
}

#[test]
fn exponential_doubles_then_caps_and_saturates() {
    let p = policy(100, 1_000, Jitter::None);
    let got: Vec<u64> = (0..6)
        .map(|n| p.exponential(n).as_millis() as u64)
        .collect();
    assert_eq!(got, [100, 200, 400, 800, 1_000, 1_000]);
    for n in [63, 64, 65, 1_000, u32::MAX] {
        assert_eq!(p.exponential(n), 1_000 * MS);
    }
    // A cap beyond u64 nanoseconds: base·2^n saturates at u64::MAX ns instead of panicking.
    let huge = Backoff::builder()
        .base(Duration::from_secs(1))
        .cap(Duration::MAX)
        .unlimited_attempts()
        .build()
        .unwrap();
    assert_eq!(huge.exponential(u32::MAX), Duration::from_nanos(u64::MAX));
    let mut rng = StdRng::seed_from_u64(0);
    for jitter in Jitter::ALL {
        let p = huge.with_jitter(jitter);
        let mut s = BackoffState::new();
        for _ in 0..200 {
            let d = p.next_delay(&mut s, &mut rng, Duration::MAX, None).unwrap();
            assert!(d <= Duration::from_nanos(u64::MAX));
        }
    }
}

/// Draws `retries` delays for one operation and checks each against its formula's bounds.
fn check_bounds(jitter: Jitter, seed: u64, retries: u32) -> Vec<Duration> {
    let p = policy(10, 5_000, jitter);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = BackoffState::new();
    let mut prev = p.base();
    let mut out = Vec::new();
    for n in 0..retries {
        let exp = p.exponential(n);
        let d = p
            .next_delay(&mut s, &mut rng, Duration::ZERO, None)
            .unwrap();
        assert!(d <= p.cap(), "{jitter} n={n}: {d:?} above cap");
        match jitter {
            Jitter::None => assert_eq!(d, exp),
            Jitter::Full => assert!(d <= exp),
            Jitter::Equal => assert!(d >= exp / 2 && d <= exp, "n={n}: {d:?} vs {exp:?}"),
            Jitter::Decorrelated => {
                assert!(d >= p.base(), "n={n}: {d:?}");
                assert!(d <= (prev * 3).min(p.cap()), "n={n}: {d:?} prev {prev:?}");
                prev = d;
            }
        }
        out.push(d);
    }
    out
}

#[test]
fn every_formula_stays_within_its_bounds_over_many_attempts() {
    for jitter in Jitter::ALL {
        for seed in 0..50 {
            check_bounds(jitter, seed, 100);
        }
    }
}

#[test]
fn jitter_actually_spreads_delays() {
    // Once capped (n >= 9 for 10 ms / 5 s), full jitter is uniform on [0, cap]: its mean is
    // near cap/2 and it uses the lower half; equal jitter stays in the upper half.
    let full: Vec<Duration> = (0..20)
        .flat_map(|s| check_bounds(Jitter::Full, s, 100))
        .collect();
    let capped: Vec<f64> = full
        .chunks(100)
        .flat_map(|c| c[10..].iter().map(|d| d.as_secs_f64()))
        .collect();
    let mean = capped.iter().sum::<f64>() / capped.len() as f64;
    assert!((2.2..2.8).contains(&mean), "full jitter mean {mean}");
    assert!(capped.iter().any(|&d| d < 0.5));
    let equal = check_bounds(Jitter::Equal, 1, 100);
    assert!(
        equal[20..]
            .iter()
            .all(|&d| d >= Duration::from_millis(2_500))
    );
    assert!(equal[20..].windows(2).any(|w| w[0] != w[1]));
    // Decorrelated jitter does not just repeat the cap.
    let dec = check_bounds(Jitter::Decorrelated, 1, 100);
    assert!(dec.iter().any(|&d| d < Duration::from_secs(5)));
}

#[test]
fn seeded_rng_gives_the_same_delays() {
    for jitter in Jitter::ALL {
        let p = policy(10, 5_000, jitter);
        let a: Vec<_> = p.delays(StdRng::seed_from_u64(9)).take(50).collect();
        let b: Vec<_> = p.delays(StdRng::seed_from_u64(9)).take(50).collect();
        assert_eq!(a, b);
        if jitter != Jitter::None {
            let c: Vec<_> = p.delays(StdRng::seed_from_u64(10)).take(50).collect();
            assert_ne!(a, c);
        }
    }
}

#[test]
fn iterator_gives_up_after_max_attempts() {
    let p = Backoff::builder()
        .max_attempts(5)
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let delays: Vec<_> = p.delays(StdRng::seed_from_u64(0)).collect();
    assert_eq!(delays, [100, 200, 400, 800].map(Duration::from_millis));
    let once = Backoff::builder().max_attempts(1).build().unwrap();
    assert_eq!(once.delays(StdRng::seed_from_u64(0)).count(), 0);
}

#[test]
fn iterator_gives_up_at_max_elapsed_and_stays_done() {
    // None: 100+200+400+800 = 1.5 s; the next (1.6 s) would end at 3.1 s > 2 s.
    let p = Backoff::builder()
        .unlimited_attempts()
        .max_elapsed(Duration::from_secs(2))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let mut it = p.delays(StdRng::seed_from_u64(0));
    let delays: Vec<_> = it.by_ref().collect();
    assert_eq!(delays.len(), 4);
    assert_eq!(it.next(), None);
    for jitter in Jitter::ALL {
        for seed in 0..20 {
            let it = p.with_jitter(jitter).delays(StdRng::seed_from_u64(seed));
            let total: Duration = it.sum();
            assert!(total <= Duration::from_secs(2), "{jitter}: {total:?}");
        }
    }
}

#[test]
fn server_delay_takes_precedence_within_limits() {
    let p = Backoff::builder()
        .cap(Duration::from_secs(10))
        .max_attempts(4)
        .max_elapsed(Duration::from_secs(30))
        .jitter(Jitter::None)
        .server_jitter(ServerJitter::NONE)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let mut s = BackoffState::new();
    // Exactly the server's wait (no extra configured), not the 100 ms backoff.
    let hint = Some(Duration::from_secs(7));
    assert_eq!(
        p.next_delay(&mut s, &mut rng, Duration::ZERO, hint),
        Ok(Duration::from_secs(7))
    );
    // Beyond the cap: give up rather than retry early.
    let long = Some(Duration::from_secs(11));
    assert_eq!(
        p.next_delay(&mut s, &mut rng, Duration::ZERO, long),
        Err(GiveUp::ServerDelayAboveCap)
    );
    // Beyond max elapsed: 25 s in, a 6 s wait would start at 31 s.
    let six = Some(Duration::from_secs(6));
    let at = Duration::from_secs(25);
    assert_eq!(
        p.next_delay(&mut s, &mut rng, at, six),
        Err(GiveUp::MaxElapsed)
    );
    // Giving up wrote nothing: still one retry scheduled.
    assert_eq!(s.retries(), 1);
    // Server waits count as attempts: two more, then the fourth attempt was the last.
    assert_eq!(
        p.next_delay(&mut s, &mut rng, Duration::ZERO, Some(MS)),
        Ok(MS)
    );
    assert_eq!(
        p.next_delay(&mut s, &mut rng, Duration::ZERO, None),
        Ok(400 * MS)
    );
    assert_eq!(
        p.next_delay(&mut s, &mut rng, Duration::ZERO, hint),
        Err(GiveUp::MaxAttempts)
    );
}

proptest! {
    #[test]
    fn any_config_and_attempt_never_panics_or_exceeds_cap(
        base_ns in 1u64..=u64::MAX,
        extra_ns in 0u64..=u64::MAX,
        retries in 0u32..=u32::MAX,
        jitter_ix in 0usize..4,
        seed in any::<u64>(),
    ) {
        let base = Duration::from_nanos(base_ns);
        let cap = base.saturating_add(Duration::from_nanos(extra_ns));
        let p = Backoff::builder()
            .base(base)
            .cap(cap)
            .unlimited_attempts()
            .jitter(Jitter::ALL[jitter_ix])
            .build()
            .unwrap();
        prop_assert!(p.exponential(retries) <= cap);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut s = BackoffState::new();
        for _ in 0..8 {
            let d = p.next_delay(&mut s, &mut rng, Duration::MAX, None).unwrap();
            prop_assert!(d <= cap);
        }
    }
}

/// Issue 11, point 8: a server wait gets a bounded extra, `[wait, wait + min(1 s, wait / 2)]` by
/// default, never less than the wait, drawn from the seeded RNG.
#[test]
fn server_waits_get_a_bounded_seeded_extra() {
    let p = Backoff::builder().unlimited_attempts().build().unwrap();
    assert_eq!(p.server_jitter(), ServerJitter::DEFAULT);
    let one = Duration::from_secs(1);
    // 100 clients told `Retry-After: 1` at the same instant.
    let waits: Vec<Duration> = (0..100)
        .map(|seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            p.next_delay(
                &mut BackoffState::new(),
                &mut rng,
                Duration::ZERO,
                Some(one),
            )
            .unwrap()
        })
        .collect();
    assert!(waits.iter().all(|&w| (one..=one + 500 * MS).contains(&w)));
    let mut distinct = waits.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 100, "every client its own instant");
    // Spread over the whole range, not bunched: both halves of it are used.
    assert!(waits.iter().any(|&w| w < one + 250 * MS));
    assert!(waits.iter().any(|&w| w > one + 250 * MS));
    // The same seed, the same wait.
    let again = |seed| {
        p.next_delay(
            &mut BackoffState::new(),
            &mut StdRng::seed_from_u64(seed),
            Duration::ZERO,
            Some(one),
        )
    };
    assert_eq!(again(7), Ok(waits[7]));
    // Long waits: at most 1 s extra.
    let sixty = Duration::from_secs(60);
    let long = Backoff::builder()
        .cap(Duration::from_secs(120))
        .build()
        .unwrap();
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let w = long
            .next_delay(
                &mut BackoffState::new(),
                &mut rng,
                Duration::ZERO,
                Some(sixty),
            )
            .unwrap();
        assert!((sixty..=sixty + one).contains(&w), "{w:?}");
    }
}

#[test]
fn server_extra_stays_within_cap_and_max_elapsed() {
    let p = Backoff::builder()
        .cap(Duration::from_secs(10))
        .max_elapsed(Duration::from_secs(30))
        .unlimited_attempts()
        .server_jitter(ServerJitter {
            percent: 100,
            max_extra: Duration::from_secs(5),
        })
        .build()
        .unwrap();
    let wait = |elapsed_s, wait_s, seed| {
        p.next_delay(
            &mut BackoffState::new(),
            &mut StdRng::seed_from_u64(seed),
            Duration::from_secs(elapsed_s),
            Some(Duration::from_secs(wait_s)),
        )
    };
    for seed in 0..50 {
        // A 9 s wait may grow only to the 10 s cap.
        let w = wait(0, 9, seed).unwrap();
        assert!((Duration::from_secs(9)..=Duration::from_secs(10)).contains(&w));
        // The cap itself: no room, exactly the wait.
        assert_eq!(wait(0, 10, seed), Ok(Duration::from_secs(10)));
        // 26 s in, a 3 s wait fits but its extra only up to 30 s.
        let w = wait(26, 3, seed).unwrap();
        assert!((Duration::from_secs(3)..=Duration::from_secs(4)).contains(&w));
        // A wait that alone passes max elapsed still gives up.
        assert_eq!(wait(28, 3, seed), Err(GiveUp::MaxElapsed));
    }
    assert_eq!(
        ServerJitter::NONE.max_extra_for(Duration::MAX),
        Duration::ZERO
    );
    let huge = ServerJitter {
        percent: u32::MAX,
        max_extra: Duration::MAX,
    };
    assert_eq!(
        huge.max_extra_for(Duration::MAX),
        Duration::from_nanos(u64::MAX)
    );
}

proptest! {
    #[test]
    fn server_waits_are_never_shortened_or_over_the_cap(
        cap_ms in 1u64..=100_000,
        wait_frac in 0.0f64..=1.0,
        percent in 0u32..=400,
        max_extra_ms in 0u64..=10_000,
        seed in any::<u64>(),
    ) {
        let cap = Duration::from_millis(cap_ms);
        let p = Backoff::builder()
            .base(MS)
            .cap(cap)
            .unlimited_attempts()
            .server_jitter(ServerJitter { percent, max_extra: Duration::from_millis(max_extra_ms) })
            .build()
            .unwrap();
        let wait = cap.mul_f64(wait_frac);
        let extra = p.server_jitter().max_extra_for(wait);
        let mut rng = StdRng::seed_from_u64(seed);
        let d = p.next_delay(&mut BackoffState::new(), &mut rng, Duration::ZERO, Some(wait)).unwrap();
        prop_assert!(d >= wait);
        prop_assert!(d <= cap);
        prop_assert!(d <= wait + extra);
    }
}

/// 2015-10-21 07:27:50 GMT.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_445_412_470)
}

#[test]
fn retry_after_delay_seconds() {
    assert_eq!(parse_retry_after("0", now()), Ok(Duration::ZERO));
    assert_eq!(
        parse_retry_after(" 120 ", now()),
        Ok(Duration::from_secs(120))
    );
    assert_eq!(
        parse_retry_after("99999999999999999999999", now()),
        Ok(Duration::from_secs(u64::MAX))
    );
    for bad in ["", "-1", "1.5", "soon", "12s", "0x10"] {
        assert_eq!(
            parse_retry_after(bad, now()),
            Err(InvalidRetryAfter::Unparseable),
            "{bad:?}"
        );
    }
}

#[test]
fn retry_after_http_date_against_the_given_now() {
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now()),
        Ok(Duration::from_secs(10))
    );
    // Obsolete RFC 850 form, also accepted by recipients.
    assert_eq!(
        parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", now()),
        Ok(Duration::from_secs(70))
    );
    // A date in the past: retry now.
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now()),
        Ok(Duration::ZERO)
    );
}

#[test]
fn retry_after_from_headers() {
    let mut h = HeaderMap::new();
    assert_eq!(retry_after(&h, now()), None);
    h.insert("retry-after", HeaderValue::from_static("3"));
    assert_eq!(retry_after(&h, now()), Some(Duration::from_secs(3)));
    h.insert(
        "retry-after",
        HeaderValue::from_static("Wed, 21 Oct 2015 07:27:55 GMT"),
    );
    assert_eq!(retry_after(&h, now()), Some(Duration::from_secs(5)));
    h.insert("retry-after", HeaderValue::from_static("later"));
    assert_eq!(retry_after(&h, now()), None);
}

fn ratelimit(values: &[&'static str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append("ratelimit", HeaderValue::from_static(v));
    }
    h
}

#[test]
fn pause_hint_reads_exhausted_policies() {
    assert_eq!(pause_hint(&ratelimit(&[])), None);
    assert_eq!(
        pause_hint(&ratelimit(&[r#""default";r=0;t=5"#])),
        Some(Duration::from_secs(5))
    );
    assert_eq!(pause_hint(&ratelimit(&[r#""default";r=1;t=5"#])), None);
    // No reset given: nothing to wait for.
    assert_eq!(pause_hint(&ratelimit(&[r#""default";r=0"#])), None);
    // The longest wait among exhausted policies, across fields and list members.
    let h = ratelimit(&[
        r#""burst";r=0;t=2, "day";r=40;t=3600"#,
        r#""hour";r=0;t=30"#,
    ]);
    assert_eq!(pause_hint(&h), Some(Duration::from_secs(30)));
    let entries = ratelimit_entries(&h).unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[1].policy, "day");
    assert_eq!(entries[1].remaining, Some(40));
    // Malformed structured field, negative numbers and non-string items are ignored.
    assert_eq!(pause_hint(&ratelimit(&["default;r=0;t=5"])), None);
    assert!(ratelimit_entries(&ratelimit(&[r#""a";r=0;t=5,,"#])).is_err());
    assert_eq!(pause_hint(&ratelimit(&[r#""a";r=0;t=-5"#])), None);
    assert_eq!(pause_hint(&ratelimit(&[r#"7;r=0;t=5"#])), None);
}
