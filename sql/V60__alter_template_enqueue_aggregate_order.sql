-- enqueue for a claim-style outbox, written as the template outbox's procedure (replaces the
-- first version). What changed, and why:
--   * Per-aggregate insert order (ARCHITECTURE.md, "No message is invisible to the head
--     probe"). An insert takes its identity value, writes the clustered row, then each
--     nonclustered index. If it waits in between (on a range lock that a SERIALIZABLE or
--     HOLDLOCK reader of the outbox holds on message_id_unique or head_of_aggregate, on a
--     message_id a hand-written insert holds uncommitted, on log growth), its id exists but
--     claim's head probe, which reads head_of_aggregate, does not see the row yet; a later
--     message of the same aggregate could commit meanwhile and be claimed first. So an
--     enqueue with an aggregate holds an exclusive applock named after the aggregate from
--     before the insert (before its id exists) until the insert has returned (the row is in
--     every index), and releases it then, without waiting for the commit. A later enqueue of
--     the same aggregate therefore gets its id only once every earlier one is in
--     head_of_aggregate, committed or not, where the probe's dirty read sees it and holds
--     the later message back. Enqueues of one aggregate wait for each other only for the
--     length of an insert (unless that insert itself waits: then they must); other
--     aggregates never wait. The lock is owned by the transaction, so a failed insert (which
--     rolls the transaction back under XACT_ABORT) or a cancelled call cannot leave it held.
--   * Lengths are checked in UTF-16 units (datalength / 2), the unit nvarchar(n) counts:
--     len() counts a surrogate pair once under a supplementary-character (_SC) collation
--     and ignores trailing spaces, so a value that passed it could still be too long for
--     its column (Msg 2628, and the caller's transaction lost).
--   * A session whose SET options the outbox's filtered index (open_messages) cannot be
--     written under is refused with 51309 before anything is written, instead of failing
--     on the insert with Msg 1934. ANSI_WARNINGS, ANSI_PADDING and CONCAT_NULL_YIELDS_NULL
--     must be on and NUMERIC_ROUNDABORT off in the session; ARITHABORT follows ANSI_WARNINGS
--     (compatibility level 90 and above), and QUOTED_IDENTIFIER and ANSI_NULLS are this
--     procedure's own (captured when it was created), so the caller's do not matter here.
--
-- Unchanged: inserts one message inside the caller's transaction, so it commits or rolls
-- back with the business change it announces; refuses to run outside one. Returns one row:
-- id, message_id. A message_id that is already in the outbox is not inserted again: the
-- existing row is returned (the key makes a retried business transaction idempotent).
--
-- How a caller's message_id stays unique without range locks. Reading a missing key with
-- UPDLOCK, HOLDLOCK would lock the gap it falls in until the caller commits: concurrent
-- business transactions whose new keys share a gap (every increasing key falls in the last
-- one) would wait for each other, and crossed gaps deadlock. A plain insert that lost a
-- race would fail with 2627, which under XACT_ABORT ON dooms the caller's transaction.
-- Instead the key itself is locked: an exclusive applock named after this procedure and the
-- message_id, owned by the caller's transaction. Only transactions enqueuing the same key
-- wait for each other (as they must: whether the key is taken depends on whether the first
-- commits); a different key never waits. Holding it, the existence check and the insert
-- cannot race with another enqueue, so the check needs no locking hint, only READ
-- COMMITTED (set below): it sees every committed row, also under READ_COMMITTED_SNAPSHOT,
-- whose statement snapshot starts after the lock was granted, so after any earlier holder
-- committed (a caller's SNAPSHOT transaction could have started before). Both applocks
-- wait as long as the caller's LOCK_TIMEOUT allows (sp_getapplock's default), like the
-- insert they guard. The message_id lock is always taken first and the aggregate lock is
-- never held while waiting for another lock of ours, so the two cannot deadlock each other.
-- A row inserted by hand with the same key, without enqueue, still fails on the unique index;
-- a row inserted by hand, without enqueue, is not ordered by the aggregate lock either.
-- Parameters are wider than the columns on purpose: SQL Server silently truncates a too-long
-- argument, which would merge two message ids or change a topic; here a value too long for
-- its column is refused instead.
create or alter procedure [changefeed].[enqueue:changefeed.__template_outbox__]
    @topic nvarchar(4000),
    @payload nvarchar(max),
    @aggregate_type nvarchar(4000) = null,
    @aggregate_id nvarchar(4000) = null,
    @partition_key nvarchar(4000) = null,
    @headers nvarchar(max) = null,
    @message_id nvarchar(4000) = null,
    @trace_id nvarchar(4000) = null
as
begin
    set nocount, xact_abort on;

    -- Within the caller's transaction, so IMPLICIT_TRANSACTIONS does not matter here. A
    -- client with SET IMPLICIT_TRANSACTIONS ON (JDBC autoCommit off, pyodbc) has no
    -- transaction yet when its first statement is this EXEC: EXEC does not open one.
    if @@trancount = 0
        throw 51300, N'enqueue must run inside the transaction that makes the business change it announces (begin transaction; <your change>; exec enqueue ...; commit). Outside one, a crash between the two would lose or invent a message. With SET IMPLICIT_TRANSACTIONS ON (JDBC autoCommit off, pyodbc) an EXEC does not open the transaction: run the business change (an INSERT, UPDATE or DELETE) before enqueue, or BEGIN TRANSACTION first.', 1;
    -- sessionproperty returns sql_variant: converted before comparing.
    if convert(int, sessionproperty(N'ANSI_WARNINGS')) <> 1
        or convert(int, sessionproperty(N'ANSI_PADDING')) <> 1
        or convert(int, sessionproperty(N'CONCAT_NULL_YIELDS_NULL')) <> 1
        or convert(int, sessionproperty(N'NUMERIC_ROUNDABORT')) <> 0
        throw 51309, N'enqueue: this session''s SET options do not allow writes to the outbox''s filtered index (SQL Server would refuse the insert with Msg 1934). Run SET ANSI_WARNINGS ON; SET ANSI_PADDING ON; SET CONCAT_NULL_YIELDS_NULL ON; SET NUMERIC_ROUNDABORT OFF; (the defaults of every current driver) before the transaction.', 1;
    if @topic is null or len(@topic) = 0
        throw 51304, N'enqueue: @topic is empty. Pass the destination (topic or queue name).', 1;
    -- UTF-16 units, as nvarchar(n) counts them (see the top of this file).
    if datalength(@topic) / 2 > 256 or datalength(@aggregate_type) / 2 > 128
        or datalength(@aggregate_id) / 2 > 256 or datalength(@partition_key) / 2 > 256
        or datalength(@message_id) / 2 > 64 or datalength(@trace_id) / 2 > 128
        throw 51304, N'enqueue: a value is too long: topic, aggregate_id and partition_key take at most 256 UTF-16 code units, aggregate_type and trace_id 128, message_id 64 (a character outside the Basic Multilingual Plane, such as an emoji, takes two).', 1;
    -- ISJSON without a type (SQL Server 2017-2019) accepts objects and arrays only.
    if @payload is null or isjson(@payload) <> 1
        throw 51304, N'enqueue: @payload must be a JSON object or array.', 1;
    if @headers is not null and (isjson(@headers) <> 1 or left(ltrim(@headers), 1) <> N'{')
        throw 51304, N'enqueue: @headers must be a JSON object of string values, or null.', 1;
    -- Trailing spaces are ignored by = under every collation, so 'k' and 'k ' would be one
    -- key: refuse them rather than merge two messages.
    if @message_id is not null
        and (len(@message_id) = 0 or datalength(@message_id) <> datalength(rtrim(@message_id)))
        throw 51304, N'enqueue: @message_id is empty or ends with a space. Pass a key of 1 to 64 characters without trailing spaces, or null for a server-made one.', 1;

    -- The existence check below must see rows committed since the caller's transaction
    -- began (SNAPSHOT would not). Reverts on return.
    set transaction isolation level read committed;

    declare @enqueued table (
        id bigint not null,
        message_id nvarchar(64) collate Latin1_General_100_BIN2 not null
    );
    declare @lock_result int;
    declare @resource nvarchar(255);
    declare @aggregate_resource nvarchar(255);

    if @message_id is not null
    begin
        -- @@procid: this outbox's enqueue, so two outboxes never share a key's lock.
        set @resource = N'changefeed:enqueue:' + convert(nvarchar(11), @@procid) + N':'
            + @message_id;
        exec @lock_result = sys.sp_getapplock
            @Resource = @resource,
            @LockMode = 'Exclusive',
            @LockOwner = 'Transaction';
        if @lock_result < 0
            throw 51305, N'enqueue: another open transaction is enqueuing the same message_id, and its lock was not granted within this session''s LOCK_TIMEOUT (or this transaction was chosen as a deadlock victim). Roll back and retry the whole transaction.', 1;

        -- No hint: the applock already excludes a concurrent enqueue of this key (above).
        insert into @enqueued (id, message_id)
        select
            id,
            message_id
        from [changefeed].[__template_outbox__]
        where message_id = @message_id;
    end;

    if not exists (select 1 from @enqueued)
    begin
        if @aggregate_id is not null
        begin
            -- Named by a hash: an aggregate id (256 units) does not fit the 255-character
            -- resource name. rtrim: = ignores trailing spaces, so 'a' and 'a ' are one
            -- aggregate to the head probe and must share a lock. A hash collision only makes
            -- two aggregates wait for each other's inserts.
            set @aggregate_resource = N'changefeed:enqueue-aggregate:'
                + convert(nvarchar(11), @@procid) + N':'
                + convert(nvarchar(64), hashbytes('SHA2_256', rtrim(@aggregate_id)), 2);
            exec @lock_result = sys.sp_getapplock
                @Resource = @aggregate_resource,
                @LockMode = 'Exclusive',
                @LockOwner = 'Transaction';
            if @lock_result < 0
                throw 51310, N'enqueue: another transaction''s enqueue of the same aggregate is still inside its insert (waiting there on a lock that a third transaction holds), and the aggregate''s lock was not granted within this session''s LOCK_TIMEOUT (or this transaction was chosen as a deadlock victim). Roll back and retry the whole transaction; if it recurs, look for a transaction reading the outbox table at SERIALIZABLE or with HOLDLOCK (README.md, claim outbox).', 1;
        end;

        -- OUTPUT INTO a table variable: plain OUTPUT is refused on a table with triggers.
        insert into [changefeed].[__template_outbox__]
        (
            message_id, topic, aggregate_type, aggregate_id, partition_key,
            payload, headers, trace_id
        )
        output inserted.id, inserted.message_id into @enqueued (id, message_id)
        values (
            isnull(@message_id, convert(nvarchar(64), newid())), @topic, @aggregate_type,
            @aggregate_id, @partition_key, @payload, @headers, @trace_id
        );

        -- The row is in every index now (visible to the head probe's dirty read), so a later
        -- enqueue of this aggregate may take its id. The transaction still holds the row.
        if @aggregate_resource is not null
            exec sys.sp_releaseapplock
                @Resource = @aggregate_resource,
                @LockOwner = 'Transaction';
    end;

    select
        id,
        message_id
    from @enqueued;
end
