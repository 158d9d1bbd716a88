-- (Replaces V74's.) What changed: remove_consumer also deletes the consumer's registration
-- (register_consumer, V94). Kept, a registration would outlive the consumer it was made for:
-- the name is free after a removal, and whichever reader saved under it next would get a
-- consumer that holds purge_feed back without anyone having decided so.
--
-- Removes a consumer's saved cursors of one feed (every shard) and its registration, so that
-- it no longer holds purge_feed back and its name is free for a new first save. Returns one
-- row: removed, the number of cursor rows deleted. A consumer removed by its owner and
-- started again must be registered again to hold the purge back.
-- Who may: the consumer's owner (the principal of its first save, save_cursor) while a
-- member of the feed's readers role, and db_owner for any consumer. A db_owner may also
-- remove the cursors of a feed that is no longer registered (no readers role to check; its
-- registrations went with its registry row). A consumer registered before its first save
-- has no owner yet: only a db_owner removes it; anyone else gets 51114 and the registration
-- stays (an administrator's decision; a reader must not undo it). Anyone else asking to
-- remove a consumer with neither cursors nor a registration gets removed = 0, as before.
-- changefeed.consumer_lag shows every consumer with its owner, whether it holds retention
-- back and how far behind it is.
-- It takes the same applock as save_cursor's first save, so a removal and a concurrent
-- first save or owner binding of the same consumer and feed happen one after the other.
-- EXECUTE is granted to public (V69; a grant names the object, so it survives this
-- create or alter): the checks below are the authorization, as in save_cursor and
-- load_cursor, which every feed's readers may execute.
create or alter procedure [changefeed].[remove_consumer]
    @consumer nvarchar(4000),
    @feed nvarchar(257)
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a level open with the rows locked. Reverts on return.
    set implicit_transactions off;

    declare @registered_feed nvarchar(257);
    declare @feed_id int;
    declare @is_db_owner bit = convert(bit, isnull(is_rolemember(N'db_owner'), 0));
    declare @lock_result int;
    declare @resource nvarchar(255);
    declare @owner int;
    declare @removed int;
    declare @message nvarchar(2048);

    if @consumer is null or datalength(@consumer) = 0 or datalength(@consumer) / 2 > 200
        or datalength(@consumer) <> datalength(rtrim(@consumer))
        or @feed is null
        throw 51110, N'remove_consumer: pass the consumer''s name (1 to 200 UTF-16 code units, not ending with a space, as save_cursor requires) and its feed as ''schema.table''.', 1;

    if @is_db_owner = 1
    begin
        -- The registry's spelling when the feed is still registered; else the stored one.
        set @registered_feed = isnull(
            (
                select f.schema_name + N'.' + f.table_name
                from changefeed.feeds as f
                where
                    f.schema_name = parsename(@feed, 2)
                    and f.table_name = parsename(@feed, 1)
                    and parsename(@feed, 3) is null
            ),
            @feed
        );
    end
    else
    begin
        -- 51006 for a name that is not a feed, 51112 for a caller outside its readers role.
        exec changefeed.check_cursor_access
            @procedure = N'remove_consumer',
            @feed = @feed,
            @registered_feed = @registered_feed output;
    end;

    -- The feed's registry id, read before the transaction, so that the transaction below
    -- never locks the feeds row (see the deletes). NULL for a feed no longer registered (a
    -- db_owner's call): its registrations went with its registry row. A teardown after this
    -- read leaves nothing for the registration's delete to find. Names never contain a dot
    -- (parse_feed_name), so parsename splits the registry's spelling exactly; a db_owner's
    -- unregistered name of three parts names no feed.
    select @feed_id = feed_id
    from changefeed.feeds
    where
        schema_name = parsename(@registered_feed, 2)
        and table_name = parsename(@registered_feed, 1)
        and parsename(@registered_feed, 3) is null;

    begin try
        begin transaction;

        set @resource = N'changefeed:consumer:'
            + convert(nvarchar(64), hashbytes('SHA2_256', upper(@consumer) + N'/' + @registered_feed), 2);
        exec @lock_result = sys.sp_getapplock
            @Resource = @resource,
            @LockMode = 'Exclusive',
            @LockOwner = 'Transaction';
        if @lock_result < 0
            throw 51115, N'remove_consumer: another transaction is saving the first cursor of this consumer and feed, and its lock was not granted within this session''s LOCK_TIMEOUT (or this transaction was chosen as a deadlock victim). Retry.', 1;

        if @is_db_owner = 0
        begin
            select @owner = min(owner_principal_id)
            from changefeed.consumer_cursor
            where
                consumer = @consumer and feed = @registered_feed
                and (owner_principal_id is null or owner_principal_id <> database_principal_id());
            if @owner is not null or exists (
                select 1
                from changefeed.consumer_cursor
                where consumer = @consumer and feed = @registered_feed and owner_principal_id is null
            )
            begin
                set @message = N'remove_consumer: the consumer ''' + @consumer
                    + N''' of the feed ''' + @registered_feed + N''' does not belong to '''
                    + user_name() + N''' (its owner is '''
                    + isnull(user_name(@owner), N'not yet bound') + N'''). Ask a db_owner to'
                    + N' remove it.';
                throw 51114, @message, 1;
            end;
        end;

        -- Not db_owner, and no cursor row (the owner check above passed with none): the
        -- consumer has no owner, so it is not the caller's to remove. A registration (made by
        -- an administrator before the consumer's first save) stays: 51114. Without one there
        -- is nothing to remove: removed = 0, and nothing is deleted, so a registration
        -- committed after this read is not taken with it. The applock makes this read exact
        -- about the cursor rows (save_cursor's first save holds it).
        if @is_db_owner = 0 and not exists (
            select 1
            from changefeed.consumer_cursor
            where consumer = @consumer and feed = @registered_feed
        )
        begin
            if exists (
                select 1
                from changefeed.registered_consumers with (readcommittedlock)
                where feed_id = @feed_id and consumer = @consumer
            )
            begin
                set @message = N'remove_consumer: the consumer ''' + @consumer
                    + N''' of the feed ''' + @registered_feed + N''' has no saved cursor, so'
                    + N' it belongs to no one yet, and it is registered (it will hold'
                    + N' purge_feed back once it saves one). Only a db_owner removes it, or'
                    + N' unregisters it: exec changefeed.unregister_consumer @consumer = N'''
                    + replace(@consumer, N'''', N'''''') + N''', @feed = N'''
                    + replace(@registered_feed, N'''', N'''''') + N''';';
                throw 51114, @message, 1;
            end;
            set @removed = 0;
        end
        else
        begin
            -- The registration first, then the cursor rows: teardown_feed's order (its delete
            -- of the feeds row cascades to the registrations, then it deletes the cursor
            -- rows). Taken the other way round, this transaction would hold the cursor rows
            -- and wait for a registration a teardown holds, which waits for those cursor
            -- rows: a deadlock (1205). By feed_id, not through feeds, so no lock is taken on
            -- the feeds row that teardown deletes first.
            delete from changefeed.registered_consumers
            where feed_id = @feed_id and consumer = @consumer;

            delete from changefeed.consumer_cursor
            where consumer = @consumer and feed = @registered_feed;
            set @removed = @@rowcount;
        end;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;

    select @removed as removed;
end
