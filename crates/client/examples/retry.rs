//! The retry client in front of a rate-limited service: a 429 with `Retry-After: 2` twice, then a
//! 200. The client waits what the server asked (plus its small seeded extra) and retries; time is
//! tokio's paused clock, so the example runs at once and prints the waits it would have slept.
//!
//! ```text
//! cargo run -p tollgate-client --example retry
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate_client::{Backoff, RetryLayer, RetryPolicy};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&calls);
    let start = tokio::time::Instant::now();
    // The server: over its limit for the first two calls.
    let server = service_fn(move |_request: Request<()>| {
        // Relaxed: a call count read after the calls completed, no other memory depends on it.
        let call = counter.fetch_add(1, Ordering::Relaxed);
        let at = start.elapsed();
        async move {
            let status = if call < 2 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            println!("call {} at {at:.2?}: {status}", call + 1);
            Response::builder()
                .status(status)
                .header("retry-after", "2")
                .body(())
        }
    });
    // Tollgate's default backoff (full jitter, 5 attempts), seeded so the run is reproducible.
    let policy = RetryPolicy::new(Backoff::default()).seed(7);
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .service(server);
    let response = client
        .ready()
        .await?
        .call(Request::get("http://api.example/items").body(())?)
        .await?;
    let waited = start.elapsed();
    println!("final: {} after {waited:.2?}", response.status());
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // Never earlier than the server asked: two waits of at least 2 s each.
    assert!(waited >= Duration::from_secs(4));
    Ok(())
}
