-- The consumers whose saved cursors hold purge_feed back: one row per feed and consumer name.
-- Any member of a feed's readers role may save a cursor under a new consumer name
-- (save_cursor), so a saved cursor alone must not decide what retention keeps: a reader
-- could park a cursor of zeros under an invented name and stop every purge for good. A
-- consumer holds retention back only once someone who administers the feed registered it
-- (changefeed.register_consumer, not granted to readers); unregister_consumer and
-- remove_consumer undo it. A registration may come before the consumer's first save.
-- feed_id cascades from the registry: teardown_feed's delete of the feed's row takes the
-- feed's registrations with it, so a feed set up again under the name starts with none.
-- registered_by is database_principal_id() of the registering user; NULL for the consumers
-- this migration registers.
create table [changefeed].[registered_consumers] (
    feed_id int not null,
    -- Declared as consumer_cursor.consumer is (no collate: the database's), so the two
    -- compare as save_cursor compares names.
    consumer nvarchar(200) not null,
    registered_by int null,
    registered_at datetime2(3) not null
    constraint registered_consumers_registered_at_df default sysutcdatetime(),
    constraint registered_consumers_pk primary key clustered (feed_id, consumer),
    constraint registered_consumers_feed_fk foreign key (feed_id)
    references [changefeed].[feeds] (feed_id) on delete cascade
);

-- Every consumer that has a saved cursor when this upgrade runs was created under the old
-- rule (any saved cursor held purge back): it is registered here, so that the upgrade never
-- lets a purge delete what an existing consumer has not read. consumer_cursor.feed holds
-- the registry's spelling 'schema.table' (save_cursor writes it); both sides are columns
-- declared without a collation, so they compare in the database's. A cursor of a feed no
-- longer registered holds no purge back and is not registered. READCOMMITTEDLOCK: under
-- READ_COMMITTED_SNAPSHOT a plain read would skip a first save being committed (its row
-- version is not yet there); a locking read waits for it and registers it. A consumer first
-- saved after this read, before the feeds' purge_feed is regenerated, is registered by the
-- same statement at the start of V100.
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
    from [changefeed].[registered_consumers] as r
    where r.feed_id = f.feed_id and r.consumer = c.consumer collate database_default
);
