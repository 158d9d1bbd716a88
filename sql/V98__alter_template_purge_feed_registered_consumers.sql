-- (Replaces V46's.) What changed: only a registered consumer's cursor holds the purge back
-- (changefeed.registered_consumers, V93: registered by whoever administers the feed with
-- changefeed.register_consumer). A member of a feed's readers role may save a cursor under
-- any new consumer name; counted, a cursor of zeros under an invented name stopped every
-- purge of the feed for good. Such a consumer is passed now, and named: each shard's row
-- has passed_consumers. Each feed gets it when its code is regenerated after the migrations
-- (upgrade_all_feeds @only_outdated = 1, generator version 5 and later).
--
-- purge_feed for outbox-mode feeds, written as the template feed's procedure; copied
-- for every outbox-mode feed by upgrade_feed. (In serialized-writer mode the feed is your
-- own event table: deleting its old events is your decision, not changefeed's.)
--
-- Deletes feed rows older than a cutoff, oldest first, in batches of @batch_size rows, each
-- batch its own short transaction (a reader waits at most for one batch), at most @max_rows
-- rows per shard (null: no limit). The cutoff is the earlier of:
--   @older_than_ms   rows whose ULID time is more than this long ago (server clock)
--   @before          rows whose ULID is below this one
-- Unless @force = 1, a shard's rows are deleted only up to the lowest cursor saved for it
-- (changefeed.consumer_cursor) by a registered consumer (changefeed.registered_consumers): a
-- registered consumer that is behind holds the purge back. A consumer that never saved a
-- cursor, or is not registered, is not protected: the purge deletes past its cursor, and its
-- next read from that cursor gets 51104 (a cursor of zeros reads on from the oldest row
-- kept). The lowest such cursor is read again inside every batch's transaction, with
-- key-range locks held to its commit, and the batch deletes only up to the lowest one seen
-- in this call: a registration, a registered consumer's first save of the shard or its
-- rewind that commits while the purge runs waits for at most one batch, and every later
-- batch holds back for it (V46's purge read the cursors once per shard, and deleted rows
-- a consumer registered meanwhile had not read).
-- Each batch moves the shard's low-water mark (state.purged_through) to the largest ULID it
-- deleted, in the same transaction; read_feed refuses a cursor below it (51104).
-- @dry_run = 1 deletes nothing and reports what would go.
--
-- Returns one row per shard: shard_id, deleted (or would_delete), purged_through, why it
-- stopped ('cutoff reached', 'held back by consumer <name>', 'max rows reached'), dry_run,
-- and passed_consumers: the consumers with a saved cursor of the shard below the last row
-- this call deleted (or would delete), that is whose unread rows it deleted, as a list
-- ', '-separated in name order, NULL for none. Without @force only unregistered consumers
-- can be passed (a registered one holds the purge back at its cursor).
create or alter procedure [changefeed].[purge_feed:changefeed.__template__]
    @shard_id int = null,
    @older_than_ms bigint = null,
    @before binary(16) = null,
    @batch_size int = 5000,
    @max_rows bigint = null,
    @force bit = 0,
    @dry_run bit = 0
as
begin
    set nocount, xact_abort on;
    -- Each batch commits its own transaction: under a caller's IMPLICIT_TRANSACTIONS ON that
    -- commit would leave one level open, holding the batch's locks (readers of the shard
    -- would wait) after it returns. Set before any statement that would open one; reverts
    -- on return.
    set implicit_transactions off;
    -- Each batch updates the shard's state row, which movers update too: under a caller's
    -- SNAPSHOT that would fail with 3960, under SERIALIZABLE hold range locks movers wait for.
    -- And the shards cursor must survive each batch's commit (SET ANSI_DEFAULTS ON turns
    -- CURSOR_CLOSE_ON_COMMIT on). Both revert on return.
    set transaction isolation level read committed;
    set cursor_close_on_commit off;
    -- Each batch share-locks the feed's registrations and its registered consumers' cursor
    -- keys of the shard (see there), one after the other: a transaction that holds one of
    -- them (a saved cursor) and then writes another (a second consumer's cursor of the
    -- shard, a registration of the feed) can deadlock with it. The purge is then the victim,
    -- not that transaction: 1205 is transient, the batches before it stay committed, and a
    -- retry goes on from there. Reverts on return.
    set deadlock_priority low;
    -- Every lock wait of the purge is bounded. The hold read share-locks registered
    -- consumers' cursor keys and waits for a consumer's open transaction holding one; waiting
    -- on, it would keep the feed's registrations range-locked and stall the other consumers'
    -- saves and registrations behind it. 1222 is transient: the batches before it stay
    -- committed, and a retry goes on from there. Reverts on return.
    set lock_timeout 5000;

    -- 100 years in milliseconds, the largest @older_than_ms; typed (a literal above the int
    -- range is numeric).
    declare @max_older_than_ms bigint = 3155760000000;

    if @@trancount > 0
        throw 51400, N'purge_feed must be called outside a transaction: each batch commits on its own so that no reader waits for more than one batch. Commit or roll back first (under SET IMPLICIT_TRANSACTIONS ON, any earlier statement of the session opened one).', 1;
    if @older_than_ms is null and @before is null
        throw 51401, N'purge_feed: give a cutoff: @older_than_ms (e.g. 2592000000 for 30 days) and/or @before (a ULID).', 1;
    if @older_than_ms < 0 or @older_than_ms > @max_older_than_ms
        throw 51401, N'purge_feed: @older_than_ms must be between 0 and 3155760000000 (100 years).', 1;
    if @batch_size is null or @batch_size < 1 or @batch_size > 50000
        throw 51401, N'purge_feed: @batch_size must be between 1 and 50000.', 1;
    if @max_rows < 1
        throw 51401, N'purge_feed: @max_rows must be positive, or null for no limit.', 1;

    -- The feed's registry row, whose registered consumers hold the purge back. Names never
    -- contain a dot (parse_feed_name), so parsename splits the name exactly, and the two parts
    -- seek feeds_name_uq. Without the row no registration can be read: a purge then would
    -- pass every consumer, so it refuses instead.
    declare @feed_id int = (
        select feed_id
        from changefeed.feeds
        where
            schema_name = parsename(N'changefeed.__template__', 2)
            and table_name = parsename(N'changefeed.__template__', 1)
    );
    if @feed_id is null
        throw 51403, N'purge_feed: the feed changefeed.__template__ is not in the registry changefeed.feeds (it was torn down, or the registry was changed by hand), so the consumers that hold its purge back cannot be known. Nothing was deleted. Set the feed up again (changefeed.setup_feed) or drop this procedure.', 1;

    declare @epoch datetime2(3) = convert(datetime2(3), '19700101', 112);
    declare @cutoff_ms bigint = datediff_big(millisecond, @epoch, sysutcdatetime()) - @older_than_ms;
    -- Rows below this ULID are old enough: the cutoff millisecond with a zero tail.
    declare @upto binary(16) = case
        when @older_than_ms is null then @before
        when @cutoff_ms <= 0 then 0x00000000000000000000000000000000
        when @before is not null and @before < convert(binary(16), convert(binary(6), @cutoff_ms) + 0x00000000000000000000)
            then @before
        else convert(binary(16), convert(binary(6), @cutoff_ms) + 0x00000000000000000000)
    end;
    declare @report table (
        shard_id int not null primary key,
        deleted bigint not null,
        purged_through binary(16) null,
        stopped_because nvarchar(300) not null,
        passed_consumers nvarchar(max) null
    );
    declare @batch table (ulid binary(16) not null primary key);
    declare @shard int;
    declare @hold binary(16);
    declare @holder nvarchar(200);
    declare @batch_hold binary(16);
    declare @batch_holder nvarchar(200);
    declare @deleted bigint;
    declare @take int;
    declare @count int;
    -- The largest ULID this call deleted (or would delete) in the shard: every consumer with
    -- a cursor below it lost rows it had not read.
    declare @passed_upto binary(16);
    declare @reason nvarchar(300);

    declare shards cursor local fast_forward for
    select shard_id
    from [changefeed].[state:changefeed.__template__]
    where @shard_id is null or shard_id = @shard_id
    order by shard_id;

    open shards;
    fetch next from shards into @shard;
    while @@fetch_status = 0
    begin
        -- The lowest registered cursor of the shard seen so far (each batch reads it again).
        set @hold = null;
        set @holder = null;
        set @passed_upto = null;

        set @deleted = 0;
        set @reason = N'cutoff reached';
        while 1 = 1
        begin
            set @take = case
                when @max_rows is not null and @max_rows - @deleted < @batch_size
                    then convert(int, @max_rows - @deleted)
                else @batch_size
            end;
            if @take <= 0
            begin
                set @reason = N'max rows reached';
                break;
            end;

            delete from @batch;
            begin try
                begin transaction;

                -- Who holds this batch back, read in its transaction before its rows are
                -- chosen. HOLDLOCK (SERIALIZABLE for these two references; it locks under
                -- READ_COMMITTED_SNAPSHOT too, which versions READ COMMITTED reads only, and
                -- a second isolation hint beside it would conflict) keeps to this batch's
                -- commit a key-range lock on the feed's registrations (feed_id leads
                -- registered_consumers_pk) and, per registered consumer, on its cursor key
                -- (consumer, feed, shard_id: consumer_cursor_pk's whole key, present or
                -- absent). So a registration of this feed, a registered consumer's first
                -- save of the shard and its rewind (an update of its key) either committed
                -- before this read, and count here, or wait for this batch's commit, and the
                -- next batch reads them. The lower of this read and the ones before it is
                -- kept: a cursor that moved forward, or a consumer unregistered, during this
                -- call still holds the rest of it back where it stood (never deletes more).
                -- Both consumer columns are declared without a collation, so each has the
                -- database's as of its table's creation (V38, V93): collate database_default
                -- is that same collation unless the database's was changed in between, where
                -- comparing the two columns as they are fails (Msg 468). On the registration's
                -- side, so that the cursor key is still sought.
                if isnull(@force, 0) = 0
                begin
                    set @batch_hold = null;
                    set @batch_holder = null;
                    select top (1)
                        @batch_hold = c.[cursor],
                        @batch_holder = c.consumer
                    from changefeed.registered_consumers as r with (holdlock)
                    inner join changefeed.consumer_cursor as c with (holdlock)
                        on
                            c.consumer = r.consumer collate database_default
                            and c.feed = N'changefeed.__template__'
                            and c.shard_id = @shard
                    where r.feed_id = @feed_id
                    order by c.[cursor], c.consumer
                    -- The registrations drive the join, one seek of the cursor key per
                    -- registered consumer: the locks are the ones said above and no more (a
                    -- scan of consumer_cursor under HOLDLOCK would lock every consumer's
                    -- cursors, and could deadlock with a registration being made).
                    option (force order, loop join);
                    if @batch_hold is not null and (@hold is null or @batch_hold < @hold)
                    begin
                        set @hold = @batch_hold;
                        set @holder = @batch_holder;
                    end;
                end;

                -- A consumer has processed the rows up to and including its cursor.
                insert into @batch (ulid)
                select top (@take) ulid
                from [changefeed].[feed:changefeed.__template__]
                where
                    shard_id = @shard
                    and ulid < @upto
                    and (@hold is null or ulid <= @hold)
                order by ulid;
                set @count = @@rowcount;

                if @count > 0 and isnull(@dry_run, 0) = 0
                begin
                    delete f
                    from [changefeed].[feed:changefeed.__template__] as f
                    inner join @batch as b
                        on f.shard_id = @shard and f.ulid = b.ulid;
                    -- What this call deleted (a concurrent purge may have taken some).
                    set @count = @@rowcount;

                    update [changefeed].[state:changefeed.__template__]
                    set purged_through = (select max(ulid) from @batch)
                    where
                        shard_id = @shard
                        and (purged_through is null or purged_through < (select max(ulid) from @batch));
                end;

                commit transaction;
            end try
            begin catch
                if @@trancount > 0 rollback transaction;
                throw;
            end catch;

            set @deleted = @deleted + @count;
            -- Batches go up in ULID order: the last one's largest is the largest of all.
            if @count > 0
                set @passed_upto = (select max(ulid) from @batch);
            if (select count(*) from @batch) < @take break;
            -- A dry run counts one batch at a time over the same rows: count the rest at once.
            if isnull(@dry_run, 0) = 1
            begin
                select @deleted = count_big(*)
                from [changefeed].[feed:changefeed.__template__]
                where
                    shard_id = @shard
                    and ulid < @upto
                    and (@hold is null or ulid <= @hold);
                if @max_rows is not null and @deleted > @max_rows
                begin
                    set @deleted = @max_rows;
                    set @reason = N'max rows reached';
                end;
                -- The last row the purge would delete (TOP takes a bigint).
                select @passed_upto = max(would_go.ulid)
                from (
                    select top (@deleted) ulid
                    from [changefeed].[feed:changefeed.__template__]
                    where
                        shard_id = @shard
                        and ulid < @upto
                        and (@hold is null or ulid <= @hold)
                    order by ulid
                ) as would_go;
                break;
            end;
        end;

        -- "max rows reached" only when eligible rows are left (a dry run counted exactly).
        if @reason = N'max rows reached'
            and isnull(@dry_run, 0) = 0
            and not exists (
                select 1
                from [changefeed].[feed:changefeed.__template__]
                where
                    shard_id = @shard
                    and ulid < @upto
                    and (@hold is null or ulid <= @hold)
            )
            set @reason = N'cutoff reached';
        -- Short of the cutoff because a consumer has not read further?
        if @reason = N'cutoff reached'
            and @hold is not null
            and @hold < @upto
            and exists (
                select 1
                from [changefeed].[feed:changefeed.__template__]
                where shard_id = @shard and ulid > @hold and ulid < @upto
            )
            set @reason = N'held back by consumer ' + @holder;

        insert into @report (shard_id, deleted, purged_through, stopped_because, passed_consumers)
        select
            @shard,
            @deleted,
            purged_through,
            @reason,
            (
                -- READUNCOMMITTED: the report only names who was passed, after the deletes
                -- committed; a locking read here would wait (and end in 1222 after 5 s) for
                -- any consumer's open save, registered or not, and lose the report.
                select string_agg(convert(nvarchar(max), c.consumer), N', ')
                    within group (order by c.consumer)
                from changefeed.consumer_cursor as c with (readuncommitted)
                where
                    c.feed = N'changefeed.__template__'
                    and c.shard_id = @shard
                    and c.[cursor] < @passed_upto
            )
        from [changefeed].[state:changefeed.__template__]
        where shard_id = @shard;

        fetch next from shards into @shard;
    end;
    close shards;
    deallocate shards;

    select
        shard_id,
        deleted,
        purged_through,
        stopped_because,
        convert(bit, isnull(@dry_run, 0)) as dry_run,
        passed_consumers
    from @report
    order by shard_id;
end
