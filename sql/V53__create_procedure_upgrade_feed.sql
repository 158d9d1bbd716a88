-- Regenerates the code objects of one feed from the current templates (read_feed and its
-- status view; for a serialized-writer feed also lock_feed and the ulid function), then its
-- grants and changefeed.feed_status. Tables are never touched. A migration that changes a
-- template ends with exec changefeed.upgrade_all_feeds.
--
-- The templates are the objects of the template feed of the feed's mode: the outbox-mode
-- template feed changefeed.__template__ or the serialized-writer one
-- changefeed.__template_serialized__. changefeed.copy_template copies each with
-- the feed's names, key columns, and shard and ulid columns.
--
-- The names are the registry's spelling, whatever the caller's: in a case-insensitive
-- database 'DBO.Orders' finds the feed of dbo.orders, but code generated with that spelling
-- would take its applocks under other resource names (sp_getapplock compares them
-- byte-wise), so a serialized reader would stop waiting for a writer whose transaction was
-- open across the upgrade, and an outbox-mode mover for a mover of the old code.
--
-- A feed whose event table's primary key changed since setup is refused (51014) before any
-- object is regenerated: its storage holds the old key, so the new code would not compile,
-- and under XACT_ABORT the failure would doom the caller's transaction.
--
-- @refresh_status = 0 leaves changefeed.feed_status to the caller: upgrade_all_feeds
-- records every feed's problem once, before it regenerates any (one refresh per feed would
-- make an upgrade of N feeds cost O(N^2)). Regenerating a feed never changes what
-- feed_status reads (its status view keeps its name and the template's columns), so the
-- view stays valid.
--
-- A feed raised from a generator version below 5 gets the purge_feed that holds back only
-- for registered consumers (V98). Its consumers were created under the old rule, where any
-- saved cursor held purge back, so those with a saved cursor and no registration are
-- registered here, in the transaction that regenerates the feed: no purge runs the new code
-- before they are (the migration that introduced registrations registered the consumers
-- it found; this catches those first saved since then). A consumer unregistered by an
-- administrator while the feed still had the old code is registered again: until this
-- upgrade the old purge_feed held back for it all the same.
--
-- Order inside the transaction: every statement that may wait for an application's
-- transaction (the locking read of saved cursors, waiting for a first save being committed;
-- the update of the feed's registry row, on which save_cursor and load_cursor hold a shared
-- lock until the consumer's transaction ends) runs BEFORE any of the feed's procedures is
-- altered. A consumer that waits for this transaction's altered read_feed while holding what
-- these statements wait for would otherwise deadlock with it. Each such wait is bounded by
-- the session's LOCK_TIMEOUT (upgrade_all_feeds sets 2 s when the session has none).
create or alter procedure [changefeed].[upgrade_feed]
    @table_name nvarchar(4000),
    @refresh_status bit = 1
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @feed_id int;
    declare @object_id int;
    declare @mode varchar(20);
    declare @shard_column sysname;
    declare @ulid_column sysname;
    declare @template_table sysname;
    declare @key_list nvarchar(max);
    declare @key_join nvarchar(max);
    declare @kind nvarchar(128);
    declare @template nvarchar(300);
    declare @message nvarchar(2048);
    declare @registered_schema sysname;
    declare @registered_table sysname;
    declare @key_problem nvarchar(1000);

    exec changefeed.check_table_name
        @table_name = @table_name,
        @schema_name = @schema_name output,
        @object_name = @object_name output;

    select
        @feed_id = feed_id,
        @object_id = object_id,
        @mode = mode,
        @shard_column = shard_column,
        @ulid_column = ulid_column,
        @registered_schema = schema_name,
        @registered_table = table_name
    from changefeed.feeds
    where schema_name = @schema_name and table_name = @object_name;
    if @feed_id is null
    begin
        set @message = N'''' + @table_name
            + N''' is not a feed. Set it up first: exec changefeed.setup_feed @table_name = N'''
            + @table_name + N''', @outbox = 1.';
        throw 51006, @message, 1;
    end;
    -- From here on the registry's spelling (see the header).
    set @schema_name = @registered_schema;
    set @object_name = @registered_table;
    if isnull(object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U'), 0)
    <> @object_id
    begin
        set @message = N'The event table ''' + @table_name
            + N''' was dropped or replaced since its feed was set up. Tear the feed down'
            + N' (changefeed.teardown_feed) and set it up again.';
        throw 51001, @message, 1;
    end;

    select @key_problem = problem
    from changefeed.feed_key_problem(@object_id, @schema_name, @object_name);
    if @key_problem is not null
        throw 51014, @key_problem, 1;

    select
        @key_list = string_agg(convert(nvarchar(max), quotename(column_name)), N', ')
            within group (order by key_ordinal),
        @key_join = string_agg(
            convert(nvarchar(max), N'e.') + quotename(column_name)
            + N' = r.' + quotename(column_name),
            N' and '
        ) within group (order by key_ordinal)
    from changefeed.key_columns(@object_id);

    set @template_table = case
        when @mode = 'serialize_writers' then N'__template_serialized__'
        else N'__template__'
    end;

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        -- Raising the feed from below 5 to 5 or more (see the top); read under the
        -- generators lock: no other upgrade changes it meanwhile. Below 5 this version is
        -- the one of a bundle migrated part of the way (a test's from-version, a run
        -- stopped by a failed migration), where registered_consumers may not exist yet: the
        -- insert is then never run, so never compiled (deferred name resolution).
        if changefeed.generator_version() >= 5 and exists (
            select 1
            from changefeed.feeds
            where feed_id = @feed_id and generator_version < 5
        )
            -- As the migration that introduced registrations did (V93, V100): distinct in
            -- the key's collation (the database's), so that two names the key holds equal
            -- are one row, not a duplicate key (2627). READCOMMITTEDLOCK: under
            -- READ_COMMITTED_SNAPSHOT a plain read would miss a first save being committed;
            -- a locking read waits for it (LOCK_TIMEOUT) and registers it. UPDLOCK, HOLDLOCK:
            -- a register_consumer of the same consumer committing between the check and
            -- the insert would fail this with 2627; it waits instead.
            insert into [changefeed].[registered_consumers] (feed_id, consumer)
            select distinct
                @feed_id as feed_id,
                c.consumer collate database_default as consumer
            from [changefeed].[consumer_cursor] as c with (readcommittedlock)
            where
                c.feed = @schema_name + N'.' + @object_name
                and not exists (
                    select 1
                    from [changefeed].[registered_consumers] as r with (updlock, holdlock)
                    where
                        r.feed_id = @feed_id
                        and r.consumer = c.consumer collate database_default
                );

        update changefeed.feeds
        set
            generator_version = changefeed.generator_version(),
            upgraded_at = sysutcdatetime()
        where feed_id = @feed_id;

        declare code_objects cursor local fast_forward for
        select
            f.kind,
            t.quoted_name
        from changefeed.feed_objects(@schema_name, @object_name) as f
        inner join changefeed.feed_objects(N'changefeed', @template_table) as t
            on f.kind = t.kind
        where f.object_class in ('P', 'V', 'FN') and f.mode in ('both', @mode)
        order by f.drop_order desc;

        open code_objects;
        fetch next from code_objects into @kind, @template;
        while @@fetch_status = 0
        begin
            exec changefeed.copy_template
                @template = @template,
                @template_table = @template_table,
                @schema_name = @schema_name,
                @table_name = @object_name,
                @key_list = @key_list,
                @key_join = @key_join,
                @shard_column = @shard_column,
                @ulid_column = @ulid_column;

            fetch next from code_objects into @kind, @template;
        end;
        close code_objects;
        deallocate code_objects;

        exec changefeed.grant_feed_roles
            @schema_name = @schema_name,
            @table_name = @object_name,
            @mode = @mode;
        if isnull(@refresh_status, 1) = 1
            exec changefeed.refresh_feed_status;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
