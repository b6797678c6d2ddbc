//! The suite's output when nobody watches a terminal (stderr piped, as in CI): one plain line per
//! run saying which run it is, out of how many, and what it measures.

use std::process::Command;

#[test]
fn a_piped_suite_logs_one_numbered_line_per_run() {
    let out_dir =
        std::env::temp_dir().join(format!("tollgate-bench-progress-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    // Two implementations x two thread counts, closed loop, one quota, one key: 4 runs of ~10 ms.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args([
            "--impls",
            "gcra,fixed_window",
            "--keys",
            "single",
            "--threads",
            "1,2",
            "--quota",
            "allow",
            "--loop",
            "closed",
            "--duration",
            "10ms",
            "--warmup",
            "1ms",
            "--stream-len",
            "64",
            "--no-pin",
            "--no-plots",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .expect("run tollgate-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("[{}/4] ", i + 1)), "{stderr}");
        assert!(line.contains("closed/allow/single"), "{stderr}");
        assert!(line.ends_with("left)"), "{stderr}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("gcra ") && l.contains(" 1 thread ")),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("fixed_window ") && l.contains(" 2 threads ")),
        "{stderr}"
    );
    // No terminal escape codes (a bar drawn into a log).
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
    let _ = std::fs::remove_dir_all(&out_dir);
}
