//! Stopping `relay` and `export`: the first SIGINT or SIGTERM asks the job to finish what
//! it has in flight (the relay's batch, the exporter's page and its cursor) and exit 0; a
//! second one ends the process at once with 130, for an operator who will not wait; and a
//! job that has not finished within its shutdown grace after the first one is ended the same
//! way, so a server that stopped answering cannot hold a stop.
//!
//! The handlers run on a thread of their own, with a runtime of their own: the job's thread
//! may be blocked where no task of its runtime can run (a write into a full pipe, a library
//! call that never yields), and the signals must still be answered.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::failure::Failure;
use crate::follow::INTERRUPTED_STATUS;

/// What the watcher does once a signal comes: set by [`Signals::watch`].
struct Plan {
    what: &'static str,
    quiet: bool,
    grace: Option<Duration>,
    first: oneshot::Sender<()>,
}

/// The handlers of SIGINT and SIGTERM, installed before the job starts: from then on
/// neither signal kills the process by its default action.
pub struct Signals {
    plan: oneshot::Sender<Plan>,
}

impl Signals {
    /// Installs both handlers, on the watcher's thread, and returns once they are in place.
    pub fn install() -> Result<Self, Failure> {
        let (plan, planned) = oneshot::channel::<Plan>();
        let (ready, installed) = std::sync::mpsc::channel::<Result<(), String>>();
        std::thread::Builder::new()
            .name("signals".to_owned())
            .spawn(move || watcher(planned, ready))
            .map_err(|error| Failure::run(format!("cannot start the signal thread: {error}")))?;
        match installed.recv() {
            Ok(Ok(())) => Ok(Signals { plan }),
            Ok(Err(message)) => Err(Failure::run(message)),
            Err(_) => Err(Failure::run("the signal thread ended before it was ready")),
        }
    }

    /// Watches for the signals from now on: the first SIGINT or SIGTERM says on standard
    /// error (unless `quiet`) that the job is finishing `what` and completes the returned
    /// future, the job's shutdown; a second one, or `grace` passing before the process ends
    /// (`None`: no limit), exits the process at once with 130, saying why.
    pub fn watch(
        self,
        what: &'static str,
        quiet: bool,
        grace: Option<Duration>,
    ) -> impl Future<Output = ()> {
        let (first, shutdown) = oneshot::channel::<()>();
        let _ = self.plan.send(Plan {
            what,
            quiet,
            grace,
            first,
        });
        async move {
            // The sender is dropped only by a process that is exiting anyway.
            let _ = shutdown.await;
        }
    }
}

/// The watcher thread: installs the handlers, reports on `ready`, then waits for the plan
/// and the signals.
fn watcher(planned: oneshot::Receiver<Plan>, ready: std::sync::mpsc::Sender<Result<(), String>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(format!(
                "cannot start the signal thread's runtime: {error}"
            )));
            return;
        }
    };
    runtime.block_on(async move {
        let mut incoming = match Incoming::install() {
            Ok(incoming) => incoming,
            Err(message) => {
                let _ = ready.send(Err(message));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        // Signals that come before the plan are kept by the handlers and seen below.
        let Ok(plan) = planned.await else { return };
        incoming.next().await;
        if !plan.quiet {
            let _ = writeln!(
                std::io::stderr().lock(),
                "stopping: finishing {} (signal again to stop at once)",
                plan.what
            );
        }
        let _ = plan.first.send(());
        let line = match plan.grace {
            Some(grace) => tokio::select! {
                () = incoming.next() => None,
                () = tokio::time::sleep(grace) => Some(format!(
                    "stopped at once: {} was not finished within the shutdown grace ({grace:?})",
                    plan.what
                )),
            },
            None => {
                incoming.next().await;
                None
            }
        };
        let line = line.unwrap_or_else(|| {
            format!(
                "stopped at once by a second signal: {} was not finished",
                plan.what
            )
        });
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        std::process::exit(i32::from(INTERRUPTED_STATUS));
    });
}

/// SIGINT and SIGTERM as one stream (Ctrl-C elsewhere).
struct Incoming {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Incoming {
    #[cfg(unix)]
    fn install() -> Result<Self, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|error| format!("cannot install the {name} handler: {error}"))
        };
        Ok(Incoming {
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
        })
    }

    #[cfg(not(unix))]
    fn install() -> Result<Self, String> {
        Ok(Incoming {})
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
}
