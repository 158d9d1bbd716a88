//! The feed contract (tests/feed_contract) on SQL Server, under both READ_COMMITTED_SNAPSHOT
//! settings, each scenario in a database of its own. It needs a SQL Server
//! (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and is `#[ignore]`d: run it with
//! `cargo test --test contract_mssql_feed -- --ignored`. The same scenarios run live on
//! PostgreSQL in `tests/live_postgres_feed.rs`.

mod common;
mod feed_contract;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use changefeed::pool::{ConnectionManager, Pool};
use changefeed::reader::{FeedReader, FeedReaderOptions};
use changefeed::{Cursor, CursorStore, Feed};
use common::events::exec_ok;
use common::{TestDb, exec, rows, scalar_i64, under_both_isolations};
use feed_contract::{FeedContractDb, OpenWrite};

/// A test database whose feeds the contract sets up, one event table each (its name and
/// ADO string, owned, so that one scenario function serves every database).
struct MssqlFeeds {
    database: String,
    ado: String,
    tables: AtomicUsize,
}

/// Runs a contract scenario under both isolation settings, each in a fresh database.
async fn on_fresh_feeds(test: &str, scenario: impl AsyncFn(&MssqlFeeds)) {
    under_both_isolations(&format!("fc_{test}"), async |db: &TestDb| {
        scenario(&MssqlFeeds {
            database: db.name.clone(),
            ado: db.ado(),
            tables: AtomicUsize::new(0),
        })
        .await;
    })
    .await;
}

feed_contract::feed_contract_tests!(
    "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker",
    on_fresh_feeds
);

/// The same scenarios in a case-sensitive UTF-8 database on a server whose default collation
/// differs ([`common::case_sensitive_utf8_collation`]): the bundle's and the client's SQL must
/// spell every name as it is declared, and nothing may rely on the database and tempdb
/// sharing a collation.
mod case_sensitive_utf8 {
    use super::MssqlFeeds;
    use crate::common::{self, TestDb};
    use std::sync::atomic::AtomicUsize;

    async fn on_fresh_feeds(test: &str, scenario: impl AsyncFn(&MssqlFeeds)) {
        let collation = common::case_sensitive_utf8_collation().await;
        common::under_both_isolations_collated(
            &format!("fc_cs_{test}"),
            collation,
            async |db: &TestDb| {
                let mut client = db.client().await;
                assert_eq!(
                    common::scalar_i64(
                        &mut client,
                        "select case when N'a' = N'A' then 0 else 1 end \
                         + case when convert(int, collationproperty(convert(sysname, \
                             databasepropertyex(db_name(), 'Collation')), 'CodePage')) = 65001 \
                             then 2 else 0 end;",
                    )
                    .await,
                    3,
                    "{} is a case-sensitive UTF-8 database",
                    db.name
                );
                scenario(&MssqlFeeds {
                    database: db.name.clone(),
                    ado: db.ado(),
                    tables: AtomicUsize::new(0),
                })
                .await;
            },
        )
        .await;
    }

    crate::feed_contract::feed_contract_tests!(
        "needs SQL Server 2019 or later: set CHANGEFEED_TEST_MSSQL or run Docker",
        on_fresh_feeds
    );
}

impl MssqlFeeds {
    /// The program name of the readers' sessions, which end_reader_sessions kills.
    fn reader_application(&self) -> String {
        format!("{}_reader", self.database)
    }

    /// A connection of the test's own.
    async fn client(&self) -> changefeed::Client {
        common::connect_to(&self.database).await
    }

    /// `ids` as a `values` list: numbers only, so the text is safe to inline.
    fn values(ids: &[i64]) -> String {
        ids.iter()
            .map(|id| format!("({id})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl FeedContractDb for MssqlFeeds {
    async fn outbox_feed(&self, _shards: i32) -> Feed {
        // SQL Server feeds take any shard number; the declared count is PostgreSQL's.
        let table = format!("events_{}", self.tables.fetch_add(1, Ordering::Relaxed));
        let mut admin = self.client().await;
        exec_ok(
            &mut admin,
            &format!(
                "create table [dbo].[{table}] (id bigint not null primary key, shard int not null, \
                 body nvarchar(50) null); \
                 exec changefeed.setup_feed @table_name = N'dbo.{table}', @outbox = 1;"
            ),
        )
        .await;
        Feed::new("dbo", &table).unwrap()
    }

    async fn serialized_feed(&self) -> Feed {
        let table = format!("orders_{}", self.tables.fetch_add(1, Ordering::Relaxed));
        let mut admin = self.client().await;
        exec_ok(
            &mut admin,
            &format!(
                "create table [dbo].[{table}] (shard int not null, ulid binary(16) not null, \
                 id bigint not null primary key); \
                 create unique index [{table}_shard_ulid] on [dbo].[{table}] (shard, ulid); \
                 create sequence [dbo].[{table}_commits] as bigint start with 1; \
                 exec changefeed.setup_feed @table_name = N'dbo.{table}', @serialize_writers = 1, \
                 @shard_column = N'shard', @ulid_column = N'ulid';"
            ),
        )
        .await;
        Feed::new("dbo", &table).unwrap()
    }

    fn reader(&self, feed: &Feed, options: FeedReaderOptions) -> FeedReader {
        let ado = format!(
            "{};Application Name={}",
            self.ado,
            self.reader_application()
        );
        let manager = ConnectionManager::from_ado(&ado).expect("a valid ADO string");
        let pool = Pool::from_builder(Pool::builder().max_size(8), manager);
        FeedReader::with_options(pool, feed.clone(), options).expect("valid reader options")
    }

    async fn open_write(&self, feed: &Feed, shard: i32, ids: Vec<i64>) -> OpenWrite {
        let database = self.database.clone();
        let (table, outbox) = (feed.quoted_table(), feed.outbox_table());
        let values = Self::values(&ids);
        OpenWrite::spawn(move |handover| async move {
            let mut client = common::connect_to(&database).await;
            let began = Instant::now();
            exec(
                &mut client,
                &format!(
                    "set xact_abort on; begin transaction; \
                     insert into {table} (id, shard) select v.id, {shard} from (values {values}) as v (id); \
                     insert into {outbox} (shard_id, id) select {shard}, v.id from (values {values}) as v (id);"
                ),
            )
            .await
            .unwrap();
            if handover.commit_when_told(began).await {
                exec(&mut client, "commit transaction;").await.unwrap();
                Some(Instant::now())
            } else {
                exec(&mut client, "rollback transaction;").await.unwrap();
                None
            }
        })
    }

    async fn serialized_write(&self, feed: &Feed, ids: Vec<i64>, hold: Duration) -> i64 {
        let mut client = self.client().await;
        let (table, lock, ulid) = (
            feed.quoted_table(),
            feed.object("lock_feed"),
            feed.object("ulid"),
        );
        let values = Self::values(&ids);
        // The sequence is read under the shard's lock, which the transaction holds until its
        // commit: its value is the commit order.
        scalar_i64(
            &mut client,
            &format!(
                "set xact_abort on; begin transaction; \
                 exec {lock} @shard_id = 0; \
                 insert into {table} (shard, ulid, id) \
                 select 0, {ulid}(row_number() over (order by v.id)), v.id from (values {values}) as v (id); \
                 waitfor delay '00:00:00.{:03}'; \
                 declare @order bigint = next value for [dbo].[{}_commits]; \
                 commit transaction; \
                 select @order;",
                hold.as_millis().min(999),
                feed.table()
            ),
        )
        .await
    }

    async fn end_reader_sessions(&self, _feed: &Feed) -> usize {
        let mut admin = self.client().await;
        let sessions = rows(
            &mut admin,
            &format!(
                "select session_id from sys.dm_exec_sessions \
                 where program_name = N'{}' and session_id <> @@spid;",
                self.reader_application()
            ),
        )
        .await
        .unwrap();
        let mut ended = 0;
        for row in sessions {
            let Some(id) = row.try_get::<i16, usize>(0).ok().flatten() else {
                continue;
            };
            // 6106: the session ended between the query and the KILL.
            if exec(&mut admin, &format!("kill {id};")).await.is_ok() {
                ended += 1;
            }
        }
        ended
    }

    /// Saves as the admin, then registers the consumer (`changefeed.register_consumer`,
    /// idempotent): on SQL Server a saved cursor holds `purge_feed` back only once whoever
    /// administers the feed registered its consumer, and the contract's consumers are the
    /// admin's own.
    async fn save_cursor(
        &self,
        consumer: &str,
        feed: &Feed,
        shard: i32,
        cursor: Cursor,
    ) -> changefeed::Result<()> {
        let mut admin = self.client().await;
        CursorStore::save(&mut admin, consumer, feed, shard, cursor).await?;
        exec(
            &mut admin,
            &format!(
                "exec changefeed.register_consumer @consumer = N'{}', @feed = N'{feed}';",
                consumer.replace('\'', "''")
            ),
        )
        .await
    }

    async fn load_cursor(
        &self,
        consumer: &str,
        feed: &Feed,
        shard: i32,
    ) -> changefeed::Result<Option<Cursor>> {
        CursorStore::load(&mut self.client().await, consumer, feed, shard).await
    }

    async fn purge(&self, feed: &Feed) -> u64 {
        let mut admin = self.client().await;
        let purged = rows(
            &mut admin,
            &format!("exec {} @older_than_ms = 0;", feed.object("purge_feed")),
        )
        .await
        .unwrap();
        purged
            .iter()
            .map(|row| {
                row.try_get::<i64, &str>("deleted")
                    .ok()
                    .flatten()
                    .unwrap_or(0) as u64
            })
            .sum()
    }
}
