//! `changefeed`: the command-line tool of the crate (feature `cli`).
//!
//! ```text
//! changefeed migrate
//! changefeed setup-feed app.OrderPlaced --outbox
//! changefeed tail app.OrderPlaced --from 2024-05-01T12:00:00Z --with-event
//! changefeed status --consumers
//! changefeed purge app.OrderPlaced --older-than 30d --dry-run
//! changefeed purge-outbox dbo.outbox --older-than 7d
//! changefeed relay --outbox dbo.outbox --brokers kafka:9092          # feature kafka
//! changefeed export app.OrderPlaced --brokers kafka:9092 --topic orders --consumer export
//! ```
//!
//! The connection string comes from `--url` or `CHANGEFEED_URL`. Every failure is one line
//! on standard error, `error: …`, and the exit status says which kind: 1 the command
//! failed, 2 the arguments were refused or there is no usable connection (no URL, an
//! unreachable server, a refused login, no Kafka broker answering). `tail` stopped by
//! Ctrl-C exits with 130, like `tail -f`; `relay` and `export` stopped by SIGINT or SIGTERM
//! finish their batch and exit with 0, and with 130 at once on a second signal.

mod args;
mod commands;
mod database;
mod duration;
mod endpoints;
mod failure;
mod follow;
mod kafka;
mod logging;
mod output;
mod progress;
mod prometheus;
mod signals;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::{ContextKind, ErrorKind};

/// Prints `error: <message>` on standard error, on one line whatever the message holds.
fn print_error(message: &str) {
    let line: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if logging::json() {
        tracing::error!(target: "changefeed", "{}", line.join(" "));
        return;
    }
    // Nothing sensible is left to do if standard error is closed.
    let _ = writeln!(std::io::stderr().lock(), "error: {}", line.join(" "));
}

/// The one line (without `error: `) for an error of clap's parser, or `None` for `--help`
/// and `--version`, which clap prints itself.
///
/// A refused value (a feed name, a duration, `--from`, a number) names the argument, the
/// value and the reason. Any other error keeps clap's explanation without its usage block:
/// `unexpected argument '--bogus' found; see changefeed tail --help`.
fn clap_error_line(error: &clap::Error) -> Option<String> {
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => return None,
        ErrorKind::ValueValidation => {
            if let (Some(argument), Some(value)) = (
                error.get(ContextKind::InvalidArg),
                error.get(ContextKind::InvalidValue),
            ) {
                let reason = std::error::Error::source(error)
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "invalid value".to_owned());
                return Some(format!(
                    "invalid value {} for {argument}: {reason}",
                    output::one_line(&format!("{:?}", value.to_string()))
                ));
            }
        }
        _ => {}
    }
    // clap's rendering: "error: <what>", maybe indented details and a tip, then the usage
    // and "For more information, try '--help'.". Keep what and details, drop the rest.
    let rendered = error.render().to_string();
    let mut parts = Vec::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("Usage: ") {
            usage = rest
                .split_whitespace()
                .take_while(|word| !word.starts_with(['[', '<', '-']))
                .map(str::to_owned)
                .reduce(|a, b| format!("{a} {b}"));
            break;
        }
        if !line.is_empty() && !line.starts_with("tip:") {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let mut text = parts.join(" ");
    text.push_str(&format!(
        "; see {} --help",
        usage.as_deref().unwrap_or("changefeed")
    ));
    Some(output::one_line(&text))
}

fn main() -> ExitCode {
    // A bug must still end with one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        print_error(&format!("internal error (a bug in changefeed): {info}"));
    }));

    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            if let Some(line) = clap_error_line(&error) {
                print_error(&line);
                return ExitCode::from(2);
            }
            // --help or --version.
            let _ = error.print();
            return ExitCode::from(error.exit_code().clamp(0, 255) as u8);
        }
    };

    logging::init(cli.log_format);

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
            if let Some(message) = failure.message() {
                print_error(message);
            }
            ExitCode::from(failure.code())
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
        let line = clap_error_line(&error).unwrap();
        assert!(
            line.starts_with("invalid value \"dbo.x]; drop table y\" for <SCHEMA.TABLE>: "),
            "{line}"
        );
        assert!(line.contains("']'"), "{line}");

        let error =
            args::Cli::try_parse_from(["changefeed", "purge", "app.Event", "--older-than", "30x"])
                .unwrap_err();
        let line = clap_error_line(&error).unwrap();
        assert!(
            line.starts_with("invalid value \"30x\" for --older-than <DURATION>: "),
            "{line}"
        );

        let error = args::Cli::try_parse_from(["changefeed", "tail", "a.b\nc"]).unwrap_err();
        let line = clap_error_line(&error).unwrap();
        assert!(!line.contains('\n'), "{line}");

        // A missing argument keeps clap's explanation on one line, and where to look.
        let error = args::Cli::try_parse_from(["changefeed", "purge", "app.Event"]).unwrap_err();
        let line = clap_error_line(&error).unwrap();
        assert!(line.contains("--older-than"), "{line}");
        assert!(line.ends_with("; see changefeed purge --help"), "{line}");
        let error =
            args::Cli::try_parse_from(["changefeed", "tail", "app.Event", "--bogus"]).unwrap_err();
        let line = clap_error_line(&error).unwrap();
        assert!(
            line.starts_with("unexpected argument '--bogus' found"),
            "{line}"
        );
        assert!(!line.contains("Usage") && !line.contains("tip"), "{line}");
        let error = args::Cli::try_parse_from(["changefeed", "--help"]).unwrap_err();
        assert!(clap_error_line(&error).is_none());
    }
}
