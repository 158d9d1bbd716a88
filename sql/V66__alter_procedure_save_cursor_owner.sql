-- Saves a consumer's cursor for one feed shard (replaces the first version). Runs in the
-- caller's transaction when there is one (so it commits or rolls back with the consumer's
-- own side effects), else in one of its own. Any cursor may be saved, an earlier one too:
-- that is how a consumer rewinds to replay.
--
-- Who may save. Only members of the feed's readers role [changefeed.readers:S.T] (or
-- db_owner): every feed's readers may EXECUTE this procedure, and a cursor steers what
-- purge_feed deletes, so a reader of one feed must not move another feed's consumers. And
-- within a feed, a consumer belongs to the database principal of its first save
-- (consumer_cursor.owner_principal_id): another principal gets 51114, db_owner may save any
-- consumer's cursor (it stays its owner's). A consumer saved before owners existed (NULL)
-- is bound to the principal of its next save, unless that is a db_owner's (it stays
-- unbound: the consumer's own login keeps it). A db_owner removes a stale consumer with
-- changefeed.remove_consumer; consumer_lag shows each consumer's owner.
--
-- What it holds, and for how long (issue 19 item 3). The check that the feed exists and
-- the write are one atomic step: the feed's registry key (feeds_name_uq) is read with a
-- shared lock kept until the caller's transaction ends, so teardown_feed of that feed, which
-- deletes the key and then the feed's cursors, waits for the transaction that saved a cursor
-- instead of leaving it behind (a cursor of a dropped feed would hold back purge of a feed
-- set up again under the name). Nothing else waits for it: setup, upgrade and status
-- refreshes change other columns of the registry row, not that key. A save that comes after
-- a teardown got the key finds no feed and is refused (51006).
-- A consumer moving on (its own row exists): one keyed update, nothing more.
-- A first save (no row for this shard), or a save of a consumer with no owner or another
-- owner: an exclusive applock named after the consumer and feed, owned by the caller's
-- transaction, so first saves of one consumer and feed are one at a time and the owner check
-- cannot race; then the owner check and an update or insert of the one row. Held to the
-- end of the caller's transaction (a second principal must not read past an uncommitted
-- first save), it makes only first saves of the same consumer and feed wait; the inserted
-- row's own key lock is held as every write's is. No key-range lock is taken, so first
-- saves of other consumers and shards never wait for it.
--
-- IMPLICIT_TRANSACTIONS is left as the caller set it, on purpose: a client with implicit
-- transactions on (JDBC with autocommit off, pyodbc) expects its save to be part of the
-- transaction it commits itself; its first statement here opens that transaction, and the
-- client commits it. Only a caller with neither a transaction nor implicit transactions
-- gets a transaction of this procedure's own, committed before it returns.
--
-- Names: a consumer name takes 1 to 200 UTF-16 code units (the column's nvarchar(200);
-- counted with datalength, since len() counts a surrogate pair once under an _SC collation)
-- and does not end with a space (= ignores trailing spaces, so 'a' and 'a ' would be one
-- consumer). The parameter is wider than the column so that a longer name is refused rather
-- than silently cut (which could merge it with another consumer).
create or alter procedure [changefeed].[save_cursor]
    @consumer nvarchar(4000),
    @feed nvarchar(257),
    @shard_id int,
    -- Wider than a cursor on purpose: a binary(16) parameter would silently pad a 15-byte
    -- value (which re-delivers a row) or truncate a 17-byte one; this one keeps the length
    -- so that anything but exactly 16 bytes is refused.
    @cursor varbinary(8000)
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);
    declare @registered_feed nvarchar(257);
    declare @me int = database_principal_id();
    declare @is_db_owner bit = convert(bit, isnull(is_rolemember(N'db_owner'), 0));
    declare @own_transaction bit = 0;
    declare @feed_rows int;
    declare @lock_result int;
    declare @resource nvarchar(255);
    declare @owner int;
    declare @owners int;
    declare @consumer_rows int;

    if @consumer is null or datalength(@consumer) = 0 or datalength(@consumer) / 2 > 200
        or datalength(@consumer) <> datalength(rtrim(@consumer))
        throw 51110, N'save_cursor: @consumer must be a name of 1 to 200 UTF-16 code units (an emoji takes two) that does not end with a space.', 1;
    if @shard_id is null or @cursor is null
        throw 51110, N'save_cursor: @shard_id and @cursor are required.', 1;
    if datalength(@cursor) <> 16
    begin
        set @message = concat(
            N'save_cursor: @cursor has ', datalength(@cursor), N' bytes; a cursor is exactly 16',
            N' (a ULID as binary(16), e.g. the ulid of the last row read, or',
            N' 0x00000000000000000000000000000000 for the start).'
        );
        throw 51111, @message, 1;
    end;

    -- The reads below must see rows committed since a caller's SNAPSHOT transaction began
    -- (another principal's first save). Reverts on return.
    set transaction isolation level read committed;

    begin try
        -- @@options & 2: IMPLICIT_TRANSACTIONS. Off and no transaction: an own one, since
        -- the applock and the check-then-write below need a transaction to be atomic.
        if @@trancount = 0 and (@@options & 2) = 0
        begin
            -- Already off here; said for the reader (a begin under ON opens two levels).
            set implicit_transactions off;
            begin transaction;
            set @own_transaction = 1;
        end;

        -- 51006 for a name that is not a feed, 51112 for a caller outside its readers role.
        -- The registry's spelling comes back, so the row matches teardown_feed's and
        -- purge_feed's.
        exec changefeed.check_cursor_access
            @procedure = N'save_cursor',
            @feed = @feed,
            @registered_feed = @registered_feed output;

        -- The atomic step with teardown_feed (see the top): the registry key, share-locked
        -- until the transaction ends. REPEATABLEREAD locks even under READ_COMMITTED_SNAPSHOT
        -- and takes no key-range lock; the index hint keeps the lock on the key teardown
        -- deletes. Names never contain a dot (parse_feed_name), so parsename splits exactly.
        select @feed_rows = count(*)
        from changefeed.feeds with (repeatableread, index(feeds_name_uq))
        where
            schema_name = parsename(@registered_feed, 2)
            and table_name = parsename(@registered_feed, 1);
        if @feed_rows = 0
        begin
            set @message = N'save_cursor: ''' + @feed + N''' is not a feed (it was torn down'
                + N' while this cursor was being saved). Pass the feed''s event table as'
                + N' ''schema.table''.';
            throw 51006, @message, 1;
        end;

        -- A consumer moving on: its own row (or any row, for db_owner) of this shard.
        update changefeed.consumer_cursor
        set
            [cursor] = convert(binary(16), @cursor),
            updated_at = sysutcdatetime()
        where
            consumer = @consumer and feed = @registered_feed and shard_id = @shard_id
            and (owner_principal_id = @me or (@is_db_owner = 1 and owner_principal_id is not null));

        if @@rowcount = 0
        begin
            -- Named by a hash: a consumer name does not fit the 255-character resource name.
            -- upper: consumer compares with the database's collation (commonly
            -- case-insensitive), so names it treats as one should share a lock (README.md,
            -- cursors, for collations that also ignore accents or width; trailing spaces are
            -- refused above). A collision only makes two first saves wait for each other.
            set @resource = N'changefeed:consumer:'
                + convert(nvarchar(64), hashbytes('SHA2_256', upper(@consumer) + N'/' + @registered_feed), 2);
            exec @lock_result = sys.sp_getapplock
                @Resource = @resource,
                @LockMode = 'Exclusive',
                @LockOwner = 'Transaction';
            if @lock_result < 0
                throw 51115, N'save_cursor: another transaction is saving the first cursor of this consumer and feed, and its lock was not granted within this session''s LOCK_TIMEOUT (or this transaction was chosen as a deadlock victim). Retry the transaction.', 1;

            -- Every change of which rows this consumer and feed has, and of their owner
            -- (a first save, a binding, remove_consumer), holds this lock; a row's owner
            -- never changes otherwise. So, after the grant, even a dirty read is exact about
            -- both, and it does not wait for the owner's own open update of another shard
            -- (which, waiting here for it while it waits for this lock, would deadlock).
            select
                @owners = count(distinct owner_principal_id),
                @owner = min(owner_principal_id),
                @consumer_rows = count(*)
            from changefeed.consumer_cursor with (readuncommitted)
            where consumer = @consumer and feed = @registered_feed;

            if @owners > 1 or (@owner <> @me and @is_db_owner = 0)
            begin
                set @message = N'save_cursor: the consumer ''' + @consumer + N''' of the feed '''
                    + @registered_feed + N''' belongs to the database user '''
                    + isnull(user_name(@owner), concat(N'with principal id ', @owner))
                    + N''' (the principal of its first save), not to '''
                    + user_name() + N'''. Name this consumer differently, or ask a db_owner'
                    + N' to remove the stale one: exec changefeed.remove_consumer @consumer = N'''
                    + replace(@consumer, N'''', N'''''') + N''', @feed = N'''
                    + replace(@registered_feed, N'''', N'''''') + N''';';
                throw 51114, @message, 1;
            end;

            -- Rows saved before owners existed become the caller's, unless the caller is a
            -- db_owner: a db_owner may save any consumer's cursor (an operator moving it)
            -- and must not take it over, or the consumer's own login would get 51114 on
            -- every later save and load. They stay without an owner until the consumer's
            -- own next save binds them.
            if @owners = 0 and @consumer_rows > 0 and @is_db_owner = 0
                update changefeed.consumer_cursor
                set owner_principal_id = @me
                where consumer = @consumer and feed = @registered_feed;

            update changefeed.consumer_cursor
            set
                [cursor] = convert(binary(16), @cursor),
                updated_at = sysutcdatetime()
            where consumer = @consumer and feed = @registered_feed and shard_id = @shard_id;

            -- The first save of this shard: the consumer's owner, or the caller for a new
            -- consumer; none for a db_owner's save of a consumer that has none yet (above).
            -- No hint: the applock excludes another save_cursor of this key.
            if @@rowcount = 0
                insert into changefeed.consumer_cursor
                    (consumer, feed, shard_id, [cursor], owner_principal_id)
                values (
                    @consumer, @registered_feed, @shard_id, convert(binary(16), @cursor),
                    case
                        when @owners = 0 and @consumer_rows > 0 and @is_db_owner = 1 then null
                        else isnull(@owner, @me)
                    end
                );
        end;

        if @own_transaction = 1
            commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
