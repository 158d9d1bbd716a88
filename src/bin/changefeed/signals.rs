//! Stopping `relay` and `export`: the first SIGINT or SIGTERM asks the job to finish what
//! it has in flight (the relay's batch, the exporter's page and its cursor) and exit 0; a
//! second one ends the process at once with 130, for an operator who will not wait.

use std::io::Write;

use crate::Failure;
use crate::follow::INTERRUPTED_STATUS;

/// The handlers of SIGINT and SIGTERM, installed before the job starts: from then on
/// neither signal kills the process by its default action.
pub struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs both handlers.
    #[cfg(unix)]
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|error| {
                Failure::run(format!("cannot install the {name} handler: {error}"))
            })
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
        })
    }

    /// Elsewhere Ctrl-C is the signal.
    #[cfg(not(unix))]
    pub fn install() -> Result<Self, Failure> {
        Ok(Signals {})
    }

    /// The next SIGINT or SIGTERM.
    #[cfg(unix)]
    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Completes at the first signal, after saying on standard error (unless `quiet`) that
    /// the job is finishing `what`; from then on a second signal exits at once with 130.
    /// The job's shutdown future.
    pub async fn first(mut self, what: &'static str, quiet: bool) {
        self.next().await;
        if !quiet {
            let _ = writeln!(
                std::io::stderr().lock(),
                "stopping: finishing {what} (signal again to stop at once)"
            );
        }
        tokio::spawn(async move {
            self.next().await;
            let _ = writeln!(
                std::io::stderr().lock(),
                "stopped at once by a second signal: {what} was not finished"
            );
            std::process::exit(i32::from(INTERRUPTED_STATUS));
        });
    }
}
