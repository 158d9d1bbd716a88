//! Connecting to MariaDB/MySQL: the `mysql://` URL and the session settings the outbox needs.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::error::{Error, Result};

/// The session settings of every connection the store opens. READ COMMITTED: under
/// REPEATABLE READ a `FOR UPDATE SKIP LOCKED` scan takes gap locks that make concurrent
/// claimers wait on each other, and the head-of-aggregate probe would read an old snapshot.
const SESSION_SETUP: &str = "set session transaction isolation level read committed";

/// Parses a `mysql://user:password@host:port/database` URL (mysql_async's syntax: a local
/// server's socket goes in `?socket=/path/to/sock`). The database is required: the outbox
/// table lives in it.
///
/// ```
/// let opts = changefeed::mysql::opts("mysql://relay:secret@db.internal:3306/app")?;
/// assert_eq!(opts.db_name(), Some("app"));
/// assert!(changefeed::mysql::opts("mysql://db.internal/").is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
pub fn opts(url: &str) -> Result<Opts> {
    let opts = Opts::from_url(url).map_err(|error| {
        Error::Config(format!(
            "the MariaDB/MySQL URL is not usable ({error}); write it as \
             mysql://user:password@host:3306/database"
        ))
    })?;
    if opts.db_name().is_none_or(str::is_empty) {
        return Err(Error::Config(
            "the MariaDB/MySQL URL names no database; add it as the path, e.g. \
             mysql://user:password@host:3306/app"
                .to_owned(),
        ));
    }
    Ok(opts)
}

/// Opens a connection with the outbox's session settings (READ COMMITTED).
pub async fn connect(opts: &Opts) -> Result<Conn> {
    let opts = OptsBuilder::from_opts(opts.clone()).setup(vec![SESSION_SETUP]);
    Ok(Conn::new(opts).await?)
}

/// The server's version line, e.g. `10.11.6-MariaDB-0+deb12u1`.
pub async fn server_version(conn: &mut Conn) -> Result<String> {
    let version: Option<String> = conn.query_first("select version()").await?;
    version.ok_or_else(|| Error::Connection("select version() returned no row".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_a_database() {
        assert!(opts("mysql://u:p@localhost:3306/app").is_ok());
        for bad in [
            "mysql://u:p@localhost:3306",
            "mysql://u:p@localhost:3306/",
            "http://x/db",
        ] {
            let error = opts(bad).unwrap_err().to_string();
            assert!(
                error.contains("mysql://user:password@host"),
                "{bad}: {error}"
            );
        }
    }
}
