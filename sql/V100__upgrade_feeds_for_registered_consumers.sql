-- Registers the consumers first saved since V93 registered the existing ones, as V93 does and
-- by the same statement: they were created under the old rule (any saved cursor held purge
-- back), and every feed still has the old purge_feed. Every outbox-mode feed's purge_feed
-- then holds back only for registered consumers (V98) once its code is regenerated, and the
-- feed records generator version 5 (V99); regeneration runs after the migrations, object by
-- object (exec changefeed.upgrade_all_feeds @only_outdated = 1; outside any transaction; V58
-- says why no migration regenerates). upgrade_feed, raising a feed from a version below 5,
-- registers in the same transaction the consumers saved since this migration, so none is
-- lost in between, and no purge runs the new code before they are registered.
-- READCOMMITTEDLOCK: under READ_COMMITTED_SNAPSHOT a plain read would skip a first save
-- being committed; a locking read waits for it (bounded by the session's LOCK_TIMEOUT, 2 s
-- under migrate, which retries the migration), and releases each row once read: holding
-- them to the commit would make every consumer's save wait for the migration. Consumers an
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
