-- Returns a consumer's saved cursor for one feed shard: one row (cursor, updated_at), or
-- no row when it never saved one (start from the beginning, or wherever you decide).
create or alter procedure [changefeed].[load_cursor]
    @consumer nvarchar(200),
    @feed nvarchar(257),
    @shard_id int
as
begin
    set nocount, xact_abort on;

    select
        [cursor],
        updated_at
    from changefeed.consumer_cursor
    where consumer = @consumer and feed = @feed and shard_id = @shard_id;
end
