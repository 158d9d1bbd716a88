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
-- registrations went with its registry row).
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

        delete from changefeed.consumer_cursor
        where consumer = @consumer and feed = @registered_feed;
        set @removed = @@rowcount;

        -- Names never contain a dot (parse_feed_name), so parsename splits the registry's
        -- spelling exactly; a feed no longer registered has no registrations to delete.
        delete r
        from changefeed.registered_consumers as r
        inner join changefeed.feeds as f
            on f.feed_id = r.feed_id
        where
            r.consumer = @consumer
            and f.schema_name = parsename(@registered_feed, 2)
            and f.table_name = parsename(@registered_feed, 1);

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;

    select @removed as removed;
end
