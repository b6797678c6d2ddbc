//! TLS and mutual TLS on the gRPC port (`[server.tls]`, see [`GrpcTls`]).
//!
//! Each accepted connection is handshaken on its own task against the rustls config live at that
//! moment ([`LiveTls`]), so a reload that changes the certificate, the key or the client CA takes
//! effect for the next connection while open ones keep theirs. A handshake that fails is counted
//! in `tollgate_server_tls_refused_total{reason}` ([`Refusal`]) and the connection closed; only
//! finished handshakes reach the gRPC server.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

use crate::config::GrpcTls;

/// Why the TLS settings could not be turned into a server config.
#[derive(Debug)]
pub enum TlsError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
    /// A PEM file held nothing usable of what it should (no certificate, no private key) or
    /// could not be parsed.
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// rustls refused the material (a key that does not match the certificate, a CA that is not
    /// a usable trust anchor, ...).
    Rejected {
        /// What was being built.
        what: &'static str,
        /// rustls' reason.
        reason: String,
    },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, error } => {
                write!(f, "tls: cannot read {}: {error}", path.display())
            }
            TlsError::Pem { path, what } => write!(f, "tls: {}: {what}", path.display()),
            TlsError::Rejected { what, reason } => write!(f, "tls: {what}: {reason}"),
        }
    }
}

impl std::error::Error for TlsError {}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let pem_error = |e: rustls::pki_types::pem::Error| TlsError::Pem {
        path: path.to_owned(),
        what: e.to_string(),
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Builds the rustls server config the settings describe: the certificate chain and key, ALPN
/// `h2` (gRPC), TLS 1.2 and 1.3 on the ring provider, and with `client_ca` a client certificate
/// required and verified against it.
///
/// # Errors
/// [`TlsError`] naming the file or the reason.
pub fn server_config(settings: &GrpcTls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    // rustls 0.23.48 deprecates its ring provider because ring has no post-quantum key exchange
    // (X25519MLKEM768); aws-lc-rs has, at the price of cmake and a much longer build. The key
    // exchange here is X25519 / P-256 (classical): see guides/envoy-tls.md.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&settings.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read(&settings.key)?).map_err(|e| TlsError::Pem {
        path: settings.key.clone(),
        what: format!("no usable private key: {e}"),
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rejected {
            what: "protocol versions",
            reason: e.to_string(),
        })?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    path: ca.clone(),
                    what: format!("not a usable CA certificate: {e}"),
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| TlsError::Rejected {
                what: "client CA",
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rejected {
            what: "certificate and key",
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A built TLS config: what [`LiveTls`] hands new connections.
pub struct TlsState {
    config: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
}

impl TlsState {
    /// Reads and checks the files `settings` names (see [`server_config`]).
    ///
    /// # Errors
    /// See [`server_config`].
    pub fn new(settings: &GrpcTls) -> Result<Self, TlsError> {
        Ok(TlsState {
            config: server_config(settings)?,
            handshake_timeout: settings.handshake_timeout,
        })
    }
}

/// The TLS config new connections are handshaken with; a reload replaces it.
pub struct LiveTls {
    current: ArcSwap<TlsState>,
}

impl LiveTls {
    /// Starting with `state`.
    pub fn new(state: TlsState) -> Self {
        LiveTls {
            current: ArcSwap::from_pointee(state),
        }
    }

    /// Makes `state` the one new connections get; open connections keep theirs.
    pub fn replace(&self, state: TlsState) {
        self.current.store(Arc::new(state));
    }
}

/// Why a handshake was refused: the `reason` label of `tollgate_server_tls_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Mutual TLS and the client sent no certificate.
    NoClientCertificate,
    /// The client's certificate did not verify against the client CA (unknown issuer, expired,
    /// wrong usage, bad signature, ...).
    BadClientCertificate,
    /// The client ended the handshake with an alert (typically: it does not trust our
    /// certificate).
    ClientAlert,
    /// The bytes were not a TLS handshake (a plaintext client, for one) or broke the protocol.
    Protocol,
    /// The handshake did not finish within `handshake_timeout`.
    Timeout,
    /// The connection closed or failed mid-handshake.
    Io,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoClientCertificate => "no_client_certificate",
            Refusal::BadClientCertificate => "bad_client_certificate",
            Refusal::ClientAlert => "client_alert",
            Refusal::Protocol => "protocol",
            Refusal::Timeout => "timeout",
            Refusal::Io => "io",
        }
    }

    /// The refusal a failed handshake's error stands for.
    pub fn of(error: &io::Error) -> Refusal {
        let Some(tls) = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        else {
            return Refusal::Io;
        };
        match tls {
            rustls::Error::NoCertificatesPresented => Refusal::NoClientCertificate,
            rustls::Error::InvalidCertificate(_) => Refusal::BadClientCertificate,
            rustls::Error::AlertReceived(_) => Refusal::ClientAlert,
            _ => Refusal::Protocol,
        }
    }
}

/// The accepted connections of `listener`, each handshaken (on its own task, so a slow client
/// holds up no other) against `tls`'s config of the moment. Ends when the receiver is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<LiveTls>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Per-connection errors (the peer reset before accept, too many open
                        // files): the listener itself goes on.
                        tracing::debug!(error = %e, "accept failed");
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, timeout) = {
                let current = tls.current.load();
                (
                    tokio_rustls::TlsAcceptor::from(Arc::clone(&current.config)),
                    current.handshake_timeout,
                )
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let refusal = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                        return;
                    }
                    Ok(Err(e)) => {
                        let refusal = Refusal::of(&e);
                        tracing::debug!(%peer, error = %e, reason = refusal.label(), "tls handshake refused");
                        refusal
                    }
                    Err(_) => Refusal::Timeout,
                };
                metrics::counter!("tollgate_server_tls_refused_total", "reason" => refusal.label())
                    .increment(1);
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
