//! Helpers for writers.
//!
//! **Outbox mode** needs no helper: insert the event's key into the outbox in the same
//! transaction as the event, e.g.
//! `insert into [changefeed].[outbox:myservice.MyEvent] (shard_id, id) values (0, @id)`
//! ([`crate::Feed::outbox_table`] gives the name). Writers never wait for each other.
//!
//! **Serialized-writer mode**: [`lock_feed`] (on PostgreSQL `lock_feed_postgres`) locks the shard until your transaction ends and
//! reserves 10^11 ULIDs, which you can use as the events' keys. Keep that transaction short
//! and, best, entirely on the server, so that a client that dies cannot leave the shard
//! locked (POWEROFF.md):
//!
//! ```sql
//! set xact_abort on;
//! begin try
//!     begin transaction;
//!     declare @ulid binary(16);
//!     exec [changefeed].[lock_feed:myservice.MyEvent] @shard_id = 0, @lock_timeout_ms = 5000,
//!         @ulid = @ulid output;
//!     insert into myservice.MyEvent (Shard, ULID, Payload)
//!     select 0, [changefeed].[ulid:myservice.MyEvent](row_number() over (order by n)), payload
//!     from @new_events;
//!     commit;
//! end try
//! begin catch
//!     if @@trancount > 0 rollback;
//!     throw;
//! end catch;
//! ```

use std::time::Duration;

use crate::allocator::{RESERVATION_SIZE, UlidRange};
use crate::connection::Client;
use crate::error::{Error, Result, decode_error};
use crate::feed::Feed;
use crate::row::Column;

/// Calls `[changefeed].[lock_feed:schema.table]` inside the transaction open on `client`
/// and returns the reserved range. Open that transaction with
/// [`PooledClient::transaction`](crate::pool::PooledClient::transaction): if the task fails or
/// is cancelled before commit, the guard makes the pool close the connection, so the server
/// rolls back and frees the shard at once instead of leaving it locked until the connection
/// is used again. The shard stays locked until that transaction commits
/// or rolls back; `lock_timeout` bounds the wait for another writer, after which the server
/// raises 51202 and rolls the transaction back. Keep it below the connection's command
/// timeout (tiberius: 30 s by default): `None` asks the server to wait without a bound, but
/// the client then gives up at its command timeout while the request stays queued on the
/// server until the connection is dropped.
///
/// `time_hint` (UTC) sets the ULIDs' time; `None` uses the server's clock. The ULIDs are
/// never earlier than the shard's last ones, and never later than the server's clock plus
/// [`crate::allocator::HINT_TOLERANCE_MS`] (a later hint counts as that instant).
///
/// One shard of a feed per transaction: a `lock_feed` for a second shard of the same feed in
/// one transaction is refused with 51203 (the transaction is rolled back). If you roll back to
/// a savepoint taken before this call, the reservation is undone on the server: discard the
/// returned range and call `lock_feed` again.
///
/// ```no_run
/// # async fn run(pool: &changefeed::Pool) -> changefeed::Result<()> {
/// use changefeed::Feed;
/// use changefeed::writer::lock_feed;
/// use std::time::Duration;
///
/// let feed: Feed = "myservice.MyEvent".parse()?;
/// let mut conn = pool.get().await?;
/// let mut tx = conn.transaction().await?;
/// let range = lock_feed(&mut tx, &feed, 0, None, Some(Duration::from_secs(5))).await?;
/// let first = range.first(); // use range.nth(i) for the i-th event of this transaction
/// // insert the events with their ULIDs here, in the same transaction, then:
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn lock_feed(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    time_hint: Option<time::PrimitiveDateTime>,
    lock_timeout: Option<Duration>,
) -> Result<UlidRange> {
    let timeout_ms: i32 = match lock_timeout {
        None => -1,
        Some(d) => i32::try_from(d.as_millis()).map_err(|_| {
            Error::Config(format!(
                "a lock timeout of {d:?} is too long; use None to wait without a bound"
            ))
        })?,
    };
    let sql = format!(
        "declare @high binary(8), @low bigint; \
         exec {} @shard_id = @P1, @time_hint = @P2, @lock_timeout_ms = @P3, \
         @ulid_high = @high output, @ulid_low = @low output; \
         select @high as ulid_high, @low as ulid_low;",
        feed.object("lock_feed")
    );
    let rows = client
        .query(sql, &[&shard, &time_hint, &timeout_ms])
        .await?
        .into_first_result()
        .await?;
    let row = rows
        .first()
        .ok_or_else(|| decode_error("lock_feed", "the call returned no row"))?;
    let high: Vec<u8> = Vec::<u8>::column(row, 0)?;
    let high: [u8; 8] = high
        .try_into()
        .map_err(|_| decode_error("ulid_high", "not 8 bytes"))?;
    let low = i64::column(row, 1)?;
    UlidRange::from_parts(high, low, RESERVATION_SIZE)
        .ok_or_else(|| decode_error("ulid_low", "the reserved range has no headroom"))
}

/// Calls the feed's `lock_feed_<id>` on PostgreSQL (feature `postgres`) inside `tx` and
/// returns the reserved range, as [`lock_feed`] does on SQL Server: the shard stays locked
/// (a transaction-scoped advisory lock) until `tx` commits or rolls back, and the range's
/// ULIDs (`range.nth(i)`, or `changefeed.ulid_<id>(i)` in SQL) are the events' keys in
/// commit order.
///
/// The function's name comes from `changefeed.feed_info` (a feed in outbox mode has none:
/// an [`Error::Config`]). It waits for another writer of the shard as long as the
/// session's `statement_timeout` allows ([`crate::postgres::connect`] sets 30 s; `set
/// local statement_timeout` in `tx` for another bound): the server then raises 57014 and
/// the transaction is lost (transient: retry it whole). `time_hint` sets the ULIDs' time;
/// `None` uses the server's clock. One shard of a feed per transaction (CF203); a rollback
/// to a savepoint taken before this call undoes the reservation (call it again).
///
/// ```no_run
/// # async fn run(client: &mut tokio_postgres::Client) -> changefeed::Result<()> {
/// use changefeed::Feed;
/// use changefeed::writer::lock_feed_postgres;
///
/// let feed: Feed = "public.orders".parse()?;
/// let tx = client.transaction().await?;
/// let range = lock_feed_postgres(&tx, &feed, 0, None).await?;
/// let first = range.first();
/// tx.execute(
///     "insert into public.orders (shard, ulid, customer) values (0, $1, 'ada')",
///     &[&first.to_bytes().as_slice()],
/// ).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "postgres")]
pub async fn lock_feed_postgres(
    tx: &tokio_postgres::Transaction<'_>,
    feed: &Feed,
    shard: i32,
    time_hint: Option<time::OffsetDateTime>,
) -> Result<UlidRange> {
    let info = crate::pg_client::feed_info::feed_info(tx, feed).await?;
    let function = info.lock_function.ok_or_else(|| {
        Error::Config(format!(
            "{feed} is an outbox-mode feed: lock_feed serves serialized-writer feeds only \
             (outbox-mode writers insert their events and never lock)"
        ))
    })?;
    let row = tx
        .query_one(
            &format!(
                "select l.ulid_high, l.ulid_low from {function}($1::int, $2::timestamptz, -1) as l"
            ),
            &[&shard, &time_hint],
        )
        .await?;
    let high: Vec<u8> = row
        .try_get(0)
        .map_err(|error| decode_error("ulid_high", error))?;
    let high: [u8; 8] = high
        .try_into()
        .map_err(|_| decode_error("ulid_high", "not 8 bytes"))?;
    let low: i64 = row
        .try_get(1)
        .map_err(|error| decode_error("ulid_low", error))?;
    UlidRange::from_parts(high, low, RESERVATION_SIZE)
        .ok_or_else(|| decode_error("ulid_low", "the reserved range has no headroom"))
}

#[cfg(test)]
mod tests {
    use crate::allocator::{Allocator, FixedRandom, RESERVATION_SIZE, UlidRange, ulid_counter};

    #[test]
    fn a_server_range_rebuilt_from_its_parts_equals_the_models() {
        let mut allocator = Allocator::new();
        let mut random = FixedRandom::new(0xABCD, 12345);
        let range = allocator.reserve(
            1_700_000_000_000,
            1_700_000_000_000,
            RESERVATION_SIZE,
            &mut random,
        );
        let rebuilt =
            UlidRange::from_parts(range.high(), range.first_counter(), RESERVATION_SIZE).unwrap();
        assert_eq!(rebuilt, range);
        assert_eq!(
            ulid_counter(rebuilt.nth(2).unwrap()),
            range.first_counter() + 1
        );
        assert_eq!(rebuilt.nth(RESERVATION_SIZE), Some(range.last()));
        assert_eq!(rebuilt.nth(RESERVATION_SIZE + 1), None);
        assert_eq!(rebuilt.nth(0), None);
    }

    #[test]
    fn ranges_without_headroom_are_refused() {
        assert!(UlidRange::from_parts([0; 8], -5, 10).is_none());
        assert!(UlidRange::from_parts([0; 8], i64::MAX - 1, 10).is_none());
        assert!(UlidRange::from_parts([0; 8], 0, 0).is_none());
        assert!(UlidRange::from_parts([0; 8], -15, 10).is_some());
    }
}
