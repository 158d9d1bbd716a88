-- The registry of every feed set up with changefeed.setup_feed: one row per event table.
-- upgrade_all_feeds walks it to carry generated code forward; feed_status is built from it.
create table [changefeed].[feeds] (
    feed_id int identity (1, 1) not null,
    object_id int not null,
    schema_name sysname not null,
    table_name sysname not null,
    mode varchar(20) not null,
    shard_column sysname null,
    ulid_column sysname null,
    generator_version int not null,
    created_at datetime2(3) not null
    constraint feeds_created_at_df default sysutcdatetime(),
    upgraded_at datetime2(3) not null
    constraint feeds_upgraded_at_df default sysutcdatetime(),
    -- What is wrong with the feed, with the statement that fixes it, as of the last
    -- changefeed.refresh_feed_status (which every setup, upgrade and teardown runs); NULL
    -- when it works. feed_status shows it, and upgrade_all_feeds skips such a feed.
    problem nvarchar(1000) null,
    constraint feeds_pk primary key clustered (feed_id),
    constraint feeds_object_id_uq unique (object_id),
    constraint feeds_name_uq unique (schema_name, table_name),
    constraint feeds_mode_ck check (mode in ('outbox', 'serialize_writers'))
);
