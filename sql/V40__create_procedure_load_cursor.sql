-- Returns a consumer's saved cursor for one feed shard: one row (cursor, updated_at), or
-- no row when it never saved one (start from the beginning, or wherever you decide).
-- Like save_cursor, only for members of the feed's readers role (or db_owner): a reader of
-- one feed has no business with another feed's consumers. A name that is not a feed is
-- refused (51006) rather than answered with no row, which would read as "start over".
-- It opens no transaction; under IMPLICIT_TRANSACTIONS ON its read joins the caller's.
create or alter procedure [changefeed].[load_cursor]
    @consumer nvarchar(200),
    @feed nvarchar(257),
    @shard_id int
as
begin
    set nocount, xact_abort on;

    declare @registered_feed nvarchar(257);

    -- 51006 for a name that is not a feed, 51112 for a caller outside its readers role.
    -- The registry's spelling comes back, so the row matches teardown_feed's and purge_feed's.
    exec changefeed.check_cursor_access
        @procedure = N'load_cursor',
        @feed = @feed,
        @registered_feed = @registered_feed output;

    select
        [cursor],
        updated_at
    from changefeed.consumer_cursor
    where consumer = @consumer and feed = @registered_feed and shard_id = @shard_id;
end
