//! The deciders' side of the one tower layer: what a [`Decide`]r answers (a [`Verdict`], now or
//! later: [`Decided`]), the layer settings it answers with ([`ResponseSettings`]), and how the service
//! holds a decision still under way ([`Pending`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, StatusCode};
use tollgate_core::{CheckError, Decision};

use crate::cost::RequestCost;
use crate::headers::{self, HeaderMode, PolicyHeaders};
use crate::key::RequestHead;
use crate::response::{COST_BODY, Fields};

/// What the layer does with one request: a decider's answer, rendered by [`Gate`](crate::Gate)
/// alone.
pub enum Verdict {
    /// Forward untouched, with no fields (no policy applies, or a missing key is let through).
    Pass,
    /// Forward; the response gains these fields.
    Forward(Option<Fields>),
    /// `429 Too Many Requests` with `Retry-After: retry_after` (whole seconds), the JSON body and
    /// the fields.
    Deny {
        /// `Retry-After` in whole seconds (at least 1).
        retry_after: u64,
        /// The fields the 429 carries.
        fields: Option<Fields>,
    },
    /// Answer `status` with a fixed JSON body (a missing key, a cost that can never be admitted).
    Refuse {
        /// The status.
        status: StatusCode,
        /// The JSON body.
        body: &'static [u8],
    },
}

/// A decider's answer: now, or after a future (a round trip, a two-stage delay) completes.
// The verdict is returned by value on purpose: boxing it would allocate per request, and a
// synchronous decider's `L` is empty.
#[allow(clippy::large_enum_variant)]
pub enum Decided<L> {
    /// Decided at once.
    Now(Verdict),
    /// Decided when this completes; the service holds the request meanwhile.
    Later(L),
}

/// The layer settings a decider needs to say what the response carries.
#[derive(Clone, Copy, Debug)]
pub struct ResponseSettings {
    /// Which fields responses carry (a decider skips the look-ups for fields not sent).
    pub mode: HeaderMode,
    /// The status for a cost that can never be admitted.
    pub cost_error_status: StatusCode,
}

impl ResponseSettings {
    /// Whether the response to `decision` carries fields (so its `(r, t)` is worth a look-up).
    pub(crate) fn wants_fields(&self, decision: &Decision) -> bool {
        (self.mode.ietf || self.mode.legacy) && (self.mode.on_allowed || !decision.is_allowed())
    }

    /// The verdict for a keyed limiter's `checked` answer, `limit` its `(r, t)` when
    /// [`wants_fields`](Self::wants_fields): the one place a keyed decision becomes a verdict.
    pub(crate) fn keyed(
        &self,
        headers: &PolicyHeaders,
        checked: Result<Decision, CheckError>,
        limit: Option<(u64, u64)>,
    ) -> Verdict {
        let fields = limit.map(|limit| Fields::new(self.mode, headers, limit));
        match checked {
            Ok(Decision::Allowed { .. }) => Verdict::Forward(fields),
            Ok(Decision::Denied { retry_after, .. }) => Verdict::Deny {
                retry_after: headers::retry_secs(retry_after),
                fields,
            },
            // `CostExceedsCapacity` (the only error today): retrying can never pass, so no
            // Retry-After; any future error kind fails closed the same way.
            Err(_) => Verdict::Refuse {
                status: self.cost_error_status,
                body: COST_BODY,
            },
        }
    }
}

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// What a [`GateLayer`] is generic over: something that turns a request (its head and cost)
/// into a [`Verdict`], at once or later. Sealed: the crate's deciders are [`KeyedDecider`] (a
/// keyed limiter per route: a one-rule decider), [`AsyncKeyedDecider`](crate::AsyncKeyedDecider)
/// and [`PolicyEdge`](crate::PolicyEdge); put your own storage behind them through
/// [`KeyedCheck`], [`AsyncKeyedCheck`](crate::AsyncKeyedCheck) or a policy.
///
/// [`GateLayer`]: crate::GateLayer
/// [`KeyedDecider`]: crate::KeyedDecider
/// [`KeyedCheck`]: crate::KeyedCheck
pub trait Decide: Sealed + Send + Sync + 'static {
    /// A decision still under way: [`Infallible`] for a synchronous decider (no future, no box),
    /// [`LaterVerdict`] for one that awaits.
    type Later;

    /// Decides `head`, asking `cost` for its cost only when a limit applies.
    fn decide<Cf: RequestCost>(
        &self,
        head: &RequestHead<'_>,
        cost: &Cf,
        answer: ResponseSettings,
    ) -> Decided<Self::Later>;
}

/// An asynchronous decider's later verdict.
pub type LaterVerdict = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// A decision under way, as [`ResponseFuture`](crate::ResponseFuture) holds it with the inner
/// service and the request.
pub trait Pending<S, ReqB> {
    /// What is held while the decision is under way.
    type Held;
    /// Polls the decision.
    fn poll_verdict(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict>;
    /// Takes the readied `inner` (leaving a clone: tower's rule for calling a service from a
    /// future) and `request` along.
    fn hold(&self, inner: &mut S, request: Request<ReqB>) -> Self::Held;
    /// The service and request back.
    fn release(held: Self::Held) -> (S, Request<ReqB>);
}

/// A synchronous decider never defers: nothing is held, and the inner service need not be `Clone`.
impl<S, ReqB> Pending<S, ReqB> for Infallible {
    type Held = Infallible;
    fn poll_verdict(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Verdict> {
        match *self {}
    }
    fn hold(&self, _: &mut S, _: Request<ReqB>) -> Infallible {
        match *self {}
    }
    fn release(held: Infallible) -> (S, Request<ReqB>) {
        match held {}
    }
}

impl<S: Clone, ReqB> Pending<S, ReqB> for LaterVerdict {
    type Held = (S, Request<ReqB>);
    fn poll_verdict(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        self.get_mut().as_mut().poll(cx)
    }
    fn hold(&self, inner: &mut S, request: Request<ReqB>) -> Self::Held {
        let clone = inner.clone();
        (std::mem::replace(inner, clone), request)
    }
    fn release(held: Self::Held) -> (S, Request<ReqB>) {
        held
    }
}
