//! The tower retry policy against mock services, on tokio's paused clock: waits are asserted
//! as exact virtual time, and nothing sleeps for real.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate_client::{Backoff, Jitter, RetryLayer, RetryPolicy, ServerJitter};
use tower::{Layer, ServiceExt, service_fn};

/// What the mock returns for one call: a status and headers, or a transport error.
type Reply = Result<(u16, Vec<(&'static str, &'static str)>), std::io::ErrorKind>;

/// A mock service that answers from a script (then 200 forever) and logs the virtual time and
/// method of every call it receives.
#[derive(Clone, Default)]
struct Mock {
    script: Arc<Mutex<VecDeque<Reply>>>,
    calls: Arc<Mutex<Vec<(Duration, Method)>>>,
}

impl Mock {
    fn new(script: impl IntoIterator<Item = Reply>) -> Self {
        Mock {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            ..Mock::default()
        }
    }

    fn calls(&self) -> Vec<Duration> {
        self.calls.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }

    /// Send `req` through `policy` and return the final status and the virtual time it took.
    async fn send<F>(
        &self,
        policy: RetryPolicy<F>,
        req: Request<String>,
    ) -> (Result<u16, std::io::ErrorKind>, Duration)
    where
        F: tollgate_client::RetryError<std::io::Error> + Clone,
    {
        let start = Instant::now();
        let this = self.clone();
        let svc = service_fn(move |req: Request<String>| {
            let this = this.clone();
            async move {
                this.calls
                    .lock()
                    .unwrap()
                    .push((start.elapsed(), req.method().clone()));
                // The clone carries the whole request.
                assert_eq!(req.body(), "payload");
                assert_eq!(req.headers()["x-id"], "7");
                let next = this
                    .script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(Ok((200, vec![])));
                match next {
                    Ok((status, headers)) => {
                        let mut resp = Response::builder().status(status);
                        for (k, v) in headers {
                            resp = resp.header(k, v);
                        }
                        Ok(resp.body(String::new()).unwrap())
                    }
                    Err(kind) => Err(std::io::Error::from(kind)),
                }
            }
        });
        let result = RetryLayer::new(policy).layer(svc).oneshot(req).await;
        (
            result.map(|r| r.status().as_u16()).map_err(|e| e.kind()),
            start.elapsed(),
        )
    }
}

fn request(method: Method) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("http://tollgate.test/items/7")
        .header("x-id", "7")
        .body("payload".to_owned())
        .unwrap()
}

fn backoff(jitter: Jitter, attempts: u32) -> Backoff {
    Backoff::builder()
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(10))
        .max_attempts(attempts)
        .jitter(jitter)
        .build()
        .unwrap()
}

/// Full jitter, 5 attempts, and server waits obeyed exactly ([`ServerJitter::NONE`]), so the
/// tests below can assert the waits to the nanosecond; the default extra is tested in
/// `same_retry_after_spreads_clients_without_retrying_early`.
fn policy() -> RetryPolicy {
    RetryPolicy::new(backoff(Jitter::Full, 5).with_server_jitter(ServerJitter::NONE)).seed(1)
}

const S: fn(u64) -> Duration = Duration::from_secs;

#[tokio::test(start_paused = true)]
async fn waits_exactly_the_advertised_retry_after_twice_then_succeeds() {
    let mock = Mock::new([
        Ok((429, vec![("retry-after", "2")])),
        Ok((429, vec![("retry-after", "3")])),
        Ok((200, vec![])),
    ]);
    let (status, took) = mock.send(policy(), request(Method::GET)).await;
    assert_eq!(status, Ok(200));
    assert_eq!(mock.calls(), [S(0), S(2), S(5)]);
    assert_eq!(took, S(5));
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_is_measured_against_the_wall_clock() {
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_445_412_470) // 07:27:50 GMT
    }
    let mock = Mock::new([Ok((
        503,
        vec![("retry-after", "Wed, 21 Oct 2015 07:27:54 GMT")],
    ))]);
    let (status, took) = mock
        .send(policy().wall_clock(now), request(Method::PUT))
        .await;
    assert_eq!(status, Ok(200));
    assert_eq!(took, S(4));
}

#[tokio::test(start_paused = true)]
async fn ratelimit_reset_is_used_when_retry_after_is_absent() {
    let mock = Mock::new([Ok((429, vec![("ratelimit", r#""default";r=0;t=3"#)]))]);
    let (status, took) = mock.send(policy(), request(Method::GET)).await;
    assert_eq!((status, took), (Ok(200), S(3)));
}

#[tokio::test(start_paused = true)]
async fn backoff_applies_without_hints_and_gives_up_after_max_attempts() {
    let mock = Mock::new(std::iter::repeat_n(Ok((503, vec![])), 10));
    let policy = RetryPolicy::new(backoff(Jitter::None, 4));
    let (status, took) = mock.send(policy, request(Method::DELETE)).await;
    // Four attempts, 100 + 200 + 400 ms apart, then the last 503 is returned.
    assert_eq!(status, Ok(503));
    let ms = Duration::from_millis;
    assert_eq!(mock.calls(), [ms(0), ms(100), ms(300), ms(700)]);
    assert_eq!(took, ms(700));
}

#[tokio::test(start_paused = true)]
async fn gives_up_when_the_next_retry_would_pass_max_elapsed() {
    let mock = Mock::new(std::iter::repeat_n(
        Ok((429, vec![("retry-after", "3")])),
        10,
    ));
    let b = Backoff::builder()
        .unlimited_attempts()
        .max_elapsed(S(7))
        .server_jitter(ServerJitter::NONE)
        .build()
        .unwrap();
    let (status, took) = mock.send(RetryPolicy::new(b), request(Method::GET)).await;
    // Calls at 0, 3 and 6 s; a retry at 9 s would pass 7 s.
    assert_eq!(status, Ok(429));
    assert_eq!(mock.calls(), [S(0), S(3), S(6)]);
    assert_eq!(took, S(6));
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_cap_gives_up_at_once() {
    let mock = Mock::new([Ok((429, vec![("retry-after", "60")]))]);
    let (status, took) = mock.send(policy(), request(Method::GET)).await;
    assert_eq!((status, took), (Ok(429), S(0)));
    assert_eq!(mock.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_requests_are_not_retried_unless_configured() {
    for method in [Method::POST, Method::PATCH] {
        let mock = Mock::new([Ok((429, vec![("retry-after", "1")]))]);
        let (status, _) = mock.send(policy(), request(method.clone())).await;
        assert_eq!(status, Ok(429), "{method}");
        assert_eq!(mock.calls().len(), 1, "{method}");
    }
    let mock = Mock::new([Ok((429, vec![("retry-after", "1")]))]);
    let posting = policy().retry_methods([Method::GET, Method::POST]);
    let (status, took) = mock.send(posting, request(Method::POST)).await;
    assert_eq!((status, took), (Ok(200), S(1)));
}

#[tokio::test(start_paused = true)]
async fn only_configured_statuses_are_retried() {
    let mock = Mock::new([Ok((500, vec![("retry-after", "1")]))]);
    assert_eq!(mock.send(policy(), request(Method::GET)).await.0, Ok(500));
    assert_eq!(mock.calls().len(), 1);

    let mock = Mock::new([Ok((500, vec![("retry-after", "1")]))]);
    let p = policy().retry_statuses([StatusCode::INTERNAL_SERVER_ERROR]);
    assert_eq!(mock.send(p, request(Method::GET)).await, (Ok(200), S(1)));
    // 429 is no longer in the set.
    let mock = Mock::new([Ok((429, vec![("retry-after", "1")]))]);
    let p = policy().retry_statuses([StatusCode::INTERNAL_SERVER_ERROR]);
    assert_eq!(mock.send(p, request(Method::GET)).await.0, Ok(429));
}

#[tokio::test(start_paused = true)]
async fn errors_retry_by_predicate() {
    use std::io::ErrorKind::{ConnectionReset, InvalidInput};
    // Default: every error is retried.
    let mock = Mock::new([Err(ConnectionReset), Err(InvalidInput)]);
    let (status, _) = mock
        .send(
            RetryPolicy::new(backoff(Jitter::None, 5)),
            request(Method::GET),
        )
        .await;
    assert_eq!(status, Ok(200));
    assert_eq!(mock.calls().len(), 3);
    // A predicate can refuse.
    let mock = Mock::new([Err(ConnectionReset), Err(InvalidInput)]);
    let p = RetryPolicy::new(backoff(Jitter::None, 5))
        .retry_errors(|e: &std::io::Error| e.kind() == ConnectionReset);
    let (status, took) = mock.send(p, request(Method::GET)).await;
    assert_eq!(status, Err(InvalidInput));
    assert_eq!(took, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn requests_get_independent_reproducible_jitter() {
    // Two requests through one layer draw different delays; the same seed repeats them.
    async fn two_requests(seed: u64) -> Vec<Duration> {
        let mock = Mock::new([Ok((503, vec![])), Ok((200, vec![])), Ok((503, vec![]))]);
        let p = RetryPolicy::new(backoff(Jitter::Full, 5)).seed(seed);
        let mut waits = Vec::new();
        for _ in 0..2 {
            let (status, took) = mock.send(p.clone(), request(Method::GET)).await;
            assert_eq!(status, Ok(200));
            waits.push(took);
        }
        waits
    }
    let a = two_requests(5).await;
    assert_ne!(a[0], a[1]);
    assert!(a.iter().all(|&d| d <= Duration::from_millis(100)));
    assert_eq!(a, two_requests(5).await);
}

#[tokio::test(start_paused = true)]
async fn one_service_gives_each_request_a_fresh_budget() {
    use tower::Service;
    // Two attempts per request; each request needs both. A budget leaking from the first
    // request into the second would return the second 503.
    let mock = Mock::new([Ok((503, vec![])), Ok((200, vec![])), Ok((503, vec![]))]);
    let calls = mock.clone();
    let svc = service_fn(move |_req: Request<String>| {
        let mock = mock.clone();
        async move {
            mock.calls
                .lock()
                .unwrap()
                .push((Duration::ZERO, Method::GET));
            let next = mock
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Ok((200, vec![])));
            let status = next.map(|(s, _)| s).unwrap_or(500);
            Ok::<_, std::io::Error>(Response::builder().status(status).body(()).unwrap())
        }
    });
    let p = RetryPolicy::new(backoff(Jitter::None, 2));
    let mut svc = RetryLayer::new(p).layer(svc);
    for _ in 0..2 {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(request(Method::GET))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(calls.calls().len(), 4);
}

/// Issue 11, point 8: clients denied with the same `Retry-After` must not all come back at the
/// same instant. Each wait is at least what the server asked, at most a bounded extra over it,
/// different between clients, and reproducible from the seed.
#[tokio::test(start_paused = true)]
async fn same_retry_after_spreads_clients_without_retrying_early() {
    async fn client(seed: u64) -> Duration {
        let mock = Mock::new([Ok((429, vec![("retry-after", "2")]))]);
        let (status, took) = mock
            .send(
                RetryPolicy::new(backoff(Jitter::Full, 5)).seed(seed),
                request(Method::GET),
            )
            .await;
        assert_eq!(status, Ok(200));
        assert_eq!(mock.calls().len(), 2);
        took
    }
    let waits = [client(1).await, client(2).await, client(3).await];
    for &w in &waits {
        assert!(w >= S(2), "retried before the server's Retry-After: {w:?}");
        assert!(
            w <= S(3),
            "more than 1 s over the server's Retry-After: {w:?}"
        );
    }
    assert_ne!(waits[0], waits[1], "{waits:?}");
    assert_ne!(waits[1], waits[2], "{waits:?}");
    assert_eq!(waits[0], client(1).await);
}
