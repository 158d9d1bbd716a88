//! Why a command stopped: the one line it ends with and the exit status, which says what
//! kind of failure it was (1 the command failed, 2 bad arguments or no usable connection,
//! 130 stopped by a signal, 0 a closed output pipe).

use crate::follow::INTERRUPTED_STATUS;

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

    /// Ctrl-C stopped `tail`: no message, exit status 130 like `tail -f`.
    pub fn interrupted() -> Self {
        Failure {
            message: None,
            code: INTERRUPTED_STATUS,
        }
    }

    /// Standard output was closed by its reader (`| head`): stop without a word.
    pub fn quiet() -> Self {
        Failure {
            message: None,
            code: 0,
        }
    }

    /// A `postgres://` URL given to a build without the `postgres` feature.
    #[cfg(not(feature = "postgres"))]
    pub fn without_postgres() -> Self {
        Failure::usage(
            "this changefeed was built without PostgreSQL support; build it with --features \
             cli,postgres to use a postgres:// URL",
        )
    }

    /// A `mysql://` URL given to a build without the `mysql` feature.
    #[cfg(not(feature = "mysql"))]
    pub fn without_mysql() -> Self {
        Failure::usage(
            "this changefeed was built without MariaDB/MySQL support; build it with --features \
             cli,mysql to use a mysql:// URL",
        )
    }

    /// The line to print after `error: `, if any.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        self.code
    }
}

impl From<changefeed::Error> for Failure {
    fn from(error: changefeed::Error) -> Self {
        Failure::run(error.to_string())
    }
}
