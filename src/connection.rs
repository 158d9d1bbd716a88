//! Connecting to SQL Server with tiberius over tokio.

use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use crate::error::{Error, Result};

/// A tiberius client on a tokio TCP stream: what every function of this crate takes.
pub type Client = tiberius::Client<Compat<TcpStream>>;

/// The environment variable the command-line tool and the examples read the connection
/// string from.
pub const URL_VARIABLE: &str = "CHANGEFEED_URL";

/// The connection string from [`URL_VARIABLE`], or an error that says what to set.
pub fn url_from_env() -> Result<String> {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => Ok(url),
        _ => Err(Error::Config(format!(
            "{URL_VARIABLE} is not set: set it to an ADO.NET connection string, e.g. \
             {URL_VARIABLE}='server=tcp:localhost,1433;user=sa;password=...;\
             TrustServerCertificate=true'"
        ))),
    }
}

/// Connects with an ADO.NET-style connection string, e.g.
/// `server=tcp:localhost,1433;user=sa;password=...;database=app;TrustServerCertificate=true`.
///
/// Follows one redirect (Azure SQL's gateway may route the session to another host).
pub async fn connect(ado_connection_string: &str) -> Result<Client> {
    let config = tiberius::Config::from_ado_string(ado_connection_string).map_err(|error| {
        Error::Config(format!(
            "the connection string is not a valid ADO.NET string ({error}); expected e.g. \
             server=tcp:host,1433;user=...;password=...;database=...;TrustServerCertificate=true"
        ))
    })?;
    connect_with(config).await
}

/// Connects with a prepared tiberius configuration.
///
/// The configuration's handshake timeout ([`tiberius::Config::handshake_timeout`], 15 s
/// unless set; the connect timeout of ADO.NET) bounds both steps of opening a connection:
/// the TCP connect (which tiberius leaves to its caller, and which the operating system
/// would otherwise let hang for minutes on an unroutable address) and the login handshake.
/// Either one overrunning it is an [`Error::Connection`] of one line that names the address
/// and the bound. `None` waits as long as the network does.
pub async fn connect_with(mut config: tiberius::Config) -> Result<Client> {
    match open(&config).await {
        Err(Error::Redirect { host, port }) => {
            config.host(&host);
            config.port(port);
            open(&config).await
        }
        other => other,
    }
}

async fn open(config: &tiberius::Config) -> Result<Client> {
    let address = config.get_addr();
    let timeout = config.get_handshake_timeout();
    let tcp = match timeout {
        Some(timeout) => tokio::time::timeout(timeout, TcpStream::connect(&address))
            .await
            .map_err(|_elapsed| {
                Error::Connection(format!(
                    "cannot reach SQL Server at {address}: no answer within {timeout:?}"
                ))
            })?,
        None => TcpStream::connect(&address).await,
    }
    .map_err(|error| Error::Connection(format!("cannot reach SQL Server at {address}: {error}")))?;
    tcp.set_nodelay(true)?;
    match tiberius::Client::connect(config.clone(), tcp.compat_write()).await {
        Ok(client) => Ok(client),
        Err(tiberius::error::Error::Routing { host, port }) => Err(Error::Redirect { host, port }),
        // The handshake timeout: the only timer running before the login completes.
        Err(tiberius::error::Error::Io {
            kind: std::io::ErrorKind::TimedOut,
            ..
        }) => Err(Error::Connection(format!(
            "SQL Server at {address} accepted the TCP connection but did not complete the \
             login within {:?} (a slow or overloaded server, a TLS mismatch, or not SQL Server \
             on that port)",
            timeout.unwrap_or_default()
        ))),
        Err(error) => Err(login_error(error, host_of(&address))),
    }
}

/// A failed handshake as this crate's error. A TLS failure while connecting is a setting to
/// fix (the server's certificate, `TrustServerCertificate`, `Encrypt`), not something a
/// retry cures. 4060 (cannot open the database) is permanent except on Azure SQL Database,
/// which also raises it while a database moves between nodes.
fn login_error(error: tiberius::error::Error, host: &str) -> Error {
    match error {
        tiberius::error::Error::Tls(message) => Error::Config(format!(
            "the TLS handshake with SQL Server at {host} failed: {message}; check the server's \
             certificate, or set TrustServerCertificate=true for a self-signed one"
        )),
        other => on_host(Error::from(other), host),
    }
}

/// `error` as raised by `host`: 4060 from Azure SQL Database becomes transient.
fn on_host(error: Error, host: &str) -> Error {
    match error {
        Error::Server {
            number: 4060,
            message,
            ..
        } if is_azure_sql_database(host) => Error::Connection(format!(
            "SQL Server error 4060 from Azure SQL Database (transient while the database \
             moves or resumes): {message}"
        )),
        error => error,
    }
}

/// The host part of a `host:port` address.
fn host_of(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(host, _)| host)
}

/// Whether `host` is an Azure SQL Database endpoint (public, government and China clouds).
fn is_azure_sql_database(host: &str) -> bool {
    const SUFFIXES: &[&str] = &[
        ".database.windows.net",
        ".database.usgovcloudapi.net",
        ".database.chinacloudapi.cn",
    ];
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    SUFFIXES.iter().any(|suffix| host.ends_with(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn error_4060() -> Error {
        Error::from_server(
            4060,
            1,
            11,
            "Cannot open database \"app\" requested by the login.".to_owned(),
        )
    }

    #[test]
    fn cannot_open_database_is_transient_only_on_azure_sql_database() {
        let on_prem = on_host(error_4060(), "db.example.com");
        assert_eq!(on_prem.server_number(), Some(4060));
        assert!(!on_prem.is_transient());
        let azure = on_host(error_4060(), "MyServer.database.windows.net");
        assert!(azure.is_transient(), "{azure}");
        assert!(azure.to_string().contains("4060"), "{azure}");
    }

    #[test]
    fn tls_failures_while_connecting_are_settings_to_fix() {
        let error = login_error(
            tiberius::error::Error::Tls("invalid peer certificate: UnknownIssuer".into()),
            "db.example.com",
        );
        assert!(matches!(error, Error::Config(_)), "{error:?}");
        assert!(error.to_string().contains("TrustServerCertificate"));
    }

    /// A listener that accepts TCP connections (the kernel completes them) and never
    /// answers a byte.
    fn silent_listener() -> (std::net::TcpListener, u16) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    fn config(port: u16, timeout: Option<Duration>) -> tiberius::Config {
        let mut config = tiberius::Config::from_ado_string(&format!(
            "server=tcp:127.0.0.1,{port};user=sa;password=x;TrustServerCertificate=true"
        ))
        .unwrap();
        config.handshake_timeout(timeout);
        config
    }

    #[tokio::test]
    async fn a_stalled_login_ends_at_the_handshake_timeout_with_one_line() {
        let (_listener, port) = silent_listener();
        let started = std::time::Instant::now();
        let error = connect_with(config(port, Some(Duration::from_millis(300))))
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(10));
        let message = error.to_string();
        assert!(matches!(error, Error::Connection(_)), "{error:?}");
        assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
        assert!(message.contains("within 300ms"), "{message}");
        assert!(
            !message.contains('\n') && !message.contains("Config::"),
            "{message}"
        );
    }
}
