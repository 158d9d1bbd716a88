//! The quick start on PostgreSQL (feature `postgres`): a private server from the installed
//! binaries when `CHANGEFEED_URL` is not set and Docker does not run, the event table and
//! its outbox-mode feed, and a writer. The consumers are the SQL Server demo's own: one
//! `FeedReader` reads either database.

use std::time::Duration;

use changefeed::Feed;

use super::support::private_postgres::PrivatePostgres;
use super::{ORDERS_PER_WRITER, TABLE};

/// How long the private server may take to accept connections.
const STARTUP_LIMIT: Duration = Duration::from_secs(60);
/// The database the example creates in the private server.
const DATABASE: &str = "changefeed_quickstart";
/// Every statement of the demo's own connections.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// A private server this example started: stopped, and its directory removed, by
/// [`Started::stop`], or by its watchdog when this process ends without it.
pub struct Started {
    /// The URL of the database to use.
    pub url: String,
    server: PrivatePostgres,
}

/// Why there is no private server.
pub enum NotStarted {
    /// The binaries are not installed: what is missing.
    Missing(String),
    /// They are, but the server did not come up: why.
    Failed(String),
}

/// Makes and starts a cluster in a fresh temporary directory (Unix socket only) and creates
/// the demo's database in it.
pub async fn start() -> Result<Started, NotStarted> {
    super::support::private_postgres::bindir().map_err(NotStarted::Missing)?;
    let dir = std::env::temp_dir().join(format!(
        "changefeed-quickstart-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|error| NotStarted::Failed(format!("create {}: {error}", dir.display())))?;
    eprintln!(
        "{} is not set and Docker is not available: starting a private PostgreSQL in {}",
        changefeed::connection::URL_VARIABLE,
        dir.display()
    );
    let remove = |why: String| {
        let _ = std::fs::remove_dir_all(&dir);
        NotStarted::Failed(why)
    };
    let server = PrivatePostgres::init(&dir).map_err(remove)?;
    // Under a watchdog: the server goes with this process even if it dies.
    server.start_watched("").map_err(remove)?;
    let started = Started {
        url: server.url_template().replace("{db}", DATABASE),
        server,
    };
    let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
    while !started.server.is_ready() {
        if tokio::time::Instant::now() >= deadline {
            let log = started.server.log();
            started.stop().await;
            return Err(NotStarted::Failed(format!(
                "no answer within {STARTUP_LIMIT:?}: {log}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admin_url = started.server.url_template().replace("{db}", "postgres");
    let created = async {
        let admin = connect(&admin_url).await?;
        bounded(admin.batch_execute(&format!("create database {DATABASE}"))).await
    }
    .await;
    if let Err(error) = created {
        started.stop().await;
        return Err(NotStarted::Failed(format!(
            "create database {DATABASE}: {error}"
        )));
    }
    eprintln!("PostgreSQL is up; using its database {DATABASE}");
    Ok(started)
}

impl Started {
    /// Stops the server (fast shutdown) and removes its directory.
    pub async fn stop(self) {
        let stop = self.server.stop_command();
        let _ = tokio::task::spawn_blocking(move || {
            std::process::Command::new("sh")
                .args(["-c", &stop])
                .status()
        })
        .await;
        let _ = std::fs::remove_dir_all(&self.server.dir);
    }
}

/// A connection with the crate's time limits.
async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let config = changefeed::postgres::config(url).map_err(|error| error.to_string())?;
    changefeed::postgres::connect(&config)
        .await
        .map_err(|error| error.to_string())
}

/// One statement, bounded by [`CALL_LIMIT`].
async fn bounded<T>(
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(outcome) => outcome.map_err(|error| changefeed::Error::from(error).to_string()),
        Err(_) => Err(format!("no answer within {CALL_LIMIT:?}")),
    }
}

/// Applies the bundle, creates the event table (its columns named as on SQL Server, so
/// that the replaying consumer's serde struct reads both) and makes it an outbox-mode feed,
/// all idempotent; returns the feed and the first fresh order id.
pub async fn create_feed(url: &str) -> Result<(Feed, i64), String> {
    let feed: Feed = TABLE.parse().map_err(|error| format!("{error}"))?;
    let mut admin = connect(url)
        .await
        .map_err(|error| format!("{error} (check {})", changefeed::connection::URL_VARIABLE))?;
    changefeed::postgres::migrate(&mut admin)
        .await
        .map_err(|error| error.to_string())?;
    bounded(admin.batch_execute(
        r#"create schema if not exists quickstart;
           create table if not exists quickstart."OrderPlaced" (
               "Id" bigint not null primary key,
               "Customer" text not null,
               "Total" numeric(10, 2) not null,
               "PlacedAt" timestamptz(3) not null
           )"#,
    ))
    .await
    .map_err(|error| format!("creating {feed}: {error}"))?;
    bounded(admin.execute("select changefeed.setup_feed($1)", &[&feed.to_string()]))
        .await
        .map_err(|error| format!("setting up {feed}: {error}"))?;
    let first_id: i64 = bounded(admin.query_one(
        r#"select coalesce(max("Id"), 0) + 1 from quickstart."OrderPlaced""#,
        &[],
    ))
    .await?
    .get(0);
    Ok((feed, first_id))
}

/// One writer: its own connection, one transaction per order. The event row is all it
/// writes: the feed's trigger records the order in the outbox in the same transaction.
pub async fn write_orders(
    url: &str,
    writer: i64,
    first_id: i64,
    customer: &str,
) -> Result<(), String> {
    let client = connect(url)
        .await
        .map_err(|error| format!("writer {writer}: {error}"))?;
    for id in first_id..first_id + ORDERS_PER_WRITER {
        // 10.00 to 99.99, in cents.
        let cents = 1_000 + (id * 7_919) % 9_000;
        bounded(client.execute(
            r#"insert into quickstart."OrderPlaced" ("Id", "Customer", "Total", "PlacedAt")
               values ($1, $2, ($3::bigint / 100.0)::numeric(10, 2), clock_timestamp())"#,
            &[&id, &customer, &cents],
        ))
        .await
        .map_err(|error| format!("writer {writer}, order {id}: {error}"))?;
        // Let the writers interleave.
        let pause = rand::random_range(5..40);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(())
}
