-- enqueue for a claim-style outbox, written as the template outbox's procedure.
-- Inserts one message inside the caller's transaction, so it commits or rolls back with the
-- business change it announces; refuses to run outside one. Returns one row: id, message_id.
-- A message_id that is already in the outbox is not inserted again: the existing row is
-- returned (the key makes a retried business transaction idempotent).
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
-- committed (a caller's SNAPSHOT transaction could have started before). The applock
-- waits as long as the caller's LOCK_TIMEOUT allows (sp_getapplock's default), like the
-- insert it replaces.
-- A row inserted by hand with the same key, without enqueue, still fails on the unique index.
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
    if @topic is null or len(@topic) = 0
        throw 51304, N'enqueue: @topic is empty. Pass the destination (topic or queue name).', 1;
    if len(@topic) > 256 or len(@aggregate_type) > 128 or len(@aggregate_id) > 256
        or len(@partition_key) > 256 or len(@message_id) > 64 or len(@trace_id) > 128
        throw 51304, N'enqueue: a value is too long: topic, aggregate_id and partition_key take at most 256 characters, aggregate_type and trace_id 128, message_id 64.', 1;
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

    select
        id,
        message_id
    from @enqueued;
end