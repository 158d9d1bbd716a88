-- The first step of save_cursor and load_cursor: resolves @feed ('schema.table') to the
-- registry's spelling and checks that the caller may touch that feed's cursors, throwing
--   51006 when @feed is not a registered feed, and
--   51112 when the caller is neither a member of the feed's readers role
--         [changefeed.readers:S.T] nor db_owner.
-- Every feed's readers may EXECUTE save_cursor and load_cursor (grant_feed_roles), and a
-- saved cursor steers what purge_feed deletes, so the procedures themselves must keep one
-- feed's readers away from another feed's consumers. is_rolemember answers for the caller's
-- security context (a procedure runs as its caller), including membership through nested
-- roles and Windows groups. Internal: reached only through those two procedures, whose
-- owner owns this one too, so callers need no permission on it.
create or alter procedure [changefeed].[check_cursor_access]
    @procedure sysname,
    @feed nvarchar(257),
    @registered_feed nvarchar(257) output
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);
    declare @readers sysname;

    set @registered_feed = null;
    select
        @registered_feed = f.schema_name + N'.' + f.table_name,
        @readers = o.object_name
    from changefeed.feeds as f
    cross apply changefeed.feed_objects(f.schema_name, f.table_name) as o
    -- Names never contain a dot (parse_feed_name), so parsename splits @feed exactly; the two
    -- parts seek feeds_name_uq instead of scanning the registry, so a cursor call never waits
    -- behind a setup or upgrade of another feed (locking READ COMMITTED).
    where
        f.schema_name = parsename(@feed, 2)
        and f.table_name = parsename(@feed, 1)
        and parsename(@feed, 3) is null
        and o.kind = N'changefeed.readers';

    if @registered_feed is null
    begin
        set @message = @procedure + N': ''' + isnull(@feed, N'(null)')
            + N''' is not a feed. Pass the feed''s event table as ''schema.table''.';
        throw 51006, @message, 1;
    end;
    if isnull(is_rolemember(@readers), 0) = 0 and isnull(is_rolemember(N'db_owner'), 0) = 0
    begin
        set @message = @procedure + N': user ''' + user_name() + N''' is not a member of '
            + quotename(@readers) + N', so it may not use the cursors of the feed '''
            + @registered_feed + N'''. A db_owner can add it: alter role '
            + quotename(@readers) + N' add member ' + quotename(user_name()) + N';';
        throw 51112, @message, 1;
    end;
end
