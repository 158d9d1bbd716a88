-- Regenerates every feed's and claim outbox's code from the current templates, so every
-- outbox-mode feed's purge_feed holds back only for registered consumers (V98; the consumers
-- that had saved cursors before the upgrade were registered by V93), and records generator
-- version 5 (V99). A broken feed or outbox is skipped and reported, as before (V89).
-- The consumers first saved since V93 registered the existing ones (while every feed still
-- had the old purge_feed, which any saved cursor holds back) are registered too, as V93 does
-- and by the same statement: they were created under the old rule. This runs in the
-- migration's transaction with the regeneration, so no purge runs the new code before they
-- are registered; and before it, so that this locking read, which may wait for a consumer's
-- open transaction, never waits while the migration holds the regenerated procedures (a
-- consumer calling one of them would deadlock with it). READCOMMITTEDLOCK: under
-- READ_COMMITTED_SNAPSHOT a plain read would skip a first save being committed; a locking
-- read waits for it, and releases each row once read: holding them to the commit would make
-- every consumer's save wait for the whole regeneration. So a consumer whose FIRST save
-- commits while this migration regenerates is not registered (consumer_lag shows
-- holds_retention = 0; register it, docs/sql-server.md, Retention). Consumers an
-- administrator unregistered between V95 and this migration (possible only when the
-- migrations ran in separate runs) are registered again.
insert into [changefeed].[registered_consumers] (feed_id, consumer)
-- distinct in the key's collation (the database's now), so that two names the key holds
-- equal are one row, not a duplicate key (2627), where the collation changed since V38.
select distinct
    f.feed_id,
    c.consumer collate database_default as consumer
from [changefeed].[consumer_cursor] as c with (readcommittedlock)
inner join [changefeed].[feeds] as f
    on c.feed = f.schema_name + N'.' + f.table_name
where not exists (
    select 1
    -- UPDLOCK, HOLDLOCK: a register_consumer of the same consumer committing between this
    -- check and the insert would fail the migration with 2627; it waits instead (as
    -- register_consumer's own check does).
    from [changefeed].[registered_consumers] as r with (updlock, holdlock)
    where r.feed_id = f.feed_id and r.consumer = c.consumer collate database_default
);

exec changefeed.upgrade_all_feeds;
