-- (Replaces V59's.) What changed: the ownership-chain refusal (51013) is
-- changefeed.check_owner_chain's (V102), whose message names the narrowest fix, the table's
-- own owner, and what that statement drops; the same check refuses a claim outbox (V106)
-- and reports a feed or outbox set up before it (V103, V104). V59 keeps its own inline
-- check, so that a database migrated only part of the way (below V102) still refuses such
-- a table.
--
-- Makes an event table a feed. Call it from your own migration, once per event table:
--   exec changefeed.setup_feed @table_name = N'schema.table', @outbox = 1;
--   exec changefeed.setup_feed @table_name = N'schema.table', @serialize_writers = 1,
--       @shard_column = N'Shard', @ulid_column = N'ULID';
-- Serialized-writer mode needs an int shard column, a binary(16) ULID column and a unique
-- index on exactly (shard, ulid): read_feed pages through that index. It creates the feed's
-- storage, registers it, generates its code, creates its roles and refreshes feed_status,
-- all in one transaction. A second call with the same arguments changes nothing; a call that
-- asks for another mode is refused (tear the feed down first).
--
-- The event table must have the owner of the changefeed schema (dbo, normally): read_feed
-- (with @with_event = 1, and always in serialized mode) and the status view read it from
-- changefeed's procedures, and SQL Server skips the permission check there only along an
-- unbroken ownership chain. A table in a schema owned by another user would make every such
-- read of a readers-only login fail (Msg 229): rows moved, cursor stuck. Granting the readers
-- SELECT on the table instead would give them the whole table, beyond their feed, so such a
-- table is refused (51013) with the statement that gives the table to that owner and what
-- that statement removes (changefeed.check_owner_chain).
-- A view is refused with its own message (51001): a feed needs a table.
create or alter procedure [changefeed].[setup_feed]
    @table_name nvarchar(4000),
    @outbox bit = 0,
    @serialize_writers bit = 0,
    @shard_column sysname = null,
    @ulid_column sysname = null
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;
    -- create_feed_storage runs ALTER TABLE (lock escalation) in this transaction, and SQL
    -- Server refuses ALTER TABLE in an explicit transaction at SNAPSHOT isolation (metadata is
    -- not versioned). The registry reads take their locks explicitly. This reverts on return.
    set transaction isolation level read committed;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @problem nvarchar(2048);
    declare @object_id int;
    declare @mode varchar(20);
    declare @registered_mode varchar(20);
    declare @message nvarchar(2048);
    declare @qualified_name nvarchar(300);
    declare @shard_name sysname;
    declare @ulid_name sysname;
    declare @registered_shard sysname;
    declare @registered_ulid sysname;
    declare @registered_name nvarchar(257);

    exec changefeed.check_table_name
        @table_name = @table_name,
        @schema_name = @schema_name output,
        @object_name = @object_name output;

    -- bit + bit is not defined (error 402): add them as int.
    if convert(int, isnull(@outbox, 0)) + convert(int, isnull(@serialize_writers, 0)) <> 1
        throw 51004, N'setup_feed: choose exactly one mode: @outbox = 1 or @serialize_writers = 1.', 1;
    if @serialize_writers = 1
    begin
        if @shard_column is null or @ulid_column is null
            throw 51004, N'setup_feed: @serialize_writers = 1 needs @shard_column (an int column) and @ulid_column (a binary(16) column) of the event table.', 1;
        set @mode = 'serialize_writers';
    end
    else
    begin
        if @shard_column is not null or @ulid_column is not null
            throw 51004, N'setup_feed: @shard_column and @ulid_column belong to @serialize_writers = 1. An outbox-mode feed takes its shard from the outbox row; leave them null.', 1;
        set @mode = 'outbox';
    end;

    set @object_id = object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U');
    if @object_id is null
    begin
        if object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'V') is not null
            set @message = N'setup_feed: ''' + @table_name + N''' is a view, and a feed needs a'
                + N' table: its primary key is copied into the outbox and the feed, and writers'
                + N' insert into it. Set the feed up on the table the view reads.';
        else
            set @message = N'setup_feed: the table ''' + @table_name
                + N''' does not exist (or you cannot see it) in database ''' + db_name()
                + N'''. Create it first, in the same migration or an earlier one.';
        throw 51001, @message, 1;
    end;
    -- From here on the catalog's spelling, so every per-feed name matches the table's.
    set @schema_name = object_schema_name(@object_id);
    set @object_name = object_name(@object_id);
    set @qualified_name = @schema_name + N'.' + @object_name;

    -- The ownership chain (see the header): refused with 51013, the statement that fixes it
    -- and what that statement removes (changefeed.owner_chain_problem, V101).
    exec changefeed.check_owner_chain
        @schema_name = @schema_name,
        @table_name = @object_name,
        @caller = N'setup_feed';

    if not exists (
        select 1
        from sys.indexes
        where object_id = @object_id and is_primary_key = 1
    )
    begin
        set @message = N'setup_feed: the table ''' + @qualified_name
            + N''' has no primary key. The outbox and the feed carry the event''s primary key;'
            + N' add one (alter table ... add constraint ... primary key ...).';
        throw 51002, @message, 1;
    end;

    select top (1) @problem = problem
    from changefeed.key_columns(@object_id)
    where problem is not null
    order by key_ordinal;
    if @problem is not null throw 51008, @problem, 1;

    -- key_columns compares the key's names with the names changefeed adds in the database's
    -- collation, so in a case-sensitive database a key column ULID passes it. But read_feed's
    -- copy of the key and a caller's #read live in tempdb, whose collation (the server's)
    -- may ignore case, and there ULID and ulid are one name: every read into #read would
    -- fail (Msg 2705). So the names are compared here under an explicit collation that
    -- ignores case, accents, kana type and width, whatever the database's and tempdb's are.
    select top (1)
        @problem = N'The key column ''' + column_name
            + N''' has, but for case, accents or width, the name of a column changefeed adds'
            + N' next to the key (shard_id, ulid, order_sequence, time_hint), and in tempdb'
            + N' (the server''s collation) the two may be one name. Rename the column.'
    from changefeed.key_columns(@object_id)
    where
        column_name collate Latin1_General_100_CI_AI
        in (N'shard_id', N'ulid', N'order_sequence', N'time_hint')
    order by key_ordinal;
    if @problem is not null throw 51008, @problem, 1;

    -- For the same reason, two key columns whose names differ only by case, accents or
    -- width (Code, code) may be one name in tempdb: read_feed could not copy the key there.
    select top (1)
        @problem = N'The key columns ''' + a.column_name + N''' and ''' + b.column_name
            + N''' differ only by case, accents or width, and in tempdb (the server''s'
            + N' collation) the two may be one name. Rename one of them.'
    from changefeed.key_columns(@object_id) as a
    inner join changefeed.key_columns(@object_id) as b
        on
            a.key_ordinal < b.key_ordinal
            and a.column_name collate Latin1_General_100_CI_AI
            = b.column_name collate Latin1_General_100_CI_AI
    order by a.key_ordinal, b.key_ordinal;
    if @problem is not null throw 51008, @problem, 1;

    if @mode = 'serialize_writers'
    begin
        -- The catalog's spelling of each column, and its type.
        -- NOT NULL: read_feed never returns a row whose shard or ULID is null.
        select @shard_name = name
        from sys.columns
        where object_id = @object_id and name = @shard_column and is_nullable = 0
            and system_type_id = type_id(N'int') and user_type_id = type_id(N'int');
        select @ulid_name = name
        from sys.columns
        where object_id = @object_id and name = @ulid_column and is_nullable = 0
            and system_type_id = type_id(N'binary') and max_length = 16;
        if @shard_name is null or @ulid_name is null
        begin
            set @message = N'setup_feed: ''' + @qualified_name + N''' needs an int column '''
                + @shard_column + N''' and a binary(16) column ''' + @ulid_column
                + N'''; ' + case
                    when @shard_name is null then N'the shard column is missing, nullable or not int.'
                    else N'the ULID column is missing, nullable or not binary(16) (a GUID type would sort its bytes out of order).'
                end;
            throw 51010, @message, 1;
        end;
        if charindex(N'__template', @shard_name collate Latin1_General_100_BIN2) > 0
            or charindex(N'__template', @ulid_name collate Latin1_General_100_BIN2) > 0
            throw 51008, N'setup_feed: the shard and ULID column names must not contain ''__template'', which changefeed reserves. Rename the column.', 1;
        if not exists (
            select 1
            from sys.indexes as i
            where
                i.object_id = @object_id
                and i.is_unique = 1
                and i.has_filter = 0
                and i.is_disabled = 0
                and (
                    select count(*)
                    from sys.index_columns as ic
                    where
                        ic.object_id = i.object_id
                        and ic.index_id = i.index_id
                        and ic.key_ordinal > 0
                ) = 2
                and exists (
                    select 1
                    from sys.index_columns as ic
                    inner join sys.columns as c
                        on ic.object_id = c.object_id and ic.column_id = c.column_id
                    where
                        ic.object_id = i.object_id and ic.index_id = i.index_id
                        and ic.key_ordinal = 1 and c.name = @shard_name
                )
                and exists (
                    select 1
                    from sys.index_columns as ic
                    inner join sys.columns as c
                        on ic.object_id = c.object_id and ic.column_id = c.column_id
                    where
                        ic.object_id = i.object_id and ic.index_id = i.index_id
                        and ic.key_ordinal = 2 and c.name = @ulid_name
                )
        )
        begin
            set @message = N'setup_feed: ''' + @qualified_name + N''' needs a unique index on'
                + N' exactly (' + @shard_name + N', ' + @ulid_name + N'), unfiltered, for'
                + N' read_feed to page through: create unique index ... on '
                + quotename(@schema_name) + N'.' + quotename(@object_name) + N' ('
                + quotename(@shard_name) + N', ' + quotename(@ulid_name) + N').';
            throw 51011, @message, 1;
        end;
    end;

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        -- UPDLOCK, HOLDLOCK: two concurrent setup_feed calls for one table serialize here
        -- instead of both creating the feed.
        select
            @registered_mode = mode,
            @registered_shard = shard_column,
            @registered_ulid = ulid_column,
            @registered_name = schema_name + N'.' + table_name
        from changefeed.feeds with (updlock, holdlock)
        where object_id = @object_id;

        -- A feed registered under this name for another table: the event table was dropped
        -- and re-created (or another table renamed into its place). The registry row, the
        -- storage and the code still belong to the old table; inserting a second row would
        -- only fail on the registry's unique name (2627).
        if @registered_mode is null and exists (
            select 1
            from changefeed.feeds with (updlock, holdlock)
            where schema_name = @schema_name and table_name = @object_name
        )
        begin
            set @message = N'setup_feed: the table ''' + @qualified_name + N''' was dropped'
                + N' and re-created (or renamed into place) since it became a feed, and the feed'
                + N' still belongs to the old table. Tear it down first: exec'
                + N' changefeed.teardown_feed @table_name = N''' + @qualified_name + N''';'
                + N' (this drops the old feed''s history and its consumers'' cursors), then run'
                + N' setup_feed again.';
            throw 51001, @message, 1;
        end;
        -- This table is a feed under another name: it was renamed since setup (compared with
        -- the database's collation, like every name).
        if @registered_name <> @qualified_name
        begin
            set @message = N'setup_feed: the table ''' + @qualified_name + N''' is already a'
                + N' feed under its old name ''' + @registered_name + N''' (it was renamed'
                + N' since setup). Tear the old feed down first: exec changefeed.teardown_feed'
                + N' @table_name = N''' + @registered_name + N'''; then run setup_feed again.';
            throw 51001, @message, 1;
        end;

        if @registered_mode is null
        begin
            exec changefeed.create_feed_storage @object_id = @object_id, @mode = @mode;

            insert into changefeed.feeds
            (object_id, schema_name, table_name, mode, shard_column, ulid_column, generator_version)
            values (
                @object_id, @schema_name, @object_name, @mode, @shard_name, @ulid_name,
                changefeed.generator_version()
            );

            exec changefeed.upgrade_feed @table_name = @qualified_name;
        end
        else if
            @registered_mode <> @mode
            or isnull(@registered_shard, N'') <> isnull(@shard_name, N'')
            or isnull(@registered_ulid, N'') <> isnull(@ulid_name, N'')
        begin
            set @message = N'setup_feed: ''' + @qualified_name + N''' is already a feed in '
                + @registered_mode + N' mode' + isnull(N' on (' + @registered_shard + N', '
                + @registered_ulid + N')', N'') + N'. To change that, tear it down first'
                + N' (exec changefeed.teardown_feed), which drops its feed history.';
            throw 51005, @message, 1;
        end;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
