//! SQL Server 2022 in a container, started with testcontainers, for the examples that can
//! run without a server of the caller's (bench, live_suite).
//!
//! A failure (no Docker engine) comes back as an error, never a panic: a panic inside
//! testcontainers is caught and its message kept, so the caller prints one line.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use testcontainers::ContainerAsync;
use testcontainers::runners::AsyncRunner;
use testcontainers_modules::mssql_server::MssqlServer;

/// How long pulling the image and starting the server may take.
const START_LIMIT: Duration = Duration::from_secs(900);

/// A started server: its ADO.NET connection string (as `sa`, no database) and the container,
/// to remove at the end.
pub struct Started {
    /// `server=tcp:host,port;user=sa;password=...;TrustServerCertificate=true`.
    pub ado: String,
    /// Remove it with `container.rm()` when done.
    pub container: ContainerAsync<MssqlServer>,
}

/// Starts SQL Server 2022. When the start takes more than a few seconds (pulling the
/// image), prints `notice` once on stderr, so a machine without Docker still gets exactly
/// one line from the caller and nothing from here.
pub async fn start_sql_server(notice: &str) -> Result<Started, String> {
    let start = async {
        let container = MssqlServer::default()
            .with_accept_eula()
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(1433)
            .await
            .map_err(|e| e.to_string())?;
        let host = container
            .get_host()
            .await
            .map(|h| h.to_string())
            .unwrap_or_else(|_| "127.0.0.1".to_owned());
        // The port is the IPv4 one: do not let "localhost" resolve to ::1.
        let host = if host == "localhost" {
            "127.0.0.1".to_owned()
        } else {
            host
        };
        let ado = format!(
            "server=tcp:{host},{port};user=sa;password={};TrustServerCertificate=true",
            MssqlServer::DEFAULT_SA_PASSWORD
        );
        Ok::<_, String>(Started { ado, container })
    };
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut start = std::pin::pin!(AssertUnwindSafe(start).catch_unwind());
    let outcome = tokio::select! {
        outcome = &mut start => outcome,
        () = tokio::time::sleep(Duration::from_secs(3)) => {
            eprintln!("{notice}");
            match tokio::time::timeout(START_LIMIT, &mut start).await {
                Ok(outcome) => outcome,
                Err(_) => Ok(Err(format!("the container did not start within {START_LIMIT:?}"))),
            }
        }
    };
    std::panic::set_hook(previous_hook);
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "testcontainers panicked".to_owned())),
    }
}
