-- Makes an event table a feed: exec changefeed.setup_feed @table_name = N'schema.table',
-- @outbox = 1. Call it from your own migration, once per event table. It creates the feed's
-- storage, registers it, generates its code, creates its roles and refreshes feed_status,
-- all in one transaction. A second call with the same arguments changes nothing; a call that
-- asks for another mode is refused (tear the feed down first).
create or alter procedure [changefeed].[setup_feed]
    @table_name nvarchar(4000),
    @outbox bit = 0,
    @serialize_writers bit = 0,
    @shard_column sysname = null,
    @ulid_column sysname = null
as
begin
    set nocount, xact_abort on;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @problem nvarchar(2048);
    declare @object_id int;
    declare @mode varchar(20);
    declare @registered_mode varchar(20);
    declare @message nvarchar(2048);
    declare @qualified_name nvarchar(300);

    select
        @schema_name = schema_name,
        @object_name = table_name,
        @problem = problem
    from changefeed.parse_feed_name(@table_name);
    if @problem is not null throw 51000, @problem, 1;

    if isnull(@outbox, 0) + isnull(@serialize_writers, 0) <> 1
        throw 51004, N'setup_feed: choose exactly one mode: @outbox = 1 or @serialize_writers = 1.', 1;
    if @serialize_writers = 1
        throw 51007, N'setup_feed: @serialize_writers = 1 is not available in this version of the changefeed bundle. Use @outbox = 1, or apply a newer bundle.', 1;
    if @shard_column is not null or @ulid_column is not null
        throw 51004, N'setup_feed: @shard_column and @ulid_column belong to @serialize_writers = 1. An outbox-mode feed takes its shard from the outbox row; leave them null.', 1;
    set @mode = 'outbox';

    set @object_id = object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U');
    if @object_id is null
    begin
        set @message = N'setup_feed: the table ''' + @table_name
            + N''' does not exist (or you cannot see it) in database ''' + db_name()
            + N'''. Create it first, in the same migration or an earlier one.';
        throw 51001, @message, 1;
    end;
    -- From here on the catalog's spelling, so every per-feed name matches the table's.
    set @schema_name = object_schema_name(@object_id);
    set @object_name = object_name(@object_id);
    set @qualified_name = @schema_name + N'.' + @object_name;

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

    begin try
        begin transaction;

        -- UPDLOCK, HOLDLOCK: two concurrent setup_feed calls for one table serialize here
        -- instead of both creating the feed.
        select @registered_mode = mode
        from changefeed.feeds with (updlock, holdlock)
        where object_id = @object_id;

        if @registered_mode is null
        begin
            exec changefeed.create_feed_storage @object_id = @object_id;

            insert into changefeed.feeds (object_id, schema_name, table_name, mode, generator_version)
            values (@object_id, @schema_name, @object_name, @mode, changefeed.generator_version());

            exec changefeed.upgrade_feed @table_name = @qualified_name;
        end
        else if @registered_mode <> @mode
        begin
            set @message = N'setup_feed: ''' + @qualified_name + N''' is already a feed in '
                + @registered_mode + N' mode. To change its mode, tear it down first'
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
