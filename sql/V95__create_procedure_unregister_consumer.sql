-- Undoes register_consumer: the consumer's saved cursors of the feed no longer hold
-- purge_feed back (they stay saved; remove_consumer deletes them). Returns one row,
-- unregistered: 1 when a registration was deleted, 0 when there was none.
-- Who may: as register_consumer, whoever may execute it (granted to no one by the bundle).
-- A feed that is no longer registered has no registrations left (teardown_feed's delete
-- of its registry row cascades), so a name that is not a feed is refused (51006).
create or alter procedure [changefeed].[unregister_consumer]
    @consumer nvarchar(4000),
    @feed nvarchar(257)
as
begin
    set nocount, xact_abort on;

    declare @feed_id int;
    declare @unregistered int;
    declare @message nvarchar(2048);

    if @consumer is null or datalength(@consumer) = 0 or datalength(@consumer) / 2 > 200
        or datalength(@consumer) <> datalength(rtrim(@consumer))
        throw 51110, N'unregister_consumer: @consumer must be a name of 1 to 200 UTF-16 code units (an emoji takes two) that does not end with a space, as save_cursor requires.', 1;

    -- The delete below must not fail with an update conflict (3960) in a caller's SNAPSHOT
    -- transaction when a registration changed after it began. Reverts on return.
    set transaction isolation level read committed;

    -- Names never contain a dot (parse_feed_name), so parsename splits @feed exactly.
    select @feed_id = feed_id
    from changefeed.feeds
    where
        schema_name = parsename(@feed, 2)
        and table_name = parsename(@feed, 1)
        and parsename(@feed, 3) is null;
    if @feed_id is null
    begin
        set @message = N'unregister_consumer: ''' + isnull(@feed, N'(null)')
            + N''' is not a feed. Pass the feed''s event table as ''schema.table''.';
        throw 51006, @message, 1;
    end;

    delete from changefeed.registered_consumers
    where feed_id = @feed_id and consumer = @consumer;
    set @unregistered = @@rowcount;

    select @unregistered as unregistered;
end
