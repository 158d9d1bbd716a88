-- read_feed for serialized-writer feeds, written as the template feed's procedure;
-- the same parameters, results and #read contract as the outbox-mode read_feed, so
-- one client reads both modes.
--
-- Rows come straight from the event table through its unique (shard, ulid) index: writers
-- of a shard commit one at a time in ULID order (lock_feed), so ulid > @cursor never skips a
-- row that commits later. No READPAST here: it would also skip committed rows that another
-- session holds locked (an update of an old event), and the cursor would pass them for good.
--
-- Under READ_COMMITTED_SNAPSHOT a page is read from committed row versions: a writer's rows
-- appear all at once at its commit, and the reader never waits. Under locking READ COMMITTED
-- a plain scan is not enough: a writer may insert ulid(2) before ulid(1); a reader blocked on
-- ulid(2) would resume past ulid(1), inserted behind its position, and skip it for good. So
-- there the page is read holding a shared applock on the resource lock_feed holds
-- exclusively: the reader waits until no writer of the shard is inside its transaction
-- (POWEROFF.md), and then every row it can see is committed.
-- When the setting cannot be read (no permission on sys.databases), the lock is taken.
--
-- Insert order (outbox mode inserts its feed rows serially in ULID order, see there): here
-- the rows are the writers' own inserts, in whatever order and plan the writer chose, and
-- nothing needs to constrain them. A reader never meets a row of a transaction that is
-- still open: under locking READ COMMITTED it holds the shard's applock shared, which no
-- writer of the shard holds exclusively at that moment; under READ_COMMITTED_SNAPSHOT it
-- reads committed versions only. So the reader cannot wait on one uncommitted row and then
-- pass another inserted behind it.
-- #read: its key columns are checked first (changefeed.check_read_table, error 51105), as
-- in outbox mode.
-- The cursor is varbinary(8000) so that check_read_arguments can refuse one that is not
-- exactly 16 bytes (a binary(16) parameter would pad or cut it silently).
create or alter procedure [changefeed].[read_feed:changefeed.__template_serialized__]
    @shard_id int = 0,
    @cursor varbinary(8000) = 0x00000000000000000000000000000000,
    @page_size int = 1000,
    @wait_ms int = 0,
    @with_event bit = 0,
    @use_read_table bit = 1
as
begin
    set nocount, xact_abort on;
    -- It commits its own short transactions: under a caller's IMPLICIT_TRANSACTIONS ON its
    -- commit would leave one level open, holding the shard's shared applock (every writer of
    -- the shard would wait) after it returns. Set before any statement that would open one;
    -- reverts on return.
    set implicit_transactions off;
    -- READ COMMITTED whatever the caller's level: the reasoning above is for it (under a
    -- caller's SERIALIZABLE the page would take range locks that block writers). Reverts.
    set transaction isolation level read committed;

    declare @with_event_rows bit = isnull(@with_event, 0);
    declare @to_read_table bit;
    exec changefeed.check_read_arguments
        @shard_id = @shard_id,
        @cursor = @cursor,
        @page_size = @page_size,
        @wait_ms = @wait_ms,
        @with_event = @with_event_rows,
        @use_read_table = @use_read_table,
        @to_read_table = @to_read_table output;

    -- Exactly 16 bytes now (checked above); binary(16) like the ULID column, so that the
    -- comparison below seeks without converting the column.
    declare @after binary(16) = convert(binary(16), @cursor);
    declare @rows [changefeed].[type:read:changefeed.__template_serialized__];
    declare @deadline datetime2(3) = dateadd(millisecond, @wait_ms, sysutcdatetime());
    declare @pause_ms int = 5;
    declare @lock_result int;
    declare @message nvarchar(2048);
    declare @versioned_reads bit = (
        select is_read_committed_snapshot_on
        from sys.databases
        where database_id = db_id()
    );
    -- The name lock_feed uses; a literal filled in by the generator (see lock_feed).
    declare @lock_resource nvarchar(255) = concat(
        N'changefeed:lock_feed:changefeed.__template_serialized__:', @shard_id
    );

    -- A copy of this feed's key with its exact types and collations, which check_read_table
    -- compares #read with (see there). Only when #read will be filled.
    if @to_read_table = 1
    begin
        select top (0)
            ulid,
            __template_key__
        into #changefeed_read_check
        from @rows;
        exec changefeed.check_read_table;
    end;

    while 1 = 1
    begin
        begin try
            begin transaction;

            if isnull(@versioned_reads, 0) = 0
            begin
                exec @lock_result = sys.sp_getapplock
                    @Resource = @lock_resource,
                    @LockMode = 'Shared',
                    @LockOwner = 'Transaction',
                    @LockTimeout = 10000;
                if @lock_result < 0
                begin
                    set @message = concat(
                        N'read_feed: a writer of shard ', @shard_id,
                        N' kept its transaction open for over 10 s (sp_getapplock returned ',
                        @lock_result, N'), and under locking READ COMMITTED the shard cannot be',
                        N' read past an open writer. Retry the call; see POWEROFF.md.'
                    );
                    throw 51103, @message, 1;
                end;
            end;

            insert into @rows (ulid, __template_key__)
            select top (@page_size)
                __template_ulid__,
                __template_key__
            from [changefeed].[__template_serialized__]
            where __template_shard__ = @shard_id and __template_ulid__ > @after
            order by __template_ulid__;

            commit transaction;
        end try
        begin catch
            if @@trancount > 0 rollback transaction;
            throw;
        end catch;

        if exists (select 1 from @rows) break;
        if sysutcdatetime() >= @deadline break;

        exec changefeed.pause_read @deadline = @deadline, @pause_ms = @pause_ms output;
    end;

    if @to_read_table = 1
        insert into #read (ulid, __template_key__)
        select
            ulid,
            __template_key__
        from @rows;
    else if @with_event_rows = 1
        select
            r.ulid,
            e.*
        from @rows as r
        left outer join [changefeed].[__template_serialized__] as e
            on e.__template_key__ = r.__template_key__
        order by r.ulid;
    else
        select
            ulid,
            __template_key__
        from @rows
        order by ulid;
end
