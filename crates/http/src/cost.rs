//! [`RequestCost`]: how many units a request costs ([`UnitCost`], or a closure over its head).

use crate::key::RequestHead;

/// How many units a request costs.
pub trait RequestCost: Send + Sync + 'static {
    /// The cost of `request` (0 passes without consuming anything).
    fn cost(&self, request: &RequestHead<'_>) -> u64;
}

/// Every request costs one unit (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl RequestCost for UnitCost {
    #[inline]
    fn cost(&self, _: &RequestHead<'_>) -> u64 {
        1
    }
}

impl<F> RequestCost for F
where
    F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, request: &RequestHead<'_>) -> u64 {
        self(request)
    }
}
