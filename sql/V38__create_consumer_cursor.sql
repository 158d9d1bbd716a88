-- Where consumers keep their cursors: one row per consumer, feed ('schema.table') and shard.
-- A consumer that writes its side effects to this database saves its cursor in the same
-- transaction (changefeed.save_cursor), so each event's effect is applied exactly once.
create table [changefeed].[consumer_cursor] (
    consumer nvarchar(200) not null,
    feed nvarchar(257) not null,
    shard_id int not null,
    [cursor] binary(16) not null,
    updated_at datetime2(3) not null
    constraint consumer_cursor_updated_at_df default sysutcdatetime(),
    constraint consumer_cursor_pk primary key clustered (consumer, feed, shard_id)
);
