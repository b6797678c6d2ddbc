//! Running the server: both listeners, reload on file change and SIGHUP, graceful SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::grpc::{RateLimitServiceServer, Rls};
use crate::http_api::{HttpState, router};
use crate::service::Limiter;

/// Command-line overrides of the file's `[server]` section.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// gRPC listen address.
    pub grpc: Option<SocketAddr>,
    /// HTTP listen address.
    pub http: Option<SocketAddr>,
}

/// Runs until SIGTERM or SIGINT: in-flight calls finish, then both listeners close.
///
/// Prints `grpc listening on ADDR` and `http listening on ADDR` (the bound addresses, so port 0
/// works) on stdout once both are bound.
///
/// # Errors
/// A config that cannot be loaded at start, or a listener that cannot be bound.
pub async fn run(path: PathBuf, overrides: Overrides) -> Result<(), Box<dyn std::error::Error>> {
    // First of all, so that a signal from the moment the process exists is handled (SIGTERM and
    // SIGHUP otherwise kill it, undrained, until their handlers are installed).
    let signals = Signals::install();
    let config = ServerConfig::load(&path)?;
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| tracing::warn!(error = %e, "metrics recorder not installed"))
        .ok();
    if let Some(handle) = metrics.clone() {
        // `install_recorder` leaves upkeep to the caller: without it every histogram sample is
        // kept until the next scrape, so an unscraped server grows by ~24 bytes a call.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
    }
    let limiter = Arc::new(Limiter::new(&config)?);
    let grpc = TcpListener::bind(overrides.grpc.unwrap_or(config.server.grpc)).await?;
    let http = TcpListener::bind(overrides.http.unwrap_or(config.server.http)).await?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    println!("grpc listening on {grpc_addr}");
    println!("http listening on {http_addr}");
    tracing::info!(%grpc_addr, %http_addr, domains = config.domains.len(), "tollgate-server started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let Signals { stop, hup } = signals;
    tokio::spawn(reloader(
        path,
        Arc::clone(&limiter),
        config.server.reload_poll,
        hup,
        stop_rx.clone(),
    ));

    let (mut health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<Rls>>().await;
    let rls = crate::grpc::service(Rls::new(Arc::clone(&limiter)));
    let mut grpc_stop = stop_rx.clone();
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(rls)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)),
                async move {
                    let _ = grpc_stop.wait_for(|s| *s).await;
                },
            ),
    );
    let mut http_stop = stop_rx.clone();
    let app = router(HttpState {
        limiter: Arc::clone(&limiter),
        metrics,
    });
    let http_task = tokio::spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(async move {
                let _ = http_stop.wait_for(|s| *s).await;
            })
            .await
    });

    shutdown_signal(stop).await;
    tracing::info!("shutting down: finishing in-flight calls");
    // Health watchers (`grpc.health.v1.Health/Watch`, a stream with no end of its own) are told
    // NOT_SERVING, then their streams end: the graceful shutdown waits for every open stream, so
    // one open watch used to hold the process up for as long as its client kept it.
    let rls_name = <RateLimitServiceServer<Rls> as tonic::server::NamedService>::NAME;
    for service in ["", rls_name] {
        health
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
        health.clear_service_status(service).await;
    }
    let _ = stop_tx.send(true);
    grpc_task.await??;
    http_task.await??;
    tracing::info!("stopped");
    Ok(())
}

/// The process's signal handlers, installed once at start.
struct Signals {
    /// SIGTERM and SIGINT (`None`: they could not be installed; Ctrl-C is waited for instead).
    stop: Option<(Signal, Signal)>,
    /// SIGHUP (`None`: file polling only).
    hup: Option<Signal>,
}

impl Signals {
    fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let stop = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "no SIGTERM/SIGINT handler; waiting for Ctrl-C instead");
                None
            }
        };
        let hup = signal(SignalKind::hangup())
            .map_err(|e| tracing::warn!(error = %e, "no SIGHUP handler; file polling only"))
            .ok();
        Signals { stop, hup }
    }
}

async fn shutdown_signal(stop: Option<(Signal, Signal)>) {
    match stop {
        Some((mut term, mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// What identifies one version of the file (mtime, length, content).
fn fingerprint(path: &Path) -> Option<(SystemTime, Vec<u8>)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, std::fs::read(path).ok()?))
}

/// Reloads on SIGHUP and when the file changes (polled every `poll`; 0: SIGHUP only). A config
/// that fails to load or build is logged and the running one kept.
///
/// Polling rather than inotify (the `notify` crate): one stat and read per second is negligible,
/// it follows editors' rename-over-the-file saves and Kubernetes' ConfigMap symlink swaps without
/// re-arming watches, and it needs no extra dependency.
async fn reloader(
    path: PathBuf,
    limiter: Arc<Limiter>,
    poll: Duration,
    mut hup: Option<Signal>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = fingerprint(&path).map(|(_, body)| body);
    let mut tick = tokio::time::interval(if poll.is_zero() {
        Duration::from_secs(3600)
    } else {
        poll
    });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reason = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending().await } } => "sighup",
            _ = tick.tick() => {
                if poll.is_zero() { continue; }
                let now = fingerprint(&path).map(|(_, body)| body);
                if now.is_none() || now == last { continue; }
                "file changed"
            }
        };
        last = fingerprint(&path).map(|(_, body)| body);
        match ServerConfig::load(&path)
            .map_err(|e| e.to_string())
            .and_then(|c| limiter.reload(&c))
        {
            Ok(()) => {
                metrics::counter!("tollgate_server_reloads_total", "result" => "ok").increment(1);
                tracing::info!(reason, path = %path.display(), "config reloaded");
            }
            Err(e) => {
                metrics::counter!("tollgate_server_reloads_total", "result" => "error")
                    .increment(1);
                tracing::error!(reason, path = %path.display(), error = %e, "reload rejected; old config kept");
            }
        }
    }
}
