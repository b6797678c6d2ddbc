//! Connecting to the Redis users run: AUTH (a password, or an ACL user and its password) and TLS
//! (`rediss://`, a CA file, optionally a client certificate), with secrets that never print.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use redis::{ErrorKind, IntoConnectionInfo, RedisError};

use crate::config::RedisConfig;
use crate::error::Error;

/// A secret (a Redis password): its `Debug` and `Display` print `[redacted]`, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret held in the file at `path`, without its trailing line break (as a secret mounted
    /// by Kubernetes or written by `echo` holds it).
    ///
    /// # Errors
    /// The file cannot be read or is not UTF-8 (the error names the path, never the content).
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Secret, Error> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|e| {
            setup(
                "cannot read the secret file",
                format!("{}: {e}", path.display()),
            )
        })?;
        Ok(Secret(text.trim_end_matches(['\r', '\n']).to_owned()))
    }

    /// The secret held in the environment variable `name`.
    ///
    /// # Errors
    /// The variable is unset or not UTF-8 (the error names the variable, never its value).
    pub fn from_env(name: &str) -> Result<Secret, Error> {
        std::env::var(name)
            .map(Secret)
            .map_err(|e| setup("cannot read the secret variable", format!("{name}: {e}")))
    }

    /// The value, to hand to the connection.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// TLS files for a `rediss://` URL (PEM). Needs the crate's `tls` feature (rustls).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate (`None`: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// A client certificate, for a server that asks for one (`tls-auth-clients yes`), with
    /// [`client_key`](Self::client_key).
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub client_key: Option<PathBuf>,
}

/// How to authenticate and encrypt a connection, on top of its URL.
///
/// ```
/// use tollgate_redis::{ConnectOptions, Secret};
/// let options = ConnectOptions {
///     username: Some("limiter".to_owned()),
///     password: Some(Secret::new("s3cret")),
///     tls: None,
/// };
/// assert!(!format!("{options:?}").contains("s3cret"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// An ACL user (`None`: the URL's, or `default`).
    pub username: Option<String>,
    /// The password for `AUTH` (`None`: the URL's, if any).
    pub password: Option<Secret>,
    /// TLS files; the URL must then be `rediss://`.
    pub tls: Option<TlsFiles>,
}

fn setup(what: &'static str, detail: String) -> Error {
    Error::Redis(RedisError::from((
        ErrorKind::InvalidClientConfig,
        what,
        detail,
    )))
}

/// [`connect`](crate::connect) with AUTH and TLS from `options`: a lazily connecting,
/// self-reconnecting connection to `url` (`redis://` or `rediss://`) that authenticates (and
/// re-authenticates after each reconnect) as `options` says.
///
/// # Errors
/// [`Error::Redis`] for a malformed URL, TLS files that cannot be read, TLS asked of a build
/// without the `tls` feature, or TLS files with a `redis://` URL. A wrong password shows at the
/// first command (a Redis error, answered by the fault policy), never here.
pub fn connect_with(
    url: &str,
    options: &ConnectOptions,
    config: &RedisConfig,
) -> Result<crate::ConnectionManager, Error> {
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &options.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &options.password {
        settings = settings.set_password(password.expose());
    }
    let info = info.set_redis_settings(settings);
    let client = match &options.tls {
        None => redis::Client::open(info)?,
        Some(files) => tls_client(url, info, files)?,
    };
    let manager = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout()))
        .set_response_timeout(Some(config.timeout()))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200));
    Ok(crate::ConnectionManager::new_lazy_with_config(
        client, manager,
    )?)
}

#[cfg(feature = "tls")]
fn tls_client(
    url: &str,
    info: redis::ConnectionInfo,
    files: &TlsFiles,
) -> Result<redis::Client, Error> {
    if !url.starts_with("rediss://") {
        return Err(setup(
            "TLS files need a rediss:// URL",
            "the URL is not rediss://".to_owned(),
        ));
    }
    let read = |path: &PathBuf| {
        std::fs::read(path)
            .map_err(|e| setup("cannot read a TLS file", format!("{}: {e}", path.display())))
    };
    let root_cert = files.ca_file.as_ref().map(read).transpose()?;
    let client_tls = match (&files.client_cert, &files.client_key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(setup(
                "a client certificate needs its key",
                "give both client_cert and client_key".to_owned(),
            ));
        }
    };
    Ok(redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )?)
}

#[cfg(not(feature = "tls"))]
fn tls_client(_: &str, _: redis::ConnectionInfo, _: &TlsFiles) -> Result<redis::Client, Error> {
    Err(setup(
        "TLS needs tollgate-redis's `tls` feature",
        "this build has no TLS".to_owned(),
    ))
}
