-- Saves a consumer's cursor for one feed shard. Runs in the caller's transaction when there
-- is one (so it commits or rolls back with the consumer's own side effects), else alone.
-- Any cursor may be saved, an earlier one too: that is how a consumer rewinds to replay.
--
-- Only members of the feed's readers role [changefeed.readers:S.T] (or db_owner) may save
-- its cursors: every feed's readers may EXECUTE this procedure, and a cursor steers what
-- purge_feed deletes, so a reader of one feed must not move another feed's consumers.
--
-- IMPLICIT_TRANSACTIONS is left as the caller set it, on purpose: this procedure opens no
-- transaction of its own, and a client with implicit transactions on (JDBC with autocommit
-- off, pyodbc) expects its save to be part of the transaction it commits itself. Switching
-- it off here would commit the cursor at once, ahead of side effects the client may still
-- roll back: an event would be skipped.
create or alter procedure [changefeed].[save_cursor]
    @consumer nvarchar(200),
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

    if @consumer is null or len(@consumer) = 0
        throw 51110, N'save_cursor: @consumer is empty. Name the consumer (1 to 200 characters).', 1;
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

    -- 51006 for a name that is not a feed, 51112 for a caller outside its readers role.
    -- The registry's spelling comes back, so the row matches teardown_feed's and purge_feed's.
    exec changefeed.check_cursor_access
        @procedure = N'save_cursor',
        @feed = @feed,
        @registered_feed = @registered_feed output;

    -- Update, else insert, until one of them wrote the row (at most three statements: a
    -- first save that loses the race to another session's first save updates after all).
    -- Two turns settle every race at a locking isolation level (update, or insert, or wait
    -- and update). A caller's SNAPSHOT transaction can see neither: its update reads the row
    -- as of its snapshot (missing) while the locking check finds it, so the loop is bounded.
    declare @turns int = 0;
    while 1 = 1
    begin
        set @turns += 1;
        if @turns > 3
            throw 51113, N'save_cursor: another session saved this consumer''s first cursor after this SNAPSHOT transaction began, so this transaction cannot see it. Retry the transaction.', 1;

        -- The usual case, a consumer moving on: one keyed update, no range lock.
        update changefeed.consumer_cursor
        set
            [cursor] = convert(binary(16), @cursor),
            updated_at = sysutcdatetime()
        where consumer = @consumer and feed = @registered_feed and shard_id = @shard_id;
        if @@rowcount > 0 break;

        -- The first save. UPDLOCK, SERIALIZABLE: the existence check locks the key range
        -- within this statement (to the end of the caller's transaction, if any), so of two
        -- sessions saving the same first cursor one inserts and the other waits here, then
        -- finds the row and inserts nothing (and updates it on the next turn), instead of
        -- failing on the primary key (2627). No transaction of our own is needed: the check
        -- and the insert are one statement.
        insert into changefeed.consumer_cursor (consumer, feed, shard_id, [cursor])
        select
            @consumer,
            @registered_feed,
            @shard_id,
            convert(binary(16), @cursor)
        where not exists (
            select 1
            from changefeed.consumer_cursor with (updlock, serializable)
            where consumer = @consumer and feed = @registered_feed and shard_id = @shard_id
        );
        if @@rowcount > 0 break;
    end;
end
