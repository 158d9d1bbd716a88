//! Every T-SQL batch the harness sends, built from validated names. Parameters are
//! `@P1`, `@P2`, … (tiberius numbers them in the order they are passed); each builder says
//! what it expects. Kept apart from the code that runs them so they are unit-tested
//! without a server (tests/bench_stats.rs).

use changefeed::Feed;

/// The schema of every benchmark table.
pub const SCHEMA: &str = "bench";

/// Every event row's payload: about 50 characters, like a small real event.
pub const PAYLOAD: &str = "changefeed benchmark event payload, about fifty chars";

/// `[bench].[name]`. Names come from this harness only (letters, digits, `_`).
pub fn table(name: &str) -> String {
    format!("[{SCHEMA}].[{name}]")
}

/// Creates the benchmark database, replacing a leftover of the same name.
pub fn create_database(name: &str) -> String {
    format!(
        "if db_id(N'{name}') is not null \
         begin \
           alter database [{name}] set single_user with rollback immediate; \
           drop database [{name}]; \
         end; \
         create database [{name}];"
    )
}

/// Simple recovery: the preloads write a lot of log, and nothing here needs a log backup.
pub fn recovery_simple(name: &str) -> String {
    format!("alter database [{name}] set recovery simple;")
}

/// READ_COMMITTED_SNAPSHOT on (`--rcsi`).
pub fn read_committed_snapshot_on(name: &str) -> String {
    format!("alter database [{name}] set read_committed_snapshot on with rollback immediate;")
}

/// The schema of the benchmark tables (alone in its batch, as `create schema` must be).
pub fn create_schema() -> String {
    format!("create schema [{SCHEMA}];")
}

/// Drops the benchmark database, if it exists (after `set single_user`, which may be
/// refused).
pub fn drop_database(name: &str) -> String {
    format!("if db_id(N'{name}') is not null drop database [{name}];")
}

/// Ends every other session of the database, so it can be dropped.
pub fn single_user(name: &str) -> String {
    format!(
        "if db_id(N'{name}') is not null \
         alter database [{name}] set single_user with rollback immediate;"
    )
}

/// An event table `id bigint` key and a payload, unless it exists.
pub fn event_table(name: &str) -> String {
    format!(
        "if object_id(N'{SCHEMA}.{name}', N'U') is null \
         create table {} (id bigint not null primary key, payload nvarchar(100) not null);",
        table(name)
    )
}

/// An event table and its outbox-mode feed (setup_feed is idempotent).
pub fn outbox_feed(name: &str) -> String {
    format!(
        "{} exec changefeed.setup_feed @table_name = N'{SCHEMA}.{name}', @outbox = 1;",
        event_table(name)
    )
}

/// Figure 1's baseline and writers' plain transaction: `@P1` id, `@P2` payload.
pub fn plain_write(table: &str) -> String {
    format!(
        "set xact_abort on; begin transaction; \
         insert into {table} (id, payload) values (@P1, @P2); \
         commit transaction;"
    )
}

/// Figure 1's (and 4's) transaction: the event and its outbox row. `@P1` id, `@P2`
/// payload, `@P3` shard.
pub fn outbox_write(feed: &Feed) -> String {
    format!(
        "set xact_abort on; begin transaction; \
         insert into {} (id, payload) values (@P1, @P2); \
         insert into {} (shard_id, id) values (@P3, @P1); \
         commit transaction;",
        feed.quoted_table(),
        feed.outbox_table()
    )
}

/// A table for figure 5 (shard, ULID and the unique index serialized mode needs),
/// unless it exists.
pub fn serialized_table(name: &str) -> String {
    format!(
        "if object_id(N'{SCHEMA}.{name}', N'U') is null \
         begin \
           create table {t} (id bigint not null primary key, shard int not null, \
             ulid binary(16) not null, payload nvarchar(100) not null); \
           create unique index [{name}_shard_ulid] on {t} (shard, ulid); \
         end;",
        t = table(name)
    )
}

/// Figure 5's tables: the serialized-writer feed `name` and its plain twin.
pub fn serialized_setup(name: &str, plain: &str) -> String {
    format!(
        "{} exec changefeed.setup_feed @table_name = N'{SCHEMA}.{name}', @serialize_writers = 1, \
         @shard_column = N'shard', @ulid_column = N'ulid'; {}",
        serialized_table(name),
        serialized_table(plain)
    )
}

/// Figure 5's server-side batch: lock the shard, insert with `ulid(1)`, commit.
/// `@P1` id, `@P2` payload.
pub fn serialized_write(feed: &Feed, lock_timeout_ms: u128) -> String {
    format!(
        "set xact_abort on; begin transaction; \
         exec {} @shard_id = 0, @lock_timeout_ms = {lock_timeout_ms}; \
         insert into {} (id, shard, ulid, payload) values (@P1, 0, {}(1), @P2); \
         commit transaction;",
        feed.object("lock_feed"),
        feed.quoted_table(),
        feed.object("ulid")
    )
}

/// Rows per transaction of figure 5's per-row cost of `ulid(@i)`.
pub const ROWS_PER_TRANSACTION: i64 = 100;

/// Figure 5's per-row cost of `ulid(@i)`: one transaction locks the shard and inserts
/// [`ROWS_PER_TRANSACTION`] rows, numbered by `ulid(i)` when `with_function`, else computed
/// in the batch from lock_feed's `@ulid_high` / `@ulid_low` outputs (what the function does
/// after its check of the session context and the shard's state row). `@P1` the
/// transaction's id (rows get `@P1 * 1000 + i`), `@P2` payload.
pub fn serialized_rows_write(feed: &Feed, lock_timeout_ms: u128, with_function: bool) -> String {
    let ulid = if with_function {
        format!("{}(n.i)", feed.object("ulid"))
    } else {
        "convert(binary(16), @high + convert(binary(8), @low + n.i - 1))".to_owned()
    };
    format!(
        "set xact_abort on; begin transaction; \
         declare @high binary(8), @low bigint; \
         exec {lock} @shard_id = 0, @lock_timeout_ms = {lock_timeout_ms}, \
             @ulid_high = @high output, @ulid_low = @low output; \
         insert into {table} (id, shard, ulid, payload) \
         select @P1 * 1000 + n.i, 0, {ulid}, @P2 \
         from (select top ({ROWS_PER_TRANSACTION}) convert(bigint, row_number() over \
             (order by (select null))) as i from sys.all_columns) as n; \
         commit transaction;",
        lock = feed.object("lock_feed"),
        table = feed.quoted_table(),
    )
}

/// Figure 5's server-side baseline: the same insert, ULID from the client. `@P1` id,
/// `@P2` payload, `@P3` ULID.
pub fn serialized_plain_write(table: &str) -> String {
    format!(
        "set xact_abort on; begin transaction; \
         insert into {table} (id, shard, ulid, payload) values (@P1, 0, @P3, @P2); \
         commit transaction;"
    )
}

/// Figure 5's client-side insert (inside a transaction the client opened): `@P1` id,
/// `@P2` ULID, `@P3` payload.
pub fn serialized_insert(table: &str) -> String {
    format!("insert into {table} (id, shard, ulid, payload) values (@P1, 0, @P2, @P3);")
}

/// The numbers 1..=`@P2` as a derived table `n(i)`, for set-based preloads.
const NUMBERS: &str = "(select top (@P2) row_number() over (order by (select null)) as i \
     from sys.all_columns as a cross join sys.all_columns as b) as n";

/// Preloads one chunk of events into `table` and their key rows into `outbox`: `@P1` the
/// chunk's first id, `@P2` its size, `@P3` the shard count, `@P4` the preload's first id
/// (shard = (id − @P4) mod @P3, so a preload of shards × n ids puts n in every shard).
pub fn preload_events(table: &str, outbox: &str) -> String {
    format!(
        "set xact_abort on; set nocount on; \
         begin transaction; \
         insert into {table} (id, payload) select @P1 + n.i - 1, N'{PAYLOAD}' from {NUMBERS}; \
         insert into {outbox} (shard_id, id) \
             select convert(int, (id - @P4) % @P3), id from {table} \
             where id >= @P1 and id < @P1 + @P2; \
         commit transaction;"
    )
}

/// Figure 2's plain tables: an event table, a plain outbox and a plain log with the same
/// clustered keys as changefeed's outbox and feed, and lock escalation off like them.
pub fn assign_setup(shards: i32) -> String {
    let plain = format!("assign_plain_s{shards}");
    let outbox = format!("assign_plain_outbox_s{shards}");
    let log = format!("assign_plain_log_s{shards}");
    format!(
        "{feed} {plain_sql} \
         if object_id(N'{SCHEMA}.{outbox}', N'U') is null \
         begin \
           create table {outbox_q} (shard_id int not null, \
             order_sequence bigint identity(1, 1) not null, \
             time_hint datetime2(3) not null default sysutcdatetime(), id bigint not null, \
             constraint [{outbox}_pk] primary key clustered (shard_id, order_sequence)); \
           alter table {outbox_q} set (lock_escalation = disable); \
         end; \
         if object_id(N'{SCHEMA}.{log}', N'U') is null \
         begin \
           create table {log_q} (shard_id int not null, seq bigint identity(1, 1) not null, \
             id bigint not null, constraint [{log}_pk] primary key clustered (shard_id, seq)); \
           alter table {log_q} set (lock_escalation = disable); \
         end;",
        feed = outbox_feed(&format!("assign_s{shards}")),
        plain_sql = event_table(&plain),
        outbox_q = table(&outbox),
        log_q = table(&log),
    )
}

/// Figure 2's baseline: a hand-rolled drain of a plain outbox table, one page per call:
/// delete the oldest `@P2` rows of shard `@P1` (`output ... into` a table variable),
/// append them to a plain log table, commit, and return them.
pub fn plain_drain(outbox: &str, log: &str) -> String {
    format!(
        "set xact_abort on; set nocount on; \
         declare @m table (order_sequence bigint not null primary key, id bigint not null); \
         begin transaction; \
         with t as ( \
             select top (@P2) order_sequence, id from {outbox} \
             where shard_id = @P1 order by order_sequence \
         ) \
         delete from t output deleted.order_sequence, deleted.id into @m (order_sequence, id); \
         insert into {log} (shard_id, id) select @P1, id from @m order by order_sequence; \
         commit transaction; \
         select order_sequence, id from @m order by order_sequence;"
    )
}

/// Figure 3's baseline: the plain paging query on the feed table. `@P1` page size, `@P2`
/// shard, `@P3` cursor. The cursor arrives as varbinary and is converted to the column's
/// binary(16), as `read_feed` converts its checked 16-byte `@cursor`, so the comparison
/// seeks on the clustered key.
pub fn plain_replay(feed_table: &str) -> String {
    format!(
        "select top (@P1) ulid, id from {feed_table} \
         where shard_id = @P2 and ulid > convert(binary(16), @P3) order by ulid"
    )
}

/// The last ULID of each shard of a feed table.
pub fn feed_heads(feed_table: &str) -> String {
    format!("select shard_id, max(ulid) from {feed_table} group by shard_id")
}

/// The fewest rows any of shards 0..`shards` holds (0 if one holds none).
pub fn smallest_shard(feed_table: &str, shards: i32) -> String {
    format!(
        "select case when count(*) = {shards} then min(n) else 0 end \
         from (select count_big(*) as n from {feed_table} \
               where shard_id between 0 and {last} group by shard_id) as counts",
        last = shards - 1
    )
}

/// Creates a claim outbox (setup_outbox is idempotent).
pub fn setup_outbox(qualified: &str) -> String {
    format!("exec changefeed.setup_outbox @table_name = N'{qualified}';")
}

/// Enqueues `@P1` messages at once into a claim outbox (status pending by default).
pub fn preload_messages(table: &str) -> String {
    format!(
        "set nocount on; \
         insert into {table} (topic, payload) \
         select N'bench', N'{{\"bench\":true}}' \
         from (select top (@P1) 1 as x from sys.all_columns as a \
               cross join sys.all_columns as b) as n;"
    )
}

/// How many messages of a claim outbox are done.
pub fn done_count(table: &str) -> String {
    format!("select count_big(*) from {table} where status = 2")
}

/// The server's version, edition and banner.
pub const SERVER_VERSION: &str = "select cast(serverproperty('ProductVersion') as nvarchar(128)), \
     cast(serverproperty('Edition') as nvarchar(128)), @@version";

/// The server's CPUs and memory (needs VIEW SERVER STATE; may be refused).
pub const SERVER_HARDWARE: &str =
    "select cpu_count, physical_memory_kb / 1024 from sys.dm_os_sys_info";
