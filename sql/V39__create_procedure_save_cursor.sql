-- Saves a consumer's cursor for one feed shard. Runs in the caller's transaction when there
-- is one (so it commits or rolls back with the consumer's own side effects), else alone.
-- Any cursor may be saved, an earlier one too: that is how a consumer rewinds to replay.
create or alter procedure [changefeed].[save_cursor]
    @consumer nvarchar(200),
    @feed nvarchar(257),
    @shard_id int,
    @cursor binary(16)
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);

    if @consumer is null or len(@consumer) = 0
        throw 51110, N'save_cursor: @consumer is empty. Name the consumer (1 to 200 characters).', 1;
    if @shard_id is null or @cursor is null
        throw 51110, N'save_cursor: @shard_id and @cursor are required.', 1;
    if not exists (
        select 1 from changefeed.feeds
        where schema_name + N'.' + table_name = @feed
    )
    begin
        set @message = N'save_cursor: ''' + isnull(@feed, N'(null)')
            + N''' is not a feed. Pass the feed''s event table as ''schema.table''.';
        throw 51006, @message, 1;
    end;

    -- UPDLOCK, SERIALIZABLE: two sessions saving the same consumer's first cursor serialize
    -- on the key range instead of one failing on the primary key.
    update changefeed.consumer_cursor with (updlock, serializable)
    set
        [cursor] = @cursor,
        updated_at = sysutcdatetime()
    where consumer = @consumer and feed = @feed and shard_id = @shard_id;

    if @@rowcount = 0
        insert into changefeed.consumer_cursor (consumer, feed, shard_id, [cursor])
        values (@consumer, @feed, @shard_id, @cursor);
end
