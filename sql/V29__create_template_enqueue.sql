-- enqueue for a claim-style outbox, written as the template outbox's procedure.
-- Inserts one message inside the caller's transaction, so it commits or rolls back with the
-- business change it announces; refuses to run outside one. Returns one row: id, message_id.
-- A message_id that is already in the outbox is not inserted again: the existing row is
-- returned (the key makes a retried business transaction idempotent).
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

    if @@trancount = 0
        throw 51300, N'enqueue must run inside the transaction that makes the business change it announces (begin transaction; <your change>; exec enqueue ...; commit). Outside one, a crash between the two would lose or invent a message.', 1;
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

    declare @enqueued table (id bigint not null, message_id nvarchar(64) not null);

    if @message_id is not null
        -- UPDLOCK, HOLDLOCK: two transactions enqueuing the same key serialize on it, so
        -- the second sees the first's row instead of failing on the unique index.
        insert into @enqueued (id, message_id)
        select
            id,
            message_id
        from [changefeed].[__template_outbox__] with (updlock, holdlock)
        where message_id = @message_id;

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
