-- (Replaces V70's.) What changed: holds_retention, 1 when the row's consumer is registered for
-- its feed (changefeed.registered_consumers, V93): only then does its cursor hold
-- purge_feed back (or when the feed still runs code generated before version 5, whose
-- purge_feed every saved cursor holds back). A consumer any reader created by saving a cursor shows 0 until someone
-- who administers the feed registers it (changefeed.register_consumer); purge_feed deletes
-- past its cursor and names it in passed_consumers.
--
-- How far behind each saved consumer is, and whose it is: owner is the database user whose
-- first save_cursor created the consumer, NULL for a consumer saved before owners existed
-- and not saved since, and for a user this caller cannot see; a db_owner sees every one, and
-- removes a stale consumer with changefeed.remove_consumer. The registered consumers with
-- the oldest cursor_at hold purge_feed back.
-- One row per saved cursor, with the time its
-- cursor stands at, the head of that feed shard, and the lag between them in milliseconds
-- (null when the shard has no head yet). expired is 1 when events past the cursor were
-- purged (read_feed would raise 51104). Built on feed_status, so it covers every feed; a
-- feed that feed_status shows with a problem shows it here too (head columns NULL).
--
-- Any 16 bytes may be saved as a cursor, including times past 9999-12-31 that datetime2
-- cannot hold (Ulid::MAX, a "never" sentinel): cursor_at (and head_at) is then NULL, and
-- lag_ms is computed from the ULIDs' millisecond fields, not from datetimes, so no stored
-- value makes this view fail. A cursor at or past the head has lag 0.
-- Query it at READ COMMITTED or REPEATABLE READ, like feed_status (README, "Status views").
create or alter view [changefeed].[consumer_lag]
as
select
    c.consumer,
    c.feed,
    c.shard_id,
    c.[cursor],
    changefeed.ulid_time(c.[cursor]) as cursor_at,
    s.head_ulid,
    s.head_at,
    case
        when s.head_ulid is null or s.head_ulid <= c.[cursor] then 0
        else
            convert(bigint, substring(s.head_ulid, 1, 6))
            - convert(bigint, substring(c.[cursor], 1, 6))
    end as lag_ms,
    s.outbox_depth as not_yet_in_feed,
    convert(
        bit,
        case
            when c.[cursor] <> 0x00000000000000000000000000000000 and c.[cursor] < s.purged_through
                then 1
            else 0
        end
    ) as expired,
    c.updated_at as cursor_saved_at,
    s.problem,
    user_name(c.owner_principal_id) as owner,
    -- consumer_cursor.feed is the registry's spelling 'schema.table' (save_cursor writes
    -- it); every column compared here is declared without a collation (the database's as of
    -- its table's creation). The consumer columns' tables were created by different
    -- migrations (V38, V93): collate database_default is their collation unless the
    -- database's was changed in between, where comparing them as they are fails (Msg 468).
    -- On the cursor's side, so that the registration's key is still sought.
    convert(
        bit,
        case
            when exists (
                select 1
                from changefeed.registered_consumers as r
                inner join changefeed.feeds as f
                    on f.feed_id = r.feed_id
                where
                    r.consumer = c.consumer collate database_default
                    and f.schema_name + N'.' + f.table_name = c.feed
            )
                then 1
            -- A feed still on code from before generator version 5 (not yet regenerated
            -- after the migrations, or skipped as broken) has the older purge_feed, which
            -- every saved cursor holds back, registered or not.
            when exists (
                select 1
                from changefeed.feeds as g
                where
                    g.schema_name + N'.' + g.table_name = c.feed
                    and g.generator_version < 5
            )
                then 1
            else 0
        end
    ) as holds_retention
from changefeed.consumer_cursor as c
left outer join changefeed.feed_status as s
    on
        c.feed = s.feed
        -- A feed with a problem has one row, with no shard.
        and (c.shard_id = s.shard_id or s.problem is not null);
