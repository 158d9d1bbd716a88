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
    let tcp = TcpStream::connect(&address).await.map_err(|error| {
        Error::Connection(format!("cannot reach SQL Server at {address}: {error}"))
    })?;
    tcp.set_nodelay(true)?;
    match tiberius::Client::connect(config.clone(), tcp.compat_write()).await {
        Ok(client) => Ok(client),
        Err(tiberius::error::Error::Routing { host, port }) => Err(Error::Redirect { host, port }),
        Err(error) => Err(error.into()),
    }
}
