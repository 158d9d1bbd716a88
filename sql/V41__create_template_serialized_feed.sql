-- The template feed of serialized-writer mode (ARCHITECTURE.md, "Templates"). Like the outbox-mode
-- template feed changefeed.__template__, its per-feed code (the next files) is written once as real objects
-- of this table, and changefeed.upgrade_feed copies it for each serialized-writer feed,
-- replacing the same markers and also
--   __template_shard__   the event table's shard column
--   __template_ulid__    the event table's ULID column
-- It is not registered in changefeed.feeds and gets no roles.
create table [changefeed].[__template_serialized__] (
    __template_key__ bigint not null,
    __template_shard__ int not null,
    __template_ulid__ binary(16) not null,
    payload nvarchar(200) null,
    constraint template_serialized_pk primary key clustered (__template_key__),
    constraint template_serialized_shard_ulid_uq unique (__template_shard__, __template_ulid__)
);

declare @template_id int = object_id(N'[changefeed].[__template_serialized__]', N'U');

exec changefeed.create_feed_storage @object_id = @template_id, @mode = 'serialize_writers';
