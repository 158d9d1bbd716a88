-- Returns a consumer's saved cursor for one feed shard: one row (cursor, updated_at), or
-- no row when it never saved one (start from the beginning, or wherever you decide).
-- Replaces the first version: a consumer belongs to the principal of its first save
-- (save_cursor), and only that principal or db_owner may load it (51114 otherwise); a
-- consumer saved before owners existed may be loaded by any member of the feed's readers
-- role until its next save binds it. The name is checked as save_cursor checks it (1 to 200
-- UTF-16 code units, no trailing space; the parameter is wider than the column so a longer
-- name is refused rather than cut to another consumer's).
-- Like save_cursor, only for members of the feed's readers role (or db_owner): a reader of
-- one feed has no business with another feed's consumers. A name that is not a feed is
-- refused (51006) rather than answered with no row, which would read as "start over".
-- It opens no transaction; under IMPLICIT_TRANSACTIONS ON its read joins the caller's.
create or alter procedure [changefeed].[load_cursor]
    @consumer nvarchar(4000),
    @feed nvarchar(257),
    @shard_id int
as
begin
    set nocount, xact_abort on;

    declare @registered_feed nvarchar(257);
    declare @owner int;
    declare @message nvarchar(2048);

    if @consumer is null or datalength(@consumer) = 0 or datalength(@consumer) / 2 > 200
        or datalength(@consumer) <> datalength(rtrim(@consumer))
        throw 51110, N'load_cursor: @consumer must be a name of 1 to 200 UTF-16 code units (an emoji takes two) that does not end with a space.', 1;

    -- 51006 for a name that is not a feed, 51112 for a caller outside its readers role.
    -- The registry's spelling comes back, so the row matches teardown_feed's and purge_feed's.
    exec changefeed.check_cursor_access
        @procedure = N'load_cursor',
        @feed = @feed,
        @registered_feed = @registered_feed output;

    if isnull(is_rolemember(N'db_owner'), 0) = 0
    begin
        select @owner = min(owner_principal_id)
        from changefeed.consumer_cursor
        where
            consumer = @consumer and feed = @registered_feed
            and owner_principal_id <> database_principal_id();
        if @owner is not null
        begin
            set @message = N'load_cursor: the consumer ''' + @consumer + N''' of the feed '''
                + @registered_feed + N''' belongs to the database user '''
                + isnull(user_name(@owner), concat(N'with principal id ', @owner))
                + N''' (the principal of its first save), not to ''' + user_name()
                + N'''. Name this consumer differently, or ask a db_owner to remove the stale'
                + N' one (changefeed.remove_consumer).';
            throw 51114, @message, 1;
        end;
    end;

    select
        [cursor],
        updated_at
    from changefeed.consumer_cursor
    where consumer = @consumer and feed = @registered_feed and shard_id = @shard_id;
end
