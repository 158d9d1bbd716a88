-- The argument checks every read_feed makes before it reads (both modes), in one place,
-- and whether the rows go to the caller's #read: @to_read_table is 1 when #read exists and
-- @use_read_table is not 0 (a client library passes 0, so that a #read left in a pooled
-- session by other code cannot swallow its pages).
-- read_feed calls it through ownership chaining, so readers need no permission on it.
-- It runs in the caller's session: @@trancount is the caller's, and so is #read.
-- @cursor is varbinary(8000), as in read_feed, so that its length arrives intact and can be
-- checked: a binary(16) parameter would pad a 15-byte cursor with a zero byte (below the
-- row it names, which is then delivered again) and cut a 17-byte one, both silently.
create or alter procedure [changefeed].[check_read_arguments]
    @shard_id int,
    @cursor varbinary(8000),
    @page_size int,
    @wait_ms int,
    @with_event bit,
    @use_read_table bit,
    @to_read_table bit output
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);

    set @to_read_table = case
        when isnull(@use_read_table, 1) = 1 and object_id(N'tempdb..#read') is not null then 1
        else 0
    end;

    if @@trancount > 0
        throw 51100, N'read_feed must be called outside a transaction: it commits its own short transactions (to move outbox rows, or to read past writers), and a page read inside yours would hold its locks until your commit. Commit or roll back first (under SET IMPLICIT_TRANSACTIONS ON, any earlier statement of the session opened one).', 1;
    if @shard_id is null
        throw 51101, N'read_feed: @shard_id is null. Pass the shard to read (0 for an unsharded feed).', 1;
    if @cursor is null
        throw 51101, N'read_feed: @cursor is null. Pass 0x00000000000000000000000000000000 (16 zero bytes) to read from the start, or the ulid of the last row you processed.', 1;
    if datalength(@cursor) <> 16
    begin
        set @message = concat(
            N'read_feed: @cursor is ', datalength(@cursor), N' bytes long; a cursor is exactly',
            N' 16 (binary(16), the ulid of the last row you processed). Pass it unchanged, or',
            N' 0x00000000000000000000000000000000 (16 zero bytes) to read from the start.'
        );
        throw 51101, @message, 1;
    end;
    if @page_size is null or @page_size < 1 or @page_size > 10000
        throw 51101, N'read_feed: @page_size must be between 1 and 10000.', 1;
    if @wait_ms is null or @wait_ms < 0 or @wait_ms > 3600000
        throw 51101, N'read_feed: @wait_ms must be between 0 and 3600000 (one hour).', 1;
    if @to_read_table = 1 and isnull(@with_event, 0) = 1
        throw 51102, N'read_feed: #read exists, and it holds keys only, so @with_event = 1 cannot fill it. Drop #read to get events as a result set, or join #read to the event table yourself.', 1;
end
