-- Creates a feed's two database roles when missing and grants them exactly what they need:
--   [changefeed.writers:S.T]  outbox mode: INSERT on the outbox (order_sequence is an
--                             IDENTITY, so a writer cannot choose it);
--                             serialized-writer mode: EXECUTE on lock_feed and the ulid
--                             function (inserting into the event table is the application's
--                             own grant);
--   [changefeed.readers:S.T]  EXECUTE on read_feed and on the read type (declaring a table
--                             variable of a table type needs EXECUTE on the type), and on
--                             save_cursor / load_cursor so consumers can keep their place.
-- Nothing else: a reader cannot touch the outbox, feed or state tables, and a writer cannot
-- read. read_feed reaches the tables through ownership chaining (one owner, dbo).
-- GRANT is idempotent, so upgrade_feed calls this after every generation.
create or alter procedure [changefeed].[grant_feed_roles]
    @schema_name sysname,
    @table_name sysname,
    @mode varchar(20) = 'outbox'
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @writers nvarchar(300);
    declare @readers nvarchar(300);
    declare @writers_name sysname;
    declare @readers_name sysname;
    declare @outbox nvarchar(300);
    declare @read_feed nvarchar(300);
    declare @read_type nvarchar(300);
    declare @lock_feed nvarchar(300);
    declare @ulid_function nvarchar(300);
    declare @sql nvarchar(max);

    select
        @writers = max(case when kind = N'changefeed.writers' then quoted_name end),
        @readers = max(case when kind = N'changefeed.readers' then quoted_name end),
        @writers_name = max(case when kind = N'changefeed.writers' then object_name end),
        @readers_name = max(case when kind = N'changefeed.readers' then object_name end),
        @outbox = max(case when kind = N'outbox' then quoted_name end),
        @read_feed = max(case when kind = N'read_feed' then quoted_name end),
        @read_type = max(case when kind = N'type:read' then quoted_name end),
        @lock_feed = max(case when kind = N'lock_feed' then quoted_name end),
        @ulid_function = max(case when kind = N'ulid' then quoted_name end)
    from changefeed.feed_objects(@schema_name, @table_name);

    -- A NULL name would make the statements below NULL, which sp_executesql runs as nothing.
    if @writers is null or @readers is null or @outbox is null or @read_feed is null
        or @read_type is null or @lock_feed is null or @ulid_function is null
        throw 51009, N'grant_feed_roles: a per-feed object or role name could not be built.', 1;

    begin try
        begin transaction;

        if database_principal_id(@writers_name) is null
        begin
            set @sql = N'create role ' + @writers + N';';
            exec sys.sp_executesql @sql;
        end;
        if database_principal_id(@readers_name) is null
        begin
            set @sql = N'create role ' + @readers + N';';
            exec sys.sp_executesql @sql;
        end;

        set @sql = case
            when @mode = 'serialize_writers'
                then
                    N'grant execute on object::' + @lock_feed + N' to ' + @writers + N'; '
                    + N'grant execute on object::' + @ulid_function + N' to ' + @writers + N'; '
            else N'grant insert on object::' + @outbox + N' to ' + @writers + N'; '
        end
            + N'grant execute on object::' + @read_feed + N' to ' + @readers + N'; '
            + N'grant execute on type::' + @read_type + N' to ' + @readers + N'; '
            + N'grant execute on object::[changefeed].[save_cursor] to ' + @readers + N'; '
            + N'grant execute on object::[changefeed].[load_cursor] to ' + @readers + N';';
        exec sys.sp_executesql @sql;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
