//! The subcommands, one file each: `run` picks the one the command line asks for. What
//! they share about the database is in `crate::database`, how they print in
//! `crate::output`.

mod export;
mod migrate;
mod purge;
mod purge_outbox;
mod relay;
mod setup_feed;
mod setup_outbox;
mod status;
mod tail;

use changefeed::Error;
use changefeed::connection::url_from_env;

use crate::args::{Cli, Command};
use crate::database::Connect;
use crate::failure::Failure;
use crate::output::Out;

/// Runs the command `cli` asks for.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    let url = resolve_url(cli.url)?;
    let connect = Connect {
        url,
        timeout: cli.connect_timeout.value,
    };
    let mut out = Out;
    match cli.command {
        Command::Migrate => migrate::migrate(&connect, &mut out).await,
        Command::SetupOutbox(args) => setup_outbox::setup_outbox(&connect, &mut out, args).await,
        Command::SetupFeed(args) => setup_feed::setup_feed(&connect, &mut out, args).await,
        Command::Tail(args) => tail::tail(&connect, args).await,
        Command::Status(args) => status::status(&connect, &mut out, args).await,
        Command::Purge(args) => purge::purge(&connect, &mut out, args).await,
        Command::PurgeOutbox(args) => purge_outbox::purge_outbox(&connect, &mut out, args).await,
        Command::Relay(args) => relay::relay(&connect, args).await,
        Command::Export(args) => export::export(&connect, args).await,
    }
}

/// `--url` if given (clap has already looked at `CHANGEFEED_URL`), else the variable's
/// error, which says what to set.
fn resolve_url(url: Option<String>) -> Result<String, Failure> {
    match url {
        Some(url) if !url.trim().is_empty() => Ok(url),
        _ => match url_from_env() {
            Ok(url) => Ok(url),
            Err(Error::Config(message)) => {
                Err(Failure::usage(format!("{message} (or pass --url)")))
            }
            Err(other) => Err(Failure::usage(other.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_url_wins_and_a_blank_one_does_not_count() {
        assert_eq!(resolve_url(Some("server=x".into())).unwrap(), "server=x");
        // Without the variable (not set in the test environment, or set: either way the
        // blank --url is not used).
        match resolve_url(Some("  ".into())) {
            Ok(url) => assert!(!url.trim().is_empty()),
            Err(failure) => {
                let message = failure.message().unwrap();
                assert!(
                    message.starts_with("CHANGEFEED_URL is not set"),
                    "{message}"
                );
                assert!(message.contains("--url"), "{message}");
                assert_eq!(failure.code(), 2);
            }
        }
    }
}
