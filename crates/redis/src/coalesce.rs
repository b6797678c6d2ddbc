//! Concurrent requests of one [`RedisBatch`](crate::RedisBatch) sent as one `FCALL` (group
//! commit): while a call is in flight, the requests that arrive wait in a queue, and the next call
//! carries all of them (the function library's `batch_many`, batch_many.lua), each decided in turn
//! as its own call would decide it. Redis then runs one command, one `TIME` and one reply for the
//! group instead of one per request, and the client one command and one parse. A request alone
//! goes at once: nothing waits for a group to fill.
//!
//! Hand-written rather than a crate's: what is grouped is one Redis function's arguments, and the
//! queue is a mutex-guarded `Vec` and a oneshot per request.
//!
//! Each request is answered within the batch's timeout of its submission, by one timer per group
//! rather than one per request: a group's call is bounded by its oldest request's deadline, and a
//! request whose deadline passed while it waited for a call to carry it is answered
//! [`Answer::Timeout`] when the next group forms (which is no later than that deadline: the calls
//! in flight carry older requests, so they end by it). A timer per request cost the server about
//! 1 µs per call on a coalesced path (registering it woke tokio's driver through its eventfd, a
//! system call, whenever no earlier timer was pending: `results/fleet/README.md`).

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::RedisError;
use redis::aio::ConnectionLike;
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::durable::{Durability, GroupWait, SharedWait};
use crate::function::{BATCH_LIBRARY, Fallback, LibraryCall};

/// At most this many group calls of one batch in flight: one being run by Redis while the next
/// is on its way (the requests that arrive meanwhile wait for the next).
const SENDING_MAX: usize = 2;

/// At most this many requests in one call (a call runs them all before Redis serves anything
/// else).
const GROUP_MAX: usize = 64;

/// One request's `batch` arguments (batch.lua), and where its answer goes.
pub(crate) struct Request {
    /// Its keys, prefixed.
    pub(crate) keys: SmallVec<[String; 4]>,
    /// `now_us` or `''`.
    pub(crate) time: String,
    /// The cost.
    pub(crate) cost: String,
    /// The plan.
    pub(crate) plan: String,
    /// The durability its batch asks for: a request that writes an admission waits for the
    /// group's one `WAIT`.
    pub(crate) durability: Option<Durability>,
}

/// What became of a request sent in a group.
pub(crate) enum Answer {
    /// The request's reply, as `batch` replies, and where the request has a durability, the
    /// group's `WAIT` (sent only if a request asks for it).
    Reply(Vec<u8>, Option<Arc<dyn GroupWait>>),
    /// The error the request's decision raised (it wrote nothing), or the group call's.
    Failed(RedisError),
    /// The group call did not answer within the timeout (it may have run).
    Timeout(Duration),
    /// The group's reply did not have one value per request.
    BadReply(String),
    /// Functions are not there to use (or not now): send the request (given back) alone.
    Alone(Request),
}

/// A [`Coalescer`] whatever its connection type (so that [`RedisBatch`](crate::RedisBatch) keeps
/// its one type parameter with no `'static` bound).
pub(crate) trait Coalesce: fmt::Debug + Send + Sync {
    /// Queues `request` for the next group call, starting one if fewer than [`SENDING_MAX`] are
    /// in flight. Outside a tokio runtime (nothing to run a group on) the request comes back: send
    /// it alone.
    #[expect(
        clippy::result_large_err,
        reason = "the request is moved back, not copied, and only outside a runtime"
    )]
    fn submit(self: Arc<Self>, request: Request) -> Result<oneshot::Receiver<Answer>, Request>;
}

/// The queue of one batch's requests and the calls that carry them.
pub(crate) struct Coalescer<C> {
    conn: C,
    via: Arc<LibraryCall>,
    timeout: Duration,
    queue: Mutex<Queue>,
}

/// A request waiting for a group call: its arguments, where its answer goes, and the instant by
/// which it must be answered.
type Waiting = (Request, oneshot::Sender<Answer>, Instant);

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// Group calls in flight (tasks sending them).
    sending: usize,
}

impl<C> fmt::Debug for Coalescer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.lock();
        f.debug_struct("Coalescer")
            .field("waiting", &queue.waiting.len())
            .field("sending", &queue.sending)
            .finish_non_exhaustive()
    }
}

impl<C> Coalescer<C> {
    /// Group calls over `conn`, by `via`'s function (never its script), each bounded by `timeout`.
    pub(crate) fn new(conn: C, via: Arc<LibraryCall>, timeout: Duration) -> Self {
        Coalescer {
            conn,
            via,
            timeout,
            queue: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds no invariant a panic could break half-way (a push, a drain, a count).
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Coalesce for Coalescer<C> {
    fn submit(self: Arc<Self>, request: Request) -> Result<oneshot::Receiver<Answer>, Request> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(request);
        };
        let (tx, rx) = oneshot::channel();
        let deadline = Instant::now() + self.timeout;
        let start = {
            let mut queue = self.lock();
            queue.waiting.push((request, tx, deadline));
            let start = queue.sending < SENDING_MAX;
            queue.sending += usize::from(start);
            start
        };
        if start {
            runtime.spawn(self.send_groups());
        }
        Ok(rx)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Coalescer<C> {
    /// Sends the waiting requests, a group at a time, until none wait.
    async fn send_groups(self: Arc<Self>) {
        // Dropped with its runtime half-way: the count goes down, so that a later request starts
        // a call (the group's requests see their answers' senders dropped).
        let mut guard = Sending(Some(&self));
        loop {
            let mut group: Vec<_> = {
                let mut queue = self.lock();
                if queue.waiting.is_empty() {
                    // Under the lock that a submit takes: it sees either this request's task or
                    // room to start one.
                    queue.sending -= 1;
                    guard.0 = None;
                    return;
                }
                let n = queue.waiting.len().min(GROUP_MAX);
                queue.waiting.drain(..n).collect()
            };
            // Requests whose deadline passed in the queue (the calls in flight were slow): their
            // timeout now, and not sent (a call that would answer after it serves no one).
            let now = Instant::now();
            if group.iter().any(|(_, _, deadline)| *deadline <= now) {
                let (expired, live) = group
                    .into_iter()
                    .partition::<Vec<_>, _>(|(_, _, deadline)| *deadline <= now);
                for (_, answer, _) in expired {
                    let _ = answer.send(Answer::Timeout(self.timeout));
                }
                group = live;
            }
            if !group.is_empty() {
                self.send(group).await;
            }
        }
    }

    /// One group call, and each request's answer, all by the earliest of the requests' deadlines
    /// (the oldest request's).
    async fn send(&self, group: Vec<Waiting>) {
        let deadline = group.iter().map(|(_, _, deadline)| *deadline).min();
        let (requests, answers): (Vec<Request>, Vec<_>) = group
            .into_iter()
            .map(|(request, answer, _)| (request, answer))
            .unzip();
        // batch_many's arguments per request: the cost (`<cost>@<now_us>` where the request
        // brings its own time), then the plan.
        let costs: Vec<Cow<'_, str>> = requests
            .iter()
            .map(|r| match r.time.as_str() {
                "" => Cow::Borrowed(r.cost.as_str()),
                time => Cow::Owned(format!("{}@{time}", r.cost)),
            })
            .collect();
        let mut keys = Vec::with_capacity(requests.iter().map(|r| r.keys.len()).sum());
        let mut args = Vec::with_capacity(requests.len() * 2);
        for (request, cost) in requests.iter().zip(&costs) {
            keys.extend(request.keys.iter().map(String::as_str));
            args.extend([cost.as_ref(), request.plan.as_str()]);
        }
        let wait = requests
            .iter()
            .find_map(|r| r.durability)
            .map(|durability| {
                Arc::new(SharedWait::new(self.conn.clone(), durability, self.timeout))
                    as Arc<dyn GroupWait>
            });
        let mut conn = self.conn.clone();
        let call = self.via.by_function::<_, _, Vec<Vec<u8>>>(
            &mut conn,
            &BATCH_LIBRARY.many,
            &keys,
            &args,
        );
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.timeout);
        let reply = tokio::time::timeout_at(deadline, call).await;
        let failed = match reply {
            Err(_) => Failure::Timeout(self.timeout),
            Ok(Ok(texts)) if texts.len() == answers.len() => {
                for (text, answer) in texts.into_iter().zip(answers) {
                    // A request that gave up waiting (its timeout) has dropped its receiver.
                    let _ = answer.send(match text.strip_prefix(b"E") {
                        Some(error) => Answer::Failed(error_of(error)),
                        None => Answer::Reply(text, wait.clone()),
                    });
                }
                return;
            }
            Ok(Ok(texts)) => Failure::BadReply(format!(
                "{} replies for a group of {}",
                texts.len(),
                answers.len()
            )),
            Ok(Err(fallback @ (Fallback::ForGood | Fallback::Once))) => {
                if matches!(fallback, Fallback::ForGood) {
                    self.via.refused();
                }
                for (request, answer) in requests.into_iter().zip(answers) {
                    let _ = answer.send(Answer::Alone(request));
                }
                return;
            }
            Ok(Err(Fallback::Error(e))) => Failure::Redis(e),
        };
        for answer in answers {
            let _ = answer.send(match &failed {
                Failure::Redis(e) => Answer::Failed(e.clone()),
                Failure::Timeout(t) => Answer::Timeout(*t),
                Failure::BadReply(why) => Answer::BadReply(why.clone()),
            });
        }
    }
}

/// Why a group call answered none of its requests.
enum Failure {
    Redis(RedisError),
    Timeout(Duration),
    BadReply(String),
}

/// Decrements the count of calls in flight when a sending task is dropped half-way.
struct Sending<'a, C>(Option<&'a Coalescer<C>>);

impl<C> Drop for Sending<'_, C> {
    fn drop(&mut self) {
        if let Some(coalescer) = self.0 {
            coalescer.lock().sending -= 1;
        }
    }
}

/// A request's error in a group reply (`<CODE> <detail>`, as Redis would have sent it for the
/// request alone) as the error Redis's reply would have been.
fn error_of(text: &[u8]) -> RedisError {
    let text = String::from_utf8_lossy(text);
    let (code, detail) = text.split_once(' ').unwrap_or((&text, ""));
    redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
}
