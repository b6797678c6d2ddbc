use std::hint::black_box;
use std::time::Instant;
use tollgate_core::{GcraLimiter, Limiter, Quota};
use tollgate_striped::StripedLimiter;

fn cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
fn run<L: Limiter>(name: &str, l: &L, threads: usize, n: u64) {
    let start = Instant::now();
    let res: Vec<(u64, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| { let c0 = cpu(); let mut a = 0u64; for _ in 0..n { a += black_box(l.check().is_allowed()) as u64; } (a, cpu() - c0) })).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let el = start.elapsed();
    let allowed: u64 = res.iter().map(|r| r.0).sum();
    let cpu_total: f64 = res.iter().map(|r| r.1).sum();
    println!("{name} threads={threads}: wall {:.1} M/s, per-cpu-second {:.1} M/s, allowed={:.4}", (threads as u64 * n) as f64 / el.as_secs_f64() / 1e6, (threads as u64 * n) as f64 / cpu_total / 1e6, allowed as f64 / (threads as u64 * n) as f64);
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("micro") { micro(); return; }
    let q = Quota::per_second(1_000_000_000).unwrap();
    let n = 50_000_000;
    let only = std::env::args().nth(1); for t in [1, 2, 4] { if only.is_some() && t > 1 { break; }
        let g = GcraLimiter::new(q).unwrap();
        let mode = std::env::args().nth(2).unwrap_or_default();
        if mode != "s" { run("gcra", &g, t, n); }
        if mode == "g" { continue; }
        let s = StripedLimiter::new(q).unwrap();
        run("striped", &s, t, n);
        eprintln!("  stripes={} max_lease={} stranded={} tat-now={}", s.stripes(), s.max_lease(), s.stranded_units(), s.shared_tat() as i64 - s.now() as i64);
    }
}

#[allow(dead_code)]
pub fn micro() {
    let q = Quota::per_second(1_000_000_000).unwrap();
    let n = 50_000_000u64;
    let g = GcraLimiter::new(q).unwrap();
    let s = StripedLimiter::new(q).unwrap();
    let t0 = g.now();
    let start = Instant::now();
    let mut a = 0u64;
    for i in 0..n { a += black_box(g.check_at(t0 + i * 10, 1).unwrap().is_allowed()) as u64; }
    println!("gcra fixed-time: {:.1} ns/op {a}", start.elapsed().as_nanos() as f64 / n as f64);
    let start = Instant::now();
    let mut a = 0u64;
    for i in 0..n { a += black_box(s.check_at(t0 + i * 10, 1).unwrap().is_allowed()) as u64; }
    println!("striped fixed-time: {:.1} ns/op {a}", start.elapsed().as_nanos() as f64 / n as f64);
    let start = Instant::now();
    let mut a = 0u64;
    for _ in 0..n { a = a.wrapping_add(black_box(g.now())); }
    println!("clock: {:.1} ns/op {}", start.elapsed().as_nanos() as f64 / n as f64, a & 1);
}
