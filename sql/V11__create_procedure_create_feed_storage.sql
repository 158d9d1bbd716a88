-- Creates the storage of a feed for the event table @object_id (ARCHITECTURE.md, "Templates"): the state
-- table and read type of every feed, and for @mode = 'outbox' its outbox and feed
-- tables. Each part is created only when it is missing, so a call never drops or changes data. Internal: setup_feed calls it after it
-- validated the name and the key, and the template feed changefeed.__template__ is created by it too, so this
-- is the only definition of the per-feed storage.
--
-- Lock escalation is disabled on every per-feed table: an escalated table lock from a writer's
-- large insert would make the readers' READPAST scan of the outbox wait instead of skipping,
-- and one from a reader's move would block the readers of every other shard.
create or alter procedure [changefeed].[create_feed_storage]
    @object_id int,
    @mode varchar(20) = 'outbox'
as
begin
    set nocount, xact_abort on;
    -- It commits its own transaction: under a caller's IMPLICIT_TRANSACTIONS ON that commit
    -- would leave a second level open (with the DDL's schema locks). Reverts on return.
    set implicit_transactions off;

    declare @schema_name sysname = object_schema_name(@object_id);
    declare @table_name sysname = object_name(@object_id);
    declare @key_definitions nvarchar(max);
    declare @key_list nvarchar(max);
    declare @outbox nvarchar(300);
    declare @feed nvarchar(300);
    declare @state nvarchar(300);
    declare @read_type nvarchar(300);
    declare @sql nvarchar(max);

    select
        @key_definitions = string_agg(
            convert(nvarchar(max), quotename(column_name)) + N' ' + column_type + N' not null',
            N', '
        ) within group (order by key_ordinal),
        @key_list = string_agg(
            convert(nvarchar(max), quotename(column_name)), N', '
        ) within group (order by key_ordinal)
    from changefeed.key_columns(@object_id);

    if @key_definitions is null
        throw 51002, N'create_feed_storage: the event table has no primary key to copy.', 1;

    select
        @outbox = max(case when kind = N'outbox' then quoted_name end),
        @feed = max(case when kind = N'feed' then quoted_name end),
        @state = max(case when kind = N'state' then quoted_name end),
        @read_type = max(case when kind = N'type:read' then quoted_name end)
    from changefeed.feed_objects(@schema_name, @table_name);

    -- A NULL piece would make the DDL below NULL, and sp_executesql of NULL does nothing:
    -- the setup would seem to succeed with nothing created.
    if @schema_name is null or @outbox is null or @feed is null
        or @state is null or @read_type is null
        throw 51009, N'create_feed_storage: a per-feed object name could not be built (is the table name checked and at most 108 characters?).', 1;

    begin try
        begin transaction;

        -- The outbox is a queue that readers drain with READPAST, row by row: its one index
        -- allows no page locks (READPAST skips locked rows only, so a page lock would make
        -- the move skip a page of committed rows or wait behind it; REORGANIZE needs page
        -- locks, so maintain it with REBUILD) and its locks never escalate (above).
        if @mode = 'outbox' and object_id(@outbox, N'U') is null
        begin
            set @sql = N'create table ' + @outbox + N' ('
                + N'shard_id int not null default 0, '
                -- IDENTITY, not a sequence default: a writer (INSERT permission only) cannot
                -- choose order_sequence, since an explicit value needs SET IDENTITY_INSERT,
                -- which needs ALTER on the table (there is no column-level DENY INSERT). A
                -- chosen value could collide with a later generated one, or jump the queue.
                -- Values skipped after a restart or a rollback leave gaps, which
                -- order_sequence tolerates (it orders, it does not count).
                + N'order_sequence bigint identity(1, 1) not null, '
                + N'time_hint datetime2(3) not null default sysutcdatetime(), '
                + @key_definitions + N', '
                + N'constraint ' + quotename(N'outbox_pk:' + @schema_name + N'.' + @table_name)
                + N' primary key clustered (shard_id, order_sequence)'
                + N' with (allow_page_locks = off));'
                + N' alter table ' + @outbox + N' set (lock_escalation = disable);';
            exec sys.sp_executesql @sql;
        end;

        if @mode = 'outbox' and object_id(@feed, N'U') is null
        begin
            set @sql = N'create table ' + @feed + N' ('
                + N'shard_id int not null, '
                + N'ulid binary(16) not null, '
                + @key_definitions + N', '
                + N'constraint ' + quotename(N'feed_pk:' + @schema_name + N'.' + @table_name)
                + N' primary key clustered (shard_id, ulid));'
                + N' alter table ' + @feed + N' set (lock_escalation = disable);';
            exec sys.sp_executesql @sql;
        end;

        if object_id(@state, N'U') is null
        begin
            set @sql = N'create table ' + @state + N' ('
                + N'shard_id int not null, '
                + N'last_ms bigint not null, '
                + N'ulid_high binary(8) not null, '
                + N'next_counter bigint not null, '
                + N'updated_at datetime2(3) not null, '
                -- The low-water mark: the largest ULID purge_feed deleted. A cursor below
                -- it has lost events, and read_feed says so.
                + N'purged_through binary(16) null, '
                -- Serialized-writer mode: the transaction whose lock_feed made the shard's
                -- latest reservation, and its first ULID. Unlike session context these roll
                -- back with a savepoint, so ulid(@i) compares them with the range it keeps in
                -- session context and refuses a range that was undone. Null in outbox mode.
                + N'reserved_by_transaction bigint null, '
                + N'reserved_first_ulid binary(16) null, '
                + N'constraint ' + quotename(N'state_pk:' + @schema_name + N'.' + @table_name)
                + N' primary key clustered (shard_id));'
                + N' alter table ' + @state + N' set (lock_escalation = disable);';
            exec sys.sp_executesql @sql;
        end;

        if type_id(@read_type) is null
        begin
            set @sql = N'create type ' + @read_type + N' as table ('
                + N'ulid binary(16) not null primary key, '
                + @key_definitions + N');';
            exec sys.sp_executesql @sql;
        end;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
