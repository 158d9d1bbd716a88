-- (Replaces V24's.) What changed: teardown_feed waits at most 30 s for each lock, then gives
-- up with 51012 (transient: retry). The bound is per lock wait (LOCK_TIMEOUT), not per call:
-- two holders met one after the other (a consumer's open save, then an open writer of the
-- feed's tables) can each cost up to 30 s. It holds the generators lock (changefeed.lock_generators)
-- from the start, and its first statements wait for any transaction that holds the feed: a
-- consumer's save_cursor keeps a shared lock on the feed's registry row until the
-- consumer's transaction ends (so that no cursor of a dropped feed is left), and a reader
-- may hold the feed's objects. Unbounded, one consumer's open transaction made every other
-- generator call (setup_feed, setup_outbox, the upgrades, the migrations that run them)
-- fail with 51012 after waiting 60 s for the generators lock. 30 s is half of that wait:
-- a generator call queued behind a teardown that gives up still gets the lock.
--
-- Drops everything setup_feed created for a feed: its code, read type, feed (with its whole
-- history), outbox (with events not yet moved), state, roles (after removing their
-- members), its consumers' saved cursors and its registry row. The event table itself is
-- untouched. The cursors go too because they point into the history dropped here: kept, they
-- would hold back purge_feed of a feed set up again under the same name (and be expired or
-- skip its first events), and a consumer of the new feed must decide afresh where to start.
-- A feed set up again gets new, empty roles: members must be added again. Idempotent: a call for
-- a table that is not (or no longer) a feed drops whatever per-feed object is left, if any.
-- DDL cannot take variables, hence dynamic SQL, built only from checked names.
create or alter procedure [changefeed].[teardown_feed]
    @table_name nvarchar(4000)
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @object_class varchar(2);
    declare @object_name_only sysname;
    declare @quoted_name nvarchar(300);
    declare @sql nvarchar(max);
    declare @message nvarchar(2048);

    exec changefeed.check_table_name
        @table_name = @table_name,
        @schema_name = @schema_name output,
        @object_name = @object_name output;

    -- The registry's spelling when the feed is registered (the catalog's, at setup time).
    select
        @schema_name = schema_name,
        @object_name = table_name
    from changefeed.feeds
    where schema_name = @schema_name and table_name = @object_name;

    begin try
        begin transaction;
        exec changefeed.lock_generators;
        -- Every lock wait from here on, while the generators lock is held (see the top).
        -- Reverts on return.
        set lock_timeout 30000;

        delete from changefeed.feeds
        where schema_name = @schema_name and table_name = @object_name;
        delete from changefeed.consumer_cursor
        where feed = @schema_name + N'.' + @object_name;
        -- First, so that feed_status no longer refers to the status view dropped below.
        exec changefeed.refresh_feed_status;

        declare feed_objects cursor local fast_forward for
        select
            object_class,
            object_name,
            quoted_name
        from changefeed.feed_objects(@schema_name, @object_name)
        order by drop_order;

        open feed_objects;
        fetch next from feed_objects into @object_class, @object_name_only, @quoted_name;
        while @@fetch_status = 0
        begin
            set @sql = case
                when @object_class = 'P' then N'drop procedure if exists ' + @quoted_name
                when @object_class = 'FN' then N'drop function if exists ' + @quoted_name
                when @object_class = 'V' then N'drop view if exists ' + @quoted_name
                when @object_class = 'TT' then N'drop type if exists ' + @quoted_name
                when @object_class = 'U' then N'drop table if exists ' + @quoted_name
                when
                    @object_class = 'R' and database_principal_id(@object_name_only) is not null
                    then (
                        select isnull(
                            string_agg(
                                convert(nvarchar(max), N'alter role ') + @quoted_name
                                + N' drop member ' + quotename(m.name),
                                N'; '
                            ) + N'; ',
                            N''
                        )
                        from sys.database_role_members as rm
                        inner join sys.database_principals as m
                            on rm.member_principal_id = m.principal_id
                        where rm.role_principal_id = database_principal_id(@object_name_only)
                    ) + N'drop role ' + @quoted_name
            end;
            if @sql is not null exec sys.sp_executesql @sql;

            fetch next from feed_objects into @object_class, @object_name_only, @quoted_name;
        end;
        close feed_objects;
        deallocate feed_objects;

        commit transaction;
    end try
    begin catch
        -- 1222: a lock wait ran out (see the top).
        if error_number() = 1222
        begin
            if @@trancount > 0 rollback transaction;
            set @message = N'teardown_feed of ' + @schema_name + N'.' + @object_name
                + N' waited over 30 s for a lock that another transaction holds on the feed'
                + N' (a consumer''s transaction that saved a cursor of it and is still open, a'
                + N' reader), and gave up so as not to hold the changefeed generators meanwhile.'
                + N' Nothing was dropped. Retry when that transaction has ended.';
            throw 51012, @message, 1;
        end;
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
