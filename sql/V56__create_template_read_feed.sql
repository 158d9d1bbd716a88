-- read_feed for outbox-mode feeds (ARCHITECTURE.md, "read_feed"), written as the template feed's procedure;
-- changefeed.upgrade_feed copies it for every outbox-mode feed (the markers are listed where changefeed.__template__ is created).
--
-- Returns the next rows of shard @shard_id with ulid > @cursor, in ulid order, at most
-- @page_size: ulid and the key columns, or with @with_event = 1 ulid and every column of the
-- event row. If the caller created #read (ulid binary(16), <key columns>), the rows go there.
--
-- How a page is found:
--   1. Fast path, no lock: the feed past the cursor. Readers that are behind stop here.
--   2. Otherwise, if the shard's outbox has committed rows: a short transaction holding an
--      exclusive, transaction-owned applock for (feed, shard), so one reader at a time moves.
--      If it has none, a locking re-read of the feed (see there) before giving up.
--   3. Re-read the feed past the cursor: a reader that waited for the lock while another
--      moved the outbox returns those rows (a lost race never yields an empty page).
--   4. Take up to @page_size committed outbox rows in order_sequence order. READPAST skips
--      rows of writers that have not committed: a slow or abandoned writer never stalls the
--      readers of its shard; its row is moved by a later call, after it commits.
--   5. Clamp the time hints to the server's clock plus 1 s (below), lift them to their
--      running max, allocate ULIDs above every ULID of the
--      shard (changefeed.ulid_at and the state row), append to the feed, delete from the
--      outbox, commit. The committed feed of a shard is therefore append-only in ULID order,
--      and ulid > @cursor never skips a row that commits later.
-- With @wait_ms > 0 and nothing to return, it repeats 1-5 in short pauses until rows come or
-- @wait_ms passes, holding no lock and no transaction while it pauses.
-- Time hints: a hint later than the server's clock (sysutcdatetime() when the rows move) plus
-- 1000 ms counts as that instant, so one wrong hint (a client's clock, a typo, year 9999)
-- cannot move the shard's clock ahead for good; 1 s allows a writer's clock to run slightly
-- ahead of the server's (src/allocator.rs HINT_TOLERANCE_MS is the same number). A hint
-- before 1970 counts as 1970. A hint earlier than the shard's last millisecond (or than an
-- earlier row of the batch) is lifted to it: ULIDs never go back, so such rows carry the
-- shard's current time, not their hint.
-- #read: its key columns are checked first (changefeed.check_read_table, error 51105): a
-- character column that cannot hold the keys losslessly (tempdb's code page, too short) is
-- refused before any row moves, rather than filled with '?' or cut keys.
-- Insert order: the feed insert of step 5 runs serially, in ULID order (see there).
-- The cursor is varbinary(8000) so that check_read_arguments can refuse one that is not
-- exactly 16 bytes (a binary(16) parameter would pad or cut it silently).
-- A cursor below the shard's low-water mark (events past it were purged by purge_feed)
-- raises 51104 instead of silently skipping them; the all-zero cursor reads from the oldest
-- retained event.
create or alter procedure [changefeed].[read_feed:changefeed.__template__]
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
    -- commit would leave one level open, holding the shard's applock and uncommitted feed
    -- rows after it returns. Set before any statement that would open one; reverts on return.
    set implicit_transactions off;
    -- READPAST needs a locking isolation level: under a caller's SNAPSHOT it raises error
    -- 650 and under SERIALIZABLE it would take range locks. This reverts on return.
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

    -- Exactly 16 bytes now (checked above); binary(16) like the ulid column, so that the
    -- comparisons below seek without converting the column.
    declare @after binary(16) = convert(binary(16), @cursor);
    -- Table variables keep their rows through a rollback and need no tempdb metadata locks.
    declare @rows [changefeed].[type:read:changefeed.__template__];
    declare @moved table (order_sequence bigint not null primary key, ulid binary(16) not null);
    declare @deadline datetime2(3) = dateadd(millisecond, @wait_ms, sysutcdatetime());
    declare @epoch datetime2(3) = convert(datetime2(3), '19700101', 112);
    -- A literal that the generator fills with the feed's name (at most 109 characters, so
    -- the resource stays within sp_getapplock's 255). Not object_id(): inside a procedure it
    -- answers with the caller's metadata visibility, which is NULL for a reader login.
    declare @lock_resource nvarchar(255) = concat(
        N'changefeed:read_feed:changefeed.__template__:', @shard_id
    );
    declare @lock_result int;
    declare @message nvarchar(2048);
    declare @pause_ms int = 5;
    declare @state_ms bigint;
    declare @state_high binary(8);
    declare @state_next bigint;
    declare @random16 binary(2);
    declare @counter_start bigint;
    declare @last_ulid binary(16);
    -- Bit 62 cleared: adding up to 2^62 to a fresh counter can then never overflow or change
    -- its sign. A typed variable: the literal -4611686018427387905 would be numeric, which
    -- '&' refuses (Msg 402); the hex literal converts to bigint as big-endian two's complement.
    declare @counter_mask bigint = convert(bigint, 0xBFFFFFFFFFFFFFFF);
    -- How far a time hint may be ahead of the server's clock (see the header).
    declare @hint_tolerance_ms bigint = 1000;
    declare @latest_ms bigint;

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

    -- An expired cursor must not long-poll before it is refused: no waiting for it. The
    -- refusal itself comes from the check after the page is read (see there).
    if @after <> 0x00000000000000000000000000000000
        and @after < (
            select purged_through
            from [changefeed].[state:changefeed.__template__]
            where shard_id = @shard_id
        )
        set @deadline = sysutcdatetime();

    while 1 = 1
    begin
        -- 1. Fast path.
        insert into @rows (ulid, __template_key__)
        select top (@page_size)
            ulid,
            __template_key__
        from [changefeed].[feed:changefeed.__template__]
        where shard_id = @shard_id and ulid > @after
        order by ulid;

        if @@rowcount > 0 break;

        -- 2. Only take the lock when there is something committed to move; an idle feed's
        -- long-poll then costs two index seeks a step and never queues on the applock.
        if exists (
            select 1
            from [changefeed].[outbox:changefeed.__template__]
                with (readcommittedlock, readpast, rowlock)
            where shard_id = @shard_id
        )
        begin
            begin try
                begin transaction;

                exec @lock_result = sys.sp_getapplock
                    @Resource = @lock_resource,
                    @LockMode = 'Exclusive',
                    @LockOwner = 'Transaction',
                    @LockTimeout = 10000;
                if @lock_result < 0
                begin
                    set @message = concat(
                        N'read_feed: the lock of shard ', @shard_id,
                        N' was not granted (sp_getapplock returned ', @lock_result,
                        N'; -1 timeout, -2 cancelled, -3 deadlock victim). Another reader held it for over 10 s. Retry the call.'
                    );
                    throw 51103, @message, 1;
                end;

                -- 3. Re-check under the lock.
                insert into @rows (ulid, __template_key__)
                select top (@page_size)
                    ulid,
                    __template_key__
                from [changefeed].[feed:changefeed.__template__]
                where shard_id = @shard_id and ulid > @after
                order by ulid;

                if @@rowcount = 0
                begin
                    -- 4. and 5. Move committed outbox rows into the feed.
                    delete from @moved;
                    set @state_ms = null;
                    set @state_high = null;
                    set @state_next = null;
                    select
                        @state_ms = last_ms,
                        @state_high = ulid_high,
                        @state_next = next_counter
                    from [changefeed].[state:changefeed.__template__] with (updlock, holdlock)
                    where shard_id = @shard_id;

                    set @random16 = convert(binary(2), crypt_gen_random(2));
                    set @counter_start = convert(bigint, crypt_gen_random(8)) & @counter_mask;
                    set @latest_ms = datediff_big(millisecond, @epoch, sysutcdatetime())
                        + @hint_tolerance_ms;

                    with taken as (
                        select top (@page_size)
                            order_sequence,
                            time_hint
                        from [changefeed].[outbox:changefeed.__template__]
                            with (readcommittedlock, readpast, rowlock)
                        where shard_id = @shard_id
                        order by order_sequence
                    ),

                    lifted as (
                        select
                            order_sequence,
                            max(
                                case
                                    when time_hint < @epoch then 0
                                    when datediff_big(millisecond, @epoch, time_hint) > @latest_ms
                                        then @latest_ms
                                    else datediff_big(millisecond, @epoch, time_hint)
                                end
                            ) over (order by order_sequence rows unbounded preceding) as ms
                        from taken
                    ),

                    numbered as (
                        select
                            order_sequence,
                            ms,
                            row_number() over (order by order_sequence) as position,
                            row_number() over (
                                partition by ms order by order_sequence
                            ) as position_in_ms
                        from lifted
                    )

                    insert into @moved (order_sequence, ulid)
                    select
                        n.order_sequence,
                        a.ulid
                    from numbered as n
                    cross apply changefeed.ulid_at(
                        n.ms, n.position, n.position_in_ms,
                        @state_ms, @state_high, @state_next, @random16, @counter_start
                    ) as a;

                    if @@rowcount > 0
                    begin
                        -- Insert into the feed before deleting from the outbox: a reader
                        -- that skips the deleted rows then finds these (see the else below).
                        --
                        -- In ULID order, serially: under locking READ COMMITTED a fast-path
                        -- reader that meets the first of these rows waits for this commit
                        -- and then reads on in key order from where it waited. Had a later
                        -- ULID been inserted first (and the reader waited on it), an earlier
                        -- one inserted after it would lie behind the reader, which would
                        -- return the later row and pass the earlier one for good. ORDER BY
                        -- in an INSERT ... SELECT guarantees only the order of identity
                        -- values, and a parallel plan may feed the insert from several
                        -- threads in any interleaving; MAXDOP 1 keeps one thread, and the
                        -- rows arrive in ULID order (@moved was allocated in order_sequence
                        -- order, which is ULID order, and the sort, if the plan adds one, is
                        -- on the feed's key (shard_id, ulid)). tests/live_feed_read_path.rs
                        -- reads the cached plan to check it is serial.
                        insert into [changefeed].[feed:changefeed.__template__]
                        (shard_id, ulid, __template_key__)
                        select
                            @shard_id,
                            m.ulid,
                            __template_key__
                        from @moved as m
                        -- FORCESEEK on both key columns (and the same seek in the delete
                        -- below): these rows are committed and ours, but a scan (or a range
                        -- seek on shard_id alone) would also touch uncommitted writer rows
                        -- and, under locking READ COMMITTED, wait for those writers.
                        inner join [changefeed].[outbox:changefeed.__template__] as o
                            with (
                                forceseek ([outbox_pk:changefeed.__template__] (shard_id, order_sequence))
                            )
                            on o.shard_id = @shard_id and m.order_sequence = o.order_sequence
                        order by m.ulid
                        option (maxdop 1);

                        -- SQL Server refuses FORCESEEK on the target of a DELETE (Msg 10724),
                        -- so the delete gets its seek from the plan shape instead: @moved
                        -- drives nested loops (FORCE ORDER, LOOP JOIN) into the outbox, each
                        -- of its rows found by the full clustered key (shard_id,
                        -- order_sequence), no other row read.
                        delete o
                        from @moved as m
                        inner join [changefeed].[outbox:changefeed.__template__] as o with (rowlock)
                            on o.shard_id = @shard_id and o.order_sequence = m.order_sequence
                        option (force order, loop join);

                        -- The state continues after the last ULID issued: its first 6 bytes
                        -- are the shard's millisecond, its first 8 the high part.
                        select top (1) @last_ulid = ulid
                        from @moved
                        order by order_sequence desc;

                        if @state_ms is null
                            insert into [changefeed].[state:changefeed.__template__]
                            (shard_id, last_ms, ulid_high, next_counter, updated_at)
                            values (
                                @shard_id,
                                convert(bigint, substring(@last_ulid, 1, 6)),
                                convert(binary(8), substring(@last_ulid, 1, 8)),
                                convert(bigint, substring(@last_ulid, 9, 8)) + 1,
                                sysutcdatetime()
                            );
                        else
                            update [changefeed].[state:changefeed.__template__]
                            set
                                last_ms = convert(bigint, substring(@last_ulid, 1, 6)),
                                ulid_high = convert(binary(8), substring(@last_ulid, 1, 8)),
                                next_counter = convert(bigint, substring(@last_ulid, 9, 8)) + 1,
                                updated_at = sysutcdatetime()
                            where shard_id = @shard_id;

                        insert into @rows (ulid, __template_key__)
                        select top (@page_size)
                            ulid,
                            __template_key__
                        from [changefeed].[feed:changefeed.__template__]
                        where shard_id = @shard_id and ulid > @after
                        order by ulid;
                    end;
                end;

                commit transaction;
            end try
            begin catch
                if @@trancount > 0 rollback transaction;
                throw;
            end catch;

            if exists (select 1 from @rows) break;
        end
        else
        begin
            -- The outbox looked empty, but another reader may be moving it right now: its
            -- deleted outbox rows were skipped by READPAST, and under READ_COMMITTED_SNAPSHOT
            -- the fast path could not see its new feed rows. A mover inserts its feed rows
            -- before it deletes the outbox rows, so a locking read of the feed finds them
            -- and waits for its commit; a lost race never returns an empty page.
            insert into @rows (ulid, __template_key__)
            select top (@page_size)
                ulid,
                __template_key__
            from [changefeed].[feed:changefeed.__template__] with (readcommittedlock)
            where shard_id = @shard_id and ulid > @after
            order by ulid;

            if @@rowcount > 0 break;
        end;

        if sysutcdatetime() >= @deadline break;

        exec changefeed.pause_read @deadline = @deadline, @pause_ms = @pause_ms output;
    end;

    -- Checked after the page was read, not before: a purge that commits in between would
    -- otherwise remove rows past the cursor unnoticed. The purge moves purged_through in the
    -- same transaction as its delete, so a page that missed purged rows is caught here.
    if @after <> 0x00000000000000000000000000000000
    begin
        declare @purged_through binary(16) = (
            select purged_through
            from [changefeed].[state:changefeed.__template__]
            where shard_id = @shard_id
        );
        if @after < @purged_through
        begin
            set @message = concat(
                N'read_feed: cursor expired: events after ', convert(nvarchar(34), @after, 1),
                N' up to ', convert(nvarchar(34), @purged_through, 1),
                N' in shard ', @shard_id, N' were purged. Resume from 0x00 (the oldest retained',
                N' event) or from a later cursor, knowing those events are gone. Only a registered',
                N' consumer''s saved cursor holds purge_feed back: save it (changefeed.save_cursor)',
                N' and ask the feed''s owner to register the consumer (changefeed.register_consumer).'
            );
            throw 51104, @message, 1;
        end;
    end;

    if @to_read_table = 1
        insert into #read (ulid, __template_key__)
        select
            ulid,
            __template_key__
        from @rows;
    else if @with_event_rows = 1
        -- A left join: an event row deleted since it was written still yields its ulid (with
        -- nulls), so the caller's cursor moves past it instead of stalling on a short page.
        select
            r.ulid,
            e.*
        from @rows as r
        -- FORCESEEK: writers insert the event and its outbox row in one transaction, so the
        -- event table has uncommitted rows that a scan would wait for.
        left outer join [changefeed].[__template__] as e with (forceseek)
            on e.__template_key__ = r.__template_key__
        order by r.ulid;
    else
        select
            ulid,
            __template_key__
        from @rows
        order by ulid;
end
