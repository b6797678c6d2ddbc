//! [`HotKeyConfig`]: when a key counts as hot and how many promotions a table may make; the
//! promotion itself, and why it is exact, are in `hot.rs`.

use std::time::Duration;

use tollgate_core::Nanos;

/// The most promotions one table may be configured for.
pub const MAX_PROMOTIONS: usize = 1 << 20;

/// When a key counts as hot, and how many promotions a table may make. From
/// [`Builder::promote_hot_keys`](crate::Builder::promote_hot_keys).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Gcra, Quota};
/// use tollgate_sharded::{HotKeyConfig, KeyedLimiter};
///
/// let limiter = KeyedLimiter::<str, Gcra>::builder(Quota::per_second(1_000)?, 1_000)
///     .promote_hot_keys(HotKeyConfig::default().failures(32).within(Duration::from_millis(2)))
///     .build()?;
/// assert!(limiter.check_key("tenant-1", 1)?.is_allowed());
/// assert_eq!(limiter.promoted_keys(), 0); // promoted only once its slot's CAS keeps failing
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotKeyConfig {
    pub(crate) failures: u64,
    pub(crate) within: Nanos,
    pub(crate) max_promotions: usize,
    pub(crate) stripes: Option<usize>,
    pub(crate) cool_after: Nanos,
}

impl Default for HotKeyConfig {
    /// 16 failed exchanges within 1 ms, cooled 100 ms after its bucket is full again, at most
    /// 1 024 promotions, the striped limiter's default stripe count.
    fn default() -> Self {
        HotKeyConfig {
            failures: 16,
            within: 1_000_000,
            max_promotions: 1_024,
            stripes: None,
            cool_after: 100_000_000,
        }
    }
}

impl HotKeyConfig {
    /// Failed admission exchanges on one slot (within [`within`](Self::within)) that promote its key
    /// (at least 1).
    pub fn failures(mut self, failures: u64) -> Self {
        self.failures = failures.max(1);
        self
    }

    /// How close together the failures must be: counted from the first one; a failure later than
    /// this starts the count again.
    pub fn within(mut self, within: Duration) -> Self {
        self.within = u64::try_from(within.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// Promotions over the table's lifetime (entries are not reused yet; see the module docs of
    /// `hot.rs`), at most [`MAX_PROMOTIONS`]. 0 turns promotion off.
    pub fn max_promotions(mut self, max: usize) -> Self {
        self.max_promotions = max.min(MAX_PROMOTIONS);
        self
    }

    /// How long after its bucket is full again a promoted key is demoted by its next decision
    /// (default 100 ms; 0: as soon as it is full). Any value keeps the hand-back exact (module
    /// docs); a longer one keeps a key that pauses briefly from being promoted again and again.
    pub fn cool_after(mut self, after: Duration) -> Self {
        self.cool_after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// Stripes of each promoted key's striped limiter (default: its own default).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }
}
