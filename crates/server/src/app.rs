//! Running the server: both listeners, reload on file change and SIGHUP, graceful SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::Signal;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::grpc::{RateLimitServiceServer, Rls};
use crate::http_api::{HttpState, router};
use crate::service::LiveDomains;
use crate::tls::{LiveTls, TlsState};

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
    // The file as it is before it is read: a change from here on is a change for the reloader.
    // (Fingerprinted when the reloader started, a change made between this load and that start
    // was never applied; a test that rewrote the config right after start caught it.)
    let unread = fingerprint(&path, &[]);
    let config = ServerConfig::load(&path)?;
    let watched = tls_files(&config);
    let initial = unread.map(|mut parts| {
        parts.extend(file_parts(&watched));
        parts
    });
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
    let limiter = Arc::new(LiveDomains::new(&config)?);
    let tls = match &config.server.tls {
        Some(settings) => Some(Arc::new(LiveTls::new(TlsState::new(settings)?))),
        None => None,
    };
    let grpc = TcpListener::bind(overrides.grpc.unwrap_or(config.server.grpc)).await?;
    let http = TcpListener::bind(overrides.http.unwrap_or(config.server.http)).await?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    println!("grpc listening on {grpc_addr}");
    println!("http listening on {http_addr}");
    let grpc_tls = match &config.server.tls {
        None => "off",
        Some(t) if t.client_ca.is_some() => "mutual",
        Some(_) => "on",
    };
    tracing::info!(%grpc_addr, %http_addr, grpc_tls, domains = config.domains.len(), "tollgate-server started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let Signals { stop, hup } = signals;
    tokio::spawn(reloader(
        path,
        (initial, watched),
        Arc::clone(&limiter),
        tls.clone(),
        config.server.reload_poll,
        hup,
        stop_rx.clone(),
    ));

    let (mut health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<Rls>>().await;
    let rls = crate::grpc::service(Rls::new(Arc::clone(&limiter)));
    let mut grpc_stop = stop_rx.clone();
    let grpc_stopped = async move {
        let _ = grpc_stop.wait_for(|s| *s).await;
    };
    let grpc_router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(rls);
    let grpc_task = match tls {
        Some(tls) => tokio::spawn(
            grpc_router.serve_with_incoming_shutdown(crate::tls::incoming(grpc, tls), grpc_stopped),
        ),
        None => tokio::spawn(grpc_router.serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)),
            grpc_stopped,
        )),
    };
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

/// What identifies one version of the config: the file's bytes and those of the TLS files it
/// names (`None` when the config file cannot be read).
fn fingerprint(path: &Path, tls_files: &[PathBuf]) -> Option<Vec<Vec<u8>>> {
    let mut parts = vec![std::fs::read(path).ok()?];
    parts.extend(file_parts(tls_files));
    Some(parts)
}

/// The contents of `files`; one that cannot be read counts as empty (its coming back is a change).
fn file_parts(files: &[PathBuf]) -> impl Iterator<Item = Vec<u8>> + '_ {
    files.iter().map(|f| std::fs::read(f).unwrap_or_default())
}

/// The TLS files `config` names.
fn tls_files(config: &ServerConfig) -> Vec<PathBuf> {
    config
        .server
        .tls
        .iter()
        .flat_map(|t| t.files().map(Path::to_owned))
        .collect()
}

/// Applies a loaded config: its TLS files are read and checked first, then the domains are
/// reloaded (all or nothing), then the new TLS config is made the one new connections get. Any
/// failure leaves everything as it was.
fn apply(
    config: &ServerConfig,
    limiter: &LiveDomains,
    tls: Option<&LiveTls>,
) -> Result<(), String> {
    let next_tls = match (tls, &config.server.tls) {
        (Some(_), Some(settings)) => Some(TlsState::new(settings).map_err(|e| e.to_string())?),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(
                "[server.tls] was added or removed: TLS on the gRPC port is turned on \
                        or off by a restart, not a reload"
                    .into(),
            );
        }
    };
    limiter.reload(config)?;
    if let (Some(live), Some(next)) = (tls, next_tls) {
        live.replace(next);
    }
    Ok(())
}

/// Reloads on SIGHUP and when the file, or a TLS file it names, changes (polled every `poll`;
/// 0: SIGHUP only). A config that fails to load or build is logged and the running one kept.
///
/// Polling rather than inotify (the `notify` crate): one stat and read per second is negligible,
/// it follows editors' rename-over-the-file saves and Kubernetes' ConfigMap and Secret symlink
/// swaps without re-arming watches, and it needs no extra dependency.
///
/// `(last, watched)`: the fingerprint of the files as the running config was read from them, and
/// the TLS files of the config last read (applied or not), so that fixing a certificate that a
/// reload refused is noticed too.
async fn reloader(
    path: PathBuf,
    (mut last, mut watched): (Option<Vec<Vec<u8>>>, Vec<PathBuf>),
    limiter: Arc<LiveDomains>,
    tls: Option<Arc<LiveTls>>,
    poll: Duration,
    mut hup: Option<Signal>,
    mut stop: watch::Receiver<bool>,
) {
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
                let now = fingerprint(&path, &watched);
                if now.is_none() || now == last { continue; }
                "file changed"
            }
        };
        let loaded = ServerConfig::load(&path);
        if let Ok(config) = &loaded {
            watched = tls_files(config);
        }
        last = fingerprint(&path, &watched);
        match loaded
            .map_err(|e| e.to_string())
            .and_then(|config| apply(&config, &limiter, tls.as_deref()))
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
