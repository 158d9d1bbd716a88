//! `changefeed`: the command-line tool of the crate (feature `cli`).
//!
//! ```text
//! changefeed migrate
//! changefeed setup-feed app.OrderPlaced --outbox
//! changefeed tail app.OrderPlaced --from 2024-05-01T12:00:00Z --with-event
//! changefeed status --consumers
//! changefeed purge app.OrderPlaced --older-than 30d --dry-run
//! changefeed purge-outbox dbo.outbox --older-than 7d
//! ```
//!
//! The connection string comes from `--url` or `CHANGEFEED_URL`. Every failure is one line
//! on standard error, `error: …`, and the exit status says which kind: 1 the command
//! failed, 2 the arguments were refused or there is no usable connection (no URL, an
//! unreachable server, a refused login).

mod args;
mod commands;
mod duration;
mod json;
mod output;
mod relay;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::{ContextKind, ErrorKind};

/// Why a command stopped: the line to print (none for a closed output pipe) and the exit
/// status.
#[derive(Debug)]
pub struct Failure {
    message: Option<String>,
    code: u8,
}

impl Failure {
    /// Bad arguments or settings, found before connecting: exit status 2.
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            message: Some(message.into()),
            code: 2,
        }
    }

    /// No usable connection (unreachable server, refused login, bad connection string):
    /// exit status 2.
    pub fn connect(message: impl Into<String>) -> Self {
        Failure {
            message: Some(message.into()),
            code: 2,
        }
    }

    /// The command failed: exit status 1.
    pub fn run(message: impl Into<String>) -> Self {
        Failure {
            message: Some(message.into()),
            code: 1,
        }
    }

    /// Standard output was closed by its reader (`| head`): stop without a word.
    pub fn quiet() -> Self {
        Failure {
            message: None,
            code: 0,
        }
    }
}

impl From<changefeed::Error> for Failure {
    fn from(error: changefeed::Error) -> Self {
        Failure::run(error.to_string())
    }
}

/// Prints `error: <message>` on standard error, on one line whatever the message holds.
fn print_error(message: &str) {
    let line: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Nothing sensible is left to do if standard error is closed.
    let _ = writeln!(std::io::stderr().lock(), "error: {}", line.join(" "));
}

/// The one-line message of a value clap's parser refused (a feed name, a duration,
/// `--from`), or `None` for the other errors, which clap prints itself with the usage.
fn value_error_line(error: &clap::Error) -> Option<String> {
    if error.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let argument = error.get(ContextKind::InvalidArg)?.to_string();
    let value = error.get(ContextKind::InvalidValue)?.to_string();
    let reason = std::error::Error::source(error)
        .map(ToString::to_string)
        .unwrap_or_else(|| "invalid value".to_owned());
    Some(format!(
        "invalid value {} for {argument}: {reason}",
        output::one_line(&format!("{value:?}"))
    ))
}

fn main() -> ExitCode {
    // A bug must still end with one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        print_error(&format!("internal error (a bug in changefeed): {info}"));
    }));

    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            if let Some(line) = value_error_line(&error) {
                print_error(&line);
                return ExitCode::from(2);
            }
            // --help, --version, or a usage error with clap's own explanation.
            let _ = error.print();
            return ExitCode::from(error.exit_code().clamp(0, 255) as u8);
        }
    };

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            print_error(&format!("cannot start the tokio runtime: {error}"));
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if let Some(message) = &failure.message {
                print_error(message);
            }
            ExitCode::from(failure.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_values_become_one_line_naming_the_argument() {
        let error = args::Cli::try_parse_from([
            "changefeed",
            "purge",
            "dbo.x]; drop table y",
            "--older-than",
            "30d",
        ])
        .unwrap_err();
        let line = value_error_line(&error).unwrap();
        assert!(
            line.starts_with("invalid value \"dbo.x]; drop table y\" for <SCHEMA.TABLE>: "),
            "{line}"
        );
        assert!(line.contains("']'"), "{line}");

        let error =
            args::Cli::try_parse_from(["changefeed", "purge", "app.Event", "--older-than", "30x"])
                .unwrap_err();
        let line = value_error_line(&error).unwrap();
        assert!(
            line.starts_with("invalid value \"30x\" for --older-than <DURATION>: "),
            "{line}"
        );

        let error = args::Cli::try_parse_from(["changefeed", "tail", "a.b\nc"]).unwrap_err();
        let line = value_error_line(&error).unwrap();
        assert!(!line.contains('\n'), "{line}");

        // A missing argument keeps clap's explanation and usage.
        let error = args::Cli::try_parse_from(["changefeed", "purge", "app.Event"]).unwrap_err();
        assert!(value_error_line(&error).is_none());
    }
}
