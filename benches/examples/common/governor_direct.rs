//! governor's direct (unkeyed) limiter on its fake clock, as the instruction-count examples drive
//! it (governor is a dev-dependency, so the benches' library cannot name it).

use governor::clock::FakeRelativeClock;

/// governor's `RateLimiter` for one key, on a clock the example moves by hand, no middleware.
pub type GovDirect = governor::RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;
