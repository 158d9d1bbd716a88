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
use crate::database::{Connect, Store};
use crate::failure::Failure;
use crate::output::Out;

/// Runs the command `cli` asks for.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    let url = resolve_url(cli.url)?;
    supported(&cli.command, Store::of(&url))?;
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

/// Every subcommand and the stores it works on (what its `--help` says).
const STORES: &[(&str, &[Store])] = {
    const FEEDS: &[Store] = &[Store::SqlServer, Store::Postgres];
    const ALL: &[Store] = &Store::ALL;
    &[
        ("migrate", ALL),
        ("setup-feed", FEEDS),
        ("tail", FEEDS),
        ("status", ALL),
        ("purge", FEEDS),
        ("purge-outbox", ALL),
        ("setup-outbox", ALL),
        ("relay", ALL),
        ("export", FEEDS),
    ]
};

/// The subcommand's name, as typed.
fn name(command: &Command) -> &'static str {
    match command {
        Command::Migrate => "migrate",
        Command::SetupFeed(_) => "setup-feed",
        Command::Tail(_) => "tail",
        Command::Status(_) => "status",
        Command::Purge(_) => "purge",
        Command::PurgeOutbox(_) => "purge-outbox",
        Command::SetupOutbox(_) => "setup-outbox",
        Command::Relay(_) => "relay",
        Command::Export(_) => "export",
    }
}

/// Refuses, before anything connects, a command given the URL of a store it does not work
/// on: the line names the store, the stores the command takes, and the commands that store
/// takes (exit status 2, like any other bad argument).
fn supported(command: &Command, store: Store) -> Result<(), Failure> {
    let name = name(command);
    let stores = STORES
        .iter()
        .find(|(command, _)| *command == name)
        .map_or(&[][..], |&(_, stores)| stores);
    if stores.contains(&store) {
        return Ok(());
    }
    let takes: Vec<&str> = stores.iter().map(|store| store.name()).collect();
    let others: Vec<&str> = STORES
        .iter()
        .filter(|(_, stores)| stores.contains(&store))
        .map(|&(command, _)| command)
        .collect();
    Err(Failure::usage(format!(
        "{name} does not work on {}: it takes {}; the commands for {} are {}",
        store.described(),
        takes.join(" or "),
        store.name(),
        others.join(", ")
    )))
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
    use clap::{CommandFactory, Parser};

    fn command(args: &[&str]) -> Command {
        Cli::try_parse_from(std::iter::once("changefeed").chain(args.iter().copied()))
            .unwrap()
            .command
    }

    #[test]
    fn every_subcommand_says_which_stores_it_takes() {
        let cli = Cli::command();
        let subcommands: Vec<&str> = cli
            .get_subcommands()
            .map(clap::Command::get_name)
            .filter(|name| *name != "help")
            .collect();
        let listed: Vec<&str> = STORES.iter().map(|&(name, _)| name).collect();
        assert_eq!(subcommands, listed);
        // Each subcommand's help names the stores it takes.
        for subcommand in cli.get_subcommands() {
            let Some(&(_, stores)) = STORES.iter().find(|(n, _)| *n == subcommand.get_name())
            else {
                continue;
            };
            let about = subcommand.get_about().unwrap().to_string();
            for store in stores {
                let named = match store {
                    Store::SqlServer => "SQL Server",
                    Store::Postgres => "PostgreSQL",
                    Store::Mysql => "MariaDB/MySQL",
                };
                assert!(about.contains(named), "{}: {about}", subcommand.get_name());
            }
        }
    }

    #[test]
    fn the_outbox_commands_take_every_store() {
        for args in [
            &["setup-outbox", "dbo.outbox"][..],
            &["purge-outbox", "dbo.outbox", "--older-than", "7d"],
            &["status"],
            &["relay", "--outbox", "dbo.outbox"],
        ] {
            for store in Store::ALL {
                assert!(
                    supported(&command(args), store).is_ok(),
                    "{args:?} {store:?}"
                );
            }
        }
    }

    #[test]
    fn a_feed_command_on_mariadb_names_the_store_and_its_commands() {
        for args in [
            &["setup-feed", "app.Event", "--outbox"][..],
            &["tail", "app.Event"],
            &["purge", "app.Event", "--older-than", "30d"],
        ] {
            let failure = supported(&command(args), Store::Mysql).unwrap_err();
            assert_eq!(failure.code(), 2, "{args:?}");
            let line = failure.message().unwrap();
            assert_eq!(
                line,
                format!(
                    "{} does not work on MariaDB/MySQL (a mysql:// --url): it takes SQL Server \
                     or PostgreSQL; the commands for MariaDB/MySQL are migrate, status, \
                     purge-outbox, setup-outbox, relay",
                    args[0]
                )
            );
            for store in [Store::SqlServer, Store::Postgres] {
                assert!(
                    supported(&command(args), store).is_ok(),
                    "{args:?} {store:?}"
                );
            }
        }
    }

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
