//! Stopping `relay` and `export`: the first SIGINT or SIGTERM asks the job to finish what
//! it has in flight (the relay's batch, the exporter's page and its cursor) and exit 0; a
//! second one ends the process at once with 130, for an operator who will not wait.

use std::future::Future;
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

    /// Watches for the signals from now on, in a task of its own (so that it also runs
    /// while the job is busy and not polling its shutdown future): the first SIGINT or
    /// SIGTERM says on standard error (unless `quiet`) that the job is finishing `what` and
    /// completes the returned future, the job's shutdown; a second one exits the process at
    /// once with 130.
    pub fn watch(mut self, what: &'static str, quiet: bool) -> impl Future<Output = ()> {
        let (first, shutdown) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            self.next().await;
            if !quiet {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "stopping: finishing {what} (signal again to stop at once)"
                );
            }
            let _ = first.send(());
            self.next().await;
            let _ = writeln!(
                std::io::stderr().lock(),
                "stopped at once by a second signal: {what} was not finished"
            );
            std::process::exit(i32::from(INTERRUPTED_STATUS));
        });
        async move {
            // The sender is dropped only by a process that is exiting anyway.
            let _ = shutdown.await;
        }
    }
}
