//! The quick start: an event table becomes a feed, three writers place orders at the same
//! time, and two independent consumers read the feed — one following the head, one replaying
//! it from the start.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! It connects to `CHANGEFEED_URL` (an ADO.NET connection string for SQL Server, or with
//! the feature `postgres` a `postgres://` URL; used with its database as is) or, when that
//! is not set, starts SQL Server 2022 with testcontainers (a Docker engine is needed; the
//! first run pulls the image) and uses a database `changefeed_quickstart` in it, or, where
//! Docker does not run, starts a private PostgreSQL from the installed binaries (feature
//! `postgres`: `cargo run --features postgres --example quickstart`; `pg_config --bindir`,
//! a temporary directory, a Unix socket only, stopped and removed at the end). With none of
//! them, it prints one line saying what to install or set and exits with status 2.
//!
//! Then it
//! 1. applies the changefeed migrations,
//! 2. creates `quickstart.OrderPlaced` and makes it an outbox-mode feed (both idempotent, so
//!    the example can run again against the same database),
//! 3. starts a consumer at the current head of the feed (it reads to the end first, then
//!    follows: it sees only what is written from now on) and a consumer replaying the feed
//!    from [`Cursor::START`] with whole events (`@with_event = 1`; on a database used before,
//!    it also replays the orders of earlier runs),
//! 4. runs three writers, each on its own connection, each committing five orders (SQL
//!    Server: the event row and its outbox row in one transaction; PostgreSQL: the event
//!    row, whose trigger records it),
//! 5. prints what each consumer sees until both have seen all fifteen orders, and exits 0.
//!
//! Both consumers read through one [`FeedReader`] ([`FeedReader::connect`] picks the
//! database by the connection string); each has its own cursor, and both see every order
//! with the same ULID.

// The other examples use the rest of the support module.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

/// The quick start on PostgreSQL: a private server, the feed, the writers.
#[cfg(feature = "postgres")]
#[path = "quickstart/postgres.rs"]
mod postgres;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use changefeed::connection::URL_VARIABLE;
use changefeed::reader::{FeedReader, FeedReaderOptions, Wait};
use changefeed::row::Serde;
use changefeed::{Client, Cursor, Feed, FeedEvent, FeedRow};
use futures::StreamExt;
use testcontainers::ContainerAsync;
use testcontainers::runners::AsyncRunner;
use testcontainers_modules::mssql_server::MssqlServer;
use tokio::task::JoinHandle;

/// The database the example creates in a container it started.
const DATABASE: &str = "changefeed_quickstart";
/// The event table.
const TABLE: &str = "quickstart.OrderPlaced";
const WRITERS: i64 = 3;
const ORDERS_PER_WRITER: i64 = 5;
const CUSTOMERS: [&str; WRITERS as usize] = ["ada", "grace", "linus"];
/// Pulling the image and starting SQL Server may take a while the first time.
const STARTUP_LIMIT: Duration = Duration::from_secs(600);
/// SQL Server in a fresh container accepts logins a little after it says it is ready.
const LOGIN_LIMIT: Duration = Duration::from_secs(90);
/// Everything after the server is up: migrations, writers, and both consumers.
const DEMO_LIMIT: Duration = Duration::from_secs(90);

#[tokio::main]
async fn main() {
    let server = Server::find()
        .await
        .unwrap_or_else(|line| support::exit_with(line));
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(DEMO_LIMIT, demo(&server.database)) => outcome,
        _ = tokio::signal::ctrl_c() => {
            server.shutdown().await;
            support::exit_with("stopped by Ctrl-C");
        }
    };
    // std::process::exit skips destructors: remove our container or server first.
    server.shutdown().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => support::exit_with(error),
        Err(_) => support::exit_with(format!(
            "the quick start did not finish within {DEMO_LIMIT:?}"
        )),
    }
}

// ---------------------------------------------------------------------------------------
// The server: CHANGEFEED_URL, or a container of our own

/// The database the demo runs on.
enum Database {
    /// An ADO.NET connection string.
    SqlServer(String),
    /// A `postgres://` URL (feature `postgres`).
    Postgres(String),
}

impl Database {
    /// The connection string.
    fn url(&self) -> &str {
        match self {
            Database::SqlServer(url) | Database::Postgres(url) => url,
        }
    }
}

struct Server {
    /// The database to use.
    database: Database,
    /// The container we started, removed at the end.
    container: Option<ContainerAsync<MssqlServer>>,
    /// The private PostgreSQL we started, stopped and removed at the end.
    #[cfg(feature = "postgres")]
    postgres: Option<postgres::Started>,
}

impl Server {
    /// CHANGEFEED_URL when it is set, else SQL Server 2022 in a container, else a private
    /// PostgreSQL. The error is the one line to print.
    async fn find() -> Result<Server, String> {
        match std::env::var(URL_VARIABLE) {
            Ok(url) if !url.trim().is_empty() => {
                let lower = url.trim_start().to_ascii_lowercase();
                let database =
                    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
                        if cfg!(not(feature = "postgres")) {
                            return Err(format!(
                                "{URL_VARIABLE} is a PostgreSQL URL: run the quick start with \
                             cargo run --features postgres --example quickstart"
                            ));
                        }
                        Database::Postgres(url)
                    } else {
                        Database::SqlServer(url)
                    };
                Ok(Server::of(database))
            }
            _ => match Self::start_container().await {
                Ok(server) => Ok(server),
                Err(docker) => Self::start_postgres(&docker).await,
            },
        }
    }

    fn of(database: Database) -> Server {
        Server {
            database,
            container: None,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// A private PostgreSQL, when Docker could not start SQL Server (`docker` says why).
    #[cfg(feature = "postgres")]
    async fn start_postgres(docker: &str) -> Result<Server, String> {
        match postgres::start().await {
            Ok(started) => {
                let url = started.url.clone();
                let mut server = Server::of(Database::Postgres(url));
                server.postgres = Some(started);
                Ok(server)
            }
            Err(postgres::NotStarted::Missing(why)) => Err(format!(
                "no database: {URL_VARIABLE} is not set, Docker is not available to start SQL \
                 Server ({docker}), and PostgreSQL is not installed ({why}). Install PostgreSQL \
                 ({}, with pg_config on PATH) or Docker, or set {URL_VARIABLE} to a SQL Server ADO.NET \
                 string or a postgres:// URL.",
                support::private_postgres::INSTALL
            )),
            Err(postgres::NotStarted::Failed(why)) => Err(format!(
                "{URL_VARIABLE} is not set, Docker is not available ({docker}), and the \
                 private PostgreSQL did not start: {}",
                one_line(&why)
            )),
        }
    }

    #[cfg(not(feature = "postgres"))]
    async fn start_postgres(docker: &str) -> Result<Server, String> {
        Err(format!(
            "no database: {URL_VARIABLE} is not set and Docker is not available to start SQL \
             Server 2022 with testcontainers ({docker}). Start a Docker engine, or install \
             PostgreSQL and run cargo run --features postgres --example quickstart, or set \
             {URL_VARIABLE} to an ADO.NET connection string, e.g. {URL_VARIABLE}='server=tcp:\
             localhost,1433;user=sa;password=...;TrustServerCertificate=true'."
        ))
    }

    /// SQL Server 2022 in a container; the error says why not, for the next fallback.
    async fn start_container() -> Result<Server, String> {
        let no_server = |reason: String| one_line(&reason);
        // Without a Docker engine this fails at once, and the error is the only line printed;
        // a start that takes a while (pulling the image) says what it is doing.
        let start = MssqlServer::default().with_accept_eula().start();
        let started = tokio::time::timeout(STARTUP_LIMIT, async {
            let mut start = std::pin::pin!(start);
            tokio::select! {
                started = &mut start => return started,
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            eprintln!(
                "{URL_VARIABLE} is not set: starting SQL Server 2022 with testcontainers (the \
                 first run pulls the image)..."
            );
            start.await
        })
        .await;
        let container = match started {
            Ok(Ok(container)) => container,
            Ok(Err(error)) => return Err(no_server(error.to_string())),
            Err(_) => {
                return Err(no_server(format!(
                    "the container did not start within {STARTUP_LIMIT:?}"
                )));
            }
        };
        match Self::prepare(&container).await {
            Ok(ado) => {
                eprintln!("SQL Server is up; using its database {DATABASE}");
                let mut server = Server::of(Database::SqlServer(ado));
                server.container = Some(container);
                Ok(server)
            }
            Err(error) => {
                let _ = container.rm().await;
                Err(format!(
                    "the SQL Server container started but could not be used: {}",
                    one_line(&error)
                ))
            }
        }
    }

    /// Waits for the container's server to accept logins and creates the database.
    async fn prepare(container: &ContainerAsync<MssqlServer>) -> Result<String, String> {
        let host = container
            .get_host()
            .await
            .map_err(|error| error.to_string())?
            .to_string();
        // The port asked for is the IPv4 one: do not let "localhost" resolve to ::1.
        let host = if host == "localhost" {
            "127.0.0.1".to_owned()
        } else {
            host
        };
        let port = container
            .get_host_port_ipv4(1433)
            .await
            .map_err(|error| error.to_string())?;
        let server = format!(
            "server=tcp:{host},{port};user=sa;password={};TrustServerCertificate=true",
            MssqlServer::DEFAULT_SA_PASSWORD
        );
        let deadline = tokio::time::Instant::now() + LOGIN_LIMIT;
        let mut master = loop {
            match changefeed::connect(&server).await {
                Ok(client) => break client,
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("no login within {LOGIN_LIMIT:?}: {error}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        };
        support::exec(
            &mut master,
            &format!("if db_id(N'{DATABASE}') is null create database [{DATABASE}];"),
        )
        .await
        .map_err(|error| format!("create database {DATABASE}: {error}"))?;
        let _ = master.close().await;
        Ok(format!("{server};database={DATABASE}"))
    }

    async fn shutdown(self) {
        if let Some(container) = self.container {
            let _ = container.rm().await;
        }
        #[cfg(feature = "postgres")]
        if let Some(started) = self.postgres {
            started.stop().await;
        }
    }
}

/// Keeps an error message on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------
// The demo

/// An order as the replaying consumer decodes it, with serde, by column name.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OrderPlaced {
    id: i64,
    customer: String,
    /// `decimal(10, 2)` decoded as its exact text.
    total: String,
    /// `datetime2(3)` decoded as ISO 8601 text.
    placed_at: String,
}

impl fmt::Display for OrderPlaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "order {} by {} for {} at {}",
            self.id, self.customer, self.total, self.placed_at
        )
    }
}

/// Whole events; `None` for an event row deleted since it was written (`read_feed` still
/// returns its ULID, with NULL columns).
type Event = Option<Serde<OrderPlaced>>;

async fn demo(database: &Database) -> Result<(), String> {
    // The event table and its feed, and fresh order ids, so that the example can run again
    // on the same database.
    let (feed, first_id) = match database {
        Database::SqlServer(ado) => {
            let mut admin = changefeed::connect(ado)
                .await
                .map_err(|error| format!("{error} (check {URL_VARIABLE})"))?;
            changefeed::migrations::migrate(&mut admin)
                .await
                .map_err(|error| error.to_string())?;
            let feed = create_feed(&mut admin).await?;
            let first_id = next_order_id(&mut admin).await?;
            let _ = admin.close().await;
            (feed, first_id)
        }
        Database::Postgres(url) => postgres_feed(url).await?,
    };
    let ids: BTreeSet<i64> = (first_id..first_id + WRITERS * ORDERS_PER_WRITER).collect();

    let reader = FeedReader::connect(
        database.url(),
        feed.clone(),
        FeedReaderOptions::default()
            .page_size(100)
            .wait(Wait::LongPoll(Duration::from_secs(5))),
    )
    .await
    .map_err(|error| error.to_string())?;

    // The head consumer's start: the end of the feed as it is now. Reading moves every
    // committed outbox row into the feed, so every order written after this comes later.
    let mut head = Cursor::START;
    loop {
        let page = reader
            .read_page::<i64>(0, head)
            .await
            .map_err(|error| format!("reading to the head of {feed}: {error}"))?;
        head = page.next_cursor;
        if !page.is_full() {
            break;
        }
    }
    println!("feed {feed}: the head consumer starts after {head}");

    let from_head = spawn_head_consumer(&reader, head, ids.clone());
    let replay = spawn_replay_consumer(&reader, ids.clone());

    println!(
        "{WRITERS} writers place {ORDERS_PER_WRITER} orders each, orders {}..={}",
        first_id,
        first_id + WRITERS * ORDERS_PER_WRITER - 1
    );
    let writers: Vec<JoinHandle<Result<(), String>>> = (0..WRITERS)
        .map(|writer| {
            let first = first_id + writer * ORDERS_PER_WRITER;
            match database {
                Database::SqlServer(ado) => {
                    let (ado, feed) = (ado.clone(), feed.clone());
                    tokio::spawn(async move { write_orders(&ado, &feed, writer, first).await })
                }
                Database::Postgres(url) => {
                    let url = url.clone();
                    tokio::spawn(async move { postgres_writer(&url, writer, first).await })
                }
            }
        })
        .collect();
    for writer in writers {
        writer
            .await
            .map_err(|error| format!("a writer panicked: {error}"))??;
    }

    let seen_from_head = from_head
        .await
        .map_err(|error| format!("the head consumer panicked: {error}"))??;
    let replayed = replay
        .await
        .map_err(|error| format!("the replaying consumer panicked: {error}"))??;
    println!(
        "done: the head consumer saw the {seen_from_head} new orders; the replaying consumer \
         saw {replayed} events in all (earlier runs included), the {} new orders with the \
         same ULIDs",
        ids.len()
    );
    Ok(())
}

#[cfg(feature = "postgres")]
async fn postgres_feed(url: &str) -> Result<(Feed, i64), String> {
    postgres::create_feed(url).await
}

#[cfg(feature = "postgres")]
async fn postgres_writer(url: &str, writer: i64, first_id: i64) -> Result<(), String> {
    postgres::write_orders(url, writer, first_id, CUSTOMERS[writer as usize]).await
}

// Without the feature, Server::find never gives a PostgreSQL database.
#[cfg(not(feature = "postgres"))]
async fn postgres_feed(_url: &str) -> Result<(Feed, i64), String> {
    unreachable!("a PostgreSQL database without the postgres feature")
}

#[cfg(not(feature = "postgres"))]
async fn postgres_writer(_url: &str, _writer: i64, _first_id: i64) -> Result<(), String> {
    unreachable!("a PostgreSQL database without the postgres feature")
}

/// Creates the schema, the event table and its feed, if missing.
async fn create_feed(admin: &mut Client) -> Result<Feed, String> {
    let feed: Feed = TABLE.parse().map_err(|error| format!("{error}"))?;
    let batches = [
        // CREATE SCHEMA must begin its batch; inside exec () it does.
        "if schema_id(N'quickstart') is null exec (N'create schema quickstart');".to_owned(),
        "if object_id(N'quickstart.OrderPlaced', N'U') is null \
         create table quickstart.OrderPlaced ( \
             Id bigint not null primary key, \
             Customer nvarchar(50) not null, \
             Total decimal(10, 2) not null, \
             PlacedAt datetime2(3) not null \
         );"
        .to_owned(),
        format!("exec changefeed.setup_feed @table_name = N'{feed}', @outbox = 1;"),
    ];
    for batch in &batches {
        support::exec(admin, batch)
            .await
            .map_err(|error| format!("setting up {feed}: {error}"))?;
    }
    Ok(feed)
}

async fn next_order_id(admin: &mut Client) -> Result<i64, String> {
    let row = admin
        .simple_query("select isnull(max(Id), 0) + 1 from quickstart.OrderPlaced;")
        .await
        .map_err(|error| error.to_string())?
        .into_row()
        .await
        .map_err(|error| error.to_string())?
        .ok_or("no row from select max(Id)")?;
    row.try_get::<i64, usize>(0)
        .map_err(|error| error.to_string())?
        .ok_or_else(|| "max(Id) + 1 is NULL".to_owned())
}

/// One writer: its own connection, one transaction per order (the event and its outbox
/// row together).
async fn write_orders(ado: &str, feed: &Feed, writer: i64, first_id: i64) -> Result<(), String> {
    let mut client = changefeed::connect(ado)
        .await
        .map_err(|error| format!("writer {writer}: {error}"))?;
    let customer = CUSTOMERS[writer as usize];
    let sql = format!(
        "set xact_abort on; \
         begin transaction; \
         insert into quickstart.OrderPlaced (Id, Customer, Total, PlacedAt) \
             values (@P1, @P2, @P3, sysutcdatetime()); \
         insert into {} (Id) values (@P1); \
         commit transaction;",
        feed.outbox_table()
    );
    for id in first_id..first_id + ORDERS_PER_WRITER {
        // 10.00 to 99.99, in cents.
        let cents = 1_000 + (id * 7_919) % 9_000;
        let total = tiberius::numeric::Numeric::new_with_scale(i128::from(cents), 2);
        client
            .execute(sql.as_str(), &[&id, &customer, &total])
            .await
            .map_err(|error| format!("writer {writer}, order {id}: {error}"))?;
        // Let the writers interleave.
        let pause = rand::random_range(5..40);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let _ = client.close().await;
    Ok(())
}

/// Follows the feed from `head` with keys only; ends when it has seen every id of `ids`.
/// Returns how many of them it saw.
fn spawn_head_consumer(
    reader: &FeedReader,
    head: Cursor,
    ids: BTreeSet<i64>,
) -> JoinHandle<Result<usize, String>> {
    let pages = reader.stream::<i64>(0, head);
    tokio::spawn(async move {
        let mut pages = std::pin::pin!(pages);
        let mut missing = ids.clone();
        while !missing.is_empty() {
            let page = match pages.next().await {
                Some(page) => page.map_err(|error| format!("head consumer: {error}"))?,
                None => return Err("head consumer: the stream ended".to_owned()),
            };
            for FeedRow { ulid, key } in &page.rows {
                println!("[from the head] {ulid}  key Id = {key}");
                missing.remove(key);
            }
        }
        Ok(ids.len())
    })
}

/// Replays the feed from the start with whole events; ends when it has seen every id of
/// `ids`. Returns how many events it saw in all.
fn spawn_replay_consumer(
    reader: &FeedReader,
    ids: BTreeSet<i64>,
) -> JoinHandle<Result<usize, String>> {
    let pages = reader.event_stream::<Event>(0, Cursor::START);
    tokio::spawn(async move {
        let mut pages = std::pin::pin!(pages);
        let mut missing = ids;
        let mut seen = 0;
        while !missing.is_empty() {
            let page = match pages.next().await {
                Some(page) => page.map_err(|error| format!("replaying consumer: {error}"))?,
                None => return Err("replaying consumer: the stream ended".to_owned()),
            };
            for FeedEvent { ulid, event } in &page.rows {
                seen += 1;
                match event {
                    Some(Serde(order)) => {
                        println!("[replay]        {ulid}  {order}");
                        missing.remove(&order.id);
                    }
                    None => println!("[replay]        {ulid}  (the event row was deleted since)"),
                }
            }
        }
        Ok(seen)
    })
}
